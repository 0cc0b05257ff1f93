//! `POST /tokenize`, `POST /detokenize` and `POST /apply-template`, with llama-server's
//! request and response shapes; each takes an optional `model` (the first language model
//! when it names none).

use crate::chat::{blocking, render_chat, ChatRequest};
use crate::error::ApiError;
use crate::{parse_body, AppState};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

#[derive(Deserialize)]
struct TokenizeRequest {
    model: Option<String>,
    content: String,
    /// Prepend BOS when the model asks for it.
    #[serde(default)]
    add_special: bool,
    /// Special tokens written in the text (`<|im_start|>`) become their ids; always on.
    parse_special: Option<bool>,
    /// Each token with its text.
    #[serde(default)]
    with_pieces: bool,
}

#[derive(Deserialize)]
struct DetokenizeRequest {
    model: Option<String>,
    tokens: Vec<u32>,
}

pub(crate) async fn tokenize(State(st): State<Arc<AppState>>, headers: HeaderMap, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let req: TokenizeRequest = parse_body(&st, &headers, body)?;
    if req.parse_special == Some(false) {
        return Err(ApiError::invalid_param("parse_special", "parse_special: false is not supported (special tokens written in the text always become their ids)"));
    }
    let llm = st.llm(req.model.as_deref()).await?;
    let tokens = blocking(move || {
        let tok = llm.engine.model().tokenizer();
        let ids = tok.encode(&req.content, req.add_special).map_err(|e| ApiError::bad_request(e.to_string()))?;
        if !req.with_pieces {
            return Ok(json!(ids));
        }
        let bytes = llm.token_bytes.get_or_init(|| tok.token_bytes());
        // A piece that is not UTF-8 on its own is given as its bytes, as llama-server does.
        let piece = |id: u32| {
            let b = bytes.get(id as usize).map(Vec::as_slice).unwrap_or_default();
            std::str::from_utf8(b).map_or_else(|_| json!(b), |s| json!(s))
        };
        Ok(Value::Array(ids.iter().map(|&id| json!({"id": id, "piece": piece(id)})).collect()))
    })
    .await?;
    Ok(axum::Json(json!({"tokens": tokens})).into_response())
}

pub(crate) async fn detokenize(State(st): State<Arc<AppState>>, headers: HeaderMap, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let req: DetokenizeRequest = parse_body(&st, &headers, body)?;
    let llm = st.llm(req.model.as_deref()).await?;
    let content = blocking(move || llm.engine.model().tokenizer().decode(&req.tokens, false).map_err(|e| ApiError::invalid_param("tokens", e.to_string()))).await?;
    Ok(axum::Json(json!({"content": content})).into_response())
}

/// The prompt a chat completions request renders to (its messages, tools and
/// `chat_template_kwargs`), with the assistant's turn opened.
pub(crate) async fn apply_template(State(st): State<Arc<AppState>>, headers: HeaderMap, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let req: ChatRequest = parse_body(&st, &headers, body)?;
    let llm = st.llm(req.model.as_deref()).await?;
    let st2 = st.clone();
    let prompt = blocking(move || render_chat(&st2, &llm, &req).map(|(text, ..)| text)).await?;
    Ok(axum::Json(json!({"prompt": prompt})).into_response())
}
