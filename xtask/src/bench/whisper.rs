//! `cargo xtask bench whisper`: sapient-whisper against faster-whisper (CTranslate2) on the
//! same CTranslate2 weights and the same audio, in the same run: real-time factor for
//! greedy and beam 5, and word error rate against the LibriVox transcripts.
//!
//! The audio is the five LibriVox clips with a second of silence after each, repeated
//! (`--repeat`, default 2: about 55 s, two 30 s windows and a third partial one).

use anyhow::{Context, Result};
use sapient_whisper::eval::{normalize, wer_counts as wer};
use sapient_whisper::{TranscribeOptions, Transcriber};
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// Preset to run (`whisper-tiny.en`, `whisper-base`).
    #[arg(long, default_value = "whisper-tiny.en")]
    pub model: String,
    /// Python with faster-whisper (a venv outside the repo); without it only ours is timed.
    #[arg(long, env = "SAPIENT_REF_PYTHON")]
    pub python: Option<PathBuf>,
    /// Beam sizes (1 = greedy).
    #[arg(long, value_delimiter = ',', default_value = "1,5")]
    pub beams: Vec<usize>,
    /// faster-whisper compute types.
    #[arg(long, value_delimiter = ',', default_value = "int8,float32")]
    pub compute_types: Vec<String>,
    /// Threads for faster-whisper (ours uses the machine's cores through candle).
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Repetitions (best time is kept).
    #[arg(long, default_value_t = 2)]
    pub reps: usize,
    /// How many times the five clips are repeated.
    #[arg(long, default_value_t = 2)]
    pub repeat: usize,
    /// Our variants: f32, q8_0 (encoder and decoder matrices in Q8_0), q8_0-decoder.
    #[arg(long, value_delimiter = ',', default_value = "f32,q8_0")]
    pub variants: Vec<String>,
    #[arg(long, default_value = "target/bench/whisper.json")]
    pub json: PathBuf,
}

pub fn run(a: Args) -> Result<()> {
    let hub = sapient_hub::Hub::new()?;
    let clips = hub.fetch_preset("speech-librivox", &mut |_| {})?;
    let model = hub.fetch_preset(&a.model, &mut |_| {})?;
    let transcripts = std::fs::read_to_string(clips.file("transcription")?)?;
    let mut audio = Vec::new();
    let mut reference = String::new();
    for _ in 0..a.repeat.max(1) {
        for p in clips.files("audio") {
            audio.extend(sapient_audio::decode_file(p)?.into_16k()?.samples);
            audio.extend(std::iter::repeat_n(0.0f32, 16_000));
            let stem = p.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
            let line = transcripts.lines().find(|l| l.contains(&format!("({stem})"))).with_context(|| format!("no transcript for {stem}"))?;
            reference.push_str(&line.replace(&format!("({stem})"), "").replace("<s>", "").replace("</s>", ""));
            reference.push(' ');
        }
    }
    let dir = PathBuf::from("target/bench");
    std::fs::create_dir_all(&dir)?;
    let wav = dir.join("whisper-speech.wav");
    sapient_audio::write_wav(&wav, &audio, 16_000, sapient_audio::WavFormat::Pcm16)?;
    // both sides read the same 16-bit file
    let audio = sapient_audio::decode_file(&wav)?.samples;
    let duration = audio.len() as f64 / 16_000.0;
    println!("{}: {duration:.1} s of LibriVox speech ({} reference words), {} reps, best time", a.model, normalize(&reference).len(), a.reps);

    let mut load_s = f64::NAN;
    let mut models = Vec::new();
    for v in &a.variants {
        let q = Some(candle_core::quantized::GgmlDType::Q8_0);
        let load = match v.as_str() {
            "f32" => sapient_whisper::LoadOptions::default(),
            "q8_0" => sapient_whisper::LoadOptions { quantize_decoder: q, quantize_encoder: q },
            "q8_0-decoder" => sapient_whisper::LoadOptions { quantize_decoder: q, ..Default::default() },
            other => anyhow::bail!("--variants {other}: expected f32, q8_0 or q8_0-decoder"),
        };
        let t0 = Instant::now();
        let t = Transcriber::load_with(&a.model, &candle_core::Device::Cpu, load, &mut |_| {})?;
        if v == "f32" {
            load_s = t0.elapsed().as_secs_f64();
        }
        models.push((v.as_str(), t));
    }
    let mut ours = Vec::new();
    for (variant, t) in &models {
        let variant = *variant;
        for &beam in &a.beams {
            let opts = TranscribeOptions { beam_size: (beam > 1).then_some(beam), ..Default::default() };
            let mut best = f64::INFINITY;
            let mut text = String::new();
            for _ in 0..a.reps.max(1) {
                let t1 = Instant::now();
                let r = t.transcribe(&audio, &opts)?;
                best = best.min(t1.elapsed().as_secs_f64());
                text = r.text;
            }
            ours.push((variant, beam, best, text));
        }
    }

    let reference_runs = match &a.python {
        None => {
            println!("(no --python / SAPIENT_REF_PYTHON: faster-whisper side skipped)");
            None
        }
        Some(py) => {
            let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/whisper/bench_reference.py");
            let beams: Vec<String> = a.beams.iter().map(|b| b.to_string()).collect();
            let out = std::process::Command::new(py)
                .arg(&script)
                .arg(&model.dir)
                .arg(&wav)
                .arg(a.threads.to_string())
                .arg(a.compute_types.join(","))
                .arg(beams.join(","))
                .arg(a.reps.max(1).to_string())
                .output()
                .with_context(|| format!("running {}", py.display()))?;
            anyhow::ensure!(out.status.success(), "bench_reference.py failed: {}", String::from_utf8_lossy(&out.stderr));
            Some(serde_json::from_slice::<serde_json::Value>(&out.stdout).context("bench_reference.py output")?)
        }
    };

    println!("{:<34} {:>9} {:>8} {:>10} {:>12} {:>12}", "", "seconds", "RTF", "WER", "fw / ours f32", "fw / ours q8");
    let mut rows = Vec::new();
    for (variant, beam, secs, text) in &ours {
        let (e, n) = wer(&reference, text);
        println!(
            "{:<34} {:>9.2} {:>8.3} {:>4}/{:<5} {:>12}",
            format!("sapient-whisper {variant}, beam {beam}"),
            secs,
            secs / duration,
            e,
            n,
            ""
        );
        rows.push(serde_json::json!({"impl": "sapient-whisper", "compute_type": variant, "beam": beam, "seconds": secs, "rtf": secs / duration, "word_errors": e, "words": n, "text": text}));
    }
    if let Some(r) = &reference_runs {
        for run in r["runs"].as_array().into_iter().flatten() {
            let beam = run["beam"].as_u64().unwrap_or(0) as usize;
            let secs = run["seconds"].as_f64().unwrap_or(f64::NAN);
            let text = run["text"].as_str().unwrap_or("");
            let ct = run["compute_type"].as_str().unwrap_or("?");
            let (e, n) = wer(&reference, text);
            let ratio = |v: &str| ours.iter().find(|o| o.0 == v && o.1 == beam).map(|o| format!("{:.2}x", secs / o.2)).unwrap_or_default();
            println!(
                "{:<34} {:>9.2} {:>8.3} {:>4}/{:<5} {:>12} {:>12}",
                format!("faster-whisper {ct}, beam {beam}"),
                secs,
                secs / duration,
                e,
                n,
                ratio("f32"),
                ratio("q8_0")
            );
            rows.push(serde_json::json!({"impl": "faster-whisper", "compute_type": ct, "beam": beam, "seconds": secs, "rtf": secs / duration, "word_errors": e, "words": n, "text": text}));
        }
        println!(
            "faster-whisper {} (ctranslate2 {}), {} threads",
            r["faster_whisper"].as_str().unwrap_or("?"),
            r["ctranslate2"].as_str().unwrap_or("?"),
            a.threads
        );
    }
    println!("sapient-whisper load (CTranslate2 import in memory): {load_s:.2} s");
    if let Some(parent) = a.json.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(
        &a.json,
        serde_json::to_string_pretty(&serde_json::json!({"model": a.model, "audio_seconds": duration, "load_seconds": load_s, "runs": rows}))?,
    )?;
    println!("wrote {}", a.json.display());
    Ok(())
}
