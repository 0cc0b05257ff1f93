//! `sapient-kokoro`: Kokoro-82M text-to-speech: English text to 24 kHz speech on the CPU.
//!
//! ```no_run
//! use sapient_kokoro::KokoroTts;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let preset = sapient_hub::Hub::new()?.fetch_preset("kokoro-82m", &mut |_| {})?;
//! let tts = KokoroTts::from_dir(&preset.dir, &candle_core::Device::Cpu)?;
//! let speech = tts.synthesize("Hello there. How are you?", "jf_alpha", 1.0)?;
//! println!("{} samples at {} Hz", speech.samples.len(), speech.sample_rate);
//! # Ok(()) }
//! ```
//!
//! - [`config`]: Kokoro's `config.json` (sizes, iSTFTNet settings, PL-BERT, vocabulary).
//! - [`params`]: every `KModel` parameter name and shape for a config.
//! - [`onnx_import`]: the int8 ONNX export to PyTorch-named f32 tensors (dequantized,
//!   re-laid-out, every graph weight accounted for), used by
//!   `cargo xtask convert kokoro-onnx-to-safetensors`.
//! - [`weights`]: loading those tensors (or a PyTorch checkpoint converted to safetensors)
//!   by name with shape checks.
//! - [`voices`]: voice packs (`.npz` / `.npy` / safetensors, `[510, 1, 256]` per voice):
//!   `Voices::load(path)?.get("jf_alpha:0.6,jm_kumo:0.4")?` (weights normalised to sum to 1)
//!   then `VoicePack::style_for(n_phonemes)` (row index = number of phonemes).
//! - [`model`]: the forward pass. `KModel::load_preset_dir(dir, &device)` (the fetched
//!   `kokoro-82m` directory, or a converted safetensors one) or `KModel::new(&weights, &config)`;
//!   `model.synthesize(ids, style, speed)` with phoneme ids **without** the 0 padding (at
//!   most [`MAX_PHONEMES`] = 510), `style` = `voice.style_for(ids.len())` (256 floats) and
//!   speed in 0.25..=4, gives 24 kHz mono f32 samples (`model.sample_rate()`);
//!   `model.forward(..)` also returns the durations and F0.
//! - [`g2p`]: English text -> phonemes (misaki's lexicons and rules, a letter-to-sound
//!   fallback), [`PhonemeVocab`] phonemes -> ids.
//! - [`text`]: sentence splitting and the 510-phoneme limit.
//! - [`tts`]: [`KokoroTts`], text -> speech whole or sentence by sentence ([`SpeechStream`]).

pub mod config;
mod error;
pub mod g2p;
mod memory;
pub mod model;
pub mod onnx_import;
pub mod params;
pub mod text;
pub mod tts;
pub mod voices;
pub mod weights;

pub use config::KokoroConfig;
pub use error::{Error, Result};
pub use g2p::{G2p, PhonemeVocab};
pub use model::{KModel, Synthesis, MAX_PHONEMES};
pub use tts::{AudioChunk, KokoroTts, Speech, SpeechStream, WordTiming};
pub use voices::{VoicePack, Voices};
pub use weights::KokoroWeights;

/// The README's example, compiled as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctest;
