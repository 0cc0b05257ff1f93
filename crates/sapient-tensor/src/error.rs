use std::path::PathBuf;

/// Errors of `sapient-tensor`. Every variant names the file (and tensor or key) it is about.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("kernel options: {0}")]
    KernelOptions(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a GGUF file (first bytes {magic:02x?}, expected \"GGUF\")")]
    BadMagic { path: PathBuf, magic: Vec<u8> },
    #[error("{path}: unsupported GGUF version {version} (supported: 2 and 3)")]
    UnsupportedVersion { path: PathBuf, version: u32 },
    #[error("{path}: file is truncated: {what} needs bytes {offset}..{end} but the file has {len} bytes")]
    Truncated {
        path: PathBuf,
        what: String,
        offset: u64,
        end: u64,
        len: u64,
    },
    /// Buffers or weights whose sizes do not fit together (the message names both).
    #[error("{0}")]
    Shape(String),
    #[error("{path}: malformed GGUF: {what}")]
    Malformed { path: PathBuf, what: String },
    #[error("{path}: tensor '{tensor}' has unknown ggml type id {id}")]
    UnknownGgmlType { path: PathBuf, tensor: String, id: u32 },
    #[error("{path}: tensor '{tensor}' has ggml type {ty}, which this build cannot load (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K..Q8_K)")]
    UnsupportedGgmlType {
        path: PathBuf,
        tensor: String,
        ty: &'static str,
    },
    #[error("{path}: tensor '{tensor}' data ({start}..{end}) runs past the end of the file ({len} bytes); the file is truncated or corrupt")]
    TensorOutOfBounds {
        path: PathBuf,
        tensor: String,
        start: u64,
        end: u64,
        len: u64,
    },
    #[error("{path}: tensor '{tensor}' not found")]
    MissingTensor { path: PathBuf, tensor: String },
    #[error("{path}: tensor '{tensor}' has shape {actual:?}, expected {expected:?}")]
    ShapeMismatch {
        path: PathBuf,
        tensor: String,
        expected: Vec<usize>,
        actual: Vec<usize>,
    },
    #[error("{path}: metadata key '{key}' is missing")]
    MissingKey { path: PathBuf, key: String },
    #[error("{path}: metadata key '{key}' has type {actual}, expected {expected}")]
    KeyType {
        path: PathBuf,
        key: String,
        expected: &'static str,
        actual: &'static str,
    },
    #[error("{path}: malformed ONNX: {what} at byte {offset}: {problem}")]
    Onnx {
        path: PathBuf,
        what: String,
        offset: u64,
        problem: String,
    },
    #[error("{path}: {what}")]
    Npy { path: PathBuf, what: String },
    #[error("device '{0}' is not available: {1}")]
    Device(String, String),
    #[error("{path}: {what}")]
    Safetensors { path: PathBuf, what: String },
    /// A size a file declares is over a [`crate::Limits`] ceiling.
    #[error("{path}: {what} needs {needed} bytes, over the limit of {limit} bytes (Limits::max_alloc)")]
    Limit {
        path: PathBuf,
        what: String,
        needed: u64,
        limit: u64,
    },
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
