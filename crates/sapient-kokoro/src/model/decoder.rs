//! The iSTFTNet decoder: `Decoder` (AdainResBlk1d encode/decode over the aligned text
//! features, F0 and energy), its `Generator` (harmonic source, STFT of the source, two
//! transposed-conv upsamplings with AdaIN residual blocks and Snake, spectrum head) and the
//! inverse STFT, written after the ONNX export (the reference):
//!
//! - source: `uv = f0 > 10`; per harmonic h = 1..9 the per-frame phase increment
//!   `frac(h f0 / 24000)` is summed over frames, times `2 pi * 300`, linearly upsampled x300
//!   (half-pixel), `0.1 sin(phase) uv`, then `tanh(linear(.))` over the 9 harmonics. The
//!   export has no noise: PyTorch's `SineGen` adds Gaussian noise (and a random initial phase
//!   that its linear downsampling drops anyway); the ONNX graph has no random op, so neither
//!   do we, and synthesis is deterministic.
//! - STFT: reflect-pad 10, frames of 20 with hop 5, periodic Hann window, magnitude and phase
//!   (`atan(im/re)` moved by +-pi where re < 0, as the graph does; a zero imaginary part,
//!   which the DC and Nyquist bins always have, gives 0 or +pi as `torch.angle` does).
//! - inverse: `exp(mag)`, `sin(phase)` of the head's two halves, the real inverse DFT of each
//!   frame times the window, overlap-added with hop 5, times `n_fft / hop = 4`, 10 samples cut
//!   at both ends. Like the export (the `TorchSTFT` of StyleTTS 2 traced with one frame), only
//!   the first 20 samples are divided by the squared window; the rest is not normalised.

use super::fast;
use crate::memory::memory_probe;
use super::nn::{AdaIn, AdaInStyle, Conv1d, ConvTranspose1d};
use super::predictor::AdainResBlk1d;
use crate::{KokoroConfig, KokoroWeights, Result};
use candle_core::Tensor;

/// `AdaINResBlock1`: three (AdaIN, Snake, dilated conv, AdaIN, Snake, conv) residual units.
pub struct AdaInResBlock1 {
    units: Vec<ResUnit>,
}

struct ResUnit {
    adain1: AdaIn,
    adain2: AdaIn,
    conv1: Conv1d,
    conv2: Conv1d,
    /// alpha and 1/alpha of the Snakes.
    alpha1: (Vec<f32>, Vec<f32>),
    alpha2: (Vec<f32>, Vec<f32>),
}

pub struct AdaInResBlock1Styled<'a> {
    blk: &'a AdaInResBlock1,
    styles: Vec<(AdaInStyle, AdaInStyle)>,
}

impl AdaInResBlock1 {
    pub fn load(w: &KokoroWeights, m: &str, k: usize, dilations: &[usize]) -> Result<Self> {
        let alpha = |name: String| -> Result<(Vec<f32>, Vec<f32>)> {
            let a = w.get(&name)?.flatten_all()?;
            Ok((a.to_vec1()?, a.recip()?.to_vec1()?))
        };
        let units = dilations
            .iter()
            .enumerate()
            .map(|(i, &d)| -> Result<ResUnit> {
                Ok(ResUnit {
                    adain1: AdaIn::load(w, &format!("{m}.adain1.{i}"))?,
                    adain2: AdaIn::load(w, &format!("{m}.adain2.{i}"))?,
                    conv1: Conv1d::load(w, &format!("{m}.convs1.{i}"), true, 1, (k * d - d) / 2, d)?,
                    conv2: Conv1d::load(w, &format!("{m}.convs2.{i}"), true, 1, (k - 1) / 2, 1)?,
                    alpha1: alpha(format!("{m}.alpha1.{i}"))?,
                    alpha2: alpha(format!("{m}.alpha2.{i}"))?,
                })
            })
            .collect::<Result<_>>()?;
        Ok(Self { units })
    }

    pub fn styled(&self, s: &Tensor) -> Result<AdaInResBlock1Styled<'_>> {
        let styles = self
            .units
            .iter()
            .map(|u| -> Result<_> { Ok((u.adain1.prepare(s)?, u.adain2.prepare(s)?)) })
            .collect::<Result<_>>()?;
        Ok(AdaInResBlock1Styled { blk: self, styles })
    }
}

impl AdaInResBlock1Styled<'_> {
    /// On a time-major `[t, c]` buffer.
    pub fn forward_tc(&self, mut xs: Vec<f32>, t: usize) -> Result<Vec<f32>> {
        let c = xs.len() / t.max(1);
        let mut xb = Vec::new();
        let mut y = Vec::new();
        for (u, (n1, n2)) in self.blk.units.iter().zip(&self.styles) {
            if let (Some(l1), Some(l2)) = (u.conv1.bf16_layout(t)?, u.conv2.bf16_layout(t)?) {
                // bf16 frames straight out of the norm + Snake, the second conv adding its
                // output to the residual
                n1.forward_snake_bf16(&xs, t, &u.alpha1.0, &u.alpha1.1, &mut xb, l1);
                let t1 = u.conv1.out_frames(t)?;
                y.resize(t1 * u.conv1.out_channels(), 0.0);
                u.conv1.forward_bf16(&xb, t, false, &mut y)?;
                if t1 != t || y.len() != xs.len() {
                    return Err(candle_core::Error::Msg(format!("resblock: {t1} frames out of {t} x {c}")).into());
                }
                n2.forward_snake_bf16(&y, t1, &u.alpha2.0, &u.alpha2.1, &mut xb, l2);
                let t2 = u.conv2.forward_bf16(&xb, t1, true, &mut xs)?;
                if t2 != t {
                    return Err(candle_core::Error::Msg(format!("resblock: {t2} frames out of {t} x {c}")).into());
                }
                continue;
            }
            let xt = n1.forward_snake_tc(&xs, t, &u.alpha1.0, &u.alpha1.1);
            let (xt, t1) = u.conv1.forward_tc(&xt, t)?;
            let xt = n2.forward_snake_tc(&xt, t1, &u.alpha2.0, &u.alpha2.1);
            let (xt, t2) = u.conv2.forward_tc(&xt, t1)?;
            if xt.len() != xs.len() || t2 != t {
                return Err(candle_core::Error::Msg(format!("resblock: {t2} frames out of {t} x {c}")).into());
            }
            for (a, b) in xs.iter_mut().zip(&xt) {
                *a += b;
            }
        }
        Ok(xs)
    }
}

pub struct Generator {
    l_linear_w: Vec<f32>,
    l_linear_b: f32,
    noise_convs: Vec<Conv1d>,
    noise_res: Vec<AdaInResBlock1>,
    ups: Vec<ConvTranspose1d>,
    resblocks: Vec<AdaInResBlock1>,
    conv_post: Conv1d,
    n_fft: usize,
    hop: usize,
    /// Total upsampling from F0 frames to samples (`prod(upsample_rates) * hop` = 300).
    upp: usize,
    window: Vec<f32>,
}

const SAMPLE_RATE: f32 = 24000.0;
const HARMONICS: usize = 9;

impl Generator {
    /// Releases each module's dense weights from `w` once packed.
    pub fn load(w: &mut KokoroWeights, cfg: &KokoroConfig) -> Result<Self> {
        let i = &cfg.istftnet;
        let g = "decoder.generator";
        let n_up = i.upsample_rates.len();
        let mut noise_convs = Vec::new();
        let mut noise_res = Vec::new();
        let mut ups = Vec::new();
        let mut resblocks = Vec::new();
        for u in 0..n_up {
            if u + 1 < n_up {
                let stride: usize = i.upsample_rates[u + 1..].iter().product();
                noise_convs.push(Conv1d::load(w, &format!("{g}.noise_convs.{u}"), true, stride, stride.div_ceil(2), 1)?);
                noise_res.push(AdaInResBlock1::load(w, &format!("{g}.noise_res.{u}"), 7, &[1, 3, 5])?);
                w.release(&format!("{g}.noise_res.{u}"));
            } else {
                noise_convs.push(Conv1d::load(w, &format!("{g}.noise_convs.{u}"), true, 1, 0, 1)?);
                noise_res.push(AdaInResBlock1::load(w, &format!("{g}.noise_res.{u}"), 11, &[1, 3, 5])?);
                w.release(&format!("{g}.noise_res.{u}"));
            }
            let (r, k) = (i.upsample_rates[u], i.upsample_kernel_sizes[u]);
            ups.push(ConvTranspose1d::load(w, &format!("{g}.ups.{u}"), r, (k - r) / 2)?);
            w.release(&format!("{g}.ups.{u}"));
            for (k, d) in i.resblock_kernel_sizes.iter().zip(&i.resblock_dilation_sizes) {
                let idx = resblocks.len();
                resblocks.push(AdaInResBlock1::load(w, &format!("{g}.resblocks.{idx}"), *k, d)?);
                w.release(&format!("{g}.resblocks.{idx}"));
            }
        }
        let n_fft = i.gen_istft_n_fft;
        let window = (0..n_fft)
            .map(|n| (0.5 - 0.5 * (2.0 * std::f64::consts::PI * n as f64 / n_fft as f64).cos()) as f32)
            .collect();
        Ok(Self {
            l_linear_w: w.get(&format!("{g}.m_source.l_linear.weight"))?.flatten_all()?.to_vec1()?,
            l_linear_b: w.get(&format!("{g}.m_source.l_linear.bias"))?.to_vec1::<f32>()?[0],
            noise_convs,
            noise_res,
            ups,
            resblocks,
            conv_post: Conv1d::load(w, &format!("{g}.conv_post"), true, 1, 3, 1)?,
            n_fft,
            hop: i.gen_istft_hop_size,
            upp: i.upsample_rates.iter().product::<usize>() * i.gen_istft_hop_size,
            window,
        })
    }

    /// The harmonic source (`tanh(linear(sines))`), `f0.len() * 300` samples.
    pub fn source(&self, f0: &[f32]) -> Vec<f32> {
        let n = f0.len();
        let upp = self.upp;
        let mut out = vec![self.l_linear_b; n * upp];
        for h in 0..HARMONICS {
            let hm = (h + 1) as f32;
            // per-frame phase (the graph's cumsum over frames, then * 2 * pi * upp)
            let mut acc = 0f32;
            let phase: Vec<f32> = f0
                .iter()
                .map(|&f| {
                    let r = f * hm / SAMPLE_RATE;
                    acc += r - r.floor();
                    acc * 2.0 * std::f32::consts::PI * upp as f32
                })
                .collect();
            let lw = self.l_linear_w[h];
            let scale = upp as f32;
            for (j, o) in out.iter_mut().enumerate() {
                if f0[j / upp] <= 10.0 {
                    continue;
                }
                // linear, half-pixel, clamped at the ends
                let x = ((j as f32 + 0.5) / scale - 0.5).max(0.0).min((n - 1) as f32);
                let x0 = x.floor();
                let i0 = x0 as usize;
                let i1 = (i0 + 1).min(n - 1);
                let w1 = x - x0;
                let p = (1.0 - w1) * phase[i0] + w1 * phase[i1];
                *o += p.sin() * 0.1 * lw;
            }
        }
        for o in &mut out {
            *o = o.tanh();
        }
        out
    }

    /// STFT of the source, time-major: (`[frames, n_fft + 2]` (magnitudes then phases), frames).
    fn stft(&self, x: &[f32]) -> (Vec<f32>, usize) {
        let (nfft, hop) = (self.n_fft, self.hop);
        let pad = nfft / 2;
        let len = x.len();
        let padded: Vec<f32> = (0..len + 2 * pad)
            .map(|i| {
                // reflect
                let j = i as isize - pad as isize;
                let j = if j < 0 {
                    -j
                } else if j >= len as isize {
                    2 * (len as isize - 1) - j
                } else {
                    j
                };
                x[j.clamp(0, len as isize - 1) as usize]
            })
            .collect();
        let frames = (padded.len() - nfft) / hop + 1;
        let bins = nfft / 2 + 1;
        let (cos, sin) = dft_tables(nfft);
        let mut out = vec![0f32; 2 * bins * frames];
        let mut buf = vec![0f32; nfft];
        for f in 0..frames {
            for (n, b) in buf.iter_mut().enumerate() {
                *b = padded[f * hop + n] * self.window[n];
            }
            for k in 0..bins {
                let (mut re, mut im) = (0f32, 0f32);
                for n in 0..nfft {
                    re += buf[n] * cos[k * nfft + n];
                    im -= buf[n] * sin[k * nfft + n];
                }
                if k == 0 || 2 * k == nfft {
                    // exactly real: torch.stft gives +0 imaginary parts here (angle pi for a
                    // negative real part); onnxruntime's FFT leaves +-1e-6 noise that flips
                    // the angle between +pi and -pi at random
                    im = 0.0;
                }
                out[f * 2 * bins + k] = (re * re + im * im).sqrt();
                let ph = if im == 0.0 {
                    if re < 0.0 {
                        std::f32::consts::PI
                    } else {
                        0.0
                    }
                } else {
                    let a = (im / re).atan();
                    if re < 0.0 {
                        if im > 0.0 {
                            a + std::f32::consts::PI
                        } else {
                            a - std::f32::consts::PI
                        }
                    } else {
                        a
                    }
                };
                out[f * 2 * bins + bins + k] = ph;
            }
        }
        (out, frames)
    }

    /// The head's output, time-major `[frames, n_fft + 2]`, to samples.
    fn istft(&self, x: &[f32], frames: usize) -> Result<Vec<f32>> {
        let (nfft, hop) = (self.n_fft, self.hop);
        let bins = nfft / 2 + 1;
        if frames == 0 || x.len() != frames * 2 * bins {
            return Err(candle_core::Error::Msg(format!("istft: {} values for {frames} frames of {} bins", x.len(), 2 * bins)).into());
        }
        let (cos, sin) = dft_tables(nfft);
        // inverse basis: real row k: c_k cos(2 pi k n / N) / (N * N/hop) * w[n], imag row: -c_k sin(..)
        let scale = (nfft * (nfft / hop)) as f32;
        let mut basis_re = vec![0f32; bins * nfft];
        let mut basis_im = vec![0f32; bins * nfft];
        for k in 0..bins {
            let c = if k == 0 || 2 * k == nfft { 1.0 } else { 2.0 };
            for n in 0..nfft {
                basis_re[k * nfft + n] = c * cos[k * nfft + n] / scale * self.window[n];
                basis_im[k * nfft + n] = -c * sin[k * nfft + n] / scale * self.window[n];
            }
        }
        let total = hop * (frames - 1) + nfft;
        let mut y = vec![0f32; total];
        for f in 0..frames {
            let o = &mut y[f * hop..f * hop + nfft];
            for k in 0..bins {
                let m = x[f * 2 * bins + k].exp();
                let p = x[f * 2 * bins + bins + k].sin();
                let (re, im) = (m * p.cos(), m * p.sin());
                let (br, bi) = (&basis_re[k * nfft..(k + 1) * nfft], &basis_im[k * nfft..(k + 1) * nfft]);
                for n in 0..nfft {
                    o[n] += re * br[n] + im * bi[n];
                }
            }
        }
        // the export's window_sum: the squared window, over the first n_fft samples only
        for (n, v) in y.iter_mut().take(nfft).enumerate() {
            let ws = self.window[n] * self.window[n];
            if ws > f32::MIN_POSITIVE {
                *v /= ws;
            }
        }
        let gain = (nfft / hop) as f32;
        let half = nfft / 2;
        Ok(y[half..total - half].iter().map(|v| v * gain).collect())
    }

    /// `x` time-major `[2 frames, c]`, `s` `[1, style]`, `f0` (`2 frames`) -> samples.
    pub fn forward(&self, x: &[f32], t: usize, s: &Tensor, f0: &[f32]) -> Result<Vec<f32>> {
        let har_src = self.source(f0);
        let (har, hf) = self.stft(&har_src);
        memory_probe("generator: source STFT");
        let (mut x, mut t) = (x.to_vec(), t);
        let nk = self.resblocks.len() / self.ups.len();
        for u in 0..self.ups.len() {
            fast::leaky_relu_in_place(&mut x, 0.1);
            let (nc, tn) = self.noise_convs[u].forward_tc(&har, hf)?;
            let xs = self.noise_res[u].styled(s)?.forward_tc(nc, tn)?;
            memory_probe(&format!("generator {u}: noise branch"));
            // the previous stage's output is not read again: freed before the resblocks
            let (mut y, mut ty) = self.ups[u].forward_tc(&std::mem::take(&mut x), t)?;
            if u + 1 == self.ups.len() {
                // ReflectionPad1d((1, 0)): frame 1 in front
                let c = y.len() / ty;
                let mut p = Vec::with_capacity(y.len() + c);
                p.extend_from_slice(&y[c..2 * c]);
                p.extend_from_slice(&y);
                (y, ty) = (p, ty + 1);
            }
            if y.len() != xs.len() || ty != tn {
                return Err(candle_core::Error::Msg(format!("generator: upsampled {ty} frames, noise branch {tn}")).into());
            }
            for (a, b) in y.iter_mut().zip(&xs) {
                *a += b;
            }
            drop(xs);
            memory_probe(&format!("generator {u}: upsampled"));
            // the first block's output becomes the sum (no zeroed buffer beside it), the last
            // block takes `y` itself instead of a copy
            let mut acc = Vec::new();
            for (i, r) in self.resblocks[u * nk..(u + 1) * nk].iter().enumerate() {
                let input = if i + 1 == nk { std::mem::take(&mut y) } else { y.clone() };
                let z = r.styled(s)?.forward_tc(input, ty)?;
                memory_probe(&format!("generator {u}: resblock {i}"));
                if i == 0 {
                    acc = z;
                } else {
                    for (a, b) in acc.iter_mut().zip(&z) {
                        *a += b;
                    }
                }
            }
            let inv = 1.0 / nk as f32;
            for a in &mut acc {
                *a *= inv;
            }
            (x, t) = (acc, ty);
        }
        fast::leaky_relu_in_place(&mut x, 0.01);
        let (post, tp) = self.conv_post.forward_tc(&x, t)?;
        memory_probe("generator: conv_post");
        self.istft(&post, tp)
    }
}

fn dft_tables(nfft: usize) -> (Vec<f32>, Vec<f32>) {
    let bins = nfft / 2 + 1;
    let mut cos = vec![0f32; bins * nfft];
    let mut sin = vec![0f32; bins * nfft];
    for k in 0..bins {
        for n in 0..nfft {
            let a = 2.0 * std::f64::consts::PI * ((k * n) % nfft) as f64 / nfft as f64;
            cos[k * nfft + n] = a.cos() as f32;
            sin[k * nfft + n] = a.sin() as f32;
        }
    }
    (cos, sin)
}

pub struct Decoder {
    encode: AdainResBlk1d,
    decode: Vec<AdainResBlk1d>,
    f0_conv: Conv1d,
    n_conv: Conv1d,
    asr_res: Conv1d,
    pub generator: Generator,
}

impl Decoder {
    /// Releases each module's dense weights from `w` once packed.
    pub fn load(w: &mut KokoroWeights, cfg: &KokoroConfig) -> Result<Self> {
        let encode = AdainResBlk1d::load(w, "decoder.encode", true, false)?;
        w.release("decoder.encode");
        let mut decode = Vec::new();
        for k in 0..4 {
            let m = format!("decoder.decode.{k}");
            decode.push(AdainResBlk1d::load(w, &m, true, k == 3)?);
            w.release(&m);
        }
        Ok(Self {
            encode,
            decode,
            f0_conv: Conv1d::load(w, "decoder.F0_conv", true, 2, 1, 1)?,
            n_conv: Conv1d::load(w, "decoder.N_conv", true, 2, 1, 1)?,
            asr_res: Conv1d::load(w, "decoder.asr_res.0", true, 1, 0, 1)?,
            generator: Generator::load(w, cfg)?,
        })
    }

    /// `asr` time-major `[frames, hidden]`, `f0`/`n` `2 frames` values, `s` `[1, style]` ->
    /// samples.
    pub fn forward(&self, asr: &[f32], frames: usize, f0: &[f32], n: &[f32], s: &Tensor) -> Result<Vec<f32>> {
        let (f0c, tf) = self.f0_conv.forward_tc(f0, f0.len())?;
        let (nc, tn) = self.n_conv.forward_tc(n, n.len())?;
        if frames == 0 || tf != frames || tn != frames || !asr.len().is_multiple_of(frames) {
            return Err(candle_core::Error::Msg(format!("decoder: {frames} frames, F0 gives {tf}, N {tn}")).into());
        }
        let hidden = asr.len() / frames;
        let (asr_res, _) = self.asr_res.forward_tc(asr, frames)?;
        let ca = asr_res.len() / frames;
        let x = concat_rows(&[(asr, hidden), (&f0c, 1), (&nc, 1)], frames);
        let (mut x, mut t) = self.encode.styled(s)?.forward_tc(&x, frames)?;
        memory_probe("decoder: encode");
        let mut res = true;
        for b in &self.decode {
            if res {
                x = concat_rows(&[(&x, x.len() / t), (&asr_res, ca), (&f0c, 1), (&nc, 1)], t);
            }
            (x, t) = b.styled(s)?.forward_tc(&x, t)?;
            if b.upsamples() {
                res = false;
            }
        }
        memory_probe("decoder: decode blocks");
        self.generator.forward(&x, t, s, f0)
    }
}

/// Time-major buffers side by side: row `r` of the result is row `r` of each part in turn
/// (`(values, channels)` per part, `t` rows each).
fn concat_rows(parts: &[(&[f32], usize)], t: usize) -> Vec<f32> {
    let c: usize = parts.iter().map(|p| p.1).sum();
    let mut out = Vec::with_capacity(t * c);
    for r in 0..t {
        for &(v, pc) in parts {
            out.extend_from_slice(&v[r * pc..(r + 1) * pc]);
        }
    }
    out
}
