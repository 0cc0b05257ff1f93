//! Resampling: accuracy on a sine, LibriVox 16 kHz -> 48 kHz -> 16 kHz, streaming equals
//! one-shot, lengths, bad rates.

mod common;

use common::*;
use sapient_audio::{resample, Error, Resampler};

fn sine(freq: f64, rate: u32, n: usize) -> Vec<f32> {
    (0..n).map(|i| (0.5 * (2.0 * std::f64::consts::PI * freq * i as f64 / rate as f64).sin()) as f32).collect()
}

fn snr_db(reference: &[f32], got: &[f32]) -> f64 {
    let sig: f64 = reference.iter().map(|&x| (x as f64).powi(2)).sum();
    let err: f64 = reference.iter().zip(got).map(|(&a, &b)| (a as f64 - b as f64).powi(2)).sum();
    10.0 * (sig / err.max(1e-300)).log10()
}

#[test]
fn sine_is_resampled_accurately() {
    for (from, to) in [(16_000, 48_000), (48_000, 16_000), (44_100, 16_000), (22_050, 16_000), (16_000, 44_100), (44_101, 16_000)] {
        let n = from as usize; // one second
        let out = resample(&sine(440.0, from, n), from, to).unwrap();
        assert_eq!(out.len() as u64, (n as u64 * to as u64).div_ceil(from as u64), "{from}->{to} length");
        let want = sine(440.0, to, out.len());
        // Away from the edges (where the input simply stops), the output is the sine itself.
        let edge = to as usize / 50;
        let d = max_abs_diff(&out[edge..out.len() - edge], &want[edge..out.len() - edge]);
        println!("{from} -> {to}: max error {d:.2e}");
        assert!(d < 1e-4, "{from} -> {to}: max error {d}");
    }
}

#[test]
fn librivox_to_48k_and_back() {
    for c in CLIPS {
        let x = clip_samples(c);
        let up = resample(&x, 16_000, 48_000).unwrap();
        assert_eq!(up.len(), x.len() * 3);
        // Every third sample of the 48 kHz signal lands on an original sample.
        let on_grid: Vec<f32> = up.iter().step_by(3).copied().collect();
        let back = resample(&up, 48_000, 16_000).unwrap();
        assert_eq!(back.len(), x.len());
        let (e0, e1) = (800, x.len() - 800);
        let snr_grid = snr_db(&x[e0..e1], &on_grid[e0..e1]);
        let snr_back = snr_db(&x[e0..e1], &back[e0..e1]);
        let d = max_abs_diff(&x[e0..e1], &back[e0..e1]);
        println!("{c}: 16k->48k on-grid SNR {snr_grid:.1} dB, round trip SNR {snr_back:.1} dB, max error {d:.2e}");
        assert!(snr_grid > 60.0, "{c}: 48 kHz signal off the original ({snr_grid:.1} dB)");
        assert!(snr_back > 55.0, "{c}: round trip SNR {snr_back:.1} dB");
    }
}

#[test]
fn streaming_equals_one_shot() {
    let x = clip_samples("0890");
    for (from, to) in [(16_000u32, 48_000u32), (16_000, 8_000), (16_000, 22_050), (16_000, 16_001)] {
        let whole = resample(&x, from, to).unwrap();
        for seed in [3u64, 11] {
            let mut r = Resampler::new(from, to).unwrap();
            let mut out = Vec::new();
            let mut at = 0;
            for n in chunk_lengths(x.len(), 3000, seed) {
                out.extend(r.process(&x[at..at + n]).unwrap());
                at += n;
            }
            out.extend(r.finish().unwrap());
            assert_eq!(out.len(), whole.len(), "{from}->{to}");
            let d = max_abs_diff(&out, &whole);
            assert!(d < 1e-6, "{from}->{to}: chunked differs from one-shot by {d}");
            // After reset the resampler starts over.
            r.reset();
            let mut again = r.process(&x).unwrap();
            again.extend(r.finish().unwrap());
            assert!(max_abs_diff(&again, &whole) < 1e-6);
        }
    }
}

#[test]
fn same_rate_is_identity_and_bad_rates_fail() {
    let x = noise(1000, 0.5, 9);
    assert_eq!(resample(&x, 16_000, 16_000).unwrap(), x);
    assert!(matches!(resample(&x, 0, 16_000), Err(Error::InvalidSampleRate { rate: 0 })));
    assert!(matches!(resample(&x, 16_000, 10_000_000), Err(Error::InvalidSampleRate { rate: 10_000_000 })));
    assert!(matches!(Resampler::new(16_000, 999), Err(Error::InvalidSampleRate { rate: 999 })));
    assert!(matches!(resample(&[0.0, f32::INFINITY], 16_000, 48_000), Err(Error::NonFinite { index: 1, .. })));
    assert!(resample(&[], 16_000, 48_000).unwrap().is_empty());
    let mut r = Resampler::new(16_000, 48_000).unwrap();
    r.finish().unwrap();
    assert!(matches!(r.process(&x), Err(Error::InvalidInput(_))));
}
