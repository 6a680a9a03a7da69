//! The backend-answer readers as plain functions over bytes, for the fuzz campaigns: the
//! stable mutation fuzzer (`fuzz.rs` beside this file) and the coverage-guided cargo-fuzz
//! targets (`fuzz/fuzz_targets/`, a crate of its own, which can only reach `pub` items).
//! The readers themselves stay private to `upstream`; this is the whole surface they get.
//!
//! Built with the `testing` feature or under `cfg(test)` only. What must never happen here:
//! anything the executor calls (this is for fuzzing only), or a result that depends on
//! anything but the input.

use super::sse::{SseEvent, SseReader, EVENT_BYTES_MAX};
use super::wire;
use std::io::BufReader;

/// Every event of `body` read through a buffer of `capacity` bytes, as text (`data ...`,
/// `done`); an error ends the list with its kind. Asserts each event is within
/// `EVENT_BYTES_MAX` and that the reader reaches the end of the body.
pub fn sse_events(body: &[u8], capacity: usize) -> Vec<String> {
    let mut reader = SseReader::new(BufReader::with_capacity(capacity.max(1), body));
    let mut out = Vec::new();
    // Each event consumes at least one byte, so the body's length bounds the loop.
    for _ in 0..=body.len() + 1 {
        match reader.next_event() {
            Ok(SseEvent::Data(d)) => {
                assert!(d.len() <= EVENT_BYTES_MAX);
                out.push(format!("data {d}"));
            }
            Ok(SseEvent::Done) => {
                out.push("done".into());
                return out;
            }
            Ok(SseEvent::Eof) => return out,
            Err(e) => {
                out.push(format!("error {:?}", e.kind()));
                return out;
            }
        }
    }
    panic!(
        "the reader did not reach the end of a {}-byte body",
        body.len()
    );
}

/// What each JSON reader makes of `text` as a backend's answer: completions and chat
/// (choices or the error), embeddings, and a stream chunk of each kind.
pub fn json_outcomes(text: &str) -> String {
    // Where and why, without the quoted values and positions that make every error new.
    let rule = |e: &str| -> String {
        let head = e.split(['\'', '"']).next().unwrap_or("");
        head.chars().filter(|c| !c.is_ascii_digit()).collect()
    };
    let outcomes = (
        wire::parse_completions(text)
            .map(|r| r.choices.len())
            .map_err(|e| rule(&e)),
        wire::parse_chat(text)
            .map(|r| r.choices.len())
            .map_err(|e| rule(&e)),
        wire::parse_embeddings(text)
            .map(|_| ())
            .map_err(|e| rule(&e)),
        wire::parse_chunk(text, false).is_ok(),
        wire::parse_chunk(text, true).is_ok(),
    );
    format!("{outcomes:?}")
}
