//! Criterion benches of the live runtime with the `none` latency model (pure overhead).
//!
//! - `runtime/round_trip`: one request submitted through `Handle::submit` and waited for,
//!   one at a time: the latency of an idle engine (wake-ups included).
//! - `runtime/pipelined_256`: requests through a tagged submitter with 256 in flight; one
//!   iteration = one request, so the figure is engine + worker cost per request under load.

use abe::core::{Kind, Priority};
use abe::exec::latency::LatencyModel;
use abe::exec::Work;
use abe::runtime::{self, Request, RuntimeConfig};
use criterion::{criterion_group, criterion_main, Criterion};
use std::time::Instant;

fn config() -> RuntimeConfig {
    let mut cfg = RuntimeConfig::default();
    cfg.core.workers = 1;
    cfg.sim.latency = LatencyModel::None;
    cfg
}

fn request() -> Request {
    Request {
        priority: Priority::Normal,
        route: None,
        work: Work {
            kind: Kind::Completion,
            prompt: "a short prompt for the overhead bench".into(),
            max_tokens: 1,
            ..Default::default()
        },
    }
}

fn round_trip(c: &mut Criterion) {
    let handle = runtime::start(config()).expect("runtime starts");
    let mut group = c.benchmark_group("runtime");
    group.bench_function("round_trip", |b| {
        b.iter(|| handle.submit(request()).wait().expect("served"))
    });
    let mut sub = handle.submitter(None).expect("submitter");
    group.bench_function("pipelined_256", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            let (mut sent, mut done) = (0u64, 0u64);
            while done < iters {
                while sent < iters && sub.in_flight() < 256 {
                    if sub.submit(request(), sent).is_err() {
                        break;
                    }
                    sent += 1;
                }
                let n = sub.drain_completions(|c| {
                    assert!(c.outcome().is_some_and(|o| o.is_ok()));
                });
                done += n as u64;
                if n == 0 {
                    std::thread::yield_now();
                }
            }
            start.elapsed()
        })
    });
    group.finish();
    handle.shutdown(std::time::Duration::from_secs(5));
}

criterion_group!(benches, round_trip);
criterion_main!(benches);
