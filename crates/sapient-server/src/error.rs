//! Errors: OpenAI's `{"error": {"message", "type", "param", "code"}}` with an HTTP status.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// An error answered to a client, in OpenAI's shape.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// `invalid_request_error`, `authentication_error`, `not_found_error`, `rate_limit_error`,
    /// `server_error`, ...
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Seconds for `Retry-After` (429, 503).
    pub retry_after: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self { status, message: message.into(), kind, param: None, code: None, retry_after: None }
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }
    /// A 400 about one request field.
    pub fn invalid_param(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self { param: Some(param.into()), ..Self::bad_request(message) }
    }
    pub fn unauthorized() -> Self {
        Self {
            code: Some("invalid_api_key"),
            ..Self::new(StatusCode::UNAUTHORIZED, "invalid_request_error", "Incorrect or missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'")
        }
    }
    pub fn model_not_found(model: &str, available: &[String]) -> Self {
        Self {
            param: Some("model".into()),
            code: Some("model_not_found"),
            ..Self::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                format!("The model '{model}' does not exist here; this server has: {}", available.join(", ")),
            )
        }
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "invalid_request_error", message)
    }
    pub fn too_large(limit: usize) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "invalid_request_error", format!("The request body is larger than this server's limit of {limit} bytes"))
    }
    pub fn overloaded(retry_after: u64) -> Self {
        Self {
            code: Some("rate_limit_exceeded"),
            retry_after: Some(retry_after),
            ..Self::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", "The server's request queue is full; retry later")
        }
    }
    pub fn loading() -> Self {
        Self { retry_after: Some(1), ..Self::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", "The models are still loading") }
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }
    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}
        })
    }
}

impl ApiError {
    /// Anthropic's name for this error's kind (from its status).
    fn anthropic_type(&self) -> &'static str {
        match self.status.as_u16() {
            400 | 405 | 422 => "invalid_request_error",
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 | 529 => "overloaded_error",
            _ => "api_error",
        }
    }

    /// The JSON body in Anthropic's shape: `{"type": "error", "error": {"type", "message"}}`.
    pub fn anthropic_body(&self) -> serde_json::Value {
        serde_json::json!({"type": "error", "error": {"type": self.anthropic_type(), "message": self.message}})
    }

    /// The response, in Anthropic's shape with `anthropic` (the `/v1/messages` routes), else
    /// OpenAI's.
    pub(crate) fn respond(self, anthropic: bool) -> Response {
        if !anthropic {
            return self.into_response();
        }
        let mut r = (self.status, axum::Json(self.anthropic_body())).into_response();
        self.set_retry_after(&mut r);
        r
    }

    fn set_retry_after(&self, r: &mut Response) {
        if let Some(s) = self.retry_after {
            if let Ok(v) = HeaderValue::from_str(&s.to_string()) {
                r.headers_mut().insert(axum::http::header::RETRY_AFTER, v);
            }
        }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status.as_u16(), self.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        self.set_retry_after(&mut r);
        r
    }
}

/// What a generation error means for the client.
pub(crate) fn from_generate(e: sapient_generate::Error) -> ApiError {
    use sapient_generate::Error as E;
    match &e {
        E::PromptTooLong { .. } | E::TooLargeForCache { .. } => ApiError::bad_request(e.to_string()).with_code("context_length_exceeded"),
        E::EmptyPrompt | E::Sample(_) | E::Tokenizer(_) | E::InvalidOptions(_) | E::NoChatTemplate(_) | E::Unsupported(_) => {
            ApiError::bad_request(e.to_string())
        }
        _ => ApiError::internal(e.to_string()),
    }
}

/// Errors starting or running the server.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("cannot bind {addr}: {source}")]
    Bind { addr: String, source: std::io::Error },
    #[error("server I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("the models were already set")]
    AlreadyReady,
    #[error("no model named '{0}' is loaded")]
    UnknownModel(String),
    #[error("two models are named '{0}'")]
    DuplicateModel(String),
    #[error(transparent)]
    Generate(#[from] sapient_generate::Error),
}
