//! DDL: each statement edits a copy of the transaction's catalog and hands
//! it back with `Transaction::set_catalog`, so the change commits (or rolls
//! back) atomically with the rest of the transaction. Row data a DDL
//! statement touches (a dropped table's rows, an added column's default)
//! is written in the same transaction.

use spindle_catalog::{Catalog, ColumnDef, IndexDef, Table, TableDef};
use spindle_keys::{row, Value};

use crate::error::{Error, Result};
use crate::session::{Output, StatementContext};
use crate::types::coerce;

fn done(tag: &'static str) -> Result<Output> {
    Ok(Output::command(tag))
}

/// Evaluates a constant SQL expression (a column DEFAULT).
pub(crate) async fn eval_const(ctx: &StatementContext, expr: &str) -> Result<Value> {
    let stmt = match crate::parser::parse(&format!("SELECT {expr}"))?.pop() {
        Some(crate::parser::Statement::Query(q)) => *q,
        _ => return Err(Error::Syntax(format!("invalid expression: {expr}"))),
    };
    let (_, batches) = ctx.query(stmt, false).await?;
    for b in &batches {
        if b.num_rows() > 0 {
            return crate::types::array_value(b.column(0).as_ref(), 0);
        }
    }
    Ok(Value::Null)
}

/// Evaluates a column's DEFAULT (NULL when it has none), converted to the
/// column's type.
pub(crate) async fn eval_default(
    ctx: &StatementContext,
    name: &str,
    ty: &spindle_keys::DataType,
    default: Option<&str>,
) -> Result<Value> {
    match default {
        None => Ok(Value::Null),
        Some(expr) => coerce(eval_const(ctx, expr).await?, ty, name),
    }
}

pub(crate) async fn create_table(
    ctx: &StatementContext,
    def: TableDef,
    if_not_exists: bool,
    row_copy: Option<bool>,
) -> Result<Output> {
    let mut catalog: Catalog = (*ctx.catalog()?).clone();
    if catalog.table(&def.name).is_some() && if_not_exists {
        return done("CREATE TABLE");
    }
    for c in &def.columns {
        // Reject defaults that do not evaluate or do not fit the column now,
        // rather than at the first INSERT.
        let v = eval_default(ctx, &c.name, &c.data_type, c.default.as_deref()).await?;
        if v.is_null() && c.default.is_some() && !c.nullable {
            return Err(Error::NotNullViolation(format!(
                "default for NOT NULL column \"{}\" is NULL",
                c.name
            )));
        }
    }
    let had_copy = def
        .interleave
        .as_ref()
        .is_some_and(|il| catalog.row_copy(&il.parent).is_some());
    let created = catalog.create_table(def)?.clone();
    if let Some(on) = row_copy {
        // A new table has no children: this only records the choice.
        catalog.set_row_copy(&created.name, on)?;
    }
    let mut txn = ctx.lock()?;
    // The first child of a table gives it a row copy (see
    // `Catalog::row_copy`): written here for the rows it already has, in
    // this statement's transaction, as CREATE INDEX's backfill.
    if let (false, Some(parent)) = (had_copy, created.parent_name()) {
        if let Some(copy) = catalog.row_copy(parent) {
            crate::blocking(|| crate::index::backfill(&mut txn, &catalog, copy))?;
        }
    }
    txn.set_catalog(catalog);
    done("CREATE TABLE")
}

/// DROP TABLE of one or more tables, in one statement: the catalog change
/// and the deletion of their rows and index entries commit together. A
/// table interleaved in another listed table is dropped first, so a parent
/// and its children go in one statement whatever order they are listed in.
pub(crate) fn drop_tables(
    ctx: &StatementContext,
    names: &[String],
    if_exists: bool,
) -> Result<Output> {
    let mut catalog: Catalog = (*ctx.catalog()?).clone();
    let mut tables: Vec<(usize, String)> = Vec::new();
    for name in names {
        let Some(table) = catalog.table(name) else {
            if if_exists {
                continue;
            }
            return Err(spindle_catalog::Error::NoSuchTable(name.clone()).into());
        };
        if tables.iter().all(|(_, n)| *n != table.name) {
            tables.push((catalog.ancestry(&table.name)?.len(), table.name.clone()));
        }
    }
    // Deepest first: children before the parents they are interleaved in.
    tables.sort_by_key(|t| std::cmp::Reverse(t.0));
    // What is dropped with its whole key space — a root table (its
    // interleaved tables can only be dropped before it, in this statement)
    // with everything in its row trees, a global index — is not deleted
    // row by row: the key space is retired with the catalog change, left
    // for readers at older timestamps, and removed by the garbage collector
    // once none can see it (`TxnManager::gc`). Only a child table dropped
    // without its root deletes its rows and interleaved index entries.
    for (_, name) in &tables {
        let before = catalog.clone();
        let root = before.ancestry(name)?[0].name.clone();
        let root_dropped = tables.iter().any(|(_, n)| *n == root);
        let table = catalog.drop_table(name)?;
        if root_dropped {
            continue;
        }
        crate::blocking(|| -> Result<()> {
            for plan in crate::index::IndexPlan::for_table(&before, &table.name)? {
                if plan.chain.len() > 1 {
                    delete_index_entries(ctx, &plan)?;
                }
            }
            delete_table_rows(ctx, &before, &table)
        })?;
    }
    ctx.lock()?.set_catalog(catalog);
    done("DROP TABLE")
}

/// TRUNCATE: deletes every row and index entry of the listed tables in the
/// statement's transaction (so it rolls back with it), the schema
/// unchanged. A table interleaved in a listed one with `INTERLEAVE IN
/// PARENT` — whose rows need their parent rows — must be listed too, or
/// come with `CASCADE`, as PostgreSQL asks of tables whose foreign keys
/// reference a truncated one; a table only co-located with `INTERLEAVE IN`
/// keeps its rows.
pub(crate) fn truncate(ctx: &StatementContext, names: &[String], cascade: bool) -> Result<Output> {
    let catalog = ctx.catalog()?;
    let mut doomed: Vec<String> = Vec::new();
    for name in names {
        let table = catalog.get_table(name)?;
        if !doomed.contains(&table.name) {
            doomed.push(table.name.clone());
        }
    }
    let mut i = 0;
    while i < doomed.len() {
        for child in catalog.children(&doomed[i]) {
            let dependent = child
                .interleave
                .as_ref()
                .is_some_and(|il| il.kind == spindle_catalog::InterleaveKind::InParent);
            if !dependent || doomed.contains(&child.name) {
                continue;
            }
            if !cascade {
                return Err(spindle_catalog::Error::Dependent(format!(
                    "cannot truncate table \"{}\": table \"{}\" is interleaved in it \
                     (INTERLEAVE IN PARENT); truncate both in one statement, or use TRUNCATE … CASCADE",
                    doomed[i], child.name
                ))
                .into());
            }
            doomed.push(child.name.clone());
        }
        i += 1;
    }
    // A root whose whole tree goes is deleted by one range deletion, which
    // takes the rows and interleaved index entries of every table in it:
    // those tables have only their global indexes' entries left to delete.
    let mut whole: Vec<&str> = Vec::new();
    for name in &doomed {
        if catalog.get_table(name)?.parent_name().is_none()
            && owns_key_space(&catalog, name, &doomed)
        {
            whole.push(name);
        }
    }
    crate::blocking(|| -> Result<()> {
        for name in &doomed {
            let table = catalog.get_table(name)?;
            let chain = catalog.ancestry(name)?;
            let in_whole = whole.contains(&chain[0].name.as_str());
            for plan in crate::index::IndexPlan::for_table(&catalog, name)? {
                if !(in_whole && plan.chain.len() > 1) {
                    delete_index_entries(ctx, &plan)?;
                }
            }
            if !in_whole {
                delete_rows_of(ctx, &catalog, table)?;
            } else if chain.len() == 1 {
                delete_table_rows(ctx, &catalog, table)?;
            }
        }
        Ok(())
    })?;
    done("TRUNCATE TABLE")
}

/// Whether everything stored in `table`'s key space is being deleted with
/// it: every table interleaved in it, at any depth, is in `doomed` (an
/// index interleaved in it indexes one of those tables or `table` itself,
/// and goes with its table). Only then may a root table go by one range
/// deletion.
fn owns_key_space(catalog: &Catalog, table: &str, doomed: &[String]) -> bool {
    let mut stack = vec![table.to_string()];
    while let Some(t) = stack.pop() {
        for child in catalog.children(&t) {
            if !doomed.contains(&child.name) {
                return false;
            }
            stack.push(child.name.clone());
        }
    }
    true
}

/// Deletes every row of `table` (whose children, if any, are already gone
/// or going: a root table's key space is deleted whole).
fn delete_table_rows(ctx: &StatementContext, catalog: &Catalog, table: &Table) -> Result<()> {
    let chain = catalog.ancestry(&table.name)?;
    if chain.len() == 1 {
        let mut prefix = Vec::new();
        spindle_keys::key::encode_table_prefix(&mut prefix, chain[0].id);
        let end = spindle_keys::key::prefix_end(&prefix);
        ctx.lock()?.delete_range(&prefix, end.as_deref())?;
        return Ok(());
    }
    delete_rows_of(ctx, catalog, table)
}

/// Deletes the rows of `table` alone, leaving whatever else its root's key
/// space holds (other tables' rows, index entries).
fn delete_rows_of(ctx: &StatementContext, catalog: &Catalog, table: &Table) -> Result<()> {
    let chain = catalog.ancestry(&table.name)?;
    let mut prefix = Vec::new();
    spindle_keys::key::encode_table_prefix(&mut prefix, chain[0].id);
    let end = spindle_keys::key::prefix_end(&prefix);
    let mut txn = ctx.lock()?;
    let mut doomed = Vec::new();
    for item in txn.scan(&prefix, end.as_deref()) {
        let (key, _) = item?;
        if Catalog::decode_key(&chain, &key)?.is_some() {
            doomed.push(key);
        }
    }
    for k in doomed {
        txn.delete(k);
    }
    Ok(())
}

/// CREATE INDEX: the catalog change and the backfill of existing rows
/// commit together in the statement's transaction. The backfill reads the
/// whole table at the transaction's snapshot, so a write to the table
/// committed meanwhile makes the commit fail with a serialization error
/// (retried for an autocommit statement), and every transaction that
/// overlaps the schema change aborts (each implicitly reads the catalog):
/// no write can miss the new index. This is optimistic, not a lock: under
/// an unbroken stream of commits to the table the backfill keeps retrying
/// (and an autocommit CREATE INDEX gives up with 40001 after its attempts),
/// so build indexes on busy tables in a quieter moment.
pub(crate) fn create_index(
    ctx: &StatementContext,
    def: IndexDef,
    if_not_exists: bool,
) -> Result<Output> {
    let mut catalog: Catalog = (*ctx.catalog()?).clone();
    if if_not_exists && catalog.index(&def.name).is_some() {
        return done("CREATE INDEX");
    }
    let index = catalog.create_index(def)?.clone();
    let mut txn = ctx.lock()?;
    crate::blocking(|| crate::index::backfill(&mut txn, &catalog, &index))?;
    txn.set_catalog(catalog);
    done("CREATE INDEX")
}

/// `ALTER TABLE t SET (row_copy = on | off)`: off drops the table's row
/// copy (its key space retired with the catalog change, as DROP INDEX's);
/// on gives a table with children one, written in this statement's
/// transaction for the rows there, as CREATE INDEX's backfill.
pub(crate) fn set_row_copy(ctx: &StatementContext, table: &str, on: bool) -> Result<Output> {
    let mut catalog: Catalog = (*ctx.catalog()?).clone();
    let added = catalog.set_row_copy(table, on)?.cloned();
    let mut txn = ctx.lock()?;
    if let Some(copy) = added {
        crate::blocking(|| crate::index::backfill(&mut txn, &catalog, &copy))?;
    }
    txn.set_catalog(catalog);
    done("ALTER TABLE")
}

pub(crate) fn drop_index(
    ctx: &StatementContext,
    names: &[String],
    if_exists: bool,
) -> Result<Output> {
    let before = ctx.catalog()?;
    let mut catalog: Catalog = (*before).clone();
    for name in names {
        // A row copy is the catalog's own, not an index to drop by name.
        let Some(index) = catalog.index(name).filter(|ix| !ix.row_copy).cloned() else {
            if if_exists {
                continue;
            }
            return Err(spindle_catalog::Error::NoSuchIndex(name.clone()).into());
        };
        // A global index's key space is retired whole (see `drop_tables`);
        // an interleaved one's entries share its tables' row trees.
        let plan = crate::index::IndexPlan::new(&before, &index)?;
        if plan.chain.len() > 1 {
            crate::blocking(|| delete_index_entries(ctx, &plan))?;
        }
        catalog.drop_index(name)?;
    }
    ctx.lock()?.set_catalog(catalog);
    done("DROP INDEX")
}

fn delete_index_entries(ctx: &StatementContext, plan: &crate::index::IndexPlan) -> Result<()> {
    let mut txn = ctx.lock()?;
    if plan.chain.len() == 1 {
        let mut prefix = Vec::new();
        spindle_keys::key::encode_table_prefix(&mut prefix, plan.index.id);
        let end = spindle_keys::key::prefix_end(&prefix);
        txn.delete_range(&prefix, end.as_deref())?;
        return Ok(());
    }
    for k in plan.all_entries(&txn)? {
        txn.delete(k);
    }
    Ok(())
}

pub(crate) async fn add_column(
    ctx: &StatementContext,
    table: &str,
    column: ColumnDef,
    if_not_exists: bool,
) -> Result<Output> {
    let mut catalog: Catalog = (*ctx.catalog()?).clone();
    let t = catalog.get_table(table)?.clone();
    if t.column(&column.name).is_some() && if_not_exists {
        return done("ALTER TABLE");
    }
    let default = eval_default(
        ctx,
        &column.name,
        &column.data_type,
        column.default.as_deref(),
    )
    .await?;
    let added = catalog.add_column(table, column.clone())?.clone();
    // Existing rows take the default (PostgreSQL semantics); a NOT NULL
    // column without one can only be added to an empty table.
    let chain = catalog.ancestry(table)?;
    let mut prefix = Vec::new();
    spindle_keys::key::encode_table_prefix(&mut prefix, chain[0].id);
    let end = spindle_keys::key::prefix_end(&prefix);
    let mut txn = ctx.lock()?;
    let rewrites = crate::blocking(|| -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut rewrites = Vec::new();
        for item in txn.scan(&prefix, end.as_deref()) {
            let (key, value) = item?;
            if Catalog::decode_key(&chain, &key)?.is_none() {
                continue;
            }
            if default.is_null() {
                if !column.nullable {
                    return Err(Error::NotNullViolation(format!(
                        "column \"{}\" of relation \"{}\" contains null values",
                        column.name, t.name
                    )));
                }
                break;
            }
            let mut stored = row::decode_row(&value)?;
            stored.push((added.id, default.clone()));
            let refs: Vec<(u32, &Value)> = stored.iter().map(|(i, v)| (*i, v)).collect();
            rewrites.push((key, row::encode_row(&refs)));
        }
        Ok(rewrites)
    })?;
    let rewritten = !rewrites.is_empty();
    for (k, v) in rewrites {
        txn.put(k, v);
    }
    // The row copy stores every column: its entries take the default too.
    if let (true, Some(copy)) = (rewritten, catalog.row_copy(&t.name)) {
        crate::blocking(|| crate::index::backfill(&mut txn, &catalog, copy))?;
    }
    txn.set_catalog(catalog);
    done("ALTER TABLE")
}

pub(crate) fn drop_column(
    ctx: &StatementContext,
    table: &str,
    column: &str,
    if_exists: bool,
) -> Result<Output> {
    let mut catalog: Catalog = (*ctx.catalog()?).clone();
    let t = catalog.get_table(table)?;
    if t.column(column).is_none() && if_exists {
        return done("ALTER TABLE");
    }
    // Stored values of the column stay in rows under its id, which is never
    // reused; readers skip ids they do not know.
    catalog.drop_column(table, column)?;
    ctx.lock()?.set_catalog(catalog);
    done("ALTER TABLE")
}

/// `ALTER TABLE t ADD PRIMARY KEY (cols)` on a table created without one
/// (pgbench -i creates its tables so, loads them, then adds the keys).
/// Every row is written again, from its hidden `_rowid` key to its key
/// columns' values, in a new key space, and every index entry (which ends
/// with the primary key) is rebuilt in a new one too; the old key spaces
/// are retired, as a dropped table's (`Catalog::add_primary_key`). All in
/// the statement's transaction: a NULL or a duplicate in the key
/// columns fails the statement (23502, 23505) with nothing written. Like
/// CREATE INDEX's backfill, the table is read whole at the transaction's
/// snapshot, so a concurrent write to it makes one of the two retry.
pub(crate) fn add_primary_key(
    ctx: &StatementContext,
    table: &str,
    columns: Vec<spindle_catalog::KeyColumn>,
) -> Result<Output> {
    let before: Catalog = (*ctx.catalog()?).clone();
    let mut catalog = before.clone();
    let old = before.get_table(table)?.clone();
    let new = catalog.add_primary_key(table, columns)?.clone();
    let codec = spindle_catalog::RowCodec::new(&catalog, &new)?;
    // The new table's columns are the old ones without the hidden key.
    let keep: Vec<usize> = old
        .columns
        .iter()
        .enumerate()
        .filter(|(_, c)| !c.hidden)
        .map(|(i, _)| i)
        .collect();
    let chain = before.ancestry(&old.name)?;
    let mut prefix = Vec::new();
    spindle_keys::key::encode_table_prefix(&mut prefix, old.id);
    let end = spindle_keys::key::prefix_end(&prefix);
    let mut txn = ctx.lock()?;
    crate::blocking(|| -> Result<()> {
        let mut rows: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        for item in txn.scan(&prefix, end.as_deref()) {
            let (key, value) = item?;
            let Some(key_vals) = Catalog::decode_key(&chain, &key)? else {
                continue;
            };
            let full = crate::dml::stored_row(&old, &key_vals, &value)?;
            let full: Vec<Value> = keep.iter().map(|i| full[*i].clone()).collect();
            for &i in codec.key_idx() {
                if full[i].is_null() {
                    return Err(Error::NotNullViolation(format!(
                        "column \"{}\" of relation \"{}\" contains null values",
                        new.columns[i].name, new.name
                    )));
                }
            }
            rows.push((codec.encode_key(&full)?, codec.encode_value(&full)));
        }
        // Sorted by the new key, duplicates are neighbours.
        rows.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        if let Some(w) = rows.windows(2).find(|w| w[0].0 == w[1].0) {
            let key_vals =
                Catalog::decode_key(&catalog.ancestry(&new.name)?, &w[0].0)?.unwrap_or_default();
            let names: Vec<&str> = new.primary_key.iter().map(|k| k.name.as_str()).collect();
            let vals: Vec<String> = key_vals
                .iter()
                .map(|v| crate::types::value_to_text(v).unwrap_or_else(|| "NULL".into()))
                .collect();
            return Err(Error::UniqueViolation(format!(
                "could not create unique index \"{}_pkey\": Key ({})=({}) is duplicated",
                new.name,
                names.join(", "),
                vals.join(", ")
            )));
        }
        // The old rows and index entries stay where they are: their key
        // spaces are retired with the catalog change (see `drop_tables`).
        for (k, v) in rows {
            txn.put(k, v);
        }
        for index in catalog.table_indexes(&new.name) {
            crate::index::backfill(&mut txn, &catalog, index)?;
        }
        Ok(())
    })?;
    txn.set_catalog(catalog);
    done("ALTER TABLE")
}

/// VACUUM: removes the versions no snapshot can read any more (those
/// older than the version retention window, `TxnManager::gc`) now rather
/// than at the background collector's next pass. Of the tables named, the
/// whole key space of each one's root table (its row trees: interleaved
/// tables and indexes included) and the key spaces of its global indexes;
/// with no table named, of the whole database.
pub(crate) fn vacuum(ctx: &StatementContext, tables: &[(String, Vec<String>)]) -> Result<Output> {
    check_tables_and_columns(ctx, tables)?;
    let catalog = ctx.catalog()?;
    let mut ranges: Vec<(Vec<u8>, Option<Vec<u8>>)> = Vec::new();
    if tables.is_empty() {
        ranges.push((Vec::new(), None));
    }
    for (name, _) in tables {
        let mut ids = vec![catalog.ancestry(name)?[0].id];
        for index in catalog.table_indexes(name) {
            if index.interleave_in.is_none() {
                ids.push(index.id);
            }
        }
        for id in ids {
            let mut prefix = Vec::new();
            spindle_keys::key::encode_table_prefix(&mut prefix, id);
            let end = spindle_keys::key::prefix_end(&prefix);
            if !ranges.iter().any(|(s, _)| *s == prefix) {
                ranges.push((prefix, end));
            }
        }
    }
    let removed = crate::blocking(|| ctx.engine.manager().gc_ranges(&ranges))?;
    tracing::info!(removed, "VACUUM removed old versions");
    done("VACUUM")
}

/// Checks that the tables (and columns) VACUUM or ANALYZE names exist.
pub(crate) fn check_tables_and_columns(
    ctx: &StatementContext,
    tables: &[(String, Vec<String>)],
) -> Result<()> {
    let catalog = ctx.catalog()?;
    for (name, columns) in tables {
        let table = catalog.get_table(name)?;
        for c in columns {
            if table.column(c).filter(|c| !c.hidden).is_none() {
                return Err(
                    spindle_catalog::Error::NoSuchColumn(c.clone(), table.name.clone()).into(),
                );
            }
        }
    }
    Ok(())
}

/// `ALTER TABLE t ALTER COLUMN c SET OPTIONS (allow_commit_timestamp = …)`.
/// Turning the option on checks that no row holds a timestamp in the
/// future in that column (the invariant commit timestamps rely on).
pub(crate) fn set_column_options(
    ctx: &StatementContext,
    table: &str,
    column: &str,
    allow: bool,
) -> Result<Output> {
    let mut catalog: Catalog = (*ctx.catalog()?).clone();
    catalog.set_allow_commit_timestamp(table, column, allow)?;
    if allow {
        let t = catalog.get_table(table)?.clone();
        let col = t
            .column_index(column)
            .ok_or_else(|| spindle_catalog::Error::NoSuchColumn(column.into(), t.name.clone()))?;
        let chain = catalog.ancestry(table)?;
        let mut prefix = Vec::new();
        spindle_keys::key::encode_table_prefix(&mut prefix, chain[0].id);
        let end = spindle_keys::key::prefix_end(&prefix);
        let now = crate::session::now_micros() as i64;
        let txn = ctx.lock()?;
        crate::blocking(|| -> Result<()> {
            for item in txn.scan(&prefix, end.as_deref()) {
                let (key, value) = item?;
                let Some(key_vals) = Catalog::decode_key(&chain, &key)? else {
                    continue;
                };
                let row = crate::dml::stored_row(&t, &key_vals, &value)?;
                if let Value::Timestamp(ts) = row[col] {
                    if ts > now {
                        return Err(crate::dml::future_commit_timestamp(&t.columns[col].name));
                    }
                }
            }
            Ok(())
        })?;
    }
    ctx.lock()?.set_catalog(catalog);
    done("ALTER TABLE")
}
