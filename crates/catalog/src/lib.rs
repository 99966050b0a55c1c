//! # spindle-catalog: tables, columns and interleaving
//!
//! The catalog is the schema of one database: its tables, their columns,
//! primary keys and interleaving. It is a plain value: the transaction
//! layer loads it from the store at a snapshot, a DDL statement edits a
//! copy, and the commit writes the copy back in the same atomic batch as
//! any data — so schema changes are atomic and survive restart.
//!
//! ## Invariants (enforced by [`Catalog::create_table`] and friends)
//!
//! * Names are unique and compared exactly; the SQL layer folds unquoted
//!   identifiers to lower case before they get here (PostgreSQL's rule),
//!   so `"Mixed"` and `mixed` are different tables.
//! * A table has 1 to [`MAX_KEY_COLUMNS`] key columns (a table declared
//!   without a primary key gets the hidden key column [`HIDDEN_KEY`]).
//! * A table interleaved in a parent has a primary key that begins with the
//!   parent's key columns: same names, types and directions, same order.
//!   Its rows are stored under its parent's row key (see
//!   `spindle_keys::key`), so the depth of interleaving is at most
//!   [`MAX_INTERLEAVE_DEPTH`].
//! * A table with interleaved children cannot be dropped; key columns
//!   cannot be dropped.
//! * Table and column ids are never reused, so stored rows stay readable
//!   across ADD/DROP COLUMN.
//!
//! * Indexes share the tables' namespace and id space. An index's columns
//!   are key-typed columns of its table; STORING columns are non-key
//!   columns not already in the index key. An index interleaved in a
//!   parent names an ancestor of its table, and its columns begin with
//!   that ancestor's key columns (same order and directions). Dropping a
//!   table drops its indexes; an indexed column cannot be dropped.
//! * A table with tables interleaved in it has a *row copy*
//!   ([`Catalog::row_copy`]): a global index on its primary key storing
//!   every other column, added with its first child and dropped with its
//!   last, so that the table's rows can be scanned without its row trees.
//!   Names beginning with [`RESERVED_PREFIX`] are the catalog's own.
//!
//! ## Index entries
//!
//! An index key is the indexed columns followed by the table's primary-key
//! columns not already among them ([`Catalog::index_key_columns`]); the
//! value is the STORING columns, encoded like a row. A global index is a
//! root-level key space of its own; an interleaved index's entries sit in
//! the parent's row tree, after the parent's row key
//! ([`Catalog::index_chain`] gives both layouts as a table chain):
//!
//! ```text
//!   global      20 [index id] [indexed cols] [rest of the table key]
//!   interleaved 20 [Singers id] [SingerId] 20 [index id] [indexed cols after SingerId] [rest]
//! ```
//!
//! ## Commit-timestamp columns
//!
//! A TIMESTAMP column with `allow_commit_timestamp` may be written with
//! `PENDING_COMMIT_TIMESTAMP()`. Until commit, the write (row or index
//! entry, key or value) holds the placeholder
//! `spindle_keys::value::PENDING_COMMIT_TIMESTAMP`; at commit the
//! transaction layer asks [`Catalog::resolve_pending_commit_timestamp`] to
//! put the chosen commit timestamp in its place. Such a column refuses
//! timestamps in the future, so the placeholder is never stored and a key
//! holding a commit timestamp never collides with an existing row.
//!
//! ```text
//!   Singers (id 1)                         key: SingerId
//!    └─ Albums (id 2)  IN PARENT, CASCADE   key: SingerId, AlbumId
//!        └─ Songs (id 3) IN PARENT          key: SingerId, AlbumId, TrackId
//! ```

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use spindle_keys::{DataType, Direction, KeyLevel, Value};

mod row_codec;

pub use row_codec::RowCodec;

/// Most key columns a table may have.
pub const MAX_KEY_COLUMNS: usize = 16;
/// Most levels of interleaving below a root table (a root is depth 1).
pub const MAX_INTERLEAVE_DEPTH: usize = 7;
/// Largest single value accepted (10 MiB).
pub const MAX_VALUE_BYTES: usize = 10 * 1024 * 1024;
/// Name of the key column given to tables declared without a primary key.
pub const HIDDEN_KEY: &str = "_rowid";

/// Catalog errors: all are the caller's invalid input.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum Error {
    #[error("table \"{0}\" already exists")]
    TableExists(String),
    #[error("table \"{0}\" does not exist")]
    NoSuchTable(String),
    #[error("index \"{0}\" does not exist")]
    NoSuchIndex(String),
    #[error("column \"{0}\" of table \"{1}\" does not exist")]
    NoSuchColumn(String, String),
    #[error("column \"{0}\" of table \"{1}\" already exists")]
    ColumnExists(String, String),
    #[error("invalid table definition: {0}")]
    InvalidDefinition(String),
    #[error("{0}")]
    Dependent(String),
    #[error("{0}")]
    LimitExceeded(String),
    /// A name only Spindle may give (see [`RESERVED_PREFIX`]).
    #[error("name \"{0}\" is reserved: names beginning with \"spindle$\" are Spindle's own")]
    ReservedName(String),
}

pub type Result<T> = std::result::Result<T, Error>;

/// What deleting a parent row does to its interleaved children.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OnDelete {
    Cascade,
    NoAction,
}

/// `INTERLEAVE IN PARENT p` (the parent row must exist) or `INTERLEAVE IN p`
/// (co-located only).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum InterleaveKind {
    InParent,
    In,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Interleave {
    /// Parent table's name (lower-cased catalog name).
    pub parent: String,
    pub kind: InterleaveKind,
    pub on_delete: OnDelete,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Column {
    pub id: u32,
    pub name: String,
    pub data_type: DataType,
    pub nullable: bool,
    /// The DEFAULT expression as SQL text, evaluated by the SQL layer.
    pub default: Option<String>,
    /// Hidden columns (the generated key of a key-less table) are not part
    /// of `SELECT *`.
    pub hidden: bool,
    /// `OPTIONS (allow_commit_timestamp = true)` (PG: the type
    /// `spanner.commit_timestamp`): a TIMESTAMP column that may be written
    /// with `PENDING_COMMIT_TIMESTAMP()` and refuses future timestamps.
    #[serde(default)]
    pub allow_commit_timestamp: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KeyColumn {
    pub name: String,
    pub direction: Direction,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Table {
    /// The key space's id: every key of the table starts with it.
    pub id: u32,
    pub name: String,
    pub columns: Vec<Column>,
    pub primary_key: Vec<KeyColumn>,
    pub interleave: Option<Interleave>,
    pub next_column_id: u32,
    /// The id the table was created with, when its rows have since moved
    /// to a new key space ([`Catalog::add_primary_key`]): what
    /// [`Table::oid`] reports, so clients see one object throughout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_id: Option<u32>,
    /// Set with the storage parameter `row_copy = off`: the table keeps no
    /// row copy even with tables interleaved in it ([`Catalog::row_copy`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_row_copy: bool,
}

impl Table {
    /// The table's identity for clients (PostgreSQL's oid is derived from
    /// it): the id it was created with, which a move to a new key space
    /// does not change.
    pub fn oid(&self) -> u32 {
        self.first_id.unwrap_or(self.id)
    }

    pub fn column(&self, name: &str) -> Option<&Column> {
        self.columns.iter().find(|c| c.name == name)
    }

    pub fn column_index(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c.name == name)
    }

    /// Index in `columns` of each key column, in key order.
    pub fn key_indices(&self) -> Vec<usize> {
        self.primary_key
            .iter()
            .filter_map(|k| self.column_index(&k.name))
            .collect()
    }

    pub fn is_key_column(&self, name: &str) -> bool {
        self.primary_key.iter().any(|k| k.name == name)
    }

    pub fn has_hidden_key(&self) -> bool {
        self.columns.iter().any(|c| c.hidden)
    }

    pub fn parent_name(&self) -> Option<&str> {
        self.interleave.as_ref().map(|i| i.parent.as_str())
    }
}

/// A column as declared in CREATE TABLE / ALTER TABLE ADD COLUMN.
#[derive(Clone, Debug, PartialEq)]
pub struct ColumnDef {
    pub name: String,
    pub data_type: DataType,
    pub nullable: bool,
    pub default: Option<String>,
    pub allow_commit_timestamp: bool,
}

/// A CREATE TABLE, already parsed (names folded by the SQL layer).
#[derive(Clone, Debug, PartialEq)]
pub struct TableDef {
    pub name: String,
    pub columns: Vec<ColumnDef>,
    /// Empty means "no primary key": a hidden key is generated.
    pub primary_key: Vec<KeyColumn>,
    pub interleave: Option<Interleave>,
}

/// A secondary index (see the module docs for its key layout).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Index {
    /// Shares the id space of tables: an index's key space starts with the
    /// table marker and this id, like a table's.
    pub id: u32,
    pub name: String,
    pub table: String,
    /// The indexed columns as declared.
    pub columns: Vec<KeyColumn>,
    /// Non-key columns copied into each entry's value (`STORING`/`INCLUDE`).
    pub storing: Vec<String>,
    pub unique: bool,
    /// Rows with NULL in any indexed column have no entry.
    pub null_filtered: bool,
    /// The ancestor table whose row trees hold the entries; `None` for a
    /// global index, whose entries are a root-level key space.
    pub interleave_in: Option<String>,
    /// As [`Table::first_id`]: the id the index was created with, when its
    /// entries have since moved to a new key space.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_id: Option<u32>,
    /// The table's *row copy* rather than an index anyone created: see
    /// [`Catalog::row_copy`]. Keyed by the primary key, it stores every
    /// other column (whichever the table has now: `storing` stays empty).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub row_copy: bool,
}

impl Index {
    /// The index's identity for clients (see [`Table::oid`]).
    pub fn oid(&self) -> u32 {
        self.first_id.unwrap_or(self.id)
    }
}

/// Names beginning with this are Spindle's own (row copies are named
/// `spindle$rows$<table oid>`); a table or index cannot be created with one.
pub const RESERVED_PREFIX: &str = "spindle$";

fn check_name(name: &str) -> Result<()> {
    if name.starts_with(RESERVED_PREFIX) {
        return Err(Error::ReservedName(name.to_string()));
    }
    Ok(())
}

/// A CREATE INDEX, already parsed.
#[derive(Clone, Debug, PartialEq)]
pub struct IndexDef {
    pub name: String,
    pub table: String,
    pub columns: Vec<KeyColumn>,
    pub storing: Vec<String>,
    pub unique: bool,
    pub null_filtered: bool,
    pub interleave_in: Option<String>,
}

/// The schema of a database.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Catalog {
    /// Keyed by lower-cased name.
    tables: BTreeMap<String, Table>,
    next_table_id: u32,
    /// Secondary indexes by name (names share one namespace with tables).
    #[serde(default)]
    indexes: BTreeMap<String, Index>,
}

/// Catalog keys are names exactly as the SQL layer resolved them (it folds
/// unquoted identifiers to lower case; quoted ones keep their case).
fn fold(name: &str) -> String {
    name.to_string()
}

impl Catalog {
    pub fn new() -> Self {
        Catalog {
            tables: BTreeMap::new(),
            next_table_id: 1,
            indexes: BTreeMap::new(),
        }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        // Serializing plain data structs with string keys cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub fn from_bytes(bytes: &[u8]) -> std::result::Result<Self, serde_json::Error> {
        serde_json::from_slice(bytes)
    }

    /// The id the next table or index will get. Ids are handed out in
    /// commit order (a DDL transaction conflicts with any other that
    /// changes the catalog) and never reused, so an id below this one that
    /// names no table or index ([`Catalog::names_id`]) belonged to one
    /// that was dropped: its key space is retired.
    pub fn next_id(&self) -> u32 {
        self.next_table_id
    }

    /// Whether `id` is a table's or an index's.
    pub fn names_id(&self, id: u32) -> bool {
        self.table_by_id(id).is_some() || self.index_by_id(id).is_some()
    }

    pub fn tables(&self) -> impl Iterator<Item = &Table> {
        self.tables.values()
    }

    pub fn table(&self, name: &str) -> Option<&Table> {
        self.tables.get(&fold(name))
    }

    pub fn get_table(&self, name: &str) -> Result<&Table> {
        self.table(name)
            .ok_or_else(|| Error::NoSuchTable(name.to_string()))
    }

    pub fn table_by_id(&self, id: u32) -> Option<&Table> {
        self.tables.values().find(|t| t.id == id)
    }

    /// Tables interleaved directly in `name`.
    pub fn children(&self, name: &str) -> Vec<&Table> {
        self.tables
            .values()
            .filter(|t| t.parent_name().is_some_and(|p| p == name))
            .collect()
    }

    /// Whether a table or an index is interleaved directly in `name`: then
    /// `name`'s key space holds entries that are not its rows.
    pub fn has_interleaved(&self, name: &str) -> bool {
        !self.children(name).is_empty()
            || self
                .indexes
                .values()
                .any(|i| i.interleave_in.as_deref() == Some(name))
    }

    /// The chain of tables from the root down to `name` (inclusive).
    pub fn ancestry(&self, name: &str) -> Result<Vec<&Table>> {
        let mut chain = vec![self.get_table(name)?];
        while let Some(parent) = chain[chain.len() - 1].parent_name() {
            if chain.len() > MAX_INTERLEAVE_DEPTH + 1 {
                return Err(Error::InvalidDefinition("interleave cycle".into()));
            }
            chain.push(self.get_table(parent)?);
        }
        chain.reverse();
        Ok(chain)
    }

    /// Encodes the storage key of a row of `table` from its full primary-key
    /// values (in key order): each level of the ancestry adds its marker and
    /// the key columns it introduces.
    pub fn encode_key(&self, table: &str, key: &[Value]) -> std::result::Result<Vec<u8>, KeyError> {
        let chain = self.ancestry(table)?;
        self.encode_key_prefix(&chain, key, true)
    }

    /// Encodes a key prefix of `chain`'s last table from the first
    /// `prefix.len()` key values. When the prefix ends exactly at a level
    /// boundary and `descend` is set, the next level's marker is added, so
    /// the range only covers that table's subtree.
    pub fn encode_key_prefix(
        &self,
        chain: &[&Table],
        prefix: &[Value],
        descend: bool,
    ) -> std::result::Result<Vec<u8>, KeyError> {
        let last = chain
            .last()
            .ok_or(KeyError::Catalog(Error::InvalidDefinition(
                "empty chain".into(),
            )))?;
        let dirs: Vec<Direction> = last.primary_key.iter().map(|k| k.direction).collect();
        let mut levels = Vec::new();
        let mut start = 0;
        for t in chain {
            let end = t.primary_key.len();
            if start > prefix.len() || (start == prefix.len() && !descend) {
                break;
            }
            let stop = end.min(prefix.len());
            levels.push(KeyLevel {
                table_id: t.id,
                values: &prefix[start..stop],
                directions: &dirs[start..stop],
            });
            if stop < end {
                break;
            }
            start = end;
        }
        Ok(spindle_keys::key::encode_row_key(&levels)?)
    }

    /// Decodes a storage key if it is a row of `chain`'s last table (returns
    /// its key values), or `None` if it belongs to another table of the tree.
    pub fn decode_key(
        chain: &[&Table],
        key: &[u8],
    ) -> std::result::Result<Option<Vec<Value>>, spindle_keys::Error> {
        let mut spans = Vec::new();
        if !Self::key_spans(chain, key, &mut spans)? {
            return Ok(None);
        }
        spans
            .iter()
            .map(|(a, b)| spindle_keys::key::decode_value(&key[*a..*b]).map(|(v, _)| v))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map(Some)
    }

    /// Like [`Catalog::decode_key`] without decoding: fills `spans` with
    /// the byte range of each key column's encoded value in `key` (key
    /// column order, root's first) and returns false if the key is not a
    /// row of the chain's last table. `spans` is a buffer reused across
    /// rows, so a scan allocates nothing per key.
    pub fn key_spans(
        chain: &[&Table],
        key: &[u8],
        spans: &mut Vec<(usize, usize)>,
    ) -> std::result::Result<bool, spindle_keys::Error> {
        spans.clear();
        let mut pos = 0;
        let mut start = 0;
        for t in chain {
            if pos >= key.len() {
                return Ok(false);
            }
            let id = spindle_keys::key::decode_table_prefix(key, &mut pos)?;
            if id != t.id {
                return Ok(false);
            }
            for _ in start..t.primary_key.len() {
                let n = spindle_keys::key::value_len(&key[pos..])?;
                spans.push((pos, pos + n));
                pos += n;
            }
            start = t.primary_key.len();
        }
        Ok(pos == key.len())
    }

    pub fn create_table(&mut self, def: TableDef) -> Result<&Table> {
        let name = def.name.clone();
        check_name(&name)?;
        if self.table(&name).is_some() || self.index(&name).is_some() {
            return Err(Error::TableExists(name));
        }
        if def.columns.is_empty() {
            return Err(Error::InvalidDefinition(format!(
                "table \"{name}\" has no columns"
            )));
        }
        let mut columns: Vec<Column> = Vec::new();
        let mut next_column_id = 1;
        for c in &def.columns {
            check_commit_timestamp_option(&c.name, &c.data_type, c.allow_commit_timestamp)?;
            if columns.iter().any(|x| x.name == c.name) {
                return Err(Error::InvalidDefinition(format!(
                    "column \"{}\" specified more than once",
                    c.name
                )));
            }
            if c.name == HIDDEN_KEY {
                return Err(Error::InvalidDefinition(format!(
                    "column name \"{HIDDEN_KEY}\" is reserved"
                )));
            }
            columns.push(Column {
                id: next_column_id,
                name: c.name.clone(),
                data_type: c.data_type.clone(),
                nullable: c.nullable,
                default: c.default.clone(),
                hidden: false,
                allow_commit_timestamp: c.allow_commit_timestamp,
            });
            next_column_id += 1;
        }
        let mut primary_key = def.primary_key.clone();
        if primary_key.is_empty() {
            if def.interleave.is_some() {
                return Err(Error::InvalidDefinition(
                    "an interleaved table needs a primary key that begins with its parent's key"
                        .into(),
                ));
            }
            columns.push(Column {
                id: next_column_id,
                name: HIDDEN_KEY.into(),
                data_type: DataType::Int64,
                nullable: false,
                default: None,
                hidden: true,
                allow_commit_timestamp: false,
            });
            next_column_id += 1;
            primary_key.push(KeyColumn {
                name: HIDDEN_KEY.into(),
                direction: Direction::Asc,
            });
        }
        if primary_key.len() > MAX_KEY_COLUMNS {
            return Err(Error::LimitExceeded(format!(
                "table \"{name}\" has {} key columns; at most {MAX_KEY_COLUMNS} are allowed",
                primary_key.len()
            )));
        }
        for (i, k) in primary_key.iter_mut().enumerate() {
            if primary_key_dup(&def.primary_key, i) {
                return Err(Error::InvalidDefinition(format!(
                    "key column \"{}\" appears twice",
                    k.name
                )));
            }
            let col = columns
                .iter_mut()
                .find(|c| c.name == k.name)
                .ok_or_else(|| Error::NoSuchColumn(k.name.clone(), name.clone()))?;
            if !col.data_type.is_key_type() {
                return Err(Error::InvalidDefinition(format!(
                    "column \"{}\" of type {} cannot be part of a primary key",
                    col.name, col.data_type
                )));
            }
            k.name = col.name.clone();
        }
        if let Some(il) = &def.interleave {
            let parent = self.get_table(&il.parent)?;
            let depth = self.ancestry(&parent.name)?.len() + 1;
            if depth > MAX_INTERLEAVE_DEPTH {
                return Err(Error::LimitExceeded(format!(
                    "interleaving \"{name}\" in \"{}\" makes a hierarchy {depth} tables deep; at most {MAX_INTERLEAVE_DEPTH} are allowed",
                    parent.name
                )));
            }
            if parent.has_hidden_key() {
                return Err(Error::InvalidDefinition(format!(
                    "cannot interleave in \"{}\": it has no primary key",
                    parent.name
                )));
            }
            if primary_key.len() <= parent.primary_key.len() {
                return Err(Error::InvalidDefinition(format!(
                    "the primary key of \"{name}\" must begin with the primary key of its parent \"{}\" and add at least one column",
                    parent.name
                )));
            }
            for (pk, ck) in parent.primary_key.iter().zip(&primary_key) {
                let pcol = parent.column(&pk.name);
                let ccol = columns.iter().find(|c| c.name == ck.name);
                let same = pk.name == ck.name
                    && pk.direction == ck.direction
                    && pcol.map(|c| &c.data_type) == ccol.map(|c| &c.data_type);
                if !same {
                    return Err(Error::InvalidDefinition(format!(
                        "the primary key of \"{name}\" must begin with the primary key of its parent \"{}\" ({}), with the same names, types and order",
                        parent.name,
                        parent.primary_key.iter().map(|k| k.name.as_str()).collect::<Vec<_>>().join(", ")
                    )));
                }
            }
        }
        let mut interleave = def.interleave.clone();
        if let Some(il) = &mut interleave {
            il.parent = self.get_table(&il.parent)?.name.clone();
        }
        let id = self.next_table_id;
        self.next_table_id += 1;
        let table = Table {
            id,
            name: name.clone(),
            columns,
            primary_key,
            interleave,
            next_column_id,
            first_id: None,
            no_row_copy: false,
        };
        let parent = table.interleave.as_ref().map(|il| il.parent.clone());
        self.tables.insert(fold(&name), table);
        if let Some(parent) = parent {
            self.add_row_copy(&parent)?;
        }
        self.get_table(&name)
    }

    /// The row copy of `table`, if it has one. Every table that has tables
    /// interleaved in it gets one when its first child is created
    /// ([`Catalog::create_table`]; the caller writes its entries for rows
    /// already there) and loses it with its last child
    /// ([`Catalog::drop_table`]). It is a global index on the primary key
    /// that stores every other column: the table's rows again, dense in key
    /// order in a key space of their own, where in the table's own key
    /// space each row is followed by its row tree. A scan of the table
    /// alone reads the copy (the planner's choice: it covers every column)
    /// instead of seeking from row tree to row tree — the known cost of
    /// interleaving — and pays for it with a second write per row written.
    /// A table created or altered with `row_copy = off`
    /// ([`Catalog::set_row_copy`]) has none.
    /// Entries are kept like any index's (`spindle-sql`'s `index::maintain`),
    /// and because an entry's key is the row's primary key, the copies of a
    /// row tree's rows are one key range per table.
    pub fn row_copy(&self, table: &str) -> Option<&Index> {
        self.indexes
            .values()
            .find(|ix| ix.row_copy && ix.table == table)
    }

    /// `row_copy = on | off` on `table`: whether it keeps a row copy while
    /// it has tables interleaved in it. Turned off, the copy (if any) is
    /// dropped — its key space retired with this catalog change; turned
    /// on, a table with children gets one, and the caller writes its
    /// entries. Returns the copy that was added, if one was.
    pub fn set_row_copy(&mut self, table: &str, on: bool) -> Result<Option<&Index>> {
        let t = self
            .tables
            .get_mut(&fold(table))
            .ok_or_else(|| Error::NoSuchTable(table.to_string()))?;
        t.no_row_copy = !on;
        let name = t.name.clone();
        if !on {
            self.indexes
                .retain(|_, ix| !(ix.row_copy && ix.table == name));
            return Ok(None);
        }
        if self.row_copy(&name).is_some() || self.children(&name).is_empty() {
            return Ok(None);
        }
        self.add_row_copy(&name)?;
        Ok(self.row_copy(&name))
    }

    fn add_row_copy(&mut self, table: &str) -> Result<()> {
        if self.row_copy(table).is_some() {
            return Ok(());
        }
        let t = self.get_table(table)?;
        if t.no_row_copy {
            return Ok(());
        }
        let name = format!("{RESERVED_PREFIX}rows${}", t.oid());
        let index = Index {
            id: self.next_table_id,
            name: name.clone(),
            table: t.name.clone(),
            columns: t.primary_key.clone(),
            storing: Vec::new(),
            unique: false,
            null_filtered: false,
            interleave_in: None,
            first_id: None,
            row_copy: true,
        };
        self.next_table_id += 1;
        self.indexes.insert(name, index);
        Ok(())
    }

    pub fn drop_table(&mut self, name: &str) -> Result<Table> {
        let table = self.get_table(name)?;
        let children = self.children(&table.name);
        if !children.is_empty() {
            return Err(Error::Dependent(format!(
                "cannot drop table \"{}\": table \"{}\" is interleaved in it",
                table.name, children[0].name
            )));
        }
        let dropped = self
            .tables
            .remove(&fold(name))
            .ok_or_else(|| Error::NoSuchTable(name.to_string()))?;
        // Its indexes go with it (as in PostgreSQL); the caller deletes
        // their entries, found with `table_indexes` before the drop.
        self.indexes.retain(|_, ix| ix.table != dropped.name);
        // A parent left without children has no use for its row copy (a
        // global key space: retired with this catalog change).
        if let Some(parent) = dropped.parent_name() {
            if self.children(parent).is_empty() {
                let parent = parent.to_string();
                self.indexes
                    .retain(|_, ix| !(ix.row_copy && ix.table == parent));
            }
        }
        Ok(dropped)
    }

    pub fn indexes(&self) -> impl Iterator<Item = &Index> {
        self.indexes.values()
    }

    pub fn index(&self, name: &str) -> Option<&Index> {
        self.indexes.get(name)
    }

    pub fn index_by_id(&self, id: u32) -> Option<&Index> {
        self.indexes.values().find(|i| i.id == id)
    }

    /// The indexes on `table`, by name.
    pub fn table_indexes(&self, table: &str) -> Vec<&Index> {
        self.indexes.values().filter(|i| i.table == table).collect()
    }

    /// An index's key columns: the indexed columns, then the table's
    /// primary-key columns not already among them.
    pub fn index_key_columns(&self, index: &Index) -> Result<Vec<KeyColumn>> {
        let table = self.get_table(&index.table)?;
        let mut cols = index.columns.clone();
        for k in &table.primary_key {
            if !cols.iter().any(|c| c.name == k.name) {
                cols.push(k.clone());
            }
        }
        Ok(cols)
    }

    /// The key layout of an index as a chain of tables, root first, whose
    /// last element is a virtual table standing for the index: its id is
    /// the index id, its primary key the index key columns, its other
    /// columns the STORING columns (with the base table's column ids, so
    /// an entry's value is encoded like a row). A global index is a chain
    /// of one; an interleaved index's chain is its parent's ancestry plus
    /// the virtual table, so entries encode under the parent's row key.
    pub fn index_chain(&self, index: &Index) -> Result<Vec<Table>> {
        let table = self.get_table(&index.table)?;
        let key = self.index_key_columns(index)?;
        let storing: Vec<String> = if index.row_copy {
            table
                .columns
                .iter()
                .filter(|c| !c.hidden && !key.iter().any(|k| k.name == c.name))
                .map(|c| c.name.clone())
                .collect()
        } else {
            index.storing.clone()
        };
        let mut columns = Vec::new();
        for name in key.iter().map(|k| &k.name).chain(&storing) {
            let c = table
                .column(name)
                .ok_or_else(|| Error::NoSuchColumn(name.clone(), table.name.clone()))?;
            let mut c = c.clone();
            c.hidden = false;
            columns.push(c);
        }
        let mut chain: Vec<Table> = match &index.interleave_in {
            Some(p) => self.ancestry(p)?.into_iter().cloned().collect(),
            None => Vec::new(),
        };
        chain.push(Table {
            id: index.id,
            name: index.name.clone(),
            columns,
            primary_key: key,
            interleave: index.interleave_in.as_ref().map(|p| Interleave {
                parent: p.clone(),
                kind: InterleaveKind::In,
                on_delete: OnDelete::NoAction,
            }),
            next_column_id: 0,
            first_id: index.first_id,
            no_row_copy: false,
        });
        Ok(chain)
    }

    pub fn create_index(&mut self, def: IndexDef) -> Result<&Index> {
        let name = def.name.clone();
        check_name(&name)?;
        if self.index(&name).is_some() || self.table(&name).is_some() {
            return Err(Error::TableExists(name));
        }
        let table = self.get_table(&def.table)?;
        if def.columns.is_empty() {
            return Err(Error::InvalidDefinition(format!(
                "index \"{name}\" needs at least one column"
            )));
        }
        if def.columns.len() > MAX_KEY_COLUMNS {
            return Err(Error::LimitExceeded(format!(
                "index \"{name}\" has {} columns; at most {MAX_KEY_COLUMNS} are allowed",
                def.columns.len()
            )));
        }
        for (i, k) in def.columns.iter().enumerate() {
            let col = table
                .column(&k.name)
                .filter(|c| !c.hidden)
                .ok_or_else(|| Error::NoSuchColumn(k.name.clone(), table.name.clone()))?;
            if !col.data_type.is_key_type() {
                return Err(Error::InvalidDefinition(format!(
                    "column \"{}\" of type {} cannot be indexed",
                    col.name, col.data_type
                )));
            }
            if primary_key_dup(&def.columns, i) {
                return Err(Error::InvalidDefinition(format!(
                    "column \"{}\" appears twice in index \"{name}\"",
                    k.name
                )));
            }
        }
        for (i, s) in def.storing.iter().enumerate() {
            table
                .column(s)
                .filter(|c| !c.hidden)
                .ok_or_else(|| Error::NoSuchColumn(s.clone(), table.name.clone()))?;
            if table.is_key_column(s) || def.columns.iter().any(|c| &c.name == s) {
                return Err(Error::InvalidDefinition(format!(
                    "column \"{s}\" is part of the key of index \"{name}\" and cannot also be stored"
                )));
            }
            if def.storing[..i].contains(s) {
                return Err(Error::InvalidDefinition(format!(
                    "column \"{s}\" is stored twice in index \"{name}\""
                )));
            }
        }
        let mut interleave_in = None;
        if let Some(p) = &def.interleave_in {
            let parent = self.get_table(p)?;
            let ancestry = self.ancestry(&table.name)?;
            if parent.name == table.name || !ancestry.iter().any(|t| t.name == parent.name) {
                return Err(Error::InvalidDefinition(format!(
                    "index \"{name}\" can only be interleaved in an ancestor of \"{}\", and \"{}\" is not one",
                    table.name, parent.name
                )));
            }
            let prefix_ok = parent.primary_key.len() <= def.columns.len()
                && parent
                    .primary_key
                    .iter()
                    .zip(&def.columns)
                    .all(|(pk, ic)| pk.name == ic.name && pk.direction == ic.direction);
            if !prefix_ok {
                return Err(Error::InvalidDefinition(format!(
                    "the columns of index \"{name}\" interleaved in \"{}\" must begin with its primary key ({}), in order and with the same directions",
                    parent.name,
                    parent
                        .primary_key
                        .iter()
                        .map(|k| k.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
            interleave_in = Some(parent.name.clone());
        }
        let table_name = table.name.clone();
        let id = self.next_table_id;
        self.next_table_id += 1;
        let index = Index {
            id,
            name: name.clone(),
            table: table_name,
            columns: def.columns,
            storing: def.storing,
            unique: def.unique,
            null_filtered: def.null_filtered,
            interleave_in,
            first_id: None,
            row_copy: false,
        };
        Ok(self.indexes.entry(name).or_insert(index))
    }

    pub fn drop_index(&mut self, name: &str) -> Result<Index> {
        self.indexes
            .remove(name)
            .ok_or_else(|| Error::NoSuchIndex(name.to_string()))
    }

    /// How many key values a key of the table or index `id` carries in
    /// all (its own and its ancestors'), or `None` for an unknown id.
    pub fn key_width(&self, id: u32) -> Option<usize> {
        if let Some(t) = self.table_by_id(id) {
            return Some(t.primary_key.len());
        }
        let ix = self.index_by_id(id)?;
        self.index_key_columns(ix).ok().map(|k| k.len())
    }

    /// The id of the table or index a stored key belongs to: the id of its
    /// deepest level.
    pub fn key_owner(&self, key: &[u8]) -> std::result::Result<u32, KeyError> {
        let mut pos = 0;
        let mut prev = 0;
        loop {
            let id = spindle_keys::key::decode_table_prefix(key, &mut pos)?;
            let width = self.key_width(id).ok_or_else(|| {
                Error::InvalidDefinition(format!("key of unknown table or index {id}"))
            })?;
            for _ in prev..width {
                pos += spindle_keys::key::value_len(&key[pos..])?;
            }
            prev = width;
            if pos >= key.len() {
                return Ok(id);
            }
        }
    }

    pub fn add_column(&mut self, table: &str, def: ColumnDef) -> Result<&Column> {
        let t = self
            .tables
            .get_mut(&fold(table))
            .ok_or_else(|| Error::NoSuchTable(table.to_string()))?;
        if t.column(&def.name).is_some() || def.name == HIDDEN_KEY {
            return Err(Error::ColumnExists(def.name, t.name.clone()));
        }
        check_commit_timestamp_option(&def.name, &def.data_type, def.allow_commit_timestamp)?;
        let id = t.next_column_id;
        t.next_column_id += 1;
        t.columns.push(Column {
            id,
            name: def.name,
            data_type: def.data_type,
            nullable: def.nullable,
            default: def.default,
            hidden: false,
            allow_commit_timestamp: def.allow_commit_timestamp,
        });
        Ok(&t.columns[t.columns.len() - 1])
    }

    /// `ALTER TABLE t ADD PRIMARY KEY (cols)` on a table created without
    /// one: the key columns replace the hidden key column (whose id is not
    /// reused) and become NOT NULL, as in PostgreSQL. The table and its
    /// indexes get new ids — new, empty key spaces, the old ones retired —
    /// and keep their first ids as their oids. Returns the table as it is
    /// now; the caller writes its rows under their new keys and rebuilds
    /// its indexes' entries (every index entry ends with the primary key). A table with
    /// a declared key keeps it (PostgreSQL: a table has one primary key).
    /// A key-less table has no interleaved children and no interleaved
    /// indexes (both need its key), so only its own key space changes.
    pub fn add_primary_key(&mut self, table: &str, keys: Vec<KeyColumn>) -> Result<&Table> {
        let t = self.get_table(table)?;
        if !t.has_hidden_key() {
            return Err(Error::InvalidDefinition(format!(
                "multiple primary keys for table \"{}\" are not allowed",
                t.name
            )));
        }
        if keys.is_empty() {
            return Err(Error::InvalidDefinition(
                "PRIMARY KEY needs at least one column".into(),
            ));
        }
        if keys.len() > MAX_KEY_COLUMNS {
            return Err(Error::LimitExceeded(format!(
                "table \"{}\" would have {} key columns; at most {MAX_KEY_COLUMNS} are allowed",
                t.name,
                keys.len()
            )));
        }
        if let Some(child) = self.children(&t.name).first() {
            return Err(Error::InvalidDefinition(format!(
                "cannot change the primary key of \"{}\": table \"{}\" is interleaved in it",
                t.name, child.name
            )));
        }
        for (i, k) in keys.iter().enumerate() {
            let col = t
                .column(&k.name)
                .filter(|c| !c.hidden)
                .ok_or_else(|| Error::NoSuchColumn(k.name.clone(), t.name.clone()))?;
            if !col.data_type.is_key_type() {
                return Err(Error::InvalidDefinition(format!(
                    "column \"{}\" of type {} cannot be part of a primary key",
                    col.name, col.data_type
                )));
            }
            if primary_key_dup(&keys, i) {
                return Err(Error::InvalidDefinition(format!(
                    "key column \"{}\" appears twice",
                    k.name
                )));
            }
        }
        let name = t.name.clone();
        let new_id = self.next_table_id;
        self.next_table_id += 1;
        let t = self
            .tables
            .get_mut(&fold(&name))
            .ok_or_else(|| Error::NoSuchTable(name.clone()))?;
        // The rows move to a new key space (the caller writes them there);
        // the old one is retired whole, like a dropped table's, instead of
        // deleted row by row.
        t.first_id.get_or_insert(t.id);
        t.id = new_id;
        t.columns.retain(|c| !c.hidden);
        for c in &mut t.columns {
            if keys.iter().any(|k| k.name == c.name) {
                c.nullable = false;
            }
        }
        t.primary_key = keys;
        // So do the entries of the table's indexes (all global: see above),
        // which end with the primary key.
        for ix in self.indexes.values_mut().filter(|ix| ix.table == name) {
            ix.first_id.get_or_insert(ix.id);
            ix.id = self.next_table_id;
            self.next_table_id += 1;
        }
        self.get_table(&name)
    }

    /// `ALTER TABLE t ALTER COLUMN c SET OPTIONS (allow_commit_timestamp =
    /// true | null)`. Existing values are kept (they are all in the past or
    /// were checked when written).
    pub fn set_allow_commit_timestamp(
        &mut self,
        table: &str,
        column: &str,
        allow: bool,
    ) -> Result<()> {
        let t = self
            .tables
            .get_mut(&fold(table))
            .ok_or_else(|| Error::NoSuchTable(table.to_string()))?;
        let table_name = t.name.clone();
        let c = t
            .columns
            .iter_mut()
            .find(|c| c.name == column && !c.hidden)
            .ok_or_else(|| Error::NoSuchColumn(column.to_string(), table_name))?;
        check_commit_timestamp_option(&c.name, &c.data_type, allow)?;
        c.allow_commit_timestamp = allow;
        Ok(())
    }

    /// Replaces the [`PENDING_COMMIT_TIMESTAMP`] placeholder with `ts` in
    /// the commit-timestamp columns of a stored key and its value (a row of
    /// a table or an entry of an index): the transaction layer calls this at
    /// commit, once the commit timestamp is chosen, for every write the SQL
    /// layer marked as pending. Other columns are left alone, and the key
    /// is re-encoded only if one of its columns changed.
    ///
    /// [`PENDING_COMMIT_TIMESTAMP`]: spindle_keys::value::PENDING_COMMIT_TIMESTAMP
    pub fn resolve_pending_commit_timestamp(
        &self,
        key: &[u8],
        value: Option<&[u8]>,
        ts: i64,
    ) -> std::result::Result<(Vec<u8>, Option<Vec<u8>>), KeyError> {
        use spindle_keys::value::PENDING_COMMIT_TIMESTAMP as PENDING;
        let owner = self.key_owner(key)?;
        let chain: Vec<Table> = match self.table_by_id(owner) {
            Some(t) => self.ancestry(&t.name)?.into_iter().cloned().collect(),
            None => {
                let ix = self.index_by_id(owner).ok_or_else(|| {
                    Error::InvalidDefinition(format!("unknown key owner {owner}"))
                })?;
                self.index_chain(ix)?
            }
        };
        let refs: Vec<&Table> = chain.iter().collect();
        let last = chain
            .last()
            .ok_or_else(|| Error::InvalidDefinition("empty chain".into()))?;
        let is_commit_ts = |name: &str| last.column(name).is_some_and(|c| c.allow_commit_timestamp);
        let mut new_key = key.to_vec();
        if let Some(mut vals) = Self::decode_key(&refs, key)? {
            let mut changed = false;
            for (k, v) in last.primary_key.iter().zip(vals.iter_mut()) {
                if *v == Value::Timestamp(PENDING) && is_commit_ts(&k.name) {
                    *v = Value::Timestamp(ts);
                    changed = true;
                }
            }
            if changed {
                new_key = self.encode_key_prefix(&refs, &vals, true)?;
            }
        }
        let new_value = match value {
            None => None,
            Some(v) => {
                let mut cols = spindle_keys::row::decode_row(v)?;
                for (id, val) in cols.iter_mut() {
                    let commit_col = last
                        .columns
                        .iter()
                        .any(|c| c.id == *id && c.allow_commit_timestamp);
                    if commit_col && *val == Value::Timestamp(PENDING) {
                        *val = Value::Timestamp(ts);
                    }
                }
                let refs: Vec<(u32, &Value)> = cols.iter().map(|(id, v)| (*id, v)).collect();
                Some(spindle_keys::row::encode_row(&refs))
            }
        };
        Ok((new_key, new_value))
    }

    pub fn drop_column(&mut self, table: &str, column: &str) -> Result<Column> {
        let t = self
            .tables
            .get_mut(&fold(table))
            .ok_or_else(|| Error::NoSuchTable(table.to_string()))?;
        let idx = t
            .column_index(column)
            .filter(|i| !t.columns[*i].hidden)
            .ok_or_else(|| Error::NoSuchColumn(column.to_string(), t.name.clone()))?;
        if t.is_key_column(column) {
            return Err(Error::Dependent(format!(
                "cannot drop column \"{column}\": it is part of the primary key of \"{}\"",
                t.name
            )));
        }
        let table_name = t.name.clone();
        if let Some(ix) = self.indexes.values().find(|ix| {
            ix.table == table_name
                && (ix.columns.iter().any(|c| c.name == column)
                    || ix.storing.iter().any(|c| c == column))
        }) {
            return Err(Error::Dependent(format!(
                "cannot drop column \"{column}\": index \"{}\" uses it; drop the index first",
                ix.name
            )));
        }
        let t = self
            .tables
            .get_mut(&fold(table))
            .ok_or_else(|| Error::NoSuchTable(table.to_string()))?;
        if t.columns.iter().filter(|c| !c.hidden).count() == 1 {
            return Err(Error::InvalidDefinition(format!(
                "cannot drop the only column of \"{}\"",
                t.name
            )));
        }
        Ok(t.columns.remove(idx))
    }
}

/// `allow_commit_timestamp` is an option of TIMESTAMP columns only.
fn check_commit_timestamp_option(name: &str, ty: &DataType, allow: bool) -> Result<()> {
    if allow && *ty != DataType::Timestamp {
        return Err(Error::InvalidDefinition(format!(
            "allow_commit_timestamp is only allowed on TIMESTAMP columns, not on \"{name}\" ({ty})"
        )));
    }
    Ok(())
}

fn primary_key_dup(keys: &[KeyColumn], i: usize) -> bool {
    keys.get(i)
        .is_some_and(|k| keys[..i].iter().any(|o| o.name == k.name))
}

/// Errors while encoding a key through the catalog.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error(transparent)]
    Catalog(#[from] Error),
    #[error(transparent)]
    Key(#[from] spindle_keys::Error),
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn col(name: &str, ty: DataType) -> ColumnDef {
        ColumnDef {
            name: name.into(),
            data_type: ty,
            nullable: false,
            default: None,
            allow_commit_timestamp: false,
        }
    }
    fn key(names: &[&str]) -> Vec<KeyColumn> {
        names
            .iter()
            .map(|n| KeyColumn {
                name: n.to_string(),
                direction: Direction::Asc,
            })
            .collect()
    }
    fn singers_albums() -> Catalog {
        let mut c = Catalog::new();
        c.create_table(TableDef {
            name: "singers".into(),
            columns: vec![
                col("singerid", DataType::Int64),
                col("name", DataType::String(None)),
            ],
            primary_key: key(&["singerid"]),
            interleave: None,
        })
        .unwrap();
        c.create_table(TableDef {
            name: "albums".into(),
            columns: vec![
                col("singerid", DataType::Int64),
                col("albumid", DataType::Int64),
            ],
            primary_key: key(&["singerid", "albumid"]),
            interleave: Some(Interleave {
                parent: "singers".into(),
                kind: InterleaveKind::InParent,
                on_delete: OnDelete::Cascade,
            }),
        })
        .unwrap();
        c
    }

    #[test]
    fn child_key_extends_parent_key() {
        let c = singers_albums();
        let parent = c.encode_key("singers", &[Value::Int64(1)]).unwrap();
        let child = c
            .encode_key("albums", &[Value::Int64(1), Value::Int64(7)])
            .unwrap();
        assert!(child.starts_with(&parent));
        let chain = c.ancestry("albums").unwrap();
        assert_eq!(
            Catalog::decode_key(&chain, &child).unwrap(),
            Some(vec![Value::Int64(1), Value::Int64(7)])
        );
        assert_eq!(Catalog::decode_key(&chain, &parent).unwrap(), None);
        let schain = c.ancestry("singers").unwrap();
        assert_eq!(Catalog::decode_key(&schain, &child).unwrap(), None);
        // key_spans finds the same values without decoding them.
        let mut spans = Vec::new();
        assert!(Catalog::key_spans(&chain, &child, &mut spans).unwrap());
        let spanned: Vec<Value> = spans
            .iter()
            .map(|(a, b)| spindle_keys::key::decode_value(&child[*a..*b]).unwrap().0)
            .collect();
        assert_eq!(spanned, vec![Value::Int64(1), Value::Int64(7)]);
        assert!(!Catalog::key_spans(&chain, &parent, &mut spans).unwrap());
        assert!(!Catalog::key_spans(&schain, &child, &mut spans).unwrap());
        // A prefix of exactly the parent's key, descending, covers only albums.
        let p = c
            .encode_key_prefix(&chain, &[Value::Int64(1)], true)
            .unwrap();
        assert!(child.starts_with(&p) && !parent.starts_with(&p));
    }

    #[test]
    fn a_parent_keeps_one_row_copy_while_it_has_children() {
        let mut c = singers_albums();
        let copy = c.row_copy("singers").unwrap().clone();
        assert!(copy.row_copy && !copy.unique && copy.interleave_in.is_none());
        assert_eq!(copy.columns, key(&["singerid"]));
        assert!(c.row_copy("albums").is_none());
        // Its entries: the primary key, then every other column, including
        // one added after the copy was.
        c.add_column("singers", col("born", DataType::Int64))
            .unwrap();
        let chain = c.index_chain(&copy).unwrap();
        let names: Vec<&str> = chain[0].columns.iter().map(|c| c.name.as_str()).collect();
        assert_eq!((chain.len(), names), (1, vec!["singerid", "name", "born"]));
        // A column the copy stores can still be dropped.
        c.drop_column("singers", "born").unwrap();
        // A second child shares the copy.
        c.create_table(TableDef {
            name: "tours".into(),
            columns: vec![
                col("singerid", DataType::Int64),
                col("tourid", DataType::Int64),
            ],
            primary_key: key(&["singerid", "tourid"]),
            interleave: Some(Interleave {
                parent: "singers".into(),
                kind: InterleaveKind::In,
                on_delete: OnDelete::NoAction,
            }),
        })
        .unwrap();
        assert_eq!(c.indexes().filter(|ix| ix.row_copy).count(), 1);
        c.drop_table("albums").unwrap();
        assert_eq!(c.row_copy("singers"), Some(&copy));
        c.drop_table("tours").unwrap();
        assert!(c.row_copy("singers").is_none());
        assert_eq!(c.indexes().count(), 0);
        // Its name is reserved.
        let err = c
            .create_index(IndexDef {
                name: copy.name.clone(),
                table: "singers".into(),
                columns: key(&["name"]),
                storing: vec![],
                unique: false,
                null_filtered: false,
                interleave_in: None,
            })
            .unwrap_err();
        assert!(matches!(err, Error::ReservedName(_)), "{err}");
        // Turned off, a parent keeps none; turned on again, it has one.
        let mut c = singers_albums();
        assert!(c.set_row_copy("singers", false).unwrap().is_none());
        assert!(c.row_copy("singers").is_none() && c.table("singers").unwrap().no_row_copy);
        let added = c.set_row_copy("singers", true).unwrap().cloned();
        assert_eq!(added.as_ref(), c.row_copy("singers"));
        assert!(added.is_some_and(|ix| ix.id != copy.id));
        assert!(c.set_row_copy("singers", true).unwrap().is_none());
        // Off before its first child: none is made.
        c.set_row_copy("albums", false).unwrap();
        c.create_table(TableDef {
            name: "tracks".into(),
            columns: vec![
                col("singerid", DataType::Int64),
                col("albumid", DataType::Int64),
                col("trackid", DataType::Int64),
            ],
            primary_key: key(&["singerid", "albumid", "trackid"]),
            interleave: Some(Interleave {
                parent: "albums".into(),
                kind: InterleaveKind::InParent,
                on_delete: OnDelete::Cascade,
            }),
        })
        .unwrap();
        assert!(c.row_copy("albums").is_none());
        assert!(matches!(
            c.set_row_copy("nope", true),
            Err(Error::NoSuchTable(_))
        ));
    }

    #[test]
    fn pending_commit_timestamps_resolve_only_in_commit_timestamp_columns() {
        use spindle_keys::value::PENDING_COMMIT_TIMESTAMP as P;
        let mut c = Catalog::new();
        let mut at = col("at", DataType::Timestamp);
        at.allow_commit_timestamp = true;
        let mut updated = col("updated", DataType::Timestamp);
        updated.allow_commit_timestamp = true;
        c.create_table(TableDef {
            name: "log".into(),
            columns: vec![
                at,
                col("seq", DataType::Int64),
                updated,
                col("plain", DataType::Timestamp),
            ],
            primary_key: key(&["at", "seq"]),
            interleave: None,
        })
        .unwrap();
        c.create_index(IndexDef {
            name: "by_updated".into(),
            table: "log".into(),
            columns: key(&["updated"]),
            storing: vec!["plain".into()],
            unique: false,
            null_filtered: false,
            interleave_in: None,
        })
        .unwrap();
        let t = c.table("log").unwrap().clone();
        let key = c
            .encode_key("log", &[Value::Timestamp(P), Value::Int64(1)])
            .unwrap();
        let value = spindle_keys::row::encode_row(&[
            (t.columns[2].id, &Value::Timestamp(P)),
            (t.columns[3].id, &Value::Timestamp(P)),
        ]);
        let (k, v) = c
            .resolve_pending_commit_timestamp(&key, Some(&value), 42)
            .unwrap();
        assert_eq!(
            k,
            c.encode_key("log", &[Value::Timestamp(42), Value::Int64(1)])
                .unwrap()
        );
        // `plain` lacks the option: its value is left alone.
        assert_eq!(
            spindle_keys::row::decode_row(&v.unwrap()).unwrap(),
            vec![
                (t.columns[2].id, Value::Timestamp(42)),
                (t.columns[3].id, Value::Timestamp(P)),
            ]
        );
        // An index entry: its key (updated, at, seq) resolves both columns.
        let ix = c.index("by_updated").unwrap().clone();
        let chain = c.index_chain(&ix).unwrap();
        let refs: Vec<&Table> = chain.iter().collect();
        let vals = [Value::Timestamp(P), Value::Timestamp(P), Value::Int64(1)];
        let entry = c.encode_key_prefix(&refs, &vals, true).unwrap();
        let (k, v) = c.resolve_pending_commit_timestamp(&entry, None, 7).unwrap();
        assert_eq!(v, None);
        assert_eq!(
            Catalog::decode_key(&refs, &k).unwrap().unwrap(),
            vec![Value::Timestamp(7), Value::Timestamp(7), Value::Int64(1)]
        );
        // The option needs TIMESTAMP.
        let mut bad = col("n", DataType::Int64);
        bad.allow_commit_timestamp = true;
        assert!(c.add_column("log", bad).is_err());
        assert!(c.set_allow_commit_timestamp("log", "seq", true).is_err());
        c.set_allow_commit_timestamp("log", "plain", true).unwrap();
        assert!(c.table("log").unwrap().columns[3].allow_commit_timestamp);
    }

    #[test]
    fn child_key_must_start_with_parent_key() {
        let mut c = singers_albums();
        let err = c
            .create_table(TableDef {
                name: "bad".into(),
                columns: vec![col("x", DataType::Int64), col("singerid", DataType::Int64)],
                primary_key: key(&["x", "singerid"]),
                interleave: Some(Interleave {
                    parent: "singers".into(),
                    kind: InterleaveKind::In,
                    on_delete: OnDelete::NoAction,
                }),
            })
            .unwrap_err();
        assert!(matches!(err, Error::InvalidDefinition(_)), "{err}");
        assert!(matches!(c.drop_table("singers"), Err(Error::Dependent(_))));
        c.drop_table("albums").unwrap();
        c.drop_table("singers").unwrap();
    }

    #[test]
    fn depth_and_key_limits() {
        let mut c = Catalog::new();
        let mut names = vec![];
        for depth in 0..8 {
            let name = format!("t{depth}");
            let cols: Vec<ColumnDef> = (0..=depth)
                .map(|i| col(&format!("k{i}"), DataType::Int64))
                .collect();
            let keys: Vec<String> = (0..=depth).map(|i| format!("k{i}")).collect();
            let r = c.create_table(TableDef {
                name: name.clone(),
                columns: cols,
                primary_key: keys
                    .iter()
                    .map(|n| KeyColumn {
                        name: n.clone(),
                        direction: Direction::Asc,
                    })
                    .collect(),
                interleave: names.last().map(|p: &String| Interleave {
                    parent: p.clone(),
                    kind: InterleaveKind::InParent,
                    on_delete: OnDelete::Cascade,
                }),
            });
            if depth < MAX_INTERLEAVE_DEPTH {
                r.unwrap();
            } else {
                assert!(matches!(r, Err(Error::LimitExceeded(_))));
            }
            names.push(name);
        }
        let cols: Vec<ColumnDef> = (0..17)
            .map(|i| col(&format!("k{i}"), DataType::Int64))
            .collect();
        let r = c.create_table(TableDef {
            name: "wide".into(),
            primary_key: cols
                .iter()
                .map(|c| KeyColumn {
                    name: c.name.clone(),
                    direction: Direction::Asc,
                })
                .collect(),
            columns: cols,
            interleave: None,
        });
        assert!(matches!(r, Err(Error::LimitExceeded(_))));
    }

    #[test]
    fn keyless_table_gets_hidden_key_and_round_trips() {
        let mut c = Catalog::new();
        c.create_table(TableDef {
            name: "t".into(),
            columns: vec![col("a", DataType::Int64)],
            primary_key: vec![],
            interleave: None,
        })
        .unwrap();
        let t = c.table("t").unwrap();
        assert!(c.table("T").is_none());
        assert!(t.has_hidden_key());
        assert_eq!(t.primary_key[0].name, HIDDEN_KEY);
        let back = Catalog::from_bytes(&c.to_bytes()).unwrap();
        assert_eq!(back, c);
    }
}
