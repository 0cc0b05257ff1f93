//! `/v1/realtime` driven from Python with the `websockets` client (installed from PyPI into
//! a venv under the target directory on first run; skipped, saying so, when it cannot be
//! had, or failed with SAPIENT_REQUIRE_PYTHON=1): one spoken turn, a question synthesized
//! by Kokoro, through the documented events (tests/realtime_client.py checks their order,
//! the transcript, the audio and the text), then a text turn, errors and authentication.

mod common;

use anyhow::Result;
use common::*;
use sapient_generate::{Engine, EngineOptions};
use sapient_server::{Llm, Models, Server, ServerOptions};

const WEBSOCKETS_VERSION: &str = "15.0.1";

#[test]
fn realtime_one_spoken_turn_from_python() -> Result<()> {
    let py = match python_venv("realtime-venv", &[format!("websockets=={WEBSOCKETS_VERSION}")]) {
        Ok(p) => p,
        Err(why) => return skip("realtime_one_spoken_turn_from_python", &format!("no python3 venv with websockets=={WEBSOCKETS_VERSION}: {why}")),
    };
    let hub = sapient_hub::Hub::new()?;
    let cpu = candle_core::Device::Cpu;
    let kokoro = hub.fetch_preset("kokoro-82m", &mut |_| {})?;
    let vad = hub.fetch_preset("silero-vad", &mut |_| {})?.file("onnx")?.to_path_buf();
    let tts = sapient_kokoro::KokoroTts::from_dir(&kokoro.dir, &cpu)?;
    let whisper = sapient_whisper::Transcriber::load("whisper-tiny.en", &cpu, &mut |_| {})?;
    // the question, as raw pcm16 at 24 kHz, in another voice than the reply's
    let question = tts.synthesize("What is the capital of France?", "jf_gongitsune", 1.0)?.samples;
    let pcm: Vec<u8> = question.iter().flat_map(|x| ((x.clamp(-1.0, 1.0) * 32767.0).round() as i16).to_le_bytes()).collect();
    let qfile = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("realtime-question.pcm");
    std::fs::write(&qfile, pcm)?;

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let key = "sk-sapient-test";
    let server = Server::new(ServerOptions { api_key: Some(key.into()), ..ServerOptions::default() });
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = rt.spawn(server.clone().serve(listener, async move {
        let _ = stopped.await;
    }));
    let engine = Engine::new(pipeline(), EngineOptions::default())?;
    server.set_models(Models {
        llms: vec![Llm::new(MODEL, engine)],
        transcribers: vec![("whisper-tiny.en".into(), whisper)],
        tts: vec![("kokoro-82m".into(), tts)],
        vad: Some(vad),
        ..Models::default()
    })?;
    let env = [("ADDR", addr.to_string()), ("KEY", key.to_string()), ("QUESTION", qfile.display().to_string())];
    let r = run_python(&py, "realtime_client.py", &env);
    let _ = stop.send(());
    rt.block_on(serving)??;
    r
}
