//! Hallucination guards: audio without speech (digital silence, white and pink noise, a
//! tone, all generated here) gives no text, with the VAD attached as `sapient transcribe`
//! attaches it; speech with long silences keeps its words. tiny.en always; base with
//! `SAPIENT_WHISPER_BASE=1`.

mod common;

use anyhow::Result;
use common::{normalize, preset, wer_counts, CLIPS};
use sapient_audio::SileroVad;
use sapient_whisper::{TranscribeOptions, Transcriber};

const RATE: usize = 16_000;

/// xorshift64*, uniform in [0, 1).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32 / (1u64 << 24) as f32
    }
    /// Roughly normal (sum of four uniforms), unit variance.
    fn gauss(&mut self) -> f32 {
        ((0..4).map(|_| self.next()).sum::<f32>() - 2.0) * 3f32.sqrt()
    }
}

fn scale_to_dbfs(x: &mut [f32], dbfs: f32) {
    let rms = (x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32).sqrt();
    let g = 10f32.powf(dbfs / 20.0) / rms.max(1e-12);
    x.iter_mut().for_each(|v| *v *= g);
}

fn white_noise(seconds: usize, dbfs: f32, seed: u64) -> Vec<f32> {
    let mut r = Rng(seed);
    let mut x: Vec<f32> = (0..seconds * RATE).map(|_| r.gauss()).collect();
    scale_to_dbfs(&mut x, dbfs);
    x
}

/// Pink (1/f) noise: Paul Kellet's filter over white noise.
fn pink_noise(seconds: usize, dbfs: f32, seed: u64) -> Vec<f32> {
    let mut r = Rng(seed);
    let mut b = [0f32; 7];
    let mut x: Vec<f32> = (0..seconds * RATE)
        .map(|_| {
            let w = r.gauss();
            b[0] = 0.99886 * b[0] + w * 0.0555179;
            b[1] = 0.99332 * b[1] + w * 0.0750759;
            b[2] = 0.96900 * b[2] + w * 0.153_852;
            b[3] = 0.86650 * b[3] + w * 0.3104856;
            b[4] = 0.55000 * b[4] + w * 0.5329522;
            b[5] = -0.7616 * b[5] - w * 0.0168980;
            let y = b.iter().sum::<f32>() + w * 0.5362;
            b[6] = w * 0.115926;
            y
        })
        .collect();
    scale_to_dbfs(&mut x, dbfs);
    x
}

fn tone(seconds: usize, hz: f32, dbfs: f32) -> Vec<f32> {
    let mut x: Vec<f32> = (0..seconds * RATE).map(|i| (2.0 * std::f32::consts::PI * hz * i as f32 / RATE as f32).sin()).collect();
    scale_to_dbfs(&mut x, dbfs);
    x
}

fn no_speech_inputs() -> Vec<(&'static str, Vec<f32>)> {
    vec![
        ("20 s of digital silence", vec![0.0; 20 * RATE]),
        ("white noise, -20 dBFS", white_noise(20, -20.0, 1)),
        ("white noise, -40 dBFS", white_noise(12, -40.0, 2)),
        ("pink noise, -20 dBFS", pink_noise(20, -20.0, 3)),
        ("tone 440 Hz, -12 dBFS", tone(15, 440.0, -12.0)),
        ("tone 1 kHz, -30 dBFS", tone(8, 1000.0, -30.0)),
    ]
}

fn vad() -> SileroVad {
    let onnx = preset("silero-vad").file("onnx").expect("silero onnx").to_path_buf();
    SileroVad::load(onnx, &candle_core::Device::Cpu).expect("load silero")
}

fn load(id: &str) -> Transcriber {
    let dir = preset(id).dir;
    Transcriber::from_pretrained(dir.to_str().expect("utf-8 path")).expect("load whisper").with_vad(vad())
}

fn check_no_text(t: &Transcriber, name: &str) -> Result<()> {
    for beam in [None, Some(5)] {
        let opts = TranscribeOptions { beam_size: beam, ..Default::default() };
        for (what, audio) in no_speech_inputs() {
            let r = t.transcribe(&audio, &opts)?;
            assert!(r.text.trim().is_empty() && r.segments.is_empty(), "{name}, beam {beam:?}, {what}: {:?}", r.text);
        }
    }
    Ok(())
}

/// The five clips separated by 12 s stretches of `gap` (whole windows without speech), to
/// check that the guards keep the speech.
fn speech_with_gaps(gap: impl Fn(usize) -> Vec<f32>) -> (Vec<f32>, String) {
    let mut audio = gap(0);
    let mut reference = String::new();
    for (i, c) in CLIPS.iter().enumerate() {
        audio.extend(common::clip(c));
        audio.extend(gap(i + 1));
        reference.push_str(&common::reference(c));
        reference.push(' ');
    }
    (audio, reference)
}

/// Beam 5 keeps the clips' words; neither beam 5 nor greedy makes more word errors with the
/// VAD guard than without it (without it, base repeats or adds a sentence after the speech;
/// tiny.en greedy skips one clip after a long silence with or without it: Whisper's own
/// silence rule).
fn check_speech_kept(t: &Transcriber, name: &str, max_errors: usize) -> Result<()> {
    for (what, gap) in [
        ("silence", Box::new(|_| vec![0.0f32; 12 * RATE]) as Box<dyn Fn(usize) -> Vec<f32>>),
        ("white noise -40 dBFS", Box::new(|i| white_noise(12, -40.0, 10 + i as u64))),
    ] {
        let (audio, reference) = speech_with_gaps(gap);
        let beam5 = TranscribeOptions { beam_size: Some(5), ..Default::default() };
        let r = t.transcribe(&audio, &beam5)?;
        let (errors, words) = wer_counts(&reference, &r.text);
        assert_eq!(words, normalize(&reference).len());
        assert!(errors <= max_errors, "{name}, clips with {what} between: {errors}/{words} word errors: {:?}", r.text);
        let unguarded = t.transcribe(&audio, &TranscribeOptions { vad_no_speech_threshold: None, ..beam5 })?;
        let (unguarded_errors, _) = wer_counts(&reference, &unguarded.text);
        assert!(errors <= unguarded_errors, "{name}, clips with {what} between, beam 5: {errors} word errors with the guard, {unguarded_errors} without: {:?} vs {:?}", r.text, unguarded.text);
        let greedy = t.transcribe(&audio, &TranscribeOptions::default())?;
        let unguarded = t.transcribe(&audio, &TranscribeOptions { vad_no_speech_threshold: None, ..Default::default() })?;
        let ((greedy_errors, _), (unguarded_errors, _)) = (wer_counts(&reference, &greedy.text), wer_counts(&reference, &unguarded.text));
        assert!(greedy_errors <= unguarded_errors, "{name}, clips with {what} between, greedy: {greedy_errors} word errors with the guard, {unguarded_errors} without: {:?} vs {:?}", greedy.text, unguarded.text);
        assert!(!greedy.text.trim().is_empty());
    }
    Ok(())
}

#[test]
fn no_text_without_speech_tiny_en() -> Result<()> {
    check_no_text(&load("whisper-tiny.en"), "tiny.en")
}

#[test]
fn speech_between_long_gaps_is_kept_tiny_en() -> Result<()> {
    // tiny.en: 3/71 on the clips alone (docs/whisper.md); between noise it hears
    // "ill-disposed" as "old-sposed" twice more (as the VAD streaming mode does), 6/71
    check_speech_kept(&load("whisper-tiny.en"), "tiny.en", 6)
}

fn base_enabled() -> bool {
    std::env::var("SAPIENT_WHISPER_BASE").is_ok_and(|v| !v.is_empty() && v != "0")
}

#[test]
fn no_text_without_speech_base() -> Result<()> {
    if !base_enabled() {
        eprintln!("skipped: set SAPIENT_WHISPER_BASE=1");
        return Ok(());
    }
    let t = load("whisper-base");
    check_no_text(&t, "base")?;
    check_speech_kept(&t, "base", 3)
}
