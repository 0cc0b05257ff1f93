//! The prosody predictor: `DurationEncoder` (LSTM + AdaLayerNorm, style concatenated), the
//! duration LSTM and projection, and `F0Ntrain` (shared LSTM, F0 and energy branches of
//! `AdainResBlk1d`s). `AdainResBlk1d` is also the decoder's block.

use super::nn::{AdaIn, AdaInStyle, BiLstm, Conv1d, DepthwiseUp2, Linear};
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
    /// Time-major: `x` `[t, c_in]` -> (`[t', c_out]`, t'), t' = t or 2t.
    pub fn forward_tc(&self, x: &[f32], t: usize) -> Result<(Vec<f32>, usize)> {
        let b = self.blk;
        let cin = x.len() / t.max(1);
        if t == 0 || x.len() != t * cin {
            return Err(candle_core::Error::Msg(format!("AdainResBlk1d: {} values for {t} frames", x.len())).into());
        }
        // shortcut: nearest x2 and the 1x1 conv (no bias) commute; the conv goes first
        let (sc, ts) = match &b.conv1x1 {
            Some(c) => c.forward_tc(x, t)?,
            None => (x.to_vec(), t),
        };
        let (mut out, tout) = if b.pool.is_some() {
            let c = sc.len() / ts;
            let mut up = Vec::with_capacity(2 * sc.len());
            for row in sc.chunks_exact(c) {
                up.extend_from_slice(row);
                up.extend_from_slice(row);
            }
            (up, 2 * ts)
        } else {
            (sc, ts)
        };
        let mut xb = Vec::new();
        let (r, tr) = match &b.pool {
            Some(p) => {
                let a = self.n1.forward_leaky_tc(x, t, 0.2);
                let u = p.forward_tc(&a, t);
                b.conv1.forward_tc(&u, 2 * t)?
            }
            None => {
                let mut y = Vec::new();
                let t1 = b.conv1.norm_leaky_conv(&self.n1, x, t, 0.2, &mut xb, &mut y, false)?;
                (y, t1)
            }
        };
        if tr != tout {
            return Err(candle_core::Error::Msg(format!("AdainResBlk1d: residual {tr} frames, shortcut {tout}")).into());
        }
        let t2 = b.conv2.norm_leaky_conv(&self.n2, &r, tr, 0.2, &mut xb, &mut out, true)?;
        if t2 != tout {
            return Err(candle_core::Error::Msg(format!("AdainResBlk1d: residual {t2} frames, shortcut {tout}")).into());
        }
        for v in &mut out {
            *v *= std::f32::consts::FRAC_1_SQRT_2;
        }
        Ok((out, tout))
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

    /// `DurationEncoder`: `d_en` time-major `[t, hidden]`, `s` `[1, style]` -> `d`
    /// `[t, hidden + style]`.
    pub fn encode(&self, d_en: &[f32], t: usize, s: &Tensor) -> Result<Vec<f32>> {
        let st: Vec<f32> = s.flatten_all()?.to_vec1()?;
        let sd = st.len();
        let hidden = d_en.len() / t.max(1);
        let with_style = |y: &[f32], c: usize| -> Vec<f32> {
            let mut x = Vec::with_capacity(t * (c + sd));
            for row in y.chunks_exact(c) {
                x.extend_from_slice(row);
                x.extend_from_slice(&st);
            }
            x
        };
        let mut x = with_style(d_en, hidden);
        for (lstm, ada) in &self.dur_enc {
            let mut y = lstm.forward_vec(&x, t)?;
            ada.prepare(s)?.layer_rows(&mut y);
            let c = y.len() / t.max(1);
            x = with_style(&y, c);
        }
        Ok(x)
    }

    /// Per-token durations in frames before rounding: `sum(sigmoid(proj(lstm(d))))`.
    pub fn durations(&self, d: &[f32], t: usize) -> Result<Vec<f32>> {
        let x = self.lstm.forward_vec(d, t)?;
        let k = x.len() / t.max(1);
        let p = self.duration_proj.forward_vec(&x, t, k)?;
        let n = self.duration_proj.out_features();
        Ok(p.chunks_exact(n).map(|r| r.iter().map(|&v| super::nn::sigmoid(v)).sum()).collect())
    }

    /// `F0Ntrain`: `en` time-major `[frames, hidden + style]` -> (F0, N), each `2 frames` long.
    pub fn f0_n(&self, en: &[f32], t0: usize, s: &Tensor) -> Result<(Vec<f32>, Vec<f32>)> {
        let x = self.shared.forward_vec(en, t0)?; // [frames, hidden]
        let run = |blocks: &[AdainResBlk1d], proj: &Conv1d| -> Result<Vec<f32>> {
            let (mut y, mut t) = (x.clone(), t0);
            for b in blocks {
                (y, t) = b.styled(s)?.forward_tc(&y, t)?;
            }
            Ok(proj.forward_tc(&y, t)?.0)
        };
        // The two stacks one after the other, each spreading its convolutions over the pool.
        Ok((run(&self.f0, &self.f0_proj)?, run(&self.n, &self.n_proj)?))
    }
}
