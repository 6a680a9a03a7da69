//! A reader of server-sent events as OpenAI-compatible backends stream them: `data:` lines,
//! an event per blank line, `data: [DONE]` at the end; comments, `event:`, `id:` and `retry:`
//! lines are skipped.
//!
//! What must never happen here: an unbounded line or event (a backend that never sends a
//! newline must not grow memory forever), or any knowledge of what the JSON inside means.

use std::io::{self, BufRead, Read};

/// Longest event a backend may send (one chunk of a stream is well under 1 KiB).
pub(super) const EVENT_BYTES_MAX: usize = 1 << 20;

/// The next thing in a stream.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum SseEvent<'a> {
    /// An event's data (its `data:` lines joined with '\n').
    Data(&'a str),
    /// `data: [DONE]`.
    Done,
    /// The body ended without `[DONE]`.
    Eof,
}

/// Reads events from a response body. `data` holds the event being assembled; invariant:
/// `data.len() + line.len() <= EVENT_BYTES_MAX` between reads.
pub(super) struct SseReader<R> {
    reader: R,
    line: String,
    data: String,
}

impl<R: BufRead> SseReader<R> {
    pub(super) fn new(reader: R) -> Self {
        SseReader {
            reader,
            line: String::new(),
            data: String::new(),
        }
    }

    /// The next event; an io error of kind `InvalidData` for an over-long event or a line
    /// that is not UTF-8.
    pub(super) fn next_event(&mut self) -> io::Result<SseEvent<'_>> {
        self.data.clear();
        let mut has_data = false;
        loop {
            self.line.clear();
            let room = EVENT_BYTES_MAX.saturating_sub(self.data.len());
            // `room + 1`: a line of exactly `room` bytes plus its newline still fits.
            let limit = u64::try_from(room).unwrap_or(u64::MAX).saturating_add(1);
            let n = (&mut self.reader).take(limit).read_line(&mut self.line)?;
            if n == 0 {
                // End of body: an event not closed by a blank line still counts.
                return Ok(if has_data {
                    self.finish()
                } else {
                    SseEvent::Eof
                });
            }
            if !self.line.ends_with('\n') && n as u64 >= limit {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("a stream event is longer than {EVENT_BYTES_MAX} bytes"),
                ));
            }
            let line = self.line.trim_end_matches(['\r', '\n']);
            if line.is_empty() {
                if has_data {
                    return Ok(self.finish());
                }
                continue;
            }
            let Some(value) = line.strip_prefix("data:") else {
                // Comments (":"), event:, id:, retry: carry nothing abe uses.
                continue;
            };
            let value = value.strip_prefix(' ').unwrap_or(value);
            if has_data {
                self.data.push('\n');
            }
            self.data.push_str(value);
            has_data = true;
        }
    }

    fn finish(&self) -> SseEvent<'_> {
        if self.data.trim() == "[DONE]" {
            SseEvent::Done
        } else {
            SseEvent::Data(&self.data)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(input: &str) -> Vec<String> {
        let mut r = SseReader::new(input.as_bytes());
        let mut out = Vec::new();
        loop {
            match r.next_event().unwrap() {
                SseEvent::Data(d) => out.push(d.to_string()),
                SseEvent::Done => {
                    out.push("DONE".into());
                    return out;
                }
                SseEvent::Eof => {
                    out.push("EOF".into());
                    return out;
                }
            }
        }
    }

    #[test]
    fn reads_data_events_until_done() {
        let input = ": keep-alive\r\n\r\ndata: {\"a\":1}\r\n\r\nevent: x\ndata:{\"b\":2}\n\ndata: [DONE]\n\n";
        assert_eq!(events(input), vec![r#"{"a":1}"#, r#"{"b":2}"#, "DONE"]);
    }

    #[test]
    fn joins_multi_line_data_and_reports_eof() {
        assert_eq!(events("data: a\ndata: b\n\n"), vec!["a\nb", "EOF"]);
        assert_eq!(events("data: last"), vec!["last", "EOF"]);
        assert_eq!(events(""), vec!["EOF"]);
    }

    #[test]
    fn refuses_an_endless_line() {
        let long = format!("data: {}", "x".repeat(EVENT_BYTES_MAX + 10));
        let mut r = SseReader::new(long.as_bytes());
        let err = r.next_event().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }
}
