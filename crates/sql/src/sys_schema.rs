//! `spindle_sys`: live system tables.
//!
//! `spindle_sys.splits` lists every split in key order: its id, readable
//! start and end (`table(key values)`, with `/child(...)` levels when a
//! boundary lies inside a table's key range), approximate bytes and rows,
//! reads and writes over the last minute, and whether it is hot (carrying
//! at least `spindle_txn::HOT_OPS_PER_MINUTE` operations a minute) or a
//! single oversized row tree. Use it to spot the anti-patterns of the
//! Spanner schema guide: with monotonically increasing keys (timestamps
//! first, sequences) all writes land in the last split, which shows up here
//! as one hot split at the end of a table.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, BooleanArray, Int64Array, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::{MemTable, SchemaProvider, TableProvider};
use datafusion::error::{DataFusionError, Result};
use spindle_catalog::Catalog;
use spindle_keys::key::{decode_table_prefix, decode_values, TABLE_MARKER};
use spindle_txn::TxnManager;

use crate::types::value_to_text;

pub struct SysSchema {
    catalog: Arc<Catalog>,
    mgr: Arc<TxnManager>,
}

impl std::fmt::Debug for SysSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SysSchema")
    }
}

impl SysSchema {
    pub fn new(catalog: Arc<Catalog>, mgr: Arc<TxnManager>) -> Self {
        SysSchema { catalog, mgr }
    }

    fn splits(&self) -> Result<RecordBatch> {
        let stats = self
            .mgr
            .split_stats()
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        let schema = Arc::new(Schema::new(vec![
            Field::new("split_id", DataType::Int64, false),
            Field::new("start_key", DataType::Utf8, false),
            Field::new("end_key", DataType::Utf8, false),
            Field::new("bytes", DataType::Int64, false),
            Field::new("rows", DataType::Int64, false),
            Field::new("reads_per_minute", DataType::Int64, false),
            Field::new("writes_per_minute", DataType::Int64, false),
            Field::new("hot", DataType::Boolean, false),
            Field::new("oversized", DataType::Boolean, false),
        ]));
        let i64s = |f: &dyn Fn(&spindle_txn::SplitInfo) -> u64| -> ArrayRef {
            Arc::new(Int64Array::from(
                stats.iter().map(|s| f(s) as i64).collect::<Vec<_>>(),
            ))
        };
        let arrays: Vec<ArrayRef> = vec![
            i64s(&|s| s.id),
            Arc::new(StringArray::from(
                stats
                    .iter()
                    .map(|s| render_key(&self.catalog, &s.start))
                    .collect::<Vec<_>>(),
            )),
            Arc::new(StringArray::from(
                stats
                    .iter()
                    .map(|s| {
                        s.end
                            .as_ref()
                            .map(|e| render_key(&self.catalog, e))
                            .unwrap_or_else(|| "<end>".into())
                    })
                    .collect::<Vec<_>>(),
            )),
            i64s(&|s| s.bytes),
            i64s(&|s| s.rows),
            i64s(&|s| s.reads_per_minute),
            i64s(&|s| s.writes_per_minute),
            Arc::new(BooleanArray::from(
                stats.iter().map(|s| s.hot).collect::<Vec<_>>(),
            )),
            Arc::new(BooleanArray::from(
                stats.iter().map(|s| s.oversized).collect::<Vec<_>>(),
            )),
        ];
        Ok(RecordBatch::try_new(schema, arrays)?)
    }
}

/// A readable form of a split boundary: `<begin>`, `<catalog>`,
/// `singers`, `singers(1)`, `singers(1)/albums(2)`, `index by_name('x', 1)`.
pub fn render_key(catalog: &Catalog, key: &[u8]) -> String {
    if key.is_empty() {
        return "<begin>".into();
    }
    if key.first() != Some(&TABLE_MARKER) {
        return "<catalog>".into();
    }
    let mut out = String::new();
    let mut pos = 0;
    let mut prev = 0;
    while pos < key.len() {
        let Ok(id) = decode_table_prefix(key, &mut pos) else {
            break;
        };
        let (name, width) = match (catalog.table_by_id(id), catalog.index_by_id(id)) {
            (Some(t), _) => (t.name.clone(), t.primary_key.len()),
            (None, Some(ix)) => (
                if ix.row_copy {
                    format!("row copy of {}", ix.table)
                } else {
                    format!("index {}", ix.name)
                },
                catalog.key_width(id).unwrap_or(0),
            ),
            (None, None) => {
                out.push_str(&format!("<dropped table {id}>"));
                break;
            }
        };
        if !out.is_empty() {
            out.push('/');
        }
        out.push_str(&name);
        let n = width.saturating_sub(prev);
        if pos < key.len() {
            match decode_values(key, &mut pos, n) {
                Ok(vals) => {
                    let text: Vec<String> = vals
                        .iter()
                        .map(|v| value_to_text(v).unwrap_or_else(|| "NULL".into()))
                        .collect();
                    out.push_str(&format!("({})", text.join(", ")));
                }
                Err(_) => break,
            }
        }
        prev = width;
    }
    out
}

#[async_trait::async_trait]
impl SchemaProvider for SysSchema {
    fn table_names(&self) -> Vec<String> {
        vec!["splits".into()]
    }

    async fn table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        if name != "splits" {
            return Ok(None);
        }
        let batch = self.splits()?;
        Ok(Some(Arc::new(MemTable::try_new(
            batch.schema(),
            vec![vec![batch]],
        )?)))
    }

    fn table_exist(&self, name: &str) -> bool {
        name == "splits"
    }
}
