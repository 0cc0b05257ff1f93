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
//! (`S[i][j]` at row `j`, as ggml stores it). Decode updates them in place; a prompt runs
//! position by position through the recurrence (its projections are still one product for
//! all rows). Every sequence's arithmetic is its own, so results do not depend on the batch.

use crate::backend::{Backend, DeltaInputs, DeltaVectors, Step};
use crate::config::HybridConfig;
use crate::kv::HostKv;
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

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
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

thread_local! {
    /// The convolution outputs of a sequence's rows.
    static CONV: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The CPU form of [`Backend::delta_net`]: for each sequence of the step, the convolution
/// over its rows (and its window), then its value heads on the kernel pool, each running
/// the rows in order through its state.
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
    CONV.with(|cell| {
        let x = &mut *cell.borrow_mut();
        for seg in &step.segs {
            let state = kv.state_mut(seg.seq);
            let st = state
                .get_mut(w.offset..w.offset + sh.layer_floats())
                .ok_or(Error::Internal("delta_net: the sequence state is smaller than the model's"))?;
            let (window, mats) = st.split_at_mut(sh.conv_floats());
            let n = seg.n;
            if x.len() < n * cd {
                x.resize(n * cd, 0.0);
            }
            for t in 0..n {
                let row = &p.qkv[(seg.row0 + t) * cd..(seg.row0 + t + 1) * cd];
                let xo = &mut x[t * cd..(t + 1) * cd];
                for (c, (o, &r)) in xo.iter_mut().zip(row).enumerate() {
                    let wc = &w.conv[c * taps..(c + 1) * taps];
                    // In ggml's order (`ssm_conv`): oldest tap first.
                    let mut sum = 0f32;
                    for (i, &wi) in wc[..taps - 1].iter().enumerate() {
                        sum += window[i * cd + c] * wi;
                    }
                    sum += r * wc[taps - 1];
                    *o = silu(sum);
                }
                if taps > 1 {
                    window.copy_within(cd.., 0);
                    window[(taps - 2) * cd..].copy_from_slice(row);
                }
                for head in xo[..2 * hk * s].chunks_exact_mut(s) {
                    l2_normalize(head, eps);
                }
            }
            let x = &x[..n * cd];
            let scale = 1.0 / (s as f32).sqrt();
            let (mp, op) = (SendPtr(mats.as_mut_ptr()), SendPtr(out.as_mut_ptr()));
            let head = |h: usize| {
                // SAFETY: head `h`'s matrix and its columns of the rows' outputs are written by
                // this call only (one call per head); both lie inside their buffers (checked
                // above: `mats` holds `v_heads` matrices, `out` the step's rows).
                let m = unsafe { std::slice::from_raw_parts_mut(mp.ptr().add(h * s * s), s * s) };
                let kh = h % hk;
                for t in 0..n {
                    let r = seg.row0 + t;
                    let xt = &x[t * cd..(t + 1) * cd];
                    let q = &xt[kh * s..(kh + 1) * s];
                    let k = &xt[hk * s + kh * s..hk * s + (kh + 1) * s];
                    let v = &xt[2 * hk * s + h * s..2 * hk * s + (h + 1) * s];
                    let decay = (softplus(p.alpha[r * hv + h] + w.dt_bias[h]) * w.a[h]).exp();
                    let b = 1.0 / (1.0 + (-p.beta[r * hv + h]).exp());
                    // SAFETY: as above.
                    let o = unsafe { std::slice::from_raw_parts_mut(op.ptr().add(r * vd + h * s), s) };
                    for (j, mj) in m.chunks_exact_mut(s).enumerate() {
                        for e in mj.iter_mut() {
                            *e *= decay;
                        }
                        let d = (v[j] - kernels::dot_f32(mj, k)) * b;
                        for (e, &ki) in mj.iter_mut().zip(k) {
                            *e += d * ki;
                        }
                        o[j] = kernels::dot_f32(mj, q) * scale;
                    }
                    let z = &p.z[r * vd + h * s..r * vd + (h + 1) * s];
                    let inv = 1.0 / (kernels::dot_f32(o, o) / s as f32 + eps).sqrt();
                    for ((o, &nw), &zj) in o.iter_mut().zip(&w.norm).zip(z) {
                        *o = *o * inv * nw * silu(zj);
                    }
                }
            };
            // Threads pay once a head's work is more than a few matrices.
            if hv == 1 || n * s * s * hv < 64 * 1024 {
                (0..hv).for_each(head);
            } else {
                pool::pool().run_chunks(hv, &head);
            }
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
}
