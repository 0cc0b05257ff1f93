//! GGUF: our own reader and writer (v2/v3; all metadata value types; every ggml type listed,
//! the ones candle holds loadable).

mod reader;
mod types;
mod writer;

pub use reader::{GgufFile, MappedBytes, TensorInfo, DEFAULT_ALIGNMENT, GGUF_MAGIC};
pub use types::{GgmlType, Value, ValueType};
pub use writer::{GgufWriter, TensorData, TensorSpec};
