//! Criterion bench of the simulator end to end.
//!
//! `simulate/one_million_requests`: the built-in `steady_state` scenario, 1,000,000
//! requests, one strategy (`queue_depth`), the `calibrated` latency model, on one thread:
//! workload generation, the discrete-event run through the real core, and the report. The
//! figure is the wall time for the whole million (criterion also prints elements/s). The
//! test suite's single pass (`support::measuring` false) runs 100,000 of them.

use abe::sim::{simulate, SimulateOptions};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;
use std::time::Duration;

mod support;

const REQUESTS: u64 = 1_000_000;
/// The test suite's single pass: the same run, a tenth as long (4.4 s of a debug build).
const SMOKE_REQUESTS: u64 = 100_000;

fn one_million_requests(c: &mut Criterion) {
    let mut group = c.benchmark_group("simulate");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(30));
    let requests = if support::measuring() {
        REQUESTS
    } else {
        SMOKE_REQUESTS
    };
    group.throughput(Throughput::Elements(requests));
    let opts = SimulateOptions {
        scenario: "steady_state".into(),
        strategies: vec!["queue_depth".into()],
        seed: 7,
        requests: Some(requests),
        latency_model: Some("calibrated".into()),
        jobs: 1,
        ..SimulateOptions::default()
    };
    group.bench_function("one_million_requests", |b| {
        b.iter(|| {
            let report = simulate(black_box(&opts)).expect("the built-in scenario runs");
            assert_eq!(report.runs[0].requests_offered, requests);
            black_box(report)
        })
    });
    group.finish();
}

criterion_group!(benches, one_million_requests);
criterion_main!(benches);
