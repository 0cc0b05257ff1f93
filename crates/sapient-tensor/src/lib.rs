//! `sapient-tensor`: the lowest layer of SAPIENT.
//!
//! - [`device`]: device selection (CPU by default; `cuda` / `metal` cargo features) and the
//!   dtype policy per device.
//! - [`formats`] (`src/formats/`): the file formats, each also at the crate root:
//!   - [`gguf`]: our own GGUF v2/v3 reader and writer;
//!   - [`onnx`]: a minimal ONNX (protobuf) reader for importing weights from `.onnx` files;
//!   - [`npy`]: NumPy `.npy` arrays and `.npz` archives.
//! - [`weights`]: the [`WeightSource`] trait every model loads through (GGUF, safetensors),
//!   and a [`Linear`] layer over quantized or dense weights.
//! - [`limits`]: [`Limits`], the memory ceiling loaders apply to hostile files.
//! - [`kernels`] (`src/kernels/`): quantized matrix products on the CPU (AVX2, AVX-512 VNNI,
//!   AMX), chosen at run time, over one persistent thread pool ([`kernels::pool`]), with
//!   their CPU detection, dispatch and memory policy (huge pages, prefetch distances).
//! - [`encoder`]: what every encoder shares (Whisper, the embedders, Kokoro): layer norm and
//!   full self-attention over packed sequences.
//!
//! ```no_run
//! use sapient_tensor::{GgufFile, WeightSource};
//! # fn main() -> sapient_tensor::Result<()> {
//! let gguf = GgufFile::open("SmolLM2-135M-Instruct.Q4_1.gguf")?;
//! println!("{}: {} tensors", gguf.architecture()?, gguf.tensors().len());
//! let q = gguf.load("blk.0.attn_q.weight", &candle_core::Device::Cpu)?;
//! println!("{:?}", q.shape());
//! # Ok(()) }
//! ```

pub mod device;
pub mod encoder;
mod error;
pub mod formats;
pub mod kernels;
pub mod limits;
pub mod weights;

pub use formats::{gguf, npy, onnx};

pub use candle_core;
pub use device::{activation_dtype, DeviceRequest};
pub use error::{Error, Result};
pub use limits::Limits;
pub use gguf::{GgmlType, GgufFile, GgufWriter, MappedBytes, TensorInfo, Value};
pub use weights::{open_weights, open_weights_with, Linear, SafetensorsFiles, Weight, WeightSource};

/// The README's example, compiled as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctest;
