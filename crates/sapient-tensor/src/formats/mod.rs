//! The file formats weights come in, each read without trusting the file (every length and
//! count checked against the bytes present and [`Limits`](crate::Limits)):
//!
//! - [`gguf`]: GGUF v2/v3, reader and writer (llama.cpp's quantized formats);
//! - [`onnx`]: the protobuf of `.onnx` models, for importing their weights and graphs;
//! - [`npy`]: NumPy `.npy` arrays and `.npz` archives.
//!
//! safetensors is read in [`weights`](crate::weights), beside the [`WeightSource`](crate::WeightSource)
//! trait all of them load through. Each module is also at the crate root
//! (`sapient_tensor::gguf`, `sapient_tensor::onnx`, `sapient_tensor::npy`).

pub mod gguf;
pub mod npy;
pub mod onnx;

/// The protobuf writer of the ONNX tests (tests/support/protobuf.rs), for `onnx`'s unit tests.
#[cfg(test)]
#[path = "../../tests/support/protobuf.rs"]
mod protobuf;
