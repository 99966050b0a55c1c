//! Join keys as scan ranges: a hash join's build-side keys read by seeking.
//!
//! Once a DataFusion hash join has collected its build side, it publishes a
//! *dynamic filter* on its probe side's join keys
//! (`DynamicFilterPhysicalExpr`): a probe row that fails it cannot join.
//! With a small build side the filter holds the build keys as an IN list
//! (per hash partition: `CASE hash(k) % n WHEN 0 THEN k IN (…) …`). When
//! the probe side is a Spindle scan whose leading key column is the join
//! key, those keys are key prefixes: the scan reads each one's rows and
//! seeks over everything between them, instead of reading and decoding
//! the whole table for the join to throw almost all of it away. It is the
//! lookup join of a database with a key-ordered store:
//!
//! ```text
//!   HashJoin  o_orderkey = l_orderkey
//!     build: orders, filtered ─────▶ filter: l_orderkey IN (7, 12, 40, …)
//!     probe: SpindleScan lineitem (key: l_orderkey, l_linenumber)
//!              at its first poll: points 7, 12, 40, …
//!              reads [key(7), end(7)) ─seek─ [key(12), end(12)) ─seek─ …
//! ```
//!
//! A join on several keys publishes `struct(k1, k2) IN (struct(…), …)`
//! (behind each key's min/max bounds): the values of the struct's field
//! that is the scan's leading key column are its points (a three-table
//! row-tree join's last table, joined on `(c_id, o_id)`, was read whole
//! before).
//!
//! Invariants:
//! * A dynamic filter only ever narrows: every row it rejects, at any
//!   moment, is a row its producer does not need (DataFusion's contract
//!   for dynamic filters, which the join re-checks anyway). So the points
//!   read from its expression when the scan starts may be used for the
//!   whole scan, and the scan tells DataFusion it does not apply the filter
//!   (the result never depends on it).
//! * [`key_values`] returns `None` (read everything) for any expression it
//!   does not understand; a set of values it returns contains every value
//!   of the column that the expression can accept.
//! * Points are sorted by their encoded key prefix (descending key columns
//!   included) and disjoint; [`PointCursor`] only moves forward, as a scan
//!   does.

use std::sync::Arc;

use datafusion::arrow::array::Array;
use datafusion::common::ScalarValue;
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::expressions::{
    BinaryExpr, CaseExpr, Column, DynamicFilterPhysicalExpr, InListExpr, Literal,
};
use datafusion::physical_expr::{PhysicalExpr, ScalarFunctionExpr};

/// Counters of an engine's scans (a DataFusion session-config extension,
/// so that a scan finds them in its task context).
#[derive(Debug, Default)]
pub(crate) struct ScanStats {
    /// Scans restricted to a join's keys.
    pub join_key_scans: std::sync::atomic::AtomicU64,
    /// Scans whose far half a helper thread read as partition 1
    /// ([`crate::split_scan`]).
    pub split_scans: std::sync::atomic::AtomicU64,
}

/// Most values a scan turns into points; a larger set reads everything.
pub(crate) const MAX_POINTS: usize = 65_536;

/// Whether `expr` is a dynamic filter that refers to output column
/// `column` (so that it may restrict that column's values).
pub(crate) fn is_dynamic_on(expr: &Arc<dyn PhysicalExpr>, column: usize) -> bool {
    expr.downcast_ref::<DynamicFilterPhysicalExpr>()
        .is_some_and(|d| {
            d.children().iter().any(|c| {
                c.downcast_ref::<Column>()
                    .is_some_and(|c| c.index() == column)
            })
        })
}

/// The values of output column `column` that `expr` can accept, when it
/// names them: `Some(values)` (possibly empty: nothing passes) or `None`
/// when any value may pass.
pub(crate) fn key_values(expr: &Arc<dyn PhysicalExpr>, column: usize) -> Option<Vec<ScalarValue>> {
    let is_col = |e: &Arc<dyn PhysicalExpr>| {
        e.downcast_ref::<Column>()
            .is_some_and(|c| c.index() == column)
    };
    if let Some(d) = expr.downcast_ref::<DynamicFilterPhysicalExpr>() {
        return key_values(&d.current().ok()?, column);
    }
    if let Some(l) = expr.downcast_ref::<Literal>() {
        return match l.value() {
            ScalarValue::Boolean(Some(true)) => None,
            // false or NULL: no row passes.
            ScalarValue::Boolean(_) => Some(Vec::new()),
            _ => None,
        };
    }
    if let Some(list) = expr.downcast_ref::<InListExpr>() {
        if list.negated() {
            return None;
        }
        if let Some(field) = struct_field_of(list.expr(), column) {
            return struct_values(list, field);
        }
        if !is_col(list.expr()) {
            return None;
        }
        let mut values = Vec::with_capacity(list.len());
        for e in list.list() {
            let v = e.downcast_ref::<Literal>()?.value();
            // `k IN (…, NULL)` is never true because of the NULL.
            if !v.is_null() {
                values.push(v.clone());
            }
        }
        return Some(values);
    }
    if let Some(b) = expr.downcast_ref::<BinaryExpr>() {
        return match b.op() {
            Operator::And => match (key_values(b.left(), column), key_values(b.right(), column)) {
                // Either side's set holds every value the conjunction accepts.
                (Some(l), Some(r)) => Some(if l.len() <= r.len() { l } else { r }),
                (Some(s), None) | (None, Some(s)) => Some(s),
                (None, None) => None,
            },
            Operator::Or => {
                let mut l = key_values(b.left(), column)?;
                l.extend(key_values(b.right(), column)?);
                Some(l)
            }
            Operator::Eq => {
                let lit = if is_col(b.left()) {
                    b.right().downcast_ref::<Literal>()
                } else if is_col(b.right()) {
                    b.left().downcast_ref::<Literal>()
                } else {
                    None
                }?;
                let v = lit.value();
                Some(if v.is_null() {
                    Vec::new()
                } else {
                    vec![v.clone()]
                })
            }
            _ => None,
        };
    }
    if let Some(case) = expr.downcast_ref::<CaseExpr>() {
        // Whatever the routing, a row passes only through one branch.
        let mut all = Vec::new();
        for (_, then) in case.when_then_expr() {
            all.extend(key_values(then, column)?);
        }
        if let Some(e) = case.else_expr() {
            all.extend(key_values(e, column)?);
        }
        return Some(all);
    }
    None
}

/// Which field of `struct(…)` is output column `column`, when `expr` is
/// that function of columns: a join on several keys publishes its build
/// keys as `struct(k1, k2) IN (struct(…), …)`.
fn struct_field_of(expr: &Arc<dyn PhysicalExpr>, column: usize) -> Option<usize> {
    let f = expr.downcast_ref::<ScalarFunctionExpr>()?;
    if f.name() != "struct" {
        return None;
    }
    f.args().iter().position(|a| {
        a.downcast_ref::<Column>()
            .is_some_and(|c| c.index() == column)
    })
}

/// Field `field` of each struct literal of `list`, or `None` (any value
/// may pass) if an entry is anything else or has a NULL there: whether a
/// NULL field can match depends on how the join compares NULLs, so no
/// point can stand for it.
fn struct_values(list: &InListExpr, field: usize) -> Option<Vec<ScalarValue>> {
    let mut values = Vec::with_capacity(list.len());
    for e in list.list() {
        let ScalarValue::Struct(s) = e.downcast_ref::<Literal>()?.value() else {
            return None;
        };
        if s.len() != 1 || s.is_null(0) {
            return None;
        }
        let v = ScalarValue::try_from_array(s.columns().get(field)?, 0).ok()?;
        if v.is_null() {
            return None;
        }
        values.push(v);
    }
    Some(values)
}

/// Sorted, disjoint key ranges a scan is restricted to: each is every
/// key that starts with one *point*, a key prefix.
///
/// The prefixes sit back to back in one buffer (a join's keys are
/// thousands of short prefixes: one allocation, not two per point).
/// Prefixes of one key column's values never contain one another (values
/// are self-delimiting), so the ranges are disjoint, and a key lies in a
/// point's range exactly when it starts with the point.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Points {
    /// The prefixes in ascending order, no duplicates.
    bytes: Vec<u8>,
    /// Where each prefix ends in `bytes`.
    ends: Vec<usize>,
}

impl Points {
    /// From key prefixes in any order: sorted, duplicates dropped.
    #[cfg(test)]
    pub(crate) fn from_prefixes(prefixes: Vec<Vec<u8>>) -> Points {
        let mut b = PointsBuilder::default();
        for p in prefixes {
            let pushed: Result<(), std::convert::Infallible> = b.push(|buf| {
                buf.extend_from_slice(&p);
                Ok(())
            });
            let Ok(()) = pushed;
        }
        b.finish()
    }

    /// How many points.
    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }

    /// Point `i`'s prefix.
    fn get(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.bytes[start..self.ends[i]]
    }
}

/// Collects prefixes written straight into one buffer, then sorts them.
#[derive(Default)]
pub(crate) struct PointsBuilder {
    bytes: Vec<u8>,
    /// `(start, end)` of each prefix in `bytes`, in the order pushed.
    spans: Vec<(usize, usize)>,
}

impl PointsBuilder {
    pub(crate) fn with_capacity(points: usize, bytes: usize) -> PointsBuilder {
        PointsBuilder {
            bytes: Vec::with_capacity(bytes),
            spans: Vec::with_capacity(points),
        }
    }

    /// Adds the prefix that `write` appends to the buffer it is given.
    pub(crate) fn push<E>(
        &mut self,
        write: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
    ) -> Result<(), E> {
        let start = self.bytes.len();
        match write(&mut self.bytes) {
            Ok(()) => {
                self.spans.push((start, self.bytes.len()));
                Ok(())
            }
            Err(e) => {
                self.bytes.truncate(start);
                Err(e)
            }
        }
    }

    /// The points, sorted (a join's keys often arrive in key order
    /// already: the sort then only checks), duplicates dropped.
    pub(crate) fn finish(self) -> Points {
        let PointsBuilder { bytes, mut spans } = self;
        let at = |&(a, b): &(usize, usize)| &bytes[a..b];
        if !spans.is_sorted_by(|x, y| at(x) < at(y)) {
            spans.sort_unstable_by(|x, y| at(x).cmp(at(y)));
            spans.dedup_by(|x, y| at(x) == at(y));
        }
        let mut out = Points {
            bytes: Vec::with_capacity(bytes.len()),
            ends: Vec::with_capacity(spans.len()),
        };
        for (a, b) in spans {
            out.bytes.extend_from_slice(&bytes[a..b]);
            out.ends.push(out.bytes.len());
        }
        out
    }
}

/// Where a key lies against the points.
#[derive(Debug, PartialEq)]
pub(crate) enum Place<'a> {
    /// Inside a point's range: read it.
    Inside,
    /// Before the next point's range, which starts at this key: seek there.
    Before(&'a [u8]),
    /// After the last point: the scan is done.
    Past,
}

/// A forward-only position in [`Points`].
#[derive(Debug)]
pub(crate) struct PointCursor {
    points: Arc<Points>,
    /// Every range before `next` ends at or before a key already placed.
    next: usize,
}

impl PointCursor {
    pub(crate) fn new(points: Arc<Points>) -> PointCursor {
        PointCursor { points, next: 0 }
    }

    /// Places `key`, which must not be below a key placed before.
    pub(crate) fn place(&mut self, key: &[u8]) -> Place<'_> {
        let points = &*self.points;
        // Point i's range lies wholly below `key`: the prefix sorts below
        // the key and is not a prefix of it. (True for a run of points
        // from `next` on, then false: the ranges are sorted and disjoint.)
        let below = |i: usize| {
            let p = points.get(i);
            p < key && !key.starts_with(p)
        };
        let n = points.len();
        if self.next < n && below(self.next) {
            // Usually the next point or one just after it: look there
            // before bisecting the rest.
            let (mut lo, mut hi) = (self.next + 1, n);
            if lo < hi && !below(lo) {
                hi = lo;
            }
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                if below(mid) {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            self.next = lo;
        }
        if self.next >= n {
            return Place::Past;
        }
        let p = points.get(self.next);
        if key < p {
            Place::Before(p)
        } else {
            Place::Inside
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::physical_expr::expressions::{col, in_list, lit};

    fn schema() -> Schema {
        Schema::new(vec![
            Field::new("a", DataType::Int64, false),
            Field::new("b", DataType::Int64, false),
        ])
    }

    fn ints(v: &[i64]) -> Vec<Arc<dyn PhysicalExpr>> {
        v.iter().map(|i| lit(*i)).collect()
    }

    fn values(v: Option<Vec<ScalarValue>>) -> Option<Vec<i64>> {
        v.map(|v| {
            v.into_iter()
                .map(|s| match s {
                    ScalarValue::Int64(Some(i)) => i,
                    other => panic!("{other:?}"),
                })
                .collect()
        })
    }

    #[test]
    fn in_lists_on_the_column_name_their_values() {
        let s = schema();
        let a = col("a", &s).unwrap();
        let b = col("b", &s).unwrap();
        let on_a = in_list(a.clone(), ints(&[3, 1]), &false, &s).unwrap();
        assert_eq!(values(key_values(&on_a, 0)), Some(vec![3, 1]));
        // Another column, or NOT IN: any value of `a` may pass.
        let on_b = in_list(b.clone(), ints(&[3]), &false, &s).unwrap();
        assert_eq!(values(key_values(&on_b, 0)), None);
        let not_in = in_list(a.clone(), ints(&[3]), &true, &s).unwrap();
        assert_eq!(values(key_values(&not_in, 0)), None);
        // AND keeps a side that names values; OR needs both.
        let and: Arc<dyn PhysicalExpr> =
            Arc::new(BinaryExpr::new(on_b.clone(), Operator::And, on_a.clone()));
        assert_eq!(values(key_values(&and, 0)), Some(vec![3, 1]));
        let or: Arc<dyn PhysicalExpr> = Arc::new(BinaryExpr::new(on_b, Operator::Or, on_a.clone()));
        assert_eq!(values(key_values(&or, 0)), None);
        let eq: Arc<dyn PhysicalExpr> =
            Arc::new(BinaryExpr::new(lit(9i64), Operator::Eq, a.clone()));
        let or: Arc<dyn PhysicalExpr> = Arc::new(BinaryExpr::new(eq, Operator::Or, on_a.clone()));
        assert_eq!(values(key_values(&or, 0)), Some(vec![9, 3, 1]));
        assert_eq!(values(key_values(&lit(false), 0)), Some(vec![]));
        assert_eq!(values(key_values(&lit(true), 0)), None);
    }

    /// `struct(cols…) IN (rows…)`, as a join on several keys publishes it.
    fn struct_in(s: &Schema, cols: &[&str], rows: &[&[Option<i64>]]) -> Arc<dyn PhysicalExpr> {
        use datafusion::arrow::array::{ArrayRef, Int64Array, StructArray};
        use datafusion::arrow::datatypes::Fields;
        let args: Vec<Arc<dyn PhysicalExpr>> = cols.iter().map(|c| col(c, s).unwrap()).collect();
        let fields: Fields = cols
            .iter()
            .map(|c| Field::new(*c, DataType::Int64, true))
            .collect();
        let arrays: Vec<ArrayRef> = (0..cols.len())
            .map(|i| Arc::new(rows.iter().map(|r| r[i]).collect::<Int64Array>()) as ArrayRef)
            .collect();
        let array = Arc::new(StructArray::new(fields.clone(), arrays, None));
        let f = Arc::new(ScalarFunctionExpr::new(
            "struct",
            datafusion::functions::core::r#struct(),
            args,
            Arc::new(Field::new("struct", DataType::Struct(fields), true)),
            Arc::new(datafusion::common::config::ConfigOptions::default()),
        ));
        Arc::new(InListExpr::try_new_from_array(f, array, false, s).unwrap())
    }

    #[test]
    fn a_multi_key_joins_struct_list_names_each_columns_values() {
        let s = schema();
        let both = struct_in(
            &s,
            &["a", "b"],
            &[
                &[Some(7), Some(1)],
                &[Some(7), Some(2)],
                &[Some(9), Some(1)],
            ],
        );
        assert_eq!(values(key_values(&both, 0)), Some(vec![7, 7, 9]));
        assert_eq!(values(key_values(&both, 1)), Some(vec![1, 2, 1]));
        // With the bounds DataFusion puts before it.
        let bounds: Arc<dyn PhysicalExpr> = Arc::new(BinaryExpr::new(
            Arc::new(BinaryExpr::new(
                col("a", &s).unwrap(),
                Operator::GtEq,
                lit(7i64),
            )),
            Operator::And,
            Arc::new(BinaryExpr::new(
                col("a", &s).unwrap(),
                Operator::LtEq,
                lit(9i64),
            )),
        ));
        let and: Arc<dyn PhysicalExpr> = Arc::new(BinaryExpr::new(bounds, Operator::And, both));
        assert_eq!(values(key_values(&and, 0)), Some(vec![7, 7, 9]));
        // Column b alone in the struct: a's values are not named.
        let only_b = struct_in(&s, &["b", "b"], &[&[Some(1), Some(1)]]);
        assert_eq!(values(key_values(&only_b, 0)), None);
        // A NULL field: whether it can match is the join's business, so
        // the column is read whole.
        let null = struct_in(&s, &["a", "b"], &[&[Some(7), Some(1)], &[None, Some(2)]]);
        assert_eq!(values(key_values(&null, 0)), None);
        assert_eq!(values(key_values(&null, 1)), Some(vec![1, 2]));
    }

    #[test]
    fn a_partitioned_filter_is_the_union_of_its_branches() {
        let s = schema();
        let a = col("a", &s).unwrap();
        let route: Arc<dyn PhysicalExpr> =
            Arc::new(BinaryExpr::new(a.clone(), Operator::Modulo, lit(2i64)));
        let p0 = in_list(a.clone(), ints(&[2, 4]), &false, &s).unwrap();
        let p1 = in_list(a.clone(), ints(&[5]), &false, &s).unwrap();
        let case = |otherwise: Arc<dyn PhysicalExpr>| -> Arc<dyn PhysicalExpr> {
            Arc::new(
                CaseExpr::try_new(
                    Some(route.clone()),
                    vec![(lit(0i64), p0.clone()), (lit(1i64), p1.clone())],
                    Some(otherwise),
                )
                .unwrap(),
            )
        };
        assert_eq!(
            values(key_values(&case(lit(false)), 0)),
            Some(vec![2, 4, 5])
        );
        // A branch that lets anything through (a partition whose build side
        // is unknown) lets anything through.
        assert_eq!(values(key_values(&case(lit(true)), 0)), None);
        // Wrapped in a dynamic filter, as the join publishes it.
        let dynamic: Arc<dyn PhysicalExpr> =
            Arc::new(DynamicFilterPhysicalExpr::new(vec![a.clone()], lit(true)));
        assert!(is_dynamic_on(&dynamic, 0));
        assert!(!is_dynamic_on(&dynamic, 1));
        assert_eq!(values(key_values(&dynamic, 0)), None);
        dynamic
            .downcast_ref::<DynamicFilterPhysicalExpr>()
            .unwrap()
            .update(case(lit(false)))
            .unwrap();
        assert_eq!(values(key_values(&dynamic, 0)), Some(vec![2, 4, 5]));
    }

    #[test]
    fn the_cursor_walks_points_forward() {
        let points = Arc::new(Points::from_prefixes(vec![
            b"c".to_vec(),
            b"a".to_vec(),
            b"c".to_vec(),
            b"e\xff".to_vec(),
        ]));
        assert_eq!(points.len(), 3);
        let mut c = PointCursor::new(points);
        assert_eq!(c.place(b"0"), Place::Before(b"a"));
        assert_eq!(c.place(b"a"), Place::Inside);
        assert_eq!(c.place(b"a\x01"), Place::Inside);
        assert_eq!(c.place(b"b"), Place::Before(b"c"));
        assert_eq!(c.place(b"c9"), Place::Inside);
        assert_eq!(c.place(b"d"), Place::Before(b"e\xff"));
        assert_eq!(c.place(b"e\xff\xff"), Place::Inside);
        // `e\xff`'s range runs to the end of the key space.
        assert_eq!(c.place(b"f"), Place::Past);
    }
}
