//! `sapient-tensor`: the lowest layer of SAPIENT.
//!
//! - [`device`]: device selection (CPU by default; `cuda` / `metal` cargo features) and the
//!   dtype policy per device.
//! - [`gguf`]: our own GGUF v2/v3 reader and writer.
//! - [`weights`]: the [`WeightSource`] trait every model loads through (GGUF, safetensors),
//!   and a [`Linear`] layer over quantized or dense weights.
//! - [`onnx`]: a minimal ONNX (protobuf) reader for importing weights from `.onnx` files.

pub mod device;
mod error;
pub mod gguf;
pub mod kernels;
pub mod onnx;
pub mod weights;

pub use candle_core;
pub use device::{activation_dtype, DeviceRequest};
pub use error::{Error, Result};
pub use gguf::{GgmlType, GgufFile, GgufWriter, TensorInfo, Value};
pub use weights::{open_weights, Linear, SafetensorsFiles, Weight, WeightSource};
