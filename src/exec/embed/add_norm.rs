//! BERT's "add & norm": LayerNorm(x + bias + residual), one fused pass over rows.
//!
//! `x` is a dense layer's product without its bias; the bias add, the residual add and
//! the LayerNorm that candle ran as a broadcast add, an add and a norm (three fresh buffers,
//! the adds on one thread) run here as one pass over row blocks on the current rayon pool.
//! The bias is added before the residual, as in the reference ((x W^T + b) + residual).
//!
//! What must never happen here: a result that differs from candle-nn's LayerNorm of the
//! same sum beyond float rounding.

use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

/// Rows per rayon task: a few tens of microseconds of work each at hidden 384.
const ROWS: usize = 16;

/// A dense layer's bias followed by a residual LayerNorm.
pub struct AddNorm {
    /// The dense layer's bias: hidden.
    pub bias: Vec<f32>,
    /// LayerNorm's weight: hidden.
    pub gamma: Vec<f32>,
    /// LayerNorm's bias: hidden.
    pub beta: Vec<f32>,
    /// LayerNorm's epsilon.
    pub eps: f32,
}

impl AddNorm {
    /// LayerNorm(`x` + bias + `residual`), both [tokens, hidden] f32.
    pub fn forward(&self, x: &Tensor, residual: &Tensor) -> Result<Tensor> {
        x.contiguous()?
            .apply_op2_no_bwd(&residual.contiguous()?, self)
    }
}

impl CustomOp2 for AddNorm {
    fn name(&self) -> &'static str {
        "abe-add-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (CpuStorage::F32(x), CpuStorage::F32(r)) = (s1, s2) else {
            candle_core::bail!("abe-add-norm: f32 only");
        };
        let (Some((x0, x1)), Some((r0, r1))) = (l1.contiguous_offsets(), l2.contiguous_offsets())
        else {
            candle_core::bail!("abe-add-norm: the inputs must be contiguous");
        };
        let (x, r) = (&x[x0..x1], &r[r0..r1]);
        let hidden = self.bias.len();
        if x.len() != r.len() || hidden == 0 || x.len() % hidden != 0 {
            candle_core::bail!(
                "abe-add-norm: {} and {} values, hidden {hidden}",
                x.len(),
                r.len()
            );
        }
        let mut out = vec![0f32; x.len()];
        out.par_chunks_mut(ROWS * hidden)
            .zip(x.par_chunks(ROWS * hidden))
            .zip(r.par_chunks(ROWS * hidden))
            .for_each(|((out, x), r)| {
                for ((out, x), r) in out
                    .chunks_exact_mut(hidden)
                    .zip(x.chunks_exact(hidden))
                    .zip(r.chunks_exact(hidden))
                {
                    self.row(out, x, r);
                }
            });
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }
}

impl AddNorm {
    fn row(&self, out: &mut [f32], x: &[f32], r: &[f32]) {
        for ((o, &x), (&b, &r)) in out.iter_mut().zip(x).zip(self.bias.iter().zip(r)) {
            *o = (x + b) + r;
        }
        let n = out.len() as f32;
        let mean = out.iter().sum::<f32>() / n;
        let var = out.iter().map(|&v| (v - mean) * (v - mean)).sum::<f32>() / n;
        let inv_std = (var + self.eps).sqrt().recip();
        for (o, (&g, &b)) in out.iter_mut().zip(self.gamma.iter().zip(&self.beta)) {
            *o = (*o - mean) * inv_std * g + b;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn matches_candles_bias_add_residual_and_layer_norm() {
        let (rows, hidden) = (37, 24);
        let dev = Device::Cpu;
        let x = Tensor::randn(0f32, 2.0, (rows, hidden), &dev).unwrap();
        let r = Tensor::randn(1f32, 1.0, (rows, hidden), &dev).unwrap();
        let wave = |k: f32| {
            (0..hidden)
                .map(|i| (i as f32 * k).cos())
                .collect::<Vec<f32>>()
        };
        let op = AddNorm {
            bias: wave(0.3),
            gamma: wave(0.7),
            beta: wave(1.1),
            eps: 1e-12,
        };
        let ours = op.forward(&x, &r).unwrap();
        let t = |v: &[f32]| Tensor::new(v, &dev).unwrap();
        let sum = (x.broadcast_add(&t(&op.bias)).unwrap() + &r).unwrap();
        let theirs = candle_nn::ops::layer_norm(&sum, &t(&op.gamma), &t(&op.beta), 1e-12).unwrap();
        let diff = (ours - theirs).unwrap().abs().unwrap().max_all().unwrap();
        let diff = diff.to_scalar::<f32>().unwrap();
        assert!(diff < 1e-5, "add & norm off by {diff}");
    }
}
