//! A BERT model directory's `config.json`, as the encoder (`bert.rs`) and the directory
//! loader (`model_dir.rs`) read it: the architecture numbers and the activation.
//!
//! The same fields, names and JSON spellings as candle-transformers' `bert::Config`, which abe
//! used to depend on for this struct alone (that crate builds hundreds of other models: minutes
//! of every `--features embed` build and check). Fields abe does not read (dropout,
//! initializer range, position embedding type, ...) are not required; unknown keys are ignored, as
//! Hugging Face configs carry many. Plain serde: builds without the `embed` feature, so its
//! tests run in the default build. Nothing here touches tensors or files.

use serde::Deserialize;

/// The encoder's activation between its two feed-forward matmuls (`hidden_act`).
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum HiddenAct {
    /// `"gelu"`: the exact (erf) GELU, as Hugging Face's BERT.
    Gelu,
    /// `"geluapproximate"`: the tanh approximation.
    GeluApproximate,
    /// `"relu"`.
    Relu,
}

/// What abe reads of `config.json`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct BertConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    pub hidden_act: HiddenAct,
    /// Longest input the position embeddings cover, tokens.
    pub max_position_embeddings: usize,
    pub type_vocab_size: usize,
    pub layer_norm_eps: f64,
    /// Token id of padding (what a batch's shorter inputs are padded with).
    pub pad_token_id: usize,
    /// `"bert"` for BERT; weights may sit under `{model_type}.` in the safetensors file.
    #[serde(default)]
    pub model_type: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// all-MiniLM-L6-v2's config.json as published (sentence-transformers), abridged of nothing.
    const MINILM: &str = r#"{
      "_name_or_path": "nreimers/MiniLM-L6-H384-uncased",
      "architectures": ["BertModel"],
      "attention_probs_dropout_prob": 0.1,
      "gradient_checkpointing": false,
      "hidden_act": "gelu",
      "hidden_dropout_prob": 0.1,
      "hidden_size": 384,
      "initializer_range": 0.02,
      "intermediate_size": 1536,
      "layer_norm_eps": 1e-12,
      "max_position_embeddings": 512,
      "model_type": "bert",
      "num_attention_heads": 12,
      "num_hidden_layers": 6,
      "pad_token_id": 0,
      "position_embedding_type": "absolute",
      "transformers_version": "4.8.2",
      "type_vocab_size": 2,
      "use_cache": true,
      "vocab_size": 30522
    }"#;

    #[test]
    fn reads_a_published_config() {
        let c: BertConfig = serde_json::from_str(MINILM).unwrap();
        assert_eq!(
            (c.hidden_size, c.num_hidden_layers, c.num_attention_heads),
            (384, 6, 12)
        );
        assert_eq!(c.intermediate_size, 1536);
        assert_eq!(c.max_position_embeddings, 512);
        assert_eq!(c.hidden_act, HiddenAct::Gelu);
        assert_eq!(c.model_type.as_deref(), Some("bert"));
        assert!((c.layer_norm_eps - 1e-12).abs() < 1e-24);
    }

    #[test]
    fn a_missing_field_or_an_unknown_activation_is_named() {
        let no_hidden = MINILM.replace("\"hidden_size\": 384,", "");
        let e = serde_json::from_str::<BertConfig>(&no_hidden).unwrap_err();
        assert!(e.to_string().contains("hidden_size"), "{e}");
        let silu = MINILM.replace("\"hidden_act\": \"gelu\"", "\"hidden_act\": \"silu\"");
        let e = serde_json::from_str::<BertConfig>(&silu).unwrap_err();
        assert!(e.to_string().contains("silu"), "{e}");
    }
}
