//! How a sentence-transformers model turns its token vectors into one sentence vector:
//! the pooling mode (from `1_Pooling/config.json`) and whether the result is normalised
//! (a `Normalize` module in `modules.json`).
//!
//! Padded positions never count: every mode masks them as sentence-transformers does
//! (mean divides by the real token count, max sets padding to -1e9 first).

use candle_core::{DType, IndexOp, Result, Tensor, D};
use serde::Deserialize;

/// One pooling mode (sentence-transformers can concatenate several; abe takes one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    /// Average of the real tokens' vectors.
    Mean,
    /// The first token's ([CLS]) vector.
    Cls,
    /// Element-wise maximum over the real tokens.
    Max,
    /// Sum of the real tokens' vectors over the square root of their count.
    MeanSqrtLen,
}

/// `1_Pooling/config.json` as sentence-transformers writes it.
#[derive(Debug, Deserialize)]
pub struct PoolingConfig {
    pub word_embedding_dimension: usize,
    #[serde(default)]
    pub pooling_mode_cls_token: bool,
    #[serde(default)]
    pub pooling_mode_mean_tokens: bool,
    #[serde(default)]
    pub pooling_mode_max_tokens: bool,
    #[serde(default)]
    pub pooling_mode_mean_sqrt_len_tokens: bool,
    #[serde(default)]
    pub pooling_mode_weightedmean_tokens: bool,
    #[serde(default)]
    pub pooling_mode_lasttoken: bool,
}

impl PoolingConfig {
    /// The one mode the config turns on, or why abe cannot serve it.
    pub fn mode(&self) -> std::result::Result<Pooling, String> {
        let modes = [
            (
                self.pooling_mode_mean_tokens,
                Some(Pooling::Mean),
                "mean_tokens",
            ),
            (self.pooling_mode_cls_token, Some(Pooling::Cls), "cls_token"),
            (
                self.pooling_mode_max_tokens,
                Some(Pooling::Max),
                "max_tokens",
            ),
            (
                self.pooling_mode_mean_sqrt_len_tokens,
                Some(Pooling::MeanSqrtLen),
                "mean_sqrt_len_tokens",
            ),
            (
                self.pooling_mode_weightedmean_tokens,
                None,
                "weightedmean_tokens",
            ),
            (self.pooling_mode_lasttoken, None, "lasttoken"),
        ];
        let on: Vec<_> = modes.iter().filter(|m| m.0).collect();
        match on.as_slice() {
            [(_, Some(mode), _)] => Ok(*mode),
            [(_, None, name)] => Err(format!(
                "pooling_mode_{name} is not supported; abe pools with mean, cls, max or \
                 mean_sqrt_len"
            )),
            [] => Err("turns on no pooling mode; set one pooling_mode_* to true".into()),
            many => Err(format!(
                "turns on {} pooling modes ({}); abe serves models with exactly one",
                many.len(),
                many.iter().map(|m| m.2).collect::<Vec<_>>().join(", ")
            )),
        }
    }
}

impl Pooling {
    /// Pools `hidden` (batch x positions x width) over the positions where `mask`
    /// (batch x positions, 1 real / 0 padding, f32) is 1: batch x width.
    pub fn apply(self, hidden: &Tensor, mask: &Tensor) -> Result<Tensor> {
        debug_assert_eq!(mask.dtype(), DType::F32);
        let mask3 = mask.unsqueeze(D::Minus1)?; // batch x positions x 1
        match self {
            Pooling::Cls => hidden.i((.., 0)),
            Pooling::Mean | Pooling::MeanSqrtLen => {
                let sum = hidden.broadcast_mul(&mask3)?.sum(1)?;
                // At least one real token per input ([CLS]); clamp as sentence-transformers.
                let count = mask.sum_keepdim(1)?.clamp(1e-9f32, f32::MAX)?;
                let divisor = if self == Pooling::Mean {
                    count
                } else {
                    count.sqrt()?
                };
                sum.broadcast_div(&divisor)
            }
            Pooling::Max => {
                // Padding gets -1e9 so it never wins the maximum.
                let penalty = ((mask3.ones_like()? - &mask3)? * -1e9)?;
                hidden.broadcast_add(&penalty)?.max(1)
            }
        }
    }
}

/// Divides each row by its L2 norm (at least 1e-12, as torch's `normalize`).
pub fn normalize(v: &Tensor) -> Result<Tensor> {
    let norm = v
        .sqr()?
        .sum_keepdim(D::Minus1)?
        .sqrt()?
        .clamp(1e-12f32, f32::MAX)?;
    v.broadcast_div(&norm)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn config(json: &str) -> PoolingConfig {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn one_mode_is_read_and_others_are_refused_by_name() {
        let c = config(r#"{"word_embedding_dimension": 4, "pooling_mode_mean_tokens": true}"#);
        assert_eq!(c.mode(), Ok(Pooling::Mean));
        let c = config(r#"{"word_embedding_dimension": 4, "pooling_mode_cls_token": true}"#);
        assert_eq!(c.mode(), Ok(Pooling::Cls));
        let none = config(r#"{"word_embedding_dimension": 4}"#).mode();
        assert!(none.unwrap_err().contains("no pooling mode"));
        let two = config(
            r#"{"word_embedding_dimension": 4, "pooling_mode_cls_token": true,
                "pooling_mode_max_tokens": true}"#,
        )
        .mode();
        assert!(two.unwrap_err().contains("cls_token, max_tokens"));
        let w = config(r#"{"word_embedding_dimension": 4, "pooling_mode_lasttoken": true}"#);
        assert!(w.mode().unwrap_err().contains("lasttoken"));
    }

    #[test]
    fn padding_never_counts() {
        let dev = Device::Cpu;
        // Two inputs, three positions, width 2; the second input has one real token.
        let hidden = Tensor::new(
            &[
                [[1f32, 2.], [3., 4.], [5., 6.]],
                [[7., -8.], [100., 100.], [100., 100.]],
            ],
            &dev,
        )
        .unwrap();
        let mask = Tensor::new(&[[1f32, 1., 1.], [1., 0., 0.]], &dev).unwrap();
        let rows = |p: Pooling| p.apply(&hidden, &mask).unwrap().to_vec2::<f32>().unwrap();
        assert_eq!(rows(Pooling::Mean), [[3., 4.], [7., -8.]]);
        assert_eq!(rows(Pooling::Cls), [[1., 2.], [7., -8.]]);
        assert_eq!(rows(Pooling::Max), [[5., 6.], [7., -8.]]);
        let s = rows(Pooling::MeanSqrtLen);
        assert!((s[0][0] - 9. / 3f32.sqrt()).abs() < 1e-5);
        assert_eq!(s[1], [7., -8.]);
        let n = normalize(&Tensor::new(&[[3f32, 4.], [0., 0.]], &dev).unwrap())
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        assert_eq!(n, [[0.6, 0.8], [0., 0.]]);
    }
}
