//! The one error type of `sapient-audio`.

use std::path::PathBuf;

/// Lowest sample rate accepted anywhere in the crate (telephone audio is 8 kHz).
pub const MIN_SAMPLE_RATE: u32 = 1_000;
/// Highest sample rate accepted anywhere in the crate (DXD is 352.8 kHz; 768 kHz exists).
pub const MAX_SAMPLE_RATE: u32 = 768_000;

/// Everything that can go wrong in `sapient-audio`, each variant naming the problem.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The input has no bytes at all.
    #[error("{what}: empty input (0 bytes)")]
    EmptyInput { what: String },
    /// The input is well formed but holds no audio samples.
    #[error("{what}: zero-length audio (no samples)")]
    ZeroLength { what: String },
    /// The container format is not recognised.
    #[error("{what}: unsupported or unrecognised audio format ({detail})")]
    UnsupportedFormat { what: String, detail: String },
    /// The container is recognised but its codec is not supported.
    #[error("{what}: unsupported codec ({detail})")]
    UnsupportedCodec { what: String, detail: String },
    /// A header or a packet is malformed or truncated.
    #[error("{what}: corrupt or truncated audio ({detail})")]
    Corrupt { what: String, detail: String },
    /// More audio than a decoder's duration limit.
    #[error("{what}: longer than the limit of {limit_s} s of audio (Decoder::with_max_duration)")]
    TooLong { what: String, limit_s: f64 },
    /// A sample rate outside [`MIN_SAMPLE_RATE`]..=[`MAX_SAMPLE_RATE`].
    #[error("sample rate {rate} Hz is not plausible (accepted: {MIN_SAMPLE_RATE}..={MAX_SAMPLE_RATE} Hz)")]
    InvalidSampleRate { rate: u32 },
    /// A channel count of 0 or more than 64.
    #[error("invalid channel count {channels}")]
    InvalidChannels { channels: usize },
    /// Raw PCM whose length is not a whole number of frames.
    #[error("raw PCM: {len} bytes is not a whole number of {frame_bytes}-byte frames")]
    RawPcmLength { len: usize, frame_bytes: usize },
    /// Audio shorter than an operation needs.
    #[error("{what}: {got} samples is too short (at least {need} needed)")]
    TooShort { what: &'static str, got: usize, need: usize },
    /// A sample that is NaN or infinite.
    #[error("{what}: sample {index} is not finite ({value})")]
    NonFinite { what: &'static str, index: usize, value: f32 },
    /// The resampler failed.
    #[error("resampling {from} Hz -> {to} Hz: {detail}")]
    Resample { from: u32, to: u32, detail: String },
    /// A mel filter bank that cannot be used.
    #[error("mel filters: {0}")]
    MelFilters(String),
    /// A model file that is missing a tensor, has a wrong shape or cannot be parsed.
    #[error("{path}: {detail}")]
    Model { path: PathBuf, detail: String },
    /// A call with the wrong window length or sample rate.
    #[error("{0}")]
    InvalidInput(String),
    /// An option outside its range.
    #[error("invalid option {name}: {detail}")]
    InvalidOption { name: &'static str, detail: String },
    /// The audio device (microphone) failed.
    #[error("audio device: {0}")]
    Device(String),
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Checks that a sample rate is plausible.
pub fn check_rate(rate: u32) -> Result<u32> {
    if (MIN_SAMPLE_RATE..=MAX_SAMPLE_RATE).contains(&rate) {
        Ok(rate)
    } else {
        Err(Error::InvalidSampleRate { rate })
    }
}

pub(crate) fn check_finite(what: &'static str, samples: &[f32]) -> Result<()> {
    match samples.iter().position(|s| !s.is_finite()) {
        Some(index) => Err(Error::NonFinite { what, index, value: samples[index] }),
        None => Ok(()),
    }
}
