//! `sapient transcribe` end to end on a real LibriVox clip with whisper-tiny.en.

use std::process::Command;

fn clip() -> std::path::PathBuf {
    let m = sapient_hub::Hub::new()
        .and_then(|h| h.fetch_preset("speech-librivox", &mut |_| {}))
        .expect("speech-librivox");
    m.files("audio")
        .iter()
        .find(|p| p.to_string_lossy().ends_with("-0930.wav"))
        .expect("clip 0930")
        .clone()
}

fn words(s: &str) -> Vec<String> {
    s.to_lowercase()
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(String::from)
        .collect()
}

#[test]
fn transcribe_json_and_srt() {
    let exe = env!("CARGO_BIN_EXE_sapient");
    let out = Command::new(exe)
        .args(["transcribe", "--model", "whisper-tiny.en", "--beam", "1", "--format", "json"])
        .arg(clip())
        .output()
        .expect("run sapient");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json on stdout");
    assert_eq!(words(j["text"].as_str().unwrap()), words("he might even have been made amiable himself"));
    let segs = j["segments"].as_array().unwrap();
    assert!(!segs.is_empty());
    let end = segs.last().unwrap()["end"].as_f64().unwrap();
    assert!(end > 2.0 && end <= j["duration"].as_f64().unwrap() + 1e-6);

    let dir = tempfile::tempdir().unwrap();
    let srt = dir.path().join("out.srt");
    let st = Command::new(exe)
        .args(["transcribe", "--format", "srt", "--output"])
        .arg(&srt)
        .arg(clip())
        .status()
        .expect("run sapient");
    assert!(st.success());
    let text = std::fs::read_to_string(&srt).unwrap();
    assert!(text.starts_with("1\n00:00:0"), "{text}");
    assert!(words(&text).ends_with(&words("he might even have been made amiable himself")), "{text}");
}

#[test]
fn transcribe_stream_through_the_vad() {
    let exe = env!("CARGO_BIN_EXE_sapient");
    let out = Command::new(exe)
        .args(["transcribe", "--stream", "--beam", "1", "--format", "vtt"])
        .arg(clip())
        .output()
        .expect("run sapient");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let vtt = String::from_utf8_lossy(&out.stdout);
    assert!(vtt.starts_with("WEBVTT"), "{vtt}");
    assert!(words(&vtt).ends_with(&words("he might even have been made amiable himself")), "{vtt}");
    // segments are reported on stderr as they are decided
    assert!(String::from_utf8_lossy(&out.stderr).contains("He might even have been made amiable himself"));
}

#[test]
fn stream_output_equals_file_output_at_another_rate() {
    // the clip at 22.05 kHz (Float32 WAV): the stream is resampled chunk by chunk, the file
    // mode resamples it whole; the windows mode gives the same json (words included)
    let exe = env!("CARGO_BIN_EXE_sapient");
    let a = sapient_audio::decode_file(clip()).expect("decode clip");
    let up = sapient_audio::resample(&a.samples, a.sample_rate, 22_050).expect("resample");
    let dir = tempfile::tempdir().unwrap();
    let wav = dir.path().join("clip-22k.wav");
    sapient_audio::write_wav(&wav, &up, 22_050, sapient_audio::WavFormat::Float32).expect("write wav");
    let run = |extra: &[&str]| {
        let out = Command::new(exe)
            .args(["transcribe", "--beam", "1", "--format", "json"])
            .args(extra)
            .arg(&wav)
            .output()
            .expect("run sapient");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let file = run(&["--word-timestamps"]);
    let stream = run(&["--stream", "--word-timestamps"]);
    assert_eq!(stream, file);
    let j: serde_json::Value = serde_json::from_str(&file).expect("json");
    assert_eq!(words(j["text"].as_str().unwrap_or("")), words("he might even have been made amiable himself"), "{file}");
    assert!(j["segments"][0]["words"].as_array().is_some_and(|w| w.len() == 8), "{file}");
}

#[test]
fn transcribe_errors_are_reported() {
    let exe = env!("CARGO_BIN_EXE_sapient");
    let out = Command::new(exe).args(["transcribe", "--format", "doc"]).arg(clip()).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("output format 'doc'"));
    let out = Command::new(exe).args(["transcribe", "--stream", "--stream-mode", "chunks"]).arg(clip()).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("stream mode 'chunks'"));
    let out = Command::new(exe).args(["transcribe", "/nonexistent/audio.wav"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/audio.wav"));
    let out = Command::new(exe).args(["transcribe", "--task", "translate"]).arg(clip()).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot translate"));
}

#[test]
fn transcribe_batched() {
    let exe = env!("CARGO_BIN_EXE_sapient");
    for flag in ["--batched", "--batched=2"] {
        let out = Command::new(exe)
            .args(["transcribe", flag, "--beam", "1", "--format", "json"])
            .arg(clip())
            .output()
            .expect("run sapient");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json on stdout");
        assert_eq!(words(j["text"].as_str().unwrap()), words("he might even have been made amiable himself"), "{flag}");
        let segs = j["segments"].as_array().unwrap();
        let (start, end) = (segs[0]["start"].as_f64().unwrap(), segs.last().unwrap()["end"].as_f64().unwrap());
        assert!(0.0 <= start && start < end && end <= j["duration"].as_f64().unwrap() + 1e-6);
    }
    let out = Command::new(exe).args(["transcribe", "--batched", "--no-vad"]).arg(clip()).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--no-vad"));
    let out = Command::new(exe).args(["transcribe", "--batched=0"]).arg(clip()).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("at least 1"));
}
