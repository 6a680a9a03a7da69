//! `auto` through the core: closed loops of clients against one worker whose batch of n
//! takes a + b n ms, in virtual time (no sleeping), beside the hand-set strategies.

use crate::core::strategy::{StrategyKind, StrategyParams};
use crate::core::*;
use rand::{Rng, SeedableRng};

const MS: Nanos = 1_000_000;

/// Requests per second a closed loop of `clients` reaches through a core running `cfg`:
/// each client sends its next request a round trip (`rtt` +- 50 %, seeded; 1 % of them
/// 30 x longer, as a descheduled client would) after its answer; the first ones `rtt / 4`
/// apart; one worker whose batch of n takes `a + b n`.
fn closed_loop(cfg: CoreConfig, clients: usize, a: Nanos, b: Nanos, rtt: Nanos) -> f64 {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(11);
    let mut core = Core::new(cfg);
    let mut returning: Vec<Nanos> = (0..clients as u64).map(|i| i * rtt / 4).collect();
    let mut busy: Option<(Nanos, BatchId)> = None;
    let mut wake: Option<Nanos> = None;
    let mut now = 0;
    let (warmup, measure) = (100usize, 600usize);
    let (mut batches, mut completed, mut t_start) = (0usize, 0usize, 0);
    loop {
        now = [busy.map(|(t, _)| t), returning.iter().copied().min(), wake]
            .into_iter()
            .flatten()
            .min()
            .expect("a closed loop always has something pending")
            .max(now);
        if let Some((t, batch)) = busy {
            if t <= now {
                busy = None;
                let n = core.batch_tickets(batch).len();
                assert_eq!(
                    core.complete(now, batch, BatchOutcome::Ok),
                    Completion::Deliver
                );
                for _ in 0..n {
                    let late = if rng.gen_bool(0.01) { 30 * rtt } else { 0 };
                    returning.push(now + rtt / 2 + rng.gen_range(0..=rtt) + late);
                }
                batches += 1;
                if batches == warmup {
                    t_start = now;
                } else if batches > warmup {
                    completed += n;
                }
                if batches == warmup + measure {
                    return completed as f64 * 1e9 / (now - t_start) as f64;
                }
            }
        }
        let mut i = 0;
        while i < returning.len() {
            if returning[i] <= now {
                returning.swap_remove(i);
                let mut meta = RequestMeta::new(Priority::Normal, Kind::Completion, 0, 0, now);
                meta.tokens_estimated = 20;
                core.admit(now, meta).expect("the queue holds every client");
            } else {
                i += 1;
            }
        }
        wake = core.poll(now, &mut |action| {
            if let Action::Dispatch { batch, tickets, .. } = action {
                assert!(busy.is_none(), "one worker, one batch at a time");
                busy = Some((now + a + b * tickets.len() as u64, batch));
            }
        });
    }
}

fn core_cfg(strategy: StrategyKind, dispatch_when_idle: bool, max_wait_ms: f64) -> CoreConfig {
    CoreConfig {
        workers: 1,
        max_batch_size: 32,
        strategy,
        dispatch_when_idle,
        strategy_params: StrategyParams {
            max_wait_ms,
            ..StrategyParams::default()
        },
        ..CoreConfig::default()
    }
}

/// The best possible (`auto::tests::best_possible`, exact: the round trip counted only
/// where no full batch hides it) for `closed_loop`'s clients: round trips `rtt / 2 +
/// U(0, rtt)`, 1 % of them `30 rtt` longer, so `1.3 rtt` on average and `31.5 rtt` at most;
/// batches of 32 (`core_cfg`).
fn best_possible(clients: usize, a: Nanos, b: Nanos, rtt: Nanos) -> f64 {
    crate::core::strategy::auto::tests::best_possible(
        clients,
        32,
        (a, b),
        1.3 * rtt as f64,
        rtt * 63 / 2,
    )
}

#[test]
fn auto_reaches_95_percent_of_the_best_possible_closed_loop_throughput() {
    let rtt = 100_000;
    for (a, b) in [
        (10 * MS, 2 * MS),
        (MS, MS / 10),
        (50 * MS, MS / 10),
        (5 * MS, 5 * MS),
    ] {
        for clients in [1usize, 2, 8, 32, 64, 256] {
            let best = best_possible(clients, a, b, rtt);
            let auto = closed_loop(
                core_cfg(StrategyKind::Auto, true, 100.0),
                clients,
                a,
                b,
                rtt,
            );
            assert!(
                auto / best >= 0.95,
                "auto at {clients} clients, a = {a} ns, b = {b} ns: {:.3} of the best possible",
                auto / best
            );
        }
    }
}

/// What the issue measured: work-conserving dispatch, and a 1 ms window without it, settle
/// into alternating groups at 8 clients (a = 10 ms, b = 2 ms) and lose a quarter of the
/// throughput; `auto` does not.
#[test]
fn hand_set_strategies_split_a_closed_loop_that_auto_keeps_whole() {
    let (a, b, rtt, clients) = (10 * MS, 2 * MS, 100_000, 8);
    let best = best_possible(clients, a, b, rtt);
    let greedy = closed_loop(
        core_cfg(StrategyKind::Fixed, true, 100.0),
        clients,
        a,
        b,
        rtt,
    );
    let window = closed_loop(
        core_cfg(StrategyKind::Fixed, false, 1.0),
        clients,
        a,
        b,
        rtt,
    );
    let auto = closed_loop(
        core_cfg(StrategyKind::Auto, true, 100.0),
        clients,
        a,
        b,
        rtt,
    );
    assert!(greedy / best < 0.8, "work-conserving: {:.3}", greedy / best);
    assert!(window / best < 0.8, "1 ms window: {:.3}", window / best);
    assert!(auto / best > 0.95, "auto: {:.3}", auto / best);
}

/// Latencies (arrival to answer, ns, sorted) of `count` Poisson arrivals at `rate_per_s`
/// through a core running `cfg`, one worker whose batch of n takes `a + b n`.
fn open_loop(cfg: CoreConfig, rate_per_s: f64, count: usize, a: Nanos, b: Nanos) -> Vec<Nanos> {
    bursty_open_loop(cfg, rate_per_s, 1, 0, count, a, b)
}

/// As [`open_loop`], with arrivals in bursts of `burst` requests `gap` ns apart, the bursts
/// starting as a Poisson process (`rate_per_s` counts requests, not bursts).
fn bursty_open_loop(
    cfg: CoreConfig,
    rate_per_s: f64,
    burst: usize,
    gap: Nanos,
    count: usize,
    a: Nanos,
    b: Nanos,
) -> Vec<Nanos> {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(5);
    let mut arrivals = Vec::with_capacity(count);
    let mut t = 0.0f64;
    while arrivals.len() < count {
        t += -(1.0 - rng.gen::<f64>()).ln() / rate_per_s * 1e9 * burst as f64;
        for i in 0..burst.min(count - arrivals.len()) {
            arrivals.push(t as Nanos + i as Nanos * gap);
        }
    }
    arrivals.sort_unstable();
    let mut core = Core::new(cfg);
    let (mut latencies, _) = serve(&mut core, &arrivals, a, b);
    latencies.sort_unstable();
    latencies
}

/// Admits `arrivals` (instants, ascending) into `core` and polls after each event, one
/// worker whose batch of n takes `a + b n`, until every one is answered. Returns the
/// latencies (arrival to answer, ns, in answer order) and the instant the last was answered.
fn serve(core: &mut Core, arrivals: &[Nanos], a: Nanos, b: Nanos) -> (Vec<Nanos>, Nanos) {
    let mut latencies = Vec::with_capacity(arrivals.len());
    let mut busy: Option<(Nanos, BatchId)> = None;
    let mut wake: Option<Nanos> = None;
    let mut next_arrival = 0;
    let mut now = arrivals.first().copied().unwrap_or(0);
    while latencies.len() < arrivals.len() {
        now = [
            busy.map(|(t, _)| t),
            arrivals.get(next_arrival).copied(),
            wake,
        ]
        .into_iter()
        .flatten()
        .min()
        .expect("work remains")
        .max(now);
        if let Some((t, batch)) = busy {
            if t <= now {
                busy = None;
                for ticket in core.batch_tickets(batch).to_vec() {
                    latencies.push(now - core.meta(ticket).unwrap().arrival_ns);
                }
                core.complete(now, batch, BatchOutcome::Ok);
            }
        }
        while arrivals.get(next_arrival).is_some_and(|&t| t <= now) {
            let mut meta = RequestMeta::new(Priority::Normal, Kind::Completion, 0, 0, now);
            meta.tokens_estimated = 20;
            core.admit(now, meta).expect("room");
            next_arrival += 1;
        }
        wake = core.poll(now, &mut |action| {
            if let Action::Dispatch { batch, tickets, .. } = action {
                busy = Some((now + a + b * tickets.len() as u64, batch));
            }
        });
    }
    (latencies, now)
}

fn pct(sorted: &[Nanos], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p) as usize] as f64 / 1e6
}

#[test]
#[ignore = "exploration: prints auto against work-conserving and the best window, bursts"]
fn bursty_table() {
    for (a, b) in [
        (10 * MS, 2 * MS),
        (MS, MS / 10),
        (50 * MS, MS / 10),
        (20 * MS, MS),
    ] {
        let capacity = 32.0 * 1e9 / (a + 32 * b) as f64;
        for (burst, gap) in [(8usize, 20_000), (16, 50_000), (32, 10_000)] {
            for load in [0.1, 0.5, 0.9] {
                let run = |cfg| {
                    let l = bursty_open_loop(cfg, load * capacity, burst, gap, 20_000, a, b);
                    (pct(&l, 0.5), pct(&l, 0.99))
                };
                let auto = run(core_cfg(StrategyKind::Auto, true, 100.0));
                let greedy = run(core_cfg(StrategyKind::Fixed, true, 100.0));
                let mut best = (f64::MAX, f64::MAX, 0.0);
                for w in [0.2, 0.5, 1.0, 2.0, 5.0] {
                    let r = run(core_cfg(StrategyKind::Fixed, false, w));
                    if r.0 + r.1 < best.0 + best.1 {
                        best = (r.0, r.1, w);
                    }
                }
                eprintln!(
                    "a={:>4.1} b={:>4.1} burst={burst:>2}x{:>3}us load={load:.1}: auto {:>7.2} {:>7.2} | greedy {:>7.2} {:>7.2} | window {:>3.1} {:>7.2} {:>7.2} | auto/best p50 {:.3} p99 {:.3}",
                    a as f64 / 1e6, b as f64 / 1e6, gap / 1000, auto.0, auto.1, greedy.0, greedy.1,
                    best.2, best.0, best.1, auto.0 / greedy.0.min(best.0), auto.1 / greedy.1.min(best.1)
                );
            }
        }
    }
}

#[test]
#[ignore = "exploration: prints auto against work-conserving and the best window"]
fn open_loop_table() {
    for (a, b) in [
        (10 * MS, 2 * MS),
        (MS, MS / 10),
        (50 * MS, MS / 10),
        (5 * MS, 5 * MS),
        (20 * MS, MS),
    ] {
        let capacity = 32.0 * 1e9 / (a + 32 * b) as f64;
        for load in [0.1, 0.3, 0.5, 0.7, 0.9, 0.95] {
            let rate = load * capacity;
            let run = |cfg| {
                let l = open_loop(cfg, rate, 20_000, a, b);
                (pct(&l, 0.5), pct(&l, 0.99))
            };
            let auto = run(core_cfg(StrategyKind::Auto, true, 100.0));
            let greedy = run(core_cfg(StrategyKind::Fixed, true, 100.0));
            let mut best_window = (f64::MAX, f64::MAX, 0.0);
            for w in [0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0] {
                let r = run(core_cfg(StrategyKind::Fixed, false, w));
                if r.0 + r.1 < best_window.0 + best_window.1 {
                    best_window = (r.0, r.1, w);
                }
            }
            let best50 = greedy.0.min(best_window.0);
            let best99 = greedy.1.min(best_window.1);
            eprintln!(
                "a={:>4.1} b={:>4.1} load={load:.2}: auto p50 {:>7.2} p99 {:>7.2} | greedy {:>7.2} {:>7.2} | window {:>4.1} ms {:>7.2} {:>7.2} | auto/best p50 {:.3} p99 {:.3}",
                a as f64 / 1e6, b as f64 / 1e6, auto.0, auto.1, greedy.0, greedy.1, best_window.2,
                best_window.0, best_window.1, auto.0 / best50, auto.1 / best99
            );
        }
    }
}

/// The open-loop goal: Poisson arrivals at 10-95 % of capacity, where waiting
/// cannot help; `auto`'s p50 and p99 within 3 % of the best in hindsight (work-conserving
/// dispatch, or the best of a sweep of fixed windows).
#[test]
fn open_loop_auto_is_within_3_percent_of_the_best_in_hindsight() {
    for (a, b) in [(10 * MS, 2 * MS), (MS, MS / 10), (50 * MS, MS / 10)] {
        let capacity = 32.0 * 1e9 / (a + 32 * b) as f64;
        for load in [0.1, 0.5, 0.95] {
            let run = |cfg| {
                let l = open_loop(cfg, load * capacity, 20_000, a, b);
                (pct(&l, 0.5), pct(&l, 0.99))
            };
            let auto = run(core_cfg(StrategyKind::Auto, true, 100.0));
            let mut best = run(core_cfg(StrategyKind::Fixed, true, 100.0));
            for w in [0.5, 2.0, 10.0] {
                let r = run(core_cfg(StrategyKind::Fixed, false, w));
                best = (best.0.min(r.0), best.1.min(r.1));
            }
            assert!(
                auto.0 <= best.0 * 1.03 && auto.1 <= best.1 * 1.03,
                "a = {a} ns, b = {b} ns, load {load}: auto p50 {:.2} p99 {:.2} ms, best {:.2} {:.2}",
                auto.0,
                auto.1,
                best.0,
                best.1
            );
        }
    }
}

/// Switched away from `auto` and back (the admin API), `auto` does not read the time away
/// as one long gap between arrivals: steady arrivals stay steady (a squared coefficient of
/// variation near 0, not the ~85 that one 10 s gap among 1 ms ones still makes 20
/// arrivals later).
#[test]
fn auto_switched_away_and_back_does_not_read_the_time_away_as_a_gap() {
    // Arrivals every 1 ms from `from` until `to`, batches of n taking 2 ms + 0.1 ms n.
    let steady = |core: &mut Core, from: Nanos, to: Nanos| {
        let arrivals: Vec<Nanos> = (from..to).step_by(MS as usize).collect();
        serve(core, &arrivals, 2 * MS, MS / 10).1
    };
    let mut core = Core::new(core_cfg(StrategyKind::Auto, false, 5.0));
    let now = steady(&mut core, 0, 2_000 * MS);
    let before = core.auto_snapshot();
    assert!(
        before.cost.a_ns >= MS as f64,
        "learned a: {:?}",
        before.cost
    );
    assert!(before.arrival_burstiness < 0.5, "{before:?}");
    core.set_strategy(StrategyKind::Fixed);
    let now = steady(&mut core, now + MS, now + 10_000 * MS);
    core.set_strategy(StrategyKind::Auto);
    steady(&mut core, now + 10_000 * MS, now + 10_020 * MS);
    let after = core.auto_snapshot();
    assert!(
        after.arrival_burstiness < 0.5,
        "burstiness after the switch back: {} (before: {})",
        after.arrival_burstiness,
        before.arrival_burstiness
    );
}
