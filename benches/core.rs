//! Criterion benches of the sans-IO core alone.
//!
//! `core/request_cycle`: one iteration = one request admitted, batched (batch size 32, the
//! batch released as full) and completed, with a `poll` after every admission, as if every
//! request arrived in its own engine turn (the worst case). The figure is ns per request.
//! Strategy `fixed`: the cost of the core's bookkeeping (including `auto`'s models, which
//! learn from every arrival and completion whatever strategy runs).
//!
//! `core/request_cycle_auto`: the same cycle under `auto`. The worker is free at every
//! poll, so `auto` decides at every admission; the batches complete at once (a fitted cost
//! of 0), so each goes as a batch of one: the cost of a decision per request.

use abe::core::strategy::StrategyKind;
use abe::core::{Action, BatchId, BatchOutcome, Core, CoreConfig, Kind, Priority, RequestMeta};
use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;
use std::time::Instant;

fn core_for_bench(strategy: StrategyKind) -> Core {
    Core::new(CoreConfig {
        workers: 1,
        dispatch_when_idle: false,
        strategy,
        max_batch_size: 32,
        ..CoreConfig::default()
    })
}

fn request_cycle(c: &mut Criterion) {
    let mut group = c.benchmark_group("core");
    for (name, strategy) in [
        ("request_cycle", StrategyKind::Fixed),
        ("request_cycle_auto", StrategyKind::Auto),
    ] {
        cycle(&mut group, name, strategy);
    }
    group.finish();
}

fn cycle(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    strategy: StrategyKind,
) {
    group.bench_function(name, |b| {
        let mut core = core_for_bench(strategy);
        let mut now = 0u64;
        b.iter_custom(|iters| {
            let start = Instant::now();
            let mut batch: Option<BatchId> = None;
            for _ in 0..iters {
                now += 100;
                let meta = RequestMeta::new(Priority::Normal, Kind::Completion, 64, 16, now);
                black_box(core.admit(now, meta).expect("queue has room"));
                core.poll(now, &mut |a| {
                    if let Action::Dispatch { batch: id, .. } = a {
                        batch = Some(id);
                    }
                });
                if let Some(id) = batch.take() {
                    black_box(core.complete(now, id, BatchOutcome::Ok));
                }
            }
            start.elapsed()
        });
        assert_eq!(core.stats().failed, 0);
    });
}

criterion_group!(benches, request_cycle);
criterion_main!(benches);
