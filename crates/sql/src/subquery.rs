//! Correlated subqueries that DataFusion cannot turn into joins.
//!
//! DataFusion's optimizer decorrelates subqueries whose correlation is a
//! conjunction of equalities; others (e.g. `(SELECT count(*) FROM t1 AS x
//! WHERE x.c > t1.c)`) reach the physical planner unchanged, which rejects
//! them, as it rejects `EXISTS` and `IN (subquery)` outside a WHERE clause.
//! [`rewrite`] runs after optimization and replaces each remaining
//! correlated `ScalarSubquery`, and every `EXISTS` and `IN (subquery)`, by
//! a call to a
//! volatile function that evaluates the subquery once per distinct
//! combination of outer values (nested-loop semantics, as PostgreSQL's
//! SubPlan):
//!
//! ```text
//! Projection: (<subquery>)                 Projection: spindle_subplan(t1.c, t1.d)
//!   Subquery: … x.c > outer_ref(t1.c) …  ─►   └─ per row: substitute literals for outer
//!   TableScan: t1                                 refs, optimize, execute, take the value
//! ```
//!
//! The function keeps the original expression's name, so the plan's
//! schema does not change. Results are cached per outer-value tuple.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::{Array, ArrayRef, BooleanArray};
use datafusion::arrow::datatypes::DataType;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{DataFusionError, Result, ScalarValue};
use datafusion::execution::session_state::SessionState;
use datafusion::logical_expr::{
    ColumnarValue, Expr, LogicalPlan, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    Subquery, Volatility,
};

/// What a subplan computes for one outer row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Scalar,
    Exists {
        negated: bool,
    },
    /// `arg0 [NOT] IN (subquery)`: the first function argument is the
    /// tested value, the rest are the outer references.
    In {
        negated: bool,
    },
}

/// Rewrites the remaining correlated subqueries of an optimized plan.
pub fn rewrite(plan: LogicalPlan, state: &SessionState) -> Result<LogicalPlan> {
    let out = plan.transform_up(|node| {
        node.map_expressions(|e| {
            e.transform_up(|expr| {
                let (kind, sq, tested) = match &expr {
                    Expr::ScalarSubquery(sq) if !sq.outer_ref_columns.is_empty() => {
                        (Kind::Scalar, sq.clone(), None)
                    }
                    // EXISTS and IN left after optimization (e.g. in a select list)
                    // have no physical form, correlated or not.
                    Expr::Exists(ex) => (
                        Kind::Exists {
                            negated: ex.negated,
                        },
                        ex.subquery.clone(),
                        None,
                    ),
                    Expr::InSubquery(i) => (
                        Kind::In { negated: i.negated },
                        i.subquery.clone(),
                        Some((*i.expr).clone()),
                    ),
                    _ => return Ok(Transformed::no(expr)),
                };
                let name = expr.schema_name().to_string();
                Ok(Transformed::yes(subplan_call(
                    kind, sq, tested, name, state,
                )?))
            })
        })
    })?;
    Ok(out.data)
}

fn subplan_call(
    kind: Kind,
    sq: Subquery,
    tested: Option<Expr>,
    name: String,
    state: &SessionState,
) -> Result<Expr> {
    let mut outer = Vec::new();
    let mut args = Vec::new();
    if let Some(t) = tested {
        args.push(t);
    }
    for e in &sq.outer_ref_columns {
        match e {
            Expr::OuterReferenceColumn(_, col) => {
                outer.push(col.clone());
                args.push(Expr::Column(col.clone()));
            }
            other => {
                return Err(DataFusionError::NotImplemented(format!(
                    "outer reference {other}"
                )))
            }
        }
    }
    let return_type = match kind {
        Kind::Scalar => sq.subquery.schema().field(0).data_type().clone(),
        _ => DataType::Boolean,
    };
    let udf = SubPlan {
        kind,
        plan: sq.subquery.clone(),
        outer,
        return_type,
        name,
        signature: Signature::variadic_any(Volatility::Volatile),
        state: StateRef(Arc::new(state.clone())),
        cache: Arc::new(Mutex::new(HashMap::new())),
    };
    Ok(ScalarUDF::new_from_impl(udf).call(args))
}

/// A shared session, compared by identity (UDFs must be `Eq + Hash`).
#[derive(Clone)]
struct StateRef(Arc<SessionState>);

impl PartialEq for StateRef {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}
impl Eq for StateRef {}
impl Hash for StateRef {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (Arc::as_ptr(&self.0) as usize).hash(state)
    }
}

type Cache = Arc<Mutex<HashMap<Vec<ScalarValue>, ScalarValue>>>;

#[derive(Clone)]
struct SubPlan {
    kind: Kind,
    plan: Arc<LogicalPlan>,
    outer: Vec<datafusion::common::Column>,
    return_type: DataType,
    name: String,
    signature: Signature,
    state: StateRef,
    cache: Cache,
}

impl std::fmt::Debug for SubPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SubPlan({})", self.name)
    }
}

impl PartialEq for SubPlan {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind
            && self.plan == other.plan
            && self.name == other.name
            && self.state == other.state
    }
}
impl Eq for SubPlan {}
impl Hash for SubPlan {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.kind.hash(state);
        self.name.hash(state);
        self.state.hash(state);
    }
}

impl SubPlan {
    /// Runs the subquery with `values` in place of the outer references and
    /// returns its rows' first column.
    fn run(&self, values: &[ScalarValue]) -> Result<Vec<ScalarValue>> {
        let subst: HashMap<&datafusion::common::Column, &ScalarValue> =
            self.outer.iter().zip(values).collect();
        let plan = (*self.plan)
            .clone()
            .transform_up_with_subqueries(|node| {
                node.map_expressions(|e| {
                    e.transform_up(|expr| match &expr {
                        Expr::OuterReferenceColumn(_, col) => match subst.get(col) {
                            Some(v) => Ok(Transformed::yes(Expr::Literal((*v).clone(), None))),
                            None => Ok(Transformed::no(expr)),
                        },
                        _ => Ok(Transformed::no(expr)),
                    })
                })
            })?
            .data;
        let state = self.state.0.clone();
        let fut = async move {
            let optimized = state.optimize(&plan)?;
            let optimized = rewrite(optimized, &state)?;
            let physical = state
                .query_planner()
                .create_physical_plan(&optimized, state.as_ref())
                .await?;
            datafusion::physical_plan::collect(physical, state.task_ctx()).await
        };
        let handle = tokio::runtime::Handle::try_current().map_err(|_| {
            DataFusionError::Execution("correlated subquery evaluated outside a runtime".into())
        })?;
        if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread {
            return Err(DataFusionError::NotImplemented(
                "correlated subqueries need a multi-threaded runtime".into(),
            ));
        }
        let batches = tokio::task::block_in_place(|| handle.block_on(fut))?;
        let mut out = Vec::new();
        for b in &batches {
            for r in 0..b.num_rows() {
                out.push(ScalarValue::try_from_array(b.column(0), r)?);
            }
        }
        Ok(out)
    }

    fn eval_row(&self, args: &[ArrayRef], row: usize) -> Result<ScalarValue> {
        let values: Vec<ScalarValue> = args
            .iter()
            .map(|a| ScalarValue::try_from_array(a, row))
            .collect::<Result<_>>()?;
        if let Some(v) = self
            .cache
            .lock()
            .map_err(|_| DataFusionError::Internal("cache poisoned".into()))?
            .get(&values)
        {
            return Ok(v.clone());
        }
        let result = match self.kind {
            Kind::Scalar => {
                let rows = self.run(&values)?;
                match rows.len() {
                    0 => ScalarValue::try_from(&self.return_type)?,
                    1 => rows.into_iter().next().unwrap_or(ScalarValue::Null),
                    _ => {
                        return Err(DataFusionError::Execution(
                            "more than one row returned by a subquery used as an expression".into(),
                        ))
                    }
                }
            }
            Kind::Exists { negated } => {
                let rows = self.run(&values)?;
                ScalarValue::Boolean(Some(rows.is_empty() == negated))
            }
            Kind::In { negated } => {
                let tested = &values[0];
                let rows = self.run(&values[1..])?;
                let found = if rows.is_empty() {
                    Some(false)
                } else if tested.is_null() {
                    None
                } else {
                    let mut saw_null = false;
                    let mut hit = false;
                    for r in &rows {
                        if r.is_null() {
                            saw_null = true;
                        } else if scalar_eq(tested, r)? {
                            hit = true;
                            break;
                        }
                    }
                    if hit {
                        Some(true)
                    } else if saw_null {
                        None
                    } else {
                        Some(false)
                    }
                };
                ScalarValue::Boolean(found.map(|f| f != negated))
            }
        };
        self.cache
            .lock()
            .map_err(|_| DataFusionError::Internal("cache poisoned".into()))?
            .insert(values, result.clone());
        Ok(result)
    }
}

/// SQL equality of two non-null scalars of possibly different numeric types.
fn scalar_eq(a: &ScalarValue, b: &ScalarValue) -> Result<bool> {
    if a.data_type() == b.data_type() {
        return Ok(a == b);
    }
    let target = if a.data_type().is_floating() || b.data_type().is_floating() {
        DataType::Float64
    } else {
        a.data_type()
    };
    match (a.cast_to(&target), b.cast_to(&target)) {
        (Ok(x), Ok(y)) => Ok(x == y),
        _ => Ok(a.to_string() == b.to_string()),
    }
}

impl ScalarUDFImpl for SubPlan {
    fn name(&self) -> &str {
        "spindle_subplan"
    }

    fn display_name(&self, _args: &[Expr]) -> Result<String> {
        Ok(self.name.clone())
    }

    fn schema_name(&self, _args: &[Expr]) -> Result<String> {
        Ok(self.name.clone())
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(self.return_type.clone())
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let n = args.number_rows;
        let arrays: Vec<ArrayRef> = args
            .args
            .into_iter()
            .map(|a| a.into_array(n))
            .collect::<Result<_>>()?;
        if self.kind != Kind::Scalar {
            let mut out = Vec::with_capacity(n);
            for row in 0..n {
                out.push(match self.eval_row(&arrays, row)? {
                    ScalarValue::Boolean(b) => b,
                    _ => None,
                });
            }
            return Ok(ColumnarValue::Array(Arc::new(BooleanArray::from(out))));
        }
        let mut values = Vec::with_capacity(n);
        for row in 0..n {
            values.push(self.eval_row(&arrays, row)?);
        }
        if values.is_empty() {
            return Ok(ColumnarValue::Array(
                datafusion::arrow::array::new_empty_array(&self.return_type),
            ));
        }
        let array = ScalarValue::iter_to_array(values)?;
        debug_assert_eq!(array.len(), n);
        Ok(ColumnarValue::Array(array))
    }
}
