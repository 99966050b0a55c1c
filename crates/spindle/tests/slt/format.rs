//! How result values are printed for comparison with `.slt` expectations.
//!
//! One formatting for every backend: a backend turns its results into
//! [`spindle::Value`]s and this module prints them.
//!
//! | value            | printed as                                   |
//! |------------------|----------------------------------------------|
//! | NULL             | `NULL`                                       |
//! | empty string     | `(empty)`                                    |
//! | INT64            | `42`                                         |
//! | FLOAT64          | `1.500` (`{:.3}`), `NaN`, `Infinity`         |
//! | BOOL             | `true` / `false`                             |
//! | NUMERIC          | plain decimal without trailing zeros: `12.5` |
//! | DATE             | `2024-02-29`                                 |
//! | TIMESTAMP        | `2024-01-02 03:04:05.5+00` (UTC, PG style)   |
//! | BYTES            | `\x616263` (PG hex style)                    |
//! | STRING, JSON     | the text itself                              |

use spindle::Value;

/// Formatting options. `sqlite` reproduces the original sqllogictest
/// runner's quirks (it formats by the type letters of the `query` line): an
/// `R` column prints integers as floats, an `I` column prints booleans as
/// `1`/`0` (SQLite has no boolean type), and characters outside printable
/// ASCII print as `@`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Style {
    pub sqlite: bool,
}

/// Formats one value; `hint` is the column's type letter from the `query`
/// line (`I`, `R`, `T`), when known.
pub fn format_value(v: &Value, hint: Option<char>, style: Style) -> String {
    if style.sqlite && hint == Some('I') {
        if let Value::Bool(b) = v {
            return (if *b { "1" } else { "0" }).to_string();
        }
    }
    if style.sqlite && hint == Some('R') {
        match v {
            Value::Int64(i) => return format_float(*i as f64),
            Value::Numeric(n) => return format_float(*n as f64 / 1e9),
            _ => {}
        }
    }
    let s = match v {
        Value::Null => return "NULL".to_string(),
        Value::Int64(i) => i.to_string(),
        Value::Float64(f) => format_float(*f),
        Value::Bool(b) => b.to_string(),
        Value::String(s) | Value::Json(s) => s.clone(),
        Value::Bytes(b) => {
            let mut s = String::with_capacity(2 + 2 * b.len());
            s.push_str("\\x");
            for byte in b {
                s.push_str(&format!("{byte:02x}"));
            }
            s
        }
        Value::Date(d) => format_date(*d as i64),
        Value::Timestamp(t) => format_timestamp(*t),
        Value::Numeric(n) => format_numeric(*n),
    };
    if s.is_empty() {
        return "(empty)".to_string();
    }
    if style.sqlite {
        return s
            .chars()
            .map(|c| if (' '..='~').contains(&c) { c } else { '@' })
            .collect();
    }
    s
}

pub fn format_float(f: f64) -> String {
    if f.is_nan() {
        "NaN".to_string()
    } else if f.is_infinite() {
        (if f > 0.0 { "Infinity" } else { "-Infinity" }).to_string()
    } else {
        format!("{f:.3}")
    }
}

/// NUMERIC is an i128 scaled by 10^9.
pub fn format_numeric(v: i128) -> String {
    const SCALE: u128 = 1_000_000_000;
    let abs = v.unsigned_abs();
    let (int, frac) = (abs / SCALE, abs % SCALE);
    let mut s = String::new();
    if v < 0 {
        s.push('-');
    }
    s.push_str(&int.to_string());
    if frac != 0 {
        s.push('.');
        s.push_str(format!("{frac:09}").trim_end_matches('0'));
    }
    s
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian
/// calendar (Howard Hinnant's `civil_from_days`).
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = if z >= 0 { z } else { z - 146_096 } / 146_097;
    let doe = (z - era * 146_097) as u64;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe as i64 + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

pub fn format_date(days: i64) -> String {
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02}")
}

/// Microseconds since the epoch, printed in UTC like PostgreSQL's
/// `timestamptz` output with `TimeZone = UTC`.
pub fn format_timestamp(micros: i64) -> String {
    let secs = micros.div_euclid(1_000_000);
    let frac = micros.rem_euclid(1_000_000);
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let mut s = format!(
        "{} {:02}:{:02}:{:02}",
        format_date(days),
        sod / 3600,
        (sod / 60) % 60,
        sod % 60
    );
    if frac != 0 {
        s.push('.');
        s.push_str(format!("{frac:06}").trim_end_matches('0'));
    }
    s.push_str("+00");
    s
}

/// Checks of the formatting itself, run as the trial `harness::format`.
pub fn self_check() {
    {
        assert_eq!(format_date(0), "1970-01-01");
        assert_eq!(format_date(19_782), "2024-02-29");
        assert_eq!(format_date(-1), "1969-12-31");
        assert_eq!(format_timestamp(0), "1970-01-01 00:00:00+00");
        assert_eq!(
            format_timestamp(1_704_164_645_500_000),
            "2024-01-02 03:04:05.5+00"
        );
        assert_eq!(format_timestamp(-1), "1969-12-31 23:59:59.999999+00");
        assert_eq!(format_numeric(12_500_000_000), "12.5");
        assert_eq!(format_numeric(-1), "-0.000000001");
        assert_eq!(format_numeric(3_000_000_000), "3");
    }
}
