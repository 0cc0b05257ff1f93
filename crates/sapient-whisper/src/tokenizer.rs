//! Whisper's special tokens on top of a `tokenizer.json`.

use crate::config::WhisperConfig;
use crate::{Error, Result};
use sapient_tokenizers::Tokenizer;
use std::path::Path;

/// Number of timestamp tokens (`<|0.00|>` .. `<|30.00|>`).
pub const N_TIMESTAMPS: usize = 1501;

#[derive(Clone, Debug)]
pub struct WhisperTokenizer {
    inner: Tokenizer,
    pub eot: u32,
    pub sot: u32,
    pub translate: u32,
    pub transcribe: u32,
    pub sot_lm: u32,
    pub sot_prev: u32,
    pub no_speech: u32,
    pub no_timestamps: u32,
    pub timestamp_begin: u32,
    /// Language codes and their tokens, in id order (`en` first), for multilingual models.
    pub languages: Vec<(String, u32)>,
    pub multilingual: bool,
}

impl WhisperTokenizer {
    /// Load `tokenizer.json` and check that it belongs to a model with `config`.
    pub fn from_file(path: &Path, config: &WhisperConfig) -> Result<Self> {
        Self::new(Tokenizer::from_file(path)?, config)
    }

    pub fn new(inner: Tokenizer, config: &WhisperConfig) -> Result<Self> {
        let id = |s: &str| {
            inner
                .token_to_id(s)
                .ok_or_else(|| Error::Mismatch(format!("the tokenizer has no '{s}' token: not a Whisper tokenizer")))
        };
        let eot = id("<|endoftext|>")?;
        let sot = id("<|startoftranscript|>")?;
        let translate = id("<|translate|>")?;
        let transcribe = id("<|transcribe|>")?;
        let sot_lm = id("<|startoflm|>")?;
        let sot_prev = id("<|startofprev|>")?;
        let no_speech = id("<|nospeech|>").or_else(|_| id("<|nocaptions|>"))?;
        let no_timestamps = id("<|notimestamps|>")?;
        let timestamp_begin = no_timestamps + 1;
        let vocab = config.vocab_size;
        if timestamp_begin as usize + N_TIMESTAMPS != vocab {
            return Err(Error::Mismatch(format!(
                "the tokenizer's timestamps start at {timestamp_begin}, so the model should have {} outputs, but it has {vocab} \
                 (English-only and multilingual files mixed up?)",
                timestamp_begin as usize + N_TIMESTAMPS
            )));
        }
        let multilingual = config.is_multilingual();
        let mut languages = Vec::new();
        for i in sot + 1..translate {
            if let Some(tok) = inner.id_to_token(i) {
                if let Some(code) = tok.strip_prefix("<|").and_then(|t| t.strip_suffix("|>")) {
                    languages.push((code.to_string(), i));
                }
            }
        }
        if multilingual && languages.is_empty() {
            return Err(Error::Mismatch("a multilingual model with a tokenizer that has no language tokens".into()));
        }
        if !config.lang_ids.is_empty() && multilingual {
            let ours: Vec<u32> = languages.iter().map(|l| l.1).collect();
            if ours != config.lang_ids {
                return Err(Error::Mismatch(format!(
                    "the config's {} language ids differ from the tokenizer's {} language tokens",
                    config.lang_ids.len(),
                    ours.len()
                )));
            }
        }
        Ok(Self {
            inner,
            eot,
            sot,
            translate,
            transcribe,
            sot_lm,
            sot_prev,
            no_speech,
            no_timestamps,
            timestamp_begin,
            languages,
            multilingual,
        })
    }

    pub fn inner(&self) -> &Tokenizer {
        &self.inner
    }

    /// Plain text tokens (no special tokens added).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self.inner.encode(text, false)?)
    }

    /// Text of the text tokens (`< eot`); special and timestamp tokens are skipped.
    pub fn decode_text(&self, tokens: &[u32]) -> Result<String> {
        let t: Vec<u32> = tokens.iter().copied().filter(|&t| t < self.eot).collect();
        Ok(self.inner.decode(&t, false)?)
    }

    pub fn language_token(&self, code: &str) -> Result<u32> {
        self.languages
            .iter()
            .find(|(c, _)| c == code)
            .map(|l| l.1)
            .ok_or_else(|| Error::UnknownLanguage(code.to_string()))
    }

    pub fn language_code(&self, token: u32) -> Option<&str> {
        self.languages.iter().find(|l| l.1 == token).map(|l| l.0.as_str())
    }

    /// Seconds of a timestamp token.
    pub fn timestamp_seconds(&self, token: u32) -> f64 {
        (token.saturating_sub(self.timestamp_begin)) as f64 * 0.02
    }

    /// openai-whisper's `non_speech_tokens`: symbols and music signs that are never
    /// speech, as their single tokens (with and without a leading space).
    pub fn non_speech_tokens(&self) -> Result<Vec<u32>> {
        let mut symbols: Vec<String> = "\"#()*+/:;<=>@[\\]^_`{|}~「」『』".chars().map(String::from).collect();
        symbols.extend("<< >> <<< >>> -- --- -( -[ (' (\" (( )) ((( ))) [[ ]] {{ }} ♪♪ ♪♪♪".split(' ').map(String::from));
        let misc: Vec<String> = "♩♪♫♬♭♮♯".chars().map(String::from).collect();
        let mut out = Vec::new();
        for s in [" -", " '"] {
            if let Some(&t) = self.encode(s)?.first() {
                out.push(t);
            }
        }
        for s in symbols.iter().chain(misc.iter()) {
            let is_misc = misc.contains(s);
            for text in [s.clone(), format!(" {s}")] {
                let t = self.encode(&text)?;
                if t.len() == 1 || (is_misc && !t.is_empty()) {
                    out.push(t[0]);
                }
            }
        }
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }
}
