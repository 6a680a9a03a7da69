//! LoRA adapters as a gateway's client sees them, in both batching modes: adapters listed
//! in the config and loaded at run time appear in `/v1/models` with `parent` and `root`;
//! a request naming one as its `model` is served (by its base model) and answered under
//! the adapter's name; vLLM's load/unload answers and errors; with `max_loras = 1` and two
//! adapters, requests of both complete.

use crate::common;

use abe::config::Config;
use abe::core::BatchingMode;
use abe::router::lora::AdapterConfig;
use common::{post_completion, start, test_config, Client, MODES};

fn config(mode: BatchingMode) -> Config {
    let mut c = test_config();
    c.batching.mode = mode;
    c.lora.adapters = vec![
        AdapterConfig::Name("sql-lora".into()),
        AdapterConfig::Table {
            name: "chat-lora".into(),
            path: Some("/adapters/chat".into()),
        },
    ];
    c
}

fn model_card(c: &mut Client, id: &str) -> Option<serde_json::Value> {
    let r = c.request("GET", "/v1/models", None);
    assert_eq!(r.status, 200);
    r.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == id)
        .cloned()
}

#[test]
fn configured_adapters_are_listed_and_serve_requests_under_their_name() {
    for mode in MODES {
        let abe = start(config(mode));
        let mut c = Client::connect(abe.local_addr());
        let base = model_card(&mut c, "abe-sim").expect("the base model is listed");
        assert_eq!(base["parent"], serde_json::Value::Null);
        let sql = model_card(&mut c, "sql-lora").expect("a configured adapter is listed");
        assert_eq!(
            (&sql["parent"], &sql["root"]),
            (&"abe-sim".into(), &"sql-lora".into())
        );
        let chat = model_card(&mut c, "chat-lora").unwrap();
        assert_eq!(chat["root"], "/adapters/chat");
        for model in ["sql-lora", "chat-lora", "abe-sim"] {
            let r = post_completion(&mut c, model, "select the answer");
            assert_eq!(r.status, 200, "{mode:?} {model}: {}", r.text());
            assert_eq!(
                r.json()["model"],
                model,
                "answered under the name asked for"
            );
        }
        let chat = serde_json::json!({
            "model": "chat-lora",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 3,
        });
        let r = c.request("POST", "/v1/chat/completions", Some(&chat.to_string()));
        assert_eq!(r.status, 200, "{mode:?}: {}", r.text());
        assert_eq!(r.json()["model"], "chat-lora");
        let r = post_completion(&mut c, "no-such-lora", "x");
        assert_eq!(r.status, 404, "an unknown name is still a 404");
    }
}

#[test]
fn load_and_unload_at_run_time_with_vllm_answers_and_errors() {
    for mode in MODES {
        let abe = start(config(mode));
        let mut c = Client::connect(abe.local_addr());
        let load = r#"{"lora_name":"fresh","lora_path":"/adapters/fresh"}"#;
        assert_eq!(post_completion(&mut c, "fresh", "x").status, 404);
        let r = c.request("POST", "/v1/load_lora_adapter", Some(load));
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(
            r.text(),
            "Success: LoRA adapter 'fresh' added successfully."
        );
        let card = model_card(&mut c, "fresh").expect("listed once loaded");
        assert_eq!(
            (&card["parent"], &card["root"]),
            (&"abe-sim".into(), &"/adapters/fresh".into())
        );
        let r = post_completion(&mut c, "fresh", "hello adapter");
        assert_eq!(r.status, 200, "{mode:?}: {}", r.text());
        assert_eq!(r.json()["model"], "fresh");

        // vLLM's errors: loading twice, missing fields, unloading an unknown adapter.
        let r = c.request("POST", "/v1/load_lora_adapter", Some(load));
        assert_eq!(r.status, 400);
        assert_eq!(
            r.json()["error"]["message"],
            "The lora adapter 'fresh' has already been loaded."
        );
        assert_eq!(r.json()["error"]["type"], "InvalidUserInput");
        let r = c.request(
            "POST",
            "/v1/load_lora_adapter",
            Some(r#"{"lora_name":"x"}"#),
        );
        assert_eq!(r.status, 400);
        assert_eq!(
            r.json()["error"]["message"],
            "Both 'lora_name' and 'lora_path' must be provided."
        );
        let r = c.request(
            "POST",
            "/v1/load_lora_adapter",
            Some(r#"{"lora_name":"abe-sim","lora_path":"/p"}"#),
        );
        assert_eq!(r.status, 400, "a served model's name is not an adapter's");

        let unload = r#"{"lora_name":"fresh"}"#;
        let r = c.request("POST", "/v1/unload_lora_adapter", Some(unload));
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(
            r.text(),
            "Success: LoRA adapter 'fresh' removed successfully."
        );
        assert!(
            model_card(&mut c, "fresh").is_none(),
            "gone from /v1/models"
        );
        assert_eq!(post_completion(&mut c, "fresh", "x").status, 404);
        let r = c.request("POST", "/v1/unload_lora_adapter", Some(unload));
        assert_eq!(r.status, 404);
        assert_eq!(
            r.json()["error"]["message"],
            "The lora adapter 'fresh' cannot be found."
        );
        assert_eq!(r.json()["error"]["type"], "NotFoundError");
        let r = c.request("GET", "/v1/load_lora_adapter", None);
        assert_eq!(r.status, 405);
    }
}

#[test]
fn run_time_changes_are_control_calls_behind_the_admin_token() {
    let mut cfg = config(BatchingMode::Continuous);
    cfg.server.admin_token = "t0ken".into();
    let abe = start(cfg);
    let mut c = Client::connect(abe.local_addr());
    let load = r#"{"lora_name":"fresh","lora_path":"/p"}"#;
    let r = c.request("POST", "/v1/load_lora_adapter", Some(load));
    assert_eq!(r.status, 401);
    let auth = [("Authorization", "Bearer t0ken")];
    let r = c.request_with("POST", "/v1/load_lora_adapter", Some(load), &auth);
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn with_one_lora_slot_requests_of_two_adapters_all_complete() {
    for mode in MODES {
        let mut cfg = config(mode);
        cfg.lora.max_loras = 1;
        cfg.lora.lora_load_ms = 1.0;
        let abe = start(cfg);
        let addr = abe.local_addr();
        let threads: Vec<_> = (0..8)
            .map(|i| {
                std::thread::spawn(move || {
                    let mut c = Client::connect(addr);
                    let model = ["sql-lora", "chat-lora"][i % 2];
                    (0..4)
                        .map(|_| {
                            let r = post_completion(&mut c, model, "interleaved adapters");
                            (r.status, r.json()["model"].as_str().map(str::to_string))
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for (i, t) in threads.into_iter().enumerate() {
            let model = ["sql-lora", "chat-lora"][i % 2];
            for (status, answered) in t.join().unwrap() {
                assert_eq!(status, 200, "{mode:?}");
                assert_eq!(answered.as_deref(), Some(model));
            }
        }
    }
}

#[test]
fn a_config_whose_adapter_names_a_model_is_refused() {
    let mut cfg = config(BatchingMode::Request);
    cfg.lora
        .adapters
        .push(AdapterConfig::Name("abe-sim".into()));
    let e = cfg.validate().unwrap_err().to_string();
    assert!(e.contains("lora.adapters") && e.contains("abe-sim"), "{e}");
    let mut cfg = config(BatchingMode::Request);
    cfg.lora.max_loras = 0;
    assert!(cfg
        .validate()
        .unwrap_err()
        .to_string()
        .contains("lora.max_loras"));
}

/// The `vllm:lora_requests_info` series on /metrics, as (max_lora, running, waiting, value).
fn lora_info(c: &mut Client) -> Option<(String, String, String, f64)> {
    let r = c.request("GET", "/metrics", None);
    let text = r.text();
    let line = text
        .lines()
        .find(|l| l.starts_with("vllm:lora_requests_info{"))?;
    let label = |k: &str| {
        let start = line.find(&format!("{k}=\"")).unwrap() + k.len() + 2;
        line[start..start + line[start..].find('"').unwrap()].to_string()
    };
    let value = line.rsplit(' ').next().unwrap().parse().unwrap();
    Some((
        label("max_lora"),
        label("running_lora_adapters"),
        label("waiting_lora_adapters"),
        value,
    ))
}

#[test]
fn the_lora_gauge_shows_the_adapter_waiting_for_the_one_slot() {
    for mode in MODES {
        let mut cfg = config(mode);
        cfg.workers.count = 1;
        cfg.lora.max_loras = 1;
        // A load takes long enough for a scrape to see the other adapter wait.
        cfg.lora.lora_load_ms = 1_000.0;
        let abe = start(cfg);
        let addr = abe.local_addr();
        let mut c = Client::connect(addr);
        let (max_lora, running, waiting, value) = lora_info(&mut c).expect("written with adapters");
        assert_eq!(
            (max_lora.as_str(), running.as_str(), waiting.as_str()),
            ("1", "", "")
        );
        let now_s = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(
            (value - now_s).abs() < 3_600.0,
            "a timestamp, as vLLM's: {value}"
        );
        let send = |model: &'static str| {
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                post_completion(&mut c, model, "one slot").status
            })
        };
        let first = send("sql-lora");
        // The second adapter's request arrives once the first holds the slot.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while lora_info(&mut c).unwrap().1 != "sql-lora" {
            assert!(
                std::time::Instant::now() < deadline,
                "{mode:?}: sql-lora never ran"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let second = send("chat-lora");
        let mut seen = None;
        while std::time::Instant::now() < deadline {
            let (_, running, waiting, _) = lora_info(&mut c).unwrap();
            if waiting == "chat-lora" {
                seen = Some(running);
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(
            seen.as_deref(),
            Some("sql-lora"),
            "{mode:?}: chat-lora waits while sql-lora holds the slot"
        );
        assert_eq!(first.join().unwrap(), 200);
        assert_eq!(
            second.join().unwrap(),
            200,
            "{mode:?}: the waiting adapter completes"
        );
        // Both answered: the next snapshot shows nothing running or waiting.
        loop {
            let (_, running, waiting, _) = lora_info(&mut c).unwrap();
            if (running.as_str(), waiting.as_str()) == ("", "") {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{mode:?}: {running} / {waiting}"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

/// How long a completion for `model` takes, as the client sees it (status checked).
fn timed_completion(c: &mut Client, model: &str) -> std::time::Duration {
    let start = std::time::Instant::now();
    let r = post_completion(c, model, "which adapter");
    assert_eq!(r.status, 200, "{model}: {}", r.text());
    assert_eq!(r.json()["model"], model);
    start.elapsed()
}

#[test]
fn an_adapter_loaded_under_an_unloaded_adapters_id_pays_its_load() {
    // Only lower bounds of the load's deliberate wait are asserted: a slow machine can make
    // a request slower, never faster than the wait its worker sleeps.
    let load_ms = 400;
    let at_least = std::time::Duration::from_millis(load_ms);
    for mode in MODES {
        let mut cfg = config(mode);
        cfg.workers.count = 1;
        cfg.lora.max_loras = 1;
        cfg.lora.lora_load_ms = load_ms as f64;
        let abe = start(cfg);
        let mut c = Client::connect(abe.local_addr());
        let load = |c: &mut Client, name: &str| {
            let body = format!(r#"{{"lora_name":"{name}","lora_path":"/adapters/{name}"}}"#);
            let r = c.request("POST", "/v1/load_lora_adapter", Some(&body));
            assert_eq!(r.status, 200, "{}", r.text());
        };
        load(&mut c, "first");
        let took = timed_completion(&mut c, "first");
        assert!(
            took >= at_least,
            "{mode:?}: the first load is paid ({took:?})"
        );
        let r = c.request(
            "POST",
            "/v1/unload_lora_adapter",
            Some(r#"{"lora_name":"first"}"#),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        // The freed id goes to the next adapter loaded (router::lora's table).
        load(&mut c, "second");
        let took = timed_completion(&mut c, "second");
        assert!(
            took >= at_least,
            "{mode:?}: a new adapter under a reused id is loaded, not found resident ({took:?})"
        );
        // Loaded again after an unload, an adapter is loaded again too.
        let r = c.request(
            "POST",
            "/v1/unload_lora_adapter",
            Some(r#"{"lora_name":"second"}"#),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        load(&mut c, "second");
        let took = timed_completion(&mut c, "second");
        assert!(
            took >= at_least,
            "{mode:?}: reloaded, paid again ({took:?})"
        );
        abe.shutdown();
    }
}
