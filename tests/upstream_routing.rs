//! abe in front of real upstreams, over HTTP on 127.0.0.1: two other `abe serve` processes
//! and a mock OpenAI server that fails on demand. Routing by model, alias and fallback;
//! streaming relayed; a backend killed mid-run is detected, routed around with nothing
//! lost, and comes back; upstream failures reach the client as 502 / 504 / the backend's
//! own 4xx.

use crate::common;

use abe::config::Config;
use common::mock_upstream::{MockUpstream, Mode};
use common::{post_completion, start, test_config, Client};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// An `abe serve` child process on a loopback port; killed on drop.
struct AbeProcess {
    child: Child,
    addr: SocketAddr,
}

impl AbeProcess {
    /// Starts `abe serve` on `port` (0: any) serving `model`, zero latency.
    fn start(model: &str, port: u16) -> AbeProcess {
        AbeProcess::start_with(model, port, &[])
    }

    /// As [`AbeProcess::start`], with more `ABE_*` settings.
    fn start_with(model: &str, port: u16, env: &[(&str, &str)]) -> AbeProcess {
        let mut child = Command::new(env!("CARGO_BIN_EXE_abe"))
            .args(["serve", "--port", &port.to_string()])
            .envs(env.iter().copied())
            .env("ABE_SERVER_MODEL_NAME", model)
            .env("ABE_WORKERS_LATENCY_MODEL", "none")
            .env("ABE_WORKERS_COUNT", "2")
            .env("ABE_ENGINE_PIN", "false")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("abe binary starts");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(url) = line.strip_prefix("abe listening on http://") {
                    let _ = tx.send(url.parse::<SocketAddr>().expect("address"));
                }
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("abe prints its address");
        AbeProcess { child, addr }
    }

    fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for AbeProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A test config whose backends, routing, upstream and health sections are `toml`'s.
pub(crate) fn front(toml: &str) -> Config {
    let file: Config = toml::from_str(toml).expect("front config parses");
    let mut c = test_config();
    c.backends = file.backends;
    c.routing = file.routing;
    c.upstream = file.upstream;
    c.health = file.health;
    c
}

/// Polls `/metrics/json` until `ok` holds (bounded), returning the last page.
fn metrics_until(
    c: &mut Client,
    what: &str,
    ok: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let j = c.request("GET", "/metrics/json", None).json();
        if ok(&j) {
            return j;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {j}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn routes_by_model_alias_and_fallback_across_two_abe_processes() {
    let alpha = AbeProcess::start("alpha", 0);
    let beta = AbeProcess::start("beta", 0);
    let abe = start(front(&format!(
        r#"
        [[backends]]
        name = "up-alpha"
        kind = "upstream"
        base_url = "{}"
        prompt_array = true
        [[backends.models]]
        name = "alpha"
        context_length = 4096
        [[backends]]
        name = "up-beta"
        kind = "upstream"
        base_url = "{}"
        [[backends.models]]
        name = "beta"
        context_length = 4096
        capabilities = {{ json_mode = true }}
        [routing.aliases]
        a = "alpha"
        [routing.fallbacks]
        gamma = ["beta"]
        "#,
        alpha.base_url(),
        beta.base_url()
    )));
    let mut c = Client::connect(abe.local_addr());
    // The front answers what the upstream abe generated (same engine, same text).
    let direct = post_completion(&mut Client::connect(alpha.addr), "alpha", "hello").json();
    let r = post_completion(&mut c, "alpha", "hello");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.header("x-abe-route"),
        Some("backend=up-alpha; model=alpha; via=direct")
    );
    assert_eq!(r.json()["choices"][0]["text"], direct["choices"][0]["text"]);

    let r = post_completion(&mut c, "a", "hello");
    assert_eq!(
        r.header("x-abe-route"),
        Some("backend=up-alpha; model=alpha; via=alias; requested=a")
    );
    let r = post_completion(&mut c, "gamma", "hi");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.header("x-abe-route"),
        Some("backend=up-beta; model=beta; via=fallback; requested=gamma")
    );

    // Capability: JSON mode only on beta.
    let chat = |model: &str| {
        serde_json::json!({
            "model": model,
            "messages": [{"role": "user", "content": "give me json"}],
            "response_format": {"type": "json_object"},
            "max_tokens": 3,
        })
        .to_string()
    };
    let r = c.request("POST", "/v1/chat/completions", Some(&chat("alpha")));
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "capability_mismatch");
    let r = c.request("POST", "/v1/chat/completions", Some(&chat("beta")));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["object"], "chat.completion");

    // Embeddings and a relayed stream.
    let body = serde_json::json!({"model": "beta", "input": ["x", "y", "z"]}).to_string();
    let r = c.request("POST", "/v1/embeddings", Some(&body));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["data"].as_array().unwrap().len(), 3);
    let body = serde_json::json!({
        "model": "alpha", "prompt": "stream me", "max_tokens": 6, "stream": true
    })
    .to_string();
    let r = c.request("POST", "/v1/completions", Some(&body));
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("x-abe-route"),
        Some("backend=up-alpha; model=alpha; via=direct"),
        "a stream's head names its backend too"
    );
    let text = r.text();
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    let streamed: String = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| {
            let v: serde_json::Value = serde_json::from_str(d).unwrap();
            v["choices"][0]["text"].as_str().unwrap_or("").to_string()
        })
        .collect();
    let direct = Client::connect(alpha.addr)
        .request(
            "POST",
            "/v1/completions",
            Some(
                &serde_json::json!({"model": "alpha", "prompt": "stream me", "max_tokens": 6})
                    .to_string(),
            ),
        )
        .json();
    assert_eq!(streamed, direct["choices"][0]["text"].as_str().unwrap());

    // /v1/models lists what is routable through the front.
    let models = c.request("GET", "/v1/models", None).json();
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    for id in ["alpha", "beta", "a", "gamma"] {
        assert!(ids.contains(&id), "{id} not in {ids:?}");
    }
    abe.shutdown();
}

#[test]
fn a_backend_killed_mid_run_is_routed_around_nothing_is_lost_and_it_comes_back() {
    let mut one = AbeProcess::start("shared", 0);
    let two = AbeProcess::start("shared", 0);
    let port_one = one.addr.port();
    let abe = start(front(&format!(
        r#"
        [[backends]]
        name = "one"
        kind = "upstream"
        base_url = "{}"
        max_concurrent_batches = 2
        [[backends.models]]
        name = "shared"
        context_length = 4096
        [[backends]]
        name = "two"
        kind = "upstream"
        base_url = "{}"
        max_concurrent_batches = 2
        [[backends.models]]
        name = "shared"
        context_length = 4096
        [routing]
        strategy = "round_robin"
        max_retries = 2
        [health]
        check_interval = "100ms"
        # Workers' circuits opened while it was down; let them probe again soon.
        recovery_timeout = "300ms"
        "#,
        one.base_url(),
        two.base_url()
    )));
    let addr = abe.local_addr();
    // Four clients, 100 requests each; backend one dies a quarter of the way in.
    let clients: Vec<_> = (0..4)
        .map(|t| {
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                let mut statuses = Vec::new();
                for i in 0..100 {
                    let r = post_completion(&mut c, "shared", &format!("t{t} r{i}"));
                    statuses.push((r.status, r.text()));
                }
                statuses
            })
        })
        .collect();
    let mut c = Client::connect(addr);
    metrics_until(&mut c, "traffic on both backends", |j| {
        j["backends"][0]["routed"].as_u64() >= Some(25)
            && j["backends"][1]["routed"].as_u64() >= Some(25)
    });
    one.kill();
    for h in clients {
        for (status, body) in h.join().unwrap() {
            assert_eq!(status, 200, "a request was lost: {body}");
        }
    }
    let j = metrics_until(&mut c, "backend one unhealthy", |j| {
        j["backends"][0]["healthy"] == false
    });
    assert_eq!(j["backends"][1]["healthy"], true);
    // While it is down, everything goes to two.
    for i in 0..10 {
        let r = post_completion(&mut c, "shared", &format!("d{i}"));
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(
            r.header("x-abe-route"),
            Some("backend=two; model=shared; via=direct")
        );
    }
    // Back on the same port: healthy again, and it takes traffic again.
    let _one_again = AbeProcess::start("shared", port_one);
    metrics_until(&mut c, "backend one healthy again", |j| {
        j["backends"][0]["healthy"] == true
    });
    let mut served_by_one = 0;
    std::thread::sleep(Duration::from_millis(350));
    for i in 0..10 {
        let r = post_completion(&mut c, "shared", &format!("b{i}"));
        assert_eq!(r.status, 200, "{}", r.text());
        if r.header("x-abe-route") == Some("backend=one; model=shared; via=direct") {
            served_by_one += 1;
        }
    }
    assert!(
        served_by_one > 0,
        "backend one never served after it came back"
    );
    abe.shutdown();
    drop(two);
}

/// A front over `mock` from a user's file whose `upstream` table adds `extra` to its name,
/// kind, address and model (read as a user's file is, so the per-kind defaults apply),
/// answering once its health checker has seen the mock up.
fn front_on_defaults(mock: &MockUpstream, extra: &str) -> (abe::serve::Running, Config) {
    let file = Config::from_toml(&format!(
        "[[backends]]\nname = \"server\"\nkind = \"upstream\"\nbase_url = \"{}\"\n{extra}\
         [[backends.models]]\nname = \"m\"\ncontext_length = 4096\n",
        mock.base_url()
    ))
    .expect("the file reads");
    let mut cfg = test_config();
    cfg.backends = file.backends.clone();
    let abe = start(cfg);
    let mut c = Client::connect(abe.local_addr());
    let deadline = Instant::now() + Duration::from_secs(20);
    while post_completion(&mut c, "m", "warm").status != 200 {
        assert!(Instant::now() < deadline, "the front never answered");
        std::thread::sleep(Duration::from_millis(50));
    }
    (abe, file)
}

/// `clients` clients at once through `abe`, each checked for its own answer.
fn clients_at_once(abe: &abe::serve::Running, clients: usize) {
    let addr = abe.local_addr();
    let threads: Vec<_> = (0..clients)
        .map(|i| {
            std::thread::spawn(move || {
                let prompt = format!("client {i}");
                let r = post_completion(&mut Client::connect(addr), "m", &prompt);
                (prompt, r.status, r.json())
            })
        })
        .collect();
    for t in threads {
        let (prompt, status, body) = t.join().expect("client thread");
        assert_eq!(status, 200, "{body}");
        let text = body["choices"][0]["text"].as_str().unwrap_or_default();
        assert_eq!(text, format!("echo:{prompt}"), "{body}");
    }
}

/// The front's batches so far, and those of one request.
fn batches_and_singles(abe: &abe::serve::Running) -> (u64, u64) {
    let metrics = Client::connect(abe.local_addr())
        .request("GET", "/metrics", None)
        .text();
    let value = |name: &str| {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("{name} in /metrics"))
    };
    (
        value("abe_batch_size_requests_count"),
        value("abe_batch_size_requests_bucket{le=\"1\"}"),
    )
}

/// An `upstream` table that says only where the server is: abe forwards many requests at
/// once (64, not 4), so a server that batches for itself is sent what the clients send
/// (BENCHMARKS.md, "Upstream defaults").
#[test]
fn an_upstream_backend_on_defaults_forwards_many_requests_at_once() {
    let mock = MockUpstream::start();
    let (abe, file) = front_on_defaults(&mock, "");
    assert_eq!(file.backends[0].max_concurrent_batches, 64);
    // Twelve clients at once, each answer held a second by the server: on the old defaults
    // four went at once and the other eight waited for them, as one batch.
    mock.set_delay(Duration::from_secs(1));
    clients_at_once(&abe, 12);
    assert_eq!(mock.requests("/v1/completions"), 13, "one request each");
    assert!(
        mock.in_flight_max() >= 8,
        "forwarded at once: {} at most",
        mock.in_flight_max()
    );
    let (batches, singles) = batches_and_singles(&abe);
    assert_eq!((batches, singles), (13, 13), "a batch a request");
    // The spare slots' workers (64 each, waiting for a backend) are counted, not listed.
    let metrics = Client::connect(abe.local_addr())
        .request("GET", "/metrics", None)
        .text();
    let listed = metrics
        .lines()
        .filter(|l| l.starts_with("abe_worker_busy_seconds_total{"))
        .count();
    let threads: usize = metrics
        .lines()
        .find_map(|l| l.strip_prefix("abe_workers "))
        .and_then(|v| v.trim().parse().ok())
        .expect("abe_workers");
    assert_eq!(listed, 64, "the table's workers");
    assert!(threads > 64, "spare slots' workers counted: {threads}");
}

/// Without prompt arrays each completion goes alone even while every worker is busy: a
/// batch of several would be sent as several requests anyway and answered when its slowest
/// is back, holding the others' answers. Embeddings still batch: a batch of them is one
/// request with an input array.
#[test]
fn an_upstream_backend_without_prompt_arrays_sends_completions_alone_and_batches_embeddings() {
    let mock = MockUpstream::start();
    let (abe, _) = front_on_defaults(&mock, "max_concurrent_batches = 2\n");
    mock.set_delay(Duration::from_millis(300));
    // Six clients on two workers: four of them queue.
    clients_at_once(&abe, 6);
    assert!(mock.in_flight_max() <= 2, "{}", mock.in_flight_max());
    let (batches, singles) = batches_and_singles(&abe);
    assert_eq!((batches, singles), (7, 7), "a batch a completion");
    // Eight inputs in one request: batched into input arrays, not eight requests.
    let inputs: Vec<String> = (0..8).map(|i| format!("input {i}")).collect();
    let body = serde_json::json!({ "model": "m", "input": inputs }).to_string();
    let r = Client::connect(abe.local_addr()).request("POST", "/v1/embeddings", Some(&body));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["data"].as_array().map(Vec::len), Some(8));
    let sent = mock.requests("/v1/embeddings");
    assert!(
        (1..8).contains(&sent),
        "{sent} upstream requests for 8 inputs"
    );
}

/// With prompt arrays, chats still go alone: each is a request of its own upstream, and a
/// batch of several would hold each answer for the slowest. Plain completions batch.
#[test]
fn an_upstream_backend_with_prompt_arrays_sends_chats_alone() {
    let mock = MockUpstream::start();
    let (abe, _) = front_on_defaults(&mock, "prompt_array = true\nmax_concurrent_batches = 2\n");
    mock.set_delay(Duration::from_millis(300));
    // Six chat clients on two workers: four of them queue.
    let addr = abe.local_addr();
    let threads: Vec<_> = (0..6)
        .map(|i| {
            std::thread::spawn(move || {
                let body = serde_json::json!({
                    "model": "m",
                    "messages": [{ "role": "user", "content": format!("chat {i}") }],
                    "max_tokens": 4
                })
                .to_string();
                let r = Client::connect(addr).request("POST", "/v1/chat/completions", Some(&body));
                (r.status, r.text())
            })
        })
        .collect();
    for t in threads {
        let (status, text) = t.join().expect("client thread");
        assert_eq!(status, 200, "{text}");
    }
    assert_eq!(mock.requests("/v1/chat/completions"), 6);
    let (batches, singles) = batches_and_singles(&abe);
    assert_eq!(
        (batches, singles),
        (7, 7),
        "a batch a chat (and the warm-up)"
    );
}

#[test]
fn upstream_failures_are_retried_elsewhere_or_answered_502_504_or_as_the_backends_4xx() {
    let flaky = MockUpstream::start();
    let steady = MockUpstream::start();
    let abe = start(front(&format!(
        r#"
        [[backends]]
        name = "flaky"
        kind = "upstream"
        base_url = "{}"
        priority = 0
        [[backends.models]]
        name = "m"
        context_length = 4096
        [[backends.models]]
        name = "only-flaky"
        context_length = 4096
        [[backends]]
        name = "steady"
        kind = "upstream"
        base_url = "{}"
        priority = 10
        [[backends.models]]
        name = "m"
        context_length = 4096
        [routing]
        strategy = "priority_only"
        max_retries = 1
        [upstream]
        request_timeout = "500ms"
        [health]
        check_interval = "1h"
        "#,
        flaky.base_url(),
        steady.base_url()
    )));
    // The health checker probes each backend once at start (then hourly). Changing the
    // flaky mock's mode before it answered that probe would mark it unhealthy, which is
    // not what this test is about.
    let probed = Instant::now();
    while flaky.answered("/v1/models") == 0 || steady.answered("/v1/models") == 0 {
        assert!(
            probed.elapsed() < Duration::from_secs(30),
            "no start-up probe"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut c = Client::connect(abe.local_addr());
    let r = post_completion(&mut c, "m", "hi");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.header("x-abe-route"),
        Some("backend=flaky; model=m; via=direct")
    );

    // 5xx: retried on the next candidate, the client sees a success.
    flaky.set_mode(Mode::Status(500));
    let r = post_completion(&mut c, "m", "again");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.header("x-abe-route"),
        Some("backend=steady; model=m; via=direct")
    );
    assert_eq!(r.json()["choices"][0]["text"], "echo:again");
    // Nowhere else to go: 502 naming the backend and its answer.
    let r = post_completion(&mut c, "only-flaky", "x");
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "upstream_error");
    assert!(r.error_message().contains("'flaky'"), "{}", r.text());

    // A 4xx is the request's own problem: relayed, not retried.
    flaky.set_mode(Mode::Status(400));
    let before = steady.requests("/v1/completions");
    let r = post_completion(&mut c, "m", "bad");
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "upstream_rejected");
    assert_eq!(
        steady.requests("/v1/completions"),
        before,
        "4xx was retried"
    );

    // A backend that does not answer in time: 504 when nothing else can serve.
    flaky.set_mode(Mode::Hang);
    let r = post_completion(&mut c, "only-flaky", "slow");
    assert_eq!(r.status, 504, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "upstream_timeout");
    abe.shutdown();
}

#[test]
fn an_upstream_stream_is_relayed_chunk_by_chunk() {
    let mock = MockUpstream::start();
    // Each piece comes 200 ms after the previous one: the upstream is still streaming when
    // the first piece reaches the client, unless abe held it back.
    mock.set_piece_delay(Duration::from_millis(200));
    let abe = start(front(&format!(
        r#"
        [[backends]]
        name = "mock"
        kind = "upstream"
        base_url = "{}"
        [[backends.models]]
        name = "m"
        context_length = 4096
        "#,
        mock.base_url()
    )));
    let mut c = Client::connect(abe.local_addr());
    let body = serde_json::json!({
        "model": "m", "prompt": "one two three four five", "max_tokens": 8, "stream": true
    })
    .to_string();
    c.send_raw(&common::request_bytes(
        "POST",
        "/v1/completions",
        Some(&body),
        &[],
    ));
    let mut texts = Vec::new();
    let mut in_flight_at_first_piece = None;
    let mut line = String::new();
    loop {
        line.clear();
        let n = c.reader.read_line(&mut line).expect("stream readable");
        assert!(n > 0, "stream ended without [DONE]");
        let Some(data) = line.trim_end().strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        let v: serde_json::Value = serde_json::from_str(data).unwrap();
        let text = v["choices"][0]["text"].as_str().unwrap_or("").to_string();
        if !text.is_empty() && in_flight_at_first_piece.is_none() {
            in_flight_at_first_piece = Some(mock.in_flight());
        }
        texts.push(text);
    }
    assert_eq!(
        in_flight_at_first_piece,
        Some(1),
        "the first piece arrived only after the upstream finished"
    );
    assert_eq!(
        texts.concat(),
        common::mock_upstream::mock_text("one two three four five", 8)
    );
    abe.shutdown();
}

#[test]
fn tool_calls_from_an_upstream_reach_the_client_whole_and_streamed() {
    let mock = MockUpstream::start();
    let abe = start(front(&format!(
        r#"
        [[backends]]
        name = "tools-backend"
        kind = "upstream"
        base_url = "{}"
        [[backends.models]]
        name = "m"
        context_length = 4096
        capabilities = {{ tools = true }}
        "#,
        mock.base_url()
    )));
    let mut c = Client::connect(abe.local_addr());
    let request = |stream: bool| {
        serde_json::json!({
            "model": "m",
            "messages": [{"role": "user", "content": "weather in Oslo"}],
            "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}],
            "stream": stream,
        })
        .to_string()
    };
    let r = c.request("POST", "/v1/chat/completions", Some(&request(false)));
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    assert!(choice["message"]["content"].is_null(), "{v}");
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "get_weather");
    assert_eq!(call["function"]["arguments"], "{\"q\":\"weather in Oslo\"}");
    // The upstream was asked with the tools and without streaming.
    let sent = mock.last_json("/v1/chat/completions").unwrap();
    assert_eq!(sent["tools"][0]["function"]["name"], "get_weather");
    assert_eq!(sent["stream"], false);

    // A streaming client gets the calls in one delta (with `index`), then tool_calls.
    let r = c.request("POST", "/v1/chat/completions", Some(&request(true)));
    assert_eq!(r.status, 200);
    let events: Vec<serde_json::Value> = r
        .text()
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let calls: Vec<&serde_json::Value> = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"].get("tool_calls"))
        .collect();
    assert_eq!(calls.len(), 1, "{events:?}");
    assert_eq!(calls[0][0]["index"], 0);
    assert_eq!(calls[0][0]["function"]["name"], "get_weather");
    assert_eq!(
        events.last().unwrap()["choices"][0]["finish_reason"],
        "tool_calls"
    );
    abe.shutdown();
}

/// An `abe serve` "GPU server": continuous batching with prefix caching (the default), one
/// replica, so the backend's cache is one cache.
fn caching_server(model: &str) -> AbeProcess {
    AbeProcess::start_with(
        model,
        0,
        &[
            ("ABE_BATCHING_MODE", "continuous"),
            ("ABE_CONTINUOUS_PREFIX_CACHING", "true"),
            ("ABE_WORKERS_COUNT", "1"),
        ],
    )
}

/// A request-level front over `servers` (upstream backends `up-0`, `up-1`, ... serving
/// model "m") with `strategy`.
fn front_over(servers: &[AbeProcess], strategy: &str) -> Config {
    let mut toml = format!("[routing]\nstrategy = \"{strategy}\"\n");
    for (i, s) in servers.iter().enumerate() {
        toml.push_str(&format!(
            "[[backends]]\nname = \"up-{i}\"\nkind = \"upstream\"\nbase_url = \"{}\"\n\
             [[backends.models]]\nname = \"m\"\ncontext_length = 8192\n",
            s.base_url()
        ));
    }
    front(&toml)
}

/// A prompt of 1,600 bytes (400 tokens at abe's 4 bytes a token: 25 full KV blocks),
/// different for each `doc`.
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

/// The backend a front's answer names in `x-abe-route` (`up-N`).
fn routed_to(r: &common::Resp) -> String {
    assert_eq!(r.status, 200, "{}", r.text());
    let route = r.header("x-abe-route").expect("x-abe-route");
    route
        .strip_prefix("backend=")
        .and_then(|s| s.split(';').next())
        .unwrap_or_else(|| panic!("route header {route}"))
        .to_string()
}

/// A counter of a server's `/metrics`, summed over its labels.
fn server_counter(server: &AbeProcess, name: &str) -> u64 {
    let text = Client::connect(server.addr)
        .request("GET", "/metrics", None)
        .text();
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// The servers' summed `vllm:prefix_cache_hits_total` (tokens), read once their summed
/// `queries_total` shows all `query_tokens` (the metrics snapshot is published a moment
/// after the answers).
fn cluster_hit_tokens(servers: &[AbeProcess], query_tokens: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let sum = |name| servers.iter().map(|s| server_counter(s, name)).sum::<u64>();
        let queries = sum("vllm:prefix_cache_queries_total");
        if queries >= query_tokens {
            return sum("vllm:prefix_cache_hits_total");
        }
        assert!(
            Instant::now() < deadline,
            "servers counted {queries} of {query_tokens} prompt tokens"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends every document twice (a, b, c, ..., a, b, c, ...) through a front with `strategy`
/// over two caching servers; returns each document's two backends and the servers' summed
/// cache hits in tokens.
fn repeat_documents(strategy: &str, docs: usize) -> (Vec<(String, String)>, u64) {
    let servers = [caching_server("m"), caching_server("m")];
    let abe = start(front_over(&servers, strategy));
    let mut c = Client::connect(abe.local_addr());
    let mut first = Vec::new();
    let mut routes = Vec::new();
    for round in 0..2 {
        for d in 0..docs {
            let r = post_completion(&mut c, "m", &document(d));
            let backend = routed_to(&r);
            if round == 0 {
                first.push(backend);
            } else {
                routes.push((first[d].clone(), backend));
            }
        }
    }
    let hits = cluster_hit_tokens(&servers, 2 * docs as u64 * 400);
    (routes, hits)
}

#[test]
fn prefix_aware_sends_a_repeated_prompt_to_the_server_that_caches_it() {
    // Round robin alternates: with an odd count each repeat lands on the other server and
    // recomputes its whole prompt there.
    let (rr, rr_hits) = repeat_documents("round_robin", 3);
    assert!(rr.iter().all(|(a, b)| a != b), "round robin: {rr:?}");
    assert_eq!(rr_hits, 0, "round robin repeats go to a cold server");
    // prefix_aware: the front's approximate index remembers where each document went, and
    // the repeat goes there and hits all but the last of its 25 full blocks (at least one
    // token is computed: 24 blocks, 384 tokens). (One request at a time, nothing is in
    // flight, so a new document goes to the first least loaded server.)
    let (pa, pa_hits) = repeat_documents("prefix_aware", 3);
    assert!(pa.iter().all(|(a, b)| a == b), "prefix aware: {pa:?}");
    assert_eq!(pa_hits, 3 * 24 * 16, "every repeat hits its cached blocks");
}

#[test]
fn session_routing_keeps_a_session_on_one_server_by_header_or_user_field() {
    let servers = [caching_server("m"), caching_server("m")];
    let abe = start(front_over(&servers, "session"));
    let mut c = Client::connect(abe.local_addr());
    let mut used = std::collections::BTreeSet::new();
    for s in 0..8 {
        let id = format!("session-{s}");
        let body = |turn: usize| {
            serde_json::json!({"model": "m", "prompt": format!("turn {turn}"), "max_tokens": 2})
                .to_string()
        };
        let by_header: Vec<String> = (0..3)
            .map(|turn| {
                routed_to(&c.request_with(
                    "POST",
                    "/v1/completions",
                    Some(&body(turn)),
                    &[("X-Session-Id", &id)],
                ))
            })
            .collect();
        assert!(
            by_header.iter().all(|b| *b == by_header[0]),
            "{id}: {by_header:?}"
        );
        // The OpenAI `user` field is the same key when no header is given (chat too).
        let chat = serde_json::json!({
            "model": "m", "user": id, "max_tokens": 2,
            "messages": [{"role": "user", "content": "hello"}],
        })
        .to_string();
        let by_user = routed_to(&c.request("POST", "/v1/chat/completions", Some(&chat)));
        assert_eq!(by_user, by_header[0], "{id}: user field");
        used.insert(by_header[0].clone());
    }
    assert_eq!(used.len(), 2, "eight sessions spread over both servers");
}

#[test]
fn an_adapters_requests_ask_the_upstream_for_the_adapter_by_name() {
    // abe in front of abe: the upstream loads the adapter at run time, as a vLLM with
    // `--enable-lora` would; the front lists it on the upstream's model.
    let back = AbeProcess::start("base", 0);
    let mut b = Client::connect(back.addr);
    let r = b.request(
        "POST",
        "/v1/load_lora_adapter",
        Some(r#"{"lora_name":"sql-lora","lora_path":"/adapters/sql"}"#),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let mock = MockUpstream::start();
    let abe = start(front(&format!(
        r#"
        [[backends]]
        name = "up"
        kind = "upstream"
        base_url = "{}"
        [[backends.models]]
        name = "base"
        context_length = 4096
        adapters = ["sql-lora"]
        [[backends]]
        name = "mock"
        kind = "upstream"
        base_url = "{}"
        [[backends.models]]
        name = "mock-base"
        context_length = 4096
        adapters = ["mock-lora"]
        "#,
        back.base_url(),
        mock.base_url()
    )));
    let mut c = Client::connect(abe.local_addr());
    let r = post_completion(&mut c, "sql-lora", "select 1");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["model"], "sql-lora");
    assert_eq!(routed_to(&r), "up");
    // Gone from the upstream: the front's request now reaches it under a name it does not
    // serve, and the client gets the upstream's 404 (sent as the base model, it would be
    // served by the base model instead).
    let r = b.request(
        "POST",
        "/v1/unload_lora_adapter",
        Some(r#"{"lora_name":"sql-lora"}"#),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let r = post_completion(&mut c, "sql-lora", "select 2");
    assert_eq!(
        r.status,
        404,
        "the upstream was asked for sql-lora: {}",
        r.text()
    );
    assert_eq!(post_completion(&mut c, "base", "still served").status, 200);

    // What the upstream received, exactly: the adapter's name, completions and chat alike;
    // the base model's requests keep the base model's name.
    let r = post_completion(&mut c, "mock-lora", "hi");
    assert_eq!(r.status, 200, "{}", r.text());
    let sent = mock
        .last_json("/v1/completions")
        .expect("a completion was sent");
    assert_eq!(sent["model"], "mock-lora");
    let chat = serde_json::json!({
        "model": "mock-lora",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 3,
    });
    let r = c.request("POST", "/v1/chat/completions", Some(&chat.to_string()));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["model"], "mock-lora");
    let sent = mock
        .last_json("/v1/chat/completions")
        .expect("a chat was sent");
    assert_eq!(sent["model"], "mock-lora");
    assert_eq!(post_completion(&mut c, "mock-base", "hi").status, 200);
    let sent = mock.last_json("/v1/completions").unwrap();
    assert_eq!(sent["model"], "mock-base");
    abe.shutdown();
}
