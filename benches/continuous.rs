//! Criterion bench of the continuous-batching scheduler alone.
//!
//! `continuous/tick_16_slots`: one tick (admit into freed slots, build the step: 16 decode
//! entries) plus its completion, with 16 generating slots and a steady stream of requests
//! finishing and arriving. Divide by 16 for the cost per active slot.

use abe::core::continuous::{Continuous, ContinuousConfig, EntryResult, StepAction};
use abe::core::{Kind, Priority, RequestMeta};
use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;

fn tick(c: &mut Criterion) {
    let mut group = c.benchmark_group("continuous");
    group.bench_function("tick_16_slots", |b| {
        let mut sched = Continuous::new(ContinuousConfig {
            max_slots: 16,
            max_queue: 4096,
            ..ContinuousConfig::default()
        });
        let mut results = [EntryResult::Continue; 16];
        let mut n = 0u64;
        b.iter(|| {
            // Keep the queue topped up so freed slots are refilled at once.
            while sched.waiting() < 16 {
                let mut m = RequestMeta::new(Priority::Normal, Kind::Completion, 64, 64, 0);
                m.tokens_estimated = 16 + 64;
                let _ = sched.admit(m);
            }
            let mut entries = 0;
            sched.tick(&mut |a| {
                if let StepAction::Step { entries: e, .. } = a {
                    entries = e.len();
                }
            });
            // One request in 64 finishes by EOS at each step.
            for (i, r) in results.iter_mut().enumerate().take(entries) {
                n += 1;
                *r = if (n + i as u64) % 64 == 0 {
                    EntryResult::Finished
                } else {
                    EntryResult::Continue
                };
            }
            sched.complete_step(0, &results[..entries], &mut |t, _| {
                black_box(t);
            });
        });
    });
    group.finish();
}

criterion_group!(benches, tick);
criterion_main!(benches);
