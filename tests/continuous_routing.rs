//! Continuous batching across several `sim` backends, end to end over HTTP on 127.0.0.1:
//! each backend's workers are its replicas, a request is routed at admission to a backend
//! serving its model (alias, fallback, routing strategy as in request-level mode) and runs
//! only on that backend's slots; per-backend counters show where requests went and the
//! load the router sees returns to zero. An upstream backend in continuous mode is refused
//! at start with a message that says why.

use crate::common;

use abe::config::Config;
use abe::core::BatchingMode;
use abe::serve::Running;
use common::{post_completion, start, test_config, Client, Resp};
use serde_json::Value;

/// Three sim backends in continuous mode: `small` serves `m-small` (context 64), `big`
/// serves `m-big` and `m-shared`, `spare` serves `m-shared`; alias `fast` -> `m-small`,
/// fallback `m-small` -> `m-big`.
fn continuous_config(strategy: &str) -> Config {
    let mut c = test_config();
    c.batching.mode = BatchingMode::Continuous;
    let toml = format!(
        r#"
        [[backends]]
        name = "small"
        kind = "sim"
        priority = 0
        max_concurrent_batches = 1
        [[backends.models]]
        name = "m-small"
        context_length = 64

        [[backends]]
        name = "big"
        kind = "sim"
        priority = 1
        max_concurrent_batches = 2
        [[backends.models]]
        name = "m-big"
        context_length = 100000
        [[backends.models]]
        name = "m-shared"
        context_length = 100000

        [[backends]]
        name = "spare"
        kind = "sim"
        priority = 2
        max_concurrent_batches = 1
        [[backends.models]]
        name = "m-shared"
        context_length = 100000

        [routing]
        strategy = "{strategy}"
        [routing.aliases]
        fast = "m-small"
        [routing.fallbacks]
        m-small = ["m-big"]
    "#
    );
    let file: Config = toml::from_str(&toml).expect("test config parses");
    c.backends = file.backends;
    c.routing = file.routing;
    c
}

/// /metrics/json once `done(page)` holds (snapshots are published every few ms).
fn metrics_when(c: &mut Client, done: impl Fn(&Value) -> bool) -> Value {
    let mut j = Value::Null;
    for _ in 0..300 {
        j = c.request("GET", "/metrics/json", None).json();
        if done(&j) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    j
}

fn routed(j: &Value, b: usize) -> u64 {
    j["backends"][b]["routed"].as_u64().unwrap_or(0)
}

fn ok_via(r: &Resp, route: &str) {
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-abe-route"), Some(route));
}

#[test]
fn continuous_requests_are_routed_to_the_backend_serving_their_model() {
    let abe = start(continuous_config("priority_only"));
    let mut c = Client::connect(abe.local_addr());
    ok_via(
        &post_completion(&mut c, "m-small", "hi"),
        "backend=small; model=m-small; via=direct",
    );
    ok_via(
        &post_completion(&mut c, "m-big", "hi"),
        "backend=big; model=m-big; via=direct",
    );
    ok_via(
        &post_completion(&mut c, "fast", "hi"),
        "backend=small; model=m-small; via=alias; requested=fast",
    );
    // Too long for m-small's 64-token context: its fallback m-big serves it.
    ok_via(
        &post_completion(&mut c, "m-small", &"word ".repeat(100)),
        "backend=big; model=m-big; via=fallback; requested=m-small",
    );
    // priority_only: the shared model goes to the preferred backend.
    ok_via(
        &post_completion(&mut c, "m-shared", "x"),
        "backend=big; model=m-shared; via=direct",
    );
    // Streams are stepped on the backend they were routed to as well.
    let body =
        serde_json::json!({"model": "fast", "prompt": "hi", "max_tokens": 3, "stream": true})
            .to_string();
    let r = c.request("POST", "/v1/completions", Some(&body));
    ok_via(
        &r,
        "backend=small; model=m-small; via=alias; requested=fast",
    );
    assert!(r.text().contains("data: [DONE]"), "{}", r.text());
    let r = post_completion(&mut c, "gpt-5", "hi");
    assert_eq!(r.status, 404, "{}", r.text());

    let j = metrics_when(&mut c, |j| {
        routed(j, 0) + routed(j, 1) == 6 && j["requests"]["completed"] == 6
    });
    assert_eq!(
        [routed(&j, 0), routed(&j, 1), routed(&j, 2)],
        [3, 3, 0],
        "{j}"
    );
    assert_eq!(j["backends"][1]["via_fallback"], 1, "{j}");
    assert_eq!(j["backends"][0]["via_alias"], 2, "{j}");
    for b in 0..3 {
        assert_eq!(
            j["backends"][b]["pending_batches"], 0,
            "load returns to 0: {j}"
        );
    }
    // The steps ran on the replicas of the backends the requests went to: small's one
    // worker (0) and big's two (1, 2), never spare's (3).
    let steps = |w: usize| j["workers"][w]["batches_ok"].as_u64().unwrap_or(0);
    assert!(steps(0) > 0 && steps(1) + steps(2) > 0, "{j}");
    assert_eq!(steps(3), 0, "{j}");
    abe.shutdown();
}

#[test]
fn continuous_round_robin_spreads_a_shared_model_over_its_backends() {
    let abe = start(continuous_config("round_robin"));
    let mut c = Client::connect(abe.local_addr());
    for _ in 0..20 {
        let r = post_completion(&mut c, "m-shared", "hello there");
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let j = metrics_when(&mut c, |j| j["requests"]["completed"] == 20);
    assert_eq!(routed(&j, 0), 0, "{j}");
    assert_eq!(routed(&j, 1) + routed(&j, 2), 20, "{j}");
    assert!(routed(&j, 1) >= 5 && routed(&j, 2) >= 5, "{j}");
    let steps = |w: usize| j["workers"][w]["batches_ok"].as_u64().unwrap_or(0);
    assert!(steps(3) > 0, "spare's replica ran steps: {j}");
    abe.shutdown();
}

#[test]
fn a_backend_whose_replicas_all_failed_takes_no_new_requests_until_its_probe() {
    // m-shared is served by big (workers 1, 2) and spare (worker 3), round robin. spare's
    // one replica fails every step: one failure opens its circuit for a minute. From then
    // on the router must see spare as open and send everything to big; before, every other
    // request went to spare and waited for a slot until its timeout.
    let mut cfg = continuous_config("round_robin");
    cfg.health.failure_threshold = 1;
    cfg.health.recovery_timeout = abe::config::Millis(60_000);
    cfg.batching.request_timeout = abe::config::Millis(3_000);
    let abe = start(cfg);
    abe.handle.set_faults(
        3,
        abe::exec::sim::FaultSettings {
            error_rate: 1.0,
            ..Default::default()
        },
    );
    let mut c = Client::connect(abe.local_addr());
    let mut failed = 0;
    for _ in 0..4 {
        if post_completion(&mut c, "m-shared", "hello").status != 200 {
            failed += 1;
            break;
        }
    }
    assert_eq!(failed, 1, "spare's failing replica answered one request");
    for i in 0..20 {
        let r = post_completion(&mut c, "m-shared", "hello again");
        assert_eq!(r.status, 200, "request {i}: {}", r.text());
        assert_eq!(
            r.header("x-abe-route"),
            Some("backend=big; model=m-shared; via=direct"),
            "request {i}"
        );
    }
    let j = metrics_when(&mut c, |j| j["backends"][2]["circuit"] == "open");
    assert_eq!(j["backends"][2]["circuit"], "open", "{j}");
    abe.shutdown();
}

#[test]
fn an_upstream_backend_in_continuous_mode_is_refused_at_start_and_says_why() {
    let mut config = continuous_config("round_robin");
    let toml = r#"
        [[backends]]
        name = "vllm"
        kind = "upstream"
        base_url = "http://127.0.0.1:9"
        [[backends.models]]
        name = "m-up"
        context_length = 8192
    "#;
    let file: Config = toml::from_str(toml).expect("test config parses");
    config.backends.extend(file.backends);
    let e = match Running::start(config) {
        Ok(_) => panic!("continuous mode started with an upstream backend"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("batching.mode")
            && e.contains("upstream backend \"vllm\"")
            && e.contains("runs its own continuous batching")
            && e.contains("batching.mode = \"request\""),
        "{e}"
    );
}

/// A 1,600-byte prompt (400 tokens at abe's 4 bytes a token: 25 full KV blocks), different
/// for each `doc`.
fn document(doc: usize) -> String {
    let mut p = String::new();
    let mut i = 0;
    while p.len() < 1_600 {
        p.push_str(&format!(
            "Document {doc}, line {i}: the mill turns slowly. "
        ));
        i += 1;
    }
    p.truncate(1_600);
    p
}

fn complete(c: &mut Client, prompt: &str, max_tokens: u32) -> Resp {
    let body = serde_json::json!({"model": "m", "prompt": prompt, "max_tokens": max_tokens});
    c.request("POST", "/v1/completions", Some(&body.to_string()))
}

fn cached_tokens(r: &Resp) -> u64 {
    r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("no cached_tokens: {}", r.text()))
}

#[test]
fn prefix_aware_in_continuous_mode_asks_each_backends_own_cache() {
    let mut cfg = test_config();
    cfg.batching.mode = BatchingMode::Continuous;
    // Steps take time (10 ms and up), so a long request holds its backend's load.
    cfg.workers.latency_model = abe::exec::latency::LatencyKind::Linear;
    let file: Config = toml::from_str(
        r#"
        [[backends]]
        name = "a"
        kind = "sim"
        max_concurrent_batches = 1
        [[backends.models]]
        name = "m"
        context_length = 100000
        [[backends]]
        name = "b"
        kind = "sim"
        max_concurrent_batches = 1
        [[backends.models]]
        name = "m"
        context_length = 100000
        [routing]
        strategy = "prefix_aware"
        "#,
    )
    .expect("test config parses");
    cfg.backends = file.backends;
    cfg.routing = file.routing;
    let abe = start(cfg);
    let addr = abe.local_addr();
    // Document 0 goes to `a` (both idle: the first) and holds it for 30 decode steps ...
    let long = std::thread::spawn(move || complete(&mut Client::connect(addr), &document(0), 30));
    let mut c = Client::connect(addr);
    metrics_when(&mut c, |j| routed(j, 0) == 1);
    // ... so document 1, matching nothing, goes to the less loaded `b`.
    ok_via(
        &complete(&mut c, &document(1), 2),
        "backend=b; model=m; via=direct",
    );
    ok_via(&long.join().unwrap(), "backend=a; model=m; via=direct");
    // One at a time now, nothing in flight: least_loaded would send both repeats to `a`.
    // The replicas' own block tables say where each is cached (24 of its 25 full blocks
    // hit: at least one token is computed).
    for (doc, backend) in [(1, "b"), (0, "a")] {
        let r = complete(&mut c, &document(doc), 2);
        ok_via(&r, &format!("backend={backend}; model=m; via=direct"));
        assert_eq!(cached_tokens(&r), 24 * 16, "document {doc}");
    }
}
