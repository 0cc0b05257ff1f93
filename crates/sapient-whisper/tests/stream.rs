//! Streaming transcription (Silero VAD stretches, pushed in 100 ms chunks) against the file
//! mode on the same audio: the LibriVox clips twice over with a second of silence after each.
//!
//! The two modes do not give identical text with tiny.en: the file mode's 30 s windows hear
//! "ill-disposed" where a stretch decoded on its own (or any 29 s VAD cut tried) hears
//! "old-sposed", the same as the clip alone. The test bounds the difference.

mod common;
use anyhow::Result;
use common::*;
use sapient_audio::{SamplesStream, SileroVad};
use sapient_whisper::{default_vad_options, StreamingTranscriber, TranscribeOptions, Transcriber};

fn vad() -> SileroVad {
    let onnx = preset("silero-vad").file("onnx").expect("silero onnx").to_path_buf();
    SileroVad::load(onnx, &candle_core::Device::Cpu).expect("load silero")
}

fn audio() -> (Vec<f32>, String) {
    let mut a = Vec::new();
    let mut text = String::new();
    for _ in 0..2 {
        for c in CLIPS {
            a.extend(clip(c));
            a.extend(std::iter::repeat_n(0.0f32, 16_000));
            text.push_str(&reference(c));
            text.push(' ');
        }
    }
    (a, text)
}

#[test]
fn streaming_gives_the_file_modes_text() -> Result<()> {
    let t = Transcriber::from_pretrained("whisper-tiny.en")?;
    let (samples, reference) = audio();
    let file = t.transcribe(&samples, &TranscribeOptions::default())?;

    // push-based, 100 ms at a time: segments come out while audio is still arriving
    let mut st = StreamingTranscriber::new(&t, vad(), default_vad_options(), 16_000, TranscribeOptions::default())?;
    let mut early = Vec::new();
    for chunk in samples.chunks(1600) {
        for s in st.push(chunk)? {
            assert!(s.end <= st.seconds_received() + 1e-6, "segment ends after the audio received");
            early.push((st.seconds_received(), s));
        }
    }
    let (last, streamed) = st.finish()?;
    assert!(early.len() >= 4, "only {} segments before the end of the stream", early.len());
    // a segment is decided about a second after its stretch of speech ends (1 s of silence
    // closes a stretch; the VAD pads 0.3 s)
    let mut lat: Vec<f64> = early.iter().map(|(received, s)| received - s.end).collect();
    lat.sort_by(|a, b| a.total_cmp(b));
    eprintln!("decision latency: median {:.2} s, max {:.2} s", lat[lat.len() / 2], lat[lat.len() - 1]);
    assert!(lat[lat.len() - 1] < 3.0, "latencies {lat:?}");
    assert_eq!(early.len() + last.len(), streamed.segments.len());
    eprintln!("file:   {}\nstream: {}", file.text, streamed.text);
    let (d, n) = wer_counts(&file.text, &streamed.text);
    eprintln!("stream vs file: {d}/{n} words differ");
    assert!(d * 100 <= n * 6, "stream vs file: {d}/{n} words differ");
    let (e, n) = wer_counts(&reference, &streamed.text);
    eprintln!("stream WER {e}/{n}");
    assert!(e * 100 <= n * 8, "stream WER {e}/{n}");
    // times from the start of the stream, in order, inside the audio
    let mut prev = 0.0;
    for s in &streamed.segments {
        assert!(s.start >= prev - 1e-9 && s.start < s.end && s.end <= streamed.duration + 1e-9, "{s:?}");
        prev = s.start;
    }
    // segments line up with the file mode's (one per sentence, starts within 0.5 s)
    assert_eq!(streamed.segments.len(), file.segments.len());
    for (a, b) in streamed.segments.iter().zip(&file.segments) {
        assert!((a.start - b.start).abs() < 0.5, "stream {:.2} vs file {:.2}: {}", a.start, b.start, a.text);
    }

    // the AudioStream entry point gives the same transcript
    let stream = SamplesStream::new(samples.clone(), 16_000, 4000)?;
    let mut n_cb = 0;
    let again = t.transcribe_stream(stream, vad(), default_vad_options(), &TranscribeOptions::default(), &mut |_| n_cb += 1)?;
    assert_eq!(again.text, streamed.text);
    assert_eq!(n_cb, again.segments.len());
    Ok(())
}

#[test]
fn partial_text_while_a_stretch_is_open() -> Result<()> {
    // clip 0870 (7.1 s) then silence: 4 s in, the stretch is still open; its partial text is
    // the start of the sentence, and once the silence closes it the partial text is empty
    let t = Transcriber::from_pretrained("whisper-tiny.en")?;
    let mut audio = clip("0870");
    audio.extend(std::iter::repeat_n(0.0f32, 2 * 16_000));
    let mut st = StreamingTranscriber::new(&t, vad(), default_vad_options(), 16_000, TranscribeOptions::default())?;
    let mut decided = Vec::new();
    let mut partial_at_4s = None;
    for chunk in audio.chunks(1600) {
        decided.extend(st.push(chunk)?);
        if partial_at_4s.is_none() && st.seconds_received() >= 4.0 {
            assert!(decided.is_empty(), "decided before the sentence ended");
            partial_at_4s = Some(st.partial()?);
        }
    }
    let p = partial_at_4s.expect("partial text");
    eprintln!("partial at 4 s: {p:?}");
    let words = normalize(&p);
    let full = normalize(&reference("0870"));
    assert!(words.len() >= 5 && words.len() < full.len(), "{p:?}");
    assert_eq!(words[..5], full[..5], "{p:?}");
    assert_eq!(decided.len(), 1, "{decided:?}");
    assert_eq!(st.partial()?, "", "nothing pending after the stretch closed");
    Ok(())
}

#[test]
fn streaming_silence_gives_nothing() -> Result<()> {
    let t = Transcriber::from_pretrained("whisper-tiny.en")?;
    let stream = SamplesStream::new(vec![0.0f32; 5 * 16_000], 16_000, 1600)?;
    let r = t.transcribe_stream(stream, vad(), default_vad_options(), &TranscribeOptions::default(), &mut |_| {})?;
    assert!(r.segments.is_empty() && r.text.is_empty());
    assert!((r.duration - 5.0).abs() < 1e-9);
    Ok(())
}
