//! Kokoro's English speech understood by sapient's own Whisper (the round trip), and
//! `sapient speak` end to end.
//!
//! The round trip: ten sentences synthesized by `KokoroTts` (24 kHz), resampled to 16 kHz
//! with sapient-audio, transcribed by whisper-tiny.en (greedy), word error rate against the
//! text. The preset's voices are the five Japanese ones, so the English is accented; the
//! figure per voice is printed and the bound is the one measured for the default voice with
//! some margin (see docs/kokoro.md).

use anyhow::Result;
use sapient_kokoro::KokoroTts;
use sapient_whisper::{TranscribeOptions, Transcriber};
use std::process::Command;

/// The ten round-trip sentences, one per line (shared with `cargo xtask bench tts`).
const SENTENCES: &str = include_str!("../../../tests/data/kokoro/sentences.txt");

/// Lower-case words; Whisper writes small numbers as digits ("at 7"), read as words here.
fn words(s: &str) -> Vec<String> {
    const NUM: [&str; 13] = [
        "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
    ];
    s.to_lowercase()
        .split(|c: char| !c.is_alphanumeric() && c != '\'')
        .map(|w| w.trim_matches('\'').to_string())
        .filter(|w| !w.is_empty())
        .map(|w| w.parse::<usize>().ok().and_then(|n| NUM.get(n)).map_or(w, |n| n.to_string()))
        .collect()
}

/// (word errors, reference words).
fn wer(reference: &str, hypothesis: &str) -> (usize, usize) {
    let (r, h) = (words(reference), words(hypothesis));
    (sapient_whisper::eval::word_errors(&r, &h), r.len())
}

#[test]
fn whisper_understands_kokoro_english() -> Result<()> {
    let hub = sapient_hub::Hub::new()?;
    let k = hub.fetch_preset("kokoro-82m", &mut |_| {})?;
    let tts = KokoroTts::from_dir(&k.dir, &candle_core::Device::Cpu)?;
    let whisper = Transcriber::load("whisper-tiny.en", &candle_core::Device::Cpu, &mut |_| {})?;
    let opts = TranscribeOptions::default();
    let voice = std::env::var("SAPIENT_ROUNDTRIP_VOICE").unwrap_or_else(|_| "jf_alpha".into());
    let (mut errors, mut total) = (0, 0);
    let mut report = Vec::new();
    let sentences: Vec<&str> = SENTENCES.lines().collect();
    assert_eq!(sentences.len(), 10, "tests/data/kokoro/sentences.txt holds the ten sentences");
    for s in sentences {
        let speech = tts.synthesize(s, &voice, 1.0)?;
        let audio16 = sapient_audio::resample(&speech.samples, speech.sample_rate, 16_000)?;
        let heard = whisper.transcribe(&audio16, &opts)?.text;
        let (e, n) = wer(s, &heard);
        errors += e;
        total += n;
        report.push(format!("{e}/{n}  {s:?} -> {:?}", heard.trim()));
    }
    let rate = errors as f64 / total as f64;
    eprintln!("voice {voice}: WER {errors}/{total} = {:.1}%\n{}", 100.0 * rate, report.join("\n"));
    assert!(rate < 0.10, "WER {:.1}% over 10%:\n{}", 100.0 * rate, report.join("\n"));
    Ok(())
}

#[test]
fn speak_writes_a_wav_and_prints_phonemes() {
    let exe = env!("CARGO_BIN_EXE_sapient");
    let out = Command::new(exe)
        .args(["speak", "--phonemes", "Hello, world! Thank you."])
        .output()
        .expect("run sapient");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // one line per sentence; misaki's lexicon has hello = həlˈO, world = wˈɜɹld
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert_eq!(lines[0], "həlˈO, wˈɜɹld!");

    let dir = tempfile::tempdir().unwrap();
    let wav = dir.path().join("out.wav");
    let out = Command::new(exe)
        .args(["speak", "Good morning.", "--voice", "jf_alpha:0.6,jm_kumo:0.4", "--stats", "-o"])
        .arg(&wav)
        .output()
        .expect("run sapient");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("first audio after") && err.contains("real-time factor"), "{err}");
    let a = sapient_audio::decode_file(&wav).unwrap();
    assert_eq!(a.sample_rate, 24_000);
    assert!(a.samples.len() > 24_000 / 2, "{}", a.samples.len());

    // bad input: a clear error, exit status 1, no panic
    for (args, want) in [
        (vec!["speak", "", "-o"], "empty"),
        (vec!["speak", "Hi.", "--voice", "af_heart", "-o"], "unknown voice"),
    ] {
        let out = Command::new(exe).args(&args).arg(&wav).output().expect("run sapient");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(want) && !err.contains("panicked"), "{args:?}: {err}");
    }
}
