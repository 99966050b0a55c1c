//! Secondary index maintenance: entries change in the same transaction as
//! the rows they index.
//!
//! Every row write goes through [`maintain`] with the row's old and new
//! values (either may be absent), so INSERT, UPDATE, upserts, DELETE and
//! cascading deletes all keep every index of the table in step:
//!
//! ```text
//!   old row ─► old entry key ─┐  differs from the new key? delete it
//!   new row ─► new entry key ─┴► (UNIQUE: no other entry with the same
//!                                 indexed values) put key ─► STORING values
//! ```
//!
//! Entry layout: see `spindle_catalog` ("Index entries"). An index is
//! described by a table chain whose last element is a virtual table
//! ([`Catalog::index_chain`]), so entries are encoded, decoded and scanned
//! with the same code as rows.
//!
//! ## Invariants
//!
//! * A row has exactly one entry in each index, except that a row with a
//!   NULL in an indexed column has none in a NULL_FILTERED index.
//! * UNIQUE: no two entries share their indexed values. NULL is a value
//!   like any other here (Spanner's rule), so two rows with NULL in a
//!   UNIQUE index's column conflict — unless the index is NULL_FILTERED,
//!   where such rows have no entry at all.
//! * The uniqueness check reads the entry range of the new values through
//!   the transaction, so it joins the read set: two concurrent inserts of
//!   the same value cannot both commit.

use spindle_catalog::{Catalog, Index, Table};
use spindle_keys::key::prefix_end;
use spindle_keys::{row, Value};
use spindle_txn::Transaction;

use crate::error::{Error, Result};
use crate::types::value_to_text;

/// An index with its key layout resolved for one catalog.
#[derive(Debug)]
pub(crate) struct IndexPlan {
    pub index: Index,
    /// Root first; the last table is the index's virtual table.
    pub chain: Vec<Table>,
    /// For each virtual-table column, its position in the base table.
    base_positions: Vec<usize>,
}

impl IndexPlan {
    pub fn new(catalog: &Catalog, index: &Index) -> Result<IndexPlan> {
        let chain = catalog.index_chain(index)?;
        let table = catalog.get_table(&index.table)?;
        let vt = chain
            .last()
            .ok_or_else(|| Error::Internal("empty index chain".into()))?;
        let base_positions = vt
            .columns
            .iter()
            .map(|c| {
                table.column_index(&c.name).ok_or_else(|| {
                    Error::Internal(format!("index column {} not in {}", c.name, table.name))
                })
            })
            .collect::<Result<_>>()?;
        Ok(IndexPlan {
            index: index.clone(),
            chain,
            base_positions,
        })
    }

    /// All index plans of `table`.
    pub fn for_table(catalog: &Catalog, table: &str) -> Result<Vec<IndexPlan>> {
        catalog
            .table_indexes(table)
            .into_iter()
            .map(|ix| IndexPlan::new(catalog, ix))
            .collect()
    }

    pub fn virtual_table(&self) -> &Table {
        // `IndexPlan::new` checked the chain is not empty.
        &self.chain[self.chain.len() - 1]
    }

    fn chain_refs(&self) -> Vec<&Table> {
        self.chain.iter().collect()
    }

    /// The entry of a base row (values in the base table's column order),
    /// or `None` when a NULL_FILTERED index leaves the row out.
    pub fn entry(&self, row: &[Value]) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        let vt = self.virtual_table();
        let nkey = vt.primary_key.len();
        if self.index.null_filtered
            && self.base_positions[..self.index.columns.len()]
                .iter()
                .any(|p| row[*p].is_null())
        {
            return Ok(None);
        }
        let key = self.entry_key(row)?;
        let stored: Vec<(u32, &Value)> = vt.columns[nkey..]
            .iter()
            .zip(&self.base_positions[nkey..])
            .map(|(c, p)| (c.id, &row[*p]))
            .collect();
        Ok(Some((key, row::encode_row(&stored))))
    }

    /// The key of a base row's entry (whether or not a NULL_FILTERED index
    /// has one).
    fn entry_key(&self, row: &[Value]) -> Result<Vec<u8>> {
        let nkey = self.virtual_table().primary_key.len();
        let key_vals: Vec<Value> = self.base_positions[..nkey]
            .iter()
            .map(|p| row[*p].clone())
            .collect();
        self.encode(&key_vals, true)
    }

    /// Encodes a prefix of the index key (`descend` as in
    /// [`Catalog::encode_key_prefix`]).
    pub fn encode(&self, values: &[Value], descend: bool) -> Result<Vec<u8>> {
        Catalog::new()
            .encode_key_prefix(&self.chain_refs(), values, descend)
            .map_err(Error::from)
    }

    /// The key range of all entries with the row's indexed values.
    fn unique_range(&self, row: &[Value]) -> Result<(Vec<u8>, Option<Vec<u8>>)> {
        let n = self.index.columns.len();
        let vals: Vec<Value> = self.base_positions[..n]
            .iter()
            .map(|p| row[*p].clone())
            .collect();
        let start = self.encode(&vals, true)?;
        let end = prefix_end(&start);
        Ok((start, end))
    }

    fn unique_error(&self, row: &[Value]) -> Error {
        let n = self.index.columns.len();
        let names: Vec<&str> = self.index.columns.iter().map(|c| c.name.as_str()).collect();
        let vals: Vec<String> = self.base_positions[..n]
            .iter()
            .map(|p| value_to_text(&row[*p]).unwrap_or_else(|| "NULL".into()))
            .collect();
        Error::UniqueViolation(format!(
            "duplicate key value violates unique constraint \"{}\": Key ({})=({}) already exists",
            self.index.name,
            names.join(", "),
            vals.join(", ")
        ))
    }

    /// Every key in the store that is an entry of this index.
    pub fn all_entries(&self, txn: &Transaction) -> Result<Vec<Vec<u8>>> {
        let mut prefix = Vec::new();
        spindle_keys::key::encode_table_prefix(&mut prefix, self.chain[0].id);
        let end = prefix_end(&prefix);
        let chain = self.chain_refs();
        let mut keys = Vec::new();
        for item in txn.scan(&prefix, end.as_deref()) {
            let (k, _) = item?;
            if self.chain.len() == 1 || Catalog::decode_key(&chain, &k)?.is_some() {
                keys.push(k);
            }
        }
        Ok(keys)
    }
}

/// Brings every index of `table` from the row's `old` values to its `new`
/// ones (each in the table's column order; `None` for an insert or a
/// delete).
/// `pending` says the new row holds the commit-timestamp placeholder, so
/// its entries do too (see `Transaction::put_pending`). `value` is the new
/// row's stored value: a row copy's entry is the row's key under the
/// copy's id with that same value (the non-key columns, encoded alike),
/// so it is neither encoded again nor compared as entries.
pub(crate) fn maintain(
    txn: &mut Transaction,
    plans: &[IndexPlan],
    old: Option<&[Value]>,
    new: Option<(&[Value], &[u8])>,
    pending: bool,
) -> Result<()> {
    let (new, value) = match new {
        Some((row, value)) => (Some(row), Some(value)),
        None => (None, None),
    };
    for plan in plans {
        if plan.index.row_copy {
            // The key never changes (a row's key columns cannot be
            // updated): only whether the row did.
            match (new, value) {
                (Some(row), Some(v)) if old != Some(row) => {
                    let k = plan.entry_key(row)?;
                    if pending {
                        txn.put_pending(k, v.to_vec());
                    } else {
                        txn.put(k, v.to_vec());
                    }
                }
                (None, _) => {
                    if let Some(r) = old {
                        txn.delete(plan.entry_key(r)?);
                    }
                }
                _ => {}
            }
            continue;
        }
        let old_entry = match old {
            Some(r) => plan.entry(r)?,
            None => None,
        };
        let new_entry = match new {
            Some(r) => plan.entry(r)?,
            None => None,
        };
        if old_entry == new_entry {
            continue;
        }
        let new_key = new_entry.as_ref().map(|(k, _)| k);
        if let Some((k, _)) = &old_entry {
            if Some(k) != new_key {
                txn.delete(k.clone());
            }
        }
        if let (Some((k, v)), Some(row)) = (new_entry, new) {
            let key_changed = old_entry.as_ref().map(|(ok, _)| ok) != Some(&k);
            if plan.index.unique && key_changed {
                let (start, end) = plan.unique_range(row)?;
                for item in txn.scan(&start, end.as_deref()) {
                    let (other, _) = item?;
                    if other != k {
                        return Err(plan.unique_error(row));
                    }
                }
            }
            if pending {
                txn.put_pending(k, v);
            } else {
                txn.put(k, v);
            }
        }
    }
    Ok(())
}

/// Writes the entries of a new index for every existing row of its table,
/// in the DDL statement's transaction. Fails (writing nothing) if the
/// rows violate UNIQUE.
pub(crate) fn backfill(txn: &mut Transaction, catalog: &Catalog, index: &Index) -> Result<u64> {
    let plan = IndexPlan::new(catalog, index)?;
    let table = catalog.get_table(&index.table)?;
    let chain = catalog.ancestry(&table.name)?;
    let mut prefix = Vec::new();
    spindle_keys::key::encode_table_prefix(&mut prefix, chain[0].id);
    let end = prefix_end(&prefix);
    // (entry key, entry value, the row, the UNIQUE range start for the row)
    #[allow(clippy::type_complexity)]
    let mut entries: Vec<(Vec<u8>, Vec<u8>, Vec<Value>, Vec<u8>)> = Vec::new();
    for item in txn.scan(&prefix, end.as_deref()) {
        let (key, value) = item?;
        let Some(key_vals) = Catalog::decode_key(&chain, &key)? else {
            continue;
        };
        let row = crate::dml::stored_row(table, &key_vals, &value)?;
        if let Some((k, v)) = plan.entry(&row)? {
            let unique = if index.unique {
                plan.unique_range(&row)?.0
            } else {
                Vec::new()
            };
            entries.push((k, v, row, unique));
        }
    }
    if index.unique {
        // Entries sort by their indexed values first: duplicates are
        // neighbours once sorted.
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        for w in entries.windows(2) {
            if w[0].3 == w[1].3 {
                return Err(plan.unique_error(&w[1].2));
            }
        }
    }
    let n = entries.len() as u64;
    for (k, v, _, _) in entries {
        txn.put(k, v);
    }
    Ok(n)
}
