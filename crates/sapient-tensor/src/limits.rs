//! Resource limits for loading files that may be hostile.
//!
//! Every loader in this crate checks a declared size (an element count, a byte length, a
//! shape) against the bytes the file actually holds before it allocates anything sized by
//! it. A file can still make a loader allocate more than its own length in a few places: a
//! compressed `.npz` entry inflates, a GGUF metadata array of one-byte values becomes an
//! array of [`crate::Value`]s, a quantized tensor dequantizes to `f32`. [`Limits`] bounds
//! those: the loaders that take it refuse any single allocation sized by the file that would
//! exceed [`Limits::max_alloc_bytes`], with an [`Error::Limit`] naming the file, the field
//! and the limit.
//!
//! ```
//! use sapient_tensor::Limits;
//! let server = Limits::default().max_alloc_bytes(512 << 20); // 512 MiB per array
//! assert_eq!(server.max_alloc, 512 << 20);
//! ```

use crate::{Error, Result};
use std::path::Path;

/// The default memory ceiling: 16 GiB for one array decoded from a file (the largest
/// tensors of the models SAPIENT runs, dequantized to `f32`, take under 2 GiB).
pub const DEFAULT_MAX_ALLOC: u64 = 16 << 30;

/// Limits a loader applies to what a file may make it allocate. A value passed in loaders'
/// options (library code reads no environment variable for it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The most bytes one array decoded from a file may take (an inflated `.npz` entry, a
    /// dequantized tensor, a metadata array, a file read whole into memory).
    pub max_alloc: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self { max_alloc: DEFAULT_MAX_ALLOC }
    }
}

impl Limits {
    /// The same limits with another memory ceiling.
    pub fn max_alloc_bytes(mut self, bytes: u64) -> Self {
        self.max_alloc = bytes;
        self
    }

    /// `Ok` when `bytes` (what `what` in `path` needs) fits under the ceiling; otherwise
    /// [`Error::Limit`].
    pub fn check(&self, path: &Path, what: impl FnOnce() -> String, bytes: u64) -> Result<()> {
        if bytes > self.max_alloc {
            return Err(Error::Limit {
                path: path.to_path_buf(),
                what: what(),
                needed: bytes,
                limit: self.max_alloc,
            });
        }
        Ok(())
    }
}
