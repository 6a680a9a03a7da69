//! The HTTP front end and OpenAI API over real TCP on 127.0.0.1: every endpoint, every
//! error, pipelining, many connections, slow senders.

use crate::common;

use abe::core::BatchingMode;
use abe::exec::latency::LatencyKind;
use base64::Engine as _;
use common::{request_bytes, start, test_config, Client};
use std::time::{Duration, Instant};

#[test]
fn completions_answer_one_choice_per_prompt_with_usage() {
    let abe = start(test_config());
    let mut c = Client::connect(abe.local_addr());
    let r = c.request(
        "POST",
        "/v1/completions",
        Some(r#"{"model":"abe-sim","prompt":"Hello there, abe","max_tokens":7}"#),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["model"], "abe-sim");
    assert_eq!(v["choices"].as_array().unwrap().len(), 1);
    let text = v["choices"][0]["text"].as_str().unwrap();
    assert_eq!(text.split(' ').count(), 7);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 7);
    assert_eq!(v["usage"]["prompt_tokens"], 4); // 15 bytes / 4, rounded up
    assert_eq!(v["usage"]["total_tokens"], 11);

    let r = c.request(
        "POST",
        "/v1/completions",
        Some(r#"{"prompt":["one","two","three"],"max_tokens":2,"priority":"high","some_unknown_field":[1,2]}"#),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    for (i, ch) in choices.iter().enumerate() {
        assert_eq!(ch["index"], i);
    }
    assert_eq!(v["usage"]["completion_tokens"], 6);
    // Same prompt and seed: same text (deterministic synthetic output).
    let a = c
        .request(
            "POST",
            "/v1/completions",
            Some(r#"{"prompt":"x","seed":3}"#),
        )
        .json();
    let b = c
        .request(
            "POST",
            "/v1/completions",
            Some(r#"{"prompt":"x","seed":3}"#),
        )
        .json();
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);
    abe.shutdown();
}

#[test]
fn embeddings_come_as_unit_float_vectors_or_base64_little_endian() {
    let abe = start(test_config());
    let mut c = Client::connect(abe.local_addr());
    let r = c.request(
        "POST",
        "/v1/embeddings",
        Some(r#"{"input":["alpha","beta"],"dimensions":8}"#),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "list");
    let data = v["data"].as_array().unwrap();
    assert_eq!(data.len(), 2);
    let floats: Vec<f64> = data[1]["embedding"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    assert_eq!(floats.len(), 8);
    let norm: f64 = floats.iter().map(|x| x * x).sum::<f64>().sqrt();
    assert!((norm - 1.0).abs() < 1e-4, "norm {norm}");
    assert_eq!(data[1]["index"], 1);
    assert!(v["usage"]["prompt_tokens"].as_u64().unwrap() > 0);

    let r = c.request(
        "POST",
        "/v1/embeddings",
        Some(r#"{"input":"beta","dimensions":8,"encoding_format":"base64"}"#),
    );
    assert_eq!(r.status, 200);
    let b64 = r.json()["data"][0]["embedding"]
        .as_str()
        .unwrap()
        .to_string();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap();
    let decoded: Vec<f64> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64)
        .collect();
    assert_eq!(decoded.len(), 8);
    for (a, b) in decoded.iter().zip(&floats) {
        assert!((a - b).abs() < 1e-6, "base64 and float encodings agree");
    }
    abe.shutdown();
}

#[test]
fn models_health_ready_and_metrics_endpoints_answer() {
    let abe = start(test_config());
    let mut c = Client::connect(abe.local_addr());
    let r = c.request("GET", "/v1/models", None);
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["data"][0]["id"], "abe-sim");
    assert_eq!(c.request("GET", "/health", None).status, 200);
    assert_eq!(c.request("GET", "/ready", None).status, 200);
    c.request("POST", "/v1/completions", Some(r#"{"prompt":"warm"}"#));
    std::thread::sleep(Duration::from_millis(150)); // one snapshot interval
    let r = c.request("GET", "/metrics", None);
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").unwrap().starts_with("text/plain"));
    let text = r.text();
    assert!(text.contains("abe_queue_depth{priority=\"normal\",bucket=\"128\"}"));
    assert!(text.contains("abe_batches_total{reason=\"idle_worker\"}"));
    let r = c.request("GET", "/metrics/json", None);
    assert_eq!(r.status, 200);
    let v = r.json();
    for key in [
        "timestamp",
        "queue_depth",
        "latency_p50_ms",
        "latency_p90_ms",
        "latency_p99_ms",
        "latency_p999_ms",
        "throughput_rps",
        "batches_formed",
        "avg_batch_size",
        "workers",
    ] {
        assert!(!v[key].is_null(), "metrics/json lacks {key}: {v}");
    }
    assert!(v["batches_formed"].as_u64().unwrap() >= 1);
    assert_eq!(v["workers"].as_array().unwrap().len(), 2);
    assert!(v["workers"][0]["status"].is_string() && v["workers"][0]["circuit"].is_string());
    // HEAD gets the head only.
    c.send_raw(b"HEAD /health HTTP/1.1\r\nHost: t\r\n\r\n");
    let mut line = String::new();
    std::io::BufRead::read_line(&mut c.reader, &mut line).unwrap();
    assert!(line.starts_with("HTTP/1.1 200"));
    abe.shutdown();
}

#[test]
fn bad_requests_get_openai_shaped_errors_that_say_what_is_wrong() {
    let abe = start(test_config());
    let mut c = Client::connect(abe.local_addr());
    let cases: &[(&str, &str, u16, &str)] = &[
        ("/v1/completions", "{not json", 400, "not valid JSON"),
        (
            "/v1/completions",
            r#"{"max_tokens":5}"#,
            400,
            "missing required field 'prompt'",
        ),
        (
            "/v1/completions",
            r#"{"prompt":42}"#,
            400,
            "invalid value for 'prompt'",
        ),
        (
            "/v1/completions",
            r#"{"prompt":"x","max_tokens":"many"}"#,
            400,
            "invalid value for 'max_tokens'",
        ),
        (
            "/v1/completions",
            r#"{"prompt":"x","priority":"urgent"}"#,
            400,
            "unknown priority 'urgent'",
        ),
        (
            "/v1/completions",
            r#"{"prompt":"x","max_tokens":-1}"#,
            400,
            "'max_tokens' must be between 1 and 32768, got -1",
        ),
        (
            "/v1/completions",
            r#"{"prompt":"x","max_tokens":100000000}"#,
            400,
            "'max_tokens' must be between 1 and 32768",
        ),
        (
            "/v1/completions",
            r#"{"prompt":""}"#,
            400,
            "'prompt' must not be an empty string",
        ),
        (
            "/v1/completions",
            r#"{"prompt":[]}"#,
            400,
            "'prompt' must not be an empty array",
        ),
        (
            "/v1/completions",
            r#"{"prompt":"x","model":"gpt-9"}"#,
            404,
            "Model 'gpt-9' not found",
        ),
        ("/v1/completions", "", 400, "request body is empty"),
        (
            "/v1/embeddings",
            r#"{"input":"x","encoding_format":"hex"}"#,
            400,
            "'encoding_format' must be",
        ),
        (
            "/v1/embeddings",
            r#"{}"#,
            400,
            "missing required field 'input'",
        ),
        (
            "/v1/embeddings",
            r#"{"input":"x","dimensions":0}"#,
            400,
            "'dimensions' must be between 1",
        ),
    ];
    for (path, body, status, needle) in cases {
        let r = c.request("POST", path, Some(body));
        assert_eq!(r.status, *status, "{path} {body}: {}", r.text());
        let msg = r.error_message();
        assert!(
            msg.contains(needle),
            "{body}: expected '{needle}' in '{msg}'"
        );
    }
    // Priority from the header works, and a bad one is refused.
    let r = c.request_with(
        "POST",
        "/v1/completions",
        Some(r#"{"prompt":"x"}"#),
        &[("X-Priority", "critical")],
    );
    assert_eq!(r.status, 200);
    let r = c.request_with(
        "POST",
        "/v1/completions",
        Some(r#"{"prompt":"x"}"#),
        &[("X-Priority", "asap")],
    );
    assert_eq!(r.status, 400);
    // Unknown path and wrong method.
    let r = c.request("GET", "/v2/everything", None);
    assert_eq!(r.status, 404);
    assert!(r.error_message().contains("/v2/everything"));
    let r = c.request("GET", "/v1/completions", None);
    assert_eq!(r.status, 405);
    assert_eq!(r.header("allow"), Some("POST"));
    let r = c.request("DELETE", "/metrics", None);
    assert_eq!(r.status, 405);
    assert_eq!(r.header("allow"), Some("GET, HEAD"));
    abe.shutdown();
}

#[test]
fn admin_switches_strategy_lists_valid_names_and_checks_the_token() {
    let mut cfg = test_config();
    cfg.server.admin_token = "s3cret".into();
    let abe = start(cfg);
    let mut c = Client::connect(abe.local_addr());
    let r = c.request("POST", "/admin/strategy/fixed", None);
    assert_eq!(r.status, 401);
    let auth = [("Authorization", "Bearer s3cret")];
    let r = c.request_with("POST", "/admin/strategy/fastest", None, &auth);
    assert_eq!(r.status, 400);
    assert!(r
        .error_message()
        .contains("valid strategies are auto, fixed, queue_depth, latency_aware"));
    let r = c.request_with("POST", "/admin/strategy/latency_aware", None, &auth);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["strategy"], "latency_aware");
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let r = c.request_with("GET", "/admin/strategy", None, &auth);
        if r.json()["strategy"] == "latency_aware" {
            break;
        }
        assert!(Instant::now() < until, "strategy switch not visible");
        std::thread::sleep(Duration::from_millis(20));
    }
    let text = c.request("GET", "/metrics", None).text();
    assert!(text.contains("abe_strategy{strategy=\"latency_aware\"} 1"));
    abe.shutdown();
}

#[test]
fn admin_switches_worker_faults_at_run_time_and_refuses_bad_values() {
    let mut cfg = test_config();
    cfg.server.admin_token = "s3cret".into();
    let abe = start(cfg);
    let mut c = Client::connect(abe.local_addr());
    let completion = r#"{"prompt":"faults","max_tokens":2}"#;
    let r = c.request("POST", "/admin/faults", Some(r#"{"error_rate":1}"#));
    assert_eq!(r.status, 401);
    let auth = [("Authorization", "Bearer s3cret")];
    let r = c.request_with("GET", "/admin/faults", None, &auth);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["error_rate"], 0.0);

    // Every batch fails: the client gets a clear error, not a hang.
    let r = c.request_with("POST", "/admin/faults", Some(r#"{"error_rate":1}"#), &auth);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["error_rate"], 1.0);
    let r = c.request("POST", "/v1/completions", Some(completion));
    assert_eq!(r.status, 500, "{}", r.text());
    assert!(!r.error_message().is_empty());

    // Refused values change nothing and say which key is wrong.
    for (body, says) in [
        (r#"{"error_rate":1.5}"#, "error_rate must be 0..=1"),
        (r#"{"hang_ms":-1}"#, "hang_ms must be >= 0"),
        (r#"{"errors":0}"#, "unknown field"),
        ("not json", "JSON object"),
    ] {
        let r = c.request_with("POST", "/admin/faults", Some(body), &auth);
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        assert!(r.error_message().contains(says), "{body}: {}", r.text());
    }
    let r = c.request_with("GET", "/admin/faults", None, &auth);
    assert_eq!(r.json()["error_rate"], 1.0);

    // Switched back off: served again; keys left out keep their value.
    let r = c.request_with(
        "POST",
        "/admin/faults",
        Some(r#"{"error_rate":0,"added_latency_ms":1}"#),
        &auth,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let r = c.request_with("POST", "/admin/faults", Some("{}"), &auth);
    assert_eq!(r.json()["added_latency_ms"], 1.0);
    assert_eq!(r.json()["error_rate"], 0.0);
    let r = c.request("POST", "/v1/completions", Some(completion));
    assert_eq!(r.status, 200, "{}", r.text());
    abe.shutdown();
}

#[test]
fn pipelined_requests_are_answered_in_request_order() {
    let mut cfg = test_config();
    cfg.workers.latency_model = LatencyKind::Linear;
    cfg.workers.base_latency_ms = 1.0;
    cfg.workers.per_token_latency_ms = 0.01;
    let abe = start(cfg);
    let mut c = Client::connect(abe.local_addr());
    let mut bytes = Vec::new();
    for i in 0..40 {
        // Mixed kinds and priorities, so the engine finishes them out of order.
        let (path, body) = if i % 3 == 0 {
            (
                "/v1/embeddings",
                format!(r#"{{"input":"p{i}","dimensions":{}}}"#, i + 1),
            )
        } else {
            let pr = ["low", "normal", "high", "critical"][i % 4];
            (
                "/v1/completions",
                format!(
                    r#"{{"prompt":"p{i}","max_tokens":{},"priority":"{pr}"}}"#,
                    1 + i % 5
                ),
            )
        };
        bytes.extend(request_bytes("POST", path, Some(&body), &[]));
        if i == 20 {
            bytes.extend(request_bytes("GET", "/health", None, &[]));
        }
    }
    c.send_raw(&bytes);
    for i in 0..40 {
        let r = c.read_response().expect("response");
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        if i % 3 == 0 {
            assert_eq!(v["data"][0]["embedding"].as_array().unwrap().len(), i + 1);
        } else {
            assert_eq!(v["usage"]["completion_tokens"], 1 + i % 5);
        }
        if i == 20 {
            assert_eq!(c.read_response().unwrap().json()["status"], "ok");
        }
    }
    abe.shutdown();
}

#[test]
fn a_thousand_concurrent_keep_alive_connections_are_all_served() {
    let mut cfg = test_config();
    cfg.workers.latency_model = LatencyKind::Linear;
    cfg.workers.base_latency_ms = 2.0;
    cfg.workers.per_token_latency_ms = 0.0;
    let abe = start(cfg);
    let addr = abe.local_addr();
    let mut clients: Vec<Client> = (0..1000).map(|_| Client::connect(addr)).collect();
    for round in 0..2 {
        for (i, c) in clients.iter_mut().enumerate() {
            c.send_raw(&request_bytes(
                "POST",
                "/v1/completions",
                Some(&format!(r#"{{"prompt":"c{i} r{round}","max_tokens":2}}"#)),
                &[],
            ));
        }
        for c in clients.iter_mut() {
            let r = c.read_response().expect("every connection answered");
            assert_eq!(r.status, 200, "{}", r.text());
        }
    }
    let snap = abe.handle.snapshot();
    assert!(snap.stats.avg_batch_size() > 1.0, "load was batched");
    abe.shutdown();
}

#[test]
fn a_slow_sender_is_cut_off_with_408_and_the_connection_closed() {
    let mut cfg = test_config();
    cfg.server.read_timeout = abe::config::Millis(300);
    let abe = start(cfg);
    let mut c = Client::connect(abe.local_addr());
    c.send_raw(b"POST /v1/completions HTTP/1.1\r\nContent-Length: 50\r\n\r\n{\"prompt\":");
    let r = c.read_response().expect("a 408");
    assert_eq!(r.status, 408);
    assert!(r.error_message().contains("server.read_timeout"));
    assert_eq!(r.header("connection"), Some("close"));
    assert!(c.is_closed());
    // A half-sent head is cut off the same way.
    let mut c = Client::connect(abe.local_addr());
    c.send_raw(b"GET /health HTTP/1.1\r\nHost: x\r\n");
    assert_eq!(c.read_response().unwrap().status, 408);
    abe.shutdown();
}

#[test]
fn oversized_heads_bodies_and_chunked_bodies_are_refused() {
    let mut cfg = test_config();
    cfg.server.max_body_bytes = 1000;
    cfg.server.max_header_bytes = 1024;
    let abe = start(cfg);
    let addr = abe.local_addr();
    let mut c = Client::connect(addr);
    let big = format!(r#"{{"prompt":"{}"}}"#, "x".repeat(2000));
    let r = c.request("POST", "/v1/completions", Some(&big));
    assert_eq!(r.status, 413);
    assert!(r
        .error_message()
        .contains("exceeds the limit of 1000 bytes"));
    let mut c = Client::connect(addr);
    c.send_raw(
        format!(
            "GET /health HTTP/1.1\r\nX-Big: {}\r\n\r\n",
            "y".repeat(3000)
        )
        .as_bytes(),
    );
    assert_eq!(c.read_response().unwrap().status, 431);
    let mut c = Client::connect(addr);
    c.send_raw(b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n");
    let r = c.read_response().unwrap();
    assert_eq!(r.status, 411);
    assert!(r.error_message().contains("Content-Length"));
    let mut c = Client::connect(addr);
    c.send_raw(b"\x16\x03\x01 not http at all\r\n\r\n");
    assert_eq!(c.read_response().unwrap().status, 400);
    abe.shutdown();
}

#[test]
fn expect_100_continue_gets_an_interim_response_before_the_body() {
    let abe = start(test_config());
    let mut c = Client::connect(abe.local_addr());
    let body = r#"{"prompt":"after continue"}"#;
    c.send_raw(
        format!(
            "POST /v1/completions HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    );
    let mut line = String::new();
    std::io::BufRead::read_line(&mut c.reader, &mut line).unwrap();
    assert_eq!(line, "HTTP/1.1 100 Continue\r\n");
    let mut blank = String::new();
    std::io::BufRead::read_line(&mut c.reader, &mut blank).unwrap();
    c.send_raw(body.as_bytes());
    assert_eq!(c.read_response().unwrap().status, 200);
    abe.shutdown();
}

/// One worker serving one request at a time, 300 ms each.
fn one_slow_worker_config() -> abe::config::Config {
    let mut cfg = test_config();
    cfg.workers.count = 1;
    cfg.batching.max_batch_size = 1;
    cfg.workers.latency_model = LatencyKind::Linear;
    cfg.workers.base_latency_ms = 300.0;
    cfg.workers.per_token_latency_ms = 0.0;
    cfg
}

/// `n` completion requests in one buffer, prompts `"0"`, `"1"`, ...
fn pipelined_completions(n: usize) -> Vec<u8> {
    let mut bytes = Vec::new();
    for i in 0..n {
        bytes.extend(request_bytes(
            "POST",
            "/v1/completions",
            Some(&format!(r#"{{"prompt":"{i}"}}"#)),
            &[],
        ));
    }
    bytes
}

#[test]
fn overload_is_429_with_retry_after() {
    let mut cfg = one_slow_worker_config();
    cfg.batching.queue_capacity = 4;
    let abe = start(cfg);
    let mut c = Client::connect(abe.local_addr());
    c.send_raw(&pipelined_completions(10));
    let mut statuses = Vec::new();
    for _ in 0..10 {
        let r = c.read_response().unwrap();
        if r.status == 429 {
            assert_eq!(r.header("retry-after"), Some("1"));
            assert!(r.error_message().contains("queue is full"));
        }
        statuses.push(r.status);
    }
    assert!(statuses.contains(&429), "{statuses:?}");
    assert!(statuses.contains(&200), "{statuses:?}");
    abe.shutdown();
}

#[test]
fn idle_keep_alive_connections_are_closed_after_the_timeout() {
    let mut cfg = test_config();
    cfg.server.keep_alive_timeout = abe::config::Millis(200);
    let abe = start(cfg);
    let mut c = Client::connect(abe.local_addr());
    assert_eq!(c.request("GET", "/health", None).status, 200);
    assert!(c.is_closed(), "closed after the idle timeout");
    abe.shutdown();
}

#[test]
fn chat_completions_answer_with_an_assistant_message_and_validate_messages() {
    let abe = start(test_config());
    let mut c = Client::connect(abe.local_addr());
    let r = c.request(
        "POST",
        "/v1/chat/completions",
        Some(r#"{"model":"abe-sim","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hello!"}],"max_completion_tokens":4}"#),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(text.split(' ').count(), 4);
    assert_eq!(v["usage"]["completion_tokens"], 4);
    // "<|system|>\nBe brief.\n<|user|>\nHello!\n<|assistant|>\n" is 51 bytes: 13 tokens.
    assert_eq!(v["usage"]["prompt_tokens"], 13);
    let r = c.request("POST", "/v1/chat/completions", Some(r#"{"messages":[]}"#));
    assert_eq!(r.status, 400);
    assert!(r.error_message().contains("at least one message"));
    let r = c.request(
        "POST",
        "/v1/chat/completions",
        Some(r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":0}"#),
    );
    assert_eq!(r.status, 400);
    assert!(r.error_message().contains("'max_tokens' must be between 1"));
    abe.shutdown();
}

fn pipelined_health(n: usize, last_close: bool) -> Vec<u8> {
    let mut bytes = Vec::new();
    for i in 0..n {
        if last_close && i + 1 == n {
            bytes.extend(request_bytes(
                "GET",
                "/health",
                None,
                &[("Connection", "close")],
            ));
        } else {
            bytes.extend(request_bytes("GET", "/health", None, &[]));
        }
    }
    bytes
}

#[test]
fn more_pipelined_requests_than_the_window_are_all_answered_even_after_a_half_close() {
    let mut cfg = test_config();
    cfg.server.read_timeout = abe::config::Millis(2000);
    let abe = start(cfg);
    // 200 requests, three times the default window of 64, in one write.
    let mut c = Client::connect(abe.local_addr());
    c.send_raw(&pipelined_health(200, false));
    for i in 0..200 {
        let r = c
            .read_response()
            .unwrap_or_else(|| panic!("response {i} missing"));
        assert_eq!(r.status, 200, "response {i}: {}", r.text());
    }
    // The same, then the client shuts down its sending side: every request is still
    // answered before the server closes.
    let mut c = Client::connect(abe.local_addr());
    c.send_raw(&pipelined_health(200, false));
    c.reader
        .get_ref()
        .shutdown(std::net::Shutdown::Write)
        .unwrap();
    for i in 0..200 {
        let r = c
            .read_response()
            .unwrap_or_else(|| panic!("response {i} missing after half-close"));
        assert_eq!(r.status, 200);
    }
    assert!(c.is_closed());
    abe.shutdown();
}

#[test]
fn a_request_followed_by_a_half_close_is_answered_and_the_connection_closed() {
    // The server stops reading after a short read; the peer's FIN must still be seen,
    // whether it arrives with the request or after it. The keep-alive timeout is far
    // longer than the client's read timeout, so only seeing the FIN closes in time.
    let mut cfg = test_config();
    cfg.server.keep_alive_timeout = abe::config::Millis(600_000);
    let abe = start(cfg);
    for i in 0..20 {
        let mut c = Client::connect(abe.local_addr());
        c.send_raw(&request_bytes(
            "POST",
            "/v1/completions",
            Some(r#"{"prompt":"hi","max_tokens":1}"#),
            &[],
        ));
        if i % 2 == 1 {
            std::thread::sleep(Duration::from_millis(5)); // FIN after the request was read
        }
        c.reader
            .get_ref()
            .shutdown(std::net::Shutdown::Write)
            .unwrap();
        let r = c.read_response().expect("answered despite the half-close");
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(c.is_closed(), "closed once answered (connection {i})");
    }
    abe.shutdown();
}

#[test]
fn connection_close_after_a_full_window_closes_right_after_the_answers() {
    let abe = start(test_config());
    let mut c = Client::connect(abe.local_addr());
    c.send_raw(&pipelined_health(65, true));
    // A request after the close one: it must not be served.
    c.send_raw(&request_bytes("GET", "/health", None, &[]));
    for _ in 0..65 {
        assert_eq!(c.read_response().unwrap().status, 200);
    }
    // Were the connection left open, this read would time out (30 s) and the test fail.
    assert!(c.is_closed(), "closed after the Connection: close answer");
}

#[test]
fn a_client_that_never_reads_is_throttled_not_buffered_without_bound() {
    use std::io::Write;
    let mut cfg = test_config();
    cfg.server.max_write_buffer_bytes = 64 * 1024;
    let abe = start(cfg);
    let stream = std::net::TcpStream::connect(abe.local_addr()).unwrap();
    stream.set_nonblocking(true).unwrap();
    let request = request_bytes("GET", "/metrics", None, &[]);
    let mut written = 0usize;
    let until = Instant::now() + Duration::from_secs(3);
    let mut blocked = false;
    let mut w = &stream;
    while Instant::now() < until && written < 64 * 1024 * 1024 {
        match w.write(&request) {
            Ok(n) => written += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                blocked = true;
                std::thread::sleep(Duration::from_millis(50));
                if w.write(&request).is_err() {
                    break;
                }
            }
            Err(e) => panic!("write failed: {e}"),
        }
    }
    // Each /metrics answer is tens of KiB; if the server kept reading and answering
    // without bound we could push 64 MiB of requests in. It stops reading instead.
    assert!(
        blocked,
        "the server stopped reading ({written} bytes of requests sent)"
    );
    assert!(written < 64 * 1024 * 1024);
    drop(stream);
    abe.shutdown();
}

/// The `data:` payloads of an SSE body.
fn sse_events(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            e.strip_prefix("data: ")
                .unwrap_or_else(|| panic!("not an SSE data line: {e:?}"))
                .to_string()
        })
        .collect()
}

#[test]
fn stream_true_answers_with_server_sent_events_in_openai_chunk_shapes() {
    let abe = start(test_config());
    let mut c = Client::connect(abe.local_addr());
    let r = c.request(
        "POST",
        "/v1/completions",
        Some(r#"{"prompt":"stream me","max_tokens":3,"stream":true,"stream_options":{"include_usage":true}}"#),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    assert_eq!(r.header("transfer-encoding"), Some("chunked"));
    let events = sse_events(&r.text());
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<serde_json::Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    // 3 tokens, the finish chunk, the usage chunk.
    assert_eq!(chunks.len(), 5);
    let text: String = chunks[..3]
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(text.split(' ').count(), 3);
    assert_eq!(chunks[3]["choices"][0]["finish_reason"], "length");
    assert_eq!(chunks[4]["usage"]["completion_tokens"], 3);
    // Same request without streaming: the same text.
    let plain = c
        .request(
            "POST",
            "/v1/completions",
            Some(r#"{"prompt":"stream me","max_tokens":3}"#),
        )
        .json();
    assert_eq!(plain["choices"][0]["text"], text.as_str());

    // Chat: a role delta, content deltas, the finish chunk, no usage unless asked; and the
    // connection stays usable (keep-alive) after a chunked response.
    let r = c.request(
        "POST",
        "/v1/chat/completions",
        Some(r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"stream":true}"#),
    );
    let events = sse_events(&r.text());
    let chunks: Vec<serde_json::Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks.len(), 4, "{events:?}");
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(chunks[1]["choices"][0]["delta"]["content"].is_string());
    assert_eq!(chunks[3]["choices"][0]["finish_reason"], "length");
    assert_eq!(c.request("GET", "/health", None).status, 200);
    abe.shutdown();
}

#[test]
fn continuous_mode_serves_the_api_and_exports_its_slots_and_steps() {
    let mut cfg = test_config();
    cfg.batching.mode = BatchingMode::Continuous;
    cfg.continuous.natural_length_mean_tokens = 4;
    let abe = start(cfg);
    let mut c = Client::connect(abe.local_addr());
    let r = c.request(
        "POST",
        "/v1/completions",
        Some(r#"{"prompt":["a","b","c"],"max_tokens":30}"#),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    for ch in v["choices"].as_array().unwrap() {
        let reason = ch["finish_reason"].as_str().unwrap();
        assert!(reason == "stop" || reason == "length");
    }
    let r = c.request(
        "POST",
        "/v1/chat/completions",
        Some(r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":3,"stream":true}"#),
    );
    assert_eq!(r.status, 200);
    assert!(r.text().ends_with("data: [DONE]\n\n"));
    let r = c.request("POST", "/admin/strategy/fixed", None);
    assert_eq!(r.status, 400);
    assert!(r.error_message().contains("continuous batching"));
    std::thread::sleep(Duration::from_millis(150));
    let text = c.request("GET", "/metrics", None).text();
    assert!(
        text.contains("abe_continuous_slots 32"),
        "2 replicas x 16 slots"
    );
    assert!(text.contains("abe_continuous_steps_total"));
    assert!(
        text.contains("abe_time_to_first_token_seconds_count 4"),
        "3 prompts + 1 chat"
    );
    assert!(text.contains("abe_time_per_output_token_seconds_count"));
    abe.shutdown();
}

#[test]
fn continuous_mode_streams_tokens_while_the_request_is_still_generating() {
    let mut cfg = test_config();
    cfg.batching.mode = BatchingMode::Continuous;
    cfg.workers.count = 1;
    cfg.workers.latency_model = LatencyKind::Calibrated;
    cfg.workers.decode_beta_ms = 2.0;
    let abe = start(cfg);
    let addr = abe.local_addr();
    let mut c = Client::connect(addr);
    c.send_raw(&request_bytes(
        "POST",
        "/v1/completions",
        Some(r#"{"prompt":"a long answer","max_tokens":300,"stream":true}"#),
        &[],
    ));
    // Head, then the first chunk: the first token.
    let mut line = String::new();
    std::io::BufRead::read_line(&mut c.reader, &mut line).unwrap();
    assert!(line.starts_with("HTTP/1.1 200"), "{line}");
    loop {
        let mut h = String::new();
        std::io::BufRead::read_line(&mut c.reader, &mut h).unwrap();
        if h == "\r\n" {
            break;
        }
    }
    let mut size = String::new();
    std::io::BufRead::read_line(&mut c.reader, &mut size).unwrap();
    let n = usize::from_str_radix(size.trim(), 16).unwrap();
    let mut first = vec![0; n + 2];
    std::io::Read::read_exact(&mut c.reader, &mut first).unwrap();
    assert!(String::from_utf8_lossy(&first).starts_with("data: {"));
    // While we hold the first token, the request is still generating (300 steps of ~2 ms).
    let mut m = Client::connect(addr);
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let v = m.request("GET", "/metrics/json", None).json();
        if v["live_requests"].as_u64() == Some(1) {
            break;
        }
        assert!(
            Instant::now() < until,
            "never saw the request live after its first token"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // The rest of the stream: 300 token pieces in total, then finish and [DONE].
    let mut events = vec![String::from_utf8_lossy(&first[..n]).into_owned()];
    loop {
        let mut size = String::new();
        std::io::BufRead::read_line(&mut c.reader, &mut size).unwrap();
        let n = usize::from_str_radix(size.trim(), 16).unwrap();
        let mut chunk = vec![0; n + 2];
        std::io::Read::read_exact(&mut c.reader, &mut chunk).unwrap();
        if n == 0 {
            break;
        }
        events.push(String::from_utf8_lossy(&chunk[..n]).into_owned());
    }
    assert_eq!(events.last().unwrap(), "data: [DONE]\n\n");
    let texts: Vec<String> = events[..events.len() - 2]
        .iter()
        .map(|e| {
            let v: serde_json::Value = serde_json::from_str(e[6..].trim()).unwrap();
            v["choices"][0]["text"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(texts.concat().split(' ').count(), 300);
    abe.shutdown();
}

fn wait_json(addr: std::net::SocketAddr, what: &str, cond: impl Fn(&serde_json::Value) -> bool) {
    let mut m = Client::connect(addr);
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let v = m.request("GET", "/metrics/json", None).json();
        if cond(&v) {
            return;
        }
        assert!(Instant::now() < until, "timed out waiting for {what}: {v}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_client_that_disconnects_frees_its_slot_in_continuous_mode() {
    let mut cfg = test_config();
    cfg.batching.mode = BatchingMode::Continuous;
    cfg.workers.count = 1;
    cfg.continuous.max_slots = 1;
    cfg.workers.latency_model = LatencyKind::Calibrated;
    cfg.workers.decode_beta_ms = 2.0;
    let abe = start(cfg);
    let addr = abe.local_addr();
    let mut c = Client::connect(addr);
    // 5,000 tokens at ~2 ms a step would hold the only slot for 10 s.
    c.send_raw(&request_bytes(
        "POST",
        "/v1/completions",
        Some(r#"{"prompt":"long","max_tokens":5000,"stream":true}"#),
        &[],
    ));
    let mut line = String::new();
    std::io::BufRead::read_line(&mut c.reader, &mut line).unwrap();
    assert!(line.starts_with("HTTP/1.1 200"));
    drop(c); // the client goes away mid-stream
    wait_json(addr, "the slot to be freed", |v| {
        v["requests"]["failed"] == 1 && v["live_requests"] == 0
    });
    // /metrics says why it ended: cancelled by its client, not an unexplained failure.
    let v = Client::connect(addr)
        .request("GET", "/metrics/json", None)
        .json();
    let r = &v["requests"];
    assert_eq!(r["cancelled"], 1, "{v}");
    assert_eq!(r["failed_other"], 0, "{v}");
    // The freed slot serves the next request at once.
    let mut c = Client::connect(addr);
    let r = c.request(
        "POST",
        "/v1/completions",
        Some(r#"{"prompt":"next","max_tokens":3}"#),
    );
    assert_eq!(r.status, 200);
    abe.shutdown();
}

#[test]
fn queued_requests_of_a_client_that_disconnects_are_dropped() {
    let abe = start(one_slow_worker_config());
    let addr = abe.local_addr();
    let mut c = Client::connect(addr);
    c.send_raw(&pipelined_completions(20));
    std::thread::sleep(Duration::from_millis(100)); // let the server read and queue them
    drop(c);
    // Served one at a time, 20 requests would take 6 s; the queued ones are dropped instead.
    wait_json(addr, "queued requests to be cancelled", |v| {
        v["requests"]["cancelled"].as_u64().unwrap_or(0) >= 15 && v["live_requests"] == 0
    });
    abe.shutdown();
}

#[test]
fn temperature_top_p_and_seed_change_the_synthetic_output_deterministically() {
    let abe = start(test_config());
    let mut c = Client::connect(abe.local_addr());
    let mut text = |body: &str| {
        let r = c.request("POST", "/v1/completions", Some(body));
        assert_eq!(r.status, 200);
        r.json()["choices"][0]["text"].as_str().unwrap().to_string()
    };
    let base = text(r#"{"prompt":"p","max_tokens":8}"#);
    let t07 = text(r#"{"prompt":"p","max_tokens":8,"temperature":0.7}"#);
    assert_eq!(
        t07,
        text(r#"{"prompt":"p","max_tokens":8,"temperature":0.7}"#)
    );
    assert_ne!(t07, base);
    assert_ne!(
        t07,
        text(r#"{"prompt":"p","max_tokens":8,"temperature":0.2}"#)
    );
    assert_ne!(base, text(r#"{"prompt":"p","max_tokens":8,"top_p":0.9}"#));
    assert_ne!(base, text(r#"{"prompt":"p","max_tokens":8,"seed":1}"#));
    abe.shutdown();
}

#[test]
fn stop_sequences_end_the_output_before_them_in_both_modes_and_in_streams() {
    for mode in [BatchingMode::Request, BatchingMode::Continuous] {
        let mut cfg = test_config();
        cfg.batching.mode = mode;
        let abe = start(cfg);
        let mut c = Client::connect(abe.local_addr());
        let full = c
            .request(
                "POST",
                "/v1/completions",
                Some(r#"{"prompt":"stops","max_tokens":30,"seed":5}"#),
            )
            .json();
        let full_text = full["choices"][0]["text"].as_str().unwrap().to_string();
        let word = full_text.split(' ').nth(5).unwrap().to_string();
        let stop = format!(" {word}");
        let expected = &full_text[..full_text.find(&stop).unwrap()];
        let body =
            format!(r#"{{"prompt":"stops","max_tokens":30,"seed":5,"stop":["zzz","{stop}"]}}"#);
        let r = c.request("POST", "/v1/completions", Some(&body)).json();
        assert_eq!(r["choices"][0]["text"], expected, "{mode}");
        assert_eq!(r["choices"][0]["finish_reason"], "stop", "{mode}");
        // Streamed, the pieces add up to the same text: the stop sequence never leaks.
        let body = format!(
            r#"{{"prompt":"stops","max_tokens":30,"seed":5,"stop":"{stop}","stream":true}}"#
        );
        let r = c.request("POST", "/v1/completions", Some(&body));
        let events = sse_events(&r.text());
        let streamed: String = events[..events.len() - 1]
            .iter()
            .map(|e| {
                let v: serde_json::Value = serde_json::from_str(e).unwrap();
                v["choices"][0]["text"].as_str().unwrap().to_string()
            })
            .collect();
        assert_eq!(streamed, expected, "{mode}");
        let r = c.request(
            "POST",
            "/v1/completions",
            Some(r#"{"prompt":"x","stop":["a","b","c","d","e"]}"#),
        );
        assert_eq!(r.status, 400);
        assert!(r.error_message().contains("at most 4"));
        abe.shutdown();
    }
}
