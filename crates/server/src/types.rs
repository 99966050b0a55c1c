//! Values on the wire: Arrow result types → PostgreSQL type OIDs, values →
//! text and binary format, and `$n` parameters → [`Value`]s.
//!
//! | Spindle   | Arrow (results)            | PostgreSQL type (OID)  |
//! |-----------|----------------------------|------------------------|
//! | INT64     | Int64                      | int8 (20)              |
//! | FLOAT64   | Float64                    | float8 (701)           |
//! | BOOL      | Boolean                    | bool (16)              |
//! | STRING    | Utf8                       | text (25)              |
//! | JSON      | Utf8 + `arrow.json` ext.   | jsonb (3802)           |
//! | BYTES     | Binary                     | bytea (17)             |
//! | DATE      | Date32                     | date (1082)            |
//! | TIMESTAMP | Timestamp(µs, "UTC")       | timestamptz (1184)     |
//! | NUMERIC   | Decimal128                 | numeric (1700)         |
//!
//! Other Arrow types DataFusion produces map to their nearest PostgreSQL
//! type (Int32 → int4, Float32 → float4, Timestamp without zone →
//! timestamp, …); anything else is sent as `text` in Arrow's display form.
//!
//! Text output follows PostgreSQL's defaults (`DateStyle = ISO`,
//! `TimeZone = UTC`, `extra_float_digits = 1`, `bytea_output = hex`):
//! `t`/`f`, `1.5`, `1e+100`, `2024-05-01 10:00:00+00`, `\x0102`.
//! Binary output is PostgreSQL's `send` format of the described type; a
//! value is converted to the type the column was described with, so
//! Describe and Execute always agree.

use bytes::{BufMut, BytesMut};
use datafusion::arrow::array::{
    Array, BooleanArray, Float32Array, Float64Array, Int16Array, Int32Array, Int64Array,
    LargeStringArray, StringArray, StringViewArray,
};
use datafusion::arrow::datatypes::{DataType as ArrowType, Field};
use pgwire::api::Type;
use spindle_keys::value::{format_numeric, parse_numeric, NUMERIC_SCALE};
use spindle_keys::Value;
use spindle_sql::types::{format_date, format_timestamp, parse_date, parse_timestamp};

/// Days from 1970-01-01 to 2000-01-01, PostgreSQL's epoch.
const PG_EPOCH_DAYS: i32 = 10_957;
/// Microseconds from 1970-01-01 to 2000-01-01.
const PG_EPOCH_MICROS: i64 = 946_684_800_000_000;

/// The PostgreSQL type a result column is described with.
pub fn pg_type(field: &Field) -> Type {
    if spindle_sql::types::is_json_field(field) {
        return Type::JSONB;
    }
    arrow_pg_type(field.data_type())
}

pub fn arrow_pg_type(t: &ArrowType) -> Type {
    match t {
        ArrowType::Int8 | ArrowType::Int16 | ArrowType::UInt8 => Type::INT2,
        ArrowType::Int32 | ArrowType::UInt16 => Type::INT4,
        ArrowType::Int64 | ArrowType::UInt32 => Type::INT8,
        ArrowType::UInt64 | ArrowType::Decimal128(..) | ArrowType::Decimal256(..) => Type::NUMERIC,
        ArrowType::Float16 | ArrowType::Float32 => Type::FLOAT4,
        ArrowType::Float64 => Type::FLOAT8,
        ArrowType::Boolean => Type::BOOL,
        ArrowType::Binary
        | ArrowType::LargeBinary
        | ArrowType::BinaryView
        | ArrowType::FixedSizeBinary(_) => Type::BYTEA,
        ArrowType::Date32 | ArrowType::Date64 => Type::DATE,
        ArrowType::Timestamp(_, Some(_)) => Type::TIMESTAMPTZ,
        ArrowType::Timestamp(_, None) => Type::TIMESTAMP,
        _ => Type::TEXT,
    }
}

/// `pg_type.typlen` of a result column's type, as RowDescription reports
/// it: the fixed width in bytes, or -1 for variable-width types.
pub fn type_size(t: &Type) -> i16 {
    match *t {
        Type::BOOL => 1,
        Type::INT2 => 2,
        Type::INT4 | Type::FLOAT4 | Type::DATE => 4,
        Type::INT8 | Type::FLOAT8 | Type::TIMESTAMP | Type::TIMESTAMPTZ => 8,
        _ => -1,
    }
}

/// Whether values of `t` are text-like (sent as their text in both formats).
fn is_textual(t: &Type) -> bool {
    matches!(
        *t,
        Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN | Type::JSON
    )
}

/// The error of a value that cannot be sent or received as a type.
#[derive(Debug)]
pub struct ValueError {
    pub sqlstate: &'static str,
    pub message: String,
}

fn invalid(t: &Type, s: &str) -> ValueError {
    ValueError {
        sqlstate: "22P02",
        message: format!("invalid input syntax for type {}: \"{s}\"", t.name()),
    }
}

fn binary_invalid(t: &Type) -> ValueError {
    ValueError {
        sqlstate: "22P03",
        message: format!("incorrect binary data format for type {}", t.name()),
    }
}

// ---------------------------------------------------------------------------
// Output

/// PostgreSQL's text form of a float8 with `extra_float_digits >= 1`: the
/// shortest string that reads back as the same value, in exponent form
/// when the decimal exponent is below -4 or at least `max_exp`.
pub fn float_text(f: f64, max_exp: i32) -> String {
    let mut buf = BytesMut::with_capacity(32);
    write_float_text(&mut buf, f, max_exp);
    String::from_utf8_lossy(&buf).into_owned()
}

/// [`float_text`] of a float4: the shortest digits that read back as the
/// same *float4* (PostgreSQL's `0.1::real` is `0.1`, not the digits of
/// the float8 it widens to), exponent form from 10^6 on.
pub fn float4_text(f: f32) -> String {
    let mut buf = BytesMut::with_capacity(16);
    write_float4_text(&mut buf, f);
    String::from_utf8_lossy(&buf).into_owned()
}

/// Appends [`float_text`]'s form of `f` to `buf` without allocating.
pub fn write_float_text(buf: &mut BytesMut, f: f64, max_exp: i32) {
    if let Some(special) = special_float(f) {
        return buf.put_slice(special);
    }
    let mut shortest = ryu::Buffer::new();
    lay_out_float(buf, shortest.format_finite(f).as_bytes(), max_exp);
}

/// Appends [`float4_text`]'s form of `f` to `buf` without allocating.
pub fn write_float4_text(buf: &mut BytesMut, f: f32) {
    if let Some(special) = special_float(f.into()) {
        return buf.put_slice(special);
    }
    let mut shortest = ryu::Buffer::new();
    lay_out_float(buf, shortest.format_finite(f).as_bytes(), 6);
}

/// NaN, the infinities and the zeros, as PostgreSQL prints them.
fn special_float(f: f64) -> Option<&'static [u8]> {
    if f.is_nan() {
        Some(b"NaN")
    } else if f.is_infinite() {
        Some(if f > 0.0 { b"Infinity" } else { b"-Infinity" })
    } else if f == 0.0 {
        Some(if f.is_sign_negative() { b"-0" } else { b"0" })
    } else {
        None
    }
}

/// Lays out a finite, non-zero float's shortest round-trip digits (as
/// `ryu` prints them: `-123.45`, `0.0012345`, `1.2345e20`, `1e-7`,
/// `1.0`) in PostgreSQL's form. The digits and the decimal exponent are
/// read off that text, then written so:
///
/// ```text
///   digits "12345", exponent 2 (the value is 1.2345 × 10^2)
///   exponent < -4 or ≥ max_exp:  1.2345e+02   (at least two exponent digits)
///   exponent ≥ 0:                123.45       (point after exponent + 1 digits)
///   exponent < 0:                0.0012345    (0. then -exponent - 1 zeros)
/// ```
fn lay_out_float(buf: &mut BytesMut, text: &[u8], max_exp: i32) {
    // Most values: `ryu`'s decimal form is PostgreSQL's, less a trailing
    // ".0" ("100.0" is "100").
    if !text.contains(&b'e') {
        let body = text.strip_prefix(b"-").unwrap_or(text);
        let exp = match body.strip_prefix(b"0.") {
            Some(fraction) => -1 - fraction.iter().take_while(|&&b| b == b'0').count() as i32,
            None => body.iter().position(|&b| b == b'.').unwrap_or(body.len()) as i32 - 1,
        };
        if (-4..max_exp).contains(&exp) {
            return buf.put_slice(text.strip_suffix(b".0").unwrap_or(text));
        }
    }
    let (negative, text) = match text.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, text),
    };
    let (mantissa, exp_text) = match text.iter().position(|&b| b == b'e') {
        Some(at) => (&text[..at], &text[at + 1..]),
        None => (text, &[][..]),
    };
    let int_len = mantissa
        .iter()
        .position(|&b| b == b'.')
        .unwrap_or(mantissa.len());
    // At most 17 significant digits (an f64), in a buffer with room to spare.
    let mut digits = [0u8; 40];
    let mut n = 0;
    let mut leading_zeros = 0i32;
    for &b in mantissa.iter().filter(|b| b.is_ascii_digit()) {
        if n == 0 && b == b'0' {
            leading_zeros += 1;
        } else if n < digits.len() {
            digits[n] = b;
            n += 1;
        }
    }
    while n > 1 && digits[n - 1] == b'0' {
        n -= 1;
    }
    let digits = &digits[..n];
    let (exp_negative, exp_digits) = match exp_text.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, exp_text),
    };
    // At most three digits (ryu writes nothing else there).
    let written_exp = exp_digits
        .iter()
        .filter(|d| d.is_ascii_digit())
        .fold(0i32, |e, &d| {
            e.saturating_mul(10).saturating_add(i32::from(d - b'0'))
        });
    let exp = int_len as i32 - 1 - leading_zeros
        + if exp_negative {
            -written_exp
        } else {
            written_exp
        };
    if negative {
        buf.put_u8(b'-');
    }
    if exp < -4 || exp >= max_exp {
        buf.put_u8(digits.first().copied().unwrap_or(b'0'));
        if digits.len() > 1 {
            buf.put_u8(b'.');
            buf.put_slice(&digits[1..]);
        }
        buf.put_u8(b'e');
        buf.put_u8(if exp < 0 { b'-' } else { b'+' });
        let abs = exp.unsigned_abs();
        if abs < 10 {
            buf.put_u8(b'0');
        }
        buf.put_slice(itoa::Buffer::new().format(abs).as_bytes());
    } else if exp >= 0 {
        let int_len = exp as usize + 1;
        if digits.len() <= int_len {
            buf.put_slice(digits);
            buf.put_bytes(b'0', int_len - digits.len());
        } else {
            buf.put_slice(&digits[..int_len]);
            buf.put_u8(b'.');
            buf.put_slice(&digits[int_len..]);
        }
    } else {
        buf.put_slice(b"0.");
        buf.put_bytes(b'0', (-exp - 1) as usize);
        buf.put_slice(digits);
    }
}

/// A result column written in text format straight from its Arrow array:
/// the common types without a [`Value`] or a `String` per cell (the same
/// text [`text`] gives their values); any other type goes through
/// [`spindle_sql::types::array_value`] and [`text`].
pub enum TextColumn<'a> {
    Int64(&'a Int64Array),
    Int32(&'a Int32Array),
    Int16(&'a Int16Array),
    /// The flag: described as float4 (printed with a float4's digits).
    Float64(&'a Float64Array, bool),
    Float32(&'a Float32Array, bool),
    Bool(&'a BooleanArray),
    Utf8(&'a StringArray),
    LargeUtf8(&'a LargeStringArray),
    Utf8View(&'a StringViewArray),
    Other(&'a dyn Array, Type),
}

impl<'a> TextColumn<'a> {
    pub fn of(array: &'a dyn Array, t: &Type) -> Self {
        let any = array.as_any();
        let float4 = *t == Type::FLOAT4;
        let fast = match array.data_type() {
            ArrowType::Int64 => any.downcast_ref().map(TextColumn::Int64),
            ArrowType::Int32 => any.downcast_ref().map(TextColumn::Int32),
            ArrowType::Int16 => any.downcast_ref().map(TextColumn::Int16),
            ArrowType::Float64 => any.downcast_ref().map(|a| TextColumn::Float64(a, float4)),
            ArrowType::Float32 => any.downcast_ref().map(|a| TextColumn::Float32(a, float4)),
            ArrowType::Boolean => any.downcast_ref().map(TextColumn::Bool),
            ArrowType::Utf8 => any.downcast_ref().map(TextColumn::Utf8),
            ArrowType::LargeUtf8 => any.downcast_ref().map(TextColumn::LargeUtf8),
            ArrowType::Utf8View => any.downcast_ref().map(TextColumn::Utf8View),
            _ => None,
        };
        fast.unwrap_or_else(|| TextColumn::Other(array, t.clone()))
    }

    /// Appends row `row`'s text form to `buf` and returns true; returns
    /// false (nothing written) for NULL.
    pub fn write(&self, row: usize, buf: &mut BytesMut) -> spindle_sql::Result<bool> {
        let int = |i: i64, buf: &mut BytesMut| {
            buf.put_slice(itoa::Buffer::new().format(i).as_bytes());
        };
        let float = |f: f64, float4: bool, buf: &mut BytesMut| {
            if float4 {
                write_float4_text(buf, f as f32)
            } else {
                write_float_text(buf, f, 15)
            }
        };
        macro_rules! cell {
            ($a:expr, $write:expr) => {{
                if $a.is_null(row) {
                    return Ok(false);
                }
                $write($a.value(row));
            }};
        }
        match self {
            TextColumn::Int64(a) => cell!(a, |v: i64| int(v, buf)),
            TextColumn::Int32(a) => cell!(a, |v: i32| int(v.into(), buf)),
            TextColumn::Int16(a) => cell!(a, |v: i16| int(v.into(), buf)),
            TextColumn::Float64(a, f4) => cell!(a, |v: f64| float(v, *f4, buf)),
            TextColumn::Float32(a, f4) => cell!(a, |v: f32| float(v.into(), *f4, buf)),
            TextColumn::Bool(a) => cell!(a, |v: bool| buf.put_u8(if v { b't' } else { b'f' })),
            TextColumn::Utf8(a) => cell!(a, |v: &str| buf.put_slice(v.as_bytes())),
            TextColumn::LargeUtf8(a) => cell!(a, |v: &str| buf.put_slice(v.as_bytes())),
            TextColumn::Utf8View(a) => cell!(a, |v: &str| buf.put_slice(v.as_bytes())),
            TextColumn::Other(a, t) => match text(&spindle_sql::types::array_value(*a, row)?, t) {
                Some(s) => buf.put_slice(s.as_bytes()),
                None => return Ok(false),
            },
        }
        Ok(true)
    }
}

/// The text form of `v` as a value of type `t`; `None` for NULL.
pub fn text(v: &Value, t: &Type) -> Option<String> {
    Some(match v {
        Value::Null => return None,
        Value::Int64(i) => i.to_string(),
        Value::Float64(f) if *t == Type::FLOAT4 => float4_text(*f as f32),
        Value::Float64(f) => float_text(*f, 15),
        Value::Bool(b) => if *b { "t" } else { "f" }.to_string(),
        Value::String(s) | Value::Json(s) => s.clone(),
        Value::Bytes(b) => {
            let mut s = String::with_capacity(2 + b.len() * 2);
            s.push_str("\\x");
            for byte in b {
                s.push_str(&format!("{byte:02x}"));
            }
            s
        }
        Value::Date(d) => format_date(*d),
        Value::Timestamp(t_) if *t == Type::TIMESTAMP => {
            let s = format_timestamp(*t_);
            s.strip_suffix("+00").map(str::to_string).unwrap_or(s)
        }
        Value::Timestamp(t_) => format_timestamp(*t_),
        Value::Numeric(n) => format_numeric(*n),
    })
}

/// Appends PostgreSQL's binary (`send`) form of `v` as type `t`.
pub fn write_binary(v: &Value, t: &Type, buf: &mut BytesMut) -> Result<(), ValueError> {
    let mismatch = || ValueError {
        sqlstate: "42804",
        message: format!(
            "cannot send a {} value as binary {}",
            v.type_name(),
            t.name()
        ),
    };
    let int = |v: &Value| -> Option<i64> {
        match v {
            Value::Int64(i) => Some(*i),
            _ => None,
        }
    };
    match *t {
        Type::INT8 => buf.put_i64(int(v).ok_or_else(mismatch)?),
        Type::INT4 => buf.put_i32(
            int(v)
                .and_then(|i| i32::try_from(i).ok())
                .ok_or_else(mismatch)?,
        ),
        Type::INT2 => buf.put_i16(
            int(v)
                .and_then(|i| i16::try_from(i).ok())
                .ok_or_else(mismatch)?,
        ),
        Type::FLOAT8 => match v {
            Value::Float64(f) => buf.put_f64(*f),
            Value::Int64(i) => buf.put_f64(*i as f64),
            _ => return Err(mismatch()),
        },
        Type::FLOAT4 => match v {
            Value::Float64(f) => buf.put_f32(*f as f32),
            _ => return Err(mismatch()),
        },
        Type::BOOL => match v {
            Value::Bool(b) => buf.put_u8(*b as u8),
            _ => return Err(mismatch()),
        },
        Type::BYTEA => match v {
            Value::Bytes(b) => buf.put_slice(b),
            _ => return Err(mismatch()),
        },
        Type::DATE => match v {
            Value::Date(d) => buf.put_i32(d - PG_EPOCH_DAYS),
            _ => return Err(mismatch()),
        },
        Type::TIMESTAMP | Type::TIMESTAMPTZ => match v {
            Value::Timestamp(t) => buf.put_i64(t - PG_EPOCH_MICROS),
            _ => return Err(mismatch()),
        },
        Type::NUMERIC => match v {
            Value::Numeric(n) => write_numeric(*n, buf),
            Value::Int64(i) => write_numeric(*i as i128 * 10i128.pow(NUMERIC_SCALE), buf),
            _ => return Err(mismatch()),
        },
        Type::JSONB => {
            buf.put_u8(1);
            buf.put_slice(text(v, t).unwrap_or_default().as_bytes());
        }
        _ => buf.put_slice(text(v, t).unwrap_or_default().as_bytes()),
    }
    Ok(())
}

/// PostgreSQL's binary numeric: ndigits, weight, sign, dscale, then
/// base-10000 digits, for an i128 scaled by 10^9.
fn write_numeric(n: i128, buf: &mut BytesMut) {
    let scale = 10u128.pow(NUMERIC_SCALE);
    let abs = n.unsigned_abs();
    let (mut int, frac) = (abs / scale, abs % scale);
    let dscale = {
        let s = format!("{frac:09}");
        s.trim_end_matches('0').len() as u16
    };
    let mut int_groups = Vec::new();
    while int > 0 {
        int_groups.push((int % 10_000) as i16);
        int /= 10_000;
    }
    int_groups.reverse();
    // Nine fractional digits padded to twelve: three base-10000 groups.
    let frac12 = frac * 1000;
    let frac_groups = [
        (frac12 / 100_000_000) as i16,
        ((frac12 / 10_000) % 10_000) as i16,
        (frac12 % 10_000) as i16,
    ];
    let mut weight = int_groups.len() as i16 - 1;
    let mut digits: Vec<i16> = int_groups.into_iter().chain(frac_groups).collect();
    while digits.first() == Some(&0) {
        digits.remove(0);
        weight -= 1;
    }
    while digits.last() == Some(&0) {
        digits.pop();
    }
    if digits.is_empty() {
        weight = 0;
    }
    buf.put_i16(digits.len() as i16);
    buf.put_i16(weight);
    buf.put_u16(if n < 0 { 0x4000 } else { 0 });
    buf.put_u16(dscale);
    for d in digits {
        buf.put_i16(d);
    }
}

/// Reads PostgreSQL's binary numeric as a decimal string.
fn read_numeric(b: &[u8]) -> Option<String> {
    let rd = |i: usize| -> Option<i16> { Some(i16::from_be_bytes([*b.get(i)?, *b.get(i + 1)?])) };
    let ndigits = rd(0)?;
    let weight = rd(2)? as i32;
    let sign = rd(4)? as u16;
    let dscale = rd(6)?.max(0) as usize;
    if sign == 0xC000 || ndigits < 0 || b.len() != 8 + 2 * ndigits as usize {
        return None;
    }
    let digits: Vec<i16> = (0..ndigits as usize)
        .map(|i| rd(8 + 2 * i))
        .collect::<Option<_>>()?;
    if digits.iter().any(|d| !(0..10_000).contains(d)) {
        return None;
    }
    let mut int = String::new();
    let mut frac = String::new();
    for (i, d) in digits.iter().enumerate() {
        let pos = weight - i as i32;
        if pos >= 0 {
            int.push_str(&format!("{d:04}"));
        } else {
            // leading zero groups between the point and the first digit
            if frac.is_empty() {
                for _ in 0..(-pos - 1) {
                    frac.push_str("0000");
                }
            }
            frac.push_str(&format!("{d:04}"));
        }
    }
    // integer groups below the last digit
    let last_pos = weight - digits.len() as i32 + 1;
    if last_pos > 0 {
        for _ in 0..last_pos {
            int.push_str("0000");
        }
    }
    let int = int.trim_start_matches('0');
    let mut s = String::new();
    if sign == 0x4000 {
        s.push('-');
    }
    s.push_str(if int.is_empty() { "0" } else { int });
    let frac = frac.trim_end_matches('0');
    if !frac.is_empty() || dscale > 0 {
        s.push('.');
        s.push_str(frac);
        if frac.is_empty() {
            s.push('0');
        }
    }
    Some(s)
}

// ---------------------------------------------------------------------------
// Input ($n parameters)

/// A `$n` parameter of type `t` sent in text format.
pub fn param_from_text(t: &Type, s: &str) -> Result<Value, ValueError> {
    Ok(match *t {
        Type::INT2 | Type::INT4 | Type::INT8 | Type::OID => {
            Value::Int64(s.trim().parse().map_err(|_| invalid(t, s))?)
        }
        Type::FLOAT4 | Type::FLOAT8 => {
            let f = match s.trim().to_ascii_lowercase().as_str() {
                "nan" => f64::NAN,
                "infinity" | "inf" | "+infinity" => f64::INFINITY,
                "-infinity" | "-inf" => f64::NEG_INFINITY,
                other => other.parse().map_err(|_| invalid(t, s))?,
            };
            Value::Float64(f)
        }
        Type::BOOL => Value::Bool(match s.trim().to_ascii_lowercase().as_str() {
            "t" | "true" | "yes" | "y" | "on" | "1" => true,
            "f" | "false" | "no" | "n" | "off" | "0" => false,
            _ => return Err(invalid(t, s)),
        }),
        Type::BYTEA => Value::Bytes(parse_bytea(s).ok_or_else(|| invalid(t, s))?),
        Type::DATE => Value::Date(parse_date(s).ok_or_else(|| invalid(t, s))?),
        Type::TIMESTAMP | Type::TIMESTAMPTZ => {
            Value::Timestamp(parse_timestamp(s).ok_or_else(|| invalid(t, s))?)
        }
        Type::NUMERIC => Value::Numeric(parse_numeric(s).ok_or_else(|| invalid(t, s))?),
        Type::JSON | Type::JSONB => Value::Json(s.to_string()),
        _ => Value::String(s.to_string()),
    })
}

/// `\x0102…` (hex) or PostgreSQL's escape format.
fn parse_bytea(s: &str) -> Option<Vec<u8>> {
    if let Some(hex) = s.strip_prefix("\\x") {
        let hex: Vec<u8> = hex.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
        if !hex.len().is_multiple_of(2) {
            return None;
        }
        return hex
            .chunks(2)
            .map(|p| u8::from_str_radix(std::str::from_utf8(p).ok()?, 16).ok())
            .collect();
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' {
            out.push(b[i]);
            i += 1;
        } else if b.get(i + 1) == Some(&b'\\') {
            out.push(b'\\');
            i += 2;
        } else {
            let oct = std::str::from_utf8(b.get(i + 1..i + 4)?).ok()?;
            out.push(u8::from_str_radix(oct, 8).ok()?);
            i += 4;
        }
    }
    Some(out)
}

/// A `$n` parameter of type `t` sent in binary format.
pub fn param_from_binary(t: &Type, b: &[u8]) -> Result<Value, ValueError> {
    let fixed = |n: usize| -> Result<&[u8], ValueError> {
        if b.len() == n {
            Ok(b)
        } else {
            Err(binary_invalid(t))
        }
    };
    let utf8 = |b: &[u8]| -> Result<String, ValueError> {
        String::from_utf8(b.to_vec()).map_err(|_| ValueError {
            sqlstate: "22021",
            message: "invalid byte sequence for encoding \"UTF8\"".into(),
        })
    };
    Ok(match *t {
        Type::INT8 => Value::Int64(i64::from_be_bytes(fixed(8)?.try_into().unwrap_or_default())),
        Type::INT4 | Type::OID => {
            Value::Int64(i32::from_be_bytes(fixed(4)?.try_into().unwrap_or_default()) as i64)
        }
        Type::INT2 => {
            Value::Int64(i16::from_be_bytes(fixed(2)?.try_into().unwrap_or_default()) as i64)
        }
        Type::FLOAT8 => {
            Value::Float64(f64::from_be_bytes(fixed(8)?.try_into().unwrap_or_default()))
        }
        Type::FLOAT4 => {
            Value::Float64(f32::from_be_bytes(fixed(4)?.try_into().unwrap_or_default()) as f64)
        }
        Type::BOOL => Value::Bool(fixed(1)?[0] != 0),
        Type::BYTEA => Value::Bytes(b.to_vec()),
        Type::DATE => {
            let d = i32::from_be_bytes(fixed(4)?.try_into().unwrap_or_default());
            Value::Date(
                d.checked_add(PG_EPOCH_DAYS)
                    .ok_or_else(|| binary_invalid(t))?,
            )
        }
        Type::TIMESTAMP | Type::TIMESTAMPTZ => {
            let us = i64::from_be_bytes(fixed(8)?.try_into().unwrap_or_default());
            Value::Timestamp(
                us.checked_add(PG_EPOCH_MICROS)
                    .ok_or_else(|| binary_invalid(t))?,
            )
        }
        Type::NUMERIC => {
            let s = read_numeric(b).ok_or_else(|| binary_invalid(t))?;
            Value::Numeric(parse_numeric(&s).ok_or_else(|| ValueError {
                sqlstate: "22003",
                message: format!(
                    "numeric value {s} does not fit NUMERIC (29 integer and 9 fractional digits)"
                ),
            })?)
        }
        Type::JSONB => match b.split_first() {
            Some((1, rest)) => Value::Json(utf8(rest)?),
            _ => return Err(binary_invalid(t)),
        },
        Type::JSON => Value::Json(utf8(b)?),
        ref other if is_textual(other) => Value::String(utf8(b)?),
        _ => {
            return Err(ValueError {
                sqlstate: "0A000",
                message: format!("binary parameters of type {} are not supported", t.name()),
            })
        }
    })
}

/// A value in binary format of the type with OID `oid` (unknown OIDs are
/// read as text): what a client decodes from a binary DataRow field.
pub fn value_from_binary(oid: u32, b: &[u8]) -> Result<Value, ValueError> {
    param_from_binary(&Type::from_oid(oid).unwrap_or(Type::TEXT), b)
}

/// The type a parameter is described with when the client did not declare
/// one: the inferred Arrow type's PostgreSQL type, else `text`.
pub fn param_type(inferred: Option<&ArrowType>) -> Type {
    match inferred {
        Some(t) => match arrow_pg_type(t) {
            // Spindle's integers are all INT64; a narrower inferred type
            // (e.g. from a literal) would make drivers refuse i64 values.
            Type::INT2 | Type::INT4 => Type::INT8,
            Type::FLOAT4 => Type::FLOAT8,
            other => other,
        },
        None => Type::TEXT,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_like_postgres() {
        assert_eq!(float_text(1.5, 15), "1.5");
        assert_eq!(float_text(1e100, 15), "1e+100");
        assert_eq!(float_text(1.5e-5, 15), "1.5e-05");
        assert_eq!(float_text(0.0001, 15), "0.0001");
        assert_eq!(float_text(123456789012345.0, 15), "123456789012345");
        assert_eq!(float_text(1e15, 15), "1e+15");
        assert_eq!(float_text(-0.0, 15), "-0");
        assert_eq!(float_text(0.1 + 0.2, 15), "0.30000000000000004");
        assert_eq!(float_text(f64::NEG_INFINITY, 15), "-Infinity");
    }

    /// The text form the laid-out one must equal, from Rust's own
    /// shortest digits (`{:e}` and `{}`, two formattings and two
    /// `String`s), for an f64 ...
    fn float_text_reference(f: f64, max_exp: i32) -> String {
        if f.is_nan() {
            return "NaN".into();
        }
        if f.is_infinite() {
            return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
        }
        if f == 0.0 {
            return if f.is_sign_negative() { "-0" } else { "0" }.into();
        }
        reference_layout(format!("{f:e}"), format!("{f}"), max_exp)
    }

    /// ... and for an f32, from the f32's shortest digits.
    fn float4_text_reference(f: f32) -> String {
        if f.is_nan() || f.is_infinite() || f == 0.0 {
            return float_text_reference(f.into(), 6);
        }
        reference_layout(format!("{f:e}"), format!("{f}"), 6)
    }

    fn reference_layout(sci: String, decimal: String, max_exp: i32) -> String {
        let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
        let exp: i32 = exp.parse().unwrap_or(0);
        if exp < -4 || exp >= max_exp {
            format!(
                "{mantissa}e{}{:02}",
                if exp < 0 { '-' } else { '+' },
                exp.abs()
            )
        } else {
            decimal
        }
    }

    /// `printed` is the reference's text, or — where the value lies exactly
    /// halfway between two shortest candidates — the other candidate:
    /// PostgreSQL (like `ryu`) then takes the even last digit, and Rust's
    /// `fmt` does not always (`-1360612983276717.25` prints as
    /// `-1.3606129832767172e+15` in PostgreSQL 15, `…173e+15` in Rust).
    /// The other candidate has the same length, differs in one digit, and
    /// reads back as the same value.
    fn same_or_tie(printed: &str, reference: &str, reads_back: impl Fn(&str) -> bool) -> bool {
        let differing = printed
            .bytes()
            .zip(reference.bytes())
            .filter(|(a, b)| a != b)
            .count();
        printed == reference
            || (printed.len() == reference.len() && differing == 1 && reads_back(printed))
    }

    fn f64_is(f: f64) -> impl Fn(&str) -> bool {
        move |s| s.parse::<f64>().ok() == Some(f)
    }

    fn f32_is(f: f32) -> impl Fn(&str) -> bool {
        move |s| s.parse::<f32>().ok() == Some(f)
    }

    proptest::proptest! {
        /// Any f64 (every bit pattern: subnormals, NaNs, the extremes) and
        /// any f32 print as the reference prints them.
        #[test]
        fn floats_print_as_the_reference(bits: u64, bits32: u32, max_exp in 1i32..20) {
            let f = f64::from_bits(bits);
            for e in [15, max_exp] {
                let (printed, reference) = (float_text(f, e), float_text_reference(f, e));
                proptest::prop_assert!(same_or_tie(&printed, &reference, f64_is(f)), "{printed} / {reference}");
            }
            let g = f32::from_bits(bits32);
            let (printed, reference) = (float4_text(g), float4_text_reference(g));
            proptest::prop_assert!(same_or_tie(&printed, &reference, f32_is(g)), "{printed} / {reference}");
        }

        /// Decimal-range values (where the digits are laid out by hand).
        #[test]
        fn decimal_floats_print_as_the_reference(m in -1_000_000_000i64..1_000_000_000, e in -8i32..18) {
            let f = m as f64 * 10f64.powi(e - 6);
            let (printed, reference) = (float_text(f, 15), float_text_reference(f, 15));
            proptest::prop_assert!(same_or_tie(&printed, &reference, f64_is(f)), "{printed} / {reference}");
            let g = f as f32;
            let (printed, reference) = (float4_text(g), float4_text_reference(g));
            proptest::prop_assert!(same_or_tie(&printed, &reference, f32_is(g)), "{printed} / {reference}");
        }
    }

    /// Exact ties print PostgreSQL's (even) candidate: -1360612983276717.25
    /// and 2257685.25 (as a float4), given by their bits (their literals
    /// have more digits than the shortest form clippy wants).
    #[test]
    fn ties_print_like_postgres() {
        let f = f64::from_bits(14056673289329054389);
        assert_eq!(f, -1_360_612_983_276_717.2);
        assert_eq!(float_text(f, 15), "-1.3606129832767172e+15");
        let g = f32::from_bits(1242156117);
        assert_eq!(g, 2_257_685.2);
        assert_eq!(float4_text(g), "2.2576852e+06");
    }

    #[test]
    fn float_text_edges() {
        for f in [
            1.0,
            10.0,
            100.0,
            1e14,
            1e15,
            123.456,
            0.1,
            0.001,
            0.0001,
            0.00001,
            1e-5,
            9.999e-5,
            -2.5,
            5e-324,
            f64::MAX,
            f64::MIN_POSITIVE,
            1e21,
            12345678901234567890.0,
        ] {
            assert_eq!(float_text(f, 15), float_text_reference(f, 15), "{f:e}");
            assert_eq!(float_text(f, 6), float_text_reference(f, 6), "{f:e}");
        }
        assert_eq!(float_text(100.0, 15), "100");
        assert_eq!(float_text(-0.00123, 15), "-0.00123");
        assert_eq!(float_text(1e6, 6), "1e+06");
    }

    /// float4 prints its own shortest digits, as PostgreSQL 15 does
    /// (`SELECT 0.1::real, 1.1::real, 123456::real, 1234567::real,
    /// 0.0001::real, 1e-5::real, 3.4028235e38::real`).
    #[test]
    fn float4s_print_like_postgres() {
        let printed: Vec<String> = [0.1f32, 1.1, 123456.0, 1234567.0, 0.0001, 1e-5, f32::MAX]
            .into_iter()
            .map(float4_text)
            .collect();
        assert_eq!(
            printed,
            [
                "0.1",
                "1.1",
                "123456",
                "1.234567e+06",
                "0.0001",
                "1e-05",
                "3.4028235e+38"
            ]
        );
    }

    /// A column written straight from its array gives what `text` gives
    /// the cell's value, NULLs included, for every fast type and a
    /// fallback one.
    #[test]
    fn text_columns_write_what_text_gives() {
        use datafusion::arrow::array::{ArrayRef, Date32Array};
        use std::sync::Arc;
        let columns: Vec<(ArrayRef, Type)> = vec![
            (
                Arc::new(Int64Array::from(vec![Some(-7), None, Some(i64::MIN)])),
                Type::INT8,
            ),
            (
                Arc::new(Int32Array::from(vec![Some(i32::MAX), Some(0), None])),
                Type::INT4,
            ),
            (
                Arc::new(Int16Array::from(vec![None, Some(-3), Some(12)])),
                Type::INT2,
            ),
            (
                Arc::new(Float64Array::from(vec![Some(0.1 + 0.2), None, Some(1e100)])),
                Type::FLOAT8,
            ),
            (
                Arc::new(Float64Array::from(vec![Some(0.1), Some(1e7), Some(-0.0)])),
                Type::FLOAT4,
            ),
            (
                Arc::new(Float32Array::from(vec![Some(1.1f32), None, Some(3e-7)])),
                Type::FLOAT4,
            ),
            (
                Arc::new(BooleanArray::from(vec![Some(true), Some(false), None])),
                Type::BOOL,
            ),
            (
                Arc::new(StringArray::from(vec![Some("héllo"), None, Some("")])),
                Type::TEXT,
            ),
            (
                Arc::new(LargeStringArray::from(vec![None, Some("x"), Some("yz")])),
                Type::TEXT,
            ),
            (
                Arc::new(StringViewArray::from(vec![
                    Some("a view longer than twelve"),
                    None,
                    Some("v"),
                ])),
                Type::TEXT,
            ),
            (
                Arc::new(Date32Array::from(vec![Some(0), None, Some(19_000)])),
                Type::DATE,
            ),
        ];
        for (array, t) in &columns {
            let column = TextColumn::of(array.as_ref(), t);
            for row in 0..array.len() {
                let mut buf = BytesMut::new();
                let written = column.write(row, &mut buf).unwrap();
                let want = text(
                    &spindle_sql::types::array_value(array.as_ref(), row).unwrap(),
                    t,
                );
                let got = written.then(|| String::from_utf8(buf.to_vec()).unwrap());
                assert_eq!(got, want, "{:?} row {row}", array.data_type());
            }
        }
    }

    #[test]
    fn numeric_binary_round_trips() {
        for s in [
            "0",
            "1",
            "-1",
            "12.5",
            "0.000000001",
            "10000",
            "123456789.123456789",
            "-99999999999999999999999999999.999999999",
            "100000000",
            "0.0001",
        ] {
            let n = parse_numeric(s).unwrap();
            let mut buf = BytesMut::new();
            write_numeric(n, &mut buf);
            let back = read_numeric(&buf).unwrap();
            assert_eq!(parse_numeric(&back), Some(n), "{s} -> {back}");
        }
    }

    #[test]
    fn text_params_parse() {
        assert!(matches!(
            param_from_text(&Type::INT8, " 42"),
            Ok(Value::Int64(42))
        ));
        assert_eq!(
            param_from_text(&Type::INT8, "x").unwrap_err().sqlstate,
            "22P02"
        );
        assert!(matches!(
            param_from_text(&Type::BYTEA, "\\x0aff"),
            Ok(Value::Bytes(b)) if b == vec![10, 255]
        ));
        assert!(matches!(
            param_from_text(&Type::BYTEA, "a\\\\b\\001"),
            Ok(Value::Bytes(b)) if b == vec![b'a', b'\\', b'b', 1]
        ));
        assert_eq!(
            param_from_binary(&Type::INT8, &[1, 2])
                .unwrap_err()
                .sqlstate,
            "22P03"
        );
    }
}
