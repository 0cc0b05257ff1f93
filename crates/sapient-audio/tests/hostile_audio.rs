//! Hostile audio files: a WAV whose header claims hours of samples, implausible sample rates,
//! zero channels, a decode longer than the duration limit, truncations. Each is an error (or,
//! for a header that only overstates its length, the samples actually present) within a
//! second, with a heap peak bounded by the decoded samples rather than by the header's claims.

#[path = "../../sapient-tensor/tests/support/hostile.rs"]
mod support;

use sapient_audio::{decode_bytes, Decoder, Error};
use support::{hostile, measure};

/// symphonia's read-ahead buffer, allocated for any input.
const SYMPHONIA_BUFFER: usize = 64 << 10;

#[global_allocator]
static METER: support::Meter = support::Meter;

/// A 16-bit PCM WAV with `frames` frames of silence whose header claims `data_len` bytes.
fn wav(rate: u32, channels: u16, frames: usize, data_len: u32) -> Vec<u8> {
    let mut b = b"RIFF".to_vec();
    b.extend(data_len.saturating_add(36).to_le_bytes());
    b.extend(b"WAVEfmt ");
    b.extend(16u32.to_le_bytes());
    b.extend(1u16.to_le_bytes());
    b.extend(channels.to_le_bytes());
    b.extend(rate.to_le_bytes());
    b.extend((rate * 2 * channels.max(1) as u32).to_le_bytes());
    b.extend((2 * channels).to_le_bytes());
    b.extend(16u16.to_le_bytes());
    b.extend(b"data");
    b.extend(data_len.to_le_bytes());
    b.extend(vec![0u8; frames * 2 * channels.max(1) as usize]);
    b
}

#[test]
fn a_header_claiming_hours_decodes_what_is_there() {
    // The header claims 4 GiB of samples (37 hours at 16 kHz); one second is present.
    let b = wav(16_000, 1, 16_000, u32::MAX - 64);
    let (r, peak, elapsed) = measure(|| decode_bytes(b.clone()));
    let a = r.unwrap();
    assert_eq!((a.len(), a.sample_rate), (16_000, 16_000));
    assert!(elapsed < std::time::Duration::from_secs(1), "{elapsed:?}");
    // The input copy, the f32 samples (twice the 16-bit data) and decoder buffers.
    assert!(peak <= 4 * b.len() + (1 << 20), "{peak} bytes for a {}-byte file", b.len());
}

#[test]
fn hostile_headers_are_errors() {
    let b = wav(0, 1, 100, 200);
    let m = hostile("sample rate 0", b.len() + SYMPHONIA_BUFFER, || decode_bytes(b.clone()));
    assert!(m.contains("sample rate 0 Hz is not plausible"), "{m}");
    let b = wav(4_000_000_000, 1, 100, 200);
    let m = hostile("sample rate 4e9", b.len() + SYMPHONIA_BUFFER, || decode_bytes(b.clone()));
    assert!(m.contains("sample rate 4000000000 Hz is not plausible"), "{m}");
    let b = wav(16_000, 0, 100, 200);
    let m = hostile("zero channels", b.len() + SYMPHONIA_BUFFER, || decode_bytes(b.clone()));
    assert!(m.contains("invalid channel count"), "{m}");
    let mut b = wav(16_000, 1, 100, 200);
    b.truncate(30);
    let m = hostile("truncated header", b.len() + SYMPHONIA_BUFFER, || decode_bytes(b.clone()));
    assert!(m.contains("corrupt or truncated audio (unexpected end of data"), "{m}");
}

#[test]
fn the_duration_limit_stops_a_decode() {
    let b = wav(16_000, 2, 3 * 16_000, 3 * 16_000 * 4);
    let d = Decoder::from_bytes(b.clone()).unwrap().with_max_duration(1.0);
    let (r, _, elapsed) = measure(|| d.decode_all());
    match r {
        Err(e @ Error::TooLong { .. }) => {
            assert!(e.to_string().contains("longer than the limit of 1 s"), "{e}")
        }
        other => panic!("expected TooLong, got {other:?}"),
    }
    assert!(elapsed < std::time::Duration::from_secs(1));
    assert_eq!(Decoder::from_bytes(b).unwrap().with_max_duration(3.5).decode_all().unwrap().len(), 3 * 16_000);
}

#[test]
fn mutated_wavs_never_panic() {
    let mut tone = wav(16_000, 1, 0, 3200);
    tone.extend((0..1600).flat_map(|i| (((i as f32 * 0.05).sin() * 8000.0) as i16).to_le_bytes()));
    let stereo = wav(8_000, 2, 400, 1600);
    let mut float = wav(22_050, 1, 0, 800);
    float[20..22].copy_from_slice(&3u16.to_le_bytes()); // IEEE float
    float[34..36].copy_from_slice(&32u16.to_le_bytes());
    float.extend((0..200).flat_map(|i| (i as f32 / 400.0).to_le_bytes()));
    assert_eq!(decode_bytes(float.clone()).unwrap().len(), 200);
    let (ran, ok) = support::mutation_run("audio", &[tone, stereo, float], 50_000, std::time::Duration::from_secs(3), |d| {
        match Decoder::from_bytes(d.to_vec()) {
            Ok(dec) => dec.with_max_duration(60.0).decode_all().is_ok(),
            Err(_) => false,
        }
    });
    assert!(ran >= 500 && ok > ran / 20, "{ok} of {ran} decoded");
}

/// Regression (found by the `audio` fuzz target): a WAV with 65535 channels overflowed a
/// multiplication in symphonia's header parser (a panic where overflow checks are on).
#[test]
fn a_wav_with_65535_channels_is_an_error() {
    let mut b = wav(8_000, 1, 800, 1600);
    b[22..24].copy_from_slice(&u16::MAX.to_le_bytes());
    let m = hostile("65535 channels", b.len() + SYMPHONIA_BUFFER, || decode_bytes(b.clone()));
    assert!(m.contains("corrupt or truncated audio"), "{m}");
}
