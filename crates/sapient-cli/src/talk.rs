//! `sapient talk`: a spoken conversation (sapient-voice). With `--input FILE` the recording
//! is run through the loop in 20 ms frames and the loop's audio written to `--output` (in
//! step with the input: the reply starts where the user's turn ended); both sides' text
//! and the timings go to the terminal.

use anyhow::{Context, Result};
use clap::Args;
use sapient_voice::{file, Event, TurnOptions, VoiceLoop, VoiceModels, VoiceOptions};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Args)]
pub struct TalkArgs {
    /// A recording to talk with (any format `sapient transcribe` reads).
    #[arg(long, value_name = "FILE")]
    input: PathBuf,
    /// Where to write the loop's audio (24 kHz mono 16-bit WAV, as long as the input plus
    /// the last reply).
    #[arg(short, long, value_name = "FILE", default_value = "reply.wav")]
    output: PathBuf,
    /// Language model: preset id, local GGUF file / HF directory, or Hub repo id.
    #[arg(short, long, default_value = "smollm2-135m-instruct", env = "SAPIENT_MODEL")]
    model: String,
    /// Whisper preset or directory.
    #[arg(long, default_value = "whisper-tiny.en", env = "SAPIENT_WHISPER_MODEL")]
    whisper: String,
    /// The kokoro-82m preset, or a directory with its files.
    #[arg(long, default_value = "kokoro-82m", env = "SAPIENT_TTS_MODEL")]
    tts: String,
    /// Kokoro voice or blend (`jf_alpha:0.6,jm_kumo:0.4`).
    #[arg(long, default_value = "jm_kumo")]
    voice: String,
    /// Speaking rate (0.25 to 4).
    #[arg(long, default_value_t = 1.0)]
    speed: f32,
    /// The system prompt (default: a short-spoken-answers assistant).
    #[arg(long)]
    system: Option<String>,
    /// Most tokens per reply.
    #[arg(short = 'n', long, default_value_t = 120)]
    max_tokens: usize,
    /// Silence that ends a turn, in ms.
    #[arg(long, default_value_t = 500)]
    end_of_turn_ms: u32,
    /// Shorter speech is not a turn, in ms.
    #[arg(long, default_value_t = 250)]
    min_speech_ms: u32,
    /// Let replies play to their end when the user speaks over them.
    #[arg(long)]
    no_barge_in: bool,
    /// Print the timings of each reply.
    #[arg(long)]
    stats: bool,
}

pub fn run(args: TalkArgs) -> Result<()> {
    let cpu = candle_core::Device::Cpu;
    let mut bars = crate::Bars::default();
    let hub = sapient_hub::Hub::new()?;
    let tts_dir = crate::speak::kokoro_dir(&hub, &args.tts, &mut bars)?;
    let vad_file = hub.fetch_preset("silero-vad", &mut |p| bars.update(p))?.file("onnx")?.to_path_buf();
    let transcriber = sapient_whisper::Transcriber::load(&args.whisper, &cpu, &mut |p| bars.update(p)).with_context(|| format!("loading {}", args.whisper))?;
    let pipe = sapient_generate::Pipeline::load(&args.model, Default::default(), |p| bars.update(p)).with_context(|| format!("loading model '{}'", args.model))?;
    bars.finish();
    let tts = sapient_kokoro::KokoroTts::from_dir(&tts_dir, &cpu).with_context(|| format!("loading Kokoro from {}", tts_dir.display()))?;
    let engine = sapient_generate::Engine::new(pipe.model(), Default::default())?;
    let models = VoiceModels { transcriber: Arc::new(transcriber), tts: Arc::new(tts), llm: Arc::new(engine) };

    let audio = sapient_audio::decode_file(&args.input).with_context(|| format!("reading {}", args.input.display()))?;
    let defaults = VoiceOptions::default();
    let opts = VoiceOptions {
        instructions: args.system.clone().unwrap_or(defaults.instructions),
        voice: args.voice.clone(),
        speed: args.speed,
        max_reply_tokens: args.max_tokens,
        input_rate: audio.sample_rate,
        turn: Some(TurnOptions { end_of_turn_ms: args.end_of_turn_ms, min_speech_ms: args.min_speech_ms, interrupt: !args.no_barge_in, ..TurnOptions::default() }),
        ..defaults
    };
    let vad = sapient_audio::SileroVad::load(&vad_file, &cpu)?;
    let mut lp = VoiceLoop::new(models, vad, opts)?;
    let run = file::run(&mut lp, &audio.samples, 20, 120.0)?;
    let mut out = std::io::stdout().lock();
    for (t, ev) in &run.events {
        let at = *t as f64 / 1000.0;
        match ev {
            Event::Transcript { text, .. } if !text.is_empty() => writeln!(out, "[{at:7.2}] you: {text}")?,
            Event::Interrupted { heard, .. } => writeln!(out, "[{at:7.2}] (interrupted; heard: {heard:?})")?,
            Event::ResponseDone { text, generated, timings, .. } => {
                writeln!(out, "[{at:7.2}] assistant: {}", generated.trim())?;
                if args.stats {
                    writeln!(
                        out,
                        "          transcribe {:.0} ms, first token {:.0} ms, first clause spoken in {:.0} ms, first audio {:.0} ms after the reply started; {} prompt tokens ({} cached), {} generated; kept: {text:?}",
                        timings.transcribe_ms,
                        timings.first_token_ms.unwrap_or(f64::NAN),
                        timings.first_clause_synth_ms.unwrap_or(f64::NAN),
                        timings.first_audio_ms.unwrap_or(f64::NAN),
                        timings.prompt_tokens,
                        timings.reused_prompt_tokens,
                        timings.generated_tokens
                    )?;
                }
            }
            Event::Error { message } => writeln!(out, "[{at:7.2}] error: {message}")?,
            _ => {}
        }
    }
    sapient_audio::write_wav(&args.output, &run.output, run.output_rate, sapient_audio::WavFormat::Pcm16).with_context(|| format!("writing {}", args.output.display()))?;
    eprintln!("wrote {} ({:.2} s)", args.output.display(), run.output.len() as f64 / f64::from(run.output_rate));
    Ok(())
}
