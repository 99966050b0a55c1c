//! `COPY table [(cols)] FROM STDIN` and `COPY table [(cols)] | (query) TO
//! STDOUT`, in PostgreSQL's text and CSV formats.
//!
//! ```text
//! COPY … FROM STDIN   (Query, or Parse/Bind/Execute)
//!   ├─ the target's columns are described (42P01 / 42703 before any data);
//!   │    outside a transaction block the COPY BEGINs its own transaction
//!   ├─ CopyInResponse
//!   ├─ CopyData (streamed): a Reader keeps only the unfinished last row,
//!   │    splits complete rows (text or CSV rules, 22P04 on a bad row) and
//!   │    every 1000 rows go into the transaction as one INSERT … VALUES
//!   │    through the session — the normal DML path, so keys (23505),
//!   │    interleave parents (23503), NOT NULL and types (22P02) are checked.
//!   │    The first error ends the loading (the rest is ignored) and is
//!   │    reported at CopyDone, as PostgreSQL does.
//!   └─ CopyDone: the last rows, then COMMIT of the COPY's own transaction
//!        (retried on 40001 from the kept data when it was at most
//!        COPY_RETRY_BYTES), or the open block goes on. A failing COPY
//!        writes nothing. Tag `COPY n`.
//! COPY … TO STDOUT
//!   └─ the query (or SELECT cols FROM table) runs through the session;
//!        CopyOutResponse, one CopyData per row, CopyDone, `COPY n`
//! ```
//!
//! Options: `FORMAT text|csv`, `DELIMITER`, `NULL`, `HEADER`, `QUOTE`,
//! `ESCAPE`, `FORCE_QUOTE (cols)`, `FORCE_NOT_NULL (cols)`,
//! `FORCE_NULL (cols)`, `ENCODING 'UTF8'`, `FREEZE` (ignored), and the old
//! spellings (`CSV HEADER`, `DELIMITER AS ','`, `NULL AS ''`). The binary
//! format and server-side files or programs are refused (0A000).
//!
//! Memory: the server holds at most one unfinished row of raw data (a row
//! longer than [`MAX_COPY_ROW_BYTES`] fails with 54000), one batch of
//! parsed rows, and — for the retry — up to `COPY_RETRY_BYTES` of raw data.
//! The rows inserted so far live in the transaction's write buffer until
//! COMMIT, as for any INSERT.

use datafusion::sql::sqlparser::ast;
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::parser::Parser;
use datafusion::sql::sqlparser::tokenizer::Token;
use std::fmt::Debug;

use async_trait::async_trait;
use futures::{Sink, SinkExt};
use pgwire::api::copy::CopyHandler;
use pgwire::api::{ClientInfo, PgWireConnectionState};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::copy::{CopyData, CopyDone, CopyFail, CopyInResponse, CopyOutResponse};
use pgwire::messages::response::CommandComplete;
use pgwire::messages::PgWireBackendMessage;
use spindle_sql::parser::Statement;
use spindle_sql::{Error, Output, Session};
use tracing::{info_span, Instrument};

use crate::handler::{status, to_pg, Handler};

/// Rows per INSERT statement when loading COPY data.
pub(crate) const INSERT_BATCH: usize = 1000;

/// The longest row of COPY data (a line, or a CSV record with quoted
/// newlines) the server buffers while waiting for its end; a longer one
/// fails the COPY with SQLSTATE 54000.
pub const MAX_COPY_ROW_BYTES: usize = 64 << 20;

/// A COPY outside a transaction block keeps its raw data while it is at
/// most this large, so that a serialization conflict (40001) at COMMIT can
/// be retried; a larger COPY reports the conflict.
const COPY_RETRY_BYTES: usize = 8 << 20;

/// A parsed COPY statement.
#[derive(Debug, Clone)]
pub(crate) struct CopySpec {
    /// COPY … TO (else FROM).
    pub to: bool,
    pub source: Source,
    pub format: Format,
}

#[derive(Debug, Clone)]
pub(crate) enum Source {
    /// A table, as SQL text (quoting kept), and its listed columns.
    Table {
        name: String,
        columns: Vec<String>,
    },
    Query(Box<ast::Query>),
}

/// The data format and its options.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Format {
    pub csv: bool,
    pub delimiter: char,
    pub null: String,
    pub header: bool,
    pub quote: char,
    pub escape: char,
    /// Column names (folded) for FORCE_QUOTE / FORCE_NOT_NULL / FORCE_NULL.
    pub force_quote: Vec<String>,
    pub force_not_null: Vec<String>,
    pub force_null: Vec<String>,
}

impl Format {
    fn defaults(csv: bool) -> Format {
        Format {
            csv,
            delimiter: if csv { ',' } else { '\t' },
            null: if csv { String::new() } else { "\\N".into() },
            header: false,
            quote: '"',
            escape: '"',
            force_quote: vec![],
            force_not_null: vec![],
            force_null: vec![],
        }
    }
}

/// Whether `sql` is a COPY statement (its first word is COPY).
pub(crate) fn is_copy(sql: &str) -> bool {
    // Most queries plainly start with another word: no tokenizing.
    if spindle_sql::parser::leading_word(sql).is_some_and(|w| !w.eq_ignore_ascii_case("copy")) {
        return false;
    }
    let dialect = PostgreSqlDialect {};
    let Ok(mut p) = Parser::new(&dialect).try_with_sql(sql) else {
        return false;
    };
    while p.consume_token(&Token::SemiColon) {}
    matches!(p.peek_token().token, Token::Word(w) if w.keyword == Keyword::COPY)
}

fn unsupported(what: impl Into<String>) -> Error {
    Error::Unsupported(what.into())
}

fn fold(ident: &ast::Ident) -> String {
    spindle_sql::parser::fold_ident(ident)
}

/// Parses the one COPY statement in `sql`.
pub(crate) fn parse(sql: &str) -> Result<CopySpec, Error> {
    let dialect = PostgreSqlDialect {};
    let syntax = |e: datafusion::sql::sqlparser::parser::ParserError| {
        let msg = e.to_string();
        Error::Syntax(
            msg.strip_prefix("sql parser error: ")
                .unwrap_or(&msg)
                .to_string(),
        )
    };
    let sql = spell_boolean_options(sql);
    let mut stmts = Parser::new(&dialect)
        .try_with_sql(&sql)
        .and_then(|mut p| p.parse_statements())
        .map_err(syntax)?;
    if stmts.len() != 1 {
        return Err(unsupported(
            "COPY must be the only statement in its query string",
        ));
    }
    let Some(ast::Statement::Copy {
        source,
        to,
        target,
        options,
        legacy_options,
        values,
    }) = stmts.pop()
    else {
        return Err(Error::Syntax("expected a COPY statement".into()));
    };
    match (&target, to) {
        (ast::CopyTarget::Stdin, false) | (ast::CopyTarget::Stdout, true) => {}
        (ast::CopyTarget::Stdin, true) => {
            return Err(Error::Syntax("COPY TO cannot write to STDIN".into()))
        }
        (ast::CopyTarget::Stdout, false) => {
            return Err(Error::Syntax("COPY FROM cannot read from STDOUT".into()))
        }
        _ => {
            return Err(unsupported(
                "COPY to or from a server-side file or program is not supported; \
                 use STDIN or STDOUT (psql's \\copy)",
            ))
        }
    }
    if values.iter().any(|v| v.as_deref() != Some("")) {
        return Err(unsupported(
            "COPY data inside the query string is not supported",
        ));
    }
    let source = match source {
        ast::CopySource::Table {
            table_name,
            columns,
        } => Source::Table {
            name: table_name.to_string(),
            columns: columns.iter().map(|c| c.to_string()).collect(),
        },
        ast::CopySource::Query(q) => Source::Query(q),
    };
    let format = parse_format(&options, &legacy_options)?;
    Ok(CopySpec { to, source, format })
}

/// PostgreSQL's boolean COPY options (`FREEZE`, `HEADER`) take any
/// boolean spelling — `pgbench -i` sends `WITH (freeze on)` — while
/// sqlparser knows only TRUE and FALSE after them: the other spellings
/// (`ON`, `OFF`, `1`, `0`) are rewritten to those before parsing. Only the
/// value right after the option word changes; the rest of the text is
/// left as it was (quoted strings included).
fn spell_boolean_options(sql: &str) -> std::borrow::Cow<'_, str> {
    use datafusion::sql::sqlparser::tokenizer::Tokenizer;
    let dialect = PostgreSqlDialect {};
    let Ok(tokens) = Tokenizer::new(&dialect, sql).tokenize_with_location() else {
        // The parser reports the error.
        return sql.into();
    };
    let mut edits: Vec<(usize, usize, &str)> = Vec::new();
    let mut words = tokens
        .iter()
        .filter(|t| !matches!(t.token, Token::Whitespace(_)))
        .peekable();
    while let Some(t) = words.next() {
        let Token::Word(w) = &t.token else { continue };
        if w.quote_style.is_some() || !matches!(w.keyword, Keyword::FREEZE | Keyword::HEADER) {
            continue;
        }
        let Some(next) = words.peek() else { break };
        let (text, value) = match &next.token {
            Token::Word(v) if v.quote_style.is_none() => {
                (v.value.as_str(), v.value.to_ascii_lowercase())
            }
            Token::Number(n, _) => (n.as_str(), n.clone()),
            _ => continue,
        };
        let spelled = match value.as_str() {
            "on" | "1" => "TRUE",
            "off" | "0" => "FALSE",
            _ => continue,
        };
        if let Some(start) = byte_offset(sql, next.span.start.line, next.span.start.column) {
            edits.push((start, start + text.len(), spelled));
        }
    }
    if edits.is_empty() {
        return sql.into();
    }
    let mut out = String::with_capacity(sql.len());
    let mut at = 0;
    for (start, end, text) in edits {
        if sql.get(at..start).is_none() || sql.get(start..end).is_none() {
            return sql.into();
        }
        out.push_str(&sql[at..start]);
        out.push_str(text);
        at = end;
    }
    out.push_str(&sql[at..]);
    out.into()
}

/// The byte offset of a tokenizer location (1-based line and character
/// column).
fn byte_offset(sql: &str, line: u64, column: u64) -> Option<usize> {
    let mut offset = 0;
    for (n, text) in sql.split_inclusive('\n').enumerate() {
        if n as u64 + 1 == line {
            let skip = usize::try_from(column.checked_sub(1)?).ok()?;
            return text.char_indices().nth(skip).map(|(i, _)| offset + i);
        }
        offset += text.len();
    }
    None
}

fn parse_format(
    options: &[ast::CopyOption],
    legacy: &[ast::CopyLegacyOption],
) -> Result<Format, Error> {
    use ast::CopyLegacyCsvOption as L;
    use ast::CopyLegacyOption as O;
    use ast::CopyOption as C;
    let bad = |m: String| Error::InvalidParameterValue(m);
    // The format first: the other options' defaults depend on it.
    let mut csv = false;
    for o in options {
        if let C::Format(name) = o {
            match name.value.to_ascii_lowercase().as_str() {
                "text" => csv = false,
                "csv" => csv = true,
                "binary" => return Err(unsupported("COPY in binary format is not supported")),
                other => return Err(bad(format!("COPY format \"{other}\" not recognized"))),
            }
        }
    }
    for o in legacy {
        match o {
            O::Csv(_) => csv = true,
            O::Binary => return Err(unsupported("COPY in binary format is not supported")),
            _ => {}
        }
    }
    let mut f = Format::defaults(csv);
    let mut quote = None;
    let mut escape = None;
    let csv_only = |what: &str| -> Result<(), Error> {
        if csv {
            Ok(())
        } else {
            Err(unsupported(format!(
                "COPY {what} available only in CSV mode"
            )))
        }
    };
    let names = |cols: &[ast::Ident]| cols.iter().map(fold).collect::<Vec<_>>();
    for o in options {
        match o {
            C::Format(_) | C::Freeze(_) => {}
            C::Delimiter(c) => f.delimiter = *c,
            C::Null(s) => f.null = s.clone(),
            C::Header(h) => f.header = *h,
            C::Quote(c) => {
                csv_only("quote")?;
                quote = Some(*c);
            }
            C::Escape(c) => {
                csv_only("escape")?;
                escape = Some(*c);
            }
            C::ForceQuote(cols) => {
                csv_only("force quote")?;
                f.force_quote = names(cols);
            }
            C::ForceNotNull(cols) => {
                csv_only("force not null")?;
                f.force_not_null = names(cols);
            }
            C::ForceNull(cols) => {
                csv_only("force null")?;
                f.force_null = names(cols);
            }
            C::Encoding(e) => {
                let e = e.to_ascii_uppercase().replace(['-', '_'], "");
                if e != "UTF8" && e != "UNICODE" {
                    return Err(unsupported(format!(
                        "COPY encoding \"{e}\" is not supported; data is UTF8"
                    )));
                }
            }
        }
    }
    for o in legacy {
        match o {
            O::Csv(csv_opts) => {
                for c in csv_opts {
                    match c {
                        L::Header => f.header = true,
                        L::Quote(q) => quote = Some(*q),
                        L::Escape(e) => escape = Some(*e),
                        L::ForceQuote(cols) => f.force_quote = names(cols),
                        L::ForceNotNull(cols) => f.force_not_null = names(cols),
                    }
                }
            }
            O::Delimiter(c) => f.delimiter = *c,
            O::Null(s) => f.null = s.clone(),
            O::Header => f.header = true,
            O::Binary => {}
            other => return Err(unsupported(format!("COPY option {other} is not supported"))),
        }
    }
    if let Some(q) = quote {
        f.quote = q;
        f.escape = q;
    }
    if let Some(e) = escape {
        f.escape = e;
    }
    let one_byte = |c: char| c.is_ascii();
    if !one_byte(f.delimiter) {
        return Err(unsupported(
            "COPY delimiter must be a single one-byte character",
        ));
    }
    if f.delimiter == '\n' || f.delimiter == '\r' {
        return Err(bad(
            "COPY delimiter cannot be newline or carriage return".into()
        ));
    }
    if f.null.contains(['\n', '\r']) {
        return Err(bad(
            "COPY null representation cannot use newline or carriage return".into(),
        ));
    }
    if !csv && f.delimiter == '\\' {
        return Err(bad("COPY delimiter cannot be \"\\\"".into()));
    }
    if csv {
        if !one_byte(f.quote) || !one_byte(f.escape) {
            return Err(unsupported(
                "COPY quote and escape must be single one-byte characters",
            ));
        }
        if f.delimiter == f.quote {
            return Err(bad("COPY delimiter and quote must be different".into()));
        }
        if f.null.contains(f.delimiter) {
            return Err(bad(
                "COPY delimiter must not appear in the NULL specification".into(),
            ));
        }
    }
    Ok(f)
}

/// The statement that reads what `COPY … TO` writes.
pub(crate) fn read_statement(spec: &CopySpec) -> Result<Statement, Error> {
    match &spec.source {
        Source::Query(q) => Ok(Statement::Query(Box::new(ast::Statement::Query(q.clone())))),
        Source::Table { name, columns } => one_statement(&select_sql(name, columns)),
    }
}

/// `SELECT cols FROM table` (all visible columns when none are listed).
pub(crate) fn select_sql(table: &str, columns: &[String]) -> String {
    let cols = if columns.is_empty() {
        "*".to_string()
    } else {
        columns.join(", ")
    };
    format!("SELECT {cols} FROM {table}")
}

fn one_statement(sql: &str) -> Result<Statement, Error> {
    let mut stmts = spindle_sql::parser::parse(sql)?;
    match (stmts.pop(), stmts.is_empty()) {
        (Some(s), true) => Ok(s),
        _ => Err(Error::Internal(format!("expected one statement: {sql}"))),
    }
}

/// The table a COPY's `table` text names, as the catalog knows it
/// (`public."T"` → `T`).
pub(crate) fn target_table(table: &str) -> Result<String, Error> {
    let name = Parser::new(&PostgreSqlDialect {})
        .try_with_sql(table)
        .and_then(|mut p| p.parse_object_name(false))
        .map_err(|e| Error::Syntax(e.to_string()))?;
    spindle_sql::parser::object_name(&name)
}

// ---------------------------------------------------------------------------
// The protocol

/// A `COPY … FROM STDIN` receiving its data.
pub(crate) struct Pending {
    table: String,
    /// The table as the catalog names it, and the columns the data fills.
    target: String,
    columns: Vec<String>,
    reader: Reader,
    /// Parsed rows waiting for a full batch (fewer than [`INSERT_BATCH`]).
    rows: Vec<Row>,
    /// Rows inserted so far.
    inserted: u64,
    /// The COPY began its own transaction (it is not in a block).
    own_txn: bool,
    /// All data so far, for a retry, while at most [`COPY_RETRY_BYTES`].
    retained: Option<Vec<u8>>,
    /// The first error; the data after it is ignored. Reported at CopyDone.
    error: Option<Error>,
}

impl Pending {
    /// Takes one CopyData: complete rows are parsed, full batches inserted.
    async fn feed(&mut self, session: &mut Session, data: &[u8]) -> Result<(), Error> {
        if let Some(kept) = &mut self.retained {
            if kept.len() + data.len() <= COPY_RETRY_BYTES {
                kept.extend_from_slice(data);
            } else {
                self.retained = None;
            }
        }
        let rows = self.reader.push(data)?;
        self.rows.extend(rows);
        while self.rows.len() >= INSERT_BATCH {
            let batch: Vec<Row> = self.rows.drain(..INSERT_BATCH).collect();
            // Boxed: the insert's future is large, and this one is moved
            // into a box for every CopyData message (pgwire's handler is
            // an async trait), one message per row from some clients.
            self.inserted +=
                Box::pin(insert_batch(session, &self.target, &self.columns, batch)).await?;
        }
        Ok(())
    }

    /// The end of the data: the last rows are parsed and inserted.
    async fn flush(&mut self, session: &mut Session) -> Result<(), Error> {
        let rows = self.reader.finish()?;
        self.rows.extend(rows);
        let rows = std::mem::take(&mut self.rows);
        self.inserted += insert_batch(session, &self.target, &self.columns, rows).await?;
        Ok(())
    }

    /// Stops loading after an error: the COPY's own transaction is rolled
    /// back (a transaction block fails), the buffers are dropped.
    async fn abandon(&mut self, session: &mut Session) {
        if self.own_txn && session.in_transaction() {
            let _ = session.execute_statement(Statement::Rollback).await;
        }
        session.fail();
        self.rows = Vec::new();
        self.retained = None;
        self.reader.discard();
    }

    /// Loads the kept data again, in a new transaction (after a conflict).
    async fn reload(&mut self, session: &mut Session, data: &[u8]) -> Result<(), Error> {
        session
            .execute_statement(Statement::Begin { read_only: false })
            .await?;
        self.reader = self.reader.restart();
        self.rows.clear();
        self.inserted = 0;
        self.retained = None;
        let r = async {
            self.feed(session, data).await?;
            self.flush(session).await
        }
        .await;
        if r.is_err() {
            let _ = session.execute_statement(Statement::Rollback).await;
        }
        r
    }
}

/// Attempts for a COPY FROM outside a transaction block that hits a
/// serialization conflict at commit (when its data was kept).
const COPY_ATTEMPTS: usize = 5;

/// Checks a COPY when it is prepared (Parse), as PostgreSQL does: the
/// statement, the transaction state and the names it uses. (Clients such
/// as tokio-postgres expect these errors before the COPY starts.)
pub(crate) async fn check(session: &Session, sql: &str) -> Result<(), Error> {
    let spec = parse(sql)?;
    if session.transaction_failed() {
        return Err(Error::InFailedTransaction);
    }
    let select = match &spec.source {
        Source::Table { name, columns } => select_sql(name, columns),
        Source::Query(q) => q.to_string(),
    };
    session.describe(&select).await.map(|_| ())
}

impl Handler {
    /// Starts the COPY in `sql`. `COPY … TO STDOUT` runs to completion;
    /// `COPY … FROM STDIN` sends CopyInResponse and leaves the connection
    /// in copy-in mode. Returns (inner) whether copy-in started, or the
    /// statement's error (nothing has been sent for it yet).
    pub(crate) async fn start_copy<C>(
        &self,
        client: &mut C,
        session: &mut Session,
        sql: &str,
        extended: bool,
    ) -> PgWireResult<Result<bool, Error>>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let spec = match parse(sql) {
            Ok(s) => s,
            Err(e) => return Ok(Err(e)),
        };
        if spec.to {
            let lines = match self.copy_out_lines(session, &spec).await {
                Ok(l) => l,
                Err(e) => return Ok(Err(e)),
            };
            let (ncols, lines, rows) = lines;
            client
                .feed(PgWireBackendMessage::CopyOutResponse(CopyOutResponse::new(
                    0,
                    ncols as i16,
                    vec![0; ncols],
                )))
                .await?;
            for line in lines {
                client
                    .feed(PgWireBackendMessage::CopyData(CopyData::new(
                        bytes::Bytes::from(line),
                    )))
                    .await?;
            }
            client
                .feed(PgWireBackendMessage::CopyDone(CopyDone::new()))
                .await?;
            client
                .feed(PgWireBackendMessage::CommandComplete(CommandComplete::new(
                    format!("COPY {rows}"),
                )))
                .await?;
            return Ok(Ok(false));
        }
        let pending = match self.copy_in_target(session, spec).await {
            Ok(p) => p,
            Err(e) => return Ok(Err(e)),
        };
        let n = pending.reader.columns.len();
        *self.conn.copy_in.lock().await = Some(pending);
        client.set_state(PgWireConnectionState::CopyInProgress(extended));
        client
            .send(PgWireBackendMessage::CopyInResponse(CopyInResponse::new(
                0,
                n as i16,
                vec![0; n],
            )))
            .await?;
        Ok(Ok(true))
    }

    /// Runs a COPY TO's query: the column count, the lines to send (the
    /// header first, if any) and the number of rows.
    async fn copy_out_lines(
        &self,
        session: &mut Session,
        spec: &CopySpec,
    ) -> Result<(usize, Vec<String>, usize), Error> {
        let label = match &spec.source {
            Source::Table { name, .. } => name.clone(),
            Source::Query(_) => "query".to_string(),
        };
        let stmt = read_statement(spec)?;
        let (schema, batches) = {
            let _running = self.conn.shared.in_flight.read().await;
            match session.execute_statement(stmt).await? {
                Output::Rows { schema, batches } => (schema, batches),
                Output::Command { .. } => {
                    return Err(Error::Internal("COPY query returned no rows".into()))
                }
            }
        };
        let names: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
        let pg_types: Vec<_> = schema
            .fields()
            .iter()
            .map(|f| crate::types::pg_type(f))
            .collect();
        let writer = Writer::new(spec.format.clone(), &names, &label)?;
        let mut lines: Vec<String> = writer.header(&names).into_iter().collect();
        let mut rows = 0;
        for batch in &batches {
            for row in 0..batch.num_rows() {
                let mut values = Vec::with_capacity(names.len());
                for (col, t) in batch.columns().iter().zip(&pg_types) {
                    let v = spindle_sql::types::array_value(col.as_ref(), row)?;
                    values.push(crate::types::text(&v, t));
                }
                lines.push(writer.line(&values));
                rows += 1;
            }
        }
        // The header travels with the first row: clients count CopyData
        // messages as rows.
        if writer.format.header && lines.len() > 1 {
            let first = lines.remove(1);
            lines[0].push_str(&first);
        }
        Ok((names.len(), lines, rows))
    }

    /// Checks a COPY FROM's target and prepares for its data.
    async fn copy_in_target(
        &self,
        session: &mut Session,
        spec: CopySpec,
    ) -> Result<Pending, Error> {
        if session.transaction_failed() {
            return Err(Error::InFailedTransaction);
        }
        let Source::Table { name, columns } = spec.source else {
            return Err(Error::Syntax(
                "COPY FROM does not support a query as its target".into(),
            ));
        };
        let desc = session.describe(&select_sql(&name, &columns)).await?;
        let schema = desc
            .columns
            .clone()
            .ok_or_else(|| Error::Internal(format!("COPY target {name} has no columns")))?;
        let columns: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
        let target = target_table(&name)?;
        let reader = Reader::new(spec.format, &name, columns.clone())?;
        // Outside a transaction block the COPY is one transaction of its
        // own, begun now: rows go into it as they arrive.
        let own_txn = !session.in_transaction();
        if own_txn {
            session
                .execute_statement(Statement::Begin { read_only: false })
                .await?;
        }
        Ok(Pending {
            table: name,
            target,
            columns,
            reader,
            rows: Vec::new(),
            inserted: 0,
            own_txn,
            retained: own_txn.then(Vec::new),
            error: None,
        })
    }

    /// Finishes a COPY FROM at CopyDone: the last rows, then the COMMIT
    /// of its own transaction (retried on 40001 when the data was kept).
    /// Returns the number of rows.
    async fn finish_copy_in(session: &mut Session, p: &mut Pending) -> Result<u64, Error> {
        if let Some(e) = p.error.take() {
            return Err(e);
        }
        if let Err(e) = p.flush(session).await {
            p.abandon(session).await;
            return Err(e);
        }
        if !p.own_txn {
            return Ok(p.inserted);
        }
        let mut attempt = 1;
        loop {
            match session.execute_statement(Statement::Commit).await {
                Ok(_) => return Ok(p.inserted),
                Err(e) if e.is_retryable() && attempt < COPY_ATTEMPTS && p.retained.is_some() => {
                    let data = p.retained.take().unwrap_or_default();
                    tokio::time::sleep(std::time::Duration::from_millis(5 * attempt as u64)).await;
                    attempt += 1;
                    p.reload(session, &data).await?;
                    p.retained = Some(data);
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// Inserts one batch of a COPY's rows (text values, `None` for NULL; at
/// most [`INSERT_BATCH`]) into `columns` of `table` as one statement: no
/// SQL text or syntax tree per row.
async fn insert_batch(
    session: &mut Session,
    table: &str,
    columns: &[String],
    rows: Vec<Row>,
) -> Result<u64, Error> {
    if rows.is_empty() {
        return Ok(0);
    }
    let stmt = Statement::InsertText {
        table: table.to_string(),
        columns: columns.to_vec(),
        rows,
    };
    Ok(match session.execute_statement(stmt).await? {
        Output::Command { rows, .. } => rows,
        _ => 0,
    })
}

#[async_trait]
impl CopyHandler for Handler {
    async fn on_copy_data<C>(&self, _client: &mut C, copy_data: CopyData) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        // Errors wait for CopyDone: PostgreSQL reports them once, after
        // the client has finished sending.
        let mut session = self.conn.session.lock().await;
        let mut copy_in = self.conn.copy_in.lock().await;
        let Some(p) = copy_in.as_mut() else {
            return Ok(());
        };
        if p.error.is_some() {
            return Ok(());
        }
        let r = {
            let _running = self.conn.shared.in_flight.read().await;
            p.feed(&mut session, &copy_data.data).await
        };
        if let Err(e) = r {
            Box::pin(p.abandon(&mut session)).await;
            p.error = Some(e);
        }
        Ok(())
    }

    async fn on_copy_done<C>(&self, client: &mut C, _done: CopyDone) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let mut session = self.conn.session.lock().await;
        let Some(mut pending) = self.conn.copy_in.lock().await.take() else {
            return Err(PgWireError::UserError(Box::new(ErrorInfo::new(
                "ERROR".into(),
                "08P01".into(),
                "CopyDone without a COPY in progress".into(),
            ))));
        };
        let span = info_span!(
            "statement",
            kind = "COPY",
            table = %pending.table,
            rows = tracing::field::Empty,
            ms = tracing::field::Empty
        );
        let start = std::time::Instant::now();
        let r = {
            let _running = self.conn.shared.in_flight.read().await;
            Self::finish_copy_in(&mut session, &mut pending)
                .instrument(span.clone())
                .await
        };
        span.record("ms", start.elapsed().as_secs_f64() * 1000.0);
        if r.is_err() {
            session.fail();
        }
        client.set_transaction_status(status(&session));
        match r {
            Ok(n) => {
                span.record("rows", n);
                client
                    .send(PgWireBackendMessage::CommandComplete(CommandComplete::new(
                        format!("COPY {n}"),
                    )))
                    .await?;
                Ok(())
            }
            Err(e) => Err(to_pg(&e)),
        }
    }

    async fn on_copy_fail<C>(&self, client: &mut C, fail: CopyFail) -> PgWireError
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let mut session = self.conn.session.lock().await;
        match self.conn.copy_in.lock().await.take() {
            Some(mut p) => p.abandon(&mut session).await,
            None => session.fail(),
        }
        client.set_transaction_status(status(&session));
        to_pg(&Error::QueryCanceled(format!(
            "COPY from stdin failed: {}",
            fail.message
        )))
    }
}

// ---------------------------------------------------------------------------
// Reading COPY data

/// One row of COPY data: a text value per column, `None` for NULL.
pub(crate) type Row = Vec<Option<String>>;

/// Splits COPY data into rows as it arrives: [`Reader::push`] returns the
/// complete rows and keeps only the unfinished last one (at most
/// [`MAX_COPY_ROW_BYTES`]); [`Reader::finish`] returns the rest.
pub(crate) struct Reader {
    format: Format,
    table: String,
    pub(crate) columns: Vec<String>,
    force_null: Vec<bool>,
    force_not_null: Vec<bool>,
    max_row: usize,
    /// Data not yet split: the beginning of an unfinished row.
    buf: Vec<u8>,
    /// How much of `buf` has been scanned for the end of a row, and
    /// (CSV) whether that point is inside quotes.
    scanned: usize,
    in_quotes: bool,
    /// Lines before `buf` (for error messages).
    lines: usize,
    /// HEADER: the first row is still to be skipped.
    header_pending: bool,
    /// `\.` was read, or loading stopped: the rest is ignored.
    ended: bool,
}

impl Reader {
    /// A reader for rows of `columns` (FORCE_NULL / FORCE_NOT_NULL must
    /// name some of them: 42703).
    pub fn new(format: Format, table: &str, columns: Vec<String>) -> Result<Reader, Error> {
        let flags = |names: &[String]| -> Result<Vec<bool>, Error> {
            for n in names {
                if !columns.contains(n) {
                    return Err(Error::Catalog(spindle_catalog::Error::NoSuchColumn(
                        n.clone(),
                        table.to_string(),
                    )));
                }
            }
            Ok(columns.iter().map(|c| names.contains(c)).collect())
        };
        let force_null = flags(&format.force_null)?;
        let force_not_null = flags(&format.force_not_null)?;
        Ok(Reader {
            header_pending: format.header,
            format,
            table: table.to_string(),
            columns,
            force_null,
            force_not_null,
            max_row: MAX_COPY_ROW_BYTES,
            buf: Vec::new(),
            scanned: 0,
            in_quotes: false,
            lines: 0,
            ended: false,
        })
    }

    /// A new reader with the same settings, at the start of the data.
    pub fn restart(&self) -> Reader {
        Reader {
            format: self.format.clone(),
            table: self.table.clone(),
            columns: self.columns.clone(),
            force_null: self.force_null.clone(),
            force_not_null: self.force_not_null.clone(),
            max_row: self.max_row,
            buf: Vec::new(),
            scanned: 0,
            in_quotes: false,
            lines: 0,
            header_pending: self.format.header,
            ended: false,
        }
    }

    /// Drops the buffered data and ignores whatever comes after.
    pub fn discard(&mut self) {
        self.buf = Vec::new();
        self.scanned = 0;
        self.ended = true;
    }

    /// Bytes held for an unfinished row.
    #[cfg(test)]
    fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Takes more data; returns the rows it completes.
    pub fn push(&mut self, data: &[u8]) -> Result<Vec<Row>, Error> {
        if self.ended {
            return Ok(Vec::new());
        }
        self.buf.extend_from_slice(data);
        let cut = self.scan();
        let rows = if cut > 0 {
            let chunk: Vec<u8> = self.buf.drain(..cut).collect();
            self.scanned -= cut;
            self.rows(&chunk)?
        } else {
            Vec::new()
        };
        if !self.ended && self.buf.len() > self.max_row {
            return Err(Error::LimitExceeded(format!(
                "COPY row is longer than the limit of {} bytes (COPY {}, line {})",
                self.max_row,
                self.table,
                self.lines + 1
            )));
        }
        Ok(rows)
    }

    /// The end of the data: the rows still buffered.
    pub fn finish(&mut self) -> Result<Vec<Row>, Error> {
        if self.ended {
            return Ok(Vec::new());
        }
        let chunk = std::mem::take(&mut self.buf);
        self.scanned = 0;
        let rows = self.rows(&chunk)?;
        self.ended = true;
        Ok(rows)
    }

    /// Scans `buf` from where the last scan stopped; returns the length of
    /// its complete rows (up to and including the last newline that ends
    /// a row), 0 if there is none.
    fn scan(&mut self) -> usize {
        let b = &self.buf;
        let from = self.scanned;
        if !self.format.csv {
            self.scanned = b.len();
            return b[from..]
                .iter()
                .rposition(|&c| c == b'\n')
                .map_or(0, |p| from + p + 1);
        }
        // CSV: a newline inside quotes does not end a row. Quote and escape
        // are ASCII (checked by parse_format), so bytes suffice.
        let (quote, escape) = (self.format.quote as u8, self.format.escape as u8);
        let mut cut = 0;
        let mut i = from;
        while i < b.len() {
            let c = b[i];
            if !self.in_quotes {
                if c == quote {
                    self.in_quotes = true;
                } else if c == b'\n' {
                    cut = i + 1;
                }
                i += 1;
                continue;
            }
            if c == escape || c == quote {
                // An escaped quote or escape (`""` when they are the same)
                // stays inside quotes; the byte after decides.
                let Some(&next) = b.get(i + 1) else {
                    break;
                };
                if c == escape && (next == quote || next == escape) {
                    i += 2;
                    continue;
                }
                if c == quote {
                    self.in_quotes = false;
                }
            }
            i += 1;
        }
        self.scanned = i;
        cut
    }

    /// Splits complete rows (`chunk` ends at a row's end, or is the last
    /// data) into values.
    fn rows(&mut self, chunk: &[u8]) -> Result<Vec<Row>, Error> {
        let Reader {
            format: f,
            table,
            columns,
            force_null,
            force_not_null,
            lines,
            header_pending,
            ..
        } = self;
        let table = table.as_str();
        let first = *lines;
        let text = std::str::from_utf8(chunk).map_err(|e| {
            let line = chunk[..e.valid_up_to()]
                .iter()
                .filter(|b| **b == b'\n')
                .count()
                + 1;
            Error::InvalidEncoding(format!(
                "invalid byte sequence for encoding \"UTF8\" (COPY {table}, line {})",
                first + line
            ))
        })?;
        let (records, ended) = if f.csv {
            split_csv(text, f)
        } else {
            split_text(text, f)
        }
        .map_err(|(line, m)| bad_row(m, table, first + line))?;
        *lines += chunk.iter().filter(|b| **b == b'\n').count();
        let mut rows = Vec::with_capacity(records.len());
        for rec in records {
            if std::mem::take(header_pending) {
                continue;
            }
            let line = first + rec.line;
            if rec.fields.len() > columns.len() {
                return Err(bad_row(
                    "extra data after last expected column".into(),
                    table,
                    line,
                ));
            }
            if rec.fields.len() < columns.len() {
                return Err(bad_row(
                    format!("missing data for column \"{}\"", columns[rec.fields.len()]),
                    table,
                    line,
                ));
            }
            let mut row = Vec::with_capacity(columns.len());
            for (c, field) in rec.fields.into_iter().enumerate() {
                let is_null = if f.csv {
                    field.raw == f.null
                        && ((!field.quoted && !force_not_null[c])
                            || (field.quoted && force_null[c]))
                } else {
                    field.raw == f.null
                };
                if is_null {
                    row.push(None);
                } else if f.csv {
                    row.push(Some(field.raw));
                } else {
                    row.push(Some(
                        unescape_text(&field.raw).map_err(|m| bad_value(m, table, line))?,
                    ));
                }
            }
            rows.push(row);
        }
        if ended {
            self.discard();
        }
        Ok(rows)
    }
}

/// Splits all of `data` into rows of `columns.len()` fields.
#[cfg(test)]
pub(crate) fn parse_rows(
    data: &[u8],
    f: &Format,
    table: &str,
    columns: &[String],
) -> Result<Vec<Row>, Error> {
    let mut r = Reader::new(f.clone(), table, columns.to_vec())?;
    let mut rows = r.push(data)?;
    rows.extend(r.finish()?);
    Ok(rows)
}

fn bad_row(message: String, table: &str, line: usize) -> Error {
    Error::BadCopyFormat(format!("{message} (COPY {table}, line {line})"))
}

fn bad_value(message: String, table: &str, line: usize) -> Error {
    Error::InvalidEncoding(format!("{message} (COPY {table}, line {line})"))
}

/// A field as read: text format keeps its escapes (NULL is recognised
/// before unescaping, as in PostgreSQL); CSV is unquoted already.
#[derive(Debug, PartialEq)]
struct Field {
    raw: String,
    quoted: bool,
}

#[derive(Debug)]
struct Record {
    line: usize,
    fields: Vec<Field>,
}

/// Text format: a row per line (`\n` or `\r\n`), fields split at
/// unescaped delimiters, `\.` alone on a line ends the data.
fn split_text(data: &str, f: &Format) -> Result<(Vec<Record>, bool), (usize, String)> {
    let mut out = Vec::new();
    let lines: Vec<&str> = data.split('\n').collect();
    let n = lines.len();
    for (i, raw) in lines.into_iter().enumerate() {
        if i + 1 == n && raw.is_empty() {
            break; // after the final newline
        }
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        if line == "\\." {
            return Ok((out, true));
        }
        let mut fields = Vec::new();
        let mut cur = String::new();
        let mut chars = line.chars();
        while let Some(c) = chars.next() {
            if c == '\\' {
                cur.push(c);
                if let Some(next) = chars.next() {
                    cur.push(next);
                }
            } else if c == f.delimiter {
                fields.push(Field {
                    raw: std::mem::take(&mut cur),
                    quoted: false,
                });
            } else {
                cur.push(c);
            }
        }
        fields.push(Field {
            raw: cur,
            quoted: false,
        });
        out.push(Record {
            line: i + 1,
            fields,
        });
    }
    Ok((out, false))
}

/// Text format escapes: `\b \f \n \r \t \v`, octal `\NNN`, hex `\xNN`, and
/// a backslash before any other character stands for that character.
fn unescape_text(s: &str) -> Result<String, String> {
    if !s.contains('\\') {
        return Ok(s.to_string());
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' || i + 1 == b.len() {
            out.push(b[i]);
            i += 1;
            continue;
        }
        let c = b[i + 1];
        i += 2;
        match c {
            b'b' => out.push(8),
            b'f' => out.push(12),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'v' => out.push(11),
            b'0'..=b'7' => {
                let mut v = u32::from(c - b'0');
                for _ in 0..2 {
                    match b.get(i) {
                        Some(d @ b'0'..=b'7') => {
                            v = v * 8 + u32::from(d - b'0');
                            i += 1;
                        }
                        _ => break,
                    }
                }
                out.push((v & 0xff) as u8);
            }
            b'x' if b.get(i).is_some_and(|d| d.is_ascii_hexdigit()) => {
                let mut v = 0u32;
                for _ in 0..2 {
                    match b.get(i).and_then(|d| (*d as char).to_digit(16)) {
                        Some(d) => {
                            v = v * 16 + d;
                            i += 1;
                        }
                        None => break,
                    }
                }
                out.push(v as u8);
            }
            other => out.push(other),
        }
    }
    String::from_utf8(out).map_err(|_| "invalid byte sequence for encoding \"UTF8\"".to_string())
}

/// CSV: fields split at delimiters outside quotes, quoted fields may hold
/// delimiters and newlines, the escape character (the quote by default)
/// escapes a quote inside quotes; `\.` alone on a line ends the data.
fn split_csv(data: &str, f: &Format) -> Result<(Vec<Record>, bool), (usize, String)> {
    let mut out = Vec::new();
    let mut chars = data.chars().peekable();
    let mut line = 1;
    while chars.peek().is_some() {
        let start = line;
        let mut fields = Vec::new();
        let mut cur = String::new();
        let mut quoted = false;
        let mut in_quotes = false;
        loop {
            let Some(c) = chars.next() else {
                if in_quotes {
                    return Err((start, "unterminated CSV quoted field".into()));
                }
                break;
            };
            if in_quotes {
                if c == f.escape {
                    if let Some(&n) = chars.peek() {
                        if n == f.quote || n == f.escape {
                            cur.push(n);
                            chars.next();
                            continue;
                        }
                    }
                }
                if c == f.quote {
                    in_quotes = false;
                    continue;
                }
                if c == '\n' {
                    line += 1;
                }
                cur.push(c);
            } else if c == f.quote {
                in_quotes = true;
                quoted = true;
            } else if c == f.delimiter {
                fields.push(Field {
                    raw: std::mem::take(&mut cur),
                    quoted: std::mem::take(&mut quoted),
                });
            } else if c == '\n' {
                line += 1;
                break;
            } else if c == '\r' && chars.peek() == Some(&'\n') {
                continue;
            } else {
                cur.push(c);
            }
        }
        fields.push(Field { raw: cur, quoted });
        if fields.len() == 1 && !fields[0].quoted && fields[0].raw == "\\." {
            return Ok((out, true));
        }
        out.push(Record {
            line: start,
            fields,
        });
    }
    Ok((out, false))
}

// ---------------------------------------------------------------------------
// Writing COPY data

/// Appends one value in text format (`None` is NULL).
fn write_text(v: Option<&str>, f: &Format, out: &mut String) {
    let Some(s) = v else {
        out.push_str(&f.null);
        return;
    };
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\u{b}' => out.push_str("\\v"),
            c if c == f.delimiter => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
}

/// Appends one value in CSV: quoted when it holds the delimiter, a quote,
/// a newline, equals the NULL string, or `force`.
fn write_csv(v: Option<&str>, f: &Format, force: bool, first: bool, out: &mut String) {
    let Some(s) = v else {
        out.push_str(&f.null);
        return;
    };
    let needs = force
        || s == f.null
        || (first && s == "\\.")
        || s.contains([f.delimiter, f.quote, '\n', '\r']);
    if !needs {
        out.push_str(s);
        return;
    }
    out.push(f.quote);
    for c in s.chars() {
        if c == f.quote || c == f.escape {
            out.push(f.escape);
        }
        out.push(c);
    }
    out.push(f.quote);
}

/// Formats rows (and the header) as COPY lines.
pub(crate) struct Writer {
    format: Format,
    force_quote: Vec<bool>,
}

impl Writer {
    pub fn new(format: Format, columns: &[String], table: &str) -> Result<Writer, Error> {
        for n in &format.force_quote {
            if !columns.contains(n) {
                return Err(Error::Catalog(spindle_catalog::Error::NoSuchColumn(
                    n.clone(),
                    table.to_string(),
                )));
            }
        }
        let force_quote = columns
            .iter()
            .map(|c| format.force_quote.contains(c))
            .collect();
        Ok(Writer {
            format,
            force_quote,
        })
    }

    /// One line (with its newline) for `values`.
    pub fn line(&self, values: &[Option<String>]) -> String {
        let f = &self.format;
        let mut out = String::new();
        for (i, v) in values.iter().enumerate() {
            if i > 0 {
                out.push(f.delimiter);
            }
            if f.csv {
                let force = self.force_quote.get(i).copied().unwrap_or(false);
                write_csv(v.as_deref(), f, force, i == 0, &mut out);
            } else {
                write_text(v.as_deref(), f, &mut out);
            }
        }
        out.push('\n');
        out
    }

    /// The header line, if the format asks for one.
    pub fn header(&self, columns: &[String]) -> Option<String> {
        if !self.format.header {
            return None;
        }
        let f = Format {
            // A column name is never NULL, and is quoted only when needed.
            null: "\u{0}".into(),
            force_quote: vec![],
            ..self.format.clone()
        };
        let w = Writer {
            format: f,
            force_quote: vec![],
        };
        let names: Vec<Option<String>> = columns.iter().map(|c| Some(c.clone())).collect();
        Some(w.line(&names))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(sql: &str) -> CopySpec {
        parse(sql).unwrap()
    }

    fn cols(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn recognises_copy_statements_and_options() {
        assert!(is_copy("  copy t from stdin"));
        assert!(is_copy("-- c\nCOPY t TO STDOUT"));
        assert!(!is_copy("SELECT 1"));
        assert!(!is_copy("copyx"));
        let s = spec("COPY t (a, \"B\") FROM STDIN");
        assert!(!s.to);
        match &s.source {
            Source::Table { name, columns } => {
                assert_eq!(name, "t");
                assert_eq!(columns, &cols(&["a", "\"B\""]));
            }
            _ => panic!(),
        }
        assert_eq!(s.format, Format::defaults(false));
        let s = spec("COPY t FROM STDIN;");
        assert_eq!(s.format, Format::defaults(false));
        let s = spec("COPY t FROM STDIN WITH (FORMAT csv, HEADER true, DELIMITER ';', NULL 'x')");
        assert!(s.format.csv && s.format.header);
        assert_eq!(s.format.delimiter, ';');
        assert_eq!(s.format.null, "x");
        let s = spec("COPY t FROM STDIN CSV HEADER");
        assert!(s.format.csv && s.format.header);
        assert_eq!(s.format.delimiter, ',');
        let s = spec("COPY t TO STDOUT (FORMAT csv, QUOTE '''', ESCAPE '\\')");
        assert_eq!((s.format.quote, s.format.escape), ('\'', '\\'));
        let s = spec("COPY (SELECT 1) TO STDOUT");
        assert!(s.to && matches!(s.source, Source::Query(_)));
        let s = spec("COPY t FROM STDIN DELIMITER AS '|' NULL AS ''");
        assert_eq!((s.format.delimiter, s.format.null.as_str()), ('|', ""));

        // Any boolean spelling after FREEZE and HEADER (pgbench -i sends
        // `with (freeze on)`); only that word is rewritten.
        let s = spec("copy t from stdin with (freeze on)");
        assert!(!s.format.header);
        let s = spec("COPY t FROM STDIN (FORMAT csv, HEADER on, NULL 'on')");
        assert!(s.format.header);
        assert_eq!(s.format.null, "on");
        let s = spec("COPY t FROM STDIN (FORMAT csv, NULL 'é',\n  freeze 0, header 1)");
        assert!(s.format.header);
        assert_eq!(s.format.null, "é");
        let s = spec("COPY \"é\" FROM STDIN (FORMAT csv, HEADER OFF)");
        assert!(!s.format.header);
        let s = spec("COPY \"é\" FROM STDIN (FORMAT csv, HEADER ON)");
        assert!(s.format.header);
        assert_eq!(
            spell_boolean_options("COPY t FROM STDIN (HEADER)"),
            "COPY t FROM STDIN (HEADER)"
        );

        let err = |sql: &str| parse(sql).unwrap_err().sqlstate();
        assert_eq!(err("COPY t FROM STDIN (HEADER maybe)"), "42601");
        assert_eq!(err("COPY t FROM '/etc/passwd'"), "0A000");
        assert_eq!(err("COPY t TO PROGRAM 'ls'"), "0A000");
        assert_eq!(err("COPY t FROM STDIN (FORMAT binary)"), "0A000");
        assert_eq!(err("COPY t FROM STDIN (FORMAT xml)"), "22023");
        assert_eq!(err("COPY t FROM STDIN (QUOTE '\"')"), "0A000");
        assert_eq!(
            err("COPY t FROM STDIN (FORMAT csv, DELIMITER '\"')"),
            "22023"
        );
        assert_eq!(err("COPY t FROM"), "42601");
        assert_eq!(err("COPY t TO STDOUT; SELECT 1"), "0A000");
        assert_eq!(err("COPY t FROM STDIN;\n1\t2\n"), "0A000");
    }

    #[test]
    fn text_format_rows() {
        let f = Format::defaults(false);
        let c = cols(&["a", "b", "c"]);
        let data = b"1\tx\\ty\t\\N\n2\t\\\\N\tz\\x41\\101\\n\r\n\\.\nignored\n";
        let rows = parse_rows(data, &f, "t", &c).unwrap();
        assert_eq!(
            rows,
            vec![
                vec![Some("1".into()), Some("x\ty".into()), None],
                vec![Some("2".into()), Some("\\N".into()), Some("zAA\n".into())],
            ]
        );
        // No final newline; an escaped delimiter.
        let rows = parse_rows(b"1\ta\\\tb\tc", &f, "t", &c).unwrap();
        assert_eq!(rows[0][1].as_deref(), Some("a\tb"));
        let e = parse_rows(b"1\t2\n", &f, "t", &c).unwrap_err();
        assert_eq!(e.sqlstate(), "22P04");
        assert!(
            e.to_string().contains("missing data for column \"c\""),
            "{e}"
        );
        assert!(e.to_string().contains("line 1"), "{e}");
        let e = parse_rows(b"1\t2\t3\n1\t2\t3\t4\n", &f, "t", &c).unwrap_err();
        assert!(e.to_string().contains("extra data"), "{e}");
        assert!(e.to_string().contains("line 2"), "{e}");
        assert_eq!(
            parse_rows(b"1\t2\t\xff\n", &f, "t", &c)
                .unwrap_err()
                .sqlstate(),
            "22021"
        );
        assert_eq!(
            parse_rows(b"1\t2\t\\377\n", &f, "t", &c)
                .unwrap_err()
                .sqlstate(),
            "22021"
        );
        // Header line skipped.
        let f = Format {
            header: true,
            ..Format::defaults(false)
        };
        let rows = parse_rows(b"a\tb\tc\n1\t2\t3\n", &f, "t", &c).unwrap();
        assert_eq!(rows.len(), 1);
    }

    #[test]
    fn csv_rows() {
        let f = Format::defaults(true);
        let c = cols(&["a", "b"]);
        let data = "1,\"x, \"\"y\"\"\"\r\n2,\n3,\"\"\n4,\"multi\nline\"\n\\.\n";
        let rows = parse_rows(data.as_bytes(), &f, "t", &c).unwrap();
        assert_eq!(
            rows,
            vec![
                vec![Some("1".into()), Some("x, \"y\"".into())],
                vec![Some("2".into()), None],
                vec![Some("3".into()), Some("".into())],
                vec![Some("4".into()), Some("multi\nline".into())],
            ]
        );
        let e = parse_rows(b"1,\"open\n", &f, "t", &c).unwrap_err();
        assert_eq!(e.sqlstate(), "22P04");
        let f2 = Format {
            header: true,
            delimiter: ';',
            null: "NULL".into(),
            force_not_null: vec!["b".into()],
            ..Format::defaults(true)
        };
        let rows = parse_rows(b"a;b\nNULL;NULL\n", &f2, "t", &c).unwrap();
        assert_eq!(rows, vec![vec![None, Some("NULL".into())]]);
        let f3 = Format {
            force_null: vec!["b".into()],
            ..Format::defaults(true)
        };
        let rows = parse_rows(b"\"\",\"\"\n", &f3, "t", &c).unwrap();
        assert_eq!(rows, vec![vec![Some("".into()), None]]);
        let f4 = Format {
            escape: '\\',
            ..Format::defaults(true)
        };
        let rows = parse_rows(b"\"a\\\"b\",\"c\\\\\"\n", &f4, "t", &c).unwrap();
        assert_eq!(rows, vec![vec![Some("a\"b".into()), Some("c\\".into())]]);
        assert_eq!(
            parse_rows(b"1,2\n", &Format::defaults(true), "t", &cols(&["a"]))
                .unwrap_err()
                .sqlstate(),
            "22P04"
        );
        let bad = Format {
            force_null: vec!["zz".into()],
            ..Format::defaults(true)
        };
        assert_eq!(
            parse_rows(b"1,2\n", &bad, "t", &c).unwrap_err().sqlstate(),
            "42703"
        );
    }

    /// Feeds `data` in pieces cut at `cuts`; returns the rows and the most
    /// bytes the reader held at once.
    fn chunked(
        data: &[u8],
        cuts: &[usize],
        f: &Format,
        c: &[String],
    ) -> Result<(Vec<Row>, usize), Error> {
        let mut r = Reader::new(f.clone(), "t", c.to_vec())?;
        let mut rows = Vec::new();
        let mut held = 0;
        let mut at = 0;
        for &cut in cuts.iter().chain(std::iter::once(&data.len())) {
            rows.extend(r.push(&data[at..cut])?);
            held = held.max(r.buffered());
            at = cut;
        }
        rows.extend(r.finish()?);
        Ok((rows, held))
    }

    #[test]
    fn rows_split_across_pieces_at_any_point() {
        let c = cols(&["a", "b"]);
        let cases: Vec<(Format, &[u8])> = vec![
            (
                Format::defaults(false),
                b"1\tx\\ty\n2\t\\N\r\n3\t\xc3\xa9\\\\\n\\.\nignored\tjunk\n",
            ),
            (
                Format::defaults(true),
                b"1,\"x, \"\"y\"\"\"\r\n2,\n3,\"multi\nline \xc3\xa9\"\n4,\"\"\n\\.\n\"open",
            ),
            (
                Format {
                    escape: '\\',
                    header: true,
                    ..Format::defaults(true)
                },
                b"a,b\n\"q\\\"\n\\\\\",z\n5,\"\\\"\"",
            ),
        ];
        for (f, data) in cases {
            let whole = parse_rows(data, &f, "t", &c).unwrap();
            assert!(whole.len() >= 2, "{whole:?}");
            for cut in 0..=data.len() {
                let (rows, _) = chunked(data, &[cut], &f, &c).unwrap();
                assert_eq!(
                    rows,
                    whole,
                    "cut at {cut} of {:?}",
                    String::from_utf8_lossy(data)
                );
            }
            let every: Vec<usize> = (1..data.len()).collect();
            let (rows, held) = chunked(data, &every, &f, &c).unwrap();
            assert_eq!(rows, whole);
            // Only an unfinished row is held (the longest is < 24 bytes).
            assert!(held < 24, "held {held}");
        }
    }

    #[test]
    fn streaming_holds_only_the_unfinished_row() {
        let c = cols(&["a", "b"]);
        let f = Format::defaults(false);
        let mut r = Reader::new(f, "t", c).unwrap();
        let mut n = 0;
        for i in 0..10_000 {
            n += r
                .push(format!("{i}\tvalue {i}\n").as_bytes())
                .unwrap()
                .len();
            assert_eq!(r.buffered(), 0);
        }
        assert_eq!(n, 10_000);
        assert!(r.push(b"10000\tpart").unwrap().is_empty());
        assert_eq!(r.buffered(), 10);
        assert_eq!(r.push(b"ial\n").unwrap().len(), 1);
        assert_eq!(r.buffered(), 0);
        assert!(r.finish().unwrap().is_empty());
    }

    #[test]
    fn a_row_longer_than_the_limit_fails_with_54000() {
        let c = cols(&["a", "b"]);
        for csv in [false, true] {
            let mut r = Reader::new(Format::defaults(csv), "t", c.clone()).unwrap();
            r.max_row = 100;
            let two: &[u8] = if csv { b"1,2\n3,4\n" } else { b"1\t2\n3\t4\n" };
            assert_eq!(r.push(two).unwrap().len(), 2);
            // A quoted newline does not end a CSV row.
            let long = if csv {
                assert!(r.push(b"5,\"").unwrap().is_empty());
                "a\n"
            } else {
                "aaa"
            };
            let e = loop {
                match r.push(long.as_bytes()) {
                    Ok(rows) => assert!(rows.is_empty()),
                    Err(e) => break e,
                }
            };
            assert_eq!(e.sqlstate(), "54000");
            let msg = e.to_string();
            assert!(
                msg.contains("limit of 100 bytes") && msg.contains("line 3"),
                "{msg}"
            );
        }
    }

    #[test]
    fn errors_name_the_line_across_pieces() {
        let c = cols(&["a", "b"]);
        let f = Format::defaults(false);
        let data = b"1\t2\n3\t4\n5\n6\t7\n";
        for cut in 0..=data.len() {
            let e = chunked(data, &[cut], &f, &c).unwrap_err();
            assert_eq!(e.sqlstate(), "22P04");
            assert!(e.to_string().contains("line 3"), "cut {cut}: {e}");
        }
        let f = Format::defaults(true);
        let data = b"1,\"a\nb\"\n2,\"x\n\n";
        for cut in 0..=data.len() {
            let e = chunked(data, &[cut], &f, &c).unwrap_err();
            assert!(e.to_string().contains("line 3"), "cut {cut}: {e}");
        }
        let data = b"1\t2\n3\t\xff\n";
        let e = chunked(data, &[6], &Format::defaults(false), &c).unwrap_err();
        assert_eq!(e.sqlstate(), "22021");
        assert!(e.to_string().contains("line 2"), "{e}");
    }

    #[test]
    fn writing_round_trips() {
        let c = cols(&["a", "b"]);
        let values = vec![
            vec![Some("x\ty\\z\nw".to_string()), None],
            vec![Some("".to_string()), Some("say \"hi\", ok".to_string())],
            vec![Some("\\.".to_string()), Some("plain".to_string())],
        ];
        for csv in [false, true] {
            let f = Format {
                header: true,
                ..Format::defaults(csv)
            };
            let w = Writer::new(f.clone(), &c, "t").unwrap();
            let mut data = w.header(&c).unwrap();
            for v in &values {
                data.push_str(&w.line(v));
            }
            assert_eq!(parse_rows(data.as_bytes(), &f, "t", &c).unwrap(), values);
        }
        let f = Format::defaults(false);
        let w = Writer::new(f, &c, "t").unwrap();
        assert_eq!(w.line(&values[0]), "x\\ty\\\\z\\nw\t\\N\n");
        let f = Format {
            force_quote: vec!["b".into()],
            ..Format::defaults(true)
        };
        let w = Writer::new(f, &c, "t").unwrap();
        assert_eq!(w.line(&[Some("".into()), Some("p".into())]), "\"\",\"p\"\n");
        assert_eq!(w.line(&[None, None]), ",\n");
    }
}
