//! The fast path for a row tree read with one statement: inner joins down
//! a chain of tables whose keys extend one another (as interleaved tables'
//! do), the root's full key fixed in the WHERE. Each table's part of the
//! tree is one key range, read with the key-range scan of the single-table
//! fast path; the rows are then joined by their key prefixes, without
//! DataFusion:
//!
//! ```text
//! SELECT c.name, o.o_id, l.qty
//!   FROM customers c
//!   JOIN orders o ON o.c_id = c.c_id                       o's key: (c_id, o_id)
//!   JOIN lines l  ON l.c_id = o.c_id AND l.o_id = o.o_id   l's key: (c_id, o_id, l_id)
//!  WHERE c.c_id = $1
//!
//!   customers [key(c_id)           , end)  → 1 row   ┐ key prefix → row
//!   orders    [key(c_id) ‖ orders   , end)  → 5 rows  ┤ key prefix → row
//!   lines     [key(c_id) ‖ … lines  , end)  → 20 rows ┘ one output row each,
//!                                                       with its ancestors
//! ```
//!
//! Interleaved, the three ranges lie inside the customer's row tree (the
//! scans jump over the other tables' entries); a chain of separate tables
//! keyed the same way is read the same way, a range per table.
//!
//! Matched exactly, or the general path runs the statement:
//! * `SELECT` of columns (each qualified, or a name only one table has),
//!   optionally aliased, with distinct output names; `FROM t0 JOIN t1 ON …
//!   JOIN t2 ON …` (plain or INNER joins, distinct qualifiers); `WHERE`
//!   `=` on every key column of `t0` (literals of the column's type or
//!   parameters); nothing else (no ORDER BY, LIMIT, DISTINCT, GROUP BY,
//!   locking).
//! * Each `ti+1`'s key starts with as many columns as `ti`'s key has, of
//!   the same types (no FLOAT64: `-0 = 0` would join keys that differ),
//!   and its `ON` is exactly `ti+1.k_j = ti.k_j` for each of `ti`'s key
//!   columns, in either order.
//!
//! The contract of the fast path holds: the answer is the general path's.
//! A row of `ti+1` joins the row of `ti` whose key is its key's prefix,
//! if that row is in the tree (a table interleaved with `INTERLEAVE IN`
//! may have rows without a parent: they join nothing); a NULL in a key
//! column an `ON` compares joins nothing (a NULL in the last table's own
//! key columns, which no `ON` compares, does not matter). Rows come in the last table's key order, the
//! order of the general path's hash joins, which stream that table as the
//! probe side (SQL promises no order without ORDER BY). The reads recorded
//! for validation are the ranges scanned; a range with no row ends the
//! statement (the answer is empty whatever the later tables hold).

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, UInt32Array};
use datafusion::arrow::compute::take;
use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::ScalarValue;
use datafusion::sql::sqlparser::ast;
use spindle_catalog::{Catalog, Table};
use spindle_keys::DataType;

use crate::error::{Error, Result};
use crate::fastpath::{
    conjuncts, match_point_key, scan_bounds, select_from_where, single_table, KeyRange, Slot,
};
use crate::parser::fold_ident;
use crate::provider::ScanRequest;
use crate::session::{Output, StatementContext};
use crate::types::table_schema;
use spindle_keys::Value;

/// A planned row-tree join (see the module documentation).
#[derive(Debug)]
pub(crate) struct TreeJoinPlan {
    /// The root table: the type of each key value.
    root: Table,
    /// The root's key values.
    key: KeyRange<Slot>,
    /// Root first.
    levels: Vec<Level>,
    schema: SchemaRef,
    /// Each output column: its level and its position in that level's batch.
    out: Vec<(usize, usize)>,
}

/// One table of the chain.
#[derive(Debug)]
struct Level {
    /// Its key columns first, then the output columns it gives.
    request: ScanRequest,
    schema: SchemaRef,
    /// How many key columns lead `request.columns`.
    keys: usize,
}

/// A table of the FROM clause and the names that may qualify its columns.
type Named<'a> = (&'a Table, Vec<String>);

/// Plans a query for [`run_tree_join`], or `None` if it is not of the form
/// the module documentation gives.
pub(crate) fn plan_tree_join(catalog: &Catalog, stmt: &ast::Statement) -> Option<TreeJoinPlan> {
    let (q, s, from, selection) = select_from_where(stmt)?;
    if from.joins.is_empty() || !q.locks.is_empty() {
        return None;
    }
    let alone = |relation: &ast::TableFactor| {
        single_table(
            catalog,
            &ast::TableWithJoins {
                relation: relation.clone(),
                joins: Vec::new(),
            },
        )
    };
    let mut tables: Vec<Named> = vec![alone(&from.relation)?];
    let mut ons = Vec::new();
    for j in &from.joins {
        let on = match &j.join_operator {
            ast::JoinOperator::Join(ast::JoinConstraint::On(e))
            | ast::JoinOperator::Inner(ast::JoinConstraint::On(e)) => e,
            _ => return None,
        };
        if j.global {
            return None;
        }
        tables.push(alone(&j.relation)?);
        ons.push(on);
    }
    let mut quals: Vec<&String> = tables.iter().flat_map(|(_, q)| q).collect();
    quals.sort_unstable();
    if quals.windows(2).any(|w| w[0] == w[1]) {
        return None;
    }
    // The chain: each table's key extends the one before it, and its ON
    // equates exactly the shared key columns.
    let key_positions = |t: &Table| -> Option<Vec<usize>> {
        t.primary_key
            .iter()
            .map(|k| t.column_index(&k.name))
            .collect()
    };
    let keys: Vec<Vec<usize>> = tables
        .iter()
        .map(|(t, _)| key_positions(t))
        .collect::<Option<_>>()?;
    for (i, on) in ons.iter().enumerate() {
        let (parent, child) = (i, i + 1);
        let (pt, ct) = (tables[parent].0, tables[child].0);
        let shared = keys[parent].len();
        if keys[child].len() <= shared {
            return None;
        }
        for (p, c) in keys[parent].iter().zip(&keys[child]) {
            if !joinable(&pt.columns[*p].data_type, &ct.columns[*c].data_type) {
                return None;
            }
        }
        let mut seen = vec![false; shared];
        let mut parts = Vec::new();
        conjuncts(on, &mut parts);
        for eq in parts {
            let ast::Expr::BinaryOp {
                left,
                op: ast::BinaryOperator::Eq,
                right,
            } = eq
            else {
                return None;
            };
            let (l, r) = (resolve(&tables, left)?, resolve(&tables, right)?);
            let ((_, pc), (_, cc)) = match (l, r) {
                (l, r) if l.0 == parent && r.0 == child => (l, r),
                (l, r) if l.0 == child && r.0 == parent => (r, l),
                _ => return None,
            };
            let j = keys[parent].iter().position(|k| *k == pc)?;
            if keys[child][j] != cc || seen[j] {
                return None;
            }
            seen[j] = true;
        }
        if seen.contains(&false) {
            return None;
        }
    }
    // WHERE: the root's full key; a bare name must be the root's alone
    // (one that more tables have is ambiguous: the general path's error).
    if !bare_names_are_roots(&tables, selection) {
        return None;
    }
    let (root, root_quals) = (tables[0].0, &tables[0].1);
    let key = match_point_key(root, root_quals, Some(selection))?;
    // Output columns.
    let mut out: Vec<((usize, usize), String)> = Vec::new();
    for item in &s.projection {
        match item {
            ast::SelectItem::UnnamedExpr(e) => {
                let (level, c) = resolve(&tables, e)?;
                out.push(((level, c), tables[level].0.columns[c].name.clone()));
            }
            ast::SelectItem::ExprWithAlias { expr, alias } => {
                out.push((resolve(&tables, expr)?, fold_ident(alias)));
            }
            _ => return None,
        }
    }
    let mut names: Vec<&str> = out.iter().map(|(_, n)| n.as_str()).collect();
    names.sort_unstable();
    if names.windows(2).any(|w| w[0] == w[1]) {
        return None;
    }
    let mut levels = Vec::with_capacity(tables.len());
    // Each output column's position in its level's batch, in SELECT order.
    let mut position = vec![0; out.len()];
    for (level, (table, _)) in tables.iter().enumerate() {
        let mut columns = keys[level].clone();
        for (item, ((l, c), _)) in out.iter().enumerate() {
            if *l == level {
                position[item] = columns.len();
                columns.push(*c);
            }
        }
        let full = table_schema(table, true);
        let fields: Vec<Field> = columns
            .iter()
            .enumerate()
            .map(|(i, c)| full.field(*c).as_ref().clone().with_name(format!("{i}")))
            .collect();
        let chain = catalog.ancestry(&table.name).ok()?;
        levels.push(Level {
            request: ScanRequest {
                alone: chain.len() == 1 && !catalog.has_interleaved(&table.name),
                chain: chain.into_iter().cloned().collect(),
                ranges: Vec::new(),
                columns,
                limit: None,
                filter: None,
            },
            schema: Arc::new(Schema::new(fields)),
            keys: keys[level].len(),
        });
    }
    let fields: Vec<Field> = out
        .iter()
        .map(|((l, c), name)| {
            table_schema(tables[*l].0, true)
                .field(*c)
                .as_ref()
                .clone()
                .with_name(name)
        })
        .collect();
    Some(TreeJoinPlan {
        root: root.clone(),
        key,
        levels,
        schema: Arc::new(Schema::new(fields)),
        out: out
            .iter()
            .zip(position)
            .map(|(((l, _), _), p)| (*l, p))
            .collect(),
    })
}

/// Whether key columns of types `a` and `b` join by identity of values.
fn joinable(a: &DataType, b: &DataType) -> bool {
    matches!(
        (a, b),
        (DataType::Int64, DataType::Int64)
            | (DataType::String(_), DataType::String(_))
            | (DataType::Bytes(_), DataType::Bytes(_))
            | (DataType::Bool, DataType::Bool)
            | (DataType::Date, DataType::Date)
            | (DataType::Timestamp, DataType::Timestamp)
            | (DataType::Numeric, DataType::Numeric)
    )
}

/// The table (by position) and column a reference names: `q.c` by its
/// qualifier, a bare `c` if exactly one table has that column.
fn resolve(tables: &[Named], e: &ast::Expr) -> Option<(usize, usize)> {
    let visible = |t: &Table, name: &str| t.column_index(name).filter(|i| !t.columns[*i].hidden);
    match e {
        ast::Expr::Identifier(i) => {
            let name = fold_ident(i);
            let mut found = tables
                .iter()
                .enumerate()
                .filter_map(|(l, (t, _))| visible(t, &name).map(|c| (l, c)));
            let first = found.next()?;
            found.next().is_none().then_some(first)
        }
        ast::Expr::CompoundIdentifier(parts) => match parts.as_slice() {
            [q, c] => {
                let q = fold_ident(q);
                let (l, (t, _)) = tables
                    .iter()
                    .enumerate()
                    .find(|(_, (_, quals))| quals.contains(&q))?;
                Some((l, visible(t, &fold_ident(c))?))
            }
            _ => None,
        },
        ast::Expr::Nested(inner) => resolve(tables, inner),
        _ => None,
    }
}

/// Whether every bare column name in `e` is the root table's alone.
fn bare_names_are_roots(tables: &[Named], e: &ast::Expr) -> bool {
    match e {
        ast::Expr::BinaryOp { left, right, .. } => {
            bare_names_are_roots(tables, left) && bare_names_are_roots(tables, right)
        }
        ast::Expr::Nested(inner) => bare_names_are_roots(tables, inner),
        ast::Expr::Identifier(_) => resolve(tables, e).is_some_and(|(l, _)| l == 0),
        _ => true,
    }
}

/// Runs a [`TreeJoinPlan`] made against `catalog` with `params`; `None`
/// when the parameters do not suit the fast path.
pub(crate) fn run_tree_join(
    ctx: &StatementContext,
    catalog: &Catalog,
    plan: &TreeJoinPlan,
    params: &[Value],
) -> Result<Option<Output>> {
    let empty = || {
        Ok(Some(Output::Rows {
            schema: plan.schema.clone(),
            batches: Vec::new(),
        }))
    };
    let eq = match plan.key.resolve(&plan.root, params) {
        None => return Ok(None),
        Some(KeyRange::Nothing) => return empty(),
        Some(KeyRange::Scan { eq, .. }) => eq,
    };
    let mut batches = Vec::with_capacity(plan.levels.len());
    {
        let txn = ctx.lock()?;
        for level in &plan.levels {
            let chain: Vec<&Table> = level.request.chain.iter().collect();
            let Some((start, end)) = scan_bounds(catalog, &chain, &eq, None, None) else {
                return Ok(None);
            };
            match crate::provider::scan_range_batch(
                &txn,
                &level.request,
                &level.schema,
                &start,
                end.as_deref(),
                crate::fastpath::INLINE_SCAN_ENTRIES,
            )? {
                Some(b) => batches.push(b),
                None => return empty(),
            }
        }
    }
    // Each result row as its row number at every level so far.
    let mut rows: Vec<Vec<u32>> = (0..batches[0].num_rows())
        .filter(|r| key_of(&batches[0], *r, plan.levels[0].keys).is_some())
        .map(|r| vec![r as u32])
        .collect();
    for level in 1..batches.len() {
        let (parent, batch) = (&batches[level - 1], &batches[level]);
        let shared = plan.levels[level - 1].keys;
        let mut by_key: HashMap<Vec<ScalarValue>, usize> = HashMap::with_capacity(rows.len());
        for (i, chain) in rows.iter().enumerate() {
            if let Some(k) = key_of(parent, chain[level - 1] as usize, shared) {
                by_key.insert(k, i);
            }
        }
        let mut next = Vec::with_capacity(batch.num_rows());
        for r in 0..batch.num_rows() {
            // A NULL in the shared key columns joins no parent (the ON
            // compares them with `=`); one in the row's own key columns
            // matters only to the next level's ON, which compares them.
            let Some(prefix) = key_of(batch, r, shared) else {
                continue;
            };
            if let Some(&i) = by_key.get(&prefix) {
                let mut chain = rows[i].clone();
                chain.push(r as u32);
                next.push(chain);
            }
        }
        rows = next;
    }
    if rows.is_empty() {
        return empty();
    }
    let mut arrays: Vec<ArrayRef> = Vec::with_capacity(plan.out.len());
    let indices: Vec<UInt32Array> = (0..batches.len())
        .map(|l| rows.iter().map(|c| c[l]).collect())
        .collect();
    for (level, pos) in &plan.out {
        let column = batches[*level].column(*pos);
        arrays.push(
            take(column, &indices[*level], None)
                .map_err(|e| Error::Internal(format!("row-tree join: {e}")))?,
        );
    }
    let batch = RecordBatch::try_new(plan.schema.clone(), arrays)
        .map_err(|e| Error::Internal(format!("row-tree join batch: {e}")))?;
    Ok(Some(Output::Rows {
        schema: plan.schema.clone(),
        batches: vec![batch],
    }))
}

/// The first `n` columns of row `r` (its key columns), or `None` if one is
/// NULL (a NULL key joins nothing).
fn key_of(batch: &RecordBatch, r: usize, n: usize) -> Option<Vec<ScalarValue>> {
    (0..n)
        .map(|c| {
            ScalarValue::try_from_array(batch.column(c), r)
                .ok()
                .filter(|v| !v.is_null())
        })
        .collect()
}
