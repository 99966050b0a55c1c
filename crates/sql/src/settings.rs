//! Session parameters: `SET`, `SHOW`, `RESET` (PostgreSQL's run-time
//! configuration, as far as clients use it).
//!
//! ```text
//! SET [SESSION | LOCAL] name { TO | = } value [, value ...] | DEFAULT
//! SET TIME ZONE value | LOCAL | DEFAULT
//! SET [SESSION CHARACTERISTICS AS] TRANSACTION ...      -- accepted; always serializable
//! SHOW name | SHOW ALL
//! RESET name | RESET ALL
//! ```
//!
//! [`Settings`] belongs to a [`crate::Session`]. Drivers set parameters in
//! their startup packet and with `SET` (client_encoding, DateStyle,
//! TimeZone, application_name, search_path, extra_float_digits, …); the
//! known ones are listed in [`PARAMETERS`] with their defaults. A dotted
//! name (`myapp.tenant`) is a custom parameter, as in PostgreSQL; any other
//! unknown name is SQLSTATE 42704.
//!
//! What the values change: nothing in query results yet. Values are always
//! sent as UTF-8, dates in ISO style and timestamps in UTC (`+00`), whatever
//! DateStyle and TimeZone say — so `client_encoding` accepts only UTF-8 and
//! DateStyle only ISO output, and a non-UTC TimeZone is recorded but
//! timestamps still print with an explicit `+00` offset (the same instant).
//! `SET` is not transactional here: a ROLLBACK does not undo it.

use std::collections::BTreeMap;

use datafusion::sql::sqlparser::parser::Parser;
use datafusion::sql::sqlparser::tokenizer::Token;

use crate::error::{Error, Result};

/// A parsed SET / SHOW / RESET.
#[derive(Debug, Clone, PartialEq)]
pub enum SettingStatement {
    /// `SET name = value`; `value: None` is `DEFAULT` (and `RESET name`).
    Set {
        name: String,
        value: Option<String>,
    },
    /// `SET TRANSACTION …` and `SET SESSION CHARACTERISTICS AS TRANSACTION
    /// …`: the access mode (`READ ONLY` / `READ WRITE`) is applied by the
    /// session; isolation levels are accepted (always serializable),
    /// transactions are serializable.
    Transaction {
        /// `Some(true)` for READ ONLY, `Some(false)` for READ WRITE.
        read_only: Option<bool>,
        /// SESSION CHARACTERISTICS: the default for later transactions.
        session: bool,
    },
    Show {
        name: String,
    },
    ShowAll,
    ResetAll,
}

/// The parameters a client may set, with their defaults, and whether a
/// change is reported to the client (PostgreSQL's `GUC_REPORT`, sent as a
/// ParameterStatus message).
pub const PARAMETERS: &[(&str, &str, bool)] = &[
    ("application_name", "", true),
    ("client_encoding", "UTF8", true),
    ("client_min_messages", "notice", false),
    ("datestyle", "ISO, MDY", true),
    ("default_transaction_isolation", "serializable", false),
    ("default_transaction_read_only", "off", true),
    ("extra_float_digits", "1", false),
    ("idle_in_transaction_session_timeout", "0", false),
    ("in_hot_standby", "off", true),
    ("integer_datetimes", "on", true),
    ("intervalstyle", "postgres", true),
    ("is_superuser", "on", true),
    ("lc_messages", "C", false),
    ("lc_monetary", "C", false),
    ("lc_numeric", "C", false),
    ("lc_time", "C", false),
    ("lock_timeout", "0", false),
    ("max_identifier_length", "63", false),
    ("plan_cache_mode", "auto", false),
    ("search_path", "\"$user\", public", false),
    ("server_encoding", "UTF8", true),
    ("server_version", "15.0", true),
    ("server_version_num", "150000", false),
    ("session_authorization", "spindle", true),
    ("standard_conforming_strings", "on", true),
    ("statement_timeout", "0", false),
    ("synchronous_commit", "on", false),
    ("timezone", "UTC", true),
    ("transaction_isolation", "serializable", false),
    ("transaction_read_only", "off", false),
    ("row_security", "on", false),
    ("bytea_output", "hex", false),
];

/// Parameters that cannot be changed by SET.
const READ_ONLY: &[&str] = &[
    "server_encoding",
    "server_version",
    "server_version_num",
    "integer_datetimes",
    "max_identifier_length",
    "in_hot_standby",
    "is_superuser",
    "lc_collate",
    "lc_ctype",
];

/// PostgreSQL's spelling of a parameter name for display (`DateStyle`).
fn display_name(name: &str) -> &str {
    match name {
        "datestyle" => "DateStyle",
        "timezone" => "TimeZone",
        "intervalstyle" => "IntervalStyle",
        other => other,
    }
}

/// Source of [`Settings::version`] numbers (0 is the defaults').
static VERSIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// One session's parameters.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// Values differing from the defaults, by lower-case name.
    values: BTreeMap<String, String>,
    /// Renumbered (process-wide unique) on every change, so two settings
    /// with the same version have the same values: lets the wire server
    /// skip comparing the reported parameters after each statement.
    version: u64,
}

impl Settings {
    /// See the `version` field: equal versions mean equal values.
    pub fn version(&self) -> u64 {
        self.version
    }

    fn changed(&mut self) {
        self.version = VERSIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// The current value of `name` (case-insensitive), if it is a parameter.
    pub fn get(&self, name: &str) -> Option<String> {
        self.value(&name.to_lowercase()).map(str::to_string)
    }

    /// [`Settings::get`] of a name already in lower case, borrowed (no
    /// allocation: the session asks for one before every query).
    pub fn value(&self, name: &str) -> Option<&str> {
        if let Some(v) = self.values.get(name) {
            return Some(v);
        }
        PARAMETERS
            .iter()
            .find(|(n, _, _)| *n == name)
            .map(|(_, d, _)| *d)
    }

    /// Sets `name` to `value` (`None`: back to its default), checking the
    /// value. Used by SET and by the wire server for startup parameters.
    pub fn set(&mut self, name: &str, value: Option<&str>) -> Result<()> {
        let name = name.to_lowercase();
        let known = PARAMETERS.iter().any(|(n, _, _)| *n == name);
        if !known && !name.contains('.') {
            return Err(Error::UndefinedObject(format!(
                "unrecognized configuration parameter \"{name}\""
            )));
        }
        if READ_ONLY.contains(&name.as_str()) {
            return Err(Error::CantChangeRuntimeParam(format!(
                "parameter \"{name}\" cannot be changed"
            )));
        }
        let Some(value) = value else {
            self.values.remove(&name);
            self.changed();
            return Ok(());
        };
        let value = match name.as_str() {
            "client_encoding" => {
                let v = value.to_uppercase().replace(['-', '_'], "");
                match v.as_str() {
                    "UTF8" | "UNICODE" => "UTF8".to_string(),
                    // PostgreSQL sends SQL_ASCII clients the stored bytes
                    // unconverted; ours are UTF-8 either way.
                    "SQLASCII" => "SQL_ASCII".to_string(),
                    _ => {
                        return Err(Error::Unsupported(format!(
                            "client_encoding {value} is not supported; Spindle speaks UTF8 only"
                        )))
                    }
                }
            }
            "datestyle" => {
                let parts: Vec<String> = value
                    .split(',')
                    .map(|p| p.trim().to_uppercase())
                    .filter(|p| !p.is_empty())
                    .collect();
                if parts
                    .iter()
                    .any(|p| !matches!(p.as_str(), "ISO" | "MDY" | "DMY" | "YMD" | "US"))
                {
                    return Err(Error::Unsupported(format!(
                        "DateStyle {value} is not supported; dates are output in ISO style"
                    )));
                }
                let order = parts
                    .iter()
                    .find(|p| matches!(p.as_str(), "MDY" | "DMY" | "YMD"))
                    .cloned()
                    .unwrap_or_else(|| "MDY".into());
                format!("ISO, {order}")
            }
            "extra_float_digits" => {
                let n: i32 = value.trim().parse().map_err(|_| {
                    Error::InvalidParameterValue(format!(
                        "invalid value for parameter \"extra_float_digits\": \"{value}\""
                    ))
                })?;
                if !(-15..=3).contains(&n) {
                    return Err(Error::InvalidParameterValue(format!(
                        "{n} is outside the valid range for parameter \"extra_float_digits\" (-15 .. 3)"
                    )));
                }
                n.to_string()
            }
            "transaction_isolation" | "default_transaction_isolation" => {
                let v = value.to_lowercase();
                if !matches!(
                    v.as_str(),
                    "serializable" | "repeatable read" | "read committed" | "read uncommitted"
                ) {
                    return Err(Error::InvalidParameterValue(format!(
                        "invalid value for parameter \"{name}\": \"{value}\""
                    )));
                }
                // Every transaction is serializable, which is at least as
                // strong as any level asked for.
                "serializable".to_string()
            }
            "plan_cache_mode" => {
                let v = value.to_ascii_lowercase();
                if !matches!(
                    v.as_str(),
                    "auto" | "force_custom_plan" | "force_generic_plan"
                ) {
                    return Err(Error::InvalidParameterValue(format!(
                        "invalid value for parameter \"plan_cache_mode\": \"{value}\""
                    )));
                }
                v
            }
            "lock_timeout" => {
                let ms = parse_millis(value).ok_or_else(|| {
                    Error::InvalidParameterValue(format!(
                        "invalid value for parameter \"lock_timeout\": \"{value}\""
                    ))
                })?;
                format_millis(ms)
            }
            _ => value.to_string(),
        };
        self.values.insert(name, value);
        self.changed();
        Ok(())
    }

    /// Whether a query with parameters may run by a kept template
    /// ([`crate::params`]): not under `plan_cache_mode =
    /// force_custom_plan`, where every execution is planned with its
    /// values, as in PostgreSQL. `force_generic_plan` is `auto` here: a
    /// text whose template is declined has no generic plan to force.
    pub fn generic_plans(&self) -> bool {
        self.values
            .get("plan_cache_mode")
            .is_none_or(|v| v != "force_custom_plan")
    }

    /// The longest wait for a row lock (`lock_timeout`; `None` when 0,
    /// PostgreSQL's "no limit").
    pub fn lock_timeout(&self) -> Option<std::time::Duration> {
        let ms = self
            .values
            .get("lock_timeout")
            .and_then(|v| parse_millis(v))
            .unwrap_or(0);
        (ms > 0).then(|| std::time::Duration::from_millis(ms))
    }

    /// Parameters whose changes are reported to the client, with their
    /// current values (PostgreSQL's names).
    pub fn reported(&self) -> Vec<(String, String)> {
        PARAMETERS
            .iter()
            .filter(|(_, _, report)| *report)
            .map(|(n, _, _)| (display_name(n).to_string(), self.get(n).unwrap_or_default()))
            .collect()
    }

    /// Every parameter (`SHOW ALL`), sorted by name.
    pub fn all(&self) -> Vec<(String, String)> {
        let mut out: BTreeMap<String, String> = PARAMETERS
            .iter()
            .map(|(n, d, _)| (n.to_string(), d.to_string()))
            .collect();
        for (k, v) in &self.values {
            out.insert(k.clone(), v.clone());
        }
        out.into_iter()
            .map(|(k, v)| (display_name(&k).to_string(), v))
            .collect()
    }

    /// Runs a SET / SHOW / RESET: `Ok(None)` for a command, `Ok(Some((column,
    /// rows)))` for a SHOW's result.
    #[allow(clippy::type_complexity)]
    pub fn apply(
        &mut self,
        stmt: &SettingStatement,
    ) -> Result<Option<(Vec<String>, Vec<Vec<String>>)>> {
        match stmt {
            SettingStatement::Set { name, value } => {
                self.set(name, value.as_deref())?;
                Ok(None)
            }
            SettingStatement::Transaction { .. } => Ok(None),
            SettingStatement::ResetAll => {
                self.values.clear();
                self.changed();
                Ok(None)
            }
            SettingStatement::Show { name } => {
                let lower = name.to_lowercase();
                let value = self.get(&lower).ok_or_else(|| {
                    Error::UndefinedObject(format!(
                        "unrecognized configuration parameter \"{name}\""
                    ))
                })?;
                Ok(Some((vec![lower], vec![vec![value]])))
            }
            SettingStatement::ShowAll => Ok(Some((
                vec!["name".into(), "setting".into()],
                self.all().into_iter().map(|(n, v)| vec![n, v]).collect(),
            ))),
        }
    }
}

/// A time parameter in milliseconds, as PostgreSQL reads one: a bare
/// number is milliseconds; `us`, `ms`, `s`, `min`, `h` and `d` are units.
fn parse_millis(value: &str) -> Option<u64> {
    let v = value.trim();
    let split = v
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(v.len());
    let (number, unit) = v.split_at(split);
    let n: f64 = number.parse().ok()?;
    let scale = match unit.trim() {
        "" | "ms" => 1.0,
        "us" => 0.001,
        "s" => 1_000.0,
        "min" => 60_000.0,
        "h" => 3_600_000.0,
        "d" => 86_400_000.0,
        _ => return None,
    };
    let ms = (n * scale).round();
    // PostgreSQL's limit for time parameters: INT_MAX milliseconds.
    (ms.is_finite() && (0.0..=i32::MAX as f64).contains(&ms)).then_some(ms as u64)
}

/// Milliseconds in PostgreSQL's display of a time parameter (`5s`, `250ms`).
fn format_millis(ms: u64) -> String {
    match ms {
        0 => "0".to_string(),
        ms if ms % 86_400_000 == 0 => format!("{}d", ms / 86_400_000),
        ms if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        ms if ms % 60_000 == 0 => format!("{}min", ms / 60_000),
        ms if ms % 1_000 == 0 => format!("{}s", ms / 1_000),
        ms => format!("{ms}ms"),
    }
}

fn is_word(p: &Parser, n: usize, word: &str) -> bool {
    match p.peek_nth_token(n).token {
        Token::Word(w) => w.quote_style.is_none() && w.value.eq_ignore_ascii_case(word),
        _ => false,
    }
}

/// A parameter name: one or more identifiers joined by dots.
fn parse_name(p: &mut Parser) -> Result<String> {
    let mut name = String::new();
    loop {
        match p.next_token().token {
            Token::Word(w) => name.push_str(&w.value.to_lowercase()),
            other => {
                return Err(Error::Syntax(format!(
                    "expected a parameter name, found: {other}"
                )))
            }
        }
        if p.peek_token().token == Token::Period {
            p.next_token();
            name.push('.');
        } else {
            return Ok(name);
        }
    }
}

/// The value list of a SET: words, strings and numbers separated by commas,
/// joined as PostgreSQL does (`ISO, MDY`); `None` for DEFAULT.
fn parse_value(p: &mut Parser) -> Result<Option<String>> {
    if is_word(p, 0, "DEFAULT") {
        p.next_token();
        return Ok(None);
    }
    let mut parts = Vec::new();
    let mut current = String::new();
    loop {
        let tok = p.peek_token().token;
        match tok {
            Token::EOF | Token::SemiColon => break,
            Token::Comma => {
                p.next_token();
                parts.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        p.next_token();
        match tok {
            Token::Word(w) => current.push_str(&w.value),
            Token::SingleQuotedString(s) | Token::NationalStringLiteral(s) => current.push_str(&s),
            Token::EscapedStringLiteral(s) => current.push_str(&s),
            Token::Number(n, _) => current.push_str(&n),
            Token::Minus => current.push('-'),
            Token::Plus => current.push('+'),
            Token::Period => current.push('.'),
            other => {
                return Err(Error::Syntax(format!(
                    "syntax error in SET value at: {other}"
                )))
            }
        }
    }
    parts.push(current);
    if parts.iter().any(|p| p.is_empty()) {
        return Err(Error::Syntax("SET needs a value".into()));
    }
    Ok(Some(parts.join(", ")))
}

/// Parses SET / SHOW / RESET if the parser is at one; `None` otherwise
/// (nothing consumed).
pub fn parse(p: &mut Parser) -> Option<Result<SettingStatement>> {
    if is_word(p, 0, "SHOW") {
        p.next_token();
        if is_word(p, 0, "ALL") {
            p.next_token();
            return Some(Ok(SettingStatement::ShowAll));
        }
        // `SHOW TIME ZONE`, `SHOW TRANSACTION ISOLATION LEVEL`
        if is_word(p, 0, "TIME") && is_word(p, 1, "ZONE") {
            p.next_token();
            p.next_token();
            return Some(Ok(SettingStatement::Show {
                name: "timezone".into(),
            }));
        }
        if is_word(p, 0, "TRANSACTION") {
            for _ in 0..3 {
                p.next_token();
            }
            return Some(Ok(SettingStatement::Show {
                name: "transaction_isolation".into(),
            }));
        }
        return Some(parse_name(p).map(|name| SettingStatement::Show { name }));
    }
    if is_word(p, 0, "RESET") {
        p.next_token();
        if is_word(p, 0, "ALL") {
            p.next_token();
            return Some(Ok(SettingStatement::ResetAll));
        }
        return Some(parse_name(p).map(|name| SettingStatement::Set { name, value: None }));
    }
    if !is_word(p, 0, "SET") {
        return None;
    }
    // `SET ROLE`, `SET SESSION AUTHORIZATION`, `SET NAMES`: let sqlparser
    // parse them (and classify refuse them).
    let mut n = 1;
    if is_word(p, n, "SESSION") || is_word(p, n, "LOCAL") {
        if is_word(p, n + 1, "CHARACTERISTICS") {
            p.next_token();
            return Some(Ok(SettingStatement::Transaction {
                read_only: access_mode(p),
                session: true,
            }));
        }
        n += 1;
    }
    if is_word(p, n, "ROLE") || is_word(p, n, "AUTHORIZATION") || is_word(p, n, "NAMES") {
        return None;
    }
    for _ in 0..n {
        p.next_token();
    }
    if is_word(p, 0, "TRANSACTION") {
        return Some(Ok(SettingStatement::Transaction {
            read_only: access_mode(p),
            session: false,
        }));
    }
    if is_word(p, 0, "TIME") && is_word(p, 1, "ZONE") {
        p.next_token();
        p.next_token();
        if is_word(p, 0, "LOCAL") {
            p.next_token();
            return Some(Ok(SettingStatement::Set {
                name: "timezone".into(),
                value: None,
            }));
        }
        return Some(parse_value(p).map(|value| SettingStatement::Set {
            name: "timezone".into(),
            value,
        }));
    }
    Some((|| {
        let name = parse_name(p)?;
        match p.next_token().token {
            Token::Eq => {}
            Token::Word(w) if w.value.eq_ignore_ascii_case("TO") => {}
            other => {
                return Err(Error::Syntax(format!(
                    "expected TO or = after SET {name}, found: {other}"
                )))
            }
        }
        let value = parse_value(p)?;
        Ok(SettingStatement::Set { name, value })
    })())
}

/// Consumes the rest of a `SET TRANSACTION` statement and returns its
/// access mode, if it names one (the last one wins, as in PostgreSQL).
fn access_mode(p: &mut Parser) -> Option<bool> {
    let mut mode = None;
    while !matches!(p.peek_token().token, Token::EOF | Token::SemiColon) {
        if is_word(p, 0, "READ") && is_word(p, 1, "ONLY") {
            mode = Some(true);
        } else if is_word(p, 0, "READ") && is_word(p, 1, "WRITE") {
            mode = Some(false);
        }
        p.next_token();
    }
    mode
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;

    fn parse_one(sql: &str) -> Option<Result<SettingStatement>> {
        let dialect = PostgreSqlDialect {};
        let mut p = Parser::new(&dialect).try_with_sql(sql).unwrap();
        parse(&mut p)
    }

    #[test]
    fn lock_timeout_reads_postgres_time_units() {
        let mut s = Settings::default();
        assert_eq!(s.lock_timeout(), None);
        for (input, shown, ms) in [
            ("250", "250ms", 250),
            ("2s", "2s", 2_000),
            ("1.5s", "1500ms", 1_500),
            ("3 min", "3min", 180_000),
            ("0", "0", 0),
        ] {
            s.set("lock_timeout", Some(input)).unwrap();
            assert_eq!(s.get("lock_timeout").unwrap(), shown, "{input}");
            let expected = (ms > 0).then(|| std::time::Duration::from_millis(ms));
            assert_eq!(s.lock_timeout(), expected, "{input}");
        }
        for bad in ["soon", "5 parsecs", "-1", "99999999999"] {
            let e = s.set("lock_timeout", Some(bad)).unwrap_err();
            assert_eq!(e.sqlstate(), "22023", "{bad}");
        }
    }

    #[test]
    fn set_show_reset_parse() {
        assert_eq!(
            parse_one("SET DateStyle = ISO, MDY").unwrap().unwrap(),
            SettingStatement::Set {
                name: "datestyle".into(),
                value: Some("ISO, MDY".into())
            }
        );
        assert_eq!(
            parse_one("set search_path to public, \"$user\"")
                .unwrap()
                .unwrap(),
            SettingStatement::Set {
                name: "search_path".into(),
                value: Some("public, $user".into())
            }
        );
        assert_eq!(
            parse_one("SET extra_float_digits = -3").unwrap().unwrap(),
            SettingStatement::Set {
                name: "extra_float_digits".into(),
                value: Some("-3".into())
            }
        );
        assert_eq!(
            parse_one("SET TIME ZONE 'UTC'").unwrap().unwrap(),
            SettingStatement::Set {
                name: "timezone".into(),
                value: Some("UTC".into())
            }
        );
        assert_eq!(
            parse_one("SHOW server_version").unwrap().unwrap(),
            SettingStatement::Show {
                name: "server_version".into()
            }
        );
        assert_eq!(
            parse_one("RESET ALL").unwrap().unwrap(),
            SettingStatement::ResetAll
        );
        assert!(parse_one("SELECT 1").is_none());
        assert!(parse_one("SET ROLE admin").is_none());
    }

    #[test]
    fn values_are_checked() {
        let mut s = Settings::default();
        s.set("application_name", Some("psql")).unwrap();
        assert_eq!(s.get("APPLICATION_NAME").as_deref(), Some("psql"));
        assert_eq!(s.set("nope", Some("1")).unwrap_err().sqlstate(), "42704");
        s.set("myapp.tenant", Some("7")).unwrap();
        assert_eq!(
            s.set("client_encoding", Some("LATIN1"))
                .unwrap_err()
                .sqlstate(),
            "0A000"
        );
        s.set("client_encoding", Some("utf-8")).unwrap();
        assert_eq!(
            s.set("server_version", Some("9")).unwrap_err().sqlstate(),
            "55P02"
        );
        s.set("DateStyle", Some("iso")).unwrap();
        assert_eq!(s.get("datestyle").as_deref(), Some("ISO, MDY"));
        s.set("application_name", None).unwrap();
        assert_eq!(s.get("application_name").as_deref(), Some(""));
    }
}
