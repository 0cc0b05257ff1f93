//! Batched long-form transcription ([`LongForm::Batched`]) of real speech (the LibriVox clips
//! with their transcripts) by the real tiny.en model and Silero VAD: word errors against the
//! reference transcript, segment times, and a batch of windows decoded together giving what
//! each window gives decoded alone.

mod common;
use anyhow::Result;
use common::*;
use sapient_whisper::decode::{decode_batch, decode_window, DecodeOptions};
use sapient_whisper::{LongForm, TranscribeOptions, Transcriber, Transcript};
use std::sync::OnceLock;

fn vad() -> sapient_audio::SileroVad {
    let onnx = preset("silero-vad").file("onnx").expect("silero onnx").to_path_buf();
    sapient_audio::SileroVad::load(onnx, &candle_core::Device::Cpu).expect("load silero")
}

fn tiny() -> &'static Transcriber {
    static T: OnceLock<Transcriber> = OnceLock::new();
    T.get_or_init(|| Transcriber::from_pretrained("whisper-tiny.en").expect("load whisper-tiny.en").with_vad(vad()))
}

fn tiny_q8() -> &'static Transcriber {
    static T: OnceLock<Transcriber> = OnceLock::new();
    T.get_or_init(|| {
        let load = sapient_whisper::LoadOptions::quantized(candle_core::quantized::GgmlDType::Q8_0);
        Transcriber::load_with("whisper-tiny.en", &candle_core::Device::Cpu, load, &mut |_| {}).expect("load whisper-tiny.en q8_0").with_vad(vad())
    })
}

/// Segments in order and inside the file; with `no_overlap`, each starts where the one
/// before ended or later (word timestamps move segment edges to the words' edges, which
/// can overlap by a few hundredths).
fn check_segments(r: &Transcript, no_overlap: bool) {
    let (mut prev_start, mut prev_end) = (0.0, 0.0);
    for s in &r.segments {
        assert!(s.start >= prev_start, "segments go back in time: {:?}", r.segments);
        assert!(!no_overlap || s.start >= prev_end - 1e-9, "segments overlap: {:?}", r.segments);
        prev_start = s.start;
        assert!(s.start < s.end && s.end <= r.duration + 1e-9, "segment {:.2}-{:.2} outside 0-{:.2}", s.start, s.end, r.duration);
        assert!(!s.text.trim().is_empty());
        prev_end = s.end;
    }
}

/// The clips three times over (89 s): chunks of up to 30 s, two per batch (so several
/// batches and a last partial one); greedy and beam 5, f32 and q8_0. tiny.en makes 3 errors
/// in 71 words on the clips one by one (see transcribe.rs); the bound allows that rate and
/// a word or two at chunk edges.
#[test]
fn batched_long_form_word_errors_and_times() -> Result<()> {
    let (audio, reference) = long_audio(3);
    for (name, t) in [("f32", tiny()), ("q8_0", tiny_q8())] {
        for beam in [None, Some(5)] {
            let opts = TranscribeOptions { beam_size: beam, long_form: LongForm::Batched { batch_size: 2 }, ..Default::default() };
            let r = t.transcribe(&audio, &opts)?;
            check_segments(&r, true);
            let (e, n) = wer_counts(&reference, &r.text);
            eprintln!("{name} beam {beam:?}: {e}/{n} word errors, {} segments", r.segments.len());
            assert!(r.segments.len() >= 6, "{} segments", r.segments.len());
            assert!(r.segments.last().is_some_and(|s| s.end > r.duration - 10.0), "the end is missing: {:?}", r.segments.last());
            assert!(e as f64 / n as f64 <= 0.08, "{name} beam {beam:?}: batched WER {e}/{n}\n{}", r.text);
        }
    }
    // without timestamps: one segment per chunk, each within 30 s
    let opts = TranscribeOptions { without_timestamps: true, long_form: LongForm::Batched { batch_size: 8 }, ..Default::default() };
    let r = tiny_q8().transcribe(&audio, &opts)?;
    check_segments(&r, true);
    assert!(r.segments.iter().all(|s| s.end - s.start <= 30.0 + 1e-6));
    assert!(r.segments.len() >= 3);
    let (e, n) = wer_counts(&reference, &r.text);
    assert!(e as f64 / n as f64 <= 0.08, "without timestamps: batched WER {e}/{n}\n{}", r.text);
    Ok(())
}

/// Five windows encoded as one batch and decoded together give each window's text and
/// tokens as it gets encoded and decoded alone (greedy and beam 5, with timestamps and
/// without as the batched mode's default; f32 and q8_0).
#[test]
fn a_batch_decodes_as_its_windows_one_by_one() -> Result<()> {
    for t in [tiny(), tiny_q8()] {
        let windows: Vec<candle_core::Tensor> = CLIPS.iter().map(|c| t.mel_window(&clip(c))).collect::<Result<_, _>>()?;
        let audio = t.model.encode(&candle_core::Tensor::stack(&windows, 0)?)?;
        let batch = t.model.cross_kv_batch(&audio)?;
        let refs: Vec<_> = batch.iter().collect();
        for (beam, without_timestamps) in [(None, false), (Some(5), false), (Some(5), true)] {
            let opts = DecodeOptions { beam_size: beam, without_timestamps, language: Some("en".into()), ..Default::default() };
            let together = decode_batch(&t.model, &t.tokenizer, &refs, &opts)?;
            assert_eq!(together.len(), CLIPS.len());
            let (mut errors, mut words) = (0, 0);
            for ((w, r), c) in windows.iter().zip(&together).zip(CLIPS) {
                let cross = t.model.cross_kv(&t.model.encode(w)?)?;
                let alone = decode_window(&t.model, &t.tokenizer, &cross, &opts)?;
                assert_eq!(r.text, alone.text, "clip {c}, beam {beam:?}, without timestamps {without_timestamps}");
                assert_eq!(r.tokens, alone.tokens, "clip {c}, beam {beam:?}, without timestamps {without_timestamps}");
                assert!((r.no_speech_prob - alone.no_speech_prob).abs() < 1e-3);
                assert!((r.avg_logprob - alone.avg_logprob).abs() < 1e-3, "{} {}", r.avg_logprob, alone.avg_logprob);
                let (e, n) = wer_counts(&reference(c), &r.text);
                errors += e;
                words += n;
            }
            // tiny.en makes 3 to 5 errors in these 71 words (the clips one by one, no context)
            assert!(errors as f64 / words as f64 <= 0.08, "{errors}/{words}");
        }
    }
    Ok(())
}

#[test]
fn batched_mode_needs_a_vad_and_a_batch_size() -> Result<()> {
    let bare = Transcriber::from_pretrained("whisper-tiny.en")?;
    let audio = clip("0870");
    let opts = TranscribeOptions { long_form: LongForm::Batched { batch_size: 8 }, ..Default::default() };
    let e = bare.transcribe(&audio, &opts).expect_err("no VAD attached");
    assert!(e.to_string().contains("VAD"), "{e}");
    let zero = TranscribeOptions { long_form: LongForm::Batched { batch_size: 0 }, ..Default::default() };
    let e = tiny().transcribe(&audio, &zero).expect_err("batch size 0");
    assert!(e.to_string().contains("batch size"), "{e}");
    // silence: no speech, no segment
    let r = tiny().transcribe(&vec![0.0f32; 16_000 * 40], &opts)?;
    assert!(r.segments.is_empty() && r.text.is_empty(), "{:?}", r.segments);
    Ok(())
}

/// Word timestamps in the batched mode: every word inside its segment, in order, and the
/// words spell the segment's text.
#[test]
fn batched_word_timestamps() -> Result<()> {
    let (audio, reference) = long_audio(1);
    let opts = TranscribeOptions { word_timestamps: true, long_form: LongForm::Batched { batch_size: 8 }, ..Default::default() };
    let r = tiny_q8().transcribe(&audio, &opts)?;
    check_segments(&r, false);
    let mut prev = 0.0;
    for s in &r.segments {
        assert!(!s.words.is_empty(), "no words in {s:?}");
        let text: String = s.words.iter().map(|w| w.word.as_str()).collect();
        assert_eq!(text.trim(), s.text.trim());
        for w in &s.words {
            assert!(w.start >= prev - 0.25 && w.start <= w.end, "word {w:?} after {prev}");
            assert!(w.start >= s.start - 1e-6 && w.end <= s.end + 1e-6, "word {w:?} outside {:.2}-{:.2}", s.start, s.end);
            prev = w.end;
        }
    }
    let (e, n) = wer_counts(&reference, &r.text);
    assert!(e as f64 / n as f64 <= 0.08, "{e}/{n}");
    Ok(())
}
