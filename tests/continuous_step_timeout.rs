//! Continuous batching's step timeout, live: a step that hangs past `workers.batch_timeout`
//! fails its requests with a clear error and counts against its replica's circuit breaker;
//! while the circuit is open the backend refuses new requests saying why; once the hang
//! ends and the circuit lets a probe through, the replica serves again; requests waiting
//! when the circuit opens are answered at once.
//! Bounded waits only; nothing here asserts a duration.

use abe::core::circuit::CircuitState;
use abe::core::{FailReason, Kind, Priority};
use abe::exec::latency::LatencyModel;
use abe::exec::sim::FaultSettings;
use abe::exec::{ExecError, Work};
use abe::runtime::{self, Request, RequestError, RuntimeConfig};
use std::time::{Duration, Instant};

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

#[test]
fn a_hung_step_fails_its_requests_opens_the_circuit_and_the_replica_recovers() {
    let mut cfg = RuntimeConfig::default();
    cfg.core.workers = 1;
    cfg.sim.latency = LatencyModel::None;
    cfg.pin = false;
    cfg.core.batch_timeout_ns = 100_000_000; // 100 ms
    cfg.core.request_timeout_ns = 60_000_000_000;
    cfg.core.circuit.failure_threshold = 1;
    cfg.core.circuit.recovery_ns = 200_000_000; // 200 ms
    cfg.continuous = Some(abe::core::continuous::ContinuousConfig {
        max_slots: 4,
        ..Default::default()
    });
    let handle = runtime::start(cfg).unwrap();
    // Every step hangs 400 ms: longer than the step timeout, short enough to end.
    handle.set_faults(
        0,
        FaultSettings {
            hang_rate: 1.0,
            hang_ms: 400.0,
            ..Default::default()
        },
    );
    let hung = handle.submit(completion("hung"));
    let outcome = hung
        .wait_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("the hung request got no answer"));
    let err = outcome.unwrap_err();
    assert_eq!(err, RequestError::Failed(FailReason::BatchTimeout));
    assert!(err.to_string().contains("batch timeout"), "{err}");
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        // Open, or already half-open: snapshots are published at most every 50 ms, on the
        // engine's turns, and on a loaded machine the 200 ms of Open can pass unseen
        // (half-open follows only an open circuit).
        let w = handle.snapshot().workers[0];
        if w.batches_failed == 1 && w.circuit != CircuitState::Closed {
            break;
        }
        assert!(Instant::now() < until, "circuit never opened: {w:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
    // The hang ends and faults are cleared. While the only replica's circuit is open the
    // backend is open to the router too: a request is refused at once, saying why, rather
    // than waiting for a slot. After the recovery time a probe step runs and the replica
    // answers again.
    handle.set_faults(0, FaultSettings::default());
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let out = handle
            .submit(completion("next"))
            .wait_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("no answer"));
        match out {
            Ok(_) => break,
            Err(RequestError::Route(e)) => {
                let why = e.to_string();
                assert!(why.contains("circuit"), "{why}");
            }
            Err(e) => panic!("the open circuit failed a request another way: {e:?}"),
        }
        assert!(Instant::now() < until, "the replica never recovered");
        std::thread::sleep(Duration::from_millis(20));
    }
    let w = handle.snapshot().workers[0];
    assert_eq!(w.batches_failed, 1, "{w:?}");
    let report = handle.shutdown(Duration::from_secs(5));
    assert!(report.clean, "{report:?}");
}

/// The only replica's circuit opens (a failed step) while requests wait for its one slot:
/// they are answered at once with a 503 saying why, not after the 60 s open time (nor the
/// 60 s request deadline), and counted as admitted and failed.
#[test]
fn requests_waiting_behind_an_open_circuit_fail_fast() {
    let mut cfg = RuntimeConfig::default();
    cfg.core.workers = 1;
    cfg.sim.latency = LatencyModel::None;
    cfg.pin = false;
    cfg.core.request_timeout_ns = 60_000_000_000;
    cfg.core.circuit.failure_threshold = 1;
    cfg.core.circuit.recovery_ns = 60_000_000_000;
    cfg.continuous = Some(abe::core::continuous::ContinuousConfig {
        max_slots: 1,
        ..Default::default()
    });
    let handle = runtime::start(cfg).unwrap();
    handle.set_faults(
        0,
        FaultSettings {
            error_rate: 1.0,
            added_latency_ms: 50.0,
            ..Default::default()
        },
    );
    let pending: Vec<_> = (0..4)
        .map(|i| handle.submit(completion(&format!("w{i}"))))
        .collect();
    let mut unavailable = 0;
    for (i, p) in pending.into_iter().enumerate() {
        let out = p
            .wait_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("request {i} still waiting after 20 s"));
        match out {
            Err(RequestError::Backend(e @ ExecError::Unavailable { .. })) => {
                assert_eq!(e.http_status(), 503, "{e}");
                assert!(e.to_string().contains("circuit opened"), "{e}");
                unavailable += 1;
            }
            Err(_) => {}
            Ok(_) => panic!("request {i} served with every step failing"),
        }
    }
    assert_eq!(unavailable, 3, "the three waiting behind the failed step");
    // The snapshot is published between turns: wait for it to show the answers.
    let until = Instant::now() + Duration::from_secs(30);
    let s = loop {
        let s = handle.snapshot().stats;
        if s.failed == 4 || Instant::now() > until {
            break s;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!((s.admitted, s.completed, s.failed), (4, 0, 4), "{s:?}");
}
