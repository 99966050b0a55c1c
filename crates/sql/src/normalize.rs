//! Statements sent with their values written inline, run by the cached
//! plan of their parameterized form.
//!
//! A client on the simple protocol (psql, `pgbench -M simple`, most ORMs'
//! "unprepared" mode) sends every point query as a new text:
//! `… WHERE id = 17`, `… WHERE id = 42`. Keyed by text, the plan cache
//! ([`crate::plan_cache`]) would parse and plan each one afresh. Instead the
//! text's integer and string literals are replaced by parameters, and the
//! parameterized text is looked up (and planned once) like a prepared
//! statement:
//!
//! ```text
//!   SELECT v FROM kv WHERE id = 17 AND s = 'x'
//!        │ tokenize: Number "17" → $1 = INT64 17, 'x' → $2 = STRING "x"
//!        ▼
//!   SELECT v FROM kv WHERE id = $1 AND s = $2   ──▶ Parsed + fast plan (cached)
//!                                                    run with [17, "x"]
//! ```
//!
//! Invariants:
//! * Only the fast plan of the parameterized text is used, or, for a
//!   plain query, its kept template ([`crate::params`],
//!   `Session::with_templates`, from the form's second execution on). Each
//!   runs what the original text would run: the fast matchers accept a
//!   parameter only where a literal of the same value means the same (a
//!   key comparison, an inserted value, a `SET` value or delta); a
//!   template only where a scan or a slot takes it (`crate::params`),
//!   and only with a value of its placeholder's inferred type. A row
//!   count (`LIMIT 3`), a column position (`ORDER BY 2`) and a literal
//!   that is a whole select item (`SELECT 1 AS one`, whose parameter
//!   would have no type) stay in the text ([`Clauses`]). Each
//!   parameter gets exactly the value the parser gives that literal
//!   (`dml::literal_value`: an integer that fits INT64, a string).
//! * Anything else — no literal, a `$n` already in the text, a
//!   parameterized text that does not parse (`DATE '…'` became
//!   `DATE $1`) or has no fast plan, a plan that declines the values —
//!   runs the original text the usual way. The answer never depends on
//!   which way was taken; only the time does.
//! * A literal keeps its sign: `= -5` becomes `= $1` with -5, but only
//!   where the minus cannot be binary (after a comparison, `(`, `,`,
//!   `WHERE`, `AND`, …). Where the sign and the number would bind
//!   differently (`-5::text` is `-(5::text)`), the parameter is not a
//!   plain operand, which no fast plan accepts.

use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::tokenizer::{Location, Token, Tokenizer};
use spindle_keys::Value;

/// A text with its inline literals replaced by `$1 … $n`, and their values.
#[derive(Debug, PartialEq)]
pub(crate) struct Normalized {
    pub text: String,
    pub params: Vec<Value>,
}

/// The parameterized form of `sql`, or `None` when there is nothing to
/// replace or the text cannot take parameters (it already has some, or
/// does not tokenize).
pub(crate) fn normalize(sql: &str) -> Option<Normalized> {
    // A number token has a digit and a string a quote: without either
    // there is nothing to replace, and no need to tokenize (`BEGIN`,
    // `COMMIT`, every statement of a client's transaction block that
    // has no inline values).
    if !sql.bytes().any(|b| b.is_ascii_digit() || b == b'\'') {
        return None;
    }
    let dialect = PostgreSqlDialect {};
    let tokens = Tokenizer::new(&dialect, sql)
        .tokenize_with_location()
        .ok()?;
    let mut offsets = Offsets::new(sql);
    let mut text = String::with_capacity(sql.len());
    let mut params = Vec::new();
    // Byte offset of the original text copied so far.
    let mut copied = 0;
    // The last token that is not whitespace, and the position of a minus
    // sign right before the current token that may be a literal's sign.
    let mut prev: Option<&Token> = None;
    let mut minus: Option<Location> = None;
    // The token before that minus sign.
    let mut signed: Option<&Token> = None;
    let mut clauses = Clauses::default();
    let significant: Vec<_> = tokens
        .iter()
        .filter(|t| !matches!(t.token, Token::Whitespace(_)))
        .collect();
    for (i, t) in significant.iter().enumerate() {
        let next = significant.get(i + 1).map(|t| &t.token);
        let value = match &t.token {
            Token::Placeholder(_) => return None,
            Token::Number(..) if minus.is_none() && clauses.keeps_number(prev) => None,
            Token::SingleQuotedString(_) if minus.is_none() && clauses.keeps_item(prev, next) => {
                None
            }
            // A number with its sign (`SELECT -7 AS m`): the item starts
            // before the sign.
            Token::Number(..)
                if clauses.keeps_item(if minus.is_some() { signed } else { prev }, next) =>
            {
                None
            }
            Token::Number(n, false) => {
                let signed = if minus.is_some() {
                    format!("-{n}")
                } else {
                    n.clone()
                };
                signed.parse::<i64>().ok().map(Value::Int64)
            }
            Token::SingleQuotedString(s) if minus.is_none() => Some(Value::String(s.clone())),
            _ => None,
        };
        match value {
            Some(v) => {
                let start = offsets.byte(minus.unwrap_or(t.span.start))?;
                let end = offsets.byte(t.span.end)?;
                text.push_str(sql.get(copied..start)?);
                params.push(v);
                text.push('$');
                text.push_str(&params.len().to_string());
                copied = end;
                minus = None;
            }
            None => {
                minus = (t.token == Token::Minus && unary_position(prev)).then_some(t.span.start);
                signed = prev;
            }
        }
        clauses.after(prev, &t.token);
        prev = Some(&t.token);
    }
    if params.is_empty() {
        return None;
    }
    text.push_str(sql.get(copied..)?);
    Some(Normalized { text, params })
}

/// Where a literal stays in the text instead of becoming a parameter: a
/// row count (`LIMIT 3`, `OFFSET 10`, `FETCH FIRST 5 ROWS`), a column
/// ordinal (`ORDER BY 2, 1`, `GROUP BY 1`), and a literal that is a whole
/// item of a select list (`SELECT 1 AS one FROM t WHERE id = 5 LIMIT 1`,
/// an ORM's existence test). None is a value a template can take
/// (`crate::params`): a row count or an ordinal is baked into
/// DataFusion's operators, and a parameter alone in a projection has no
/// type. A text with one in a parameter would never run a template; one
/// with the literal kept runs the template of that text (a template per
/// LIMIT, each shared by every other value). Keeping a literal inline is
/// always correct; it only shares less.
#[derive(Default)]
struct Clauses {
    /// Parenthesis depth at the current token.
    depth: usize,
    /// The depth of the ORDER BY / GROUP BY list being read, if any.
    ordinals: Option<usize>,
    /// The depth of the select list being read, if any (a subquery's
    /// list ends the outer one's tracking: its later items are
    /// parameters again, which is only less sharing).
    select: Option<usize>,
}

impl Clauses {
    /// Whether a literal between `prev` and `next` is a whole item of the
    /// select list being read.
    fn keeps_item(&self, prev: Option<&Token>, next: Option<&Token>) -> bool {
        use datafusion::sql::sqlparser::keywords::Keyword;
        if self.select != Some(self.depth) {
            return false;
        }
        let starts = match prev {
            Some(Token::Comma) => true,
            Some(Token::Word(w)) => {
                w.quote_style.is_none()
                    && matches!(
                        w.keyword,
                        Keyword::SELECT | Keyword::DISTINCT | Keyword::ALL
                    )
            }
            _ => false,
        };
        let ends = match next {
            None | Some(Token::Comma | Token::SemiColon | Token::RParen) => true,
            Some(Token::Word(w)) => {
                w.quote_style.is_some()
                    || matches!(w.keyword, Keyword::AS | Keyword::FROM | Keyword::NoKeyword)
            }
            _ => false,
        };
        starts && ends
    }

    /// Whether a number after `prev` stays inline.
    fn keeps_number(&self, prev: Option<&Token>) -> bool {
        use datafusion::sql::sqlparser::keywords::Keyword;
        match prev {
            Some(Token::Word(w)) if w.quote_style.is_none() => matches!(
                w.keyword,
                Keyword::LIMIT | Keyword::OFFSET | Keyword::FIRST | Keyword::NEXT | Keyword::BY
            ),
            Some(Token::Comma) => self.ordinals == Some(self.depth),
            _ => false,
        }
    }

    /// Follows `token` (after `prev`): parentheses, and where an ORDER BY
    /// or GROUP BY list starts and ends.
    fn after(&mut self, prev: Option<&Token>, token: &Token) {
        use datafusion::sql::sqlparser::keywords::Keyword;
        match token {
            Token::LParen => self.depth += 1,
            Token::RParen => {
                self.depth = self.depth.saturating_sub(1);
                if self.ordinals.is_some_and(|d| d > self.depth) {
                    self.ordinals = None;
                }
                if self.select.is_some_and(|d| d > self.depth) {
                    self.select = None;
                }
            }
            Token::Word(w) if w.quote_style.is_none() => match w.keyword {
                Keyword::BY => {
                    let list = matches!(prev, Some(Token::Word(p))
                        if p.quote_style.is_none()
                            && matches!(p.keyword, Keyword::ORDER | Keyword::GROUP));
                    self.ordinals = list.then_some(self.depth);
                    if self.select == Some(self.depth) {
                        self.select = None;
                    }
                }
                Keyword::SELECT => self.select = Some(self.depth),
                Keyword::LIMIT
                | Keyword::OFFSET
                | Keyword::FETCH
                | Keyword::HAVING
                | Keyword::WINDOW
                | Keyword::UNION
                | Keyword::EXCEPT
                | Keyword::INTERSECT
                | Keyword::FOR
                | Keyword::FROM
                | Keyword::WHERE
                | Keyword::INTO => {
                    if self.ordinals == Some(self.depth) {
                        self.ordinals = None;
                    }
                    if self.select == Some(self.depth) {
                        self.select = None;
                    }
                }
                _ => {}
            },
            _ => {}
        }
    }
}

/// Whether a minus sign after `prev` can only be a sign: at the start, or
/// after an operator, `(`, `,` or a keyword that an operand follows.
fn unary_position(prev: Option<&Token>) -> bool {
    use datafusion::sql::sqlparser::keywords::Keyword;
    match prev {
        None => true,
        Some(
            Token::Eq
            | Token::Neq
            | Token::Lt
            | Token::Gt
            | Token::LtEq
            | Token::GtEq
            | Token::LParen
            | Token::Comma
            | Token::Plus
            | Token::Minus
            | Token::Mul
            | Token::Div
            | Token::Mod
            | Token::Caret,
        ) => true,
        Some(Token::Word(w)) => {
            w.quote_style.is_none()
                && matches!(
                    w.keyword,
                    Keyword::WHERE
                        | Keyword::AND
                        | Keyword::OR
                        | Keyword::NOT
                        | Keyword::SELECT
                        | Keyword::BETWEEN
                        | Keyword::WHEN
                        | Keyword::THEN
                        | Keyword::ELSE
                        | Keyword::ON
                        | Keyword::HAVING
                )
        }
        _ => false,
    }
}

/// Byte offsets of the tokenizer's (line, column) positions, both counted
/// from 1, columns in characters. Positions are asked for in text order, so
/// each is found by walking on from the previous one: linear in the text,
/// however many literals it has.
struct Offsets<'a> {
    sql: &'a str,
    /// Byte offset where each line starts.
    lines: Vec<usize>,
    /// The last position found: line, column, byte offset.
    last: (u64, u64, usize),
}

impl<'a> Offsets<'a> {
    fn new(sql: &'a str) -> Offsets<'a> {
        let mut lines = vec![0];
        lines.extend(sql.match_indices('\n').map(|(i, _)| i + 1));
        Offsets {
            sql,
            lines,
            last: (0, 0, 0),
        }
    }

    fn byte(&mut self, at: Location) -> Option<usize> {
        if at.column == 0 {
            return None;
        }
        let (mut column, mut byte) = if self.last.0 == at.line && self.last.1 <= at.column {
            (self.last.1, self.last.2)
        } else {
            let line = usize::try_from(at.line).ok()?.checked_sub(1)?;
            (1, *self.lines.get(line)?)
        };
        let mut chars = self.sql.get(byte..)?.chars();
        while column < at.column {
            byte += chars.next()?.len_utf8();
            column += 1;
        }
        self.last = (at.line, at.column, byte);
        Some(byte)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(sql: &str) -> Option<(String, Vec<Value>)> {
        normalize(sql).map(|n| (n.text, n.params))
    }

    #[test]
    fn literals_become_parameters() {
        // A string alone, a number alone (the texts without a digit or a
        // quote are not tokenized at all).
        assert_eq!(
            norm("DELETE FROM kv WHERE s = 'x'"),
            Some((
                "DELETE FROM kv WHERE s = $1".into(),
                vec![Value::String("x".into())]
            ))
        );
        assert_eq!(
            norm("DELETE FROM kv WHERE id=7"),
            Some(("DELETE FROM kv WHERE id=$1".into(), vec![Value::Int64(7)]))
        );
        assert_eq!(
            norm("SELECT v FROM kv WHERE id = 17 AND s = 'it''s'"),
            Some((
                "SELECT v FROM kv WHERE id = $1 AND s = $2".into(),
                vec![Value::Int64(17), Value::String("it's".into())]
            ))
        );
        assert_eq!(
            norm("INSERT INTO t VALUES (-5, 'é', 3.5)\n;"),
            Some((
                "INSERT INTO t VALUES ($1, $2, 3.5)\n;".into(),
                vec![Value::Int64(-5), Value::String("é".into())]
            ))
        );
        assert_eq!(
            norm("SELECT a FROM t WHERE -1 < a AND (-2) > b OR c IN (1, -3)"),
            Some((
                "SELECT a FROM t WHERE $1 < a AND ($2) > b OR c IN ($3, $4)".into(),
                vec![
                    Value::Int64(-1),
                    Value::Int64(-2),
                    Value::Int64(1),
                    Value::Int64(-3)
                ]
            ))
        );
        // A binary minus stays an operator; one after an operator is a sign.
        assert_eq!(
            norm("UPDATE t SET v = v - 2, w = w - -3 WHERE k = -9223372036854775808"),
            Some((
                "UPDATE t SET v = v - $1, w = w - $2 WHERE k = $3".into(),
                vec![Value::Int64(2), Value::Int64(-3), Value::Int64(i64::MIN)]
            ))
        );
        // Two minus signs: the second is the literal's.
        assert_eq!(
            norm("SELECT - -5"),
            Some(("SELECT - $1".into(), vec![Value::Int64(-5)]))
        );
        // Non-ASCII text before a literal on another line.
        assert_eq!(
            norm("SELECT x || 'ü' AS \"ä\",\n  x FROM t WHERE id=1"),
            Some((
                "SELECT x || $1 AS \"ä\",\n  x FROM t WHERE id=$2".into(),
                vec![Value::String("ü".into()), Value::Int64(1)]
            ))
        );
    }

    #[test]
    fn many_literals_over_many_lines() {
        let rows: Vec<String> = (0..300).map(|i| format!("({i}, 'é{i}')")).collect();
        let sql = format!(
            "INSERT INTO t VALUES {},\n  {}",
            rows[..150].join(", "),
            rows[150..].join(",\n ")
        );
        let n = normalize(&sql).unwrap();
        assert_eq!(n.params.len(), 600);
        assert_eq!(n.params[598], Value::Int64(299));
        assert_eq!(n.params[599], Value::String("é299".into()));
        let expect: Vec<String> = (0..300)
            .map(|i| format!("(${}, ${})", 2 * i + 1, 2 * i + 2))
            .collect();
        assert_eq!(
            n.text,
            format!(
                "INSERT INTO t VALUES {},\n  {}",
                expect[..150].join(", "),
                expect[150..].join(",\n ")
            )
        );
    }

    #[test]
    fn row_counts_and_ordinals_stay_inline() {
        assert_eq!(
            norm("SELECT o FROM t WHERE c = 7 ORDER BY a DESC LIMIT 3 OFFSET 2"),
            Some((
                "SELECT o FROM t WHERE c = $1 ORDER BY a DESC LIMIT 3 OFFSET 2".into(),
                vec![Value::Int64(7)]
            ))
        );
        assert_eq!(
            norm("SELECT a, count(*) FROM t WHERE b > 5 GROUP BY 1 ORDER BY 2, 1 FETCH FIRST 4 ROWS ONLY"),
            Some((
                "SELECT a, count(*) FROM t WHERE b > $1 GROUP BY 1 ORDER BY 2, 1 FETCH FIRST 4 ROWS ONLY".into(),
                vec![Value::Int64(5)]
            ))
        );
        // The list ends where its clause does: a number after it (in
        // HAVING, in the next query of a UNION, after a subquery's ORDER
        // BY) is a value again; one inside a call within the list stays.
        assert_eq!(
            norm("SELECT a FROM t GROUP BY a, 2 HAVING count(*) > 1"),
            Some((
                "SELECT a FROM t GROUP BY a, 2 HAVING count(*) > $1".into(),
                vec![Value::Int64(1)]
            ))
        );
        assert_eq!(
            norm("SELECT x FROM (SELECT x FROM t ORDER BY 1 LIMIT 2) AS s, u WHERE u.k IN (4, 5)"),
            Some((
                "SELECT x FROM (SELECT x FROM t ORDER BY 1 LIMIT 2) AS s, u WHERE u.k IN ($1, $2)"
                    .into(),
                vec![Value::Int64(4), Value::Int64(5)]
            ))
        );
        assert_eq!(
            norm("SELECT a FROM t ORDER BY 1 UNION SELECT b FROM u WHERE c = 6"),
            Some((
                "SELECT a FROM t ORDER BY 1 UNION SELECT b FROM u WHERE c = $1".into(),
                vec![Value::Int64(6)]
            ))
        );
        // Only ORDER and GROUP start a list of ordinals.
        assert_eq!(
            norm("SELECT a FROM t ORDER BY a, 'x'"),
            Some((
                "SELECT a FROM t ORDER BY a, $1".into(),
                vec![Value::String("x".into())]
            ))
        );
        assert_eq!(norm("SELECT a FROM t LIMIT 10"), None);
    }

    #[test]
    fn select_items_that_are_literals_stay_inline() {
        assert_eq!(
            norm("SELECT 1 AS one FROM t WHERE id = 5 LIMIT 1"),
            Some((
                "SELECT 1 AS one FROM t WHERE id = $1 LIMIT 1".into(),
                vec![Value::Int64(5)]
            ))
        );
        assert_eq!(
            norm("SELECT DISTINCT 'a', x, 2 y, x + 3, \"q\" FROM t WHERE k = 'b'"),
            Some((
                "SELECT DISTINCT 'a', x, 2 y, x + $1, \"q\" FROM t WHERE k = $2".into(),
                vec![Value::Int64(3), Value::String("b".into())]
            ))
        );
        // A subquery's list is read as its own; the outer list's items
        // after it are parameters again (less sharing, never wrong).
        assert_eq!(
            norm("SELECT (SELECT 3 FROM u), 4 FROM t WHERE a = 5"),
            Some((
                "SELECT (SELECT 3 FROM u), $1 FROM t WHERE a = $2".into(),
                vec![Value::Int64(4), Value::Int64(5)]
            ))
        );
        // Only in the select list: a value after FROM is a parameter.
        assert_eq!(
            norm("SELECT a FROM t WHERE b IN (1, 2)"),
            Some((
                "SELECT a FROM t WHERE b IN ($1, $2)".into(),
                vec![Value::Int64(1), Value::Int64(2)]
            ))
        );
        assert_eq!(norm("SELECT 1, 'x'"), None);
        // With its sign; a minus that is an operator is no sign.
        assert_eq!(
            norm("SELECT a, -7 AS m, 1 - 2 FROM t WHERE b = -3"),
            Some((
                "SELECT a, -7 AS m, $1 - $2 FROM t WHERE b = $3".into(),
                vec![Value::Int64(1), Value::Int64(2), Value::Int64(-3)]
            ))
        );
    }

    #[test]
    fn texts_left_alone() {
        // No literal, a parameter already there, a literal too large for
        // INT64 (it stays inline), no valid tokens.
        assert_eq!(norm("SELECT v FROM kv"), None);
        assert_eq!(norm("BEGIN"), None);
        assert_eq!(norm("SELECT v1 FROM t2"), None);
        assert_eq!(norm("SELECT v FROM kv WHERE id = $1 AND s = 'x'"), None);
        assert_eq!(norm("SELECT 99999999999999999999, 1.5, 1e3"), None);
        assert_eq!(norm("SELECT 'unterminated"), None);
    }
}
