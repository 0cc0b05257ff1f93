//! The Whisper encoder on plain f32 buffers and sapient-tensor's kernels (CPU).
//!
//! Both convolutions are matrix products over time-major rows: the weights `[d, c, 3]` are
//! reordered at load to `[d, 3 · c]` (tap-major), so the input row of output position `t` is
//! the three input frames around it side by side, one contiguous slice of the zero-padded
//! time-major input (conv2, stride 2: frames `2t - 1 .. 2t + 1`). Then sinusoidal positions
//! and pre-norm layers: the q, k and v projections fused into one `[3d, d]` matrix, full
//! attention ([`encoder::self_attention`], the one every encoder uses; no `[H, S, S]` score
//! tensor), the output projection, the MLP with GELU fused into fc1's product where the
//! kernel has it. Where the CPU has AMX-BF16, every matrix is a [`DenseMatrix`] (bf16 pairs,
//! close to f32 accuracy; quantized weights dequantized, since at 1500 rows these products
//! are several times faster than the Q8_0 kernels) and the attention is two such products
//! per head and block of 512 queries. Where the weights are quantized (lossy already) and
//! the CPU has AVX512-BF16 without AMX, every product is in bf16 (weights and activations
//! rounded to bf16, f32 sums, [`DenseMatrix::from_f32_bf16`]; about twice the speed of the
//! Q8_0 kernels at 1500 rows on a Zen 4). Elsewhere quantized matrices run on [`QMatrix`],
//! the others on [`DenseMatrix`]'s f32 products. The attention's kernel for 1500 positions
//! follows the CPU in the same way (AMX-BF16 products, else the fused AVX-512 f32 kernel,
//! else blocks of queries as `gemm` products). (The bf16 variant of the fused kernel, on top
//! of bf16 products, tipped tiny.en's greedy decoding of the benchmark's 59.5 s file into a
//! repetition loop, so it is not used.) Every buffer is kept between calls; a batch of
//! windows runs window by window through the same buffers (the products have 1500 rows per window already).

use crate::{Error, Result};
use candle_core::{DType, Device, Tensor};
use sapient_tensor::encoder::{self, LayerNorm};
use sapient_tensor::kernels::{self, pool, DenseMatrix, QMatrix};
use sapient_tensor::{Weight, WeightSource};
use std::sync::Mutex;

/// A weight matrix `[out, in]`: quantized, or dense.
enum Mat {
    Q(QMatrix),
    D(DenseMatrix),
}

/// A linear layer: weight and bias (zeros when the checkpoint has none).
struct Lin {
    w: Mat,
    b: Vec<f32>,
}

/// Rows handed to one pool chunk by the element-wise passes.
const ROWS_PER_CHUNK: usize = 32;

impl Lin {
    fn rows(&self) -> usize {
        match &self.w {
            Mat::Q(q) => q.rows(),
            Mat::D(d) => d.rows(),
        }
    }
    fn cols(&self) -> usize {
        match &self.w {
            Mat::Q(q) => q.cols(),
            Mat::D(d) => d.cols(),
        }
    }

    /// `out[m, rows] = x[m, cols] · wᵀ + b`, GELU'd when `gelu`.
    fn forward(&self, x: &[f32], m: usize, gelu: bool, out: &mut [f32]) {
        let (n, k) = (self.rows(), self.cols());
        let (x, out) = (&x[..m * k], &mut out[..m * n]);
        match &self.w {
            Mat::D(w) if gelu => w.matmul_gelu(x, m, Some(&self.b), out),
            Mat::D(w) => w.matmul(x, m, Some(&self.b), out),
            Mat::Q(w) => {
                w.matmul(x, m, out);
                let b = &self.b;
                pool::pool().for_each_chunk_mut(out, ROWS_PER_CHUNK * n, |_, c| {
                    for r in c.chunks_exact_mut(n) {
                        for (o, b) in r.iter_mut().zip(b) {
                            *o += b;
                        }
                    }
                    if gelu {
                        kernels::gelu_erf_in_place(c);
                    }
                });
            }
        }
    }
}

struct Layer {
    attn_ln: LayerNorm,
    /// q, k and v stacked: `[3d, d]`.
    qkv: Lin,
    out: Lin,
    mlp_ln: LayerNorm,
    fc1: Lin,
    fc2: Lin,
}

/// Buffers of one window, kept between calls.
#[derive(Default)]
struct Scratch {
    /// Convolution input rows (im2col).
    col: Vec<f32>,
    /// conv1's output, time-major with a zero row before and after.
    c1: Vec<f32>,
    x: Vec<f32>,
    h: Vec<f32>,
    qkv: Vec<f32>,
    o: Vec<f32>,
    f: Vec<f32>,
    /// The attention's buffers.
    attn: encoder::AttentionScratch,
}

fn grow(v: &mut Vec<f32>, n: usize) {
    if v.len() < n {
        v.resize(n, 0.0);
    }
}

/// The encoder's weights, prepared for the kernels, and its buffers.
pub(crate) struct Encoder {
    conv1: Lin,
    conv2: Lin,
    /// Positions `[n_ctx, d]`.
    pos: Vec<f32>,
    layers: Vec<Layer>,
    ln: LayerNorm,
    d: usize,
    heads: usize,
    n_mels: usize,
    /// Encoder positions per window (1500); the window has twice as many mel frames.
    n_ctx: usize,
    scratch: Mutex<Scratch>,
}

fn f32_vec(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?)
}

/// The f32 values of a weight `[n, k]` (dequantized when quantized).
fn dense_values(w: &Weight) -> Result<Vec<f32>> {
    f32_vec(&w.dequantize(&Device::Cpu, DType::F32)?)
}

/// Weights stacked along the output axis, as one matrix. Where the CPU has AMX-BF16, dense
/// ([`DenseMatrix`] from f32 values, quantized ones dequantized: its products at 1500 rows run
/// several times faster than the Q8_0 ones, and faster than from f16 values, which it
/// converts per product). Elsewhere quantized
/// when all are in a format the kernels have (the same one), else dense (f32 products).
fn stacked(ws: &[Weight], k: usize, bf16: bool) -> Result<Mat> {
    let qs: Option<Vec<QMatrix>> = ws
        .iter()
        .map(|w| match w {
            Weight::Quantized(q) => QMatrix::from_qtensor(q),
            Weight::Dense(_) => None,
        })
        .collect();
    if let Some(qs) = qs.filter(|qs| !bf16 && !kernels::has_amx_bf16() && qs.iter().all(|q| q.qtype() == qs[0].qtype() && q.cols() == k)) {
        if qs.len() == 1 {
            return Ok(Mat::Q(qs[0].clone()));
        }
        let rows: usize = qs.iter().map(QMatrix::rows).sum();
        let mut bytes = Vec::with_capacity(rows * qs[0].row_bytes());
        for q in &qs {
            q.with_bytes(|b| bytes.extend_from_slice(b));
        }
        return Ok(Mat::Q(QMatrix::from_bytes(qs[0].qtype(), rows, k, bytes)?));
    }
    let mut v = Vec::new();
    for w in ws {
        v.extend(dense_values(w)?);
    }
    let n = v.len() / k;
    Ok(Mat::D(dense(&v, n, k, bf16)))
}

/// `[n, k]` as a [`DenseMatrix`]: bf16 products when `bf16` (and AVX512-BF16 or AMX-BF16
/// runs them), else f32 ones (or AMX-BF16's two-half ones).
fn dense(w: &[f32], n: usize, k: usize, bf16: bool) -> DenseMatrix {
    bf16.then(|| DenseMatrix::from_f32_bf16(w, n, k)).flatten().unwrap_or_else(|| DenseMatrix::from_f32(w, n, k))
}

/// A 1-D convolution's weight `[d, c, 3]` as the matrix `[d, 3 · c]` of its time-major
/// product (tap-major: column `j · c + i` is input channel `i` at tap `j`).
fn conv_matrix(w: &[f32], d: usize, c: usize, bf16: bool) -> DenseMatrix {
    let mut m = vec![0f32; d * 3 * c];
    for o in 0..d {
        for i in 0..c {
            for j in 0..3 {
                m[o * 3 * c + j * c + i] = w[(o * c + i) * 3 + j];
            }
        }
    }
    dense(&m, d, 3 * c, bf16)
}

impl Encoder {
    /// Load under transformers names (`model.encoder.*`) on the CPU.
    pub fn load(src: &dyn WeightSource, cfg: &crate::config::WhisperConfig) -> Result<Self> {
        let cpu = Device::Cpu;
        let (d, m, ff) = (cfg.d_model, cfg.num_mel_bins, cfg.encoder_ffn_dim);
        let vec = |name: &str, shape: &[usize]| -> Result<Vec<f32>> { f32_vec(&src.tensor(name, shape, &cpu, DType::F32)?) };
        // Quantized (lossy) weights and AVX512-BF16: every product in bf16 (weights and
        // activations rounded to bf16, f32 sums), twice the f32 rate, faster than the Q8_0
        // kernels at these row counts, and about as close to f32 as Q8_0.
        let bf16 = kernels::has_avx512_bf16()
            && matches!(src.load_checked("model.encoder.layers.0.self_attn.q_proj.weight", &[d, d], &cpu)?, Weight::Quantized(_));
        let conv = |p: &str, c: usize| -> Result<Lin> {
            let w = vec(&format!("{p}.weight"), &[d, c, 3])?;
            Ok(Lin { w: Mat::D(conv_matrix(&w, d, c, bf16)), b: vec(&format!("{p}.bias"), &[d])? })
        };
        let norm = |p: &str| -> Result<LayerNorm> { Ok(LayerNorm::new(vec(&format!("{p}.weight"), &[d])?, vec(&format!("{p}.bias"), &[d])?, 1e-5)?) };
        let lin = |p: &str, out: usize, inp: usize| -> Result<Lin> {
            let w = src.load_checked(&format!("{p}.weight"), &[out, inp], &cpu)?;
            Ok(Lin { w: stacked(&[w], inp, bf16)?, b: vec(&format!("{p}.bias"), &[out])? })
        };
        let mut layers = Vec::with_capacity(cfg.encoder_layers);
        for i in 0..cfg.encoder_layers {
            let p = format!("model.encoder.layers.{i}");
            let a = format!("{p}.self_attn");
            let ws = ["q", "k", "v"]
                .iter()
                .map(|x| src.load_checked(&format!("{a}.{x}_proj.weight"), &[d, d], &cpu))
                .collect::<sapient_tensor::Result<Vec<_>>>()?;
            let mut b = vec(&format!("{a}.q_proj.bias"), &[d])?;
            // transformers' Whisper has no key bias; a checkpoint that carries a (zero) one works too.
            let kb = format!("{a}.k_proj.bias");
            b.extend(if src.contains(&kb) { vec(&kb, &[d])? } else { vec![0.0; d] });
            b.extend(vec(&format!("{a}.v_proj.bias"), &[d])?);
            layers.push(Layer {
                attn_ln: norm(&format!("{p}.self_attn_layer_norm"))?,
                qkv: Lin { w: stacked(&ws, d, bf16)?, b },
                out: lin(&format!("{a}.out_proj"), d, d)?,
                mlp_ln: norm(&format!("{p}.final_layer_norm"))?,
                fc1: lin(&format!("{p}.fc1"), ff, d)?,
                fc2: lin(&format!("{p}.fc2"), d, ff)?,
            });
        }
        Ok(Self {
            conv1: conv("model.encoder.conv1", m)?,
            conv2: conv("model.encoder.conv2", d)?,
            pos: vec("model.encoder.embed_positions.weight", &[cfg.max_source_positions, d])?,
            layers,
            ln: norm("model.encoder.layer_norm")?,
            d,
            heads: cfg.encoder_attention_heads,
            n_mels: m,
            n_ctx: cfg.max_source_positions,
            scratch: Mutex::new(Scratch::default()),
        })
    }

    /// Encode `b` log-mel windows `mel` ([b, n_mels, 2 · n_ctx], row-major) into
    /// `out` ([b, n_ctx, d]).
    pub fn forward(&self, mel: &[f32], b: usize, out: &mut [f32]) -> Result<()> {
        let (m, n, d) = (self.n_mels, self.n_ctx, self.d);
        let f = 2 * n;
        if mel.len() != b * m * f || out.len() != b * n * d {
            return Err(Error::Mismatch(format!(
                "encoder: {} mel values and {} outputs for {b} windows of [{m}, {f}] -> [{n}, {d}]",
                mel.len(),
                out.len()
            )));
        }
        let mut s = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        for (mw, ow) in mel.chunks_exact(m * f).zip(out.chunks_exact_mut(n * d)) {
            self.window(mw, &mut s, ow);
        }
        Ok(())
    }

    fn window(&self, mel: &[f32], s: &mut Scratch, out: &mut [f32]) {
        let (m, n, d) = (self.n_mels, self.n_ctx, self.d);
        let f = 2 * n;
        let ff = self.layers.first().map_or(0, |l| l.fc1.rows());
        grow(&mut s.col, (f * 3 * m).max(n * 3 * d));
        grow(&mut s.c1, (f + 2) * d);
        for v in [&mut s.x, &mut s.h, &mut s.o] {
            grow(v, n * d);
        }
        grow(&mut s.qkv, n * 3 * d);
        grow(&mut s.f, n * ff);
        // conv1 (stride 1, padding 1): row t is frames t - 1, t, t + 1 of every mel bin
        pool::pool().for_each_chunk_mut(&mut s.col[..f * 3 * m], ROWS_PER_CHUNK * 3 * m, |c, rows| {
            for (r, row) in rows.chunks_exact_mut(3 * m).enumerate() {
                let t = c * ROWS_PER_CHUNK + r;
                for j in 0..3 {
                    let src = (t + j).checked_sub(1).filter(|&u| u < f);
                    let dst = &mut row[j * m..(j + 1) * m];
                    match src {
                        Some(u) => {
                            for (i, v) in dst.iter_mut().enumerate() {
                                *v = mel[i * f + u];
                            }
                        }
                        None => dst.fill(0.0),
                    }
                }
            }
        });
        s.c1[..d].fill(0.0);
        s.c1[(f + 1) * d..(f + 2) * d].fill(0.0);
        self.conv1.forward(&s.col, f, true, &mut s.c1[d..(f + 1) * d]);
        // conv2 (stride 2, padding 1): row t is padded rows 2t .. 2t + 2, contiguous
        let c1 = &s.c1;
        pool::pool().for_each_chunk_mut(&mut s.col[..n * 3 * d], ROWS_PER_CHUNK * 3 * d, |c, rows| {
            for (r, row) in rows.chunks_exact_mut(3 * d).enumerate() {
                let t = c * ROWS_PER_CHUNK + r;
                row.copy_from_slice(&c1[2 * t * d..(2 * t + 3) * d]);
            }
        });
        self.conv2.forward(&s.col, n, true, &mut s.x);
        add(&mut s.x[..n * d], &self.pos[..n * d]);
        for l in &self.layers {
            l.attn_ln.rows_to(&s.x[..n * d], &mut s.h);
            l.qkv.forward(&s.h, n, false, &mut s.qkv);
            let hd = d / self.heads;
            encoder::self_attention(&s.qkv[..n * 3 * d], std::slice::from_ref(&(0..n)), self.heads, hd, 1.0 / (hd as f32).sqrt(), &mut s.o[..n * d], &mut s.attn);
            l.out.forward(&s.o, n, false, &mut s.h);
            add(&mut s.x[..n * d], &s.h[..n * d]);
            l.mlp_ln.rows_to(&s.x[..n * d], &mut s.h);
            l.fc1.forward(&s.h, n, true, &mut s.f);
            l.fc2.forward(&s.f, n, false, &mut s.o);
            add(&mut s.x[..n * d], &s.o[..n * d]);
        }
        self.ln.rows_to(&s.x[..n * d], out);
    }
}

fn add(x: &mut [f32], y: &[f32]) {
    pool::pool().for_each_chunk_mut(x, 64 * 1024, |c, xs| {
        for (a, b) in xs.iter_mut().zip(&y[c * 64 * 1024..]) {
            *a += b;
        }
    });
}
