//! Yield points above joins, so that a canceled query stops.
//!
//! A query runs as a future. A cancel request (or a dropped connection, or
//! a dropped embedded call) drops that future or aborts the task polling
//! it, and either only takes effect when the query's stream next returns
//! `Pending`. DataFusion's operators pull from their inputs in a loop for
//! as long as the inputs are ready, so a plan yields only where a node
//! spends the task's cooperative budget (tokio's `coop`): its leaves
//! (Spindle scans run as DataFusion streaming tables, which spend one unit
//! per batch) and its exchanges. A join's output is not metered: one
//! input batch may become any number of output batches, made without
//! polling an input:
//!
//! ```text
//!   AggregateExec          pulls while ready ──────────────┐
//!     CrossJoinExec        100 000 left rows × one right batch of 8 192
//!       generate_series    = 819 200 000 rows, 100 000 output batches,
//!       generate_series      and no budget spent between them
//! ```
//!
//! Measured before this rule (debug build,
//! crates/server/tests/wire.rs's cancel test, which cross-joins two
//! `generate_series(1, 100000)`): the canceled query was not stopped but
//! ran to its end, 50–65 s on one of the runtime's two worker threads,
//! after its client had had its 57014, and the test's own timers waited
//! behind it; the same query sent again inside BEGIN then ran to its end
//! unnoticed by a cancel that came too late, and the test failed now and
//! then with a result where 57014 was expected.
//!
//! [`YieldAfterJoins`] puts a `CooperativeExec` on every join's (and
//! UNNEST's) output, which spends one unit of budget per batch: after
//! tokio's budget (128 units per task poll) the stream returns `Pending`
//! once, the task yields, and a drop or abort takes effect there.
//!
//! Invariants:
//! * The rule only adds `CooperativeExec` nodes, one directly above each
//!   join or UNNEST; results, ordering,
//!   partitioning and statistics are unchanged (`CooperativeExec` forwards
//!   all of them, and passes filter, limit, projection and sort pushdown
//!   through), so it runs last, after DataFusion's own rules.
//! * The cost is one budget unit per join output batch, on top of the
//!   scans' one per batch: a query yields (one reschedule of its task)
//!   after at most 128 units, about a million rows at the 8 192-row batch
//!   size, and a query of fewer batches than that never does.

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::coop::CooperativeExec;
use datafusion::physical_plan::joins::{
    CrossJoinExec, HashJoinExec, NestedLoopJoinExec, PiecewiseMergeJoinExec, SortMergeJoinExec,
    SymmetricHashJoinExec,
};
use datafusion::physical_plan::unnest::UnnestExec;
use datafusion::physical_plan::ExecutionPlan;

/// The physical optimizer rule (see the module documentation).
#[derive(Debug, Default)]
pub(crate) struct YieldAfterJoins;

/// Whether `plan` may make many output batches from one input batch.
fn amplifies(plan: &dyn ExecutionPlan) -> bool {
    plan.is::<HashJoinExec>()
        || plan.is::<CrossJoinExec>()
        || plan.is::<NestedLoopJoinExec>()
        || plan.is::<SortMergeJoinExec>()
        || plan.is::<SymmetricHashJoinExec>()
        || plan.is::<PiecewiseMergeJoinExec>()
        || plan.is::<UnnestExec>()
}

impl PhysicalOptimizerRule for YieldAfterJoins {
    fn name(&self) -> &str {
        "YieldAfterJoins"
    }

    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        // Bottom-up, each node once: a join is replaced by the wrapper
        // around it, which its parent then gets as its child.
        plan.transform_up(|node| {
            Ok(if amplifies(node.as_ref()) {
                Transformed::yes(Arc::new(CooperativeExec::new(node)) as Arc<dyn ExecutionPlan>)
            } else {
                Transformed::no(node)
            })
        })
        .map(|t| t.data)
    }

    fn schema_check(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::session::Engine;

    /// A cross join of 9·10^8 rows on a current-thread runtime, given 0.2 s:
    /// the timeout can only fire at a point where the query's future
    /// yields. Without the rule the whole query ran in one poll (2.7 s
    /// in a debug build) and the timeout saw it finished.
    #[tokio::test(flavor = "current_thread")]
    async fn a_join_yields_so_that_a_timeout_stops_it() {
        let engine = Engine::open(None).unwrap();
        let mut session = engine.session();
        let q = "SELECT sum(a.value * b.value) FROM generate_series(1, 30000) a, \
                 generate_series(1, 30000) b";
        let r = tokio::time::timeout(Duration::from_millis(200), session.execute(q, &[])).await;
        assert!(r.is_err(), "the query ran to its end in one poll: {r:?}");
        // The session is usable after the dropped statement.
        let out = session.execute("SELECT 1", &[]).await.unwrap();
        assert_eq!(out.len(), 1);
    }
}
