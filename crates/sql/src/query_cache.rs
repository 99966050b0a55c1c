//! DataFusion plans of queries kept by their statement's text.
//!
//! Planning a query with DataFusion (SQL to logical plan, the logical
//! optimizer, the physical planner and its optimizer) takes milliseconds:
//! about 2.7 ms of a TPC-H Q1-style aggregate's 13 ms and 3.8 ms of a
//! three-table join's 17 ms (bench/README.md). A query sent again with the
//! same text gets the physical plan made the first time, re-bound to its
//! own transaction:
//!
//! ```text
//! SELECT … (ast) ─ text + hidden-columns flag ─▶ cached? ── no ─▶ plan ─▶ cacheable? ─▶ keep
//!                                                  │ yes (same Arc<Catalog>)
//!                                                  ▼
//!      every SpindleScanExec: new snapshots of the same ranges in this transaction
//!      every other node: ExecutionPlan::reset_state (hash tables, dynamic filters, …)
//!      then the joins' dynamic filters made anew (post-optimization filter pushdown)
//!                                                  ▼
//!                                               execute
//!            on the session's thread if the last run read ≤ INLINE_BUDGET,
//!            else on the engine's executor (when it has one); the run's
//!            scans' reads recorded for the next run
//! ```
//!
//! Invariants:
//! * A plan is used only with the catalog it was made from (the entry
//!   holds that `Arc<Catalog>`; pointers are compared): any schema change
//!   makes a new catalog, so a plan never outlives the tables, columns and
//!   indexes it was planned against.
//! * A kept plan depends on nothing but the text and the catalog. So only
//!   a plain query is kept (no `FOR UPDATE`, no EXPLAIN), only when every
//!   function it calls is immutable (`now()`, `random()`, `current_user`
//!   and the correlated-subquery UDF are not: the optimizer folds or
//!   captures them when planning), and only when every leaf of its
//!   physical plan is a Spindle scan: system views and
//!   `information_schema` tables are materialized when planned, and a
//!   constant-row leaf may be an aggregate the optimizer answered from such
//!   a table's statistics (`count(*)` folded to a number). A query of
//!   constants alone plans quickly anyway.
//! * A kept plan holds nothing of the transaction that planned it: its
//!   scans are kept unbound (no snapshot, so no copy of that transaction's
//!   uncommitted writes; no index reader), and an unbound scan that ran
//!   would fail rather than read nothing.
//! * Every execution reads through its own transaction: a Spindle scan
//!   node holds the snapshots it was bound to, and re-binding takes new
//!   ones, which the transaction records as its reads (serializability
//!   sees them as it sees a freshly planned query's).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::ScalarValue;
use datafusion::logical_expr::{Expr, LogicalPlan, Volatility};
use datafusion::physical_optimizer::filter_pushdown::FilterPushdown;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::sql::sqlparser::ast;
use spindle_catalog::Catalog;
use spindle_txn::TxnManager;

use crate::provider::{SpindleScanExec, TxnHandle, INLINE_BUDGET};

/// Most plans (and, apart, most templates) kept: when a map is full, the
/// half least recently used is dropped ([`Recent`]).
const ENTRIES: usize = 256;

/// A map that keeps the entries used most recently: each entry holds the
/// tick of its last use, and a full map drops the older half at once (a
/// linear pass per `ENTRIES / 2` insertions). Many texts seen once (ad-hoc
/// queries, each leaving a [`Template::Seen`]) so push out the entries not
/// used since, not the ones a workload runs all the time.
struct Recent<V> {
    map: HashMap<Key, (u64, V)>,
    tick: u64,
}

impl<V> Default for Recent<V> {
    fn default() -> Self {
        Recent {
            map: HashMap::new(),
            tick: 0,
        }
    }
}

impl<V> Recent<V> {
    /// The entry for `key`, marked used.
    fn get(&mut self, key: &Key) -> Option<&V> {
        self.tick += 1;
        let tick = self.tick;
        self.map.get_mut(key).map(|(used, v)| {
            *used = tick;
            &*v
        })
    }

    fn insert(&mut self, key: Key, value: V) {
        if self.map.len() >= ENTRIES && !self.map.contains_key(&key) {
            let mut ticks: Vec<u64> = self.map.values().map(|(t, _)| *t).collect();
            let mid = ticks.len() / 2;
            let (_, median, _) = ticks.select_nth_unstable(mid);
            let median = *median;
            self.map.retain(|_, (t, _)| *t > median);
        }
        self.tick += 1;
        self.map.insert(key, (self.tick, value));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.len()
    }
}

/// A kept plan.
pub(crate) struct CachedQuery {
    catalog: Arc<Catalog>,
    pub physical: Arc<dyn ExecutionPlan>,
    /// The logical plan's output schema (names as the client sees them).
    pub schema: SchemaRef,
    /// What the plan's scans read in its last finished run, in
    /// [`INLINE_BUDGET`] units ([`scan_cost`]); `u64::MAX` until a run
    /// is recorded.
    last_cost: AtomicU64,
    /// Whether any node of the plan held a dynamic filter when it was
    /// made (a hash join's, a top-N sort's): only then does [`rebind`]
    /// run the filter pushdown that makes them anew.
    dynamic_filters: bool,
}

impl CachedQuery {
    /// Whether the plan's last finished run read little enough that the
    /// next one may run on the session's own thread instead of the
    /// engine's executor: at most [`INLINE_BUDGET`] in all its scans,
    /// which is what one scan reads on the polling thread anyway. Such a
    /// run takes about a millisecond of reading at most, and handing it
    /// to the executor (a task spawned there, its wake-up, then the
    /// session's) cost about 0.1 ms, a quarter of an aggregate over an
    /// empty table (bench/README.md, session 39). A plan that read more
    /// keeps the executor, whose threads run a split scan's two halves'
    /// operators in parallel. The decision follows the data: a table
    /// that grew sends the plan back to the executor after one run.
    pub fn runs_inline(&self) -> bool {
        self.last_cost.load(Ordering::Relaxed) <= INLINE_BUDGET
    }

    /// Records what `bound` (this plan, bound and run to completion) read.
    pub fn record_run(&self, bound: &Arc<dyn ExecutionPlan>) {
        self.last_cost.store(scan_cost(bound), Ordering::Relaxed);
    }
}

/// What the scans of `plan` (bound and run) have read, in
/// [`INLINE_BUDGET`] units.
fn scan_cost(plan: &Arc<dyn ExecutionPlan>) -> u64 {
    let mut cost = 0u64;
    // The closure never fails.
    let _ = plan.apply(|node| {
        if let Some(scan) = node.downcast_ref::<SpindleScanExec>() {
            cost = cost.saturating_add(scan.read_cost());
        }
        Ok(TreeNodeRecursion::Continue)
    });
    cost
}

/// A kept plan's key: the query's text and whether hidden columns are
/// visible ([`key`]).
pub(crate) type Key = (String, bool);

/// What is kept for a query text with parameters.
#[derive(Clone)]
pub(crate) enum Template {
    /// Its plan, run again for each execution's values, and the types
    /// of its parameters.
    Kept {
        query: Arc<CachedQuery>,
        types: Arc<[DataType]>,
    },
    /// Planned per execution with its values as literals.
    Declined,
    /// A text sent with inline values seen once: planned as a template
    /// when seen again (a query typed once is not planned twice).
    Seen,
}

/// `physical` as a kept plan: its scans unbound, so that it holds nothing
/// of the planning transaction (its uncommitted writes in a scan's
/// snapshot, an index scan's reader); `None` if a scan cannot be.
fn keep(
    catalog: Arc<Catalog>,
    physical: &Arc<dyn ExecutionPlan>,
    schema: SchemaRef,
    mgr: &Arc<TxnManager>,
) -> Option<CachedQuery> {
    // Asked of the plan as made: a hash join given new children (the
    // unbound scans) drops its filter until the pushdown runs again. A
    // walk that fails (it cannot) counts as finding one.
    let dynamic_filters = physical
        .exists(|node| Ok(!node.dynamic_expressions_produced().is_empty()))
        .unwrap_or(true);
    let unbound = physical.clone().transform_up(|node| {
        Ok(match node.downcast_ref::<SpindleScanExec>() {
            Some(scan) => {
                Transformed::yes(Arc::new(scan.unbind(mgr.clone())?) as Arc<dyn ExecutionPlan>)
            }
            None => Transformed::no(node),
        })
    });
    let Ok(Transformed { data: physical, .. }) = unbound else {
        return None;
    };
    Some(CachedQuery {
        catalog,
        physical,
        schema,
        last_cost: AtomicU64::new(u64::MAX),
        dynamic_filters,
    })
}

/// The cache, one per engine.
#[derive(Default)]
pub(crate) struct QueryCache {
    plans: Mutex<Recent<Arc<CachedQuery>>>,
    hits: AtomicU64,
    /// Templates of query texts with parameters ([`crate::params`]), with
    /// the catalog each was decided under.
    templates: Mutex<Recent<(Arc<Catalog>, Template)>>,
    template_hits: AtomicU64,
    /// Kept plans run on the session's thread ([`CachedQuery::runs_inline`]).
    inline_runs: AtomicU64,
}

/// The key of a statement that may be kept: its text and whether hidden
/// columns are visible; `None` for anything but a plain query.
pub(crate) fn key(stmt: &ast::Statement, include_hidden: bool) -> Option<(String, bool)> {
    match stmt {
        ast::Statement::Query(q) if q.locks.is_empty() => Some((stmt.to_string(), include_hidden)),
        _ => None,
    }
}

impl QueryCache {
    /// The plan kept for `key`, if it was made from `catalog`.
    pub fn get(&self, key: &(String, bool), catalog: &Arc<Catalog>) -> Option<Arc<CachedQuery>> {
        let mut map = self.plans.lock().ok()?;
        let hit = map.get(key).filter(|c| Arc::ptr_eq(&c.catalog, catalog))?;
        self.hits.fetch_add(1, Ordering::Relaxed);
        Some(hit.clone())
    }

    /// Keeps a plan (replacing one made from an older catalog), its scans
    /// unbound: the cache holds nothing of the planning transaction (its
    /// uncommitted writes in a scan's snapshot, an index scan's reader).
    /// Returns the entry, whose first run ([`CachedQuery::record_run`])
    /// is the planning run of `physical`; `None` if it was not kept.
    pub fn put(
        &self,
        key: (String, bool),
        catalog: Arc<Catalog>,
        physical: &Arc<dyn ExecutionPlan>,
        schema: SchemaRef,
        mgr: &Arc<TxnManager>,
    ) -> Option<Arc<CachedQuery>> {
        let kept = Arc::new(keep(catalog, physical, schema, mgr)?);
        let mut map = self.plans.lock().ok()?;
        map.insert(key, kept.clone());
        Some(kept)
    }

    /// What is kept for a query text with parameters, if it was decided
    /// under `catalog` ([`crate::params`]).
    pub fn template(&self, key: &(String, bool), catalog: &Arc<Catalog>) -> Option<Template> {
        let mut map = self.templates.lock().ok()?;
        let (made_for, t) = map.get(key)?;
        if !Arc::ptr_eq(made_for, catalog) {
            return None;
        }
        Some(t.clone())
    }

    /// Keeps `template` for a query text under `catalog`, its scans
    /// unbound (as [`QueryCache::put`]); a kept template whose plan cannot
    /// be unbound is declined instead.
    pub fn put_template(
        &self,
        key: (String, bool),
        catalog: Arc<Catalog>,
        planned: Option<(&Arc<dyn ExecutionPlan>, SchemaRef, Vec<DataType>)>,
        mgr: &Arc<TxnManager>,
    ) -> Template {
        let t = match planned {
            Some((physical, schema, types)) => match keep(catalog.clone(), physical, schema, mgr) {
                Some(q) => Template::Kept {
                    query: Arc::new(q),
                    types: types.into(),
                },
                None => Template::Declined,
            },
            None => Template::Declined,
        };
        self.remember_template(key, catalog, t.clone());
        t
    }

    /// Records a first sighting of a text with inline values
    /// ([`Template::Seen`]).
    pub fn put_seen(&self, key: (String, bool), catalog: Arc<Catalog>) {
        self.remember_template(key, catalog, Template::Seen);
    }

    fn remember_template(&self, key: Key, catalog: Arc<Catalog>, t: Template) {
        if let Ok(mut map) = self.templates.lock() {
            map.insert(key, (catalog, t));
        }
    }

    /// Counts an execution that runs a kept template.
    pub fn count_template_run(&self) {
        self.template_hits.fetch_add(1, Ordering::Relaxed);
    }

    /// Executions that ran a kept template since the engine opened.
    pub fn template_hits(&self) -> u64 {
        self.template_hits.load(Ordering::Relaxed)
    }

    /// Queries that ran a kept plan since the engine opened.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// Counts a kept plan run on the session's thread.
    pub fn count_inline_run(&self) {
        self.inline_runs.fetch_add(1, Ordering::Relaxed);
    }

    /// Kept plans run on the session's thread since the engine opened.
    pub fn inline_runs(&self) -> u64 {
        self.inline_runs.load(Ordering::Relaxed)
    }
}

/// Whether a query planned as `logical` (before optimization, when
/// `now()` and the like are still calls), `rewritten` (after the
/// correlated-subquery rewrite) and `physical` may be kept.
pub(crate) fn cacheable(
    logical: &LogicalPlan,
    rewritten: &LogicalPlan,
    physical: &Arc<dyn ExecutionPlan>,
) -> bool {
    !calls_non_immutable(logical)
        && !calls_non_immutable(rewritten)
        && physical
            .exists(|p| Ok(p.children().is_empty() && !p.is::<SpindleScanExec>()))
            .is_ok_and(|other_leaf| !other_leaf)
}

/// Whether any expression of `plan` or of its subqueries calls a
/// volatile or stable function.
fn calls_non_immutable(plan: &LogicalPlan) -> bool {
    let mut found = false;
    let walk = plan.apply_with_subqueries(|node| {
        node.apply_expressions(|e| {
            e.apply(|e| {
                if let Expr::ScalarFunction(f) = e {
                    if f.func.signature().volatility != Volatility::Immutable {
                        found = true;
                        return Ok(TreeNodeRecursion::Stop);
                    }
                }
                Ok(TreeNodeRecursion::Continue)
            })
        })?;
        Ok(if found {
            TreeNodeRecursion::Stop
        } else {
            TreeNodeRecursion::Continue
        })
    });
    // A walk that failed decides nothing: treat the plan as not cacheable.
    found || walk.is_err()
}

/// `plan` ready to run again in `txn`: scans bound to it, every other
/// node's execution state reset, and the dynamic filters of its joins
/// made anew.
///
/// Resetting a hash join drops its dynamic filter, and a re-bound scan
/// holds none (the old one was completed with the last run's build keys,
/// which must not restrict this run's scan); the physical optimizer's
/// post-optimization filter pushdown, run again, gives each join a new
/// filter and pushes it to its scans, as when the plan was made.
///
/// A plan none of whose nodes held a dynamic filter when it was made
/// ([`CachedQuery::dynamic_filters`]: no hash join with one, no top-N
/// sort) gets none from the pushdown either, which is then not run (3% of
/// the server's time in a template run of a filtered scan, session 43).
pub(crate) fn rebind(
    kept: &CachedQuery,
    txn: &TxnHandle,
    options: &ConfigOptions,
) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
    // A plan kept by its text has no template scans: with no parameters
    // every scan is re-bound as it is.
    rebind_with(kept, txn, options, &[])?.ok_or_else(|| {
        datafusion::error::DataFusionError::Internal("a kept plan did not re-bind".into())
    })
}

/// [`rebind`] of a template's plan for one execution's `params`: each
/// template scan planned again with the values (`SpindleScanExec::rebind_with`).
/// `None` when a scan decides otherwise for them than the template did
/// (then the query is planned with its values).
pub(crate) fn rebind_with(
    kept: &CachedQuery,
    txn: &TxnHandle,
    options: &ConfigOptions,
    params: &[ScalarValue],
) -> datafusion::error::Result<Option<Arc<dyn ExecutionPlan>>> {
    let mut misfit = false;
    let fresh = kept
        .physical
        .clone()
        .transform_up(|node| {
            if misfit {
                return Ok(Transformed::no(node));
            }
            let fresh: Arc<dyn ExecutionPlan> = match node.downcast_ref::<SpindleScanExec>() {
                Some(scan) => match scan.rebind_with(txn, params)? {
                    Some(s) => Arc::new(s),
                    None => {
                        misfit = true;
                        return Ok(Transformed::no(node));
                    }
                },
                None => match crate::params::fill_slots(&node, params)? {
                    Some(filled) => filled,
                    None => node.reset_state()?,
                },
            };
            Ok(Transformed::yes(fresh))
        })
        .map(|t| t.data)?;
    if misfit {
        return Ok(None);
    }
    if !kept.dynamic_filters {
        return Ok(Some(fresh));
    }
    FilterPushdown::new_post_optimization()
        .optimize(fresh, options)
        .map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: usize) -> Key {
        (format!("SELECT {i}"), false)
    }

    #[test]
    fn a_full_map_keeps_what_was_used_lately() {
        let mut m = Recent::default();
        for i in 0..ENTRIES {
            m.insert(key(i), i);
        }
        assert_eq!(m.len(), ENTRIES);
        // The first ten are used again; the next insertion drops the half
        // used least recently, which no longer holds them.
        for i in 0..10 {
            assert_eq!(m.get(&key(i)), Some(&i));
        }
        m.insert(key(ENTRIES), ENTRIES);
        assert_eq!(m.len(), ENTRIES / 2);
        for i in 0..10 {
            assert_eq!(m.get(&key(i)), Some(&i), "{i} was used lately");
        }
        assert_eq!(m.get(&key(10)), None);
        assert_eq!(m.get(&key(ENTRIES - 1)), Some(&(ENTRIES - 1)));
        assert_eq!(m.get(&key(ENTRIES)), Some(&ENTRIES));
        // Replacing an entry of a full map drops nothing.
        let mut full = Recent::default();
        for i in 0..ENTRIES {
            full.insert(key(i), i);
        }
        full.insert(key(3), 33);
        assert_eq!(full.len(), ENTRIES);
        assert_eq!(full.get(&key(3)), Some(&33));
    }
}
