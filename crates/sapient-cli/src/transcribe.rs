//! `sapient transcribe FILE`: speech to text with Whisper.

use anyhow::{Context, Result};
use clap::Args;
use sapient_whisper::{OutputFormat, Task, TranscribeOptions, Transcriber};
use std::io::Write;
use std::path::PathBuf;

#[derive(Args)]
pub struct TranscribeArgs {
    /// Audio file (WAV, FLAC, MP3, Ogg/Vorbis; any rate, mixed down to mono).
    file: PathBuf,
    /// Whisper preset (`whisper-tiny.en`, `whisper-base`), a CTranslate2 or transformers
    /// directory, or a model.bin.
    #[arg(short, long, default_value = "whisper-tiny.en", env = "SAPIENT_WHISPER_MODEL")]
    model: String,
    /// Language code (en, fr, de, ...); detected when left out (multilingual models).
    #[arg(short, long)]
    language: Option<String>,
    /// transcribe, or translate (into English).
    #[arg(long, default_value = "transcribe")]
    task: String,
    /// Beam size at temperature 0 (1 = greedy).
    #[arg(long, default_value_t = 5)]
    beam: usize,
    /// Beam search patience.
    #[arg(long, default_value_t = 1.0)]
    patience: f32,
    /// Candidates sampled per window when falling back to temperatures above 0.
    #[arg(long, default_value_t = 5)]
    best_of: usize,
    /// Decode at temperature 0 only (no fallback on repetitive or unlikely output).
    #[arg(long)]
    no_fallback: bool,
    /// Do not condition a window on the previous window's text.
    #[arg(long)]
    no_condition: bool,
    /// Text that the first window continues (names, spelling, style).
    #[arg(long)]
    initial_prompt: Option<String>,
    /// Quantize the encoder's and decoder's matrices at load: q8_0 (int8 products, the
    /// counterpart of faster-whisper's int8; about 2.5x faster than f32 at the same word
    /// errors) or none (f32).
    #[arg(long, default_value = "q8_0")]
    quant: String,
    /// With `--quant none`: quantize only the decoder (and output projection) at load, q8_0
    /// or none.
    #[arg(long, default_value = "none")]
    decoder_quant: String,
    /// Seed of the sampler used by the temperature fallback.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Word-level timestamps (in the json output).
    #[arg(long)]
    word_timestamps: bool,
    /// Read the file as a stream (what a live source does); segments are printed as they
    /// are decided.
    #[arg(long)]
    stream: bool,
    /// With --stream: `windows` (the file mode's 30 s windows, decoded as their audio
    /// arrives: the same text as without --stream) or `vad` (each Silero VAD stretch on its
    /// own: segments about a second after their speech, not always the same text).
    #[arg(long, default_value = "windows")]
    stream_mode: String,
    /// text, srt, vtt or json.
    #[arg(short, long, default_value = "text")]
    format: String,
    /// Write the transcript here instead of standard output.
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// Print segments on standard error as they are decoded.
    #[arg(short, long)]
    verbose: bool,
    /// Do not consult Silero VAD (file mode): by default a 30 s window in which the VAD
    /// hears no speech is skipped when Whisper's no-speech probability agrees.
    #[arg(long)]
    no_vad: bool,
    /// Batched long-form mode (`--batched` or `--batched=N`): the VAD's speech in chunks of
    /// up to 30 s, N chunks (default 8) through the encoder and decoder together, no chunk
    /// conditioned on another's text. Faster on long audio; the default sequential mode (30 s
    /// windows conditioned on the previous text) keeps names and spelling consistent. Needs
    /// the VAD (not --no-vad).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "8", value_name = "N")]
    batched: Option<usize>,
}

pub fn run(args: TranscribeArgs) -> Result<()> {
    let format: OutputFormat = args.format.parse()?;
    let stream_mode: sapient_whisper::StreamMode = args.stream_mode.parse()?;
    let task: Task = args.task.parse()?;
    let mut bars = crate::Bars::default();
    let quant = |flag: &str, v: &str| match v {
        "none" | "f32" => Ok(None),
        "q8_0" => Ok(Some(candle_core::quantized::GgmlDType::Q8_0)),
        other => anyhow::bail!("--{flag} {other}: expected none or q8_0"),
    };
    let all = quant("quant", &args.quant)?;
    let load = sapient_whisper::LoadOptions {
        quantize_encoder: all,
        quantize_decoder: all.or(quant("decoder-quant", &args.decoder_quant)?),
        ..sapient_whisper::LoadOptions::f32()
    };
    let mut t = Transcriber::load_with(&args.model, &candle_core::Device::Cpu, load, &mut |p| bars.update(p))
        .with_context(|| format!("loading {}", args.model))?;
    if !args.no_vad && !args.stream {
        let vad_file = sapient_hub::Hub::new()?.fetch_preset("silero-vad", &mut |p| bars.update(p))?.file("onnx")?.to_path_buf();
        t.set_vad(Some(sapient_audio::SileroVad::load(&vad_file, &candle_core::Device::Cpu)?));
    }
    bars.finish();
    if let Some(n) = args.batched {
        anyhow::ensure!(n >= 1, "--batched {n}: the batch size must be at least 1");
        anyhow::ensure!(!args.no_vad, "--batched cuts the audio at the speech Silero VAD finds: leave out --no-vad");
        anyhow::ensure!(!args.stream, "--batched transcribes a whole file: leave out --stream");
    }
    let opts = TranscribeOptions {
        long_form: match args.batched {
            Some(batch_size) => sapient_whisper::LongForm::Batched { batch_size },
            None => sapient_whisper::LongForm::Sequential,
        },
        task,
        language: args.language.clone(),
        beam_size: (args.beam > 1).then_some(args.beam),
        patience: args.patience,
        best_of: args.best_of.max(1),
        condition_on_previous_text: !args.no_condition,
        initial_prompt: args.initial_prompt.clone(),
        word_timestamps: args.word_timestamps,
        seed: args.seed,
        temperatures: if args.no_fallback { vec![0.0] } else { TranscribeOptions::default().temperatures },
        ..Default::default()
    };
    let start = std::time::Instant::now();
    let verbose = args.verbose;
    let stream = args.stream;
    let mut print = |s: &sapient_whisper::Segment| {
        if verbose || stream {
            eprintln!("[{:7.2} -> {:7.2}] {}", s.start, s.end, s.text.trim());
        }
    };
    let r = if args.stream {
        let vad_file = sapient_hub::Hub::new()?.fetch_preset("silero-vad", &mut |p| bars.update(p))?.file("onnx")?.to_path_buf();
        let vad = sapient_audio::SileroVad::load(&vad_file, &candle_core::Device::Cpu)?;
        let file = sapient_audio::FileStream::open(&args.file).with_context(|| format!("reading {}", args.file.display()))?;
        t.transcribe_stream_mode(file, vad, sapient_whisper::default_vad_options(), stream_mode, &opts, &mut print)?
    } else {
        let audio = sapient_audio::decode_file(&args.file)
            .with_context(|| format!("reading {}", args.file.display()))?
            .into_16k()?;
        t.transcribe_with(&audio.samples, &opts, &mut print)?
    };
    let secs = start.elapsed().as_secs_f64();
    if verbose {
        eprintln!(
            "{:.1} s of audio in {secs:.2} s ({:.1}x real time), language {}",
            r.duration,
            r.duration / secs.max(1e-9),
            r.language
        );
    }
    let text = r.render(format);
    match &args.output {
        Some(p) => std::fs::write(p, text).with_context(|| format!("writing {}", p.display()))?,
        None => {
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes())?;
            out.flush()?;
        }
    }
    Ok(())
}
