//! The small vLLM compatibilities a gateway's tests lean on (issue 26): integer `priority`
//! (lower first), `stream_options.continuous_usage_stats`, `X-Request-Id` echoed and used
//! as the response id, and `GET /version`. Both batching modes, over loopback.

mod common;

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
