//! # spindle-sql: the SQL front end
//!
//! Parses statements (sqlparser as re-exported by DataFusion, plus our own
//! grammar for interleaving), runs DDL against the catalog, runs queries on
//! DataFusion over table providers that read the store, and applies DML by
//! primary key. Arrow and DataFusion types never leave this crate's
//! internals except in [`Output::Rows`].
//!
//! Modules, in the order a statement meets them:
//! * [`parser`] — statements, including CREATE TABLE … INTERLEAVE IN PARENT.
//! * [`plan_cache`] — statements kept by SQL text with their fast plans
//!   (a statement sent again is neither parsed nor planned again);
//!   `tree_join` — the fast plan of a join whose tables are all read by key
//!   or index prefixes the WHERE fixes (a row tree read with one join).
//! * `normalize` — a text with inline values run by the cached plan of
//!   its parameterized form.
//! * [`bind`] — `$n` parameters.
//! * [`session`] — transaction blocks, autocommit, dispatch.
//! * [`ddl`], [`dml`] — schema changes and writes.
//! * `query_cache` — DataFusion plans of queries kept by text, re-bound
//!   to each transaction (a query sent again is not planned again).
//! * [`provider`] — filters → key ranges → scans; [`info_schema`].
//! * `join_constants` — a key fixed on one side of an inner join
//!   fixed on the other (so a row tree's third table is read by key).
//! * `join_keys` — a hash join's build-side keys as the key ranges of
//!   its probe-side scan (read by seeking).
//! * [`types`] — Spindle ↔ Arrow types and values; `checked` — INT64
//!   `+ - *` that fail on overflow instead of wrapping.
//! * [`error`] — errors and the SQLSTATE mapping.

pub mod bind;
pub(crate) mod checked;
pub mod ddl;
pub mod describe;
pub mod dml;
pub mod error;
pub(crate) mod fastpath;
pub(crate) mod helper_threads;
pub mod hints;
pub(crate) mod index;
pub mod info_schema;
pub(crate) mod join_constants;
pub(crate) mod join_keys;
pub(crate) mod normalize;
pub(crate) mod params;
pub mod parser;
pub mod pg_catalog;
pub mod plan_cache;
pub mod provider;
mod query_cache;
pub mod row_filter;
pub mod session;
pub mod settings;
mod split_scan;
pub mod subquery;
pub mod sys_schema;
pub(crate) mod tree_join;
pub mod types;
mod yield_points;

pub use error::{Error, Result};
pub use session::{Engine, Output, Session, Tag};

/// Runs long storage work (scans, backfills, a commit's flush) so that it
/// does not stall the async executor: on a multi-threaded tokio runtime the
/// worker hands its other tasks off first (`block_in_place`); elsewhere it
/// simply runs.
///
/// Point reads by key do not go through here: the store answers them from memory
/// in microseconds, while `block_in_place` wakes another thread to take the
/// worker's tasks and back (a perf profile of point selects over the wire
/// showed more time in those hand-offs than in the reads). A commit
/// without writes does not either (see [`commit_txn`]).
/// Commits `txn`: through [`blocking`] when it has writes (the commit
/// waits for the disk), inline otherwise.
pub(crate) fn commit_txn(
    txn: &mut spindle_txn::Transaction,
) -> std::result::Result<Option<spindle_txn::CommitInfo>, spindle_txn::Error> {
    if txn.has_writes() {
        blocking(|| txn.commit())
    } else {
        txn.commit()
    }
}

pub(crate) fn blocking<R>(f: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}
