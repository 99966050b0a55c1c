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

/// The literal expression for `v`: the expression [`literal_sql`]'s text
/// parses to. The common kinds are built directly (parsing was a visible
/// share of a prepared point select); a unit test checks they equal the
/// parsed form.
pub fn literal_expr(v: &Value) -> Result<ast::Expr> {
    fn value(v: ast::Value) -> ast::Expr {
        ast::Expr::Value(v.into())
    }
    fn cast(expr: ast::Expr, data_type: ast::DataType) -> ast::Expr {
        ast::Expr::Cast {
            kind: ast::CastKind::Cast,
            expr: Box::new(expr),
            data_type,
            array: false,
            format: None,
        }
    }
    match v {
        Value::Null => return Ok(value(ast::Value::Null)),
        Value::Bool(b) => return Ok(value(ast::Value::Boolean(*b))),
        Value::String(s) => return Ok(value(ast::Value::SingleQuotedString(s.clone()))),
        Value::Int64(i) => {
            let magnitude = value(ast::Value::Number(i.unsigned_abs().to_string(), false));
            let expr = if *i < 0 {
                ast::Expr::UnaryOp {
                    op: ast::UnaryOperator::Minus,
                    expr: Box::new(magnitude),
                }
            } else {
                magnitude
            };
            return Ok(cast(expr, ast::DataType::BigInt(None)));
        }
        _ => {}
    }
    parse_literal(v)
}

/// [`literal_expr`] by parsing [`literal_sql`].
fn parse_literal(v: &Value) -> Result<ast::Expr> {
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
    fn built_literals_equal_parsed_ones() {
        let mut values = vec![
            Value::Null,
            Value::Bool(true),
            Value::Bool(false),
            Value::String(String::new()),
            Value::String("it's \\ a \"test\" ünï 🦀 $1 --".into()),
        ];
        for i in [0, 1, -1, 42, -42, i64::MAX, i64::MIN, i64::MIN + 1] {
            values.push(Value::Int64(i));
        }
        for v in values {
            let built = literal_expr(&v).unwrap();
            let parsed = parse_literal(&v).unwrap();
            assert_eq!(built, parsed, "{v:?}");
            assert_eq!(built.to_string(), parsed.to_string(), "{v:?}");
            assert_eq!(crate::dml::literal_value(&built), Some(v.clone()), "{v:?}");
        }
    }

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
