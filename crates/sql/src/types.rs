//! Spindle types ↔ Arrow types, and value conversions.
//!
//! | Spindle   | Arrow                           |
//! |-----------|---------------------------------|
//! | INT64     | Int64                           |
//! | FLOAT64   | Float64                         |
//! | BOOL      | Boolean                         |
//! | STRING(n) | Utf8                            |
//! | BYTES(n)  | Binary                          |
//! | DATE      | Date32                          |
//! | TIMESTAMP | Timestamp(Microsecond, "UTC")   |
//! | NUMERIC   | Decimal128(38, 9)               |
//! | JSON      | Utf8 (normalized JSON text)     |
//!
//! [`coerce`] is the assignment conversion used when a value is written to
//! a column (INSERT/UPDATE): it follows PostgreSQL's assignment casts and
//! enforces STRING(n)/BYTES(n) lengths.

use std::sync::Arc;

use chrono::{DateTime, NaiveDate, NaiveDateTime, Utc};
use datafusion::arrow::array::*;
use datafusion::arrow::datatypes::{DataType as ArrowType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use spindle_catalog::Table;
use spindle_keys::row::RawValue;
use spindle_keys::value::{format_numeric, parse_numeric, NUMERIC_MAX_SCALED, NUMERIC_SCALE};
use spindle_keys::{DataType, Value};

use crate::error::{Error, Result};

pub const UTC: &str = "UTC";

pub fn arrow_type(t: &DataType) -> ArrowType {
    match t {
        DataType::Int64 => ArrowType::Int64,
        DataType::Float64 => ArrowType::Float64,
        DataType::Bool => ArrowType::Boolean,
        DataType::String(_) | DataType::Json => ArrowType::Utf8,
        DataType::Bytes(_) => ArrowType::Binary,
        DataType::Date => ArrowType::Date32,
        DataType::Timestamp => ArrowType::Timestamp(TimeUnit::Microsecond, Some(UTC.into())),
        DataType::Numeric => ArrowType::Decimal128(38, NUMERIC_SCALE as i8),
    }
}

/// The field metadata key that marks a `Utf8` column as Spindle's JSON:
/// Arrow's extension type name (`ARROW:extension:name`), with the value
/// [`JSON_EXTENSION_NAME`], Arrow's canonical JSON extension type. The wire
/// server describes such columns as `jsonb`.
///
/// DataFusion keeps field metadata through column references, aliases,
/// projections, joins and subqueries, but drops the extension type keys
/// when an expression casts the column (`CAST(j AS text)`, `j::text`) and
/// gives function results fresh metadata, so only a column that *is* a
/// JSON column carries the mark.
/// (Arrow's `extension::EXTENSION_TYPE_NAME_KEY`, which `arrow` does not
/// re-export.)
pub const TYPE_METADATA_KEY: &str = "ARROW:extension:name";

/// The value of [`TYPE_METADATA_KEY`] on JSON columns.
pub const JSON_EXTENSION_NAME: &str = "arrow.json";

/// Whether a result field is a JSON column (see [`TYPE_METADATA_KEY`]).
pub fn is_json_field(field: &Field) -> bool {
    field
        .metadata()
        .get(TYPE_METADATA_KEY)
        .is_some_and(|t| t == JSON_EXTENSION_NAME)
}

/// The Arrow schema of a table (hidden columns only when asked for). JSON
/// columns carry the JSON extension type mark ([`TYPE_METADATA_KEY`]).
pub fn table_schema(table: &Table, include_hidden: bool) -> SchemaRef {
    let fields: Vec<Field> = table
        .columns
        .iter()
        .filter(|c| include_hidden || !c.hidden)
        .map(|c| {
            let f = Field::new(&c.name, arrow_type(&c.data_type), c.nullable);
            if matches!(c.data_type, DataType::Json) {
                f.with_metadata(std::collections::HashMap::from([(
                    TYPE_METADATA_KEY.to_string(),
                    JSON_EXTENSION_NAME.to_string(),
                )]))
            } else {
                f
            }
        })
        .collect();
    Arc::new(Schema::new(fields))
}

/// Builds an Arrow array of type `t` from values already of that type.
pub fn build_array(t: &DataType, values: &[&Value]) -> Result<ArrayRef> {
    let mut b = ColumnBuilder::new(t, values.len())?;
    for v in values {
        b.append_value(v)?;
    }
    Ok(b.finish())
}

/// An Arrow array of one Spindle type under construction. Scans append
/// stored values to it straight from the row's bytes ([`RawValue`]: no
/// `String` per text value); [`ColumnBuilder::finish`] hands out the array
/// and leaves the builder empty for the next batch.
pub enum ColumnBuilder {
    Int64(Int64Builder),
    Float64(Float64Builder),
    Bool(BooleanBuilder),
    /// STRING and JSON (normalized JSON text).
    Utf8(StringBuilder),
    Bytes(BinaryBuilder),
    Date(Date32Builder),
    Timestamp(TimestampMicrosecondBuilder),
    Numeric(Decimal128Builder),
}

impl ColumnBuilder {
    pub fn new(t: &DataType, capacity: usize) -> Result<Self> {
        Ok(match t {
            DataType::Int64 => ColumnBuilder::Int64(Int64Builder::with_capacity(capacity)),
            DataType::Float64 => ColumnBuilder::Float64(Float64Builder::with_capacity(capacity)),
            DataType::Bool => ColumnBuilder::Bool(BooleanBuilder::with_capacity(capacity)),
            DataType::String(_) | DataType::Json => {
                ColumnBuilder::Utf8(StringBuilder::with_capacity(capacity, capacity * 8))
            }
            DataType::Bytes(_) => {
                ColumnBuilder::Bytes(BinaryBuilder::with_capacity(capacity, capacity * 8))
            }
            DataType::Date => ColumnBuilder::Date(Date32Builder::with_capacity(capacity)),
            DataType::Timestamp => ColumnBuilder::Timestamp(
                TimestampMicrosecondBuilder::with_capacity(capacity).with_timezone(UTC),
            ),
            DataType::Numeric => ColumnBuilder::Numeric(
                Decimal128Builder::with_capacity(capacity)
                    .with_precision_and_scale(38, NUMERIC_SCALE as i8)
                    .map_err(|e| Error::Internal(e.to_string()))?,
            ),
        })
    }

    /// The column's type, for error messages.
    fn type_name(&self) -> &'static str {
        match self {
            ColumnBuilder::Int64(_) => "INT64",
            ColumnBuilder::Float64(_) => "FLOAT64",
            ColumnBuilder::Bool(_) => "BOOL",
            ColumnBuilder::Utf8(_) => "STRING",
            ColumnBuilder::Bytes(_) => "BYTES",
            ColumnBuilder::Date(_) => "DATE",
            ColumnBuilder::Timestamp(_) => "TIMESTAMP",
            ColumnBuilder::Numeric(_) => "NUMERIC",
        }
    }

    pub fn len(&self) -> usize {
        match self {
            ColumnBuilder::Int64(b) => b.len(),
            ColumnBuilder::Float64(b) => b.len(),
            ColumnBuilder::Bool(b) => b.len(),
            ColumnBuilder::Utf8(b) => b.len(),
            ColumnBuilder::Bytes(b) => b.len(),
            ColumnBuilder::Date(b) => b.len(),
            ColumnBuilder::Timestamp(b) => b.len(),
            ColumnBuilder::Numeric(b) => b.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn append_null(&mut self) {
        match self {
            ColumnBuilder::Int64(b) => b.append_null(),
            ColumnBuilder::Float64(b) => b.append_null(),
            ColumnBuilder::Bool(b) => b.append_null(),
            ColumnBuilder::Utf8(b) => b.append_null(),
            ColumnBuilder::Bytes(b) => b.append_null(),
            ColumnBuilder::Date(b) => b.append_null(),
            ColumnBuilder::Timestamp(b) => b.append_null(),
            ColumnBuilder::Numeric(b) => b.append_null(),
        }
    }

    /// Appends a value borrowed from a stored row; its type must be the
    /// column's (else an internal error: the row does not match the schema).
    /// Inlined: a scan calls it for every value it decodes.
    #[inline]
    pub fn append_raw(&mut self, v: RawValue<'_>) -> Result<()> {
        match (self, v) {
            (ColumnBuilder::Int64(b), RawValue::Int64(x)) => b.append_value(x),
            (ColumnBuilder::Float64(b), RawValue::Float64(x)) => b.append_value(x),
            (ColumnBuilder::Bool(b), RawValue::Bool(x)) => b.append_value(x),
            (ColumnBuilder::Utf8(b), RawValue::String(x) | RawValue::Json(x)) => b.append_value(x),
            (ColumnBuilder::Bytes(b), RawValue::Bytes(x)) => b.append_value(x),
            (ColumnBuilder::Date(b), RawValue::Date(x)) => b.append_value(x),
            (ColumnBuilder::Timestamp(b), RawValue::Timestamp(x)) => b.append_value(x),
            (ColumnBuilder::Numeric(b), RawValue::Numeric(x)) => b.append_value(x),
            (b, v) => return Err(type_mismatch(b, v)),
        }
        Ok(())
    }

    /// Appends an owned value of the column's type (or NULL).
    pub fn append_value(&mut self, v: &Value) -> Result<()> {
        let raw = match v {
            Value::Null => {
                self.append_null();
                return Ok(());
            }
            Value::Bool(x) => RawValue::Bool(*x),
            Value::Int64(x) => RawValue::Int64(*x),
            Value::Float64(x) => RawValue::Float64(*x),
            Value::Date(x) => RawValue::Date(*x),
            Value::Timestamp(x) => RawValue::Timestamp(*x),
            Value::Numeric(x) => RawValue::Numeric(*x),
            Value::String(s) => RawValue::String(s),
            Value::Json(s) => RawValue::Json(s),
            Value::Bytes(x) => RawValue::Bytes(x),
        };
        self.append_raw(raw)
    }

    /// The array of everything appended since the last `finish`.
    pub fn finish(&mut self) -> ArrayRef {
        match self {
            ColumnBuilder::Int64(b) => Arc::new(b.finish()),
            ColumnBuilder::Float64(b) => Arc::new(b.finish()),
            ColumnBuilder::Bool(b) => Arc::new(b.finish()),
            ColumnBuilder::Utf8(b) => Arc::new(b.finish()),
            ColumnBuilder::Bytes(b) => Arc::new(b.finish()),
            ColumnBuilder::Date(b) => Arc::new(b.finish()),
            ColumnBuilder::Timestamp(b) => Arc::new(b.finish()),
            ColumnBuilder::Numeric(b) => Arc::new(b.finish()),
        }
    }
}

/// The error of a stored value whose type is not its column's (kept out
/// of line: `append_raw` runs once per decoded value).
#[cold]
#[inline(never)]
fn type_mismatch(b: &ColumnBuilder, v: RawValue<'_>) -> Error {
    Error::Internal(format!(
        "stored value {} does not match column type {}",
        v.type_name(),
        b.type_name()
    ))
}

/// Converts one element of any Arrow array into a [`Value`]. Types with no
/// Spindle counterpart are rendered as text.
pub fn array_value(array: &dyn Array, row: usize) -> Result<Value> {
    // `logical_nulls` also covers arrays without a validity buffer whose
    // values are all NULL (NullArray, e.g. a bare `NULL` literal).
    if array.data_type() == &ArrowType::Null
        || array.logical_nulls().is_some_and(|n| n.is_null(row))
    {
        return Ok(Value::Null);
    }
    macro_rules! prim {
        ($t:ty, $ctor:expr) => {{
            let a = array
                .as_any()
                .downcast_ref::<$t>()
                .ok_or_else(|| Error::Internal("array type mismatch".into()))?;
            $ctor(a.value(row))
        }};
    }
    let v = match array.data_type() {
        ArrowType::Int8 => prim!(Int8Array, |x: i8| Value::Int64(x as i64)),
        ArrowType::Int16 => prim!(Int16Array, |x: i16| Value::Int64(x as i64)),
        ArrowType::Int32 => prim!(Int32Array, |x: i32| Value::Int64(x as i64)),
        ArrowType::Int64 => prim!(Int64Array, Value::Int64),
        ArrowType::UInt8 => prim!(UInt8Array, |x: u8| Value::Int64(x as i64)),
        ArrowType::UInt16 => prim!(UInt16Array, |x: u16| Value::Int64(x as i64)),
        ArrowType::UInt32 => prim!(UInt32Array, |x: u32| Value::Int64(x as i64)),
        ArrowType::UInt64 => prim!(UInt64Array, |x: u64| match i64::try_from(x) {
            Ok(i) => Value::Int64(i),
            Err(_) => Value::Numeric(x as i128 * 10i128.pow(NUMERIC_SCALE)),
        }),
        ArrowType::Float16 => {
            let a = array
                .as_any()
                .downcast_ref::<Float16Array>()
                .ok_or_else(|| Error::Internal("array type mismatch".into()))?;
            Value::Float64(a.value(row).to_f64())
        }
        ArrowType::Float32 => prim!(Float32Array, |x: f32| Value::Float64(x as f64)),
        ArrowType::Float64 => prim!(Float64Array, Value::Float64),
        ArrowType::Boolean => prim!(BooleanArray, Value::Bool),
        ArrowType::Utf8 => prim!(StringArray, |s: &str| Value::String(s.to_string())),
        ArrowType::LargeUtf8 => prim!(LargeStringArray, |s: &str| Value::String(s.to_string())),
        ArrowType::Utf8View => prim!(StringViewArray, |s: &str| Value::String(s.to_string())),
        ArrowType::Binary => prim!(BinaryArray, |s: &[u8]| Value::Bytes(s.to_vec())),
        ArrowType::LargeBinary => prim!(LargeBinaryArray, |s: &[u8]| Value::Bytes(s.to_vec())),
        ArrowType::BinaryView => prim!(BinaryViewArray, |s: &[u8]| Value::Bytes(s.to_vec())),
        ArrowType::FixedSizeBinary(_) => {
            prim!(FixedSizeBinaryArray, |s: &[u8]| Value::Bytes(s.to_vec()))
        }
        ArrowType::Date32 => prim!(Date32Array, Value::Date),
        ArrowType::Date64 => prim!(Date64Array, |ms: i64| Value::Date(
            ms.div_euclid(86_400_000) as i32
        )),
        ArrowType::Timestamp(unit, _) => {
            let micros = match unit {
                TimeUnit::Second => {
                    prim!(TimestampSecondArray, |x: i64| x.saturating_mul(1_000_000))
                }
                TimeUnit::Millisecond => {
                    prim!(TimestampMillisecondArray, |x: i64| x.saturating_mul(1_000))
                }
                TimeUnit::Microsecond => prim!(TimestampMicrosecondArray, |x: i64| x),
                TimeUnit::Nanosecond => {
                    prim!(TimestampNanosecondArray, |x: i64| x.div_euclid(1_000))
                }
            };
            Value::Timestamp(micros)
        }
        ArrowType::Decimal128(_, scale) => {
            let raw = prim!(Decimal128Array, |x: i128| x);
            rescale_decimal(raw, *scale as i32)?
        }
        _ => {
            let fmt = ArrayFormatter::try_new(array, &FormatOptions::default())
                .map_err(|e| Error::Internal(e.to_string()))?;
            Value::String(fmt.value(row).to_string())
        }
    };
    Ok(v)
}

fn rescale_decimal(raw: i128, scale: i32) -> Result<Value> {
    let target = NUMERIC_SCALE as i32;
    let v = if scale == target {
        Some(raw)
    } else if scale < target {
        raw.checked_mul(10i128.pow((target - scale) as u32))
    } else {
        // Round half away from zero to 9 fractional digits.
        let div = 10i128.pow((scale - target) as u32);
        let q = raw / div;
        let r = raw % div;
        Some(if r.abs() * 2 >= div {
            q + raw.signum()
        } else {
            q
        })
    };
    match v {
        Some(v) if v.abs() <= NUMERIC_MAX_SCALED => Ok(Value::Numeric(v)),
        _ => Err(Error::OutOfRange("numeric value out of range".into())),
    }
}

/// Days since 1970-01-01 of a civil date.
pub fn date_to_days(d: NaiveDate) -> i32 {
    (d - NaiveDate::from_ymd_opt(1970, 1, 1).unwrap_or_default()).num_days() as i32
}

pub fn days_to_date(days: i32) -> Option<NaiveDate> {
    NaiveDate::from_ymd_opt(1970, 1, 1)?.checked_add_signed(chrono::Duration::days(days as i64))
}

pub fn parse_date(s: &str) -> Option<i32> {
    let s = s.trim();
    NaiveDate::parse_from_str(s, "%Y-%m-%d")
        .ok()
        .map(date_to_days)
}

/// Parses a timestamp: RFC 3339, or `YYYY-MM-DD[ T]HH:MM:SS[.f][±HH[:MM]|Z]`,
/// or a bare date; without an offset it is taken as UTC.
pub fn parse_timestamp(s: &str) -> Option<i64> {
    let s = s.trim();
    if let Ok(dt) = DateTime::parse_from_rfc3339(s) {
        return Some(dt.timestamp_micros());
    }
    for fmt in [
        "%Y-%m-%d %H:%M:%S%.f%#z",
        "%Y-%m-%dT%H:%M:%S%.f%#z",
        "%Y-%m-%d %H:%M:%S%.f%z",
        "%Y-%m-%d %H:%M:%S%.f %z",
    ] {
        if let Ok(dt) = DateTime::parse_from_str(s, fmt) {
            return Some(dt.timestamp_micros());
        }
    }
    let bare = s
        .strip_suffix('Z')
        .or_else(|| s.strip_suffix(" UTC"))
        .unwrap_or(s);
    for fmt in [
        "%Y-%m-%d %H:%M:%S%.f",
        "%Y-%m-%dT%H:%M:%S%.f",
        "%Y-%m-%d %H:%M",
    ] {
        if let Ok(dt) = NaiveDateTime::parse_from_str(bare, fmt) {
            return Some(dt.and_utc().timestamp_micros());
        }
    }
    NaiveDate::parse_from_str(bare, "%Y-%m-%d")
        .ok()
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .map(|dt| dt.and_utc().timestamp_micros())
}

pub fn format_timestamp(micros: i64) -> String {
    match DateTime::<Utc>::from_timestamp_micros(micros) {
        Some(dt) => {
            if micros % 1_000_000 == 0 {
                dt.format("%Y-%m-%d %H:%M:%S+00").to_string()
            } else {
                let s = dt.format("%Y-%m-%d %H:%M:%S%.6f").to_string();
                format!("{}+00", s.trim_end_matches('0'))
            }
        }
        None => micros.to_string(),
    }
}

pub fn format_date(days: i32) -> String {
    days_to_date(days)
        .map(|d| d.format("%Y-%m-%d").to_string())
        .unwrap_or_else(|| days.to_string())
}

/// Text form of a value, as PostgreSQL would print it.
pub fn value_to_text(v: &Value) -> Option<String> {
    Some(match v {
        Value::Null => return None,
        Value::Int64(i) => i.to_string(),
        Value::Float64(f) => format_float(*f),
        Value::Bool(b) => if *b { "t" } else { "f" }.to_string(),
        Value::String(s) | Value::Json(s) => s.clone(),
        Value::Bytes(b) => {
            let mut s = String::from("\\x");
            for byte in b {
                s.push_str(&format!("{byte:02x}"));
            }
            s
        }
        Value::Date(d) => format_date(*d),
        Value::Timestamp(t) => format_timestamp(*t),
        Value::Numeric(n) => format_numeric(*n),
    })
}

pub fn format_float(f: f64) -> String {
    if f.is_nan() {
        "NaN".into()
    } else if f.is_infinite() {
        if f > 0.0 { "Infinity" } else { "-Infinity" }.into()
    } else {
        format!("{f}")
    }
}

fn round_half_even(f: f64) -> f64 {
    let r = f.round();
    if (f - f.trunc()).abs() == 0.5 && r % 2.0 != 0.0 {
        r - f.signum()
    } else {
        r
    }
}

/// Converts `v` for storage in a column of type `t` (assignment cast).
/// [`coerce`] of a value that may be borrowed: one that coercing would
/// return unchanged stays borrowed (no copy of a text parameter per row
/// of a bulk INSERT); any other is coerced as by [`coerce`].
pub fn coerce_cow<'a>(
    v: std::borrow::Cow<'a, Value>,
    t: &DataType,
    column: &str,
) -> Result<std::borrow::Cow<'a, Value>> {
    let unchanged = match (v.as_ref(), t) {
        (Value::Null, _)
        | (Value::Int64(_), DataType::Int64)
        | (Value::Float64(_), DataType::Float64)
        | (Value::Bool(_), DataType::Bool)
        | (Value::Date(_), DataType::Date)
        | (Value::Timestamp(_), DataType::Timestamp)
        | (Value::Numeric(_), DataType::Numeric) => true,
        // Within the limit in bytes, so in characters too (as `coerce`).
        (Value::String(s), DataType::String(limit)) => limit.is_none_or(|n| s.len() <= n as usize),
        _ => false,
    };
    if unchanged {
        Ok(v)
    } else {
        coerce(v.into_owned(), t, column).map(std::borrow::Cow::Owned)
    }
}

pub fn coerce(v: Value, t: &DataType, column: &str) -> Result<Value> {
    let mismatch = |v: &Value| {
        Error::DatatypeMismatch(format!(
            "column \"{column}\" is of type {t} but expression is of type {}",
            v.type_name()
        ))
    };
    let invalid =
        |s: &str| Error::InvalidValue(format!("invalid input syntax for type {t}: \"{s}\""));
    let out = match (v, t) {
        (Value::Null, _) => Value::Null,
        (Value::Int64(i), DataType::Int64) => Value::Int64(i),
        (Value::Float64(f), DataType::Int64) => {
            let r = round_half_even(f);
            if !r.is_finite() || r < i64::MIN as f64 || r >= i64::MAX as f64 {
                return Err(Error::OutOfRange(format!(
                    "value {f} out of range for column \"{column}\" (INT64)"
                )));
            }
            Value::Int64(r as i64)
        }
        (Value::Numeric(n), DataType::Int64) => {
            let scale = 10i128.pow(NUMERIC_SCALE);
            let q = n / scale;
            let r = n % scale;
            let q = if r.abs() * 2 >= scale {
                q + n.signum()
            } else {
                q
            };
            Value::Int64(i64::try_from(q).map_err(|_| {
                Error::OutOfRange(format!(
                    "value out of range for column \"{column}\" (INT64)"
                ))
            })?)
        }
        (Value::String(s), DataType::Int64) => {
            Value::Int64(s.trim().parse().map_err(|_| invalid(&s))?)
        }
        (Value::Float64(f), DataType::Float64) => Value::Float64(f),
        (Value::Int64(i), DataType::Float64) => Value::Float64(i as f64),
        (Value::Numeric(n), DataType::Float64) => {
            Value::Float64(n as f64 / 10f64.powi(NUMERIC_SCALE as i32))
        }
        (Value::String(s), DataType::Float64) => {
            Value::Float64(parse_float(&s).ok_or_else(|| invalid(&s))?)
        }
        (Value::Bool(b), DataType::Bool) => Value::Bool(b),
        (Value::String(s), DataType::Bool) => {
            Value::Bool(parse_bool(&s).ok_or_else(|| invalid(&s))?)
        }
        (Value::String(s), DataType::String(limit)) => {
            // A text no longer in bytes than the limit is no longer in
            // characters either: only a longer one is counted.
            if let Some(n) = limit.filter(|n| s.len() > *n as usize) {
                let len = s.chars().count();
                if len > n as usize {
                    return Err(Error::StringTooLong(format!(
                        "value too long for column \"{column}\" of type {t}: {len} characters"
                    )));
                }
            }
            Value::String(s)
        }
        (Value::Json(s), DataType::String(_)) => return coerce(Value::String(s), t, column),
        (
            v @ (Value::Int64(_)
            | Value::Float64(_)
            | Value::Bool(_)
            | Value::Numeric(_)
            | Value::Date(_)
            | Value::Timestamp(_)),
            DataType::String(_),
        ) => {
            let text = value_to_text(&v).unwrap_or_default();
            return coerce(Value::String(text), t, column);
        }
        (Value::Bytes(b), DataType::Bytes(limit)) => {
            if let Some(n) = limit {
                if b.len() > *n as usize {
                    return Err(Error::StringTooLong(format!(
                        "value too long for column \"{column}\" of type {t}: {} bytes",
                        b.len()
                    )));
                }
            }
            Value::Bytes(b)
        }
        (Value::String(s), DataType::Bytes(_)) => {
            return coerce(Value::Bytes(parse_bytes(&s)), t, column)
        }
        (Value::Date(d), DataType::Date) => Value::Date(d),
        (Value::Timestamp(ts), DataType::Date) => Value::Date(ts.div_euclid(86_400_000_000) as i32),
        (Value::String(s), DataType::Date) => {
            Value::Date(parse_date(&s).ok_or_else(|| invalid(&s))?)
        }
        (Value::Timestamp(ts), DataType::Timestamp) => Value::Timestamp(ts),
        (Value::Date(d), DataType::Timestamp) => Value::Timestamp(d as i64 * 86_400_000_000),
        (Value::String(s), DataType::Timestamp) => {
            Value::Timestamp(parse_timestamp(&s).ok_or_else(|| invalid(&s))?)
        }
        (Value::Numeric(n), DataType::Numeric) => Value::Numeric(n),
        (Value::Int64(i), DataType::Numeric) => Value::Numeric(
            (i as i128)
                .checked_mul(10i128.pow(NUMERIC_SCALE))
                .ok_or_else(|| Error::OutOfRange("numeric value out of range".into()))?,
        ),
        (Value::Float64(f), DataType::Numeric) => {
            if !f.is_finite() {
                return Err(Error::OutOfRange(format!(
                    "cannot store {f} in NUMERIC column \"{column}\""
                )));
            }
            let s = format!("{:.9}", f);
            Value::Numeric(
                parse_numeric(&s)
                    .ok_or_else(|| Error::OutOfRange("numeric value out of range".into()))?,
            )
        }
        (Value::String(s), DataType::Numeric) => {
            Value::Numeric(parse_numeric(&s).ok_or_else(|| invalid(&s))?)
        }
        (Value::String(s) | Value::Json(s), DataType::Json) => {
            let parsed: serde_json::Value = serde_json::from_str(&s).map_err(|e| {
                Error::InvalidValue(format!("invalid input syntax for type JSON: {e}"))
            })?;
            Value::Json(parsed.to_string())
        }
        (v, _) => return Err(mismatch(&v)),
    };
    if out.size() > spindle_catalog::MAX_VALUE_BYTES {
        return Err(Error::LimitExceeded(format!(
            "value for column \"{column}\" is {} bytes; the limit is {} bytes",
            out.size(),
            spindle_catalog::MAX_VALUE_BYTES
        )));
    }
    Ok(out)
}

fn parse_float(s: &str) -> Option<f64> {
    match s.trim().to_ascii_lowercase().as_str() {
        "nan" => Some(f64::NAN),
        "infinity" | "inf" | "+infinity" => Some(f64::INFINITY),
        "-infinity" | "-inf" => Some(f64::NEG_INFINITY),
        t => t.parse().ok(),
    }
}

fn parse_bool(s: &str) -> Option<bool> {
    match s.trim().to_ascii_lowercase().as_str() {
        "t" | "true" | "yes" | "y" | "on" | "1" => Some(true),
        "f" | "false" | "no" | "n" | "off" | "0" => Some(false),
        _ => None,
    }
}

/// PostgreSQL's bytea input: `\x` hex, or the raw string's bytes.
fn parse_bytes(s: &str) -> Vec<u8> {
    if let Some(hex) = s.strip_prefix("\\x") {
        if hex.len() % 2 == 0 {
            let parsed: Option<Vec<u8>> = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).ok())
                .collect();
            if let Some(b) = parsed {
                return b;
            }
        }
    }
    s.as_bytes().to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coerce_enforces_lengths_and_parses_text() {
        assert!(matches!(
            coerce(
                Value::String("abcd".into()),
                &DataType::String(Some(3)),
                "c"
            ),
            Err(Error::StringTooLong(_))
        ));
        assert_eq!(
            coerce(Value::String("abc".into()), &DataType::String(Some(3)), "c").unwrap(),
            Value::String("abc".into())
        );
        assert_eq!(
            coerce(Value::String("2024-02-29".into()), &DataType::Date, "d").unwrap(),
            Value::Date(19782)
        );
        assert_eq!(
            coerce(Value::Int64(2), &DataType::Numeric, "n").unwrap(),
            Value::Numeric(2_000_000_000)
        );
        assert_eq!(
            coerce(Value::Float64(2.5), &DataType::Int64, "i").unwrap(),
            Value::Int64(2)
        );
        assert!(coerce(Value::String("x".into()), &DataType::Int64, "i").is_err());
        assert!(coerce(Value::String("{bad".into()), &DataType::Json, "j").is_err());
        assert_eq!(
            coerce(
                Value::String("2024-01-01 10:00:00+02".into()),
                &DataType::Timestamp,
                "t"
            )
            .unwrap(),
            Value::Timestamp(parse_timestamp("2024-01-01T08:00:00Z").unwrap())
        );
    }

    #[test]
    fn arrays_round_trip_values() {
        let types = [
            (DataType::Int64, Value::Int64(-5)),
            (DataType::Float64, Value::Float64(1.5)),
            (DataType::Bool, Value::Bool(true)),
            (DataType::String(None), Value::String("x".into())),
            (DataType::Bytes(None), Value::Bytes(vec![0, 1])),
            (DataType::Date, Value::Date(3)),
            (DataType::Timestamp, Value::Timestamp(1_000_001)),
            (DataType::Numeric, Value::Numeric(12_500_000_000)),
        ];
        for (t, v) in types {
            let arr = build_array(&t, &[&v, &Value::Null]).unwrap();
            assert_eq!(array_value(arr.as_ref(), 0).unwrap(), v);
            assert_eq!(array_value(arr.as_ref(), 1).unwrap(), Value::Null);
        }
    }
}
