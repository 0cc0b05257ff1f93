//! The CPU backend: the operations of [`Backend`] on plain f32 buffers.
//!
//! On the CPU a decode step is a few hundred small operations; going through a tensor library
//! costs an allocation and a dispatch for each, which is several milliseconds per token for
//! small models. This backend runs them on preallocated `Vec<f32>` rows with the kernels of
//! `sapient_tensor::kernels` (threaded over the kernel pool), RMSNorm, RoPE, the gated
//! activations and attention written out directly, over the paged KV cache (`kv.rs`) in f16
//! as llama.cpp keeps it: values `[slot][kv head][head dim]`, keys transposed per block
//! (`[block][kv head x head dim][position in block]`) so that the attention kernels score 16
//! positions per vector without horizontal sums.
//!
//! Weights ([`Mat`]): GGML blocks with a kernel (Q4_0 to Q8_0, Q4_K to Q6_K) stay as they are
//! for the quantized kernels; dense weights (f32, f16, bf16 from safetensors or GGUF) are
//! prepacked for the AMX-BF16 products ([`kernels::DenseMatrix`], close to f32 accuracy,
//! f16 kept in f16) or, without AMX-BF16, kept in f32 for [`kernels::matmul_f32`]; the GGML
//! formats without a kernel (Q2_K, Q3_K, Q8_1, Q8_K) are requantized to Q8_0 at load.
//!
//! Every row's result can be made independent of the batch (`exact`): the quantized kernels
//! compute each row as alone, the AMX product too, and without AMX the f32 product runs 8
//! rows at a time by dot products; attention's arithmetic is per row too (the queries of a
//! head group, and neighbouring rows, share each key read). So a batch of tokens gives
//! bit-identical logits to the same tokens fed one at a time. With the AVX-512 kernels long
//! batches (prefill) stay on the quantized kernels, so the whole forward is row-invariant: a
//! reused prefix gives the logits a fresh prompt gives. Without AVX-512, prefill batches of
//! 32 tokens or more outside `exact` use a dequantized f32 GEMM through the layer's `Linear`
//! (`weights::dense_prefill_rows`), and dense f32 weights the GEMM of `matmul_f32`.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Module, Tensor};
use sapient_tensor::kernels::{self, pool, DenseMatrix, QMatrix, SendPtr as OutPtr};
use sapient_tensor::weights::dense_prefill_rows;
use sapient_tensor::{GgmlType, Linear, MappedBytes, Weight};
use std::cell::RefCell;
use std::sync::Arc;

use crate::backend::{Backend, DeltaInputs, DeltaVectors, Dims, LoraWork, RopeTable, Seg, Step};
use crate::config::Activation;
use crate::deltanet;
use crate::kv::{HostKv, KvLayer, KvLayerMut};
use crate::moe::Experts;
use crate::{Error, Result};

mod paged;
use paged::{attention, write_kv};

/// Rows per call of the f32 dot-product kernel in row-invariant products
/// ([`kernels::matmul_f32`] computes up to 8 rows by dot products, more by a GEMM whose
/// sums run in another order).
const F32_DOT_ROWS: usize = 8;

/// A weight matrix `[rows, cols]` as the CPU backend multiplies it.
pub(crate) enum Mat {
    /// GGML blocks for the quantized kernels, and on machines without the AVX-512 kernels
    /// the same weight as a [`Linear`] for the dense prefill GEMM (with them it is never
    /// used, and the blocks are dropped once the kernels' copy is packed).
    Quant { k: QMatrix, linear: Option<Linear> },
    /// Dense weights prepacked for AMX-BF16 products at close to f32 accuracy (f16 weights
    /// kept in f16). Each row's result depends on its own input only, so it is the same in
    /// any batch.
    Amx(DenseMatrix),
    /// Dense f32 weights (machines without AMX-BF16), for [`kernels::matmul_f32`].
    F32 { w: Vec<f32>, rows: usize, cols: usize },
    /// MXFP4 blocks (gpt-oss's experts), products as ggml computes them.
    Mxfp4(kernels::Mxfp4Matrix),
}

/// Dense values of a weight: f16 kept as bits (AMX takes them as they are), the rest f32.
enum DenseValues {
    F32(Vec<f32>),
    F16(Vec<u16>),
}

fn dense_values(t: &Tensor) -> Result<DenseValues> {
    let t = t.flatten_all()?;
    Ok(match t.dtype() {
        DType::F16 => DenseValues::F16(t.to_vec1::<half::f16>()?.into_iter().map(|x| x.to_bits()).collect()),
        _ => DenseValues::F32(t.to_dtype(DType::F32)?.to_vec1::<f32>()?),
    })
}

impl Mat {
    /// The CPU backend's form of a loaded `[rows, cols]` weight named `name`: quantized formats
    /// with a kernel as they are; dense ones (f32, f16, bf16: safetensors, or GGUF F32/F16/BF16
    /// tensors) for the dense kernels; other GGML formats (Q2_K, Q3_K, Q8_1, Q8_K)
    /// requantized to Q8_0 once here.
    pub(crate) fn from_weight(w: Weight, name: &str) -> Result<Self> {
        let (rows, cols) = match w.shape() {
            &[r, c] => (r, c),
            other => return Err(Error::Config(format!("{name}: a matrix must be 2-D, not of shape {other:?}"))),
        };
        let q = match w {
            Weight::Dense(t) => return Ok(Self::dense(dense_values(&t)?, rows, cols)),
            Weight::Quantized(q) => q,
        };
        if let Some(k) = QMatrix::from_qtensor(&q) {
            return Self::quant(k, q);
        }
        match q.dtype() {
            GgmlDType::F16 => {
                let t = q.dequantize_f16(&Device::Cpu)?;
                return Ok(Self::dense(dense_values(&t)?, rows, cols));
            }
            GgmlDType::F32 | GgmlDType::BF16 => {
                let t = q.dequantize(&Device::Cpu)?;
                return Ok(Self::dense(dense_values(&t)?, rows, cols));
            }
            _ => {}
        }
        if !cols.is_multiple_of(32) {
            return Err(Error::Config(format!(
                "{name}: {:?} has no CPU kernel, and its {cols} columns cannot be requantized to Q8_0 (blocks of 32)",
                q.dtype()
            )));
        }
        tracing::info!("{name}: {:?} has no CPU kernel; requantized to Q8_0 at load", q.dtype());
        let t = q.dequantize(&Device::Cpu)?;
        let q8 = Arc::new(QTensor::quantize(&t, GgmlDType::Q8_0)?);
        match QMatrix::from_qtensor(&q8) {
            Some(k) => Self::quant(k, q8),
            None => Err(Error::Internal("a Q8_0 matrix has no kernel")),
        }
    }

    fn quant(k: QMatrix, q: Arc<QTensor>) -> Result<Self> {
        let linear = if dense_prefill_rows() == usize::MAX { None } else { Some(Linear::new(Weight::Quantized(q), None)?) };
        Ok(Self::Quant { k, linear })
    }

    fn dense(v: DenseValues, rows: usize, cols: usize) -> Self {
        match v {
            DenseValues::F32(w) if kernels::has_amx_bf16() => Self::Amx(DenseMatrix::from_f32(&w, rows, cols)),
            DenseValues::F16(w) if kernels::has_amx_bf16() => Self::Amx(DenseMatrix::from_f16_bits(&w, rows, cols)),
            DenseValues::F32(w) => Self::F32 { w, rows, cols },
            DenseValues::F16(w) => Self::F32 { w: w.into_iter().map(|b| half::f16::from_bits(b).to_f32()).collect(), rows, cols },
        }
    }

    pub(crate) fn rows(&self) -> usize {
        match self {
            Self::Quant { k, .. } => k.rows(),
            Self::Amx(d) => d.rows(),
            Self::F32 { rows, .. } => *rows,
            Self::Mxfp4(m) => m.rows(),
        }
    }
    pub(crate) fn cols(&self) -> usize {
        match self {
            Self::Quant { k, .. } => k.cols(),
            Self::Amx(d) => d.cols(),
            Self::F32 { cols, .. } => *cols,
            Self::Mxfp4(m) => m.cols(),
        }
    }
}

/// One linear layer as the CPU path uses it.
pub(crate) struct Lin {
    mat: Mat,
    bias: Option<Vec<f32>>,
}

impl Lin {
    pub(crate) fn new(mat: Mat, bias: Option<Vec<f32>>) -> Result<Self> {
        if bias.as_ref().is_some_and(|b| b.len() != mat.rows()) {
            return Err(Error::Internal("a bias does not match its matrix"));
        }
        Ok(Self { mat, bias })
    }
    pub(crate) fn out(&self) -> usize {
        self.mat.rows()
    }
    pub(crate) fn input(&self) -> usize {
        self.mat.cols()
    }
    fn quant(&self) -> Option<&QMatrix> {
        match &self.mat {
            Mat::Quant { k, .. } => Some(k),
            _ => None,
        }
    }

    /// Add the bias (if any) to every `out()`-wide row of `out`.
    fn add_bias(&self, out: &mut [f32]) {
        if let Some(b) = &self.bias {
            for r in out.chunks_exact_mut(self.out()) {
                for (o, b) in r.iter_mut().zip(b) {
                    *o += b;
                }
            }
        }
    }

    /// `out = x @ W^T + b` for `n` rows. `exact`: every row computed as it is alone (the
    /// quantized kernels, the AMX product, or the f32 dot products), so that rows do not
    /// depend on the batch; else long batches may take a dense GEMM.
    fn run(&self, x: &[f32], n: usize, exact: bool, out: &mut [f32]) -> Result<()> {
        let rows = self.out();
        let out = &mut out[..n * rows];
        match &self.mat {
            Mat::Quant { k, linear } => match linear {
                Some(linear) if !exact && n >= dense_prefill_rows() => {
                    // Prefill without the AVX-512 kernels: the Linear's dense GEMM on the
                    // dequantized weight.
                    let t = Tensor::from_slice(x, (n, k.cols()), &Device::Cpu)?;
                    let y = linear.forward(&t)?.flatten_all()?.to_vec1::<f32>()?;
                    out.copy_from_slice(&y);
                }
                _ => k.matmul(x, n, out),
            },
            Mat::Amx(d) => {
                // The bias is added in the product, while each block of sums is in cache.
                d.matmul(x, n, self.bias.as_deref(), out);
                return Ok(());
            }
            Mat::Mxfp4(m) => m.matmul(&x[..n * m.cols()], n, out),
            Mat::F32 { w, cols, .. } => {
                if exact || n <= F32_DOT_ROWS {
                    for (xs, os) in x[..n * cols].chunks(F32_DOT_ROWS * cols).zip(out.chunks_mut(F32_DOT_ROWS * rows)) {
                        kernels::matmul_f32(w, rows, *cols, xs, xs.len() / cols, os);
                    }
                } else {
                    kernels::matmul_f32(w, rows, *cols, x, n, out);
                }
            }
        }
        self.add_bias(out);
        Ok(())
    }
}

/// Several linear layers of the same input (q, k, v or gate, up) in one dispatch on the
/// kernel pool when they are all quantized; the results are those of separate [`Lin::run`]
/// calls.
fn run_group(lins: &[&Lin], x: &[f32], n: usize, exact: bool, outs: &mut [&mut [f32]]) -> Result<()> {
    let first = lins.first().and_then(|l| l.quant());
    let all_quant = lins.iter().all(|l| l.quant().is_some());
    let Some(first) = first.filter(|_| all_quant && (exact || n < dense_prefill_rows())) else {
        for (l, o) in lins.iter().zip(outs.iter_mut()) {
            l.run(x, n, exact, o)?;
        }
        return Ok(());
    };
    // Fixed arrays: no allocation per token.
    let k = lins.len().min(kernels::MAX_GROUP);
    let mats: [&QMatrix; kernels::MAX_GROUP] = std::array::from_fn(|i| lins[i.min(k - 1)].quant().unwrap_or(first));
    let mut parts: [&mut [f32]; kernels::MAX_GROUP] = Default::default();
    for (p, (o, l)) in parts.iter_mut().zip(outs.iter_mut().zip(lins)) {
        *p = &mut o[..n * l.out()];
    }
    kernels::matmul_group(&mats[..k], x, n, &mut parts[..k]);
    for (l, o) in lins.iter().zip(parts.iter_mut()) {
        l.add_bias(o);
    }
    Ok(())
}

/// [`run_group`] of the rows `prep` makes in `x` (`prep(r, rows)` writes rows `r`), fused
/// with the activations' quantization when the group takes [`kernels::matmul_group_prep`],
/// else made first on this thread. Either way the results are those of `prep(0..n, x)`
/// followed by [`run_group`].
fn run_group_prep(lins: &[&Lin], x: &mut [f32], n: usize, exact: bool, outs: &mut [&mut [f32]], prep: kernels::Prep<'_>) -> Result<()> {
    let first = lins.first().and_then(|l| l.quant());
    let all_quant = lins.iter().all(|l| l.quant().is_some());
    let Some(first) = first.filter(|_| all_quant && (exact || n < dense_prefill_rows())) else {
        prep(0..n, x);
        return run_group(lins, x, n, exact, outs);
    };
    let k = lins.len().min(kernels::MAX_GROUP);
    let mats: [&QMatrix; kernels::MAX_GROUP] = std::array::from_fn(|i| lins[i.min(k - 1)].quant().unwrap_or(first));
    let mut parts: [&mut [f32]; kernels::MAX_GROUP] = Default::default();
    for (p, (o, l)) in parts.iter_mut().zip(outs.iter_mut().zip(lins)) {
        *p = &mut o[..n * l.out()];
    }
    kernels::matmul_group_prep(&mats[..k], x, n, &mut parts[..k], prep);
    for (l, o) in lins.iter().zip(parts.iter_mut()) {
        l.add_bias(o);
    }
    Ok(())
}

/// The token embedding rows.
pub(crate) enum Embed {
    Quant(QMatrix),
    F32(Vec<f32>),
    /// f16 bits (an F16 tensor) or the upper half of f32 bits (BF16), `[vocab, hidden]`.
    F16(Vec<u16>),
    Bf16(Vec<u16>),
}

impl Embed {
    /// The embedding matrix from a loaded `[vocab, hidden]` weight; the matrix itself too, for a
    /// tied output layer.
    pub(crate) fn from_weight(w: &Weight, name: &str) -> Result<Self> {
        let q = match w {
            Weight::Quantized(q) => q,
            Weight::Dense(t) => {
                let flat = t.flatten_all()?;
                return Ok(match t.dtype() {
                    DType::F16 => Self::F16(flat.to_vec1::<half::f16>()?.into_iter().map(|x| x.to_bits()).collect()),
                    DType::BF16 => Self::Bf16(flat.to_vec1::<half::bf16>()?.into_iter().map(|x| x.to_bits()).collect()),
                    _ => Self::F32(flat.to_dtype(DType::F32)?.to_vec1::<f32>()?),
                });
            }
        };
        if let Some(k) = QMatrix::from_qtensor(q) {
            return Ok(Self::Quant(k));
        }
        match q.dtype() {
            GgmlDType::F16 => Self::from_weight(&Weight::Dense(q.dequantize_f16(&Device::Cpu)?), name),
            GgmlDType::BF16 => Self::from_weight(&Weight::Dense(q.dequantize(&Device::Cpu)?.to_dtype(DType::BF16)?), name),
            GgmlDType::F32 => Self::from_weight(&Weight::Dense(q.dequantize(&Device::Cpu)?), name),
            _ => match Mat::from_weight(Weight::Quantized(q.clone()), name)? {
                Mat::Quant { k, .. } => Ok(Self::Quant(k)),
                _ => Err(Error::Internal("a requantized embedding is not quantized")),
            },
        }
    }

    /// Row `t` (`out.len()` values).
    fn row(&self, t: usize, out: &mut [f32]) {
        let h = out.len();
        match self {
            Self::Quant(k) => k.dequantize_row(t, out),
            Self::F32(v) => out.copy_from_slice(&v[t * h..(t + 1) * h]),
            Self::F16(v) => {
                for (o, &b) in out.iter_mut().zip(&v[t * h..(t + 1) * h]) {
                    *o = half::f16::from_bits(b).to_f32();
                }
            }
            Self::Bf16(v) => {
                for (o, &b) in out.iter_mut().zip(&v[t * h..(t + 1) * h]) {
                    *o = f32::from_bits((b as u32) << 16);
                }
            }
        }
    }

    fn rows(&self, h: usize) -> usize {
        match self {
            Self::Quant(k) => k.rows(),
            Self::F32(v) => v.len() / h.max(1),
            Self::F16(v) | Self::Bf16(v) => v.len() / h.max(1),
        }
    }
}

/// An output layer computing the logits of the first `head.rows()` tokens and of `extra`
/// (the others are `-inf`).
struct Restricted {
    head: QMatrix,
    extra_ids: Vec<usize>,
    extra: Option<QMatrix>,
    tmp: Vec<f32>,
}

fn grow<T: Default + Clone>(v: &mut Vec<T>, n: usize) {
    if v.len() < n {
        v.resize(n, T::default());
    }
}

/// RMSNorm of each `w.len()`-wide row of `x`, in place.
fn rms_norm_inplace(x: &mut [f32], w: &[f32], eps: f32) {
    let n = w.len();
    for xr in x.chunks_exact_mut(n) {
        let ss = kernels::dot_f32(xr, xr);
        let scale = 1.0 / (ss / n as f32 + eps).sqrt();
        for (xv, &wv) in xr.iter_mut().zip(w) {
            *xv = *xv * scale * wv;
        }
    }
}

/// GeGLU: `g = gelu_tanh(g) * u`, GELU's tanh approximation computed in f64 and rounded
/// once, so the result does not depend on the platform's f32 tanh.
fn gelu_tanh_mul(g: &mut [f32], u: &[f32]) {
    const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
    for (x, &u) in g.iter_mut().zip(u) {
        let v = *x as f64;
        let gelu = 0.5 * v * (1.0 + (SQRT_2_OVER_PI * v * (1.0 + 0.044715 * v * v)).tanh());
        *x = (gelu * u as f64) as f32;
    }
}

fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let n = w.len();
    for (xr, or) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let ss = kernels::dot_f32(xr, xr);
        let scale = 1.0 / (ss / n as f32 + eps).sqrt();
        for ((o, &xv), &wv) in or.iter_mut().zip(xr).zip(w) {
            *o = xv * scale * wv;
        }
    }
}

/// The CPU backend: activations in `Vec<f32>`, the kernels of `sapient_tensor::kernels`
/// threaded over its pool, the KV cache in f16.
pub(crate) struct Cpu {
    dims: Dims,
    /// `[max_seq][rope_dim / 2]`
    cos: Vec<f32>,
    sin: Vec<f32>,
    /// The sliding-window layers' tables, when their RoPE base differs.
    rope_swa: Option<(Vec<f32>, Vec<f32>)>,
    /// Logits for only some tokens (see [`Backend::restrict_logits`]).
    restricted: Option<Restricted>,
    /// Attention's work units per sequence.
    units: Vec<usize>,
}

type Tables = (Vec<f32>, Vec<f32>);

impl Cpu {
    /// A backend for a model of shapes `dims`, with its RoPE tables (cosines and sines,
    /// `[position][rope_dim / 2]`) and those of the sliding-window layers when they differ.
    pub(crate) fn new(dims: Dims, rope: Tables, rope_swa: Option<Tables>) -> Result<Self> {
        let half = dims.rope_dim / 2;
        let (cos, sin) = rope;
        if cos.len() != sin.len() || half == 0 || !cos.len().is_multiple_of(half) {
            return Err(Error::Internal("rope tables do not match the rope dimension"));
        }
        if let Some((c, s)) = &rope_swa {
            if c.len() != cos.len() || s.len() != sin.len() {
                return Err(Error::Internal("the sliding-window rope tables do not match the others"));
            }
        }
        Ok(Self { dims, cos, sin, rope_swa, restricted: None, units: Vec::new() })
    }
}

impl Backend for Cpu {
    type Buf = Vec<f32>;
    type Lin = Lin;
    type Vector = Vec<f32>;
    type Embed = Embed;
    type KvStore = HostKv;

    fn linear(&self, w: Weight, bias: Option<Vec<f32>>, name: &str) -> Result<Lin> {
        Lin::new(Mat::from_weight(w, name)?, bias)
    }
    fn linear_mapped(&self, ty: GgmlType, rows: usize, cols: usize, blocks: MappedBytes, bias: Option<Vec<f32>>, name: &str) -> Result<Option<Lin>> {
        let bad = |e: sapient_tensor::Error| Error::Config(format!("{name}: {e}"));
        // Never packed nor copied: the kernels read ggml's layout from the file's pages (and
        // without the AVX-512 kernels prefill keeps the quantized products, no dense copy).
        let mat = match ty {
            GgmlType::MXFP4 => Mat::Mxfp4(kernels::Mxfp4Matrix::from_mapped(rows, cols, blocks).map_err(bad)?),
            _ => match kernels::quant::QType::from_ggml(ty) {
                Some(q) => Mat::Quant { k: QMatrix::from_mapped(q, rows, cols, blocks).map_err(bad)?, linear: None },
                None => return Ok(None),
            },
        };
        Lin::new(mat, bias).map(Some)
    }
    fn vector(&self, v: Vec<f32>) -> Vec<f32> {
        v
    }
    fn embedding(&self, w: &Weight, name: &str) -> Result<Embed> {
        Embed::from_weight(w, name)
    }
    fn lora_rows(&mut self, x: &Vec<f32>, in_w: usize, out: &mut Vec<f32>, out_w: usize, work: &[LoraWork<'_>]) {
        crate::lora::low_rank_add(x, in_w, out, out_w, work);
    }
    fn lin_shape(l: &Lin) -> (usize, usize) {
        (l.out(), l.input())
    }
    fn vector_len(v: &Vec<f32>) -> usize {
        v.len()
    }
    fn embed_rows(e: &Embed, width: usize) -> usize {
        e.rows(width)
    }
    fn loaded(&self, lins: Vec<&mut Lin>, embed: &mut Embed) {
        let mut w: Vec<&mut QMatrix> = lins
            .into_iter()
            .filter_map(|l| match &mut l.mat {
                Mat::Quant { k, .. } => Some(k),
                _ => None,
            })
            .collect();
        if let Embed::Quant(e) = embed {
            w.push(e);
        }
        kernels::pack_for_lanes(&mut w);
        let w: Vec<&QMatrix> = w.into_iter().map(|m| &*m).collect();
        kernels::huge_pages_for(&w);
    }
    fn reserve(b: &mut Vec<f32>, len: usize) {
        grow(b, len);
    }

    fn embed(&mut self, e: &Embed, tokens: impl Iterator<Item = u32>, width: usize, out: &mut Vec<f32>) {
        for (row, t) in tokens.enumerate() {
            e.row(t as usize, &mut out[row * width..(row + 1) * width]);
        }
    }
    fn linear_rows(&mut self, l: &Lin, x: &Vec<f32>, n: usize, exact: bool, out: &mut Vec<f32>) -> Result<()> {
        l.run(&x[..n * l.input()], n, exact, out)
    }
    #[allow(clippy::too_many_arguments)]
    fn add_norm_linear_group(&mut self, x: &mut Vec<f32>, y: Option<&Vec<f32>>, w: &Vec<f32>, eps: f32, xn: &mut Vec<f32>, ls: &[&Lin], n: usize, exact: bool, outs: &mut [&mut Vec<f32>]) -> Result<()> {
        let h = w.len();
        if ls.is_empty() || h == 0 {
            return Ok(());
        }
        assert!(x.len() >= n * h && xn.len() >= n * h && y.is_none_or(|y| y.len() >= n * h), "add_norm_linear_group: buffers shorter than the rows");
        let xp = OutPtr(x.as_mut_ptr());
        // Each row range: the residual add and the norm, by the thread that quantizes it.
        let prep = |r: std::ops::Range<usize>, rows: &mut [f32]| {
            // SAFETY: rows `r` of `x` (checked long enough above, exclusively borrowed for the
            // call); `prep` gets each row once, so no other thread touches them.
            let xr = unsafe { std::slice::from_raw_parts_mut(xp.ptr().add(r.start * h), r.len() * h) };
            if let Some(y) = y {
                for (a, b) in xr.iter_mut().zip(&y[r.start * h..r.end * h]) {
                    *a += b;
                }
            }
            rms_norm(xr, w, eps, rows);
        };
        let mut parts: [&mut [f32]; kernels::MAX_GROUP] = Default::default();
        for (p, o) in parts.iter_mut().zip(outs.iter_mut()) {
            *p = o.as_mut_slice();
        }
        run_group_prep(ls, &mut xn[..n * h], n, exact, &mut parts[..ls.len().min(kernels::MAX_GROUP)], &prep)
    }
    fn moe(&mut self, experts: &Experts<Lin>, xn: &Vec<f32>, logits: &Vec<f32>, n: usize, exact: bool, out: &mut Vec<f32>) -> Result<()> {
        let h = self.dims.hidden;
        crate::moe::forward(experts, xn, logits, n, h, out, &|lins, x, m, outs| run_group(lins, x, m, exact, outs))
    }
    #[allow(clippy::too_many_arguments)]
    fn glu_linear(&mut self, act: Activation, g: &mut Vec<f32>, u: &Vec<f32>, width: usize, l: &Lin, n: usize, exact: bool, out: &mut Vec<f32>) -> Result<()> {
        let u = &u[..n * width];
        // Each row range's activation by the thread that quantizes it.
        let prep = |r: std::ops::Range<usize>, rows: &mut [f32]| {
            let u = &u[r.start * width..r.end * width];
            match act {
                Activation::Silu => kernels::silu_mul_range(rows, u),
                Activation::GeluTanh => gelu_tanh_mul(rows, u),
            }
        };
        run_group_prep(&[l], &mut g[..n * width], n, exact, &mut [&mut out[..]], &prep)
    }
    fn rope_write_kv(&mut self, kv: &mut HostKv, layer: usize, q: &mut Vec<f32>, k: &mut Vec<f32>, v: &Vec<f32>, step: &Step, table: RopeTable) {
        let d = &self.dims;
        let (q_out, kv_out) = (d.heads * d.head_dim, d.kv_heads * d.head_dim);
        let (cos, sin) = match (&self.rope_swa, table) {
            (Some((c, s)), RopeTable::SlidingWindow) => (c, s),
            _ => (&self.cos, &self.sin),
        };
        let n = step.pos.len();
        assert!(q.len() >= n * q_out && k.len() >= n * kv_out, "rope_write_kv: buffers shorter than the rows");
        let qp = OutPtr(q.as_mut_ptr());
        // The rotation of each range's queries and keys, in the job that writes its keys.
        let rot = |r: std::ops::Range<usize>, kr: &mut [f32]| {
            // SAFETY: rows `r` of `q` (checked long enough above); each range is given to
            // one thread only.
            let qr = unsafe { std::slice::from_raw_parts_mut(qp.ptr().add(r.start * q_out), r.len() * q_out) };
            rope_rows(d, cos, sin, qr, q_out, &step.pos[r.start..]);
            rope_rows(d, cos, sin, kr, kv_out, &step.pos[r.start..]);
        };
        let per = kernels::rows_per_thread(n, n * (q_out + kv_out));
        write_kv(kv, layer, kv_out, k, v, step, per, &rot);
    }
    fn split_rows(&mut self, x: &Vec<f32>, n: usize, outs: &mut [(&mut Vec<f32>, usize)]) {
        let w: usize = outs.iter().map(|o| o.1).sum();
        for i in 0..n {
            let mut at = i * w;
            for (o, width) in outs.iter_mut() {
                o[i * *width..(i + 1) * *width].copy_from_slice(&x[at..at + *width]);
                at += *width;
            }
        }
    }
    fn rms_norm_in_place(&mut self, x: &mut Vec<f32>, w: &Vec<f32>, len: usize, eps: f32) {
        rms_norm_inplace(&mut x[..len], w, eps);
    }
    fn rms_norm_rows(&mut self, x: &Vec<f32>, rows: &[usize], w: &Vec<f32>, eps: f32, out: &mut Vec<f32>) {
        let h = w.len();
        for (j, &r) in rows.iter().enumerate() {
            rms_norm(&x[r * h..(r + 1) * h], w, eps, &mut out[j * h..(j + 1) * h]);
        }
    }
    fn scale(&mut self, x: &mut Vec<f32>, len: usize, s: f32) {
        for v in &mut x[..len] {
            *v *= s;
        }
    }
    fn add(&mut self, x: &mut Vec<f32>, y: &Vec<f32>, len: usize) {
        for (x, y) in x[..len].iter_mut().zip(&y[..len]) {
            *x += y;
        }
    }
    #[allow(clippy::too_many_arguments)]
    fn attention(&mut self, kv: &HostKv, layer: usize, window: Option<usize>, sinks: Option<&Vec<f32>>, q: &Vec<f32>, step: &Step, out: &mut Vec<f32>) {
        let len = step.pos.len() * self.dims.heads * self.dims.head_dim;
        attention(&self.dims, window, sinks.map(|s| s.as_slice()), &q[..len], kv.layer(layer), &step.segs, &step.tabs, kv.block_size(), &mut self.units, &mut out[..len]);
    }
    fn logits(&mut self, output: &Lin, x: &Vec<f32>, rows: usize, exact: bool, softcap: Option<f32>, logits: &mut Vec<f32>) -> Result<()> {
        let (vocab, h) = (output.out(), output.input());
        // The caller's buffer, reused call after call: a fresh vector of this size (0.6 MB a
        // row for a 152k vocabulary) comes from new zeroed pages every time, which cost a
        // decode step of Qwen2.5-1.5B 7% and a 5-row verification 18%.
        logits.resize(rows * vocab, 0.0);
        if rows == 0 {
            return Ok(());
        }
        let x = &x[..rows * h];
        match &mut self.restricted {
            None => output.run(x, rows, exact, logits)?,
            Some(rs) => {
                logits.fill(f32::NEG_INFINITY);
                let n = rs.head.rows();
                if n > 0 {
                    grow(&mut rs.tmp, rows * n);
                    rs.head.matmul(x, rows, &mut rs.tmp[..rows * n]);
                    for (dst, src) in logits.chunks_exact_mut(vocab).zip(rs.tmp.chunks_exact(n)) {
                        dst[..n].copy_from_slice(src);
                    }
                }
                if let Some(e) = &rs.extra {
                    let ne = e.rows();
                    grow(&mut rs.tmp, rows * ne);
                    e.matmul(x, rows, &mut rs.tmp[..rows * ne]);
                    for (dst, src) in logits.chunks_exact_mut(vocab).zip(rs.tmp.chunks_exact(ne)) {
                        for (&id, &v) in rs.extra_ids.iter().zip(src) {
                            dst[id] = v;
                        }
                    }
                }
                output.add_bias(logits);
            }
        }
        if let Some(cap) = softcap {
            // Restricted outputs stay -inf.
            for l in logits[..rows * vocab].iter_mut().filter(|l| l.is_finite()) {
                *l = cap * (*l / cap).tanh();
            }
        }
        Ok(())
    }
    fn split_query_gate(&mut self, qg: &Vec<f32>, n: usize, heads: usize, head_dim: usize, q: &mut Vec<f32>, gate: &mut Vec<f32>) {
        deltanet::split_query_gate(qg, n, heads, head_dim, q, gate);
    }
    fn mul_sigmoid(&mut self, x: &mut Vec<f32>, g: &Vec<f32>, len: usize) {
        deltanet::mul_sigmoid(&mut x[..len], &g[..len]);
    }
    fn delta_net(&mut self, kv: &mut HostKv, w: &DeltaVectors<Vec<f32>>, p: DeltaInputs<'_, Vec<f32>>, step: &Step, out: &mut Vec<f32>) -> Result<()> {
        deltanet::delta_net_cpu(kv, w, p, step, self.dims.eps, out)
    }
    fn concat_rows(&mut self, a: &Vec<f32>, wa: usize, b: &Vec<f32>, wb: usize, n: usize, out: &mut Vec<f32>) {
        for (r, o) in out[..n * (wa + wb)].chunks_exact_mut(wa + wb).enumerate() {
            o[..wa].copy_from_slice(&a[r * wa..(r + 1) * wa]);
            o[wa..].copy_from_slice(&b[r * wb..(r + 1) * wb]);
        }
    }
    /// A draft model for speculative decoding spends a third of its time on a 152k-token
    /// output layer, most of whose tokens are rare. Only a quantized output layer restricts.
    fn restrict_logits(&mut self, output: &Lin, keep: Option<(usize, &[u32])>) -> Result<bool> {
        self.restricted = match keep {
            Some((first, extra)) if first < output.out() => {
                // Dense output layers compute every logit.
                let Some(k) = output.quant() else {
                    return Ok(false);
                };
                let mut ids: Vec<usize> = extra.iter().map(|&t| t as usize).filter(|&t| t >= first && t < k.rows()).collect();
                ids.sort_unstable();
                ids.dedup();
                let extra = if ids.is_empty() { None } else { Some(k.gather_rows(&ids)?) };
                Some(Restricted { head: k.head(first), extra_ids: ids, extra, tmp: Vec::new() })
            }
            _ => None,
        };
        Ok(self.restricted.is_some())
    }
}

/// The attention kernels take keys 16 positions at a time, so blocks hold a multiple of 16.
pub(crate) fn check_block_size(bs: usize) -> Result<()> {
    if !bs.is_multiple_of(16) {
        return Err(Error::Config(format!("the KV cache's block size must be a multiple of 16 (it is {bs})")));
    }
    Ok(())
}

/// RoPE on `rows` (`width` values each: heads of `d.head_dim`) at positions `pos`.
fn rope_rows(d: &Dims, cos: &[f32], sin: &[f32], rows: &mut [f32], width: usize, pos: &[usize]) {
    let half = d.rope_dim / 2;
    for (row, &pos) in rows.chunks_exact_mut(width).zip(pos) {
        let cos = &cos[pos * half..(pos + 1) * half];
        let sin = &sin[pos * half..(pos + 1) * half];
        for h in row.chunks_exact_mut(d.head_dim) {
            if d.interleaved {
                for i in 0..half {
                    let (a, b) = (h[2 * i], h[2 * i + 1]);
                    h[2 * i] = a * cos[i] - b * sin[i];
                    h[2 * i + 1] = a * sin[i] + b * cos[i];
                }
            } else {
                for i in 0..half {
                    let (a, b) = (h[i], h[i + half]);
                    h[i] = a * cos[i] - b * sin[i];
                    h[i + half] = b * cos[i] + a * sin[i];
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Q3_K weight (no kernel) is requantized to Q8_0 at load: the product is that of the
    /// Q3_K values (dequantized, in f64) to Q8_0's precision.
    #[test]
    fn formats_without_a_kernel_are_requantized_to_q8_0() -> Result<()> {
        let (rows, cols, m) = (8, 512, 3);
        let w: Vec<f32> = (0..rows * cols).map(|i| ((i * 7919 % 1000) as f32 / 1000.0 - 0.5) * 0.2).collect();
        let t = Tensor::from_vec(w, (rows, cols), &Device::Cpu)?;
        let q3 = Arc::new(QTensor::quantize(&t, GgmlDType::Q3K)?);
        let exact = q3.dequantize(&Device::Cpu)?.to_vec2::<f32>()?;
        let lin = Lin::new(Mat::from_weight(Weight::Quantized(q3), "blk.0.attn_q.weight")?, None)?;
        assert!(matches!(&lin.mat, Mat::Quant { k, .. } if k.qtype() == kernels::quant::QType::Q8_0));
        let x: Vec<f32> = (0..m * cols).map(|i| (i * 104_729 % 997) as f32 / 997.0 - 0.5).collect();
        let mut out = vec![0f32; m * rows];
        lin.run(&x, m, true, &mut out)?;
        for i in 0..m {
            for (j, wr) in exact.iter().enumerate() {
                let r: f64 = wr.iter().zip(&x[i * cols..(i + 1) * cols]).map(|(&a, &b)| a as f64 * b as f64).sum();
                // Q8_0 weights and 8-bit activations: well under 1% of the row's scale here.
                assert!((out[i * rows + j] as f64 - r).abs() < 0.02, "({i}, {j}): {} vs {r}", out[i * rows + j]);
            }
        }
        Ok(())
    }
}
