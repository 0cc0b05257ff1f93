//! `POST /v1/chat/completions` and `POST /v1/completions`.

use crate::error::{from_generate, ApiError};
use crate::tools::{self, Piece};
use crate::turn::{merged, sse_response, ChoiceState, InFlight, Prepared};
use crate::{new_id, parse_body, unix_now, AppState, Llm};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use sapient_generate::chat::{PastCall, ToolStyle};
use sapient_generate::{Event, Generation, GenerationConfig, Grammar, Message, RequestHandle, SamplerConfig, TokenLogprob};
use sapient_sample::{Expr, JsonOptions};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;

/// `stop`: one string or a list.
#[derive(Deserialize)]
#[serde(untagged)]
pub(crate) enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize, Default)]
pub(crate) struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

/// The sampling fields both endpoints share.
#[derive(Deserialize, Default)]
pub(crate) struct Sampling {
    pub(crate) temperature: Option<f32>,
    pub(crate) top_p: Option<f32>,
    /// Not OpenAI's, but common (vLLM, llama.cpp).
    pub(crate) top_k: Option<usize>,
    pub(crate) min_p: Option<f32>,
    pub(crate) repetition_penalty: Option<f32>,
    pub(crate) presence_penalty: Option<f32>,
    pub(crate) frequency_penalty: Option<f32>,
    pub(crate) logit_bias: Option<HashMap<String, f32>>,
    pub(crate) seed: Option<i64>,
    pub(crate) stop: Option<Stop>,
    pub(crate) max_tokens: Option<i64>,
    pub(crate) max_completion_tokens: Option<i64>,
    pub(crate) n: Option<i64>,
    pub(crate) stream: Option<bool>,
    pub(crate) stream_options: Option<StreamOptions>,
    pub(crate) logprobs: Option<Value>,
    pub(crate) top_logprobs: Option<i64>,
    pub(crate) user: Option<String>,
    /// Not OpenAI's (llama.cpp's and vLLM's): keep going past end-of-sequence, up to max_tokens.
    pub(crate) ignore_eos: Option<bool>,
    /// Not OpenAI's (llama-server's): run in this conversation slot (see slots.rs).
    pub(crate) id_slot: Option<u32>,
    /// Not OpenAI's (llama-server's): a GBNF grammar the output must follow.
    pub(crate) grammar: Option<String>,
    /// Not OpenAI's (llama-server's): LoRA adapters and scales, `[{"id", "scale"}]` (lora.rs).
    pub(crate) lora: Option<Value>,
}

#[derive(Deserialize, Default, Clone)]
pub(crate) struct InMessage {
    pub(crate) role: String,
    #[serde(default)]
    pub(crate) content: Option<Value>,
    #[serde(default)]
    pub(crate) name: Option<String>,
    #[serde(default)]
    pub(crate) tool_calls: Option<Vec<Value>>,
    #[serde(default)]
    pub(crate) tool_call_id: Option<String>,
}

#[derive(Deserialize, Default)]
pub(crate) struct ChatRequest {
    pub(crate) model: Option<String>,
    pub(crate) messages: Vec<InMessage>,
    #[serde(flatten)]
    pub(crate) sampling: Sampling,
    pub(crate) response_format: Option<Value>,
    pub(crate) tools: Option<Value>,
    pub(crate) tool_choice: Option<Value>,
    pub(crate) parallel_tool_calls: Option<bool>,
    /// Not OpenAI's (vLLM's and llama.cpp's): variables for the chat template, e.g.
    /// `{"enable_thinking": false}` for Qwen3.
    pub(crate) chat_template_kwargs: Option<serde_json::Map<String, Value>>,
}

#[derive(Deserialize)]
struct CompletionRequest {
    model: Option<String>,
    prompt: Value,
    #[serde(flatten)]
    sampling: Sampling,
    echo: Option<bool>,
    suffix: Option<String>,
    best_of: Option<i64>,
}

impl Sampling {
    /// `logprobs` as each endpoint takes it: chat `logprobs: true` with `top_logprobs`
    /// alternatives; completions `logprobs: N` alternatives.
    fn logprobs(&self, chat: bool) -> Result<Option<usize>, ApiError> {
        let max = sapient_generate::MAX_TOP_LOGPROBS as i64;
        let top = |n: i64, name: &str| -> Result<usize, ApiError> {
            if !(0..=max).contains(&n) {
                return Err(ApiError::invalid_param(name, format!("{name} must be between 0 and {max}, got {n}")));
            }
            Ok(n as usize)
        };
        match (chat, &self.logprobs) {
            (true, None | Some(Value::Null) | Some(Value::Bool(false))) => match self.top_logprobs {
                Some(n) if n > 0 => Err(ApiError::invalid_param("top_logprobs", "top_logprobs needs logprobs: true")),
                _ => Ok(None),
            },
            (true, Some(Value::Bool(true))) => Ok(Some(top(self.top_logprobs.unwrap_or(0), "top_logprobs")?)),
            (true, Some(_)) => Err(ApiError::invalid_param("logprobs", "logprobs must be true or false")),
            (false, None | Some(Value::Null)) => Ok(None),
            (false, Some(v)) => match v.as_i64() {
                Some(n) => Ok(Some(top(n, "logprobs")?)),
                None => Err(ApiError::invalid_param("logprobs", "logprobs must be the number of alternatives to return")),
            },
        }
    }

    fn check(&self, st: &AppState, vocab: usize, chat: bool) -> Result<(GenerationConfig, usize), ApiError> {
        let logprobs = self.logprobs(chat)?;
        let n = self.n.unwrap_or(1);
        if n < 1 || n as usize > st.opts.max_n {
            return Err(ApiError::invalid_param("n", format!("n must be between 1 and {}, got {n}", st.opts.max_n)));
        }
        let max = match (self.max_completion_tokens, self.max_tokens) {
            (Some(m), _) | (None, Some(m)) => {
                if m < 1 {
                    return Err(ApiError::invalid_param("max_tokens", format!("max_tokens must be at least 1, got {m}")));
                }
                (m as u64).min(st.opts.max_tokens_limit as u64) as usize
            }
            (None, None) => st.opts.max_tokens_limit,
        };
        let temperature = self.temperature.unwrap_or(1.0);
        if !(0.0..=2.0).contains(&temperature) {
            return Err(ApiError::invalid_param("temperature", format!("temperature must be between 0 and 2, got {temperature}")));
        }
        if let Some(p) = self.top_p {
            if !(p > 0.0 && p <= 1.0) {
                return Err(ApiError::invalid_param("top_p", format!("top_p must be in (0, 1], got {p}")));
            }
        }
        for (name, v) in [("presence_penalty", self.presence_penalty), ("frequency_penalty", self.frequency_penalty)] {
            if let Some(v) = v {
                if !(-2.0..=2.0).contains(&v) {
                    return Err(ApiError::invalid_param(name, format!("{name} must be between -2 and 2, got {v}")));
                }
            }
        }
        let mut bias = HashMap::new();
        for (k, v) in self.logit_bias.iter().flatten() {
            let id: u32 = k.parse().map_err(|_| ApiError::invalid_param("logit_bias", format!("logit_bias keys are token ids, got '{k}'")))?;
            if id as usize >= vocab {
                return Err(ApiError::invalid_param("logit_bias", format!("token id {id} is outside the vocabulary ({vocab} tokens)")));
            }
            if !(-100.0..=100.0).contains(v) {
                return Err(ApiError::invalid_param("logit_bias", format!("logit_bias values must be between -100 and 100, got {v}")));
            }
            // OpenAI's -100 / 100 mean "never" / "always".
            let v = if *v <= -100.0 { f32::NEG_INFINITY } else { *v };
            bias.insert(id, v);
        }
        let stop = match &self.stop {
            None => vec![],
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        if stop.len() > 16 || stop.iter().any(String::is_empty) {
            return Err(ApiError::invalid_param("stop", "stop takes up to 16 non-empty strings"));
        }
        let sampling = SamplerConfig {
            temperature,
            top_p: self.top_p.filter(|p| *p < 1.0),
            top_k: self.top_k.filter(|k| *k > 0),
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty.unwrap_or(1.0),
            presence_penalty: self.presence_penalty.unwrap_or(0.0),
            frequency_penalty: self.frequency_penalty.unwrap_or(0.0),
            logit_bias: bias,
            seed: self.seed.map(|s| s as u64),
            ..SamplerConfig::default()
        };
        sampling.validate().map_err(|e| ApiError::bad_request(e.to_string()))?;
        if let Some(u) = &self.user {
            tracing::debug!(user = %u, "request user");
        }
        Ok((GenerationConfig { max_tokens: max, sampling, stop, ignore_eos: self.ignore_eos.unwrap_or(false), logprobs, ..GenerationConfig::default() }, n as usize))
    }
}

/// A message's text: a string, null, or a list of text parts.
fn content_text(c: Option<&Value>, i: usize) -> Result<String, ApiError> {
    match c {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut s = String::new();
            for p in parts {
                match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => s.push_str(t),
                    (kind, _) => {
                        return Err(ApiError::invalid_param(
                            format!("messages[{i}].content"),
                            format!("content part type '{}' is not supported (text only)", kind.unwrap_or("?")),
                        ))
                    }
                }
            }
            Ok(s)
        }
        Some(_) => Err(ApiError::invalid_param(format!("messages[{i}].content"), "content must be a string or a list of parts")),
    }
}

/// OpenAI messages to the template's messages, earlier tool calls and results as `style`
/// renders them.
fn to_messages(msgs: &[InMessage], style: ToolStyle) -> Result<Vec<Message>, ApiError> {
    let mut out: Vec<Message> = Vec::new();
    for (i, m) in msgs.iter().enumerate() {
        let text = content_text(m.content.as_ref(), i)?;
        match m.role.as_str() {
            "system" | "developer" => out.push(Message::system(text)),
            "user" => {
                let mut msg = Message::user(text);
                if let Some(n) = &m.name {
                    msg.extra.insert("name".into(), json!(n));
                }
                out.push(msg);
            }
            "assistant" => {
                let mut calls = Vec::new();
                for (j, c) in m.tool_calls.iter().flatten().enumerate() {
                    let f = c.get("function").ok_or_else(|| ApiError::invalid_param(format!("messages[{i}].tool_calls[{j}]"), "a tool call needs 'function'"))?;
                    let name = f.get("name").and_then(Value::as_str).unwrap_or_default().to_string();
                    let arguments = match f.get("arguments") {
                        Some(Value::String(s)) => serde_json::from_str::<Value>(s).unwrap_or(Value::String(s.clone())),
                        Some(v) => v.clone(),
                        None => json!({}),
                    };
                    calls.push(PastCall { id: c.get("id").cloned().unwrap_or(Value::Null), name, arguments });
                }
                out.push(style.assistant(text, &calls));
            }
            "tool" => style.push_result(&mut out, m.tool_call_id.as_deref(), &text),
            other => {
                return Err(ApiError::invalid_param(format!("messages[{i}].role"), format!("unknown role '{other}' (system, developer, user, assistant, tool)")))
            }
        }
    }
    if out.is_empty() {
        return Err(ApiError::invalid_param("messages", "messages must not be empty"));
    }
    Ok(out)
}

fn response_format(rf: Option<&Value>) -> Result<Option<Grammar>, ApiError> {
    let Some(rf) = rf.filter(|v| !v.is_null()) else { return Ok(None) };
    let json_opts = JsonOptions::default();
    match rf.get("type").and_then(Value::as_str) {
        None | Some("text") => Ok(None),
        Some("json_object") => Grammar::with_options(&Expr::Json, json_opts).map(Some).map_err(|e| tools::schema_error("response_format", e)),
        Some("json_schema") => {
            let js = rf.get("json_schema").ok_or_else(|| ApiError::invalid_param("response_format", "response_format json_schema needs a 'json_schema' object"))?;
            let schema = js.get("schema").cloned().unwrap_or_else(|| json!({}));
            // `strict: true` (OpenAI's strict mode): no property beyond those listed.
            let json_opts = JsonOptions { strict: js.get("strict") == Some(&Value::Bool(true)), ..json_opts };
            Grammar::with_options(&Expr::JsonSchema(schema), json_opts)
                .map(Some)
                .map_err(|e| tools::schema_error("response_format.json_schema.schema", e))
        }
        Some(other) => Err(ApiError::invalid_param("response_format", format!("response_format type '{other}' is not supported (text, json_object, json_schema)"))),
    }
}

/// The `grammar` field (llama.cpp's GBNF), compiled; empty text is no grammar.
fn gbnf(text: Option<&str>) -> Result<Option<Grammar>, ApiError> {
    let Some(text) = text.filter(|t| !t.trim().is_empty()) else { return Ok(None) };
    Grammar::gbnf(text).map(Some).map_err(|e| ApiError::invalid_param("grammar", format!("invalid grammar: {e}")).with_code("invalid_grammar"))
}

/// A chat request's fields checked and turned into what the engine takes, short of the
/// prompt (which needs the model's template and tokenizer).
pub(crate) struct CheckedChat {
    cfg: GenerationConfig,
    n: usize,
    fns: Vec<tools::Function>,
    msgs: Vec<Message>,
    stream: bool,
    include_usage: bool,
    tools: bool,
    template_vars: serde_json::Map<String, Value>,
}

/// Everything in a chat request that does not need the model: sampling fields (`vocab` for
/// `logit_bias`), tools, `response_format` and the tool constraint (compiled), messages
/// (tool calls and results in the template's `style`).
fn check_chat(st: &AppState, vocab: usize, style: ToolStyle, req: &ChatRequest) -> Result<CheckedChat, ApiError> {
    let (mut cfg, n) = req.sampling.check(st, vocab, true)?;
    let (fns, choice) = tools::parse(req.tools.as_ref(), req.tool_choice.as_ref())?;
    // Tools offered are described in the prompt even with tool_choice none (then the
    // constraint keeps calls out of the answer).
    let use_tools = !fns.is_empty();
    let mut response = response_format(req.response_format.as_ref())?;
    if choice != tools::Choice::None && response.is_some() {
        return Err(ApiError::invalid_param("response_format", "response_format cannot be combined with tools (set tool_choice to 'none' to get structured text)"));
    }
    if let Some(g) = gbnf(req.sampling.grammar.as_deref())? {
        if response.is_some() || use_tools {
            return Err(ApiError::invalid_param("grammar", "grammar cannot be combined with response_format or tools: each is a constraint on the output, and only one applies"));
        }
        response = Some(g);
    }
    let msgs = to_messages(&req.messages, style)?;
    let grammar = match choice {
        tools::Choice::None if response.is_some() => response,
        _ => style.constraint(&fns, &choice, req.parallel_tool_calls.unwrap_or(true), JsonOptions::default()).map_err(|e| tools::schema_error("tools", e))?,
    };
    cfg.constraint = grammar.map(Arc::new);
    Ok(CheckedChat {
        cfg,
        n,
        fns,
        msgs,
        stream: req.sampling.stream.unwrap_or(false),
        include_usage: req.sampling.stream_options.as_ref().and_then(|o| o.include_usage).unwrap_or(false),
        tools: choice != tools::Choice::None,
        template_vars: req.chat_template_kwargs.clone().unwrap_or_default(),
    })
}

/// A chat request checked and its prompt rendered by the model's chat template: the prompt's
/// text, the checked request and the tool-call syntax.
pub(crate) fn render_chat(st: &AppState, llm: &Llm, req: &ChatRequest) -> Result<(String, CheckedChat, ToolStyle), ApiError> {
    let pipe = llm.engine.model();
    let Some(template) = pipe.tokenizer().chat_template() else {
        return Err(ApiError::bad_request(format!("model '{}' has no chat template; use /v1/completions", llm.id)));
    };
    let style = ToolStyle::of_template(template.source());
    let mut checked = check_chat(st, pipe.info().vocab_size, style, req)?;
    let ropts = sapient_tokenizers::RenderOptions { extra: std::mem::take(&mut checked.template_vars), ..Default::default() };
    let (text, _) = pipe.render_chat_tools(&checked.msgs, &checked.fns, ropts).map_err(|e| ApiError::bad_request(format!("the chat template failed: {e}")))?;
    Ok((text, checked, style))
}

pub(crate) fn prepare_chat(st: &AppState, llm: &Llm, req: ChatRequest) -> Result<Prepared, ApiError> {
    let (text, CheckedChat { mut cfg, n, stream, include_usage, tools: calls, .. }, style) = render_chat(st, llm, &req)?;
    if style.keeps_special_tokens(calls) {
        // Markers that are special tokens stay in the text for the parser.
        cfg.skip_special_tokens = false;
    }
    let ids = llm.engine.model().tokenizer().encode(&text, false).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let opened = sapient_generate::chat::think::prompt_opens(&text);
    cfg.lora = llm.lora.request(req.sampling.lora.as_ref())?;
    Ok(Prepared { prompts: vec![ids], cfg, n, stream, include_usage, tools: calls, reasoning: Some(opened), tool_format: style.format, slot: req.sampling.id_slot })
}

/// A completion request's fields checked, its prompts encoded with `encode` (strings) or
/// checked against `vocab` (token ids).
fn check_completion(st: &AppState, vocab: usize, req: &CompletionRequest, encode: &dyn Fn(&str) -> Result<Vec<u32>, ApiError>) -> Result<Prepared, ApiError> {
    let (mut cfg, n) = req.sampling.check(st, vocab, false)?;
    cfg.constraint = gbnf(req.sampling.grammar.as_deref())?.map(Arc::new);
    if req.echo.unwrap_or(false) {
        return Err(ApiError::invalid_param("echo", "echo is not supported"));
    }
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid_param("suffix", "suffix is not supported"));
    }
    if req.best_of.is_some_and(|b| b > 1) {
        return Err(ApiError::invalid_param("best_of", "best_of is not supported"));
    }
    let bad = || ApiError::invalid_param("prompt", "prompt must be a string, a list of strings, a list of token ids or a list of such lists");
    let ids = |v: &Value| -> Result<Vec<u32>, ApiError> {
        v.as_array()
            .ok_or_else(bad)?
            .iter()
            .map(|t| t.as_u64().filter(|&t| (t as usize) < vocab).map(|t| t as u32).ok_or_else(bad))
            .collect()
    };
    let prompts = match &req.prompt {
        Value::String(s) => vec![encode(s)?],
        Value::Array(a) if a.iter().all(Value::is_string) && !a.is_empty() => a.iter().map(|s| encode(s.as_str().unwrap_or_default())).collect::<Result<_, _>>()?,
        Value::Array(a) if a.iter().all(Value::is_number) && !a.is_empty() => vec![ids(&req.prompt)?],
        Value::Array(a) if a.iter().all(Value::is_array) && !a.is_empty() => a.iter().map(ids).collect::<Result<_, _>>()?,
        _ => return Err(bad()),
    };
    if prompts.len() * n > st.opts.max_n * 4 {
        return Err(ApiError::invalid_param("prompt", format!("at most {} prompts times n per request", st.opts.max_n * 4)));
    }
    Ok(Prepared {
        prompts,
        cfg,
        n,
        stream: req.sampling.stream.unwrap_or(false),
        include_usage: req.sampling.stream_options.as_ref().and_then(|o| o.include_usage).unwrap_or(false),
        tools: false,
        reasoning: None,
        tool_format: tools::Format::Hermes,
        slot: req.sampling.id_slot,
    })
}

fn prepare_completion(st: &AppState, llm: &Llm, req: CompletionRequest) -> Result<Prepared, ApiError> {
    let pipe = llm.engine.model();
    let tok = pipe.tokenizer();
    let encode = |s: &str| tok.encode(s, true).map_err(|e| ApiError::bad_request(e.to_string()));
    let mut p = check_completion(st, pipe.info().vocab_size, &req, &encode)?;
    p.cfg.lora = llm.lora.request(req.sampling.lora.as_ref())?;
    Ok(p)
}

/// Parse and check a chat or completion body without a model (see [`crate::check_request`]):
/// prompt strings are encoded a byte a token.
pub(crate) fn check_body(st: &AppState, chat: bool, body: &[u8], vocab: usize) -> Result<(), ApiError> {
    let body = Ok(Bytes::copy_from_slice(body));
    if chat {
        let req: ChatRequest = parse_body(st, &HeaderMap::new(), body)?;
        check_chat(st, vocab, ToolStyle { native: false, format: tools::Format::Hermes }, &req).map(drop)
    } else {
        let req: CompletionRequest = parse_body(st, &HeaderMap::new(), body)?;
        check_completion(st, vocab, &req, &|s: &str| Ok(s.bytes().map(u32::from).collect())).map(drop)
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Chat,
    Completion,
}

pub(crate) async fn chat_completions(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: ChatRequest = parse_body(&st, &headers, body)?;
    let llm = st.llm(req.model.as_deref()).await?;
    let (st2, l2) = (st.clone(), llm.clone());
    let p = blocking(move || prepare_chat(&st2, &l2, req)).await?;
    run(st, llm, p, Kind::Chat).await
}

pub(crate) async fn completions(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: CompletionRequest = parse_body(&st, &headers, body)?;
    let llm = st.llm(req.model.as_deref()).await?;
    let (st2, l2) = (st.clone(), llm.clone());
    let p = blocking(move || prepare_completion(&st2, &l2, req)).await?;
    run(st, llm, p, Kind::Completion).await
}

/// Work that needs the CPU for a while (templates, tokenizers, grammars), off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, ApiError> + Send + 'static) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| ApiError::internal(format!("request preparation failed: {e}")))?
}


fn usage(results: &[&Generation], groups: usize, n: usize) -> Value {
    // The prompt of each group counts once, as OpenAI counts it.
    let prompt: usize = results.iter().step_by(n.max(1)).take(groups).map(|g| g.stats.prompt_tokens).sum();
    let cached: usize = results.iter().step_by(n.max(1)).take(groups).map(|g| g.stats.reused_prompt_tokens).sum();
    let completion: usize = results.iter().map(|g| g.tokens.len()).sum();
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached}
    })
}

async fn run(st: Arc<AppState>, llm: Arc<Llm>, p: Prepared, kind: Kind) -> Result<Response, ApiError> {
    let total = p.prompts.len() * p.n;
    let guard = InFlight::take(&st, &llm, total)?;
    let t0 = Instant::now();
    let mut handles = Vec::with_capacity(total);
    for prompt in &p.prompts {
        for j in 0..p.n {
            let mut cfg = p.cfg.clone();
            if let Some(s) = cfg.sampling.seed.as_mut() {
                *s = s.wrapping_add(j as u64);
            }
            handles.push(crate::slots::submit(&llm, p.slot, prompt.clone(), cfg)?);
        }
    }
    let id = new_id(if kind == Kind::Chat { "chatcmpl-" } else { "cmpl-" });
    let created = unix_now();
    let lp = LogprobFormat { bytes: p.cfg.logprobs.map(|_| llm.clone()) };
    let ctx = Ctx { id, created, model: llm.id.clone(), kind, include_usage: p.include_usage, groups: p.prompts.len(), n: p.n, lp };
    if p.stream {
        let (tx, rx) = mpsc::channel::<Bytes>(64);
        let states: Vec<ChoiceState> = (0..total).map(|_| ChoiceState::new(p.tools, p.reasoning, p.tool_format)).collect();
        tokio::spawn(stream_task(handles, states, tx, ctx, llm, guard, t0));
        return Ok(sse_response(rx));
    }
    // Whole answers: wait for every choice.
    let mut states: Vec<ChoiceState> = (0..total).map(|_| ChoiceState::new(p.tools, p.reasoning, p.tool_format)).collect();
    let mut merged = merged(handles);
    while let Some((i, ev)) = merged.next().await {
        let s = &mut states[i];
        match ev {
            Event::Text(t) => {
                if !s.started {
                    s.started = true;
                    llm.stats.ttft.observe(t0.elapsed());
                }
                let pieces = s.pieces(&t);
                s.record(&pieces);
            }
            Event::Done(r) => {
                let pieces = s.finish_pieces();
                s.record(&pieces);
                s.result = Some(r.map_err(from_generate));
                llm.stats.e2e.observe(t0.elapsed());
            }
            _ => {}
        }
    }
    drop(guard);
    let mut gens = Vec::with_capacity(total);
    for s in &mut states {
        match s.result.take() {
            Some(Ok(g)) => gens.push(g),
            Some(Err(e)) => {
                llm.stats.requests_failed.fetch_add(1, Ordering::Relaxed);
                return Err(e);
            }
            None => {
                llm.stats.requests_failed.fetch_add(1, Ordering::Relaxed);
                return Err(ApiError::internal("the engine stopped before the request ended"));
            }
        }
    }
    llm.stats.requests_ok.fetch_add(1, Ordering::Relaxed);
    let choices: Vec<Value> = states
        .iter()
        .zip(&gens)
        .enumerate()
        .map(|(i, (s, g))| match kind {
            Kind::Chat => {
                let mut message = json!({"role": "assistant", "content": if s.calls.is_empty() || !s.content.trim().is_empty() { Value::String(s.content.clone()) } else { Value::Null }});
                if !s.reasoning.is_empty() {
                    message["reasoning_content"] = Value::String(s.reasoning.clone());
                }
                if !s.calls.is_empty() {
                    message["tool_calls"] = s
                        .calls
                        .iter()
                        .map(|(id, name, args)| json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}}))
                        .collect();
                }
                let lps = ctx.lp.bytes.as_ref().map(|_| ctx.lp.chat(&g.logprobs));
                json!({"index": i, "message": message, "logprobs": lps, "finish_reason": s.finish_reason(g)})
            }
            Kind::Completion => {
                let lps = ctx.lp.bytes.as_ref().map(|_| ctx.lp.completion(&g.logprobs));
                json!({"index": i, "text": s.content, "logprobs": lps, "finish_reason": s.finish_reason(g)})
            }
        })
        .collect();
    let refs: Vec<&Generation> = gens.iter().collect();
    let object = if kind == Kind::Chat { "chat.completion" } else { "text_completion" };
    Ok(axum::Json(json!({
        "id": ctx.id,
        "object": object,
        "created": created,
        "model": ctx.model,
        "choices": choices,
        "usage": usage(&refs, ctx.groups, ctx.n),
        "system_fingerprint": null
    }))
    .into_response())
}

struct Ctx {
    id: String,
    created: u64,
    model: String,
    kind: Kind,
    include_usage: bool,
    groups: usize,
    n: usize,
    lp: LogprobFormat,
}

/// OpenAI's log-probability objects, with each token's text and bytes.
struct LogprobFormat {
    /// Asked for (`None`: every choice's `logprobs` is null).
    bytes: Option<Arc<Llm>>,
}

impl LogprobFormat {
    fn token(&self, t: u32) -> (String, Vec<u8>) {
        let b = self
            .bytes
            .as_ref()
            .and_then(|llm| llm.token_bytes.get_or_init(|| llm.engine.model().tokenizer().token_bytes()).get(t as usize).cloned())
            .unwrap_or_default();
        (String::from_utf8_lossy(&b).into_owned(), b)
    }
    /// JSON has no infinities: an impossible token gets OpenAI's -9999.
    fn value(lp: f32) -> f32 {
        if lp.is_finite() {
            lp
        } else {
            -9999.0
        }
    }
    fn chat(&self, lps: &[TokenLogprob]) -> Value {
        let entry = |t: u32, lp: f32| {
            let (text, bytes) = self.token(t);
            json!({"token": text, "logprob": Self::value(lp), "bytes": bytes})
        };
        let content: Vec<Value> = lps
            .iter()
            .map(|l| {
                let mut e = entry(l.token, l.logprob);
                e["top_logprobs"] = l.top.iter().map(|&(t, lp)| entry(t, lp)).collect();
                e
            })
            .collect();
        json!({"content": content, "refusal": null})
    }
    /// The legacy completions shape; `text_offset` counts characters from the start of this
    /// piece of the completion.
    fn completion(&self, lps: &[TokenLogprob]) -> Value {
        let mut tokens = Vec::new();
        let mut offsets = Vec::new();
        let mut at = 0;
        for l in lps {
            let (text, _) = self.token(l.token);
            offsets.push(at);
            at += text.chars().count();
            tokens.push(text);
        }
        let top: Vec<Value> = lps
            .iter()
            .map(|l| Value::Object(l.top.iter().map(|&(t, lp)| (self.token(t).0, json!(Self::value(lp)))).collect()))
            .collect();
        json!({
            "tokens": tokens,
            "token_logprobs": lps.iter().map(|l| Self::value(l.logprob)).collect::<Vec<_>>(),
            "top_logprobs": top,
            "text_offset": offsets,
        })
    }
}

impl Ctx {
    fn chunk(&self, choices: Value) -> Bytes {
        let object = if self.kind == Kind::Chat { "chat.completion.chunk" } else { "text_completion" };
        let mut v = json!({"id": self.id, "object": object, "created": self.created, "model": self.model, "system_fingerprint": null, "choices": choices});
        if self.include_usage {
            v["usage"] = Value::Null;
        }
        sse(&v)
    }
    /// A chunk with one choice's delta (chat) or text (completions), and the
    /// log-probabilities of its tokens when asked for.
    fn delta(&self, index: usize, delta: Value, finish: Option<&str>, lps: Option<&[TokenLogprob]>) -> Bytes {
        let choice = match self.kind {
            Kind::Chat => json!({"index": index, "delta": delta, "logprobs": lps.map(|l| self.lp.chat(l)), "finish_reason": finish}),
            Kind::Completion => {
                let text = delta.get("content").and_then(Value::as_str).unwrap_or_default();
                json!({"index": index, "text": text, "logprobs": lps.map(|l| self.lp.completion(l)), "finish_reason": finish})
            }
        };
        self.chunk(json!([choice]))
    }
}

fn sse(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

/// Drive a streamed request: pieces to SSE chunks. Stops (dropping the handles, which
/// cancels the generations and frees their KV blocks) as soon as the client is gone.
async fn stream_task(
    handles: Vec<RequestHandle>,
    mut states: Vec<ChoiceState>,
    tx: mpsc::Sender<Bytes>,
    ctx: Ctx,
    llm: Arc<Llm>,
    guard: InFlight,
    t0: Instant,
) {
    let mut events = merged(handles);
    let mut gens: Vec<Option<Generation>> = (0..states.len()).map(|_| None).collect();
    let mut failed = None;
    loop {
        let next = tokio::select! {
            _ = tx.closed() => {
                llm.stats.requests_cancelled.fetch_add(1, Ordering::Relaxed);
                return;
            }
            e = events.next() => e,
        };
        let Some((i, ev)) = next else { break };
        let mut out: Vec<Bytes> = Vec::new();
        let s = &mut states[i];
        if !s.started {
            s.started = true;
            llm.stats.ttft.observe(t0.elapsed());
            let first = if ctx.kind == Kind::Chat { json!({"role": "assistant", "content": ""}) } else { json!({"content": ""}) };
            if ctx.kind == Kind::Chat {
                out.push(ctx.delta(i, first, None, None));
            }
        }
        let (mut pieces, done, lps) = match ev {
            Event::Text(t) => {
                let now = Instant::now();
                if let Some(l) = s.last.replace(now) {
                    llm.stats.inter_token.observe(now - l);
                }
                (s.pieces(&t), None, None)
            }
            Event::Logprobs(l) => (Vec::new(), None, Some(l)),
            Event::Done(r) => (s.finish_pieces(), Some(r), None),
            _ => (Vec::new(), None, None),
        };
        s.record(&pieces);
        if ctx.lp.bytes.is_some() {
            // A step's text comes before its log-probabilities: send them together.
            s.held.append(&mut pieces);
            if lps.is_some() || done.is_some() {
                pieces = std::mem::take(&mut s.held);
            }
        }
        let mut lps = lps;
        for p in pieces {
            let delta = match p {
                Piece::Content(c) => json!({"content": c}),
                Piece::Reasoning(r) => json!({"reasoning_content": r}),
                Piece::CallStart { index, name } => {
                    let id = s.call_ids.get(index).cloned().unwrap_or_default();
                    json!({"tool_calls": [{"index": index, "id": id, "type": "function", "function": {"name": name, "arguments": ""}}]})
                }
                Piece::CallArgs { index, text } => json!({"tool_calls": [{"index": index, "function": {"arguments": text}}]}),
            };
            out.push(ctx.delta(i, delta, None, lps.take().as_deref()));
        }
        if let Some(l) = lps {
            // Tokens whose text is still held back (a possible stop string, a partial tag).
            let empty = if ctx.kind == Kind::Chat { json!({}) } else { json!({"content": ""}) };
            out.push(ctx.delta(i, empty, None, Some(&l)));
        }
        match done {
            None => {}
            Some(Ok(g)) => {
                out.push(ctx.delta(i, json!({}), Some(s.finish_reason(&g)), None));
                gens[i] = Some(g);
            }
            Some(Err(e)) => {
                failed = Some(from_generate(e));
            }
        }
        for b in out {
            if tx.send(b).await.is_err() {
                llm.stats.requests_cancelled.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        if let Some(e) = &failed {
            let _ = tx.send(sse(&e.body())).await;
            break;
        }
    }
    drop(events);
    drop(guard);
    llm.stats.e2e.observe(t0.elapsed());
    if failed.is_some() {
        llm.stats.requests_failed.fetch_add(1, Ordering::Relaxed);
    } else {
        llm.stats.requests_ok.fetch_add(1, Ordering::Relaxed);
        if ctx.include_usage {
            let refs: Vec<&Generation> = gens.iter().flatten().collect();
            let mut v = json!({"id": ctx.id, "object": if ctx.kind == Kind::Chat { "chat.completion.chunk" } else { "text_completion" }, "created": ctx.created, "model": ctx.model, "system_fingerprint": null, "choices": []});
            v["usage"] = usage(&refs, ctx.groups, ctx.n);
            let _ = tx.send(sse(&v)).await;
        }
    }
    let _ = tx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
}
