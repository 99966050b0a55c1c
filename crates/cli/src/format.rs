//! Rendering query results as text, in the style of psql's default
//! `aligned` format.
//!
//! ```text
//!  singer_id |  name
//! -----------+--------
//!          1 | Marc
//!          2 | Catalina
//! (2 rows)
//! ```
//!
//! Values are rendered the way PostgreSQL's text output does: NULL as an
//! empty cell, BOOL as `t`/`f`, FLOAT64 as the shortest text that reads back
//! as the same number, BYTES as `\x` and hex digits, DATE as `YYYY-MM-DD`,
//! TIMESTAMP as `YYYY-MM-DD HH:MM:SS[.ffffff]+00` (UTC). Numbers are aligned
//! right, everything else left; a cell holding line breaks spans several
//! lines, each but the last marked with `+`. Trailing spaces are trimmed.

use spindle::{Rows, Value};
use unicode_width::UnicodeWidthStr;

/// A table of already formatted cells.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grid {
    pub headers: Vec<String>,
    pub rows: Vec<Vec<String>>,
    /// Per column: align right (numbers) instead of left.
    pub right_align: Vec<bool>,
}

impl Grid {
    /// Formats every value of `rows`. A column is right-aligned when all of
    /// its non-NULL values are numbers.
    pub fn from_rows(rows: &Rows) -> spindle::Result<Grid> {
        let headers = rows.column_names();
        let mut right_align = vec![true; headers.len()];
        let mut cells = Vec::with_capacity(rows.num_rows());
        for row in rows.rows()? {
            let values = row.values();
            let mut line = Vec::with_capacity(headers.len());
            for (i, value) in values.iter().enumerate() {
                if let Some(right) = right_align.get_mut(i) {
                    *right &= is_number(value);
                }
                line.push(format_value(value));
            }
            cells.push(line);
        }
        Ok(Grid {
            headers,
            rows: cells,
            right_align,
        })
    }
}

fn is_number(v: &Value) -> bool {
    matches!(
        v,
        Value::Null | Value::Int64(_) | Value::Float64(_) | Value::Numeric(_)
    )
}

/// Formats rows as an aligned table followed by the row count line.
pub fn render_rows(rows: &Rows) -> spindle::Result<String> {
    Ok(render_grid(&Grid::from_rows(rows)?))
}

/// The `(N rows)` line.
pub fn row_count(n: usize) -> String {
    if n == 1 {
        "(1 row)".to_string()
    } else {
        format!("({n} rows)")
    }
}

/// Renders a grid: header line, separator line, rows, `(N rows)`, each line
/// ending in `\n`.
pub fn render_grid(grid: &Grid) -> String {
    let ncols = grid
        .headers
        .len()
        .max(grid.rows.iter().map(Vec::len).max().unwrap_or(0));
    let cell = |row: &Vec<String>, j: usize| -> String { row.get(j).cloned().unwrap_or_default() };

    // Column widths over every line of every cell, header included.
    let mut widths = vec![0usize; ncols];
    for (j, width) in widths.iter_mut().enumerate() {
        let header = grid.headers.get(j).map(String::as_str).unwrap_or("");
        *width = max_line_width(header);
        for row in &grid.rows {
            *width = (*width).max(max_line_width(&cell(row, j)));
        }
    }

    let mut out = String::new();
    // Header: names centred, as psql does.
    let headers: Vec<String> = (0..ncols).map(|j| cell(&grid.headers, j)).collect();
    render_record(&mut out, &headers, &widths, |_| Align::Center);

    // Separator.
    let separator: Vec<String> = widths.iter().map(|w| "-".repeat(w + 2)).collect();
    out.push_str(&separator.join("+"));
    out.push('\n');

    for row in &grid.rows {
        let cells: Vec<String> = (0..ncols).map(|j| cell(row, j)).collect();
        render_record(&mut out, &cells, &widths, |j| {
            if grid.right_align.get(j).copied().unwrap_or(false) {
                Align::Right
            } else {
                Align::Left
            }
        });
    }
    out.push_str(&row_count(grid.rows.len()));
    out.push('\n');
    out
}

#[derive(Clone, Copy)]
enum Align {
    Left,
    Right,
    Center,
}

/// Renders one header or data record, which spans as many lines as its
/// tallest cell.
fn render_record(
    out: &mut String,
    cells: &[String],
    widths: &[usize],
    align: impl Fn(usize) -> Align,
) {
    let split: Vec<Vec<&str>> = cells.iter().map(|c| c.split('\n').collect()).collect();
    let height = split.iter().map(Vec::len).max().unwrap_or(1).max(1);
    for k in 0..height {
        let mut line = String::new();
        for (j, lines) in split.iter().enumerate() {
            if j > 0 {
                line.push('|');
            }
            line.push(' ');
            let text = lines.get(k).copied().unwrap_or("");
            let width = widths.get(j).copied().unwrap_or(0);
            let pad = width.saturating_sub(display_width(text));
            let (left, right) = match align(j) {
                Align::Left => (0, pad),
                Align::Right => (pad, 0),
                Align::Center => (pad / 2, pad - pad / 2),
            };
            push_spaces(&mut line, left);
            line.push_str(text);
            push_spaces(&mut line, right);
            // `+` marks a cell continuing on the next line.
            line.push(if k + 1 < lines.len() { '+' } else { ' ' });
        }
        out.push_str(line.trim_end_matches(' '));
        out.push('\n');
    }
}

fn push_spaces(s: &mut String, n: usize) {
    s.extend(std::iter::repeat_n(' ', n));
}

fn display_width(s: &str) -> usize {
    UnicodeWidthStr::width(s)
}

fn max_line_width(s: &str) -> usize {
    s.split('\n').map(display_width).max().unwrap_or(0)
}

/// Formats one value as PostgreSQL's text output would.
pub fn format_value(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::Int64(i) => i.to_string(),
        Value::Float64(f) => format_float(*f),
        Value::Bool(b) => if *b { "t" } else { "f" }.to_string(),
        Value::String(s) | Value::Json(s) => s.clone(),
        Value::Bytes(b) => format_bytes(b),
        Value::Date(d) => format_date(*d),
        Value::Timestamp(t) => format_timestamp(*t),
        Value::Numeric(n) => spindle_keys::value::format_numeric(*n),
    }
}

/// Shortest round-trip text of a double, laid out like PostgreSQL's
/// `float8out`: plain notation for decimal exponents -4 ..= 14, otherwise
/// `d.ddde±XX`; `NaN`, `Infinity`, `-Infinity`, `-0`.
pub fn format_float(f: f64) -> String {
    // The wire server's float8 text (extra_float_digits = 1), one
    // implementation for both.
    spindle_server::types::float_text(f, 15)
}

/// `\x` followed by two lowercase hex digits per byte (PostgreSQL's `hex`
/// bytea output).
pub fn format_bytes(b: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(2 + 2 * b.len());
    s.push_str("\\x");
    for byte in b {
        s.push(HEX[(byte >> 4) as usize] as char);
        s.push(HEX[(byte & 0xf) as usize] as char);
    }
    s
}

/// Converts days since 1970-01-01 to a proleptic Gregorian (year, month,
/// day) (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11]
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32; // [1, 31]
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32; // [1, 12]
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// `YYYY-MM-DD` and, for years before 1 AD, the ` BC` suffix PostgreSQL
/// uses (there is no year 0: year 0 is 1 BC).
fn format_ymd(days: i64) -> (String, &'static str) {
    let (year, month, day) = civil_from_days(days);
    let (year, era) = if year <= 0 {
        (1 - year, " BC")
    } else {
        (year, "")
    };
    (format!("{year:04}-{month:02}-{day:02}"), era)
}

/// Formats days since the epoch as `YYYY-MM-DD`.
pub fn format_date(days: i32) -> String {
    let (ymd, era) = format_ymd(i64::from(days));
    format!("{ymd}{era}")
}

/// Formats microseconds since the epoch (UTC) as
/// `YYYY-MM-DD HH:MM:SS[.ffffff]+00`, fractional digits without trailing
/// zeros, as PostgreSQL prints a `timestamptz` in time zone UTC.
pub fn format_timestamp(micros: i64) -> String {
    const MICROS_PER_DAY: i64 = 86_400_000_000;
    let days = micros.div_euclid(MICROS_PER_DAY);
    let rem = micros.rem_euclid(MICROS_PER_DAY);
    let secs = rem / 1_000_000;
    let frac = rem % 1_000_000;
    let (ymd, era) = format_ymd(days);
    let mut s = format!(
        "{ymd} {:02}:{:02}:{:02}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    );
    if frac != 0 {
        let digits = format!("{frac:06}");
        s.push('.');
        s.push_str(digits.trim_end_matches('0'));
    }
    s.push_str("+00");
    s.push_str(era);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grid(headers: &[&str], rows: &[&[&str]], right: &[bool]) -> Grid {
        Grid {
            headers: headers.iter().map(|s| s.to_string()).collect(),
            rows: rows
                .iter()
                .map(|r| r.iter().map(|s| s.to_string()).collect())
                .collect(),
            right_align: right.to_vec(),
        }
    }

    #[test]
    fn renders_aligned_table() {
        let g = grid(
            &["singer_id", "name"],
            &[&["1", "Marc"], &["22", "Catalina"], &["3", ""]],
            &[true, false],
        );
        let expected = [
            " singer_id |   name",
            "-----------+----------",
            "         1 | Marc",
            "        22 | Catalina",
            "         3 |",
            "(3 rows)\n",
        ]
        .join("\n");
        assert_eq!(render_grid(&g), expected);
    }

    #[test]
    fn renders_single_row_and_empty_results() {
        let one = grid(&["x"], &[&["hello"]], &[false]);
        assert_eq!(render_grid(&one), "   x\n-------\n hello\n(1 row)\n");
        let none = grid(&["a", "bb"], &[], &[true, false]);
        assert_eq!(render_grid(&none), " a | bb\n---+----\n(0 rows)\n");
    }

    #[test]
    fn multi_line_and_wide_cells() {
        let g = grid(&["a", "b"], &[&["x\nyy", "日本"]], &[false, false]);
        let expected = [
            " a  |  b",
            "----+------",
            " x +| 日本",
            " yy |",
            "(1 row)\n",
        ]
        .join("\n");
        assert_eq!(render_grid(&g), expected);
    }

    #[test]
    fn formats_scalars() {
        assert_eq!(format_value(&Value::Null), "");
        assert_eq!(format_value(&Value::Int64(-42)), "-42");
        assert_eq!(format_value(&Value::Bool(true)), "t");
        assert_eq!(format_value(&Value::Bool(false)), "f");
        assert_eq!(format_value(&Value::String("a b".into())), "a b");
        assert_eq!(
            format_value(&Value::Json("{\"a\": 1}".into())),
            "{\"a\": 1}"
        );
        assert_eq!(
            format_value(&Value::Bytes(vec![0, 0xab, 0x10])),
            "\\x00ab10"
        );
        assert_eq!(format_value(&Value::Bytes(vec![])), "\\x");
        assert_eq!(format_value(&Value::Numeric(12_500_000_000)), "12.5");
        assert_eq!(format_value(&Value::Numeric(-1)), "-0.000000001");
    }

    #[test]
    fn formats_floats_like_postgres() {
        let cases: &[(f64, &str)] = &[
            (0.0, "0"),
            (-0.0, "-0"),
            (1.0, "1"),
            (-2.5, "-2.5"),
            (0.1, "0.1"),
            (1.0 / 3.0, "0.3333333333333333"),
            (100.0, "100"),
            (123456789012345.0, "123456789012345"),
            (1e15, "1e+15"),
            (1.5e300, "1.5e+300"),
            (0.0001, "0.0001"),
            (0.00012, "0.00012"),
            (0.00001, "1e-05"),
            (-1.25e-7, "-1.25e-07"),
            (f64::NAN, "NaN"),
            (f64::INFINITY, "Infinity"),
            (f64::NEG_INFINITY, "-Infinity"),
            (f64::MAX, "1.7976931348623157e+308"),
            (5e-324, "5e-324"),
        ];
        for (f, s) in cases {
            assert_eq!(format_float(*f), *s, "{f:?}");
            if f.is_finite() {
                assert_eq!(s.parse::<f64>().ok(), Some(*f), "round trip of {s}");
            }
        }
    }

    #[test]
    fn formats_dates() {
        assert_eq!(format_date(0), "1970-01-01");
        assert_eq!(format_date(-1), "1969-12-31");
        assert_eq!(format_date(11_016), "2000-02-29");
        assert_eq!(format_date(19_723), "2024-01-01");
        assert_eq!(format_date(2_932_896), "9999-12-31");
        // 0001-01-01 and the day before it (1 BC, a leap year).
        assert_eq!(format_date(-719_162), "0001-01-01");
        assert_eq!(format_date(-719_163), "0001-12-31 BC");
    }

    #[test]
    fn formats_timestamps() {
        assert_eq!(format_timestamp(0), "1970-01-01 00:00:00+00");
        assert_eq!(format_timestamp(-1), "1969-12-31 23:59:59.999999+00");
        assert_eq!(
            format_timestamp(1_704_112_245_500_000),
            "2024-01-01 12:30:45.5+00"
        );
        assert_eq!(
            format_timestamp(1_704_112_245_000_123),
            "2024-01-01 12:30:45.000123+00"
        );
    }
}
