//! Code shared by Spindle's benchmark programs (`src/*.rs` and
//! `src/compare/`). A benchmark harness, not part of the database: a failed
//! setup step aborts the run with a message (`expect`), which is what a
//! measurement wants.

pub mod commits;
