//! The fixed window: wait `max_wait_ms` (or until `max_batch_size`, which the core checks).

use super::StrategyParams;

/// Fixed-window timeout: always `max_wait_ms`, whatever the load.
pub fn fixed_timeout_ms(params: &StrategyParams) -> f64 {
    params.max_wait_ms
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_ignores_everything_but_max_wait() {
        let p = StrategyParams {
            max_wait_ms: 42.0,
            ..Default::default()
        };
        assert_eq!(fixed_timeout_ms(&p), 42.0);
    }
}
