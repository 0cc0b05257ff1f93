//! Language models loaded on demand: each one named in [`Models::on_demand`](crate::Models)
//! loads on its first request (requests for it wait, up to
//! [`LoadOptions::load_timeout`]), and when the models loaded together would pass
//! [`LoadOptions::budget_bytes`], the least recently used one with nothing in flight is
//! unloaded first. A model's footprint is estimated before it loads: its weights' file size
//! plus the KV cache its engine options reserve. `POST /models/load` and `/models/unload`
//! (llama-server's router shapes) do the same by hand.

use crate::error::ApiError;
use crate::metrics::{Histogram, LlmStats};
use crate::{AppState, Llm};
use sapient_generate::{Engine, EngineOptions, KvBudget, Pipeline, PipelineOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use axum::response::IntoResponse;

/// A language model the server loads when a request names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LlmSource {
    /// The name requests use (`model`).
    pub id: String,
    /// What to load: a GGUF file, a model directory, a preset id or a Hub repo id.
    pub reference: String,
}

/// How the models of [`Models::on_demand`](crate::Models) load, and how much memory they
/// may take together.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// The most bytes the language models loaded on demand may take together, by estimate
    /// (weights file size + KV cache budget). `None`: no limit.
    pub budget_bytes: Option<u64>,
    /// How long a request waits for its model to load (and for room to be made for it)
    /// before it gets 503 with `Retry-After`; the load itself goes on.
    pub load_timeout: Duration,
    /// How each model loads.
    pub pipeline: PipelineOptions,
    /// Each model's engine (its KV budget counts toward its footprint).
    pub engine: EngineOptions,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self { budget_bytes: None, load_timeout: Duration::from_secs(120), pipeline: PipelineOptions::default(), engine: EngineOptions::default() }
    }
}

/// What a model's slot holds.
#[derive(Default)]
struct Slot {
    llm: Option<Arc<Llm>>,
    /// Estimated bytes while loaded.
    footprint: u64,
    /// The tick of its last use (least recently used goes first).
    last_used: u64,
    loading: bool,
    /// Why the last load failed.
    error: Option<String>,
}

/// One language model: loaded or not, with counters that outlive its loads.
pub(crate) struct Entry {
    pub(crate) id: String,
    /// Where to load it from; `None` for a model given loaded (never unloaded).
    source: Option<LlmSource>,
    slot: Mutex<Slot>,
    changed: tokio::sync::Notify,
    pub(crate) stats: Arc<LlmStats>,
    pub(crate) loads: AtomicU64,
    pub(crate) unloads: AtomicU64,
    pub(crate) load_failures: AtomicU64,
    pub(crate) load_time: Histogram,
    /// Requests waiting for it to load.
    waiting: AtomicUsize,
    created: u64,
}

impl Entry {
    /// Given loaded, or loaded on demand at least once (its request figures are worth showing).
    pub(crate) fn ever_loaded(&self) -> bool {
        self.source.is_none() || self.loads.load(Ordering::Relaxed) > 0
    }
}

/// `/metrics` rows of the models loaded on demand: loads, unloads, failures, load time, the
/// state and estimated memory of each, and the budget.
pub(crate) fn render_metrics(out: &mut String, llms: &Llms) {
    use crate::metrics::{gauge, model_label as label};
    let on_demand: Vec<&Entry> = llms.entries.iter().filter(|e| e.source.is_some()).collect();
    type Count = fn(&Entry) -> &AtomicU64;
    let counters: [(&str, &str, Count); 3] = [
        ("sapient:model_loads_total", "Language models loaded on demand.", |e| &e.loads),
        ("sapient:model_unloads_total", "Language models unloaded (for room in the budget, or asked).", |e| &e.unloads),
        ("sapient:model_load_failures_total", "Loads on demand that failed.", |e| &e.load_failures),
    ];
    for (name, help, get) in counters {
        let rows: Vec<(String, f64)> = on_demand.iter().map(|e| (label(&e.id), get(e).load(Ordering::Relaxed) as f64)).collect();
        gauge(out, name, help, "counter", &rows);
    }
    let (mut loaded, mut memory) = (Vec::new(), Vec::new());
    for e in &on_demand {
        let s = lock(&e.slot);
        loaded.push((label(&e.id), if s.llm.is_some() { 1.0 } else { 0.0 }));
        memory.push((label(&e.id), s.footprint as f64));
    }
    gauge(out, "sapient:model_loaded", "1 while the model is loaded.", "gauge", &loaded);
    gauge(out, "sapient:model_memory_bytes", "Estimated bytes of a loaded model (weights file + KV cache budget).", "gauge", &memory);
    let labels: Vec<String> = on_demand.iter().map(|e| label(&e.id)).collect();
    let rows: Vec<(&str, &Histogram)> = labels.iter().zip(&on_demand).map(|(l, e)| (l.as_str(), &e.load_time)).collect();
    crate::metrics::histograms(out, "sapient:model_load_seconds", "Time to load a model on demand (making room included).", &rows);
    if let Some(b) = llms.opts.budget_bytes {
        gauge(out, "sapient:models_budget_bytes", "The memory budget of the models loaded on demand.", "gauge", &[(String::new(), b as f64)]);
    }
}

/// A model's state as `/v1/models` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    Loaded,
    Loading,
    Unloaded,
}

impl Status {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Loaded => "loaded",
            Self::Loading => "loading",
            Self::Unloaded => "unloaded",
        }
    }
}

/// What [`Llms::view`] tells about one model.
pub(crate) struct View {
    pub(crate) id: String,
    pub(crate) status: Status,
    pub(crate) failed: Option<String>,
    pub(crate) footprint: u64,
    pub(crate) created: u64,
    pub(crate) on_demand: bool,
}

/// Every language model of the server, loaded or not.
pub(crate) struct Llms {
    pub(crate) entries: Vec<Entry>,
    pub(crate) opts: LoadOptions,
    tick: AtomicU64,
    /// One load at a time, so that the budget is checked against what is loaded.
    loader: tokio::sync::Mutex<()>,
}

fn lock(m: &Mutex<Slot>) -> std::sync::MutexGuard<'_, Slot> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Llms {
    pub(crate) fn new(loaded: Vec<Llm>, on_demand: Vec<LlmSource>, opts: LoadOptions) -> Self {
        let now = crate::unix_now();
        let entry = |id: String, source: Option<LlmSource>, slot: Slot, stats: Arc<LlmStats>, created: u64| Entry {
            id,
            source,
            slot: Mutex::new(slot),
            changed: tokio::sync::Notify::new(),
            stats,
            loads: AtomicU64::new(0),
            unloads: AtomicU64::new(0),
            load_failures: AtomicU64::new(0),
            load_time: Histogram::new(LOAD_SECONDS),
            waiting: AtomicUsize::new(0),
            created,
        };
        let mut entries: Vec<Entry> = loaded
            .into_iter()
            .map(|l| {
                let (id, stats, created) = (l.id.clone(), l.stats.clone(), l.created);
                entry(id, None, Slot { llm: Some(Arc::new(l)), ..Slot::default() }, stats, created)
            })
            .collect();
        entries.extend(on_demand.into_iter().map(|s| entry(s.id.clone(), Some(s), Slot::default(), Arc::default(), now)));
        Self { entries, opts, tick: AtomicU64::new(1), loader: tokio::sync::Mutex::new(()) }
    }

    pub(crate) fn ids(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|e| e.id.as_str())
    }

    /// The entry a request names (the first one when it names none).
    pub(crate) fn entry(&self, name: Option<&str>) -> Option<&Entry> {
        match name {
            None | Some("") => self.entries.first(),
            Some(n) => self.entries.iter().find(|e| e.id == n),
        }
    }

    /// The loaded model of an entry, marked as used now.
    fn loaded(&self, e: &Entry) -> Option<Arc<Llm>> {
        let mut s = lock(&e.slot);
        let llm = s.llm.clone()?;
        s.last_used = self.tick.fetch_add(1, Ordering::Relaxed);
        Some(llm)
    }

    /// The loaded model `name` names, if it is loaded (without loading it).
    pub(crate) fn get_loaded(&self, name: &str) -> Option<Arc<Llm>> {
        self.entries.iter().find(|e| e.id == name).and_then(|e| lock(&e.slot).llm.clone())
    }

    /// Every model's state.
    pub(crate) fn view(&self) -> Vec<View> {
        self.entries
            .iter()
            .map(|e| {
                let s = lock(&e.slot);
                let status = if s.llm.is_some() { Status::Loaded } else if s.loading { Status::Loading } else { Status::Unloaded };
                View { id: e.id.clone(), status, failed: s.error.clone(), footprint: s.footprint, created: e.created, on_demand: e.source.is_some() }
            })
            .collect()
    }

    /// Call `f` with each loaded model (under its lock: keep it short).
    pub(crate) fn for_each_loaded(&self, mut f: impl FnMut(&Entry, &Llm)) {
        for e in &self.entries {
            if let Some(l) = &lock(&e.slot).llm {
                f(e, l);
            }
        }
    }

    /// Estimated bytes of the models loaded on demand.
    pub(crate) fn used_bytes(&self) -> u64 {
        self.entries.iter().map(|e| lock(&e.slot).footprint).sum()
    }
}

/// Buckets of the load-time histogram (seconds).
const LOAD_SECONDS: &[f64] = &[0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0];

/// How long a client is told to wait before it asks again for a model that is loading.
const RETRY_SECS: u64 = 2;

fn unavailable(message: String) -> ApiError {
    ApiError { status: axum::http::StatusCode::SERVICE_UNAVAILABLE, retry_after: Some(RETRY_SECS), ..ApiError::internal(message) }.with_code("model_not_loaded")
}

impl AppState {
    /// The language model a request names (the first one when it names none), loaded now
    /// if it is not: the request waits for the load, up to the load timeout.
    pub(crate) async fn llm(&self, name: Option<&str>) -> Result<Arc<Llm>, ApiError> {
        let models = self.models()?;
        let llms = &models.llms;
        let Some(entry) = llms.entry(name) else {
            return Err(match name {
                None | Some("") => ApiError::not_found("this server has no language model"),
                Some(n) => ApiError::model_not_found(n, &models.ids()),
            });
        };
        if let Some(l) = llms.loaded(entry) {
            return Ok(l);
        }
        let waiting = WaitGuard::new(&entry.waiting);
        if waiting.0 > self.opts.max_queue.max(1) {
            return Err(ApiError::overloaded(RETRY_SECS));
        }
        let index = llms.entries.iter().position(|e| std::ptr::eq(e, entry)).unwrap_or_default();
        let deadline = tokio::time::Instant::now() + llms.opts.load_timeout;
        loop {
            let changed = entry.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let mut s = lock(&entry.slot);
                if let Some(l) = s.llm.clone() {
                    s.last_used = llms.tick.fetch_add(1, Ordering::Relaxed);
                    return Ok(l);
                }
                if !s.loading {
                    s.loading = true;
                    s.error = None;
                    tokio::spawn(load(llms.clone(), index));
                }
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return Err(unavailable(format!(
                    "model '{}' is still loading after {} s; retry later",
                    entry.id,
                    llms.opts.load_timeout.as_secs_f64().round()
                )));
            }
            // A failure of the load this request waited for is its answer (the next request
            // tries again).
            let s = lock(&entry.slot);
            if !s.loading && s.llm.is_none() {
                if let Some(e) = &s.error {
                    return Err(unavailable(format!("model '{}' could not be loaded: {e}", entry.id)));
                }
            }
        }
    }
}

/// Counts a waiting request while it waits.
struct WaitGuard<'a>(usize, &'a AtomicUsize);

impl<'a> WaitGuard<'a> {
    fn new(n: &'a AtomicUsize) -> Self {
        Self(n.fetch_add(1, Ordering::SeqCst) + 1, n)
    }
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        self.1.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Load entry `index` (its slot is marked loading): one load at a time, making room first.
async fn load(llms: Arc<Llms>, index: usize) {
    let _one = llms.loader.lock().await;
    let Some(entry) = llms.entries.get(index) else { return };
    let t0 = Instant::now();
    let result = load_inner(&llms, entry).await;
    let mut s = lock(&entry.slot);
    s.loading = false;
    match result {
        Ok((llm, footprint)) => {
            entry.loads.fetch_add(1, Ordering::Relaxed);
            entry.load_time.observe(t0.elapsed());
            tracing::info!(model = %entry.id, footprint, ms = t0.elapsed().as_millis() as u64, "model loaded");
            s.llm = Some(Arc::new(llm));
            s.footprint = footprint;
            s.last_used = llms.tick.fetch_add(1, Ordering::Relaxed);
        }
        Err(e) => {
            entry.load_failures.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(model = %entry.id, error = %e, "model failed to load");
            s.error = Some(e);
        }
    }
    drop(s);
    entry.changed.notify_waiters();
}

async fn load_inner(llms: &Arc<Llms>, entry: &Entry) -> Result<(Llm, u64), String> {
    let source = entry.source.clone().ok_or_else(|| format!("'{}' has no source to load it from", entry.id))?;
    let engine_opts = llms.opts.engine.clone();
    let r = source.reference.clone();
    let footprint = blocking(move || estimate(&r, &engine_opts)).await?;
    make_room(llms, entry, footprint).await?;
    let (popts, eopts, id, stats, created) = (llms.opts.pipeline.clone(), llms.opts.engine.clone(), entry.id.clone(), entry.stats.clone(), entry.created);
    let llm = blocking(move || {
        let pipe = Pipeline::load(&source.reference, popts, |_| {}).map_err(|e| e.to_string())?;
        let engine = Engine::new(&pipe, eopts).map_err(|e| format!("starting its engine: {e}"))?;
        let mut llm = Llm::new(id, engine);
        llm.stats = stats;
        llm.created = created;
        Ok(llm)
    })
    .await?;
    Ok((llm, footprint))
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, String> + Send + 'static) -> Result<T, String> {
    tokio::task::spawn_blocking(f).await.map_err(|e| format!("the loading task failed: {e}"))?
}

/// Unload the least recently used idle models until `need` more bytes fit in the budget,
/// waiting (up to the load timeout) for busy ones to finish.
async fn make_room(llms: &Llms, entry: &Entry, need: u64) -> Result<(), String> {
    let Some(budget) = llms.opts.budget_bytes else { return Ok(()) };
    if need > budget {
        return Err(format!("it needs about {} MiB (weights and KV cache), more than the models budget of {} MiB", mib(need), mib(budget)));
    }
    let deadline = Instant::now() + llms.opts.load_timeout;
    loop {
        let used = llms.used_bytes();
        if used + need <= budget {
            return Ok(());
        }
        let mut idle: Vec<(u64, &Entry)> = llms
            .entries
            .iter()
            // Requests waiting for a model that just loaded have not taken it yet.
            .filter(|e| !std::ptr::eq(*e, entry) && e.source.is_some() && e.waiting.load(Ordering::SeqCst) == 0)
            .filter_map(|e| {
                let s = lock(&e.slot);
                s.llm.as_ref().filter(|l| Arc::strong_count(l) == 1).map(|_| (s.last_used, e))
            })
            .collect();
        idle.sort_by_key(|(t, _)| *t);
        match idle.first() {
            Some((_, victim)) => {
                unload(victim).await;
            }
            None if Instant::now() >= deadline => {
                let busy: Vec<&str> = llms.entries.iter().filter(|e| lock(&e.slot).llm.is_some() && e.source.is_some()).map(|e| e.id.as_str()).collect();
                return Err(format!(
                    "no room in the models budget of {} MiB ({} MiB used, {} MiB needed) and the loaded models ({}) have requests in flight",
                    mib(budget),
                    mib(used),
                    mib(need),
                    busy.join(", ")
                ));
            }
            None => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

fn mib(b: u64) -> u64 {
    b.div_ceil(1 << 20)
}

/// Unload `e` if it is loaded and idle; whether it was. Its memory is freed before this
/// returns.
pub(crate) async fn unload(e: &Entry) -> bool {
    let llm = {
        let mut s = lock(&e.slot);
        match &s.llm {
            Some(l) if Arc::strong_count(l) == 1 => {
                s.footprint = 0;
                s.llm.take()
            }
            _ => None,
        }
    };
    let Some(llm) = llm else { return false };
    e.unloads.fetch_add(1, Ordering::Relaxed);
    tracing::info!(model = %e.id, "model unloaded");
    // The engine's thread is joined and its cache unmapped: off the async threads.
    let _ = tokio::task::spawn_blocking(move || drop(llm)).await;
    e.changed.notify_waiters();
    true
}

/// A language model in `/v1/models` and `/models`: OpenAI's model object with llama-server's
/// router `status` (and, when its last load failed, `failed` and why).
pub(crate) fn model_object(v: &View) -> serde_json::Value {
    let mut status = serde_json::json!({"value": v.status.name()});
    if let (Some(why), Status::Unloaded) = (&v.failed, v.status) {
        status["failed"] = true.into();
        status["message"] = why.as_str().into();
    }
    let mut o = serde_json::json!({"id": v.id, "object": "model", "created": v.created, "owned_by": "sapient", "status": status});
    if v.on_demand && v.status == Status::Loaded {
        o["memory_bytes"] = v.footprint.into();
    }
    o
}

#[derive(serde::Deserialize)]
struct ModelRequest {
    model: String,
}

fn conflict(message: String) -> ApiError {
    ApiError { status: axum::http::StatusCode::CONFLICT, ..ApiError::bad_request(message) }
}

/// `POST /models/load` `{"model": NAME}`: load it now (waiting up to the load timeout) and
/// answer `{"success": true}`, as llama-server's router does.
pub(crate) async fn load_route(
    axum::extract::State(st): axum::extract::State<Arc<AppState>>,
    headers: axum::http::HeaderMap,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<axum::response::Response, ApiError> {
    let req: ModelRequest = crate::parse_body(&st, &headers, body)?;
    if req.model.is_empty() {
        return Err(ApiError::invalid_param("model", "'model' names the model to load"));
    }
    drop(st.llm(Some(&req.model)).await?);
    Ok(axum::Json(serde_json::json!({"success": true})).into_response())
}

/// `POST /models/unload` `{"model": NAME}`: unload it (refused while it has requests in
/// flight or for a model given loaded) and answer `{"success": true}`.
pub(crate) async fn unload_route(
    axum::extract::State(st): axum::extract::State<Arc<AppState>>,
    headers: axum::http::HeaderMap,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<axum::response::Response, ApiError> {
    let req: ModelRequest = crate::parse_body(&st, &headers, body)?;
    let models = st.models()?;
    let entry = models.llms.entries.iter().find(|e| e.id == req.model).ok_or_else(|| ApiError::model_not_found(&req.model, &models.ids()))?;
    if entry.source.is_none() {
        return Err(ApiError::invalid_param("model", format!("model '{}' was loaded at start and is not unloaded (serve it on demand to unload it)", entry.id)));
    }
    if unload(entry).await {
        return Ok(axum::Json(serde_json::json!({"success": true})).into_response());
    }
    let s = lock(&entry.slot);
    Err(match (&s.llm, s.loading) {
        (Some(_), _) => conflict(format!("model '{}' has requests in flight; retry when they finish", entry.id)),
        (None, true) => conflict(format!("model '{}' is loading; unload it once it is loaded", entry.id)),
        (None, false) => ApiError::invalid_param("model", format!("model '{}' is not loaded", entry.id)),
    })
}

/// The file a reference loads from: itself when it exists here, else what the Hub resolves
/// it to (fetched into the cache if needed).
fn resolve(reference: &str) -> Result<PathBuf, String> {
    let local = Path::new(reference);
    if local.exists() {
        return Ok(local.to_path_buf());
    }
    let hub = sapient_hub::Hub::new().map_err(|e| e.to_string())?;
    let r = hub.resolve(reference, &mut |_| {}).map_err(|e| e.to_string())?;
    Ok(r.file("gguf").map(Path::to_path_buf).unwrap_or(r.dir))
}

/// A model's estimated footprint: the size of its weights' file (or of the files in its
/// directory) plus the KV cache its engine reserves (from the GGUF's shapes; a model that
/// is not a GGUF file counts its weights only).
pub(crate) fn estimate(reference: &str, engine: &EngineOptions) -> Result<u64, String> {
    let path = resolve(reference)?;
    let meta = std::fs::metadata(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    if meta.is_dir() {
        let files = std::fs::read_dir(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        return Ok(files.flatten().filter_map(|f| f.metadata().ok()).filter(|m| m.is_file()).map(|m| m.len()).sum());
    }
    let g = sapient_tensor::GgufFile::open(&path).map_err(|e| e.to_string())?;
    let cfg = sapient_llama::LlamaConfig::from_gguf(&g).map_err(|e| e.to_string())?;
    Ok(meta.len() + kv_bytes(cfg.num_layers, cfg.num_kv_heads * cfg.head_dim, engine))
}

/// Bytes of the KV cache an engine with `opts` reserves for a model of `layers` layers of
/// `width` values per position (as the cache sizes its pool).
fn kv_bytes(layers: usize, width: usize, opts: &EngineOptions) -> u64 {
    let bs = opts.kv.block_size.max(1);
    let per_block = (layers * bs * opts.kv.dtype.bytes_per_position(width)).max(1);
    let blocks = match opts.kv.budget {
        KvBudget::Tokens(t) => t.div_ceil(bs),
        KvBudget::Bytes(b) => b / per_block,
    };
    (blocks as u64).saturating_mul(per_block as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_bytes_follow_the_cache_pool() {
        // SmolLM2-135M: 30 layers, 3 KV heads of 64; 4096 positions in blocks of 32, f16.
        let opts = EngineOptions { kv: sapient_generate::KvOptions { block_size: 32, budget: KvBudget::Tokens(4096), ..Default::default() }, ..Default::default() };
        assert_eq!(kv_bytes(30, 192, &opts), 4096 * 30 * 192 * 2 * 2);
        // A budget in bytes rounds down to whole blocks.
        let per_block = 30 * 32 * 192 * 4;
        let opts = EngineOptions { kv: sapient_generate::KvOptions { block_size: 32, budget: KvBudget::Bytes(per_block * 10 + 5), ..Default::default() }, ..Default::default() };
        assert_eq!(kv_bytes(30, 192, &opts), (per_block * 10) as u64);
    }

    #[test]
    fn a_missing_file_is_named() {
        let e = estimate("/nonexistent/model.gguf", &EngineOptions::default()).unwrap_err();
        assert!(e.contains("model.gguf") || e.contains("nonexistent"), "{e}");
    }
}
