//! PostgreSQL's built-in functions that clients call to find out where they
//! are: `version()`, `current_database()`, `current_schema()`,
//! `current_user()`, `session_user()`, `pg_backend_pid()`.
//!
//! They are constants of the engine (one database, `spindle`, one schema,
//! `public`; users are not modelled, so the user is `spindle` too) and are
//! registered on the engine's base DataFusion state ([`register_functions`]).
//! `version()` starts with `PostgreSQL 15.0` because drivers parse it; the
//! rest names Spindle.
//!
//! The `pg_catalog` schema ([`PgCatalog`]) serves the catalog tables psql's
//! `\d`, `\dt`, `\di` and `\l` queries read, built as MemTables from the
//! statement's catalog snapshot, and [`register_catalog_functions`] the
//! functions they call (`format_type`, `pg_table_is_visible`,
//! `pg_get_indexdef`, `pg_get_constraintdef`, `obj_description`, …).
//! [`rewrite`] turns PostgreSQL-only syntax in those queries
//! (`OPERATOR(pg_catalog.~)`, `::regclass`, `COLLATE pg_catalog.default`)
//! into SQL DataFusion plans, on the AST.
//!
//! Oids: table `id` is `100000 + 10 * id`; its primary-key index `+1`, its
//! primary-key constraint `+2`, its interleave constraint `+3`.
//!
//! The interleave parent is shown where `\d table` already prints a
//! footer: the interleave is a foreign-key-like constraint
//! (`pg_constraint.contype = 'f'`) named `<table>_interleave` whose
//! definition is `INTERLEAVE IN PARENT singers ON DELETE CASCADE`, so `\d`
//! prints it under "Foreign-key constraints:". The same text is the table's
//! comment (`obj_description`), shown by `\dt+` and `\d+`.

use std::sync::Arc;

use datafusion::catalog::{MemTable, SchemaProvider, TableProvider};
use datafusion::common::ScalarValue;
use datafusion::execution::session_state::SessionState;
use datafusion::logical_expr::{create_udf, ColumnarValue, Volatility};
use datafusion::sql::sqlparser::ast;
use spindle_catalog::{Catalog, InterleaveKind, OnDelete};

use crate::error::Result;

/// The database name `current_database()` reports.
pub const DATABASE_NAME: &str = "spindle";

/// The `version()` string.
pub fn version() -> String {
    format!(
        "PostgreSQL 15.0 (Spindle {}) on {}-{}, compiled by rustc",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::ARCH,
        std::env::consts::OS
    )
}

fn constant(name: &str, value: ScalarValue) -> datafusion::logical_expr::ScalarUDF {
    let ty = value.data_type();
    create_udf(
        name,
        vec![],
        ty,
        Volatility::Stable,
        Arc::new(move |_args: &[ColumnarValue]| Ok(ColumnarValue::Scalar(value.clone()))),
    )
}

/// Registers the functions on `state` (replacing DataFusion's own
/// `version()`).
pub fn register_functions(state: &mut SessionState) -> Result<()> {
    use datafusion::execution::registry::FunctionRegistry;
    let text = |s: &str| ScalarValue::Utf8(Some(s.to_string()));
    for udf in [
        constant("version", text(&version())),
        constant("current_database", text(DATABASE_NAME)),
        constant("current_catalog", text(DATABASE_NAME)),
        constant("current_schema", text("public")),
        constant("current_user", text("spindle")),
        constant("session_user", text("spindle")),
        constant(
            "pg_backend_pid",
            ScalarValue::Int64(Some(std::process::id() as i64)),
        ),
    ] {
        state.register_udf(Arc::new(udf))?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// pg_catalog tables
// ---------------------------------------------------------------------------

/// Namespace oids.
pub const PG_CATALOG_NS: i64 = 11;
pub const PUBLIC_NS: i64 = 2200;
const INFO_NS: i64 = 13000;
const SYS_NS: i64 = 13001;
const OWNER: i64 = 10;
const BTREE_AM: i64 = 403;
const HEAP_AM: i64 = 2;

/// The oid of table `id`; its primary-key index is `+1`, its primary-key
/// constraint `+2`, its interleave constraint `+3`.
pub fn table_oid(id: u32) -> i64 {
    100_000 + id as i64 * 10
}

/// PostgreSQL type oid and typmod of a column type.
pub fn type_oid(t: &spindle_keys::DataType) -> (i64, i64) {
    use spindle_keys::DataType as T;
    match t {
        T::Int64 => (20, -1),
        T::Float64 => (701, -1),
        T::Bool => (16, -1),
        T::String(Some(n)) => (1043, *n as i64 + 4),
        T::String(None) => (1043, -1),
        T::Bytes(_) => (17, -1),
        T::Date => (1082, -1),
        T::Timestamp => (1184, -1),
        T::Numeric => (1700, -1),
        T::Json => (3802, -1),
    }
}

const TYPES: &[(i64, &str, i64)] = &[
    (16, "boolean", 1),
    (17, "bytea", -1),
    (18, "\"char\"", 1),
    (19, "name", 64),
    (20, "bigint", 8),
    (21, "smallint", 2),
    (23, "integer", 4),
    (25, "text", -1),
    (26, "oid", 4),
    (114, "json", -1),
    (700, "real", 4),
    (701, "double precision", 8),
    (1042, "character", -1),
    (1043, "character varying", -1),
    (1082, "date", 4),
    (1114, "timestamp without time zone", 8),
    (1184, "timestamp with time zone", 8),
    (1700, "numeric", -1),
    (2205, "regclass", 4),
    (3802, "jsonb", -1),
];

/// `format_type(oid, typmod)`.
pub fn format_type(oid: i64, typmod: Option<i64>) -> Option<String> {
    let name = TYPES.iter().find(|t| t.0 == oid)?.1;
    Some(match (oid, typmod) {
        (1043 | 1042, Some(m)) if m >= 4 => format!("{name}({})", m - 4),
        _ => name.to_string(),
    })
}

#[derive(Clone)]
enum V {
    I(i64),
    S(String),
    B(bool),
    N,
}

fn s(x: impl Into<String>) -> V {
    V::S(x.into())
}

/// Column kinds: i = int8, s = text, b = bool, a = text[] (always NULL).
fn mem_table(cols: &[(&str, char)], rows: Vec<Vec<V>>) -> Result<Arc<dyn TableProvider>> {
    use datafusion::arrow::array::{ArrayRef, BooleanArray, Int64Array, ListArray, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    let fields: Vec<Field> = cols
        .iter()
        .map(|(n, k)| {
            let t = match k {
                'i' => DataType::Int64,
                'b' => DataType::Boolean,
                'a' => DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
                _ => DataType::Utf8,
            };
            Field::new(*n, t, true)
        })
        .collect();
    let schema = Arc::new(Schema::new(fields));
    let arrays: Vec<ArrayRef> = cols
        .iter()
        .enumerate()
        .map(|(i, (_, k))| -> ArrayRef {
            let col = rows.iter().map(|r| r.get(i).cloned().unwrap_or(V::N));
            match k {
                'i' => Arc::new(
                    col.map(|v| match v {
                        V::I(x) => Some(x),
                        _ => None,
                    })
                    .collect::<Int64Array>(),
                ),
                'b' => Arc::new(
                    col.map(|v| match v {
                        V::B(x) => Some(x),
                        _ => None,
                    })
                    .collect::<BooleanArray>(),
                ),
                'a' => Arc::new(ListArray::new_null(
                    Arc::new(Field::new("item", DataType::Utf8, true)),
                    rows.len(),
                )),
                _ => Arc::new(
                    col.map(|v| match v {
                        V::S(x) => Some(x),
                        _ => None,
                    })
                    .collect::<StringArray>(),
                ),
            }
        })
        .collect();
    let batch = datafusion::arrow::record_batch::RecordBatch::try_new(schema.clone(), arrays)
        .map_err(datafusion::error::DataFusionError::from)?;
    Ok(Arc::new(MemTable::try_new(schema, vec![vec![batch]])?))
}

const TABLES: &[&str] = &[
    "pg_namespace",
    "pg_class",
    "pg_attribute",
    "pg_type",
    "pg_index",
    "pg_constraint",
    "pg_am",
    "pg_description",
    "pg_shdescription",
    "pg_database",
    "pg_roles",
    "pg_user",
    "pg_authid",
    "pg_settings",
    "pg_tablespace",
    "pg_attrdef",
    "pg_collation",
    "pg_inherits",
    "pg_policy",
    "pg_trigger",
    "pg_rewrite",
    "pg_statistic_ext",
    "pg_publication",
    "pg_publication_rel",
    "pg_publication_namespace",
    "pg_foreign_table",
    "pg_partitioned_table",
    "pg_proc",
    "pg_views",
    "pg_tables",
    "pg_indexes",
];

/// The `pg_catalog` schema, built from one catalog snapshot.
#[derive(Debug)]
pub struct PgCatalog {
    catalog: Arc<Catalog>,
}

impl PgCatalog {
    pub fn new(catalog: Arc<Catalog>) -> Self {
        PgCatalog { catalog }
    }

    /// The interleave text shown as the table's comment and constraint.
    fn interleave_def(t: &spindle_catalog::Table) -> Option<String> {
        let il = t.interleave.as_ref()?;
        Some(match il.kind {
            InterleaveKind::InParent => format!(
                "INTERLEAVE IN PARENT {} ON DELETE {}",
                il.parent,
                match il.on_delete {
                    OnDelete::Cascade => "CASCADE",
                    OnDelete::NoAction => "NO ACTION",
                }
            ),
            InterleaveKind::In => format!("INTERLEAVE IN {}", il.parent),
        })
    }

    fn build(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        let cat = &self.catalog;
        let tables: Vec<&spindle_catalog::Table> = cat.tables().collect();
        let key_attnums = |t: &spindle_catalog::Table| -> String {
            let visible: Vec<_> = t.columns.iter().filter(|c| !c.hidden).collect();
            t.primary_key
                .iter()
                .filter_map(|k| visible.iter().position(|c| c.name == k.name))
                .map(|i| (i + 1).to_string())
                .collect::<Vec<_>>()
                .join(" ")
        };
        let has_visible_key = |t: &spindle_catalog::Table| !t.has_hidden_key();
        let attnums = |t: &spindle_catalog::Table, names: &mut dyn Iterator<Item = &String>| {
            let visible: Vec<_> = t.columns.iter().filter(|c| !c.hidden).collect();
            names
                .filter_map(|n| visible.iter().position(|c| &c.name == n))
                .map(|i| (i + 1).to_string())
                .collect::<Vec<_>>()
                .join(" ")
        };
        // Secondary indexes with their tables.
        // (Row copies are Spindle's own, not indexes anyone created.)
        let indexes: Vec<(&spindle_catalog::Index, &spindle_catalog::Table)> = cat
            .indexes()
            .filter(|ix| !ix.row_copy)
            .filter_map(|ix| cat.table(&ix.table).map(|t| (ix, t)))
            .collect();
        let p = match name {
            "pg_namespace" => mem_table(
                &[
                    ("oid", 'i'),
                    ("nspname", 's'),
                    ("nspowner", 'i'),
                    ("nspacl", 'a'),
                ],
                [
                    (PG_CATALOG_NS, "pg_catalog"),
                    (PUBLIC_NS, "public"),
                    (INFO_NS, "information_schema"),
                    (SYS_NS, "spindle_sys"),
                ]
                .iter()
                .map(|(o, n)| vec![V::I(*o), s(*n), V::I(OWNER)])
                .collect(),
            ),
            "pg_class" | "pg_tables" => {
                let mut rows = Vec::new();
                for t in &tables {
                    let oid = table_oid(t.oid());
                    let interleaved = t.interleave.is_some() || !cat.children(&t.name).is_empty();
                    let row = |oid: i64, name: String, kind: &str, am: i64, idx: bool| {
                        vec![
                            V::I(oid),
                            s(name),
                            V::I(PUBLIC_NS),
                            V::I(0),
                            V::I(OWNER),
                            V::I(am),
                            s(kind),
                            V::I(0),
                            V::B(idx),
                            V::B(false),
                            // psql prints foreign-key footers (where the
                            // interleave shows) only for tables with triggers.
                            V::B(kind == "r" && interleaved),
                            V::B(false),
                            V::B(false),
                            V::B(false),
                            V::N,
                            V::I(0),
                            V::I(0),
                            s("p"),
                            s("d"),
                            V::I(0),
                            V::N,
                            V::N,
                            V::I(-1),
                            V::I(0),
                            V::I(t.columns.iter().filter(|c| !c.hidden).count() as i64),
                        ]
                    };
                    let has_index =
                        has_visible_key(t) || indexes.iter().any(|(_, it)| it.id == t.id);
                    rows.push(row(oid, t.name.clone(), "r", HEAP_AM, has_index));
                    for (ix, _) in indexes.iter().filter(|(_, it)| it.id == t.id) {
                        rows.push(row(
                            table_oid(ix.oid()),
                            ix.name.clone(),
                            "i",
                            BTREE_AM,
                            false,
                        ));
                    }
                    if has_visible_key(t) {
                        rows.push(row(
                            oid + 1,
                            format!("{}_pkey", t.name),
                            "i",
                            BTREE_AM,
                            false,
                        ));
                    }
                }
                if name == "pg_tables" {
                    return Ok(Some(mem_table(
                        &[("schemaname", 's'), ("tablename", 's'), ("tableowner", 's')],
                        tables
                            .iter()
                            .map(|t| vec![s("public"), s(t.name.clone()), s("spindle")])
                            .collect(),
                    )?));
                }
                mem_table(
                    &[
                        ("oid", 'i'),
                        ("relname", 's'),
                        ("relnamespace", 'i'),
                        ("reltype", 'i'),
                        ("relowner", 'i'),
                        ("relam", 'i'),
                        ("relkind", 's'),
                        ("relchecks", 'i'),
                        ("relhasindex", 'b'),
                        ("relhasrules", 'b'),
                        ("relhastriggers", 'b'),
                        ("relrowsecurity", 'b'),
                        ("relforcerowsecurity", 'b'),
                        ("relispartition", 'b'),
                        ("reloptions", 'a'),
                        ("reltablespace", 'i'),
                        ("reloftype", 'i'),
                        ("relpersistence", 's'),
                        ("relreplident", 's'),
                        ("reltoastrelid", 'i'),
                        ("relpartbound", 's'),
                        ("relacl", 'a'),
                        ("reltuples", 'i'),
                        ("relpages", 'i'),
                        ("relnatts", 'i'),
                    ],
                    rows,
                )
            }
            "pg_attribute" => {
                let mut rows = Vec::new();
                for t in &tables {
                    for (i, c) in t.columns.iter().filter(|c| !c.hidden).enumerate() {
                        let (typ, typmod) = type_oid(&c.data_type);
                        rows.push(vec![
                            V::I(table_oid(t.oid())),
                            s(c.name.clone()),
                            V::I(typ),
                            V::I(typmod),
                            V::I(i as i64 + 1),
                            V::B(!c.nullable || t.is_key_column(&c.name)),
                            V::B(c.default.is_some()),
                            V::B(false),
                            V::I(0),
                            s(""),
                            s(""),
                            V::I(-1),
                            s("p"),
                            s(""),
                        ]);
                    }
                }
                mem_table(
                    &[
                        ("attrelid", 'i'),
                        ("attname", 's'),
                        ("atttypid", 'i'),
                        ("atttypmod", 'i'),
                        ("attnum", 'i'),
                        ("attnotnull", 'b'),
                        ("atthasdef", 'b'),
                        ("attisdropped", 'b'),
                        ("attcollation", 'i'),
                        ("attidentity", 's'),
                        ("attgenerated", 's'),
                        ("attstattarget", 'i'),
                        ("attstorage", 's'),
                        ("attcompression", 's'),
                    ],
                    rows,
                )
            }
            "pg_attrdef" => {
                let mut rows = Vec::new();
                for t in &tables {
                    for (i, c) in t.columns.iter().filter(|c| !c.hidden).enumerate() {
                        if let Some(d) = &c.default {
                            rows.push(vec![
                                V::I(table_oid(t.oid()) + 5),
                                V::I(table_oid(t.oid())),
                                V::I(i as i64 + 1),
                                s(d.clone()),
                            ]);
                        }
                    }
                }
                mem_table(
                    &[
                        ("oid", 'i'),
                        ("adrelid", 'i'),
                        ("adnum", 'i'),
                        ("adbin", 's'),
                    ],
                    rows,
                )
            }
            "pg_type" => mem_table(
                &[
                    ("oid", 'i'),
                    ("typname", 's'),
                    ("typnamespace", 'i'),
                    ("typowner", 'i'),
                    ("typlen", 'i'),
                    ("typtype", 's'),
                    ("typcollation", 'i'),
                    ("typelem", 'i'),
                    ("typarray", 'i'),
                    ("typbasetype", 'i'),
                    ("typnotnull", 'b'),
                    ("typrelid", 'i'),
                    ("typinput", 's'),
                ],
                TYPES
                    .iter()
                    .map(|(o, n, l)| {
                        vec![
                            V::I(*o),
                            s(n.trim_matches('"')),
                            V::I(PG_CATALOG_NS),
                            V::I(OWNER),
                            V::I(*l),
                            s("b"),
                            V::I(0),
                            V::I(0),
                            V::I(0),
                            V::I(0),
                            V::B(false),
                            V::I(0),
                            s(""),
                        ]
                    })
                    .collect(),
            ),
            "pg_index" => mem_table(
                &[
                    ("indexrelid", 'i'),
                    ("indrelid", 'i'),
                    ("indnatts", 'i'),
                    ("indnkeyatts", 'i'),
                    ("indisunique", 'b'),
                    ("indisprimary", 'b'),
                    ("indisexclusion", 'b'),
                    ("indimmediate", 'b'),
                    ("indisclustered", 'b'),
                    ("indisvalid", 'b'),
                    ("indisready", 'b'),
                    ("indislive", 'b'),
                    ("indisreplident", 'b'),
                    ("indkey", 's'),
                    ("indoption", 's'),
                    ("indexprs", 's'),
                    ("indpred", 's'),
                ],
                tables
                    .iter()
                    .filter(|t| has_visible_key(t))
                    .map(|t| {
                        let n = t.primary_key.len() as i64;
                        vec![
                            V::I(table_oid(t.oid()) + 1),
                            V::I(table_oid(t.oid())),
                            V::I(n),
                            V::I(n),
                            V::B(true),
                            V::B(true),
                            V::B(false),
                            V::B(true),
                            V::B(false),
                            V::B(true),
                            V::B(true),
                            V::B(true),
                            V::B(false),
                            s(key_attnums(t)),
                            s(""),
                            V::N,
                            V::N,
                        ]
                    })
                    .chain(indexes.iter().map(|(ix, t)| {
                        let keys = ix.columns.len() as i64;
                        vec![
                            V::I(table_oid(ix.oid())),
                            V::I(table_oid(t.oid())),
                            V::I(keys + ix.storing.len() as i64),
                            V::I(keys),
                            V::B(ix.unique),
                            V::B(false),
                            V::B(false),
                            V::B(true),
                            V::B(false),
                            V::B(true),
                            V::B(true),
                            V::B(true),
                            V::B(false),
                            s(attnums(
                                t,
                                &mut ix.columns.iter().map(|c| &c.name).chain(&ix.storing),
                            )),
                            s(""),
                            V::N,
                            if ix.null_filtered {
                                s("null_filtered")
                            } else {
                                V::N
                            },
                        ]
                    }))
                    .collect(),
            ),
            "pg_constraint" => {
                let mut rows = Vec::new();
                for t in &tables {
                    let oid = table_oid(t.oid());
                    let row = |coid: i64, name: String, ty: &str, index: i64, frel: i64| {
                        vec![
                            V::I(coid),
                            s(name),
                            V::I(PUBLIC_NS),
                            s(ty),
                            V::B(false),
                            V::B(false),
                            V::B(true),
                            V::I(oid),
                            V::I(0),
                            V::I(index),
                            V::I(0),
                            V::I(frel),
                            s("a"),
                            s("a"),
                            s("s"),
                            V::B(true),
                            V::I(0),
                            V::B(true),
                            s(key_attnums(t)),
                        ]
                    };
                    if has_visible_key(t) {
                        rows.push(row(oid + 2, format!("{}_pkey", t.name), "p", oid + 1, 0));
                    }
                    if let Some(il) = &t.interleave {
                        let parent = cat
                            .table(&il.parent)
                            .map(|p| table_oid(p.oid()))
                            .unwrap_or(0);
                        rows.push(row(
                            oid + 3,
                            format!("{}_interleave", t.name),
                            "f",
                            0,
                            parent,
                        ));
                    }
                }
                mem_table(
                    &[
                        ("oid", 'i'),
                        ("conname", 's'),
                        ("connamespace", 'i'),
                        ("contype", 's'),
                        ("condeferrable", 'b'),
                        ("condeferred", 'b'),
                        ("convalidated", 'b'),
                        ("conrelid", 'i'),
                        ("contypid", 'i'),
                        ("conindid", 'i'),
                        ("conparentid", 'i'),
                        ("confrelid", 'i'),
                        ("confupdtype", 's'),
                        ("confdeltype", 's'),
                        ("confmatchtype", 's'),
                        ("conislocal", 'b'),
                        ("coninhcount", 'i'),
                        ("connoinherit", 'b'),
                        ("conkey", 's'),
                    ],
                    rows,
                )
            }
            "pg_am" => mem_table(
                &[
                    ("oid", 'i'),
                    ("amname", 's'),
                    ("amhandler", 's'),
                    ("amtype", 's'),
                ],
                vec![
                    vec![V::I(HEAP_AM), s("heap"), s("heap_tableam_handler"), s("t")],
                    vec![V::I(BTREE_AM), s("btree"), s("bthandler"), s("i")],
                ],
            ),
            "pg_description" => mem_table(
                &[
                    ("objoid", 'i'),
                    ("classoid", 'i'),
                    ("objsubid", 'i'),
                    ("description", 's'),
                ],
                tables
                    .iter()
                    .filter_map(|t| {
                        Some(vec![
                            V::I(table_oid(t.oid())),
                            V::I(1259),
                            V::I(0),
                            s(Self::interleave_def(t)?),
                        ])
                    })
                    .collect(),
            ),
            "pg_shdescription" => mem_table(
                &[("objoid", 'i'), ("classoid", 'i'), ("description", 's')],
                vec![],
            ),
            "pg_database" => mem_table(
                &[
                    ("oid", 'i'),
                    ("datname", 's'),
                    ("datdba", 'i'),
                    ("encoding", 'i'),
                    ("datlocprovider", 's'),
                    ("datistemplate", 'b'),
                    ("datallowconn", 'b'),
                    ("datconnlimit", 'i'),
                    ("dattablespace", 'i'),
                    ("datcollate", 's'),
                    ("datctype", 's'),
                    ("daticulocale", 's'),
                    ("datacl", 'a'),
                ],
                vec![vec![
                    V::I(16384),
                    s(DATABASE_NAME),
                    V::I(OWNER),
                    V::I(6),
                    s("c"),
                    V::B(false),
                    V::B(true),
                    V::I(-1),
                    V::I(1663),
                    s("C"),
                    s("C"),
                    V::N,
                ]],
            ),
            "pg_roles" | "pg_authid" => mem_table(
                &[
                    ("oid", 'i'),
                    ("rolname", 's'),
                    ("rolsuper", 'b'),
                    ("rolinherit", 'b'),
                    ("rolcreaterole", 'b'),
                    ("rolcreatedb", 'b'),
                    ("rolcanlogin", 'b'),
                    ("rolreplication", 'b'),
                    ("rolbypassrls", 'b'),
                    ("rolconnlimit", 'i'),
                    ("rolvaliduntil", 's'),
                ],
                vec![vec![
                    V::I(OWNER),
                    s("spindle"),
                    V::B(true),
                    V::B(true),
                    V::B(true),
                    V::B(true),
                    V::B(true),
                    V::B(false),
                    V::B(true),
                    V::I(-1),
                    V::N,
                ]],
            ),
            "pg_user" => mem_table(
                &[
                    ("usename", 's'),
                    ("usesysid", 'i'),
                    ("usesuper", 'b'),
                    ("usecreatedb", 'b'),
                ],
                vec![vec![s("spindle"), V::I(OWNER), V::B(true), V::B(true)]],
            ),
            "pg_settings" => mem_table(
                &[
                    ("name", 's'),
                    ("setting", 's'),
                    ("unit", 's'),
                    ("category", 's'),
                ],
                vec![
                    vec![s("server_version"), s("15.0"), V::N, s("Preset Options")],
                    vec![s("server_encoding"), s("UTF8"), V::N, s("Preset Options")],
                ],
            ),
            "pg_tablespace" => mem_table(
                &[("oid", 'i'), ("spcname", 's'), ("spcowner", 'i')],
                vec![vec![V::I(1663), s("pg_default"), V::I(OWNER)]],
            ),
            "pg_collation" => mem_table(
                &[("oid", 'i'), ("collname", 's'), ("collnamespace", 'i')],
                vec![],
            ),
            "pg_inherits" => mem_table(
                &[
                    ("inhrelid", 'i'),
                    ("inhparent", 'i'),
                    ("inhseqno", 'i'),
                    ("inhdetachpending", 'b'),
                ],
                vec![],
            ),
            "pg_policy" => mem_table(
                &[
                    ("oid", 'i'),
                    ("polname", 's'),
                    ("polrelid", 'i'),
                    ("polcmd", 's'),
                    ("polpermissive", 'b'),
                    ("polroles", 's'),
                    ("polqual", 's'),
                    ("polwithcheck", 's'),
                ],
                vec![],
            ),
            "pg_trigger" => mem_table(
                &[
                    ("oid", 'i'),
                    ("tgrelid", 'i'),
                    ("tgname", 's'),
                    ("tgenabled", 's'),
                    ("tgisinternal", 'b'),
                    ("tgparentid", 'i'),
                ],
                vec![],
            ),
            "pg_rewrite" => mem_table(
                &[
                    ("oid", 'i'),
                    ("rulename", 's'),
                    ("ev_class", 'i'),
                    ("ev_enabled", 's'),
                ],
                vec![],
            ),
            "pg_statistic_ext" => mem_table(
                &[
                    ("oid", 'i'),
                    ("stxrelid", 'i'),
                    ("stxname", 's'),
                    ("stxnamespace", 'i'),
                    ("stxkind", 'a'),
                    ("stxstattarget", 'i'),
                    ("stxkeys", 's'),
                ],
                vec![],
            ),
            "pg_publication" => mem_table(
                &[("oid", 'i'), ("pubname", 's'), ("puballtables", 'b')],
                vec![],
            ),
            "pg_publication_rel" => mem_table(
                &[
                    ("oid", 'i'),
                    ("prpubid", 'i'),
                    ("prrelid", 'i'),
                    ("prqual", 's'),
                    ("prattrs", 's'),
                ],
                vec![],
            ),
            "pg_publication_namespace" => {
                mem_table(&[("oid", 'i'), ("pnpubid", 'i'), ("pnnspid", 'i')], vec![])
            }
            "pg_foreign_table" => mem_table(&[("ftrelid", 'i'), ("ftserver", 'i')], vec![]),
            "pg_partitioned_table" => mem_table(&[("partrelid", 'i'), ("partstrat", 's')], vec![]),
            "pg_proc" => mem_table(
                &[
                    ("oid", 'i'),
                    ("proname", 's'),
                    ("pronamespace", 'i'),
                    ("prokind", 's'),
                ],
                vec![],
            ),
            "pg_views" => mem_table(
                &[("schemaname", 's'), ("viewname", 's'), ("definition", 's')],
                vec![],
            ),
            "pg_indexes" => mem_table(
                &[
                    ("schemaname", 's'),
                    ("tablename", 's'),
                    ("indexname", 's'),
                    ("indexdef", 's'),
                ],
                tables
                    .iter()
                    .filter(|t| has_visible_key(t))
                    .map(|t| {
                        vec![
                            s("public"),
                            s(t.name.clone()),
                            s(format!("{}_pkey", t.name)),
                            s(index_def(t)),
                        ]
                    })
                    .chain(indexes.iter().map(|(ix, t)| {
                        vec![
                            s("public"),
                            s(t.name.clone()),
                            s(ix.name.clone()),
                            s(secondary_index_def(ix)),
                        ]
                    }))
                    .collect(),
            ),
            _ => return Ok(None),
        };
        Ok(Some(p?))
    }
}

fn index_by_oid(catalog: &Catalog, oid: i64) -> Option<&spindle_catalog::Index> {
    catalog
        .indexes()
        .find(|ix| !ix.row_copy && table_oid(ix.oid()) == oid)
}

fn key_list(t: &spindle_catalog::Table) -> String {
    t.primary_key
        .iter()
        .map(|k| match k.direction {
            spindle_keys::Direction::Desc => format!("{} DESC", k.name),
            _ => k.name.clone(),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn index_def(t: &spindle_catalog::Table) -> String {
    format!(
        "CREATE UNIQUE INDEX {}_pkey ON public.{} USING btree ({})",
        t.name,
        t.name,
        key_list(t)
    )
}

/// A secondary index as PostgreSQL's `pg_get_indexdef` would print it,
/// in Spanner's PostgreSQL spelling.
pub fn secondary_index_def(ix: &spindle_catalog::Index) -> String {
    let cols: Vec<String> = ix
        .columns
        .iter()
        .map(|k| match k.direction {
            spindle_keys::Direction::Desc => format!("{} DESC", k.name),
            _ => k.name.clone(),
        })
        .collect();
    let mut def = format!(
        "CREATE {}INDEX {} ON public.{} USING btree ({})",
        if ix.unique { "UNIQUE " } else { "" },
        ix.name,
        ix.table,
        cols.join(", ")
    );
    if !ix.storing.is_empty() {
        def.push_str(&format!(" INCLUDE ({})", ix.storing.join(", ")));
    }
    if let Some(p) = &ix.interleave_in {
        def.push_str(&format!(" INTERLEAVE IN {p}"));
    }
    if ix.null_filtered {
        let tests: Vec<String> = ix
            .columns
            .iter()
            .map(|c| format!("{} IS NOT NULL", c.name))
            .collect();
        def.push_str(&format!(" WHERE {}", tests.join(" AND ")));
    }
    def
}

#[async_trait::async_trait]
impl SchemaProvider for PgCatalog {
    fn table_names(&self) -> Vec<String> {
        TABLES.iter().map(|s| s.to_string()).collect()
    }

    async fn table(&self, name: &str) -> datafusion::error::Result<Option<Arc<dyn TableProvider>>> {
        self.build(name)
            .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))
    }

    fn table_exist(&self, name: &str) -> bool {
        TABLES.contains(&name)
    }
}

// ---------------------------------------------------------------------------
// pg_catalog functions that read the catalog
// ---------------------------------------------------------------------------

type RowFn = dyn Fn(&[ScalarValue]) -> ScalarValue + Send + Sync;

/// A function evaluated row by row over any arguments.
struct PgFn {
    name: String,
    ret: datafusion::arrow::datatypes::DataType,
    sig: datafusion::logical_expr::Signature,
    f: Arc<RowFn>,
}

impl std::fmt::Debug for PgFn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PgFn({})", self.name)
    }
}

impl PartialEq for PgFn {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}
impl Eq for PgFn {}
impl std::hash::Hash for PgFn {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name.hash(state)
    }
}

impl datafusion::logical_expr::ScalarUDFImpl for PgFn {
    fn name(&self) -> &str {
        &self.name
    }
    fn signature(&self) -> &datafusion::logical_expr::Signature {
        &self.sig
    }
    fn return_type(
        &self,
        _: &[datafusion::arrow::datatypes::DataType],
    ) -> datafusion::error::Result<datafusion::arrow::datatypes::DataType> {
        Ok(self.ret.clone())
    }
    fn invoke_with_args(
        &self,
        args: datafusion::logical_expr::ScalarFunctionArgs,
    ) -> datafusion::error::Result<ColumnarValue> {
        let n = args.number_rows;
        let all_scalar = args
            .args
            .iter()
            .all(|a| matches!(a, ColumnarValue::Scalar(_)));
        let arrays = args
            .args
            .iter()
            .map(|a| a.to_array(n.max(1)))
            .collect::<datafusion::error::Result<Vec<_>>>()?;
        let rows = if all_scalar { 1 } else { n };
        let mut out = Vec::with_capacity(rows);
        for i in 0..rows {
            let vals = arrays
                .iter()
                .map(|a| ScalarValue::try_from_array(a, i))
                .collect::<datafusion::error::Result<Vec<_>>>()?;
            let v = (self.f)(&vals);
            out.push(if v.is_null() {
                ScalarValue::try_from(&self.ret)?
            } else {
                v
            });
        }
        if all_scalar {
            if let Some(v) = out.pop() {
                return Ok(ColumnarValue::Scalar(v));
            }
        }
        if out.is_empty() {
            return Ok(ColumnarValue::Array(
                datafusion::arrow::array::new_empty_array(&self.ret),
            ));
        }
        Ok(ColumnarValue::Array(ScalarValue::iter_to_array(out)?))
    }
}

fn int_arg(v: &[ScalarValue], i: usize) -> Option<i64> {
    match v.get(i)? {
        ScalarValue::Int64(x) => *x,
        ScalarValue::Int32(x) => x.map(|x| x as i64),
        ScalarValue::Int16(x) => x.map(|x| x as i64),
        ScalarValue::UInt32(x) => x.map(|x| x as i64),
        ScalarValue::UInt64(x) => x.map(|x| x as i64),
        ScalarValue::Utf8(Some(s))
        | ScalarValue::LargeUtf8(Some(s))
        | ScalarValue::Utf8View(Some(s)) => s.parse().ok(),
        _ => None,
    }
}

fn str_arg(v: &[ScalarValue], i: usize) -> Option<String> {
    match v.get(i)? {
        x if x.is_null() => None,
        ScalarValue::Utf8(Some(s))
        | ScalarValue::LargeUtf8(Some(s))
        | ScalarValue::Utf8View(Some(s)) => Some(s.clone()),
        x => Some(x.to_string()),
    }
}

/// Registers the catalog-dependent pg_catalog functions on `state`.
pub fn register_catalog_functions(state: &mut SessionState, catalog: Arc<Catalog>) -> Result<()> {
    use datafusion::arrow::datatypes::DataType as D;
    use datafusion::execution::registry::FunctionRegistry;
    use datafusion::logical_expr::{ScalarUDF, Signature};
    let by_oid = {
        let catalog = catalog.clone();
        move |oid: i64| -> Option<(spindle_catalog::Table, i64)> {
            let t = catalog
                .tables()
                .find(|t| (table_oid(t.oid())..table_oid(t.oid()) + 10).contains(&oid))?;
            Some((t.clone(), oid - table_oid(t.oid())))
        }
    };
    let text = |s: Option<String>| ScalarValue::Utf8(s);
    let mut fns: Vec<(&str, D, Arc<RowFn>)> = vec![
        (
            "pg_table_is_visible",
            D::Boolean,
            Arc::new(|_| ScalarValue::Boolean(Some(true))),
        ),
        (
            "pg_type_is_visible",
            D::Boolean,
            Arc::new(|_| ScalarValue::Boolean(Some(true))),
        ),
        (
            "pg_function_is_visible",
            D::Boolean,
            Arc::new(|_| ScalarValue::Boolean(Some(true))),
        ),
        (
            "has_table_privilege",
            D::Boolean,
            Arc::new(|_| ScalarValue::Boolean(Some(true))),
        ),
        (
            "has_schema_privilege",
            D::Boolean,
            Arc::new(|_| ScalarValue::Boolean(Some(true))),
        ),
        (
            "has_database_privilege",
            D::Boolean,
            Arc::new(|_| ScalarValue::Boolean(Some(true))),
        ),
        (
            "pg_relation_is_publishable",
            D::Boolean,
            Arc::new(|_| ScalarValue::Boolean(Some(false))),
        ),
        ("pg_get_triggerdef", D::Utf8, Arc::new(move |_| text(None))),
        (
            "pg_is_in_recovery",
            D::Boolean,
            Arc::new(|_| ScalarValue::Boolean(Some(false))),
        ),
        (
            "format_type",
            D::Utf8,
            Arc::new(move |v| text(int_arg(v, 0).and_then(|o| format_type(o, int_arg(v, 1))))),
        ),
        (
            "pg_get_userbyid",
            D::Utf8,
            Arc::new(move |_| text(Some("spindle".into()))),
        ),
        (
            "pg_encoding_to_char",
            D::Utf8,
            Arc::new(move |_| text(Some("UTF8".into()))),
        ),
        (
            "pg_get_expr",
            D::Utf8,
            Arc::new(move |v| text(str_arg(v, 0))),
        ),
        ("col_description", D::Utf8, Arc::new(move |_| text(None))),
        ("shobj_description", D::Utf8, Arc::new(move |_| text(None))),
        ("pg_get_partkeydef", D::Utf8, Arc::new(move |_| text(None))),
        (
            "pg_get_statisticsobjdef_columns",
            D::Utf8,
            Arc::new(move |_| text(None)),
        ),
        (
            "pg_relation_size",
            D::Int64,
            Arc::new(|_| ScalarValue::Int64(Some(0))),
        ),
        (
            "pg_table_size",
            D::Int64,
            Arc::new(|_| ScalarValue::Int64(Some(0))),
        ),
        (
            "pg_total_relation_size",
            D::Int64,
            Arc::new(|_| ScalarValue::Int64(Some(0))),
        ),
        (
            "pg_database_size",
            D::Int64,
            Arc::new(|_| ScalarValue::Int64(Some(0))),
        ),
        // A table's partition ancestors are itself (psql's "Referenced
        // by" query selects it as a scalar).
        (
            "pg_partition_ancestors",
            D::Int64,
            Arc::new(|v| ScalarValue::Int64(int_arg(v, 0))),
        ),
        (
            "array_to_string",
            D::Utf8,
            Arc::new(move |v| {
                let sep = str_arg(v, 1).unwrap_or_default();
                text(match v.first() {
                    Some(ScalarValue::List(l))
                        if !datafusion::arrow::array::Array::is_null(l.as_ref(), 0) =>
                    {
                        let items = l.value(0);
                        let parts = (0..items.len())
                            .filter_map(|i| ScalarValue::try_from_array(&items, i).ok())
                            .filter(|x| !x.is_null())
                            .map(|x| str_arg(&[x], 0).unwrap_or_default())
                            .collect::<Vec<_>>();
                        Some(parts.join(&sep))
                    }
                    _ => str_arg(v, 0),
                })
            }),
        ),
        (
            "pg_size_pretty",
            D::Utf8,
            Arc::new(move |v| text(int_arg(v, 0).map(|n| format!("{n} bytes")))),
        ),
    ];
    {
        let by_oid = by_oid.clone();
        let catalog = catalog.clone();
        fns.push((
            "pg_get_indexdef",
            D::Utf8,
            Arc::new(move |v| {
                let oid = int_arg(v, 0);
                if let Some(ix) = oid.and_then(|o| index_by_oid(&catalog, o)) {
                    return text(Some(secondary_index_def(ix)));
                }
                text(
                    oid.and_then(&by_oid)
                        .and_then(|(t, k)| (k == 1).then(|| index_def(&t))),
                )
            }),
        ));
    }
    {
        let by_oid = by_oid.clone();
        fns.push((
            "pg_get_constraintdef",
            D::Utf8,
            Arc::new(move |v| {
                text(int_arg(v, 0).and_then(&by_oid).and_then(|(t, k)| match k {
                    2 => Some(format!("PRIMARY KEY ({})", key_list(&t))),
                    3 => PgCatalog::interleave_def(&t),
                    _ => None,
                }))
            }),
        ));
    }
    {
        let by_oid = by_oid.clone();
        fns.push((
            "obj_description",
            D::Utf8,
            Arc::new(move |v| {
                text(int_arg(v, 0).and_then(&by_oid).and_then(|(t, k)| {
                    if k == 0 {
                        PgCatalog::interleave_def(&t)
                    } else {
                        None
                    }
                }))
            }),
        ));
    }
    {
        let by_oid = by_oid.clone();
        let catalog = catalog.clone();
        fns.push((
            "spindle_regclass_name",
            D::Utf8,
            Arc::new(move |v| {
                text(int_arg(v, 0).map(|o| {
                    if let Some(ix) = index_by_oid(&catalog, o) {
                        return ix.name.clone();
                    }
                    match by_oid(o) {
                        Some((t, 1)) => format!("{}_pkey", t.name),
                        Some((t, _)) => t.name.clone(),
                        None => o.to_string(),
                    }
                }))
            }),
        ));
    }
    {
        let catalog = catalog.clone();
        fns.push((
            "spindle_regclass_oid",
            D::Int64,
            Arc::new(move |v| {
                let name = str_arg(v, 0).unwrap_or_default();
                let name = name
                    .strip_prefix("public.")
                    .unwrap_or(&name)
                    .trim_matches('"');
                ScalarValue::Int64(
                    catalog
                        .table(name)
                        .or_else(|| catalog.table(&name.to_lowercase()))
                        .map(|t| table_oid(t.oid())),
                )
            }),
        ));
    }
    for (name, ret, f) in fns {
        let udf = ScalarUDF::new_from_impl(PgFn {
            name: name.to_string(),
            ret,
            sig: Signature::variadic_any(Volatility::Stable),
            f,
        });
        state.register_udf(Arc::new(udf))?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Rewrites of PostgreSQL-specific syntax in catalog queries
// ---------------------------------------------------------------------------

/// Rewrites what psql and drivers send to catalog-reading SQL DataFusion
/// plans: `pg_catalog.` qualified functions, `OPERATOR(pg_catalog.~)`,
/// `COLLATE pg_catalog.default`, `::regclass` / `::oid` / `::regtype` /
/// `::pg_catalog.text` casts, `ARRAY(subquery)` (as NULL), and
/// unqualified `pg_class`-style table names.
pub fn rewrite(stmt: &mut ast::Statement) {
    use std::ops::ControlFlow;
    let mut catalog_query = false;
    let _ = ast::visit_relations_mut(stmt, |name| {
        if name.0.len() == 1 {
            if let Some(id) = name.0[0].as_ident() {
                let n = id.value.to_lowercase();
                if id.quote_style.is_none() && TABLES.contains(&n.as_str()) {
                    *name = ast::ObjectName::from(vec![
                        ast::Ident::new("pg_catalog"),
                        ast::Ident::new(n),
                    ]);
                }
            }
        }
        if name.0.len() == 2
            && name.0[0]
                .as_ident()
                .is_some_and(|i| i.value.eq_ignore_ascii_case("pg_catalog"))
        {
            catalog_query = true;
        }
        ControlFlow::<()>::Continue(())
    });
    // The rewrites that approximate psql's catalog queries (dropping
    // COLLATE, ARRAY(subquery) as NULL, aggregating single-row subqueries,
    // reg* casts) change meaning, so they apply only to statements that
    // read pg_catalog; user queries get only the harmless ones.
    let _ = ast::visit_expressions_mut(stmt, |e| {
        if catalog_query {
            rewrite_expr(e);
        } else if let ast::Expr::Function(f) = e {
            // `pg_catalog.version()` → `version()`.
            if f.name.0.len() == 2
                && f.name.0[0]
                    .as_ident()
                    .is_some_and(|i| i.value.eq_ignore_ascii_case("pg_catalog"))
            {
                let last = f.name.0[1].clone();
                f.name = ast::ObjectName(vec![last]);
            }
        } else if matches!(
            e,
            ast::Expr::BinaryOp {
                op: ast::BinaryOperator::PGCustomBinaryOperator(_),
                ..
            }
        ) {
            // `OPERATOR(pg_catalog.~)` → `~`.
            rewrite_expr(e);
        }
        ControlFlow::<()>::Continue(())
    });
}

fn func(name: &str, args: Vec<ast::Expr>) -> ast::Expr {
    ast::Expr::Function(ast::Function {
        name: ast::ObjectName::from(vec![ast::Ident::new(name)]),
        uses_odbc_syntax: false,
        parameters: ast::FunctionArguments::None,
        args: ast::FunctionArguments::List(ast::FunctionArgumentList {
            duplicate_treatment: None,
            args: args
                .into_iter()
                .map(|a| ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(a)))
                .collect(),
            clauses: vec![],
        }),
        filter: None,
        null_treatment: None,
        over: None,
        within_group: vec![],
    })
}

fn cast(inner: ast::Expr, data_type: ast::DataType) -> ast::Expr {
    ast::Expr::Cast {
        kind: ast::CastKind::DoubleColon,
        expr: Box::new(inner),
        data_type,
        array: false,
        format: None,
    }
}

fn last_name(name: &ast::ObjectName) -> String {
    name.0
        .last()
        .and_then(|p| p.as_ident())
        .map(|i| i.value.to_lowercase())
        .unwrap_or_default()
}

fn rewrite_expr(e: &mut ast::Expr) {
    use ast::{BinaryOperator as B, DataType as T, Expr};
    match e {
        Expr::Function(f) => {
            if f.name.0.len() == 2
                && f.name.0[0]
                    .as_ident()
                    .is_some_and(|i| i.value.eq_ignore_ascii_case("pg_catalog"))
            {
                let last = f.name.0[1].clone();
                f.name = ast::ObjectName(vec![last]);
            }
            if last_name(&f.name) == "array"
                && matches!(f.args, ast::FunctionArguments::Subquery(_))
            {
                *e = Expr::Value(ast::Value::Null.into());
            }
        }
        // `reloptions || ARRAY(subquery)` after the subquery became NULL.
        Expr::BinaryOp {
            left,
            op: B::StringConcat,
            right,
        } if matches!(right.as_ref(), Expr::Value(v) if v.value == ast::Value::Null)
            && matches!(
                left.as_ref(),
                Expr::CompoundIdentifier(_) | Expr::Identifier(_)
            ) =>
        {
            *e = std::mem::replace(left.as_mut(), Expr::Value(ast::Value::Null.into()));
        }
        Expr::BinaryOp { op, .. } => {
            if let B::PGCustomBinaryOperator(parts) = op {
                let new = match parts.last().map(|s| s.as_str()) {
                    Some("~") => Some(B::PGRegexMatch),
                    Some("~*") => Some(B::PGRegexIMatch),
                    Some("!~") => Some(B::PGRegexNotMatch),
                    Some("!~*") => Some(B::PGRegexNotIMatch),
                    Some("=") => Some(B::Eq),
                    Some("<>") => Some(B::NotEq),
                    Some("<") => Some(B::Lt),
                    Some(">") => Some(B::Gt),
                    Some("<=") => Some(B::LtEq),
                    Some(">=") => Some(B::GtEq),
                    _ => None,
                };
                if let Some(n) = new {
                    *op = n;
                }
            }
        }
        // DataFusion plans a correlated scalar subquery only when it is
        // aggregated; catalog lookups return at most one row, so max() of
        // it is the same value.
        Expr::Subquery(q) => {
            if let ast::SetExpr::Select(sel) = q.body.as_mut() {
                // psql's publication column lists: generate_series over an
                // int2[] of the (empty) pg_publication_rel.
                let series = sel.from.iter().any(|f| {
                    matches!(&f.relation, ast::TableFactor::Table { name, args: Some(_), .. }
                        if matches!(last_name(name).as_str(), "generate_series" | "pg_partition_ancestors"))
                });
                if series {
                    *e = Expr::Value(ast::Value::Null.into());
                    return;
                }
                let catalog_only = !sel.from.is_empty()
                    && sel.from.iter().all(|f| {
                        std::iter::once(&f.relation)
                            .chain(f.joins.iter().map(|j| &j.relation))
                            .all(|r| match r {
                                ast::TableFactor::Table { name, .. } => {
                                    TABLES.contains(&last_name(name).as_str())
                                }
                                _ => false,
                            })
                    });
                let grouped =
                    !matches!(&sel.group_by, ast::GroupByExpr::Expressions(v, _) if v.is_empty());
                if catalog_only && !grouped && sel.projection.len() == 1 {
                    if let ast::SelectItem::UnnamedExpr(x)
                    | ast::SelectItem::ExprWithAlias { expr: x, .. } = &mut sel.projection[0]
                    {
                        let inner = std::mem::replace(x, Expr::Value(ast::Value::Null.into()));
                        *x = func("max", vec![inner]);
                    }
                }
            }
        }
        Expr::Collate { expr, .. } => {
            *e = std::mem::replace(expr.as_mut(), Expr::Value(ast::Value::Null.into()));
        }
        Expr::Cast {
            expr, data_type, ..
        } => {
            let tname = match data_type {
                T::Custom(name, _) => last_name(name),
                T::Regclass => "regclass".into(),
                T::Char(_) | T::Character(_) => "char".into(),
                _ => return,
            };
            let inner = std::mem::replace(expr.as_mut(), Expr::Value(ast::Value::Null.into()));
            let lit = match &inner {
                Expr::Value(v) => match &v.value {
                    ast::Value::SingleQuotedString(s) => Some(s.clone()),
                    _ => None,
                },
                _ => None,
            };
            let new = match tname.as_str() {
                "regclass" => match lit {
                    Some(s) if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => {
                        Expr::Value(ast::Value::Number(s, false).into())
                    }
                    Some(_) => func("spindle_regclass_oid", vec![inner]),
                    None => func("spindle_regclass_name", vec![inner]),
                },
                "regtype" => func(
                    "format_type",
                    vec![inner, Expr::Value(ast::Value::Null.into())],
                ),
                "oid" | "regproc" | "regnamespace" | "regrole" | "int8" | "xid" => {
                    cast(inner, T::BigInt(None))
                }
                "int4" | "int2" => cast(inner, T::Int(None)),
                "bool" => cast(inner, T::Boolean),
                "text" | "name" | "char" | "varchar" | "int2vector" | "oidvector" => {
                    cast(inner, T::Text)
                }
                _ => {
                    **expr = inner;
                    return;
                }
            };
            *e = new;
        }
        _ => {}
    }
}
