//! The LLaMA-family transformer: RMSNorm, RoPE, grouped-query attention over an in-place KV
//! cache, SwiGLU MLP. One implementation for llama, qwen2, qwen3, mistral, smollm and phi3
//! configs; gemma3's extra layers (see `LlamaConfig`) run on the CPU path only.

use crate::config::{LlamaConfig, RopeScaling, WeightLayout};
use crate::{Error, Result};
use candle_core::{DType, Device, Module, Tensor, D};
use crate::batch::{BatchSeq, Logits};
use crate::kv::{KvBudget, KvCache, KvOptions, SeqId};
use crate::cpu::{CpuLayer, CpuModel, Dims, LayerExtra, Lin, LinGateUp, LinQkv};
use sapient_tensor::kernels::{self, QMatrix};
use sapient_tensor::{Linear, Weight, WeightSource};
use std::sync::Arc;

/// Batches up to this many tokens attend row by row, as single-token decode steps do.
const ROW_BY_ROW_MAX: usize = 16;

/// No sliding window applies within `len` positions (the row-by-row path has no mask).
fn window_free(window: Option<usize>, len: usize) -> bool {
    window.is_none_or(|w| len <= w)
}

/// Whether the query at position `query` sees the key at position `key` (causal, and within
/// the sliding window when there is one).
pub(crate) fn visible(key: usize, query: usize, window: Option<usize>) -> bool {
    key <= query && window.is_none_or(|w| query - key < w)
}

struct Names {
    layout: WeightLayout,
}

impl Names {
    fn embed(&self) -> String {
        match self.layout {
            WeightLayout::Gguf => "token_embd.weight".into(),
            WeightLayout::HuggingFace => "model.embed_tokens.weight".into(),
        }
    }
    fn output_norm(&self) -> String {
        match self.layout {
            WeightLayout::Gguf => "output_norm.weight".into(),
            WeightLayout::HuggingFace => "model.norm.weight".into(),
        }
    }
    fn output(&self) -> String {
        match self.layout {
            WeightLayout::Gguf => "output".into(),
            WeightLayout::HuggingFace => "lm_head".into(),
        }
    }
    /// Prefix (without `.weight`) of a per-layer tensor.
    fn layer(&self, i: usize, what: &str) -> String {
        match self.layout {
            WeightLayout::Gguf => format!("blk.{i}.{what}"),
            WeightLayout::HuggingFace => {
                let hf = match what {
                    "attn_norm" => "input_layernorm",
                    "ffn_norm" => "post_attention_layernorm",
                    "attn_q" => "self_attn.q_proj",
                    "attn_k" => "self_attn.k_proj",
                    "attn_v" => "self_attn.v_proj",
                    "attn_qkv" => "self_attn.qkv_proj",
                    "attn_output" => "self_attn.o_proj",
                    "ffn_gate" => "mlp.gate_proj",
                    "ffn_up" => "mlp.up_proj",
                    "ffn_gate_up" => "mlp.gate_up_proj",
                    "ffn_down" => "mlp.down_proj",
                    "attn_q_norm" => "self_attn.q_norm",
                    "attn_k_norm" => "self_attn.k_norm",
                    other => other,
                };
                format!("model.layers.{i}.{hf}")
            }
        }
    }
}

enum Qkv {
    Separate(Linear, Linear, Linear),
    Fused(Linear),
}

enum GateUp {
    Separate(Linear, Linear),
    Fused(Linear),
}

/// Per-layer key/value cache, preallocated and written in place. Capacity grows by doubling
/// (a rare copy) up to the model's maximum sequence length.
struct LayerCache {
    k: Tensor,
    v: Tensor,
}

struct Layer {
    attn_norm: Tensor,
    ffn_norm: Tensor,
    qkv: Qkv,
    o: Linear,
    gate_up: GateUp,
    down: Linear,
    cache: Option<LayerCache>,
    /// Per-head q/k norms and post-attention/post-MLP norms (Gemma 3, Qwen3), when the
    /// config has them.
    q_norm: Option<Tensor>,
    k_norm: Option<Tensor>,
    post_attn_norm: Option<Tensor>,
    post_ffn_norm: Option<Tensor>,
}

/// A loaded model with its KV cache.
pub struct LlamaModel {
    cfg: LlamaConfig,
    device: Device,
    dtype: DType,
    embed: Arc<candle_core::quantized::QTensor>,
    embed_dense: Option<Tensor>,
    layers: Vec<Layer>,
    norm: Tensor,
    output: Linear,
    cos: Tensor,
    sin: Tensor,
    max_seq_len: usize,
    cache_capacity: usize,
    /// Number of positions currently held in the KV cache.
    pos: usize,
    /// The plain-buffer CPU forward pass (see `cpu.rs`), when every weight has a kernel.
    cpu: Option<CpuModel>,
    /// The single sequence of [`forward`](Self::forward) on the CPU path, made on first use.
    kv: Option<(KvCache, SeqId)>,
    /// Most positions one forward pass of [`forward`](Self::forward) takes on the CPU path.
    prefill_chunk: usize,
}

/// Most positions [`LlamaModel::forward`] runs through the CPU path at once: a longer input
/// goes in pieces of this many, whose activations stay in the caches. On a 2-core Xeon
/// (AVX-512, AMX) Qwen2.5-0.5B's 2,048-token prefill ran 1.26x faster in pieces of 128 than
/// whole; 64 to 128 were within the noise of each other.
pub const DEFAULT_PREFILL_CHUNK: usize = 128;

fn rope_tables(cfg: &LlamaConfig, max_len: usize, device: &Device, dtype: DType) -> Result<(Tensor, Tensor)> {
    rope_tables_base(cfg, cfg.rope_theta, max_len, device, dtype)
}

fn rope_tables_base(cfg: &LlamaConfig, theta: f32, max_len: usize, device: &Device, dtype: DType) -> Result<(Tensor, Tensor)> {
    let half = cfg.rope_dim / 2;
    let mut inv: Vec<f32> = (0..half)
        .map(|i| 1.0 / theta.powf(2.0 * i as f32 / cfg.rope_dim as f32))
        .collect();
    let mut pos_scale = 1.0f32;
    match &cfg.rope_scaling {
        None => {}
        Some(RopeScaling::Linear { factor }) => pos_scale = 1.0 / factor,
        Some(RopeScaling::FreqFactors(f)) => {
            if f.len() != half {
                return Err(Error::Config(format!(
                    "rope_freqs has {} factors, expected {half}",
                    f.len()
                )));
            }
            for (x, d) in inv.iter_mut().zip(f) {
                *x /= d;
            }
        }
        Some(RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        }) => {
            let old = *original_max_position_embeddings as f32;
            let low_wavelen = old / low_freq_factor;
            let high_wavelen = old / high_freq_factor;
            for x in inv.iter_mut() {
                let wavelen = 2.0 * std::f32::consts::PI / *x;
                if wavelen < high_wavelen {
                } else if wavelen > low_wavelen {
                    *x /= factor;
                } else {
                    let smooth = (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                    *x = (1.0 - smooth) * *x / factor + smooth * *x;
                }
            }
        }
    }
    let inv = Tensor::from_vec(inv, (1, half), device)?;
    let t = Tensor::arange(0u32, max_len as u32, device)?
        .to_dtype(DType::F32)?
        .affine(pos_scale as f64, 0.0)?
        .reshape((max_len, 1))?;
    let freqs = t.broadcast_mul(&inv)?;
    Ok((freqs.cos()?.to_dtype(dtype)?, freqs.sin()?.to_dtype(dtype)?))
}

impl LlamaModel {
    /// Load from any weight source. `max_seq_len` caps the context (and the KV cache); `None`
    /// uses the model's own context length.
    pub fn load(
        src: &dyn WeightSource,
        cfg: &LlamaConfig,
        device: &Device,
        max_seq_len: Option<usize>,
    ) -> Result<Self> {
        Self::load_with_dtype(src, cfg, device, max_seq_len, sapient_tensor::activation_dtype(device))
    }

    /// Like [`Self::load`] with an explicit activation dtype (e.g. f32 on CUDA to compare
    /// with the CPU path).
    pub fn load_with_dtype(
        src: &dyn WeightSource,
        cfg: &LlamaConfig,
        device: &Device,
        max_seq_len: Option<usize>,
        dtype: DType,
    ) -> Result<Self> {
        let names = Names { layout: cfg.layout };
        let h = cfg.hidden_size;
        let q_out = cfg.num_heads * cfg.head_dim;
        let kv_out = cfg.num_kv_heads * cfg.head_dim;
        let embed = match src.load_checked(&names.embed(), &[cfg.vocab_size, h], device)? {
            Weight::Quantized(q) => q,
            Weight::Dense(t) => Arc::new(candle_core::quantized::QTensor::quantize(
                &t.to_dtype(DType::F32)?,
                candle_core::quantized::GgmlDType::F32,
            )?),
        };
        // Dense embeddings on accelerators are gathered with index_select.
        let embed_dense = if device.is_cpu() { None } else { Some(embed.dequantize(device)?.to_dtype(dtype)?) };
        let norm_w = |name: &str| src.tensor(name, &[h], device, dtype).map_err(Error::from);
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for i in 0..cfg.num_layers {
            let lin = |what: &str, out: usize, inp: usize, bias: bool| {
                Linear::load(src, &names.layer(i, what), out, inp, bias, device, dtype).map_err(Error::from)
            };
            let qkv = if src.contains(&format!("{}.weight", names.layer(i, "attn_qkv"))) {
                Qkv::Fused(lin("attn_qkv", q_out + 2 * kv_out, h, cfg.qkv_bias)?)
            } else {
                Qkv::Separate(
                    lin("attn_q", q_out, h, cfg.qkv_bias)?,
                    lin("attn_k", kv_out, h, cfg.qkv_bias)?,
                    lin("attn_v", kv_out, h, cfg.qkv_bias)?,
                )
            };
            let fused_gate_up = match cfg.layout {
                WeightLayout::HuggingFace => src.contains(&format!("{}.weight", names.layer(i, "ffn_gate_up"))),
                // GGUF phi3 stores gate and up fused in ffn_up, with no ffn_gate.
                WeightLayout::Gguf => !src.contains(&format!("{}.weight", names.layer(i, "ffn_gate"))),
            };
            let gate_up = if fused_gate_up {
                let name = match cfg.layout {
                    WeightLayout::HuggingFace => "ffn_gate_up",
                    WeightLayout::Gguf => "ffn_up",
                };
                GateUp::Fused(lin(name, 2 * cfg.intermediate_size, h, false)?)
            } else {
                GateUp::Separate(
                    lin("ffn_gate", cfg.intermediate_size, h, false)?,
                    lin("ffn_up", cfg.intermediate_size, h, false)?,
                )
            };
            let head_norm = |what: &str| {
                src.tensor(&format!("{}.weight", names.layer(i, what)), &[cfg.head_dim], device, dtype)
                    .map_err(Error::from)
            };
            let (q_norm, k_norm) =
                if cfg.qk_norm { (Some(head_norm("attn_q_norm")?), Some(head_norm("attn_k_norm")?)) } else { (None, None) };
            let (post_attn_norm, post_ffn_norm) = if cfg.post_norms {
                (
                    Some(norm_w(&format!("{}.weight", names.layer(i, "post_attention_norm")))?),
                    Some(norm_w(&format!("{}.weight", names.layer(i, "post_ffw_norm")))?),
                )
            } else {
                (None, None)
            };
            layers.push(Layer {
                attn_norm: norm_w(&format!("{}.weight", names.layer(i, "attn_norm")))?,
                ffn_norm: norm_w(&format!("{}.weight", names.layer(i, "ffn_norm")))?,
                qkv,
                o: lin("attn_output", h, q_out, false)?,
                gate_up,
                down: lin("ffn_down", h, cfg.intermediate_size, false)?,
                cache: None,
                q_norm,
                k_norm,
                post_attn_norm,
                post_ffn_norm,
            });
        }
        let norm = norm_w(&names.output_norm())?;
        let output = if cfg.tie_word_embeddings || !src.contains(&format!("{}.weight", names.output())) {
            Linear::new(Weight::Quantized(embed.clone()), None)?
        } else {
            Linear::load(src, &names.output(), cfg.vocab_size, h, false, device, dtype)?
        };
        let max_seq_len = max_seq_len
            .unwrap_or(cfg.max_position_embeddings)
            .min(cfg.max_position_embeddings.max(1))
            .max(1);
        let (cos, sin) = rope_tables(cfg, max_seq_len, device, dtype)?;
        let mut model = Self {
            cfg: cfg.clone(),
            device: device.clone(),
            dtype,
            embed,
            embed_dense,
            layers,
            norm,
            output,
            cos,
            sin,
            max_seq_len,
            cache_capacity: 0,
            pos: 0,
            cpu: None,
            kv: None,
            prefill_chunk: DEFAULT_PREFILL_CHUNK,
        };
        let use_cpu = device.is_cpu() && dtype == DType::F32;
        if use_cpu {
            model.cpu = model.build_cpu()?;
            if model.cpu.is_none() {
                tracing::info!("some weights have no CPU kernel; using the candle forward pass");
            }
        }
        if model.cpu.is_none() && cfg.needs_cpu_path() {
            return Err(Error::ArchitectureBackend {
                arch: cfg.arch.name(),
                backend: if !use_cpu {
                    format!("{device:?} with {dtype:?} activations")
                } else {
                    "the candle ops path (a weight format without a CPU kernel)".into()
                },
            });
        }
        Ok(model)
    }

    /// The plain-buffer CPU model, or `None` when a weight's format has no kernel.
    fn build_cpu(&self) -> Result<Option<CpuModel>> {
        let vec = |t: &Tensor| -> Result<Vec<f32>> { Ok(t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?) };
        let opt_vec = |t: &Option<Tensor>| -> Result<Option<Vec<f32>>> { t.as_ref().map(vec).transpose() };
        let mut layers = Vec::with_capacity(self.layers.len());
        for (li, l) in self.layers.iter().enumerate() {
            let qkv = match &l.qkv {
                Qkv::Separate(q, k, v) => match (Lin::new(q)?, Lin::new(k)?, Lin::new(v)?) {
                    (Some(q), Some(k), Some(v)) => LinQkv::Separate(q, k, v),
                    _ => return Ok(None),
                },
                Qkv::Fused(f) => match Lin::new(f)? {
                    Some(f) => LinQkv::Fused(f),
                    None => return Ok(None),
                },
            };
            let gate_up = match &l.gate_up {
                GateUp::Separate(g, u) => match (Lin::new(g)?, Lin::new(u)?) {
                    (Some(g), Some(u)) => LinGateUp::Separate(g, u),
                    _ => return Ok(None),
                },
                GateUp::Fused(f) => match Lin::new(f)? {
                    Some(f) => LinGateUp::Fused(f),
                    None => return Ok(None),
                },
            };
            let (Some(o), Some(down)) = (Lin::new(&l.o)?, Lin::new(&l.down)?) else {
                return Ok(None);
            };
            let window = self.cfg.layer_window(li);
            let extra = LayerExtra {
                q_norm: opt_vec(&l.q_norm)?,
                k_norm: opt_vec(&l.k_norm)?,
                post_attn_norm: opt_vec(&l.post_attn_norm)?,
                post_ffn_norm: opt_vec(&l.post_ffn_norm)?,
                window,
                rope_swa: window.is_some() && self.cfg.rope_theta_swa.is_some(),
            };
            layers.push(CpuLayer::new(vec(&l.attn_norm)?, vec(&l.ffn_norm)?, qkv, o, gate_up, down, extra));
        }
        let Some(output) = Lin::new(&self.output)? else {
            return Ok(None);
        };
        if output.out() != self.cfg.vocab_size {
            return Err(Error::Internal("output layer does not produce the vocabulary"));
        }
        let dims = Dims {
            hidden: self.cfg.hidden_size,
            inter: self.cfg.intermediate_size,
            heads: self.cfg.num_heads,
            kv_heads: self.cfg.num_kv_heads,
            head_dim: self.cfg.head_dim,
            rope_dim: self.cfg.rope_dim,
            interleaved: self.cfg.rope_interleaved,
            eps: self.cfg.rms_norm_eps as f32,
            vocab: self.cfg.vocab_size,
            attn_scale: self.cfg.attn_scale.unwrap_or(1.0 / (self.cfg.head_dim as f32).sqrt()),
            embed_scale: self.cfg.embed_scale,
            activation: self.cfg.activation,
            softcap: self.cfg.final_logit_softcap,
        };
        let rope_swa = match self.cfg.rope_theta_swa {
            Some(theta) => {
                let (c, s) = rope_tables_base(&self.cfg, theta, self.max_seq_len, &Device::Cpu, DType::F32)?;
                Some((vec(&c)?, vec(&s)?))
            }
            None => None,
        };
        let mut cpu = CpuModel::new(
            dims,
            layers,
            vec(&self.norm)?,
            output,
            QMatrix::from_qtensor(&self.embed),
            vec(&self.cos)?,
            vec(&self.sin)?,
            rope_swa,
        );
        cpu.check()?;
        kernels::pack_for_lanes(&mut cpu.weights_mut());
        kernels::huge_pages_for(&cpu.weights());
        Ok(Some(cpu))
    }

    /// Whether forward runs on the plain-buffer CPU path (else candle ops).
    pub fn uses_cpu_kernels(&self) -> bool {
        self.cpu.is_some()
    }

    /// Switch between the plain-buffer CPU path (the default on the CPU when every weight
    /// has a kernel) and candle's ops (for comparisons). Clears the KV cache. Returns whether
    /// the CPU path is now in use.
    pub fn set_cpu_kernels(&mut self, enabled: bool) -> Result<bool> {
        if !enabled && self.cfg.needs_cpu_path() {
            return Err(Error::ArchitectureBackend {
                arch: self.cfg.arch.name(),
                backend: "the candle ops path".into(),
            });
        }
        self.pos = 0;
        self.kv = None;
        self.cpu = if enabled && self.device.is_cpu() && self.dtype == DType::F32 { self.build_cpu()? } else { None };
        Ok(self.cpu.is_some())
    }

    pub fn config(&self) -> &LlamaConfig {
        &self.cfg
    }
    pub fn device(&self) -> &Device {
        &self.device
    }
    /// The longest sequence (prompt + generated tokens) this instance accepts.
    pub fn max_seq_len(&self) -> usize {
        self.max_seq_len
    }
    /// Positions currently in the KV cache.
    pub fn cache_len(&self) -> usize {
        self.pos
    }
    /// Forget everything in the KV cache (keeps its memory).
    pub fn clear_cache(&mut self) {
        self.truncate_cache(0);
    }
    /// Compute logits only for token ids `0..first` and the ids in `extra` (the others come
    /// out as `-inf`, so arg-max and sampling never pick them), or for every token again with
    /// `None`. For a draft model in speculative decoding: byte-level BPE vocabularies number
    /// tokens roughly by merge order, so low ids are the frequent ones. Only the CPU path
    /// restricts; returns whether the logits are restricted now (not when `first` covers
    /// the whole vocabulary).
    pub fn restrict_logits(&mut self, keep: Option<(usize, &[u32])>) -> Result<bool> {
        match &mut self.cpu {
            Some(cpu) => cpu.restrict_output(keep),
            None => Ok(false),
        }
    }

    /// Keep only the first `len` positions of the KV cache (prefix reuse, speculative rollback).
    pub fn truncate_cache(&mut self, len: usize) {
        self.pos = self.pos.min(len);
        if let Some((kv, seq)) = &mut self.kv {
            // The sequence exists for as long as the cache does.
            let _ = kv.truncate(*seq, self.pos);
        }
    }

    /// Most positions one CPU forward pass of [`forward`](Self::forward) takes (at least 1;
    /// [`DEFAULT_PREFILL_CHUNK`] unless set). With the AVX-512 kernels the results do not
    /// depend on it (every row is computed as alone); without, pieces under
    /// `weights::dense_prefill_rows` take the quantized kernels instead of the dense GEMM.
    pub fn set_prefill_chunk(&mut self, positions: usize) {
        self.prefill_chunk = positions.max(1);
    }

    /// A paged KV cache for this model, for [`forward_batch`](Self::forward_batch). Its block
    /// size must be a multiple of 16 (the attention kernels take keys 16 at a time).
    pub fn new_kv_cache(&self, opts: KvOptions) -> Result<KvCache> {
        crate::cpu::check_block_size(opts.block_size)?;
        KvCache::new(self.cfg.num_layers, self.cfg.num_kv_heads * self.cfg.head_dim, opts)
    }

    /// Whether [`forward_batch`](Self::forward_batch) is available (the CPU kernel path).
    pub fn supports_batches(&self) -> bool {
        self.cpu.is_some()
    }

    /// One forward pass over rows of many sequences of `kv` (a cache from
    /// [`new_kv_cache`](Self::new_kv_cache)): every linear layer takes all rows at once (the
    /// weights are read once per step), attention runs per sequence over its own blocks.
    /// Each sequence's `tokens` go at the positions after what `kv` holds for it; slots are
    /// reserved here, and on success the sequences' lengths advance. Logits of the rows each
    /// sequence asks for go into `out`, row-major in batch order; returns their number.
    ///
    /// Every row's result is bit-identical to what it gives in any other batch, alone
    /// included (the linear layers always use the quantized kernels here).
    pub fn forward_batch(&mut self, kv: &mut KvCache, batch: &[BatchSeq<'_>], out: &mut Vec<f32>) -> Result<usize> {
        self.forward_cache(kv, batch, true, out)
    }

    fn forward_cache(&mut self, kv: &mut KvCache, batch: &[BatchSeq<'_>], exact: bool, out: &mut Vec<f32>) -> Result<usize> {
        if batch.is_empty() || batch.iter().any(|s| s.tokens.is_empty()) {
            return Err(Error::EmptyInput);
        }
        for s in batch {
            let end = kv.len(s.seq)? + s.tokens.len();
            if end > self.max_seq_len {
                return Err(Error::ContextOverflow { needed: end, max: self.max_seq_len });
            }
            if let Some(&bad) = s.tokens.iter().find(|&&t| t as usize >= self.cfg.vocab_size) {
                return Err(Error::TokenOutOfRange { token: bad, vocab: self.cfg.vocab_size });
            }
        }
        for (i, s) in batch.iter().enumerate() {
            if batch[..i].iter().any(|o| o.seq == s.seq) {
                return Err(Error::Config("a sequence appears twice in one batch".into()));
            }
            kv.reserve(s.seq, s.tokens.len())?;
        }
        let Some(cpu) = &mut self.cpu else {
            return Err(Error::NoBatchedForward);
        };
        let embed = &self.embed;
        let h = self.cfg.hidden_size;
        let fallback = |t: &[u32]| -> Result<Vec<f32>> {
            let ids = Tensor::new(t, &Device::Cpu)?;
            let rows = embed.embedding(&ids)?.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
            if rows.len() != t.len() * h {
                return Err(Error::Internal("embedding rows have the wrong width"));
            }
            Ok(rows)
        };
        let rows = cpu.forward_batch(kv, batch, exact, &fallback, out)?;
        for s in batch {
            let len = kv.len(s.seq)? + s.tokens.len();
            kv.set_len(s.seq, len)?;
        }
        Ok(rows)
    }

    fn ensure_capacity(&mut self, needed: usize) -> Result<()> {
        if needed <= self.cache_capacity {
            return Ok(());
        }
        let mut cap = self.cache_capacity.max(256);
        while cap < needed {
            cap *= 2;
        }
        let cap = cap.min(self.max_seq_len);
        let shape = (1, self.cfg.num_kv_heads, cap, self.cfg.head_dim);
        for layer in &mut self.layers {
            let k = Tensor::zeros(shape, self.dtype, &self.device)?;
            let v = Tensor::zeros(shape, self.dtype, &self.device)?;
            if let Some(old) = &layer.cache {
                if self.pos > 0 {
                    k.slice_set(&old.k.narrow(2, 0, self.pos)?.contiguous()?, 2, 0)?;
                    v.slice_set(&old.v.narrow(2, 0, self.pos)?.contiguous()?, 2, 0)?;
                }
            }
            layer.cache = Some(LayerCache { k, v });
        }
        self.cache_capacity = cap;
        Ok(())
    }

    fn apply_rope(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> candle_core::Result<Tensor> {
        let rope = |x: &Tensor| {
            if self.cfg.rope_interleaved {
                candle_nn::rotary_emb::rope_i(x, cos, sin)
            } else {
                candle_nn::rotary_emb::rope(x, cos, sin)
            }
        };
        if self.cfg.rope_dim == self.cfg.head_dim {
            rope(&x.contiguous()?)
        } else {
            let r = rope(&x.narrow(D::Minus1, 0, self.cfg.rope_dim)?.contiguous()?)?;
            let pass = x.narrow(D::Minus1, self.cfg.rope_dim, self.cfg.head_dim - self.cfg.rope_dim)?;
            Tensor::cat(&[&r, &pass], D::Minus1)
        }
    }

    /// Run `tokens` (the next positions after what the cache holds) and return logits as a
    /// `[n, vocab]` f32 tensor: n = 1 for [`Logits::Last`], the number of tokens for [`Logits::All`].
    pub fn forward(&mut self, tokens: &[u32], logits: Logits) -> Result<Tensor> {
        if self.cpu.is_some() {
            let mut out = Vec::new();
            let rows = self.forward_into(tokens, logits, &mut out)?;
            return Ok(Tensor::from_vec(out, (rows, self.cfg.vocab_size), &Device::Cpu)?);
        }
        self.forward_tensor(tokens, logits)
    }

    /// [`forward`](Self::forward) into `out` (row-major, `rows x vocab`, resized as needed),
    /// reusing its allocation: a decode loop that keeps one buffer allocates nothing per
    /// token. Returns the number of rows.
    pub fn forward_into(&mut self, tokens: &[u32], logits: Logits, out: &mut Vec<f32>) -> Result<usize> {
        let rows = if logits == Logits::All { tokens.len() } else { 1 };
        if self.cpu.is_none() {
            let t = self.forward_tensor(tokens, logits)?;
            *out = t.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?;
            return Ok(rows);
        }
        self.check_input(tokens)?;
        if self.kv.is_none() {
            // Blocks of 256 positions: one sequence, so sharing is moot and long stretches of
            // consecutive slots keep the attention kernels' calls few.
            let mut kv = self.new_kv_cache(KvOptions { block_size: 256, budget: KvBudget::Tokens(self.max_seq_len) })?;
            let seq = kv.new_seq_with_capacity(self.max_seq_len);
            self.kv = Some((kv, seq));
        }
        let Some((mut kv, seq)) = self.kv.take() else {
            return Err(Error::Internal("the KV cache vanished"));
        };
        let chunk = self.prefill_chunk;
        let r = kv.truncate(seq, self.pos).and_then(|_| {
            if tokens.len() <= chunk {
                let batch = [BatchSeq { seq, tokens, logits: Some(logits) }];
                return self.forward_cache(&mut kv, &batch, false, out);
            }
            // A long input in pieces (as llama.cpp's micro-batches): each piece's activations
            // stay in the caches while the weights pass. Rows do not depend on the batch, so
            // the results are those of one piece.
            let mut part = Vec::new();
            if logits == Logits::All {
                out.clear();
            }
            for (i, piece) in tokens.chunks(chunk).enumerate() {
                let last = (i + 1) * chunk >= tokens.len();
                let want = match logits {
                    Logits::All => Some(Logits::All),
                    Logits::Last => last.then_some(Logits::Last),
                };
                let batch = [BatchSeq { seq, tokens: piece, logits: want }];
                match logits {
                    Logits::All => {
                        self.forward_cache(&mut kv, &batch, false, &mut part)?;
                        out.extend_from_slice(&part);
                    }
                    Logits::Last => {
                        self.forward_cache(&mut kv, &batch, false, out)?;
                    }
                }
            }
            Ok(rows)
        });
        self.pos = kv.len(seq).unwrap_or(0);
        self.kv = Some((kv, seq));
        r?;
        Ok(rows)
    }

    /// Empty input, context overflow and out-of-range tokens, before anything runs.
    fn check_input(&self, tokens: &[u32]) -> Result<()> {
        let seq = tokens.len();
        if seq == 0 {
            return Err(Error::EmptyInput);
        }
        let end = self.pos + seq;
        if end > self.max_seq_len {
            return Err(Error::ContextOverflow {
                needed: end,
                max: self.max_seq_len,
            });
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= self.cfg.vocab_size) {
            return Err(Error::TokenOutOfRange {
                token: bad,
                vocab: self.cfg.vocab_size,
            });
        }
        Ok(())
    }

    /// The candle path (GPU, dense dtypes).
    fn forward_tensor(&mut self, tokens: &[u32], logits: Logits) -> Result<Tensor> {
        self.check_input(tokens)?;
        let seq = tokens.len();
        let start = self.pos;
        let end = start + seq;
        self.ensure_capacity(end)?;
        let ids = Tensor::new(tokens, &self.device)?;
        let mut x = match &self.embed_dense {
            Some(e) => e.index_select(&ids, 0)?,
            None => self.embed.embedding(&ids)?.to_dtype(self.dtype)?,
        }
        .unsqueeze(0)?; // [1, seq, h]
        let cos = self.cos.narrow(0, start, seq)?;
        let sin = self.sin.narrow(0, start, seq)?;
        let mask = if seq <= ROW_BY_ROW_MAX && window_free(self.cfg.sliding_window, end) {
            None
        } else {
            self.mask(seq, start)?
        };
        let (nh, nkv, hd) = (self.cfg.num_heads, self.cfg.num_kv_heads, self.cfg.head_dim);
        let n_rep = nh / nkv;
        let eps = self.cfg.rms_norm_eps as f32;
        let scale = 1.0 / (hd as f64).sqrt();
        for li in 0..self.layers.len() {
            let layer = &self.layers[li];
            let h = candle_nn::ops::rms_norm(&x, &layer.attn_norm, eps)?;
            let (q, k, v) = match &layer.qkv {
                Qkv::Separate(q, k, v) => (q.forward(&h)?, k.forward(&h)?, v.forward(&h)?),
                Qkv::Fused(l) => {
                    let y = l.forward(&h)?;
                    (
                        y.narrow(D::Minus1, 0, nh * hd)?,
                        y.narrow(D::Minus1, nh * hd, nkv * hd)?,
                        y.narrow(D::Minus1, (nh + nkv) * hd, nkv * hd)?,
                    )
                }
            };
            let (mut q, mut k) = (q.reshape((1, seq, nh, hd))?, k.reshape((1, seq, nkv, hd))?);
            if let (Some(qn), Some(kn)) = (&layer.q_norm, &layer.k_norm) {
                q = candle_nn::ops::rms_norm(&q.contiguous()?, qn, eps)?;
                k = candle_nn::ops::rms_norm(&k.contiguous()?, kn, eps)?;
            }
            let q = q.transpose(1, 2)?;
            let k = k.transpose(1, 2)?;
            let v = v.reshape((1, seq, nkv, hd))?.transpose(1, 2)?.contiguous()?;
            let q = self.apply_rope(&q, &cos, &sin)?;
            // Partial RoPE concatenates the rotated and the passed-through dimensions, which
            // candle may leave strided; the cache takes contiguous rows.
            let k = self.apply_rope(&k, &cos, &sin)?.contiguous()?;
            let layer = &mut self.layers[li];
            let cache = layer.cache.as_ref().ok_or(Error::Internal("kv cache not allocated"))?;
            cache.k.slice_set(&k, 2, start)?;
            cache.v.slice_set(&v, 2, start)?;
            let y = if seq <= ROW_BY_ROW_MAX && window_free(self.cfg.sliding_window, end) {
                // Short batches (decode, speculative verification, small follow-ups): each
                // query row attends exactly as a single-token decode step would, so results do
                // not depend on how tokens were batched (greedy speculative decoding then
                // reproduces plain decoding bit for bit).
                let mut rows = Vec::with_capacity(seq);
                for i in 0..seq {
                    let qi = q.narrow(2, i, 1)?.contiguous()?.reshape((1, nkv, n_rep, hd))?;
                    let len = start + i + 1;
                    let k_i = cache.k.narrow(2, 0, len)?;
                    let v_i = cache.v.narrow(2, 0, len)?;
                    let att = (qi.matmul(&k_i.t()?)? * scale)?;
                    let att = candle_nn::ops::softmax_last_dim(&att)?;
                    rows.push(att.matmul(&v_i)?.reshape((1, 1, nh * hd))?); // [1, 1, nh*hd]
                }
                Tensor::cat(&rows, 1)?
            } else {
                let k_all = cache.k.narrow(2, 0, end)?;
                let v_all = cache.v.narrow(2, 0, end)?;
                // Grouped-query attention without repeating K/V: the n_rep query heads that
                // share a kv head are stacked along the sequence axis.
                let qg = q.reshape((1, nkv, n_rep * seq, hd))?;
                let mut att = (qg.matmul(&k_all.t()?)? * scale)?;
                if let Some(m) = &mask {
                    att = att.broadcast_add(m)?;
                }
                let att = candle_nn::ops::softmax_last_dim(&att)?;
                let y = att.matmul(&v_all)?; // [1, nkv, n_rep*seq, hd]
                y.reshape((1, nh, seq, hd))?.transpose(1, 2)?.reshape((1, seq, nh * hd))?
            };
            let y = layer.o.forward(&y)?;
            x = (x + y)?;
            let h = candle_nn::ops::rms_norm(&x, &layer.ffn_norm, eps)?;
            let (g, u) = match &layer.gate_up {
                GateUp::Separate(g, u) => (g.forward(&h)?, u.forward(&h)?),
                GateUp::Fused(l) => {
                    let y = l.forward(&h)?;
                    let n = self.cfg.intermediate_size;
                    (y.narrow(D::Minus1, 0, n)?, y.narrow(D::Minus1, n, n)?)
                }
            };
            let m = (candle_nn::ops::silu(&g)? * u)?;
            x = (x + layer.down.forward(&m)?)?;
        }
        self.pos = end;
        let x = match logits {
            Logits::Last => x.narrow(1, seq - 1, 1)?,
            Logits::All => x,
        };
        let x = candle_nn::ops::rms_norm(&x, &self.norm, eps)?;
        let out = self.output.forward(&x)?.squeeze(0)?.to_dtype(DType::F32)?;
        Ok(out)
    }

    /// Additive attention mask `[n_rep*seq, total]` (causal, and the sliding window when the
    /// config has one), or `None` when every cached key is visible (single-token decode).
    fn mask(&self, seq: usize, start: usize) -> Result<Option<Tensor>> {
        let total = start + seq;
        let window = self.cfg.sliding_window;
        let needs_window = window.is_some_and(|w| total > w);
        if seq == 1 && !needs_window {
            return Ok(None);
        }
        let n_rep = self.cfg.num_heads / self.cfg.num_kv_heads;
        let mut m = vec![0f32; n_rep * seq * total];
        for r in 0..n_rep {
            for i in 0..seq {
                let qpos = start + i;
                let row = &mut m[(r * seq + i) * total..(r * seq + i + 1) * total];
                for (j, v) in row.iter_mut().enumerate() {
                    if !visible(j, qpos, window) {
                        *v = f32::NEG_INFINITY;
                    }
                }
            }
        }
        Ok(Some(
            Tensor::from_vec(m, (n_rep * seq, total), &self.device)?.to_dtype(self.dtype)?,
        ))
    }
}

