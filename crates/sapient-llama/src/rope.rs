//! RoPE's cosine and sine tables: the base frequencies with the config's scaling (YaRN,
//! linear, per-dimension factors, Llama 3's), for every position the context holds.

use crate::config::{LlamaConfig, RopeScaling};
use crate::{Error, Result};

/// `[max_len][rope_dim / 2]` cosine and sine tables for RoPE base `theta` and the config's
/// scaling.
pub(crate) fn rope_tables(cfg: &LlamaConfig, theta: f32, max_len: usize) -> Result<(Vec<f32>, Vec<f32>)> {
    let half = cfg.rope_dim / 2;
    let mut inv: Vec<f32> = (0..half)
        .map(|i| 1.0 / theta.powf(2.0 * i as f32 / cfg.rope_dim as f32))
        .collect();
    let (mut pos_scale, mut mag) = (1.0f32, 1.0f32);
    match &cfg.rope_scaling {
        None => {}
        Some(RopeScaling::Yarn { factor, original_context }) => {
            // ggml's `rope_yarn` with llama.cpp's defaults: the ramp between the correction
            // dimensions of beta fast 32 and beta slow 1.
            let (d, base) = (cfg.rope_dim as f32, theta);
            let corr = |beta: f32| d * (*original_context as f32 / (beta * 2.0 * std::f32::consts::PI)).ln() / (2.0 * base.ln());
            let (low, high) = (corr(32.0).floor().max(0.0), corr(1.0).ceil().min(d - 1.0));
            for (i, x) in inv.iter_mut().enumerate() {
                let ramp = 1.0 - ((i as f32 - low) / (high - low).max(0.001)).clamp(0.0, 1.0);
                *x = *x / factor * (1.0 - ramp) + *x * ramp;
            }
            mag = 1.0 + 0.1 * factor.ln();
        }
        Some(RopeScaling::Linear { factor }) => pos_scale = 1.0 / factor,
        Some(RopeScaling::FreqFactors(f)) => {
            if f.len() != half {
                return Err(Error::Config(format!(
                    "rope_freqs has {} factors, expected {half}",
                    f.len()
                )));
            }
            for (x, d) in inv.iter_mut().zip(f) {
                *x /= d;
            }
        }
        Some(RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        }) => {
            let old = *original_max_position_embeddings as f32;
            let low_wavelen = old / low_freq_factor;
            let high_wavelen = old / high_freq_factor;
            for x in inv.iter_mut() {
                let wavelen = 2.0 * std::f32::consts::PI / *x;
                if wavelen < high_wavelen {
                } else if wavelen > low_wavelen {
                    *x /= factor;
                } else {
                    let smooth = (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                    *x = (1.0 - smooth) * *x / factor + smooth * *x;
                }
            }
        }
    }
    let (mut cos, mut sin) = (Vec::with_capacity(max_len * half), Vec::with_capacity(max_len * half));
    for p in 0..max_len {
        let t = p as f32 * pos_scale;
        for &f in &inv {
            let a = t * f;
            cos.push(a.cos() * mag);
            sin.push(a.sin() * mag);
        }
    }
    Ok((cos, sin))
}
