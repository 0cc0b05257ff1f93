//! Language models loaded on demand, on 127.0.0.1 (port 0): two forms of SmolLM2-135M (the
//! cached GGUF, and a copy whose chat template names the assistant differently, so that the
//! two answer differently) under a memory budget that holds one of them. Alternating requests
//! are all answered as each model's own pipeline answers them, with loads and unloads counted
//! in `/metrics`; then concurrent requests for both, `POST /models/load` and `/models/unload`,
//! a file that fails to load, a model over the budget and a load slower than the wait.

mod common;

use anyhow::{ensure, Context, Result};
use common::*;
use sapient_generate::{EngineOptions, GenerationConfig, KvBudget, KvOptions, Message, Pipeline, PipelineOptions};
use sapient_server::{LlmSource, LoadOptions, Models, Server, ServerOptions};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(400);
const PROMPTS: [&str; 3] = ["What is your name?", "Who trained you?", "Name a primary color."];
const MAX_TOKENS: usize = 12;

/// The two model files: the cached GGUF, and a copy whose default system prompt says
/// "Parrot" where the original says "SmolLM" (same length: every offset stays valid).
fn model_files() -> Result<(PathBuf, PathBuf)> {
    static FILES: std::sync::OnceLock<Result<(PathBuf, PathBuf), String>> = std::sync::OnceLock::new();
    FILES.get_or_init(|| write_model_files().map_err(|e| format!("{e:#}"))).clone().map_err(anyhow::Error::msg)
}

fn write_model_files() -> Result<(PathBuf, PathBuf)> {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("router-models");
    std::fs::create_dir_all(&dir)?;
    let src = sapient_hub::Hub::new()?.resolve(MODEL, &mut |_| {})?.file("gguf")?.to_path_buf();
    let bytes = std::fs::read(&src)?;
    let (from, to) = (&b"named SmolLM, trained"[..], &b"named Parrot, trained"[..]);
    let at = bytes.windows(from.len()).position(|w| w == from).context("the chat template's default system prompt")?;
    let mut other = bytes.clone();
    other[at..at + to.len()].copy_from_slice(to);
    let (a, b) = (dir.join("smol-a.gguf"), dir.join("smol-b.gguf"));
    std::fs::write(&a, &bytes)?;
    std::fs::write(&b, &other)?;
    Ok((a, b))
}

fn load_options(budget: Option<u64>, timeout: Duration) -> LoadOptions {
    LoadOptions {
        budget_bytes: budget,
        load_timeout: timeout,
        pipeline: PipelineOptions { max_seq_len: Some(2048), ..Default::default() },
        engine: EngineOptions { kv: KvOptions { block_size: 16, budget: KvBudget::Tokens(4096), ..KvOptions::default() }, ..EngineOptions::default() },
    }
}

async fn serve(sources: Vec<LlmSource>, load: LoadOptions) -> Result<(SocketAddr, tokio::sync::oneshot::Sender<()>)> {
    let server = Server::new(ServerOptions::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server.clone().serve(listener, async move {
        let _ = rx.await;
    }));
    server.set_models(Models { on_demand: sources, load, ..Models::default() })?;
    Ok((addr, stop))
}

fn source(id: &str, path: &std::path::Path) -> LlmSource {
    LlmSource { id: id.into(), reference: path.to_string_lossy().into_owned() }
}

async fn ask(addr: SocketAddr, model: &str, prompt: &str) -> Result<String> {
    let req = json!({"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": MAX_TOKENS, "temperature": 0});
    let r = post(addr, "/v1/chat/completions", &req).await?;
    ensure!(r.status == 200, "{model}: {} {}", r.status, r.text());
    let v = r.json()?;
    ensure!(v["model"] == model, "{v}");
    Ok(v["choices"][0]["message"]["content"].as_str().context("content")?.to_string())
}

/// Each model's status in `/v1/models`, by id.
async fn statuses(addr: SocketAddr) -> Result<Vec<(String, Value)>> {
    let v = get(addr, "/v1/models").await?.json()?;
    let data = v["data"].as_array().context("data")?;
    Ok(data.iter().map(|m| (m["id"].as_str().unwrap_or_default().to_string(), m.clone())).collect())
}

fn labelled(metrics: &str, name: &str, model: &str) -> Option<f64> {
    let prefix = format!("{name}{{model_name=\"{model}\"");
    metrics.lines().find(|l| l.starts_with(&prefix)).and_then(|l| l.rsplit_once(' ')).and_then(|(_, v)| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_for_one_of_two_models_serves_both_in_turn() -> Result<()> {
    tokio::time::timeout(LIMIT, async {
        let (a, b) = model_files()?;
        // What each model answers on its own, greedily.
        let mut want = Vec::new();
        for path in [&a, &b] {
            let pipe = Pipeline::load(&path.to_string_lossy(), PipelineOptions { max_seq_len: Some(2048), ..Default::default() }, |_| {})?;
            let mut answers = Vec::new();
            for p in PROMPTS {
                answers.push(pipe.chat(&[Message::user(p)], &GenerationConfig::default().max_tokens(MAX_TOKENS))?.text);
            }
            want.push(answers);
        }
        ensure!(want[0] != want[1], "the two models must answer differently for the test to tell them apart: {want:?}");

        let budget = 300 << 20;
        let (addr, _stop) = serve(vec![source("smol-a", &a), source("smol-b", &b)], load_options(Some(budget), Duration::from_secs(120))).await?;
        ensure!(get(addr, "/health").await?.status == 200, "ready before any model loads");
        let listed = statuses(addr).await?;
        ensure!(listed.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>() == ["smol-a", "smol-b"], "{listed:?}");
        ensure!(listed.iter().all(|(_, m)| m["status"]["value"] == "unloaded"), "{listed:?}");

        let models = ["smol-a", "smol-b"];
        for i in 0..20 {
            let (m, p) = (i % 2, (i / 2) % PROMPTS.len());
            let got = ask(addr, models[m], PROMPTS[p]).await?;
            ensure!(got == want[m][p], "request {i} to {}: {got:?}, its pipeline says {:?}", models[m], want[m][p]);
            let listed = statuses(addr).await?;
            let loaded: Vec<&str> = listed.iter().filter(|(_, v)| v["status"]["value"] == "loaded").map(|(id, _)| id.as_str()).collect();
            ensure!(loaded == [models[m]], "after request {i}: loaded {loaded:?}");
            let mem = listed[m].1["memory_bytes"].as_u64().context("memory_bytes of a loaded model")?;
            ensure!(mem <= budget && 2 * mem > budget, "the budget holds one model and not two: {mem} of {budget}");
        }
        let text = get(addr, "/metrics").await?.text();
        for (model, unloads) in [("smol-a", 10.0), ("smol-b", 9.0)] {
            ensure!(labelled(&text, "sapient:model_loads_total", model) == Some(10.0), "loads of {model}:\n{text}");
            ensure!(labelled(&text, "sapient:model_unloads_total", model) == Some(unloads), "unloads of {model}:\n{text}");
            ensure!(labelled(&text, "sapient:generation_requests_total", model) == Some(10.0), "requests of {model}:\n{text}");
        }
        ensure!(labelled(&text, "sapient:model_loaded", "smol-b") == Some(1.0) && labelled(&text, "sapient:model_loaded", "smol-a") == Some(0.0), "{text}");
        ensure!(metric(&text, "sapient:models_budget_bytes") == Some(budget as f64), "{text}");
        let families: Vec<&str> = text.lines().filter(|l| l.starts_with("# TYPE ")).collect();
        let unique: std::collections::HashSet<&&str> = families.iter().collect();
        ensure!(unique.len() == families.len(), "a metric family is declared twice:\n{text}");

        // Requests for both at once: those for the other model wait until the first model's
        // are done, then it is swapped in; all are answered.
        let jobs: Vec<_> = (0..6).map(|i| tokio::spawn(async move { (i, ask(addr, models[i % 2], PROMPTS[0]).await) })).collect();
        for j in jobs {
            let (i, got) = j.await?;
            ensure!(got? == want[i % 2][0], "concurrent request {i}");
        }

        // By hand, in llama-server's router shapes.
        let loaded = statuses(addr).await?.into_iter().find(|(_, v)| v["status"]["value"] == "loaded").context("one model loaded")?.0;
        let r = post(addr, "/models/unload", &json!({"model": loaded})).await?;
        ensure!(r.status == 200 && r.json()? == json!({"success": true}), "{}", r.text());
        ensure!(statuses(addr).await?.iter().all(|(_, v)| v["status"]["value"] == "unloaded"), "nothing loaded after the unload");
        let r = post(addr, "/models/unload", &json!({"model": loaded})).await?;
        ensure!(r.status == 400 && r.text().contains("is not loaded"), "{} {}", r.status, r.text());
        let r = post(addr, "/models/load", &json!({"model": "smol-a"})).await?;
        ensure!(r.status == 200 && r.json()? == json!({"success": true}), "{}", r.text());
        ensure!(statuses(addr).await?[0].1["status"]["value"] == "loaded", "smol-a loaded by hand");
        let r = post(addr, "/models/load", &json!({"model": "smol-c"})).await?;
        ensure!(r.status == 404 && r.text().contains("smol-a, smol-b"), "{} {}", r.status, r.text());
        let models_route = get(addr, "/models").await?.json()?;
        ensure!(models_route["data"][0]["status"]["value"] == "loaded", "{models_route}");
        Ok(())
    })
    .await
    .context("timed out")?
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_oversized_and_slow_loads_answer_503() -> Result<()> {
    tokio::time::timeout(LIMIT, async {
        let (a, _) = model_files()?;
        let bad = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("router-models").join("broken.gguf");
        std::fs::write(&bad, b"GGUF but nothing a model needs")?;

        // A file that does not load: 503 with Retry-After naming why; listed as failed.
        let (addr, _stop) = serve(vec![source("broken", &bad), source("smol", &a)], load_options(Some(1 << 20), Duration::from_secs(60))).await?;
        let r = post(addr, "/v1/chat/completions", &json!({"model": "broken", "messages": [{"role": "user", "content": "hi"}]})).await?;
        ensure!(r.status == 503 && r.header("retry-after").is_some(), "{} {:?} {}", r.status, r.headers, r.text());
        ensure!(r.text().contains("model 'broken' could not be loaded"), "{}", r.text());
        let listed = statuses(addr).await?;
        ensure!(listed[0].1["status"]["value"] == "unloaded" && listed[0].1["status"]["failed"] == true, "{listed:?}");
        // A model over the budget (1 MiB here) is refused before it loads.
        let r = post(addr, "/v1/chat/completions", &json!({"model": "smol", "messages": [{"role": "user", "content": "hi"}]})).await?;
        ensure!(r.status == 503 && r.text().contains("more than the models budget of 1 MiB"), "{} {}", r.status, r.text());
        let text = get(addr, "/metrics").await?.text();
        ensure!(labelled(&text, "sapient:model_load_failures_total", "broken") == Some(1.0), "{text}");
        ensure!(labelled(&text, "sapient:model_load_failures_total", "smol") == Some(1.0), "{text}");

        // A wait shorter than the load: 503, and the load goes on; the model answers once loaded.
        let (addr, _stop2) = serve(vec![source("smol", &a)], load_options(None, Duration::from_millis(1))).await?;
        let r = post(addr, "/v1/chat/completions", &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})).await?;
        ensure!(r.status == 503 && r.text().contains("still loading") && r.header("retry-after").is_some(), "{} {}", r.status, r.text());
        let t = Instant::now();
        while statuses(addr).await?[0].1["status"]["value"] != "loaded" {
            ensure!(t.elapsed() < Duration::from_secs(120), "the load did not finish");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let r = post(addr, "/v1/chat/completions", &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})).await?;
        ensure!(r.status == 200, "{} {}", r.status, r.text());
        Ok(())
    })
    .await
    .context("timed out")?
}
