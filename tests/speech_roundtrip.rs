//! Kokoro's English speech understood by sapient's own Whisper (the round trip): ten
//! sentences synthesized by `KokoroTts` (24 kHz), resampled to 16 kHz with sapient-audio,
//! transcribed by whisper-tiny.en (greedy), word error rate against the text. The preset's voices are the five Japanese ones, so the English is accented; the
//! figure per voice is printed and the bound is the one measured for the default voice with
//! some margin (see docs/kokoro.md).

use anyhow::Result;
use sapient_kokoro::KokoroTts;
use sapient_whisper::{TranscribeOptions, Transcriber};

/// The ten round-trip sentences, one per line (shared with `cargo xtask bench tts`).
const SENTENCES: &str = include_str!("data/kokoro/sentences.txt");

/// Lower-case words; Whisper writes small numbers as digits ("at 7"), read as words here.
fn words(s: &str) -> Vec<String> {
    const NUM: [&str; 13] = [
        "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
        "eleven", "twelve",
    ];
    s.to_lowercase()
        .split(|c: char| !c.is_alphanumeric() && c != '\'')
        .map(|w| w.trim_matches('\'').to_string())
        .filter(|w| !w.is_empty())
        .map(|w| {
            w.parse::<usize>()
                .ok()
                .and_then(|n| NUM.get(n))
                .map_or(w, |n| n.to_string())
        })
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
    assert_eq!(
        sentences.len(),
        10,
        "tests/data/kokoro/sentences.txt holds the ten sentences"
    );
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
    eprintln!(
        "voice {voice}: WER {errors}/{total} = {:.1}%\n{}",
        100.0 * rate,
        report.join("\n")
    );
    assert!(
        rate < 0.10,
        "WER {:.1}% over 10%:\n{}",
        100.0 * rate,
        report.join("\n")
    );
    Ok(())
}

/// Kokoro's word timestamps (from its predicted phoneme durations) against where Whisper's
/// word timestamps (cross-attention alignment) put the same words in the same audio.
#[test]
fn kokoro_word_times_agree_with_whisper() -> Result<()> {
    let hub = sapient_hub::Hub::new()?;
    let k = hub.fetch_preset("kokoro-82m", &mut |_| {})?;
    let tts = KokoroTts::from_dir(&k.dir, &candle_core::Device::Cpu)?;
    let whisper = Transcriber::load("whisper-tiny.en", &candle_core::Device::Cpu, &mut |_| {})?;
    let opts = TranscribeOptions { word_timestamps: true, ..TranscribeOptions::default() };
    let text = "The quick brown fox jumps over the lazy dog. It was a cold and windy day.";
    let (speech, timed) = tts.synthesize_timed(text, "jf_alpha", 1.0)?;
    let secs = speech.samples.len() as f32 / speech.sample_rate as f32;
    // Every word of the text, in order, in time order, inside the audio.
    let said: Vec<String> = timed.iter().map(|w| w.word.to_lowercase()).collect();
    assert_eq!(said, words(text), "{timed:?}");
    assert!(timed.windows(2).all(|p| p[0].start < p[0].end && p[0].end <= p[1].start + 1e-6), "{timed:?}");
    assert!(timed.last().is_some_and(|w| w.end <= secs + 1e-3), "{timed:?} in {secs} s");
    let audio16 = sapient_audio::resample(&speech.samples, speech.sample_rate, 16_000)?;
    let heard: Vec<(String, f64)> = whisper
        .transcribe(&audio16, &opts)?
        .segments
        .iter()
        .flat_map(|s| s.words.iter())
        .flat_map(|w| words(&w.word).into_iter().map(move |x| (x, w.start)))
        .collect();
    // Pair the words both have, in order.
    let mut diffs = Vec::new();
    let mut j = 0;
    for w in &timed {
        if let Some(i) = heard[j..].iter().position(|(x, _)| *x == w.word.to_lowercase()) {
            diffs.push((w.start as f64 - heard[j + i].1).abs());
            j += i + 1;
        }
    }
    let mean = diffs.iter().sum::<f64>() / diffs.len().max(1) as f64;
    let max = diffs.iter().copied().fold(0.0, f64::max);
    eprintln!("{} of {} words matched; word starts differ by {mean:.3} s on average, {max:.3} s at most", diffs.len(), timed.len());
    assert!(diffs.len() + 2 >= timed.len(), "Whisper heard too few of the words: {heard:?}");
    assert!(mean < 0.15 && max < 0.45, "mean {mean:.3} s, max {max:.3} s");
    Ok(())
}
