//! `sapient-kokoro`: Kokoro-82M text-to-speech (work in progress, issue #9).
//!
//! - [`config`]: Kokoro's `config.json` (sizes, iSTFTNet settings, PL-BERT, vocabulary).
//! - [`params`]: every `KModel` parameter name and shape for a config.
//! - [`onnx_import`]: the int8 ONNX export to PyTorch-named f32 tensors (dequantized,
//!   re-laid-out, every graph weight accounted for), used by
//!   `cargo xtask convert kokoro-onnx-to-safetensors`.
//! - [`weights`]: loading those tensors (or a PyTorch checkpoint converted to safetensors)
//!   by name with shape checks.

pub mod config;
mod error;
pub mod onnx_import;
pub mod params;
pub mod weights;

pub use config::KokoroConfig;
pub use error::{Error, Result};
pub use weights::KokoroWeights;
