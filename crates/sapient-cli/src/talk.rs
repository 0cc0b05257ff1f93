//! `sapient talk`: a spoken conversation (sapient-voice). With `--input FILE` the recording
//! is run through the loop in 20 ms frames and the loop's audio written to `--output` (in
//! step with the input: the reply starts where the user's turn ended); without it (built
//! with the `microphone` feature) the microphone is the input and the speaker the output.
//! Both sides' text and the timings go to the terminal.

use anyhow::{Context, Result};
use clap::Args;
use sapient_voice::{file, Event, TurnOptions, VoiceLoop, VoiceModels, VoiceOptions};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Args)]
pub struct TalkArgs {
    /// A recording to talk with (any format `sapient transcribe` reads); without it, the
    /// microphone and the speaker (the `microphone` feature).
    #[arg(long, value_name = "FILE")]
    input: Option<PathBuf>,
    /// Input device whose name contains this (live mode; default: the host's default).
    #[arg(long)]
    mic: Option<String>,
    /// Output device whose name contains this (live mode; default: the host's default).
    #[arg(long)]
    speaker: Option<String>,
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

    let defaults = VoiceOptions::default();
    let opts = VoiceOptions {
        instructions: args.system.clone().unwrap_or(defaults.instructions),
        voice: args.voice.clone(),
        speed: args.speed,
        max_reply_tokens: args.max_tokens,
        turn: Some(TurnOptions { end_of_turn_ms: args.end_of_turn_ms, min_speech_ms: args.min_speech_ms, interrupt: !args.no_barge_in, ..TurnOptions::default() }),
        ..defaults
    };
    let vad = sapient_audio::SileroVad::load(&vad_file, &cpu)?;
    let Some(input) = &args.input else { return live(&args, models, vad, opts) };
    let audio = sapient_audio::decode_file(input).with_context(|| format!("reading {}", input.display()))?;
    let mut lp = VoiceLoop::new(models, vad, VoiceOptions { input_rate: audio.sample_rate, ..opts })?;
    let run = file::run(&mut lp, &audio.samples, 20, 120.0)?;
    let mut out = std::io::stdout().lock();
    for (t, ev) in &run.events {
        print_event(&mut out, *t, ev, args.stats)?;
    }
    sapient_audio::write_wav(&args.output, &run.output, run.output_rate, sapient_audio::WavFormat::Pcm16).with_context(|| format!("writing {}", args.output.display()))?;
    eprintln!("wrote {} ({:.2} s)", args.output.display(), run.output.len() as f64 / f64::from(run.output_rate));
    Ok(())
}

/// One event for the terminal: both sides' text, interruptions, errors (and timings).
fn print_event(out: &mut impl Write, t_ms: u64, ev: &Event, stats: bool) -> Result<()> {
    let at = t_ms as f64 / 1000.0;
    match ev {
        Event::Transcript { text, .. } if !text.is_empty() => writeln!(out, "[{at:7.2}] you: {text}")?,
        Event::Interrupted { heard, .. } => writeln!(out, "[{at:7.2}] (interrupted; heard: {heard:?})")?,
        Event::ResponseDone { text, generated, timings, .. } => {
            writeln!(out, "[{at:7.2}] assistant: {}", generated.trim())?;
            if stats {
                writeln!(
                    out,
                    "          transcribe {:.0} ms, first token {:.0} ms, first clause spoken in {:.0} ms, first audio {:.0} ms after the reply started ({:.0} ms after the speech ended); {} prompt tokens ({} cached), {} generated; kept: {text:?}",
                    timings.transcribe_ms,
                    timings.first_token_ms.unwrap_or(f64::NAN),
                    timings.first_clause_synth_ms.unwrap_or(f64::NAN),
                    timings.first_audio_ms.unwrap_or(f64::NAN),
                    timings.speech_end_to_first_audio_ms.unwrap_or(f64::NAN),
                    timings.prompt_tokens,
                    timings.reused_prompt_tokens,
                    timings.generated_tokens
                )?;
            }
        }
        Event::Error { message } => writeln!(out, "[{at:7.2}] error: {message}")?,
        _ => {}
    }
    out.flush()?;
    Ok(())
}

/// Microphone in, speaker out: each captured chunk is pushed, and as much reply audio as
/// the chunk lasted is pulled and played (what was pulled counts as heard). Ctrl-C stops.
#[cfg(feature = "microphone")]
fn live(args: &TalkArgs, models: VoiceModels, vad: sapient_audio::SileroVad, opts: VoiceOptions) -> Result<()> {
    use sapient_audio::AudioStream;
    let mut mic = sapient_audio::MicInput::open(args.mic.as_deref()).context("opening the microphone")?;
    let speaker = sapient_audio::SpeakerOutput::open(args.speaker.as_deref()).context("opening the speaker")?;
    let mut lp = VoiceLoop::new(models, vad, VoiceOptions { input_rate: mic.sample_rate(), ..opts })?;
    let mut to_device = sapient_audio::Resampler::new(lp.output_rate(), speaker.sample_rate())?;
    eprintln!("talking on {} -> {}; Ctrl-C to stop{}", mic.device_name(), speaker.device_name(), if args.no_barge_in { "" } else { " (use headphones: barge-in hears the speaker otherwise)" });
    let (mut heard_in, mut pulled) = (0u64, 0u64);
    let mut out = std::io::stdout().lock();
    while let Some(chunk) = mic.next_chunk() {
        let chunk = chunk?;
        lp.push_audio(&chunk)?;
        heard_in += chunk.len() as u64;
        let due = heard_in * u64::from(lp.output_rate()) / u64::from(mic.sample_rate());
        let reply = lp.pull_audio((due - pulled) as usize, false);
        pulled = due;
        speaker.push(&to_device.process(&reply)?);
        let t = heard_in * 1000 / u64::from(mic.sample_rate());
        for ev in lp.drain_events() {
            if matches!(ev, Event::Interrupted { .. }) {
                speaker.clear();
            }
            print_event(&mut out, t, &ev, args.stats)?;
        }
    }
    Ok(())
}

#[cfg(not(feature = "microphone"))]
fn live(args: &TalkArgs, _: VoiceModels, _: sapient_audio::SileroVad, _: VoiceOptions) -> Result<()> {
    let _ = (&args.mic, &args.speaker);
    anyhow::bail!("live talk needs the microphone and speaker: build with --features microphone, or give --input FILE")
}
