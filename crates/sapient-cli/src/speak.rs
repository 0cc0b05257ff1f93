//! `sapient speak "text" -o out.wav`: text to speech with Kokoro-82M (English G2P).

use anyhow::{bail, Context, Result};
use clap::Args;
use sapient_kokoro::KokoroTts;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args)]
pub struct SpeakArgs {
    /// Text to speak; read from standard input when left out.
    text: Option<String>,
    /// Voice name, or a blend `name:weight,name:weight` (weights normalised), e.g.
    /// `jf_alpha:0.6,jm_kumo:0.4`. The preset has jf_alpha, jf_gongitsune, jf_nezumi,
    /// jf_tebukuro, jm_kumo.
    #[arg(long, default_value = "jf_alpha")]
    voice: String,
    /// Speaking rate (0.25 to 4; durations are divided by it).
    #[arg(long, default_value_t = 1.0)]
    speed: f32,
    /// The kokoro-82m preset, or a directory with its files.
    #[arg(short, long, default_value = "kokoro-82m", env = "SAPIENT_TTS_MODEL")]
    model: String,
    /// Output WAV file (24 kHz mono, 16-bit PCM).
    #[arg(short, long, default_value = "speech.wav")]
    output: PathBuf,
    /// Print the phonemes (one line per chunk) and stop, without synthesizing.
    #[arg(long)]
    phonemes: bool,
    /// Progress per chunk, time to first audio and real-time factor on standard error.
    #[arg(long)]
    stats: bool,
    /// List the voices and stop.
    #[arg(long)]
    list_voices: bool,
    /// Also write when each word is spoken, as JSON (`[{"word", "start", "end"}]`, seconds),
    /// from the durations the model predicts for the word's phonemes.
    #[arg(long, value_name = "FILE")]
    timestamps: Option<PathBuf>,
}

pub fn run(args: SpeakArgs) -> Result<()> {
    let text = match &args.text {
        Some(t) => t.clone(),
        None if !args.list_voices => {
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s).context("reading the text from standard input")?;
            s
        }
        None => String::new(),
    };
    let mut bars = crate::Bars::default();
    let hub = sapient_hub::Hub::new()?;
    let dir = kokoro_dir(&hub, &args.model, &mut bars)?;
    let t_load = Instant::now();
    if args.phonemes {
        // no model needed to print phonemes
        let g2p = sapient_kokoro::G2p::from_dir(&dir)?;
        let chunks = sapient_kokoro::text::chunks(&g2p, &text, sapient_kokoro::MAX_PHONEMES);
        if chunks.is_empty() {
            bail!("nothing speakable in the input");
        }
        for c in chunks {
            println!("{}", c.phonemes);
        }
        return Ok(());
    }
    let tts = KokoroTts::from_dir(&dir, &candle_core::Device::Cpu)
        .with_context(|| format!("loading Kokoro from {}", dir.display()))?;
    if args.list_voices {
        for v in tts.voices().names() {
            println!("{v}");
        }
        return Ok(());
    }
    let load_s = t_load.elapsed().as_secs_f64();
    let t0 = Instant::now();
    let stream = tts.stream(&text, &args.voice, args.speed)?;
    let n = stream.remaining();
    let mut samples = Vec::new();
    let mut words = Vec::new();
    let mut first_audio = None;
    for (i, chunk) in stream.enumerate() {
        let chunk = chunk?;
        if first_audio.is_none() {
            first_audio = Some(t0.elapsed().as_secs_f64());
        }
        if args.stats {
            let secs = chunk.samples.len() as f64 / f64::from(tts.sample_rate());
            eprintln!("[{}/{n}] {:.2} s of audio at {:.2} s: {}", i + 1, secs, t0.elapsed().as_secs_f64(), chunk.text);
        }
        samples.extend(chunk.samples);
        words.extend(chunk.words);
    }
    let total = t0.elapsed().as_secs_f64();
    sapient_audio::write_wav(&args.output, &samples, tts.sample_rate(), sapient_audio::WavFormat::Pcm16)
        .with_context(|| format!("writing {}", args.output.display()))?;
    if args.stats {
        let audio_s = samples.len() as f64 / f64::from(tts.sample_rate());
        let mut e = std::io::stderr().lock();
        writeln!(
            e,
            "load {load_s:.2} s; {n} chunks, {audio_s:.2} s of audio in {total:.2} s (real-time factor {:.3}); first audio after {:.2} s",
            total / audio_s.max(1e-9),
            first_audio.unwrap_or(total)
        )?;
    }
    eprintln!("wrote {}", args.output.display());
    if let Some(path) = &args.timestamps {
        std::fs::write(path, serde_json::to_string_pretty(&words)?).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {} ({} words)", path.display(), words.len());
    }
    Ok(())
}

/// The directory of a Kokoro preset (fetched if needed) or of a given model file.
pub(crate) fn kokoro_dir(hub: &sapient_hub::Hub, model: &str, bars: &mut crate::Bars) -> Result<PathBuf> {
    let resolved = hub.resolve(model, &mut |p| bars.update(p))?;
    Ok(if resolved.dir.is_dir() {
        resolved.dir.clone()
    } else {
        resolved.file("onnx")?.parent().map(|p| p.to_path_buf()).unwrap_or_default()
    })
}
