//! The fast path: statements that touch one row by its full primary key run
//! straight against the transaction, without DataFusion planning (which
//! costs far more than the point read itself).
//!
//! ```text
//! SELECT a, b AS x FROM t [AS q] WHERE k1 = 1 AND k2 = 'x'   → Transaction::get(key)
//! UPDATE t SET a = a + 1, b = $2 WHERE k1 = $1 AND k2 = …    → get, compute, put_row
//! DELETE FROM t WHERE k1 = … AND k2 = …                      → the row tree by key
//! INSERT INTO t VALUES (1, 'x'), ($1, $2)                    → no query at all (dml.rs)
//! ```
//!
//! The contract: a statement takes the fast path only if the result is the
//! one DataFusion would give, and the read recorded for validation covers
//! what the result depends on (the point read of the row's key). Anything
//! the matcher does not recognise exactly — other predicates, expressions,
//! joins, ORDER BY, hints, key values whose type differs from the key
//! column's, FLOAT64 keys (where `-0 = 0`) — goes the general way. The
//! matching is an AST walk; bound parameters arrive as the literals
//! [`crate::bind`] writes, which [`crate::dml::literal_value`] reads back.

use std::sync::Arc;

use datafusion::arrow::datatypes::{Field, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::sql::sqlparser::ast;
use spindle_catalog::{Catalog, Table};
use spindle_keys::{DataType, Value};

use crate::dml::literal_value;
use crate::error::{Error, Result};
use crate::parser::fold_ident;
use crate::session::{Output, StatementContext};
use crate::types::{build_array, table_schema};

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
fn same_key_type(v: &Value, t: &DataType) -> bool {
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
/// exactly once with a literal of the column's type, and nothing else.
pub(crate) fn match_key(
    table: &Table,
    qualifiers: &[String],
    selection: Option<&ast::Expr>,
) -> Option<KeyMatch> {
    fn conjuncts<'e>(e: &'e ast::Expr, out: &mut Vec<&'e ast::Expr>) {
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
    let mut parts = Vec::new();
    conjuncts(selection?, &mut parts);
    if parts.len() != table.primary_key.len() {
        return None;
    }
    let mut key: Vec<Option<Value>> = vec![None; table.primary_key.len()];
    let mut nothing = false;
    for p in parts {
        let ast::Expr::BinaryOp {
            left,
            op: ast::BinaryOperator::Eq,
            right,
        } = p
        else {
            return None;
        };
        let (col, lit) = match (
            column_ref(table, qualifiers, left),
            column_ref(table, qualifiers, right),
        ) {
            (Some(c), None) => (c, right),
            (None, Some(c)) => (c, left),
            _ => return None,
        };
        let column = &table.columns[col];
        let pos = table
            .primary_key
            .iter()
            .position(|k| k.name == column.name)?;
        if key[pos].is_some() {
            return None;
        }
        let v = literal_value(lit)?;
        if v.is_null() {
            nothing = true;
        } else if !same_key_type(&v, &column.data_type) {
            return None;
        }
        key[pos] = Some(v);
    }
    if nothing {
        return Some(KeyMatch::Nothing);
    }
    key.into_iter()
        .collect::<Option<Vec<Value>>>()
        .map(KeyMatch::Point)
}

/// `SELECT cols FROM t WHERE <full key>`: the result, or `None` if the
/// query is not of that form.
pub(crate) fn point_select(
    ctx: &StatementContext,
    stmt: &ast::Statement,
) -> Result<Option<Output>> {
    let ast::Statement::Query(q) = stmt else {
        return Ok(None);
    };
    let ast::SetExpr::Select(s) = q.body.as_ref() else {
        return Ok(None);
    };
    let ([from], Some(selection)) = (s.from.as_slice(), s.selection.as_ref()) else {
        return Ok(None);
    };
    // No clause besides SELECT … FROM … WHERE, in the query or the select
    // (ORDER BY, LIMIT, DISTINCT, GROUP BY, WITH, locking, …).
    let items: Vec<String> = s.projection.iter().map(|p| p.to_string()).collect();
    let canonical = format!("SELECT {} FROM {from} WHERE {selection}", items.join(", "));
    if s.to_string() != canonical || q.to_string() != canonical {
        return Ok(None);
    }
    let catalog = ctx.catalog()?;
    let Some((table, qualifiers)) = single_table(&catalog, from) else {
        return Ok(None);
    };
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
                let Some(i) = column_ref(table, &qualifiers, e) else {
                    return Ok(None);
                };
                out.push((i, table.columns[i].name.clone()));
            }
            ast::SelectItem::ExprWithAlias { expr, alias } => {
                let Some(i) = column_ref(table, &qualifiers, expr) else {
                    return Ok(None);
                };
                out.push((i, fold_ident(alias)));
            }
            _ => return Ok(None),
        }
    }
    // Repeated output names get suffixes on the general path.
    let mut names: Vec<&str> = out.iter().map(|(_, n)| n.as_str()).collect();
    names.sort_unstable();
    if names.windows(2).any(|w| w[0] == w[1]) {
        return Ok(None);
    }
    let key_vals = match match_key(table, &qualifiers, Some(selection)) {
        None => return Ok(None),
        Some(KeyMatch::Nothing) => None,
        Some(KeyMatch::Point(v)) => Some(v),
    };
    let full = table_schema(table, true);
    let fields: Vec<Field> = out
        .iter()
        .map(|(i, name)| {
            let f = full.field(*i);
            f.as_ref().clone().with_name(name)
        })
        .collect();
    let schema = Arc::new(Schema::new(fields));
    let row = match key_vals {
        None => None,
        Some(kv) => {
            let Ok(key) = catalog.encode_key(&table.name, &kv) else {
                return Ok(None);
            };
            let stored = crate::blocking(|| ctx.lock()?.get(&key).map_err(Error::from))?;
            match stored {
                None => None,
                Some(v) => Some(crate::dml::stored_row(table, &kv, &v)?),
            }
        }
    };
    let batches = match row {
        None => Vec::new(),
        Some(row) => {
            let arrays = out
                .iter()
                .map(|(i, _)| build_array(&table.columns[*i].data_type, &[&row[*i]]))
                .collect::<Result<Vec<_>>>()?;
            vec![RecordBatch::try_new(schema.clone(), arrays)
                .map_err(|e| Error::Internal(format!("point select batch: {e}")))?]
        }
    };
    Ok(Some(Output::Rows { schema, batches }))
}

/// Evaluates an UPDATE's SET value over the row's current values, for the
/// forms the fast path knows: a literal, a column, and `col ± literal` /
/// `literal + col` on INT64 (with PostgreSQL's overflow error). `None`
/// sends the statement the general way.
pub(crate) fn eval_set(
    table: &Table,
    qualifiers: &[String],
    row: &[Value],
    e: &ast::Expr,
) -> Option<Result<Value>> {
    if let Some(v) = literal_value(e) {
        return Some(Ok(v));
    }
    if let Some(i) = column_ref(table, qualifiers, e) {
        return Some(Ok(row[i].clone()));
    }
    let ast::Expr::BinaryOp { left, op, right } = e else {
        if let ast::Expr::Nested(inner) = e {
            return eval_set(table, qualifiers, row, inner);
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
    let rhs = match literal_value(lit)? {
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
