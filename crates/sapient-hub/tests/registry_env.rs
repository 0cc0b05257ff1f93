//! `SAPIENT_REGISTRY` replaces the built-in registry. A test binary of its own: the variable
//! is process-wide.

use anyhow::Result;
use sapient_hub::{Error, Hub, Registry};

#[test]
fn sapient_registry_env_overrides_the_builtin() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("registry.toml");
    std::fs::write(
        &path,
        format!(
            "[[model]]\nid = \"only-one\"\nkind = \"data\"\ngroups = [\"mine\"]\n  [[model.file]]\n  role = \"x\"\n  name = \"x.bin\"\n  sha256 = \"{}\"\n  size = 1\n    [[model.file.parts]]\n    registry = \"dir\"\n    package = \"/nowhere\"\n    path = \"x.bin\"\n",
            "0".repeat(64)
        ),
    )?;
    std::env::set_var("SAPIENT_REGISTRY", &path);
    let r = Registry::builtin()?;
    assert_eq!(r.presets().len(), 1);
    assert_eq!(r.group("mine")?[0].id, "only-one");
    assert!(matches!(r.get("smollm2-135m-instruct"), Err(Error::UnknownPreset { .. })));
    let hub = Hub::with_cache_dir(dir.path().join("cache"))?;
    assert_eq!(hub.registry().presets()[0].id, "only-one");
    // A missing override file is an error naming the file, not a silent fallback.
    std::env::set_var("SAPIENT_REGISTRY", dir.path().join("missing.toml"));
    let e = Registry::builtin().unwrap_err().to_string();
    assert!(e.contains("missing.toml"), "{e}");
    std::env::remove_var("SAPIENT_REGISTRY");
    assert!(Registry::builtin()?.get("smollm2-135m-instruct").is_ok());
    Ok(())
}
