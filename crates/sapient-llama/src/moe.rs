//! Mixture-of-experts feed-forward layers (qwen3moe, qwen2moe, Mixtral-style llama, gpt-oss),
//! as llama.cpp's `build_moe_ffn` computes them.
//!
//! A router (`ffn_gate_inp`, a linear layer of the normed hidden state, with a bias in
//! gpt-oss) scores every expert; each row goes to its `experts_used` best experts, weighted
//! by the [`Gating`] of its architecture: the softmax over all experts, taken at the chosen
//! ones and (`norm_weights`) renormalized to sum to 1 (qwen3moe, Mixtral), or the softmax of
//! the chosen experts' logits alone (gpt-oss). Each expert is a gated MLP whose weights are
//! slices of the GGUF's stacked tensors `ffn_{gate,up,down}_exps` (`[experts, out, in]`);
//! the layer's output is the weighted sum of its experts' outputs, added in the order of
//! their rank, as llama.cpp adds them. Some architectures (qwen2moe) add a shared expert that
//! every row goes through: a gated MLP (`ffn_{gate,up,down}_shexp`) scaled per row by the
//! sigmoid of its own gate (`ffn_gate_inp_shexp`, one output).
//!
//! The rows of a step are grouped by expert: each expert's weights are read once for all
//! the rows routed to it (llama.cpp's `mul_mat_id`), so batching still pays with experts,
//! and prefill the same. With `exact`, every product computes each row as it is alone (the
//! quantized kernels do), so a row's result does not depend on the batch.

use crate::{Error, Result};
use candle_core::quantized::{ggml_file::qtensor_from_ggml, QTensor};
use candle_core::Device;
use sapient_tensor::{GgmlType, GgufFile, MappedBytes, Weight, WeightSource};
use std::cell::RefCell;
use std::sync::Arc;

/// How router logits become expert weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gating {
    /// Softmax over all experts, then the top k of those probabilities (qwen3moe, Mixtral).
    Softmax,
    /// Top k of the logits, then the softmax over the chosen ones (gpt-oss).
    SoftmaxWeight,
}

/// The experts' gated activation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ExpertActivation {
    /// silu(gate) * up.
    Silu,
    /// gpt-oss's clamped SwiGLU: `x = min(gate, limit)`, `y = clamp(up, -limit, limit)`,
    /// `x * sigmoid(alpha * x) * (y + 1)` (ggml's `swiglu_oai`).
    SwigluOai { alpha: f32, limit: f32 },
}

/// A mixture-of-experts feed-forward layer's hyper-parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    pub experts: usize,
    /// Experts each token is routed to (top k).
    pub experts_used: usize,
    /// Intermediate width of one expert.
    pub expert_ff: usize,
    pub gating: Gating,
    /// Renormalize the chosen experts' weights to sum to 1.
    pub norm_weights: bool,
    /// Chosen experts' weights multiplied by this.
    pub weights_scale: f32,
    pub activation: ExpertActivation,
    /// Intermediate width of the shared expert, where the layers have one (qwen2moe).
    pub shared_ff: Option<usize>,
}

/// Which of llama.cpp's MoE graphs a model's metadata is read for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MoeStyle {
    /// Softmax over all experts, the chosen weights renormalized, SwiGLU (qwen3moe, Mixtral).
    Renormalized,
    /// gpt-oss's gating and activation.
    GptOss,
    /// qwen2moe: softmax weights as they are (not renormalized, not scaled) and a shared expert.
    Qwen2Moe,
}

impl MoeConfig {
    /// From GGUF metadata (`{arch}.expert_count`, `expert_used_count`,
    /// `expert_feed_forward_length`, `expert_shared_feed_forward_length`), as llama.cpp reads
    /// it for `arch`: `None` for a dense model.
    pub(crate) fn from_gguf(g: &GgufFile, arch_name: &str, dense_ff: usize, style: MoeStyle) -> Result<Option<Self>> {
        let key = |k: &str| format!("{arch_name}.{k}");
        let experts = match g.get(&key("expert_count")) {
            Some(_) => g.get_usize(&key("expert_count"))?,
            None => 0,
        };
        if experts == 0 {
            return Ok(None);
        }
        let bad = |what: String| Error::Config(format!("{}: {what}", g.path().display()));
        let used = g.get_usize(&key("expert_used_count"))?;
        if used == 0 || used > experts {
            return Err(bad(format!("expert_used_count {used} is not within 1..={experts} experts")));
        }
        let get = |k: &str| -> Result<Option<usize>> {
            match g.get(&key(k)) {
                Some(_) => Ok(Some(g.get_usize(&key(k))?)),
                None => Ok(None),
            }
        };
        let expert_ff = match get("expert_feed_forward_length")? {
            Some(ff) => ff,
            // llama.cpp's qwen2moe splits the dense width among the chosen experts.
            None if style == MoeStyle::Qwen2Moe => dense_ff / used,
            None => dense_ff,
        };
        let weights_scale = match g.get(&key("expert_weights_scale")) {
            // llama.cpp's qwen2moe does not read the key.
            Some(_) if style != MoeStyle::Qwen2Moe => g.get_f64(&key("expert_weights_scale"))? as f32,
            _ => 0.0,
        };
        let (gating, norm_weights, activation) = match style {
            // llama.cpp's openai-moe graph: alpha and limit are constants there.
            MoeStyle::GptOss => (Gating::SoftmaxWeight, false, ExpertActivation::SwigluOai { alpha: 1.702, limit: 7.0 }),
            MoeStyle::Renormalized => (Gating::Softmax, true, ExpertActivation::Silu),
            MoeStyle::Qwen2Moe => (Gating::Softmax, false, ExpertActivation::Silu),
        };
        let shared_ff = match style {
            MoeStyle::Qwen2Moe => Some(get("expert_shared_feed_forward_length")?.unwrap_or(dense_ff)),
            _ => None,
        };
        if expert_ff == 0 || shared_ff == Some(0) {
            return Err(bad("an expert's feed-forward width is 0".into()));
        }
        Ok(Some(Self {
            experts,
            experts_used: used,
            expert_ff,
            gating,
            norm_weights,
            weights_scale: if weights_scale == 0.0 { 1.0 } else { weights_scale },
            activation,
            shared_ff,
        }))
    }
}

/// One layer's experts in a backend's form: expert `e` is `gate[e]`, `up[e]` (`[ff, hidden]`)
/// and `down[e]` (`[hidden, ff]`), each with its bias where the GGUF has one.
pub(crate) struct Experts<L> {
    pub gate: Vec<L>,
    pub up: Vec<L>,
    pub down: Vec<L>,
    pub shared: Option<SharedExpert<L>>,
    pub cfg: MoeConfig,
}

/// The expert every row goes through: `gate`, `up` (`[shared_ff, hidden]`), `down`
/// (`[hidden, shared_ff]`), and `gate_inp` (`[1, hidden]`), whose sigmoid scales its output.
pub(crate) struct SharedExpert<L> {
    pub gate_inp: L,
    pub gate: L,
    pub up: L,
    pub down: L,
}

impl<L> Experts<L> {
    /// Every expert matrix (for the backend's last pass over the weights).
    pub(crate) fn linears(&mut self) -> impl Iterator<Item = &mut L> {
        let shared = self.shared.iter_mut().flat_map(|s| [&mut s.gate_inp, &mut s.gate, &mut s.up, &mut s.down]);
        self.gate.iter_mut().chain(self.up.iter_mut()).chain(self.down.iter_mut()).chain(shared)
    }
}

/// A linear layer from a weight, its bias and its name (for errors).
pub(crate) type LinearFrom<'a, L> = dyn Fn(Weight, Option<Vec<f32>>, &str) -> Result<L> + 'a;
/// A linear layer reading blocks in place from the file's pages: the format, rows, columns,
/// the blocks, the bias, the name (`None`: the backend takes a copy of that format instead).
pub(crate) type MappedFrom<'a, L> = dyn Fn(GgmlType, usize, usize, MappedBytes, Option<Vec<f32>>, &str) -> Result<Option<L>> + 'a;

/// A copy of `bytes` that starts 8-byte aligned (candle reads blocks in place).
fn aligned(bytes: &[u8]) -> Vec<u64> {
    let mut v = vec![0u64; bytes.len().div_ceil(8)];
    bytemuck::cast_slice_mut::<u64, u8>(&mut v)[..bytes.len()].copy_from_slice(bytes);
    v
}

/// The `experts` matrices `[rows, cols]` of the stacked tensor `name` (`[experts, rows, cols]`).
fn split(src: &dyn WeightSource, name: &str, experts: usize, rows: usize, cols: usize) -> Result<Vec<Weight>> {
    let w = src.load_checked(name, &[experts, rows, cols], &Device::Cpu)?;
    match w {
        Weight::Dense(t) => (0..experts).map(|e| Ok(Weight::Dense(t.get(e)?))).collect(),
        Weight::Quantized(q) => {
            let data = q.data()?;
            if !data.len().is_multiple_of(experts) {
                return Err(Error::Config(format!("{}: {name} does not split into {experts} experts", src.location().display())));
            }
            let per = data.len() / experts;
            (0..experts)
                .map(|e| {
                    let buf = aligned(&data[e * per..(e + 1) * per]);
                    let bytes = &bytemuck::cast_slice::<u64, u8>(&buf)[..per];
                    let q: QTensor = qtensor_from_ggml(q.dtype(), bytes, vec![rows, cols], &Device::Cpu)?;
                    Ok(Weight::Quantized(Arc::new(q)))
                })
                .collect()
        }
    }
}

/// Load layer `prefix`'s experts (`{prefix}.ffn_{gate,up,down}_exps.weight`, biases where
/// present) as a backend's linear layers: `mapped` makes one reading an expert's blocks in
/// place from the file's memory map (the experts are most of a mixture's bytes: they stay
/// file pages, read from disk as they are first used and evictable, never anonymous memory),
/// `linear` from a loaded copy, for the formats `mapped` declines and sources without a map.
pub(crate) fn load_experts<L>(src: &dyn WeightSource, prefix: &str, cfg: &MoeConfig, hidden: usize, linear: &LinearFrom<'_, L>, mapped: &MappedFrom<'_, L>) -> Result<Experts<L>> {
    let (e, ff) = (cfg.experts, cfg.expert_ff);
    let part = |what: &str, rows: usize, cols: usize| -> Result<Vec<L>> {
        let name = format!("{prefix}.{what}.weight");
        let bias = format!("{prefix}.{what}.bias");
        let biases = if src.contains(&bias) {
            let t = src.tensor(&bias, &[e, rows], &Device::Cpu, candle_core::DType::F32)?;
            t.to_vec2::<f32>()?.into_iter().map(Some).collect()
        } else {
            vec![None; e]
        };
        if let Some((ty, data)) = src.ggml_mapped(&name) {
            if src.shape_of(&name).as_deref() != Some(&[e, rows, cols][..]) || !data.len().is_multiple_of(e) {
                return Err(Error::Config(format!("{}: {name} is not {ty} [{e}, {rows}, {cols}]", src.location().display())));
            }
            let per = data.len() / e;
            // Experts are read in place: fault their pages in at load while the file fits in
            // memory, not during the first tokens.
            data.prefault();
            let mut out = Vec::with_capacity(e);
            for (i, b) in biases.iter().enumerate() {
                let blocks = data.slice(i * per..(i + 1) * per).ok_or(Error::Internal("moe: an expert's bytes outside its tensor"))?;
                match mapped(ty, rows, cols, blocks, b.clone(), &format!("{name}[{i}]"))? {
                    Some(l) => out.push(l),
                    None => break,
                }
            }
            if out.len() == e {
                return Ok(out);
            }
        }
        split(src, &name, e, rows, cols)?
            .into_iter()
            .zip(biases)
            .enumerate()
            .map(|(i, (w, b))| linear(w, b, &format!("{name}[{i}]")))
            .collect()
    };
    let shared = match cfg.shared_ff {
        Some(sff) => {
            let one = |what: &str, rows: usize, cols: usize| -> Result<L> {
                let name = format!("{prefix}.{what}.weight");
                linear(src.load_checked(&name, &[rows, cols], &Device::Cpu)?, None, &name)
            };
            // The gate is a vector in the GGUF: a linear layer of one output.
            let name = format!("{prefix}.ffn_gate_inp_shexp.weight");
            let gate_inp = src.tensor(&name, &[hidden], &Device::Cpu, candle_core::DType::F32)?.reshape((1, hidden))?;
            Some(SharedExpert {
                gate_inp: linear(Weight::Dense(gate_inp), None, &name)?,
                gate: one("ffn_gate_shexp", sff, hidden)?,
                up: one("ffn_up_shexp", sff, hidden)?,
                down: one("ffn_down_shexp", hidden, sff)?,
            })
        }
        None => None,
    };
    Ok(Experts { gate: part("ffn_gate_exps", ff, hidden)?, up: part("ffn_up_exps", ff, hidden)?, down: part("ffn_down_exps", hidden, ff)?, shared, cfg: cfg.clone() })
}

/// The experts row `logits` (one per expert) is routed to and their weights, best first,
/// into `out` (cleared first), as llama.cpp's `build_moe_ffn` picks and weighs them.
pub(crate) fn route(cfg: &MoeConfig, logits: &[f32], probs: &mut Vec<f32>, out: &mut Vec<(usize, f32)>) {
    probs.clear();
    probs.extend_from_slice(logits);
    if cfg.gating == Gating::Softmax {
        softmax(probs);
    }
    out.clear();
    // Top k: the largest first, the lower index first among equals (in IEEE total order, so
    // that NaN logits from a broken checkpoint still give k experts).
    for (i, &p) in probs.iter().enumerate() {
        if out.len() < cfg.experts_used || p.total_cmp(&out[out.len() - 1].1).is_gt() {
            let at = out.iter().position(|&(_, q)| p.total_cmp(&q).is_gt()).unwrap_or(out.len());
            out.insert(at, (i, p));
            out.truncate(cfg.experts_used);
        }
    }
    if cfg.gating == Gating::SoftmaxWeight {
        let mut w: Vec<f32> = out.iter().map(|x| x.1).collect();
        softmax(&mut w);
        for (o, w) in out.iter_mut().zip(w) {
            o.1 = w;
        }
    }
    if cfg.norm_weights {
        // ggml clamps the sum to f16's smallest normal.
        let sum = out.iter().map(|x| x.1).sum::<f32>().max(6.103_515_6e-5);
        for o in out.iter_mut() {
            o.1 /= sum;
        }
    }
    if cfg.weights_scale != 1.0 {
        for o in out.iter_mut() {
            o.1 *= cfg.weights_scale;
        }
    }
}

/// Softmax in place (the sum in f64, as ggml's `soft_max`).
fn softmax(x: &mut [f32]) {
    let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let mut sum = 0f64;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v as f64;
    }
    let s = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= s;
    }
}

/// `g = act(g, u)` element-wise.
pub(crate) fn activate(act: ExpertActivation, g: &mut [f32], u: &[f32]) {
    match act {
        ExpertActivation::Silu => sapient_tensor::kernels::silu_mul_range(g, u),
        ExpertActivation::SwigluOai { alpha, limit } => {
            for (g, &u) in g.iter_mut().zip(u) {
                let x = g.min(limit);
                let y = u.clamp(-limit, limit);
                *g = x / (1.0 + (alpha * -x).exp()) * (y + 1.0);
            }
        }
    }
}

/// A step's routing and the rows gathered for one expert, kept from step to step.
#[derive(Default)]
struct Scratch {
    /// Per row, its experts and weights (`experts_used` each).
    routes: Vec<(usize, f32)>,
    probs: Vec<f32>,
    one: Vec<(usize, f32)>,
    /// Per expert, the (row, rank) pairs routed to it.
    members: Vec<Vec<(usize, usize)>>,
    x: Vec<f32>,
    g: Vec<f32>,
    u: Vec<f32>,
    d: Vec<f32>,
    /// Per (row, rank), the weighted expert output.
    parts: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

fn grow(v: &mut Vec<f32>, n: usize) {
    if v.len() < n {
        v.resize(n, 0.0);
    }
}

/// The MoE feed-forward of `n` rows of `xn` (normed, `hidden` wide) given their router
/// `logits` (`experts` wide), into `out` (`n x hidden`) on the CPU backend: each expert runs
/// once over all the rows routed to it. `run(lins, x, m, out)` runs linear layers of one
/// input (1 or 2 of them) on `m` rows.
#[allow(clippy::type_complexity)]
pub(crate) fn forward<L>(
    ex: &Experts<L>,
    xn: &[f32],
    logits: &[f32],
    n: usize,
    hidden: usize,
    out: &mut [f32],
    run: &dyn Fn(&[&L], &[f32], usize, &mut [&mut [f32]]) -> Result<()>,
) -> Result<()> {
    let cfg = &ex.cfg;
    let (e_n, k, ff) = (cfg.experts, cfg.experts_used, cfg.expert_ff);
    if logits.len() < n * e_n || xn.len() < n * hidden || out.len() < n * hidden {
        return Err(Error::Internal("moe: buffers shorter than the rows"));
    }
    SCRATCH.with(|s| {
        let s = &mut *s.borrow_mut();
        s.routes.clear();
        s.members.resize_with(e_n, Vec::new);
        for m in s.members.iter_mut() {
            m.clear();
        }
        for r in 0..n {
            route(cfg, &logits[r * e_n..(r + 1) * e_n], &mut s.probs, &mut s.one);
            for (j, &(e, w)) in s.one.iter().enumerate() {
                s.members[e].push((r, j));
                s.routes.push((e, w));
            }
        }
        grow(&mut s.parts, n * k * hidden);
        for e in 0..e_n {
            let m = s.members[e].len();
            if m == 0 {
                continue;
            }
            grow(&mut s.x, m * hidden);
            grow(&mut s.g, m * ff);
            grow(&mut s.u, m * ff);
            grow(&mut s.d, m * hidden);
            for (i, &(r, _)) in s.members[e].iter().enumerate() {
                s.x[i * hidden..(i + 1) * hidden].copy_from_slice(&xn[r * hidden..(r + 1) * hidden]);
            }
            run(&[&ex.gate[e], &ex.up[e]], &s.x[..m * hidden], m, &mut [&mut s.g[..m * ff], &mut s.u[..m * ff]])?;
            activate(cfg.activation, &mut s.g[..m * ff], &s.u[..m * ff]);
            run(&[&ex.down[e]], &s.g[..m * ff], m, &mut [&mut s.d[..m * hidden]])?;
            for (i, &(r, j)) in s.members[e].iter().enumerate() {
                let w = s.routes[r * k + j].1;
                let part = &mut s.parts[(r * k + j) * hidden..(r * k + j + 1) * hidden];
                for (p, &d) in part.iter_mut().zip(&s.d[i * hidden..(i + 1) * hidden]) {
                    *p = d * w;
                }
            }
        }
        // Each row's experts summed in rank order (llama.cpp adds its views in that order).
        for r in 0..n {
            let o = &mut out[r * hidden..(r + 1) * hidden];
            o.copy_from_slice(&s.parts[r * k * hidden..(r * k + 1) * hidden]);
            for j in 1..k {
                for (o, &p) in o.iter_mut().zip(&s.parts[(r * k + j) * hidden..(r * k + j + 1) * hidden]) {
                    *o += p;
                }
            }
        }
        match (&ex.shared, cfg.shared_ff) {
            (Some(sh), Some(ff)) => shared_forward(sh, ff, s, &xn[..n * hidden], n, out, run),
            _ => Ok(()),
        }
    })
}

/// The shared expert over all `n` rows of `xn`, added to `out` (after the routed experts,
/// as llama.cpp adds it): `down(silu(gate x) * up x) * sigmoid(gate_inp x)`.
#[allow(clippy::type_complexity)]
fn shared_forward<L>(
    sh: &SharedExpert<L>,
    ff: usize,
    s: &mut Scratch,
    xn: &[f32],
    n: usize,
    out: &mut [f32],
    run: &dyn Fn(&[&L], &[f32], usize, &mut [&mut [f32]]) -> Result<()>,
) -> Result<()> {
    let hidden = xn.len() / n.max(1);
    grow(&mut s.g, n * ff);
    grow(&mut s.u, n * ff);
    grow(&mut s.d, n * hidden);
    grow(&mut s.probs, n);
    run(&[&sh.gate, &sh.up], xn, n, &mut [&mut s.g[..n * ff], &mut s.u[..n * ff]])?;
    activate(ExpertActivation::Silu, &mut s.g[..n * ff], &s.u[..n * ff]);
    run(&[&sh.down], &s.g[..n * ff], n, &mut [&mut s.d[..n * hidden]])?;
    run(&[&sh.gate_inp], xn, n, &mut [&mut s.probs[..n]])?;
    for r in 0..n {
        let w = 1.0 / (1.0 + (-s.probs[r]).exp());
        for (o, &d) in out[r * hidden..(r + 1) * hidden].iter_mut().zip(&s.d[r * hidden..(r + 1) * hidden]) {
            *o += d * w;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(gating: Gating, norm: bool) -> MoeConfig {
        MoeConfig { experts: 4, experts_used: 2, expert_ff: 8, gating, norm_weights: norm, weights_scale: 1.0, activation: ExpertActivation::Silu, shared_ff: None }
    }

    #[test]
    fn routing_follows_each_gating() {
        let (mut p, mut out) = (Vec::new(), Vec::new());
        let logits = [0.5f32, 2.0, -1.0, 1.0];
        // Softmax over all, top 2, renormalized: the two chosen probabilities' ratio is e^1.
        route(&cfg(Gating::Softmax, true), &logits, &mut p, &mut out);
        assert_eq!(out.iter().map(|x| x.0).collect::<Vec<_>>(), [1, 3]);
        let e = 1f32.exp();
        assert!((out[0].1 - e / (1.0 + e)).abs() < 1e-6 && (out[1].1 - 1.0 / (1.0 + e)).abs() < 1e-6, "{out:?}");
        // Without renormalizing: the probabilities over all four.
        route(&cfg(Gating::Softmax, false), &logits, &mut p, &mut out);
        let z: f32 = logits.iter().map(|l| l.exp()).sum();
        assert!((out[0].1 - 2f32.exp() / z).abs() < 1e-6, "{out:?}");
        // gpt-oss: the softmax of the chosen logits, which is the renormalized one.
        route(&cfg(Gating::SoftmaxWeight, false), &logits, &mut p, &mut out);
        assert!((out[0].1 - e / (1.0 + e)).abs() < 1e-6, "{out:?}");
    }

    #[test]
    fn swiglu_oai_clamps_as_ggml() {
        let act = ExpertActivation::SwigluOai { alpha: 1.702, limit: 7.0 };
        let mut g = [10.0f32, -2.0, 0.5];
        let u = [20.0f32, -9.0, 0.25];
        activate(act, &mut g, &u);
        let f = |x: f32, y: f32| x / (1.0 + (-1.702 * x).exp()) * (y + 1.0);
        assert_eq!(g, [f(7.0, 7.0), f(-2.0, -7.0), f(0.5, 0.25)]);
    }
}
