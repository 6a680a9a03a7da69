//! Fuzz campaigns (see `crate::fuzz`) over what a backend sends back: the SSE reader, byte
//! by byte and whole, and the JSON answers of completions, chat, embeddings and stream
//! chunks. Test-only; here because the readers are private to `upstream`. Seeds:
//! `fuzz/corpus/upstream_sse/`, `fuzz/corpus/upstream_json/`.
//!
//! What must never happen: a panic on any bytes a backend sends, an event past
//! `EVENT_BYTES_MAX`, or a reader whose events depend on how the body was split.

use super::fuzzing::{json_outcomes, sse_events as events};
use crate::fuzz::{seeds_from_dir, signature, Campaign};
use std::path::Path;

const SSE_DICTIONARY: &[&[u8]] = &[
    b"\n",
    b"\r\n",
    b"\r",
    b"\n\n",
    b"data:",
    b"data: ",
    b"data: [DONE]\n\n",
    b"[DONE]",
    b": comment\n",
    b"event: x\n",
    b"\xff",
    b"\xe2\x82",
    b"{\"choices\":[{\"text\":\"a\"}]}",
];

const JSON_DICTIONARY: &[&[u8]] = &[
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b":",
    b"\"",
    b"null",
    b"true",
    b"\\u0000",
    b"\\ud800",
    b"\"choices\":",
    b"\"index\":",
    b"\"text\":",
    b"\"delta\":{\"content\":\"x\"}",
    b"\"message\":",
    b"\"embedding\":",
    b"\"finish_reason\":\"stop\"",
    b"\"usage\":",
    b"\"error\":",
    b"\"tool_calls\":[]",
];

fn corpus(name: &str) -> Vec<Vec<u8>> {
    seeds_from_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fuzz/corpus")
            .join(name),
    )
}

#[test]
fn sse_events_are_the_same_read_whole_or_byte_by_byte() {
    let report = Campaign::new(
        "upstream_sse",
        corpus("upstream_sse"),
        SSE_DICTIONARY,
        8192,
        3_000,
    )
    .run(|input| {
        let whole = events(input, 8192);
        assert_eq!(whole, events(input, 1), "split reads differ");
        let kinds: Vec<&str> = whole.iter().map(|e| &e[..4]).collect();
        signature(kinds)
    });
    eprintln!("{report}");
}

/// Every refusal says where and why (`fuzzing::json_outcomes` asserts it on every input),
/// and the campaign reaches both: answers that parse, and refusals of each reader.
#[test]
fn json_answers_parse_or_say_why() {
    let report = Campaign::new(
        "upstream_json",
        corpus("upstream_json"),
        JSON_DICTIONARY,
        8192,
        5_000,
    )
    .run(|input| signature(json_outcomes(&String::from_utf8_lossy(input))));
    eprintln!("{report}");
    // The check is not vacuous: well-formed answers parse, and each reader refuses
    // malformed ones with a reason.
    let ok = json_outcomes(r#"{"choices":[{"text":"a","message":{"content":"a"}}]}"#);
    assert!(ok.starts_with("(Ok(1), Ok(1), Err("), "{ok}");
    let refused = json_outcomes(r#"{"choices":[{"text":7}]}"#);
    assert!(
        refused.starts_with("(Err(\"unexpected JSON at `choices[].text`: "),
        "{refused}"
    );
    let no_choices = json_outcomes(r#"{"choices":[]}"#);
    assert!(
        no_choices.contains("Err(\"the answer has no choices\")"),
        "{no_choices}"
    );
}
