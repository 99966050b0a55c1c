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
pub mod dml;
pub mod error;
pub mod info_schema;
pub mod parser;
pub mod provider;
pub mod session;
pub mod subquery;
pub mod types;

pub use error::{Error, Result};
pub use session::{Engine, Output, Session};
