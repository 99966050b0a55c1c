//! The fast path for a join whose every table is read by a key prefix the
//! statement fixes (by a WHERE value, or by the values of rows read
//! before it): a row tree read with one statement (inner joins down a
//! chain of interleaved tables, the root's key fixed), and the same rows
//! kept in separate tables, each read through its own key or an index.
//! Each table's part is one range — of its key, or of an index's entries —
//! read as the single-table fast path reads it; the rows are then joined
//! by the `ON` equalities, without DataFusion:
//!
//! ```text
//! SELECT c.name, o.o_id, l.qty
//!   FROM customers c
//!   JOIN orders o ON o.c_id = c.c_id
//!   JOIN lines l  ON l.c_id = o.c_id AND l.o_id = o.o_id
//!  WHERE c.c_id = $1
//!
//!  constants: c.c_id = $1, so o.c_id = $1 (ON), so l.c_id = $1 (ON)
//!
//!  interleaved (keys (c_id), (c_id, o_id), (c_id, o_id, l_id)):
//!   customers  key (c_id = $1)           → 1 row   ┐
//!   orders     key (c_id = $1, …)        → 5 rows  ├ hash join on each ON,
//!   lines      key (c_id = $1, …)        → 20 rows ┘ one output row per
//!                                                    joined lines row, in
//!  not interleaved (orders' key (o_id),              lines' read order
//!  index orders (c_id), lines' key (l_id), index lines (c_id)):
//!   customers  key (c_id = $1)           → 1 row
//!   orders     index entries (c_id = $1) → 5 rows, each fetched by key
//!   lines      index entries (c_id = $1) → 20 rows, each fetched by key
//! ```
//!
//! Interleaved, the three ranges lie inside the customer's row tree (the
//! scans jump over the other tables' entries).
//!
//! Matched exactly, or the general path runs the statement:
//! * `SELECT` of columns (each qualified, or a name only one table has),
//!   optionally aliased, with distinct output names; `FROM t0 JOIN t1 ON …
//!   JOIN t2 ON …` (plain or INNER joins, distinct qualifiers); optionally
//!   `ORDER BY` columns (qualified, or a bare name of an output column or of
//!   one table's column; ASC / DESC, NULLS FIRST / LAST, NULL sorting as the
//!   largest value as DataFusion's default has it) and `LIMIT n` (a
//!   literal or a parameter); nothing else (no OFFSET, DISTINCT, GROUP BY,
//!   locking).
//! * Each `ON` is a conjunction of `=` between a column of the table it
//!   joins and a column of a table before it, of the same type and one
//!   whose `=` is identity (no FLOAT64: `-0 = 0`).
//! * The `WHERE` is a conjunction of `column = value` (a literal of the
//!   column's type, or a parameter). A value spreads along the `ON`
//!   equalities to every column equal to that column (a column equal to
//!   two different values: the general path).
//! * Every table has a read narrowed by such values — a prefix of its
//!   key, or of an index's key (all of a NULL_FILTERED index's columns),
//!   chosen by the general path's cost estimates
//!   (`provider::key_read_cost`, `index_read_cost`) — or by the values of
//!   a table read before it, through an `ON` equality (an order's
//!   customer by the order's customer id: one read per distinct value;
//!   past [`MAX_LOOKUPS`] values the general path runs the statement).
//!
//! The tables are read and joined in this order: the first (in FROM
//! order) a WHERE value narrows; then, of the tables joined by an `ON` to
//! one read already, the first a WHERE value narrows, else the first the
//! rows read so far narrow; else the first a WHERE value narrows (a cross
//! product of narrowed reads). A chain of interleaved tables keeps its
//! FROM order:
//!
//! ```text
//! SELECT c.name, o.amount FROM customers c JOIN orders o ON o.c_id = c.c_id
//!  WHERE o.o_id = $1                                   (not interleaved)
//!   orders     key (o_id = $1)            → 1 row, c_id = 7
//!   customers  key (c_id = 7)             → 1 row, joined on c_id
//! ```
//!
//! The contract of the fast path holds: the answer is the general path's.
//! Every output row satisfies each `WHERE` value on each column it
//! spread to, so narrowing a read by it drops no output row; every `ON`
//! equality is then checked by the hash join (a NULL joins nothing) and
//! every `WHERE` condition a read did not apply is checked on the rows
//! read. A read narrowed by earlier rows' values reads, for each output
//! row, the range holding its rows (a NULL value reads nothing: it joins
//! nothing). A row of a later table joins every earlier combination its `ON`
//! values match. With ORDER BY the joined rows are sorted by Arrow's
//! `lexsort_to_indices` (the kernel DataFusion's sort uses; the first
//! `limit` only, with a LIMIT; ties in no promised order). Without it,
//! rows come in the last table's read order (for a chain of interleaved
//! tables, its key order: the order of the general path's hash joins,
//! which stream that table as the probe side; SQL promises no order
//! without ORDER BY), and a LIMIT keeps the first rows of that order. The reads recorded for validation are the
//! ranges scanned (and each fetched row's key); a range with no row ends
//! the statement (the answer is empty whatever the later tables hold).

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, UInt32Array};
use datafusion::arrow::compute::{
    concat_batches, lexsort_to_indices, take, SortColumn, SortOptions,
};
use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::ScalarValue;
use datafusion::sql::sqlparser::ast;
use smallvec::SmallVec;
use spindle_catalog::{Catalog, Table};
use spindle_keys::{DataType, Value};

use crate::error::{Error, Result};
use crate::fastpath::{
    conjuncts, same_key_type, scan_bounds, select_from_where, single_table, Slot,
};
use crate::index::IndexPlan;
use crate::parser::fold_ident;
use crate::provider::ScanRequest;
use crate::session::{Output, StatementContext};
use crate::types::table_schema;

/// Most reads of one table narrowed by earlier rows' values: past it the
/// statement takes the general path (whose hash join reads the table
/// once), as the outer side is no longer a handful of rows.
const MAX_LOOKUPS: usize = 1024;

/// A planned join (see the module documentation).
#[derive(Debug)]
pub(crate) struct TreeJoinPlan {
    /// In FROM order.
    levels: Vec<Level>,
    schema: SchemaRef,
    /// Each output column: its level and its position in that level's batch.
    out: Vec<(usize, usize)>,
    /// ORDER BY: each key's level, position in that level's batch, and
    /// direction.
    order: Vec<(usize, usize, SortOptions)>,
    /// LIMIT: a non-negative INT64 literal or a parameter.
    limit: Option<Slot>,
}

/// One table of the join.
#[derive(Debug)]
struct Level {
    read: Read,
    /// The values of the read's leading key columns.
    eq: Vec<Source>,
    /// Whose key `eq` is over: the table, or the index's virtual table.
    key_table: Table,
    /// The columns the level's batch holds (fields named by position).
    schema: SchemaRef,
    /// Each `ON` equality with an earlier level: (that level, the column's
    /// position in its batch, the position in this one).
    on: Vec<(usize, usize, usize)>,
    /// `WHERE` values the read does not apply: (position in the batch,
    /// the column's type, the value).
    checks: Vec<(usize, DataType, Slot)>,
}

/// How a level's rows are read.
#[derive(Debug, Clone)]
enum Read {
    /// The table's own key range (rows of other tables in its row trees
    /// jumped over).
    Key(ScanRequest),
    /// An index's entries in the range: the batch decoded from the
    /// entries (`base: None`, the index covers the columns), or each
    /// entry's row read by key (`base`: the table's chain and columns;
    /// `entries` then names the table's key columns in an entry).
    Index {
        entries: ScanRequest,
        base: Option<ScanRequest>,
    },
}

/// Where the value of a read's key column comes from.
#[derive(Debug, Clone)]
enum Source {
    /// A value of the WHERE (spread along the `ON` equalities).
    Value(Slot),
    /// An `ON` equality with a column of an earlier level: (that level,
    /// the column's position in its batch). The table is read once for
    /// each distinct value the rows joined so far hold there.
    Row(usize, usize),
}

/// A table of the FROM clause and the names that may qualify its columns.
type Named<'a> = (&'a Table, Vec<String>);

/// A column: its level and its position in that table's columns.
type Col = (usize, usize);

/// Classes of columns equal by the `ON` equalities (union-find).
#[derive(Default)]
struct Classes {
    parent: HashMap<Col, Col>,
}

impl Classes {
    fn find(&self, mut c: Col) -> Col {
        while let Some(p) = self.parent.get(&c) {
            c = *p;
        }
        c
    }

    fn union(&mut self, a: Col, b: Col) {
        let (ra, rb) = (self.find(a), self.find(b));
        if ra != rb {
            self.parent.insert(ra, rb);
        }
    }
}

/// Whether two slots are the same value whatever the parameters.
fn same_slot(a: &Slot, b: &Slot) -> bool {
    match (a, b) {
        (Slot::Param(x), Slot::Param(y)) => x == y,
        (Slot::Value(x), Slot::Value(y)) => {
            x == y && std::mem::discriminant(x) == std::mem::discriminant(y)
        }
        _ => false,
    }
}

/// Plans a query for [`run_tree_join`], or `None` if it is not of the form
/// the module documentation gives.
pub(crate) fn plan_tree_join(catalog: &Catalog, stmt: &ast::Statement) -> Option<TreeJoinPlan> {
    // ORDER BY and LIMIT apart, the query must be a plain SELECT … FROM …
    // WHERE.
    let ast::Statement::Query(query) = stmt else {
        return None;
    };
    let mut bare = query.clone();
    let order_by = bare.order_by.take();
    let limit_clause = bare.limit_clause.take();
    let bare = ast::Statement::Query(bare);
    let (q, s, from, selection) = select_from_where(&bare)?;
    let limit = match &limit_clause {
        None => None,
        Some(ast::LimitClause::LimitOffset {
            limit: Some(e),
            offset: None,
            limit_by,
        }) if limit_by.is_empty() => match Slot::of(e)? {
            Slot::Value(Value::Int64(n)) if n >= 0 => Some(Slot::Value(Value::Int64(n))),
            Slot::Param(i) => Some(Slot::Param(i)),
            _ => return None,
        },
        _ => return None,
    };
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
    let column = |(l, c): Col| &tables[l].0.columns[c];
    // ON: equalities between the joined table and one before it.
    let mut classes = Classes::default();
    let mut joins: Vec<(Col, Col)> = Vec::new();
    for (i, on) in ons.iter().enumerate() {
        let level = i + 1;
        for (left, right) in equalities(on)? {
            let (l, r) = (resolve(&tables, left)?, resolve(&tables, right)?);
            let (earlier, this) = match (l, r) {
                (l, r) if r.0 == level && l.0 < level => (l, r),
                (l, r) if l.0 == level && r.0 < level => (r, l),
                _ => return None,
            };
            if !joinable(&column(earlier).data_type, &column(this).data_type) {
                return None;
            }
            joins.push((earlier, this));
            classes.union(earlier, this);
        }
    }
    // WHERE: `column = value`; each class holds at most one value.
    let mut wheres: Vec<(Col, Slot)> = Vec::new();
    for (left, right) in equalities(selection)? {
        let (col, value) = match (resolve(&tables, left), resolve(&tables, right)) {
            (Some(c), None) => (c, right),
            (None, Some(c)) => (c, left),
            _ => return None,
        };
        let slot = Slot::of(value)?;
        match &slot {
            Slot::Now => return None,
            Slot::Value(v) if !v.is_null() && !same_key_type(v, &column(col).data_type) => {
                return None
            }
            _ => {}
        }
        wheres.push((col, slot));
    }
    let mut values: HashMap<Col, Slot> = HashMap::new();
    for (col, slot) in &wheres {
        match values.entry(classes.find(*col)) {
            std::collections::hash_map::Entry::Occupied(o) if !same_slot(o.get(), slot) => {
                return None
            }
            std::collections::hash_map::Entry::Occupied(_) => {}
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(slot.clone());
            }
        }
    }
    let fixed = |c: Col| values.get(&classes.find(c));
    // Output columns.
    let mut out: Vec<(Col, String)> = Vec::new();
    for item in &s.projection {
        match item {
            ast::SelectItem::UnnamedExpr(e) => {
                let c = resolve(&tables, e)?;
                out.push((c, column(c).name.clone()));
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
    // ORDER BY columns: qualified, or a bare name of an output column or
    // of one table's column (both: the same column).
    let mut order: Vec<(Col, SortOptions)> = Vec::new();
    if let Some(ob) = &order_by {
        let ast::OrderByKind::Expressions(exprs) = &ob.kind else {
            return None;
        };
        if ob.interpolate.is_some() {
            return None;
        }
        for e in exprs {
            if e.with_fill.is_some() {
                return None;
            }
            let col = match &e.expr {
                ast::Expr::Identifier(i) => {
                    let name = fold_ident(i);
                    let outs: Vec<Col> = out
                        .iter()
                        .filter(|(_, n)| *n == name)
                        .map(|(c, _)| *c)
                        .collect();
                    match (outs.as_slice(), resolve(&tables, &e.expr)) {
                        ([c], None) => *c,
                        ([c], Some(t)) if *c == t => t,
                        ([], Some(t)) => t,
                        _ => return None,
                    }
                }
                ast::Expr::CompoundIdentifier(_) => resolve(&tables, &e.expr)?,
                _ => return None,
            };
            // DataFusion's default null ordering: NULL sorts as the
            // largest value.
            let descending = e.options.asc == Some(false);
            order.push((
                col,
                SortOptions {
                    descending,
                    nulls_first: e.options.nulls_first.unwrap_or(descending),
                },
            ));
        }
    }
    // Each table: the columns its batch holds.
    let mut needed: Vec<Vec<usize>> = vec![Vec::new(); tables.len()];
    let cols = out
        .iter()
        .map(|(c, _)| *c)
        .chain(joins.iter().flat_map(|(a, b)| [*a, *b]))
        .chain(wheres.iter().map(|(c, _)| *c))
        .chain(order.iter().map(|(c, _)| *c));
    for (l, c) in cols {
        if !needed[l].contains(&c) {
            needed[l].push(c);
        }
    }
    // The order the tables are read and joined in: the first one (in FROM
    // order) a WHERE value narrows, then, of those joined to one already
    // placed, the first a WHERE value narrows, else the first the placed
    // rows' values narrow; else the first a WHERE value narrows. A chain of
    // interleaved tables keeps its FROM order.
    let mut placed: Vec<(usize, Read, Vec<Source>, Table)> = Vec::with_capacity(tables.len());
    let level_of = |placed: &[(usize, Read, Vec<Source>, Table)], t: usize| {
        placed.iter().position(|(p, ..)| *p == t)
    };
    while placed.len() < tables.len() {
        let unplaced: Vec<usize> = (0..tables.len())
            .filter(|t| level_of(&placed, *t).is_none())
            .collect();
        let joined = |t: usize| {
            joins.iter().any(|((a, _), (b, _))| {
                (*a == t && level_of(&placed, *b).is_some())
                    || (*b == t && level_of(&placed, *a).is_some())
            })
        };
        let by_values = |t: usize| {
            choose_read(catalog, tables[t].0, &needed[t], |c| {
                fixed((t, c)).map(|s| Source::Value(s.clone()))
            })
        };
        let by_rows = |t: usize| {
            choose_read(catalog, tables[t].0, &needed[t], |c| {
                if let Some(s) = fixed((t, c)) {
                    return Some(Source::Value(s.clone()));
                }
                // A column equal (ON) to one of a placed table.
                joins.iter().find_map(|(a, b)| {
                    let other = if *a == (t, c) {
                        b
                    } else if *b == (t, c) {
                        a
                    } else {
                        return None;
                    };
                    let level = level_of(&placed, other.0)?;
                    let pos = needed[other.0].iter().position(|x| *x == other.1)?;
                    Some(Source::Row(level, pos))
                })
            })
        };
        let pick = unplaced
            .iter()
            .filter(|t| placed.is_empty() || joined(**t))
            .find_map(|t| by_values(*t).map(|r| (*t, r)))
            .or_else(|| {
                unplaced
                    .iter()
                    .filter(|t| joined(**t))
                    .find_map(|t| by_rows(*t).map(|r| (*t, r)))
            })
            .or_else(|| unplaced.iter().find_map(|t| by_values(*t).map(|r| (*t, r))));
        let (t, (read, eq, key_table)) = pick?;
        placed.push((t, read, eq, key_table));
    }
    let level_of = |t: usize| level_of(&placed, t);
    let mut levels = Vec::with_capacity(tables.len());
    for (level, (t, read, eq, key_table)) in placed.iter().enumerate() {
        let table = tables[*t].0;
        let columns = &needed[*t];
        let pos = |c: usize| columns.iter().position(|x| *x == c);
        // The WHERE values the read did not apply.
        let applied: Vec<usize> = key_table.primary_key[..eq.len()]
            .iter()
            .filter_map(|k| table.column_index(&k.name))
            .collect();
        let checks = wheres
            .iter()
            .filter(|((l, c), _)| l == t && !applied.contains(c))
            .map(|((_, c), slot)| {
                Some((pos(*c)?, table.columns[*c].data_type.clone(), slot.clone()))
            })
            .collect::<Option<Vec<_>>>()?;
        // The ON equalities with tables placed before this one.
        let mut on = Vec::new();
        for (a, b) in &joins {
            let (this, other) = match (a, b) {
                (a, b) if a.0 == *t => (a, b),
                (a, b) if b.0 == *t => (b, a),
                _ => continue,
            };
            let Some(other_level) = level_of(other.0).filter(|l| *l < level) else {
                continue;
            };
            let other_pos = needed[other.0].iter().position(|x| *x == other.1)?;
            on.push((other_level, other_pos, pos(this.1)?));
        }
        let full = table_schema(table, true);
        let fields: Vec<Field> = columns
            .iter()
            .enumerate()
            .map(|(i, c)| full.field(*c).as_ref().clone().with_name(format!("{i}")))
            .collect();
        levels.push(Level {
            read: read.clone(),
            eq: eq.clone(),
            key_table: key_table.clone(),
            schema: Arc::new(Schema::new(fields)),
            on,
            checks,
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
    let out = out
        .iter()
        .map(|((t, c), _)| Some((level_of(*t)?, needed[*t].iter().position(|x| x == c)?)))
        .collect::<Option<Vec<_>>>()?;
    let order = order
        .iter()
        .map(|((t, c), options)| {
            Some((
                level_of(*t)?,
                needed[*t].iter().position(|x| x == c)?,
                *options,
            ))
        })
        .collect::<Option<Vec<_>>>()?;
    Some(TreeJoinPlan {
        levels,
        schema: Arc::new(Schema::new(fields)),
        out,
        order,
        limit,
    })
}

/// A read [`choose_read`] weighs: its estimated cost, the index (and
/// whether it covers the columns; `None`: the table's key), the values of
/// its leading key columns.
type Candidate = (f64, Option<(IndexPlan, bool)>, Vec<Source>);

/// The cheapest read of `table`'s rows narrowed by fixed values (`fixed`
/// of a column position): a prefix of its key, or of an index's key, by
/// the general path's estimates; its leading values and the table they
/// key. `None` when no read is narrowed.
fn choose_read(
    catalog: &Catalog,
    table: &Table,
    columns: &[usize],
    fixed: impl Fn(usize) -> Option<Source>,
) -> Option<(Read, Vec<Source>, Table)> {
    let prefix = |key: &[spindle_catalog::KeyColumn]| -> Vec<Source> {
        key.iter()
            .map_while(|k| {
                let c = table.column_index(&k.name)?;
                if table.columns[c].hidden {
                    return None;
                }
                fixed(c)
            })
            .collect()
    };
    let chain = catalog.ancestry(&table.name).ok()?;
    let has_row_trees = catalog.has_interleaved(&table.name);
    let rows = ScanRequest {
        alone: chain.len() == 1 && !has_row_trees,
        chain: chain.into_iter().cloned().collect(),
        ranges: Vec::new(),
        columns: columns.to_vec(),
        limit: None,
        filter: None,
    };
    let eq = prefix(&table.primary_key);
    let mut best: Option<Candidate> = (!eq.is_empty()).then(|| {
        let cost = crate::provider::key_read_cost(table.primary_key.len(), eq.len(), has_row_trees);
        (cost, None, eq)
    });
    for index in catalog.table_indexes(&table.name) {
        if index.row_copy {
            continue;
        }
        let ip = IndexPlan::new(catalog, index).ok()?;
        let vt = ip.virtual_table();
        let eq = prefix(&vt.primary_key);
        if eq.is_empty() || (index.null_filtered && eq.len() < index.columns.len()) {
            continue;
        }
        let covering = columns
            .iter()
            .all(|c| vt.column(&table.columns[*c].name).is_some());
        let cost = crate::provider::index_read_cost(&ip, eq.len(), 0, covering);
        if best.as_ref().is_none_or(|(b, _, _)| cost < *b) {
            best = Some((cost, Some((ip, covering)), eq));
        }
    }
    let (_, index, eq) = best?;
    let Some((ip, covering)) = index else {
        return Some((Read::Key(rows), eq, table.clone()));
    };
    let vt = ip.virtual_table().clone();
    let in_entry = |names: &mut dyn Iterator<Item = &str>| -> Option<Vec<usize>> {
        names.map(|n| vt.column_index(n)).collect()
    };
    let entry_columns = if covering {
        in_entry(&mut columns.iter().map(|c| table.columns[*c].name.as_str()))?
    } else {
        in_entry(&mut table.primary_key.iter().map(|k| k.name.as_str()))?
    };
    let entries = ScanRequest {
        // A global index's entries are alone in their key space.
        alone: ip.chain.len() == 1,
        chain: ip.chain,
        ranges: Vec::new(),
        columns: entry_columns,
        limit: None,
        filter: None,
    };
    let base = (!covering).then_some(rows);
    Some((Read::Index { entries, base }, eq, vt))
}

/// The two sides of each `=` of a conjunction; `None` if a conjunct is
/// anything else.
fn equalities(e: &ast::Expr) -> Option<Vec<(&ast::Expr, &ast::Expr)>> {
    let mut parts = Vec::new();
    conjuncts(e, &mut parts);
    parts
        .into_iter()
        .map(|p| match p {
            ast::Expr::BinaryOp {
                left,
                op: ast::BinaryOperator::Eq,
                right,
            } => Some((left.as_ref(), right.as_ref())),
            _ => None,
        })
        .collect()
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
    // Every value first: one of another type takes the general path before
    // anything is read; a NULL one matches nothing.
    let mut nothing = false;
    let mut values: Vec<Vec<Option<Value>>> = Vec::with_capacity(plan.levels.len());
    let mut checks: Vec<Vec<(usize, Value)>> = Vec::with_capacity(plan.levels.len());
    let mut value = |slot: &Slot, ty: &DataType| -> Option<Value> {
        let v = slot.resolve(params)?;
        if v.is_null() {
            nothing = true;
        } else if !same_key_type(&v, ty) {
            return None;
        }
        Some(v)
    };
    for level in &plan.levels {
        let mut these = Vec::with_capacity(level.eq.len());
        for (source, k) in level.eq.iter().zip(&level.key_table.primary_key) {
            these.push(match source {
                Source::Value(slot) => {
                    let Some(ty) = level.key_table.column(&k.name).map(|c| &c.data_type) else {
                        return Ok(None);
                    };
                    let Some(v) = value(slot, ty) else {
                        return Ok(None);
                    };
                    Some(v)
                }
                Source::Row(..) => None,
            });
        }
        values.push(these);
        let mut these = Vec::with_capacity(level.checks.len());
        for (pos, ty, slot) in &level.checks {
            let Some(v) = value(slot, ty) else {
                return Ok(None);
            };
            these.push((*pos, v));
        }
        checks.push(these);
    }
    let limit = match &plan.limit {
        None => None,
        Some(slot) => match slot.resolve(params) {
            Some(Value::Int64(n)) if n >= 0 => Some(usize::try_from(n).unwrap_or(usize::MAX)),
            _ => return Ok(None),
        },
    };
    if nothing || limit == Some(0) {
        return empty();
    }
    let txn = ctx.lock()?;
    let mut batches: Vec<RecordBatch> = Vec::with_capacity(plan.levels.len());
    // Each result row as its row number at every level so far.
    let mut rows: Vec<Vec<u32>> = Vec::new();
    for (level, plan_level) in plan.levels.iter().enumerate() {
        // The key prefixes to read: one, or one per distinct value of the
        // rows joined so far (a NULL among them joins nothing).
        let mut prefixes: Vec<Vec<Value>> = Vec::new();
        if values[level].iter().all(Option::is_some) {
            prefixes.push(values[level].iter().flatten().cloned().collect());
        } else {
            let mut seen = std::collections::BTreeSet::new();
            for chain in &rows {
                let prefix = plan_level
                    .eq
                    .iter()
                    .zip(&values[level])
                    .map(|(source, v)| match (source, v) {
                        (_, Some(v)) => Ok(Some(v.clone())),
                        (Source::Row(l, p), None) => {
                            let v = crate::types::array_value(
                                batches[*l].column(*p).as_ref(),
                                chain[*l] as usize,
                            )?;
                            Ok((!v.is_null()).then_some(v))
                        }
                        (Source::Value(_), None) => Ok(None),
                    })
                    .collect::<Result<Option<Vec<Value>>>>()?;
                if let Some(prefix) = prefix {
                    if seen.insert(prefix.clone()) {
                        prefixes.push(prefix);
                    }
                }
                if prefixes.len() > MAX_LOOKUPS {
                    return Ok(None);
                }
            }
        }
        let mut read = Vec::with_capacity(prefixes.len());
        for prefix in &prefixes {
            match read_level(&txn, catalog, plan_level, prefix)? {
                None => return Ok(None),
                Some(Some(b)) => read.push(b),
                Some(None) => {}
            }
        }
        let batch = if read.len() > 1 {
            concat_batches(&plan_level.schema, &read)
                .map_err(|e| Error::Internal(format!("join fast path: {e}")))?
        } else if let Some(b) = read.pop() {
            b
        } else {
            return empty();
        };
        batches.push(batch);
        let batch = &batches[level];
        let passes = |r: usize| -> Result<bool> {
            for (pos, v) in &checks[level] {
                let got = crate::types::array_value(batch.column(*pos).as_ref(), r)?;
                if got.is_null() || got != *v {
                    return Ok(false);
                }
            }
            Ok(true)
        };
        if level == 0 {
            for r in 0..batch.num_rows() {
                if passes(r)? {
                    rows.push(vec![r as u32]);
                }
            }
        } else {
            let on = &plan_level.on;
            // The rows so far by their values of this level's ON columns
            // (a NULL joins nothing).
            let mut by_key: HashMap<Vec<ScalarValue>, SmallVec<[u32; 1]>> =
                HashMap::with_capacity(rows.len());
            for (i, chain) in rows.iter().enumerate() {
                let key = on
                    .iter()
                    .map(|(l, p, _)| cell(&batches[*l], chain[*l] as usize, *p))
                    .collect::<Option<Vec<_>>>();
                if let Some(key) = key {
                    by_key.entry(key).or_default().push(i as u32);
                }
            }
            let mut next = Vec::with_capacity(batch.num_rows());
            for r in 0..batch.num_rows() {
                let Some(key) = on
                    .iter()
                    .map(|(_, _, p)| cell(batch, r, *p))
                    .collect::<Option<Vec<_>>>()
                else {
                    continue;
                };
                let Some(matches) = by_key.get(&key) else {
                    continue;
                };
                if !passes(r)? {
                    continue;
                }
                for &i in matches {
                    let mut chain = Vec::with_capacity(level + 1);
                    chain.extend_from_slice(&rows[i as usize]);
                    chain.push(r as u32);
                    next.push(chain);
                }
            }
            rows = next;
        }
        if rows.is_empty() {
            return empty();
        }
    }
    drop(txn);
    if !plan.order.is_empty() {
        // Sorted (the first `limit` rows only, with a LIMIT).
        let mut keys = Vec::with_capacity(plan.order.len());
        for (level, pos, options) in &plan.order {
            let at: UInt32Array = rows.iter().map(|c| c[*level]).collect();
            keys.push(SortColumn {
                values: take(batches[*level].column(*pos), &at, None)
                    .map_err(|e| Error::Internal(format!("join fast path: {e}")))?,
                options: Some(*options),
            });
        }
        let sorted = lexsort_to_indices(&keys, limit)
            .map_err(|e| Error::Internal(format!("join fast path sort: {e}")))?;
        let mut unsorted = std::mem::take(&mut rows);
        rows = sorted
            .values()
            .iter()
            .map(|i| std::mem::take(&mut unsorted[*i as usize]))
            .collect();
    } else if let Some(n) = limit {
        rows.truncate(n);
    }
    let indices: Vec<UInt32Array> = (0..batches.len())
        .map(|l| rows.iter().map(|c| c[l]).collect())
        .collect();
    let mut arrays: Vec<ArrayRef> = Vec::with_capacity(plan.out.len());
    for (level, pos) in &plan.out {
        let column = batches[*level].column(*pos);
        arrays.push(
            take(column, &indices[*level], None)
                .map_err(|e| Error::Internal(format!("join fast path: {e}")))?,
        );
    }
    let batch = RecordBatch::try_new(plan.schema.clone(), arrays)
        .map_err(|e| Error::Internal(format!("join fast path batch: {e}")))?;
    Ok(Some(Output::Rows {
        schema: plan.schema.clone(),
        batches: vec![batch],
    }))
}

/// One read of `level`'s rows with `prefix` the values of its read's
/// leading key columns: `None` when the prefix cannot be encoded (take
/// the general path), `Some(None)` when no row is there.
fn read_level(
    txn: &spindle_txn::Transaction,
    catalog: &Catalog,
    level: &Level,
    prefix: &[Value],
) -> Result<Option<Option<RecordBatch>>> {
    let (Read::Key(request)
    | Read::Index {
        entries: request, ..
    }) = &level.read;
    let chain: Vec<&Table> = request.chain.iter().collect();
    let Some((start, end)) = scan_bounds(catalog, &chain, prefix, None, None) else {
        return Ok(None);
    };
    let inline = crate::fastpath::INLINE_SCAN_ENTRIES;
    Ok(Some(match &level.read {
        Read::Index {
            entries,
            base: Some(base),
        } => crate::provider::index_fetch_batch(
            txn,
            entries,
            base,
            &level.schema,
            &start,
            end.as_deref(),
            inline,
        )?,
        _ => crate::provider::scan_range_batch(
            txn,
            request,
            &level.schema,
            &start,
            end.as_deref(),
            inline,
        )?,
    }))
}

/// Row `r`'s value in column `c`, or `None` if it is NULL (which joins
/// nothing).
fn cell(batch: &RecordBatch, r: usize, c: usize) -> Option<ScalarValue> {
    ScalarValue::try_from_array(batch.column(c), r)
        .ok()
        .filter(|v| !v.is_null())
}
