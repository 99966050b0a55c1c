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
//! * [`bind`] — `$n` parameters.
//! * [`session`] — transaction blocks, autocommit, dispatch.
//! * [`ddl`], [`dml`] — schema changes and writes.
//! * [`provider`] — filters → key ranges → scans; [`info_schema`].
//! * [`types`] — Spindle ↔ Arrow types and values.
//! * [`error`] — errors and the SQLSTATE mapping.

pub mod bind;
pub mod ddl;
pub mod describe;
pub mod dml;
pub mod error;
pub(crate) mod fastpath;
pub mod hints;
pub(crate) mod index;
pub mod info_schema;
pub mod parser;
pub mod pg_catalog;
pub mod provider;
pub mod session;
pub mod settings;
pub mod subquery;
pub mod sys_schema;
pub mod types;

pub use error::{Error, Result};
pub use session::{Engine, Output, Session};

/// Runs storage work (sled reads, scans, the commit's flush) so that it
/// does not stall the async executor: on a multi-threaded tokio runtime the
/// worker hands its other tasks off first (`block_in_place`); elsewhere it
/// simply runs.
pub(crate) fn blocking<R>(f: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}
