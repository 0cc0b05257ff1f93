//! `sapient-llama`: LLaMA-family causal language models (llama, qwen2, qwen3, mistral, smollm,
//! phi3-style configs, gemma3, the Qwen3.5 hybrid of linear and full attention, and the
//! mixtures of experts qwen3moe, qwen2moe, gpt-oss and llama with experts), loaded from GGUF (kept
//! quantized) or HF safetensors (dense), run by one forward pass on the CPU.
//! docs/llm-architectures.md lists what each was checked against.
//!
//! ```no_run
//! # fn main() -> Result<(), sapient_llama::Error> {
//! use sapient_llama::{LlamaModel, Logits};
//! let mut model = sapient_llama::load("model.gguf".as_ref(), &candle_core::Device::Cpu, None)?;
//! let logits = model.forward(&[1, 2, 3], Logits::Last)?; // [1, vocab]
//! # Ok(()) }
//! ```

mod backend;
mod batch;
mod config;
mod cpu;
mod deltanet;
pub mod kv;
mod model;
mod moe;
mod names;
mod rope;
mod lora;

pub use config::{Activation, Arch, HybridConfig, LlamaConfig, RopeScaling, WeightLayout};
pub use kv::{KvBudget, KvCache, KvDtype, KvLayout, KvOptions, KvUsage, SeqId};
pub use batch::{BatchSeq, Logits};
pub use lora::{LoraInfo, LoraUse};
pub use model::{LlamaModel, DEFAULT_PREFILL_CHUNK};
pub use moe::{ExpertActivation, Gating, MoeConfig};

use candle_core::Device;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("{path}: unsupported architecture '{arch}' (supported: llama, qwen2, qwen3, qwen35, qwen3moe, qwen2moe, gpt-oss, mistral, phi3, gemma3)")]
    UnsupportedArchitecture { arch: String, path: PathBuf },
    #[error("invalid model config: {0}")]
    Config(String),
    #[error("unknown KV cache type {0:?} (expected f16 or q8_0)")]
    UnknownKvType(String),
    #[error("the sequence needs {needed} positions but the context holds {max}")]
    ContextOverflow { needed: usize, max: usize },
    #[error("token id {token} is outside the vocabulary of {vocab}")]
    TokenOutOfRange { token: u32, vocab: usize },
    #[error("forward called with no tokens")]
    EmptyInput,
    #[error("the KV cache has no room: {needed} more blocks needed, {available} available")]
    KvFull { needed: usize, available: usize },
    #[error("sequence {0} is not in the KV cache")]
    UnknownSequence(u32),
    /// A hybrid model's recurrent state holds `held` positions and cannot go back to `len`
    /// (only to 0): recompute the sequence instead.
    #[error("a hybrid model's recurrent state cannot roll back from {held} positions to {len} (only to 0)")]
    StateRollback { len: usize, held: usize },
    /// A device or activation dtype without a backend: the forward pass runs on the CPU
    /// with f32 activations; a CUDA or Metal backend would implement the same operations.
    #[error("no LLM backend for {what} yet: sapient-llama runs on the CPU with f32 activations only")]
    NoBackend { what: String },
    /// A LoRA adapter file that is not one, is for another model, or is damaged.
    #[error("{path}: {msg}")]
    Lora { path: PathBuf, msg: String },
    #[error("no LoRA adapter {id} ({loaded} loaded)")]
    UnknownLora { id: usize, loaded: usize },
    #[error("internal error: {0}")]
    Internal(&'static str),
    #[error(transparent)]
    Weights(#[from] sapient_tensor::Error),
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Load a model from a GGUF file, or from an HF directory (`config.json` + `*.safetensors`).
pub fn load(path: &Path, device: &Device, max_seq_len: Option<usize>) -> Result<LlamaModel> {
    if path.is_dir() {
        let cfg = LlamaConfig::from_hf_config(&path.join("config.json"))?;
        let src = sapient_tensor::open_weights(path)?;
        LlamaModel::load(src.as_ref(), &cfg, device, max_seq_len)
    } else {
        let g = sapient_tensor::GgufFile::open(path)?;
        let cfg = LlamaConfig::from_gguf(&g)?;
        LlamaModel::load(&g, &cfg, device, max_seq_len)
    }
}
