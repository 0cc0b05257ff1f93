//! The LLaMA-family transformer, written once: RMSNorm, RoPE, grouped-query attention over
//! a paged KV cache, SwiGLU or GeGLU MLP, and what llama, qwen2, qwen3, mistral, smollm, phi3
//! and gemma3 add (data in `LlamaConfig`: q/k norms, post-norms, embedding scale, sliding
//! windows with their own RoPE base, soft-capped logits), and Qwen3.5's hybrid: layers whose
//! mixer is Gated DeltaNet linear attention (`deltanet.rs`, its state in the KV cache's
//! sequences) beside gated full attention. `Transformer` holds the weights in
//! a [`Backend`]'s form and runs the layer program against the backend's operations
//! (`backend.rs`); the CPU backend (`cpu.rs`) is the only one, and `LlamaModel` is the
//! transformer on it (monomorphized: the seam costs nothing). Every forward (`forward`,
//! `forward_into`, `forward_batch`) runs this one program. Another device (CUDA, Metal) or
//! activation dtype is `Error::NoBackend` naming it. Adding an architecture means adding its
//! differences here (and in `LlamaConfig`), once; adding a backend means implementing
//! `Backend`.

use crate::backend::{Backend, DeltaInputs, Dims, RopeTable, Step};
use crate::batch::{plan, BatchSeq, Logits};
use crate::config::{Arch, LlamaConfig, WeightLayout};
use crate::rope::rope_tables;
use crate::cpu::{check_block_size, Cpu};
use crate::deltanet::DeltaLayer;
use crate::lora::{Adapters, LoraCtx, LoraInfo, LoraUse, Target};
use crate::names::Names;
use crate::kv::{Book, KvBudget, KvCache, KvDtype, KvOptions, KvStorage, SeqId};
use crate::moe::{load_experts, Experts};
use crate::{Error, Result};
use candle_core::{DType, Device, Tensor};
use std::path::Path;
use sapient_tensor::WeightSource;

mod mtp;

// One per layer, built at load: the size of the separate variant does not matter.
#[allow(clippy::large_enum_variant)]
enum Qkv<L> {
    Separate(L, L, L),
    Fused(L),
}

enum GateUp<L> {
    Separate(L, L),
    Fused(L),
}

/// Softmax attention over the KV cache.
struct Attention<B: Backend> {
    qkv: Qkv<B::Lin>,
    o: B::Lin,
    /// Per-head RMSNorm weights of queries and keys (Gemma 3, Qwen3).
    q_norm: Option<B::Vector>,
    k_norm: Option<B::Vector>,
    /// The query projection also gives a per-head gate on the output (Qwen3.5).
    gated: bool,
    /// This layer's place in the KV cache (hybrids keep keys and values of attention layers only).
    kv_layer: usize,
}

/// What mixes a layer's positions: attention, or Gated DeltaNet linear attention (hybrids).
enum Mixer<B: Backend> {
    Attention(Attention<B>),
    Linear(Box<DeltaLayer<B>>),
}

/// A layer's feed-forward: one gated MLP, or a router over experts (`moe.rs`).
enum Mlp<L> {
    Dense { gate_up: GateUp<L>, down: L },
    Moe { router: L, experts: Experts<L> },
}

/// One transformer layer's weights in backend `B`'s form.
struct Layer<B: Backend> {
    attn_norm: B::Vector,
    ffn_norm: B::Vector,
    mixer: Mixer<B>,
    mlp: Mlp<B::Lin>,
    /// RMSNorm of the attention and MLP outputs before the residual adds them (Gemma 3).
    post_attn_norm: Option<B::Vector>,
    post_ffn_norm: Option<B::Vector>,
    /// This layer's sliding window (`None`: it sees every earlier position).
    window: Option<usize>,
    /// A learned logit per head in each attention softmax's denominator (gpt-oss).
    sinks: Option<B::Vector>,
    rope: RopeTable,
}

/// A step's activations, kept from step to step.
#[derive(Default)]
struct Bufs<T> {
    x: T,
    xn: T,
    q: T,
    k: T,
    v: T,
    qkv: T,
    att: T,
    y: T,
    g: T,
    u: T,
    gu: T,
    /// Gated attention's query-and-gate rows and gates; linear attention's `z`, `beta`, `alpha`.
    qg: T,
    gate: T,
    z: T,
    beta: T,
    alpha: T,
}

/// The transformer, written once against [`Backend`]'s operations.
struct Transformer<B: Backend> {
    backend: B,
    dims: Dims,
    layers: Vec<Layer<B>>,
    norm: B::Vector,
    output: B::Lin,
    embed: B::Embed,
    buf: Bufs<B::Buf>,
    step: Step,
    /// Layers with keys and values in the KV cache.
    kv_layers: usize,
    /// Recurrent state values per sequence (hybrids; 0 otherwise).
    state_floats: usize,
    /// The LoRA adapters loaded for it.
    lora: Adapters,
    /// The multi-token-prediction head (`mtp.rs`), when the checkpoint has one.
    mtp: Option<Box<mtp::Mtp<B>>>,
    /// Keep the final-normed hidden state of every row in `hidden` (the MTP head's input).
    keep_hidden: bool,
    hidden: B::Buf,
    /// Keep a hybrid's recurrent state after each row of verification steps ([`Step::keep_rows`]).
    keep_rows: bool,
}

/// A loaded model with its KV cache.
pub struct LlamaModel {
    cfg: LlamaConfig,
    device: Device,
    max_seq_len: usize,
    /// Number of positions currently held in the KV cache.
    pos: usize,
    net: Transformer<Cpu>,
    /// The single sequence of [`forward`](Self::forward), made on first use.
    kv: Option<(KvCache, SeqId)>,
    /// Most positions one forward pass of [`forward`](Self::forward) takes.
    prefill_chunk: usize,
    /// How the cache of [`forward`](Self::forward) stores keys and values.
    kv_dtype: KvDtype,
    /// The LoRA adapters [`forward`](Self::forward) applies.
    lora: Vec<LoraUse>,
}

/// Most positions [`LlamaModel::forward`] runs at once: a longer input goes in pieces of this
/// many, whose activations stay in the caches. On a 2-core Xeon (AVX-512, AMX) Qwen2.5-0.5B's
/// 2,048-token prefill ran 1.26x faster in pieces of 128 than whole; 64 to 128 were within
/// the noise of each other.
pub const DEFAULT_PREFILL_CHUNK: usize = 128;

/// What a device is called in errors (`cpu`, `cuda:0`, `metal:0`).
fn device_name(device: &Device) -> String {
    match device.location() {
        candle_core::DeviceLocation::Cpu => "cpu".into(),
        candle_core::DeviceLocation::Cuda { gpu_id } => format!("cuda:{gpu_id}"),
        candle_core::DeviceLocation::Metal { gpu_id } => format!("metal:{gpu_id}"),
    }
}

impl LlamaModel {
    /// Load from any weight source. `max_seq_len` caps the context (and the KV cache); `None`
    /// uses the model's own context length. The forward pass runs on the CPU backend: another
    /// `device` is [`Error::NoBackend`].
    pub fn load(
        src: &dyn WeightSource,
        cfg: &LlamaConfig,
        device: &Device,
        max_seq_len: Option<usize>,
    ) -> Result<Self> {
        Self::load_with_dtype(src, cfg, device, max_seq_len, sapient_tensor::activation_dtype(device))
    }

    /// Like [`Self::load`] with an explicit activation dtype. The CPU backend computes in f32;
    /// any other device or dtype is [`Error::NoBackend`] naming it.
    pub fn load_with_dtype(
        src: &dyn WeightSource,
        cfg: &LlamaConfig,
        device: &Device,
        max_seq_len: Option<usize>,
        dtype: DType,
    ) -> Result<Self> {
        if !device.is_cpu() {
            return Err(Error::NoBackend { what: format!("device {}", device_name(device)) });
        }
        if dtype != DType::F32 {
            return Err(Error::NoBackend { what: format!("{} activations on the cpu", format!("{dtype:?}").to_lowercase()) });
        }
        let max_seq_len = max_seq_len
            .unwrap_or(cfg.max_position_embeddings)
            .min(cfg.max_position_embeddings.max(1))
            .max(1);
        let dims = Dims {
            hidden: cfg.hidden_size,
            inter: cfg.intermediate_size,
            heads: cfg.num_heads,
            kv_heads: cfg.num_kv_heads,
            head_dim: cfg.head_dim,
            rope_dim: cfg.rope_dim,
            interleaved: cfg.rope_interleaved,
            eps: cfg.rms_norm_eps as f32,
            vocab: cfg.vocab_size,
            attn_scale: cfg.attn_scale.unwrap_or(1.0 / (cfg.head_dim as f32).sqrt()),
            embed_scale: cfg.embed_scale,
            activation: cfg.activation,
            softcap: cfg.final_logit_softcap,
        };
        let rope = rope_tables(cfg, cfg.rope_theta, max_seq_len)?;
        let rope_swa = match cfg.rope_theta_swa {
            Some(theta) => Some(rope_tables(cfg, theta, max_seq_len)?),
            None => None,
        };
        let backend = Cpu::new(dims.clone(), rope, rope_swa)?;
        Ok(Self {
            cfg: cfg.clone(),
            device: Device::Cpu,
            max_seq_len,
            pos: 0,
            net: Transformer::load(backend, dims, src, cfg)?,
            kv: None,
            prefill_chunk: DEFAULT_PREFILL_CHUNK,
            kv_dtype: KvDtype::F16,
            lora: Vec::new(),
        })
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
    /// tokens roughly by merge order, so low ids are the frequent ones. Only a quantized
    /// output layer restricts; returns whether the logits are restricted now (not when
    /// `first` covers the whole vocabulary).
    pub fn restrict_logits(&mut self, keep: Option<(usize, &[u32])>) -> Result<bool> {
        self.net.restrict_logits(keep)
    }

    /// Keep only the first `len` positions of the KV cache (prefix reuse, speculative rollback).
    /// A hybrid model's recurrent state cannot go back part of the way: there any `len` short
    /// of what the cache holds empties it (read [`cache_len`](Self::cache_len) after).
    pub fn truncate_cache(&mut self, len: usize) {
        let len = if self.net.state_floats > 0 && len < self.pos { 0 } else { len };
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

    /// How the cache of [`forward`](Self::forward) stores keys and values (f16 unless set);
    /// changing it drops what that cache holds. A [`KvDtype::Q8_0`] cache needs a head
    /// dimension that is a multiple of 32.
    pub fn set_kv_dtype(&mut self, dtype: KvDtype) -> Result<()> {
        if dtype != self.kv_dtype {
            self.check_kv_dtype(dtype)?;
            self.kv = None;
            self.pos = 0;
            self.kv_dtype = dtype;
        }
        Ok(())
    }

    fn check_kv_dtype(&self, dtype: KvDtype) -> Result<()> {
        if dtype == KvDtype::Q8_0 && !self.cfg.head_dim.is_multiple_of(sapient_tensor::kernels::Q8_GROUP) {
            return Err(Error::Config(format!(
                "a q8_0 KV cache needs a head dimension that is a multiple of 32; this model's is {}",
                self.cfg.head_dim
            )));
        }
        Ok(())
    }

    /// A paged KV cache for this model, for [`forward_batch`](Self::forward_batch). Its block
    /// size must be a multiple of 16 (the attention kernels take keys 16 at a time); a
    /// [`KvDtype::Q8_0`] cache needs a head dimension that is a multiple of 32.
    pub fn new_kv_cache(&self, opts: KvOptions) -> Result<KvCache> {
        check_block_size(opts.block_size)?;
        self.check_kv_dtype(opts.dtype)?;
        Ok(KvCache::new(self.net.kv_layers, self.cfg.num_kv_heads * self.cfg.head_dim, opts)?.with_seq_state(self.net.state_floats))
    }

    /// Whether [`forward_batch`](Self::forward_batch) is available: always, since every
    /// model runs on the one forward pass (kept for callers written against models without it).
    pub fn supports_batches(&self) -> bool {
        true
    }

    /// One forward pass over rows of many sequences of `kv` (a cache from
    /// [`new_kv_cache`](Self::new_kv_cache)): every linear layer takes all rows at once (the
    /// weights are read once per step), attention runs per sequence over its own blocks.
    /// Each sequence's `tokens` are appended: they go at the positions after what `kv` holds
    /// for it, their slots are reserved here, and on success the sequences' lengths advance
    /// past them. Logits of the rows each sequence asks for go into `out`, row-major in batch
    /// order; returns their number.
    ///
    /// Every row's result is bit-identical to what it gives in any other batch, alone
    /// included (every linear layer computes each row as it is alone here).
    pub fn forward_batch(&mut self, kv: &mut KvCache, batch: &[BatchSeq<'_>], out: &mut Vec<f32>) -> Result<usize> {
        self.forward_cache(kv, batch, &[], true, out)
    }

    /// [`forward_batch`](Self::forward_batch) with LoRA adapters chosen per sequence:
    /// `loras[i]` for `batch[i]` (ids from [`load_lora`](Self::load_lora); empty: none). The
    /// base weights are read once for every row; each adapter's low-rank product runs over
    /// the rows of the sequences that chose it. Rows without adapters get exactly what
    /// [`forward_batch`](Self::forward_batch) gives them, and every row what it gets alone.
    pub fn forward_batch_lora(&mut self, kv: &mut KvCache, batch: &[BatchSeq<'_>], loras: &[&[LoraUse]], out: &mut Vec<f32>) -> Result<usize> {
        self.forward_cache(kv, batch, loras, true, out)
    }

    /// [`forward_batch`](Self::forward_batch) for a caller that owns the sequences' lengths
    /// (the engine's scheduler): the slots of every sequence's `tokens` must be reserved
    /// already ([`KvCache::reserve`]), and the lengths stay as they are. The caller then
    /// records what each sequence keeps with [`KvCache::set_len`] (all its rows, or fewer
    /// when some were rejected guesses).
    pub fn forward_reserved(&mut self, kv: &mut KvCache, batch: &[BatchSeq<'_>], out: &mut Vec<f32>) -> Result<usize> {
        self.forward_reserved_lora(kv, batch, &[], out)
    }

    /// [`forward_reserved`](Self::forward_reserved) with LoRA adapters chosen per sequence,
    /// as [`forward_batch_lora`](Self::forward_batch_lora).
    pub fn forward_reserved_lora(&mut self, kv: &mut KvCache, batch: &[BatchSeq<'_>], loras: &[&[LoraUse]], out: &mut Vec<f32>) -> Result<usize> {
        self.check_batch(kv, batch, loras)?;
        let (book, store) = kv.parts();
        self.net.forward_batch(book, store, batch, loras, true, out)
    }

    /// Load a LoRA adapter (llama.cpp's GGUF format, `lora.rs`) for this model, checked
    /// against it; returns its id for [`LoraUse`].
    pub fn load_lora(&mut self, path: &Path) -> Result<usize> {
        let net = &mut self.net;
        let shapes = |i: usize| net.layers.get(i).map_or_else(Vec::new, lora_targets);
        let mut adapters = std::mem::take(&mut net.lora);
        let r = adapters.load(path, self.cfg.arch, net.layers.len(), &shapes);
        net.lora = adapters;
        r
    }

    /// The LoRA adapters loaded, by id.
    pub fn loras(&self) -> Vec<LoraInfo> {
        self.net.lora.infos()
    }

    /// The LoRA adapters [`forward`](Self::forward) and [`forward_into`](Self::forward_into)
    /// apply from now on (none unless set). A change empties their cache: what it held was
    /// computed with others.
    pub fn set_lora(&mut self, uses: &[LoraUse]) -> Result<()> {
        self.net.lora.check(&[uses])?;
        if self.lora != uses {
            self.lora = uses.to_vec();
            self.clear_cache();
        }
        Ok(())
    }

    /// Append: reserve, run, advance the lengths (see [`forward_batch`](Self::forward_batch)).
    fn forward_cache(&mut self, kv: &mut KvCache, batch: &[BatchSeq<'_>], loras: &[&[LoraUse]], exact: bool, out: &mut Vec<f32>) -> Result<usize> {
        self.check_batch(kv, batch, loras)?;
        for s in batch {
            kv.reserve(s.seq, s.tokens.len())?;
        }
        let (book, store) = kv.parts();
        let rows = self.net.forward_batch(book, store, batch, loras, exact, out)?;
        for s in batch {
            let len = kv.len(s.seq)? + s.tokens.len();
            kv.set_len(s.seq, len)?;
        }
        Ok(rows)
    }

    /// A batch's inputs, before anything runs: rows, context length, token ids, no sequence
    /// twice, adapters loaded (one choice per sequence, or none).
    fn check_batch(&self, kv: &KvCache, batch: &[BatchSeq<'_>], loras: &[&[LoraUse]]) -> Result<()> {
        if batch.is_empty() || batch.iter().any(|s| s.tokens.is_empty()) {
            return Err(Error::EmptyInput);
        }
        if !loras.is_empty() && loras.len() != batch.len() {
            return Err(Error::Config(format!("{} LoRA choices for a batch of {} sequences", loras.len(), batch.len())));
        }
        self.net.lora.check(loras)?;
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
        }
        Ok(())
    }

    /// Run `tokens` (the next positions after what the cache holds) and return logits as a
    /// `[n, vocab]` f32 tensor: n = 1 for [`Logits::Last`], the number of tokens for [`Logits::All`].
    pub fn forward(&mut self, tokens: &[u32], logits: Logits) -> Result<Tensor> {
        let mut out = Vec::new();
        let rows = self.forward_into(tokens, logits, &mut out)?;
        Ok(Tensor::from_vec(out, (rows, self.cfg.vocab_size), &Device::Cpu)?)
    }

    /// [`forward`](Self::forward) into `out` (row-major, `rows x vocab`, resized as needed),
    /// reusing its allocation: a decode loop that keeps one buffer allocates nothing per
    /// token. Returns the number of rows.
    pub fn forward_into(&mut self, tokens: &[u32], logits: Logits, out: &mut Vec<f32>) -> Result<usize> {
        let rows = if logits == Logits::All { tokens.len() } else { 1 };
        self.check_input(tokens)?;
        if self.kv.is_none() {
            // Blocks of 256 positions: one sequence, so sharing is moot and long stretches of
            // consecutive slots keep the attention kernels' calls few.
            let opts = |extra: usize| KvOptions { block_size: 256, budget: KvBudget::Tokens(self.max_seq_len + extra * 256), dtype: self.kv_dtype };
            let mut kv = self.new_kv_cache(opts(0))?;
            // A hybrid's recurrent state takes blocks of the pool besides the positions'.
            if kv.seq_state_blocks() > 0 {
                kv = self.new_kv_cache(opts(kv.seq_state_blocks()))?;
            }
            let seq = kv.new_seq_with_capacity(self.max_seq_len);
            self.kv = Some((kv, seq));
        }
        let Some((mut kv, seq)) = self.kv.take() else {
            return Err(Error::Internal("the KV cache vanished"));
        };
        let chunk = self.prefill_chunk;
        let lora = std::mem::take(&mut self.lora);
        let uses: [&[LoraUse]; 1] = [&lora];
        let uses: &[&[LoraUse]] = if lora.is_empty() { &[] } else { &uses };
        let r = kv.truncate(seq, self.pos).and_then(|_| {
            if tokens.len() <= chunk {
                let batch = [BatchSeq { seq, tokens, logits: Some(logits) }];
                return self.forward_cache(&mut kv, &batch, uses, false, out);
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
                        self.forward_cache(&mut kv, &batch, uses, false, &mut part)?;
                        out.extend_from_slice(&part);
                    }
                    Logits::Last => {
                        self.forward_cache(&mut kv, &batch, uses, false, out)?;
                    }
                }
            }
            Ok(rows)
        });
        self.pos = kv.len(seq).unwrap_or(0);
        self.kv = Some((kv, seq));
        self.lora = lora;
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

}

impl<B: Backend> Transformer<B> {
    /// The weights of `src` (named as `cfg.layout` names them) in `backend`'s form.
    fn load(backend: B, dims: Dims, src: &dyn WeightSource, cfg: &LlamaConfig) -> Result<Self> {
        let dev = Device::Cpu;
        let names = Names { layout: cfg.layout };
        let h = cfg.hidden_size;
        let q_out = cfg.num_heads * cfg.head_dim;
        let kv_out = cfg.num_kv_heads * cfg.head_dim;
        let values = |name: &str, len: usize| -> Result<Vec<f32>> { Ok(src.tensor(name, &[len], &dev, DType::F32)?.to_vec1::<f32>()?) };
        let embed_name = names.embed();
        let embed_w = src.load_checked(&embed_name, &[cfg.vocab_size, h], &dev)?;
        let embed = backend.embedding(&embed_w, &embed_name)?;
        // The MTP layer after the main stack, when its tensors are there, loads as a layer
        // (with its keys and values in a cache of its own) and goes to the head (`mtp.rs`).
        let mtp_layers = cfg.hybrid.as_ref().map_or(0, |hc| hc.mtp_layers).min(1);
        let mtp_layers = if mtp_layers > 0 && src.contains(&format!("blk.{}.nextn.eh_proj.weight", cfg.num_layers)) { 1 } else { 0 };
        let mut layers = Vec::with_capacity(cfg.num_layers + mtp_layers);
        let (mut kv_layers, mut linear) = (0, 0);
        for i in 0..cfg.num_layers + mtp_layers {
            let lin = |what: &str, out: usize, inp: usize, bias: bool| -> Result<B::Lin> {
                let prefix = names.layer(i, what);
                let name = format!("{prefix}.weight");
                let w = src.load_checked(&name, &[out, inp], &dev)?;
                let bias = if bias { Some(values(&format!("{prefix}.bias"), out)?) } else { None };
                backend.linear(w, bias, &name)
            };
            let has = |what: &str| src.contains(&format!("{}.weight", names.layer(i, what)));
            // Qwen3.5's full-attention layers gate their output with a second half of each
            // query head.
            let gated = cfg.arch == Arch::Qwen35;
            let q_w = if gated { 2 * q_out } else { q_out };
            let is_linear = cfg.hybrid.as_ref().is_some_and(|hc| hc.linear_layers.get(i).copied().unwrap_or(false));
            let qkv = if is_linear {
                None
            } else if has("attn_qkv") {
                Some(Qkv::Fused(lin("attn_qkv", q_w + 2 * kv_out, h, cfg.qkv_bias)?))
            } else {
                Some(Qkv::Separate(lin("attn_q", q_w, h, cfg.qkv_bias)?, lin("attn_k", kv_out, h, cfg.qkv_bias)?, lin("attn_v", kv_out, h, cfg.qkv_bias)?))
            };
            let inter = cfg.intermediate_size;
            let mlp = match &cfg.moe {
                // Mixtures of experts load from GGUF only (llama.cpp's stacked expert tensors).
                Some(moe) => Mlp::Moe {
                    router: lin("ffn_gate_inp", moe.experts, h, src.contains(&format!("{}.bias", names.layer(i, "ffn_gate_inp"))))?,
                    experts: load_experts(src, &format!("blk.{i}"), moe, h, &|w, b, n| backend.linear(w, b, n), &|t, r, c, q, b, n| backend.linear_mapped(t, r, c, q, b, n))?,
                },
                None => Mlp::Dense {
                    gate_up: match cfg.layout {
                        WeightLayout::HuggingFace if has("ffn_gate_up") => GateUp::Fused(lin("ffn_gate_up", 2 * inter, h, false)?),
                        // GGUF phi3 stores gate and up fused in ffn_up, with no ffn_gate.
                        WeightLayout::Gguf if !has("ffn_gate") => GateUp::Fused(lin("ffn_up", 2 * inter, h, false)?),
                        _ => GateUp::Separate(lin("ffn_gate", inter, h, false)?, lin("ffn_up", inter, h, false)?),
                    },
                    down: lin("ffn_down", h, inter, false)?,
                },
            };
            let norm = |what: &str, len: usize| -> Result<B::Vector> { Ok(backend.vector(values(&format!("{}.weight", names.layer(i, what)), len)?)) };
            let (q_norm, k_norm) = if cfg.qk_norm && !is_linear {
                (Some(norm("attn_q_norm", cfg.head_dim)?), Some(norm("attn_k_norm", cfg.head_dim)?))
            } else {
                (None, None)
            };
            let (post_attn_norm, post_ffn_norm) = if cfg.post_norms {
                (Some(norm("post_attention_norm", h)?), Some(norm("post_ffw_norm", h)?))
            } else {
                (None, None)
            };
            let window = cfg.layer_window(i);
            let rope = if window.is_some() && cfg.rope_theta_swa.is_some() { RopeTable::SlidingWindow } else { RopeTable::Main };
            let mixer = match (qkv, &cfg.hybrid) {
                (Some(qkv), _) => {
                    // The MTP layer's keys and values are the only ones in its cache.
                    kv_layers += usize::from(i < cfg.num_layers);
                    let o_bias = src.contains(&format!("{}.bias", names.layer(i, "attn_output")));
                    let kv_layer = if i < cfg.num_layers { kv_layers - 1 } else { 0 };
                    Mixer::Attention(Attention { qkv, o: lin("attn_output", h, q_out, o_bias)?, q_norm, k_norm, gated, kv_layer })
                }
                (None, Some(hc)) => {
                    linear += 1;
                    Mixer::Linear(Box::new(DeltaLayer::load(&backend, src, i, linear - 1, hc, h)?))
                }
                (None, None) => return Err(Error::Internal("a linear-attention layer without a hybrid config")),
            };
            layers.push(Layer {
                attn_norm: norm("attn_norm", h)?,
                // Qwen3.5 and gpt-oss name the norm before the feed-forward `post_attention_norm`.
                ffn_norm: norm(if matches!(cfg.arch, Arch::Qwen35 | Arch::GptOss) { "post_attention_norm" } else { "ffn_norm" }, h)?,
                mixer,
                mlp,
                post_attn_norm,
                post_ffn_norm,
                window,
                sinks: if has("attn_sinks") { Some(norm("attn_sinks", cfg.num_heads)?) } else { None },
                rope,
            });
        }
        let mtp = match layers.len() > cfg.num_layers {
            true => layers.pop().map(|l| mtp::Mtp::load(&backend, src, cfg.num_layers, (h, cfg.vocab_size), l)).transpose()?.map(Box::new),
            false => None,
        };
        let norm = backend.vector(values(&names.output_norm(), h)?);
        let out_name = format!("{}.weight", names.output());
        let output = if cfg.tie_word_embeddings || !src.contains(&out_name) {
            backend.linear(embed_w, None, &embed_name)?
        } else {
            backend.linear(src.load_checked(&out_name, &[cfg.vocab_size, h], &dev)?, None, &out_name)?
        };
        let state_floats = cfg.hybrid.as_ref().map_or(0, |hc| hc.state_floats());
        if kv_layers == 0 {
            return Err(Error::Config(format!("{}: no layer has attention (a hybrid needs at least one)", src.location().display())));
        }
        let (buf, step, lora, hidden) = (Bufs::default(), Step::default(), Adapters::default(), B::Buf::default());
        let mut net = Self { backend, dims, layers, norm, output, embed, buf, step, kv_layers, state_floats, lora, mtp, keep_hidden: false, hidden, keep_rows: false };
        net.check()?;
        let Self { backend, layers, output, embed, mtp, .. } = &mut net;
        let mut lins = linears(layers, output);
        if let Some(m) = mtp {
            lins.extend(m.linears());
        }
        backend.loaded(lins, embed);
        Ok(net)
    }

    fn check(&self) -> Result<()> {
        let d = &self.dims;
        if B::embed_rows(&self.embed, d.hidden) != d.vocab || B::lin_shape(&self.output) != (d.vocab, d.hidden) {
            return Err(Error::Internal("the embedding or output layer does not match the vocabulary"));
        }
        for l in &self.layers {
            let Mixer::Attention(a) = &l.mixer else { continue };
            if [&a.q_norm, &a.k_norm].into_iter().flatten().any(|w| B::vector_len(w) != d.head_dim) {
                return Err(Error::Internal("q/k norm weights are not head_dim wide"));
            }
        }
        Ok(())
    }

    fn restrict_logits(&mut self, keep: Option<(usize, &[u32])>) -> Result<bool> {
        self.backend.restrict_logits(&self.output, keep)
    }

    /// Run a batch: for each sequence, its `tokens` at the positions after what `kv` holds
    /// for it (the caller has reserved the slots). Writes the logits of the rows each
    /// sequence asks for, in order, into `logits` (`rows x vocab`) and returns the number of
    /// rows. `exact`: every linear layer computes each row as it is alone, so a row's result
    /// does not depend on the rest of the batch.
    #[allow(clippy::too_many_arguments)]
    fn forward_batch(&mut self, book: &mut Book, kv: &mut B::KvStore, batch: &[BatchSeq<'_>], uses: &[&[LoraUse]], exact: bool, logits: &mut Vec<f32>) -> Result<usize> {
        let Self { backend, dims: d, layers, norm, output, embed, buf: b, step, kv_layers, state_floats, lora, keep_hidden, hidden, keep_rows, .. } = self;
        // Adapters only when a sequence chose one: the other batches run as without them.
        let lo = LoraCtx { adapters: lora, uses: if uses.iter().any(|u| !u.is_empty()) { uses } else { &[] } };
        let n: usize = batch.iter().map(|s| s.tokens.len()).sum();
        let (h, q_out, kv_out, inter) = (d.hidden, d.heads * d.head_dim, d.kv_heads * d.head_dim, d.inter);
        if kv.width() != kv_out || kv.layers() != *kv_layers || kv.state_floats() != *state_floats {
            return Err(Error::Internal("the KV cache was made for another model"));
        }
        check_block_size(book.block_size())?;
        for (buf, len) in [(&mut b.x, h), (&mut b.xn, h), (&mut b.q, q_out), (&mut b.k, kv_out), (&mut b.v, kv_out), (&mut b.att, q_out), (&mut b.y, h), (&mut b.g, inter), (&mut b.u, inter)] {
            B::reserve(buf, n * len);
        }
        for l in layers.iter() {
            match &l.mixer {
                Mixer::Attention(a) if a.gated => {
                    B::reserve(&mut b.qg, n * 2 * q_out);
                    B::reserve(&mut b.gate, n * q_out);
                }
                Mixer::Attention(_) => {}
                Mixer::Linear(dl) => {
                    let sh = &dl.vectors.shape;
                    for (buf, len) in [(&mut b.qkv, sh.conv_dim()), (&mut b.z, sh.value_dim()), (&mut b.att, sh.value_dim()), (&mut b.beta, sh.v_heads), (&mut b.alpha, sh.v_heads)] {
                        B::reserve(buf, n * len);
                    }
                }
            }
        }
        plan(book, batch, step)?;
        step.keep_rows = *keep_rows;
        if *state_floats > 0 {
            // The recurrent states stand where the rows start (not after a failed forward).
            for seg in &step.segs {
                book.check_state_at(seg.seq, seg.start)?;
            }
        }
        backend.embed(embed, batch.iter().flat_map(|s| s.tokens.iter().copied()), h, &mut b.x);
        if let Some(scale) = d.embed_scale {
            backend.scale(&mut b.x, n * h, scale);
        }
        // The residual add that ends a layer is done with the next layer's first norm (in the
        // same pass over each row), the last one after the loop.
        let mut pending = false;
        for (li, layer) in layers.iter().enumerate() {
            let y = pending.then_some(&b.y);
            let a = match &layer.mixer {
                Mixer::Attention(a) => a,
                Mixer::Linear(dl) => {
                    let lins = [&dl.qkv, &dl.z, &dl.beta, &dl.alpha];
                    backend.add_norm_linear_group(&mut b.x, y, &layer.attn_norm, d.eps, &mut b.xn, &lins, n, exact, &mut [&mut b.qkv, &mut b.z, &mut b.beta, &mut b.alpha])?;
                    let p = DeltaInputs { qkv: &b.qkv, z: &b.z, beta: &b.beta, alpha: &b.alpha };
                    backend.delta_net(kv, &dl.vectors, p, step, &mut b.att)?;
                    backend.linear_rows(&dl.out, &b.att, n, exact, &mut b.y)?;
                    Self::mlp(backend, d, (li, layer), b, n, exact, (&lo, step))?;
                    pending = true;
                    continue;
                }
            };
            Self::attention(backend, d, (li, layer, a), b, pending, n, exact, (&lo, step), kv)?;
            Self::mlp(backend, d, (li, layer), b, n, exact, (&lo, step))?;
            pending = true;
        }
        if pending {
            backend.add(&mut b.x, &b.y, n * h);
        }
        if *keep_hidden {
            // The final norm of every row: what the MTP head takes for each position.
            let all: Vec<usize> = (0..n).collect();
            B::reserve(hidden, n * h);
            backend.rms_norm_rows(&b.x, &all, norm, d.eps, hidden);
        }
        if *state_floats > 0 {
            for seg in &step.segs {
                book.set_state_len(seg.seq, seg.start + seg.n)?;
            }
        }
        // Final norm (of the rows whose logits are wanted) and logits.
        let rows = step.out_rows.len();
        backend.rms_norm_rows(&b.x, &step.out_rows, norm, d.eps, &mut b.xn);
        backend.logits(output, &b.xn, rows, exact, d.softcap, logits)?;
        Ok(rows)
    }

    /// An attention layer's first half: `x += y` when `pending` (the previous layer's
    /// output), the norm, the projections, q/k norms, RoPE, attention over the cache and the
    /// output projection, the result in `b.y`.
    #[allow(clippy::too_many_arguments)]
    fn attention(backend: &mut B, d: &Dims, (li, layer, a): (usize, &Layer<B>, &Attention<B>), b: &mut Bufs<B::Buf>, pending: bool, n: usize, exact: bool, (lo, step): (&LoraCtx<'_>, &Step), kv: &mut B::KvStore) -> Result<()> {
        let (h, q_out, kv_out) = (d.hidden, d.heads * d.head_dim, d.kv_heads * d.head_dim);
        let y = pending.then_some(&b.y);
        let (qb, q_w) = if a.gated { (&mut b.qg, 2 * q_out) } else { (&mut b.q, q_out) };
        match &a.qkv {
            Qkv::Separate(q, k, v) => {
                backend.add_norm_linear_group(&mut b.x, y, &layer.attn_norm, d.eps, &mut b.xn, &[q, k, v], n, exact, &mut [&mut *qb, &mut b.k, &mut b.v])?;
                lo.apply(backend, step, li, Target::Q, &b.xn, h, qb, q_w);
                lo.apply(backend, step, li, Target::K, &b.xn, h, &mut b.k, kv_out);
                lo.apply(backend, step, li, Target::V, &b.xn, h, &mut b.v, kv_out);
            }
            Qkv::Fused(l) => {
                B::reserve(&mut b.qkv, n * (q_w + 2 * kv_out));
                backend.add_norm_linear_group(&mut b.x, y, &layer.attn_norm, d.eps, &mut b.xn, &[l], n, exact, &mut [&mut b.qkv])?;
                lo.apply(backend, step, li, Target::Qkv, &b.xn, h, &mut b.qkv, q_w + 2 * kv_out);
                backend.split_rows(&b.qkv, n, &mut [(qb, q_w), (&mut b.k, kv_out), (&mut b.v, kv_out)]);
            }
        }
        if a.gated {
            backend.split_query_gate(&b.qg, n, d.heads, d.head_dim, &mut b.q, &mut b.gate);
        }
        if let Some(w) = &a.q_norm {
            backend.rms_norm_in_place(&mut b.q, w, n * q_out, d.eps);
        }
        if let Some(w) = &a.k_norm {
            backend.rms_norm_in_place(&mut b.k, w, n * kv_out, d.eps);
        }
        backend.rope_write_kv(kv, a.kv_layer, &mut b.q, &mut b.k, &b.v, step, layer.rope);
        backend.attention(kv, a.kv_layer, layer.window, layer.sinks.as_ref(), &b.q, step, &mut b.att);
        if a.gated {
            backend.mul_sigmoid(&mut b.att, &b.gate, n * q_out);
        }
        backend.linear_rows(&a.o, &b.att, n, exact, &mut b.y)?;
        lo.apply(backend, step, li, Target::O, &b.att, q_out, &mut b.y, h);
        Ok(())
    }

    /// A layer's second half, after its mixer left its output in `b.y`: the residual add, the
    /// norm and the feed-forward (gated MLP or experts), the result in `b.y` (added by the next layer's first norm).
    fn mlp(backend: &mut B, d: &Dims, (li, layer): (usize, &Layer<B>), b: &mut Bufs<B::Buf>, n: usize, exact: bool, (lo, step): (&LoraCtx<'_>, &Step)) -> Result<()> {
        let (h, inter) = (d.hidden, d.inter);
        if let Some(w) = &layer.post_attn_norm {
            backend.rms_norm_in_place(&mut b.y, w, n * h, d.eps);
        }
        match &layer.mlp {
            Mlp::Dense { gate_up, down } => {
                match gate_up {
                    GateUp::Separate(g, u) => {
                        backend.add_norm_linear_group(&mut b.x, Some(&b.y), &layer.ffn_norm, d.eps, &mut b.xn, &[g, u], n, exact, &mut [&mut b.g, &mut b.u])?;
                        lo.apply(backend, step, li, Target::Gate, &b.xn, h, &mut b.g, inter);
                        lo.apply(backend, step, li, Target::Up, &b.xn, h, &mut b.u, inter);
                    }
                    GateUp::Fused(l) => {
                        B::reserve(&mut b.gu, n * 2 * inter);
                        backend.add_norm_linear_group(&mut b.x, Some(&b.y), &layer.ffn_norm, d.eps, &mut b.xn, &[l], n, exact, &mut [&mut b.gu])?;
                        lo.apply(backend, step, li, Target::GateUp, &b.xn, h, &mut b.gu, 2 * inter);
                        backend.split_rows(&b.gu, n, &mut [(&mut b.g, inter), (&mut b.u, inter)]);
                    }
                }
                backend.glu_linear(d.activation, &mut b.g, &b.u, inter, down, n, exact, &mut b.y)?;
                // `g` holds the activation's product now: the down projection's input.
                lo.apply(backend, step, li, Target::Down, &b.g, inter, &mut b.y, h);
            }
            Mlp::Moe { router, experts } => {
                // The router's logits (in `gu`) with the residual add and the norm, then each
                // expert over the rows routed to it.
                B::reserve(&mut b.gu, n * B::lin_shape(router).0);
                backend.add_norm_linear_group(&mut b.x, Some(&b.y), &layer.ffn_norm, d.eps, &mut b.xn, &[router], n, exact, &mut [&mut b.gu])?;
                backend.moe(experts, &b.xn, &b.gu, n, exact, &mut b.y)?;
            }
        }
        if let Some(w) = &layer.post_ffn_norm {
            backend.rms_norm_in_place(&mut b.y, w, n * h, d.eps);
        }
        Ok(())
    }
}

/// The linear layers of `l` LoRA adapters may adapt, with their `(out, in)`.
fn lora_targets<B: Backend>(l: &Layer<B>) -> Vec<(Target, (usize, usize))> {
    let mut t = Vec::new();
    if let Mixer::Attention(a) = &l.mixer {
        match &a.qkv {
            Qkv::Separate(q, k, v) => t.extend([(Target::Q, B::lin_shape(q)), (Target::K, B::lin_shape(k)), (Target::V, B::lin_shape(v))]),
            Qkv::Fused(x) => t.push((Target::Qkv, B::lin_shape(x))),
        }
        t.push((Target::O, B::lin_shape(&a.o)));
    }
    if let Mlp::Dense { gate_up, down } = &l.mlp {
        match gate_up {
            GateUp::Separate(g, u) => t.extend([(Target::Gate, B::lin_shape(g)), (Target::Up, B::lin_shape(u))]),
            GateUp::Fused(x) => t.push((Target::GateUp, B::lin_shape(x))),
        }
        t.push((Target::Down, B::lin_shape(down)));
    }
    t
}

/// Every linear layer, in layer order, the output layer last.
fn linears<'a, B: Backend>(layers: &'a mut [Layer<B>], output: &'a mut B::Lin) -> Vec<&'a mut B::Lin> {
    let mut w = Vec::new();
    for l in layers {
        match &mut l.mixer {
            Mixer::Attention(a) => {
                match &mut a.qkv {
                    Qkv::Separate(q, k, v) => w.extend([q, k, v]),
                    Qkv::Fused(x) => w.push(x),
                }
                w.push(&mut a.o);
            }
            Mixer::Linear(dl) => w.extend(dl.linears()),
        }
        match &mut l.mlp {
            Mlp::Dense { gate_up, down } => {
                match gate_up {
                    GateUp::Separate(g, u) => w.extend([g, u]),
                    GateUp::Fused(x) => w.push(x),
                }
                w.push(down);
            }
            Mlp::Moe { router, experts } => {
                w.push(router);
                w.extend(experts.linears());
            }
        }
    }
    w.push(output);
    w
}
