//! Results: one [`Record`] per comparison, written as Markdown, JSON and an
//! SVG bar chart of the ratios (log scale, with the 1.0 line and each
//! target).

use std::fmt::Write;
use std::path::Path;

use serde_json::json;

use super::util::{Context, Figure, Kind, Result};

/// Spindle against one baseline in one case.
pub struct Record {
    pub workload: String,
    pub case: String,
    pub kind: Kind,
    /// Unit of the values: tps, ops/s, rows/s (throughput) or ms (latency).
    pub unit: &'static str,
    pub spindle_label: String,
    pub spindle: Figure,
    pub other_label: String,
    pub other: Figure,
    /// The issue's target for [`Record::ratio`], if it sets one.
    pub target: Option<f64>,
    pub note: String,
}

impl Record {
    /// How many times better Spindle did: throughput over the baseline's,
    /// or the baseline's latency over Spindle's (so > 1 means Spindle won).
    pub fn ratio(&self) -> f64 {
        match self.kind {
            Kind::Throughput => self.spindle.value / self.other.value,
            Kind::Latency => self.other.value / self.spindle.value,
        }
    }

    pub fn met(&self) -> Option<bool> {
        self.target.map(|t| self.ratio() >= t)
    }
}

/// What the run was: shown above the tables.
pub struct Meta {
    pub date: String,
    pub commit: String,
    pub profile: &'static str,
    pub command: String,
    pub machine: String,
    pub postgres: String,
    pub sqlite: String,
    pub settings: Vec<(String, String)>,
}

fn fmt_value(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

fn fmt_pct(f: &Figure) -> String {
    match (f.p50_us, f.p99_us) {
        (Some(a), Some(b)) => format!("{a} / {b}"),
        _ => "—".into(),
    }
}

fn fmt_fail(f: &Figure) -> String {
    match (f.failures, f.retries) {
        (Some(fl), Some(r)) => format!(" (failed {fl}, retried {r})"),
        (Some(fl), None) if fl > 0 => format!(" (failed {fl})"),
        _ => String::new(),
    }
}

/// A ratio with at least two significant digits.
pub fn fmt_ratio(r: f64) -> String {
    if !r.is_finite() || r <= 0.0 {
        return format!("{r}");
    }
    let decimals = if r >= 10.0 {
        1
    } else {
        ((-r.log10()).floor() as i64 + 2).max(2) as usize
    };
    format!("{r:.decimals$}")
}

pub fn markdown(meta: &Meta, records: &[Record]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# Spindle vs PostgreSQL vs SQLite\n");
    let _ = writeln!(s, "- date: {}", meta.date);
    let _ = writeln!(s, "- commit: {}", meta.commit);
    let _ = writeln!(s, "- build: **{}**", meta.profile);
    if meta.profile == "debug" {
        let _ = writeln!(
            s,
            "  (**debug build of the harness, so also of the embedded Spindle in workloads 3 \
             and 6: those figures are not representative**; the server's build is its binary's, below)"
        );
    }
    let _ = writeln!(s, "- command: `{}`", meta.command);
    let _ = writeln!(s, "- machine: {}", meta.machine);
    let _ = writeln!(s, "- PostgreSQL: {}", meta.postgres);
    let _ = writeln!(s, "- SQLite: {}", meta.sqlite);
    for (k, v) in &meta.settings {
        let _ = writeln!(s, "- {k}: {v}");
    }
    let _ = writeln!(
        s,
        "\nRatio = Spindle's throughput / the baseline's (latency cases: the \
         baseline's median latency / Spindle's), so above 1 Spindle is faster. \
         p50 / p99 in µs (latency cases: median / slowest of the runs).\n"
    );
    let _ = writeln!(
        s,
        "| workload | case | unit | Spindle | p50 / p99 | baseline | value | p50 / p99 | ratio | target | met |"
    );
    let _ = writeln!(s, "|---|---|---|---:|---:|---|---:|---:|---:|---:|---|");
    for r in records {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {}{} | {} | {} | {}{} | {} | **{}** | {} | {} |",
            r.workload,
            r.case,
            r.unit,
            fmt_value(r.spindle.value),
            fmt_fail(&r.spindle),
            fmt_pct(&r.spindle),
            r.other_label,
            fmt_value(r.other.value),
            fmt_fail(&r.other),
            fmt_pct(&r.other),
            fmt_ratio(r.ratio()),
            r.target
                .map(|t| format!("≥ {t}"))
                .unwrap_or_else(|| "—".into()),
            match r.met() {
                Some(true) => "met",
                Some(false) => "**not met**",
                None => "—",
            }
        );
    }
    let notes: Vec<&Record> = records.iter().filter(|r| !r.note.is_empty()).collect();
    if !notes.is_empty() {
        let _ = writeln!(s, "\nNotes:\n");
        let mut seen = std::collections::BTreeSet::new();
        for r in notes {
            if seen.insert((&r.workload, &r.note)) {
                let _ = writeln!(s, "- {}: {}", r.workload, r.note);
            }
        }
    }
    s
}

fn figure_json(f: &Figure) -> serde_json::Value {
    json!({
        "value": f.value,
        "p50_us": f.p50_us,
        "p99_us": f.p99_us,
        "ops": f.ops,
        "failures": f.failures,
        "retries": f.retries,
    })
}

pub fn json(meta: &Meta, records: &[Record]) -> serde_json::Value {
    json!({
        "date": meta.date,
        "commit": meta.commit,
        "build": meta.profile,
        "command": meta.command,
        "machine": meta.machine,
        "postgres": meta.postgres,
        "sqlite": meta.sqlite,
        "settings": meta.settings.iter().map(|(k, v)| json!({"name": k, "value": v})).collect::<Vec<_>>(),
        "results": records.iter().map(|r| json!({
            "workload": r.workload,
            "case": r.case,
            "kind": match r.kind { Kind::Throughput => "throughput", Kind::Latency => "latency" },
            "unit": r.unit,
            "spindle_label": r.spindle_label,
            "spindle": figure_json(&r.spindle),
            "baseline_label": r.other_label,
            "baseline": figure_json(&r.other),
            "ratio": r.ratio(),
            "target": r.target,
            "met": r.met(),
            "note": r.note,
        })).collect::<Vec<_>>(),
    })
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A horizontal bar per record: the ratio on a log axis, bars growing from
/// 1.0 (right: Spindle faster), a tick at the target; green met, red not
/// met, grey no target.
pub fn svg(meta: &Meta, records: &[Record]) -> String {
    let ratios: Vec<f64> = records.iter().map(|r| r.ratio().clamp(1e-4, 1e4)).collect();
    let lo = ratios
        .iter()
        .chain(records.iter().filter_map(|r| r.target.as_ref()))
        .fold(1.0f64, |a, b| a.min(*b))
        .log10()
        .floor()
        .min(-1.0);
    let hi = ratios
        .iter()
        .chain(records.iter().filter_map(|r| r.target.as_ref()))
        .fold(1.0f64, |a, b| a.max(*b))
        .log10()
        .ceil()
        .max(1.0);
    let (label_w, plot_w, row_h, top) = (430.0, 560.0, 22.0, 60.0);
    let width = label_w + plot_w + 40.0;
    let height = top + row_h * records.len() as f64 + 50.0;
    let x = |r: f64| label_w + (r.log10() - lo) / (hi - lo) * plot_w;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        s,
        r##"<rect width="100%" height="100%" fill="white"/><text x="10" y="20" font-size="15" font-weight="bold">Spindle / baseline (log scale; right of 1.0 = Spindle faster)</text><text x="10" y="40" fill="#555">{} build, {}, commit {}</text>"##,
        if meta.profile == "debug" {
            "DEBUG (not representative)"
        } else {
            meta.profile
        },
        esc(&meta.date),
        esc(&meta.commit)
    );
    let bottom = top + row_h * records.len() as f64;
    let mut p = lo as i32;
    while p <= hi as i32 {
        let xv = x(10f64.powi(p));
        let _ = writeln!(
            s,
            r##"<line x1="{xv:.1}" y1="{top}" x2="{xv:.1}" y2="{bottom}" stroke="#ddd"/><text x="{xv:.1}" y="{:.1}" text-anchor="middle" fill="#555">{}</text>"##,
            bottom + 16.0,
            10f64.powi(p)
        );
        p += 1;
    }
    for (i, (r, ratio)) in records.iter().zip(&ratios).enumerate() {
        let y = top + row_h * i as f64;
        let color = match r.met() {
            Some(true) => "#2e7d32",
            Some(false) => "#c62828",
            None => "#78909c",
        };
        let (x0, x1) = (x(1.0), x(*ratio));
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text><rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{color}"/><text x="{:.1}" y="{:.1}" fill="#333">{}</text>"##,
            label_w - 8.0,
            y + 15.0,
            esc(&format!("{}: {} vs {}", r.workload, r.case, r.other_label)),
            x0.min(x1),
            y + 4.0,
            (x1 - x0).abs().max(1.0),
            row_h - 8.0,
            x0.max(x1).max(r.target.map(x).unwrap_or(0.0)) + 4.0,
            y + 15.0,
            fmt_ratio(*ratio)
        );
        if let Some(t) = r.target {
            let xt = x(t);
            let _ = writeln!(
                s,
                r#"<line x1="{xt:.1}" y1="{:.1}" x2="{xt:.1}" y2="{:.1}" stroke="black" stroke-width="2"/>"#,
                y + 1.0,
                y + row_h - 1.0
            );
        }
    }
    let x1 = x(1.0);
    let _ = writeln!(
        s,
        r##"<line x1="{x1:.1}" y1="{:.1}" x2="{x1:.1}" y2="{bottom}" stroke="black"/><text x="{:.1}" y="{:.1}" fill="#555">bars: green target met, red not met, grey no target; black tick: target</text>"##,
        top - 4.0,
        label_w,
        bottom + 36.0
    );
    s.push_str("</svg>\n");
    s
}

pub fn write_all(dir: &Path, meta: &Meta, records: &[Record]) -> Result<()> {
    std::fs::create_dir_all(dir).ctx(format!("creating {}", dir.display()))?;
    std::fs::write(dir.join("compare.md"), markdown(meta, records)).ctx("compare.md")?;
    let j = serde_json::to_string_pretty(&json(meta, records)).ctx("json")?;
    std::fs::write(dir.join("compare.json"), j + "\n").ctx("compare.json")?;
    std::fs::write(dir.join("compare.svg"), svg(meta, records)).ctx("compare.svg")?;
    Ok(())
}
