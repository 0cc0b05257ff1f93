//! What an encoder looks like: from `config.json` (+ sentence-transformers files) or GGUF
//! metadata.

use crate::{Error, Result};
use sapient_tensor::GgufFile;
use std::path::Path;

/// How token vectors become one sentence vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// Average of the token vectors (special tokens included, as sentence-transformers and
    /// llama.cpp do).
    Mean,
    /// The first token (`[CLS]`).
    Cls,
    /// The last token.
    Last,
}

impl std::str::FromStr for Pooling {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "mean" => Ok(Pooling::Mean),
            "cls" => Ok(Pooling::Cls),
            "last" => Ok(Pooling::Last),
            _ => Err(Error::Options(format!("pooling '{s}' is not mean, cls or last"))),
        }
    }
}

/// The two encoder families this crate runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// BERT: learned absolute positions, biased projections, GELU MLP.
    Bert,
    /// nomic-bert: rotary positions, fused QKV without biases, SwiGLU MLP.
    NomicBert,
}

#[derive(Debug, Clone)]
pub struct EncoderConfig {
    pub arch: Arch,
    pub vocab: usize,
    pub dim: usize,
    pub layers: usize,
    pub heads: usize,
    pub ffn: usize,
    pub eps: f32,
    /// Learned positions (BERT); 0 for rotary models.
    pub max_positions: usize,
    pub rope_base: f32,
    /// Longest input in tokens (special tokens included); longer inputs are truncated.
    pub max_tokens: usize,
    pub pooling: Pooling,
    pub normalize: bool,
    /// Trained for Matryoshka truncation (layer norm, cut, normalise).
    pub matryoshka: bool,
    /// Task prefixes the model was trained with (`search_query: `, ...), when it has them.
    pub task_prefixes: bool,
}

fn cfg_err(path: &Path, what: impl Into<String>) -> Error {
    Error::Config { path: path.to_path_buf(), what: what.into() }
}

fn read_json(path: &Path) -> Result<serde_json::Value> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io { path: path.to_path_buf(), source })?;
    serde_json::from_str(&text).map_err(|e| cfg_err(path, e.to_string()))
}

impl EncoderConfig {
    /// From a transformers `config.json` (BERT only), with sentence-transformers' pooling
    /// config, `modules.json` (a `Normalize` module) and `sentence_bert_config.json`
    /// (`max_seq_length`) when given.
    pub fn from_hf(config: &Path, pooling: Option<&Path>, modules: Option<&Path>, sentence: Option<&Path>) -> Result<Self> {
        let c = read_json(config)?;
        let model_type = c.get("model_type").and_then(|v| v.as_str()).unwrap_or("");
        if model_type != "bert" {
            return Err(Error::Architecture { path: config.to_path_buf(), found: model_type.to_string() });
        }
        let int = |k: &str| -> Result<usize> {
            c.get(k).and_then(|v| v.as_u64()).map(|v| v as usize).ok_or_else(|| cfg_err(config, format!("no integer '{k}'")))
        };
        if let Some(act) = c.get("hidden_act").and_then(|v| v.as_str()) {
            if act != "gelu" {
                return Err(cfg_err(config, format!("hidden_act '{act}' (only gelu is implemented)")));
            }
        }
        if let Some(p) = c.get("position_embedding_type").and_then(|v| v.as_str()) {
            if p != "absolute" {
                return Err(cfg_err(config, format!("position_embedding_type '{p}' (only absolute is implemented)")));
            }
        }
        let max_positions = int("max_position_embeddings")?;
        let mut pool = Pooling::Mean;
        if let Some(p) = pooling {
            let j = read_json(p)?;
            let on = |k: &str| j.get(k).and_then(|v| v.as_bool()).unwrap_or(false);
            pool = if on("pooling_mode_cls_token") {
                Pooling::Cls
            } else if on("pooling_mode_lasttoken") {
                Pooling::Last
            } else if on("pooling_mode_mean_tokens") {
                Pooling::Mean
            } else {
                return Err(cfg_err(p, "no pooling mode this crate implements (mean, cls, last) is on"));
            };
        }
        let normalize = match modules {
            Some(m) => read_json(m)?
                .as_array()
                .is_some_and(|a| a.iter().any(|e| e.get("type").and_then(|t| t.as_str()).is_some_and(|t| t.ends_with(".Normalize")))),
            None => true,
        };
        let max_tokens = match sentence {
            Some(s) => read_json(s)?.get("max_seq_length").and_then(|v| v.as_u64()).map(|v| v as usize).unwrap_or(max_positions),
            None => max_positions,
        }
        .min(max_positions);
        let dim = int("hidden_size")?;
        let heads = int("num_attention_heads")?;
        if heads == 0 || dim % heads != 0 {
            return Err(cfg_err(config, format!("hidden_size {dim} is not a multiple of num_attention_heads {heads}")));
        }
        Ok(Self {
            arch: Arch::Bert,
            vocab: int("vocab_size")?,
            dim,
            layers: int("num_hidden_layers")?,
            heads,
            ffn: int("intermediate_size")?,
            eps: c.get("layer_norm_eps").and_then(|v| v.as_f64()).unwrap_or(1e-12) as f32,
            max_positions,
            rope_base: 0.0,
            max_tokens,
            pooling: pool,
            normalize,
            matryoshka: false,
            task_prefixes: false,
        })
    }

    /// From GGUF metadata: architecture `bert` or `nomic-bert` (`{arch}.pooling_type`: 1
    /// mean, 2 cls, 3 last).
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let arch_name = g.architecture()?.to_string();
        let arch = match arch_name.as_str() {
            "bert" => Arch::Bert,
            "nomic-bert" => Arch::NomicBert,
            _ => return Err(Error::Architecture { path: g.path().to_path_buf(), found: arch_name }),
        };
        let key = |k: &str| format!("{arch_name}.{k}");
        let dim = g.get_usize(&key("embedding_length"))?;
        let heads = g.get_usize(&key("attention.head_count"))?;
        if heads == 0 || dim % heads != 0 {
            return Err(cfg_err(g.path(), format!("embedding_length {dim} is not a multiple of head_count {heads}")));
        }
        if g.get(&key("attention.causal")).and_then(|v| v.as_int()).is_some_and(|c| c != 0) {
            return Err(cfg_err(g.path(), "a causal encoder (attention.causal = true) is not supported"));
        }
        let ctx = g.get_usize(&key("context_length"))?;
        let pooling = match g.get(&key("pooling_type")).and_then(|v| v.as_int()) {
            None | Some(1) => Pooling::Mean,
            Some(2) => Pooling::Cls,
            Some(3) => Pooling::Last,
            Some(p) => return Err(cfg_err(g.path(), format!("pooling_type {p} (mean 1, cls 2 and last 3 are implemented)"))),
        };
        let vocab = g.get_str_array("tokenizer.ggml.tokens")?.len();
        Ok(Self {
            arch,
            vocab,
            dim,
            layers: g.get_usize(&key("block_count"))?,
            heads,
            ffn: g.get_usize(&key("feed_forward_length"))?,
            eps: g.get(&key("attention.layer_norm_epsilon")).and_then(|v| v.as_f64()).unwrap_or(1e-12) as f32,
            max_positions: if arch == Arch::Bert { ctx } else { 0 },
            rope_base: g.get(&key("rope.freq_base")).and_then(|v| v.as_f64()).unwrap_or(10_000.0) as f32,
            max_tokens: ctx,
            pooling,
            normalize: true,
            matryoshka: arch == Arch::NomicBert,
            task_prefixes: arch == Arch::NomicBert,
        })
    }

    pub fn head_dim(&self) -> usize {
        self.dim / self.heads
    }
}
