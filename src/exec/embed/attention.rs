//! BERT's self-attention for short sequences, straight from the fused QKV projection.
//!
//! Input: the [tokens, 3 x hidden] product of the layer's input with the concatenated
//! query/key/value weights (no bias yet), for `batch` sequences of `seq` padded positions.
//! Output: the [tokens, hidden] attention context, heads side by side, as candle-
//! transformers' `transpose(1, 2).flatten` gives it. Per (sequence, head): the biases are
//! added, scores = q k^T / sqrt(head_size) over the sequence's real keys only (the reference
//! adds f32::MIN to padded keys, whose softmax weight is then exactly 0), softmax, times v.
//!
//! Why by hand: candle ran this as head splits (`transpose` + `contiguous` copies), 768
//! batched 16x16x32 products per layer, a broadcast mask add and a softmax, all on one
//! thread but the products; at batch 64 that was most of the non-GEMM time. Here one rayon
//! task per sequence does all its heads in small buffers of its own.
//!
//! What must never happen here: a padded key with a non-zero weight, or a result that
//! differs from the reference beyond float rounding.

use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

/// The op: shapes, the QKV biases and which positions are real tokens.
pub struct Attention<'a> {
    /// Sequences in the pass.
    pub batch: usize,
    /// Padded positions per sequence.
    pub seq: usize,
    /// Attention heads; `hidden = heads * head_size`.
    pub heads: usize,
    /// Width of one head.
    pub head_size: usize,
    /// Query, key and value biases, concatenated: 3 x hidden.
    pub qkv_bias: &'a [f32],
    /// 1.0 for a real token, 0.0 for padding: batch x seq.
    pub mask: &'a [f32],
}

impl Attention<'_> {
    /// The [tokens, hidden] context of `qkv` ([tokens, 3 x hidden], f32, no bias).
    pub fn forward(&self, qkv: &Tensor) -> Result<Tensor> {
        qkv.contiguous()?.apply_op1_no_bwd(self)
    }

    /// One sequence: `qkv` its [seq, 3 x hidden] rows, `keep` its mask, `out` its
    /// [seq, hidden] context.
    fn sequence(&self, qkv: &[f32], keep: &[f32], out: &mut [f32]) {
        let (seq, d) = (self.seq, self.head_size);
        let hidden = self.heads * d;
        let keys: Vec<usize> = (0..seq).filter(|&j| keep[j] != 0.0).collect();
        let scale = 1.0 / (d as f32).sqrt();
        let mut k = vec![0f32; keys.len() * d];
        let mut v = vec![0f32; keys.len() * d];
        let mut q = vec![0f32; d];
        let mut p = vec![0f32; keys.len()];
        let mut acc = vec![0f32; d];
        for h in 0..self.heads {
            let (qo, ko, vo) = (h * d, hidden + h * d, 2 * hidden + h * d);
            for (n, &j) in keys.iter().enumerate() {
                let row = &qkv[j * 3 * hidden..(j + 1) * 3 * hidden];
                add(
                    &mut k[n * d..(n + 1) * d],
                    &row[ko..ko + d],
                    &self.qkv_bias[ko..ko + d],
                );
                add(
                    &mut v[n * d..(n + 1) * d],
                    &row[vo..vo + d],
                    &self.qkv_bias[vo..vo + d],
                );
            }
            for i in 0..seq {
                let row = &qkv[i * 3 * hidden..(i + 1) * 3 * hidden];
                add(&mut q, &row[qo..qo + d], &self.qkv_bias[qo..qo + d]);
                let mut max = f32::NEG_INFINITY;
                for (n, p) in p.iter_mut().enumerate() {
                    *p = dot(&q, &k[n * d..(n + 1) * d]) * scale;
                    max = max.max(*p);
                }
                let mut sum = 0f32;
                for p in p.iter_mut() {
                    *p = (*p - max).exp();
                    sum += *p;
                }
                acc.fill(0.0);
                for (n, &p) in p.iter().enumerate() {
                    let p = p / sum;
                    for (a, &x) in acc.iter_mut().zip(&v[n * d..(n + 1) * d]) {
                        *a += p * x;
                    }
                }
                out[i * hidden + qo..i * hidden + qo + d].copy_from_slice(&acc);
            }
        }
    }
}

#[inline(always)]
fn add(dst: &mut [f32], a: &[f32], b: &[f32]) {
    for ((d, &a), &b) in dst.iter_mut().zip(a).zip(b) {
        *d = a + b;
    }
}

/// A dot product in 8 independent lanes, so it vectorises without fast-math.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let (ac, ar) = a.split_at(a.len() / 8 * 8);
    let (bc, br) = b.split_at(ac.len());
    for (x, y) in ac.chunks_exact(8).zip(bc.chunks_exact(8)) {
        for l in 0..8 {
            lanes[l] += x[l] * y[l];
        }
    }
    let mut sum = lanes.iter().sum::<f32>();
    for (x, y) in ar.iter().zip(br) {
        sum += x * y;
    }
    sum
}

impl CustomOp1 for Attention<'_> {
    fn name(&self) -> &'static str {
        "abe-attention"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let CpuStorage::F32(all) = storage else {
            candle_core::bail!("abe-attention: f32 only");
        };
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("abe-attention: the input must be contiguous");
        };
        let hidden = self.heads * self.head_size;
        let tokens = self.batch * self.seq;
        let qkv = &all[start..end];
        if qkv.len() != tokens * 3 * hidden
            || self.qkv_bias.len() != 3 * hidden
            || self.mask.len() != tokens
        {
            candle_core::bail!(
                "abe-attention: {} values for {tokens} tokens of 3 x {hidden}",
                qkv.len()
            );
        }
        let mut out = vec![0f32; tokens * hidden];
        out.par_chunks_mut(self.seq * hidden)
            .zip(qkv.par_chunks(self.seq * 3 * hidden))
            .zip(self.mask.par_chunks(self.seq))
            .for_each(|((out, qkv), keep)| self.sequence(qkv, keep, out));
        Ok((CpuStorage::F32(out), Shape::from((tokens, hidden))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, D};

    /// Against candle's ops as candle-transformers' BERT runs them: split heads, scores
    /// with the f32::MIN padding mask, softmax, times v, heads back side by side.
    #[test]
    fn matches_candles_masked_attention() {
        let (batch, seq, heads, d) = (3, 5, 2, 8);
        let hidden = heads * d;
        let dev = Device::Cpu;
        let qkv = Tensor::randn(0f32, 1.0, (batch * seq, 3 * hidden), &dev).unwrap();
        let bias: Vec<f32> = (0..3 * hidden).map(|i| (i as f32 * 0.37).sin()).collect();
        let lens = [5, 3, 1];
        let mask: Vec<f32> = (0..batch * seq)
            .map(|t| f32::from(u8::from(t % seq < lens[t / seq])))
            .collect();
        let ours = Attention {
            batch,
            seq,
            heads,
            head_size: d,
            qkv_bias: &bias,
            mask: &mask,
        }
        .forward(&qkv)
        .unwrap();

        let with_bias = qkv
            .broadcast_add(&Tensor::new(bias.as_slice(), &dev).unwrap())
            .unwrap();
        let split = |i: usize| {
            with_bias
                .narrow(1, i * hidden, hidden)
                .unwrap()
                .reshape((batch, seq, heads, d))
                .unwrap()
                .transpose(1, 2)
                .unwrap()
                .contiguous()
                .unwrap()
        };
        let (q, k, v) = (split(0), split(1), split(2));
        let m = Tensor::from_vec(mask.clone(), (batch, 1, 1, seq), &dev).unwrap();
        let m = (m.ones_like().unwrap() - &m)
            .unwrap()
            .affine(f64::from(f32::MIN), 0.0)
            .unwrap();
        let scores = (q.matmul(&k.t().unwrap()).unwrap() / (d as f64).sqrt()).unwrap();
        let probs = candle_nn::ops::softmax(&scores.broadcast_add(&m).unwrap(), D::Minus1).unwrap();
        let theirs = probs
            .matmul(&v)
            .unwrap()
            .transpose(1, 2)
            .unwrap()
            .contiguous()
            .unwrap()
            .reshape((batch * seq, hidden))
            .unwrap();
        let diff = (ours - theirs).unwrap().abs().unwrap().max_all().unwrap();
        let diff = diff.to_scalar::<f32>().unwrap();
        assert!(diff < 1e-5, "attention off by {diff}");
    }
}
