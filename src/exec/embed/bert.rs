//! The BERT encoder: candle-transformers 0.11's `BertModel` (its config and weight names),
//! ported here so its activation can be abe's parallel GELU ([`super::gelu`]) instead of
//! candle's one-thread `gelu_erf`.
//!
//! Inference only: no dropout (it is the identity at inference), no pooler, no heads. Same
//! ops in the same order as candle-transformers' (Linear, LayerNorm and softmax are
//! candle-nn's), so the vectors match sentence-transformers' as before
//! (tests/embed_model.rs). What must never happen here: an op that differs from the
//! reference other than in float rounding.

use super::gelu::gelu_erf;
use candle_core::{DType, Module, Result, Tensor, D};
use candle_nn::{embedding, layer_norm, linear, Embedding, LayerNorm, Linear, VarBuilder};
use candle_transformers::models::bert::{Config, HiddenAct};

struct Embeddings {
    word: Embedding,
    position: Embedding,
    token_type: Embedding,
    layer_norm: LayerNorm,
}

impl Embeddings {
    fn load(vb: VarBuilder, c: &Config) -> Result<Embeddings> {
        Ok(Embeddings {
            word: embedding(c.vocab_size, c.hidden_size, vb.pp("word_embeddings"))?,
            position: embedding(
                c.max_position_embeddings,
                c.hidden_size,
                vb.pp("position_embeddings"),
            )?,
            token_type: embedding(
                c.type_vocab_size,
                c.hidden_size,
                vb.pp("token_type_embeddings"),
            )?,
            layer_norm: layer_norm(c.hidden_size, c.layer_norm_eps, vb.pp("LayerNorm"))?,
        })
    }

    fn forward(&self, ids: &Tensor, types: &Tensor) -> Result<Tensor> {
        let (_, seq_len) = ids.dims2()?;
        let xs = (self.word.forward(ids)? + self.token_type.forward(types)?)?;
        let positions: Vec<u32> = (0..seq_len as u32).collect();
        let positions = Tensor::new(positions.as_slice(), ids.device())?;
        let xs = xs.broadcast_add(&self.position.forward(&positions)?)?;
        self.layer_norm.forward(&xs)
    }
}

struct Layer {
    query: Linear,
    key: Linear,
    value: Linear,
    attention_out: Linear,
    attention_norm: LayerNorm,
    intermediate: Linear,
    act: HiddenAct,
    out: Linear,
    out_norm: LayerNorm,
    heads: usize,
    head_size: usize,
}

impl Layer {
    fn load(vb: VarBuilder, c: &Config) -> Result<Layer> {
        let h = c.hidden_size;
        let att = vb.pp("attention");
        Ok(Layer {
            query: linear(h, h, att.pp("self").pp("query"))?,
            key: linear(h, h, att.pp("self").pp("key"))?,
            value: linear(h, h, att.pp("self").pp("value"))?,
            attention_out: linear(h, h, att.pp("output").pp("dense"))?,
            attention_norm: layer_norm(h, c.layer_norm_eps, att.pp("output").pp("LayerNorm"))?,
            intermediate: linear(h, c.intermediate_size, vb.pp("intermediate").pp("dense"))?,
            act: c.hidden_act,
            out: linear(c.intermediate_size, h, vb.pp("output").pp("dense"))?,
            out_norm: layer_norm(h, c.layer_norm_eps, vb.pp("output").pp("LayerNorm"))?,
            heads: c.num_attention_heads,
            head_size: h / c.num_attention_heads,
        })
    }

    /// (batch, seq, hidden) -> (batch, heads, seq, head_size), contiguous.
    fn split_heads(&self, xs: &Tensor) -> Result<Tensor> {
        let (b, s, _) = xs.dims3()?;
        xs.reshape((b, s, self.heads, self.head_size))?
            .transpose(1, 2)?
            .contiguous()
    }

    fn forward(&self, xs: &Tensor, mask: &Tensor) -> Result<Tensor> {
        let q = self.split_heads(&self.query.forward(xs)?)?;
        let k = self.split_heads(&self.key.forward(xs)?)?;
        let v = self.split_heads(&self.value.forward(xs)?)?;
        let scores = (q.matmul(&k.t()?)? / (self.head_size as f64).sqrt())?;
        let probs = candle_nn::ops::softmax(&scores.broadcast_add(mask)?, D::Minus1)?;
        let context = probs
            .matmul(&v)?
            .transpose(1, 2)?
            .contiguous()?
            .flatten_from(D::Minus2)?;
        let attended = self
            .attention_norm
            .forward(&(self.attention_out.forward(&context)? + xs)?)?;
        let inner = self.intermediate.forward(&attended)?;
        let inner = match self.act {
            HiddenAct::Gelu => gelu_erf(&inner)?,
            HiddenAct::GeluApproximate => inner.gelu()?,
            HiddenAct::Relu => inner.relu()?,
        };
        self.out_norm
            .forward(&(self.out.forward(&inner)? + attended)?)
    }
}

/// A BERT encoder: token ids in, the last hidden state out.
pub struct Bert {
    embeddings: Embeddings,
    layers: Vec<Layer>,
}

impl Bert {
    /// Loads the weights as candle-transformers' `BertModel::load` does: under `bert.`, at
    /// the root, or under `{model_type}.`.
    pub fn load(vb: VarBuilder, c: &Config) -> Result<Bert> {
        let vb = if vb.contains_tensor("bert.embeddings.word_embeddings.weight") {
            vb.pp("bert")
        } else if vb.contains_tensor("embeddings.word_embeddings.weight") {
            vb
        } else if let Some(t) = &c.model_type {
            vb.pp(t)
        } else {
            vb
        };
        let embeddings = Embeddings::load(vb.pp("embeddings"), c)?;
        let layers = (0..c.num_hidden_layers)
            .map(|i| Layer::load(vb.pp(format!("encoder.layer.{i}")), c))
            .collect::<Result<Vec<_>>>()?;
        Ok(Bert { embeddings, layers })
    }

    /// `ids` and `types` (batch, seq) u32, `mask` (batch, seq) f32 of 1 (token) or 0
    /// (padding): the last hidden state, (batch, seq, hidden).
    pub fn forward(&self, ids: &Tensor, types: &Tensor, mask: &Tensor) -> Result<Tensor> {
        let mut xs = self.embeddings.forward(ids, types)?;
        // (1 - mask) * f32::MIN, broadcast over heads and query positions, as
        // transformers' get_extended_attention_mask.
        let mask = mask.to_dtype(DType::F32)?.unsqueeze(1)?.unsqueeze(1)?;
        let mask = (mask.ones_like()? - &mask)?.affine(f64::from(f32::MIN), 0.0)?;
        for layer in &self.layers {
            xs = layer.forward(&xs, &mask)?;
        }
        Ok(xs)
    }
}
