//! A property harness for `auto` through the core: closed loops drawn from a seed, in
//! virtual time (deterministic: the same seed replays the same run), each held to 95 % of
//! the exact best possible throughput.
//!
//! A case draws: a fixed cost `a` (0.2-50 ms) and a per-request cost `b` (0-a/4), the cost's
//! shape (linear `a + b n`, concave `a + b sqrt(n max)`, step `a + b (8 ceil(n / 8))`), 1-8
//! workers, a max batch of 8-64, the priorities the clients send (all normal, or a mix of
//! high, normal and low, whose max waits differ), the clients' think time (a round trip of
//! 10-500 us, +-50 %), and one change mid-run: none, the cost drifting by x0.5-2, or the
//! client count changing. Throughput is measured after the change, once `auto` has had
//! 200 batches to see it.
//!
//! The best possible, exact where it is asked: clients split evenly over the `W` workers,
//! `c` each; with `c` at most a full batch, a batch of all `c` per round, then their think
//! times, of which the round waits for the slowest: `W c / (S(c) + T_max(c))`, `T_max(c)`
//! the expected slowest of `c` draws (`rtt/2 + rtt c/(c+1)`; until issue 25's second round
//! the mean `rtt` stood here, which overstated the best by up to a third of a round trip
//! per round); with `c` at least two full batches (and a round trip shorter than a full
//! batch), the next full batch is queued when one finishes and the round trip is hidden:
//! `W max / S(max)`. Cases in between are not drawn.
//!
//! Where `auto` falls short, said rather than hidden. With several workers and at most a
//! full batch of clients each, the decision sees one worker at a time, how the clients
//! spread over the workers is decided by the first dispatches, and the echo model sees
//! every worker's completions mixed. Those cases are held to [`SHORT_OF_IT`] here; every
//! other to [`GOAL`]. The first 40 seeds all reach 95 % (the worst 0.962, 2026-11-28; 0.935
//! before the burst split). No seed of the last long run (`tools/auto_props.sh 400`,
//! 2026-11-28, issue 25's eighth round) falls under its bound; the four under 95 % are all
//! known-short cases (the lowest 0.928). Replay a seed with `AUTO_PROPS_SEED=S`;
//! `AUTO_PROPS_TRACE=1` prints the first 40 measured batches, arrivals and holds. What the
//! traces showed (issue 25, third and seventh rounds):
//! - 151 and 236 split into two alternating partial batches (1 + 3 of 4 clients; 3 + 5 of
//!   8) and never held: the echo model counted only arrivals beyond the stream's rate, and
//!   took that rate as arrivals per completion over the time between completions; when
//!   that time (a batch, ~0.8-1.1 ms) is not much longer than the round trip (0.2-0.6 ms),
//!   the "stream" was the echo itself. Mended with one batch at a time by reading the
//!   quarters of a window ([`crate::core::strategy::auto::arrivals`], issue 25's sixth
//!   round): 0.999 and 0.998 now. The several-worker misses of that run (105, 229, 254:
//!   0.86-0.89, after a cost drift) reach their bound since the burst split.
//! - 215 (one worker, 33 clients, a step cost, 0.655) split into 32 + 1: the client that
//!   missed the batch of 32 went alone at the next completion, and the 32 came back during
//!   its batch. The cost fit was the cause: first seen only at 32 and 33, the step made its
//!   line cross zero before batch 1, so each batch of 1 (4x slower than the line said) was
//!   taken for a stall and kept out of the fit; as they alternated with normal batches of
//!   32, the run of outliers never grew past one, and `a` stayed near 0, where holding
//!   never pays. Outliers fewer than [`OUTLIER_SPACING`] normal batches apart now count as
//!   a run (`auto::cost`): 0.971.
//!
//! [`OUTLIER_SPACING`]: crate::core::strategy::auto::cost::OUTLIER_SPACING
//!
//! `AUTO_PROPS_SEEDS=N` runs seeds `0..N` (default [`SEEDS_IN_TEST_RUN`]);
//! `AUTO_PROPS_SEED=S` replays one. A failure prints its seed and case. The long run is
//! `tools/auto_props.sh`; its result is in BENCHMARKS.md.
//!
//! Which side is wrong when a case falls short: `AUTO_PROPS_HINDSIGHT=1` also runs every
//! case under 95 % through the schedules a user could have set knowing the case
//! ([`hindsight_configs`]: work-conserving, `fixed` windows, and the oracle batch that
//! waits for exactly the `c` requests the best possible forms) and prints the best of them
//! against the best possible. When even the oracle batch is short, the best possible
//! overstates what one batch per worker per round can reach: the clients' think times are
//! drawn (`rtt/2` to `3 rtt/2`), and a round that waits for all `c` waits for the slowest
//! of them, not the mean.

use crate::core::strategy::StrategyKind;
use crate::core::*;
use rand::rngs::SmallRng;

mod open_loop;
use rand::{Rng, SeedableRng};

const MS: Nanos = 1_000_000;

/// Seeds in the normal test run (each is a few hundred batches of virtual time).
const SEEDS_IN_TEST_RUN: u64 = 40;

/// The goal: this share of the best possible.
const GOAL: f64 = 0.95;

/// What `auto` is held to where it is known to fall short of [`GOAL`] (see the module docs).
const SHORT_OF_IT: f64 = 0.90;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Shape {
    Linear,
    Concave,
    Step,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Change {
    None,
    /// Every batch costs this factor more from mid-run.
    CostDrift(f64),
    /// Clients per worker from mid-run.
    Clients(usize),
}

#[derive(Clone, Copy, Debug)]
struct Case {
    seed: u64,
    workers: usize,
    max_batch: usize,
    /// Clients per worker (before the change).
    per_worker: usize,
    a: Nanos,
    b: Nanos,
    shape: Shape,
    rtt: Nanos,
    mixed_priorities: bool,
    change: Change,
}

impl Case {
    fn from_seed(seed: u64) -> Case {
        let mut rng = SmallRng::seed_from_u64(seed);
        let workers = rng.gen_range(1..=8usize);
        let max_batch = [8usize, 16, 32, 64][rng.gen_range(0..4)];
        let a = (rng.gen_range(0.2f64..50.0) * MS as f64) as Nanos;
        let b = (rng.gen_range(0.0f64..0.25) * a as f64) as Nanos / 8;
        let shape = [Shape::Linear, Shape::Concave, Shape::Step][rng.gen_range(0..3)];
        let rtt = rng.gen_range(10_000..500_000);
        let mut case = Case {
            seed,
            workers,
            max_batch,
            per_worker: 1,
            a,
            b,
            shape,
            rtt,
            mixed_priorities: rng.gen_bool(0.5),
            change: Change::None,
        };
        case.per_worker = case.draw_clients(&mut rng);
        case.change = match rng.gen_range(0..3) {
            0 => Change::None,
            1 => Change::CostDrift(rng.gen_range(0.5..2.0)),
            _ => Change::Clients(case.draw_clients(&mut rng)),
        };
        case
    }

    /// Clients per worker where the best possible is exact: at most a full batch, or (when
    /// a full batch outlasts the longest round trip) two to three full batches.
    fn draw_clients(&self, rng: &mut SmallRng) -> usize {
        let hidden = 3 * self.rtt / 2 < self.cost(self.max_batch, 1.0);
        if hidden && rng.gen_bool(0.3) {
            rng.gen_range(2 * self.max_batch..=3 * self.max_batch)
        } else {
            rng.gen_range(1..=self.max_batch)
        }
    }

    /// Service time of a batch of `n`, the cost scaled by `drift`.
    fn cost(&self, n: usize, drift: f64) -> Nanos {
        let variable = match self.shape {
            Shape::Linear => self.b as f64 * n as f64,
            Shape::Concave => self.b as f64 * (n as f64 * self.max_batch as f64).sqrt(),
            Shape::Step => self.b as f64 * (8 * n.div_ceil(8)) as f64,
        };
        ((self.a as f64 + variable) * drift) as Nanos
    }

    /// After the change: clients per worker and the cost factor.
    fn after(&self) -> (usize, f64) {
        match self.change {
            Change::None => (self.per_worker, 1.0),
            Change::CostDrift(f) => (self.per_worker, f),
            Change::Clients(c) => (c, 1.0),
        }
    }

    /// Several workers with at most a full batch of clients each: where `auto` is known to
    /// fall short of the goal (see the module docs).
    fn known_short(&self) -> bool {
        self.workers > 1 && self.after().0 <= self.max_batch
    }

    /// Expected think time of the slowest of `c` clients, ns: what a round that waits for
    /// all `c` waits after their answers. Each think time is `rtt/2` plus a uniform draw
    /// from `0..=rtt` (see [`run_config`]), and the largest of `c` uniform draws on
    /// `[0, rtt]` is `rtt c / (c + 1)` on average.
    fn slowest_think(&self, c: usize) -> f64 {
        let rtt = self.rtt as f64;
        rtt / 2.0 + rtt * c as f64 / (c as f64 + 1.0)
    }

    /// Requests per second at best, after the change (see the module docs).
    fn best_possible(&self) -> f64 {
        let (c, drift) = self.after();
        let w = self.workers as f64;
        if c <= self.max_batch {
            w * c as f64 * 1e9 / (self.cost(c, drift) as f64 + self.slowest_think(c))
        } else {
            assert!(c >= 2 * self.max_batch, "{self:?}: no exact best");
            w * self.max_batch as f64 * 1e9 / self.cost(self.max_batch, drift) as f64
        }
    }
}

/// A core for `case` under `strategy`, as `auto` runs it.
fn config(case: &Case, strategy: StrategyKind) -> CoreConfig {
    CoreConfig {
        workers: case.workers,
        max_batch_size: case.max_batch,
        max_inflight_per_worker: 1,
        strategy,
        ..CoreConfig::default()
    }
}

/// The hand-set schedules a user could have picked, knowing the case (after the change):
/// work-conserving dispatch; `fixed` windows of 1/4 to 4 round trips and 1/8 to 1 of a
/// batch's fixed cost; and the oracle batch, which waits (without a time limit) for exactly
/// the batch the best possible forms, `c` requests, or a full batch when more wait.
fn hindsight_configs(case: &Case) -> Vec<(String, CoreConfig)> {
    let mut out = Vec::new();
    let mut wc = config(case, StrategyKind::Fixed);
    wc.dispatch_when_idle = true;
    wc.strategy_params.max_wait_ms = 0.0;
    out.push(("work-conserving".to_string(), wc));
    let rtt = case.rtt as f64;
    let a = case.a as f64;
    let windows = [0.25, 0.5, 1.0, 1.5, 2.0, 4.0]
        .map(|k| k * rtt)
        .into_iter()
        .chain([0.125, 0.25, 0.5, 1.0].map(|k| k * a));
    for w in windows {
        let mut c = config(case, StrategyKind::Fixed);
        c.dispatch_when_idle = false;
        c.strategy_params.max_wait_ms = w / MS as f64;
        c.priority_max_wait_ms = [1e6; Priority::COUNT];
        out.push((format!("fixed {:.3} ms", w / MS as f64), c));
    }
    let (c, _) = case.after();
    let mut oracle = config(case, StrategyKind::Fixed);
    oracle.max_batch_size = c.min(case.max_batch);
    oracle.dispatch_when_idle = false;
    oracle.strategy_params.max_wait_ms = 1e6;
    oracle.priority_max_wait_ms = [1e6; Priority::COUNT];
    oracle.request_timeout_ns = Nanos::MAX / 4;
    out.push(("oracle batch".to_string(), oracle));
    out
}

/// The best of [`hindsight_configs`] on `case`: its requests per second and its name.
fn best_in_hindsight(case: &Case) -> (f64, String) {
    hindsight_configs(case)
        .into_iter()
        .map(|(name, cfg)| (run_config(case, cfg), name))
        .fold(
            (0.0, String::new()),
            |best, x| if x.0 > best.0 { x } else { best },
        )
}

/// Runs `case` through a core under `strategy`; requests per second after the change.
fn run(case: &Case, strategy: StrategyKind) -> f64 {
    run_config(case, config(case, strategy))
}

/// Runs `case` through a core configured `cfg`; requests per second after the change.
fn run_config(case: &Case, cfg: CoreConfig) -> f64 {
    let mut rng = SmallRng::seed_from_u64(case.seed ^ 0x5eed);
    let mut core = Core::new(cfg);
    let most = case.workers * case.per_worker.max(case.after().0);
    // When each client's next request arrives (`None`: waiting for an answer, or gone).
    let mut returning: Vec<Option<Nanos>> = (0..most)
        .map(|i| (i < case.workers * case.per_worker).then_some(i as Nanos * case.rtt / 4))
        .collect();
    let mut active = case.workers * case.per_worker;
    let mut client_of: Vec<usize> = vec![usize::MAX; core.config().queue_capacity];
    let mut busy: Vec<Option<(Nanos, BatchId)>> = vec![None; case.workers];
    let mut wake: Option<Nanos> = None;
    // Batches before the change, and after it before measuring; then batches measured (per
    // worker: a window of few batches overcounts those that started before it).
    let (phase, measure) = (200usize, 300 * case.workers);
    let (mut batches, mut completed, mut t_start, mut drift) = (0usize, 0usize, 0, 1.0);
    let mut now: Nanos = 0;
    let trace = std::env::var_os("AUTO_PROPS_TRACE").is_some();
    let mut holds_seen = 0;
    loop {
        let next = busy
            .iter()
            .flatten()
            .map(|&(t, _)| t)
            .chain(returning.iter().flatten().copied())
            .chain(wake)
            .min()
            .expect("a closed loop always has something pending");
        now = now.max(next);
        for slot in busy.iter_mut() {
            let Some((t, batch)) = *slot else { continue };
            if t > now {
                continue;
            }
            *slot = None;
            let clients: Vec<usize> = core
                .batch_tickets(batch)
                .iter()
                .map(|t| client_of[t.index as usize])
                .collect();
            assert_eq!(
                core.complete(now, batch, BatchOutcome::Ok),
                Completion::Deliver
            );
            for &c in &clients {
                if c < active {
                    let think = case.rtt / 2 + rng.gen_range(0..=case.rtt);
                    returning[c] = Some(now + think);
                }
            }
            batches += 1;
            if batches == phase {
                // The change: new cost, or clients joining (they start at once) or leaving
                // (after their answer).
                let (c, d) = case.after();
                drift = d;
                let target = case.workers * c;
                for (i, r) in returning.iter_mut().enumerate().take(target).skip(active) {
                    *r = Some(now + i as Nanos % 7 * case.rtt / 4);
                }
                active = target;
            } else if batches == 2 * phase {
                t_start = now;
            } else if batches > 2 * phase {
                completed += clients.len();
            }
            if batches == 2 * phase + measure {
                return completed as f64 * 1e9 / (now - t_start) as f64;
            }
        }
        for (c, r) in returning.iter_mut().enumerate() {
            if r.is_some_and(|t| t <= now) {
                *r = None;
                let priority = if case.mixed_priorities {
                    [Priority::High, Priority::Normal, Priority::Low][c % 3]
                } else {
                    Priority::Normal
                };
                let mut meta = RequestMeta::new(priority, Kind::Completion, 0, 0, now);
                meta.tokens_estimated = 20;
                let ticket = core.admit(now, meta).expect("the queue holds every client");
                client_of[ticket.index as usize] = c;
                if trace && batches >= 2 * phase && batches < 2 * phase + 40 {
                    println!(
                        "  trace {:>10.3} ms: client {c} arrives",
                        now as f64 / MS as f64
                    );
                }
            }
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
                busy[worker] = Some((now + case.cost(tickets.len(), drift), batch));
                if trace && batches >= 2 * phase && batches < 2 * phase + 40 {
                    println!(
                        "  trace {:>10.3} ms: worker {worker} batch of {:>2}",
                        now as f64 / MS as f64,
                        tickets.len()
                    );
                }
            }
        });
        wake = wake.filter(|&t| t > now);
        if trace && batches >= 2 * phase && batches < 2 * phase + 40 {
            let (held, hold) = core.auto_holds();
            if held != holds_seen {
                holds_seen = held;
                println!(
                    "  trace {:>10.3} ms: hold {:.3} ms, q {}, j {:.2}, K {:.2} ({})",
                    now as f64 / MS as f64,
                    hold.wait_ns as f64 / MS as f64,
                    hold.queued,
                    hold.expected_joiners,
                    hold.joiners_within_horizon,
                    hold.reason.as_str()
                );
            }
        }
    }
}

fn seeds() -> Vec<u64> {
    if let Ok(s) = std::env::var("AUTO_PROPS_SEED") {
        return vec![s.parse().expect("AUTO_PROPS_SEED is a number")];
    }
    let n = std::env::var("AUTO_PROPS_SEEDS").map_or(SEEDS_IN_TEST_RUN, |s| {
        s.parse().expect("AUTO_PROPS_SEEDS is a number")
    });
    (0..n).collect()
}

/// The closed-loop goal over drawn cases: `auto` reaches 95 % of the best possible
/// (90 % where it is known to fall short, and those under 95 % are counted). Prints one
/// line per case (`--nocapture`) and every miss with the seed that replays it.
#[test]
fn auto_reaches_95_percent_of_the_best_possible_over_drawn_closed_loops() {
    let mut misses = Vec::new();
    let (mut worst, mut worst_elsewhere) = (f64::MAX, f64::MAX);
    let (mut cases, mut short) = (0, 0);
    for seed in seeds() {
        let case = Case::from_seed(seed);
        let ratio = run(&case, StrategyKind::Auto) / case.best_possible();
        println!("seed {seed}: {ratio:.3} of the best possible: {case:?}");
        if ratio < GOAL && std::env::var_os("AUTO_PROPS_HINDSIGHT").is_some() {
            let (best, name) = best_in_hindsight(&case);
            println!(
                "  hindsight: {name} reaches {:.3} of the best possible; auto {:.3} of it",
                best / case.best_possible(),
                ratio * case.best_possible() / best
            );
        }
        cases += 1;
        worst = worst.min(ratio);
        if !case.known_short() {
            worst_elsewhere = worst_elsewhere.min(ratio);
        } else if ratio < GOAL {
            short += 1;
        }
        let bound = if case.known_short() {
            SHORT_OF_IT
        } else {
            GOAL
        };
        if ratio < bound {
            misses.push(format!(
                "seed {seed} (replay: AUTO_PROPS_SEED={seed}): {ratio:.3} of the best, \
                 bound {bound}: {case:?}"
            ));
        }
    }
    println!(
        "{cases} cases: worst {worst:.3}; worst outside the known shortfall {worst_elsewhere:.3}; \
         {short} known-short cases under {GOAL}; {} misses",
        misses.len()
    );
    assert!(misses.is_empty(), "{}", misses.join("\n"));
}
