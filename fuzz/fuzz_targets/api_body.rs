//! Request decoding for `/v1/completions`, `/v1/chat/completions` and `/v1/embeddings` on
//! any body, through the server's own decoder (`abe::api::Decoder`, what `route` calls for
//! these paths), with the default config and with a tight one (`max_model_len`,
//! `max_batch_inputs`). An input is a path line, then the body (the layout of
//! `fuzz/corpus/api/`, its seeds). Every body becomes a job of at least one request or a
//! 4xx in OpenAI's error shape; nothing panics.
#![no_main]

use abe::api::{ApiContext, Decoder, Routed};
use abe::config::{Config, Settings};
use abe::http::parse::parse_head;
use libfuzzer_sys::fuzz_target;
use std::sync::Arc;

const PATHS: [&str; 3] = ["/v1/completions", "/v1/chat/completions", "/v1/embeddings"];

/// Checked settings and their default model, built once per process.
fn settings(toml: &str) -> (Settings, Arc<str>) {
    let settings = Config::from_toml(toml)
        .expect("fuzz config parses")
        .check()
        .expect("fuzz config checks");
    let model = ApiContext::default_model_for(&settings.config, &settings.router).into();
    (settings, model)
}

thread_local! {
    static CONFIGS: [(Settings, Arc<str>); 2] = [
        settings(""),
        settings("[server]\nmax_model_len = 64\nmax_batch_inputs = 4\n"),
    ];
}

fuzz_target!(|input: &[u8]| {
    let text = String::from_utf8_lossy(input);
    let (path, body) = text.split_once('\n').unwrap_or(("/v1/completions", &text));
    let path = PATHS.into_iter().find(|p| *p == path).unwrap_or(PATHS[0]);
    let head = format!("POST {path} HTTP/1.1\r\nHost: x\r\n\r\n");
    let head = parse_head(head.as_bytes(), 1024, usize::MAX)
        .expect("fuzz head parses")
        .expect("fuzz head is whole");
    CONFIGS.with(|configs| {
        for (settings, model) in configs {
            let decoder = Decoder {
                config: &settings.config,
                router: &settings.router,
                default_model: model,
                has_upstream: false,
            };
            match decoder.decode(&head, body.as_bytes()) {
                Routed::Submit(job) => assert!(!job.requests.is_empty(), "{path}: an empty job"),
                Routed::Now(r) => {
                    let status = r.status.code();
                    assert!((400..500).contains(&status), "{path}: {status}");
                    let v: serde_json::Value =
                        serde_json::from_slice(&r.body).expect("an error body is JSON");
                    assert!(v["error"]["message"].is_string(), "{v}");
                }
                Routed::Subscribe(_) => panic!("{path}: decoded as an /events subscription"),
            }
        }
    });
});
