//! Helpers shared by the integration tests that include this module.

use spindle::{Session, Value};

/// The rows of a query, as values.
pub fn rows(s: &mut Session, sql: &str) -> Vec<Vec<Value>> {
    rows_with(s, sql, &[])
}

/// The rows of a query with parameters, as values.
pub fn rows_with(s: &mut Session, sql: &str, params: &[Value]) -> Vec<Vec<Value>> {
    s.query(sql, params)
        .unwrap()
        .rows()
        .unwrap()
        .iter()
        .map(|r| r.values().to_vec())
        .collect()
}

/// A plan line's `output_rows` metric (DataFusion prints thousands with
/// three digits, as `4.29 K`).
#[allow(dead_code)] // not every test that includes this module uses it
pub fn output_rows(line: &str) -> f64 {
    metric(line, "output_rows")
}

/// A plan line's count metric `name` (DataFusion prints thousands with
/// three digits, as `4.29 K`).
#[allow(dead_code)] // not every test that includes this module uses it
pub fn metric(line: &str, name: &str) -> f64 {
    let n = line
        .split(&format!("{name}="))
        .nth(1)
        .unwrap_or_else(|| panic!("no {name} in {line}"))
        .split([',', ']'])
        .next()
        .unwrap();
    match n.strip_suffix(" K") {
        Some(k) => k.parse::<f64>().unwrap() * 1000.0,
        None => n.parse().unwrap(),
    }
}

/// The name libtest knows test `name` of the module at `module_path` by
/// (`crash::name`: the module path without the test crate's own name), for
/// re-executing this test binary with `--exact` to run that test alone.
pub fn libtest_name(module_path: &str, name: &str) -> String {
    match module_path.split_once("::") {
        Some((_, module)) => format!("{module}::{name}"),
        None => name.to_string(),
    }
}
