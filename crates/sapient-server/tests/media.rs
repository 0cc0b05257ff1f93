//! Embeddings, speech and transcription over HTTP: the server's vectors are the embedder's
//! (float and base64), Kokoro's speech through /v1/audio/speech transcribes back to its text
//! through /v1/audio/transcriptions (json, text, srt, vtt, verbose_json with words), speech
//! streams (PCM, and WAV behind a header of unknown length) and stops when its client leaves,
//! and the audio routes' errors are OpenAI-shaped.

mod common;

use anyhow::{ensure, Context, Result};
use common::*;
use sapient_server::{Models, Server, ServerOptions};
use serde_json::{json, Value};
use std::time::Duration;

fn unb64(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    };
    let clean: Vec<u8> = s.bytes().filter(|&c| c != b'=').collect();
    let mut out = Vec::new();
    for ch in clean.chunks(4) {
        let n = ch.iter().enumerate().fold(0u32, |acc, (i, &c)| acc | (u32::from(val(c)) << (18 - 6 * i)));
        for k in 0..ch.len().saturating_sub(1) {
            out.push((n >> (16 - 8 * k)) as u8);
        }
    }
    out
}

/// A speech request's reply read from the raw socket: its headers (lower case) and the pieces
/// of its chunked body as they were sent.
async fn chunked_speech(a: std::net::SocketAddr, body: &Value) -> Result<(String, Vec<Vec<u8>>)> {
    let head = request_bytes("POST", "/v1/audio/speech", &[("Content-Type", "application/json")], body.to_string().as_bytes());
    let mut sock = tokio::net::TcpStream::connect(a).await?;
    tokio::io::AsyncWriteExt::write_all(&mut sock, &head).await?;
    let mut raw = Vec::new();
    tokio::io::AsyncReadExt::read_to_end(&mut sock, &mut raw).await?;
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").context("headers")? + 4;
    let head_text = String::from_utf8_lossy(&raw[..split]).to_lowercase();
    ensure!(head_text.contains("transfer-encoding: chunked"), "{head_text}");
    let mut pieces = Vec::new();
    let mut at = split;
    loop {
        let eol = raw[at..].windows(2).position(|w| w == b"\r\n").context("chunk size")? + at;
        let n = usize::from_str_radix(String::from_utf8_lossy(&raw[at..eol]).trim(), 16)?;
        if n == 0 {
            break;
        }
        pieces.push(raw.get(eol + 2..eol + 2 + n).context("a chunk cut short")?.to_vec());
        at = eol + 2 + n + 2;
    }
    Ok((head_text, pieces))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddings_speech_and_transcription() -> Result<()> {
    tokio::time::timeout(Duration::from_secs(300), async {
        let embedder = sapient_embed::Embedder::load("all-minilm-l6-v2", Default::default(), &mut |_| {})?;
        let reference = embedder.embed(&["The weather is lovely today.", "It's so sunny outside!"])?;
        let alone = embedder.embed(&["The weather is lovely today."])?;
        let whisper = sapient_whisper::Transcriber::load("whisper-tiny.en", &candle_core::Device::Cpu, &mut |_| {})?;
        let hub = sapient_hub::Hub::new()?;
        let resolved = hub.resolve("kokoro-82m", &mut |_| {})?;
        let dir = if resolved.dir.is_dir() { resolved.dir.clone() } else { resolved.file("onnx")?.parent().context("dir")?.to_path_buf() };
        let tts = sapient_kokoro::KokoroTts::from_dir(&dir, &candle_core::Device::Cpu)?;

        let server = Server::new(ServerOptions { max_audio_bytes: 4 << 20, ..ServerOptions::default() });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let a = listener.local_addr()?;
        tokio::spawn(server.clone().serve(listener, std::future::pending()));
        server.set_models(Models {
            embedders: vec![("all-minilm-l6-v2".into(), embedder)],
            transcribers: vec![("whisper-tiny.en".into(), whisper)],
            tts: vec![("kokoro-82m".into(), tts)],
            ..Models::default()
        })?;
        let ids: Vec<Value> = get(a, "/v1/models").await?.json()?["data"].as_array().cloned().unwrap_or_default();
        ensure!(ids.len() == 3, "{ids:?}");

        // Embeddings: floats and base64 are the embedder's vectors.
        let r = post(a, "/v1/embeddings", &json!({"model": "all-minilm-l6-v2", "input": ["The weather is lovely today.", "It's so sunny outside!"]})).await?;
        ensure!(r.status == 200, "{}", r.text());
        let v = r.json()?;
        for (i, want) in reference.iter().enumerate() {
            let got: Vec<f32> = v["data"][i]["embedding"].as_array().context("floats")?.iter().map(|x| x.as_f64().unwrap_or(f64::NAN) as f32).collect();
            ensure!(got == *want, "vector {i} differs");
        }
        ensure!(v["usage"]["prompt_tokens"].as_u64().unwrap_or(0) > 10, "{}", v["usage"]);
        let r = post(a, "/v1/embeddings", &json!({"model": "text-embedding-3-small", "input": "The weather is lovely today.", "encoding_format": "base64"})).await?;
        let b = unb64(r.json()?["data"][0]["embedding"].as_str().context("base64")?);
        let got: Vec<f32> = b.chunks(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        ensure!(got == alone[0], "base64 vector differs");
        let e = post(a, "/v1/embeddings", &json!({"model": "all-minilm-l6-v2", "input": []})).await?;
        ensure!(e.status == 400 && e.json()?["error"]["param"] == "input", "{}", e.text());

        // Speech, then back to text.
        let said = "The quick brown fox jumps over the lazy dog.";
        let r = post(a, "/v1/audio/speech", &json!({"model": "tts-1", "input": said, "voice": "alloy"})).await?;
        ensure!(r.status == 200 && r.header("content-type") == Some("audio/wav"), "{} {}", r.status, r.text());
        let wav = r.body.clone();
        ensure!(wav.starts_with(b"RIFF") && wav.len() > 24_000, "a WAV of some length: {} bytes", wav.len());
        let pcm = post(a, "/v1/audio/speech", &json!({"input": said, "response_format": "pcm"})).await?;
        ensure!(pcm.status == 200 && pcm.body.len() + 44 == wav.len(), "pcm {} vs wav {}", pcm.body.len(), wav.len());
        ensure!(pcm.body[..] == wav[44..], "the streamed PCM is the WAV's samples");
        // PCM is streamed as it is synthesized: a chunked body, one piece per sentence, as
        // long as the sentences spoken one by one.
        let two = "The quick brown fox jumps over the lazy dog. It was a bright cold day in April.";
        let (_, pieces) = chunked_speech(a, &json!({"input": two, "response_format": "pcm"})).await?;
        let streamed: Vec<u8> = pieces.concat();
        let mut alone = Vec::new();
        for sentence in ["The quick brown fox jumps over the lazy dog.", "It was a bright cold day in April."] {
            alone.extend(post(a, "/v1/audio/speech", &json!({"input": sentence, "response_format": "pcm"})).await?.body);
        }
        ensure!(pieces.len() >= 2, "one piece per sentence, got {}", pieces.len());
        ensure!(streamed.len() == alone.len(), "streamed {} bytes, sentences alone {}", streamed.len(), alone.len());
        // A streamed WAV: a header of unknown length (RIFF and data sizes 0xFFFFFFFF) first,
        // then the PCM sentence by sentence; it decodes to the whole WAV's samples.
        let whole = post(a, "/v1/audio/speech", &json!({"input": two})).await?;
        ensure!(whole.status == 200 && whole.header("content-type") == Some("audio/wav"), "{}", whole.text());
        let whole = sapient_audio::decode_bytes(whole.body.clone())?;
        for req in [json!({"input": two, "stream": true}), json!({"input": two, "response_format": "wav", "stream_format": "audio"})] {
            let (head_text, pieces) = chunked_speech(a, &req).await?;
            ensure!(head_text.contains("content-type: audio/wav"), "{head_text}");
            ensure!(pieces.len() >= 3 && pieces[0].len() == 44, "a header, then a piece per sentence: {:?}", pieces.iter().map(Vec::len).collect::<Vec<_>>());
            let h = &pieces[0];
            let u16_at = |i: usize| u16::from_le_bytes([h[i], h[i + 1]]);
            let u32_at = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
            ensure!(&h[0..4] == b"RIFF" && u32_at(4) == u32::MAX && &h[8..16] == b"WAVEfmt " && u32_at(16) == 16, "{h:?}");
            // PCM, mono, 24 kHz, 16-bit, then a data chunk of unknown length.
            ensure!(u16_at(20) == 1 && u16_at(22) == 1 && u32_at(24) == 24_000 && u32_at(28) == 48_000 && u16_at(32) == 2 && u16_at(34) == 16, "{h:?}");
            ensure!(&h[36..40] == b"data" && u32_at(40) == u32::MAX, "{h:?}");
            ensure!(pieces[1..].concat() == streamed, "the WAV's samples are the streamed PCM's");
            let back = sapient_audio::decode_bytes(pieces.concat())?;
            ensure!(back.sample_rate == whole.sample_rate && back.samples == whole.samples, "{} samples streamed, {} whole", back.samples.len(), whole.samples.len());
        }
        // A client that leaves stops the synthesis: of twelve sentences, only those made
        // before the server found the connection closed (a few: the channel holds two).
        let count = |m: &str, name: &str| metric(m, name).unwrap_or(-1.0);
        let before = get(a, "/metrics").await?.text();
        let long: String = (1..=12).map(|i| format!("This is sentence number {i} of a long text. ")).collect();
        let head = request_bytes("POST", "/v1/audio/speech", &[("Content-Type", "application/json")], json!({"input": long, "stream": true}).to_string().as_bytes());
        let mut sock = tokio::net::TcpStream::connect(a).await?;
        tokio::io::AsyncWriteExt::write_all(&mut sock, &head).await?;
        let mut got = Vec::new();
        let mut buf = vec![0u8; 65536];
        while got.len() < 20_000 {
            let n = tokio::io::AsyncReadExt::read(&mut sock, &mut buf).await?;
            ensure!(n > 0, "the stream ended early");
            got.extend_from_slice(&buf[..n]);
        }
        drop(sock);
        let t = std::time::Instant::now();
        let after = loop {
            let m = get(a, "/metrics").await?.text();
            if count(&m, "sapient:speech_streams_cancelled_total") > count(&before, "sapient:speech_streams_cancelled_total") {
                break m;
            }
            ensure!(t.elapsed() < Duration::from_secs(60), "the synthesis did not stop after the client left");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let made = count(&after, "sapient:speech_sentences_total") - count(&before, "sapient:speech_sentences_total");
        ensure!((1.0..12.0).contains(&made), "{made} of 12 sentences synthesized for a client that left after the first");
        eprintln!("a client that left after the first sentence: {made} of 12 sentences synthesized");
        let r = post(a, "/v1/audio/speech", &json!({"input": said, "stream_format": "sse"})).await?;
        ensure!(r.status == 400 && r.json()?["error"]["param"] == "stream_format", "{}", r.text());
        let words = |s: &str| s.to_lowercase().split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()).map(str::to_string).collect::<Vec<_>>();
        let want = words(said);
        let transcribe = |fields: Vec<(&'static str, &'static str)>| {
            let wav = wav.clone();
            async move {
                let (ct, body) = multipart(&fields, &wav);
                send(a, "POST", "/v1/audio/transcriptions", &[("Content-Type", ct.as_str())], &body).await
            }
        };
        let r = transcribe(vec![("model", "whisper-1")]).await?;
        ensure!(r.status == 200, "{}", r.text());
        let text = r.json()?["text"].as_str().context("text")?.to_string();
        let heard = words(&text);
        let common = want.iter().filter(|w| heard.contains(w)).count();
        ensure!(common * 10 >= want.len() * 8, "heard {text:?} for {said:?}");
        let r = transcribe(vec![("response_format", "text")]).await?;
        ensure!(r.header("content-type").is_some_and(|c| c.starts_with("text/plain")) && words(&r.text()) == heard, "{}", r.text());
        let srt = transcribe(vec![("response_format", "srt")]).await?.text();
        ensure!(srt.starts_with("1\n00:00:0") && srt.contains(" --> "), "{srt}");
        let vtt = transcribe(vec![("response_format", "vtt")]).await?.text();
        ensure!(vtt.starts_with("WEBVTT"), "{vtt}");
        let v = transcribe(vec![("response_format", "verbose_json"), ("timestamp_granularities[]", "word")]).await?.json()?;
        let ws = v["words"].as_array().context("words")?;
        ensure!(ws.len() >= want.len() - 2 && v["segments"].as_array().is_some_and(|s| !s.is_empty()), "{v}");
        let mut last = 0.0;
        for w in ws {
            let (s, e) = (w["start"].as_f64().unwrap_or(-1.0), w["end"].as_f64().unwrap_or(-1.0));
            ensure!(s >= last - 1e-6 && e >= s && e <= v["duration"].as_f64().unwrap_or(0.0) + 0.5, "{w} after {last}");
            last = s;
        }
        // Errors.
        let (ct, body) = multipart(&[], b"not audio at all");
        let r = send(a, "POST", "/v1/audio/transcriptions", &[("Content-Type", ct.as_str())], &body).await?;
        ensure!(r.status == 400 && r.json()?["error"]["param"] == "file", "{}", r.text());
        // A body declared over the limit is refused before it is sent.
        let (ct, body) = multipart(&[], &vec![0u8; 5 << 20]);
        let head = request_bytes("POST", "/v1/audio/transcriptions", &[("Content-Type", ct.as_str())], &body);
        let mut sock = tokio::net::TcpStream::connect(a).await?;
        tokio::io::AsyncWriteExt::write_all(&mut sock, &head[..head.len() - body.len()]).await?;
        let mut raw = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut sock, &mut raw).await?;
        let r = parse_reply(&raw)?;
        ensure!(r.status == 413, "{} {}", r.status, r.text());
        let r = post(a, "/v1/audio/speech", &json!({"input": "hi", "response_format": "mp3"})).await?;
        ensure!(r.status == 400 && r.json()?["error"]["param"] == "response_format", "{}", r.text());
        let r = post(a, "/v1/chat/completions", &json!({"messages": [{"role": "user", "content": "hi"}]})).await?;
        ensure!(r.status == 404, "no language model here: {}", r.text());
        Ok(())
    })
    .await?
}
