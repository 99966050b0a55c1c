//! Typed SQL values and column types.
//!
//! [`Value`] is the one value representation shared by every layer below the
//! SQL front end: the key codec orders it, the row codec stores it, the
//! catalog validates it. Arrow arrays exist only in `spindle-sql`.
//!
//! Representations (chosen so that encoding is exact and cheap):
//!
//! | type      | Rust payload                         |
//! |-----------|--------------------------------------|
//! | INT64     | `i64`                                |
//! | FLOAT64   | `f64` (all bit patterns kept)        |
//! | BOOL      | `bool`                               |
//! | STRING    | `String` (UTF-8)                     |
//! | BYTES     | `Vec<u8>`                            |
//! | DATE      | `i32` days since 1970-01-01          |
//! | TIMESTAMP | `i64` microseconds since the epoch, UTC |
//! | NUMERIC   | `i128` scaled by 10^9 (Spanner's NUMERIC: 29 integer digits, 9 fractional) |
//! | JSON      | `String` holding a JSON document     |

use std::cmp::Ordering;
use std::fmt;

use serde::{Deserialize, Serialize};

/// Number of fractional digits of NUMERIC values.
pub const NUMERIC_SCALE: u32 = 9;
/// Precision of NUMERIC values (total decimal digits).
pub const NUMERIC_PRECISION: u32 = 38;
/// Largest magnitude a NUMERIC may hold, scaled: 10^38 - 1.
pub const NUMERIC_MAX_SCALED: i128 = 99_999_999_999_999_999_999_999_999_999_999_999_999;

/// The placeholder a write holds for its transaction's commit timestamp
/// (`PENDING_COMMIT_TIMESTAMP()`) until the commit chooses it. It is the
/// largest TIMESTAMP (year 294247): commit-timestamp columns refuse
/// timestamps in the future, so no stored row ever holds it, and other
/// columns refuse it (the SQL layer checks both).
pub const PENDING_COMMIT_TIMESTAMP: i64 = i64::MAX;

/// The column types Spindle stores.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DataType {
    Int64,
    Float64,
    Bool,
    /// STRING(n): at most `n` characters; `None` is STRING(MAX).
    String(Option<u32>),
    /// BYTES(n): at most `n` bytes; `None` is BYTES(MAX).
    Bytes(Option<u32>),
    Date,
    Timestamp,
    Numeric,
    Json,
}

impl DataType {
    /// Whether values of this type may be part of a primary key.
    pub fn is_key_type(&self) -> bool {
        !matches!(self, DataType::Json)
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DataType::Int64 => write!(f, "INT64"),
            DataType::Float64 => write!(f, "FLOAT64"),
            DataType::Bool => write!(f, "BOOL"),
            DataType::String(None) => write!(f, "STRING(MAX)"),
            DataType::String(Some(n)) => write!(f, "STRING({n})"),
            DataType::Bytes(None) => write!(f, "BYTES(MAX)"),
            DataType::Bytes(Some(n)) => write!(f, "BYTES({n})"),
            DataType::Date => write!(f, "DATE"),
            DataType::Timestamp => write!(f, "TIMESTAMP"),
            DataType::Numeric => write!(f, "NUMERIC"),
            DataType::Json => write!(f, "JSON"),
        }
    }
}

/// One SQL value.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Value {
    Null,
    Int64(i64),
    Float64(f64),
    Bool(bool),
    String(String),
    Bytes(Vec<u8>),
    Date(i32),
    Timestamp(i64),
    Numeric(i128),
    Json(String),
}

impl Value {
    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }

    /// The type name used in error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Null => "NULL",
            Value::Int64(_) => "INT64",
            Value::Float64(_) => "FLOAT64",
            Value::Bool(_) => "BOOL",
            Value::String(_) => "STRING",
            Value::Bytes(_) => "BYTES",
            Value::Date(_) => "DATE",
            Value::Timestamp(_) => "TIMESTAMP",
            Value::Numeric(_) => "NUMERIC",
            Value::Json(_) => "JSON",
        }
    }

    /// Approximate in-memory/on-disk size, used for the value size limit.
    pub fn size(&self) -> usize {
        match self {
            Value::String(s) | Value::Json(s) => s.len(),
            Value::Bytes(b) => b.len(),
            Value::Numeric(_) => 16,
            Value::Null | Value::Bool(_) => 1,
            Value::Date(_) => 4,
            _ => 8,
        }
    }

    /// Whether the value belongs to `ty` (NULL belongs to every type).
    pub fn matches_type(&self, ty: &DataType) -> bool {
        matches!(
            (self, ty),
            (Value::Null, _)
                | (Value::Int64(_), DataType::Int64)
                | (Value::Float64(_), DataType::Float64)
                | (Value::Bool(_), DataType::Bool)
                | (Value::String(_), DataType::String(_))
                | (Value::Bytes(_), DataType::Bytes(_))
                | (Value::Date(_), DataType::Date)
                | (Value::Timestamp(_), DataType::Timestamp)
                | (Value::Numeric(_), DataType::Numeric)
                | (Value::Json(_), DataType::Json)
        )
    }

    /// Total order used for keys: NULL first, then by value; FLOAT64 uses
    /// IEEE 754 totalOrder (-NaN < -inf < … < -0.0 < 0.0 < … < inf < NaN).
    /// Values of different types compare by type tag (never happens within
    /// one key column).
    pub fn key_cmp(&self, other: &Value) -> Ordering {
        use Value::*;
        match (self, other) {
            (Null, Null) => Ordering::Equal,
            (Null, _) => Ordering::Less,
            (_, Null) => Ordering::Greater,
            (Int64(a), Int64(b)) => a.cmp(b),
            (Float64(a), Float64(b)) => a.total_cmp(b),
            (Bool(a), Bool(b)) => a.cmp(b),
            (String(a), String(b)) | (Json(a), Json(b)) => a.as_bytes().cmp(b.as_bytes()),
            (Bytes(a), Bytes(b)) => a.cmp(b),
            (Date(a), Date(b)) => a.cmp(b),
            (Timestamp(a), Timestamp(b)) => a.cmp(b),
            (Numeric(a), Numeric(b)) => a.cmp(b),
            (a, b) => a.tag().cmp(&b.tag()),
        }
    }

    pub(crate) fn tag(&self) -> u8 {
        match self {
            Value::Null => crate::key::TAG_NULL,
            Value::Bool(_) => crate::key::TAG_BOOL,
            Value::Int64(_) => crate::key::TAG_INT64,
            Value::Float64(_) => crate::key::TAG_FLOAT64,
            Value::String(_) => crate::key::TAG_STRING,
            Value::Bytes(_) => crate::key::TAG_BYTES,
            Value::Date(_) => crate::key::TAG_DATE,
            Value::Timestamp(_) => crate::key::TAG_TIMESTAMP,
            Value::Numeric(_) => crate::key::TAG_NUMERIC,
            Value::Json(_) => crate::key::TAG_JSON,
        }
    }
}

/// Equality is the key order's equality (so FLOAT64 compares bit-exactly up
/// to totalOrder, and NULL equals NULL): this is what key round-trips need.
impl PartialEq for Value {
    fn eq(&self, other: &Self) -> bool {
        self.key_cmp(other) == Ordering::Equal
    }
}
impl Eq for Value {}

impl PartialOrd for Value {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Value {
    fn cmp(&self, other: &Self) -> Ordering {
        self.key_cmp(other)
    }
}

/// Formats a NUMERIC's scaled integer as a decimal string without trailing
/// fractional zeros ("12.5", "-0.000000001", "3").
pub fn format_numeric(v: i128) -> String {
    let scale = 10i128.pow(NUMERIC_SCALE);
    let neg = v < 0;
    let abs = v.unsigned_abs();
    let int = abs / scale as u128;
    let frac = abs % scale as u128;
    let mut s = String::new();
    if neg {
        s.push('-');
    }
    s.push_str(&int.to_string());
    if frac != 0 {
        let f = format!("{:09}", frac);
        s.push('.');
        s.push_str(f.trim_end_matches('0'));
    }
    s
}

/// Parses a decimal string into a NUMERIC scaled integer. Rejects more than
/// nine fractional digits only when they are not zeros; rounds nothing.
pub fn parse_numeric(s: &str) -> Option<i128> {
    let s = s.trim();
    let (neg, digits) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let (int, frac) = match digits.split_once('.') {
        Some((i, f)) => (i, f),
        None => (digits, ""),
    };
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    if !int.chars().all(|c| c.is_ascii_digit()) || !frac.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let frac_trim = frac.trim_end_matches('0');
    if frac_trim.len() > NUMERIC_SCALE as usize {
        return None;
    }
    let int_val: i128 = if int.is_empty() { 0 } else { int.parse().ok()? };
    let mut frac_val: i128 = if frac_trim.is_empty() {
        0
    } else {
        frac_trim.parse().ok()?
    };
    frac_val *= 10i128.pow(NUMERIC_SCALE - frac_trim.len() as u32);
    let v = int_val
        .checked_mul(10i128.pow(NUMERIC_SCALE))?
        .checked_add(frac_val)?;
    if v > NUMERIC_MAX_SCALED {
        return None;
    }
    Some(if neg { -v } else { v })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numeric_text_round_trip() {
        for s in [
            "0",
            "1",
            "-1",
            "12.5",
            "-0.000000001",
            "123456789.123456789",
        ] {
            let v = parse_numeric(s).unwrap();
            assert_eq!(format_numeric(v), s);
        }
        assert_eq!(parse_numeric("1.0000000001"), None);
        assert_eq!(parse_numeric("abc"), None);
        assert_eq!(parse_numeric("1.50"), Some(1_500_000_000));
    }
}
