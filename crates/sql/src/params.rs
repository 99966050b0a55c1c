//! Kept plans of queries with parameters: a prepared query is planned
//! once with its `$n` in place and run again for each execution's values.
//!
//! The fast path ([`crate::fastpath`]) runs the simplest shapes without
//! DataFusion; every other query used to be planned again per execution
//! with its values written in as literals (`crate::bind`), and kept
//! ([`crate::query_cache`]) under that bound text, which a query sent
//! with other values never matched. Planning with DataFusion is most of
//! such a query's time: 1.3–2.4 ms for a top-3 by customer, a join or an
//! aggregate over one row tree (bench/README.md, session 42).
//!
//! ```text
//! prepared query + values ─▶ template kept for (text, catalog)? ── declined ─▶ bind literals, plan
//!                                   │ no                     │ kept
//!                                   ▼                        ▼
//!        plan the text with its placeholders       values converted to the
//!        (scans: stand-in values, unbound)         placeholders' types ── no ─▶ bind literals
//!        placeholders only in scans' filters?                │
//!        ── no: declined ──┐   yes: kept                     ▼
//!                          ▼                     every scan planned again with the
//!                   bind literals, plan          values; same decisions? ── no ─▶ bind literals
//!                                                            │ yes
//!                                                            ▼
//!                                                   run (query_cache::rebind)
//! ```
//!
//! A query sent with its values inline (the simple protocol: psql,
//! `pgbench -M simple`, many ORMs) runs the template of its parameterized
//! form (`crate::normalize`) from that form's second execution on
//! (`Session::with_templates`; [`crate::query_cache::Template::Seen`]
//! after the first, so that a query typed once is not planned twice);
//! when the template does not run, the text runs as sent. `SET
//! plan_cache_mode = force_custom_plan` turns templates off (PostgreSQL's
//! name; its `force_generic_plan` is `auto` here).
//!
//! Invariants:
//! * A template is kept only when, after DataFusion's optimizer, every
//!   placeholder sits in a table scan's filters ([`only_in_scans`]): that
//!   is where Spindle's scan ([`crate::provider::SpindleScanExec`]) plans
//!   key ranges, access path and row filter from them, and where it can
//!   plan them again for other values. A placeholder anywhere else (a
//!   filter DataFusion applies itself, a projection, a LIMIT) would be
//!   baked into DataFusion's own operators: such a text is declined and
//!   planned per execution as before. Each `$1 … $n` must still be in a
//!   scan after optimization (one the optimizer dropped as constant, an
//!   `ORDER BY $1`, would leave a plan that does not do what the text
//!   says).
//! * DataFusion drops the filters a scan reports exact. For a template a
//!   filter is exact where the ranges of the access path chosen without
//!   the projection enforce it, an index's included
//!   (`TableShape::template_pushdown`); DataFusion asks again about the
//!   filters it kept, and a smaller set may choose another path, so every
//!   filter ever reported exact is recorded (`SpindleTable::claimed`) and
//!   the scan declines the template unless its final path enforces each.
//! * While the template is planned, each placeholder stands in as a
//!   distinct value of its type ([`with_stand_ins`]), so that the scan
//!   decides as it would for real values: which filters its ranges
//!   enforce (DataFusion drops those as exact), the access path, whether
//!   it may split. Each execution plans every scan again with its values
//!   and uses the kept plan only if every one of those decisions is the
//!   same ([`crate::provider::ScanSignature`]); values that decide
//!   otherwise (a NULL, which no range holds; equal values in an IN list)
//!   take the literal path. So a kept template runs exactly the plan the
//!   literal path would have made, with the same decisions at its scans.
//! * A value is used only with the type DataFusion inferred for its
//!   placeholder ([`value_for`]); any other pairing (text for a number,
//!   an integer for a float) takes the literal path, whose casts and
//!   errors stay the reference.
//! * Everything `query_cache` promises for kept plans holds: the same
//!   catalog, immutable functions only, Spindle scans as the only leaves,
//!   nothing of the planning transaction kept (a template's scans are
//!   never bound to it).

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, TimeUnit};
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::ScalarValue;
use datafusion::logical_expr::{Expr, LogicalPlan};
use spindle_keys::Value;

/// Whether any of `filters` holds a placeholder.
pub(crate) fn any_placeholder(filters: &[Expr]) -> bool {
    filters.iter().any(has_placeholder)
}

fn has_placeholder(e: &Expr) -> bool {
    e.exists(|e| Ok(matches!(e, Expr::Placeholder(_))))
        .unwrap_or(true)
}

/// The 0-based position of placeholder `$n`.
fn position(id: &str) -> Option<usize> {
    id.strip_prefix('$')?.parse::<usize>().ok()?.checked_sub(1)
}

/// `filters` with each typed placeholder replaced by a value of its type
/// that no other placeholder gets (a placeholder of a type without stand-ins
/// stays, and the scan treats it as it treats any expression it cannot
/// read as a key bound).
pub(crate) fn with_stand_ins(filters: &[Expr]) -> datafusion::error::Result<Vec<Expr>> {
    replace(filters, |id, ty| stand_in(position(id)?, ty?))
}

/// `filters` with placeholder `$n` replaced by `params[n - 1]`.
pub(crate) fn with_values(
    filters: &[Expr],
    params: &[ScalarValue],
) -> datafusion::error::Result<Vec<Expr>> {
    let out = replace(filters, |id, _| params.get(position(id)?).cloned())?;
    if any_placeholder(&out) {
        return Err(datafusion::error::DataFusionError::Internal(
            "a kept plan's scan names a parameter it was not given".into(),
        ));
    }
    Ok(out)
}

fn replace(
    filters: &[Expr],
    value: impl Fn(&str, Option<&DataType>) -> Option<ScalarValue>,
) -> datafusion::error::Result<Vec<Expr>> {
    filters
        .iter()
        .map(|f| {
            f.clone()
                .transform_up(|e| {
                    Ok(match &e {
                        Expr::Placeholder(p) => {
                            let ty = p.field.as_ref().map(|f| f.data_type());
                            match value(&p.id, ty) {
                                Some(v) => Transformed::yes(Expr::Literal(v, None)),
                                None => Transformed::no(e),
                            }
                        }
                        _ => Transformed::no(e),
                    })
                })
                .map(|t| t.data)
        })
        .collect()
}

/// A value of type `ty` for the `i`-th placeholder, distinct from every
/// other placeholder's of that type, and far from values keys usually
/// hold (a stand-in equal to a literal beside it in an IN list would
/// make one point of two: the signature check then sends every
/// execution to the literal path, which is correct, only slower).
fn stand_in(i: usize, ty: &DataType) -> Option<ScalarValue> {
    let n = i64::try_from(i).ok()?;
    Some(match ty {
        DataType::Int64 => ScalarValue::Int64(Some(i64::MIN / 3 + n)),
        DataType::Float64 => ScalarValue::Float64(Some(-1.0e300 + 1.0e285 * n as f64)),
        DataType::Utf8 => ScalarValue::Utf8(Some(format!("\u{1}spindle-param-{i}"))),
        DataType::Utf8View => ScalarValue::Utf8View(Some(format!("\u{1}spindle-param-{i}"))),
        DataType::Date32 => ScalarValue::Date32(Some(i32::MIN / 3 + i32::try_from(i).ok()?)),
        DataType::Timestamp(TimeUnit::Microsecond, tz) => {
            ScalarValue::TimestampMicrosecond(Some(i64::MIN / 3 + n), tz.clone())
        }
        DataType::Boolean => ScalarValue::Boolean(Some(i.is_multiple_of(2))),
        _ => return None,
    })
}

/// The value of a parameter as a scalar of `ty`, the type DataFusion
/// inferred for its placeholder; `None` for any other pairing.
pub(crate) fn value_for(v: &Value, ty: &DataType) -> Option<ScalarValue> {
    Some(match (v, ty) {
        (Value::Null, ty) => ScalarValue::try_from(ty).ok()?,
        (Value::Int64(i), DataType::Int64) => ScalarValue::Int64(Some(*i)),
        (Value::Float64(f), DataType::Float64) => ScalarValue::Float64(Some(*f)),
        (Value::String(s), DataType::Utf8) => ScalarValue::Utf8(Some(s.clone())),
        (Value::String(s), DataType::Utf8View) => ScalarValue::Utf8View(Some(s.clone())),
        (Value::Bool(b), DataType::Boolean) => ScalarValue::Boolean(Some(*b)),
        (Value::Date(d), DataType::Date32) => ScalarValue::Date32(Some(*d)),
        (Value::Timestamp(t), DataType::Timestamp(TimeUnit::Microsecond, tz)) => {
            ScalarValue::TimestampMicrosecond(Some(*t), tz.clone())
        }
        _ => return None,
    })
}

/// The types of `plan`'s placeholders `$1 … $n`, when there are exactly
/// `n` and each has a type.
pub(crate) fn param_types(plan: &LogicalPlan, n: usize) -> Option<Vec<DataType>> {
    let found = plan.get_parameter_types().ok()?;
    if found.len() != n {
        return None;
    }
    let mut types = vec![None; n];
    for (id, ty) in found {
        let slot = types.get_mut(position(&id)?)?;
        *slot = Some(ty?);
    }
    types.into_iter().collect()
}

/// Whether every placeholder of `plan` (an optimized plan) is in a table
/// scan's filters, where a Spindle scan plans it, and each of `$1 … $n`
/// is still there: the optimizer may drop an expression it finds
/// constant (`ORDER BY $1`, from `ORDER BY 1` sent inline), and the plan
/// would then not do what the text says.
pub(crate) fn only_in_scans(plan: &LogicalPlan, n: usize) -> bool {
    let mut elsewhere = false;
    let mut in_scans = vec![false; n];
    let walk = plan.apply_with_subqueries(|node| {
        let scan = matches!(node, LogicalPlan::TableScan(_));
        node.apply_expressions(|e| {
            e.apply(|e| {
                if let Expr::Placeholder(p) = e {
                    match (scan, position(&p.id).and_then(|i| in_scans.get_mut(i))) {
                        (true, Some(seen)) => *seen = true,
                        _ => {
                            elsewhere = true;
                            return Ok(TreeNodeRecursion::Stop);
                        }
                    }
                }
                Ok(TreeNodeRecursion::Continue)
            })
        })?;
        Ok(if elsewhere {
            TreeNodeRecursion::Stop
        } else {
            TreeNodeRecursion::Continue
        })
    });
    !elsewhere && walk.is_ok() && in_scans.iter().all(|s| *s)
}

/// The parameters of an execution as the template's scans take them, or
/// `None` when one does not have its placeholder's type.
pub(crate) fn scalars(params: &[Value], types: &[DataType]) -> Option<Arc<[ScalarValue]>> {
    if params.len() != types.len() {
        return None;
    }
    params
        .iter()
        .zip(types)
        .map(|(v, ty)| value_for(v, ty))
        .collect()
}
