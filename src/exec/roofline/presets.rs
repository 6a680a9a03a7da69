//! Model and GPU presets of the `roofline` latency model, by name: the architecture numbers
//! of a few open models (from each model's published `config.json` and model card) and the
//! datasheet numbers of a few NVIDIA GPUs. The source of every number is in a comment beside
//! it.
//!
//! Plain constants only. What must never happen here: a number without its source, or a
//! "tuned" number (what real kernels achieve is the roofline's efficiency keys, not a preset).

use std::fmt;
use std::str::FromStr;

/// A model's architecture, as the roofline needs it.
#[derive(Debug, PartialEq)]
pub struct LlmSpec {
    /// Preset name (`llm = "..."`).
    pub name: &'static str,
    /// Transformer layers (`num_hidden_layers`).
    pub layers: u32,
    /// Model width (`hidden_size`): the all-reduce payload per token under tensor parallelism.
    pub hidden: u32,
    /// Query heads (`num_attention_heads`).
    pub heads: u32,
    /// Key/value heads (`num_key_value_heads`, grouped-query attention).
    pub kv_heads: u32,
    /// Size of one head (`head_dim`, or `hidden_size / num_attention_heads`).
    pub head_dim: u32,
    /// Every parameter, in billions (model card).
    pub params_b: f64,
    /// Parameters one token passes through, in billions (= `params_b` for a dense model).
    pub active_params_b: f64,
    /// Parameters of all routed experts together, in billions (0 for a dense model): the
    /// part of the weights a step reads only for the experts its tokens were routed to.
    pub expert_params_b: f64,
    /// Routed experts per layer and experts each token is routed to (0 and 0: dense).
    pub experts: u32,
    pub experts_per_token: u32,
    /// Bytes per weight and per KV element: 2 (BF16, the published checkpoints' dtype).
    pub dtype_bytes: u32,
    /// Longest context the model takes (`max_position_embeddings`): vLLM's default
    /// `max_model_len`.
    pub max_context: u32,
}

impl LlmSpec {
    /// Bytes of KV cache per token: K and V, for every layer and KV head.
    pub const fn kv_bytes_per_token(&self) -> u64 {
        2 * self.layers as u64
            * self.kv_heads as u64
            * self.head_dim as u64
            * self.dtype_bytes as u64
    }

    /// Bytes of all the weights.
    pub fn weight_bytes(&self) -> f64 {
        self.params_b * 1e9 * f64::from(self.dtype_bytes)
    }
}

/// A GPU's datasheet numbers.
#[derive(Debug, PartialEq)]
pub struct GpuSpec {
    /// Preset name (`gpu = "..."`).
    pub name: &'static str,
    /// Dense BF16 tensor-core peak, TFLOP/s (without the 2:4 sparsity doubling).
    pub bf16_tflops: f64,
    /// HBM / GDDR bandwidth, GB/s.
    pub memory_gb_per_s: f64,
    /// Memory, GB.
    pub memory_gb: f64,
    /// Bandwidth of one direction of the GPU-to-GPU link, GB/s (NVLink, else PCIe).
    pub link_gb_per_s: f64,
    /// Fixed cost of one all-reduce (launch and synchronisation), µs. Not a datasheet
    /// number: NCCL's small-message all-reduce latency, of the order NCCL's own tests
    /// report (a few µs over NVLink, tens over PCIe).
    pub allreduce_latency_us: f64,
}

// Models. Architecture from each model's config.json on its Hugging Face model page;
// parameter counts from the model cards.

/// meta-llama/Llama-3.1-8B: config.json (32 layers, hidden 4096, 32 heads, 8 KV heads,
/// head_dim 128); 8.03 B parameters (model card).
pub const LLAMA_3_1_8B: LlmSpec = LlmSpec {
    name: "llama-3.1-8b",
    layers: 32,
    hidden: 4096,
    heads: 32,
    kv_heads: 8,
    head_dim: 128,
    params_b: 8.03,
    active_params_b: 8.03,
    expert_params_b: 0.0,
    experts: 0,
    experts_per_token: 0,
    dtype_bytes: 2,
    // config.json max_position_embeddings 131072.
    max_context: 131072,
};

/// meta-llama/Llama-3.1-70B: config.json (80 layers, hidden 8192, 64 heads, 8 KV heads,
/// head_dim 128); 70.6 B parameters (model card).
pub const LLAMA_3_1_70B: LlmSpec = LlmSpec {
    name: "llama-3.1-70b",
    layers: 80,
    hidden: 8192,
    heads: 64,
    kv_heads: 8,
    head_dim: 128,
    params_b: 70.6,
    active_params_b: 70.6,
    expert_params_b: 0.0,
    experts: 0,
    experts_per_token: 0,
    dtype_bytes: 2,
    // config.json max_position_embeddings 131072.
    max_context: 131072,
};

/// Qwen/Qwen2.5-7B: config.json (28 layers, hidden 3584, 28 heads, 4 KV heads, head_dim
/// 3584 / 28 = 128); 7.61 B parameters (model card).
pub const QWEN_2_5_7B: LlmSpec = LlmSpec {
    name: "qwen2.5-7b",
    layers: 28,
    hidden: 3584,
    heads: 28,
    kv_heads: 4,
    head_dim: 128,
    params_b: 7.61,
    active_params_b: 7.61,
    expert_params_b: 0.0,
    experts: 0,
    experts_per_token: 0,
    dtype_bytes: 2,
    // config.json max_position_embeddings 131072 (the base model; -Instruct ships 32768).
    max_context: 131072,
};

/// mistralai/Mistral-7B-v0.3: config.json (32 layers, hidden 4096, 32 heads, 8 KV heads,
/// head_dim 128); 7.25 B parameters (model card).
pub const MISTRAL_7B: LlmSpec = LlmSpec {
    name: "mistral-7b",
    layers: 32,
    hidden: 4096,
    heads: 32,
    kv_heads: 8,
    head_dim: 128,
    params_b: 7.25,
    active_params_b: 7.25,
    expert_params_b: 0.0,
    experts: 0,
    experts_per_token: 0,
    dtype_bytes: 2,
    // config.json max_position_embeddings 32768.
    max_context: 32768,
};

/// mistralai/Mixtral-8x7B-v0.1: config.json (32 layers, hidden 4096, 32 heads, 8 KV heads,
/// head_dim 128, 8 local experts, 2 per token, intermediate 14336); 46.7 B parameters, 12.9 B
/// active (model card). Experts: 3 matrices x 4096 x 14336 x 8 experts x 32 layers = 45.1 B.
pub const MIXTRAL_8X7B: LlmSpec = LlmSpec {
    name: "mixtral-8x7b",
    layers: 32,
    hidden: 4096,
    heads: 32,
    kv_heads: 8,
    head_dim: 128,
    params_b: 46.7,
    active_params_b: 12.9,
    expert_params_b: 45.1,
    experts: 8,
    experts_per_token: 2,
    dtype_bytes: 2,
    // config.json max_position_embeddings 32768.
    max_context: 32768,
};

/// Qwen/Qwen3-30B-A3B: config.json (48 layers, hidden 2048, 32 heads, 4 KV heads, head_dim
/// 128, 128 experts, 8 per token, moe_intermediate 768); 30.5 B parameters, 3.3 B active
/// (model card). Experts: 3 x 2048 x 768 x 128 experts x 48 layers = 29.0 B.
pub const QWEN3_30B_A3B: LlmSpec = LlmSpec {
    name: "qwen3-30b-a3b",
    layers: 48,
    hidden: 2048,
    heads: 32,
    kv_heads: 4,
    head_dim: 128,
    params_b: 30.5,
    active_params_b: 3.3,
    expert_params_b: 29.0,
    experts: 128,
    experts_per_token: 8,
    dtype_bytes: 2,
    // config.json max_position_embeddings 40960.
    max_context: 40960,
};

/// Every model preset, in the order they are listed.
pub const LLMS: [&LlmSpec; 6] = [
    &LLAMA_3_1_8B,
    &LLAMA_3_1_70B,
    &QWEN_2_5_7B,
    &MISTRAL_7B,
    &MIXTRAL_8X7B,
    &QWEN3_30B_A3B,
];

// GPUs. NVIDIA datasheets; BF16 is the dense tensor-core figure (the datasheets print the
// 2:4-sparse one with an asterisk, twice as large); link bandwidth is one direction.

/// A100 80GB SXM: A100 datasheet: BF16 312 TFLOPS, HBM2e 2,039 GB/s, 80 GB; NVLink 600 GB/s
/// (both directions) -> 300 GB/s.
pub const A100_80GB: GpuSpec = GpuSpec {
    name: "a100-80gb",
    bf16_tflops: 312.0,
    memory_gb_per_s: 2039.0,
    memory_gb: 80.0,
    link_gb_per_s: 300.0,
    allreduce_latency_us: 8.0,
};

/// H100 SXM: H100 datasheet: BF16 989 TFLOPS (1,979 sparse), HBM3 3.35 TB/s, 80 GB; NVLink
/// 900 GB/s (both directions) -> 450 GB/s.
pub const H100_SXM: GpuSpec = GpuSpec {
    name: "h100-sxm",
    bf16_tflops: 989.0,
    memory_gb_per_s: 3350.0,
    memory_gb: 80.0,
    link_gb_per_s: 450.0,
    allreduce_latency_us: 6.0,
};

/// H200 SXM: H200 datasheet: BF16 989 TFLOPS (1,979 sparse), HBM3e 4.8 TB/s, 141 GB; NVLink
/// 900 GB/s (both directions) -> 450 GB/s.
pub const H200: GpuSpec = GpuSpec {
    name: "h200",
    bf16_tflops: 989.0,
    memory_gb_per_s: 4800.0,
    memory_gb: 141.0,
    link_gb_per_s: 450.0,
    allreduce_latency_us: 6.0,
};

/// L4: L4 datasheet: BF16 121 TFLOPS (242 sparse), GDDR6 300 GB/s, 24 GB; no NVLink: PCIe
/// Gen4 x16, 32 GB/s each way.
pub const L4: GpuSpec = GpuSpec {
    name: "l4",
    bf16_tflops: 121.0,
    memory_gb_per_s: 300.0,
    memory_gb: 24.0,
    link_gb_per_s: 32.0,
    allreduce_latency_us: 25.0,
};

/// L40S: L40S datasheet: BF16 362.05 TFLOPS (733 sparse), GDDR6 864 GB/s, 48 GB; no NVLink:
/// PCIe Gen4 x16, 32 GB/s each way.
pub const L40S: GpuSpec = GpuSpec {
    name: "l40s",
    bf16_tflops: 362.05,
    memory_gb_per_s: 864.0,
    memory_gb: 48.0,
    link_gb_per_s: 32.0,
    allreduce_latency_us: 25.0,
};

/// Every GPU preset, in the order they are listed.
pub const GPUS: [&GpuSpec; 5] = [&A100_80GB, &H100_SXM, &H200, &L4, &L40S];

/// A model preset, by name (what `llm = "..."` takes).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Llm(pub &'static LlmSpec);

/// A GPU preset, by name (what `gpu = "..."` takes).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Gpu(pub &'static GpuSpec);

impl Llm {
    pub const fn as_str(self) -> &'static str {
        self.0.name
    }
    /// Comma-separated names, for errors and help.
    pub fn valid_names() -> String {
        LLMS.map(|l| l.name).join(", ")
    }
}

impl Gpu {
    pub const fn as_str(self) -> &'static str {
        self.0.name
    }
    /// Comma-separated names, for errors and help.
    pub fn valid_names() -> String {
        GPUS.map(|g| g.name).join(", ")
    }
}

impl FromStr for Llm {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let want = s.trim().to_ascii_lowercase();
        LLMS.into_iter()
            .find(|l| l.name == want)
            .map(Llm)
            .ok_or_else(|| format!("unknown llm '{s}': presets are {}", Llm::valid_names()))
    }
}

impl FromStr for Gpu {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let want = s.trim().to_ascii_lowercase();
        GPUS.into_iter()
            .find(|g| g.name == want)
            .map(Gpu)
            .ok_or_else(|| format!("unknown gpu '{s}': presets are {}", Gpu::valid_names()))
    }
}

impl fmt::Display for Llm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for Gpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

crate::core::names::serde_by_name!(Llm);
crate::core::names::serde_by_name!(Gpu);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_parse_back() {
        for l in LLMS {
            assert_eq!(l.name.parse::<Llm>().unwrap().0, l);
        }
        for g in GPUS {
            assert_eq!(g.name.parse::<Gpu>().unwrap().0, g);
        }
        let e = "gpt-5".parse::<Llm>().unwrap_err();
        assert!(e.contains("llama-3.1-8b, llama-3.1-70b"), "{e}");
        assert!("H100-SXM".parse::<Gpu>().is_ok());
    }

    #[test]
    fn kv_bytes_and_experts_agree_with_the_published_configs() {
        // Llama-3.1-8B: 2 x 32 layers x 8 KV heads x 128 x 2 bytes = 128 KiB per token.
        assert_eq!(LLAMA_3_1_8B.kv_bytes_per_token(), 131_072);
        // Experts from the architecture, within the rounding of the model cards.
        let mixtral = 3.0 * 4096.0 * 14336.0 * 8.0 * 32.0 / 1e9;
        assert!((MIXTRAL_8X7B.expert_params_b - mixtral).abs() < 0.1);
        let qwen3 = 3.0 * 2048.0 * 768.0 * 128.0 * 48.0 / 1e9;
        assert!((QWEN3_30B_A3B.expert_params_b - qwen3).abs() < 0.1);
        for l in LLMS {
            let dense = l.params_b - l.expert_params_b;
            let active = dense
                + l.expert_params_b * f64::from(l.experts_per_token) / f64::from(l.experts.max(1));
            assert!(
                (active - l.active_params_b).abs() / l.active_params_b < 0.05,
                "{}",
                l.name
            );
        }
    }
}
