//! `sapient-whisper`: Whisper speech-to-text on the CPU, on sapient-tensor's kernels.
//!
//! - [`ct2`]: CTranslate2 `model.bin` import (fused projections split, transformers names),
//!   used by `cargo xtask convert ct2-to-safetensors` and by loading a CTranslate2 model
//!   directly.
//! - [`config`]: transformers' `WhisperConfig` fields plus alignment heads, suppressed
//!   tokens and language ids.
//! - [`model`]: the model (encoder and decoder, each written once on plain f32 buffers:
//!   `encoder.rs`, `decoder.rs`); a self-attention KV cache per decoding run and the
//!   cross-attention keys/values computed once per 30 s window for all beams.
//! - [`decode`]: one window as openai-whisper decodes it (greedy, sampling, beam search with
//!   patience, logit filters and timestamp rules, no-speech probability, language detection).
//! - [`transcribe`]: long-form audio, temperature fallback, segments ([`Transcriber`]).
//! - [`stream`]: streaming transcription over Silero VAD's voiced stretches.
//! - [`timing`]: word timestamps (alignment heads' cross-attention, DTW).
//! - [`output`]: text, SRT, WebVTT and JSON.
//!
//! ```no_run
//! use sapient_whisper::{Transcriber, TranscribeOptions};
//! let t = Transcriber::from_pretrained("whisper-tiny.en")?;
//! let r = t.transcribe_file("talk.wav".as_ref(), &TranscribeOptions::default())?;
//! println!("{}", r.text);
//! # Ok::<(), sapient_whisper::Error>(())
//! ```

pub mod config;
pub mod ct2;
pub mod decode;
pub mod eval;
mod decoder;
mod encoder;
mod error;
pub mod model;
pub mod output;
pub mod stream;
pub mod timing;
pub mod tokenizer;
pub mod transcribe;

pub use config::WhisperConfig;
pub use decode::{compression_ratio, DecodeOptions, DecodeResult, Task};
pub use error::{Error, Result};
pub use model::Whisper;
pub use output::OutputFormat;
pub use stream::{default_vad_options, Backlog, StreamMode, StreamUpdate, StreamingTranscriber};
pub use timing::Word;
pub use tokenizer::WhisperTokenizer;
pub use transcribe::{LoadOptions, LongForm, Segment, TranscribeOptions, Transcriber, Transcript, DEFAULT_BATCH_SIZE};

/// The README's example, compiled as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctest;
