//! BERT's activation, GELU with the exact erf (`hidden_act = "gelu"`), on every core.
//!
//! candle's `gelu_erf` calls libm's `erff` element by element on one thread: profiled
//! (`perf record` on the batch-64 forward bench, AVX-512 gemm), `erff` and its `erfc2` took
//! 17% of all samples while the other core waited. Here the same function runs over
//! contiguous chunks on rayon's pool (the one the pass runs in, see `threads`), with erf
//! as a branch-free rational function of x on [-4, 4] (outside it erf is +-1 in f32; the
//! same approximation as Eigen's and XLA's f32 erf), which the compiler vectorises. Checked
//! below on [-10, 10]: erf within 1e-6 of libm's `erff` (4.2e-7 measured), GELU within
//! 1e-6 x max(1, |x|) of candle's, far inside the 1e-5 cosine budget of tests/embed_model.rs.
//!
//! [`bias_gelu_erf`] adds the dense layer's bias in the same pass (bert.rs's intermediate
//! layer), sparing candle's one-thread broadcast add and its buffer.
//!
//! What must never happen here: a result that differs from GELU-erf beyond float rounding
//! (it would move every vector), or work on a non-contiguous tensor without a copy first.

use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

/// Elements per rayon task: big enough that scheduling costs nothing next to the math.
const CHUNK: usize = 16 * 1024;

/// erf(x) for f32: x * P(x^2) / Q(x^2) with x clamped to [-4, 4].
#[inline(always)]
fn erf(x: f32) -> f32 {
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let mut p = x2 * -2.726_142_3e-10 + 2.770_681_4e-8;
    p = x2 * p + -2.101_024e-6;
    p = x2 * p + -5.692_506_4e-5;
    p = x2 * p + -7.349_906_3e-4;
    p = x2 * p + -2.954_6e-3;
    p = x2 * p + -1.609_603_3e-2;
    let mut q = x2 * -1.456_607_2e-5 + -2.133_740_6e-4;
    q = x2 * q + -1.682_827e-3;
    q = x2 * q + -7.373_329_2e-3;
    q = x2 * q + -1.426_473_9e-2;
    x * p / q
}

#[inline(always)]
fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// The candle op: f32 in, f32 out, same shape; `bias` (one value per column, or empty for
/// none) is added first, as the dense layer before the activation would.
struct GeluErf<'a> {
    bias: &'a [f32],
}

impl CustomOp1 for GeluErf<'_> {
    fn name(&self) -> &'static str {
        "abe-gelu-erf"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let CpuStorage::F32(all) = storage else {
            candle_core::bail!("abe-gelu-erf: f32 only");
        };
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("abe-gelu-erf: the input must be contiguous");
        };
        let src = &all[start..end];
        let mut dst = vec![0f32; src.len()];
        if self.bias.is_empty() {
            dst.par_chunks_mut(CHUNK)
                .zip(src.par_chunks(CHUNK))
                .for_each(|(d, s)| d.iter_mut().zip(s).for_each(|(d, &s)| *d = gelu(s)));
        } else {
            let width = self.bias.len();
            if src.len() % width != 0 {
                candle_core::bail!("abe-gelu-erf: {} values, rows of {width}", src.len());
            }
            let chunk = (CHUNK / width).max(1) * width;
            dst.par_chunks_mut(chunk)
                .zip(src.par_chunks(chunk))
                .for_each(|(d, s)| {
                    for (d, s) in d.chunks_exact_mut(width).zip(s.chunks_exact(width)) {
                        for ((d, &s), &b) in d.iter_mut().zip(s).zip(self.bias) {
                            *d = gelu(s + b);
                        }
                    }
                });
        }
        Ok((CpuStorage::F32(dst), layout.shape().clone()))
    }
}

/// GELU-erf of `xs` (f32), computed on the current rayon pool.
pub fn gelu_erf(xs: &Tensor) -> Result<Tensor> {
    xs.contiguous()?.apply_op1_no_bwd(&GeluErf { bias: &[] })
}

/// GELU-erf of `xs + bias` (`xs` f32 rows of `bias.len()`), in one pass on the current
/// rayon pool: the dense layer's bias add fused into its activation.
pub fn bias_gelu_erf(xs: &Tensor, bias: &[f32]) -> Result<Tensor> {
    xs.contiguous()?.apply_op1_no_bwd(&GeluErf { bias })
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn erf_matches_libm_and_gelu_matches_candles() {
        let mut worst = 0f32;
        for i in -100_000..=100_000 {
            let x = i as f32 * 1e-4 * 6.0;
            let want = candle_core::cpu::erf::erf_f32(x);
            worst = worst.max((erf(x) - want).abs());
        }
        assert!(worst < 1e-6, "erf off by {worst}");
        let xs: Vec<f32> = (0..40_000).map(|i| (i as f32 - 20_000.0) * 5e-4).collect();
        let t = Tensor::from_vec(xs, (200, 200), &Device::Cpu).unwrap();
        let ours = gelu_erf(&t)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let theirs = t
            .gelu_erf()
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        // GELU's error is x/2 times erf's, so it is bounded per unit of |x|.
        let xs = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let diff = ours
            .iter()
            .zip(&theirs)
            .zip(&xs)
            .map(|((a, b), x)| (a - b).abs() / x.abs().max(1.0))
            .fold(0f32, f32::max);
        assert!(diff < 1e-6, "gelu off by {diff} per unit of |x|");
    }
}
