//! `[workers.backends.<name>]`: one `sim` backend's own latency model, over `[workers]`'.
//!
//! Routing across `sim` backends of different speeds (a slow pool and a fast one, an A100
//! replica group beside an H100 one) needs each backend to simulate its own hardware. Every
//! key here is one of `[workers]`' latency keys and is optional: a key left out is
//! `[workers]`' value. What lives here is the table's shape; the merge is
//! `WorkersConfig::with_backend_keys` (`sections`), and `settings` judges the merged values
//! with `[workers]`' rules, naming keys in full (`workers.backends.slow.base_latency_ms`).
//!
//! What must never happen here: reading the environment or a file, or judging a value.

use crate::exec::latency::LatencyKind;
use crate::exec::roofline::presets::{Gpu, Llm};
use serde::{Deserialize, Serialize};

/// One `[workers.backends.<name>]` table: the latency keys this backend sets for itself.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SimBackendLatency {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_model: Option<LatencyKind>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base_latency_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_token_latency_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_variance: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefill_ms_per_token: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decode_beta_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decode_gamma: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_of_batch_base_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_of_batch_decode_ms_per_token: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub affine_step_a_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub affine_step_c_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub llm: Option<Llm>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu: Option<Gpu>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tp: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flops_efficiency: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bandwidth_efficiency: Option<f64>,
}
