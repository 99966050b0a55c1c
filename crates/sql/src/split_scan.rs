//! A long scan read by two threads, as two DataFusion partitions.
//!
//! A scan of one range that has read 1 024 rows (a jump over a row
//! tree's children counting three: `provider::rows_before_split`) hands the far
//! half of what is left to a helper thread (`provider`,
//! `TxnScan::split_off`).
//! When the scan was planned as two partitions, the helper's batches are
//! partition 1's output, and the operators above the scan (filters,
//! projections, partial aggregates, a hash join's probe) run on each half
//! in parallel:
//!
//! ```text
//!   range  [start ── 1 024th row read ─── cut ──────────────────── end)
//!   partition 0:  the scan's thread ────▶ │ ends at the cut
//!   partition 1:  waits ······ handed ──▶ the helper thread, cut to end
//! ```
//!
//! With one partition the helper could read only a few batches ahead
//! (memory stays bounded) before it waited for the scan's thread to
//! finish its half and forward them, so at a million rows the two halves
//! were read mostly one after the other.
//!
//! The hand-over goes through a [`TailSlot`], made anew each time a scan
//! is bound to a transaction or reset (every execution of a kept plan
//! binds anew). Either partition may get there first: DataFusion executes
//! partitions from tasks of their own, in no set order.
//!
//! ```text
//!   Open ── partition 1 executes ──▶ Waiting(sender) ── partition 0 splits ──▶ Closed
//!     │                                  │             (the helper sends there)
//!     │                                  └── partition 0 ends unsplit ──▶ Closed (partition 1 ends)
//!     ├── partition 0 splits ──▶ Ready(receiver) ── partition 1 executes, takes it ──▶ Closed
//!     └── partition 0 ends unsplit ──▶ Closed (partition 1, when it executes, ends at once)
//! ```
//!
//! Invariants:
//! * Every row is produced once: a far half goes to partition 1 through
//!   an open slot (partition 1 takes it whenever it executes), and after
//!   the slot closed (a second split of the same binding) the scan's own
//!   thread forwards it after its half, as with one partition.
//! * Each partition is in key order and partition 0's keys precede
//!   partition 1's. A plan whose root still has several partitions (a
//!   plain `SELECT … FROM t`, a hash join's probe) reads them one after
//!   the other ([`InOrderExec`], put there by [`KeyOrderAtRoot`]): rows
//!   reach the client in the order one partition gave, key order for a
//!   plain scan. Partition 1's operators then run only as far ahead as its
//!   channel holds, as a single partition's helper did: parallelism is
//!   for what the plan gathers into one partition (aggregates, sorts, a
//!   join's build side), where it pays.
//! * Partition 1 ends when partition 0's thread ends without a split (or
//!   its stream is dropped before the thread started), or when the
//!   helper ends. DataFusion's consumers execute every partition of their
//!   input, so partition 1 does not wait on a partition 0 that never
//!   runs, and a half handed to a partition 1 that never runs is dropped
//!   with the plan.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::DataFusionError;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::stream::{
    RecordBatchReceiverStreamBuilder, RecordBatchStreamAdapter,
};
use datafusion::physical_plan::streaming::PartitionStream;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
};
use futures::StreamExt;
use tokio::sync::mpsc;

/// A channel of a scan half's batches.
pub(crate) type BatchSender = mpsc::Sender<datafusion::error::Result<RecordBatch>>;
type BatchReceiver = mpsc::Receiver<datafusion::error::Result<RecordBatch>>;

/// Batches a helper thread reads ahead of its consumer (at most 64 Ki rows).
pub(crate) const HELPER_BATCHES: usize = 8;

/// Where a split scan's far half passes from partition 0's thread to
/// partition 1 (see the module documentation).
#[derive(Debug, Default)]
pub(crate) struct TailSlot(Mutex<SlotState>);

#[derive(Debug, Default)]
enum SlotState {
    /// Neither partition has got here yet.
    #[default]
    Open,
    /// Partition 1 executed first and reads from this sender's channel.
    Waiting(BatchSender),
    /// Partition 0 split first: the far half's channel, for partition 1.
    Ready(BatchReceiver),
    /// The hand-over is done, or will not happen in this binding.
    Closed,
}

impl TailSlot {
    fn state(&self) -> MutexGuard<'_, SlotState> {
        // Every critical section is one `mem::replace` of the state, which
        // cannot panic half-way: a poisoned lock still holds a whole state.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// For partition 0 splitting: the channel its far half goes to, which
    /// partition 1 reads (now or when it executes); `None` once closed
    /// (the far half is then partition 0's to read).
    pub(crate) fn hand_over(&self) -> Option<BatchSender> {
        let mut state = self.state();
        match std::mem::replace(&mut *state, SlotState::Closed) {
            SlotState::Waiting(tx) => Some(tx),
            SlotState::Open => {
                let (tx, rx) = mpsc::channel(HELPER_BATCHES);
                *state = SlotState::Ready(rx);
                Some(tx)
            }
            ready @ SlotState::Ready(_) => {
                *state = ready;
                None
            }
            SlotState::Closed => None,
        }
    }

    /// For partition 1: its batches' channel (empty if partition 0 ended
    /// without a split).
    fn receiver(&self) -> BatchReceiver {
        let mut state = self.state();
        match std::mem::replace(&mut *state, SlotState::Closed) {
            SlotState::Ready(rx) => rx,
            SlotState::Open | SlotState::Waiting(_) => {
                let (tx, rx) = mpsc::channel(HELPER_BATCHES);
                *state = SlotState::Waiting(tx);
                rx
            }
            // The sender is dropped at once: the stream ends.
            SlotState::Closed => mpsc::channel(1).1,
        }
    }

    /// For partition 0 ending (or dropped unstarted): no far half will
    /// come; a waiting partition 1 ends.
    fn close(&self) {
        let mut state = self.state();
        if !matches!(*state, SlotState::Ready(_)) {
            *state = SlotState::Closed;
        }
    }
}

/// Closes its slot when dropped: held by partition 0's thread (or by its
/// closure, if the thread never starts).
pub(crate) struct CloseOnDrop(pub(crate) Arc<TailSlot>);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// Partition 1 of a scan that may split: the far half, if handed over.
#[derive(Debug)]
pub(crate) struct TailStream {
    pub(crate) schema: SchemaRef,
    pub(crate) slot: Arc<TailSlot>,
}

impl PartitionStream for TailStream {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let batches = futures::stream::unfold(self.slot.receiver(), |mut rx| async move {
            rx.recv().await.map(|batch| (batch, rx))
        });
        Box::pin(RecordBatchStreamAdapter::new(self.schema.clone(), batches))
    }
}

/// Reads a plan's root partitions one after the other (see the module
/// documentation), so that the rows of a scan read as two partitions
/// reach the client in key order. Runs after DataFusion's rules.
#[derive(Debug, Default)]
pub(crate) struct KeyOrderAtRoot;

impl PhysicalOptimizerRule for KeyOrderAtRoot {
    fn name(&self) -> &str {
        "KeyOrderAtRoot"
    }

    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        if plan.output_partitioning().partition_count() < 2 {
            return Ok(plan);
        }
        Ok(Arc::new(InOrderExec::new(plan)))
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// One partition: its input's partitions, each read to its end before the
/// next. Every input partition is executed at once (so a split scan's
/// partition 1 is waiting for its half when the split is made) and polled
/// by a task of its own into a channel of two batches; the channels are
/// read in turn. No output ordering is declared: concatenated
/// partitions are in order only when their keys are, as a split scan's.
#[derive(Debug)]
pub(crate) struct InOrderExec {
    input: Arc<dyn ExecutionPlan>,
    properties: Arc<PlanProperties>,
}

impl InOrderExec {
    fn new(input: Arc<dyn ExecutionPlan>) -> InOrderExec {
        let properties = PlanProperties::new(
            EquivalenceProperties::new(input.schema()),
            Partitioning::UnknownPartitioning(1),
            input.pipeline_behavior(),
            input.boundedness(),
        );
        InOrderExec {
            input,
            properties: Arc::new(properties),
        }
    }
}

impl DisplayAs for InOrderExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "InOrderExec: partitions one after another")
    }
}

impl ExecutionPlan for InOrderExec {
    fn name(&self) -> &str {
        "InOrderExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> datafusion::error::Result<TreeNodeRecursion>,
    ) -> datafusion::error::Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        match (children.pop(), children.is_empty()) {
            (Some(input), true) => Ok(Arc::new(InOrderExec::new(input))),
            _ => Err(DataFusionError::Internal(
                "InOrderExec has exactly one child".into(),
            )),
        }
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> datafusion::error::Result<SendableRecordBatchStream> {
        if partition != 0 {
            return Err(DataFusionError::Internal(format!(
                "InOrderExec has one partition, not {partition}"
            )));
        }
        // Each partition is polled by a task of its own (a few batches
        // ahead), not only once the one before it is done: partitions may
        // wait on each other before their first batch (a hash join's
        // partitions publish its dynamic filter together).
        let mut ordered = Vec::new();
        for i in 0..self.input.output_partitioning().partition_count() {
            let mut stream = self.input.execute(i, context.clone())?;
            let mut forward = RecordBatchReceiverStreamBuilder::new(self.input.schema(), 2);
            let tx = forward.tx();
            forward.spawn(async move {
                while let Some(batch) = stream.next().await {
                    if tx.send(batch).await.is_err() {
                        break; // the consumer went away
                    }
                }
                Ok(())
            });
            ordered.push(forward.build());
        }
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.input.schema(),
            futures::stream::iter(ordered).flatten(),
        )))
    }
}
