//! Queue-depth adaptive timeout: linear from `max_wait_ms` (shallow) to `min_wait_ms` (deep).

use super::StrategyParams;

/// `max_wait_ms` at depth <= low, `min_wait_ms` at depth >= high, linear in between:
/// `max - (depth - low) / (high - low) * (max - min)` (the Go spec's formula).
pub fn queue_depth_timeout_ms(params: &StrategyParams, queue_depth: usize) -> f64 {
    let low = params.queue_depth_low as usize;
    let high = params.queue_depth_high as usize;
    if queue_depth <= low {
        return params.max_wait_ms;
    }
    if queue_depth >= high {
        return params.min_wait_ms;
    }
    // low < depth < high, so high > low and the division is safe.
    let ratio = (queue_depth - low) as f64 / (high - low) as f64;
    params.max_wait_ms - ratio * (params.max_wait_ms - params.min_wait_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interpolates_with_the_spec_defaults() {
        let p = StrategyParams::default(); // max 100, min 5, low 10, high 100
        assert_eq!(queue_depth_timeout_ms(&p, 0), 100.0);
        assert_eq!(queue_depth_timeout_ms(&p, 10), 100.0);
        assert_eq!(queue_depth_timeout_ms(&p, 100), 5.0);
        assert_eq!(queue_depth_timeout_ms(&p, 5000), 5.0);
        // depth 55: ratio 0.5 -> 100 - 0.5 * 95 = 52.5
        assert!((queue_depth_timeout_ms(&p, 55) - 52.5).abs() < 1e-9);
        // depth 19: ratio 0.1 -> 100 - 9.5 = 90.5
        assert!((queue_depth_timeout_ms(&p, 19) - 90.5).abs() < 1e-9);
    }

    #[test]
    fn equal_thresholds_do_not_divide_by_zero() {
        let p = StrategyParams {
            queue_depth_low: 50,
            queue_depth_high: 50,
            ..Default::default()
        };
        assert_eq!(queue_depth_timeout_ms(&p, 50), 100.0);
        assert_eq!(queue_depth_timeout_ms(&p, 51), 5.0);
    }
}
