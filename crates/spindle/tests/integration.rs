//! The embedded API's integration tests, one module per subject, built as
//! one test binary: each binary links all of DataFusion (≈ 180 MB in a
//! debug build), so a binary per file cost CI gigabytes of disk and a link
//! step apiece. The SQL logic tests keep their own binary (`slt.rs`, a
//! custom harness).
//!
//! Tests re-executing this binary to run one test alone (the crash tests)
//! name it by its module path (`common::libtest_name`).

mod common;

mod commit_ts;
mod concurrency;
mod crash;
mod crash_2pc;
mod fastpath;
mod hidden_keys;
mod indexes;
mod join_constants;
mod join_keys;
mod output_names;
mod pg_scripts;
mod prepared;
mod query_cache;
mod retired;
mod row_filter;
mod split_scan;
mod splits;
mod templates;
mod tree_join;
