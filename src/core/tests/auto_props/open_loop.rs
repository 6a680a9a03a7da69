//! The open-loop half of `auto`'s property harness: arrivals that do not answer completions
//! (Poisson, or bursts whose starts are Poisson), drawn from a seed, in virtual time, each
//! held to the best fixed window in hindsight on the same arrivals.
//!
//! A case draws: a fixed cost `a` (0.2-50 ms) and a per-request cost `b` (0-a/4 per 8
//! requests, as the closed-loop cases), the cost's shape (linear, concave, step), 1-4
//! workers, a max batch of 8-64, a load of 30-90 % of capacity (`W max / S(max)` requests
//! per second), and the arrivals: Poisson, or bursts of 2-32 requests 5-200 us apart. The
//! properties, on the latencies (arrival to answer) of every request after the first
//! [`WARMUP`]:
//! - `auto`'s p50 and p99 within [`WINDOW_SLACK`] (3 %) of the best in hindsight: the least
//!   p50 and the least p99 over work-conserving dispatch and a grid of `fixed` windows
//!   ([`windows`]), each taken where it is best (so the two may come from two windows);
//! - `auto`'s p50 and p99 never more than [`WC_SLACK`] (1 %) above work-conserving dispatch
//!   (window 0).
//!
//! `AUTO_PROPS_OPEN_SEEDS=N` runs seeds `0..N` (default [`SEEDS_IN_TEST_RUN`]), and
//! `AUTO_PROPS_OPEN_REQUESTS=R` draws `R` requests a case instead of [`REQUESTS`] (a long
//! run: less of it is `auto` learning, and its p99 rests on more requests);
//! `AUTO_PROPS_OPEN_SEED=S` replays one. A failure prints its seed, its case and every
//! schedule's p50 and p99.

use crate::core::strategy::StrategyKind;
use crate::core::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const MS: Nanos = 1_000_000;

/// Seeds in the normal test run (a debug build runs each in about a fifth of a second).
const SEEDS_IN_TEST_RUN: u64 = 24;

/// Requests per case, and the first ones left out of the percentiles (`auto` learning).
const REQUESTS: usize = 4_000;
const WARMUP: usize = 500;

/// `auto` against the best window in hindsight, and against work-conserving dispatch.
const WINDOW_SLACK: f64 = 1.03;
const WC_SLACK: f64 = 1.01;

/// What [`auto_stays_within_its_measured_open_loop_envelope`] holds over the test run's
/// seeds, on the harness's draw of their arrivals and on a second draw: misses of the
/// bounds above, the worst ratios to the best window and to work-conserving dispatch, and
/// the median ratio to the best window.
///
/// Draw 0 (8 misses of 24 measured; the worst ratios 1.226 to the best window, seed 13, and
/// 1.042 to work-conserving, seed 3, measured with the window replay at eb892fd plus its
/// batch-cap fix; 10 misses, 1.153 and 1.017 before it, which gained 6 of 100 drawn cases
/// and lost ground in seeds 3 and 13; the median 1.020): the margins let a change move a
/// case a little, not lose one.
const ENVELOPE_DRAW_0: Envelope = Envelope {
    misses: 9,
    window: 1.30,
    wc: 1.06,
    median: WINDOW_SLACK,
};

/// Draw 1, the same cases with other random arrivals (2026-11-29: 13 misses of 24, the worst
/// 1.266 to the best window, seed 17, and 1.066 to work-conserving, seed 3; the median
/// 1.030). `auto`'s rules were tuned looking at draw 0, which flatters it by five cases
/// (BENCHMARKS.md, issue 25's seventeenth round); held so that tuning on draw 0 alone
/// shows when it costs elsewhere.
const ENVELOPE_DRAW_1: Envelope = Envelope {
    misses: 14,
    window: 1.34,
    wc: 1.09,
    median: 1.04,
};

/// Bounds on what `auto` reaches over the test run's seeds on one draw.
struct Envelope {
    misses: usize,
    window: f64,
    wc: f64,
    median: f64,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Shape {
    Linear,
    Concave,
    Step,
}

#[derive(Clone, Copy, Debug)]
struct OpenCase {
    seed: u64,
    workers: usize,
    max_batch: usize,
    a: Nanos,
    b: Nanos,
    shape: Shape,
    /// Offered load, a share of capacity.
    load: f64,
    /// Requests per burst (1: Poisson) and the gap inside a burst, ns.
    burst: usize,
    gap: Nanos,
    /// Requests in the case ([`REQUESTS`] unless a long run asks for more).
    requests: usize,
    /// Which draw of the case's arrivals (0: the harness's; others: the same process drawn
    /// again, for [`a_window_chosen_on_other_draws_against_the_best_in_hindsight`]).
    draw: u64,
}

impl OpenCase {
    fn from_seed(seed: u64) -> OpenCase {
        let mut rng = SmallRng::seed_from_u64(seed ^ 0x09e7_100b);
        let workers = rng.gen_range(1..=4usize);
        let max_batch = [8usize, 16, 32, 64][rng.gen_range(0..4)];
        let a = (rng.gen_range(0.2f64..50.0) * MS as f64) as Nanos;
        let b = (rng.gen_range(0.0f64..0.25) * a as f64) as Nanos / 8;
        let shape = [Shape::Linear, Shape::Concave, Shape::Step][rng.gen_range(0..3)];
        let load = rng.gen_range(0.3..0.9);
        let (burst, gap) = if rng.gen_bool(0.5) {
            (1, 0)
        } else {
            (rng.gen_range(2..=32usize), rng.gen_range(5_000..200_000))
        };
        OpenCase {
            seed,
            workers,
            max_batch,
            a,
            b,
            shape,
            load,
            burst,
            gap,
            requests: REQUESTS,
            draw: 0,
        }
    }

    /// Service time of a batch of `n`, ns.
    fn cost(&self, n: usize) -> Nanos {
        let variable = match self.shape {
            Shape::Linear => self.b as f64 * n as f64,
            Shape::Concave => self.b as f64 * (n as f64 * self.max_batch as f64).sqrt(),
            Shape::Step => self.b as f64 * (8 * n.div_ceil(8)) as f64,
        };
        (self.a as f64 + variable) as Nanos
    }

    /// Requests per second the workers serve in full batches.
    fn capacity_per_s(&self) -> f64 {
        self.workers as f64 * self.max_batch as f64 * 1e9 / self.cost(self.max_batch) as f64
    }

    /// Arrival instants, sorted: bursts (or single requests) starting as a Poisson process
    /// at the case's load.
    fn arrivals(&self) -> Vec<Nanos> {
        let mut rng = SmallRng::seed_from_u64(
            self.seed ^ 0xa441_7a15 ^ self.draw.wrapping_mul(0x9e37_79b9_7f4a_7c15),
        );
        let mean_gap_ns = 1e9 * self.burst as f64 / (self.load * self.capacity_per_s());
        let mut out = Vec::with_capacity(self.requests);
        let mut t = 0.0f64;
        while out.len() < self.requests {
            t += -(1.0 - rng.gen::<f64>()).ln() * mean_gap_ns;
            for i in 0..self.burst.min(self.requests - out.len()) {
                out.push(t as Nanos + i as Nanos * self.gap);
            }
        }
        out.sort_unstable();
        out
    }
}

/// A core for `case`: `auto` as it runs by default, or `fixed` with a window of
/// `window_ns` (0: work-conserving, a batch whenever a worker is free).
fn config(case: &OpenCase, strategy: StrategyKind, window_ns: Nanos) -> CoreConfig {
    let mut cfg = CoreConfig {
        workers: case.workers,
        max_batch_size: case.max_batch,
        max_inflight_per_worker: 1,
        strategy,
        ..CoreConfig::default()
    };
    if strategy == StrategyKind::Fixed {
        cfg.dispatch_when_idle = window_ns == 0;
        cfg.strategy_params.max_wait_ms = window_ns as f64 / MS as f64;
        cfg.priority_max_wait_ms = [1e6; Priority::COUNT];
    }
    cfg
}

/// The windows of the grid: 1/16 to 1 of a batch's fixed cost, and for bursts 1/2 to 2 of
/// a burst's span.
fn windows(case: &OpenCase) -> Vec<Nanos> {
    let a = case.a as f64;
    let mut out: Vec<Nanos> = [0.0625, 0.125, 0.25, 0.5, 1.0]
        .iter()
        .map(|k| (k * a) as Nanos)
        .collect();
    if case.burst > 1 {
        let span = (case.burst - 1) as f64 * case.gap as f64;
        out.extend([0.5, 1.0, 2.0].iter().map(|k| (k * span) as Nanos));
    }
    out.retain(|&w| w > 0);
    out
}

/// Latencies of the requests after [`WARMUP`] (arrival to answer, ns), sorted.
fn latencies(case: &OpenCase, arrivals: &[Nanos], cfg: CoreConfig) -> Vec<Nanos> {
    let mut core = Core::new(cfg);
    let mut index_of: Vec<usize> = vec![usize::MAX; core.config().queue_capacity];
    let mut out = Vec::with_capacity(arrivals.len());
    let mut busy: Vec<Option<(Nanos, BatchId)>> = vec![None; case.workers];
    let mut wake: Option<Nanos> = None;
    let (mut next, mut answered, mut now) = (0usize, 0usize, 0);
    while answered < arrivals.len() {
        now = busy
            .iter()
            .flatten()
            .map(|&(t, _)| t)
            .chain(arrivals.get(next).copied())
            .chain(wake)
            .min()
            .expect("work remains")
            .max(now);
        for slot in busy.iter_mut() {
            let Some((t, batch)) = *slot else { continue };
            if t > now {
                continue;
            }
            *slot = None;
            for ticket in core.batch_tickets(batch) {
                let i = index_of[ticket.index as usize];
                answered += 1;
                if i >= WARMUP {
                    out.push(now - arrivals[i]);
                }
            }
            assert_eq!(
                core.complete(now, batch, BatchOutcome::Ok),
                Completion::Deliver
            );
        }
        while arrivals.get(next).is_some_and(|&t| t <= now) {
            let mut meta = RequestMeta::new(Priority::Normal, Kind::Completion, 0, 0, now);
            meta.tokens_estimated = 20;
            let ticket = core.admit(now, meta).expect("the queue has room");
            index_of[ticket.index as usize] = next;
            next += 1;
        }
        wake = core.poll(now, &mut |action| {
            if let Action::Dispatch {
                worker,
                tickets,
                batch,
                ..
            } = action
            {
                assert!(busy[worker].is_none(), "one batch per worker at a time");
                busy[worker] = Some((now + case.cost(tickets.len()), batch));
            }
        });
        wake = wake.filter(|&t| t > now);
    }
    out.sort_unstable();
    out
}

/// p50 and p99 of sorted latencies, ms.
fn p50_p99(sorted: &[Nanos]) -> (f64, f64) {
    let at = |p: f64| sorted[((sorted.len() - 1) as f64 * p) as usize] as f64 / MS as f64;
    (at(0.5), at(0.99))
}

fn seeds() -> Vec<u64> {
    if let Ok(s) = std::env::var("AUTO_PROPS_OPEN_SEED") {
        return vec![s.parse().expect("AUTO_PROPS_OPEN_SEED is a number")];
    }
    let n = std::env::var("AUTO_PROPS_OPEN_SEEDS").map_or(SEEDS_IN_TEST_RUN, |s| {
        s.parse().expect("AUTO_PROPS_OPEN_SEEDS is a number")
    });
    (0..n).collect()
}

/// The kinds of drawn case the summary counts apart (index: 2 x bursty + several workers).
const KINDS: [&str; 4] = [
    "Poisson, one worker",
    "Poisson, several workers",
    "bursts, one worker",
    "bursts, several workers",
];

/// One drawn case judged: `auto` against the best window in hindsight and against
/// work-conserving dispatch.
struct Judged {
    /// The worse of `auto`'s p50 and p99 over the least of each among the schedules.
    window_ratio: f64,
    /// The worse of `auto`'s p50 and p99 over work-conserving dispatch's.
    wc_ratio: f64,
    /// How close one window comes to both the least p50 and the least p99 (the worse of
    /// its two ratios, at its best): whether a miss is `auto`'s or the bound's.
    one_window: f64,
    /// Its kind, for the summary's breakdown: [`KINDS`]'s index.
    kind: usize,
    /// The case's line (`open seed S: ...`), and every schedule's p50 / p99.
    line: String,
    table: String,
}

impl Judged {
    /// Case `seed` with `requests` requests.
    fn of(seed: u64, requests: usize) -> Judged {
        Judged::of_draw(seed, requests, 0)
    }

    /// Case `seed` with `requests` requests, on draw `draw` of its arrivals.
    fn of_draw(seed: u64, requests: usize, draw: u64) -> Judged {
        let case = OpenCase {
            requests,
            draw,
            ..OpenCase::from_seed(seed)
        };
        let schedules = Schedules::of(&case);
        let (auto, wc, best) = (schedules.auto, schedules.wc, schedules.best());
        let mut table = format!("work-conserving {:.3} / {:.3} ms", wc.0, wc.1);
        for &(w, r) in &schedules.windows {
            table += &format!("; {:.3} ms: {:.3} / {:.3}", w as f64 / MS as f64, r.0, r.1);
        }
        let window_ratio = (auto.0 / best.0).max(auto.1 / best.1);
        let wc_ratio = (auto.0 / wc.0).max(auto.1 / wc.1);
        // The least p50 and the least p99 may come from two windows.
        let one_window = schedules
            .fixed()
            .map(|r| (r.0 / best.0).max(r.1 / best.1))
            .fold(f64::INFINITY, f64::min);
        let line = format!(
            "open seed {seed}: auto p50 {:.3} p99 {:.3} ms; / best window {window_ratio:.3} \
             (one window at best {one_window:.3}), / work-conserving {wc_ratio:.3}: {case:?}",
            auto.0, auto.1
        );
        Judged {
            window_ratio,
            wc_ratio,
            one_window,
            kind: usize::from(case.burst > 1) * 2 + usize::from(case.workers > 1),
            line,
            table,
        }
    }

    /// Whether the case misses the bounds.
    fn misses(&self) -> bool {
        self.window_ratio > WINDOW_SLACK || self.wc_ratio > WC_SLACK
    }

    /// The miss as a failure prints it: the line, the seed that replays it, the table.
    fn report(&self, seed: u64) -> String {
        format!(
            "{} (bounds {WINDOW_SLACK} and {WC_SLACK}; replay: AUTO_PROPS_OPEN_SEED={seed})\n  {}",
            self.line, self.table
        )
    }
}

/// The open-loop goal over drawn cases. Prints one line per case (`--nocapture`)
/// and every miss with the seed that replays it.
///
/// Not in the default test run: `auto` misses it today (2026-11-28, 100 seeds: 40 misses,
/// 46 before the window replay, 52 before bursty streams were paced, 57 before the burst
/// split, 79 before the pacing rule; BENCHMARKS.md, issue 25's fifth, sixth, eighth and
/// eleventh rounds). Poisson streams over
/// several workers are paced now ([`auto_paces_steady_streams_over_several_workers`] holds
/// that in the test run), a burst over free workers is split
/// ([`auto_splits_a_burst_over_the_free_workers`]), and bursty streams over busy workers
/// are paced when they do not answer completions; those still miss by up to 26 %. What
/// the test run holds instead is [`auto_stays_within_its_measured_open_loop_envelope`].
/// Run it with `tools/auto_props.sh N open [REQUESTS]`.
#[test]
#[ignore = "auto misses the open-loop goal today; tools/auto_props.sh N open runs it"]
fn auto_matches_the_best_window_in_hindsight_over_drawn_open_loops() {
    let mut misses = Vec::new();
    let (mut worst_window, mut worst_wc) = (0.0f64, 0.0f64);
    let mut cases = 0;
    // Misses where one window comes within 1 % of both the least p50 and the least p99.
    let mut reachable_misses = 0;
    // Cases where one fixed schedule in hindsight comes within the bound of both.
    let mut one_window_meets = 0;
    // Per kind of case: cases, met by `auto`, met by one fixed schedule in hindsight.
    let mut by_kind = [(0usize, 0usize, 0usize); KINDS.len()];
    let requests = std::env::var("AUTO_PROPS_OPEN_REQUESTS").map_or(REQUESTS, |s| {
        s.parse()
            .expect("AUTO_PROPS_OPEN_REQUESTS is a number of requests")
    });
    assert!(
        requests > 2 * WARMUP,
        "at least {} requests a case",
        2 * WARMUP
    );
    for seed in seeds() {
        let judged = Judged::of(seed, requests);
        println!("{}", judged.line);
        cases += 1;
        worst_window = worst_window.max(judged.window_ratio);
        worst_wc = worst_wc.max(judged.wc_ratio);
        one_window_meets += usize::from(judged.one_window <= WINDOW_SLACK);
        let kind = &mut by_kind[judged.kind];
        kind.0 += 1;
        kind.1 += usize::from(!judged.misses());
        kind.2 += usize::from(judged.one_window <= WINDOW_SLACK);
        if judged.misses() {
            reachable_misses += usize::from(judged.one_window <= 1.01);
            misses.push(judged.report(seed));
        }
    }
    println!(
        "{cases} open cases of {requests} requests: worst against the best window \
         {worst_window:.3}, against work-conserving {worst_wc:.3}; {} misses, \
         {reachable_misses} of them where one window comes within 1 % of both the least p50 \
         and the least p99; one fixed schedule in hindsight comes within {WINDOW_SLACK} of \
         both in {one_window_meets}",
        misses.len()
    );
    for (name, (n, met, one)) in KINDS.iter().zip(by_kind) {
        println!("  {name}: {n} cases, auto meets {met}, one fixed schedule in hindsight {one}");
    }
    assert!(misses.is_empty(), "{}", misses.join("\n"));
}

/// What `auto` does reach in open loops today, held in the test run so that it cannot
/// slip unseen while the goal ([`auto_matches_the_best_window_in_hindsight_over_drawn_open_loops`])
/// is missed: over seeds `0..SEEDS_IN_TEST_RUN` (the simulation is in virtual time, so
/// these are exact, not timings), on draw 0 ([`ENVELOPE_DRAW_0`]) and draw 1
/// ([`ENVELOPE_DRAW_1`]) of their arrivals:
/// - at most `misses` of the 24 cases miss the bounds;
/// - none is more than `window` above the best window in hindsight or `wc` above
///   work-conserving dispatch;
/// - the median ratio to the best window is within `median`.
///
/// A change that improves `auto` passes; one that loses a case, or loses ground anywhere
/// by more than the margins, fails with every miss and the seed that replays it. Lower
/// the constants when `auto` gains.
#[test]
fn auto_stays_within_its_measured_open_loop_envelope() {
    for (draw, envelope) in [(0, ENVELOPE_DRAW_0), (1, ENVELOPE_DRAW_1)] {
        let judged: Vec<(u64, Judged)> = (0..SEEDS_IN_TEST_RUN)
            .map(|seed| (seed, Judged::of_draw(seed, REQUESTS, draw)))
            .collect();
        let all = || {
            judged
                .iter()
                .map(|(s, j)| j.report(*s))
                .collect::<Vec<_>>()
                .join("\n")
        };
        let misses = judged.iter().filter(|(_, j)| j.misses()).count();
        assert!(
            misses <= envelope.misses,
            "draw {draw}: {misses} of {SEEDS_IN_TEST_RUN} open cases miss (at most {}):\n{}",
            envelope.misses,
            all()
        );
        for (seed, j) in &judged {
            assert!(
                j.window_ratio <= envelope.window && j.wc_ratio <= envelope.wc,
                "draw {draw}: outside the envelope ({} of the best window, {} of \
                 work-conserving): {}",
                envelope.window,
                envelope.wc,
                j.report(*seed)
            );
        }
        let mut ratios: Vec<f64> = judged.iter().map(|(_, j)| j.window_ratio).collect();
        ratios.sort_by(f64::total_cmp);
        let median = ratios[ratios.len() / 2];
        assert!(
            median <= envelope.median,
            "draw {draw}: median ratio to the best window {median:.3} (at most {}):\n{}",
            envelope.median,
            all()
        );
    }
}

/// Draws of each case's arrival process in [`a_window_chosen_on_other_draws_against_the_best_in_hindsight`]
/// (draw 0 is the harness's).
const DRAWS: u64 = 4;

/// How far the open-loop bound can be met by any rule that does not see the
/// arrivals to come. Each drawn case is drawn [`DRAWS`] times (the same arrival process,
/// other random arrivals). On each draw `d`:
/// - the *chosen* schedule is the fixed one (work-conserving or a window of the grid) that
///   does best on the other draws (the least mean, over them, of the worse of its p50 and
///   p99 against that draw's best): a schedule that knows the case exactly (cost, workers,
///   load, burst shape) and has seen thousands of its requests, but not draw `d`'s;
/// - it is judged on draw `d` by the harness's bounds, as `auto` is;
/// - and `auto` is judged against it: p50 and p99 within [`WINDOW_SLACK`] of the chosen
///   schedule's on draw `d`, and within [`WC_SLACK`] of work-conserving.
///
/// So the counts say how much of the bound a clairvoyant of the process misses (the
/// draw's noise: the best in hindsight is the least of a dozen noisy schedules), and how
/// `auto` compares with that clairvoyant. `tools/auto_props.sh N open-oracle [REQUESTS]`
/// runs it; it asserts only that cases ran (a measurement, recorded in BENCHMARKS.md).
#[test]
#[ignore = "a measurement of the harness's bound: tools/auto_props.sh N open-oracle"]
fn a_window_chosen_on_other_draws_against_the_best_in_hindsight() {
    let requests = std::env::var("AUTO_PROPS_OPEN_REQUESTS").map_or(REQUESTS, |s| {
        s.parse()
            .expect("AUTO_PROPS_OPEN_REQUESTS is a number of requests")
    });
    let within = |r: P50P99, of: P50P99, slack: f64| (r.0 / of.0).max(r.1 / of.1) <= slack;
    // Per kind: judgments (cases x draws); the chosen schedule meets the bounds; auto meets
    // them; auto is within the bounds of the chosen schedule.
    let mut by_kind = [[0usize; 4]; KINDS.len()];
    // The same counts on draw 0 alone (the harness's draw).
    let mut draw0 = [0usize; 4];
    for seed in seeds() {
        let case_of = |draw| OpenCase {
            requests,
            draw,
            ..OpenCase::from_seed(seed)
        };
        let judged: Vec<Schedules> = (0..DRAWS).map(|d| Schedules::of(&case_of(d))).collect();
        let fixed: Vec<Vec<P50P99>> = judged.iter().map(|s| s.fixed().collect()).collect();
        let worse = |d: usize, r: P50P99| {
            let best = judged[d].best();
            (r.0 / best.0).max(r.1 / best.1)
        };
        let case = case_of(0);
        let kind = usize::from(case.burst > 1) * 2 + usize::from(case.workers > 1);
        let mut line = format!("oracle seed {seed} ({}):", KINDS[kind]);
        for d in 0..judged.len() {
            let chosen = (0..fixed[d].len())
                .min_by(|&i, &j| {
                    let mean = |i: usize| {
                        (0..fixed.len())
                            .filter(|&o| o != d)
                            .map(|o| worse(o, fixed[o][i]))
                            .sum::<f64>()
                    };
                    mean(i).total_cmp(&mean(j))
                })
                .expect("work-conserving at least");
            let (s, c) = (&judged[d], fixed[d][chosen]);
            let counts = [
                1,
                usize::from(within(c, s.best(), WINDOW_SLACK) && within(c, s.wc, WC_SLACK)),
                usize::from(
                    within(s.auto, s.best(), WINDOW_SLACK) && within(s.auto, s.wc, WC_SLACK),
                ),
                usize::from(within(s.auto, c, WINDOW_SLACK) && within(s.auto, s.wc, WC_SLACK)),
            ];
            for (k, n) in by_kind[kind].iter_mut().zip(counts) {
                *k += n;
            }
            if d == 0 {
                for (k, n) in draw0.iter_mut().zip(counts) {
                    *k += n;
                }
            }
            line += &format!(
                " draw {d}: chosen {} {:.3}, auto {:.3} (/ chosen {:.3});",
                if chosen == 0 {
                    "wc".to_string()
                } else {
                    format!("{:.3} ms", s.windows[chosen - 1].0 as f64 / MS as f64)
                },
                worse(d, c),
                worse(d, s.auto),
                (s.auto.0 / c.0).max(s.auto.1 / c.1),
            );
        }
        println!("{line}");
    }
    let total = by_kind.iter().fold([0usize; 4], |t, k| {
        [t[0] + k[0], t[1] + k[1], t[2] + k[2], t[3] + k[3]]
    });
    println!(
        "{} open cases of {requests} requests x {DRAWS} draws: {} judged; the bounds \
         ({WINDOW_SLACK} of the best in hindsight, {WC_SLACK} of work-conserving) are met by \
         the schedule chosen on the other draws in {}, by auto in {}; auto within them of \
         the chosen schedule in {}. Draw 0 alone: chosen {}, auto {}, auto of chosen {}",
        total[0] / DRAWS as usize,
        total[0],
        total[1],
        total[2],
        total[3],
        draw0[1],
        draw0[2],
        draw0[3],
    );
    for (name, k) in KINDS.iter().zip(by_kind) {
        println!(
            "  {name}: {} judged, chosen meets {}, auto meets {}, auto within the bounds of \
             chosen {}",
            k[0], k[1], k[2], k[3]
        );
    }
    assert!(total[0] > 0, "no case ran");
}

/// p50 and p99, ms.
type P50P99 = (f64, f64);

/// `case` under `auto`, work-conserving dispatch, and each window of the grid
/// ([`windows`]), on the same arrivals.
struct Schedules {
    auto: P50P99,
    wc: P50P99,
    /// (window, its p50 and p99), in the grid's order.
    windows: Vec<(Nanos, P50P99)>,
}

impl Schedules {
    fn of(case: &OpenCase) -> Schedules {
        let arrivals = case.arrivals();
        let run =
            |strategy, window| p50_p99(&latencies(case, &arrivals, config(case, strategy, window)));
        Schedules {
            auto: run(StrategyKind::Auto, 0),
            wc: run(StrategyKind::Fixed, 0),
            windows: windows(case)
                .into_iter()
                .map(|w| (w, run(StrategyKind::Fixed, w)))
                .collect(),
        }
    }

    /// Every fixed schedule: work-conserving, then each window.
    fn fixed(&self) -> impl Iterator<Item = P50P99> + '_ {
        std::iter::once(self.wc).chain(self.windows.iter().map(|&(_, r)| r))
    }

    /// The least p50 and the least p99 over the fixed schedules (perhaps of two windows).
    fn best(&self) -> P50P99 {
        self.fixed()
            .fold((f64::INFINITY, f64::INFINITY), |best, r| {
                (best.0.min(r.0), best.1.min(r.1))
            })
    }
}

/// `case` under `auto`, work-conserving, and the best of the window grid in hindsight (p50
/// and p99 each at their best).
fn auto_wc_best_window(case: &OpenCase) -> (P50P99, P50P99, P50P99) {
    let schedules = Schedules::of(case);
    (schedules.auto, schedules.wc, schedules.best())
}

/// Steady streams with several workers, where `auto` paces (issue 25): the drawn cases of
/// seeds `0..40` with Poisson arrivals and 2-4 workers (15 cases). `auto` is never more than
/// [`WC_SLACK`] above work-conserving dispatch, and its median ratio to the best window in
/// hindsight is within 10 % (1.014 with the pacing rule; 1.305 without it, when `auto`
/// stayed work-conserving there: BENCHMARKS.md, issue 25's fifth round).
#[test]
fn auto_paces_steady_streams_over_several_workers() {
    let mut ratios = Vec::new();
    for seed in 0..40 {
        let case = OpenCase::from_seed(seed);
        if case.workers < 2 || case.burst > 1 {
            continue;
        }
        let (auto, wc, best) = auto_wc_best_window(&case);
        assert!(
            auto.0 <= wc.0 * WC_SLACK && auto.1 <= wc.1 * WC_SLACK,
            "open seed {seed}: auto p50 {:.3} p99 {:.3} ms, work-conserving {:.3} / {:.3}: {case:?}",
            auto.0,
            auto.1,
            wc.0,
            wc.1
        );
        ratios.push((auto.0 / best.0).max(auto.1 / best.1));
    }
    assert_eq!(ratios.len(), 15, "the drawn cases changed");
    ratios.sort_by(f64::total_cmp);
    let median = ratios[ratios.len() / 2];
    assert!(
        median <= 1.10,
        "median ratio to the best window {median:.3}: {ratios:?}"
    );
}

/// A batch client's bursts over idle workers (issue 25): 24 requests 100 us apart, a burst
/// every ~50 ms on average, three workers, a = 30 ms. Work-conserving dispatch sends the
/// burst's first two requests alone to two workers and the other 22 to the third. `auto`
/// splits the first bursts over the free workers (the burst split in
/// [`crate::core::strategy::auto`]), and once the window replay has 128 arrivals it holds
/// each burst to a window. Measured: p50 38.1 ms, p99 46.5 (work-conserving 56.9 / 72.4;
/// the best window's 33.3 and 45.4, two windows). The worse of the two against the best
/// window is 1.146 (1.48 before the replay, when the split alone gave p50 32.7 and p99
/// 67.3: splitting a burst over every free worker leaves none for a burst that comes
/// within one batch time).
#[test]
fn auto_splits_a_burst_over_the_free_workers() {
    let case = OpenCase {
        seed: 7,
        workers: 3,
        max_batch: 64,
        a: 30 * MS,
        b: MS / 5,
        shape: Shape::Linear,
        load: 0.1,
        burst: 24,
        gap: 100_000,
        requests: REQUESTS,
        draw: 0,
    };
    let (auto, wc, best) = auto_wc_best_window(&case);
    let report = format!("auto {auto:?}, work-conserving {wc:?}, best window {best:?} (ms)");
    let worse = (auto.0 / best.0).max(auto.1 / best.1);
    assert!(
        worse <= 1.2,
        "the worse of p50 and p99 against the best window: {report}"
    );
    assert!(
        auto.0 <= wc.0 * 0.75,
        "p50 against work-conserving: {report}"
    );
    assert!(auto.1 <= wc.1 * WC_SLACK, "p99: {report}");
}
