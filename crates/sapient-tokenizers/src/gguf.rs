//! Build a `tokenizers::Tokenizer` from GGUF `tokenizer.ggml.*` metadata, the way llama.cpp
//! reads it: `gpt2` = byte-level BPE with a pre-tokenizer chosen by `tokenizer.ggml.pre`,
//! `llama` = SentencePiece with byte fallback.

use crate::{Error, Result};
use sapient_tensor::GgufFile;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::models::unigram::Unigram;
use tokenizers::normalizers::{Prepend, Replace};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, DecoderWrapper, NormalizerWrapper, PreTokenizerWrapper, SplitDelimiterBehavior};

pub(crate) struct Built {
    pub tokenizer: tokenizers::Tokenizer,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub add_bos: bool,
    pub byte_level: bool,
}

/// Llama 3 (`llama-bpe`), also used by several later models: digits in groups of up to 3.
const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2: digits one at a time.
const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

fn meta_err(g: &GgufFile, what: impl Into<String>) -> Error {
    Error::Metadata { path: g.path().to_path_buf(), what: what.into() }
}

fn opt_id(g: &GgufFile, key: &str) -> Option<u32> {
    g.get(key).and_then(|v| v.as_int()).and_then(|i| u32::try_from(i).ok())
}

fn split(pattern: &str) -> Result<PreTokenizerWrapper> {
    Split::new(SplitPattern::Regex(pattern.to_string()), SplitDelimiterBehavior::Isolated, false)
        .map(PreTokenizerWrapper::Split)
        .map_err(|e| Error::Tokenizer(format!("pre-tokenizer regex: {e}")))
}

fn gpt2_pre_tokenizer(g: &GgufFile, pre: &str) -> Result<PreTokenizerWrapper> {
    let byte_level_no_regex = PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, false, false));
    Ok(match pre {
        // SmolLM / StarCoder: every digit alone, then GPT-2 byte-level splitting.
        "smollm" | "starcoder" | "refact" => PreTokenizerWrapper::Sequence(Sequence::new(vec![
            PreTokenizerWrapper::Digits(Digits::new(true)),
            PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, true)),
        ])),
        "qwen2" | "deepseek-r1-qwen" => PreTokenizerWrapper::Sequence(Sequence::new(vec![split(QWEN2)?, byte_level_no_regex])),
        "llama-bpe" | "llama3" | "smaug-bpe" | "dbrx" => {
            PreTokenizerWrapper::Sequence(Sequence::new(vec![split(LLAMA3)?, byte_level_no_regex]))
        }
        "gpt2" | "default" | "" => PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, true)),
        other => {
            tracing::warn!(file = %g.path().display(), "pre-tokenizer '{other}' not known; using GPT-2 splitting");
            PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, true))
        }
    })
}

pub(crate) fn build(g: &GgufFile) -> Result<Built> {
    let model = g.get_str("tokenizer.ggml.model")?.to_string();
    let tokens = g.get_str_array("tokenizer.ggml.tokens")?;
    if tokens.is_empty() {
        return Err(meta_err(g, "tokenizer.ggml.tokens is empty"));
    }
    let types: Vec<i128> = match g.get("tokenizer.ggml.token_type") {
        Some(_) => g
            .get_array("tokenizer.ggml.token_type")?
            .iter()
            .map(|v| v.as_int().unwrap_or(1))
            .collect(),
        None => vec![1; tokens.len()],
    };
    if types.len() != tokens.len() {
        return Err(meta_err(g, format!("{} token types for {} tokens", types.len(), tokens.len())));
    }
    let bos = opt_id(g, "tokenizer.ggml.bos_token_id");
    let eos = opt_id(g, "tokenizer.ggml.eos_token_id");
    for (name, id) in [("bos", bos), ("eos", eos)] {
        if let Some(id) = id {
            if id as usize >= tokens.len() {
                return Err(meta_err(g, format!("{name} token id {id} is outside the vocabulary of {}", tokens.len())));
            }
        }
    }
    let (mut tokenizer, byte_level, default_add_bos) = match model.as_str() {
        "gpt2" => {
            let merges = g.get_str_array("tokenizer.ggml.merges")?;
            let vocab: Vocab = tokens.iter().enumerate().map(|(i, t)| (t.to_string(), i as u32)).collect();
            let mut pairs = Vec::with_capacity(merges.len());
            for (i, m) in merges.iter().enumerate() {
                let (a, b) = m
                    .split_once(' ')
                    .ok_or_else(|| meta_err(g, format!("merge {i} ('{m}') is not two tokens")))?;
                pairs.push((a.to_string(), b.to_string()));
            }
            let bpe = BPE::builder()
                .vocab_and_merges(vocab, pairs)
                .ignore_merges(false)
                .build()
                .map_err(|e| meta_err(g, format!("BPE: {e}")))?;
            let mut t = tokenizers::Tokenizer::new(bpe);
            let pre = g.get("tokenizer.ggml.pre").and_then(|v| v.as_str()).unwrap_or("default");
            t.with_pre_tokenizer(Some(gpt2_pre_tokenizer(g, pre)?));
            t.with_decoder(Some(DecoderWrapper::ByteLevel(ByteLevelDecoder::default())));
            (t, true, false)
        }
        "llama" => {
            let scores: Vec<f64> = match g.get("tokenizer.ggml.scores") {
                Some(_) => g.get_array("tokenizer.ggml.scores")?.iter().map(|v| v.as_f64().unwrap_or(0.0)).collect(),
                None => vec![0.0; tokens.len()],
            };
            let unk = opt_id(g, "tokenizer.ggml.unknown_token_id").map(|u| u as usize).or(Some(0));
            let vocab: Vec<(String, f64)> = tokens.iter().zip(&scores).map(|(t, &s)| (t.to_string(), s)).collect();
            let uni = Unigram::from(vocab, unk, true).map_err(|e| meta_err(g, format!("SentencePiece: {e}")))?;
            let mut t = tokenizers::Tokenizer::new(uni);
            let add_space = g.get("tokenizer.ggml.add_space_prefix").and_then(|v| v.as_int()).unwrap_or(1) != 0;
            let mut norms = Vec::new();
            if add_space {
                norms.push(NormalizerWrapper::Prepend(Prepend::new("\u{2581}".into())));
            }
            norms.push(NormalizerWrapper::Replace(
                Replace::new(" ", "\u{2581}").map_err(|e| Error::Tokenizer(e.to_string()))?,
            ));
            t.with_normalizer(Some(NormalizerWrapper::Sequence(tokenizers::normalizers::Sequence::new(norms))))
                .map_err(|e| Error::Tokenizer(e.to_string()))?;
            let mut decs = vec![
                DecoderWrapper::Replace(Replace::new("\u{2581}", " ").map_err(|e| Error::Tokenizer(e.to_string()))?),
                DecoderWrapper::ByteFallback(ByteFallback::new()),
                DecoderWrapper::Fuse(Fuse::new()),
            ];
            if add_space {
                decs.push(DecoderWrapper::Strip(Strip::new(' ', 1, 0)));
            }
            t.with_decoder(Some(DecoderWrapper::Sequence(DecoderSequence::new(decs))));
            (t, false, true)
        }
        other => {
            return Err(Error::UnsupportedModel { path: g.path().to_path_buf(), model: other.to_string() });
        }
    };
    // Control (3) tokens are special; user-defined (4) ones are matched in text as well.
    let mut specials = Vec::new();
    let mut added = Vec::new();
    for (t, &ty) in tokens.iter().zip(&types) {
        match ty {
            3 => specials.push(AddedToken::from(t.to_string(), true)),
            4 => added.push(AddedToken::from(t.to_string(), false).normalized(false)),
            _ => {}
        }
    }
    tokenizer.add_special_tokens(specials).map_err(|e| Error::Tokenizer(e.to_string()))?;
    tokenizer.add_tokens(added).map_err(|e| Error::Tokenizer(e.to_string()))?;
    let add_bos = g
        .get("tokenizer.ggml.add_bos_token")
        .and_then(|v| v.as_int())
        .map(|v| v != 0)
        .unwrap_or(default_add_bos);
    Ok(Built { tokenizer, bos, eos, add_bos, byte_level })
}
