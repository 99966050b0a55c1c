//! Wire-protocol helpers shared by PostgreSQL and Spindle: the same client
//! library (tokio-postgres) and the same statements for both.

use std::io::Cursor;

use futures::SinkExt;
use tokio_postgres::{Client, NoTls, SimpleQueryMessage};

use super::util::{Context, Result};

/// Rows for COPY and for SQLite: every value of a generated data set.
#[derive(Clone, Debug)]
pub enum Cell {
    Int(i64),
    Float(f64),
    Text(String),
    /// A date as `YYYY-MM-DD` (DATE in PostgreSQL and Spindle, TEXT in SQLite).
    Date(String),
}

impl Cell {
    fn copy_text(&self, out: &mut String) {
        use std::fmt::Write;
        match self {
            Cell::Int(i) => {
                let _ = write!(out, "{i}");
            }
            // `{}` prints the shortest text that parses back to the same
            // f64, so every system stores bit-identical values.
            Cell::Float(f) => {
                let _ = write!(out, "{f}");
            }
            // Generated text never holds tabs, newlines or backslashes.
            Cell::Text(s) | Cell::Date(s) => out.push_str(s),
        }
    }
}

pub async fn connect(conninfo: &str) -> Result<Client> {
    let (client, conn) = tokio_postgres::connect(conninfo, NoTls)
        .await
        .ctx(format!("connecting to {conninfo}"))?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            eprintln!("connection error: {e}");
        }
    });
    Ok(client)
}

/// Runs `;`-separated statements in the simple protocol.
pub async fn batch(c: &Client, sql: &str) -> Result<()> {
    c.batch_execute(sql).await.ctx(format!("running {sql}"))
}

/// Loads rows with `COPY table FROM STDIN` (text format), `chunk` rows per
/// COPY statement (Spindle commits each COPY as one transaction).
pub async fn copy_rows(c: &Client, table: &str, rows: &[Vec<Cell>], chunk: usize) -> Result<()> {
    for part in rows.chunks(chunk.max(1)) {
        let mut text = String::with_capacity(part.len() * 64);
        for row in part {
            for (i, cell) in row.iter().enumerate() {
                if i > 0 {
                    text.push('\t');
                }
                cell.copy_text(&mut text);
            }
            text.push('\n');
        }
        let sink = c
            .copy_in::<_, Cursor<Vec<u8>>>(&format!("COPY {table} FROM STDIN"))
            .await
            .ctx(format!("COPY {table}"))?;
        futures::pin_mut!(sink);
        sink.send(Cursor::new(text.into_bytes()))
            .await
            .ctx(format!("COPY {table} data"))?;
        let n = sink.finish().await.ctx(format!("COPY {table} end"))?;
        if n != part.len() as u64 {
            return Err(format!("COPY {table}: {n} rows copied, {} sent", part.len()).into());
        }
    }
    Ok(())
}

/// A query's rows as text (simple protocol: the server formats every
/// value), NULL as `None`.
pub async fn text_rows(c: &Client, sql: &str) -> Result<Vec<Vec<Option<String>>>> {
    let msgs = c.simple_query(sql).await.ctx(format!("running {sql}"))?;
    let mut rows = Vec::new();
    for m in msgs {
        if let SimpleQueryMessage::Row(r) = m {
            rows.push((0..r.len()).map(|i| r.get(i).map(str::to_string)).collect());
        }
    }
    Ok(rows)
}

/// A single integer from a query (e.g. `SELECT count(*) …`).
pub async fn scalar_i64(c: &Client, sql: &str) -> Result<i64> {
    let rows = text_rows(c, sql).await?;
    rows.first()
        .and_then(|r| r.first())
        .and_then(|v| v.as_deref())
        .ok_or_else(|| format!("{sql}: no value"))?
        .parse()
        .ctx(format!("{sql}: not an integer"))
}
