//! The live runtime end to end, in process: every submission gets exactly one answer under
//! concurrency, strategy switches, worker faults and shutdown.

use abe::core::circuit::CircuitState;
use abe::core::strategy::StrategyKind;
use abe::core::{FailReason, Kind, Priority};
use abe::exec::latency::LatencyModel;
use abe::exec::sim::FaultSettings;
use abe::exec::{Output, Work};
use abe::runtime::{self, Handle, Pending, Request, RequestError, RuntimeConfig};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn config(workers: usize, latency: LatencyModel) -> RuntimeConfig {
    let mut cfg = RuntimeConfig::default();
    cfg.core.workers = workers;
    cfg.sim.latency = latency;
    cfg.pin = false;
    cfg.ring_capacity = 16_384;
    cfg
}

fn completion(prompt: &str, priority: Priority) -> Request {
    Request {
        priority,
        work: Work {
            kind: Kind::Completion,
            prompt: prompt.into(),
            max_tokens: 8,
            ..Default::default()
        },
        ..Default::default()
    }
}

/// Waits for every pending request (bounded: a hang fails the test instead of blocking).
fn wait_all(pending: Vec<Pending>) -> Vec<runtime::Outcome> {
    pending
        .into_iter()
        .map(|p| {
            p.wait_timeout(Duration::from_secs(60))
                .unwrap_or_else(|_| panic!("a request got no answer within 60 s"))
        })
        .collect()
}

fn wait_for(handle: &Handle, what: &str, mut cond: impl FnMut(&runtime::Snapshot) -> bool) {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let snap = handle.snapshot();
        if cond(&snap) {
            return;
        }
        assert!(Instant::now() < until, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Makes every batch on worker 0 hang for a minute.
fn hang_worker_0(handle: &Handle) {
    handle.set_faults(
        0,
        FaultSettings {
            hang_rate: 1.0,
            hang_ms: 60_000.0,
            ..Default::default()
        },
    );
}

/// Submits `n` normal-priority completions, prompts `r0`, `r1`, ...
fn submit_numbered(handle: &Handle, n: usize) -> Vec<Pending> {
    (0..n)
        .map(|i| handle.submit(completion(&format!("r{i}"), Priority::Normal)))
        .collect()
}

#[test]
fn ten_thousand_concurrent_submissions_each_get_exactly_one_result() {
    let handle = Arc::new(runtime::start(config(4, LatencyModel::None)).unwrap());
    let threads: Vec<_> = (0..20)
        .map(|t| {
            let handle = handle.clone();
            std::thread::spawn(move || {
                let pending: Vec<Pending> = (0..500)
                    .map(|i| {
                        let p = Priority::from_index((t + i) % 4);
                        handle.submit(completion(&format!("thread {t} request {i}"), p))
                    })
                    .collect();
                wait_all(pending)
            })
        })
        .collect();
    let mut ok = 0;
    for t in threads {
        for outcome in t.join().unwrap() {
            match outcome {
                Ok(Output::Text {
                    completion_tokens, ..
                }) => {
                    assert_eq!(completion_tokens, 8);
                    ok += 1;
                }
                other => panic!("unexpected outcome {other:?}"),
            }
        }
    }
    assert_eq!(ok, 10_000);
    let report = handle.shutdown(Duration::from_secs(10));
    assert!(report.clean);
    assert_eq!(report.completed, 10_000);
    assert_eq!(report.failed, 0);
    let snap = handle.snapshot();
    assert_eq!(snap.stats.admitted, 10_000);
    assert_eq!(snap.live_requests, 0);
}

#[test]
fn a_strategy_switch_under_load_loses_nothing() {
    let latency = LatencyModel::Linear {
        base_ms: 1.0,
        per_token_ms: 0.001,
        variance: 0.1,
    };
    let mut cfg = config(2, latency);
    cfg.core.dispatch_when_idle = false;
    cfg.core.strategy_params.max_wait_ms = 5.0;
    cfg.core.strategy_params.min_wait_ms = 1.0;
    let handle = Arc::new(runtime::start(cfg).unwrap());
    let switcher = {
        let handle = handle.clone();
        std::thread::spawn(move || {
            for i in 0..200 {
                let kind = StrategyKind::ALL[i % StrategyKind::ALL.len()];
                handle.set_strategy(kind).unwrap();
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };
    let pending: Vec<Pending> = (0..3000)
        .map(|i| handle.submit(completion(&format!("r{i}"), Priority::from_index(i % 3))))
        .collect();
    let outcomes = wait_all(pending);
    switcher.join().unwrap();
    assert!(outcomes.iter().all(|o| o.is_ok()), "every request served");
    wait_for(&handle, "stats published", |s| s.stats.completed == 3000);
    let snap = handle.snapshot();
    assert_eq!(snap.stats.failed, 0);
    assert!(snap.stats.batches_formed < 3000, "requests were batched");
}

#[test]
fn a_failing_worker_opens_its_circuit_traffic_moves_and_it_comes_back() {
    let mut cfg = config(3, LatencyModel::None);
    cfg.core.circuit.recovery_ns = 300_000_000; // 300 ms, to keep the test short
    cfg.core.balancer = abe::core::balancer::BalancerKind::RoundRobin;
    let handle = runtime::start(cfg).unwrap();
    handle.set_faults(
        0,
        FaultSettings {
            error_rate: 1.0,
            ..Default::default()
        },
    );
    // One request at a time, so round-robin spreads batches over the workers.
    let mut worker_errors = 0;
    for i in 0..60 {
        match handle
            .submit(completion(&format!("r{i}"), Priority::Normal))
            .wait()
        {
            Ok(_) => {}
            Err(RequestError::Backend(_)) => worker_errors += 1,
            Err(e) => panic!("unexpected error {e}"),
        }
    }
    assert_eq!(
        worker_errors, 5,
        "exactly the failures that opened the circuit"
    );
    wait_for(&handle, "worker 0 open", |s| {
        s.workers[0].circuit == CircuitState::Open && s.stats.completed == 55
    });
    let served_by_others: u64 = handle.snapshot().workers[1..]
        .iter()
        .map(|w| w.batches_ok)
        .sum();
    assert_eq!(served_by_others, 55);
    // Heal worker 0; after the recovery time a probe succeeds and it takes traffic again.
    handle.set_faults(0, FaultSettings::default());
    std::thread::sleep(Duration::from_millis(350));
    for i in 0..30 {
        handle
            .submit(completion(&format!("after {i}"), Priority::Normal))
            .wait()
            .expect("served after recovery");
    }
    wait_for(&handle, "worker 0 closed and serving", |s| {
        s.workers[0].circuit == CircuitState::Closed && s.workers[0].batches_ok > 0
    });
}

#[test]
fn shutdown_under_load_answers_every_request() {
    let latency = LatencyModel::Linear {
        base_ms: 2.0,
        per_token_ms: 0.01,
        variance: 0.1,
    };
    let handle = Arc::new(runtime::start(config(2, latency)).unwrap());
    let pending: Vec<Pending> = (0..2000)
        .map(|i| handle.submit(completion(&format!("r{i}"), Priority::from_index(i % 4))))
        .collect();
    let report = handle.shutdown(Duration::from_secs(30));
    assert!(report.clean, "{report:?}");
    let outcomes = wait_all(pending);
    assert_eq!(outcomes.iter().filter(|o| o.is_ok()).count(), 2000);
    // After shutdown, new work is refused with a clear error, not dropped.
    let late = handle.submit(completion("late", Priority::Normal)).wait();
    assert_eq!(late.unwrap_err(), RequestError::ShuttingDown);
}

#[test]
fn shutdown_deadline_aborts_hung_work_with_an_error_and_still_answers_everything() {
    let handle = runtime::start(config(1, LatencyModel::None)).unwrap();
    hang_worker_0(&handle);
    let pending = submit_numbered(&handle, 50);
    std::thread::sleep(Duration::from_millis(50));
    let started = Instant::now();
    let report = handle.shutdown(Duration::from_millis(200));
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "shutdown returned"
    );
    assert!(!report.clean);
    let outcomes = wait_all(pending);
    assert_eq!(outcomes.len(), 50);
    for o in outcomes {
        assert_eq!(o.unwrap_err(), RequestError::Failed(FailReason::Aborted));
    }
}

#[test]
fn a_tagged_submitter_gets_completions_back_and_its_wake_is_called() {
    let handle = runtime::start(config(2, LatencyModel::None)).unwrap();
    let wakes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let w = wakes.clone();
    let mut sub = handle
        .submitter(Some(Arc::new(move || {
            w.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        })))
        .unwrap();
    for tag in 0..100 {
        let kind = if tag % 2 == 0 {
            Kind::Completion
        } else {
            Kind::Embedding
        };
        let req = Request {
            work: Work {
                kind,
                prompt: format!("input {tag}").into(),
                max_tokens: 3,
                dimensions: 16,
                ..Default::default()
            },
            ..Default::default()
        };
        sub.submit(req, tag).unwrap();
    }
    let mut seen = [false; 100];
    let until = Instant::now() + Duration::from_secs(30);
    while seen.iter().any(|s| !s) {
        assert!(Instant::now() < until, "completions did not arrive");
        sub.drain_completions(|c| {
            assert!(!seen[c.tag as usize], "tag {} answered twice", c.tag);
            seen[c.tag as usize] = true;
            let runtime::Event::Done(outcome) = c.event else {
                return;
            };
            match outcome.unwrap() {
                Output::Embedding { vector, .. } => {
                    assert_eq!(c.tag % 2, 1);
                    assert_eq!(vector.len(), 16);
                }
                Output::Text { text, .. } => {
                    assert_eq!(c.tag % 2, 0);
                    assert_eq!(text.split(' ').count(), 3);
                }
            }
        });
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(sub.in_flight(), 0);
    assert!(wakes.load(std::sync::atomic::Ordering::Relaxed) > 0);
}

/// Submits one request through `sub` and waits for its answer.
fn round_trip(sub: &mut runtime::Submitter, tag: u64) -> runtime::Outcome {
    sub.submit(completion("a submitter's request", Priority::Normal), tag)
        .expect("submitted");
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let mut outcome = None;
        sub.drain_completions(|c| {
            assert_eq!(c.tag, tag);
            if let runtime::Event::Done(o) = c.event {
                outcome = Some(o);
            }
        });
        if let Some(o) = outcome {
            return o;
        }
        assert!(Instant::now() < until, "request {tag} got no answer");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn dropped_submitters_give_their_place_back() {
    const MAX_SUBMITTERS: usize = 3;
    let mut cfg = config(1, LatencyModel::None);
    // The handle's own submitter (behind `Handle::submit`) takes one place.
    cfg.max_submitters = MAX_SUBMITTERS;
    let handle = runtime::start(cfg).unwrap();
    let free = MAX_SUBMITTERS - 1;
    // Over time, many more submitters than places, each used and dropped.
    for round in 0..4 * MAX_SUBMITTERS as u64 {
        let mut sub = handle
            .submitter(None)
            .unwrap_or_else(|e| panic!("submitter {round} refused: {e}"));
        round_trip(&mut sub, round).expect("served");
        if round % 3 == 1 {
            // Dropped with a request still in flight: its answer goes nowhere, its place
            // comes back once the answer is sent.
            sub.submit(completion("abandoned", Priority::Low), u64::MAX)
                .expect("submitted");
        }
    }
    // The limit still holds while submitters live.
    let mut held: Vec<_> = (0..free)
        .map(|i| {
            handle
                .submitter(None)
                .unwrap_or_else(|e| panic!("{i}: {e}"))
        })
        .collect();
    assert!(
        matches!(handle.submitter(None), Err(RequestError::Busy)),
        "more submitters than max_submitters"
    );
    for (tag, sub) in held.iter_mut().enumerate() {
        round_trip(sub, tag as u64).expect("served");
    }
    held.pop();
    let mut again = handle.submitter(None).expect("a dropped submitter's place");
    round_trip(&mut again, 7).expect("served");
    handle
        .submit(completion("the handle's own", Priority::Normal))
        .wait_timeout(Duration::from_secs(30))
        .unwrap_or_else(|_| panic!("no answer"))
        .expect("served");
}

#[test]
fn a_full_queue_refuses_with_an_overload_error_and_serves_the_rest() {
    let mut cfg = config(
        1,
        LatencyModel::Linear {
            base_ms: 200.0,
            per_token_ms: 0.0,
            variance: 0.0,
        },
    );
    cfg.core.queue_capacity = 40;
    cfg.core.max_batch_size = 8;
    let handle = runtime::start(cfg).unwrap();
    let pending = submit_numbered(&handle, 100);
    let outcomes = wait_all(pending);
    let ok = outcomes.iter().filter(|o| o.is_ok()).count();
    let overload = outcomes
        .iter()
        .filter(|o| matches!(o, Err(e) if e.is_overload()))
        .count();
    assert_eq!(
        ok + overload,
        100,
        "every request is served or refused as overload"
    );
    assert!((40..100).contains(&ok), "ok {ok}");
}

fn continuous_config(replicas: usize, latency: LatencyModel) -> RuntimeConfig {
    let mut cfg = config(replicas, latency);
    cfg.continuous = Some(abe::core::continuous::ContinuousConfig {
        max_slots: 8,
        prefill_chunk: 64,
        n_batch: 256,
        max_queue: 4096,
        ..Default::default()
    });
    cfg
}

#[test]
fn continuous_mode_answers_every_request_once_with_natural_lengths() {
    let mut cfg = continuous_config(
        2,
        LatencyModel::Calibrated {
            prefill_ms_per_token: 0.001,
            beta_ms: 0.05,
            gamma: 0.316,
        },
    );
    cfg.sim.natural_length_mean_tokens = 6;
    let handle = Arc::new(runtime::start(cfg).unwrap());
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let handle = handle.clone();
            std::thread::spawn(move || {
                let pending: Vec<Pending> = (0..100)
                    .map(|i| {
                        let mut r = completion(
                            &format!("t{t} r{i} {}", "x".repeat(i * 7)),
                            Priority::Normal,
                        );
                        r.work.max_tokens = 20;
                        handle.submit(r)
                    })
                    .collect();
                wait_all(pending)
            })
        })
        .collect();
    let (mut stop, mut length) = (0, 0);
    for t in threads {
        for outcome in t.join().unwrap() {
            match outcome.expect("served") {
                Output::Text {
                    text,
                    completion_tokens,
                    finish_reason,
                    ..
                } => {
                    assert_eq!(text.split(' ').count() as u32, completion_tokens);
                    assert!((1..=20).contains(&completion_tokens));
                    match finish_reason {
                        abe::exec::FinishReason::Stop => stop += 1,
                        abe::exec::FinishReason::Length => {
                            assert_eq!(completion_tokens, 20);
                            length += 1
                        }
                        abe::exec::FinishReason::ToolCalls => panic!("sim calls no tools"),
                    }
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    }
    assert_eq!(stop + length, 800);
    assert!(
        stop > 0 && length > 0,
        "mean 6 of 20: most stop by themselves ({stop}/{length})"
    );
    let report = handle.shutdown(Duration::from_secs(10));
    assert!(report.clean, "{report:?}");
    let snap = handle.snapshot();
    let c = snap.continuous.expect("continuous state published");
    assert_eq!(c.stats.completed, 800);
    assert!(c.stats.decode_tokens > 0 && c.stats.prefill_tokens > 0);
    assert_eq!(snap.stats.completed, 800);
}

#[test]
fn continuous_mode_output_matches_request_level_output_for_the_same_request() {
    let req = || {
        let mut r = completion("same prompt, same seed", Priority::High);
        r.work.max_tokens = 12;
        r.work.sampling.seed = Some(42);
        r
    };
    let a = runtime::start(config(1, LatencyModel::None)).unwrap();
    let b = runtime::start(continuous_config(1, LatencyModel::None)).unwrap();
    let text = |o: runtime::Outcome| match o.unwrap() {
        Output::Text { text, .. } => text,
        other => panic!("{other:?}"),
    };
    assert_eq!(text(a.submit(req()).wait()), text(b.submit(req()).wait()));
}

#[test]
fn continuous_mode_shutdown_deadline_aborts_hung_steps_and_answers_everything() {
    let handle = runtime::start(continuous_config(1, LatencyModel::None)).unwrap();
    hang_worker_0(&handle);
    let pending = submit_numbered(&handle, 30);
    std::thread::sleep(Duration::from_millis(50));
    let report = handle.shutdown(Duration::from_millis(200));
    assert!(!report.clean);
    for o in wait_all(pending) {
        assert_eq!(o.unwrap_err(), RequestError::Failed(FailReason::Aborted));
    }
}

/// A cancel that arrives after its request was answered must not hit a later request whose
/// tag has the same lookup key (the low 32 bits) but a new generation.
fn stale_cancel_does_not_hit_a_new_request(continuous: bool) {
    let mut cfg = config(1, LatencyModel::None);
    if continuous {
        cfg.continuous = Some(abe::core::continuous::ContinuousConfig::default());
    }
    let handle = runtime::start(cfg).unwrap();
    let mut sub = handle.submitter(None).unwrap();
    let until = Instant::now() + Duration::from_secs(60);
    for round in 0..300u64 {
        let old = round << 32;
        let new = (round + 1) << 32; // same key (0), next generation
        sub.submit(completion("a", Priority::Normal), old).unwrap();
        while !sub.has_completions() {
            assert!(Instant::now() < until);
            std::thread::yield_now();
        }
        sub.cancel(old); // too late: already answered
        assert_eq!(sub.drain_completions(|_| {}), 1);
        sub.submit(completion("b", Priority::Normal), new).unwrap();
        let mut got = None;
        while got.is_none() {
            assert!(Instant::now() < until);
            sub.drain_completions(|c| {
                if let runtime::Event::Done(o) = c.event {
                    got = Some(o);
                }
            });
        }
        assert!(
            got.unwrap().is_ok(),
            "round {round}: the new request was cancelled"
        );
    }
}

#[test]
fn a_stale_cancel_does_not_hit_a_new_request_request_level() {
    stale_cancel_does_not_hit_a_new_request(false);
}

#[test]
fn a_stale_cancel_does_not_hit_a_new_request_continuous() {
    stale_cancel_does_not_hit_a_new_request(true);
}

#[test]
fn held_back_text_goes_out_with_the_next_token_so_streams_keep_flowing() {
    let mut cfg = config(1, LatencyModel::None);
    cfg.continuous = Some(abe::core::continuous::ContinuousConfig::default());
    let handle = runtime::start(cfg).unwrap();
    let mut sub = handle.submitter(None).unwrap();
    let mut req = completion("hold back", Priority::Normal);
    req.work.max_tokens = 40;
    req.work.stream = true;
    // "e." never occurs (words are separated by spaces) but "e" ends many words: each such
    // word is held until the next token shows it is not the start of "e.".
    req.work.sampling.stop = Some(vec!["e.".to_string()].into());
    sub.submit(req, 1).unwrap();
    let mut streamed = String::new();
    let mut events = 0;
    let mut done = None;
    let until = Instant::now() + Duration::from_secs(30);
    while done.is_none() {
        assert!(Instant::now() < until);
        sub.drain_completions(|c| match c.event {
            runtime::Event::Token { offset, text } => {
                assert_eq!(
                    offset as usize,
                    streamed.len(),
                    "pieces arrive in order, no gaps"
                );
                streamed.push_str(&text);
                events += 1;
            }
            runtime::Event::Done(o) => done = Some(o),
        });
    }
    let Output::Text { text, .. } = done.unwrap().unwrap() else {
        panic!("text expected")
    };
    assert!(text.starts_with(&streamed));
    assert!(
        events >= 20,
        "streaming kept flowing ({events} events for 40 tokens)"
    );
}

#[test]
fn continuous_mode_fails_requests_that_wait_past_the_request_deadline() {
    let mut cfg = continuous_config(1, LatencyModel::None);
    if let Some(c) = cfg.continuous.as_mut() {
        c.max_slots = 1;
    }
    cfg.core.request_timeout_ns = 200_000_000; // 200 ms
    let handle = runtime::start(cfg).unwrap();
    // The only slot's step hangs; everything behind it waits past its deadline.
    hang_worker_0(&handle);
    let first = handle.submit(completion("first", Priority::Normal));
    std::thread::sleep(Duration::from_millis(50));
    let waiting: Vec<Pending> = (0..5)
        .map(|i| handle.submit(completion(&format!("w{i}"), Priority::Normal)))
        .collect();
    for o in wait_all(waiting) {
        assert_eq!(
            o.unwrap_err(),
            RequestError::Failed(FailReason::QueueTimeout)
        );
    }
    let report = handle.shutdown(Duration::from_millis(100));
    assert!(!report.clean);
    assert_eq!(
        first.wait().unwrap_err(),
        RequestError::Failed(FailReason::Aborted)
    );
    // Six failures, one of them the abort: the earlier timeouts are not counted again.
    assert_eq!((report.failed, report.aborted), (6, 1));
}

/// A request's latency counts from when its first bytes were read (`submit_received`), not
/// from when it was submitted: reading and parsing it is time its client waits too.
#[test]
fn latency_counts_from_when_the_request_was_received() {
    let handle = runtime::start(config(1, LatencyModel::None)).unwrap();
    let mut sub = handle.submitter(None).expect("a submitter");
    // The runtime's clock starts at zero when it starts; `received` must lie after that.
    std::thread::sleep(Duration::from_millis(300));
    let received = Instant::now() - Duration::from_millis(200);
    sub.submit_received(
        completion("read a while ago", Priority::Normal),
        1,
        Some(received),
    )
    .expect("submitted");
    let until = Instant::now() + Duration::from_secs(30);
    let mut answered = false;
    while !answered {
        assert!(Instant::now() < until, "no answer");
        sub.drain_completions(|c| answered |= matches!(c.event, runtime::Event::Done(_)));
        std::thread::sleep(Duration::from_millis(1));
    }
    wait_for(&handle, "the answer's latency", |s| s.latency.len() == 1);
    // The histogram keeps 3 significant digits: 200 ms reads back as at least 199.x ms.
    let latency_ns = handle.snapshot().latency.min();
    assert!(
        latency_ns >= 199_000_000,
        "latency {latency_ns} ns does not count the 200 ms since the request was received"
    );
    // A `received` in the future (or before the clock's start) is clamped, not trusted.
    sub.submit_received(
        completion("from the future", Priority::Normal),
        2,
        Some(Instant::now() + Duration::from_secs(3600)),
    )
    .expect("submitted");
    wait_for(&handle, "the second answer", |s| s.latency.len() == 2);
    assert!(handle.snapshot().latency.max() < 3_600_000_000_000);
    handle.shutdown(Duration::from_secs(10));
}
