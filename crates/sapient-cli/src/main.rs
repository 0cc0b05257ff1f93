//! `sapient`: run on-device models from the command line.

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use sapient_generate::speculative::SpecConfig;
use sapient_generate::{
    DeviceRequest, Drafter, Generation, GenerationConfig, Grammar, Message, Pipeline, PipelineOptions,
    Progress, SamplerConfig,
};
use sapient_hub::Hub;
use std::collections::HashMap;
use std::io::Write;
use std::ops::ControlFlow;

mod embed;
#[cfg(feature = "microphone")]
mod listen;
mod chat;
mod serve;
mod speak;
mod talk;
mod transcribe;

#[derive(Parser)]
#[command(name = "sapient", version, about = "On-device inference: chat with LLMs, transcribe speech and speak text from the command line")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Answer one prompt (through the model's chat template unless --raw), streaming the text;
    /// or, with --batch FILE, every line of FILE as its own prompt, all at once.
    /// Decodes greedily (the same answer every time) unless a sampling option is given.
    Generate {
        #[arg(required_unless_present = "batch")]
        prompt: Option<String>,
        /// Answer every non-empty line of FILE as its own prompt, concurrently through the
        /// engine (one batched forward per step), printing the answers in input order with a
        /// blank line between them.
        #[arg(long, value_name = "FILE", conflicts_with_all = ["prompt", "draft", "lookup"])]
        batch: Option<std::path::PathBuf>,
        /// With --batch: KV cache budget in positions over all sequences.
        #[arg(long, default_value_t = 32768, requires = "batch")]
        kv_tokens: usize,
        #[command(flatten)]
        opts: GenOpts,
        /// Complete the prompt as raw text instead of as a chat message.
        #[arg(long)]
        raw: bool,
        #[command(flatten)]
        spec: SpecOpts,
    },
    /// Interactive chat with history (type /reset to start over, /exit or Ctrl-D to quit).
    /// Samples with the model's recommended settings (its generation_config.json, else
    /// llama.cpp's defaults), printed at the start; an answer that loops is stopped.
    Chat {
        #[command(flatten)]
        opts: GenOpts,
        /// Let an answer repeat itself instead of stopping it when it loops.
        #[arg(long)]
        allow_loops: bool,
    },
    /// List the model presets and whether they are cached.
    Models,
    /// Download a preset (or group) into the cache, verifying its hashes.
    Pull { names: Vec<String> },
    /// Speech to text with Whisper (text, srt, vtt or json).
    Transcribe(transcribe::TranscribeArgs),
    /// Text to speech with Kokoro-82M (English; WAV out, --phonemes to print the phonemes).
    Speak(speak::SpeakArgs),
    /// A spoken conversation: Whisper hears a recording, the model answers, Kokoro speaks
    /// (--input FILE, --output reply.wav), with turn-taking and barge-in.
    Talk(talk::TalkArgs),
    /// Sentence embeddings as JSON arrays (--similarity: the cosine matrix; --index-out: a
    /// vector index for `sapient search`).
    Embed(embed::EmbedArgs),
    /// The passages of a vector index closest to a query.
    Search(embed::SearchArgs),
    /// An OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions, /v1/models,
    /// /health, /metrics) on 127.0.0.1:8080 unless told otherwise.
    Serve(serve::ServeArgs),
    /// Live speech to text from a microphone (built with the `microphone` feature).
    #[cfg(feature = "microphone")]
    Listen(listen::ListenArgs),
}

#[derive(Args, Clone)]
struct GenOpts {
    /// Preset id, local GGUF file / HF directory, or Hub repo id.
    #[arg(short, long, default_value = "smollm2-135m-instruct", env = "SAPIENT_MODEL")]
    model: String,
    /// System prompt for chat templates.
    #[arg(long)]
    system: Option<String>,
    #[arg(short = 'n', long, default_value_t = 256)]
    max_tokens: usize,
    /// Sampling temperature, 0 = greedy. Without any sampling option `generate` decodes
    /// greedily (reproducible) and `chat` samples with the model's recommended settings.
    #[arg(short, long)]
    temperature: Option<f32>,
    #[arg(long)]
    top_k: Option<usize>,
    #[arg(long)]
    top_p: Option<f32>,
    #[arg(long)]
    min_p: Option<f32>,
    /// Repetition penalty over the last 64 tokens (1 = off).
    #[arg(long)]
    repeat_penalty: Option<f32>,
    #[arg(long, default_value_t = 0.0)]
    presence_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    frequency_penalty: f32,
    #[arg(long)]
    seed: Option<u64>,
    /// Stop when this string appears (repeatable).
    #[arg(long = "stop")]
    stop: Vec<String>,
    /// Ask a reasoning model to think before answering (its chat template's
    /// `enable_thinking`, as Qwen3 and SmolLM3 read it); the reasoning streams inside
    /// `<think>…</think>`.
    #[arg(long, conflicts_with = "no_think")]
    think: bool,
    /// Ask a reasoning model to answer without thinking.
    #[arg(long)]
    no_think: bool,
    /// cpu, cuda, cuda:N, metal, auto.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Activation dtype: f32, bf16 or f16 (default: f32 on CPU, bf16 on CUDA; LLMs run on
    /// the CPU with f32 only so far).
    #[arg(long)]
    dtype: Option<String>,
    /// How the KV cache stores keys and values: f16, or q8_0 (8 bits with an f16 scale per
    /// 32 values, as llama.cpp's `-ctk q8_0 -ctv q8_0`: about half the memory per position,
    /// logits within about 1 of f16's on small models).
    #[arg(long, value_name = "TYPE", default_value = "f16")]
    kv_type: sapient_generate::KvDtype,
    /// A chat template (Jinja file) to use instead of the model's own.
    #[arg(long, value_name = "FILE")]
    chat_template: Option<std::path::PathBuf>,
    /// Cap on prompt + answer tokens.
    #[arg(long)]
    ctx: Option<usize>,
    /// Print tokens/s and timings at the end.
    #[arg(long)]
    stats: bool,
    /// Constrain the answer to match this regular expression.
    #[arg(long, conflicts_with_all = ["json_schema", "json", "grammar"])]
    regex: Option<String>,
    /// Constrain the answer to the GBNF grammar (llama.cpp's format, from `root`) in this file.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["json_schema", "json"])]
    grammar: Option<std::path::PathBuf>,
    /// Constrain the answer to JSON valid against the JSON Schema in this file.
    #[arg(long, conflicts_with = "json")]
    json_schema: Option<std::path::PathBuf>,
    /// Constrain the answer to be JSON (any value).
    #[arg(long)]
    json: bool,
    /// Layout of constrained JSON: compact (no whitespace), spaced (one space after `:`
    /// and `,`) or flexible (any whitespace, up to 24 characters per gap).
    #[arg(long, default_value = "compact", value_parser = ["compact", "spaced", "flexible"])]
    json_layout: String,
    /// How many levels deep a recursive `$ref` of the JSON Schema may nest; at the last level
    /// the grammar makes the model close the document.
    #[arg(long, requires = "json_schema", default_value_t = sapient_sample::JsonOptions::default().max_ref_depth, value_parser = clap::value_parser!(u32).range(1..))]
    json_ref_depth: u32,
}

/// Speculative decoding (`generate` only): the answer is the one plain decoding gives.
#[derive(Args, Clone)]
struct SpecOpts {
    /// Draft model (preset id or file) sharing the model's vocabulary: it proposes tokens
    /// that the model verifies several at a time.
    #[arg(long, conflicts_with = "lookup")]
    draft: Option<String>,
    /// Draft-free speculation: propose continuations of n-grams already in the prompt/answer.
    #[arg(long)]
    lookup: bool,
    /// Most tokens proposed per step (K adapts between 1 and this).
    #[arg(long, default_value_t = 8)]
    spec_k: usize,
    /// The draft computes logits only for token ids below this, end of sequence and the
    /// rarer ids already seen (0: every logit). The answer does not change.
    #[arg(long, requires = "draft", default_value_t = sapient_generate::speculative::DEFAULT_DRAFT_VOCAB)]
    draft_vocab: usize,
}

impl GenOpts {
    fn json_options(&self) -> sapient_sample::JsonOptions {
        let layout = match self.json_layout.as_str() {
            "spaced" => sapient_sample::JsonOptions::spaced(),
            "flexible" => sapient_sample::JsonOptions::flexible(24),
            _ => sapient_sample::JsonOptions::compact(),
        };
        sapient_sample::JsonOptions { max_ref_depth: self.json_ref_depth, ..layout }
    }

    fn generation_config(&self) -> Result<GenerationConfig> {
        let grammar = if let Some(r) = &self.regex {
            Some(Grammar::regex(r).context("--regex")?)
        } else if let Some(path) = &self.grammar {
            let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            Some(Grammar::gbnf(&text).with_context(|| format!("GBNF grammar {}", path.display()))?)
        } else if let Some(path) = &self.json_schema {
            let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            let schema: serde_json::Value = serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
            let e = sapient_sample::Expr::JsonSchema(schema);
            Some(Grammar::with_options(&e, self.json_options()).with_context(|| format!("JSON schema {}", path.display()))?)
        } else if self.json {
            Some(Grammar::with_options(&sapient_sample::Expr::Json, self.json_options())?)
        } else {
            None
        };
        Ok(GenerationConfig {
            constraint: grammar.map(std::sync::Arc::new),
            max_tokens: self.max_tokens,
            sampling: self.sampling(SamplerConfig::default()),
            stop: self.stop.clone(),
            thinking: if self.think { Some(true) } else if self.no_think { Some(false) } else { None },
            ..GenerationConfig::default()
        })
    }

    /// `base` with the sampling options given on the command line applied over it.
    fn sampling(&self, base: SamplerConfig) -> SamplerConfig {
        SamplerConfig {
            temperature: self.temperature.unwrap_or(base.temperature),
            top_k: self.top_k.or(base.top_k),
            top_p: self.top_p.or(base.top_p),
            min_p: self.min_p.or(base.min_p),
            repetition_penalty: self.repeat_penalty.unwrap_or(base.repetition_penalty),
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed: self.seed.or(base.seed),
            ..base
        }
    }

    fn load(&self) -> Result<Pipeline> {
        let device: DeviceRequest = self.device.parse()?;
        let dtype = match self.dtype.as_deref() {
            None => None,
            Some("f32") => Some(candle_core::DType::F32),
            Some("bf16") => Some(candle_core::DType::BF16),
            Some("f16") => Some(candle_core::DType::F16),
            Some(other) => anyhow::bail!("unknown dtype '{other}' (f32, bf16, f16)"),
        };
        let chat_template = match &self.chat_template {
            Some(p) => Some(std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?),
            None => None,
        };
        let opts = PipelineOptions { device, max_seq_len: self.ctx, dtype, kernels: None, engine: None, kv_dtype: self.kv_type, limits: Default::default(), chat_template };
        let mut bars = Bars::default();
        let pipe = Pipeline::load(&self.model, opts, |p| bars.update(p))
            .with_context(|| format!("loading model '{}'", self.model))?;
        bars.finish();
        Ok(pipe)
    }
}

/// Progress bars for downloads, one per file.
#[derive(Default)]
pub(crate) struct Bars {
    bars: HashMap<String, ProgressBar>,
    loading: Option<ProgressBar>,
}

impl Bars {
    pub(crate) fn update(&mut self, p: Progress) {
        match p {
            Progress::Downloading { source, file, done, total, .. } => {
                let bar = self.bars.entry(file.clone()).or_insert_with(|| {
                    let b = ProgressBar::new(total.unwrap_or(0));
                    b.set_style(
                        ProgressStyle::with_template(
                            "{msg:40!} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
                        )
                        .unwrap_or_else(|_| ProgressStyle::default_bar())
                        .progress_chars("=> "),
                    );
                    b.set_message(format!("{file} ({source})"));
                    b
                });
                if let Some(t) = total {
                    bar.set_length(t);
                }
                bar.set_position(done);
            }
            Progress::Loading { progress } => {
                if progress < 1.0 {
                    let s = ProgressBar::new_spinner();
                    s.set_message("loading model");
                    s.enable_steady_tick(std::time::Duration::from_millis(100));
                    self.loading = Some(s);
                } else if let Some(s) = self.loading.take() {
                    s.finish_and_clear();
                }
            }
            _ => {}
        }
    }
    pub(crate) fn finish(&mut self) {
        for (_, b) in self.bars.drain() {
            b.finish_and_clear();
        }
        if let Some(s) = self.loading.take() {
            s.finish_and_clear();
        }
    }
}

fn print_stats(g: &Generation) {
    let s = &g.stats;
    eprintln!(
        "\n[{} prompt tokens ({} reused) in {:.2}s = {:.1} tok/s | {} tokens in {:.2}s = {:.1} tok/s | first token after {:.2}s | finish: {:?}]",
        s.prompt_tokens,
        s.reused_prompt_tokens,
        s.prefill.as_secs_f64(),
        s.prefill_tokens_per_s(),
        s.generated_tokens,
        s.decode.as_secs_f64(),
        s.decode_tokens_per_s(),
        s.time_to_first_token.as_secs_f64(),
        g.finish
    );
    if s.forced_tokens > 0 {
        eprintln!("[{} tokens forced by the constraint, fed without sampling]", s.forced_tokens);
    }
}

fn stream_to_stdout(piece: &str) -> ControlFlow<()> {
    let mut out = std::io::stdout().lock();
    if out.write_all(piece.as_bytes()).and_then(|_| out.flush()).is_err() {
        return ControlFlow::Break(());
    }
    ControlFlow::Continue(())
}

/// `sapient generate --batch FILE`: every line its own request, all through one engine.
fn generate_batch(file: &std::path::Path, opts: &GenOpts, raw: bool, kv_tokens: usize) -> Result<()> {
    use sapient_generate::{Engine, EngineOptions, KvBudget, KvOptions};
    let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let prompts: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    anyhow::ensure!(!prompts.is_empty(), "{} has no prompts (one per line)", file.display());
    let pipe = opts.load()?;
    let cfg = opts.generation_config()?;
    let engine = Engine::new(&pipe, EngineOptions { kv: KvOptions { budget: KvBudget::Tokens(kv_tokens), dtype: opts.kv_type, ..KvOptions::default() }, ..EngineOptions::default() })
        .context("starting the engine")?;
    let t0 = std::time::Instant::now();
    let handles = prompts
        .iter()
        .map(|p| {
            if raw || !pipe.info().has_chat_template {
                engine.submit_text(p, cfg.clone())
            } else {
                let mut msgs = messages_with_system(&opts.system);
                msgs.push(Message::user(*p));
                engine.submit_chat(&msgs, cfg.clone())
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    let bar = ProgressBar::new(prompts.len() as u64);
    bar.set_style(ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} answers, {elapsed}").unwrap_or_else(|_| ProgressStyle::default_bar()).progress_chars("=> "));
    bar.set_message("generating");
    let mut answers = Vec::with_capacity(handles.len());
    for h in handles {
        answers.push(h.wait());
        bar.inc(1);
    }
    bar.finish_and_clear();
    let wall = t0.elapsed();
    let mut out = std::io::stdout().lock();
    for (i, a) in answers.iter().enumerate() {
        if i > 0 {
            writeln!(out)?;
        }
        match a {
            Ok(g) => writeln!(out, "{}", g.text)?,
            Err(e) => writeln!(out, "[error: {e}]")?,
        }
    }
    drop(out);
    if opts.stats {
        let ok: Vec<&Generation> = answers.iter().filter_map(|a| a.as_ref().ok()).collect();
        let generated: usize = ok.iter().map(|g| g.stats.generated_tokens).sum();
        let prompt_tokens: usize = ok.iter().map(|g| g.stats.prompt_tokens).sum();
        let m = engine.metrics();
        eprintln!(
            "\n[{} requests, {} prompt tokens, {} generated in {:.2}s: {:.1} tok/s aggregate | {} engine steps, {} preemptions, {} prompt tokens from the prefix cache]",
            answers.len(),
            prompt_tokens,
            generated,
            wall.as_secs_f64(),
            generated as f64 / wall.as_secs_f64().max(1e-9),
            m.steps,
            m.preemptions,
            m.cached_prompt_tokens
        );
        for (i, a) in answers.iter().enumerate() {
            match a {
                Ok(g) => eprintln!(
                    "[{i}: {} prompt + {} tokens, first token after {:.2}s, {:?}]",
                    g.stats.prompt_tokens,
                    g.stats.generated_tokens,
                    g.stats.time_to_first_token.as_secs_f64(),
                    g.finish
                ),
                Err(e) => eprintln!("[{i}: error: {e}]"),
            }
        }
    }
    let failed = answers.iter().filter(|a| a.is_err()).count();
    anyhow::ensure!(failed == 0, "{failed} of {} prompts failed", answers.len());
    Ok(())
}

fn messages_with_system(system: &Option<String>) -> Vec<Message> {
    system.iter().map(|s| Message::system(s.clone())).collect()
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    // Kernel options from the environment (SAPIENT_THREADS, SAPIENT_NO_AVX512, SAPIENT_PREFETCH,
    // SAPIENT_HUGE_PAGES, ...); the libraries take them as values.
    let (kernels, warnings) = sapient_tensor::kernels::KernelOptions::from_env();
    for w in warnings {
        tracing::warn!("{w}");
    }
    sapient_tensor::kernels::configure(kernels)?;
    match cli.cmd {
        Cmd::Generate { batch: Some(file), opts, raw, kv_tokens, .. } => generate_batch(&file, &opts, raw, kv_tokens)?,
        Cmd::Generate { prompt, opts, raw, spec, .. } if spec.draft.is_some() || spec.lookup => {
            let prompt = prompt.unwrap_or_default();
            let pipe = opts.load()?;
            let cfg = opts.generation_config()?;
            let draft = match &spec.draft {
                Some(d) => Some(GenOpts { model: d.clone(), ..opts.clone() }.load()?),
                None => None,
            };
            let drafter = match &draft {
                Some(d) => Drafter::Model(d),
                None => Drafter::PromptLookup { max_ngram: 3 },
            };
            let sc = SpecConfig { k: spec.spec_k.clamp(1, 4), k_max: spec.spec_k.max(1), draft_vocab: (spec.draft_vocab > 0).then_some(spec.draft_vocab), ..SpecConfig::default() };
            let (g, st) = if raw || !pipe.info().has_chat_template {
                pipe.generate_speculative(&prompt, &cfg, &drafter, &sc, stream_to_stdout)?
            } else {
                let mut msgs = messages_with_system(&opts.system);
                msgs.push(Message::user(prompt));
                pipe.chat_speculative(&msgs, &cfg, &drafter, &sc, stream_to_stdout)?
            };
            println!();
            if opts.stats {
                print_stats(&g);
                eprintln!(
                    "[speculative: {} of {} proposed tokens accepted ({:.0}%), {:.2} tokens per forward of the model, drafting {:.2}s, model forwards {:.2}s]",
                    st.accepted,
                    st.proposed,
                    100.0 * st.acceptance_rate(),
                    st.tokens_per_target_forward(),
                    st.propose_time.as_secs_f64(),
                    st.verify_time.as_secs_f64()
                );
            }
        }
        Cmd::Generate { prompt, opts, raw, .. } => {
            let prompt = prompt.unwrap_or_default();
            let pipe = opts.load()?;
            let cfg = opts.generation_config()?;
            let g = if raw || !pipe.info().has_chat_template {
                pipe.generate_with(&prompt, &cfg, stream_to_stdout)?
            } else {
                let mut msgs = messages_with_system(&opts.system);
                msgs.push(Message::user(prompt));
                pipe.chat_with(&msgs, &cfg, stream_to_stdout)?
            };
            println!();
            if opts.stats {
                print_stats(&g);
            }
        }
        Cmd::Chat { opts, allow_loops } => chat::run(&opts, allow_loops)?,
        Cmd::Transcribe(args) => transcribe::run(args)?,
        Cmd::Speak(args) => speak::run(args)?,
        Cmd::Talk(args) => talk::run(args)?,
        Cmd::Embed(args) => embed::embed(args)?,
        Cmd::Search(args) => embed::search(args)?,
        Cmd::Serve(args) => serve::run(args)?,
        #[cfg(feature = "microphone")]
        Cmd::Listen(args) => listen::run(args)?,
        Cmd::Models => {
            let hub = Hub::new()?;
            println!("{:28} {:10} {:7} {:11} description", "preset", "kind", "cached", "source");
            for p in hub.registry().presets() {
                let cached = hub.cached(&p.id).unwrap_or(false);
                println!(
                    "{:28} {:10} {:7} {:11} {}",
                    p.id,
                    p.kind,
                    if cached { "yes" } else { "no" },
                    p.sources(),
                    p.description
                );
            }
            println!("\ncache: {}", hub.cache_dir().display());
        }
        Cmd::Pull { names } => {
            let hub = Hub::new()?;
            for id in hub.registry().expand(&names)? {
                let mut bars = Bars::default();
                let r = hub.fetch_preset(&id, &mut |p| bars.update(p))?;
                bars.finish();
                println!("{id}: {}", r.dir.display());
            }
        }
    }
    Ok(())
}
