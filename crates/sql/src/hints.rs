//! Index hints: GoogleSQL `FROM t@{FORCE_INDEX=idx}` and Spanner's
//! PostgreSQL spelling `FROM t /*@ force_index=idx */`.
//!
//! Neither survives sqlparser (the first is not SQL, the second is a
//! comment), so [`extract`] reads them off the statement text first,
//! blanking the GoogleSQL form, and [`apply`] then renames each hinted
//! table reference in the parsed statement to `"t@idx"` with alias `t`
//! (its own alias if it had one). The `public` schema resolves `t@idx` to
//! table `t` with the index forced, so the hint binds to the reference
//! and column qualifiers keep working. `FORCE_INDEX=_BASE_TABLE` forces
//! the table itself.

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{self, VisitMut};

use crate::error::{Error, Result};

/// Separates a table name from the index forced on it in a provider name.
pub const FORCE_SEPARATOR: char = '@';

/// A `FORCE_INDEX` hint: the (folded) table name it follows and the index.
#[derive(Clone, Debug, PartialEq)]
pub struct Hint {
    pub table: String,
    pub index: String,
}

/// Returns the text with GoogleSQL hints blanked, and the hints found.
pub fn extract(sql: &str) -> Result<(String, Vec<Hint>)> {
    if !sql.contains("@{") && !sql.contains("/*@") {
        return Ok((sql.to_string(), Vec::new()));
    }
    let bytes = sql.as_bytes();
    let mut out = sql.as_bytes().to_vec();
    let mut hints = Vec::new();
    let mut i = 0;
    let mut quote: Option<u8> = None;
    while i < bytes.len() {
        let b = bytes[i];
        if let Some(q) = quote {
            if b == q {
                quote = None;
            }
            i += 1;
            continue;
        }
        match b {
            b'\'' | b'"' => quote = Some(b),
            b'@' if bytes.get(i + 1) == Some(&b'{') => {
                let close = sql[i..]
                    .find('}')
                    .map(|n| i + n)
                    .ok_or_else(|| Error::Syntax("unterminated hint: missing '}'".into()))?;
                let body = &sql[i + 2..close];
                if let Some(index) = force_index(body)? {
                    if let Some(table) = name_before(sql, i) {
                        hints.push(Hint { table, index });
                    }
                }
                for o in &mut out[i..=close] {
                    *o = b' ';
                }
                i = close + 1;
                continue;
            }
            b'/' if sql[i..].starts_with("/*@") => {
                let close = sql[i..]
                    .find("*/")
                    .map(|n| i + n)
                    .ok_or_else(|| Error::Syntax("unterminated comment".into()))?;
                if let Some(index) = force_index(&sql[i + 3..close])? {
                    if let Some(table) = name_before(sql, i) {
                        hints.push(Hint { table, index });
                    }
                }
                i = close + 2;
                continue;
            }
            b'-' if sql[i..].starts_with("--") => {
                i = sql[i..].find('\n').map(|n| i + n).unwrap_or(bytes.len());
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    // Only ASCII bytes were replaced by spaces, so the text is still UTF-8.
    let text = String::from_utf8(out).map_err(|e| Error::Internal(e.to_string()))?;
    Ok((text, hints))
}

/// The index of a `FORCE_INDEX=name` entry in a comma-separated hint body.
fn force_index(body: &str) -> Result<Option<String>> {
    let mut found = None;
    for part in body.split(',') {
        let Some((k, v)) = part.split_once('=') else {
            if part.trim().is_empty() {
                continue;
            }
            return Err(Error::Syntax(format!("invalid hint: {}", part.trim())));
        };
        if k.trim().eq_ignore_ascii_case("force_index") {
            let v = v.trim();
            let name = match v.strip_prefix('"').and_then(|s| s.strip_suffix('"')) {
                Some(quoted) => quoted.to_string(),
                None => v.to_lowercase(),
            };
            if name.is_empty() {
                return Err(Error::Syntax("FORCE_INDEX needs an index name".into()));
            }
            found = Some(name);
        }
    }
    Ok(found)
}

/// The identifier that ends just before byte `at` (skipping whitespace),
/// folded like PostgreSQL; `None` at the start of the statement.
fn name_before(sql: &str, at: usize) -> Option<String> {
    let head = sql[..at].trim_end();
    if let Some(rest) = head.strip_suffix('"') {
        let start = rest.rfind('"')?;
        return Some(rest[start + 1..].to_string());
    }
    let start = head
        .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .map(|n| n + 1)
        .unwrap_or(0);
    let word = &head[start..];
    (!word.is_empty()).then(|| word.to_lowercase())
}

/// Points each hinted table reference of `stmt` at its forced index.
pub fn apply(stmt: &mut ast::Statement, hints: &[Hint]) {
    if hints.is_empty() {
        return;
    }
    let _ = stmt.visit(&mut Rename { hints });
}

struct Rename<'a> {
    hints: &'a [Hint],
}

impl ast::VisitorMut for Rename<'_> {
    type Break = ();

    fn pre_visit_table_factor(&mut self, tf: &mut ast::TableFactor) -> ControlFlow<()> {
        let ast::TableFactor::Table { name, alias, .. } = tf else {
            return ControlFlow::Continue(());
        };
        let Some(ident) = name.0.last().and_then(|p| p.as_ident()).cloned() else {
            return ControlFlow::Continue(());
        };
        let folded = crate::parser::fold_ident(&ident);
        if let Some(h) = self.hints.iter().find(|h| h.table == folded) {
            if alias.is_none() {
                *alias = Some(ast::TableAlias {
                    explicit: true,
                    name: ident,
                    columns: vec![],
                    at: None,
                });
            }
            *name = ast::ObjectName::from(vec![ast::Ident::with_quote(
                '"',
                format!("{folded}{FORCE_SEPARATOR}{}", h.index),
            )]);
        }
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_spellings_are_found_and_googlesql_is_blanked() {
        let (text, hints) =
            extract("SELECT * FROM Singers@{FORCE_INDEX=SingersByName} WHERE x = '@{'").unwrap();
        assert_eq!(
            hints,
            vec![Hint {
                table: "singers".into(),
                index: "singersbyname".into()
            }]
        );
        assert!(!text.contains("FORCE_INDEX") && text.contains("'@{'"));
        let (_, hints) = extract("SELECT 1 FROM t /*@ force_index=_base_table */ AS x").unwrap();
        assert_eq!(hints[0].table, "t");
        assert_eq!(hints[0].index, "_base_table");
        assert!(extract("SELECT * FROM t@{FORCE_INDEX=}").is_err());
        assert!(extract("SELECT * FROM t@{FORCE_INDEX=a").is_err());
    }
}
