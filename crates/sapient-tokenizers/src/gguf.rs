//! Build a `tokenizers::Tokenizer` from GGUF `tokenizer.ggml.*` metadata, the way llama.cpp
//! reads it and the way the original HF `tokenizer.json` is defined:
//! - `gpt2`: byte-level BPE with the pre-tokenizer regexes chosen by `tokenizer.ggml.pre`;
//! - `llama`: SentencePiece BPE (merge the adjacent pair whose concatenation has the highest
//!   score, as llama.cpp does and as HF's converted Llama tokenizers do), `▁` for spaces,
//!   a space prefix, and `<0xNN>` byte fallback;
//! - `bert`: WordPiece (BERT's lower-casing normaliser and pre-tokenizer, `[CLS] .. [SEP]`
//!   added around a sequence). llama.cpp's converter writes a word-initial piece `hello` as
//!   `▁hello` and a continuation `##lo` as `lo`; the HF spelling is restored here.

use crate::{Error, Result};
use sapient_tensor::GgufFile;
use std::collections::HashMap;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::{Prepend, Replace};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{
    AddedToken, DecoderWrapper, NormalizerWrapper, PreTokenizerWrapper, SplitDelimiterBehavior,
};

pub(crate) struct Built {
    pub tokenizer: tokenizers::Tokenizer,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub add_bos: bool,
    pub byte_level: bool,
    /// llama.cpp's own SentencePiece encoder (`llama` models), which `encode` uses.
    pub spm: Option<crate::spm::SpmEncoder>,
}

/// GGUF token types (llama.cpp `llama_token_type`).
const TYPE_CONTROL: i128 = 3;
const TYPE_USER_DEFINED: i128 = 4;

// Pre-tokenizer regexes, as llama.cpp applies them (each one splits the pieces the previous
// ones left; what a regex does not match stays a piece of its own). The `(?i:...)`
// contractions of the original tokenizer.json files are spelled out the way llama.cpp does.
const CONTRACTIONS: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])";
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";

fn llama3() -> String {
    format!(
        r"{CONTRACTIONS}|[^\r\n\p{{L}}\p{{N}}]?\p{{L}}+|\p{{N}}{{1,3}}| ?[^\s\p{{L}}\p{{N}}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    )
}
fn qwen2() -> String {
    format!(
        r"{CONTRACTIONS}|[^\r\n\p{{L}}\p{{N}}]?\p{{L}}+|\p{{N}}| ?[^\s\p{{L}}\p{{N}}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    )
}
fn qwen35() -> String {
    format!(
        r"{CONTRACTIONS}|[^\r\n\p{{L}}\p{{N}}]?[\p{{L}}\p{{M}}]+|\p{{N}}| ?[^\s\p{{L}}\p{{M}}\p{{N}}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    )
}
fn gpt4o() -> String {
    format!(
        r"[^\r\n\p{{L}}\p{{N}}]?[\p{{Lu}}\p{{Lt}}\p{{Lm}}\p{{Lo}}\p{{M}}]*[\p{{Ll}}\p{{Lm}}\p{{Lo}}\p{{M}}]+{CONTRACTIONS}?|[^\r\n\p{{L}}\p{{N}}]?[\p{{Lu}}\p{{Lt}}\p{{Lm}}\p{{Lo}}\p{{M}}]+[\p{{Ll}}\p{{Lm}}\p{{Lo}}\p{{M}}]*{CONTRACTIONS}?|\p{{N}}{{1,3}}| ?[^\s\p{{L}}\p{{N}}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    )
}
const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
// Character classes copied from llama.cpp as escapes (the literal characters would be
// changed by Unicode normalization in editors).
const DEEPSEEK_LLM_LETTERS: &str = "\\s?[A-Za-z\u{b5}\u{c0}-\u{d6}\u{d8}-\u{f6}\u{f8}-\u{1ba}\u{1bc}-\u{1bf}\u{1c4}-\u{293}\u{295}-\u{2af}\u{370}-\u{373}\u{376}\u{377}\u{37b}-\u{37d}\u{37f}\u{386}\u{388}-\u{38a}\u{38c}\u{38e}-\u{3a1}\u{3a3}-\u{3f5}\u{3f7}-\u{481}\u{48a}-\u{52f}\u{531}-\u{556}\u{10a0}-\u{10c5}\u{13a0}-\u{13f5}\u{13f8}-\u{13fd}\u{1c90}-\u{1cba}\u{1cbd}-\u{1cbf}\u{1d00}-\u{1d2b}\u{1d6b}-\u{1d77}\u{1d79}-\u{1d9a}\u{1e00}-\u{1f15}\u{1f18}-\u{1f1d}\u{1f20}-\u{1f45}\u{1f48}-\u{1f4d}\u{1f50}-\u{1f57}\u{1f59}\u{1f5b}\u{1f5d}\u{1f5f}-\u{1f7d}\u{1f80}-\u{1fb4}\u{1fb6}-\u{1fbc}\u{1fbe}\u{1fc2}-\u{1fc4}\u{1fc6}-\u{1fcc}\u{1fd0}-\u{1fd3}\u{1fd6}-\u{1fdb}\u{1fe0}-\u{1fec}\u{1ff2}-\u{1ff4}\u{1ff6}-\u{1ffc}\u{2102}\u{2107}\u{210a}-\u{2113}\u{2115}\u{2119}-\u{211d}\u{2124}\u{2126}\u{2128}\u{212a}-\u{212d}\u{212f}-\u{2134}\u{2139}\u{213c}-\u{213f}\u{2145}-\u{2149}\u{214e}\u{2183}\u{2184}\u{2c00}-\u{2c7b}\u{2c7e}-\u{2ce4}\u{2ceb}-\u{2cee}\u{2cf2}\u{2cf3}\u{a640}-\u{a66d}\u{a680}-\u{a69b}\u{a722}-\u{a76f}\u{a771}-\u{a787}\u{a78b}-\u{a78e}\u{ab70}-\u{abbf}\u{fb00}-\u{fb06}\u{fb13}-\u{fb17}\u{ff21}-\u{ff3a}\u{ff41}-\u{ff5a}\u{10400}-\u{1044f}\u{104b0}-\u{104d3}\u{104d8}-\u{104fb}\u{10c80}-\u{10cb2}\u{10cc0}-\u{10cf2}\u{118a0}-\u{118df}\u{1e900}-\u{1e943}]+";
const DEEPSEEK_PUNCT: &str =
    "\\s?[!-/:-~\u{ff01}-\u{ff0f}\u{ff1a}-\u{ff5e}\u{2018}-\u{201f}\u{3000}-\u{3002}]+";
const CJK_HANGUL: &str = "[\u{4e00}-\u{9fa5}\u{800}-\u{4e00}\u{ac00}-\u{d7ff}]+";
const CJK_KANA: &str = "[\u{4e00}-\u{9fa5}\u{3040}-\u{309f}\u{30a0}-\u{30ff}]+";
const PORO: &str = " ?[^(\\s|.,!?\u{2026}\u{3002}\u{ff0c}\u{3001}\u{964}\u{6d4}\u{60c})]+";

/// How a `gpt2` GGUF tokenizer splits text before BPE, by `tokenizer.ggml.pre`.
struct PreTokenizerSpec {
    regexes: Vec<String>,
    /// A pre-token that is itself in the vocabulary is taken whole (HF `ignore_merges`).
    ignore_merges: bool,
    /// llama.cpp's default for `add_bos_token` when the metadata does not say.
    add_bos: bool,
}

fn pre_tokenizer_spec(pre: &str) -> Option<PreTokenizerSpec> {
    let s = |v: &[&str]| v.iter().map(|r| r.to_string()).collect::<Vec<_>>();
    let (regexes, ignore_merges, add_bos) = match pre {
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2" => {
            (vec![llama3()], true, true)
        }
        "dbrx" | "smaug-bpe" | "chatglm-bpe" => (vec![llama3()], false, false),
        "glm4" | "glm5" => (vec![llama3()], true, false),
        "deepseek-llm" => (
            s(&["[\r\n]", DEEPSEEK_LLM_LETTERS, DEEPSEEK_PUNCT, "\\s+$", CJK_HANGUL, "\\p{N}+"]),
            false,
            false,
        ),
        "deepseek-coder" => (s(&["[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", CJK_HANGUL, "\\p{N}"]), false, false),
        "deepseek-v3" => (
            s(&[
                "\\p{N}{1,3}",
                CJK_KANA,
                "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
            ]),
            false,
            false,
        ),
        "falcon" => (s(&["[\\p{P}\\$\\+<=>\\^~\\|`]+", GPT2, "[0-9][0-9][0-9]"]), false, false),
        "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone" | "minerva-7b" | "mellum2" => {
            (s(&["\\p{N}", GPT2]), false, false)
        }
        "gpt-2" | "gpt2" | "phi-2" | "mpt" | "olmo" | "jais" | "jina-es" | "jina-de" | "jina-v2-es" | "jina-v2-de"
        | "gigachat" | "a.x-4.0" | "mellum" | "modern-bert" | "exaone4" | "trillion" | "granite-docling" => {
            (s(&[GPT2]), false, false)
        }
        "qwen2" | "deepseek-r1-qwen" | "stablelm2" | "megrez" | "hunyuan" | "solar-open" | "kormo" => {
            (vec![qwen2()], false, false)
        }
        "qwen35" => (vec![qwen35()], false, false),
        "poro-chat" | "bloom" | "gpt3-finnish" => (s(&[PORO]), false, false),
        "viking" => (s(&[PORO, "\\p{N}"]), false, false),
        "tekken" => (s(&[TEKKEN]), true, true),
        "gpt-4o" | "llama4" | "minimax-m2" => (vec![gpt4o()], false, false),
        // llama.cpp's default: what an old converter wrote when it did not know the model.
        "default" | "" => (
            s(&["[\\p{P}\\$\\+<=>\\^~\\|]+", GPT2, "\\p{N}+", "[0-9][0-9][0-9]"]),
            false,
            false,
        ),
        _ => return None,
    };
    Some(PreTokenizerSpec {
        regexes,
        ignore_merges,
        add_bos,
    })
}

fn meta_err(g: &GgufFile, what: impl Into<String>) -> Error {
    Error::Metadata {
        path: g.path().to_path_buf(),
        what: what.into(),
    }
}

fn opt_id(g: &GgufFile, key: &str) -> Option<u32> {
    g.get(key)
        .and_then(|v| v.as_int())
        .and_then(|i| u32::try_from(i).ok())
}

fn opt_bool(g: &GgufFile, key: &str) -> Option<bool> {
    let v = g.get(key)?;
    if let Some(i) = v.as_int() {
        return Some(i != 0);
    }
    v.as_str().map(|s| s == "true")
}

fn split(g: &GgufFile, pattern: &str) -> Result<PreTokenizerWrapper> {
    Split::new(
        SplitPattern::Regex(pattern.to_string()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map(PreTokenizerWrapper::Split)
    .map_err(|e| meta_err(g, format!("pre-tokenizer regex {pattern:?}: {e}")))
}

/// Token string → id (the first id when a string repeats).
fn vocab_map(g: &GgufFile, tokens: &[&str]) -> HashMap<String, u32> {
    let mut vocab = HashMap::with_capacity(tokens.len());
    let mut dups = 0usize;
    for (i, t) in tokens.iter().enumerate() {
        if vocab.contains_key(*t) {
            dups += 1;
        } else {
            vocab.insert(t.to_string(), i as u32);
        }
    }
    if dups > 0 {
        tracing::warn!(file = %g.path().display(), "{dups} duplicate token strings in the vocabulary; the first id of each is used");
    }
    vocab
}

fn build_gpt2(g: &GgufFile, tokens: &[&str]) -> Result<(tokenizers::Tokenizer, bool)> {
    let merges = g.get_str_array("tokenizer.ggml.merges")?;
    let vocab = vocab_map(g, tokens);
    let mut pairs = Vec::with_capacity(merges.len());
    let mut dropped = 0usize;
    for (i, m) in merges.iter().enumerate() {
        // llama.cpp splits at the first space after the first byte.
        let pos = m
            .char_indices()
            .skip(1)
            .find(|&(_, c)| c == ' ')
            .map(|(p, _)| p)
            .ok_or_else(|| meta_err(g, format!("merge {i} ({m:?}) is not two tokens")))?;
        let (a, b) = (&m[..pos], &m[pos + 1..]);
        if vocab.contains_key(a) && vocab.contains_key(b) && vocab.contains_key(&format!("{a}{b}"))
        {
            pairs.push((a.to_string(), b.to_string()));
        } else {
            dropped += 1;
        }
    }
    if dropped > 0 {
        tracing::warn!(file = %g.path().display(), "{dropped} merges name tokens outside the vocabulary; ignored");
    }
    let pre = g
        .get("tokenizer.ggml.pre")
        .and_then(|v| v.as_str())
        .unwrap_or("default");
    let spec = pre_tokenizer_spec(pre).ok_or_else(|| Error::UnsupportedPreTokenizer {
        path: g.path().to_path_buf(),
        pre: pre.to_string(),
    })?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab.into_iter().collect::<Vocab>(), pairs)
        .ignore_merges(spec.ignore_merges)
        .build()
        .map_err(|e| meta_err(g, format!("BPE: {e}")))?;
    let mut t = tokenizers::Tokenizer::new(bpe);
    let mut steps = Vec::with_capacity(spec.regexes.len() + 1);
    for r in &spec.regexes {
        steps.push(split(g, r)?);
    }
    // Bytes to GPT-2's printable characters, no further splitting.
    steps.push(PreTokenizerWrapper::ByteLevel(ByteLevel::new(
        false, false, false,
    )));
    t.with_pre_tokenizer(Some(PreTokenizerWrapper::Sequence(Sequence::new(steps))));
    t.with_decoder(Some(DecoderWrapper::ByteLevel(ByteLevelDecoder::default())));
    Ok((t, spec.add_bos))
}

/// SentencePiece BPE merges from the scores: every split of a token into two tokens is a
/// merge, ranked by the score of the merged token (highest first), the way HF converts
/// Llama's `tokenizer.model` and the way llama.cpp's SPM tokenizer picks pairs.
pub(crate) fn spm_merges(
    tokens: &[&str],
    scores: &[f32],
    vocab: &HashMap<String, u32>,
) -> Vec<(String, String)> {
    let mut merges: Vec<(f32, u32, u32, u32)> = Vec::new();
    for (id, tok) in tokens.iter().enumerate() {
        if vocab.get(*tok) != Some(&(id as u32)) {
            continue;
        }
        let mut local = Vec::new();
        for (pos, _) in tok.char_indices().skip(1) {
            if let (Some(&l), Some(&r)) = (vocab.get(&tok[..pos]), vocab.get(&tok[pos..])) {
                local.push((scores[id], id as u32, l, r));
            }
        }
        local.sort_by_key(|&(_, _, l, r)| (l, r));
        merges.extend(local);
    }
    // Stable: equal scores keep vocabulary order.
    merges.sort_by(|a, b| b.0.total_cmp(&a.0));
    merges
        .into_iter()
        .map(|(_, _, l, r)| {
            (
                tokens[l as usize].to_string(),
                tokens[r as usize].to_string(),
            )
        })
        .collect()
}

fn spm_scores(g: &GgufFile, tokens: &[&str]) -> Result<Vec<f32>> {
    let scores: Vec<f32> = match g.get("tokenizer.ggml.scores") {
        Some(_) => g
            .get_array("tokenizer.ggml.scores")?
            .iter()
            .map(|v| v.as_f64().map(|f| f as f32))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| meta_err(g, "tokenizer.ggml.scores holds non-numbers"))?,
        None => (0..tokens.len()).map(|i| -(i as f32)).collect(),
    };
    if scores.len() != tokens.len() {
        return Err(meta_err(
            g,
            format!("{} scores for {} tokens", scores.len(), tokens.len()),
        ));
    }
    Ok(scores)
}

fn build_spm(g: &GgufFile, tokens: &[&str], scores: &[f32]) -> Result<tokenizers::Tokenizer> {
    let vocab = vocab_map(g, tokens);
    let merges = spm_merges(tokens, scores, &vocab);
    let unk = opt_id(g, "tokenizer.ggml.unknown_token_id")
        .and_then(|u| tokens.get(u as usize))
        .or_else(|| tokens.iter().find(|t| **t == "<unk>"))
        .map(|s| s.to_string());
    let mut builder = BPE::builder()
        .vocab_and_merges(vocab.into_iter().collect::<Vocab>(), merges)
        .byte_fallback(true)
        .fuse_unk(true);
    if let Some(unk) = unk {
        builder = builder.unk_token(unk);
    }
    let bpe = builder
        .build()
        .map_err(|e| meta_err(g, format!("SentencePiece BPE: {e}")))?;
    let mut t = tokenizers::Tokenizer::new(bpe);
    let add_space = opt_bool(g, "tokenizer.ggml.add_space_prefix").unwrap_or(true);
    let mut norms = Vec::new();
    if add_space {
        norms.push(NormalizerWrapper::Prepend(Prepend::new("\u{2581}".into())));
    }
    norms.push(NormalizerWrapper::Replace(
        Replace::new(" ", "\u{2581}").map_err(|e| meta_err(g, e.to_string()))?,
    ));
    t.with_normalizer(Some(NormalizerWrapper::Sequence(
        tokenizers::normalizers::Sequence::new(norms),
    )))
    .map_err(|e| meta_err(g, e.to_string()))?;
    let mut decs = vec![
        DecoderWrapper::Replace(
            Replace::new("\u{2581}", " ").map_err(|e| meta_err(g, e.to_string()))?,
        ),
        DecoderWrapper::ByteFallback(ByteFallback::new()),
        DecoderWrapper::Fuse(Fuse::new()),
    ];
    if add_space {
        decs.push(DecoderWrapper::Strip(Strip::new(' ', 1, 0)));
    }
    t.with_decoder(Some(DecoderWrapper::Sequence(DecoderSequence::new(decs))));
    Ok(t)
}

/// BERT's WordPiece from llama.cpp's spelling of the vocabulary (see the module comment).
fn build_wpm(
    g: &GgufFile,
    tokens: &[&str],
    cls: Option<u32>,
    sep: Option<u32>,
) -> Result<tokenizers::Tokenizer> {
    use tokenizers::models::wordpiece::WordPiece;
    let mut vocab: Vocab = Vocab::default();
    for (i, t) in tokens.iter().enumerate() {
        let hf = if t.starts_with('[') && t.ends_with(']') {
            t.to_string()
        } else if let Some(word) = t.strip_prefix('\u{2581}') {
            word.to_string()
        } else {
            format!("##{t}")
        };
        vocab.entry(hf).or_insert(i as u32);
    }
    let unk = if vocab.contains_key("[UNK]") {
        "[UNK]".to_string()
    } else {
        let id = opt_id(g, "tokenizer.ggml.unknown_token_id")
            .ok_or_else(|| meta_err(g, "bert vocabulary without [UNK] or unknown_token_id"))?;
        tokens
            .get(id as usize)
            .ok_or_else(|| meta_err(g, format!("unknown_token_id {id} is outside the vocabulary")))?
            .to_string()
    };
    let wp = WordPiece::builder()
        .vocab(vocab)
        .unk_token(unk)
        .continuing_subword_prefix("##".into())
        .max_input_chars_per_word(100)
        .build()
        .map_err(|e| meta_err(g, format!("WordPiece: {e}")))?;
    let mut t = tokenizers::Tokenizer::new(wp);
    t.with_normalizer(Some(NormalizerWrapper::BertNormalizer(
        tokenizers::normalizers::bert::BertNormalizer::new(true, true, None, true),
    )))
    .map_err(|e| meta_err(g, e.to_string()))?;
    t.with_pre_tokenizer(Some(PreTokenizerWrapper::BertPreTokenizer(
        tokenizers::pre_tokenizers::bert::BertPreTokenizer,
    )));
    t.with_decoder(Some(DecoderWrapper::WordPiece(
        tokenizers::decoders::wordpiece::WordPiece::default(),
    )));
    let name = |id: Option<u32>, what: &str| -> Result<(String, u32)> {
        let id = id.ok_or_else(|| meta_err(g, format!("bert vocabulary without a {what} token")))?;
        let s = tokens
            .get(id as usize)
            .ok_or_else(|| meta_err(g, format!("{what} token id {id} is outside the vocabulary")))?;
        Ok((s.to_string(), id))
    };
    t.with_post_processor(Some(tokenizers::processors::bert::BertProcessing::new(
        name(sep, "[SEP]")?,
        name(cls, "[CLS]")?,
    )));
    Ok(t)
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
            .map(|v| v.as_int())
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| meta_err(g, "tokenizer.ggml.token_type holds non-integers"))?,
        None => vec![1; tokens.len()],
    };
    if types.len() != tokens.len() {
        return Err(meta_err(
            g,
            format!("{} token types for {} tokens", types.len(), tokens.len()),
        ));
    }
    let find = |s: &str| tokens.iter().position(|t| *t == s).map(|i| i as u32);
    let mut bos = opt_id(g, "tokenizer.ggml.bos_token_id");
    let mut eos = opt_id(g, "tokenizer.ggml.eos_token_id");
    for (name, id) in [("bos", bos), ("eos", eos)] {
        if let Some(id) = id {
            if id as usize >= tokens.len() {
                return Err(meta_err(
                    g,
                    format!(
                        "{name} token id {id} is outside the vocabulary of {}",
                        tokens.len()
                    ),
                ));
            }
        }
    }
    let mut spm = None;
    let (mut tokenizer, byte_level, default_add_bos) = match model.as_str() {
        "gpt2" => {
            let (t, add_bos) = build_gpt2(g, &tokens)?;
            (t, true, add_bos)
        }
        "llama" => {
            // llama.cpp's defaults for SentencePiece models.
            bos = bos.or_else(|| find("<s>"));
            eos = eos.or_else(|| find("</s>"));
            let scores = spm_scores(g, &tokens)?;
            let unk = opt_id(g, "tokenizer.ggml.unknown_token_id")
                .filter(|&u| (u as usize) < tokens.len())
                .or_else(|| find("<unk>"));
            let name = g.get("general.name").and_then(|v| v.as_str()).unwrap_or("");
            let add_space = opt_bool(g, "tokenizer.ggml.add_space_prefix").unwrap_or(true);
            spm = Some(crate::spm::SpmEncoder::new(&tokens, &scores, &types, unk, add_space, name));
            (build_spm(g, &tokens, &scores)?, false, true)
        }
        "bert" => {
            let cls = opt_id(g, "tokenizer.ggml.cls_token_id").or_else(|| find("[CLS]"));
            let sep = opt_id(g, "tokenizer.ggml.seperator_token_id")
                .or_else(|| opt_id(g, "tokenizer.ggml.separator_token_id"))
                .or_else(|| find("[SEP]"));
            bos = bos.or(cls);
            eos = eos.or(sep);
            (build_wpm(g, &tokens, cls, sep)?, false, true)
        }
        other => {
            return Err(Error::UnsupportedModel {
                path: g.path().to_path_buf(),
                model: other.to_string(),
            });
        }
    };
    // Control tokens are special (skipped by `decode(.., true)`); user-defined ones are
    // matched in text as well but decode as text.
    let mut specials = Vec::new();
    let mut added = Vec::new();
    for (t, &ty) in tokens.iter().zip(&types) {
        match ty {
            TYPE_CONTROL => specials.push(AddedToken::from(t.to_string(), true)),
            TYPE_USER_DEFINED => {
                added.push(AddedToken::from(t.to_string(), false).normalized(false))
            }
            _ => {}
        }
    }
    tokenizer
        .add_special_tokens(specials)
        .map_err(|e| meta_err(g, e.to_string()))?;
    tokenizer
        .add_tokens(added)
        .map_err(|e| meta_err(g, e.to_string()))?;
    let add_bos = opt_bool(g, "tokenizer.ggml.add_bos_token").unwrap_or(default_add_bos);
    Ok(Built {
        tokenizer,
        bos,
        eos,
        add_bos,
        byte_level,
        spm,
    })
}
