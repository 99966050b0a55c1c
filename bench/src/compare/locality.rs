//! Workload 4, locality: customers → orders → order lines in three layouts,
//! the same rows in each, read and deleted with the same statements (only
//! the table-name prefix differs), over the wire (tokio-postgres, prepared
//! statements, one connection):
//!
//! * `il_`: Spindle, interleaved (`INTERLEAVE IN PARENT … ON DELETE CASCADE`),
//!   keys (c_id), (c_id, o_id), (c_id, o_id, l_id);
//! * `ni_`: Spindle, not interleaved: each table its own primary key
//!   (c_id, o_id, l_id) and secondary indexes on the parent-key columns;
//! * `fk_`: PostgreSQL, like `ni_` plus foreign keys with ON DELETE CASCADE.
//!
//! Measured: reading one row tree (three selects in a read-only
//! transaction, and one statement joining the three tables), a full scan of the parent table alone, and deleting a row
//! tree (`DELETE FROM customers WHERE c_id = $1` cascading in `il_` and
//! `fk_`; Spindle has no foreign keys, so `ni_` deletes the three levels
//! itself in one transaction).

use std::time::Instant;

use tokio_postgres::Client;

use super::report::Record;
use super::util::{fail, measure_async, progress, Context, Figure, Kind, Result, Rng};
use super::wire::{batch, copy_rows, scalar_i64, Cell};

pub struct Sizes {
    pub customers: i64,
    pub orders_per: i64,
    pub lines_per: i64,
    pub seconds: f64,
    pub runs: usize,
}

fn ddl(prefix: &str) -> String {
    let customers = format!(
        "CREATE TABLE {prefix}customers (c_id bigint NOT NULL, name varchar(40), x bigint NOT NULL, \
         note varchar(100), PRIMARY KEY (c_id))"
    );
    match prefix {
        "il_" => format!(
            "{customers};
             CREATE TABLE il_orders (c_id bigint NOT NULL, o_id bigint NOT NULL, amount double precision, \
               status varchar(10), note varchar(100), PRIMARY KEY (c_id, o_id)) \
               INTERLEAVE IN PARENT il_customers ON DELETE CASCADE;
             CREATE TABLE il_lines (c_id bigint NOT NULL, o_id bigint NOT NULL, l_id bigint NOT NULL, \
               qty bigint, price double precision, note varchar(60), PRIMARY KEY (c_id, o_id, l_id)) \
               INTERLEAVE IN PARENT il_orders ON DELETE CASCADE"
        ),
        "ni_" => format!(
            "{customers};
             CREATE TABLE ni_orders (c_id bigint NOT NULL, o_id bigint NOT NULL, amount double precision, \
               status varchar(10), note varchar(100), PRIMARY KEY (o_id));
             CREATE INDEX ni_orders_c ON ni_orders (c_id);
             CREATE TABLE ni_lines (c_id bigint NOT NULL, o_id bigint NOT NULL, l_id bigint NOT NULL, \
               qty bigint, price double precision, note varchar(60), PRIMARY KEY (l_id));
             CREATE INDEX ni_lines_c ON ni_lines (c_id);
             CREATE INDEX ni_lines_o ON ni_lines (o_id)"
        ),
        _ => format!(
            "{customers};
             CREATE TABLE fk_orders (c_id bigint NOT NULL REFERENCES fk_customers ON DELETE CASCADE, \
               o_id bigint NOT NULL, amount double precision, \
               status varchar(10), note varchar(100), PRIMARY KEY (o_id));
             CREATE INDEX fk_orders_c ON fk_orders (c_id);
             CREATE TABLE fk_lines (c_id bigint NOT NULL, \
               o_id bigint NOT NULL REFERENCES fk_orders ON DELETE CASCADE, l_id bigint NOT NULL, \
               qty bigint, price double precision, note varchar(60), PRIMARY KEY (l_id));
             CREATE INDEX fk_lines_c ON fk_lines (c_id);
             CREATE INDEX fk_lines_o ON fk_lines (o_id)"
        ),
    }
}

struct Data {
    customers: Vec<Vec<Cell>>,
    orders: Vec<Vec<Cell>>,
    lines: Vec<Vec<Cell>>,
}

fn generate(s: &Sizes) -> Data {
    let mut rng = Rng::new(44);
    let mut d = Data {
        customers: Vec::new(),
        orders: Vec::new(),
        lines: Vec::new(),
    };
    for c in 1..=s.customers {
        d.customers.push(vec![
            Cell::Int(c),
            Cell::Text(format!("Customer#{c:09}")),
            Cell::Int(rng.range(-1000, 10_000)),
            Cell::Text("c".repeat(80)),
        ]);
        for j in 0..s.orders_per {
            let o = c * s.orders_per + j;
            d.orders.push(vec![
                Cell::Int(c),
                Cell::Int(o),
                Cell::Float(rng.range(100, 1_000_000) as f64 / 100.0),
                Cell::Text((*rng.pick(&["open", "shipped", "returned"])).to_string()),
                Cell::Text("o".repeat(80)),
            ]);
            for k in 0..s.lines_per {
                d.lines.push(vec![
                    Cell::Int(c),
                    Cell::Int(o),
                    Cell::Int(o * s.lines_per + k),
                    Cell::Int(rng.range(1, 50)),
                    Cell::Float(rng.range(100, 100_000) as f64 / 100.0),
                    Cell::Text("l".repeat(40)),
                ]);
            }
        }
    }
    d
}

async fn load(c: &Client, prefix: &str, d: &Data) -> Result<()> {
    batch(c, &ddl(prefix)).await?;
    copy_rows(c, &format!("{prefix}customers"), &d.customers, 10_000).await?;
    copy_rows(c, &format!("{prefix}orders"), &d.orders, 10_000).await?;
    copy_rows(c, &format!("{prefix}lines"), &d.lines, 10_000).await?;
    Ok(())
}

/// Reading row trees of random customers from the first half (the second
/// half is for the deletes).
async fn read_trees(c: &Client, prefix: &str, s: &Sizes) -> Result<Figure> {
    let qc = c
        .prepare(&format!(
            "SELECT c_id, name, x, note FROM {prefix}customers WHERE c_id = $1"
        ))
        .await
        .ctx("prepare")?;
    let qo = c
        .prepare(&format!(
            "SELECT o_id, amount, status, note FROM {prefix}orders WHERE c_id = $1"
        ))
        .await
        .ctx("prepare")?;
    let ql = c
        .prepare(&format!(
            "SELECT o_id, l_id, qty, price, note FROM {prefix}lines WHERE c_id = $1"
        ))
        .await
        .ctx("prepare")?;
    let mut rng = Rng::new(45);
    let half = (s.customers / 2).max(1);
    measure_async(s.seconds, 10, u64::MAX, |_| {
        let id = rng.range(1, half);
        let (qc, qo, ql) = (&qc, &qo, &ql);
        async move {
            batch(c, "BEGIN READ ONLY").await?;
            let a = c.query(qc, &[&id]).await.ctx("customer")?.len() as i64;
            let b = c.query(qo, &[&id]).await.ctx("orders")?.len() as i64;
            let l = c.query(ql, &[&id]).await.ctx("lines")?.len() as i64;
            batch(c, "COMMIT").await?;
            if (a, b, l) != (1, s.orders_per, s.orders_per * s.lines_per) {
                return fail(format!("{prefix} row tree {id}: {a}/{b}/{l} rows"));
            }
            Ok(())
        }
    })
    .await
}

/// The statement reading a row tree at once: the customer joined to its
/// orders and their lines (one row per line).
fn tree_join_sql(prefix: &str) -> String {
    format!(
        "SELECT c.c_id, c.name, c.x, o.o_id, o.amount, o.status, l.l_id, l.qty, l.price, l.note \
         FROM {prefix}customers c JOIN {prefix}orders o ON o.c_id = c.c_id \
         JOIN {prefix}lines l ON l.c_id = o.c_id AND l.o_id = o.o_id WHERE c.c_id = $1"
    )
}

/// Reading row trees as [`read_trees`] does, with one prepared join (one
/// statement, one round trip: no transaction block needed).
async fn read_trees_joined(c: &Client, prefix: &str, s: &Sizes) -> Result<Figure> {
    let q = c.prepare(&tree_join_sql(prefix)).await.ctx("prepare")?;
    let mut rng = Rng::new(46);
    let half = (s.customers / 2).max(1);
    measure_async(s.seconds, 10, u64::MAX, |_| {
        let id = rng.range(1, half);
        let q = &q;
        async move {
            let n = c.query(q, &[&id]).await.ctx("row tree join")?.len() as i64;
            if n != s.orders_per * s.lines_per {
                return fail(format!("{prefix} row tree join {id}: {n} rows"));
            }
            Ok(())
        }
    })
    .await
}

/// The parent-only scan of each layout, `(client, table prefix)`: one
/// untimed run of each first, as in the analytics workload (in both
/// layouts a table's first scan after its load runs several times slower
/// than the ones after it), then `runs` rounds that time one scan of each
/// layout in turn, so that whatever else the machine does meanwhile (a
/// server's background work) falls on every layout alike.
async fn scan_parents(layouts: &[(&Client, &str)], s: &Sizes) -> Result<Vec<(Figure, String)>> {
    let sql = |prefix: &str| format!("SELECT count(*), sum(x) FROM {prefix}customers");
    let mut answers = Vec::new();
    for (c, prefix) in layouts {
        answers.push(format!(
            "{:?}",
            super::wire::text_rows(c, &sql(prefix)).await?
        ));
    }
    let mut times = vec![Vec::new(); layouts.len()];
    for _ in 0..s.runs.max(1) {
        for (i, (c, prefix)) in layouts.iter().enumerate() {
            let t = Instant::now();
            let rows = super::wire::text_rows(c, &sql(prefix)).await?;
            times[i].push(t.elapsed());
            answers[i] = format!("{rows:?}");
        }
    }
    Ok(times
        .iter()
        .zip(answers)
        .map(|(t, a)| (Figure::from_latencies(t), a))
        .collect())
}

/// Deletes row trees from the second half, last customer first, for
/// `seconds` or until the second half is gone.
async fn delete_trees(c: &Client, prefix: &str, s: &Sizes) -> Result<Figure> {
    let cascade = prefix != "ni_";
    let del_c = c
        .prepare(&format!("DELETE FROM {prefix}customers WHERE c_id = $1"))
        .await
        .ctx("prepare")?;
    let del_o = c
        .prepare(&format!("DELETE FROM {prefix}orders WHERE c_id = $1"))
        .await
        .ctx("prepare")?;
    let del_l = c
        .prepare(&format!("DELETE FROM {prefix}lines WHERE c_id = $1"))
        .await
        .ctx("prepare")?;
    let available = (s.customers - s.customers / 2) as u64;
    measure_async(s.seconds, 1, available, |i| {
        let id = s.customers - i as i64;
        let (del_c, del_o, del_l) = (&del_c, &del_o, &del_l);
        async move {
            let n = if cascade {
                c.execute(del_c, &[&id]).await.ctx("delete")?
            } else {
                batch(c, "BEGIN").await?;
                c.execute(del_l, &[&id]).await.ctx("delete lines")?;
                c.execute(del_o, &[&id]).await.ctx("delete orders")?;
                let n = c.execute(del_c, &[&id]).await.ctx("delete customer")?;
                batch(c, "COMMIT").await?;
                n
            };
            if n != 1 {
                return fail(format!("{prefix} delete {id}: {n} customers"));
            }
            Ok(())
        }
    })
    .await
}

async fn counts(c: &Client, prefix: &str) -> Result<(i64, i64, i64)> {
    Ok((
        scalar_i64(c, &format!("SELECT count(*) FROM {prefix}customers")).await?,
        scalar_i64(c, &format!("SELECT count(*) FROM {prefix}orders")).await?,
        scalar_i64(c, &format!("SELECT count(*) FROM {prefix}lines")).await?,
    ))
}

pub async fn run(pg: &Client, sp: &Client, s: &Sizes, out: &mut Vec<Record>) -> Result<()> {
    let d = generate(s);
    progress(format!(
        "locality: loading {} customers, {} orders, {} lines into each layout",
        d.customers.len(),
        d.orders.len(),
        d.lines.len()
    ));
    load(sp, "il_", &d).await?;
    load(sp, "ni_", &d).await?;
    load(pg, "fk_", &d).await?;
    batch(pg, "VACUUM ANALYZE").await?;
    drop(d);

    progress("locality: row-tree reads");
    let il_read = read_trees(sp, "il_", s).await?;
    let ni_read = read_trees(sp, "ni_", s).await?;
    let pg_read = read_trees(pg, "fk_", s).await?;
    progress("locality: row-tree reads with one join");
    let il_join = read_trees_joined(sp, "il_", s).await?;
    let ni_join = read_trees_joined(sp, "ni_", s).await?;
    let pg_join = read_trees_joined(pg, "fk_", s).await?;
    progress("locality: parent-only scans");
    let mut scans = scan_parents(&[(sp, "il_"), (sp, "ni_"), (pg, "fk_")], s)
        .await?
        .into_iter();
    let (Some((il_scan, a1)), Some((ni_scan, a2)), Some((pg_scan, a3))) =
        (scans.next(), scans.next(), scans.next())
    else {
        return fail("parent scans: a layout without a figure");
    };
    if a1 != a2 || a2 != a3 {
        return fail(format!(
            "parent scans disagree: interleaved {a1}, non-interleaved {a2}, PostgreSQL {a3}"
        ));
    }
    progress("locality: row-tree deletes");
    let il_del = delete_trees(sp, "il_", s).await?;
    let ni_del = delete_trees(sp, "ni_", s).await?;
    let pg_del = delete_trees(pg, "fk_", s).await?;
    // Each layout deleted a different number of trees; what is left must be
    // exactly the trees not deleted.
    for (c, p, f) in [
        (sp, "il_", &il_del),
        (sp, "ni_", &ni_del),
        (pg, "fk_", &pg_del),
    ] {
        let left = s.customers - f.ops as i64;
        let want = (left, left * s.orders_per, left * s.orders_per * s.lines_per);
        let got = counts(c, p).await?;
        if got != want {
            return fail(format!(
                "{p}: after deleting {} row trees, {got:?} rows left, expected {want:?}",
                f.ops
            ));
        }
    }

    let w = "4 locality";
    let shape = format!(
        "{} customers × {} orders × {} lines; a row tree (1 customer, {} orders, {} lines) is read \
         with 3 prepared selects in BEGIN READ ONLY … COMMIT over the wire",
        s.customers,
        s.orders_per,
        s.lines_per,
        s.orders_per,
        s.orders_per * s.lines_per
    );
    let rec =
        |case: String, kind, unit, a: &Figure, label: &str, b: &Figure, target, note: &str| {
            Record {
                workload: w.into(),
                case,
                kind,
                unit,
                spindle_label: "Spindle interleaved".into(),
                spindle: a.clone(),
                other_label: label.into(),
                other: b.clone(),
                target,
                note: note.into(),
            }
        };
    let ni = "Spindle non-interleaved";
    out.push(rec(
        "read row tree".into(),
        Kind::Throughput,
        "ops/s",
        &il_read,
        ni,
        &ni_read,
        Some(2.0),
        &shape,
    ));
    out.push(rec(
        "read row tree".into(),
        Kind::Throughput,
        "ops/s",
        &il_read,
        "PostgreSQL",
        &pg_read,
        Some(1.0),
        &shape,
    ));
    let join_note = format!(
        "read row tree, one join: the same tree read with one prepared statement, `{}` \
         (both Spindle layouts on the join fast path, hash joins on the ON columns: \
         interleaved, a key-range scan per table inside the customer's row tree; \
         non-interleaved, orders and lines through their c_id indexes, each row fetched by \
         key; PostgreSQL: its own plan)",
        tree_join_sql("")
    );
    out.push(rec(
        "read row tree, one join".into(),
        Kind::Throughput,
        "ops/s",
        &il_join,
        ni,
        &ni_join,
        Some(2.0),
        &join_note,
    ));
    out.push(rec(
        "read row tree, one join".into(),
        Kind::Throughput,
        "ops/s",
        &il_join,
        "PostgreSQL",
        &pg_join,
        Some(1.0),
        &join_note,
    ));
    let scan_note = format!(
        "parent scan = `SELECT count(*), sum(x) FROM customers`, median of {} runs after a \
         warm-up, the layouts' runs taken in turn; target: \
         interleaved no slower than 1.25× non-interleaved, i.e. ratio ≥ 0.8",
        s.runs
    );
    out.push(rec(
        "parent-only full scan".into(),
        Kind::Latency,
        "ms",
        &il_scan,
        ni,
        &ni_scan,
        Some(0.8),
        &scan_note,
    ));
    out.push(rec(
        "parent-only full scan".into(),
        Kind::Latency,
        "ms",
        &il_scan,
        "PostgreSQL",
        &pg_scan,
        None,
        &scan_note,
    ));
    let del_note = "delete row tree: interleaved ON DELETE CASCADE and PostgreSQL's cascading \
                    foreign keys run one DELETE of the customer; Spindle has no foreign keys, so \
                    the non-interleaved layout deletes lines, orders, customer in one transaction";
    out.push(rec(
        "delete row tree (cascade)".into(),
        Kind::Throughput,
        "ops/s",
        &il_del,
        ni,
        &ni_del,
        None,
        del_note,
    ));
    out.push(rec(
        "delete row tree (cascade)".into(),
        Kind::Throughput,
        "ops/s",
        &il_del,
        "PostgreSQL",
        &pg_del,
        None,
        del_note,
    ));
    Ok(())
}
