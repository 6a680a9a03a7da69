//! The research strategies' goals (issue 12, section 3), pinned in the simulator at small
//! sizes: `multi_bin` on `long_tail` fails nothing that `fixed` completes and its p99 is no
//! worse than `fixed`'s; `dynamic` (and `multi_bin`) lose no request on a built-in scenario
//! where `fixed` loses none; under a KV-memory-bound workload (`scenarios/kv_bound.toml`,
//! Pang et al.'s setting) `dynamic` beats static batch sizes.
//!
//! Every run is virtual time with a fixed seed: deterministic, nothing here is timed. The
//! figures at full size, with their commands, are in BENCHMARKS.md.

use abe::sim::report::{RunReport, SimReport};
use abe::sim::{simulate, SimulateOptions};
use std::path::Path;

fn run(scenario: &str, requests: u64, strategies: &[&str], sweep: &[&str]) -> SimReport {
    let o = SimulateOptions {
        scenario: scenario.into(),
        requests: Some(requests),
        strategies: strategies.iter().map(|s| s.to_string()).collect(),
        sweep: sweep.iter().map(|s| s.to_string()).collect(),
        jobs: 1,
        ..SimulateOptions::default()
    };
    simulate(&o).unwrap_or_else(|e| panic!("{scenario}: {e}"))
}

fn by_label<'a>(report: &'a SimReport, label: &str) -> &'a RunReport {
    report
        .runs
        .iter()
        .find(|r| r.label == label)
        .unwrap_or_else(|| panic!("no run labelled '{label}' in {}", report.scenario))
}

/// Requests lost: refused at admission or failed (timeouts) after it.
fn lost(r: &RunReport) -> u64 {
    r.rejected_queue_full + r.failed + r.unfinished
}

#[test]
fn multi_bin_on_long_tail_fails_nothing_fixed_completes_and_its_p99_is_no_worse() {
    // 5,000 requests (~17 min of virtual time at 5 requests/s): the boundaries are
    // recomputed at 32, 64, 128, ... completions, then every 1,000. (At 3,000 requests,
    // seed 1, the p99 is still 1.03x `fixed`'s: the small samples of the start weigh more.)
    let report = run("long_tail", 5_000, &["fixed", "multi_bin"], &[]);
    let fixed = by_label(&report, "fixed");
    let multi_bin = by_label(&report, "multi_bin");
    assert_eq!(lost(fixed), 0, "fixed loses nothing here");
    assert_eq!(
        lost(multi_bin),
        0,
        "multi_bin lost requests fixed completes"
    );
    assert!(
        multi_bin.latency_ms.p99 <= fixed.latency_ms.p99,
        "multi_bin p99 {} ms > fixed's {} ms",
        multi_bin.latency_ms.p99,
        fixed.latency_ms.p99
    );
    // Short answers no longer wait behind long ones: the median is lower too.
    assert!(multi_bin.latency_ms.p50 < fixed.latency_ms.p50);
}

#[test]
fn research_strategies_lose_nothing_where_fixed_loses_nothing() {
    for scenario in [
        "long_tail",
        "steady_state",
        "mixed_priority",
        "heavy_load",
        "bursty",
    ] {
        let report = run(scenario, 3_000, &["fixed", "dynamic", "multi_bin"], &[]);
        assert_eq!(lost(by_label(&report, "fixed")), 0, "{scenario}: fixed");
        for strategy in ["dynamic", "multi_bin"] {
            let r = by_label(&report, strategy);
            assert_eq!(lost(r), 0, "{scenario}: {strategy} lost requests");
            assert_eq!(r.completed, 3_000, "{scenario}: {strategy}");
        }
    }
}

#[test]
fn dynamic_beats_static_batch_sizes_when_kv_memory_binds() {
    let scenario = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/kv_bound.toml");
    let report = run(
        scenario.to_str().unwrap(),
        1_000,
        &["fixed", "dynamic"],
        &["max_batch_size=9,24,32,128"],
    );
    let tokens_per_s = |label: &str| by_label(&report, label).output_tokens_per_s;
    // `dynamic` ignores max_batch_size (its b_max is 128): every point is the same run.
    let dynamic = tokens_per_s("dynamic max_batch_size=9");
    for label in ["fixed max_batch_size=9", "fixed max_batch_size=24"] {
        assert_eq!(lost(by_label(&report, label)), 0);
    }
    assert_eq!(lost(by_label(&report, "dynamic max_batch_size=9")), 0);
    // B = 9: the largest size safe for the worst case (9 x 4,096 tokens) without a memory
    // check: dynamic more than doubles it.
    assert!(dynamic > 2.0 * tokens_per_s("fixed max_batch_size=9"));
    // Static sizes below what the memory holds on average (~30): +15 % and +5 %.
    assert!(dynamic > 1.10 * tokens_per_s("fixed max_batch_size=24"));
    assert!(dynamic > 1.03 * tokens_per_s("fixed max_batch_size=32"));
    // A static size that only the memory check bounds does as well (within 1 %): the gain
    // is the memory model's, not a better packing.
    let guarded = tokens_per_s("fixed max_batch_size=128");
    assert!(
        (dynamic / guarded - 1.0).abs() < 0.01,
        "{dynamic} vs {guarded}"
    );
}
