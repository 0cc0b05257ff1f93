//! The server driven by the official Python clients, installed from PyPI into a venv under
//! the target directory on first run: `openai` (tests/openai_client.py: chat, completions,
//! tools, errors; tests/responses_client.py: the Responses API) and `anthropic`
//! (tests/anthropic_client.py: the Messages API). Skipped, saying so, when python3 or the
//! packages cannot be had (set SAPIENT_REQUIRE_PYTHON=1 to fail instead).

mod common;

use anyhow::{bail, Context, Result};
use common::*;
use sapient_server::ServerOptions;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const OPENAI_VERSION: &str = "3.57.0";
const ANTHROPIC_VERSION: &str = "2.17.0";

fn skip(test: &str, why: &str) -> Result<()> {
    if std::env::var_os("SAPIENT_REQUIRE_PYTHON").is_some() {
        bail!("{why}");
    }
    eprintln!("SKIPPED {test}: {why}");
    Ok(())
}

/// The venv's python with `openai` and `anthropic` installed, or why not (made once, by one
/// test at a time).
fn venv() -> Result<PathBuf, String> {
    static MAKING: Mutex<()> = Mutex::new(());
    let _one = MAKING.lock().unwrap_or_else(|p| p.into_inner());
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("openai-venv");
    let py = dir.join("bin").join("python");
    let marker = dir.join(format!("openai-{OPENAI_VERSION}-anthropic-{ANTHROPIC_VERSION}"));
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
    if !py.exists() {
        run(Command::new("python3").args(["-m", "venv"]).arg(&dir))?;
    }
    let pins = [format!("openai=={OPENAI_VERSION}"), format!("anthropic=={ANTHROPIC_VERSION}")];
    run(Command::new(&py).args(["-m", "pip", "install", "-q", "--disable-pip-version-check"]).args(&pins))?;
    std::fs::write(&marker, b"").map_err(|e| e.to_string())?;
    Ok(py)
}

/// Start a server (an API key, a small queue and body limit) and run `script` against it
/// with `env` (`{addr}` in a value stands for the server's address); the script must end
/// by printing "ok" within 300 s.
fn run_script(test: &str, script: &str, env: &[(&str, &str)]) -> Result<()> {
    let py = match venv() {
        Ok(p) => p,
        Err(why) => return skip(test, &format!("no python3 venv with openai=={OPENAI_VERSION} and anthropic=={ANTHROPIC_VERSION}: {why}")),
    };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let key = "sk-sapient-test";
    let server = rt.block_on(start(ServerOptions { api_key: Some(key.into()), max_queue: 2, max_body_bytes: 64 << 10, ..ServerOptions::default() }))?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join(script);
    let mut cmd = Command::new(&py);
    cmd.arg(&script).env("MODEL", MODEL).stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v.replace("{addr}", &server.addr.to_string()).replace("{key}", key));
    }
    let mut child = cmd.spawn().context("starting python")?;
    let t = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if t.elapsed() > Duration::from_secs(300) {
            let _ = child.kill();
            bail!("{} ran over 300 s", script.display());
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let out = child.wait_with_output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    anyhow::ensure!(status.success() && stdout.trim_end().ends_with("ok"), "{} failed ({status})", script.display());
    drop(server);
    Ok(())
}

#[test]
fn openai_python_client() -> Result<()> {
    run_script("openai_python_client", "openai_client.py", &[("OPENAI_BASE_URL", "http://{addr}/v1"), ("OPENAI_API_KEY", "{key}")])
}

/// `/v1/responses` through `client.responses`.
#[test]
fn openai_python_client_responses() -> Result<()> {
    run_script("openai_python_client_responses", "responses_client.py", &[("OPENAI_BASE_URL", "http://{addr}/v1"), ("OPENAI_API_KEY", "{key}")])
}

/// `/v1/messages` through the official `anthropic` client.
#[test]
fn anthropic_python_client() -> Result<()> {
    run_script("anthropic_python_client", "anthropic_client.py", &[("ANTHROPIC_BASE_URL", "http://{addr}"), ("ANTHROPIC_API_KEY", "{key}")])
}
