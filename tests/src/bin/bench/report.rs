//! Turning runs into the report: each figure's median over its runs with the min–max beside it,
//! the target and whether the median meets it, and the same in JSON with every run's raw values
//! and details.
//!
//! Medians, because on a shared two-core machine one run can be disturbed by something else
//! (a compaction, a page-cache flush); the median of three ignores one such run where a mean
//! would not, and the min–max shows how much the runs disagreed.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::{Value, json};

/// What one run of a figure group measured: values that feed the table (by metric key), and
/// details kept only in the JSON.
#[derive(Debug, Default)]
pub(crate) struct RunRecord {
    pub values: BTreeMap<String, f64>,
    pub details: serde_json::Map<String, Value>,
}

impl RunRecord {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    pub(crate) fn value(mut self, key: &str, value: f64) -> Self {
        self.values.insert(key.to_string(), value);
        self
    }

    pub(crate) fn detail(mut self, key: &str, value: Value) -> Self {
        self.details.insert(key.to_string(), value);
        self
    }

    /// Cores busy per process during the measured window.
    pub(crate) fn cpu(self, cores: BTreeMap<String, f64>) -> Self {
        self.detail("cpu_cores", json!(cores))
    }

    fn to_json(&self) -> Value {
        json!({ "values": self.values, "details": self.details })
    }
}

/// How a figure group ended.
#[derive(Debug)]
pub(crate) enum GroupStatus {
    Done,
    /// Not run, for a reason that is not a failure (e.g. memory with central on MS SQL, see
    /// `Backend::unsupported`).
    Skipped(String),
    /// A run failed: the message names the step.
    Failed(String),
}

/// All runs of one figure group.
#[derive(Debug)]
pub(crate) struct GroupResult {
    pub name: &'static str,
    pub runs: Vec<RunRecord>,
    pub status: GroupStatus,
    pub seconds: f64,
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum Target {
    AtLeast(f64),
    AtMost(f64),
}

impl Target {
    fn met(self, value: f64) -> bool {
        match self {
            Target::AtLeast(t) => value >= t,
            Target::AtMost(t) => value <= t,
        }
    }

    fn describe(self, unit: &str) -> String {
        match self {
            Target::AtLeast(t) => format!(">= {} {unit}", number(t)),
            Target::AtMost(t) => format!("<= {} {unit}", number(t)),
        }
    }

    fn to_json(self) -> Value {
        match self {
            Target::AtLeast(t) => json!({ "at_least": t }),
            Target::AtMost(t) => json!({ "at_most": t }),
        }
    }
}

/// One row of the table.
#[derive(Debug, Clone)]
pub(crate) struct Metric {
    pub key: &'static str,
    pub label: String,
    pub unit: &'static str,
    pub target: Option<Target>,
}

/// The median and spread of one metric over its runs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

fn summarise(values: &[f64]) -> Option<Summary> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    let median = match n {
        0 => return None,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    };
    Some(Summary {
        median,
        min: sorted[0],
        max: sorted[n - 1],
    })
}

/// Values of `key` over every run of every group.
fn values_of(groups: &[GroupResult], key: &str) -> Vec<f64> {
    groups
        .iter()
        .flat_map(|g| g.runs.iter())
        .filter_map(|run| run.values.get(key).copied())
        .collect()
}

fn summary_of(groups: &[GroupResult], key: &str) -> Option<Summary> {
    summarise(&values_of(groups, key))
}

/// Cores used by processes other than the bench and the services, in any run of a figure,
/// above which the report warns that the figure was disturbed. Kernel threads and the odd
/// daemon stay far below it.
const DISTURBED_CORES: f64 = 0.2;

/// The printed report.
pub(crate) fn render(metrics: &[Metric], groups: &[GroupResult]) -> String {
    let mut out = String::new();
    let rows: Vec<[String; 5]> = metrics
        .iter()
        .map(|m| {
            let target = m
                .target
                .map(|t| t.describe(m.unit))
                .unwrap_or_else(|| "-".into());
            match summary_of(groups, m.key) {
                Some(s) => [
                    m.label.clone(),
                    target,
                    format!("{} {}", number(s.median), m.unit),
                    format!("{} – {}", number(s.min), number(s.max)),
                    match m.target {
                        Some(t) if t.met(s.median) => "yes".into(),
                        Some(_) => "NO".into(),
                        None => "-".into(),
                    },
                ],
                None => [
                    m.label.clone(),
                    target,
                    "not run".into(),
                    String::new(),
                    String::new(),
                ],
            }
        })
        .collect();
    table(
        &mut out,
        ["figure", "target", "median", "min – max", "met"],
        &rows,
    );

    let cpu: Vec<[String; 2]> = groups
        .iter()
        .filter_map(|g| {
            let mut sums: BTreeMap<String, (f64, usize)> = BTreeMap::new();
            for run in &g.runs {
                if let Some(Value::Object(cores)) = run.details.get("cpu_cores") {
                    for (process, value) in cores {
                        let entry = sums.entry(process.clone()).or_default();
                        entry.0 += value.as_f64().unwrap_or(0.0);
                        entry.1 += 1;
                    }
                }
            }
            (!sums.is_empty()).then(|| {
                let split = sums
                    .iter()
                    .map(|(p, (sum, n))| format!("{p} {:.2}", sum / *n as f64))
                    .collect::<Vec<_>>()
                    .join(", ");
                [g.name.to_string(), split]
            })
        })
        .collect();
    if !cpu.is_empty() {
        out.push('\n');
        table(
            &mut out,
            [
                "cores busy while measuring (mean of runs)",
                "per process (bench = load generator + SMTP sink)",
            ],
            &cpu,
        );
    }

    // Something else busy on the machine while a figure was measured makes it unreliable.
    let disturbed: Vec<String> = groups
        .iter()
        .filter_map(|g| {
            let worst = g
                .runs
                .iter()
                .filter_map(|run| run.details.get("cpu_cores")?.get("other")?.as_f64())
                .fold(0.0, f64::max);
            (worst > DISTURBED_CORES).then(|| format!("{} ({worst:.2} cores)", g.name))
        })
        .collect();
    if !disturbed.is_empty() {
        let _ = writeln!(
            out,
            "\nWARNING: other processes were busy while measuring: {}. Rerun on a quiet machine.",
            disturbed.join(", ")
        );
    }

    let problems: Vec<String> = groups
        .iter()
        .filter_map(|g| match &g.status {
            GroupStatus::Done => None,
            GroupStatus::Skipped(why) => Some(format!("{}: skipped: {why}", g.name)),
            GroupStatus::Failed(why) => Some(format!("{}: FAILED: {why}", g.name)),
        })
        .collect();
    if !problems.is_empty() {
        out.push('\n');
        for p in problems {
            let _ = writeln!(out, "{p}");
        }
    }
    out
}

/// The JSON document: `header` (machine, settings, configs) plus figures and every run.
pub(crate) fn to_json(mut header: Value, metrics: &[Metric], groups: &[GroupResult]) -> Value {
    let figures: Vec<Value> = metrics
        .iter()
        .map(|m| {
            let values = values_of(groups, m.key);
            let summary = summarise(&values);
            json!({
                "key": m.key,
                "label": m.label,
                "unit": m.unit,
                "target": m.target.map(Target::to_json),
                "median": summary.map(|s| s.median),
                "min": summary.map(|s| s.min),
                "max": summary.map(|s| s.max),
                "runs": values,
                "met": match (m.target, summary) {
                    (Some(t), Some(s)) => Some(t.met(s.median)),
                    _ => None,
                },
            })
        })
        .collect();
    let group_json: serde_json::Map<String, Value> = groups
        .iter()
        .map(|g| {
            let (status, message) = match &g.status {
                GroupStatus::Done => ("done", None),
                GroupStatus::Skipped(m) => ("skipped", Some(m.clone())),
                GroupStatus::Failed(m) => ("failed", Some(m.clone())),
            };
            (
                g.name.to_string(),
                json!({
                    "status": status,
                    "message": message,
                    "seconds": g.seconds,
                    "runs": g.runs.iter().map(RunRecord::to_json).collect::<Vec<_>>(),
                }),
            )
        })
        .collect();
    if let Value::Object(map) = &mut header {
        map.insert("figures".into(), Value::Array(figures));
        map.insert("groups".into(), Value::Object(group_json));
    }
    header
}

/// A number for people: thousands separated, at most 3 significant decimals for small values.
pub(crate) fn number(value: f64) -> String {
    if !value.is_finite() {
        return value.to_string();
    }
    if value.abs() >= 100.0 {
        let rounded = value.round() as i64;
        let digits = rounded.unsigned_abs().to_string();
        let mut grouped = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i).is_multiple_of(3) {
                grouped.push(',');
            }
            grouped.push(c);
        }
        if rounded < 0 {
            grouped.insert(0, '-');
        }
        grouped
    } else if value.abs() >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    }
}

/// Left-aligned columns separated by two spaces, with a rule under the header.
fn table<const N: usize>(out: &mut String, header: [&str; N], rows: &[[String; N]]) {
    let mut widths = header.map(|h| h.chars().count());
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| -> String {
        let padded: Vec<String> = cells
            .iter()
            .zip(widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        padded.join("  ").trim_end().to_string()
    };
    let _ = writeln!(out, "{}", line(header.to_vec()));
    let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
    let _ = writeln!(out, "{}", line(rule.iter().map(String::as_str).collect()));
    for row in rows {
        let _ = writeln!(out, "{}", line(row.iter().map(String::as_str).collect()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        let s = summarise(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
        assert_eq!(summarise(&[1.0, 4.0]).unwrap().median, 2.5);
        assert!(summarise(&[]).is_none());
    }

    #[test]
    fn numbers_are_grouped() {
        assert_eq!(number(12345.6), "12,346");
        assert_eq!(number(150.0), "150");
        assert_eq!(number(14.26), "14.3");
        assert_eq!(number(1.234), "1.23");
    }
}
