//! Latency-aware timeout: scale a base timeout by observed p99 against a target.

/// `base x 0.8` when `p99 > 1.1 x target` (flush faster), `base x 1.2` when
/// `p99 < 0.8 x target` (headroom: wait longer), else `base` (the Go spec's rule).
pub fn latency_aware_timeout_ms(base_ms: f64, observed_p99_ms: f64, target_p99_ms: f64) -> f64 {
    if observed_p99_ms > target_p99_ms * 1.1 {
        base_ms * 0.8
    } else if observed_p99_ms < target_p99_ms * 0.8 {
        base_ms * 1.2
    } else {
        base_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_by_the_spec_factors_at_the_spec_thresholds() {
        // target 100: above 110 shrinks, below 80 grows, [80, 110] unchanged.
        assert!((latency_aware_timeout_ms(50.0, 111.0, 100.0) - 40.0).abs() < 1e-9);
        assert_eq!(latency_aware_timeout_ms(50.0, 110.0, 100.0), 50.0);
        assert_eq!(latency_aware_timeout_ms(50.0, 80.0, 100.0), 50.0);
        assert!((latency_aware_timeout_ms(50.0, 79.9, 100.0) - 60.0).abs() < 1e-9);
    }
}
