//! `cargo xtask bench whisper-profile`: where the time of one Whisper window goes: encoder,
//! cross-attention K/V, a decoding step for 1 and 5 rows (decoder and output projection
//! apart), and a whole window greedy / beam 5 (no reference; `cargo xtask bench whisper`
//! compares with faster-whisper).

use candle_core::{Device, Tensor};
use sapient_whisper::model::KvCache;
use sapient_whisper::{decode, Transcriber};
use std::time::Instant;

fn best<T>(n: usize, mut f: impl FnMut() -> T) -> (f64, T) {
    let mut best = f64::INFINITY;
    let mut out = None;
    for _ in 0..n {
        let t = Instant::now();
        let r = f();
        best = best.min(t.elapsed().as_secs_f64());
        out = Some(r);
    }
    (best, out.expect("n >= 1"))
}

#[derive(clap::Args)]
pub struct Args {
    /// Preset or model directory.
    #[arg(long, default_value = "whisper-tiny.en")]
    pub model: String,
    /// f32, q8_0 (encoder and decoder matrices in Q8_0) or q8_0-decoder.
    #[arg(long, default_value = "f32")]
    pub variant: String,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let (model, variant) = (a.model.as_str(), a.variant.as_str());
    let load = super::whisper::load_options(variant)?;
    let t = Transcriber::load_with(model, &Device::Cpu, load, &mut |_| {})?;
    let hub = sapient_hub::Hub::new()?;
    let clips = hub.fetch_preset("speech-librivox", &mut |_| {})?;
    let mut audio = Vec::new();
    for p in clips.files("audio") {
        audio.extend(sapient_audio::decode_file(p)?.into_16k()?.samples);
        audio.extend(std::iter::repeat_n(0.0f32, 16_000));
    }
    audio.truncate(16_000 * 30);
    let mel = t.mel_window(&audio)?;
    let m = &t.model;
    let (enc, audio_feat) = best(3, || m.encode(&mel).unwrap());
    let (ckv, cross) = best(3, || m.cross_kv(&audio_feat).unwrap());
    println!(
        "{model} {variant}: encoder {:.1} ms, cross K/V {:.2} ms",
        enc * 1e3,
        ckv * 1e3
    );
    let d = m.config.d_model;
    for b in [1usize, 5] {
        // a cache of 40 tokens, then steps of b rows
        let mut cache = KvCache::new();
        let prompt: Vec<u32> = (0..40).map(|i| 1000 + i).collect();
        m.decode(
            &Tensor::new(prompt.as_slice(), &Device::Cpu)?.unsqueeze(0)?,
            &cross,
            &mut cache,
            None,
        )?;
        cache.reorder(&vec![0u32; b])?;
        let toks: Vec<u32> = (0..b as u32).map(|i| 2000 + i).collect();
        let x = Tensor::new(toks.as_slice(), &Device::Cpu)?.unsqueeze(1)?;
        let n = 30;
        let t0 = Instant::now();
        let mut h = None;
        for _ in 0..n {
            h = Some(m.decode(&x, &cross, &mut cache, None)?);
        }
        let step = t0.elapsed().as_secs_f64() / n as f64;
        let h = h.unwrap().squeeze(1)?;
        let (proj, _) = best(n, || m.logits(&h).unwrap());
        println!(
            "  {b} rows: decoder step {:.2} ms, output projection {:.2} ms (d {d})",
            step * 1e3,
            proj * 1e3
        );
    }
    for beam in [None, Some(5)] {
        let language = t.tokenizer.multilingual.then(|| "en".to_string());
        let opts = decode::DecodeOptions {
            beam_size: beam,
            language,
            ..Default::default()
        };
        let (secs, r) = best(2, || {
            decode::decode_window(m, &t.tokenizer, &cross, &opts).unwrap()
        });
        println!(
            "  window beam {:?}: {:.0} ms, {} tokens, {:.2} ms/token: {}",
            beam.unwrap_or(1),
            secs * 1e3,
            r.tokens.len(),
            secs * 1e3 / r.tokens.len() as f64,
            &r.text[..r.text.len().min(60)]
        );
    }
    Ok(())
}
