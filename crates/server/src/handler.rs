//! The per-connection protocol handlers: startup and authentication, the
//! simple query protocol, the extended protocol (Parse/Bind/Describe/
//! Execute/Sync) and errors.
//!
//! pgwire drives the message loop and keeps the prepared statements and
//! portals; everything that touches the database goes through the
//! connection's one [`spindle_sql::Session`] (behind an async mutex: one
//! statement at a time per connection).
//!
//! Transaction status in ReadyForQuery always comes from the session
//! ([`status`]): `I` outside a transaction block, `T` inside, `E` when it
//! has failed.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use bytes::{BufMut, BytesMut};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use futures::future::{select, Either};
use futures::{Sink, SinkExt, StreamExt};
use pgwire::api::auth::sasl::scram::{gen_salted_password, ScramAuth};
use pgwire::api::auth::sasl::SASLAuthStartupHandler;
use pgwire::api::auth::{
    finish_authentication, protocol_negotiation, save_startup_parameters_to_metadata, AuthSource,
    LoginInfo, Password, ServerParameterProvider, StartupHandler,
};
use pgwire::api::portal::{Format, Portal, PortalExecutionState};
use pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler};
use pgwire::api::results::{
    DescribePortalResponse, DescribeResponse, DescribeStatementResponse, FieldFormat, FieldInfo,
    QueryResponse, Response, Tag,
};
use pgwire::api::stmt::{QueryParser, StoredStatement};
use pgwire::api::store::{Entry, PortalStore};
use pgwire::api::{
    ClientInfo, ClientPortalStore, ConnectionGuard, ConnectionHandle, ConnectionManager,
    ErrorHandler, PgWireConnectionState, PgWireServerHandlers, PidSecretKeyGenerator,
    RandomPidSecretKeyGenerator, Type, DEFAULT_NAME,
};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::data::{
    DataRow, FieldDescription, NoData, ParameterDescription, RowDescription,
};
use pgwire::messages::extendedquery::{
    Bind, BindComplete, Describe, Execute, Parse, ParseComplete, PortalSuspended, Sync as PgSync,
    TARGET_TYPE_BYTE_PORTAL, TARGET_TYPE_BYTE_STATEMENT,
};
use pgwire::messages::response::{
    CommandComplete, EmptyQueryResponse, ReadyForQuery, TransactionStatus,
};
use pgwire::messages::simplequery::Query;
use pgwire::messages::startup::ParameterStatus;
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use spindle_keys::Value;
use spindle_sql::parser::Statement;
use spindle_sql::{Engine, Output, Session};
use tokio::sync::{Mutex, RwLock};
use tracing::{debug, info_span, warn, Instrument};

use crate::types;

/// What every connection of one server shares.
pub(crate) struct Shared {
    pub engine: Arc<Engine>,
    /// When set, clients must authenticate with SCRAM-SHA-256.
    pub password: Option<String>,
    /// The TLS certificate and key, when TLS is configured.
    pub tls: Option<crate::Tls>,
    /// Refuse startups that did not negotiate TLS.
    pub require_tls: bool,
    /// See [`crate::Config::busy_poll_micros`].
    pub busy_poll_micros: u64,
    pub connections: Arc<ConnectionManager>,
    /// Held (shared) by each running statement; shutdown takes it
    /// exclusively, so it waits for statements in flight.
    pub in_flight: RwLock<()>,
    pub pids: RandomPidSecretKeyGenerator,
    /// Each connection's interrupt flag by backend pid, so a cancel request
    /// also stops a statement blocked waiting for a row lock (a thread
    /// parked in the lock table, which no dropped future can stop).
    pub interrupts: std::sync::Mutex<HashMap<i32, Arc<std::sync::atomic::AtomicBool>>>,
}

/// One client connection.
/// Reported parameters as sent to the client, and the settings version
/// they were read at.
pub(crate) type Told = (u64, Vec<(String, String)>);

pub(crate) struct Conn {
    pub shared: Arc<Shared>,
    pub session: Mutex<Session>,
    /// The `COPY … FROM STDIN` receiving data, if any.
    pub copy_in: Mutex<Option<crate::copy::Pending>>,
    /// Names of the prepared statements (Parse), for `DEALLOCATE ALL`.
    pub prepared: Mutex<std::collections::BTreeSet<String>>,
    /// The session's interrupt flag ([`Session::interrupt_flag`]).
    pub interrupt: Arc<std::sync::atomic::AtomicBool>,
    /// The backend pid under which `interrupt` is in `Shared::interrupts`.
    pub pid: std::sync::OnceLock<i32>,
    /// The reported parameters as the client last heard them (ParameterStatus),
    /// with the settings version they were read at.
    pub told: std::sync::Mutex<Option<Told>>,
    /// Set once ReadyForQuery is sent, cleared when the client's next
    /// message is handled: the client owes the next message, so the
    /// connection's thread may spin for it ([`crate::busy_poll`]).
    pub idle: std::sync::atomic::AtomicBool,
    /// The connection's wake-ups, for [`crate::busy_poll`]'s load rule.
    pub activity: crate::busy_poll::Activity,
    /// The connection's cancel handle, once a statement has looked it up.
    cancel_handle: std::sync::OnceLock<Arc<ConnectionHandle>>,
}

impl Conn {
    pub fn new(shared: Arc<Shared>) -> Conn {
        let session = shared.engine.session();
        Conn {
            interrupt: session.interrupt_flag(),
            shared,
            session: Mutex::new(session),
            copy_in: Mutex::new(None),
            prepared: Mutex::new(Default::default()),
            pid: std::sync::OnceLock::new(),
            told: std::sync::Mutex::new(None),
            idle: std::sync::atomic::AtomicBool::new(false),
            activity: Default::default(),
            cancel_handle: std::sync::OnceLock::new(),
        }
    }

    /// A message from the client arrived: its statement may wait for the
    /// shared runtime, and no spinning should take a core from it.
    fn busy(&self) {
        self.idle.store(false, std::sync::atomic::Ordering::Relaxed);
    }

    /// ReadyForQuery was sent.
    fn ready(&self) {
        self.idle.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Before a statement: lowers the interrupt flag and, the first time,
    /// registers it under the connection's pid for [`CancelHandler`].
    fn arm_interrupt(&self, pid: i32) {
        self.interrupt
            .store(false, std::sync::atomic::Ordering::Release);
        if self.pid.set(pid).is_ok() {
            if let Ok(mut map) = self.shared.interrupts.lock() {
                map.insert(pid, self.interrupt.clone());
            }
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        let Some(pid) = self.pid.get() else {
            return;
        };
        if let Ok(mut map) = self.shared.interrupts.lock() {
            if map
                .get(pid)
                .is_some_and(|f| Arc::ptr_eq(f, &self.interrupt))
            {
                map.remove(pid);
            }
        }
    }
}

impl Shared {
    /// Raises every connection's interrupt flag and wakes the statements
    /// waiting for row locks (shutdown after its grace period).
    pub(crate) fn interrupt_all(&self) {
        if let Ok(map) = self.interrupts.lock() {
            for flag in map.values() {
                flag.store(true, std::sync::atomic::Ordering::Release);
            }
        }
        self.engine.manager().wake_lock_waiters();
    }
}

/// Cancel requests: pgwire's (the running statement's future is dropped)
/// plus the connection's interrupt flag, which stops a wait for a row lock.
pub(crate) struct CancelHandler {
    shared: Arc<Shared>,
}

#[async_trait]
impl pgwire::api::cancel::CancelHandler for CancelHandler {
    async fn on_cancel_request(&self, request: pgwire::messages::cancel::CancelRequest) {
        // The manager checks the secret key: only then is the pid trusted.
        if !self
            .shared
            .connections
            .cancel(request.pid, &request.secret_key)
            .await
        {
            return;
        }
        let flag = match self.shared.interrupts.lock() {
            Ok(map) => map.get(&request.pid).cloned(),
            Err(_) => None,
        };
        if let Some(flag) = flag {
            flag.store(true, std::sync::atomic::Ordering::Release);
            self.shared.engine.manager().wake_lock_waiters();
        }
    }
}

/// The handlers of one connection (pgwire asks for them once per socket).
pub(crate) struct Handlers {
    handler: Arc<Handler>,
}

impl Handlers {
    pub fn new(conn: Arc<Conn>) -> Self {
        Handlers {
            handler: Arc::new(Handler { conn }),
        }
    }
}

impl PgWireServerHandlers for Handlers {
    fn simple_query_handler(&self) -> Arc<impl SimpleQueryHandler> {
        self.handler.clone()
    }

    fn extended_query_handler(&self) -> Arc<impl ExtendedQueryHandler> {
        self.handler.clone()
    }

    fn startup_handler(&self) -> Arc<impl StartupHandler> {
        Arc::new(Startup::new(self.handler.conn.clone()))
    }

    fn cancel_handler(&self) -> Arc<impl pgwire::api::cancel::CancelHandler> {
        Arc::new(CancelHandler {
            shared: self.handler.conn.shared.clone(),
        })
    }

    fn error_handler(&self) -> Arc<impl ErrorHandler> {
        Arc::new(LogErrors)
    }

    fn copy_handler(&self) -> Arc<impl pgwire::api::copy::CopyHandler> {
        self.handler.clone()
    }
}

/// Logs protocol-level errors pgwire turns into ErrorResponses. Statement
/// errors are logged in [`statement_error`]; nothing is logged twice.
struct LogErrors;

impl ErrorHandler for LogErrors {
    fn on_error<C: ClientInfo>(&self, _client: &C, error: &mut PgWireError) {
        // PostgreSQL's codes and wording for unknown names.
        let named = |n: &str| {
            if n == DEFAULT_NAME {
                String::new()
            } else {
                n.to_string()
            }
        };
        let replacement = match &*error {
            PgWireError::PortalNotFound(n) => Some(user_error(
                "34000",
                format!("portal \"{}\" does not exist", named(n)),
            )),
            PgWireError::StatementNotFound(n) => Some(user_error(
                "26000",
                format!("prepared statement \"{}\" does not exist", named(n)),
            )),
            _ => None,
        };
        if let Some(r) = replacement {
            *error = r;
        }
        debug!(%error, "protocol error");
    }
}

/// The ReadyForQuery status of a session.
pub(crate) fn status(s: &Session) -> TransactionStatus {
    if !s.in_transaction() {
        TransactionStatus::Idle
    } else if s.transaction_failed() {
        TransactionStatus::Error
    } else {
        TransactionStatus::Transaction
    }
}

fn user_error(code: &str, message: impl Into<String>) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "ERROR".into(),
        code.into(),
        message.into(),
    )))
}

/// A statement's error as sent to the client, logged once here.
fn statement_error(e: &spindle_sql::Error) -> ErrorInfo {
    let code = e.sqlstate();
    if code.starts_with("XX") {
        warn!(error = %e, sqlstate = code, "internal error");
    } else {
        debug!(error = %e, sqlstate = code, "statement failed");
    }
    ErrorInfo::new("ERROR".into(), code.into(), e.to_string())
}

pub(crate) fn to_pg(e: &spindle_sql::Error) -> PgWireError {
    PgWireError::UserError(Box::new(statement_error(e)))
}

/// Receives a CancelRequest for this connection's running statement (and
/// arms the connection's interrupt flag for it).
async fn cancel_receiver<C: ClientInfo>(
    conn: &Conn,
    client: &C,
) -> Option<futures::channel::oneshot::Receiver<()>> {
    conn.arm_interrupt(client.pid_and_secret_key().0);
    // Registered by authentication, before any statement; kept in the
    // connection after the first statement (the session extensions are a
    // locked map by type).
    let handle = match conn.cancel_handle.get() {
        Some(h) => h,
        None => {
            let h = client.session_extensions().get::<Arc<ConnectionHandle>>()?;
            conn.cancel_handle.get_or_init(|| Arc::clone(&h))
        }
    };
    Some(handle.start_query().await)
}

fn canceled() -> ErrorInfo {
    ErrorInfo::new(
        "ERROR".into(),
        "57014".into(),
        "canceling statement due to user request".into(),
    )
}

// ---------------------------------------------------------------------------
// Startup and authentication

/// Startup parameters that are not session parameters.
const STARTUP_ONLY: &[&str] = &["user", "database", "replication", "options"];

struct Startup {
    conn: Arc<Conn>,
    scram: Option<SASLAuthStartupHandler<Params>>,
}

impl Startup {
    fn new(conn: Arc<Conn>) -> Self {
        let scram = conn.shared.password.as_ref().map(|pw| {
            let source = Arc::new(PasswordSource {
                password: pw.clone(),
            });
            let mut scram = ScramAuth::new(source);
            if let Some(tls) = &conn.shared.tls {
                // Channel binding (SCRAM-SHA-256-PLUS) over TLS; without it
                // (a certificate whose signature hash has no binding),
                // plain SCRAM-SHA-256 is still offered.
                if let Err(e) = scram.configure_certificate(&tls.cert_pem) {
                    debug!(error = %e, "SCRAM channel binding not available");
                }
            }
            SASLAuthStartupHandler::new(Arc::new(Params { conn: conn.clone() }))
                .with_scram(scram)
                .with_connection_manager(conn.shared.connections.clone())
        });
        Startup { conn, scram }
    }

    /// Applies the startup packet's parameters (and `options=-c k=v`) to
    /// the session. Unknown parameters are ignored, as clients send some
    /// that only matter to PostgreSQL; invalid values end the connection.
    async fn apply_parameters(
        &self,
        params: &std::collections::BTreeMap<String, String>,
    ) -> PgWireResult<()> {
        let mut session = self.conn.session.lock().await;
        let mut pairs: Vec<(String, String)> = params
            .iter()
            .filter(|(k, _)| !STARTUP_ONLY.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if let Some(options) = params.get("options") {
            let words: Vec<&str> = options.split_whitespace().collect();
            let mut i = 0;
            while i < words.len() {
                let kv = match words[i] {
                    "-c" => {
                        i += 1;
                        words.get(i).copied()
                    }
                    w => w.strip_prefix("-c").or_else(|| w.strip_prefix("--")),
                };
                if let Some((k, v)) = kv.and_then(|kv| kv.split_once('=')) {
                    pairs.push((k.replace('-', "_"), v.to_string()));
                }
                i += 1;
            }
        }
        if let Some(user) = params.get("user") {
            let _ = session
                .settings_mut()
                .set("session_authorization", Some(user));
        }
        for (k, v) in pairs {
            if let Err(e) = session.settings_mut().set(&k, Some(&v)) {
                if e.sqlstate() == "42704" || e.sqlstate() == "55P02" {
                    debug!(parameter = %k, "ignoring startup parameter");
                    continue;
                }
                return Err(PgWireError::UserError(Box::new(ErrorInfo::new(
                    "FATAL".into(),
                    e.sqlstate().into(),
                    e.to_string(),
                ))));
            }
        }
        Ok(())
    }
}

#[async_trait]
impl StartupHandler for Startup {
    async fn on_startup<C>(
        &self,
        client: &mut C,
        message: PgWireFrontendMessage,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        if let PgWireFrontendMessage::Startup(startup) = &message {
            if self.conn.shared.require_tls && !client.is_secure() {
                // As PostgreSQL's `hostssl`-only pg_hba.conf: 28000.
                return Err(PgWireError::UserError(Box::new(ErrorInfo::new(
                    "FATAL".into(),
                    "28000".into(),
                    "this server requires TLS: connection without SSL refused \
                     (connect with sslmode=require)"
                        .into(),
                ))));
            }
            self.apply_parameters(&startup.parameters).await?;
            debug!(
                user = startup.parameters.get("user").map(String::as_str),
                database = startup.parameters.get("database").map(String::as_str),
                "startup"
            );
        }
        if let Some(scram) = &self.scram {
            return scram.on_startup(client, message).await;
        }
        // Trust: no password configured (the server listens on loopback
        // unless told otherwise).
        if let PgWireFrontendMessage::Startup(startup) = &message {
            protocol_negotiation(client, startup).await?;
            save_startup_parameters_to_metadata(client, startup);
            // After negotiation: the key's size depends on the protocol.
            let (pid, key) = self.conn.shared.pids.generate(client);
            client.set_pid_and_secret_key(pid, key.clone());
            let (handle, guard) = self.conn.shared.connections.register(pid, key);
            client
                .session_extensions()
                .insert::<Arc<ConnectionHandle>>(handle);
            client.session_extensions().insert::<ConnectionGuard>(guard);
            finish_authentication(
                client,
                &Params {
                    conn: self.conn.clone(),
                },
            )
            .await?;
        }
        Ok(())
    }
}

/// The ParameterStatus values sent after authentication.
struct Params {
    conn: Arc<Conn>,
}

impl ServerParameterProvider for Params {
    fn server_parameters<C: ClientInfo>(&self, _client: &C) -> Option<HashMap<String, String>> {
        let reported = match self.conn.session.try_lock() {
            Ok(s) => {
                let reported = s.settings().reported();
                if let Ok(mut told) = self.conn.told.lock() {
                    *told = Some((s.settings().version(), reported.clone()));
                }
                reported
            }
            Err(_) => spindle_sql::settings::Settings::default().reported(),
        };
        Some(reported.into_iter().collect())
    }
}

/// The one configured password, checked by SCRAM-SHA-256 for any user.
#[derive(Debug)]
struct PasswordSource {
    password: String,
}

#[async_trait]
impl AuthSource for PasswordSource {
    async fn get_password(&self, _login: &LoginInfo) -> PgWireResult<Password> {
        let salt: Vec<u8> = (0..16).map(|_| rand_byte()).collect();
        let salted = gen_salted_password(
            &self.password,
            &salt,
            pgwire::api::auth::sasl::scram::SCRAM_ITERATIONS,
        );
        Ok(Password::new(Some(salt), salted))
    }
}

fn rand_byte() -> u8 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0),
    );
    h.finish() as u8
}

// ---------------------------------------------------------------------------
// Queries

/// The per-connection query handler.
pub(crate) struct Handler {
    pub(crate) conn: Arc<Conn>,
}

/// A prepared statement: its SQL and what Parse/Describe found out.
#[derive(Debug, Clone)]
pub(crate) struct Prepared {
    sql: String,
    /// The text's statements, parsed once at Parse (`None` for COPY): an
    /// Execute with parameters runs them without looking the text up in
    /// the engine's parse cache again (a hash of the text and a lock that
    /// every connection shares, per Execute).
    parsed: Option<Arc<spindle_sql::plan_cache::Parsed>>,
    params: Vec<Type>,
    columns: Option<SchemaRef>,
    /// `columns` as RowDescription fields, all in text: made once at
    /// Parse, for every Describe and Execute in text (`pgbench -M
    /// prepared` describes and runs each statement so, and making them
    /// per message was a twentieth of a point select's instructions).
    text_fields: Option<Arc<Vec<FieldInfo>>>,
    tag: &'static str,
}

impl Prepared {
    fn new(
        sql: String,
        parsed: Option<Arc<spindle_sql::plan_cache::Parsed>>,
        params: Vec<Type>,
        columns: Option<SchemaRef>,
        tag: &'static str,
    ) -> Prepared {
        let text_fields = columns
            .as_ref()
            .map(|c| Arc::new(fields(c, &Format::UnifiedText)));
        Prepared {
            sql,
            parsed,
            params,
            columns,
            text_fields,
            tag,
        }
    }

    /// The result columns as fields in `format` (`None`: no columns
    /// known at Parse).
    fn fields(&self, format: &Format) -> Option<Arc<Vec<FieldInfo>>> {
        match (format, &self.text_fields) {
            (Format::UnifiedText, Some(f)) => Some(f.clone()),
            _ => self.columns.as_ref().map(|c| Arc::new(fields(c, format))),
        }
    }
}

/// Result columns as RowDescription fields, in `format`.
fn fields(schema: &SchemaRef, format: &Format) -> Vec<FieldInfo> {
    schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let t = types::pg_type(f);
            let size = types::type_size(&t);
            FieldInfo::new(f.name().clone(), None, None, t, format.format_for(i))
                .with_type_size(size)
        })
        .collect()
}

/// Queues a Describe's replies (ParameterDescription for a statement,
/// then RowDescription or NoData); they go out at the next Sync or Flush.
async fn feed_describe<C, DR>(client: &mut C, r: &DR) -> PgWireResult<()>
where
    C: Sink<PgWireBackendMessage> + Unpin,
    C::Error: Debug,
    PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    DR: DescribeResponse,
{
    if let Some(types) = r.parameters() {
        client
            .feed(PgWireBackendMessage::ParameterDescription(
                ParameterDescription::new(types.iter().map(|t| t.oid()).collect()),
            ))
            .await?;
    }
    if r.is_no_data() {
        client
            .feed(PgWireBackendMessage::NoData(NoData::new()))
            .await?;
    } else {
        client
            .feed(PgWireBackendMessage::RowDescription(row_description(
                r.fields(),
            )))
            .await?;
    }
    Ok(())
}

fn row_description(fields: &[FieldInfo]) -> RowDescription {
    RowDescription::new(fields.iter().map(FieldDescription::from).collect())
}

/// Encodes record batches as DataRows in the fields' types and formats.
#[allow(clippy::result_large_err)] // built once per failed statement
fn data_rows(batches: &[RecordBatch], fields: &[FieldInfo]) -> Result<Vec<DataRow>, ErrorInfo> {
    let mut out = Vec::with_capacity(batches.iter().map(|b| b.num_rows()).sum());
    // Rows of one result are alike: each starts with the largest buffer a
    // row needed so far, and is rarely grown.
    let mut capacity = 16 * fields.len();
    for batch in batches {
        if batch.num_columns() != fields.len() {
            return Err(ErrorInfo::new(
                "ERROR".into(),
                "XX000".into(),
                "result does not match its description".into(),
            ));
        }
        let text: Vec<Option<types::TextColumn>> = batch
            .columns()
            .iter()
            .zip(fields)
            .map(|(col, field)| {
                (field.format() == FieldFormat::Text)
                    .then(|| types::TextColumn::of(col.as_ref(), field.datatype()))
            })
            .collect();
        for row in 0..batch.num_rows() {
            let mut buf = BytesMut::with_capacity(capacity);
            for ((col, field), text) in batch.columns().iter().zip(fields).zip(&text) {
                let at = buf.len();
                buf.put_i32(0);
                if let Some(text) = text {
                    if !text.write(row, &mut buf).map_err(|e| statement_error(&e))? {
                        buf.truncate(at);
                        buf.put_i32(-1);
                        continue;
                    }
                } else {
                    let v = spindle_sql::types::array_value(col.as_ref(), row)
                        .map_err(|e| statement_error(&e))?;
                    if v == Value::Null {
                        buf.truncate(at);
                        buf.put_i32(-1);
                        continue;
                    }
                    types::write_binary(&v, field.datatype(), &mut buf).map_err(|e| {
                        ErrorInfo::new("ERROR".into(), e.sqlstate.into(), e.message)
                    })?;
                }
                let len = (buf.len() - at - 4) as i32;
                buf[at..at + 4].copy_from_slice(&len.to_be_bytes());
            }
            capacity = capacity.max(buf.len());
            out.push(DataRow::new(buf, fields.len() as i16));
        }
    }
    Ok(out)
}

/// Whether the statements of one simple Query run as one implicit
/// transaction, as in PostgreSQL: several statements, at least one of them
/// a write, outside a transaction block, and none of them BEGIN, COMMIT or
/// ROLLBACK (a string with its own transaction control runs statement by
/// statement). Then an error anywhere rolls back every statement of the
/// string.
fn implicit_transaction(session: &Session, stmts: &[Statement]) -> bool {
    stmts.len() > 1
        && !session.in_transaction()
        && !stmts.iter().any(|s| {
            matches!(
                s,
                Statement::Begin { .. } | Statement::Commit | Statement::Rollback
            )
        })
        && stmts.iter().any(|s| {
            !matches!(
                s,
                Statement::Query(_)
                    | Statement::PreparedQuery(_)
                    | Statement::Setting(_)
                    | Statement::ExplainDml(_)
            )
        })
}

/// `DEALLOCATE [PREPARE] {name | ALL}` (a simple Query; clients such as
/// psycopg send it to drop their prepared statements): `Some(None)` for
/// ALL, `Some(Some(name))` for one statement, `None` for anything else.
fn parse_deallocate(sql: &str) -> Option<Option<String>> {
    use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
    use datafusion::sql::sqlparser::keywords::Keyword;
    use datafusion::sql::sqlparser::parser::Parser;
    use datafusion::sql::sqlparser::tokenizer::Token;
    // Most queries plainly start with another word: no tokenizing.
    if spindle_sql::parser::leading_word(sql).is_some_and(|w| !w.eq_ignore_ascii_case("deallocate"))
    {
        return None;
    }
    let dialect = PostgreSqlDialect {};
    let mut p = Parser::new(&dialect).try_with_sql(sql).ok()?;
    if !p.parse_keyword(Keyword::DEALLOCATE) {
        return None;
    }
    let _ = p.parse_keyword(Keyword::PREPARE);
    let target = if p.parse_keyword(Keyword::ALL) {
        None
    } else {
        Some(spindle_sql::parser::fold_ident(&p.parse_identifier().ok()?))
    };
    while p.consume_token(&Token::SemiColon) {}
    (p.peek_token().token == Token::EOF).then_some(target)
}

/// Sends one statement's result of a simple Query: its rows or command
/// tag, or the error. Returns whether it succeeded.
async fn feed_output<C>(
    client: &mut C,
    session: &mut Session,
    tag: &str,
    result: Result<Output, spindle_sql::error::Error>,
    span: &tracing::Span,
) -> PgWireResult<bool>
where
    C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
    C::Error: Debug,
    PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
{
    match result {
        Ok(Output::Rows { schema, batches }) => {
            let fields = fields(&schema, &Format::UnifiedText);
            client
                .feed(PgWireBackendMessage::RowDescription(row_description(
                    &fields,
                )))
                .await?;
            match data_rows(&batches, &fields) {
                Ok(rows) => {
                    let n = rows.len();
                    span.record("rows", n);
                    for r in rows {
                        client.feed(PgWireBackendMessage::DataRow(r)).await?;
                    }
                    client
                        .feed(PgWireBackendMessage::CommandComplete(CommandComplete::new(
                            rows_tag(tag, n),
                        )))
                        .await?;
                    Ok(true)
                }
                Err(e) => {
                    session.fail();
                    client
                        .feed(PgWireBackendMessage::ErrorResponse(e.into()))
                        .await?;
                    Ok(false)
                }
            }
        }
        Ok(Output::Command { tag, rows }) => {
            span.record("rows", rows);
            client
                .feed(PgWireBackendMessage::CommandComplete(CommandComplete::new(
                    tag.to_string(),
                )))
                .await?;
            Ok(true)
        }
        Err(e) => {
            client
                .feed(PgWireBackendMessage::ErrorResponse(
                    statement_error(&e).into(),
                ))
                .await?;
            Ok(false)
        }
    }
}

/// The CommandComplete tag of a statement that returned rows.
fn rows_tag(tag: &str, rows: usize) -> String {
    match tag {
        "SHOW" => "SHOW".into(),
        _ => format!("SELECT {rows}"),
    }
}

impl Handler {
    /// Runs the statements of one simple Query, sending each result; stops
    /// at the first error. Returns whether a `COPY … FROM STDIN` started
    /// (then the connection waits for its data, not for a query).
    async fn run_simple<C>(&self, client: &mut C, sql: &str) -> PgWireResult<bool>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let mut session = self.conn.session.lock().await;
        if crate::copy::is_copy(sql) {
            // Boxed: COPY's future is large, and every statement's future
            // (boxed by the protocol loop) would otherwise copy its size.
            return match Box::pin(self.start_copy(client, &mut session, sql, false)).await? {
                Ok(copy_in) => Ok(copy_in),
                Err(e) => {
                    session.fail();
                    client
                        .feed(PgWireBackendMessage::ErrorResponse(
                            statement_error(&e).into(),
                        ))
                        .await?;
                    Ok(false)
                }
            };
        }
        // A point statement with inline values: the cached plan of its
        // parameterized form, without parsing or planning the text.
        let span = info_span!(
            "inline_fast",
            kind = tracing::field::Empty,
            rows = tracing::field::Empty,
            ms = tracing::field::Empty
        );
        let start = Instant::now();
        let fast = {
            let _running = self.conn.shared.in_flight.read().await;
            session
                .execute_inline_fast(sql)
                .instrument(span.clone())
                .await
                .transpose()
        };
        if let Some(result) = fast {
            span.record("ms", start.elapsed().as_secs_f64() * 1000.0);
            let (tag, result) = match result {
                Ok((tag, out)) => (tag, Ok(out)),
                Err(e) => ("", Err(e)),
            };
            span.record("kind", tag);
            feed_output(client, &mut session, tag, result, &span).await?;
            return Ok(false);
        }
        let stmts = match session
            .engine()
            .parse_cached(sql)
            .and_then(|s| spindle_sql::bind::bind_params(s.stmts.clone(), &[]))
        {
            // A query with inline values may run by the kept template of
            // its parameterized form.
            Ok(s) => session.with_templates(sql, s),
            Err(e) => {
                session.fail();
                client
                    .feed(PgWireBackendMessage::ErrorResponse(
                        statement_error(&e).into(),
                    ))
                    .await?;
                return Ok(false);
            }
        };
        if stmts.is_empty() {
            client
                .feed(PgWireBackendMessage::EmptyQueryResponse(
                    EmptyQueryResponse::new(),
                ))
                .await?;
        }
        let implicit = implicit_transaction(&session, &stmts);
        if implicit {
            if let Err(e) = session
                .execute_statement(Statement::Begin { read_only: false })
                .await
            {
                client
                    .feed(PgWireBackendMessage::ErrorResponse(
                        statement_error(&e).into(),
                    ))
                    .await?;
                return Ok(false);
            }
        }
        let mut failed = false;
        for stmt in stmts {
            let tag = stmt.tag();
            let span = info_span!(
                "statement",
                kind = tag,
                rows = tracing::field::Empty,
                ms = tracing::field::Empty
            );
            let start = Instant::now();
            let result = {
                let _running = self.conn.shared.in_flight.read().await;
                session
                    .execute_statement(stmt)
                    .instrument(span.clone())
                    .await
            };
            span.record("ms", start.elapsed().as_secs_f64() * 1000.0);
            if !feed_output(client, &mut session, tag, result, &span).await? {
                failed = true;
                break;
            }
        }
        if implicit {
            let end = if failed {
                Statement::Rollback
            } else {
                Statement::Commit
            };
            let _running = self.conn.shared.in_flight.read().await;
            if let Err(e) = session.execute_statement(end).await {
                client
                    .feed(PgWireBackendMessage::ErrorResponse(
                        statement_error(&e).into(),
                    ))
                    .await?;
            }
        }
        // Report the parameters that changed since the client last heard
        // (compared only when the settings' version moved).
        let version = session.settings().version();
        let changes: Vec<(String, String)> = match self.conn.told.lock() {
            Ok(mut told) => match told.as_ref() {
                Some((v, _)) if *v == version => Vec::new(),
                _ => {
                    let now = session.settings().reported();
                    let changes = now
                        .iter()
                        .filter(|p| !told.as_ref().is_some_and(|(_, t)| t.contains(p)))
                        .cloned()
                        .collect();
                    *told = Some((version, now));
                    changes
                }
            },
            Err(_) => Vec::new(), // a panic elsewhere poisoned it: report nothing
        };
        for (k, v) in changes {
            client
                .feed(PgWireBackendMessage::ParameterStatus(ParameterStatus::new(
                    k, v,
                )))
                .await?;
        }
        Ok(false)
    }

    /// Runs `DEALLOCATE` (see [`parse_deallocate`]).
    async fn deallocate<C>(&self, client: &mut C, target: Option<String>) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let mut prepared = self.conn.prepared.lock().await;
        let tag = match target {
            None => {
                for name in std::mem::take(&mut *prepared) {
                    client.portal_store().rm_statement(&name);
                }
                "DEALLOCATE ALL"
            }
            Some(name) if prepared.remove(&name) => {
                client.portal_store().rm_statement(&name);
                "DEALLOCATE"
            }
            Some(name) => {
                drop(prepared);
                self.conn.session.lock().await.fail();
                let e = ErrorInfo::new(
                    "ERROR".into(),
                    "26000".into(),
                    format!("prepared statement \"{name}\" does not exist"),
                );
                client
                    .feed(PgWireBackendMessage::ErrorResponse(e.into()))
                    .await?;
                return Ok(());
            }
        };
        client
            .feed(PgWireBackendMessage::CommandComplete(CommandComplete::new(
                tag.into(),
            )))
            .await?;
        Ok(())
    }

    /// Decodes a portal's parameters with the statement's types.
    fn params(portal: &Portal<Prepared>) -> PgWireResult<Vec<Value>> {
        let types = &portal.statement.statement.params;
        portal
            .parameters
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let Some(bytes) = p else {
                    return Ok(Value::Null);
                };
                let t = types.get(i).cloned().unwrap_or(Type::TEXT);
                let r = if portal.parameter_format.is_binary(i) {
                    types::param_from_binary(&t, bytes)
                } else {
                    match std::str::from_utf8(bytes) {
                        Ok(s) => types::param_from_text(&t, s),
                        Err(_) => Err(types::ValueError {
                            sqlstate: "22021",
                            message: "invalid byte sequence for encoding \"UTF8\"".into(),
                        }),
                    }
                };
                r.map_err(|e| {
                    user_error(e.sqlstate, format!("parameter ${}: {}", i + 1, e.message))
                })
            })
            .collect()
    }
}

#[async_trait]
impl SimpleQueryHandler for Handler {
    async fn on_query<C>(&self, client: &mut C, query: Query) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        self.conn.busy();
        if !matches!(client.state(), PgWireConnectionState::ReadyForQuery) {
            return Err(PgWireError::NotReadyForQuery);
        }
        client.set_state(PgWireConnectionState::QueryInProgress);
        let span = info_span!("query", sql = %truncate(&query.query));
        let cancel = cancel_receiver(&self.conn, client).await;
        let sql = query.query;
        let outcome = if let Some(target) = parse_deallocate(&sql) {
            Some(self.deallocate(client, target).await.map(|()| false))
        } else {
            let run = Box::pin(self.run_simple(client, &sql).instrument(span));
            match cancel {
                Some(rx) => match select(run, rx).await {
                    Either::Left((r, _)) => Some(r),
                    Either::Right(_) => None,
                },
                None => Some(run.await),
            }
        };
        match outcome {
            Some(r) => {
                if r? {
                    // COPY FROM STDIN: ReadyForQuery follows its data.
                    return Ok(());
                }
            }
            None => {
                // The statement's future was dropped: nothing it did is
                // committed unless its commit had already returned.
                self.conn.session.lock().await.fail();
                client
                    .feed(PgWireBackendMessage::ErrorResponse(canceled().into()))
                    .await?;
            }
        }
        let st = status(&*self.conn.session.lock().await);
        client.set_state(PgWireConnectionState::ReadyForQuery);
        client.set_transaction_status(st);
        client
            .send(PgWireBackendMessage::ReadyForQuery(ReadyForQuery::new(st)))
            .await?;
        self.conn.ready();
        Ok(())
    }

    async fn do_query<C>(&self, _client: &mut C, _query: &str) -> PgWireResult<Vec<Response>>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        // on_query does the work.
        Ok(vec![])
    }
}

fn truncate(sql: &str) -> &str {
    match sql.char_indices().nth(200) {
        Some((i, _)) => &sql[..i],
        None => sql,
    }
}

#[async_trait]
impl QueryParser for Handler {
    type Statement = Prepared;

    async fn parse_sql<C>(
        &self,
        _client: &C,
        sql: &str,
        declared: &[Option<Type>],
    ) -> PgWireResult<Option<Prepared>>
    where
        C: ClientInfo + Unpin + Send + Sync,
    {
        let mut session = self.conn.session.lock().await;
        if crate::copy::is_copy(sql) {
            if let Err(e) = crate::copy::check(&session, sql).await {
                session.fail();
                return Err(to_pg(&e));
            }
            return Ok(Some(Prepared::new(
                sql.to_string(),
                None,
                vec![],
                None,
                "COPY",
            )));
        }
        let desc = match session.describe(sql).await {
            Ok(d) => d,
            Err(e) => {
                session.fail();
                return Err(to_pg(&e));
            }
        };
        let n = desc.params.len().max(declared.len());
        let params = (0..n)
            .map(|i| match declared.get(i).cloned().flatten() {
                Some(t) if t != Type::UNKNOWN => t,
                _ => types::param_type(desc.params.get(i).and_then(|t| t.as_ref())),
            })
            .collect();
        // `describe` parsed the text, so this is the parse cache's entry.
        let parsed = session.engine().parse_cached(sql).ok();
        let tag = parsed
            .as_ref()
            .and_then(|p| p.stmts.first().map(|s| s.tag()))
            .unwrap_or("SELECT");
        Ok(Some(Prepared::new(
            sql.to_string(),
            parsed,
            params,
            desc.columns.clone(),
            tag,
        )))
    }

    fn get_parameter_types(&self, stmt: &Prepared) -> PgWireResult<Vec<Type>> {
        Ok(stmt.params.clone())
    }

    fn get_result_schema(
        &self,
        stmt: &Prepared,
        format: Option<&Format>,
    ) -> PgWireResult<Vec<FieldInfo>> {
        Ok(stmt
            .columns
            .as_ref()
            .map(|c| fields(c, format.unwrap_or(&Format::UnifiedText)))
            .unwrap_or_default())
    }
}

/// Checks a Bind's counts: parameters against the statement, format codes
/// against parameters and columns (PostgreSQL: 0, 1 or one per item).
fn check_bind(bind: &Bind, stmt: &StoredStatement<Prepared>, name: &str) -> PgWireResult<()> {
    let want = stmt.statement.params.len();
    if bind.parameters.len() != want {
        return Err(user_error(
            "08P01",
            format!(
                "bind message supplies {} parameters, but prepared statement \"{}\" requires {want}",
                bind.parameters.len(),
                if name == DEFAULT_NAME { "" } else { name }
            ),
        ));
    }
    let pf = bind.parameter_format_codes.len();
    if pf > 1 && pf != want {
        return Err(user_error(
            "08P01",
            format!("bind message has {pf} parameter formats but {want} parameters"),
        ));
    }
    let cols = stmt
        .statement
        .columns
        .as_ref()
        .map(|c| c.fields().len())
        .unwrap_or(0);
    let rf = bind.result_column_format_codes.len();
    if rf > 1 && rf != cols {
        return Err(user_error(
            "08P01",
            format!("bind message has {rf} result formats but query has {cols} columns"),
        ));
    }
    if bind
        .parameter_format_codes
        .iter()
        .chain(&bind.result_column_format_codes)
        .any(|f| *f != 0 && *f != 1)
    {
        return Err(user_error("08P01", "unsupported format code"));
    }
    Ok(())
}

#[async_trait]
impl ExtendedQueryHandler for Handler {
    type Statement = Prepared;
    type QueryParser = Handler;

    fn query_parser(&self) -> Arc<Handler> {
        Arc::new(Handler {
            conn: self.conn.clone(),
        })
    }

    async fn on_parse<C>(&self, client: &mut C, message: Parse) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        self.conn.busy();
        // pgwire's Parse, remembering the name for DEALLOCATE ALL.
        let name = message
            .name
            .clone()
            .unwrap_or_else(|| DEFAULT_NAME.to_owned());
        match StoredStatement::parse(client, &message, self.query_parser()).await? {
            Some(stmt) => client.portal_store().put_statement(Arc::new(stmt)),
            None => client.portal_store().put_empty_statement(&name),
        }
        if name != DEFAULT_NAME {
            self.conn.prepared.lock().await.insert(name);
        }
        client
            .feed(PgWireBackendMessage::ParseComplete(ParseComplete::new()))
            .await?;
        Ok(())
    }

    async fn on_bind<C>(&self, client: &mut C, mut message: Bind) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        self.conn.busy();
        let name = message
            .statement_name
            .clone()
            .unwrap_or_else(|| DEFAULT_NAME.to_string());
        if let Some(Entry::Value(stmt)) = client.portal_store().get_statement(&name) {
            if let Err(e) = check_bind(&message, &stmt, &name) {
                self.conn.session.lock().await.fail();
                return Err(e);
            }
            // The parameters move into the portal (`try_new` copies them).
            let parameters = std::mem::take(&mut message.parameters);
            let mut portal = Portal::try_new(&message, stmt)?;
            portal.parameters = parameters;
            client.portal_store().put_portal(Arc::new(portal));
            client
                .feed(PgWireBackendMessage::BindComplete(BindComplete::new()))
                .await?;
            return Ok(());
        }
        let r = self._on_bind_default(client, message).await;
        if r.is_err() {
            self.conn.session.lock().await.fail();
        }
        r
    }

    /// pgwire's Describe, with the replies buffered like every other reply
    /// of the extended protocol until Sync or Flush (pgwire flushes each
    /// one: a `sendto` and a wake-up of the client per message).
    async fn on_describe<C>(&self, client: &mut C, message: Describe) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        self.conn.busy();
        let name = message.name.as_deref().unwrap_or(DEFAULT_NAME);
        match message.target_type {
            TARGET_TYPE_BYTE_STATEMENT => match client.portal_store().get_statement(name) {
                Some(Entry::Value(stmt)) => {
                    let r = self.do_describe_statement(client, &stmt).await?;
                    feed_describe(client, &r).await
                }
                Some(Entry::Empty) => {
                    feed_describe(client, &DescribeStatementResponse::no_data()).await
                }
                None => Err(PgWireError::StatementNotFound(name.to_owned())),
            },
            TARGET_TYPE_BYTE_PORTAL => match client.portal_store().get_portal(name) {
                Some(Entry::Value(portal)) => {
                    // In text, straight from the statement's fields.
                    if let (Format::UnifiedText, Some(f)) = (
                        &portal.result_column_format,
                        &portal.statement.statement.text_fields,
                    ) {
                        return client
                            .feed(PgWireBackendMessage::RowDescription(row_description(f)))
                            .await
                            .map_err(PgWireError::from);
                    }
                    let r = self.do_describe_portal(client, &portal).await?;
                    feed_describe(client, &r).await
                }
                Some(Entry::Empty) => {
                    feed_describe(client, &DescribePortalResponse::no_data()).await
                }
                None => Err(PgWireError::PortalNotFound(name.to_owned())),
            },
            other => Err(PgWireError::InvalidTargetType(other)),
        }
    }

    async fn on_execute<C>(&self, client: &mut C, message: Execute) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        self.conn.busy();
        let portal_name = message.name.as_deref().unwrap_or(DEFAULT_NAME);
        if let Some(Entry::Value(portal)) = client.portal_store().get_portal(portal_name) {
            if portal.statement.statement.tag == "COPY" {
                let sql = portal.statement.statement.sql.clone();
                let mut session = self.conn.session.lock().await;
                // Boxed, as in `run_simple`.
                let r = Box::pin(self.start_copy(client, &mut session, &sql, true)).await?;
                return match r {
                    Ok(copy_in) => {
                        if !copy_in {
                            client.set_state(PgWireConnectionState::ReadyForQuery);
                        }
                        client.set_transaction_status(status(&session));
                        Ok(())
                    }
                    Err(e) => {
                        session.fail();
                        client.set_transaction_status(status(&session));
                        Err(to_pg(&e))
                    }
                };
            }
        }
        let r = self.execute_portal(client, message).await;
        let mut session = self.conn.session.lock().await;
        if r.is_err() {
            session.fail();
        }
        client.set_transaction_status(status(&session));
        r
    }

    async fn on_sync<C>(&self, client: &mut C, _message: PgSync) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        client.portal_store().rm_portal(DEFAULT_NAME);
        let st = status(&*self.conn.session.lock().await);
        client.set_transaction_status(st);
        client
            .send(PgWireBackendMessage::ReadyForQuery(ReadyForQuery::new(st)))
            .await?;
        client.flush().await?;
        self.conn.ready();
        Ok(())
    }

    async fn do_describe_statement<C>(
        &self,
        _client: &mut C,
        target: &StoredStatement<Prepared>,
    ) -> PgWireResult<DescribeStatementResponse>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let p = &target.statement;
        let cols = p
            .columns
            .as_ref()
            .map(|c| fields(c, &Format::UnifiedText))
            .unwrap_or_default();
        Ok(DescribeStatementResponse::new(p.params.clone(), cols))
    }

    async fn do_describe_portal<C>(
        &self,
        _client: &mut C,
        portal: &Portal<Prepared>,
    ) -> PgWireResult<DescribePortalResponse>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let cols = portal
            .statement
            .statement
            .columns
            .as_ref()
            .map(|c| fields(c, &portal.result_column_format))
            .unwrap_or_default();
        Ok(DescribePortalResponse::new(cols))
    }

    async fn do_query<C>(
        &self,
        _client: &mut C,
        portal: &Portal<Prepared>,
        _max_rows: usize,
    ) -> PgWireResult<Response>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        Ok(match self.run_statement(portal).await? {
            Ran::Empty => Response::EmptyQuery,
            Ran::Command(tag) => Response::Execution(tag),
            Ran::Rows { fields, rows, tag } => {
                let mut resp =
                    QueryResponse::new(fields, futures::stream::iter(rows.into_iter().map(Ok)));
                resp.set_command_tag(tag);
                Response::Query(resp)
            }
        })
    }
}

/// What a portal's statement produced ([`Handler::run_statement`]).
enum Ran {
    Empty,
    Command(Tag),
    /// Rows, encoded, with their fields and the CommandComplete word.
    Rows {
        fields: Arc<Vec<FieldInfo>>,
        rows: Vec<DataRow>,
        tag: &'static str,
    },
}

/// CommandComplete for `rows` rows of a `command` ("SELECT 1"), without
/// `format!`: this goes out once per statement.
fn rows_complete(command: &str, rows: usize) -> CommandComplete {
    let mut n = itoa::Buffer::new();
    let n = n.format(rows);
    let mut tag = String::with_capacity(command.len() + 1 + n.len());
    tag.push_str(command);
    tag.push(' ');
    tag.push_str(n);
    CommandComplete::new(tag)
}

impl Handler {
    /// Runs a portal's statement with its parameters.
    async fn run_statement(&self, portal: &Portal<Prepared>) -> PgWireResult<Ran> {
        let prepared = &portal.statement.statement;
        let params = Self::params(portal)?;
        let span = info_span!(
            "statement",
            kind = prepared.tag,
            sql = %truncate(&prepared.sql),
            rows = tracing::field::Empty,
            ms = tracing::field::Empty
        );
        // The clock is read only for a span a subscriber keeps.
        let start = (!span.is_disabled()).then(Instant::now);
        let result = {
            let _running = self.conn.shared.in_flight.read().await;
            let mut session = self.conn.session.lock().await;
            match &prepared.parsed {
                // Without parameters the text goes by `execute`, which
                // also tries its inline values' parameterized form.
                Some(parsed) if !params.is_empty() => {
                    session
                        .execute_parsed(parsed, &params)
                        .instrument(span.clone())
                        .await
                }
                _ => {
                    session
                        .execute(&prepared.sql, &params)
                        .instrument(span.clone())
                        .await
                }
            }
        };
        if let Some(start) = start {
            span.record("ms", start.elapsed().as_secs_f64() * 1000.0);
        }
        let mut outputs = result.map_err(|e| to_pg(&e))?;
        match outputs.pop() {
            None => Ok(Ran::Empty),
            Some(Output::Command { tag, rows }) => {
                span.record("rows", rows);
                Ok(Ran::Command(Tag::new(&tag.to_string())))
            }
            Some(Output::Rows { schema, batches }) => {
                let fields = prepared
                    .fields(&portal.result_column_format)
                    .unwrap_or_else(|| Arc::new(fields(&schema, &portal.result_column_format)));
                let rows = data_rows(&batches, &fields)
                    .map_err(|e| PgWireError::UserError(Box::new(e)))?;
                span.record("rows", rows.len());
                let tag = if prepared.tag == "SHOW" {
                    "SHOW"
                } else {
                    "SELECT"
                };
                Ok(Ran::Rows { fields, rows, tag })
            }
        }
    }

    /// Execute: runs the portal (once; a suspended one resumes) and feeds
    /// its rows and CommandComplete or PortalSuspended, unflushed. The
    /// protocol leaves flushing to Sync and Flush, and PostgreSQL writes a
    /// point select's whole reply, ReadyForQuery included, in one `send`;
    /// pgwire's default Execute flushes its last message, which cost a
    /// second `sendto` per statement and a second wake-up of the client
    /// (measured with strace under `pgbench -M prepared`).
    async fn execute_portal<C>(&self, client: &mut C, message: Execute) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Prepared>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        if !matches!(client.state(), PgWireConnectionState::ReadyForQuery) {
            return Err(PgWireError::NotReadyForQuery);
        }
        let name = message.name.as_deref().unwrap_or(DEFAULT_NAME);
        let portal = match client.portal_store().get_portal(name) {
            Some(Entry::Value(portal)) => portal,
            Some(Entry::Empty) => {
                client
                    .feed(PgWireBackendMessage::EmptyQueryResponse(
                        EmptyQueryResponse::new(),
                    ))
                    .await?;
                return Ok(());
            }
            None => return Err(PgWireError::PortalNotFound(name.to_owned())),
        };
        client.set_state(PgWireConnectionState::QueryInProgress);
        let r = self
            .run_portal(client, &portal, message.max_rows as usize)
            .await;
        client.set_state(PgWireConnectionState::ReadyForQuery);
        r
    }

    async fn run_portal<C>(
        &self,
        client: &mut C,
        portal: &Portal<Prepared>,
        max_rows: usize,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Prepared>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let started = !matches!(*portal.state.lock().await, PortalExecutionState::Initial);
        if !started {
            let cancel = cancel_receiver(&self.conn, client).await;
            // Pinned on the stack: no allocation and copy of the future.
            let query = std::pin::pin!(self.run_statement(portal));
            let ran = match cancel {
                Some(cancel) => match select(query, cancel).await {
                    Either::Left((r, _)) => r?,
                    Either::Right(_) => return Err(PgWireError::QueryCanceled),
                },
                None => query.await?,
            };
            let (fields, mut rows, tag) = match ran {
                Ran::Rows { fields, rows, tag } => (fields, rows, tag),
                Ran::Empty => {
                    client
                        .feed(PgWireBackendMessage::EmptyQueryResponse(
                            EmptyQueryResponse::new(),
                        ))
                        .await?;
                    return Ok(());
                }
                Ran::Command(tag) => {
                    client
                        .feed(PgWireBackendMessage::CommandComplete(tag.into()))
                        .await?;
                    return Ok(());
                }
            };
            // The rows are all here: they go out straight, and only those
            // past a row limit wait in the portal (as pgwire's portal
            // fetch does it: a limit met exactly also suspends).
            let rest = (max_rows > 0 && rows.len() >= max_rows).then(|| rows.split_off(max_rows));
            let n = rows.len();
            for row in rows {
                client.feed(PgWireBackendMessage::DataRow(row)).await?;
            }
            let last = match rest {
                Some(rest) => {
                    let mut resp =
                        QueryResponse::new(fields, futures::stream::iter(rest.into_iter().map(Ok)));
                    resp.set_command_tag(tag);
                    portal.start(resp).await;
                    PgWireBackendMessage::PortalSuspended(PortalSuspended::new())
                }
                None => {
                    *portal.state.lock().await = PortalExecutionState::Finished;
                    PgWireBackendMessage::CommandComplete(rows_complete(tag, n))
                }
            };
            client.feed(last).await?;
            return Ok(());
        }
        let fetched = portal.fetch(max_rows).await?;
        let mut response = fetched.response;
        let command = response.command_tag().to_owned();
        let mut rows = 0;
        while let Some(row) = response.data_rows().next().await {
            client.feed(PgWireBackendMessage::DataRow(row?)).await?;
            rows += 1;
        }
        let last = if fetched.suspended {
            PgWireBackendMessage::PortalSuspended(PortalSuspended::new())
        } else {
            PgWireBackendMessage::CommandComplete(rows_complete(&command, rows))
        };
        client.feed(last).await?;
        Ok(())
    }

    /// pgwire's Bind for what `on_bind` does not handle itself (unknown or
    /// empty statements).
    async fn _on_bind_default<C>(&self, client: &mut C, message: Bind) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Prepared>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let name = message.statement_name.as_deref().unwrap_or(DEFAULT_NAME);
        match client.portal_store().get_statement(name) {
            Some(Entry::Empty) => {
                if !message.parameters.is_empty() {
                    return Err(user_error(
                        "08P01",
                        format!(
                            "bind message supplies {} parameters, but prepared statement requires 0",
                            message.parameters.len()
                        ),
                    ));
                }
                let portal = message.portal_name.as_deref().unwrap_or(DEFAULT_NAME);
                client.portal_store().put_empty_portal(portal);
                client
                    .feed(PgWireBackendMessage::BindComplete(BindComplete::new()))
                    .await?;
                Ok(())
            }
            _ => Err(user_error(
                "26000",
                format!(
                    "prepared statement \"{}\" does not exist",
                    if name == DEFAULT_NAME { "" } else { name }
                ),
            )),
        }
    }
}
