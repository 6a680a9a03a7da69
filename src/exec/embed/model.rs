//! A loaded sentence-transformers model: tokenizer, BERT encoder (candle, CPU; [`super::bert`]),
//! pooling.
//!
//! Shared read-only by every worker of an `embed` backend (`Arc<EmbedModel>`): a forward
//! pass takes `&self`. Inputs are tokenized one by one (the worker checks each on its own,
//! so one bad input never fails the others), then run together, padded to the longest (the
//! executor decides which inputs share a pass: `split`).

use super::bert::Bert;
use super::model_dir::{LoadError, ModelDir};
use super::pooling::{self, Pooling};
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use std::path::Path;
use tokenizers::{TruncationDirection, TruncationParams, TruncationStrategy};

/// One input, tokenized.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tokens {
    /// Token ids with the special tokens ([CLS] ... [SEP]), at most `max_seq_length`.
    pub ids: Vec<u32>,
    /// The input was longer than `max_seq_length` and was cut.
    pub truncated: bool,
}

/// The encoder, its tokenizer and its pooling.
pub struct EmbedModel {
    bert: Bert,
    tokenizer: tokenizers::Tokenizer,
    pooling: Pooling,
    normalize: bool,
    max_seq_length: usize,
    dimensions: usize,
    pad_id: u32,
    device: Device,
}

impl EmbedModel {
    /// Reads `dir` and builds the encoder on the CPU.
    pub fn load(dir: &Path) -> Result<EmbedModel, LoadError> {
        let ModelDir {
            bert,
            weights,
            weights_path,
            mut tokenizer,
            pooling,
            normalize,
            max_seq_length,
            dimensions,
            ..
        } = ModelDir::read(dir)?;
        super::heap::keep_big_buffers_on_the_heap();
        let device = Device::Cpu;
        let vb = VarBuilder::from_buffered_safetensors(weights, DType::F32, &device)
            .map_err(|e| LoadError::new(&weights_path, format!("not safetensors: {e}")))?;
        let encoder = Bert::load(vb, &bert).map_err(|e| {
            LoadError::new(
                &weights_path,
                format!("does not hold the BERT weights config.json describes: {e}"),
            )
        })?;
        // sentence-transformers cuts at max_seq_length (not the tokenizer file's own
        // truncation, 128 in all-MiniLM-L6-v2's) and pads per batch (abe pads itself).
        tokenizer
            .with_truncation(Some(TruncationParams {
                direction: TruncationDirection::Right,
                max_length: max_seq_length,
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
            }))
            .map_err(|e| LoadError::new(dir.join("tokenizer.json"), format!("truncation: {e}")))?;
        tokenizer.with_padding(None);
        Ok(EmbedModel {
            pad_id: bert.pad_token_id as u32,
            bert: encoder,
            tokenizer,
            pooling,
            normalize,
            max_seq_length,
            dimensions,
            device,
        })
    }

    /// Width of the sentence vectors.
    pub fn dimensions(&self) -> usize {
        self.dimensions
    }

    /// Longest input in tokens (with special tokens); longer ones are cut to it.
    pub fn max_seq_length(&self) -> usize {
        self.max_seq_length
    }

    /// Whether vectors come out with unit length.
    pub fn normalizes(&self) -> bool {
        self.normalize
    }

    /// Tokenizes one input as sentence-transformers does (whitespace stripped, special
    /// tokens added, cut at `max_seq_length`).
    pub fn tokenize(&self, text: &str) -> Result<Tokens, String> {
        let enc = self
            .tokenizer
            .encode(text.trim(), true)
            .map_err(|e| format!("cannot tokenize the input: {e}"))?;
        Ok(Tokens {
            truncated: !enc.get_overflowing().is_empty(),
            ids: enc.get_ids().to_vec(),
        })
    }

    /// Sentence vectors of `inputs` (each non-empty, at most `max_seq_length` ids), run as
    /// one batch padded to the longest: `inputs.len()` rows of `dimensions()` values.
    pub fn embed(&self, inputs: &[&[u32]]) -> candle_core::Result<Vec<Vec<f32>>> {
        let rows = inputs.len();
        let longest = inputs.iter().map(|i| i.len()).max().unwrap_or(0);
        if rows == 0 || longest == 0 {
            return Ok(Vec::new());
        }
        debug_assert!(longest <= self.max_seq_length);
        let mut ids = vec![self.pad_id; rows * longest];
        let mut mask = vec![0f32; rows * longest];
        for (r, input) in inputs.iter().enumerate() {
            ids[r * longest..r * longest + input.len()].copy_from_slice(input);
            mask[r * longest..r * longest + input.len()].fill(1.0);
        }
        let ids = Tensor::from_vec(ids, (rows, longest), &self.device)?;
        let mask = Tensor::from_vec(mask, (rows, longest), &self.device)?;
        let types = ids.zeros_like()?;
        let hidden = self.bert.forward(&ids, &types, &mask)?;
        let mut pooled = self.pooling.apply(&hidden, &mask)?;
        if self.normalize {
            pooled = pooling::normalize(&pooled)?;
        }
        pooled.to_vec2::<f32>()
    }
}
