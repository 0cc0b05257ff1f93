//! Decoding real files against libsndfile's values (scripts/audio/make_reference.py), the
//! same sound across WAV/Ogg/MP3, bit-exact FLAC and PCM widths, and bad input.

mod common;

use common::*;
use sapient_audio::{decode_bytes, decode_file, decode_raw_pcm, encode_wav, wav_header, write_wav, Error, PcmFormat, WavFormat};

fn check_against_ref(name: &str, audio: &sapient_audio::Audio, exact: bool) {
    let r = &json("decode_ref.json")[name];
    assert_eq!(audio.sample_rate as u64, r["sample_rate"].as_u64().unwrap(), "{name}: rate");
    assert_eq!(audio.channels_original as u64, r["channels"].as_u64().unwrap(), "{name}: channels");
    let frames = r["frames"].as_u64().unwrap() as usize;
    let rms = (audio.samples.iter().map(|&x| (x as f64) * (x as f64)).sum::<f64>() / audio.len() as f64).sqrt();
    let ref_rms = r["rms"].as_f64().unwrap();
    if exact {
        assert_eq!(audio.len(), frames, "{name}: frames");
        let head = f32s(&r["head"]);
        let d = max_abs_diff(&audio.samples[..head.len()], &head);
        assert!(d < 1e-6, "{name}: first samples differ from libsndfile by {d}");
        assert!((rms - ref_rms).abs() < 1e-6, "{name}: rms {rms} vs {ref_rms}");
    } else {
        // Lossy decoders differ in priming/padding handling, not in content.
        let diff = audio.len().abs_diff(frames);
        assert!(diff <= 2400, "{name}: {} frames vs libsndfile's {frames}", audio.len());
        assert!((rms / ref_rms - 1.0).abs() < 0.03, "{name}: rms {rms} vs libsndfile {ref_rms}");
    }
}

#[test]
fn librivox_clips_match_libsndfile() {
    for c in CLIPS {
        let a = decode_file(clip(c)).unwrap();
        check_against_ref(&format!("librivox-{c}"), &a, true);
        assert!(a.duration_s() > 2.0);
    }
}

/// Best normalised correlation of `b` against `a` over lags in -max..=max.
fn best_correlation(a: &[f32], b: &[f32], max_lag: isize) -> (f64, isize) {
    let mut best = (f64::MIN, 0);
    for lag in -max_lag..=max_lag {
        let (mut ab, mut aa, mut bb) = (0f64, 0f64, 0f64);
        for (i, &x) in a.iter().enumerate() {
            let j = i as isize + lag;
            if j < 0 || j as usize >= b.len() {
                continue;
            }
            let y = b[j as usize] as f64;
            ab += x as f64 * y;
            aa += (x as f64).powi(2);
            bb += y * y;
        }
        let c = ab / (aa.sqrt() * bb.sqrt()).max(1e-12);
        if c > best.0 {
            best = (c, lag);
        }
    }
    best
}

#[test]
fn one_sound_as_wav_ogg_and_mp3() {
    let wav = decode_file(codec_sample("audio-test-pygame", "wav")).unwrap();
    check_against_ref("house_lo.wav", &wav, true);
    let ogg = decode_file(codec_sample("audio-test-pygame", "ogg")).unwrap();
    check_against_ref("house_lo.ogg", &ogg, false);
    let mp3 = decode_file(codec_sample("audio-test-pygame", "mp3")).unwrap();
    check_against_ref("house_lo.mp3", &mp3, false);
    // The lossy versions carry the same sound as the WAV (8-bit source, low bit rates).
    let (c_ogg, lag_ogg) = best_correlation(&wav.samples[..40_000], &ogg.samples, 1200);
    let (c_mp3, lag_mp3) = best_correlation(&wav.samples[..40_000], &mp3.samples, 2400);
    println!("ogg: correlation {c_ogg:.4} at lag {lag_ogg}; mp3: {c_mp3:.4} at lag {lag_mp3}");
    assert!(c_ogg > 0.97, "ogg vs wav correlation {c_ogg}");
    assert!(c_mp3 > 0.95, "mp3 vs wav correlation {c_mp3}");
}

#[test]
fn adpcm_is_an_unsupported_codec() {
    let e = decode_file(codec_sample("audio-test-pygame", "adpcm")).unwrap_err();
    assert!(matches!(e, Error::UnsupportedCodec { .. }), "{e}");
}

#[test]
fn flac_is_bit_exact() {
    let bytes = std::fs::read(clip("0880")).unwrap();
    let s16 = wav_s16(&bytes);
    let flac = flac_verbatim(&s16, 16_000);
    let a = decode_bytes(flac).unwrap();
    assert_eq!(a.sample_rate, 16_000);
    assert_eq!(a.len(), s16.len());
    let want: Vec<f32> = s16.iter().map(|&s| s as f32 / 32768.0).collect();
    assert_eq!(a.samples, want);
}

#[test]
fn pcm_widths_and_stereo_mixdown() {
    let s16 = wav_s16(&std::fs::read(clip("0930")).unwrap());
    let n = 8000;
    let ints: Vec<i32> = s16[..n].iter().map(|&s| s as i32).collect();
    let want16: Vec<f32> = ints.iter().map(|&s| s as f32 / 32768.0).collect();

    // 24-bit: the 16-bit value shifted up by 8 is the same amplitude.
    let d24: Vec<u8> = ints.iter().flat_map(|&s| (s << 8).to_le_bytes()[..3].to_vec()).collect();
    let a = decode_bytes(wav(1, 1, 16_000, 24, &d24)).unwrap();
    assert_eq!(a.samples, want16, "24-bit");

    // 32-bit float
    let df: Vec<u8> = want16.iter().flat_map(|s| s.to_le_bytes()).collect();
    let a = decode_bytes(wav(3, 1, 16_000, 32, &df)).unwrap();
    assert_eq!(a.samples, want16, "float");

    // Stereo: left = x, right = -x/2 (integer), mono is their mean.
    let st: Vec<u8> = ints.iter().flat_map(|&s| [(s as i16).to_le_bytes(), ((-s / 2) as i16).to_le_bytes()].concat()).collect();
    let a = decode_bytes(wav(1, 2, 22_050, 16, &st)).unwrap();
    assert_eq!((a.sample_rate, a.channels_original, a.len()), (22_050, 2, n));
    for (i, (&got, &s)) in a.samples.iter().zip(&ints).enumerate() {
        let want = (s as f32 / 32768.0 + (-s / 2) as f32 / 32768.0) / 2.0;
        assert!((got - want).abs() < 1e-7, "sample {i}: {got} vs {want}");
    }

    // Raw PCM: the WAV's data chunk with the rate stated.
    let raw: Vec<u8> = s16.iter().flat_map(|s| s.to_le_bytes()).collect();
    let a = decode_raw_pcm(&raw, 16_000, PcmFormat::S16Le).unwrap();
    assert_eq!(a.samples, decode_file(clip("0930")).unwrap().samples);
}

#[test]
fn wav_writer_round_trips() {
    let src = decode_file(clip("0880")).unwrap();
    let dir = std::env::temp_dir().join(format!("sapient-audio-wav-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p16 = dir.join("a16.wav");
    write_wav(&p16, &src.samples, 16_000, WavFormat::Pcm16).unwrap();
    // Samples that came from 16-bit PCM survive exactly, and the original file's data chunk
    // is reproduced byte for byte.
    assert_eq!(decode_file(&p16).unwrap().samples, src.samples);
    assert_eq!(wav_s16(&std::fs::read(&p16).unwrap()), wav_s16(&std::fs::read(clip("0880")).unwrap()));
    let pf = dir.join("af.wav");
    let odd: Vec<f32> = src.samples.iter().map(|x| x * 1.7 + 1e-5).collect(); // > 1.0 allowed in float
    write_wav(&pf, &odd, 44_100, WavFormat::Float32).unwrap();
    let back = decode_file(&pf).unwrap();
    assert_eq!((back.sample_rate, back.samples.len()), (44_100, odd.len()));
    assert_eq!(back.samples, odd);
    assert!(matches!(write_wav(dir.join("x.wav"), &[0.0, f32::NAN], 16_000, WavFormat::Pcm16), Err(Error::NonFinite { .. })));
    assert!(matches!(write_wav(dir.join("x.wav"), &[0.0], 0, WavFormat::Pcm16), Err(Error::InvalidSampleRate { rate: 0 })));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_streamed_wav_of_unknown_length_decodes() {
    let src = decode_file(clip("0880")).unwrap();
    for format in [WavFormat::Pcm16, WavFormat::Float32] {
        let whole = encode_wav(&src.samples, 16_000, format).unwrap();
        let head = wav_header(16_000, format, None).unwrap();
        let known = wav_header(16_000, format, Some(src.samples.len())).unwrap();
        // The same header but for the sizes, which say "unknown" (0xFFFFFFFF), and the same
        // samples after it.
        assert_eq!(head.len(), known.len());
        assert_eq!(&head[4..8], &[0xFF; 4]);
        assert_eq!(&head[head.len() - 4..], &[0xFF; 4]);
        // (Float's fact chunk has a sample count, unknown too.)
        let fixed = head.len() - 8 - if format == WavFormat::Float32 { 4 } else { 0 };
        assert_eq!(&head[8..fixed], &whole[8..fixed]);
        assert!(head[fixed..head.len() - 8].iter().all(|&b| b == 0xFF));
        assert_eq!(known[..], whole[..known.len()]);
        let mut streamed = head.clone();
        streamed.extend_from_slice(&whole[head.len()..]);
        let back = decode_bytes(streamed).unwrap();
        assert_eq!((back.sample_rate, back.samples.len()), (16_000, src.samples.len()), "{format:?}");
        assert_eq!(back.samples, decode_bytes(whole).unwrap().samples, "{format:?}");
    }
    assert!(matches!(wav_header(0, WavFormat::Pcm16, None), Err(Error::InvalidSampleRate { rate: 0 })));
}

#[test]
fn bad_input_gives_clear_errors() {
    let dir = std::env::temp_dir().join(format!("sapient-audio-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let empty = dir.join("empty.wav");
    std::fs::write(&empty, b"").unwrap();
    let e = decode_file(&empty).unwrap_err();
    assert!(matches!(e, Error::EmptyInput { .. }), "{e}");
    assert!(e.to_string().contains("empty.wav"), "{e}");

    assert!(matches!(decode_bytes(Vec::new()), Err(Error::EmptyInput { .. })));
    assert!(matches!(decode_file(dir.join("missing.wav")), Err(Error::Io { .. })));

    // A header with no samples.
    let e = decode_bytes(wav(1, 1, 16_000, 16, &[])).unwrap_err();
    assert!(matches!(e, Error::ZeroLength { .. }), "{e}");

    // Not audio at all.
    let e = decode_bytes(b"this is not an audio file, just some text that goes on".repeat(20)).unwrap_err();
    assert!(matches!(e, Error::UnsupportedFormat { .. }), "{e}");

    // A real file cut inside its header, and a header with a broken fmt chunk.
    let bytes = std::fs::read(clip("0880")).unwrap();
    let e = decode_bytes(bytes[..30].to_vec()).unwrap_err();
    assert!(matches!(e, Error::Corrupt { .. } | Error::UnsupportedFormat { .. }), "{e}");
    let mut broken = bytes[..4000].to_vec();
    broken[16..20].copy_from_slice(&3u32.to_le_bytes()); // fmt chunk of 3 bytes
    let e = decode_bytes(broken).unwrap_err();
    assert!(matches!(e, Error::Corrupt { .. } | Error::UnsupportedFormat { .. }), "{e}");

    // A file cut in the middle of its data still gives what is there.
    let a = decode_bytes(bytes[..20_001].to_vec()).unwrap();
    assert_eq!(a.len(), (20_001 - 44) / 2);

    // Absurd sample rates.
    let e = decode_bytes(wav(1, 1, 0, 16, &[0, 0, 1, 0])).unwrap_err();
    assert!(matches!(e, Error::InvalidSampleRate { rate: 0 } | Error::Corrupt { .. }), "{e}");
    let e = decode_bytes(wav(1, 1, 50_000_000, 16, &[0, 0, 1, 0])).unwrap_err();
    assert!(matches!(e, Error::InvalidSampleRate { rate: 50_000_000 }), "{e}");
    assert!(matches!(decode_raw_pcm(&[0, 0], 3, PcmFormat::S16Le), Err(Error::InvalidSampleRate { rate: 3 })));

    // Raw PCM that is not whole frames, or empty.
    assert!(matches!(decode_raw_pcm(&[0, 0, 0], 16_000, PcmFormat::S16Le), Err(Error::RawPcmLength { len: 3, frame_bytes: 2 })));
    assert!(matches!(decode_raw_pcm(&[], 16_000, PcmFormat::F32Le), Err(Error::EmptyInput { .. })));
    // NaN in float PCM.
    assert!(matches!(decode_raw_pcm(&f32::NAN.to_le_bytes(), 16_000, PcmFormat::F32Le), Err(Error::NonFinite { .. })));
    let _ = std::fs::remove_dir_all(&dir);
}
