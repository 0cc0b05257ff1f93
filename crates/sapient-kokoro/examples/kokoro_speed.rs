//! Seconds of compute per second of audio for one utterance (phonemes mapped with the preset's
//! vocab.json, voice row = number of phonemes), best of `--runs` (default 3):
//!
//! ```sh
//! SAPIENT_THREADS=2 cargo run --release -p sapient-kokoro --example kokoro_speed -- [PHONEMES] [--voice V] [--runs N] [--wav out.wav]
//! ```

use anyhow::{Context, Result};
use candle_core::Device;
use sapient_kokoro::{KModel, Voices};
use std::time::Instant;

const LONG: &str = "ʃˈiɾoi kɯmˈo ɡa, aˈoi soɾˈa no nˈaka o jˈɯkkɯɾi to nˈaɡaɾete ikimˈasɯ. \
kˈjoː wa tˈotemo ii tˈeŋki de, kˈoːeŋ ni wa takˈusaŋ no hˈito ɡa imˈasɯ.";

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opt = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let text = args.first().filter(|a| !a.starts_with("--")).cloned().unwrap_or_else(|| LONG.to_string());
    let voice = opt("--voice").unwrap_or_else(|| "jf_alpha".into());
    let runs: usize = opt("--runs").map(|r| r.parse()).transpose()?.unwrap_or(3);
    let r = sapient_hub::Hub::new()?.fetch_preset("kokoro-82m", &mut |_| {})?;
    let t = Instant::now();
    let model = KModel::load_preset_dir(r.file("onnx")?.parent().context("dir")?, &Device::Cpu)?;
    eprintln!("load {:.2} s", t.elapsed().as_secs_f64());
    let vocab = &model.config().vocab;
    let ids: Vec<u32> = text.chars().filter_map(|c| vocab.get(&c.to_string()).copied()).collect();
    let voices = Voices::load(r.file("voices")?)?;
    let style = voices.get(&voice)?.style_for(ids.len())?.to_vec();
    let mut best = f64::MAX;
    let mut best_cpu = f64::MAX;
    let mut audio = Vec::new();
    for _ in 0..runs.max(1) {
        let (t, c) = (Instant::now(), cpu_seconds());
        audio = model.synthesize(&ids, &style, 1.0)?;
        best = best.min(t.elapsed().as_secs_f64());
        best_cpu = best_cpu.min(cpu_seconds() - c);
    }
    let secs = audio.len() as f64 / f64::from(model.sample_rate());
    println!(
        "sapient: {} ids, {secs:.2} s audio, {best:.3} s compute, {:.3} s per s of audio; CPU time {best_cpu:.2} s ({:.3} CPU-s per s of audio)",
        ids.len(),
        best / secs,
        best_cpu / secs
    );
    if let Some(path) = opt("--wav") {
        let mut b = Vec::new();
        let n = audio.len() as u32 * 2;
        for (tag, v) in [(b"RIFF", 36 + n), (b"WAVE", 0)] {
            b.extend_from_slice(tag);
            if tag == b"RIFF" {
                b.extend_from_slice(&v.to_le_bytes());
            }
        }
        b.extend_from_slice(b"fmt ");
        b.extend_from_slice(&16u32.to_le_bytes());
        for v in [1u16, 1] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        for v in [24000u32, 48000] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        for v in [2u16, 16] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(b"data");
        b.extend_from_slice(&n.to_le_bytes());
        for s in &audio {
            b.extend_from_slice(&((s.clamp(-1.0, 1.0) * 32767.0) as i16).to_le_bytes());
        }
        std::fs::write(&path, b)?;
    }
    Ok(())
}

/// User + system CPU time of this process (Linux `/proc/self/stat`, 100 ticks a second).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / 100.0
}
