//! The layers Kokoro is built from, on `[channels, time]` tensors (batch 1, no batch axis):
//! linear, convolutions, layer/instance norms, AdaIN, the bidirectional LSTM.

use crate::{KokoroWeights, Result};
use candle_core::Tensor;
use super::fast;
use sapient_tensor::encoder;
use sapient_tensor::kernels::{pool::pool, ConvBf16, ConvShape, DenseMatrix};

/// A weight `[n, k]` packed for [`DenseMatrix`] products: in f16 where AMX-BF16 runs them
/// (half the memory of the two-half bf16 packing; f16 keeps 11 significant bits, finer than
/// the int8 export's quantization step); without AMX-BF16, on AVX-512 with VNNI, as 13-bit
/// integers multiplied by 14-bit activations ([`DenseMatrix::from_f32_int16`]: `vpdpwssd`
/// issues at the f32 FMA's rate, and 16-bit pairs give twice its multiply-adds, where
/// `vdpbf16ps` issues at a quarter of it on some Xeons; finer than bf16 too); in bf16 with
/// one bf16 product where only AVX512-BF16 runs them; as f32 elsewhere or where a value is
/// out of f16's range.
pub fn packed(w: &[f32], n: usize, k: usize) -> DenseMatrix {
    use sapient_tensor::kernels::{has_amx_bf16, has_avx512_bf16};
    let w = &w[..(n * k).min(w.len())];
    if has_amx_bf16() && w.iter().all(|v| v.abs() <= 65_504.0) {
        let bits: Vec<u16> = w.iter().map(|&v| half::f16::from_f32(v).to_bits()).collect();
        return DenseMatrix::from_f16_bits(&bits, n, k);
    }
    if !has_amx_bf16() {
        if let Some(d) = DenseMatrix::from_f32_int16(w, n, k) {
            return d;
        }
    }
    if has_avx512_bf16() {
        if let Some(d) = DenseMatrix::from_f32_bf16(w, n, k) {
            return d;
        }
    }
    DenseMatrix::from_f32(w, n, k)
}

/// Whether convolutions run as im2col rows on [`packed`] integer products rather than as
/// [`ConvBf16`]: without AMX-BF16, on AVX-512 with VNNI (see [`packed`]).
fn int16_convolutions() -> bool {
    !sapient_tensor::kernels::has_amx_bf16() && sapient_tensor::kernels::has_avx512()
}

/// `nn.Linear` on a [`DenseMatrix`] (`[out, in]`, prepacked at load).
pub struct Linear {
    w: DenseMatrix,
    b: Option<Vec<f32>>,
}

impl Linear {
    pub fn load(w: &KokoroWeights, name: &str, bias: bool) -> Result<Self> {
        let wt = w.get(&format!("{name}.weight"))?;
        let (n, k) = wt.dims2()?;
        let v: Vec<f32> = wt.flatten_all()?.to_vec1()?;
        let b = if bias { Some(w.get(&format!("{name}.bias"))?.flatten_all()?.to_vec1()?) } else { None };
        Ok(Self {
            w: packed(&v, n, k),
            b,
        })
    }

    /// From f32 weights `[n, k]` and an optional bias.
    pub fn from_parts(w: &[f32], n: usize, k: usize, b: Option<Vec<f32>>) -> Self {
        Self {
            w: packed(w, n, k),
            b,
        }
    }

    pub fn out_features(&self) -> usize {
        self.w.rows()
    }

    /// `x`: `[n, in]` -> `[n, out]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (m, k) = x.dims2()?;
        let xs = x.flatten_all()?.to_vec1::<f32>()?;
        let y = self.forward_vec(&xs, m, k)?;
        Ok(Tensor::from_vec(y, (m, self.out_features()), x.device())?)
    }

    /// Row-major `[m, in]` -> `[m, out]`.
    pub fn forward_vec(&self, x: &[f32], m: usize, k: usize) -> Result<Vec<f32>> {
        if k != self.w.cols() || x.len() != m * k {
            return Err(candle_core::Error::Msg(format!("linear: input {m} x {k}, weight takes {}", self.w.cols())).into());
        }
        let mut y = vec![0f32; m * self.out_features()];
        self.w.matmul(x, m, self.b.as_deref(), &mut y);
        Ok(y)
    }
}

/// `nn.Conv1d` (weight norm already folded). Convolutions on the CPU run as [`ConvBf16`]
/// (bf16 implicit GEMMs over bf16 frames) where AMX-BF16 runs them, or AVX512-BF16 without
/// AVX512-VNNI; elsewhere on a [`packed`] [`DenseMatrix`] (integer or f32 GEMMs) over
/// time-major im2col rows: the input as `[t, in]`, each
/// output frame's row the `k` input frames it reads (`[k, in]`, the weight reordered to
/// `[out, k, in]` at load), by blocks of rows so the columns stay in cache; on other devices
/// through candle.
pub struct Conv1d {
    /// (out, in, k)
    dims: (usize, usize, usize),
    stride: usize,
    pad: usize,
    dilation: usize,
    imp: ConvImpl,
}

enum ConvImpl {
    /// `[out, k * in]` (tap-major rows) and the bias (zeros when the layer has none).
    Dense(DenseMatrix, Vec<f32>),
    /// bf16 weights for AMX-BF16 or AVX512-BF16 products over bf16 input frames, and the bias.
    Bf16(ConvBf16, Vec<f32>),
    /// Another device: candle's conv1d.
    Candle(Tensor, Option<Tensor>),
}

impl Conv1d {
    pub fn load(w: &KokoroWeights, name: &str, bias: bool, stride: usize, pad: usize, dilation: usize) -> Result<Self> {
        let weight = w.get(&format!("{name}.weight"))?.contiguous()?;
        let b = if bias {
            Some(w.get(&format!("{name}.bias"))?.unsqueeze(1)?)
        } else {
            None
        };
        let (cout, cin, k) = weight.dims3()?;
        let imp = if weight.device().is_cpu() {
            let v: Vec<f32> = weight.flatten_all()?.to_vec1()?;
            let bias = match &b {
                Some(b) => b.flatten_all()?.to_vec1()?,
                None => vec![0.0; cout],
            };
            if let Some(c) = (!int16_convolutions()).then(|| ConvBf16::new(&v, cout, cin, k)).flatten() {
                return Ok(Self {
                    dims: (cout, cin, k),
                    stride,
                    pad,
                    dilation,
                    imp: ConvImpl::Bf16(c, bias),
                });
            }
            let mut r = vec![0f32; v.len()];
            for o in 0..cout {
                for i in 0..cin {
                    for kk in 0..k {
                        r[(o * k + kk) * cin + i] = v[(o * cin + i) * k + kk];
                    }
                }
            }
            ConvImpl::Dense(packed(&r, cout, k * cin), bias)
        } else {
            ConvImpl::Candle(weight, b)
        };
        Ok(Self {
            dims: (cout, cin, k),
            stride,
            pad,
            dilation,
            imp,
        })
    }

    /// Output channels.
    pub fn out_channels(&self) -> usize {
        self.dims.0
    }

    /// `x`: `[in, t]` -> `[out, t']`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match &self.imp {
            ConvImpl::Dense(..) | ConvImpl::Bf16(..) => {
                let (c, t) = x.dims2()?;
                let xs = x.flatten_all()?.to_vec1::<f32>()?;
                let (y, cout, tout) = self.forward_vec(xs, c, t)?;
                Ok(Tensor::from_vec(y, (cout, tout), x.device())?)
            }
            ConvImpl::Candle(w, b) => {
                let y = x.unsqueeze(0)?.conv1d(w, self.pad, self.stride, self.dilation, 1)?.squeeze(0)?;
                Ok(match b {
                    Some(b) => y.broadcast_add(b)?,
                    None => y,
                })
            }
        }
    }

    /// A plain `[c, t]` buffer: (`[out, t']`, out, t').
    pub fn forward_vec(&self, xs: Vec<f32>, c: usize, t: usize) -> Result<(Vec<f32>, usize, usize)> {
        if let ConvImpl::Candle(w, _) = &self.imp {
            let y = self.forward(&Tensor::from_vec(xs, (c, t), w.device())?)?;
            let (co, to) = y.dims2()?;
            return Ok((y.flatten_all()?.to_vec1()?, co, to));
        }
        let xt = fast::transpose(&xs, c, t);
        drop(xs);
        let (y, tout) = self.forward_tc(&xt, t)?;
        let cout = self.out_channels();
        Ok((fast::transpose(&y, tout, cout), cout, tout))
    }

    /// Output frames for `t` input frames.
    pub fn out_frames(&self, t: usize) -> Result<usize> {
        let k = self.dims.2;
        let tp = t + 2 * self.pad;
        let span = self.dilation * (k - 1);
        if tp <= span {
            return Err(candle_core::Error::Msg(format!("conv1d: input of {t} frames is shorter than the kernel")).into());
        }
        Ok((tp - span - 1) / self.stride + 1)
    }

    /// Where the layer takes bf16 input frames ([`forward_bf16`](Self::forward_bf16)):
    /// (values per frame, zero frames before the data, frames in all) for `t` input frames.
    pub fn bf16_layout(&self, t: usize) -> Result<Option<(usize, usize, usize)>> {
        let ConvImpl::Bf16(c, _) = &self.imp else {
            return Ok(None);
        };
        let tout = self.out_frames(t)?;
        let frames = c.frames_needed(tout, self.stride, self.dilation).max(self.pad + t);
        Ok(Some((c.ld(), self.pad, frames)))
    }

    /// The bf16 layer on input frames laid out as [`bf16_layout`](Self::bf16_layout) says
    /// (`t` input frames): `out` `[t', out]` is overwritten, or added to with `accumulate`.
    pub fn forward_bf16(&self, xb: &[u16], t: usize, accumulate: bool, out: &mut [f32]) -> Result<usize> {
        let ConvImpl::Bf16(c, bias) = &self.imp else {
            return Err(candle_core::Error::Msg("conv1d: not a bf16 layer".into()).into());
        };
        let tout = self.out_frames(t)?;
        let need = c.frames_needed(tout, self.stride, self.dilation) * c.ld();
        if xb.len() < need || out.len() < tout * self.dims.0 {
            return Err(candle_core::Error::Msg(format!("conv1d: bf16 input of {} values (needs {need}) or output of {}", xb.len(), out.len())).into());
        }
        c.forward(xb, tout, self.stride, self.dilation, Some(bias), accumulate, out);
        Ok(tout)
    }

    /// `out = conv(leaky(norm(x)))` (`accumulate`: `out += ..`) for a time-major `[t, in]`
    /// buffer, the norm writing bf16 frames (into `xb`) where the layer takes them. Returns t'.
    #[allow(clippy::too_many_arguments)]
    pub fn norm_leaky_conv(&self, n: &AdaInStyle, x: &[f32], t: usize, slope: f32, xb: &mut Vec<u16>, out: &mut Vec<f32>, accumulate: bool) -> Result<usize> {
        let cout = self.out_channels();
        if let Some(layout) = self.bf16_layout(t)? {
            if x.len() != t * self.dims.1 || n.scale_v.len() != self.dims.1 {
                return Err(candle_core::Error::Msg(format!("conv1d: {} values for {t} frames of {} channels", x.len(), self.dims.1)).into());
            }
            fast::norm_leaky_tc_bf16(x, t, &n.scale_v, &n.beta_v, slope, xb, layout);
            let tout = self.out_frames(t)?;
            if !accumulate {
                out.clear();
                out.resize(tout * cout, 0.0);
            } else if out.len() != tout * cout {
                return Err(candle_core::Error::Msg(format!("conv1d: adding {tout} x {cout} to {} values", out.len())).into());
            }
            self.forward_bf16(xb, t, accumulate, out)?;
            return Ok(tout);
        }
        let a = n.forward_leaky_tc(x, t, slope);
        let (y, tout) = self.forward_tc(&a, t)?;
        if accumulate {
            if out.len() != y.len() {
                return Err(candle_core::Error::Msg(format!("conv1d: adding {tout} x {cout} to {} values", out.len())).into());
            }
            for (o, v) in out.iter_mut().zip(&y) {
                *o += v;
            }
        } else {
            *out = y;
        }
        Ok(tout)
    }

    /// CPU convolution on a time-major `[t, in]` buffer: (`[t', out]`, t').
    pub fn forward_tc(&self, x: &[f32], t: usize) -> Result<(Vec<f32>, usize)> {
        let (cout, cin, k) = self.dims;
        if let Some((ld, front, frames)) = self.bf16_layout(t)? {
            if x.len() != t * cin {
                return Err(candle_core::Error::Msg(format!("conv1d: {} values for {t} frames of {cin} channels", x.len())).into());
            }
            let mut xb = Vec::new();
            fast::to_bf16_frames(x, t, cin, &mut xb, ld, front, frames);
            let tout = self.out_frames(t)?;
            let mut y = vec![0f32; tout * cout];
            self.forward_bf16(&xb, t, false, &mut y)?;
            return Ok((y, tout));
        }
        let ConvImpl::Dense(dense, bias) = &self.imp else {
            let xs = fast::transpose(x, t, cin);
            let (y, _, tout) = self.forward_vec(xs, cin, t)?;
            return Ok((fast::transpose(&y, cout, tout), tout));
        };
        if x.len() != t * cin {
            return Err(candle_core::Error::Msg(format!("conv1d: {} values for {t} frames of {cin} channels", x.len())).into());
        }
        let tp = t + 2 * self.pad;
        let span = self.dilation * (k - 1);
        if tp <= span {
            return Err(candle_core::Error::Msg(format!("conv1d: input of {t} frames is shorter than the kernel")).into());
        }
        let st = self.stride;
        let tout = (tp - span - 1) / st + 1;
        let mut y = vec![0f32; cout * tout];
        // 16-bit integer weights: each input frame quantized once, not once per tap
        let shape = ConvShape { t, cin, taps: k, stride: st, dilation: self.dilation, pad: self.pad };
        if dense.conv(x, shape, Some(bias), &mut y) {
            return Ok((y, tout));
        }
        let row = cin * k;
        // rows per block: the block's columns within ~1 MB
        let rows = ((1 << 18) / row).clamp(32, 512) / 32 * 32;
        let mut col = vec![0f32; rows.min(tout) * row];
        let (d, pad) = (self.dilation, self.pad);
        for r0 in (0..tout).step_by(rows) {
            let n = rows.min(tout - r0);
            let fill = |ci: usize, chunk: &mut [f32]| {
                for (j, dst) in chunk.chunks_exact_mut(row).enumerate() {
                    let r = r0 + ci * 32 + j;
                    // input frame of tap kk: r * stride + kk * d - pad
                    if d == 1 && r * st >= pad && r * st + k - pad <= t {
                        let s = r * st - pad;
                        dst.copy_from_slice(&x[s * cin..(s + k) * cin]);
                        continue;
                    }
                    for (kk, seg) in dst.chunks_exact_mut(cin).enumerate() {
                        let s = (r * st + kk * d) as isize - pad as isize;
                        if s < 0 || s >= t as isize {
                            seg.fill(0.0);
                        } else {
                            let s = s as usize;
                            seg.copy_from_slice(&x[s * cin..(s + 1) * cin]);
                        }
                    }
                }
            };
            pool().for_each_chunk_mut(&mut col[..n * row], 32 * row, fill);
            dense.matmul(&col[..n * row], n, Some(bias), &mut y[r0 * cout..(r0 + n) * cout]);
        }
        Ok((y, tout))
    }
}

/// `nn.ConvTranspose1d` with one group, on time-major buffers: each input frame times the
/// weight as `[k * out, in]` (one [`DenseMatrix`] product per block of frames), then the
/// `k` output frames it reaches summed in place (overlap-add with the stride).
pub struct ConvTranspose1d {
    w: DenseMatrix,
    b: Vec<f32>,
    cin: usize,
    cout: usize,
    k: usize,
    stride: usize,
    pad: usize,
}

impl ConvTranspose1d {
    pub fn load(w: &KokoroWeights, name: &str, stride: usize, pad: usize) -> Result<Self> {
        let wt = w.get(&format!("{name}.weight"))?;
        let (cin, cout, k) = wt.dims3()?;
        let v: Vec<f32> = wt.flatten_all()?.to_vec1()?;
        // [in, out, k] -> [k, out, in]
        let mut r = vec![0f32; v.len()];
        for i in 0..cin {
            for o in 0..cout {
                for kk in 0..k {
                    r[(kk * cout + o) * cin + i] = v[(i * cout + o) * k + kk];
                }
            }
        }
        Ok(Self {
            w: packed(&r, k * cout, cin),
            b: w.get(&format!("{name}.bias"))?.flatten_all()?.to_vec1()?,
            cin,
            cout,
            k,
            stride,
            pad,
        })
    }

    /// `x` `[t, in]` -> (`[t', out]`, t'), `t' = (t - 1) stride - 2 pad + k`.
    pub fn forward_tc(&self, x: &[f32], t: usize) -> Result<(Vec<f32>, usize)> {
        let (cin, cout, k, st, pad) = (self.cin, self.cout, self.k, self.stride, self.pad);
        if x.len() != t * cin || t == 0 {
            return Err(candle_core::Error::Msg(format!("conv_transpose1d: {} values for {t} frames of {cin} channels", x.len())).into());
        }
        let full = (t - 1) * st + k;
        if full <= 2 * pad {
            return Err(candle_core::Error::Msg(format!("conv_transpose1d: input of {t} frames is too short")).into());
        }
        let tout = full - 2 * pad;
        let mut y = vec![0f32; tout * cout];
        for row in y.chunks_exact_mut(cout) {
            row.copy_from_slice(&self.b);
        }
        let n = k * cout;
        let rows = ((1 << 19) / (n * 4)).clamp(32, 256) / 32 * 32;
        let mut z = vec![0f32; rows.min(t) * n];
        for r0 in (0..t).step_by(rows) {
            let m = rows.min(t - r0);
            self.w.matmul(&x[r0 * cin..(r0 + m) * cin], m, None, &mut z[..m * n]);
            for (j, zr) in z[..m * n].chunks_exact(n).enumerate() {
                let base = (r0 + j) * st;
                for (kk, zk) in zr.chunks_exact(cout).enumerate() {
                    let f = base + kk;
                    if f < pad || f - pad >= tout {
                        continue;
                    }
                    let yr = &mut y[(f - pad) * cout..(f - pad + 1) * cout];
                    for (a, b) in yr.iter_mut().zip(zk) {
                        *a += b;
                    }
                }
            }
        }
        Ok((y, tout))
    }
}

/// The depthwise `ConvTranspose1d(c, c, 3, stride 2, padding 1, output_padding 1, groups c)`
/// of an upsampling `AdainResBlk1d` (`pool`): `[c, t]` -> `[c, 2t]`.
pub struct DepthwiseUp2 {
    w: Vec<f32>,
    b: Vec<f32>,
}

impl DepthwiseUp2 {
    pub fn load(w: &KokoroWeights, name: &str) -> Result<Self> {
        Ok(Self {
            w: w.get(&format!("{name}.weight"))?.flatten_all()?.to_vec1()?,
            b: w.get(&format!("{name}.bias"))?.to_vec1()?,
        })
    }

    /// Time-major: `x` `[t, c]` -> `[2t, c]`.
    pub fn forward_tc(&self, x: &[f32], t: usize) -> Vec<f32> {
        let c = self.b.len();
        let mut out = vec![0f32; 2 * t * c];
        for row in out.chunks_exact_mut(c) {
            row.copy_from_slice(&self.b);
        }
        let (w0, w1, w2): (Vec<f32>, Vec<f32>, Vec<f32>) =
            ((0..c).map(|ch| self.w[3 * ch]).collect(), (0..c).map(|ch| self.w[3 * ch + 1]).collect(), (0..c).map(|ch| self.w[3 * ch + 2]).collect());
        // out[2i + k - 1] += x[i] * w[k]
        for (i, xr) in x.chunks_exact(c).enumerate().take(t) {
            if i > 0 {
                let o = &mut out[(2 * i - 1) * c..2 * i * c];
                for ((o, &v), &w) in o.iter_mut().zip(xr).zip(&w0) {
                    *o += v * w;
                }
            }
            let (o1, o2) = out[2 * i * c..(2 * i + 2) * c].split_at_mut(c);
            for (((a, b), &v), (&wa, &wb)) in o1.iter_mut().zip(o2.iter_mut()).zip(xr).zip(w1.iter().zip(&w2)) {
                *a += v * wa;
                *b += v * wb;
            }
        }
        out
    }

}

/// `nn.LayerNorm` over the last axis: the encoders' [`encoder::LayerNorm`], loaded from
/// Kokoro's weights.
pub struct LayerNorm(encoder::LayerNorm);

impl LayerNorm {
    pub fn load(w: &KokoroWeights, weight: &str, bias: &str, eps: f32) -> Result<Self> {
        Ok(Self(encoder::LayerNorm::new(w.get(weight)?.flatten_all()?.to_vec1()?, w.get(bias)?.flatten_all()?.to_vec1()?, eps)?))
    }

    /// Each row of a time-major buffer, in place.
    pub fn rows(&self, x: &mut [f32]) {
        self.0.rows(x);
    }
}

/// `AdaIN1d`: `(1 + gamma) * InstanceNorm1d(x) + beta`, gamma and beta from `fc(style)`.
/// The (gamma, beta) of a given style are computed once per utterance by [`AdaIn::prepare`].
pub struct AdaIn {
    fc: Linear,
}

/// `(1 + gamma)` and `beta`.
pub struct AdaInStyle {
    scale_v: Vec<f32>,
    beta_v: Vec<f32>,
}

impl AdaIn {
    pub fn load(w: &KokoroWeights, name: &str) -> Result<Self> {
        Ok(Self {
            fc: Linear::load(w, &format!("{name}.fc"), true)?,
        })
    }

    /// `s`: `[1, style_dim]`.
    pub fn prepare(&self, s: &Tensor) -> Result<AdaInStyle> {
        let h = self.fc.forward(s)?.squeeze(0)?;
        let c = h.dims1()? / 2;
        let scale = (h.narrow(0, 0, c)? + 1.0)?;
        let beta = h.narrow(0, c, c)?;
        Ok(AdaInStyle {
            scale_v: scale.to_vec1()?,
            beta_v: beta.to_vec1()?,
        })
    }
}

impl AdaInStyle {
    /// Instance norm + style affine + Snake (`y + 1/alpha sin(alpha y)^2`) fused, on a
    /// time-major `[t, c]` buffer.
    pub fn forward_snake_tc(&self, x: &[f32], t: usize, alpha: &[f32], inv_alpha: &[f32]) -> Vec<f32> {
        fast::norm_snake_tc(x, t, &self.scale_v, &self.beta_v, alpha, inv_alpha)
    }

    /// [`forward_snake_tc`](Self::forward_snake_tc) written as bf16 frames for a
    /// convolution (`layout`: [`Conv1d::bf16_layout`]).
    pub fn forward_snake_bf16(&self, x: &[f32], t: usize, alpha: &[f32], inv_alpha: &[f32], dst: &mut Vec<u16>, layout: (usize, usize, usize)) {
        fast::norm_snake_tc_bf16(x, t, &self.scale_v, &self.beta_v, alpha, inv_alpha, dst, layout)
    }

    /// Instance norm + style affine + LeakyReLU on a time-major `[t, c]` buffer.
    pub fn forward_leaky_tc(&self, x: &[f32], t: usize, slope: f32) -> Vec<f32> {
        fast::norm_leaky_tc(x, t, &self.scale_v, &self.beta_v, slope)
    }

    /// The AdaLayerNorm form on a time-major `[t, c]` buffer, in place.
    pub fn layer_rows(&self, x: &mut [f32]) {
        for row in x.chunks_exact_mut(self.scale_v.len()) {
            encoder::layer_norm(row, &self.scale_v, &self.beta_v, 1e-5);
        }
    }

}

/// `nn.LSTM(input, hidden, bidirectional=True, batch_first=True)`, gate order (i, f, g, o):
/// the input weights of both directions applied to the whole sequence by one product
/// (`[8 hidden, in]`, a [`DenseMatrix`]), the recurrent product per step on plain buffers
/// (`w_hh^T` laid out `[hidden, 4 hidden]` so a step is `hidden` axpys of length
/// `4 hidden`).
pub struct BiLstm {
    w_ih: DenseMatrix,
    /// `b_ih + b_hh` of both directions (`[8 hidden]`).
    bias: Vec<f32>,
    w_hh_t: [Vec<f32>; 2],
    hidden: usize,
}

impl BiLstm {
    pub fn load(w: &KokoroWeights, name: &str) -> Result<Self> {
        let mut w_ih = Vec::new();
        let mut bias = Vec::new();
        let mut w_hh_t = [Vec::new(), Vec::new()];
        let mut dims = (0, 0);
        for (d, sfx) in ["", "_reverse"].iter().enumerate() {
            let wi = w.get(&format!("{name}.weight_ih_l0{sfx}"))?;
            dims = wi.dims2()?;
            w_ih.extend(wi.flatten_all()?.to_vec1::<f32>()?);
            let b = (w.get(&format!("{name}.bias_ih_l0{sfx}"))? + w.get(&format!("{name}.bias_hh_l0{sfx}"))?)?;
            bias.extend(b.to_vec1::<f32>()?);
            w_hh_t[d] = w.get(&format!("{name}.weight_hh_l0{sfx}"))?.t()?.contiguous()?.flatten_all()?.to_vec1()?;
        }
        let (g4, input) = dims;
        Ok(Self {
            w_ih: packed(&w_ih, 2 * g4, input),
            bias,
            w_hh_t,
            hidden: g4 / 4,
        })
    }

    /// Time-major `[t, in]` -> `[t, 2 hidden]` (forward then backward halves); the two
    /// directions run on two threads.
    pub fn forward_vec(&self, xs: &[f32], t: usize) -> Result<Vec<f32>> {
        let h = self.hidden;
        if xs.len() != t * self.w_ih.cols() {
            return Err(candle_core::Error::Msg(format!("lstm: {} values for {t} frames of {}", xs.len(), self.w_ih.cols())).into());
        }
        let mut xw = vec![0f32; t * 8 * h];
        self.w_ih.matmul(xs, t, Some(&self.bias), &mut xw);
        let mut dirs = [Vec::new(), Vec::new()];
        pool().for_each_chunk_mut(&mut dirs, 1, |d, out| {
            out[0] = recur(&xw, d * 4 * h, &self.w_hh_t[d], t, h, d == 1);
        });
        let [fw, bw] = dirs;
        let mut out = vec![0f32; t * 2 * h];
        for (i, row) in out.chunks_exact_mut(2 * h).enumerate() {
            row[..h].copy_from_slice(&fw[i * h..(i + 1) * h]);
            row[h..].copy_from_slice(&bw[i * h..(i + 1) * h]);
        }
        Ok(out)
    }
}

/// One LSTM direction over precomputed input products (`xw` `[t, 8h]`, this direction's
/// `4h` at column `off`, biases added): `[t, h]` hidden states, in time order.
fn recur(xw: &[f32], off: usize, w_hh_t: &[f32], t: usize, h: usize, reverse: bool) -> Vec<f32> {
    let mut out = vec![0f32; t * h];
    let mut hs = vec![0f32; h];
    let mut cs = vec![0f32; h];
    let mut g = vec![0f32; 4 * h];
    for step in 0..t {
        let ti = if reverse { t - 1 - step } else { step };
        g.copy_from_slice(&xw[ti * 8 * h + off..ti * 8 * h + off + 4 * h]);
        for (j, &hj) in hs.iter().enumerate() {
            if hj != 0.0 {
                let row = &w_hh_t[j * 4 * h..(j + 1) * 4 * h];
                for (gv, wv) in g.iter_mut().zip(row) {
                    *gv += hj * wv;
                }
            }
        }
        let o = &mut out[ti * h..(ti + 1) * h];
        for k in 0..h {
            let i = sigmoid(g[k]);
            let f = sigmoid(g[h + k]);
            let gg = g[2 * h + k].tanh();
            let og = sigmoid(g[3 * h + k]);
            cs[k] = f * cs[k] + i * gg;
            hs[k] = og * cs[k].tanh();
            o[k] = hs[k];
        }
    }
    out
}

#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

