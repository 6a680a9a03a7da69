//! The continuous scheduler's settings ([`ContinuousConfig`]), the KV capacity they give a
//! replica, and why a request is refused ([`ContinuousReject`]).
//!
//! Plain data, read once at construction; nothing here runs per step or per request.

/// Settings of the continuous scheduler.
#[derive(Clone, Debug, PartialEq)]
pub struct ContinuousConfig {
    /// Model replicas (one worker each).
    pub replicas: usize,
    /// Slots per replica (`max_slots`, default 16).
    pub max_slots: usize,
    /// Most prompt tokens one slot prefills in one step (`prefill_chunk`, default 512).
    pub prefill_chunk: u32,
    /// Token budget of one step: decode tokens plus prefill tokens (`n_batch`, default 2048).
    pub n_batch: u32,
    /// KV cache capacity per replica in tokens (after the safety buffer).
    pub kv_capacity_tokens: u64,
    /// Requests waiting for a slot, at most (`max_queue`); more are refused.
    pub max_queue: usize,
    /// Keep the KV blocks of finished prompts and start a new prompt's prefill after its
    /// longest cached prefix (`prefix_caching`, default on). Off: KV is counted in tokens
    /// and nothing is shared, exactly as before prefix caching existed.
    pub prefix_caching: bool,
    /// Tokens per KV block when `prefix_caching` is on (`kv_block_tokens`, default 16).
    pub block_tokens: u32,
    /// LoRA adapter slots per replica: distinct adapters among its running requests
    /// (`[lora] max_loras`, default 1 as vLLM's; `1..=core::lora::MAX_LORAS_MOST`).
    pub max_loras: usize,
}

impl Default for ContinuousConfig {
    fn default() -> Self {
        // The multi-bin spec's memory model: (12 GB - 4 GB) / 1.875e-4 GB per token, less a
        // 10 % safety buffer.
        let m = crate::core::strategy::research::memory::MemoryModel::default();
        ContinuousConfig {
            replicas: 1,
            max_slots: 16,
            prefill_chunk: 512,
            n_batch: 2048,
            kv_capacity_tokens: kv_capacity_tokens(
                m.m_max_gb,
                m.m_model_gb,
                m.kv_gb_per_token,
                m.safety_fraction,
            ),
            max_queue: 1024,
            prefix_caching: true,
            block_tokens: crate::core::prefix::DEFAULT_BLOCK_TOKENS,
            max_loras: 1,
        }
    }
}

/// KV blocks per replica with prefix caching: whole blocks of the token capacity.
pub(super) fn kv_blocks(cfg: &ContinuousConfig) -> u32 {
    let blocks = cfg.kv_capacity_tokens / u64::from(cfg.block_tokens.max(1));
    u32::try_from(blocks).expect("KV cache over 4G blocks: raise kv_block_tokens")
}

/// A replica's KV capacity in tokens: `(m_max - m_model) / kv_per_token`, less `safety`.
pub fn kv_capacity_tokens(
    m_max_gb: f64,
    m_model_gb: f64,
    kv_gb_per_token: f64,
    safety: f64,
) -> u64 {
    if kv_gb_per_token <= 0.0 || m_max_gb <= m_model_gb {
        return 0;
    }
    let eta = (m_max_gb - m_model_gb) / kv_gb_per_token;
    (eta * (1.0 - safety.clamp(0.0, 1.0))).floor() as u64
}

/// Why a request was refused by the continuous scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ContinuousReject {
    #[error("the wait queue is full ({max_queue} requests waiting for a slot); retry later")]
    QueueFull { max_queue: usize },
    #[error("the request needs {needed} KV tokens but a replica holds at most {capacity}")]
    TooLarge { needed: u64, capacity: u64 },
    #[error("the server is shutting down and no longer accepts requests")]
    ShuttingDown,
}
