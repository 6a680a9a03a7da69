//! Prefix caching as a user sees it, over real TCP on 127.0.0.1 against `abe serve` in
//! continuous batching (caching on by default): a repeated prompt and a chat re-sent with
//! one more turn report `usage.prompt_tokens_details.cached_tokens` (whole and streamed),
//! and `/metrics` (vLLM's and abe's counters), `/metrics/json`, `/metrics/history` and the
//! `request` events agree with the answers. With caching off, and in request-level
//! batching, the field is absent and nothing hits.

use crate::common;

use abe::config::Config;
use abe::core::BatchingMode;
use common::{start, test_config, Client};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Tokens per KV block (`continuous.kv_block_tokens`, the default).
const BLOCK_TOKENS: u64 = 16;

/// Continuous batching on one replica: a repeat can only hit where the first request ran,
/// and which of several replicas takes a request is not what this file tests.
fn continuous(prefix_caching: bool) -> Config {
    let mut c = test_config();
    c.batching.mode = BatchingMode::Continuous;
    c.workers.count = 1;
    c.continuous.prefix_caching = prefix_caching;
    assert_eq!(u64::from(c.continuous.kv_block_tokens), BLOCK_TOKENS);
    c
}

/// A 2,000-byte prompt (500 tokens at abe's 4 bytes a token): 31 full blocks and a tail.
fn long_prompt() -> String {
    let mut p = String::new();
    let mut i = 0;
    while p.len() < 2_000 {
        p.push_str(&format!(
            "Line {i}: the river carries stones past the mill. "
        ));
        i += 1;
    }
    p.truncate(2_000);
    p
}

fn post(c: &mut Client, path: &str, body: &Value) -> Value {
    let r = c.request("POST", path, Some(&body.to_string()));
    assert_eq!(r.status, 200, "{path}: {}", r.text());
    r.json()
}

/// `usage.prompt_tokens_details.cached_tokens`, `None` when the field is absent.
fn cached(usage: &Value) -> Option<u64> {
    let details = usage.get("prompt_tokens_details")?;
    Some(
        details["cached_tokens"]
            .as_u64()
            .unwrap_or_else(|| panic!("prompt_tokens_details without cached_tokens: {usage}")),
    )
}

fn prompt_tokens(usage: &Value) -> u64 {
    usage["prompt_tokens"]
        .as_u64()
        .expect("usage.prompt_tokens")
}

/// The usage chunk of a streamed answer (`stream_options.include_usage`).
fn streamed_usage(c: &mut Client, path: &str, body: &Value) -> Value {
    let r = c.request("POST", path, Some(&body.to_string()));
    assert_eq!(r.status, 200, "{}", r.text());
    let text = r.text();
    let usages: Vec<Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str::<Value>(d).expect("each data line is JSON"))
        .filter(|v| !v["usage"].is_null())
        .map(|v| v["usage"].clone())
        .collect();
    assert_eq!(usages.len(), 1, "one usage chunk: {text}");
    usages[0].clone()
}

/// The value of the sample line starting with `series` (name and labels), if any.
fn sample(page: &str, series: &str) -> Option<f64> {
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// Polls `path` until `done(body)`, for at most 10 s (snapshots are published every
/// 50 ms, history seconds once a second).
fn poll(c: &mut Client, path: &str, done: impl Fn(&str) -> bool) -> String {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let body = c.request("GET", path, None).text();
        if done(&body) {
            return body;
        }
        assert!(Instant::now() < until, "{path} never got there:\n{body}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Subscribes to `/events` and waits for its `hello`.
fn subscribe(addr: SocketAddr) -> TcpStream {
    let mut sub = TcpStream::connect(addr).unwrap();
    sub.write_all(b"GET /events HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    read_until(&mut sub, |t| t.contains("event: hello"));
    sub
}

/// Reads from `stream` until `done(text so far)` or 10 s.
fn read_until(stream: &mut TcpStream, done: impl Fn(&str) -> bool) -> String {
    stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let until = Instant::now() + Duration::from_secs(10);
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

/// The `request` events in `text`.
fn request_events(text: &str) -> Vec<Value> {
    text.split("event: request\ndata: ")
        .skip(1)
        .map(|rest| serde_json::from_str(rest.lines().next().unwrap()).unwrap())
        .collect()
}

/// abe's chat template (`api::chat`): one block per message, then the assistant's turn.
fn rendered(messages: &Value) -> String {
    let mut out = String::new();
    for m in messages.as_array().unwrap() {
        out.push_str(&format!(
            "<|{}|>\n{}\n",
            m["role"].as_str().unwrap(),
            m["content"].as_str().unwrap()
        ));
    }
    out + "<|assistant|>\n"
}

#[test]
fn repeats_and_a_growing_chat_hit_the_cache_and_every_report_agrees() {
    let abe = start(continuous(true));
    let addr = abe.local_addr();
    let mut events = subscribe(addr);
    let mut c = Client::connect(addr);
    let mut answers: Vec<Value> = Vec::new(); // every answer's usage, for the totals

    // The same prompt twice: the first computes everything, the second finds every full
    // block but the one holding the last token (at least one token is computed, vLLM's
    // rule, so the step has logits to sample).
    let prompt = long_prompt();
    let body = json!({"prompt": prompt, "max_tokens": 4});
    let first = post(&mut c, "/v1/completions", &body)["usage"].clone();
    assert_eq!(prompt_tokens(&first), 500);
    assert_eq!(cached(&first), Some(0), "a cold cache: {first}");
    let again = post(&mut c, "/v1/completions", &body)["usage"].clone();
    let hit = cached(&again).unwrap();
    assert!(hit > 0 && hit < prompt_tokens(&again), "{again}");
    assert_eq!(hit % BLOCK_TOKENS, 0, "whole blocks: {again}");
    assert_eq!(hit, (500 - 1) / BLOCK_TOKENS * BLOCK_TOKENS, "{again}");
    answers.extend([first, again]);

    // Streamed with include_usage: the usage chunk carries it too.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let usage = streamed_usage(&mut c, "/v1/completions", &streamed);
    assert_eq!(cached(&usage), Some(hit), "streamed usage: {usage}");
    answers.push(usage);

    // A conversation, then the same conversation with the answer and one more turn: the
    // follow-up hits on every full block of the earlier turns (its rendered prompt begins
    // with the first one's).
    let system = "You are a patient assistant who answers questions about rivers, mills \
                  and the stones between them, in short plain sentences. "
        .repeat(5);
    let mut messages = json!([
        {"role": "system", "content": system},
        {"role": "user", "content": "Why does the river carry stones?"},
    ]);
    let earlier = rendered(&messages).len() as u64;
    let chat = post(
        &mut c,
        "/v1/chat/completions",
        &json!({"messages": messages, "max_tokens": 6}),
    );
    let reply = chat["choices"][0]["message"]["content"].clone();
    let usage = chat["usage"].clone();
    assert_eq!(cached(&usage), Some(0), "a new conversation: {usage}");
    answers.push(usage);
    let turns = messages.as_array_mut().unwrap();
    turns.push(json!({"role": "assistant", "content": reply}));
    turns.push(json!({"role": "user", "content": "And past the mill?"}));
    let usage = post(
        &mut c,
        "/v1/chat/completions",
        &json!({"messages": messages, "max_tokens": 6}),
    )["usage"]
        .clone();
    let follow_up = cached(&usage).unwrap();
    let earlier_blocks = earlier / 4 / BLOCK_TOKENS; // full blocks of the earlier turns
    assert!(earlier_blocks >= 10, "a conversation worth caching");
    assert!(
        follow_up >= earlier_blocks * BLOCK_TOKENS && follow_up < prompt_tokens(&usage),
        "the follow-up hits on its earlier turns ({earlier} bytes): {usage}"
    );
    assert_eq!(follow_up % BLOCK_TOKENS, 0, "{usage}");
    answers.push(usage);

    let queries: u64 = answers.iter().map(prompt_tokens).sum();
    let hits: u64 = answers.iter().map(|u| cached(u).unwrap()).sum();
    assert!(hits > 0);

    // /metrics: vLLM's counters (in tokens, as vLLM counts them) and abe's, equal to the
    // answers' totals once the snapshot holds all five.
    let m = r#"{model_name="abe-sim"}"#;
    let queries_series = format!("vllm:prefix_cache_queries_total{m}");
    let page = poll(&mut c, "/metrics", |p| {
        sample(p, &queries_series) == Some(queries as f64)
    });
    let vllm_hits = sample(&page, &format!("vllm:prefix_cache_hits_total{m}"));
    assert_eq!(vllm_hits, Some(hits as f64), "{page}");
    assert_eq!(
        sample(&page, "abe_prefix_cache_query_tokens_total"),
        Some(queries as f64)
    );
    assert_eq!(
        sample(&page, "abe_prefix_cache_hit_tokens_total"),
        Some(hits as f64)
    );
    assert_eq!(
        sample(&page, "abe_prefix_cache_evicted_blocks_total"),
        Some(0.0),
        "the cache has room for all of it"
    );

    // /metrics/json agrees.
    let j = c.request("GET", "/metrics/json", None).json();
    let p = &j["prefix_cache"];
    assert_eq!(p["query_tokens"], queries, "{p}");
    assert_eq!(p["hit_tokens"], hits, "{p}");
    let rate = hits as f64 / queries as f64;
    assert!(
        (p["hit_rate"].as_f64().unwrap() - rate).abs() < 1e-9,
        "{p} against {rate}"
    );

    // /metrics/history: the seconds' prefix-cache tokens add up to the same totals.
    let sums = |h: &Value| -> (u64, u64) {
        let seconds = h["seconds"].as_array().unwrap();
        let field = |key: &str| -> u64 {
            seconds
                .iter()
                .map(|s| s["continuous"]["prefix_cache"][key].as_u64().unwrap())
                .sum()
        };
        (field("query_tokens"), field("hit_tokens"))
    };
    let h = poll(&mut c, "/metrics/history", |body| {
        sums(&serde_json::from_str(body).unwrap()).0 == queries
    });
    let h: Value = serde_json::from_str(&h).unwrap();
    assert_eq!(sums(&h), (queries, hits), "{h}");
    for s in h["seconds"].as_array().unwrap() {
        let p = &s["continuous"]["prefix_cache"];
        let q = p["query_tokens"].as_u64().unwrap();
        let k = p["hit_tokens"].as_u64().unwrap();
        if q == 0 {
            assert!(p["hit_rate"].is_null(), "a quiet second has no rate: {p}");
        } else {
            let want = k as f64 / q as f64;
            assert!((p["hit_rate"].as_f64().unwrap() - want).abs() < 1e-9, "{p}");
        }
    }

    // Each `request` event says what its answer said.
    let text = read_until(&mut events, |t| request_events(t).len() >= answers.len());
    let mut seen: Vec<u64> = request_events(&text)
        .iter()
        .map(|e| e["cached_tokens"].as_u64().unwrap_or_else(|| panic!("{e}")))
        .collect();
    let mut said: Vec<u64> = answers.iter().map(|u| cached(u).unwrap()).collect();
    seen.sort_unstable();
    said.sort_unstable();
    assert_eq!(seen, said, "{text}");
    abe.shutdown();
}

#[test]
fn with_caching_off_or_request_level_batching_nothing_is_reported_cached() {
    let mut request_level = test_config();
    request_level.batching.mode = BatchingMode::Request;
    for (what, config) in [
        ("continuous, prefix_caching = false", continuous(false)),
        ("request-level", request_level),
    ] {
        let abe = start(config);
        let addr = abe.local_addr();
        let mut events = subscribe(addr);
        let mut c = Client::connect(addr);
        let body = json!({"prompt": long_prompt(), "max_tokens": 4});
        for _ in 0..2 {
            let usage = post(&mut c, "/v1/completions", &body)["usage"].clone();
            assert_eq!(cached(&usage), None, "{what}: {usage}");
        }
        let mut streamed = body.clone();
        streamed["stream"] = json!(true);
        streamed["stream_options"] = json!({"include_usage": true});
        let usage = streamed_usage(&mut c, "/v1/completions", &streamed);
        assert_eq!(cached(&usage), None, "{what}: streamed {usage}");

        let m = r#"{model_name="abe-sim"}"#;
        let prompts = format!("vllm:prompt_tokens_total{m}");
        let page = poll(&mut c, "/metrics", |p| sample(p, &prompts) == Some(1_500.0));
        for name in ["queries", "hits"] {
            let series = format!("vllm:prefix_cache_{name}_total{m}");
            assert_eq!(sample(&page, &series), Some(0.0), "{what}: {series}");
        }
        assert!(
            !page.contains("abe_prefix_cache_"),
            "{what}: abe's own series only where a prefix cache runs"
        );
        let j = c.request("GET", "/metrics/json", None).json();
        assert!(j["prefix_cache"].is_null(), "{what}: {}", j["prefix_cache"]);
        let text = read_until(&mut events, |t| request_events(t).len() >= 3);
        for e in request_events(&text) {
            assert!(e.get("cached_tokens").is_none(), "{what}: {e}");
        }
        abe.shutdown();
    }
}

/// The cache is keyed by LoRA adapter, as vLLM's block hash is: the same prompt under two
/// adapters, or under an adapter and the base model, shares no cached block; each hits its
/// own on a repeat.
#[test]
fn the_same_prompt_under_another_adapter_finds_nothing_cached() {
    let mut cfg = continuous(true);
    cfg.lora.max_loras = 2;
    cfg.lora.lora_load_ms = 0.0;
    cfg.lora.adapters = vec![
        abe::router::lora::AdapterConfig::Name("sql-lora".into()),
        abe::router::lora::AdapterConfig::Name("chat-lora".into()),
    ];
    let abe = start(cfg);
    let mut c = Client::connect(abe.local_addr());
    let prompt = long_prompt();
    let mut ask = |model: &str| {
        let body = json!({"model": model, "prompt": prompt, "max_tokens": 2});
        let usage = post(&mut c, "/v1/completions", &body)["usage"].clone();
        (
            cached(&usage).expect("caching on: the field is there"),
            prompt_tokens(&usage),
        )
    };
    let (hit, _) = ask("abe-sim");
    assert_eq!(hit, 0, "a cold cache");
    for model in ["sql-lora", "chat-lora"] {
        let (hit, _) = ask(model);
        assert_eq!(
            hit, 0,
            "{model}: the base model's or another adapter's KV is not its own"
        );
    }
    for model in ["abe-sim", "sql-lora", "chat-lora"] {
        let (hit, prompt_tokens) = ask(model);
        assert_eq!(
            hit,
            (prompt_tokens - 1) / BLOCK_TOKENS * BLOCK_TOKENS,
            "{model}: a repeat under the same model or adapter hits every full block"
        );
    }
}

/// An adapter loaded under the id an unloaded one held finds none of the KV that one left
/// cached (vLLM never reuses a `lora_int_id`): the same prompt under the new adapter is a
/// miss, and a repeat under it hits its own blocks.
#[test]
fn an_adapter_under_a_reused_id_finds_nothing_its_predecessor_cached() {
    let mut cfg = continuous(true);
    cfg.lora.max_lora_adapters = 1;
    cfg.lora.lora_load_ms = 0.0;
    let abe = start(cfg);
    let mut c = Client::connect(abe.local_addr());
    let prompt = long_prompt();
    let ask = |c: &mut Client, model: &str| {
        let body = json!({"model": model, "prompt": prompt, "max_tokens": 2});
        let usage = post(c, "/v1/completions", &body)["usage"].clone();
        (cached(&usage).expect("caching on"), prompt_tokens(&usage))
    };
    let admin = |c: &mut Client, path: &str, body: &str| {
        let r = c.request("POST", path, Some(body));
        assert_eq!(r.status, 200, "{path}: {}", r.text());
    };
    admin(
        &mut c,
        "/v1/load_lora_adapter",
        r#"{"lora_name":"a","lora_path":"/a"}"#,
    );
    assert_eq!(ask(&mut c, "a").0, 0, "a cold cache");
    let (hit, tokens) = ask(&mut c, "a");
    let full = (tokens - 1) / BLOCK_TOKENS * BLOCK_TOKENS;
    assert_eq!(hit, full, "a repeat under 'a' hits its blocks");
    admin(&mut c, "/v1/unload_lora_adapter", r#"{"lora_name":"a"}"#);
    // The table has one id: 'b' takes 'a's.
    admin(
        &mut c,
        "/v1/load_lora_adapter",
        r#"{"lora_name":"b","lora_path":"/b"}"#,
    );
    assert_eq!(
        ask(&mut c, "b").0,
        0,
        "'b' under 'a's id: 'a's cached KV is not 'b's"
    );
    assert_eq!(ask(&mut c, "b").0, full, "a repeat under 'b' hits its own");
}
