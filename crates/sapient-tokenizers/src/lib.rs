//! `sapient-tokenizers`: tokenizers from `tokenizer.json` or GGUF metadata, chat templates,
//! a streaming detokenizer and stop-sequence matching.

mod gguf;
mod stream;
mod template;

pub use stream::{StopMatcher, StopOutput, TokenStream};
pub use template::{ChatTemplate, Message, RenderOptions};

use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("{path}: {what}")]
    Load { path: PathBuf, what: String },
    #[error("{path}: unsupported tokenizer model '{model}' (supported: gpt2 byte-level BPE, llama SentencePiece)")]
    UnsupportedModel { path: PathBuf, model: String },
    #[error("{path}: unsupported pre-tokenizer '{pre}' (tokenizer.ggml.pre)")]
    UnsupportedPreTokenizer { path: PathBuf, pre: String },
    #[error("{path}: tokenizer metadata: {what}")]
    Metadata { path: PathBuf, what: String },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    Template(String),
    #[error(transparent)]
    Gguf(#[from] sapient_tensor::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug)]
struct Meta {
    bos: Option<(u32, String)>,
    eos: Option<(u32, String)>,
    eos_ids: Vec<u32>,
    add_bos: bool,
    template: Option<ChatTemplate>,
    byte_level: bool,
}

/// A tokenizer with its special tokens and chat template. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Tokenizer {
    inner: Arc<tokenizers::Tokenizer>,
    meta: Arc<Meta>,
}

fn tk_err(e: impl std::fmt::Display) -> Error {
    Error::Tokenizer(e.to_string())
}

/// Names of end-of-turn tokens that stop generation when the vocabulary has them as special tokens.
const EOT_NAMES: &[&str] = &["<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|endoftext|>", "<|end|>", "</s>", "<end_of_turn>"];

impl Tokenizer {
    /// Load an HF `tokenizer.json`; `tokenizer_config.json` and `chat_template.jinja` beside it
    /// supply the special tokens and the chat template when present.
    pub fn from_file(tokenizer_json: &Path) -> Result<Self> {
        let inner = tokenizers::Tokenizer::from_file(tokenizer_json).map_err(|e| Error::Load {
            path: tokenizer_json.to_path_buf(),
            what: e.to_string(),
        })?;
        let dir = tokenizer_json.parent().unwrap_or(Path::new("."));
        let config: serde_json::Value = match std::fs::read_to_string(dir.join("tokenizer_config.json")) {
            Ok(s) => serde_json::from_str(&s).map_err(|e| Error::Load {
                path: dir.join("tokenizer_config.json"),
                what: e.to_string(),
            })?,
            Err(_) => serde_json::Value::Null,
        };
        let token_str = |key: &str| -> Option<String> {
            match config.get(key)? {
                serde_json::Value::String(s) => Some(s.clone()),
                serde_json::Value::Object(o) => o.get("content")?.as_str().map(String::from),
                _ => None,
            }
        };
        let lookup = |s: Option<String>| s.and_then(|s| inner.token_to_id(&s).map(|id| (id, s)));
        let bos = lookup(token_str("bos_token"));
        let eos = lookup(token_str("eos_token"));
        let add_bos = config.get("add_bos_token").and_then(|v| v.as_bool()).unwrap_or(false);
        let mut template_src = match config.get("chat_template") {
            Some(serde_json::Value::String(s)) => Some(s.clone()),
            // A list of named templates: take "default".
            Some(serde_json::Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                .or(list.first())
                .and_then(|t| t.get("template"))
                .and_then(|t| t.as_str())
                .map(String::from),
            _ => None,
        };
        if let Ok(s) = std::fs::read_to_string(dir.join("chat_template.jinja")) {
            template_src = Some(s);
        }
        let template = match template_src {
            Some(src) => Some(ChatTemplate::new(
                &src,
                bos.as_ref().map(|b| b.1.as_str()),
                eos.as_ref().map(|e| e.1.as_str()),
            )?),
            None => None,
        };
        let byte_level = matches!(
            inner.get_decoder(),
            Some(tokenizers::DecoderWrapper::ByteLevel(_))
        );
        let mut eos_ids: Vec<u32> = eos.iter().map(|e| e.0).collect();
        push_eot_names(&inner, &mut eos_ids);
        Ok(Self {
            inner: Arc::new(inner),
            meta: Arc::new(Meta { bos, eos, eos_ids, add_bos, template, byte_level }),
        })
    }

    /// Build the tokenizer from GGUF `tokenizer.ggml.*` metadata.
    pub fn from_gguf(g: &sapient_tensor::GgufFile) -> Result<Self> {
        let built = gguf::build(g)?;
        let tok = |id: Option<u32>| id.and_then(|i| built.tokenizer.id_to_token(i).map(|s| (i, s)));
        let bos = tok(built.bos);
        let eos = tok(built.eos);
        let template = match g.get("tokenizer.chat_template").and_then(|v| v.as_str()) {
            Some(src) => Some(ChatTemplate::new(
                src,
                bos.as_ref().map(|b| b.1.as_str()),
                eos.as_ref().map(|e| e.1.as_str()),
            )?),
            None => None,
        };
        let mut eos_ids: Vec<u32> = eos.iter().map(|e| e.0).collect();
        for key in ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
            if let Some(id) = g.get(key).and_then(|v| v.as_int()) {
                if !eos_ids.contains(&(id as u32)) {
                    eos_ids.push(id as u32);
                }
            }
        }
        push_eot_names(&built.tokenizer, &mut eos_ids);
        Ok(Self {
            inner: Arc::new(built.tokenizer),
            meta: Arc::new(Meta {
                bos,
                eos,
                eos_ids,
                add_bos: built.add_bos,
                template,
                byte_level: built.byte_level,
            }),
        })
    }

    /// Encode text. Special tokens written in the text (`<|im_start|>`) become their ids.
    /// With `add_special_tokens`, the BOS token is prepended when the model asks for it.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let enc = self.inner.encode(text, false).map_err(tk_err)?;
        let mut ids = Vec::with_capacity(enc.len() + 1);
        if add_special_tokens && self.meta.add_bos {
            if let Some((bos, _)) = &self.meta.bos {
                ids.push(*bos);
            }
        }
        ids.extend_from_slice(enc.get_ids());
        Ok(ids)
    }

    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        if let Some(&bad) = ids.iter().find(|&&i| i as usize >= self.vocab_size()) {
            return Err(Error::Tokenizer(format!("token id {bad} is outside the vocabulary of {}", self.vocab_size())));
        }
        self.inner.decode(ids, skip_special_tokens).map_err(tk_err)
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
    pub fn token_to_id(&self, s: &str) -> Option<u32> {
        self.inner.token_to_id(s)
    }
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }
    pub fn bos_token_id(&self) -> Option<u32> {
        self.meta.bos.as_ref().map(|b| b.0)
    }
    pub fn bos_token(&self) -> Option<&str> {
        self.meta.bos.as_ref().map(|b| b.1.as_str())
    }
    pub fn eos_token(&self) -> Option<&str> {
        self.meta.eos.as_ref().map(|b| b.1.as_str())
    }
    /// Tokens that end a generation: the EOS token and the end-of-turn tokens the model uses.
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.meta.eos_ids
    }
    pub fn add_bos(&self) -> bool {
        self.meta.add_bos
    }
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.meta.template.as_ref()
    }
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// The bytes each token id stands for (byte-level tokens mapped back to raw bytes,
    /// SentencePiece `▁` to a space, `<0xNN>` byte tokens to their byte). Special tokens give
    /// their text.
    pub fn token_bytes(&self) -> Vec<Vec<u8>> {
        let n = self.vocab_size();
        let table = stream::unicode_to_byte();
        (0..n as u32)
            .map(|id| {
                let Some(s) = self.inner.id_to_token(id) else { return Vec::new() };
                if self.meta.byte_level {
                    let mapped: Option<Vec<u8>> = s.chars().map(|c| table.get(&c).copied()).collect();
                    mapped.unwrap_or_else(|| s.into_bytes())
                } else if let Some(b) = stream::parse_byte_token(&s) {
                    vec![b]
                } else {
                    s.replace('\u{2581}', " ").into_bytes()
                }
            })
            .collect()
    }
}

fn push_eot_names(t: &tokenizers::Tokenizer, ids: &mut Vec<u32>) {
    let specials: std::collections::HashSet<u32> = t
        .get_added_tokens_decoder()
        .iter()
        .filter(|(_, tok)| tok.special)
        .map(|(id, _)| *id)
        .collect();
    for name in EOT_NAMES {
        if let Some(id) = t.token_to_id(name) {
            if specials.contains(&id) && !ids.contains(&id) {
                ids.push(id);
            }
        }
    }
}
