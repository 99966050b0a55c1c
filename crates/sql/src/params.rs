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
//!        (scans: stand-in values, unbound;         placeholders' types ── no ─▶ bind literals
//!        filters, projections: slots)                        │
//!        placeholders only in scans and slots?               ▼
//!        ── no: declined ──┐   yes: kept         every scan planned again with the
//!                          ▼                     values; same decisions? ── no ─▶ bind literals
//!                   bind literals, plan                      │ yes
//!                                                            ▼
//!                                       slots filled, run (query_cache::rebind_with)
//! ```
//!
//! A query sent with its values inline (the simple protocol: psql,
//! `pgbench -M simple`, many ORMs) runs the template of its parameterized
//! form (`crate::normalize`) from that form's second execution on
//! (`Session::with_templates`; [`crate::query_cache::Template::Seen`]
//! after the first, so that a query typed once is not planned twice);
//! when the template does not run, the text runs as sent. A prepared
//! query's row count (`… WHERE id = $1 LIMIT $2`, as ORMs send it) is
//! written into its text ([`inline_row_counts`]): the template of that
//! count runs. `SET
//! plan_cache_mode = force_custom_plan` turns templates off (PostgreSQL's
//! name; its `force_generic_plan` is `auto` here).
//!
//! Invariants:
//! * A template is kept only when, after DataFusion's optimizer, every
//!   placeholder sits in a table scan's filters or in a [`Slot`]
//!   ([`only_in_scans`]). A scan ([`crate::provider::SpindleScanExec`])
//!   plans key ranges, access path and row filter from its placeholders,
//!   and plans them again for other values. A placeholder in a filter
//!   DataFusion applies itself or in a projection (`V > $2` next to a key
//!   condition, a `HAVING`, `amount * $1`) becomes a slot once the
//!   optimizer is done ([`into_slots`]), which each execution fills with
//!   its value in a new `FilterExec` or `ProjectionExec`
//!   ([`fill_slots`]); the physical plan must hold slots nowhere else
//!   ([`slots_where_filled`]). A placeholder anywhere else (a LIMIT, a
//!   sort key, a join condition) would be baked into DataFusion's own
//!   operators: such a text is declined and planned per execution as
//!   before. Each `$1 … $n` must still be in a scan or a slot after
//!   optimization (one the optimizer dropped as constant, an `ORDER BY
//!   $1`, would leave a plan that does not do what the text says).
//! * DataFusion drops the filters a scan reports exact. For a template a
//!   filter is exact where the ranges of the access path chosen without
//!   the projection enforce it, an index's included
//!   (`TableShape::template_pushdown`). DataFusion asks again about the
//!   filters it kept, and a smaller set may choose another path: the path
//!   is chosen for every filter asked about so far
//!   (`SpindleTable::asked`), every filter ever reported exact is
//!   recorded (`SpindleTable::claimed`), and the scan declines the
//!   template unless its final path enforces each.
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
//! * A constant expression of placeholders (`k = $1 + 1`, `$1 * 2`, a
//!   cast or an immutable function of them) reaches a scan unfolded, as
//!   the optimizer cannot fold it: it is folded with the stand-ins when
//!   the template is planned and with each execution's values before the
//!   scan plans again ([`replace`]), so that it bounds the key as the
//!   literal path's folded value would. Its INT64 `+ - *`, and those of
//!   slots, run checked (22003 on overflow, as the literal path's); one
//!   that fails to evaluate stays unfolded, so the scan decides otherwise
//!   and the execution takes the literal path, which reports the error.
//! * A value is used only with the type DataFusion inferred for its
//!   placeholder ([`value_for`]); any other pairing (text for a number,
//!   an integer for a float) takes the literal path, whose casts and
//!   errors stay the reference.
//! * Everything `query_cache` promises for kept plans holds: the same
//!   catalog, immutable functions only, Spindle scans as the only leaves,
//!   nothing of the planning transaction kept (a template's scans are
//!   never bound to it).

use std::sync::Arc;

use datafusion::arrow::datatypes::Schema;
use datafusion::arrow::datatypes::{DataType, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::ScalarValue;
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::simplify::SimplifyContext;
use datafusion::logical_expr::{
    ColumnarValue, Expr, LogicalPlan, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    Volatility,
};
use datafusion::optimizer::simplify_expressions::ExprSimplifier;
use datafusion::physical_expr::{PhysicalExpr, ScalarFunctionExpr};
use datafusion::physical_plan::filter::{FilterExec, FilterExecBuilder};
use datafusion::physical_plan::projection::{ProjectionExec, ProjectionExpr};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::sql::sqlparser::ast;
use spindle_keys::Value;

/// Whether any of `filters` holds a placeholder.
pub(crate) fn any_placeholder(filters: &[Expr]) -> bool {
    filters.iter().any(has_placeholder)
}

pub(crate) fn has_placeholder(e: &Expr) -> bool {
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
    let substitute = |e: Expr| {
        e.transform_up(|e| {
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
    };
    filters
        .iter()
        .map(|f| {
            f.clone()
                .transform_down(|e| {
                    if !is_parameter_constant(&e) {
                        return Ok(Transformed::no(e));
                    }
                    // The whole constant, folded once its values are in
                    // (INT64 arithmetic checked, as the literal path's):
                    // nothing below it is left to visit.
                    let checked = crate::checked::checked_parameter_arithmetic(
                        e,
                        &datafusion::common::DFSchema::empty(),
                    )?;
                    let folded = fold(substitute(checked)?);
                    Ok(Transformed::new(folded, true, TreeNodeRecursion::Jump))
                })
                .map(|t| t.data)
        })
        .collect()
}

/// Whether `e` is a constant once its placeholders have values: a
/// placeholder, or an expression of placeholders and literals by
/// operators, casts and immutable functions that holds a placeholder.
/// (The optimizer folded every such expression of literals alone before
/// the scan saw its filters; one of parameters it could not, so `k = $1 +
/// 1` reached the scan as no key bound and a kept plan read the whole
/// table for it.)
fn is_parameter_constant(e: &Expr) -> bool {
    let mut placeholder = false;
    let mut constant = true;
    let _ = e.apply(|e| {
        match e {
            Expr::Placeholder(_) => placeholder = true,
            Expr::Literal(..)
            | Expr::BinaryExpr(_)
            | Expr::Cast(_)
            | Expr::TryCast(_)
            | Expr::Negative(_)
            | Expr::Not(_)
            | Expr::IsNull(_)
            | Expr::IsNotNull(_) => {}
            Expr::ScalarFunction(f) if f.func.signature().volatility == Volatility::Immutable => {}
            _ => constant = false,
        }
        Ok(if constant {
            TreeNodeRecursion::Continue
        } else {
            TreeNodeRecursion::Stop
        })
    });
    placeholder && constant
}

/// `e` (a [`is_parameter_constant`] expression with its values in) as one
/// literal; `e` itself when a placeholder had no value or the evaluation
/// fails (an overflow, a division by zero: the scan then treats it as any
/// expression it cannot read as a key bound, as before, and the literal
/// path reports the error).
fn fold(e: Expr) -> Expr {
    if matches!(e, Expr::Literal(..)) || has_placeholder(&e) {
        return e;
    }
    let simplifier = ExprSimplifier::new(SimplifyContext::default());
    match simplifier.simplify(e.clone()) {
        Ok(folded @ Expr::Literal(..)) => folded,
        _ => e,
    }
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
        // An integer next to a float column (`amount > 2` sent inline):
        // DataFusion casts such a literal to FLOAT64, exactly when the
        // integer has no more than 53 significant bits.
        (Value::Int64(i), DataType::Float64) if i.unsigned_abs() <= 1 << 53 => {
            ScalarValue::Float64(Some(*i as f64))
        }
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

/// Whether every placeholder of `plan` (an optimized plan, its filters'
/// and projections' placeholders made [`Slot`]s) is in a table scan's
/// filters, where a Spindle scan plans it, and each of `$1 … $n` is still
/// there or in a slot: the optimizer may drop an expression it finds
/// constant (`ORDER BY $1`, from `ORDER BY 1` sent inline), and the plan
/// would then not do what the text says.
pub(crate) fn only_in_scans(plan: &LogicalPlan, n: usize) -> bool {
    let mut elsewhere = false;
    let mut in_scans = vec![false; n];
    let walk = plan.apply_with_subqueries(|node| {
        let scan = matches!(node, LogicalPlan::TableScan(_));
        node.apply_expressions(|e| {
            e.apply(|e| {
                if let Some(seen) = logical_slot_index(e).and_then(|i| in_scans.get_mut(i)) {
                    *seen = true;
                }
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

/// A parameter's place in an expression DataFusion evaluates itself: a
/// filter it applies to a scan's rows (`a = $1 AND note LIKE $2`: the
/// scan plans `a = $1` as a key bound, DataFusion tests the `LIKE`), a
/// `HAVING`, a projection (`amount * $1`).
///
/// After the logical optimizer has run (so that no rule folds or moves
/// it), each placeholder in a `Filter`'s predicate or a `Projection`'s
/// expressions becomes a call of a slot ([`into_slots`]): DataFusion
/// plans it as a function of no arguments of the placeholder's type. Each
/// execution replaces every slot with its value as a literal
/// ([`fill_slots`]) in a new `FilterExec` or `ProjectionExec`, the only
/// nodes a template may hold slots in ([`slots_where_filled`]). A slot
/// that ran would fail (`invoke_with_args`) rather than answer anything.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Slot {
    /// The 0-based position of the parameter.
    index: usize,
    ty: DataType,
    signature: Signature,
}

impl ScalarUDFImpl for Slot {
    fn name(&self) -> &str {
        "spindle_param"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> datafusion::error::Result<DataType> {
        Ok(self.ty.clone())
    }

    fn invoke_with_args(
        &self,
        _args: ScalarFunctionArgs,
    ) -> datafusion::error::Result<ColumnarValue> {
        Err(datafusion::error::DataFusionError::Internal(format!(
            "parameter ${} of a kept plan was not given a value",
            self.index + 1
        )))
    }
}

fn slot(index: usize, ty: DataType) -> Expr {
    let slot = Slot {
        index,
        ty,
        // Volatile: no physical rule moves or merges it.
        signature: Signature::nullary(Volatility::Volatile),
    };
    ScalarUDF::new_from_impl(slot).call(vec![])
}

/// The position of the slot `e` is, if it is one.
fn slot_index(e: &Arc<dyn PhysicalExpr>) -> Option<usize> {
    let f = e.downcast_ref::<ScalarFunctionExpr>()?;
    let inner: &dyn std::any::Any = f.fun().inner().as_ref();
    inner.downcast_ref::<Slot>().map(|s| s.index)
}

fn logical_slot_index(e: &Expr) -> Option<usize> {
    let Expr::ScalarFunction(f) = e else {
        return None;
    };
    let inner: &dyn std::any::Any = f.func.inner().as_ref();
    inner.downcast_ref::<Slot>().map(|s| s.index)
}

/// `plan` (optimized) with each placeholder in a `Filter`'s predicate or
/// a `Projection`'s expressions replaced by its [`Slot`] (a projection's
/// output names kept). Placeholders anywhere else stay, for
/// [`only_in_scans`] to find.
pub(crate) fn into_slots(
    plan: LogicalPlan,
    types: &[DataType],
) -> datafusion::error::Result<LogicalPlan> {
    let to_slots = |e: Expr| {
        e.transform_up(|e| {
            Ok(match &e {
                Expr::Placeholder(p) => {
                    match position(&p.id).and_then(|i| Some((i, types.get(i)?))) {
                        Some((i, ty)) => Transformed::yes(slot(i, ty.clone())),
                        None => Transformed::no(e),
                    }
                }
                _ => Transformed::no(e),
            })
        })
    };
    // INT64 arithmetic on parameters checked first, while the
    // placeholders still carry their types.
    let checked = |e: Expr, schema: &datafusion::common::DFSchemaRef| {
        crate::checked::checked_parameter_arithmetic(e, schema)
    };
    plan.transform_up_with_subqueries(|node| match node {
        LogicalPlan::Filter(_) | LogicalPlan::Projection(_) => {
            // (A filter or a projection has its one input.)
            let Some(schema) = node.inputs().first().map(|i| i.schema().clone()) else {
                return Ok(Transformed::no(node));
            };
            if matches!(node, LogicalPlan::Filter(_)) {
                return node.map_expressions(|e| to_slots(checked(e, &schema)?));
            }
            let names = NamePreserver::new(&node);
            node.map_expressions(|e| {
                let name = names.save(&e);
                Ok(to_slots(checked(e, &schema)?)?.update_data(|e| name.restore(e)))
            })
        }
        _ => Ok(Transformed::no(node)),
    })
    .map(|t| t.data)
}

/// Whether every slot of `plan` is where [`fill_slots`] fills it: in a
/// `FilterExec`'s predicate or a `ProjectionExec`'s expressions.
pub(crate) fn slots_where_filled(plan: &Arc<dyn ExecutionPlan>) -> bool {
    let mut misplaced = false;
    let walk = plan.apply(|node| {
        if node.is::<FilterExec>() || node.is::<ProjectionExec>() {
            return Ok(TreeNodeRecursion::Continue);
        }
        node.apply_expressions(&mut |e| {
            e.apply(|e| {
                misplaced |= slot_index(e).is_some();
                Ok(if misplaced {
                    TreeNodeRecursion::Stop
                } else {
                    TreeNodeRecursion::Continue
                })
            })
        })
    });
    !misplaced && walk.is_ok()
}

/// A filled slot: the parameter's value, a constant like DataFusion's
/// `Literal`, but one its interval analysis does not read. Building a
/// `FilterExec` analyzes its predicate against the input's statistics
/// when every part of it is a column, a literal or arithmetic on them
/// (`check_support`): 6% of the server's time in a template run of `…
/// WHERE c_id = $1 AND amount > $2` (bench/README.md, session 43), for
/// an estimate nothing uses once the plan is made. The template's
/// `FilterExec` was built with the slot, so without that analysis too.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Filled(ScalarValue);

impl std::fmt::Display for Filled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl PhysicalExpr for Filled {
    fn data_type(&self, _input_schema: &Schema) -> datafusion::error::Result<DataType> {
        Ok(self.0.data_type())
    }

    fn nullable(&self, _input_schema: &Schema) -> datafusion::error::Result<bool> {
        Ok(self.0.is_null())
    }

    fn evaluate(&self, _batch: &RecordBatch) -> datafusion::error::Result<ColumnarValue> {
        Ok(ColumnarValue::Scalar(self.0.clone()))
    }

    fn children(&self) -> Vec<&Arc<dyn PhysicalExpr>> {
        vec![]
    }

    fn with_new_children(
        self: Arc<Self>,
        _children: Vec<Arc<dyn PhysicalExpr>>,
    ) -> datafusion::error::Result<Arc<dyn PhysicalExpr>> {
        Ok(self)
    }

    fn fmt_sql(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// `node` with its slots filled with `params` as constants, when it is a
/// `FilterExec` or `ProjectionExec` that holds any; `None` otherwise.
pub(crate) fn fill_slots(
    node: &Arc<dyn ExecutionPlan>,
    params: &[ScalarValue],
) -> datafusion::error::Result<Option<Arc<dyn ExecutionPlan>>> {
    // Slots are made only from placeholders: a plan kept by its text
    // (re-bound with no parameters) has none, and its filters and
    // projections are not walked at every run.
    if params.is_empty() {
        return Ok(None);
    }
    let fill = |e: &Arc<dyn PhysicalExpr>| -> datafusion::error::Result<Transformed<Arc<dyn PhysicalExpr>>> {
        e.clone().transform_up(|e| match slot_index(&e) {
            Some(i) => match params.get(i) {
                Some(v) => Ok(Transformed::yes(
                    Arc::new(Filled(v.clone())) as Arc<dyn PhysicalExpr>
                )),
                None => Err(datafusion::error::DataFusionError::Internal(format!(
                    "a kept plan names parameter ${} it was not given",
                    i + 1
                ))),
            },
            None => Ok(Transformed::no(e)),
        })
    };
    if let Some(f) = node.downcast_ref::<FilterExec>() {
        let predicate = fill(f.predicate())?;
        if !predicate.transformed {
            return Ok(None);
        }
        let filled = FilterExecBuilder::from(f)
            .with_predicate(predicate.data)
            .build()?;
        return Ok(Some(Arc::new(filled)));
    }
    if let Some(p) = node.downcast_ref::<ProjectionExec>() {
        let mut any = false;
        let mut exprs = Vec::with_capacity(p.expr().len());
        for pe in p.expr() {
            let e = fill(&pe.expr)?;
            any |= e.transformed;
            exprs.push(ProjectionExpr {
                expr: e.data,
                alias: pe.alias.clone(),
            });
        }
        if !any {
            return Ok(None);
        }
        let filled =
            ProjectionExec::try_new_with_schema_metadata(exprs, p.input().clone(), &p.schema())?;
        return Ok(Some(Arc::new(filled)));
    }
    Ok(None)
}

/// `stmt` (a query with parameters) with each parameter that is its row
/// count or offset alone (`LIMIT $2`, `OFFSET $3`, as ORMs send a find by
/// key: `… WHERE id = $1 LIMIT $2`) written in as the number it was given,
/// the other parameters renumbered `$1 … $m`, and their values; `None`
/// when there is no such parameter.
///
/// A row count is baked into DataFusion's operators (a limit, a sort's
/// fetch, a scan's), so a template cannot take it as a parameter; with
/// the number in its text, the query has a template per row count (the
/// key is the statement printed), each run for every other value. Only a
/// non-negative INT64 is written in, and only for a parameter used
/// nowhere else in the statement; anything else (NULL, a string) keeps
/// its `$n`, and the template declines as before.
pub(crate) fn inline_row_counts(
    stmt: &ast::Statement,
    params: &[Value],
) -> Option<(ast::Statement, Vec<Value>)> {
    use std::ops::ControlFlow;
    let ast::Statement::Query(q) = stmt else {
        return None;
    };
    let placeholder = |e: &ast::Expr| match e {
        ast::Expr::Value(v) => match &v.value {
            ast::Value::Placeholder(p) => position(p),
            _ => None,
        },
        _ => None,
    };
    let count = |i: usize| matches!(params.get(i), Some(Value::Int64(n)) if *n >= 0);
    let mut uses = vec![0usize; params.len()];
    let _ = ast::visit_expressions(stmt, |e| {
        if let Some(slot) = placeholder(e).and_then(|i| uses.get_mut(i)) {
            *slot += 1;
        }
        ControlFlow::<()>::Continue(())
    });
    let inlinable =
        |e: &ast::Expr| placeholder(e).filter(|i| count(*i) && uses.get(*i) == Some(&1));
    let mut q = q.clone();
    let mut inlined = vec![false; params.len()];
    let number = |i: usize| match params.get(i) {
        Some(Value::Int64(n)) => Some(ast::Expr::value(ast::Value::Number(n.to_string(), false))),
        _ => None,
    };
    let mut write_in = |e: &mut ast::Expr| {
        if let Some(i) = inlinable(e) {
            if let Some(n) = number(i) {
                *e = n;
                inlined[i] = true;
            }
        }
    };
    match &mut q.limit_clause {
        Some(ast::LimitClause::LimitOffset { limit, offset, .. }) => {
            if let Some(l) = limit {
                write_in(l);
            }
            if let Some(o) = offset {
                write_in(&mut o.value);
            }
        }
        Some(ast::LimitClause::OffsetCommaLimit { offset, limit }) => {
            write_in(offset);
            write_in(limit);
        }
        None => {}
    }
    if !inlined.iter().any(|x| *x) {
        return None;
    }
    // `$n` → `$m`, m counting the parameters that stay.
    let mut renumbered = vec![None; params.len()];
    let mut kept = Vec::new();
    for (i, v) in params.iter().enumerate() {
        if !inlined[i] {
            kept.push(v.clone());
            renumbered[i] = Some(kept.len());
        }
    }
    let mut stmt = ast::Statement::Query(q);
    let _ = ast::visit_expressions_mut(&mut stmt, |e| {
        if let Some(m) = placeholder(e).and_then(|i| renumbered.get(i).copied().flatten()) {
            *e = ast::Expr::value(ast::Value::Placeholder(format!("${m}")));
        }
        ControlFlow::<()>::Continue(())
    });
    Some((stmt, kept))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(sql: &str) -> ast::Statement {
        let mut stmts = datafusion::sql::sqlparser::parser::Parser::parse_sql(
            &datafusion::sql::sqlparser::dialect::PostgreSqlDialect {},
            sql,
        )
        .unwrap();
        stmts.remove(0)
    }

    fn inlined(sql: &str, params: &[Value]) -> Option<(String, Vec<Value>)> {
        inline_row_counts(&query(sql), params).map(|(s, p)| (s.to_string(), p))
    }

    #[test]
    fn row_counts_are_written_in_and_the_rest_renumbered() {
        let int = Value::Int64;
        assert_eq!(
            inlined(
                "SELECT a FROM t WHERE b = $1 AND c = $3 LIMIT $2 OFFSET $4",
                &[int(5), int(3), int(7), int(0)]
            ),
            Some((
                "SELECT a FROM t WHERE b = $1 AND c = $2 LIMIT 3 OFFSET 0".into(),
                vec![int(5), int(7)]
            ))
        );
        assert_eq!(
            inlined(
                "SELECT a FROM t WHERE b = $2 LIMIT 2 OFFSET $1",
                &[int(1), int(9)]
            ),
            Some((
                "SELECT a FROM t WHERE b = $1 LIMIT 2 OFFSET 1".into(),
                vec![int(9)]
            ))
        );
        // Every parameter a row count: none left.
        assert_eq!(
            inlined("SELECT a FROM t LIMIT $1", &[int(2)]),
            Some(("SELECT a FROM t LIMIT 2".into(), vec![]))
        );
        // Not written in: a parameter used elsewhere too, a negative, NULL
        // or text row count, a LIMIT of an expression, a subquery's LIMIT.
        for (sql, params) in [
            ("SELECT a FROM t WHERE b < $1 LIMIT $1", vec![int(3)]),
            ("SELECT a FROM t LIMIT $1", vec![int(-1)]),
            ("SELECT a FROM t LIMIT $1", vec![Value::Null]),
            ("SELECT a FROM t LIMIT $1", vec![Value::String("3".into())]),
            ("SELECT a FROM t LIMIT $1 + 1", vec![int(3)]),
            (
                "SELECT a FROM (SELECT a FROM t LIMIT $1) AS s",
                vec![int(3)],
            ),
            ("SELECT a FROM t WHERE b = $1", vec![int(3)]),
        ] {
            assert_eq!(inlined(sql, &params), None, "{sql}");
        }
    }
}
