//! The decoder on plain buffers for the CPU (f32 activations), behind
//! [`Whisper::decode`](crate::model::Whisper::decode): no candle op per layer and step.
//! Linear layers run on sapient-tensor's quantized kernels when their weight
//! is quantized, else on the f32 weight (dot products for a few rows, the `gemm` crate for
//! more); the self-attention cache is kept per batch row as f32 rows of `d` values; the
//! cross-attention keys and values are the window's [`CrossKv`]
//! tensors, read in place; the alignment heads' cross-attention scores (word timestamps)
//! are copied out when asked for ([`Align`]).

use candle_core::{CpuStorage, Storage, Tensor};
use sapient_tensor::encoder::LayerNorm;
use sapient_tensor::kernels::{self, pool, DenseMatrix, QMatrix, SendPtr};
use std::sync::Arc;
use std::cell::RefCell;

use crate::{Error, Result};

/// Run `f` on the f32 data of a contiguous CPU tensor.
pub(crate) fn with_f32<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
    if !t.is_contiguous() {
        return Err(Error::Mismatch("plain-buffer decoder: tensor not contiguous".into()));
    }
    let (s, l) = t.storage_and_layout();
    match &*s {
        Storage::Cpu(CpuStorage::F32(v)) => {
            let o = l.start_offset();
            Ok(f(&v[o..o + t.elem_count()]))
        }
        _ => Err(Error::Mismatch("plain-buffer decoder: not an f32 CPU tensor".into())),
    }
}

/// A weight matrix [out, in]: quantized for the kernels, f32 (a contiguous CPU tensor), or
/// packed for [`DenseMatrix`] products (many rows with f32 activations).
#[derive(Clone)]
pub(crate) enum Mat {
    Q(QMatrix),
    F(Tensor),
    D(Arc<DenseMatrix>),
}


impl Mat {
    pub fn rows(&self) -> usize {
        match self {
            Mat::Q(q) => q.rows(),
            Mat::F(t) => t.dims()[0],
            Mat::D(d) => d.rows(),
        }
    }

    /// out[m, rows] = x[m, cols] · selfᵀ.
    pub fn matmul(&self, x: &[f32], m: usize, out: &mut [f32]) -> Result<()> {
        match self {
            Mat::Q(q) => {
                q.matmul(x, m, out);
                Ok(())
            }
            Mat::F(t) => {
                let (n, k) = (t.dims()[0], t.dims()[1]);
                with_f32(t, |w| kernels::matmul_f32(w, n, k, x, m, out))
            }
            Mat::D(d) => {
                d.matmul(x, m, None, out);
                Ok(())
            }
        }
    }
}

/// The token embedding [vocab, d]: f32, or the quantized output projection it is tied to
/// (rows dequantized as they are looked up, so that the f32 copy need not be kept).
pub(crate) enum Embed {
    F(Tensor),
    Q(QMatrix),
}

impl Embed {
    pub fn rows(&self) -> usize {
        match self {
            Embed::F(t) => t.dims()[0],
            Embed::Q(q) => q.rows(),
        }
    }

    /// `out += row tok` (`d` values; `tok` < rows).
    fn add_row(&self, tok: usize, out: &mut [f32], tmp: &mut Vec<f32>) -> Result<()> {
        let d = out.len();
        match self {
            Embed::F(t) => with_f32(t, |e| add(out, &e[tok * d..(tok + 1) * d])),
            Embed::Q(q) => {
                grow(tmp, d);
                q.dequantize_row(tok, &mut tmp[..d]);
                add(out, &tmp[..d]);
                Ok(())
            }
        }
    }
}

/// A linear layer: weight and optional bias.
pub(crate) struct Lin {
    pub w: Mat,
    pub b: Option<Vec<f32>>,
}

impl Lin {
    pub fn forward(&self, x: &[f32], m: usize, out: &mut Vec<f32>) -> Result<()> {
        let n = self.w.rows();
        grow(out, m * n);
        let out = &mut out[..m * n];
        self.w.matmul(x, m, out)?;
        if let Some(b) = &self.b {
            for r in out.chunks_exact_mut(n) {
                for (o, b) in r.iter_mut().zip(b) {
                    *o += b;
                }
            }
        }
        Ok(())
    }
}

/// `outs[i] = x · lins[i]ᵀ + b` for layers reading the same input (the self-attention's q, k
/// and v): one dispatch on the kernel pool when all are quantized ([`kernels::matmul_group`],
/// the same values as separate products), else one product each.
fn forward_group(lins: &[&Lin], x: &[f32], m: usize, outs: &mut [&mut Vec<f32>]) -> Result<()> {
    let qs: Vec<&QMatrix> = lins.iter().filter_map(|l| if let Mat::Q(q) = &l.w { Some(q) } else { None }).collect();
    if qs.len() != lins.len() || qs.len() > kernels::MAX_GROUP || qs.iter().any(|q| q.cols() != qs[0].cols()) {
        for (l, o) in lins.iter().zip(outs.iter_mut()) {
            l.forward(x, m, o)?;
        }
        return Ok(());
    }
    for (q, o) in qs.iter().zip(outs.iter_mut()) {
        grow(o, m * q.rows());
    }
    {
        let mut slices: Vec<&mut [f32]> = outs.iter_mut().zip(&qs).map(|(o, q)| &mut o[..m * q.rows()]).collect();
        kernels::matmul_group(&qs, &x[..m * qs[0].cols()], m, &mut slices);
    }
    for ((l, o), q) in lins.iter().zip(outs.iter_mut()).zip(&qs) {
        if let Some(b) = &l.b {
            let n = q.rows();
            for r in o[..m * n].chunks_exact_mut(n) {
                add(r, b);
            }
        }
    }
    Ok(())
}

/// LayerNorm (eps 1e-5), the encoders' one ([`LayerNorm`]).
pub(crate) struct Norm(pub LayerNorm);

impl Norm {
    /// Each row of `x` (rows of `d`) into `out`, grown to fit.
    fn forward(&self, x: &[f32], d: usize, out: &mut Vec<f32>) {
        debug_assert_eq!(d, self.0.dim());
        grow(out, x.len());
        self.0.rows_to(x, out);
    }
}

pub(crate) struct Layer {
    pub attn_ln: Norm,
    pub q: Lin,
    pub k: Lin,
    pub v: Lin,
    pub o: Lin,
    pub cross_ln: Norm,
    pub cq: Lin,
    /// Cross-attention keys and values, for [`CrossKv`].
    pub ck: Lin,
    pub cv: Lin,
    pub co: Lin,
    pub mlp_ln: Norm,
    pub fc1: Lin,
    pub fc2: Lin,
}

/// Where a forward pass leaves the cross-attention scores (scaled q·k, before the softmax)
/// of the alignment heads: `scores[i]` gets head `heads[i]` (layer, head) as [rows, S].
pub(crate) struct Align<'a> {
    pub heads: &'a [(usize, usize)],
    pub scores: &'a mut [Vec<f32>],
}

/// The decoder's weights for the plain-buffer path.
pub(crate) struct CpuDecoder {
    pub layers: Vec<Layer>,
    pub ln: Norm,
    pub heads: usize,
    pub d: usize,
}

/// Self-attention cache of the plain-buffer path: per layer and batch row, keys and values
/// as rows of `d` values.
#[derive(Default)]
pub(crate) struct BufCache {
    pub k: Vec<Vec<Vec<f32>>>,
    pub v: Vec<Vec<Vec<f32>>>,
    spare: Vec<Vec<f32>>,
}

impl BufCache {
    pub fn batch(&self) -> usize {
        self.k.first().map_or(0, Vec::len)
    }

    /// Row `i` becomes old row `rows[i]`: an old row's buffer moves to the last new row
    /// that takes it, the others get copies (beam search copies only the beams that more
    /// than one continuation comes from, not every beam).
    pub fn reorder(&mut self, rows: &[u32]) {
        let nb = self.batch();
        if rows.iter().enumerate().all(|(i, &r)| r as usize == i) && rows.len() == nb {
            return;
        }
        // the last new row that takes each old row
        let mut last = vec![usize::MAX; nb];
        for (i, &r) in rows.iter().enumerate() {
            last[r as usize] = i;
        }
        let spare = &mut self.spare;
        for per_layer in self.k.iter_mut().chain(self.v.iter_mut()) {
            let mut old = std::mem::take(per_layer);
            for (i, &r) in rows.iter().enumerate() {
                let r = r as usize;
                if last[r] == i {
                    // no later row reads it: copies for the earlier ones are made
                    per_layer.push(std::mem::take(&mut old[r]));
                } else {
                    let mut v = spare.pop().unwrap_or_default();
                    v.clear();
                    v.extend_from_slice(&old[r]);
                    per_layer.push(v);
                }
            }
            spare.extend(old.into_iter().filter(|v| v.capacity() > 0));
        }
    }
}

fn grow(v: &mut Vec<f32>, n: usize) {
    if v.len() < n {
        v.resize(n, 0.0);
    }
}

/// The sum of `f(v)` over `x` in 16 lanes (value `i` into lane `i % 16`, so that it
/// vectorises): the values past the last whole 16 summed first, then the lanes added to
/// them in order. (The order [`exp_sum`] keeps; the tests check it against this.)
#[cfg(test)]
pub(crate) fn lane_sum(x: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut acc = [0f32; 16];
    let mut it = x.chunks_exact(16);
    for c in &mut it {
        for i in 0..16 {
            acc[i] += f(c[i]);
        }
    }
    let mut s: f32 = it.remainder().iter().map(|&v| f(v)).sum();
    for a in acc {
        s += a;
    }
    s
}

/// [`lane_sum`] of `e^(v - m)` over `x`, written out (no closure) so that it vectorises
/// under the callers' target features.
#[inline(always)]
fn exp_sum_portable(x: &[f32], m: f32) -> f32 {
    let mut acc = [0f32; 16];
    let mut it = x.chunks_exact(16);
    for c in &mut it {
        for i in 0..16 {
            acc[i] += kernels::exp_f32(c[i] - m);
        }
    }
    let mut s: f32 = it.remainder().iter().map(|&v| kernels::exp_f32(v - m)).sum();
    for a in acc {
        s += a;
    }
    s
}

sapient_tensor::simd_dispatch! {
    /// The sum of `e^(v - m)` over `x` in 16 lanes ([`lane_sum`]'s order), each term as
    /// `exp_in_place` gives it: one pass, no buffer of the shifted values (a vocabulary's
    /// log-sum-exp per beam and step).
    pub(crate) fn exp_sum(x: &[f32], m: f32) -> f32 = exp_sum_portable for [has_avx512("avx512f,avx512vl,avx2,fma"), has_avx2("avx2,fma")];
}

#[derive(Default)]
struct Scratch {
    x: Vec<f32>,
    h: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    o: Vec<f32>,
    y: Vec<f32>,
    f: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

impl CpuDecoder {
    /// Hidden states [b * t, d] (after the final norm) of `tokens` (b rows of t) after what
    /// `cache` holds (`offset` tokens). `embed` is the token embedding [vocab, d] and `pos`
    /// the positions [n_ctx, d]; `cross` the windows the batch rows attend to, in row order
    /// (each group's window and its number of batch rows; the rows add up to `b`).
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        tokens: &[u32],
        b: usize,
        t: usize,
        offset: usize,
        embed: &Embed,
        pos: &Tensor,
        cross: &[CrossGroup<'_>],
        cache: &mut BufCache,
        mut align: Option<Align<'_>>,
    ) -> Result<Vec<f32>> {
        if align.is_some() && cross.len() != 1 {
            return Err(Error::Options("alignment weights are for rows attending to one window".into()));
        }
        let d = self.d;
        if cross.iter().map(|g| g.rows).sum::<usize>() != b || tokens.len() != b * t {
            return Err(Error::Mismatch(format!("{} tokens in {b} rows of {t}, windows for {} rows", tokens.len(), cross.iter().map(|g| g.rows).sum::<usize>())));
        }
        if let Some(g) = cross.iter().find(|g| g.kv.k.len() != self.layers.len() || g.kv.v.len() != self.layers.len()) {
            return Err(Error::Mismatch(format!("a window has keys for {} layers, the decoder {}", g.kv.k.len(), self.layers.len())));
        }
        let n = b * t;
        let nl = self.layers.len();
        if cache.k.is_empty() {
            cache.k = vec![vec![Vec::new(); b]; nl];
            cache.v = vec![vec![Vec::new(); b]; nl];
        }
        if cache.batch() != b {
            return Err(Error::Mismatch(format!("cache holds {} rows, the step has {b}", cache.batch())));
        }
        SCRATCH.with(|s| {
            let s = &mut *s.borrow_mut();
            grow(&mut s.x, n * d);
            let vocab = embed.rows();
            if let Some(&bad) = tokens.iter().find(|&&tok| tok as usize >= vocab) {
                return Err(Error::Options(format!("token {bad} outside the vocabulary of {vocab}")));
            }
            with_f32(pos, |p| {
                for r in 0..tokens.len() {
                    s.x[r * d..(r + 1) * d].copy_from_slice(&p[(offset + r % t) * d..(offset + r % t + 1) * d]);
                }
            })?;
            for (r, &tok) in tokens.iter().enumerate() {
                embed.add_row(tok as usize, &mut s.x[r * d..(r + 1) * d], &mut s.y)?;
            }
            for (li, l) in self.layers.iter().enumerate() {
                // self-attention over the cache
                l.attn_ln.forward(&s.x[..n * d], d, &mut s.h);
                forward_group(&[&l.q, &l.k, &l.v], &s.h[..n * d], n, &mut [&mut s.q, &mut s.k, &mut s.v])?;
                for bi in 0..b {
                    cache.k[li][bi].extend_from_slice(&s.k[bi * t * d..(bi + 1) * t * d]);
                    cache.v[li][bi].extend_from_slice(&s.v[bi * t * d..(bi + 1) * t * d]);
                }
                grow(&mut s.o, n * d);
                self.self_attention(&s.q[..n * d], &cache.k[li], &cache.v[li], t, offset, &mut s.o[..n * d]);
                l.o.forward(&s.o[..n * d], n, &mut s.y)?;
                add(&mut s.x[..n * d], &s.y[..n * d]);
                // cross-attention
                l.cross_ln.forward(&s.x[..n * d], d, &mut s.h);
                l.cq.forward(&s.h[..n * d], n, &mut s.q)?;
                let mut groups = Vec::with_capacity(cross.len());
                let mut row0 = 0;
                for g in cross {
                    let kv = g.kv;
                    let (ck, cv) = (&kv.k[li], &kv.v[li]);
                    if ck.len() != kv.pitch * d || cv.len() != kv.src * d || kv.pitch % 16 != 0 || kv.pitch < kv.src {
                        return Err(Error::Mismatch(format!("cross-attention keys of {} and values of {} values for {} positions of width {d}", ck.len(), cv.len(), kv.src)));
                    }
                    groups.push(CrossRun { r0: row0 * t, n: g.rows * t, k: ck, v: cv, src: kv.src, pitch: kv.pitch });
                    row0 += g.rows;
                }
                // this layer's alignment heads: (head, where its scores go)
                let mut keep: Vec<(usize, SendPtr)> = Vec::new();
                if let Some(a) = align.as_mut() {
                    let src = groups.first().map_or(0, |g| g.src);
                    for (&(layer, head), sc) in a.heads.iter().zip(a.scores.iter_mut()) {
                        if layer == li && head < self.heads {
                            sc.clear();
                            sc.resize(n * src, 0.0);
                            keep.push((head, SendPtr(sc.as_mut_ptr())));
                        }
                    }
                }
                self.cross_attention(&s.q[..n * d], &groups, &keep, &mut s.o[..n * d]);
                drop(groups);
                l.co.forward(&s.o[..n * d], n, &mut s.y)?;
                add(&mut s.x[..n * d], &s.y[..n * d]);
                // MLP
                l.mlp_ln.forward(&s.x[..n * d], d, &mut s.h);
                l.fc1.forward(&s.h[..n * d], n, &mut s.f)?;
                let ff = l.fc1.w.rows();
                kernels::gelu_erf_in_place(&mut s.f[..n * ff]);
                l.fc2.forward(&s.f[..n * ff], n, &mut s.y)?;
                add(&mut s.x[..n * d], &s.y[..n * d]);
            }
            let mut out = Vec::new();
            self.ln.forward(&s.x[..n * d], d, &mut out);
            out.truncate(n * d);
            Ok(out)
        })
    }

    /// Causal self-attention of the step's rows (b rows of t, the row `i` of a batch row at
    /// position offset + i) over each batch row's cache.
    fn self_attention(&self, q: &[f32], ck: &[Vec<f32>], cv: &[Vec<f32>], t: usize, offset: usize, out: &mut [f32]) {
        let (d, nh) = (self.d, self.heads);
        let hd = d / nh;
        let scale = 1.0 / (hd as f32).sqrt();
        let units = q.len() / d * nh;
        let out_ptr = SendPtr(out.as_mut_ptr());
        let work = |u0: usize, u1: usize| {
            let out_ptr = &out_ptr;
            SCORES.with(|sc| {
                let mut sc = sc.borrow_mut();
                for u in u0..u1 {
                    let (r, h) = (u / nh, u % nh);
                    let (bi, i) = (r / t, r % t);
                    let len = offset + i + 1;
                    grow(&mut sc, len);
                    let s = &mut sc[..len];
                    let qh = &q[r * d + h * hd..r * d + (h + 1) * hd];
                    // SAFETY: each (row, head) slice of the output is written by one unit.
                    let o = unsafe { std::slice::from_raw_parts_mut(out_ptr.ptr().add(r * d + h * hd), hd) };
                    kernels::attention_row_f32(qh, &ck[bi], &cv[bi], d, h * hd, scale, s, o);
                }
            })
        };
        let keys: usize = (q.len() / d) * (offset + t) * d;
        if keys < 64 * 1024 || units == 1 {
            work(0, units);
        } else {
            let threads = pool::pool().threads();
            let per = units.div_ceil(threads * 2).max(1);
            pool::pool().run_chunks(units.div_ceil(per), &|c| work(c * per, ((c + 1) * per).min(units)));
        }
    }

    /// Attention of query rows over windows' f16 keys [H, P / 16, Dh, 16] and values
    /// [H, S, Dh] ([`CrossKv`]'s layout): each run of query rows
    /// attends to one window; one head of one run per unit (scores of up to
    /// [`kernels::MAX_QUERIES`] rows against every key at once, a softmax, the weighted sums of
    /// the values). `keep` lists heads whose scores (scaled q·k, before the softmax) are copied
    /// out, [rows, S] each (one run only).
    fn cross_attention(&self, q_all: &[f32], groups: &[CrossRun<'_>], keep: &[(usize, SendPtr)], out: &mut [f32]) {
        let (d, nh) = (self.d, self.heads);
        let hd = d / nh;
        let scale = 1.0 / (hd as f32).sqrt();
        let out_ptr = SendPtr(out.as_mut_ptr());
        // chunk c of a head's keys: component e of its 16 keys at (c * hd + e) * 16
        let chunks = groups.iter().map(|g| g.pitch / 16).max().unwrap_or(0);
        let bases: Vec<usize> = (0..chunks).map(|c| c * hd * 16).collect();
        let work = |u: usize| {
            let g = &groups[u / nh];
            let h = u % nh;
            let (src, pitch) = (g.src, g.pitch);
            let keys = &g.k[h * hd * pitch..(h + 1) * hd * pitch];
            let bases = &bases[..pitch / 16];
            let q_row = |i: usize| &q_all[(g.r0 + i) * d + h * hd..(g.r0 + i) * d + (h + 1) * hd];
            SCORES.with(|sc| {
                let mut sc = sc.borrow_mut();
                grow(&mut sc, g.n * pitch);
                let s = &mut sc[..g.n * pitch];
                for i0 in (0..g.n).step_by(kernels::MAX_QUERIES) {
                    let nq = (g.n - i0).min(kernels::MAX_QUERIES);
                    let qs: [&[f32]; kernels::MAX_QUERIES] = std::array::from_fn(|x| q_row(i0 + x.min(nq - 1)));
                    kernels::scores_chunks(&qs[..nq], keys, bases, 16, scale, &mut s[i0 * pitch..], pitch);
                }
                for (_, p) in keep.iter().filter(|(kh, _)| *kh == h) {
                    for (i, row) in s.chunks_exact(pitch).enumerate() {
                        // SAFETY: the caller sized each kept buffer to n * src values (one
                        // run), and each head is one unit.
                        unsafe { std::ptr::copy_nonoverlapping(row.as_ptr(), p.ptr().add(i * src), src) };
                    }
                }
                for row in s.chunks_exact_mut(pitch) {
                    let row = &mut row[..src];
                    let inv = kernels::softmax_unnormalized(row);
                    for v in row.iter_mut() {
                        *v *= inv;
                    }
                }
                for i0 in (0..g.n).step_by(kernels::MAX_VALUE_ROWS) {
                    let nr = (g.n - i0).min(kernels::MAX_VALUE_ROWS);
                    let ws: [&[f32]; kernels::MAX_VALUE_ROWS] = std::array::from_fn(|x| {
                        let i = i0 + x.min(nr - 1);
                        &s[i * pitch..i * pitch + src]
                    });
                    let mut ys: [&mut [f32]; kernels::MAX_VALUE_ROWS] = std::array::from_fn(|x| {
                        if x >= nr {
                            return &mut [][..];
                        }
                        // SAFETY: row r0 + i0 + x, head h's columns of `out`: in bounds (the
                        // runs' rows are within q_all's), written by this unit alone.
                        let o = unsafe { std::slice::from_raw_parts_mut(out_ptr.ptr().add((g.r0 + i0 + x) * d + h * hd), hd) };
                        o.fill(0.0);
                        o
                    });
                    kernels::values_f16(&ws[..nr], g.v, hd, h * src * hd, 0, src, &mut ys[..nr]);
                }
            })
        };
        pool::pool().run_chunks(groups.len() * nh, &work);
    }
}

/// One run of query rows (from row `r0`, `n` rows) and the window's f16 keys and values it
/// attends to in one layer.
pub(crate) struct CrossRun<'a> {
    r0: usize,
    n: usize,
    k: &'a [u16],
    v: &'a [u16],
    src: usize,
    pitch: usize,
}

/// Cross-attention keys and values of one encoded window, per decoder layer, in f16 (half
/// the memory a decoding step reads of them in f32): keys transposed in chunks of 16
/// positions, [H, P / 16, Dh, 16] (`P` is the `S` source positions rounded up to 16, the
/// padding zero: component `e` of a chunk's 16 keys is 16 contiguous values, and a head's
/// chunks follow one another, so the scores read the keys in one sequential pass), values as
/// [H, S, Dh].
#[derive(Clone)]
pub struct CrossKv {
    pub(crate) k: Vec<Vec<u16>>,
    pub(crate) v: Vec<Vec<u16>>,
    pub(crate) src: usize,
    pub(crate) pitch: usize,
}

impl std::fmt::Debug for CrossKv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CrossKv").field("layers", &self.k.len()).field("src", &self.src).field("pitch", &self.pitch).finish_non_exhaustive()
    }
}

/// A window ([`CrossKv`]: per decoder layer, the cross-attention keys
/// and values in f16) and the number of consecutive batch rows that attend to it.
pub(crate) struct CrossGroup<'a> {
    pub kv: &'a CrossKv,
    pub rows: usize,
}

fn add(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernels::{exp_in_place, gelu_erf_in_place};

    fn gelu_erf(v: f32) -> f32 {
        (candle_core::cpu::erf::erf_f32(v * std::f32::consts::FRAC_1_SQRT_2) + 1.) * 0.5 * v
    }

    #[test]
    fn exp_sum_matches_exp_in_place_and_lane_sum() {
        for n in [0usize, 1, 15, 16, 17, 1000, 1024] {
            let x: Vec<f32> = (0..n).map(|i| if i % 11 == 5 { f32::NEG_INFINITY } else { ((i * 7919 % 1013) as f32 - 900.0) * 0.1 }).collect();
            let m = 3.5f32;
            let mut b: Vec<f32> = x.iter().map(|v| v - m).collect();
            exp_in_place(&mut b);
            assert_eq!(exp_sum(&x, m).to_bits(), lane_sum(&b, |v| v).to_bits(), "n={n}");
        }
    }

    #[test]
    fn vector_exp_and_gelu_match_libm() {
        let xs: Vec<f32> = (-40_000..=40_000).map(|i| i as f32 * 0.0025).collect();
        let mut e: Vec<f32> = xs.iter().map(|v| v - 100.0 * (*v > 50.0) as i32 as f32).collect();
        let want: Vec<f32> = e.iter().map(|v| v.exp()).collect();
        exp_in_place(&mut e);
        for (a, b) in e.iter().zip(&want) {
            assert!((a - b).abs() <= 2e-7 * b.abs().max(1e-30), "{a} {b}");
        }
        let mut g = xs.clone();
        gelu_erf_in_place(&mut g);
        for (a, x) in g.iter().zip(&xs) {
            let b = gelu_erf(*x);
            assert!((a - b).abs() <= 3e-7 * x.abs().max(1.0), "gelu({x}) {a} {b}");
        }
        let mut z = vec![-100.0f32, -87.0, 0.0];
        exp_in_place(&mut z);
        assert_eq!(z[0], 0.0);
        assert!((z[1] - (-87f32).exp()).abs() < 1e-43);
        assert_eq!(z[2], 1.0);
    }
}
