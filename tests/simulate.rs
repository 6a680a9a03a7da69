//! The simulator end to end: scenario files, determinism, identical request sequences,
//! arrival-process rates, the multi-bin paper's closed form, outputs and the CLI.
//!
//! Statistical checks use fixed seeds, so they are deterministic; their tolerances are still
//! several standard errors wide so that a change of seed or RNG would not make them flaky.
//! No test here measures wall-clock time (the speed figure comes from benches/simulate.rs).

use abe::core::strategy::StrategyKind;
use abe::sim::arrivals::Arrivals;
use abe::sim::dist::LengthDist;
use abe::sim::output::{self, OutputPaths};
use abe::sim::priority::PriorityMix;
use abe::sim::scenario::{builtin, Scenario, BUILTIN_NAMES};
use abe::sim::workload::{SimRequest, Workload};
use abe::sim::{simulate, SimError, SimulateOptions};
use std::path::{Path, PathBuf};

fn opts(scenario: &str, requests: u64) -> SimulateOptions {
    SimulateOptions {
        scenario: scenario.into(),
        requests: Some(requests),
        ..SimulateOptions::default()
    }
}

fn scratch_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("abe-sim-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn shipped_scenario_files_equal_the_builtins() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    for name in BUILTIN_NAMES {
        let file = Scenario::load(&dir.join(format!("{name}.toml")))
            .unwrap_or_else(|e| panic!("{name}.toml: {e}"));
        assert_eq!(
            file,
            builtin(name).unwrap(),
            "scenarios/{name}.toml drifted"
        );
    }
}

#[test]
fn same_seed_gives_byte_identical_json_whatever_the_thread_count() {
    let mut o = opts("mixed_priority", 20_000);
    o.jobs = 1;
    let a = simulate(&o).unwrap().to_json();
    o.jobs = 2;
    let b = simulate(&o).unwrap().to_json();
    assert_eq!(a, b);
    o.seed = 8;
    let c = simulate(&o).unwrap().to_json();
    assert_ne!(a, c, "another seed must change the report");
}

#[test]
fn every_strategy_is_offered_the_identical_request_sequence() {
    let r = simulate(&opts("long_tail", 5_000)).unwrap();
    assert_eq!(r.runs.len(), StrategyKind::ALL.len());
    for run in &r.runs {
        assert_eq!(run.request_digest, r.request_digest, "{}", run.label);
        assert_eq!(run.requests_offered, 5_000);
        assert_eq!(
            run.completed + run.failed + run.rejected_queue_full + run.unfinished,
            5_000,
            "{}: every request is accounted for",
            run.label
        );
    }
}

fn workload(arrivals: Arrivals) -> Workload {
    Workload {
        arrivals,
        prompt_tokens: LengthDist::Fixed { value: 10.0 },
        output_tokens: LengthDist::Fixed { value: 10.0 },
        priority: PriorityMix::default(),
        prediction_error_sigma: 0.0,
    }
}

fn times_s(reqs: &[SimRequest]) -> Vec<f64> {
    reqs.iter().map(|r| r.arrival_ns as f64 / 1e9).collect()
}

fn count_in(t: &[f64], from: f64, to: f64) -> usize {
    t.iter().filter(|&&x| x >= from && x < to).count()
}

#[test]
fn constant_and_poisson_arrivals_have_the_asked_rate() {
    let n = 100_000;
    let c = times_s(
        &workload(Arrivals::Constant { rate_rps: 100.0 })
            .generate(n, 1)
            .unwrap(),
    );
    assert_eq!(c[0], 0.0);
    assert!((c[n as usize - 1] - 999.99).abs() < 1e-6);
    let p = times_s(
        &workload(Arrivals::Poisson { rate_rps: 100.0 })
            .generate(n, 1)
            .unwrap(),
    );
    // Mean gap 10 ms: relative standard error 1/sqrt(n) = 0.3 %; allow 1.5 %.
    let mean_gap = p[n as usize - 1] / n as f64;
    assert!(
        (mean_gap - 0.01).abs() < 0.01 * 0.015,
        "mean gap {mean_gap}"
    );
    // Exponential gaps: coefficient of variation 1 (constant arrivals have 0).
    let gaps: Vec<f64> = p.windows(2).map(|w| w[1] - w[0]).collect();
    let m = gaps.iter().sum::<f64>() / gaps.len() as f64;
    let sd = (gaps.iter().map(|g| (g - m).powi(2)).sum::<f64>() / gaps.len() as f64).sqrt();
    assert!((sd / m - 1.0).abs() < 0.03, "cv {}", sd / m);
}

#[test]
fn ramp_and_spike_follow_their_rate_curves() {
    let ramp = |poisson| Arrivals::Ramp {
        start_rps: 10.0,
        end_rps: 500.0,
        ramp_s: 60.0,
        poisson,
    };
    // Expected arrivals in [0, 60) = (10 + 500) / 2 x 60 = 15300; in [50, 60) = 4591.7.
    let det = times_s(&workload(ramp(false)).generate(30_000, 1).unwrap());
    assert!(count_in(&det, 0.0, 60.0).abs_diff(15_300) <= 1);
    assert!(count_in(&det, 50.0, 60.0).abs_diff(4_592) <= 1);
    assert!(count_in(&det, 60.0, 70.0).abs_diff(5_000) <= 1);
    let poi = times_s(&workload(ramp(true)).generate(30_000, 1).unwrap());
    // Poisson counts: 5 standard deviations (sqrt of the mean).
    assert!(count_in(&poi, 0.0, 60.0).abs_diff(15_300) <= 620);
    assert!(count_in(&poi, 50.0, 60.0).abs_diff(4_592) <= 340);

    let spike = |poisson| Arrivals::Spike {
        base_rps: 100.0,
        multiplier: 10.0,
        spike_start_s: 60.0,
        spike_duration_s: 10.0,
        poisson,
    };
    let det = times_s(&workload(spike(false)).generate(40_000, 2).unwrap());
    assert!(count_in(&det, 0.0, 60.0).abs_diff(6_000) <= 1);
    assert!(count_in(&det, 60.0, 70.0).abs_diff(10_000) <= 1);
    assert!(count_in(&det, 70.0, 80.0).abs_diff(1_000) <= 1);
    let poi = times_s(&workload(spike(true)).generate(40_000, 2).unwrap());
    assert!(count_in(&poi, 60.0, 70.0).abs_diff(10_000) <= 500);
    assert!(count_in(&poi, 0.0, 60.0).abs_diff(6_000) <= 390);
}

#[test]
fn saturated_puts_everything_at_zero_and_replay_reads_the_trace() {
    let s = workload(Arrivals::Saturated).generate(1_000, 3).unwrap();
    assert_eq!(s.len(), 1_000);
    assert!(s.iter().all(|r| r.arrival_ns == 0));

    let dir = scratch_dir("replay");
    let trace = dir.join("trace.csv");
    std::fs::write(
        &trace,
        "arrival_ms,prompt_tokens,output_tokens,priority\n0,10,5,critical\n2.5,20,6,\n1,30,7,low\n",
    )
    .unwrap();
    let w = workload(Arrivals::Replay {
        path: trace,
        format: None,
        rate_scale: 1.0,
    });
    let r = w.generate(10, 3).unwrap();
    assert_eq!(
        r.len(),
        3,
        "a trace shorter than --requests gives what it has"
    );
    let got: Vec<(u64, u32, u32)> = r
        .iter()
        .map(|x| (x.arrival_ns, x.prompt_tokens, x.output_tokens))
        .collect();
    assert_eq!(
        got,
        [(0, 10, 5), (1_000_000, 30, 7), (2_500_000, 20, 6)],
        "sorted by arrival"
    );
    assert_eq!(r[0].priority.as_str(), "critical");
    assert_eq!(r[1].priority.as_str(), "low");
    assert_eq!(w.generate(2, 3).unwrap().len(), 2);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Closed form of the multi-bin paper's capacity for B = 8 and service U[1, 2] with K
/// equal-mass bins (/tmp/multibin_spec.md section 6): C_K = 144 K / (27 K + 7).
fn closed_form(k: f64) -> f64 {
    144.0 * k / (27.0 * k + 7.0)
}

/// Throughput of `strategy` on the paper scenario with sweep point `point` (e.g.
/// `oracle_bins=4`).
fn paper_throughput(strategy: &str, point: &str) -> f64 {
    let mut o = opts("multibin_paper", 64_000);
    o.strategies = vec![strategy.into()];
    o.sweep = vec![point.into()];
    let r = simulate(&o).unwrap();
    let run = &r.runs[0];
    assert_eq!(run.completed, 64_000);
    if strategy == "multi_bin" {
        // Bins hold random counts, so each bin's last batch may be short: at most one per bin.
        let full = run
            .batch_sizes
            .iter()
            .find(|b| b[0] == 8)
            .map_or(0, |b| b[1]);
        assert!(run.batches - full <= 16, "{:?}", run.batch_sizes);
        assert!(full >= 7_984, "{:?}", run.batch_sizes);
    } else {
        // Full batches only: 64000 / 8 = 8000 batches, all released as full.
        assert_eq!(run.batches, 8_000);
        assert_eq!(run.flush_reasons.full, 8_000);
        assert_eq!(run.batch_sizes, vec![[8, 8_000]]);
    }
    run.throughput_rps
}

#[test]
fn fifo_batching_matches_the_multi_bin_closed_form_for_one_bin() {
    // K = 1: E[max of 8 of U[1,2]] = (1 + 8 x 2) / 9 = 1.8889 s, so C_1 = 8 / 1.8889 = 4.2353.
    // 8000 batches: the standard error of the mean batch time is about 0.06 %.
    let got = paper_throughput("fixed", "oracle_bins=1");
    let want = closed_form(1.0);
    assert!(
        (got / want - 1.0).abs() < 0.02,
        "simulated {got:.4} requests/s, closed form {want:.4}"
    );
}

/// For K = 1, 2, 4, 8 (sweep point `point(K)`): `strategy`'s throughput is within 2 % of
/// the closed form, and rises with K.
fn assert_closed_form_rising_with_k(strategy: &str, point: impl Fn(u32) -> String) {
    let mut last = 0.0;
    for k in [1u32, 2, 4, 8] {
        let got = paper_throughput(strategy, &point(k));
        let want = closed_form(f64::from(k));
        assert!(
            (got / want - 1.0).abs() < 0.02,
            "K = {k}: simulated {got:.4}, closed form {want:.4}"
        );
        assert!(got > last, "throughput must rise with K");
        last = got;
    }
}

/// K > 1 through the driver's oracle pre-binning (see src/sim/binning.rs): the backlog is
/// sorted into K equal-mass bins by output length and fed to the unchanged FIFO core in
/// single-bin groups of B, which is the paper's multi-bin policy on a saturated queue.
#[test]
fn oracle_binning_matches_the_closed_form_and_throughput_rises_with_bins() {
    assert_closed_form_rising_with_k("fixed", |k| format!("oracle_bins={k}"));
}

/// The same check through the real `multi_bin` strategy, on the unsorted backlog. The
/// scenario pins its batch size to 8 and lets its bins start equal-width over [1, 10000];
/// the backlog is binned on admission, before any statistics, and every length is in
/// [5000, 10000], so `bins = 2K` gives K equal-mass bins (see the scenario's notes).
#[test]
fn multi_bin_strategy_matches_the_closed_form() {
    assert_closed_form_rising_with_k("multi_bin", |k| format!("bins={}", 2 * k));
}

#[test]
fn oracle_bins_on_an_unsaturated_workload_is_a_clear_error() {
    let mut o = opts("steady_state", 100);
    o.sweep = vec!["oracle_bins=1,4".into()];
    let e = simulate(&o).unwrap_err().to_string();
    assert!(e.contains("saturated"), "{e}");
}

#[test]
fn unknown_names_list_the_valid_ones() {
    let mut o = opts("steady_state", 100);
    o.strategies = vec!["fixed".into(), "fastest".into()];
    let e = simulate(&o).unwrap_err();
    assert!(matches!(e, SimError::UnknownStrategy(_)));
    assert!(
        e.to_string().contains("fixed, queue_depth, latency_aware"),
        "{e}"
    );
    let e = simulate(&opts("no_such_scenario", 100))
        .unwrap_err()
        .to_string();
    assert!(e.contains("steady_state, ramp_up, spike_test"), "{e}");
    let mut o = opts("steady_state", 100);
    o.latency_model = Some("warp".into());
    let e = simulate(&o).unwrap_err().to_string();
    assert!(e.contains("max_of_batch, affine_step"), "{e}");
}

#[test]
fn every_latency_model_runs_and_sweeps_make_one_run_per_point_and_strategy() {
    for model in [
        "none",
        "linear",
        "calibrated",
        "max_of_batch",
        "affine_step",
    ] {
        let mut o = opts("spike_test", 2_000);
        o.latency_model = Some(model.into());
        o.strategies = vec!["fixed".into()];
        let r = simulate(&o).unwrap();
        assert_eq!(r.latency.name(), model);
        let run = &r.runs[0];
        // The linear model is slow enough to overload the spike: some requests time out.
        assert!(run.completed > 1_000, "{model}: {}", run.completed);
        assert_eq!(
            run.completed + run.failed + run.rejected_queue_full,
            2_000,
            "{model}"
        );
    }
    let mut o = opts("steady_state", 2_000);
    o.strategies = vec!["fixed".into(), "queue_depth".into()];
    o.sweep = vec!["workers=1,2".into(), "max_wait_ms=5,50".into()];
    let r = simulate(&o).unwrap();
    let labels: Vec<&str> = r.runs.iter().map(|x| x.label.as_str()).collect();
    assert_eq!(labels[0], "fixed workers=1 max_wait_ms=5");
    assert_eq!(labels[7], "queue_depth workers=2 max_wait_ms=50");
    assert_eq!(labels.len(), 8);
}

#[test]
fn outputs_are_written_and_the_csv_and_svg_are_well_formed() {
    let dir = scratch_dir("outputs");
    let mut o = opts("multibin_paper", 6_400);
    o.strategies = vec!["fixed".into()];
    o.sweep = vec!["oracle_bins=1,2,4".into()];
    let r = simulate(&o).unwrap();
    let paths = OutputPaths {
        json: Some(dir.join("out.json")),
        csv: Some(dir.join("out.csv")),
        svg_dir: Some(dir.join("svg")),
    };
    let written = output::write_outputs(&r, &paths).unwrap();
    assert_eq!(written.len(), 2 + 5);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("out.json")).unwrap()).unwrap();
    assert_eq!(json["runs"].as_array().unwrap().len(), 3);
    let csv = std::fs::read_to_string(dir.join("out.csv")).unwrap();
    let mut lines = csv.lines();
    assert_eq!(
        lines.next().unwrap(),
        "run,strategy,oracle_bins,window_start_s,completed,mean_latency_ms,queue_depth_mean,batches,mean_batch_size,failed"
    );
    let completed: u64 = lines
        .map(|l| l.split(',').nth(4).unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(completed, 3 * 6_400);
    for f in [
        "latency_over_time.svg",
        "queue_depth_over_time.svg",
        "batch_size_distribution.svg",
        "throughput_vs_oracle_bins.svg",
        "latency_vs_oracle_bins.svg",
    ] {
        let svg = std::fs::read_to_string(dir.join("svg").join(f)).unwrap();
        assert!(
            svg.contains("<svg") && svg.trim_end().ends_with("</svg>"),
            "{f}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn cli_help_documents_workload_and_latency_keys_and_the_table_prints() {
    let exe = env!("CARGO_BIN_EXE_abe");
    let help = std::process::Command::new(exe)
        .args(["simulate", "--help"])
        .output()
        .unwrap();
    assert!(help.status.success());
    let text = String::from_utf8(help.stdout).unwrap();
    for key in [
        "max_of_batch",
        "affine_step",
        "decode_ms_per_token",
        "a_ms",
        "lognormal",
        "bimodal",
        "spike_start_s",
        "--sweep",
    ] {
        assert!(text.contains(key), "--help lacks {key}");
    }
    let run = std::process::Command::new(exe)
        .args([
            "simulate",
            "--scenario",
            "steady_state",
            "--strategies",
            "fixed",
            "--requests",
            "500",
            "--seed",
            "3",
        ])
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let out = String::from_utf8(run.stdout).unwrap();
    assert!(out.contains("p99.9 ms") && out.contains("fixed"), "{out}");
    let bad = std::process::Command::new(exe)
        .args(["simulate", "--strategies", "nope", "--requests", "10"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("valid strategies are"));
}

/// A closed loop of `clients` against one worker whose batch of n takes `a_ms + b_ms n`
/// (the linear model with every request 2 tokens and no noise), clients thinking 0.1 ms.
fn closed_loop_scenario(clients: u32, a_ms: f64, b_ms: f64) -> Scenario {
    let mut s = builtin("steady_state").unwrap();
    s.name = "closed_loop_test".into();
    s.requests = 3_000;
    s.workload = Workload {
        arrivals: Arrivals::Closed {
            clients,
            think_ms: 0.1,
            think_jitter: 0.5,
        },
        prompt_tokens: LengthDist::Fixed { value: 1.0 },
        output_tokens: LengthDist::Fixed { value: 1.0 },
        priority: PriorityMix::ALL_NORMAL,
        prediction_error_sigma: 0.0,
    };
    s.engine.workers = Some(1);
    s.engine.max_batch_size = Some(32);
    s.latency = abe::exec::latency::LatencyModel::Linear {
        base_ms: a_ms,
        per_token_ms: b_ms / 2.0,
        variance: 0.0,
    };
    s
}

/// The best possible throughput (requests/s) of [`closed_loop_scenario`]'s `clients`
/// (thinking 0.1 ms +- 50 %: 0.1 ms on average, 0.15 ms at most) against its worker (a
/// batch of n takes `a + b n` ms, batches of at most 32); the same bound as
/// `core::strategy::auto::tests::best_possible`, exact where asked:
/// - at most a full batch of clients: everyone in one batch, then everyone's think time:
///   `n` per `a + b n + 0.1` ms;
/// - at least twice a full batch: the next full batch has come back while one runs (a
///   think time is shorter than any batch here), so it is queued when the worker frees up
///   and the think time is hidden: 32 per `a + 32 b` ms.
fn best_possible_rps(clients: u32, a: f64, b: f64) -> f64 {
    const MAX_BATCH: u32 = 32;
    const THINK_MEAN_MS: f64 = 0.1;
    const THINK_LONGEST_MS: f64 = 0.15;
    if clients <= MAX_BATCH {
        let n = f64::from(clients);
        return n * 1e3 / (a + b * n + THINK_MEAN_MS);
    }
    assert!(
        clients >= 2 * MAX_BATCH,
        "no exact best for {clients} clients"
    );
    let full_batch_ms = a + b * f64::from(MAX_BATCH);
    assert!(
        THINK_LONGEST_MS < full_batch_ms,
        "the think time is not hidden"
    );
    f64::from(MAX_BATCH) * 1e3 / full_batch_ms
}

/// The adaptive-batching issue's closed-loop goal in the simulator: `auto`, told nothing,
/// reaches 95 % of the best possible throughput ([`best_possible_rps`]) where
/// work-conserving `fixed` splits the clients into groups.
#[test]
fn closed_loop_auto_reaches_95_percent_of_the_best_possible() {
    for (a, b) in [(10.0, 2.0), (1.0, 0.1), (50.0, 0.1)] {
        for clients in [2u32, 8, 64] {
            let s = closed_loop_scenario(clients, a, b);
            let mut o = opts("unused", 3_000);
            o.strategies = vec!["auto".into(), "fixed".into()];
            let r = abe::sim::simulate_scenario(&s, &o).unwrap();
            let best = best_possible_rps(clients, a, b);
            let auto = r.runs[0].throughput_rps / best;
            let fixed = r.runs[1].throughput_rps / best;
            assert_eq!(r.runs[0].completed, 3_000);
            assert!(
                auto >= 0.95,
                "a {a} b {b} clients {clients}: auto {auto:.3}, fixed {fixed:.3}"
            );
            if clients == 8 {
                assert!(
                    fixed < 0.8,
                    "a {a} b {b}: work-conserving should split: {fixed:.3}"
                );
            }
        }
    }
}

#[test]
fn closed_loops_are_deterministic_and_refuse_zero_clients() {
    let s = closed_loop_scenario(8, 10.0, 2.0);
    let o = opts("unused", 3_000);
    let a = abe::sim::simulate_scenario(&s, &o).unwrap().to_json();
    let b = abe::sim::simulate_scenario(&s, &o).unwrap().to_json();
    assert_eq!(a, b);
    let mut zero = s.clone();
    zero.workload.arrivals = Arrivals::Closed {
        clients: 0,
        think_ms: 1.0,
        think_jitter: 0.0,
    };
    let e = abe::sim::simulate_scenario(&zero, &o)
        .unwrap_err()
        .to_string();
    assert!(e.contains("workload.arrivals.clients"), "{e}");
}

/// `(failed, p50 ms, p99 ms)` per strategy of `strategies` on `scenario`.
fn research_runs(scenario: &str, requests: u64, strategies: &[&str]) -> Vec<(u64, f64, f64)> {
    let mut o = opts(scenario, requests);
    o.strategies = strategies.iter().map(|s| s.to_string()).collect();
    let r = simulate(&o).unwrap();
    r.runs
        .iter()
        .map(|run| (run.failed, run.latency_ms.p50, run.latency_ms.p99))
        .collect()
}

/// Issue 12, section 3. On `long_tail` multi_bin used to lose requests to queue timeouts
/// (all its bins equal-width until 1,000 completions, so everything shared one bin capped
/// at 9 requests by the per-bin memory prior) and so did dynamic (its in-band SLA window
/// grew one width per ~7 s batch). Now neither loses a request `fixed` completes, and
/// multi_bin's p50 and p99 stay near or below `fixed`'s (measured at 3,000 requests:
/// p99 17.4 s against 17.9 s; at 20,000 it is 1.04x, see BENCHMARKS.md).
#[test]
fn research_strategies_lose_nothing_fixed_completes_on_long_tail() {
    let runs = research_runs("long_tail", 3_000, &["fixed", "dynamic", "multi_bin"]);
    let (fixed, dynamic, multi_bin) = (runs[0], runs[1], runs[2]);
    assert_eq!(fixed.0, 0, "fixed completes everything");
    assert_eq!(dynamic.0, 0, "dynamic lost requests: {runs:?}");
    assert_eq!(multi_bin.0, 0, "multi_bin lost requests: {runs:?}");
    assert!(
        multi_bin.1 <= fixed.1,
        "multi_bin p50 above fixed's: {runs:?}"
    );
    assert!(
        multi_bin.2 <= 1.05 * fixed.2,
        "multi_bin p99 above fixed's: {runs:?}"
    );
}

/// Where the bins separate little (steady_state, mixed_priority: outputs of similar
/// length), multi_bin's age-aware bin choice keeps its p99 at or below `fixed`'s (it was
/// 4-5x with round robin), and dynamic loses nothing either.
#[test]
fn multi_bin_p99_is_no_worse_than_fixed_on_steady_and_mixed_priority() {
    for scenario in ["steady_state", "mixed_priority"] {
        let runs = research_runs(scenario, 3_000, &["fixed", "dynamic", "multi_bin"]);
        assert!(runs.iter().all(|r| r.0 == 0), "{scenario}: {runs:?}");
        assert!(
            runs[2].2 <= runs[0].2,
            "{scenario}: multi_bin p99 above fixed's: {runs:?}"
        );
    }
}

/// The load scenarios sit in their utilisation bands (not saturated), and `rate_scale`
/// moves the load: one request sequence per point, utilisation rising with the scale.
#[test]
fn load_scenarios_sit_in_their_bands_and_rate_scale_moves_the_load() {
    for (name, lo, hi) in [
        ("light_load", 0.18, 0.32),
        ("medium_load", 0.48, 0.62),
        ("heavy_load", 0.82, 0.93),
    ] {
        let mut o = opts(name, 5_000);
        o.strategies = vec!["fixed".into()];
        let r = simulate(&o).unwrap();
        let u = r.runs[0].worker_utilisation;
        assert!((lo..=hi).contains(&u), "{name}: utilisation {u:.3}");
    }
    let mut o = opts("medium_load", 3_000);
    o.strategies = vec!["fixed".into()];
    o.sweep = vec!["rate_scale=0.5,1,2".into()];
    let r = simulate(&o).unwrap();
    assert_eq!(r.runs.len(), 3);
    let u: Vec<f64> = r.runs.iter().map(|x| x.worker_utilisation).collect();
    assert!(u[0] < u[1] && u[1] < u[2], "{u:?}");
    assert_ne!(r.runs[0].request_digest, r.runs[1].request_digest);
    assert_eq!(r.runs[1].request_digest, r.request_digest);
    assert!((r.runs[2].throughput_rps / r.runs[0].throughput_rps - 4.0).abs() < 0.3);
    o.sweep = vec!["clients=4".into()];
    let e = simulate(&o).unwrap_err().to_string();
    assert!(e.contains("closed"), "{e}");
}

/// The closed-loop scenario separates `auto` from work-conserving dispatch, and `clients`
/// sweeps its client count.
#[test]
fn closed_loop_scenario_separates_auto_from_work_conserving() {
    let mut o = opts("closed_loop", 3_000);
    o.strategies = vec!["auto".into(), "fixed".into()];
    let best = best_possible_rps(8, 10.0, 2.0);
    let r = simulate(&o).unwrap();
    assert!(r.runs[0].throughput_rps / best > 0.95, "{:?}", r.runs[0]);
    assert!(r.runs[1].throughput_rps / best < 0.8, "{:?}", r.runs[1]);
    o.sweep = vec!["clients=1,2".into()];
    let r = simulate(&o).unwrap();
    assert_eq!(r.runs.len(), 4);
    assert_eq!(r.runs[0].label, "auto clients=1");
    assert!(r.runs[2].throughput_rps > r.runs[0].throughput_rps);
}

/// Bursty arrivals: the requests of a burst come together, and `auto` waits for the rest of
/// a burst where work-conserving dispatch sends its first request alone.
#[test]
fn bursty_scenario_batches_bursts() {
    let mut o = opts("bursty", 4_000);
    o.strategies = vec!["auto".into(), "fixed".into()];
    let r = simulate(&o).unwrap();
    assert_eq!(r.runs[0].completed, 4_000);
    assert!(r.runs[1].mean_batch_size > 2.0, "{:?}", r.runs[1]);
    assert!(
        r.runs[0].latency_ms.p50 <= r.runs[1].latency_ms.p50,
        "auto {:?} fixed {:?}",
        r.runs[0].latency_ms,
        r.runs[1].latency_ms
    );
}

/// `mixed_priority` reports latency per class, in the JSON, the table and the per-priority
/// CSV. Critical is below normal, but only by the queue wait it skips (~13 % at p50 on
/// 20,000 requests, seed 7): a batch's service time (~330 ms) dominates its latency.
#[test]
fn mixed_priority_reports_each_class_and_critical_is_below_normal() {
    let mut o = opts("mixed_priority", 10_000);
    o.strategies = vec!["fixed".into()];
    let r = simulate(&o).unwrap();
    let by = &r.runs[0].latency_ms_by_priority;
    let names: Vec<&str> = by.iter().map(|c| c.priority.as_str()).collect();
    assert_eq!(names, ["critical", "high", "normal"]);
    assert_eq!(by.iter().map(|c| c.offered).sum::<u64>(), 10_000);
    let (critical, normal) = (&by[0], &by[2]);
    assert!(
        critical.p50 < 0.95 * normal.p50 && critical.mean < normal.mean,
        "critical {critical:?} normal {normal:?}"
    );
    let table = r.table();
    assert!(table.contains("critical p99"), "{table}");
    let dir = scratch_dir("priority_csv");
    let paths = OutputPaths {
        json: None,
        csv: Some(dir.join("m.csv")),
        svg_dir: None,
    };
    let written = output::write_outputs(&r, &paths).unwrap();
    assert_eq!(written.len(), 2);
    let csv = std::fs::read_to_string(dir.join("m.by_priority.csv")).unwrap();
    assert!(csv.starts_with("run,strategy,priority,offered,"), "{csv}");
    assert_eq!(csv.lines().count(), 1 + 3);
    let _ = std::fs::remove_dir_all(&dir);
}
