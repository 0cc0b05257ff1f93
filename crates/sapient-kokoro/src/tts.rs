//! The high-level text-to-speech API: text -> sentences -> phonemes (<= 510 per chunk) ->
//! ids -> [`KModel`] with the voice's style row for that length -> 24 kHz audio.
//!
//! ```no_run
//! # fn main() -> sapient_kokoro::Result<()> {
//! use sapient_kokoro::KokoroTts;
//! let tts = KokoroTts::from_dir(std::path::Path::new("/path/to/kokoro-82m"), &candle_core::Device::Cpu)?;
//! let speech = tts.synthesize("Hello there. How are you?", "jf_alpha", 1.0)?;
//! // or sentence by sentence, the first chunk before the rest is computed:
//! for chunk in tts.stream("Hello there. How are you?", "jf_alpha:0.6,jm_kumo:0.4", 1.0)? {
//!     let chunk = chunk?;
//!     println!("{} samples for {:?}", chunk.samples.len(), chunk.text);
//! }
//! # Ok(()) }
//! ```

use crate::g2p::{G2p, PhonemeVocab};
use crate::text::{self, Chunk};
use crate::{Error, KModel, Result, VoicePack, Voices, MAX_PHONEMES};
use candle_core::Device;
use std::path::Path;

/// A whole utterance.
#[derive(Debug, Clone)]
pub struct Speech {
    /// Mono samples in [-1, 1] (roughly; the model is not clipped).
    pub samples: Vec<f32>,
    pub sample_rate: u32,
}

/// One synthesized chunk (a sentence, or part of a long one).
#[derive(Debug, Clone)]
pub struct AudioChunk {
    /// The sentence this chunk comes from.
    pub text: String,
    /// The phonemes spoken.
    pub phonemes: String,
    pub samples: Vec<f32>,
}

/// Kokoro-82M with its English G2P, phoneme vocabulary and voices.
pub struct KokoroTts {
    model: KModel,
    g2p: G2p,
    vocab: PhonemeVocab,
    voices: Voices,
}

impl KokoroTts {
    pub fn new(model: KModel, g2p: G2p, vocab: PhonemeVocab, voices: Voices) -> Self {
        Self {
            model,
            g2p,
            vocab,
            voices,
        }
    }

    /// From the `kokoro-82m` preset directory: the model (see [`KModel::load_preset_dir`]),
    /// `vocab.json`, `us_gold.json` + `us_silver.json`, and the first `voices*.npz` there.
    pub fn from_dir(dir: &Path, device: &Device) -> Result<Self> {
        Self::from_dir_with(dir, device, &sapient_tensor::Limits::default())
    }

    /// [`from_dir`](Self::from_dir) with every file read under `limits` (the model's tensors
    /// and the voice pack; see [`sapient_tensor::Limits`]).
    pub fn from_dir_with(dir: &Path, device: &Device, limits: &sapient_tensor::Limits) -> Result<Self> {
        let model = KModel::load_preset_dir_with(dir, device, limits)?;
        let g2p = G2p::from_dir(dir)?;
        let vocab = PhonemeVocab::from_file(&dir.join("vocab.json"))?;
        let voices_path = find_voices(dir)?;
        let voices = Voices::load_with(&voices_path, limits)?;
        Ok(Self::new(model, g2p, vocab, voices))
    }

    pub fn model(&self) -> &KModel {
        &self.model
    }

    pub fn g2p(&self) -> &G2p {
        &self.g2p
    }

    pub fn vocab(&self) -> &PhonemeVocab {
        &self.vocab
    }

    pub fn voices(&self) -> &Voices {
        &self.voices
    }

    pub fn sample_rate(&self) -> u32 {
        self.model.sample_rate()
    }

    /// Text -> the chunks that will be spoken (sentences, cut under 510 phonemes).
    /// Empty text, or text with nothing to say, is an [`Error::Input`].
    pub fn chunks(&self, text: &str) -> Result<Vec<Chunk>> {
        if text.trim().is_empty() {
            return Err(Error::Input("no text to speak (empty input)".into()));
        }
        let chunks = text::chunks(&self.g2p, text, MAX_PHONEMES);
        if chunks.is_empty() {
            return Err(Error::Input(format!(
                "nothing speakable in {:?} (no letters or digits)",
                text.chars().take(60).collect::<String>()
            )));
        }
        Ok(chunks)
    }

    /// Text -> phonemes (the chunks' phonemes joined by spaces).
    pub fn phonemize(&self, text: &str) -> Result<String> {
        Ok(self.chunks(text)?.iter().map(|c| c.phonemes.as_str()).collect::<Vec<_>>().join(" "))
    }

    /// Speaks phonemes directly (at most 510 symbols; symbols outside the vocabulary are
    /// skipped with a warning).
    pub fn speak_phonemes(&self, phonemes: &str, voice: &VoicePack, speed: f32) -> Result<Vec<f32>> {
        let (ids, _skipped) = self.vocab.encode(phonemes);
        if ids.is_empty() {
            return Err(Error::Input(format!("no phonemes in Kokoro's vocabulary in {phonemes:?}")));
        }
        if ids.len() > MAX_PHONEMES {
            return Err(Error::Input(format!(
                "{} phonemes, more than Kokoro's {MAX_PHONEMES} in one call (split the text)",
                ids.len()
            )));
        }
        let style = voice.style_for(ids.len())?;
        self.model.synthesize(&ids, style, speed)
    }

    /// The whole text at once (all chunks, concatenated).
    pub fn synthesize(&self, text: &str, voice: &str, speed: f32) -> Result<Speech> {
        let mut samples = Vec::new();
        for chunk in self.stream(text, voice, speed)? {
            samples.extend(chunk?.samples);
        }
        Ok(Speech {
            samples,
            sample_rate: self.sample_rate(),
        })
    }

    /// Sentence by sentence: the text is split and phonemized up front (cheap), and each
    /// chunk is synthesized when the iterator is advanced, so the first audio comes after one
    /// sentence's work. Input errors (empty text, unknown voice, bad speed) come here, before
    /// any synthesis.
    pub fn stream(&self, text: &str, voice: &str, speed: f32) -> Result<SpeechStream<'_>> {
        if !(0.25..=4.0).contains(&speed) {
            return Err(Error::Input(format!("speed {speed} outside 0.25..=4")));
        }
        let voice = self.voices.get(voice)?;
        let chunks = self.chunks(text)?;
        Ok(SpeechStream {
            tts: self,
            voice,
            speed,
            chunks: chunks.into_iter(),
        })
    }
}

/// The iterator [`KokoroTts::stream`] returns.
pub struct SpeechStream<'a> {
    tts: &'a KokoroTts,
    voice: VoicePack,
    speed: f32,
    chunks: std::vec::IntoIter<Chunk>,
}

impl SpeechStream<'_> {
    /// Chunks not yet synthesized.
    pub fn remaining(&self) -> usize {
        self.chunks.len()
    }
}

impl Iterator for SpeechStream<'_> {
    type Item = Result<AudioChunk>;

    fn next(&mut self) -> Option<Self::Item> {
        let c = self.chunks.next()?;
        Some(
            self.tts
                .speak_phonemes(&c.phonemes, &self.voice, self.speed)
                .map(|samples| AudioChunk {
                    text: c.text,
                    phonemes: c.phonemes,
                    samples,
                }),
        )
    }
}

fn find_voices(dir: &Path) -> Result<std::path::PathBuf> {
    let rd = std::fs::read_dir(dir).map_err(|source| Error::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut found: Vec<_> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("voices") && (n.ends_with(".npz") || n.ends_with(".safetensors")))
        })
        .collect();
    found.sort();
    found.into_iter().next().ok_or_else(|| Error::Voice(format!("no voices*.npz in {}", dir.display())))
}
