//! `sapient-audio`: audio in for speech models.
//!
//! * [`decode_file`] / [`decode_bytes`]: WAV (PCM 8–32-bit, float, A/µ-law), FLAC, MP3 and
//!   Ogg/Vorbis to mono `f32` ([`Audio`]); [`decode_raw_pcm`] for headerless PCM;
//!   [`write_wav`] for output.
//! * [`resample`] and the streaming [`Resampler`] (rubato).
//! * [`LogMel`]: Whisper's log-mel spectrogram (80 or 128 bins), one-shot or incremental
//!   ([`MelStream`]).
//! * [`SileroVad`]: Silero VAD v6 in candle, [`VadSegmenter`] for speech timestamps.
//! * [`AudioStream`]: chunk sources (file, memory, iterator, `futures::Stream`, microphone
//!   with the `mic` feature) and [`VoicedChunker`], which yields voiced segments from any of
//!   them.
//!
//! ```no_run
//! # fn main() -> sapient_audio::Result<()> {
//! use sapient_audio::{decode_file, LogMel, SileroVad, VadOptions, VadSegmenter};
//! let audio = decode_file("speech.mp3")?.into_16k()?;
//! let mel = LogMel::new(80)?.log_mel(&audio.samples)?; // [80, len / 160]
//! let mut vad = SileroVad::load("silero_vad_16k_op15.onnx", &candle_core::Device::Cpu)?;
//! let probs = vad.probabilities(&audio.samples)?;
//! for seg in VadSegmenter::new(VadOptions::default())?.segments(&probs, audio.len()) {
//!     println!("speech {:.2}s - {:.2}s", seg.start_s, seg.end_s);
//! }
//! # let _ = mel; Ok(()) }
//! ```

mod decode;
mod error;
pub mod mel;
mod resample;
pub mod stream;
pub mod vad;

#[cfg(feature = "mic")]
mod mic;
#[cfg(feature = "mic")]
mod speaker;

pub use decode::{
    decode_bytes, decode_file, decode_raw_pcm, decode_raw_pcm_interleaved, encode_pcm16, encode_wav, wav_header, write_wav, Audio, Decoder,
    PcmFormat, WavFormat, DEFAULT_MAX_DURATION_S,
};
pub use error::{check_rate, Error, Result, MAX_SAMPLE_RATE, MIN_SAMPLE_RATE};
pub use mel::{LogMel, Mel, MelFilters, MelStream};
pub use resample::{resample, Resampler};
pub use stream::{
    voiced_segments, AudioStream, BlockingStream, FileStream, IterStream, Resampled, SamplesStream, VoicedChunker,
    VoicedSegment, VoicedSegments,
};
pub use vad::{SileroVad, SpeechSegment, VadOptions, VadSegmenter, WeightFormat};

#[cfg(feature = "mic")]
pub use mic::{MicInput, MicStream};
#[cfg(feature = "mic")]
pub use speaker::SpeakerOutput;

/// The README's example, compiled as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctest;
