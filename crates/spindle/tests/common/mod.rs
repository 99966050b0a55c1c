//! Helpers shared by the integration tests that include this module.

use spindle::{Session, Value};

/// The rows of a query, as values.
pub fn rows(s: &mut Session, sql: &str) -> Vec<Vec<Value>> {
    s.query(sql, &[])
        .unwrap()
        .rows()
        .unwrap()
        .iter()
        .map(|r| r.values().to_vec())
        .collect()
}
