//! Workload 5, analytics: a TPC-H Q1-style scan-aggregate over `lineitem`
//! and a Q3-style join of customer, orders and lineitem. The data is
//! generated from a fixed seed (TPC-H's shape and value ranges, not dbgen's
//! exact distributions), loaded into PostgreSQL and Spindle with COPY and
//! into SQLite with prepared inserts. The three must return the same rows
//! (floats within a relative 1e-6) or the run fails. Latency is the median
//! of `--runs` runs after one warm-up run; PostgreSQL and Spindle over the
//! wire (simple protocol), SQLite in-process.

use std::path::Path;
use std::time::{Duration, Instant};

use rusqlite::types::{Value as SqlValue, ValueRef};
use rusqlite::Connection;
use tokio_postgres::Client;

use super::report::Record;
use super::util::{days_from_civil, fail, progress, Context, Figure, Kind, Result, Rng};
use super::wire::{batch, copy_rows, text_rows, Cell};

pub struct Sizes {
    pub lineitems: i64,
    pub runs: usize,
}

const DDL: &str = "
CREATE TABLE customer (c_custkey bigint NOT NULL, c_name varchar(25), c_mktsegment varchar(10),
  c_acctbal double precision, PRIMARY KEY (c_custkey));
CREATE TABLE orders (o_orderkey bigint NOT NULL, o_custkey bigint NOT NULL, o_orderstatus varchar(1),
  o_totalprice double precision, o_orderdate date, o_shippriority bigint, PRIMARY KEY (o_orderkey));
CREATE TABLE lineitem (l_orderkey bigint NOT NULL, l_linenumber bigint NOT NULL,
  l_quantity double precision, l_extendedprice double precision, l_discount double precision,
  l_tax double precision, l_returnflag varchar(1), l_linestatus varchar(1), l_shipdate date,
  PRIMARY KEY (l_orderkey, l_linenumber));
";

const SQLITE_DDL: &str = "
CREATE TABLE customer (c_custkey INTEGER NOT NULL PRIMARY KEY, c_name TEXT, c_mktsegment TEXT,
  c_acctbal REAL);
CREATE TABLE orders (o_orderkey INTEGER NOT NULL PRIMARY KEY, o_custkey INTEGER NOT NULL,
  o_orderstatus TEXT, o_totalprice REAL, o_orderdate TEXT, o_shippriority INTEGER);
CREATE TABLE lineitem (l_orderkey INTEGER NOT NULL, l_linenumber INTEGER NOT NULL,
  l_quantity REAL, l_extendedprice REAL, l_discount REAL, l_tax REAL, l_returnflag TEXT,
  l_linestatus TEXT, l_shipdate TEXT, PRIMARY KEY (l_orderkey, l_linenumber));
";

pub const Q1: &str = "SELECT l_returnflag, l_linestatus, sum(l_quantity) AS sum_qty, \
  sum(l_extendedprice) AS sum_base_price, sum(l_extendedprice * (1 - l_discount)) AS sum_disc_price, \
  sum(l_extendedprice * (1 - l_discount) * (1 + l_tax)) AS sum_charge, avg(l_quantity) AS avg_qty, \
  avg(l_extendedprice) AS avg_price, avg(l_discount) AS avg_disc, count(*) AS count_order \
  FROM lineitem WHERE l_shipdate <= '1998-09-02' \
  GROUP BY l_returnflag, l_linestatus ORDER BY l_returnflag, l_linestatus";

pub const Q3: &str = "SELECT l_orderkey, sum(l_extendedprice * (1 - l_discount)) AS revenue, \
  o_orderdate, o_shippriority FROM customer, orders, lineitem \
  WHERE c_mktsegment = 'BUILDING' AND c_custkey = o_custkey AND l_orderkey = o_orderkey \
  AND o_orderdate < '1995-03-15' AND l_shipdate > '1995-03-15' \
  GROUP BY l_orderkey, o_orderdate, o_shippriority \
  ORDER BY revenue DESC, o_orderdate, l_orderkey LIMIT 10";

struct Data {
    customer: Vec<Vec<Cell>>,
    orders: Vec<Vec<Cell>>,
    lineitem: Vec<Vec<Cell>>,
}

fn generate(lineitems: i64) -> Data {
    let mut rng = Rng::new(5);
    let n_orders = (lineitems / 4).max(10);
    let n_customers = (n_orders / 10).max(10);
    let segments = [
        "AUTOMOBILE",
        "BUILDING",
        "FURNITURE",
        "HOUSEHOLD",
        "MACHINERY",
    ];
    let customer = (1..=n_customers)
        .map(|c| {
            vec![
                Cell::Int(c),
                Cell::Text(format!("Customer#{c:09}")),
                Cell::Text((*rng.pick(&segments)).to_string()),
                Cell::Float(rng.range(-99_999, 999_999) as f64 / 100.0),
            ]
        })
        .collect();
    let first = days_from_civil(1992, 1, 1);
    let last = days_from_civil(1998, 8, 2);
    let current = days_from_civil(1995, 6, 17);
    let mut orders = Vec::new();
    let mut lineitem = Vec::new();
    for o in 1..=n_orders {
        let date = rng.range(first, last);
        let lines = rng.range(1, 7);
        let mut total = 0i64;
        let mut all_f = true;
        for l in 1..=lines {
            let qty = rng.range(1, 50);
            let price_cents = qty * rng.range(90_000, 200_000) / 100;
            total += price_cents;
            let discount = rng.range(0, 10);
            let tax = rng.range(0, 8);
            let ship = date + rng.range(1, 121);
            let receipt = ship + rng.range(1, 30);
            let flag = if receipt <= current {
                *rng.pick(&["R", "A"])
            } else {
                "N"
            };
            let status = if ship > current { "O" } else { "F" };
            all_f &= status == "F";
            lineitem.push(vec![
                Cell::Int(o),
                Cell::Int(l),
                Cell::Float(qty as f64),
                Cell::Float(price_cents as f64 / 100.0),
                Cell::Float(discount as f64 / 100.0),
                Cell::Float(tax as f64 / 100.0),
                Cell::Text(flag.into()),
                Cell::Text(status.into()),
                Cell::Date(super::util::date_string(ship)),
            ]);
        }
        orders.push(vec![
            Cell::Int(o),
            Cell::Int(rng.range(1, n_customers)),
            Cell::Text(if all_f { "F" } else { "O" }.into()),
            Cell::Float(total as f64 / 100.0),
            Cell::Date(super::util::date_string(date)),
            Cell::Int(0),
        ]);
    }
    Data {
        customer,
        orders,
        lineitem,
    }
}

fn sqlite_load(path: &Path, d: &Data) -> Result<Connection> {
    let c = Connection::open(path).ctx("opening SQLite")?;
    c.execute_batch("PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;")
        .ctx("pragmas")?;
    c.execute_batch(SQLITE_DDL).ctx("SQLite schema")?;
    c.execute_batch("BEGIN").ctx("begin")?;
    for (table, rows) in [
        ("customer", &d.customer),
        ("orders", &d.orders),
        ("lineitem", &d.lineitem),
    ] {
        let width = rows.first().map(Vec::len).unwrap_or(0);
        let marks: Vec<String> = (1..=width).map(|i| format!("?{i}")).collect();
        let mut st = c
            .prepare(&format!(
                "INSERT INTO {table} VALUES ({})",
                marks.join(", ")
            ))
            .ctx("prepare")?;
        for row in rows.iter() {
            let vals: Vec<SqlValue> = row
                .iter()
                .map(|cell| match cell {
                    Cell::Int(i) => SqlValue::Integer(*i),
                    Cell::Float(f) => SqlValue::Real(*f),
                    Cell::Text(s) | Cell::Date(s) => SqlValue::Text(s.clone()),
                })
                .collect();
            st.execute(rusqlite::params_from_iter(vals))
                .ctx(format!("SQLite load {table}"))?;
        }
    }
    c.execute_batch("COMMIT; ANALYZE;").ctx("commit")?;
    Ok(c)
}

type Answer = Vec<Vec<Option<String>>>;

fn sqlite_query(c: &Connection, sql: &str) -> Result<Answer> {
    let mut st = c.prepare_cached(sql).ctx("SQLite prepare")?;
    let n = st.column_count();
    let mut rows = st.query([]).ctx("SQLite query")?;
    let mut out = Vec::new();
    while let Some(r) = rows.next().ctx("SQLite row")? {
        let mut row = Vec::with_capacity(n);
        for i in 0..n {
            row.push(match r.get_ref(i).ctx("SQLite value")? {
                ValueRef::Null => None,
                ValueRef::Integer(v) => Some(v.to_string()),
                ValueRef::Real(v) => Some(v.to_string()),
                ValueRef::Text(t) | ValueRef::Blob(t) => Some(String::from_utf8_lossy(t).into()),
            });
        }
        out.push(row);
    }
    Ok(out)
}

/// Same rows, cell by cell: numbers within a relative 1e-6, text exactly.
fn same_answer(a: &Answer, b: &Answer) -> Option<String> {
    if a.len() != b.len() {
        return Some(format!("{} rows vs {} rows", a.len(), b.len()));
    }
    for (i, (ra, rb)) in a.iter().zip(b).enumerate() {
        if ra.len() != rb.len() {
            return Some(format!("row {i}: {} columns vs {}", ra.len(), rb.len()));
        }
        for (j, (x, y)) in ra.iter().zip(rb).enumerate() {
            let equal = match (x, y) {
                (Some(x), Some(y)) => match (x.parse::<f64>(), y.parse::<f64>()) {
                    (Ok(p), Ok(q)) => (p - q).abs() <= 1e-6 * p.abs().max(q.abs()).max(1.0),
                    _ => x == y,
                },
                (None, None) => true,
                _ => false,
            };
            if !equal {
                return Some(format!("row {i} column {j}: {x:?} vs {y:?}"));
            }
        }
    }
    None
}

/// The three systems' timed runs of `sql`, alternated (Spindle,
/// PostgreSQL, SQLite, Spindle, …) after one warm-up run each, which also
/// gives the answers: the machine's slow stretches then fall on all three
/// rather than on whichever ran during them.
async fn time_alternating(
    sp: &Client,
    pg: &Client,
    lite: &Connection,
    sql: &str,
    runs: usize,
) -> Result<[(Figure, Answer); 3]> {
    let answers = [
        text_rows(sp, sql).await?,
        text_rows(pg, sql).await?,
        sqlite_query(lite, sql)?,
    ];
    let mut times: [Vec<Duration>; 3] = Default::default();
    for _ in 0..runs {
        for (i, client) in [sp, pg].into_iter().enumerate() {
            let t = Instant::now();
            text_rows(client, sql).await?;
            times[i].push(t.elapsed());
        }
        let t = Instant::now();
        sqlite_query(lite, sql)?;
        times[2].push(t.elapsed());
    }
    let [a0, a1, a2] = answers;
    Ok([
        (Figure::from_latencies(&times[0]), a0),
        (Figure::from_latencies(&times[1]), a1),
        (Figure::from_latencies(&times[2]), a2),
    ])
}

pub async fn run(pg: &Client, sp: &Client, s: &Sizes, out: &mut Vec<Record>) -> Result<()> {
    let d = generate(s.lineitems);
    progress(format!(
        "analytics: {} customers, {} orders, {} lineitems: loading PostgreSQL",
        d.customer.len(),
        d.orders.len(),
        d.lineitem.len()
    ));
    let load = |c: &'static str| format!("loading {c}");
    let t = Instant::now();
    batch(pg, DDL).await?;
    copy_rows(pg, "customer", &d.customer, 10_000).await?;
    copy_rows(pg, "orders", &d.orders, 10_000).await?;
    copy_rows(pg, "lineitem", &d.lineitem, 10_000).await?;
    batch(pg, "VACUUM ANALYZE").await?;
    let pg_load = t.elapsed();
    progress(load("Spindle"));
    let t = Instant::now();
    batch(sp, DDL).await?;
    copy_rows(sp, "customer", &d.customer, 10_000).await?;
    copy_rows(sp, "orders", &d.orders, 10_000).await?;
    copy_rows(sp, "lineitem", &d.lineitem, 10_000).await?;
    let sp_load = t.elapsed();
    progress(load("SQLite"));
    let dir = tempfile::Builder::new()
        .prefix("compare-tpch")
        .tempdir()
        .ctx("temp dir")?;
    let t = Instant::now();
    let lite = sqlite_load(&dir.path().join("tpch.db"), &d)?;
    let lite_load = t.elapsed();
    let n_lines = d.lineitem.len();
    drop(d);
    progress(format!(
        "analytics: loaded in PostgreSQL {:.1} s, Spindle {:.1} s, SQLite {:.1} s",
        pg_load.as_secs_f64(),
        sp_load.as_secs_f64(),
        lite_load.as_secs_f64()
    ));

    for (name, sql) in [("Q1 scan-aggregate", Q1), ("Q3 3-table join", Q3)] {
        progress(format!("analytics: {name}"));
        let [(spf, spa), (pgf, pga), (ltf, lta)] =
            time_alternating(sp, pg, &lite, sql, s.runs).await?;
        if pga.is_empty() {
            return fail(format!("{name}: PostgreSQL returned no rows"));
        }
        for (who, ans) in [("Spindle", &spa), ("SQLite", &lta)] {
            if let Some(diff) = same_answer(&pga, ans) {
                return fail(format!(
                    "{name}: {who} and PostgreSQL disagree: {diff}\nPostgreSQL: {pga:?}\n{who}: {ans:?}"
                ));
            }
        }
        let note = format!(
            "{n_lines} lineitem rows; median of {} runs after a warm-up, the systems' runs \
             alternated; the three systems returned the same rows; load time: PostgreSQL {:.1} s (COPY + VACUUM ANALYZE), \
             Spindle {:.1} s (COPY), SQLite {:.1} s (inserts in one transaction)",
            s.runs,
            pg_load.as_secs_f64(),
            sp_load.as_secs_f64(),
            lite_load.as_secs_f64()
        );
        for (label, f, target) in [("PostgreSQL", &pgf, Some(1.0)), ("SQLite", &ltf, None)] {
            out.push(Record {
                workload: "5 analytics".into(),
                case: name.into(),
                kind: Kind::Latency,
                unit: "ms",
                spindle_label: "Spindle".into(),
                spindle: spf.clone(),
                other_label: label.into(),
                other: f.clone(),
                target,
                note: note.clone(),
            });
        }
    }
    Ok(())
}
