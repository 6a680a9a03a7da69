//! Behaviour tests of the core, driven with explicit time (no sleeping).

/// `auto` through the core in closed loops (`tests/auto.rs`).
mod auto;
/// `auto` over closed loops drawn from seeds (`tests/auto_props.rs`).
mod auto_props;
/// The LoRA slot rule of batch forming (`tests/lora.rs`).
mod lora;

use super::strategy::StrategyKind;
use super::*;

const MS: Nanos = 1_000_000;

/// What a poll produced, copied out of the borrowed actions.
#[derive(Debug, Default)]
struct Polled {
    dispatches: Vec<(usize, BatchId, FlushReason, Vec<Ticket>)>,
    fails: Vec<(Ticket, FailReason)>,
    next: Option<Nanos>,
}

fn poll(core: &mut Core, now: Nanos) -> Polled {
    let mut p = Polled::default();
    p.next = core.poll(now, &mut |a| match a {
        Action::Dispatch {
            worker,
            batch,
            reason,
            tickets,
            ..
        } => p.dispatches.push((worker, batch, reason, tickets.to_vec())),
        Action::Fail { ticket, reason } => p.fails.push((ticket, reason)),
    });
    p
}

/// One worker, the timeout strategy `queue_depth` without idle dispatch: the rules these
/// tests pin down (auto has its own tests in `tests/auto.rs`).
fn cfg() -> CoreConfig {
    CoreConfig {
        workers: 1,
        strategy: StrategyKind::QueueDepth,
        dispatch_when_idle: false,
        ..CoreConfig::default()
    }
}

fn req(p: Priority, tokens: u32, at: Nanos) -> RequestMeta {
    let mut m = RequestMeta::new(p, Kind::Completion, 0, 0, at);
    m.tokens_estimated = tokens;
    m
}

fn normal(at: Nanos) -> RequestMeta {
    req(Priority::Normal, 10, at)
}

#[test]
fn admission_is_bounded_by_queue_capacity_and_refusal_is_counted() {
    let mut core = Core::new(CoreConfig {
        queue_capacity: 3,
        ..cfg()
    });
    for _ in 0..3 {
        core.admit(0, normal(0)).unwrap();
    }
    assert_eq!(
        core.admit(0, normal(0)),
        Err(Reject::QueueFull { capacity: 3 })
    );
    assert_eq!(core.stats().rejected_full, 1);
    assert_eq!(core.queued(), 3);
}

#[test]
fn an_idle_worker_takes_a_lone_request_at_once_when_dispatch_when_idle_is_on() {
    let mut core = Core::new(CoreConfig {
        dispatch_when_idle: true,
        ..cfg()
    });
    let t = core.admit(0, normal(0)).unwrap();
    let p = poll(&mut core, 0);
    assert_eq!(p.dispatches.len(), 1);
    assert_eq!(p.dispatches[0].2, FlushReason::IdleWorker);
    assert_eq!(p.dispatches[0].3, vec![t]);
    // The worker is now busy: the next request waits for the strategy.
    core.admit(MS, normal(MS)).unwrap();
    let p = poll(&mut core, MS);
    assert!(p.dispatches.is_empty());
    assert!(p.next.is_some());
}

#[test]
fn fixed_window_flushes_at_max_wait_ms_when_nothing_else_fires() {
    let mut core = Core::new(CoreConfig {
        strategy: StrategyKind::Fixed,
        strategy_params: strategy::StrategyParams {
            max_wait_ms: 30.0,
            ..Default::default()
        },
        ..cfg()
    });
    core.admit(0, req(Priority::Low, 10, 0)).unwrap();
    let p = poll(&mut core, 0);
    assert!(p.dispatches.is_empty());
    assert_eq!(p.next, Some(30 * MS));
    assert!(poll(&mut core, 30 * MS - 1).dispatches.is_empty());
    let p = poll(&mut core, 30 * MS);
    assert_eq!(p.dispatches.len(), 1);
    assert_eq!(p.dispatches[0].2, FlushReason::Timeout);
}

#[test]
fn priority_max_wait_flushes_before_the_strategy_timeout() {
    // Spec defaults: fixed window 100 ms, normal max wait 50 ms, high 20 ms.
    let mut core = Core::new(CoreConfig {
        strategy: StrategyKind::Fixed,
        ..cfg()
    });
    core.admit(0, req(Priority::High, 10, 0)).unwrap();
    assert_eq!(poll(&mut core, 0).next, Some(20 * MS));
    let p = poll(&mut core, 20 * MS);
    assert_eq!(p.dispatches[0].2, FlushReason::MaxWait);

    let mut core = Core::new(CoreConfig {
        strategy: StrategyKind::Fixed,
        ..cfg()
    });
    core.admit(0, normal(0)).unwrap();
    assert_eq!(poll(&mut core, 0).next, Some(50 * MS));
    assert_eq!(
        poll(&mut core, 50 * MS).dispatches[0].2,
        FlushReason::MaxWait
    );
}

#[test]
fn a_full_batch_is_released_at_once_with_max_batch_size_requests() {
    let mut core = Core::new(cfg());
    let tickets: Vec<_> = (0..40).map(|i| core.admit(i, normal(i)).unwrap()).collect();
    let p = poll(&mut core, 40);
    assert_eq!(p.dispatches.len(), 1, "one worker, one batch");
    let (_, _, reason, batch) = &p.dispatches[0];
    assert_eq!(*reason, FlushReason::Full);
    assert_eq!(batch.as_slice(), &tickets[..32], "FIFO, capped at 32");
    assert_eq!(core.queued(), 8);
}

#[test]
fn max_batch_tokens_caps_a_batch_but_an_oversized_request_still_goes_alone() {
    let mut core = Core::new(CoreConfig {
        max_batch_tokens: 100,
        token_bucketing: false,
        ..cfg()
    });
    core.admit(0, req(Priority::Normal, 60, 0)).unwrap();
    core.admit(0, req(Priority::Normal, 60, 0)).unwrap();
    let p = poll(&mut core, 0);
    assert_eq!(p.dispatches[0].2, FlushReason::Full, "120 tokens >= 100");
    assert_eq!(p.dispatches[0].3.len(), 1);

    let mut core = Core::new(CoreConfig {
        max_batch_tokens: 100,
        dispatch_when_idle: true,
        ..cfg()
    });
    core.admit(0, req(Priority::Normal, 5000, 0)).unwrap();
    let p = poll(&mut core, 0);
    assert_eq!(p.dispatches[0].3.len(), 1);
}

#[test]
fn a_critical_request_flushes_its_batch_at_once_and_goes_first() {
    let mut core = Core::new(cfg());
    let low = core.admit(0, req(Priority::Low, 10, 0)).unwrap();
    let normal_t = core.admit(1, normal(1)).unwrap();
    let high = core.admit(2, req(Priority::High, 10, 2)).unwrap();
    let crit = core.admit(3, req(Priority::Critical, 10, 3)).unwrap();
    let p = poll(&mut core, 3);
    assert_eq!(p.dispatches.len(), 1);
    assert_eq!(p.dispatches[0].2, FlushReason::Critical);
    assert_eq!(p.dispatches[0].3, vec![crit, high, normal_t, low]);
}

#[test]
fn token_bucketing_keeps_buckets_apart_and_off_mixes_them_by_arrival() {
    let mut core = Core::new(CoreConfig {
        workers: 2,
        dispatch_when_idle: true,
        ..cfg()
    });
    let short = core.admit(0, req(Priority::Normal, 100, 0)).unwrap();
    let long = core.admit(1, req(Priority::Normal, 3000, 1)).unwrap();
    let p = poll(&mut core, 1);
    assert_eq!(p.dispatches.len(), 2);
    assert_eq!(p.dispatches[0].3, vec![short]);
    assert_eq!(p.dispatches[1].3, vec![long]);

    let mut core = Core::new(CoreConfig {
        workers: 2,
        dispatch_when_idle: true,
        token_bucketing: false,
        ..cfg()
    });
    let short = core.admit(0, req(Priority::Normal, 100, 0)).unwrap();
    let long = core.admit(1, req(Priority::Normal, 3000, 1)).unwrap();
    let p = poll(&mut core, 1);
    assert_eq!(p.dispatches.len(), 1);
    assert_eq!(p.dispatches[0].3, vec![short, long]);
}

#[test]
fn queue_depth_strategy_shortens_the_wait_as_the_queue_grows() {
    let mut core = Core::new(CoreConfig {
        strategy: StrategyKind::QueueDepth,
        token_bucketing: false,
        max_batch_size: 1000,
        max_batch_tokens: 1_000_000,
        ..cfg()
    });
    // Low priority (max wait 100 ms) so only the strategy decides.
    for _ in 0..55 {
        core.admit(0, req(Priority::Low, 1, 0)).unwrap();
    }
    // depth 55 -> 100 - 0.5 * 95 = 52.5 ms.
    assert_eq!(poll(&mut core, 0).next, Some(52_500_000));
    let p = poll(&mut core, 52_500_000);
    assert_eq!(p.dispatches[0].2, FlushReason::Timeout);
    assert_eq!(p.dispatches[0].3.len(), 55);
}

#[test]
fn switching_strategy_with_a_full_queue_loses_nothing() {
    let mut core = Core::new(CoreConfig {
        workers: 2,
        ..cfg()
    });
    let mut admitted = vec![];
    for i in 0..100 {
        admitted.push(core.admit(i, normal(i)).unwrap());
    }
    let mut seen = vec![];
    let mut now = 100;
    for (step, kind) in StrategyKind::ALL.iter().cycle().take(30).enumerate() {
        core.set_strategy(*kind);
        now += MS * step as u64;
        let p = poll(&mut core, now);
        for (_, batch, _, tickets) in p.dispatches {
            seen.extend(tickets);
            assert_eq!(
                core.complete(now, batch, BatchOutcome::Ok),
                Completion::Deliver
            );
        }
    }
    seen.sort_by_key(|t| t.as_u64());
    admitted.sort_by_key(|t| t.as_u64());
    assert_eq!(seen, admitted);
    assert_eq!(core.stats().completed, 100);
    assert!(core.is_idle());
}

#[test]
fn with_no_worker_free_the_batch_waits_and_expires_at_the_request_deadline() {
    let mut core = Core::new(CoreConfig {
        request_timeout_ns: 500 * MS,
        ..cfg()
    });
    let first: Vec<_> = (0..32).map(|_| core.admit(0, normal(0)).unwrap()).collect();
    let p = poll(&mut core, 0);
    let batch = p.dispatches[0].1;
    let waiting = core.admit(MS, normal(MS)).unwrap();
    // The worker is busy: the request waits past its max wait, nothing is dropped.
    let p = poll(&mut core, 100 * MS);
    assert!(p.dispatches.is_empty() && p.fails.is_empty());
    assert_eq!(p.next, Some(501 * MS), "only the request deadline remains");
    let p = poll(&mut core, 501 * MS);
    assert_eq!(p.fails, vec![(waiting, FailReason::QueueTimeout)]);
    assert_eq!(
        core.complete(502 * MS, batch, BatchOutcome::Ok),
        Completion::Deliver
    );
    assert_eq!(core.stats().completed as usize, first.len());
    assert_eq!(core.stats().expired, 1);
    assert!(core.is_idle());
}

#[test]
fn a_failing_worker_opens_its_circuit_traffic_moves_and_it_recovers_after_thirty_seconds() {
    let mut core = Core::new(CoreConfig {
        workers: 2,
        dispatch_when_idle: true,
        balancer: balancer::BalancerKind::RoundRobin,
        ..cfg()
    });
    let mut now = 0;
    let mut served_by = [0usize; 2];
    // Worker 0 fails everything; worker 1 succeeds.
    for _ in 0..20 {
        core.admit(now, normal(now)).unwrap();
        let p = poll(&mut core, now);
        for (w, b, _, _) in p.dispatches {
            served_by[w] += 1;
            let outcome = if w == 0 {
                BatchOutcome::Failed
            } else {
                BatchOutcome::Ok
            };
            core.complete(now, b, outcome);
        }
        now += MS;
    }
    assert_eq!(served_by[0], 5, "open after 5 consecutive failures");
    assert_eq!(served_by[1], 15);
    assert_eq!(core.workers()[0].status(), pool::WorkerStatus::Unhealthy);
    // Worker 0 failed last at 8 ms: 30 s later a single probe goes to it; it succeeds.
    now = 8 * MS + 30_000 * MS;
    let mut workers = vec![];
    let mut batches = vec![];
    for _ in 0..2 {
        core.admit(now, normal(now)).unwrap();
        for (w, b, _, _) in poll(&mut core, now).dispatches {
            workers.push(w);
            batches.push(b);
        }
    }
    assert!(workers.contains(&0), "probe sent: {workers:?}");
    for b in batches {
        core.complete(now, b, BatchOutcome::Ok);
    }
    assert_eq!(core.workers()[0].status(), pool::WorkerStatus::Idle);
}

#[test]
fn a_batch_past_its_timeout_fails_its_requests_once_and_the_late_result_is_stale() {
    let mut core = Core::new(CoreConfig {
        dispatch_when_idle: true,
        batch_timeout_ns: 1000 * MS,
        ..cfg()
    });
    let t = core.admit(0, normal(0)).unwrap();
    let p = poll(&mut core, 0);
    let batch = p.dispatches[0].1;
    assert_eq!(p.next, Some(1000 * MS));
    let p = poll(&mut core, 1000 * MS);
    assert_eq!(p.fails, vec![(t, FailReason::BatchTimeout)]);
    // The worker still holds the batch, so it cannot take another.
    core.admit(1001 * MS, normal(1001 * MS)).unwrap();
    assert!(poll(&mut core, 1001 * MS).dispatches.is_empty());
    assert_eq!(
        core.complete(2000 * MS, batch, BatchOutcome::Ok),
        Completion::Stale
    );
    assert_eq!(poll(&mut core, 2000 * MS).dispatches.len(), 1);
    assert_eq!(core.stats().batch_timeouts, 1);
    assert_eq!(core.stats().completed, 0);
}

#[test]
fn drain_refuses_new_work_and_flushes_everything_queued() {
    let mut core = Core::new(cfg());
    for i in 0..5 {
        core.admit(i, req(Priority::Low, 10, i)).unwrap();
    }
    core.begin_drain();
    assert_eq!(core.admit(5, normal(5)), Err(Reject::ShuttingDown));
    let p = poll(&mut core, 5);
    assert_eq!(p.dispatches[0].2, FlushReason::Drain);
    assert_eq!(p.dispatches[0].3.len(), 5);
    core.complete(6, p.dispatches[0].1, BatchOutcome::Ok);
    assert!(core.is_idle());
}

#[test]
fn abort_all_answers_queued_and_in_flight_requests_exactly_once() {
    let mut core = Core::new(CoreConfig {
        dispatch_when_idle: true,
        ..cfg()
    });
    core.admit(0, normal(0)).unwrap();
    let batch = poll(&mut core, 0).dispatches[0].1;
    core.admit(0, normal(0)).unwrap();
    core.admit(0, normal(0)).unwrap();
    let mut fails = 0;
    core.abort_all(1, &mut |a| {
        if let Action::Fail { reason, .. } = a {
            assert_eq!(reason, FailReason::Aborted);
            fails += 1;
        }
    });
    assert_eq!(fails, 3);
    assert_eq!(core.complete(2, batch, BatchOutcome::Ok), Completion::Stale);
    assert!(core.is_idle());
    assert_eq!(core.live_requests(), 0);
}

#[test]
fn cancel_removes_a_queued_request_only() {
    let mut core = Core::new(CoreConfig {
        dispatch_when_idle: true,
        ..cfg()
    });
    let a = core.admit(0, normal(0)).unwrap();
    poll(&mut core, 0);
    let b = core.admit(0, normal(0)).unwrap();
    assert!(!core.cancel(a), "already dispatched");
    assert!(core.cancel(b));
    assert!(!core.cancel(b), "only once");
    assert_eq!(core.queued(), 0);
    assert_eq!(core.stats().cancelled, 1);
}

#[test]
fn latency_aware_shrinks_the_timeout_when_p99_is_over_target() {
    let mut core = Core::new(CoreConfig {
        strategy: StrategyKind::LatencyAware,
        strategy_params: strategy::StrategyParams {
            target_p99_ms: 10.0,
            ..Default::default()
        },
        dispatch_when_idle: true,
        ..cfg()
    });
    // Ten requests served with 50 ms latency: p99 50 ms > 1.1 x 10 ms.
    for i in 0..10 {
        let now = i * 100 * MS;
        core.admit(now, req(Priority::Low, 10, now)).unwrap();
        let b = poll(&mut core, now).dispatches[0].1;
        core.complete(now + 50 * MS, b, BatchOutcome::Ok);
    }
    let now = 2000 * MS;
    poll(&mut core, now); // refreshes p99
    assert_eq!(core.observed_p99_ns(), Some(50 * MS));
    // Keep the worker busy, then queue a low-priority request: 100 ms x 0.8 = 80 ms.
    core.admit(now, req(Priority::Low, 10, now)).unwrap();
    poll(&mut core, now);
    core.admit(now, req(Priority::Low, 10, now)).unwrap();
    let p = poll(&mut core, now);
    assert!(p.dispatches.is_empty());
    // The p99 refresh (every 100 ms) is the earliest event; the flush itself is at +80 ms.
    let mut t = now;
    let mut flushed_at = None;
    while flushed_at.is_none() && t < now + 200 * MS {
        t += MS;
        if !poll(&mut core, t).dispatches.is_empty() {
            flushed_at = Some(t);
        }
    }
    assert_eq!(flushed_at, None, "worker busy: nothing can be sent");
    assert!(core.stats().flush_reasons[FlushReason::IdleWorker.index()] >= 10);
}

#[test]
fn latency_aware_timeout_is_applied_when_a_worker_is_free() {
    let mut core = Core::new(CoreConfig {
        strategy: StrategyKind::LatencyAware,
        strategy_params: strategy::StrategyParams {
            target_p99_ms: 1000.0,
            max_wait_ms: 50.0,
            ..Default::default()
        },
        ..cfg()
    });
    // No observations yet: base (queue_depth at depth 1 = max_wait 50 ms) ... but low
    // priority max wait is 100 ms, so the strategy decides.
    core.admit(0, req(Priority::Low, 10, 0)).unwrap();
    assert_eq!(poll(&mut core, 0).next, Some(50 * MS));
    let p = poll(&mut core, 50 * MS);
    core.complete(60 * MS, p.dispatches[0].1, BatchOutcome::Ok);
    // p99 = 60 ms < 0.8 x 1000 ms: x1.2 -> 60 ms once refreshed.
    core.admit(200 * MS, req(Priority::Low, 10, 200 * MS))
        .unwrap();
    let p = poll(&mut core, 200 * MS);
    assert!(p.dispatches.is_empty());
    assert_eq!(core.observed_p99_ns(), Some(60 * MS));
    assert!(poll(&mut core, 259 * MS).dispatches.is_empty());
    assert_eq!(
        poll(&mut core, 260 * MS).dispatches[0].2,
        FlushReason::Timeout
    );
}

#[test]
fn queue_waits_are_counted_per_request() {
    let mut core = Core::new(CoreConfig {
        strategy: StrategyKind::Fixed,
        ..cfg()
    });
    core.admit(0, normal(0)).unwrap();
    core.admit(10 * MS, normal(10 * MS)).unwrap();
    poll(&mut core, 50 * MS);
    let w = core.stats().queue_wait;
    assert_eq!(w.count, 2);
    assert_eq!(w.sum_ns, 50 * MS + 40 * MS);
}

#[test]
fn min_batch_size_holds_a_timeout_flush_until_enough_requests_wait() {
    let mut core = Core::new(CoreConfig {
        strategy: StrategyKind::Fixed,
        min_batch_size: 3,
        strategy_params: strategy::StrategyParams {
            max_wait_ms: 10.0,
            ..Default::default()
        },
        ..cfg()
    });
    core.admit(0, req(Priority::Low, 10, 0)).unwrap();
    core.admit(0, req(Priority::Low, 10, 0)).unwrap();
    // Two requests: the 10 ms timeout does not release them; low's 100 ms max wait does.
    assert_eq!(poll(&mut core, 0).next, Some(100 * MS));
    assert!(poll(&mut core, 50 * MS).dispatches.is_empty());
    core.admit(60 * MS, req(Priority::Low, 10, 60 * MS))
        .unwrap();
    let p = poll(&mut core, 60 * MS);
    assert_eq!(p.dispatches[0].2, FlushReason::Timeout);
    assert_eq!(p.dispatches[0].3.len(), 3);
}

#[test]
fn with_priorities_disabled_everything_is_normal() {
    let mut core = Core::new(CoreConfig {
        priority_enabled: false,
        ..cfg()
    });
    let t = core.admit(0, req(Priority::Critical, 10, 0)).unwrap();
    assert_eq!(core.meta(t).unwrap().priority, Priority::Normal);
    assert!(
        poll(&mut core, 0).dispatches.is_empty(),
        "no critical flush"
    );
}

fn research_cfg(kind: StrategyKind) -> CoreConfig {
    CoreConfig {
        strategy: kind,
        ..cfg()
    }
}

fn with_max_tokens(max_tokens: u32, at: Nanos) -> RequestMeta {
    RequestMeta::new(Priority::Normal, Kind::Completion, 40, max_tokens, at)
}

#[test]
fn dynamic_sends_min_of_b_mem_and_b_sla_as_soon_as_a_worker_is_free() {
    let mut core = Core::new(research_cfg(StrategyKind::Dynamic));
    // No statistics: b_mem = floor(0.9 x 42,667 / 500) = 76, b_SLA = warm-up midpoint 64.
    let snap = core.research_snapshot();
    assert_eq!((snap.b_mem, snap.b_sla), (76, 64));
    for i in 0..40 {
        core.admit(i, normal(i)).unwrap();
    }
    // 40 waiting, fewer than b_SLA's midpoint: one batch of all 40, as soon as possible.
    let p = poll(&mut core, 40);
    assert_eq!(p.dispatches.len(), 1);
    assert_eq!(p.dispatches[0].3.len(), 40);
    assert_eq!(p.dispatches[0].2, FlushReason::IdleWorker);
    core.complete(50, p.dispatches[0].1, BatchOutcome::Ok);
    // A backlog larger than the midpoint probes the interval's upper end (128 while
    // warming up), capped by b_mem: min(76, 128) = 76.
    for i in 0..100 {
        core.admit(100 + i, normal(100 + i)).unwrap();
    }
    let p = poll(&mut core, 200);
    assert_eq!(p.dispatches[0].3.len(), 76);
    assert_eq!(p.dispatches[0].2, FlushReason::Full);
    // The rest waits for the worker; no flush timer is armed, only the request deadline.
    assert_eq!(p.next, Some(core.config().request_timeout_ns + 176));
    core.complete(300, p.dispatches[0].1, BatchOutcome::Ok);
    let p = poll(&mut core, 300);
    assert_eq!(p.dispatches[0].3.len(), 24);
}

#[test]
fn the_memory_check_shrinks_a_batch_and_counts_the_hit() {
    let mut c = research_cfg(StrategyKind::Dynamic);
    // 4 GB model in 4.5 GB with a 0.1 GB margin: 0.4 GB / 1.875e-4 = 2133 tokens per batch.
    c.research.memory.m_max_gb = 4.5;
    c.research.memory.margin_gb = 0.1;
    let mut core = Core::new(c);
    for i in 0..10 {
        let mut m = with_max_tokens(0, i);
        m.tokens_estimated = 1000;
        core.admit(i, m).unwrap();
    }
    let p = poll(&mut core, 10);
    assert_eq!(p.dispatches[0].3.len(), 2, "2 x 1000 tokens fit, 3 do not");
    assert_eq!(core.research_snapshot().memory_limit_hits, 1);
}

#[test]
fn multi_bin_keeps_each_batch_within_one_bin_and_alternates_bins_round_robin() {
    let mut c = research_cfg(StrategyKind::MultiBin);
    c.workers = 4;
    c.research.bins = 2;
    c.research.bin_policy = crate::core::strategy::research::bins::BinPolicy::RoundRobin;
    c.research.max_tokens_limit = 1000;
    let mut core = Core::new(c);
    // Before statistics the 2 bins split [1, 1000] in equal widths: short and long.
    let mut short = vec![];
    let mut long = vec![];
    for i in 0..6 {
        short.push(core.admit(i, with_max_tokens(10, i)).unwrap());
        long.push(core.admit(i, with_max_tokens(900, i)).unwrap());
    }
    let p = poll(&mut core, 10);
    assert_eq!(
        p.dispatches.len(),
        2,
        "one batch per non-empty bin, then the bins are empty"
    );
    let first = &p.dispatches[0].3;
    let second = &p.dispatches[1].3;
    assert!(first.iter().all(|t| short.contains(t)) || first.iter().all(|t| long.contains(t)));
    assert!(second.iter().all(|t| short.contains(t)) || second.iter().all(|t| long.contains(t)));
    assert_ne!(
        short.contains(&first[0]),
        short.contains(&second[0]),
        "round robin serves the other bin next"
    );
}

#[test]
fn switching_into_and_out_of_multi_bin_under_load_loses_nothing_and_keeps_fifo() {
    let mut c = cfg();
    c.workers = 2;
    c.research.bins = 8;
    let mut core = Core::new(c);
    let mut admitted = vec![];
    let mut seen = vec![];
    let kinds = [
        StrategyKind::MultiBin,
        StrategyKind::Fixed,
        StrategyKind::Dynamic,
        StrategyKind::MultiBin,
        StrategyKind::QueueDepth,
    ];
    let mut now = 0;
    for round in 0..40 {
        for j in 0..7 {
            now += 1;
            let p = Priority::from_index((round + j) % 4);
            let mut m = RequestMeta::new(p, Kind::Completion, 40, 1 + (j as u32 * 97) % 500, now);
            m.predicted_output_tokens = (round as u32 * 13) % 600;
            admitted.push(core.admit(now, m).unwrap());
        }
        core.set_strategy(kinds[round % kinds.len()]);
        now += 60 * MS;
        let p = poll(&mut core, now);
        for (_, batch, _, tickets) in p.dispatches {
            seen.extend(tickets);
            core.complete(now, batch, BatchOutcome::Ok);
        }
    }
    core.begin_drain();
    while !core.is_idle() {
        now += MS;
        let p = poll(&mut core, now);
        for (_, batch, _, tickets) in p.dispatches {
            seen.extend(tickets);
            core.complete(now, batch, BatchOutcome::Ok);
        }
    }
    seen.sort_by_key(|t| t.as_u64());
    admitted.sort_by_key(|t| t.as_u64());
    assert_eq!(seen, admitted, "every request served exactly once");
    assert_eq!(core.stats().failed, 0);
}

#[test]
fn completed_batches_feed_the_sla_controller_and_the_length_statistics() {
    let mut core = Core::new(research_cfg(StrategyKind::Dynamic));
    // Batches of 10 requests, 20 output tokens each, taking 400 ms: 20 ms per token, twice
    // the 10 ms SLA: after the warm-up the controller pulls the batch size down.
    let mut now = 0;
    for _ in 0..10 {
        for _ in 0..10 {
            core.admit(now, with_max_tokens(20, now)).unwrap();
        }
        let p = poll(&mut core, now);
        now += 400 * MS;
        core.complete(now, p.dispatches[0].1, BatchOutcome::Ok);
    }
    let snap = core.research_snapshot();
    assert_eq!(snap.tbt_ms_ema.map(|x| x.round()), Some(20.0));
    assert!(
        snap.b_sla < 64,
        "slower than the SLA: smaller batches ({})",
        snap.b_sla
    );
    // Mean request: 10 prompt tokens (40 bytes / 4) + 20 output tokens.
    assert!(snap.mean_tokens_per_request.unwrap() < 500.0);
}

#[test]
fn abort_all_answers_every_request_queued_in_bins() {
    let mut core = Core::new(CoreConfig {
        strategy: StrategyKind::MultiBin,
        ..cfg()
    });
    // The worker takes the first batch; the rest wait in their bins.
    for i in 0..200 {
        core.admit(i, with_max_tokens(1 + (i as u32 * 37) % 900, i))
            .unwrap();
    }
    let batch = poll(&mut core, 200).dispatches[0].1;
    let mut failed = 0;
    core.abort_all(300, &mut |a| {
        if let Action::Fail { reason, .. } = a {
            assert_eq!(reason, FailReason::Aborted);
            failed += 1;
        }
    });
    assert_eq!(
        failed, 200,
        "queued and in flight: every request answered once"
    );
    assert_eq!(core.queued(), 0);
    assert_eq!(
        core.complete(400, batch, BatchOutcome::Ok),
        Completion::Stale
    );
    assert!(core.is_idle());
    assert_eq!(core.live_requests(), 0);
}

/// What goes alone (`CoreConfig::alone`: an `upstream` lane) goes in a batch of its own
/// under every strategy, the research ones (which size batches by their own `b_max`) and
/// `auto` included, at once (nothing to wait for); the rest still batches. Without prompt
/// arrays every completion goes alone; with them, only chats and streams
/// (`RequestMeta::own_request`).
#[test]
fn what_goes_alone_does_so_under_every_strategy_and_the_rest_still_batches() {
    for (alone, expected) in [
        (
            Alone::Completions,
            vec![
                (1, Kind::Completion),
                (1, Kind::Completion),
                (1, Kind::Completion),
                (1, Kind::Completion),
                (8, Kind::Embedding),
            ],
        ),
        (
            Alone::OwnRequests,
            vec![
                (1, Kind::Completion),
                (1, Kind::Completion),
                (10, Kind::Completion),
            ],
        ),
        (Alone::Never, vec![(12, Kind::Completion)]),
    ] {
        for strategy in [
            StrategyKind::Fixed,
            StrategyKind::QueueDepth,
            StrategyKind::Auto,
            StrategyKind::Dynamic,
            StrategyKind::MultiBin,
        ] {
            let mut c = if matches!(strategy, StrategyKind::Dynamic | StrategyKind::MultiBin) {
                research_cfg(strategy)
            } else {
                CoreConfig {
                    strategy,
                    ..CoreConfig::default()
                }
            };
            c.workers = 5;
            c.min_batch_size = 2;
            c.alone = alone;
            let mut core = Core::new(c);
            // Two chats or streams, then two plain completions, then eight embeddings, all in
            // one token bucket: what does not go alone batches together.
            for i in 0..4 {
                let mut m = with_max_tokens(16, i);
                m.own_request = i < 2;
                core.admit(i, m).unwrap();
            }
            for i in 4..12 {
                let mut m = RequestMeta::new(Priority::Normal, Kind::Embedding, 40, 0, i);
                m.tokens_estimated = 10;
                core.admit(i, m).unwrap();
            }
            let p = poll(&mut core, 12);
            let batches: Vec<(usize, Kind)> = p
                .dispatches
                .iter()
                .map(|d| (d.3.len(), core.meta(d.3[0]).expect("in flight").kind))
                .collect();
            // Every request went, and none that goes alone shared a batch.
            let sent: usize = batches.iter().map(|b| b.0).sum();
            assert_eq!(sent, 12, "{alone:?} under {strategy:?}: {batches:?}");
            for d in &p.dispatches {
                let metas = d.3.iter().map(|&t| *core.meta(t).expect("in flight"));
                let shares = d.3.len() > 1 && metas.clone().any(|m| alone.of(&m));
                assert!(!shares, "{alone:?} under {strategy:?}: {batches:?}");
            }
            // `multi_bin` sizes each batch by its bin's own target, which may cut the rest in
            // two; the others batch everything that does not go alone.
            if strategy != StrategyKind::MultiBin {
                assert_eq!(batches, expected, "{alone:?} under {strategy:?}");
            }
        }
    }
}
