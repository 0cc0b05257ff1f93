//! LoRA adapters as llama-server serves them: `GET /lora-adapters` lists a model's adapters
//! with their global scales, `POST /lora-adapters` sets those scales, and a request's `lora`
//! field (`[{"id": 0, "scale": 0.5}]`) picks adapters and scales for itself. As in
//! llama-server, an adapter a list leaves out gets scale 0, and a request without `lora` (or
//! with an empty list) gets the global scales.

use crate::error::ApiError;
use crate::{parse_body, AppState, Llm};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use sapient_generate::LoraUse;
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};

/// A model's adapters (loaded before it was served) and their global scales.
pub(crate) struct Adapters {
    paths: Vec<String>,
    scales: Mutex<Vec<f32>>,
}

impl Adapters {
    /// The adapters `engine`'s model has loaded, at scale 1.
    pub(crate) fn of(engine: &sapient_generate::Engine) -> Self {
        let paths: Vec<String> = engine.model().loras().unwrap_or_default().iter().map(|l| l.path.display().to_string()).collect();
        Self { scales: Mutex::new(vec![1.0; paths.len()]), paths }
    }

    fn scales(&self) -> Vec<f32> {
        self.scales.lock().map(|s| s.clone()).unwrap_or_default()
    }

    pub(crate) fn set_scales(&self, scales: &[f32]) {
        if let Ok(mut s) = self.scales.lock() {
            for (d, v) in s.iter_mut().zip(scales) {
                *d = *v;
            }
        }
    }

    /// The adapters with a global scale other than 0 (what a request without `lora` gets).
    pub(crate) fn global(&self) -> Vec<LoraUse> {
        self.scales().iter().enumerate().filter(|(_, s)| **s != 0.0).map(|(id, &scale)| LoraUse { id, scale }).collect()
    }

    /// A `lora` list (`[{"id", "scale"}]`) as scales for every adapter (0 where it has none).
    fn parse(&self, v: &Value, field: &str) -> Result<Vec<f32>, ApiError> {
        let bad = |m: String| ApiError::invalid_param(field, m);
        let list = v.as_array().ok_or_else(|| bad(format!("{field} must be an array of objects with 'id' and 'scale' fields")))?;
        let mut scales = vec![0.0; self.paths.len()];
        for e in list {
            let id = e.get("id").and_then(Value::as_u64).ok_or_else(|| bad(format!("each {field} entry needs an integer 'id'")))?;
            let scale = match e.get("scale") {
                None => 0.0,
                Some(s) => s.as_f64().ok_or_else(|| bad(format!("{field} scale must be a number")))? as f32,
            };
            if !scale.is_finite() || scale.abs() > 100.0 {
                return Err(bad(format!("{field} scale must be a number between -100 and 100, got {scale}")));
            }
            let slot = scales.get_mut(id as usize).ok_or_else(|| bad(format!("no LoRA adapter {id}: this model has {} (GET /lora-adapters lists them)", self.paths.len())))?;
            *slot = scale;
        }
        Ok(scales)
    }

    /// A request's `lora` field as the adapters it applies (none or an empty list: the
    /// global scales).
    pub(crate) fn request(&self, v: Option<&Value>) -> Result<Vec<LoraUse>, ApiError> {
        match v {
            None | Some(Value::Null) => Ok(self.global()),
            Some(Value::Array(a)) if a.is_empty() => Ok(self.global()),
            Some(v) => Ok(self.parse(v, "lora")?.into_iter().enumerate().filter(|(_, s)| *s != 0.0).map(|(id, scale)| LoraUse { id, scale }).collect()),
        }
    }
}

/// The `model` of `?model=NAME` (none: the first language model).
fn model_of(uri: &axum::http::Uri) -> Option<String> {
    uri.query().unwrap_or_default().split('&').find_map(|kv| kv.strip_prefix("model=")).map(str::to_string)
}

/// `GET /lora-adapters[?model=NAME]`: `[{"id", "path", "scale", "task_name", "prompt_prefix"}]`.
pub(crate) async fn list(State(st): State<Arc<AppState>>, uri: axum::http::Uri) -> Result<Json<Value>, ApiError> {
    let llm = st.llm(model_of(&uri).as_deref()).await?;
    let a = &llm.lora;
    let list: Vec<Value> = a.paths.iter().zip(a.scales()).enumerate().map(|(id, (path, scale))| json!({"id": id, "path": path, "scale": scale, "task_name": "", "prompt_prefix": ""})).collect();
    Ok(Json(Value::Array(list)))
}

/// `POST /lora-adapters[?model=NAME]` with `[{"id", "scale"}]`: the global scales (0 for
/// adapters left out); answers `{"success": true}`.
pub(crate) async fn set(State(st): State<Arc<AppState>>, uri: axum::http::Uri, headers: HeaderMap, body: Result<Bytes, BytesRejection>) -> Result<Json<Value>, ApiError> {
    let v: Value = parse_body(&st, &headers, body)?;
    let llm: Arc<Llm> = st.llm(model_of(&uri).as_deref()).await?;
    let scales = llm.lora.parse(&v, "body")?;
    llm.lora.set_scales(&scales);
    Ok(Json(json!({"success": true})))
}
