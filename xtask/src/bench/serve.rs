//! `cargo xtask bench serve`: N concurrent streaming chat clients on loopback against
//! `sapient serve` (sapient-server in this process, the engine behind it) and against
//! llama.cpp's `llama-server` (`-np N` slots, the same GGUF) in the same run. Every request
//! asks for exactly `--max-tokens` tokens (`ignore_eos`, which both servers take), so both
//! do the same work. Reports time to first token p50/p99, inter-token latency p50/p99
//! (the gaps between streamed pieces), aggregate tokens/s and errors per level; JSON under
//! `target/bench/serve.json`.

use anyhow::{bail, Context, Result};
use sapient_generate::{Engine, EngineOptions, KvBudget, KvOptions, Pipeline, PipelineOptions};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(clap::Args)]
pub struct Args {
    /// The model (preset id or GGUF file; llama-server gets the same GGUF).
    #[arg(long, default_value = "qwen2.5-coder-0.5b-instruct")]
    pub preset: String,
    /// Concurrent clients per level.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1, 4, 16, 64])]
    pub clients: Vec<usize>,
    /// Requests each client sends, one after the other.
    #[arg(long, default_value_t = 2)]
    pub requests: usize,
    /// Tokens each request generates.
    #[arg(long, default_value_t = 64)]
    pub max_tokens: usize,
    /// A level stops sending new requests after this many seconds.
    #[arg(long, default_value_t = 240)]
    pub level_seconds: u64,
    /// llama.cpp's `llama-server` (skipped when missing).
    #[arg(long, default_value = "/tmp/llamacpp/build/bin/llama-server")]
    pub llama_server: PathBuf,
}

#[derive(Default, Debug)]
struct Level {
    ttft: Vec<f64>,
    itl: Vec<f64>,
    tokens: usize,
    pieces: usize,
    ok: usize,
    errors: usize,
    wall: f64,
    first_error: Option<String>,
}

fn pct(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    s[((p / 100.0) * (s.len() - 1) as f64).round() as usize]
}

const TOPICS: &[&str] = &["a lighthouse", "a robot", "the sea", "a city at night", "a lost key", "winter", "a garden", "a train", "the moon", "a violin", "a desert", "a river"];

/// One streamed chat request: (time to first piece, gaps between pieces, pieces) or an error.
async fn one(addr: SocketAddr, model: &str, i: usize, max_tokens: usize) -> Result<(f64, Vec<f64>, usize)> {
    let body = serde_json::json!({
        "model": model, "stream": true, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": true,
        "messages": [{"role": "user", "content": format!("Write a short story about {} (request {i}).", TOPICS[i % TOPICS.len()])}]
    })
    .to_string();
    let req = format!("POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len());
    let t0 = Instant::now();
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    s.write_all(req.as_bytes()).await?;
    let mut buf = Vec::new();
    let mut tmp = vec![0u8; 16384];
    let mut scanned = 0;
    let (mut first, mut last, mut gaps, mut pieces, mut done) = (None, None::<Instant>, Vec::new(), 0usize, false);
    loop {
        let n = s.read(&mut tmp).await?;
        if n == 0 {
            break;
        }
        let now = Instant::now();
        buf.extend_from_slice(&tmp[..n]);
        // Each SSE event in what arrived (chunked framing around it is skipped by the search).
        while let Some(p) = buf[scanned..].windows(6).position(|w| w == b"data: ") {
            let start = scanned + p + 6;
            let Some(end) = buf[start..].windows(2).position(|w| w == b"\n\n").map(|e| start + e) else { break };
            let ev = &buf[start..end];
            scanned = end;
            if ev == b"[DONE]" {
                done = true;
                continue;
            }
            let v: serde_json::Value = serde_json::from_slice(ev).with_context(|| format!("event {}", String::from_utf8_lossy(ev)))?;
            if v.get("error").is_some() {
                bail!("error event: {v}");
            }
            let has_text = v["choices"][0]["delta"]["content"].as_str().is_some_and(|c| !c.is_empty());
            if has_text {
                pieces += 1;
                if first.is_none() {
                    first = Some((now - t0).as_secs_f64());
                }
                if let Some(l) = last {
                    gaps.push((now - l).as_secs_f64());
                }
                last = Some(now);
            }
        }
    }
    let head = String::from_utf8_lossy(&buf[..buf.len().min(64)]).to_string();
    if !head.starts_with("HTTP/1.1 200") {
        bail!("status: {}", String::from_utf8_lossy(&buf[..buf.len().min(400)]));
    }
    if !done {
        bail!("the stream ended without [DONE]");
    }
    Ok((first.context("no text")?, gaps, pieces))
}

async fn level(addr: SocketAddr, model: &str, clients: usize, a: &Args) -> Level {
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(a.level_seconds);
    let mut tasks = Vec::new();
    for c in 0..clients {
        let model = model.to_string();
        let (requests, max_tokens) = (a.requests, a.max_tokens);
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            for r in 0..requests {
                if Instant::now() > deadline {
                    break;
                }
                out.push(one(addr, &model, c * requests + r, max_tokens).await);
            }
            out
        }));
    }
    let mut l = Level::default();
    for t in tasks {
        for r in t.await.unwrap_or_default() {
            match r {
                Ok((ttft, gaps, pieces)) => {
                    l.ok += 1;
                    l.ttft.push(ttft);
                    l.itl.extend(gaps);
                    l.pieces += pieces;
                    l.tokens += a.max_tokens;
                }
                Err(e) => {
                    l.errors += 1;
                    l.first_error.get_or_insert_with(|| format!("{e:#}"));
                }
            }
        }
    }
    l.wall = t0.elapsed().as_secs_f64();
    l
}

async fn wait_healthy(addr: SocketAddr, child: Option<&mut std::process::Child>) -> Result<()> {
    let t = Instant::now();
    let mut child = child;
    loop {
        if let Some(c) = child.as_deref_mut() {
            if let Some(s) = c.try_wait()? {
                bail!("the server exited: {s}");
            }
        }
        if let Ok(mut s) = tokio::net::TcpStream::connect(addr).await {
            let _ = s.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").await;
            let mut b = Vec::new();
            let _ = s.read_to_end(&mut b).await;
            if b.starts_with(b"HTTP/1.1 200") {
                return Ok(());
            }
        }
        if t.elapsed() > Duration::from_secs(120) {
            bail!("server at {addr} not healthy after 120 s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn row(name: &str, clients: usize, l: &Level) -> serde_json::Value {
    println!(
        "{name:12} {clients:>7} {:>6}/{:<3} {:>10.3} {:>10.3} {:>10.1} {:>10.1} {:>10.1}",
        l.ok,
        l.errors,
        pct(&l.ttft, 50.0),
        pct(&l.ttft, 99.0),
        1000.0 * pct(&l.itl, 50.0),
        1000.0 * pct(&l.itl, 99.0),
        l.tokens as f64 / l.wall.max(1e-9)
    );
    if let Some(e) = &l.first_error {
        println!("{:12} first error: {e}", "");
    }
    serde_json::json!({
        "server": name, "clients": clients, "ok": l.ok, "errors": l.errors, "wall_s": l.wall, "tokens": l.tokens, "pieces": l.pieces,
        "ttft_p50_s": pct(&l.ttft, 50.0), "ttft_p99_s": pct(&l.ttft, 99.0),
        "itl_p50_s": pct(&l.itl, 50.0), "itl_p99_s": pct(&l.itl, 99.0),
        "tokens_per_s": l.tokens as f64 / l.wall.max(1e-9)
    })
}

pub fn run(a: Args) -> Result<()> {
    let max_clients = a.clients.iter().copied().max().unwrap_or(1).max(1);
    let ctx_per = 256 + a.max_tokens;
    let pipe = Pipeline::load(&a.preset, PipelineOptions { max_seq_len: Some(4096), ..Default::default() }, |_| {})?;
    let gguf = pipe.info().path.clone();
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    println!("model: {} ({}), {} tokens per request, {} requests per client", a.preset, gguf.display(), a.max_tokens, a.requests);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    let mut results = Vec::new();
    println!("{:12} {:>7} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}", "server", "clients", "ok/err", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "tok/s");
    println!("{:12} {:>7} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}", "", "", "", "s", "s", "ms", "ms", "aggregate");
    // Ours: one server, every level.
    let engine = Engine::new(
        &pipe,
        EngineOptions { kv: KvOptions { block_size: 32, budget: KvBudget::Tokens(max_clients * ctx_per + 1024), ..KvOptions::default() }, max_seqs: max_clients, ..EngineOptions::default() },
    )?;
    let server = sapient_server::Server::new(sapient_server::ServerOptions { max_queue: max_clients * 2, ..Default::default() });
    let addr = rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(server.clone().serve(listener, std::future::pending()));
        anyhow::Ok(addr)
    })?;
    server.set_models(sapient_server::Models { llms: vec![sapient_server::Llm::new("bench", engine)], ..Default::default() })?;
    let has_llama = a.llama_server.exists();
    if !has_llama {
        println!("({} not found: llama-server skipped)", a.llama_server.display());
    }
    for &n in &a.clients {
        // Warm-up request (the first use builds caches), not counted.
        let _ = rt.block_on(one(addr, "bench", 999, 4));
        let l = rt.block_on(level(addr, "bench", n, &a));
        results.push(row("sapient", n, &l));
        if has_llama {
            let port = free_port()?;
            let mut child = std::process::Command::new(&a.llama_server)
                .arg("-m")
                .arg(&gguf)
                .args(["--host", "127.0.0.1", "--port", &port.to_string(), "-np", &n.to_string(), "-c", &(n * ctx_per).to_string(), "-t", &threads.to_string(), "--no-webui"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .with_context(|| format!("starting {}", a.llama_server.display()))?;
            let laddr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
            let r = rt.block_on(async {
                wait_healthy(laddr, Some(&mut child)).await?;
                let _ = one(laddr, "bench", 999, 4).await;
                anyhow::Ok(level(laddr, "bench", n, &a).await)
            });
            let _ = child.kill();
            let _ = child.wait();
            let l = r?;
            results.push(row("llama-server", n, &l));
        }
    }
    let out = PathBuf::from("target/bench");
    std::fs::create_dir_all(&out)?;
    let json = serde_json::json!({"machine": super::machine(), "preset": a.preset, "max_tokens": a.max_tokens, "requests_per_client": a.requests, "rows": results});
    std::fs::write(out.join("serve.json"), serde_json::to_string_pretty(&json)?)?;
    println!("(written to target/bench/serve.json)");
    Ok(())
}
