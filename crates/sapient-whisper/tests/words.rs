//! Word timestamps (alignment heads + DTW) on the LibriVox clips with tiny.en (and base under
//! `SAPIENT_WHISPER_BASE=1`), against faster-whisper's on the same CTranslate2 weights
//! (tests/data/whisper/fw_words_{tiny_en,base}.json, made by
//! scripts/whisper/make_word_reference.py: greedy, float32, English).

mod common;
use anyhow::Result;
use common::*;
use sapient_whisper::timing::dtw;
use sapient_whisper::{OutputFormat, TranscribeOptions, Transcriber};

fn reference_words(file: &str) -> serde_json::Value {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/whisper").join(file);
    serde_json::from_str(&std::fs::read_to_string(&p).expect("reference words")).expect("json")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[test]
fn word_timestamps_agree_with_faster_whisper() -> Result<()> {
    let t = Transcriber::from_pretrained("whisper-tiny.en")?;
    let (med, max) = check_words(&t, "fw_words_tiny_en.json")?;
    // the criterion is a median within 0.2 s; on these clips every boundary matches
    // to the 10 ms faster-whisper rounds to, so the largest difference is held to 0.2 s too
    assert!(med <= 0.2, "median difference {med:.3} s");
    assert!(max <= 0.2, "largest difference {max:.3} s");
    Ok(())
}

#[test]
fn base_word_timestamps_agree_with_faster_whisper() -> Result<()> {
    if !std::env::var("SAPIENT_WHISPER_BASE").is_ok_and(|v| v == "1") {
        eprintln!("skipped: SAPIENT_WHISPER_BASE=1 runs Whisper base");
        return Ok(());
    }
    let t = Transcriber::from_pretrained("whisper-base")?;
    let (med, max) = check_words(&t, "fw_words_base.json")?;
    assert!(med <= 0.2, "median difference {med:.3} s");
    assert!(max <= 0.2, "largest difference {max:.3} s");
    Ok(())
}

/// Transcribes the clips with word timestamps (greedy, English) and compares them with
/// faster-whisper's: same words, monotonic, inside the audio. Returns the median and largest
/// boundary difference (s).
fn check_words(t: &Transcriber, reference_file: &str) -> Result<(f64, f64)> {
    let reference = reference_words(reference_file);
    let opts = TranscribeOptions { word_timestamps: true, language: Some("en".into()), ..Default::default() };
    let mut diffs = Vec::new();
    for c in CLIPS {
        let audio = clip(c);
        let r = t.transcribe(&audio, &opts)?;
        let words: Vec<_> = r.segments.iter().flat_map(|s| s.words.iter()).collect();
        assert!(!words.is_empty(), "{c}: no words");
        // monotonic, inside the audio, and the words spell the text
        let mut prev_end = 0.0;
        for w in &words {
            assert!(w.start <= w.end && w.start >= prev_end - 1e-9, "{c}: {:?}", words);
            assert!(w.end <= r.duration + 0.01, "{c}: {} ends after {:.2}", w.word, r.duration);
            assert!((0.0..=1.0).contains(&w.probability));
            prev_end = w.end;
        }
        let joined: String = words.iter().map(|w| w.word.as_str()).collect();
        assert_eq!(normalize(&joined), normalize(&r.text));
        // against faster-whisper, word by word where the words are the same
        let fw = reference["clips"][c].as_array().unwrap();
        let fw_words: Vec<String> = fw.iter().map(|w| w[0].as_str().unwrap().to_string()).collect();
        let ours: Vec<String> = words.iter().map(|w| w.word.clone()).collect();
        assert_eq!(ours, fw_words, "{c}: same words as faster-whisper");
        for (w, f) in words.iter().zip(fw) {
            diffs.push((w.start - f[1].as_f64().unwrap()).abs());
            diffs.push((w.end - f[2].as_f64().unwrap()).abs());
        }
        if c == "0880" {
            let j: serde_json::Value = serde_json::from_str(&r.render(OutputFormat::Json))?;
            assert_eq!(j["segments"][0]["words"].as_array().map(|w| w.len()), Some(r.segments[0].words.len()));
        }
    }
    let med = median(diffs.clone());
    let max = diffs.iter().copied().fold(0.0, f64::max);
    let exact = diffs.iter().filter(|&&d| d < 0.005).count();
    eprintln!("word boundaries vs faster-whisper: median |diff| {med:.3} s, max {max:.3} s, {exact} of {} equal", diffs.len());
    Ok((med, max))
}

#[test]
fn dtw_follows_the_cheapest_monotonic_path() {
    // a diagonal of zeros in a field of ones: the path is the diagonal, then along time
    let (n, m) = (3, 5);
    let mut x = vec![1.0f32; n * m];
    for (i, j) in [(0, 0), (1, 1), (2, 2), (2, 3), (2, 4)] {
        x[i * m + j] = 0.0;
    }
    assert_eq!(dtw(&x, n, m), vec![(0, 0), (1, 1), (2, 2), (2, 3), (2, 4)]);
    // one row: every column in order
    assert_eq!(dtw(&[0.5, 0.1, 0.9], 1, 3), vec![(0, 0), (0, 1), (0, 2)]);
}
