//! # A table's row codec: full rows to storage keys and values
//!
//! [`Catalog::encode_key`] finds a table's ancestry by name and builds the
//! key's levels on every call; a statement that writes many rows of one
//! table (a prepared INSERT run 10 000 times in a bulk load) would redo
//! that per row. A [`RowCodec`] works the layout out once, from the
//! catalog the statement was planned against, and then encodes a row
//! given as all its columns in table order (`full`, as the SQL layer holds
//! it) straight into its key and value bytes:
//!
//! ```text
//!   full:   [ c0  c1  c2  c3 ]          table order; key columns c2, c0
//!   key:    20 [root id] enc(c2, dir) 20 [child id] enc(c0, dir)   (levels as in spindle_keys::key)
//!   value:  spindle_keys::row of (id, value) for c1, c3 (non-key columns; NULLs omitted)
//! ```
//!
//! Invariant: a codec describes one catalog version. Whoever keeps one
//! (a cached plan) drops it when the schema changes, as it does the plan.

use std::borrow::Borrow;

use spindle_keys::{key, row, Direction, Value};

use crate::{Catalog, KeyError, Result, Table};

/// A table's key and value layout (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct RowCodec {
    /// Per ancestry level, root first: the table id and the end (in
    /// `key_idx`) of the key columns the level adds.
    levels: Vec<(u32, usize)>,
    /// Position in `full` of each key column, in key order.
    key_idx: Vec<usize>,
    /// Direction of each key column, in key order.
    directions: Vec<Direction>,
    /// Column id and position in `full` of each non-key column.
    value_cols: Vec<(u32, usize)>,
}

impl RowCodec {
    /// The codec of `table` (its ancestors looked up in `catalog`).
    pub fn new(catalog: &Catalog, table: &Table) -> Result<RowCodec> {
        let chain = catalog.ancestry(&table.name)?;
        let mut levels = Vec::with_capacity(chain.len());
        for t in &chain {
            levels.push((t.id, t.primary_key.len()));
        }
        let key_idx = table.key_indices();
        if key_idx.len() != table.primary_key.len() {
            return Err(crate::Error::InvalidDefinition(format!(
                "table {} names a key column it does not have",
                table.name
            )));
        }
        let value_cols = table
            .columns
            .iter()
            .enumerate()
            .filter(|(_, c)| !table.is_key_column(&c.name))
            .map(|(i, c)| (c.id, i))
            .collect();
        Ok(RowCodec {
            levels,
            directions: table.primary_key.iter().map(|k| k.direction).collect(),
            key_idx,
            value_cols,
        })
    }

    /// Position in the row of each key column, in key order.
    pub fn key_idx(&self) -> &[usize] {
        &self.key_idx
    }

    /// The storage key of the row `full` (all columns, table order, owned
    /// or borrowed: a prepared INSERT's row borrows its parameters); the
    /// same bytes as [`Catalog::encode_key`] of its key values.
    pub fn encode_key<V: Borrow<Value>>(
        &self,
        full: &[V],
    ) -> std::result::Result<Vec<u8>, KeyError> {
        self.encode_key_with(|pos| {
            let i = self.key_idx[pos];
            full.get(i).map(Borrow::borrow).ok_or_else(|| {
                KeyError::Catalog(crate::Error::InvalidDefinition(format!(
                    "a row of {} columns has no column {i}",
                    full.len()
                )))
            })
        })
    }

    /// The storage key of the row whose key values (in key order) are
    /// `key`: [`Catalog::encode_key`] without looking up the table's
    /// ancestry (a point read by a prepared statement's key).
    pub fn encode_key_of(&self, key: &[Value]) -> std::result::Result<Vec<u8>, KeyError> {
        self.encode_key_with(|pos| {
            key.get(pos).ok_or_else(|| {
                KeyError::Catalog(crate::Error::InvalidDefinition(format!(
                    "a key of {} values has no value {pos}",
                    key.len()
                )))
            })
        })
    }

    /// The key from the value of each key column (`value(pos)`, by its
    /// position in key order).
    fn encode_key_with<'v>(
        &self,
        value: impl Fn(usize) -> std::result::Result<&'v Value, KeyError>,
    ) -> std::result::Result<Vec<u8>, KeyError> {
        let mut out = Vec::with_capacity(32);
        let mut start = 0;
        for &(table_id, end) in &self.levels {
            key::encode_table_prefix(&mut out, table_id);
            for (pos, dir) in (start..end).zip(&self.directions[start..end]) {
                key::encode_value(&mut out, value(pos)?, *dir)?;
            }
            start = end;
        }
        if out.len() > key::MAX_KEY_BYTES {
            return Err(spindle_keys::Error::KeyTooLarge(out.len()).into());
        }
        Ok(out)
    }

    /// The stored value of the row `full`: its non-key columns.
    pub fn encode_value<V: Borrow<Value>>(&self, full: &[V]) -> Vec<u8> {
        row::encode_row_iter(
            self.value_cols
                .iter()
                .filter_map(|&(id, i)| full.get(i).map(|v| (id, v.borrow()))),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::col;
    use crate::{Interleave, InterleaveKind, KeyColumn, OnDelete, TableDef};
    use spindle_keys::DataType;

    /// A root whose key columns are not its first ones (one descending)
    /// and a child interleaved in it with a value column between keys.
    fn catalog() -> Catalog {
        let mut c = Catalog::new();
        c.create_table(TableDef {
            name: "p".into(),
            columns: vec![
                col("note", DataType::String(None)),
                col("b", DataType::String(None)),
                col("a", DataType::Int64),
            ],
            primary_key: vec![
                KeyColumn {
                    name: "a".into(),
                    direction: Direction::Asc,
                },
                KeyColumn {
                    name: "b".into(),
                    direction: Direction::Desc,
                },
            ],
            interleave: None,
        })
        .unwrap();
        c.create_table(TableDef {
            name: "c".into(),
            columns: vec![
                col("a", DataType::Int64),
                col("v", DataType::Int64),
                col("b", DataType::String(None)),
                col("id", DataType::Int64),
                col("w", DataType::String(None)),
            ],
            primary_key: ["a", "b", "id"]
                .iter()
                .map(|n| KeyColumn {
                    name: n.to_string(),
                    direction: if *n == "b" {
                        Direction::Desc
                    } else {
                        Direction::Asc
                    },
                })
                .collect(),
            interleave: Some(Interleave {
                parent: "p".into(),
                kind: InterleaveKind::InParent,
                on_delete: OnDelete::Cascade,
            }),
        })
        .unwrap();
        c
    }

    #[test]
    fn keys_and_values_match_the_catalog_encoding() {
        let c = catalog();
        for name in ["p", "c"] {
            let t = c.get_table(name).unwrap();
            let codec = RowCodec::new(&c, t).unwrap();
            for nulls in [false, true] {
                // Distinct values per column; with `nulls`, the value
                // columns are NULL (omitted from the stored value).
                let full: Vec<Value> = t
                    .columns
                    .iter()
                    .enumerate()
                    .map(|(i, col)| match col.data_type {
                        _ if nulls && !t.is_key_column(&col.name) => Value::Null,
                        DataType::Int64 => Value::Int64(10 + i as i64),
                        _ => Value::String(format!("v{i}")),
                    })
                    .collect();
                let kv: Vec<Value> = t.key_indices().iter().map(|i| full[*i].clone()).collect();
                assert_eq!(
                    codec.encode_key(&full).unwrap(),
                    c.encode_key(name, &kv).unwrap(),
                    "{name}"
                );
                assert_eq!(
                    codec.encode_key_of(&kv).unwrap(),
                    c.encode_key(name, &kv).unwrap(),
                    "{name}: from the key values alone"
                );
                let cols: Vec<(u32, &Value)> = t
                    .columns
                    .iter()
                    .zip(&full)
                    .filter(|(col, _)| !t.is_key_column(&col.name))
                    .map(|(col, v)| (col.id, v))
                    .collect();
                assert_eq!(codec.encode_value(&full), row::encode_row(&cols), "{name}");
            }
        }
    }

    #[test]
    fn a_short_row_or_a_long_key_is_an_error_not_a_panic() {
        let c = catalog();
        let t = c.get_table("c").unwrap();
        let codec = RowCodec::new(&c, t).unwrap();
        assert!(codec.encode_key(&[Value::Int64(1)]).is_err());
        assert!(codec.encode_key_of(&[Value::Int64(1)]).is_err());
        let big = Value::String("x".repeat(key::MAX_KEY_BYTES));
        let full = [
            Value::Int64(1),
            Value::Null,
            big,
            Value::Int64(2),
            Value::Null,
        ];
        assert!(matches!(
            codec.encode_key(&full),
            Err(KeyError::Key(spindle_keys::Error::KeyTooLarge(_)))
        ));
    }
}
