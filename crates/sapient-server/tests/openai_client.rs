//! The server driven by the official `openai` Python client (tests/openai_client.py), installed
//! from PyPI into a venv under the target directory on first run. Skipped, saying so, when
//! python3 or the package cannot be had (set SAPIENT_REQUIRE_PYTHON=1 to fail instead).

mod common;

use anyhow::{bail, Context, Result};
use common::*;
use sapient_server::ServerOptions;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const OPENAI_VERSION: &str = "3.57.0";

fn skip(why: &str) -> Result<()> {
    if std::env::var_os("SAPIENT_REQUIRE_PYTHON").is_some() {
        bail!("{why}");
    }
    eprintln!("SKIPPED openai_python_client: {why}");
    Ok(())
}

/// The venv's python with `openai` installed, or why not.
fn venv() -> Result<PathBuf, String> {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("openai-venv");
    let py = dir.join("bin").join("python");
    let marker = dir.join(format!("openai-{OPENAI_VERSION}"));
    if marker.exists() {
        return Ok(py);
    }
    let run = |cmd: &mut Command| -> Result<(), String> {
        let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!("{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or("")))
        }
    };
    run(Command::new("python3").args(["-m", "venv"]).arg(&dir))?;
    run(Command::new(&py).args(["-m", "pip", "install", "-q", "--disable-pip-version-check", &format!("openai=={OPENAI_VERSION}")]))?;
    std::fs::write(&marker, b"").map_err(|e| e.to_string())?;
    Ok(py)
}

#[test]
fn openai_python_client() -> Result<()> {
    let py = match venv() {
        Ok(p) => p,
        Err(why) => return skip(&format!("no python3 venv with openai=={OPENAI_VERSION}: {why}")),
    };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let key = "sk-sapient-test";
    let server = rt.block_on(start(ServerOptions { api_key: Some(key.into()), max_queue: 2, max_body_bytes: 64 << 10, ..ServerOptions::default() }))?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/openai_client.py");
    let mut child = Command::new(&py)
        .arg(&script)
        .env("OPENAI_BASE_URL", format!("http://{}/v1", server.addr))
        .env("OPENAI_API_KEY", key)
        .env("MODEL", MODEL)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting python")?;
    let t = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if t.elapsed() > Duration::from_secs(300) {
            let _ = child.kill();
            bail!("the openai client script ran over 300 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let out = child.wait_with_output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    anyhow::ensure!(status.success() && stdout.trim_end().ends_with("ok"), "the openai client script failed ({status})");
    drop(server);
    Ok(())
}
