//! DataFusion table providers over Spindle tables.
//!
//! A [`SpindleTable`] turns DataFusion's scan (projection, filters, limit)
//! into a plain [`ScanRequest`]: a sorted list of disjoint key ranges plus
//! the projected columns. Storage never sees a DataFusion type.
//!
//! ## Filters → key ranges
//!
//! For key columns `k1..kn` (the full key, parent's columns first):
//!
//! 1. While `ki = literal` or `ki IN (literals)` holds, the key prefix
//!    grows (the cartesian product of IN lists, up to [`MAX_POINTS`]).
//! 2. On the next key column, `<, <=, >, >=` bounds narrow each prefix to
//!    a range. NULLs are excluded (a comparison is never true for NULL).
//! 3. Everything else is evaluated by DataFusion on the scanned rows.
//!
//! A filter is reported `Exact` only when it was consumed by step 1 or 2
//! of the primary-key plan and no index competes for the scan (the ranges
//! then contain exactly the rows it accepts); otherwise it is `Inexact`
//! and DataFusion re-applies it.
//!
//! ## Access paths
//!
//! The same planning runs over the key of each secondary index (an index
//! is described by a table chain ending in a virtual table, see
//! `Catalog::index_chain`), and [`SpindleTable`] keeps the cheapest path by
//! estimated selectivity: primary-key ranges, an index (read alone when it
//! covers the query, otherwise each entry's base row is fetched by key), or
//! a full scan. A table with rows interleaved below its own costs more per
//! row (a jump per row tree), so there a covering global index is read
//! instead even when no filter narrows it (`SpindleTable::choose`).
//! `FORCE_INDEX` hints override the choice. EXPLAIN prints
//! the path as `SpindleScan: table=… access=… where … ranges=n`.
//!
//! ## Interleaved tables
//!
//! A child table's rows live inside its root table's row trees, mixed with
//! rows of other tables of the tree. A scan covers the root's range (or a
//! narrower prefix) and keeps only keys that decode as rows of the scanned
//! table ([`spindle_catalog::Catalog::decode_key`]). Rows come out in key
//! order, which the plan declares to DataFusion as the output ordering.
//!
//! ## Execution
//!
//! All ranges are read at the statement's snapshot (the transaction's read
//! timestamp plus its own buffered writes, copied at plan time), on a
//! blocking thread that feeds record batches through a bounded channel.
//! Rows are decoded from the store's pages into Arrow builders
//! ([`RowDecoder`]); nothing the query does not project is decoded.
//! Entries are read in runs (`RowReader::run` over `TxnScan::run_with`):
//! up to a B-tree leaf's entries per call, so that the store's per-step
//! preparation is paid per leaf, not per entry; a run ends early at an
//! entry that leaves a jump to make, a full batch, the budget of a scan
//! read in place, a LIMIT, or the row with which the scan splits (below).
//!
//! A scan of one range that has read 1 024 rows hands the far half of
//! what is left to a helper thread (`TxnScan::split_off`; a kept thread,
//! see `helper_threads`). A jump over a row tree's children counts as
//! three rows read (`rows_before_split`): an interleaved parent-only scan, a seek
//! per row, splits after 256 rows, about as early in time.
//!
//! ```text
//!   range  [start ─── 1024th row read ────── cut ──────────────── end)
//!   scan thread:  reads, sends batches      │
//!   helper thread:                          reads the far half
//!   output: partition 0 the scan's batches, partition 1 the helper's
//! ```
//!
//! Such a scan is planned as two DataFusion partitions, so that what runs
//! above it runs on both halves at once ([`crate::split_scan`]). A second
//! split of the same binding (a re-run plan that was not reset) cannot be
//! handed over: then the helper reads ahead (≤ 8 batches) and the scan's
//! thread forwards its batches after its own.
//!
//! Not split: several ranges, a limit, an index fetch, or buffered writes
//! ahead in the range (then rows are not the store's alone).
//!
//! The first batch holds 1 024 rows, later ones 8 192 (DataFusion's batch
//! size): every batch wakes the thread on the other end of a channel
//! (with 1 024-row batches throughout, a 100 000-row `count(*)` took about
//! a third more server CPU).

use std::fmt;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use datafusion::arrow::compute::SortOptions;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::{Session as DfSession, TableProvider};
use datafusion::common::{DataFusionError, ScalarValue};
use datafusion::datasource::TableType;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{BinaryExpr, Expr, Operator, TableProviderFilterPushDown};
use datafusion::physical_expr::expressions::Column as PhysColumn;
use datafusion::physical_expr::{LexOrdering, PhysicalSortExpr};
use datafusion::physical_plan::stream::RecordBatchReceiverStreamBuilder;
use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use spindle_catalog::{Catalog, Table};
use spindle_keys::key::prefix_end;
use spindle_keys::{Direction, Value};
use spindle_txn::{PointReader, Snapshot, Transaction, TxnManager, TxnScan};

use crate::index::IndexPlan;
use crate::join_keys::{Place, PointCursor, Points, PointsBuilder};
use crate::row_filter::{RowFilter, RowFilterState};
use crate::split_scan::{BatchSender, CloseOnDrop, TailSlot, TailStream, HELPER_BATCHES};
use crate::types::{array_value, table_schema, ColumnBuilder};
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::filter_pushdown::{
    ChildPushdownResult, FilterPushdownPhase, FilterPushdownPropagation, PushedDown,
};
use datafusion::physical_plan::metrics::{
    Count, ExecutionPlanMetricsSet, MetricBuilder, MetricValue, MetricsSet,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::{StreamExt, TryStreamExt};

/// Most key points an IN-list product may expand to before the scan falls
/// back to a range over the common prefix.
pub const MAX_POINTS: usize = 1024;
/// Rows in a scan's first batch: small, so that the first rows reach the
/// plan soon.
const FIRST_BATCH_ROWS: usize = 1024;
/// A long scan is split (see `Tail`) once it has read this much, counted
/// in rows read plus [`JUMP_COST`] per jump over a row tree's children.
const SPLIT_AFTER: u64 = 1024;
/// A jump's cost counted in rows read one after another: a jump to the
/// next row tree searches a B-tree leaf on another page (≈0.3 µs a parent
/// row against ≈0.09 µs a row read in order, measured on the locality
/// benchmark's parent-only scans), so a parent-only scan of an interleaved
/// table splits after 256 rows, not 1 024.
const JUMP_COST: u64 = 3;
/// Most output columns a row-filtered scan decodes in the same walk over
/// the row as the filter's tests (their values wait on the stack until the
/// row passes); a wider one walks the row twice.
const INLINE_COLUMNS: usize = 16;
/// Rows in every later batch (the session's DataFusion batch size): each
/// batch crosses a channel to another thread, so fewer, larger batches
/// cost fewer thread wake-ups per row.
const BATCH_ROWS: usize = 8192;

/// The transaction a statement runs in, shared with the providers it plans.
pub type TxnHandle = Arc<Mutex<Transaction>>;

/// A key range `[start, end)` over logical keys; `end = None` is unbounded.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct KeyRange {
    pub start: Vec<u8>,
    pub end: Option<Vec<u8>>,
}

/// What a scan reads: the table's ancestry (root first), the key ranges in
/// key order, and the columns (indices into `table.columns`) to return.
#[derive(Clone, Debug)]
pub struct ScanRequest {
    pub chain: Vec<Table>,
    pub ranges: Vec<KeyRange>,
    pub columns: Vec<usize>,
    pub limit: Option<usize>,
    /// Predicates tested on each row's bytes before it is decoded (see
    /// [`crate::row_filter`]).
    pub filter: Option<Arc<RowFilter>>,
    /// Every key in the ranges is a row of the chain's one table: it is a
    /// root (or a global index) and nothing is interleaved in it. Then a
    /// scan need not parse each key to tell its rows from other entries.
    pub alone: bool,
}

/// The key-range plan derived from a set of filters.
struct RangePlan {
    ranges: Vec<KeyRange>,
    /// Which of the input filters the ranges enforce completely.
    exact: Vec<bool>,
    /// Leading key columns fixed by `=`/`IN`, and how many points their
    /// product makes.
    eq_depth: usize,
    points: usize,
    /// Bounds (0, 1 or 2) on the next key column.
    bounds: usize,
    /// The consumed predicates, for EXPLAIN.
    describe: Vec<String>,
}

impl RangePlan {
    fn narrows(&self) -> bool {
        self.eq_depth > 0 || self.bounds > 0
    }

    /// Estimated fraction of the key space the ranges cover, without
    /// statistics: each fixed column keeps a tenth (times its IN-list
    /// length), a one-sided range a third, a two-sided range a tenth. With
    /// the first `unique` key columns fixed, a point is one row.
    fn selectivity(&self, unique: usize) -> f64 {
        if self.eq_depth >= unique {
            return self.points as f64 * 1e-7;
        }
        let f = (self.points as f64 * 0.1f64.powi(self.eq_depth as i32)).min(1.0);
        f * match self.bounds {
            0 => 1.0,
            1 => 0.3,
            _ => 0.1,
        }
    }
}

/// Relative cost of fetching a base row by key for each index entry,
/// against reading one row in key order.
const FETCH_COST: f64 = 4.0;
/// Relative cost of reading a row that has rows interleaved below it (a
/// jump past them to the next row tree: the row read plus [`JUMP_COST`]),
/// against reading one row in key order.
const ROW_TREE_COST: f64 = 1.0 + JUMP_COST as f64;

/// What a scan reads: the primary key, or an index of the table.
struct Access {
    /// Position in `SpindleTable::indexes`; `None` for the primary key.
    index: Option<usize>,
    plan: RangePlan,
    covering: bool,
}

/// A `FORCE_INDEX` hint on one table reference.
#[derive(Clone, Debug, PartialEq)]
pub enum Forced {
    Nothing,
    BaseTable,
    Index(String),
}

/// A Spindle table as DataFusion reads it in one transaction.
pub struct SpindleTable {
    shape: TableShape,
    txn: TxnHandle,
    /// Filters reported exact to DataFusion in every call while the
    /// query was optimized (`supports_filters_pushdown`, by the general
    /// rule or a template's, `TableShape::template_pushdown`): DataFusion
    /// dropped each, so a template's scan must enforce every one
    /// ([`crate::params`]).
    claimed: Mutex<Vec<Expr>>,
    /// Every filter with parameters asked about while the query was
    /// optimized, columns unqualified: a template's path is chosen for all
    /// of them (`supports_filters_pushdown`).
    asked: Mutex<Vec<Expr>>,
}

impl std::ops::Deref for SpindleTable {
    type Target = TableShape;
    fn deref(&self) -> &TableShape {
        &self.shape
    }
}

impl std::ops::DerefMut for SpindleTable {
    fn deref_mut(&mut self) -> &mut TableShape {
        &mut self.shape
    }
}

/// What planning a scan of a table needs, apart from the transaction it
/// reads in: a kept plan's scan template holds it
/// ([`crate::params`]).
#[derive(Clone)]
pub struct TableShape {
    table: Table,
    chain: Vec<Table>,
    schema: SchemaRef,
    /// Indices into `table.columns` of the schema's fields.
    visible: Vec<usize>,
    indexes: Vec<Arc<IndexPlan>>,
    forced: Forced,
    /// The table is a root with nothing interleaved in it
    /// ([`ScanRequest::alone`]).
    alone: bool,
    /// Rows (of other tables, or an interleaved index's entries) are
    /// interleaved below the table's rows: its scans jump past them.
    has_row_trees: bool,
}

impl fmt::Debug for SpindleTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SpindleTable({})", self.table.name)
    }
}

impl SpindleTable {
    pub fn new(
        catalog: &Catalog,
        table: &Table,
        txn: TxnHandle,
        include_hidden: bool,
    ) -> crate::Result<Self> {
        let chain: Vec<Table> = catalog
            .ancestry(&table.name)?
            .into_iter()
            .cloned()
            .collect();
        let visible = (0..table.columns.len())
            .filter(|i| include_hidden || !table.columns[*i].hidden)
            .collect();
        let indexes = IndexPlan::for_table(catalog, &table.name)?
            .into_iter()
            .map(Arc::new)
            .collect();
        let has_row_trees = catalog.has_interleaved(&table.name);
        let alone = chain.len() == 1 && !has_row_trees;
        Ok(SpindleTable {
            shape: TableShape {
                alone,
                has_row_trees,
                table: table.clone(),
                chain,
                schema: table_schema(table, include_hidden),
                visible,
                indexes,
                forced: Forced::Nothing,
            },
            txn,
            claimed: Mutex::new(Vec::new()),
            asked: Mutex::new(Vec::new()),
        })
    }

    /// Records the filters reported exact (see `claimed`).
    fn claim<'a>(
        &self,
        filters: impl Iterator<Item = &'a Expr>,
        told: &[TableProviderFilterPushDown],
    ) -> datafusion::error::Result<()> {
        let mut claimed = self
            .claimed
            .lock()
            .map_err(|_| DataFusionError::Internal("claimed filters lock poisoned".into()))?;
        for (f, t) in filters.zip(told) {
            let f = unqualified(f);
            if *t == TableProviderFilterPushDown::Exact && !claimed.contains(&f) {
                claimed.push(f);
            }
        }
        Ok(())
    }

    /// Forces an index (or `_base_table`) for this table reference.
    pub fn force(mut self, index: &str) -> crate::Result<Self> {
        if index == "_base_table" {
            self.forced = Forced::BaseTable;
            return Ok(self);
        }
        if !self.indexes.iter().any(|p| p.index.name == index) {
            return Err(crate::Error::UndefinedObject(format!(
                "index \"{index}\" named in FORCE_INDEX does not exist on table \"{}\"",
                self.table.name
            )));
        }
        self.forced = Forced::Index(index.to_string());
        Ok(self)
    }
}

impl TableShape {
    /// Whether every column in `columns` (indices into `table.columns`) is
    /// in the index's key or STORING columns.
    fn covers(&self, plan: &IndexPlan, columns: &[usize]) -> bool {
        let vt = plan.virtual_table();
        columns
            .iter()
            .all(|c| vt.column(&self.table.columns[*c].name).is_some())
    }

    /// Picks the access path: a forced index, or the cheapest of the
    /// primary key and the indexes whose leading columns the filters
    /// constrain. `columns` (unknown while DataFusion asks about filter
    /// pushdown) decides whether an index covers the query.
    ///
    /// A table with rows interleaved below its own costs [`ROW_TREE_COST`]
    /// a row (a jump per row tree), so a covering index whose entries lie
    /// alone in their key space (not interleaved) is a candidate even
    /// when the filters do not narrow it: a parent-only scan then reads
    /// the index's entries in order instead of seeking from row tree to
    /// row tree. The table's row copy (`Catalog::row_copy`) is such an
    /// index, except for reads the key confines to a few row trees.
    fn choose(&self, filters: &[&Expr], columns: Option<&[usize]>) -> crate::Result<Access> {
        let pk = plan_key_ranges(&self.chain, filters)?;
        // The key fixes the root's key columns: the read stays in that many
        // row trees.
        let confined = pk.eq_depth >= self.chain[0].primary_key.len();
        if self.forced == Forced::BaseTable {
            return Ok(Access {
                index: None,
                plan: pk,
                covering: true,
            });
        }
        let mut best = Access {
            covering: true,
            index: None,
            plan: pk,
        };
        let mut best_cost = self.base_cost(&best.plan);
        for (i, ip) in self.indexes.iter().enumerate() {
            let forced = self.forced == Forced::Index(ip.index.name.clone());
            if !forced && self.forced != Forced::Nothing {
                continue;
            }
            if ip.index.null_filtered && !excludes_nulls(filters, &ip.index.columns) {
                if forced {
                    return Err(crate::Error::Unsupported(format!(
                        "index \"{}\" is NULL_FILTERED, and the query does not exclude NULLs in {}; add `IS NOT NULL` conditions or remove the hint",
                        ip.index.name,
                        ip.index.columns.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join(", ")
                    )));
                }
                continue;
            }
            // A row copy serves reads across row trees; a read the key
            // confines to a few row trees reads them where they are (the
            // locality interleaving is for), jumping over few children.
            if ip.index.row_copy && !forced && confined {
                continue;
            }
            let plan = plan_key_ranges(&ip.chain, filters)?;
            let covering = columns.is_some_and(|c| self.covers(ip, c));
            let instead_of_row_trees = covering && self.has_row_trees && ip.chain.len() == 1;
            if !plan.narrows() && !forced && !instead_of_row_trees {
                continue;
            }
            let cost = index_cost(ip, &plan, covering);
            if forced || cost < best_cost {
                best_cost = cost;
                best = Access {
                    index: Some(i),
                    plan,
                    covering,
                };
                if forced {
                    break;
                }
            }
        }
        Ok(best)
    }

    /// The estimated cost of reading the table's own keys in `plan`'s ranges.
    fn base_cost(&self, plan: &RangePlan) -> f64 {
        plan.selectivity(self.table.primary_key.len())
            * if self.has_row_trees {
                ROW_TREE_COST
            } else {
                1.0
            }
    }
}

/// The estimated cost of reading index `ip`'s entries in `plan`'s ranges
/// (and each entry's base row, when the index does not cover the query).
fn index_cost(ip: &IndexPlan, plan: &RangePlan, covering: bool) -> f64 {
    let unique = if ip.index.unique {
        ip.index.columns.len()
    } else {
        ip.virtual_table().primary_key.len()
    };
    plan.selectivity(unique) * if covering { 1.0 } else { FETCH_COST } + 1e-9
}

/// The estimated cost [`SpindleTable::choose`] gives an index read whose
/// WHERE fixes `eq` leading key columns of the index by `=` (one point)
/// and bounds the next one `bounds` ways, for the fast path's choice of
/// the same index ([`crate::fastpath`]).
pub(crate) fn index_read_cost(ip: &IndexPlan, eq: usize, bounds: usize, covering: bool) -> f64 {
    let plan = RangePlan {
        ranges: Vec::new(),
        exact: Vec::new(),
        eq_depth: eq,
        points: 1,
        bounds,
        describe: Vec::new(),
    };
    index_cost(ip, &plan, covering)
}

/// The estimated cost [`SpindleTable::choose`] gives reading a table's own
/// keys with its first `eq` key columns (of `key_len`) fixed by `=` (one
/// point), for the fast path's choice between them and an index
/// ([`crate::tree_join`]).
pub(crate) fn key_read_cost(key_len: usize, eq: usize, has_row_trees: bool) -> f64 {
    let plan = RangePlan {
        ranges: Vec::new(),
        exact: Vec::new(),
        eq_depth: eq,
        points: 1,
        bounds: 0,
        describe: Vec::new(),
    };
    plan.selectivity(key_len) * full_read_cost(has_row_trees)
}

/// The estimated cost [`SpindleTable::choose`] gives reading all of a
/// table's own keys (a WHERE that does not narrow its primary key).
pub(crate) fn full_read_cost(has_row_trees: bool) -> f64 {
    if has_row_trees {
        ROW_TREE_COST
    } else {
        1.0
    }
}

/// Key columns of a chain's last table: name, direction, Arrow type.
fn key_types(table: &Table) -> Vec<(String, Direction, datafusion::arrow::datatypes::DataType)> {
    table
        .primary_key
        .iter()
        .map(|k| {
            let ty = table
                .column(&k.name)
                .map(|c| crate::types::arrow_type(&c.data_type));
            (
                k.name.clone(),
                k.direction,
                ty.unwrap_or(datafusion::arrow::datatypes::DataType::Null),
            )
        })
        .collect()
}

/// Key ranges over the keys of `chain`'s last table (a table, or an
/// index's virtual table) that contain every row the filters accept.
fn plan_key_ranges(chain_owned: &[Table], filters: &[&Expr]) -> crate::Result<RangePlan> {
    let last = chain_owned
        .last()
        .ok_or_else(|| crate::Error::Internal("empty chain".into()))?;
    let keys = key_types(last);
    let mut exact = vec![false; filters.len()];
    let chain: Vec<&Table> = chain_owned.iter().collect();
    let mut describe = Vec::new();
    // Step 1: equality / IN prefix.
    let mut points: Vec<Vec<Value>> = vec![vec![]];
    let mut depth = 0;
    for (name, _, ty) in &keys {
        let mut found = None;
        for (i, f) in filters.iter().enumerate() {
            if let Some(vals) = equality_values(f, name, ty) {
                found = Some((i, vals));
                break;
            }
        }
        let Some((i, mut vals)) = found else { break };
        vals.sort();
        vals.dedup();
        if points.len() * vals.len() > MAX_POINTS {
            break;
        }
        points = points
            .iter()
            .flat_map(|p| {
                vals.iter().map(move |v| {
                    let mut q = p.clone();
                    q.push(v.clone());
                    q
                })
            })
            .collect();
        exact[i] = true;
        depth += 1;
        let texts: Vec<String> = vals.iter().map(value_text).collect();
        describe.push(if texts.len() == 1 {
            format!("{name} = {}", texts[0])
        } else {
            format!("{name} IN ({})", texts.join(", "))
        });
    }
    // Step 2: range on the next key column.
    let mut lower: Option<(Value, bool)> = None;
    let mut upper: Option<(Value, bool)> = None;
    if let Some((name, _, ty)) = keys.get(depth) {
        for (i, f) in filters.iter().enumerate() {
            for (op, v) in range_bounds(f, name, ty) {
                match op {
                    Operator::Gt | Operator::GtEq => {
                        let inclusive = op == Operator::GtEq;
                        if lower
                            .as_ref()
                            .is_none_or(|(l, li)| v > *l || (v == *l && !inclusive && *li))
                        {
                            lower = Some((v, inclusive));
                        }
                    }
                    _ => {
                        let inclusive = op == Operator::LtEq;
                        if upper
                            .as_ref()
                            .is_none_or(|(u, ui)| v < *u || (v == *u && !inclusive && *ui))
                        {
                            upper = Some((v, inclusive));
                        }
                    }
                }
                exact[i] = true;
            }
        }
    }
    let has_range = lower.is_some() || upper.is_some();
    let bounds = lower.is_some() as usize + upper.is_some() as usize;
    if let Some((name, _, _)) = keys.get(depth) {
        if let Some((v, inclusive)) = &lower {
            let op = if *inclusive { ">=" } else { ">" };
            describe.push(format!("{name} {op} {}", value_text(v)));
        }
        if let Some((v, inclusive)) = &upper {
            let op = if *inclusive { "<=" } else { "<" };
            describe.push(format!("{name} {op} {}", value_text(v)));
        }
    }
    let npoints = points.len();
    let mut ranges = Vec::with_capacity(points.len());
    for p in &points {
        let prefix = self_catalog_prefix(&chain, p, true)?;
        if !has_range {
            ranges.push(KeyRange {
                end: prefix_end(&prefix),
                start: prefix,
            });
            continue;
        }
        let dir = keys[depth].1;
        let enc = |v: &Value| -> crate::Result<Vec<u8>> {
            let mut q = p.clone();
            q.push(v.clone());
            self_catalog_prefix(&chain, &q, false)
        };
        let after = |v: &Value| -> crate::Result<Option<Vec<u8>>> { Ok(prefix_end(&enc(v)?)) };
        // Map the value interval (NULL excluded) to key space.
        let (lo_val, hi_val) = match dir {
            Direction::Asc => (&lower, &upper),
            Direction::Desc => (&upper, &lower),
        };
        let start = match lo_val {
            Some((v, true)) => enc(v)?,
            Some((v, false)) => match after(v)? {
                Some(k) => k,
                None => continue,
            },
            None if dir == Direction::Asc => match after(&Value::Null)? {
                Some(k) => k,
                None => continue,
            },
            None => prefix.clone(),
        };
        let end = match hi_val {
            Some((v, true)) => after(v)?,
            Some((v, false)) => Some(enc(v)?),
            None if dir == Direction::Desc => Some(enc(&Value::Null)?),
            None => prefix_end(&prefix),
        };
        if end.as_ref().is_some_and(|e| *e <= start) {
            continue;
        }
        ranges.push(KeyRange { start, end });
    }
    ranges.sort();
    Ok(RangePlan {
        ranges,
        exact,
        eq_depth: depth,
        points: npoints,
        bounds,
        describe,
    })
}

pub(crate) fn value_text(v: &Value) -> String {
    match v {
        Value::String(s) => format!("'{}'", s.replace('\'', "''")),
        other => crate::types::value_to_text(other).unwrap_or_else(|| "NULL".into()),
    }
}

/// Whether the filters reject rows with NULL in any of `columns` (each
/// column is compared, tested with IN/BETWEEN/LIKE or IS NOT NULL, all of
/// which are never true for NULL).
fn excludes_nulls(filters: &[&Expr], columns: &[spindle_catalog::KeyColumn]) -> bool {
    columns
        .iter()
        .all(|c| filters.iter().any(|f| rejects_null(f, &c.name)))
}

fn rejects_null(f: &Expr, name: &str) -> bool {
    let is_col = |e: &Expr| column_name(e) == Some(name);
    match f {
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => match op {
            Operator::Eq
            | Operator::NotEq
            | Operator::Lt
            | Operator::LtEq
            | Operator::Gt
            | Operator::GtEq => is_col(left) || is_col(right),
            Operator::And => rejects_null(left, name) || rejects_null(right, name),
            _ => false,
        },
        Expr::IsNotNull(e) => is_col(e),
        Expr::InList(l) => is_col(&l.expr),
        Expr::Between(b) => is_col(&b.expr),
        Expr::Like(l) => is_col(&l.expr),
        _ => false,
    }
}

fn self_catalog_prefix(
    chain: &[&Table],
    prefix: &[Value],
    descend: bool,
) -> crate::Result<Vec<u8>> {
    // `Catalog::encode_key_prefix` only needs the chain.
    Catalog::new()
        .encode_key_prefix(chain, prefix, descend)
        .map_err(|e| match e {
            spindle_catalog::KeyError::Catalog(c) => c.into(),
            spindle_catalog::KeyError::Key(k) => k.into(),
        })
}

/// Converts a literal to a key value if its type is exactly the column's.
pub(crate) fn literal_value(
    s: &ScalarValue,
    ty: &datafusion::arrow::datatypes::DataType,
) -> Option<Value> {
    use datafusion::arrow::datatypes::DataType as A;
    // The common key types directly (a join's keys convert thousands of
    // values per scan), the rest through a one-element array.
    match (s, ty) {
        (ScalarValue::Int64(Some(v)), A::Int64) => return Some(Value::Int64(*v)),
        (
            ScalarValue::Utf8(Some(v))
            | ScalarValue::Utf8View(Some(v))
            | ScalarValue::LargeUtf8(Some(v)),
            A::Utf8,
        ) => return Some(Value::String(v.clone())),
        (ScalarValue::Date32(Some(v)), A::Date32) => return Some(Value::Date(*v)),
        _ => {}
    }
    let lit_ty = s.data_type();
    let same = lit_ty == *ty
        || (matches!(ty, A::Utf8) && matches!(lit_ty, A::Utf8View | A::LargeUtf8))
        || (matches!(ty, A::Timestamp(u, _) if matches!(lit_ty, A::Timestamp(v, _) if v == *u)));
    if !same || s.is_null() {
        return None;
    }
    let arr = s.to_array().ok()?;
    array_value(arr.as_ref(), 0).ok()
}

fn column_name(e: &Expr) -> Option<&str> {
    match e {
        Expr::Column(c) => Some(c.name.as_str()),
        _ => None,
    }
}

/// `col = lit`, `lit = col`, `col IN (lits)` or an OR of those on column
/// `name`.
fn equality_values(
    f: &Expr,
    name: &str,
    ty: &datafusion::arrow::datatypes::DataType,
) -> Option<Vec<Value>> {
    match f {
        Expr::BinaryExpr(BinaryExpr {
            left,
            op: Operator::Eq,
            right,
        }) => {
            let (c, l) = match (left.as_ref(), right.as_ref()) {
                (c @ Expr::Column(_), Expr::Literal(l, _))
                | (Expr::Literal(l, _), c @ Expr::Column(_)) => (c, l),
                _ => return None,
            };
            (column_name(c) == Some(name))
                .then(|| literal_value(l, ty))
                .flatten()
                .map(|v| vec![v])
        }
        // DataFusion rewrites short IN lists to `c = a OR c = b`.
        Expr::BinaryExpr(BinaryExpr {
            left,
            op: Operator::Or,
            right,
        }) => {
            let mut vals = equality_values(left, name, ty)?;
            vals.extend(equality_values(right, name, ty)?);
            Some(vals)
        }
        Expr::InList(list) if !list.negated && column_name(&list.expr) == Some(name) => list
            .list
            .iter()
            .map(|e| match e {
                Expr::Literal(l, _) => literal_value(l, ty),
                _ => None,
            })
            .collect(),
        _ => None,
    }
}

/// Range comparisons on column `name`, normalized to `col op value`.
fn range_bounds(
    f: &Expr,
    name: &str,
    ty: &datafusion::arrow::datatypes::DataType,
) -> Vec<(Operator, Value)> {
    match f {
        Expr::BinaryExpr(BinaryExpr { left, op, right })
            if matches!(
                op,
                Operator::Lt | Operator::LtEq | Operator::Gt | Operator::GtEq
            ) =>
        {
            let (op, c, l) = match (left.as_ref(), right.as_ref()) {
                (c @ Expr::Column(_), Expr::Literal(l, _)) => (*op, c, l),
                (Expr::Literal(l, _), c @ Expr::Column(_)) => match op.swap() {
                    Some(o) => (o, c, l),
                    None => return vec![],
                },
                _ => return vec![],
            };
            if column_name(c) != Some(name) {
                return vec![];
            }
            literal_value(l, ty)
                .map(|v| vec![(op, v)])
                .unwrap_or_default()
        }
        Expr::Between(b) if !b.negated && column_name(&b.expr) == Some(name) => {
            match (b.low.as_ref(), b.high.as_ref()) {
                (Expr::Literal(lo, _), Expr::Literal(hi, _)) => {
                    match (literal_value(lo, ty), literal_value(hi, ty)) {
                        (Some(lo), Some(hi)) => vec![(Operator::GtEq, lo), (Operator::LtEq, hi)],
                        _ => vec![],
                    }
                }
                _ => vec![],
            }
        }
        _ => vec![],
    }
}

#[async_trait]
impl TableProvider for SpindleTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> datafusion::error::Result<Vec<TableProviderFilterPushDown>> {
        if filters
            .iter()
            .any(|f| crate::params::any_placeholder(std::slice::from_ref(*f)))
        {
            // The path is chosen for every filter asked about so far, not
            // for these alone: DataFusion asks again about the filters it
            // kept (`V > $2` without the `A = $1` it dropped), and the scan
            // will get them all; on its own, `V > $2` would choose an
            // index on V and be told exact where the final path (by A)
            // does not enforce it.
            let owned: Vec<Expr> = filters.iter().map(|f| unqualified(f)).collect();
            let asked = {
                let mut asked = self
                    .asked
                    .lock()
                    .map_err(|_| DataFusionError::Internal("asked filters lock poisoned".into()))?;
                for f in &owned {
                    if !asked.contains(f) {
                        asked.push(f.clone());
                    }
                }
                asked.clone()
            };
            let all = self.template_pushdown(&asked)?;
            let told: Vec<TableProviderFilterPushDown> = owned
                .iter()
                .map(|f| {
                    asked
                        .iter()
                        .position(|a| a == f)
                        .and_then(|i| all.get(i).cloned())
                        .unwrap_or(TableProviderFilterPushDown::Inexact)
                })
                .collect();
            self.claim(owned.iter(), &told)?;
            return Ok(told);
        }
        let access = self.choose(filters, None).map_err(external)?;
        // The scan may still pick another path once it knows the projected
        // columns (a covering index): filters are exact only on the
        // primary-key path with no index in contention. With rows
        // interleaved below the table's, an index alone in its key space
        // is in contention when, covering, it would cost less than the
        // key ranges (`choose`) — not against a key point or a narrow
        // range, whose filters stay exact (and a LIMIT goes into the scan).
        // The row copy is keyed like the table, so its key ranges enforce
        // the same filters: it contends with nothing.
        let primary = plan_key_ranges(&self.chain, filters).map_err(external)?;
        let mut base = self.base_cost(&primary);
        // What the table's rows cost read from its row copy, where `choose`
        // would read them there: another index must cost less than that.
        if primary.eq_depth < self.chain[0].primary_key.len() {
            if let Some(ip) = self.indexes.iter().find(|ip| ip.index.row_copy) {
                let p = plan_key_ranges(&ip.chain, filters).map_err(external)?;
                base = base.min(index_cost(ip, &p, true));
            }
        }
        let copy = |i: usize| self.indexes.get(i).is_some_and(|ip| ip.index.row_copy);
        let contested = access.index.is_some_and(|i| !copy(i))
            || (self.forced == Forced::Nothing
                && self
                    .indexes
                    .iter()
                    .filter(|ip| !ip.index.row_copy)
                    .any(|ip| {
                        plan_key_ranges(&ip.chain, filters).is_ok_and(|p| {
                            p.narrows()
                                || (self.has_row_trees
                                    && ip.chain.len() == 1
                                    && index_cost(ip, &p, true) < base)
                        })
                    }));
        let told: Vec<TableProviderFilterPushDown> = primary
            .exact
            .iter()
            .map(|e| {
                if *e && !contested {
                    TableProviderFilterPushDown::Exact
                } else {
                    TableProviderFilterPushDown::Inexact
                }
            })
            .collect();
        self.claim(filters.iter().copied(), &told)?;
        Ok(told)
    }

    async fn scan(
        &self,
        _state: &dyn DfSession,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        if crate::params::any_placeholder(filters) {
            // A kept plan's template ([`crate::params`]): planned with
            // stand-ins for the parameters, bound to no transaction (its
            // ranges are not the ones it will read).
            let mgr = self
                .txn
                .lock()
                .map_err(|_| DataFusionError::Internal("transaction lock poisoned".into()))?
                .manager()
                .clone();
            let template = ScanTemplate {
                shape: self.shape.clone(),
                projection: projection.cloned(),
                filters: filters.to_vec(),
                limit,
            };
            let stand_ins = crate::params::with_stand_ins(filters)?;
            let (mut scan, signature) = self.shape.parts(projection, &stand_ins, limit)?;
            // DataFusion dropped every filter it was told is exact, in
            // whichever call (it asks again about the filters it kept,
            // and their set decides the path): the access path chosen
            // now, knowing the projection, must enforce each of them, or
            // the template is declined.
            let claimed = self
                .claimed
                .lock()
                .map_err(|_| DataFusionError::Internal("claimed filters lock poisoned".into()))?;
            let unqualified: Vec<Expr> = filters.iter().map(unqualified).collect();
            let enforced = claimed.iter().all(|c| {
                unqualified
                    .iter()
                    .position(|f| f == c)
                    .is_some_and(|i| signature.exact.get(i).copied().unwrap_or(false))
            });
            drop(claimed);
            if !enforced {
                return Err(DataFusionError::Plan(
                    "a template's scan does not enforce a filter it reported exact".into(),
                ));
            }
            scan.template = Some(Arc::new((template, signature)));
            return Ok(Arc::new(scan.unbound(mgr)?));
        }
        let (scan, _) = self.shape.parts(projection, filters, limit)?;
        Ok(Arc::new(scan.bind(&self.txn)?))
    }
}

impl TableShape {
    /// `supports_filters_pushdown` for filters with parameters (a
    /// template, [`crate::params`]): each parameter stands in as a value
    /// of its type, and a filter is exact when the ranges of the access
    /// path chosen without knowing the projection enforce it. The scan
    /// (`SpindleTable::scan`) checks that the path it then chooses
    /// enforces every one of those, and fails the template's planning
    /// otherwise (the query is then planned with its values). Unlike the
    /// general rule, a filter an index enforces is exact: a template
    /// reading through an index plans its `$n` in the scan alone.
    fn template_pushdown(
        &self,
        filters: &[Expr],
    ) -> datafusion::error::Result<Vec<TableProviderFilterPushDown>> {
        let stand_ins = crate::params::with_stand_ins(filters)?;
        let refs: Vec<&Expr> = stand_ins.iter().collect();
        let access = self.choose(&refs, None).map_err(external)?;
        Ok((0..filters.len())
            .map(|i| {
                if access.plan.exact.get(i).copied().unwrap_or(false) {
                    TableProviderFilterPushDown::Exact
                } else {
                    TableProviderFilterPushDown::Inexact
                }
            })
            .collect())
    }

    /// What a scan of the table's `projection` under `filters` (with at
    /// most `limit` rows) reads and how, and the decisions that shaped it
    /// ([`ScanSignature`]).
    fn parts(
        &self,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> datafusion::error::Result<(ScanParts, ScanSignature)> {
        let refs: Vec<&Expr> = filters.iter().collect();
        let fields: Vec<usize> = match projection {
            Some(p) => p.clone(),
            None => (0..self.visible.len()).collect(),
        };
        let columns: Vec<usize> = fields.iter().map(|i| self.visible[*i]).collect();
        let schema = Arc::new(self.schema.project(&fields)?);
        let access = self.choose(&refs, Some(&columns)).map_err(external)?;
        let index = access.index.map(|i| self.indexes[i].clone());
        // The filters the key ranges do not enforce, for the row filter.
        let unenforced: Vec<&Expr> = refs
            .iter()
            .zip(access.plan.exact.iter().chain(std::iter::repeat(&false)))
            .filter(|(_, exact)| !**exact)
            .map(|(f, _)| *f)
            .collect();
        // What is scanned: the table's keys, or the index's entries.
        let (scan_chain, scan_columns, fetch) = match &index {
            None => (self.chain.clone(), columns.clone(), None),
            Some(ip) if access.covering => {
                let vt = ip.virtual_table();
                let cols = columns
                    .iter()
                    .map(|c| {
                        vt.column_index(&self.table.columns[*c].name)
                            .ok_or_else(|| {
                                DataFusionError::Internal("covering index lacks a column".into())
                            })
                    })
                    .collect::<datafusion::error::Result<Vec<_>>>()?;
                (ip.chain.clone(), cols, None)
            }
            Some(ip) => {
                // Read the base-table key from each entry, then the row.
                let vt = ip.virtual_table();
                let pk_cols = self
                    .table
                    .primary_key
                    .iter()
                    .map(|k| {
                        vt.column_index(&k.name).ok_or_else(|| {
                            DataFusionError::Internal("index entry lacks a key column".into())
                        })
                    })
                    .collect::<datafusion::error::Result<Vec<_>>>()?;
                let base = ScanRequest {
                    chain: self.chain.clone(),
                    ranges: vec![],
                    columns: columns.clone(),
                    limit,
                    filter: RowFilter::plan(&self.table, &unenforced).map(Arc::new),
                    // Base rows are fetched by key, one at a time.
                    alone: false,
                };
                (ip.chain.clone(), pk_cols, Some(base))
            }
        };
        // The row filter tests the rows decoded into the output: the
        // scanned table's, a covering index's entries, or (an index fetch)
        // the base rows, whose request carries it instead.
        let filter = match (&fetch, scan_chain.last()) {
            (None, Some(t)) => RowFilter::plan(t, &unenforced).map(Arc::new),
            _ => None,
        };
        let request = ScanRequest {
            // An index's entries are alone in its key space unless it is
            // interleaved in a table (then its chain is that table's too).
            alone: match &index {
                None => self.alone,
                Some(_) => scan_chain.len() == 1,
            },
            chain: scan_chain,
            ranges: access.plan.ranges.clone(),
            columns: scan_columns,
            limit,
            filter,
        };
        // Rows come out in the order of the scanned keys: declare the
        // ordering of the longest prefix of key columns that is projected.
        let key_owner = request.chain.last().unwrap_or(&self.table);
        let mut sort = Vec::new();
        for k in &key_owner.primary_key {
            let Some(ci) = self.table.column_index(&k.name) else {
                break;
            };
            let Some(pos) = columns.iter().position(|c| *c == ci) else {
                break;
            };
            let descending = k.direction == Direction::Desc;
            sort.push(PhysicalSortExpr::new(
                Arc::new(PhysColumn::new(&self.table.columns[ci].name, pos)),
                SortOptions {
                    descending,
                    nulls_first: !descending,
                },
            ));
        }
        let ordering: Vec<LexOrdering> = LexOrdering::new(sort).into_iter().collect();
        let describe = {
            let path = match &index {
                None if access.plan.narrows() => "primary key".to_string(),
                None => "full scan".to_string(),
                Some(ip) if ip.index.row_copy => "row copy".to_string(),
                Some(ip) => format!(
                    "index {}{}",
                    ip.index.name,
                    if access.covering {
                        " (covering)"
                    } else {
                        " then base rows by key"
                    }
                ),
            };
            let preds = if access.plan.describe.is_empty() {
                String::new()
            } else {
                format!(" where {}", access.plan.describe.join(" AND "))
            };
            let tested = match (&request.filter, &fetch) {
                (Some(f), _)
                | (
                    None,
                    Some(ScanRequest {
                        filter: Some(f), ..
                    }),
                ) => {
                    format!(" row filter: {}", f.describe())
                }
                _ => String::new(),
            };
            format!(
                "table={} access={path}{preds} ranges={}{tested}",
                self.table.name,
                request.ranges.len()
            )
        };
        let mut root = Vec::new();
        spindle_keys::key::encode_table_prefix(&mut root, self.chain[0].id);
        // The output column of the scanned keys' leading column, which a
        // join's keys may turn into points (not through an index fetch:
        // its points would be index keys).
        let lead_key = key_owner
            .primary_key
            .first()
            .and_then(|k| self.table.column_index(&k.name))
            .and_then(|ci| columns.iter().position(|c| *c == ci))
            .filter(|_| fetch.is_none())
            .map(|pos| (pos, schema.field(pos).data_type().clone()));
        let scan = ScanParts {
            schema,
            request,
            fetch,
            root,
            ordering,
            limit,
            describe,
            lead_key,
            properties: None,
            template: None,
        };
        let signature = ScanSignature {
            index: access.index,
            covering: access.covering,
            exact: access.plan.exact.clone(),
            splits: may_split(&scan.request, scan.fetch.is_some()),
        };
        Ok((scan, signature))
    }
}

/// `e` with its columns unqualified, as a scan receives its filters
/// (DataFusion asks about pushdown with `t.c`, and scans with `c`).
fn unqualified(e: &Expr) -> Expr {
    e.clone()
        .transform_up(|e| {
            Ok(match e {
                Expr::Column(c) if c.relation.is_some() => Transformed::yes(Expr::Column(
                    datafusion::common::Column::new_unqualified(c.name),
                )),
                e => Transformed::no(e),
            })
        })
        .map(|t| t.data)
        // The rewrite cannot fail; an expression it did not rewrite is
        // compared as it is (a mismatch declines the template).
        .unwrap_or_else(|_| e.clone())
}

/// What a [`SpindleScanExec`] is made from, apart from the transaction:
/// kept so that a cached plan can run again in another transaction
/// ([`SpindleScanExec::rebind`]).
#[derive(Debug, Clone)]
struct ScanParts {
    schema: SchemaRef,
    request: ScanRequest,
    /// A non-covering index scan's base-table request.
    fetch: Option<ScanRequest>,
    /// The key prefix of the chain's root table (the point reader's range).
    root: Vec<u8>,
    ordering: Vec<LexOrdering>,
    limit: Option<usize>,
    describe: String,
    /// The output position and type of the scanned keys' leading column.
    lead_key: Option<(usize, datafusion::arrow::datatypes::DataType)>,
    /// The scan's plan properties, made at its first binding and shared
    /// by every later one: a re-bound scan has the same schema, ordering
    /// and partitions, and the same `Arc` tells the nodes above it so
    /// (`has_same_children_properties` compares pointers), so that
    /// re-binding a kept plan rebuilds them without recomputing their
    /// own properties (equivalences, orderings: about a sixth of a small
    /// aggregate's time on the connection's thread, bench/README.md,
    /// session 39).
    properties: Option<Arc<PlanProperties>>,
    /// How to plan the scan again for other parameter values, when it
    /// is part of a kept plan's template ([`crate::params`]), with the
    /// decisions it was planned with.
    template: Option<Arc<(ScanTemplate, ScanSignature)>>,
}

/// A scan planned from filters with parameters (`$1`, …): what it is
/// planned again from once their values are known.
#[derive(Clone)]
pub(crate) struct ScanTemplate {
    shape: TableShape,
    projection: Option<Vec<usize>>,
    filters: Vec<Expr>,
    limit: Option<usize>,
}

impl fmt::Debug for ScanTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ScanTemplate({})", self.shape.table.name)
    }
}

/// The decisions that shape a scan's place in a plan: the access path,
/// which filters its ranges enforce (DataFusion dropped those it was told
/// are exact), and whether it may split into two partitions. A template's
/// scan planned again for parameter values may stand in the kept plan
/// only with the same signature as the template's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ScanSignature {
    index: Option<usize>,
    covering: bool,
    exact: Vec<bool>,
    splits: bool,
}

impl ScanParts {
    /// The scan in `txn`: a snapshot of each range (recorded as the
    /// transaction's reads) and, for a non-covering index scan, a reader of
    /// base rows.
    fn bind(self, txn: &TxnHandle) -> datafusion::error::Result<SpindleScanExec> {
        let (snapshots, reader, mgr) = {
            let txn = txn
                .lock()
                .map_err(|_| DataFusionError::Internal("transaction lock poisoned".into()))?;
            let snaps: Vec<Snapshot> = self
                .request
                .ranges
                .iter()
                .map(|r| txn.snapshot(&r.start, r.end.as_deref()))
                .collect();
            let reader = self.fetch.as_ref().map(|_| {
                let end = prefix_end(&self.root);
                txn.point_reader(&self.root, end.as_deref())
            });
            (snaps, reader, txn.manager().clone())
        };
        let stream = ScanStream {
            schema: self.schema.clone(),
            request: self.request.clone(),
            snapshots: Some(snapshots),
            mgr,
            fetch: self.fetch.clone().zip(reader),
            tail: None,
            counters: ScanCounters::default(),
        };
        self.with_stream(stream)
    }

    /// The scan holding no snapshot or reader of any transaction (what a
    /// kept plan holds: nothing of the transaction that planned it stays
    /// alive with it); it must be bound before it runs.
    fn unbound(self, mgr: Arc<TxnManager>) -> datafusion::error::Result<SpindleScanExec> {
        let stream = ScanStream {
            schema: self.schema.clone(),
            request: self.request.clone(),
            snapshots: None,
            mgr,
            fetch: None,
            tail: None,
            counters: ScanCounters::default(),
        };
        self.with_stream(stream)
    }

    /// The scan as DataFusion runs it: one partition, or two when it may
    /// split (the far half is partition 1, see [`crate::split_scan`]).
    fn with_stream(mut self, mut stream: ScanStream) -> datafusion::error::Result<SpindleScanExec> {
        let mut partitions: Vec<Arc<dyn PartitionStream>> = Vec::with_capacity(2);
        if may_split(&self.request, self.fetch.is_some()) {
            let slot = Arc::new(TailSlot::default());
            stream.tail = Some(slot.clone());
            partitions.push(Arc::new(TailStream {
                schema: self.schema.clone(),
                slot,
            }));
        }
        let stream = Arc::new(stream);
        partitions.insert(0, stream.clone());
        let exec = StreamingTableExec::try_new(
            self.schema.clone(),
            partitions,
            None,
            self.ordering.clone(),
            false,
            self.limit,
        )?;
        let metrics = stream.counters.metrics();
        let properties = self
            .properties
            .get_or_insert_with(|| exec.properties().clone())
            .clone();
        Ok(SpindleScanExec {
            inner: Arc::new(exec),
            properties,
            stream,
            parts: self,
            join_keys: Vec::new(),
            metrics,
        })
    }
}

fn external(e: crate::Error) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

/// The leaf of every plan over a Spindle table: runs a streaming scan and
/// shows in EXPLAIN which path it takes (primary key, index, full scan),
/// the predicates that became key ranges, and how many ranges.
#[derive(Debug)]
pub struct SpindleScanExec {
    inner: Arc<StreamingTableExec>,
    /// `inner`'s properties, the same `Arc` in every binding of the scan
    /// (`ScanParts::properties`).
    properties: Arc<PlanProperties>,
    /// The one partition `inner` runs.
    stream: Arc<ScanStream>,
    parts: ScanParts,
    /// Dynamic filters of hash joins on the leading key column
    /// ([`crate::join_keys`]); read when the scan starts. Not kept across
    /// a re-bind: they belong to one execution of the plan's joins.
    join_keys: Vec<Arc<dyn PhysicalExpr>>,
    /// `output_rows`, and `join_key_points` when join keys restricted the
    /// scan (EXPLAIN ANALYZE shows them).
    metrics: ExecutionPlanMetricsSet,
}

impl SpindleScanExec {
    /// The EXPLAIN text, e.g. `table=t access=index t_a (covering) where a = 1 ranges=1`.
    pub fn describe(&self) -> &str {
        &self.parts.describe
    }

    /// Whether the scan reads a hash join's build keys by seeking
    /// ([`crate::join_keys`]).
    pub(crate) fn takes_join_keys(&self) -> bool {
        !self.join_keys.is_empty()
    }

    /// The same scan (ranges, columns, output order) in another
    /// transaction, which records the ranges as its reads.
    pub(crate) fn rebind(&self, txn: &TxnHandle) -> datafusion::error::Result<SpindleScanExec> {
        self.parts.clone().bind(txn)
    }

    /// [`SpindleScanExec::rebind`] for a template's scan: planned again
    /// with `params` (`$n` is `params[n - 1]`) in its filters. `None`
    /// when the values shape the scan otherwise than the template's
    /// stand-ins did ([`ScanSignature`]: a NULL, an IN list with repeated
    /// values, an empty range): then the kept plan does not fit them.
    /// A scan that is no template is re-bound as it is.
    pub(crate) fn rebind_with(
        &self,
        txn: &TxnHandle,
        params: &[ScalarValue],
    ) -> datafusion::error::Result<Option<SpindleScanExec>> {
        let Some(template) = &self.parts.template else {
            return self.rebind(txn).map(Some);
        };
        let (t, signature) = template.as_ref();
        let filters = crate::params::with_values(&t.filters, params)?;
        let (mut parts, again) = t.shape.parts(t.projection.as_ref(), &filters, t.limit)?;
        if again != *signature || parts.schema != self.parts.schema {
            return Ok(None);
        }
        // Same schema, ordering and partitions: the template's properties.
        parts.properties = self.parts.properties.clone();
        parts.template = Some(template.clone());
        parts.bind(txn).map(Some)
    }

    /// What this binding has read so far, counted as [`INLINE_BUDGET`]
    /// counts: entries read, plus [`JUMP_COST`] per jump over a row
    /// tree's children.
    pub(crate) fn read_cost(&self) -> u64 {
        let counters = &self.stream.counters;
        counters.entries.value() as u64 + JUMP_COST * counters.jumps.value() as u64
    }

    /// The same scan bound to no transaction (see `ScanParts::unbound`).
    pub(crate) fn unbind(
        &self,
        mgr: Arc<TxnManager>,
    ) -> datafusion::error::Result<SpindleScanExec> {
        self.parts.clone().unbound(mgr)
    }
}

impl DisplayAs for SpindleScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "SpindleScan: {}", self.parts.describe)?;
        if let (Some((pos, _)), false) = (&self.parts.lead_key, self.join_keys.is_empty()) {
            let name = self.parts.schema.field(*pos).name();
            write!(f, " join keys={name}")?;
        }
        Ok(())
    }
}

/// The key ranges of the values the join filters name for the scanned
/// keys' leading column (output position and type `lead`), or `None` when
/// they do not name them (then the scan reads its whole ranges).
fn join_points(
    chain: &[Table],
    lead: Option<&(usize, datafusion::arrow::datatypes::DataType)>,
    filters: &[Arc<dyn PhysicalExpr>],
) -> crate::Result<Option<Arc<Points>>> {
    let Some((pos, ty)) = lead else {
        return Ok(None);
    };
    let mut values: Option<Vec<ScalarValue>> = None;
    for f in filters {
        if let Some(v) = crate::join_keys::key_values(f, *pos) {
            if values.as_ref().is_none_or(|cur| v.len() < cur.len()) {
                values = Some(v);
            }
        }
    }
    let Some(values) = values.filter(|v| v.len() <= crate::join_keys::MAX_POINTS) else {
        return Ok(None);
    };
    let chain: Vec<&Table> = chain.iter().collect();
    // Every point is `head ‖ value ‖ tail`: the root table's marker, the
    // encoded value, and (when the root's key is that one column and the
    // scan is of a table below it) the next table's marker. Both are taken
    // from one value's full prefix, so every other value costs only its
    // own encoding. (A value too long for a key matches no row.)
    let dir = chain
        .last()
        .and_then(|t| t.primary_key.first())
        .map(|k| k.direction)
        .ok_or_else(|| crate::Error::Internal("a join-key scan of a keyless table".into()))?;
    let values = sorted_ints(values, dir);
    let mut shape = None;
    for v in &values {
        let Some(v) = literal_value(v, ty) else {
            return Ok(None);
        };
        match self_catalog_prefix(&chain, std::slice::from_ref(&v), true) {
            Ok(full) => {
                shape = Some((v, full));
                break;
            }
            Err(crate::Error::Key(spindle_keys::Error::KeyTooLarge(_))) => continue,
            Err(e) => return Err(e),
        }
    }
    let Some((v0, full)) = shape else {
        return Ok(Some(Arc::new(Points::default())));
    };
    let head = self_catalog_prefix(&chain, &[], true)?;
    let mut enc = Vec::new();
    spindle_keys::key::encode_value(&mut enc, &v0, dir)?;
    let tail = full
        .strip_prefix(head.as_slice())
        .and_then(|rest| rest.strip_prefix(enc.as_slice()))
        .ok_or_else(|| {
            crate::Error::Internal("a key prefix not shaped head ‖ value ‖ tail".into())
        })?;
    // Room for every point if they are as long as the first (at most
    // 1 MiB up front: one long string first must not reserve 65 536 of it).
    let bytes = values.len().saturating_mul(full.len()).min(1 << 20);
    let mut points = PointsBuilder::with_capacity(values.len(), bytes);
    for v in &values {
        let Some(v) = literal_value(v, ty) else {
            return Ok(None);
        };
        let written = points.push(|buf| {
            let start = buf.len();
            buf.extend_from_slice(&head);
            spindle_keys::key::encode_value(buf, &v, dir)?;
            buf.extend_from_slice(tail);
            // A value too long for a key matches no row.
            if buf.len() - start > spindle_keys::key::MAX_KEY_BYTES {
                return Err(spindle_keys::Error::KeyTooLarge(buf.len() - start));
            }
            Ok(())
        });
        match written {
            Ok(()) | Err(spindle_keys::Error::KeyTooLarge(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Some(Arc::new(points.finish())))
}

/// A join's integer keys sorted in the key column's direction, each once;
/// other values as they came. The keys arrive in the build side's order,
/// often repeated (12 150 order rows name 2 500 customers): sorting them as
/// numbers costs far less than sorting their encoded prefixes
/// (`PointsBuilder::finish`, which then only checks the order), and a
/// repeat is not encoded at all. Only an optimization: equal integers
/// encode equally, and `finish` sorts whatever is out of order.
fn sorted_ints(values: Vec<ScalarValue>, dir: Direction) -> Vec<ScalarValue> {
    let ints: Option<Vec<i64>> = values
        .iter()
        .map(|v| match v {
            ScalarValue::Int64(Some(x)) => Some(*x),
            _ => None,
        })
        .collect();
    let Some(mut ints) = ints else {
        return values;
    };
    ints.sort_unstable();
    ints.dedup();
    if dir == Direction::Desc {
        ints.reverse();
    }
    ints.into_iter()
        .map(|x| ScalarValue::Int64(Some(x)))
        .collect()
}

impl ExecutionPlan for SpindleScanExec {
    fn name(&self) -> &str {
        "SpindleScan"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn fetch(&self) -> Option<usize> {
        self.inner.fetch()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> datafusion::error::Result<TreeNodeRecursion>,
    ) -> datafusion::error::Result<TreeNodeRecursion> {
        // The join filters it holds: a hash join computes its filter only
        // when a node below it shows one (`plan_contains_expression_id`).
        for e in &self.join_keys {
            if f(e)? == TreeNodeRecursion::Stop {
                return Ok(TreeNodeRecursion::Stop);
            }
        }
        Ok(TreeNodeRecursion::Continue)
    }

    /// Keeps the hash joins' dynamic filters on the leading key column
    /// (after the physical optimizer, when they exist). Every filter is
    /// reported as not applied: the scan only uses them to skip keys.
    fn handle_child_pushdown_result(
        &self,
        phase: FilterPushdownPhase,
        child_pushdown_result: ChildPushdownResult,
        _config: &datafusion::common::config::ConfigOptions,
    ) -> datafusion::error::Result<FilterPushdownPropagation<Arc<dyn ExecutionPlan>>> {
        let filters: Vec<Arc<dyn PhysicalExpr>> = child_pushdown_result
            .parent_filters
            .into_iter()
            .map(|f| f.filter)
            .collect();
        let verdicts = vec![PushedDown::No; filters.len()];
        let keys: Vec<Arc<dyn PhysicalExpr>> = match &self.parts.lead_key {
            Some((pos, _)) if phase == FilterPushdownPhase::Post && self.parts.limit.is_none() => {
                filters
                    .into_iter()
                    .filter(|f| crate::join_keys::is_dynamic_on(f, *pos))
                    .collect()
            }
            _ => Vec::new(),
        };
        if keys.is_empty() {
            return Ok(FilterPushdownPropagation {
                filters: verdicts,
                updated_node: None,
            });
        }
        let mut join_keys = self.join_keys.clone();
        join_keys.extend(keys);
        let node = SpindleScanExec {
            inner: self.inner.clone(),
            properties: self.properties.clone(),
            stream: self.stream.clone(),
            parts: self.parts.clone(),
            join_keys,
            metrics: self.stream.counters.metrics(),
        };
        Ok(FilterPushdownPropagation {
            filters: verdicts,
            updated_node: Some(Arc::new(node)),
        })
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        if children.is_empty() {
            Ok(self)
        } else {
            Err(DataFusionError::Internal(
                "a Spindle scan has no children".into(),
            ))
        }
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> datafusion::error::Result<SendableRecordBatchStream> {
        let output_rows = MetricBuilder::new(&self.metrics).output_rows(partition);
        let counted = move |b: &RecordBatch| output_rows.add(b.num_rows());
        if self.join_keys.is_empty() || partition != 0 {
            let inner = self.inner.execute(partition, context)?;
            return Ok(Box::pin(RecordBatchStreamAdapter::new(
                self.parts.schema.clone(),
                inner.inspect_ok(counted),
            )));
        }
        // With join filters the scan starts at its first poll, not now: a
        // hash join polls its probe side only once its build side is in
        // and its filter published.
        let stream = self.stream.clone();
        let filters = self.join_keys.clone();
        let lead = self.parts.lead_key.clone();
        let points_metric = MetricBuilder::new(&self.metrics).counter("join_key_points", partition);
        let stats = context
            .session_config()
            .get_extension::<crate::join_keys::ScanStats>();
        // Made now, not at the first poll: if this stream is dropped
        // unpolled (a join whose build side is empty), partition 1 stops
        // waiting for a half that will not come.
        let handover = stream.tail.clone().map(CloseOnDrop);
        let lazy = futures::stream::once(async move {
            let started = std::time::Instant::now();
            let points =
                join_points(&stream.request.chain, lead.as_ref(), &filters).map_err(external)?;
            tracing::debug!(
                elapsed_us = started.elapsed().as_micros() as u64,
                points = points.as_ref().map(|p| p.len()),
                "join keys read as points"
            );
            if let Some(p) = &points {
                points_metric.add(p.len());
                if let Some(stats) = &stats {
                    stats
                        .join_key_scans
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
            Ok::<_, DataFusionError>(stream.start(points, stats, handover))
        })
        .try_flatten()
        .inspect_ok(counted);
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.parts.schema.clone(),
            lazy,
        )))
    }

    /// The same scan without its join filters: a reset hash join drops
    /// its filter and makes a new one only if filter pushdown runs again
    /// (`query_cache::rebind` runs it; DataFusion's recursive queries reset
    /// their recursive term before each run and do not), so a filter kept
    /// here would be the last run's, never updated: its keys would
    /// restrict this run's scan.
    ///
    /// A scan planned as two partitions also gets a new hand-over slot
    /// ([`crate::split_scan`]): the last run's is closed, or holds a far
    /// half of that run.
    fn reset_state(self: Arc<Self>) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        if self.join_keys.is_empty() && self.stream.tail.is_none() {
            return Ok(self);
        }
        let stream = ScanStream {
            tail: None,
            counters: ScanCounters::default(),
            ..(*self.stream).clone()
        };
        Ok(Arc::new(self.parts.clone().with_stream(stream)?))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}

/// Whether a scan may hand the far half of its range to a helper thread:
/// one range read whole (no limit), not through an index's fetches, on a
/// machine with more than one core.
fn may_split(request: &ScanRequest, fetches: bool) -> bool {
    // Asked once: `available_parallelism` reads the cgroup's CPU quota
    // files on every call (35 µs a call measured here), and this is asked
    // at every binding of a scan and again when it runs.
    static MANY_CORES: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    !fetches
        && request.limit.is_none()
        && request.ranges.len() == 1
        && *MANY_CORES
            .get_or_init(|| std::thread::available_parallelism().is_ok_and(|n| n.get() > 1))
}

/// How many more rows a scan that has read `read` rows and made `jumps`
/// jumps over row trees' children reads before the one with which it
/// hands the far half of what is left to a helper (0: the next row): it
/// splits once it has read [`SPLIT_AFTER`] (a jump counting [`JUMP_COST`]
/// rows), so that a scan whose rows are each a seek away from the last is
/// split as early in time as one read in order.
fn rows_before_split(read: usize, jumps: u64) -> usize {
    (SPLIT_AFTER.saturating_sub(1 + JUMP_COST * jumps) as usize).saturating_sub(read)
}

/// Partition 0: reads every range of a [`ScanRequest`] in order.
#[derive(Clone)]
struct ScanStream {
    schema: SchemaRef,
    request: ScanRequest,
    /// One per range; `None` in a plan kept unbound (`query_cache`), which
    /// is re-bound to a transaction before it runs.
    snapshots: Option<Vec<Snapshot>>,
    mgr: Arc<TxnManager>,
    /// For a non-covering index scan: the base-table request (its columns
    /// are the output) and the reader that fetches base rows by key. The
    /// main request then decodes the base key columns from each entry.
    fetch: Option<(ScanRequest, PointReader)>,
    /// Where partition 1 waits for the far half, when the scan was
    /// planned as two partitions.
    tail: Option<Arc<TailSlot>>,
    /// What the scan read, both halves summed (EXPLAIN ANALYZE).
    counters: ScanCounters,
}

/// What a scan read, for EXPLAIN ANALYZE: `entries_read`, the store's
/// entries (rows, and the children and index entries a scan reads before
/// it knows to jump), and `jumps`, the seeks past a row tree's children or
/// to a join key's range. A parent-only scan of an interleaved table shows
/// a jump per row: the cost of the layout, which the row count alone
/// hides. Shared by both halves of a split scan.
#[derive(Clone, Debug, Default)]
struct ScanCounters {
    entries: Count,
    jumps: Count,
}

impl ScanCounters {
    fn add(&self, reader: &RowReader) {
        self.entries.add(reader.entries as usize);
        self.jumps.add(reader.jumps as usize);
    }

    /// The counters as metrics of a plan node (`metrics` is new with each
    /// node; the counters are the scan's).
    fn metrics(&self) -> ExecutionPlanMetricsSet {
        let metrics = ExecutionPlanMetricsSet::new();
        for (name, count) in [("entries_read", &self.entries), ("jumps", &self.jumps)] {
            MetricBuilder::new(&metrics).build(MetricValue::Count {
                name: name.into(),
                count: count.clone(),
            });
        }
        metrics
    }
}

impl fmt::Debug for ScanStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ScanStream({} ranges)", self.request.ranges.len())
    }
}

impl PartitionStream for ScanStream {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let stats = ctx
            .session_config()
            .get_extension::<crate::join_keys::ScanStats>();
        self.start(None, stats, self.tail.clone().map(CloseOnDrop))
    }
}

impl ScanStream {
    /// The scan's stream; with `points`, only keys in those ranges are
    /// read (see [`crate::join_keys`]).
    ///
    /// Nothing is read until the stream is first polled. Then the first
    /// [`INLINE_BUDGET`] of the scan is read on the polling thread (a
    /// connection's thread or a worker of the shared runtime, wherever
    /// DataFusion runs the plan's partition): a short scan — a small
    /// table, a parent-only scan of a few thousand row trees — ends there,
    /// without the two thread wake-ups a blocking thread costs (its start,
    /// and the consumer's wake-up by its first batch), which the profile of
    /// a scan of an empty table showed as half of the server's samples. A
    /// longer scan goes on, from where it stopped, on a blocking thread
    /// ([`ScanProducer`]).
    ///
    /// `stats`, the engine's counters, counts a far half handed to
    /// partition 1 through `handover` (this scan's slot, when it was
    /// planned as two partitions; closed when the scan ends or its stream
    /// is dropped, so that partition 1 stops waiting).
    fn start(
        &self,
        points: Option<Arc<Points>>,
        stats: Option<Arc<crate::join_keys::ScanStats>>,
        handover: Option<CloseOnDrop>,
    ) -> SendableRecordBatchStream {
        let schema = self.schema.clone();
        let producer = self.snapshots.clone().map(|snapshots| ScanProducer {
            schema: self.schema.clone(),
            request: Arc::new(self.request.clone()),
            fetch: self.fetch.clone().map(Arc::new),
            mgr: self.mgr.clone(),
            snapshots: snapshots.into_iter(),
            current: None,
            may_split: may_split(&self.request, self.fetch.is_some()),
            split_tried: false,
            read_before: 0,
            tail: None,
            first_sent: false,
            produced: 0,
            entries: 0,
            jumps: 0,
            index_entries: 0,
            started: std::time::Instant::now(),
            counters: self.counters.clone(),
            points,
            stats,
            handover,
        });
        let run = async move {
            let Some(mut producer) = producer else {
                return futures::stream::iter(vec![Err::<RecordBatch, _>(
                    DataFusionError::Internal(
                        "a scan of a kept plan ran without being bound to a transaction".into(),
                    ),
                )])
                .boxed();
            };
            let mut head: Vec<datafusion::error::Result<RecordBatch>> = Vec::new();
            let end = producer.read(Some(INLINE_BUDGET), &mut |b| {
                head.push(Ok(b));
                true
            });
            let head = futures::stream::iter(head);
            let rest = match end {
                Err(e) => futures::stream::iter(vec![Err(e)]).boxed(),
                Ok(ReadEnd::Stopped) => futures::stream::empty().boxed(),
                Ok(ReadEnd::Done) if !matches!(producer.tail, Some(Tail::Inline(_))) => {
                    // What is left is the far half's helper's (forwarded
                    // here), or partition 1's, or nothing; the producer
                    // (and the handover it holds) ends with the stream.
                    match producer.tail.take() {
                        Some(Tail::Thread(rx)) => {
                            futures::stream::unfold((rx, producer), |(mut rx, p)| async move {
                                rx.recv().await.map(|b| (b, (rx, p)))
                            })
                            .boxed()
                        }
                        _ => {
                            drop(producer);
                            futures::stream::empty().boxed()
                        }
                    }
                }
                Ok(_) => {
                    // On a blocking thread from where the inline read
                    // stopped.
                    let mut builder =
                        RecordBatchReceiverStreamBuilder::new(producer.schema.clone(), 2);
                    let tx = builder.tx();
                    builder.spawn_blocking(move || producer.run_to_end(&tx));
                    builder.build().boxed()
                }
            };
            head.chain(rest).boxed()
        };
        Box::pin(RecordBatchStreamAdapter::new(
            schema,
            futures::stream::once(run).flatten(),
        ))
    }
}

/// How much of a scan is read on the thread that polls its stream before
/// the rest moves to a blocking thread: entries read, a jump over a row
/// tree's children counting [`JUMP_COST`] (about a millisecond of reading
/// on the 2-core VM).
pub(crate) const INLINE_BUDGET: u64 = 8192;

/// How [`ScanProducer::read`] ended.
enum ReadEnd {
    /// Every range is read (a far half may be left in `tail`).
    Done,
    /// The budget ran out; `read` goes on from there.
    OutOfBudget,
    /// The consumer went away (a LIMIT above was reached, the query ended).
    Stopped,
}

/// A scan's reading, resumable between entries: its state (the ranges
/// left, the range being read, the far half handed off) outlives the
/// decoders, which borrow the request and live only as long as one call
/// of [`ScanProducer::read`] (so that the producer can move from the
/// polling thread to a blocking one). A call ends with the rows it
/// decoded handed out as a batch.
struct ScanProducer {
    schema: SchemaRef,
    /// Shared with the decoders of a `read` call, which borrow it.
    request: Arc<ScanRequest>,
    /// For a non-covering index scan: the base-table request (its columns
    /// are the output) and the reader that fetches base rows by key.
    fetch: Option<Arc<(ScanRequest, PointReader)>>,
    mgr: Arc<TxnManager>,
    /// The ranges not yet started, and the one being read.
    snapshots: std::vec::IntoIter<Snapshot>,
    current: Option<(TxnScan, RowReader)>,
    /// A scan of one range that has read enough (`rows_before_split`) hands the
    /// far half of what is left to a helper thread (see
    /// `TxnScan::split_off`), whose batches are partition 1's
    /// (`crate::split_scan`), or follow this scan's if they can no longer
    /// be handed over. Tried once: a cut that fails (what is left is one
    /// logical key) is not tried again at every later row.
    may_split: bool,
    split_tried: bool,
    /// Rows read by the decoders of earlier `read` calls.
    read_before: usize,
    tail: Option<Tail>,
    first_sent: bool,
    produced: usize,
    /// Entries read and jumps made by finished ranges, and index entries
    /// read to fetch base rows (not counted by the readers).
    entries: u64,
    jumps: u64,
    index_entries: usize,
    started: std::time::Instant,
    counters: ScanCounters,
    points: Option<Arc<Points>>,
    stats: Option<Arc<crate::join_keys::ScanStats>>,
    handover: Option<CloseOnDrop>,
}

impl ScanProducer {
    /// Reads the ranges in order, handing each full batch to `emit` (false:
    /// stop), for at most `budget` (entries, a jump counting [`JUMP_COST`])
    /// when given; the rows decoded by then go out as a last batch.
    fn read(
        &mut self,
        budget: Option<u64>,
        emit: &mut dyn FnMut(RecordBatch) -> bool,
    ) -> datafusion::error::Result<ReadEnd> {
        // The decoders borrow the requests: held here, so that `self`
        // stays free to change.
        let request_arc = self.request.clone();
        let request: &ScanRequest = &request_arc;
        let fetch_request = self.fetch.clone();
        let output = fetch_request
            .as_deref()
            .map(|(base, _)| base)
            .unwrap_or(request);
        let _span = tracing::debug_span!("scan", table = %request.chain.last().map(|t| t.name.as_str()).unwrap_or(""), ranges = request.ranges.len()).entered();
        let mut rows = RowDecoder::new(output).map_err(external)?;
        // An index scan that fetches base rows decodes each entry's key
        // columns (no output of its own: only `key_values`).
        let mut fetch = match fetch_request.as_deref() {
            Some((_, reader)) => Some((reader, RowDecoder::new(request).map_err(external)?)),
            None => None,
        };
        let base_chain: Vec<&Table> = output.chain.iter().collect();
        let limit_reached = |produced: usize| request.limit.is_some_and(|l| produced >= l);
        let mut spent = 0u64;
        loop {
            if budget.is_some_and(|b| spent >= b) {
                if !rows.is_empty() && !emit(rows.finish(&self.schema)?) {
                    return Ok(self.stop());
                }
                self.read_before += rows.read();
                return Ok(ReadEnd::OutOfBudget);
            }
            let Some((iter, reader)) = self.current.as_mut() else {
                match self.snapshots.next() {
                    Some(snap) if !limit_reached(self.produced) => {
                        let iter = snap.into_iter(&self.mgr);
                        self.current = Some((iter, RowReader::new(self.points.clone(), request)));
                        continue;
                    }
                    _ => break,
                }
            };
            let jumps_before = reader.jumps;
            let mut more = true;
            let full = if self.first_sent {
                BATCH_ROWS
            } else {
                FIRST_BATCH_ROWS
            };
            // Entries read, rows produced, and whether the range ended.
            let (entries, produced, ended) = match &mut fetch {
                None => {
                    let split_in = if self.may_split && !self.split_tried {
                        rows_before_split(self.read_before + rows.read(), reader.jumps)
                    } else {
                        usize::MAX
                    };
                    if split_in > 0 {
                        // Nothing per row to do before the split is due: a
                        // run of entries, to the next jump, the batch's
                        // end, the budget, the limit or the split.
                        let limits = RunLimits {
                            entries: budget.map_or(u64::MAX, |b| b - spent),
                            produced: request
                                .limit
                                .map_or(usize::MAX, |l| l.saturating_sub(self.produced)),
                            buffered: full,
                            read: rows.read().saturating_add(split_in),
                        };
                        let run = reader.run(iter, &mut rows, limits).map_err(external)?;
                        more = reader.jump(iter);
                        (run.entries, run.produced, !run.more)
                    } else {
                        reader.want_key = true;
                        match reader.step(iter, &mut rows).map_err(external)? {
                            Step::End => (1, 0, true),
                            Step::Entry(pushed) => {
                                if pushed.is_row() {
                                    self.split_tried = true;
                                    if let Some(rest) = iter.split_off(&reader.key) {
                                        let handed =
                                            self.handover.as_ref().and_then(|h| h.0.hand_over());
                                        if let (Some(stats), true) = (&self.stats, handed.is_some())
                                        {
                                            stats
                                                .split_scans
                                                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                        }
                                        self.tail = Some(Tail::start(
                                            rest,
                                            request.clone(),
                                            self.mgr.clone(),
                                            self.schema.clone(),
                                            self.points.clone(),
                                            handed,
                                            self.counters.clone(),
                                        ));
                                    }
                                }
                                reader.want_key = false;
                                more = reader.jump(iter);
                                (1, usize::from(pushed == Pushed::Row), false)
                            }
                        }
                    }
                }
                Some((point_reader, entry_keys)) => match iter.next() {
                    None => (1, 0, true),
                    Some(item) => {
                        self.index_entries += 1;
                        let (key, _) = item.map_err(|e| external(crate::Error::from(e)))?;
                        // An index entry: decode the base key, fetch the row.
                        match entry_keys.key_values(&key).map_err(external)? {
                            None => (1, 0, false),
                            Some(pk) => {
                                let base_key = self_catalog_prefix(&base_chain, &pk, true)
                                    .map_err(external)?;
                                let Some(row) = point_reader
                                    .get(&self.mgr, &base_key)
                                    .map_err(|e| external(e.into()))?
                                else {
                                    return Err(external(crate::Error::Internal(format!(
                                        "index entry without its row in {}",
                                        base_chain.last().map(|t| t.name.as_str()).unwrap_or("")
                                    ))));
                                };
                                let pushed = rows.push(&base_key, &row).map_err(external)?;
                                (1, usize::from(pushed == Pushed::Row), false)
                            }
                        }
                    }
                },
            };
            spent += entries + JUMP_COST * (reader.jumps - jumps_before);
            self.produced += produced;
            if !ended && rows.len() >= full {
                self.first_sent = true;
                if !emit(rows.finish(&self.schema)?) {
                    return Ok(self.stop());
                }
            }
            if ended || !more || limit_reached(self.produced) {
                self.end_range();
            }
        }
        self.counters.entries.add(self.index_entries);
        self.entries += self.index_entries as u64;
        self.index_entries = 0;
        tracing::debug!(
            elapsed_us = self.started.elapsed().as_micros() as u64,
            entries = self.entries,
            jumps = self.jumps,
            read = self.read_before + rows.read(),
            "scan read its range (a far half handed to a helper not included)"
        );
        if !rows.is_empty() && !emit(rows.finish(&self.schema)?) {
            return Ok(self.stop());
        }
        self.read_before += rows.read();
        Ok(ReadEnd::Done)
    }

    /// Counts the range being read and drops it.
    fn end_range(&mut self) {
        if let Some((_, reader)) = self.current.take() {
            self.entries += reader.entries;
            self.jumps += reader.jumps;
            self.counters.add(&reader);
        }
    }

    /// The consumer went away: counts what was read.
    fn stop(&mut self) -> ReadEnd {
        self.end_range();
        self.counters.entries.add(self.index_entries);
        self.index_entries = 0;
        ReadEnd::Stopped
    }

    /// On a blocking thread: the rest of the ranges, then the far half
    /// (forwarded from its helper, or read here if no helper could start).
    fn run_to_end(mut self, tx: &BatchSender) -> datafusion::error::Result<()> {
        let mut send = |b: RecordBatch| tx.blocking_send(Ok(b)).is_ok();
        if let ReadEnd::Stopped = self.read(None, &mut send)? {
            return Ok(());
        }
        match self.tail.take() {
            None | Some(Tail::Handed) => {}
            Some(Tail::Thread(mut batches)) => {
                while let Some(batch) = batches.blocking_recv() {
                    if tx.blocking_send(batch).is_err() {
                        return Ok(());
                    }
                }
            }
            Some(Tail::Inline(inline)) => {
                let (mut iter, request) = *inline;
                let mut rows = RowDecoder::new(&request).map_err(external)?;
                let mut reader = RowReader::new(self.points.clone(), &request);
                let read = read_rows(
                    &mut iter,
                    &mut reader,
                    &mut rows,
                    &self.schema,
                    BATCH_ROWS,
                    &mut send,
                );
                self.counters.add(&reader);
                read?;
            }
        }
        Ok(())
    }
}

/// The far half of a split scan.
enum Tail {
    /// Read by a helper thread; the scan's own thread forwards its batches
    /// after its own half.
    Thread(tokio::sync::mpsc::Receiver<datafusion::error::Result<RecordBatch>>),
    /// Read by a helper thread as partition 1's output.
    Handed,
    /// Read by the scan's own thread after its half (no thread could be
    /// started).
    Inline(Box<(TxnScan, ScanRequest)>),
}

impl Tail {
    fn start(
        iter: TxnScan,
        request: ScanRequest,
        mgr: Arc<TxnManager>,
        schema: SchemaRef,
        points: Option<Arc<Points>>,
        handed: Option<BatchSender>,
        counters: ScanCounters,
    ) -> Tail {
        // Partition 1's channel, or one this scan forwards from (its
        // stream, or its blocking thread).
        // Partition 1's first batch is small, as partition 0's is: a merge
        // of the two in key order waits for it before its first row.
        let (tx, rx, first_batch) = match handed {
            Some(tx) => (tx, None, FIRST_BATCH_ROWS),
            None => {
                let (tx, rx) = tokio::sync::mpsc::channel(HELPER_BATCHES);
                (tx, Some(rx), BATCH_ROWS)
            }
        };
        // The helper takes the scan from here; if no thread can be
        // started, the scan's own thread takes it back.
        let slot = Arc::new(Mutex::new(Some(iter)));
        let helper_slot = slot.clone();
        let helper_request = request.clone();
        // A kept helper thread if one is idle (a new thread costs ~50 µs).
        let spawned = crate::helper_threads::run("spindle-scan", move || {
            let _mgr = mgr; // the store stays open while the scan runs
            let Some(mut iter) = helper_slot.lock().ok().and_then(|mut s| s.take()) else {
                return;
            };
            let result = RowDecoder::new(&helper_request)
                .map_err(external)
                .and_then(|mut rows| {
                    let started = std::time::Instant::now();
                    let mut reader = RowReader::new(points, &helper_request);
                    let read = read_rows(
                        &mut iter,
                        &mut reader,
                        &mut rows,
                        &schema,
                        first_batch,
                        &mut |b| tx.blocking_send(Ok(b)).is_ok(),
                    );
                    counters.add(&reader);
                    tracing::debug!(
                        table = %helper_request.chain.last().map(|t| t.name.as_str()).unwrap_or(""),
                        elapsed_us = started.elapsed().as_micros() as u64,
                        entries = reader.entries,
                        jumps = reader.jumps,
                        read = rows.read(),
                        "scan helper read the far half"
                    );
                    read
                });
            if let Err(e) = result {
                let _ = tx.blocking_send(Err(e));
            }
        });
        let taken_back = match spawned {
            Ok(()) => None,
            Err(e) => {
                tracing::debug!(error = %e, "no scan helper thread; reading the far half inline");
                slot.lock().ok().and_then(|mut s| s.take())
            }
        };
        match (taken_back, rx) {
            (Some(iter), _) => Tail::Inline(Box::new((iter, request))),
            (None, Some(rx)) => Tail::Thread(rx),
            (None, None) => Tail::Handed,
        }
    }
}

/// The rows of `request`'s table in `[start, end)` of `txn`'s snapshot
/// (and its own writes), decoded straight from the store's pages into one
/// batch of `schema`: the fast path's key-range SELECT
/// ([`crate::fastpath`]). Only the requested columns are decoded, and the
/// scan jumps over row trees below the rows, as every scan does. The first
/// `inline_entries` entries are read on the calling thread, the rest
/// through [`crate::blocking`] (a short range costs less than the hand-off
/// of a tokio worker). `None` when the range holds no row.
pub(crate) fn scan_range_batch(
    txn: &Transaction,
    request: &ScanRequest,
    schema: &SchemaRef,
    start: &[u8],
    end: Option<&[u8]>,
    inline_entries: usize,
) -> crate::Result<Option<RecordBatch>> {
    let mut iter = txn.scan(start, end);
    let mut rows = RowDecoder::with_capacity(request, 16)?;
    let mut reader = RowReader::new(None, request);
    // True once the scan is done.
    let step = |budget: Option<usize>| -> crate::Result<bool> {
        let mut n = 0u64;
        loop {
            let limits = RunLimits {
                entries: budget.map_or(u64::MAX, |b| b as u64 - n),
                produced: usize::MAX,
                buffered: usize::MAX,
                read: usize::MAX,
            };
            let run = reader.run(&mut iter, &mut rows, limits)?;
            n += run.entries;
            if !run.more || !reader.jump(&mut iter) {
                return Ok(true);
            }
            if budget.is_some_and(|b| n >= b as u64) {
                return Ok(false);
            }
        }
    };
    in_two_parts(inline_entries, step)?;
    if rows.is_empty() {
        return Ok(None);
    }
    Ok(Some(rows.finish(schema)?))
}

/// Runs a fast-path read's `step` (true once done) for up to `inline`
/// entries on the calling thread, then to its end through
/// [`crate::blocking`].
fn in_two_parts(
    inline: usize,
    mut step: impl FnMut(Option<usize>) -> crate::Result<bool>,
) -> crate::Result<()> {
    if !step(Some(inline))? {
        crate::blocking(|| step(None))?;
    }
    Ok(())
}

/// [`scan_range_batch`] over an index's entries in `[start, end)`, each
/// entry's base row read by its key: `entries` scans the index's chain and
/// names the base table's key columns in the entry (its `columns`, in key
/// order), `base` is the base table's chain and output columns. The reads
/// are the transaction's (the entry range and each row's key, recorded
/// for validation; its own writes seen). `None` when no entry is there.
pub(crate) fn index_fetch_batch(
    txn: &Transaction,
    entries: &ScanRequest,
    base: &ScanRequest,
    schema: &SchemaRef,
    start: &[u8],
    end: Option<&[u8]>,
    inline_entries: usize,
) -> crate::Result<Option<RecordBatch>> {
    let mut iter = txn.scan(start, end);
    let keys = RowDecoder::new(entries)?;
    let mut rows = RowDecoder::with_capacity(base, 16)?;
    let base_chain: Vec<&Table> = base.chain.iter().collect();
    // True once the scan is done.
    let step = |budget: Option<usize>| -> crate::Result<bool> {
        let mut n = 0usize;
        while budget.is_none_or(|b| n < b) {
            let Some(item) = iter.next_with(|key, _| key.to_vec()) else {
                return Ok(true);
            };
            n += 1;
            let key = item?;
            // Rows of the tables an interleaved index lies among.
            let Some(pk) = keys.key_values(&key)? else {
                continue;
            };
            let base_key = self_catalog_prefix(&base_chain, &pk, true)?;
            let Some(row) = txn.get(&base_key)? else {
                return Err(crate::Error::Internal(format!(
                    "index entry without its row in {}",
                    base_chain.last().map(|t| t.name.as_str()).unwrap_or("")
                )));
            };
            rows.push(&base_key, &row)?;
        }
        Ok(false)
    };
    in_two_parts(inline_entries, step)?;
    if rows.is_empty() {
        return Ok(None);
    }
    Ok(Some(rows.finish(schema)?))
}

/// Reads every row of a plain scan (no index fetch, no limit) into
/// batches handed to `emit`, which returns false to stop: the first of
/// `first_batch` rows, the others of `BATCH_ROWS`.
fn read_rows(
    iter: &mut TxnScan,
    reader: &mut RowReader,
    rows: &mut RowDecoder,
    schema: &SchemaRef,
    first_batch: usize,
    emit: &mut dyn FnMut(RecordBatch) -> bool,
) -> datafusion::error::Result<()> {
    let mut full = first_batch;
    loop {
        let limits = RunLimits {
            entries: u64::MAX,
            produced: usize::MAX,
            buffered: full,
            read: usize::MAX,
        };
        let run = reader.run(iter, rows, limits).map_err(external)?;
        let more = run.more && reader.jump(iter);
        if rows.len() >= full {
            full = BATCH_ROWS;
            if !emit(rows.finish(schema)?) {
                return Ok(());
            }
        }
        if !more {
            break;
        }
    }
    if !rows.is_empty() {
        emit(rows.finish(schema)?);
    }
    Ok(())
}

/// What one [`RowReader::step`] found.
enum Step {
    /// An entry was read, and what the decoder did with it.
    Entry(Pushed),
    End,
}

/// Where a [`RowReader::run`] stops: after the entry that reaches one of
/// these (each counted from the run's start, except `buffered` and
/// `read`, which are the decoder's `len` and `read`).
struct RunLimits {
    entries: u64,
    produced: usize,
    buffered: usize,
    read: usize,
}

/// What a [`RowReader::run`] did.
struct Run {
    entries: u64,
    /// Rows decoded (not skipped by the row filter).
    produced: usize,
    /// False: the range is done.
    more: bool,
}

/// Reads the rows of one table from a scan of its key range, jumping over
/// the row trees below its rows (children, interleaved index entries)
/// instead of reading them.
#[derive(Default)]
struct RowReader {
    /// The key of the last row produced: a key below it belongs to its row
    /// tree, which the scan jumps over.
    last_row: Vec<u8>,
    /// Set once a row tree had descendants: from then on the scan jumps
    /// past each row's tree as soon as the row is produced, without
    /// reading its first descendant to find out. (Row keys of one table
    /// have the same number of self-delimiting components, so no row key
    /// starts with another's.)
    jump_after_rows: bool,
    /// What the next `jump` does; a jump to a key goes to `jump_key`
    /// (a buffer kept across jumps: one per row tree or point).
    pending_jump: Jump,
    jump_key: Vec<u8>,
    /// When set, `step` copies the key of the row it reads (decoded or
    /// skipped by the row filter) into `key`.
    want_key: bool,
    key: Vec<u8>,
    /// The only key ranges to read (a join's keys), when known.
    points: Option<PointCursor>,
    /// Every entry is a row ([`ScanRequest::alone`]): no row tree to jump
    /// over, so `last_row` is not kept.
    alone: bool,
    /// Entries read and jumps made (for the scan's closing debug event).
    entries: u64,
    jumps: u64,
}

impl RowReader {
    fn new(points: Option<Arc<Points>>, request: &ScanRequest) -> RowReader {
        RowReader {
            points: points.map(PointCursor::new),
            alone: request.alone,
            ..RowReader::default()
        }
    }

    /// Reads one entry, decoding it straight from the store's pages.
    fn step(&mut self, iter: &mut TxnScan, rows: &mut RowDecoder) -> crate::Result<Step> {
        let step = iter.next_with(|key, value| self.entry(key, value, rows));
        match step {
            None => Ok(Step::End),
            Some(r) => Ok(Step::Entry(r??)),
        }
    }

    /// Reads entries as [`RowReader::step`] does, several in one call (at
    /// most a B-tree leaf's, `TxnScan::run_with`), until an entry leaves a
    /// jump to make (`jump` then makes it) or one of `limits` is reached.
    /// `want_key` is not honoured: a run is for stretches where no row's
    /// key is wanted.
    fn run(
        &mut self,
        iter: &mut TxnScan,
        rows: &mut RowDecoder,
        limits: RunLimits,
    ) -> crate::Result<Run> {
        let mut run = Run {
            entries: 0,
            produced: 0,
            more: true,
        };
        let mut failed = None;
        let more = iter.run_with(|key, value| {
            run.entries += 1;
            match self.entry(key, value, rows) {
                Ok(pushed) => {
                    if pushed == Pushed::Row {
                        run.produced += 1;
                    }
                }
                Err(e) => {
                    failed = Some(e);
                    return false;
                }
            }
            self.pending_jump == Jump::None
                && run.entries < limits.entries
                && run.produced < limits.produced
                && rows.len() < limits.buffered
                && rows.read() < limits.read
        });
        if let Some(e) = failed {
            return Err(e);
        }
        run.more = more?;
        Ok(run)
    }

    /// What `step` and `run` do with one entry: skip it if it lies outside
    /// the points (deciding the jump to the next), else decode it and
    /// decide whether the row's tree is to be jumped over.
    fn entry(&mut self, key: &[u8], value: &[u8], rows: &mut RowDecoder) -> crate::Result<Pushed> {
        self.entries += 1;
        if let Some(points) = self.points.as_mut() {
            // A key outside every point is not decoded: the scan
            // seeks to the next point (or stops after the last).
            match points.place(key) {
                Place::Inside => {}
                Place::Before(start) => {
                    self.jump_key.clear();
                    self.jump_key.extend_from_slice(start);
                    self.pending_jump = Jump::To;
                    return Ok(Pushed::Other);
                }
                Place::Past => {
                    self.pending_jump = Jump::Past;
                    return Ok(Pushed::Other);
                }
            }
        }
        let pushed = rows.push(key, value)?;
        if pushed.is_row() && self.want_key {
            self.key.clear();
            self.key.extend_from_slice(key);
        }
        // A skipped row is still a row: its tree is jumped over.
        self.pending_jump = if pushed.is_row() && self.jump_after_rows {
            Jump::past(key, &mut self.jump_key)
        } else if pushed.is_row() {
            if !self.alone {
                self.last_row.clear();
                self.last_row.extend_from_slice(key);
            }
            Jump::None
        } else if !self.last_row.is_empty() && key.starts_with(&self.last_row) {
            self.jump_after_rows = true;
            Jump::past(&self.last_row, &mut self.jump_key)
        } else {
            Jump::None
        };
        Ok(pushed)
    }

    /// Makes the jump the last step decided on, if any; false if it goes
    /// past every key (nothing more to read).
    fn jump(&mut self, iter: &mut TxnScan) -> bool {
        match std::mem::take(&mut self.pending_jump) {
            Jump::None => true,
            Jump::To => {
                self.last_row.clear();
                self.jumps += 1;
                iter.seek(&self.jump_key);
                true
            }
            Jump::Past => false,
        }
    }
}

/// What [`RowReader::jump`] does next.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Jump {
    /// Nothing: read on.
    #[default]
    None,
    /// Seek to the reader's `jump_key`.
    To,
    /// Stop: nothing more to read.
    Past,
}

impl Jump {
    /// A jump past every key that starts with `prefix` (its end written
    /// into `buf`).
    fn past(prefix: &[u8], buf: &mut Vec<u8>) -> Jump {
        if spindle_keys::key::prefix_end_into(prefix, buf) {
            Jump::To
        } else {
            Jump::Past
        }
    }
}

/// What [`RowDecoder::push`] did with an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pushed {
    /// Not a row of the scanned table (another table of the row tree).
    Other,
    /// A row of the table that the row filter rejected: not decoded.
    Skipped,
    /// A row, decoded into the batch.
    Row,
}

impl Pushed {
    /// A row of the scanned table, decoded or not.
    pub fn is_row(self) -> bool {
        self != Pushed::Other
    }
}

/// Decodes stored rows of one table into Arrow columns: requested stored
/// values are appended straight from the row's bytes, key columns are
/// decoded only when requested, and nothing else is decoded.
pub struct RowDecoder<'a> {
    /// `request.chain` as the slice of references `Catalog::key_spans`
    /// takes (built once, not per row).
    chain: Vec<&'a Table>,
    key_positions: Vec<Option<usize>>,
    /// For a stored column id, the output column it fills (`usize::MAX`:
    /// not requested); indexed by id.
    column_of_id: Vec<usize>,
    /// Output columns that repeat an earlier one (same key position or
    /// stored column): `(this column, the earlier one)`. They are not
    /// built: each batch shares the earlier column's array.
    repeats: Vec<(usize, usize)>,
    /// One builder per output column; a repeat's stays empty.
    columns: Vec<ColumnBuilder>,
    /// Byte ranges of the current key's key columns (a reused buffer).
    spans: Vec<(usize, usize)>,
    /// The output columns filled from the stored row (not key columns,
    /// not repeats), and per output column the number of the row it last
    /// got a stored value for (`decoded` then).
    stored: Vec<usize>,
    filled: Vec<usize>,
    /// Rows decoded over the decoder's life (`finish` does not reset it):
    /// the row numbers `filled` holds. (Numbered per batch, a column that
    /// was last filled in row r of one batch and is NULL in the next
    /// batch's rows before row r would lose its value in row r.)
    decoded: usize,
    /// Rows buffered since the last batch.
    rows: usize,
    /// The request's row filter, while it pays.
    filter: RowFilterState<'a>,
    /// Rows of the table read (decoded or skipped by the row filter): a
    /// scan splits after so many rows read (and jumps, see `rows_before_split`),
    /// not decoded, or a selective filter would keep it on one thread.
    read: usize,
    /// Whether each key is parsed into `spans`: to tell the table's rows
    /// from other entries of its row trees, and for requested key columns
    /// and key tests. A scan of a table alone in its key space
    /// ([`ScanRequest::alone`]) that needs neither skips it.
    spans_needed: bool,
}

impl<'a> RowDecoder<'a> {
    pub fn new(request: &'a ScanRequest) -> crate::Result<Self> {
        Self::with_capacity(request, FIRST_BATCH_ROWS)
    }

    /// A decoder whose column builders start with room for `rows` rows
    /// (a short scan need not allocate a full first batch).
    pub fn with_capacity(request: &'a ScanRequest, rows: usize) -> crate::Result<Self> {
        let table = request
            .chain
            .last()
            .ok_or_else(|| crate::Error::Internal("a scan without a table".into()))?;
        let key_positions: Vec<Option<usize>> = request
            .columns
            .iter()
            .map(|c| {
                table
                    .primary_key
                    .iter()
                    .position(|k| k.name == table.columns[*c].name)
            })
            .collect();
        let column_ids: Vec<u32> = request
            .columns
            .iter()
            .map(|c| table.columns[*c].id)
            .collect();
        let mut column_of_id = Vec::new();
        let mut repeats = Vec::new();
        for (i, id) in column_ids.iter().enumerate() {
            if let Some(first) = (0..i)
                .find(|j| key_positions[*j] == key_positions[i] && column_ids[*j] == column_ids[i])
            {
                repeats.push((i, first));
                continue;
            }
            if key_positions[i].is_some() {
                continue;
            }
            let id = *id as usize;
            if column_of_id.len() <= id {
                column_of_id.resize(id + 1, usize::MAX);
            }
            column_of_id[id] = i;
        }
        let columns = request
            .columns
            .iter()
            .map(|c| ColumnBuilder::new(&table.columns[*c].data_type, rows))
            .collect::<crate::Result<Vec<_>>>()?;
        let stored = column_of_id
            .iter()
            .copied()
            .filter(|c| *c != usize::MAX)
            .collect();
        Ok(RowDecoder {
            chain: request.chain.iter().collect(),
            column_of_id,
            repeats,
            columns,
            spans: Vec::new(),
            stored,
            filled: vec![0; request.columns.len()],
            decoded: 0,
            rows: 0,
            filter: RowFilterState::new(request.filter.as_deref()),
            read: 0,
            spans_needed: !request.alone
                || key_positions.iter().any(Option::is_some)
                || request.filter.as_ref().is_some_and(|f| f.tests_keys()),
            key_positions,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    pub fn len(&self) -> usize {
        self.rows
    }

    /// Rows of the table read so far, decoded or skipped by the row filter.
    pub fn read(&self) -> usize {
        self.read
    }

    /// The values of the requested columns, which must all be key columns,
    /// of one key; `None` if the key belongs to another table of the tree.
    pub fn key_values(&self, key: &[u8]) -> crate::Result<Option<Vec<Value>>> {
        let Some(key_values) = Catalog::decode_key(&self.chain, key)? else {
            return Ok(None);
        };
        self.key_positions
            .iter()
            .map(|p| {
                p.map(|k| key_values[k].clone())
                    .ok_or_else(|| crate::Error::Internal("not a key column".into()))
            })
            .collect::<crate::Result<Vec<_>>>()
            .map(Some)
    }

    fn is_repeat(&self, i: usize) -> bool {
        !self.repeats.is_empty() && self.repeats.iter().any(|(r, _)| *r == i)
    }

    /// Decodes one stored row, unless the key belongs to another table of
    /// the row tree or the row filter rejects the row.
    pub fn push(&mut self, key: &[u8], value: &[u8]) -> crate::Result<Pushed> {
        // Key columns are located, not decoded; only requested ones are.
        if self.spans_needed && !Catalog::key_spans(&self.chain, key, &mut self.spans)? {
            return Ok(Pushed::Other);
        }
        self.read += 1;
        if let Some(f) = self.filter.current() {
            // Tested with the row filter: in one walk over the row with
            // its decoding where the output is narrow enough.
            if f.tests_stored() && self.columns.len() <= INLINE_COLUMNS {
                return self.push_tested(f, key, value);
            }
            if !self.filter.keep(key, &self.spans, value)? {
                return Ok(Pushed::Skipped);
            }
        }
        self.rows += 1;
        self.decoded += 1;
        if self.columns.is_empty() {
            return Ok(Pushed::Row);
        }
        self.append_keys(key)?;
        if !self.stored.is_empty() {
            // Only the requested stored columns are decoded, each appended
            // straight from the row's bytes; a column the row lacks is
            // NULL. `filled[c]` is the row (`decoded`) that column `c` last
            // got a value for, so a column id repeated in a corrupt row
            // cannot misalign the columns.
            let (column_of_id, columns, filled) =
                (&self.column_of_id, &mut self.columns, &mut self.filled);
            let stamp = self.decoded;
            let wanted = |id: u32| {
                column_of_id
                    .get(id as usize)
                    .is_some_and(|c| *c != usize::MAX)
            };
            let mut found = 0;
            let mut mismatch = None;
            spindle_keys::row::visit_row(value, wanted, |id, v| {
                let c = column_of_id[id as usize]; // `wanted` checked it
                if filled[c] != stamp {
                    filled[c] = stamp;
                    found += 1;
                    if let Err(e) = columns[c].append_raw(v) {
                        mismatch.get_or_insert(e);
                    }
                }
                Ok(())
            })?;
            if let Some(e) = mismatch {
                return Err(e);
            }
            if found < self.stored.len() {
                for &c in &self.stored {
                    if self.filled[c] != stamp {
                        self.columns[c].append_null();
                    }
                }
            }
        }
        Ok(Pushed::Row)
    }

    /// Appends the requested key columns of a row's key.
    fn append_keys(&mut self, key: &[u8]) -> crate::Result<()> {
        for i in 0..self.columns.len() {
            let Some(k) = self.key_positions[i] else {
                continue;
            };
            if self.is_repeat(i) {
                continue;
            }
            let (a, b) =
                self.spans.get(k).copied().ok_or_else(|| {
                    crate::Error::Internal("key column beyond the row key".into())
                })?;
            let v = spindle_keys::key::decode_value(&key[a..b])?.0;
            self.columns[i].append_value(&v)?;
        }
        Ok(())
    }

    /// `push` of a row the row filter `f` tests on stored columns: one walk
    /// over the row runs the tests and keeps the requested values (borrowed
    /// from the row's bytes, at most `INLINE_COLUMNS`), which are appended
    /// only if the row passes.
    fn push_tested(&mut self, f: &RowFilter, key: &[u8], value: &[u8]) -> crate::Result<Pushed> {
        let mut seen = std::mem::take(self.filter.seen());
        let mut pass = f.keep_key(key, &self.spans, &mut seen)?;
        let mut values = [None; INLINE_COLUMNS];
        if pass {
            let column_of_id = &self.column_of_id;
            let output = |id: u32| {
                column_of_id
                    .get(id as usize)
                    .copied()
                    .filter(|c| *c != usize::MAX)
            };
            spindle_keys::row::visit_row(
                value,
                |id| f.wants(id) || output(id).is_some(),
                |id, v| {
                    if f.wants(id) {
                        pass &= f.test(id, v, &mut seen);
                    }
                    // The first value of a column id counts (as in `push`).
                    if let Some(slot) = output(id).and_then(|c| values.get_mut(c)) {
                        slot.get_or_insert(v);
                    }
                    Ok(())
                },
            )?;
            pass &= f.all_seen(&seen);
        }
        *self.filter.seen() = seen;
        self.filter.count(pass);
        if !pass {
            return Ok(Pushed::Skipped);
        }
        self.rows += 1;
        self.decoded += 1;
        self.append_keys(key)?;
        for &c in &self.stored {
            match values[c] {
                Some(v) => self.columns[c].append_raw(v)?,
                None => self.columns[c].append_null(),
            }
        }
        Ok(Pushed::Row)
    }

    /// Returns the buffered rows as a record batch and clears the buffer.
    pub fn finish(&mut self, schema: &SchemaRef) -> datafusion::error::Result<RecordBatch> {
        let n = std::mem::take(&mut self.rows);
        let mut arrays: Vec<datafusion::arrow::array::ArrayRef> =
            self.columns.iter_mut().map(|c| c.finish()).collect();
        for &(i, first) in &self.repeats {
            arrays[i] = arrays[first].clone();
        }
        if arrays.is_empty() {
            let opts =
                datafusion::arrow::record_batch::RecordBatchOptions::new().with_row_count(Some(n));
            return Ok(RecordBatch::try_new_with_options(
                schema.clone(),
                arrays,
                &opts,
            )?);
        }
        Ok(RecordBatch::try_new(schema.clone(), arrays)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::logical_expr::{col, lit};
    use spindle_catalog::{ColumnDef, Interleave, InterleaveKind, KeyColumn, OnDelete, TableDef};
    use spindle_keys::DataType;

    fn catalog() -> Catalog {
        let mut c = Catalog::new();
        let col_def = |n: &str| ColumnDef {
            name: n.into(),
            data_type: DataType::Int64,
            nullable: false,
            default: None,
            allow_commit_timestamp: false,
        };
        let key = |names: &[&str], desc_last: bool| -> Vec<KeyColumn> {
            names
                .iter()
                .enumerate()
                .map(|(i, n)| KeyColumn {
                    name: n.to_string(),
                    direction: if desc_last && i == names.len() - 1 {
                        Direction::Desc
                    } else {
                        Direction::Asc
                    },
                })
                .collect()
        };
        c.create_table(TableDef {
            name: "p".into(),
            columns: vec![col_def("a")],
            primary_key: key(&["a"], false),
            interleave: None,
        })
        .unwrap();
        c.create_table(TableDef {
            name: "c".into(),
            columns: vec![col_def("a"), col_def("b"), col_def("v")],
            primary_key: key(&["a", "b"], true),
            interleave: Some(Interleave {
                parent: "p".into(),
                kind: InterleaveKind::InParent,
                on_delete: OnDelete::Cascade,
            }),
        })
        .unwrap();
        // A root keyed in descending order.
        c.create_table(TableDef {
            name: "d".into(),
            columns: vec![col_def("a")],
            primary_key: key(&["a"], true),
            interleave: None,
        })
        .unwrap();
        c
    }

    fn table(c: &Catalog, name: &str) -> SpindleTable {
        let mgr = TxnManager::new(spindle_storage::Store::open_temporary().unwrap()).unwrap();
        let txn = Arc::new(Mutex::new(mgr.begin().unwrap()));
        SpindleTable::new(c, c.table(name).unwrap(), txn, false).unwrap()
    }

    fn key(c: &Catalog, t: &str, vals: &[i64]) -> Vec<u8> {
        c.encode_key(
            t,
            &vals.iter().map(|v| Value::Int64(*v)).collect::<Vec<_>>(),
        )
        .unwrap()
    }

    fn contains(ranges: &[KeyRange], k: &[u8]) -> bool {
        ranges
            .iter()
            .any(|r| k >= r.start.as_slice() && r.end.as_ref().is_none_or(|e| k < e.as_slice()))
    }

    /// A join's keys become the points of each value's own key prefix,
    /// sorted and without duplicates: for a root table, for a table
    /// interleaved below a one-column root (whose points end with the
    /// child's table marker, after the value), and for a root keyed in
    /// descending order (integers are sorted as numbers first,
    /// `sorted_ints`).
    #[test]
    fn join_points_are_each_values_key_prefix() {
        use datafusion::arrow::datatypes::{DataType as A, Field, Schema};
        use datafusion::physical_expr::expressions::{col, in_list, lit};
        let c = catalog();
        let schema = Schema::new(vec![Field::new("a", A::Int64, false)]);
        let values = [7i64, -3, 7, 0, i64::MAX, 2, i64::MIN];
        let list = in_list(
            col("a", &schema).unwrap(),
            values.iter().map(|v| lit(*v)).collect(),
            &false,
            &schema,
        )
        .unwrap();
        for name in ["p", "c", "d"] {
            let chain: Vec<Table> = c.ancestry(name).unwrap().into_iter().cloned().collect();
            let refs: Vec<&Table> = chain.iter().collect();
            let points = join_points(&chain, Some(&(0, A::Int64)), std::slice::from_ref(&list))
                .unwrap()
                .unwrap();
            let expected = Points::from_prefixes(
                values
                    .iter()
                    .map(|v| self_catalog_prefix(&refs, &[Value::Int64(*v)], true).unwrap())
                    .collect(),
            );
            assert_eq!(points.len(), 6, "{name}");
            assert_eq!(*points, expected, "{name}");
        }
    }

    /// A stored column's value in a batch is never taken for a repeat of
    /// the value it had in the batch before (the rows of one batch are
    /// numbered after the previous batch's, see `RowDecoder::decoded`).
    #[test]
    fn a_value_after_nulls_in_a_later_batch_is_kept() {
        let c = catalog();
        let t = c.table("c").unwrap();
        let request = ScanRequest {
            chain: c.ancestry("c").unwrap().into_iter().cloned().collect(),
            ranges: vec![],
            columns: vec![2],
            limit: None,
            filter: None,
            alone: false,
        };
        let v_id = t.columns[2].id;
        let with_v = |v: i64| spindle_keys::row::encode_row(&[(v_id, &Value::Int64(v))]);
        let without_v = spindle_keys::row::encode_row(&[]);
        let schema = Arc::new(datafusion::arrow::datatypes::Schema::new(vec![
            datafusion::arrow::datatypes::Field::new(
                "v",
                datafusion::arrow::datatypes::DataType::Int64,
                true,
            ),
        ]));
        let mut rows = RowDecoder::new(&request).unwrap();
        // Each batch: v is NULL in rows 0..=8 and 7 in row 9.
        for batch in 0..2 {
            for r in 0..10 {
                let k = key(&c, "c", &[batch, r]);
                let value = if r == 9 { with_v(7) } else { without_v.clone() };
                rows.push(&k, &value).unwrap();
            }
            let b = rows.finish(&schema).unwrap();
            let last = array_value(b.column(0).as_ref(), 9).unwrap();
            assert_eq!(last, Value::Int64(7), "batch {batch}");
            assert_eq!(array_value(b.column(0).as_ref(), 8).unwrap(), Value::Null);
        }
    }

    /// A column requested twice (key or stored, present or NULL) gets its
    /// value in every copy, though each value is decoded once and moved.
    #[test]
    fn a_column_requested_twice_is_filled_in_every_copy() {
        let c = catalog();
        let t = c.table("c").unwrap();
        let request = ScanRequest {
            chain: c.ancestry("c").unwrap().into_iter().cloned().collect(),
            ranges: vec![],
            // a, b, v, a, v, b
            columns: vec![0, 1, 2, 0, 2, 1],
            limit: None,
            filter: None,
            alone: false,
        };
        let v_id = t.columns[2].id;
        let mut rows = RowDecoder::new(&request).unwrap();
        let with_v = spindle_keys::row::encode_row(&[(v_id, &Value::Int64(7))]);
        let without_v = spindle_keys::row::encode_row(&[]);
        assert_eq!(
            rows.push(&key(&c, "c", &[5, 1]), &with_v).unwrap(),
            Pushed::Row
        );
        assert_eq!(
            rows.push(&key(&c, "c", &[6, 2]), &without_v).unwrap(),
            Pushed::Row
        );
        // The parent's row is not a row of c.
        assert_eq!(
            rows.push(&key(&c, "p", &[5]), &without_v).unwrap(),
            Pushed::Other
        );
        let schema = Arc::new(datafusion::arrow::datatypes::Schema::new(
            request
                .columns
                .iter()
                .map(|i| {
                    datafusion::arrow::datatypes::Field::new(
                        &t.columns[*i].name,
                        datafusion::arrow::datatypes::DataType::Int64,
                        true,
                    )
                })
                .collect::<Vec<_>>(),
        ));
        let batch = rows.finish(&schema).unwrap();
        let column = |i: usize| -> Vec<Value> {
            (0..batch.num_rows())
                .map(|r| array_value(batch.column(i).as_ref(), r).unwrap())
                .collect()
        };
        let int = |i: i64| Value::Int64(i);
        let expected = [
            vec![int(5), int(6)],
            vec![int(1), int(2)],
            vec![int(7), Value::Null],
            vec![int(5), int(6)],
            vec![int(7), Value::Null],
            vec![int(1), int(2)],
        ];
        for (i, e) in expected.iter().enumerate() {
            assert_eq!(&column(i), e, "column {i}");
        }
        assert!(rows.is_empty());
    }

    #[test]
    fn equality_on_the_key_prefix_is_exact_and_narrow() {
        let c = catalog();
        let t = table(&c, "c");
        let f1 = col("a").eq(lit(5i64));
        let f2 = col("v").gt(lit(1i64));
        let plan = plan_key_ranges(&t.chain, &[&f1, &f2]).unwrap();
        assert_eq!(plan.exact, vec![true, false]);
        assert_eq!(plan.ranges.len(), 1);
        assert!(contains(&plan.ranges, &key(&c, "c", &[5, 1])));
        assert!(!contains(&plan.ranges, &key(&c, "c", &[6, 1])));
        // The parent row itself is outside a child-table range.
        assert!(!contains(&plan.ranges, &key(&c, "p", &[5])));
    }

    #[test]
    fn in_lists_become_sorted_points_and_desc_ranges_flip() {
        let c = catalog();
        let t = table(&c, "c");
        let f1 = col("a").in_list(vec![lit(9i64), lit(2i64), lit(2i64)], false);
        let f2 = col("b").gt_eq(lit(10i64));
        let f3 = col("b").lt(lit(20i64));
        let plan = plan_key_ranges(&t.chain, &[&f1, &f2, &f3]).unwrap();
        assert_eq!(plan.exact, vec![true, true, true]);
        assert_eq!(plan.ranges.len(), 2);
        assert!(plan.ranges[0] < plan.ranges[1]);
        for a in [2, 9] {
            assert!(contains(&plan.ranges, &key(&c, "c", &[a, 10])));
            assert!(contains(&plan.ranges, &key(&c, "c", &[a, 19])));
            assert!(!contains(&plan.ranges, &key(&c, "c", &[a, 20])));
            assert!(!contains(&plan.ranges, &key(&c, "c", &[a, 9])));
        }
        assert!(!contains(&plan.ranges, &key(&c, "c", &[3, 15])));
    }

    #[test]
    fn one_sided_ranges_exclude_nulls_and_other_filters_stay_inexact() {
        let c = catalog();
        let t = table(&c, "p");
        let f = col("a").lt(lit(3i64));
        let plan = plan_key_ranges(&t.chain, &[&f]).unwrap();
        assert_eq!(plan.exact, vec![true]);
        let null_key = c.encode_key("p", &[Value::Null]).unwrap();
        assert!(!contains(&plan.ranges, &null_key));
        assert!(contains(&plan.ranges, &key(&c, "p", &[-100])));
        assert!(!contains(&plan.ranges, &key(&c, "p", &[3])));
        // A filter on a non-key column or a non-literal is not pushed.
        let g = col("a").eq(col("a"));
        let plan = plan_key_ranges(&t.chain, &[&g]).unwrap();
        assert_eq!(plan.exact, vec![false]);
        assert_eq!(plan.ranges.len(), 1);
    }
}
