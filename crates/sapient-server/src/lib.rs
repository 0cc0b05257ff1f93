//! `sapient-server`: an OpenAI-compatible HTTP server over SAPIENT's models.
//!
//! Routes: `GET /v1/models`, `POST /v1/chat/completions` (streamed as server-sent events or
//! whole), `POST /v1/completions`, Anthropic's `POST /v1/messages` and
//! `/v1/messages/count_tokens`, OpenAI's `POST /v1/responses` with `GET` / `DELETE
//! /v1/responses/{id}`, llama-server's `POST /tokenize`, `/detokenize` and `/apply-template`,
//! embeddings and audio, `GET /health` (200 once the models are loaded, 503 before),
//! `GET /metrics` (Prometheus text), and llama-server's router routes `GET /models`, `POST
//! /models/load` and `/models/unload` for language models loaded on demand
//! ([`Models::on_demand`], within [`LoadOptions`]' memory budget). Language models run on a [`sapient_generate::Engine`]
//! each, so concurrent requests are decoded together; a client that goes away drops its
//! request handle, which cancels the generation at the next engine step and frees its KV
//! blocks. `response_format` and tools are enforced with sapient-sample's constraints.
//!
//! ```no_run
//! use sapient_generate::{Engine, EngineOptions, Pipeline};
//! use sapient_server::{Llm, Models, Server, ServerOptions};
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let server = Server::new(ServerOptions::default());
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! let serving = tokio::spawn(server.clone().serve(listener, std::future::pending()));
//! let pipe = Pipeline::from_pretrained("smollm2-135m-instruct")?;
//! let engine = Engine::new(&pipe, EngineOptions::default())?;
//! server.set_models(Models { llms: vec![Llm::new("smollm2-135m-instruct", engine)], ..Models::default() })?; // now ready
//! serving.await??;
//! # Ok(()) }
//! ```

mod anthropic;
mod chat;
mod error;
mod lora;
mod media;
mod realtime;
mod responses;
mod router;
mod slots;
mod tokenize;
mod turn;
pub mod metrics;
pub mod tools;

pub use error::{ApiError, Error};
pub use router::{LlmSource, LoadOptions};

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

/// How the server behaves (limits and security).
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Every route but `/health` requires `Authorization: Bearer <key>` when set.
    pub api_key: Option<String>,
    /// Serve `/metrics` without the API key too (for a Prometheus scraper or an inference
    /// gateway that holds no key). Off by default: with a key set, `/metrics` needs it.
    pub public_metrics: bool,
    /// Largest request body in bytes (413 beyond).
    pub max_body_bytes: usize,
    /// `max_tokens` above this is lowered to it; also the default when a request gives none.
    pub max_tokens_limit: usize,
    /// Requests (choices) queued per model beyond the engine's sequence slots before new
    /// ones get 429.
    pub max_queue: usize,
    /// Most choices (`n`) per request.
    pub max_n: usize,
    /// Largest audio upload in bytes (`/v1/audio/*`).
    pub max_audio_bytes: usize,
    /// Browser origins allowed to call the API (CORS), e.g. `http://localhost:3000`; `*`
    /// allows any. Empty (the default): no CORS headers, so browsers on other origins are
    /// refused.
    pub cors_origins: Vec<String>,
    /// Most `/v1/responses` answers kept in memory (for `previous_response_id` and `GET`);
    /// the oldest go first. 0 keeps none.
    pub responses_max: usize,
    /// How long a stored `/v1/responses` answer is kept.
    pub responses_ttl: std::time::Duration,
    /// The directory `POST /slots/{id}?action=save|restore` writes and reads slot files in
    /// (plain names only). `None` (the default): those routes answer 501.
    pub slot_save_path: Option<std::path::PathBuf>,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            api_key: None,
            public_metrics: false,
            max_body_bytes: 2 << 20,
            max_tokens_limit: 4096,
            max_queue: 256,
            max_n: 8,
            max_audio_bytes: 25 << 20,
            cors_origins: Vec::new(),
            responses_max: 256,
            responses_ttl: std::time::Duration::from_secs(3600),
            slot_save_path: None,
        }
    }
}

/// A language model served under `id`.
pub struct Llm {
    pub id: String,
    pub engine: sapient_generate::Engine,
    /// Kept by the server across the model's loads.
    pub(crate) stats: Arc<metrics::LlmStats>,
    /// Requests (choices) submitted and not yet answered.
    pub(crate) in_flight: AtomicUsize,
    pub(crate) created: u64,
    /// Every token's bytes, made on the first request for logprobs.
    pub(crate) token_bytes: std::sync::OnceLock<Vec<Vec<u8>>>,
    /// Conversation slots (`id_slot`), each an engine session.
    pub(crate) slots: slots::Slots,
    /// The model's LoRA adapters and their global scales (`/lora-adapters`).
    pub(crate) lora: lora::Adapters,
}

impl Llm {
    pub fn new(id: impl Into<String>, engine: sapient_generate::Engine) -> Self {
        Self {
            id: id.into(),
            stats: Default::default(),
            in_flight: AtomicUsize::new(0),
            created: unix_now(),
            token_bytes: std::sync::OnceLock::new(),
            slots: Default::default(),
            lora: lora::Adapters::of(&engine),
            engine,
        }
    }

    /// The global scales of the model's LoRA adapters (loaded into its pipeline before the
    /// engine was made), by id: what requests without a `lora` field apply (1 unless set;
    /// 0 leaves an adapter off; `POST /lora-adapters` changes them).
    pub fn with_lora_scales(self, scales: &[f32]) -> Self {
        self.lora.set_scales(scales);
        self
    }
}

/// The models a server answers with, each under a name (the `model` field routes).
#[derive(Default)]
pub struct Models {
    /// Language models loaded already (never unloaded).
    pub llms: Vec<Llm>,
    /// Language models loaded when a request first names them, within
    /// [`load`](Self::load)'s memory budget (after `llms` in `/v1/models`; a request that
    /// names no model goes to the first of `llms`, else of these).
    pub on_demand: Vec<LlmSource>,
    /// How `on_demand` models load.
    pub load: LoadOptions,
    pub embedders: Vec<(String, sapient_embed::Embedder)>,
    pub transcribers: Vec<(String, sapient_whisper::Transcriber)>,
    pub tts: Vec<(String, sapient_kokoro::KokoroTts)>,
    /// Silero VAD weights (the `silero-vad` preset's file) for `/v1/realtime`'s turn
    /// detection; that route also needs a language model, a transcriber and a TTS model.
    pub vad: Option<std::path::PathBuf>,
}

/// The models once loaded, shared with requests in flight.
pub(crate) struct Loaded {
    pub(crate) llms: Arc<router::Llms>,
    pub(crate) embedders: Vec<(String, Arc<sapient_embed::Embedder>)>,
    pub(crate) transcribers: Vec<(String, Arc<sapient_whisper::Transcriber>)>,
    pub(crate) tts: Vec<(String, Arc<sapient_kokoro::KokoroTts>)>,
    pub(crate) vad: Option<std::path::PathBuf>,
    created: u64,
}

impl Loaded {
    fn ids(&self) -> Vec<String> {
        let mut v: Vec<String> = self.llms.ids().map(str::to_string).collect();
        v.extend(self.embedders.iter().map(|e| e.0.clone()));
        v.extend(self.transcribers.iter().map(|e| e.0.clone()));
        v.extend(self.tts.iter().map(|e| e.0.clone()));
        v
    }
    /// The model of one kind a request names (the first of that kind when it names none, or
    /// names one the OpenAI way such as `whisper-1`, `tts-1` or `text-embedding-3-small`
    /// while only one of that kind is loaded).
    pub(crate) fn find<'a, T>(&self, list: &'a [(String, Arc<T>)], name: Option<&str>, kind: &str) -> Result<(&'a str, &'a Arc<T>), ApiError> {
        let hit = match name {
            None | Some("") => list.first(),
            Some(n) => list.iter().find(|(id, _)| id == n).or_else(|| {
                let openai = ["whisper-1", "tts-1", "tts-1-hd", "gpt-4o-mini-tts", "gpt-4o-transcribe", "gpt-4o-mini-transcribe", "text-embedding-3-small", "text-embedding-3-large", "text-embedding-ada-002"];
                if openai.contains(&n) && list.len() == 1 { list.first() } else { None }
            }),
        };
        match hit {
            Some((id, m)) => Ok((id.as_str(), m)),
            None if list.is_empty() => Err(ApiError::not_found(format!("this server has no {kind} model")).with_code("model_not_found")),
            None => Err(ApiError::model_not_found(name.unwrap_or_default(), &self.ids())),
        }
    }
}

pub(crate) struct AppState {
    pub(crate) opts: ServerOptions,
    pub(crate) models: OnceLock<Loaded>,
    pub(crate) http: metrics::HttpStats,
    pub(crate) speech: metrics::SpeechStats,
    pub(crate) responses: responses::Store,
}

impl AppState {
    pub(crate) fn models(&self) -> Result<&Loaded, ApiError> {
        self.models.get().ok_or_else(ApiError::loading)
    }
}

/// The server: cheap to clone (shared state). Serve first, then [`set_models`](Self::set_models)
/// once they are loaded (`/health` answers 503 until then).
#[derive(Clone)]
pub struct Server {
    state: Arc<AppState>,
}

impl Server {
    pub fn new(opts: ServerOptions) -> Self {
        Self { state: Arc::new(AppState { opts, models: OnceLock::new(), http: Default::default(), speech: Default::default(), responses: Default::default() }) }
    }

    /// Install the models; the server is ready from now on.
    pub fn set_models(&self, models: Models) -> Result<(), Error> {
        let mut seen = std::collections::HashSet::new();
        let names = models.llms.iter().map(|l| &l.id).chain(models.on_demand.iter().map(|s| &s.id)).chain(models.embedders.iter().map(|e| &e.0)).chain(models.transcribers.iter().map(|e| &e.0)).chain(models.tts.iter().map(|e| &e.0));
        for id in names {
            if !seen.insert(id.clone()) {
                return Err(Error::DuplicateModel(id.clone()));
            }
        }
        let arc = |v: Vec<(String, _)>| v.into_iter().map(|(n, m)| (n, Arc::new(m))).collect();
        let loaded = Loaded {
            llms: Arc::new(router::Llms::new(models.llms, models.on_demand, models.load)),
            embedders: arc(models.embedders),
            transcribers: models.transcribers.into_iter().map(|(n, m)| (n, Arc::new(m))).collect(),
            tts: models.tts.into_iter().map(|(n, m)| (n, Arc::new(m))).collect(),
            vad: models.vad,
            created: unix_now(),
        };
        self.state.models.set(loaded).map_err(|_| Error::AlreadyReady)
    }

    pub fn is_ready(&self) -> bool {
        self.state.models.get().is_some()
    }

    /// The engine metrics of a model (for tests and embedding applications).
    pub fn engine_metrics(&self, model: &str) -> Result<sapient_generate::EngineMetrics, Error> {
        let m = self.state.models.get().ok_or_else(|| Error::UnknownModel(model.into()))?;
        m.llms.get_loaded(model).map(|l| l.engine.metrics()).ok_or_else(|| Error::UnknownModel(model.into()))
    }

    /// The routes, with authentication, body limits and request logs.
    pub fn router(&self) -> Router {
        let st = self.state.clone();
        let metrics = Router::new().route("/metrics", get(metrics_text));
        let metrics = if st.opts.public_metrics { metrics } else { metrics.layer(axum::middleware::from_fn_with_state(st.clone(), auth)) };
        let api = Router::new()
            .route("/v1/models", get(list_models))
            .route("/v1/models/{id}", get(get_model))
            .route("/models", get(list_models))
            .route("/models/load", post(router::load_route))
            .route("/models/unload", post(router::unload_route))
            .route("/slots/{id}", post(slots::slot_action))
            .route("/v1/chat/completions", post(chat::chat_completions))
            .route("/v1/completions", post(chat::completions))
            .route("/v1/messages", post(anthropic::messages))
            .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
            .route("/v1/responses", post(responses::create))
            .route("/v1/responses/{id}", get(responses::retrieve).delete(responses::delete))
            .route("/lora-adapters", get(lora::list).post(lora::set))
            .route("/tokenize", post(tokenize::tokenize))
            .route("/detokenize", post(tokenize::detokenize))
            .route("/apply-template", post(tokenize::apply_template))
            .route("/v1/embeddings", post(media::embeddings))
            .route("/v1/realtime", get(realtime::upgrade))
            .route("/v1/audio/speech", post(media::speech))
            .route(
                "/v1/audio/transcriptions",
                post(media::transcriptions).layer(DefaultBodyLimit::max(st.opts.max_audio_bytes)),
            )
            .route("/v1/audio/translations", post(media::translations).layer(DefaultBodyLimit::max(st.opts.max_audio_bytes)))
            .fallback(not_found)
            .method_not_allowed_fallback(method_not_allowed)
            .layer(axum::middleware::from_fn_with_state(st.clone(), auth));
        Router::new()
            .route("/health", get(health))
            .merge(metrics)
            .merge(api)
            .layer(DefaultBodyLimit::max(st.opts.max_body_bytes))
            .layer(axum::middleware::from_fn_with_state(st.clone(), declared_size))
            .layer(axum::middleware::from_fn_with_state(st.clone(), cors))
            .layer(axum::middleware::from_fn_with_state(st.clone(), log))
            .with_state(st)
    }

    /// Serve on `listener` until `shutdown` completes (then finish the requests in flight).
    pub async fn serve(self, listener: tokio::net::TcpListener, shutdown: impl std::future::Future<Output = ()> + Send + 'static) -> Result<(), Error> {
        let app = self.router();
        axum::serve(listener, app).with_graceful_shutdown(shutdown).await?;
        Ok(())
    }
}

pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// A fresh id with a prefix (`chatcmpl-`, `call_`, ...): unique in this process, unlikely to
/// repeat across processes.
pub(crate) fn new_id(prefix: &str) -> String {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    let mix = (t ^ (u64::from(std::process::id()) << 32)).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ n;
    format!("{prefix}{mix:016x}{n:x}")
}

/// The key: `Authorization: Bearer <key>` (OpenAI's clients) or `x-api-key: <key>`
/// (Anthropic's).
async fn auth(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Some(key) = &st.opts.api_key {
        let h = req.headers();
        let bearer = h
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
            .map(str::trim);
        let x_api_key = h.get("x-api-key").and_then(|v| v.to_str().ok()).map(str::trim);
        if ![bearer, x_api_key].into_iter().flatten().any(|g| constant_time_eq(g.as_bytes(), key.as_bytes())) {
            return ApiError::unauthorized().respond(is_anthropic(req.uri().path()));
        }
    }
    next.run(req).await
}

/// Routes that answer errors in Anthropic's shape.
pub(crate) fn is_anthropic(path: &str) -> bool {
    path == "/v1/messages" || path.starts_with("/v1/messages/")
}

/// A body that declares a length over its route's limit is refused before any of it is read
/// (the body limit alone would wait for the bytes).
async fn declared_size(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    let limit = if path == "/v1/audio/transcriptions" || path == "/v1/audio/translations" { st.opts.max_audio_bytes } else { st.opts.max_body_bytes };
    let declared = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return ApiError::too_large(limit).respond(is_anthropic(path));
    }
    next.run(req).await
}

/// CORS for the listed origins: a preflight (`OPTIONS` with `Access-Control-Request-Method`)
/// is answered here, before authentication (browsers send it without credentials); other
/// requests get `Access-Control-Allow-Origin`. Origins not listed get no CORS headers.
async fn cors(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    use axum::http::{HeaderValue, Method};
    let origin = req.headers().get(header::ORIGIN).cloned();
    let allowed = origin.filter(|o| o.to_str().is_ok_and(|o| st.opts.cors_origins.iter().any(|a| a == "*" || a == o)));
    let Some(origin) = allowed else { return next.run(req).await };
    let preflight = req.method() == Method::OPTIONS && req.headers().contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    let mut r = if preflight {
        let mut r = StatusCode::NO_CONTENT.into_response();
        let asked = req.headers().get(header::ACCESS_CONTROL_REQUEST_HEADERS).cloned();
        let h = r.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_static("GET, POST, DELETE, OPTIONS"));
        h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, asked.unwrap_or(HeaderValue::from_static("authorization, content-type, x-api-key, anthropic-version")));
        h.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("600"));
        r
    } else {
        next.run(req).await
    };
    let h = r.headers_mut();
    h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    h.append(header::VARY, HeaderValue::from_static("Origin"));
    r
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn log(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let t = Instant::now();
    let r = next.run(req).await;
    let status = r.status().as_u16();
    st.http.record(status);
    tracing::info!(target: "sapient_server::access", %method, %path, status, ms = t.elapsed().as_millis() as u64, "request");
    r
}

async fn health(State(st): State<Arc<AppState>>) -> Response {
    if st.models.get().is_some() {
        (StatusCode::OK, axum::Json(serde_json::json!({"status": "ok"}))).into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, [(header::RETRY_AFTER, "1")], axum::Json(serde_json::json!({"status": "loading"}))).into_response()
    }
}

fn model_object(id: &str, created: u64) -> serde_json::Value {
    serde_json::json!({"id": id, "object": "model", "created": created, "owned_by": "sapient", "status": {"value": "loaded"}})
}

/// Every model: language models with their status (`loaded`, `loading`, `unloaded`, as
/// llama-server's router lists them), then the others (always loaded).
async fn list_models(State(st): State<Arc<AppState>>) -> Result<Response, ApiError> {
    let m = st.models()?;
    let mut data: Vec<serde_json::Value> = m.llms.view().iter().map(router::model_object).collect();
    let others = m.embedders.iter().map(|e| &e.0).chain(m.transcribers.iter().map(|e| &e.0)).chain(m.tts.iter().map(|e| &e.0));
    data.extend(others.map(|id| model_object(id, m.created)));
    Ok(axum::Json(serde_json::json!({"object": "list", "data": data})).into_response())
}

async fn get_model(State(st): State<Arc<AppState>>, axum::extract::Path(id): axum::extract::Path<String>) -> Result<Response, ApiError> {
    let m = st.models()?;
    if let Some(v) = m.llms.view().iter().find(|v| v.id == id) {
        return Ok(axum::Json(router::model_object(v)).into_response());
    }
    if m.ids().contains(&id) {
        return Ok(axum::Json(model_object(&id, m.created)).into_response());
    }
    Err(ApiError::model_not_found(&id, &m.ids()))
}

async fn metrics_text(State(st): State<Arc<AppState>>) -> Response {
    let mut text = metrics::render(&st);
    if let Some(m) = st.models.get() {
        router::render_metrics(&mut text, &m.llms);
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}

async fn not_found(req: Request) -> Response {
    let path = req.uri().path();
    ApiError::not_found(format!("No route {} {path}", req.method())).with_code("unknown_url").respond(is_anthropic(path))
}

async fn method_not_allowed(req: Request) -> Response {
    let path = req.uri().path();
    let e = ApiError { status: StatusCode::METHOD_NOT_ALLOWED, ..ApiError::bad_request(format!("Method {} is not allowed on {path}", req.method())) };
    e.respond(is_anthropic(path))
}

/// A JSON request body [`check_request`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Endpoint {
    /// `POST /v1/chat/completions`
    ChatCompletions,
    /// `POST /v1/completions`
    Completions,
    /// `POST /v1/embeddings`
    Embeddings,
    /// `POST /v1/audio/speech`
    Speech,
}

/// Parse and check a JSON request body as `endpoint` does before it needs a model, with the
/// errors the server would answer: the JSON and its field types, sampling ranges, `n`,
/// `stop`, `logit_bias` (token ids below `vocab_size`), messages and their roles and content
/// parts, tools and `tool_choice`, `response_format` (JSON Schemas compiled to grammars),
/// prompts and embedding inputs (token ids; strings stand for a byte a token), speech
/// input, speed, voice and format. What needs the model (the chat template, the tokenizer,
/// the voices, the embedding size) is not checked. The fuzz target `server_request` runs
/// this on arbitrary bytes.
pub fn check_request(endpoint: Endpoint, body: &[u8], opts: &ServerOptions, vocab_size: usize) -> Result<(), ApiError> {
    let st = AppState { opts: opts.clone(), models: OnceLock::new(), http: Default::default(), speech: Default::default(), responses: Default::default() };
    if body.len() > opts.max_body_bytes {
        return Err(ApiError::too_large(opts.max_body_bytes));
    }
    match endpoint {
        Endpoint::ChatCompletions => chat::check_body(&st, true, body, vocab_size),
        Endpoint::Completions => chat::check_body(&st, false, body, vocab_size),
        Endpoint::Embeddings => media::check_body(&st, false, body),
        Endpoint::Speech => media::check_body(&st, true, body),
    }
}

/// Request bodies: read them ourselves so that every failure is OpenAI-shaped.
pub(crate) fn parse_body<T: serde::de::DeserializeOwned>(
    st: &AppState,
    headers: &HeaderMap,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<T, ApiError> {
    let _ = headers;
    let bytes = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large(st.opts.max_body_bytes)
        } else {
            ApiError::bad_request(format!("cannot read the request body: {e}"))
        }
    })?;
    let de = &mut serde_json::Deserializer::from_slice(&bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_syntax() || inner.is_eof() || path.is_empty() || path == "." || path == "?" {
            ApiError::bad_request(format!("invalid JSON body: {inner}"))
        } else {
            ApiError::invalid_param(path.clone(), format!("invalid '{path}': {inner}"))
        }
    })
}

/// The README's example, compiled as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctest;
