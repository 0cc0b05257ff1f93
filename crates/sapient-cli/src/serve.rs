//! `sapient serve`: the OpenAI-compatible HTTP server (crate sapient-server).

use anyhow::{Context, Result};
use clap::Args;
use sapient_generate::{DeviceRequest, Engine, EngineOptions, KvBudget, KvOptions, Pipeline, PipelineOptions};
use sapient_server::{Llm, Models, Server, ServerOptions};

#[derive(Args)]
pub struct ServeArgs {
    /// A language model to serve: a preset id, local GGUF / HF directory or Hub repo id,
    /// optionally as NAME=REFERENCE to serve it under NAME (repeatable; the first one answers
    /// requests that name no model).
    #[arg(short, long = "model", default_value = "smollm2-135m-instruct")]
    models: Vec<String>,
    /// A sentence embedder for /v1/embeddings (preset such as all-minilm-l6-v2, file or
    /// directory; NAME=REFERENCE to name it; repeatable).
    #[arg(long = "embed-model")]
    embed_models: Vec<String>,
    /// A Whisper model for /v1/audio/transcriptions and /translations (e.g. whisper-tiny.en;
    /// NAME=REFERENCE; repeatable).
    #[arg(long = "whisper-model")]
    whisper_models: Vec<String>,
    /// A Kokoro model for /v1/audio/speech (kokoro-82m or its directory; NAME=REFERENCE;
    /// repeatable).
    #[arg(long = "tts-model")]
    tts_models: Vec<String>,
    /// Largest audio upload, in MiB.
    #[arg(long, default_value_t = 25)]
    max_audio_mib: usize,
    /// Address to bind (127.0.0.1: this machine only; 0.0.0.0 to serve the network).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Require `Authorization: Bearer KEY` on every route but /health.
    #[arg(long, env = "SAPIENT_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Cap on prompt + answer tokens per request (default: the model's context, at most 8192).
    #[arg(long)]
    ctx: Option<usize>,
    /// KV cache budget per model, in positions over all sequences.
    #[arg(long, default_value_t = 32768)]
    kv_tokens: usize,
    /// Sequences decoded at once per model.
    #[arg(long, default_value_t = 64)]
    max_seqs: usize,
    /// Requests (choices) in flight per model, running or waiting; more get 429.
    #[arg(long, default_value_t = 256)]
    max_queue: usize,
    /// max_tokens above this is lowered to it (and is the default).
    #[arg(long, default_value_t = 4096)]
    max_tokens_limit: usize,
    /// Largest request body, in MiB.
    #[arg(long, default_value_t = 2)]
    max_body_mib: usize,
    /// cpu, cuda, cuda:N, metal, auto.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Let web pages from this origin call the API (CORS; repeat for several, `*` for
    /// any). Off by default.
    #[arg(long = "cors-origin", value_name = "ORIGIN")]
    cors_origins: Vec<String>,
}

pub fn run(args: ServeArgs) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().context("starting the async runtime")?;
    rt.block_on(serve(args))
}

async fn serve(args: ServeArgs) -> Result<()> {
    let opts = ServerOptions {
        api_key: args.api_key.clone().filter(|k| !k.is_empty()),
        max_body_bytes: args.max_body_mib.max(1) << 20,
        max_tokens_limit: args.max_tokens_limit.max(1),
        max_queue: args.max_queue.max(1),
        max_audio_bytes: args.max_audio_mib.max(1) << 20,
        cors_origins: args.cors_origins.clone(),
        ..ServerOptions::default()
    };
    let server = Server::new(opts);
    let addr = format!("{}:{}", args.host, args.port);
    let listener = tokio::net::TcpListener::bind(&addr).await.with_context(|| format!("binding {addr}"))?;
    let local = listener.local_addr()?;
    eprintln!("sapient serve: listening on http://{local} (/health answers 503 until the models are loaded)");
    if args.api_key.is_none() && !local.ip().is_loopback() {
        eprintln!("warning: serving on {} without --api-key", local.ip());
    }
    let serving = tokio::spawn(server.clone().serve(listener, std::future::pending()));
    let device: DeviceRequest = args.device.parse()?;
    let mut llms = Vec::new();
    for spec in &args.models {
        let (name, reference) = named(spec);
        eprintln!("loading {reference} as '{name}' ...");
        let popts = PipelineOptions { device, max_seq_len: args.ctx, ..PipelineOptions::default() };
        let r2 = reference.clone();
        let pipe = tokio::task::spawn_blocking(move || Pipeline::load(&r2, popts, |_| {}))
            .await?
            .with_context(|| format!("loading model '{reference}'"))?;
        let eopts = EngineOptions { kv: KvOptions { budget: KvBudget::Tokens(args.kv_tokens), ..KvOptions::default() }, max_seqs: args.max_seqs.max(1), ..EngineOptions::default() };
        let engine = Engine::new(&pipe, eopts).with_context(|| format!("starting the engine for '{name}'"))?;
        llms.push(Llm::new(name, engine));
    }
    let mut models = Models { llms, ..Models::default() };
    for spec in &args.embed_models {
        let (name, reference) = named(spec);
        eprintln!("loading {reference} as '{name}' ...");
        let r2 = reference.clone();
        let e = tokio::task::spawn_blocking(move || sapient_embed::Embedder::load(&r2, Default::default(), &mut |_| {}))
            .await?
            .with_context(|| format!("loading embedding model '{reference}'"))?;
        models.embedders.push((name, e));
    }
    for spec in &args.whisper_models {
        let (name, reference) = named(spec);
        eprintln!("loading {reference} as '{name}' ...");
        let r2 = reference.clone();
        let t = tokio::task::spawn_blocking(move || sapient_whisper::Transcriber::load(&r2, &candle_core::Device::Cpu, &mut |_| {}))
            .await?
            .with_context(|| format!("loading Whisper model '{reference}'"))?;
        models.transcribers.push((name, t));
    }
    for spec in &args.tts_models {
        let (name, reference) = named(spec);
        eprintln!("loading {reference} as '{name}' ...");
        let r2 = reference.clone();
        let t = tokio::task::spawn_blocking(move || -> Result<sapient_kokoro::KokoroTts> {
            let resolved = sapient_hub::Hub::new()?.resolve(&r2, &mut |_| {})?;
            let dir = if resolved.dir.is_dir() { resolved.dir.clone() } else { resolved.file("onnx")?.parent().map(|p| p.to_path_buf()).unwrap_or_default() };
            Ok(sapient_kokoro::KokoroTts::from_dir(&dir, &candle_core::Device::Cpu)?)
        })
        .await?
        .with_context(|| format!("loading Kokoro model '{reference}'"))?;
        models.tts.push((name, t));
    }
    server.set_models(models)?;
    eprintln!("ready: http://{local}/v1");
    serving.await??;
    Ok(())
}

/// `NAME=REFERENCE` or `REFERENCE` (named after itself).
fn named(spec: &str) -> (String, String) {
    match spec.split_once('=') {
        Some((n, r)) if !n.is_empty() && !std::path::Path::new(spec).exists() => (n.to_string(), r.to_string()),
        _ => (spec.to_string(), spec.to_string()),
    }
}
