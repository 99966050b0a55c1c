//! # spindle-keys: values, key encoding and row encoding
//!
//! The bottom layer of Spindle. It knows nothing of tables or storage; it
//! turns typed values into bytes and back:
//!
//! * [`value`]: [`Value`] and [`DataType`], the value model of every layer
//!   below SQL.
//! * [`key`]: the order-preserving key codec and the physical layout of row
//!   keys, including interleaving (a child row's key extends its parent's).
//! * [`row`]: the encoding of a row's non-key columns.
//!
//! Invariants, each checked by property tests:
//! 1. For keys of one table, `memcmp` order of encoded keys equals the
//!    value order (NULL first ascending, DESC columns reversed).
//! 2. `decode(encode(x)) == x`, bit-exactly (FLOAT64 -0.0 and NaN included).
//! 3. Every descendant row's key has its root row's key as a prefix, so a
//!    row tree is one contiguous key range.

pub mod key;
pub mod row;
pub mod value;

pub use key::{Direction, KeyLevel};
pub use value::{DataType, Value};

/// Errors of the codec. `Corrupt` means stored bytes could not be decoded
/// (an internal error); the others are the caller's invalid input.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum Error {
    #[error("corrupt encoding: {0}")]
    Corrupt(&'static str),
    #[error("{0} values cannot be part of a key")]
    NotKeyable(&'static str),
    #[error("key is {0} bytes; the limit is 8192 bytes")]
    KeyTooLarge(usize),
}
