//! A test server on 127.0.0.1 port 0 with SmolLM2, and a minimal HTTP/1.1 client (no client
//! library: what goes over the wire is exactly what the test writes).

#![allow(dead_code)]

use anyhow::{bail, ensure, Context, Result};
use sapient_generate::{Engine, EngineOptions, KvBudget, KvOptions, Pipeline, PipelineOptions};
use sapient_server::{Llm, Models, Server, ServerOptions};
use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub const MODEL: &str = "smollm2-135m-instruct";

pub fn pipeline() -> &'static Pipeline {
    static P: OnceLock<Pipeline> = OnceLock::new();
    P.get_or_init(|| Pipeline::load(MODEL, PipelineOptions { max_seq_len: Some(2048), ..Default::default() }, |_| {}).expect("SmolLM2 loads"))
}

pub struct TestServer {
    pub addr: SocketAddr,
    pub server: Server,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

pub async fn start(opts: ServerOptions) -> Result<TestServer> {
    start_with(pipeline(), opts).await
}

/// [`start`] on another pipeline (e.g. one loaded with another chat template).
pub async fn start_with(pipeline: &Pipeline, opts: ServerOptions) -> Result<TestServer> {
    let engine = Engine::new(pipeline, EngineOptions { kv: KvOptions { block_size: 16, budget: KvBudget::Tokens(8192), ..KvOptions::default() }, ..EngineOptions::default() })?;
    let server = Server::new(opts);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server.clone().serve(listener, async move {
        let _ = rx.await;
    }));
    server.set_models(Models { llms: vec![Llm::new(MODEL, engine)], ..Models::default() })?;
    Ok(TestServer { addr, server, stop: Some(stop) })
}

pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn json(&self) -> Result<serde_json::Value> {
        serde_json::from_slice(&self.body).with_context(|| format!("body is not JSON: {}", String::from_utf8_lossy(&self.body)))
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
    /// The `data:` payloads of a server-sent event stream.
    pub fn events(&self) -> Vec<String> {
        self.text().split("\n\n").filter_map(|e| e.strip_prefix("data: ")).map(str::to_string).collect()
    }
}

pub fn request_bytes(method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut r = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    if !body.is_empty() && !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("content-type")) {
        r.push_str("Content-Type: application/json\r\n");
    }
    for (k, v) in headers {
        r.push_str(&format!("{k}: {v}\r\n"));
    }
    r.push_str("\r\n");
    let mut b = r.into_bytes();
    b.extend_from_slice(body);
    b
}

pub async fn send(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Result<Reply> {
    let mut s = TcpStream::connect(addr).await?;
    s.write_all(&request_bytes(method, path, headers, body)).await?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await?;
    parse_reply(&raw)
}

/// A multipart form (what `/v1/audio/transcriptions` takes): the fields, then the file;
/// returns the content type and the body.
pub fn multipart(fields: &[(&str, &str)], file: &[u8]) -> (String, Vec<u8>) {
    let boundary = "sapientboundary7MA4YWxkTrZu0gW";
    let mut b = Vec::new();
    for (k, v) in fields {
        b.extend_from_slice(format!("--{boundary}\r\nContent-Disposition: form-data; name=\"{k}\"\r\n\r\n{v}\r\n").as_bytes());
    }
    b.extend_from_slice(format!("--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"speech.wav\"\r\nContent-Type: audio/wav\r\n\r\n").as_bytes());
    b.extend_from_slice(file);
    b.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), b)
}

pub async fn post(addr: SocketAddr, path: &str, body: &serde_json::Value) -> Result<Reply> {
    send(addr, "POST", path, &[], body.to_string().as_bytes()).await
}

pub async fn get(addr: SocketAddr, path: &str) -> Result<Reply> {
    send(addr, "GET", path, &[], b"").await
}

pub fn parse_reply(raw: &[u8]) -> Result<Reply> {
    let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") else { bail!("no header end in {:?}", String::from_utf8_lossy(raw)) };
    let head = std::str::from_utf8(&raw[..end])?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().context("no status line")?;
    let status: u16 = status_line.split(' ').nth(1).context("no status")?.parse()?;
    let headers: Vec<(String, String)> = lines.filter_map(|l| l.split_once(':')).map(|(k, v)| (k.trim().to_string(), v.trim().to_string())).collect();
    let rest = &raw[end + 4..];
    let chunked = headers.iter().any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    let body = if chunked { dechunk(rest)? } else { rest.to_vec() };
    Ok(Reply { status, headers, body })
}

fn dechunk(mut b: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let Some(nl) = b.windows(2).position(|w| w == b"\r\n") else { return Ok(out) };
        let size = usize::from_str_radix(std::str::from_utf8(&b[..nl])?.split(';').next().unwrap_or("").trim(), 16)?;
        b = &b[nl + 2..];
        if size == 0 {
            return Ok(out);
        }
        anyhow::ensure!(b.len() >= size, "truncated chunk");
        out.extend_from_slice(&b[..size]);
        b = &b[(size + 2).min(b.len())..];
    }
}

/// The value of a metric line `name{labels} value` (the first line whose name matches).
pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (k, v) = l.rsplit_once(' ')?;
        let n = k.split('{').next()?;
        (n == name).then(|| v.parse().ok()).flatten()
    })
}

/// Wait until the engines run, queue and hold nothing (within 30 s); returns the metrics text.
pub async fn wait_idle(addr: SocketAddr) -> Result<String> {
    let t = Instant::now();
    loop {
        let m = get(addr, "/metrics").await?.text();
        let running = metric(&m, "sapient:num_requests_running");
        let used = metric(&m, "sapient:kv_cache_blocks_used");
        let waiting = metric(&m, "sapient:num_requests_waiting");
        if running == Some(0.0) && used == Some(0.0) && waiting == Some(0.0) {
            return Ok(m);
        }
        ensure!(t.elapsed() < Duration::from_secs(30), "not idle after 30 s: running {running:?} waiting {waiting:?} blocks {used:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Skip a test that needs Python, saying why (or fail with SAPIENT_REQUIRE_PYTHON=1).
pub fn skip(test: &str, why: &str) -> Result<()> {
    if std::env::var_os("SAPIENT_REQUIRE_PYTHON").is_some() {
        bail!("{why}");
    }
    eprintln!("SKIPPED {test}: {why}");
    Ok(())
}

/// A venv under the target directory (`dir`) with the pinned packages installed, made once
/// (one test at a time); its python, or why not.
pub fn python_venv(dir: &str, pins: &[String]) -> Result<std::path::PathBuf, String> {
    use std::process::Command;
    static MAKING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = MAKING.lock().unwrap_or_else(|p| p.into_inner());
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(dir);
    let py = dir.join("bin").join("python");
    let marker = dir.join(pins.join("-"));
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
    run(Command::new(&py).args(["-m", "pip", "install", "-q", "--disable-pip-version-check"]).args(pins))?;
    std::fs::write(&marker, b"").map_err(|e| e.to_string())?;
    Ok(py)
}

/// Run `tests/{script}` with `py` and `env` (and `MODEL`); it must end by printing "ok"
/// within 300 s.
pub fn run_python(py: &std::path::Path, script: &str, env: &[(&str, String)]) -> Result<()> {
    use std::process::{Command, Stdio};
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join(script);
    let mut cmd = Command::new(py);
    cmd.arg(&script).env("MODEL", MODEL).stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
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
    ensure!(status.success() && stdout.trim_end().ends_with("ok"), "{} failed ({status})", script.display());
    Ok(())
}
