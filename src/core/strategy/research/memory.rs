//! Algorithm 1 of the dynamic-batching research strategy: the memory-constrained batch size
//! `b_mem`, the KV-memory check Algorithm 3 applies to a formed batch, and the per-bin cap
//! used by multi-bin batching.
//!
//! Sources (see the multi-bin spec notes): Pang, Li, Wang, arXiv 2503.05248 (P2), as
//! implemented by TravisLeeTS/llm-scheduler-sim `schedulers.py::compute_b_mem`, `mem_ok`
//! and `config.py::_compute_bin_b_max`. Defaults are that repository's newest config
//! (Qwen3-1.7B FP16 on a 12 GB RTX 4080).
//!
//! Pure arithmetic on a `Copy` config: nothing here allocates, reads a clock or keeps state.

/// A parameter of one of the dynamic-batching building blocks is out of range. Shared by
/// `memory`, `sla` and `bins`, so config validation has one error shape to map.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid {param}: {reason}")]
pub struct InvalidParam {
    pub param: &'static str,
    pub reason: &'static str,
}

/// GPU memory model of one replica.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MemoryModel {
    /// GPU memory, GB. Default 12 (RTX 4080 12 GB).
    pub m_max_gb: f64,
    /// Model weights, GB. Default 4 (Qwen3-1.7B FP16). Invariant: `< m_max_gb - margin_gb`.
    pub m_model_gb: f64,
    /// KV cache per token, GB. Default 1.875e-4 (2 x 24 layers x 2048 hidden x 2 bytes).
    pub kv_gb_per_token: f64,
    /// Headroom the batch memory check ([`MemoryModel::fits`]) and the per-bin cap keep
    /// free, GB. Default 1 (`MEMORY_MARGIN_GB`). Not used by `b_mem`, which has its own
    /// buffer `L0`.
    pub margin_gb: f64,
    /// `L0 = safety_fraction x eta`: the token buffer `b_mem` leaves free. Default 0.1, which
    /// the reference repo equates with an overflow probability of about 0.05 (P2's
    /// `L0 = eta - (theta sigma_S + mu_S)`, simplified). Invariant: in `[0, 1)`.
    pub safety_fraction: f64,
    /// Smallest batch `b_mem` returns. Default 1. Invariant: `1 <= b_min <= b_max`.
    pub b_min: u32,
    /// Largest batch `b_mem` returns. Default 128.
    pub b_max: u32,
    /// `E[l_in + l_out]`, tokens per request, used while no batch has completed yet.
    ///
    /// The "500 when no statistics yet" is read as a mean request length of 500
    /// tokens, not as `b_mem = 500`: the spec's Algorithm 1 sets `E_l = 500` when it has no
    /// statistics (its EMAs also start at prompt 300 + output 200 = 500), giving
    /// `b_mem = floor(38,400 / 500) = 76` ("b_mem ~ 76" in the reference docs), whereas
    /// `b_mem = 500` would always be clamped to `b_max` and mean nothing. Default 500.
    pub default_tokens_per_request: f64,
    /// Context length the per-bin cap assumes for an open-ended last bin, tokens. Default
    /// 4096 (the reference's `min(hi, 4096)`).
    pub context_tokens_max: u32,
}

impl Default for MemoryModel {
    fn default() -> Self {
        MemoryModel {
            m_max_gb: 12.0,
            m_model_gb: 4.0,
            kv_gb_per_token: 1.875e-4,
            margin_gb: 1.0,
            safety_fraction: 0.1,
            b_min: 1,
            b_max: 128,
            default_tokens_per_request: 500.0,
            context_tokens_max: 4096,
        }
    }
}

fn invalid(param: &'static str, reason: &'static str) -> Result<(), InvalidParam> {
    Err(InvalidParam { param, reason })
}

impl MemoryModel {
    /// Checks every invariant stated on the fields.
    pub fn validate(&self) -> Result<(), InvalidParam> {
        let all_finite = [
            self.m_max_gb,
            self.m_model_gb,
            self.kv_gb_per_token,
            self.margin_gb,
            self.safety_fraction,
            self.default_tokens_per_request,
        ]
        .iter()
        .all(|v| v.is_finite());
        if !all_finite {
            return invalid("memory model", "every value must be a finite number");
        }
        if self.kv_gb_per_token <= 0.0 {
            return invalid("kv_gb_per_token", "must be greater than 0");
        }
        if self.m_model_gb < 0.0 || self.margin_gb < 0.0 {
            return invalid("m_model_gb / margin_gb", "must not be negative");
        }
        if self.m_model_gb + self.margin_gb >= self.m_max_gb {
            return invalid(
                "m_max_gb",
                "must exceed m_model_gb + margin_gb (no room for any KV cache)",
            );
        }
        if !(0.0..1.0).contains(&self.safety_fraction) {
            return invalid("safety_fraction", "must be in [0, 1)");
        }
        if self.b_min == 0 || self.b_min > self.b_max {
            return invalid("b_min / b_max", "need 1 <= b_min <= b_max");
        }
        if self.default_tokens_per_request <= 0.0 {
            return invalid("default_tokens_per_request", "must be greater than 0");
        }
        if self.context_tokens_max == 0 {
            return invalid("context_tokens_max", "must be at least 1");
        }
        Ok(())
    }

    /// `eta = (m_max - m_model) / kv`: tokens of KV cache the GPU can hold (42,666.7 with
    /// the defaults).
    pub fn eta_tokens(&self) -> f64 {
        (self.m_max_gb - self.m_model_gb) / self.kv_gb_per_token
    }

    /// `L0 = safety_fraction x eta`, tokens (4,266.7 with the defaults).
    pub fn buffer_tokens(&self) -> f64 {
        self.safety_fraction * self.eta_tokens()
    }

    /// Algorithm 1: `b_mem = floor((eta - L0) / E[l_in + l_out])`, capped by the bin's cap,
    /// clamped to `[b_min, b_max]`.
    ///
    /// `mean_tokens_per_request` is `E[l_in + l_out]` from the batch statistics; `None`, or
    /// a value that is not a positive number, uses `default_tokens_per_request`.
    ///
    /// Not applied here: the paper's floor `b_mem >= N_decode` (and "keep the previous
    /// b_mem unless N_prefill > 0 and N_decode > 0"), which need the caller's decode
    /// state; the SLA controller's `b_sla(n_decode)` carries the `N_decode` floor.
    pub fn b_mem(&self, mean_tokens_per_request: Option<f64>, per_bin_cap: Option<u32>) -> u32 {
        let mean = match mean_tokens_per_request {
            Some(m) if m.is_finite() && m > 0.0 => m,
            _ => self.default_tokens_per_request,
        };
        let raw = ((self.eta_tokens() - self.buffer_tokens()) / mean).floor();
        // Float-to-int `as` saturates; a non-finite or negative raw means "no memory
        // limit", as in the reference (`b_mem = B_MAX`).
        let b = if raw.is_finite() && raw >= 0.0 {
            raw as u32
        } else {
            self.b_max
        };
        b.min(per_bin_cap.unwrap_or(u32::MAX))
            .clamp(self.b_min, self.b_max)
    }

    /// Algorithm 3's memory check: true iff
    /// `m_model + kv x total_tokens_in_batch <= m_max - margin`, where the tokens are the
    /// sum of prompt + output lengths of every request in the batch (37,333 tokens fit with
    /// the defaults, 37,334 do not).
    pub fn fits(&self, total_tokens_in_batch: u64) -> bool {
        self.m_model_gb + self.kv_gb_per_token * total_tokens_in_batch as f64
            <= self.m_max_gb - self.margin_gb
    }

    /// The reference's `BIN_B_MAX` for a bin `[lo_tokens, hi_tokens)` of output lengths:
    /// assume prompt ~ output at the bin's midpoint `avg = (lo + min(hi, context)) / 2`
    /// (integer division), so `2 avg` tokens per request, and fit as many requests as
    /// `m_max - m_model - margin` holds; clamped to `[b_min, b_max]`. Also the bin's SLA
    /// controller `b_max`. An empty `[0, 0)` bin has no length to size for: `b_max`.
    pub fn per_bin_cap(&self, lo_tokens: u32, hi_tokens: u32) -> u32 {
        let eff = hi_tokens.min(self.context_tokens_max);
        let avg = (u64::from(lo_tokens) + u64::from(eff)) / 2;
        let tokens_per_request = 2 * avg;
        if tokens_per_request == 0 {
            return self.b_max;
        }
        let avail_gb = self.m_max_gb - self.m_model_gb - self.margin_gb;
        let raw = (avail_gb / (tokens_per_request as f64 * self.kv_gb_per_token)).floor();
        // `as` saturates at u32::MAX and maps a negative value to 0; the clamp does the rest.
        (raw as u32).clamp(self.b_min, self.b_max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eta_and_buffer_match_the_spec_numbers() {
        let m = MemoryModel::default();
        assert!(m.validate().is_ok());
        // (12 - 4) / 1.875e-4 = 42,666.67; L0 = 4,266.67.
        assert!((m.eta_tokens() - 42_666.666_666_7).abs() < 1e-6);
        assert!((m.buffer_tokens() - 4_266.666_666_7).abs() < 1e-6);
    }

    #[test]
    fn b_mem_follows_algorithm_1() {
        let m = MemoryModel::default();
        // eta - L0 = 38,400. E_l = 500 -> 76.8 -> 76 (the spec's "b_mem ~ 76").
        assert_eq!(m.b_mem(Some(500.0), None), 76);
        // No statistics yet: the 500-token default, same 76.
        assert_eq!(m.b_mem(None, None), 76);
        // Garbage statistics fall back to the default too.
        assert_eq!(m.b_mem(Some(0.0), None), 76);
        assert_eq!(m.b_mem(Some(f64::NAN), None), 76);
        // BurstGPT mean 734: 38,400 / 734 = 52.3 -> 52.
        assert_eq!(m.b_mem(Some(734.0), None), 52);
        // Short requests: 38,400 / 100 = 384, clamped to b_max 128.
        assert_eq!(m.b_mem(Some(100.0), None), 128);
        // Huge requests: 0, clamped to b_min 1.
        assert_eq!(m.b_mem(Some(1e9), None), 1);
        // A bin's cap wins below the memory bound; b_min still wins over a 0 cap.
        assert_eq!(m.b_mem(Some(500.0), Some(8)), 8);
        assert_eq!(m.b_mem(Some(500.0), Some(100)), 76);
        assert_eq!(m.b_mem(Some(500.0), Some(0)), 1);
    }

    #[test]
    fn older_config_clamps_to_b_max() {
        // Older reference config: m_model 2, kv 5e-6 -> eta 2,000,000; 1.8e6 / 500 = 3599
        // or 3600 depending on rounding; clamped to 128 either way.
        let m = MemoryModel {
            m_model_gb: 2.0,
            kv_gb_per_token: 5e-6,
            ..MemoryModel::default()
        };
        assert!((m.eta_tokens() - 2_000_000.0).abs() < 1e-6);
        assert_eq!(m.b_mem(None, None), 128);
    }

    #[test]
    fn fits_keeps_the_margin_free() {
        let m = MemoryModel::default();
        // 4 + 1.875e-4 x 37,333 = 10.9999375 <= 11; 37,334 -> 11.000125 > 11.
        assert!(m.fits(0));
        assert!(m.fits(37_333));
        assert!(!m.fits(37_334));
        assert!(!m.fits(u64::MAX));
    }

    #[test]
    fn per_bin_cap_matches_the_spec_example() {
        let m = MemoryModel::default();
        // Bins [1,42) [42,80) [80,167) [167,10000): avg 21/61/123/2131 (last uses
        // min(10000, 4096)); raw 7 / (2 avg x 1.875e-4) = 888.9/306.0/151.8/8.8.
        assert_eq!(m.per_bin_cap(1, 42), 128);
        assert_eq!(m.per_bin_cap(42, 80), 128);
        assert_eq!(m.per_bin_cap(80, 167), 128);
        assert_eq!(m.per_bin_cap(167, 10_000), 8);
        // 2,000-token midpoint: 7 / (4000 x 1.875e-4) = 9.33 -> 9.
        assert_eq!(m.per_bin_cap(2_000, 2_000), 9);
        // Empty [0, 0) bin: nothing to size for.
        assert_eq!(m.per_bin_cap(0, 0), 128);
        // Never below b_min, even for lengths that cannot fit.
        let tiny = MemoryModel {
            m_max_gb: 5.5,
            ..MemoryModel::default()
        };
        assert_eq!(tiny.per_bin_cap(4_096, 4_096), 1);
    }

    #[test]
    fn validation_names_the_bad_parameter() {
        let bad = MemoryModel {
            m_model_gb: 11.5,
            ..MemoryModel::default()
        };
        assert_eq!(bad.validate().unwrap_err().param, "m_max_gb");
        let bad = MemoryModel {
            b_min: 0,
            ..MemoryModel::default()
        };
        let e = bad.validate().unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid b_min / b_max: need 1 <= b_min <= b_max"
        );
        let bad = MemoryModel {
            safety_fraction: 1.0,
            ..MemoryModel::default()
        };
        assert_eq!(bad.validate().unwrap_err().param, "safety_fraction");
    }
}
