//! `sapient listen` (feature `microphone`): live transcription of the default (or a named)
//! input device through the streaming transcriber. Decided segments go to standard output as
//! they are decided; partial (unconfirmed) text at each pause goes to standard error.

use anyhow::{Context, Result};
use clap::Args;
use sapient_audio::AudioStream;
use sapient_whisper::{StreamMode, StreamingTranscriber, TranscribeOptions, Transcriber};
use std::io::Write;

#[derive(Args)]
pub struct ListenArgs {
    /// Whisper preset (`whisper-tiny.en`, `whisper-base`), a CTranslate2 or transformers
    /// directory, or a model.bin.
    #[arg(short, long, default_value = "whisper-tiny.en", env = "SAPIENT_WHISPER_MODEL")]
    model: String,
    /// Input device whose name contains this (default: the host's default input).
    #[arg(long)]
    device: Option<String>,
    /// Language code; detected on the first window when left out (multilingual models).
    #[arg(short, long)]
    language: Option<String>,
    /// Beam size at temperature 0 (1 = greedy).
    #[arg(long, default_value_t = 1)]
    beam: usize,
    /// q8_0 (int8 matrices, faster on the CPU) or none.
    #[arg(long, default_value = "q8_0")]
    quant: String,
    /// `windows` (the file mode's 30 s windows: the text `sapient transcribe` would give,
    /// decided up to 30 s late, with partial text at each pause) or `vad` (each stretch of
    /// speech decided about a second after it ends, not always the same text).
    #[arg(long, default_value = "windows")]
    stream_mode: String,
    /// Stop after this many seconds of audio (default: until interrupted).
    #[arg(long)]
    seconds: Option<f64>,
    /// Print the backlog (undecided audio, time left) with the partial text.
    #[arg(short, long)]
    verbose: bool,
}

pub fn run(args: ListenArgs) -> Result<()> {
    let mode: StreamMode = args.stream_mode.parse()?;
    let load = match args.quant.as_str() {
        "none" | "f32" => sapient_whisper::LoadOptions::f32(),
        "q8_0" => sapient_whisper::LoadOptions::quantized(candle_core::quantized::GgmlDType::Q8_0),
        other => anyhow::bail!("--quant {other}: expected none or q8_0"),
    };
    let mut bars = crate::Bars::default();
    let t = Transcriber::load_with(&args.model, &candle_core::Device::Cpu, load, &mut |p| bars.update(p))
        .with_context(|| format!("loading {}", args.model))?;
    let vad_file = sapient_hub::Hub::new()?.fetch_preset("silero-vad", &mut |p| bars.update(p))?.file("onnx")?.to_path_buf();
    bars.finish();
    let vad = sapient_audio::SileroVad::load(&vad_file, &candle_core::Device::Cpu)?;
    let mut mic = sapient_audio::MicInput::open(args.device.as_deref()).context("opening the microphone")?;
    eprintln!("listening on {} ({} Hz); Ctrl-C to stop", mic.device_name(), mic.sample_rate());
    let opts = TranscribeOptions {
        language: args.language.clone(),
        beam_size: (args.beam > 1).then_some(args.beam),
        ..Default::default()
    };
    let mut st = StreamingTranscriber::new(&t, vad, sapient_whisper::default_vad_options(), mic.sample_rate(), opts)?.with_mode(mode);
    let mut out = std::io::stdout();
    while let Some(chunk) = mic.next_chunk() {
        let up = st.push_update(&chunk?)?;
        for s in &up.segments {
            writeln!(out, "[{:7.2} -> {:7.2}] {}", s.start, s.end, s.text.trim())?;
            out.flush()?;
        }
        if let Some(p) = up.partial.filter(|p| !p.is_empty()) {
            if args.verbose {
                let b = up.backlog;
                let left = b.time_left_s.map(|s| format!("{s:.1} s")).unwrap_or_else(|| "?".into());
                eprintln!("  ... {p}  (undecided {:.1} s, time left {left})", b.undecided_s);
            } else {
                eprintln!("  ... {p}");
            }
        }
        if args.seconds.is_some_and(|s| st.seconds_received() >= s) {
            break;
        }
    }
    drop(mic);
    let (last, _) = st.finish()?;
    for s in &last {
        writeln!(out, "[{:7.2} -> {:7.2}] {}", s.start, s.end, s.text.trim())?;
    }
    out.flush()?;
    Ok(())
}
