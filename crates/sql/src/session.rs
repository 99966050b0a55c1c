//! The engine and its sessions: the life of a statement.
//!
//! ```text
//! Session::execute(sql, params)
//!   └─ parser::parse ─► bind::bind_params ─► for each statement: Session::execute_statement
//!        ├─ BEGIN / COMMIT / ROLLBACK ─► session transaction state
//!        └─ anything else ─► the open transaction, or Session::autocommit
//!             ├─ explicit transaction: run it; an error marks the transaction failed (25P02)
//!             └─ Session::autocommit: begin, run, commit; retried on 40001
//!                  └─ StatementContext::run
//!                       ├─ DDL    ─► catalog copy edited ─► Transaction::set_catalog
//!                       ├─ DML    ─► dml::{insert, update, delete}: WHERE evaluated as a
//!                       │            DataFusion query of keys, writes applied by key
//!                       └─ query  ─► DataFusion plan over SpindleTable providers ─► batches
//! ```
//!
//! Every statement reads one snapshot: the transaction's read timestamp
//! plus its own earlier writes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::{
    CatalogProvider, MemoryCatalogProvider, MemoryCatalogProviderList, SchemaProvider,
};
use datafusion::execution::session_state::{SessionState, SessionStateBuilder};
use datafusion::execution::TaskContext;
use datafusion::prelude::SessionConfig;
use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast;
use spindle_catalog::Catalog;
use spindle_keys::Value;
use spindle_storage::Store;
use spindle_txn::{Transaction, TxnManager};
use tracing::{debug, info_span, Instrument};

use crate::error::{Error, Result};
use crate::parser::{self, PreparedQuery, Statement};
use crate::plan_cache::Parsed;
use crate::provider::{SpindleTable, TxnHandle};
use crate::{bind, ddl, dml, info_schema};

/// Attempts for an autocommit statement that hits a serialization conflict.
const AUTOCOMMIT_ATTEMPTS: u32 = 20;

/// The result of one statement.
#[derive(Debug, Clone)]
pub enum Output {
    Rows {
        schema: SchemaRef,
        batches: Vec<RecordBatch>,
    },
    /// PostgreSQL command tag (`INSERT 0 3`, `CREATE TABLE`, …) and the
    /// number of rows it affected.
    Command { tag: Tag, rows: u64 },
}

impl Output {
    pub(crate) fn command(tag: &'static str) -> Output {
        Output::Command {
            tag: Tag::Text(tag.into()),
            rows: 0,
        }
    }

    /// The output of a statement that affected `rows` rows, tagged `verb`
    /// and the count (`INSERT 0` → `INSERT 0 3`).
    pub(crate) fn counted(verb: &'static str, rows: u64) -> Output {
        Output::Command {
            tag: Tag::Counted(verb, rows),
            rows,
        }
    }
}

/// A PostgreSQL command tag, made into text only when it is sent
/// (`Display`): an embedded caller that only wants the row count never
/// formats it (a bulk load runs one INSERT per row).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tag {
    /// The whole tag: `CREATE TABLE`, `SET`.
    Text(std::borrow::Cow<'static, str>),
    /// A verb followed by a row count: `Counted("INSERT 0", 3)` is
    /// `INSERT 0 3`.
    Counted(&'static str, u64),
}

impl std::fmt::Display for Tag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Tag::Text(t) => f.write_str(t),
            Tag::Counted(verb, n) => write!(f, "{verb} {n}"),
        }
    }
}

/// One database: storage, transactions and the DataFusion configuration.
pub struct Engine {
    mgr: Arc<TxnManager>,
    base: SessionState,
    /// Parsed statements by SQL text: a prepared statement executed again
    /// (or the same text sent again) is not parsed again. Parsing does not
    /// depend on the schema, so entries never go stale; the map is emptied
    /// when it reaches [`PARSE_CACHE_ENTRIES`].
    /// Each with its fast plan ([`crate::plan_cache`]).
    parsed: Mutex<HashMap<String, Arc<Parsed>>>,
    /// Parameterized forms of texts sent with inline values
    /// ([`crate::normalize`]), `None` for one that does not parse; emptied
    /// like `parsed`.
    normalized: Mutex<HashMap<String, Option<Arc<Parsed>>>>,
    /// Statements that took the fast path ([`crate::fastpath`]).
    fast_path: std::sync::atomic::AtomicU64,
    /// DataFusion plans of queries by text ([`crate::query_cache`]).
    queries: crate::query_cache::QueryCache,
    /// The multi-threaded runtime DataFusion plans run on when a session
    /// is driven from a single-threaded one ([`Engine::set_executor`]).
    executor: std::sync::OnceLock<tokio::runtime::Handle>,
    /// Scan counters, shared with every statement's DataFusion config.
    scan_stats: Arc<crate::join_keys::ScanStats>,
    /// The task contexts kept plans run with, each made once from `base`:
    /// indexes 0 and 1 without and with the executor, 2 and 3 the same
    /// with DataFusion's default IN-list cap ([`Engine::kept_task_ctx`]).
    kept_ctx: [std::sync::OnceLock<Arc<TaskContext>>; 4],
    /// The DataFusion session every statement's own is cloned from, made
    /// for one catalog ([`Engine::catalog_state`]).
    catalog_state: Mutex<Option<CatalogState>>,
}

/// `base` with a catalog's functions registered
/// (`pg_catalog::register_catalog_functions`) and the executor set: what
/// every statement's DataFusion session starts from while that catalog is
/// current. Building a session with `SessionStateBuilder` registers every
/// one of DataFusion's functions anew, 6% of the server's samples under a
/// stream of small prepared queries; a clone of this copies its maps.
struct CatalogState {
    catalog: Arc<Catalog>,
    /// Whether the executor was set when this was made.
    executor: bool,
    state: Arc<SessionState>,
}

/// [`Engine::set_executor`]'s runtime, carried in a statement's DataFusion
/// configuration to [`run_plan`].
#[derive(Debug)]
struct Executor(tokio::runtime::Handle);

/// Most statements [`Engine`] keeps parsed.
const PARSE_CACHE_ENTRIES: usize = 1024;
/// Longest SQL text worth keeping parsed (bulk INSERTs are sent once).
const PARSE_CACHE_MAX_SQL: usize = 4096;
/// DataFusion's partitions per plan: one. A Spindle scan reads in parallel
/// by itself (a long range's far half goes to a helper thread, see
/// `provider`), and scans of different tables run on their own threads,
/// so a second partition bought no parallelism on the reads; what it
/// added was a round-robin and a hash repartition after every scan and
/// partitioned joins and aggregates. Measured with `pgbench -T 3` on the
/// analytics data (scale 0.1), 1 against 2 partitions: Q3 5.1 / 6.2
/// against 8.0 / 7.0 ms (server CPU per query 6.4 / 7.6 against 9.8 / 8.6
/// ms), Q1 9.8 / 10.7 against 9.8 / 11.5 ms; the harness at scale 1: Q1
/// 126 against 149 ms, Q3 127 against 138 ms (bench/README.md).
const TARGET_PARTITIONS: usize = 1;

impl Engine {
    /// Opens the database in `path`, or a temporary one when `None`.
    pub fn open(path: Option<&std::path::Path>) -> Result<Arc<Engine>> {
        let store = match path {
            Some(p) => Store::open(p),
            None => Store::open_temporary(),
        }
        .map_err(spindle_txn::Error::from)?;
        let mgr = TxnManager::new(store)?;
        let mut config = SessionConfig::new()
            .with_default_catalog_and_schema("spindle", "public")
            .with_information_schema(false)
            .with_target_partitions(TARGET_PARTITIONS)
            .with_batch_size(8192);
        // A hash join's build keys reach a probe-side scan on its leading
        // key column as an IN list (then read by seeking, see
        // `join_keys`) up to this many per partition; beyond, DataFusion
        // passes a hash-table lookup, which names no keys. 8 192 left
        // Q3 at scale 1 (25 000 order keys) reading all of lineitem:
        // 65 536 took it from 127 to 70 ms (bench/README.md).
        let optimizer = &mut config.options_mut().optimizer;
        optimizer.hash_join_inlist_pushdown_max_distinct_values = 65_536;
        optimizer.hash_join_inlist_pushdown_max_size = 4 << 20;
        let scan_stats = Arc::new(crate::join_keys::ScanStats::default());
        let config = config.with_extension(scan_stats.clone());
        let mut base = SessionStateBuilder::new()
            .with_config(config)
            .with_default_features()
            // After DataFusion's logical rules in each pass: a key fixed on
            // one side of an inner join is fixed on the other too,
            .with_optimizer_rule(Arc::new(crate::join_constants::JoinConstants))
            // After DataFusion's rules: rows of a scan read as two
            // partitions reach the client in key order,
            .with_physical_optimizer_rule(Arc::new(crate::split_scan::KeyOrderAtRoot))
            // and a canceled join stops.
            .with_physical_optimizer_rule(Arc::new(crate::yield_points::YieldAfterJoins))
            .build();
        crate::pg_catalog::register_functions(&mut base)?;
        datafusion::execution::FunctionRegistry::register_expr_planner(
            &mut base,
            Arc::new(crate::checked::CheckedIntArithmetic::new()),
        )?;
        Ok(Arc::new(Engine {
            mgr,
            base,
            parsed: Mutex::new(HashMap::new()),
            normalized: Mutex::new(HashMap::new()),
            fast_path: Default::default(),
            queries: Default::default(),
            executor: Default::default(),
            scan_stats,
            kept_ctx: Default::default(),
            catalog_state: Mutex::new(None),
        }))
    }

    /// Runs the DataFusion plans of sessions driven from a single-threaded
    /// runtime on `handle` (a multi-threaded runtime) instead: the server
    /// serves each connection on its own thread, where the protocol and
    /// the fast path run without hand-offs between threads, while a
    /// query's partitions, scans and correlated subqueries still use every
    /// core. Planning stays on the session's thread; only execution moves,
    /// and not for a kept plan whose last run read little
    /// ([`Engine::inline_plan_count`]). The first handle set stays; a
    /// single-threaded `handle` is ignored.
    pub fn set_executor(&self, handle: tokio::runtime::Handle) {
        if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread {
            let _ = self.executor.set(handle);
        }
    }

    /// How many statements took the fast path (point SELECT, UPDATE and
    /// DELETE by full primary key) since the database opened.
    pub fn fast_path_count(&self) -> u64 {
        self.fast_path.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many queries ran a kept DataFusion plan instead of planning
    /// again ([`crate::query_cache`]) since the database opened.
    pub fn cached_plan_count(&self) -> u64 {
        self.queries.hits()
    }

    /// How many executions of queries with parameters ran their kept
    /// template ([`crate::params`]) since the database opened.
    pub fn template_plan_count(&self) -> u64 {
        self.queries.template_hits()
    }

    /// How many queries ran a kept plan on the session's own thread
    /// instead of [`Engine::set_executor`]'s runtime, its last run having
    /// read little ([`crate::query_cache`]), since the database opened.
    pub fn inline_plan_count(&self) -> u64 {
        self.queries.inline_runs()
    }

    /// How many scans read only the keys of a hash join's build side
    /// ([`crate::join_keys`]) since the database opened.
    pub fn join_key_scan_count(&self) -> u64 {
        self.scan_stats
            .join_key_scans
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many scans had the far half of their range read by a second
    /// thread as a second DataFusion partition ([`crate::split_scan`])
    /// since the database opened.
    pub fn split_scan_count(&self) -> u64 {
        self.scan_stats
            .split_scans
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn count_fast_path(&self) {
        self.fast_path
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Parses `sql`, or returns the statements it parsed to before.
    pub fn parse_cached(&self, sql: &str) -> Result<Arc<Parsed>> {
        if let Ok(map) = self.parsed.lock() {
            if let Some(stmts) = map.get(sql) {
                return Ok(stmts.clone());
            }
        }
        let stmts = Arc::new(Parsed::new(parser::parse(sql)?));
        if sql.len() <= PARSE_CACHE_MAX_SQL {
            remember(&self.parsed, sql, stmts.clone());
        }
        Ok(stmts)
    }

    /// The statements of a parameterized text made by
    /// [`crate::normalize`], parsed once; `None` when it does not parse.
    fn parse_normalized(&self, text: &str) -> Option<Arc<Parsed>> {
        if let Ok(map) = self.normalized.lock() {
            if let Some(entry) = map.get(text) {
                return entry.clone();
            }
        }
        let parsed = parser::parse(text).ok().map(|s| Arc::new(Parsed::new(s)));
        remember(&self.normalized, text, parsed.clone());
        parsed
    }

    pub fn session(self: &Arc<Self>) -> Session {
        Session {
            engine: self.clone(),
            txn: None,
            failed: false,
            read_only: false,
            default_read_only: false,
            txn_used: false,
            settings: crate::settings::Settings::default(),
            last_commit_ts: None,
            interrupt: Arc::default(),
        }
    }

    pub fn manager(&self) -> &Arc<TxnManager> {
        &self.mgr
    }

    /// The context a kept plan ([`crate::query_cache`]) runs in. Building
    /// a statement's [`SessionState`] registers every function and schema
    /// anew (about 6% of the server's samples under a stream of 2 ms
    /// scans), but a kept plan needs none of it: its functions are bound
    /// in the plan, it names no system table, calls no function that reads
    /// the clock, and its scans read through the transaction they were
    /// re-bound to. It only needs the configuration (the executor, the
    /// scan counters) and the runtime, the same for every statement.
    /// With `default_inlist`, DataFusion's own cap on a hash join's IN
    /// lists (`lowers_inlist_cap`).
    fn kept_task_ctx(&self, default_inlist: bool) -> Arc<TaskContext> {
        let executor = self.executor.get();
        let slot =
            &self.kept_ctx[usize::from(executor.is_some()) + 2 * usize::from(default_inlist)];
        slot.get_or_init(|| {
            let mut config = self.base.config().clone();
            if let Some(handle) = executor {
                config = config.with_extension(Arc::new(Executor(handle.clone())));
            }
            if default_inlist {
                config = default_inlist_cap(config);
            }
            Arc::new(TaskContext::from(&self.base).with_session_config(config))
        })
        .clone()
    }

    /// A DataFusion session whose `public` schema reads `catalog`'s tables
    /// through `txn`, and whose `information_schema` describes `catalog`.
    pub(crate) fn df_state(
        &self,
        catalog: Arc<Catalog>,
        txn: TxnHandle,
        include_hidden: bool,
    ) -> Result<SessionState> {
        let public = Arc::new(SpindleSchema {
            catalog: catalog.clone(),
            txn,
            include_hidden,
        });
        self.df_state_with(public, catalog)
    }

    /// The session a statement's is cloned from while `catalog` is
    /// current ([`CatalogState`]), made on first use.
    fn catalog_state(&self, catalog: &Arc<Catalog>) -> Result<Arc<SessionState>> {
        let executor = self.executor.get();
        let mut slot = self
            .catalog_state
            .lock()
            .map_err(|_| Error::Internal("the catalog session lock is poisoned".into()))?;
        if let Some(kept) = slot.as_ref() {
            if Arc::ptr_eq(&kept.catalog, catalog) && kept.executor == executor.is_some() {
                return Ok(kept.state.clone());
            }
        }
        let mut state = self.base.clone();
        crate::pg_catalog::register_catalog_functions(&mut state, catalog.clone())?;
        if let Some(handle) = executor {
            state
                .config_mut()
                .set_extension(Arc::new(Executor(handle.clone())));
        }
        let state = Arc::new(state);
        *slot = Some(CatalogState {
            catalog: catalog.clone(),
            executor: executor.is_some(),
            state: state.clone(),
        });
        Ok(state)
    }

    pub(crate) fn df_state_with(
        &self,
        public: Arc<dyn SchemaProvider>,
        catalog: Arc<Catalog>,
    ) -> Result<SessionState> {
        let cat = MemoryCatalogProvider::new();
        cat.register_schema("public", public)?;
        cat.register_schema(
            "information_schema",
            Arc::new(info_schema::InfoSchema::new(catalog.clone())),
        )?;
        cat.register_schema(
            "pg_catalog",
            Arc::new(crate::pg_catalog::PgCatalog::new(catalog.clone())),
        )?;
        cat.register_schema(
            "spindle_sys",
            Arc::new(crate::sys_schema::SysSchema::new(
                catalog.clone(),
                self.mgr.clone(),
            )),
        )?;
        let list = MemoryCatalogProviderList::new();
        datafusion::catalog::CatalogProviderList::register_catalog(
            &list,
            "spindle".into(),
            Arc::new(cat),
        );
        let mut state = (*self.catalog_state(&catalog)?).clone();
        state.register_catalog_list(Arc::new(list));
        // now() / current_timestamp are folded to this instant by the
        // optimizer; without it DataFusion fails to evaluate them.
        state.mark_start_execution();
        Ok(state)
    }
}

/// The `public` schema: Spindle tables of one catalog snapshot.
pub(crate) struct SpindleSchema {
    catalog: Arc<Catalog>,
    txn: TxnHandle,
    include_hidden: bool,
}

impl std::fmt::Debug for SpindleSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SpindleSchema")
    }
}

#[async_trait::async_trait]
impl SchemaProvider for SpindleSchema {
    fn table_names(&self) -> Vec<String> {
        self.catalog.tables().map(|t| t.name.clone()).collect()
    }

    async fn table(
        &self,
        name: &str,
    ) -> datafusion::error::Result<Option<Arc<dyn datafusion::catalog::TableProvider>>> {
        let external = |e| datafusion::error::DataFusionError::External(Box::new(e));
        // `t@idx` is a table reference with FORCE_INDEX (see `hints`).
        let (table, forced) = match self.catalog.table(name) {
            Some(t) => (t, None),
            None => match name.rsplit_once(crate::hints::FORCE_SEPARATOR) {
                Some((t, ix)) => match self.catalog.table(t) {
                    Some(t) => (t, Some(ix)),
                    None => return Ok(None),
                },
                None => return Ok(None),
            },
        };
        // DataFusion has already folded unquoted names; the catalog
        // matches exactly, so "Foo" (quoted) and foo stay distinct.
        let mut provider =
            SpindleTable::new(&self.catalog, table, self.txn.clone(), self.include_hidden)
                .map_err(external)?;
        if let Some(ix) = forced {
            provider = provider.force(ix).map_err(external)?;
        }
        Ok(Some(Arc::new(provider)))
    }

    fn table_exist(&self, name: &str) -> bool {
        self.catalog.table(name).is_some()
    }
}

/// What a statement runs with: the engine and the transaction.
pub(crate) struct StatementContext {
    pub engine: Arc<Engine>,
    pub txn: TxnHandle,
}

impl StatementContext {
    pub fn catalog(&self) -> Result<Arc<Catalog>> {
        Ok(self.lock()?.catalog().clone())
    }

    pub fn lock(&self) -> Result<std::sync::MutexGuard<'_, Transaction>> {
        self.txn
            .lock()
            .map_err(|_| Error::Internal("transaction lock poisoned".into()))
    }

    /// Plans and runs a query (or EXPLAIN) with DataFusion.
    pub async fn query(
        &self,
        stmt: ast::Statement,
        include_hidden: bool,
    ) -> Result<(SchemaRef, Vec<RecordBatch>)> {
        let catalog = self.catalog()?;
        let key = crate::query_cache::key(&stmt, include_hidden);
        if let Some(kept) = key
            .as_ref()
            .and_then(|key| self.engine.queries.get(key, &catalog))
        {
            let task_ctx = self.engine.kept_task_ctx(false);
            let physical =
                crate::query_cache::rebind(&kept, &self.txn, task_ctx.session_config().options())?;
            return self.run_kept(&kept, physical, task_ctx).await;
        }
        let state = self
            .engine
            .df_state(catalog.clone(), self.txn.clone(), include_hidden)?;
        let Some(key) = key else {
            return run_plan(state, stmt).await;
        };
        let planned = plan_query(&state, stmt).await?;
        let kept = if planned.cacheable {
            self.engine.queries.put(
                key,
                catalog,
                &planned.physical,
                planned.schema.clone(),
                &self.engine.mgr,
            )
        } else {
            None
        };
        let task_ctx = plan_task_ctx(&state, &planned.physical);
        let batches = collect(planned.physical, task_ctx, Place::Executor, kept.as_deref()).await?;
        named_output(planned.schema, batches)
    }

    /// Runs `template` (a plain query with `$n`) for `params` by its kept
    /// plan ([`crate::params`]), planning and keeping it on first use;
    /// `None` (nothing run) when the text has no template or these values
    /// do not fit it: then the caller binds them as literals.
    /// A template made from a text with inline values (`inline`) is
    /// planned at the text's second execution, not its first.
    async fn query_template(
        &self,
        prepared: &PreparedQuery,
    ) -> Result<Option<(SchemaRef, Vec<RecordBatch>)>> {
        use crate::query_cache::Template;
        let PreparedQuery {
            template,
            params,
            inline,
            key,
        } = prepared;
        let inline = inline.is_some();
        let catalog = self.catalog()?;
        let Some(key) = key
            .clone()
            .or_else(|| crate::query_cache::key(template, false).map(Arc::new))
        else {
            return Ok(None);
        };
        let kept = match self.engine.queries.template(&key, &catalog) {
            None if inline => {
                self.engine.queries.put_seen((*key).clone(), catalog);
                return Ok(None);
            }
            Some(t) if !matches!(t, Template::Seen) => t,
            _ => {
                let state = self
                    .engine
                    .df_state(catalog.clone(), self.txn.clone(), false)?;
                // A text that does not plan with its placeholders is
                // declined: the literal path plans it and reports its
                // errors as it always did.
                let planned = plan_template(&state, template.clone(), params.len())
                    .await
                    .ok()
                    .flatten();
                self.engine.queries.put_template(
                    (*key).clone(),
                    catalog,
                    planned
                        .as_ref()
                        .map(|(p, types)| (&p.physical, p.schema.clone(), types.clone())),
                    &self.engine.mgr,
                )
            }
        };
        let Template::Kept { query, types } = kept else {
            return Ok(None);
        };
        let Some(values) = crate::params::scalars(params, &types) else {
            return Ok(None);
        };
        let task_ctx = self.engine.kept_task_ctx(false);
        let Some(physical) = crate::query_cache::rebind_with(
            &query,
            &self.txn,
            task_ctx.session_config().options(),
            &values,
        )?
        else {
            return Ok(None);
        };
        self.engine.queries.count_template_run();
        self.run_kept(&query, physical, task_ctx).await.map(Some)
    }

    /// Runs `physical`, a run of the kept plan `kept` bound to this
    /// statement's transaction, in `task_ctx` (the kept plans' context):
    /// on this thread when its last run read little
    /// ([`crate::query_cache::CachedQuery::runs_inline`]).
    async fn run_kept(
        &self,
        kept: &crate::query_cache::CachedQuery,
        physical: Arc<dyn datafusion::physical_plan::ExecutionPlan>,
        task_ctx: Arc<TaskContext>,
    ) -> Result<(SchemaRef, Vec<RecordBatch>)> {
        let task_ctx = if lowers_inlist_cap(&physical) {
            self.engine.kept_task_ctx(true)
        } else {
            task_ctx
        };
        let place = if kept.runs_inline() && executor_for(&task_ctx).is_some() {
            self.engine.queries.count_inline_run();
            Place::InPlace
        } else {
            Place::Executor
        };
        let batches = collect(physical, task_ctx, place, Some(kept)).await?;
        named_output(kept.schema.clone(), batches)
    }

    /// Runs one non-transaction-control statement.
    async fn run(&self, stmt: Statement, read_only: bool) -> Result<Output> {
        // VACUUM and ANALYZE change no data (PostgreSQL runs them in
        // read-only transactions too).
        if read_only
            && !matches!(
                stmt,
                Statement::Query(_)
                    | Statement::PreparedQuery(_)
                    | Statement::ExplainDml(_)
                    | Statement::Vacuum { .. }
                    | Statement::Analyze { .. }
            )
        {
            return Err(Error::ReadOnly(format!(
                "cannot execute {} in a read-only transaction",
                stmt.tag()
            )));
        }
        match stmt {
            Statement::CreateTable {
                def,
                if_not_exists,
                row_copy,
            } => ddl::create_table(self, def, if_not_exists, row_copy).await,
            Statement::SetRowCopy { table, on } => ddl::set_row_copy(self, &table, on),
            Statement::DropTable { names, if_exists } => ddl::drop_tables(self, &names, if_exists),
            Statement::Truncate { names, cascade } => ddl::truncate(self, &names, cascade),
            Statement::CreateIndex { def, if_not_exists } => {
                ddl::create_index(self, def, if_not_exists)
            }
            Statement::DropIndex { names, if_exists } => ddl::drop_index(self, &names, if_exists),
            Statement::AddColumn {
                table,
                column,
                if_not_exists,
            } => ddl::add_column(self, &table, column, if_not_exists).await,
            Statement::DropColumn {
                table,
                column,
                if_exists,
            } => ddl::drop_column(self, &table, &column, if_exists),
            Statement::SetColumnOptions {
                table,
                column,
                allow_commit_timestamp,
            } => ddl::set_column_options(self, &table, &column, allow_commit_timestamp),
            Statement::AddPrimaryKey { table, columns } => {
                ddl::add_primary_key(self, &table, columns)
            }
            Statement::Vacuum { tables } => ddl::vacuum(self, &tables),
            Statement::Analyze { tables } => {
                ddl::check_tables_and_columns(self, &tables)?;
                Ok(Output::command("ANALYZE"))
            }
            Statement::Insert { insert, upsert } => {
                let mut stmt = ast::Statement::Insert(*insert);
                dml::rewrite_pending_commit_timestamp(&mut stmt);
                let ast::Statement::Insert(insert) = stmt else {
                    return Err(Error::Internal(
                        "INSERT rewrite changed the statement".into(),
                    ));
                };
                let n = dml::insert(self, insert, upsert).await?;
                Ok(Output::counted("INSERT 0", n))
            }
            Statement::InsertText {
                table,
                columns,
                rows,
            } => {
                let n = dml::insert_text_rows(self, &table, &columns, rows).await?;
                Ok(Output::counted("INSERT 0", n))
            }
            Statement::Update(update) => {
                let mut stmt = ast::Statement::Update(*update);
                dml::rewrite_pending_commit_timestamp(&mut stmt);
                let ast::Statement::Update(update) = stmt else {
                    return Err(Error::Internal(
                        "UPDATE rewrite changed the statement".into(),
                    ));
                };
                let n = dml::update(self, update).await?;
                Ok(Output::counted("UPDATE", n))
            }
            Statement::Delete(delete) => {
                let n = dml::delete(self, *delete).await?;
                Ok(Output::counted("DELETE", n))
            }
            Statement::Query(q) => {
                if let Some(out) = crate::fastpath::point_select(self, &q, read_only)? {
                    self.engine.count_fast_path();
                    return Ok(out);
                }
                let (schema, batches) = self.query(*q, false).await?;
                Ok(Output::Rows { schema, batches })
            }
            Statement::PreparedQuery(p) => {
                // Boxed: planning a template is a large future, and
                // `run`'s own would carry it for every statement.
                if let Some((schema, batches)) = Box::pin(self.query_template(&p)).await? {
                    return Ok(Output::Rows { schema, batches });
                }
                let PreparedQuery {
                    template,
                    params,
                    inline,
                    ..
                } = *p;
                if let Some(q) = inline {
                    return Box::pin(self.run(Statement::Query(q), read_only)).await;
                }
                let bound = bind::bind_params(vec![Statement::Query(Box::new(template))], &params)?;
                match bound.into_iter().next() {
                    Some(stmt @ Statement::Query(_)) => Box::pin(self.run(stmt, read_only)).await,
                    _ => Err(Error::Internal("a bound query is no query".into())),
                }
            }
            Statement::ExplainDml(inner) => self.explain_dml(*inner).await,
            Statement::Begin { .. }
            | Statement::Commit
            | Statement::Rollback
            | Statement::Setting(_) => Err(Error::Internal(
                "transaction control reached StatementContext::run".into(),
            )),
        }
    }
}

impl StatementContext {
    /// Runs a DML statement in a throwaway transaction at the newest
    /// snapshot (so nothing is written) and reports the rows it changes,
    /// the splits its writes fall in and how its commit would go.
    async fn explain_dml(&self, inner: Statement) -> Result<Output> {
        let scratch = StatementContext {
            engine: self.engine.clone(),
            txn: Arc::new(Mutex::new(self.engine.mgr.begin()?)),
        };
        let out = Box::pin(scratch.run(inner, false)).await?;
        let splits = scratch.lock()?.write_splits()?;
        let (tag, rows) = match out {
            Output::Command { tag, rows } => (tag.to_string(), rows),
            Output::Rows { .. } => (String::new(), 0),
        };
        let commit = match splits.len() {
            0 => "nothing to commit".to_string(),
            1 => format!("one phase (split {})", splits[0]),
            n => format!("two-phase commit across {n} splits"),
        };
        let ids: Vec<String> = splits.iter().map(|i| i.to_string()).collect();
        let lines = vec![
            format!("{tag} ({rows} rows; rolled back by EXPLAIN)"),
            format!("splits written: [{}]", ids.join(", ")),
            format!("commit: {commit}"),
        ];
        let schema = Arc::new(datafusion::arrow::datatypes::Schema::new(vec![
            datafusion::arrow::datatypes::Field::new(
                "plan",
                datafusion::arrow::datatypes::DataType::Utf8,
                false,
            ),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(datafusion::arrow::array::StringArray::from(lines))],
        )
        .map_err(datafusion::error::DataFusionError::from)?;
        Ok(Output::Rows {
            schema,
            batches: vec![batch],
        })
    }
}

pub(crate) async fn run_plan(
    state: SessionState,
    stmt: ast::Statement,
) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    let planned = plan_query(&state, stmt).await?;
    let task_ctx = plan_task_ctx(&state, &planned.physical);
    let batches = collect(planned.physical, task_ctx, Place::Executor, None).await?;
    named_output(planned.schema, batches)
}

/// A query planned by DataFusion.
struct Planned {
    /// The output schema, with the names [`named_output`] restores.
    schema: SchemaRef,
    physical: Arc<dyn datafusion::physical_plan::ExecutionPlan>,
    /// Whether the plan may be kept ([`crate::query_cache::cacheable`]).
    cacheable: bool,
}

/// `stmt`'s logical plan, after Spindle's rewrites of its syntax tree.
async fn logical_plan(
    state: &SessionState,
    mut stmt: ast::Statement,
) -> Result<datafusion::logical_expr::LogicalPlan> {
    if let ast::Statement::Query(q) = &mut stmt {
        unique_output_names(&mut q.body);
    }
    spindle_numeric_casts(&mut stmt);
    set_returning_aliases(&mut stmt);
    crate::pg_catalog::rewrite(&mut stmt);
    Ok(state
        .statement_to_plan(DfStatement::Statement(Box::new(stmt)))
        .await?)
}

/// Plans `stmt`, a query with `n` parameters, as a template
/// ([`crate::params`]): its physical plan (template scans unbound, other
/// scans bound to `state`'s transaction) and its parameters' types, or
/// `None` when it cannot be one.
async fn plan_template(
    state: &SessionState,
    stmt: ast::Statement,
    n: usize,
) -> Result<Option<(Planned, Vec<datafusion::arrow::datatypes::DataType>)>> {
    let plan = logical_plan(state, stmt).await?;
    let Some(types) = crate::params::param_types(&plan, n) else {
        return Ok(None);
    };
    let schema: SchemaRef = Arc::new(plan.schema().as_arrow().clone());
    let optimized = state.optimize(&plan)?;
    let optimized = crate::subquery::rewrite(optimized, state)?;
    let slotted = crate::params::into_slots(optimized.clone(), &types)?;
    if !crate::params::only_in_scans(&slotted, n) {
        return Ok(None);
    }
    let physical = state
        .query_planner()
        .create_physical_plan(&slotted, state)
        .await?;
    if !crate::query_cache::cacheable(&plan, &optimized, &physical)
        || !crate::params::slots_where_filled(&physical)
    {
        return Ok(None);
    }
    Ok(Some((
        Planned {
            schema,
            physical,
            cacheable: true,
        },
        types,
    )))
}

async fn plan_query(state: &SessionState, stmt: ast::Statement) -> Result<Planned> {
    let plan = logical_plan(state, stmt).await?;
    let schema: SchemaRef = Arc::new(plan.schema().as_arrow().clone());
    let optimized = state.optimize(&plan)?;
    let optimized = crate::subquery::rewrite(optimized, state)?;
    let physical = state
        .query_planner()
        .create_physical_plan(&optimized, state)
        .await?;
    let cacheable = crate::query_cache::cacheable(&plan, &optimized, &physical);
    Ok(Planned {
        schema,
        physical,
        cacheable,
    })
}

/// The batches with the output names the query asked for (see
/// `unique_output_names`).
fn named_output(
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    match restore_output_names(&schema) {
        Some(named) => {
            // Each batch renamed by its own schema: its types may differ
            // from the logical plan's (e.g. Utf8View for Utf8).
            let batches = batches
                .into_iter()
                .map(|b| match restore_output_names(&b.schema()) {
                    Some(s) => RecordBatch::try_new(s, b.columns().to_vec()),
                    None => Ok(b),
                })
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(datafusion::error::DataFusionError::from)?;
            Ok((named, batches))
        }
        None => Ok((schema, batches)),
    }
}

/// Where [`collect`] runs a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    /// On the [`Executor`] when the calling thread drives a
    /// single-threaded runtime and one is set, in place otherwise.
    Executor,
    /// In place, on the calling thread's runtime: for a kept plan whose
    /// last run read little ([`crate::query_cache::CachedQuery::runs_inline`]).
    InPlace,
}

/// Runs `physical` to completion at `place`, and when it finishes records
/// what its scans read in `kept`, the cache entry it is a run of.
/// Dropping the returned future (a cancel request) aborts the execution
/// wherever it runs.
async fn collect(
    physical: Arc<dyn datafusion::physical_plan::ExecutionPlan>,
    task_ctx: Arc<TaskContext>,
    place: Place,
    kept: Option<&crate::query_cache::CachedQuery>,
) -> datafusion::error::Result<Vec<RecordBatch>> {
    // A join's plan outlives its streams here and is freed off this
    // thread (see `DropLater`).
    let plan = DropLater::of(&physical);
    let held = kept.map(|kept| (kept, physical.clone()));
    let result = run_collect(physical, task_ctx, place).await;
    if let (Some((kept, bound)), Ok(_)) = (&held, &result) {
        kept.record_run(bound);
    }
    // Before `plan`, so that `DropLater` holds the last reference.
    drop(held);
    drop(plan);
    result
}

/// DataFusion's IN-list cap for a plan none of whose scans reads a join's
/// keys: its own default.
const UNUSED_INLIST_MAX_VALUES: usize = 150;

/// Whether `plan` runs with DataFusion's default IN-list cap
/// ([`UNUSED_INLIST_MAX_VALUES`]). A hash join hands its build side's keys
/// to its probe side as an IN list of up to
/// `hash_join_inlist_pushdown_max_distinct_values` literals — 65 536 here
/// (`Engine::open`), so that a scan on the join key reads just those keys
/// ([`crate::join_keys`]) — and beyond that as a reference to its hash
/// table. A plan whose hash joins feed no such scan would build the lists
/// for nothing: a literal per build row, made and later freed (12 150 of
/// them were a quarter of an `orders ⋈ customer` join's time, its probe
/// side keyed otherwise).
fn lowers_inlist_cap(plan: &Arc<dyn datafusion::physical_plan::ExecutionPlan>) -> bool {
    use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
    use datafusion::physical_plan::joins::HashJoinExec;
    let (mut join, mut keys) = (false, false);
    // The closure never fails.
    let _ = plan.apply(|node| {
        join |= node.downcast_ref::<HashJoinExec>().is_some();
        keys |= node
            .downcast_ref::<crate::provider::SpindleScanExec>()
            .is_some_and(|s| s.takes_join_keys());
        Ok(if keys {
            TreeNodeRecursion::Stop
        } else {
            TreeNodeRecursion::Continue
        })
    });
    join && !keys
}

/// `config` with DataFusion's default IN-list cap ([`lowers_inlist_cap`]),
/// or its own if lower.
fn default_inlist_cap(mut config: SessionConfig) -> SessionConfig {
    let cap = &mut config
        .options_mut()
        .optimizer
        .hash_join_inlist_pushdown_max_distinct_values;
    *cap = (*cap).min(UNUSED_INLIST_MAX_VALUES);
    config
}

/// The context a plan planned in `state` runs in ([`lowers_inlist_cap`]).
fn plan_task_ctx(
    state: &SessionState,
    plan: &Arc<dyn datafusion::physical_plan::ExecutionPlan>,
) -> Arc<TaskContext> {
    if lowers_inlist_cap(plan) {
        Arc::new(
            TaskContext::from(state)
                .with_session_config(default_inlist_cap(state.config().clone())),
        )
    } else {
        state.task_ctx()
    }
}

/// The executor a plan of `task_ctx` is handed to ([`Place::Executor`]):
/// the engine's, when one is set and the calling thread drives a
/// single-threaded runtime (a server connection's thread).
fn executor_for(task_ctx: &TaskContext) -> Option<tokio::runtime::Handle> {
    let single_threaded = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread);
    if !single_threaded {
        return None;
    }
    task_ctx
        .session_config()
        .get_extension::<Executor>()
        .map(|e| e.0.clone())
}

/// A plan with a hash join, freed on a helper thread, not the query's.
///
/// A hash join's plan holds its dynamic filter, and with it the build
/// side's keys as an IN list: one literal expression per key (2 469 in
/// the Q3-style join of bench/README). Freeing those took about 0.6 ms
/// of that query's 13, inside DataFusion's final aggregate (which drops
/// its finished input before it emits), so between the last row read and
/// the reply. Holding the plan until the result is collected, then
/// handing it to a helper thread, takes that off the query's path; the
/// memory freed is the same. Other plans are cheap to free and are
/// dropped in place, as is this one if no helper thread can be started.
struct DropLater(Option<Arc<dyn datafusion::physical_plan::ExecutionPlan>>);

impl DropLater {
    fn of(plan: &Arc<dyn datafusion::physical_plan::ExecutionPlan>) -> DropLater {
        use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
        use datafusion::physical_plan::joins::HashJoinExec;
        let mut join = false;
        // The closure never fails.
        let _ = plan.apply(|node| {
            join = node.downcast_ref::<HashJoinExec>().is_some();
            Ok(if join {
                TreeNodeRecursion::Stop
            } else {
                TreeNodeRecursion::Continue
            })
        });
        DropLater(join.then(|| plan.clone()))
    }
}

impl Drop for DropLater {
    fn drop(&mut self) {
        // Only the last holder frees anything: a plan shared elsewhere is
        // not freed here at all.
        if let Some(plan) = self.0.take().filter(|p| Arc::strong_count(p) == 1) {
            // On failure the job, and so the plan, is dropped here.
            let _ = crate::helper_threads::run("spindle-drop", move || drop(plan));
        }
    }
}

async fn run_collect(
    physical: Arc<dyn datafusion::physical_plan::ExecutionPlan>,
    task_ctx: Arc<TaskContext>,
    place: Place,
) -> datafusion::error::Result<Vec<RecordBatch>> {
    let executor = match place {
        Place::Executor => executor_for(&task_ctx),
        Place::InPlace => None,
    };
    match executor {
        Some(executor) => {
            let task =
                AbortOnDrop(executor.spawn(datafusion::physical_plan::collect(physical, task_ctx)));
            // A JoinError is a panic (or an abort at runtime shutdown):
            // internal, XX000.
            task.await.map_err(|e| {
                datafusion::error::DataFusionError::External(Box::new(crate::Error::Internal(
                    format!("query execution: {e}"),
                )))
            })?
        }
        None => {
            // A panic while the plan runs here ends the statement with an
            // internal error (XX000), as a panic on the executor does (its
            // JoinError), not the session's thread and its connection.
            use futures::FutureExt;
            std::panic::AssertUnwindSafe(datafusion::physical_plan::collect(physical, task_ctx))
                .catch_unwind()
                .await
                .map_err(|panic| {
                    let what = panic
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_default();
                    datafusion::error::DataFusionError::External(Box::new(crate::Error::Internal(
                        format!("query execution panicked: {what}"),
                    )))
                })?
        }
    }
}

/// A spawned task that is aborted when its handle is dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> std::future::Future for AbortOnDrop<T> {
    type Output = std::result::Result<T, tokio::task::JoinError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.0).poll(cx)
    }
}

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// PostgreSQL names the one column of a scalar set-returning function in
/// FROM after its table alias — `FROM generate_series(1, 3) AS n` has a
/// column `n`, and without an alias both are `generate_series` — where
/// DataFusion calls it `value`. Spelled out as a column alias here
/// (`AS n(n)`), so such queries (pgbench's server-side data generation,
/// `INSERT … SELECT n FROM generate_series(…) AS n`) plan as in
/// PostgreSQL. An alias that names its columns is left alone, and so is a
/// statement that uses DataFusion's name (`value`, `g.value`): both
/// spellings keep working.
pub(crate) fn set_returning_aliases(stmt: &mut ast::Statement) {
    use std::ops::ControlFlow;
    fn is_series(name: &ast::ObjectName) -> bool {
        matches!(name.0.as_slice(), [part] if part
            .as_ident()
            .is_some_and(|i| crate::parser::fold_ident(i) == "generate_series"))
    }
    // Most planned statements have no generate_series: one walk of their
    // relations and nothing else.
    let has_series = ast::visit_relations(stmt, |name| {
        if is_series(name) {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    });
    if has_series.is_continue() {
        return;
    }
    let is_value =
        |i: &ast::Ident| i.quote_style.is_none() && i.value.eq_ignore_ascii_case("value");
    let uses_value = ast::visit_expressions(stmt, |e| match e {
        ast::Expr::Identifier(i) if is_value(i) => ControlFlow::Break(()),
        ast::Expr::CompoundIdentifier(parts) if parts.last().is_some_and(is_value) => {
            ControlFlow::Break(())
        }
        _ => ControlFlow::Continue(()),
    });
    if uses_value.is_break() {
        return;
    }
    struct Alias;
    impl ast::VisitorMut for Alias {
        type Break = ();
        fn pre_visit_table_factor(&mut self, tf: &mut ast::TableFactor) -> ControlFlow<()> {
            let ast::TableFactor::Table {
                name,
                args: Some(_),
                alias,
                ..
            } = tf
            else {
                return ControlFlow::Continue(());
            };
            if !is_series(name) {
                return ControlFlow::Continue(());
            }
            let alias = alias.get_or_insert_with(|| ast::TableAlias {
                explicit: true,
                name: ast::Ident::new("generate_series"),
                columns: vec![],
                at: None,
            });
            if alias.columns.is_empty() {
                alias.columns = vec![ast::TableAliasColumnDef {
                    name: alias.name.clone(),
                    data_type: None,
                }];
            }
            ControlFlow::Continue(())
        }
    }
    let _ = ast::VisitMut::visit(stmt, &mut Alias);
}

/// `NUMERIC` without precision means Spindle's NUMERIC, DECIMAL(38, 9)
/// (DataFusion would pick a scale of 10, which cannot hold 29 integer
/// digits).
pub(crate) fn spindle_numeric_casts(stmt: &mut ast::Statement) {
    use ast::{DataType as T, ExactNumberInfo as E};
    let _ = ast::visit_expressions_mut(stmt, |e| {
        if let ast::Expr::Cast {
            data_type: dt @ (T::Numeric(E::None) | T::Decimal(E::None) | T::Dec(E::None)),
            ..
        } = e
        {
            *dt = T::Decimal(E::PrecisionAndScale(38, 9));
        }
        std::ops::ControlFlow::<()>::Continue(())
    });
}

/// Output column names as PostgreSQL gives them: a column keeps its name,
/// a function call is named after the function (`count`), anything else
/// is `?column?`. DataFusion would name them after their expression
/// (`Int64(1) + Int64(1)`) and refuses two equal names, which PostgreSQL
/// allows (`SELECT a, a`, `SELECT a+1, a+1`, `SELECT j::text, j`): a
/// repeated name is planned as `name` + [`DUP_MARK`] + a number, and
/// [`restore_output_names`] gives the output its repeated names back.
pub(crate) fn unique_output_names(body: &mut ast::SetExpr) {
    match body {
        ast::SetExpr::Select(select) => {
            let mut seen = std::collections::HashMap::<String, usize>::new();
            for item in select.projection.iter_mut() {
                let name = match item {
                    ast::SelectItem::UnnamedExpr(e) => pg_output_name(e),
                    ast::SelectItem::ExprWithAlias { alias, .. } => {
                        crate::parser::fold_ident(alias)
                    }
                    _ => continue,
                };
                let n = seen.entry(name.clone()).or_insert(0);
                *n += 1;
                let unique = if *n == 1 {
                    name
                } else {
                    format!("{name}{DUP_MARK}{n}")
                };
                match item {
                    // A column keeps DataFusion's own name unless repeated.
                    ast::SelectItem::UnnamedExpr(
                        ast::Expr::Identifier(_) | ast::Expr::CompoundIdentifier(_),
                    ) if *n == 1 => {}
                    ast::SelectItem::UnnamedExpr(expr) => {
                        let alias = ast::Ident::with_quote('"', unique);
                        *item = ast::SelectItem::ExprWithAlias {
                            expr: expr.clone(),
                            alias,
                        };
                    }
                    ast::SelectItem::ExprWithAlias { alias, .. } if *n > 1 => {
                        *alias = ast::Ident::with_quote('"', unique);
                    }
                    _ => {}
                }
            }
        }
        ast::SetExpr::SetOperation { left, right, .. } => {
            unique_output_names(left);
            unique_output_names(right);
        }
        ast::SetExpr::Query(q) => unique_output_names(&mut q.body),
        _ => {}
    }
}

/// Separates a repeated output name from the number that made it unique
/// for planning (a private-use character, never in a user's name).
pub(crate) const DUP_MARK: char = '\u{E000}';

/// The output schema with the names [`unique_output_names`] made unique
/// repeated again, as PostgreSQL names them; `None` if nothing was renamed.
pub(crate) fn restore_output_names(schema: &SchemaRef) -> Option<SchemaRef> {
    if !schema.fields().iter().any(|f| f.name().contains(DUP_MARK)) {
        return None;
    }
    let fields: Vec<datafusion::arrow::datatypes::FieldRef> = schema
        .fields()
        .iter()
        .map(|f| match f.name().split_once(DUP_MARK) {
            Some((name, _)) => Arc::new(f.as_ref().clone().with_name(name)),
            None => f.clone(),
        })
        .collect();
    Some(Arc::new(
        datafusion::arrow::datatypes::Schema::new(fields).with_metadata(schema.metadata().clone()),
    ))
}

/// PostgreSQL's name for an unnamed select item.
fn pg_output_name(e: &ast::Expr) -> String {
    match e {
        ast::Expr::Identifier(i) => crate::parser::fold_ident(i),
        ast::Expr::CompoundIdentifier(parts) => parts
            .last()
            .map(crate::parser::fold_ident)
            .unwrap_or_else(|| "?column?".into()),
        ast::Expr::Function(f) => f
            .name
            .0
            .last()
            .and_then(|p| p.as_ident())
            .map(|i| i.value.to_lowercase())
            .unwrap_or_else(|| "?column?".into()),
        ast::Expr::Nested(inner) => pg_output_name(inner),
        ast::Expr::Cast { expr, .. } => match expr.as_ref() {
            ast::Expr::Identifier(_) | ast::Expr::CompoundIdentifier(_) => pg_output_name(expr),
            other => pg_output_name(other),
        },
        _ => "?column?".into(),
    }
}

/// A connection: at most one open transaction, PostgreSQL's rules for
/// transaction blocks.
pub struct Session {
    engine: Arc<Engine>,
    /// The explicit transaction (after BEGIN), if any.
    txn: Option<TxnHandle>,
    /// An error happened inside the explicit transaction: only ROLLBACK
    /// (or COMMIT, which rolls back) is accepted.
    failed: bool,
    read_only: bool,
    /// `SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY`.
    default_read_only: bool,
    /// A statement ran in the open transaction block.
    txn_used: bool,
    /// Session parameters (SET / SHOW).
    settings: crate::settings::Settings,
    /// Commit timestamp of the last read-write transaction this session
    /// committed (`SHOW spanner.commit_timestamp`).
    last_commit_ts: Option<u64>,
    /// Raised by a cancel request to stop the running statement's wait for
    /// a row lock ([`Session::interrupt_flag`]).
    interrupt: Arc<std::sync::atomic::AtomicBool>,
}

impl Session {
    /// The flag that stops this session's running statement if it waits
    /// for a row lock: a canceller raises it and calls
    /// [`spindle_txn::TxnManager::wake_lock_waiters`]; the statement fails
    /// with 57014. Lower it before each statement.
    pub fn interrupt_flag(&self) -> Arc<std::sync::atomic::AtomicBool> {
        self.interrupt.clone()
    }

    /// Applies the session's lock settings to a transaction it begins.
    fn configure(&self, txn: &mut Transaction) {
        txn.set_lock_timeout(self.settings.lock_timeout());
        txn.set_interrupt(Some(self.interrupt.clone()));
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    pub fn in_transaction(&self) -> bool {
        self.txn.is_some()
    }

    pub fn transaction_failed(&self) -> bool {
        self.failed
    }

    pub fn settings(&self) -> &crate::settings::Settings {
        &self.settings
    }

    pub fn settings_mut(&mut self) -> &mut crate::settings::Settings {
        &mut self.settings
    }

    /// The commit timestamp (µs since the epoch) of the last read-write
    /// transaction this session committed: the value
    /// `PENDING_COMMIT_TIMESTAMP()` wrote. `SHOW spanner.commit_timestamp`
    /// returns it.
    pub fn last_commit_timestamp(&self) -> Option<i64> {
        self.last_commit_ts.map(|t| t as i64)
    }

    /// Parameter types and result columns of `sql` without running it
    /// (the wire protocol's Describe); see [`crate::describe`].
    pub async fn describe(&self, sql: &str) -> Result<Arc<crate::describe::Description>> {
        crate::describe::describe(&self.engine, self.txn.clone(), sql).await
    }

    /// Runs every statement of `sql` with positional parameters `$1…`,
    /// stopping at the first error.
    pub async fn execute(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Output>> {
        if let Some((_, out)) = self.retry_fast(|s| s.try_fast(sql, params)).await? {
            return Ok(vec![out]);
        }
        // Boxed: the general path's future is large, and moving it with
        // this one would cost every fast statement a copy of it.
        Box::pin(self.execute_general(sql, params)).await
    }

    /// Runs `sql` now if a cached fast plan can ([`crate::plan_cache`]):
    /// no planning, nothing to await. `None`: nothing was done (no plan,
    /// or an autocommit that conflicted); call [`Session::execute`]. For
    /// embedded callers that would otherwise block on `execute`'s future.
    pub fn execute_now(&mut self, sql: &str, params: &[Value]) -> Result<Option<Output>> {
        match self.try_fast(sql, params)? {
            Fast::Done(_, out) => Ok(Some(out)),
            Fast::Declined | Fast::Conflicted(_) => Ok(None),
        }
    }

    /// Runs `sql` by a cached fast plan: its own (a `$n` text, or one run
    /// before), or, for a text with its values written inline, that of its
    /// parameterized form ([`crate::normalize`]).
    fn try_fast(&mut self, sql: &str, params: &[Value]) -> Result<Fast> {
        if params.is_empty() {
            match self.try_inline_fast(sql)? {
                Fast::Declined => {}
                done => return Ok(done),
            }
        }
        let parsed = match self.engine.parse_cached(sql) {
            Ok(s) => s,
            Err(e) => {
                self.fail();
                return Err(e);
            }
        };
        self.execute_fast(&parsed, params)
    }

    /// Parses `sql` once for [`Session::execute_parsed_now`] and
    /// [`Session::execute_parsed`] (the embedded API's prepared
    /// statements). A syntax error fails an open transaction block, as
    /// running the text would.
    pub fn prepare(&mut self, sql: &str) -> Result<Arc<Parsed>> {
        self.engine.parse_cached(sql).inspect_err(|_| self.fail())
    }

    /// [`Session::execute_now`] of statements parsed before
    /// ([`Session::prepare`]), without looking their text up again. Their
    /// fast plan is remade when the catalog changed since it was made.
    pub fn execute_parsed_now(
        &mut self,
        parsed: &Parsed,
        params: &[Value],
    ) -> Result<Option<Output>> {
        match self.execute_fast(parsed, params)? {
            Fast::Done(_, out) => Ok(Some(out)),
            Fast::Declined | Fast::Conflicted(_) => Ok(None),
        }
    }

    /// [`Session::execute`] of statements parsed before
    /// ([`Session::prepare`]).
    pub async fn execute_parsed(
        &mut self,
        parsed: &Parsed,
        params: &[Value],
    ) -> Result<Vec<Output>> {
        if let Some((_, out)) = self.retry_fast(|s| s.execute_fast(parsed, params)).await? {
            return Ok(vec![out]);
        }
        Box::pin(self.execute_general_parsed(parsed, params, None)).await
    }

    /// The statements of `sql`, bound and run the general way.
    async fn execute_general(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Output>> {
        let parsed = match self.engine.parse_cached(sql) {
            Ok(s) => s,
            Err(e) => {
                self.fail();
                return Err(e);
            }
        };
        self.execute_general_parsed(&parsed, params, Some(sql))
            .await
    }

    /// `parsed`'s statements, bound and run the general way.
    /// `sql` is the text `parsed` was parsed from, when there is one.
    async fn execute_general_parsed(
        &mut self,
        parsed: &Parsed,
        params: &[Value],
        sql: Option<&str>,
    ) -> Result<Vec<Output>> {
        let stmts = match parsed.stmts.as_slice() {
            // A query with parameters may run by its kept template.
            [Statement::Query(q)]
                if !params.is_empty()
                    && matches!(**q, ast::Statement::Query(_))
                    && self.settings.generic_plans() =>
            {
                // A row count given as a parameter is written in: the
                // template of that count runs.
                let (template, params, key) = match crate::params::inline_row_counts(q, params) {
                    Some((template, params)) => (template, params, None),
                    None => ((**q).clone(), params.to_vec(), parsed.template_key()),
                };
                vec![Statement::PreparedQuery(Box::new(PreparedQuery {
                    template,
                    params,
                    inline: None,
                    key,
                }))]
            }
            _ => match sql {
                Some(sql) if params.is_empty() => self.with_templates(sql, parsed.stmts.clone()),
                _ => bind::bind_params(parsed.stmts.clone(), params)?,
            },
        };
        let mut out = Vec::with_capacity(stmts.len());
        for stmt in stmts {
            let tag = stmt.tag();
            let span = info_span!("statement", kind = tag, rows = tracing::field::Empty);
            let r = self
                .execute_statement(stmt)
                .instrument(span.clone())
                .await?;
            if let Output::Command { rows, .. } = &r {
                span.record("rows", rows);
            }
            out.push(r);
        }
        Ok(out)
    }

    /// Runs `sql`, one statement with its values written inline, by the
    /// fast plan of its parameterized form ([`crate::normalize`]); returns
    /// the statement's tag and output, or `None` (nothing done) for the
    /// general path to run `sql`.
    pub async fn execute_inline_fast(
        &mut self,
        sql: &str,
    ) -> Result<Option<(&'static str, Output)>> {
        self.retry_fast(|s| s.try_inline_fast(sql)).await
    }

    /// Runs `attempt` until it is done or declines, pausing after each
    /// conflict ([`conflict_pause`]).
    async fn retry_fast(
        &mut self,
        mut attempt: impl FnMut(&mut Self) -> Result<Fast>,
    ) -> Result<Option<(&'static str, Output)>> {
        let mut n = 0;
        loop {
            n += 1;
            match attempt(self)? {
                Fast::Done(tag, out) => return Ok(Some((tag, out))),
                Fast::Declined => return Ok(None),
                Fast::Conflicted(e) => conflict_pause(n, e).await?,
            }
        }
    }

    /// `stmts`, parsed from `sql` with no parameters: a single plain
    /// query whose text has inline values becomes a
    /// [`Statement::PreparedQuery`] of its parameterized form
    /// (`crate::normalize`), which runs by a kept template
    /// ([`crate::params`]) when the form has one, else as sent.
    /// Anything else is returned as it is.
    pub fn with_templates(&self, sql: &str, stmts: Vec<Statement>) -> Vec<Statement> {
        let plain = |s: &[Statement]| match s {
            [Statement::Query(q)] => matches!(&**q, ast::Statement::Query(q) if q.locks.is_empty()),
            _ => false,
        };
        if !plain(&stmts) || sql.len() > PARSE_CACHE_MAX_SQL || !self.settings.generic_plans() {
            return stmts;
        }
        let Some(n) = crate::normalize::normalize(sql) else {
            return stmts;
        };
        let Some(parsed) = self.engine.parse_normalized(&n.text) else {
            return stmts;
        };
        match (parsed.stmts.as_slice(), stmts.as_slice()) {
            ([Statement::Query(template)], [Statement::Query(q)]) if plain(&parsed.stmts) => {
                vec![Statement::PreparedQuery(Box::new(PreparedQuery {
                    template: (**template).clone(),
                    params: n.params,
                    inline: Some(q.clone()),
                    key: parsed.template_key(),
                }))]
            }
            _ => stmts,
        }
    }

    fn try_inline_fast(&mut self, sql: &str) -> Result<Fast> {
        if self.failed || sql.len() > PARSE_CACHE_MAX_SQL {
            return Ok(Fast::Declined);
        }
        let Some(n) = crate::normalize::normalize(sql) else {
            return Ok(Fast::Declined);
        };
        let Some(parsed) = self.engine.parse_normalized(&n.text) else {
            return Ok(Fast::Declined);
        };
        self.execute_fast(&parsed, &n.params)
    }

    /// Runs `parsed`'s one statement by its fast plan with `params`
    /// ([`crate::plan_cache`]): in the open transaction block, or in an
    /// autocommit transaction of its own (one attempt).
    fn execute_fast(&mut self, parsed: &Parsed, params: &[Value]) -> Result<Fast> {
        let [stmt] = parsed.stmts.as_slice() else {
            return Ok(Fast::Declined);
        };
        if params.is_empty()
            && matches!(
                stmt,
                Statement::Begin { .. } | Statement::Commit | Statement::Rollback
            )
        {
            // Nothing to plan: run here, not through the general path,
            // whose future (large: it holds every statement's planning)
            // would be built, boxed and moved for a BEGIN or a COMMIT.
            let tag = stmt.tag();
            let span = info_span!("statement", kind = tag);
            let _entered = span.enter();
            if let Some(out) = self.transaction_control(stmt) {
                return out.map(|out| Fast::Done(tag, out));
            }
        }
        if self.failed
            || !matches!(
                stmt,
                Statement::Query(_)
                    | Statement::Insert { .. }
                    | Statement::Update(_)
                    | Statement::Delete(_)
            )
        {
            return Ok(Fast::Declined);
        }
        let tag = stmt.tag();
        let span = info_span!("statement", kind = tag, rows = tracing::field::Empty);
        let _entered = span.enter();
        let Some(txn) = self.txn.clone() else {
            return self.autocommit_fast(parsed, params, tag);
        };
        let ctx = StatementContext {
            engine: self.engine.clone(),
            txn,
        };
        match run_fast(&ctx, parsed, params, self.read_only) {
            Ok(Some(out)) => {
                self.txn_used = true;
                if let Output::Command { rows, .. } = &out {
                    span.record("rows", rows);
                }
                Ok(Fast::Done(tag, out))
            }
            Ok(None) => Ok(Fast::Declined),
            Err(e) => {
                self.txn_used = true;
                self.failed = true;
                Err(e)
            }
        }
    }

    /// One autocommit attempt of a fast plan. A serialization conflict at
    /// commit is [`Fast::Conflicted`] (nothing was written; the caller
    /// waits and tries again).
    fn autocommit_fast(
        &mut self,
        parsed: &Parsed,
        params: &[Value],
        tag: &'static str,
    ) -> Result<Fast> {
        let query = matches!(parsed.stmts.as_slice(), [Statement::Query(_)]);
        // Stale reads are rare; they take the general path.
        if query && self.stale_read_ts()?.is_some() {
            return Ok(Fast::Declined);
        }
        let mut txn = self.engine.mgr.begin()?;
        self.configure(&mut txn);
        if query {
            // A fast-path query writes nothing (a point read, a key
            // range, a constant; FOR UPDATE only locks): its transaction
            // need not keep what it read for validation.
            txn.untracked_reads();
        }
        let txn = Arc::new(Mutex::new(txn));
        let ctx = StatementContext {
            engine: self.engine.clone(),
            txn: txn.clone(),
        };
        // A statement that waited for a row lock may fail to refresh its
        // snapshot (40001); in autocommit that is retried like a commit's.
        let out = match run_fast(&ctx, parsed, params, self.default_read_only) {
            Ok(Some(out)) => out,
            Ok(None) => return Ok(Fast::Declined),
            Err(Error::Txn(e)) if e.is_retryable() => return Ok(Fast::Conflicted(e)),
            Err(e) => return Err(e),
        };
        match self.commit_own(&txn)? {
            Ok(()) => Ok(Fast::Done(tag, out)),
            Err(e) if e.is_retryable() => Ok(Fast::Conflicted(e)),
            Err(e) => Err(e.into()),
        }
    }

    /// Marks an open transaction block failed (25P02 until ROLLBACK), as
    /// after an error the session did not see (the wire server's protocol
    /// errors). Outside a transaction block it does nothing.
    pub fn fail(&mut self) {
        if self.txn.is_some() {
            self.failed = true;
        }
    }

    /// BEGIN, COMMIT and ROLLBACK (`None` for any other statement): run
    /// synchronously, with no planning, by the fast path and by
    /// [`Session::execute_statement`] alike.
    fn transaction_control(&mut self, stmt: &Statement) -> Option<Result<Output>> {
        Some(match stmt {
            Statement::Begin { read_only } => self.begin(*read_only),
            Statement::Commit => self.commit(),
            Statement::Rollback => {
                self.txn = None;
                self.failed = false;
                Ok(Output::command("ROLLBACK"))
            }
            _ => return None,
        })
    }

    fn begin(&mut self, read_only: bool) -> Result<Output> {
        if self.txn.is_none() {
            let mut txn = match self.stale_read_ts()? {
                Some(ts) if read_only => self.engine.mgr.begin_at(ts)?,
                _ => self.engine.mgr.begin()?,
            };
            self.configure(&mut txn);
            self.txn = Some(Arc::new(Mutex::new(txn)));
            self.failed = false;
            self.read_only = read_only || self.default_read_only;
            self.txn_used = false;
        } else if self.failed {
            return Err(Error::InFailedTransaction);
        }
        Ok(Output::command("BEGIN"))
    }

    fn commit(&mut self) -> Result<Output> {
        let Some(txn) = self.txn.take() else {
            return Ok(Output::command("COMMIT"));
        };
        if std::mem::take(&mut self.failed) {
            return Ok(Output::command("ROLLBACK"));
        }
        let mut guard = txn
            .lock()
            .map_err(|_| Error::Internal("transaction lock poisoned".into()))?;
        if let Some(info) = crate::commit_txn(&mut guard)? {
            self.last_commit_ts = Some(info.ts);
        }
        Ok(Output::command("COMMIT"))
    }

    pub async fn execute_statement(&mut self, stmt: Statement) -> Result<Output> {
        if let Some(out) = self.transaction_control(&stmt) {
            return out;
        }
        match stmt {
            Statement::Setting(setting) => {
                if self.failed {
                    return Err(Error::InFailedTransaction);
                }
                if let crate::settings::SettingStatement::Transaction {
                    read_only: Some(ro),
                    session,
                } = setting
                {
                    if session {
                        self.default_read_only = ro;
                    } else if self.txn.is_some() {
                        if !ro && self.read_only && self.txn_used {
                            return Err(Error::InvalidTransactionState(
                                "transaction read-write mode must be set before any query".into(),
                            ));
                        }
                        self.read_only = ro;
                    }
                    // Outside a transaction block PostgreSQL ignores it too.
                }
                match &setting {
                    crate::settings::SettingStatement::Show { name }
                        if name.eq_ignore_ascii_case(COMMIT_TIMESTAMP_PARAM) =>
                    {
                        let row = self
                            .last_commit_ts
                            .map(|t| vec![crate::types::format_timestamp(t as i64)]);
                        return crate::describe::string_rows(
                            &[COMMIT_TIMESTAMP_PARAM.to_string()],
                            vec![row.unwrap_or_default()],
                        );
                    }
                    crate::settings::SettingStatement::Set { name, .. }
                        if name.eq_ignore_ascii_case(COMMIT_TIMESTAMP_PARAM) =>
                    {
                        return Err(Error::CantChangeRuntimeParam(format!(
                            "parameter \"{COMMIT_TIMESTAMP_PARAM}\" cannot be changed"
                        )));
                    }
                    _ => {}
                }
                let tag = Statement::Setting(setting.clone()).tag();
                let applied = self.settings.apply(&setting)?;
                if let Some(txn) = &self.txn {
                    let mut txn = txn
                        .lock()
                        .map_err(|_| Error::Internal("transaction lock poisoned".into()))?;
                    self.configure(&mut txn);
                }
                match applied {
                    None => Ok(Output::command(tag)),
                    Some((columns, rows)) => crate::describe::string_rows(&columns, rows),
                }
            }
            stmt => {
                if self.failed {
                    return Err(Error::InFailedTransaction);
                }
                if matches!(stmt, Statement::Vacuum { .. }) && self.txn.is_some() {
                    self.failed = true;
                    return Err(Error::ActiveTransaction(
                        "VACUUM cannot run inside a transaction block".into(),
                    ));
                }
                match &self.txn {
                    Some(txn) => {
                        let ctx = StatementContext {
                            engine: self.engine.clone(),
                            txn: txn.clone(),
                        };
                        self.txn_used = true;
                        let r = ctx.run(stmt, self.read_only).await;
                        if r.is_err() {
                            self.failed = true;
                        }
                        r
                    }
                    None => self.autocommit(stmt).await,
                }
            }
        }
    }

    /// The snapshot a read-only transaction or a single query reads, from
    /// the session setting `spanner.read_only_staleness` (Spanner's timestamp
    /// bounds, in PGAdapter's spelling):
    ///
    /// | value                          | reads at                                   |
    /// |--------------------------------|--------------------------------------------|
    /// | `STRONG` (default)             | the newest commit                          |
    /// | `EXACT_STALENESS 10s`          | exactly 10 s ago                           |
    /// | `MAX_STALENESS 10s`            | any time in the last 10 s: the newest      |
    /// | `READ_TIMESTAMP <timestamp>`   | exactly that timestamp                     |
    /// | `MIN_READ_TIMESTAMP <timestamp>` | at or after it: the newest               |
    ///
    /// Durations take `us`, `ms`, `s`, `m` or `h`. A timestamp older than the
    /// version retention window (1 hour by default) is refused (72000).
    fn stale_read_ts(&self) -> Result<Option<u64>> {
        // Asked before every autocommit query: borrowed, not copied.
        let Some(value) = self.settings.value("spanner.read_only_staleness") else {
            return Ok(None);
        };
        parse_staleness(value, now_micros())
    }

    /// Commits an autocommit statement's own transaction and records its
    /// commit timestamp. The inner error is the commit's (a conflict the
    /// caller may retry); the outer one a poisoned lock.
    fn commit_own(
        &mut self,
        txn: &Mutex<Transaction>,
    ) -> Result<std::result::Result<(), spindle_txn::Error>> {
        let mut t = txn
            .lock()
            .map_err(|_| Error::Internal("transaction lock poisoned".into()))?;
        Ok(crate::commit_txn(&mut t).map(|info| {
            if let Some(info) = info {
                self.last_commit_ts = Some(info.ts);
            }
        }))
    }

    /// Runs `stmt` in a transaction of its own and commits it, retrying
    /// serialization conflicts.
    async fn autocommit(&mut self, stmt: Statement) -> Result<Output> {
        let query = matches!(stmt, Statement::Query(_) | Statement::PreparedQuery(_));
        let mut attempt = 0;
        loop {
            attempt += 1;
            let stale = if query { self.stale_read_ts()? } else { None };
            let mut txn = match stale {
                Some(ts) => self.engine.mgr.begin_at(ts)?,
                None => self.engine.mgr.begin()?,
            };
            self.configure(&mut txn);
            let txn = Arc::new(Mutex::new(txn));
            let ctx = StatementContext {
                engine: self.engine.clone(),
                txn: txn.clone(),
            };
            let out = match ctx.run(stmt.clone(), self.default_read_only).await {
                Ok(out) => out,
                Err(Error::Txn(e)) if e.is_retryable() => {
                    conflict_pause(attempt, e).await?;
                    continue;
                }
                Err(e) => return Err(e),
            };
            match self.commit_own(&txn)? {
                Ok(()) => return Ok(out),
                Err(e) if e.is_retryable() => conflict_pause(attempt, e).await?,
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// Keeps `value` under `key` in a statement cache, emptying it first when
/// it holds [`PARSE_CACHE_ENTRIES`].
fn remember<V>(map: &Mutex<HashMap<String, V>>, key: &str, value: V) {
    if let Ok(mut map) = map.lock() {
        if map.len() >= PARSE_CACHE_ENTRIES {
            map.clear();
        }
        map.insert(key.to_string(), value);
    }
}

/// After an autocommit statement's `attempt`-th serialization conflict:
/// waits a little longer each time before the next attempt, or returns the
/// conflict once [`AUTOCOMMIT_ATTEMPTS`] have failed.
async fn conflict_pause(attempt: u32, e: spindle_txn::Error) -> Result<()> {
    if attempt >= AUTOCOMMIT_ATTEMPTS {
        return Err(e.into());
    }
    debug!(attempt, "autocommit statement conflicted; retrying");
    tokio::time::sleep(std::time::Duration::from_millis(u64::from(attempt) * 2)).await;
    Ok(())
}

/// What a fast-plan attempt did.
enum Fast {
    /// Ran: the statement's tag and output.
    Done(&'static str, Output),
    /// Nothing done: no plan, or it declined the parameters.
    Declined,
    /// An autocommit attempt conflicted at commit; nothing was written.
    Conflicted(spindle_txn::Error),
}

/// Runs `parsed`'s fast plan for the catalog of `ctx`'s transaction, if
/// it has one and may run (no write in a `read_only` transaction); `None`:
/// nothing was written, the general path runs the statement.
fn run_fast(
    ctx: &StatementContext,
    parsed: &Parsed,
    params: &[Value],
    read_only: bool,
) -> Result<Option<Output>> {
    let catalog = ctx.catalog()?;
    let Some(plan) = parsed.fast_plan(&catalog) else {
        return Ok(None);
    };
    if plan.writes() && read_only {
        return Ok(None);
    }
    let r = plan.run(ctx, &catalog, params);
    if !matches!(r, Ok(None)) {
        ctx.engine.count_fast_path();
    }
    r
}

/// Read-only session parameter: the last commit timestamp (PGAdapter's name).
const COMMIT_TIMESTAMP_PARAM: &str = "spanner.commit_timestamp";

pub(crate) fn now_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// Parses a `spanner.read_only_staleness` value into a read timestamp
/// (`None`: read the newest snapshot).
pub(crate) fn parse_staleness(value: &str, now: u64) -> Result<Option<u64>> {
    let bad = || {
        Error::InvalidParameterValue(format!(
            "invalid read_only_staleness \"{value}\": expected STRONG, EXACT_STALENESS <duration>, \
             MAX_STALENESS <duration>, READ_TIMESTAMP <timestamp> or MIN_READ_TIMESTAMP <timestamp>"
        ))
    };
    let v = value.trim();
    let (kind, arg) = v
        .split_once(char::is_whitespace)
        .map(|(k, a)| (k, a.trim()))
        .unwrap_or((v, ""));
    let duration = |a: &str| -> Option<u64> {
        let digits = a.trim_end_matches(|c: char| c.is_ascii_alphabetic());
        let n: f64 = digits.trim().parse().ok()?;
        let unit = a[digits.len()..].to_ascii_lowercase();
        let micros = match unit.as_str() {
            "us" => n,
            "ms" => n * 1e3,
            "s" | "" => n * 1e6,
            "m" => n * 60e6,
            "h" => n * 3600e6,
            _ => return None,
        };
        (micros >= 0.0).then_some(micros as u64)
    };
    match kind.to_ascii_uppercase().as_str() {
        "STRONG" if arg.is_empty() => Ok(None),
        "MAX_STALENESS" => duration(arg).map(|_| None).ok_or_else(bad),
        "EXACT_STALENESS" => duration(arg)
            .map(|d| Some(now.saturating_sub(d)))
            .ok_or_else(bad),
        "READ_TIMESTAMP" => crate::types::parse_timestamp(arg)
            .map(|t| Some(t.max(0) as u64))
            .ok_or_else(bad),
        "MIN_READ_TIMESTAMP" => crate::types::parse_timestamp(arg)
            .map(|_| None)
            .ok_or_else(bad),
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::catalog::MemTable;
    use datafusion::prelude::SessionContext;

    async fn plan(
        ctx: &SessionContext,
        sql: &str,
    ) -> Arc<dyn datafusion::physical_plan::ExecutionPlan> {
        ctx.sql(sql)
            .await
            .unwrap()
            .create_physical_plan()
            .await
            .unwrap()
    }

    /// A context with tables `a` and `b`, each of one INT64 column `k`
    /// holding 1, 2, 3.
    fn two_tables() -> SessionContext {
        let ctx = SessionContext::new();
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
        for name in ["a", "b"] {
            let batch = RecordBatch::try_new(
                schema.clone(),
                vec![Arc::new(Int64Array::from(vec![1, 2, 3]))],
            )
            .unwrap();
            let table = MemTable::try_new(schema.clone(), vec![vec![batch]]).unwrap();
            ctx.register_table(name, Arc::new(table)).unwrap();
        }
        ctx
    }

    /// A join's plan is held until its result is collected, then freed
    /// (on a helper thread); a plan without a join is not held at all.
    #[tokio::test]
    async fn a_join_plan_is_freed_after_its_query() {
        let ctx = two_tables();
        let join = plan(&ctx, "SELECT a.k FROM a JOIN b ON a.k = b.k").await;
        let weak = Arc::downgrade(&join);
        let later = DropLater::of(&join);
        assert!(later.0.is_some(), "a hash join's plan is held");
        let rows = collect(join, ctx.task_ctx(), Place::Executor, None)
            .await
            .unwrap();
        assert_eq!(rows.iter().map(|b| b.num_rows()).sum::<usize>(), 3);
        assert!(weak.upgrade().is_some(), "held until the holder goes");
        drop(later);
        let freed = (0..500).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            weak.upgrade().is_none()
        });
        assert!(freed, "the plan was never freed");

        let scan = plan(&ctx, "SELECT k FROM a").await;
        assert!(DropLater::of(&scan).0.is_none());
    }

    /// A plan with a hash join and no scan that reads a join's keys runs
    /// with DataFusion's default IN-list cap; a plan without a join with
    /// the engine's. (Plans whose scans read join keys keep the engine's
    /// cap: `tests/join_keys.rs`, an 857-key join read by its keys.)
    #[tokio::test]
    async fn only_plans_without_join_key_scans_get_the_default_inlist_cap() {
        let ctx = two_tables();
        let cap = |ctx: &TaskContext| {
            ctx.session_config()
                .options()
                .optimizer
                .hash_join_inlist_pushdown_max_distinct_values
        };
        let mut state = ctx.state();
        state
            .config_mut()
            .options_mut()
            .optimizer
            .hash_join_inlist_pushdown_max_distinct_values = 65_536;
        let join = plan(&ctx, "SELECT a.k FROM a JOIN b ON a.k = b.k").await;
        assert!(lowers_inlist_cap(&join));
        assert_eq!(cap(&plan_task_ctx(&state, &join)), UNUSED_INLIST_MAX_VALUES);
        let scan = plan(&ctx, "SELECT k FROM a").await;
        assert!(!lowers_inlist_cap(&scan));
        assert_eq!(cap(&plan_task_ctx(&state, &scan)), 65_536);
    }

    /// A partition whose stream panics when polled.
    #[derive(Debug)]
    struct Panics(SchemaRef);

    impl datafusion::physical_plan::streaming::PartitionStream for Panics {
        fn schema(&self) -> &SchemaRef {
            &self.0
        }

        fn execute(
            &self,
            _ctx: Arc<TaskContext>,
        ) -> datafusion::execution::SendableRecordBatchStream {
            let stream = futures::stream::once(async {
                panic!("a broken operator");
            });
            Box::pin(
                datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(
                    self.0.clone(),
                    stream,
                ),
            )
        }
    }

    /// A panic in a plan run in place is an internal error of the
    /// statement (as one on the executor is), not the caller's panic.
    #[tokio::test(flavor = "current_thread")]
    async fn a_panic_in_a_plan_run_in_place_is_an_internal_error() {
        let ctx = SessionContext::new();
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
        let exec = datafusion::physical_plan::streaming::StreamingTableExec::try_new(
            schema.clone(),
            vec![Arc::new(Panics(schema))],
            None,
            Vec::<datafusion::physical_expr::LexOrdering>::new(),
            false,
            None,
        )
        .unwrap();
        let err = collect(Arc::new(exec), ctx.task_ctx(), Place::InPlace, None)
            .await
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("query execution panicked: a broken operator"),
            "{err}"
        );
    }
}
