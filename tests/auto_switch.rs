//! Switching to and from `auto` at run time, under load, over real TCP on 127.0.0.1: no
//! request is lost or answered twice, the server's counters reconcile, and /metrics shows
//! what `auto` learned.

use crate::common;

use abe::core::strategy::StrategyKind;
use abe::exec::latency::LatencyKind;
use common::{start, test_config, Client};
use serde_json::Value;
use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// Client threads sending completions back to back.
const CLIENTS: usize = 6;
/// Most requests one client sends (bounds the test if the switches run long).
const REQUESTS_PER_CLIENT_MAX: usize = 400;
/// Strategies in force in turn; every other one is `auto`.
const SWITCHES: [&str; 10] = [
    "auto",
    "fixed",
    "auto",
    "multi_bin",
    "auto",
    "queue_depth",
    "auto",
    "dynamic",
    "auto",
    "latency_aware",
];
/// How long each strategy runs under load once the engine shows it.
const DWELL: Duration = Duration::from_millis(120);

/// What one client saw: the completion ids of its 200 answers, and anything else.
struct ClientLog {
    ids: Vec<String>,
    errors: Vec<String>,
}

fn client(addr: SocketAddr, i: usize, stop: Arc<AtomicBool>) -> ClientLog {
    let mut c = Client::connect(addr);
    let mut log = ClientLog {
        ids: Vec::new(),
        errors: Vec::new(),
    };
    for n in 0..REQUESTS_PER_CLIENT_MAX {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        // Prompts of a few lengths, so several token buckets see traffic.
        let prompt = "word ".repeat(1 + (i * 7 + n) % 40);
        let body = serde_json::json!({"prompt": prompt, "max_tokens": 4}).to_string();
        let r = c.request("POST", "/v1/completions", Some(&body));
        if r.status == 200 {
            log.ids
                .push(r.json()["id"].as_str().unwrap_or_default().to_string());
        } else {
            log.errors
                .push(format!("client {i} request {n}: {} {}", r.status, r.text()));
        }
    }
    log
}

/// The first sample of `name` on a Prometheus page (any labels).
fn metric(page: &str, name: &str) -> f64 {
    page.lines()
        .find(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{page}"))
}

/// `promtool check metrics` passes on `page` (skipped when promtool is not on PATH). The one
/// complaint accepted is the one `tools/promtool_check.sh` accepts: vLLM's `vllm:` names
/// (exported beside `abe_*` so tools built for vLLM read abe) contain ':', which promtool
/// reserves for recording rules.
fn promtool_accepts(page: &str) {
    use std::io::Write as _;
    use std::process::{Command, Stdio};
    let child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let Ok(mut child) = child else {
        eprintln!("SKIPPED promtool check: promtool is not on PATH");
        return;
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(page.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let others: Vec<&str> = said
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter(|l| !(l.starts_with("vllm:") && l.ends_with("metric names should not contain ':'")))
        .collect();
    assert!(
        others.is_empty(),
        "promtool check metrics: {}\n{page}",
        others.join("\n")
    );
}

#[test]
fn switching_to_and_from_auto_under_load_loses_nothing() {
    let mut cfg = test_config();
    // One worker whose batch costs 2 ms + 0.02 ms per token: batches form, and `auto`
    // has a fixed cost to learn.
    cfg.workers.count = 1;
    cfg.workers.latency_model = LatencyKind::Linear;
    cfg.workers.base_latency_ms = 2.0;
    cfg.workers.per_token_latency_ms = 0.02;
    cfg.workers.latency_variance = 0.0;
    cfg.batching.strategy = StrategyKind::Fixed;
    let abe = start(cfg);
    let addr = abe.local_addr();
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let stop = stop.clone();
            thread::spawn(move || client(addr, i, stop))
        })
        .collect();

    let mut admin = Client::connect(addr);
    for name in SWITCHES {
        let r = admin.request("POST", &format!("/admin/strategy/{name}"), None);
        assert_eq!(r.status, 200, "switch to {name}: {}", r.text());
        // The engine applies the switch on its next turn; the snapshot shows it within 50 ms.
        let until = Instant::now() + Duration::from_secs(5);
        while admin.request("GET", "/admin/strategy", None).json()["strategy"] != name {
            assert!(Instant::now() < until, "switch to {name} not visible");
            thread::sleep(Duration::from_millis(10));
        }
        thread::sleep(DWELL);
    }
    stop.store(true, Ordering::Relaxed);

    let mut ids = HashSet::new();
    let mut sent = 0u64;
    for c in clients {
        let log = c.join().expect("client thread");
        assert!(log.errors.is_empty(), "{:#?}", log.errors);
        sent += log.ids.len() as u64;
        for id in log.ids {
            assert!(ids.insert(id.clone()), "completion id {id} answered twice");
        }
    }
    assert!(
        sent >= (CLIENTS * 10) as u64,
        "too little load to mean anything: {sent} requests"
    );

    // Every request answered once: the server's own counters agree once published.
    let until = Instant::now() + Duration::from_secs(5);
    let json = loop {
        let v: Value = admin.request("GET", "/metrics/json", None).json();
        let r = &v["requests"];
        let (admitted, completed, failed) = (
            r["admitted"].as_u64().unwrap(),
            r["completed"].as_u64().unwrap(),
            r["failed"].as_u64().unwrap(),
        );
        if admitted == sent && admitted == completed + failed {
            break v;
        }
        assert!(
            Instant::now() < until,
            "counters do not reconcile: sent {sent}, admitted {admitted}, completed \
             {completed}, failed {failed}"
        );
        thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(json["requests"]["failed"], 0);
    assert_eq!(json["requests"]["rejected"], 0);
    let completions = &json["http"]["responses"]["completions"];
    assert_eq!(completions["200"].as_u64(), Some(sent), "{completions}");
    assert_eq!(completions.as_object().unwrap().len(), 1, "{completions}");
    let auto = &json["backends"][0]["auto"];
    eprintln!(
        "{sent} requests over {} switches; flush reasons {}; auto {auto}",
        SWITCHES.len(),
        json["flush_reasons"]
    );
    assert!(auto["cost_samples"].as_u64().unwrap() > 0, "{auto}");

    // /metrics shows what auto learned and did.
    let page = admin.request("GET", "/metrics", None).text();
    assert!(metric(&page, "abe_auto_cost_samples") > 0.0, "{page}");
    let one_request_s = metric(&page, "abe_auto_cost_fixed_seconds")
        + metric(&page, "abe_auto_cost_per_request_seconds");
    assert!(one_request_s > 0.0, "a fitted cost: {page}");
    let decided: f64 = page
        .lines()
        .filter(|l| l.starts_with("abe_auto_decisions_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(decided > 0.0, "auto decided under load: {page}");
    assert!(metric(&page, "abe_auto_arrival_rate_per_second") > 0.0);
    promtool_accepts(&page);
    let report = abe.shutdown();
    assert!(report.clean);
    assert_eq!((report.completed, report.failed), (sent, 0));
}
