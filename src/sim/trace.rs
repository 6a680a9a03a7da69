//! Request traces for the `replay` arrival process: CSV or JSON Lines.
//!
//! A trace row is `arrival_ms, prompt_tokens, output_tokens` and optionally `priority`
//! (`low|normal|high|critical`; absent or empty: drawn from the scenario's priority mix).
//! CSV needs a header naming the columns (any order, extra columns ignored); blank lines and
//! lines starting with `#` are skipped. JSONL is one object per line with the same field
//! names. Rows are sorted by arrival (stable), so a trace need not be ordered. Errors name the
//! file and line. This is the only file in `sim` that reads input files besides scenarios.

use super::SimError;
use crate::core::Priority;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// How a trace file is encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceFormat {
    Csv,
    Jsonl,
}

impl TraceFormat {
    /// The format implied by a file name: `.jsonl`/`.ndjson` is JSONL, anything else CSV.
    pub fn from_path(path: &Path) -> TraceFormat {
        match path.extension().and_then(|e| e.to_str()) {
            Some("jsonl") | Some("ndjson") => TraceFormat::Jsonl,
            _ => TraceFormat::Csv,
        }
    }
}

/// One request of a trace.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TraceRow {
    pub arrival_ms: f64,
    pub prompt_tokens: u32,
    pub output_tokens: u32,
    pub priority: Option<Priority>,
}

#[derive(Deserialize)]
struct JsonRow {
    arrival_ms: f64,
    prompt_tokens: u32,
    output_tokens: u32,
    #[serde(default)]
    priority: Option<String>,
}

fn parse_err(path: &Path, line: usize, why: impl std::fmt::Display) -> SimError {
    SimError::Parse {
        path: format!("{}:{line}", path.display()),
        why: why.to_string(),
    }
}

fn priority(path: &Path, line: usize, s: &str) -> Result<Option<Priority>, SimError> {
    let s = s.trim();
    if s.is_empty() {
        return Ok(None);
    }
    s.parse().map(Some).map_err(|e| parse_err(path, line, e))
}

fn check_arrival(path: &Path, line: usize, ms: f64) -> Result<f64, SimError> {
    if ms.is_finite() && ms >= 0.0 {
        Ok(ms)
    } else {
        Err(parse_err(
            path,
            line,
            format!("arrival_ms {ms} must be a finite number >= 0"),
        ))
    }
}

/// Parses trace `text` read from `path` (used in errors only).
pub fn parse(path: &Path, text: &str, format: TraceFormat) -> Result<Vec<TraceRow>, SimError> {
    let mut rows = match format {
        TraceFormat::Csv => parse_csv(path, text)?,
        TraceFormat::Jsonl => parse_jsonl(path, text)?,
    };
    rows.sort_by(|a, b| a.arrival_ms.total_cmp(&b.arrival_ms));
    if rows.is_empty() {
        return Err(parse_err(path, 0, "the trace has no requests"));
    }
    Ok(rows)
}

/// Reads and parses the trace at `path` (format from the extension unless given).
pub fn load(path: &Path, format: Option<TraceFormat>) -> Result<Vec<TraceRow>, SimError> {
    let text = std::fs::read_to_string(path).map_err(|source| SimError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse(
        path,
        &text,
        format.unwrap_or_else(|| TraceFormat::from_path(path)),
    )
}

fn parse_csv(path: &Path, text: &str) -> Result<Vec<TraceRow>, SimError> {
    let mut lines = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim()))
        .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'));
    let Some((hline, header)) = lines.next() else {
        return Err(parse_err(path, 0, "empty trace: expected a CSV header"));
    };
    let names: Vec<&str> = header.split(',').map(str::trim).collect();
    let col = |name: &str| names.iter().position(|n| *n == name);
    let need = |name: &str| {
        col(name).ok_or_else(|| {
            parse_err(
                path,
                hline,
                format!("the header has no '{name}' column (need arrival_ms, prompt_tokens, output_tokens; priority optional)"),
            )
        })
    };
    let (c_arr, c_p, c_o) = (
        need("arrival_ms")?,
        need("prompt_tokens")?,
        need("output_tokens")?,
    );
    let c_pri = col("priority");
    let mut rows = Vec::new();
    for (line, l) in lines {
        let fields: Vec<&str> = l.split(',').map(str::trim).collect();
        let get = |c: usize, name: &str| {
            fields
                .get(c)
                .copied()
                .ok_or_else(|| parse_err(path, line, format!("missing column '{name}'")))
        };
        let num = |c: usize, name: &str| -> Result<f64, SimError> {
            get(c, name)?
                .parse::<f64>()
                .map_err(|e| parse_err(path, line, format!("{name}: {e}")))
        };
        let tokens = |c: usize, name: &str| -> Result<u32, SimError> {
            get(c, name)?
                .parse::<u32>()
                .map_err(|e| parse_err(path, line, format!("{name}: {e}")))
        };
        rows.push(TraceRow {
            arrival_ms: check_arrival(path, line, num(c_arr, "arrival_ms")?)?,
            prompt_tokens: tokens(c_p, "prompt_tokens")?,
            output_tokens: tokens(c_o, "output_tokens")?,
            priority: match c_pri.and_then(|c| fields.get(c)) {
                Some(s) => priority(path, line, s)?,
                None => None,
            },
        });
    }
    Ok(rows)
}

fn parse_jsonl(path: &Path, text: &str) -> Result<Vec<TraceRow>, SimError> {
    let mut rows = Vec::new();
    for (i, l) in text.lines().enumerate() {
        let line = i + 1;
        let l = l.trim();
        if l.is_empty() {
            continue;
        }
        let r: JsonRow = serde_json::from_str(l).map_err(|e| parse_err(path, line, e))?;
        rows.push(TraceRow {
            arrival_ms: check_arrival(path, line, r.arrival_ms)?,
            prompt_tokens: r.prompt_tokens,
            output_tokens: r.output_tokens,
            priority: match r.priority {
                Some(s) => priority(path, line, &s)?,
                None => None,
            },
        });
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_with_reordered_columns_and_jsonl_give_the_same_sorted_rows() {
        let p = Path::new("t.csv");
        let csv = "# a trace\noutput_tokens,arrival_ms,prompt_tokens,priority\n20,5.5,100,high\n\n10,1.0,50,\n";
        let jsonl = r#"{"arrival_ms": 5.5, "prompt_tokens": 100, "output_tokens": 20, "priority": "high"}
{"arrival_ms": 1.0, "prompt_tokens": 50, "output_tokens": 10}"#;
        let a = parse(p, csv, TraceFormat::Csv).unwrap();
        let b = parse(Path::new("t.jsonl"), jsonl, TraceFormat::Jsonl).unwrap();
        assert_eq!(a, b);
        assert_eq!(a[0].arrival_ms, 1.0);
        assert_eq!(a[0].priority, None);
        assert_eq!(a[1].priority, Some(Priority::High));
    }

    #[test]
    fn errors_name_the_file_line_and_problem() {
        let p = Path::new("t.csv");
        let e = parse(p, "arrival_ms,prompt_tokens\n1,2\n", TraceFormat::Csv).unwrap_err();
        assert!(e
            .to_string()
            .starts_with("t.csv:1: the header has no 'output_tokens'"));
        let e = parse(
            p,
            "arrival_ms,prompt_tokens,output_tokens\n1,x,3\n",
            TraceFormat::Csv,
        )
        .unwrap_err();
        assert!(e.to_string().starts_with("t.csv:2: prompt_tokens"), "{e}");
        let e = parse(
            p,
            "arrival_ms,prompt_tokens,output_tokens,priority\n1,2,3,urgent\n",
            TraceFormat::Csv,
        )
        .unwrap_err();
        assert!(e.to_string().contains("unknown priority 'urgent'"));
        assert_eq!(
            TraceFormat::from_path(Path::new("a.jsonl")),
            TraceFormat::Jsonl
        );
    }
}
