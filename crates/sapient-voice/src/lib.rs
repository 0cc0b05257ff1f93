//! `sapient-voice`: a spoken conversation loop. Audio frames in (any rate), turn-taking by
//! Silero VAD, the user's turn transcribed by Whisper (at pauses while they speak, so that
//! the end of the turn usually finds the text ready), the reply generated on the LLM engine
//! and spoken by Kokoro clause by clause (the first clause as soon as it is complete),
//! audio frames out, and barge-in: speech during the reply stops its generation at the next
//! engine step and drops its unplayed audio, and the history keeps only what was heard.
//!
//! ```no_run
//! use std::sync::Arc;
//! use sapient_voice::{Event, VoiceLoop, VoiceModels, VoiceOptions};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let hub = sapient_hub::Hub::new()?;
//! let cpu = candle_core::Device::Cpu;
//! let kokoro = hub.fetch_preset("kokoro-82m", &mut |_| {})?;
//! let vad_file = hub.fetch_preset("silero-vad", &mut |_| {})?.file("onnx")?.to_path_buf();
//! let pipe = sapient_generate::Pipeline::from_pretrained("smollm2-135m-instruct")?;
//! let models = VoiceModels {
//!     transcriber: Arc::new(sapient_whisper::Transcriber::from_pretrained("whisper-tiny.en")?),
//!     tts: Arc::new(sapient_kokoro::KokoroTts::from_dir(&kokoro.dir, &cpu)?),
//!     llm: Arc::new(sapient_generate::Engine::new(pipe.model(), Default::default())?),
//! };
//! let vad = sapient_audio::SileroVad::load(&vad_file, &cpu)?;
//! let mut talk = VoiceLoop::new(models, vad, VoiceOptions { input_rate: 48_000, ..Default::default() })?;
//! # let frames: Vec<Vec<f32>> = Vec::new();
//! for frame in frames {                        // e.g. 20 ms from a microphone
//!     talk.push_audio(&frame)?;
//!     let out = talk.pull_audio(480, false);  // 20 ms at 24 kHz for the speaker
//!     for ev in talk.drain_events() {
//!         if let Event::TextDelta { text, .. } = ev { print!("{text}"); }
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! Everything the loop does is reported as an [`Event`], with timings
//! ([`ReplyTimings`]). The models are shared ([`VoiceModels`]: one engine serves many
//! conversations, batched); each conversation has its own VAD, history and engine
//! session (the KV cache of the conversation is kept between turns).

mod clause;
mod conversation;
pub mod file;
mod options;
mod reply;
mod turn;

pub use clause::{ClauseOptions, ClauseSplitter};
pub use conversation::VoiceLoop;
pub use options::{Playout, TurnOptions, VoiceOptions};

use sapient_generate::Engine;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("invalid voice options: {0}")]
    Options(String),
    #[error(transparent)]
    Audio(#[from] sapient_audio::Error),
    #[error(transparent)]
    Whisper(#[from] sapient_whisper::Error),
    #[error(transparent)]
    Kokoro(#[from] sapient_kokoro::Error),
    #[error(transparent)]
    Generate(#[from] sapient_generate::Error),
    #[error("reply {0} is still being generated (cancel it first)")]
    Busy(u64),
    #[error("{0}")]
    Worker(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Silero VAD from its weights (the `silero-vad` preset's ONNX or safetensors file), on
/// the CPU: one per conversation.
pub fn load_vad(path: &std::path::Path) -> Result<sapient_audio::SileroVad> {
    Ok(sapient_audio::SileroVad::load(path, &candle_core::Device::Cpu)?)
}

/// The language model a conversation talks to: an [`Engine`], or anything holding one (a
/// server's model entry).
pub trait LanguageModel: Send + Sync {
    fn engine(&self) -> &Engine;
}

impl LanguageModel for Engine {
    fn engine(&self) -> &Engine {
        self
    }
}

/// The three models, shared between conversations.
#[derive(Clone)]
pub struct VoiceModels {
    pub transcriber: Arc<sapient_whisper::Transcriber>,
    pub tts: Arc<sapient_kokoro::KokoroTts>,
    pub llm: Arc<dyn LanguageModel>,
}

/// How a reply ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyStatus {
    Completed,
    /// Barge-in or [`VoiceLoop::cancel`].
    Interrupted,
}

/// Where a reply's time went (milliseconds, wall clock).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReplyTimings {
    /// From the moment the last speech window of the turn arrived to the end-of-turn
    /// decision (the end-of-turn silence, and the time the loop took to see it).
    pub end_of_turn_ms: Option<f64>,
    /// Whisper on the turn after it ended (0 when the text of the last pause was reused).
    pub transcribe_ms: f64,
    /// How long before the end of the turn the reply was started, at a pause
    /// ([`TurnOptions::early_reply`]); 0 when it started at the end of the turn.
    pub early_ms: f64,
    /// For a reply started at a pause: Whisper's time on the pause's audio (the text the
    /// reply was started on), from the pause to its text.
    pub pause_transcribe_ms: Option<f64>,
    /// From the moment the last speech window of the turn arrived to the reply's start (at
    /// the pause with the early reply, else at the end of the turn).
    pub start_after_speech_end_ms: Option<f64>,
    /// From the reply's start to its first text (prompt processing and the first token).
    pub first_token_ms: Option<f64>,
    /// From the reply's start to its first audio (Kokoro done with the first chunk).
    pub first_audio_ms: Option<f64>,
    /// Kokoro's time on the first clause.
    pub first_clause_synth_ms: Option<f64>,
    /// From the moment the last speech window of the turn arrived to the first audio (the
    /// end-of-turn silence included when the audio arrives in real time).
    pub speech_end_to_first_audio_ms: Option<f64>,
    /// From the reply's start to its end (generated and spoken).
    pub total_ms: f64,
    pub prompt_tokens: usize,
    /// Prompt tokens the engine session had in its cache already.
    pub reused_prompt_tokens: usize,
    pub generated_tokens: usize,
}

/// What the loop did. Times in `audio_ms` count the input audio from its start.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Event {
    /// The VAD heard speech start.
    SpeechStarted { audio_ms: u64 },
    /// The user's turn ended (the end-of-turn silence has passed); `audio_ms` is where the
    /// speech stopped.
    SpeechStopped { audio_ms: u64 },
    /// What was said so far in the turn (at a pause; may change).
    TranscriptPartial { text: String },
    /// The turn's text (empty: nothing recognised, no reply).
    Transcript { text: String, audio_ms: u64, transcribe_ms: f64, reused: bool },
    ResponseStarted { response: u64 },
    /// A piece of the reply's text as generated.
    TextDelta { response: u64, text: String },
    /// A clause of the reply, spoken ([`VoiceLoop::output_rate`]).
    Audio { response: u64, text: String, samples: Vec<f32>, synth_ms: f64 },
    /// The reply was interrupted (barge-in at `audio_ms` of input, or cancelled) after
    /// `played_ms` of its audio; `heard` is what the history keeps.
    Interrupted { response: u64, audio_ms: Option<u64>, played_ms: u64, heard: String },
    /// The reply is generated and spoken (or interrupted); `text` is its message in the
    /// history, `generated` all the engine wrote.
    ResponseDone { response: u64, status: ReplyStatus, text: String, generated: String, timings: ReplyTimings },
    Error { message: String },
}
