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

use crate::decode::Decoder;
use crate::generation::{FinishReason, Generation, GenerationConfig, GenerationStats};
use crate::model::{common_prefix, Model};
use crate::{Error, Result};
pub use saved::SavedSession;
use sapient_llama::{BatchSeq, KvBudget, KvCache, KvOptions, KvUsage, Logits, SeqId};
use sapient_tokenizers::Message;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::mpsc;

mod saved;

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
    /// Finish with [`FinishReason::ContextFull`].
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
    /// [`Event::Done`], with [`FinishReason::Cancelled`] and what was generated until then
    /// (dropping the handle cancels too, without an answer).
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
    /// Whether [`Engine::with_draft`] gave it a draft model.
    has_draft: bool,
    tx: Option<std::sync::mpsc::Sender<Msg>>,
    shared: Arc<Shared>,
    next_id: AtomicU64,
    worker: Option<std::thread::JoinHandle<()>>,
}

impl Engine {
    /// An engine over `pipeline`'s model (the weights are shared, not copied; the engine has
    /// its own KV cache). Fails when the options make no sense.
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
        let kv = {
            let inner = pipeline.lock_inner()?;
            inner.model.new_kv_cache(opts.kv)?
        };
        let draft = match draft {
            Some(d) => {
                let inner = d.lock_inner()?;
                let kv = inner.model.new_kv_cache(opts.kv)?;
                Some(Draft { model: d.clone(), kv, logits: Vec::new() })
            }
            None => None,
        };
        let has_draft = draft.is_some();
        let shared = Arc::new(Shared::default());
        let (tx, rx) = std::sync::mpsc::channel();
        let mut sched = Scheduler::new(pipeline.clone(), opts, kv, shared.clone());
        sched.draft = draft;
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
        if cfg.draft.is_some() && !self.has_draft {
            return Err(Error::InvalidOptions("speculation with a draft model needs an engine made by Engine::with_draft".into()));
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
}

impl Active {
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

/// A finished session request's sequence, kept for the session's next request.
struct Kept {
    seq: SeqId,
    /// The tokens in its cache.
    tokens: Vec<u32>,
    /// When it was kept (a step count), for giving back the oldest first.
    at: u64,
}

struct Scheduler {
    model: Model,
    opts: EngineOptions,
    kv: KvCache,
    shared: Arc<Shared>,
    waiting: VecDeque<NewRequest>,
    /// Preempted sequences, resumed before new requests.
    preempted: VecDeque<Active>,
    running: Vec<Active>,
    sessions: HashMap<u64, Kept>,
    logits: Vec<f32>,
    eos: Vec<u32>,
    steps: u64,
    draft: Option<Draft>,
}

/// The draft model of [`Engine::with_draft`], with its own cache.
struct Draft {
    model: Model,
    kv: KvCache,
    logits: Vec<f32>,
}

/// What one sequence feeds in a step.
struct Plan {
    idx: usize,
    n: usize,
    logits: bool,
    /// Logits for every row (verifying guesses), not only the last.
    all: bool,
}

impl Scheduler {
    fn new(model: Model, opts: EngineOptions, kv: KvCache, shared: Arc<Shared>) -> Self {
        let eos = model.tokenizer().eos_token_ids().to_vec();
        Self {
            model,
            opts,
            kv,
            shared,
            waiting: VecDeque::new(),
            preempted: VecDeque::new(),
            running: Vec::new(),
            sessions: HashMap::new(),
            logits: Vec::new(),
            eos,
            steps: 0,
            draft: None,
        }
    }

    fn run(&mut self, rx: std::sync::mpsc::Receiver<Msg>) {
        loop {
            let idle = self.running.is_empty() && self.preempted.is_empty() && self.waiting.is_empty();
            if self.shared.stop.load(Ordering::Relaxed) && idle {
                return;
            }
            if idle {
                match rx.recv() {
                    Ok(m) => self.receive(m),
                    Err(_) => return,
                }
            }
            while let Ok(m) = rx.try_recv() {
                self.receive(m);
            }
            // A bug in one step must not take every later request down with the thread:
            // what was in flight fails with the message, and the engine starts afresh.
            if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.step())) {
                let msg = p
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                tracing::error!("engine step panicked: {msg}");
                self.fail_all(&msg);
            }
            self.publish();
        }
    }

    /// Fail every admitted request (after a panic: their state is unknown), free the whole
    /// cache and the kept sessions. Waiting requests stay queued.
    fn fail_all(&mut self, msg: &str) {
        let failed: Vec<Active> = self.running.drain(..).chain(self.preempted.drain(..)).collect();
        for mut a in failed {
            a.seq = None;
            self.shared.finished.fetch_add(1, Ordering::Relaxed);
            let _ = a.tx.send(Event::Done(Err(Error::Worker(format!("the engine step failed: {msg}")))));
        }
        self.sessions.clear();
        if let Ok(mut m) = self.shared.sessions.lock() {
            m.clear();
        }
        match self.model.lock_inner().and_then(|inner| Ok(inner.model.new_kv_cache(self.opts.kv)?)) {
            Ok(kv) => self.kv = kv,
            Err(e) => tracing::error!("cannot make a fresh KV cache after a failed step: {e}"),
        }
        if let Some(d) = &mut self.draft {
            match d.model.lock_inner().and_then(|inner| Ok(inner.model.new_kv_cache(self.opts.kv)?)) {
                Ok(kv) => d.kv = kv,
                Err(e) => tracing::error!("cannot make a fresh draft KV cache after a failed step: {e}"),
            }
        }
    }

    fn receive(&mut self, m: Msg) {
        match m {
            Msg::Request(r) => self.waiting.push_back(*r),
            Msg::EndSession(s) => self.forget_session(s),
            Msg::Reset => {
                let all: Vec<u64> = self.sessions.keys().copied().collect();
                for s in all {
                    self.forget_session(s);
                }
                self.kv.clear_prefix_cache();
            }
            Msg::Wake => {}
            Msg::Save(s, reply) => {
                let _ = reply.send(self.save(s));
            }
            Msg::Restore(s, saved, reply) => {
                let _ = reply.send(self.restore(s, *saved));
            }
        }
    }

    /// Take session `s`'s kept sequence (it stops counting as kept).
    fn take_kept(&mut self, s: u64) -> Option<Kept> {
        if let Ok(mut m) = self.shared.sessions.lock() {
            m.remove(&s);
        }
        self.sessions.remove(&s)
    }

    fn forget_session(&mut self, s: u64) {
        if let Some(k) = self.take_kept(s) {
            let _ = self.kv.free(k.seq);
        }
    }

    /// Give back the oldest kept session sequence; whether there was one.
    fn reclaim(&mut self) -> bool {
        match self.sessions.iter().min_by_key(|(_, k)| k.at).map(|(s, _)| *s) {
            Some(s) => {
                self.forget_session(s);
                true
            }
            None => false,
        }
    }

    fn publish(&self) {
        self.shared.waiting.store(self.waiting.len() + self.preempted.len(), Ordering::Relaxed);
        self.shared.running.store(self.running.len(), Ordering::Relaxed);
        if let Ok(mut k) = self.shared.kv.lock() {
            *k = self.kv.usage();
        }
    }

    fn step(&mut self) {
        self.drop_cancelled();
        self.admit();
        if self.running.is_empty() {
            return;
        }
        let plans = self.plan();
        if plans.is_empty() {
            return;
        }
        let batch: Vec<BatchSeq<'_>> = plans
            .iter()
            .filter_map(|p| {
                let a = &self.running[p.idx];
                Some(BatchSeq {
                    seq: a.seq?,
                    tokens: &a.kv_tokens[a.computed..a.computed + p.n],
                    logits: p.logits.then_some(if p.all { Logits::All } else { Logits::Last }),
                })
            })
            .collect();
        let result = match self.model.lock_inner() {
            Ok(mut inner) => inner.model.forward_batch(&mut self.kv, &batch, &mut self.logits).map_err(Error::from),
            Err(e) => Err(e),
        };
        drop(batch);
        self.steps += 1;
        self.shared.steps.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = result {
            // A failed step fails its sequences (their state is unknown); others wait.
            let msg = e.to_string();
            let mut idxs: Vec<usize> = plans.iter().map(|p| p.idx).collect();
            idxs.sort_unstable();
            for &i in idxs.iter().rev() {
                let a = self.running.swap_remove(i);
                self.finish(a, Err(Error::Worker(format!("forward pass failed: {msg}"))));
            }
            return;
        }
        let vocab = self.model.info().vocab_size;
        let mut row = 0;
        let mut done: Vec<(usize, Result<FinishReason>)> = Vec::new();
        for p in &plans {
            let a = &mut self.running[p.idx];
            let before = a.computed;
            a.computed += p.n;
            let mut r = Ok(None);
            if p.logits {
                let rows = if p.all { p.n } else { 1 };
                let logits = &mut self.logits[row * vocab..(row + rows) * vocab];
                row += rows;
                let tx = a.tx.clone();
                let mut emit = |piece| tx.send(Event::Text(piece)).is_ok();
                let had = a.dec.tokens().len();
                if a.drafts > 0 {
                    // Keep the guesses the model agrees with; the cache drops the others.
                    let drafts = a.kv_tokens[before + 1..before + p.n].to_vec();
                    let mut accepted = 0;
                    r = a.dec.verify(logits, vocab, &drafts, &self.eos, &mut emit, &mut accepted);
                    a.drafts = 0;
                    a.kv_tokens.truncate(before + 1);
                    a.computed = before + 1 + accepted;
                    // The draft's cache keeps what was accepted.
                    a.draft_computed = a.draft_computed.min(a.computed);
                } else {
                    let mut fed = 0;
                    r = a.dec.advance(logits, &self.eos, &mut emit, &mut fed);
                }
                let lps = a.dec.new_logprobs();
                if !lps.is_empty() {
                    let _ = a.tx.send(Event::Logprobs(lps));
                }
                let new = &a.dec.tokens()[had..];
                a.kv_tokens.extend_from_slice(new);
                self.shared.generated.fetch_add(new.len() as u64, Ordering::Relaxed);
                if a.computed > a.kv_tokens.len() || p.all {
                    // Guesses past what was kept (rejected, or after an end) leave the cache.
                    a.computed = a.computed.min(a.kv_tokens.len());
                    if let Some(seq) = a.seq {
                        rewind(&mut self.kv, seq, &mut a.computed);
                    }
                }
            }
            // Prompt blocks become shareable as soon as they are full.
            if self.opts.prefix_cache && (a.computed <= a.dec.prompt_len() || p.logits) {
                if let Some(seq) = a.seq {
                    let _ = self.kv.commit(seq, &a.kv_tokens[..a.computed]);
                }
            }
            // A hybrid's state where its prompt reaches a block boundary (the end of a chunk
            // of a multiple of the block size, or its last one) is kept for later requests.
            let a = &self.running[p.idx];
            if let (Some(seq), Some(end)) = (a.seq, self.snapshot_at(a)) {
                if a.computed <= end && a.computed.is_multiple_of(self.kv.block_size()) {
                    let _ = self.kv.snapshot_state(seq);
                }
            }
            match r {
                Ok(None) => {}
                Ok(Some(reason)) => done.push((p.idx, Ok(reason))),
                Err(e) => done.push((p.idx, Err(e))),
            }
        }
        done.sort_by_key(|d| std::cmp::Reverse(d.0));
        for (i, reason) in done {
            let mut a = self.running.swap_remove(i);
            let r = reason.and_then(|reason| Self::result(&mut a, reason));
            self.finish(a, r);
        }
    }

    fn result(a: &mut Active, finish: FinishReason) -> Result<Generation> {
        let tx = a.tx.clone();
        a.dec.result(finish, &mut |piece| tx.send(Event::Text(piece)).is_ok())
    }

    /// End a request: its blocks go (full ones to the prefix cache; the whole sequence kept
    /// for its session), its receiver gets the result.
    fn finish(&mut self, mut a: Active, r: Result<Generation>) {
        self.free_draft(&mut a);
        match (a.session, a.seq, r.is_ok()) {
            (Some(s), Some(seq), true) => {
                if self.opts.prefix_cache {
                    let _ = self.kv.commit(seq, &a.kv_tokens[..a.computed.min(a.kv_tokens.len())]);
                }
                // A request that ran beside another of its session replaces that one's kept cache.
                self.forget_session(s);
                let tokens = a.kv_tokens[..a.computed.min(a.kv_tokens.len())].to_vec();
                if let Ok(mut m) = self.shared.sessions.lock() {
                    m.insert(s, tokens.len());
                }
                self.sessions.insert(s, Kept { seq, tokens, at: self.steps });
                a.seq = None;
            }
            _ => self.release(&mut a),
        }
        let cancelled = matches!(&r, Ok(g) if g.finish == FinishReason::Cancelled);
        if cancelled {
            self.shared.cancelled.fetch_add(1, Ordering::Relaxed);
        } else {
            self.shared.finished.fetch_add(1, Ordering::Relaxed);
        }
        let _ = a.tx.send(Event::Done(r));
    }

    fn drop_cancelled(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].cancelled() {
                let mut a = self.running.swap_remove(i);
                let r = Self::result(&mut a, FinishReason::Cancelled);
                self.finish(a, r);
            } else {
                i += 1;
            }
        }
        let mut i = 0;
        while i < self.preempted.len() {
            if self.preempted[i].cancelled() {
                if let Some(mut a) = self.preempted.remove(i) {
                    let r = Self::result(&mut a, FinishReason::Cancelled);
                    self.finish(a, r);
                }
            } else {
                i += 1;
            }
        }
        let mut i = 0;
        while i < self.waiting.len() {
            if self.waiting[i].cancelled() {
                if let Some(r) = self.waiting.remove(i) {
                    self.shared.cancelled.fetch_add(1, Ordering::Relaxed);
                    let g = Generation {
                        text: String::new(),
                        reasoning: None,
                        tokens: Vec::new(),
                        logprobs: Vec::new(),
                        finish: FinishReason::Cancelled,
                        stats: GenerationStats { prompt_tokens: r.prompt.len(), ..Default::default() },
                    };
                    let _ = r.tx.send(Event::Done(Ok(g)));
                }
            } else {
                i += 1;
            }
        }
    }

    /// Blocks a sequence needs to hold `tokens` positions.
    fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.kv.block_size())
    }

    fn admit(&mut self) {
        // Headroom: every running sequence may need a new block in the next step.
        let headroom = self.running.len();
        while self.running.len() < self.opts.max_seqs {
            let resume = !self.preempted.is_empty();
            let tokens_needed = match (resume, self.waiting.front()) {
                (true, _) => self.preempted.front().map_or(0, |a| a.kv_tokens.len() + 1),
                (false, Some(r)) => r.prompt.len() + 1,
                (false, None) => break,
            };
            let need = self.blocks_for(tokens_needed);
            if need > self.kv.total_blocks() {
                // Alone it can never fit.
                let err = Error::TooLargeForCache { needed: tokens_needed, capacity: self.kv.capacity_tokens() };
                if resume {
                    if let Some(mut a) = self.preempted.pop_front() {
                        let r = Self::result(&mut a, FinishReason::ContextFull);
                        self.finish(a, r);
                    }
                } else if let Some(r) = self.waiting.pop_front() {
                    let _ = r.tx.send(Event::Done(Err(err)));
                }
                continue;
            }
            // Kept session caches give way to requests that are waiting.
            while need + headroom > self.kv.available_blocks() && self.reclaim() {}
            if need + headroom > self.kv.available_blocks() && !self.running.is_empty() {
                break;
            }
            let mut a = if resume {
                match self.preempted.pop_front() {
                    Some(a) => a,
                    None => break,
                }
            } else {
                let Some(r) = self.waiting.pop_front() else { break };
                match self.activate(r) {
                    Some(a) => a,
                    None => continue,
                }
            };
            let kept = match a.session {
                Some(s) if !resume => self.take_kept(s),
                _ => None,
            };
            let (seq, reused) = match kept {
                Some(k) => {
                    // Everything the new prompt starts with, keeping at least one token to feed.
                    let common = common_prefix(&k.tokens, &a.kv_tokens).min(a.kv_tokens.len() - 1);
                    match self.kv.truncate(k.seq, common) {
                        Ok(()) => (k.seq, common),
                        Err(_) => {
                            let _ = self.kv.free(k.seq);
                            (self.kv.new_seq(), 0)
                        }
                    }
                }
                None => {
                    let seq = self.kv.new_seq();
                    let reused = if self.opts.prefix_cache { self.kv.attach_prefix(seq, &a.kv_tokens).unwrap_or(0) } else { 0 };
                    (seq, reused)
                }
            };
            a.seq = Some(seq);
            a.computed = reused;
            if !resume {
                a.dec.stats.reused_prompt_tokens = reused;
                self.shared.prompt.fetch_add(a.dec.prompt_len() as u64, Ordering::Relaxed);
                self.shared.cached.fetch_add(reused as u64, Ordering::Relaxed);
            }
            a.dec.started.get_or_insert_with(Instant::now);
            self.running.push(a);
        }
    }

    fn activate(&mut self, r: NewRequest) -> Option<Active> {
        match Decoder::new(&self.model, r.prompt.clone(), r.cfg, r.submitted) {
            Ok(dec) => Some(Active {
                id: r.id,
                seq: None,
                kv_tokens: r.prompt,
                computed: 0,
                session: r.session,
                dec,
                tx: r.tx,
                cancel: r.cancel,
                drafts: 0,
                draft_seq: None,
                draft_computed: 0,
            }),
            Err(e) => {
                let _ = r.tx.send(Event::Done(Err(e)));
                None
            }
        }
    }

    /// This step's rows, with their blocks reserved (preempting when the cache is full).
    fn plan(&mut self) -> Vec<Plan> {
        let max_seq = self.model.info().max_seq_len;
        // Decoding sequences first (one token, or a forced run), oldest first; then prompts.
        let mut order: Vec<usize> = (0..self.running.len()).collect();
        order.sort_by_key(|&i| {
            let a = &self.running[i];
            (a.computed < a.dec.prompt_len(), a.id)
        });
        self.propose_with_draft(max_seq);
        // Prompt lookup: decoding sequences that speculate feed their guesses after their
        // newest token, to be verified by this step's forward. Not for hybrid models: their
        // recurrent state cannot drop rejected guesses.
        let speculate = !self.kv.has_seq_state();
        for a in self.running.iter_mut() {
            if speculate && a.drafts == 0 && a.computed >= a.dec.prompt_len() && a.kv_tokens.len() == a.computed + 1 {
                let guesses = a.dec.propose(max_seq.saturating_sub(a.computed + 1));
                a.drafts = guesses.len();
                a.kv_tokens.extend_from_slice(&guesses);
            }
        }
        let mut plans = Vec::new();
        let mut budget = self.opts.max_step_tokens;
        let mut context_full = Vec::new();
        let mut shift = Vec::new();
        for i in order {
            let a = &self.running[i];
            let pending = a.kv_tokens.len() - a.computed;
            if pending == 0 {
                continue;
            }
            let mut n = if pending == 1 || a.drafts > 0 { pending } else { pending.min(self.opts.prefill_chunk).min(budget) };
            if let Some(end) = self.snapshot_at(a).filter(|&end| a.computed < end) {
                // A hybrid's prompt stops at its last block boundary once, for a state snapshot.
                n = n.min(end - a.computed);
            }
            if n == 0 {
                continue;
            }
            if a.computed + n > max_seq {
                match self.opts.context {
                    ContextPolicy::Shift { keep } if a.kv_tokens.len() > keep + 2 => shift.push((i, keep)),
                    _ => context_full.push(a.id),
                }
                continue;
            }
            plans.push(Plan { idx: i, n, logits: a.computed + n == a.kv_tokens.len(), all: a.drafts > 0 });
            budget = budget.saturating_sub(n);
        }
        for (i, keep) in shift {
            // Recomputed from the next step on, as prompt chunks.
            let a = &mut self.running[i];
            a.drop_drafts();
            let len = a.kv_tokens.len();
            let keep = keep.min(len / 2);
            let drop = (len - keep) / 2;
            a.kv_tokens.drain(keep..keep + drop);
            a.computed = a.computed.min(keep);
            if let Some(seq) = a.seq {
                rewind(&mut self.kv, seq, &mut a.computed);
            }
            a.draft_computed = a.draft_computed.min(a.computed);
            self.shared.context_shifts.fetch_add(1, Ordering::Relaxed);
        }
        // Reserve; when the cache is full, preempt the newest sequence and try again.
        let mut k = 0;
        while k < plans.len() {
            let (idx, n) = (plans[k].idx, plans[k].n);
            let Some(seq) = self.running[idx].seq else {
                k += 1;
                continue;
            };
            match self.kv.reserve(seq, n) {
                Ok(()) => k += 1,
                // Kept session caches go before running sequences are preempted.
                Err(_) if self.reclaim() => {}
                Err(_) => {
                    // The newest running sequence other than those already reserved goes first.
                    let victim = (0..self.running.len())
                        .filter(|&j| !plans[..k].iter().any(|p| p.idx == j))
                        .max_by_key(|&j| self.running[j].id);
                    match victim {
                        Some(v) if v != idx || self.running.len() > 1 => {
                            self.preempt(v, &mut plans);
                            if v == idx {
                                continue;
                            }
                        }
                        _ => {
                            // Alone and still no room.
                            context_full.push(self.running[idx].id);
                            plans.remove(k);
                        }
                    }
                }
            }
        }
        for id in context_full {
            // Indices shift as sequences leave: fix the plans.
            if let Some(i) = self.running.iter().position(|a| a.id == id) {
                let mut a = Self::take_planned(&mut self.running, i, &mut plans);
                let r = Self::result(&mut a, FinishReason::ContextFull);
                self.finish(a, r);
            }
        }
        plans
    }

    /// Remove running sequence `i`, dropping its plan and renumbering the plan of the sequence
    /// `swap_remove` moves into its place.
    fn take_planned(running: &mut Vec<Active>, i: usize, plans: &mut Vec<Plan>) -> Active {
        plans.retain(|p| p.idx != i);
        let a = running.swap_remove(i);
        let moved = running.len();
        for p in plans.iter_mut().filter(|p| p.idx == moved) {
            p.idx = i;
        }
        a
    }

    /// Give back `a`'s sequence: full blocks to the prefix cache (when on), the rest freed.
    fn release(&mut self, a: &mut Active) {
        self.free_draft(a);
        if let Some(seq) = a.seq.take() {
            if self.opts.prefix_cache {
                let _ = self.kv.commit(seq, &a.kv_tokens[..a.computed.min(a.kv_tokens.len())]);
            }
            let _ = self.kv.free(seq);
        }
    }

    /// Give back `a`'s sequence in the draft model's cache.
    fn free_draft(&mut self, a: &mut Active) {
        if let (Some(d), Some(seq)) = (&mut self.draft, a.draft_seq.take()) {
            let _ = d.kv.free(seq);
        }
        a.draft_computed = 0;
    }

    /// Draft-model speculation: every decoding sequence whose request asks for it
    /// ([`GenerationConfig::draft`]) gets up to K guesses appended after its newest token, to
    /// be verified by this step's forward. The draft first catches up with what the sequence
    /// holds (its prompt, then the tokens accepted since), then proposes its greedy choice
    /// one token at a time, each a batched forward over all those sequences. A failed draft
    /// forward (e.g. its cache full) only costs the guesses: those sequences decode plainly.
    fn propose_with_draft(&mut self, max_seq: usize) {
        if self.kv.has_seq_state() {
            // A hybrid target's recurrent state cannot drop rejected guesses.
            return;
        }
        let Scheduler { draft, running, eos, .. } = self;
        let Some(d) = draft.as_mut() else { return };
        let want: Vec<(usize, usize)> = running
            .iter()
            .enumerate()
            .filter(|(_, a)| a.drafts == 0 && a.computed >= a.dec.prompt_len() && a.kv_tokens.len() == a.computed + 1)
            .map(|(i, a)| (i, a.dec.draft_wanted(max_seq.saturating_sub(a.computed + 1))))
            .filter(|&(_, k)| k > 0)
            .collect();
        if want.is_empty() {
            return;
        }
        let Ok(mut inner) = d.model.lock_inner() else { return };
        let vocab = d.model.info().vocab_size;
        let target_vocab = self.model.info().vocab_size;
        for &(i, _) in &want {
            let a = &mut running[i];
            // At least the newest token is fed, so that its logits give the first guess.
            a.draft_computed = a.draft_computed.min(a.kv_tokens.len() - 1);
            let seq = *a.draft_seq.get_or_insert_with(|| d.kv.new_seq());
            if d.kv.truncate(seq, a.draft_computed).is_err() {
                let _ = d.kv.free(seq);
                a.draft_seq = Some(d.kv.new_seq());
                a.draft_computed = 0;
            }
        }
        let started = Instant::now();
        // Logits of the frequent ids only (`SpecConfig::draft_vocab`, the largest the
        // requests ask for), the end-of-sequence ids and the rarer ones their text holds.
        let first = want.iter().try_fold(0usize, |m, &(i, _)| running[i].dec.draft_vocab().map(|v| m.max(v)));
        let restricted = match first {
            Some(first) if first < vocab => {
                let mut extra: Vec<u32> = eos.clone();
                for &(i, _) in &want {
                    extra.extend(running[i].kv_tokens.iter().filter(|&&t| t as usize >= first));
                }
                extra.sort_unstable();
                extra.dedup();
                inner.model.restrict_logits(Some((first, &extra))).unwrap_or(false)
            }
            _ => false,
        };
        let mut guesses: Vec<Vec<u32>> = vec![Vec::new(); want.len()];
        let mut live: Vec<usize> = (0..want.len()).collect();
        let mut feeds: Vec<Vec<u32>> = Vec::new();
        while !live.is_empty() {
            feeds.clear();
            for &w in &live {
                let a = &running[want[w].0];
                feeds.push(match guesses[w].last() {
                    Some(&g) => vec![g],
                    None => a.kv_tokens[a.draft_computed..].to_vec(),
                });
            }
            let batch: Vec<BatchSeq<'_>> = live
                .iter()
                .zip(&feeds)
                .filter_map(|(&w, f)| Some(BatchSeq { seq: running[want[w].0].draft_seq?, tokens: f, logits: Some(Logits::Last) }))
                .collect();
            let result = inner.model.forward_batch(&mut d.kv, &batch, &mut d.logits);
            if let Err(e) = result {
                if restricted {
                    let _ = inner.model.restrict_logits(None);
                }
                // The cache lengths of this batch are unknown: start those sequences afresh.
                tracing::debug!("draft forward failed, no guesses this step: {e}");
                for &(i, _) in &want {
                    let a = &mut running[i];
                    if let Some(seq) = a.draft_seq.take() {
                        let _ = d.kv.free(seq);
                    }
                    a.draft_computed = 0;
                }
                return;
            }
            for (row, &w) in live.iter().enumerate() {
                let logits = &d.logits[row * vocab..(row + 1) * vocab];
                running[want[w].0].draft_computed += feeds[row].len();
                // No guess from logits with nothing finite, nor a token the target lacks.
                if let Some(best) = sapient_sample::argmax(logits).ok().filter(|&t| (t as usize) < target_vocab) {
                    guesses[w].push(best);
                }
            }
            live.retain(|&w| {
                let g = &guesses[w];
                // Nothing after an end of sequence (nor after a token the target lacks).
                g.len() < want[w].1 && g.last().is_some_and(|t| !eos.contains(t))
            });
        }
        if restricted {
            // Other users of the draft pipeline get every logit.
            let _ = inner.model.restrict_logits(None);
        }
        let took = started.elapsed();
        for (w, &(i, _)) in want.iter().enumerate() {
            let a = &mut running[i];
            a.drafts = guesses[w].len();
            a.kv_tokens.extend_from_slice(&guesses[w]);
            a.dec.stats.draft_time += took / want.len() as u32;
        }
    }

    /// For a hybrid model with the prefix cache: the prompt position (its last block boundary
    /// before its last token) where the recurrent state is kept for later requests.
    fn snapshot_at(&self, a: &Active) -> Option<usize> {
        let bs = self.kv.block_size();
        let end = a.dec.prompt_len().saturating_sub(1) / bs * bs;
        (self.kv.has_seq_state() && self.opts.prefix_cache && end > 0).then_some(end)
    }

    /// Free `v`'s blocks (full ones stay in the prefix cache) and queue it for recomputation.
    fn preempt(&mut self, v: usize, plans: &mut Vec<Plan>) {
        // The sequence (and a hybrid's recurrent state with it) is freed: it is recomputed
        // from its tokens when it comes back.
        let mut a = Self::take_planned(&mut self.running, v, plans);
        a.drop_drafts();
        self.release(&mut a);
        a.computed = 0;
        self.shared.preemptions.fetch_add(1, Ordering::Relaxed);
        self.preempted.push_back(a);
    }
}

/// Cut `seq` back to `computed` positions; where the cache cannot (a hybrid model's recurrent
/// state goes back only to 0), empty it so that everything is recomputed.
fn rewind(kv: &mut KvCache, seq: SeqId, computed: &mut usize) {
    if kv.truncate(seq, *computed).is_err() {
        let _ = kv.truncate(seq, 0);
        *computed = 0;
    }
}
