//! The encoder (BERT and nomic-bert are one definition with a few switches) on plain f32
//! buffers: linear layers through `sapient_tensor::kernels::DenseMatrix`, attention per
//! sequence and head over the kernel pool.
//!
//! A batch is packed: the sequences' tokens are laid end to end with no padding, every
//! token-wise step (embeddings, projections, MLP, norms) runs once over all rows, and each
//! query attends only to the keys of its own sequence. That is what a padded batch with an
//! attention mask computes, without the pad rows.

use crate::config::{Arch, EncoderConfig};
use crate::{Error, Result};
use candle_core::{DType, Device};
use sapient_tensor::kernels::{self, pool};
use candle_core::quantized::GgmlDType;
use sapient_tensor::kernels::quant::QType;
use sapient_tensor::kernels::{DenseMatrix, QMatrix};
use sapient_tensor::encoder::{self, LayerNorm};
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
    norm1: LayerNorm,
    mlp: Mlp,
    norm2: LayerNorm,
}

pub(crate) struct Encoder {
    pub cfg: EncoderConfig,
    pub precision: Precision,
    tok_emb: Vec<f32>,
    pos_emb: Option<Vec<f32>>,
    /// Token type 0's row (every input is one segment).
    type_emb: Option<Vec<f32>>,
    emb_norm: LayerNorm,
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
        let emb_norm = LayerNorm::new(load_vec(w, &names.emb("norm.weight"), &[d])?, load_vec(w, &names.emb("norm.bias"), &[d])?, cfg.eps)?;
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
            let norm1 = LayerNorm::new(load_vec(w, &l("norm1", "weight"), &[d])?, load_vec(w, &l("norm1", "bias"), &[d])?, cfg.eps)?;
            let up = lin(w, &l("up", "weight"), &l("up", "bias"), cfg.ffn, d, p)?;
            let down = lin(w, &l("down", "weight"), &l("down", "bias"), d, cfg.ffn, p)?;
            let mlp = match cfg.arch {
                Arch::Bert => Mlp::Gelu { up, down },
                Arch::NomicBert => Mlp::SwiGlu { up, gate: lin(w, &l("gate", "weight"), &l("gate", "bias"), cfg.ffn, d, p)?, down },
            };
            let norm2 = LayerNorm::new(load_vec(w, &l("norm2", "weight"), &[d])?, load_vec(w, &l("norm2", "bias"), &[d])?, cfg.eps)?;
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
        self.emb_norm.rows(&mut x);
        let rope = (c.arch == Arch::NomicBert).then(|| Rope::new(c.head_dim(), c.rope_base, seqs.iter().map(|s| s.len()).max().unwrap_or(0)));
        // The layers' buffers are the calling thread's from call to call (every value read is
        // written first in each call), so a call of a few sentences sets no memory to zero.
        let mut bufs = SCRATCH.with(|b| std::mem::take(&mut *b.borrow_mut()));
        let [qkv, ctx, h, g, y] = &mut bufs;
        ctx.resize(t * d, 0.0);
        let mut scratch = encoder::AttentionScratch::default();
        for layer in &self.layers {
            layer.qkv.forward(&x, t, qkv);
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
            encoder::self_attention(qkv, seqs, c.heads, c.head_dim(), 1.0 / (c.head_dim() as f32).sqrt(), ctx, &mut scratch);
            layer.out.forward(ctx, t, y);
            layer.norm1.add_rows(&mut x, y);
            match &layer.mlp {
                Mlp::Gelu { up, down } => {
                    up.forward_gelu(&x, t, h);
                    down.forward(h, t, y);
                }
                Mlp::SwiGlu { up, gate, down } => {
                    forward_pair(up, gate, &x, t, h, g);
                    kernels::silu_mul(g, h);
                    down.forward(g, t, y);
                }
            }
            layer.norm2.add_rows(&mut x, y);
        }
        // Kept only while small: a batch of many long texts gives its memory back.
        if bufs.iter().map(Vec::capacity).sum::<usize>() <= SCRATCH_KEPT {
            SCRATCH.with(|b| *b.borrow_mut() = bufs);
        }
        Ok(x)
    }
}

/// Most `f32`s [`SCRATCH`] keeps between calls (16 MB).
const SCRATCH_KEPT: usize = 4 << 20;

thread_local! {
    /// [`Encoder::forward`]'s buffers: q/k/v, attention context, MLP input and gate, output.
    static SCRATCH: std::cell::RefCell<[Vec<f32>; 5]> = std::cell::RefCell::new(Default::default());
}

fn add(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
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
