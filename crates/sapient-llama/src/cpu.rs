//! The CPU forward pass on plain buffers.
//!
//! On the CPU a decode step is a few hundred small operations; going through candle costs an
//! allocation and a dispatch for each, which is several milliseconds per token for small
//! models. This path runs the same transformer on preallocated f32 buffers with the
//! quantized kernels of `sapient_tensor::kernels` (threaded over the kernel pool), RMSNorm,
//! RoPE, SwiGLU and attention written out directly, and its own KV cache in f16 (as
//! llama.cpp keeps it) laid out `[position][kv head][head dim]` so that it grows by
//! appending.
//!
//! Short batches (decode, speculative verification) use the quantized kernels, whose results
//! do not depend on how rows are batched; attention also runs row by row. So a batch of
//! tokens gives bit-identical logits to the same tokens fed one at a time. With the AVX-512
//! kernels long batches (prefill) use them too, and attention stays row by row (four rows of
//! a head sharing each key read), so the whole forward is row-invariant: a reused prefix gives
//! the logits a fresh prompt gives. Without AVX-512, batches of 32 tokens or more use a
//! dequantized f32 GEMM through the layer's `Linear` (`weights::dense_prefill_rows`).

use candle_core::{Device, Module, Tensor};
use sapient_tensor::kernels::{self, pool, QMatrix};
use sapient_tensor::weights::dense_prefill_rows;
use sapient_tensor::Linear;
use std::cell::RefCell;

use crate::{Error, Result};

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

    /// `out = x @ W^T + b` for `n` rows.
    fn run(&self, x: &[f32], n: usize, out: &mut [f32]) -> Result<()> {
        let rows = self.kernel.rows();
        if n < dense_prefill_rows() {
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
fn run_group(lins: &[&Lin], x: &[f32], n: usize, outs: &mut [&mut [f32]]) -> Result<()> {
    if n >= dense_prefill_rows() {
        for (l, o) in lins.iter().zip(outs.iter_mut()) {
            l.run(x, n, o)?;
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
    /// KV cache, f16 bits (as llama.cpp keeps it): half the memory and bandwidth of f32.
    k: Vec<u16>,
    v: Vec<u16>,
}

impl CpuLayer {
    pub(crate) fn new(attn_norm: Vec<f32>, ffn_norm: Vec<f32>, qkv: LinQkv, o: Lin, gate_up: LinGateUp, down: Lin) -> Self {
        Self {
            attn_norm,
            ffn_norm,
            qkv,
            o,
            gate_up,
            down,
            k: Vec::new(),
            v: Vec::new(),
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
    pub window: Option<usize>,
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
    /// Positions the caches have room for.
    capacity: usize,
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
}

fn grow(v: &mut Vec<f32>, n: usize) {
    if v.len() < n {
        v.resize(n, 0.0);
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
    pub(crate) fn new(dims: Dims, layers: Vec<CpuLayer>, norm: Vec<f32>, output: Lin, embed: Option<QMatrix>, cos: Vec<f32>, sin: Vec<f32>) -> Self {
        Self {
            dims,
            layers,
            norm,
            output,
            embed,
            cos,
            sin,
            capacity: 0,
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

    fn ensure_capacity(&mut self, needed: usize, max: usize) {
        if needed <= self.capacity {
            return;
        }
        let mut cap = self.capacity.max(256);
        while cap < needed {
            cap *= 2;
        }
        let cap = cap.min(max).max(needed);
        let per = self.dims.kv_heads * self.dims.head_dim;
        for l in &mut self.layers {
            l.k.resize(cap * per, 0);
            l.v.resize(cap * per, 0);
        }
        self.capacity = cap;
    }

    fn rope(&self, x: &mut [f32], pos: usize) {
        let d = &self.dims;
        let half = d.rope_dim / 2;
        let cos = &self.cos[pos * half..(pos + 1) * half];
        let sin = &self.sin[pos * half..(pos + 1) * half];
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

    /// Run `tokens` at positions `start..`, returning logits for the last row or all rows.
    pub(crate) fn forward(
        &mut self,
        tokens: &[u32],
        start: usize,
        max_seq: usize,
        all_logits: bool,
        embed_fallback: &dyn Fn(&[u32]) -> Result<Vec<f32>>,
        logits: &mut Vec<f32>,
    ) -> Result<()> {
        let n = tokens.len();
        self.ensure_capacity(start + n, max_seq);
        let (h, nh, nkv, hd) = (self.dims.hidden, self.dims.heads, self.dims.kv_heads, self.dims.head_dim);
        let (q_out, kv_out) = (nh * hd, nkv * hd);
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
        // Embeddings.
        match &self.embed {
            Some(e) => {
                for (i, &t) in tokens.iter().enumerate() {
                    e.dequantize_row(t as usize, &mut b.x[i * h..(i + 1) * h]);
                }
            }
            None => {
                let rows = embed_fallback(tokens)?;
                b.x[..n * h].copy_from_slice(&rows);
            }
        }
        let result = self.layers_forward(&mut b, n, start);
        if let Err(e) = result {
            self.buf = b;
            return Err(e);
        }
        // Final norm and logits.
        let (first, rows) = if all_logits { (0, n) } else { (n - 1, 1) };
        rms_norm(&b.x[first * h..(first + rows) * h], &self.norm, eps, &mut b.xn[..rows * h]);
        // The caller's buffer, reused call after call: a fresh vector of this size (0.6 MB a
        // row for a 152k vocabulary) comes from new zeroed pages every time, which cost a
        // decode step of Qwen2.5-1.5B 7% and a 5-row verification 18%.
        logits.resize(rows * self.dims.vocab, 0.0);
        let vocab = self.dims.vocab;
        let r = match &mut self.restricted {
            None => self.output.run(&b.xn[..rows * h], rows, logits),
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
        r
    }

    fn layers_forward(&mut self, b: &mut Bufs, n: usize, start: usize) -> Result<()> {
        let (h, nh, nkv, hd) = (self.dims.hidden, self.dims.heads, self.dims.kv_heads, self.dims.head_dim);
        let (q_out, kv_out) = (nh * hd, nkv * hd);
        let inter = self.dims.inter;
        let eps = self.dims.eps;
        for li in 0..self.layers.len() {
            let layer = &self.layers[li];
            rms_norm(&b.x[..n * h], &layer.attn_norm, eps, &mut b.xn[..n * h]);
            match &layer.qkv {
                LinQkv::Separate(q, k, v) => {
                    run_group(&[q, k, v], &b.xn[..n * h], n, &mut [&mut b.q, &mut b.k, &mut b.v])?;
                }
                LinQkv::Fused(l) => {
                    let w = q_out + 2 * kv_out;
                    grow(&mut b.qkv, n * w);
                    l.run(&b.xn[..n * h], n, &mut b.qkv)?;
                    for i in 0..n {
                        let r = &b.qkv[i * w..(i + 1) * w];
                        b.q[i * q_out..(i + 1) * q_out].copy_from_slice(&r[..q_out]);
                        b.k[i * kv_out..(i + 1) * kv_out].copy_from_slice(&r[q_out..q_out + kv_out]);
                        b.v[i * kv_out..(i + 1) * kv_out].copy_from_slice(&r[q_out + kv_out..]);
                    }
                }
            }
            for i in 0..n {
                self.rope(&mut b.q[i * q_out..(i + 1) * q_out], start + i);
                self.rope(&mut b.k[i * kv_out..(i + 1) * kv_out], start + i);
            }
            let layer = &mut self.layers[li];
            kernels::f32_to_f16(&b.k[..n * kv_out], &mut layer.k[start * kv_out..(start + n) * kv_out]);
            kernels::f32_to_f16(&b.v[..n * kv_out], &mut layer.v[start * kv_out..(start + n) * kv_out]);
            let layer = &self.layers[li];
            attention(&self.dims, &b.q[..n * q_out], &layer.k, &layer.v, start, n, &mut b.att[..n * q_out]);
            layer.o.run(&b.att[..n * q_out], n, &mut b.y)?;
            for (x, y) in b.x[..n * h].iter_mut().zip(&b.y[..n * h]) {
                *x += y;
            }
            rms_norm(&b.x[..n * h], &layer.ffn_norm, eps, &mut b.xn[..n * h]);
            match &layer.gate_up {
                LinGateUp::Separate(g, u) => {
                    run_group(&[g, u], &b.xn[..n * h], n, &mut [&mut b.g, &mut b.u])?;
                }
                LinGateUp::Fused(l) => {
                    grow(&mut b.gu, n * 2 * inter);
                    l.run(&b.xn[..n * h], n, &mut b.gu)?;
                    for i in 0..n {
                        let r = &b.gu[i * 2 * inter..(i + 1) * 2 * inter];
                        b.g[i * inter..(i + 1) * inter].copy_from_slice(&r[..inter]);
                        b.u[i * inter..(i + 1) * inter].copy_from_slice(&r[inter..]);
                    }
                }
            }
            kernels::silu_mul(&mut b.g[..n * inter], &b.u[..n * inter]);
            layer.down.run(&b.g[..n * inter], n, &mut b.y)?;
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

    pub(crate) fn check(&self) -> Result<()> {
        let d = &self.dims;
        let half = d.rope_dim / 2;
        if self.cos.len() != self.sin.len() || half == 0 || self.cos.len() % half != 0 {
            return Err(Error::Internal("rope tables do not match the rope dimension"));
        }
        Ok(())
    }
}

thread_local! {
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Causal (and sliding-window) grouped-query attention of `n` query rows at positions
/// `start..start + n` over the cache. Each row's result is computed exactly as a decode step
/// computes it alone (the same dot products, softmax and accumulation order), so results do
/// not depend on how tokens were batched; up to four consecutive rows of a head go together
/// so that each key and value is read and converted once for all of them.
fn attention(d: &Dims, q: &[f32], kc: &[u16], vc: &[u16], start: usize, n: usize, out: &mut [f32]) {
    const G: usize = 4;
    let (nh, nkv, hd) = (d.heads, d.kv_heads, d.head_dim);
    let n_rep = nh / nkv;
    let kv_out = nkv * hd;
    let scale = 1.0 / (hd as f32).sqrt();
    let groups = n.div_ceil(G);
    let units = groups * nh;
    let out_ptr = OutPtr(out.as_mut_ptr());
    let lo = |pos: usize| d.window.map_or(0, |w| (pos + 1).saturating_sub(w));
    let work = |u0: usize, u1: usize| {
        let out_ptr = &out_ptr;
        SCORES.with(|s| {
            let mut s = s.borrow_mut();
            for u in u0..u1 {
                let (grp, head) = (u / nh, u % nh);
                let g = head / n_rep;
                let i0 = grp * G;
                let rows = (n - i0).min(G);
                let pos: [usize; G] = std::array::from_fn(|r| start + i0 + r.min(rows - 1));
                let los: [usize; G] = pos.map(lo);
                let lens: [usize; G] = std::array::from_fn(|r| pos[r] + 1 - los[r]);
                let stride = lens[rows - 1].max(lens[0]);
                if s.len() < G * stride {
                    // Room for every position the cache holds: growing a key at a time would
                    // reallocate now and then during decode.
                    s.resize(G * stride.max(kc.len() / kv_out), 0.0);
                }
                let qh: [&[f32]; G] = std::array::from_fn(|r| {
                    let i = i0 + r.min(rows - 1);
                    &q[i * nh * hd + head * hd..i * nh * hd + (head + 1) * hd]
                });
                let (first, last) = (los[0], pos[rows - 1]);
                let visible = |r: usize, t: usize| r < rows && los[r] <= t && t <= pos[r];
                let key = |t: usize| &kc[t * kv_out + g * hd..t * kv_out + (g + 1) * hd];
                let val = |t: usize| &vc[t * kv_out + g * hd..t * kv_out + (g + 1) * hd];
                // Keys every row of a full group sees go four rows at a time.
                let (all0, all1) = if rows == G && los[G - 1] <= pos[0] { (los[G - 1], pos[0] + 1) } else { (first, first) };
                let one = |s: &mut [f32], t: usize| {
                    for r in (0..rows).filter(|&r| visible(r, t)) {
                        s[r * stride + t - los[r]] = kernels::dot_f32_f16(qh[r], key(t)) * scale;
                    }
                };
                if rows == 1 {
                    // One row (a decode step): its keys in one span call.
                    kernels::scores1_f16(qh[0], kc, kv_out, g * hd, first, last + 1, scale, &mut s[..lens[0]]);
                } else {
                    for t in first..all0.max(first) {
                        one(&mut s, t);
                    }
                }
                if all1 > all0 {
                    let [s0, s1, s2, s3] = split4(&mut s[..G * stride], stride);
                    let o: [&mut [f32]; G] = [&mut s0[all0 - los[0]..], &mut s1[all0 - los[1]..], &mut s2[all0 - los[2]..], &mut s3[all0 - los[3]..]];
                    kernels::scores4_f16(qh, kc, kv_out, g * hd, all0, all1, scale, o);
                }
                if rows > 1 {
                    for t in all1.max(first)..=last {
                        one(&mut s, t);
                    }
                }
                let mut inv = [0f32; G];
                for r in 0..rows {
                    let sc = &mut s[r * stride..r * stride + lens[r]];
                    let max = sc.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v));
                    let mut sum = 0f32;
                    for sv in sc.iter_mut() {
                        *sv = (*sv - max).exp();
                        sum += *sv;
                    }
                    inv[r] = 1.0 / sum;
                }
                // SAFETY: each (row, head) output slice is written by exactly one unit, and
                // the rows of a group are distinct.
                let mut o: [&mut [f32]; G] = std::array::from_fn(|r| unsafe {
                    let i = i0 + r.min(rows - 1);
                    let ptr = if r < rows { out_ptr.0.add(i * nh * hd + head * hd) } else { std::ptr::NonNull::<f32>::dangling().as_ptr() };
                    std::slice::from_raw_parts_mut(ptr, if r < rows { hd } else { 0 })
                });
                for x in o.iter_mut() {
                    x.fill(0.0);
                }
                let one = |o: &mut [&mut [f32]; G], t: usize| {
                    for r in (0..rows).filter(|&r| visible(r, t)) {
                        kernels::axpy_f16(s[r * stride + t - los[r]] * inv[r], val(t), o[r]);
                    }
                };
                if rows == 1 {
                    kernels::values1_f16(&s[..lens[0]], inv[0], vc, kv_out, g * hd, first, last + 1, &mut *o[0]);
                } else {
                    for t in first..all0.max(first) {
                        one(&mut o, t);
                    }
                }
                if all1 > all0 {
                    let p: [&[f32]; G] = std::array::from_fn(|r| &s[r * stride + all0 - los[r]..(r + 1) * stride]);
                    let [o0, o1, o2, o3] = &mut o;
                    kernels::values4_f16(p, inv, vc, kv_out, g * hd, all0, all1, [&mut **o0, &mut **o1, &mut **o2, &mut **o3]);
                }
                if rows > 1 {
                    for t in all1.max(first)..=last {
                        one(&mut o, t);
                    }
                }
            }
        })
    };
    // Threads only pay when there is enough work.
    let total_keys: usize = (0..n).map(|i| start + i + 1 - lo(start + i)).sum::<usize>() * nh;
    if total_keys * hd < 32 * 1024 || units == 1 {
        work(0, units);
    } else {
        let per = units.div_ceil(pool::pool().threads() * 4).max(1);
        pool::pool().run_chunks(units.div_ceil(per), &|c| work(c * per, ((c + 1) * per).min(units)));
    }
}

/// Four consecutive rows of `stride` values.
fn split4(s: &mut [f32], stride: usize) -> [&mut [f32]; 4] {
    let (a, rest) = s.split_at_mut(stride);
    let (b, rest) = rest.split_at_mut(stride);
    let (c, d) = rest.split_at_mut(stride);
    [a, b, c, d]
}

struct OutPtr(*mut f32);
// SAFETY: threads write disjoint parts of the output.
unsafe impl Sync for OutPtr {}
unsafe impl Send for OutPtr {}
