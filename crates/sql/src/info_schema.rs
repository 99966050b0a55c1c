//! `information_schema`: `tables` and `columns`, built from the catalog
//! snapshot of the statement, with Spanner's interleaving columns.
//!
//! `tables`: table_catalog, table_schema, table_name, table_type,
//! parent_table_name, on_delete_action ('CASCADE' | 'NO ACTION', only for
//! INTERLEAVE IN PARENT), interleave_type ('IN PARENT' | 'IN'), spanner_state.
//!
//! `columns`: table_catalog, table_schema, table_name, column_name,
//! ordinal_position, column_default, data_type, is_nullable, spanner_type.
//!
//! `indexes` (Spanner's layout): table_catalog, table_schema, table_name,
//! index_name, index_type ('PRIMARY_KEY' | 'INDEX'), parent_table_name
//! ('' unless interleaved), is_unique, is_null_filtered ('YES' | 'NO'),
//! index_state ('READ_WRITE'; NULL for primary keys). Every table has a
//! `PRIMARY_KEY` row.
//!
//! `index_columns`: table_catalog, table_schema, table_name, index_name,
//! index_type, column_name, ordinal_position (NULL for a STORING column),
//! column_ordering ('ASC' | 'DESC'; NULL for a STORING column),
//! is_nullable, spanner_type.
//!
//! `column_options` (Spanner's layout): table_catalog, table_schema,
//! table_name, column_name, option_name ('allow_commit_timestamp'),
//! option_type ('BOOL'), option_value ('TRUE'): one row per column with
//! the option set.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, Int64Array, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::{MemTable, SchemaProvider, TableProvider};
use datafusion::error::Result;
use spindle_catalog::{Catalog, InterleaveKind, OnDelete};

const VIEWS: [&str; 5] = [
    "tables",
    "columns",
    "indexes",
    "index_columns",
    "column_options",
];

#[derive(Debug)]
pub struct InfoSchema {
    catalog: Arc<Catalog>,
}

impl InfoSchema {
    pub fn new(catalog: Arc<Catalog>) -> Self {
        InfoSchema { catalog }
    }

    fn tables(&self) -> Result<RecordBatch> {
        let mut rows: Vec<[Option<String>; 8]> = Vec::new();
        for t in self.catalog.tables() {
            let (parent, on_delete, kind) = match &t.interleave {
                Some(il) => (
                    Some(il.parent.clone()),
                    match il.kind {
                        InterleaveKind::InParent => Some(match il.on_delete {
                            OnDelete::Cascade => "CASCADE".to_string(),
                            OnDelete::NoAction => "NO ACTION".to_string(),
                        }),
                        InterleaveKind::In => None,
                    },
                    Some(match il.kind {
                        InterleaveKind::InParent => "IN PARENT".to_string(),
                        InterleaveKind::In => "IN".to_string(),
                    }),
                ),
                None => (None, None, None),
            };
            rows.push([
                Some(String::new()),
                Some("public".into()),
                Some(t.name.clone()),
                Some("BASE TABLE".into()),
                parent,
                on_delete,
                kind,
                Some("COMMITTED".into()),
            ]);
        }
        for name in VIEWS {
            rows.push([
                Some(String::new()),
                Some("information_schema".into()),
                Some(name.into()),
                Some("VIEW".into()),
                None,
                None,
                None,
                None,
            ]);
        }
        let names = [
            "table_catalog",
            "table_schema",
            "table_name",
            "table_type",
            "parent_table_name",
            "on_delete_action",
            "interleave_type",
            "spanner_state",
        ];
        string_batch(&names, &rows)
    }

    fn columns(&self) -> Result<RecordBatch> {
        let schema = Arc::new(Schema::new(vec![
            Field::new("table_catalog", DataType::Utf8, false),
            Field::new("table_schema", DataType::Utf8, false),
            Field::new("table_name", DataType::Utf8, false),
            Field::new("column_name", DataType::Utf8, false),
            Field::new("ordinal_position", DataType::Int64, false),
            Field::new("column_default", DataType::Utf8, true),
            Field::new("data_type", DataType::Utf8, false),
            Field::new("is_nullable", DataType::Utf8, false),
            Field::new("spanner_type", DataType::Utf8, false),
            Field::new("is_primary_key", DataType::Utf8, false),
        ]));
        let mut cols: Vec<Vec<Option<String>>> = vec![Vec::new(); 10];
        let mut ordinals = Vec::new();
        for t in self.catalog.tables() {
            for (i, c) in t.columns.iter().filter(|c| !c.hidden).enumerate() {
                let vals = [
                    Some(String::new()),
                    Some("public".to_string()),
                    Some(t.name.clone()),
                    Some(c.name.clone()),
                    None,
                    c.default.clone(),
                    Some(pg_type_name(&c.data_type).to_string()),
                    Some(if c.nullable { "YES" } else { "NO" }.to_string()),
                    Some(c.data_type.to_string()),
                    Some(
                        if t.is_key_column(&c.name) {
                            "YES"
                        } else {
                            "NO"
                        }
                        .to_string(),
                    ),
                ];
                for (slot, v) in cols.iter_mut().zip(vals) {
                    slot.push(v);
                }
                ordinals.push(i as i64 + 1);
            }
        }
        let mut arrays: Vec<ArrayRef> = Vec::new();
        for (i, c) in cols.into_iter().enumerate() {
            if i == 4 {
                arrays.push(Arc::new(Int64Array::from(ordinals.clone())));
            } else {
                arrays.push(Arc::new(StringArray::from(c)));
            }
        }
        Ok(RecordBatch::try_new(schema, arrays)?)
    }
}

impl InfoSchema {
    fn indexes(&self) -> Result<RecordBatch> {
        let yes = |b: bool| Some(if b { "YES" } else { "NO" }.to_string());
        let mut rows: Vec<[Option<String>; 10]> = Vec::new();
        for t in self.catalog.tables() {
            rows.push([
                Some(String::new()),
                Some("public".into()),
                Some(t.name.clone()),
                Some("PRIMARY_KEY".into()),
                Some("PRIMARY_KEY".into()),
                Some(String::new()),
                yes(true),
                yes(false),
                None,
                None,
            ]);
        }
        for ix in self.catalog.indexes().filter(|ix| !ix.row_copy) {
            rows.push([
                Some(String::new()),
                Some("public".into()),
                Some(ix.table.clone()),
                Some(ix.name.clone()),
                Some("INDEX".into()),
                Some(ix.interleave_in.clone().unwrap_or_default()),
                yes(ix.unique),
                yes(ix.null_filtered),
                Some("READ_WRITE".into()),
                Some(ix.storing.join(", ")),
            ]);
        }
        let names = [
            "table_catalog",
            "table_schema",
            "table_name",
            "index_name",
            "index_type",
            "parent_table_name",
            "is_unique",
            "is_null_filtered",
            "index_state",
            "storing_columns",
        ];
        string_batch(&names, &rows)
    }

    fn index_columns(&self) -> Result<RecordBatch> {
        let mut rows: Vec<[Option<String>; 10]> = Vec::new();
        let mut ordinals: Vec<Option<i64>> = Vec::new();
        let dir = |d: spindle_keys::Direction| match d {
            spindle_keys::Direction::Asc => "ASC".to_string(),
            spindle_keys::Direction::Desc => "DESC".to_string(),
        };
        let mut push = |table: &spindle_catalog::Table,
                        index: &str,
                        kind: &str,
                        column: &str,
                        ordering: Option<String>,
                        ordinal: Option<i64>| {
            let col = table.column(column);
            rows.push([
                Some(String::new()),
                Some("public".into()),
                Some(table.name.clone()),
                Some(index.to_string()),
                Some(kind.to_string()),
                Some(column.to_string()),
                None,
                ordering,
                col.map(|c| if c.nullable { "YES" } else { "NO" }.to_string()),
                col.map(|c| c.data_type.to_string()),
            ]);
            ordinals.push(ordinal);
        };
        for t in self.catalog.tables() {
            for (i, k) in t.primary_key.iter().enumerate() {
                if t.column(&k.name).is_some_and(|c| c.hidden) {
                    continue;
                }
                push(
                    t,
                    "PRIMARY_KEY",
                    "PRIMARY_KEY",
                    &k.name,
                    Some(dir(k.direction)),
                    Some(i as i64 + 1),
                );
            }
        }
        for ix in self.catalog.indexes().filter(|ix| !ix.row_copy) {
            let Some(t) = self.catalog.table(&ix.table) else {
                continue;
            };
            for (i, k) in ix.columns.iter().enumerate() {
                push(
                    t,
                    &ix.name,
                    "INDEX",
                    &k.name,
                    Some(dir(k.direction)),
                    Some(i as i64 + 1),
                );
            }
            for c in &ix.storing {
                push(t, &ix.name, "INDEX", c, None, None);
            }
        }
        let schema = Arc::new(Schema::new(vec![
            Field::new("table_catalog", DataType::Utf8, true),
            Field::new("table_schema", DataType::Utf8, true),
            Field::new("table_name", DataType::Utf8, true),
            Field::new("index_name", DataType::Utf8, true),
            Field::new("index_type", DataType::Utf8, true),
            Field::new("column_name", DataType::Utf8, true),
            Field::new("ordinal_position", DataType::Int64, true),
            Field::new("column_ordering", DataType::Utf8, true),
            Field::new("is_nullable", DataType::Utf8, true),
            Field::new("spanner_type", DataType::Utf8, true),
        ]));
        let arrays: Vec<ArrayRef> = (0..10)
            .map(|i| {
                if i == 6 {
                    Arc::new(Int64Array::from(ordinals.clone())) as ArrayRef
                } else {
                    Arc::new(StringArray::from(
                        rows.iter().map(|r| r[i].clone()).collect::<Vec<_>>(),
                    )) as ArrayRef
                }
            })
            .collect();
        Ok(RecordBatch::try_new(schema, arrays)?)
    }
}

/// PostgreSQL's information_schema.columns.data_type spelling.
pub fn pg_type_name(t: &spindle_keys::DataType) -> &'static str {
    use spindle_keys::DataType as T;
    match t {
        T::Int64 => "bigint",
        T::Float64 => "double precision",
        T::Bool => "boolean",
        T::String(_) => "character varying",
        T::Bytes(_) => "bytea",
        T::Date => "date",
        T::Timestamp => "timestamp with time zone",
        T::Numeric => "numeric",
        T::Json => "jsonb",
    }
}

impl InfoSchema {
    fn column_options(&self) -> Result<RecordBatch> {
        let mut rows = Vec::new();
        for t in self.catalog.tables() {
            for c in t.columns.iter().filter(|c| c.allow_commit_timestamp) {
                rows.push([
                    Some(String::new()),
                    Some("public".to_string()),
                    Some(t.name.clone()),
                    Some(c.name.clone()),
                    Some("allow_commit_timestamp".to_string()),
                    Some("BOOL".to_string()),
                    Some("TRUE".to_string()),
                ]);
            }
        }
        string_batch(
            &[
                "table_catalog",
                "table_schema",
                "table_name",
                "column_name",
                "option_name",
                "option_type",
                "option_value",
            ],
            &rows,
        )
    }
}

fn string_batch<const N: usize>(
    names: &[&str; N],
    rows: &[[Option<String>; N]],
) -> Result<RecordBatch> {
    let schema = Arc::new(Schema::new(
        names
            .iter()
            .map(|n| Field::new(*n, DataType::Utf8, true))
            .collect::<Vec<_>>(),
    ));
    let arrays: Vec<ArrayRef> = (0..N)
        .map(|i| {
            Arc::new(StringArray::from(
                rows.iter().map(|r| r[i].clone()).collect::<Vec<_>>(),
            )) as ArrayRef
        })
        .collect();
    Ok(RecordBatch::try_new(schema, arrays)?)
}

#[async_trait::async_trait]
impl SchemaProvider for InfoSchema {
    fn table_names(&self) -> Vec<String> {
        VIEWS.iter().map(|v| v.to_string()).collect()
    }

    async fn table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        let batch = match name {
            "tables" => self.tables()?,
            "columns" => self.columns()?,
            "indexes" => self.indexes()?,
            "index_columns" => self.index_columns()?,
            "column_options" => self.column_options()?,
            _ => return Ok(None),
        };
        Ok(Some(Arc::new(MemTable::try_new(
            batch.schema(),
            vec![vec![batch]],
        )?)))
    }

    fn table_exist(&self, name: &str) -> bool {
        VIEWS.contains(&name)
    }
}
