//! The wire server's integration tests, one module per subject, built as
//! one test binary: each binary links all of DataFusion (≈ 190 MB in a
//! debug build), so a binary per file cost CI gigabytes of disk and a link
//! step apiece.

mod clients;
mod copy;
mod psql;
mod tls;
mod wire;
