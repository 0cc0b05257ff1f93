//! `POST /v1/responses`, `GET` and `DELETE /v1/responses/{id}`: OpenAI's Responses API. A
//! request is mapped onto a chat completions request (`instructions` as the system prompt,
//! `input` items as messages, `function_call` / `function_call_output` items as tool calls
//! and tool messages, function tools, `text.format` as `response_format`), so the prompt,
//! the grammar and the parsing of the answer are chat's; the answer is given back as output
//! items (`reasoning`, `message`, `function_call`), whole or as Responses events.
//!
//! Responses with `store` (the default) are kept in memory, for `previous_response_id` and
//! `GET`: at most [`ServerOptions::responses_max`](crate::ServerOptions::responses_max) of
//! them, each for [`ServerOptions::responses_ttl`](crate::ServerOptions::responses_ttl); the
//! oldest go first, and all go when the server stops.

use crate::chat::{blocking, prepare_chat, ChatRequest, InMessage, Sampling};
use crate::error::ApiError;
use crate::tools::Piece;
use crate::turn::{named_event, ChoiceState, Step, Turn};
use crate::{new_id, parse_body, unix_now, AppState};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use sapient_generate::{FinishReason, Generation};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

#[derive(Deserialize)]
struct ResponsesRequest {
    model: Option<String>,
    input: Option<Value>,
    instructions: Option<String>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<bool>,
    text: Option<Value>,
    max_output_tokens: Option<i64>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    stream: Option<bool>,
    store: Option<bool>,
    previous_response_id: Option<String>,
    metadata: Option<Value>,
}

/// Stored responses: each with its conversation (the messages before it, without
/// `instructions`, and its own answer), oldest first.
#[derive(Default)]
pub(crate) struct Store {
    inner: Mutex<StoreInner>,
}

#[derive(Default)]
struct StoreInner {
    map: HashMap<String, Stored>,
    order: VecDeque<String>,
}

struct Stored {
    at: Instant,
    response: Value,
    history: Vec<InMessage>,
}

impl Store {
    fn lock(&self) -> std::sync::MutexGuard<'_, StoreInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
    /// Drop what is too old, and the oldest beyond `max` (after making room for one more).
    fn evict(s: &mut StoreInner, st: &AppState, room: usize) {
        let (max, ttl) = (st.opts.responses_max, st.opts.responses_ttl);
        while let Some(id) = s.order.front() {
            let stale = s.map.get(id).is_none_or(|r| r.at.elapsed() > ttl);
            if !stale && s.map.len() + room <= max {
                break;
            }
            if let Some(id) = s.order.pop_front() {
                s.map.remove(&id);
            }
        }
        if s.order.len() > 2 * max.max(16) {
            let StoreInner { map, order } = s;
            order.retain(|id| map.contains_key(id));
        }
    }
    fn put(&self, st: &AppState, id: String, response: Value, history: Vec<InMessage>) {
        if st.opts.responses_max == 0 {
            return;
        }
        let mut s = self.lock();
        Self::evict(&mut s, st, 1);
        s.order.push_back(id.clone());
        s.map.insert(id, Stored { at: Instant::now(), response, history });
    }
    fn get(&self, st: &AppState, id: &str) -> Result<(Value, Vec<InMessage>), ApiError> {
        let mut s = self.lock();
        Self::evict(&mut s, st, 0);
        let ttl = st.opts.responses_ttl.as_secs();
        s.map.get(id).map(|r| (r.response.clone(), r.history.clone())).ok_or_else(|| {
            ApiError::not_found(format!("No response with id '{id}' is stored here (responses are kept in memory for {ttl} s, the {} newest at most)", st.opts.responses_max))
        })
    }
    fn delete(&self, id: &str) -> bool {
        self.lock().map.remove(id).is_some()
    }
}

/// A message's text: a string, or a list of text parts (`input_text`, `output_text`).
fn parts_text(v: Option<&Value>, at: &str) -> Result<String, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut s = String::new();
            for (j, p) in parts.iter().enumerate() {
                match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                    (Some("input_text" | "output_text" | "text"), Some(t)) => s.push_str(t),
                    (kind, _) => return Err(ApiError::invalid_param(format!("{at}[{j}]"), format!("{at}[{j}]: content type '{}' is not supported (input_text, output_text)", kind.unwrap_or("?")))),
                }
            }
            Ok(s)
        }
        Some(_) => Err(ApiError::invalid_param(at, format!("{at} must be a string or a list of content parts"))),
    }
}

fn message(role: &str, text: String) -> InMessage {
    InMessage { role: role.into(), content: Some(Value::String(text)), ..InMessage::default() }
}

/// `input` (a string or a list of items) as chat messages, after `out`.
fn input_messages(input: Option<&Value>, out: &mut Vec<InMessage>) -> Result<(), ApiError> {
    let items = match input {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::String(s)) => {
            out.push(message("user", s.clone()));
            return Ok(());
        }
        Some(Value::Array(a)) => a,
        Some(_) => return Err(ApiError::invalid_param("input", "input must be a string or a list of items")),
    };
    for (i, item) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        let field = |k: &str| item.get(k).and_then(Value::as_str).ok_or_else(|| ApiError::invalid_param(&at, format!("{at}: this item needs '{k}'")));
        let kind = item.get("type").and_then(Value::as_str).unwrap_or("message");
        match kind {
            "message" => {
                let role = field("role")?;
                if !matches!(role, "user" | "system" | "developer" | "assistant") {
                    return Err(ApiError::invalid_param(format!("{at}.role"), format!("{at}.role: unknown role '{role}' (user, system, developer, assistant)")));
                }
                out.push(message(role, parts_text(item.get("content"), &format!("{at}.content"))?));
            }
            "function_call" => {
                let call = json!({"id": field("call_id")?, "type": "function", "function": {"name": field("name")?, "arguments": field("arguments")?}});
                // Calls after an assistant message (or other calls) belong to its turn.
                match out.last_mut() {
                    Some(m) if m.role == "assistant" => m.tool_calls.get_or_insert_with(Vec::new).push(call),
                    _ => out.push(InMessage { tool_calls: Some(vec![call]), ..message("assistant", String::new()) }),
                }
            }
            "function_call_output" => {
                let output = match item.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    o => parts_text(o, &format!("{at}.output"))?,
                };
                out.push(InMessage { tool_call_id: Some(field("call_id")?.to_string()), ..message("tool", output) });
            }
            "reasoning" => {}
            other => return Err(ApiError::invalid_param(format!("{at}.type"), format!("{at}: item type '{other}' is not supported (message, function_call, function_call_output, reasoning)"))),
        }
    }
    Ok(())
}

/// Responses function tools as chat tools; other tool types are refused.
fn to_chat_tools(tools: &[Value]) -> Result<Value, ApiError> {
    let mut out = Vec::new();
    for (i, t) in tools.iter().enumerate() {
        match t.get("type").and_then(Value::as_str) {
            Some("function") => {}
            kind => return Err(ApiError::invalid_param(format!("tools[{i}]"), format!("tool type '{}' is not supported (function)", kind.unwrap_or("?")))),
        }
        let mut f = Map::new();
        for k in ["name", "description", "parameters", "strict"] {
            if let Some(v) = t.get(k).filter(|v| !v.is_null()) {
                f.insert(k.into(), v.clone());
            }
        }
        out.push(json!({"type": "function", "function": f}));
    }
    Ok(Value::Array(out))
}

/// `text.format` as chat's `response_format`.
fn to_response_format(text: Option<&Value>) -> Result<Option<Value>, ApiError> {
    let Some(f) = text.and_then(|t| t.get("format")).filter(|f| !f.is_null()) else { return Ok(None) };
    match f.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "json_object"}))),
        Some("json_schema") => {
            let schema = f.get("schema").cloned().ok_or_else(|| ApiError::invalid_param("text.format.schema", "text.format of type json_schema needs a 'schema'"))?;
            Ok(Some(json!({"type": "json_schema", "json_schema": {"name": f.get("name"), "schema": schema, "strict": f.get("strict")}})))
        }
        _ => Err(ApiError::invalid_param("text.format.type", "text.format type must be 'text', 'json_object' or 'json_schema'")),
    }
}

/// The chat request a Responses request stands for, with the conversation before it (from
/// `previous_response_id`).
fn to_chat(req: &ResponsesRequest, history: Vec<InMessage>) -> Result<ChatRequest, ApiError> {
    let mut messages = Vec::new();
    if let Some(i) = req.instructions.as_ref().filter(|i| !i.is_empty()) {
        messages.push(message("system", i.clone()));
    }
    messages.extend(history);
    input_messages(req.input.as_ref(), &mut messages)?;
    if messages.is_empty() {
        return Err(ApiError::invalid_param("input", "input is required"));
    }
    let tools = req.tools.as_deref().filter(|t| !t.is_empty()).map(to_chat_tools).transpose()?;
    let tool_choice = match &req.tool_choice {
        Some(Value::Object(o)) if o.get("type").and_then(Value::as_str) == Some("function") => Some(json!({"type": "function", "function": {"name": o.get("name")}})),
        other => other.clone(),
    };
    let sampling = Sampling { temperature: req.temperature, top_p: req.top_p, max_tokens: req.max_output_tokens, stream: req.stream, ..Sampling::default() };
    Ok(ChatRequest {
        model: req.model.clone(),
        messages,
        sampling,
        response_format: to_response_format(req.text.as_ref())?,
        tools,
        tool_choice,
        parallel_tool_calls: req.parallel_tool_calls,
        ..ChatRequest::default()
    })
}

/// What a response object repeats of its request.
fn echo(req: &ResponsesRequest) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("instructions".into(), json!(req.instructions));
    m.insert("tools".into(), json!(req.tools.clone().unwrap_or_default()));
    m.insert("tool_choice".into(), req.tool_choice.clone().unwrap_or(json!("auto")));
    m.insert("parallel_tool_calls".into(), json!(req.parallel_tool_calls.unwrap_or(true)));
    m.insert("temperature".into(), json!(req.temperature.unwrap_or(1.0)));
    m.insert("top_p".into(), json!(req.top_p.unwrap_or(1.0)));
    m.insert("max_output_tokens".into(), json!(req.max_output_tokens));
    m.insert("previous_response_id".into(), json!(req.previous_response_id));
    m.insert("store".into(), json!(req.store.unwrap_or(true)));
    m.insert("text".into(), req.text.clone().unwrap_or(json!({"format": {"type": "text"}})));
    m.insert("metadata".into(), req.metadata.clone().unwrap_or(json!({})));
    m
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Message,
    Reasoning,
    Call,
}

/// The output item being written: its id, its text so far (the message's, the reasoning's
/// or the call's arguments), and a call's name and id.
struct OpenItem {
    kind: Kind,
    id: String,
    text: String,
    name: String,
    call_id: String,
}

/// A response being written: its output items and events (whole answers are made from the
/// same steps, their events dropped).
struct Output {
    id: String,
    created: u64,
    model: String,
    echo: Map<String, Value>,
    /// Where to keep the response at its end, with the conversation before its answer.
    store: Option<(Arc<AppState>, Vec<InMessage>)>,
    seq: u64,
    items: Vec<Value>,
    open: Option<OpenItem>,
    /// Whitespace held back before a message is opened (none is opened for whitespace alone).
    held: String,
    finished: Option<Value>,
}

impl Output {
    fn event(&mut self, kind: &str, mut v: Value) -> Bytes {
        v["type"] = json!(kind);
        v["sequence_number"] = json!(self.seq);
        self.seq += 1;
        named_event(kind, &v)
    }

    fn object(&self, status: &str, usage: &Value, incomplete: Option<&str>) -> Value {
        let mut m = self.echo.clone();
        m.insert("id".into(), json!(self.id));
        m.insert("object".into(), json!("response"));
        m.insert("created_at".into(), json!(self.created));
        m.insert("status".into(), json!(status));
        m.insert("model".into(), json!(self.model));
        m.insert("output".into(), json!(self.items));
        m.insert("usage".into(), usage.clone());
        m.insert("error".into(), Value::Null);
        m.insert("incomplete_details".into(), incomplete.map_or(Value::Null, |r| json!({"reason": r})));
        Value::Object(m)
    }

    fn start(&mut self, kind: Kind, name: &str, call_id: &str, out: &mut Vec<Bytes>) {
        self.close(out);
        let output_index = self.items.len();
        let id = new_id(match kind {
            Kind::Message => "msg_",
            Kind::Reasoning => "rs_",
            Kind::Call => "fc_",
        });
        let item = match kind {
            Kind::Message => json!({"type": "message", "id": id, "status": "in_progress", "role": "assistant", "content": []}),
            Kind::Reasoning => json!({"type": "reasoning", "id": id, "summary": [], "content": []}),
            Kind::Call => json!({"type": "function_call", "id": id, "call_id": call_id, "name": name, "arguments": "", "status": "in_progress"}),
        };
        out.push(self.event("response.output_item.added", json!({"output_index": output_index, "item": item})));
        if kind == Kind::Message {
            let part = json!({"type": "output_text", "text": "", "annotations": []});
            out.push(self.event("response.content_part.added", json!({"item_id": id, "output_index": output_index, "content_index": 0, "part": part})));
        }
        self.open = Some(OpenItem { kind, id, text: String::new(), name: name.into(), call_id: call_id.into() });
    }

    /// More text for the open item, as its delta event.
    fn delta(&mut self, text: &str, out: &mut Vec<Bytes>) {
        let output_index = self.items.len();
        let Some(o) = self.open.as_mut() else { return };
        o.text.push_str(text);
        let (kind, id) = (o.kind, o.id.clone());
        let (name, mut v) = match kind {
            Kind::Message => ("response.output_text.delta", json!({"content_index": 0, "logprobs": []})),
            Kind::Reasoning => ("response.reasoning_text.delta", json!({"content_index": 0})),
            Kind::Call => ("response.function_call_arguments.delta", json!({})),
        };
        v["item_id"] = json!(id);
        v["output_index"] = json!(output_index);
        v["delta"] = json!(text);
        out.push(self.event(name, v));
    }

    fn close(&mut self, out: &mut Vec<Bytes>) {
        let Some(OpenItem { kind, id, text, name, call_id }) = self.open.take() else { return };
        let at = json!({"item_id": id, "output_index": self.items.len()});
        let with = |mut v: Value, more: Value| {
            if let (Some(v), Value::Object(more)) = (v.as_object_mut(), more) {
                v.extend(more);
            }
            v
        };
        let item = match kind {
            Kind::Message => {
                let part = json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []});
                out.push(self.event("response.output_text.done", with(at.clone(), json!({"content_index": 0, "text": text, "logprobs": []}))));
                out.push(self.event("response.content_part.done", with(at.clone(), json!({"content_index": 0, "part": part}))));
                json!({"type": "message", "id": id, "status": "completed", "role": "assistant", "content": [part]})
            }
            Kind::Reasoning => {
                out.push(self.event("response.reasoning_text.done", with(at.clone(), json!({"content_index": 0, "text": text}))));
                json!({"type": "reasoning", "id": id, "summary": [], "content": [{"type": "reasoning_text", "text": text}]})
            }
            Kind::Call => {
                out.push(self.event("response.function_call_arguments.done", with(at.clone(), json!({"name": name, "arguments": text}))));
                json!({"type": "function_call", "id": id, "call_id": call_id, "name": name, "arguments": text, "status": "completed"})
            }
        };
        out.push(self.event("response.output_item.done", json!({"output_index": self.items.len(), "item": item})));
        self.items.push(item);
    }

    fn emit(&mut self, step: &Step, s: &ChoiceState) -> Vec<Bytes> {
        let mut out = Vec::new();
        let pieces = match step {
            Step::Pieces(p) | Step::Done(p, _) => p.as_slice(),
            Step::Failed(e) => {
                let mut r = self.object("failed", &Value::Null, None);
                r["error"] = json!({"code": "server_error", "message": e.message});
                return vec![self.event("response.failed", json!({"response": r}))];
            }
        };
        for p in pieces {
            let open = self.open.as_ref().map(|o| o.kind);
            match p {
                Piece::Content(c) if open == Some(Kind::Message) => self.delta(c, &mut out),
                Piece::Content(c) => {
                    self.held.push_str(c);
                    if !self.held.trim().is_empty() {
                        self.start(Kind::Message, "", "", &mut out);
                        let t = std::mem::take(&mut self.held);
                        self.delta(&t, &mut out);
                    }
                }
                Piece::Reasoning(r) => {
                    if open != Some(Kind::Reasoning) {
                        self.start(Kind::Reasoning, "", "", &mut out);
                    }
                    self.delta(r, &mut out);
                }
                Piece::CallStart { index, name } => {
                    self.held.clear();
                    let call_id = s.call_ids.get(*index).cloned().unwrap_or_default();
                    self.start(Kind::Call, name, &call_id, &mut out);
                }
                Piece::CallArgs { text, .. } => self.delta(text, &mut out),
            }
        }
        if let Step::Done(_, g) = step {
            if self.items.is_empty() && self.open.is_none() && s.calls.is_empty() {
                self.start(Kind::Message, "", "", &mut out);
            }
            self.close(&mut out);
            out.push(self.finish(s, g));
        }
        out
    }

    /// The end: the whole response (kept when stored) and its last event.
    fn finish(&mut self, s: &ChoiceState, g: &Generation) -> Bytes {
        let cut = matches!(g.finish, FinishReason::MaxTokens | FinishReason::ContextFull);
        let (prompt, completion) = (g.stats.prompt_tokens, g.tokens.len());
        let usage = json!({
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": g.stats.reused_prompt_tokens},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion
        });
        let r = self.object(if cut { "incomplete" } else { "completed" }, &usage, cut.then_some("max_output_tokens"));
        if let Some((st, mut conversation)) = self.store.take() {
            let calls: Vec<Value> = s.calls.iter().map(|(id, name, args)| json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}})).collect();
            let text = if calls.is_empty() { s.content.clone() } else { s.content.trim_end().to_string() };
            conversation.push(InMessage { tool_calls: (!calls.is_empty()).then_some(calls), ..message("assistant", text) });
            st.responses.put(&st, self.id.clone(), r.clone(), conversation);
        }
        let b = self.event(if cut { "response.incomplete" } else { "response.completed" }, json!({"response": r.clone()}));
        self.finished = Some(r);
        b
    }
}

pub(crate) async fn create(State(st): State<Arc<AppState>>, headers: HeaderMap, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let req: ResponsesRequest = parse_body(&st, &headers, body)?;
    let history = match &req.previous_response_id {
        Some(id) => st.responses.get(&st, id)?.1,
        None => Vec::new(),
    };
    let chat = to_chat(&req, history)?;
    // What the stored conversation holds: the messages without `instructions`.
    let skip = usize::from(req.instructions.as_ref().is_some_and(|i| !i.is_empty()));
    let conversation: Vec<InMessage> = chat.messages[skip..].to_vec();
    let llm = st.llm(chat.model.as_deref()).await?;
    let (st2, l2) = (st.clone(), llm.clone());
    let p = blocking(move || prepare_chat(&st2, &l2, chat)).await?;
    let stream = p.stream;
    let mut turn = Turn::start(&st, llm.clone(), p)?;
    let mut out = Output {
        id: new_id("resp_"),
        created: unix_now(),
        model: llm.id.clone(),
        echo: echo(&req),
        store: req.store.unwrap_or(true).then_some((st.clone(), conversation)),
        seq: 0,
        items: Vec::new(),
        open: None,
        held: String::new(),
        finished: None,
    };
    let created = out.object("in_progress", &Value::Null, None);
    let first = vec![out.event("response.created", json!({"response": created.clone()})), out.event("response.in_progress", json!({"response": created}))];
    if stream {
        return Ok(turn.stream(first, move |step, s| out.emit(step, s)));
    }
    loop {
        match turn.next().await {
            Some(step @ Step::Done(..)) => {
                out.emit(&step, &turn.state);
                return Ok(axum::Json(out.finished.take().unwrap_or_default()).into_response());
            }
            Some(Step::Failed(e)) => return Err(e),
            Some(step) => {
                out.emit(&step, &turn.state);
            }
            None => return Err(ApiError::internal("the request ended twice")),
        }
    }
}

pub(crate) async fn retrieve(State(st): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Response, ApiError> {
    Ok(axum::Json(st.responses.get(&st, &id)?.0).into_response())
}

pub(crate) async fn delete(State(st): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Response, ApiError> {
    if !st.responses.delete(&id) {
        return Err(ApiError::not_found(format!("No response with id '{id}' is stored here")));
    }
    Ok(axum::Json(json!({"id": id, "object": "response", "deleted": true})).into_response())
}
