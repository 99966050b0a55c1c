//! Encoding of a row's non-key columns (the value stored under a row key).
//!
//! ```text
//!   01                      format version
//!   [count: varint]         number of non-NULL columns present
//!   repeated count times:
//!     [column id: varint] [tag: u8] [payload]
//! ```
//!
//! Payloads: INT64/TIMESTAMP 8 bytes LE, FLOAT64 8 bytes LE bits, BOOL 1
//! byte, DATE 4 bytes LE, NUMERIC 16 bytes LE, STRING/BYTES/JSON a varint
//! length then the bytes. A column absent from the row is NULL. Columns are
//! identified by their stable column id, not their position, so DROP
//! COLUMN and ADD COLUMN without a default never rewrite existing rows
//! (ADD COLUMN with a default writes it into each existing row).

use crate::value::Value;
use crate::Error;

const FORMAT: u8 = 1;

/// Encodes `(column id, value)` pairs; NULL values are omitted.
pub fn encode_row(columns: &[(u32, &Value)]) -> Vec<u8> {
    encode_row_iter(columns.iter().copied())
}

/// [`encode_row`] of pairs an iterator yields (it is walked twice: once
/// to count the present columns, once to write them).
pub fn encode_row_iter<'a>(columns: impl Iterator<Item = (u32, &'a Value)> + Clone) -> Vec<u8> {
    let (present, bytes) = columns
        .clone()
        .filter(|(_, v)| !v.is_null())
        .fold((0usize, 0usize), |(n, b), (_, v)| {
            (n + 1, b + payload_hint(v))
        });
    let mut out = Vec::with_capacity(2 + present * 3 + bytes);
    out.push(FORMAT);
    put_varint(&mut out, present as u64);
    for (id, v) in columns {
        if v.is_null() {
            continue;
        }
        put_varint(&mut out, id as u64);
        out.push(v.tag());
        match v {
            Value::Null => {}
            Value::Bool(b) => out.push(*b as u8),
            Value::Int64(i) | Value::Timestamp(i) => out.extend_from_slice(&i.to_le_bytes()),
            Value::Float64(f) => out.extend_from_slice(&f.to_bits().to_le_bytes()),
            Value::Date(d) => out.extend_from_slice(&d.to_le_bytes()),
            Value::Numeric(n) => out.extend_from_slice(&n.to_le_bytes()),
            Value::String(s) | Value::Json(s) => {
                put_varint(&mut out, s.len() as u64);
                out.extend_from_slice(s.as_bytes());
            }
            Value::Bytes(b) => {
                put_varint(&mut out, b.len() as u64);
                out.extend_from_slice(b);
            }
        }
    }
    out
}

/// About how many bytes a value's payload takes (for the output's one
/// allocation; a varint length counts as 2).
fn payload_hint(v: &Value) -> usize {
    match v {
        Value::Null => 0,
        Value::Bool(_) => 1,
        Value::Date(_) => 4,
        Value::Int64(_) | Value::Timestamp(_) | Value::Float64(_) => 8,
        Value::Numeric(_) => 16,
        Value::String(s) | Value::Json(s) => 2 + s.len(),
        Value::Bytes(b) => 2 + b.len(),
    }
}

/// Decodes a row into `(column id, value)` pairs in stored order.
pub fn decode_row(input: &[u8]) -> Result<Vec<(u32, Value)>, Error> {
    let mut out = Vec::new();
    decode_row_with(input, |_| true, |id, v| out.push((id, v)))?;
    Ok(out)
}

/// A stored value borrowed from the row's bytes: what [`visit_row`] hands
/// out, so that a scan can append a string to its output column without
/// allocating a `String` for it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RawValue<'a> {
    Bool(bool),
    Int64(i64),
    Float64(f64),
    Date(i32),
    Timestamp(i64),
    Numeric(i128),
    String(&'a str),
    Json(&'a str),
    Bytes(&'a [u8]),
}

impl RawValue<'_> {
    /// The owned value.
    pub fn to_value(self) -> Value {
        match self {
            RawValue::Bool(b) => Value::Bool(b),
            RawValue::Int64(i) => Value::Int64(i),
            RawValue::Float64(f) => Value::Float64(f),
            RawValue::Date(d) => Value::Date(d),
            RawValue::Timestamp(t) => Value::Timestamp(t),
            RawValue::Numeric(n) => Value::Numeric(n),
            RawValue::String(s) => Value::String(s.to_string()),
            RawValue::Json(s) => Value::Json(s.to_string()),
            RawValue::Bytes(b) => Value::Bytes(b.to_vec()),
        }
    }

    /// The name of the value's type, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            RawValue::Bool(_) => "BOOL",
            RawValue::Int64(_) => "INT64",
            RawValue::Float64(_) => "FLOAT64",
            RawValue::Date(_) => "DATE",
            RawValue::Timestamp(_) => "TIMESTAMP",
            RawValue::Numeric(_) => "NUMERIC",
            RawValue::String(_) => "STRING",
            RawValue::Json(_) => "JSON",
            RawValue::Bytes(_) => "BYTES",
        }
    }
}

/// Decodes the columns of a row that `wanted` accepts (by column id) and
/// hands each to `found`, in stored order; the other columns are skipped
/// without being decoded (no string is allocated for them). The whole row
/// is still checked for truncation.
pub fn decode_row_with(
    input: &[u8],
    wanted: impl FnMut(u32) -> bool,
    mut found: impl FnMut(u32, Value),
) -> Result<(), Error> {
    visit_row(input, wanted, |id, v| {
        found(id, v.to_value());
        Ok(())
    })
}

/// Like [`decode_row_with`], handing out values borrowed from `input`
/// (strings are checked to be UTF-8, not copied). An error from `found`
/// stops the walk and is returned.
pub fn visit_row<'a>(
    input: &'a [u8],
    mut wanted: impl FnMut(u32) -> bool,
    mut found: impl FnMut(u32, RawValue<'a>) -> Result<(), Error>,
) -> Result<(), Error> {
    let mut r = Reader { input, pos: 0 };
    if r.byte()? != FORMAT {
        return Err(Error::Corrupt("unknown row format"));
    }
    let count = r.varint()? as usize;
    for _ in 0..count {
        let id = u32::try_from(r.varint()?).map_err(|_| Error::Corrupt("column id"))?;
        let tag = r.byte()?;
        use crate::key::*;
        if !wanted(id) {
            match tag {
                TAG_BOOL => r.take(1)?,
                TAG_INT64 | TAG_TIMESTAMP | TAG_FLOAT64 => r.take(8)?,
                TAG_DATE => r.take(4)?,
                TAG_NUMERIC => r.take(16)?,
                TAG_STRING | TAG_JSON | TAG_BYTES => r.bytes()?,
                _ => return Err(Error::Corrupt("unknown row value tag")),
            };
            continue;
        }
        let text = |b: &'a [u8]| {
            std::str::from_utf8(b).map_err(|_| Error::Corrupt("row string not UTF-8"))
        };
        let v = match tag {
            TAG_BOOL => RawValue::Bool(r.byte()? != 0),
            TAG_INT64 => RawValue::Int64(i64::from_le_bytes(r.array()?)),
            TAG_TIMESTAMP => RawValue::Timestamp(i64::from_le_bytes(r.array()?)),
            TAG_FLOAT64 => RawValue::Float64(f64::from_bits(u64::from_le_bytes(r.array()?))),
            TAG_DATE => RawValue::Date(i32::from_le_bytes(r.array()?)),
            TAG_NUMERIC => RawValue::Numeric(i128::from_le_bytes(r.array()?)),
            TAG_STRING => RawValue::String(text(r.bytes()?)?),
            TAG_JSON => RawValue::Json(text(r.bytes()?)?),
            TAG_BYTES => RawValue::Bytes(r.bytes()?),
            _ => return Err(Error::Corrupt("unknown row value tag")),
        };
        found(id, v)?;
    }
    Ok(())
}

#[inline]
fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    // Column ids and short lengths: one byte.
    if v < 0x80 {
        out.push(v as u8);
        return;
    }
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

struct Reader<'a> {
    input: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn byte(&mut self) -> Result<u8, Error> {
        let b = *self
            .input
            .get(self.pos)
            .ok_or(Error::Corrupt("truncated row"))?;
        self.pos += 1;
        Ok(b)
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], Error> {
        let end = self
            .pos
            .checked_add(n)
            .ok_or(Error::Corrupt("truncated row"))?;
        let s = self
            .input
            .get(self.pos..end)
            .ok_or(Error::Corrupt("truncated row"))?;
        self.pos = end;
        Ok(s)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], Error> {
        self.take(N)?
            .try_into()
            .map_err(|_| Error::Corrupt("truncated row"))
    }
    /// A varint; one byte (ids and lengths below 128) is the common case.
    #[inline]
    fn varint(&mut self) -> Result<u64, Error> {
        match self.input.get(self.pos) {
            Some(&b) if b < 0x80 => {
                self.pos += 1;
                Ok(b as u64)
            }
            _ => self.long_varint(),
        }
    }
    fn long_varint(&mut self) -> Result<u64, Error> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            v |= ((b & 0x7F) as u64) << shift;
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err(Error::Corrupt("varint too long"))
    }
    fn bytes(&mut self) -> Result<&'a [u8], Error> {
        let n = usize::try_from(self.varint()?).map_err(|_| Error::Corrupt("length"))?;
        self.take(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn any_value() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<i64>().prop_map(Value::Int64),
            any::<f64>().prop_map(Value::Float64),
            any::<bool>().prop_map(Value::Bool),
            ".{0,8}".prop_map(Value::String),
            ".{0,8}".prop_map(Value::Json),
            proptest::collection::vec(any::<u8>(), 0..8).prop_map(Value::Bytes),
            any::<i32>().prop_map(Value::Date),
            any::<i64>().prop_map(Value::Timestamp),
            any::<i128>().prop_map(Value::Numeric),
        ]
    }

    proptest! {
        #[test]
        fn row_round_trip(cols in proptest::collection::vec((any::<u32>(), any_value()), 0..8)) {
            let refs: Vec<(u32, &Value)> = cols.iter().map(|(i, v)| (*i, v)).collect();
            let back = decode_row(&encode_row(&refs)).unwrap();
            let expected: Vec<(u32, Value)> = cols.iter().filter(|(_, v)| !v.is_null()).cloned().collect();
            prop_assert_eq!(back.len(), expected.len());
            for ((i, v), (j, w)) in back.iter().zip(&expected) {
                prop_assert_eq!(i, j);
                prop_assert_eq!(v.type_name(), w.type_name());
                prop_assert_eq!(v, w);
            }
        }

        /// Skipping columns gives exactly the wanted columns of a full
        /// decode, and a row truncated anywhere is an error either way.
        #[test]
        fn selective_decode_matches_the_full_decode(
            cols in proptest::collection::vec((0u32..16, any_value()), 0..8),
            mask in any::<u16>(),
            cut in any::<usize>(),
        ) {
            let refs: Vec<(u32, &Value)> = cols.iter().map(|(i, v)| (*i, v)).collect();
            let bytes = encode_row(&refs);
            let wanted = |id: u32| mask & (1 << id) != 0;
            let mut some = Vec::new();
            decode_row_with(&bytes, wanted, |id, v| some.push((id, v))).unwrap();
            let all: Vec<(u32, Value)> =
                decode_row(&bytes).unwrap().into_iter().filter(|(id, _)| wanted(*id)).collect();
            prop_assert_eq!(some, all);
            let short = &bytes[..cut % bytes.len()];
            let truncated = decode_row_with(short, wanted, |_, _| ());
            prop_assert!(truncated.is_err(), "{} of {} bytes decoded", short.len(), bytes.len());
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64), mask in any::<u16>()) {
            let _ = decode_row(&bytes);
            let _ = decode_row_with(&bytes, |id| mask & (1 << (id % 16)) != 0, |_, _| {});
        }
    }
}
