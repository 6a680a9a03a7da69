//! Criterion bench of the `embed` executor's forward pass on all-MiniLM-L6-v2 (feature
//! `embed`): one sentence of 16 tokens, batches of 1, 8 and 64 (the anchors) and
//! 2, 3, 4 (where one thread stops beating two: `threads.rs`), plus a batch of 8 where one
//! input is 128 tokens: as one pass (what padding to the longest costs) and split by length
//! as the executor runs it (`7x16_1x128_split`).
//!
//! `16_tokens` runs on rayon's global pool (`RAYON_NUM_THREADS=1` for one thread);
//! `16_tokens_served` as the executor runs it ([`ComputeThreads`]: passes under
//! `SINGLE_THREAD_BELOW_TOKENS` on one thread). `two_workers_1_thread`: two passes of the
//! batch at once, each in a pool of one thread (two single-threaded workers, the layout
//! measured against one worker on both cores); criterion's time is for both, so per request
//! is that / (2 x batch size).
//!
//! `tokenize_64`: the HF tokenizer over 64 copies of the sentence, one thread, as the
//! worker runs it before a batch's passes.
//!
//! `gemm_1024x384x1536`: one matrix product of that shape (the biggest of a batch of 64),
//! candle's gemm alone, beside tools/bench/embed_gemm.py (OpenBLAS, torch); its throughput
//! is in FLOP.
//!
//! Criterion reports time per batch; per request is that / batch size. The model comes from
//! tools/fetch_minilm.sh (or `ABE_EMBED_MODEL_DIR`); without it the bench says so and
//! measures nothing. Run: `cargo bench --features embed --bench embed_forward`.
//!
//! The test suite's single pass (`support::measuring` false) leaves out the batches of 32
//! and 64 and the unsplit 128-token batch: in its debug build they are 10 of the pass's 16 s,
//! and the code they run is the same as the smaller batches'.

use abe::exec::embed::split::Plan;
use abe::exec::embed::{ComputeThreads, EmbedModel};
use candle_core::{Device, Tensor};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;
use std::path::PathBuf;
use std::time::Duration;

mod support;

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
    let served = ComputeThreads::new("bench-served").expect("pool");
    let measuring = support::measuring();
    let batches: &[usize] = if measuring {
        &[1, 2, 3, 4, 8, 64]
    } else {
        &[1, 2, 8]
    };
    for &batch in batches {
        let inputs: Vec<&[u32]> = (0..batch).map(|_| ids.as_slice()).collect();
        g.throughput(Throughput::Elements(batch as u64));
        g.bench_with_input(
            BenchmarkId::new("16_tokens", batch),
            &inputs,
            |b, inputs| b.iter(|| black_box(model.embed(inputs).expect("forward"))),
        );
        g.bench_with_input(
            BenchmarkId::new("16_tokens_served", batch),
            &inputs,
            |b, inputs| {
                b.iter(|| {
                    black_box(served.run(batch * 16, || model.embed(inputs).expect("forward")))
                })
            },
        );
    }
    // The same small batches forced onto one thread, beside `16_tokens` (the global pool: both
    // threads): the comparison that sets the one-thread line in `exec/embed/threads.rs`.
    let one_thread = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("pool");
    for batch in [1usize, 2, 3, 4] {
        let inputs: Vec<&[u32]> = (0..batch).map(|_| ids.as_slice()).collect();
        g.throughput(Throughput::Elements(batch as u64));
        g.bench_with_input(
            BenchmarkId::new("16_tokens_one_thread", batch),
            &inputs,
            |b, inputs| {
                b.iter(|| black_box(one_thread.install(|| model.embed(inputs).expect("forward"))))
            },
        );
    }
    let mut mixed: Vec<&[u32]> = (0..7).map(|_| ids.as_slice()).collect();
    mixed.push(&long);
    g.throughput(Throughput::Elements(8));
    if measuring {
        g.bench_with_input(BenchmarkId::new("7x16_1x128", 8), &mixed, |b, inputs| {
            b.iter(|| black_box(model.embed(inputs).expect("forward")))
        });
    }
    // The same batch as the executor runs it: split by length (`split::Plan`), each pass
    // on the threads its size gets.
    let mut plan = Plan::default();
    plan.make(&mixed.iter().map(|i| i.len()).collect::<Vec<_>>());
    assert_eq!(plan.passes().count(), 2, "the long input runs alone");
    g.bench_with_input(
        BenchmarkId::new("7x16_1x128_split", 8),
        &mixed,
        |b, inputs| {
            b.iter(|| {
                for pass in plan.passes() {
                    let rows: Vec<&[u32]> = pass.iter().map(|&i| inputs[i]).collect();
                    let longest = rows.iter().map(|r| r.len()).max().unwrap_or(0);
                    black_box(served.run(rows.len() * longest, || {
                        model.embed(&rows).expect("forward")
                    }));
                }
            })
        },
    );
    let single = || {
        rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .expect("pool")
    };
    let workers = [single(), single()];
    let pairs: &[usize] = if measuring { &[1, 4, 32] } else { &[1, 4] };
    for &batch in pairs {
        let inputs: Vec<&[u32]> = (0..batch).map(|_| ids.as_slice()).collect();
        g.throughput(Throughput::Elements(2 * batch as u64));
        g.bench_with_input(
            BenchmarkId::new("two_workers_1_thread", batch),
            &inputs,
            |b, inputs| {
                b.iter(|| {
                    std::thread::scope(|s| {
                        for w in &workers {
                            let model = &model;
                            s.spawn(move || {
                                black_box(w.install(|| model.embed(inputs).expect("forward")))
                            });
                        }
                    })
                })
            },
        );
    }
    // Tokenizing a batch of 64 sentences, as the worker does before its passes (one thread).
    g.throughput(Throughput::Elements(64));
    g.bench_function("tokenize_64", |b| {
        b.iter(|| {
            for _ in 0..64 {
                black_box(model.tokenize(black_box(SENTENCE)).expect("tokenizes"));
            }
        })
    });
    // The biggest matrix product of a batch of 64 x 16 tokens (the feed-forward layer's
    // first half), alone: beside tools/bench/embed_gemm.py's OpenBLAS and torch figures.
    let x = Tensor::randn(0f32, 1.0, (1024, 384), &Device::Cpu).expect("x");
    let w = Tensor::randn(0f32, 1.0, (384, 1536), &Device::Cpu).expect("w");
    g.throughput(Throughput::Elements(2 * 1024 * 384 * 1536));
    g.bench_function("gemm_1024x384x1536", |b| {
        b.iter(|| black_box(x.matmul(&w).expect("matmul")))
    });
    g.finish();
}

criterion_group!(benches, forward);
criterion_main!(benches);
