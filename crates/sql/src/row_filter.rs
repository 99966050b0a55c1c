//! Row filters: a scan's simple predicates, tested on each stored row's
//! bytes before the row is decoded.
//!
//! DataFusion applies a query's filters to the batches a scan produces, so
//! every row the scan reads is decoded into Arrow first, also the ones the
//! filter then drops (Q3's lineitem scan decoded 10 000 rows of which 120
//! passed `l_shipdate > …`). A [`RowFilter`] holds the conjuncts of the
//! scan's filters that it can test on the stored bytes:
//!
//! ```text
//!   column op literal      op: = <> < <= > >=  (also literal op column)
//!   column BETWEEN a AND b (two comparisons)
//!   column IS NOT NULL
//! ```
//!
//! where the column is a key column (tested on its key bytes) or a stored
//! column (found with `keys::row::visit_row`, borrowed, not copied) of
//! type INT64, BOOL, DATE, TIMESTAMP or STRING, and the literal has
//! exactly the column's type (`provider::literal_value`; a literal that
//! would need a cast is left to DataFusion). FLOAT64 and NUMERIC are left
//! out: Arrow orders floats by `total_cmp`, and the filter must never
//! drop a row DataFusion would keep.
//!
//! Invariants:
//!
//! * **A filter only ever drops rows its predicates reject.** A NULL
//!   (absent column) fails every test, as in SQL; a stored value of an
//!   unexpected type passes (DataFusion decides). The filters stay
//!   `Inexact` to DataFusion, which applies them again to the rows that
//!   pass: a row filter is an optimization, never the only check.
//! * **A row is walked once.** The decoder (`provider::RowDecoder`) runs
//!   the tests in the same walk over the row that finds its projected
//!   values, keeps those (borrowed) until the row has passed, and appends
//!   them only then; an output wider than 16 columns walks a passing row
//!   twice (tests, then decoding).
//! * **A row filter that does not pay is turned off.** After
//!   [`PROBE_ROWS`] rows of a scan, a filter that kept more than
//!   [`KEEP_LIMIT_PERCENT`]% of them is dropped for the rest of that scan
//!   (Q1's `l_shipdate <= …` keeps about 98%).
//!
//! Measured (`pgbench -T 3`, analytics data at scale 0.1, two alternated
//! runs per binary): `SELECT * FROM lineitem WHERE l_shipdate <
//! '1992-02-01' AND l_returnflag = 'R'` 9.9 / 9.8 → 8.4 / 8.6 ms (server
//! CPU per query 17.1 / 16.8 → 14.8 / 15.3 ms); Q3 CPU 10.3 / 12.3 → 9.9 /
//! 10.8 ms.

use std::cmp::Ordering;

use datafusion::logical_expr::{BinaryExpr, Expr, Operator};
use spindle_catalog::Table;
use spindle_keys::row::RawValue;
use spindle_keys::{DataType, Value};

/// Rows a scan tests before deciding whether its row filter pays.
pub const PROBE_ROWS: usize = 1024;
/// A row filter that keeps more than this share of the probed rows is
/// turned off.
pub const KEEP_LIMIT_PERCENT: usize = 70;

/// A comparison operator of a test, normalized to `column op value`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cmp {
    Eq,
    NotEq,
    Lt,
    LtEq,
    Gt,
    GtEq,
}

impl Cmp {
    fn from_operator(op: Operator) -> Option<Cmp> {
        Some(match op {
            Operator::Eq => Cmp::Eq,
            Operator::NotEq => Cmp::NotEq,
            Operator::Lt => Cmp::Lt,
            Operator::LtEq => Cmp::LtEq,
            Operator::Gt => Cmp::Gt,
            Operator::GtEq => Cmp::GtEq,
            _ => return None,
        })
    }

    fn holds(self, o: Ordering) -> bool {
        match self {
            Cmp::Eq => o.is_eq(),
            Cmp::NotEq => o.is_ne(),
            Cmp::Lt => o.is_lt(),
            Cmp::LtEq => o.is_le(),
            Cmp::Gt => o.is_gt(),
            Cmp::GtEq => o.is_ge(),
        }
    }

    fn symbol(self) -> &'static str {
        match self {
            Cmp::Eq => "=",
            Cmp::NotEq => "<>",
            Cmp::Lt => "<",
            Cmp::LtEq => "<=",
            Cmp::Gt => ">",
            Cmp::GtEq => ">=",
        }
    }
}

/// Where a test finds its column's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// The n-th key column of the scanned table (its span in the key).
    Key(usize),
    /// A stored column, by column id.
    Stored(u32),
}

#[derive(Clone, Debug, PartialEq)]
enum Test {
    Cmp(Cmp, Value),
    NotNull,
}

#[derive(Clone, Debug, PartialEq)]
struct Cond {
    target: Target,
    test: Test,
}

/// The predicates a scan tests on stored rows (a conjunction).
#[derive(Clone, Debug, PartialEq)]
pub struct RowFilter {
    conds: Vec<Cond>,
    /// For a stored column id: whether a test reads it (indexed by id).
    stored: Vec<bool>,
    /// The tests, as EXPLAIN prints them.
    describe: Vec<String>,
}

impl RowFilter {
    /// The row filter of `filters` (conjuncts) over the rows of `table`
    /// (a table, or an index's virtual table); `None` if no conjunct can
    /// be tested on stored rows.
    pub fn plan(table: &Table, filters: &[&Expr]) -> Option<RowFilter> {
        let mut f = RowFilter {
            conds: Vec::new(),
            stored: Vec::new(),
            describe: Vec::new(),
        };
        for e in filters {
            f.add(table, e);
        }
        (!f.conds.is_empty()).then_some(f)
    }

    fn add(&mut self, table: &Table, e: &Expr) {
        match e {
            Expr::BinaryExpr(BinaryExpr {
                left,
                op: Operator::And,
                right,
            }) => {
                self.add(table, left);
                self.add(table, right);
            }
            Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
                let (column, op, lit) = match (left.as_ref(), right.as_ref()) {
                    (Expr::Column(c), Expr::Literal(l, _)) => (c, *op, l),
                    (Expr::Literal(l, _), Expr::Column(c)) => match op.swap() {
                        Some(o) => (c, o, l),
                        None => return,
                    },
                    _ => return,
                };
                let Some(cmp) = Cmp::from_operator(op) else {
                    return;
                };
                self.compare(table, &column.name, cmp, lit);
            }
            Expr::Between(b) if !b.negated => {
                if let (Expr::Column(c), Expr::Literal(lo, _), Expr::Literal(hi, _)) =
                    (b.expr.as_ref(), b.low.as_ref(), b.high.as_ref())
                {
                    self.compare(table, &c.name, Cmp::GtEq, lo);
                    self.compare(table, &c.name, Cmp::LtEq, hi);
                }
            }
            Expr::IsNotNull(inner) => {
                if let Expr::Column(c) = inner.as_ref() {
                    if let Some(target) = target(table, &c.name) {
                        self.push(target, Test::NotNull, format!("{} IS NOT NULL", c.name));
                    }
                }
            }
            _ => {}
        }
    }

    fn compare(
        &mut self,
        table: &Table,
        name: &str,
        cmp: Cmp,
        lit: &datafusion::common::ScalarValue,
    ) {
        let Some(column) = table.column(name) else {
            return;
        };
        if !matches!(
            column.data_type,
            DataType::Int64
                | DataType::Bool
                | DataType::Date
                | DataType::Timestamp
                | DataType::String(_)
        ) {
            return;
        }
        let Some(target) = target(table, name) else {
            return;
        };
        let ty = crate::types::arrow_type(&column.data_type);
        let Some(value) = crate::provider::literal_value(lit, &ty) else {
            return;
        };
        let text = format!(
            "{name} {} {}",
            cmp.symbol(),
            crate::provider::value_text(&value)
        );
        self.push(target, Test::Cmp(cmp, value), text);
    }

    fn push(&mut self, target: Target, test: Test, text: String) {
        if let Target::Stored(id) = target {
            let id = id as usize;
            if self.stored.len() <= id {
                self.stored.resize(id + 1, false);
            }
            self.stored[id] = true;
        }
        self.conds.push(Cond { target, test });
        self.describe.push(text);
    }

    /// The tests, for EXPLAIN (`o_orderdate < 1995-03-15 AND …`).
    pub fn describe(&self) -> String {
        self.describe.join(" AND ")
    }

    /// Whether the row passes every test. `key` is the row's key and
    /// `spans` its key columns' byte ranges in it (`Catalog::key_spans`),
    /// `value` its stored bytes; `seen` is a scratch buffer.
    pub fn keep(
        &self,
        key: &[u8],
        spans: &[(usize, usize)],
        value: &[u8],
        seen: &mut Vec<bool>,
    ) -> crate::Result<bool> {
        if !self.keep_key(key, spans, seen)? {
            return Ok(false);
        }
        if !self.tests_stored() {
            return Ok(true);
        }
        let mut pass = true;
        spindle_keys::row::visit_row(
            value,
            |id| self.wants(id),
            |id, v| {
                pass &= self.test(id, v, seen);
                Ok(())
            },
        )?;
        Ok(pass && self.all_seen(seen))
    }

    /// The key tests: whether the row's key columns pass them. Resets
    /// `seen` (one flag per test) and marks the key tests in it.
    pub fn keep_key(
        &self,
        key: &[u8],
        spans: &[(usize, usize)],
        seen: &mut Vec<bool>,
    ) -> crate::Result<bool> {
        seen.clear();
        seen.resize(self.conds.len(), false);
        for (i, c) in self.conds.iter().enumerate() {
            let Target::Key(k) = c.target else {
                continue;
            };
            let (a, b) = spans
                .get(k)
                .copied()
                .ok_or_else(|| crate::Error::Internal("key column beyond the row key".into()))?;
            let v = spindle_keys::key::decode_value(&key[a..b])?.0;
            let pass = match raw(&v) {
                _ if v.is_null() => false,
                Some(r) => c.test.passes(r),
                // A type the filter does not compare.
                None => true,
            };
            if !pass {
                return Ok(false);
            }
            seen[i] = true;
        }
        Ok(true)
    }

    /// Whether any test reads a key column.
    pub fn tests_keys(&self) -> bool {
        self.conds
            .iter()
            .any(|c| matches!(c.target, Target::Key(_)))
    }

    /// Whether any test reads a stored column.
    pub fn tests_stored(&self) -> bool {
        !self.stored.is_empty()
    }

    /// Whether a test reads stored column `id`.
    pub fn wants(&self, id: u32) -> bool {
        self.stored.get(id as usize).copied().unwrap_or(false)
    }

    /// Runs the tests of stored column `id` on its value `v` (the first
    /// one the row holds; a repeat is ignored); false if one fails.
    pub fn test(&self, id: u32, v: RawValue<'_>, seen: &mut [bool]) -> bool {
        let mut pass = true;
        for (i, c) in self.conds.iter().enumerate() {
            if c.target == Target::Stored(id) && !seen[i] {
                seen[i] = true;
                pass &= c.test.passes(v);
            }
        }
        pass
    }

    /// After a row's walk: whether every test saw its column (a column
    /// the row lacks is NULL, which no test passes).
    pub fn all_seen(&self, seen: &[bool]) -> bool {
        seen.iter().all(|s| *s)
    }
}

impl Test {
    fn passes(&self, v: RawValue<'_>) -> bool {
        match self {
            Test::NotNull => true,
            Test::Cmp(cmp, lit) => match compare(v, lit) {
                Some(o) => cmp.holds(o),
                // Not a type the filter compares: DataFusion decides.
                None => true,
            },
        }
    }
}

fn target(table: &Table, name: &str) -> Option<Target> {
    if let Some(k) = table.primary_key.iter().position(|k| k.name == name) {
        return Some(Target::Key(k));
    }
    table.column(name).map(|c| Target::Stored(c.id))
}

/// A value as the raw form a stored row hands out; `None` for NULL and the
/// types the filter does not compare.
fn raw(v: &Value) -> Option<RawValue<'_>> {
    Some(match v {
        Value::Int64(x) => RawValue::Int64(*x),
        Value::Bool(x) => RawValue::Bool(*x),
        Value::Date(x) => RawValue::Date(*x),
        Value::Timestamp(x) => RawValue::Timestamp(*x),
        Value::String(s) => RawValue::String(s),
        _ => return None,
    })
}

/// `v` against the literal, as Arrow orders them (strings byte-wise);
/// `None` if their types differ.
fn compare(v: RawValue<'_>, lit: &Value) -> Option<Ordering> {
    Some(match (v, lit) {
        (RawValue::Int64(a), Value::Int64(b)) => a.cmp(b),
        (RawValue::Bool(a), Value::Bool(b)) => a.cmp(b),
        (RawValue::Date(a), Value::Date(b)) => a.cmp(b),
        (RawValue::Timestamp(a), Value::Timestamp(b)) => a.cmp(b),
        (RawValue::String(a), Value::String(b)) => a.as_bytes().cmp(b.as_bytes()),
        _ => return None,
    })
}

/// A scan's row filter in use: tests rows, and turns itself off when it
/// keeps most of them (see the module doc).
#[derive(Debug)]
pub struct RowFilterState<'a> {
    filter: Option<&'a RowFilter>,
    tested: usize,
    kept: usize,
    seen: Vec<bool>,
}

impl<'a> RowFilterState<'a> {
    pub fn new(filter: Option<&'a RowFilter>) -> Self {
        RowFilterState {
            filter,
            tested: 0,
            kept: 0,
            seen: Vec::new(),
        }
    }

    /// The filter while it is on.
    pub fn current(&self) -> Option<&'a RowFilter> {
        self.filter
    }

    /// Counts a tested row; turns the filter off after the probe if it
    /// kept most rows.
    pub fn count(&mut self, kept: bool) {
        self.tested += 1;
        self.kept += kept as usize;
        if self.tested == PROBE_ROWS && self.kept * 100 > self.tested * KEEP_LIMIT_PERCENT {
            self.filter = None;
        }
    }

    /// A scratch buffer for the tests' flags.
    pub fn seen(&mut self) -> &mut Vec<bool> {
        &mut self.seen
    }

    /// Whether the row passes (always, once the filter is off).
    pub fn keep(
        &mut self,
        key: &[u8],
        spans: &[(usize, usize)],
        value: &[u8],
    ) -> crate::Result<bool> {
        let Some(f) = self.filter else {
            return Ok(true);
        };
        let keep = f.keep(key, spans, value, &mut self.seen)?;
        self.count(keep);
        Ok(keep)
    }

    /// Whether the filter is still tested.
    pub fn active(&self) -> bool {
        self.filter.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::common::ScalarValue;
    use datafusion::logical_expr::{col, lit};
    use spindle_catalog::{Catalog, ColumnDef, KeyColumn, TableDef};
    use spindle_keys::Direction;

    fn catalog() -> Catalog {
        let mut c = Catalog::new();
        let column = |name: &str, data_type: DataType| ColumnDef {
            name: name.into(),
            data_type,
            nullable: name != "k",
            default: None,
            allow_commit_timestamp: false,
        };
        c.create_table(TableDef {
            name: "t".into(),
            columns: vec![
                column("k", DataType::Int64),
                column("s", DataType::String(None)),
                column("d", DataType::Date),
                column("f", DataType::Float64),
                column("n", DataType::Int64),
            ],
            primary_key: vec![KeyColumn {
                name: "k".into(),
                direction: Direction::Asc,
            }],
            interleave: None,
        })
        .unwrap();
        c
    }

    /// Whether the filter keeps the row `k, s, d, f, n` (NULLs absent).
    fn keeps(
        c: &Catalog,
        f: &RowFilter,
        row: (i64, Option<&str>, Option<i32>, Option<f64>, Option<i64>),
    ) -> bool {
        let t = c.table("t").unwrap();
        let key = c.encode_key("t", &[Value::Int64(row.0)]).unwrap();
        let mut spans = Vec::new();
        assert!(Catalog::key_spans(&[t], &key, &mut spans).unwrap());
        let s = row.1.map(|s| Value::String(s.into()));
        let d = row.2.map(Value::Date);
        let fl = row.3.map(Value::Float64);
        let n = row.4.map(Value::Int64);
        let mut stored = Vec::new();
        for (name, v) in [("s", &s), ("d", &d), ("f", &fl), ("n", &n)] {
            if let Some(v) = v {
                stored.push((t.column(name).unwrap().id, v));
            }
        }
        let value = spindle_keys::row::encode_row(&stored);
        f.keep(&key, &spans, &value, &mut Vec::new()).unwrap()
    }

    fn plan(c: &Catalog, filters: &[Expr]) -> Option<RowFilter> {
        let refs: Vec<&Expr> = filters.iter().collect();
        RowFilter::plan(c.table("t").unwrap(), &refs)
    }

    fn date(days: i32) -> Expr {
        lit(ScalarValue::Date32(Some(days)))
    }

    #[test]
    fn plans_comparisons_of_supported_columns_with_literals_of_their_type() {
        let c = catalog();
        let f = plan(
            &c,
            &[
                col("s").eq(lit("BUILDING")),
                date(100).gt(col("d")), // literal first: d < 100
                col("k").between(lit(2i64), lit(9i64)),
                col("n").is_not_null(),
                col("f").lt(lit(1.5f64)), // FLOAT64: left to DataFusion
                col("n").lt(lit(1.5f64)), // needs a cast: left out
                col("s").like(lit("B%")), // not a comparison
                col("n").gt(col("k")),    // no literal
            ],
        )
        .unwrap();
        assert_eq!(
            f.describe(),
            "s = 'BUILDING' AND d < 1970-04-11 AND k >= 2 AND k <= 9 AND n IS NOT NULL"
        );
        assert!(plan(&c, &[col("f").gt(lit(0.0f64))]).is_none());
        // An AND inside one filter is split into its conjuncts.
        let f = plan(&c, &[col("n").gt(lit(1i64)).and(col("d").lt_eq(date(5)))]).unwrap();
        assert_eq!(f.describe(), "n > 1 AND d <= 1970-01-06");
        // An OR is not a conjunction: nothing to test.
        assert!(plan(&c, &[col("n").gt(lit(1i64)).or(col("d").lt_eq(date(5)))]).is_none());
    }

    #[test]
    fn keeps_exactly_the_rows_that_pass_and_drops_nulls() {
        let c = catalog();
        let f = plan(
            &c,
            &[
                col("s").eq(lit("BUILDING")),
                col("d").lt(date(100)),
                col("k").gt_eq(lit(2i64)),
            ],
        )
        .unwrap();
        assert!(keeps(&c, &f, (2, Some("BUILDING"), Some(99), None, None)));
        assert!(
            !keeps(&c, &f, (1, Some("BUILDING"), Some(99), None, None)),
            "key test"
        );
        assert!(!keeps(&c, &f, (2, Some("BUILDINGS"), Some(99), None, None)));
        assert!(!keeps(&c, &f, (2, Some("BUILDING"), Some(100), None, None)));
        assert!(!keeps(&c, &f, (2, None, Some(1), None, None)), "NULL s");
        assert!(
            !keeps(&c, &f, (2, Some("BUILDING"), None, None, None)),
            "NULL d"
        );

        let f = plan(&c, &[col("n").is_not_null(), col("n").not_eq(lit(7i64))]).unwrap();
        assert!(keeps(&c, &f, (1, None, None, None, Some(0))));
        assert!(!keeps(&c, &f, (1, None, None, None, Some(7))));
        assert!(!keeps(&c, &f, (1, None, None, Some(2.0), None)));

        // Strings compare byte-wise, as Arrow does.
        let f = plan(&c, &[col("s").lt(lit("b"))]).unwrap();
        assert!(keeps(&c, &f, (1, Some("B"), None, None, None)));
        assert!(keeps(&c, &f, (1, Some("a\u{e9}"), None, None, None)));
        assert!(!keeps(&c, &f, (1, Some("\u{e9}"), None, None, None)));
    }

    #[test]
    fn a_filter_that_keeps_most_rows_is_turned_off_after_the_probe() {
        let c = catalog();
        let t = c.table("t").unwrap();
        let f = plan(&c, &[col("n").lt(lit(80i64))]).unwrap();
        let run = |keep_every: i64| {
            let mut state = RowFilterState::new(Some(&f));
            let mut kept = 0;
            for i in 0..(PROBE_ROWS as i64 + 10) {
                let key = c.encode_key("t", &[Value::Int64(i)]).unwrap();
                let mut spans = Vec::new();
                Catalog::key_spans(&[t], &key, &mut spans).unwrap();
                let n = Value::Int64(if i % 100 < keep_every { 0 } else { 100 });
                let value = spindle_keys::row::encode_row(&[(t.column("n").unwrap().id, &n)]);
                kept += state.keep(&key, &spans, &value).unwrap() as usize;
            }
            (state.active(), kept)
        };
        // Keeps 90%: off after the probe; every later row passes untested.
        let (active, kept) = run(90);
        assert!(!active);
        assert_eq!(kept, 924 + 10);
        // Keeps 50%: stays on.
        let (active, kept) = run(50);
        assert!(active);
        assert_eq!(kept, 534);
    }
}
