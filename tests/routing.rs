//! Routing across backends, end to end over HTTP on 127.0.0.1: several `sim` backends in one
//! abe, requests routed by model, alias, fallback and capability, errors as the spec says,
//! the `x-abe-route` header, `/v1/models`, per-backend metrics, and a failing backend's
//! requests retried on another one without loss.
//!
//! Upstream backends (other abe processes, a failing mock) are in tests/upstream_routing.rs.

use crate::common;

use abe::config::Config;
use abe::exec::sim::FaultSettings;
use common::{post_completion, start, test_config, Client};

/// Three sim backends:
/// - `small` serves `m-small` (context 64 tokens, no capabilities), priority 0;
/// - `big` serves `m-big` (vision, tools, json) and `m-shared`, priority 1;
/// - `spare` serves `m-shared`, priority 2.
///
/// Aliases: `fast` -> `m-small`. Fallbacks: `m-small` -> [`m-big`].
fn routed_config() -> Config {
    let mut c = test_config();
    let toml = r#"
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
        capabilities = { vision = true, tools = true, json_mode = true }
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
        strategy = "priority_only"
        max_retries = 2
        [routing.aliases]
        fast = "m-small"
        [routing.fallbacks]
        m-small = ["m-big"]
    "#;
    let file: Config = toml::from_str(toml).expect("test config parses");
    c.backends = file.backends;
    c.routing = file.routing;
    c
}

#[test]
fn requests_go_to_the_backend_serving_their_model_and_say_so() {
    let abe = start(routed_config());
    let mut c = Client::connect(abe.local_addr());
    let r = post_completion(&mut c, "m-small", "hi");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.header("x-abe-route"),
        Some("backend=small; model=m-small; via=direct")
    );
    assert_eq!(r.json()["model"], "m-small");

    let r = post_completion(&mut c, "m-big", "hi");
    assert_eq!(
        r.header("x-abe-route"),
        Some("backend=big; model=m-big; via=direct")
    );

    // Alias: served by the target, the header names what was asked for.
    let r = post_completion(&mut c, "fast", "hi");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.header("x-abe-route"),
        Some("backend=small; model=m-small; via=alias; requested=fast")
    );

    // Too long for m-small's 64-token context: its fallback m-big serves it.
    let long = "word ".repeat(100);
    let r = post_completion(&mut c, "m-small", &long);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.header("x-abe-route"),
        Some("backend=big; model=m-big; via=fallback; requested=m-small")
    );

    // priority_only: the shared model goes to the preferred backend.
    let r = post_completion(&mut c, "m-shared", "x");
    assert_eq!(
        r.header("x-abe-route"),
        Some("backend=big; model=m-shared; via=direct")
    );

    // A stream's head says where it went too.
    let body =
        serde_json::json!({"model": "fast", "prompt": "hi", "max_tokens": 3, "stream": true})
            .to_string();
    let r = c.request("POST", "/v1/completions", Some(&body));
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("x-abe-route"),
        Some("backend=small; model=m-small; via=alias; requested=fast")
    );
    assert!(r.text().contains("data: [DONE]"));

    // Embeddings are routed too.
    let body = serde_json::json!({"model": "m-shared", "input": ["a", "b"]}).to_string();
    let r = c.request("POST", "/v1/embeddings", Some(&body));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["data"].as_array().unwrap().len(), 2);
    abe.shutdown();
}

#[test]
fn routing_errors_are_the_specs() {
    let abe = start(routed_config());
    let mut c = Client::connect(abe.local_addr());
    let r = post_completion(&mut c, "gpt-5", "hi");
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["code"], "model_not_found");
    assert!(r.error_message().contains("Model 'gpt-5' not found"));

    let r = post_completion(&mut c, "", "hi");
    assert_eq!(r.status, 400);

    // Vision and tools on a model whose only backend has neither.
    let chat = serde_json::json!({
        "model": "m-shared",
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
        ]}],
        "tools": [{"type": "function", "function": {"name": "f"}}],
    })
    .to_string();
    let r = c.request("POST", "/v1/chat/completions", Some(&chat));
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "capability_mismatch");
    let msg = r.error_message();
    assert!(msg.contains("vision") && msg.contains("tools"), "{msg}");

    // The same request to the capable model is served.
    let chat = chat.replace("m-shared", "m-big");
    let r = c.request("POST", "/v1/chat/completions", Some(&chat));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.header("x-abe-route"),
        Some("backend=big; model=m-big; via=direct")
    );
    abe.shutdown();
}

#[test]
fn models_lists_every_routable_name_and_metrics_have_each_backend() {
    let abe = start(routed_config());
    let mut c = Client::connect(abe.local_addr());
    let r = c.request("GET", "/v1/models", None);
    assert_eq!(r.status, 200);
    let v = r.json();
    let ids: Vec<&str> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    for name in ["m-small", "m-big", "m-shared", "fast"] {
        assert!(ids.contains(&name), "{name} missing from {ids:?}");
    }
    let alias = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == "fast")
        .unwrap();
    assert_eq!(alias["abe_alias_of"], "m-small");

    for _ in 0..3 {
        let r = post_completion(&mut c, "m-small", "hi");
        assert_eq!(r.status, 200);
    }
    // Published at least every few ms; poll until the counters show.
    let mut page = String::new();
    for _ in 0..200 {
        page = c.request("GET", "/metrics", None).text();
        if page.contains("abe_backend_requests_total{backend=\"small\",event=\"routed\"} 3") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(
        page.contains("abe_backend_requests_total{backend=\"small\",event=\"routed\"} 3"),
        "{page}"
    );
    assert!(page.contains("abe_backend_healthy{backend=\"spare\"} 1"));
    assert!(page.contains("abe_backend_circuit_state{backend=\"big\",state=\"closed\"} 1"));
    let j = c.request("GET", "/metrics/json", None).json();
    let names: Vec<&str> = j["backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["small", "big", "spare"]);
    assert!(j["backends"][0]["latency_ema_ms"].is_number());
    abe.shutdown();
}

#[test]
fn a_failing_backend_is_routed_around_and_nothing_is_lost() {
    let abe = start(routed_config());
    // Workers in backend order: small = 0, big = 1..=2, spare = 3. Fail every batch on big.
    for w in [1, 2] {
        abe.handle.set_faults(
            w,
            FaultSettings {
                error_rate: 1.0,
                ..Default::default()
            },
        );
    }
    let mut c = Client::connect(abe.local_addr());
    for i in 0..40 {
        let r = post_completion(&mut c, "m-shared", &format!("p{i}"));
        assert_eq!(r.status, 200, "request {i}: {}", r.text());
        assert_eq!(
            r.header("x-abe-route"),
            Some("backend=spare; model=m-shared; via=direct"),
            "request {i}"
        );
    }
    // big's workers opened their circuits; routing stopped trying it.
    let mut j = serde_json::Value::Null;
    for _ in 0..200 {
        j = c.request("GET", "/metrics/json", None).json();
        if j["backends"][1]["circuit"] == "open" && j["backends"][2]["routed"] == 40 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(j["backends"][1]["circuit"], "open", "{j}");
    let retried = j["backends"][1]["retried_away"].as_u64().unwrap();
    // Two workers x five failures each open both circuits.
    assert_eq!(retried, 10, "{j}");
    assert_eq!(j["backends"][2]["routed"], 40, "{j}");
    assert_eq!(j["backends"][1]["failed"], 0, "{j}");

    // A model only big serves has nowhere else to go: 503 naming why.
    let r = post_completion(&mut c, "m-big", "x");
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "no_healthy_backend");
    abe.shutdown();
}

/// Two sim backends of different speeds: `[workers.backends.slow]` gives `slow` its own
/// latency model over `[workers]`' (zero latency in tests). Each batch on `slow` sleeps at
/// least its 120 ms base, so its measured batch latency can be no lower; with one latency
/// model for every sim backend it would be `[workers]`' ~0.
#[test]
fn a_sim_backend_with_its_own_latency_model_runs_at_that_speed() {
    let mut c = test_config();
    let toml = r#"
        [workers.backends.slow]
        latency_model = "linear"
        base_latency_ms = 120.0
        per_token_latency_ms = 0.0
        latency_variance = 0.0

        [[backends]]
        name = "fast"
        kind = "sim"
        [[backends.models]]
        name = "m-fast"
        context_length = 4096

        [[backends]]
        name = "slow"
        kind = "sim"
        [[backends.models]]
        name = "m-slow"
        context_length = 4096
    "#;
    let file: Config = toml::from_str(toml).expect("test config parses");
    c.backends = file.backends;
    c.workers.backends = file.workers.backends;
    let abe = start(c);
    let mut client = Client::connect(abe.local_addr());
    for model in ["m-fast", "m-slow", "m-fast", "m-slow"] {
        let r = post_completion(&mut client, model, "hi");
        assert_eq!(r.status, 200, "{}", r.text());
        let backend = model.trim_start_matches("m-");
        assert_eq!(
            r.header("x-abe-route"),
            Some(format!("backend={backend}; model={model}; via=direct").as_str())
        );
    }
    let ema = |page: &str, backend: &str| -> Option<f64> {
        let key = format!("abe_backend_latency_ema_seconds{{backend=\"{backend}\"}} ");
        page.lines()
            .find_map(|l| l.strip_prefix(key.as_str()))
            .map(|v| v.trim().parse().expect("a number"))
    };
    // Published every few ms; poll until both backends have a measurement.
    let mut page = String::new();
    for _ in 0..300 {
        page = client.request("GET", "/metrics", None).text();
        if ema(&page, "fast").is_some() && ema(&page, "slow").is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let slow = ema(&page, "slow").unwrap_or_else(|| panic!("no slow latency in {page}"));
    assert!(
        slow >= 0.120,
        "slow's batches took {slow} s, under its 120 ms base"
    );
    assert!(ema(&page, "fast").is_some(), "{page}");
    abe.shutdown();
}
