//! Statements kept by SQL text, each with its fast plan.
//!
//! The engine keeps every statement it parsed (up to a bound) under its SQL
//! text, so a statement sent again — a prepared statement executed over
//! the wire, or the same `$n` text run again through the embedded API — is
//! neither parsed nor planned again:
//!
//! ```text
//! "SELECT v FROM kv WHERE id = $1" ──▶ Parsed { stmts, fast }
//!                                              │
//!        planned against catalog C ◀───────────┘  (Arc<Catalog>, Option<FastPlan>)
//!
//! execute(sql, [7]):  txn.catalog() is C ? ── yes ─▶ run the plan with [7]
//!                                         └─ no ──▶ plan again for the new catalog
//! plan None, or it declines the parameters ──▶ bind + the general path
//! ```
//!
//! Invariants:
//! * A plan is used only with the catalog it was made from: the cache
//!   holds that `Arc<Catalog>` and compares pointers with the
//!   transaction's (so the pointer cannot be reused by another catalog
//!   while the plan lives). Any schema change makes a new catalog.
//! * Running a plan gives what binding the parameters and running the
//!   statement the general way gives — the same matchers decide
//!   (`fastpath::plan_select`, `dml::plan_insert`, `dml::plan_update`, `dml::plan_delete`), and
//!   parameters are checked against the key columns' types when the plan
//!   runs (`fastpath::Slot`). A plan that declines (a parameter
//!   of another type, a missing one) has written nothing.
//! * "No fast plan" is cached too, so a statement the fast path cannot run
//!   costs one pointer comparison per execution, not another match.
//! * The text's description (parameter types and result columns, the wire
//!   protocol's Parse/Describe: [`crate::describe`]) is kept the same way,
//!   under the catalog it was made against: it depends on nothing else
//!   (the types DataFusion infers come from the schema, never from rows or
//!   session settings), so a client that sends every statement as an
//!   unnamed Parse plans it once per schema, not once per execution.

use std::sync::{Arc, Mutex};

use spindle_catalog::Catalog;
use spindle_keys::Value;

use crate::describe::Description;
use crate::dml::{
    plan_delete, plan_insert, plan_update, run_delete, run_insert, run_update, DeletePlan,
    InsertPlan, UpdatePlan,
};
use crate::error::Result;
use crate::fastpath::{
    plan_constant, plan_select, run_constant, run_select, ConstantPlan, SelectPlan,
};
use crate::parser::Statement;
use crate::session::{Output, StatementContext};
use crate::tree_join::{plan_tree_join, run_tree_join, TreeJoinPlan};

/// A statement planned to run without binding or DataFusion.
#[derive(Debug)]
pub(crate) enum FastPlan {
    Select(SelectPlan),
    TreeJoin(TreeJoinPlan),
    Constant(ConstantPlan),
    Insert(InsertPlan),
    Update(UpdatePlan),
    Delete(DeletePlan),
}

impl FastPlan {
    fn new(catalog: &Catalog, stmt: &Statement) -> Option<FastPlan> {
        match stmt {
            Statement::Query(q) => plan_select(catalog, q)
                .map(FastPlan::Select)
                .or_else(|| plan_tree_join(catalog, q).map(FastPlan::TreeJoin))
                .or_else(|| plan_constant(q).map(FastPlan::Constant)),
            Statement::Insert { insert, upsert } => {
                plan_insert(catalog, insert, *upsert).map(FastPlan::Insert)
            }
            Statement::Update(u) => plan_update(catalog, u).map(FastPlan::Update),
            Statement::Delete(d) => plan_delete(catalog, d).map(FastPlan::Delete),
            _ => None,
        }
    }

    /// Whether running the plan writes or locks (refused in a read-only
    /// transaction).
    pub(crate) fn writes(&self) -> bool {
        // SELECT … FOR UPDATE locks: not in a read-only transaction (where
        // the general path runs it as a plain SELECT).
        !matches!(self, FastPlan::Constant(_) | FastPlan::TreeJoin(_))
            && !matches!(self, FastPlan::Select(p) if !p.for_update)
    }

    /// Runs the plan in `ctx`'s transaction, whose catalog is `catalog`
    /// (the one the plan was made from). `None`: the parameters do not suit
    /// the plan, nothing was written, take the general path.
    pub(crate) fn run(
        &self,
        ctx: &StatementContext,
        catalog: &Catalog,
        params: &[Value],
    ) -> Result<Option<Output>> {
        let command = |verb: &'static str, n: Option<u64>| n.map(|n| Output::counted(verb, n));
        match self {
            FastPlan::Select(p) => run_select(ctx, catalog, p, params),
            FastPlan::TreeJoin(p) => run_tree_join(ctx, catalog, p, params),
            FastPlan::Constant(p) => run_constant(p, params),
            FastPlan::Insert(p) => Ok(command("INSERT 0", run_insert(ctx, catalog, p, params)?)),
            FastPlan::Update(p) => Ok(command("UPDATE", run_update(ctx, catalog, p, params)?)),
            FastPlan::Delete(p) => Ok(command("DELETE", run_delete(ctx, catalog, p, params)?)),
        }
    }
}

/// A fast plan (or none) and the catalog it was made against.
type PlannedFor = (Arc<Catalog>, Option<Arc<FastPlan>>);

/// The statements of one SQL text, and the fast plan of the only one.
pub struct Parsed {
    pub stmts: Vec<Statement>,
    /// The catalog the plan was made against, and the plan (`None`: the
    /// fast path cannot run the text).
    fast: Mutex<Option<PlannedFor>>,
    /// The catalog the text was described against, and its description.
    described: Mutex<Option<(Arc<Catalog>, Arc<Description>)>>,
    /// The key of the text's only statement as a template
    /// ([`crate::query_cache::key`], the statement printed), made on
    /// first use: a prepared query looks its template up at every
    /// execution.
    template_key: std::sync::OnceLock<Option<Arc<crate::query_cache::Key>>>,
}

impl Parsed {
    pub(crate) fn new(stmts: Vec<Statement>) -> Parsed {
        Parsed {
            stmts,
            fast: Mutex::new(None),
            described: Mutex::new(None),
            template_key: std::sync::OnceLock::new(),
        }
    }

    /// The template key of the text's only statement, a plain query
    /// ([`crate::query_cache::key`]).
    pub(crate) fn template_key(&self) -> Option<Arc<crate::query_cache::Key>> {
        self.template_key
            .get_or_init(|| match self.stmts.as_slice() {
                [Statement::Query(q)] => crate::query_cache::key(q, false).map(Arc::new),
                _ => None,
            })
            .clone()
    }

    /// The description kept for `catalog`, if it was made against it.
    pub(crate) fn description(&self, catalog: &Arc<Catalog>) -> Option<Arc<Description>> {
        let kept = self.described.lock().ok()?;
        kept.as_ref()
            .filter(|(c, _)| Arc::ptr_eq(c, catalog))
            .map(|(_, d)| d.clone())
    }

    /// Keeps `description`, made against `catalog` (replacing one made
    /// against another).
    pub(crate) fn keep_description(&self, catalog: Arc<Catalog>, description: Arc<Description>) {
        // Poisoned: a panic elsewhere; the text is then described anew
        // each time.
        if let Ok(mut kept) = self.described.lock() {
            *kept = Some((catalog, description));
        }
    }

    /// The fast plan of this text under `catalog`, made on first use.
    pub(crate) fn fast_plan(&self, catalog: &Arc<Catalog>) -> Option<Arc<FastPlan>> {
        let [stmt] = self.stmts.as_slice() else {
            return None;
        };
        // A poisoned lock only means a panic elsewhere while planning; the
        // statement then simply takes the general path.
        let mut cached = self.fast.lock().ok()?;
        if let Some((c, plan)) = cached.as_ref() {
            if Arc::ptr_eq(c, catalog) {
                return plan.clone();
            }
        }
        let plan = FastPlan::new(catalog, stmt).map(Arc::new);
        *cached = Some((catalog.clone(), plan.clone()));
        plan
    }
}

impl std::fmt::Debug for Parsed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parsed")
            .field("stmts", &self.stmts)
            .finish()
    }
}
