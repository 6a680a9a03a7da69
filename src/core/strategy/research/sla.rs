//! Algorithm 2 of the dynamic-batching research strategy: the SLA controller that keeps an
//! interval `[b_low, b_high]` of batch sizes and moves it so the observed decode
//! time-between-tokens stays within `d_sla_ms +- epsilon_ms`; `b_sla` is its midpoint.
//!
//! Sources: Pang, Li, Wang, arXiv 2503.05248 (P2) Algorithm 2, as quoted by Eventual-Inc/Daft
//! `dynamic_batching/latency_constrained.rs` and TravisLeeTS/llm-scheduler-sim
//! `schedulers.py::SLAController`. Where the reference repo departs from the paper this
//! follows the paper; each departure is noted where it applies.
//!
//! A plain state machine: `update` after every completed batch, `b_sla` at batch formation.
//! Nothing here allocates, reads a clock or does I/O; times are passed in as f64 ms.

use super::memory::InvalidParam;

/// Controller parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SlaParams {
    /// Target decode time between tokens, ms. Default 10 (the reference's `D_SLA_TOKEN`).
    pub d_sla_ms: f64,
    /// Half-width of the tolerance band around `d_sla_ms`, ms. Default 5 (band [5, 15]).
    pub epsilon_ms: f64,
    /// Step `alpha`: minimum interval width when a bound moves. Default 4.
    pub alpha: u32,
    /// Step `delta`: how far the far bound creeps per update. Default 2.
    pub delta: u32,
    /// EMA weight of the newest observation for `tau` and the batch-size average. Default
    /// 0.2. Invariant: in `(0, 1]`.
    pub ema_weight: f64,
    /// Updates that only feed the averages before the interval first moves. Default 3.
    pub warmup_updates: u32,
    /// Smallest batch. Default 1. Invariant: `1 <= b_min <= b_max`.
    pub b_min: u32,
    /// Largest batch; for a bin, the bin's memory cap. Default 128.
    pub b_max: u32,
}

impl Default for SlaParams {
    fn default() -> Self {
        SlaParams {
            d_sla_ms: 10.0,
            epsilon_ms: 5.0,
            alpha: 4,
            delta: 2,
            ema_weight: 0.2,
            warmup_updates: 3,
            b_min: 1,
            b_max: 128,
        }
    }
}

impl SlaParams {
    /// Checks every invariant stated on the fields.
    pub fn validate(&self) -> Result<(), InvalidParam> {
        let err = |param, reason| Err(InvalidParam { param, reason });
        if !(self.d_sla_ms.is_finite() && self.d_sla_ms > 0.0) {
            return err("d_sla_ms", "must be a number greater than 0");
        }
        if !(self.epsilon_ms.is_finite() && self.epsilon_ms >= 0.0) {
            return err("epsilon_ms", "must be a number at least 0");
        }
        if !(self.ema_weight > 0.0 && self.ema_weight <= 1.0) {
            return err("ema_weight", "must be in (0, 1]");
        }
        if self.b_min == 0 || self.b_min > self.b_max {
            return err("b_min / b_max", "need 1 <= b_min <= b_max");
        }
        Ok(())
    }
}

/// The Algorithm 2 controller for one scope (global, or one bin).
#[derive(Clone, Copy, Debug)]
pub struct SlaController {
    params: SlaParams,
    /// Invariant: `b_min <= b_low <= b_high`.
    b_low: u32,
    /// Invariant: `b_high <= b_max`.
    b_high: u32,
    /// `tau`: EMA of observed decode TBT, ms. Meaningless while `updates == 0`.
    tbt_ms_ema: f64,
    /// `b-bar`: EMA of completed batch sizes. Meaningless while `updates == 0`.
    batch_size_ema: f64,
    /// Accepted updates (saturating).
    updates: u32,
}

impl SlaController {
    /// A controller with the full interval `[b_min, b_max]`. Panics on invalid params
    /// (config validation calls [`SlaParams::validate`] first).
    pub fn new(params: SlaParams) -> Self {
        if let Err(e) = params.validate() {
            panic!("SLA controller: {e}");
        }
        SlaController {
            params,
            b_low: params.b_min,
            b_high: params.b_max,
            tbt_ms_ema: 0.0,
            batch_size_ema: 0.0,
            updates: 0,
        }
    }

    /// The parameters in force.
    pub fn params(&self) -> &SlaParams {
        &self.params
    }

    /// Lower bound of the interval.
    pub fn b_low(&self) -> u32 {
        self.b_low
    }

    /// Upper bound of the interval.
    pub fn b_high(&self) -> u32 {
        self.b_high
    }

    /// `tau`, the EMA of decode TBT in ms; `None` before the first update.
    pub fn tbt_ms_ema(&self) -> Option<f64> {
        (self.updates > 0).then_some(self.tbt_ms_ema)
    }

    /// `b-bar`, the EMA of batch sizes; `None` before the first update.
    pub fn batch_size_ema(&self) -> Option<f64> {
        (self.updates > 0).then_some(self.batch_size_ema)
    }

    /// Updates accepted so far.
    pub fn updates(&self) -> u32 {
        self.updates
    }

    /// True while the interval has not moved yet (fewer than `warmup_updates` updates).
    pub fn warming_up(&self) -> bool {
        self.updates < self.params.warmup_updates
    }

    /// Feedback after a completed batch of `batch_size` requests whose decode TBT was
    /// `observed_tbt_ms`. An empty batch or a TBT that is not a finite non-negative number
    /// is ignored (the reference ignores batch size 0).
    ///
    /// The first observation seeds both EMAs; later ones blend in with `ema_weight`.
    /// (Departure from the reference, which starts `tau` at 0 and `b-bar` at the midpoint,
    /// biasing `tau` low: 0.488 x the true TBT after 3 equal samples. The paper uses plain
    /// recent averages, which an unbiased seed matches more closely.)
    ///
    /// Once `warmup_updates` updates are in (the 3rd, by default), every update also moves
    /// the interval. (Departure from the reference, which moves it at every batch
    /// formation, so a burst of formations between two completions moves it repeatedly on
    /// the same stale `tau`; the paper steps once per iteration with a new observation.)
    pub fn update(&mut self, observed_tbt_ms: f64, batch_size: u32) {
        debug_assert!(
            observed_tbt_ms.is_finite() && observed_tbt_ms >= 0.0,
            "decode TBT must be a finite non-negative ms value, got {observed_tbt_ms}"
        );
        if batch_size == 0 || !(observed_tbt_ms.is_finite() && observed_tbt_ms >= 0.0) {
            return;
        }
        let w = self.params.ema_weight;
        if self.updates == 0 {
            self.tbt_ms_ema = observed_tbt_ms;
            self.batch_size_ema = f64::from(batch_size);
        } else {
            self.tbt_ms_ema = w * observed_tbt_ms + (1.0 - w) * self.tbt_ms_ema;
            self.batch_size_ema = w * f64::from(batch_size) + (1.0 - w) * self.batch_size_ema;
        }
        self.updates = self.updates.saturating_add(1);
        if !self.warming_up() {
            self.step();
        }
    }

    /// One step of the paper's Algorithm 2 from the current averages.
    fn step(&mut self) {
        let p = &self.params;
        let (b_min, b_max) = (i64::from(p.b_min), i64::from(p.b_max));
        let (alpha, delta) = (i64::from(p.alpha), i64::from(p.delta));
        let (low, high) = (i64::from(self.b_low), i64::from(self.b_high));
        // Batch sizes are positive, so the EMA is too; `as` floors it.
        let b_avg = self.batch_size_ema as i64;
        let tau = self.tbt_ms_ema;
        let (new_low, new_high) = if tau > p.d_sla_ms + p.epsilon_ms {
            // Too slow: move b_high to b-bar (keeping alpha above b_low), ease b_low.
            // The paper assigns, so b_high rises if b-bar is above it (batches grown by
            // the N_decode floor); the reference only ever shrinks b_high here
            // (`min(b_high, ...)`). Following the paper.
            ((low - delta).max(b_min), b_avg.max(low + alpha))
        } else if tau < p.d_sla_ms - p.epsilon_ms {
            // Too fast: raise b_low to b-bar (keeping alpha below b_high), ease b_high.
            // Paper assigns; the reference only ever raises b_low. Following the paper.
            (b_avg.min(high - alpha), (high + delta).min(b_max))
        } else {
            // In the band: a window of width alpha around b-bar.
            (
                (b_avg - alpha / 2).max(b_min),
                (b_avg + alpha / 2).min(b_max),
            )
        };
        // Keep both bounds in [b_min, b_max]. If b_low > b_high (b-bar far outside the
        // range, e.g. batches grown past b_max by the N_decode floor, or a shrunken b_max),
        // collapse the interval onto b_high, the reference's repair (the paper is silent).
        let high = new_high.clamp(b_min, b_max);
        let low = new_low.clamp(b_min, high);
        // Both lie in [b_min, b_max], which fits u32.
        self.b_low = low as u32;
        self.b_high = high as u32;
    }

    /// Sets a new `b_max` (a bin's memory cap after the boundaries were recomputed),
    /// clamping the interval into `[b_min, b_max]`; an interval left entirely above the new
    /// cap collapses onto it. A value below `b_min` is raised to `b_min`.
    pub fn set_b_max(&mut self, b_max: u32) {
        self.params.b_max = b_max.max(self.params.b_min);
        self.b_high = self.b_high.min(self.params.b_max);
        self.b_low = self.b_low.min(self.b_high);
    }

    /// True when the averaged decode TBT is above the band (`tau > d_sla + epsilon`): the
    /// SLA is being missed. False before the first update.
    pub fn too_slow(&self) -> bool {
        self.updates > 0 && self.tbt_ms_ema > self.params.d_sla_ms + self.params.epsilon_ms
    }

    /// `b_SLA = floor((b_low + b_high) / 2)`, raised to `n_decode` (requests already
    /// decoding cannot be dropped: the paper's `b_SLA >= N_decode`). While warming up the
    /// interval is still `[b_min, b_max]`, so this is their midpoint (64 for 1..128).
    ///
    /// The `N_decode` floor wins over `b_max` (the reference clamps to `B_max` after it);
    /// the memory bound is applied separately through `min(b_mem, b_sla)`.
    pub fn b_sla(&self, n_decode: u32) -> u32 {
        let mid = (self.b_low + self.b_high) / 2;
        mid.max(n_decode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn controller() -> SlaController {
        SlaController::new(SlaParams::default()) // band [5, 15] ms, alpha 4, delta 2, 1..128
    }

    #[test]
    fn warm_up_returns_the_midpoint_until_the_third_update() {
        let mut c = controller();
        assert_eq!(c.b_sla(0), 64); // (1 + 128) / 2
        assert_eq!(c.tbt_ms_ema(), None);
        c.update(20.0, 64);
        c.update(20.0, 64);
        assert!(c.warming_up());
        assert_eq!((c.b_low(), c.b_high(), c.b_sla(0)), (1, 128, 64));
        c.update(20.0, 64);
        assert!(!c.warming_up());
        assert_ne!(c.b_sla(0), 64);
    }

    #[test]
    fn too_slow_shrinks_the_interval_towards_b_avg() {
        let mut c = controller();
        for _ in 0..3 {
            c.update(20.0, 64); // tau 20 > 15
        }
        // b_high = max(64, 1 + 4) = 64; b_low = max(1 - 2, 1) = 1; b_sla = 65 / 2 = 32.
        assert_eq!((c.b_low(), c.b_high(), c.b_sla(0)), (1, 64, 32));
        c.update(20.0, 32);
        // b-bar = 0.2 x 32 + 0.8 x 64 = 57.6 -> 57; b_high = 57; b_sla = 58 / 2 = 29.
        assert!((c.batch_size_ema().unwrap() - 57.6).abs() < 1e-9);
        assert_eq!((c.b_low(), c.b_high(), c.b_sla(0)), (1, 57, 29));
    }

    #[test]
    fn too_fast_raises_the_interval() {
        let mut c = controller();
        for _ in 0..3 {
            c.update(2.0, 64); // tau 2 < 5
        }
        // b_low = min(64, 128 - 4) = 64; b_high = min(128 + 2, 128) = 128; b_sla = 96.
        assert_eq!((c.b_low(), c.b_high(), c.b_sla(0)), (64, 128, 96));
        c.update(2.0, 96);
        // b-bar = 0.2 x 96 + 0.8 x 64 = 70.4 -> 70; b_low = min(70, 124) = 70; b_sla = 99.
        assert_eq!((c.b_low(), c.b_high(), c.b_sla(0)), (70, 128, 99));
    }

    #[test]
    fn paper_assigns_b_low_where_the_reference_would_keep_it() {
        let mut c = controller();
        for _ in 0..3 {
            c.update(2.0, 100); // b_low = min(100, 124) = 100
        }
        assert_eq!(c.b_low(), 100);
        // b-bar = 0.2 x 10 + 0.8 x 100 = 82: the paper lowers b_low to 82 (the reference
        // would keep max(100, 82) = 100).
        c.update(2.0, 10);
        assert_eq!((c.b_low(), c.b_high()), (82, 128));
    }

    #[test]
    fn in_band_tracks_b_avg_plus_minus_half_alpha() {
        let mut c = controller();
        for _ in 0..3 {
            c.update(7.5, 50); // decode TBT at b = 128 in the calibrated model: in band
        }
        assert_eq!((c.b_low(), c.b_high(), c.b_sla(0)), (48, 52, 50));
        // The N_decode floor: 70 requests already decode.
        assert_eq!(c.b_sla(70), 70);
        // ... and wins over b_max.
        assert_eq!(c.b_sla(200), 200);
    }

    #[test]
    fn b_low_above_b_high_collapses_onto_b_high() {
        let mut c = controller();
        for _ in 0..3 {
            c.update(10.0, 200); // b-bar 200 > b_max: b_low 198 > b_high 128
        }
        assert_eq!((c.b_low(), c.b_high(), c.b_sla(0)), (128, 128, 128));
        // A bin's cap shrinking below the interval collapses it onto the new cap.
        c.set_b_max(8);
        assert_eq!((c.b_low(), c.b_high(), c.b_sla(0)), (8, 8, 8));
        // b_min side: b_min 8, b-bar 1 -> window [-1, 3] -> [8, 8].
        let mut c = SlaController::new(SlaParams {
            b_min: 8,
            ..SlaParams::default()
        });
        for _ in 0..3 {
            c.update(10.0, 1);
        }
        assert_eq!((c.b_low(), c.b_high()), (8, 8));
    }

    #[test]
    fn ignores_empty_batches_and_seeds_the_ema_with_the_first_sample() {
        let mut c = controller();
        c.update(10.0, 0);
        assert_eq!(c.updates(), 0);
        c.update(6.0, 8);
        assert_eq!(c.tbt_ms_ema(), Some(6.0));
        c.update(11.0, 8);
        // 0.2 x 11 + 0.8 x 6 = 7.
        assert!((c.tbt_ms_ema().unwrap() - 7.0).abs() < 1e-12);
    }

    #[test]
    fn single_size_range_stays_put() {
        let mut c = SlaController::new(SlaParams {
            b_min: 1,
            b_max: 1,
            ..SlaParams::default()
        });
        for tbt in [50.0, 50.0, 50.0, 0.1, 10.0] {
            c.update(tbt, 1);
            assert_eq!(c.b_sla(0), 1);
        }
    }

    #[test]
    fn validation_rejects_bad_params() {
        let p = SlaParams {
            ema_weight: 0.0,
            ..SlaParams::default()
        };
        assert_eq!(p.validate().unwrap_err().param, "ema_weight");
        let p = SlaParams {
            b_min: 9,
            b_max: 8,
            ..SlaParams::default()
        };
        assert!(p.validate().is_err());
    }
}
