//! Low-level writer for the Prometheus text exposition format 0.0.4: `# HELP` / `# TYPE`
//! headers, samples with escaped labels, and histograms (`_bucket{le}`, `_sum`, `_count`).
//!
//! Which metrics exist lives in `prometheus.rs`; this file only knows the syntax. It appends
//! to a caller's `String` (it may grow it) and runs on io threads, never on the engine thread.
//! Names are checked with `debug_assert!` so a badly named metric fails tests, not promtool.

use std::fmt::Write;

/// A metric family's type, as written on its `# TYPE` line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricType {
    Counter,
    Gauge,
    Histogram,
}

impl MetricType {
    /// The `# TYPE` keyword.
    pub const fn as_str(self) -> &'static str {
        match self {
            MetricType::Counter => "counter",
            MetricType::Gauge => "gauge",
            MetricType::Histogram => "histogram",
        }
    }
}

/// Labels of one sample, `(name, value)`; values are escaped when written.
pub type Labels<'a> = &'a [(&'a str, &'a str)];

/// A sample value: integers print exactly, floats in shortest round-trip form.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value {
    Int(u64),
    Float(f64),
}

impl From<u64> for Value {
    fn from(v: u64) -> Self {
        Value::Int(v)
    }
}

impl From<usize> for Value {
    fn from(v: usize) -> Self {
        Value::Int(v as u64)
    }
}

impl From<u32> for Value {
    fn from(v: u32) -> Self {
        Value::Int(u64::from(v))
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Value::Int(u64::from(v))
    }
}

impl From<f64> for Value {
    fn from(v: f64) -> Self {
        Value::Float(v)
    }
}

/// Writes the `# HELP` and `# TYPE` lines that open family `name`.
pub fn family(out: &mut String, name: &str, kind: MetricType, help: &str) {
    debug_assert!(is_valid_name(name), "invalid metric name {name:?}");
    debug_assert_eq!(
        kind == MetricType::Counter,
        name.ends_with("_total"),
        "{name}: counters and only counters end in _total"
    );
    debug_assert!(
        !["_bucket", "_sum", "_count"]
            .iter()
            .any(|s| name.ends_with(s)),
        "{name}: suffix reserved for histograms"
    );
    out.push_str("# HELP ");
    out.push_str(name);
    out.push(' ');
    push_escaped(out, help, false);
    out.push_str("\n# TYPE ");
    out.push_str(name);
    out.push(' ');
    out.push_str(kind.as_str());
    out.push('\n');
}

/// Writes one sample `name{labels} value`.
pub fn sample(out: &mut String, name: &str, labels: Labels<'_>, value: impl Into<Value>) {
    series(out, name, "", labels, None);
    push_value(out, value.into());
}

/// A whole family with one unlabelled sample.
pub fn single(out: &mut String, name: &str, kind: MetricType, help: &str, value: impl Into<Value>) {
    family(out, name, kind, help);
    sample(out, name, &[], value);
}

/// Writes the samples of one histogram series: a bucket per `(upper bound, cumulative
/// count)`, then `+Inf` (= `count`), `_sum` and `_count`. The family header is the caller's.
///
/// `cumulative` must be in increasing bound order with non-decreasing counts, each at most
/// `count`: Prometheus rejects anything else.
pub fn histogram(
    out: &mut String,
    name: &str,
    labels: Labels<'_>,
    cumulative: impl IntoIterator<Item = (f64, u64)>,
    count: u64,
    sum: f64,
) {
    let mut previous = (f64::NEG_INFINITY, 0);
    for (bound, below) in cumulative {
        debug_assert!(bound > previous.0 && below >= previous.1 && below <= count);
        previous = (bound, below);
        series(out, name, "_bucket", labels, Some(bound));
        push_value(out, Value::Int(below));
    }
    series(out, name, "_bucket", labels, Some(f64::INFINITY));
    push_value(out, Value::Int(count));
    series(out, name, "_sum", labels, None);
    push_value(out, Value::Float(sum));
    series(out, name, "_count", labels, None);
    push_value(out, Value::Int(count));
}

/// Writes `name{suffix}{labels,le="bound"} ` (everything before the value).
fn series(out: &mut String, name: &str, suffix: &str, labels: Labels<'_>, le: Option<f64>) {
    out.push_str(name);
    out.push_str(suffix);
    if !labels.is_empty() || le.is_some() {
        out.push('{');
        for (i, (label, value)) in labels.iter().enumerate() {
            debug_assert!(is_valid_name(label) && !label.contains(':') && *label != "le");
            if i > 0 {
                out.push(',');
            }
            out.push_str(label);
            out.push_str("=\"");
            push_escaped(out, value, true);
            out.push('"');
        }
        if let Some(bound) = le {
            if !labels.is_empty() {
                out.push(',');
            }
            out.push_str("le=\"");
            push_f64(out, bound);
            out.push('"');
        }
        out.push('}');
    }
    out.push(' ');
}

/// Writes `value` and ends the line.
fn push_value(out: &mut String, value: Value) {
    match value {
        // Writing to a String cannot fail.
        Value::Int(v) => {
            let _ = write!(out, "{v}");
        }
        Value::Float(v) => push_f64(out, v),
    }
    out.push('\n');
}

/// A float as Prometheus spells it: `+Inf`, `-Inf`, `NaN`, or Rust's shortest round-trip
/// decimal (never exponent notation).
fn push_f64(out: &mut String, v: f64) {
    if v.is_nan() {
        out.push_str("NaN");
    } else if v.is_infinite() {
        out.push_str(if v > 0.0 { "+Inf" } else { "-Inf" });
    } else {
        // Writing to a String cannot fail.
        let _ = write!(out, "{v}");
    }
}

/// Appends `text` escaped for a HELP line (`\\`, `\n`) or a label value (also `\"`).
fn push_escaped(out: &mut String, text: &str, quote: bool) {
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' if quote => out.push_str("\\\""),
            c => out.push(c),
        }
    }
}

/// `[a-zA-Z_:][a-zA-Z0-9_:]*`
fn is_valid_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    let first_ok =
        matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_' || b == b':');
    first_ok && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_help_are_escaped() {
        let mut out = String::new();
        family(&mut out, "x_total", MetricType::Counter, "a \\ b\nc \"q\"");
        sample(
            &mut out,
            "x_total",
            &[("path", "a\"b\\c\nd"), ("k", "v")],
            3u64,
        );
        assert_eq!(
            out,
            "# HELP x_total a \\\\ b\\nc \"q\"\n# TYPE x_total counter\n\
             x_total{path=\"a\\\"b\\\\c\\nd\",k=\"v\"} 3\n"
        );
    }

    #[test]
    fn floats_use_prometheus_spellings() {
        let mut out = String::new();
        for v in [
            0.0005,
            1.0,
            2.5,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            1e-9,
        ] {
            push_f64(&mut out, v);
            out.push(' ');
        }
        assert_eq!(out, "0.0005 1 2.5 +Inf -Inf NaN 0.000000001 ");
    }

    #[test]
    fn histogram_ends_with_inf_sum_and_count() {
        let mut out = String::new();
        family(&mut out, "h_seconds", MetricType::Histogram, "h");
        histogram(
            &mut out,
            "h_seconds",
            &[("a", "b")],
            [(0.5, 1), (1.0, 2)],
            3,
            4.25,
        );
        let want = "# HELP h_seconds h\n# TYPE h_seconds histogram\n\
                    h_seconds_bucket{a=\"b\",le=\"0.5\"} 1\n\
                    h_seconds_bucket{a=\"b\",le=\"1\"} 2\n\
                    h_seconds_bucket{a=\"b\",le=\"+Inf\"} 3\n\
                    h_seconds_sum{a=\"b\"} 4.25\n\
                    h_seconds_count{a=\"b\"} 3\n";
        assert_eq!(out, want);
    }

    #[test]
    fn names_are_validated() {
        assert!(is_valid_name("abe_queue_depth"));
        assert!(is_valid_name("_x:y9"));
        assert!(!is_valid_name("9x"));
        assert!(!is_valid_name("a-b"));
        assert!(!is_valid_name(""));
    }
}
