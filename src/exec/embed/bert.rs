//! The BERT encoder: candle-transformers 0.11's `BertModel` (its config and weight names),
//! ported here so that everything but the big matrix products is abe's own fused, parallel
//! code.
//!
//! Inference only: no dropout (it is the identity at inference), no pooler, no heads. Tokens
//! are rows of one [batch x seq, hidden] matrix throughout. Per layer: one GEMM against the
//! query, key and value weights stacked at load ([`super::attention`] adds their biases and
//! attends per sequence and head), one GEMM for the attention output, then bias + residual +
//! LayerNorm in one pass ([`super::add_norm`]), the intermediate GEMM with bias + GELU in one
//! pass ([`super::gelu`]), the output GEMM and a second add & norm. The GEMMs are candle's
//! (gemm), against weights transposed once at load to [in, out]. Measured at batch 64 x 16
//! tokens, served: 99-104 ms a pass against 132-139 ms with candle's ops, 85-91 ms with
//! [`super::heap`] (BENCHMARKS.md, "Kernel choice, and abe against Infinity again"). The vectors match
//! sentence-transformers' as before (tests/embed_model.rs, cosine >= 0.99999).
//!
//! What must never happen here: an op that differs from the reference other than in float
//! rounding.

use super::add_norm::AddNorm;
use super::attention::Attention;
use super::bert_config::{BertConfig as Config, HiddenAct};
use super::gelu::bias_gelu_erf;
use candle_core::{DType, Module, Result, Tensor, D};
use candle_nn::{embedding, layer_norm, linear, Embedding, LayerNorm, VarBuilder};

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
    /// Query, key and value weights side by side, transposed: [hidden, 3 x hidden].
    qkv: Tensor,
    /// Their biases, concatenated.
    qkv_bias: Vec<f32>,
    attention_out: Tensor,
    attention_norm: AddNorm,
    intermediate: Tensor,
    intermediate_bias: Vec<f32>,
    act: HiddenAct,
    out: Tensor,
    out_norm: AddNorm,
    heads: usize,
    head_size: usize,
}

/// A dense layer's weight, as safetensors holds it ([out, in]), and bias.
fn dense(vb: VarBuilder, inp: usize, out: usize) -> Result<(Tensor, Vec<f32>)> {
    let l = linear(inp, out, vb)?;
    let bias = match l.bias() {
        Some(b) => b.to_vec1::<f32>()?,
        None => vec![0.0; out],
    };
    Ok((l.weight().clone(), bias))
}

/// `w` [out, in] as a contiguous [in, out], the layout of the measured GEMM
/// (benches/embed_forward.rs, `gemm_1024x384x1536`), so `x.matmul(&w)` is `x W^T`.
fn transposed(w: &Tensor) -> Result<Tensor> {
    w.t()?.contiguous()
}

/// A dense layer's bias and the LayerNorm after its residual add.
fn add_norm(dense_bias: Vec<f32>, vb: VarBuilder, h: usize, eps: f64) -> Result<AddNorm> {
    let norm = layer_norm(h, eps, vb)?;
    let beta = match norm.bias() {
        Some(b) => b.to_vec1::<f32>()?,
        None => vec![0.0; h],
    };
    Ok(AddNorm {
        bias: dense_bias,
        gamma: norm.weight().to_vec1::<f32>()?,
        beta,
        eps: eps as f32,
    })
}

impl Layer {
    fn load(vb: VarBuilder, c: &Config) -> Result<Layer> {
        let h = c.hidden_size;
        let att = vb.pp("attention");
        let (q, qb) = dense(att.pp("self").pp("query"), h, h)?;
        let (k, kb) = dense(att.pp("self").pp("key"), h, h)?;
        let (v, vb_) = dense(att.pp("self").pp("value"), h, h)?;
        let (attention_out, ab) = dense(att.pp("output").pp("dense"), h, h)?;
        let (intermediate, intermediate_bias) =
            dense(vb.pp("intermediate").pp("dense"), h, c.intermediate_size)?;
        let (out, ob) = dense(vb.pp("output").pp("dense"), c.intermediate_size, h)?;
        Ok(Layer {
            qkv: transposed(&Tensor::cat(&[&q, &k, &v], 0)?)?,
            qkv_bias: [qb, kb, vb_].concat(),
            attention_out: transposed(&attention_out)?,
            attention_norm: add_norm(ab, att.pp("output").pp("LayerNorm"), h, c.layer_norm_eps)?,
            intermediate: transposed(&intermediate)?,
            intermediate_bias,
            act: c.hidden_act,
            out: transposed(&out)?,
            out_norm: add_norm(ob, vb.pp("output").pp("LayerNorm"), h, c.layer_norm_eps)?,
            heads: c.num_attention_heads,
            head_size: h / c.num_attention_heads,
        })
    }

    /// `xs` [batch x seq, hidden]; `mask` batch x seq of 1 (token) or 0 (padding).
    fn forward(&self, xs: &Tensor, batch: usize, seq: usize, mask: &[f32]) -> Result<Tensor> {
        let qkv = xs.matmul(&self.qkv)?;
        let context = Attention {
            batch,
            seq,
            heads: self.heads,
            head_size: self.head_size,
            qkv_bias: &self.qkv_bias,
            mask,
        }
        .forward(&qkv)?;
        let attended = self
            .attention_norm
            .forward(&context.matmul(&self.attention_out)?, xs)?;
        let inner = attended.matmul(&self.intermediate)?;
        let inner = match self.act {
            HiddenAct::Gelu => bias_gelu_erf(&inner, &self.intermediate_bias)?,
            HiddenAct::GeluApproximate => inner
                .broadcast_add(&Tensor::new(
                    self.intermediate_bias.as_slice(),
                    xs.device(),
                )?)?
                .gelu()?,
            HiddenAct::Relu => inner
                .broadcast_add(&Tensor::new(
                    self.intermediate_bias.as_slice(),
                    xs.device(),
                )?)?
                .relu()?,
        };
        self.out_norm.forward(&inner.matmul(&self.out)?, &attended)
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
        let (batch, seq) = ids.dims2()?;
        let xs = self.embeddings.forward(ids, types)?;
        let hidden = xs.dim(D::Minus1)?;
        let mut xs = xs.reshape((batch * seq, hidden))?;
        let mask = mask.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
        for layer in &self.layers {
            xs = layer.forward(&xs, batch, seq, &mask)?;
        }
        xs.reshape((batch, seq, hidden))
    }
}
