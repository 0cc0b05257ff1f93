use std::path::PathBuf;

/// Everything that can go wrong in `sapient-whisper`; nothing in the library panics on user
/// input (files, audio, options).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The CTranslate2 file ends before a field it announces (truncated download, wrong file).
    #[error("{path}: truncated CTranslate2 file: {what} needs bytes {offset}..{end} but the file has {len}")]
    Truncated { path: PathBuf, what: String, offset: usize, end: usize, len: usize },
    /// The CTranslate2 file is readable but not what a Whisper model must be.
    #[error("{path}: invalid CTranslate2 model: {what}")]
    Corrupt { path: PathBuf, what: String },
    #[error("{path}: config: {what}")]
    Config { path: PathBuf, what: String },
    /// Weights, config and tokenizer do not belong together.
    #[error("model/tokenizer mismatch: {0}")]
    Mismatch(String),
    #[error("invalid option: {0}")]
    Options(String),
    #[error("language '{0}' is not one this model knows")]
    UnknownLanguage(String),
    #[error("model '{reference}': {what}")]
    Model { reference: String, what: String },
    #[error(transparent)]
    Tensor(#[from] sapient_tensor::Error),
    #[error(transparent)]
    Hub(#[from] sapient_hub::Error),
    #[error(transparent)]
    Tokenizer(#[from] sapient_tokenizers::Error),
    #[error(transparent)]
    Audio(#[from] sapient_audio::Error),
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
