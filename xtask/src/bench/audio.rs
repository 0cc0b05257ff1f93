//! `cargo xtask bench audio`: Whisper log-mel (30 s and 10 min) and Silero VAD (10 min) in
//! sapient-audio, and the Python references on the same audio in the same run (numpy mel,
//! onnxruntime Silero, `scripts/audio/bench_reference.py`), printed as ratios.

use anyhow::{Context, Result};
use candle_core::Device;
use sapient_audio::{decode_file, resample, LogMel, SileroVad};
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// Python with numpy and onnxruntime for the reference side (a venv outside the repo);
    /// without it only sapient-audio is timed.
    #[arg(long, env = "SAPIENT_REF_PYTHON")]
    pub python: Option<PathBuf>,
    /// Repetitions (best time is kept).
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Length of the long runs (log-mel and VAD), in minutes.
    #[arg(long, default_value_t = 10.0)]
    pub minutes: f64,
    /// Where to write the JSON results.
    #[arg(long, default_value = "target/bench/audio.json")]
    pub json: PathBuf,
}

fn best<T>(reps: usize, mut f: impl FnMut() -> Result<T>) -> Result<(f64, T)> {
    let mut best = f64::INFINITY;
    let mut last = None;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        let v = f()?;
        best = best.min(t.elapsed().as_secs_f64());
        last = Some(v);
    }
    Ok((best, last.context("no repetition ran")?))
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("model name")).map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string()))
        .unwrap_or_else(|| "unknown CPU".into())
}

pub fn run(a: Args) -> Result<()> {
    let hub = sapient_hub::Hub::new()?;
    let clips = hub.fetch_preset("speech-librivox", &mut |_| {})?;
    let vad_files = hub.fetch_preset("silero-vad", &mut |_| {})?;
    let assets = hub.fetch_preset("whisper-assets", &mut |_| {})?;
    let filters = assets.file("mel_filters")?.to_path_buf();
    let onnx = vad_files.file("onnx")?.to_path_buf();

    // Real speech, the five clips over and over, up to the long length.
    let mut speech = Vec::new();
    for p in clips.files("audio") {
        speech.extend(decode_file(p)?.into_16k()?.samples);
    }
    anyhow::ensure!(!speech.is_empty(), "no LibriVox clips");
    let long = (a.minutes * 60.0 * 16_000.0) as usize;
    let audio: Vec<f32> = speech.iter().copied().cycle().take(long.max(30 * 16_000)).collect();
    let s30 = &audio[..30 * 16_000];
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    println!("sapient-audio bench on {} ({threads} threads), {:.1} min of LibriVox speech, best of {}", cpu_model(), a.minutes, a.reps);

    let mel = LogMel::new(80)?;
    let (t_mel30, m) = best(a.reps, || Ok(mel.log_mel(s30)?))?;
    anyhow::ensure!(m.n_frames == 3000, "30 s gives {} frames", m.n_frames);
    let (t_mel_long, _) = best(a.reps, || Ok(mel.log_mel(&audio)?))?;
    let (t_mel_stream, n) = best(a.reps, || {
        let mut s = mel.stream();
        for c in audio.chunks(1600) {
            s.push(c)?;
        }
        s.finish()?;
        Ok(s.n_frames())
    })?;
    anyhow::ensure!(n == audio.len() / 160);

    let mut vad = SileroVad::load(&onnx, &Device::Cpu)?;
    let (t_vad, probs) = best(a.reps.min(2), || Ok(vad.probabilities(&audio)?))?;
    let voiced = probs.iter().filter(|&&p| p >= 0.5).count() as f64 / probs.len() as f64;
    // Streaming: one 512-sample window per call, as a live microphone feeds it.
    let n_stream = probs.len().min(3750); // 2 minutes
    vad.reset();
    let t = Instant::now();
    for w in audio.chunks_exact(512).take(n_stream) {
        vad.process_window(w)?;
    }
    let t_vad_window = t.elapsed().as_secs_f64() / n_stream as f64;

    let x48 = resample(&audio, 16_000, 48_000)?;
    let (t_res, _) = best(a.reps, || Ok(resample(&x48, 48_000, 16_000)?))?;

    let secs_long = audio.len() as f64 / 16_000.0;
    let mut results = serde_json::json!({
        "cpu": cpu_model(),
        "threads": threads,
        "audio_s": secs_long,
        "ours": {
            "mel80_30s_s": t_mel30,
            "mel80_long_s": t_mel_long,
            "mel80_long_stream_s": t_mel_stream,
            "vad_long_s": t_vad,
            "vad_window_us": t_vad_window * 1e6,
            "resample_48k_to_16k_long_s": t_res,
            "vad_voiced_fraction": voiced,
        },
    });
    println!("{:<44} {:>12} {:>12} {:>9}", "", "sapient", "reference", "ref/ours");
    let row = |name: &str, ours: f64, reference: Option<f64>| match reference {
        Some(r) => println!("{name:<44} {:>10.1}ms {:>10.1}ms {:>8.1}x", ours * 1e3, r * 1e3, r / ours),
        None => println!("{name:<44} {:>10.1}ms {:>12} {:>9}", ours * 1e3, "-", "-"),
    };

    let reference = match &a.python {
        None => {
            println!("(no --python / SAPIENT_REF_PYTHON: reference side skipped)");
            None
        }
        Some(py) => {
            let dir = PathBuf::from("target/bench");
            std::fs::create_dir_all(&dir)?;
            let raw = dir.join("audio-bench.f32");
            std::fs::write(&raw, audio.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())?;
            let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/audio/bench_reference.py");
            let out = std::process::Command::new(py)
                .arg(&script)
                .arg("--audio")
                .arg(&raw)
                .arg("--filters")
                .arg(&filters)
                .arg("--onnx")
                .arg(&onnx)
                .args(["--mel-seconds", "30", &format!("{secs_long}"), "--vad-seconds", &format!("{secs_long}")])
                .args(["--reps", &a.reps.to_string()])
                .output()
                .with_context(|| format!("running {}", py.display()))?;
            let _ = std::fs::remove_file(&raw);
            anyhow::ensure!(out.status.success(), "bench_reference.py failed: {}", String::from_utf8_lossy(&out.stderr));
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).context("bench_reference.py output")?;
            Some(v)
        }
    };
    let mel_ref = |k: &str| reference.as_ref().and_then(|r| r["mel_s"][k].as_f64());
    let long_key = format!("{}", secs_long as i64);
    row("log-mel 80, 30 s (numpy)", t_mel30, mel_ref("30"));
    row(&format!("log-mel 80, {:.0} min (numpy)", secs_long / 60.0), t_mel_long, mel_ref(&long_key));
    row(&format!("log-mel 80, {:.0} min, streamed in 100 ms chunks", secs_long / 60.0), t_mel_stream, mel_ref(&long_key));
    let vad_ref = reference.as_ref().and_then(|r| r["vad_s"].as_f64());
    row(&format!("Silero VAD, {:.0} min (onnxruntime, per window)", secs_long / 60.0), t_vad, vad_ref);
    row(&format!("resample 48k->16k, {:.0} min", secs_long / 60.0), t_res, None);
    println!(
        "VAD streaming: {:.0} us per 32 ms window ({:.0}x real time); batched {:.0}x real time",
        t_vad_window * 1e6,
        0.032 / t_vad_window,
        secs_long / t_vad
    );
    if let Some(r) = reference {
        println!("reference: numpy {}, onnxruntime {}", r["numpy"].as_str().unwrap_or("?"), r["onnxruntime"].as_str().unwrap_or("?"));
        results["reference"] = r;
    }
    if let Some(parent) = a.json.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&a.json, serde_json::to_string_pretty(&results)?)?;
    println!("results written to {}", a.json.display());
    Ok(())
}
