//! Kokoro's forward pass against onnxruntime on the same int8 ONNX file
//! (tests/data/kokoro_reference.{json,pcm}, written by scripts/kokoro/waveform_reference.py):
//! same phoneme ids, voice `jf_alpha` (row = number of phonemes), speed 1.
//!
//! - durations: ours (f32 weights) against onnxruntime's (int8 weights and activations),
//!   rounded, token by token, and the raw values; at speed 2 the raw durations halve;
//! - audio: ours, with onnxruntime's durations (so both have the same length and alignment),
//!   against onnxruntime's waveform, as the relative L2 error of log-mel spectrograms;
//! - bad input: empty ids, ids outside the vocabulary, too many ids, a bad style or speed.

use anyhow::{Context, Result};
use candle_core::Device;
use sapient_kokoro::{KModel, Voices};
use std::path::PathBuf;
use std::sync::OnceLock;

/// Whether the kernels may use AMX and AVX512-BF16, the bf16 paths (`tests/model_no_amx.rs`
/// includes this file with `false`).
#[allow(dead_code)]
const AMX: bool = true;

struct Fixture {
    model: KModel,
    voices: Voices,
}

fn fixture() -> &'static Fixture {
    static CELL: OnceLock<Fixture> = OnceLock::new();
    CELL.get_or_init(|| {
        sapient_tensor::kernels::configure(sapient_tensor::kernels::KernelOptions {
            amx: crate::AMX,
            avx512_bf16: crate::AMX,
            ..Default::default()
        })
        .expect("kernel options");
        let r = sapient_hub::Hub::new()
            .and_then(|h| h.fetch_preset("kokoro-82m", &mut |_| {}))
            .expect("fetching kokoro-82m");
        let onnx = r.file("onnx").expect("onnx file");
        let model = KModel::from_onnx(onnx, &Device::Cpu).expect("loading the model");
        let voices = Voices::load(r.file("voices").expect("voices file")).expect("voices");
        Fixture { model, voices }
    })
}

struct Reference {
    ids: Vec<u32>,
    voice: String,
    speed: f32,
    durations: Vec<u32>,
    raw_durations: Vec<f32>,
    f0: Vec<f32>,
    audio: Vec<f32>,
}

fn reference() -> Result<Reference> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let p = dir.join("kokoro_reference.json");
    let j: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p).with_context(|| p.display().to_string())?)?;
    let nums = |k: &str| -> Vec<f64> { j[k].as_array().map(|a| a.iter().filter_map(|v| v.as_f64()).collect()).unwrap_or_default() };
    let pcm = std::fs::read(dir.join("kokoro_reference.pcm"))?;
    let scale = j["pcm_scale"].as_f64().context("pcm_scale")? as f32;
    let audio: Vec<f32> = pcm.chunks_exact(2).map(|b| f32::from(i16::from_le_bytes([b[0], b[1]])) * scale).collect();
    assert_eq!(audio.len() as u64, j["samples"].as_u64().context("samples")?);
    Ok(Reference {
        ids: nums("ids").into_iter().map(|v| v as u32).collect(),
        voice: j["voice"].as_str().context("voice")?.to_string(),
        speed: j["speed"].as_f64().context("speed")? as f32,
        durations: nums("durations").into_iter().map(|v| v as u32).collect(),
        raw_durations: nums("raw_durations").into_iter().map(|v| v as f32).collect(),
        f0: nums("f0").into_iter().map(|v| v as f32).collect(),
        audio,
    })
}

/// ln(mel power + 1e-5): 24 kHz, 1024-point frames (Hann), hop 256, 80 HTK mel bands to 12 kHz.
fn log_mel(x: &[f32]) -> Vec<Vec<f32>> {
    let (nfft, hop, nmel, sr) = (1024usize, 256usize, 80usize, 24000f64);
    let bins = nfft / 2 + 1;
    let mel = |f: f64| 2595.0 * (1.0 + f / 700.0).log10();
    let hz = |m: f64| 700.0 * (10f64.powf(m / 2595.0) - 1.0);
    let pts: Vec<f64> = (0..nmel + 2).map(|i| hz(mel(sr / 2.0) * i as f64 / (nmel + 1) as f64)).collect();
    let fb: Vec<Vec<f64>> = (0..nmel)
        .map(|m| {
            (0..bins)
                .map(|b| {
                    let f = b as f64 * sr / nfft as f64;
                    let up = (f - pts[m]) / (pts[m + 1] - pts[m]);
                    let down = (pts[m + 2] - f) / (pts[m + 2] - pts[m + 1]);
                    up.min(down).max(0.0)
                })
                .collect()
        })
        .collect();
    let win: Vec<f64> = (0..nfft).map(|n| 0.5 - 0.5 * (2.0 * std::f64::consts::PI * n as f64 / nfft as f64).cos()).collect();
    let (cos, sin): (Vec<f64>, Vec<f64>) = (0..nfft)
        .map(|i| {
            let a = 2.0 * std::f64::consts::PI * i as f64 / nfft as f64;
            (a.cos(), a.sin())
        })
        .unzip();
    let mut out = Vec::new();
    let mut f = 0;
    while f + nfft <= x.len() {
        let frame: Vec<f64> = (0..nfft).map(|n| f64::from(x[f + n]) * win[n]).collect();
        let power: Vec<f64> = (0..bins)
            .map(|k| {
                let (mut re, mut im) = (0.0, 0.0);
                for (n, v) in frame.iter().enumerate() {
                    let i = (k * n) % nfft;
                    re += v * cos[i];
                    im -= v * sin[i];
                }
                re * re + im * im
            })
            .collect();
        out.push(fb.iter().map(|w| (w.iter().zip(&power).map(|(a, b)| a * b).sum::<f64>() + 1e-5).ln() as f32).collect());
        f += hop;
    }
    out
}

fn rel_l2(a: &[Vec<f32>], b: &[Vec<f32>]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (ra, rb) in a.iter().zip(b) {
        for (x, y) in ra.iter().zip(rb) {
            num += f64::from(x - y).powi(2);
            den += f64::from(*x).powi(2);
        }
    }
    (num / den).sqrt()
}

#[test]
fn durations_and_audio_match_onnxruntime() -> Result<()> {
    let fx = fixture();
    let r = reference()?;
    let style = fx.voices.get(&r.voice)?.style_for(r.ids.len())?.to_vec();

    // predicted durations
    let ours = fx.model.forward(&r.ids, &style, r.speed, None)?;
    assert_eq!(ours.durations.len(), r.durations.len());
    let differ: Vec<usize> = (0..r.durations.len()).filter(|&i| ours.durations[i] != r.durations[i]).collect();
    let max_raw = ours
        .raw_durations
        .iter()
        .zip(&r.raw_durations)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    let max_step = differ
        .iter()
        .map(|&i| ours.durations[i].abs_diff(r.durations[i]))
        .max()
        .unwrap_or(0);
    eprintln!(
        "durations: {} of {} tokens differ (by at most {max_step} frame), raw max |diff| {max_raw:.3}; frames ours {} onnxruntime {}",
        differ.len(),
        r.durations.len(),
        ours.durations.iter().sum::<u32>(),
        r.durations.iter().sum::<u32>()
    );
    assert!(max_raw < 0.3, "raw durations differ by {max_raw}");
    assert!(max_step <= 1 && differ.len() * 5 <= r.durations.len(), "{differ:?}");

    // speed divides the predicted durations before rounding
    let fast = fx.model.forward(&r.ids, &style, 2.0, None)?;
    for (a, b) in fast.raw_durations.iter().zip(&ours.raw_durations) {
        assert!((a * 2.0 - b).abs() <= 1e-4 * b.abs().max(1.0), "{a} at speed 2 vs {b} at speed 1");
    }
    for (&d, &raw) in fast.durations.iter().zip(&fast.raw_durations) {
        assert_eq!(d, (raw.round_ties_even() as u32).max(1));
    }
    assert_eq!(fast.audio.len(), 600 * fast.durations.iter().sum::<u32>() as usize);

    // audio with onnxruntime's durations
    let same = fx.model.forward(&r.ids, &style, r.speed, Some(&r.durations))?;
    assert_eq!(same.audio.len(), r.audio.len());
    let f0_err = same.f0.iter().zip(&r.f0).map(|(a, b)| f64::from(a - b).powi(2)).sum::<f64>().sqrt()
        / r.f0.iter().map(|b| f64::from(*b).powi(2)).sum::<f64>().sqrt();
    let (ma, mb) = (log_mel(&same.audio), log_mel(&r.audio));
    let err = rel_l2(&ma, &mb);
    let wave = same.audio.iter().zip(&r.audio).map(|(a, b)| f64::from(a - b).powi(2)).sum::<f64>().sqrt()
        / r.audio.iter().map(|b| f64::from(*b).powi(2)).sum::<f64>().sqrt();
    eprintln!("F0 relative L2 {f0_err:.4}; log-mel relative L2 {err:.4} over {} frames; waveform relative L2 {wave:.3}", ma.len());
    assert!(f0_err < 0.05, "F0 relative error {f0_err}");
    assert!(err < 0.1, "log-mel relative error {err}");
    Ok(())
}

#[test]
fn bad_input_is_an_error() -> Result<()> {
    let fx = fixture();
    let style = fx.voices.get("jf_alpha")?.style_for(3)?.to_vec();
    let m = &fx.model;
    let e = |r: sapient_kokoro::Result<Vec<f32>>| r.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e(m.synthesize(&[], &style, 1.0)).contains("no phoneme ids"));
    assert!(e(m.synthesize(&[43, 178, 44], &style, 1.0)).contains("outside the vocabulary"));
    assert!(e(m.synthesize(&[43; 511], &style, 1.0)).contains("at most 510"));
    assert!(e(m.synthesize(&[43], &style[..255], 1.0)).contains("256"));
    assert!(e(m.synthesize(&[43], &style, 0.0)).contains("speed"));
    assert!(e(m.synthesize(&[43], &style, f32::NAN)).contains("speed"));
    Ok(())
}
