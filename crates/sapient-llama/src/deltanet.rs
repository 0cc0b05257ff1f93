//! Gated DeltaNet, the linear attention of hybrid models (Qwen3.5; llama.cpp's
//! `src/models/qwen35.cpp` and `delta-net-base.cpp`), as `model.rs` runs it beside
//! full-attention layers.
//!
//! A linear-attention layer projects the normed input into a mixed `q | k | v` row
//! (`attn_qkv`), an output gate `z` (`attn_gate`), and per value head a write strength `beta`
//! (`ssm_beta`) and a decay `alpha` (`ssm_alpha`). The mixed row goes through a short causal
//! convolution per channel (`ssm_conv1d`, kernel `conv_kernel`, over this row and the
//! sequence's previous `conv_kernel - 1` rows: the rolling convolution state) and SiLU; the
//! query and key heads are L2-normalised. Each value head `h` keeps a `head_dim x head_dim`
//! matrix `S` (the delta-rule state) and reads key head `h % k_heads`. Per position:
//!
//! ```text
//! S     *= exp(softplus(alpha + dt_bias) * a)          (a = -exp(A_log), stored as ssm_a)
//! delta  = (v - S k) * sigmoid(beta)
//! S     += delta k^T
//! o      = S q / sqrt(head_dim)
//! out    = rms_norm(o) * ssm_norm * silu(z)            (per head)
//! ```
//!
//! then `ssm_out` projects the heads back to the hidden size. Both states live in the KV
//! cache's sequences (`HostKv::state_mut`), one stretch per linear layer: the convolution
//! window `[conv_kernel - 1][conv dim]`, then the matrices `[v head][row j][column i]`
//! (`S[i][j]` at row `j`, as ggml stores it). Decode updates them in place, position by
//! position ([`head_recurrent`]); a sequence's stretch of [`CHUNKED_FROM`] rows or more (a
//! prompt) takes the chunked form ([`head_chunked`]), which agrees with it to rounding. Every
//! sequence's arithmetic is its own, so results do not depend on the batch.

use crate::backend::{Backend, DeltaInputs, DeltaVectors, Step};
use crate::config::HybridConfig;
use crate::kv::{HostKv, KvStorage};
use crate::{Error, Result};
use candle_core::{DType, Device};
use sapient_tensor::kernels::{self, pool, SendPtr};
use sapient_tensor::WeightSource;

/// A linear-attention layer's weights.
pub(crate) struct DeltaLayer<B: Backend> {
    pub qkv: B::Lin,
    pub z: B::Lin,
    pub beta: B::Lin,
    pub alpha: B::Lin,
    pub out: B::Lin,
    pub vectors: DeltaVectors<B::Vector>,
}

impl<B: Backend> DeltaLayer<B> {
    /// Layer `i`'s tensors (llama.cpp names), the `index`-th linear layer of the model.
    pub(crate) fn load(backend: &B, src: &dyn WeightSource, i: usize, index: usize, cfg: &HybridConfig, hidden: usize) -> Result<Self> {
        let shape = cfg.shape();
        let dev = Device::Cpu;
        let lin = |what: &str, out: usize| -> Result<B::Lin> {
            let name = format!("blk.{i}.{what}.weight");
            backend.linear(src.load_checked(&name, &[out, hidden], &dev)?, None, &name)
        };
        let values = |name: String, shape: &[usize]| -> Result<B::Vector> {
            let v = src.tensor(&name, shape, &dev, DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
            Ok(backend.vector(v))
        };
        let (cd, vd, hv) = (shape.conv_dim(), shape.value_dim(), shape.v_heads);
        let out_name = format!("blk.{i}.ssm_out.weight");
        Ok(Self {
            qkv: lin("attn_qkv", cd)?,
            z: lin("attn_gate", vd)?,
            beta: lin("ssm_beta", hv)?,
            alpha: lin("ssm_alpha", hv)?,
            out: backend.linear(src.load_checked(&out_name, &[hidden, vd], &dev)?, None, &out_name)?,
            vectors: DeltaVectors {
                shape,
                offset: index * shape.layer_floats(),
                conv: values(format!("blk.{i}.ssm_conv1d.weight"), &[cd, shape.conv_kernel])?,
                dt_bias: values(format!("blk.{i}.ssm_dt.bias"), &[hv])?,
                a: values(format!("blk.{i}.ssm_a"), &[hv])?,
                norm: values(format!("blk.{i}.ssm_norm.weight"), &[shape.head_dim])?,
            },
        })
    }

    pub(crate) fn linears(&mut self) -> [&mut B::Lin; 5] {
        [&mut self.qkv, &mut self.z, &mut self.beta, &mut self.alpha, &mut self.out]
    }
}

/// ggml's softplus (`op_softplus`).
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        (1.0 + x.exp()).ln()
    }
}

/// `x / max(|x|, eps)`, the sum of squares in f64 as ggml's `l2_norm`.
fn l2_normalize(x: &mut [f32], eps: f32) {
    let sum: f64 = x.iter().map(|&v| (v * v) as f64).sum();
    let scale = 1.0 / (sum.sqrt() as f32).max(eps);
    for v in x {
        *v *= scale;
    }
}

/// Per head, queries and gates of `n` rows of `heads x [query | gate]`.
pub(crate) fn split_query_gate(qg: &[f32], n: usize, heads: usize, hd: usize, q: &mut [f32], gate: &mut [f32]) {
    for (i, src) in qg[..n * heads * 2 * hd].chunks_exact(2 * hd).enumerate() {
        q[i * hd..(i + 1) * hd].copy_from_slice(&src[..hd]);
        gate[i * hd..(i + 1) * hd].copy_from_slice(&src[hd..]);
    }
}

/// `x *= sigmoid(g)`.
pub(crate) fn mul_sigmoid(x: &mut [f32], g: &[f32]) {
    for (x, &g) in x.iter_mut().zip(g) {
        *x /= 1.0 + (-g).exp();
    }
}

/// Positions per chunk of the chunked form (flash-linear-attention's and llama.cpp's 64).
pub(crate) const CHUNK: usize = 64;
/// A sequence's stretch of fewer rows than this runs through the recurrence position by
/// position (decode, speculative verification); longer ones take the chunked form.
pub(crate) const CHUNKED_FROM: usize = 8;

thread_local! {
    /// The convolution outputs of a step's rows.
    static CONV: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    /// A head's per-row log-decays and write strengths.
    static HEAD: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    /// The chunked form's scratch.
    static CHUNKS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    /// The convolution's taps as `[taps][channels]`.
    static TAPS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The causal convolution and SiLU of `n` mixed rows (`row`, `cd` wide) over the window of
/// the previous `taps - 1` rows (updated), into `x`; then the first `norm_heads` heads of
/// `s` values of each output row L2-normalised. Channels are vectorised (the taps
/// transposed to `[taps][cd]`) and, for a prompt, split over the kernel pool; each output
/// sums its taps oldest first from zero, as ggml's `ssm_conv` does. `save`: where the window
/// after each row goes (row `t`'s at `t * stride`).
#[allow(clippy::too_many_arguments)]
fn conv_rows(window: &mut [f32], conv: &[f32], rows: &[f32], n: usize, cd: usize, taps: usize, x: &mut [f32], norm_heads: usize, s: usize, eps: f32, save: Option<(&mut [f32], usize)>) {
    let h = taps - 1;
    if n * cd < 64 * 1024 {
        // A few rows (decode): the taps as stored, the same sums and SiLU as a prompt's.
        for t in 0..n {
            let xo = &mut x[t * cd..(t + 1) * cd];
            for (c, o) in xo.iter_mut().enumerate() {
                let mut sum = 0f32;
                for (i, &wi) in conv[c * taps..(c + 1) * taps].iter().enumerate() {
                    let src = if t + i < h { window[(t + i) * cd + c] } else { rows[(t + i - h) * cd + c] };
                    sum += src * wi;
                }
                *o = sum;
            }
            kernels::silu_in_place(xo);
        }
    } else {
        conv_prompt(window, conv, rows, n, cd, taps, x);
    }
    // Row j of (window, rows): the window after row t is rows t + 1 .. t + 1 + h of it.
    if let Some((dst, stride)) = save {
        for t in 0..n {
            for r in 0..h {
                let j = t + 1 + r;
                let src = if j < h { &window[j * cd..(j + 1) * cd] } else { &rows[(j - h) * cd..(j - h + 1) * cd] };
                dst[t * stride + r * cd..t * stride + (r + 1) * cd].copy_from_slice(src);
            }
        }
    }
    if h > 0 {
        // The window becomes the last h rows of (window, rows).
        if n >= h {
            window[..h * cd].copy_from_slice(&rows[(n - h) * cd..n * cd]);
        } else {
            window.copy_within(n * cd..h * cd, 0);
            window[(h - n) * cd..h * cd].copy_from_slice(&rows[..n * cd]);
        }
    }
    for xo in x[..n * cd].chunks_exact_mut(cd) {
        for head in xo[..norm_heads * s].chunks_exact_mut(s) {
            l2_normalize(head, eps);
        }
    }
}

/// [`conv_rows`]'s convolution and SiLU of a prompt's rows (the window not yet updated).
fn conv_prompt(window: &[f32], conv: &[f32], rows: &[f32], n: usize, cd: usize, taps: usize, x: &mut [f32]) {
    let h = taps - 1;
    TAPS.with(|cell| {
        let wt = &mut *cell.borrow_mut();
        wt.clear();
        wt.extend((0..taps).flat_map(|i| (0..cd).map(move |c| conv[c * taps + i])));
        let wt = &wt[..];
        let xp = SendPtr(x.as_mut_ptr());
        let win = window;
        // Channels c0..c1 of every row.
        let job = |c0: usize, c1: usize| {
            for t in 0..n {
                // SAFETY: row t's channels c0..c1 of `x` belong to this job only.
                let xo = unsafe { std::slice::from_raw_parts_mut(xp.ptr().add(t * cd + c0), c1 - c0) };
                xo.fill(0.0);
                for (i, w) in wt.chunks_exact(cd).enumerate() {
                    // Tap i of row t reads row t + i - h of the window followed by the rows.
                    let src = if t + i < h { &win[(t + i) * cd..] } else { &rows[(t + i - h) * cd..] };
                    for ((o, &a), &b) in xo.iter_mut().zip(&src[c0..c1]).zip(&w[c0..c1]) {
                        *o += a * b;
                    }
                }
                kernels::silu_in_place(xo);
            }
        };
        const PIECE: usize = 512;
        if cd <= PIECE {
            job(0, cd);
        } else {
            pool::pool().run_chunks(cd.div_ceil(PIECE), &|j| job(j * PIECE, ((j + 1) * PIECE).min(cd)));
        }
    });
}

/// One value head's rows of a sequence: `x` holds the rows' convolved `q | k | v` (`cd`
/// apart; the head's query, key and value start at `q0`, `k0`, `v0`), `g` and `b` their
/// log-decays and write strengths. Outputs (before the gated norm) go to `o`, row `t` at
/// `o.add(t * ld)`, `s` values.
pub(crate) struct HeadRows<'a> {
    pub x: &'a [f32],
    pub cd: usize,
    pub q0: usize,
    pub k0: usize,
    pub v0: usize,
    pub g: &'a [f32],
    pub b: &'a [f32],
}

/// Run a head's rows through its state `m` position by position; with `save`, a copy of
/// the state after row `t` goes to `save.0.add(t * save.1)`.
///
/// # Safety
/// `o.add(t * ld)` must be valid for `s` writes for every row `t`, and written by no one
/// else; so must `save.0.add(t * save.1)` for `s * s` writes.
pub(crate) unsafe fn head_recurrent(m: &mut [f32], s: usize, r: &HeadRows<'_>, scale: f32, o: *mut f32, ld: usize, save: Option<(*mut f32, usize)>) {
    for t in 0..r.g.len() {
        let xt = &r.x[t * r.cd..(t + 1) * r.cd];
        // SAFETY: per the contract.
        let ot = unsafe { std::slice::from_raw_parts_mut(o.add(t * ld), s) };
        kernels::delta::delta_step(m, &xt[r.k0..r.k0 + s], &xt[r.q0..r.q0 + s], &xt[r.v0..r.v0 + s], r.g[t].exp(), r.b[t], scale, ot);
        if let Some((dst, stride)) = save {
            // SAFETY: per the contract.
            unsafe { std::slice::from_raw_parts_mut(dst.add(t * stride), s * s) }.copy_from_slice(m);
        }
    }
}

/// Run a head's rows through its state `m` in chunks of [`CHUNK`] positions, the gated
/// delta rule's chunked (WY) form: within a chunk starting from state `M0`, with `G_t` the
/// cumulative log-decay and `u_t` the written value,
///
/// ```text
/// u_t = b_t (v_t - e^{G_t} M0 k_t - sum_{r<t} e^{G_t - G_r} (k_r . k_t) u_r)
/// o_t = scale (e^{G_t} M0 q_t + sum_{r<=t} e^{G_t - G_r} (k_r . q_t) u_r)
/// M   = e^{G_last} M0 + sum_r e^{G_last - G_r} u_r k_r^T
/// ```
///
/// so a chunk costs products of its key/query rows with the state and with each other (the
/// forward substitution for `u` runs over the chunk's rows). Results equal the recurrence's
/// up to rounding (test `chunked_form_matches_the_recurrence`).
///
/// # Safety
/// As [`head_recurrent`].
pub(crate) unsafe fn head_chunked(m: &mut [f32], s: usize, r: &HeadRows<'_>, scale: f32, o: *mut f32, ld: usize, scratch: &mut Vec<f32>) {
    use kernels::delta::{axpy, dots_nt_many, rank_update};
    let n = r.g.len();
    let need = 3 * CHUNK + 2 * CHUNK * CHUNK + 3 * CHUNK * s;
    if scratch.len() < need {
        scratch.resize(need, 0.0);
    }
    let (gc, rest) = scratch.split_at_mut(CHUNK);
    let (eg, rest) = rest.split_at_mut(CHUNK);
    // Row `t`'s decays from each earlier row `r <= t`: e^{G_t - G_r}, shared by `u_t` and `o_t`.
    let (dec, rest) = rest.split_at_mut(CHUNK);
    let (kk, rest) = rest.split_at_mut(CHUNK * CHUNK);
    let (qk, rest) = rest.split_at_mut(CHUNK * CHUNK);
    let (mk, rest) = rest.split_at_mut(CHUNK * s);
    let (mq, u) = rest.split_at_mut(CHUNK * s);
    let mut t0 = 0;
    while t0 < n {
        let c = (n - t0).min(CHUNK);
        let x = &r.x[t0 * r.cd..];
        let (k, q) = (&x[r.k0..], &x[r.q0..]);
        let mut acc = 0f32;
        for t in 0..c {
            acc += r.g[t0 + t];
            gc[t] = acc;
            eg[t] = acc.exp();
        }
        dots_nt_many(&mut [(k, &mut *mk), (q, &mut *mq)], r.cd, c, m, s, s, s, s);
        dots_nt_many(&mut [(k, &mut *kk), (q, &mut *qk)], r.cd, c, k, r.cd, c, s, CHUNK);
        for t in 0..c {
            let bt = r.b[t0 + t];
            let v = &x[t * r.cd + r.v0..t * r.cd + r.v0 + s];
            let (done, ut) = u.split_at_mut(t * s);
            let ut = &mut ut[..s];
            for ((uj, &vj), &mkj) in ut.iter_mut().zip(v).zip(&mk[t * s..(t + 1) * s]) {
                *uj = bt * (vj - eg[t] * mkj);
            }
            for (d, &g) in dec[..=t].iter_mut().zip(&gc[..=t]) {
                *d = (gc[t] - g).exp();
            }
            for (rr, ur) in done.chunks_exact(s).enumerate() {
                axpy(-bt * dec[rr] * kk[t * CHUNK + rr], ur, ut);
            }
            // SAFETY: per the contract (row `t0 + t`).
            let ot = unsafe { std::slice::from_raw_parts_mut(o.add((t0 + t) * ld), s) };
            for (oj, &mqj) in ot.iter_mut().zip(&mq[t * s..(t + 1) * s]) {
                *oj = eg[t] * mqj;
            }
            for (rr, ur) in u[..(t + 1) * s].chunks_exact(s).enumerate() {
                axpy(dec[rr] * qk[t * CHUNK + rr], ur, ot);
            }
            for oj in ot.iter_mut() {
                *oj *= scale;
            }
        }
        let last = gc[c - 1];
        for (t, ut) in u[..c * s].chunks_exact_mut(s).enumerate() {
            let w = (last - gc[t]).exp();
            for e in ut.iter_mut() {
                *e *= w;
            }
        }
        rank_update(m, s, last.exp(), u, k, r.cd, c);
        t0 += c;
    }
}

/// The CPU form of [`Backend::delta_net`]: for each sequence of the step, the convolution
/// over its rows (and its window); then every (sequence, value head) on the kernel pool,
/// each running its rows through its state: position by position for fewer than
/// [`CHUNKED_FROM`] rows, in chunks otherwise.
pub(crate) fn delta_net_cpu(kv: &mut HostKv, w: &DeltaVectors<Vec<f32>>, p: DeltaInputs<'_, Vec<f32>>, step: &Step, eps: f32, out: &mut [f32]) -> Result<()> {
    let sh = w.shape;
    let (cd, vd, hv, hk, s, taps) = (sh.conv_dim(), sh.value_dim(), sh.v_heads, sh.k_heads, sh.head_dim, sh.conv_kernel);
    let rows = step.pos.len();
    if p.qkv.len() < rows * cd || p.z.len() < rows * vd || p.beta.len() < rows * hv || p.alpha.len() < rows * hv || out.len() < rows * vd {
        return Err(Error::Internal("delta_net: buffers shorter than the rows"));
    }
    if w.conv.len() != cd * taps || w.dt_bias.len() != hv || w.a.len() != hv || w.norm.len() != s {
        return Err(Error::Internal("delta_net: weights do not match the layer's shape"));
    }
    if step.segs.iter().any(|g| g.row0 + g.n > rows) {
        return Err(Error::Internal("delta_net: a sequence's rows lie outside the step"));
    }
    for (i, a) in step.segs.iter().enumerate() {
        if step.segs[..i].iter().any(|b| b.seq == a.seq) {
            return Err(Error::Internal("delta_net: a sequence twice in one step"));
        }
    }
    CONV.with(|cell| {
        let x = &mut *cell.borrow_mut();
        if x.len() < rows * cd {
            x.resize(rows * cd, 0.0);
        }
        let mut mats = Vec::with_capacity(step.segs.len());
        // Per sequence: where the matrices after each row go, when the step keeps them.
        let mut saves: Vec<Option<SendPtr<f32>>> = Vec::with_capacity(step.segs.len());
        let sf = kv.state_floats();
        for seg in &step.segs {
            let save: Option<*mut f32> = if step.keep_rows && seg.keep && seg.n < CHUNKED_FROM {
                Some(kv.row_states_mut(seg.seq, seg.start, seg.n).as_mut_ptr())
            } else {
                kv.forget_row_states(seg.seq);
                None
            };
            let st = kv
                .state_mut(seg.seq)
                .get_mut(w.offset..w.offset + sh.layer_floats())
                .ok_or(Error::Internal("delta_net: the sequence state is smaller than the model's"))?;
            let (window, m) = st.split_at_mut(sh.conv_floats());
            let (r0, n) = (seg.row0 * cd, seg.n);
            // SAFETY: `row_states_mut` gave `n` states of `sf` values; this layer's stretch of
            // each lies inside (the state is `sf` values, checked above).
            let win_save = save.map(|p| (&mut unsafe { std::slice::from_raw_parts_mut(p, n * sf) }[w.offset..], sf));
            conv_rows(window, &w.conv, &p.qkv[r0..r0 + n * cd], n, cd, taps, &mut x[r0..r0 + n * cd], 2 * hk, s, eps, win_save);
            mats.push(SendPtr(m.as_mut_ptr()));
            // SAFETY: as above: the matrices start after the window in this layer's stretch.
            saves.push(save.map(|p| SendPtr(unsafe { p.add(w.offset + sh.conv_floats()) })));
        }
        let x = &x[..rows * cd];
        let scale = 1.0 / (s as f32).sqrt();
        let op = SendPtr(out.as_mut_ptr());
        let job = |j: usize| {
            let (si, h) = (j / hv, j % hv);
            let seg = &step.segs[si];
            let n = seg.n;
            // SAFETY: each (sequence, head) is one job: its matrix (inside the sequence's state,
            // distinct sequences checked above) and its columns of the sequence's output rows
            // (inside `out`, checked above) are touched by this job only.
            let m = unsafe { std::slice::from_raw_parts_mut(mats[si].ptr().add(h * s * s), s * s) };
            HEAD.with(|cell| {
                let scratch = &mut *cell.borrow_mut();
                if scratch.len() < 2 * n + s {
                    scratch.resize(2 * n + s, 0.0);
                }
                let (g, rest) = scratch.split_at_mut(n);
                let (b, gate) = rest.split_at_mut(n);
                let gate = &mut gate[..s];
                for t in 0..n {
                    let r = seg.row0 + t;
                    g[t] = softplus(p.alpha[r * hv + h] + w.dt_bias[h]) * w.a[h];
                    b[t] = 1.0 / (1.0 + (-p.beta[r * hv + h]).exp());
                }
                let kh = h % hk;
                let rows = HeadRows { x: &x[seg.row0 * cd..(seg.row0 + n) * cd], cd, q0: kh * s, k0: hk * s + kh * s, v0: 2 * hk * s + h * s, g, b };
                // SAFETY: as above; row `t`'s columns of this head start at `o + t * vd`.
                let o = unsafe { op.ptr().add(seg.row0 * vd + h * s) };
                if n < CHUNKED_FROM {
                    // SAFETY: as above; head `h`'s matrix after each row lies in the row states
                    // kept for this sequence, touched by this job only.
                    let save = saves[si].as_ref().map(|p| (unsafe { p.ptr().add(h * s * s) }, sf));
                    // SAFETY: as above.
                    unsafe { head_recurrent(m, s, &rows, scale, o, vd, save) };
                } else {
                    // SAFETY: as above.
                    CHUNKS.with(|c| unsafe { head_chunked(m, s, &rows, scale, o, vd, &mut c.borrow_mut()) });
                }
                for t in 0..n {
                    let r = seg.row0 + t;
                    // SAFETY: as above.
                    let o = unsafe { std::slice::from_raw_parts_mut(op.ptr().add(r * vd + h * s), s) };
                    let z = &p.z[r * vd + h * s..r * vd + (h + 1) * s];
                    let inv = 1.0 / (kernels::dot_f32(o, o) / s as f32 + eps).sqrt();
                    gate.copy_from_slice(z);
                    kernels::silu_in_place(gate);
                    for ((o, &nw), &gj) in o.iter_mut().zip(&w.norm).zip(&*gate) {
                        *o = *o * inv * nw * gj;
                    }
                }
            });
        };
        let jobs = step.segs.len() * hv;
        // Threads pay once the step's work is more than a few matrices.
        if jobs == 1 || rows * s * s * hv < 64 * 1024 {
            (0..jobs).for_each(job);
        } else {
            pool::pool().run_chunks(jobs, &job);
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ggml's softplus threshold and its L2 norm's epsilon floor.
    #[test]
    fn softplus_and_l2_norm_follow_ggml() {
        assert_eq!(softplus(30.0), 30.0);
        assert!((softplus(0.0) - std::f32::consts::LN_2).abs() < 1e-7);
        let mut x = [3.0f32, 4.0];
        l2_normalize(&mut x, 1e-6);
        assert!((x[0] - 0.6).abs() < 1e-7 && (x[1] - 0.8).abs() < 1e-7);
        let mut z = [0.0f32; 4];
        l2_normalize(&mut z, 1e-6);
        assert_eq!(z, [0.0; 4]);
    }

    /// The chunked form gives the recurrence's outputs and final state: 150 positions (two
    /// full chunks and a partial one) of a 32-wide head (and a 128-wide one, the SIMD path of
    /// real models), from a non-zero state, decays and strengths spread as in real models.
    /// Tolerance: 2e-4 times the largest magnitude (the two sum in different orders).
    #[test]
    fn chunked_form_matches_the_recurrence() {
        let mut seed = 7u64;
        let mut rnd = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        };
        for s in [32, 128] {
            let n = 150;
            let cd = 3 * s + 5;
            let mut x: Vec<f32> = (0..n * cd).map(|_| rnd()).collect();
            for t in 0..n {
                for h in 0..2 {
                    l2_normalize(&mut x[t * cd + h * s..t * cd + (h + 1) * s], 1e-6);
                }
            }
            let g: Vec<f32> = (0..n).map(|_| -softplus(rnd() * 2.0) * 0.6).collect();
            let b: Vec<f32> = (0..n).map(|_| 1.0 / (1.0 + (-2.0 * rnd()).exp())).collect();
            let rows = HeadRows { x: &x, cd, q0: 0, k0: s, v0: 2 * s + 5, g: &g, b: &b };
            let m0: Vec<f32> = (0..s * s).map(|_| rnd() * 0.5).collect();
            let scale = 1.0 / (s as f32).sqrt();
            let (mut ma, mut mb) = (m0.clone(), m0);
            let (mut oa, mut ob) = (vec![0f32; n * s], vec![0f32; n * s]);
            let mut scratch = Vec::new();
            // SAFETY: `oa` and `ob` hold `n` rows of `s`.
            unsafe {
                head_recurrent(&mut ma, s, &rows, scale, oa.as_mut_ptr(), s, None);
                head_chunked(&mut mb, s, &rows, scale, ob.as_mut_ptr(), s, &mut scratch);
            }
            let close = |a: &[f32], b: &[f32], what: &str| {
                let top = a.iter().fold(0f32, |m, v| m.max(v.abs()));
                let worst = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
                assert!(worst <= 2e-4 * top, "s {s}, {what}: differs by {worst} (largest {top})");
            };
            close(&oa, &ob, "outputs");
            close(&ma, &mb, "state");
        }
    }
}
