//! PostgreSQL's built-in functions that clients call to find out where they
//! are: `version()`, `current_database()`, `current_schema()`,
//! `current_user()`, `session_user()`, `pg_backend_pid()`.
//!
//! They are constants of the engine (one database, `spindle`, one schema,
//! `public`; users are not modelled, so the user is `spindle` too) and are
//! registered on the engine's base DataFusion state ([`register_functions`]).
//! `version()` starts with `PostgreSQL 15.0` because drivers parse it; the
//! rest names Spindle.
//!
//! Not built yet: the `pg_catalog` tables psql's `\d` queries read
//! (pg_class, pg_namespace, pg_attribute, …) and functions such as
//! `format_type` and `pg_table_is_visible`.

use std::sync::Arc;

use datafusion::common::ScalarValue;
use datafusion::execution::session_state::SessionState;
use datafusion::logical_expr::{create_udf, ColumnarValue, Volatility};

use crate::error::Result;

/// The database name `current_database()` reports.
pub const DATABASE_NAME: &str = "spindle";

/// The `version()` string.
pub fn version() -> String {
    format!(
        "PostgreSQL 15.0 (Spindle {}) on {}-{}, compiled by rustc",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::ARCH,
        std::env::consts::OS
    )
}

fn constant(name: &str, value: ScalarValue) -> datafusion::logical_expr::ScalarUDF {
    let ty = value.data_type();
    create_udf(
        name,
        vec![],
        ty,
        Volatility::Stable,
        Arc::new(move |_args: &[ColumnarValue]| Ok(ColumnarValue::Scalar(value.clone()))),
    )
}

/// Registers the functions on `state` (replacing DataFusion's own
/// `version()`).
pub fn register_functions(state: &mut SessionState) -> Result<()> {
    use datafusion::execution::registry::FunctionRegistry;
    let text = |s: &str| ScalarValue::Utf8(Some(s.to_string()));
    for udf in [
        constant("version", text(&version())),
        constant("current_database", text(DATABASE_NAME)),
        constant("current_catalog", text(DATABASE_NAME)),
        constant("current_schema", text("public")),
        constant("current_user", text("spindle")),
        constant("session_user", text("spindle")),
        constant(
            "pg_backend_pid",
            ScalarValue::Int64(Some(std::process::id() as i64)),
        ),
    ] {
        state.register_udf(Arc::new(udf))?;
    }
    Ok(())
}
