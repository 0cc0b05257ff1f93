//! `GET /v1/realtime` (WebSocket): OpenAI's Realtime API event protocol over a
//! sapient-voice conversation loop (Whisper, the language model, Kokoro and Silero VAD).
//! Audio is pcm16 at 24 kHz (base64) both ways. Client events: `session.update`,
//! `input_audio_buffer.append` / `commit` / `clear`, `conversation.item.create`,
//! `response.create`, `response.cancel`. Server events: `session.created` / `updated`,
//! `input_audio_buffer.speech_started` / `speech_stopped` / `committed` / `cleared`,
//! `conversation.item.created`, `conversation.item.input_audio_transcription.delta` /
//! `completed`, `conversation.item.truncated`, `response.created`,
//! `response.output_item.added` / `done`, `response.content_part.added` / `done`,
//! `response.audio.delta` / `done`, `response.audio_transcript.delta` / `done`,
//! `response.text.delta` / `done` (text-only sessions), `response.done`, `error`.
//!
//! Each connection runs its loop on a thread of its own (the models are shared); the
//! socket task forwards client events to it and its events to the client. Closing the
//! socket ends the thread and cancels a reply in flight.

use crate::error::ApiError;
use crate::{new_id, AppState, Llm};
use axum::extract::ws::{Message as WsMessage, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::http::Uri;
use axum::response::Response;
use base64::Engine as _;
use futures::{SinkExt, StreamExt};
use sapient_voice::{Event, Playout, ReplyStatus, TurnOptions, VoiceLoop, VoiceModels, VoiceOptions};
use serde_json::{json, Value};
use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::time::Duration;

/// The audio rate of the protocol's pcm16.
const RATE: u32 = 24_000;

impl sapient_voice::LanguageModel for Llm {
    fn engine(&self) -> &sapient_generate::Engine {
        &self.engine
    }
}

/// The `model` parameter of the query string (percent-decoded), as OpenAI's clients send it.
fn model_param(uri: &Uri) -> Option<String> {
    let raw = uri.query()?.split('&').find_map(|kv| kv.strip_prefix("model="))?;
    let b = raw.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (b[i], b.get(i + 1).and_then(|&c| hex(c)), b.get(i + 2).and_then(|&c| hex(c))) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (b'+', _, _) => {
                out.push(b' ');
                i += 1;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    Some(String::from_utf8_lossy(&out).into_owned())
}

pub(crate) async fn upgrade(State(st): State<Arc<AppState>>, uri: Uri, ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>) -> Result<Response, ApiError> {
    let ws = ws.map_err(|e| ApiError::bad_request(format!("/v1/realtime is a WebSocket endpoint: {e}")))?;
    let llm = st.llm(model_param(&uri).as_deref()).await?;
    let m = st.models()?;
    let (_, t) = m.find(&m.transcribers, None, "speech-to-text")?;
    let (_, k) = m.find(&m.tts, None, "text-to-speech")?;
    let vad = m.vad.clone().ok_or_else(|| ApiError::not_found("this server has no voice activity detector (Silero VAD) for /v1/realtime").with_code("model_not_found"))?;
    let model_id = llm.id.clone();
    let models = VoiceModels { transcriber: t.clone(), tts: k.clone(), llm };
    let limits = Limits { max_audio_bytes: st.opts.max_audio_bytes, max_tokens: st.opts.max_tokens_limit };
    Ok(ws.max_message_size(st.opts.max_body_bytes).on_upgrade(move |socket| connection(socket, models, vad, model_id, limits)))
}

#[derive(Clone, Copy)]
struct Limits {
    /// pcm16 bytes of input kept uncommitted (turn detection off).
    max_audio_bytes: usize,
    max_tokens: usize,
}

async fn connection(socket: WebSocket, models: VoiceModels, vad: std::path::PathBuf, model_id: String, limits: Limits) {
    let (mut sink, mut stream) = socket.split();
    let (out_tx, mut out_rx) = tokio::sync::mpsc::unbounded_channel::<Value>();
    let (cmd_tx, cmd_rx) = std_mpsc::channel::<Value>();
    let agent_out = out_tx.clone();
    let spawned = std::thread::Builder::new().name("sapient-realtime".into()).spawn(move || {
        let mut a = match Agent::new(models, &vad, model_id, limits, agent_out.clone()) {
            Ok(a) => a,
            Err(e) => {
                let _ = agent_out.send(error_event("server_error", None, &e, None));
                return;
            }
        };
        a.run(&cmd_rx);
    });
    if let Err(e) = spawned {
        let _ = sink.send(WsMessage::Text(error_event("server_error", None, &format!("cannot start the session: {e}"), None).to_string().into())).await;
        return;
    }
    loop {
        tokio::select! {
            msg = stream.next() => match msg {
                Some(Ok(WsMessage::Text(t))) => match serde_json::from_str::<Value>(t.as_str()) {
                    Ok(v) if v.is_object() => { if cmd_tx.send(v).is_err() { break; } }
                    Ok(_) | Err(_) => { let _ = out_tx.send(error_event("invalid_request_error", Some("invalid_json"), "a client event must be a JSON object", None)); }
                },
                Some(Ok(WsMessage::Binary(_))) => { let _ = out_tx.send(error_event("invalid_request_error", Some("invalid_event"), "client events are JSON text messages", None)); }
                Some(Ok(WsMessage::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            },
            ev = out_rx.recv() => match ev {
                Some(v) => if sink.send(WsMessage::Text(v.to_string().into())).await.is_err() { break },
                None => break,
            },
        }
    }
    // dropping cmd_tx ends the agent thread, which cancels its reply
}

fn error_event(kind: &str, code: Option<&str>, message: &str, client_event: Option<&str>) -> Value {
    json!({"type": "error", "event_id": new_id("event_"), "error": {"type": kind, "code": code, "message": message, "param": null, "event_id": client_event}})
}

/// The conversation behind one socket.
struct Agent {
    lp: VoiceLoop,
    out: tokio::sync::mpsc::UnboundedSender<Value>,
    session_id: String,
    model_id: String,
    limits: Limits,
    /// Text only (`modalities: ["text"]`).
    text_only: bool,
    /// The user item being spoken (from speech start to its transcript).
    user_item: Option<String>,
    last_partial: String,
    /// The reply in flight: (loop id, response id, item id).
    response: Option<(u64, String, String)>,
    /// pcm16 bytes appended since the last commit or turn.
    uncommitted: usize,
}

impl Agent {
    fn new(models: VoiceModels, vad: &std::path::Path, model_id: String, limits: Limits, out: tokio::sync::mpsc::UnboundedSender<Value>) -> Result<Self, String> {
        let vad = sapient_voice::load_vad(vad).map_err(|e| e.to_string())?;
        let opts = VoiceOptions { input_rate: RATE, playout: Playout::Clock, max_reply_tokens: limits.max_tokens.min(4096), ..VoiceOptions::default() };
        let lp = VoiceLoop::new(models, vad, opts).map_err(|e| e.to_string())?;
        let a = Self { lp, out, session_id: new_id("sess_"), model_id, limits, text_only: false, user_item: None, last_partial: String::new(), response: None, uncommitted: 0 };
        a.send(json!({"type": "session.created", "session": a.session()}));
        Ok(a)
    }

    fn run(&mut self, cmds: &std_mpsc::Receiver<Value>) {
        loop {
            match cmds.recv_timeout(Duration::from_millis(20)) {
                Ok(v) => {
                    let id = v.get("event_id").and_then(Value::as_str).map(str::to_string);
                    if let Err(e) = self.handle(&v) {
                        let (kind, code) = if e.1 { ("server_error", None) } else { ("invalid_request_error", Some(e.2)) };
                        self.send(error_event(kind, code, &e.0, id.as_deref()));
                    }
                }
                Err(std_mpsc::RecvTimeoutError::Timeout) => {}
                Err(std_mpsc::RecvTimeoutError::Disconnected) => break,
            }
            for ev in self.lp.drain_events() {
                self.forward(ev);
            }
        }
        self.lp.cancel();
    }

    fn send(&self, mut v: Value) {
        if let Some(o) = v.as_object_mut() {
            o.entry("event_id").or_insert_with(|| Value::String(new_id("event_")));
        }
        let _ = self.out.send(v);
    }

    fn session(&self) -> Value {
        let o = self.lp.options();
        let turn = o.turn.as_ref().map_or(Value::Null, |t| {
            json!({"type": "server_vad", "threshold": t.threshold, "prefix_padding_ms": t.prefix_padding_ms, "silence_duration_ms": t.end_of_turn_ms, "create_response": t.respond, "interrupt_response": t.interrupt})
        });
        let modalities = if self.text_only { json!(["text"]) } else { json!(["text", "audio"]) };
        json!({
            "id": self.session_id, "object": "realtime.session", "model": self.model_id, "modalities": modalities,
            "instructions": o.instructions, "voice": o.voice, "input_audio_format": "pcm16", "output_audio_format": "pcm16",
            "input_audio_transcription": {"model": "whisper"}, "turn_detection": turn, "tools": [], "tool_choice": "none",
            "temperature": o.sampling.temperature, "max_response_output_tokens": o.max_reply_tokens,
        })
    }

    /// One client event. Errors: (message, is the server's fault, code).
    fn handle(&mut self, v: &Value) -> Result<(), (String, bool, &'static str)> {
        let bad = |m: String| (m, false, "invalid_value");
        let kind = v.get("type").and_then(Value::as_str).ok_or_else(|| ("a client event needs a string 'type'".to_string(), false, "missing_type"))?;
        match kind {
            "session.update" => {
                let s = v.get("session").and_then(Value::as_object).ok_or_else(|| bad("session.update needs a 'session' object".into()))?;
                self.update(s).map_err(bad)?;
                self.send(json!({"type": "session.updated", "session": self.session()}));
            }
            "input_audio_buffer.append" => {
                let b64 = v.get("audio").and_then(Value::as_str).ok_or_else(|| bad("input_audio_buffer.append needs 'audio' (base64 pcm16)".into()))?;
                let bytes = base64::engine::general_purpose::STANDARD.decode(b64).map_err(|e| bad(format!("'audio' is not base64: {e}")))?;
                if bytes.len() % 2 != 0 {
                    return Err(bad(format!("'audio' holds {} bytes: pcm16 needs an even number", bytes.len())));
                }
                if self.lp.options().turn.is_none() && self.uncommitted + bytes.len() > self.limits.max_audio_bytes {
                    return Err((format!("more than {} bytes of audio appended without a commit", self.limits.max_audio_bytes), false, "input_audio_buffer_full"));
                }
                self.uncommitted += bytes.len();
                let samples: Vec<f32> = bytes.chunks_exact(2).map(|c| f32::from(i16::from_le_bytes([c[0], c[1]])) / 32768.0).collect();
                self.lp.push_audio(&samples).map_err(|e| (e.to_string(), true, "server_error"))?;
            }
            "input_audio_buffer.commit" => {
                let item = self.user_item.take().unwrap_or_else(|| new_id("item_"));
                let text = self.lp.commit().map_err(|e| (e.to_string(), false, "input_audio_buffer_commit_empty"))?;
                self.uncommitted = 0;
                self.committed(&item);
                self.transcribed(&item, &text);
            }
            "input_audio_buffer.clear" => {
                self.lp.clear_input();
                self.uncommitted = 0;
                self.user_item = None;
                self.send(json!({"type": "input_audio_buffer.cleared"}));
            }
            "conversation.item.create" => {
                let item = v.get("item").ok_or_else(|| bad("conversation.item.create needs an 'item'".into()))?;
                let (role, text) = message_item(item).map_err(bad)?;
                let id = item.get("id").and_then(Value::as_str).map_or_else(|| new_id("item_"), str::to_string);
                self.lp.add_message(sapient_generate::Message::new(role.as_str(), text.as_str()));
                let kind = if role == "assistant" { "text" } else { "input_text" };
                self.send(json!({"type": "conversation.item.created", "previous_item_id": null, "item": {"id": id, "object": "realtime.item", "type": "message", "status": "completed", "role": role, "content": [{"type": kind, "text": text}]}}));
            }
            "response.create" => match self.lp.respond() {
                Ok(_) => {}
                Err(sapient_voice::Error::Busy(_)) => return Err(("the conversation already has a response in progress".into(), false, "conversation_already_has_active_response")),
                Err(e) => return Err((e.to_string(), true, "server_error")),
            },
            "response.cancel" => {
                // a response is in progress until its `response.done` (audio the clock still
                // counts as playing after it is cut by barge-in, not by a cancel)
                if self.response.is_none() || !self.lp.cancel() {
                    return Err(("there is no response in progress to cancel".into(), false, "response_cancel_not_active"));
                }
            }
            other => return Err((format!("unsupported client event type '{other}'"), false, "invalid_event_type")),
        }
        Ok(())
    }

    fn update(&mut self, s: &serde_json::Map<String, Value>) -> Result<(), String> {
        let mut o = self.lp.options().clone();
        let mut text_only = self.text_only;
        for (k, v) in s {
            match k.as_str() {
                "instructions" => o.instructions = v.as_str().ok_or("session.instructions must be a string")?.to_string(),
                "voice" => o.voice = v.as_str().ok_or("session.voice must be a string")?.to_string(),
                "input_audio_format" | "output_audio_format" => {
                    if v.as_str() != Some("pcm16") {
                        return Err(format!("session.{k}: only pcm16 (24 kHz) is supported"));
                    }
                }
                "modalities" => {
                    let m: Vec<&str> = v.as_array().ok_or("session.modalities must be an array")?.iter().filter_map(Value::as_str).collect();
                    if !m.contains(&"text") {
                        return Err("session.modalities must include \"text\"".into());
                    }
                    text_only = !m.contains(&"audio");
                }
                "turn_detection" => o.turn = turn_options(v, o.turn.clone())?,
                "temperature" => {
                    let t = v.as_f64().filter(|t| (0.0..=2.0).contains(t)).ok_or("session.temperature must be a number in 0..=2")?;
                    o.sampling.temperature = t as f32;
                }
                "max_response_output_tokens" => {
                    o.max_reply_tokens = match v {
                        Value::String(s) if s == "inf" => self.limits.max_tokens,
                        _ => v.as_u64().filter(|n| *n >= 1).ok_or("session.max_response_output_tokens must be a positive integer or \"inf\"")? as usize,
                    }
                    .min(self.limits.max_tokens);
                }
                // accepted as given: the server's Whisper transcribes; no tools here
                "input_audio_transcription" | "tools" | "tool_choice" | "model" | "input_audio_noise_reduction" | "speed" | "tracing" | "type" | "id" | "object" => {}
                other => return Err(format!("session.{other} is not supported")),
            }
        }
        if self.lp.options().voice != o.voice {
            self.voice_ok(&o.voice)?;
        }
        o.speak = !text_only;
        self.lp.update(o).map_err(|e| e.to_string())?;
        self.text_only = text_only;
        Ok(())
    }

    fn voice_ok(&self, voice: &str) -> Result<(), String> {
        self.lp.check_voice(voice).map_err(|e| format!("session.voice: {e}"))
    }

    fn committed(&self, item: &str) {
        self.send(json!({"type": "input_audio_buffer.committed", "previous_item_id": null, "item_id": item}));
        self.send(json!({"type": "conversation.item.created", "previous_item_id": null, "item": {"id": item, "object": "realtime.item", "type": "message", "status": "completed", "role": "user", "content": [{"type": "input_audio", "transcript": null}]}}));
    }

    fn transcribed(&self, item: &str, text: &str) {
        self.send(json!({"type": "conversation.item.input_audio_transcription.completed", "item_id": item, "content_index": 0, "transcript": text}));
    }

    /// A loop event as the protocol's server events.
    fn forward(&mut self, ev: Event) {
        match ev {
            Event::SpeechStarted { audio_ms } => {
                let item = new_id("item_");
                self.send(json!({"type": "input_audio_buffer.speech_started", "audio_start_ms": audio_ms, "item_id": item}));
                self.user_item = Some(item);
                self.last_partial.clear();
            }
            Event::SpeechStopped { audio_ms } => {
                let item = self.user_item.clone().unwrap_or_else(|| new_id("item_"));
                self.user_item = Some(item.clone());
                self.send(json!({"type": "input_audio_buffer.speech_stopped", "audio_end_ms": audio_ms, "item_id": item}));
                self.uncommitted = 0;
                self.committed(&item);
            }
            Event::TranscriptPartial { text } => {
                if let Some(item) = &self.user_item {
                    let delta = text.strip_prefix(self.last_partial.as_str()).unwrap_or(&text);
                    self.send(json!({"type": "conversation.item.input_audio_transcription.delta", "item_id": item, "content_index": 0, "delta": delta}));
                    self.last_partial = text.clone();
                }
            }
            Event::Transcript { text, .. } => {
                if let Some(item) = self.user_item.take() {
                    self.transcribed(&item, &text);
                }
            }
            Event::ResponseStarted { response } => {
                let (rid, item) = (new_id("resp_"), new_id("item_"));
                self.send(json!({"type": "response.created", "response": {"id": rid, "object": "realtime.response", "status": "in_progress", "status_details": null, "output": [], "usage": null}}));
                let part = if self.text_only { json!({"type": "text", "text": ""}) } else { json!({"type": "audio", "transcript": ""}) };
                self.send(json!({"type": "response.output_item.added", "response_id": rid, "output_index": 0, "item": {"id": item, "object": "realtime.item", "type": "message", "status": "in_progress", "role": "assistant", "content": []}}));
                self.send(json!({"type": "response.content_part.added", "response_id": rid, "item_id": item, "output_index": 0, "content_index": 0, "part": part}));
                self.response = Some((response, rid, item));
            }
            Event::TextDelta { response, text } => {
                if let Some((_, rid, item)) = self.current(response) {
                    let kind = if self.text_only { "response.text.delta" } else { "response.audio_transcript.delta" };
                    self.send(json!({"type": kind, "response_id": rid, "item_id": item, "output_index": 0, "content_index": 0, "delta": text}));
                }
            }
            Event::Audio { response, samples, .. } => {
                if let Some((_, rid, item)) = self.current(response) {
                    let pcm: Vec<u8> = samples.iter().flat_map(|x| ((x.clamp(-1.0, 1.0) * 32767.0).round() as i16).to_le_bytes()).collect();
                    let delta = base64::engine::general_purpose::STANDARD.encode(pcm);
                    self.send(json!({"type": "response.audio.delta", "response_id": rid, "item_id": item, "output_index": 0, "content_index": 0, "delta": delta}));
                }
            }
            Event::Interrupted { response, played_ms, .. } => {
                if let Some((_, _, item)) = self.current(response) {
                    self.send(json!({"type": "conversation.item.truncated", "item_id": item, "content_index": 0, "audio_end_ms": played_ms}));
                }
            }
            Event::ResponseDone { response, status, text, generated, timings } => {
                let Some((_, rid, item)) = self.current(response) else { return };
                self.response = None;
                let base = json!({"response_id": rid, "item_id": item, "output_index": 0, "content_index": 0});
                let with = |kind: &str, extra: Value| {
                    let mut v = base.clone();
                    if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
                        o.insert("type".into(), Value::String(kind.into()));
                        o.extend(e.clone());
                    }
                    v
                };
                let (status, part) = match status {
                    ReplyStatus::Completed => ("completed", generated.trim().to_string()),
                    _ => ("cancelled", text.clone()),
                };
                let content = if self.text_only {
                    self.send(with("response.text.done", json!({"text": part})));
                    json!({"type": "text", "text": part})
                } else {
                    self.send(with("response.audio.done", json!({})));
                    self.send(with("response.audio_transcript.done", json!({"transcript": part})));
                    json!({"type": "audio", "transcript": part})
                };
                self.send(with("response.content_part.done", json!({"part": content})));
                let out_item = json!({"id": item, "object": "realtime.item", "type": "message", "status": if status == "completed" { "completed" } else { "incomplete" }, "role": "assistant", "content": [content]});
                self.send(json!({"type": "response.output_item.done", "response_id": rid, "output_index": 0, "item": out_item}));
                let usage = json!({"total_tokens": timings.prompt_tokens + timings.generated_tokens, "input_tokens": timings.prompt_tokens, "output_tokens": timings.generated_tokens, "input_token_details": {"cached_tokens": timings.reused_prompt_tokens}});
                let details = if status == "cancelled" { json!({"type": "cancelled", "reason": "turn_detected"}) } else { Value::Null };
                self.send(json!({"type": "response.done", "response": {"id": rid, "object": "realtime.response", "status": status, "status_details": details, "output": [out_item], "usage": usage}}));
            }
            Event::Error { message } => self.send(error_event("server_error", None, &message, None)),
            _ => {}
        }
    }

    fn current(&self, response: u64) -> Option<(u64, String, String)> {
        self.response.clone().filter(|r| r.0 == response)
    }
}

/// `turn_detection`: null turns it off; `server_vad` with its fields.
fn turn_options(v: &Value, current: Option<TurnOptions>) -> Result<Option<TurnOptions>, String> {
    if v.is_null() {
        return Ok(None);
    }
    let o = v.as_object().ok_or("session.turn_detection must be an object or null")?;
    match o.get("type").and_then(Value::as_str) {
        None | Some("server_vad") => {}
        Some(t) => return Err(format!("session.turn_detection.type '{t}' is not supported (server_vad)")),
    }
    let mut t = current.unwrap_or_default();
    let ms = |k: &str| -> Result<Option<u32>, String> {
        match o.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v.as_u64().filter(|n| *n <= 60_000).map(|n| Some(n as u32)).ok_or(format!("session.turn_detection.{k} must be an integer of milliseconds (at most 60000)")),
        }
    };
    if let Some(x) = o.get("threshold").filter(|x| !x.is_null()) {
        t.threshold = x.as_f64().filter(|x| *x > 0.0 && *x < 1.0).ok_or("session.turn_detection.threshold must be in (0, 1)")? as f32;
    }
    if let Some(x) = ms("prefix_padding_ms")? {
        t.prefix_padding_ms = x;
    }
    if let Some(x) = ms("silence_duration_ms")? {
        t.end_of_turn_ms = x;
    }
    if let Some(x) = o.get("create_response").and_then(Value::as_bool) {
        t.respond = x;
    }
    if let Some(x) = o.get("interrupt_response").and_then(Value::as_bool) {
        t.interrupt = x;
    }
    Ok(Some(t))
}

/// A `message` item's role and text (`input_text` / `text` parts).
fn message_item(item: &Value) -> Result<(String, String), String> {
    if item.get("type").and_then(Value::as_str) != Some("message") {
        return Err("only items of type 'message' are supported".into());
    }
    let role = item.get("role").and_then(Value::as_str).filter(|r| matches!(*r, "user" | "assistant" | "system")).ok_or("item.role must be user, assistant or system")?;
    let parts = item.get("content").and_then(Value::as_array).ok_or("item.content must be an array of parts")?;
    let mut text = String::new();
    for p in parts {
        match p.get("type").and_then(Value::as_str) {
            Some("input_text" | "text") => text.push_str(p.get("text").and_then(Value::as_str).ok_or("a text part needs 'text'")?),
            Some(t) => return Err(format!("content parts of type '{t}' are not supported (input_text, text)")),
            None => return Err("a content part needs a 'type'".into()),
        }
    }
    Ok((role.to_string(), text))
}
