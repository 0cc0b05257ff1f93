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
    /// The chunk's words and when each is spoken, in seconds from the start of the whole
    /// stream, from the durations the model predicted for their phonemes.
    pub words: Vec<WordTiming>,
}

/// A spoken word and its time span (seconds).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct WordTiming {
    pub word: String,
    pub start: f32,
    pub end: f32,
}

/// Where each word's phonemes are among the model's input tokens: `words` (text, phonemes)
/// in order, found left to right in `phonemes`; the model takes one token per phoneme
/// character in the vocabulary, after one padding token. Words not found here (they are in
/// a later chunk of the same sentence) are left for it: the count consumed is returned.
fn word_tokens(words: &[(String, String)], phonemes: &str, vocab: &PhonemeVocab) -> (Vec<(String, usize, usize)>, usize) {
    let chars: Vec<char> = phonemes.chars().collect();
    // token index (padding included) of each character; characters outside the vocabulary
    // have none and take no time.
    let mut tok = Vec::with_capacity(chars.len() + 1);
    let mut t = 1;
    for &c in &chars {
        tok.push(t);
        if vocab.contains(c) {
            t += 1;
        }
    }
    tok.push(t);
    let mut out = Vec::new();
    let mut at = 0;
    let mut used = 0;
    for (word, ps) in words {
        let p: Vec<char> = ps.chars().collect();
        let found = (at..=chars.len().saturating_sub(p.len())).find(|&i| chars[i..].starts_with(&p));
        let Some(i) = found else { break };
        out.push((word.clone(), tok[i], tok[i + p.len()]));
        at = i + p.len();
        used += 1;
    }
    (out, used)
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
        crate::memory::memory_probe("load: lexicons");
        let vocab = PhonemeVocab::from_file(&dir.join("vocab.json"))?;
        let voices_path = find_voices(dir)?;
        let voices = Voices::load_with(&voices_path, limits)?;
        // what parsing the lexicons and the voices took goes back to the system
        sapient_tensor::kernels::release_freed();
        crate::memory::memory_probe("load: voices");
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
        Ok(self.speak_timed(phonemes, voice, speed)?.0)
    }

    /// The whole text at once (all chunks, concatenated).
    pub fn synthesize(&self, text: &str, voice: &str, speed: f32) -> Result<Speech> {
        Ok(self.synthesize_timed(text, voice, speed)?.0)
    }

    /// [`synthesize`](Self::synthesize), and when each word is spoken.
    pub fn synthesize_timed(&self, text: &str, voice: &str, speed: f32) -> Result<(Speech, Vec<WordTiming>)> {
        let mut samples = Vec::new();
        let mut words = Vec::new();
        for chunk in self.stream(text, voice, speed)? {
            let chunk = chunk?;
            samples.extend(chunk.samples);
            words.extend(chunk.words);
        }
        Ok((
            Speech {
                samples,
                sample_rate: self.sample_rate(),
            },
            words,
        ))
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
            sentence: None,
            offset: 0,
            lead_frames: None,
        })
    }

    /// Phonemes -> samples and the frames (600 samples each) of every input token,
    /// padding included.
    fn speak_timed(&self, phonemes: &str, voice: &VoicePack, speed: f32) -> Result<(Vec<f32>, Vec<u32>)> {
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
        let s = self.model.forward(&ids, style, speed, None)?;
        Ok((s.audio, s.durations))
    }
}

/// The iterator [`KokoroTts::stream`] returns.
pub struct SpeechStream<'a> {
    tts: &'a KokoroTts,
    voice: VoicePack,
    speed: f32,
    chunks: std::vec::IntoIter<Chunk>,
    /// The sentence being spoken and its words not yet placed in a chunk.
    sentence: Option<(String, Vec<(String, String)>)>,
    /// Samples given out so far.
    offset: usize,
    /// Most frames of the leading silence kept ([`SpeechStream::with_lead_silence`]).
    lead_frames: Option<u32>,
}

/// Below this magnitude a sample of the leading silence counts as silent.
const SILENT: f32 = 0.01;
/// Samples kept before the first sound when the leading silence is cut (10 ms).
const ONSET_MARGIN: usize = 240;

/// How many leading samples to drop: the start of the first padding token's frames
/// (`lead` of them) beyond `keep`, and never past [`ONSET_MARGIN`] before the first sound.
fn lead_cut(samples: &[f32], lead: u32, keep: u32) -> usize {
    let most = lead.saturating_sub(keep) as usize * 600;
    let sound = samples.iter().position(|x| x.abs() >= SILENT).unwrap_or(samples.len());
    most.min(sound.saturating_sub(ONSET_MARGIN))
}

impl SpeechStream<'_> {
    /// Keep at most `frames` frames (25 ms each) of the silence the model puts before each
    /// chunk's speech (it predicts about 14, 350 ms, for the padding token in front). The
    /// model runs as before (it needs that silence to start the first word well); only
    /// silent samples are dropped, and the word times move with them. For a reply spoken
    /// clause by clause: its first audio is speech sooner, and its clauses join closely.
    pub fn with_lead_silence(mut self, frames: u32) -> Self {
        self.lead_frames = Some(frames);
        self
    }

    /// Chunks not yet synthesized.
    pub fn remaining(&self) -> usize {
        self.chunks.len()
    }
}

impl Iterator for SpeechStream<'_> {
    type Item = Result<AudioChunk>;

    fn next(&mut self) -> Option<Self::Item> {
        let c = self.chunks.next()?;
        let (mut samples, durations) = match self.tts.speak_timed(&c.phonemes, &self.voice, self.speed) {
            Ok(r) => r,
            Err(e) => return Some(Err(e)),
        };
        let cut = match (self.lead_frames, durations.first()) {
            (Some(keep), Some(&lead)) => lead_cut(&samples, lead, keep).min(samples.len()),
            _ => 0,
        };
        samples.drain(..cut);
        if self.sentence.as_ref().is_none_or(|(t, _)| *t != c.text) {
            self.sentence = Some((c.text.clone(), self.tts.g2p.phonemize_with_words(&c.text).1));
        }
        let mut words = Vec::new();
        if let Some((_, left)) = self.sentence.as_mut() {
            let (spans, used) = word_tokens(left, &c.phonemes, &self.tts.vocab);
            left.drain(..used);
            // Frames to seconds: 600 samples a frame at 24 kHz.
            let mut cum = Vec::with_capacity(durations.len() + 1);
            cum.push(0u64);
            for d in &durations {
                cum.push(cum[cum.len() - 1] + u64::from(*d));
            }
            let sr = self.tts.sample_rate() as f32;
            let at = |tok: usize| (self.offset as f32 + (600.0 * cum[tok.min(cum.len() - 1)] as f32 - cut as f32).max(0.0)) / sr;
            for (word, a, b) in spans {
                words.push(WordTiming { word, start: at(a), end: at(b) });
            }
        }
        self.offset += samples.len();
        Some(Ok(AudioChunk {
            text: c.text,
            phonemes: c.phonemes,
            samples,
            words,
        }))
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
