//! `auto`'s cost model: the executor's batch service time, fitted online from completed
//! batches as `S = a + b n + c t` (n requests, t estimated tokens), by least squares over a
//! sliding window of the last [`COST_WINDOW`] batches.
//!
//! The prior is a GPU's shape: a batch's cost is fixed until batches of different sizes
//! show otherwise. Regressors are centred, so when every batch so far had the same size
//! (one or two clients under work-conserving dispatch) the slopes have nothing to fit and
//! the whole cost lands in `a`, and `auto` tries a bigger batch; the first batch of another
//! size separates `a` from `b`. Before any batch completes, the
//! model knows nothing and says `a = 0`: waiting never pays, so `auto` starts out
//! work-conserving.
//!
//! Incremental: the window's sums are kept as exact integers (requests, tokens and
//! nanoseconds are integers, and their products over 64 batches fit in `u128`), a new batch
//! added and the evicted one taken off, so a fit is a handful of operations per completed
//! batch, not a pass over the window, and nothing drifts.
//!
//! Outliers: a batch that took more than [`OUTLIER_FACTOR`] times what the fit predicts for
//! its shape (a worker descheduled, a page fault storm, a GC pause upstream) is counted in
//! [`Cost::outliers`] and kept out of the window: one 300 ms stall among 64 batches of 20 ms
//! would otherwise move `a` by 4.4 ms. More than [`OUTLIER_RUN_MAX`] outliers in a run are
//! not stalls but a slower executor, or a fit that is wrong for some batch size: those
//! batches enter the window, and the fit follows. The run counts each outlier as
//! [`OUTLIER_SPACING`] and takes one off per normal batch, so outliers fewer than
//! `OUTLIER_SPACING` normal batches apart build a run too, more slowly the farther apart
//! they are (the fourth enters when they come every batch or two, the tenth at six apart,
//! the eighteenth at seven), and ones that far apart or farther never do. Without that, a
//! fit that mispredicts one size by 4x (a step cost whose line crossed zero at batch 1,
//! seen in the property harness's seed 215) kept every batch of that size out of the
//! window, alternating as they did with normal batches, and was never corrected.
//!
//! Fixed-size arrays only: nothing here allocates, reads a clock or depends on anything but
//! the samples it was given.

/// Batches the fit remembers. 64 completed batches are a few seconds of a busy worker: long
/// enough to average out the latency model's noise (10 % of `a` in the Go spec's model),
/// short enough to follow a change of executor or load.
pub const COST_WINDOW: usize = 64;

/// Ridge weight on the slopes, relative to the window's length and the regressors' scale.
/// It only breaks ties (requests and tokens perfectly collinear, or no spread at all): with
/// two batch sizes 4 and 8 in the window it biases `b` by 0.1 %.
const RIDGE: f64 = 1e-4;

/// A batch slower than this multiple of its predicted time is an outlier. The noisiest
/// executor abe models (the Go spec's latency model, 10 % Gaussian noise on `a`) never
/// strays past 1.5x; a real slow-down of 4x is followed after [`OUTLIER_RUN_MAX`] batches.
pub const OUTLIER_FACTOR: f64 = 4.0;

/// Outliers in a run that are still taken for stalls; the next one enters the fit. Three
/// batches are 5 % of the window: following a real change that much later costs little.
pub const OUTLIER_RUN_MAX: u32 = 3;

/// What an outlier adds to the run, in normal batches that take it off again. A stall is
/// rare (the module doc's: one among 64 batches of 20 ms moves `a` by 4.4 ms, which is why
/// it is kept out); outliers that come every few batches are the executor's, or the fit's
/// fault, and must reach the window. Eight is the window's eighth: outliers closer than
/// that are already a pattern, not bad luck.
pub const OUTLIER_SPACING: u32 = 8;

/// The most a run counts, in outliers. A long slow spell that ends leaves the run at this;
/// after `(OUTLIER_RUN_CAP - OUTLIER_RUN_MAX + 1) * OUTLIER_SPACING` normal batches (32) a
/// stall is kept out again.
const OUTLIER_RUN_CAP: u32 = 2 * OUTLIER_RUN_MAX;

/// Batches in the window before outliers are judged (a fit on fewer is itself unsure).
const OUTLIER_MIN_SAMPLES: usize = 8;

/// One completed batch.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Sample {
    requests: u64,
    tokens: u64,
    service_ns: u64,
}

/// The fitted cost `S(n, t) = a + b n + c t`, in nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Cost {
    /// Fixed cost of a batch, ns (never negative).
    pub a_ns: f64,
    /// Cost per request, ns (never negative).
    pub b_ns: f64,
    /// Cost per estimated token, ns (never negative).
    pub c_ns_per_token: f64,
    /// Batches the fit rests on (0: the prior alone, `a = b = c = 0`).
    pub samples: usize,
    /// Batches kept out of the fit as outliers, since start.
    pub outliers: u64,
}

impl Cost {
    /// Predicted service time of a batch of `requests` holding `tokens`, ns.
    pub fn service_ns(&self, requests: f64, tokens: f64) -> f64 {
        self.a_ns + self.b_ns * requests + self.c_ns_per_token * tokens
    }
}

/// Largest value a sample's field keeps (requests, tokens, service ns); larger ones are
/// clamped to it. 2^57 ns is four and a half years and 2^57 tokens no batch holds, so the
/// clamp never bites, and it bounds a window's sum of one field below 2^63: the single sums
/// are `u64` and convert to `f64` in one instruction.
const SAMPLE_MAX: u64 = (1 << 57) - 1;

/// Exact sums over the window: of `n`, `t`, `s` (service ns) and of their products.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Sums {
    n: u64,
    t: u64,
    s: u64,
    nn: u128,
    tt: u128,
    nt: u128,
    ns: u128,
    ts: u128,
}

/// `x * y` of two `u64`, exact: one widening multiply.
#[inline]
fn wide(x: u64, y: u64) -> u128 {
    u128::from(x) * u128::from(y)
}

impl Sums {
    fn add(&mut self, x: &Sample) {
        let (n, t, s) = (x.requests, x.tokens, x.service_ns);
        self.n += n;
        self.t += t;
        self.s += s;
        self.nn += wide(n, n);
        self.tt += wide(t, t);
        self.nt += wide(n, t);
        self.ns += wide(n, s);
        self.ts += wide(t, s);
    }

    fn remove(&mut self, x: &Sample) {
        let (n, t, s) = (x.requests, x.tokens, x.service_ns);
        self.n -= n;
        self.t -= t;
        self.s -= s;
        self.nn -= wide(n, n);
        self.tt -= wide(t, t);
        self.nt -= wide(n, t);
        self.ns -= wide(n, s);
        self.ts -= wide(t, s);
    }
}

/// `len` times the centred co-moment of two regressors, `len * sum(xy) - sum(x) sum(y)`,
/// computed exactly, divided by `len` in floating point. The single sums are below 2^63
/// ([`SAMPLE_MAX`]), a product's sum below 2^120 (64 products below 2^114) and `len` at most
/// 2^6, so both terms are below 2^126, fit in `i128`, and the difference is exact.
#[inline]
fn centred(len: u64, xy: u128, x: u64, y: u64) -> f64 {
    let scaled = (u128::from(len) * xy) as i128 - wide(x, y) as i128;
    wide_to_f64(scaled) / len as f64
}

/// `x as f64`, the same value, one instruction where `x` fits in 64 bits (it does for any
/// window of batches under a few hours each): a 128-bit conversion is a library call, and
/// a fit makes five of them per completed batch.
#[inline]
fn wide_to_f64(x: i128) -> f64 {
    match i64::try_from(x) {
        Ok(narrow) => narrow as f64,
        Err(_) => wide_to_f64_slow(x),
    }
}

/// The 128-bit conversion itself, out of line: written inline in [`wide_to_f64`]'s other arm,
/// the optimiser saw both arms give the same value and kept only this one, so every fit
/// called the library routine eight times (callgrind, 2,000 requests on one connection:
/// 15,800 calls, about 250 instructions a request on the engine thread).
#[cold]
#[inline(never)]
fn wide_to_f64_slow(x: i128) -> f64 {
    x as f64
}

/// Sliding-window least squares over the last [`COST_WINDOW`] batches.
#[derive(Clone, Debug)]
pub struct CostModel {
    window: [Sample; COST_WINDOW],
    /// Next slot to write in `window`; `len` of them are valid.
    next: usize,
    len: usize,
    /// Sums over the `len` valid samples (kept equal to a recount: a debug check says so).
    sums: Sums,
    /// Outliers so far, and the current run counted in [`OUTLIER_SPACING`]ths of an outlier:
    /// `+OUTLIER_SPACING` per outlier, `-1` per normal batch, at most
    /// [`OUTLIER_RUN_CAP`] outliers' worth.
    outliers: u64,
    outlier_run: u32,
    fitted: Cost,
}

impl Default for CostModel {
    fn default() -> Self {
        CostModel {
            window: [Sample::default(); COST_WINDOW],
            next: 0,
            len: 0,
            sums: Sums::default(),
            outliers: 0,
            outlier_run: 0,
            fitted: Cost::default(),
        }
    }
}

impl CostModel {
    /// Adds a completed batch (unless it is an outlier) and refits. Returns whether the
    /// batch was kept (not an outlier, not empty).
    pub fn observe(&mut self, requests: usize, tokens: u64, service_ns: u64) -> bool {
        if requests == 0 {
            return false;
        }
        let sample = Sample {
            requests: (requests as u64).min(SAMPLE_MAX),
            tokens: tokens.min(SAMPLE_MAX),
            service_ns: service_ns.min(SAMPLE_MAX),
        };
        if self.len >= OUTLIER_MIN_SAMPLES {
            let predicted = self.fitted.service_ns(requests as f64, tokens as f64);
            if service_ns as f64 > OUTLIER_FACTOR * predicted {
                self.outlier_run =
                    (self.outlier_run + OUTLIER_SPACING).min(OUTLIER_RUN_CAP * OUTLIER_SPACING);
                if self.outlier_run <= OUTLIER_RUN_MAX * OUTLIER_SPACING {
                    self.outliers += 1;
                    self.fitted.outliers = self.outliers;
                    return false;
                }
            } else {
                // Decays rather than resets: an executor that became slower makes some
                // batches look normal again as the fit moves, and must not start over.
                self.outlier_run = self.outlier_run.saturating_sub(1);
            }
        }
        if self.len == COST_WINDOW {
            let evicted = self.window[self.next];
            self.sums.remove(&evicted);
        }
        self.window[self.next] = sample;
        self.sums.add(&sample);
        self.next = (self.next + 1) % COST_WINDOW;
        self.len = (self.len + 1).min(COST_WINDOW);
        debug_assert!(self.sums_match_the_window());
        self.fitted = self.fit();
        true
    }

    /// The current fit.
    pub fn cost(&self) -> Cost {
        self.fitted
    }

    /// The running sums equal a recount of the window (debug builds check this after every
    /// batch).
    fn sums_match_the_window(&self) -> bool {
        let mut recount = Sums::default();
        for s in &self.window[..self.len] {
            recount.add(s);
        }
        recount == self.sums
    }

    /// Solves the ridge-regularised normal equations from the running sums.
    ///
    /// Regressors are centred on their window means, so the intercept separates from the
    /// slopes and the ridge penalty acts on the slopes alone; `a` is the mean service time
    /// less what the slopes explain.
    fn fit(&self) -> Cost {
        if self.len == 0 {
            return Cost {
                outliers: self.outliers,
                ..Cost::default()
            };
        }
        let len = self.len as u64;
        let n = self.len as f64;
        let z = &self.sums;
        // Below 2^63 (`SAMPLE_MAX`), so the signed conversion is exact and one instruction.
        let mean = |sum: u64| sum as i64 as f64 / n;
        let (mn, mt, ms) = (mean(z.n), mean(z.t), mean(z.s));
        // Centred second moments, exact up to the final division.
        let snn = centred(len, z.nn, z.n, z.n);
        let stt = centred(len, z.tt, z.t, z.t);
        let snt = centred(len, z.nt, z.n, z.t);
        let sns = centred(len, z.ns, z.n, z.s);
        let sts = centred(len, z.ts, z.t, z.s);
        // Ridge scaled by the regressor's mean (not its spread: a window with no spread must
        // still be penalised), so the penalty is unit-free.
        let rn = RIDGE * n * (mn * mn).max(1.0);
        let rt = RIDGE * n * (mt * mt).max(1.0);
        let (a11, a22, a12) = (snn + rn, stt + rt, snt);
        let det = a11 * a22 - a12 * a12;
        let (mut b, mut c) = if det > 0.0 {
            ((sns * a22 - sts * a12) / det, (a11 * sts - a12 * sns) / det)
        } else {
            (0.0, 0.0)
        };
        // Costs are never negative: a slope that fits negative is noise (or a cache effect
        // abe cannot exploit); refit the other slope alone.
        if b < 0.0 {
            b = 0.0;
            c = (sts / a22).max(0.0);
        }
        if c < 0.0 {
            c = 0.0;
            b = (sns / a11).max(0.0);
        }
        let a = (ms - b * mn - c * mt).max(0.0);
        Cost {
            a_ns: a,
            b_ns: b,
            c_ns_per_token: c,
            samples: self.len,
            outliers: self.outliers,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(x: f64, y: f64, rel: f64) -> bool {
        (x - y).abs() <= rel * y.abs().max(1.0)
    }

    #[test]
    fn the_fast_conversion_is_the_conversion() {
        let big = i128::from(i64::MAX);
        for x in [
            0,
            1,
            -1,
            1 << 53,
            (1 << 53) + 1,
            big,
            big + 1,
            -big - 1,
            -big - 2,
            big << 40,
        ] {
            assert_eq!(wide_to_f64(x).to_bits(), (x as f64).to_bits(), "{x}");
        }
    }

    #[test]
    fn knows_nothing_before_the_first_batch() {
        let m = CostModel::default();
        assert_eq!(m.cost(), Cost::default());
        assert_eq!(m.cost().service_ns(8.0, 1000.0), 0.0);
    }

    #[test]
    fn recovers_a_and_b_from_two_batch_sizes() {
        let mut m = CostModel::default();
        // a = 10 ms, b = 2 ms, tokens proportional to n (no information on c).
        for i in 0..40 {
            let n = if i % 2 == 0 { 4 } else { 8 };
            m.observe(n, 100 * n as u64, 10_000_000 + 2_000_000 * n as u64);
        }
        let c = m.cost();
        // Tokens are collinear with n here: the split between b and c is the ridge's choice,
        // but the prediction for the observed shapes is exact and a is recovered.
        assert!(close(c.a_ns, 10e6, 0.01), "{c:?}");
        assert!(close(c.service_ns(6.0, 600.0), 22e6, 0.01), "{c:?}");
    }

    #[test]
    fn equal_batches_put_the_cost_in_a() {
        let mut m = CostModel::default();
        for _ in 0..20 {
            m.observe(1, 64, 50_000_000);
        }
        let c = m.cost();
        assert!(close(c.a_ns, 50e6, 0.01), "{c:?}");
        assert!(c.b_ns < 1e-6 * 50e6, "{c:?}");
    }

    #[test]
    fn separates_token_cost_from_request_cost() {
        let mut m = CostModel::default();
        // a = 5 ms, b = 1 ms, c = 0.01 ms/token, tokens independent of n.
        let mut k = 0u64;
        for n in 1..=8u64 {
            for t in [50u64, 400, 2000] {
                k += 1;
                let tokens = t * n + 7 * k % 13;
                let s = 5_000_000 + 1_000_000 * n + 10_000 * tokens;
                m.observe(n as usize, tokens, s);
            }
        }
        let c = m.cost();
        assert!(close(c.a_ns, 5e6, 0.05), "{c:?}");
        assert!(close(c.b_ns, 1e6, 0.05), "{c:?}");
        assert!(close(c.c_ns_per_token, 1e4, 0.05), "{c:?}");
    }

    #[test]
    fn follows_a_change_of_executor_within_one_window() {
        let mut m = CostModel::default();
        for i in 0..COST_WINDOW {
            let n = 1 + i % 4;
            m.observe(n, 0, 1_000_000 * n as u64);
        }
        // The first few are taken for stalls, then the window fills with the new executor.
        for i in 0..COST_WINDOW + OUTLIER_RUN_MAX as usize {
            let n = 1 + i % 4;
            m.observe(n, 0, 20_000_000 + 500_000 * n as u64);
        }
        let c = m.cost();
        assert!(close(c.a_ns, 20e6, 0.02), "{c:?}");
        assert!(close(c.b_ns, 0.5e6, 0.1), "{c:?}");
    }

    #[test]
    fn never_negative() {
        let mut m = CostModel::default();
        // Bigger batches faster: nonsense data must not yield a negative cost.
        for n in 1..=10usize {
            m.observe(n, 0, 10_000_000 - 500_000 * n as u64);
        }
        let c = m.cost();
        assert!(
            c.a_ns >= 0.0 && c.b_ns >= 0.0 && c.c_ns_per_token >= 0.0,
            "{c:?}"
        );
    }

    #[test]
    fn one_stall_does_not_move_the_fit() {
        let mut m = CostModel::default();
        // a = 20 ms, b = 1 ms; one batch stalls 300 ms in the middle of the window.
        for i in 0..COST_WINDOW as u64 {
            let n = 1 + i % 4;
            let s = if i == 40 {
                300_000_000
            } else {
                20_000_000 + 1_000_000 * n
            };
            m.observe(n as usize, 0, s);
        }
        let c = m.cost();
        assert_eq!(c.outliers, 1, "{c:?}");
        assert!(close(c.a_ns, 20e6, 0.001), "{c:?}");
        assert!(close(c.b_ns, 1e6, 0.001), "{c:?}");
    }

    #[test]
    fn a_size_the_fit_mispredicts_reaches_the_window_even_between_normal_batches() {
        // Seed 215 of the property harness: a step cost (a = 44.7 ms, 0.61 ms per 8
        // requests started), first seen only at 32 and 33, where the step makes the line
        // cross zero before batch 1; then batches of 1 and 32 alternate. Each batch of 1
        // is 4x slower than the line says, each of 32 is normal: outliers between normal
        // batches. Kept out for good, they would leave `a` near 0 and `auto` never holding.
        let step = |n: u64| 44_660_000 + 609_000 * 8 * n.div_ceil(8);
        let mut m = CostModel::default();
        for i in 0..COST_WINDOW as u64 {
            m.observe(32 + (i % 2) as usize, 0, step(32 + i % 2));
        }
        let wrong = m.cost();
        assert!(
            wrong.service_ns(1.0, 0.0) * OUTLIER_FACTOR < step(1) as f64,
            "{wrong:?}"
        );
        for _ in 0..COST_WINDOW {
            m.observe(1, 0, step(1));
            m.observe(32, 0, step(32));
        }
        let c = m.cost();
        assert_eq!(
            c.outliers,
            u64::from(OUTLIER_RUN_MAX),
            "only a run's worth kept out: {c:?}"
        );
        assert!(close(c.service_ns(1.0, 0.0), step(1) as f64, 0.01), "{c:?}");
        assert!(
            close(c.service_ns(32.0, 0.0), step(32) as f64, 0.01),
            "{c:?}"
        );
    }

    #[test]
    fn stalls_a_few_batches_apart_are_still_kept_out() {
        // a = 20 ms, b = 1 ms; a 300 ms stall after every OUTLIER_SPACING normal batches.
        let every = u64::from(OUTLIER_SPACING) + 1;
        let mut m = CostModel::default();
        let mut stalls = 0;
        for i in 0..4 * COST_WINDOW as u64 {
            let n = 1 + i % 4;
            let stall = i >= COST_WINDOW as u64 && i % every == 0;
            stalls += u64::from(stall);
            let s = if stall {
                300_000_000
            } else {
                20_000_000 + 1_000_000 * n
            };
            m.observe(n as usize, 0, s);
        }
        let c = m.cost();
        assert_eq!(c.outliers, stalls, "every stall kept out: {c:?}");
        assert!(close(c.a_ns, 20e6, 0.001), "{c:?}");
    }

    #[test]
    fn a_slower_executor_is_followed_not_rejected() {
        let mut m = CostModel::default();
        for i in 0..COST_WINDOW as u64 {
            m.observe(1 + (i % 4) as usize, 0, 1_000_000 * (1 + i % 4));
        }
        // Ten times slower from now on: the first OUTLIER_RUN_MAX are taken for stalls.
        for i in 0..2 * COST_WINDOW as u64 {
            m.observe(1 + (i % 4) as usize, 0, 10_000_000 * (1 + i % 4));
        }
        let c = m.cost();
        assert_eq!(c.outliers, u64::from(OUTLIER_RUN_MAX), "{c:?}");
        assert!(close(c.b_ns, 10e6, 0.01), "{c:?}");
        assert!(c.a_ns < 0.01 * 10e6, "{c:?}");
    }

    /// The textbook two-pass fit in floating point over a list of samples (what the
    /// running sums replace): means first, then centred moments, then the same solve.
    fn refit(samples: &[(u64, u64, u64)]) -> Cost {
        let n = samples.len() as f64;
        let mean =
            |f: fn(&(u64, u64, u64)) -> u64| samples.iter().map(|x| f(x) as f64).sum::<f64>() / n;
        let (mn, mt, ms) = (mean(|x| x.0), mean(|x| x.1), mean(|x| x.2));
        let (mut snn, mut stt, mut snt, mut sns, mut sts) = (0.0, 0.0, 0.0, 0.0, 0.0);
        for &(rn, rt, rs) in samples {
            let (dn, dt, ds) = (rn as f64 - mn, rt as f64 - mt, rs as f64 - ms);
            snn += dn * dn;
            stt += dt * dt;
            snt += dn * dt;
            sns += dn * ds;
            sts += dt * ds;
        }
        let a11 = snn + RIDGE * n * (mn * mn).max(1.0);
        let a22 = stt + RIDGE * n * (mt * mt).max(1.0);
        let det = a11 * a22 - snt * snt;
        let b = (sns * a22 - sts * snt) / det;
        let c = (a11 * sts - snt * sns) / det;
        Cost {
            a_ns: ms - b * mn - c * mt,
            b_ns: b,
            c_ns_per_token: c,
            samples: samples.len(),
            outliers: 0,
        }
    }

    #[test]
    fn running_sums_fit_what_a_refit_of_the_window_fits() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(5);
        let mut m = CostModel::default();
        let mut all = Vec::new();
        for _ in 0..1000 {
            let n = rng.gen_range(1..=64u64);
            let t = n * rng.gen_range(10..2000u64);
            // a = 3 ms, b = 0.2 ms, c = 1 us/token, +-10 % noise: never an outlier.
            let s = (3e6 + 2e5 * n as f64 + 1e3 * t as f64) * rng.gen_range(0.9..1.1);
            m.observe(n as usize, t, s as u64);
            all.push((n, t, s as u64));
        }
        let expected = refit(&all[all.len() - COST_WINDOW..]);
        let got = m.cost();
        assert_eq!(got.outliers, 0);
        assert!(close(got.a_ns, expected.a_ns, 1e-6), "{got:?} {expected:?}");
        assert!(close(got.b_ns, expected.b_ns, 1e-6), "{got:?} {expected:?}");
        assert!(close(got.c_ns_per_token, expected.c_ns_per_token, 1e-6));
        assert!(close(got.a_ns, 3e6, 0.1), "{got:?}");
    }
}
