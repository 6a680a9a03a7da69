//! Criterion bench of the `embed` executor's forward pass on all-MiniLM-L6-v2 (feature
//! `embed`): one sentence of 16 tokens, batches of 1, 8 and 64 (the anchors), plus
//! a batch of 8 where one input is 128 tokens (what padding to the longest costs).
//!
//! Criterion reports time per batch; per request is that / batch size. The model comes from
//! tools/fetch_minilm.sh (or `ABE_EMBED_MODEL_DIR`); without it the bench says so and
//! measures nothing. Run: `cargo bench --features embed --bench embed_forward`.

use abe::exec::embed::EmbedModel;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;
use std::path::PathBuf;
use std::time::Duration;

/// 16 tokens with [CLS] and [SEP] (checked below).
const SENTENCE: &str = "The quick brown fox jumps over the lazy dog near the quiet river bank";

fn model_dir() -> PathBuf {
    std::env::var_os("ABE_EMBED_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/models/all-MiniLM-L6-v2")
        })
}

fn forward(c: &mut Criterion) {
    let dir = model_dir();
    if !dir.join("model.safetensors").is_file() {
        eprintln!(
            "embed_forward: no model at {}; run tools/fetch_minilm.sh",
            dir.display()
        );
        return;
    }
    let model = EmbedModel::load(&dir).expect("model loads");
    let ids = model.tokenize(SENTENCE).expect("tokenizes").ids;
    assert_eq!(ids.len(), 16, "the bench sentence is 16 tokens");
    let long = model.tokenize(&SENTENCE.repeat(9)).expect("tokenizes").ids[..128].to_vec();
    let mut g = c.benchmark_group("embed_forward");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
    for batch in [1usize, 8, 64] {
        let inputs: Vec<&[u32]> = (0..batch).map(|_| ids.as_slice()).collect();
        g.throughput(Throughput::Elements(batch as u64));
        g.bench_with_input(
            BenchmarkId::new("16_tokens", batch),
            &inputs,
            |b, inputs| b.iter(|| black_box(model.embed(inputs).expect("forward"))),
        );
    }
    let mut mixed: Vec<&[u32]> = (0..7).map(|_| ids.as_slice()).collect();
    mixed.push(&long);
    g.throughput(Throughput::Elements(8));
    g.bench_with_input(BenchmarkId::new("7x16_1x128", 8), &mixed, |b, inputs| {
        b.iter(|| black_box(model.embed(inputs).expect("forward")))
    });
    g.finish();
}

criterion_group!(benches, forward);
criterion_main!(benches);
