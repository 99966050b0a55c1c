//! Checked INT64 arithmetic: `+`, `-` and `*` between two INT64 operands
//! raise 22003 (`bigint out of range`) on overflow, as in PostgreSQL.
//!
//! DataFusion plans these operators with wrapping kernels (its
//! `fail_on_overflow` is off, and no setting of the SQL path turns it on),
//! so `9223372036854775807 + 1` would silently give `-9223372036854775808`.
//! An [`ExprPlanner`] sees every binary operator as the SQL planner builds
//! it; when both operands are INT64 it plans a call of `int8pl`, `int8mi`
//! or `int8mul` (PostgreSQL's names for these functions) instead, which run
//! Arrow's checked kernels. Everything else — other types, mixed types
//! (coerced by DataFusion as before), other operators — is left alone.

use std::sync::{Arc, OnceLock};

use datafusion::arrow::array::Datum;
use datafusion::arrow::compute::kernels::numeric;
use datafusion::arrow::datatypes::DataType;
use datafusion::common::{DFSchema, Result, ScalarValue};
use datafusion::logical_expr::planner::{ExprPlanner, PlannerResult, RawBinaryExpr};
use datafusion::logical_expr::{
    ColumnarValue, Expr, ExprSchemable, Operator, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl,
    Signature, Volatility,
};
use datafusion::sql::sqlparser::ast::BinaryOperator;

/// Plans INT64 `+ - *` as checked functions (see the module docs).
#[derive(Debug)]
pub(crate) struct CheckedIntArithmetic {
    add: Arc<ScalarUDF>,
    sub: Arc<ScalarUDF>,
    mul: Arc<ScalarUDF>,
}

impl CheckedIntArithmetic {
    pub(crate) fn new() -> CheckedIntArithmetic {
        let udf = |op| Arc::new(ScalarUDF::new_from_impl(CheckedOp::new(op)));
        CheckedIntArithmetic {
            add: udf(Op::Add),
            sub: udf(Op::Sub),
            mul: udf(Op::Mul),
        }
    }
}

impl ExprPlanner for CheckedIntArithmetic {
    fn plan_binary_op(
        &self,
        expr: RawBinaryExpr,
        schema: &DFSchema,
    ) -> Result<PlannerResult<RawBinaryExpr>> {
        let udf = match expr.op {
            BinaryOperator::Plus => &self.add,
            BinaryOperator::Minus => &self.sub,
            BinaryOperator::Multiply => &self.mul,
            _ => return Ok(PlannerResult::Original(expr)),
        };
        // An operand whose type cannot be known here (an outer reference,
        // say) keeps DataFusion's own planning.
        let int64 =
            |e: &datafusion::logical_expr::Expr| matches!(e.get_type(schema), Ok(DataType::Int64));
        if !(int64(&expr.left) && int64(&expr.right)) {
            return Ok(PlannerResult::Original(expr));
        }
        Ok(PlannerResult::Planned(
            udf.call(vec![expr.left, expr.right]),
        ))
    }
}

/// `e` with every INT64 `+ - *` that involves a parameter planned as the
/// checked functions, as [`CheckedIntArithmetic`] plans those whose
/// operand types it knows. A placeholder's type is not known when the
/// SQL planner meets it (DataFusion infers it later), so `$1 * 2` was
/// planned with the wrapping operator: a kept plan computed
/// `9223372036854775807 * 2 + 1` as -1 where the same query with the
/// value written in raised 22003. `schema` types the columns of `e`.
pub(crate) fn checked_parameter_arithmetic(e: Expr, schema: &DFSchema) -> Result<Expr> {
    use datafusion::common::tree_node::{Transformed, TreeNode};
    static OPS: OnceLock<CheckedIntArithmetic> = OnceLock::new();
    let ops = OPS.get_or_init(CheckedIntArithmetic::new);
    e.transform_up(|e| {
        let Expr::BinaryExpr(b) = &e else {
            return Ok(Transformed::no(e));
        };
        let udf = match b.op {
            Operator::Plus => &ops.add,
            Operator::Minus => &ops.sub,
            Operator::Multiply => &ops.mul,
            _ => return Ok(Transformed::no(e)),
        };
        let int64 = |e: &Expr| matches!(e.get_type(schema), Ok(DataType::Int64));
        if !(int64(&b.left) && int64(&b.right) && crate::params::has_placeholder(&e)) {
            return Ok(Transformed::no(e));
        }
        let Expr::BinaryExpr(b) = e else {
            return Ok(Transformed::no(e));
        };
        Ok(Transformed::yes(udf.call(vec![*b.left, *b.right])))
    })
    .map(|t| t.data)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Op {
    Add,
    Sub,
    Mul,
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct CheckedOp {
    op: Op,
    signature: Signature,
}

impl CheckedOp {
    fn new(op: Op) -> CheckedOp {
        CheckedOp {
            op,
            signature: Signature::exact(
                vec![DataType::Int64, DataType::Int64],
                Volatility::Immutable,
            ),
        }
    }
}

impl ScalarUDFImpl for CheckedOp {
    fn name(&self) -> &str {
        match self.op {
            Op::Add => "int8pl",
            Op::Sub => "int8mi",
            Op::Mul => "int8mul",
        }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Int64)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let [a, b] = args.args.as_slice() else {
            return Err(datafusion::common::DataFusionError::Internal(format!(
                "{} takes two arguments",
                self.name()
            )));
        };
        let scalars = matches!((a, b), (ColumnarValue::Scalar(_), ColumnarValue::Scalar(_)));
        let (a, b) = (datum(a)?, datum(b)?);
        let out = match self.op {
            Op::Add => numeric::add(a.as_ref(), b.as_ref()),
            Op::Sub => numeric::sub(a.as_ref(), b.as_ref()),
            Op::Mul => numeric::mul(a.as_ref(), b.as_ref()),
        }?;
        if scalars {
            Ok(ColumnarValue::Scalar(ScalarValue::try_from_array(&out, 0)?))
        } else {
            Ok(ColumnarValue::Array(out))
        }
    }
}

/// An argument as an Arrow datum (a scalar is broadcast by the kernel).
fn datum(c: &ColumnarValue) -> Result<Box<dyn Datum>> {
    Ok(match c {
        ColumnarValue::Array(a) => Box::new(a.clone()),
        ColumnarValue::Scalar(s) => Box::new(s.to_scalar()?),
    })
}
