//! `auto`'s window replay: in an open loop, the last [`REPLAY_ARRIVALS`] arrivals replayed
//! in virtual time against the fitted cost, under work-conserving dispatch and a grid of
//! fixed windows, and the window whose p50 and p99 come closest to the least of each kept.
//!
//! Why: in an open loop the arrivals do not depend on what `auto` decides, so the recent
//! past is a sample of what is coming, and a replay of it answers exactly the question a
//! user asks of a batcher, "which wait would have given the best median and tail?", where
//! the one-step rules of [`super`] sum completion times (the mean) and read a burst's hold
//! as a lottery. A closed loop's arrivals answer completions, so a replay of them would
//! mean nothing; there the replay stays silent and the echo rule decides.
//!
//! The replay: the recorded arrivals in order, `slots` batches at once (workers times
//! batches in flight per worker), a batch of at most `max_batch`. Under a window `w` a
//! batch is due when its oldest request has waited `w` (and the engine has woken, `o` =
//! [`super::HOLD_OVERHEAD_NS`] later) or it is full, and it goes when a slot is free,
//! taking every request arrived by then up to `max_batch`; under `w = 0` it goes as soon as
//! a slot is free. Its service time is `S(n)` as the executor showed it: each batch size's
//! own moving mean where that size was seen, the line through the nearest seen sizes
//! between them, and the fitted slope `b` past them (a step or concave cost bent into the
//! fitted line mispredicts the very batch sizes a window forms). The first
//! [`REPLAY_SETTLE`] arrivals start the replay's queue and are not counted (the real queue
//! then is unknown). The p99 is the mean of the band from p98.5 to p99.5.
//!
//! The grid: 0, and `a / 64` to `2 a` in steps of `sqrt(2)` (a window past `2 a` only
//! delays). The choice: the least over the grid of `max(p50 / least p50, p99 / least
//! p99)`, each window scored as the worst of it and its two neighbours on the grid (the
//! replayed p99 rests on a few bursts, and a narrow valley is usually noise); the window in
//! force is kept unless another beats it by [`SWITCH_MARGIN`] (replays of overlapping
//! samples differ by noise). Steady streams (squared coefficient of variation of the
//! recorded gaps at most [`super::PACING_BURSTINESS_MAX`]) over several slots get no
//! window: the one-step pacing rule beats any fixed window there. Over one slot there is
//! nothing to pace against, and the echo rule reads noise in an open stream (holds it
//! cannot justify, p50 or p99 up to 2.3 % over work-conserving dispatch in drawn Poisson
//! cases), so the replay decides there too: most often window 0.
//!
//! Cost: a replay walks the arrivals once per window (`slots` compared per batch) and
//! selects the percentiles in place: 0.97-1.15 ms for a full record and grid on this 2-vCPU
//! machine (`core/window_replay`, 2026-11-28, four slots; 0.41 ms with the record of 4,096
//! it had before; a window's cost grows with the slots, which each replayed batch scans),
//! 60-72 us a window. It runs one window per engine turn at most (an arrival at a new
//! `now`: [`WindowReplay::step`]), so the engine stalls for one window, not a replay;
//! it starts at [`REPLAY_FIRST`] arrivals, then at twice as many until [`REPLAY_EVERY`]
//! apart, and never sooner than [`REPLAY_INTERVAL_MIN_NS`] after the last, so at most
//! about 1 % of the engine's time at any arrival rate; not at all when the batch cost is
//! under [`REPLAY_COST_MIN_NS`] (1 ms; the latency model `none`). Buffers are allocated once, with the
//! model; nothing here allocates after that, reads a clock or blocks.

use super::cost::Cost;
use crate::core::request::Nanos;

/// Arrivals kept for a replay. A replayed p99 of bursty arrivals rests on a few bursts, so
/// the record is long, and [`REPLAY_INTERVAL_MIN_NS`] keeps its replays to about 1 % of the
/// engine's time: 8,192 met 157 of 200 drawn open loops of 16,000 requests where 4,096 met 149, and 128 of 200
/// of 4,000 where it met 126 (BENCHMARKS.md, issue 25's thirteenth round). The price: a
/// change in the arrivals takes twice as long to fill the record.
pub const REPLAY_ARRIVALS: usize = 8192;
/// Arrivals at the first replay (the next at twice as many, until [`REPLAY_EVERY`] apart).
pub const REPLAY_FIRST: u64 = 128;
/// Arrivals between two replays once the record is full.
pub const REPLAY_EVERY: u64 = 512;
/// Least time between two replays, ns: a replay takes ~1 ms of the engine's time
/// (`core/window_replay` in `benches/core.rs`), so at most about 1 % of it at any arrival
/// rate.
pub const REPLAY_INTERVAL_MIN_NS: Nanos = 100_000_000;
/// Least fitted fixed cost of a batch, ns, for which the arrivals are recorded and
/// replayed: a replay takes ~1 ms of the engine's time (`core/window_replay`), more than a
/// batch below this, whose windows could win little. It also keeps the replay out of the
/// request path measured by the instruction budget (latency model `none`, where callgrind
/// slows a batch of ~5 us to a few hundred and would otherwise start replays).
pub const REPLAY_COST_MIN_NS: f64 = 1_000_000.0;
/// Arrivals at the start of a replay that only fill its queue (16 and 64 measure the same
/// on the open-loop harness, BENCHMARKS.md, issue 25's thirteenth round).
pub const REPLAY_SETTLE: usize = 32;
/// The window in force stays unless another's score is lower by this factor (1.00 and 1.03
/// measure within the open-loop harness's spread, BENCHMARKS.md, issue 25's thirteenth
/// round).
pub const SWITCH_MARGIN: f64 = 1.01;
/// Windows of the grid: 0, and `a / 64 * sqrt(2)^k` for `k = 0..=14` (`a / 64` to `2 a`).
const GRID: usize = 16;
/// Weight of a new service time in its size's moving mean (about 8 batches of a size to
/// follow a change of the executor). Not exercised by the property harnesses, whose batch
/// costs have no noise: every weight gives the same mean there.
const SIZE_ALPHA: f64 = 1.0 / 8.0;

/// The recent arrivals and the window their replay chose.
#[derive(Clone, Debug, Default)]
pub struct WindowReplay {
    /// Ring of arrival instants (empty: replay disabled).
    arrivals: Box<[Nanos]>,
    /// Arrivals recorded since start.
    seen: u64,
    /// Latencies of one replayed schedule (scratch).
    latencies: Box<[Nanos]>,
    /// When each slot frees, in the replay (scratch).
    free_at: Box<[Nanos]>,
    max_batch: usize,
    /// Per batch size `n` (index `n`, up to `max_batch`): the moving mean of its service
    /// times, ns, and how many were seen.
    by_size: Box<[(f64, u32)]>,
    /// `S(n)` as the replay uses it (scratch, filled before each replay).
    service: Box<[Nanos]>,
    /// The window in force, ns (`Some(0)`: work-conserving), or `None`: no replay yet, a
    /// steady stream, a batch cost under [`REPLAY_COST_MIN_NS`], or arrivals that answer
    /// completions.
    chosen: Option<Nanos>,
    /// Replays run (read by the tests: a steady stream starts none).
    replays: u64,
    /// Readings in a row that the arrivals answer completions.
    answering: u32,
    /// Arrivals recorded when the next replay is due, and when the last one was.
    next_due: u64,
    last_due_at: Nanos,
    /// The replay under way, one window per arrival ([`Self::step`]).
    job: Option<Job>,
}

/// A replay under way: the arrivals it replays, the grid, and the windows done so far.
#[derive(Clone, Copy, Debug)]
struct Job {
    /// The recorded arrivals replayed: `start..start + n` of everything recorded.
    start: usize,
    n: usize,
    overhead: Nanos,
    windows: [Nanos; GRID],
    /// p50 and p99 of each window replayed so far, ns.
    results: [(f64, f64); GRID],
    done: usize,
    /// Arrivals recorded when it began.
    begun_at: u64,
}

impl WindowReplay {
    /// A replay of `slots` batches at once, at most `max_batch` requests each.
    pub fn new(slots: usize, max_batch: usize) -> Self {
        WindowReplay {
            arrivals: vec![0; REPLAY_ARRIVALS].into_boxed_slice(),
            seen: 0,
            latencies: vec![0; REPLAY_ARRIVALS].into_boxed_slice(),
            free_at: vec![0; slots.max(1)].into_boxed_slice(),
            max_batch: max_batch.max(1),
            by_size: vec![(0.0, 0); max_batch.max(1) + 1].into_boxed_slice(),
            service: vec![0; max_batch.max(1) + 1].into_boxed_slice(),
            chosen: None,
            replays: 0,
            answering: 0,
            next_due: REPLAY_FIRST,
            last_due_at: 0,
            job: None,
        }
    }

    /// Records an arrival; returns whether a replay is due.
    pub fn observe_arrival(&mut self, now: Nanos) -> bool {
        if self.arrivals.is_empty() {
            return false;
        }
        let i = (self.seen % REPLAY_ARRIVALS as u64) as usize;
        self.arrivals[i] = now;
        self.seen += 1;
        // A replay under way keeps room for GRID arrivals (one a step); an engine turn
        // that admits more overwrites its record, so it is dropped (the next due one
        // starts afresh).
        if self
            .job
            .is_some_and(|job| self.seen - job.begun_at > GRID as u64)
        {
            self.job = None;
        }
        // At 128 and 256 arrivals, then every REPLAY_EVERY, and never sooner than
        // REPLAY_INTERVAL_MIN_NS after the last (a due replay waits for the first arrival
        // past it).
        let first = self.next_due == REPLAY_FIRST;
        if self.seen < self.next_due
            || (!first && now < self.last_due_at.saturating_add(REPLAY_INTERVAL_MIN_NS))
        {
            return false;
        }
        self.next_due = self.seen + self.seen.min(REPLAY_EVERY);
        self.last_due_at = now;
        true
    }

    /// An arrival went unrecorded (the batch cost fell under [`REPLAY_COST_MIN_NS`]): the
    /// record would have a hole that reads as a long gap, so it starts over, and no window
    /// is in force until a replay of the new record chooses one.
    pub fn pause(&mut self) {
        if self.seen == 0 && self.chosen.is_none() {
            return;
        }
        self.seen = 0;
        self.next_due = REPLAY_FIRST;
        self.chosen = None;
        self.job = None;
        self.answering = 0;
    }

    /// A batch of `requests` took `service_ns` (the caller leaves out what the cost fit
    /// keeps out as a stall).
    pub fn observe_completion(&mut self, requests: usize, service_ns: Nanos) {
        let Some(slot) = self.by_size.get_mut(requests) else {
            return;
        };
        let s = service_ns as f64;
        if slot.1 == 0 {
            slot.0 = s;
        } else {
            slot.0 += SIZE_ALPHA * (s - slot.0);
        }
        slot.1 = slot.1.saturating_add(1);
    }

    /// Fills [`Self::service`]: each size's own mean where it was seen; between two seen
    /// sizes the line through their means; past the seen ones, the nearest's mean moved by
    /// the fitted slope `b` (the fitted line alone when none was seen).
    fn fill_service(&mut self, cost: &Cost) {
        let seen = |n: usize| self.by_size[n].1 > 0;
        let mut below: Option<usize> = None;
        for n in 1..self.service.len() {
            let value = if seen(n) {
                below = Some(n);
                self.by_size[n].0
            } else {
                let above = (n + 1..self.by_size.len()).find(|&m| seen(m));
                match (below, above) {
                    (Some(lo), Some(hi)) => {
                        let (slo, shi) = (self.by_size[lo].0, self.by_size[hi].0);
                        slo + (shi - slo) * (n - lo) as f64 / (hi - lo) as f64
                    }
                    (Some(lo), None) => self.by_size[lo].0 + cost.b_ns * (n - lo) as f64,
                    (None, Some(hi)) => {
                        (self.by_size[hi].0 - cost.b_ns * (hi - n) as f64).max(cost.a_ns)
                    }
                    (None, None) => cost.service_ns(n as f64, 0.0),
                }
            };
            self.service[n] = value.max(0.0) as Nanos;
        }
    }

    /// The window in force, ns (`Some(0)`: work-conserving), in an open loop.
    pub fn window(&self) -> Option<Nanos> {
        self.chosen
    }

    /// Replays run so far.
    pub fn replays(&self) -> u64 {
        self.replays
    }

    /// The arrivals read as answering completions (a closed loop). The reading is noisy
    /// for bursty open arrivals, so a window in force stands down only at the second
    /// reading in a row.
    pub fn answering(&mut self) {
        self.answering += 1;
        if self.answering >= 2 {
            self.chosen = None;
        }
    }

    /// Replays the recorded arrivals under each window of the grid at `cost` and keeps the
    /// best (see the module docs), all at once. `overhead_ns` is what a hold costs beyond
    /// its length.
    pub fn replay(&mut self, cost: &Cost, overhead_ns: f64) {
        self.begin(cost, overhead_ns);
        while self.step() {}
    }

    /// Starts a replay at `cost` (or stands the window down: too few arrivals, a batch
    /// cost under [`REPLAY_COST_MIN_NS`], a steady stream); [`Self::step`] runs it, one window
    /// a call, so the engine never stalls for a whole replay.
    pub fn begin(&mut self, cost: &Cost, overhead_ns: f64) {
        // Room for the arrivals recorded while the replay runs (one per step).
        let n = (self.seen as usize).min(REPLAY_ARRIVALS - GRID);
        if n <= 2 * REPLAY_SETTLE || cost.samples == 0 {
            return;
        }
        // A batch cost under REPLAY_COST_MIN_NS: the replay would cost more engine time
        // than a batch (and no window pays for its wake-up at the latency model `none`).
        if cost.a_ns < REPLAY_COST_MIN_NS {
            self.chosen = None;
            return;
        }
        self.answering = 0;
        let start = self.seen as usize - n;
        // A steady stream over several slots is paced by the one-step rule, which beats any
        // fixed window there; over one slot no rule paces it (there is no other batch to
        // pace against), and what the echo rule reads in an open stream is noise, so the
        // replay decides there too (most often work-conserving dispatch, window 0).
        if self.free_at.len() > 1 && self.burstiness(start, n) <= super::PACING_BURSTINESS_MAX {
            self.chosen = None;
            return;
        }
        self.replays += 1;
        self.fill_service(cost);
        let mut windows = [0 as Nanos; GRID];
        let mut w = cost.a_ns / 64.0;
        for slot in windows.iter_mut().skip(1) {
            *slot = w as Nanos;
            w *= std::f64::consts::SQRT_2;
        }
        self.job = Some(Job {
            start,
            n,
            overhead: overhead_ns as Nanos,
            windows,
            results: [(0.0, 0.0); GRID],
            done: 0,
            begun_at: self.seen,
        });
    }

    /// Replays the next window of the replay under way; at the last, chooses. Returns
    /// whether more remain.
    pub fn step(&mut self) -> bool {
        let Some(mut job) = self.job else {
            return false;
        };
        job.results[job.done] =
            self.replay_one(job.start, job.n, job.windows[job.done], job.overhead);
        job.done += 1;
        if job.done < GRID {
            self.job = Some(job);
            return true;
        }
        self.job = None;
        self.choose(&job.windows, &job.results);
        false
    }

    /// Keeps the window of the grid whose replay came closest to the least p50 and p99.
    fn choose(&mut self, windows: &[Nanos; GRID], results: &[(f64, f64); GRID]) {
        let least = results.iter().fold((f64::INFINITY, f64::INFINITY), |m, r| {
            (m.0.min(r.0), m.1.min(r.1))
        });
        let (l50, l99) = (least.0.max(1.0), least.1.max(1.0));
        let mut own = [0.0f64; GRID];
        for (k, r) in results.iter().enumerate() {
            own[k] = (r.0 / l50).max(r.1 / l99);
        }
        // A window is as good as the worst of it and its neighbours on the grid: the
        // replayed p99 is a handful of bursts, and a window whose neighbours do badly won
        // on noise.
        let robust = |k: usize| {
            own[k.saturating_sub(1)..=(k + 1).min(GRID - 1)]
                .iter()
                .fold(0.0f64, |m, &s| m.max(s))
        };
        let (mut best, mut best_score) = (0, f64::INFINITY);
        for k in 0..GRID {
            let s = robust(k);
            if s < best_score {
                (best, best_score) = (k, s);
            }
        }
        // Keep the window in force (the nearest of the grid to it) unless beaten clearly.
        if let Some(current) = self.chosen {
            let near = windows
                .iter()
                .enumerate()
                .min_by_key(|&(_, &w)| w.abs_diff(current))
                .map_or(0, |(k, _)| k);
            if robust(near) <= best_score * SWITCH_MARGIN {
                best = near;
            }
        }
        self.chosen = Some(windows[best]);
    }

    /// Squared coefficient of variation of the gaps between `n` recorded arrivals from
    /// `start` (1 for
    /// Poisson arrivals; bursts of `k` give about `2k - 1`).
    fn burstiness(&self, start: usize, n: usize) -> f64 {
        let at = |i: usize| self.arrivals[(start + i) % REPLAY_ARRIVALS] as f64;
        let gaps = (n - 1) as f64;
        let mean = (at(n - 1) - at(0)) / gaps;
        if mean <= 0.0 {
            return 0.0;
        }
        let mut sum = 0.0;
        for i in 1..n {
            let d = at(i) - at(i - 1) - mean;
            sum += d * d;
        }
        sum / gaps / (mean * mean)
    }

    /// p50 and p99 (ns) of `n` recorded arrivals from `start` replayed under window `w`
    /// (0: work-conserving).
    fn replay_one(&mut self, start: usize, n: usize, w: Nanos, overhead: Nanos) -> (f64, f64) {
        let at = |i: usize| self.arrivals[(start + i) % REPLAY_ARRIVALS];
        let first = at(0);
        self.free_at.fill(first);
        let (mut head, mut counted) = (0usize, 0usize);
        while head < n {
            let (slot, free) = self
                .free_at
                .iter()
                .enumerate()
                .min_by_key(|&(_, &t)| t)
                .map(|(s, &t)| (s, t))
                .expect("at least one slot");
            let oldest = at(head);
            let due = if w == 0 {
                oldest
            } else {
                let full = head + self.max_batch - 1;
                let timed = oldest + w + overhead;
                if full < n {
                    timed.min(at(full))
                } else {
                    timed
                }
            };
            let go = due.max(free);
            let mut end = head + 1;
            while end < n && end - head < self.max_batch && at(end) <= go {
                end += 1;
            }
            let size = end - head;
            let done = go + self.service[size];
            self.free_at[slot] = done;
            for i in head..end {
                if i >= REPLAY_SETTLE {
                    self.latencies[counted] = done.saturating_sub(at(i));
                    counted += 1;
                }
            }
            head = end;
        }
        let lat = &mut self.latencies[..counted];
        let len = lat.len();
        let rank = |q: f64| ((len - 1) as f64 * q) as usize;
        // The p99 as the mean of the band from p98.5 to p99.5: a few requests either way
        // move a single rank's latency a lot, and the band less.
        let (lo, hi) = (rank(0.985), rank(0.995));
        lat.select_nth_unstable(lo);
        let top = &mut lat[lo..];
        top.sort_unstable();
        let band = &top[..=hi - lo];
        let p99 = band.iter().map(|&x| x as f64).sum::<f64>() / band.len() as f64;
        let k50 = rank(0.5);
        let p50 = *lat[..lo].select_nth_unstable(k50).1 as f64;
        (p50, p99)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cost(a_ms: f64, b_ms: f64) -> Cost {
        Cost {
            a_ns: a_ms * 1e6,
            b_ns: b_ms * 1e6,
            samples: 64,
            ..Cost::default()
        }
    }

    /// Bursts of `size` requests `gap` ns apart, one every `period` ns.
    fn record_bursts(r: &mut WindowReplay, size: u64, gap: Nanos, period: Nanos) {
        let mut t = 0;
        while r.seen < REPLAY_ARRIVALS as u64 {
            for i in 0..size {
                r.observe_arrival(t + i * gap);
            }
            t += period;
        }
    }

    #[test]
    fn waits_for_a_whole_burst_on_a_single_worker() {
        // Bursts of 8 a millisecond apart, every 100 ms, a = 20 ms: work-conserving sends
        // the first alone and the other 7 wait a whole batch; a window of ~7 ms takes them all.
        let mut r = WindowReplay::new(1, 32);
        record_bursts(&mut r, 8, 1_000_000, 100_000_000);
        r.replay(&cost(20.0, 0.1), 20_000.0);
        let w = r.window().expect("a replay ran");
        assert!((7_000_000..=14_000_000).contains(&w), "window {w} ns");
    }

    #[test]
    fn stays_work_conserving_for_bursts_a_window_cannot_gather() {
        // Pairs 15 ms apart starting at random (exponential gaps, mean 500 ms), a = 10 ms:
        // the second of a pair comes after the first's batch ends, so a wait for it only
        // delays the first.
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(5);
        let mut r = WindowReplay::new(2, 32);
        let mut t = 0.0f64;
        while r.seen < REPLAY_ARRIVALS as u64 {
            t += -(1.0 - rng.gen::<f64>()).ln() * 500e6;
            r.observe_arrival(t as Nanos);
            r.observe_arrival(t as Nanos + 15_000_000);
        }
        r.replay(&cost(10.0, 0.0), 20_000.0);
        assert_eq!(r.window(), Some(0));
    }

    #[test]
    fn replays_a_steady_stream_over_one_slot() {
        // One request every 5 ms for a whole record, one slot, a 10 ms batch: no rule paces
        // a single slot, so the replay decides, and dispatching at once is what it replays
        // best (a window only delays a stream that already fills each batch by itself).
        let mut r = WindowReplay::new(1, 32);
        for i in 0..REPLAY_ARRIVALS as u64 {
            r.observe_arrival(1_000_000_000 + i * 5_000_000);
        }
        r.replay(&cost(10.0, 0.0), 20_000.0);
        assert_eq!(r.replays(), 1, "a steady stream over one slot is replayed");
        assert_eq!(r.window(), Some(0));
    }

    #[test]
    fn stands_down_for_a_steady_stream() {
        // Bursts first, so a window is in force; then one request every 5 ms for a whole
        // record: not bursty, so the one-step rules pace it, and the window stands down.
        let mut r = WindowReplay::new(2, 32);
        record_bursts(&mut r, 8, 1_000_000, 100_000_000);
        r.replay(&cost(10.0, 0.0), 20_000.0);
        assert!(r.window().is_some_and(|w| w > 0), "bursts get a window");
        let replays = r.replays();
        let t0 = 1_000_000_000_000;
        for i in 0..REPLAY_ARRIVALS as u64 {
            r.observe_arrival(t0 + i * 5_000_000);
        }
        r.replay(&cost(10.0, 0.0), 20_000.0);
        assert_eq!(r.window(), None);
        assert_eq!(r.replays(), replays, "no replay of a steady stream");
    }

    #[test]
    fn sizes_not_seen_are_read_off_the_seen_ones() {
        let fit = cost(10.0, 1.0);
        let mut r = WindowReplay::new(1, 8);
        for _ in 0..4 {
            r.observe_completion(4, 14_000_000);
        }
        r.fill_service(&fit);
        assert_eq!(r.service[4], 14_000_000);
        assert_eq!(
            r.service[6], 16_000_000,
            "past the seen sizes: the fitted slope"
        );
        assert_eq!(r.service[2], 12_000_000, "below them: the fitted slope");
        r.observe_completion(8, 22_000_000);
        r.fill_service(&fit);
        assert_eq!(
            r.service[6], 18_000_000,
            "between two seen sizes: the line through them"
        );
    }

    #[test]
    fn a_hole_in_the_record_starts_it_over() {
        let mut r = WindowReplay::new(1, 32);
        record_bursts(&mut r, 8, 1_000_000, 100_000_000);
        r.replay(&cost(20.0, 0.1), 20_000.0);
        assert!(r.window().is_some());
        r.pause();
        assert_eq!(r.window(), None, "no window rests on a record with a hole");
        assert_eq!(r.seen, 0);
        let due: Vec<u64> = (1..=128).filter(|&t| r.observe_arrival(t)).collect();
        assert_eq!(due, [128], "the schedule starts over too");
    }

    #[test]
    fn a_replay_one_window_a_step_chooses_what_a_whole_replay_does() {
        // The engine runs a replay one window per turn while arrivals keep coming; the
        // record keeps room for them, so the choice is the same as all at once.
        let mut r = WindowReplay::new(1, 32);
        record_bursts(&mut r, 8, 1_000_000, 100_000_000);
        let mut whole = r.clone();
        whole.replay(&cost(20.0, 0.1), 20_000.0);
        r.begin(&cost(20.0, 0.1), 20_000.0);
        let mut t = 1_000_000_000_000;
        let mut steps = 0;
        loop {
            t += 1_000_000;
            r.observe_arrival(t);
            steps += 1;
            if !r.step() {
                break;
            }
        }
        assert_eq!(steps, GRID);
        assert!(whole.window().is_some_and(|w| w > 0));
        assert_eq!(r.window(), whole.window());
    }

    #[test]
    fn a_replay_is_dropped_when_a_turn_admits_more_than_it_has_room_for() {
        // The live engine admits a whole burst in one turn and steps once: past GRID
        // arrivals during a replay its record is overwritten, and the replay is dropped
        // rather than read out of order (which underflowed a latency).
        let mut r = WindowReplay::new(1, 32);
        record_bursts(&mut r, 8, 1_000_000, 100_000_000);
        r.begin(&cost(20.0, 0.1), 20_000.0);
        assert!(r.step(), "under way");
        for t in 0..=GRID as u64 {
            r.observe_arrival(2_000_000_000_000 + t);
        }
        assert!(!r.step(), "dropped");
        assert_eq!(r.window(), None);
    }

    #[test]
    fn replays_on_schedule_and_not_without_a_cost() {
        let mut r = WindowReplay::new(1, 8);
        let due: Vec<u64> = (1..=1_600)
            .filter(|&t| r.observe_arrival(t * REPLAY_INTERVAL_MIN_NS))
            .collect();
        assert_eq!(due, [128, 256, 512, 1024, 1536]);
        // Never more often than every REPLAY_INTERVAL_MIN_NS: 1,600 arrivals 10 us apart
        // are 16 ms, so only the first replay is due.
        let mut r = WindowReplay::new(1, 8);
        let due: Vec<u64> = (1..=1_600)
            .filter(|&t| r.observe_arrival(t * 10_000))
            .collect();
        assert_eq!(due, [128]);
        r.replay(&Cost::default(), 20_000.0);
        assert_eq!(r.window(), None, "no cost fitted yet");
        assert_eq!(r.replays(), 0);
    }
}
