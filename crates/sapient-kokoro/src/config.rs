//! Kokoro's `config.json` (the hexgrad/Kokoro-82M file: model sizes, iSTFTNet settings, the
//! PL-BERT sizes and the phoneme vocabulary).

use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// The iSTFTNet decoder's generator settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IstftNetConfig {
    pub upsample_kernel_sizes: Vec<usize>,
    pub upsample_rates: Vec<usize>,
    pub gen_istft_hop_size: usize,
    pub gen_istft_n_fft: usize,
    pub resblock_dilation_sizes: Vec<Vec<usize>>,
    pub resblock_kernel_sizes: Vec<usize>,
    pub upsample_initial_channel: usize,
}

/// The ALBERT (PL-BERT) text encoder's sizes (`AlbertConfig` fields).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlBertConfig {
    pub hidden_size: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    pub max_position_embeddings: usize,
    pub num_hidden_layers: usize,
    #[serde(default)]
    pub dropout: f64,
    /// Not in Kokoro's file: `AlbertConfig`'s default.
    #[serde(default = "default_embedding_size")]
    pub embedding_size: usize,
    /// Not in Kokoro's file: `AlbertConfig`'s default.
    #[serde(default = "default_type_vocab_size")]
    pub type_vocab_size: usize,
}

fn default_embedding_size() -> usize {
    128
}
fn default_type_vocab_size() -> usize {
    2
}

/// Kokoro-82M's `config.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KokoroConfig {
    pub istftnet: IstftNetConfig,
    pub dim_in: usize,
    #[serde(default)]
    pub dropout: f64,
    pub hidden_dim: usize,
    pub max_conv_dim: usize,
    pub max_dur: usize,
    #[serde(default)]
    pub multispeaker: bool,
    pub n_layer: usize,
    pub n_mels: usize,
    pub n_token: usize,
    pub style_dim: usize,
    pub text_encoder_kernel_size: usize,
    pub plbert: PlBertConfig,
    /// Phoneme (a single character) to token id.
    #[serde(default)]
    pub vocab: BTreeMap<String, u32>,
}

impl KokoroConfig {
    /// Kokoro-82M v1.0 (hexgrad/Kokoro-82M `config.json`), without a vocabulary.
    pub fn v1_0() -> Self {
        Self {
            istftnet: IstftNetConfig {
                upsample_kernel_sizes: vec![20, 12],
                upsample_rates: vec![10, 6],
                gen_istft_hop_size: 5,
                gen_istft_n_fft: 20,
                resblock_dilation_sizes: vec![vec![1, 3, 5], vec![1, 3, 5], vec![1, 3, 5]],
                resblock_kernel_sizes: vec![3, 7, 11],
                upsample_initial_channel: 512,
            },
            dim_in: 64,
            dropout: 0.2,
            hidden_dim: 512,
            max_conv_dim: 512,
            max_dur: 50,
            multispeaker: true,
            n_layer: 3,
            n_mels: 80,
            n_token: 178,
            style_dim: 128,
            text_encoder_kernel_size: 5,
            plbert: PlBertConfig {
                hidden_size: 768,
                num_attention_heads: 12,
                intermediate_size: 2048,
                max_position_embeddings: 512,
                num_hidden_layers: 12,
                dropout: 0.1,
                embedding_size: 128,
                type_vocab_size: 2,
            },
            vocab: BTreeMap::new(),
        }
    }

    pub fn from_json(path: &Path, text: &str) -> Result<Self> {
        let cfg: Self = serde_json::from_str(text).map_err(|e| Error::Config {
            path: path.to_path_buf(),
            what: e.to_string(),
        })?;
        cfg.validate(path)?;
        Ok(cfg)
    }

    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_json(path, &text)
    }

    /// Checks the sizes a model needs to be built at all (nothing zero, lists that go together
    /// of the same length, vocabulary ids inside `n_token`).
    pub fn validate(&self, path: &Path) -> Result<()> {
        let bad = |what: String| Error::Config {
            path: path.to_path_buf(),
            what,
        };
        let i = &self.istftnet;
        for (name, v) in [
            ("hidden_dim", self.hidden_dim),
            ("n_layer", self.n_layer),
            ("n_token", self.n_token),
            ("style_dim", self.style_dim),
            ("max_dur", self.max_dur),
            ("text_encoder_kernel_size", self.text_encoder_kernel_size),
            ("istftnet.gen_istft_n_fft", i.gen_istft_n_fft),
            ("istftnet.gen_istft_hop_size", i.gen_istft_hop_size),
            ("istftnet.upsample_initial_channel", i.upsample_initial_channel),
            ("plbert.hidden_size", self.plbert.hidden_size),
            ("plbert.num_attention_heads", self.plbert.num_attention_heads),
            ("plbert.embedding_size", self.plbert.embedding_size),
        ] {
            if v == 0 {
                return Err(bad(format!("{name} is 0")));
            }
        }
        if !self.hidden_dim.is_multiple_of(2) {
            return Err(bad(format!("hidden_dim {} is odd (the LSTMs have hidden_dim/2 units per direction)", self.hidden_dim)));
        }
        if !self.plbert.hidden_size.is_multiple_of(self.plbert.num_attention_heads) {
            return Err(bad(format!(
                "plbert.hidden_size {} is not a multiple of num_attention_heads {}",
                self.plbert.hidden_size, self.plbert.num_attention_heads
            )));
        }
        if i.upsample_rates.len() != i.upsample_kernel_sizes.len() || i.upsample_rates.is_empty() {
            return Err(bad("istftnet.upsample_rates and upsample_kernel_sizes must be non-empty and of the same length".into()));
        }
        if i.resblock_kernel_sizes.len() != i.resblock_dilation_sizes.len() {
            return Err(bad("istftnet.resblock_kernel_sizes and resblock_dilation_sizes differ in length".into()));
        }
        if i.upsample_initial_channel >> i.upsample_rates.len() == 0 {
            return Err(bad("istftnet.upsample_initial_channel is too small for the number of upsamplings".into()));
        }
        if let Some((p, id)) = self.vocab.iter().find(|(_, &id)| id as usize >= self.n_token) {
            return Err(bad(format!("vocab entry {p:?} has id {id}, outside n_token {}", self.n_token)));
        }
        Ok(())
    }

    pub fn to_json(&self) -> serde_json::Value {
        // a derived Serialize of plain structs cannot fail
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }
}
