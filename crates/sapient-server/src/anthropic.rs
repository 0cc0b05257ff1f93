//! `POST /v1/messages` and `POST /v1/messages/count_tokens`: Anthropic's Messages API. A
//! request is mapped onto a chat completions request (system prompt, messages with their
//! `tool_use` / `tool_result` blocks as tool calls and tool messages, tools and
//! `tool_choice`, sampling), so the prompt, the tool-call grammar and the parsing of the
//! answer are chat's; the answer is given back as Anthropic content blocks (`thinking`,
//! `text`, `tool_use`), whole or as Anthropic's event stream. Errors have Anthropic's shape.

use crate::chat::{blocking, prepare_chat, ChatRequest, InMessage, Sampling, Stop};
use crate::error::ApiError;
use crate::tools::Piece;
use crate::turn::{matched_stop, named_event, ChoiceState, Step, Turn};
use crate::{new_id, parse_body, AppState, Llm};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use sapient_generate::{FinishReason, Generation};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

#[derive(Deserialize)]
struct MessagesRequest {
    model: Option<String>,
    messages: Vec<AnthropicMessage>,
    system: Option<Value>,
    max_tokens: Option<i64>,
    stop_sequences: Option<Vec<String>>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<usize>,
    stream: Option<bool>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    thinking: Option<Value>,
    /// Structured output: `{"format": {"type": "json_schema", "schema": {...}}}`.
    output_config: Option<Value>,
}

#[derive(Deserialize)]
struct AnthropicMessage {
    role: String,
    content: Value,
}

/// The text of `system` or of a `tool_result`'s content: a string or a list of text blocks.
fn text_of(v: &Value, param: &str) -> Result<String, ApiError> {
    match v {
        Value::Null => Ok(String::new()),
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut out = String::new();
            for (i, b) in blocks.iter().enumerate() {
                match (b.get("type").and_then(Value::as_str), b.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => {
                        if !out.is_empty() {
                            out.push('\n');
                        }
                        out.push_str(t);
                    }
                    (kind, _) => return Err(ApiError::invalid_param(format!("{param}[{i}]"), format!("{param}[{i}]: block type '{}' is not supported here (text only)", kind.unwrap_or("?")))),
                }
            }
            Ok(out)
        }
        _ => Err(ApiError::invalid_param(param, format!("{param} must be a string or a list of text blocks"))),
    }
}

fn message(role: &str, text: String) -> InMessage {
    InMessage { role: role.into(), content: Some(Value::String(text)), ..InMessage::default() }
}

/// Anthropic messages to chat messages: `tool_use` blocks become an assistant's tool calls
/// (their `input` the arguments), `tool_result` blocks tool messages, thinking blocks of
/// earlier turns are dropped (chat templates drop earlier reasoning too).
fn to_chat_messages(system: Option<&Value>, msgs: &[AnthropicMessage]) -> Result<Vec<InMessage>, ApiError> {
    let mut out = Vec::new();
    if let Some(s) = system {
        let text = text_of(s, "system")?;
        if !text.is_empty() {
            out.push(message("system", text));
        }
    }
    for (i, m) in msgs.iter().enumerate() {
        let blocks = match &m.content {
            Value::String(s) => vec![json!({"type": "text", "text": s})],
            Value::Array(a) => a.clone(),
            _ => return Err(ApiError::invalid_param(format!("messages[{i}].content"), "content must be a string or a list of content blocks")),
        };
        let mut text = String::new();
        let mut calls = Vec::new();
        for (j, b) in blocks.iter().enumerate() {
            let at = format!("messages[{i}].content[{j}]");
            let field = |k: &str| b.get(k).and_then(Value::as_str).ok_or_else(|| ApiError::invalid_param(&at, format!("{at}: a {} block needs '{k}'", b.get("type").and_then(Value::as_str).unwrap_or("?"))));
            match (m.role.as_str(), b.get("type").and_then(Value::as_str).unwrap_or("")) {
                (_, "text") => text.push_str(field("text")?),
                ("assistant", "thinking" | "redacted_thinking") => {}
                ("assistant", "tool_use") => {
                    let input = b.get("input").cloned().unwrap_or_else(|| json!({}));
                    calls.push(json!({"id": field("id")?, "type": "function", "function": {"name": field("name")?, "arguments": input}}));
                }
                ("user", "tool_result") => {
                    if !text.is_empty() {
                        out.push(message("user", std::mem::take(&mut text)));
                    }
                    let mut result = text_of(b.get("content").unwrap_or(&Value::Null), &format!("{at}.content"))?;
                    if b.get("is_error").and_then(Value::as_bool) == Some(true) {
                        result = format!("Error: {result}");
                    }
                    out.push(InMessage { tool_call_id: Some(field("tool_use_id")?.to_string()), ..message("tool", result) });
                }
                (role, kind) => {
                    return Err(ApiError::invalid_param(&at, format!("{at}: a '{kind}' block is not supported in a {role} message (text, tool_use, tool_result, thinking)")))
                }
            }
        }
        match m.role.as_str() {
            "user" if !text.is_empty() || out.last().is_none_or(|l| l.role != "tool") => out.push(message("user", text)),
            "user" => {}
            "assistant" => out.push(InMessage { tool_calls: (!calls.is_empty()).then_some(calls), ..message("assistant", text) }),
            other => return Err(ApiError::invalid_param(format!("messages[{i}].role"), format!("messages[{i}].role: unknown role '{other}' (user, assistant)"))),
        }
    }
    Ok(out)
}

/// Anthropic tools (`name`, `description`, `input_schema`) as chat tools; server tools
/// (web search, code execution, ...) are refused.
fn to_chat_tools(tools: &[Value]) -> Result<Value, ApiError> {
    let mut out = Vec::new();
    for (i, t) in tools.iter().enumerate() {
        let at = format!("tools[{i}]");
        if let Some(kind) = t.get("type").and_then(Value::as_str).filter(|k| *k != "custom") {
            return Err(ApiError::invalid_param(at, format!("tool type '{kind}' is not supported (only client tools with an input_schema)")));
        }
        let name = t.get("name").cloned().ok_or_else(|| ApiError::invalid_param(&at, format!("{at}: a tool needs a 'name'")))?;
        let schema = t.get("input_schema").cloned().ok_or_else(|| ApiError::invalid_param(&at, format!("{at}: a tool needs an 'input_schema'")))?;
        let mut f = json!({"name": name, "parameters": schema});
        for k in ["description", "strict"] {
            if let Some(v) = t.get(k) {
                f[k] = v.clone();
            }
        }
        out.push(json!({"type": "function", "function": f}));
    }
    Ok(Value::Array(out))
}

/// Anthropic's `tool_choice` as chat's, and whether calls may come several at once.
fn to_chat_choice(choice: &Value) -> Result<(Value, bool), ApiError> {
    let parallel = choice.get("disable_parallel_tool_use").and_then(Value::as_bool) != Some(true);
    let c = match choice.get("type").and_then(Value::as_str) {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => {
            let name = choice.get("name").and_then(Value::as_str).ok_or_else(|| ApiError::invalid_param("tool_choice", "tool_choice of type 'tool' needs a 'name'"))?;
            json!({"type": "function", "function": {"name": name}})
        }
        _ => return Err(ApiError::invalid_param("tool_choice", "tool_choice type must be 'auto', 'any', 'tool' or 'none'")),
    };
    Ok((c, parallel))
}

/// The chat request a Messages request stands for (`max_tokens` is required unless only
/// counting tokens).
fn to_chat(req: MessagesRequest, counting: bool) -> Result<ChatRequest, ApiError> {
    if req.max_tokens.is_none() && !counting {
        return Err(ApiError::invalid_param("max_tokens", "max_tokens: field required"));
    }
    if req.messages.is_empty() {
        return Err(ApiError::invalid_param("messages", "messages: at least one message is required"));
    }
    let messages = to_chat_messages(req.system.as_ref(), &req.messages)?;
    let tools = req.tools.as_deref().filter(|t| !t.is_empty()).map(to_chat_tools).transpose()?;
    let (tool_choice, parallel) = match (&req.tool_choice, &tools) {
        (Some(c), _) => {
            let (c, p) = to_chat_choice(c)?;
            (Some(c), Some(p))
        }
        _ => (None, None),
    };
    let mut kwargs = serde_json::Map::new();
    let thinking = match req.thinking.as_ref().and_then(|t| t.get("type")).and_then(Value::as_str) {
        None => None,
        Some("enabled" | "adaptive") => Some(true),
        Some("disabled") => Some(false),
        Some(other) => return Err(ApiError::invalid_param("thinking", format!("thinking type '{other}' is not supported (enabled, adaptive, disabled)"))),
    };
    if let Some(on) = thinking {
        kwargs.insert("enable_thinking".into(), json!(on));
    }
    let response_format = match req.output_config.as_ref().and_then(|o| o.get("format")).filter(|f| !f.is_null()) {
        None => None,
        Some(f) if f.get("type").and_then(Value::as_str) == Some("json_schema") => {
            let schema = f.get("schema").cloned().ok_or_else(|| ApiError::invalid_param("output_config.format.schema", "output_config.format needs a 'schema'"))?;
            Some(json!({"type": "json_schema", "json_schema": {"schema": schema}}))
        }
        Some(_) => return Err(ApiError::invalid_param("output_config.format.type", "output_config.format type must be 'json_schema'")),
    };
    let sampling = Sampling {
        temperature: req.temperature,
        top_p: req.top_p,
        top_k: req.top_k,
        stop: req.stop_sequences.map(Stop::Many),
        max_tokens: req.max_tokens,
        stream: req.stream,
        ..Sampling::default()
    };
    Ok(ChatRequest {
        model: req.model,
        messages,
        sampling,
        tools,
        tool_choice,
        parallel_tool_calls: parallel,
        response_format,
        chat_template_kwargs: (!kwargs.is_empty()).then_some(kwargs),
    })
}

/// `stop_reason` and `stop_sequence`.
fn stop_reason(llm: &Llm, s: &ChoiceState, g: &Generation, stops: &[String]) -> (&'static str, Option<String>) {
    match g.finish {
        FinishReason::MaxTokens | FinishReason::ContextFull => ("max_tokens", None),
        _ if !s.calls.is_empty() => ("tool_use", None),
        _ => match matched_stop(llm, g, stops) {
            Some(seq) => ("stop_sequence", Some(seq)),
            None => ("end_turn", None),
        },
    }
}

fn usage(g: &Generation) -> Value {
    let reused = g.stats.reused_prompt_tokens.min(g.stats.prompt_tokens);
    json!({
        "input_tokens": g.stats.prompt_tokens - reused,
        "cache_read_input_tokens": reused,
        "cache_creation_input_tokens": 0,
        "output_tokens": g.tokens.len()
    })
}

/// A call's arguments as the `input` object (`{}` when cut short).
fn input(args: &str) -> Value {
    serde_json::from_str::<Value>(args).ok().filter(Value::is_object).unwrap_or_else(|| json!({}))
}

/// The whole answer's content blocks.
fn content(s: &ChoiceState) -> Vec<Value> {
    let mut out = Vec::new();
    if !s.reasoning.is_empty() {
        out.push(json!({"type": "thinking", "thinking": s.reasoning, "signature": ""}));
    }
    let text = if s.calls.is_empty() { s.content.as_str() } else { s.content.trim_end() };
    if !text.trim().is_empty() || (s.calls.is_empty() && out.is_empty()) {
        out.push(json!({"type": "text", "text": text}));
    }
    for (id, name, args) in &s.calls {
        out.push(json!({"type": "tool_use", "id": id, "name": name, "input": input(args)}));
    }
    out
}

/// Parse a Messages request, find its model and render its prompt.
async fn prepare(st: &Arc<AppState>, headers: &HeaderMap, body: Result<Bytes, BytesRejection>, counting: bool) -> Result<(Arc<Llm>, crate::turn::Prepared, Vec<String>), ApiError> {
    let req: MessagesRequest = parse_body(st, headers, body)?;
    let stops = req.stop_sequences.clone().unwrap_or_default();
    let chat = to_chat(req, counting)?;
    let llm = st.llm(chat.model.as_deref()).await?;
    let (st2, l2) = (st.clone(), llm.clone());
    let p = blocking(move || prepare_chat(&st2, &l2, chat)).await?;
    Ok((llm, p, stops))
}

pub(crate) async fn count_tokens(State(st): State<Arc<AppState>>, headers: HeaderMap, body: Result<Bytes, BytesRejection>) -> Response {
    match prepare(&st, &headers, body, true).await {
        Ok((_, p, _)) => axum::Json(json!({"input_tokens": p.prompts.first().map_or(0, Vec::len)})).into_response(),
        Err(e) => e.respond(true),
    }
}

pub(crate) async fn messages(State(st): State<Arc<AppState>>, headers: HeaderMap, body: Result<Bytes, BytesRejection>) -> Response {
    match answer(st, headers, body).await {
        Ok(r) => r,
        Err(e) => e.respond(true),
    }
}

async fn answer(st: Arc<AppState>, headers: HeaderMap, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let (llm, p, stops) = prepare(&st, &headers, body, false).await?;
    let stream = p.stream;
    let turn = Turn::start(&st, llm.clone(), p)?;
    let id = new_id("msg_");
    if stream {
        let start = json!({"type": "message_start", "message": {
            "id": id, "type": "message", "role": "assistant", "model": llm.id, "content": [],
            "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": turn.prompt_tokens, "output_tokens": 0}
        }});
        let first = vec![named_event("message_start", &start), named_event("ping", &json!({"type": "ping"}))];
        let mut blocks = Blocks::default();
        return Ok(turn.stream(first, move |step, s| blocks.emit(step, s, &llm, &stops)));
    }
    let (s, g) = turn.finish().await?;
    let (reason, seq) = stop_reason(&llm, &s, &g, &stops);
    Ok(axum::Json(json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": llm.id,
        "content": content(&s),
        "stop_reason": reason,
        "stop_sequence": seq,
        "usage": usage(&g)
    }))
    .into_response())
}

#[derive(Clone, Copy, PartialEq)]
enum Open {
    Text,
    Thinking,
    Tool,
}

/// The streamed content blocks: the one open, the next index, and whitespace held back
/// before a text block is opened (none is opened for whitespace alone).
#[derive(Default)]
struct Blocks {
    open: Option<Open>,
    next: usize,
    held: String,
}

impl Blocks {
    fn close(&mut self, out: &mut Vec<Bytes>) {
        if self.open.take().is_some() {
            out.push(named_event("content_block_stop", &json!({"type": "content_block_stop", "index": self.next - 1})));
        }
    }
    fn start(&mut self, kind: Open, block: Value, out: &mut Vec<Bytes>) {
        self.close(out);
        out.push(named_event("content_block_start", &json!({"type": "content_block_start", "index": self.next, "content_block": block})));
        self.open = Some(kind);
        self.next += 1;
    }
    fn delta(&self, delta: Value) -> Bytes {
        named_event("content_block_delta", &json!({"type": "content_block_delta", "index": self.next - 1, "delta": delta}))
    }

    fn emit(&mut self, step: &Step, s: &ChoiceState, llm: &Llm, stops: &[String]) -> Vec<Bytes> {
        let mut out = Vec::new();
        let pieces = match step {
            Step::Pieces(p) | Step::Done(p, _) => p.as_slice(),
            Step::Failed(e) => return vec![named_event("error", &e.anthropic_body())],
        };
        for p in pieces {
            match p {
                Piece::Content(c) if self.open == Some(Open::Text) => out.push(self.delta(json!({"type": "text_delta", "text": c}))),
                Piece::Content(c) => {
                    self.held.push_str(c);
                    if !self.held.trim().is_empty() {
                        self.start(Open::Text, json!({"type": "text", "text": ""}), &mut out);
                        let text = std::mem::take(&mut self.held);
                        out.push(self.delta(json!({"type": "text_delta", "text": text})));
                    }
                }
                Piece::Reasoning(r) => {
                    if self.open != Some(Open::Thinking) {
                        self.start(Open::Thinking, json!({"type": "thinking", "thinking": "", "signature": ""}), &mut out);
                    }
                    out.push(self.delta(json!({"type": "thinking_delta", "thinking": r})));
                }
                Piece::CallStart { index, name } => {
                    self.held.clear();
                    let id = s.call_ids.get(*index).cloned().unwrap_or_default();
                    self.start(Open::Tool, json!({"type": "tool_use", "id": id, "name": name, "input": {}}), &mut out);
                }
                Piece::CallArgs { text, .. } => out.push(self.delta(json!({"type": "input_json_delta", "partial_json": text}))),
            }
        }
        if let Step::Done(_, g) = step {
            if self.next == 0 && s.calls.is_empty() {
                // An empty answer still has its one (empty) text block.
                self.start(Open::Text, json!({"type": "text", "text": ""}), &mut out);
            }
            self.close(&mut out);
            let (reason, seq) = stop_reason(llm, s, g, stops);
            out.push(named_event("message_delta", &json!({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": seq}, "usage": usage(g)})));
            out.push(named_event("message_stop", &json!({"type": "message_stop"})));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(v: Value) -> MessagesRequest {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn tool_use_and_results_become_chat_tool_calls_and_messages() {
        let r = req(json!({
            "max_tokens": 10,
            "system": [{"type": "text", "text": "Be brief."}],
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": ""}, {"type": "text", "text": "Checking."}, {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "21 C"}]}, {"type": "text", "text": "Thanks"}]}
            ],
            "tools": [{"name": "get_weather", "description": "d", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "stop_sequences": ["END"],
            "thinking": {"type": "disabled"},
            "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}
        }));
        let c = to_chat(r, false).unwrap();
        let roles: Vec<&str> = c.messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
        assert_eq!(c.messages[2].tool_calls.as_ref().unwrap()[0], json!({"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}));
        assert_eq!(c.messages[2].content, Some(json!("Checking.")));
        assert_eq!((c.messages[3].tool_call_id.as_deref(), &c.messages[3].content), (Some("toolu_1"), &Some(json!("21 C"))));
        assert_eq!(c.tools.unwrap()[0], json!({"type": "function", "function": {"name": "get_weather", "description": "d", "parameters": {"type": "object"}}}));
        assert_eq!((c.tool_choice, c.parallel_tool_calls), (Some(json!("required")), Some(false)));
        assert_eq!(c.chat_template_kwargs.unwrap()["enable_thinking"], json!(false));
        assert!(matches!(c.sampling.stop, Some(Stop::Many(ref v)) if v == &["END"]));
        assert_eq!(c.response_format, Some(json!({"type": "json_schema", "json_schema": {"schema": {"type": "object"}}})));
    }

    #[test]
    fn bad_requests_name_the_problem() {
        let e = to_chat(req(json!({"messages": [{"role": "user", "content": "hi"}]})), false).err().unwrap();
        assert!(e.message.contains("max_tokens"), "{e}");
        assert!(to_chat(req(json!({"messages": [{"role": "user", "content": "hi"}]})), true).is_ok(), "count_tokens needs no max_tokens");
        let e = to_chat(req(json!({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]})), false).err().unwrap();
        assert!(e.message.contains("'image'") && e.param.as_deref() == Some("messages[0].content[0]"), "{e}");
        let e = to_chat(req(json!({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "web_search_20250305", "name": "web_search"}]})), false).err().unwrap();
        assert!(e.message.contains("web_search_20250305"), "{e}");
        let body = ApiError::unauthorized().anthropic_body();
        assert_eq!((body["type"].as_str(), body["error"]["type"].as_str()), (Some("error"), Some("authentication_error")));
    }
}
