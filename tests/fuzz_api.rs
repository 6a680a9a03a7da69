//! Fuzzing request decoding for every engine endpoint through a live server (see
//! `abe::fuzz`): an input is a path line, then a JSON body, POSTed as is. Every answer must
//! be a success of the endpoint's shape or an OpenAI-shaped client error; never a 5xx, a
//! hang, or a dead server. Seeds: `fuzz/corpus/api/`.

use crate::common;

use abe::fuzz::{seeds_from_dir, signature, Campaign};
use common::Client;
use std::path::Path;

const DICTIONARY: &[&[u8]] = &[
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b":",
    b"\"",
    b"null",
    b"true",
    b"false",
    b"\\u0000",
    b"\\ud800",
    b"\\\"",
    b"\"prompt\":",
    b"\"messages\":",
    b"\"input\":",
    b"\"model\":\"abe-sim\"",
    b"\"model\":\"\"",
    b"\"max_tokens\":",
    b"\"n\":",
    b"\"stream\":true",
    b"\"stop\":",
    b"\"role\":\"user\"",
    b"\"content\":",
    b"\"type\":\"image_url\"",
    b"\"tools\":[{}]",
    b"\"dimensions\":",
    b"\"encoding_format\":\"base64\"",
    b"\"priority\":\"critical\"",
    b"/v1/completions\n",
    b"/v1/chat/completions\n",
    b"/v1/embeddings\n",
];

#[test]
fn request_bodies_get_an_answer_of_their_shape_or_a_clear_client_error() {
    let mut cfg = common::test_config();
    // Answer as soon as a worker is free: the campaign measures decoding, not batching.
    cfg.batching.strategy = abe::core::strategy::StrategyKind::Fixed;
    cfg.batching.max_batch_size = 1;
    cfg.server.max_body_bytes = 16 * 1024;
    let abe = common::start(cfg);
    let addr = abe.local_addr();
    let mut conn = Client::connect(addr);
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/api");
    let report = Campaign::new("api", seeds_from_dir(&dir), DICTIONARY, 8192, 3_000).run(|input| {
        let text = String::from_utf8_lossy(input);
        let (path, body) = text.split_once('\n').unwrap_or(("/v1/completions", &text));
        // A path that is not a request target is the head fuzzer's business.
        let path = if path.starts_with('/') && path.bytes().all(|b| b.is_ascii_graphic()) {
            path
        } else {
            "/v1/completions"
        };
        let r = conn.request("POST", path, Some(body));
        assert!(
            r.status == 200 || (400..500).contains(&r.status),
            "{} {path}: {}",
            r.status,
            r.text()
        );
        let kind = if r.status == 200 {
            let content_type = r.header("content-type").unwrap_or("");
            if content_type.starts_with("text/event-stream") {
                let body = r.text();
                assert!(body.trim_end().ends_with("data: [DONE]"), "{body}");
                "stream".to_string()
            } else {
                r.json()["object"].as_str().unwrap_or("?").to_string()
            }
        } else {
            let message = r.error_message(); // asserts the OpenAI error shape
            message
                .split(['\'', '"'])
                .next()
                .unwrap_or("")
                .chars()
                .filter(|c| !c.is_ascii_digit())
                .collect()
        };
        if r.header("connection") == Some("close") {
            conn = Client::connect(addr);
        }
        signature((r.status, path.len(), kind))
    });
    eprintln!("{report}");
    let mut c = Client::connect(addr);
    assert_eq!(c.request("GET", "/health", None).status, 200);
    abe.shutdown();
}

/// The body scanner (`abe::api::body_scan`) against serde on mutated bodies: whenever it
/// reads a completion or chat body, serde reads the same one (every field, through
/// `Debug`), and it never reads one serde refuses. No server: the two parsers side by side.
#[test]
fn the_body_scanner_reads_exactly_what_serde_reads() {
    use abe::api::body_scan::{scan_chat, scan_completion};
    use abe::api::wire::{parse_body, ChatBody, CompletionBody};
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/api");
    // The corpus files are "path\nbody"; the scanner sees bodies.
    let mut seeds: Vec<Vec<u8>> = seeds_from_dir(&dir)
        .into_iter()
        .map(|s| match s.iter().position(|&b| b == b'\n') {
            Some(i) if s.first() == Some(&b'/') => s[i + 1..].to_vec(),
            _ => s,
        })
        .collect();
    seeds.push(br#"{"model":"abe-sim","prompt":"hi","max_tokens":1}"#.to_vec());
    seeds.push(
        br#"{"model":"abe-sim","messages":[{"role":"user","content":"hi"}],"max_tokens":1}"#
            .to_vec(),
    );
    let report = Campaign::new("body_scan", seeds, DICTIONARY, 1024, 20_000).run(|body| {
        let completion = scan_completion(body).map(|scanned| {
            let serde: CompletionBody = parse_body(body)
                .unwrap_or_else(|e| panic!("scanned, serde refused {body:?}: {e:?}"));
            assert_eq!(format!("{scanned:?}"), format!("{serde:?}"), "{body:?}");
        });
        let chat = scan_chat(body).map(|scanned| {
            let serde: ChatBody = parse_body(body)
                .unwrap_or_else(|e| panic!("scanned, serde refused {body:?}: {e:?}"));
            assert_eq!(format!("{scanned:?}"), format!("{serde:?}"), "{body:?}");
        });
        let serde_ok = (
            parse_body::<CompletionBody>(body).is_ok(),
            parse_body::<ChatBody>(body).is_ok(),
        );
        signature((completion.is_some(), chat.is_some(), serde_ok))
    });
    eprintln!("{report}");
}
