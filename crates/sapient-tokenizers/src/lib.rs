//! `sapient-tokenizers`: tokenizers from `tokenizer.json` or GGUF metadata, chat templates,
//! a streaming detokenizer and stop-sequence matching.
//!
//! ```no_run
//! use sapient_tokenizers::{Message, RenderOptions, Tokenizer};
//! let g = sapient_tensor::GgufFile::open("SmolLM2-135M-Instruct.Q4_1.gguf")?;
//! let tok = Tokenizer::from_gguf(&g)?;
//! let prompt = tok
//!     .chat_template()
//!     .expect("the GGUF has a chat template")
//!     .render(&[Message::user("What is the capital of France?")], &RenderOptions::default())?;
//! let ids = tok.encode(&prompt, true)?;
//! assert_eq!(tok.decode(&ids, false)?, prompt);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod gguf;
mod spm;
mod stream;
mod template;

pub use stream::{byte_to_unicode, StopMatcher, StopOutput, TokenStream};
pub use template::{ChatTemplate, Message, RenderOptions, TemplateLimits};

use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A tokenizer file could not be read or parsed.
    #[error("{path}: {what}")]
    Load { path: PathBuf, what: String },
    #[error("{path}: unsupported tokenizer model '{model}' (supported: gpt2 byte-level BPE, llama SentencePiece)")]
    UnsupportedModel { path: PathBuf, model: String },
    #[error("{path}: unsupported pre-tokenizer '{pre}' (tokenizer.ggml.pre)")]
    UnsupportedPreTokenizer { path: PathBuf, pre: String },
    /// GGUF `tokenizer.ggml.*` metadata that is missing pieces or inconsistent.
    #[error("{path}: tokenizer metadata: {what}")]
    Metadata { path: PathBuf, what: String },
    #[error("token id {id} is outside the vocabulary of {vocab_size}")]
    UnknownId { id: u32, vocab_size: usize },
    /// Encoding or decoding failed inside the tokenizer.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A chat template that does not compile, or that failed (or raised) while rendering.
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
    byte_level: bool,
    /// llama.cpp's SentencePiece encoder for GGUF `llama` tokenizers (else `inner` encodes).
    spm: Option<spm::SpmEncoder>,
    /// Ids, added tokens included (the inner tokenizer counts them by looking up every added
    /// token: over a thousand with gpt-oss's vocabulary, on every decode).
    vocab_size: usize,
}

/// A tokenizer with its special tokens and chat template. Cheap to clone (shared inside).
#[derive(Clone, Debug)]
pub struct Tokenizer {
    inner: Arc<tokenizers::Tokenizer>,
    meta: Arc<Meta>,
    template: Option<Arc<ChatTemplate>>,
}

fn tk_err(e: impl std::fmt::Display) -> Error {
    Error::Tokenizer(e.to_string())
}

/// End-of-turn tokens that also end a generation when the vocabulary has them as special tokens.
const EOT_NAMES: &[&str] = &[
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<end_of_turn>",
    "<|END_OF_TURN_TOKEN|>",
    "</s>",
];

fn read_json(path: &Path) -> Result<Option<serde_json::Value>> {
    match std::fs::read_to_string(path) {
        Ok(s) => serde_json::from_str(&s).map(Some).map_err(|e| Error::Load {
            path: path.to_path_buf(),
            what: e.to_string(),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::Load {
            path: path.to_path_buf(),
            what: e.to_string(),
        }),
    }
}

/// `"<s>"` or `{"content": "<s>", ...}` as tokenizer_config.json writes special tokens.
fn config_token(config: &serde_json::Value, key: &str) -> Option<String> {
    match config.get(key)? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content")?.as_str().map(String::from),
        _ => None,
    }
}

/// The chat template of a tokenizer_config.json: a string, or a list of named templates
/// (the "default" one is used).
fn config_template(config: &serde_json::Value) -> Option<String> {
    match config.get("chat_template")? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Array(list) => list
            .iter()
            .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
            .or(list.first())
            .and_then(|t| t.get("template"))
            .and_then(|t| t.as_str())
            .map(String::from),
        _ => None,
    }
}

fn push_unique(ids: &mut Vec<u32>, id: u32) {
    if !ids.contains(&id) {
        ids.push(id);
    }
}

/// `tokenizers::Tokenizer::from_file`, made safe for hostile files: the JSON is checked for
/// syntax first (with the error's line and column), and a panic inside the `tokenizers` crate
/// (its decoder deserializer unwraps on some malformed sections) becomes an error.
fn load_tokenizer_json(path: &Path) -> Result<tokenizers::Tokenizer> {
    let load = |what: String| Error::Load { path: path.to_path_buf(), what };
    let text = std::fs::read_to_string(path).map_err(|e| load(e.to_string()))?;
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| load(format!("invalid JSON: {e}")))?;
    check_bpe_merges(&json).map_err(load)?;
    match std::panic::catch_unwind(|| text.parse::<tokenizers::Tokenizer>()) {
        Ok(r) => r.map_err(|e| load(e.to_string())),
        Err(_) => Err(load("not a valid tokenizer.json (the tokenizers crate rejected a section)".into())),
    }
}

/// A BPE model's merges must join tokens of the vocabulary into a token of the vocabulary:
/// the `tokenizers` crate indexes out of bounds (a panic) on a merge whose result is
/// longer than every token.
fn check_bpe_merges(json: &serde_json::Value) -> std::result::Result<(), String> {
    let model = &json["model"];
    let (Some(vocab), Some(merges)) = (model["vocab"].as_object(), model["merges"].as_array()) else {
        return Ok(());
    };
    let prefix = model["continuing_subword_prefix"].as_str().unwrap_or("");
    for (i, m) in merges.iter().enumerate() {
        let (a, b) = match m {
            serde_json::Value::String(s) => match s.split_once(' ') {
                Some(p) => p,
                None => return Err(format!("merge {i} ({s:?}) is not two tokens")),
            },
            serde_json::Value::Array(p) if p.len() == 2 => match (p[0].as_str(), p[1].as_str()) {
                (Some(a), Some(b)) => (a, b),
                _ => return Err(format!("merge {i} is not two strings")),
            },
            _ => return Err(format!("merge {i} is not two tokens")),
        };
        let joined = format!("{a}{}", b.strip_prefix(prefix).unwrap_or(b));
        if !vocab.contains_key(&joined) {
            return Err(format!("merge {i} ({a:?} {b:?}) makes {joined:?}, which is not in the vocabulary"));
        }
    }
    Ok(())
}

impl Tokenizer {
    /// Load an HF `tokenizer.json`. Files beside it are used when present:
    /// `tokenizer_config.json` (bos/eos tokens, `add_bos_token`, `chat_template`),
    /// `special_tokens_map.json` (bos/eos when the config lacks them), `chat_template.jinja`
    /// (takes precedence over the config's template) and `generation_config.json`
    /// (`eos_token_id`, one id or a list, joins [`Tokenizer::eos_token_ids`]).
    pub fn from_file(tokenizer_json: &Path) -> Result<Self> {
        let inner = load_tokenizer_json(tokenizer_json)?;
        let dir = tokenizer_json.parent().unwrap_or(Path::new("."));
        let config =
            read_json(&dir.join("tokenizer_config.json"))?.unwrap_or(serde_json::Value::Null);
        let special_map =
            read_json(&dir.join("special_tokens_map.json"))?.unwrap_or(serde_json::Value::Null);
        let token =
            |key: &str| config_token(&config, key).or_else(|| config_token(&special_map, key));
        let lookup = |s: Option<String>| s.and_then(|s| inner.token_to_id(&s).map(|id| (id, s)));
        let bos = lookup(token("bos_token"));
        let eos = lookup(token("eos_token"));
        // Without `add_bos_token`, the BOS is added when the tokenizer's own post-processor adds
        // it (Llama 3's tokenizer.json does).
        let add_bos = match config.get("add_bos_token").and_then(|v| v.as_bool()) {
            Some(b) => b,
            None => match &bos {
                Some((id, _)) => inner
                    .encode("", true)
                    .map(|e| e.get_ids().first() == Some(id))
                    .unwrap_or(false),
                None => false,
            },
        };
        let mut template_src = config_template(&config);
        match std::fs::read_to_string(dir.join("chat_template.jinja")) {
            Ok(s) => template_src = Some(s),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(Error::Load {
                    path: dir.join("chat_template.jinja"),
                    what: e.to_string(),
                })
            }
        }
        let template = match template_src {
            Some(src) => Some(ChatTemplate::new(
                &src,
                bos.as_ref().map(|b| b.1.as_str()),
                eos.as_ref().map(|e| e.1.as_str()),
            )?),
            None => None,
        };
        // Byte-level BPE when the decoder maps GPT-2's characters back to bytes.
        let byte_level = inner
            .get_decoder()
            .and_then(|d| serde_json::to_string(d).ok())
            .is_some_and(|s| s.contains("\"ByteLevel\""));
        let vocab_size = inner.get_vocab_size(true);
        let mut eos_ids: Vec<u32> = eos.iter().map(|e| e.0).collect();
        if let Some(gen) = read_json(&dir.join("generation_config.json"))? {
            let ids: Vec<u64> = match gen.get("eos_token_id") {
                Some(serde_json::Value::Number(n)) => n.as_u64().into_iter().collect(),
                Some(serde_json::Value::Array(a)) => a.iter().filter_map(|v| v.as_u64()).collect(),
                _ => Vec::new(),
            };
            for id in ids.into_iter().filter(|&i| i < vocab_size as u64) {
                push_unique(&mut eos_ids, id as u32);
            }
        }
        push_eot_names(&inner, &mut eos_ids);
        Ok(Self {
            inner: Arc::new(inner),
            meta: Arc::new(Meta {
                vocab_size,
                bos,
                eos,
                eos_ids,
                add_bos,
                byte_level,
                spm: None,
            }),
            template: template.map(Arc::new),
        })
    }

    /// Build the tokenizer from GGUF `tokenizer.ggml.*` metadata: `gpt2` (byte-level BPE with
    /// the pre-tokenizer named by `tokenizer.ggml.pre`) or `llama` (SentencePiece BPE with
    /// byte fallback, from `scores` and `token_type`). Special tokens: `bos/eos/eot/eom_token_id`;
    /// the chat template: `tokenizer.chat_template`.
    pub fn from_gguf(g: &sapient_tensor::GgufFile) -> Result<Self> {
        let built = gguf::build(g)?;
        let tok = |id: Option<u32>| id.and_then(|i| built.tokenizer.id_to_token(i).map(|s| (i, s)));
        let bos = tok(built.bos);
        let eos = tok(built.eos);
        let template = match g.get("tokenizer.chat_template") {
            Some(v) => {
                let src = v.as_str().ok_or_else(|| Error::Metadata {
                    path: g.path().to_path_buf(),
                    what: "tokenizer.chat_template is not a string".into(),
                })?;
                Some(ChatTemplate::new(
                    src,
                    bos.as_ref().map(|b| b.1.as_str()),
                    eos.as_ref().map(|e| e.1.as_str()),
                )?)
            }
            None => None,
        };
        let mut eos_ids: Vec<u32> = eos.iter().map(|e| e.0).collect();
        let n = built.tokenizer.get_vocab_size(true);
        for key in ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
            if let Some(id) = g.get(key).and_then(|v| v.as_int()) {
                if id >= 0 && (id as usize) < n {
                    push_unique(&mut eos_ids, id as u32);
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
                byte_level: built.byte_level,
                spm: built.spm,
                vocab_size: n,
            }),
            template: template.map(Arc::new),
        })
    }

    /// Encode text. Special tokens written in the text (`<|im_start|>`) become their ids.
    /// With `add_special_tokens`, the BOS token is prepended when the model asks for it
    /// ([`Tokenizer::add_bos`]).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let mut ids = Vec::new();
        if add_special_tokens && self.meta.add_bos {
            if let Some((bos, _)) = &self.meta.bos {
                ids.push(*bos);
            }
        }
        match &self.meta.spm {
            Some(spm) => spm.encode(text, &mut ids),
            None => ids.extend_from_slice(self.inner.encode_fast(text, false).map_err(tk_err)?.get_ids()),
        }
        Ok(ids)
    }

    /// Decode ids to text; ids outside the vocabulary are an error.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.check_ids(ids)?;
        self.inner.decode(ids, skip_special_tokens).map_err(tk_err)
    }

    pub(crate) fn check_ids(&self, ids: &[u32]) -> Result<()> {
        let vocab_size = self.vocab_size();
        match ids.iter().find(|&&i| i as usize >= vocab_size) {
            Some(&id) => Err(Error::UnknownId { id, vocab_size }),
            None => Ok(()),
        }
    }

    /// Number of ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.meta.vocab_size
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
    /// Tokens that end a generation: the EOS token, GGUF `eot`/`eom` tokens,
    /// generation_config.json's `eos_token_id`s and the end-of-turn special tokens the
    /// vocabulary has (`<|im_end|>`, `<|eot_id|>`, `<|endoftext|>`, ...). The EOS token first.
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.meta.eos_ids
    }
    /// Whether encoding with special tokens prepends BOS (GGUF `tokenizer.ggml.add_bos_token`).
    pub fn add_bos(&self) -> bool {
        self.meta.add_bos
    }
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.template.as_deref()
    }
    /// Replace the model's chat template with `source` (Jinja, as HF templates are), with
    /// this tokenizer's BOS and EOS tokens; an error names what does not parse.
    pub fn set_chat_template(&mut self, source: &str) -> Result<()> {
        let t = ChatTemplate::new(source, self.bos_token(), self.eos_token())?;
        self.template = Some(Arc::new(t));
        Ok(())
    }
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// The bytes each token id stands for, indexed by id: byte-level tokens mapped back to raw
    /// bytes, SentencePiece `▁` to a space and `<0xNN>` byte tokens to their byte. Added and
    /// special tokens give their text; ids with no token (holes in a vocabulary) are empty.
    /// A token's bytes need not be valid UTF-8 on their own.
    pub fn token_bytes(&self) -> Vec<Vec<u8>> {
        let n = self.vocab_size();
        let table = stream::unicode_to_byte();
        let added = self.inner.get_added_tokens_decoder();
        (0..n as u32)
            .map(|id| {
                if let Some(t) = added.get(&id) {
                    return t.content.clone().into_bytes();
                }
                let Some(s) = self.inner.id_to_token(id) else {
                    return Vec::new();
                };
                if self.meta.byte_level {
                    let mapped: Option<Vec<u8>> =
                        s.chars().map(|c| table.get(&c).copied()).collect();
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
            if specials.contains(&id) {
                push_unique(ids, id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sapient_tensor::{GgufWriter, Value};

    /// A tiny SentencePiece vocabulary: control tokens, bytes and a few pieces with scores.
    fn spm_gguf() -> sapient_tensor::GgufFile {
        let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
        let mut types = vec![2, 3, 3];
        for b in 0..=255u8 {
            tokens.push(format!("<0x{b:02X}>"));
            types.push(6);
        }
        let pieces = [
            "▁", "h", "e", "l", "o", "w", "r", "d", "▁h", "ll", "▁he", "llo", "▁hello", "▁w", "or",
            "▁wor", "ld", "▁world", "<tag>",
        ];
        let mut scores = vec![0.0f32; tokens.len()];
        for (i, p) in pieces.iter().enumerate() {
            tokens.push(p.to_string());
            types.push(if *p == "<tag>" { 4 } else { 1 });
            scores.push(-(i as f32));
        }
        let mut w = GgufWriter::new();
        w.set("tokenizer.ggml.model", Value::String("llama".into()))
            .set("tokenizer.ggml.tokens", Value::string_array(&tokens))
            .set("tokenizer.ggml.scores", Value::f32_array(scores))
            .set("tokenizer.ggml.token_type", Value::i32_array(types))
            .set("tokenizer.ggml.bos_token_id", Value::U32(1))
            .set("tokenizer.ggml.eos_token_id", Value::U32(2));
        sapient_tensor::GgufFile::from_bytes("spm.gguf", w.to_bytes()).expect("valid GGUF")
    }

    #[test]
    fn sentencepiece_from_gguf() -> Result<()> {
        let tok = Tokenizer::from_gguf(&spm_gguf())?;
        let id = |s: &str| tok.token_to_id(s).expect(s);
        // Space prefix, ▁ for spaces, merges by score.
        assert_eq!(
            tok.encode("hello world", false)?,
            vec![id("▁hello"), id("▁world")]
        );
        // A character outside the vocabulary falls back to its UTF-8 bytes.
        let ids = tok.encode("hello é", false)?;
        assert_eq!(ids, vec![id("▁hello"), id("▁"), id("<0xC3>"), id("<0xA9>")]);
        assert_eq!(tok.decode(&ids, false)?, "hello é");
        // BOS by default for SentencePiece models; specials and user-defined tokens in text.
        assert!(tok.add_bos());
        assert_eq!(tok.encode("<s>hello", true)?, vec![1, 1, id("▁hello")]);
        assert_eq!(
            tok.encode("hello<tag>", false)?,
            vec![id("▁hello"), id("<tag>")]
        );
        assert_eq!(tok.decode(&[1, id("▁hello"), 2], true)?, "hello");
        assert_eq!(tok.eos_token_ids(), &[2]);
        // Token bytes: bytes for byte tokens, spaces for ▁.
        let tb = tok.token_bytes();
        assert_eq!(tb[id("<0xC3>") as usize], vec![0xC3]);
        assert_eq!(tb[id("▁hello") as usize], b" hello".to_vec());
        // Streaming: the two bytes of é come out together, and the chunks add up.
        let mut s = TokenStream::new(tok.clone(), false);
        let chunks: Vec<Option<String>> = ids.iter().map(|&i| s.push(i)).collect::<Result<_>>()?;
        assert_eq!(
            chunks,
            vec![
                Some("hello".into()),
                Some(" ".into()),
                None,
                Some("é".into())
            ]
        );
        assert_eq!(s.finish()?, None);
        Ok(())
    }

    #[test]
    fn shareable_across_threads() {
        fn check<T: Clone + Send + Sync + 'static>() {}
        check::<Tokenizer>();
        check::<TokenStream>();
        fn send<T: Send + Sync>() {}
        send::<ChatTemplate>();
        send::<StopMatcher>();
    }

    #[test]
    fn metadata_errors_are_named() {
        let mut w = GgufWriter::new();
        w.set("tokenizer.ggml.model", Value::String("llama".into()))
            .set("tokenizer.ggml.tokens", Value::string_array(["a", "b"]))
            .set("tokenizer.ggml.token_type", Value::i32_array([1]));
        let g = sapient_tensor::GgufFile::from_bytes("x.gguf", w.to_bytes()).unwrap();
        let e = Tokenizer::from_gguf(&g).unwrap_err().to_string();
        assert!(e.contains("1 token types for 2 tokens"), "{e}");

        let mut w = GgufWriter::new();
        w.set("tokenizer.ggml.model", Value::String("llama".into()))
            .set("tokenizer.ggml.tokens", Value::string_array(["a", "b"]))
            .set("tokenizer.ggml.scores", Value::string_array(["x", "y"]));
        let g = sapient_tensor::GgufFile::from_bytes("x.gguf", w.to_bytes()).unwrap();
        let e = Tokenizer::from_gguf(&g).unwrap_err().to_string();
        assert!(e.contains("scores"), "{e}");

        let mut w = GgufWriter::new();
        w.set("tokenizer.ggml.model", Value::String("gpt2".into()))
            .set("tokenizer.ggml.tokens", Value::string_array(["a", "b"]))
            .set("tokenizer.chat_template", Value::String("{% for %}".into()))
            .set("tokenizer.ggml.merges", Value::string_array(["a b", "x y"]));
        let g = sapient_tensor::GgufFile::from_bytes("x.gguf", w.to_bytes()).unwrap();
        let e = Tokenizer::from_gguf(&g).unwrap_err().to_string();
        assert!(e.contains("chat template") && e.contains("line 1"), "{e}");

        // A template set later replaces the model's, in this copy only; a broken one is an
        // error and changes nothing.
        let mut w = GgufWriter::new();
        w.set("tokenizer.ggml.model", Value::String("gpt2".into()))
            .set("tokenizer.ggml.tokens", Value::string_array(["a", "b", "ab"]))
            .set("tokenizer.ggml.merges", Value::string_array(["a b"]));
        let g = sapient_tensor::GgufFile::from_bytes("x.gguf", w.to_bytes()).unwrap();
        let mut t = Tokenizer::from_gguf(&g).unwrap();
        let before = t.clone();
        assert!(t.chat_template().is_none());
        t.set_chat_template("{% for m in messages %}[{{ m.role }}] {{ m.content }}{% endfor %}").unwrap();
        let msgs = [Message::user("hi")];
        assert_eq!(t.chat_template().unwrap().render(&msgs, &RenderOptions::default()).unwrap(), "[user] hi");
        assert!(before.chat_template().is_none());
        let e = t.set_chat_template("{% for %}").unwrap_err().to_string();
        assert!(e.contains("chat template"), "{e}");
        assert!(t.chat_template().is_some());

        let mut w = GgufWriter::new();
        w.set("tokenizer.ggml.model", Value::String("gpt2".into()))
            .set(
                "tokenizer.ggml.tokens",
                Value::string_array(["a", "b", "ab"]),
            )
            .set("tokenizer.ggml.merges", Value::string_array(["a b"]))
            .set("tokenizer.ggml.pre", Value::String("no-such-pre".into()));
        let g = sapient_tensor::GgufFile::from_bytes("x.gguf", w.to_bytes()).unwrap();
        let e = Tokenizer::from_gguf(&g).unwrap_err().to_string();
        assert!(e.contains("no-such-pre") && e.contains("x.gguf"), "{e}");

        let mut w = GgufWriter::new();
        w.set("tokenizer.ggml.model", Value::String("gpt2".into()))
            .set(
                "tokenizer.ggml.tokens",
                Value::string_array(["a", "b", "ab"]),
            )
            .set("tokenizer.ggml.merges", Value::string_array(["ab"]));
        let g = sapient_tensor::GgufFile::from_bytes("x.gguf", w.to_bytes()).unwrap();
        let e = Tokenizer::from_gguf(&g).unwrap_err().to_string();
        assert!(e.contains("merge 0"), "{e}");

        let mut w = GgufWriter::new();
        w.set("tokenizer.ggml.model", Value::String("llama".into()))
            .set("tokenizer.ggml.tokens", Value::string_array(["a", "b"]))
            .set("tokenizer.ggml.eos_token_id", Value::U32(7));
        let g = sapient_tensor::GgufFile::from_bytes("x.gguf", w.to_bytes()).unwrap();
        let e = Tokenizer::from_gguf(&g).unwrap_err().to_string();
        assert!(e.contains("eos token id 7"), "{e}");

        let mut w = GgufWriter::new();
        w.set("tokenizer.ggml.model", Value::String("llama".into()));
        let g = sapient_tensor::GgufFile::from_bytes("x.gguf", w.to_bytes()).unwrap();
        let e = Tokenizer::from_gguf(&g).unwrap_err().to_string();
        assert!(e.contains("tokenizer.ggml.tokens"), "{e}");
    }

    #[test]
    fn byte_level_gpt2_from_gguf() -> Result<()> {
        // GPT-2 byte-level: "Ġ" is the space byte.
        let mut w = GgufWriter::new();
        let mut tokens: Vec<String> = stream::unicode_to_byte()
            .keys()
            .map(|c| c.to_string())
            .collect();
        tokens.sort();
        tokens.extend(["Ġh", "Ġhi", "<|end|>"].map(String::from));
        let n = tokens.len();
        let mut types = vec![1i32; n];
        types[n - 1] = 3;
        w.set("tokenizer.ggml.model", Value::String("gpt2".into()))
            .set("tokenizer.ggml.pre", Value::String("qwen2".into()))
            .set("tokenizer.ggml.tokens", Value::string_array(&tokens))
            .set("tokenizer.ggml.token_type", Value::i32_array(types))
            .set(
                "tokenizer.ggml.merges",
                Value::string_array(["Ġ h", "Ġh i"]),
            )
            .set("tokenizer.ggml.eos_token_id", Value::U32(n as u32 - 1));
        let g = sapient_tensor::GgufFile::from_bytes("b.gguf", w.to_bytes()).unwrap();
        let tok = Tokenizer::from_gguf(&g)?;
        let hi = tok.token_to_id("Ġhi").unwrap();
        let ids = tok.encode(" hi 12<|end|>", false)?;
        let one = tok.token_to_id("1").unwrap();
        let two = tok.token_to_id("2").unwrap();
        let sp = tok.token_to_id("Ġ").unwrap();
        assert_eq!(ids, vec![hi, sp, one, two, n as u32 - 1]);
        assert_eq!(tok.decode(&ids, true)?, " hi 12");
        assert!(!tok.add_bos());
        assert_eq!(tok.token_bytes()[hi as usize], b" hi");
        assert!(matches!(
            tok.decode(&[n as u32], false),
            Err(Error::UnknownId { .. })
        ));
        Ok(())
    }
}

/// The README's example, compiled as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctest;
