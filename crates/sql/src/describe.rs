//! Describing a statement without running it: the types of its `$n`
//! parameters and the columns it returns (the wire protocol's
//! Parse/Describe).
//!
//! Parameter types, in order of preference (the server lets a type the
//! client declared in Parse win over all of these):
//! * a query (and the WHERE of UPDATE/DELETE, the source of INSERT …
//!   SELECT) is planned by DataFusion with the placeholders left in, and
//!   DataFusion infers each placeholder's type from its context
//!   (`id = $1` → the type of `id`, `CAST($1 AS DATE)` → DATE);
//! * a placeholder that is a whole value in `INSERT … VALUES`, an UPDATE's
//!   `SET col = $n` or `ON CONFLICT … DO UPDATE SET col = $n` takes the
//!   column's type;
//! * anything else is unknown (`None`); the server describes it as `text`
//!   and binds the client's text as a string literal, which DataFusion
//!   coerces where it is used, like PostgreSQL's `unknown` literals.
//!
//! Result columns: a query's planned schema (the same rewrites as
//! execution, so names and types match what Execute returns), SHOW's one
//! text column; statements that return no rows have none.
//!
//! A description depends on the text and the catalog alone, so it is kept
//! with the text's parsed statements under the catalog it was made against
//! ([`crate::plan_cache::Parsed`]) and made again only when the schema
//! changed: Parse of a known text costs a cache lookup, not a DataFusion
//! plan (`pgbench -M extended`, a row tree's five statements: 460 against
//! PostgreSQL's 816 transactions per second before, 788–1 600 against
//! 688–942 after, bench/README.md). Errors are not kept.

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::{ArrayRef, StringArray};
use datafusion::arrow::datatypes::{DataType as ArrowType, Field, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::{self, visit_expressions};
use spindle_catalog::Catalog;

use crate::error::{Error, Result};
use crate::parser::{self, Statement};
use crate::provider::TxnHandle;
use crate::session::{
    set_returning_aliases, spindle_numeric_casts, unique_output_names, Engine, Output,
};
use crate::settings::SettingStatement;

/// What [`describe`] found out about a statement.
#[derive(Debug, Clone, Default)]
pub struct Description {
    /// The type of `$1`, `$2`, … (as many as the highest placeholder
    /// number); `None` when the statement does not determine it.
    pub params: Vec<Option<ArrowType>>,
    /// The columns of the rows the statement returns, if it returns rows.
    pub columns: Option<SchemaRef>,
}

/// Describes the one statement in `sql`, reading the catalog through `txn`
/// (the session's open transaction) or a fresh snapshot. The text is parsed
/// once (the engine's parse cache) and described once per catalog: the
/// description is kept with the parsed text ([`crate::plan_cache`]).
pub async fn describe(
    engine: &Arc<Engine>,
    txn: Option<TxnHandle>,
    sql: &str,
) -> Result<Arc<Description>> {
    let parsed = engine.parse_cached(sql)?;
    let stmt = match parsed.stmts.as_slice() {
        [] => return Ok(Arc::default()),
        [stmt] => stmt,
        _ => {
            return Err(Error::Syntax(
                "cannot insert multiple commands into a prepared statement".into(),
            ))
        }
    };
    let txn = match txn {
        Some(t) => t,
        None => Arc::new(Mutex::new(engine.manager().begin()?)),
    };
    let catalog = txn
        .lock()
        .map_err(|_| Error::Internal("transaction lock poisoned".into()))?
        .catalog()
        .clone();
    if let Some(kept) = parsed.description(&catalog) {
        return Ok(kept);
    }
    let description =
        Arc::new(describe_statement(engine, txn, catalog.clone(), stmt.clone()).await?);
    parsed.keep_description(catalog, description.clone());
    Ok(description)
}

/// Describes `stmt` against `catalog` (the catalog of `txn`).
async fn describe_statement(
    engine: &Arc<Engine>,
    txn: TxnHandle,
    catalog: Arc<Catalog>,
    stmt: Statement,
) -> Result<Description> {
    let nparams = max_placeholder(&stmt);
    let mut params: Vec<Option<ArrowType>> = vec![None; nparams];
    // `$n::type` and `CAST($n AS type)` declare the type, as in PostgreSQL.
    for (n, ty) in cast_placeholders(&stmt) {
        set(&mut params, n, Some(ty));
    }
    // A row count or offset alone (`LIMIT $2`) is a BIGINT, as in
    // PostgreSQL; DataFusion infers no type for it, and a client would
    // send it as text, which no LIMIT takes.
    if let Statement::Query(q) = &stmt {
        for n in row_count_placeholders(q) {
            set(&mut params, n, Some(ArrowType::Int64));
        }
    }
    let plan_types = |stmt: ast::Statement| {
        let engine = engine.clone();
        let catalog = catalog.clone();
        let txn = txn.clone();
        async move { plan(&engine, catalog, txn, stmt).await }
    };
    let mut columns = None;
    match stmt {
        Statement::Query(q) => {
            let (schema, types) = plan_types(*q).await?;
            merge(&mut params, types);
            columns = Some(schema);
        }
        Statement::Setting(SettingStatement::Show { name }) => {
            columns = Some(utf8_schema(&[name.to_lowercase()]));
        }
        Statement::Setting(SettingStatement::ShowAll) => {
            columns = Some(utf8_schema(&["name".into(), "setting".into()]));
        }
        Statement::ExplainDml(_) => {
            columns = Some(utf8_schema(&["plan".into()]));
        }
        Statement::Insert { insert, .. } => {
            let table = table_of(&catalog, &insert.table.to_string());
            if let (Some(table), Some(source)) = (table, insert.source.as_ref()) {
                let names: Vec<String> = if insert.columns.is_empty() {
                    table
                        .columns
                        .iter()
                        .filter(|c| !c.hidden)
                        .map(|c| c.name.clone())
                        .collect()
                } else {
                    insert
                        .columns
                        .iter()
                        .filter_map(|c| c.0.last().and_then(|p| p.as_ident()))
                        .map(parser::fold_ident)
                        .collect()
                };
                let column_type = |name: &str| {
                    table
                        .columns
                        .iter()
                        .find(|c| c.name == name)
                        .map(|c| crate::types::arrow_type(&c.data_type))
                };
                if let ast::SetExpr::Values(values) = source.body.as_ref() {
                    for row in &values.rows {
                        for (expr, name) in row.iter().zip(&names) {
                            if let Some(n) = placeholder_index(expr) {
                                set(&mut params, n, column_type(name));
                            }
                        }
                    }
                } else if let Ok((_, types)) =
                    plan_types(ast::Statement::Query(source.clone())).await
                {
                    merge(&mut params, types);
                }
                if let Some(ast::OnInsert::OnConflict(ast::OnConflict {
                    action: ast::OnConflictAction::DoUpdate(update),
                    ..
                })) = &insert.on
                {
                    for a in &update.assignments {
                        if let (ast::AssignmentTarget::ColumnName(c), Some(n)) =
                            (&a.target, placeholder_index(&a.value))
                        {
                            let name =
                                c.0.last()
                                    .and_then(|p| p.as_ident())
                                    .map(parser::fold_ident);
                            set(&mut params, n, name.and_then(|n| column_type(&n)));
                        }
                    }
                }
            }
        }
        Statement::Update(update) => {
            let table_name = update.table.relation.to_string();
            if let Some(table) = table_of(&catalog, &table_name) {
                for a in &update.assignments {
                    if let (ast::AssignmentTarget::ColumnName(c), Some(n)) =
                        (&a.target, placeholder_index(&a.value))
                    {
                        let name =
                            c.0.last()
                                .and_then(|p| p.as_ident())
                                .map(parser::fold_ident);
                        let ty = name.and_then(|name| {
                            table
                                .columns
                                .iter()
                                .find(|c| c.name == name)
                                .map(|c| crate::types::arrow_type(&c.data_type))
                        });
                        set(&mut params, n, ty);
                    }
                }
            }
            // The rest (WHERE, expressions in SET) through a SELECT over the
            // same tables.
            let exprs: Vec<String> = update
                .assignments
                .iter()
                .map(|a| a.value.to_string())
                .collect();
            let mut sql = format!("SELECT {} FROM {}", exprs.join(", "), update.table);
            if let Some(ast::UpdateTableFromKind::AfterSet(from))
            | Some(ast::UpdateTableFromKind::BeforeSet(from)) = &update.from
            {
                for t in from {
                    sql.push_str(&format!(", {t}"));
                }
            }
            if let Some(w) = &update.selection {
                sql.push_str(&format!(" WHERE {w}"));
            }
            infer_from_sql(&mut params, &sql, plan_types).await;
        }
        Statement::Delete(delete) => {
            let from = match &delete.from {
                ast::FromTable::WithFromKeyword(t) | ast::FromTable::WithoutKeyword(t) => t,
            };
            let tables: Vec<String> = from
                .iter()
                .chain(delete.using.iter().flatten())
                .map(|t| t.to_string())
                .collect();
            if let Some(w) = &delete.selection {
                let sql = format!("SELECT 1 FROM {} WHERE {w}", tables.join(", "));
                infer_from_sql(&mut params, &sql, plan_types).await;
            }
        }
        _ => {}
    }
    Ok(Description { params, columns })
}

async fn infer_from_sql<F, Fut>(params: &mut [Option<ArrowType>], sql: &str, plan_types: F)
where
    F: FnOnce(ast::Statement) -> Fut,
    Fut: std::future::Future<Output = Result<(SchemaRef, HashMap<usize, ArrowType>)>>,
{
    if let Ok(mut stmts) = parser::parse(sql) {
        if let Some(Statement::Query(q)) = stmts.pop() {
            if let Ok((_, types)) = plan_types(*q).await {
                merge(params, types);
            }
        }
    }
}

fn table_of<'a>(catalog: &'a Catalog, name: &str) -> Option<&'a spindle_catalog::Table> {
    let parsed = parser::parse(&format!("SELECT * FROM {name}")).ok()?;
    let name = match parsed.first()? {
        Statement::Query(q) => match q.as_ref() {
            ast::Statement::Query(q) => match q.body.as_ref() {
                ast::SetExpr::Select(s) => match &s.from.first()?.relation {
                    ast::TableFactor::Table { name, .. } => parser::object_name(name).ok()?,
                    _ => return None,
                },
                _ => return None,
            },
            _ => return None,
        },
        _ => return None,
    };
    catalog.table(&name)
}

/// The `$n` that are a LIMIT or OFFSET alone, in any query of `stmt`.
fn row_count_placeholders(stmt: &ast::Statement) -> Vec<usize> {
    use datafusion::sql::sqlparser::ast::{Visit, Visitor};
    struct RowCounts(Vec<usize>);
    impl Visitor for RowCounts {
        type Break = ();
        fn pre_visit_query(&mut self, q: &ast::Query) -> ControlFlow<()> {
            let exprs: Vec<&ast::Expr> = match &q.limit_clause {
                Some(ast::LimitClause::LimitOffset { limit, offset, .. }) => limit
                    .iter()
                    .chain(offset.iter().map(|o| &o.value))
                    .collect(),
                Some(ast::LimitClause::OffsetCommaLimit { offset, limit }) => vec![offset, limit],
                None => Vec::new(),
            };
            self.0
                .extend(exprs.into_iter().filter_map(placeholder_index));
            ControlFlow::Continue(())
        }
    }
    let mut found = RowCounts(Vec::new());
    let _ = stmt.visit(&mut found);
    found.0
}

fn set(params: &mut [Option<ArrowType>], n: usize, ty: Option<ArrowType>) {
    if let (Some(slot), Some(ty)) = (params.get_mut(n - 1), ty) {
        if slot.is_none() {
            *slot = Some(ty);
        }
    }
}

fn merge(params: &mut [Option<ArrowType>], types: HashMap<usize, ArrowType>) {
    for (n, ty) in types {
        set(params, n, Some(ty));
    }
}

/// `$n` → n.
fn placeholder_index(e: &ast::Expr) -> Option<usize> {
    match e {
        ast::Expr::Value(v) => match &v.value {
            ast::Value::Placeholder(p) => p.strip_prefix('$')?.parse().ok().filter(|n| *n >= 1),
            _ => None,
        },
        ast::Expr::Nested(inner) => placeholder_index(inner),
        _ => None,
    }
}

/// Placeholders cast to a Spindle type: (n, Arrow type).
fn cast_placeholders(stmt: &Statement) -> Vec<(usize, ArrowType)> {
    let mut out = Vec::new();
    let mut visit = |e: &ast::Expr| {
        if let ast::Expr::Cast {
            expr, data_type, ..
        } = e
        {
            if let Some(n) = placeholder_index(expr) {
                let sql = data_type.to_string();
                let dialect = datafusion::sql::sqlparser::dialect::PostgreSqlDialect {};
                let parsed = datafusion::sql::sqlparser::parser::Parser::new(&dialect)
                    .try_with_sql(&sql)
                    .ok()
                    .and_then(|mut p| parser::parse_type(&mut p).ok());
                if let Some(t) = parsed {
                    out.push((n, crate::types::arrow_type(&t)));
                }
            }
        }
        ControlFlow::<()>::Continue(())
    };
    match stmt {
        Statement::Insert { insert, .. } => {
            let _ = visit_expressions(insert.as_ref(), &mut visit);
        }
        Statement::Update(u) => {
            let _ = visit_expressions(u.as_ref(), &mut visit);
        }
        Statement::Delete(d) => {
            let _ = visit_expressions(d.as_ref(), &mut visit);
        }
        Statement::Query(q) => {
            let _ = visit_expressions(q.as_ref(), &mut visit);
        }
        _ => {}
    }
    out
}

/// The highest `$n` in a statement (0 without parameters).
pub fn max_placeholder(stmt: &Statement) -> usize {
    let mut max = 0usize;
    let mut visit = |e: &ast::Expr| {
        if let Some(n) = placeholder_index(e) {
            max = max.max(n);
        }
        ControlFlow::<()>::Continue(())
    };
    match stmt {
        Statement::Insert { insert, .. } => {
            let _ = visit_expressions(insert.as_ref(), &mut visit);
        }
        Statement::Update(u) => {
            let _ = visit_expressions(u.as_ref(), &mut visit);
        }
        Statement::Delete(d) => {
            let _ = visit_expressions(d.as_ref(), &mut visit);
        }
        Statement::Query(q) => {
            let _ = visit_expressions(q.as_ref(), &mut visit);
        }
        _ => {}
    }
    max
}

/// Plans `stmt` (a query) with its placeholders: the output schema and the
/// placeholder types DataFusion inferred.
async fn plan(
    engine: &Arc<Engine>,
    catalog: Arc<Catalog>,
    txn: TxnHandle,
    mut stmt: ast::Statement,
) -> Result<(SchemaRef, HashMap<usize, ArrowType>)> {
    let state = engine.df_state(catalog, txn, false)?;
    if let ast::Statement::Query(q) = &mut stmt {
        unique_output_names(&mut q.body);
    }
    spindle_numeric_casts(&mut stmt);
    set_returning_aliases(&mut stmt);
    let plan = state
        .statement_to_plan(DfStatement::Statement(Box::new(stmt)))
        .await?;
    let schema: SchemaRef = Arc::new(plan.schema().as_arrow().clone());
    let schema = crate::session::restore_output_names(&schema).unwrap_or(schema);
    let mut types = HashMap::new();
    for (name, ty) in plan.get_parameter_types()? {
        if let (Some(n), Some(ty)) = (
            name.strip_prefix('$').and_then(|n| n.parse::<usize>().ok()),
            ty,
        ) {
            types.insert(n, ty);
        }
    }
    Ok((schema, types))
}

fn utf8_schema(names: &[String]) -> SchemaRef {
    Arc::new(Schema::new(
        names
            .iter()
            .map(|n| Field::new(n, ArrowType::Utf8, true))
            .collect::<Vec<_>>(),
    ))
}

/// An [`Output::Rows`] of text columns (SHOW's result).
pub fn string_rows(columns: &[String], rows: Vec<Vec<String>>) -> Result<Output> {
    let schema = utf8_schema(columns);
    let arrays: Vec<ArrayRef> = (0..columns.len())
        .map(|i| {
            Arc::new(StringArray::from(
                rows.iter()
                    .map(|r| r.get(i).cloned())
                    .collect::<Vec<Option<String>>>(),
            )) as ArrayRef
        })
        .collect();
    let batch = RecordBatch::try_new(schema.clone(), arrays)
        .map_err(|e| Error::Internal(format!("SHOW result: {e}")))?;
    Ok(Output::Rows {
        schema,
        batches: vec![batch],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn run(session: &mut crate::session::Session, sql: &str) {
        session.execute(sql, &[]).await.unwrap();
    }

    fn column_names(d: &Description) -> Vec<String> {
        d.columns
            .as_ref()
            .map(|s| s.fields().iter().map(|f| f.name().clone()).collect())
            .unwrap_or_default()
    }

    /// A text is described once per catalog: again under the same schema
    /// it is the kept description; after a schema change, in a transaction
    /// that changed the schema, and after that transaction rolled back, it
    /// is described anew against the catalog in force.
    #[tokio::test]
    async fn a_description_is_kept_per_catalog() {
        let engine = Engine::open(None).unwrap();
        let mut s = engine.session();
        run(&mut s, "CREATE TABLE t (id bigint PRIMARY KEY, v text)").await;
        let sql = "SELECT * FROM t WHERE id = $1";
        let first = s.describe(sql).await.unwrap();
        assert_eq!(column_names(&first), ["id", "v"]);
        assert_eq!(first.params, [Some(ArrowType::Int64)]);
        let again = engine.session().describe(sql).await.unwrap();
        assert!(
            Arc::ptr_eq(&first, &again),
            "described twice under one schema"
        );

        run(&mut s, "ALTER TABLE t ADD COLUMN w double precision").await;
        let altered = s.describe(sql).await.unwrap();
        assert_eq!(column_names(&altered), ["id", "v", "w"]);

        // A transaction's own schema change is seen in it, and only there.
        run(&mut s, "BEGIN").await;
        run(&mut s, "DROP TABLE t").await;
        run(&mut s, "CREATE TABLE t (id text PRIMARY KEY, z bigint)").await;
        let inside = s.describe(sql).await.unwrap();
        assert_eq!(column_names(&inside), ["id", "z"]);
        assert_eq!(inside.params, [Some(ArrowType::Utf8)]);
        let outside = engine.session().describe(sql).await.unwrap();
        assert_eq!(column_names(&outside), ["id", "v", "w"]);
        run(&mut s, "ROLLBACK").await;
        let after = s.describe(sql).await.unwrap();
        assert_eq!(column_names(&after), ["id", "v", "w"]);
        assert_eq!(after.params, [Some(ArrowType::Int64)]);

        run(&mut s, "DROP TABLE t").await;
        assert!(s.describe(sql).await.is_err(), "described a dropped table");
    }

    /// Errors are never kept: a text that failed to describe is described
    /// again once its table exists; several statements are refused.
    #[tokio::test]
    async fn a_failed_description_is_not_kept() {
        let engine = Engine::open(None).unwrap();
        let mut s = engine.session();
        let sql = "SELECT n FROM later WHERE n > $1";
        assert!(s.describe(sql).await.is_err());
        run(&mut s, "CREATE TABLE later (n bigint PRIMARY KEY)").await;
        let d = s.describe(sql).await.unwrap();
        assert_eq!(column_names(&d), ["n"]);
        assert_eq!(d.params, [Some(ArrowType::Int64)]);
        let err = s.describe("SELECT 1; SELECT 2").await.unwrap_err();
        assert!(err.to_string().contains("multiple commands"), "{err}");
        let empty = s.describe("").await.unwrap();
        assert!(empty.params.is_empty() && empty.columns.is_none());
    }

    /// A LIMIT or OFFSET parameter is a BIGINT (PostgreSQL's type), in a
    /// subquery too; a cast declares another.
    #[tokio::test]
    async fn row_count_parameters_are_bigints() {
        let engine = Engine::open(None).unwrap();
        let mut s = engine.session();
        run(&mut s, "CREATE TABLE rc (k text PRIMARY KEY, n bigint)").await;
        let d = s
            .describe("SELECT n FROM rc WHERE k = $1 LIMIT $2 OFFSET $3")
            .await
            .unwrap();
        assert_eq!(
            d.params,
            [
                Some(ArrowType::Utf8),
                Some(ArrowType::Int64),
                Some(ArrowType::Int64)
            ]
        );
        let d = s
            .describe("SELECT count(*) FROM (SELECT n FROM rc ORDER BY n LIMIT $1) AS s")
            .await
            .unwrap();
        assert_eq!(d.params, [Some(ArrowType::Int64)]);
    }
}
