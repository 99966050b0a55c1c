//! Errors of the SQL layer, and the one place that maps every error of
//! every layer to a PostgreSQL SQLSTATE ([`Error::sqlstate`]).
//!
//! Classes: retryable (40001 serialization failure, 40P01 deadlock), the
//! caller's invalid input (22xxx data, 23xxx constraint, 42xxx syntax/name,
//! 54000 limits, 25xxx transaction state, 55xxx object state — 55P03 a
//! lock wait past `lock_timeout` — 0A000 unsupported) and internal (XX000).

use datafusion::error::DataFusionError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("syntax error: {0}")]
    Syntax(String),
    #[error(transparent)]
    Catalog(#[from] spindle_catalog::Error),
    #[error(transparent)]
    Key(#[from] spindle_keys::Error),
    #[error(transparent)]
    Txn(#[from] spindle_txn::Error),
    #[error("{}", datafusion_message(.0))]
    DataFusion(#[from] DataFusionError),
    #[error("{0}")]
    UniqueViolation(String),
    #[error("{0}")]
    ForeignKeyViolation(String),
    #[error("{0}")]
    NotNullViolation(String),
    #[error("{0}")]
    StringTooLong(String),
    #[error("{0}")]
    InvalidValue(String),
    #[error("{0}")]
    OutOfRange(String),
    #[error("{0}")]
    DatatypeMismatch(String),
    #[error("{0}")]
    LimitExceeded(String),
    #[error("{0}")]
    Unsupported(String),
    #[error("{0}")]
    InvalidTransactionState(String),
    #[error("{0}")]
    ReadOnly(String),
    /// A statement that must run outside a transaction block (VACUUM).
    #[error("{0}")]
    ActiveTransaction(String),
    #[error("there is no unique or exclusion constraint matching the ON CONFLICT specification")]
    InvalidConflictTarget,
    #[error("current transaction is aborted, commands ignored until end of transaction block")]
    InFailedTransaction,
    #[error("{0}")]
    UndefinedParameter(String),
    /// An unknown configuration parameter (or other named object).
    #[error("{0}")]
    UndefinedObject(String),
    #[error("{0}")]
    InvalidParameterValue(String),
    #[error("{0}")]
    CantChangeRuntimeParam(String),
    /// Malformed COPY data: a wrong number of fields, an open quote.
    #[error("{0}")]
    BadCopyFormat(String),
    /// Text that is not valid UTF-8.
    #[error("{0}")]
    InvalidEncoding(String),
    /// A statement the client canceled (CancelRequest, CopyFail).
    #[error("{0}")]
    QueryCanceled(String),
    /// A commit-timestamp column written with a future timestamp, or
    /// `PENDING_COMMIT_TIMESTAMP()` written where it is not allowed.
    #[error("{0}")]
    InvalidCommitTimestamp(String),
    #[error("{0}")]
    Internal(String),
}

pub type Result<T> = std::result::Result<T, Error>;

impl From<spindle_catalog::KeyError> for Error {
    fn from(e: spindle_catalog::KeyError) -> Self {
        match e {
            spindle_catalog::KeyError::Catalog(c) => c.into(),
            spindle_catalog::KeyError::Key(k) => k.into(),
        }
    }
}

fn datafusion_message(e: &DataFusionError) -> String {
    // DataFusion wraps errors in context layers; show the innermost cause
    // without its "Error during planning:" style prefixes where possible.
    let inner = e.find_root();
    let mut s = inner.to_string();
    // DataFusion's hints about its own configuration mean nothing to our users.
    if let Some(i) = s.find(" Column names are case sensitive") {
        s.truncate(i);
    }
    for prefix in [
        "Error during planning: ",
        "Execution error: ",
        "Schema error: ",
        "SQL error: ",
        "External error: ",
        "This feature is not implemented: ",
    ] {
        if let Some(rest) = s.strip_prefix(prefix) {
            return rest.to_string();
        }
    }
    s
}

impl Error {
    /// The PostgreSQL SQLSTATE of this error.
    pub fn sqlstate(&self) -> &'static str {
        use spindle_catalog::Error as C;
        match self {
            Error::Syntax(_) => "42601",
            Error::Catalog(c) => match c {
                C::TableExists(_) => "42P07",
                C::NoSuchTable(_) => "42P01",
                C::NoSuchIndex(_) => "42704",
                C::NoSuchColumn(..) => "42703",
                C::ColumnExists(..) => "42701",
                C::InvalidDefinition(_) => "42P16",
                C::Dependent(_) => "2BP01",
                C::LimitExceeded(_) => "54000",
                C::ReservedName(_) => "42939",
            },
            Error::Key(k) => match k {
                spindle_keys::Error::Corrupt(_) => "XX000",
                spindle_keys::Error::NotKeyable(_) => "42804",
                spindle_keys::Error::KeyTooLarge(_) => "54000",
            },
            Error::Txn(spindle_txn::Error::Deadlock) => "40P01",
            Error::Txn(spindle_txn::Error::LockTimeout) => "55P03",
            Error::Txn(spindle_txn::Error::Interrupted) => "57014",
            Error::Txn(t) if t.is_retryable() => "40001",
            Error::Txn(spindle_txn::Error::StaleRead(_)) => "72000",
            Error::Txn(spindle_txn::Error::PendingCommitTimestamp) => "55000",
            Error::Txn(_) => "XX000",
            Error::DataFusion(e) => datafusion_sqlstate(e),
            Error::UniqueViolation(_) => "23505",
            Error::ForeignKeyViolation(_) => "23503",
            Error::NotNullViolation(_) => "23502",
            Error::StringTooLong(_) => "22001",
            Error::InvalidValue(_) => "22P02",
            Error::OutOfRange(_) => "22003",
            Error::DatatypeMismatch(_) => "42804",
            Error::LimitExceeded(_) => "54000",
            Error::Unsupported(_) => "0A000",
            Error::InvalidTransactionState(_) => "25000",
            Error::InFailedTransaction => "25P02",
            Error::ReadOnly(_) => "25006",
            Error::ActiveTransaction(_) => "25001",
            Error::InvalidConflictTarget => "42P10",
            Error::UndefinedParameter(_) => "42P02",
            Error::UndefinedObject(_) => "42704",
            Error::InvalidParameterValue(_) => "22023",
            Error::CantChangeRuntimeParam(_) => "55P02",
            Error::BadCopyFormat(_) => "22P04",
            Error::InvalidEncoding(_) => "22021",
            Error::QueryCanceled(_) => "57014",
            Error::InvalidCommitTimestamp(_) => "22008",
            Error::Internal(_) => "XX000",
        }
    }

    /// Whether retrying the transaction may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self.sqlstate(), "40001" | "40P01")
    }
}

fn datafusion_sqlstate(e: &DataFusionError) -> &'static str {
    let root = e.find_root();
    match root {
        DataFusionError::SQL(..) => "42601",
        DataFusionError::NotImplemented(_) => "0A000",
        DataFusionError::ArrowError(a, _) => match a.as_ref() {
            datafusion::arrow::error::ArrowError::DivideByZero => "22012",
            datafusion::arrow::error::ArrowError::CastError(_)
            | datafusion::arrow::error::ArrowError::ParseError(_) => "22P02",
            datafusion::arrow::error::ArrowError::ArithmeticOverflow(_) => "22003",
            _ => "XX000",
        },
        DataFusionError::SchemaError(s, _) => {
            let msg = s.to_string();
            if msg.contains("No field named") || msg.contains("not found") {
                "42703"
            } else if msg.contains("ambiguous") {
                "42702"
            } else {
                "42P01"
            }
        }
        DataFusionError::Plan(msg) => {
            if msg.contains("table") && msg.contains("not found") {
                "42P01"
            } else if msg.contains("No field named") {
                "42703"
            } else if msg.contains("unique expression names") {
                // Two output columns of a derived table share a name: in
                // PostgreSQL, referring to it is ambiguous.
                "42702"
            } else if msg.contains("Cannot infer common")
                || msg.contains("Cannot coerce")
                || msg.contains("No function matches")
            {
                "42883"
            } else {
                "42601"
            }
        }
        DataFusionError::Execution(msg) => {
            if msg.contains("Divide by zero") || msg.contains("divide by zero") {
                "22012"
            } else if msg.contains("overflow") {
                "22003"
            } else if msg.contains("Cannot cast") || msg.contains("Can't cast") {
                "22P02"
            } else {
                "22000"
            }
        }
        DataFusionError::ResourcesExhausted(_) => "53000",
        DataFusionError::External(inner) => inner
            .downcast_ref::<Error>()
            .map(|e| e.sqlstate())
            .unwrap_or("XX000"),
        _ => "XX000",
    }
}
