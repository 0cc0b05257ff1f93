//! `POST /v1/embeddings` (sapient-embed), `POST /v1/audio/transcriptions` and
//! `/v1/audio/translations` (Whisper, multipart upload of any format sapient-audio decodes),
//! `POST /v1/audio/speech` (Kokoro, WAV or raw 16-bit PCM).

use crate::error::ApiError;
use crate::{parse_body, AppState};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Multipart, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

fn blocking_err(e: tokio::task::JoinError) -> ApiError {
    ApiError::internal(format!("the worker failed: {e}"))
}

#[derive(Deserialize)]
struct EmbeddingRequest {
    model: Option<String>,
    input: Value,
    encoding_format: Option<String>,
    dimensions: Option<usize>,
    user: Option<String>,
}

/// What an embedding request asks for.
enum In {
    Texts(Vec<String>),
    Tokens(Vec<Vec<u32>>),
}

/// An embedding request's fields, checked without the model: base64 or floats, and the inputs.
fn check_embedding(req: &EmbeddingRequest) -> Result<(bool, In), ApiError> {
    let base64 = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(f) => return Err(ApiError::invalid_param("encoding_format", format!("encoding_format '{f}' is not float or base64"))),
    };
    let bad = || ApiError::invalid_param("input", "input must be a non-empty string, a list of strings, a list of token ids or a list of such lists");
    let ids = |v: &Value| -> Result<Vec<u32>, ApiError> { v.as_array().ok_or_else(bad)?.iter().map(|t| t.as_u64().map(|t| t as u32).ok_or_else(bad)).collect() };
    let input = match &req.input {
        Value::String(s) => In::Texts(vec![s.clone()]),
        Value::Array(a) if !a.is_empty() && a.iter().all(Value::is_string) => In::Texts(a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect()),
        Value::Array(a) if !a.is_empty() && a.iter().all(Value::is_number) => In::Tokens(vec![ids(&req.input)?]),
        Value::Array(a) if !a.is_empty() && a.iter().all(Value::is_array) => In::Tokens(a.iter().map(ids).collect::<Result<_, _>>()?),
        _ => return Err(bad()),
    };
    if matches!(&input, In::Texts(t) if t.len() > 2048) {
        return Err(ApiError::invalid_param("input", "at most 2048 inputs per request"));
    }
    Ok((base64, input))
}

pub(crate) async fn embeddings(State(st): State<Arc<AppState>>, headers: HeaderMap, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let req: EmbeddingRequest = parse_body(&st, &headers, body)?;
    let _ = &req.user;
    let m = st.models()?;
    let (id, emb) = m.find(&m.embedders, req.model.as_deref(), "embedding")?;
    let (base64, input) = check_embedding(&req)?;
    if let Some(d) = req.dimensions {
        if d != emb.dimensions() {
            return Err(ApiError::invalid_param("dimensions", format!("model '{id}' gives {} dimensions; choose them when the server loads it", emb.dimensions())));
        }
    }
    let emb = emb.clone();
    let (vectors, tokens) = tokio::task::spawn_blocking(move || -> Result<(Vec<Vec<f32>>, usize), ApiError> {
        let seqs = match input {
            In::Texts(t) => t.iter().map(|s| emb.tokenize(s, sapient_embed::Task::None)).collect::<Result<Vec<_>, _>>().map_err(|e| ApiError::bad_request(e.to_string()))?,
            In::Tokens(t) => t,
        };
        let n: usize = seqs.iter().map(Vec::len).sum();
        let v = emb.embed_tokens(&seqs).map_err(|e| ApiError::bad_request(e.to_string()))?;
        Ok((v, n))
    })
    .await
    .map_err(blocking_err)??;
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let e = if base64 { Value::String(b64(&v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())) } else { json!(v) };
            json!({"object": "embedding", "index": i, "embedding": e})
        })
        .collect();
    Ok(axum::Json(json!({"object": "list", "data": data, "model": id, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})).into_response())
}

/// Standard base64 with padding.
fn b64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16) | (u32::from(*c.get(1).unwrap_or(&0)) << 8) | u32::from(*c.get(2).unwrap_or(&0));
        for k in 0..4 {
            if k <= c.len() {
                s.push(A[(n >> (18 - 6 * k) & 63) as usize] as char);
            } else {
                s.push('=');
            }
        }
    }
    s
}

pub(crate) async fn transcriptions(State(st): State<Arc<AppState>>, mp: Result<Multipart, axum::extract::multipart::MultipartRejection>) -> Result<Response, ApiError> {
    audio_to_text(st, mp, sapient_whisper::Task::Transcribe).await
}

pub(crate) async fn translations(State(st): State<Arc<AppState>>, mp: Result<Multipart, axum::extract::multipart::MultipartRejection>) -> Result<Response, ApiError> {
    audio_to_text(st, mp, sapient_whisper::Task::Translate).await
}

fn multipart_err(st: &AppState, e: impl std::fmt::Display, status: StatusCode) -> ApiError {
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::too_large(st.opts.max_audio_bytes)
    } else {
        ApiError::bad_request(format!("cannot read the multipart form: {e}"))
    }
}

async fn audio_to_text(st: Arc<AppState>, mp: Result<Multipart, axum::extract::multipart::MultipartRejection>, task: sapient_whisper::Task) -> Result<Response, ApiError> {
    let mut mp = mp.map_err(|e| { let s = e.status(); multipart_err(&st, e, s) })?;
    let (mut file, mut model, mut language, mut prompt, mut format, mut temperature, mut words) = (None, None, None, None, String::from("json"), None, false);
    while let Some(field) = mp.next_field().await.map_err(|e| { let s = e.status(); multipart_err(&st, e, s) })? {
        let name = field.name().unwrap_or_default().to_string();
        let data = field.bytes().await.map_err(|e| { let s = e.status(); multipart_err(&st, e, s) })?;
        let text = || String::from_utf8_lossy(&data).trim().to_string();
        match name.as_str() {
            "file" => file = Some(data.clone()),
            "model" => model = Some(text()),
            "language" => language = Some(text()).filter(|l| !l.is_empty()),
            "prompt" => prompt = Some(text()).filter(|p| !p.is_empty()),
            "response_format" => format = text(),
            "temperature" => {
                temperature = Some(text().parse::<f32>().ok().filter(|t| (0.0..=1.0).contains(t)).ok_or_else(|| ApiError::invalid_param("temperature", "temperature must be between 0 and 1"))?)
            }
            "timestamp_granularities[]" | "timestamp_granularities" => words |= text() == "word",
            _ => {}
        }
    }
    let file = file.ok_or_else(|| ApiError::invalid_param("file", "a 'file' part with the audio is required"))?;
    if !matches!(format.as_str(), "json" | "text" | "srt" | "vtt" | "verbose_json") {
        return Err(ApiError::invalid_param("response_format", format!("response_format '{format}' is not json, text, srt, vtt or verbose_json")));
    }
    let m = st.models()?;
    let (id, whisper) = m.find(&m.transcribers, model.as_deref(), "speech-to-text")?;
    let whisper = whisper.clone();
    let _ = id;
    let mut opts = sapient_whisper::TranscribeOptions { task, language, initial_prompt: prompt, word_timestamps: words && format == "verbose_json", ..Default::default() };
    if let Some(t) = temperature {
        opts.temperatures = if t == 0.0 { opts.temperatures } else { vec![t] };
    }
    let t = tokio::task::spawn_blocking(move || -> Result<sapient_whisper::Transcript, ApiError> {
        let audio = sapient_audio::decode_bytes(file.to_vec()).map_err(|e| ApiError::invalid_param("file", format!("cannot decode the audio: {e}")))?;
        let audio = audio.into_16k().map_err(|e| ApiError::invalid_param("file", format!("cannot resample the audio: {e}")))?;
        whisper.transcribe(&audio.samples, &opts).map_err(|e| ApiError::bad_request(e.to_string()))
    })
    .await
    .map_err(blocking_err)??;
    let plain = |s: String| ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], s).into_response();
    Ok(match format.as_str() {
        "text" => plain(t.render(sapient_whisper::OutputFormat::Text)),
        "srt" => plain(t.render(sapient_whisper::OutputFormat::Srt)),
        "vtt" => plain(t.render(sapient_whisper::OutputFormat::Vtt)),
        "verbose_json" => {
            let r3 = |x: f64| (x * 1000.0).round() / 1000.0;
            let segs: Vec<Value> = t
                .segments
                .iter()
                .map(|g| {
                    json!({"id": g.id, "seek": g.seek, "start": r3(g.start), "end": r3(g.end), "text": g.text, "tokens": g.tokens,
                        "temperature": g.temperature, "avg_logprob": g.avg_logprob, "compression_ratio": g.compression_ratio, "no_speech_prob": g.no_speech_prob})
                })
                .collect();
            let mut v = json!({"task": if task == sapient_whisper::Task::Translate { "translate" } else { "transcribe" }, "language": t.language, "duration": r3(t.duration), "text": t.text, "segments": segs});
            if words {
                v["words"] = t.segments.iter().flat_map(|g| &g.words).map(|w| json!({"word": w.word.trim(), "start": r3(w.start), "end": r3(w.end)})).collect();
            }
            axum::Json(v).into_response()
        }
        _ => axum::Json(json!({"text": t.text})).into_response(),
    })
}

#[derive(Deserialize)]
struct SpeechRequest {
    model: Option<String>,
    input: String,
    voice: Option<Value>,
    speed: Option<f32>,
    response_format: Option<String>,
    /// OpenAI's: `audio` (the body itself); `sse` is not supported. Given, a WAV is streamed.
    stream_format: Option<String>,
    /// Not OpenAI's (Kokoro-FastAPI's): stream the WAV as it is synthesized. PCM always streams.
    stream: Option<bool>,
}

/// A speech request's fields, checked without the model: the speed, the voice asked for
/// (`None`: the model's first), the output format and whether to stream it.
fn check_speech(req: &SpeechRequest) -> Result<(f32, Option<String>, String, bool), ApiError> {
    if req.input.trim().is_empty() || req.input.len() > 8192 {
        return Err(ApiError::invalid_param("input", "input must be 1 to 8192 bytes of text"));
    }
    let speed = req.speed.unwrap_or(1.0);
    if !(0.25..=4.0).contains(&speed) {
        return Err(ApiError::invalid_param("speed", format!("speed must be between 0.25 and 4, got {speed}")));
    }
    let voice = match &req.voice {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(v) => Some(v.get("id").and_then(Value::as_str).map(str::to_string).ok_or_else(|| ApiError::invalid_param("voice", "voice must be a name (or a blend such as a:0.6,b:0.4)"))?),
    };
    let format = req.response_format.clone().unwrap_or_else(|| "wav".into());
    if format != "wav" && format != "pcm" {
        return Err(ApiError::invalid_param("response_format", format!("response_format '{format}' is not supported (wav, pcm)")));
    }
    if let Some(f) = req.stream_format.as_deref().filter(|f| *f != "audio") {
        return Err(ApiError::invalid_param("stream_format", format!("stream_format '{f}' is not supported (audio)")));
    }
    let stream = format == "pcm" || req.stream.unwrap_or(false) || req.stream_format.is_some();
    Ok((speed, voice, format, stream))
}

/// Parse and check an embedding or speech body without a model (see [`crate::check_request`]).
pub(crate) fn check_body(st: &AppState, speech: bool, body: &[u8]) -> Result<(), ApiError> {
    let body = Ok(Bytes::copy_from_slice(body));
    if speech {
        let req: SpeechRequest = parse_body(st, &HeaderMap::new(), body)?;
        check_speech(&req).map(drop)
    } else {
        let req: EmbeddingRequest = parse_body(st, &HeaderMap::new(), body)?;
        check_embedding(&req).map(drop)
    }
}

pub(crate) async fn speech(State(st): State<Arc<AppState>>, headers: HeaderMap, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let req: SpeechRequest = parse_body(&st, &headers, body)?;
    let m = st.models()?;
    let (_, tts) = m.find(&m.tts, req.model.as_deref(), "text-to-speech")?;
    let tts = tts.clone();
    let (speed, voice, format, stream) = check_speech(&req)?;
    let names = tts.voices().names();
    let first = names.first().map(|v| v.to_string()).unwrap_or_default();
    let voice = voice.unwrap_or(first);
    // OpenAI's voice names, when the model has no voice of that name: its first voice.
    const OPENAI: &[&str] = &["alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage", "shimmer", "verse"];
    let voice = if OPENAI.contains(&voice.as_str()) && !names.iter().any(|n| *n == voice) { names.first().map(|v| v.to_string()).unwrap_or(voice) } else { voice };
    let input = req.input;
    if stream {
        // PCM as it is; a WAV behind a header of unknown length (sizes 0xFFFFFFFF).
        let head = match format.as_str() {
            "wav" => Some(Bytes::from(
                sapient_audio::wav_header(tts.sample_rate(), sapient_audio::WavFormat::Pcm16, None).map_err(|e| ApiError::internal(e.to_string()))?,
            )),
            _ => None,
        };
        return stream_audio(st.clone(), tts, input, voice, speed, head).await;
    }
    let rate = tts.sample_rate();
    let samples = tokio::task::spawn_blocking(move || -> Result<Vec<f32>, ApiError> {
        // Sentence by sentence, as the streams go (the same samples as synthesizing it whole).
        let bad = |e: sapient_kokoro::Error| ApiError::bad_request(e.to_string());
        let mut samples = Vec::new();
        for chunk in tts.stream(&input, &voice, speed).map_err(bad)? {
            samples.extend(chunk.map_err(bad)?.samples);
            st.speech.sentences.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(samples)
    })
    .await
    .map_err(blocking_err)??;
    let wav = sapient_audio::encode_wav(&samples, rate, sapient_audio::WavFormat::Pcm16).map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(([(header::CONTENT_TYPE, "audio/wav")], wav).into_response())
}

/// Speech streamed as it is synthesized: each sentence's samples go out as 16-bit PCM as soon
/// as they exist (a chunked body), after the WAV header `wav` if given, so playback can start
/// after the first sentence. An error before the first sentence is an ordinary error reply; a
/// client that goes away stops the synthesis at the next sentence.
async fn stream_audio(st: Arc<AppState>, tts: Arc<sapient_kokoro::KokoroTts>, input: String, voice: String, speed: f32, wav: Option<Bytes>) -> Result<Response, ApiError> {
    let (first_tx, first_rx) = tokio::sync::oneshot::channel::<Result<(), ApiError>>();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(2);
    tokio::task::spawn_blocking(move || {
        let mut first = Some(first_tx);
        let stream = match tts.stream(&input, &voice, speed) {
            Ok(s) => s,
            Err(e) => {
                if let Some(f) = first.take() {
                    let _ = f.send(Err(ApiError::bad_request(e.to_string())));
                }
                return;
            }
        };
        for chunk in stream {
            match chunk {
                Ok(c) => {
                    st.speech.sentences.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if let Some(f) = first.take() {
                        let _ = f.send(Ok(()));
                    }
                    if tx.blocking_send(Ok(Bytes::from(sapient_audio::encode_pcm16(&c.samples)))).is_err() {
                        st.speech.streams_cancelled.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        return;
                    }
                }
                Err(e) => {
                    match first.take() {
                        Some(f) => {
                            let _ = f.send(Err(ApiError::bad_request(e.to_string())));
                        }
                        None => {
                            tracing::warn!("speech synthesis failed mid-stream: {e}");
                            let _ = tx.blocking_send(Err(std::io::Error::other(e.to_string())));
                        }
                    }
                    return;
                }
            }
        }
        if let Some(f) = first.take() {
            let _ = f.send(Ok(()));
        }
    });
    first_rx.await.map_err(|_| ApiError::internal("speech synthesis stopped".to_string()))??;
    let content_type = if wav.is_some() { "audio/wav" } else { "audio/pcm" };
    let samples = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|x| (x, rx)) });
    let body = futures::StreamExt::chain(futures::stream::iter(wav.map(Ok)), samples);
    Ok(([(header::CONTENT_TYPE, content_type)], axum::body::Body::from_stream(body)).into_response())
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_matches_rfc4648_vectors() {
        for (i, o) in [("", ""), ("f", "Zg=="), ("fo", "Zm8="), ("foo", "Zm9v"), ("foob", "Zm9vYg=="), ("fooba", "Zm9vYmE="), ("foobar", "Zm9vYmFy")] {
            assert_eq!(super::b64(i.as_bytes()), o);
        }
    }
}
