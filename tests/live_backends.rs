//! Backends that come and go while abe serves, over HTTP on loopback: removed through
//! `DELETE /admin/backends/{name}` under load (nothing new routed there, what it held
//! answered, then its slot empty and its `/metrics` series gone), added back through
//! `POST /admin/backends`, in both batching modes; refused changes that change nothing;
//! `POST /admin/reload` and `SIGHUP` applying a new config file and refusing a bad one with
//! the start's error; DNS discovery following `/etc/hosts` lines that point at `abe serve`
//! instances on 127.0.0.2 and 127.0.0.3.

use crate::common;

use abe::config::Config;
use abe::core::BatchingMode;
use abe::exec::latency::LatencyKind;
use abe::serve::Running;
use common::mock_upstream::MockUpstream;
use common::{start, test_config, Client, Resp};
use serde_json::Value;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// `toml`'s `[[backends]]` and `[routing]` over the test config.
fn with_backends(mut c: Config, toml_text: &str) -> Config {
    let file: Config = toml::from_str(toml_text).expect("test config parses");
    c.backends = file.backends;
    c.routing = file.routing;
    c.health = file.health;
    c
}

/// Waits until server `r`'s published snapshot counts more than `above` completed
/// requests. The snapshot is refreshed every few tens of milliseconds, so it can lag answers
/// the client already has (read at once, it failed under a loaded test run); the deadline is
/// a bound against hanging, not a timing check.
fn completed_above(r: &Running, above: u64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let completed = r.handle.snapshot().stats.completed;
        if completed > above {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {completed} completed, not above {above}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Polls `GET /admin/backends` until `ok` holds for the list (a bound against hanging, not
/// a timing check), returning it.
fn backends_until(addr: SocketAddr, what: &str, ok: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut c = Client::connect(addr);
    loop {
        let r = c.request("GET", "/admin/backends", None);
        assert_eq!(r.status, 200, "{}", r.text());
        let list = r.json()["backends"].as_array().cloned().unwrap_or_default();
        if ok(&list) {
            return list;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {list:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn state_of<'a>(list: &'a [Value], name: &str) -> &'a str {
    list.iter()
        .find(|b| b["name"] == name)
        .and_then(|b| b["state"].as_str())
        .unwrap_or("missing")
}

/// Clients sending completions for `model` until stopped; every answer's status and route
/// (an error's body instead of a route).
struct Load {
    stop: Arc<AtomicBool>,
    answers: Arc<Mutex<Vec<(u16, String)>>>,
    threads: Vec<std::thread::JoinHandle<u64>>,
}

impl Load {
    fn start(addr: SocketAddr, model: &str, clients: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let answers = Arc::new(Mutex::new(Vec::new()));
        let threads = (0..clients)
            .map(|i| {
                let (stop, answers, model) = (stop.clone(), answers.clone(), model.to_string());
                std::thread::spawn(move || {
                    let mut c = Client::connect(addr);
                    let mut sent = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let body = serde_json::json!({
                            "model": model, "prompt": format!("client {i} request {sent}"),
                            "max_tokens": 4
                        });
                        let r: Resp = c.request("POST", "/v1/completions", Some(&body.to_string()));
                        sent += 1;
                        let route = match r.status {
                            200 => r.header("x-abe-route").unwrap_or("").to_string(),
                            _ => r.text(),
                        };
                        answers.lock().unwrap().push((r.status, route));
                    }
                    sent
                })
            })
            .collect();
        Load {
            stop,
            answers,
            threads,
        }
    }

    /// Answers so far.
    fn count(&self) -> usize {
        self.answers.lock().unwrap().len()
    }

    /// Waits until `more` further answers came (bounded).
    fn wait_for(&self, more: usize) {
        let target = self.count() + more;
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.count() < target {
            assert!(
                Instant::now() < deadline,
                "load stalled at {}",
                self.count()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Routes of the answers from index `from` on.
    fn routes_since(&self, from: usize) -> Vec<String> {
        self.answers.lock().unwrap()[from..]
            .iter()
            .map(|(_, r)| r.clone())
            .collect()
    }

    /// Stops; asserts every request sent got exactly one answer, a 200.
    fn finish(self) -> Vec<(u16, String)> {
        self.stop.store(true, Ordering::Relaxed);
        let sent: u64 = self.threads.into_iter().map(|t| t.join().unwrap()).sum();
        let answers = std::mem::take(&mut *self.answers.lock().unwrap());
        assert_eq!(answers.len() as u64, sent, "one answer per request");
        let bad: Vec<_> = answers.iter().filter(|(s, _)| *s != 200).collect();
        assert!(
            bad.is_empty(),
            "{} of {sent} not 200: {:?}",
            bad.len(),
            &bad[..bad.len().min(5)]
        );
        answers
    }
}

/// The front's own count: every admitted request completed, none failed.
fn assert_reconciles(abe: &Running, answered: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = abe.handle.snapshot().stats;
        if s.completed as usize >= answered || Instant::now() > deadline {
            assert_eq!(s.failed, 0, "{s:?}");
            assert_eq!(s.completed, s.admitted - s.readmitted, "{s:?}");
            assert_eq!(s.completed as usize, answered, "{s:?}");
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn upstream_table(name: &str, url: &str) -> String {
    format!(
        r#"
        [[backends]]
        name = "{name}"
        kind = "upstream"
        base_url = "{url}"
        [[backends.models]]
        name = "m"
        context_length = 4096
        "#
    )
}

fn backend_json(name: &str, url: &str, priority: u32) -> String {
    serde_json::json!({
        "name": name, "kind": "upstream", "base_url": url, "priority": priority,
        "models": [{ "name": "m", "context_length": 4096 }]
    })
    .to_string()
}

#[test]
fn an_upstream_removed_under_load_drains_and_comes_back_through_the_admin_api() {
    let (a, b) = (MockUpstream::start(), MockUpstream::start());
    // In flight for a while, so the removal finds requests at `b`.
    a.set_delay(Duration::from_millis(15));
    b.set_delay(Duration::from_millis(15));
    let mut cfg = with_backends(
        test_config(),
        &format!(
            "{}{}[routing]\nstrategy = \"round_robin\"\n",
            upstream_table("a", &a.base_url()),
            upstream_table("b", &b.base_url())
        ),
    );
    cfg.server.admin_token = "s3cret".into();
    let abe = start(cfg);
    let addr = abe.local_addr();
    let auth = [("Authorization", "Bearer s3cret")];
    let mut c = Client::connect(addr);
    assert_eq!(c.request("GET", "/admin/backends", None).status, 401);
    assert_eq!(c.request("DELETE", "/admin/backends/b", None).status, 401);
    let list = c.request_with("GET", "/admin/backends", None, &auth).json();
    assert_eq!(list["backends"][1]["name"], "b");
    assert_eq!(list["backends"][1]["state"], "active");

    let load = Load::start(addr, "m", 6);
    load.wait_for(60);
    let r = c.request_with("DELETE", "/admin/backends/b", None, &auth);
    assert_eq!(r.status, 200, "{}", r.text());
    let mut admin =
        |method: &str, path: &str, body: Option<&str>| c.request_with(method, path, body, &auth);
    // Drained: the engine emptied the slot once what `b` held was answered.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let l = admin("GET", "/admin/backends", None).json();
        if l["backends"][1]["state"] == "empty" {
            break;
        }
        assert!(Instant::now() < deadline, "b never drained: {l}");
        std::thread::sleep(Duration::from_millis(10));
    }
    let metrics = admin("GET", "/metrics", None).text();
    assert!(!metrics.contains("backend=\"b\""), "b's series are gone");
    assert!(metrics.contains("abe_backend_healthy{backend=\"a\"} 1"));
    // Nothing new reaches b: its request count stands still while the load goes on.
    let at_b = b.requests("/v1/completions");
    let since = load.count();
    load.wait_for(60);
    assert_eq!(
        b.requests("/v1/completions"),
        at_b,
        "b got work after it drained"
    );
    assert!(load
        .routes_since(since)
        .iter()
        .all(|r| r.starts_with("backend=a;")));

    // Refused changes change nothing.
    let r = admin(
        "POST",
        "/admin/backends",
        Some(&backend_json("b", &b.base_url(), 7)),
    );
    assert_eq!(r.status, 409, "{}", r.text());
    assert!(r.error_message().contains("priority"), "{}", r.text());
    let r = admin("POST", "/admin/backends", Some("{\"name\": \"b\"}"));
    assert_eq!(r.status, 400);
    let r = admin("DELETE", "/admin/backends/nope", None);
    assert_eq!(r.status, 404);
    assert_eq!(
        admin("GET", "/admin/backends", None).json()["backends"][1]["state"],
        "empty"
    );

    // Back, at the same address: work reaches it again.
    let r = admin(
        "POST",
        "/admin/backends",
        Some(&backend_json("b", &b.base_url(), 50)),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let since = load.count();
    load.wait_for(100);
    assert!(b.requests("/v1/completions") > at_b, "b is routed to again");
    assert!(load
        .routes_since(since)
        .iter()
        .any(|r| r.starts_with("backend=b;")));
    let answers = load.finish();
    assert_reconciles(&abe, answers.len());
    abe.shutdown();
}

fn model_json(name: &str, url: &str, model: &str) -> String {
    serde_json::json!({
        "name": name, "kind": "upstream", "base_url": url,
        "models": [{ "name": model, "context_length": 4096 }]
    })
    .to_string()
}

/// A backend the config never named fills a spare slot under load: its model is served at
/// once (io threads and engine swap tables), its `/metrics` series appear; with every spare
/// slot in use the next new one is refused naming the key to raise; removed, it drains,
/// its series go, and its slot takes another new backend.
#[test]
fn a_new_backend_fills_a_spare_slot_under_load_and_its_slot_is_reused_once_empty() {
    let (a, c, d) = (
        MockUpstream::start(),
        MockUpstream::start(),
        MockUpstream::start(),
    );
    c.set_delay(Duration::from_millis(5));
    let abe = start(with_backends(
        test_config(),
        &format!(
            "{}[routing]\nspare_backend_slots = 1\n",
            upstream_table("a", &a.base_url())
        ),
    ));
    let addr = abe.local_addr();
    let mut admin = Client::connect(addr);
    let list = backends_until(addr, "the list", |_| true);
    assert_eq!(list.len(), 2, "a and one spare slot: {list:?}");
    assert_eq!(list[1]["spare"], true);
    assert_eq!(list[1]["state"], "empty");
    let load = Load::start(addr, "m", 3);
    load.wait_for(20);

    let r = admin.request(
        "POST",
        "/admin/backends",
        Some(&model_json("c", &c.base_url(), "m2")),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // Answered once the tables swapped: the new model is served now, on every io thread.
    let new_load = Load::start(addr, "m2", 2);
    new_load.wait_for(20);
    assert!(new_load
        .routes_since(0)
        .iter()
        .all(|r| r.starts_with("backend=c; model=m2")));
    assert!(c.requests("/v1/completions") > 0);
    let metrics = admin.request("GET", "/metrics", None).text();
    assert!(metrics.contains("backend=\"c\""), "c's series appear");
    let models = admin.request("GET", "/v1/models", None).text();
    assert!(models.contains("\"m2\""), "{models}");

    // Every spare slot in use: refused, with the key to raise; nothing changes.
    let r = admin.request(
        "POST",
        "/admin/backends",
        Some(&model_json("d", &d.base_url(), "m3")),
    );
    assert_eq!(r.status, 409, "{}", r.text());
    assert!(
        r.error_message().contains("routing.spare_backend_slots"),
        "{}",
        r.text()
    );
    let answered_m2 = new_load.finish();

    // Removed: drains, its series go, then its slot takes another new backend.
    let r = admin.request("DELETE", "/admin/backends/c", None);
    assert_eq!(r.status, 200, "{}", r.text());
    backends_until(addr, "c drained", |l| state_of(l, "c") == "empty");
    let metrics = admin.request("GET", "/metrics", None).text();
    assert!(!metrics.contains("backend=\"c\""), "c's series are gone");
    let r = admin.request(
        "POST",
        "/admin/backends",
        Some(&model_json("d", &d.base_url(), "m3")),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let list = backends_until(addr, "d active", |l| state_of(l, "d") == "active");
    assert_eq!(list.len(), 2, "d took c's slot: {list:?}");
    let r = admin.request(
        "POST",
        "/v1/completions",
        Some(r#"{"model": "m3", "prompt": "x", "max_tokens": 1}"#),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.header("x-abe-route"),
        Some("backend=d; model=m3; via=direct")
    );
    // d removed and drained, then added again with another model: its slot takes it.
    assert_eq!(
        admin.request("DELETE", "/admin/backends/d", None).status,
        200
    );
    backends_until(addr, "d drained", |l| state_of(l, "d") == "empty");
    let r = admin.request(
        "POST",
        "/admin/backends",
        Some(&model_json("d", &d.base_url(), "m4")),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let r = admin.request(
        "POST",
        "/v1/completions",
        Some(r#"{"model": "m4", "prompt": "x", "max_tokens": 1}"#),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // c's model is served by nobody now.
    let r = admin.request(
        "POST",
        "/v1/completions",
        Some(r#"{"model": "m2", "prompt": "x", "max_tokens": 1}"#),
    );
    assert!(matches!(r.status, 404 | 503), "{}", r.text());
    let answers = load.finish();
    assert_reconciles(&abe, answers.len() + answered_m2.len() + 2);
    abe.shutdown();
}

/// A reload that adds a table the config did not have at start fills a spare slot, and its
/// fallbacks change live: a model whose backend is removed falls back to the new one.
#[test]
fn a_reload_adds_a_new_backend_in_a_spare_slot_and_changes_fallbacks() {
    let (a, b) = (MockUpstream::start(), MockUpstream::start());
    let file = ConfigFile::new("spare");
    file.write(
        "",
        &format!(
            "{}[routing]\nspare_backend_slots = 2\n",
            upstream_table("a", &a.base_url())
        ),
    );
    let abe = Running::start(Config::from_file(&file.path).unwrap()).unwrap();
    let path = file.path.clone();
    abe.set_config_source(Box::new(move || Config::from_file(&path)));
    let addr = abe.local_addr();
    let mut c = Client::connect(addr);
    let load = Load::start(addr, "m", 3);
    load.wait_for(20);
    let with_b = format!(
        "{}{}[routing]\nspare_backend_slots = 2\n[routing.fallbacks]\nm = [\"m2\"]\n",
        upstream_table("a", &a.base_url()),
        r#"
        [[backends]]
        name = "b"
        kind = "upstream"
        base_url = "BURL"
        [[backends.models]]
        name = "m2"
        context_length = 4096
        "#
        .replace("BURL", &b.base_url())
    );
    file.write("", &with_b);
    let r = c.request("POST", "/admin/reload", None);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        r.text().contains("backend 'b': new, in a spare slot"),
        "{}",
        r.text()
    );
    assert!(r.text().contains("routing.fallbacks"), "{}", r.text());
    backends_until(addr, "b active", |l| state_of(l, "b") == "active");
    // a removed by hand: requests for m fall back to m2 on b, no error.
    let r = c.request("DELETE", "/admin/backends/a", None);
    assert_eq!(r.status, 200, "{}", r.text());
    backends_until(addr, "a drained", |l| state_of(l, "a") == "empty");
    let since = load.count();
    load.wait_for(20);
    assert!(load
        .routes_since(since)
        .iter()
        .all(|r| r.starts_with("backend=b; model=m2; via=fallback; requested=m")));
    let answers = load.finish();
    assert_reconciles(&abe, answers.len());
    abe.shutdown();
}

/// A refused add changes nothing: with the engine gone (its control queue full), a move of
/// an empty backend and a new backend for a spare slot are refused as busy, and the slots
/// list as they were (no address taken, no name given).
#[test]
fn a_refused_add_leaves_the_slot_as_it_was() {
    let (a, b, c) = (
        MockUpstream::start(),
        MockUpstream::start(),
        MockUpstream::start(),
    );
    let abe = start(with_backends(
        test_config(),
        &format!(
            "{}{}[routing]\nspare_backend_slots = 1\n",
            upstream_table("a", &a.base_url()),
            upstream_table("b", &b.base_url())
        ),
    ));
    abe.live.remove("b").unwrap();
    backends_until(abe.local_addr(), "b drained", |l| {
        state_of(l, "b") == "empty"
    });
    let before = abe.live.list();
    // The engine stops; its control queue fills and is never drained again.
    abe.handle.shutdown(Duration::from_secs(5));
    while abe
        .handle
        .set_strategy(abe::core::strategy::StrategyKind::Fixed)
        .is_ok()
    {}
    let moved: abe::router::BackendConfig =
        serde_json::from_str(&backend_json("b", &c.base_url(), 50)).unwrap();
    let e = abe.live.add(&moved).unwrap_err();
    assert!(matches!(e, abe::live::LiveError::Busy), "{e}");
    let new: abe::router::BackendConfig =
        serde_json::from_str(&model_json("n", &c.base_url(), "m9")).unwrap();
    // As the admin API adds a table without `max_concurrent_batches`: the spare's workers.
    let e = abe.live.add_with_the_slots_workers(&new).unwrap_err();
    assert!(matches!(e, abe::live::LiveError::Busy), "{e}");
    assert_eq!(abe.live.list(), before, "nothing changed");
}

/// Continuous batching: a spare slot is `sim` (the only kind continuous batching runs); a
/// new sim backend with a model of its own takes it under load and serves it; an upstream
/// one is refused, saying why.
#[test]
fn a_new_sim_backend_fills_a_spare_slot_under_continuous_batching() {
    let mut cfg = test_config();
    cfg.batching.mode = BatchingMode::Continuous;
    cfg.workers.latency_model = LatencyKind::Linear;
    let cfg = with_backends(
        cfg,
        r#"
        [[backends]]
        name = "s1"
        kind = "sim"
        [[backends.models]]
        name = "m"
        context_length = 4096
        [routing]
        spare_backend_slots = 1
        "#,
    );
    let abe = start(cfg);
    let addr = abe.local_addr();
    let load = Load::start(addr, "m", 4);
    load.wait_for(20);
    let mut c = Client::connect(addr);
    let upstream = model_json("u", "http://127.0.0.1:9", "m2");
    let r = c.request("POST", "/admin/backends", Some(&upstream));
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.error_message().contains("kind = \"sim\""), "{}", r.text());
    let sim = serde_json::json!({
        "name": "s9", "kind": "sim",
        "models": [{ "name": "m2", "context_length": 4096 }]
    });
    let r = c.request("POST", "/admin/backends", Some(&sim.to_string()));
    assert_eq!(r.status, 200, "{}", r.text());
    let new_load = Load::start(addr, "m2", 2);
    new_load.wait_for(20);
    assert!(new_load
        .routes_since(0)
        .iter()
        .all(|r| r.starts_with("backend=s9; model=m2")));
    let answered_m2 = new_load.finish();
    let answers = load.finish();
    assert_reconciles(&abe, answers.len() + answered_m2.len());
    abe.shutdown();
}

/// A move of a backend that holds requests: they finish at the old address (the slot
/// drains there first); the new address takes everything routed after the move.
#[test]
fn an_upstream_moved_to_another_address_finishes_what_it_holds_there_first() {
    let (a, old, new) = (
        MockUpstream::start(),
        MockUpstream::start(),
        MockUpstream::start(),
    );
    old.set_delay(Duration::from_millis(10));
    let abe = start(with_backends(
        test_config(),
        &format!(
            "{}{}[routing]\nstrategy = \"round_robin\"\n",
            upstream_table("a", &a.base_url()),
            upstream_table("b", &old.base_url())
        ),
    ));
    let addr = abe.local_addr();
    let load = Load::start(addr, "m", 4);
    load.wait_for(40);
    let mut c = Client::connect(addr);
    let r = c.request(
        "POST",
        "/admin/backends",
        Some(&backend_json("b", &new.base_url(), 50)),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json()["requested"],
        "moving",
        "b held requests: {}",
        r.text()
    );
    let list = backends_until(addr, "b at its new address, active", |l| {
        l[1]["base_url"] == new.base_url().as_str() && state_of(l, "b") == "active"
    });
    assert!(list[1]["moving_to"].is_null(), "{list:?}");
    // The drain at the old address is over: nothing goes there any more.
    let at_old = old.requests("/v1/completions");
    load.wait_for(80);
    assert!(
        new.requests("/v1/completions") > 0,
        "the new address serves b"
    );
    assert_eq!(
        old.requests("/v1/completions"),
        at_old,
        "nothing after the drain"
    );
    let answers = load.finish();
    assert_reconciles(&abe, answers.len());
    abe.shutdown();
}

#[test]
fn a_sim_backend_removed_under_continuous_batching_drains_and_comes_back() {
    let mut cfg = test_config();
    cfg.batching.mode = BatchingMode::Continuous;
    cfg.workers.latency_model = LatencyKind::Linear;
    let cfg = with_backends(
        cfg,
        r#"
        [[backends]]
        name = "s1"
        kind = "sim"
        max_concurrent_batches = 1
        [[backends.models]]
        name = "m"
        context_length = 4096
        [[backends]]
        name = "s2"
        kind = "sim"
        max_concurrent_batches = 1
        [[backends.models]]
        name = "m"
        context_length = 4096
        [routing]
        strategy = "round_robin"
        "#,
    );
    let abe = start(cfg);
    let addr = abe.local_addr();
    let load = Load::start(addr, "m", 6);
    load.wait_for(30);
    let mut c = Client::connect(addr);
    assert_eq!(c.request("DELETE", "/admin/backends/s2", None).status, 200);
    backends_until(addr, "s2 drained", |l| state_of(l, "s2") == "empty");
    let since = load.count();
    load.wait_for(40);
    assert!(load
        .routes_since(since)
        .iter()
        .all(|r| r.starts_with("backend=s1;")));
    let metrics = c.request("GET", "/metrics/json", None).json();
    let names: Vec<_> = metrics["backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].clone())
        .collect();
    assert_eq!(names, ["s1"]);
    // A sim table back as it was.
    let s2 = serde_json::json!({
        "name": "s2", "kind": "sim", "max_concurrent_batches": 1,
        "models": [{ "name": "m", "context_length": 4096 }]
    });
    let r = c.request("POST", "/admin/backends", Some(&s2.to_string()));
    assert_eq!(r.status, 200, "{}", r.text());
    backends_until(addr, "s2 active", |l| state_of(l, "s2") == "active");
    let since = load.count();
    load.wait_for(60);
    assert!(load
        .routes_since(since)
        .iter()
        .any(|r| r.starts_with("backend=s2;")));
    let answers = load.finish();
    assert_reconciles(&abe, answers.len());
    abe.shutdown();
}

/// A config file in a directory of its own, rewritten by the test.
struct ConfigFile {
    path: std::path::PathBuf,
}

impl ConfigFile {
    fn new(tag: &str) -> ConfigFile {
        let dir = std::env::temp_dir().join(format!("abe-live-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        ConfigFile {
            path: dir.join("abe.toml"),
        }
    }

    /// Writes the test server's settings and `rest` (backends, routing).
    fn write(&self, server_extra: &str, rest: &str) {
        let text = format!(
            "[server]\nport = 0\n{server_extra}\n[workers]\ncount = 2\nlatency_model = \"none\"\n\
             [engine]\npin = false\n{rest}"
        );
        std::fs::write(&self.path, text).unwrap();
    }
}

impl Drop for ConfigFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(self.path.parent().unwrap());
    }
}

#[test]
fn a_reload_applies_what_can_change_reports_the_rest_and_refuses_a_bad_file_whole() {
    let (a, b) = (MockUpstream::start(), MockUpstream::start());
    let two = format!(
        "{}{}[routing]\nstrategy = \"round_robin\"\n",
        upstream_table("a", &a.base_url()),
        upstream_table("b", &b.base_url())
    );
    let file = ConfigFile::new("reload");
    file.write("", &two);
    let abe = Running::start(Config::from_file(&file.path).unwrap()).unwrap();
    let path = file.path.clone();
    abe.set_config_source(Box::new(move || Config::from_file(&path)));
    let addr = abe.local_addr();
    let mut c = Client::connect(addr);
    let load = Load::start(addr, "m", 4);
    load.wait_for(20);

    // b gone, another strategy, a port and an alias (which need a restart).
    file.write(
        "max_body_bytes = 1000000",
        &format!(
            "{}[routing]\nstrategy = \"least_loaded\"\n[routing.aliases]\nmm = \"m\"\n",
            upstream_table("a", &a.base_url())
        ),
    );
    let r = c.request("POST", "/admin/reload", None);
    assert_eq!(r.status, 200, "{}", r.text());
    let report = r.json();
    let applied: Vec<&str> = report["applied"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let kept: Vec<&str> = report["kept"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(
        applied.contains(&"routing.strategy: round_robin -> least_loaded"),
        "{report}"
    );
    assert!(
        applied.contains(&"backend 'b': removed (draining)"),
        "{report}"
    );
    assert!(
        kept.iter().any(|k| k.starts_with("server.max_body_bytes")),
        "{report}"
    );
    assert!(applied.contains(&"routing.aliases"), "{report}");
    backends_until(addr, "b drained", |l| state_of(l, "b") == "empty");
    // The alias changed live: the engine and the io threads resolve it.
    let mm = r#"{"model": "mm", "prompt": "x", "max_tokens": 1}"#;
    let r = c.request("POST", "/v1/completions", Some(mm));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.header("x-abe-route"),
        Some("backend=a; model=m; via=alias; requested=mm")
    );

    // A file that does not check: refused with the start's error; nothing changes.
    file.write(
        "",
        &format!(
            "{}{}[routing.weights]\npriority = 90\nload = 30\nlatency = 20\n",
            upstream_table("a", &a.base_url()),
            upstream_table("b", &b.base_url())
        ),
    );
    let at_start = Config::from_file(&file.path)
        .unwrap()
        .check()
        .unwrap_err()
        .to_string();
    let r = c.request("POST", "/admin/reload", None);
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        r.error_message().contains(&at_start),
        "{} vs {at_start}",
        r.text()
    );
    let list = backends_until(addr, "the list", |_| true);
    assert_eq!(
        state_of(&list, "b"),
        "empty",
        "a refused reload changes nothing"
    );
    assert_eq!(state_of(&list, "a"), "active");

    // The first file again: b comes back.
    file.write("", &two);
    let r = c.request("POST", "/admin/reload", None);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains("backend 'b': added back"), "{}", r.text());
    assert!(r.text().contains("routing.aliases"), "{}", r.text());
    backends_until(addr, "b back", |l| state_of(l, "b") == "active");
    // The alias is gone again.
    let r = c.request("POST", "/v1/completions", Some(mm));
    assert_eq!(r.status, 404, "{}", r.text());
    let answers = load.finish();
    // The load's answers and the one request through the alias.
    assert_reconciles(&abe, answers.len() + 1);
    abe.shutdown();
}

/// `abe serve --config <file>` as a child process; its stderr lines collected.
struct ServeProcess {
    child: std::process::Child,
    addr: SocketAddr,
    stderr: Arc<Mutex<Vec<String>>>,
}

impl ServeProcess {
    fn start(config: &std::path::Path) -> ServeProcess {
        use std::io::BufRead;
        use std::process::{Command, Stdio};
        let mut child = Command::new(env!("CARGO_BIN_EXE_abe"))
            .args(["serve", "--config"])
            .arg(config)
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("abe starts");
        let stdout = child.stdout.take().unwrap();
        let stderr_pipe = child.stderr.take().unwrap();
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let lines = stderr.clone();
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(stderr_pipe)
                .lines()
                .map_while(Result::ok)
            {
                lines.lock().unwrap().push(l);
            }
        });
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if let Some(a) = l.strip_prefix("abe listening on http://") {
                    let _ = tx.send(a.parse::<SocketAddr>().unwrap());
                }
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("abe prints its address");
        ServeProcess {
            child,
            addr,
            stderr,
        }
    }

    fn hup(&self) {
        let ok = std::process::Command::new("kill")
            .args(["-HUP", &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -HUP");
    }

    fn log_until(&self, what: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(l) = self
                .stderr
                .lock()
                .unwrap()
                .iter()
                .find(|l| l.contains(what))
            {
                return l.clone();
            }
            assert!(Instant::now() < deadline, "no log line with '{what}'");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn sighup_reloads_the_config_file_and_a_bad_one_leaves_the_server_as_it_was() {
    let (a, b) = (MockUpstream::start(), MockUpstream::start());
    let file = ConfigFile::new("sighup");
    file.write(
        "",
        &format!(
            "{}{}",
            upstream_table("a", &a.base_url()),
            upstream_table("b", &b.base_url())
        ),
    );
    let abe = ServeProcess::start(&file.path);
    let load = Load::start(abe.addr, "m", 3);
    load.wait_for(20);
    file.write("", &upstream_table("a", &a.base_url()));
    abe.hup();
    backends_until(abe.addr, "b drained", |l| state_of(l, "b") == "empty");
    abe.log_until("backend 'b': removed (draining)");

    file.write(
        "",
        "[[backends]]\nname = \"a\"\nkind = \"upstream\"\nmodels = []\n",
    );
    abe.hup();
    let line = abe.log_until("reload refused");
    assert!(line.contains("base_url"), "the start's error: {line}");
    load.wait_for(20);
    let list = backends_until(abe.addr, "the list", |_| true);
    assert_eq!(state_of(&list, "a"), "active");
    assert_eq!(state_of(&list, "b"), "empty");
    load.finish();
}

/// Lines of `/etc/hosts` naming one test host; removed on drop. The file is replaced
/// whole by a rename, and only the lines this guard wrote are touched.
struct HostsLines {
    name: String,
}

const HOSTS: &str = "/etc/hosts";

impl HostsLines {
    fn new(name: &str) -> HostsLines {
        let h = HostsLines { name: name.into() };
        h.edit(|_| {});
        h
    }

    fn edit(&self, f: impl FnOnce(&mut Vec<String>)) {
        let text = std::fs::read_to_string(HOSTS).expect("read /etc/hosts");
        let mut mine: Vec<String> = text
            .lines()
            .filter(|l| l.ends_with(&format!(" {}", self.name)))
            .map(String::from)
            .collect();
        f(&mut mine);
        let mut out: String = text
            .lines()
            .filter(|l| !l.ends_with(&format!(" {}", self.name)))
            .map(|l| format!("{l}\n"))
            .collect();
        for l in mine {
            out.push_str(&l);
            out.push('\n');
        }
        // Whole or not at all: a resolver reading a half-written file would see the name
        // gone (and discovery would rightly drain its backends).
        let next = format!("{HOSTS}.{}", self.name);
        std::fs::write(&next, out).expect("write beside /etc/hosts (the test runs as root)");
        std::fs::rename(&next, HOSTS).expect("replace /etc/hosts");
    }

    fn add(&self, ip: &str) {
        let line = format!("{ip} {}", self.name);
        self.edit(|m| m.push(line));
    }

    fn remove(&self, ip: &str) {
        let line = format!("{ip} {}", self.name);
        self.edit(|m| m.retain(|l| *l != line));
    }
}

impl Drop for HostsLines {
    fn drop(&mut self) {
        self.edit(|m| m.clear());
    }
}

/// An in-process abe serving model `m` on `host:port`.
fn abe_on(host: &str, port: u16) -> Running {
    let mut c = test_config();
    c.server.host = host.into();
    c.server.port = port;
    c.server.model_name = "m".into();
    start(c)
}

#[test]
fn discovery_follows_a_name_in_etc_hosts_as_addresses_come_and_go() {
    let writable = std::fs::OpenOptions::new().append(true).open(HOSTS).is_ok();
    assert!(writable, "this test edits /etc/hosts: run it as root");
    let name = format!("abe-live-{}.test", std::process::id());
    let hosts = HostsLines::new(&name);
    let two = abe_on("127.0.0.2", 0);
    let port = two.local_addr().port();
    let three = abe_on("127.0.0.3", port);
    hosts.add("127.0.0.2");
    let mut cfg = with_backends(
        test_config(),
        &format!(
            r#"
            [[backends]]
            name = "pool"
            kind = "upstream"
            discovery = {{ dns = "{name}", port = {port}, every = "100ms", max_addresses = 3 }}
            [[backends.models]]
            name = "m"
            context_length = 4096
            [routing]
            strategy = "round_robin"
            [health]
            check_interval = "100ms"
            "#
        ),
    );
    cfg.server.model_name = "m".into();
    let front = start(cfg);
    let addr = front.local_addr();
    let url = |ip: &str| format!("http://{ip}:{port}");
    let slot_at = |l: &[Value], ip: &str| {
        l.iter()
            .find(|b| b["base_url"] == url(ip).as_str() && b["state"] == "active")
            .map(|b| b["name"].as_str().unwrap().to_string())
    };
    let list = backends_until(addr, "127.0.0.2 found", |l| {
        slot_at(l, "127.0.0.2").is_some()
    });
    let at_two = slot_at(&list, "127.0.0.2").unwrap();
    assert_eq!(
        list.iter().filter(|b| b["state"] == "active").count(),
        1,
        "{list:?}"
    );
    let load = Load::start(addr, "m", 4);
    load.wait_for(20);

    hosts.add("127.0.0.3");
    let list = backends_until(addr, "127.0.0.3 found", |l| {
        slot_at(l, "127.0.0.3").is_some()
    });
    let at_three = slot_at(&list, "127.0.0.3").unwrap();
    let since = load.count();
    load.wait_for(60);
    let routes = load.routes_since(since);
    assert!(routes
        .iter()
        .any(|r| r.starts_with(&format!("backend={at_three};"))));
    completed_above(&three, 0, "127.0.0.3 served");

    hosts.remove("127.0.0.2");
    backends_until(addr, "127.0.0.2's slot drained", |l| {
        l.iter()
            .any(|b| b["name"] == at_two.as_str() && b["state"] == "empty")
    });
    let served_by_two = two.handle.snapshot().stats.completed;
    let since = load.count();
    load.wait_for(60);
    assert!(load
        .routes_since(since)
        .iter()
        .all(|r| r.starts_with(&format!("backend={at_three};"))));
    let metrics = Client::connect(addr)
        .request("GET", "/metrics", None)
        .text();
    assert!(
        !metrics.contains(&format!("backend=\"{at_two}\"")),
        "its series are gone"
    );

    // Back again: the address takes a slot and work.
    hosts.add("127.0.0.2");
    let list = backends_until(addr, "127.0.0.2 back", |l| {
        slot_at(l, "127.0.0.2").is_some()
    });
    assert_eq!(
        slot_at(&list, "127.0.0.2").unwrap(),
        at_two,
        "it takes its old slot back"
    );
    let since = load.count();
    load.wait_for(60);
    assert!(load
        .routes_since(since)
        .iter()
        .any(|r| r.starts_with(&format!("backend={at_two};"))));
    let answers = load.finish();
    assert_reconciles(&front, answers.len());
    completed_above(&two, served_by_two, "127.0.0.2 served again");
    front.shutdown();
    drop(hosts);
    two.shutdown();
    three.shutdown();
}
