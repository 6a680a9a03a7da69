//! Request traces for the `replay` arrival process: abe's own CSV or JSON Lines, and the two
//! public formats as they are published, told apart by the CSV header or the JSONL fields.
//!
//! - abe's rows: `arrival_ms, prompt_tokens, output_tokens` and optionally `priority`
//!   (`low|normal|high|critical`; absent or empty: drawn from the scenario's priority mix);
//!   JSONL rows may also carry `hash_ids` (below).
//! - Azure LLM inference traces (CSV header `TIMESTAMP,ContextTokens,GeneratedTokens`):
//!   wall-clock timestamps (`2023-11-16 18:15:46.6805900`, optional `T`, `Z` or `+hh:mm`);
//!   a row's arrival is its timestamp minus the earliest one's (the first row's in a sorted
//!   trace).
//! - Mooncake traces (JSONL `timestamp` in ms, `input_length`, `output_length`, `hash_ids`):
//!   `hash_ids` names the prompt's blocks of [`MOONCAKE_BLOCK_TOKENS`] tokens in order, equal
//!   ids meaning equal prefixes (the conversation, tool/agent and synthetic traces alike).
//!
//! CSV needs a header naming the columns (any order, extra columns ignored); blank lines and
//! lines starting with `#` are skipped. JSONL is one object per line; extra fields are
//! ignored. Rows are sorted by arrival (stable), so a trace need not be ordered.
//!
//! The file is read line by line through one reused buffer that never grows past
//! [`MAX_LINE_BYTES`]: memory is the rows kept (32 bytes each plus 8 a block id), whatever
//! the lines hold. Every error names the file and line. This is the only file in `sim` that
//! reads input files besides scenarios; it never panics on what a file contains.

use super::prefix::MOONCAKE_BLOCK_TOKENS;
use super::SimError;
use crate::core::Priority;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

/// The longest line a trace may have (a Mooncake line of 12k tokens is ~2 KB; a million-token
/// prompt's `hash_ids` is ~20 KB).
pub const MAX_LINE_BYTES: usize = 1 << 20;

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

/// Whose columns a trace has (found from its CSV header or its first JSONL object).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceDialect {
    /// `arrival_ms, prompt_tokens, output_tokens[, priority][, hash_ids]`.
    Abe,
    /// `TIMESTAMP, ContextTokens, GeneratedTokens` (Azure LLM inference traces).
    Azure,
    /// `timestamp, input_length, output_length, hash_ids` (Mooncake traces).
    Mooncake,
}

/// Where a row's block ids sit in [`Trace::hash_ids`]; `len == 0`: none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IdSpan {
    pub start: u32,
    pub len: u32,
}

/// One request of a trace.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TraceRow {
    pub arrival_ms: f64,
    pub prompt_tokens: u32,
    pub output_tokens: u32,
    pub priority: Option<Priority>,
    /// Its prompt's block ids (`hash_ids`), if the trace has them.
    pub ids: IdSpan,
}

/// A whole trace: rows sorted by arrival, and the block ids they point into.
#[derive(Clone, Debug, PartialEq)]
pub struct Trace {
    pub dialect: TraceDialect,
    pub rows: Vec<TraceRow>,
    /// Every row's `hash_ids`, back to back (in file order).
    pub hash_ids: Vec<u64>,
    /// Prompt tokens per block id ([`MOONCAKE_BLOCK_TOKENS`]).
    pub block_tokens: u32,
}

impl Trace {
    /// `row`'s block ids (empty: no prefix identity).
    pub fn ids(&self, row: &TraceRow) -> &[u64] {
        let start = row.ids.start as usize;
        &self.hash_ids[start..start + row.ids.len as usize]
    }

    /// True when some row has block ids.
    pub fn has_hash_ids(&self) -> bool {
        !self.hash_ids.is_empty()
    }
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

fn check_arrival(path: &Path, line: usize, name: &str, ms: f64) -> Result<f64, SimError> {
    if ms.is_finite() && ms >= 0.0 {
        Ok(ms)
    } else {
        Err(parse_err(
            path,
            line,
            format!("{name} {ms} must be a finite number of ms >= 0"),
        ))
    }
}

/// The lines of a trace, one at a time, through one buffer of at most `MAX_LINE_BYTES + 1`.
struct Lines<'p, R> {
    path: &'p Path,
    reader: R,
    buf: Vec<u8>,
    /// 1-based number of the line in `buf`.
    line: usize,
}

impl<'p, R: BufRead> Lines<'p, R> {
    fn new(path: &'p Path, reader: R) -> Self {
        Lines {
            path,
            reader,
            buf: Vec::new(),
            line: 0,
        }
    }

    /// The next line that is neither blank nor (`skip_comments`) a `#` comment, trimmed,
    /// with its number; `None` at the end of the file.
    fn next(&mut self, skip_comments: bool) -> Result<Option<(usize, &str)>, SimError> {
        let (start, end) = loop {
            self.buf.clear();
            let limit = MAX_LINE_BYTES as u64 + 1;
            let n = (&mut self.reader)
                .take(limit)
                .read_until(b'\n', &mut self.buf)
                .map_err(|source| SimError::Io {
                    path: self.path.to_path_buf(),
                    source,
                })?;
            if n == 0 {
                return Ok(None);
            }
            self.line += 1;
            if self.buf.last() == Some(&b'\n') {
                self.buf.pop();
            }
            if self.buf.len() > MAX_LINE_BYTES {
                return Err(parse_err(
                    self.path,
                    self.line,
                    format!("line longer than {MAX_LINE_BYTES} bytes (1 MiB): not a trace row"),
                ));
            }
            let text = std::str::from_utf8(&self.buf)
                .map_err(|e| parse_err(self.path, self.line, format!("not UTF-8 text: {e}")))?;
            let trimmed = text.trim();
            if trimmed.is_empty() || (skip_comments && trimmed.starts_with('#')) {
                continue;
            }
            let start = text.len() - text.trim_start().len();
            break (start, start + trimmed.len());
        };
        // `start..end` lies on character boundaries of text checked above.
        let text = std::str::from_utf8(&self.buf[start..end])
            .map_err(|e| parse_err(self.path, self.line, format!("not UTF-8 text: {e}")))?;
        Ok(Some((self.line, text)))
    }
}

/// Reads a trace from `reader`; `path` names it in errors.
pub fn read(path: &Path, reader: impl BufRead, format: TraceFormat) -> Result<Trace, SimError> {
    let mut lines = Lines::new(path, reader);
    let mut trace = match format {
        TraceFormat::Csv => read_csv(&mut lines)?,
        TraceFormat::Jsonl => read_jsonl(&mut lines)?,
    };
    if trace.rows.is_empty() {
        let why = if lines.line == 0 {
            "empty file: a trace needs at least one request"
        } else {
            "the trace has no requests"
        };
        return Err(parse_err(path, lines.line, why));
    }
    trace
        .rows
        .sort_by(|a, b| a.arrival_ms.total_cmp(&b.arrival_ms));
    Ok(trace)
}

/// Parses trace `text` read from `path` (used in errors only).
pub fn parse(path: &Path, text: &str, format: TraceFormat) -> Result<Trace, SimError> {
    read(path, text.as_bytes(), format)
}

/// Reads the trace at `path` (format from the extension unless given), streaming.
pub fn load(path: &Path, format: Option<TraceFormat>) -> Result<Trace, SimError> {
    let file = std::fs::File::open(path).map_err(|source| SimError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    read(
        path,
        BufReader::with_capacity(64 * 1024, file),
        format.unwrap_or_else(|| TraceFormat::from_path(path)),
    )
}

fn new_trace(dialect: TraceDialect) -> Trace {
    Trace {
        dialect,
        rows: Vec::new(),
        hash_ids: Vec::new(),
        block_tokens: MOONCAKE_BLOCK_TOKENS,
    }
}

fn read_csv<R: BufRead>(lines: &mut Lines<'_, R>) -> Result<Trace, SimError> {
    let path = lines.path;
    let Some((hline, header)) = lines.next(true)? else {
        return Err(parse_err(
            path,
            lines.line,
            "empty file: expected a CSV header (arrival_ms,prompt_tokens,output_tokens or \
             TIMESTAMP,ContextTokens,GeneratedTokens)",
        ));
    };
    let names: Vec<String> = header.split(',').map(|s| s.trim().to_string()).collect();
    let col = |name: &str| names.iter().position(|n| n.eq_ignore_ascii_case(name));
    let azure = col("TIMESTAMP").is_some();
    let (cols, dialect) = if azure {
        (
            ["TIMESTAMP", "ContextTokens", "GeneratedTokens"],
            TraceDialect::Azure,
        )
    } else {
        (
            ["arrival_ms", "prompt_tokens", "output_tokens"],
            TraceDialect::Abe,
        )
    };
    let mut idx = [0usize; 3];
    for (slot, name) in idx.iter_mut().zip(cols) {
        *slot = col(name).ok_or_else(|| {
            parse_err(
                path,
                hline,
                format!(
                    "the header has no '{name}' column (need arrival_ms, prompt_tokens, \
                     output_tokens, priority optional; or an Azure trace's TIMESTAMP, \
                     ContextTokens, GeneratedTokens)"
                ),
            )
        })?;
    }
    let c_pri = if azure { None } else { col("priority") };
    let mut trace = new_trace(dialect);
    // Azure: absolute timestamps, ns since 1970, made relative once all are read.
    let mut wall_ns: Vec<i64> = Vec::new();
    while let Some((line, l)) = lines.next(true)? {
        let fields: Vec<&str> = l.split(',').map(str::trim).collect();
        let get = |i: usize| {
            fields
                .get(idx[i])
                .copied()
                .ok_or_else(|| parse_err(path, line, format!("missing column '{}'", cols[i])))
        };
        let tokens = |i: usize| -> Result<u32, SimError> {
            get(i)?.parse::<u32>().map_err(|e| {
                parse_err(
                    path,
                    line,
                    format!("{}: {e} (a whole number of tokens)", cols[i]),
                )
            })
        };
        let arrival_ms = if azure {
            let s = get(0)?;
            let ns = parse_wall_clock(s).ok_or_else(|| {
                parse_err(
                    path,
                    line,
                    format!(
                        "TIMESTAMP '{s}' does not parse (expected YYYY-MM-DD HH:MM:SS[.fraction])"
                    ),
                )
            })?;
            wall_ns.push(ns);
            0.0
        } else {
            let v = get(0)?
                .parse::<f64>()
                .map_err(|e| parse_err(path, line, format!("arrival_ms: {e}")))?;
            check_arrival(path, line, "arrival_ms", v)?
        };
        trace.rows.push(TraceRow {
            arrival_ms,
            prompt_tokens: tokens(1)?,
            output_tokens: tokens(2)?,
            priority: match c_pri.and_then(|c| fields.get(c)) {
                Some(s) => priority(path, line, s)?,
                None => None,
            },
            ids: IdSpan::default(),
        });
    }
    if let Some(&first) = wall_ns.iter().min() {
        for (row, &ns) in trace.rows.iter_mut().zip(&wall_ns) {
            row.arrival_ms = (ns - first) as f64 / 1e6;
        }
    }
    Ok(trace)
}

/// Nanoseconds since 1970-01-01 of `YYYY-MM-DD[ T]HH:MM:SS[.fraction][Z|+hh:mm|-hh:mm]`
/// (UTC unless an offset is given); `None` if it is not one.
pub fn parse_wall_clock(s: &str) -> Option<i64> {
    let s = s.trim();
    let b = s.as_bytes();
    if b.len() < 19 || !(b[10] == b' ' || b[10] == b'T') {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let t = s.get(r)?;
        if t.bytes().all(|c| c.is_ascii_digit()) {
            t.parse().ok()
        } else {
            None
        }
    };
    if b[4] != b'-' || b[7] != b'-' || b[13] != b':' || b[16] != b':' {
        return None;
    }
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let mut rest = &s[19..];
    let mut frac_ns = 0i64;
    if let Some(f) = rest.strip_prefix('.') {
        let digits = f.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let mut scale = 100_000_000i64;
        for c in f[..digits].bytes() {
            frac_ns += i64::from(c - b'0') * scale;
            scale /= 10;
        }
        rest = &f[digits..];
    }
    let offset_s = match rest {
        "" | "Z" => 0,
        _ => {
            let sign = match rest.as_bytes()[0] {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let o = &rest[1..];
            if o.len() != 5 || o.as_bytes()[2] != b':' {
                return None;
            }
            let oh: i64 = o[..2].parse().ok()?;
            let om: i64 = o[3..].parse().ok()?;
            sign * (oh * 3600 + om * 60)
        }
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + h * 3600 + mi * 60 + sec - offset_s;
    Some(secs * 1_000_000_000 + frac_ns)
}

/// The JSON field `name` of a row, or an error saying it is missing.
fn field<'a>(
    path: &Path,
    line: usize,
    obj: &'a Map<String, Value>,
    name: &str,
) -> Result<&'a Value, SimError> {
    obj.get(name)
        .ok_or_else(|| parse_err(path, line, format!("missing field '{name}'")))
}

fn json_tokens(
    path: &Path,
    line: usize,
    obj: &Map<String, Value>,
    name: &str,
) -> Result<u32, SimError> {
    let v = field(path, line, obj, name)?;
    v.as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| {
            parse_err(
                path,
                line,
                format!("'{name}' must be a whole number of tokens below 2^32, not {v}"),
            )
        })
}

fn json_ms(
    path: &Path,
    line: usize,
    obj: &Map<String, Value>,
    name: &str,
) -> Result<f64, SimError> {
    let v = field(path, line, obj, name)?;
    let ms = v.as_f64().ok_or_else(|| {
        parse_err(
            path,
            line,
            format!("'{name}' must be a number of ms, not {v}"),
        )
    })?;
    check_arrival(path, line, name, ms)
}

/// Appends the row's `hash_ids` (absent or null: none) to `out` and returns their span.
fn json_hash_ids(
    path: &Path,
    line: usize,
    obj: &Map<String, Value>,
    out: &mut Vec<u64>,
) -> Result<IdSpan, SimError> {
    let start = out.len();
    let list = match obj.get("hash_ids") {
        None | Some(Value::Null) => return Ok(IdSpan::default()),
        Some(Value::Array(list)) => list,
        Some(v) => {
            return Err(parse_err(
                path,
                line,
                format!("'hash_ids' must be a list of integers, not {v}"),
            ))
        }
    };
    for (i, v) in list.iter().enumerate() {
        let id = v.as_u64().ok_or_else(|| {
            parse_err(
                path,
                line,
                format!("'hash_ids' must be a list of integers >= 0: element {i} is {v}"),
            )
        })?;
        out.push(id);
    }
    let too_many = || parse_err(path, line, "the trace has over 4G block ids");
    Ok(IdSpan {
        start: u32::try_from(start).map_err(|_| too_many())?,
        len: u32::try_from(list.len()).map_err(|_| too_many())?,
    })
}

fn read_jsonl<R: BufRead>(lines: &mut Lines<'_, R>) -> Result<Trace, SimError> {
    let path = lines.path;
    let mut trace: Option<Trace> = None;
    while let Some((line, l)) = lines.next(false)? {
        let obj: Map<String, Value> = serde_json::from_str(l)
            .map_err(|e| parse_err(path, line, format!("not a JSON object: {e}")))?;
        let t = trace.get_or_insert_with(|| {
            new_trace(
                if obj.contains_key("timestamp") || obj.contains_key("input_length") {
                    TraceDialect::Mooncake
                } else {
                    TraceDialect::Abe
                },
            )
        });
        let row = match t.dialect {
            TraceDialect::Mooncake => TraceRow {
                arrival_ms: json_ms(path, line, &obj, "timestamp")?,
                prompt_tokens: json_tokens(path, line, &obj, "input_length")?,
                output_tokens: json_tokens(path, line, &obj, "output_length")?,
                priority: None,
                ids: json_hash_ids(path, line, &obj, &mut t.hash_ids)?,
            },
            _ => TraceRow {
                arrival_ms: json_ms(path, line, &obj, "arrival_ms")?,
                prompt_tokens: json_tokens(path, line, &obj, "prompt_tokens")?,
                output_tokens: json_tokens(path, line, &obj, "output_tokens")?,
                priority: match obj.get("priority") {
                    None | Some(Value::Null) => None,
                    Some(Value::String(s)) => priority(path, line, s)?,
                    Some(v) => {
                        return Err(parse_err(
                            path,
                            line,
                            format!("'priority' must be a string, not {v}"),
                        ))
                    }
                },
                ids: json_hash_ids(path, line, &obj, &mut t.hash_ids)?,
            },
        };
        t.rows.push(row);
    }
    Ok(trace.unwrap_or_else(|| new_trace(TraceDialect::Abe)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str, format: TraceFormat) -> String {
        let name = match format {
            TraceFormat::Csv => "t.csv",
            TraceFormat::Jsonl => "t.jsonl",
        };
        parse(Path::new(name), text, format)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn csv_with_reordered_columns_and_jsonl_give_the_same_sorted_rows() {
        let p = Path::new("t.csv");
        let csv = "# a trace\noutput_tokens,arrival_ms,prompt_tokens,priority\n20,5.5,100,high\n\n10,1.0,50,\n";
        let jsonl = r#"{"arrival_ms": 5.5, "prompt_tokens": 100, "output_tokens": 20, "priority": "high"}
{"arrival_ms": 1.0, "prompt_tokens": 50, "output_tokens": 10}"#;
        let a = parse(p, csv, TraceFormat::Csv).unwrap();
        let b = parse(Path::new("t.jsonl"), jsonl, TraceFormat::Jsonl).unwrap();
        assert_eq!(a.rows, b.rows);
        assert_eq!(a.dialect, TraceDialect::Abe);
        assert_eq!(a.rows[0].arrival_ms, 1.0);
        assert_eq!(a.rows[0].priority, None);
        assert_eq!(a.rows[1].priority, Some(Priority::High));
        assert!(!a.has_hash_ids());
    }

    #[test]
    fn errors_name_the_file_line_and_problem() {
        let e = err("arrival_ms,prompt_tokens\n1,2\n", TraceFormat::Csv);
        assert!(
            e.starts_with("t.csv:1: the header has no 'output_tokens'"),
            "{e}"
        );
        let e = err(
            "arrival_ms,prompt_tokens,output_tokens\n1,x,3\n",
            TraceFormat::Csv,
        );
        assert!(e.starts_with("t.csv:2: prompt_tokens"), "{e}");
        let e = err(
            "arrival_ms,prompt_tokens,output_tokens,priority\n1,2,3,urgent\n",
            TraceFormat::Csv,
        );
        assert!(e.contains("unknown priority 'urgent'"));
        assert_eq!(
            TraceFormat::from_path(Path::new("a.jsonl")),
            TraceFormat::Jsonl
        );
    }

    #[test]
    fn azure_timestamps_become_ms_after_the_first_row() {
        let csv = "TIMESTAMP,ContextTokens,GeneratedTokens\n\
                   2023-11-16 18:15:46.6805900,374,44\n\
                   2023-11-16 18:15:50.9951690,396,109\n\
                   2023-11-17 00:00:00,10,1\n";
        let t = parse(Path::new("az.csv"), csv, TraceFormat::Csv).unwrap();
        assert_eq!(t.dialect, TraceDialect::Azure);
        let got: Vec<(f64, u32, u32)> = t
            .rows
            .iter()
            .map(|r| (r.arrival_ms, r.prompt_tokens, r.output_tokens))
            .collect();
        assert_eq!(got[0], (0.0, 374, 44));
        assert!((got[1].0 - 4314.579).abs() < 1e-6, "{}", got[1].0);
        // Across midnight: 5 h 44 min 13.31941 s after the first.
        assert!((got[2].0 - 20_653_319.41).abs() < 1e-3, "{}", got[2].0);
        assert_eq!(
            parse_wall_clock("1970-01-02T00:00:01.5Z"),
            Some(86_401_500_000_000)
        );
        assert_eq!(
            parse_wall_clock("1970-01-01 01:00:00+01:00"),
            Some(0),
            "an offset is subtracted"
        );
    }

    #[test]
    fn mooncake_rows_keep_their_hash_ids_in_order() {
        let jsonl = "{\"timestamp\": 40, \"input_length\": 1100, \"output_length\": 3, \"hash_ids\": [0, 1, 5]}\n\
                     {\"timestamp\": 0, \"input_length\": 600, \"output_length\": 6, \"hash_ids\": [0, 2], \"extra\": 1}\n";
        let t = parse(Path::new("m.jsonl"), jsonl, TraceFormat::Jsonl).unwrap();
        assert_eq!(t.dialect, TraceDialect::Mooncake);
        assert_eq!(t.block_tokens, 512);
        assert_eq!(t.rows[0].arrival_ms, 0.0);
        assert_eq!(t.ids(&t.rows[0]), &[0, 2]);
        assert_eq!(t.ids(&t.rows[1]), &[0, 1, 5]);
        assert_eq!(t.rows[1].prompt_tokens, 1100);
    }

    #[test]
    fn a_missing_or_mistyped_field_names_it() {
        let j = TraceFormat::Jsonl;
        let ok = "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1}\n";
        let e = err(
            &format!("{ok}{{\"timestamp\": 1, \"input_length\": 5}}\n"),
            j,
        );
        assert!(
            e.starts_with("t.jsonl:2: missing field 'output_length'"),
            "{e}"
        );
        let e = err(
            "{\"timestamp\": 1, \"input_length\": \"5\", \"output_length\": 1}\n",
            j,
        );
        assert!(
            e.starts_with("t.jsonl:1: 'input_length' must be a whole number"),
            "{e}"
        );
        let e = err(
            "{\"timestamp\": 1, \"input_length\": -5, \"output_length\": 1}\n",
            j,
        );
        assert!(e.contains("'input_length'"), "{e}");
        let e = err(
            "arrival_ms,prompt_tokens,output_tokens\n1,2\n",
            TraceFormat::Csv,
        );
        assert!(
            e.starts_with("t.csv:2: missing column 'output_tokens'"),
            "{e}"
        );
        let e = err(&format!("{ok}\n[1, 2]\n"), j);
        assert!(e.starts_with("t.jsonl:3: not a JSON object"), "{e}");
    }

    #[test]
    fn a_timestamp_that_does_not_parse_is_an_error() {
        let e = err(
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.5,1,1\n2023-13-16 18:15:46,1,1\n",
            TraceFormat::Csv,
        );
        assert!(
            e.starts_with("t.csv:3: TIMESTAMP '2023-13-16 18:15:46' does not parse"),
            "{e}"
        );
        let e = err(
            "{\"timestamp\": \"noon\", \"input_length\": 1, \"output_length\": 1}\n",
            TraceFormat::Jsonl,
        );
        assert!(
            e.starts_with("t.jsonl:1: 'timestamp' must be a number of ms"),
            "{e}"
        );
        let e = err(
            "{\"timestamp\": -3, \"input_length\": 1, \"output_length\": 1}\n",
            TraceFormat::Jsonl,
        );
        assert!(e.starts_with("t.jsonl:1: timestamp -3 must be"), "{e}");
        let e = err(
            "arrival_ms,prompt_tokens,output_tokens\nsoon,1,1\n",
            TraceFormat::Csv,
        );
        assert!(e.starts_with("t.csv:2: arrival_ms:"), "{e}");
    }

    #[test]
    fn an_empty_file_is_an_error() {
        for f in [TraceFormat::Csv, TraceFormat::Jsonl] {
            let e = err("", f);
            assert!(e.contains(":0: empty file"), "{e}");
        }
        let e = err(
            "arrival_ms,prompt_tokens,output_tokens\n\n",
            TraceFormat::Csv,
        );
        assert!(e.starts_with("t.csv:2: the trace has no requests"), "{e}");
        let e = err("\n\n", TraceFormat::Jsonl);
        assert!(e.starts_with("t.jsonl:2: the trace has no requests"), "{e}");
    }

    #[test]
    fn hash_ids_must_be_a_list_of_integers() {
        let row = |ids: &str| {
            format!("{{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": {ids}}}\n")
        };
        let e = err(&row("\"0,1\""), TraceFormat::Jsonl);
        assert!(
            e.starts_with("t.jsonl:1: 'hash_ids' must be a list of integers"),
            "{e}"
        );
        let e = err(&row("[0, 1.5]"), TraceFormat::Jsonl);
        assert!(e.contains("element 1 is 1.5"), "{e}");
        let e = err(&row("[0, -1]"), TraceFormat::Jsonl);
        assert!(e.contains("element 1 is -1"), "{e}");
        let t = parse(Path::new("t.jsonl"), &row("[]"), TraceFormat::Jsonl).unwrap();
        assert!(!t.has_hash_ids());
    }

    /// A reader that makes up a trace one line at a time: the file never exists as a whole.
    struct MadeUp {
        lines: u32,
        next: u32,
        pending: Vec<u8>,
        at: usize,
    }

    impl Read for MadeUp {
        fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
            if self.at == self.pending.len() {
                if self.next > self.lines {
                    return Ok(0);
                }
                self.pending.clear();
                if self.next == 0 {
                    self.pending
                        .extend_from_slice(b"TIMESTAMP,ContextTokens,GeneratedTokens\n");
                } else {
                    let t = u64::from(self.next);
                    let line = format!(
                        "2023-11-16 {:02}:{:02}:{:02}.{:07},{},{}\n",
                        t / 3600 % 24,
                        t / 60 % 60,
                        t % 60,
                        t % 10_000_000,
                        t % 4000,
                        t % 500
                    );
                    self.pending.extend_from_slice(line.as_bytes());
                }
                self.next += 1;
                self.at = 0;
            }
            let n = out.len().min(self.pending.len() - self.at);
            out[..n].copy_from_slice(&self.pending[self.at..self.at + n]);
            self.at += n;
            Ok(n)
        }
    }

    #[test]
    fn a_million_line_trace_streams() {
        let lines = 1_000_000;
        let src = MadeUp {
            lines,
            next: 0,
            pending: Vec::new(),
            at: 0,
        };
        let t = read(
            Path::new("big.csv"),
            BufReader::with_capacity(8 * 1024, src),
            TraceFormat::Csv,
        )
        .unwrap();
        assert_eq!(t.rows.len(), lines as usize);
        assert_eq!(t.rows[0].arrival_ms, 0.0);
        assert!(t
            .rows
            .windows(2)
            .all(|w| w[0].arrival_ms <= w[1].arrival_ms));
    }

    #[test]
    fn a_line_over_one_mib_is_refused_without_reading_it_whole() {
        let ok = "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1}\n";
        let mut text = ok.to_string();
        text.push_str(&" ".repeat(MAX_LINE_BYTES + 1));
        text.push('\n');
        let e = err(&text, TraceFormat::Jsonl);
        assert!(
            e.starts_with("t.jsonl:2: line longer than 1048576 bytes"),
            "{e}"
        );
        // Exactly the limit is fine (then the newline).
        let mut text = ok.to_string();
        text.push_str(&" ".repeat(MAX_LINE_BYTES));
        text.push('\n');
        assert_eq!(
            parse(Path::new("t.jsonl"), &text, TraceFormat::Jsonl)
                .unwrap()
                .rows
                .len(),
            1
        );
    }
}
