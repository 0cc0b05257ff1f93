//! Silero VAD against onnxruntime (silero_vad_16k_op15.onnx) and the package's tinygrad model
//! (silero_vad_16k.safetensors); the segmenter against silero_vad's own
//! get_speech_timestamps_from_probs; speech found in LibriVox, none in silence or noise.

mod common;

use candle_core::Device;
use common::*;
use sapient_audio::{Error, SileroVad, VadOptions, VadSegmenter, WeightFormat};

fn audio_for(name: &str) -> Vec<f32> {
    if name == "concat" {
        concat_audio()
    } else {
        clip_samples(name)
    }
}

fn check_probs(role: &str, reference: &str, format: WeightFormat) {
    let mut vad = SileroVad::load(silero(role), &Device::Cpu).unwrap();
    assert_eq!(vad.weight_format(), format);
    let r = json(reference);
    let mut worst = 0f32;
    for name in CLIPS.iter().copied().chain(["concat"]) {
        let x = audio_for(name);
        let got = vad.probabilities(&x).unwrap();
        let want = f32s(&r["probs"][name]);
        assert_eq!(got.len(), x.len().div_ceil(512), "{name}: one probability per 512 samples");
        let d = max_abs_diff(&got, &want);
        worst = worst.max(d);
        assert!(d < 1e-4, "{role} {name}: max diff {d}");
    }
    println!("{role}: max |p - reference| over 6 signals = {worst:.2e}");
}

#[test]
fn onnx_weights_agree_with_onnxruntime() {
    check_probs("onnx", "vad_probs_onnx.json", WeightFormat::Onnx);
}

#[test]
fn safetensors_agree_with_the_packages_tinygrad_model() {
    check_probs("safetensors", "vad_probs_safetensors.json", WeightFormat::Safetensors);
}

#[test]
fn window_by_window_equals_batched() {
    let x = clip_samples("0930");
    let mut vad = SileroVad::load(silero("onnx"), &Device::Cpu).unwrap();
    let batched = vad.probabilities(&x).unwrap();
    vad.reset();
    let mut one = Vec::new();
    for w in x.chunks(512) {
        let mut w = w.to_vec();
        w.resize(512, 0.0);
        one.push(vad.process_window(&w).unwrap());
    }
    assert!(max_abs_diff(&batched, &one) < 1e-6);
    assert!(matches!(vad.process_window(&x[..500]), Err(Error::InvalidInput(_))));
    assert!(matches!(vad.process_windows(&x[..1000]), Err(Error::InvalidInput(_))));
}

fn options(case: &str, o: &serde_json::Value) -> VadOptions {
    let mut v = VadOptions::default();
    let obj = o.as_object().unwrap();
    for (k, val) in obj {
        match k.as_str() {
            "threshold" => v.threshold = val.as_f64().unwrap() as f32,
            "neg_threshold" => v.neg_threshold = Some(val.as_f64().unwrap() as f32),
            "min_silence_duration_ms" => v.min_silence_ms = val.as_u64().unwrap() as u32,
            "min_speech_duration_ms" => v.min_speech_ms = val.as_u64().unwrap() as u32,
            "speech_pad_ms" => v.speech_pad_ms = val.as_u64().unwrap() as u32,
            "max_speech_duration_s" => v.max_speech_s = val.as_f64().unwrap(),
            "use_max_poss_sil_at_max_speech" => v.use_max_possible_silence_at_max_speech = val.as_bool().unwrap(),
            other => panic!("{case}: unknown option {other}"),
        }
    }
    v
}

#[test]
fn segmenter_matches_silero_on_the_same_probabilities() {
    let spec = json("vad_segments.json");
    let probs = json("vad_probs_onnx.json");
    let mut mine = SileroVad::load(silero("onnx"), &Device::Cpu).unwrap();
    let mut n = 0;
    for (name, s) in spec["segments"].as_object().unwrap() {
        let len = s["samples"].as_u64().unwrap() as usize;
        let p = f32s(&probs["probs"][name]);
        let our_p = mine.probabilities(&audio_for(name)).unwrap();
        for (case, want) in s["cases"].as_object().unwrap() {
            let seg = VadSegmenter::new(options(case, &spec["options"][case])).unwrap();
            let want: Vec<(usize, usize)> =
                want.as_array().unwrap().iter().map(|p| (p[0].as_u64().unwrap() as usize, p[1].as_u64().unwrap() as usize)).collect();
            let got: Vec<(usize, usize)> = seg.segments(&p, len).iter().map(|s| (s.start, s.end)).collect();
            assert_eq!(got, want, "{name}/{case} on the reference probabilities");
            // And end to end, on our own probabilities.
            let got: Vec<(usize, usize)> = seg.segments(&our_p, len).iter().map(|s| (s.start, s.end)).collect();
            assert_eq!(got, want, "{name}/{case} on our probabilities");
            n += 1;
        }
    }
    assert!(n >= 36);
}

#[test]
fn speech_found_in_librivox_none_in_silence_or_noise() {
    let seg = VadSegmenter::new(VadOptions::default()).unwrap();
    for role in ["onnx", "safetensors"] {
        let mut vad = SileroVad::load(silero(role), &Device::Cpu).unwrap();
        for c in CLIPS {
            let x = clip_samples(c);
            let segs = seg.segments(&vad.probabilities(&x).unwrap(), x.len());
            let voiced: f64 = segs.iter().map(|s| s.duration_s()).sum();
            let total = x.len() as f64 / 16_000.0;
            assert!(!segs.is_empty() && voiced > 0.6 * total, "{role} {c}: {voiced:.2}s of {total:.2}s voiced");
            assert!(segs.iter().all(|s| s.start < s.end && s.end <= x.len()));
        }
        let silence = vec![0.0f32; 10 * 16_000];
        let p = vad.probabilities(&silence).unwrap();
        assert!(seg.segments(&p, silence.len()).is_empty(), "{role}: speech in silence");
        for (amp, seed) in [(0.001f32, 1u64), (0.05, 2), (0.3, 3)] {
            let n = noise(10 * 16_000, amp, seed);
            let p = vad.probabilities(&n).unwrap();
            let segs = seg.segments(&p, n.len());
            let max_p = p.iter().cloned().fold(0.0, f32::max);
            println!("{role}: white noise ±{amp}: max p {max_p:.3}, {} segments", segs.len());
            assert!(segs.is_empty(), "{role}: speech in noise of amplitude {amp}: {segs:?}");
        }
    }
}

#[test]
fn bad_models_and_options() {
    let dir = std::env::temp_dir().join(format!("sapient-audio-vad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let empty = dir.join("empty.safetensors");
    std::fs::write(&empty, b"").unwrap();
    assert!(matches!(SileroVad::load(&empty, &Device::Cpu), Err(Error::EmptyInput { .. })));
    // Truncated safetensors.
    let st = std::fs::read(silero("safetensors")).unwrap();
    let cut = dir.join("cut.safetensors");
    std::fs::write(&cut, &st[..st.len() / 2]).unwrap();
    let e = SileroVad::load(&cut, &Device::Cpu).unwrap_err();
    assert!(matches!(e, Error::Model { .. }), "{e}");
    // Some other file entirely.
    let e = SileroVad::load(mel_filters_npz(), &Device::Cpu).unwrap_err();
    assert!(matches!(e, Error::Model { .. }), "{e}");
    // Truncated ONNX.
    let onnx = std::fs::read(silero("onnx")).unwrap();
    let cut = dir.join("cut.onnx");
    std::fs::write(&cut, &onnx[..onnx.len() / 3]).unwrap();
    let e = SileroVad::load(&cut, &Device::Cpu).unwrap_err();
    assert!(matches!(e, Error::Model { .. }), "{e}");
    assert!(matches!(SileroVad::load(dir.join("missing.onnx"), &Device::Cpu), Err(Error::Io { .. })));
    let _ = std::fs::remove_dir_all(&dir);

    for o in [
        VadOptions { threshold: 1.5, ..Default::default() },
        VadOptions { threshold: 0.0, ..Default::default() },
        VadOptions { neg_threshold: Some(0.9), ..Default::default() },
        VadOptions { max_speech_s: 0.01, ..Default::default() },
        VadOptions { max_speech_s: f64::NAN, ..Default::default() },
    ] {
        assert!(matches!(VadSegmenter::new(o), Err(Error::InvalidOption { .. })));
    }
    let mut vad = SileroVad::load(silero("onnx"), &Device::Cpu).unwrap();
    assert!(matches!(vad.probabilities(&[0.0, f32::NAN]), Err(Error::NonFinite { .. })));
}
