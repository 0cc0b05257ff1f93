//! Saved KV slots, as llama-server's `POST /slots/{id}?action=save|restore|erase`: a request
//! with `"id_slot": N` runs in conversation slot N of its model (an engine session, whose
//! cache the next request of the slot reuses); `save` writes the slot's tokens and KV cache
//! to a file under [`ServerOptions::slot_save_path`](crate::ServerOptions), `restore` reads
//! one back into a slot (of this or a fresh server with the same model file and KV layout),
//! `erase` forgets a slot.
//!
//! The file: `SAPSLOT\0`, a version (u32), the SHA-256 of the model's GGUF header (its
//! metadata and tensor shapes: the model's identity), the KV layout (layers, width, block
//! size, storage type), the token count (u32), the KV bytes' length (u64), the tokens (u32
//! each), the KV bytes, and the SHA-256 of everything before it; integers little-endian.

use crate::error::ApiError;
use crate::{parse_body, AppState, Llm};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use sapient_generate::{GenerationConfig, KvDtype, KvLayout, RequestHandle, SavedSession, Session};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Slot ids go from 0 to this.
pub(crate) const MAX_SLOT: u32 = 1023;
/// The largest slot file read.
const MAX_FILE: u64 = 1 << 30;
const MAGIC: &[u8; 8] = b"SAPSLOT\0";
const VERSION: u32 = 1;
/// Magic, version, model hash, layout (3 x u32 + u32 storage), tokens (u32), KV length (u64).
const HEADER: usize = 8 + 4 + 32 + 16 + 4 + 8;

/// A model's conversation slots.
#[derive(Default)]
pub(crate) struct Slots(Mutex<HashMap<u32, Arc<Session>>>);

impl Slots {
    fn get(&self, llm: &Llm, id: u32, create: bool) -> Result<Option<Arc<Session>>, ApiError> {
        if id > MAX_SLOT {
            return Err(ApiError::invalid_param("id_slot", format!("slot ids go from 0 to {MAX_SLOT}")));
        }
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = m.get(&id) {
            return Ok(Some(s.clone()));
        }
        if !create {
            return Ok(None);
        }
        let s = Arc::new(llm.engine.session().map_err(crate::error::from_generate)?);
        m.insert(id, s.clone());
        Ok(Some(s))
    }
}

/// Submit a request, in slot `slot` of its model when it names one.
pub(crate) fn submit(llm: &Llm, slot: Option<u32>, prompt: Vec<u32>, cfg: GenerationConfig) -> Result<RequestHandle, ApiError> {
    let r = match slot {
        None => llm.engine.submit(prompt, cfg),
        Some(id) => match llm.slots.get(llm, id, true)? {
            Some(s) => llm.engine.submit_in(&s, prompt, cfg),
            None => llm.engine.submit(prompt, cfg),
        },
    };
    r.map_err(crate::error::from_generate)
}

#[derive(serde::Deserialize)]
struct SlotRequest {
    #[serde(default)]
    filename: Option<String>,
    #[serde(default)]
    model: Option<String>,
}

fn status(status: StatusCode, kind: &'static str, message: String) -> ApiError {
    ApiError { status, kind, ..ApiError::bad_request(message) }
}

/// A file name in the slot directory: no path, no `..`, no hidden file.
fn checked_name(name: &str) -> Result<&str, ApiError> {
    let bad = name.is_empty()
        || name.len() > 255
        || name.starts_with('.')
        || name.contains("..")
        || name.chars().any(|c| c == '/' || c == '\\' || c == ':' || c.is_control());
    if bad {
        return Err(ApiError::invalid_param("filename", format!("invalid file name {name:?}: a plain name, without '/', '\\', ':', '..' or a leading '.'")));
    }
    Ok(name)
}

/// The SHA-256 of a GGUF file's header (metadata and tensor infos): which model a slot
/// file belongs to.
fn model_identity(llm: &Llm) -> Result<[u8; 32], ApiError> {
    let path = &llm.engine.model().info().path;
    let g = sapient_tensor::GgufFile::open(path).map_err(|e| ApiError::bad_request(format!("saved slots need a GGUF model: {e}")))?;
    let head = std::fs::File::open(path).and_then(|f| {
        use std::io::Read;
        let mut buf = Vec::new();
        f.take(g.data_offset()).read_to_end(&mut buf)?;
        Ok(buf)
    });
    let head = head.map_err(|e| ApiError::internal(format!("reading {}: {e}", path.display())))?;
    Ok(Sha256::digest(&head).into())
}

fn dtype_code(d: KvDtype) -> u32 {
    match d {
        KvDtype::F16 => 0,
        KvDtype::Q8_0 => 1,
    }
}

pub(crate) fn encode(model: &[u8; 32], s: &SavedSession) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + 4 * s.tokens.len() + s.kv.len() + 32);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(model);
    for v in [s.layout.layers as u32, s.layout.width as u32, s.layout.block_size as u32, dtype_code(s.layout.dtype), s.tokens.len() as u32] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&(s.kv.len() as u64).to_le_bytes());
    for t in &s.tokens {
        out.extend_from_slice(&t.to_le_bytes());
    }
    out.extend_from_slice(&s.kv);
    let sum: [u8; 32] = Sha256::digest(&out).into();
    out.extend_from_slice(&sum);
    out
}

/// Read a slot file back, checking everything but what the engine checks (layout, sizes
/// against it, token ids).
pub(crate) fn decode(model: &[u8; 32], data: &[u8]) -> Result<SavedSession, String> {
    if data.len() < HEADER + 32 || &data[..8] != MAGIC {
        return Err("not a saved slot file".into());
    }
    let (body, sum) = data.split_at(data.len() - 32);
    if Sha256::digest(body).as_slice() != sum {
        return Err("the file is damaged or truncated (its checksum does not match)".into());
    }
    let u32_at = |i: usize| u32::from_le_bytes([body[i], body[i + 1], body[i + 2], body[i + 3]]);
    let version = u32_at(8);
    if version != VERSION {
        return Err(format!("slot file version {version}; this server reads version {VERSION}"));
    }
    if &body[12..44] != model {
        return Err("the slot was saved from another model".into());
    }
    let dtype = match u32_at(56) {
        0 => KvDtype::F16,
        1 => KvDtype::Q8_0,
        d => return Err(format!("unknown KV storage type {d}")),
    };
    let layout = KvLayout { layers: u32_at(44) as usize, width: u32_at(48) as usize, block_size: u32_at(52) as usize, dtype };
    let n = u32_at(60) as usize;
    let mut kv_len = [0u8; 8];
    kv_len.copy_from_slice(&body[64..72]);
    let kv_len = u64::from_le_bytes(kv_len);
    let want = (HEADER as u64).saturating_add(4 * n as u64).saturating_add(kv_len);
    if want != body.len() as u64 {
        return Err(format!("the header says {n} tokens and {kv_len} KV bytes, the file holds {} bytes", body.len()));
    }
    let tokens = body[HEADER..HEADER + 4 * n].chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    Ok(SavedSession { tokens, layout, kv: body[HEADER + 4 * n..].to_vec() })
}

/// `POST /slots/{id}?action=save|restore|erase` with `{"filename": NAME}` (and an optional
/// `model`).
pub(crate) async fn slot_action(
    State(st): State<Arc<AppState>>,
    UrlPath(id): UrlPath<u32>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let Some(dir) = st.opts.slot_save_path.clone() else {
        return Err(status(StatusCode::NOT_IMPLEMENTED, "not_supported_error", "saving slots is off: start the server with --slot-save-path DIR".into()));
    };
    let action = uri.query().unwrap_or_default().split('&').find_map(|kv| kv.strip_prefix("action=")).unwrap_or_default().to_string();
    let req: SlotRequest = parse_body(&st, &headers, body)?;
    let llm = st.llm(req.model.as_deref()).await?;
    let t0 = Instant::now();
    let ms = || t0.elapsed().as_secs_f64() * 1e3;
    match action.as_str() {
        "erase" => {
            let gone = llm.slots.0.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
            let n = gone.map(|s| s.cached_tokens()).unwrap_or(0);
            Ok(axum::Json(serde_json::json!({"id_slot": id, "n_erased": n})).into_response())
        }
        "save" | "restore" => {
            let name = checked_name(req.filename.as_deref().unwrap_or_default())?.to_string();
            let path = dir.join(&name);
            let save = action == "save";
            let l2 = llm.clone();
            let r = tokio::task::spawn_blocking(move || if save { save_slot(&l2, id, &path) } else { restore_slot(&l2, id, &path) })
                .await
                .map_err(|e| ApiError::internal(format!("the slot task failed: {e}")))??;
            let (n_tokens, n_bytes) = r;
            let v = if save {
                serde_json::json!({"id_slot": id, "filename": name, "n_saved": n_tokens, "n_written": n_bytes, "timings": {"save_ms": ms()}})
            } else {
                serde_json::json!({"id_slot": id, "filename": name, "n_restored": n_tokens, "n_read": n_bytes, "timings": {"restore_ms": ms()}})
            };
            Ok(axum::Json(v).into_response())
        }
        a => Err(ApiError::invalid_param("action", format!("unknown action '{a}' (save, restore or erase)"))),
    }
}

fn save_slot(llm: &Llm, id: u32, path: &std::path::Path) -> Result<(usize, usize), ApiError> {
    let session = llm.slots.get(llm, id, false)?.ok_or_else(|| ApiError::bad_request(format!("slot {id} holds nothing to save")))?;
    let saved = llm.engine.save_session(&session).map_err(|e| ApiError::bad_request(format!("slot {id}: {e}")))?;
    let bytes = encode(&model_identity(llm)?, &saved);
    // Written whole under a temporary name, then renamed: a reader never sees half a file.
    let tmp = path.with_extension("partial");
    std::fs::write(&tmp, &bytes).and_then(|_| std::fs::rename(&tmp, path)).map_err(|e| ApiError::internal(format!("writing the slot file: {e}")))?;
    Ok((saved.tokens.len(), bytes.len()))
}

fn restore_slot(llm: &Llm, id: u32, path: &std::path::Path) -> Result<(usize, usize), ApiError> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let meta = std::fs::metadata(path).map_err(|_| ApiError::not_found(format!("no slot file named '{name}'")))?;
    if meta.len() > MAX_FILE {
        return Err(ApiError::bad_request(format!("'{name}' is {} bytes, more than a slot file may be ({MAX_FILE})", meta.len())));
    }
    let data = std::fs::read(path).map_err(|e| ApiError::internal(format!("reading '{name}': {e}")))?;
    let saved = decode(&model_identity(llm)?, &data).map_err(|e| ApiError::bad_request(format!("'{name}': {e}")))?;
    let n = saved.tokens.len();
    let session = llm.slots.get(llm, id, true)?.ok_or_else(|| ApiError::internal("no slot"))?;
    llm.engine.restore_session(&session, saved).map_err(|e| ApiError::bad_request(format!("'{name}' does not fit this model's cache: {e}")))?;
    Ok((n, data.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn saved() -> SavedSession {
        SavedSession { tokens: vec![1, 2, 3], layout: KvLayout { layers: 2, width: 32, block_size: 16, dtype: KvDtype::Q8_0 }, kv: (0..=255).collect() }
    }

    #[test]
    fn a_file_reads_back_and_damage_is_named() {
        let model = [7u8; 32];
        let f = encode(&model, &saved());
        assert_eq!(decode(&model, &f).unwrap(), saved());
        assert!(decode(&[8u8; 32], &f).unwrap_err().contains("another model"));
        assert!(decode(&model, &f[..f.len() - 1]).unwrap_err().contains("checksum"));
        assert!(decode(&model, b"GGUF and more bytes than a header of a slot file, surely enough of them to pass the size check").unwrap_err().contains("not a saved slot"));
        let mut flipped = f.clone();
        flipped[HEADER + 5] ^= 1;
        assert!(decode(&model, &flipped).unwrap_err().contains("checksum"));
        // A header that lies about the lengths, with a checksum that matches it.
        let mut lying = f[..f.len() - 32].to_vec();
        lying[60] = 200;
        let sum: [u8; 32] = Sha256::digest(&lying).into();
        lying.extend_from_slice(&sum);
        assert!(decode(&model, &lying).unwrap_err().contains("the header says 200 tokens"));
    }

    #[test]
    fn names_stay_in_the_directory() {
        for bad in ["", "../x", "a/b", "a\\b", ".hidden", "x..y", "c:x", "a\nb"] {
            assert!(checked_name(bad).is_err(), "{bad:?}");
        }
        assert_eq!(checked_name("conversation-1.bin").unwrap(), "conversation-1.bin");
    }
}
