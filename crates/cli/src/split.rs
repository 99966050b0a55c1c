//! Splitting SQL text into statements at top-level semicolons.
//!
//! The shell hands the engine one statement at a time so that an error in
//! one statement is reported on its own and the following statements still
//! run. A `;` ends a statement only outside of:
//!
//! * string literals `'…'` (with `''` as an escaped quote, and backslash
//!   escapes in PostgreSQL `E'…'` strings),
//! * quoted identifiers `"…"` (with `""`) and GoogleSQL's `` `…` ``,
//! * dollar-quoted strings `$tag$…$tag$` (PostgreSQL),
//! * comments `-- …` (to the end of the line) and `/* … */` (nesting, as in
//!   PostgreSQL).
//!
//! [`Splitter`] is incremental: text is pushed in pieces (lines, as they are
//! read) and complete statements come out as soon as their `;` is seen, so a
//! long script is processed in one pass without rescanning.

/// Lexical state at the scan position.
#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    Normal,
    /// Inside `'…'`; `backslash` when backslash escapes apply (`E'…'`).
    Single {
        backslash: bool,
    },
    /// Inside `"…"`.
    Double,
    /// Inside `` `…` ``.
    Backtick,
    /// Inside `-- …` up to the end of the line.
    LineComment,
    /// Inside `/* … */`, nested `depth` levels deep.
    BlockComment {
        depth: u32,
    },
    /// Inside `$tag$…$tag$`; holds the whole delimiter, e.g. `$fn$`.
    Dollar {
        tag: String,
    },
}

/// Incremental statement splitter; see the module documentation.
#[derive(Debug)]
pub struct Splitter {
    /// Text of the statement being assembled (everything after the last
    /// top-level `;`), including not yet scanned bytes at its end.
    buf: String,
    /// Bytes of `buf` before `pos` have been scanned.
    pos: usize,
    state: State,
    /// The current statement has something besides whitespace and comments.
    has_content: bool,
    /// Where in `buf` that something starts: comments and blank lines
    /// before a statement are not part of it.
    content_start: usize,
}

impl Default for Splitter {
    fn default() -> Self {
        Self::new()
    }
}

impl Splitter {
    pub fn new() -> Self {
        Splitter {
            buf: String::new(),
            pos: 0,
            state: State::Normal,
            has_content: false,
            content_start: 0,
        }
    }

    /// Appends `text` and returns the statements it completed, each without
    /// its terminating `;` and trimmed. Statements made only of whitespace
    /// and comments (e.g. a lone `;`) are dropped.
    pub fn push(&mut self, text: &str) -> Vec<String> {
        self.buf.push_str(text);
        self.scan(false)
    }

    /// True when the pending text holds no statement text: only whitespace
    /// and finished comments (a `--` comment counts as finished, since it
    /// ends with its line). Backslash commands are recognised only then.
    pub fn is_blank(&self) -> bool {
        if self.has_content {
            return false;
        }
        if !matches!(self.state, State::Normal | State::LineComment) {
            return false;
        }
        // Unscanned bytes (held back for lookahead) are blank only when
        // they are whitespace.
        self.buf[self.pos..].trim().is_empty()
    }

    /// Discards the pending text.
    pub fn clear(&mut self) {
        self.buf.clear();
        self.pos = 0;
        self.state = State::Normal;
        self.has_content = false;
        self.content_start = 0;
    }

    /// Ends the input: returns the statements still pending, including an
    /// unterminated last one if it has any content (a statement need not
    /// end with `;` at the end of input).
    pub fn finish(&mut self) -> Vec<String> {
        // Only held-back lookahead characters are scanned here; none of
        // them can complete a statement, but nothing is lost if one did.
        let mut statements = self.scan(true);
        if self.has_content {
            let rest = self.buf[self.content_start..].trim();
            if !rest.is_empty() {
                statements.push(rest.to_string());
            }
        }
        self.clear();
        statements
    }

    /// Scans as far as possible. Without `eof`, a character whose meaning
    /// depends on the next one (`-`, `/`, `*`, `$`) at the very end of the
    /// buffer is left unscanned until more text arrives.
    fn scan(&mut self, eof: bool) -> Vec<String> {
        let mut out = Vec::new();
        let mut i = self.pos;
        // Start of the current statement within `buf` (after a drain it is 0).
        let mut start = 0;
        loop {
            let b = self.buf.as_bytes();
            let Some(&c) = b.get(i) else { break };
            let next = b.get(i + 1).copied();
            let need_lookahead = next.is_none() && !eof;
            match &mut self.state {
                State::Normal => match c {
                    b'-' | b'/' if need_lookahead => break,
                    b'-' if next == Some(b'-') => {
                        self.state = State::LineComment;
                        i += 2;
                        continue;
                    }
                    b'/' if next == Some(b'*') => {
                        self.state = State::BlockComment { depth: 1 };
                        i += 2;
                        continue;
                    }
                    b'\'' => {
                        mark_content(&mut self.has_content, &mut self.content_start, i);
                        let backslash = is_escape_string_prefix(b, i);
                        self.state = State::Single { backslash };
                    }
                    b'"' => {
                        mark_content(&mut self.has_content, &mut self.content_start, i);
                        self.state = State::Double;
                    }
                    b'`' => {
                        mark_content(&mut self.has_content, &mut self.content_start, i);
                        self.state = State::Backtick;
                    }
                    b'$' => {
                        mark_content(&mut self.has_content, &mut self.content_start, i);
                        let preceded_by_ident = i > 0 && is_ident_byte(b[i - 1]);
                        if !preceded_by_ident {
                            match dollar_tag(b, i) {
                                DollarTag::Tag(len) => {
                                    let tag = self.buf[i..i + len].to_string();
                                    self.state = State::Dollar { tag };
                                    i += len;
                                    continue;
                                }
                                DollarTag::NeedMore if !eof => break,
                                DollarTag::NeedMore | DollarTag::NotATag => {}
                            }
                        }
                    }
                    b';' => {
                        if self.has_content {
                            out.push(self.buf[self.content_start..i].trim().to_string());
                        }
                        self.has_content = false;
                        start = i + 1;
                    }
                    c if c.is_ascii_whitespace() => {}
                    _ => mark_content(&mut self.has_content, &mut self.content_start, i),
                },
                State::Single { backslash } => match c {
                    b'\\' if *backslash => {
                        if need_lookahead {
                            break;
                        }
                        i += 2;
                        continue;
                    }
                    b'\'' => {
                        if need_lookahead {
                            break;
                        }
                        if next == Some(b'\'') {
                            i += 2;
                            continue;
                        }
                        self.state = State::Normal;
                    }
                    _ => {}
                },
                State::Double => {
                    if c == b'"' {
                        if need_lookahead {
                            break;
                        }
                        if next == Some(b'"') {
                            i += 2;
                            continue;
                        }
                        self.state = State::Normal;
                    }
                }
                State::Backtick => {
                    if c == b'`' {
                        self.state = State::Normal;
                    }
                }
                State::LineComment => {
                    if c == b'\n' {
                        self.state = State::Normal;
                    }
                }
                State::BlockComment { depth } => match c {
                    b'/' | b'*' if need_lookahead => break,
                    b'/' if next == Some(b'*') => {
                        *depth += 1;
                        i += 2;
                        continue;
                    }
                    b'*' if next == Some(b'/') => {
                        *depth -= 1;
                        if *depth == 0 {
                            self.state = State::Normal;
                        }
                        i += 2;
                        continue;
                    }
                    _ => {}
                },
                State::Dollar { tag } => {
                    if c == b'$' {
                        let rest = &b[i..];
                        if rest.starts_with(tag.as_bytes()) {
                            i += tag.len();
                            self.state = State::Normal;
                            continue;
                        }
                        if !eof && tag.as_bytes().starts_with(rest) {
                            // Possibly the closing tag, cut off.
                            break;
                        }
                    }
                }
            }
            i += 1;
        }
        // Keep only the current statement's text.
        self.buf.drain(..start);
        self.pos = i - start;
        self.content_start = self.content_start.saturating_sub(start);
        out
    }
}

/// Notes statement text at `i`: the first such position of a statement is
/// where it starts. (A free function so that it borrows only the two fields
/// while the scan holds the buffer.)
fn mark_content(has_content: &mut bool, content_start: &mut usize, i: usize) {
    if !*has_content {
        *has_content = true;
        *content_start = i;
    }
}

/// Splits a complete text (a `-c` argument, a file) into its statements,
/// including a last one without a terminating `;`.
#[cfg(test)]
pub fn split_statements(text: &str) -> Vec<String> {
    let mut splitter = Splitter::new();
    let mut statements = splitter.push(text);
    statements.extend(splitter.finish());
    statements
}

/// Whether the quote at `i` opens a PostgreSQL escape string `E'…'`: it is
/// preceded by `E`/`e` that does not end a longer identifier.
fn is_escape_string_prefix(b: &[u8], i: usize) -> bool {
    if i == 0 || !matches!(b[i - 1], b'E' | b'e') {
        return false;
    }
    i < 2 || !is_ident_byte(b[i - 2])
}

fn is_ident_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'$' || c >= 0x80
}

enum DollarTag {
    /// A delimiter of this many bytes starts at the position.
    Tag(usize),
    /// Not a delimiter (a parameter `$1`, or a stray `$`).
    NotATag,
    /// The text ends before it is decided.
    NeedMore,
}

/// Recognises a dollar-quote delimiter `$tag$` (tag: identifier characters
/// not starting with a digit, possibly empty) starting at `b[i] == '$'`.
fn dollar_tag(b: &[u8], i: usize) -> DollarTag {
    let mut j = i + 1;
    loop {
        match b.get(j) {
            None => return DollarTag::NeedMore,
            Some(b'$') => return DollarTag::Tag(j + 1 - i),
            Some(&c) if c.is_ascii_digit() && j == i + 1 => return DollarTag::NotATag,
            Some(&c) if c.is_ascii_alphanumeric() || c == b'_' || c >= 0x80 => j += 1,
            Some(_) => return DollarTag::NotATag,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_simple_statements() {
        assert_eq!(
            split_statements("SELECT 1; SELECT 2;\nSELECT 3"),
            vec!["SELECT 1", "SELECT 2", "SELECT 3"]
        );
        assert_eq!(split_statements("  ;;  ; "), Vec::<String>::new());
        assert_eq!(split_statements(""), Vec::<String>::new());
    }

    #[test]
    fn semicolons_in_strings_do_not_split() {
        assert_eq!(
            split_statements("INSERT INTO t VALUES ('a;b', 'it''s;'); SELECT ';'"),
            vec!["INSERT INTO t VALUES ('a;b', 'it''s;')", "SELECT ';'"]
        );
        // E'' strings take backslash escapes; plain strings do not.
        assert_eq!(
            split_statements(r"SELECT E'x\';y'; SELECT 'a\'; SELECT 2"),
            vec![r"SELECT E'x\';y'", r"SELECT 'a\'", "SELECT 2"]
        );
        // An identifier ending in e is not an E prefix.
        assert_eq!(
            split_statements(r"SELECT name'\'; SELECT 2"),
            vec![r"SELECT name'\'", "SELECT 2"]
        );
    }

    #[test]
    fn semicolons_in_quoted_identifiers_do_not_split() {
        assert_eq!(
            split_statements(r#"SELECT "a;""b" FROM `x;y`; SELECT 2"#),
            vec![r#"SELECT "a;""b" FROM `x;y`"#, "SELECT 2"]
        );
    }

    #[test]
    fn semicolons_in_comments_do_not_split() {
        assert_eq!(
            split_statements("SELECT 1 -- a; b\n, 2; SELECT /* x; /* nested; */ y; */ 3;"),
            vec![
                "SELECT 1 -- a; b\n, 2",
                "SELECT /* x; /* nested; */ y; */ 3"
            ]
        );
        // Comment-only statements are dropped.
        assert_eq!(
            split_statements("-- only a comment;\n/* and ; this */;\nSELECT 1;"),
            vec!["SELECT 1"]
        );
    }

    #[test]
    fn dollar_quotes() {
        assert_eq!(
            split_statements("SELECT $$a;b$$; SELECT $fn$ $$; $fn$; SELECT $1;"),
            vec!["SELECT $$a;b$$", "SELECT $fn$ $$; $fn$", "SELECT $1"]
        );
    }

    #[test]
    fn minus_and_slash_operators() {
        assert_eq!(
            split_statements("SELECT 4-1; SELECT 4/2; SELECT 2*3"),
            vec!["SELECT 4-1", "SELECT 4/2", "SELECT 2*3"]
        );
    }

    #[test]
    fn incremental_pushes_match_one_push() {
        let text = "INSERT INTO t VALUES ('a;\nb'); -- c;\nSELECT /* ;\n */ 1-\n-1;\nSELECT $x$;$\n$x$;\nSELECT \"q;\"\"\";";
        let whole = split_statements(text);
        // Byte by byte (all cut points, including inside `--`, `/*`, `$x$`, `""`).
        let mut sp = Splitter::new();
        let mut pieces = Vec::new();
        for ch in text.chars() {
            pieces.extend(sp.push(&ch.to_string()));
        }
        pieces.extend(sp.finish());
        assert_eq!(pieces, whole);
        assert_eq!(whole.len(), 4, "{whole:?}");
    }

    #[test]
    fn blank_tracking() {
        let mut sp = Splitter::new();
        assert!(sp.is_blank());
        sp.push("-- comment\n");
        assert!(sp.is_blank());
        sp.push("/* open");
        assert!(!sp.is_blank());
        sp.push(" */\n");
        assert!(sp.is_blank());
        sp.push("SELECT\n");
        assert!(!sp.is_blank());
        assert_eq!(sp.push("1;\n"), vec!["SELECT\n1"]);
        assert!(sp.is_blank());
        sp.push("SELECT 'open;\n");
        assert!(!sp.is_blank());
        assert_eq!(sp.finish(), vec!["SELECT 'open;"]);
        assert!(sp.is_blank());
    }
}
