//! The server driven by the official Python clients, installed from PyPI into a venv under
//! the target directory on first run: `openai` (tests/openai_client.py: chat, completions,
//! tools, errors; tests/responses_client.py: the Responses API) and `anthropic`
//! (tests/anthropic_client.py: the Messages API). Skipped, saying so, when python3 or the
//! packages cannot be had (set SAPIENT_REQUIRE_PYTHON=1 to fail instead).

mod common;

use anyhow::Result;
use common::*;
use sapient_server::ServerOptions;
use std::path::PathBuf;

const OPENAI_VERSION: &str = "3.57.0";
const ANTHROPIC_VERSION: &str = "2.17.0";

/// The venv's python with `openai` and `anthropic` installed, or why not.
fn venv() -> Result<PathBuf, String> {
    python_venv("openai-venv", &[format!("openai=={OPENAI_VERSION}"), format!("anthropic=={ANTHROPIC_VERSION}")])
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
    let env: Vec<(&str, String)> = env.iter().map(|(k, v)| (*k, v.replace("{addr}", &server.addr.to_string()).replace("{key}", key))).collect();
    run_python(&py, script, &env)?;
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
