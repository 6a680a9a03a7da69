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

/// Asserts that `e`, `reader`'s refusal of a backend's answer, says where and why: serde's
/// "unexpected JSON at `path`: reason" with a reason, or one of `wire`'s own sentences.
/// What a client is told when its backend's answer is refused is this message.
fn assert_says_why(reader: &str, e: &str) {
    let says = match e.strip_prefix("unexpected JSON at `") {
        Some(rest) => rest
            .split_once("`: ")
            .is_some_and(|(_, why)| !why.trim().is_empty()),
        None => e == "the answer has no choices",
    };
    assert!(says, "{reader}: a refusal that does not say why: {e:?}");
}

/// What each JSON reader makes of `text` as a backend's answer: completions and chat
/// (choices or the error), embeddings, and a stream chunk of each kind. Asserts that every
/// refusal says why ([`assert_says_why`]); an error the backend reports inside a stream is
/// relayed as the backend wrote it.
pub fn json_outcomes(text: &str) -> String {
    // Where and why, without the quoted values and positions that make every error new.
    let rule = |e: &str| -> String {
        let head = e.split(['\'', '"']).next().unwrap_or("");
        head.chars().filter(|c| !c.is_ascii_digit()).collect()
    };
    let why = |reader: &'static str| {
        move |e: String| {
            assert_says_why(reader, &e);
            rule(&e)
        }
    };
    let chunk = |chat: bool| match wire::parse_chunk(text, chat) {
        Ok(_) => "ok".to_string(),
        Err(wire::ChunkError::Upstream(_)) => "upstream".to_string(),
        Err(wire::ChunkError::Invalid(e)) => why("stream chunk")(e),
    };
    let outcomes = (
        wire::parse_completions(text)
            .map(|r| r.choices.len())
            .map_err(why("completions")),
        wire::parse_chat(text)
            .map(|r| r.choices.len())
            .map_err(why("chat")),
        wire::parse_embeddings(text)
            .map(|_| ())
            .map_err(why("embeddings")),
        chunk(false),
        chunk(true),
    );
    format!("{outcomes:?}")
}
