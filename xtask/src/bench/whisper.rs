//! `cargo xtask bench whisper`: sapient-whisper against faster-whisper (CTranslate2) on the
//! same CTranslate2 weights and the same audio, in the same run: real-time factor for
//! greedy and beam 5, and word error rate against the LibriVox transcripts.
//!
//! The audio is the five LibriVox clips with a second of silence after each, repeated
//! (`--repeat`, default 2: 59.5 s, two 30 s windows and a third partial one; `--long`:
//! eight times, 3.97 min, the long-form case).
//!
//! Each configuration runs in a process of its own (ours: this binary again, one variant;
//! faster-whisper: one compute type and mode per Python process), so that its peak resident
//! set size is its own. faster-whisper runs sequentially (`WhisperModel.transcribe`, what
//! ours does) and, with `--modes sequential,batched`, batched (ours: `LongForm::Batched`; theirs: `BatchedInferencePipeline`,
//! batch 8, its VAD).

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
    /// The long-form case: the clips eight times over (overrides --repeat).
    #[arg(long)]
    pub long: bool,
    /// Modes, for both sides: sequential, batched (ours: `LongForm::Batched`, batch 8,
    /// without timestamps as faster-whisper's `BatchedInferencePipeline` by default).
    #[arg(long, value_delimiter = ',', default_value = "sequential")]
    pub modes: Vec<String>,
    /// Ours without Silero VAD (`sapient transcribe --no-vad`); by default the VAD is
    /// attached as the CLI attaches it.
    #[arg(long)]
    pub no_vad: bool,
    #[arg(long, default_value = "target/bench/whisper.json")]
    pub json: PathBuf,
    /// Internal: run our side for one variant on this 16 kHz WAV and write JSON to --child-out.
    #[arg(long, hide = true)]
    pub child: Option<PathBuf>,
    #[arg(long, hide = true)]
    pub child_out: Option<PathBuf>,
}

/// Peak resident set size of this process in kB (Linux `VmHWM`), 0 where unknown.
pub fn peak_rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()))
        .unwrap_or(0)
}

pub(crate) fn load_options(variant: &str) -> Result<sapient_whisper::LoadOptions> {
    let q = Some(candle_core::quantized::GgmlDType::Q8_0);
    Ok(match variant {
        "f32" => sapient_whisper::LoadOptions::f32(),
        "q8_0" => sapient_whisper::LoadOptions::quantized(candle_core::quantized::GgmlDType::Q8_0),
        "q8_0-decoder" => sapient_whisper::LoadOptions { quantize_decoder: q, ..sapient_whisper::LoadOptions::f32() },
        other => anyhow::bail!("--variants {other}: expected f32, q8_0 or q8_0-decoder"),
    })
}

/// Our side of one variant, in this (child) process.
fn run_child(a: &Args, wav: &std::path::Path, out: &std::path::Path) -> Result<()> {
    let variant = a.variants.first().context("no variant")?;
    let audio = sapient_audio::decode_file(wav)?.samples;
    let t0 = Instant::now();
    let mut t = Transcriber::load_with(&a.model, &candle_core::Device::Cpu, load_options(variant)?, &mut |_| {})?;
    if !a.no_vad {
        let hub = sapient_hub::Hub::new()?;
        let vad = hub.fetch_preset("silero-vad", &mut |_| {})?.file("onnx")?.to_path_buf();
        t.set_vad(Some(sapient_audio::SileroVad::load(&vad, &candle_core::Device::Cpu)?));
    }
    let load_s = t0.elapsed().as_secs_f64();
    let mut runs = Vec::new();
    for mode in &a.modes {
        for &beam in &a.beams {
            // English, as faster-whisper is told (`language="en"`): no language detection on
            // either side
            let language = t.tokenizer.multilingual.then(|| "en".to_string());
            let mut opts = TranscribeOptions { beam_size: (beam > 1).then_some(beam), language, ..Default::default() };
            if mode == "batched" {
                // faster-whisper's BatchedInferencePipeline defaults: batch 8, no timestamps
                opts.long_form = sapient_whisper::LongForm::Batched { batch_size: sapient_whisper::DEFAULT_BATCH_SIZE };
                opts.without_timestamps = true;
            }
            let mut best = f64::INFINITY;
            let mut text = String::new();
            for _ in 0..a.reps.max(1) {
                let t1 = Instant::now();
                let r = t.transcribe(&audio, &opts)?;
                best = best.min(t1.elapsed().as_secs_f64());
                text = r.text;
            }
            runs.push(serde_json::json!({"mode": mode, "beam": beam, "seconds": best, "text": text}));
        }
    }
    let j = serde_json::json!({"variant": variant, "load_seconds": load_s, "peak_rss_kb": peak_rss_kb(), "runs": runs});
    std::fs::write(out, serde_json::to_string(&j)?)?;
    Ok(())
}

pub fn run(a: Args) -> Result<()> {
    if let (Some(wav), Some(out)) = (&a.child, &a.child_out) {
        return run_child(&a, wav, out);
    }
    let hub = sapient_hub::Hub::new()?;
    let clips = hub.fetch_preset("speech-librivox", &mut |_| {})?;
    let model = hub.fetch_preset(&a.model, &mut |_| {})?;
    let transcripts = std::fs::read_to_string(clips.file("transcription")?)?;
    let mut audio = Vec::new();
    let mut reference = String::new();
    let repeat = if a.long { 8 } else { a.repeat.max(1) };
    for _ in 0..repeat {
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
    let wav = dir.join(if a.long { "whisper-speech-long.wav" } else { "whisper-speech.wav" });
    sapient_audio::write_wav(&wav, &audio, 16_000, sapient_audio::WavFormat::Pcm16)?;
    // both sides read the same 16-bit file
    let audio = sapient_audio::decode_file(&wav)?.samples;
    let duration = audio.len() as f64 / 16_000.0;
    println!("{}: {duration:.1} s of LibriVox speech ({} reference words), {} reps, best time", a.model, normalize(&reference).len(), a.reps);

    let mut load_s = f64::NAN;
    for mode in &a.modes {
        anyhow::ensure!(mode == "sequential" || mode == "batched", "--modes {mode}: expected sequential or batched");
        anyhow::ensure!(mode == "sequential" || !a.no_vad, "--modes batched: ours needs the VAD (leave out --no-vad)");
    }
    // (variant, mode, beam, seconds, text, peak RSS kB)
    let mut ours: Vec<(String, String, usize, f64, String, u64)> = Vec::new();
    let exe = std::env::current_exe()?;
    for v in &a.variants {
        load_options(v)?;
        let out = dir.join(format!("whisper-child-{v}.json"));
        let beams: Vec<String> = a.beams.iter().map(|b| b.to_string()).collect();
        let mut cmd = std::process::Command::new(&exe);
        cmd.args(["bench", "whisper", "--model", &a.model, "--variants", v, "--beams", &beams.join(","), "--reps", &a.reps.max(1).to_string()]);
        cmd.args(["--modes", &a.modes.join(",")]);
        cmd.arg("--child").arg(&wav).arg("--child-out").arg(&out);
        if a.no_vad {
            cmd.arg("--no-vad");
        }
        let st = cmd.stdout(std::process::Stdio::null()).status().context("running our side")?;
        anyhow::ensure!(st.success(), "our side ({v}) failed: {st}");
        let j: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out)?)?;
        if v == "f32" || load_s.is_nan() {
            load_s = j["load_seconds"].as_f64().unwrap_or(f64::NAN);
        }
        let rss = j["peak_rss_kb"].as_u64().unwrap_or(0);
        for r in j["runs"].as_array().into_iter().flatten() {
            let beam = r["beam"].as_u64().unwrap_or(0) as usize;
            let mode = r["mode"].as_str().unwrap_or("sequential").to_string();
            ours.push((v.clone(), mode, beam, r["seconds"].as_f64().unwrap_or(f64::NAN), r["text"].as_str().unwrap_or("").to_string(), rss));
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
            let mut all: Vec<serde_json::Value> = Vec::new();
            let mut versions = (String::new(), String::new());
            for mode in &a.modes {
                anyhow::ensure!(mode == "sequential" || mode == "batched", "--modes {mode}: expected sequential or batched");
                for ct in &a.compute_types {
                    let out = std::process::Command::new(py)
                        .arg(&script)
                        .arg(&model.dir)
                        .arg(&wav)
                        .arg(a.threads.to_string())
                        .arg(ct)
                        .arg(beams.join(","))
                        .arg(a.reps.max(1).to_string())
                        .arg(mode)
                        .output()
                        .with_context(|| format!("running {}", py.display()))?;
                    anyhow::ensure!(out.status.success(), "bench_reference.py failed: {}", String::from_utf8_lossy(&out.stderr));
                    let j = serde_json::from_slice::<serde_json::Value>(&out.stdout).context("bench_reference.py output")?;
                    versions = (j["faster_whisper"].as_str().unwrap_or("?").into(), j["ctranslate2"].as_str().unwrap_or("?").into());
                    for mut r in j["runs"].as_array().cloned().unwrap_or_default() {
                        r["peak_rss_kb"] = j["peak_rss_kb"].clone();
                        all.push(r);
                    }
                }
            }
            Some(serde_json::json!({"faster_whisper": versions.0, "ctranslate2": versions.1, "runs": all}))
        }
    };

    println!(
        "{:<40} {:>9} {:>8} {:>10} {:>9} {:>13} {:>12}",
        "", "seconds", "RTF", "WER", "peak MB", "fw / ours f32", "fw / ours q8"
    );
    let mut rows = Vec::new();
    for (variant, mode, beam, secs, text, rss) in &ours {
        let (e, n) = wer(&reference, text);
        println!(
            "{:<40} {:>9.2} {:>8.3} {:>4}/{:<5} {:>9.0}",
            format!("sapient-whisper {variant} {mode}, beam {beam}"),
            secs,
            secs / duration,
            e,
            n,
            *rss as f64 / 1024.0
        );
        rows.push(serde_json::json!({"impl": "sapient-whisper", "compute_type": variant, "mode": mode, "beam": beam, "seconds": secs, "rtf": secs / duration, "word_errors": e, "words": n, "peak_rss_kb": rss, "vad": !a.no_vad, "text": text}));
    }
    if let Some(r) = &reference_runs {
        for run in r["runs"].as_array().into_iter().flatten() {
            let beam = run["beam"].as_u64().unwrap_or(0) as usize;
            let secs = run["seconds"].as_f64().unwrap_or(f64::NAN);
            let text = run["text"].as_str().unwrap_or("");
            let ct = run["compute_type"].as_str().unwrap_or("?");
            let mode = run["mode"].as_str().unwrap_or("sequential");
            let rss = run["peak_rss_kb"].as_u64().unwrap_or(0);
            let (e, n) = wer(&reference, text);
            // against ours in the same mode
            let ratio = |v: &str| ours.iter().find(|o| o.0 == v && o.1 == mode && o.2 == beam).map(|o| format!("{:.2}x", secs / o.3)).unwrap_or_default();
            println!(
                "{:<40} {:>9.2} {:>8.3} {:>4}/{:<5} {:>9.0} {:>13} {:>12}",
                format!("faster-whisper {ct} {mode}, beam {beam}"),
                secs,
                secs / duration,
                e,
                n,
                rss as f64 / 1024.0,
                ratio("f32"),
                ratio("q8_0")
            );
            rows.push(serde_json::json!({"impl": "faster-whisper", "compute_type": ct, "mode": mode, "beam": beam, "seconds": secs, "rtf": secs / duration, "word_errors": e, "words": n, "peak_rss_kb": rss, "text": text}));
        }
        println!(
            "faster-whisper {} (ctranslate2 {}), {} threads; peak MB: each configuration's whole process (ours: one variant, all beams; faster-whisper: one compute type and mode)",
            r["faster_whisper"].as_str().unwrap_or("?"),
            r["ctranslate2"].as_str().unwrap_or("?"),
            a.threads
        );
    }
    println!("sapient-whisper load (CTranslate2 import in memory{}): {load_s:.2} s", if a.no_vad { "" } else { ", Silero VAD" });
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
