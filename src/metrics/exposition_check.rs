//! Test-only checker for Prometheus text exposition output, stricter than the format needs:
//! every family has HELP then TYPE before its samples, a family's samples are contiguous,
//! every sample line is `name{labels} value` with valid escapes, counters end in `_total`,
//! series are unique, and each histogram series has non-decreasing cumulative buckets
//! ending in `+Inf` equal to `_count`, plus a `_sum`.
//!
//! Compiled only for tests, so promtool is not needed to catch syntax slips; it never runs in
//! the server.

use std::collections::{HashMap, HashSet};

/// What a checked page held.
#[derive(Debug, PartialEq, Eq)]
pub struct Summary {
    pub families: usize,
    pub samples: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// One histogram series (its labels without `le`) as its samples arrive.
#[derive(Default)]
struct HistogramSeries {
    last_bound: Option<f64>,
    last_count: f64,
    inf_count: Option<f64>,
    count: Option<f64>,
    has_sum: bool,
}

#[derive(Default)]
struct Checker {
    help: HashSet<String>,
    kinds: HashMap<String, Kind>,
    /// Families whose samples ended (another family started after them).
    closed: HashSet<String>,
    current: Option<String>,
    series: HashSet<String>,
    histograms: HashMap<String, HistogramSeries>,
    samples: usize,
}

/// Checks `text`; the error names the first offending line.
pub fn check(text: &str) -> Result<Summary, String> {
    if !text.is_empty() && !text.ends_with('\n') {
        return Err("the page must end with a newline".into());
    }
    let mut c = Checker::default();
    for (i, line) in text.lines().enumerate() {
        c.line(line)
            .map_err(|e| format!("line {}: {e}: {line:?}", i + 1))?;
    }
    c.finish()?;
    Ok(Summary {
        families: c.kinds.len(),
        samples: c.samples,
    })
}

impl Checker {
    fn line(&mut self, line: &str) -> Result<(), String> {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            self.help_line(rest)
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            self.type_line(rest)
        } else if line.starts_with('#') || line.is_empty() {
            Err("unexpected comment or blank line".into())
        } else {
            self.sample_line(line)
        }
    }

    fn help_line(&mut self, rest: &str) -> Result<(), String> {
        let (name, help) = rest.split_once(' ').ok_or("HELP without text")?;
        check_name(name)?;
        if help.trim().is_empty() {
            return Err("empty HELP".into());
        }
        check_escapes(help, false)?;
        if !self.help.insert(name.to_string()) {
            return Err("second HELP for a family".into());
        }
        if let Some(previous) = self.current.replace(name.to_string()) {
            self.closed.insert(previous);
        }
        Ok(())
    }

    fn type_line(&mut self, rest: &str) -> Result<(), String> {
        let (name, kind) = rest.split_once(' ').ok_or("TYPE without type")?;
        if self.current.as_deref() != Some(name) || self.kinds.contains_key(name) {
            return Err("TYPE must follow its family's HELP, once".into());
        }
        let kind = match kind {
            "counter" => Kind::Counter,
            "gauge" => Kind::Gauge,
            "histogram" => Kind::Histogram,
            _ => return Err(format!("unexpected type {kind}")),
        };
        if (kind == Kind::Counter) != name.ends_with("_total") {
            return Err("counters, and only counters, end in _total".into());
        }
        self.kinds.insert(name.to_string(), kind);
        Ok(())
    }

    fn sample_line(&mut self, line: &str) -> Result<(), String> {
        let sample = parse_sample(line)?;
        let (family, suffix) = self.family_of(sample.name)?;
        if self.current.as_deref() != Some(family) || self.closed.contains(family) {
            return Err("sample outside its family's block".into());
        }
        let key = format!("{}{:?}", sample.name, sample.labels);
        if !self.series.insert(key) {
            return Err("duplicate series".into());
        }
        self.samples += 1;
        let kind = self.kinds[family];
        let le = sample
            .labels
            .iter()
            .find(|(k, _)| k == "le")
            .map(|(_, v)| v.clone());
        match kind {
            Kind::Counter | Kind::Gauge if le.is_some() => {
                Err("le label outside a histogram".into())
            }
            Kind::Counter if sample.value < 0.0 || sample.value.is_nan() => {
                Err("negative or NaN counter".into())
            }
            Kind::Counter | Kind::Gauge => Ok(()),
            Kind::Histogram => self.histogram_sample(family, suffix, &sample, le),
        }
    }

    /// The family a sample belongs to, and its histogram suffix if any.
    fn family_of<'a>(&self, name: &'a str) -> Result<(&'a str, &'a str), String> {
        if self.kinds.contains_key(name) {
            return Ok((name, ""));
        }
        for suffix in ["_bucket", "_sum", "_count"] {
            if let Some(base) = name.strip_suffix(suffix) {
                if self.kinds.get(base) == Some(&Kind::Histogram) {
                    return Ok((base, suffix));
                }
            }
        }
        Err("sample before its family's HELP and TYPE".into())
    }

    fn histogram_sample(
        &mut self,
        family: &str,
        suffix: &str,
        sample: &Sample<'_>,
        le: Option<String>,
    ) -> Result<(), String> {
        let others: Vec<_> = sample.labels.iter().filter(|(k, _)| k != "le").collect();
        let series = self
            .histograms
            .entry(format!("{family}{others:?}"))
            .or_default();
        match (suffix, le) {
            ("_bucket", Some(le)) => {
                if series.inf_count.is_some() {
                    return Err("bucket after +Inf".into());
                }
                let bound = parse_value(&le)?;
                if series.last_bound.is_some_and(|b| bound <= b) {
                    return Err("le bounds must increase".into());
                }
                if sample.value < series.last_count {
                    return Err("cumulative bucket counts must not decrease".into());
                }
                series.last_bound = Some(bound);
                series.last_count = sample.value;
                if bound == f64::INFINITY {
                    series.inf_count = Some(sample.value);
                }
                Ok(())
            }
            ("_sum", None) => {
                series.has_sum = true;
                Ok(())
            }
            ("_count", None) => {
                series.count = Some(sample.value);
                Ok(())
            }
            _ => Err("histogram samples are _bucket with le, or _sum / _count without".into()),
        }
    }

    fn finish(&self) -> Result<(), String> {
        if let Some(name) = self.help.iter().find(|n| !self.kinds.contains_key(*n)) {
            return Err(format!("{name}: HELP without TYPE"));
        }
        for (key, s) in &self.histograms {
            match (s.inf_count, s.count) {
                (Some(inf), Some(count)) if inf == count && s.has_sum => {}
                _ => return Err(format!("{key}: needs +Inf bucket == _count, and _sum")),
            }
        }
        Ok(())
    }
}

/// Parsed labels of one sample, `(name, unescaped value)` in order.
type ParsedLabels = Vec<(String, String)>;

struct Sample<'a> {
    name: &'a str,
    labels: ParsedLabels,
    value: f64,
}

/// `name{k="v",...} value` or `name value`; no timestamps.
fn parse_sample(line: &str) -> Result<Sample<'_>, String> {
    let name_end = line.find(['{', ' ']).ok_or("no value")?;
    let name = &line[..name_end];
    check_name(name)?;
    let (labels, rest) = if line[name_end..].starts_with('{') {
        parse_labels(&line[name_end + 1..])?
    } else {
        (Vec::new(), &line[name_end..])
    };
    let value = rest
        .strip_prefix(' ')
        .ok_or("expected one space before the value")?;
    if value.contains(' ') {
        return Err("unexpected timestamp or trailing text".into());
    }
    Ok(Sample {
        name,
        labels,
        value: parse_value(value)?,
    })
}

/// Parses `k="v",k2="v2"}` and returns the labels and what follows `}`.
fn parse_labels(mut s: &str) -> Result<(ParsedLabels, &str), String> {
    let mut labels = Vec::new();
    loop {
        let eq = s.find("=\"").ok_or("label without =\"")?;
        let name = &s[..eq];
        check_name(name)?;
        if name.contains(':') || labels.iter().any(|(k, _)| k == name) {
            return Err(format!("bad or repeated label name {name}"));
        }
        let (value, after) = parse_quoted(&s[eq + 2..])?;
        labels.push((name.to_string(), value));
        match after.as_bytes().first() {
            Some(b',') => s = &after[1..],
            Some(b'}') => return Ok((labels, &after[1..])),
            _ => return Err("expected , or } after a label".into()),
        }
    }
}

/// Reads an escaped label value up to its closing quote; returns it and the rest.
fn parse_quoted(s: &str) -> Result<(String, &str), String> {
    let mut value = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Ok((value, &s[i + 1..])),
            '\n' => return Err("raw newline in label value".into()),
            '\\' => match chars.next() {
                Some((_, '\\')) => value.push('\\'),
                Some((_, '"')) => value.push('"'),
                Some((_, 'n')) => value.push('\n'),
                _ => return Err("bad escape in label value".into()),
            },
            c => value.push(c),
        }
    }
    Err("unterminated label value".into())
}

/// HELP text may only escape `\\` and `\n` (label values also `\"`).
fn check_escapes(text: &str, quote: bool) -> Result<(), String> {
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some('\\') | Some('n') => {}
                Some('"') if quote => {}
                _ => return Err("bad escape".into()),
            }
        }
    }
    Ok(())
}

/// A Go-`ParseFloat`-compatible value as Prometheus writes it.
fn parse_value(s: &str) -> Result<f64, String> {
    match s {
        "+Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ if !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_digit() || b"+-.eE".contains(&b)) =>
        {
            s.parse().map_err(|e| format!("bad value {s:?}: {e}"))
        }
        _ => Err(format!("bad value {s:?}")),
    }
}

fn check_name(name: &str) -> Result<(), String> {
    let mut bytes = name.bytes();
    let ok = matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_' || b == b':')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':');
    if ok {
        Ok(())
    } else {
        Err(format!("invalid name {name:?}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "# HELP a_total A.\n# TYPE a_total counter\na_total{x=\"1\"} 2\n\
                        # HELP h_seconds H.\n# TYPE h_seconds histogram\n\
                        h_seconds_bucket{le=\"0.5\"} 1\nh_seconds_bucket{le=\"+Inf\"} 2\n\
                        h_seconds_sum 0.7\nh_seconds_count 2\n";

    #[test]
    fn accepts_a_well_formed_page() {
        assert_eq!(
            check(GOOD),
            Ok(Summary {
                families: 2,
                samples: 5
            })
        );
    }

    #[test]
    fn rejects_each_kind_of_mistake() {
        let bad = [
            ("a_total 1\n", "before its family"),
            ("# TYPE a_total counter\n", "follow its family's HELP"),
            ("# HELP a A.\n# TYPE a counter\n", "_total"),
            (
                "# HELP a_total A.\n# TYPE a_total counter\na_total{x=1} 2\n",
                "=\"",
            ),
            ("# HELP g G.\n# TYPE g gauge\ng 1 123\n", "timestamp"),
            ("# HELP g G.\n# TYPE g gauge\ng 1\ng 2\n", "duplicate"),
            ("# HELP g G.\n# TYPE g gauge\ng inf\n", "bad value"),
            ("# HELP g G.\n# TYPE g gauge\ng{a=\"\\x\"} 1\n", "escape"),
            ("# HELP g G.\n# TYPE g gauge\ng 1", "newline"),
            (
                "# HELP g G.\n# TYPE g gauge\n# HELP f F.\n# TYPE f gauge\ng 1\n",
                "outside its family",
            ),
            (
                "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\n\
                 h_bucket{le=\"2\"} 1\n",
                "decrease",
            ),
            (
                "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\n\
                 h_bucket{le=\"+Inf\"} 3\nh_sum 1\nh_count 2\n",
                "+Inf bucket == _count",
            ),
            (
                "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_count 2\n",
                "_sum",
            ),
        ];
        for (page, want) in bad {
            let err = check(page).expect_err(page);
            assert!(err.contains(want), "{page:?}: {err}");
        }
    }
}
