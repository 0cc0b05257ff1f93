//! LoRA adapters in llama.cpp's GGUF format, applied per sequence of a batch.
//!
//! A file has `general.type = adapter`, `adapter.type = lora`, `adapter.lora.alpha` and, for
//! each adapted linear layer of the base model, `<base tensor>.lora_a` (`[rank, in]`) and
//! `<base tensor>.lora_b` (`[out, rank]`), as llama.cpp's `convert_lora_to_gguf.py` writes
//! them. Loading checks them against the base model: its architecture, every name a linear
//! layer the forward adapts (the attention's q, k, v or fused qkv and output, the MLP's gate,
//! up and down), the shapes, finite values.
//!
//! The forward runs each linear layer's base product once over every row of the batch; then,
//! for each adapter that a sequence of the batch chose and that adapts this layer, its
//! low-rank product over the rows of those sequences only (`x A^T`, then `B^T`, times
//! `scale * alpha / rank`, as llama.cpp's `build_lora_mm`), added to their outputs: the
//! base weights are read once whatever the mix of adapters, as S-LoRA and Punica do. Rows of
//! sequences without adapters are untouched: what they get does not depend on the adapters
//! loaded or chosen by others.

use crate::backend::{Backend, LoraWork, Step};
use crate::config::Arch;
use crate::{Error, Result};
use candle_core::{DType, Device};
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// One adapter a sequence applies: the id [`LlamaModel::load_lora`](crate::LlamaModel::load_lora)
/// gave it, and its scale (1.0 is the adapter as trained; 0 turns it off).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoraUse {
    pub id: usize,
    pub scale: f32,
}

/// What a loaded adapter is.
#[derive(Debug, Clone)]
pub struct LoraInfo {
    pub path: PathBuf,
    /// `adapter.lora.alpha` (0 when the file has none: the scale then applies alone).
    pub alpha: f32,
    /// Adapted linear layers.
    pub tensors: usize,
    /// The largest rank of its pairs.
    pub rank: usize,
}

/// The linear layers of a transformer layer an adapter can adapt, and their GGUF names
/// (`blk.N.<name>.weight`; a fused gate-and-up projection is `ffn_up`, as in llama.cpp's phi3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    Q,
    K,
    V,
    Qkv,
    O,
    Gate,
    Up,
    GateUp,
    Down,
}

const TARGETS: usize = 9;

impl Target {
    fn name(self) -> &'static str {
        match self {
            Target::Q => "attn_q",
            Target::K => "attn_k",
            Target::V => "attn_v",
            Target::Qkv => "attn_qkv",
            Target::O => "attn_output",
            Target::Gate => "ffn_gate",
            Target::Up | Target::GateUp => "ffn_up",
            Target::Down => "ffn_down",
        }
    }
}

/// One adapted linear layer: `a` `[rank, in]`, `b` `[out, rank]`, row-major f32.
pub(crate) struct Pair {
    rank: usize,
    a: Vec<f32>,
    b: Vec<f32>,
}

/// A loaded adapter: its pairs by layer and target.
pub(crate) struct Adapter {
    info: LoraInfo,
    layers: Vec<[Option<Pair>; TARGETS]>,
}

/// The adapters a model has loaded.
#[derive(Default)]
pub(crate) struct Adapters {
    list: Vec<Adapter>,
}

fn bad(path: &Path, msg: impl Into<String>) -> Error {
    Error::Lora { path: path.to_path_buf(), msg: msg.into() }
}

impl Adapters {
    pub fn infos(&self) -> Vec<LoraInfo> {
        self.list.iter().map(|a| a.info.clone()).collect()
    }

    /// Load the adapter at `path` for a base model of architecture `arch` whose layer `i`
    /// has linear layers `shapes(i)` (`(target, (out, in))`); returns its id.
    pub fn load(&mut self, path: &Path, arch: Arch, layers: usize, shapes: &dyn Fn(usize) -> Vec<(Target, (usize, usize))>) -> Result<usize> {
        let g = sapient_tensor::GgufFile::open(path)?;
        let text = |key: &str| g.get(key).and_then(|v| v.as_str()).unwrap_or("").to_string();
        if text("general.type") != "adapter" {
            return Err(bad(path, format!("general.type is {:?}, not \"adapter\" (is this a model rather than an adapter?)", text("general.type"))));
        }
        if text("adapter.type") != "lora" {
            return Err(bad(path, format!("adapter.type is {:?}: only \"lora\" adapters are supported", text("adapter.type"))));
        }
        match Arch::parse(&text("general.architecture"), path) {
            Ok(a) if a == arch => {}
            _ => return Err(bad(path, format!("the adapter is for architecture {:?}, the model is {}", text("general.architecture"), arch.name()))),
        }
        let alpha = match g.get("adapter.lora.alpha") {
            None => 0.0,
            Some(v) => v.as_f64().map(|a| a as f32).filter(|a| a.is_finite()).ok_or_else(|| bad(path, "adapter.lora.alpha is not a finite number"))?,
        };
        // The pairs by base tensor name.
        let mut pairs: BTreeMap<String, [Option<String>; 2]> = BTreeMap::new();
        for t in g.tensors() {
            let name = &t.name;
            if let Some(base) = name.strip_suffix(".lora_a") {
                pairs.entry(base.to_string()).or_default()[0] = Some(name.clone());
            } else if let Some(base) = name.strip_suffix(".lora_b") {
                pairs.entry(base.to_string()).or_default()[1] = Some(name.clone());
            } else if name.ends_with("_norm.weight") {
                // llama.cpp ignores norm vectors in adapters too.
                continue;
            } else {
                return Err(bad(path, format!("tensor {name:?} is neither a .lora_a nor a .lora_b")));
            }
        }
        if pairs.is_empty() {
            return Err(bad(path, "the adapter has no lora_a/lora_b tensors"));
        }
        let mut layer_pairs: Vec<[Option<Pair>; TARGETS]> = (0..layers).map(|_| Default::default()).collect();
        let mut max_rank = 0;
        for (base, [a, b]) in &pairs {
            let (Some(a), Some(b)) = (a, b) else {
                return Err(bad(path, format!("{base}: lora_a or lora_b is missing")));
            };
            let (layer, target, (out, inp)) = locate(base, layers, shapes).ok_or_else(|| {
                bad(path, format!("{base}: not a linear layer of this model that adapters apply to (attention q/k/v/qkv/output, MLP gate/up/down of a dense layer)"))
            })?;
            let shape = |n: &str| g.tensor_info(n).map(|t| t.shape.clone()).unwrap_or_default();
            let (sa, sb) = (shape(a), shape(b));
            let rank = sa.first().copied().unwrap_or(0);
            if sa.len() != 2 || sb.len() != 2 || rank == 0 || sa[1] != inp || sb != [out, rank] {
                return Err(bad(path, format!("{base}: lora_a is {sa:?} and lora_b {sb:?}, the base weight is [{out}, {inp}] (lora_a must be [rank, {inp}], lora_b [{out}, rank]; wrong base model?)")));
            }
            let values = |n: &str| -> Result<Vec<f32>> {
                let v = g.tensor(n, &Device::Cpu)?.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
                if v.iter().any(|x| !x.is_finite()) {
                    return Err(bad(path, format!("{n} holds values that are not finite")));
                }
                Ok(v)
            };
            layer_pairs[layer][target as usize] = Some(Pair { rank, a: values(a)?, b: values(b)? });
            max_rank = max_rank.max(rank);
        }
        let info = LoraInfo { path: path.to_path_buf(), alpha, tensors: pairs.len(), rank: max_rank };
        self.list.push(Adapter { info, layers: layer_pairs });
        Ok(self.list.len() - 1)
    }

    /// Check a batch's choices: known ids, finite scales.
    pub fn check(&self, uses: &[&[LoraUse]]) -> Result<()> {
        for u in uses.iter().flat_map(|u| u.iter()) {
            if u.id >= self.list.len() {
                return Err(Error::UnknownLora { id: u.id, loaded: self.list.len() });
            }
            if !u.scale.is_finite() {
                return Err(Error::Config(format!("LoRA adapter {}: scale {} is not finite", u.id, u.scale)));
            }
        }
        Ok(())
    }

    /// The work of `target` in `layer` for a batch whose sequence `i` has rows `rows[i]` and
    /// applies `uses[i]`: one entry per adapter, with all its rows.
    pub fn work<'a>(&'a self, layer: usize, target: Target, rows: impl Iterator<Item = Range<usize>>, uses: &[&[LoraUse]]) -> Vec<LoraWork<'a>> {
        let mut work: Vec<(usize, LoraWork<'a>)> = Vec::new();
        for (r, us) in rows.zip(uses) {
            for u in us.iter().filter(|u| u.scale != 0.0) {
                let Some(p) = self.list.get(u.id).and_then(|a| a.layers.get(layer)).and_then(|l| l[target as usize].as_ref()) else { continue };
                let alpha = self.list[u.id].info.alpha;
                // llama.cpp's `get_scale`: alpha / rank times the adapter's scale, or the scale
                // alone without an alpha.
                let scale = if alpha != 0.0 { u.scale * alpha / p.rank as f32 } else { u.scale };
                match work.iter_mut().find(|(id, w)| *id == u.id && w.scale == scale) {
                    Some((_, w)) => w.rows.push(r.clone()),
                    None => work.push((u.id, LoraWork { rank: p.rank, a: &p.a, b: &p.b, scale, rows: vec![r.clone()] })),
                }
            }
        }
        work.into_iter().map(|(_, w)| w).collect()
    }
}

/// Which layer, target and base shape `base` (`blk.N.<name>.weight`) names.
fn locate(base: &str, layers: usize, shapes: &dyn Fn(usize) -> Vec<(Target, (usize, usize))>) -> Option<(usize, Target, (usize, usize))> {
    let rest = base.strip_prefix("blk.")?.strip_suffix(".weight")?;
    let (i, name) = rest.split_once('.')?;
    let layer: usize = i.parse().ok()?;
    if layer >= layers {
        return None;
    }
    shapes(layer).into_iter().find(|(t, _)| t.name() == name).map(|(t, s)| (layer, t, s))
}

/// `out[r] += w.scale * B (A x[r])` for every row `r` of each work item (`x` `in_w` wide,
/// `out` `out_w` wide, row-major): each row alone, so its result does not depend on the
/// batch.
pub(crate) fn low_rank_add(x: &[f32], in_w: usize, out: &mut [f32], out_w: usize, work: &[LoraWork<'_>]) {
    let mut t = Vec::new();
    for w in work {
        t.resize(w.rank, 0.0);
        for r in w.rows.iter().flat_map(|r| r.clone()) {
            let xr = &x[r * in_w..(r + 1) * in_w];
            for (tv, ar) in t.iter_mut().zip(w.a.chunks_exact(in_w)) {
                *tv = sapient_tensor::kernels::dot_f32(xr, ar);
            }
            for (o, br) in out[r * out_w..(r + 1) * out_w].iter_mut().zip(w.b.chunks_exact(w.rank)) {
                *o += w.scale * sapient_tensor::kernels::dot_f32(&t, br);
            }
        }
    }
}

/// The LoRA adapters of a forward and which sequences chose which: each sequence's (its
/// `Seg` in the step) choice is `uses[i]`; no `uses` at all when none chose any.
pub(crate) struct LoraCtx<'a> {
    pub adapters: &'a Adapters,
    pub uses: &'a [&'a [LoraUse]],
}

impl LoraCtx<'_> {
    /// Each chosen adapter's low-rank product of `target` in layer `layer` (input `x`, `in_w`
    /// wide) added to the rows of `out` (`out_w` wide) of the sequences that chose it.
    #[allow(clippy::too_many_arguments)]
    pub fn apply<B: Backend>(&self, backend: &mut B, step: &Step, layer: usize, target: Target, x: &B::Buf, in_w: usize, out: &mut B::Buf, out_w: usize) {
        if self.uses.is_empty() {
            return;
        }
        let work = self.adapters.work(layer, target, step.segs.iter().map(|s| s.row0..s.row0 + s.n), self.uses);
        if !work.is_empty() {
            backend.lora_rows(x, in_w, out, out_w, &work);
        }
    }
}
