//! The fast path: statements that touch one row by its full primary key run
//! straight against the transaction, without DataFusion planning (which
//! costs far more than the point read itself).
//!
//! ```text
//! SELECT a, b AS x FROM t [AS q] WHERE k1 = 1 AND k2 = 'x'   → Transaction::get(key)
//! SELECT a FROM t WHERE k1 = $1 AND k2 >= 3 AND k2 < $2     → Transaction::scan, rows
//!                                   decoded into Arrow as the general scan's
//!                                   (provider::scan_range_batch)
//! SELECT a FROM t WHERE i1 = $1 [AND i2 > 3]  (index on i1, i2) → the index's entries in
//!                                   that range, covering or each row by key
//!                                   (provider::index_fetch_batch)
//! UPDATE t SET a = a + 1, b = $2 WHERE k1 = $1 AND k2 = …    → get, compute, put_row
//! DELETE FROM t WHERE k1 = … AND k2 = …                      → the row tree by key
//! INSERT INTO t VALUES (1, 'x'), ($1, $2)                    → no query at all (dml.rs)
//! ```
//!
//! The contract: a statement takes the fast path only if the result is the
//! one DataFusion would give, and the read recorded for validation covers
//! what the result depends on (the point read of the row's key, the key
//! range scanned, an index's entry range and each fetched row's key). An
//! index is read only where the general path would read the same one (its
//! cost rule, `plan_index_read`), so even the order of rows without ORDER
//! BY is the same. Anything
//! the matcher does not recognise exactly — other predicates, expressions,
//! joins, ORDER BY, hints, key values whose type differs from the key
//! column's, FLOAT64 keys (where `-0 = 0`) — goes the general way. The
//! matching is an AST walk; bound parameters arrive as the literals
//! [`crate::bind`] writes, which [`crate::dml::literal_value`] reads back.

use std::borrow::Cow;
use std::sync::Arc;

use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::sql::sqlparser::ast;
use smallvec::SmallVec;
use spindle_catalog::{Catalog, RowCodec, Table};
use spindle_keys::{row, DataType, Value};

use crate::dml::literal_value;
use crate::error::{Error, Result};
use crate::parser::fold_ident;
use crate::provider::ScanRequest;
use crate::session::{Output, StatementContext};
use crate::types::{table_schema, ColumnBuilder};

/// What a WHERE clause said about the primary key.
pub(crate) enum KeyMatch {
    /// Equality on every key column: the key values in key order.
    Point(Vec<Value>),
    /// Equality with NULL on a key column: no row can match.
    Nothing,
}

/// The table a single-table FROM names (`t`, `public.t`, `t AS q`), with
/// the names that may qualify its columns. `None` for anything else.
pub(crate) fn single_table<'a>(
    catalog: &'a Catalog,
    twj: &ast::TableWithJoins,
) -> Option<(&'a Table, Vec<String>)> {
    if !twj.joins.is_empty() {
        return None;
    }
    let ast::TableFactor::Table {
        name, alias, args, ..
    } = &twj.relation
    else {
        return None;
    };
    if args.is_some() {
        return None;
    }
    // Anything besides a name and a plain alias (hints, sampling, column
    // aliases, versions) shows up in the display.
    let plain = match alias {
        Some(a) if !a.columns.is_empty() || a.at.is_some() => return None,
        Some(a) => format!("{name} {a}"),
        None => name.to_string(),
    };
    if twj.relation.to_string() != plain {
        return None;
    }
    let parts: Vec<&ast::Ident> = name.0.iter().map(|p| p.as_ident()).collect::<Option<_>>()?;
    let table_name = match parts.as_slice() {
        [t] => fold_ident(t),
        [s, t] if fold_ident(s) == "public" => fold_ident(t),
        _ => return None,
    };
    let table = catalog.table(&table_name)?;
    let qualifiers = match alias {
        Some(a) => vec![fold_ident(&a.name)],
        None => vec![table.name.clone()],
    };
    Some((table, qualifiers))
}

/// A column reference to `table` (bare or qualified by one of
/// `qualifiers`): its index in `table.columns`.
fn column_ref(table: &Table, qualifiers: &[String], e: &ast::Expr) -> Option<usize> {
    let name = match e {
        ast::Expr::Identifier(i) => fold_ident(i),
        ast::Expr::CompoundIdentifier(parts) => match parts.as_slice() {
            [q, c] if qualifiers.contains(&fold_ident(q)) => fold_ident(c),
            _ => return None,
        },
        ast::Expr::Nested(inner) => return column_ref(table, qualifiers, inner),
        _ => return None,
    };
    table
        .column_index(&name)
        .filter(|i| !table.columns[*i].hidden)
}

/// Whether `v` may be compared with a key column of type `t` as is: the
/// same type (the comparison DataFusion would make after coercion is then
/// plain equality of encoded keys). FLOAT64 is excluded (`-0 = 0`, NaN).
pub(crate) fn same_key_type(v: &Value, t: &DataType) -> bool {
    matches!(
        (v, t),
        (Value::Int64(_), DataType::Int64)
            | (Value::String(_), DataType::String(_))
            | (Value::Bytes(_), DataType::Bytes(_))
            | (Value::Bool(_), DataType::Bool)
            | (Value::Date(_), DataType::Date)
            | (Value::Timestamp(_), DataType::Timestamp)
            | (Value::Numeric(_), DataType::Numeric)
    )
}

/// Matches `k1 = v1 AND k2 = v2 …` naming every key column of `table`
/// exactly once with a literal of the column's type or a parameter, and
/// nothing else: [`match_key_range`] narrowed to one full key.
pub(crate) fn match_point_key(
    table: &Table,
    qualifiers: &[String],
    selection: Option<&ast::Expr>,
) -> Option<KeyRange<Slot>> {
    match match_key_range(table, qualifiers, selection)? {
        KeyRange::Scan {
            eq,
            lower: None,
            upper: None,
        } if eq.len() == table.primary_key.len() => Some(KeyRange::Scan {
            eq,
            lower: None,
            upper: None,
        }),
        KeyRange::Scan { .. } => None,
        KeyRange::Nothing => Some(KeyRange::Nothing),
    }
}

/// [`match_point_key`] in a bound statement (a placeholder left in it
/// takes the general path): the key values.
pub(crate) fn match_key(
    table: &Table,
    qualifiers: &[String],
    selection: Option<&ast::Expr>,
) -> Option<KeyMatch> {
    match match_point_key(table, qualifiers, selection)?.resolve(table, &[])? {
        KeyRange::Nothing => Some(KeyMatch::Nothing),
        KeyRange::Scan { eq, .. } => Some(KeyMatch::Point(eq)),
    }
}

/// What a WHERE clause said about a range of the primary key: with
/// [`Slot`]s as matched, with values once the parameters are known.
#[derive(Debug, Clone)]
pub(crate) enum KeyRange<V = Value> {
    /// A comparison with NULL: no row can match.
    Nothing,
    /// Equality on the first `eq.len()` key columns, then optional bounds
    /// (value, inclusive) on the next one.
    Scan {
        eq: Vec<V>,
        lower: Option<(V, bool)>,
        upper: Option<(V, bool)>,
    },
}

/// A value the fast path compares or writes: a literal of the statement,
/// or parameter `$n` (index `n - 1`), supplied when the statement runs. A
/// plan made from a statement with placeholders is reused with new
/// parameters; one made from a bound statement has only literals.
#[derive(Debug, Clone)]
pub(crate) enum Slot {
    Value(Value),
    Param(usize),
    /// The statement's time (`CURRENT_TIMESTAMP`, `now()`), taken when the
    /// plan runs; only for a TIMESTAMP column's inserted value.
    Now,
}

impl Slot {
    /// `CURRENT_TIMESTAMP` or `now()` (any case, no arguments).
    pub(crate) fn is_now(e: &ast::Expr) -> bool {
        let ast::Expr::Function(f) = e else {
            return false;
        };
        let no_args = match &f.args {
            ast::FunctionArguments::None => true,
            ast::FunctionArguments::List(l) => l.args.is_empty() && l.clauses.is_empty(),
            ast::FunctionArguments::Subquery(_) => false,
        };
        let name = f.name.to_string().to_ascii_lowercase();
        no_args
            && (name == "current_timestamp" || name == "now")
            && f.filter.is_none()
            && f.over.is_none()
            && f.within_group.is_empty()
            && f.null_treatment.is_none()
            && matches!(f.parameters, ast::FunctionArguments::None)
    }

    /// A literal ([`literal_value`]) or a `$n` placeholder.
    pub(crate) fn of(e: &ast::Expr) -> Option<Slot> {
        if let Some(v) = literal_value(e) {
            return Some(Slot::Value(v));
        }
        match e {
            ast::Expr::Value(v) => match &v.value {
                ast::Value::Placeholder(p) => p
                    .strip_prefix('$')?
                    .parse::<usize>()
                    .ok()
                    .filter(|n| *n >= 1)
                    .map(|n| Slot::Param(n - 1)),
                _ => None,
            },
            ast::Expr::Nested(inner) => Slot::of(inner),
            _ => None,
        }
    }

    /// The value: the literal, or the parameter as binding would have made
    /// it ([`crate::bind`] writes JSON as a text literal). `None` when the
    /// parameter is missing (the general path reports that).
    /// [`Slot::resolve`], borrowing a literal or parameter rather than
    /// copying it (a prepared INSERT's text parameter goes into the row's
    /// encoding without a `String` of its own).
    pub(crate) fn resolve_cow<'a>(&'a self, params: &'a [Value]) -> Option<Cow<'a, Value>> {
        match self {
            Slot::Value(v) => Some(Cow::Borrowed(v)),
            Slot::Param(i) => Some(match params.get(*i)? {
                Value::Json(s) => Cow::Owned(Value::String(s.clone())),
                v => Cow::Borrowed(v),
            }),
            Slot::Now => self.resolve(params).map(Cow::Owned),
        }
    }

    pub(crate) fn resolve(&self, params: &[Value]) -> Option<Value> {
        match self {
            Slot::Value(v) => Some(v.clone()),
            Slot::Param(i) => Some(match params.get(*i)? {
                Value::Json(s) => Value::String(s.clone()),
                v => v.clone(),
            }),
            Slot::Now => Some(Value::Timestamp(
                i64::try_from(crate::session::now_micros()).unwrap_or(i64::MAX),
            )),
        }
    }
}

impl KeyRange<Slot> {
    /// The range with `params` filled in, or `None` (take the general path)
    /// when a parameter is missing or not of its key column's type. The
    /// type of a literal was checked when matching.
    pub(crate) fn resolve(&self, table: &Table, params: &[Value]) -> Option<KeyRange> {
        let (eq, lower, upper) = match self {
            KeyRange::Nothing => return Some(KeyRange::Nothing),
            KeyRange::Scan { eq, lower, upper } => (eq, lower, upper),
        };
        let mut nothing = false;
        let mut value = |pos: usize, s: &Slot| -> Option<Value> {
            let v = s.resolve(params)?;
            if v.is_null() {
                nothing = true;
            } else if !same_key_type(
                &v,
                &table.column(&table.primary_key.get(pos)?.name)?.data_type,
            ) {
                return None;
            }
            Some(v)
        };
        let eq_values = eq
            .iter()
            .enumerate()
            .map(|(pos, s)| value(pos, s))
            .collect::<Option<Vec<Value>>>()?;
        let mut bound = |b: &Option<(Slot, bool)>| -> Option<Option<(Value, bool)>> {
            match b {
                None => Some(None),
                Some((s, inclusive)) => Some(Some((value(eq.len(), s)?, *inclusive))),
            }
        };
        let (lower, upper) = (bound(lower)?, bound(upper)?);
        if nothing {
            return Some(KeyRange::Nothing);
        }
        Some(KeyRange::Scan {
            eq: eq_values,
            lower,
            upper,
        })
    }
}

/// Appends the conjuncts of `e` to `out` (`a AND (b AND c)` → a, b, c).
pub(crate) fn conjuncts<'e>(e: &'e ast::Expr, out: &mut Vec<&'e ast::Expr>) {
    match e {
        ast::Expr::BinaryOp {
            left,
            op: ast::BinaryOperator::And,
            right,
        } => {
            conjuncts(left, out);
            conjuncts(right, out);
        }
        ast::Expr::Nested(inner) => conjuncts(inner, out),
        other => out.push(other),
    }
}

/// Matches a conjunction of `=` on a prefix of the key columns and at most
/// one lower and one upper bound (`>`, `>=`, `<`, `<=`) on the next key
/// column, which must be ascending (and, with no lower bound, NOT NULL,
/// since NULL keys sort first), each with a literal of the column's type
/// or a parameter (whose type [`KeyRange::resolve`] checks). Anything else
/// (other columns, OR, a gap in the prefix) is `None`.
pub(crate) fn match_key_range(
    table: &Table,
    qualifiers: &[String],
    selection: Option<&ast::Expr>,
) -> Option<KeyRange<Slot>> {
    let mut parts = Vec::new();
    if let Some(sel) = selection {
        conjuncts(sel, &mut parts);
    }
    let n = table.primary_key.len();
    let mut eq: Vec<Option<Slot>> = vec![None; n];
    // (key position, operator, value) of the bounds.
    let mut bounds: Vec<(usize, ast::BinaryOperator, Slot)> = Vec::new();
    let (mut nothing, mut params) = (false, false);
    for p in parts {
        let ast::Expr::BinaryOp { left, op, right } = p else {
            return None;
        };
        // Column on the left; a literal on the left flips the operator.
        let (col, lit, op) = match (
            column_ref(table, qualifiers, left),
            column_ref(table, qualifiers, right),
        ) {
            (Some(c), None) => (c, right, op.clone()),
            (None, Some(c)) => {
                use ast::BinaryOperator as B;
                let flipped = match op {
                    B::Eq => B::Eq,
                    B::Lt => B::Gt,
                    B::LtEq => B::GtEq,
                    B::Gt => B::Lt,
                    B::GtEq => B::LtEq,
                    _ => return None,
                };
                (c, left, flipped)
            }
            _ => return None,
        };
        let column = &table.columns[col];
        let pos = table
            .primary_key
            .iter()
            .position(|k| k.name == column.name)?;
        let v = Slot::of(lit)?;
        match &v {
            Slot::Value(v) if v.is_null() => nothing = true,
            Slot::Value(v) if !same_key_type(v, &column.data_type) => return None,
            Slot::Value(_) => {}
            Slot::Param(_) => params = true,
            Slot::Now => return None,
        }
        match op {
            ast::BinaryOperator::Eq => {
                if eq[pos].is_some() {
                    return None;
                }
                eq[pos] = Some(v);
            }
            ast::BinaryOperator::Lt
            | ast::BinaryOperator::LtEq
            | ast::BinaryOperator::Gt
            | ast::BinaryOperator::GtEq => bounds.push((pos, op, v)),
            _ => return None,
        }
    }
    // With parameters, their types are checked first (when resolving, which
    // then finds the NULL), as they would be without parameters.
    if nothing && !params {
        return Some(KeyRange::Nothing);
    }
    let fixed = eq.iter().take_while(|v| v.is_some()).count();
    if eq[fixed..].iter().any(|v| v.is_some()) {
        return None;
    }
    let eq: Vec<Slot> = eq.into_iter().flatten().collect();
    let (mut lower, mut upper) = (None, None);
    for (pos, op, v) in bounds {
        if pos != fixed || table.primary_key[pos].direction != spindle_keys::Direction::Asc {
            return None;
        }
        let slot = match op {
            ast::BinaryOperator::Gt => (&mut lower, (v, false)),
            ast::BinaryOperator::GtEq => (&mut lower, (v, true)),
            ast::BinaryOperator::Lt => (&mut upper, (v, false)),
            _ => (&mut upper, (v, true)),
        };
        if slot.0.is_some() {
            return None;
        }
        *slot.0 = Some(slot.1);
    }
    if upper.is_some() && lower.is_none() {
        let name = &table.primary_key[fixed].name;
        if table.column(name).is_none_or(|c| c.nullable) {
            return None;
        }
    }
    Some(KeyRange::Scan { eq, lower, upper })
}

/// The `[start, end)` of the storage keys a [`KeyRange::Scan`] covers
/// (rows of other tables of the row trees in it are skipped by decoding).
pub(crate) fn scan_bounds(
    catalog: &Catalog,
    chain: &[&Table],
    eq: &[Value],
    lower: Option<&(Value, bool)>,
    upper: Option<&(Value, bool)>,
) -> Option<(Vec<u8>, Option<Vec<u8>>)> {
    use spindle_keys::key::prefix_end;
    let with = |v: &Value| -> Option<Vec<u8>> {
        let mut p = eq.to_vec();
        p.push(v.clone());
        catalog.encode_key_prefix(chain, &p, false).ok()
    };
    let base = catalog.encode_key_prefix(chain, eq, true).ok()?;
    let start = match lower {
        None => base.clone(),
        Some((v, true)) => with(v)?,
        Some((v, false)) => prefix_end(&with(v)?)?,
    };
    let end = match upper {
        None => prefix_end(&base),
        Some((v, true)) => prefix_end(&with(v)?),
        Some((v, false)) => Some(with(v)?),
    };
    Some((start, end))
}

/// A planned `SELECT cols FROM t WHERE <key equality prefix [and a
/// range]>`: everything but the parameters' values.
#[derive(Debug)]
pub(crate) struct SelectPlan {
    /// `… FOR UPDATE` of one row by its full key: the point read takes the
    /// row's write lock first ([`crate::dml::lock_row`]).
    pub(crate) for_update: bool,
    table: Table,
    schema: SchemaRef,
    /// Over the table's key, or over the index's ([`SelectPlan::index`]).
    range: KeyRange<Slot>,
    /// The table's ancestry and the output columns (indexes into
    /// `table.columns`): a range's scan, a point read's columns.
    request: ScanRequest,
    /// The table's key layout: a point read's key without a catalog
    /// lookup, and where its key columns are.
    codec: RowCodec,
    /// Read through a secondary index instead of the table's key.
    index: Option<IndexRead>,
}

/// How a [`SelectPlan`] reads through an index whose key the WHERE
/// constrains: the entries in the key range, and, unless the index covers
/// the output, each entry's base row by key.
#[derive(Debug)]
struct IndexRead {
    /// The index's virtual table (`Catalog::index_chain`): the range's
    /// key columns and types.
    key_table: Table,
    /// The index's chain; the output columns' positions in an entry
    /// (covering), else the base table's key columns' positions.
    entries: ScanRequest,
    covering: bool,
}

/// `SELECT cols FROM t WHERE <key equality prefix [and a range]>`: the
/// result (a point read, or a scan of the key range), or `None` if the
/// query is not of that form.
pub(crate) fn point_select(
    ctx: &StatementContext,
    stmt: &ast::Statement,
    read_only: bool,
) -> Result<Option<Output>> {
    let catalog = ctx.catalog()?;
    match plan_select(&catalog, stmt) {
        Some(plan) if !(plan.for_update && read_only) => run_select(ctx, &catalog, &plan, &[]),
        _ => Ok(None),
    }
}

/// The parts of `SELECT items FROM from WHERE selection` with no other
/// clause in the query or the select (ORDER BY, LIMIT, DISTINCT, GROUP BY,
/// WITH, …) but locking clauses, which the caller checks; `None` for
/// anything else.
pub(crate) fn select_from_where(
    stmt: &ast::Statement,
) -> Option<(&ast::Query, &ast::Select, &ast::TableWithJoins, &ast::Expr)> {
    let ast::Statement::Query(q) = stmt else {
        return None;
    };
    let ast::SetExpr::Select(s) = q.body.as_ref() else {
        return None;
    };
    let ([from], Some(selection)) = (s.from.as_slice(), s.selection.as_ref()) else {
        return None;
    };
    let items: Vec<String> = s.projection.iter().map(|p| p.to_string()).collect();
    let canonical = format!("SELECT {} FROM {from} WHERE {selection}", items.join(", "));
    let locks: String = q.locks.iter().map(|l| format!(" {l}")).collect();
    if s.to_string() != canonical || q.to_string() != format!("{canonical}{locks}") {
        return None;
    }
    Some((q, s, from, selection))
}

/// Plans a query for [`run_select`], or `None` if it is not of the form
/// the fast path runs.
pub(crate) fn plan_select(catalog: &Catalog, stmt: &ast::Statement) -> Option<SelectPlan> {
    let (q, s, from, selection) = select_from_where(stmt)?;
    // The one locking clause taken: a plain FOR UPDATE (no OF, NOWAIT or
    // SKIP LOCKED).
    let for_update = match q.locks.as_slice() {
        [] => false,
        [ast::LockClause {
            lock_type: ast::LockType::Update,
            of: None,
            nonblock: None,
        }] => true,
        _ => return None,
    };
    let (table, qualifiers) = single_table(catalog, from)?;
    // Output columns: `*`, `q.*`, columns, columns AS alias.
    let mut out: Vec<(usize, String)> = Vec::new();
    for item in &s.projection {
        match item {
            ast::SelectItem::Wildcard(opts) if opts.to_string().is_empty() => {
                for (i, c) in table.columns.iter().enumerate() {
                    if !c.hidden {
                        out.push((i, c.name.clone()));
                    }
                }
            }
            ast::SelectItem::QualifiedWildcard(
                ast::SelectItemQualifiedWildcardKind::ObjectName(n),
                opts,
            ) if opts.to_string().is_empty()
                && n.0.len() == 1
                && n.0[0]
                    .as_ident()
                    .is_some_and(|i| qualifiers.contains(&fold_ident(i))) =>
            {
                for (i, c) in table.columns.iter().enumerate() {
                    if !c.hidden {
                        out.push((i, c.name.clone()));
                    }
                }
            }
            ast::SelectItem::UnnamedExpr(e) => {
                let i = column_ref(table, &qualifiers, e)?;
                out.push((i, table.columns[i].name.clone()));
            }
            ast::SelectItem::ExprWithAlias { expr, alias } => {
                let i = column_ref(table, &qualifiers, expr)?;
                out.push((i, fold_ident(alias)));
            }
            _ => return None,
        }
    }
    // Repeated output names get suffixes on the general path.
    let mut names: Vec<&str> = out.iter().map(|(_, n)| n.as_str()).collect();
    names.sort_unstable();
    if names.windows(2).any(|w| w[0] == w[1]) {
        return None;
    }
    let out_columns: Vec<usize> = out.iter().map(|(i, _)| *i).collect();
    let (range, index) = match match_key_range(table, &qualifiers, Some(selection)) {
        Some(range) => (range, None),
        // FOR UPDATE only by the primary key.
        None if !for_update => {
            let (range, read) =
                plan_index_read(catalog, table, &qualifiers, selection, &out_columns)?;
            (range, Some(read))
        }
        None => return None,
    };
    // FOR UPDATE locks one row, named by its full key; over a range it
    // takes the general path (which takes no lock).
    let point = matches!(&range, KeyRange::Scan { eq, lower: None, upper: None }
        if eq.len() == table.primary_key.len());
    if for_update && !point && !matches!(range, KeyRange::Nothing) {
        return None;
    }
    let full = table_schema(table, true);
    let fields: Vec<Field> = out
        .iter()
        .map(|(i, name)| {
            let f = full.field(*i);
            f.as_ref().clone().with_name(name)
        })
        .collect();
    let out: Vec<usize> = out.into_iter().map(|(i, _)| i).collect();
    let chain = catalog.ancestry(&table.name).ok()?;
    let request = ScanRequest {
        alone: chain.len() == 1 && !catalog.has_interleaved(&table.name),
        chain: chain.into_iter().cloned().collect(),
        ranges: Vec::new(),
        columns: out,
        limit: None,
        filter: None,
    };
    Some(SelectPlan {
        for_update,
        table: table.clone(),
        schema: Arc::new(Schema::new(fields)),
        range,
        request,
        codec: RowCodec::new(catalog, table).ok()?,
        index,
    })
}

/// The index through which the general path would read a WHERE that says
/// nothing the table's own key can use ([`crate::provider`]'s
/// `SpindleTable::choose`, by the same costs, so that rows come in the
/// same order), when that WHERE is all `=` on leading columns of the
/// index's key and bounds on the next one; `None` otherwise (a full scan
/// wins, or the WHERE has other conditions).
///
/// A NULL_FILTERED index serves only a WHERE that fixes every indexed
/// column by `=` (it has no entries for rows with NULL in one of them);
/// the table's row copy is never read here, but it competes as the
/// general path lets it.
fn plan_index_read(
    catalog: &Catalog,
    table: &Table,
    qualifiers: &[String],
    selection: &ast::Expr,
    out: &[usize],
) -> Option<(KeyRange<Slot>, IndexRead)> {
    let has_row_trees = catalog.has_interleaved(&table.name);
    let mut best_cost = crate::provider::full_read_cost(has_row_trees);
    let mut best: Option<(KeyRange<Slot>, crate::index::IndexPlan, bool)> = None;
    for index in catalog.table_indexes(&table.name) {
        let ip = crate::index::IndexPlan::new(catalog, index).ok()?;
        let vt = ip.virtual_table();
        let covering = out
            .iter()
            .all(|c| vt.column(&table.columns[*c].name).is_some());
        if index.row_copy {
            // Read instead of row trees: covering, not narrowed.
            if has_row_trees && ip.chain.len() == 1 {
                best_cost = best_cost.min(crate::provider::index_read_cost(&ip, 0, 0, true));
            }
            continue;
        }
        let Some(range) = match_key_range(vt, qualifiers, Some(selection)) else {
            continue;
        };
        let (eq, bounds) = match &range {
            KeyRange::Nothing => (index.columns.len(), 0),
            KeyRange::Scan { eq, lower, upper } => (
                eq.len(),
                usize::from(lower.is_some()) + usize::from(upper.is_some()),
            ),
        };
        // Only columns the query may name: visible in the table. And
        // none that narrows the table's own key (its first key column):
        // the general path would weigh that read too.
        let named = vt.primary_key.iter().take(eq + usize::from(bounds > 0));
        if named
            .clone()
            .map(|k| table.column(&k.name))
            .any(|c| c.is_none_or(|c| c.hidden))
            || named
                .clone()
                .any(|k| table.primary_key.first().is_some_and(|p| p.name == k.name))
        {
            continue;
        }
        if index.null_filtered && eq < index.columns.len() {
            continue;
        }
        if eq == 0 && bounds == 0 {
            continue;
        }
        let cost = crate::provider::index_read_cost(&ip, eq, bounds, covering);
        if cost < best_cost {
            best_cost = cost;
            best = Some((range, ip, covering));
        }
    }
    // A row copy or the table's own keys won: the general path scans.
    let (range, ip, covering) = best?;
    let vt = ip.virtual_table().clone();
    let columns = if covering {
        out.iter()
            .map(|c| vt.column_index(&table.columns[*c].name))
            .collect::<Option<Vec<usize>>>()?
    } else {
        table
            .primary_key
            .iter()
            .map(|k| vt.column_index(&k.name))
            .collect::<Option<Vec<usize>>>()?
    };
    let entries = ScanRequest {
        // A global index's entries are alone in their key space.
        alone: ip.chain.len() == 1,
        chain: ip.chain,
        ranges: Vec::new(),
        columns,
        limit: None,
        filter: None,
    };
    Some((
        range,
        IndexRead {
            key_table: vt,
            entries,
            covering,
        },
    ))
}

/// `SELECT <literal or parameter> [AS name], …` and nothing else (no
/// FROM): a connection pool's `SELECT 1`, answered without DataFusion.
/// Only INT64, text and BOOL values are answered here; whatever DataFusion
/// makes of other literals (floats, NUMERIC, NULL) is left to it.
#[derive(Debug)]
pub(crate) struct ConstantPlan {
    /// Output name (the alias, or PostgreSQL's `?column?`) and value.
    items: Vec<(String, Slot)>,
}

/// Plans a [`ConstantPlan`], or `None` if the query is not of that form.
pub(crate) fn plan_constant(stmt: &ast::Statement) -> Option<ConstantPlan> {
    let ast::Statement::Query(q) = stmt else {
        return None;
    };
    let ast::SetExpr::Select(s) = q.body.as_ref() else {
        return None;
    };
    if !s.from.is_empty() {
        return None;
    }
    // No clause besides the select list, in the query or the select.
    let items: Vec<String> = s.projection.iter().map(|p| p.to_string()).collect();
    let canonical = format!("SELECT {}", items.join(", "));
    if s.to_string() != canonical || q.to_string() != canonical {
        return None;
    }
    let mut out = Vec::new();
    for item in &s.projection {
        let (name, e) = match item {
            ast::SelectItem::UnnamedExpr(e) => ("?column?".to_string(), e),
            ast::SelectItem::ExprWithAlias { expr, alias } => (fold_ident(alias), expr),
            _ => return None,
        };
        match Slot::of(e)? {
            slot @ (Slot::Value(_) | Slot::Param(_)) => out.push((name, slot)),
            Slot::Now => return None,
        }
    }
    Some(ConstantPlan { items: out })
}

/// Runs a [`ConstantPlan`]: one row, typed as DataFusion types the bound
/// literals; `None` for a value of another type or a missing parameter.
pub(crate) fn run_constant(plan: &ConstantPlan, params: &[Value]) -> Result<Option<Output>> {
    use datafusion::arrow::array::{ArrayRef, BooleanArray, Int64Array, StringArray};
    use datafusion::arrow::datatypes::DataType as ArrowType;
    let mut fields = Vec::with_capacity(plan.items.len());
    let mut arrays: Vec<ArrayRef> = Vec::with_capacity(plan.items.len());
    for (name, slot) in &plan.items {
        let (ty, array): (ArrowType, ArrayRef) = match slot.resolve(params) {
            Some(Value::Int64(i)) => (ArrowType::Int64, Arc::new(Int64Array::from(vec![i]))),
            Some(Value::String(t)) => (ArrowType::Utf8, Arc::new(StringArray::from(vec![t]))),
            Some(Value::Bool(b)) => (ArrowType::Boolean, Arc::new(BooleanArray::from(vec![b]))),
            _ => return Ok(None),
        };
        fields.push(Field::new(name, ty, false));
        arrays.push(array);
    }
    let schema: SchemaRef = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(schema.clone(), arrays)
        .map_err(|e| Error::Internal(format!("constant select batch: {e}")))?;
    Ok(Some(Output::Rows {
        schema,
        batches: vec![batch],
    }))
}

/// Runs a [`SelectPlan`] made against `catalog` with `params`; `None` when
/// the parameters do not suit the fast path (the general path runs the
/// statement).
pub(crate) fn run_select(
    ctx: &StatementContext,
    catalog: &Catalog,
    plan: &SelectPlan,
    params: &[Value],
) -> Result<Option<Output>> {
    let table = &plan.table;
    if let Some(read) = &plan.index {
        return run_index_select(ctx, catalog, plan, read, params);
    }
    let Some(range) = plan.range.resolve(table, params) else {
        return Ok(None);
    };
    let row: Option<RecordBatch> = match range {
        KeyRange::Scan { eq, lower, upper }
            if lower.is_some() || upper.is_some() || eq.len() < table.primary_key.len() =>
        {
            let chain: Vec<&Table> = plan.request.chain.iter().collect();
            let Some((start, end)) =
                scan_bounds(catalog, &chain, &eq, lower.as_ref(), upper.as_ref())
            else {
                return Ok(None);
            };
            let txn = ctx.lock()?;
            let batch = crate::provider::scan_range_batch(
                &txn,
                &plan.request,
                &plan.schema,
                &start,
                end.as_deref(),
                INLINE_SCAN_ENTRIES,
            )?;
            return Ok(Some(Output::Rows {
                schema: plan.schema.clone(),
                batches: batch.into_iter().collect(),
            }));
        }
        KeyRange::Nothing => None,
        KeyRange::Scan { eq, .. } => {
            // What is left: every key column fixed, one row, a point read.
            let Ok(key) = plan.codec.encode_key_of(&eq) else {
                return Ok(None);
            };
            if plan.for_update {
                crate::dml::lock_row(ctx, &key)?;
            }
            let stored = ctx.lock()?.get(&key).map_err(Error::from)?;
            match stored {
                None => None,
                Some(v) => Some(point_batch(plan, &eq, &v)?),
            }
        }
    };
    Ok(Some(Output::Rows {
        schema: plan.schema.clone(),
        batches: row.into_iter().collect(),
    }))
}

/// [`run_select`] through an index: the entries in the range, the output
/// decoded from them (covering) or from each one's base row.
fn run_index_select(
    ctx: &StatementContext,
    catalog: &Catalog,
    plan: &SelectPlan,
    read: &IndexRead,
    params: &[Value],
) -> Result<Option<Output>> {
    let Some(range) = plan.range.resolve(&read.key_table, params) else {
        return Ok(None);
    };
    let batch = match range {
        KeyRange::Nothing => None,
        KeyRange::Scan { eq, lower, upper } => {
            let chain: Vec<&Table> = read.entries.chain.iter().collect();
            let Some((start, end)) =
                scan_bounds(catalog, &chain, &eq, lower.as_ref(), upper.as_ref())
            else {
                return Ok(None);
            };
            let txn = ctx.lock()?;
            if read.covering {
                crate::provider::scan_range_batch(
                    &txn,
                    &read.entries,
                    &plan.schema,
                    &start,
                    end.as_deref(),
                    INLINE_SCAN_ENTRIES,
                )?
            } else {
                crate::provider::index_fetch_batch(
                    &txn,
                    &read.entries,
                    &plan.request,
                    &plan.schema,
                    &start,
                    end.as_deref(),
                    INLINE_SCAN_ENTRIES,
                )?
            }
        }
    };
    Ok(Some(Output::Rows {
        schema: plan.schema.clone(),
        batches: batch.into_iter().collect(),
    }))
}

/// The one-row batch of a point read: the output columns straight from
/// the key values and the stored row's bytes (only the columns asked for
/// are decoded, and text is copied once, into its array).
fn point_batch(plan: &SelectPlan, key: &[Value], stored: &[u8]) -> Result<RecordBatch> {
    let table = &plan.table;
    let columns = &plan.request.columns;
    let mut builders = columns
        .iter()
        .map(|i| ColumnBuilder::new(&table.columns[*i].data_type, 1))
        .collect::<Result<Vec<_>>>()?;
    // Key columns from the key; the others from the row, in its order
    // (a column may be asked for twice: `SELECT v, v AS w`).
    let key_idx = plan.codec.key_idx();
    // Inline up to 8 columns: a point read makes no allocation for these.
    let mut wanted: SmallVec<[(u32, usize); 8]> = SmallVec::new();
    for (out, i) in columns.iter().enumerate() {
        match key_idx.iter().position(|k| k == i) {
            Some(pos) => {
                let v = key.get(pos).ok_or_else(|| {
                    Error::Internal("a point read's key has fewer values than key columns".into())
                })?;
                builders[out].append_value(v)?
            }
            None => wanted.push((table.columns[*i].id, out)),
        }
    }
    let mut filled: SmallVec<[bool; 16]> = smallvec::smallvec![false; columns.len()];
    if !wanted.is_empty() {
        // The first value of a column id counts (as in a scan).
        let mut mismatch = None;
        row::visit_row(
            stored,
            |id| wanted.iter().any(|(w, _)| *w == id),
            |id, v| {
                for (_, out) in wanted.iter().filter(|(w, _)| *w == id) {
                    if !filled[*out] {
                        filled[*out] = true;
                        if let Err(e) = builders[*out].append_raw(v) {
                            mismatch.get_or_insert(e);
                        }
                    }
                }
                Ok(())
            },
        )?;
        if let Some(e) = mismatch {
            return Err(e);
        }
    }
    // A column the row does not store is NULL.
    for (_, out) in &wanted {
        if !filled[*out] {
            filled[*out] = true;
            builders[*out].append_null();
        }
    }
    let arrays = builders.iter_mut().map(|b| b.finish()).collect();
    RecordBatch::try_new(plan.schema.clone(), arrays)
        .map_err(|e| Error::Internal(format!("key select batch: {e}")))
}

/// Entries a fast-path scan reads on the calling thread before it moves
/// the rest of the scan to [`crate::blocking`]: a short range (a row
/// tree's children, a few keys) costs microseconds, less than the
/// hand-off of a tokio worker `block_in_place` makes.
pub(crate) const INLINE_SCAN_ENTRIES: usize = 256;

/// An UPDATE's SET value in a form the fast path knows: a literal or
/// parameter, a column, or `col ± value` / `value + col` on INT64 (with
/// PostgreSQL's overflow error). Anything else sends the statement the
/// general way.
#[derive(Debug)]
pub(crate) enum SetPlan {
    Value(Slot),
    Column(usize),
    AddInt64 { col: usize, rhs: Slot, minus: bool },
}

/// Plans a SET value ([`SetPlan`]), or `None`.
pub(crate) fn plan_set(table: &Table, qualifiers: &[String], e: &ast::Expr) -> Option<SetPlan> {
    if let Some(v) = Slot::of(e) {
        return Some(SetPlan::Value(v));
    }
    if let Some(i) = column_ref(table, qualifiers, e) {
        return Some(SetPlan::Column(i));
    }
    let ast::Expr::BinaryOp { left, op, right } = e else {
        if let ast::Expr::Nested(inner) = e {
            return plan_set(table, qualifiers, inner);
        }
        return None;
    };
    let minus = match op {
        ast::BinaryOperator::Plus => false,
        ast::BinaryOperator::Minus => true,
        _ => return None,
    };
    let (col, lit) = match (
        column_ref(table, qualifiers, left),
        column_ref(table, qualifiers, right),
    ) {
        (Some(c), None) => (c, right),
        (None, Some(c)) if !minus => (c, left),
        _ => return None,
    };
    if table.columns[col].data_type != DataType::Int64 {
        return None;
    }
    let rhs = Slot::of(lit)?;
    if let Slot::Value(v) = &rhs {
        if !matches!(v, Value::Int64(_) | Value::Null) {
            return None;
        }
    }
    Some(SetPlan::AddInt64 { col, rhs, minus })
}

impl SetPlan {
    /// The new value over the row's current values, or `None` when a
    /// parameter does not suit the plan (take the general path).
    pub(crate) fn eval(&self, row: &[Value], params: &[Value]) -> Option<Result<Value>> {
        let (col, rhs, minus) = match self {
            SetPlan::Value(v) => return Some(Ok(v.resolve(params)?)),
            SetPlan::Column(i) => return Some(Ok(row[*i].clone())),
            SetPlan::AddInt64 { col, rhs, minus } => (*col, rhs, *minus),
        };
        let rhs = match rhs.resolve(params)? {
            Value::Int64(i) => Some(i),
            Value::Null => None,
            _ => return None,
        };
        Some(match (&row[col], rhs) {
            (Value::Null, _) | (_, None) => Ok(Value::Null),
            (Value::Int64(a), Some(b)) => {
                let r = if minus {
                    a.checked_sub(b)
                } else {
                    a.checked_add(b)
                };
                r.map(Value::Int64)
                    .ok_or_else(|| Error::OutOfRange("bigint out of range".into()))
            }
            _ => return None,
        })
    }
}
