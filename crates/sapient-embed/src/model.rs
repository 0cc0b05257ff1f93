//! The encoder (BERT and nomic-bert are one definition with a few switches) on plain f32
//! buffers: linear layers through `sapient_tensor::kernels::DenseMatrix`, attention per
//! sequence and head over the kernel pool.
//!
//! A batch is packed: the sequences' tokens are laid end to end with no padding, every
//! token-wise step (embeddings, projections, MLP, norms) runs once over all rows, and each
//! query attends only to the keys of its own sequence. That is what a padded batch with an
//! attention mask computes, without the pad rows.

use sapient_tensor::kernels::SendPtr;
use crate::config::{Arch, EncoderConfig};
use crate::{Error, Result};
use candle_core::{DType, Device};
use sapient_tensor::kernels::{self, pool};
use candle_core::quantized::GgmlDType;
use sapient_tensor::kernels::quant::QType;
use sapient_tensor::kernels::{DenseMatrix, QMatrix};
use sapient_tensor::{Weight, WeightSource};
use std::ops::Range;

/// A linear layer's weight: prepacked for the float products, or quantized to Q8_0 for the
/// integer ones (see [`Precision`]).
enum Mat {
    Dense(DenseMatrix),
    Q8(QMatrix),
}

/// A linear layer: `[out, in]` weight, optional bias.
struct Lin {
    w: Mat,
    b: Option<Vec<f32>>,
    out: usize,
}

impl Lin {
    fn forward(&self, x: &[f32], m: usize, y: &mut Vec<f32>) {
        self.product(x, m, false, y)
    }

    /// [`Lin::forward`] with GELU (erf form) applied to the output (inside the float
    /// product; on each row range of the integer one's output, with its bias).
    fn forward_gelu(&self, x: &[f32], m: usize, y: &mut Vec<f32>) {
        self.product(x, m, true, y)
    }

    fn product(&self, x: &[f32], m: usize, gelu: bool, y: &mut Vec<f32>) {
        // Every value is written by the product.
        y.resize(m * self.out, 0.0);
        match &self.w {
            Mat::Dense(w) if gelu => w.matmul_gelu(x, m, self.b.as_deref(), y),
            Mat::Dense(w) => w.matmul(x, m, self.b.as_deref(), y),
            Mat::Q8(w) => {
                w.matmul(&x[..m * w.cols()], m, &mut y[..m * self.out]);
                bias_rows(y, self.out, self.b.as_deref(), gelu);
            }
        }
    }
}

/// `a.forward(x)` into `ya` and `b.forward(x)` into `yb`: in one dispatch on the kernel pool,
/// the input quantized once, when both are Q8_0.
fn forward_pair(a: &Lin, b: &Lin, x: &[f32], m: usize, ya: &mut Vec<f32>, yb: &mut Vec<f32>) {
    let (Mat::Q8(wa), Mat::Q8(wb)) = (&a.w, &b.w) else {
        a.forward(x, m, ya);
        b.forward(x, m, yb);
        return;
    };
    ya.resize(m * a.out, 0.0);
    yb.resize(m * b.out, 0.0);
    kernels::matmul_group(&[wa, wb], &x[..m * wa.cols()], m, &mut [&mut ya[..m * a.out], &mut yb[..m * b.out]]);
    bias_rows(ya, a.out, a.b.as_deref(), false);
    bias_rows(yb, b.out, b.b.as_deref(), false);
}

/// `y[r] += b` for every row of `n` values (then GELU when asked), rows over the kernel pool
/// when there are many.
fn bias_rows(y: &mut [f32], n: usize, b: Option<&[f32]>, gelu: bool) {
    if b.is_none() && !gelu {
        return;
    }
    let rows = y.len() / n;
    let per = kernels::rows_per_thread(rows, y.len());
    let job = |_: usize, c: &mut [f32]| {
        if let Some(b) = b {
            for r in c.chunks_exact_mut(n) {
                add(r, b);
            }
        }
        if gelu {
            kernels::gelu_erf_in_place(c);
        }
    };
    if per >= rows {
        job(0, y);
    } else {
        pool::pool().for_each_chunk_mut(y, per * n, job);
    }
}

/// How the encoder's linear layers multiply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Precision {
    /// Close to f32 accuracy (the default), the fastest such products here: on AMX-BF16 the
    /// weights as stored (f32, or f16) multiplied with f32 activations as pairs of bf16
    /// halves; on other CPUs with AVX-512 VNNI the weights as 13-bit integers (a scale per
    /// row) and the activations as 14-bit ones (a scale per 32 values), multiplied with
    /// 16-bit integer multiply-adds at twice the f32 rate (the model card's similarities
    /// move by under 1e-4 from [`Precision::F32`]'s); elsewhere as [`Precision::F32`].
    #[default]
    Float,
    /// f32 products of the weights as stored (f16 kept in f16 and widened in registers by
    /// the blocked AVX-512 kernel), except on AMX-BF16, where they are [`Precision::Float`]'s.
    F32,
    /// Weights quantized to Q8_0 at load and activations to 8 bits per 32 values (as
    /// llama.cpp runs Q8_0 models): integer products, a quarter of the f32 weight bytes,
    /// faster where AMX-BF16 does not run the float products. Less accurate: on the model
    /// cards' and the tests' sentences the cosine to the float vectors is about 0.9995 for
    /// all-MiniLM-L6-v2 and 0.998 for nomic-embed-text-v1.5, and MiniLM's published
    /// similarities move in their third decimal.
    Q8,
}

/// GGML's Q8_0 blocks of `w` (a multiple of 32 values): per 32 values an f16 scale
/// `max |x| / 127` and the values divided by it, rounded.
fn q8_0_bytes(w: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(w.len() / 32 * 34);
    for b in w.chunks_exact(32) {
        let amax = b.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&half::f16::from_f32(d).to_bits().to_le_bytes());
        out.extend(b.iter().map(|&v| (v * id).round() as i8 as u8));
    }
    out
}

/// A weight as stored: f16 stays f16 (the kernels read half the bytes), the rest is f32.
enum Raw {
    F32(Vec<f32>),
    F16(Vec<u16>),
}

impl Raw {
    fn into_f32(self) -> Vec<f32> {
        match self {
            Raw::F32(v) => v,
            Raw::F16(v) => v.into_iter().map(|b| half::f16::from_bits(b).to_f32()).collect(),
        }
    }
    fn concat(parts: Vec<Raw>) -> Raw {
        if parts.iter().all(|p| matches!(p, Raw::F16(_))) {
            Raw::F16(parts.into_iter().flat_map(|p| if let Raw::F16(v) = p { v } else { Vec::new() }).collect())
        } else {
            Raw::F32(parts.into_iter().flat_map(Raw::into_f32).collect())
        }
    }
    fn matrix(self, n: usize, k: usize, p: Precision) -> Result<Mat> {
        let int16 = p == Precision::Float && !kernels::has_amx_bf16();
        Ok(match (self, p) {
            (r, Precision::Q8) if k.is_multiple_of(32) => Mat::Q8(QMatrix::from_bytes(QType::Q8_0, n, k, q8_0_bytes(&r.into_f32()))?),
            (Raw::F32(v), _) if int16 => Mat::Dense(DenseMatrix::from_f32_int16(&v, n, k).unwrap_or_else(|| DenseMatrix::from_f32_blocked(&v, n, k))),
            (Raw::F16(v), _) if int16 => Mat::Dense(DenseMatrix::from_f16_bits_int16(&v, n, k).unwrap_or_else(|| DenseMatrix::from_f16_bits_blocked(&v, n, k))),
            (Raw::F32(v), _) => Mat::Dense(DenseMatrix::from_f32_blocked(&v, n, k)),
            (Raw::F16(v), _) => Mat::Dense(DenseMatrix::from_f16_bits_blocked(&v, n, k)),
        })
    }
}

fn load_raw(w: &dyn WeightSource, name: &str, shape: &[usize]) -> Result<Raw> {
    let f16 = match w.load_checked(name, shape, &Device::Cpu)? {
        Weight::Dense(t) => t.dtype() == DType::F16,
        Weight::Quantized(q) => q.dtype() == GgmlDType::F16,
    };
    if f16 {
        let t = w.tensor(name, shape, &Device::Cpu, DType::F16)?;
        Ok(Raw::F16(t.flatten_all()?.to_vec1::<half::f16>()?.into_iter().map(half::f16::to_bits).collect()))
    } else {
        load_vec(w, name, shape).map(Raw::F32)
    }
}

struct Norm {
    w: Vec<f32>,
    b: Vec<f32>,
}

enum Mlp {
    /// `down(gelu(up(x)))`, biased.
    Gelu { up: Lin, down: Lin },
    /// `down(silu(gate(x)) * up(x))`.
    SwiGlu { up: Lin, gate: Lin, down: Lin },
}

struct Layer {
    /// Fused `[3 dim, dim]`: query, key, value rows.
    qkv: Lin,
    out: Lin,
    norm1: Norm,
    mlp: Mlp,
    norm2: Norm,
}

pub(crate) struct Encoder {
    pub cfg: EncoderConfig,
    pub precision: Precision,
    tok_emb: Vec<f32>,
    pos_emb: Option<Vec<f32>>,
    /// Token type 0's row (every input is one segment).
    type_emb: Option<Vec<f32>>,
    emb_norm: Norm,
    layers: Vec<Layer>,
}

/// Tensor names of one checkpoint layout.
struct Names {
    gguf: bool,
    prefix: String,
}

impl Names {
    fn emb(&self, what: &str) -> String {
        if self.gguf {
            match what {
                "word" => "token_embd.weight".into(),
                "pos" => "position_embd.weight".into(),
                "type" => "token_types.weight".into(),
                "norm.weight" => "token_embd_norm.weight".into(),
                _ => "token_embd_norm.bias".into(),
            }
        } else {
            let p = &self.prefix;
            match what {
                "word" => format!("{p}embeddings.word_embeddings.weight"),
                "pos" => format!("{p}embeddings.position_embeddings.weight"),
                "type" => format!("{p}embeddings.token_type_embeddings.weight"),
                "norm.weight" => format!("{p}embeddings.LayerNorm.weight"),
                _ => format!("{p}embeddings.LayerNorm.bias"),
            }
        }
    }
    /// `part`: q, k, v, qkv, o, norm1, up, gate, down, norm2; `suffix`: weight or bias.
    fn layer(&self, i: usize, part: &str, suffix: &str) -> String {
        if self.gguf {
            let n = match part {
                "q" => "attn_q",
                "k" => "attn_k",
                "v" => "attn_v",
                "qkv" => "attn_qkv",
                "o" => "attn_output",
                "norm1" => "attn_output_norm",
                "up" => "ffn_up",
                "gate" => "ffn_gate",
                "down" => "ffn_down",
                "norm2" => "layer_output_norm",
                _ => "unknown",
            };
            format!("blk.{i}.{n}.{suffix}")
        } else {
            let n = match part {
                "q" => "attention.self.query",
                "k" => "attention.self.key",
                "v" => "attention.self.value",
                "o" => "attention.output.dense",
                "norm1" => "attention.output.LayerNorm",
                "up" => "intermediate.dense",
                "down" => "output.dense",
                "norm2" => "output.LayerNorm",
                // BERT checkpoints keep q, k and v apart
                _ => "attention.self.fused_qkv",
            };
            format!("{}encoder.layer.{i}.{n}.{suffix}", self.prefix)
        }
    }
}

fn load_vec(w: &dyn WeightSource, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
    let t = w.tensor(name, shape, &Device::Cpu, DType::F32)?;
    Ok(t.flatten_all()?.to_vec1::<f32>()?)
}

fn load_opt(w: &dyn WeightSource, name: &str, shape: &[usize]) -> Result<Option<Vec<f32>>> {
    if w.contains(name) {
        load_vec(w, name, shape).map(Some)
    } else {
        Ok(None)
    }
}

fn lin(w: &dyn WeightSource, wn: &str, bn: &str, out: usize, inp: usize, p: Precision) -> Result<Lin> {
    Ok(Lin { w: load_raw(w, wn, &[out, inp])?.matrix(out, inp, p)?, b: load_opt(w, bn, &[out])?, out })
}

impl Encoder {
    /// Load the weights: linear layers prepacked for the kernels (f16 kept as f16 where AMX
    /// runs them) or quantized to Q8_0 ([`Precision`]), the rest as f32 (quantized weights
    /// are widened).
    pub fn load(cfg: EncoderConfig, w: &dyn WeightSource, gguf: bool, p: Precision, progress: &mut dyn FnMut(f32)) -> Result<Self> {
        let prefix = if !gguf && w.contains("bert.embeddings.word_embeddings.weight") { "bert.".to_string() } else { String::new() };
        let names = Names { gguf, prefix };
        let d = cfg.dim;
        let tok_emb = load_vec(w, &names.emb("word"), &[cfg.vocab, d])?;
        let pos_emb = if cfg.arch == Arch::Bert { Some(load_vec(w, &names.emb("pos"), &[cfg.max_positions, d])?) } else { None };
        let type_emb = match w.shape_of(&names.emb("type")) {
            Some(s) if s.len() == 2 && s[1] == d && s[0] > 0 => Some(load_vec(w, &names.emb("type"), &s)?[..d].to_vec()),
            Some(s) => return Err(Error::Config { path: w.location().to_path_buf(), what: format!("token type embeddings of shape {s:?}") }),
            None => None,
        };
        let emb_norm = Norm { w: load_vec(w, &names.emb("norm.weight"), &[d])?, b: load_vec(w, &names.emb("norm.bias"), &[d])? };
        let mut layers = Vec::with_capacity(cfg.layers);
        for i in 0..cfg.layers {
            let l = |p: &str, s: &str| names.layer(i, p, s);
            let qkv = if w.contains(&l("qkv", "weight")) {
                lin(w, &l("qkv", "weight"), &l("qkv", "bias"), 3 * d, d, p)?
            } else {
                let mut ws = Vec::with_capacity(3);
                let mut bs = Vec::with_capacity(3);
                for p in ["q", "k", "v"] {
                    ws.push(load_raw(w, &l(p, "weight"), &[d, d])?);
                    bs.push(load_opt(w, &l(p, "bias"), &[d])?);
                }
                let b = match bs.as_slice() {
                    [Some(a), Some(b), Some(c)] => Some([a.as_slice(), b, c].concat()),
                    [None, None, None] => None,
                    _ => return Err(Error::Config { path: w.location().to_path_buf(), what: format!("layer {i}: some of q/k/v have biases, others not") }),
                };
                Lin { w: Raw::concat(ws).matrix(3 * d, d, p)?, b, out: 3 * d }
            };
            let out = lin(w, &l("o", "weight"), &l("o", "bias"), d, d, p)?;
            let norm1 = Norm { w: load_vec(w, &l("norm1", "weight"), &[d])?, b: load_vec(w, &l("norm1", "bias"), &[d])? };
            let up = lin(w, &l("up", "weight"), &l("up", "bias"), cfg.ffn, d, p)?;
            let down = lin(w, &l("down", "weight"), &l("down", "bias"), d, cfg.ffn, p)?;
            let mlp = match cfg.arch {
                Arch::Bert => Mlp::Gelu { up, down },
                Arch::NomicBert => Mlp::SwiGlu { up, gate: lin(w, &l("gate", "weight"), &l("gate", "bias"), cfg.ffn, d, p)?, down },
            };
            let norm2 = Norm { w: load_vec(w, &l("norm2", "weight"), &[d])?, b: load_vec(w, &l("norm2", "bias"), &[d])? };
            layers.push(Layer { qkv, out, norm1, mlp, norm2 });
            progress((i + 1) as f32 / cfg.layers as f32);
        }
        // The Q8_0 matrices in the lane kernels' layout, in one allocation.
        let mut mats: Vec<&mut QMatrix> = Vec::new();
        for l in &mut layers {
            let Layer { qkv, out, mlp, .. } = l;
            let lins: Vec<&mut Lin> = match mlp {
                Mlp::Gelu { up, down } => vec![qkv, out, up, down],
                Mlp::SwiGlu { up, gate, down } => vec![qkv, out, up, gate, down],
            };
            mats.extend(lins.into_iter().filter_map(|l| if let Mat::Q8(q) = &mut l.w { Some(q) } else { None }));
        }
        kernels::pack_for_lanes(&mut mats);
        Ok(Self { cfg, precision: p, tok_emb, pos_emb, type_emb, emb_norm, layers })
    }

    /// The final hidden states `[tokens, dim]` of a packed batch: `ids` holds the sequences
    /// end to end, `seqs` their ranges.
    pub fn forward(&self, ids: &[u32], seqs: &[Range<usize>]) -> Result<Vec<f32>> {
        let c = &self.cfg;
        let (d, t) = (c.dim, ids.len());
        let mut x = vec![0.0f32; t * d];
        for s in seqs {
            for (pos, i) in s.clone().enumerate() {
                let id = ids[i] as usize;
                if id >= c.vocab {
                    return Err(Error::Token { id: ids[i], vocab: c.vocab });
                }
                let row = &mut x[i * d..(i + 1) * d];
                row.copy_from_slice(&self.tok_emb[id * d..(id + 1) * d]);
                if let Some(p) = &self.pos_emb {
                    if pos >= c.max_positions {
                        return Err(Error::TooLong { tokens: s.len(), max: c.max_positions });
                    }
                    add(row, &p[pos * d..(pos + 1) * d]);
                }
                if let Some(ty) = &self.type_emb {
                    add(row, ty);
                }
            }
        }
        layer_norm_rows(&mut x, d, &self.emb_norm, c.eps);
        let rope = (c.arch == Arch::NomicBert).then(|| Rope::new(c.head_dim(), c.rope_base, seqs.iter().map(|s| s.len()).max().unwrap_or(0)));
        let (mut qkv, mut ctx, mut h, mut g, mut y) = (Vec::new(), vec![0.0f32; t * d], Vec::new(), Vec::new(), Vec::new());
        for layer in &self.layers {
            layer.qkv.forward(&x, t, &mut qkv);
            if let Some(r) = &rope {
                for s in seqs {
                    for (pos, i) in s.clone().enumerate() {
                        let row = &mut qkv[i * 3 * d..i * 3 * d + 2 * d];
                        for head in row.chunks_exact_mut(c.head_dim()) {
                            r.apply(head, pos);
                        }
                    }
                }
            }
            attention(&qkv, seqs, c.heads, c.head_dim(), &mut ctx);
            layer.out.forward(&ctx, t, &mut y);
            add_norm_rows(&mut x, &y, d, &layer.norm1, c.eps);
            match &layer.mlp {
                Mlp::Gelu { up, down } => {
                    up.forward_gelu(&x, t, &mut h);
                    down.forward(&h, t, &mut y);
                }
                Mlp::SwiGlu { up, gate, down } => {
                    forward_pair(up, gate, &x, t, &mut h, &mut g);
                    kernels::silu_mul(&mut g, &h);
                    down.forward(&g, t, &mut y);
                }
            }
            add_norm_rows(&mut x, &y, d, &layer.norm2, c.eps);
        }
        Ok(x)
    }
}

fn add(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

fn layer_norm_rows(x: &mut [f32], d: usize, n: &Norm, eps: f32) {
    for r in x.chunks_exact_mut(d) {
        layer_norm(r, &n.w, &n.b, eps);
    }
}

/// `x = layer_norm(x + y)` row by row (the residual and the norm after it), rows over the
/// kernel pool when there are many.
fn add_norm_rows(x: &mut [f32], y: &[f32], d: usize, n: &Norm, eps: f32) {
    const ROWS: usize = 32;
    let rows = x.len() / d;
    let xp = SendPtr(x.as_mut_ptr());
    let job = |c: usize| {
        for i in c * ROWS..((c + 1) * ROWS).min(rows) {
            // SAFETY: row i belongs to this chunk only; `x` outlives the call.
            let r = unsafe { std::slice::from_raw_parts_mut(xp.ptr().add(i * d), d) };
            add(r, &y[i * d..(i + 1) * d]);
            layer_norm(r, &n.w, &n.b, eps);
        }
    };
    let chunks = rows.div_ceil(ROWS);
    if chunks <= 1 || x.len() < 64 * 1024 {
        (0..chunks).for_each(job);
    } else {
        pool::pool().run_chunks(chunks, &job);
    }
}

/// LayerNorm with the statistics accumulated in f64.
pub(crate) fn layer_norm(r: &mut [f32], w: &[f32], b: &[f32], eps: f32) {
    #[cfg(target_arch = "x86_64")]
    if r.len().is_multiple_of(16) && w.len() >= r.len() && b.len() >= r.len() && kernels::has_avx512() {
        // SAFETY: AVX-512 F is present; the lengths are checked above.
        unsafe { layer_norm_avx512(r, w, b, eps) };
        return;
    }
    let n = r.len() as f64;
    let mean = r.iter().map(|&v| v as f64).sum::<f64>() / n;
    let var = r.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
    let inv = 1.0 / (var + eps as f64).sqrt();
    for (i, v) in r.iter_mut().enumerate() {
        *v = ((*v as f64 - mean) * inv) as f32 * w[i] + b[i];
    }
}

/// [`layer_norm`] with 8 lanes of f64 sums (rows of a multiple of 16 values).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn layer_norm_avx512(r: &mut [f32], w: &[f32], b: &[f32], eps: f32) {
    use std::arch::x86_64::*;
    let len = r.len();
    let p = r.as_mut_ptr();
    let wide = |i: usize| {
        let v = _mm512_loadu_ps(p.add(i));
        (_mm512_cvtps_pd(_mm512_castps512_ps256(v)), _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)))))
    };
    let (mut s0, mut s1) = (_mm512_setzero_pd(), _mm512_setzero_pd());
    for i in (0..len).step_by(16) {
        let (a, c) = wide(i);
        s0 = _mm512_add_pd(s0, a);
        s1 = _mm512_add_pd(s1, c);
    }
    let mean = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1)) / len as f64;
    let m = _mm512_set1_pd(mean);
    let (mut q0, mut q1) = (_mm512_setzero_pd(), _mm512_setzero_pd());
    for i in (0..len).step_by(16) {
        let (a, c) = wide(i);
        let (a, c) = (_mm512_sub_pd(a, m), _mm512_sub_pd(c, m));
        q0 = _mm512_fmadd_pd(a, a, q0);
        q1 = _mm512_fmadd_pd(c, c, q1);
    }
    let var = _mm512_reduce_add_pd(_mm512_add_pd(q0, q1)) / len as f64;
    let inv = _mm512_set1_pd(1.0 / (var + eps as f64).sqrt());
    for i in (0..len).step_by(16) {
        let (a, c) = wide(i);
        let lo = _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_sub_pd(a, m), inv));
        let hi = _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_sub_pd(c, m), inv));
        let v = _mm512_castpd_ps(_mm512_insertf64x4::<1>(_mm512_castps_pd(_mm512_castps256_ps512(lo)), _mm256_castps_pd(hi)));
        let v = _mm512_add_ps(_mm512_mul_ps(v, _mm512_loadu_ps(w.as_ptr().add(i))), _mm512_loadu_ps(b.as_ptr().add(i)));
        _mm512_storeu_ps(p.add(i), v);
    }
}

/// Rotary positions, NeoX pairing (dimension `i` with `i + half`).
struct Rope {
    half: usize,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl Rope {
    fn new(head_dim: usize, base: f32, len: usize) -> Self {
        let half = head_dim / 2;
        let mut cos = Vec::with_capacity(len * half);
        let mut sin = Vec::with_capacity(len * half);
        for p in 0..len {
            for i in 0..half {
                let inv = (base as f64).powf(-2.0 * i as f64 / head_dim as f64);
                let a = p as f64 * inv;
                cos.push(a.cos() as f32);
                sin.push(a.sin() as f32);
            }
        }
        Self { half, cos, sin }
    }

    fn apply(&self, v: &mut [f32], pos: usize) {
        let h = self.half;
        let (c, s) = (&self.cos[pos * h..(pos + 1) * h], &self.sin[pos * h..(pos + 1) * h]);
        for i in 0..h {
            let (a, b) = (v[i], v[i + h]);
            v[i] = a * c[i] - b * s[i];
            v[i + h] = a * s[i] + b * c[i];
        }
    }
}

/// Scaled dot-product attention of every sequence with itself, per head, over the pool.
/// `qkv`: rows of `[q | k | v]` (3 dim); `ctx`: rows of dim.
fn attention(qkv: &[f32], seqs: &[Range<usize>], heads: usize, hd: usize, ctx: &mut [f32]) {
    let d = heads * hd;
    let out = SendPtr(ctx.as_mut_ptr());
    let units = seqs.len() * heads;
    let fma = has_fma();
    #[cfg(target_arch = "x86_64")]
    let wide = kernels::has_avx512() && hd.is_multiple_of(32);
    let job = |u: usize| {
        let (s, h) = (&seqs[u / heads], u % heads);
        let o = out.ptr();
        #[cfg(target_arch = "x86_64")]
        if wide {
            SCRATCH.with(|b| {
                let (kt, p) = &mut *b.borrow_mut();
                // SAFETY: AVX-512 F is present; hd is a multiple of 32.
                unsafe { attend_avx512(qkv, s.clone(), h, hd, d, o, kt, p) };
            });
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if fma {
            // SAFETY: AVX2 and FMA are present.
            unsafe { attend_fma(qkv, s.clone(), h, hd, d, o) };
            return;
        }
        let _ = fma;
        attend(qkv, s.clone(), h, hd, d, o);
    };
    let work: usize = seqs.iter().map(|s| s.len() * s.len()).sum::<usize>() * d;
    // The AVX-512 path does one sentence of 30 tokens (work 345k) in ~20 us: inline.
    #[cfg(target_arch = "x86_64")]
    let inline = if wide { 512 * 1024 } else { 64 * 1024 };
    #[cfg(not(target_arch = "x86_64"))]
    let inline = 64 * 1024;
    if work < inline || units == 1 {
        (0..units).for_each(job);
    } else {
        pool::pool().run_chunks(units, &job);
    }
}

thread_local! {
    /// A worker's keys of one head, transposed, and its scores.
    static SCRATCH: std::cell::RefCell<(Vec<f32>, Vec<f32>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// [`attend`] on AVX-512 for head sizes that are multiples of 32: the head's keys are
/// transposed once (`kt[dim][key]`), so each query's scores are 16 keys per vector
/// multiply-add; softmax is [`kernels::softmax_unnormalized`]; the weighted sum of values runs
/// over 32 dimensions at a time.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn attend_avx512(qkv: &[f32], s: Range<usize>, h: usize, hd: usize, d: usize, out: *mut f32, kt: &mut Vec<f32>, p: &mut Vec<f32>) {
    use std::arch::x86_64::*;
    let l = s.len();
    let lp = l.div_ceil(16) * 16;
    let scale = _mm512_set1_ps(1.0 / (hd as f32).sqrt());
    kt.clear();
    kt.resize(hd * lp, 0.0);
    for (j, ki) in s.clone().enumerate() {
        let k = &qkv[ki * 3 * d + d + h * hd..][..hd];
        for (t, &v) in k.iter().enumerate() {
            kt[t * lp + j] = v;
        }
    }
    p.clear();
    p.resize(lp, 0.0);
    let (ktp, pp) = (kt.as_ptr(), p.as_mut_ptr());
    for qi in s.clone() {
        let q = &qkv[qi * 3 * d + h * hd..][..hd];
        for j in (0..lp).step_by(16) {
            let mut acc = [_mm512_setzero_ps(); 4];
            for t in (0..hd).step_by(4) {
                for (u, a) in acc.iter_mut().enumerate() {
                    *a = _mm512_fmadd_ps(_mm512_set1_ps(q[t + u]), _mm512_loadu_ps(ktp.add((t + u) * lp + j)), *a);
                }
            }
            let v = _mm512_mul_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])), scale);
            _mm512_storeu_ps(pp.add(j), v);
        }
        let ps = std::slice::from_raw_parts_mut(pp, l);
        let inv = _mm512_set1_ps(kernels::softmax_unnormalized(ps));
        for c in (0..hd).step_by(32) {
            let mut acc = [_mm512_setzero_ps(); 4];
            for (j, vi) in s.clone().enumerate() {
                let v = qkv.as_ptr().add(vi * 3 * d + 2 * d + h * hd + c);
                let w = _mm512_set1_ps(ps[j]);
                let e = 2 * (j & 1);
                acc[e] = _mm512_fmadd_ps(w, _mm512_loadu_ps(v), acc[e]);
                acc[e + 1] = _mm512_fmadd_ps(w, _mm512_loadu_ps(v.add(16)), acc[e + 1]);
            }
            // SAFETY (caller): (token qi, head h) is written by this unit only.
            let o = out.add(qi * d + h * hd + c);
            _mm512_storeu_ps(o, _mm512_mul_ps(_mm512_add_ps(acc[0], acc[2]), inv));
            _mm512_storeu_ps(o.add(16), _mm512_mul_ps(_mm512_add_ps(acc[1], acc[3]), inv));
        }
    }
}

fn has_fma() -> bool {
    kernels::has_avx2()
}

/// [`attend`] compiled with FMA (`exp_approx`'s multiply-adds are otherwise library calls).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_fma(qkv: &[f32], s: Range<usize>, h: usize, hd: usize, d: usize, out: *mut f32) {
    attend(qkv, s, h, hd, d, out)
}

/// Head `h` of sequence `s`: writes `out[token * d + h * hd..][..hd]` for its tokens (`out`:
/// the `[tokens, d]` context, whose other heads and sequences other units write).
#[inline(always)]
fn attend(qkv: &[f32], s: Range<usize>, h: usize, hd: usize, d: usize, out: *mut f32) {
    let scale = 1.0 / (hd as f32).sqrt();
    let l = s.len();
    let mut p = vec![0.0f32; l];
    let mut acc = vec![0.0f32; hd];
    for qi in s.clone() {
        let q = &qkv[qi * 3 * d + h * hd..][..hd];
        let mut max = f32::NEG_INFINITY;
        for (j, ki) in s.clone().enumerate() {
            let k = &qkv[ki * 3 * d + d + h * hd..][..hd];
            p[j] = kernels::dot_f32(q, k) * scale;
            max = max.max(p[j]);
        }
        let mut sum = 0.0f32;
        for v in p.iter_mut() {
            *v = kernels::exp_approx(*v - max);
            sum += *v;
        }
        acc.fill(0.0);
        for (j, vi) in s.clone().enumerate() {
            let v = &qkv[vi * 3 * d + 2 * d + h * hd..][..hd];
            let w = p[j];
            for (a, &x) in acc.iter_mut().zip(v) {
                *a += w * x;
            }
        }
        let inv = 1.0 / sum;
        // SAFETY: (token qi, head h) is written by this unit only; in bounds of the context,
        // which has a row of d for every token of `qkv`.
        let o = unsafe { std::slice::from_raw_parts_mut(out.add(qi * d + h * hd), hd) };
        for (o, a) in o.iter_mut().zip(&acc) {
            *o = a * inv;
        }
    }
}
