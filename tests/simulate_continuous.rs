//! The simulator in continuous-batching mode: the real `core::continuous` scheduler in
//! virtual time. Checks are exact where the arithmetic is (a lone request's TTFT and TPOT),
//! and otherwise compare runs on the identical request sequence; every run is seeded, and
//! no test measures wall-clock time.

use abe::core::BatchingMode;
use abe::sim::dist::LengthDist;
use abe::sim::output::{self, OutputPaths};
use abe::sim::report::SimReport;
use abe::sim::scenario::{builtin, Scenario};
use abe::sim::{simulate, simulate_scenario, SimulateOptions};
use std::path::PathBuf;

fn continuous(scenario: &str, requests: u64) -> SimulateOptions {
    let mut o = SimulateOptions {
        scenario: scenario.into(),
        requests: Some(requests),
        ..SimulateOptions::default()
    };
    o.engine.mode = Some(BatchingMode::Continuous);
    o
}

fn scratch_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("abe_sim_continuous_{name}_{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Requests 2 s apart never overlap: each is prefilled in one step (prompt 100 tokens at
/// 0.02 ms = 2 ms, which samples the first token) and decoded in 9 more steps of beta =
/// 5.74 ms (calibrated, b = 1).
#[test]
fn a_lone_request_has_the_latency_models_ttft_and_tpot() {
    let mut s = builtin("steady_state").unwrap();
    s.workload.arrivals = abe::sim::arrivals::Arrivals::Constant { rate_rps: 0.5 };
    s.workload.prompt_tokens = LengthDist::Fixed { value: 100.0 };
    s.workload.output_tokens = LengthDist::Fixed { value: 10.0 };
    let r = simulate_scenario(&s, &continuous("", 50)).unwrap();
    let run = &r.runs[0];
    assert_eq!(run.strategy, "continuous");
    assert_eq!((run.completed, run.failed, run.unfinished), (50, 0, 0));
    let c = run.continuous.as_ref().unwrap();
    assert!((c.ttft_ms.mean - 2.0).abs() < 1e-6, "{:?}", c.ttft_ms);
    assert!((c.tpot_ms.mean - 5.74).abs() < 1e-6, "{:?}", c.tpot_ms);
    assert!((c.itl_ms.mean - 5.74).abs() < 1e-6, "{:?}", c.itl_ms);
    assert!((run.latency_ms.mean - (2.0 + 9.0 * 5.74)).abs() < 1e-6);
    assert_eq!(c.steps, 50 * 10);
    assert_eq!((c.prefill_tokens, c.decode_tokens), (50 * 100, 50 * 9));
    assert_eq!(c.goodput_fraction, 1.0);
    assert_eq!(c.preemptions, 0);
}

#[test]
fn same_seed_same_bytes_and_both_modes_see_the_identical_requests() {
    let mut o = continuous("medium_load", 3_000);
    o.engine.mode = None;
    o.strategies = vec!["auto".into(), "fixed".into()];
    o.sweep = vec!["mode=request,continuous".into()];
    o.latency_model = Some("roofline".into());
    o.jobs = 1;
    let a = simulate(&o).unwrap();
    o.jobs = 2;
    let b = simulate(&o).unwrap();
    assert_eq!(a.to_json(), b.to_json());
    let labels: Vec<&str> = a.runs.iter().map(|r| r.label.as_str()).collect();
    assert_eq!(
        labels,
        [
            "auto mode=request",
            "fixed mode=request",
            "continuous mode=continuous"
        ]
    );
    assert!(a.runs.iter().all(|r| r.request_digest == a.request_digest));
    assert!(a.runs[..2].iter().all(|r| r.continuous.is_none()));
    assert!(a.to_json().contains("\"ttft_ms\""));
    o.seed = 8;
    assert_ne!(simulate(&o).unwrap().to_json(), a.to_json());
}

/// Under overload (one replica of 4 slots, far more arrivals than it serves) the scheduler
/// fills slots highest priority first: critical requests wait less than normal ones.
#[test]
fn priorities_are_honoured_for_slots() {
    let mut o = continuous("mixed_priority", 4_000);
    o.engine.workers = Some(1);
    o.engine.max_slots = Some(4);
    o.engine.queue_capacity = Some(100_000);
    o.engine.request_timeout_ms = Some(1e9);
    let r = simulate(&o).unwrap();
    let run = &r.runs[0];
    assert_eq!(run.completed, 4_000, "nothing lost");
    let by = &run.latency_ms_by_priority;
    let (critical, normal) = (&by[0], &by[2]);
    assert_eq!(
        (critical.priority.as_str(), normal.priority.as_str()),
        ("critical", "normal")
    );
    assert!(
        critical.p50 * 5.0 < normal.p50,
        "critical {critical:?} normal {normal:?}"
    );
}

/// A KV cache too small for the slots' growth preempts the youngest sequence; it is
/// prefilled again later, and every request still completes once.
#[test]
fn kv_pressure_preempts_and_loses_nothing() {
    let mut s = builtin("steady_state").unwrap();
    s.workload.prompt_tokens = LengthDist::Fixed { value: 50.0 };
    s.workload.output_tokens = LengthDist::Fixed { value: 200.0 };
    let mut o = continuous("", 2_000);
    o.engine.workers = Some(1);
    o.engine.kv_capacity_tokens = Some(1_000);
    o.engine.queue_capacity = Some(100_000);
    o.engine.request_timeout_ms = Some(1e9);
    let r = simulate_scenario(&s, &o).unwrap();
    let run = &r.runs[0];
    assert_eq!((run.completed, run.failed, run.unfinished), (2_000, 0, 0));
    let c = run.continuous.as_ref().unwrap();
    assert!(c.kv_peak_tokens <= 1_000, "{c:?}");
    assert!(c.kv_utilisation_mean > 0.5, "{c:?}");
    // Admission counts the KV in use, not what running sequences will grow to (as vLLM):
    // slots fill, the cache runs out as they decode, and the youngest are preempted.
    assert!(c.preemptions > 0, "{c:?}");
    // Preempted requests are prefilled again: more prefill than prompts.
    assert!(c.prefill_tokens > 2_000 * 50, "{c:?}");
}

/// Continuous batching decodes every active sequence in each step; request-level batches
/// hold a finished request until its batch ends. On the roofline model (decode is nearly
/// free to batch), continuous mode's median TTFT under load is far below request-level's.
#[test]
fn continuous_beats_request_level_on_ttft_under_load_on_the_roofline() {
    let mut o = continuous("heavy_load", 4_000);
    o.engine.mode = None;
    o.engine.workers = Some(1);
    o.strategies = vec!["fixed".into()];
    o.sweep = vec!["mode=request,continuous".into(), "rate_scale=4".into()];
    o.latency_model = Some("roofline".into());
    let r: SimReport = simulate(&o).unwrap();
    let (req, cont) = (&r.runs[0], &r.runs[1]);
    assert_eq!(req.completed + req.failed, cont.completed + cont.failed);
    let c = cont.continuous.as_ref().unwrap();
    assert!(
        c.ttft_ms.p50 * 2.0 < req.latency_ms.p50,
        "continuous TTFT {:?} vs request-level latency {:?}",
        c.ttft_ms,
        req.latency_ms
    );
    assert!(cont.latency_ms.p50 < req.latency_ms.p50);
}

#[test]
fn outputs_carry_the_token_metrics_and_closed_loops_are_refused() {
    let mut o = continuous("light_load", 500);
    o.latency_model = Some("roofline".into());
    o.latency_params = vec!["gpu=l40s".into(), "llm=qwen2.5-7b".into()];
    let r = simulate(&o).unwrap();
    let table = r.table();
    assert!(
        table.contains("ttft p50") && table.contains("goodput %"),
        "{table}"
    );
    assert!(r.to_json().contains("\"gpu\": \"l40s\""));
    let dir = scratch_dir("outputs");
    let paths = OutputPaths {
        json: Some(dir.join("r.json")),
        csv: Some(dir.join("r.csv")),
        svg_dir: Some(dir.join("svg")),
    };
    let written = output::write_outputs(&r, &paths).unwrap();
    let csv = std::fs::read_to_string(dir.join("r.continuous.csv")).unwrap();
    assert!(csv.starts_with("run,label,ttft_mean_ms,"), "{csv}");
    assert_eq!(csv.lines().count(), 2);
    assert!(written.iter().any(|p| p.ends_with("token_latency.svg")));
    let svg = std::fs::read_to_string(dir.join("svg/token_latency.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    let _ = std::fs::remove_dir_all(&dir);

    let e = simulate(&continuous("closed_loop", 100))
        .unwrap_err()
        .to_string();
    assert!(e.contains("open-loop"), "{e}");
    let mut s: Scenario = builtin("light_load").unwrap();
    s.engine.max_slots = Some(0);
    let e = simulate_scenario(&s, &continuous("", 10))
        .unwrap_err()
        .to_string();
    assert!(e.contains("engine.max_slots"), "{e}");
}
