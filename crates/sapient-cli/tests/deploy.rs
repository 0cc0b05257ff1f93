//! The container and Kubernetes example (deploy/) against the real binary: the Dockerfile's
//! Rust release is rust-toolchain.toml's; its command and the Deployment's arguments (with
//! the ConfigMap's `serve.toml`) start `sapient serve` as written (every flag exists, the
//! file's keys are accepted), reading the API key from `SAPIENT_API_KEY` as the Secret sets
//! it; the port exposed, probed and served is the one the server listens on; the Dockerfile's
//! HEALTHCHECK command and the probes' `/health` answer once the models are loaded; and
//! SIGTERM (what `docker stop` and Kubernetes send) stops the server cleanly. No container
//! runtime is needed: only the files and the binary are checked.

#[path = "../../sapient-server/tests/common/mod.rs"]
mod common;
mod process;

use anyhow::{bail, ensure, Context, Result};
use common::{get, send};
use process::{listening, sapient, spawn, wait_ready, Proc};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const KEY: &str = "deploy-test-key";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(rel: &str) -> Result<String> {
    std::fs::read_to_string(root().join(rel)).with_context(|| rel.to_string())
}

/// A Dockerfile instruction's arguments (continuation lines joined), each time it appears.
fn instructions(dockerfile: &str, name: &str) -> Vec<String> {
    // Whole instructions first: continuation lines joined, comments dropped.
    let mut all: Vec<String> = Vec::new();
    let mut open = false;
    for line in dockerfile.lines() {
        let t = line.trim();
        if t.starts_with('#') || t.is_empty() {
            continue;
        }
        let (text, more) = match t.strip_suffix('\\') {
            Some(s) => (s.trim(), true),
            None => (t, false),
        };
        match all.last_mut() {
            Some(last) if open => {
                last.push(' ');
                last.push_str(text);
            }
            _ => all.push(text.to_string()),
        }
        open = more;
    }
    all.iter()
        .filter_map(|i| i.split_once(char::is_whitespace).filter(|(w, _)| w.eq_ignore_ascii_case(name)).map(|(_, rest)| rest.trim().to_string()))
        .collect()
}

/// The one `name` instruction, in JSON (exec) form.
fn exec_form(dockerfile: &str, name: &str) -> Result<Vec<String>> {
    let all = instructions(dockerfile, name);
    ensure!(all.len() == 1, "one {name} in the Dockerfile, found {}", all.len());
    serde_json::from_str(&all[0]).with_context(|| format!("{name} in JSON form: {}", all[0]))
}

/// The value after `flag` in `args`.
fn flag<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).map(String::as_str)
}

/// `args` with the value after `flag` replaced.
fn with_flag(args: &[String], name: &str, value: &str) -> Vec<String> {
    let mut out = args.to_vec();
    if let Some(i) = out.iter().position(|a| a == name) {
        out[i + 1] = value.to_string();
    }
    out
}

/// `sapient ARGS` with the API key in the environment; the port it listens on.
fn start(args: &[String]) -> Result<(Proc, SocketAddr)> {
    let mut cmd = sapient();
    cmd.args(args).env("SAPIENT_API_KEY", KEY);
    let (p, rx) = spawn(cmd)?;
    let a = listening(&rx, Duration::from_secs(60), |line| {
        ensure!(!line.contains("warning: serving on"), "the API key from SAPIENT_API_KEY was not taken: {line}");
        Ok(())
    })?;
    ensure!(a.ip().is_unspecified(), "the container must listen on every address, got {a}");
    Ok((p, SocketAddr::from(([127, 0, 0, 1], a.port()))))
}

/// The key guards the API (`/health` stays open for probes): the models served.
async fn key_required(addr: SocketAddr) -> Result<Vec<String>> {
    let r = get(addr, "/v1/models").await?;
    ensure!(r.status == 401, "without the key: {} {}", r.status, r.text());
    let bearer = format!("Bearer {KEY}");
    let r = send(addr, "GET", "/metrics", &[("Authorization", bearer.as_str())], b"").await?;
    ensure!(r.status == 200 && r.text().contains("sapient:num_requests_waiting"), "metrics for the inference extension: {}", r.text());
    let r = send(addr, "GET", "/v1/models", &[("Authorization", bearer.as_str())], b"").await?;
    ensure!(r.status == 200, "with the key: {} {}", r.status, r.text());
    Ok(r.json()?["data"].as_array().context("data")?.iter().filter_map(|m| m["id"].as_str().map(String::from)).collect())
}

/// SIGTERM, as `docker stop` and Kubernetes send it: the server stops, successfully.
fn terminate(mut p: Proc) -> Result<()> {
    let pid = p.0.id().to_string();
    ensure!(Command::new("kill").args(["-TERM", &pid]).status()?.success(), "kill -TERM {pid}");
    let t = Instant::now();
    loop {
        if let Some(status) = p.0.try_wait()? {
            ensure!(status.success(), "after SIGTERM the server exited with {status}");
            return Ok(());
        }
        if t.elapsed() > Duration::from_secs(20) {
            bail!("the server did not stop within 20 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dockerfile_and_kubernetes_example_run_as_written() -> Result<()> {
    tokio::time::timeout(Duration::from_secs(300), async {
        let docker = read("deploy/Dockerfile")?;
        let toolchain = read("rust-toolchain.toml")?;
        let channel = toolchain.lines().find_map(|l| l.trim().strip_prefix("channel").map(|v| v.trim_start_matches([' ', '=']).trim().trim_matches('"').to_string())).context("channel")?;
        ensure!(instructions(&docker, "ARG").iter().any(|a| *a == format!("RUST_VERSION={channel}")), "the Dockerfile builds with Rust {channel}");
        ensure!(read(".dockerignore")?.lines().any(|l| l.trim() == "target"), ".dockerignore keeps target/ out of the build context");
        let user = instructions(&docker, "USER").pop().context("USER")?;
        ensure!(!["root", "0", "0:0"].contains(&user.as_str()), "a non-root user, got {user}");
        let home = instructions(&docker, "ENV").iter().find_map(|e| e.split_whitespace().find_map(|kv| kv.strip_prefix("SAPIENT_HOME=").map(String::from))).context("SAPIENT_HOME")?;
        ensure!(instructions(&docker, "VOLUME").iter().any(|v| v.split_whitespace().any(|p| p.trim_matches(['[', ']', '"']) == home)), "SAPIENT_HOME {home} is a volume");
        let entry = exec_form(&docker, "ENTRYPOINT")?;
        let cmd = exec_form(&docker, "CMD")?;
        ensure!(entry == ["sapient"], "{entry:?}");
        let port = flag(&cmd, "--port").context("--port in CMD")?.to_string();
        ensure!(flag(&cmd, "--host") == Some("0.0.0.0"), "{cmd:?}");
        ensure!(instructions(&docker, "EXPOSE") == [port.clone()], "EXPOSE {port}");
        let health = instructions(&docker, "HEALTHCHECK").pop().context("HEALTHCHECK")?;
        let health: Vec<String> = serde_json::from_str(health.split_once(" CMD ").context("HEALTHCHECK ... CMD [...]")?.1.trim())?;
        let url = format!("http://127.0.0.1:{port}/health");
        ensure!(health.iter().any(|a| a.contains(&url)), "HEALTHCHECK asks {url}: {health:?}");

        // The image's command (on a free port).
        let (p, addr) = start(&with_flag(&cmd, "--port", "0"))?;
        wait_ready(addr, "/health").await?;
        let check: Vec<String> = health.iter().map(|a| a.replace(&format!(":{port}/"), &format!(":{}/", addr.port()))).collect();
        let out = Command::new(&check[0]).args(&check[1..]).output().with_context(|| format!("{check:?}"))?;
        ensure!(out.status.success(), "the HEALTHCHECK command fails on a ready server: {}", String::from_utf8_lossy(&out.stderr));
        ensure!(key_required(addr).await? == ["smollm2-135m-instruct"]);
        terminate(p)?;

        // The Deployment's arguments with the ConfigMap's file.
        let deployment = read("deploy/k8s/deployment.yaml")?;
        let args: Vec<String> = serde_json::from_str(deployment.lines().find_map(|l| l.trim().strip_prefix("args:")).context("args")?.trim())?;
        ensure!(deployment.contains(&format!("containerPort: {}", flag(&args, "--port").context("--port in args")?)), "the container port is the one served");
        ensure!(flag(&args, "--port") == Some(port.as_str()), "the Deployment and the image serve the same port");
        ensure!(deployment.matches("path: /health").count() == 3, "startup, readiness and liveness probes on /health");
        ensure!(deployment.contains("name: SAPIENT_API_KEY") && deployment.contains(&format!("mountPath: {home}")), "the key from a Secret, the model cache at {home}");
        let configmap = read("deploy/k8s/configmap.yaml")?;
        let mut lines = configmap.lines().skip_while(|l| !l.trim_start().starts_with("serve.toml: |"));
        let indent = lines.next().map(|l| l.len() - l.trim_start().len()).context("serve.toml in the ConfigMap")?;
        let toml: String = lines.take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() > indent).map(|l| format!("{}\n", l.trim())).collect();
        let dir = tempfile::tempdir()?;
        let file = dir.path().join("serve.toml");
        std::fs::write(&file, toml)?;
        let config_path = flag(&args, "--config").context("--config")?;
        ensure!(deployment.contains(&format!("mountPath: {}", Path::new(config_path).parent().context("dir")?.display())), "the ConfigMap is mounted where --config reads");
        let args = with_flag(&with_flag(&args, "--config", file.to_str().context("path")?), "--port", "0");
        let (p, addr) = start(&args)?;
        wait_ready(addr, "/health").await?;
        ensure!(key_required(addr).await? == ["smollm2", "all-minilm-l6-v2"]);
        terminate(p)?;
        eprintln!("the image's command and the Deployment's arguments served on every address with the key, ready on /health, stopped by SIGTERM");
        Ok(())
    })
    .await?
}
