//! `abe loadgen` end to end against a real abe started in process on a loopback port: every
//! request answered, counts that add up, the simulator's exact request sequence, latency
//! measured from the schedule (no coordinated omission), strategy switching, errors by
//! status, and the CLI's JSON.
//!
//! Every test is bounded: schedules of a few hundred requests lasting at most ~1.5 s, a
//! per-request timeout, and servers shut down at the end. Timing assertions are one-sided
//! and far from their thresholds (a slow machine makes latencies larger, never smaller).

use crate::common;

use abe::config::Config;
use abe::loadgen::{self, LoadgenError, LoadgenOptions, Progress};
use abe::sim::scenario::builtin;
use abe::sim::workload::Digest;
use abe::sim::{simulate, SimulateOptions};
use common::{start, test_config};
use std::net::TcpListener;
use std::process::Command;
use std::time::{Duration, Instant};

fn opts(url: String, requests: u64, rate_scale: f64) -> LoadgenOptions {
    LoadgenOptions {
        url,
        scenario: "steady_state".into(),
        seed: 7,
        requests: Some(requests),
        connections: 16,
        rate_scale,
        timeout_ms: 10_000.0,
        ..LoadgenOptions::default()
    }
}

fn url(running: &abe::serve::Running) -> String {
    format!("http://{}", running.local_addr())
}

fn quiet(_: &Progress) {}

#[test]
fn every_request_is_answered_and_the_sequence_is_the_simulators() {
    let server = start(test_config());
    let mut progress = Vec::new();
    // steady_state is 100 requests/s; x2 gives 300 requests at 200 requests/s, 1.5 s.
    let report = loadgen::run(&opts(url(&server), 300, 2.0), &mut |p| progress.push(*p))
        .expect("the run completes");
    server.shutdown();

    let run = report.run();
    assert_eq!(report.requests, 300);
    assert_eq!(run.requests_offered, 300);
    assert_eq!(report.live.sent, 300);
    assert_eq!(
        run.completed, 300,
        "errors: {:?}",
        report.live.errors_by_status
    );
    assert_eq!(
        (run.failed, run.rejected_queue_full, run.unfinished),
        (0, 0, 0)
    );
    assert!(report.live.errors_by_status.is_empty());
    assert!((report.live.offered_rps - 200.0).abs() < 1e-6);
    // The server keeps up, so throughput is about the offered load: completed over first
    // scheduled send to last answer, 300 / (1.495 s + the last request's latency). The
    // lower bound leaves a slow machine 0.5 s for that last answer.
    let most = 300.0 / 1.495;
    assert!(
        run.throughput_rps <= most + 1e-9 && run.throughput_rps > 150.0,
        "{}",
        run.throughput_rps
    );

    // The request sequence is the simulator's for the same scenario, seed, count and rate
    // scale.
    let scenario = builtin("steady_state").unwrap();
    let generated = abe::sim::workload::Workload {
        arrivals: scenario.workload.arrivals.scaled(2.0).unwrap(),
        ..scenario.workload.clone()
    }
    .generate(300, 7)
    .unwrap();
    assert_eq!(report.request_digest, Digest::of(&generated).hex());
    let sim = simulate(&SimulateOptions {
        scenario: "steady_state".into(),
        strategies: vec!["queue_depth".into()],
        seed: 7,
        requests: Some(300),
        rate_scale: Some(2.0),
        ..SimulateOptions::default()
    })
    .unwrap();
    assert_eq!(report.request_digest, sim.request_digest);
    assert_eq!(run.request_digest, sim.runs[0].request_digest);

    // Prompts reach the server at 4 bytes a token: its usage counts equal the workload's.
    let workload_tokens: u64 = generated
        .iter()
        .map(|r| u64::from(r.prompt_tokens.max(1) + r.output_tokens.max(1)))
        .sum();
    let reported = run.total_tokens_per_s * run.makespan_s;
    assert!(
        (reported - workload_tokens as f64).abs() < 1e-6 * workload_tokens as f64,
        "server counted {reported} tokens, workload has {workload_tokens}"
    );

    // Progress: at least the 1 s tick and the final one, ending with everything in.
    assert!(progress.len() >= 2, "{progress:?}");
    let last = progress.last().unwrap();
    assert_eq!((last.sent, last.completed, last.errors), (300, 300, 0));
}

#[test]
fn latency_counts_from_the_schedule_not_from_the_send() {
    // Every batch takes 50 ms more; with one connection, request i cannot leave before
    // request i - 1 is answered, so it is sent late and its wait is part of its latency.
    let mut c = test_config();
    c.workers.fault_added_latency_ms = 50.0;
    let server = start(c);
    let mut o = opts(url(&server), 20, 1.0); // 20 requests, 10 ms apart
    o.connections = 1;
    let one = loadgen::run(&o, &mut quiet).unwrap();
    // The same schedule with enough connections: no request waits for a connection.
    o.connections = 32;
    let many = loadgen::run(&o, &mut quiet).unwrap();
    server.shutdown();

    let l = &one.run().latency_ms;
    assert_eq!(one.run().completed, 20);
    assert!(l.p50 >= 50.0, "p50 {} ms", l.p50);
    // Request i is answered no sooner than (i + 1) x 50 ms but was due at i x 10 ms: the
    // last one's latency is at least 50 + 19 x 40 = 810 ms. A closed-loop measurement from
    // the actual send would report about 50 ms for every request.
    assert!(l.max >= 800.0, "max {} ms", l.max);
    assert!(one.live.late_sends >= 15, "late {}", one.live.late_sends);

    let l = &many.run().latency_ms;
    assert_eq!(many.run().completed, 20);
    assert!(l.p50 >= 50.0, "p50 {} ms", l.p50);
    assert!(l.max < 800.0, "max {} ms", l.max);
}

#[test]
fn strategy_is_switched_first_and_refusals_stop_the_run() {
    let mut c: Config = test_config();
    c.server.admin_token = "s3cret".into();
    let server = start(c);
    let mut o = opts(url(&server), 20, 10.0);

    o.strategy = Some("fixed".into());
    let e = loadgen::run(&o, &mut quiet).unwrap_err();
    assert!(matches!(e, LoadgenError::Admin { .. }), "{e}");
    assert!(e.to_string().contains("401"), "{e}");

    o.admin_token = Some("s3cret".into());
    o.strategy = Some("no_such_strategy".into());
    let e = loadgen::run(&o, &mut quiet).unwrap_err();
    assert!(e.to_string().contains("400"), "{e}");

    o.strategy = Some("fixed".into());
    let report = loadgen::run(&o, &mut quiet).unwrap();
    // The engine applies the switch on its loop and publishes snapshots every ~50 ms.
    let deadline = Instant::now() + Duration::from_secs(2);
    while server.handle.snapshot().strategy.as_str() != "fixed" && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(server.handle.snapshot().strategy.as_str(), "fixed");
    assert_eq!(report.strategies, ["fixed"]);
    assert_eq!(report.run().label, "live fixed");

    // Without --strategy the label is what the target reports.
    o.strategy = None;
    let report = loadgen::run(&o, &mut quiet).unwrap();
    assert_eq!(report.strategies, ["fixed"]);
    server.shutdown();
}

#[test]
fn failures_are_counted_by_status_and_add_up() {
    let mut c = test_config();
    c.workers.fault_error_rate = 1.0;
    // Keep the circuits closed, so every batch fails fast (500) instead of waiting for a
    // healthy worker until the queue timeout.
    c.health.failure_threshold = 1_000_000;
    let server = start(c);
    let report = loadgen::run(&opts(url(&server), 50, 10.0), &mut quiet).unwrap();
    server.shutdown();
    let run = report.run();
    let errors: u64 = report.live.errors_by_status.values().sum();
    assert_eq!(run.completed, 0);
    assert_eq!(errors, 50, "{:?}", report.live.errors_by_status);
    assert_eq!(run.failed + run.rejected_queue_full, 50);
    assert_eq!(run.admitted, run.completed + run.failed + run.unfinished);
    assert_eq!(run.sla_attainment, 0.0);
    assert!(report.table().contains("errors: "));
}

#[test]
fn an_unanswered_request_times_out_and_the_run_still_ends() {
    let mut c = test_config();
    c.workers.fault_hang_rate = 1.0;
    c.workers.fault_hang_ms = 1_500.0;
    c.server.shutdown_timeout = abe::config::Millis(100);
    let server = start(c);
    let mut o = opts(url(&server), 10, 10.0);
    o.timeout_ms = 300.0;
    let report = loadgen::run(&o, &mut quiet).unwrap();
    server.shutdown();
    assert_eq!(report.live.errors_by_status.get("timeout"), Some(&10));
    assert_eq!(report.run().failed, 10);
}

#[test]
fn a_target_that_is_not_listening_is_a_clear_error() {
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let e = loadgen::run(
        &opts(format!("http://127.0.0.1:{port}"), 10, 1.0),
        &mut quiet,
    )
    .unwrap_err();
    assert!(matches!(e, LoadgenError::Connect { .. }), "{e}");
    assert!(e.to_string().contains("is the server running"), "{e}");
}

#[test]
fn the_cli_prints_the_table_and_writes_the_json() {
    let server = start(test_config());
    let dir = std::env::temp_dir().join(format!("abe-loadgen-test-{}", std::process::id()));
    let json = dir.join("live.json");
    let out = Command::new(env!("CARGO_BIN_EXE_abe"))
        .args([
            "loadgen",
            "--url",
            &url(&server),
            "--scenario",
            "mixed_priority",
        ])
        .args(["--seed", "3", "--requests", "100", "--rate-scale", "5"])
        .args(["--connections", "8", "--quiet", "--json"])
        .arg(&json)
        .output()
        .expect("abe runs");
    server.shutdown();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stderr.is_empty(), "--quiet prints no progress");
    assert!(stdout.contains("scenario mixed_priority"), "{stdout}");
    assert!(stdout.contains("p99.9 ms"), "{stdout}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(v["requests"], 100);
    assert_eq!(v["runs"][0]["completed"], 100);
    for key in [
        "throughput_rps",
        "output_tokens_per_s",
        "total_tokens_per_s",
        "sla_attainment",
    ] {
        assert!(v["runs"][0][key].is_number(), "{key} missing");
    }
    for p in ["p50", "p90", "p99", "p99_9"] {
        assert!(v["runs"][0]["latency_ms"][p].is_number(), "{p} missing");
    }
    assert!(v["live"]["errors_by_status"].is_object());
}

#[test]
fn a_closed_loop_keeps_one_request_in_flight_per_client() {
    // Every batch takes at least 20 ms; 2 clients sending 20 requests one after another
    // each have at most one in flight, so the run takes >= 10 x 20 ms and throughput is at
    // most 2 / 20 ms = 100 requests/s, however many workers the server has.
    let mut c = test_config();
    c.workers.fault_added_latency_ms = 20.0;
    let server = start(c);
    let mut o = opts(url(&server), 20, 1.0);
    o.clients = Some(2);
    let report = loadgen::run(&o, &mut quiet).expect("the run completes");
    server.shutdown();
    let run = report.run();
    assert_eq!(
        (report.requests, report.live.sent, run.completed),
        (20, 20, 20)
    );
    assert_eq!((run.failed, run.unfinished), (0, 0));
    assert_eq!(report.connections, 2);
    let closed = report.closed_loop.expect("a closed loop");
    assert_eq!((closed.clients, closed.think_ms), (2, 0.0));
    assert!(run.throughput_rps <= 100.0 + 1e-9, "{}", run.throughput_rps);
    assert!(run.makespan_s >= 0.2, "{}", run.makespan_s);
    // Latency counts from the actual send: each answer took one batch, >= 20 ms, and no
    // request is ever late (there is no schedule to be late against).
    assert!(run.latency_ms.p50 >= 20.0, "{:?}", run.latency_ms);
    assert_eq!(report.live.late_sends, 0);
    // The shapes are the scenario's sequence, in order.
    let generated = builtin("steady_state")
        .unwrap()
        .workload
        .generate(20, 7)
        .unwrap();
    assert_eq!(report.request_digest, Digest::of(&generated).hex());
}

#[test]
fn a_closed_loop_for_a_duration_stops_sending_and_answers_what_it_sent() {
    let mut c = test_config();
    c.workers.fault_added_latency_ms = 5.0;
    let server = start(c);
    let dir = std::env::temp_dir().join(format!("abe-loadgen-closed-{}", std::process::id()));
    let json = dir.join("closed.json");
    let began = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_abe"))
        .args(["loadgen", "--url", &url(&server), "--requests", "100000"])
        .args(["--clients", "4", "--think-ms", "1", "--duration", "0.4"])
        .args(["--timeout-ms", "10000", "--quiet", "--json"])
        .arg(&json)
        .output()
        .expect("abe runs");
    let took = began.elapsed();
    server.shutdown();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("closed loop: 4 clients, think 1 ms"),
        "{stdout}"
    );
    // Bounded by the duration, not by the 100,000 requests it may take shapes from.
    assert!(took < Duration::from_secs(10), "{took:?}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let sent = v["live"]["sent"].as_u64().unwrap();
    assert!(sent > 0 && sent < 100_000, "{sent}");
    assert_eq!(v["requests"].as_u64(), Some(sent));
    assert_eq!(v["runs"][0]["completed"].as_u64(), Some(sent));
    assert_eq!(v["closed_loop"]["clients"], 4);
    // 4 clients, each request >= 5 ms plus 1 ms of thought: at most 4 / 6 ms.
    let rps = v["runs"][0]["throughput_rps"].as_f64().unwrap();
    assert!(rps <= 4.0 / 0.006 + 1e-6, "{rps}");
}

/// `--trace` replays a Mooncake slice: prompts built from its hash_ids (up to ~160 KB each)
/// are all answered, and the sequence is the simulator's for the same trace and count.
#[test]
fn a_trace_is_replayed_with_prompts_from_its_hash_ids() {
    let trace = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/mooncake_fast25_synthetic_200.jsonl");
    let server = start(test_config());
    // The first 40 rows span ~12 s of trace time; x40: ~0.3 s.
    let o = LoadgenOptions {
        scenario: String::new(),
        trace: Some(trace.clone()),
        ..opts(url(&server), 40, 40.0)
    };
    let report = loadgen::run(&o, &mut quiet).expect("the run completes");
    server.shutdown();
    let run = report.run();
    assert_eq!(
        run.completed, 40,
        "errors: {:?}",
        report.live.errors_by_status
    );
    let sim = simulate(&SimulateOptions {
        scenario: String::new(),
        trace: Some(trace),
        strategies: vec!["fixed".into()],
        requests: Some(40),
        rate_scale: Some(40.0),
        ..SimulateOptions::default()
    })
    .unwrap();
    assert_eq!(report.request_digest, sim.request_digest);
}
