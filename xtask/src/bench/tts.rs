//! `cargo xtask bench tts`: Kokoro-82M, sapient-kokoro against onnxruntime on the same int8
//! ONNX file (`kokoro-v1.0.int8.onnx` of the `kokoro-82m` preset), the same phoneme ids and
//! the same style rows, in the same run: real-time factor (seconds of compute per second of
//! audio) and time to first audio, sentence by sentence.
//!
//! The text is ten short English sentences (those of the round-trip test), one chunk each.
//! Our time to first audio is `KokoroTts::stream` from the text (G2P included) to the first
//! chunk's samples; onnxruntime's is its first chunk from the ids (no G2P on its side).

use anyhow::{Context, Result};
use sapient_kokoro::KokoroTts;
use std::path::PathBuf;
use std::time::Instant;

/// The speak round-trip test's ten sentences, one per line.
const SENTENCES: &str = include_str!("../../../tests/data/kokoro/sentences.txt");

#[derive(clap::Args)]
pub struct Args {
    /// Python with numpy and onnxruntime (a venv outside the repo); without it only ours is timed.
    #[arg(long, env = "SAPIENT_REF_PYTHON")]
    pub python: Option<PathBuf>,
    /// Voice (or blend) for the style rows.
    #[arg(long, default_value = "jf_alpha")]
    pub voice: String,
    #[arg(long, default_value_t = 1.0)]
    pub speed: f32,
    /// Threads for onnxruntime (intra-op); ours uses the machine's cores.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Repetitions after a warm-up pass (best time kept).
    #[arg(long, default_value_t = 2)]
    pub reps: usize,
    #[arg(long, default_value = "target/bench/tts.json")]
    pub json: PathBuf,
}

pub fn run(a: Args) -> Result<()> {
    let hub = sapient_hub::Hub::new()?;
    let preset = hub.fetch_preset("kokoro-82m", &mut |_| {})?;
    let t_load = Instant::now();
    let tts = KokoroTts::from_dir(&preset.dir, &candle_core::Device::Cpu)?;
    let load_s = t_load.elapsed().as_secs_f64();
    let load_peak_mb = peak_rss_mb();
    let loaded_mb = rss_mb();
    let text = SENTENCES.lines().collect::<Vec<_>>().join(" ");
    let voice = tts.voices().get(&a.voice)?;
    let t_g2p = Instant::now();
    let chunks = tts.chunks(&text)?;
    let g2p_s = t_g2p.elapsed().as_secs_f64();
    let mut inputs = Vec::new();
    for c in &chunks {
        let (ids, _) = tts.vocab().encode(&c.phonemes);
        let style = voice.style_for(ids.len())?.to_vec();
        inputs.push(serde_json::json!({"ids": ids, "style": style}));
    }
    let dir = PathBuf::from("target/bench");
    std::fs::create_dir_all(&dir)?;
    let input_path = dir.join("tts-input.json");
    std::fs::write(&input_path, serde_json::to_string(&serde_json::json!({"speed": a.speed, "chunks": inputs}))?)?;

    // ours: one warm-up pass, then the best of `reps`
    let mut samples: Vec<usize> = Vec::new();
    let (mut best, mut best_first) = (f64::INFINITY, f64::INFINITY);
    for rep in 0..=a.reps.max(1) {
        let t0 = Instant::now();
        let mut first = None;
        let mut n = Vec::new();
        for chunk in tts.stream(&text, &a.voice, a.speed)? {
            let chunk = chunk?;
            first.get_or_insert(t0.elapsed().as_secs_f64());
            n.push(chunk.samples.len());
        }
        let total = t0.elapsed().as_secs_f64();
        if rep > 0 {
            best = best.min(total);
            best_first = best_first.min(first.unwrap_or(total));
        }
        samples = n;
    }
    // peak resident memory of this process (model, lexicons, synthesis), before the reference runs
    let our_peak_mb = peak_rss_mb();
    let sr = f64::from(tts.sample_rate());
    let audio_s = samples.iter().sum::<usize>() as f64 / sr;
    println!(
        "Kokoro-82M, {} sentences ({} phonemes, {audio_s:.1} s of audio), voice {}, speed {}; best of {} after a warm-up",
        chunks.len(),
        chunks.iter().map(|c| c.phonemes.chars().count()).sum::<usize>(),
        a.voice,
        a.speed,
        a.reps.max(1)
    );
    println!("{:<36} {:>9} {:>8} {:>16} {:>13}", "", "seconds", "RTF", "first audio (s)", "peak RSS (MB)");
    println!(
        "{:<36} {:>9.2} {:>8.3} {:>16.3} {:>13}",
        "sapient-kokoro (dequantized weights)",
        best,
        best / audio_s,
        best_first,
        fmt_mb(our_peak_mb)
    );
    let mut rows = vec![serde_json::json!({"impl": "sapient-kokoro", "seconds": best, "rtf": best / audio_s,
        "first_audio_seconds": best_first, "peak_rss_mb": our_peak_mb, "samples": samples})];

    match &a.python {
        None => println!("(no --python / SAPIENT_REF_PYTHON: onnxruntime side skipped)"),
        Some(py) => {
            let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/kokoro/bench_reference.py");
            let out = std::process::Command::new(py)
                .arg(&script)
                .arg(preset.file("onnx")?)
                .arg(&input_path)
                .arg(a.threads.to_string())
                .arg(a.reps.max(1).to_string())
                .output()
                .with_context(|| format!("running {}", py.display()))?;
            anyhow::ensure!(out.status.success(), "bench_reference.py failed: {}", String::from_utf8_lossy(&out.stderr));
            let r: serde_json::Value = serde_json::from_slice(&out.stdout).context("bench_reference.py output")?;
            let secs = r["seconds"].as_f64().unwrap_or(f64::NAN);
            let first = r["first_chunk_seconds"].as_f64().unwrap_or(f64::NAN);
            let ref_samples: Vec<u64> = r["samples"].as_array().into_iter().flatten().filter_map(|v| v.as_u64()).collect();
            let ref_audio = ref_samples.iter().sum::<u64>() as f64 / sr;
            let ref_peak_mb = r["peak_rss_mb"].as_f64();
            println!(
                "{:<36} {:>9.2} {:>8.3} {:>16.3} {:>13}",
                format!("onnxruntime {} int8, {} threads", r["onnxruntime"].as_str().unwrap_or("?"), a.threads),
                secs,
                secs / ref_audio,
                first,
                fmt_mb(ref_peak_mb)
            );
            println!(
                "onnxruntime / ours: {:.2}x total, {:.2}x first audio; audio {audio_s:.2} s ours vs {ref_audio:.2} s onnxruntime",
                secs / best,
                first / best_first
            );
            rows.push(serde_json::json!({"impl": "onnxruntime", "version": r["onnxruntime"], "threads": a.threads,
                "seconds": secs, "rtf": secs / ref_audio, "first_audio_seconds": first,
                "cpu_seconds": r["cpu_seconds"], "peak_rss_mb": ref_peak_mb, "samples": ref_samples}));
        }
    }
    println!("sapient-kokoro load (int8 ONNX import in memory, lexicons): {load_s:.2} s; G2P of the text: {:.1} ms", g2p_s * 1e3);
    println!(
        "sapient-kokoro memory: peak {} MB by the end of loading, {} MB resident once loaded",
        fmt_mb(load_peak_mb),
        fmt_mb(loaded_mb)
    );
    if let Some(parent) = a.json.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(
        &a.json,
        serde_json::to_string_pretty(&serde_json::json!({"voice": a.voice, "speed": a.speed, "audio_seconds": audio_s,
            "load_seconds": load_s, "g2p_seconds": g2p_s,
            "load_peak_rss_mb": load_peak_mb, "loaded_rss_mb": loaded_mb, "runs": rows}))?,
    )?;
    println!("wrote {}", a.json.display());
    Ok(())
}

/// This process's peak resident set (`VmHWM` of /proc/self/status), MB; None where there is no
/// such file.
fn peak_rss_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// This process's resident set now (`VmRSS`), MB.
fn rss_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

fn fmt_mb(v: Option<f64>) -> String {
    v.map_or_else(|| "?".into(), |v| format!("{v:.0}"))
}
