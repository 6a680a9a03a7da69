//! The engine's routing, through the in-process runtime API (no HTTP): circuits that
//! recover are routable at once, a full backend queue spills to another backend of the
//! model, retries during a drain, requests queued behind a circuit that opens move or fail
//! at once, and outcome counters that count each request once.

use abe::core::{Kind, Priority};
use abe::exec::latency::LatencyModel;
use abe::exec::sim::FaultSettings;
use abe::exec::{ExecError, Work};
use abe::router::{BackendConfig, Router, RoutingConfig};
use abe::runtime::engine::Routing;
use abe::runtime::{self, Request, RequestError, RuntimeConfig};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

fn completion(prompt: &str) -> Request {
    Request {
        priority: Priority::Normal,
        work: Work {
            kind: Kind::Completion,
            prompt: prompt.into(),
            max_tokens: 4,
            ..Default::default()
        },
        ..Default::default()
    }
}

/// One sim worker, zero latency, unpinned.
fn one_worker_config() -> RuntimeConfig {
    let mut cfg = RuntimeConfig::default();
    cfg.core.workers = 1;
    cfg.sim.latency = LatencyModel::None;
    cfg.pin = false;
    cfg
}

/// One backend, one worker. Its circuit opens; after recovery_ns, with the engine parked,
/// the next request is routed there (the circuit is due a probe), not refused with 503.
#[test]
fn first_request_after_circuit_recovery_is_not_refused() {
    let mut cfg = one_worker_config();
    cfg.core.circuit.recovery_ns = 250_000_000;
    let handle = runtime::start(cfg).unwrap();
    handle.set_faults(
        0,
        FaultSettings {
            error_rate: 1.0,
            ..Default::default()
        },
    );
    for i in 0..5 {
        let r = handle.submit(completion(&format!("f{i}"))).wait();
        assert!(matches!(r, Err(RequestError::Backend(_))), "{r:?}");
    }
    handle.set_faults(0, FaultSettings::default());
    // Due a probe 250 ms after the 5th failure; the parked engine last synced the
    // router's copy of the circuit at about +200 ms (MAX_PARK = 100 ms wakes).
    std::thread::sleep(Duration::from_millis(265));
    let r = handle.submit(completion("after recovery")).wait();
    assert!(r.is_ok(), "first request after recovery: {r:?}");
}

/// Two backends serve model m; priority_only prefers `a`. When a's queue is full, new
/// requests go to `b` (same model) instead of a 429.
#[test]
fn a_full_backend_queue_spills_to_another_backend_of_the_model() {
    let slow = FaultSettings {
        added_latency_ms: 300.0,
        ..Default::default()
    };
    let handle = two_lanes_with(slow, |cfg| {
        cfg.core.queue_capacity = 4;
        cfg.core.max_batch_size = 1;
        cfg.core.max_inflight_per_worker = 1;
    });
    let pending: Vec<_> = (0..8)
        .map(|i| handle.submit(completion(&format!("r{i}"))))
        .collect();
    let mut full = 0;
    for p in pending {
        match p
            .wait_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("no answer"))
        {
            Ok(_) => {}
            Err(RequestError::Rejected(_)) => full += 1,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(full, 0, "{full} requests refused with b idle");
    let snap = wait_for(&handle, |s| s.stats.completed == 8);
    assert!(snap.backends[1].routed >= 3, "{:?}", snap.backends);
}

fn two_lanes(a_faults: FaultSettings) -> runtime::Handle {
    two_lanes_with(a_faults, |_| {})
}

/// Backends `a` (priority 0, faults `a_faults`) and `b` (priority 5), one sim worker each,
/// both serving model m, routed `priority_only`; `tweak` adjusts the runtime config.
fn two_lanes_with(
    a_faults: FaultSettings,
    tweak: impl FnOnce(&mut RuntimeConfig),
) -> runtime::Handle {
    let mut a = BackendConfig::default_sim("m", 100_000);
    a.name = "a".into();
    a.max_concurrent_batches = 1;
    let mut b = a.clone();
    b.name = "b".into();
    b.priority = 5;
    let routing_cfg = RoutingConfig {
        strategy: "priority_only".into(),
        ..Default::default()
    };
    let (router, _) = Router::build(&[a, b], &routing_cfg, 1).unwrap();
    let name = router.lookup("m").unwrap();
    let routing = Routing::new(router, name, None);
    let mut cfg = one_worker_config();
    tweak(&mut cfg);
    let stop = Arc::new(AtomicBool::new(false));
    let lanes = vec![
        runtime::sim_lane(&cfg, &cfg.sim.latency, 1, 0, &stop),
        runtime::sim_lane(&cfg, &cfg.sim.latency, 1, 1 << 32, &stop),
    ];
    lanes[0].faults[0].set(a_faults);
    runtime::start_routed(cfg, routing, lanes, stop).unwrap()
}

/// Polls the published snapshot until `ok` holds (bounded).
fn wait_for(
    handle: &runtime::Handle,
    ok: impl Fn(&runtime::Snapshot) -> bool,
) -> runtime::Snapshot {
    for _ in 0..1000 {
        let s = handle.snapshot();
        if ok(&s) {
            return s;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("snapshot never got there: {:?}", handle.snapshot().stats);
}

/// Requests failed by `a`, retried and served by `b`: counted once each, as completed.
#[test]
fn a_retried_request_is_counted_once() {
    let handle = two_lanes(FaultSettings {
        error_rate: 1.0,
        ..Default::default()
    });
    for i in 0..3 {
        let r = handle.submit(completion(&format!("x{i}"))).wait();
        assert!(r.is_ok(), "{r:?}");
    }
    let s = wait_for(&handle, |s| {
        s.backends[1].routed == 3 && s.stats.completed == 3
    });
    assert_eq!(
        (
            s.stats.admitted,
            s.stats.completed,
            s.stats.failed,
            s.stats.worker_errors
        ),
        (3, 3, 0, 0)
    );
    assert_eq!(s.backends[0].retried_away, 3);
}

/// During a graceful drain (deadline far away), a request whose backend fails it is still
/// moved to the healthy backend.
#[test]
fn a_request_failed_during_drain_is_still_retried() {
    let handle = two_lanes(FaultSettings {
        error_rate: 1.0,
        added_latency_ms: 300.0,
        ..Default::default()
    });
    let p = handle.submit(completion("x"));
    std::thread::sleep(Duration::from_millis(50));
    let waiter = std::thread::spawn(move || p.wait());
    let report = handle.shutdown(Duration::from_secs(10));
    let r = waiter.join().unwrap();
    assert!(r.is_ok(), "{r:?}");
    assert!(report.clean, "{report:?}");
}

/// Backend `a` fails every batch, slowly, with requests queued behind them: once its
/// circuit opens, the requests still queued there move to `b` at once instead of waiting
/// the whole open time (60 s here) for a probe batch.
#[test]
fn requests_queued_behind_an_opening_circuit_move_to_another_backend() {
    let handle = two_lanes_with(
        FaultSettings {
            error_rate: 1.0,
            added_latency_ms: 100.0,
            ..Default::default()
        },
        |cfg| {
            cfg.core.max_batch_size = 1;
            cfg.core.max_inflight_per_worker = 1;
            cfg.core.circuit.recovery_ns = 60_000_000_000;
        },
    );
    let pending: Vec<_> = (0..12)
        .map(|i| handle.submit(completion(&format!("q{i}"))))
        .collect();
    for (i, p) in pending.into_iter().enumerate() {
        let r = p
            .wait_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("request {i} still waiting after 20 s"));
        assert!(r.is_ok(), "request {i}: {r:?}");
    }
    let s = wait_for(&handle, |s| s.stats.completed == 12);
    assert_eq!(
        (s.stats.admitted, s.stats.failed, s.stats.worker_errors),
        (12, 0, 0),
        "each request counted once, by its final answer"
    );
    assert_eq!(s.backends[0].retried_away, 12, "{:?}", s.backends);
    assert_eq!(s.backends[1].routed, 12, "{:?}", s.backends);
}

/// The only backend fails every batch with requests queued behind them: once its circuit
/// opens, the queued ones are answered at once with a 503 saying why (no healthy backend,
/// as a new request would be told), not after the 60 s open time; the counters count them
/// as admitted and failed.
#[test]
fn requests_queued_behind_an_open_circuit_with_no_other_backend_fail_fast() {
    let mut cfg = one_worker_config();
    cfg.core.max_batch_size = 1;
    cfg.core.max_inflight_per_worker = 1;
    cfg.core.circuit.recovery_ns = 60_000_000_000;
    let handle = runtime::start(cfg).unwrap();
    handle.set_faults(
        0,
        FaultSettings {
            error_rate: 1.0,
            added_latency_ms: 100.0,
            ..Default::default()
        },
    );
    let pending: Vec<_> = (0..10)
        .map(|i| handle.submit(completion(&format!("q{i}"))))
        .collect();
    let (mut backend, mut unroutable) = (0, 0);
    for (i, p) in pending.into_iter().enumerate() {
        match p
            .wait_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("request {i} still waiting after 20 s"))
        {
            Err(RequestError::Backend(e @ ExecError::Unavailable { .. })) => {
                assert_eq!(e.http_status(), 503, "{e}");
                assert!(e.to_string().contains("No healthy backend"), "{e}");
                unroutable += 1
            }
            Err(RequestError::Backend(_)) => backend += 1,
            other => panic!("request {i}: {other:?}"),
        }
    }
    assert_eq!((backend, unroutable), (5, 5), "5 failures open the circuit");
    let s = wait_for(&handle, |s| s.stats.failed == 10);
    assert_eq!(
        (s.stats.admitted, s.stats.completed, s.stats.worker_errors),
        (10, 0, 10)
    );
}

/// Backend `a`'s only batch hangs past the batch timeout, which opens its circuit (a
/// threshold of one failure) inside the core's poll, not at a completion: the requests
/// queued behind it still move to `b` at once, long before the hung batch comes back (5 s).
#[test]
fn requests_queued_behind_a_circuit_opened_by_a_batch_timeout_move_at_once() {
    let handle = two_lanes_with(
        FaultSettings {
            hang_rate: 1.0,
            hang_ms: 5_000.0,
            ..Default::default()
        },
        |cfg| {
            cfg.core.max_batch_size = 1;
            cfg.core.max_inflight_per_worker = 1;
            cfg.core.batch_timeout_ns = 100_000_000;
            cfg.core.circuit.failure_threshold = 1;
            cfg.core.circuit.recovery_ns = 60_000_000_000;
        },
    );
    let pending: Vec<_> = (0..6)
        .map(|i| handle.submit(completion(&format!("t{i}"))))
        .collect();
    let mut served = 0;
    for (i, p) in pending.into_iter().enumerate() {
        match p
            .wait_timeout(Duration::from_secs(3))
            .unwrap_or_else(|_| panic!("request {i} still waiting after 3 s"))
        {
            Ok(_) => served += 1,
            Err(RequestError::Failed(abe::core::FailReason::BatchTimeout)) => {}
            Err(e) => panic!("request {i}: {e}"),
        }
    }
    assert_eq!(
        served, 5,
        "the five queued behind the hung batch, served by b"
    );
}
