use std::path::PathBuf;

/// Everything that can go wrong in `sapient-kokoro`; nothing in the library panics on user
/// input (files, configs).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: config: {what}")]
    Config { path: PathBuf, what: String },
    /// The ONNX graph is not the Kokoro export this importer knows (a node or weight it cannot
    /// place, a scale that does not fit its weight ...).
    #[error("{path}: ONNX import: {what}")]
    Import { path: PathBuf, what: String },
    /// Weights do not match the config: missing, unexpected or mis-shaped tensors.
    #[error("{path}: weights: {what}")]
    Weights { path: PathBuf, what: String },
    /// A voice file or voice spec that cannot be used (unknown name, bad blend, bad shape).
    #[error("voice: {0}")]
    Voice(String),
    /// Input the model cannot take (no phonemes, an id outside the vocabulary, too many
    /// phonemes, a bad style vector or speed).
    #[error("kokoro input: {0}")]
    Input(String),
    #[error(transparent)]
    Tensor(#[from] sapient_tensor::Error),
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
