//! What an operator and vLLM-built tools see of a live abe, over real TCP on 127.0.0.1:
//! vLLM's metric names on /metrics, the per-second history, the event stream, the dashboard.

use crate::common;

use abe::core::BatchingMode;
use common::{start, test_config, Client};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// The value of the sample line starting with `series` (name and labels), if any.
fn sample(page: &str, series: &str) -> Option<f64> {
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// Polls /metrics until `series` reaches `want` (snapshots are published every 50 ms).
fn wait_sample(addr: SocketAddr, series: &str, want: f64) -> String {
    let mut c = Client::connect(addr);
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let page = c.request("GET", "/metrics", None).text();
        if sample(&page, series) == Some(want) {
            return page;
        }
        assert!(
            Instant::now() < until,
            "timed out waiting for {series} = {want}:\n{page}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn vllm_metrics_count_tokens_and_finish_reasons_in_both_modes() {
    for mode in [BatchingMode::Request, BatchingMode::Continuous] {
        let mut cfg = test_config();
        cfg.batching.mode = mode;
        let abe = start(cfg);
        let mut c = Client::connect(abe.local_addr());
        for stream in [false, true] {
            let body =
                format!(r#"{{"prompt":"Hello there, abe","max_tokens":3,"stream":{stream}}}"#);
            let r = c.request("POST", "/v1/completions", Some(&body));
            assert_eq!(r.status, 200, "{}", r.text());
        }
        let m = r#"{model_name="abe-sim"}"#;
        let page = wait_sample(
            abe.local_addr(),
            &format!("vllm:generation_tokens_total{m}"),
            6.0,
        );
        // 15 bytes / 4, rounded up, per request.
        assert_eq!(
            sample(&page, &format!("vllm:prompt_tokens_total{m}")),
            Some(8.0)
        );
        let done = sample(
            &page,
            r#"vllm:request_success_total{model_name="abe-sim",finished_reason="length"}"#,
        );
        let stopped = sample(
            &page,
            r#"vllm:request_success_total{model_name="abe-sim",finished_reason="stop"}"#,
        );
        assert_eq!(done.unwrap() + stopped.unwrap(), 2.0, "{mode:?}");
        for name in [
            "vllm:e2e_request_latency_seconds_count",
            "vllm:time_to_first_token_seconds_count",
        ] {
            assert_eq!(sample(&page, &format!("{name}{m}")), Some(2.0), "{name}");
        }
        assert_eq!(
            sample(&page, &format!("vllm:num_requests_running{m}")),
            Some(0.0)
        );
        assert_eq!(
            sample(&page, &format!("vllm:num_requests_waiting{m}")),
            Some(0.0)
        );
        abe.shutdown();
    }
}

#[test]
fn history_keeps_per_second_aggregates_and_json_gains_windowed_rates() {
    let abe = start(test_config());
    let addr = abe.local_addr();
    let mut c = Client::connect(addr);
    let until = Instant::now() + Duration::from_secs(20);
    // Load until two seconds with completions are kept.
    let seconds = loop {
        for _ in 0..5 {
            let r = c.request(
                "POST",
                "/v1/completions",
                Some(r#"{"prompt":"hi","max_tokens":2}"#),
            );
            assert_eq!(r.status, 200);
        }
        let v = c.request("GET", "/metrics/history", None).json();
        let kept = v["seconds"].as_array().unwrap().clone();
        let busy = kept
            .iter()
            .filter(|s| s["outcomes"]["completed"].as_u64().unwrap() > 0)
            .count();
        if busy >= 2 {
            assert_eq!(v["retention_seconds"], 3600);
            break kept;
        }
        assert!(Instant::now() < until, "no history after 20 s: {v}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let s = seconds.last().unwrap();
    for key in [
        "latency_ms",
        "latency_by_priority_ms",
        "queue_depth_by_priority",
        "batch_size",
        "flush_reasons",
        "workers",
        "backends",
        "strategy",
    ] {
        assert!(!s[key].is_null(), "{key} missing from {s}");
    }
    assert_eq!(s["workers"].as_array().unwrap().len(), 2);
    let v = c.request("GET", "/metrics/history?seconds=1", None).json();
    assert_eq!(v["seconds"].as_array().unwrap().len(), 1);
    let r = c.request("GET", "/metrics/history?seconds=soon", None);
    assert_eq!(r.status, 400);
    let v = c.request("GET", "/metrics/json", None).json();
    for w in ["1s", "10s"] {
        assert!(v["windows"][w]["completed_rps"].is_number(), "{v}");
    }
    assert!(
        v["windows"]["10s"]["completed_rps"].as_f64().unwrap() > 0.0,
        "{v}"
    );
    abe.shutdown();
}

/// Reads from `stream` until `done(text so far)` or 20 s.
fn read_until(stream: &mut std::net::TcpStream, done: impl Fn(&str) -> bool) -> String {
    use std::io::Read;
    stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let until = Instant::now() + Duration::from_secs(20);
    let mut text = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    while Instant::now() < until {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => text.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(e) => panic!("read: {e}"),
        }
        if done(&String::from_utf8_lossy(&text)) {
            break;
        }
    }
    String::from_utf8_lossy(&text).into_owned()
}

#[test]
fn events_stream_batches_ticks_and_requests_as_server_sent_events() {
    use std::io::Write;
    for mode in [BatchingMode::Request, BatchingMode::Continuous] {
        let mut cfg = test_config();
        cfg.batching.mode = mode;
        let abe = start(cfg);
        let addr = abe.local_addr();
        let mut sub = std::net::TcpStream::connect(addr).unwrap();
        sub.write_all(b"GET /events HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let head = read_until(&mut sub, |t| t.contains("event: hello"));
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert!(head.contains("Content-Type: text/event-stream"), "{head}");
        assert!(head.contains("Transfer-Encoding: chunked"), "{head}");
        assert!(
            head.contains("per 100 ms"),
            "the hello states the rate: {head}"
        );
        let mut c = Client::connect(addr);
        for _ in 0..5 {
            let r = c.request(
                "POST",
                "/v1/completions",
                Some(r#"{"prompt":"ev","max_tokens":2}"#),
            );
            assert_eq!(r.status, 200);
        }
        let step = if mode == BatchingMode::Request {
            "event: batch"
        } else {
            "event: tick"
        };
        let text = read_until(&mut sub, |t| {
            t.contains(step) && t.contains("event: request") && t.contains("event: stats")
        });
        assert!(text.contains(step), "{mode:?}: {text}");
        if mode == BatchingMode::Request {
            // A batch says which strategy decided it (auto, the default) and why.
            assert!(text.contains("\"strategy\":\"auto\""), "{text}");
        }
        assert!(text.contains("event: request"), "{mode:?}: {text}");
        assert!(text.contains("\"outcome\":\"completed\""), "{text}");
        assert!(text.contains("event: stats"), "{text}");
        // Every answered request says how long it queued, within its latency.
        let requests: Vec<serde_json::Value> = text
            .split("event: request\ndata: ")
            .skip(1)
            .map(|rest| serde_json::from_str(rest.lines().next().unwrap()).unwrap())
            .collect();
        assert!(!requests.is_empty(), "{text}");
        for r in &requests {
            let wait = r["queue_wait_ms"].as_f64().unwrap_or_else(|| panic!("{r}"));
            assert!(
                wait > 0.0 && wait <= r["latency_ms"].as_f64().unwrap(),
                "{r}"
            );
        }
        // A subscriber that never reads does not hold anything up.
        let mut idle = std::net::TcpStream::connect(addr).unwrap();
        idle.write_all(b"GET /events HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        for _ in 0..50 {
            let r = c.request(
                "POST",
                "/v1/completions",
                Some(r#"{"prompt":"ev","max_tokens":2}"#),
            );
            assert_eq!(r.status, 200);
        }
        let r = c.request("POST", "/events", None);
        assert_eq!(r.status, 405);
        drop((sub, idle));
        abe.shutdown();
    }
}

/// `auto` holding a partial batch for clients about to come back shows up on `/events` as a
/// `hold` event saying how many it expects, for how long, and why. Eight closed-loop
/// clients against one worker whose batches take 10 ms: after a few batches `auto` has
/// learned the fixed cost and the clients' echo, and holds the ones left waiting for those
/// just answered. The first arrivals may also be held as a burst; either reason is shown.
/// Client `i` thinks `i` x 0.4 ms before each request, so the answered clients come back
/// spread over ~3 ms of the next batch's 10. Which model claims them, the echo of the last
/// completion or a burst arriving, depends on the machine's timing: one CI run held all 30
/// batches as bursts (each a full batch of the 8), with no echo hold in 240 requests. Both
/// are holds for the clients just answered; the test reads until an echo hold or 20 holds.
#[test]
fn a_held_batch_shows_up_on_events() {
    use std::io::Write;
    let mut cfg = test_config();
    cfg.workers.count = 1;
    cfg.workers.max_inflight = 1;
    cfg.workers.latency_model = abe::exec::latency::LatencyKind::Linear;
    cfg.workers.base_latency_ms = 10.0;
    cfg.workers.per_token_latency_ms = 0.0;
    cfg.workers.latency_variance = 0.0;
    let abe = start(cfg);
    let addr = abe.local_addr();
    let mut sub = std::net::TcpStream::connect(addr).unwrap();
    sub.write_all(b"GET /events HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    read_until(&mut sub, |t| t.contains("event: hello"));
    let clients: Vec<_> = (0..8u64)
        .map(|i| {
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                for _ in 0..30 {
                    std::thread::sleep(std::time::Duration::from_micros(400 * i));
                    let r = c.request(
                        "POST",
                        "/v1/completions",
                        Some(r#"{"prompt":"hold","max_tokens":2}"#),
                    );
                    assert_eq!(r.status, 200);
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    // Read until an echo hold, or enough holds of either reason.
    let text = read_until(&mut sub, |t| {
        t.contains("\"reason\":\"echo\"") || t.matches("event: hold").count() > 20
    });
    let holds: Vec<serde_json::Value> = text
        .split("event: hold\ndata: ")
        .skip(1)
        // Only whole lines: the read may stop inside a later event.
        .filter_map(|rest| rest.split_once('\n').map(|(line, _)| line))
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    assert!(
        !holds.is_empty(),
        "no hold in 240 requests of 8 closed-loop clients: {text}"
    );
    for hold in &holds {
        assert!(
            hold["reason"] == "echo" || hold["reason"] == "burst",
            "{hold}"
        );
        let wait_ms = hold["planned_wait_ms"].as_f64().unwrap();
        // The rule's horizon: the batch the held requests would have run in (10 ms).
        assert!(wait_ms > 0.0 && wait_ms <= 10.5, "{hold}");
        assert!(hold["expected_joiners"].as_f64().unwrap() > 0.0, "{hold}");
        assert!(hold["queued"].as_u64().unwrap() >= 1, "{hold}");
    }
    abe.shutdown();
}
