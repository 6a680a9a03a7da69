//! `auto`'s decision rule on its own: properties of the rule, and a small closed loop of
//! one worker whose batch of n takes a + b n, driven in virtual time.

use super::*;
use proptest::prelude::*;

const MS: Nanos = 1_000_000;

fn group(queued: usize, latest: Nanos) -> Group {
    Group {
        queued,
        tokens: 100 * queued as u64,
        room: 32 - queued,
        bucket: None,
        latest,
        oldest: 0,
        other_free_in: None,
        free_workers: 1,
    }
}

/// An `Auto` that has seen `cycles` completions of `clients` requests (a = 10 ms,
/// b = 2 ms per request, alternating sizes so both are identifiable), each followed by
/// the clients coming back `rtt` later. Returns it and the time of the last completion.
fn trained(clients: usize, rtt: Nanos, cycles: usize) -> (Auto, Nanos) {
    let mut auto = Auto::default();
    let mut now = 0;
    for i in 0..cycles {
        let n = if i % 2 == 0 {
            clients
        } else {
            clients.div_ceil(2)
        };
        now += 10 * MS + 2 * MS * n as u64;
        auto.observe_completion(now, n, 100 * n as u64, Some(10 * MS + 2 * MS * n as u64));
        for _ in 0..n {
            auto.observe_arrival(now + rtt, 0, 0);
        }
    }
    now += 30 * MS;
    (auto, now)
}

#[test]
fn goes_at_once_before_any_batch_completed() {
    let mut auto = Auto::default();
    auto.observe_arrival(0, 0, 0);
    assert_eq!(auto.decide(0, &group(1, 100 * MS)), Decision::Go);
}

#[test]
fn holds_for_a_group_about_to_come_back() {
    let rtt = 300_000;
    let (mut auto, now) = trained(4, rtt, 40);
    // Four completed; four others wait. The four answered come back in ~rtt.
    auto.observe_completion(now, 4, 400, Some(18 * MS));
    let d = auto.decide(now, &group(4, now + 100 * MS));
    let Decision::HoldUntil(t) = d else {
        panic!("expected a hold, got {d:?}")
    };
    assert!(t > now + rtt && t < now + 2 * rtt, "held {} ns", t - now);
}

#[test]
fn never_holds_when_a_batch_has_no_fixed_cost() {
    let mut auto = Auto::default();
    for i in 0..40u64 {
        let n = 1 + i % 4;
        // a = 0, b = 5 ms: two batches cost what one does.
        auto.observe_completion(i * 100 * MS, n as usize, 0, Some(5 * MS * n));
        for _ in 0..n {
            auto.observe_arrival(i * 100 * MS + 100_000, 0, 0);
        }
    }
    auto.observe_completion(5000 * MS, 4, 0, Some(21 * MS));
    assert_eq!(auto.decide(5000 * MS, &group(1, 6000 * MS)), Decision::Go);
}

#[test]
fn the_snapshot_tells_a_closed_loop_from_bursts() {
    // A closed loop: every arrival answers a completion 300 us earlier; completions come
    // every 18-26 ms, so about 1 - a / 22 ms of the arrivals fall within a = 10 ms.
    let (auto, _) = trained(8, 300_000, 40);
    let closed = auto.snapshot();
    assert!(closed.echo_fraction > 0.3, "{closed:?}");
    // Bursts of 10 arrivals 10 us apart every 100 ms, beside batches that complete every
    // 100 ms as well (so the echo model has completions to relate arrivals to): landing
    // 50 ms after a completion, the bursts do not answer it; landing 300 us after it, the
    // same bursts look exactly like a closed loop's clients coming back.
    let bursts = |after_completion_ns: Nanos| {
        let mut auto = Auto::default();
        for burst in 0..50u64 {
            let done = burst * 100 * MS;
            let n = if burst % 2 == 0 { 10 } else { 5 };
            auto.observe_completion(done, n, 0, Some(10 * MS + 2 * MS * n as u64));
            for i in 0..10u64 {
                auto.observe_arrival(done + after_completion_ns + i * 10_000, 0, 0);
            }
        }
        auto.snapshot()
    };
    let bursty = bursts(50 * MS);
    assert!(bursty.echo_fraction < 0.05, "{bursty:?}");
    assert!(bursty.arrival_burstiness > 2.0, "{bursty:?}");
    let echoing = bursts(300_000);
    assert!(echoing.echo_fraction > 0.8, "{echoing:?}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Whatever was learned, a hold never ends past the group's latest instant, nor after
    /// the last joiner the model can expect is due: the clients come back one round trip
    /// after the completion, so every echo is in by the end of the round trip's bin (a
    /// quarter octave: under 1.19 x the round trip). Past that the benefit only falls, so a
    /// longer hold would be a wrong argmax; nothing clamps the wait there (the rule's
    /// horizon is the batch time, 10 ms and more here), so this can fail.
    #[test]
    fn never_holds_past_latest_or_the_last_expected_joiner(
        clients in 1usize..40,
        rtt_us in 1u64..5_000,
        queued in 1usize..31,
        latest_ms in 0u64..200,
        offset_us in 0u64..20_000,
    ) {
        let rtt = rtt_us * 1000;
        let (mut auto, now) = trained(clients, rtt, 30);
        auto.observe_completion(now, clients, 0, Some(10 * MS));
        let at = now + offset_us * 1000;
        let latest = at + latest_ms * MS;
        let last_joiner_due = now + (rtt as f64 * 1.19).max(4096.0) as Nanos + 1;
        if let Decision::HoldUntil(t) = auto.decide(at, &group(queued, latest)) {
            prop_assert!(t > at);
            prop_assert!(t <= latest, "held to {t}, latest {latest}");
            prop_assert!(
                t <= last_joiner_due,
                "held {} ns past the completion, the last joiner is due by {} ns",
                t - now,
                last_joiner_due - now
            );
        }
    }

    /// A batch that costs less than a hold's own overhead (latency model `none`: a few
    /// microseconds, here learned from a closed loop of several clients with a jittery
    /// round trip) is never worth holding: every decision dispatches at once.
    #[test]
    fn never_holds_for_a_batch_cheaper_than_a_wake_up(
        clients in 2usize..16,
        a_us in 1u64..19,
        rtt_us in 1u64..200,
        seed in 0u64..1000,
    ) {
        let a = a_us * 1000;
        let mut auto = Auto::default();
        let mut now = 0;
        for i in 0..200u64 {
            let n = 1 + ((seed + i) % clients as u64) as usize;
            now += a;
            auto.observe_completion(now, n, 0, Some(a));
            for k in 0..n as u64 {
                let back = now + rtt_us * 1000 * (1 + (seed + k) % 3) / 2;
                auto.observe_arrival(back, 0, 0);
                let queued = 1 + k as usize;
                prop_assert_eq!(auto.decide(back, &group(queued, back + 100 * MS)), Decision::Go);
            }
            now += 2 * rtt_us * 1000;
        }
    }

    /// One client: its request is the only one, so once it is queued nothing else can come,
    /// and `auto` dispatches it at once, whatever the round trip.
    #[test]
    fn never_holds_with_one_client(rtt_us in 1u64..20_000, cycles in 1usize..60) {
        let mut auto = Auto::default();
        let mut now = 0;
        for _ in 0..cycles {
            now += 12 * MS;
            auto.observe_completion(now, 1, 100, Some(12 * MS));
            now += rtt_us * 1000;
            auto.observe_arrival(now, 0, 0);
            prop_assert_eq!(auto.decide(now, &group(1, now + 100 * MS)), Decision::Go);
        }
    }
}

/// A closed loop: `clients` clients, each sending its next request a round trip (`rtt`
/// +- 50 %, seeded) after its answer, the first ones `rtt / 4` apart; one worker whose
/// batch of n takes `a + b n`; batches of at most 32. `greedy` dispatches whenever the
/// worker is free (work-conserving) instead of asking `auto`. Returns requests completed
/// per second after a warm-up, in virtual time.
fn closed_loop_throughput(clients: usize, a: Nanos, b: Nanos, rtt: Nanos, greedy: bool) -> f64 {
    use rand::{Rng, SeedableRng};
    const MAX_BATCH: usize = 32;
    let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
    let mut auto = Auto::for_concurrency(1, 32);
    let mut queue: Vec<Nanos> = Vec::new();
    // When each outstanding client request arrives.
    let mut returning: Vec<Nanos> = (0..clients as u64).map(|i| i * rtt / 4).collect();
    let mut busy_until: Option<(Nanos, usize)> = None;
    let mut hold_until: Option<Nanos> = None;
    let mut now: Nanos = 0;
    let (warmup, measure) = (200usize, 1000usize);
    let mut batches = 0usize;
    let mut completed_after_warmup = 0usize;
    let mut t_start = 0;
    loop {
        // Next event: a completion, an arrival or a hold deadline.
        let next = [
            busy_until.map(|(t, _)| t),
            returning.iter().copied().min(),
            hold_until,
        ]
        .into_iter()
        .flatten()
        .min()
        .expect("something is always pending");
        now = now.max(next);
        if let Some((t, n)) = busy_until {
            if t <= now {
                busy_until = None;
                auto.observe_completion(now, n, 0, Some(a + b * n as u64));
                for _ in 0..n {
                    returning.push(now + rtt / 2 + rng.gen_range(0..=rtt));
                }
                batches += 1;
                if batches == warmup {
                    t_start = now;
                } else if batches > warmup {
                    completed_after_warmup += n;
                }
                if batches == warmup + measure {
                    return completed_after_warmup as f64 * 1e9 / (now - t_start) as f64;
                }
            }
        }
        returning.retain(|&t| {
            if t <= now {
                queue.push(t);
                auto.observe_arrival(now, 0, 0);
                false
            } else {
                true
            }
        });
        if hold_until.is_some_and(|t| t <= now) {
            hold_until = None;
        }
        if busy_until.is_none() && !queue.is_empty() {
            let q = queue.len();
            let go = q >= MAX_BATCH
                || greedy
                || match auto.decide(
                    now,
                    &Group {
                        queued: q,
                        tokens: 0,
                        room: MAX_BATCH - q,
                        bucket: None,
                        latest: queue[0] + 100 * MS,
                        oldest: queue[0],
                        other_free_in: None,
                        free_workers: 1,
                    },
                ) {
                    Decision::Go => true,
                    Decision::HoldUntil(t) => {
                        hold_until = Some(t);
                        false
                    }
                };
            if go {
                hold_until = None;
                let n = q.min(MAX_BATCH);
                queue.drain(..n);
                busy_until = Some((now + a + b * n as u64, n));
            }
        }
    }
}

/// The best possible throughput (requests per second) of `clients` closed-loop clients
/// against one worker whose batch of n takes `a + b n`, batches of at most `max_batch`, each
/// client back a round trip after its answer (`rtt_mean` on average, `rtt_longest` at
/// most). Exact where the tests ask:
/// - at most a full batch of clients: a batch of everyone, then everyone's round trip
///   before the next: `n` per `a + b n + rtt_mean`;
/// - at least twice a full batch: while one full batch runs, the clients of the one before
///   come back (`rtt_longest` is shorter than a batch), so the next full batch is queued
///   when the worker frees up and the round trip is hidden: `max_batch` per
///   `a + b max_batch`.
///
/// In between, part of the round trip is hidden and no simple bound is exact; asking there
/// is a test bug.
pub(crate) fn best_possible(
    clients: usize,
    max_batch: usize,
    (a, b): (Nanos, Nanos),
    rtt_mean: f64,
    rtt_longest: Nanos,
) -> f64 {
    if clients <= max_batch {
        let n = clients as f64;
        return n * 1e9 / (a as f64 + b as f64 * n + rtt_mean);
    }
    assert!(
        clients >= 2 * max_batch,
        "no exact best for {clients} clients and batches of {max_batch}"
    );
    let full_batch_ns = a + b * max_batch as Nanos;
    assert!(
        rtt_longest < full_batch_ns,
        "a round trip of {rtt_longest} ns is not hidden by a batch of {full_batch_ns} ns"
    );
    max_batch as f64 * 1e9 / full_batch_ns as f64
}

#[test]
fn the_best_possible_hides_the_round_trip_only_behind_a_queued_full_batch() {
    let (a, b) = (MS, MS / 10);
    // 8 clients: one batch of 8 (1.8 ms) and a 0.1 ms round trip, 8 per 1.9 ms.
    let eight = best_possible(8, 32, (a, b), 100_000.0, 150_000);
    assert!((eight - 8.0 / 1.9e-3).abs() < 1e-6, "{eight}");
    // 64 and 256 clients: a full batch of 32 every 4.2 ms, the round trip hidden.
    for clients in [64, 256] {
        let full = best_possible(clients, 32, (a, b), 100_000.0, 150_000);
        assert!((full - 32.0 / 4.2e-3).abs() < 1e-6, "{full}");
    }
}

/// The closed-loop goal at the rule's level: told nothing about a, b or the client
/// count, `auto` reaches 95 % of the best possible throughput at every point, where
/// work-conserving dispatch (the same harness, `greedy`) falls to about half.
#[test]
fn closed_loop_reaches_95_percent_of_the_best_possible() {
    let rtt = 50_000; // 50 us: a client on loopback
    let mut worst_auto = (f64::MAX, 0, 0, 0);
    let mut worst_greedy = f64::MAX;
    for (a, b) in [
        (10 * MS, 2 * MS),
        (MS, 100_000),
        (50 * MS, 100_000),
        (5 * MS, 5 * MS),
        (20 * MS, MS),
    ] {
        for clients in [1usize, 2, 8, 32, 64, 256] {
            // Round trips rtt / 2 + U(0, rtt): rtt on average, 1.5 rtt at most.
            let best = best_possible(clients, 32, (a, b), rtt as f64, rtt * 3 / 2);
            let auto = closed_loop_throughput(clients, a, b, rtt, false) / best;
            let greedy = closed_loop_throughput(clients, a, b, rtt, true) / best;
            eprintln!("a={a} b={b} clients={clients} auto={auto:.3} greedy={greedy:.3}");
            if auto < worst_auto.0 {
                worst_auto = (auto, clients, a, b);
            }
            worst_greedy = worst_greedy.min(greedy);
        }
    }
    assert!(
        worst_auto.0 >= 0.95,
        "worst {:.3} of the best possible at {} clients, a = {} ns, b = {} ns",
        worst_auto.0,
        worst_auto.1,
        worst_auto.2,
        worst_auto.3
    );
    assert!(
        worst_greedy < 0.6,
        "the harness must show what waiting buys: {worst_greedy}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(100))]

    /// Bursts of `size` requests `gap_us` apart, not tied to completions: at the first
    /// request of a new burst, `auto` holds for the rest (a = 10 ms, b = 0.1 ms per request),
    /// and never past the group's latest instant.
    #[test]
    fn waits_when_a_burst_is_arriving(size in 4u64..32, gap_us in 5u64..200) {
        let mut auto = Auto::default();
        let period = 500 * MS;
        let gap = gap_us * 1000;
        for burst in 0..60u64 {
            let start = burst * period;
            for i in 0..size {
                auto.observe_arrival(start + i * gap, 0, 0);
            }
            let n = 1 + burst as usize % 4;
            // Completions in between bursts, unrelated to them.
            auto.observe_completion(start + period / 2, n, 0, Some(10 * MS + 100_000 * n as u64));
        }
        let now = 60 * period;
        auto.observe_arrival(now, 0, 0);
        let latest = now + 50 * MS;
        let d = auto.decide(now, &group(1, latest));
        let Decision::HoldUntil(t) = d else {
            return Err(TestCaseError::fail(format!("expected a hold, got {d:?}")));
        };
        prop_assert!(t > now && t <= latest);
        prop_assert!(t - now <= size * gap + gap, "held {} ns for a burst of {} ns", t - now, size * gap);
    }
}

/// An `Auto` that has seen a steady open stream (one arrival a millisecond, not answering
/// completions) and batches of 8-12 completing every 10 ms at a = 10 ms, b = 0.1 ms.
/// Returns it and the time of the last arrival.
fn trained_on_a_stream() -> (Auto, Nanos) {
    let mut auto = Auto::default();
    let mut now = 0;
    for i in 0..400u64 {
        now = i * MS;
        auto.observe_arrival(now, 0, 0);
        if i % 10 == 5 {
            // Completions fall anywhere between two arrivals, as they do in an open loop.
            let n = 8 + (i / 10 % 5) as usize;
            let at = now + (i * 370_000) % MS;
            auto.observe_completion(at, n, 100 * n as u64, Some(10 * MS + MS / 10 * n as u64));
        }
    }
    (auto, now)
}

#[test]
fn paces_a_steady_stream_when_another_worker_frees_first() {
    let (mut auto, now) = trained_on_a_stream();
    let mut g = group(1, now + 100 * MS);
    // Another worker frees in 8 ms, before this batch would end (~10 ms): about 8 arrivals
    // would wait for it; the gain peaks near (8 - 1) / 2 ms.
    g.other_free_in = Some(8 * MS);
    let d = auto.decide(now, &g);
    let Decision::HoldUntil(t) = d else {
        panic!("expected a pacing hold, got {d:?}")
    };
    assert!(t > now + 2 * MS && t < now + 6 * MS, "held {} ns", t - now);
    assert_eq!(auto.holds().1.reason, HoldReason::Pacing);
}

#[test]
fn does_not_pace_without_another_worker_or_with_enough_queued() {
    let (mut auto, now) = trained_on_a_stream();
    // One worker: no pacing (the echo rule alone decides).
    let held_before = auto.holds().0;
    if let Decision::HoldUntil(_) = auto.decide(now, &group(1, now + 100 * MS)) {
        assert!(auto.holds().0 > held_before);
        assert_ne!(auto.holds().1.reason, HoldReason::Pacing);
    }
    // More queued than would arrive before the other worker frees (10 against ~5).
    let mut g = group(10, now + 100 * MS);
    g.other_free_in = Some(5 * MS);
    assert_eq!(auto.decide(now, &g), Decision::Go);
    // The other worker frees after this batch would end: this worker is the next free one.
    let mut g = group(1, now + 100 * MS);
    g.other_free_in = Some(50 * MS);
    assert_eq!(auto.decide(now, &g), Decision::Go);
    // Never past the group's latest instant.
    let mut g = group(1, now + MS);
    g.other_free_in = Some(8 * MS);
    match auto.decide(now, &g) {
        Decision::Go => {}
        Decision::HoldUntil(t) => assert!(t <= now + MS, "held past latest: {}", t - now),
    }
}

/// An `Auto` that has seen bursts of 24 requests 100 us apart every 100 ms, answered in
/// batches of 8 and 12 at a = 30 ms, b = 0.2 ms, and the first request of a new burst.
/// Returns it and that request's arrival.
fn trained_on_bursts() -> (Auto, Nanos) {
    let mut auto = Auto::default();
    for burst in 0..60u64 {
        let start = burst * 100 * MS;
        for i in 0..24 {
            auto.observe_arrival(start + i * 100_000, 0, 0);
        }
        let n = if burst % 2 == 0 { 8 } else { 12 };
        auto.observe_completion(
            start + 50 * MS,
            n,
            100 * n as u64,
            Some(30 * MS + n as u64 * MS / 5),
        );
    }
    let now = 60 * 100 * MS;
    auto.observe_arrival(now, 0, 0);
    (auto, now)
}

#[test]
fn splits_a_burst_over_the_free_workers() {
    let (mut auto, start) = trained_on_bursts();
    let now = start + 10_000;
    let mut g = group(1, now + 100 * MS);
    g.free_workers = 3;
    // About 19.5 more expected (the learned sizes still remember the first, smaller
    // bursts), 100 us apart, three workers free: the first batch waits for about a third
    // of the burst, 6 more, the 6th due 590 us from now.
    let d = auto.decide(now, &g);
    assert_eq!(d, Decision::HoldUntil(now + 590_000));
    let hold = auto.holds().1;
    assert_eq!(hold.reason, HoldReason::Burst);
    assert_eq!(hold.expected_joiners, 6.0);
    // Two free: the first batch takes about half, 9 more.
    g.free_workers = 2;
    let d = auto.decide(now, &g);
    assert_eq!(
        d,
        Decision::HoldUntil(now + 890_000),
        "{:?}",
        auto.holds().1
    );
    // With half of it waiting already, the batch goes.
    let mut g = group(12, now + 100 * MS);
    g.free_workers = 3;
    assert_eq!(auto.decide(now, &g), Decision::Go);
    // Never past the group's latest instant.
    let mut g = group(1, now + 200_000);
    g.free_workers = 3;
    match auto.decide(now, &g) {
        Decision::Go => {}
        Decision::HoldUntil(t) => assert!(t <= now + 200_000, "held past latest: {}", t - now),
    }
}
