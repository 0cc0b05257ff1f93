//! Shared helpers: real models and speech through sapient-hub, word error rate.
#![allow(dead_code)]

use std::path::PathBuf;

pub const CLIPS: [&str; 5] = ["0870", "0880", "0890", "0920", "0930"];

pub fn preset(id: &str) -> sapient_hub::ResolvedModel {
    sapient_hub::Hub::new()
        .and_then(|h| h.fetch_preset(id, &mut |_| {}))
        .unwrap_or_else(|e| panic!("fetching preset {id}: {e}"))
}

pub fn clip_path(c: &str) -> PathBuf {
    let m = preset("speech-librivox");
    let name = format!("sense_and_sensibility_01_austen_64kb-{c}.wav");
    m.files("audio")
        .iter()
        .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy() == name))
        .unwrap_or_else(|| panic!("clip {name} not in speech-librivox"))
        .clone()
}

pub fn clip(c: &str) -> Vec<f32> {
    let a = sapient_audio::decode_file(clip_path(c)).expect("decode clip");
    assert_eq!(a.sample_rate, 16_000);
    a.samples
}

/// The clips `times` over with a second of silence after each, and the reference text.
#[allow(dead_code)] // not every test binary uses it
pub fn long_audio(times: usize) -> (Vec<f32>, String) {
    let mut audio = Vec::new();
    let mut text = String::new();
    for _ in 0..times {
        for c in CLIPS {
            audio.extend(clip(c));
            audio.extend(std::iter::repeat_n(0.0f32, 16_000));
            text.push_str(&reference(c));
            text.push(' ');
        }
    }
    (audio, text)
}

/// The reference transcript of a clip (pocketsphinx-testdata's `transcription` file).
pub fn reference(c: &str) -> String {
    let m = preset("speech-librivox");
    let text = std::fs::read_to_string(m.file("transcription").expect("transcription")).expect("read transcription");
    let key = format!("(sense_and_sensibility_01_austen_64kb-{c})");
    let line = text.lines().find(|l| l.contains(&key)).unwrap_or_else(|| panic!("no transcript for {c}"));
    line.replace(&key, "").replace("<s>", "").replace("</s>", "").trim().to_string()
}

#[allow(unused_imports)] // each test binary uses some of them
pub use sapient_whisper::eval::{normalize, wer_counts};
