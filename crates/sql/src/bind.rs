//! Positional parameters: `$1`, `$2`, … are replaced by literal
//! expressions of the given values before planning, so every statement
//! kind (DDL defaults excepted) takes parameters the same way.

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{self, visit_expressions_mut};
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::parser::Parser;
use spindle_keys::value::format_numeric;
use spindle_keys::Value;

use crate::error::{Error, Result};
use crate::parser::Statement;
use crate::types::{format_date, format_timestamp};

/// The SQL text of a literal that evaluates to `v` with its type.
pub fn literal_sql(v: &Value) -> String {
    fn quote(s: &str) -> String {
        format!("'{}'", s.replace('\'', "''"))
    }
    match v {
        Value::Null => "NULL".into(),
        Value::Int64(i) => format!("CAST({i} AS BIGINT)"),
        Value::Float64(f) if f.is_finite() => format!("CAST({f:e} AS DOUBLE PRECISION)"),
        Value::Float64(f) => format!(
            "CAST('{}' AS DOUBLE PRECISION)",
            crate::types::format_float(*f)
        ),
        Value::Bool(b) => b.to_string(),
        Value::String(s) => quote(s),
        Value::Json(s) => quote(s),
        Value::Bytes(b) => {
            let hex: String = b.iter().map(|x| format!("{x:02X}")).collect();
            format!("X'{hex}'")
        }
        Value::Date(d) => format!("CAST({} AS DATE)", quote(&format_date(*d))),
        Value::Timestamp(t) => format!("CAST({} AS TIMESTAMPTZ)", quote(&format_timestamp(*t))),
        Value::Numeric(n) => format!("CAST({} AS DECIMAL(38, 9))", quote(&format_numeric(*n))),
    }
}

/// The literal expression for `v`.
pub fn literal_expr(v: &Value) -> Result<ast::Expr> {
    let sql = literal_sql(v);
    Parser::new(&PostgreSqlDialect {})
        .try_with_sql(&sql)
        .and_then(|mut p| p.parse_expr())
        .map_err(|e| Error::Internal(format!("literal {sql}: {e}")))
}

fn bind_expr(expr: &mut ast::Expr, params: &[ast::Expr]) -> ControlFlow<Error> {
    if let ast::Expr::Value(v) = expr {
        if let ast::Value::Placeholder(p) = &v.value {
            let idx = p.strip_prefix('$').and_then(|n| n.parse::<usize>().ok());
            match idx {
                Some(i) if i >= 1 && i <= params.len() => *expr = params[i - 1].clone(),
                _ => {
                    return ControlFlow::Break(Error::UndefinedParameter(format!(
                        "there is no parameter {p}"
                    )))
                }
            }
        }
    }
    ControlFlow::Continue(())
}

fn bind_one<V: ast::VisitMut>(node: &mut V, params: &[ast::Expr]) -> Result<()> {
    match visit_expressions_mut(node, |e| bind_expr(e, params)) {
        ControlFlow::Break(e) => Err(e),
        ControlFlow::Continue(()) => Ok(()),
    }
}

/// Replaces placeholders in `stmts` by `params`. With parameters, exactly
/// one statement is allowed (as in PostgreSQL's extended protocol).
pub fn bind_params(mut stmts: Vec<Statement>, params: &[Value]) -> Result<Vec<Statement>> {
    let exprs: Vec<ast::Expr> = params.iter().map(literal_expr).collect::<Result<_>>()?;
    if !params.is_empty() && stmts.len() > 1 {
        return Err(Error::Syntax(
            "cannot insert multiple commands into a statement with parameters".into(),
        ));
    }
    for stmt in &mut stmts {
        match stmt {
            Statement::Insert { insert, .. } => bind_one(insert.as_mut(), &exprs)?,
            Statement::Update(u) => bind_one(u.as_mut(), &exprs)?,
            Statement::Delete(d) => bind_one(d.as_mut(), &exprs)?,
            Statement::Query(q) => bind_one(q.as_mut(), &exprs)?,
            _ => {}
        }
    }
    Ok(stmts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_replaced_and_missing_ones_rejected() {
        let stmts = crate::parser::parse("SELECT $1, $2").unwrap();
        let bound = bind_params(stmts, &[Value::Int64(7), Value::String("it's".into())]).unwrap();
        match &bound[0] {
            Statement::Query(q) => assert_eq!(q.to_string(), "SELECT CAST(7 AS BIGINT), 'it''s'"),
            _ => panic!(),
        }
        let stmts = crate::parser::parse("SELECT $3").unwrap();
        let err = bind_params(stmts, &[Value::Int64(1)]).unwrap_err();
        assert_eq!(err.sqlstate(), "42P02");
    }
}
