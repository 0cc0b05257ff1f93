//! The engine: many requests decoded together, one batched forward per step.
//!
//! An [`Engine`] owns a paged KV cache ([`sapient_llama::KvCache`]) for a [`Pipeline`](crate::Pipeline)'s
//! model and runs a scheduler on its own thread. Requests wait in a queue; each step
//!
//! 1. drops requests whose receiver is gone (cancellation frees their blocks at once),
//! 2. admits waiting requests while there are sequence slots and KV blocks for their
//!    prompts, taking the blocks of a cached prefix (another request's system prompt, an
//!    earlier turn) instead of recomputing them,
//! 3. builds one batch: a token for every decoding sequence (or the run of tokens a
//!    constraint forces), then prompt chunks of at most `prefill_chunk` tokens within the
//!    step's `max_step_tokens` (chunked prefill: a long prompt does not stall the others),
//! 4. when the cache runs out, preempts the newest sequence: its finished blocks go to the
//!    prefix cache and it waits to be recomputed (nothing it streamed is lost or repeated),
//! 5. runs [`LlamaModel::forward_batch`](sapient_llama::LlamaModel::forward_batch): every
//!    linear layer over all rows at once, so the weights are read once per step, with logits
//!    only for the rows that end what a sequence had to feed,
//! 6. samples each of those sequences with its own sampler chain, seed, constraint and stop
//!    strings, and streams its text to its own channel.
//!
//! Every row's logits are bit-identical to what the sequence would get alone, so a greedy
//! request gives the same tokens whatever else runs beside it.
//!
//! The code is split the same way: this module holds the handles, options and metrics;
//! `scheduler` decides each step without running the model (admission, chunking,
//! preemption, sessions) and returns plain-data plans (which sequence feeds which tokens,
//! with or without logits); `step` runs them on the model (forward, sampling, streaming);
//! `draft` holds draft-model speculation, `mtp` a hybrid model's speculation with its own
//! multi-token-prediction head; `saved` moves a session's cache between engines.
//!
//! ```no_run
//! use sapient_generate::{Engine, EngineOptions, Event, GenerationConfig, Message, Pipeline};
//! # fn main() -> Result<(), sapient_generate::Error> {
//! let pipe = Pipeline::from_pretrained("smollm2-135m-instruct")?;
//! let engine = Engine::new(&pipe, EngineOptions::default())?;
//! let mut a = engine.submit_chat(&[Message::user("Name a color.")], GenerationConfig::default())?;
//! let b = engine.submit_chat(&[Message::user("Name a fruit.")], GenerationConfig::default())?;
//! while let Some(Event::Text(piece)) = a.blocking_next() {
//!     print!("{piece}"); // the last event is Event::Done with the whole Generation
//! }
//! println!("\n{}", b.wait()?.text);
//! # Ok(()) }
//! ```

use crate::generation::{Generation, GenerationConfig};
use crate::model::Model;
use crate::{Error, Result};
use draft::Draft;
pub use saved::SavedSession;
use crate::decode::Decoder;
use sapient_llama::{KvBudget, KvOptions, KvUsage, SeqId};
use sapient_tokenizers::Message;
use scheduler::{Kept, Scheduler};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::mpsc;

mod draft;
mod mtp;
mod saved;
pub use mtp::MTP_MAX_DRAFTS;
mod scheduler;
mod step;
#[cfg(test)]
mod tests;

/// How an [`Engine`] schedules and how much memory it takes.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// The KV cache: block size and budget (in positions or bytes) over all sequences.
    pub kv: KvOptions,
    /// Sequences decoded at once; more requests wait.
    pub max_seqs: usize,
    /// Rows (tokens) in one forward pass: every decoding sequence's token first, then prompt
    /// chunks up to this.
    pub max_step_tokens: usize,
    /// Prompt tokens of one sequence in one step.
    pub prefill_chunk: usize,
    /// Share full KV blocks across requests with the same prefix.
    pub prefix_cache: bool,
    /// What happens when a sequence reaches the context length.
    pub context: ContextPolicy,
}

/// What a sequence does when it reaches the model's context length (the pipeline's
/// `max_seq_len`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ContextPolicy {
    /// Finish with [`FinishReason::ContextFull`](crate::FinishReason::ContextFull).
    #[default]
    Stop,
    /// Keep going, as llama.cpp's context shift does: keep the first `keep` tokens (the
    /// system prompt, or a few attention-sink tokens) and the newer half of the rest, drop
    /// the older half, and recompute the kept tokens at their new positions (exact keys,
    /// no re-rotation of cached ones). The output continues where it was; the model no
    /// longer sees the dropped stretch.
    Shift { keep: usize },
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            kv: KvOptions { block_size: 32, budget: KvBudget::Tokens(32 * 1024), ..KvOptions::default() },
            max_seqs: 64,
            max_step_tokens: 512,
            prefill_chunk: 256,
            prefix_cache: true,
            context: ContextPolicy::Stop,
        }
    }
}

/// What a request's receiver gets.
#[derive(Debug)]
#[non_exhaustive]
// `Done` is the large one and comes once per request: boxing it would cost every caller a
// match on a box for nothing.
#[allow(clippy::large_enum_variant)]
pub enum Event {
    /// A piece of text (stop strings held back until they cannot match).
    Text(String),
    /// With [`GenerationConfig::logprobs`]: the tokens chosen in a step, after that step's
    /// text (whose last piece may be held back for stop strings).
    Logprobs(Vec<crate::TokenLogprob>),
    /// The end, with the whole generation (or why it failed).
    Done(Result<Generation>),
}

/// A request in flight: receive its text as it comes, or wait for the end. Dropping it
/// cancels the request at the next step and frees its KV blocks.
pub struct RequestHandle {
    rx: mpsc::UnboundedReceiver<Event>,
    id: u64,
    cancel: Arc<AtomicBool>,
}

impl RequestHandle {
    /// The engine's id for this request.
    pub fn id(&self) -> u64 {
        self.id
    }
    /// Stop the request at the next step and keep listening: the last event is still
    /// [`Event::Done`], with [`FinishReason::Cancelled`](crate::FinishReason::Cancelled) and
    /// what was generated until then (dropping the handle cancels too, without an answer).
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Relaxed);
    }
    /// The next event, blocking (outside an async runtime).
    pub fn blocking_next(&mut self) -> Option<Event> {
        self.rx.blocking_recv()
    }
    /// The next event.
    pub async fn next(&mut self) -> Option<Event> {
        self.rx.recv().await
    }
    /// Wait for the end (outside an async runtime), discarding the streamed pieces (the
    /// result's text holds them all).
    pub fn wait(mut self) -> Result<Generation> {
        while let Some(e) = self.rx.blocking_recv() {
            if let Event::Done(r) = e {
                return r;
            }
        }
        Err(Error::Worker("the engine stopped before the request ended".into()))
    }
    /// [`wait`](Self::wait) for async callers.
    pub async fn finish(mut self) -> Result<Generation> {
        while let Some(e) = self.rx.recv().await {
            if let Event::Done(r) = e {
                return r;
            }
        }
        Err(Error::Worker("the engine stopped before the request ended".into()))
    }
}

/// Counters of a running engine (for metrics).
#[derive(Debug, Clone, Default)]
pub struct EngineMetrics {
    pub waiting: usize,
    pub running: usize,
    pub kv: KvUsage,
    pub steps: u64,
    pub generated_tokens: u64,
    pub prompt_tokens: u64,
    /// Prompt tokens taken from the prefix cache.
    pub cached_prompt_tokens: u64,
    pub preemptions: u64,
    /// Context shifts ([`ContextPolicy::Shift`]).
    pub context_shifts: u64,
    pub finished: u64,
    pub cancelled: u64,
}

#[derive(Default)]
struct Shared {
    waiting: AtomicUsize,
    running: AtomicUsize,
    kv: Mutex<KvUsage>,
    steps: AtomicU64,
    generated: AtomicU64,
    prompt: AtomicU64,
    cached: AtomicU64,
    preemptions: AtomicU64,
    context_shifts: AtomicU64,
    finished: AtomicU64,
    cancelled: AtomicU64,
    stop: AtomicBool,
    /// Tokens each session keeps in the cache between its requests.
    sessions: Mutex<HashMap<u64, usize>>,
}

struct NewRequest {
    id: u64,
    prompt: Vec<u32>,
    cfg: GenerationConfig,
    tx: mpsc::UnboundedSender<Event>,
    cancel: Arc<AtomicBool>,
    session: Option<u64>,
    submitted: Instant,
}

impl NewRequest {
    fn cancelled(&self) -> bool {
        self.tx.is_closed() || self.cancel.load(Ordering::Relaxed)
    }
}

/// A request with a sequence in the cache (or preempted, waiting to get one back).
struct Active {
    id: u64,
    seq: Option<SeqId>,
    /// What belongs in the cache: the decoder's tokens, unless a context shift dropped a
    /// stretch.
    kv_tokens: Vec<u32>,
    /// Tokens whose keys and values are in the cache.
    computed: usize,
    session: Option<u64>,
    dec: Decoder,
    tx: mpsc::UnboundedSender<Event>,
    cancel: Arc<AtomicBool>,
    /// Guesses (prompt lookup or the draft model's) at the end of `kv_tokens`, fed this step
    /// to be verified.
    drafts: usize,
    /// The sequence in the draft model's cache, and how many of `kv_tokens` it holds.
    draft_seq: Option<SeqId>,
    draft_computed: usize,
    /// With an MTP head (where `draft_seq` is the sequence in the head's cache): the main
    /// model's output-normed hidden states of positions `mtp_h0..`, not yet taken by the head.
    mtp_h: Vec<f32>,
    mtp_h0: usize,
    /// The LoRA adapters it applies (its rows' keys and values are its own: no prefix-cache
    /// sharing).
    lora: Vec<sapient_llama::LoraUse>,
}

impl Active {
    /// Whether its blocks may come from and go to the prefix cache (and a hybrid's state
    /// snapshots): with the cache on, and only without LoRA adapters, whose keys and values
    /// are its own.
    fn shares_prefixes(&self, opts: &EngineOptions) -> bool {
        opts.prefix_cache && self.lora.is_empty()
    }

    /// Forget unverified guesses (they are proposed again when the sequence decodes).
    fn drop_drafts(&mut self) {
        let len = self.kv_tokens.len() - self.drafts;
        self.kv_tokens.truncate(len);
        self.drafts = 0;
        self.draft_computed = self.draft_computed.min(len);
    }

    fn cancelled(&self) -> bool {
        self.tx.is_closed() || self.cancel.load(Ordering::Relaxed)
    }
}

/// What the scheduler's queue carries.
enum Msg {
    Request(Box<NewRequest>),
    /// A [`Session`] was dropped: free what it keeps.
    EndSession(u64),
    /// Forget every kept session and the prefix cache.
    Reset,
    /// Nothing: makes an idle scheduler look at its stop flag.
    Wake,
    /// A session's kept cache, out ([`Engine::save_session`]).
    Save(u64, saved::Reply<SavedSession>),
    /// A session's kept cache, in ([`Engine::restore_session`]).
    Restore(u64, Box<SavedSession>, saved::Reply<()>),
}

/// A conversation whose KV cache the engine keeps between its requests: a request
/// submitted in a session ([`Engine::submit_in`]) reuses every token of the previous one's
/// prompt and answer that its own prompt starts with, to the token (the prefix cache shares
/// only whole blocks). Requests in one session should come one after another; a second one
/// while the first runs gets a sequence of its own. The kept cache is given back when the
/// engine needs the room, and when the session is dropped.
pub struct Session {
    id: u64,
    tx: std::sync::mpsc::Sender<Msg>,
    shared: Arc<Shared>,
}

impl Session {
    /// Tokens the engine keeps for this session now (0 while a request of it runs).
    pub fn cached_tokens(&self) -> usize {
        self.shared.sessions.lock().map(|m| m.get(&self.id).copied().unwrap_or(0)).unwrap_or(0)
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.tx.send(Msg::EndSession(self.id));
    }
}

/// Many requests on one model, decoded together (see the module docs). Cheap to share
/// behind an `Arc`; dropping the last handle stops the scheduler once its requests end.
pub struct Engine {
    model: Model,
    /// Whether [`Engine::with_draft`] gave it a draft model, or its model drafts with an MTP head.
    has_draft: bool,
    tx: Option<std::sync::mpsc::Sender<Msg>>,
    shared: Arc<Shared>,
    next_id: AtomicU64,
    worker: Option<std::thread::JoinHandle<()>>,
}

impl Engine {
    /// An engine over `pipeline`'s model (the weights are shared, not copied; the engine has
    /// its own KV cache). Fails when the options make no sense. A hybrid model with a
    /// multi-token-prediction head (Qwen3.5) speculates with it for requests that ask for
    /// [`GenerationConfig::draft`] (at most [`MTP_MAX_DRAFTS`] guesses a step, see `mtp`);
    /// the model then keeps every row's hidden state after each forward.
    pub fn new(pipeline: &Model, opts: EngineOptions) -> Result<Self> {
        Self::start(pipeline, None, opts)
    }

    /// An engine whose requests with [`GenerationConfig::draft`] speculate with `draft`, a
    /// smaller model with the same vocabulary (loaded on its own: not
    /// `pipeline` itself). The draft gets a KV cache of its own under the same options.
    pub fn with_draft(pipeline: &Model, draft: &Model, opts: EngineOptions) -> Result<Self> {
        if pipeline.same_model(draft) {
            return Err(Error::VocabMismatch {
                target: pipeline.info().id.clone(),
                draft: draft.info().id.clone(),
                what: "the draft must be a separate pipeline (load the model twice)".into(),
            });
        }
        pipeline.check_same_vocab(draft)?;
        Self::start(pipeline, Some(draft), opts)
    }

    fn start(pipeline: &Model, draft: Option<&Model>, opts: EngineOptions) -> Result<Self> {
        if opts.max_seqs == 0 || opts.max_step_tokens == 0 || opts.prefill_chunk == 0 {
            return Err(Error::InvalidOptions("max_seqs, max_step_tokens and prefill_chunk must be at least 1".into()));
        }
        let (kv, mtp) = {
            let mut inner = pipeline.lock_inner()?;
            let kv = inner.model.new_kv_cache(opts.kv)?;
            // A hybrid with an MTP head (draft models do not speculate for hybrids).
            let mtp = match inner.model.mtp_hidden_size().filter(|_| draft.is_none() && kv.has_seq_state()) {
                Some(hidden) => {
                    inner.model.keep_for_mtp(true);
                    Some(mtp::MtpDraft::new(inner.model.new_mtp_cache(opts.kv)?, hidden))
                }
                None => None,
            };
            (kv, mtp)
        };
        let draft = match draft {
            Some(d) => {
                let inner = d.lock_inner()?;
                let kv = inner.model.new_kv_cache(opts.kv)?;
                Some(Draft { model: d.clone(), kv, logits: Vec::new() })
            }
            None => None,
        };
        let has_draft = draft.is_some() || mtp.is_some();
        let shared = Arc::new(Shared::default());
        let (tx, rx) = std::sync::mpsc::channel();
        let mut sched = Scheduler::new(pipeline.clone(), opts, kv, shared.clone());
        sched.draft = draft;
        sched.mtp = mtp;
        let worker = std::thread::Builder::new()
            .name("sapient-engine".into())
            .spawn(move || sched.run(rx))
            .map_err(|e| Error::Worker(format!("cannot start the engine thread: {e}")))?;
        Ok(Self { model: pipeline.clone(), has_draft, tx: Some(tx), shared, next_id: AtomicU64::new(1), worker: Some(worker) })
    }

    /// The model (and tokenizer) it runs.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// Queue a request for `prompt` (token ids).
    pub fn submit(&self, prompt: Vec<u32>, cfg: GenerationConfig) -> Result<RequestHandle> {
        self.enqueue(prompt, cfg, None)
    }

    /// A new [`Session`]: its requests keep their cache for the next one.
    pub fn session(&self) -> Result<Session> {
        let tx = self.tx.clone().ok_or_else(|| Error::Worker("the engine has stopped".into()))?;
        Ok(Session { id: self.next_id.fetch_add(1, Ordering::Relaxed), tx, shared: self.shared.clone() })
    }

    /// Queue a request for `prompt` in `session`, reusing what its previous request left in
    /// the cache.
    pub fn submit_in(&self, session: &Session, prompt: Vec<u32>, cfg: GenerationConfig) -> Result<RequestHandle> {
        if !Arc::ptr_eq(&session.shared, &self.shared) {
            return Err(Error::InvalidOptions("the session belongs to another engine".into()));
        }
        self.enqueue(prompt, cfg, Some(session.id))
    }

    /// Forget every session's kept cache and the prefix cache (requests that run go on).
    pub fn clear_cache(&self) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(Msg::Reset);
        }
    }

    fn enqueue(&self, prompt: Vec<u32>, cfg: GenerationConfig, session: Option<u64>) -> Result<RequestHandle> {
        if prompt.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        let max = self.model.info().max_seq_len;
        if prompt.len() >= max {
            return Err(Error::PromptTooLong { tokens: prompt.len(), max });
        }
        cfg.sampling.validate()?;
        if !cfg.lora.is_empty() {
            let loaded = self.model.loras()?.len();
            if let Some(u) = cfg.lora.iter().find(|u| u.id >= loaded || !u.scale.is_finite()) {
                return Err(Error::InvalidOptions(format!("LoRA adapter {} with scale {}: {loaded} adapters are loaded", u.id, u.scale)));
            }
        }
        if cfg.draft.is_some() && !self.has_draft {
            return Err(Error::InvalidOptions("speculation with a draft model needs an engine made by Engine::with_draft (or a model with an MTP head)".into()));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::unbounded_channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let req = NewRequest { id, prompt, cfg, tx, cancel: cancel.clone(), session, submitted: Instant::now() };
        self.shared.waiting.fetch_add(1, Ordering::Relaxed);
        let sent = self.tx.as_ref().map(|t| t.send(Msg::Request(Box::new(req))).is_ok()).unwrap_or(false);
        if !sent {
            self.shared.waiting.fetch_sub(1, Ordering::Relaxed);
            return Err(Error::Worker("the engine has stopped".into()));
        }
        Ok(RequestHandle { rx, id, cancel })
    }

    /// Queue a raw-prompt completion (no chat template).
    pub fn submit_text(&self, prompt: &str, cfg: GenerationConfig) -> Result<RequestHandle> {
        if prompt.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        let ids = self.model.tokenizer().encode(prompt, true)?;
        self.submit(ids, cfg)
    }

    /// Queue a chat answer (the model's chat template).
    pub fn submit_chat(&self, messages: &[Message], cfg: GenerationConfig) -> Result<RequestHandle> {
        let prompt = self.model.render_chat_with(messages, cfg.thinking)?;
        let ids = self.model.tokenizer().encode(&prompt, false)?;
        self.submit(ids, cfg)
    }

    pub fn metrics(&self) -> EngineMetrics {
        let s = &self.shared;
        EngineMetrics {
            waiting: s.waiting.load(Ordering::Relaxed),
            running: s.running.load(Ordering::Relaxed),
            kv: s.kv.lock().map(|k| *k).unwrap_or_default(),
            steps: s.steps.load(Ordering::Relaxed),
            generated_tokens: s.generated.load(Ordering::Relaxed),
            prompt_tokens: s.prompt.load(Ordering::Relaxed),
            cached_prompt_tokens: s.cached.load(Ordering::Relaxed),
            preemptions: s.preemptions.load(Ordering::Relaxed),
            context_shifts: s.context_shifts.load(Ordering::Relaxed),
            finished: s.finished.load(Ordering::Relaxed),
            cancelled: s.cancelled.load(Ordering::Relaxed),
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        // Sessions hold senders too: wake the scheduler so that it sees the flag.
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(Msg::Wake);
        }
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}
