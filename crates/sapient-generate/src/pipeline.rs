use crate::engine::{Engine, EngineOptions, Event, Session};
use crate::chat::{split_reasoning, ChatTools, Choice, OutputParser, Piece, Reply};
use crate::generation::{FinishReason, Generation, GenerationConfig};
use crate::model::{Model, ModelInfo};
use crate::{Error, Result, TextStream};
use sapient_hub::{Hub, Progress};
use sapient_llama::{KvBudget, KvDtype, KvOptions, LlamaConfig, LlamaModel};

use sapient_tensor::{DeviceRequest, GgufFile};
use sapient_tokenizers::{Message, Tokenizer};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

/// How to load a pipeline.
#[derive(Debug, Clone, Default)]
pub struct PipelineOptions {
    pub device: DeviceRequest,
    /// Cap on prompt + generated tokens (and the KV cache). `None`: the model's context
    /// length, capped at 8192 to keep the cache small on a laptop.
    pub max_seq_len: Option<usize>,
    /// Activation dtype; `None`: the device's default (f32 on CPU, bf16 on CUDA, f16 on Metal).
    /// LLMs run on the CPU backend with f32 only so far: another device or dtype is
    /// [`sapient_llama::Error::NoBackend`] (`auto` is the CPU).
    pub dtype: Option<candle_core::DType>,
    /// The CPU kernels' options (threads, instruction sets, prefetching, huge pages). They
    /// are process-wide: the first model loaded (or the first product) fixes them, and a
    /// different set later is an error. `None`: whatever is in force (the defaults).
    pub kernels: Option<sapient_tensor::kernels::KernelOptions>,
    /// The engine behind [`Pipeline::generate`] and [`Pipeline::chat`] (made on first use).
    /// `None`: room in the KV cache for two full contexts, so that the pipeline's own
    /// conversation stays cached while another thread's call runs beside it.
    pub engine: Option<EngineOptions>,
    /// How the KV cache of the pipeline's own engine stores keys and values when `engine`
    /// is `None` (f16 by default; [`KvDtype::Q8_0`] takes about half the memory per
    /// position). An `engine` given carries its own, in `kv.dtype`.
    pub kv_dtype: KvDtype,
    /// The most a model file may make the loader allocate (see [`sapient_tensor::Limits`]):
    /// GGUF metadata arrays and tensors, safetensors tensors.
    pub limits: sapient_tensor::Limits,
    /// A chat template (Jinja source) to use instead of the model's own, as llama.cpp's
    /// `--chat-template-file`: for a model without one, or one whose template is wrong.
    pub chat_template: Option<String>,
}

/// A loaded language model with its tokenizer ([`Model`], which it derefs to) and the
/// simple one-request API on top of an [`Engine`]. Clone to share: calls from several
/// threads run together, batched by the pipeline's engine.
#[derive(Clone)]
pub struct Pipeline {
    model: Model,
    /// The engine that runs `generate` and `chat`, with the conversation whose cache it
    /// keeps between calls; made on first use. Not shared with the engine's own handle of
    /// the pipeline (that would be a cycle that keeps both alive).
    engine: Arc<Mutex<Option<(Engine, Session)>>>,
    /// The engine of draft-model speculation ([`Pipeline::chat_speculative`] with
    /// [`Drafter::Model`]), with the draft it was made for; made on first use.
    draft_engine: Arc<Mutex<Option<(Model, Engine, Session)>>>,
    engine_opts: Option<EngineOptions>,
    kv_dtype: KvDtype,
    /// Held (shared) by every running call; `cache_len` and `reset_cache` take it alone.
    runs: Arc<RwLock<()>>,
}

impl std::ops::Deref for Pipeline {
    type Target = Model;
    fn deref(&self) -> &Model {
        &self.model
    }
}

enum Source {
    Gguf(PathBuf),
    HfDir(PathBuf),
}

fn classify(reference: &str, path: &Path) -> Result<Source> {
    if path.is_dir() {
        if path.join("config.json").exists() {
            return Ok(Source::HfDir(path.to_path_buf()));
        }
        let ggufs: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(|e| Error::NoModelFile { reference: reference.into(), what: e.to_string() })?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "gguf"))
            .collect();
        return match ggufs.as_slice() {
            [one] => Ok(Source::Gguf(one.clone())),
            [] => Err(Error::NoModelFile {
                reference: reference.into(),
                what: "the directory has neither config.json nor a .gguf file".into(),
            }),
            _ => Err(Error::NoModelFile {
                reference: reference.into(),
                what: "the directory has several .gguf files; name one".into(),
            }),
        };
    }
    Ok(Source::Gguf(path.to_path_buf()))
}

impl Pipeline {
    /// Load a preset id (see `sapient models`), a local GGUF file or HF directory, or a Hub
    /// repo id, on the CPU, fetching it on first use.
    pub fn from_pretrained(reference: &str) -> Result<Self> {
        Self::load(reference, PipelineOptions::default(), |_| {})
    }

    /// Load with options, reporting download and load progress.
    pub fn load(reference: &str, opts: PipelineOptions, mut progress: impl FnMut(Progress)) -> Result<Self> {
        let local = Path::new(reference);
        let source = if local.exists() {
            classify(reference, local)?
        } else {
            let hub = Hub::new()?;
            let resolved = hub.resolve(reference, &mut progress)?;
            if resolved.kind != "llm" && !resolved.kind.is_empty() {
                return Err(Error::NotALanguageModel {
                    reference: reference.into(),
                    kind: resolved.kind.clone(),
                });
            }
            match resolved.file("gguf") {
                Ok(p) => Source::Gguf(p.to_path_buf()),
                Err(_) => classify(reference, &resolved.dir)?,
            }
        };
        if let Some(k) = &opts.kernels {
            sapient_tensor::kernels::configure(k.clone())?;
        }
        progress(Progress::Loading { progress: 0.0 });
        // LLMs run on the CPU backend only so far: `auto` means the CPU, an accelerator is an
        // error naming it (before any attempt to open it).
        let device = match opts.device {
            DeviceRequest::Cpu | DeviceRequest::Auto => candle_core::Device::Cpu,
            DeviceRequest::Cuda(n) | DeviceRequest::Metal(n) => {
                let kind = if matches!(opts.device, DeviceRequest::Cuda(_)) { "cuda" } else { "metal" };
                return Err(sapient_llama::Error::NoBackend { what: format!("device {kind}:{n}") }.into());
            }
        };
        let dtype = opts.dtype.unwrap_or_else(|| sapient_tensor::activation_dtype(&device));
        let (model, tokenizer, path, cfg) = match source {
            Source::Gguf(path) => {
                let g = GgufFile::open_with(&path, &opts.limits)?;
                let cfg = LlamaConfig::from_gguf(&g)?;
                let tokenizer = Tokenizer::from_gguf(&g)?;
                let max = opts.max_seq_len.unwrap_or(cfg.max_position_embeddings.min(8192));
                let model = LlamaModel::load_with_dtype(&g, &cfg, &device, Some(max), dtype)?;
                (model, tokenizer, path, cfg)
            }
            Source::HfDir(dir) => {
                let cfg = LlamaConfig::from_hf_config(&dir.join("config.json"))?;
                let tokenizer = Tokenizer::from_file(&dir.join("tokenizer.json"))?;
                let src = sapient_tensor::open_weights_with(&dir, &opts.limits)?;
                let max = opts.max_seq_len.unwrap_or(cfg.max_position_embeddings.min(8192));
                let model = LlamaModel::load_with_dtype(src.as_ref(), &cfg, &device, Some(max), dtype)?;
                (model, tokenizer, dir, cfg)
            }
        };
        let mut tokenizer = tokenizer;
        if let Some(t) = &opts.chat_template {
            tokenizer.set_chat_template(t)?;
        }
        progress(Progress::Loading { progress: 1.0 });
        let info = ModelInfo {
            id: reference.to_string(),
            path,
            architecture: cfg.arch.name().to_string(),
            context_length: cfg.max_position_embeddings,
            max_seq_len: model.max_seq_len(),
            vocab_size: cfg.vocab_size,
            has_chat_template: tokenizer.chat_template().is_some(),
        };
        Ok(Self {
            model: Model::new(model, tokenizer, info),
            engine: Arc::default(),
            draft_engine: Arc::default(),
            engine_opts: opts.engine,
            kv_dtype: opts.kv_dtype,
            runs: Arc::default(),
        })
    }

    /// The model and tokenizer (what an [`Engine`] runs).
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The options of the pipeline's own engine.
    fn engine_options(&self) -> EngineOptions {
        self.engine_opts.clone().unwrap_or_else(|| EngineOptions {
            kv: KvOptions { block_size: 32, budget: KvBudget::Tokens(2 * self.info.max_seq_len), dtype: self.kv_dtype },
            max_seqs: 16,
            ..EngineOptions::default()
        })
    }

    /// Complete a raw prompt (no chat template), blocking.
    pub fn generate(&self, prompt: &str, cfg: &GenerationConfig) -> Result<Generation> {
        self.generate_with(prompt, cfg, |_| ControlFlow::Continue(()))
    }

    /// Complete a raw prompt, calling `on_text` with each new piece of text (possibly empty,
    /// once per token); returning `Break` stops the generation.
    pub fn generate_with(
        &self,
        prompt: &str,
        cfg: &GenerationConfig,
        on_text: impl FnMut(&str) -> ControlFlow<()>,
    ) -> Result<Generation> {
        if prompt.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        let ids = self.tokenizer.encode(prompt, true)?;
        self.run(ids, cfg, on_text)
    }

    /// Answer a conversation using the model's chat template, blocking.
    pub fn chat(&self, messages: &[Message], cfg: &GenerationConfig) -> Result<Generation> {
        self.chat_with(messages, cfg, |_| ControlFlow::Continue(()))
    }

    pub fn chat_with(
        &self,
        messages: &[Message],
        cfg: &GenerationConfig,
        on_text: impl FnMut(&str) -> ControlFlow<()>,
    ) -> Result<Generation> {
        let prompt = self.render_chat_with(messages, cfg.thinking)?;
        let ids = self.tokenizer.encode(&prompt, false)?;
        self.run(ids, cfg, on_text)
    }

    /// Answer a conversation with tools, as `sapient serve` does: the tools offered the way
    /// the template takes them, the answer constrained to valid calls as `tools.choice` asks
    /// (a `cfg.constraint` stays when no call may be made), and split into reasoning, text
    /// and calls. `on_piece` gets each piece as it streams; returning `Break` stops.
    pub fn chat_tools_with(
        &self,
        messages: &[Message],
        tools: &ChatTools,
        cfg: &GenerationConfig,
        mut on_piece: impl FnMut(&Piece) -> ControlFlow<()>,
    ) -> Result<(Generation, Reply)> {
        let mut opts = sapient_tokenizers::RenderOptions::default();
        if let Some(t) = cfg.thinking {
            opts.extra.insert("enable_thinking".into(), t.into());
        }
        let (prompt, style) = self.render_chat_tools(messages, &tools.functions, opts)?;
        let mut cfg = cfg.clone();
        let calls = tools.choice != Choice::None;
        if calls || cfg.constraint.is_none() {
            let g = style.constraint(&tools.functions, &tools.choice, tools.parallel, sapient_sample::JsonOptions::default());
            if let Some(g) = g.map_err(sapient_sample::Error::from)? {
                cfg.constraint = Some(Arc::new(g));
            }
        }
        if style.keeps_special_tokens(calls) {
            cfg.skip_special_tokens = false;
        }
        let mut parser = OutputParser::new(Some(crate::chat::think::prompt_opens(&prompt)), style.format, calls);
        let mut reply = Reply::default();
        let mut each = |pieces: Vec<Piece>, reply: &mut Reply| {
            let mut flow = ControlFlow::Continue(());
            for p in &pieces {
                reply.push(p);
                if flow.is_continue() {
                    flow = on_piece(p);
                }
            }
            flow
        };
        let ids = self.tokenizer.encode(&prompt, false)?;
        let g = self.run(ids, &cfg, |text| each(parser.push(text), &mut reply))?;
        let _ = each(parser.finish(), &mut reply);
        Ok((g, reply))
    }

    /// Stream a raw-prompt completion; the work runs on its own thread, and dropping the
    /// stream stops it.
    pub fn stream(&self, prompt: &str, cfg: &GenerationConfig) -> TextStream {
        let (this, prompt, cfg) = (self.clone(), prompt.to_string(), cfg.clone());
        TextStream::spawn(move |on_text| this.generate_with(&prompt, &cfg, on_text))
    }

    /// Stream a chat answer.
    pub fn stream_chat(&self, messages: &[Message], cfg: &GenerationConfig) -> TextStream {
        let (this, messages, cfg) = (self.clone(), messages.to_vec(), cfg.clone());
        TextStream::spawn(move |on_text| this.chat_with(&messages, &cfg, on_text))
    }

    /// The model, for one step (waits for a running generation to finish).
    /// Tokens of the last conversation held in the KV cache, which the next call reuses
    /// where its prompt starts with them (waits for running generations to finish).
    pub fn cache_len(&self) -> usize {
        let _alone = self.runs.write();
        let kept = match self.engine.lock() {
            Ok(e) => e.as_ref().map(|(_, s)| s.cached_tokens()),
            Err(_) => None,
        };
        kept.unwrap_or(0)
    }

    /// Forget the KV cache: the kept conversation and the prefix cache (the next generation
    /// recomputes its whole prompt). Waits for running generations to finish.
    pub fn reset_cache(&self) {
        let _alone = self.runs.write();
        if let Ok(e) = self.engine.lock() {
            if let Some((engine, _)) = e.as_ref() {
                engine.clear_cache();
            }
        }
        if let Ok(e) = self.draft_engine.lock() {
            if let Some((_, engine, _)) = e.as_ref() {
                engine.clear_cache();
            }
        }
        if let Ok(mut inner) = self.inner.lock() {
            inner.model.clear_cache();
        }
    }

    fn run(
        &self,
        prompt: Vec<u32>,
        cfg: &GenerationConfig,
        on_text: impl FnMut(&str) -> ControlFlow<()>,
    ) -> Result<Generation> {
        if prompt.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        let _running = self.runs.read().map_err(|_| Error::Worker("a previous generation panicked".into()))?;
        let handle = {
            let mut slot = self.engine.lock().map_err(|_| Error::Worker("a previous generation panicked".into()))?;
            if slot.is_none() {
                let engine = Engine::new(self, self.engine_options())?;
                let session = engine.session()?;
                *slot = Some((engine, session));
            }
            match slot.as_ref() {
                Some((engine, session)) => engine.submit_in(session, prompt, cfg.clone())?,
                None => return Err(Error::Worker("the pipeline's engine vanished".into())),
            }
        };
        Self::follow(handle, on_text)
    }

    /// [`run`](Self::run) with `draft` proposing ([`GenerationConfig::draft`]) through an
    /// engine made with it (the pipeline keeps one, remade when the draft changes).
    fn run_with_draft(&self, prompt: Vec<u32>, cfg: &GenerationConfig, draft: &Pipeline, on_text: impl FnMut(&str) -> ControlFlow<()>) -> Result<Generation> {
        let _running = self.runs.read().map_err(|_| Error::Worker("a previous generation panicked".into()))?;
        let handle = {
            let mut slot = self.draft_engine.lock().map_err(|_| Error::Worker("a previous generation panicked".into()))?;
            if !slot.as_ref().is_some_and(|(d, _, _)| d.same_model(draft)) {
                *slot = None;
                let engine = Engine::with_draft(self, draft, self.engine_options())?;
                let session = engine.session()?;
                *slot = Some((draft.model.clone(), engine, session));
            }
            match slot.as_ref() {
                Some((_, engine, session)) => engine.submit_in(session, prompt, cfg.clone())?,
                None => return Err(Error::Worker("the pipeline's engine vanished".into())),
            }
        };
        Self::follow(handle, on_text)
    }

    /// Stream a request's text to `on_text` until it ends (cancelling it when `on_text` breaks).
    fn follow(mut handle: crate::engine::RequestHandle, mut on_text: impl FnMut(&str) -> ControlFlow<()>) -> Result<Generation> {
        // What the caller was given, up to where it stopped listening.
        let mut given = String::new();
        let mut stopped = false;
        // Not `blocking_recv`: a caller may be inside an async runtime (this blocks, as a
        // generation always did).
        while let Some(event) = futures::executor::block_on(handle.next()) {
            match event {
                Event::Text(piece) if !stopped => {
                    given.push_str(&piece);
                    if on_text(&piece).is_break() {
                        stopped = true;
                        handle.cancel();
                    }
                }
                Event::Text(_) | Event::Logprobs(_) => {}
                Event::Done(r) => {
                    let mut g = r?;
                    if stopped {
                        g.finish = FinishReason::Cancelled;
                        (g.reasoning, g.text) = split_reasoning(&given);
                    }
                    return Ok(g);
                }
            }
        }
        Err(Error::Worker("the engine stopped before the request ended".into()))
    }
}

/// Where speculative proposals come from.
pub enum Drafter<'a> {
    /// n-gram matches in the prompt and output so far (no draft model needed).
    PromptLookup { max_ngram: usize },
    /// A smaller model with the same vocabulary.
    Model(&'a Pipeline),
}

impl Pipeline {
    /// Chat with speculative decoding. Under greedy sampling the output equals plain greedy
    /// decoding of this model; under sampling it has the same distribution.
    pub fn chat_speculative(
        &self,
        messages: &[Message],
        cfg: &GenerationConfig,
        drafter: &Drafter<'_>,
        spec: &crate::speculative::SpecConfig,
        on_text: impl FnMut(&str) -> ControlFlow<()>,
    ) -> Result<(Generation, crate::speculative::SpecStats)> {
        let prompt = self.render_chat_with(messages, cfg.thinking)?;
        let ids = self.tokenizer.encode(&prompt, false)?;
        self.run_speculative(ids, cfg, drafter, spec, on_text)
    }

    /// Raw-prompt completion with speculative decoding.
    pub fn generate_speculative(
        &self,
        prompt: &str,
        cfg: &GenerationConfig,
        drafter: &Drafter<'_>,
        spec: &crate::speculative::SpecConfig,
        on_text: impl FnMut(&str) -> ControlFlow<()>,
    ) -> Result<(Generation, crate::speculative::SpecStats)> {
        if prompt.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        let ids = self.tokenizer.encode(prompt, true)?;
        self.run_speculative(ids, cfg, drafter, spec, on_text)
    }

    fn run_speculative(
        &self,
        prompt: Vec<u32>,
        cfg: &GenerationConfig,
        drafter: &Drafter<'_>,
        spec: &crate::speculative::SpecConfig,
        on_text: impl FnMut(&str) -> ControlFlow<()>,
    ) -> Result<(Generation, crate::speculative::SpecStats)> {
        if cfg.constraint.is_some() {
            return Err(Error::Unsupported("constrained generation with speculative decoding"));
        }
        if cfg.logprobs.is_some() {
            return Err(Error::Unsupported("logprobs with speculative decoding"));
        }
        use crate::speculative::{LookupDecoding, SpecStats};
        if prompt.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        cfg.sampling.validate()?;
        spec.validate()?;
        // Verified inside the engine's batched step, beside any other calls.
        let g = match drafter {
            Drafter::PromptLookup { max_ngram } => {
                let lookup = LookupDecoding { max_ngram: *max_ngram, spec: spec.clone() };
                self.run(prompt, &GenerationConfig { lookup: Some(lookup), ..cfg.clone() }, on_text)?
            }
            Drafter::Model(d) => {
                if Arc::ptr_eq(&d.inner, &self.inner) {
                    return Err(Error::VocabMismatch {
                        target: self.info.id.clone(),
                        draft: d.info.id.clone(),
                        what: "the draft must be a separate pipeline (load the model twice)".into(),
                    });
                }
                self.check_same_vocab(d)?;
                self.run_with_draft(prompt, &GenerationConfig { draft: Some(spec.clone()), ..cfg.clone() }, d, on_text)?
            }
        };
        // Only a draft model spends time proposing (prompt lookup's `draft_time` is zero).
        let stats = SpecStats {
            target_forwards: g.stats.forwards,
            proposed: g.stats.proposed_tokens,
            accepted: g.stats.accepted_tokens,
            generated: g.tokens.len(),
            propose_time: g.stats.draft_time,
            verify_time: (g.stats.prefill + g.stats.decode).saturating_sub(g.stats.draft_time),
        };
        Ok((g, stats))
    }
}
