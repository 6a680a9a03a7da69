//! Criterion benches of the sans-IO core alone.
//!
//! `core/request_cycle`: one iteration = one request admitted, batched (batch size 32, the
//! batch released as full) and completed, with a `poll` after every admission, as if every
//! request arrived in its own engine turn (the worst case). The figure is ns per request.
//! Strategy `fixed`: the cost of the core's bookkeeping (including `auto`'s models, which
//! learn from every arrival and completion whatever strategy runs).
//!
//! `core/request_cycle_auto`: the same cycle under `auto`. The worker is free at every
//! poll, so `auto` decides at every admission; the batches complete at once (a fitted cost
//! of 0), so each goes as a batch of one: the cost of a decision per request.
//!
//! `core/closed_loop_fixed` / `core/closed_loop_auto`: the decision path with a batch cost
//! that makes holds happen (see [`closed_loop`]).
//!
//! `core/window_replay`: one replay of `auto`'s window replay (see [`window_replay`]): the
//! engine runs one every `REPLAY_EVERY` arrivals and at most every 100 ms in a bursty open
//! loop, one window of it per arrival.

use abe::core::strategy::StrategyKind;
use abe::core::{Action, BatchId, BatchOutcome, Core, CoreConfig, Kind, Priority, RequestMeta};
use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;
use std::time::Instant;

fn core_for_bench(strategy: StrategyKind) -> Core {
    Core::new(CoreConfig {
        workers: 1,
        dispatch_when_idle: false,
        strategy,
        max_batch_size: 32,
        ..CoreConfig::default()
    })
}

fn request_cycle(c: &mut Criterion) {
    let mut group = c.benchmark_group("core");
    for (name, strategy) in [
        ("request_cycle", StrategyKind::Fixed),
        ("request_cycle_auto", StrategyKind::Auto),
    ] {
        cycle(&mut group, name, strategy);
    }
    group.finish();
}

fn cycle(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    strategy: StrategyKind,
) {
    group.bench_function(name, |b| {
        let mut core = core_for_bench(strategy);
        let mut now = 0u64;
        b.iter_custom(|iters| {
            let start = Instant::now();
            let mut batch: Option<BatchId> = None;
            for _ in 0..iters {
                now += 100;
                let meta = RequestMeta::new(Priority::Normal, Kind::Completion, 64, 16, now);
                black_box(core.admit(now, meta).expect("queue has room"));
                core.poll(now, &mut |a| {
                    if let Action::Dispatch { batch: id, .. } = a {
                        batch = Some(id);
                    }
                });
                if let Some(id) = batch.take() {
                    black_box(core.complete(now, id, BatchOutcome::Ok));
                }
            }
            start.elapsed()
        });
        assert_eq!(core.stats().failed, 0);
    });
}

/// `core/closed_loop_{fixed,auto}`: the decision path with a realistic batch cost. 16
/// clients in a closed loop against one worker whose batch of n takes 2 ms + 50 us n (virtual
/// time: nothing sleeps), each client back 30-70 us after its answer (a loopback round trip),
/// batches of at most 32. Under `auto` the fitted `a` is 2 ms and the clients' echoes are
/// learned, so partial batches are held (the loop counts the holds and asserts some
/// happened). One event per step (an arrival, a completion or a hold's deadline), each
/// followed by a `poll`, as the engine does; the figure is ns per request completed,
/// harness included (a scan of 16 client slots per step, the same for both strategies).
fn closed_loop(c: &mut Criterion) {
    let mut group = c.benchmark_group("core");
    for (name, strategy) in [
        ("closed_loop_fixed", StrategyKind::Fixed),
        ("closed_loop_auto", StrategyKind::Auto),
    ] {
        // One loop across criterion's calls (it calls the routine once per sample, the first
        // time with one iteration): the holds come once `auto` has learned the loop.
        let mut lp = Loop::new(strategy);
        // Learned before timing starts (virtual time: instant), so `cargo test --benches`,
        // which runs each routine for one iteration, also exercises holds.
        while lp.completed < 2_000 {
            lp.step();
        }
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                let target = lp.completed + iters;
                while lp.completed < target {
                    lp.step();
                }
                start.elapsed()
            });
        });
        if strategy == StrategyKind::Auto {
            let auto = lp.core.auto_snapshot();
            assert!(auto.held > 0, "the bench must exercise holds: {auto:?}");
        }
        assert_eq!(lp.core.stats().failed, 0);
    }
    group.finish();
}

const CLIENTS: usize = 16;

/// The closed loop's state: when each client's next request arrives (`Nanos::MAX`: waiting
/// for its answer), the batch in flight, the core's own wake-up.
struct Loop {
    core: Core,
    now: u64,
    returning: [u64; CLIENTS],
    busy: Option<(u64, BatchId)>,
    wake: Option<u64>,
    /// Clients whose requests are queued or in flight, in order (answers go back to them).
    waiting: [usize; CLIENTS],
    waiting_len: usize,
    rng: u64,
    completed: u64,
}

impl Loop {
    fn new(strategy: StrategyKind) -> Loop {
        let mut returning = [0u64; CLIENTS];
        for (i, r) in returning.iter_mut().enumerate() {
            *r = i as u64 * 10_000;
        }
        Loop {
            core: Core::new(CoreConfig {
                workers: 1,
                strategy,
                max_batch_size: 32,
                max_inflight_per_worker: 1,
                ..CoreConfig::default()
            }),
            now: 0,
            returning,
            busy: None,
            wake: None,
            waiting: [0; CLIENTS],
            waiting_len: 0,
            rng: 0x9e37_79b9_7f4a_7c15,
            completed: 0,
        }
    }

    fn step(&mut self) {
        let next_return = self.returning.iter().copied().min().unwrap_or(u64::MAX);
        let next = [self.busy.map(|(t, _)| t), Some(next_return), self.wake]
            .into_iter()
            .flatten()
            .min()
            .expect("a closed loop always has something pending");
        self.now = self.now.max(next);
        let now = self.now;
        if let Some((t, id)) = self.busy {
            if t <= now {
                self.busy = None;
                let n = self.core.batch_tickets(id).len();
                black_box(self.core.complete(now, id, BatchOutcome::Ok));
                // FIFO batches: the first n waiting clients have their answers.
                for k in 0..n {
                    // xorshift: a 30-70 us round trip per client.
                    self.rng ^= self.rng << 13;
                    self.rng ^= self.rng >> 7;
                    self.rng ^= self.rng << 17;
                    self.returning[self.waiting[k]] = now + 30_000 + self.rng % 40_000;
                }
                self.waiting.copy_within(n..self.waiting_len, 0);
                self.waiting_len -= n;
                self.completed += n as u64;
            }
        }
        for client in 0..CLIENTS {
            if self.returning[client] <= now {
                self.returning[client] = u64::MAX;
                let meta = RequestMeta::new(Priority::Normal, Kind::Completion, 64, 16, now);
                black_box(self.core.admit(now, meta).expect("queue has room"));
                self.waiting[self.waiting_len] = client;
                self.waiting_len += 1;
            }
        }
        if self.wake.is_some_and(|t| t <= now) {
            self.wake = None;
        }
        let mut dispatched = None;
        let deadline = self.core.poll(now, &mut |a| {
            if let Action::Dispatch { batch, .. } = a {
                dispatched = Some(batch);
            }
        });
        if let Some(id) = dispatched {
            let n = self.core.batch_tickets(id).len() as u64;
            self.busy = Some((now + 2_000_000 + 50_000 * n, id));
        }
        self.wake = deadline.filter(|&t| t > now);
    }
}

/// `core/window_replay`: a full record (`REPLAY_ARRIVALS` arrivals: bursts of 16, 50 us
/// apart, every 20 ms), four batches at once of up to 32, a fitted cost of 10 ms + 0.2 ms a
/// request seen at every size; one iteration replays every window of the grid (the engine
/// runs at most one a turn, so a sixteenth of this is its longest stall at four slots).
fn window_replay(c: &mut Criterion) {
    use abe::core::strategy::auto::cost::Cost;
    use abe::core::strategy::auto::replay::{WindowReplay, REPLAY_ARRIVALS};
    let mut replay = WindowReplay::new(4, 32);
    let mut t = 0u64;
    let mut recorded = 0;
    while recorded < REPLAY_ARRIVALS {
        for i in 0..16 {
            replay.observe_arrival(t + i * 50_000);
            recorded += 1;
        }
        t += 20_000_000;
    }
    let cost = Cost {
        a_ns: 10e6,
        b_ns: 0.2e6,
        samples: 64,
        ..Cost::default()
    };
    for n in 1..=32u64 {
        replay.observe_completion(n as usize, 10_000_000 + 200_000 * n);
    }
    // Once before timing, so the bench fails loudly if the replay stops choosing a window
    // (and a filtered run that skips this bench does not trip it).
    replay.replay(&cost, 20_000.0);
    assert!(
        replay.window().is_some_and(|w| w > 0),
        "the bench must choose a window"
    );
    let mut group = c.benchmark_group("core");
    group.bench_function("window_replay", |b| {
        b.iter(|| {
            replay.replay(black_box(&cost), 20_000.0);
            black_box(replay.window())
        })
    });
    group.finish();
}

criterion_group!(benches, request_cycle, closed_loop, window_replay);
criterion_main!(benches);
