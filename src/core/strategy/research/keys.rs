//! The research strategies' settings as users write them: the `[batching.dynamic]` table of
//! config.toml, which is also a scenario's `[engine.dynamic]`. Defaults come from the
//! core's own ([`ResearchConfig`], [`MemoryModel`], [`SlaParams`]); one check turns the
//! keys into a [`ResearchConfig`], so the live config and the simulator share both.
//!
//! What lives here is the table's shape, its defaults and that check. What must never
//! happen here: reading files or the environment (the config and the simulator do that),
//! or anything that runs after start-up.

use super::bins::{BinPolicy, PredictorKind, BIN_COUNT_MAX};
use super::memory::MemoryModel;
use super::sla::SlaParams;
use super::ResearchConfig;
use serde::{Deserialize, Serialize};

/// `[batching.dynamic]`: the `dynamic` and `multi_bin` strategies (memory model, SLA
/// controller, bins).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DynamicConfig {
    /// multi_bin: number of bins K (1..=64).
    pub bins: usize,
    /// multi_bin: age_aware | response_ratio | round_robin | longest_queue
    pub bin_policy: BinPolicy,
    /// Predicted output length: max_tokens | ema_by_prompt_bucket (a request's
    /// `predicted_output_tokens` hint wins).
    pub predictor: PredictorKind,
    /// Bin boundaries are recomputed from observed lengths (least second moment of batch
    /// length) every this many completed requests.
    pub recompute_every: u32,
    pub m_max_gb: f64,
    pub m_model_gb: f64,
    pub kv_gb_per_token: f64,
    pub memory_margin_gb: f64,
    pub safety_fraction: f64,
    pub b_min: u32,
    pub b_max: u32,
    pub sla_tbt_ms: f64,
    pub sla_epsilon_ms: f64,
    pub sla_alpha: u32,
    pub sla_delta: u32,
}

impl Default for DynamicConfig {
    fn default() -> Self {
        let r = ResearchConfig::default();
        let (m, s) = (r.memory, r.sla);
        DynamicConfig {
            bins: r.bins,
            bin_policy: r.bin_policy,
            predictor: r.predictor,
            recompute_every: r.recompute_every,
            m_max_gb: m.m_max_gb,
            m_model_gb: m.m_model_gb,
            kv_gb_per_token: m.kv_gb_per_token,
            memory_margin_gb: m.margin_gb,
            safety_fraction: m.safety_fraction,
            b_min: m.b_min,
            b_max: m.b_max,
            sla_tbt_ms: s.d_sla_ms,
            sla_epsilon_ms: s.epsilon_ms,
            sla_alpha: s.alpha,
            sla_delta: s.delta,
        }
    }
}

/// A research setting out of range: `key` = `value`, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid value for {key} = {value}: {why}")]
pub struct InvalidSetting {
    pub key: String,
    pub value: String,
    pub why: String,
}

impl DynamicConfig {
    /// The core's settings, checked. `table` names this table in errors (e.g.
    /// `batching.dynamic`); `max_tokens_limit` is the server's largest `max_tokens`.
    pub fn research_config(
        &self,
        table: &str,
        max_tokens_limit: u32,
    ) -> Result<ResearchConfig, InvalidSetting> {
        let invalid = |key: String, value: String, why: String| InvalidSetting { key, value, why };
        if !(1..=BIN_COUNT_MAX).contains(&self.bins) {
            return Err(invalid(
                format!("{table}.bins"),
                self.bins.to_string(),
                format!("must be between 1 and {BIN_COUNT_MAX}"),
            ));
        }
        if self.recompute_every < 1 {
            return Err(invalid(
                format!("{table}.recompute_every"),
                self.recompute_every.to_string(),
                "must be at least 1".into(),
            ));
        }
        let memory = MemoryModel {
            m_max_gb: self.m_max_gb,
            m_model_gb: self.m_model_gb,
            kv_gb_per_token: self.kv_gb_per_token,
            margin_gb: self.memory_margin_gb,
            safety_fraction: self.safety_fraction,
            b_min: self.b_min,
            b_max: self.b_max,
            ..MemoryModel::default()
        };
        memory.validate().map_err(|e| {
            invalid(
                format!("{table} ({})", e.param),
                "(see key)".into(),
                e.reason.into(),
            )
        })?;
        let sla = SlaParams {
            d_sla_ms: self.sla_tbt_ms,
            epsilon_ms: self.sla_epsilon_ms,
            alpha: self.sla_alpha,
            delta: self.sla_delta,
            b_min: self.b_min,
            b_max: self.b_max,
            ..SlaParams::default()
        };
        sla.validate().map_err(|e| {
            invalid(
                format!("{table} ({})", e.param),
                "(see key)".into(),
                e.reason.into(),
            )
        })?;
        Ok(ResearchConfig {
            memory,
            sla,
            bins: self.bins,
            bin_policy: self.bin_policy,
            predictor: self.predictor,
            max_tokens_limit,
            recompute_every: self.recompute_every,
        })
    }
}
