//! Failures by kind (`api::faults`), as the client of a gateway under test sees them: each
//! HTTP kind at rate 1 answers with its status, its OpenAI error body and `x-abe-fault`;
//! each stream kind does to the stream what it says, after N events. Both batching modes;
//! set through the `[workers] fault_*` keys and through `POST /admin/faults`.

use crate::common;

use abe::config::Config;
use abe::core::BatchingMode;
use common::{start, test_config, Client, MODES};
use std::io::{BufRead, Read};
use std::time::{Duration, Instant};

const AUTH: [(&str, &str); 1] = [("Authorization", "Bearer t0ken")];

fn config(mode: BatchingMode) -> Config {
    let mut c = test_config();
    c.batching.mode = mode;
    c.server.admin_token = "t0ken".into();
    c
}

fn sse_events(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            e.strip_prefix("data: ")
                .expect("an SSE data line")
                .to_string()
        })
        .collect()
}

#[test]
fn each_http_kind_answers_with_its_status_openai_body_and_fault_header() {
    for mode in MODES {
        let abe = start(config(mode));
        let mut c = Client::connect(abe.local_addr());
        let cases: [(&str, u16, &str); 6] = [
            ("rate_limited_rate", 429, "Rate limit"),
            ("unauthorized_rate", 401, "API key"),
            ("context_length_rate", 400, "maximum context length is"),
            ("model_not_found_rate", 404, "does not exist"),
            ("internal_error_rate", 500, "server had an error"),
            ("unavailable_rate", 503, "overloaded"),
        ];
        for (key, status, says) in cases {
            // Only this kind, at rate 1 (the others back to 0).
            let mut body = serde_json::Map::new();
            for (k, _, _) in cases {
                body.insert(k.into(), f64::from(u8::from(k == key)).into());
            }
            body.insert("retry_after_s".into(), 3.into());
            let body = serde_json::Value::Object(body).to_string();
            let r = c.request_with("POST", "/admin/faults", Some(&body), &AUTH);
            assert_eq!(r.status, 200, "{}", r.text());
            for (path, req) in [
                (
                    "/v1/completions",
                    r#"{"model":"abe-sim","prompt":"hello there","max_tokens":4}"#,
                ),
                (
                    "/v1/chat/completions",
                    r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":4}"#,
                ),
                ("/v1/embeddings", r#"{"input":"embed me"}"#),
            ] {
                let r = c.request("POST", path, Some(req));
                assert_eq!(r.status, status, "{mode:?} {key} {path}: {}", r.text());
                let message = r.error_message();
                assert!(message.contains(says), "{key}: {message}");
                let kind = key.trim_end_matches("_rate");
                assert_eq!(r.header("x-abe-fault"), Some(kind));
                if status == 429 {
                    assert_eq!(r.header("retry-after"), Some("3"));
                }
            }
        }
        // vLLM's words, with the request's own numbers (4 max_tokens).
        let r = c.request_with(
            "POST",
            "/admin/faults",
            Some(r#"{"unavailable_rate":0,"context_length_rate":1}"#),
            &AUTH,
        );
        assert_eq!(r.status, 200);
        let r = c.request(
            "POST",
            "/v1/completions",
            Some(r#"{"prompt":"one two three four five six seven eight","max_tokens":4}"#),
        );
        let message = r.error_message();
        assert!(
            message.contains("in the messages, 4 in the completion"),
            "{message}"
        );
        assert_eq!(r.json()["error"]["type"], "invalid_request_error");
        // The counters say how many were injected; off again, requests are served.
        let r = c.request_with(
            "POST",
            "/admin/faults",
            Some(r#"{"context_length_rate":0}"#),
            &AUTH,
        );
        let injected = &r.json()["injected"];
        assert_eq!(injected["rate_limited"], 3, "{injected}");
        assert_eq!(injected["context_length"], 4, "{injected}");
        let r = c.request(
            "POST",
            "/v1/completions",
            Some(r#"{"prompt":"x","max_tokens":2}"#),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-abe-fault"), None);
        let report = abe.shutdown();
        // Injected answers never reached the engine: nothing admitted but the last one.
        assert_eq!((report.completed, report.failed), (1, 0), "{mode:?}");
    }
}

#[test]
fn fault_keys_are_checked_and_the_config_keys_arm_them_at_start() {
    let mut cfg = config(BatchingMode::Request);
    cfg.workers.fault_unauthorized_rate = 1.0;
    let abe = start(cfg.clone());
    let mut c = Client::connect(abe.local_addr());
    let r = c.request("POST", "/v1/completions", Some(r#"{"prompt":"x"}"#));
    assert_eq!(r.status, 401, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "invalid_api_key");
    for (body, says) in [
        (r#"{"stream_cut_rate":2}"#, "stream_cut_rate must be 0..=1"),
        (
            r#"{"unauthorized_rate":0.6,"unavailable_rate":0.6}"#,
            "sum to",
        ),
        (r#"{"no_such_rate":0}"#, "unknown field 'no_such_rate'"),
    ] {
        let r = c.request_with("POST", "/admin/faults", Some(body), &AUTH);
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        assert!(r.error_message().contains(says), "{body}: {}", r.text());
    }
    // Refusals changed nothing.
    let r = c.request_with("GET", "/admin/faults", None, &AUTH);
    assert_eq!(r.json()["unauthorized_rate"], 1.0);
    assert_eq!(r.json()["unavailable_rate"], 0.0);
    abe.shutdown();
    cfg.workers.fault_internal_error_rate = 0.5;
    cfg.workers.fault_unauthorized_rate = 0.6;
    let err = abe::serve::Running::start(cfg).err().expect("refused");
    assert!(err.to_string().contains("fault_"), "{err}");
}

/// A streamed completion request of 8 tokens on a fresh connection.
fn stream_request(c: &mut Client) {
    c.send_raw(&common::request_bytes(
        "POST",
        "/v1/completions",
        Some(r#"{"prompt":"stream faults","max_tokens":8,"stream":true}"#),
        &[],
    ));
}

fn set_stream_fault(addr: std::net::SocketAddr, body: &str) {
    let mut c = Client::connect(addr);
    let r = c.request_with("POST", "/admin/faults", Some(body), &AUTH);
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn a_cut_stream_ends_after_n_events_without_done_or_finish() {
    for mode in MODES {
        let mut cfg = config(mode);
        cfg.workers.fault_stream_cut_rate = 1.0;
        cfg.workers.fault_stream_after_chunks = 3;
        let abe = start(cfg);
        let mut c = Client::connect(abe.local_addr());
        stream_request(&mut c);
        let r = c.read_response().expect("a well-framed response");
        assert_eq!(r.status, 200);
        assert_eq!(r.header("x-abe-fault"), Some("stream_cut"));
        let events = sse_events(&r.text());
        assert_eq!(events.len(), 3, "{mode:?}: {events:?}");
        assert!(!events.iter().any(|e| e == "[DONE]"));
        for e in &events {
            let v: serde_json::Value = serde_json::from_str(e).unwrap();
            assert!(v["choices"][0]["finish_reason"].is_null(), "{v}");
        }
        // The connection stays usable, the next stream is cut the same way.
        stream_request(&mut c);
        let again = c.read_response().expect("a response");
        assert_eq!(sse_events(&again.text()).len(), 3);
        abe.shutdown();
    }
}

#[test]
fn a_reset_stream_resets_the_connection_after_n_events() {
    for mode in MODES {
        let mut cfg = config(mode);
        cfg.workers.fault_stream_reset_rate = 1.0;
        cfg.workers.fault_stream_after_chunks = 2;
        let abe = start(cfg);
        let mut c = Client::connect(abe.local_addr());
        stream_request(&mut c);
        let mut got = Vec::new();
        let err = loop {
            let mut buf = [0u8; 4096];
            match c.reader.read(&mut buf) {
                Ok(0) => panic!("{mode:?}: a clean EOF, not a reset: {got:?}"),
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) => break e,
            }
        };
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
        let text = String::from_utf8_lossy(&got);
        // What arrived before the reset: the head and the 2 events (the reset comes a
        // tick later; a reset may still drop bytes not yet read, never add any).
        assert!(
            got.is_empty() || text.contains("x-abe-fault: stream_reset"),
            "{text}"
        );
        let events = text.matches("data: ").count();
        assert!(events <= 2, "{text}");
        assert!(!text.contains("[DONE]"));
        // The server is fine: the next connection is served.
        set_stream_fault(abe.local_addr(), r#"{"stream_reset_rate":0}"#);
        let mut c = Client::connect(abe.local_addr());
        stream_request(&mut c);
        let r = c.read_response().expect("a response");
        assert_eq!(sse_events(&r.text()).last().unwrap(), "[DONE]");
        abe.shutdown();
    }
}

/// A stall of T ms ends at T, not at the io thread's next 50 ms tick: the median pause
/// between the last event before a 10 ms stall and the first after it stays under 3 T (it
/// was about 50 ms when the tick released it), and every answer took at least T. Both
/// batching modes.
#[test]
fn a_short_stall_ends_at_its_deadline_not_at_the_next_tick() {
    const STALL_MS: u64 = 10;
    const RUNS: usize = 9;
    for mode in MODES {
        let mut cfg = config(mode);
        cfg.workers.fault_stream_stall_rate = 1.0;
        cfg.workers.fault_stream_after_chunks = 2;
        cfg.workers.fault_stream_stall_ms = STALL_MS as u32;
        let abe = start(cfg);
        let mut pauses = Vec::with_capacity(RUNS);
        for _ in 0..RUNS {
            let mut c = Client::connect(abe.local_addr());
            let sent_at = Instant::now();
            stream_request(&mut c);
            let mut line = String::new();
            while line != "\r\n" {
                line.clear();
                c.reader.read_line(&mut line).unwrap();
            }
            // The second event (the last before the stall), then the third (after it).
            let mut events = 0;
            let mut paused_at = sent_at;
            while events < 3 {
                line.clear();
                c.reader.read_line(&mut line).unwrap();
                if line.starts_with("data: ") {
                    events += 1;
                    if events == 2 {
                        paused_at = Instant::now();
                    }
                }
            }
            let resumed_at = Instant::now();
            assert!(
                resumed_at.duration_since(sent_at) >= Duration::from_millis(STALL_MS),
                "{mode:?}: the stall did not hold the stream back"
            );
            pauses.push(resumed_at.duration_since(paused_at));
        }
        pauses.sort();
        let median = pauses[RUNS / 2];
        assert!(
            median < Duration::from_millis(3 * STALL_MS),
            "{mode:?}: a {STALL_MS} ms stall paused the stream {median:?} (median; all: {pauses:?})"
        );
        abe.shutdown();
    }
}

#[test]
fn a_stalled_stream_pauses_after_n_events_then_completes() {
    const STALL_MS: u64 = 600;
    for mode in MODES {
        let mut cfg = config(mode);
        cfg.workers.fault_stream_stall_rate = 1.0;
        cfg.workers.fault_stream_after_chunks = 2;
        cfg.workers.fault_stream_stall_ms = STALL_MS as u32;
        let abe = start(cfg);
        let mut c = Client::connect(abe.local_addr());
        let sent_at = Instant::now();
        stream_request(&mut c);
        // Head, then the two events before the stall.
        let mut line = String::new();
        let mut head = String::new();
        while line != "\r\n" {
            line.clear();
            c.reader.read_line(&mut line).unwrap();
            head.push_str(&line);
        }
        assert!(head.contains("x-abe-fault: stream_stall"), "{head}");
        let mut events = 0;
        while events < 2 {
            line.clear();
            c.reader.read_line(&mut line).unwrap();
            events += usize::from(line.starts_with("data: "));
        }
        let paused_at = Instant::now();
        let mut rest = String::new();
        loop {
            line.clear();
            c.reader.read_line(&mut line).unwrap();
            rest.push_str(&line);
            if line.starts_with("data: [DONE]") {
                break;
            }
        }
        // Lower bounds only (a noisy machine adds time, never removes it): the whole
        // answer took the stall, and most of it fell after the second event was read.
        assert!(sent_at.elapsed() >= Duration::from_millis(STALL_MS));
        assert!(
            paused_at.elapsed() >= Duration::from_millis(STALL_MS / 3),
            "{mode:?}: resumed {:?} after the second event",
            paused_at.elapsed()
        );
        // All 8 tokens and the finish came through after the stall.
        assert_eq!(rest.matches("data: ").count(), 8 + 1 + 1 - 2, "{rest}");
        abe.shutdown();
    }
}
