//! Model configuration: transformers' `WhisperConfig` fields plus what decoding needs
//! (alignment heads, suppressed tokens, language ids).

use crate::{Error, Result};
use candle_core::DType;
use serde_json::{json, Value};
use std::path::Path;

#[derive(Debug, Clone, PartialEq)]
pub struct WhisperConfig {
    pub vocab_size: usize,
    pub num_mel_bins: usize,
    pub d_model: usize,
    pub encoder_layers: usize,
    pub encoder_attention_heads: usize,
    pub decoder_layers: usize,
    pub decoder_attention_heads: usize,
    pub encoder_ffn_dim: usize,
    pub decoder_ffn_dim: usize,
    pub max_source_positions: usize,
    pub max_target_positions: usize,
    /// (decoder layer, head) pairs whose cross-attention follows the words in time.
    pub alignment_heads: Vec<(usize, usize)>,
    /// Tokens never sampled (openai-whisper's `suppress_tokens="-1"` list).
    pub suppress_tokens: Vec<u32>,
    /// Tokens not sampled first (a blank and end of text).
    pub begin_suppress_tokens: Vec<u32>,
    pub lang_ids: Vec<u32>,
}

impl Default for WhisperConfig {
    fn default() -> Self {
        Self {
            vocab_size: 51865,
            num_mel_bins: 80,
            d_model: 384,
            encoder_layers: 4,
            encoder_attention_heads: 6,
            decoder_layers: 4,
            decoder_attention_heads: 6,
            encoder_ffn_dim: 1536,
            decoder_ffn_dim: 1536,
            max_source_positions: 1500,
            max_target_positions: 448,
            alignment_heads: Vec::new(),
            suppress_tokens: Vec::new(),
            begin_suppress_tokens: Vec::new(),
            lang_ids: Vec::new(),
        }
    }
}

fn ids(v: Option<&Value>) -> Option<Vec<u32>> {
    v?.as_array()?.iter().map(|x| x.as_u64().and_then(|x| u32::try_from(x).ok())).collect()
}

fn heads(v: Option<&Value>) -> Option<Vec<(usize, usize)>> {
    v?.as_array()?
        .iter()
        .map(|p| {
            let p = p.as_array()?;
            Some((p.first()?.as_u64()? as usize, p.get(1)?.as_u64()? as usize))
        })
        .collect()
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| Error::Config {
        path: path.to_path_buf(),
        what: e.to_string(),
    })
}

impl WhisperConfig {
    /// Whether the model knows languages other than English (openai-whisper's test).
    pub fn is_multilingual(&self) -> bool {
        self.vocab_size >= 51865
    }

    pub(crate) fn validate(&self) -> std::result::Result<(), String> {
        let nz = [
            ("vocab_size", self.vocab_size),
            ("num_mel_bins", self.num_mel_bins),
            ("d_model", self.d_model),
            ("encoder_layers", self.encoder_layers),
            ("decoder_layers", self.decoder_layers),
            ("encoder_attention_heads", self.encoder_attention_heads),
            ("decoder_attention_heads", self.decoder_attention_heads),
            ("encoder_ffn_dim", self.encoder_ffn_dim),
            ("decoder_ffn_dim", self.decoder_ffn_dim),
            ("max_source_positions", self.max_source_positions),
            ("max_target_positions", self.max_target_positions),
        ];
        if let Some((k, _)) = nz.iter().find(|(_, v)| *v == 0) {
            return Err(format!("{k} is 0"));
        }
        if !self.d_model.is_multiple_of(self.encoder_attention_heads) || !self.d_model.is_multiple_of(self.decoder_attention_heads) {
            return Err(format!("d_model {} is not divisible by the number of heads", self.d_model));
        }
        if self.num_mel_bins != 80 && self.num_mel_bins != 128 {
            return Err(format!("num_mel_bins {} (Whisper uses 80 or 128)", self.num_mel_bins));
        }
        if let Some(&(l, h)) = self.alignment_heads.iter().find(|(l, h)| *l >= self.decoder_layers || *h >= self.decoder_attention_heads) {
            return Err(format!("alignment head ({l}, {h}) outside {} layers x {} heads", self.decoder_layers, self.decoder_attention_heads));
        }
        Ok(())
    }

    /// Take `alignment_heads`, `suppress_ids`, `suppress_ids_begin` and `lang_ids` from a
    /// CTranslate2 `config.json`.
    pub fn merge_ct2_config(&mut self, path: &Path) -> Result<()> {
        let v = read_json(path)?;
        let bad = |what: &str| Error::Config {
            path: path.to_path_buf(),
            what: what.to_string(),
        };
        if let Some(x) = v.get("alignment_heads") {
            self.alignment_heads = heads(Some(x)).ok_or_else(|| bad("alignment_heads is not a list of [layer, head] pairs"))?;
        }
        if let Some(x) = v.get("suppress_ids") {
            self.suppress_tokens = ids(Some(x)).ok_or_else(|| bad("suppress_ids is not a list of token ids"))?;
        }
        if let Some(x) = v.get("suppress_ids_begin") {
            self.begin_suppress_tokens = ids(Some(x)).ok_or_else(|| bad("suppress_ids_begin is not a list of token ids"))?;
        }
        if let Some(x) = v.get("lang_ids") {
            self.lang_ids = ids(Some(x)).ok_or_else(|| bad("lang_ids is not a list of token ids"))?;
        }
        self.validate().map_err(|e| bad(&e))
    }

    /// Read a transformers `config.json` (and `generation_config.json` beside it, when
    /// present, for the alignment heads and suppressed tokens).
    pub fn from_hf_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        let v = read_json(&path)?;
        let bad = |what: String| Error::Config {
            path: path.clone(),
            what,
        };
        let get = |k: &str| -> Result<usize> {
            v.get(k)
                .and_then(|x| x.as_u64())
                .map(|x| x as usize)
                .ok_or_else(|| bad(format!("missing or non-integer '{k}'")))
        };
        if let Some(t) = v.get("model_type").and_then(|t| t.as_str()) {
            if t != "whisper" {
                return Err(bad(format!("model_type '{t}' is not whisper")));
            }
        }
        let mut cfg = Self {
            vocab_size: get("vocab_size")?,
            num_mel_bins: get("num_mel_bins")?,
            d_model: get("d_model")?,
            encoder_layers: get("encoder_layers")?,
            encoder_attention_heads: get("encoder_attention_heads")?,
            decoder_layers: get("decoder_layers")?,
            decoder_attention_heads: get("decoder_attention_heads")?,
            encoder_ffn_dim: get("encoder_ffn_dim")?,
            decoder_ffn_dim: get("decoder_ffn_dim")?,
            max_source_positions: get("max_source_positions")?,
            max_target_positions: get("max_target_positions")?,
            alignment_heads: heads(v.get("alignment_heads")).unwrap_or_default(),
            suppress_tokens: ids(v.get("suppress_tokens")).unwrap_or_default(),
            begin_suppress_tokens: ids(v.get("begin_suppress_tokens")).unwrap_or_default(),
            lang_ids: ids(v.get("lang_ids")).unwrap_or_default(),
        };
        let gen = dir.join("generation_config.json");
        if gen.is_file() {
            let g = read_json(&gen)?;
            if cfg.alignment_heads.is_empty() {
                cfg.alignment_heads = heads(g.get("alignment_heads")).unwrap_or_default();
            }
            if cfg.suppress_tokens.is_empty() {
                cfg.suppress_tokens = ids(g.get("suppress_tokens")).unwrap_or_default();
            }
            if cfg.begin_suppress_tokens.is_empty() {
                cfg.begin_suppress_tokens = ids(g.get("begin_suppress_tokens")).unwrap_or_default();
            }
            if cfg.lang_ids.is_empty() {
                if let Some(m) = g.get("lang_to_id").and_then(|m| m.as_object()) {
                    let mut l: Vec<u32> = m.values().filter_map(|x| x.as_u64().map(|x| x as u32)).collect();
                    l.sort_unstable();
                    cfg.lang_ids = l;
                }
            }
        }
        cfg.validate().map_err(bad)?;
        Ok(cfg)
    }

    /// transformers' `config.json` for this model, with our decoding fields added.
    pub fn to_hf_json(&self, dtype: DType) -> Value {
        let multilingual = self.is_multilingual();
        // Special ids follow from the vocabulary: English-only models have one token fewer.
        let eot = if multilingual { 50257 } else { 50256 };
        let sot = eot + 1;
        let no_timestamps = if multilingual { 50363 } else { 50362 };
        json!({
            "architectures": ["WhisperForConditionalGeneration"],
            "model_type": "whisper",
            "vocab_size": self.vocab_size,
            "num_mel_bins": self.num_mel_bins,
            "d_model": self.d_model,
            "encoder_layers": self.encoder_layers,
            "encoder_attention_heads": self.encoder_attention_heads,
            "decoder_layers": self.decoder_layers,
            "decoder_attention_heads": self.decoder_attention_heads,
            "encoder_ffn_dim": self.encoder_ffn_dim,
            "decoder_ffn_dim": self.decoder_ffn_dim,
            "max_source_positions": self.max_source_positions,
            "max_target_positions": self.max_target_positions,
            "activation_function": "gelu",
            "scale_embedding": false,
            "tie_word_embeddings": true,
            "use_cache": true,
            "bos_token_id": eot,
            "eos_token_id": eot,
            "pad_token_id": eot,
            "decoder_start_token_id": sot,
            "no_timestamps_token_id": no_timestamps,
            "is_multilingual": multilingual,
            "torch_dtype": match dtype { DType::F16 => "float16", DType::BF16 => "bfloat16", _ => "float32" },
            "suppress_tokens": self.suppress_tokens,
            "begin_suppress_tokens": self.begin_suppress_tokens,
            "alignment_heads": self.alignment_heads.iter().map(|(l, h)| [l, h]).collect::<Vec<_>>(),
            "lang_ids": self.lang_ids,
        })
    }
}
