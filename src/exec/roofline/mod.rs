//! The `roofline` latency model: a step's time from a model's architecture and a GPU's
//! datasheet (presets in [`presets`]), and a replica's KV capacity from the GPU's memory.
//!
//! One step (one forward pass over `T` tokens: a decode token per generating sequence plus
//! the prefill chunks) costs, on `tp` GPUs:
//!
//! ```text
//! flops   = 2 x active_params x T                      matmuls (every weight, one MAC per token)
//!         + 4 x layers x heads x head_dim x pairs      attention: QK^T and AV over every
//!                                                      (query, key) pair of the step
//! bytes   = dense_weights + expert_weights x touched   every weight read once per step; a
//!                                                      mixture of experts reads only the
//!                                                      experts its T tokens were routed to
//!         + kv_bytes_per_token x kv_read_tokens        each sequence's KV cache, read once
//! compute = flops / (tp x peak_flops x flops_efficiency)
//! memory  = bytes / (tp x hbm_bandwidth x bandwidth_efficiency)
//! comm    = 2 x layers x (allreduce_latency + 2 (tp-1)/tp x T x hidden x dtype / link)   (tp > 1)
//! step    = max(compute, memory) + comm
//! ```
//!
//! Compute and memory **overlap** (a kernel streams weights while its tensor cores work, so
//! the slower of the two bounds the step: prefill is compute-bound, small-batch decode
//! memory-bound); the tensor-parallel all-reduces **add** (two per layer, after attention
//! and after the MLP, on the critical path between layers). `touched` is the expected share
//! of a layer's experts that `T` tokens routed to `k` of `E` experts each reach,
//! `1 - (1 - k/E)^T`. Tensor parallelism shards weights, heads and KV evenly, so it divides
//! both bounds by `tp`. Prefix caching is the scheduler's: a cached prefix is not in the
//! step's prefill tokens (no matmul FLOPs) but is read as KV and attended to. Not modelled:
//! kernel launch and scheduler overhead per step, quantisation, speculative decoding,
//! pipeline parallelism. `abe latency` prints the step times (`explain.rs`).
//!
//! The efficiency keys say how much of the datasheet peak real kernels achieve. Their
//! defaults assume a well-tuned server: 0.6 of peak FLOP/s (large BF16 GEMMs in prefill
//! reach 60-70 % of peak on Hopper, attention less) and 0.8 of HBM bandwidth (decode GEMV
//! and paged-attention kernels stream at 75-85 % of peak). Set both to 1 for the pure
//! datasheet roofline (what `inference-lab` computes).
//!
//! KV capacity: `tp x memory x 0.9 - weights` (vLLM's default `gpu_memory_utilization =
//! 0.9` leaves the rest for activations and the CUDA context), divided by the KV bytes per
//! token.
//!
//! Pure arithmetic on `Copy` values: no allocation, no clock, no I/O. Float sums are in a
//! fixed order (the simulator's report is byte-identical for a seed).

pub mod explain;
pub mod presets;

use crate::core::continuous::StepShape;
use presets::{Gpu, Llm};

/// Share of GPU memory the server may use (vLLM's `gpu_memory_utilization` default).
pub const MEMORY_UTILISATION: f64 = 0.9;

/// Largest tensor-parallel degree accepted.
pub const TP_MAX: u32 = 64;

/// A model on a GPU type, with tensor parallelism and achieved-vs-peak efficiencies.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Roofline {
    pub llm: Llm,
    pub gpu: Gpu,
    /// GPUs one replica is sharded over (tensor parallelism).
    pub tp: u32,
    /// Achieved / peak FLOP/s, in (0, 1].
    pub flops_efficiency: f64,
    /// Achieved / peak memory bandwidth, in (0, 1].
    pub bandwidth_efficiency: f64,
}

impl Roofline {
    /// Llama-3.1-8B on one H100 SXM, with the default efficiencies.
    pub const DEFAULT: Roofline = Roofline {
        llm: Llm(&presets::LLAMA_3_1_8B),
        gpu: Gpu(&presets::H100_SXM),
        tp: 1,
        flops_efficiency: 0.6,
        bandwidth_efficiency: 0.8,
    };

    /// Checks the values and that the weights fit: errors say which key to change.
    pub fn check(&self) -> Result<(), String> {
        if !(1..=TP_MAX).contains(&self.tp) {
            return Err(format!("latency.tp = {}: must be in 1..={TP_MAX}", self.tp));
        }
        for (key, v) in [
            ("flops_efficiency", self.flops_efficiency),
            ("bandwidth_efficiency", self.bandwidth_efficiency),
        ] {
            if !(v > 0.0 && v <= 1.0) {
                return Err(format!("latency.{key} = {v}: must be in (0, 1]"));
            }
        }
        if self.kv_capacity_tokens() == 0 {
            let (l, g) = (self.llm.0, self.gpu.0);
            return Err(format!(
                "{} needs {:.1} GB of weights; {} x tp {} has {:.1} GB usable ({} x {:.0} GB x \
                 {MEMORY_UTILISATION}), leaving no KV cache: raise tp or pick a larger gpu",
                l.name,
                l.weight_bytes() / 1e9,
                g.name,
                self.tp,
                f64::from(self.tp) * g.memory_gb * MEMORY_UTILISATION,
                self.tp,
                g.memory_gb
            ));
        }
        Ok(())
    }

    /// KV cache of one replica, in tokens: usable memory less the weights, over the KV bytes
    /// per token; 0 when the weights do not fit.
    pub fn kv_capacity_tokens(&self) -> u64 {
        let usable = f64::from(self.tp) * self.gpu.0.memory_gb * 1e9 * MEMORY_UTILISATION;
        let free = usable - self.llm.0.weight_bytes();
        if free <= 0.0 {
            return 0;
        }
        (free / self.llm.0.kv_bytes_per_token() as f64).floor() as u64
    }

    /// vLLM's default `max_model_len` for this pair: the model's context length, no more
    /// than one replica's KV cache holds (vLLM refuses to start when one sequence of that
    /// length would not fit; abe serves the shorter limit).
    pub fn max_model_len(&self) -> u32 {
        let kv = u32::try_from(self.kv_capacity_tokens()).unwrap_or(u32::MAX);
        self.llm.0.max_context.min(kv)
    }

    /// Time of one step of this shape, ms (see the module doc for the terms).
    pub fn step_ms(&self, s: &StepShape) -> f64 {
        let tokens = u64::from(s.decode_tokens) + u64::from(s.prefill_tokens);
        if tokens == 0 {
            return 0.0;
        }
        let (l, g) = (self.llm.0, self.gpu.0);
        let t = tokens as f64;
        let tp = f64::from(self.tp);
        let dtype = f64::from(l.dtype_bytes);
        let attention_flops_per_pair =
            4.0 * f64::from(l.layers) * f64::from(l.heads) * f64::from(l.head_dim);
        let flops =
            2.0 * l.active_params_b * 1e9 * t + attention_flops_per_pair * s.attention_pairs as f64;
        let dense_b = l.params_b - l.expert_params_b;
        let touched = if l.experts == 0 {
            0.0
        } else {
            let miss = 1.0 - f64::from(l.experts_per_token) / f64::from(l.experts);
            1.0 - miss.powf(t)
        };
        let bytes = (dense_b + l.expert_params_b * touched) * 1e9 * dtype
            + l.kv_bytes_per_token() as f64 * s.kv_read_tokens as f64;
        let compute_s = flops / (tp * g.bf16_tflops * 1e12 * self.flops_efficiency);
        let memory_s = bytes / (tp * g.memory_gb_per_s * 1e9 * self.bandwidth_efficiency);
        let comm_s = if self.tp > 1 {
            let ring = 2.0 * (tp - 1.0) / tp;
            let per_call = g.allreduce_latency_us * 1e-6
                + ring * t * f64::from(l.hidden) * dtype / (g.link_gb_per_s * 1e9);
            2.0 * f64::from(l.layers) * per_call
        } else {
            0.0
        };
        (compute_s.max(memory_s) + comm_s) * 1e3
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(b: u32, context: u64) -> StepShape {
        StepShape {
            decode_tokens: b,
            prefill_tokens: 0,
            kv_read_tokens: u64::from(b) * context,
            attention_pairs: u64::from(b) * (context + 1),
            lora_loads: 0,
        }
    }

    fn prefill(tokens: u32) -> StepShape {
        let n = u64::from(tokens);
        StepShape {
            decode_tokens: 0,
            prefill_tokens: tokens,
            kv_read_tokens: n / 2,
            attention_pairs: n * (n + 1) / 2,
            lora_loads: 0,
        }
    }

    #[test]
    fn small_decode_is_memory_bound_on_the_weights() {
        let m = Roofline {
            flops_efficiency: 1.0,
            bandwidth_efficiency: 1.0,
            ..Roofline::DEFAULT
        };
        // 8.03 B x 2 bytes / 3.35 TB/s = 4.794 ms, plus 1 x 100 tokens x 128 KiB of KV.
        let want = (16.06e9 + 100.0 * 131_072.0) / 3.35e12 * 1e3;
        assert!((m.step_ms(&decode(1, 100)) - want).abs() < 1e-9);
        // Batching is nearly free while memory-bound: 16 sequences cost < 1.1 x one.
        assert!(m.step_ms(&decode(16, 100)) < 1.1 * m.step_ms(&decode(1, 100)));
    }

    #[test]
    fn long_prefill_is_compute_bound_and_efficiency_scales_it() {
        let peak = Roofline {
            flops_efficiency: 1.0,
            bandwidth_efficiency: 1.0,
            ..Roofline::DEFAULT
        };
        let s = prefill(4096);
        let flops = 2.0 * 8.03e9 * 4096.0 + 4.0 * 32.0 * 32.0 * 128.0 * (4096.0 * 4097.0 / 2.0);
        let want = flops / 989e12 * 1e3;
        assert!((peak.step_ms(&s) - want).abs() < 1e-9);
        let half = Roofline {
            flops_efficiency: 0.5,
            ..peak
        };
        assert!((half.step_ms(&s) - 2.0 * want).abs() < 1e-9);
        assert_eq!(peak.step_ms(&StepShape::default()), 0.0);
    }

    #[test]
    fn tensor_parallelism_divides_work_and_adds_all_reduces() {
        let one = Roofline::DEFAULT;
        let two = Roofline { tp: 2, ..one };
        let (a, b) = (one.step_ms(&decode(8, 500)), two.step_ms(&decode(8, 500)));
        let comm = 2.0 * 32.0 * (6e-6 + 1.0 * 8.0 * 4096.0 * 2.0 / 450e9) * 1e3;
        assert!((b - (a / 2.0 + comm)).abs() < 1e-9, "{a} {b}");
    }

    #[test]
    fn experts_are_read_as_tokens_reach_them() {
        let m = Roofline {
            llm: "mixtral-8x7b".parse().unwrap(),
            ..Roofline::DEFAULT
        };
        let one = m.step_ms(&decode(1, 0));
        let many = m.step_ms(&decode(64, 0));
        // One token reads 2 of 8 experts; 64 tokens read nearly all of them.
        assert!(many > 2.5 * one, "{one} {many}");
    }

    #[test]
    fn kv_capacity_is_memory_less_weights_and_too_big_models_are_refused() {
        let m = Roofline::DEFAULT;
        let want = ((80e9_f64 * 0.9 - 16.06e9) / 131_072.0).floor() as u64;
        assert_eq!(m.kv_capacity_tokens(), want);
        let big = Roofline {
            llm: "llama-3.1-70b".parse().unwrap(),
            ..m
        };
        let e = big.check().unwrap_err();
        assert!(e.contains("raise tp"), "{e}");
        assert!(Roofline { tp: 4, ..big }.check().is_ok());
        let e = Roofline {
            flops_efficiency: 0.0,
            ..m
        }
        .check()
        .unwrap_err();
        assert!(e.contains("flops_efficiency"), "{e}");
    }
}
