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

/// One completed batch.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Sample {
    requests: f64,
    tokens: f64,
    service_ns: f64,
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
}

impl Cost {
    /// Predicted service time of a batch of `requests` holding `tokens`, ns.
    pub fn service_ns(&self, requests: f64, tokens: f64) -> f64 {
        self.a_ns + self.b_ns * requests + self.c_ns_per_token * tokens
    }
}

/// Sliding-window least squares over the last [`COST_WINDOW`] batches.
#[derive(Clone, Debug)]
pub struct CostModel {
    window: [Sample; COST_WINDOW],
    /// Next slot to write in `window`; `len` of them are valid.
    next: usize,
    len: usize,
    fitted: Cost,
}

impl Default for CostModel {
    fn default() -> Self {
        CostModel {
            window: [Sample::default(); COST_WINDOW],
            next: 0,
            len: 0,
            fitted: Cost::default(),
        }
    }
}

impl CostModel {
    /// Adds a completed batch and refits.
    pub fn observe(&mut self, requests: usize, tokens: u64, service_ns: u64) {
        if requests == 0 {
            return;
        }
        self.window[self.next] = Sample {
            requests: requests as f64,
            tokens: tokens as f64,
            service_ns: service_ns as f64,
        };
        self.next = (self.next + 1) % COST_WINDOW;
        self.len = (self.len + 1).min(COST_WINDOW);
        self.fitted = self.fit();
    }

    /// The current fit.
    pub fn cost(&self) -> Cost {
        self.fitted
    }

    /// Solves the ridge-regularised normal equations. The sums are recomputed from the
    /// window each time (64 x 9 multiply-adds): no running sums to drift.
    ///
    /// Regressors are centred on their window means, so the intercept separates from the
    /// slopes and the ridge penalty acts on the slopes alone; `a` is the mean service time
    /// less what the slopes explain.
    fn fit(&self) -> Cost {
        let samples = &self.window[..self.len];
        let n = samples.len() as f64;
        if samples.is_empty() {
            return Cost::default();
        }
        let (mut mn, mut mt, mut ms) = (0.0, 0.0, 0.0);
        for s in samples {
            mn += s.requests;
            mt += s.tokens;
            ms += s.service_ns;
        }
        mn /= n;
        mt /= n;
        ms /= n;
        // Centred second moments.
        let (mut snn, mut stt, mut snt, mut sns, mut sts) = (0.0, 0.0, 0.0, 0.0, 0.0);
        for s in samples {
            let (dn, dt, ds) = (s.requests - mn, s.tokens - mt, s.service_ns - ms);
            snn += dn * dn;
            stt += dt * dt;
            snt += dn * dt;
            sns += dn * ds;
            sts += dt * ds;
        }
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
            samples: samples.len(),
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
        for i in 0..COST_WINDOW {
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
}
