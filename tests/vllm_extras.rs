//! The small vLLM compatibilities a gateway's tests lean on (issue 26): integer `priority`
//! (lower first), `stream_options.continuous_usage_stats`, `X-Request-Id` echoed and used
//! as the response id, and `GET /version`. Both batching modes, over loopback.

use crate::common;

use common::mock_upstream::{MockUpstream, Mode};
use common::{start, start_in, test_config, Client, MODES};

fn sse_json(body: &str) -> Vec<serde_json::Value> {
    body.split("\n\n")
        .filter(|e| !e.is_empty() && *e != "data: [DONE]")
        .map(|e| serde_json::from_str(e.strip_prefix("data: ").unwrap()).unwrap())
        .collect()
}

#[test]
fn integer_priorities_are_accepted_and_other_types_refused() {
    for mode in MODES {
        let abe = start_in(mode);
        let mut c = Client::connect(abe.local_addr());
        for p in ["-20", "-3", "0", "5"] {
            let body = format!(r#"{{"prompt":"p","max_tokens":2,"priority":{p}}}"#);
            let r = c.request("POST", "/v1/completions", Some(&body));
            assert_eq!(r.status, 200, "{mode:?} priority {p}: {}", r.text());
            let body = format!(
                r#"{{"messages":[{{"role":"user","content":"x"}}],"max_tokens":2,"priority":{p}}}"#
            );
            let r = c.request("POST", "/v1/chat/completions", Some(&body));
            assert_eq!(r.status, 200, "{mode:?} chat priority {p}: {}", r.text());
        }
        // Names still work; a float or a boolean is refused with the field named.
        let r = c.request(
            "POST",
            "/v1/completions",
            Some(r#"{"prompt":"p","max_tokens":2,"priority":"high"}"#),
        );
        assert_eq!(r.status, 200);
        for bad in ["1.5", "true"] {
            let body = format!(r#"{{"prompt":"p","max_tokens":2,"priority":{bad}}}"#);
            let r = c.request("POST", "/v1/completions", Some(&body));
            assert_eq!(r.status, 400, "{bad}: {}", r.text());
            assert!(r.error_message().contains("priority"), "{}", r.text());
        }
        abe.shutdown();
    }
}

#[test]
fn continuous_usage_stats_put_usage_so_far_in_every_chunk() {
    for mode in MODES {
        let abe = start_in(mode);
        let mut c = Client::connect(abe.local_addr());
        let r = c.request(
            "POST",
            "/v1/chat/completions",
            Some(
                r#"{"messages":[{"role":"user","content":"count for me"}],"max_tokens":5,
                "stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}}"#,
            ),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let chunks = sse_json(&r.text());
        let usage: Vec<&serde_json::Value> = chunks.iter().map(|c| &c["usage"]).collect();
        assert!(usage.iter().all(|u| u.is_object()), "{mode:?}: {chunks:?}");
        let completion: Vec<u64> = usage
            .iter()
            .map(|u| u["completion_tokens"].as_u64().unwrap())
            .collect();
        assert!(
            completion.windows(2).all(|w| w[0] <= w[1]),
            "{completion:?}"
        );
        assert_eq!(*completion.last().unwrap(), 5);
        let prompt = usage[0]["prompt_tokens"].as_u64().unwrap();
        assert!(prompt > 0);
        // The final usage chunk (include_usage) agrees on the prompt.
        assert_eq!(usage.last().unwrap()["prompt_tokens"], prompt);
        for u in &usage {
            assert_eq!(
                u["total_tokens"].as_u64().unwrap(),
                u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap()
            );
        }
        // Without the option, only the final chunk carries usage.
        let r = c.request(
            "POST",
            "/v1/completions",
            Some(r#"{"prompt":"p","max_tokens":3,"stream":true}"#),
        );
        assert!(sse_json(&r.text()).iter().all(|c| c.get("usage").is_none()));
        abe.shutdown();
    }
}

#[test]
fn x_request_id_is_echoed_and_becomes_the_response_id() {
    for mode in MODES {
        let abe = start_in(mode);
        let mut c = Client::connect(abe.local_addr());
        let rid = [("X-Request-Id", "gw-7f3a")];
        let r = c.request_with(
            "POST",
            "/v1/completions",
            Some(r#"{"prompt":"p","max_tokens":2}"#),
            &rid,
        );
        assert_eq!(r.header("x-request-id"), Some("gw-7f3a"));
        assert_eq!(r.json()["id"], "cmpl-gw-7f3a");
        let r = c.request_with(
            "POST",
            "/v1/chat/completions",
            Some(r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":3,"stream":true}"#),
            &rid,
        );
        assert_eq!(r.header("x-request-id"), Some("gw-7f3a"), "{mode:?}");
        for chunk in sse_json(&r.text()) {
            assert_eq!(chunk["id"], "chatcmpl-gw-7f3a", "{chunk}");
        }
        // Errors echo it too; without the header, ids are abe's own and differ.
        let r = c.request_with("POST", "/v1/completions", Some("{bad"), &rid);
        assert_eq!((r.status, r.header("x-request-id")), (400, Some("gw-7f3a")));
        let ids: Vec<String> = (0..2)
            .map(|_| {
                let r = c.request(
                    "POST",
                    "/v1/completions",
                    Some(r#"{"prompt":"p","max_tokens":1}"#),
                );
                assert_eq!(r.header("x-request-id"), None);
                r.json()["id"].as_str().unwrap().to_string()
            })
            .collect();
        assert_ne!(ids[0], ids[1]);
        abe.shutdown();
    }
}

/// Every answer echoes `X-Request-Id`: a stream failing before its first byte (answered as a
/// plain HTTP error, the stream never opened), and a refused method. Request-level: abe in
/// front of an upstream answering 500; continuous (no upstreams there): a prompt larger than
/// a replica's KV cache, which the engine refuses.
#[test]
fn x_request_id_is_echoed_by_a_stream_failing_before_its_first_byte() {
    for mode in MODES {
        let mut cfg = test_config();
        cfg.batching.mode = mode;
        let mut mock = None;
        let (model, code) = if mode == abe::core::BatchingMode::Request {
            let m = MockUpstream::start();
            let file: abe::config::Config = toml::from_str(&format!(
                r#"
                [[backends]]
                name = "up"
                kind = "upstream"
                base_url = "{}"
                [[backends.models]]
                name = "m"
                context_length = 4096
                [health]
                check_interval = "1h"
                "#,
                m.base_url()
            ))
            .unwrap();
            cfg.backends = file.backends;
            cfg.health = file.health;
            mock = Some(m);
            ("m", "upstream_error")
        } else {
            // 250 KV tokens per replica.
            let d = &mut cfg.batching.dynamic;
            d.m_max_gb = 2.0;
            d.m_model_gb = 1.0;
            d.memory_margin_gb = 0.0;
            d.kv_gb_per_token = 0.004;
            d.safety_fraction = 0.0;
            (cfg.server.model_name.as_str(), "request_too_large")
        };
        let model = model.to_string();
        let abe = start(cfg);
        if let Some(m) = &mock {
            // Fail only once the start-up probe found the backend healthy.
            let probed = std::time::Instant::now();
            while m.answered("/v1/models") == 0 {
                assert!(probed.elapsed().as_secs() < 30, "no start-up probe");
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            m.set_mode(Mode::Status(500));
        }
        let mut c = Client::connect(abe.local_addr());
        let rid = [("X-Request-Id", "gw-early")];
        let prompt = "word ".repeat(400);
        for path in ["/v1/completions", "/v1/chat/completions"] {
            let body = if path == "/v1/completions" {
                serde_json::json!({"model": model, "prompt": prompt, "max_tokens": 3, "stream": true})
            } else {
                serde_json::json!({"model": model, "max_tokens": 3, "stream": true,
                    "messages": [{"role": "user", "content": prompt}]})
            };
            let r = c.request_with("POST", path, Some(&body.to_string()), &rid);
            assert!(
                r.status >= 400,
                "{mode:?} {path}: {} {}",
                r.status,
                r.text()
            );
            assert_eq!(r.json()["error"]["code"], code, "{mode:?}: {}", r.text());
            assert_eq!(
                r.header("x-request-id"),
                Some("gw-early"),
                "{mode:?} {path}"
            );
        }
        let r = c.request_with("GET", "/v1/completions", None, &rid);
        assert_eq!(
            (r.status, r.header("x-request-id")),
            (405, Some("gw-early"))
        );
        abe.shutdown();
    }
}

#[test]
fn version_reports_the_package_version() {
    let abe = start(test_config());
    let mut c = Client::connect(abe.local_addr());
    let r = c.request("GET", "/version", None);
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(c.request("POST", "/version", Some("{}")).status, 405);
    abe.shutdown();
}
