//! `KokoroTts` end to end on the real `kokoro-82m` preset: streaming yields one chunk per
//! sentence (the first before the rest are synthesized), the whole-text call gives the same
//! audio as the stream, and bad input (empty text, nothing speakable, unknown voice, bad
//! speed, foreign phoneme symbols) is an error or a documented skip, never a panic.

use anyhow::Result;
use sapient_kokoro::KokoroTts;
use std::sync::OnceLock;

fn tts() -> &'static KokoroTts {
    static T: OnceLock<KokoroTts> = OnceLock::new();
    T.get_or_init(|| {
        let r = sapient_hub::Hub::new()
            .and_then(|h| h.fetch_preset("kokoro-82m", &mut |_| {}))
            .expect("fetch kokoro-82m");
        KokoroTts::from_dir(&r.dir, &candle_core::Device::Cpu).expect("load kokoro-82m")
    })
}

#[test]
fn stream_is_sentence_by_sentence_and_matches_synthesize() -> Result<()> {
    let t = tts();
    let text = "Good morning. It is 7 degrees outside!";
    let mut stream = t.stream(text, "jf_alpha", 1.0)?;
    assert_eq!(stream.remaining(), 2);
    let first = stream.next().expect("a first chunk")?;
    // the second sentence is not synthesized yet
    assert_eq!(stream.remaining(), 1);
    assert_eq!(first.text, "Good morning.");
    assert_eq!(first.phonemes, t.g2p().phonemize("Good morning."));
    let second = stream.next().expect("a second chunk")?;
    assert!(stream.next().is_none());
    assert_eq!(second.text, "It is 7 degrees outside!");
    for c in [&first, &second] {
        // 600 samples per frame, at least one frame per phoneme at speed 1
        assert_eq!(c.samples.len() % 600, 0);
        assert!(c.samples.len() >= 600 * c.phonemes.chars().count());
        let rms = (c.samples.iter().map(|x| x * x).sum::<f32>() / c.samples.len() as f32).sqrt();
        assert!(rms > 0.01 && c.samples.iter().all(|x| x.is_finite()), "rms {rms}");
    }
    let whole = t.synthesize(text, "jf_alpha", 1.0)?;
    assert_eq!(whole.sample_rate, 24_000);
    let joined: Vec<f32> = first.samples.iter().chain(&second.samples).copied().collect();
    assert_eq!(whole.samples, joined);
    // faster speech is shorter
    let fast = t.synthesize("Good morning.", "jf_alpha:0.5,jm_kumo:0.5", 1.5)?;
    assert!(fast.samples.len() < first.samples.len(), "{} vs {}", fast.samples.len(), first.samples.len());
    Ok(())
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let t = tts();
    let msg = |r: sapient_kokoro::Result<sapient_kokoro::SpeechStream<'_>>| match r {
        Ok(_) => String::new(),
        Err(e) => e.to_string(),
    };
    assert!(msg(t.stream("", "jf_alpha", 1.0)).contains("empty"));
    assert!(msg(t.stream(" \n\t", "jf_alpha", 1.0)).contains("empty"));
    assert!(msg(t.stream("#### *** ~~~", "jf_alpha", 1.0)).contains("nothing speakable"));
    let e = msg(t.stream("Hello.", "af_heart", 1.0));
    assert!(e.contains("af_heart") && e.contains("jf_alpha"), "{e}");
    assert!(msg(t.stream("Hello.", "jf_alpha:x", 1.0)).contains("voice"));
    assert!(msg(t.stream("Hello.", "jf_alpha", 0.0)).contains("speed"));
    assert!(msg(t.stream("Hello.", "jf_alpha", f32::NAN)).contains("speed"));
    // phonemes outside the vocabulary are skipped (with a warning); none at all is an error
    let v = t.voices().get("jf_alpha").unwrap();
    let (ids, skipped) = t.vocab().encode("hə§lˈO");
    assert_eq!((ids.len(), skipped), (5, vec!['§']));
    assert!(t.speak_phonemes("§§", &v, 1.0).is_err());
    assert!(t.speak_phonemes(&"ə".repeat(511), &v, 1.0).unwrap_err().to_string().contains("510"));
}

#[test]
fn long_text_is_cut_under_the_phoneme_limit() -> Result<()> {
    let t = tts();
    // one sentence of ~900 phonemes with commas: cut at clause boundaries, no synthesis
    let clause = "the quick brown fox jumps over the lazy dog near the quiet river bank";
    let text = format!("{}.", vec![clause; 14].join(", "));
    let chunks = t.chunks(&text)?;
    assert!(chunks.len() >= 2, "{}", chunks.len());
    for c in &chunks {
        assert!(c.phonemes.chars().count() <= sapient_kokoro::MAX_PHONEMES);
    }
    assert!(chunks[0].phonemes.ends_with(','), "{}", chunks[0].phonemes);
    Ok(())
}

#[test]
fn load_limits_are_applied() {
    let r = sapient_hub::Hub::new()
        .and_then(|h| h.fetch_preset("kokoro-82m", &mut |_| {}))
        .expect("fetch kokoro-82m");
    // A ceiling under the model's larger tensors: an error naming the file and the limit.
    let small = sapient_tensor::Limits::default().max_alloc_bytes(64 << 10);
    let err = KokoroTts::from_dir_with(&r.dir, &candle_core::Device::Cpu, &small).err().expect("over the limit").to_string();
    assert!(err.contains("over the limit of 65536 bytes") && err.contains("kokoro-v1.0.int8.onnx"), "{err}");
}

#[test]
fn lead_silence_is_cut_from_the_samples_only() -> Result<()> {
    let t = tts();
    let text = "Paris is lovely.";
    let full = t.stream(text, "jm_kumo", 1.0)?.next().expect("a chunk")?;
    let cut = t.stream(text, "jm_kumo", 1.0)?.with_lead_silence(3).next().expect("a chunk")?;
    // Kokoro puts about 14 frames of silence in front; at most 3 of them stay
    let n = full.samples.len() - cut.samples.len();
    assert!(n >= 600, "only {n} samples cut");
    assert!(full.samples[..n].iter().all(|x| x.abs() < 0.01), "a cut sample was not silent");
    // the model ran as without the cut: the rest is the same samples
    assert_eq!(&full.samples[n..], &cut.samples[..]);
    let sound = cut.samples.iter().position(|x| x.abs() >= 0.01).expect("speech");
    assert!(sound <= 3 * 600, "{sound} samples of silence left");
    // the words moved with the samples
    assert_eq!(full.words.len(), cut.words.len());
    for (a, b) in full.words.iter().zip(&cut.words) {
        assert_eq!(a.word, b.word);
        assert!((a.end - n as f32 / 24_000.0 - b.end).abs() < 1e-4, "{a:?} then {b:?}");
    }
    Ok(())
}
