//! `sapient speak` end to end (the speech itself is checked by the round trip through
//! Whisper in `tests/speech_roundtrip.rs` at the top of the repository).

use std::process::Command;

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
