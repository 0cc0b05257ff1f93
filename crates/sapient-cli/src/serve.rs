//! `sapient serve`: the OpenAI-compatible HTTP server (crate sapient-server).

use anyhow::{bail, Context, Result};
use clap::Args;
use sapient_generate::{DeviceRequest, Engine, EngineOptions, KvBudget, KvDtype, KvOptions, Pipeline, PipelineOptions};
use sapient_server::{Llm, LlmSource, LoadOptions, Models, Server, ServerOptions};
use serde::Deserialize;
use std::path::PathBuf;

#[derive(Args)]
pub struct ServeArgs {
    /// Models and settings from a TOML file (see `docs/serve.md`); flags given as well win
    /// over the file's settings and add to its models.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// A language model to serve: a preset id, local GGUF / HF directory or Hub repo id,
    /// optionally as NAME=REFERENCE to serve it under NAME (repeatable; the first one answers
    /// requests that name no model). Without any model: smollm2-135m-instruct.
    #[arg(short, long = "model")]
    models: Vec<String>,
    /// Serve every GGUF file in DIR as a language model named after its file stem, loaded
    /// when a request first names it (language models are loaded on demand with this or
    /// --models-budget).
    #[arg(long, value_name = "DIR")]
    models_dir: Option<PathBuf>,
    /// Memory the language models may take together, e.g. 6GiB or 512MiB (weights file +
    /// KV budget each, by estimate): when a load would pass it, the least recently used
    /// model with no request in flight is unloaded first. Loads models on demand.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    models_budget: Option<u64>,
    /// How long a request waits for its model to load before it gets 503 (the load goes on)
    /// [default: 120].
    #[arg(long, value_name = "SECS")]
    model_load_timeout_secs: Option<u64>,
    /// Let POST /slots/{id}?action=save|restore write and read conversation slots as files in
    /// DIR (created if missing; plain file names only). Off by default.
    #[arg(long, value_name = "DIR")]
    slot_save_path: Option<PathBuf>,
    /// A LoRA adapter (llama.cpp's GGUF adapter format) for the first language model, with
    /// its global scale (default 1; 0 loads it off): requests without a `lora` field apply
    /// the adapters at their global scales, `lora: [{"id", "scale"}]` picks others
    /// (repeatable; ids in order; not with models loaded on demand).
    #[arg(long = "lora", value_name = "FILE[:SCALE]")]
    loras: Vec<String>,
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
    /// Largest audio upload, in MiB [default: 25].
    #[arg(long)]
    max_audio_mib: Option<usize>,
    /// Address to bind (127.0.0.1: this machine only; 0.0.0.0 to serve the network)
    /// [default: 127.0.0.1].
    #[arg(long)]
    host: Option<String>,
    /// [default: 8080]
    #[arg(long)]
    port: Option<u16>,
    /// Require `Authorization: Bearer KEY` (or `x-api-key: KEY`) on every route but /health.
    #[arg(long, env = "SAPIENT_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Serve /metrics without the API key (for a metrics scraper that holds none).
    #[arg(long)]
    public_metrics: bool,
    /// Cap on prompt + answer tokens per request (default: the model's context, at most 8192).
    #[arg(long)]
    ctx: Option<usize>,
    /// KV cache budget per model, in positions over all sequences [default: 32768].
    #[arg(long)]
    kv_tokens: Option<usize>,
    /// How the KV cache stores keys and values: f16, or q8_0 (8 bits with an f16 scale per
    /// 32 values: about half the memory per position) [default: f16].
    #[arg(long, value_name = "TYPE")]
    kv_type: Option<KvDtype>,
    /// Sequences decoded at once per model [default: 64].
    #[arg(long)]
    max_seqs: Option<usize>,
    /// Requests (choices) in flight per model, running or waiting; more get 429 [default: 256].
    #[arg(long)]
    max_queue: Option<usize>,
    /// max_tokens above this is lowered to it (and is the default) [default: 4096].
    #[arg(long)]
    max_tokens_limit: Option<usize>,
    /// Largest request body, in MiB [default: 2].
    #[arg(long)]
    max_body_mib: Option<usize>,
    /// cpu, cuda, cuda:N, metal, auto [default: cpu].
    #[arg(long)]
    device: Option<String>,
    /// Let web pages from this origin call the API (CORS; repeat for several, `*` for
    /// any). Off by default.
    #[arg(long = "cors-origin", value_name = "ORIGIN")]
    cors_origins: Vec<String>,
    /// /v1/responses answers kept in memory for previous_response_id; the oldest go first
    /// (0: none) [default: 256].
    #[arg(long)]
    responses_max: Option<usize>,
    /// How long a stored /v1/responses answer is kept, in seconds [default: 3600].
    #[arg(long)]
    responses_ttl_secs: Option<u64>,
}

/// `--config`: the same settings as the flags (snake_case), and the models as tables.
#[derive(Deserialize, Default, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
struct ServeFile {
    host: Option<String>,
    port: Option<u16>,
    api_key: Option<String>,
    public_metrics: Option<bool>,
    ctx: Option<usize>,
    kv_tokens: Option<usize>,
    kv_type: Option<String>,
    max_seqs: Option<usize>,
    max_queue: Option<usize>,
    max_tokens_limit: Option<usize>,
    max_body_mib: Option<usize>,
    max_audio_mib: Option<usize>,
    device: Option<String>,
    #[serde(default)]
    cors_origins: Vec<String>,
    responses_max: Option<usize>,
    responses_ttl_secs: Option<u64>,
    models_dir: Option<PathBuf>,
    models_budget: Option<Size>,
    model_load_timeout_secs: Option<u64>,
    slot_save_path: Option<PathBuf>,
    #[serde(default)]
    llm: Vec<ModelEntry>,
    #[serde(default)]
    embedding: Vec<ModelEntry>,
    #[serde(default)]
    whisper: Vec<ModelEntry>,
    #[serde(default)]
    tts: Vec<ModelEntry>,
}

/// A size in the file: bytes, or a string with a unit (`"6GiB"`).
#[derive(Deserialize, Debug, PartialEq)]
#[serde(untagged)]
enum Size {
    Bytes(u64),
    Text(String),
}

/// `1234`, `512MiB`, `6GiB`, `2GB` (KiB/MiB/GiB/TiB: powers of 1024; KB/MB/GB/TB: of 1000;
/// K/M/G/T alone: powers of 1024).
fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| anyhow::anyhow!("'{s}' is not a size (a number of bytes, or with a unit: 512MiB, 6GiB, 2GB)"))?;
    let k = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024f64,
        "m" | "mib" => 1024f64.powi(2),
        "g" | "gib" => 1024f64.powi(3),
        "t" | "tib" => 1024f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        u => bail!("'{s}': unknown size unit '{u}' (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"),
    };
    let bytes = n * k;
    if !bytes.is_finite() || bytes < 1.0 || bytes > u64::MAX as f64 {
        bail!("'{s}' is not a usable size");
    }
    Ok(bytes as u64)
}

/// `[[llm]]` and the other model tables: what to load, and the name requests use.
#[derive(Deserialize, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
struct ModelEntry {
    model: String,
    name: Option<String>,
}

impl ServeFile {
    fn read(path: &std::path::Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
    }
}

/// Flags over the file over the defaults; the file's models, then the flags'.
fn merge(mut args: ServeArgs, file: ServeFile) -> Result<ServeArgs> {
    fn pick<T>(flag: &mut Option<T>, file: Option<T>) {
        if flag.is_none() {
            *flag = file;
        }
    }
    pick(&mut args.host, file.host);
    pick(&mut args.port, file.port);
    pick(&mut args.api_key, file.api_key);
    args.public_metrics |= file.public_metrics.unwrap_or(false);
    pick(&mut args.ctx, file.ctx);
    pick(&mut args.kv_tokens, file.kv_tokens);
    if args.kv_type.is_none() {
        args.kv_type = file.kv_type.map(|t| t.parse::<KvDtype>()).transpose()?;
    }
    pick(&mut args.max_seqs, file.max_seqs);
    pick(&mut args.max_queue, file.max_queue);
    pick(&mut args.max_tokens_limit, file.max_tokens_limit);
    pick(&mut args.max_body_mib, file.max_body_mib);
    pick(&mut args.max_audio_mib, file.max_audio_mib);
    pick(&mut args.device, file.device);
    pick(&mut args.responses_max, file.responses_max);
    pick(&mut args.responses_ttl_secs, file.responses_ttl_secs);
    pick(&mut args.models_dir, file.models_dir);
    pick(&mut args.slot_save_path, file.slot_save_path);
    pick(&mut args.model_load_timeout_secs, file.model_load_timeout_secs);
    if args.models_budget.is_none() {
        args.models_budget = match file.models_budget {
            Some(Size::Bytes(b)) => Some(b),
            Some(Size::Text(t)) => Some(parse_size(&t).context("models_budget")?),
            None => None,
        };
    }
    if args.cors_origins.is_empty() {
        args.cors_origins = file.cors_origins;
    }
    let specs = |v: Vec<ModelEntry>, kind: &str| -> Result<Vec<String>> {
        v.into_iter()
            .map(|m| {
                if m.model.trim().is_empty() {
                    bail!("a [[{kind}]] entry has an empty `model`");
                }
                Ok(match m.name {
                    Some(n) if n.is_empty() || n.contains('=') => bail!("[[{kind}]] {}: name '{n}' must be non-empty, without '='", m.model),
                    Some(n) => format!("{n}={}", m.model),
                    None => m.model,
                })
            })
            .collect()
    };
    let prepend = |mut from_file: Vec<String>, flags: Vec<String>| {
        from_file.extend(flags);
        from_file
    };
    args.models = prepend(specs(file.llm, "llm")?, args.models);
    args.embed_models = prepend(specs(file.embedding, "embedding")?, args.embed_models);
    args.whisper_models = prepend(specs(file.whisper, "whisper")?, args.whisper_models);
    args.tts_models = prepend(specs(file.tts, "tts")?, args.tts_models);
    Ok(args)
}

pub fn run(args: ServeArgs) -> Result<()> {
    let mut args = match args.config.clone() {
        Some(path) => merge(args, ServeFile::read(&path)?)?,
        None => args,
    };
    if args.models.is_empty() && args.models_dir.is_none() && args.embed_models.is_empty() && args.whisper_models.is_empty() && args.tts_models.is_empty() {
        args.models.push("smollm2-135m-instruct".into());
    }
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().context("starting the async runtime")?;
    let r = rt.block_on(serve(args));
    // A model still loading when a stop signal came is not waited for.
    rt.shutdown_background();
    r
}

/// SIGTERM (what `docker stop` and Kubernetes send) or Ctrl-C.
async fn stop_signal() {
    #[cfg(unix)]
    {
        if let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

async fn serve(args: ServeArgs) -> Result<()> {
    let opts = ServerOptions {
        api_key: args.api_key.clone().filter(|k| !k.is_empty()),
        public_metrics: args.public_metrics,
        max_body_bytes: args.max_body_mib.unwrap_or(2).max(1) << 20,
        max_tokens_limit: args.max_tokens_limit.unwrap_or(4096).max(1),
        max_queue: args.max_queue.unwrap_or(256).max(1),
        max_audio_bytes: args.max_audio_mib.unwrap_or(25).max(1) << 20,
        cors_origins: args.cors_origins.clone(),
        responses_max: args.responses_max.unwrap_or(256),
        responses_ttl: std::time::Duration::from_secs(args.responses_ttl_secs.unwrap_or(3600)),
        slot_save_path: args.slot_save_path.clone(),
        ..ServerOptions::default()
    };
    if let Some(dir) = &args.slot_save_path {
        std::fs::create_dir_all(dir).with_context(|| format!("creating --slot-save-path {}", dir.display()))?;
    }
    let server = Server::new(opts);
    let addr = format!("{}:{}", args.host.as_deref().unwrap_or("127.0.0.1"), args.port.unwrap_or(8080));
    let listener = tokio::net::TcpListener::bind(&addr).await.with_context(|| format!("binding {addr}"))?;
    let local = listener.local_addr()?;
    eprintln!("sapient serve: listening on http://{local} (/health answers 503 until the models are loaded)");
    if args.api_key.is_none() && !local.ip().is_loopback() {
        eprintln!("warning: serving on {} without --api-key", local.ip());
    }
    // A stop signal ends the server gracefully: no new connections, the requests in flight
    // finish; a second one exits at once.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        stop_signal().await;
        eprintln!("sapient serve: stopping (the requests in flight finish; signal again to exit now)");
        let _ = stop_tx.send(true);
        stop_signal().await;
        std::process::exit(130);
    });
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let serving = tokio::spawn(server.clone().serve(listener, stopped(stop_rx.clone())));
    let models = tokio::select! {
        m = load_models(&args) => m?,
        _ = stopped(stop_rx) => return Ok(()),
    };
    server.set_models(models)?;
    eprintln!("ready: http://{local}/v1");
    serving.await??;
    eprintln!("sapient serve: stopped");
    Ok(())
}

/// How each language model loads and the engine it gets.
fn llm_options(args: &ServeArgs) -> Result<(PipelineOptions, EngineOptions)> {
    let device: DeviceRequest = args.device.as_deref().unwrap_or("cpu").parse()?;
    let (kv_tokens, max_seqs) = (args.kv_tokens.unwrap_or(32768), args.max_seqs.unwrap_or(64));
    let popts = PipelineOptions { device, max_seq_len: args.ctx, kv_dtype: args.kv_type.unwrap_or_default(), ..PipelineOptions::default() };
    let eopts = EngineOptions { kv: KvOptions { budget: KvBudget::Tokens(kv_tokens), dtype: args.kv_type.unwrap_or_default(), ..KvOptions::default() }, max_seqs: max_seqs.max(1), ..EngineOptions::default() };
    Ok((popts, eopts))
}

/// `--lora FILE[:SCALE]`: the file and its scale (1 unless given). A colon followed by
/// something that is not a number belongs to the path.
fn lora_spec(s: &str) -> Result<(PathBuf, f32)> {
    let (path, scale) = match s.rsplit_once(':') {
        Some((p, n)) if !p.is_empty() && n.parse::<f32>().is_ok() => (p, n.parse::<f32>()?),
        _ => (s, 1.0),
    };
    if !scale.is_finite() {
        bail!("--lora {s}: the scale must be a finite number");
    }
    Ok((PathBuf::from(path), scale))
}

/// Language models loaded on demand: those named, then the GGUF files of `--models-dir`
/// (named after their file stems, in name order).
fn on_demand(args: &ServeArgs) -> Result<Vec<LlmSource>> {
    let mut out: Vec<LlmSource> = args.models.iter().map(|s| named(s)).map(|(id, reference)| LlmSource { id, reference }).collect();
    if let Some(dir) = &args.models_dir {
        let mut found = Vec::new();
        for f in std::fs::read_dir(dir).with_context(|| format!("reading --models-dir {}", dir.display()))? {
            let path = f?.path();
            let gguf = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
            if let (true, Some(stem)) = (gguf && path.is_file(), path.file_stem().and_then(|s| s.to_str())) {
                found.push(LlmSource { id: stem.to_string(), reference: path.to_string_lossy().into_owned() });
            }
        }
        if found.is_empty() {
            bail!("--models-dir {}: no .gguf file in it", dir.display());
        }
        found.sort_by(|a, b| a.id.cmp(&b.id));
        out.extend(found);
    }
    Ok(out)
}

/// Every model the arguments name, loaded with progress bars (language models on demand
/// with --models-dir or --models-budget: only listed here).
async fn load_models(args: &ServeArgs) -> Result<Models> {
    let (popts, eopts) = llm_options(args)?;
    let mut llms = Vec::new();
    let routed = args.models_dir.is_some() || args.models_budget.is_some();
    let on_demand = if routed { on_demand(args)? } else { Vec::new() };
    for s in &on_demand {
        eprintln!("'{}': {} (loaded on its first request)", s.id, s.reference);
    }
    if routed && !args.loras.is_empty() {
        bail!("--lora applies to a model loaded at start, not with --models-dir or --models-budget");
    }
    let loras = args.loras.iter().map(|s| lora_spec(s)).collect::<Result<Vec<_>>>()?;
    for spec in args.models.iter().filter(|_| !routed) {
        let (name, reference) = named(spec);
        eprintln!("loading {reference} as '{name}' ...");
        let (popts, r2) = (popts.clone(), reference.clone());
        let pipe = tokio::task::spawn_blocking(move || {
            let mut bars = crate::Bars::default();
            let r = Pipeline::load(&r2, popts, |p| bars.update(p));
            bars.finish();
            r
        })
        .await?
            .with_context(|| format!("loading model '{reference}'"))?;
        let mut scales = Vec::new();
        for (path, scale) in loras.iter().filter(|_| llms.is_empty()) {
            let id = pipe.load_lora(path).with_context(|| format!("loading the LoRA adapter {}", path.display()))?;
            eprintln!("LoRA adapter {id}: {} (scale {scale})", path.display());
            scales.push(*scale);
        }
        let engine = Engine::new(&pipe, eopts.clone()).with_context(|| format!("starting the engine for '{name}'"))?;
        llms.push(Llm::new(name, engine).with_lora_scales(&scales));
    }
    let load = LoadOptions {
        budget_bytes: args.models_budget,
        load_timeout: std::time::Duration::from_secs(args.model_load_timeout_secs.unwrap_or(120).max(1)),
        pipeline: popts,
        engine: eopts,
    };
    let mut models = Models { llms, on_demand, load, ..Models::default() };
    for spec in &args.embed_models {
        let (name, reference) = named(spec);
        eprintln!("loading {reference} as '{name}' ...");
        let r2 = reference.clone();
        let e = tokio::task::spawn_blocking(move || {
            let mut bars = crate::Bars::default();
            let r = sapient_embed::Embedder::load(&r2, Default::default(), &mut |p| bars.update(p));
            bars.finish();
            r
        })
        .await?
            .with_context(|| format!("loading embedding model '{reference}'"))?;
        models.embedders.push((name, e));
    }
    for spec in &args.whisper_models {
        let (name, reference) = named(spec);
        eprintln!("loading {reference} as '{name}' ...");
        let r2 = reference.clone();
        let t = tokio::task::spawn_blocking(move || {
            let mut bars = crate::Bars::default();
            let r = sapient_whisper::Transcriber::load(&r2, &candle_core::Device::Cpu, &mut |p| bars.update(p));
            bars.finish();
            r
        })
        .await?
            .with_context(|| format!("loading Whisper model '{reference}'"))?;
        models.transcribers.push((name, t));
    }
    for spec in &args.tts_models {
        let (name, reference) = named(spec);
        eprintln!("loading {reference} as '{name}' ...");
        let r2 = reference.clone();
        let t = tokio::task::spawn_blocking(move || -> Result<sapient_kokoro::KokoroTts> {
            let mut bars = crate::Bars::default();
            let dir = crate::speak::kokoro_dir(&sapient_hub::Hub::new()?, &r2, &mut bars);
            bars.finish();
            Ok(sapient_kokoro::KokoroTts::from_dir(&dir?, &candle_core::Device::Cpu)?)
        })
        .await?
        .with_context(|| format!("loading Kokoro model '{reference}'"))?;
        models.tts.push((name, t));
    }
    let has_llm = !models.llms.is_empty() || !models.on_demand.is_empty();
    if has_llm && !models.transcribers.is_empty() && !models.tts.is_empty() {
        // /v1/realtime: Silero VAD for its turn detection
        let vad = tokio::task::spawn_blocking(|| -> Result<std::path::PathBuf> {
            let mut bars = crate::Bars::default();
            let r = sapient_hub::Hub::new()?.fetch_preset("silero-vad", &mut |p| bars.update(p));
            bars.finish();
            Ok(r?.file("onnx")?.to_path_buf())
        })
        .await?
        .context("fetching Silero VAD for /v1/realtime")?;
        models.vad = Some(vad);
    }
    Ok(models)
}

/// `NAME=REFERENCE` or `REFERENCE` (named after itself).
fn named(spec: &str) -> (String, String) {
    match spec.split_once('=') {
        Some((n, r)) if !n.is_empty() && !std::path::Path::new(spec).exists() => (n.to_string(), r.to_string()),
        _ => (spec.to_string(), spec.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }

    fn args(flags: &[&str]) -> ServeArgs {
        Cli::parse_from(std::iter::once("serve").chain(flags.iter().copied())).serve
    }

    #[test]
    fn lora_flags_take_an_optional_scale() -> Result<()> {
        let a = args(&["--lora", "a.gguf", "--lora", "dir/b.gguf:0.5", "--lora", "c:d.gguf"]);
        let got = a.loras.iter().map(|s| lora_spec(s)).collect::<Result<Vec<_>>>()?;
        assert_eq!(got, vec![(PathBuf::from("a.gguf"), 1.0), (PathBuf::from("dir/b.gguf"), 0.5), (PathBuf::from("c:d.gguf"), 1.0)]);
        assert!(lora_spec("a.gguf:NaN").is_err());
        Ok(())
    }

    #[test]
    fn the_file_gives_models_and_settings_and_flags_win() -> Result<()> {
        let file: ServeFile = toml::from_str(
            r#"
            port = 9000
            max_seqs = 16
            kv_type = "q8_0"
            public_metrics = true
            cors_origins = ["http://localhost:3000"]
            responses_max = 8
            [[llm]]
            model = "qwen2.5-coder-0.5b-instruct"
            name = "coder"
            [[llm]]
            model = "smollm2-135m-instruct"
            [[embedding]]
            model = "all-minilm-l6-v2"
            name = "emb"
            "#,
        )?;
        let a = merge(args(&["--port", "8081", "-m", "extra=/models/x.gguf"]), file)?;
        assert_eq!(a.port, Some(8081), "the flag wins");
        assert_eq!(a.max_seqs, Some(16), "the file fills what flags leave");
        assert_eq!(a.kv_type, Some(KvDtype::Q8_0));
        assert_eq!(args(&["--kv-type", "f16"]).kv_type, Some(KvDtype::F16));
        assert_eq!(a.host, None);
        assert!(a.public_metrics);
        assert_eq!(a.cors_origins, ["http://localhost:3000"]);
        assert_eq!((a.responses_max, a.responses_ttl_secs), (Some(8), None));
        assert_eq!(a.models, ["coder=qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct", "extra=/models/x.gguf"]);
        assert_eq!(a.embed_models, ["emb=all-minilm-l6-v2"]);
        Ok(())
    }

    #[test]
    fn sizes_and_models_on_demand() -> Result<()> {
        assert_eq!(parse_size("1234")?, 1234);
        assert_eq!(parse_size("512MiB")?, 512 << 20);
        assert_eq!(parse_size("1.5 GiB")?, 3 << 29);
        assert_eq!(parse_size("2GB")?, 2_000_000_000);
        assert_eq!(parse_size("6g")?, 6 << 30);
        assert!(parse_size("6 parsecs").unwrap_err().to_string().contains("unknown size unit 'parsecs'"));
        assert!(parse_size("GiB").unwrap_err().to_string().contains("is not a size"));
        assert!(parse_size("0").is_err());
        let e = Cli::try_parse_from(["serve", "--models-budget", "lots"]).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("'lots' is not a size"), "{e}");

        let file: ServeFile = toml::from_str("models_budget = \"1GiB\"\nmodels_dir = \"/m\"\nmodel_load_timeout_secs = 9")?;
        let a = merge(args(&[]), file)?;
        assert_eq!((a.models_budget, a.models_dir.as_deref(), a.model_load_timeout_secs), (Some(1 << 30), Some(std::path::Path::new("/m")), Some(9)));
        let file: ServeFile = toml::from_str("models_budget = 4096")?;
        assert_eq!(merge(args(&["--models-budget", "2KiB"]), file)?.models_budget, Some(2048), "the flag wins");

        let dir = std::env::temp_dir().join(format!("sapient-models-dir-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub.gguf"))?;
        for f in ["b-model.gguf", "a-model.GGUF", "notes.txt"] {
            std::fs::write(dir.join(f), b"x")?;
        }
        let dir_arg = dir.to_string_lossy().into_owned();
        let a = args(&["--models-dir", &dir_arg, "-m", "first=smollm2-135m-instruct"]);
        let ids: Vec<String> = on_demand(&a)?.into_iter().map(|s| s.id).collect();
        assert_eq!(ids, ["first", "a-model", "b-model"], "named ones first, then the directory's GGUF files by name");
        std::fs::remove_dir_all(&dir)?;
        let e = on_demand(&a).unwrap_err();
        assert!(format!("{e:#}").contains("reading --models-dir"), "{e:#}");
        Ok(())
    }

    #[test]
    fn bad_files_name_the_problem() {
        for (text, needle) in [
            ("prot = 1", "unknown field `prot`"),
            ("[[llm]]\nname = \"x\"", "missing field `model`"),
            ("[[llm]]\nmodel = \"a\"\nsize = 3", "unknown field `size`"),
            ("port = \"eighty\"", "invalid type"),
        ] {
            let e = toml::from_str::<ServeFile>(text).unwrap_err().to_string();
            assert!(e.contains(needle), "{text}: {e}");
        }
        let file: ServeFile = toml::from_str("[[tts]]\nmodel = \"kokoro-82m\"\nname = \"a=b\"").unwrap();
        let e = merge(args(&[]), file).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("name 'a=b'"), "{e}");
        let file: ServeFile = toml::from_str("kv_type = \"q4\"").unwrap();
        let e = merge(args(&[]), file).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("unknown KV cache type \"q4\" (expected f16 or q8_0)"), "{e}");
        let e = Cli::try_parse_from(["serve", "--kv-type", "q4"]).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("expected f16 or q8_0"), "{e}");
        let e = ServeFile::read(std::path::Path::new("/nonexistent/models.toml")).unwrap_err();
        assert!(format!("{e:#}").contains("/nonexistent/models.toml"), "{e:#}");
    }
}
