//! `sapient serve` as a process on 127.0.0.1: models and settings from a `--config` file, and
//! scale-out, two replicas behind a stock reverse proxy (nginx, Debian's `nginx-light`). Requests through the proxy, whole and streamed, are spread
//! over both replicas and all succeed; with one replica stopped, the proxy sends everything to
//! the other and requests still succeed (replicas keep no state a request depends on).
//! Bounded in requests and time; loopback only. Needs nginx (`SAPIENT_NGINX`, else `nginx` on
//! the PATH or /usr/sbin/nginx); without it the test says so and passes.

#[path = "../../sapient-server/tests/common/mod.rs"]
mod common;
mod process;

use anyhow::{ensure, Context, Result};
use common::{get, metric, post};
use process::{listening, sapient, spawn, wait_ready, Proc};
use serde_json::json;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

const MODEL: &str = "smollm2-135m-instruct";

fn nginx() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("SAPIENT_NGINX") {
        return Some(p.into());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin")])
        .map(|d| d.join("nginx"))
        .find(|p| p.is_file())
}

/// A replica on a free port; its address once it listens.
fn replica() -> Result<(Proc, SocketAddr)> {
    serve(&["--model", MODEL, "--ctx", "1024", "--kv-tokens", "4096", "--max-seqs", "8", "--max-tokens-limit", "64"])
}

/// `sapient serve --host 127.0.0.1 --port 0` with `args`; its address once it listens.
fn serve(args: &[&str]) -> Result<(Proc, SocketAddr)> {
    let mut cmd = sapient();
    cmd.args(["serve", "--host", "127.0.0.1", "--port", "0"]).args(args);
    let (p, rx) = spawn(cmd)?;
    let addr = listening(&rx, Duration::from_secs(60), |_| Ok(()))?;
    Ok((p, addr))
}

/// `n` requests through `addr`, `par` at a time, half of them streamed; every one must be a
/// 200 with an answer.
async fn load(addr: SocketAddr, n: usize, par: usize) -> Result<()> {
    let mut left = (0..n).collect::<Vec<_>>();
    while !left.is_empty() {
        let batch: Vec<usize> = left.drain(..par.min(left.len())).collect();
        let tasks: Vec<_> = batch
            .into_iter()
            .map(|i| {
                tokio::spawn(async move {
                    let stream = i % 2 == 1;
                    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": format!("Give me one word that rhymes with cat ({i}).")}], "max_tokens": 12, "stream": stream, "seed": i});
                    let r = post(addr, "/v1/chat/completions", &body).await?;
                    ensure!(r.status == 200, "request {i}: {} {}", r.status, r.text());
                    if stream {
                        let ev = r.events();
                        ensure!(ev.last().map(String::as_str) == Some("[DONE]") && ev.len() > 2, "request {i}: {ev:?}");
                    } else {
                        let v = r.json()?;
                        ensure!(v["choices"][0]["message"]["content"].is_string(), "request {i}: {v}");
                    }
                    Ok(())
                })
            })
            .collect();
        for t in tasks {
            t.await??;
        }
    }
    Ok(())
}

async fn answered(addr: SocketAddr) -> Result<f64> {
    let m = get(addr, "/metrics").await?.text();
    Ok(m.lines()
        .filter(|l| l.starts_with("sapient:generation_requests_total") && l.contains("ok"))
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
        .sum::<f64>()
        .max(metric(&m, "sapient:requests_finished_total").unwrap_or(0.0)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_behind_nginx() -> Result<()> {
    let Some(nginx) = nginx() else {
        eprintln!("skipped: no nginx (apt-get install nginx-light, or set SAPIENT_NGINX)");
        return Ok(());
    };
    tokio::time::timeout(Duration::from_secs(300), async {
        let (a, a_addr) = replica()?;
        let (_b, b_addr) = replica()?;
        wait_ready(a_addr, "/health").await?;
        wait_ready(b_addr, "/health").await?;
        let dir = tempfile::tempdir()?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let d = dir.path().display();
        let conf = format!(
            "worker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log;\nevents {{ worker_connections 256; }}\nhttp {{\n  access_log off;\n  \
             client_body_temp_path {d}/body; proxy_temp_path {d}/proxy; fastcgi_temp_path {d}/fcgi; uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;\n  \
             upstream sapient {{ server {a_addr} max_fails=1 fail_timeout=30s; server {b_addr} max_fails=1 fail_timeout=30s; }}\n  \
             server {{\n    listen 127.0.0.1:{port};\n    location / {{\n      proxy_pass http://sapient;\n      proxy_http_version 1.1;\n      \
             proxy_buffering off;\n      proxy_read_timeout 120s;\n    }}\n  }}\n}}\n"
        );
        std::fs::write(dir.path().join("nginx.conf"), conf)?;
        let proxy = Proc(
            Command::new(&nginx)
                .arg("-p")
                .arg(dir.path())
                .arg("-c")
                .arg(dir.path().join("nginx.conf"))
                .args(["-g", "daemon off; master_process off;"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("starting nginx")?,
        );
        let p_addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
        wait_ready(p_addr, "/health").await?;

        load(p_addr, 24, 6).await?;
        let (na, nb) = (answered(a_addr).await?, answered(b_addr).await?);
        ensure!(na > 0.0 && nb > 0.0, "the proxy spreads requests over both replicas: {na} and {nb}");
        eprintln!("through nginx: 24 requests, {na} answered by one replica and {nb} by the other");

        // One replica goes away: the other answers everything.
        drop(a);
        load(p_addr, 8, 4).await?;
        let nb2 = answered(b_addr).await?;
        ensure!(nb2 >= nb + 8.0, "the remaining replica took over: {nb} -> {nb2}");
        drop(proxy);
        Ok(())
    })
    .await?
}

/// `--config`: named models of two kinds from a TOML file, its settings applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_and_settings_from_a_config_file() -> Result<()> {
    tokio::time::timeout(Duration::from_secs(300), async {
        let dir = tempfile::tempdir()?;
        let file = dir.path().join("models.toml");
        std::fs::write(
            &file,
            format!("max_tokens_limit = 5\nkv_tokens = 4096\n[[llm]]\nmodel = \"{MODEL}\"\nname = \"chat\"\n[[embedding]]\nmodel = \"all-minilm-l6-v2\"\nname = \"emb\"\n"),
        )?;
        let (_p, addr) = serve(&["--config", file.to_str().context("path")?])?;
        wait_ready(addr, "/health").await?;
        let ids: Vec<String> = get(addr, "/v1/models").await?.json()?["data"].as_array().context("data")?.iter().filter_map(|m| m["id"].as_str().map(String::from)).collect();
        ensure!(ids == ["chat", "emb"], "{ids:?}");
        let r = post(addr, "/v1/chat/completions", &json!({"model": "chat", "messages": [{"role": "user", "content": "Count to twenty."}], "max_tokens": 50})).await?.json()?;
        ensure!(r["usage"]["completion_tokens"].as_u64().is_some_and(|n| n <= 5), "max_tokens_limit from the file caps the answer: {r}");
        let e = post(addr, "/v1/embeddings", &json!({"model": "emb", "input": "hello"})).await?.json()?;
        ensure!(e["data"][0]["embedding"].as_array().map(Vec::len) == Some(384), "{e}");
        // A file with a typo is refused at start, naming it.
        std::fs::write(&file, "max_tokenz = 5\n")?;
        let out = sapient().args(["serve", "--port", "0", "--config"]).arg(&file).output()?;
        let err = String::from_utf8_lossy(&out.stderr);
        ensure!(!out.status.success() && err.contains("max_tokenz"), "{err}");
        Ok(())
    })
    .await?
}
