//! Whisper log-mel against the numpy transcription of whisper/audio.py
//! (scripts/audio/make_reference.py) on LibriVox speech, filters against mel_filters.npz,
//! streaming equals one-shot.

mod common;

use common::*;
use sapient_audio::mel::{N_FREQS, N_SAMPLES};
use sapient_audio::{Error, LogMel, MelFilters};

#[test]
fn computed_filters_equal_whispers_npz() {
    for n in [80, 128] {
        let ours = MelFilters::whisper(n).unwrap();
        let file = MelFilters::from_npz(mel_filters_npz(), n).unwrap();
        assert_eq!(file.as_slice().len(), n * N_FREQS);
        let d = max_abs_diff(ours.as_slice(), file.as_slice());
        println!("mel_{n}: computed vs npz max diff {d:.2e}");
        assert!(d < 1e-7, "mel_{n}: {d}");
    }
    assert!(matches!(MelFilters::from_npz(mel_filters_npz(), 64), Err(Error::MelFilters(_))));
}

/// Compares `[n_mels, n_frames]` ours with the reference's every `step`-th frame.
fn compare(mel: &sapient_audio::Mel, reference: &common::NpyArray, step: usize) -> f32 {
    assert_eq!(reference.shape[0], mel.n_mels);
    assert_eq!(reference.shape[1], mel.n_frames.div_ceil(step), "frame count");
    let cols = reference.shape[1];
    let mut max = 0f32;
    for m in 0..mel.n_mels {
        for j in 0..cols {
            let d = (mel.get(m, j * step) - reference.data[m * cols + j] as f32).abs();
            max = max.max(d);
        }
    }
    max
}

#[test]
fn log_mel_80_matches_whisper_on_speech() {
    let x = clip_samples("0880");
    let reference = npy("mel80_0880.npy");
    for (what, mel) in [
        ("computed filters", LogMel::new(80).unwrap()),
        ("mel_filters.npz", LogMel::with_filters(MelFilters::from_npz(mel_filters_npz(), 80).unwrap()).unwrap()),
    ] {
        let m = mel.log_mel(&x).unwrap();
        assert_eq!(m.n_frames, x.len() / 160);
        let d = compare(&m, &reference, 1);
        println!("mel80 (0880, {what}): max abs diff {d:.2e}");
        assert!(d < 1e-4, "{what}: {d}");
    }
}

#[test]
fn log_mel_128_and_whisper_padding_match() {
    let m = LogMel::new(128).unwrap().log_mel(&clip_samples("0930")).unwrap();
    let d = compare(&m, &npy("mel128_0930_every4.npy"), 4);
    println!("mel128 (0930): max abs diff {d:.2e}");
    assert!(d < 1e-4, "{d}");

    // As whisper.transcribe: 30 s of zeros appended before the STFT.
    let x = clip_samples("0870");
    let m = LogMel::new(80).unwrap().log_mel_padded(&x, N_SAMPLES).unwrap();
    assert_eq!(m.n_frames, (x.len() + N_SAMPLES) / 160);
    let d = compare(&m, &npy("mel80_0870_pad30s_every16.npy"), 16);
    println!("mel80 padded 30 s (0870): max abs diff {d:.2e}");
    assert!(d < 1e-4, "{d}");
}

#[test]
fn stream_equals_one_shot() {
    let x = clip_samples("0920");
    let mel = LogMel::new(80).unwrap();
    let whole = mel.log_mel(&x).unwrap();
    for (seed, max) in [(5u64, 97usize), (8, 4000), (13, 1)] {
        let xs = &x[..if max == 1 { 5000 } else { x.len() }];
        let want = if max == 1 { mel.log_mel(xs).unwrap() } else { whole.clone() };
        let mut s = mel.stream();
        let mut at = 0;
        let mut frames = 0;
        for n in chunk_lengths(xs.len(), max, seed) {
            frames += s.push(&xs[at..at + n]).unwrap();
            at += n;
            assert_eq!(s.n_frames(), frames);
            // Exactly the frames whose whole window has arrived are out.
            assert!(frames == 0 || (frames - 1) * 160 + 200 <= at);
            assert!(frames * 160 + 200 > at);
        }
        frames += s.finish().unwrap();
        assert_eq!(frames, want.n_frames);
        let got = s.mel().unwrap();
        assert_eq!(got, want, "chunks up to {max}");
        assert!(matches!(s.push(&[0.0]), Err(Error::InvalidInput(_))));
    }
}

#[test]
fn short_and_bad_input() {
    let mel = LogMel::new(80).unwrap();
    assert!(matches!(mel.log_mel(&[]), Err(Error::ZeroLength { .. })));
    assert!(matches!(mel.log_mel(&[0.1; 159]), Err(Error::TooShort { got: 159, need: 160, .. })));
    assert!(matches!(mel.log_mel(&[0.0, f32::NAN, 0.0]), Err(Error::NonFinite { index: 1, .. })));
    assert!(matches!(LogMel::new(0), Err(Error::MelFilters(_))));
    // Shorter than the reflect padding: reflected repeatedly (as numpy does), finite output.
    let m = mel.log_mel(&noise(170, 0.3, 4)).unwrap();
    assert_eq!(m.n_frames, 1);
    assert!(m.data.iter().all(|v| v.is_finite()));
    // Silence: everything sits at the floor ((-10 + 4) / 4 clamped to max - 8 = -10).
    let m = mel.log_mel(&vec![0.0; 16_000]).unwrap();
    assert!(m.data.iter().all(|&v| (v - (-1.5)).abs() < 1e-6));
    let mut s = mel.stream();
    assert!(matches!(s.finish(), Err(Error::ZeroLength { .. })));
}
