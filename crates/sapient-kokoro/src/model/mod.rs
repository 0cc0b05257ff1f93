//! Kokoro-82M's forward pass (`kokoro.KModel.forward_with_tokens`) on candle, batch 1:
//!
//! 1. PL-BERT (ALBERT) over the 0-padded ids, `bert_encoder` projection;
//! 2. prosody predictor: `DurationEncoder` with the predictor half of the style
//!    (`style[128..]`), duration LSTM, `round(sum(sigmoid(proj)) / speed)` clamped to >= 1
//!    frame per token (ties to even, like torch/ONNX `Round`);
//! 3. alignment: token i repeated `dur[i]` times (the one-hot alignment matrix product);
//! 4. F0 and energy from the shared LSTM and the `AdainResBlk1d` branches (2 values per frame);
//! 5. text encoder (CNN + LSTM) aligned the same way;
//! 6. iSTFTNet decoder with the decoder half of the style (`style[..128]`), 600 samples of
//!    24 kHz audio per frame.
//!
//! The reference is onnxruntime on the int8 export (`kokoro-v1.0.int8.onnx`); we run its
//! dequantized f32 weights (see `docs/kokoro.md` for the comparison).

mod albert;
mod decoder;
mod fast;
mod nn;
mod predictor;
mod text_encoder;

use crate::memory::memory_probe;
use crate::{Error, KokoroConfig, KokoroWeights, Result};
use candle_core::{DType, Device, Tensor};
use std::path::Path;

/// The model, ready to synthesize.
pub struct KModel {
    config: KokoroConfig,
    device: Device,
    bert: albert::Albert,
    bert_encoder: nn::Linear,
    predictor: predictor::ProsodyPredictor,
    text_encoder: text_encoder::TextEncoder,
    decoder: decoder::Decoder,
}

/// Everything one forward pass produces (for tests and diagnostics).
#[derive(Debug, Clone)]
pub struct Synthesis {
    /// 24 kHz mono samples (`600 * sum(durations)`).
    pub audio: Vec<f32>,
    /// Frames per token, the two padding tokens included (`ids.len() + 2` values).
    pub durations: Vec<u32>,
    /// The predicted durations before rounding (after dividing by `speed`).
    pub raw_durations: Vec<f32>,
    /// The predicted F0 curve (2 values per frame), Hz.
    pub f0: Vec<f32>,
}

/// Most phonemes one call takes: `max_position_embeddings` (512) minus the two padding ids.
pub const MAX_PHONEMES: usize = 510;

impl KModel {
    /// Builds the model from loaded weights (f32; see [`KokoroWeights`]).
    pub fn new(weights: &KokoroWeights, config: &KokoroConfig) -> Result<Self> {
        Self::from_weights(weights.clone(), config)
    }

    /// [`new`](Self::new) consuming the weights: each module's dense weights are dropped once
    /// it has packed them, so the peak memory of loading stays near one copy of the model.
    pub fn from_weights(mut w: KokoroWeights, config: &KokoroConfig) -> Result<Self> {
        let device = w.get("bert_encoder.weight")?.device().clone();
        memory_probe("load: weights imported");
        let bert = albert::Albert::load(&w, config)?;
        w.release("bert");
        let bert_encoder = nn::Linear::load(&w, "bert_encoder", true)?;
        w.release("bert_encoder");
        memory_probe("load: ALBERT packed");
        let predictor = predictor::ProsodyPredictor::load(&w, config)?;
        w.release("predictor");
        memory_probe("load: predictor packed");
        let text_encoder = text_encoder::TextEncoder::load(&w, config)?;
        w.release("text_encoder");
        let decoder = decoder::Decoder::load(&mut w, config)?;
        drop(w);
        sapient_tensor::kernels::release_freed();
        memory_probe("load: decoder packed");
        Ok(Self {
            config: config.clone(),
            device,
            bert,
            bert_encoder,
            predictor,
            text_encoder,
            decoder,
        })
    }

    /// From the int8 ONNX export (imported and dequantized in memory) and the `vocab.json`
    /// beside it when there is one.
    pub fn from_onnx(onnx: &Path, device: &Device) -> Result<Self> {
        Self::from_onnx_with(onnx, device, &sapient_tensor::Limits::default())
    }

    /// [`from_onnx`](Self::from_onnx) under `limits` (see [`sapient_tensor::Limits`]).
    pub fn from_onnx_with(onnx: &Path, device: &Device, limits: &sapient_tensor::Limits) -> Result<Self> {
        let mut config = KokoroConfig::v1_0();
        if let Some(dir) = onnx.parent() {
            let vocab = dir.join("vocab.json");
            if vocab.is_file() {
                config.vocab = read_vocab(&vocab)?;
            }
        }
        let weights = KokoroWeights::from_onnx_with(onnx, &config, device, DType::F32, limits)?;
        Self::from_weights(weights, &config)
    }

    /// From a directory holding either `kokoro-v1.0.int8.onnx` (the `kokoro-82m` preset as
    /// fetched: `~/.cache/sapient/models/kokoro-82m`) or `config.json` + `*.safetensors`
    /// (what `cargo xtask convert kokoro-onnx-to-safetensors` writes).
    pub fn load_preset_dir(dir: &Path, device: &Device) -> Result<Self> {
        Self::load_preset_dir_with(dir, device, &sapient_tensor::Limits::default())
    }

    /// [`load_preset_dir`](Self::load_preset_dir) under `limits` (see [`sapient_tensor::Limits`]).
    pub fn load_preset_dir_with(dir: &Path, device: &Device, limits: &sapient_tensor::Limits) -> Result<Self> {
        let onnx = dir.join("kokoro-v1.0.int8.onnx");
        if onnx.is_file() {
            return Self::from_onnx_with(&onnx, device, limits);
        }
        let cfg_path = dir.join("config.json");
        if cfg_path.is_file() {
            let config = KokoroConfig::from_file(&cfg_path)?;
            let src = sapient_tensor::open_weights_with(dir, limits)?;
            let weights = KokoroWeights::load(src.as_ref(), &config, device, DType::F32)?;
            return Self::from_weights(weights, &config);
        }
        Err(Error::Config {
            path: dir.to_path_buf(),
            what: "neither kokoro-v1.0.int8.onnx nor config.json + safetensors here".into(),
        })
    }

    pub fn config(&self) -> &KokoroConfig {
        &self.config
    }

    /// 24000.
    pub fn sample_rate(&self) -> u32 {
        24_000
    }

    /// Phoneme `ids` without the 0 padding (the model adds it), one 256-float `style` row
    /// (a voice pack's row for `ids.len()`), `speed` (durations are divided by it; 0.25 to 4):
    /// 24 kHz mono samples.
    pub fn synthesize(&self, ids: &[u32], style: &[f32], speed: f32) -> Result<Vec<f32>> {
        Ok(self.forward(ids, style, speed, None)?.audio)
    }

    /// The full forward pass; `durations` (frames per token, padding included:
    /// `ids.len() + 2` values, each >= 1) replaces the predicted ones when given.
    pub fn forward(&self, ids: &[u32], style: &[f32], speed: f32, durations: Option<&[u32]>) -> Result<Synthesis> {
        self.check_input(ids, style, speed)?;
        let dev = &self.device;
        let mut padded = Vec::with_capacity(ids.len() + 2);
        padded.push(0u32);
        padded.extend_from_slice(ids);
        padded.push(0);
        let t = padded.len();
        let sd = self.config.style_dim;
        let style_t = Tensor::from_slice(style, (1, 2 * sd), dev)?;
        let s_dec = style_t.narrow(1, 0, sd)?;
        let s_pred = style_t.narrow(1, sd, sd)?;

        memory_probe("forward: start");
        let bert = self.bert.forward(&padded)?;
        let d_en = self.bert_encoder.forward_vec(&bert, t, bert.len() / t)?; // [t, hidden]
        let d = self.predictor.encode(&d_en, t, &s_pred)?; // [t, hidden + style]
        let raw: Vec<f32> = self.predictor.durations(&d, t)?.into_iter().map(|v| v / speed).collect();
        let dur: Vec<u32> = match durations {
            Some(given) => {
                if given.len() != t || given.contains(&0) {
                    return Err(Error::Input(format!(
                        "{} durations given for {t} tokens (padding included), each must be >= 1",
                        given.len()
                    )));
                }
                given.to_vec()
            }
            None => raw.iter().map(|v| v.round_ties_even().max(1.0) as u32).collect(),
        };
        let frames: usize = dur.iter().map(|&v| v as usize).sum();
        // alignment: frame -> token
        let idx: Vec<usize> = dur.iter().enumerate().flat_map(|(i, &n)| std::iter::repeat_n(i, n as usize)).collect();
        let rows = |x: &[f32]| -> Vec<f32> {
            let c = x.len() / t;
            let mut out = Vec::with_capacity(frames * c);
            for &i in &idx {
                out.extend_from_slice(&x[i * c..(i + 1) * c]);
            }
            out
        };
        memory_probe("forward: durations");
        let en = rows(&d); // [frames, hidden + style]
        let (f0, n) = self.predictor.f0_n(&en, frames, &s_pred)?;
        memory_probe("forward: F0 and N");
        let asr = rows(&self.text_encoder.forward(&padded)?); // [frames, hidden]
        memory_probe("forward: text encoder");
        let audio = self.decoder.forward(&asr, frames, &f0, &n, &s_dec)?;
        memory_probe("forward: audio");
        Ok(Synthesis {
            audio,
            durations: dur,
            raw_durations: raw,
            f0,
        })
    }

    fn check_input(&self, ids: &[u32], style: &[f32], speed: f32) -> Result<()> {
        if ids.is_empty() {
            return Err(Error::Input("no phoneme ids".into()));
        }
        let max = MAX_PHONEMES.min(self.config.plbert.max_position_embeddings.saturating_sub(2));
        if ids.len() > max {
            return Err(Error::Input(format!(
                "{} phoneme ids, the model takes at most {max} at once (split the text)",
                ids.len()
            )));
        }
        if let Some((i, id)) = ids.iter().enumerate().find(|(_, &id)| id as usize >= self.config.n_token) {
            return Err(Error::Input(format!(
                "phoneme id {id} at position {i} is outside the vocabulary (ids 0..{})",
                self.config.n_token
            )));
        }
        if style.len() != 2 * self.config.style_dim {
            return Err(Error::Input(format!(
                "style vector has {} values, expected {}",
                style.len(),
                2 * self.config.style_dim
            )));
        }
        if style.iter().any(|v| !v.is_finite()) {
            return Err(Error::Input("style vector has a non-finite value".into()));
        }
        if !(0.25..=4.0).contains(&speed) {
            return Err(Error::Input(format!("speed {speed} is outside 0.25..=4")));
        }
        Ok(())
    }
}

/// A `vocab.json` (symbol -> id), as the model config and the G2P's `PhonemeVocab` read it.
pub(crate) fn read_vocab(path: &Path) -> Result<std::collections::BTreeMap<String, u32>> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let bad = |e: serde_json::Error| Error::Config {
        path: path.to_path_buf(),
        what: format!("vocab.json: {e}"),
    };
    // kokoro's file is {"vocab": {...}}; a bare map is accepted too
    let v: serde_json::Value = serde_json::from_str(&text).map_err(bad)?;
    let map = v.get("vocab").cloned().unwrap_or(v);
    serde_json::from_value(map).map_err(bad)
}
