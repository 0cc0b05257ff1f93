//! The CPU forward pass on plain buffers.
//!
//! On the CPU a decode step is a few hundred small operations; going through candle costs an
//! allocation and a dispatch for each, which is several milliseconds per token for small
//! models. This path runs the same transformer on preallocated f32 buffers with the
//! quantized kernels of `sapient_tensor::kernels` (threaded over the kernel pool), RMSNorm,
//! RoPE, SwiGLU and attention written out directly, over the paged KV cache (`kv.rs`) in
//! f16 as llama.cpp keeps it: values `[slot][kv head][head dim]`, keys transposed per block
//! (`[block][kv head x head dim][position in block]`) so that the attention kernels score 16
//! positions per vector without horizontal sums.
//!
//! Short batches (decode, speculative verification) use the quantized kernels, whose results
//! do not depend on how rows are batched; attention's arithmetic is per row too (the queries
//! of a head group, and neighbouring rows, share each key read). So a batch of tokens gives
//! bit-identical logits to the same tokens fed one at a time. With the AVX-512 kernels long
//! batches (prefill) use them too, so the whole forward is row-invariant: a reused prefix
//! gives the logits a fresh prompt gives. Without AVX-512, batches of 32 tokens or more use a
//! dequantized f32 GEMM through the layer's `Linear` (`weights::dense_prefill_rows`).

use candle_core::{Device, Module, Tensor};
use sapient_tensor::kernels::{self, pool, QMatrix, SendPtr as OutPtr};
use sapient_tensor::weights::dense_prefill_rows;
use sapient_tensor::Linear;
use std::cell::RefCell;

use crate::config::Activation;
use crate::kv::KvCache;
use crate::{BatchSeq, Error, Logits, Result};

/// One linear layer as the CPU path uses it.
pub(crate) struct Lin {
    pub(crate) linear: Linear,
    kernel: QMatrix,
    bias: Option<Vec<f32>>,
}

impl Lin {
    pub(crate) fn new(linear: &Linear) -> Result<Option<Self>> {
        let Some(kernel) = linear.kernel().cloned() else {
            return Ok(None);
        };
        let bias = match linear.bias() {
            Some(b) => Some(b.to_dtype(candle_core::DType::F32)?.flatten_all()?.to_vec1::<f32>()?),
            None => None,
        };
        Ok(Some(Self {
            linear: linear.clone(),
            kernel,
            bias,
        }))
    }
    pub(crate) fn out(&self) -> usize {
        self.kernel.rows()
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

    /// `out = x @ W^T + b` for `n` rows. `exact`: always the quantized kernels, whose rows
    /// do not depend on the batch (else long batches may take the dense GEMM).
    fn run(&self, x: &[f32], n: usize, exact: bool, out: &mut [f32]) -> Result<()> {
        let rows = self.kernel.rows();
        if exact || n < dense_prefill_rows() {
            self.kernel.matmul(x, n, &mut out[..n * rows]);
            self.add_bias(&mut out[..n * rows]);
        } else {
            // Prefill: the Linear's dense GEMM path (dequantized weight), bias included.
            let t = Tensor::from_slice(x, (n, self.kernel.cols()), &Device::Cpu)?;
            let y = self.linear.forward(&t)?.flatten_all()?.to_vec1::<f32>()?;
            out[..n * rows].copy_from_slice(&y);
        }
        Ok(())
    }
}

/// Several linear layers of the same input (q, k, v or gate, up) in one dispatch on the
/// kernel pool; the results are those of separate [`Lin::run`] calls.
fn run_group(lins: &[&Lin], x: &[f32], n: usize, exact: bool, outs: &mut [&mut [f32]]) -> Result<()> {
    if !exact && n >= dense_prefill_rows() {
        for (l, o) in lins.iter().zip(outs.iter_mut()) {
            l.run(x, n, false, o)?;
        }
        return Ok(());
    }
    // Fixed arrays: no allocation per token.
    let k = lins.len().min(kernels::MAX_GROUP);
    let mats: [&QMatrix; kernels::MAX_GROUP] = std::array::from_fn(|i| &lins[i.min(k - 1)].kernel);
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

// One per layer, built at load: the size of the separate variant does not matter.
#[allow(clippy::large_enum_variant)]
pub(crate) enum LinQkv {
    Separate(Lin, Lin, Lin),
    Fused(Lin),
}

pub(crate) enum LinGateUp {
    Separate(Lin, Lin),
    Fused(Lin),
}

pub(crate) struct CpuLayer {
    pub(crate) attn_norm: Vec<f32>,
    pub(crate) ffn_norm: Vec<f32>,
    pub(crate) qkv: LinQkv,
    pub(crate) o: Lin,
    pub(crate) gate_up: LinGateUp,
    pub(crate) down: Lin,
    pub(crate) extra: LayerExtra,
}

/// What a layer has beyond the LLaMA layout (Gemma 3, Qwen3).
#[derive(Default)]
pub(crate) struct LayerExtra {
    /// Per-head RMSNorm weights of queries and keys (`head_dim` values each).
    pub(crate) q_norm: Option<Vec<f32>>,
    pub(crate) k_norm: Option<Vec<f32>>,
    /// RMSNorm of the attention and MLP outputs before the residual adds them.
    pub(crate) post_attn_norm: Option<Vec<f32>>,
    pub(crate) post_ffn_norm: Option<Vec<f32>>,
    /// This layer's sliding window (`None`: it sees every earlier position).
    pub(crate) window: Option<usize>,
    /// This layer uses the second RoPE table (the sliding-window layers' base).
    pub(crate) rope_swa: bool,
}

impl CpuLayer {
    pub(crate) fn new(attn_norm: Vec<f32>, ffn_norm: Vec<f32>, qkv: LinQkv, o: Lin, gate_up: LinGateUp, down: Lin, extra: LayerExtra) -> Self {
        Self {
            attn_norm,
            ffn_norm,
            qkv,
            o,
            gate_up,
            down,
            extra,
        }
    }
}

/// Shapes and constants of the forward pass.
pub(crate) struct Dims {
    pub hidden: usize,
    pub inter: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub rope_dim: usize,
    pub interleaved: bool,
    pub eps: f32,
    pub vocab: usize,
    /// Attention scores scale.
    pub attn_scale: f32,
    /// Embedding rows multiplied by this (Gemma).
    pub embed_scale: Option<f32>,
    pub activation: Activation,
    /// Final logits become `cap * tanh(logits / cap)`.
    pub softcap: Option<f32>,
}

pub(crate) struct CpuModel {
    pub(crate) dims: Dims,
    pub(crate) layers: Vec<CpuLayer>,
    pub(crate) norm: Vec<f32>,
    pub(crate) output: Lin,
    /// Embedding rows: the kernel matrix when its format has one, else candle's.
    pub(crate) embed: Option<QMatrix>,
    /// `[max_seq][rope_dim / 2]`
    pub(crate) cos: Vec<f32>,
    pub(crate) sin: Vec<f32>,
    /// The sliding-window layers' tables, when their RoPE base differs.
    pub(crate) rope_swa: Option<(Vec<f32>, Vec<f32>)>,
    buf: Bufs,
    /// Logits for only some tokens (see [`CpuModel::restrict_output`]).
    restricted: Option<Restricted>,
}

/// An output layer computing the logits of the first `head.rows()` tokens and of `extra`
/// (the others are `-inf`).
struct Restricted {
    head: QMatrix,
    extra_ids: Vec<usize>,
    extra: Option<QMatrix>,
    tmp: Vec<f32>,
}

#[derive(Default)]
struct Bufs {
    x: Vec<f32>,
    xn: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    qkv: Vec<f32>,
    att: Vec<f32>,
    y: Vec<f32>,
    g: Vec<f32>,
    u: Vec<f32>,
    gu: Vec<f32>,
    /// Per row: position and cache slot.
    pos: Vec<usize>,
    slot: Vec<usize>,
    /// Per sequence of the batch, and their block tables one after another.
    segs: Vec<Seg>,
    tabs: Vec<u32>,
    /// Rows whose logits are wanted.
    out_rows: Vec<usize>,
    units: Vec<usize>,
    /// This step's keys as f16 bits, before they go to their slots.
    kh: Vec<u16>,
}

/// One sequence's rows in a batch: rows `row0..row0 + n` at positions `start..start + n`,
/// its block table at `tabs[tab0..tab0 + tabn]`.
#[derive(Clone, Copy)]
struct Seg {
    row0: usize,
    n: usize,
    start: usize,
    tab0: usize,
    tabn: usize,
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

impl CpuModel {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        dims: Dims,
        layers: Vec<CpuLayer>,
        norm: Vec<f32>,
        output: Lin,
        embed: Option<QMatrix>,
        cos: Vec<f32>,
        sin: Vec<f32>,
        rope_swa: Option<(Vec<f32>, Vec<f32>)>,
    ) -> Self {
        Self {
            dims,
            layers,
            norm,
            output,
            embed,
            cos,
            sin,
            rope_swa,
            buf: Bufs::default(),
            restricted: None,
        }
    }

    /// Compute logits only for tokens `0..first` and `extra` (the rest come out `-inf`), or
    /// for all again with `None`: a draft model for speculative decoding spends a third of its
    /// time on a 152k-token output layer, most of whose tokens are rare.
    /// Returns whether the output is restricted now.
    pub(crate) fn restrict_output(&mut self, keep: Option<(usize, &[u32])>) -> Result<bool> {
        self.restricted = match keep {
            Some((first, extra)) if first < self.output.out() => {
                let k = &self.output.kernel;
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

    fn rope(&self, x: &mut [f32], pos: usize, swa: bool) {
        let d = &self.dims;
        let half = d.rope_dim / 2;
        let (cos, sin) = match (&self.rope_swa, swa) {
            (Some((c, s)), true) => (c, s),
            _ => (&self.cos, &self.sin),
        };
        let cos = &cos[pos * half..(pos + 1) * half];
        let sin = &sin[pos * half..(pos + 1) * half];
        for h in x.chunks_exact_mut(d.head_dim) {
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

    /// Run a batch: for each sequence, its `tokens` at the positions after what `kv` holds
    /// for it (the caller has reserved the slots). Writes the logits of the rows each
    /// sequence asks for, in order, into `logits` (`rows x vocab`) and returns the number of
    /// rows. `exact` keeps every linear layer on the quantized kernels, so each row's result
    /// does not depend on the rest of the batch.
    pub(crate) fn forward_batch(
        &mut self,
        kv: &mut KvCache,
        batch: &[BatchSeq<'_>],
        exact: bool,
        embed_fallback: &dyn Fn(&[u32]) -> Result<Vec<f32>>,
        logits: &mut Vec<f32>,
    ) -> Result<usize> {
        let n: usize = batch.iter().map(|s| s.tokens.len()).sum();
        let (h, nh, nkv, hd) = (self.dims.hidden, self.dims.heads, self.dims.kv_heads, self.dims.head_dim);
        let (q_out, kv_out) = (nh * hd, nkv * hd);
        if kv.width() != kv_out || kv.num_layers() != self.layers.len() {
            return Err(Error::Internal("the KV cache was made for another model"));
        }
        check_block_size(kv.block_size())?;
        let inter = self.dims.inter;
        let eps = self.dims.eps;
        let mut b = std::mem::take(&mut self.buf);
        grow(&mut b.x, n * h);
        grow(&mut b.xn, n * h);
        grow(&mut b.q, n * q_out);
        grow(&mut b.k, n * kv_out);
        grow(&mut b.v, n * kv_out);
        grow(&mut b.att, n * q_out);
        grow(&mut b.y, n * h);
        grow(&mut b.g, n * inter);
        grow(&mut b.u, n * inter);
        b.pos.clear();
        b.slot.clear();
        b.segs.clear();
        b.tabs.clear();
        b.out_rows.clear();
        let mut filled = Ok(());
        for s in batch {
            let (start, blocks) = match (kv.len(s.seq), kv.blocks(s.seq)) {
                (Ok(l), Ok(bl)) => (l, bl),
                (Err(e), _) | (_, Err(e)) => {
                    filled = Err(e);
                    break;
                }
            };
            let row0 = b.pos.len();
            let m = s.tokens.len();
            if (start + m).div_ceil(kv.block_size()) > blocks.len() {
                filled = Err(Error::Internal("forward_batch on positions that were not reserved"));
                break;
            }
            b.segs.push(Seg { row0, n: m, start, tab0: b.tabs.len(), tabn: blocks.len() });
            b.tabs.extend_from_slice(blocks);
            for i in 0..m {
                b.pos.push(start + i);
                b.slot.push(kv.slot(blocks, start + i));
            }
            match s.logits {
                None => {}
                Some(Logits::Last) => b.out_rows.push(row0 + m - 1),
                Some(Logits::All) => b.out_rows.extend(row0..row0 + m),
            }
        }
        if let Err(e) = filled {
            self.buf = b;
            return Err(e);
        }
        // Embeddings.
        let mut row = 0;
        for s in batch {
            match &self.embed {
                Some(e) => {
                    for &t in s.tokens {
                        e.dequantize_row(t as usize, &mut b.x[row * h..(row + 1) * h]);
                        row += 1;
                    }
                }
                None => match embed_fallback(s.tokens) {
                    Ok(rows) => {
                        b.x[row * h..(row + s.tokens.len()) * h].copy_from_slice(&rows);
                        row += s.tokens.len();
                    }
                    Err(e) => {
                        self.buf = b;
                        return Err(e);
                    }
                },
            }
        }
        if let Some(scale) = self.dims.embed_scale {
            for x in &mut b.x[..n * h] {
                *x *= scale;
            }
        }
        let result = self.layers_forward(&mut b, n, kv, exact);
        if let Err(e) = result {
            self.buf = b;
            return Err(e);
        }
        // Final norm (of the rows whose logits are wanted) and logits.
        let rows = b.out_rows.len();
        for (j, &r) in b.out_rows.iter().enumerate() {
            rms_norm(&b.x[r * h..(r + 1) * h], &self.norm, eps, &mut b.xn[j * h..(j + 1) * h]);
        }
        // The caller's buffer, reused call after call: a fresh vector of this size (0.6 MB a
        // row for a 152k vocabulary) comes from new zeroed pages every time, which cost a
        // decode step of Qwen2.5-1.5B 7% and a 5-row verification 18%.
        logits.resize(rows * self.dims.vocab, 0.0);
        if rows == 0 {
            self.buf = b;
            return Ok(0);
        }
        let vocab = self.dims.vocab;
        let r = match &mut self.restricted {
            None => self.output.run(&b.xn[..rows * h], rows, exact, logits),
            Some(rs) => {
                logits.fill(f32::NEG_INFINITY);
                let x = &b.xn[..rows * h];
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
                self.output.add_bias(logits);
                Ok(())
            }
        };
        self.buf = b;
        if let (Ok(()), Some(cap)) = (&r, self.dims.softcap) {
            // Restricted outputs stay -inf.
            for l in logits[..rows * vocab].iter_mut().filter(|l| l.is_finite()) {
                *l = cap * (*l / cap).tanh();
            }
        }
        r.map(|_| rows)
    }

    fn layers_forward(&mut self, b: &mut Bufs, n: usize, kv: &mut KvCache, exact: bool) -> Result<()> {
        let (h, nh, nkv, hd) = (self.dims.hidden, self.dims.heads, self.dims.kv_heads, self.dims.head_dim);
        let (q_out, kv_out) = (nh * hd, nkv * hd);
        let inter = self.dims.inter;
        let eps = self.dims.eps;
        let bs = kv.block_size();
        for li in 0..self.layers.len() {
            let layer = &self.layers[li];
            rms_norm(&b.x[..n * h], &layer.attn_norm, eps, &mut b.xn[..n * h]);
            match &layer.qkv {
                LinQkv::Separate(q, k, v) => {
                    run_group(&[q, k, v], &b.xn[..n * h], n, exact, &mut [&mut b.q, &mut b.k, &mut b.v])?;
                }
                LinQkv::Fused(l) => {
                    let w = q_out + 2 * kv_out;
                    grow(&mut b.qkv, n * w);
                    l.run(&b.xn[..n * h], n, exact, &mut b.qkv)?;
                    for i in 0..n {
                        let r = &b.qkv[i * w..(i + 1) * w];
                        b.q[i * q_out..(i + 1) * q_out].copy_from_slice(&r[..q_out]);
                        b.k[i * kv_out..(i + 1) * kv_out].copy_from_slice(&r[q_out..q_out + kv_out]);
                        b.v[i * kv_out..(i + 1) * kv_out].copy_from_slice(&r[q_out + kv_out..]);
                    }
                }
            }
            let ex = &self.layers[li].extra;
            if let Some(w) = &ex.q_norm {
                rms_norm_inplace(&mut b.q[..n * q_out], w, eps);
            }
            if let Some(w) = &ex.k_norm {
                rms_norm_inplace(&mut b.k[..n * kv_out], w, eps);
            }
            let (window, swa) = (ex.window, ex.rope_swa);
            for i in 0..n {
                self.rope(&mut b.q[i * q_out..(i + 1) * q_out], b.pos[i], swa);
                self.rope(&mut b.k[i * kv_out..(i + 1) * kv_out], b.pos[i], swa);
            }
            {
                let (kc, vc) = kv.layer_mut(li);
                grow(&mut b.kh, n * kv_out);
                kernels::f32_to_f16(&b.k[..n * kv_out], &mut b.kh[..n * kv_out]);
                write_keys(kc, &b.kh[..n * kv_out], &b.slot, kv_out, bs);
                for (i, &slot) in b.slot.iter().enumerate() {
                    kernels::f32_to_f16(&b.v[i * kv_out..(i + 1) * kv_out], &mut vc[slot * kv_out..(slot + 1) * kv_out]);
                }
            }
            let (kc, vc) = kv.layer(li);
            attention(&self.dims, window, &b.q[..n * q_out], kc, vc, &b.segs, &b.tabs, bs, &mut b.units, &mut b.att[..n * q_out]);
            let layer = &self.layers[li];
            layer.o.run(&b.att[..n * q_out], n, exact, &mut b.y)?;
            if let Some(w) = &layer.extra.post_attn_norm {
                rms_norm_inplace(&mut b.y[..n * h], w, eps);
            }
            for (x, y) in b.x[..n * h].iter_mut().zip(&b.y[..n * h]) {
                *x += y;
            }
            rms_norm(&b.x[..n * h], &layer.ffn_norm, eps, &mut b.xn[..n * h]);
            match &layer.gate_up {
                LinGateUp::Separate(g, u) => {
                    run_group(&[g, u], &b.xn[..n * h], n, exact, &mut [&mut b.g, &mut b.u])?;
                }
                LinGateUp::Fused(l) => {
                    grow(&mut b.gu, n * 2 * inter);
                    l.run(&b.xn[..n * h], n, exact, &mut b.gu)?;
                    for i in 0..n {
                        let r = &b.gu[i * 2 * inter..(i + 1) * 2 * inter];
                        b.g[i * inter..(i + 1) * inter].copy_from_slice(&r[..inter]);
                        b.u[i * inter..(i + 1) * inter].copy_from_slice(&r[inter..]);
                    }
                }
            }
            match self.dims.activation {
                Activation::Silu => kernels::silu_mul(&mut b.g[..n * inter], &b.u[..n * inter]),
                Activation::GeluTanh => gelu_tanh_mul(&mut b.g[..n * inter], &b.u[..n * inter]),
            }
            layer.down.run(&b.g[..n * inter], n, exact, &mut b.y)?;
            if let Some(w) = &layer.extra.post_ffn_norm {
                rms_norm_inplace(&mut b.y[..n * h], w, eps);
            }
            for (x, y) in b.x[..n * h].iter_mut().zip(&b.y[..n * h]) {
                *x += y;
            }
        }
        Ok(())
    }

    /// Every weight matrix of the kernel path, in layer order.
    pub(crate) fn weights(&self) -> Vec<&QMatrix> {
        let mut w = Vec::new();
        for l in &self.layers {
            match &l.qkv {
                LinQkv::Separate(q, k, v) => w.extend([&q.kernel, &k.kernel, &v.kernel]),
                LinQkv::Fused(x) => w.push(&x.kernel),
            }
            w.push(&l.o.kernel);
            match &l.gate_up {
                LinGateUp::Separate(g, u) => w.extend([&g.kernel, &u.kernel]),
                LinGateUp::Fused(x) => w.push(&x.kernel),
            }
            w.push(&l.down.kernel);
        }
        w.push(&self.output.kernel);
        w.extend(self.embed.as_ref());
        w
    }

    /// [`weights`](Self::weights), to lay them out anew ([`kernels::pack_for_lanes`]).
    pub(crate) fn weights_mut(&mut self) -> Vec<&mut QMatrix> {
        let mut w = Vec::new();
        for l in &mut self.layers {
            match &mut l.qkv {
                LinQkv::Separate(q, k, v) => w.extend([&mut q.kernel, &mut k.kernel, &mut v.kernel]),
                LinQkv::Fused(x) => w.push(&mut x.kernel),
            }
            w.push(&mut l.o.kernel);
            match &mut l.gate_up {
                LinGateUp::Separate(g, u) => w.extend([&mut g.kernel, &mut u.kernel]),
                LinGateUp::Fused(x) => w.push(&mut x.kernel),
            }
            w.push(&mut l.down.kernel);
        }
        w.push(&mut self.output.kernel);
        w.extend(self.embed.as_mut());
        w
    }

    pub(crate) fn check(&self) -> Result<()> {
        let d = &self.dims;
        let half = d.rope_dim / 2;
        if self.cos.len() != self.sin.len() || half == 0 || !self.cos.len().is_multiple_of(half) {
            return Err(Error::Internal("rope tables do not match the rope dimension"));
        }
        if let Some((c, s)) = &self.rope_swa {
            if c.len() != self.cos.len() || s.len() != self.sin.len() {
                return Err(Error::Internal("the sliding-window rope tables do not match the others"));
            }
        }
        for l in &self.layers {
            let e = &l.extra;
            if e.q_norm.as_ref().is_some_and(|w| w.len() != d.head_dim) || e.k_norm.as_ref().is_some_and(|w| w.len() != d.head_dim) {
                return Err(Error::Internal("q/k norm weights are not head_dim wide"));
            }
        }
        Ok(())
    }
}

thread_local! {
    /// A worker's attention scratch: scores (then weights) and key-chunk offsets.
    static SCORES: RefCell<(Vec<f32>, Vec<usize>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Calls `f(slot, t, len)` for each stretch `t..t + len` of positions `a..b` of a sequence
/// whose cache slots are consecutive (`slot..slot + len`): a block, or several blocks that
/// follow each other in the pool.
#[inline]
fn runs(tab: &[u32], bs: usize, a: usize, b: usize, mut f: impl FnMut(usize, usize, usize)) {
    let mut t = a;
    while t < b {
        let s0 = tab[t / bs] as usize * bs + t % bs;
        let mut end = (t / bs + 1) * bs;
        while end < b && tab[end / bs] == tab[end / bs - 1] + 1 {
            end += bs;
        }
        let end = end.min(b);
        f(s0, t, end - t);
        t = end;
    }
}

/// Causal (and sliding-window) grouped-query attention of every sequence of a batch: the
/// rows of `seg` at positions `seg.start..seg.start + seg.n` over that sequence's cached
/// keys and values (its block table in `tabs`). Keys are stored transposed per block
/// (`[block][kv head x head dim][position in block]`, see [`write_keys`]), values in rows
/// (`[slot][kv head x head dim]`).
///
/// A unit of work is up to [`kernels::MAX_QUERIES`] queries that share a key/value head:
/// the query heads of a group, and consecutive rows of the sequence when the group has few
/// heads. The unit's keys (from its first row's window start to its last row's position, in
/// chunks of 16) are scored for all its queries at once, so each key is read and converted
/// once for all of them. Each query's softmax then runs over exactly its own keys, and its
/// weights outside them are zero, which adds nothing to its values (`fma(0, v, y) = y`). So
/// every row's result is what it gives alone in a decode step, bit for bit, whatever the
/// batch, and wherever its blocks lie.
#[allow(clippy::too_many_arguments)]
fn attention(d: &Dims, window: Option<usize>, q: &[f32], kc: &[u16], vc: &[u16], segs: &[Seg], tabs: &[u32], bs: usize, units_at: &mut Vec<usize>, out: &mut [f32]) {
    const MQ: usize = kernels::MAX_QUERIES;
    let (nh, nkv, hd) = (d.heads, d.kv_heads, d.head_dim);
    let n_rep = nh / nkv;
    let kv_out = nkv * hd;
    let scale = d.attn_scale;
    // Heads per unit (the group's heads in near-equal parts) and rows per unit.
    let head_parts = n_rep.div_ceil(MQ);
    let hh = n_rep.div_ceil(head_parts);
    let rr = (MQ / hh).max(1);
    units_at.clear();
    units_at.push(0);
    for s in segs {
        let last = units_at[units_at.len() - 1];
        units_at.push(last + s.n.div_ceil(rr) * nkv * head_parts);
    }
    let units = units_at[units_at.len() - 1];
    let units_at = &units_at[..];
    let out_ptr = OutPtr(out.as_mut_ptr());
    let lo = |pos: usize| window.map_or(0, |w| (pos + 1).saturating_sub(w));
    let pool_slots = kc.len() / kv_out.max(1);
    let work = |u0: usize, u1: usize| {
        let out_ptr = &out_ptr;
        SCORES.with(|cell| {
            let (s, bases) = &mut *cell.borrow_mut();
            for u in u0..u1 {
                let si = units_at.partition_point(|&x| x <= u) - 1;
                let seg = &segs[si];
                let tab = &tabs[seg.tab0..seg.tab0 + seg.tabn];
                let u = u - units_at[si];
                let (rg, rest) = (u / (nkv * head_parts), u % (nkv * head_parts));
                let (g, part) = (rest / head_parts, rest % head_parts);
                let h0 = g * n_rep + part * hh;
                let k = (n_rep - part * hh).min(hh);
                let i0 = rg * rr;
                let rows = (seg.n - i0).min(rr);
                let nq = rows * k;
                let pos0 = seg.start + i0;
                let (first, last) = (lo(pos0), pos0 + rows - 1);
                let c0 = first / 16 * 16;
                let c1 = (last + 1).div_ceil(16) * 16;
                let ostride = c1 - c0;
                bases.clear();
                // Room for every block of positions the pool holds, as for the scores below.
                bases.reserve((pool_slots + 32) / 16);
                bases.extend((c0..c1).step_by(16).map(|t| tab[t / bs] as usize * bs * kv_out + g * hd * bs + t % bs));
                if s.len() < nq * ostride {
                    // Room for every position the pool holds: growing a key at a time would
                    // reallocate now and then during decode.
                    s.resize(nq * ostride.max(pool_slots + 16), 0.0);
                }
                // Query `qi` is row `qi / k` of the unit, head `h0 + qi % k`.
                let qrow = |qi: usize| seg.row0 + i0 + qi / k;
                let qv: [&[f32]; MQ] = std::array::from_fn(|qi| {
                    let (i, h) = (qrow(qi.min(nq - 1)), h0 + qi.min(nq - 1) % k);
                    &q[i * nh * hd + h * hd..i * nh * hd + (h + 1) * hd]
                });
                kernels::scores_chunks(&qv[..nq], kc, bases, bs, scale, &mut s[..nq * ostride], ostride);
                for qi in 0..nq {
                    let p = pos0 + qi / k;
                    let w = &mut s[qi * ostride..(qi + 1) * ostride];
                    let (a, b) = (lo(p) - c0, p + 1 - c0);
                    let inv = kernels::softmax_unnormalized(&mut w[a..b]);
                    for x in &mut w[a..b] {
                        *x *= inv;
                    }
                    w[first - c0..a].fill(0.0);
                    w[b..last + 1 - c0].fill(0.0);
                }
                let s = &s[..nq * ostride];
                for q0 in (0..nq).step_by(kernels::MAX_VALUE_ROWS) {
                    let m = (nq - q0).min(kernels::MAX_VALUE_ROWS);
                    // SAFETY: each (row, head) output slice is written by exactly one unit,
                    // and the queries of a unit are distinct (row, head) pairs.
                    let mut ys: [&mut [f32]; kernels::MAX_VALUE_ROWS] = std::array::from_fn(|j| {
                        let qi = (q0 + j).min(nq - 1);
                        let (i, h) = (qrow(qi), h0 + qi % k);
                        unsafe { std::slice::from_raw_parts_mut(out_ptr.0.add(i * nh * hd + h * hd), if j < m { hd } else { 0 }) }
                    });
                    for y in &mut ys[..m] {
                        y.fill(0.0);
                    }
                    runs(tab, bs, first, last + 1, |sl, t, l| {
                        let ws: [&[f32]; kernels::MAX_VALUE_ROWS] = std::array::from_fn(|j| {
                            let qi = (q0 + j).min(nq - 1);
                            &s[qi * ostride + t - c0..(qi + 1) * ostride]
                        });
                        kernels::values_f16(&ws[..m], vc, kv_out, g * hd, sl, sl + l, &mut ys[..m]);
                    });
                }
            }
        })
    };
    // Threads only pay when there is enough work.
    let total_keys: usize = segs
        .iter()
        .map(|sg| (0..sg.n).map(|i| sg.start + i + 1 - lo(sg.start + i)).sum::<usize>())
        .sum::<usize>()
        * nh;
    if total_keys * hd < 32 * 1024 || units == 1 {
        work(0, units);
    } else {
        let per = units.div_ceil(pool::pool().threads() * 4).max(1);
        pool::pool().run_chunks(units.div_ceil(per), &|c| work(c * per, ((c + 1) * per).min(units)));
    }
}

/// The attention kernels take keys 16 positions at a time, so blocks hold a multiple of 16.
pub(crate) fn check_block_size(bs: usize) -> Result<()> {
    if !bs.is_multiple_of(16) {
        return Err(Error::Config(format!("the KV cache's block size must be a multiple of 16 (it is {bs})")));
    }
    Ok(())
}

/// Rows of keys (`kv_out` values each, f16 bits) into their slots of a layer's key cache,
/// transposed per block: component `c` of the key at slot `blk * bs + j` goes to
/// `kc[blk * bs * kv_out + c * bs + j]`, so that [`kernels::scores_chunks`] reads 16
/// consecutive positions' component `c` at once.
fn write_keys(kc: &mut [u16], keys: &[u16], slots: &[usize], kv_out: usize, bs: usize) {
    for (key, &slot) in keys.chunks_exact(kv_out).zip(slots) {
        let base = slot / bs * bs * kv_out + slot % bs;
        for (c, &x) in key.iter().enumerate() {
            kc[base + c * bs] = x;
        }
    }
}

