//! Sets of data files from one package folder, pinned together by one digest: test suites
//! and corpora of many small files, which would need an entry each in the registry.

use crate::registry::PackagePart;
use crate::{Error, Hub, Progress, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// The files of one folder of a package whose names end with `suffix` (not those of its
/// subfolders), pinned by [`FileSet::sha256`]: the sha256 of the lines
/// `<file name> <sha256 of the file>\n` in file-name order ([`file_set_digest`]).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FileSet {
    /// What the set is called in messages.
    pub name: String,
    /// `pypi`, `npm`, `apt` (or `dir` for a local directory).
    pub registry: String,
    pub package: String,
    #[serde(default)]
    pub version: String,
    /// PyPI: the source distribution even where a wheel exists.
    #[serde(default)]
    pub sdist: bool,
    /// The folder inside the unpacked package.
    pub path: String,
    /// Which files of the folder: those whose names end with this (empty: all).
    #[serde(default)]
    pub suffix: String,
    /// How many files the set has.
    pub files: usize,
    pub sha256: String,
}

/// The digest of a set of files: the sha256 of `<name> <sha256>\n` lines in name order.
pub fn file_set_digest(files: &[PathBuf]) -> Result<String> {
    let mut named: Vec<(String, &Path)> = files
        .iter()
        .map(|p| (p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(), p.as_path()))
        .collect();
    named.sort();
    let mut h = Sha256::new();
    for (name, p) in named {
        h.update(format!("{name} {}\n", crate::sha256_file(p)?).as_bytes());
    }
    Ok(hex::encode(h.finalize()))
}

impl Hub {
    /// The files of a set, sorted by name, from the package cache
    /// (`$SAPIENT_HOME/packages/`), downloading and unpacking the package once. Every call
    /// hashes the files again and fails with [`Error::HashMismatch`] (removing the unpacked
    /// package, so the next call fetches it again) when they are not the pinned ones.
    pub fn fetch_file_set(&self, set: &FileSet, progress: &mut dyn FnMut(Progress)) -> Result<Vec<PathBuf>> {
        let bad = |what: String| Error::Registry { origin: format!("file set '{}'", set.name), what };
        if set.path.starts_with('/') || set.path.split('/').any(|c| c == "..") {
            return Err(bad(format!("folder '{}' must be relative, without '..'", set.path)));
        }
        let part = PackagePart {
            registry: set.registry.clone(),
            package: set.package.clone(),
            version: set.version.clone(),
            path: set.path.clone(),
            sdist: set.sdist,
        };
        let root = self.package_dir(&part, &set.name, progress)?;
        let dir = root.join(&set.path);
        let rd = std::fs::read_dir(&dir).map_err(|source| Error::Io { path: dir.clone(), source })?;
        let mut files: Vec<PathBuf> = rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file() && p.file_name().is_some_and(|n| n.to_string_lossy().ends_with(&set.suffix)))
            .collect();
        files.sort();
        progress(Progress::Verifying { file: set.name.clone() });
        let actual = file_set_digest(&files)?;
        if actual != set.sha256 || files.len() != set.files {
            if set.registry != "dir" {
                let _ = std::fs::remove_dir_all(&root);
            }
            return Err(Error::HashMismatch {
                file: format!("{} ({} files, {} expected)", set.name, files.len(), set.files),
                source_name: format!("{}:{}", set.registry, set.package),
                expected: set.sha256.clone(),
                actual,
            });
        }
        progress(Progress::Done { file: set.name.clone() });
        Ok(files)
    }
}
