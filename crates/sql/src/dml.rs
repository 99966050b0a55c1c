//! INSERT, UPDATE and DELETE.
//!
//! Writes are always applied by primary key. The rows to change are found
//! by running the statement's WHERE (and FROM/USING) as an ordinary
//! DataFusion query over the same snapshot, selecting the key columns (and
//! for UPDATE, every column plus the new values):
//!
//! ```text
//! UPDATE t SET b = b + 1 WHERE c > 3
//!   ─► SELECT "t"."k", "t"."b", "t"."c", (b + 1) FROM t WHERE c > 3
//!   ─► for each row: check, encode, Transaction::put(key, row)
//! ```
//!
//! We never use DataFusion's DML hooks (they can receive an empty filter
//! list for some WHERE clauses, which would touch every row).
//!
//! Interleaving rules: inserting a row of an `IN PARENT` table requires its
//! parent row; deleting a row deletes its row tree along `ON DELETE
//! CASCADE` edges (one key-range delete when nothing in the tree needs to
//! survive), fails while an `ON DELETE NO ACTION` child row exists, and
//! leaves `INTERLEAVE IN` children in place.

use std::borrow::{Borrow, Cow};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::ops::ControlFlow;
use std::sync::Arc;

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::{MemTable, MemorySchemaProvider, SchemaProvider};
use datafusion::sql::sqlparser::ast;
use smallvec::SmallVec;
use spindle_catalog::{Catalog, InterleaveKind, OnDelete, RowCodec, Table};
use spindle_keys::key::prefix_end;
use spindle_keys::value::PENDING_COMMIT_TIMESTAMP;
use spindle_keys::{row, Value};

use crate::ddl::eval_default;
use crate::error::{Error, Result};
use crate::fastpath::{match_point_key, plan_set, single_table, KeyRange, SetPlan, Slot};
use crate::index::{maintain, IndexPlan};
use crate::parser::{fold_ident, object_name};
use crate::session::{run_plan, StatementContext};
use crate::types::{array_value, build_array, coerce, coerce_cow, table_schema, value_to_text};

/// Rows of record batches as values.
pub fn batch_rows(batches: &[RecordBatch]) -> Result<Vec<Vec<Value>>> {
    let mut rows = Vec::new();
    for b in batches {
        for r in 0..b.num_rows() {
            rows.push(
                b.columns()
                    .iter()
                    .map(|c| array_value(c.as_ref(), r))
                    .collect::<Result<Vec<_>>>()?,
            );
        }
    }
    Ok(rows)
}

fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// Runs `sql` (a SELECT) inside the statement's transaction.
async fn query_rows(
    ctx: &StatementContext,
    sql: &str,
    include_hidden: bool,
) -> Result<Vec<Vec<Value>>> {
    let stmt = match crate::parser::parse(sql)?.pop() {
        Some(crate::parser::Statement::Query(q)) => *q,
        _ => return Err(Error::Internal(format!("not a query: {sql}"))),
    };
    // The rows of an UPDATE or DELETE whose WHERE names a key range or an
    // index's leading columns: read by the fast path, not planned (it
    // declines hidden columns, which only the general path shows here).
    if let Some(crate::session::Output::Rows { batches, .. }) =
        crate::fastpath::point_select(ctx, &stmt, false)?
    {
        ctx.engine.count_fast_path();
        return batch_rows(&batches);
    }
    let (_, batches) = ctx.query(stmt, include_hidden).await?;
    batch_rows(&batches)
}

/// The value of a literal expression, or `None` if it is not one: plain
/// literals, negation, and the casts [`crate::bind::literal_sql`] writes for
/// bound parameters, when the text is in the canonical form it writes (so
/// reading it back cannot differ from DataFusion's cast).
pub(crate) fn literal_value(e: &ast::Expr) -> Option<Value> {
    match e {
        ast::Expr::Value(v) => match &v.value {
            ast::Value::Number(n, _) => Some(match n.parse::<i64>() {
                Ok(i) => Value::Int64(i),
                Err(_) => match spindle_keys::value::parse_numeric(n) {
                    Some(d) if !n.contains(['e', 'E']) => Value::Numeric(d),
                    _ => Value::Float64(n.parse().ok()?),
                },
            }),
            ast::Value::SingleQuotedString(s) => Some(Value::String(s.clone())),
            ast::Value::Boolean(b) => Some(Value::Bool(*b)),
            ast::Value::Null => Some(Value::Null),
            _ => None,
        },
        ast::Expr::UnaryOp {
            op: ast::UnaryOperator::Minus,
            expr,
        } => match literal_value(expr)? {
            // -9223372036854775808: the magnitude alone is not an INT64.
            Value::Numeric(_)
                if matches!(&**expr, ast::Expr::Value(v)
                    if matches!(&v.value, ast::Value::Number(n, _) if n == "9223372036854775808")) =>
            {
                Some(Value::Int64(i64::MIN))
            }
            Value::Int64(i) => Some(Value::Int64(i.checked_neg()?)),
            Value::Float64(f) => Some(Value::Float64(-f)),
            Value::Numeric(n) => Some(Value::Numeric(-n)),
            _ => None,
        },
        ast::Expr::Nested(inner) => literal_value(inner),
        ast::Expr::Cast {
            kind: ast::CastKind::Cast,
            expr,
            data_type,
            format: None,
            ..
        } => cast_literal(literal_value(expr)?, data_type),
        // The placeholder PENDING_COMMIT_TIMESTAMP() is rewritten to.
        ast::Expr::Function(f)
            if f.name
                .to_string()
                .eq_ignore_ascii_case(PENDING_EXPR_FUNCTION) =>
        {
            let ast::FunctionArguments::List(l) = &f.args else {
                return None;
            };
            match l.args.as_slice() {
                [ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(x))] => {
                    match literal_value(x)? {
                        Value::Int64(i) => Some(Value::Timestamp(i)),
                        _ => None,
                    }
                }
                _ => None,
            }
        }
        _ => None,
    }
}

/// `CAST(literal AS type)` for the types bound parameters use.
fn cast_literal(v: Value, ty: &ast::DataType) -> Option<Value> {
    use crate::types::{format_date, format_timestamp, parse_date, parse_timestamp};
    use ast::{DataType as T, ExactNumberInfo as E, TimezoneInfo as Z};
    match (v, ty) {
        (Value::Int64(i), T::BigInt(None)) => Some(Value::Int64(i)),
        (Value::Int64(i), T::DoublePrecision) => Some(Value::Float64(i as f64)),
        (Value::Float64(f), T::DoublePrecision) => Some(Value::Float64(f)),
        (Value::Numeric(n), T::DoublePrecision) => spindle_keys::value::format_numeric(n)
            .parse()
            .ok()
            .map(Value::Float64),
        (Value::Null, _) => None,
        (Value::String(s), T::Date) => parse_date(&s)
            .filter(|d| format_date(*d) == s)
            .map(Value::Date),
        (Value::String(s), T::Timestamp(None, Z::Tz)) => parse_timestamp(&s)
            .filter(|t| format_timestamp(*t) == s)
            .map(Value::Timestamp),
        (Value::String(s), T::Decimal(E::PrecisionAndScale(38, 9))) => {
            spindle_keys::value::parse_numeric(&s)
                .filter(|n| spindle_keys::value::format_numeric(*n) == s)
                .map(Value::Numeric)
        }
        _ => None,
    }
}

/// `now()`, `current_timestamp` or `current_timestamp()`.
fn is_now(e: &ast::Expr) -> bool {
    let ast::Expr::Function(f) = e else {
        return false;
    };
    let name = f.name.to_string().to_ascii_lowercase();
    let no_args = match &f.args {
        ast::FunctionArguments::None => true,
        ast::FunctionArguments::List(l) => l.args.is_empty() && l.clauses.is_empty(),
        ast::FunctionArguments::Subquery(_) => false,
    };
    no_args
        && f.filter.is_none()
        && f.over.is_none()
        && (name == "now" || name == "current_timestamp")
}

fn is_default_keyword(e: &ast::Expr) -> bool {
    matches!(e, ast::Expr::Identifier(id) if id.quote_style.is_none() && id.value.eq_ignore_ascii_case("default"))
}

/// What to do when an inserted key already exists.
enum OnConflict {
    Error,
    Nothing,
    /// GoogleSQL INSERT OR UPDATE: update the listed columns.
    UpdateListed,
    /// SQLite INSERT OR REPLACE: replace the whole row.
    Replace,
    DoUpdate {
        assignments: Vec<ast::Assignment>,
        selection: Option<Box<ast::Expr>>,
    },
}

pub(crate) async fn insert(ctx: &StatementContext, ins: ast::Insert, upsert: bool) -> Result<u64> {
    let catalog = ctx.catalog()?;
    let table_name = match &ins.table {
        ast::TableObject::TableName(n) => object_name(n)?,
        other => {
            return Err(Error::Unsupported(format!(
                "INSERT INTO {other} is not supported"
            )))
        }
    };
    let table = catalog.get_table(&table_name)?.clone();
    if ins.returning.is_some() {
        return Err(Error::Unsupported(
            "INSERT … RETURNING is not supported".into(),
        ));
    }
    let mut on_conflict = if upsert {
        OnConflict::UpdateListed
    } else {
        OnConflict::Error
    };
    match ins.or {
        Some(ast::SqliteOnConflict::Replace) => on_conflict = OnConflict::Replace,
        Some(ast::SqliteOnConflict::Ignore) => on_conflict = OnConflict::Nothing,
        Some(other) => {
            return Err(Error::Unsupported(format!(
                "INSERT OR {other} is not supported"
            )))
        }
        None => {}
    }
    if ins.replace_into {
        on_conflict = OnConflict::Replace;
    }
    match &ins.on {
        None => {}
        Some(ast::OnInsert::OnConflict(oc)) => {
            check_conflict_target(&table, oc.conflict_target.as_ref())?;
            on_conflict = match &oc.action {
                ast::OnConflictAction::DoNothing => OnConflict::Nothing,
                ast::OnConflictAction::DoUpdate(du) => {
                    for a in &du.assignments {
                        let name = assignment_column(&a.target)?;
                        let col = table.column(&name).ok_or_else(|| {
                            spindle_catalog::Error::NoSuchColumn(name.clone(), table.name.clone())
                        })?;
                        if table.is_key_column(&col.name) {
                            return Err(Error::Unsupported(format!(
                                "cannot update primary key column \"{}\"",
                                col.name
                            )));
                        }
                    }
                    OnConflict::DoUpdate {
                        assignments: du.assignments.clone(),
                        selection: du.selection.clone().map(Box::new),
                    }
                }
            };
        }
        Some(other) => return Err(Error::Unsupported(format!("{other} is not supported"))),
    }

    // Target columns.
    let names: Vec<String> = ins
        .columns
        .iter()
        .map(|c| {
            c.0.last()
                .and_then(|p| p.as_ident())
                .map(fold_ident)
                .unwrap_or_default()
        })
        .collect();
    let targets = target_columns(&table, &names)?;

    // Source rows: None marks DEFAULT.
    let source = ins
        .source
        .ok_or_else(|| Error::Unsupported("INSERT without VALUES or a query".into()))?;
    let mut rows: Vec<Vec<Option<Value>>> = Vec::new();
    let mut now: Option<i64> = None;
    let simple_values =
        source.with.is_none() && source.order_by.is_none() && source.limit_clause.is_none();
    match source.body.as_ref() {
        ast::SetExpr::Values(values) if simple_values => {
            for r in &values.rows {
                if r.len() != targets.len() {
                    return Err(arity_error(r.len(), targets.len()));
                }
                let mut out = Vec::with_capacity(r.len());
                let mut to_eval = Vec::new();
                for (i, e) in r.iter().enumerate() {
                    if is_default_keyword(e) {
                        out.push(None);
                    } else if is_now(e) {
                        // What DataFusion's now() folds to: the statement's
                        // start (one instant for all its rows).
                        let t = *now.get_or_insert_with(|| crate::session::now_micros() as i64);
                        out.push(Some(Value::Timestamp(t)));
                    } else if let Some(v) = literal_value(e) {
                        out.push(Some(v));
                    } else {
                        out.push(Some(Value::Null));
                        to_eval.push((i, e.to_string()));
                    }
                }
                if !to_eval.is_empty() {
                    let sql = format!(
                        "SELECT {}",
                        to_eval
                            .iter()
                            .map(|(_, e)| e.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                    let vals = query_rows(ctx, &sql, false)
                        .await?
                        .pop()
                        .unwrap_or_default();
                    for ((i, _), v) in to_eval.iter().zip(vals) {
                        out[*i] = Some(v);
                    }
                }
                rows.push(out);
            }
        }
        _ => {
            let (schema, batches) = ctx.query(ast::Statement::Query(source), false).await?;
            if schema.fields().len() != targets.len() {
                return Err(arity_error(schema.fields().len(), targets.len()));
            }
            rows = batch_rows(&batches)?
                .into_iter()
                .map(|r| r.into_iter().map(Some).collect())
                .collect();
        }
    }

    insert_rows(ctx, &catalog, &table, &targets, rows, &on_conflict).await
}

/// The columns of `table` named `names` (all visible columns when none
/// are named), as indexes.
fn target_columns(table: &Table, names: &[String]) -> Result<Vec<usize>> {
    if names.is_empty() {
        return Ok((0..table.columns.len())
            .filter(|i| !table.columns[*i].hidden)
            .collect());
    }
    let mut t = Vec::with_capacity(names.len());
    for name in names {
        let idx = table
            .column_index(name)
            .filter(|i| !table.columns[*i].hidden)
            .ok_or_else(|| {
                spindle_catalog::Error::NoSuchColumn(name.clone(), table.name.clone())
            })?;
        if t.contains(&idx) {
            return Err(Error::Syntax(format!(
                "column \"{name}\" specified more than once"
            )));
        }
        t.push(idx);
    }
    Ok(t)
}

/// Rows of text values, as `COPY … FROM` delivers them (`None` for NULL),
/// inserted into `table`'s columns `columns` (all visible columns when
/// empty; the others take their defaults): what `INSERT INTO table
/// (columns) VALUES ('text', NULL, …), …` does, without building and
/// walking that statement. Each value is assigned to its column as a
/// string literal would be.
pub(crate) async fn insert_text_rows(
    ctx: &StatementContext,
    table: &str,
    columns: &[String],
    rows: Vec<Vec<Option<String>>>,
) -> Result<u64> {
    let catalog = ctx.catalog()?;
    let table = catalog.get_table(table)?.clone();
    let targets = target_columns(&table, columns)?;
    let mut values = Vec::with_capacity(rows.len());
    for r in rows {
        if r.len() != targets.len() {
            return Err(arity_error(r.len(), targets.len()));
        }
        values.push(
            r.into_iter()
                .map(|v| Some(v.map_or(Value::Null, Value::String)))
                .collect(),
        );
    }
    insert_rows(ctx, &catalog, &table, &targets, values, &OnConflict::Error).await
}

/// Inserts `rows` (values for `targets`, in order; `None` marks DEFAULT)
/// into `table`: the number of rows written.
async fn insert_rows(
    ctx: &StatementContext,
    catalog: &Catalog,
    table: &Table,
    targets: &[usize],
    rows: Vec<Vec<Option<Value>>>,
    on_conflict: &OnConflict,
) -> Result<u64> {
    // Defaults, evaluated once per statement when needed.
    let mut defaults: Vec<Option<Value>> = vec![None; table.columns.len()];
    let codec = RowCodec::new(catalog, table)?;
    let indexes = IndexPlan::for_table(catalog, &table.name)?;
    let mut count = 0u64;
    let mut hidden_keys = HiddenKeys::resume(ctx, table)?;
    for r in rows {
        let mut full: Vec<Value> = vec![Value::Null; table.columns.len()];
        let mut given = vec![false; table.columns.len()];
        for (pos, v) in targets.iter().zip(r) {
            if let Some(v) = v {
                let col = &table.columns[*pos];
                full[*pos] = coerce(v, &col.data_type, &col.name)?;
                given[*pos] = true;
            }
        }
        for (i, col) in table.columns.iter().enumerate() {
            if given[i] || col.hidden {
                continue;
            }
            if defaults[i].is_none() {
                defaults[i] = Some(
                    eval_default(ctx, &col.name, &col.data_type, col.default.as_deref()).await?,
                );
            }
            full[i] = defaults[i].clone().unwrap_or(Value::Null);
        }
        let wrote = write_inserted_row(
            ctx,
            catalog,
            table,
            &indexes,
            &codec,
            &mut hidden_keys,
            full,
            &given,
            on_conflict,
        )
        .await?;
        if wrote {
            count += 1;
        }
    }
    hidden_keys.keep(ctx, table)?;
    Ok(count)
}

/// A planned `INSERT INTO t [(cols)] VALUES (…), …` whose values are all
/// literals or parameters, with no ON CONFLICT, RETURNING or DEFAULT, into
/// a table without a hidden key whose other columns have no default: what
/// [`insert`] would do, without its per-statement work.
#[derive(Debug)]
pub(crate) struct InsertPlan {
    table: Table,
    /// Column indexes the values go to.
    targets: Vec<usize>,
    rows: Vec<Vec<Slot>>,
    /// The table's key and value layout, worked out once per plan.
    codec: RowCodec,
    /// Parameters the slots refer to (the highest `$n`).
    params_needed: usize,
    /// Whether a slot is the statement's time.
    has_now: bool,
    indexes: Vec<IndexPlan>,
    /// Whether the table has a hidden key (no primary key of its own).
    hidden_key: bool,
    /// Whether a row is only encoded: no hidden key drawn into it, no
    /// index entries or interleave-in-parent check made from it.
    encode_only: bool,
}

/// Plans `ins` for [`run_insert`], or `None` if it is not of that form.
pub(crate) fn plan_insert(
    catalog: &Catalog,
    ins: &ast::Insert,
    upsert: bool,
) -> Option<InsertPlan> {
    // Anything but the plain form (including clauses of other dialects)
    // goes the general way.
    if upsert
        || ins.or.is_some()
        || ins.ignore
        || ins.overwrite
        || ins.replace_into
        || ins.on.is_some()
        || ins.returning.is_some()
        || ins.output.is_some()
        || ins.table_alias.is_some()
        || ins.partitioned.is_some()
        || ins.priority.is_some()
        || ins.insert_alias.is_some()
        || ins.settings.is_some()
        || ins.format_clause.is_some()
        || ins.multi_table_insert_type.is_some()
        || !ins.optimizer_hints.is_empty()
        || !ins.assignments.is_empty()
        || !ins.after_columns.is_empty()
    {
        return None;
    }
    let ast::TableObject::TableName(name) = &ins.table else {
        return None;
    };
    let table = catalog.table(&object_name(name).ok()?)?;
    let targets: Vec<usize> = if ins.columns.is_empty() {
        (0..table.columns.len())
            .filter(|i| !table.columns[*i].hidden)
            .collect()
    } else {
        let mut t = Vec::new();
        for c in &ins.columns {
            let [part] = c.0.as_slice() else {
                return None;
            };
            let idx = table
                .column_index(&fold_ident(part.as_ident()?))
                .filter(|i| !table.columns[*i].hidden)?;
            if t.contains(&idx) {
                return None;
            }
            t.push(idx);
        }
        t
    };
    // Columns not given are NULL: no default to evaluate. A hidden key
    // (a table without a primary key) is drawn by `insert_if_absent`, as
    // on the general path.
    if table
        .columns
        .iter()
        .enumerate()
        .any(|(i, c)| !targets.contains(&i) && c.default.is_some())
    {
        return None;
    }
    let source = ins.source.as_ref()?;
    if source.with.is_some() || source.order_by.is_some() || source.limit_clause.is_some() {
        return None;
    }
    let ast::SetExpr::Values(values) = source.body.as_ref() else {
        return None;
    };
    let mut rows = Vec::with_capacity(values.rows.len());
    for r in &values.rows {
        if r.len() != targets.len() {
            return None;
        }
        let slots = r.iter().zip(&targets).map(|(e, t)| {
            Slot::of(e).or_else(|| {
                (Slot::is_now(e)
                    && table.columns[*t].data_type == spindle_keys::DataType::Timestamp)
                    .then_some(Slot::Now)
            })
        });
        rows.push(slots.collect::<Option<Vec<_>>>()?);
    }
    let slots = rows.iter().flatten();
    let params_needed = slots
        .clone()
        .filter_map(|s| match s {
            Slot::Param(i) => Some(i + 1),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    let has_now = slots.clone().any(|s| matches!(s, Slot::Now));
    let indexes = IndexPlan::for_table(catalog, &table.name).ok()?;
    let hidden_key = table.has_hidden_key();
    let encode_only = indexes.is_empty()
        && !hidden_key
        && !table
            .interleave
            .as_ref()
            .is_some_and(|il| il.kind == InterleaveKind::InParent);
    Some(InsertPlan {
        table: table.clone(),
        targets,
        rows,
        codec: RowCodec::new(catalog, table).ok()?,
        params_needed,
        has_now,
        indexes,
        hidden_key,
        encode_only,
    })
}

/// Runs an [`InsertPlan`] made against `catalog`: the number of rows
/// inserted, or `None` (nothing written) when a parameter is missing.
pub(crate) fn run_insert(
    ctx: &StatementContext,
    catalog: &Catalog,
    plan: &InsertPlan,
    params: &[Value],
) -> Result<Option<u64>> {
    // A missing parameter sends the statement the general way, before
    // anything is written; with it present every slot resolves.
    if params.len() < plan.params_needed {
        return Ok(None);
    }
    let table = &plan.table;
    // One instant for the whole statement, as on the general path.
    let now = if plan.has_now {
        Slot::Now.resolve(params)
    } else {
        None
    };
    let mut hidden_keys = if plan.hidden_key {
        HiddenKeys::resume(ctx, table)?
    } else {
        HiddenKeys::NONE
    };
    // Where the row is only encoded (`encode_only`), it borrows the
    // statement's literals and parameters instead of copying them: a bulk
    // load's text parameter is read once, into the row's encoding.
    // On the stack for up to 16 columns, and one for all the rows.
    let mut row: SmallVec<[Cow<'_, Value>; 16]> = SmallVec::new();
    for r in &plan.rows {
        row.clear();
        row.resize_with(table.columns.len(), || Cow::Owned(Value::Null));
        for (pos, slot) in plan.targets.iter().zip(r) {
            let v = match slot {
                Slot::Now => now.clone().map(Cow::Owned),
                s => s.resolve_cow(params),
            }
            .ok_or_else(|| Error::Internal("an INSERT plan's slot did not resolve".into()))?;
            let col = &table.columns[*pos];
            row[*pos] = coerce_cow(v, &col.data_type, &col.name)?;
        }
        // NOT NULL and commit-timestamp rules first, then the duplicate
        // key (as in PostgreSQL, and as `insert_if_absent`). A row with a
        // commit timestamp to fill in at commit takes the general write.
        if plan.encode_only && !row_rules(table, &row)? {
            let key = plan.codec.encode_key(&row)?;
            let value = plan.codec.encode_value(&row);
            if ctx
                .lock()?
                .insert_absent(key, value)
                .map_err(Error::from)?
                .is_some()
            {
                return Err(duplicate_key(table, &key_values(&plan.codec, &row)));
            }
            continue;
        }
        let mut full: SmallVec<[Value; 16]> = row.drain(..).map(Cow::into_owned).collect();
        if insert_if_absent(
            ctx,
            catalog,
            table,
            &plan.codec,
            &plan.indexes,
            &mut hidden_keys,
            &mut full,
        )?
        .is_some()
        {
            return Err(duplicate_key(table, &key_values(&plan.codec, &full)));
        }
    }
    if plan.hidden_key {
        hidden_keys.keep(ctx, table)?;
    }
    Ok(Some(plan.rows.len() as u64))
}

fn arity_error(got: usize, want: usize) -> Error {
    if got > want {
        Error::Syntax("INSERT has more expressions than target columns".into())
    } else {
        Error::Syntax("INSERT has more target columns than expressions".into())
    }
}

fn check_conflict_target(table: &Table, target: Option<&ast::ConflictTarget>) -> Result<()> {
    match target {
        None => Ok(()),
        Some(ast::ConflictTarget::Columns(cols)) => {
            let given: BTreeSet<String> = cols.iter().map(fold_ident).collect();
            let key: BTreeSet<String> = table.primary_key.iter().map(|k| k.name.clone()).collect();
            if given == key {
                Ok(())
            } else {
                Err(Error::InvalidConflictTarget)
            }
        }
        Some(ast::ConflictTarget::OnConstraint(name)) => {
            if object_name(name)? == format!("{}_pkey", table.name) {
                Ok(())
            } else {
                Err(Error::InvalidConflictTarget)
            }
        }
    }
}

fn assignment_column(target: &ast::AssignmentTarget) -> Result<String> {
    match target {
        ast::AssignmentTarget::ColumnName(n) => Ok(n
            .0
            .last()
            .and_then(|p| p.as_ident())
            .map(fold_ident)
            .unwrap_or_default()),
        ast::AssignmentTarget::Tuple(_) => Err(Error::Unsupported(
            "tuple assignments are not supported".into(),
        )),
    }
}

fn key_text(table: &Table, key: &[Value]) -> String {
    let names: Vec<&str> = table.primary_key.iter().map(|k| k.name.as_str()).collect();
    let vals: Vec<String> = key
        .iter()
        .map(|v| value_to_text(v).unwrap_or_else(|| "NULL".into()))
        .collect();
    format!("({})=({})", names.join(", "), vals.join(", "))
}

/// Checks NOT NULL, encodes and writes one row and its index entries;
/// `full` (and `old`, the row's previous values if it existed) are in
/// column order.
fn put_row(
    txn: &mut spindle_txn::Transaction,
    table: &Table,
    indexes: &[IndexPlan],
    key: Vec<u8>,
    full: &[Value],
    old: Option<&[Value]>,
) -> Result<()> {
    let (pending, value) = checked_row(table, full)?;
    // Point reads and buffered writes of index entries: inline (see
    // `crate::blocking`).
    maintain(txn, indexes, old, Some((full, &value)), pending)?;
    if pending {
        txn.put_pending(key, value);
    } else {
        txn.put(key, value);
    }
    Ok(())
}

/// A row's stored value, once its NOT NULL and commit-timestamp rules
/// hold, and whether it holds the commit-timestamp placeholder.
fn checked_row(table: &Table, full: &[Value]) -> Result<(bool, Vec<u8>)> {
    let pending = row_rules(table, full)?;
    let cols: Vec<(u32, &Value)> = table
        .columns
        .iter()
        .zip(full)
        .filter(|(c, _)| !table.is_key_column(&c.name))
        .map(|(c, v)| (c.id, v))
        .collect();
    Ok((pending, row::encode_row(&cols)))
}

/// Checks a row's NOT NULL and commit-timestamp rules; says whether it
/// holds the commit-timestamp placeholder.
fn row_rules<V: Borrow<Value>>(table: &Table, full: &[V]) -> Result<bool> {
    check_not_null(table, full)?;
    check_commit_timestamps(table, full)
}

fn check_not_null<V: Borrow<Value>>(table: &Table, full: &[V]) -> Result<()> {
    for (col, v) in table.columns.iter().zip(full) {
        if v.borrow().is_null() && !col.nullable {
            return Err(Error::NotNullViolation(format!(
                "null value in column \"{}\" of relation \"{}\" violates not-null constraint",
                col.name, table.name
            )));
        }
    }
    Ok(())
}

/// Checks a row's timestamps against the commit-timestamp rules and says
/// whether it holds the placeholder of `PENDING_COMMIT_TIMESTAMP()`:
/// only columns with `allow_commit_timestamp` may hold it, and those
/// columns refuse timestamps in the future (so a commit timestamp is
/// always later than every value already stored).
fn check_commit_timestamps<V: Borrow<Value>>(table: &Table, full: &[V]) -> Result<bool> {
    let mut pending = false;
    let mut now = None;
    for (col, v) in table.columns.iter().zip(full) {
        let Value::Timestamp(t) = v.borrow() else {
            continue;
        };
        if *t == PENDING_COMMIT_TIMESTAMP {
            if !col.allow_commit_timestamp {
                return Err(Error::InvalidCommitTimestamp(format!(
                    "PENDING_COMMIT_TIMESTAMP() can only be written to a column with \
                     allow_commit_timestamp = true; column \"{}\" of \"{}\" is not one",
                    col.name, table.name
                )));
            }
            pending = true;
        } else if col.allow_commit_timestamp
            && *t > *now.get_or_insert_with(|| crate::session::now_micros() as i64)
        {
            return Err(future_commit_timestamp(&col.name));
        }
    }
    Ok(pending)
}

pub(crate) fn future_commit_timestamp(column: &str) -> Error {
    Error::InvalidCommitTimestamp(format!(
        "cannot write a timestamp in the future to commit-timestamp column \"{column}\"; \
         use PENDING_COMMIT_TIMESTAMP() or a time in the past"
    ))
}

/// The spelling `PENDING_COMMIT_TIMESTAMP()` is rewritten to in INSERT and
/// UPDATE statements: an expression DataFusion evaluates to the
/// placeholder, and that [`literal_value`] recognizes without planning.
const PENDING_EXPR_FUNCTION: &str = "to_timestamp_micros";

/// Rewrites `PENDING_COMMIT_TIMESTAMP()` (GoogleSQL) and
/// `SPANNER.PENDING_COMMIT_TIMESTAMP()` (PostgreSQL spelling) in an INSERT
/// or UPDATE into the placeholder expression. Elsewhere the function does
/// not exist, as in Spanner.
pub(crate) fn rewrite_pending_commit_timestamp(stmt: &mut ast::Statement) {
    let _ = ast::visit_expressions_mut(stmt, |e| {
        if let ast::Expr::Function(f) = e {
            let parts: Vec<String> = f
                .name
                .0
                .iter()
                .filter_map(|p| p.as_ident())
                .map(|i| i.value.to_ascii_lowercase())
                .collect();
            let named = match parts.as_slice() {
                [n] => n == "pending_commit_timestamp",
                [s, n] => s == "spanner" && n == "pending_commit_timestamp",
                _ => false,
            };
            let no_args = match &f.args {
                ast::FunctionArguments::None => true,
                ast::FunctionArguments::List(l) => l.args.is_empty(),
                ast::FunctionArguments::Subquery(_) => false,
            };
            if named && no_args {
                let placeholder = format!("{PENDING_EXPR_FUNCTION}({PENDING_COMMIT_TIMESTAMP})");
                let dialect = datafusion::sql::sqlparser::dialect::PostgreSqlDialect {};
                if let Ok(x) = datafusion::sql::sqlparser::parser::Parser::new(&dialect)
                    .try_with_sql(&placeholder)
                    .and_then(|mut p| p.parse_expr())
                {
                    *e = x;
                }
            }
        }
        ControlFlow::<()>::Continue(())
    });
}

/// Decodes a stored row into column order.
pub(crate) fn stored_row(table: &Table, key_vals: &[Value], value: &[u8]) -> Result<Vec<Value>> {
    let mut full = vec![Value::Null; table.columns.len()];
    // Where each stored column goes (`None`: a key column, whose value
    // comes from the key); a stored value is decoded straight into its
    // place, not into a list first and copied from there.
    let mut place: SmallVec<[Option<u32>; 16]> = SmallVec::with_capacity(table.columns.len());
    for (i, col) in table.columns.iter().enumerate() {
        match table.primary_key.iter().position(|k| k.name == col.name) {
            Some(k) => {
                full[i] = key_vals[k].clone();
                place.push(None);
            }
            None => place.push(Some(col.id)),
        }
    }
    let mut filled: SmallVec<[bool; 16]> = SmallVec::from_elem(false, full.len());
    row::decode_row_with(
        value,
        |id| place.contains(&Some(id)),
        |id, v| {
            // The first value of a column id counts.
            if let Some(i) = place.iter().position(|p| *p == Some(id)) {
                if !filled[i] {
                    filled[i] = true;
                    full[i] = v;
                }
            }
        },
    )?;
    Ok(full)
}

/// A row an INSERT found in its way: its storage key, key values and
/// stored value.
/// The key and stored value of the row an INSERT found in its way.
type ExistingRow = (Vec<u8>, Vec<u8>);

/// The key values of the row `full` (in key order).
fn key_values<V: Borrow<Value>>(codec: &RowCodec, full: &[V]) -> Vec<Value> {
    codec
        .key_idx()
        .iter()
        .map(|i| full[*i].borrow().clone())
        .collect()
}

/// The hidden keys a transaction draws for a table without a primary key
/// (`_rowid`): a random 64-bit start, then one after another, on across
/// the transaction's statements (`Transaction::key_run`).
///
/// ```text
///   transaction 1: r₁, r₁+1, r₁+2, …     transaction 2: r₂, r₂+1, …
///   key space:  ──────[r₂ …]──────────────[r₁ … r₁+n]──────────
/// ```
///
/// Random starts spread transactions (concurrent writers) over the key
/// space instead of piling them onto its end; ascending keys within one
/// keep a bulk load — a COPY's batches are statements of their own — on
/// the write buffer's ascending tail and the transaction's absent-range
/// cache, where random keys went one by one into the buffer's map and the
/// store, and in the order a later re-keying (ADD PRIMARY KEY) finds
/// already sorted. Every key is still checked against the buffer and the
/// store; a key found taken (another transaction's run) draws a new
/// random start.
#[derive(Debug, Default)]
struct HiddenKeys {
    next: Option<i64>,
}

impl HiddenKeys {
    /// For a table with a primary key: nothing to draw or keep.
    const NONE: HiddenKeys = HiddenKeys { next: None };

    /// Where `table`'s hidden keys go on in the statement's transaction
    /// (nothing for a table with a primary key).
    fn resume(ctx: &StatementContext, table: &Table) -> Result<HiddenKeys> {
        Ok(HiddenKeys {
            next: if table.has_hidden_key() {
                ctx.lock()?.key_run(table.id)
            } else {
                None
            },
        })
    }

    /// Leaves where the statement's keys ended for the transaction's next
    /// statement into `table`.
    fn keep(&self, ctx: &StatementContext, table: &Table) -> Result<()> {
        if table.has_hidden_key() {
            ctx.lock()?.set_key_run(table.id, self.next);
        }
        Ok(())
    }

    /// The next key to try.
    fn draw(&mut self) -> i64 {
        let key = self.next.unwrap_or_else(rand::random::<i64>);
        // At the top of the range the next key is drawn afresh.
        self.next = key.checked_add(1);
        key
    }

    /// The last key drawn is taken: start a new run.
    fn taken(&mut self) {
        self.next = None;
    }
}

/// Writes `full` (every column of `table`, the hidden key drawn here from
/// `hidden_keys`) as a new row after the interleave-in-parent check, unless
/// a row with its key exists: then nothing is written and the key and
/// stored value of that row come back (its key values are
/// `key_values(codec, full)`).
fn insert_if_absent(
    ctx: &StatementContext,
    catalog: &Catalog,
    table: &Table,
    codec: &RowCodec,
    indexes: &[IndexPlan],
    hidden_keys: &mut HiddenKeys,
    full: &mut [Value],
) -> Result<Option<ExistingRow>> {
    let hidden = table.columns.iter().position(|c| c.hidden);
    let key = loop {
        if let Some(h) = hidden {
            full[h] = Value::Int64(hidden_keys.draw());
        }
        let key = codec.encode_key(full)?;
        if hidden.is_none()
            || ctx
                .lock()?
                .get_for_insert(&key)
                .map_err(Error::from)?
                .is_none()
        {
            break key;
        }
        hidden_keys.taken();
    };
    // Interleave rule: the parent row must exist (IN PARENT only).
    if let Some(il) = &table.interleave {
        if il.kind == InterleaveKind::InParent {
            let kv = key_values(codec, full);
            let parent = catalog.get_table(&il.parent)?;
            let pkey = catalog.encode_key(&parent.name, &kv[..parent.primary_key.len()])?;
            if ctx.lock()?.get(&pkey).map_err(Error::from)?.is_none() {
                return Err(Error::ForeignKeyViolation(format!(
                    "insert on table \"{}\" violates interleave in parent \"{}\": parent row with key {} does not exist",
                    table.name,
                    parent.name,
                    key_text(parent, &kv[..parent.primary_key.len()])
                )));
            }
        }
    }
    let mut txn = ctx.lock()?;
    if indexes.is_empty() {
        // No index entries to write first: the row's value is made up
        // front and probed and written in one search of the write buffer.
        // (Its NOT NULL check so comes before the duplicate-key check, as
        // in PostgreSQL.)
        let pending = row_rules(table, full)?;
        if !pending {
            return txn
                .insert_absent(key, codec.encode_value(full))
                .map_err(Error::from);
        }
    }
    // Absent: written just below (or the statement, and with it the
    // transaction, fails), which is what `get_for_insert` asks.
    match txn.get_for_insert(&key).map_err(Error::from)? {
        Some(existing) => Ok(Some((key, existing))),
        None => {
            put_row(&mut txn, table, indexes, key, full, None)?;
            Ok(None)
        }
    }
}

/// The error of an INSERT whose key exists.
fn duplicate_key(table: &Table, kv: &[Value]) -> Error {
    Error::UniqueViolation(format!(
        "duplicate key value violates unique constraint \"{}_pkey\": Key {} already exists",
        table.name,
        key_text(table, kv)
    ))
}

#[allow(clippy::too_many_arguments)]
async fn write_inserted_row(
    ctx: &StatementContext,
    catalog: &Catalog,
    table: &Table,
    indexes: &[IndexPlan],
    codec: &RowCodec,
    hidden_keys: &mut HiddenKeys,
    mut full: Vec<Value>,
    given: &[bool],
    on_conflict: &OnConflict,
) -> Result<bool> {
    let Some((key, existing)) =
        insert_if_absent(ctx, catalog, table, codec, indexes, hidden_keys, &mut full)?
    else {
        return Ok(true);
    };
    let kv = key_values(codec, &full);
    let current = stored_row(table, &kv, &existing)?;
    match on_conflict {
        OnConflict::Error => Err(duplicate_key(table, &kv)),
        OnConflict::Nothing => Ok(false),
        OnConflict::Replace => {
            put_row(
                &mut *ctx.lock()?,
                table,
                indexes,
                key,
                &full,
                Some(&current),
            )?;
            Ok(true)
        }
        OnConflict::UpdateListed => {
            let mut merged = current.clone();
            for (i, g) in given.iter().enumerate() {
                if *g {
                    merged[i] = full[i].clone();
                }
            }
            put_row(
                &mut *ctx.lock()?,
                table,
                indexes,
                key,
                &merged,
                Some(&current),
            )?;
            Ok(true)
        }
        OnConflict::DoUpdate {
            assignments,
            selection,
        } => {
            let Some(updated) = eval_do_update(
                ctx,
                table,
                &current,
                &full,
                assignments,
                selection.as_deref(),
            )
            .await?
            else {
                return Ok(false);
            };
            put_row(
                &mut *ctx.lock()?,
                table,
                indexes,
                key,
                &updated,
                Some(&current),
            )?;
            Ok(true)
        }
    }
}

/// Evaluates `ON CONFLICT DO UPDATE SET … [WHERE …]` over the existing row
/// (named after the table) and the proposed row (`excluded`). Returns the
/// new row, or `None` when the WHERE rejects the update.
async fn eval_do_update(
    ctx: &StatementContext,
    table: &Table,
    current: &[Value],
    proposed: &[Value],
    assignments: &[ast::Assignment],
    selection: Option<&ast::Expr>,
) -> Result<Option<Vec<Value>>> {
    let schema = table_schema(table, true);
    let one_row = |vals: &[Value]| -> Result<RecordBatch> {
        let arrays = table
            .columns
            .iter()
            .zip(vals)
            .map(|(c, v)| build_array(&c.data_type, &[v]))
            .collect::<Result<Vec<_>>>()?;
        Ok(RecordBatch::try_new(schema.clone(), arrays)
            .map_err(datafusion::error::DataFusionError::from)?)
    };
    let public = MemorySchemaProvider::new();
    public.register_table(
        table.name.clone(),
        Arc::new(MemTable::try_new(
            schema.clone(),
            vec![vec![one_row(current)?]],
        )?),
    )?;
    public.register_table(
        "excluded".into(),
        Arc::new(MemTable::try_new(
            schema.clone(),
            vec![vec![one_row(proposed)?]],
        )?),
    )?;
    let state = ctx.engine.df_state_with(Arc::new(public), ctx.catalog()?)?;
    // Unqualified names refer to the existing row, as in PostgreSQL.
    let qualify = |e: &ast::Expr| -> String {
        let mut e = e.clone();
        let _ = ast::visit_expressions_mut(&mut e, |x| {
            if let ast::Expr::Identifier(id) = x {
                *x = ast::Expr::CompoundIdentifier(vec![
                    ast::Ident::with_quote('"', table.name.clone()),
                    id.clone(),
                ]);
            }
            ControlFlow::<()>::Continue(())
        });
        e.to_string()
    };
    let mut items: Vec<String> = assignments
        .iter()
        .enumerate()
        .map(|(i, a)| format!("({}) AS \"?set{i}\"", qualify(&a.value)))
        .collect();
    items.push(
        selection
            .map(|s| format!("({}) AS \"?where\"", qualify(s)))
            .unwrap_or_else(|| "true".into()),
    );
    let sql = format!(
        "SELECT {} FROM {} CROSS JOIN excluded",
        items.join(", "),
        quote_ident(&table.name)
    );
    let stmt = match crate::parser::parse(&sql)?.pop() {
        Some(crate::parser::Statement::Query(q)) => *q,
        _ => return Err(Error::Internal("DO UPDATE query".into())),
    };
    let (_, batches) = run_plan(state, stmt).await?;
    let row = batch_rows(&batches)?.pop().unwrap_or_default();
    if row.last() != Some(&Value::Bool(true)) {
        return Ok(None);
    }
    let mut updated = current.to_vec();
    for (a, v) in assignments.iter().zip(row) {
        let name = assignment_column(&a.target)?;
        let i = table.column_index(&name).ok_or_else(|| {
            spindle_catalog::Error::NoSuchColumn(name.clone(), table.name.clone())
        })?;
        updated[i] = coerce(v, &table.columns[i].data_type, &table.columns[i].name)?;
    }
    Ok(Some(updated))
}

/// The target table of UPDATE/DELETE: its name and the name queries use
/// for it (the alias if any).
fn target_table(twj: &ast::TableWithJoins) -> Result<(String, String)> {
    if !twj.joins.is_empty() {
        return Err(Error::Unsupported(
            "joins in the target of UPDATE/DELETE are not supported; use FROM/USING".into(),
        ));
    }
    match &twj.relation {
        ast::TableFactor::Table { name, alias, .. } => {
            let table = object_name(name)?;
            let qualifier = alias
                .as_ref()
                .map(|a| fold_ident(&a.name))
                .unwrap_or_else(|| table.clone());
            Ok((table, qualifier))
        }
        other => Err(Error::Unsupported(format!(
            "cannot update or delete from {other}"
        ))),
    }
}

pub(crate) async fn update(ctx: &StatementContext, u: ast::Update) -> Result<u64> {
    if u.returning.is_some() || u.or.is_some() || !u.order_by.is_empty() || u.limit.is_some() {
        return Err(Error::Unsupported(
            "UPDATE with RETURNING, OR, ORDER BY or LIMIT is not supported".into(),
        ));
    }
    let catalog = ctx.catalog()?;
    let (table_name, q) = target_table(&u.table)?;
    let table = catalog.get_table(&table_name)?.clone();
    let targets = update_targets(&table, &u)?;
    // The fast path (full primary key); otherwise the rows come from a
    // query built from the statement.
    let point = match PointUpdate::plan(&catalog, &table, &u) {
        Some(p) => p.rows(ctx, &table, &[]),
        None => Ok(None),
    };
    if !matches!(point, Ok(None)) {
        ctx.engine.count_fast_path();
    }
    let fast_rows = match point? {
        Some(rows) => Some(rows),
        None => {
            let rows = update_rows_fast(ctx, &catalog, &table, &q, &u)?;
            if rows.is_some() {
                ctx.engine.count_fast_path();
            }
            rows
        }
    };
    let rows = match fast_rows {
        Some(rows) => rows,
        None => {
            let mut items: Vec<String> = table
                .columns
                .iter()
                .map(|c| format!("{}.{}", quote_ident(&q), quote_ident(&c.name)))
                .collect();
            // Aliases keep output names unique (`SET a = b, b = a`).
            items.extend(
                u.assignments
                    .iter()
                    .enumerate()
                    .map(|(i, a)| format!("({}) AS \"?set{i}\"", a.value)),
            );
            let mut from = u.table.to_string();
            if let Some(
                ast::UpdateTableFromKind::AfterSet(extra)
                | ast::UpdateTableFromKind::BeforeSet(extra),
            ) = &u.from
            {
                for t in extra {
                    from.push_str(", ");
                    from.push_str(&t.to_string());
                }
            }
            let mut sql = format!("SELECT {} FROM {}", items.join(", "), from);
            if let Some(sel) = &u.selection {
                sql.push_str(&format!(" WHERE {sel}"));
            }
            query_rows(ctx, &sql, true).await?
        }
    };
    let indexes = IndexPlan::for_table(&catalog, &table.name)?;
    write_updates(ctx, &catalog, &table, &targets, &indexes, rows)
}

/// An UPDATE of `table` alone (no FROM list) whose every SET value the
/// fast path computes ([`SetPlan`]): the target's qualifiers and the plans.
fn plan_sets(
    catalog: &Catalog,
    table: &Table,
    u: &ast::Update,
) -> Option<(Vec<String>, Vec<SetPlan>)> {
    if u.from.is_some() {
        return None;
    }
    let (t, quals) = single_table(catalog, &u.table)?;
    if t.name != table.name {
        return None;
    }
    let sets = u
        .assignments
        .iter()
        .map(|a| plan_set(table, &quals, &a.value))
        .collect::<Option<Vec<_>>>()?;
    Some((quals, sets))
}

/// The rows of an UPDATE as its general SELECT would return them (every
/// column, then the new values) when the fast path can read them — its
/// WHERE a key range or an index's leading columns, no FROM list, no
/// hidden column — and every SET value is one a [`PointUpdate`] computes
/// ([`SetPlan`]); `None` otherwise (nothing read).
fn update_rows_fast(
    ctx: &StatementContext,
    catalog: &Catalog,
    table: &Table,
    qualifier: &str,
    u: &ast::Update,
) -> Result<Option<Vec<Vec<Value>>>> {
    let Some(selection) = &u.selection else {
        return Ok(None);
    };
    if table.columns.iter().any(|c| c.hidden) {
        return Ok(None);
    }
    let Some((_, sets)) = plan_sets(catalog, table, u) else {
        return Ok(None);
    };
    let items: Vec<String> = table
        .columns
        .iter()
        .map(|c| format!("{}.{}", quote_ident(qualifier), quote_ident(&c.name)))
        .collect();
    let sql = format!(
        "SELECT {} FROM {} WHERE {selection}",
        items.join(", "),
        u.table
    );
    let Some(crate::parser::Statement::Query(stmt)) = crate::parser::parse(&sql)?.pop() else {
        return Ok(None);
    };
    let Some(crate::session::Output::Rows { batches, .. }) =
        crate::fastpath::point_select(ctx, &stmt, false)?
    else {
        return Ok(None);
    };
    let mut rows = batch_rows(&batches)?;
    for row in &mut rows {
        let mut new = Vec::with_capacity(sets.len());
        for set in &sets {
            match set.eval(row, &[]) {
                None => return Ok(None),
                Some(v) => new.push(v?),
            }
        }
        row.extend(new);
    }
    Ok(Some(rows))
}

/// The columns an UPDATE's SET assigns, checked: visible, not in the key,
/// each once.
fn update_targets(table: &Table, u: &ast::Update) -> Result<Vec<usize>> {
    let mut targets = Vec::new();
    for a in &u.assignments {
        let name = assignment_column(&a.target)?;
        let i = table
            .column_index(&name)
            .filter(|i| !table.columns[*i].hidden)
            .ok_or_else(|| {
                spindle_catalog::Error::NoSuchColumn(name.clone(), table.name.clone())
            })?;
        if table.is_key_column(&name) {
            return Err(Error::Unsupported(format!(
                "cannot update primary key column \"{}\" of table \"{}\"; delete the row and insert a new one",
                table.columns[i].name, table.name
            )));
        }
        if targets.contains(&i) {
            return Err(Error::Syntax(format!(
                "multiple assignments to same column \"{name}\""
            )));
        }
        targets.push(i);
    }
    Ok(targets)
}

/// Writes an UPDATE's rows (every column of `table`, then the new values
/// of `targets`); a row listed twice is written once. Returns the count.
fn write_updates(
    ctx: &StatementContext,
    catalog: &Catalog,
    table: &Table,
    targets: &[usize],
    indexes: &[IndexPlan],
    rows: Vec<Vec<Value>>,
) -> Result<u64> {
    let key_idx = table.key_indices();
    let ncols = table.columns.len();
    let mut seen = HashSet::new();
    let mut count = 0;
    for r in rows {
        let kv: Vec<Value> = key_idx.iter().map(|i| r[*i].clone()).collect();
        let key = catalog.encode_key(&table.name, &kv)?;
        if !seen.insert(key.clone()) {
            continue;
        }
        let mut full: Vec<Value> = r[..ncols].to_vec();
        for (j, i) in targets.iter().enumerate() {
            let col = &table.columns[*i];
            full[*i] = coerce(r[ncols + j].clone(), &col.data_type, &col.name)?;
        }
        put_row(
            &mut *ctx.lock()?,
            table,
            indexes,
            key,
            &full,
            Some(&r[..ncols]),
        )?;
        count += 1;
    }
    Ok(count)
}

/// The fast path of UPDATE by full primary key ([`crate::fastpath`]).
#[derive(Debug)]
pub(crate) struct PointUpdate {
    key: KeyRange<Slot>,
    sets: Vec<SetPlan>,
    /// The table's key layout: the row's key from its key values without
    /// a catalog lookup per execution.
    codec: RowCodec,
}

impl PointUpdate {
    /// Plans `u` (whose target is `table`), or `None` for the general path.
    fn plan(catalog: &Catalog, table: &Table, u: &ast::Update) -> Option<PointUpdate> {
        let (quals, sets) = plan_sets(catalog, table, u)?;
        let key = match_point_key(table, &quals, u.selection.as_ref())?;
        let codec = RowCodec::new(catalog, table).ok()?;
        Some(PointUpdate { key, sets, codec })
    }

    /// The rows the general path's SELECT would return (every column,
    /// then the new values), or `None` (nothing written) when the
    /// parameters do not suit the plan.
    fn rows(
        &self,
        ctx: &StatementContext,
        table: &Table,
        params: &[Value],
    ) -> Result<Option<Vec<Vec<Value>>>> {
        let kv = match self.key.resolve(table, params) {
            None => return Ok(None),
            Some(KeyRange::Nothing) => return Ok(Some(Vec::new())),
            Some(KeyRange::Scan { eq, .. }) => eq,
        };
        let Ok(key) = self.codec.encode_key_of(&kv) else {
            return Ok(None);
        };
        lock_row(ctx, &key)?;
        let stored = ctx.lock()?.get(&key).map_err(Error::from)?;
        let Some(stored) = stored else {
            return Ok(Some(Vec::new()));
        };
        let mut row = stored_row(table, &kv, &stored)?;
        let mut new = Vec::with_capacity(self.sets.len());
        for set in &self.sets {
            match set.eval(&row, params) {
                None => return Ok(None),
                Some(v) => new.push(v?),
            }
        }
        row.extend(new);
        Ok(Some(vec![row]))
    }
}

/// Takes the write lock on the row `key` before an UPDATE, DELETE or
/// SELECT … FOR UPDATE by primary key reads it ([`spindle_txn::Transaction::lock_key`]): a
/// concurrent writer of the row is waited for, off the async runtime,
/// instead of being conflicted with at commit.
pub(crate) fn lock_row(ctx: &StatementContext, key: &[u8]) -> Result<()> {
    if ctx.lock()?.lock_key(key, false)? {
        return Ok(());
    }
    crate::blocking(|| {
        ctx.lock()?.lock_key(key, true)?;
        Ok(())
    })
}

/// A planned UPDATE by full primary key, kept with its statement
/// ([`crate::plan_cache`]).
#[derive(Debug)]
pub(crate) struct UpdatePlan {
    table: Table,
    targets: Vec<usize>,
    point: PointUpdate,
    indexes: Vec<IndexPlan>,
}

/// Plans `u` for [`run_update`], or `None` for the general path (which
/// also reports the statement's errors).
pub(crate) fn plan_update(catalog: &Catalog, u: &ast::Update) -> Option<UpdatePlan> {
    if u.returning.is_some() || u.or.is_some() || !u.order_by.is_empty() || u.limit.is_some() {
        return None;
    }
    // The statement as the general path runs it (commit-timestamp
    // placeholders rewritten); a rewritten one is not planned.
    let mut stmt = ast::Statement::Update(u.clone());
    rewrite_pending_commit_timestamp(&mut stmt);
    if stmt != ast::Statement::Update(u.clone()) {
        return None;
    }
    let (table_name, _) = target_table(&u.table).ok()?;
    let table = catalog.table(&table_name)?;
    let targets = update_targets(table, u).ok()?;
    let point = PointUpdate::plan(catalog, table, u)?;
    Some(UpdatePlan {
        table: table.clone(),
        targets,
        point,
        indexes: IndexPlan::for_table(catalog, &table.name).ok()?,
    })
}

/// Runs an [`UpdatePlan`] made against `catalog`: the rows updated, or
/// `None` (nothing written) when the parameters do not suit the plan.
pub(crate) fn run_update(
    ctx: &StatementContext,
    catalog: &Catalog,
    plan: &UpdatePlan,
    params: &[Value],
) -> Result<Option<u64>> {
    let Some(rows) = plan.point.rows(ctx, &plan.table, params)? else {
        return Ok(None);
    };
    write_updates(
        ctx,
        catalog,
        &plan.table,
        &plan.targets,
        &plan.indexes,
        rows,
    )
    .map(Some)
}

pub(crate) async fn delete(ctx: &StatementContext, d: ast::Delete) -> Result<u64> {
    if d.returning.is_some() || !d.order_by.is_empty() || d.limit.is_some() || !d.tables.is_empty()
    {
        return Err(Error::Unsupported(
            "DELETE with RETURNING, ORDER BY, LIMIT or several tables is not supported".into(),
        ));
    }
    let catalog = ctx.catalog()?;
    let from = match &d.from {
        ast::FromTable::WithFromKeyword(t) | ast::FromTable::WithoutKeyword(t) => t,
    };
    let [target] = from.as_slice() else {
        return Err(Error::Unsupported(
            "DELETE from several tables is not supported".into(),
        ));
    };
    let (table_name, q) = target_table(target)?;
    let table = catalog.get_table(&table_name)?.clone();
    // The fast path: a full primary key needs no query.
    let point = match d.using {
        Some(_) => None,
        None => crate::fastpath::single_table(&catalog, target)
            .filter(|(t, _)| t.name == table.name)
            .and_then(|(_, quals)| {
                crate::fastpath::match_key(&table, &quals, d.selection.as_ref())
            }),
    };
    let by_key = point.is_some();
    if by_key {
        ctx.engine.count_fast_path();
    }
    let rows = match point {
        Some(crate::fastpath::KeyMatch::Point(kv)) => vec![kv],
        Some(crate::fastpath::KeyMatch::Nothing) => Vec::new(),
        None => {
            let items: Vec<String> = table
                .primary_key
                .iter()
                .map(|k| format!("{}.{}", quote_ident(&q), quote_ident(&k.name)))
                .collect();
            let mut sql = format!("SELECT {} FROM {}", items.join(", "), target);
            for t in d.using.iter().flatten() {
                sql.push_str(&format!(", {t}"));
            }
            if let Some(sel) = &d.selection {
                sql.push_str(&format!(" WHERE {sel}"));
            }
            query_rows(ctx, &sql, true).await?
        }
    };
    let plan = CascadePlan::new(&catalog, &table)?;
    delete_rows(ctx, &catalog, &table, &plan, rows, by_key)
}

/// Deletes the row trees of `table` rows with these key values (each
/// once; a row an earlier cascade removed is not counted). Returns the
/// count. `by_key`: the statement named the row by its primary key, so
/// the row's write lock is taken before it is read ([`lock_row`]).
fn delete_rows(
    ctx: &StatementContext,
    catalog: &Catalog,
    table: &Table,
    plan: &CascadePlan,
    rows: Vec<Vec<Value>>,
    by_key: bool,
) -> Result<u64> {
    let mut seen = HashSet::new();
    let mut count = 0;
    for kv in rows {
        let key = catalog.encode_key(&table.name, &kv)?;
        if !seen.insert(key.clone()) {
            continue;
        }
        if by_key {
            lock_row(ctx, &key)?;
        }
        let deleted = crate::blocking(|| -> Result<bool> {
            let mut txn = ctx.lock()?;
            if txn.get(&key)?.is_none() {
                return Ok(false); // already removed by an earlier cascade in this statement
            }
            plan.delete_row_tree(&mut txn, catalog, table, &key, &kv)?;
            Ok(true)
        })?;
        if deleted {
            count += 1;
        }
    }
    Ok(count)
}

/// A planned DELETE by full primary key, kept with its statement
/// ([`crate::plan_cache`]).
#[derive(Debug)]
pub(crate) struct DeletePlan {
    table: Table,
    key: KeyRange<Slot>,
    cascade: CascadePlan,
}

/// Plans `d` for [`run_delete`], or `None` for the general path (which
/// also reports the statement's errors).
pub(crate) fn plan_delete(catalog: &Catalog, d: &ast::Delete) -> Option<DeletePlan> {
    if d.returning.is_some()
        || !d.order_by.is_empty()
        || d.limit.is_some()
        || !d.tables.is_empty()
        || d.using.is_some()
    {
        return None;
    }
    let from = match &d.from {
        ast::FromTable::WithFromKeyword(t) | ast::FromTable::WithoutKeyword(t) => t,
    };
    let [target] = from.as_slice() else {
        return None;
    };
    let (table_name, _) = target_table(target).ok()?;
    let table = catalog.table(&table_name)?;
    let (t, quals) = single_table(catalog, target)?;
    if t.name != table.name {
        return None;
    }
    let key = match_point_key(table, &quals, d.selection.as_ref())?;
    Some(DeletePlan {
        table: table.clone(),
        key,
        cascade: CascadePlan::new(catalog, table).ok()?,
    })
}

/// Runs a [`DeletePlan`] made against `catalog`: the rows deleted, or
/// `None` (nothing written) when the parameters do not suit the plan.
pub(crate) fn run_delete(
    ctx: &StatementContext,
    catalog: &Catalog,
    plan: &DeletePlan,
    params: &[Value],
) -> Result<Option<u64>> {
    let rows = match plan.key.resolve(&plan.table, params) {
        None => return Ok(None),
        Some(KeyRange::Nothing) => Vec::new(),
        Some(KeyRange::Scan { eq, .. }) => vec![eq],
    };
    delete_rows(ctx, catalog, &plan.table, &plan.cascade, rows, true).map(Some)
}

/// Which tables a delete of a `table` row removes, which block it, and
/// whether the whole row tree can go in one range delete.
#[derive(Debug)]
struct CascadePlan {
    /// Ids of `table` and the tables reached through ON DELETE CASCADE.
    deleted: HashSet<u32>,
    /// Some table below needs per-key handling (NO ACTION or INTERLEAVE IN),
    /// or a deleted table has indexes whose entries must go row by row.
    selective: bool,
    /// The deleted tables that have indexes, by table id: the table, its
    /// ancestry (to decode its row keys) and its index plans (row copies
    /// aside).
    indexes: HashMap<u32, (Table, Vec<Table>, Vec<IndexPlan>)>,
    /// The row copy of the deleted row's own table (`Catalog::row_copy`),
    /// if it has one: a copy's key is the row's primary key, so the
    /// deleted row's entry is one key, deleted as such.
    own_copy: Option<IndexPlan>,
    /// The row copies of the other deleted tables: the copies of a deleted
    /// row tree's rows are one key range per copy (their keys begin with
    /// the deleted row's key values) — deleted as a range, not row by row.
    copies: Vec<IndexPlan>,
}

impl CascadePlan {
    fn new(catalog: &Catalog, table: &Table) -> Result<CascadePlan> {
        let mut deleted = HashSet::from([table.id]);
        let mut selective = false;
        let mut stack = vec![table.name.clone()];
        while let Some(name) = stack.pop() {
            for child in catalog.children(&name) {
                match child.interleave.as_ref().map(|i| (i.kind, i.on_delete)) {
                    Some((InterleaveKind::InParent, OnDelete::Cascade)) => {
                        deleted.insert(child.id);
                        stack.push(child.name.clone());
                    }
                    _ => selective = true,
                }
            }
        }
        let mut indexes = HashMap::new();
        let mut copies = Vec::new();
        for id in &deleted {
            let Some(t) = catalog.table_by_id(*id) else {
                continue;
            };
            let (copy, plans): (Vec<IndexPlan>, Vec<IndexPlan>) =
                IndexPlan::for_table(catalog, &t.name)?
                    .into_iter()
                    .partition(|p| p.index.row_copy);
            copies.extend(copy);
            if !plans.is_empty() {
                let chain = catalog.ancestry(&t.name)?.into_iter().cloned().collect();
                indexes.insert(*id, (t.clone(), chain, plans));
            }
        }
        let selective = selective || !indexes.is_empty();
        let own_copy = copies
            .iter()
            .position(|c| c.index.table == table.name)
            .map(|i| copies.swap_remove(i));
        Ok(CascadePlan {
            deleted,
            selective,
            indexes,
            own_copy,
            copies,
        })
    }

    /// Deletes the row of `table` with key `key` (`key_values` decoded) and
    /// what its deletion cascades to.
    fn delete_row_tree(
        &self,
        txn: &mut spindle_txn::Transaction,
        catalog: &Catalog,
        table: &Table,
        key: &[u8],
        key_values: &[Value],
    ) -> Result<()> {
        let end = prefix_end(key);
        if !self.selective {
            // The row and its whole row tree: one key-range delete.
            txn.delete_range(key, end.as_deref())?;
            return self.delete_copies(txn, key_values);
        }
        let mut doomed = Vec::new();
        for item in txn.scan(key, end.as_deref()) {
            let (k, v) = item?;
            let tid = catalog.key_owner(&k)?;
            if self.deleted.contains(&tid) {
                if let Some((t, chain, _)) = self.indexes.get(&tid) {
                    let chain: Vec<&Table> = chain.iter().collect();
                    let kv = Catalog::decode_key(&chain, &k)?.ok_or_else(|| {
                        Error::Internal(format!("row key of {} does not decode", t.name))
                    })?;
                    doomed.push((k, Some((tid, stored_row(t, &kv, &v)?))));
                } else {
                    doomed.push((k, None));
                }
                continue;
            }
            if catalog.index_by_id(tid).is_some() {
                // An entry of an index interleaved here: it goes (or stays)
                // with its row, through `maintain`.
                continue;
            }
            let Some(t) = catalog.table_by_id(tid) else {
                continue;
            };
            if let Some(il) = &t.interleave {
                let parent_deleted = catalog
                    .table(&il.parent)
                    .is_some_and(|p| self.deleted.contains(&p.id));
                if parent_deleted
                    && il.kind == InterleaveKind::InParent
                    && il.on_delete == OnDelete::NoAction
                {
                    return Err(Error::ForeignKeyViolation(format!(
                        "delete on table \"{}\" violates interleave: rows of \"{}\" (ON DELETE NO ACTION) exist under the deleted row",
                        table.name, t.name
                    )));
                }
            }
        }
        for (k, row) in doomed {
            if let Some((tid, row)) = row {
                if let Some((_, _, plans)) = self.indexes.get(&tid) {
                    maintain(txn, plans, Some(&row), None, false)?;
                }
            }
            txn.delete(k);
        }
        self.delete_copies(txn, key_values)
    }

    /// Deletes the row copies' entries of a deleted row tree (after the
    /// checks that may refuse the delete): the deleted row's own entry
    /// (its key: the row's full key values), then, by range, the entries
    /// of its descendants (their keys begin with those values).
    fn delete_copies(
        &self,
        txn: &mut spindle_txn::Transaction,
        key_values: &[Value],
    ) -> Result<()> {
        if let Some(own) = &self.own_copy {
            txn.delete(own.encode(key_values, true)?);
        }
        for copy in &self.copies {
            let start = copy.encode(key_values, true)?;
            txn.delete_range(&start, prefix_end(&start).as_deref())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::HiddenKeys;

    #[test]
    fn hidden_keys_ascend_and_draw_afresh_at_the_top_or_when_taken() {
        let mut keys = HiddenKeys {
            next: Some(i64::MAX - 1),
        };
        assert_eq!(keys.draw(), i64::MAX - 1);
        assert_eq!(keys.draw(), i64::MAX);
        // No key above the top: the next run starts at random.
        assert_eq!(keys.next, None);
        let start = keys.draw();
        assert_eq!(keys.next, start.checked_add(1));
        keys.taken();
        assert_eq!(keys.next, None);
    }
}
