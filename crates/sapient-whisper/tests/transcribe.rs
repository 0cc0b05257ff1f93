//! Transcription of real speech (LibriVox clips from pocketsphinx-testdata, with their
//! transcripts) by the real tiny.en model; word error rate computed here after
//! normalisation (lowercase, punctuation removed). Whisper base is opt-in:
//! `SAPIENT_WHISPER_BASE=1`.

mod common;
use anyhow::Result;
use common::*;
use sapient_whisper::{compression_ratio, Error, OutputFormat, Task, TranscribeOptions, Transcriber, Transcript};
use std::sync::OnceLock;

/// Word error rate bounds over the five clips (71 words). tiny.en greedy and beam 5 make 3
/// errors (base: 1):
/// "ill disposed" heard as "old-sposed" and the reader's repeated "a" in "a more a amiable".
const WER_BOUND_TINY: f64 = 0.06;
const WER_BOUND_BASE: f64 = 0.03;

fn tiny() -> &'static Transcriber {
    static T: OnceLock<Transcriber> = OnceLock::new();
    T.get_or_init(|| {
        // f32 (the checkpoint's own matrices): the reference the Q8_0 tests compare with
        Transcriber::load_with("whisper-tiny.en", &candle_core::Device::Cpu, sapient_whisper::LoadOptions::f32(), &mut |_| {}).expect("load whisper-tiny.en")
    })
}

fn check_segments(r: &Transcript) {
    let mut prev = 0.0;
    for s in &r.segments {
        assert!(s.start >= prev - 1e-9, "segments go back in time: {:?}", r.segments);
        assert!(s.start < s.end && s.end <= r.duration + 1e-9, "segment {:.2}-{:.2} outside 0-{:.2}", s.start, s.end, r.duration);
        assert!(!s.text.trim().is_empty());
        prev = s.start;
    }
}

fn wer_over_clips(t: &Transcriber, opts: &TranscribeOptions) -> Result<f64> {
    let (mut errors, mut words) = (0, 0);
    for c in CLIPS {
        let r = t.transcribe(&clip(c), opts)?;
        check_segments(&r);
        let (e, n) = wer_counts(&reference(c), &r.text);
        eprintln!("{c}: {e}/{n} {:?}", r.text);
        errors += e;
        words += n;
    }
    let wer = errors as f64 / words as f64;
    eprintln!("WER {errors}/{words} = {wer:.3}");
    Ok(wer)
}

#[test]
fn librivox_greedy_wer() -> Result<()> {
    let wer = wer_over_clips(tiny(), &TranscribeOptions::default())?;
    assert!(wer <= WER_BOUND_TINY, "tiny.en greedy WER {wer:.3} > {WER_BOUND_TINY}");
    Ok(())
}

#[test]
fn librivox_beam5_wer() -> Result<()> {
    let opts = TranscribeOptions { beam_size: Some(5), ..Default::default() };
    let wer = wer_over_clips(tiny(), &opts)?;
    assert!(wer <= WER_BOUND_TINY, "tiny.en beam 5 WER {wer:.3} > {WER_BOUND_TINY}");
    Ok(())
}

#[test]
fn long_form_over_several_windows() -> Result<()> {
    // The clips twice over (about 55 s): two or more windows, seeking by the last timestamp.
    let (audio, reference) = long_audio(2);
    let r = tiny().transcribe(&audio, &TranscribeOptions::default())?;
    check_segments(&r);
    assert!(r.duration > 50.0);
    assert!(r.segments.iter().any(|s| s.start > 30.0), "nothing after the first window: {:?}", r.segments);
    assert!(r.segments.len() >= 8, "{} segments", r.segments.len());
    let (e, n) = wer_counts(&reference, &r.text);
    eprintln!("long form: {e}/{n}\n{}", r.render(OutputFormat::Srt));
    assert!((e as f64 / n as f64) <= WER_BOUND_TINY + 0.02, "long-form WER {e}/{n}");
    Ok(())
}

#[test]
fn silence_and_too_short_audio_give_empty_results() -> Result<()> {
    let t = tiny();
    let o = TranscribeOptions::default();
    for (what, audio) in [
        ("empty", vec![]),
        ("50 samples", vec![0.1f32; 50]),
        ("10 s of digital silence", vec![0.0f32; 160_000]),
        ("0.2 s of silence", vec![0.0f32; 3_200]),
    ] {
        let r = t.transcribe(&audio, &o)?;
        assert!(r.segments.is_empty() && r.text.is_empty(), "{what}: {:?}", r.text);
    }
    // quiet noise (-60 dBFS) is not speech either
    let mut x = 12345u32;
    let noise: Vec<f32> = (0..8 * 16_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x as f32 / u32::MAX as f32 - 0.5) * 0.002
        })
        .collect();
    let r = t.transcribe(&noise, &o)?;
    assert!(r.text.trim().is_empty(), "noise: {:?}", r.text);
    // not finite: an error, not a panic
    assert!(matches!(t.transcribe(&[0.0, f32::NAN, 0.0], &o), Err(Error::Options(_))));
    Ok(())
}

#[test]
fn english_only_model_rejects_other_tasks_and_languages() -> Result<()> {
    let t = tiny();
    let audio = clip("0880");
    let e = t.transcribe(&audio, &TranscribeOptions { task: Task::Translate, ..Default::default() });
    assert!(matches!(e, Err(Error::Options(_))), "{e:?}");
    let e = t.transcribe(&audio, &TranscribeOptions { language: Some("fr".into()), ..Default::default() });
    assert!(matches!(e, Err(Error::Options(_))), "{e:?}");
    assert!(matches!(
        t.transcribe(&audio, &TranscribeOptions { temperatures: vec![], ..Default::default() }),
        Err(Error::Options(_))
    ));
    Ok(())
}

#[test]
fn sampling_is_seeded_and_fallback_thresholds_apply() -> Result<()> {
    let t = tiny();
    let audio = clip("0890");
    // sampling only (no greedy pass), best of 3, fixed seed: reproducible and still right
    let o = TranscribeOptions { temperatures: vec![0.6], best_of: 3, seed: 7, ..Default::default() };
    let a = t.transcribe(&audio, &o)?;
    let b = t.transcribe(&audio, &o)?;
    assert_eq!(a.segments, b.segments);
    assert!(a.segments.iter().all(|s| s.temperature == 0.6));
    let (e, n) = wer_counts(&reference("0890"), &a.text);
    assert!(e * 4 <= n, "{e}/{n}: {:?}", a.text);
    // an impossible log-probability threshold forces every fallback temperature to be tried:
    // the last one (1.0) is the one reported
    let o = TranscribeOptions { logprob_threshold: Some(0.5), no_speech_threshold: None, ..Default::default() };
    let r = t.transcribe(&audio, &o)?;
    assert!(!r.segments.is_empty() && r.segments.iter().all(|s| s.temperature == 1.0), "{:?}", r.segments);
    // compression ratio: repetitive text is flagged, ordinary text is not
    assert!(compression_ratio(&"I am here. ".repeat(20)) > 2.4);
    assert!(compression_ratio("He might even have been made amiable himself.") < 2.4);
    Ok(())
}

#[test]
fn q8_0_decoder_keeps_the_transcripts() -> Result<()> {
    // decoder matrices and output projection quantized at load (sapient-tensor's kernels)
    let load = sapient_whisper::LoadOptions { quantize_decoder: Some(candle_core::quantized::GgmlDType::Q8_0), ..sapient_whisper::LoadOptions::f32() };
    let q = Transcriber::load_with("whisper-tiny.en", &candle_core::Device::Cpu, load, &mut |_| {})?;
    let wer = wer_over_clips(&q, &TranscribeOptions::default())?;
    // tiny.en has near-ties that the f32 model's own rounding decides: on the Zen 4 VM of
    // session 6 (the same code and files gave identical transcripts on the Zen 5 VM before)
    // the Q8_0 decoder heard clip 0890 as "coldhearted ... old-sposed" where the f32 model
    // hears "cold-hearted ... ill-disposed" (4 words; "old-sposed" is the f32 model's own
    // error on clip 0880). So: at most one clip may differ, by at most 4 words, and the WER
    // stays within those 4 words of the f32 bound.
    let words: usize = CLIPS.iter().map(|c| wer_counts(&reference(c), &reference(c)).1).sum();
    assert!(wer <= WER_BOUND_TINY + 4.0 / words as f64, "q8_0 decoder WER {wer:.3}");
    let mut differ = Vec::new();
    for c in CLIPS {
        let a = q.transcribe(&clip(c), &TranscribeOptions::default())?;
        let b = tiny().transcribe(&clip(c), &TranscribeOptions::default())?;
        if normalize(&a.text) != normalize(&b.text) {
            let (edits, _) = wer_counts(&b.text, &a.text);
            assert!(edits <= 4, "clip {c}: {edits} words from the f32 model's {:?}: {:?}", b.text, a.text);
            differ.push(c);
        }
    }
    assert!(differ.len() <= 1, "clips {differ:?} differ from the f32 model's transcripts");
    Ok(())
}

#[test]
fn q8_0_encoder_and_decoder_keep_the_transcripts() -> Result<()> {
    // `--quant q8_0`: the encoder's and decoder's matrices in Q8_0 (int8 products)
    let load = sapient_whisper::LoadOptions::quantized(candle_core::quantized::GgmlDType::Q8_0);
    let q = Transcriber::load_with("whisper-tiny.en", &candle_core::Device::Cpu, load, &mut |_| {})?;
    for beam in [None, Some(5)] {
        let o = TranscribeOptions { beam_size: beam, ..Default::default() };
        for c in CLIPS {
            let a = q.transcribe(&clip(c), &o)?;
            let b = tiny().transcribe(&clip(c), &o)?;
            assert_eq!(normalize(&a.text), normalize(&b.text), "clip {c}, beam {beam:?}");
        }
    }
    Ok(())
}

#[test]
fn initial_prompt_steers_the_spelling() -> Result<()> {
    // alone, tiny.en hears "ill disposed" as "old-sposed"; a prompt that uses the word fixes it
    let t = tiny();
    let audio = clip("0880");
    let plain = t.transcribe(&audio, &TranscribeOptions::default())?;
    assert!(!normalize(&plain.text).contains(&"ill".to_string()), "{:?}", plain.text);
    let o = TranscribeOptions { initial_prompt: Some("He was ill-disposed.".into()), ..Default::default() };
    let r = t.transcribe(&audio, &o)?;
    assert_eq!(normalize(&r.text), normalize(&reference("0880")), "{:?}", r.text);
    Ok(())
}

#[test]
fn output_formats() -> Result<()> {
    let t = tiny();
    let mut audio = clip("0880");
    audio.extend(std::iter::repeat_n(0.0, 8000));
    audio.extend(clip("0930"));
    let r = t.transcribe(&audio, &TranscribeOptions::default())?;
    assert!(!r.segments.is_empty());
    let text = r.render(OutputFormat::Text);
    assert_eq!(normalize(&text), normalize(&r.text));
    let srt = r.render(OutputFormat::Srt);
    let first = srt.lines().take(3).collect::<Vec<_>>();
    assert_eq!(first[0], "1");
    let re_ok = |s: &str, sep: char| s.len() == 12 && s.as_bytes()[8] as char == sep && s[..8].split(':').count() == 3;
    let (a, b) = first[1].split_once(" --> ").expect("srt timing line");
    assert!(re_ok(a, ',') && re_ok(b, ','), "{}", first[1]);
    assert_eq!(srt.matches(" --> ").count(), r.segments.len());
    let vtt = r.render(OutputFormat::Vtt);
    assert!(vtt.starts_with("WEBVTT\n\n"));
    let line = vtt.lines().nth(2).unwrap();
    let (a, b) = line.split_once(" --> ").expect("vtt timing line");
    assert!(re_ok(a, '.') && re_ok(b, '.'), "{line}");
    let j: serde_json::Value = serde_json::from_str(&r.render(OutputFormat::Json))?;
    assert_eq!(j["text"].as_str(), Some(r.text.as_str()));
    assert_eq!(j["language"].as_str(), Some("en"));
    let segs = j["segments"].as_array().unwrap();
    assert_eq!(segs.len(), r.segments.len());
    for (s, g) in segs.iter().zip(&r.segments) {
        assert!((s["start"].as_f64().unwrap() - g.start).abs() < 1e-3);
        assert_eq!(s["text"].as_str(), Some(g.text.as_str()));
    }
    assert!("srt".parse::<OutputFormat>().is_ok() && "doc".parse::<OutputFormat>().is_err());
    Ok(())
}

fn base_enabled() -> bool {
    std::env::var("SAPIENT_WHISPER_BASE").is_ok_and(|v| v == "1")
}

#[test]
fn base_multilingual_librivox() -> Result<()> {
    if !base_enabled() {
        eprintln!("skipped: SAPIENT_WHISPER_BASE=1 runs Whisper base");
        return Ok(());
    }
    let t = Transcriber::from_pretrained("whisper-base")?;
    assert!(t.tokenizer.multilingual);
    let audio = clip("0870");
    let probs = t.detect_language(&audio)?;
    assert_eq!(probs[0].0, "en", "{:?}", &probs[..3]);
    assert!(probs[0].1 > 0.5, "{:?}", &probs[..3]);
    let total: f32 = probs.iter().map(|p| p.1).sum();
    assert!((total - 1.0).abs() < 1e-3);
    // language detected inside transcribe when not given
    let r = t.transcribe(&audio, &TranscribeOptions::default())?;
    assert_eq!(r.language, "en");
    assert_eq!(r.language_probs[0].0, "en");
    let wer = wer_over_clips(&t, &TranscribeOptions::default())?;
    assert!(wer <= WER_BOUND_BASE, "base greedy WER {wer:.3}");
    let wer = wer_over_clips(&t, &TranscribeOptions { beam_size: Some(5), ..Default::default() })?;
    assert!(wer <= WER_BOUND_BASE, "base beam 5 WER {wer:.3}");
    // translating English speech into English keeps it
    let r = t.transcribe(&audio, &TranscribeOptions { task: Task::Translate, language: Some("en".into()), ..Default::default() })?;
    let (e, n) = wer_counts(&reference("0870"), &r.text);
    assert!(e * 4 <= n, "translate: {e}/{n} {:?}", r.text);
    Ok(())
}

#[test]
fn q8_0_long_form_keeps_the_words() -> Result<()> {
    // encoder and decoder quantized (`--quant q8_0`), the benchmark's 59.5 s file (the clips
    // twice with a second of silence after each), VAD attached as the CLI attaches it,
    // conditioning on the previous text: tiny.en f32 and faster-whisper int8 make 2 errors in
    // 142 words. Quantizing the encoded audio for the cross-attention keys and values once
    // made it 56 (greedy, a repetition loop) and 19 (beam 5).
    let onnx = preset("silero-vad").file("onnx").expect("silero onnx").to_path_buf();
    let vad = sapient_audio::SileroVad::load(onnx, &candle_core::Device::Cpu)?;
    let load = sapient_whisper::LoadOptions::quantized(candle_core::quantized::GgmlDType::Q8_0);
    let t = Transcriber::load_with("whisper-tiny.en", &candle_core::Device::Cpu, load, &mut |_| {})?.with_vad(vad);
    let (audio, text) = long_audio(2);
    for beam in [None, Some(5)] {
        let r = t.transcribe(&audio, &TranscribeOptions { beam_size: beam, ..Default::default() })?;
        let (e, n) = wer_counts(&text, &r.text);
        assert!(e <= 4, "beam {beam:?}: {e}/{n} word errors: {}", r.text);
    }
    Ok(())
}

#[test]
fn base_q8_0_greedy_long_form_does_not_loop() -> Result<()> {
    // Whisper base greedy on the benchmark's 59.5 s file: the second window starts (at the
    // last timestamp, 28.0 s) inside the prompt's last sentence, and decoded with the prompt
    // at temperature 0 it repeats that sentence in a loop (and the sampled fallback then
    // made 8 errors in 142 words). Decoded again at temperature 0 without the prompt, it
    // does not loop: no window needs the sampled fallback, no segment repeats the one before,
    // and it makes faster-whisper int8's 3 errors (one is "himself" said again at 28.0 s).
    if !base_enabled() {
        eprintln!("skipped: SAPIENT_WHISPER_BASE=1 runs Whisper base");
        return Ok(());
    }
    let onnx = preset("silero-vad").file("onnx").expect("silero onnx").to_path_buf();
    let vad = sapient_audio::SileroVad::load(onnx, &candle_core::Device::Cpu)?;
    let load = sapient_whisper::LoadOptions::quantized(candle_core::quantized::GgmlDType::Q8_0);
    let t = Transcriber::load_with("whisper-base", &candle_core::Device::Cpu, load, &mut |_| {})?.with_vad(vad);
    let (audio, text) = long_audio(2);
    let r = t.transcribe(&audio, &TranscribeOptions::default())?;
    let (e, n) = wer_counts(&text, &r.text);
    eprintln!("base q8_0 greedy: {e}/{n}\n{}", r.render(OutputFormat::Srt));
    check_segments(&r);
    for s in &r.segments {
        assert_eq!(s.temperature, 0.0, "segment decoded by the sampled fallback: {s:?}");
    }
    for w in r.segments.windows(2) {
        let (a, b) = (w[0].text.trim().to_lowercase(), w[1].text.trim().to_lowercase());
        assert!(!a.ends_with(&b) && !b.starts_with(&a), "repeated: {a:?} then {b:?}");
    }
    assert!(e <= 4, "{e}/{n} word errors: {}", r.text);
    Ok(())
}
