//! Order-preserving key encoding and the physical key layout of rows.
//!
//! # Values
//!
//! Every key value is encoded as a tag byte followed by a payload, so that
//! comparing the encoded bytes with `memcmp` gives the same order as
//! comparing the values, and so that a value can be skipped without knowing
//! its type (the tag says how long it is):
//!
//! ```text
//!   NULL       01
//!   BOOL       10 00|01
//!   INT64      11 [8 bytes big-endian, sign bit flipped]
//!   FLOAT64    12 [8 bytes: bits ^ 0x8000.. if positive, !bits if negative]
//!   STRING     13 [bytes, 00 escaped as 00 FF] 00 01
//!   BYTES      14 [bytes, 00 escaped as 00 FF] 00 01
//!   DATE       15 [4 bytes big-endian, sign bit flipped]
//!   TIMESTAMP  16 [8 bytes big-endian, sign bit flipped]
//!   NUMERIC    17 [16 bytes big-endian, sign bit flipped]
//! ```
//!
//! NULL's tag is lower than every other tag, so NULL sorts first in an
//! ascending column. Each encoding is prefix-free (fixed width, or
//! escaped and terminated), so a DESC column is encoded by inverting every
//! byte of its ascending encoding: inverting the bytes of a prefix-free code
//! reverses its order. Ascending tags are all below 0x80 and inverted ones
//! all above, so a decoder knows a value's direction from its first byte.
//! JSON cannot be part of a key.
//!
//! # Row keys and interleaving
//!
//! A table's row key is the table marker, the table id, and the encoded
//! primary-key values. A child table interleaved in a parent stores its rows
//! under the parent's row key: the parent's key, then the child's marker and
//! id, then the child's remaining key columns:
//!
//! ```text
//!   Singers(SingerId)            20 [table id u32] [SingerId]
//!   Albums(SingerId, AlbumId)    20 [Singers id] [SingerId] 20 [Albums id] [AlbumId]
//!   Songs(SingerId, AlbumId, T)  20 [Singers id] [SingerId] 20 [Albums id] [AlbumId] 20 [Songs id] [T]
//! ```
//!
//! So every descendant of a root row has the root row's key as a prefix, and
//! a root row with all its descendants (its *row tree*) is one contiguous key
//! range: `[root key, prefix_end(root key))`. Within a tree, a row sorts
//! before its children, and children of one table are contiguous.
//!
//! The storage layer appends a version suffix `00 [timestamp]` after a
//! logical key. `00` is lower than the table marker, so all versions of a row
//! sort before its children. Because values are self-delimiting,
//! [`root_key_len`] finds the root row's key inside any row key given only
//! the root table's key-column count — no read of the store needed. This is
//! what lets splits cut only between row trees.

use crate::value::Value;
use crate::Error;

pub(crate) const TAG_NULL: u8 = 0x01;
pub(crate) const TAG_BOOL: u8 = 0x10;
pub(crate) const TAG_INT64: u8 = 0x11;
pub(crate) const TAG_FLOAT64: u8 = 0x12;
pub(crate) const TAG_STRING: u8 = 0x13;
pub(crate) const TAG_BYTES: u8 = 0x14;
pub(crate) const TAG_DATE: u8 = 0x15;
pub(crate) const TAG_TIMESTAMP: u8 = 0x16;
pub(crate) const TAG_NUMERIC: u8 = 0x17;
pub(crate) const TAG_JSON: u8 = 0x18;

/// Marks the start of a table's part of a row key (root or interleaved).
pub const TABLE_MARKER: u8 = 0x20;

/// Largest encoded row key accepted.
pub const MAX_KEY_BYTES: usize = 8 * 1024;

/// Sort direction of one key column.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Direction {
    Asc,
    Desc,
}

/// Appends the order-preserving encoding of `v` to `out`.
pub fn encode_value(out: &mut Vec<u8>, v: &Value, dir: Direction) -> Result<(), Error> {
    let start = out.len();
    match v {
        Value::Null => out.push(TAG_NULL),
        Value::Bool(b) => {
            out.push(TAG_BOOL);
            out.push(*b as u8);
        }
        Value::Int64(i) => {
            out.push(TAG_INT64);
            out.extend_from_slice(&((*i as u64) ^ (1 << 63)).to_be_bytes());
        }
        Value::Float64(f) => {
            out.push(TAG_FLOAT64);
            let bits = f.to_bits();
            let enc = if bits >> 63 == 1 {
                !bits
            } else {
                bits ^ (1 << 63)
            };
            out.extend_from_slice(&enc.to_be_bytes());
        }
        Value::String(s) => {
            out.push(TAG_STRING);
            escape(out, s.as_bytes());
        }
        Value::Bytes(b) => {
            out.push(TAG_BYTES);
            escape(out, b);
        }
        Value::Date(d) => {
            out.push(TAG_DATE);
            out.extend_from_slice(&((*d as u32) ^ (1 << 31)).to_be_bytes());
        }
        Value::Timestamp(t) => {
            out.push(TAG_TIMESTAMP);
            out.extend_from_slice(&((*t as u64) ^ (1 << 63)).to_be_bytes());
        }
        Value::Numeric(n) => {
            out.push(TAG_NUMERIC);
            out.extend_from_slice(&((*n as u128) ^ (1 << 127)).to_be_bytes());
        }
        Value::Json(_) => return Err(Error::NotKeyable("JSON")),
    }
    if dir == Direction::Desc {
        for b in &mut out[start..] {
            *b = !*b;
        }
    }
    Ok(())
}

fn escape(out: &mut Vec<u8>, bytes: &[u8]) {
    for &b in bytes {
        out.push(b);
        if b == 0 {
            out.push(0xFF);
        }
    }
    out.extend_from_slice(&[0x00, 0x01]);
}

/// Decodes one value from the front of `input`, returning it and the number
/// of bytes consumed.
pub fn decode_value(input: &[u8]) -> Result<(Value, usize), Error> {
    let first = *input.first().ok_or(Error::Corrupt("empty key value"))?;
    let desc = first >= 0x80;
    let get = |i: usize| -> Result<u8, Error> {
        let b = *input.get(i).ok_or(Error::Corrupt("truncated key value"))?;
        Ok(if desc { !b } else { b })
    };
    let tag = get(0)?;
    let (v, len) = match tag {
        TAG_NULL => (Value::Null, 1),
        TAG_BOOL => (Value::Bool(get(1)? != 0), 2),
        TAG_INT64 => {
            let u = u64::from_be_bytes(fixed(input, desc)?);
            (Value::Int64((u ^ (1 << 63)) as i64), 9)
        }
        TAG_FLOAT64 => {
            let u = u64::from_be_bytes(fixed(input, desc)?);
            let bits = if u >> 63 == 1 { u ^ (1 << 63) } else { !u };
            (Value::Float64(f64::from_bits(bits)), 9)
        }
        TAG_STRING | TAG_BYTES => {
            // The common case, ascending without escapes: one copy.
            let body = &input[1..];
            let (bytes, len) = match (desc, body.iter().position(|b| *b == 0)) {
                (false, Some(z)) if body.get(z + 1) == Some(&0x01) => (body[..z].to_vec(), z + 3),
                _ => decode_escaped(&get)?,
            };
            let v = if tag == TAG_STRING {
                Value::String(
                    String::from_utf8(bytes).map_err(|_| Error::Corrupt("key string not UTF-8"))?,
                )
            } else {
                Value::Bytes(bytes)
            };
            (v, len)
        }
        TAG_DATE => {
            let u = u32::from_be_bytes(fixed(input, desc)?);
            (Value::Date((u ^ (1 << 31)) as i32), 5)
        }
        TAG_TIMESTAMP => {
            let u = u64::from_be_bytes(fixed(input, desc)?);
            (Value::Timestamp((u ^ (1 << 63)) as i64), 9)
        }
        TAG_NUMERIC => {
            let u = u128::from_be_bytes(fixed(input, desc)?);
            (Value::Numeric((u ^ (1 << 127)) as i128), 17)
        }
        _ => return Err(Error::Corrupt("unknown key value tag")),
    };
    Ok((v, len))
}

/// The `N` payload bytes after a value's tag, un-inverted for DESC.
fn fixed<const N: usize>(input: &[u8], desc: bool) -> Result<[u8; N], Error> {
    let mut b: [u8; N] = arr(input
        .get(1..=N)
        .ok_or(Error::Corrupt("truncated key value"))?)?;
    if desc {
        for x in &mut b {
            *x = !*x;
        }
    }
    Ok(b)
}

/// An escaped string or bytes payload (after the tag), read byte by byte
/// through `get` (which un-inverts DESC bytes): the bytes and the encoded
/// length including tag and terminator.
fn decode_escaped(get: &dyn Fn(usize) -> Result<u8, Error>) -> Result<(Vec<u8>, usize), Error> {
    let mut bytes = Vec::new();
    let mut i = 1;
    loop {
        let b = get(i)?;
        if b == 0 {
            match get(i + 1)? {
                0xFF => bytes.push(0),
                0x01 => break,
                _ => return Err(Error::Corrupt("bad escape in key string")),
            }
            i += 2;
        } else {
            bytes.push(b);
            i += 1;
        }
    }
    Ok((bytes, i + 2))
}

fn arr<const N: usize>(b: &[u8]) -> Result<[u8; N], Error> {
    b.try_into()
        .map_err(|_| Error::Corrupt("truncated key value"))
}

/// Appends a table's marker and id.
pub fn encode_table_prefix(out: &mut Vec<u8>, table_id: u32) {
    out.push(TABLE_MARKER);
    out.extend_from_slice(&table_id.to_be_bytes());
}

/// One level of a row key: a table and the key values that table adds
/// (a root table: all its key columns; a child: the columns after its
/// parent's).
#[derive(Clone, Debug, PartialEq)]
pub struct KeyLevel<'a> {
    pub table_id: u32,
    pub values: &'a [Value],
    pub directions: &'a [Direction],
}

/// Encodes a full row key from its levels, root first.
pub fn encode_row_key(levels: &[KeyLevel<'_>]) -> Result<Vec<u8>, Error> {
    let mut out = Vec::with_capacity(32);
    for level in levels {
        encode_table_prefix(&mut out, level.table_id);
        for (v, d) in level.values.iter().zip(level.directions) {
            encode_value(&mut out, v, *d)?;
        }
    }
    if out.len() > MAX_KEY_BYTES {
        return Err(Error::KeyTooLarge(out.len()));
    }
    Ok(out)
}

/// Decodes `count` values from `input` at `*pos`, advancing `pos`.
pub fn decode_values(input: &[u8], pos: &mut usize, count: usize) -> Result<Vec<Value>, Error> {
    let mut vals = Vec::with_capacity(count);
    for _ in 0..count {
        let (v, n) = decode_value(&input[*pos..])?;
        *pos += n;
        vals.push(v);
    }
    Ok(vals)
}

/// Reads a table marker and id at `*pos`, advancing `pos`.
pub fn decode_table_prefix(input: &[u8], pos: &mut usize) -> Result<u32, Error> {
    if input.get(*pos) != Some(&TABLE_MARKER) || input.len() < *pos + 5 {
        return Err(Error::Corrupt("expected a table marker"));
    }
    let id = u32::from_be_bytes(arr(&input[*pos + 1..*pos + 5])?);
    *pos += 5;
    Ok(id)
}

/// Skips one encoded value, returning its length, without decoding it.
pub fn value_len(input: &[u8]) -> Result<usize, Error> {
    let first = *input.first().ok_or(Error::Corrupt("empty key value"))?;
    let desc = first >= 0x80;
    let tag = if desc { !first } else { first };
    let fixed = match tag {
        TAG_NULL => 1,
        TAG_BOOL => 2,
        TAG_INT64 | TAG_FLOAT64 | TAG_TIMESTAMP => 9,
        TAG_DATE => 5,
        TAG_NUMERIC => 17,
        TAG_STRING | TAG_BYTES => {
            let (zero, one, esc) = if desc {
                (0xFF, 0xFE, 0x00)
            } else {
                (0x00, 0x01, 0xFF)
            };
            let mut i = 1;
            loop {
                match input.get(i) {
                    Some(&b) if b == zero => match input.get(i + 1) {
                        Some(&n) if n == one => return Ok(i + 2),
                        Some(&n) if n == esc => i += 2,
                        _ => return Err(Error::Corrupt("bad escape in key string")),
                    },
                    Some(_) => i += 1,
                    None => return Err(Error::Corrupt("truncated key string")),
                }
            }
        }
        _ => return Err(Error::Corrupt("unknown key value tag")),
    };
    if input.len() < fixed {
        return Err(Error::Corrupt("truncated key value"));
    }
    Ok(fixed)
}

/// Length of the root row's key at the front of any row key, given the
/// root table's number of key columns: the marker, the id and that many
/// values. Splits cut only at such prefixes.
pub fn root_key_len(key: &[u8], root_key_columns: usize) -> Result<usize, Error> {
    let mut pos = 0;
    decode_table_prefix(key, &mut pos)?;
    for _ in 0..root_key_columns {
        pos += value_len(&key[pos..])?;
    }
    Ok(pos)
}

/// The table id of the root table a row key belongs to.
pub fn root_table_id(key: &[u8]) -> Result<u32, Error> {
    decode_table_prefix(key, &mut 0)
}

/// The smallest key greater than every key that starts with `prefix`
/// (`None` if there is none, i.e. the prefix is all 0xFF).
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = Vec::with_capacity(prefix.len());
    prefix_end_into(prefix, &mut end).then_some(end)
}

/// [`prefix_end`] written into `out` (cleared first, its allocation
/// reused); false if there is none.
pub fn prefix_end_into(prefix: &[u8], out: &mut Vec<u8>) -> bool {
    out.clear();
    out.extend_from_slice(prefix);
    while let Some(last) = out.pop() {
        if last < 0xFF {
            out.push(last + 1);
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn enc(vals: &[Value], dirs: &[Direction]) -> Vec<u8> {
        let mut out = Vec::new();
        for (v, d) in vals.iter().zip(dirs) {
            encode_value(&mut out, v, *d).unwrap();
        }
        out
    }

    /// Values of one column type (NULL included), so composite keys are
    /// well typed column by column like real keys.
    fn value_of(kind: u8) -> BoxedStrategy<Value> {
        let non_null: BoxedStrategy<Value> = match kind {
            0 => any::<i64>().prop_map(Value::Int64).boxed(),
            1 => any::<f64>().prop_map(Value::Float64).boxed(),
            2 => prop_oneof![
                Just(Value::Float64(0.0)),
                Just(Value::Float64(-0.0)),
                Just(Value::Float64(f64::NAN)),
                Just(Value::Float64(-f64::NAN)),
                Just(Value::Float64(f64::INFINITY)),
                Just(Value::Float64(f64::NEG_INFINITY)),
                Just(Value::Float64(f64::MIN_POSITIVE)),
            ]
            .boxed(),
            3 => any::<bool>().prop_map(Value::Bool).boxed(),
            4 => ".{0,6}".prop_map(Value::String).boxed(),
            5 => proptest::collection::vec(
                prop_oneof![Just(0u8), Just(1u8), Just(0xFFu8), any::<u8>()],
                0..6,
            )
            .prop_map(Value::Bytes)
            .boxed(),
            6 => any::<i32>().prop_map(Value::Date).boxed(),
            7 => any::<i64>().prop_map(Value::Timestamp).boxed(),
            _ => (-crate::value::NUMERIC_MAX_SCALED..=crate::value::NUMERIC_MAX_SCALED)
                .prop_map(Value::Numeric)
                .boxed(),
        };
        prop_oneof![1 => Just(Value::Null), 6 => non_null].boxed()
    }

    /// A schema (kind and direction per column) and two rows of it.
    fn two_rows() -> impl Strategy<Value = (Vec<Direction>, Vec<Value>, Vec<Value>)> {
        proptest::collection::vec((0u8..9, any::<bool>()), 1..5).prop_flat_map(|cols| {
            let dirs: Vec<Direction> = cols
                .iter()
                .map(|(_, d)| if *d { Direction::Desc } else { Direction::Asc })
                .collect();
            let row = cols.iter().map(|(k, _)| value_of(*k)).collect::<Vec<_>>();
            (Just(dirs), row.clone(), row)
        })
    }

    fn cmp_rows(a: &[Value], b: &[Value], dirs: &[Direction]) -> std::cmp::Ordering {
        for ((x, y), d) in a.iter().zip(b).zip(dirs) {
            let o = x.key_cmp(y);
            let o = if *d == Direction::Desc {
                o.reverse()
            } else {
                o
            };
            if o != std::cmp::Ordering::Equal {
                return o;
            }
        }
        std::cmp::Ordering::Equal
    }

    proptest! {
        #[test]
        fn composite_byte_order_equals_value_order((dirs, a, b) in two_rows()) {
            let ea = enc(&a, &dirs);
            let eb = enc(&b, &dirs);
            prop_assert_eq!(ea.cmp(&eb), cmp_rows(&a, &b, &dirs));
        }

        #[test]
        fn decode_inverts_encode((dirs, a, _b) in two_rows()) {
            let e = enc(&a, &dirs);
            let mut pos = 0;
            let back = decode_values(&e, &mut pos, a.len()).unwrap();
            prop_assert_eq!(pos, e.len());
            for (x, y) in a.iter().zip(&back) {
                // Bit-exact, including NaN payloads and -0.0.
                if let (Value::Float64(p), Value::Float64(q)) = (x, y) {
                    prop_assert_eq!(p.to_bits(), q.to_bits());
                } else {
                    prop_assert_eq!(x, y);
                }
            }
            // value_len agrees with the decoder.
            let mut p = 0;
            for _ in 0..a.len() { p += value_len(&e[p..]).unwrap(); }
            prop_assert_eq!(p, e.len());
        }

        #[test]
        fn row_trees_are_contiguous(
            (dirs, parent, other) in two_rows(),
            child_vals in proptest::collection::vec(any::<i64>(), 1..3),
        ) {
            // A child's key lies inside its parent's row-tree range, and a
            // different root row's key lies outside it.
            let cdirs = vec![Direction::Asc; child_vals.len()];
            let cvals: Vec<Value> = child_vals.into_iter().map(Value::Int64).collect();
            let root = encode_row_key(&[KeyLevel { table_id: 7, values: &parent, directions: &dirs }]).unwrap();
            let child = encode_row_key(&[
                KeyLevel { table_id: 7, values: &parent, directions: &dirs },
                KeyLevel { table_id: 9, values: &cvals, directions: &cdirs },
            ]).unwrap();
            let end = prefix_end(&root).unwrap();
            prop_assert!(root < child && child < end);
            prop_assert_eq!(root_key_len(&child, parent.len()).unwrap(), root.len());
            let other_key = encode_row_key(&[KeyLevel { table_id: 7, values: &other, directions: &dirs }]).unwrap();
            if cmp_rows(&parent, &other, &dirs) != std::cmp::Ordering::Equal {
                prop_assert!(other_key < root || other_key >= end);
            }
            // The MVCC version separator sorts before any child.
            let mut versioned = root.clone();
            versioned.push(0x00);
            versioned.extend_from_slice(&u64::MAX.to_be_bytes());
            prop_assert!(versioned < child);
        }
    }

    #[test]
    fn null_first_ascending_last_descending() {
        let a = enc(&[Value::Null], &[Direction::Asc]);
        let b = enc(&[Value::Int64(i64::MIN)], &[Direction::Asc]);
        assert!(a < b);
        let a = enc(&[Value::Null], &[Direction::Desc]);
        let b = enc(&[Value::Int64(i64::MIN)], &[Direction::Desc]);
        assert!(a > b);
    }

    #[test]
    fn json_is_not_keyable() {
        let mut out = Vec::new();
        assert!(encode_value(&mut out, &Value::Json("{}".into()), Direction::Asc).is_err());
    }

    #[test]
    fn oversized_key_is_refused() {
        let big = Value::String("x".repeat(MAX_KEY_BYTES));
        let err = encode_row_key(&[KeyLevel {
            table_id: 1,
            values: &[big],
            directions: &[Direction::Asc],
        }]);
        assert!(matches!(err, Err(Error::KeyTooLarge(_))));
    }

    #[test]
    fn corrupt_input_is_an_error_not_a_panic() {
        for bad in [
            &[][..],
            &[0x11, 1, 2][..],
            &[0x13, b'a'][..],
            &[0x13, 0, 7][..],
            &[0x55][..],
        ] {
            assert!(decode_value(bad).is_err());
            assert!(value_len(bad).is_err());
        }
    }
}
