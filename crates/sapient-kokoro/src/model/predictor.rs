//! The prosody predictor: `DurationEncoder` (LSTM + AdaLayerNorm, style concatenated), the
//! duration LSTM and projection, and `F0Ntrain` (shared LSTM, F0 and energy branches of
//! `AdainResBlk1d`s). `AdainResBlk1d` is also the decoder's block.

use super::nn::{leaky_relu, AdaIn, AdaInStyle, BiLstm, Conv1d, DepthwiseUp2, Linear};
use crate::{KokoroConfig, KokoroWeights, Result};
use candle_core::Tensor;

/// `AdainResBlk1d`: `(residual(x) + shortcut(x)) / sqrt(2)`; with `upsample`, the residual
/// path upsamples by the depthwise transposed conv and the shortcut by nearest x2.
pub struct AdainResBlk1d {
    norm1: AdaIn,
    norm2: AdaIn,
    conv1: Conv1d,
    conv2: Conv1d,
    conv1x1: Option<Conv1d>,
    pool: Option<DepthwiseUp2>,
}

pub struct AdainResBlk1dStyled<'a> {
    blk: &'a AdainResBlk1d,
    n1: AdaInStyle,
    n2: AdaInStyle,
}

impl AdainResBlk1d {
    pub fn load(w: &KokoroWeights, m: &str, learned_sc: bool, upsample: bool) -> Result<Self> {
        Ok(Self {
            norm1: AdaIn::load(w, &format!("{m}.norm1"))?,
            norm2: AdaIn::load(w, &format!("{m}.norm2"))?,
            conv1: Conv1d::load(w, &format!("{m}.conv1"), true, 1, 1, 1)?,
            conv2: Conv1d::load(w, &format!("{m}.conv2"), true, 1, 1, 1)?,
            conv1x1: if learned_sc {
                Some(Conv1d::load(w, &format!("{m}.conv1x1"), false, 1, 0, 1)?)
            } else {
                None
            },
            pool: if upsample { Some(DepthwiseUp2::load(w, &format!("{m}.pool"))?) } else { None },
        })
    }

    pub fn upsamples(&self) -> bool {
        self.pool.is_some()
    }

    pub fn styled(&self, s: &Tensor) -> Result<AdainResBlk1dStyled<'_>> {
        Ok(AdainResBlk1dStyled {
            blk: self,
            n1: self.norm1.prepare(s)?,
            n2: self.norm2.prepare(s)?,
        })
    }
}

impl AdainResBlk1dStyled<'_> {
    /// `x` `[c_in, t]` -> `[c_out, t]` (or `2t`).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let b = self.blk;
        let mut r = leaky_relu(&self.n1.forward(x)?, 0.2)?;
        if let Some(p) = &b.pool {
            r = p.forward(&r)?;
        }
        let r = b.conv1.forward(&r)?;
        let r = b.conv2.forward(&leaky_relu(&self.n2.forward(&r)?, 0.2)?)?;
        let mut sc = x.clone();
        if b.pool.is_some() {
            let (c, t) = sc.dims2()?;
            // nearest x2
            sc = sc.unsqueeze(2)?.broadcast_as((c, t, 2))?.reshape((c, 2 * t))?;
        }
        if let Some(c) = &b.conv1x1 {
            sc = c.forward(&sc)?;
        }
        Ok(((r + sc)? * std::f64::consts::FRAC_1_SQRT_2)?)
    }
}

pub struct ProsodyPredictor {
    /// `DurationEncoder`: (LSTM, AdaLayerNorm) x n_layer.
    dur_enc: Vec<(BiLstm, AdaIn)>,
    lstm: BiLstm,
    duration_proj: Linear,
    shared: BiLstm,
    f0: Vec<AdainResBlk1d>,
    n: Vec<AdainResBlk1d>,
    f0_proj: Conv1d,
    n_proj: Conv1d,
}

impl ProsodyPredictor {
    pub fn load(w: &KokoroWeights, cfg: &KokoroConfig) -> Result<Self> {
        let dur_enc = (0..cfg.n_layer)
            .map(|i| -> Result<_> {
                Ok((
                    BiLstm::load(w, &format!("predictor.text_encoder.lstms.{}", 2 * i))?,
                    AdaIn::load(w, &format!("predictor.text_encoder.lstms.{}", 2 * i + 1))?,
                ))
            })
            .collect::<Result<_>>()?;
        let branch = |b: &str| -> Result<Vec<AdainResBlk1d>> {
            Ok(vec![
                AdainResBlk1d::load(w, &format!("predictor.{b}.0"), false, false)?,
                AdainResBlk1d::load(w, &format!("predictor.{b}.1"), true, true)?,
                AdainResBlk1d::load(w, &format!("predictor.{b}.2"), false, false)?,
            ])
        };
        Ok(Self {
            dur_enc,
            lstm: BiLstm::load(w, "predictor.lstm")?,
            duration_proj: Linear::load(w, "predictor.duration_proj.linear_layer", true)?,
            shared: BiLstm::load(w, "predictor.shared")?,
            f0: branch("F0")?,
            n: branch("N")?,
            f0_proj: Conv1d::load(w, "predictor.F0_proj", true, 1, 0, 1)?,
            n_proj: Conv1d::load(w, "predictor.N_proj", true, 1, 0, 1)?,
        })
    }

    /// `DurationEncoder`: `d_en` `[t, hidden]`, `s` `[1, style]` -> `d` `[t, hidden + style]`.
    pub fn encode(&self, d_en: &Tensor, s: &Tensor) -> Result<Tensor> {
        let t = d_en.dims2()?.0;
        let sd = s.dims2()?.1;
        let st = s.broadcast_as((t, sd))?;
        let mut x = Tensor::cat(&[d_en, &st], 1)?;
        for (lstm, ada) in &self.dur_enc {
            let y = lstm.forward(&x)?;
            let y = ada.prepare(s)?.forward_layer(&y)?;
            x = Tensor::cat(&[&y, &st], 1)?;
        }
        Ok(x)
    }

    /// Per-token durations in frames before rounding: `sum(sigmoid(proj(lstm(d))))`.
    pub fn durations(&self, d: &Tensor) -> Result<Vec<f32>> {
        let x = self.lstm.forward(d)?;
        let p = candle_core::Tensor::exp(&self.duration_proj.forward(&x)?.neg()?)?;
        let sig = (p + 1.0)?.recip()?;
        Ok(sig.sum(1)?.to_vec1()?)
    }

    /// `F0Ntrain`: `en` `[frames, hidden + style]` -> (F0, N), each `2 frames` long.
    pub fn f0_n(&self, en: &Tensor, s: &Tensor) -> Result<(Tensor, Tensor)> {
        let x = self.shared.forward(en)?.t()?.contiguous()?; // [hidden, frames]
        let run = |blocks: &[AdainResBlk1d], proj: &Conv1d| -> Result<Tensor> {
            let mut y = x.clone();
            for b in blocks {
                y = b.styled(s)?.forward(&y)?;
            }
            Ok(proj.forward(&y)?.squeeze(0)?)
        };
        // The two stacks one after the other, each spreading its convolutions over the pool.
        Ok((run(&self.f0, &self.f0_proj)?, run(&self.n, &self.n_proj)?))
    }
}
