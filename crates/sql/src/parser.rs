//! Statement parsing: sqlparser (the copy DataFusion re-exports) for
//! standard SQL, plus our own grammar, built on sqlparser's parser and
//! tokenizer, for what sqlparser does not know:
//!
//! ```text
//! CREATE TABLE [IF NOT EXISTS] name ( column | PRIMARY KEY (cols) , ... )
//!     [PRIMARY KEY ( [col [ASC|DESC]], ... )]                       -- GoogleSQL
//!     [[,] INTERLEAVE IN PARENT parent [ON DELETE {CASCADE | NO ACTION}]]
//!     [[,] INTERLEAVE IN parent]
//!     [WITH (storage_parameter [= value], ...) | WITHOUT OIDS]       -- PG, checked, no effect
//! column := name type [NOT NULL | NULL | DEFAULT expr | PRIMARY KEY | OPTIONS (...)]...
//! type   := INT64 | STRING(n|MAX) | BYTES(n|MAX) | bigint | varchar(n) | ...
//! ALTER TABLE name ADD [COLUMN] [IF NOT EXISTS] column
//! ALTER TABLE name ADD [CONSTRAINT c] PRIMARY KEY (cols)          -- a key-less table only
//! ALTER TABLE name DROP [COLUMN] [IF EXISTS] name
//! ALTER TABLE name ALTER [COLUMN] name SET OPTIONS (allow_commit_timestamp = true|null)
//! ALTER TABLE name SET (row_copy = on|off)
//! column option := OPTIONS (allow_commit_timestamp = true|false|null)  -- GoogleSQL
//! type spanner.commit_timestamp = TIMESTAMP with that option          -- PG
//! DROP TABLE [IF EXISTS] name [, ...]
//! TRUNCATE [TABLE] [ONLY] name [, ...] [RESTART|CONTINUE IDENTITY] [CASCADE|RESTRICT]
//! VACUUM [(option [value], ...) | FULL FREEZE VERBOSE ANALYZE] [table [(cols)], ...]
//! ANALYZE [(option [value], ...) | VERBOSE] [table [(cols)], ...]
//! CREATE [UNIQUE] [NULL_FILTERED] INDEX [IF NOT EXISTS] [name] ON table [USING btree]
//!     ( col [ASC|DESC], ... )
//!     [STORING (cols) | INCLUDE (cols)]                              -- GoogleSQL | PG
//!     [[,] INTERLEAVE IN parent]
//!     [WHERE col IS NOT NULL [AND ...]]                              -- PG NULL_FILTERED
//! DROP INDEX [IF EXISTS] name [, ...]
//! INSERT OR UPDATE [INTO] ...                                       -- GoogleSQL upsert
//! ```
//!
//! Identifiers follow PostgreSQL: unquoted names fold to lower case,
//! quoted names keep their case. DataFusion folds the same way, so the
//! names in the catalog are the names queries resolve.

use datafusion::sql::sqlparser::ast::{self, Ident, ObjectName};
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::parser::{Parser, ParserError};
use datafusion::sql::sqlparser::tokenizer::Token;
use spindle_catalog::{
    ColumnDef, IndexDef, Interleave, InterleaveKind, KeyColumn, OnDelete, TableDef,
};
use spindle_keys::{DataType, Direction};

use crate::error::{Error, Result};

/// How deep expressions may nest before parsing fails with an error.
const PARSER_RECURSION_LIMIT: usize = 200;

/// A parsed statement.
#[derive(Debug, Clone)]
pub enum Statement {
    CreateTable {
        def: TableDef,
        if_not_exists: bool,
        /// The storage parameter `row_copy` (`WITH (row_copy = off)`), if
        /// given: whether the table keeps a row copy once tables are
        /// interleaved in it (`spindle_catalog::Catalog::row_copy`).
        row_copy: Option<bool>,
    },
    /// `DROP TABLE [IF EXISTS] a, b, …`: one statement, all or none.
    DropTable {
        names: Vec<String>,
        if_exists: bool,
    },
    /// `TRUNCATE [TABLE] [ONLY] a, b, … [CASCADE]`: deletes every row (and
    /// index entry) of the tables in the statement's transaction.
    Truncate {
        names: Vec<String>,
        cascade: bool,
    },
    CreateIndex {
        def: IndexDef,
        if_not_exists: bool,
    },
    DropIndex {
        names: Vec<String>,
        if_exists: bool,
    },
    AddColumn {
        table: String,
        column: ColumnDef,
        if_not_exists: bool,
    },
    DropColumn {
        table: String,
        column: String,
        if_exists: bool,
    },
    /// `ALTER TABLE t ADD [CONSTRAINT name] PRIMARY KEY (cols)` on a table
    /// created without one: its rows are re-keyed.
    AddPrimaryKey {
        table: String,
        columns: Vec<KeyColumn>,
    },
    /// `VACUUM [options] [tables]`: removes old versions now (outside a
    /// transaction block only); with ANALYZE it also does what ANALYZE does.
    Vacuum {
        tables: Vec<(String, Vec<String>)>,
    },
    /// `ANALYZE [VERBOSE] [tables]`: checks the tables and columns exist;
    /// Spindle keeps no planner statistics to refresh.
    Analyze {
        tables: Vec<(String, Vec<String>)>,
    },
    /// `ALTER TABLE t SET (row_copy = on | off)`.
    SetRowCopy {
        table: String,
        on: bool,
    },
    /// `ALTER TABLE t ALTER COLUMN c SET OPTIONS (allow_commit_timestamp = …)`.
    SetColumnOptions {
        table: String,
        column: String,
        allow_commit_timestamp: bool,
    },
    Begin {
        read_only: bool,
    },
    Commit,
    Rollback,
    /// `upsert` is GoogleSQL's INSERT OR UPDATE.
    Insert {
        insert: Box<ast::Insert>,
        upsert: bool,
    },
    /// Rows of text values for `table`'s `columns` (all visible columns
    /// when empty), as `COPY … FROM` delivers them (`None` for NULL): an
    /// INSERT of string literals without its SQL. Made by the wire
    /// server's COPY, never parsed.
    InsertText {
        table: String,
        columns: Vec<String>,
        rows: Vec<Vec<Option<String>>>,
    },
    Update(Box<ast::Update>),
    Delete(Box<ast::Delete>),
    /// A query (or EXPLAIN) planned and run by DataFusion.
    Query(Box<ast::Statement>),
    /// A query with parameters and their values: run by its kept
    /// template ([`crate::params`]), else bound and run as a [`Statement::Query`].
    PreparedQuery(Box<PreparedQuery>),
    /// SET / SHOW / RESET of a session parameter ([`crate::settings`]).
    Setting(crate::settings::SettingStatement),
    /// EXPLAIN of an INSERT, UPDATE or DELETE: the statement runs in a
    /// transaction that is rolled back, and the result says which splits
    /// its writes touch and whether its commit would take one phase or two.
    ExplainDml(Box<Statement>),
}

/// A query (`ast::Statement::Query`) with its `$n` in place, and the
/// values of one execution.
#[derive(Debug, Clone)]
pub struct PreparedQuery {
    pub template: ast::Statement,
    pub params: Vec<spindle_keys::Value>,
    /// The text as sent, with its values inline, when `template` is its
    /// parameterized form (`crate::normalize`): what runs if the template
    /// does not, instead of `template` bound with `params`.
    pub inline: Option<Box<ast::Statement>>,
    /// `template`'s key in the templates' map, when it was made already
    /// (`Parsed::template_key`).
    pub key: Option<std::sync::Arc<crate::query_cache::Key>>,
}

impl Statement {
    /// The PostgreSQL command tag's verb.
    pub fn tag(&self) -> &'static str {
        match self {
            Statement::CreateTable { .. } => "CREATE TABLE",
            Statement::DropTable { .. } => "DROP TABLE",
            Statement::Truncate { .. } => "TRUNCATE TABLE",
            Statement::CreateIndex { .. } => "CREATE INDEX",
            Statement::DropIndex { .. } => "DROP INDEX",
            Statement::AddColumn { .. }
            | Statement::DropColumn { .. }
            | Statement::AddPrimaryKey { .. }
            | Statement::SetRowCopy { .. }
            | Statement::SetColumnOptions { .. } => "ALTER TABLE",
            Statement::Vacuum { .. } => "VACUUM",
            Statement::Analyze { .. } => "ANALYZE",
            Statement::Begin { .. } => "BEGIN",
            Statement::Commit => "COMMIT",
            Statement::Rollback => "ROLLBACK",
            Statement::Insert { .. } | Statement::InsertText { .. } => "INSERT",
            Statement::Update(_) => "UPDATE",
            Statement::Delete(_) => "DELETE",
            Statement::Query(_) | Statement::PreparedQuery(_) | Statement::ExplainDml(_) => {
                "SELECT"
            }
            Statement::Setting(crate::settings::SettingStatement::Show { .. })
            | Statement::Setting(crate::settings::SettingStatement::ShowAll) => "SHOW",
            Statement::Setting(crate::settings::SettingStatement::Set { value: None, .. })
            | Statement::Setting(crate::settings::SettingStatement::ResetAll) => "RESET",
            Statement::Setting(_) => "SET",
        }
    }
}

fn syntax(e: ParserError) -> Error {
    let msg = e.to_string();
    Error::Syntax(
        msg.strip_prefix("sql parser error: ")
            .unwrap_or(&msg)
            .to_string(),
    )
}

/// Parses every statement of `sql`.
pub fn parse(sql: &str) -> Result<Vec<Statement>> {
    let (text, hints) = crate::hints::extract(sql)?;
    let mut out = parse_text(&text)?;
    if !hints.is_empty() {
        for stmt in &mut out {
            match stmt {
                Statement::Query(q) => crate::hints::apply(q, &hints),
                Statement::ExplainDml(_)
                | Statement::Insert { .. }
                | Statement::Update(_)
                | Statement::Delete(_) => {
                    return Err(Error::Unsupported(
                        "index hints are supported in queries only".into(),
                    ))
                }
                _ => {}
            }
        }
    }
    Ok(out)
}

fn parse_text(sql: &str) -> Result<Vec<Statement>> {
    let dialect = PostgreSqlDialect {};
    // Deeply nested expressions (long chains of parenthesized ORs in
    // generated SQL) need more than sqlparser's default depth of 50.
    let mut parser = Parser::new(&dialect)
        .with_recursion_limit(PARSER_RECURSION_LIMIT)
        .try_with_sql(sql)
        .map_err(syntax)?;
    let mut out = Vec::new();
    loop {
        while parser.consume_token(&Token::SemiColon) {}
        if parser.peek_token().token == Token::EOF {
            break;
        }
        out.push(parse_statement(&mut parser)?);
        let next = parser.peek_token();
        if next.token != Token::EOF && next.token != Token::SemiColon {
            return Err(Error::Syntax(format!(
                "expected end of statement, found: {}",
                next.token
            )));
        }
    }
    Ok(out)
}

/// The statement's first word when it is plainly one: after whitespace,
/// semicolons and comments (`--` and nested `/* */`), a run of ASCII
/// letters and underscores. `None` when the text starts any other way
/// (quote, parenthesis, non-ASCII, unterminated comment) or is empty: the
/// caller must then tokenize. Lets the wire server rule out COPY and
/// DEALLOCATE without tokenizing every query.
pub fn leading_word(sql: &str) -> Option<&str> {
    let b = sql.as_bytes();
    let mut i = 0;
    loop {
        match b.get(i)? {
            c if c.is_ascii_whitespace() || *c == b';' => i += 1,
            b'-' if b.get(i + 1) == Some(&b'-') => {
                while b.get(i).is_some_and(|c| *c != b'\n') {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let mut depth = 0usize;
                loop {
                    match (b.get(i)?, b.get(i + 1)) {
                        (b'/', Some(b'*')) => {
                            depth += 1;
                            i += 2;
                        }
                        (b'*', Some(b'/')) => {
                            depth -= 1;
                            i += 2;
                            if depth == 0 {
                                break;
                            }
                        }
                        _ => i += 1,
                    }
                }
            }
            c if c.is_ascii_alphabetic() || *c == b'_' => {
                let end = b[i..]
                    .iter()
                    .position(|c| !(c.is_ascii_alphanumeric() || *c == b'_' || *c == b'$'))
                    .map_or(b.len(), |n| i + n);
                return sql.get(i..end);
            }
            _ => return None,
        }
    }
}

/// Folds an identifier like PostgreSQL.
pub fn fold_ident(ident: &Ident) -> String {
    if ident.quote_style.is_some() {
        ident.value.clone()
    } else {
        ident.value.to_lowercase()
    }
}

/// The single-part name of a table (schema qualification is not supported
/// beyond `public.`).
pub fn object_name(name: &ObjectName) -> Result<String> {
    let parts: Vec<&Ident> = name.0.iter().filter_map(|p| p.as_ident()).collect();
    match parts.as_slice() {
        [one] => Ok(fold_ident(one)),
        [schema, one] if fold_ident(schema) == "public" => Ok(fold_ident(one)),
        _ => Err(Error::Unsupported(format!(
            "qualified name {name} is not supported"
        ))),
    }
}

fn is_word(parser: &Parser, n: usize, word: &str) -> bool {
    match parser.peek_nth_token(n).token {
        Token::Word(w) => w.quote_style.is_none() && w.value.eq_ignore_ascii_case(word),
        _ => false,
    }
}

/// One or more table names separated by commas (a trailing `*`, PostgreSQL's
/// "and its descendants" of inheritance, is accepted: Spindle has no table
/// inheritance).
fn table_names(p: &mut Parser) -> Result<Vec<String>> {
    let mut names = Vec::new();
    loop {
        names.push(object_name(&p.parse_object_name(false).map_err(syntax)?)?);
        // A trailing `*` changes nothing here.
        let _ = p.consume_token(&Token::Mul);
        if !p.consume_token(&Token::Comma) {
            return Ok(names);
        }
    }
}

fn parse_statement(p: &mut Parser) -> Result<Statement> {
    if is_word(p, 0, "CREATE") && is_word(p, 1, "TABLE") {
        p.next_token();
        p.next_token();
        return parse_create_table(p);
    }
    if is_word(p, 0, "DROP") && is_word(p, 1, "TABLE") {
        p.next_token();
        p.next_token();
        let if_exists = p.parse_keywords(&[Keyword::IF, Keyword::EXISTS]);
        let names = table_names(p)?;
        if is_word(p, 0, "CASCADE") {
            return Err(Error::Unsupported(
                "DROP TABLE … CASCADE is not supported: drop the interleaved tables first, or \
                 list them in the same DROP TABLE"
                    .into(),
            ));
        }
        if is_word(p, 0, "RESTRICT") {
            p.next_token();
        }
        return Ok(Statement::DropTable { names, if_exists });
    }
    if is_word(p, 0, "TRUNCATE") {
        p.next_token();
        if is_word(p, 0, "TABLE") {
            p.next_token();
        }
        if is_word(p, 0, "ONLY") {
            p.next_token();
        }
        let names = table_names(p)?;
        // Spindle has no sequences, so there is no identity to restart or
        // continue: both spellings are accepted as they change nothing.
        if (is_word(p, 0, "RESTART") || is_word(p, 0, "CONTINUE")) && is_word(p, 1, "IDENTITY") {
            p.next_token();
            p.next_token();
        }
        let cascade = is_word(p, 0, "CASCADE");
        if cascade || is_word(p, 0, "RESTRICT") {
            p.next_token();
        }
        return Ok(Statement::Truncate { names, cascade });
    }
    if is_word(p, 0, "VACUUM") {
        p.next_token();
        let analyze = maintenance_options(p, true)?;
        let tables = tables_and_columns(p)?;
        if !analyze && tables.iter().any(|(_, cols)| !cols.is_empty()) {
            return Err(Error::Unsupported(
                "ANALYZE option must be specified when a column list is provided".into(),
            ));
        }
        return Ok(Statement::Vacuum { tables });
    }
    if is_word(p, 0, "ANALYZE") || is_word(p, 0, "ANALYSE") {
        p.next_token();
        maintenance_options(p, false)?;
        let tables = tables_and_columns(p)?;
        return Ok(Statement::Analyze { tables });
    }
    if is_word(p, 0, "CREATE") {
        let mut n = 1;
        while is_word(p, n, "UNIQUE") || is_word(p, n, "NULL_FILTERED") {
            n += 1;
        }
        if is_word(p, n, "INDEX") {
            p.next_token();
            return parse_create_index(p);
        }
    }
    if is_word(p, 0, "DROP") && is_word(p, 1, "INDEX") {
        p.next_token();
        p.next_token();
        let if_exists = p.parse_keywords(&[Keyword::IF, Keyword::EXISTS]);
        let mut names = Vec::new();
        loop {
            names.push(object_name(&p.parse_object_name(false).map_err(syntax)?)?);
            if !p.consume_token(&Token::Comma) {
                break;
            }
        }
        return Ok(Statement::DropIndex { names, if_exists });
    }
    if is_word(p, 0, "ALTER") && is_word(p, 1, "TABLE") {
        p.next_token();
        p.next_token();
        return parse_alter_table(p);
    }
    if is_word(p, 0, "INSERT") && is_word(p, 1, "OR") && is_word(p, 2, "UPDATE") {
        let insert_token = p.next_token();
        p.next_token();
        p.next_token();
        return match p.parse_insert(insert_token).map_err(syntax)? {
            ast::Statement::Insert(insert) => Ok(Statement::Insert {
                insert: Box::new(insert),
                upsert: true,
            }),
            other => Err(Error::Internal(format!("INSERT parsed as {other}"))),
        };
    }
    if let Some(setting) = crate::settings::parse(p) {
        return setting.map(Statement::Setting);
    }
    let stmt = p.parse_statement().map_err(syntax)?;
    classify(stmt)
}

/// The options of VACUUM (`vacuum` true) or ANALYZE, in either form:
/// `( option [value], … )` or the bare words `FULL FREEZE VERBOSE ANALYZE`
/// (VACUUM) / `VERBOSE` (ANALYZE). They change nothing here — Spindle's
/// storage has no heap pages to compact or freeze, and VERBOSE's report
/// has no channel — but each is checked, so a misspelt option is an error
/// as in PostgreSQL. Returns whether a VACUUM asked for ANALYZE.
fn maintenance_options(p: &mut Parser, vacuum: bool) -> Result<bool> {
    const VACUUM_OPTIONS: &[&str] = &[
        "FULL",
        "FREEZE",
        "VERBOSE",
        "ANALYZE",
        "ANALYSE",
        "DISABLE_PAGE_SKIPPING",
        "SKIP_LOCKED",
        "INDEX_CLEANUP",
        "PROCESS_TOAST",
        "TRUNCATE",
        "PARALLEL",
    ];
    const ANALYZE_OPTIONS: &[&str] = &["VERBOSE", "SKIP_LOCKED"];
    let allowed = if vacuum {
        VACUUM_OPTIONS
    } else {
        ANALYZE_OPTIONS
    };
    let command = if vacuum { "VACUUM" } else { "ANALYZE" };
    let mut analyze = false;
    if p.consume_token(&Token::LParen) {
        loop {
            let word = match p.next_token().token {
                Token::Word(w) => w.value.to_ascii_uppercase(),
                other => {
                    return Err(Error::Syntax(format!(
                        "expected a {command} option, found: {other}"
                    )))
                }
            };
            if !allowed.contains(&word.as_str()) {
                return Err(Error::Syntax(format!(
                    "unrecognized {command} option \"{}\"",
                    word.to_lowercase()
                )));
            }
            // An optional value: a boolean, ON/OFF/AUTO, or a number.
            let mut on = true;
            match p.peek_token().token {
                Token::Comma | Token::RParen => {}
                Token::Number(n, _) => {
                    p.next_token();
                    on = n != "0";
                }
                Token::Word(w) => {
                    p.next_token();
                    on = !matches!(w.value.to_ascii_lowercase().as_str(), "false" | "off" | "0");
                }
                Token::SingleQuotedString(v) => {
                    p.next_token();
                    on = !matches!(v.to_ascii_lowercase().as_str(), "false" | "off" | "0");
                }
                other => {
                    return Err(Error::Syntax(format!(
                        "unexpected {other} after {command} option {}",
                        word.to_lowercase()
                    )))
                }
            }
            if matches!(word.as_str(), "ANALYZE" | "ANALYSE") {
                analyze = on;
            }
            if !p.consume_token(&Token::Comma) {
                break;
            }
        }
        p.expect_token(&Token::RParen).map_err(syntax)?;
        return Ok(analyze);
    }
    let bare: &[&str] = if vacuum {
        &["FULL", "FREEZE", "VERBOSE", "ANALYZE", "ANALYSE"]
    } else {
        &["VERBOSE"]
    };
    while let Some(word) = bare.iter().find(|w| is_word(p, 0, w)) {
        analyze |= matches!(*word, "ANALYZE" | "ANALYSE");
        p.next_token();
    }
    Ok(analyze)
}

/// `table [(col, …)], …` after VACUUM or ANALYZE; empty for "every table".
fn tables_and_columns(p: &mut Parser) -> Result<Vec<(String, Vec<String>)>> {
    let mut out = Vec::new();
    if matches!(p.peek_token().token, Token::EOF | Token::SemiColon) {
        return Ok(out);
    }
    loop {
        let table = object_name(&p.parse_object_name(false).map_err(syntax)?)?;
        let mut columns = Vec::new();
        if p.consume_token(&Token::LParen) {
            loop {
                columns.push(fold_ident(&p.parse_identifier().map_err(syntax)?));
                if !p.consume_token(&Token::Comma) {
                    break;
                }
            }
            p.expect_token(&Token::RParen).map_err(syntax)?;
        }
        out.push((table, columns));
        if !p.consume_token(&Token::Comma) {
            return Ok(out);
        }
    }
}

fn classify(stmt: ast::Statement) -> Result<Statement> {
    Ok(match stmt {
        ast::Statement::StartTransaction { modes, .. } => {
            let read_only = modes.iter().any(|m| {
                matches!(
                    m,
                    ast::TransactionMode::AccessMode(ast::TransactionAccessMode::ReadOnly)
                )
            });
            Statement::Begin { read_only }
        }
        ast::Statement::Commit { .. } => Statement::Commit,
        ast::Statement::Rollback {
            savepoint: Some(_), ..
        } => return Err(Error::Unsupported("savepoints are not supported".into())),
        ast::Statement::Rollback { .. } => Statement::Rollback,
        ast::Statement::Insert(insert) => Statement::Insert {
            insert: Box::new(insert),
            upsert: false,
        },
        ast::Statement::Update(update) => Statement::Update(Box::new(update)),
        ast::Statement::Delete(delete) => Statement::Delete(Box::new(delete)),
        ast::Statement::Explain {
            statement,
            analyze: false,
            ..
        } if matches!(
            statement.as_ref(),
            ast::Statement::Insert(_) | ast::Statement::Update(_) | ast::Statement::Delete(_)
        ) =>
        {
            Statement::ExplainDml(Box::new(classify(*statement)?))
        }
        q @ (ast::Statement::Query(_) | ast::Statement::Explain { .. }) => {
            Statement::Query(Box::new(q))
        }
        other => {
            let text = other.to_string();
            let verb: String = text
                .split_whitespace()
                .take(2)
                .collect::<Vec<_>>()
                .join(" ");
            return Err(Error::Unsupported(format!(
                "statement not supported: {verb}"
            )));
        }
    })
}

fn parse_create_table(p: &mut Parser) -> Result<Statement> {
    let if_not_exists = p.parse_keywords(&[Keyword::IF, Keyword::NOT, Keyword::EXISTS]);
    let name = object_name(&p.parse_object_name(false).map_err(syntax)?)?;
    p.expect_token(&Token::LParen).map_err(syntax)?;
    let mut columns = Vec::new();
    let mut primary_key: Option<Vec<KeyColumn>> = None;
    loop {
        if p.consume_token(&Token::RParen) {
            break;
        }
        if p.parse_keyword(Keyword::CONSTRAINT) {
            p.parse_identifier().map_err(syntax)?;
        }
        if p.parse_keywords(&[Keyword::PRIMARY, Keyword::KEY]) {
            set_primary_key(&mut primary_key, parse_key_list(p)?)?;
        } else if p.peek_keyword(Keyword::UNIQUE)
            || p.peek_keyword(Keyword::FOREIGN)
            || p.peek_keyword(Keyword::CHECK)
        {
            return Err(Error::Unsupported(format!(
                "table constraint {} is not supported; use a secondary index or interleaving",
                p.peek_token().token
            )));
        } else {
            let (col, inline_pk) = parse_column(p)?;
            if inline_pk {
                set_primary_key(
                    &mut primary_key,
                    vec![KeyColumn {
                        name: col.name.clone(),
                        direction: Direction::Asc,
                    }],
                )?;
            }
            columns.push(col);
        }
        if !p.consume_token(&Token::Comma) {
            p.expect_token(&Token::RParen).map_err(syntax)?;
            break;
        }
    }
    // GoogleSQL: PRIMARY KEY after the column list.
    if p.parse_keywords(&[Keyword::PRIMARY, Keyword::KEY]) {
        set_primary_key(&mut primary_key, parse_key_list(p)?)?;
    }
    let mut with_given = storage_parameters(p)?;
    let mut interleave = None;
    let comma = p.consume_token(&Token::Comma);
    if is_word(p, 0, "INTERLEAVE") {
        p.next_token();
        p.expect_keyword(Keyword::IN).map_err(syntax)?;
        let in_parent = is_word(p, 0, "PARENT");
        if in_parent {
            p.next_token();
        }
        let parent = object_name(&p.parse_object_name(false).map_err(syntax)?)?;
        let mut on_delete = OnDelete::NoAction;
        if p.parse_keywords(&[Keyword::ON, Keyword::DELETE]) {
            if !in_parent {
                return Err(Error::Syntax(
                    "ON DELETE is only allowed with INTERLEAVE IN PARENT".into(),
                ));
            }
            if p.parse_keyword(Keyword::CASCADE) {
                on_delete = OnDelete::Cascade;
            } else if p.parse_keywords(&[Keyword::NO, Keyword::ACTION]) {
                on_delete = OnDelete::NoAction;
            } else {
                return Err(Error::Syntax(format!(
                    "expected CASCADE or NO ACTION after ON DELETE, found: {}",
                    p.peek_token().token
                )));
            }
        }
        interleave = Some(Interleave {
            parent,
            kind: if in_parent {
                InterleaveKind::InParent
            } else {
                InterleaveKind::In
            },
            on_delete,
        });
    } else if comma {
        return Err(Error::Syntax(format!(
            "expected INTERLEAVE after ',', found: {}",
            p.peek_token().token
        )));
    }
    if is_word(p, 0, "WITH") || is_word(p, 0, "WITHOUT") {
        if with_given.is_some() {
            return Err(Error::Syntax("WITH given twice".into()));
        }
        with_given = storage_parameters(p)?;
    }
    let row_copy = with_given.and_then(|w| w.row_copy);
    if is_word(p, 0, "OPTIONS") || is_word(p, 0, "ROW") {
        return Err(Error::Unsupported(format!(
            "table option {} is not supported",
            p.peek_token().token
        )));
    }
    // Key columns are implicitly NOT NULL in PostgreSQL's form; in GoogleSQL
    // they may be NULL (NULL sorts first). We follow PostgreSQL only when
    // the key was declared inside the parentheses.
    let primary_key = primary_key.unwrap_or_default();
    if primary_key.is_empty() && columns.is_empty() {
        return Err(Error::Syntax("a table needs at least one column".into()));
    }
    Ok(Statement::CreateTable {
        def: TableDef {
            name,
            columns,
            primary_key,
            interleave,
        },
        if_not_exists,
        row_copy,
    })
}

/// The storage parameters of a CREATE TABLE that mean something to Spindle.
#[derive(Default)]
struct StorageParameters {
    /// `row_copy = on | off`.
    row_copy: Option<bool>,
}

/// A table's storage parameters, PostgreSQL's `WITH (name [= value], …)`
/// (or `WITHOUT OIDS`) after CREATE TABLE's column list; `None` when there
/// are none. PostgreSQL's tune its heap pages (free space left for
/// updates, TOAST, autovacuum's thresholds) and have no counterpart in
/// Spindle's B-tree, so they change nothing — but each is checked as
/// PostgreSQL checks it (an unknown name, a value of the wrong kind or out
/// of range is 22023), so a script written for PostgreSQL runs unchanged
/// and a misspelt parameter is not silently dropped. Spindle's own:
/// `row_copy` (boolean).
fn storage_parameters(p: &mut Parser) -> Result<Option<StorageParameters>> {
    if is_word(p, 0, "WITHOUT") && is_word(p, 1, "OIDS") {
        p.next_token();
        p.next_token();
        return Ok(Some(StorageParameters::default()));
    }
    if !(is_word(p, 0, "WITH") && p.peek_nth_token(1).token == Token::LParen) {
        return Ok(None);
    }
    p.next_token();
    let params = parameter_list(p)?;
    Ok(Some(params))
}

/// `(name [= value], …)` of storage parameters, each checked, from the
/// opening parenthesis.
fn parameter_list(p: &mut Parser) -> Result<StorageParameters> {
    let mut params = StorageParameters::default();
    p.expect_token(&Token::LParen).map_err(syntax)?;
    loop {
        let mut name = fold_ident(&p.parse_identifier().map_err(syntax)?);
        if p.consume_token(&Token::Period) {
            let sub = fold_ident(&p.parse_identifier().map_err(syntax)?);
            name = format!("{name}.{sub}");
        }
        let value = if p.consume_token(&Token::Eq) {
            match p.next_token().token {
                Token::Number(n, _) => n,
                Token::Word(w) => w.value.to_lowercase(),
                Token::SingleQuotedString(v) => v.to_lowercase(),
                Token::Minus => match p.next_token().token {
                    Token::Number(n, _) => format!("-{n}"),
                    other => {
                        return Err(Error::Syntax(format!(
                            "expected a value for \"{name}\", found: -{other}"
                        )))
                    }
                },
                other => {
                    return Err(Error::Syntax(format!(
                        "expected a value for \"{name}\", found: {other}"
                    )))
                }
            }
        } else {
            // `WITH (autovacuum_enabled)` means true.
            "true".to_string()
        };
        check_storage_parameter(&name, &value)?;
        if name == "row_copy" {
            params.row_copy = Some(matches!(value.as_str(), "true" | "on" | "1" | "yes" | "t"));
        }
        if !p.consume_token(&Token::Comma) {
            break;
        }
    }
    p.expect_token(&Token::RParen).map_err(syntax)?;
    Ok(params)
}

/// Checks one storage parameter against PostgreSQL 15's table parameters.
fn check_storage_parameter(name: &str, value: &str) -> Result<()> {
    enum Kind {
        Int(i64, i64),
        Real(f64, f64),
        Bool,
        Choice(&'static [&'static str]),
    }
    use Kind::*;
    const AV: &str = "autovacuum_";
    let base = name.strip_prefix("toast.").unwrap_or(name);
    let toast = base.len() != name.len();
    let kind = match base {
        "fillfactor" if !toast => Int(10, 100),
        "row_copy" if !toast => Bool,
        "toast_tuple_target" if !toast => Int(128, 8160),
        "parallel_workers" if !toast => Int(0, 1024),
        "user_catalog_table" if !toast => Bool,
        "oids" if !toast => {
            return if matches!(value, "false" | "off" | "0" | "no") {
                Ok(())
            } else {
                Err(Error::Unsupported(
                    "tables declared WITH OIDS are not supported".into(),
                ))
            };
        }
        "autovacuum_enabled" | "vacuum_truncate" => Bool,
        "vacuum_index_cleanup" => Choice(&["auto", "on", "off", "true", "false", "1", "0"]),
        "log_autovacuum_min_duration" => Int(-1, i32::MAX as i64),
        n if n.starts_with(AV) => match &n[AV.len()..] {
            "vacuum_threshold" => Int(0, i32::MAX as i64),
            "vacuum_insert_threshold" => Int(-1, i32::MAX as i64),
            "analyze_threshold" if !toast => Int(0, i32::MAX as i64),
            "vacuum_scale_factor" | "vacuum_insert_scale_factor" => Real(0.0, 100.0),
            "analyze_scale_factor" if !toast => Real(0.0, 100.0),
            "vacuum_cost_delay" => Real(-1.0, 100.0),
            "vacuum_cost_limit" => Int(-1, 10000),
            "freeze_min_age" | "multixact_freeze_min_age" => Int(-1, 1_000_000_000),
            "freeze_max_age" | "multixact_freeze_max_age" => Int(-1, 2_000_000_000),
            "freeze_table_age" | "multixact_freeze_table_age" => Int(-1, 2_000_000_000),
            _ => {
                return Err(Error::InvalidParameterValue(format!(
                    "unrecognized parameter \"{name}\""
                )))
            }
        },
        _ => {
            return Err(Error::InvalidParameterValue(format!(
                "unrecognized parameter \"{name}\""
            )))
        }
    };
    let bad_kind = |what: &str| {
        Error::InvalidParameterValue(format!(
            "invalid value for {what} option \"{name}\": {value}"
        ))
    };
    match kind {
        Int(min, max) => {
            let v: i64 = value.parse().map_err(|_| bad_kind("integer"))?;
            if v < min || v > max {
                return Err(Error::InvalidParameterValue(format!(
                    "value {value} out of bounds for option \"{name}\": valid values are between \"{min}\" and \"{max}\""
                )));
            }
        }
        Real(min, max) => {
            let v: f64 = value.parse().map_err(|_| bad_kind("floating point"))?;
            if !(min..=max).contains(&v) {
                return Err(Error::InvalidParameterValue(format!(
                    "value {value} out of bounds for option \"{name}\": valid values are between \"{min}\" and \"{max}\""
                )));
            }
        }
        Bool => {
            if !matches!(
                value,
                "true" | "false" | "on" | "off" | "1" | "0" | "yes" | "no" | "t" | "f"
            ) {
                return Err(bad_kind("boolean"));
            }
        }
        Choice(options) => {
            if !options.contains(&value) {
                return Err(Error::InvalidParameterValue(format!(
                    "invalid value for enum option \"{name}\": {value}"
                )));
            }
        }
    }
    Ok(())
}

/// `CREATE [UNIQUE] [NULL_FILTERED] INDEX …` after `CREATE`, in either
/// spelling (see the module docs).
fn parse_create_index(p: &mut Parser) -> Result<Statement> {
    let mut unique = false;
    let mut null_filtered = false;
    loop {
        if p.parse_keyword(Keyword::UNIQUE) {
            unique = true;
        } else if is_word(p, 0, "NULL_FILTERED") {
            p.next_token();
            null_filtered = true;
        } else {
            break;
        }
    }
    p.expect_keyword(Keyword::INDEX).map_err(syntax)?;
    if is_word(p, 0, "CONCURRENTLY") {
        p.next_token();
    }
    let if_not_exists = p.parse_keywords(&[Keyword::IF, Keyword::NOT, Keyword::EXISTS]);
    let name = if p.peek_keyword(Keyword::ON) {
        None
    } else {
        Some(object_name(&p.parse_object_name(false).map_err(syntax)?)?)
    };
    p.expect_keyword(Keyword::ON).map_err(syntax)?;
    let table = object_name(&p.parse_object_name(false).map_err(syntax)?)?;
    if p.parse_keyword(Keyword::USING) {
        let method = p.parse_identifier().map_err(syntax)?;
        if !method.value.eq_ignore_ascii_case("btree") {
            return Err(Error::Unsupported(format!(
                "index method {method} is not supported (indexes are ordered, like btree)"
            )));
        }
    }
    let columns = parse_key_list(p)?;
    if columns.is_empty() {
        return Err(Error::Syntax("an index needs at least one column".into()));
    }
    let mut storing = Vec::new();
    let mut interleave_in = None;
    loop {
        if is_word(p, 0, "STORING") || p.peek_keyword(Keyword::INCLUDE) {
            p.next_token();
            if !storing.is_empty() {
                return Err(Error::Syntax("STORING/INCLUDE given twice".into()));
            }
            p.expect_token(&Token::LParen).map_err(syntax)?;
            loop {
                storing.push(fold_ident(&p.parse_identifier().map_err(syntax)?));
                if !p.consume_token(&Token::Comma) {
                    break;
                }
            }
            p.expect_token(&Token::RParen).map_err(syntax)?;
        } else if is_word(p, 0, "INTERLEAVE")
            || (p.peek_token().token == Token::Comma && is_word(p, 1, "INTERLEAVE"))
        {
            let _ = p.consume_token(&Token::Comma);
            p.next_token();
            p.expect_keyword(Keyword::IN).map_err(syntax)?;
            if is_word(p, 0, "PARENT") {
                return Err(Error::Syntax(
                    "an index is interleaved with INTERLEAVE IN parent (without PARENT)".into(),
                ));
            }
            interleave_in = Some(object_name(&p.parse_object_name(false).map_err(syntax)?)?);
        } else if p.parse_keyword(Keyword::WHERE) {
            // PostgreSQL spelling of NULL_FILTERED: `col IS NOT NULL [AND …]`
            // for every indexed column.
            let expr = p.parse_expr().map_err(syntax)?;
            let mut filtered = Vec::new();
            null_tests(&expr, &mut filtered)?;
            let mut want: Vec<&str> = columns.iter().map(|c| c.name.as_str()).collect();
            let mut got: Vec<&str> = filtered.iter().map(|s| s.as_str()).collect();
            want.sort_unstable();
            want.dedup();
            got.sort_unstable();
            got.dedup();
            if want != got {
                return Err(Error::Unsupported(format!(
                    "the WHERE clause of an index must test every indexed column with IS NOT NULL ({})",
                    want.join(", ")
                )));
            }
            null_filtered = true;
        } else {
            break;
        }
    }
    let name = match name {
        Some(n) => n,
        None => {
            let cols: Vec<&str> = columns.iter().map(|c| c.name.as_str()).collect();
            format!("{table}_{}_idx", cols.join("_"))
        }
    };
    Ok(Statement::CreateIndex {
        def: IndexDef {
            name,
            table,
            columns,
            storing,
            unique,
            null_filtered,
            interleave_in,
        },
        if_not_exists,
    })
}

/// Collects the columns of `a IS NOT NULL AND b IS NOT NULL …`.
fn null_tests(e: &ast::Expr, out: &mut Vec<String>) -> Result<()> {
    match e {
        ast::Expr::BinaryOp {
            left,
            op: ast::BinaryOperator::And,
            right,
        } => {
            null_tests(left, out)?;
            null_tests(right, out)
        }
        ast::Expr::Nested(inner) => null_tests(inner, out),
        ast::Expr::IsNotNull(inner) => match inner.as_ref() {
            ast::Expr::Identifier(id) => {
                out.push(fold_ident(id));
                Ok(())
            }
            other => Err(Error::Unsupported(format!(
                "index WHERE clauses may only test columns with IS NOT NULL, not {other}"
            ))),
        },
        other => Err(Error::Unsupported(format!(
            "index WHERE clauses may only be `column IS NOT NULL [AND …]`, not {other}"
        ))),
    }
}

fn set_primary_key(slot: &mut Option<Vec<KeyColumn>>, keys: Vec<KeyColumn>) -> Result<()> {
    if slot.is_some() {
        return Err(Error::Syntax(
            "multiple primary keys are not allowed".into(),
        ));
    }
    if keys.is_empty() {
        return Err(Error::Syntax(
            "PRIMARY KEY needs at least one column".into(),
        ));
    }
    *slot = Some(keys);
    Ok(())
}

fn parse_key_list(p: &mut Parser) -> Result<Vec<KeyColumn>> {
    p.expect_token(&Token::LParen).map_err(syntax)?;
    let mut keys = Vec::new();
    if p.consume_token(&Token::RParen) {
        return Ok(keys);
    }
    loop {
        let name = fold_ident(&p.parse_identifier().map_err(syntax)?);
        let direction = if p.parse_keyword(Keyword::DESC) {
            Direction::Desc
        } else {
            let _ = p.parse_keyword(Keyword::ASC);
            Direction::Asc
        };
        keys.push(KeyColumn { name, direction });
        if !p.consume_token(&Token::Comma) {
            break;
        }
    }
    p.expect_token(&Token::RParen).map_err(syntax)?;
    Ok(keys)
}

/// Parses `name type [options]`; returns whether it declared PRIMARY KEY.
fn parse_column(p: &mut Parser) -> Result<(ColumnDef, bool)> {
    let name = fold_ident(&p.parse_identifier().map_err(syntax)?);
    // Spanner's PostgreSQL spelling of a commit-timestamp column.
    let mut allow_commit_timestamp = false;
    let data_type = if is_word(p, 0, "spanner")
        && p.peek_nth_token(1).token == Token::Period
        && is_word(p, 2, "commit_timestamp")
    {
        for _ in 0..3 {
            p.next_token();
        }
        allow_commit_timestamp = true;
        DataType::Timestamp
    } else {
        parse_type(p)?
    };
    let mut nullable = true;
    let mut default = None;
    let mut pk = false;
    loop {
        if p.parse_keywords(&[Keyword::NOT, Keyword::NULL]) {
            nullable = false;
        } else if p.parse_keyword(Keyword::NULL) {
            nullable = true;
        } else if p.parse_keyword(Keyword::DEFAULT) {
            let expr = p.parse_expr().map_err(syntax)?;
            default = Some(expr.to_string());
        } else if p.parse_keywords(&[Keyword::PRIMARY, Keyword::KEY]) {
            pk = true;
            nullable = false;
        } else if is_word(p, 0, "OPTIONS") {
            p.next_token();
            if let Some(allow) = parse_column_options(p, &name)? {
                allow_commit_timestamp = allow;
            }
        } else if p.peek_keyword(Keyword::UNIQUE)
            || p.peek_keyword(Keyword::REFERENCES)
            || p.peek_keyword(Keyword::CHECK)
        {
            return Err(Error::Unsupported(format!(
                "column option {} (column \"{name}\") is not supported",
                p.peek_token().token
            )));
        } else {
            break;
        }
    }
    Ok((
        ColumnDef {
            name,
            data_type,
            nullable,
            default,
            allow_commit_timestamp,
        },
        pk,
    ))
}

/// `( allow_commit_timestamp = true | false | null )` after OPTIONS (the
/// only column option Spanner has); returns the option's value, `None`
/// for an empty list. NULL resets the option to its default, false.
fn parse_column_options(p: &mut Parser, column: &str) -> Result<Option<bool>> {
    p.expect_token(&Token::LParen).map_err(syntax)?;
    if p.consume_token(&Token::RParen) {
        return Ok(None);
    }
    let option = p
        .parse_identifier()
        .map_err(syntax)?
        .value
        .to_ascii_lowercase();
    if option != "allow_commit_timestamp" {
        return Err(Error::Unsupported(format!(
            "column option \"{option}\" (column \"{column}\") is not supported; \
             allow_commit_timestamp is"
        )));
    }
    p.expect_token(&Token::Eq).map_err(syntax)?;
    let value = if p.parse_keyword(Keyword::TRUE) {
        true
    } else if p.parse_keyword(Keyword::FALSE) || p.parse_keyword(Keyword::NULL) {
        false
    } else {
        return Err(Error::Syntax(format!(
            "allow_commit_timestamp must be true, false or null, found: {}",
            p.peek_token().token
        )));
    };
    p.expect_token(&Token::RParen).map_err(syntax)?;
    Ok(Some(value))
}

/// Parses a column type in either dialect.
pub fn parse_type(p: &mut Parser) -> Result<DataType> {
    let tok = p.next_token();
    let word = match &tok.token {
        Token::Word(w) => w.value.to_ascii_lowercase(),
        other => {
            return Err(Error::Syntax(format!(
                "expected a type name, found: {other}"
            )))
        }
    };
    let ty = match word.as_str() {
        "int64" | "bigint" | "int8" | "integer" | "int" | "int4" | "smallint" | "int2"
        | "tinyint" => DataType::Int64,
        "float64" | "float8" | "float" | "real" | "float4" | "float32" => {
            skip_precision(p)?;
            DataType::Float64
        }
        "double" => {
            let _ = p.parse_keyword(Keyword::PRECISION);
            DataType::Float64
        }
        "bool" | "boolean" => DataType::Bool,
        "string" | "varchar" | "text" | "char" | "character" | "nvarchar" | "clob" => {
            if word == "character" {
                let _ = p.parse_keyword(Keyword::VARYING);
            }
            let len = parse_length(p)?;
            if word == "string"
                && len.is_none()
                && !matches!(
                    p.peek_token().token,
                    Token::Word(_) | Token::Comma | Token::RParen | Token::SemiColon | Token::EOF
                )
            {
                return Err(Error::Syntax("expected STRING(n) or STRING(MAX)".into()));
            }
            DataType::String(len)
        }
        "bytes" | "bytea" | "blob" | "binary" | "varbinary" => DataType::Bytes(parse_length(p)?),
        "date" => DataType::Date,
        "timestamp" | "timestamptz" | "datetime" => {
            skip_precision(p)?;
            if p.parse_keyword(Keyword::WITH) || p.parse_keyword(Keyword::WITHOUT) {
                p.expect_keyword(Keyword::TIME).map_err(syntax)?;
                p.expect_keyword(Keyword::ZONE).map_err(syntax)?;
            }
            DataType::Timestamp
        }
        "numeric" | "decimal" => {
            skip_precision(p)?;
            DataType::Numeric
        }
        "json" | "jsonb" => DataType::Json,
        other => return Err(Error::Syntax(format!("type \"{other}\" does not exist"))),
    };
    Ok(ty)
}

/// `(n)` or `(MAX)`; `None` means MAX or no length.
fn parse_length(p: &mut Parser) -> Result<Option<u32>> {
    if !p.consume_token(&Token::LParen) {
        return Ok(None);
    }
    let len = if is_word(p, 0, "MAX") {
        p.next_token();
        None
    } else {
        let n = p.parse_literal_uint().map_err(syntax)?;
        if n == 0 || n > spindle_catalog::MAX_VALUE_BYTES as u64 {
            return Err(Error::Syntax(format!(
                "length {n} is out of range (1..{})",
                spindle_catalog::MAX_VALUE_BYTES
            )));
        }
        Some(n as u32)
    };
    p.expect_token(&Token::RParen).map_err(syntax)?;
    Ok(len)
}

fn skip_precision(p: &mut Parser) -> Result<()> {
    if p.consume_token(&Token::LParen) {
        p.parse_literal_uint().map_err(syntax)?;
        if p.consume_token(&Token::Comma) {
            p.parse_literal_uint().map_err(syntax)?;
        }
        p.expect_token(&Token::RParen).map_err(syntax)?;
    }
    Ok(())
}

fn parse_alter_table(p: &mut Parser) -> Result<Statement> {
    let table = object_name(&p.parse_object_name(false).map_err(syntax)?)?;
    if p.parse_keyword(Keyword::ADD) {
        let constraint = is_word(p, 0, "CONSTRAINT");
        if constraint {
            // The constraint's name: Spindle names a primary key after its
            // table (`t_pkey`), as PostgreSQL does by default.
            p.next_token();
            p.parse_identifier().map_err(syntax)?;
        }
        if p.parse_keywords(&[Keyword::PRIMARY, Keyword::KEY]) {
            let columns = parse_key_list(p)?;
            if columns.is_empty() {
                return Err(Error::Syntax(
                    "PRIMARY KEY needs at least one column".into(),
                ));
            }
            return Ok(Statement::AddPrimaryKey { table, columns });
        }
        if constraint {
            return Err(Error::Unsupported(format!(
                "ALTER TABLE … ADD CONSTRAINT {} is not supported (PRIMARY KEY is; use a unique \
                 index for UNIQUE, interleaving for a parent-child rule)",
                p.peek_token().token
            )));
        }
        let _ = p.parse_keyword(Keyword::COLUMN);
        let if_not_exists = p.parse_keywords(&[Keyword::IF, Keyword::NOT, Keyword::EXISTS]);
        let (column, pk) = parse_column(p)?;
        if pk {
            return Err(Error::Unsupported("cannot add a primary key column".into()));
        }
        return Ok(Statement::AddColumn {
            table,
            column,
            if_not_exists,
        });
    }
    if p.parse_keyword(Keyword::DROP) {
        let _ = p.parse_keyword(Keyword::COLUMN);
        let if_exists = p.parse_keywords(&[Keyword::IF, Keyword::EXISTS]);
        let column = fold_ident(&p.parse_identifier().map_err(syntax)?);
        return Ok(Statement::DropColumn {
            table,
            column,
            if_exists,
        });
    }
    // `SET (row_copy = …)`: the one storage parameter that can change.
    if is_word(p, 0, "SET") && p.peek_nth_token(1).token == Token::LParen {
        p.next_token();
        let params = parameter_list(p)?;
        let Some(on) = params.row_copy else {
            return Err(Error::Unsupported(
                "ALTER TABLE … SET (…) changes row_copy only; other storage parameters mean nothing to Spindle".into(),
            ));
        };
        return Ok(Statement::SetRowCopy { table, on });
    }
    if p.parse_keyword(Keyword::ALTER) {
        let _ = p.parse_keyword(Keyword::COLUMN);
        let column = fold_ident(&p.parse_identifier().map_err(syntax)?);
        if p.parse_keyword(Keyword::SET) && is_word(p, 0, "OPTIONS") {
            p.next_token();
            let allow = parse_column_options(p, &column)?.unwrap_or(false);
            return Ok(Statement::SetColumnOptions {
                table,
                column,
                allow_commit_timestamp: allow,
            });
        }
        return Err(Error::Unsupported(format!(
            "ALTER TABLE … ALTER COLUMN {} is not supported (SET OPTIONS is)",
            p.peek_token().token
        )));
    }
    Err(Error::Unsupported(format!(
        "ALTER TABLE {} is not supported (ADD COLUMN, ADD PRIMARY KEY, DROP COLUMN, SET (row_copy = …) and ALTER COLUMN … SET OPTIONS are)",
        p.peek_token().token
    )))
}

#[cfg(test)]
mod tests {
    #[test]
    fn leading_words_skip_comments_or_give_up() {
        assert_eq!(leading_word("  copy t FROM STDIN"), Some("copy"));
        assert_eq!(
            leading_word(";\n-- note\n/* a /* nested */ one */ Deallocate x"),
            Some("Deallocate")
        );
        assert_eq!(leading_word("SELECT 1"), Some("SELECT"));
        assert_eq!(leading_word("begin;"), Some("begin"));
        for unsure in [
            "",
            "  ",
            "(SELECT 1)",
            "\"copy\" x",
            "/* open",
            "-- only a comment",
            "é",
        ] {
            assert_eq!(leading_word(unsure), None, "{unsure:?}");
        }
    }

    use super::*;

    fn create(sql: &str) -> TableDef {
        match parse(sql).unwrap().remove(0) {
            Statement::CreateTable { def, .. } => def,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn googlesql_create_table() {
        let def = create(
            "CREATE TABLE Albums (SingerId INT64 NOT NULL, AlbumId INT64 NOT NULL, AlbumTitle STRING(MAX), \
             Code STRING(10) DEFAULT ('x')) PRIMARY KEY (SingerId, AlbumId DESC), \
             INTERLEAVE IN PARENT Singers ON DELETE CASCADE",
        );
        assert_eq!(def.name, "albums");
        assert_eq!(def.columns[2].data_type, DataType::String(None));
        assert_eq!(def.columns[3].data_type, DataType::String(Some(10)));
        assert_eq!(def.columns[3].default.as_deref(), Some("('x')"));
        assert_eq!(
            def.primary_key[1],
            KeyColumn {
                name: "albumid".into(),
                direction: Direction::Desc
            }
        );
        let il = def.interleave.unwrap();
        assert_eq!(
            (il.parent.as_str(), il.kind, il.on_delete),
            ("singers", InterleaveKind::InParent, OnDelete::Cascade)
        );
    }

    #[test]
    fn postgres_create_table() {
        let def = create(
            "CREATE TABLE albums (singer_id bigint NOT NULL, album_id bigint NOT NULL, title varchar, \
             price numeric, at timestamptz, d double precision, \
             PRIMARY KEY (singer_id, album_id)) INTERLEAVE IN PARENT singers",
        );
        assert_eq!(def.primary_key.len(), 2);
        assert_eq!(def.columns[4].data_type, DataType::Timestamp);
        assert_eq!(def.columns[5].data_type, DataType::Float64);
        assert_eq!(def.interleave.unwrap().on_delete, OnDelete::NoAction);
        let def = create("CREATE TABLE t (a integer PRIMARY KEY, b text)");
        assert_eq!(def.primary_key[0].name, "a");
        let def = create("CREATE TABLE c (a INT64, b INT64) PRIMARY KEY (a, b), INTERLEAVE IN p");
        assert_eq!(def.interleave.unwrap().kind, InterleaveKind::In);
    }

    #[test]
    fn bad_ddl_is_a_syntax_error() {
        for sql in [
            "CREATE TABLE t (a INT64) PRIMARY KEY (a), INTERLEAVE PARENT p",
            "CREATE TABLE t (a WIDGET)",
            "CREATE TABLE t (a INT64) PRIMARY KEY (a) garbage",
            "CREATE TABLE t (a INT64, PRIMARY KEY (a)) PRIMARY KEY (a)",
            "CREATE TABLE t (a INT64) PRIMARY KEY (a), INTERLEAVE IN p ON DELETE CASCADE",
        ] {
            let err = parse(sql).unwrap_err();
            assert_eq!(err.sqlstate(), "42601", "{sql}: {err}");
        }
    }

    #[test]
    fn insert_or_update_and_multiple_statements() {
        let stmts =
            parse("INSERT OR UPDATE INTO t (a) VALUES (1); SELECT 1;; BEGIN; COMMIT").unwrap();
        assert!(matches!(stmts[0], Statement::Insert { upsert: true, .. }));
        assert!(matches!(stmts[1], Statement::Query(_)));
        assert!(matches!(stmts[2], Statement::Begin { read_only: false }));
        assert!(matches!(stmts[3], Statement::Commit));
    }
}
