//! Silero VAD v6 (16 kHz) in candle.
//!
//! Architecture (from `silero_vad_16k_op15.onnx` and the package's tinygrad model): each
//! 512-sample window is prefixed with the last 64 samples of the previous one (zeros at the
//! start), reflect-padded by 64 on the right (640 samples), then
//! * an STFT as a strided conv (`stft_conv`, 258 kernels of 256, stride 128) → 4 frames,
//!   magnitude `sqrt(re² + im²)` of 129 bins;
//! * four conv1d (kernel 3, padding 1, strides 1, 2, 2, 1) with ReLU → 128 features;
//! * an LSTM cell (128 → 128, PyTorch gate order i, f, g, o) carrying `(h, c)` across windows;
//! * ReLU, a 1×1 conv to one logit, sigmoid → speech probability.
//!
//! Everything that does not depend on the recurrent state (STFT and the convolutions, and
//! the LSTM input projection) runs batched over many windows in candle on the chosen device,
//! each convolution as one matrix product (im2col over the 4, 2 and 1 time steps); the
//! 128-wide recurrence itself runs on the host, one step per window.

use crate::error::{check_finite, Error, Result};
use candle_core::{DType, Device, Tensor};
use sapient_tensor::onnx::{DataType, OnnxModel, OnnxTensor};
use std::collections::HashMap;
use std::path::Path;

/// The sample rate Silero VAD 16k runs at.
pub const VAD_SAMPLE_RATE: u32 = 16_000;
/// Samples per window (32 ms).
pub const WINDOW: usize = 512;
/// Samples of the previous window prepended to each window.
pub const CONTEXT: usize = 64;
const PADDED: usize = WINDOW + CONTEXT + 64; // 640
const HIDDEN: usize = 128;
const BATCH: usize = 1024;

/// Where the weights came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightFormat {
    /// `silero_vad_16k.safetensors` (the package's tinygrad checkpoint).
    Safetensors,
    /// The initializers of `silero_vad_16k_op15.onnx` (the checkpoint onnxruntime and the
    /// PyTorch JIT model run).
    Onnx,
}

/// Silero VAD with its recurrent state. Not `Sync`: one instance per stream.
pub struct SileroVad {
    device: Device,
    format: WeightFormat,
    /// STFT kernels as matrices `[256, 129]` (real and imaginary parts).
    stft_re: Tensor,
    stft_im: Tensor,
    /// The four convolutions as im2col matrices `[taps * in, out]` and biases `[1, out]`.
    convs: Vec<(Tensor, Tensor)>,
    w_ih_t: Tensor,
    bias: Tensor,
    /// `W_hh` transposed, `[128][512]`: the recurrence is 128 axpys over 512 gates, which
    /// vectorise (a dot-product per gate would be a serial f32 reduction).
    w_hh_t: Vec<f32>,
    final_w: Vec<f32>,
    final_b: f32,
    h: Vec<f32>,
    c: Vec<f32>,
    context: Vec<f32>,
}

impl std::fmt::Debug for SileroVad {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SileroVad").field("format", &self.format).field("device", &self.device).finish()
    }
}

const SHAPES: [(&str, &[usize]); 15] = [
    ("stft_conv.weight", &[258, 1, 256]),
    ("conv1.weight", &[128, 129, 3]),
    ("conv1.bias", &[128]),
    ("conv2.weight", &[64, 128, 3]),
    ("conv2.bias", &[64]),
    ("conv3.weight", &[64, 64, 3]),
    ("conv3.bias", &[64]),
    ("conv4.weight", &[128, 64, 3]),
    ("conv4.bias", &[128]),
    ("lstm_cell.weight_ih", &[512, 128]),
    ("lstm_cell.weight_hh", &[512, 128]),
    ("lstm_cell.bias_ih", &[512]),
    ("lstm_cell.bias_hh", &[512]),
    ("final_conv.weight", &[1, 128, 1]),
    ("final_conv.bias", &[1]),
];

/// ONNX initializer name for each of our (safetensors) names.
fn onnx_name(name: &str) -> String {
    match name {
        "stft_conv.weight" => "model.stft.forward_basis_buffer".into(),
        "final_conv.weight" => "model.decoder.decoder.2.weight".into(),
        "final_conv.bias" => "model.decoder.decoder.2.bias".into(),
        n if n.starts_with("lstm_cell.") => format!("model.decoder.rnn.{}", &n["lstm_cell.".len()..]),
        n => {
            // convK.{weight,bias} -> model.encoder.{K-1}.reparam_conv.{weight,bias}
            let k = n.as_bytes().get(4).map(|b| (b - b'1') as usize).unwrap_or(0);
            format!("model.encoder.{k}.reparam_conv.{}", n.split('.').nth(1).unwrap_or(""))
        }
    }
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

impl SileroVad {
    /// Loads `silero_vad_16k.safetensors` or `silero_vad_16k_op15.onnx` (told apart by
    /// content). The convolutions run on `device`.
    pub fn load(path: impl AsRef<Path>, device: &Device) -> Result<Self> {
        let path = path.as_ref();
        let head = {
            use std::io::Read;
            let mut f = std::fs::File::open(path).map_err(|source| Error::Io { path: path.to_path_buf(), source })?;
            let mut head = [0u8; 9];
            let n = f.read(&mut head).map_err(|source| Error::Io { path: path.to_path_buf(), source })?;
            head[..n].to_vec()
        };
        if head.is_empty() {
            return Err(Error::EmptyInput { what: path.display().to_string() });
        }
        // safetensors: u64 header length, then '{'.
        let is_safetensors = head.len() == 9 && head[8] == b'{';
        let model_err = |detail: String| Error::Model { path: path.to_path_buf(), detail };
        let (format, tensors): (WeightFormat, HashMap<String, Tensor>) = if is_safetensors {
            let t = candle_core::safetensors::load(path, &Device::Cpu).map_err(|e| model_err(format!("safetensors: {e}")))?;
            (WeightFormat::Safetensors, t)
        } else {
            let onnx = OnnxModel::open(path).map_err(|e| model_err(format!("not a readable ONNX model: {e}")))?;
            let inits: HashMap<&str, &OnnxTensor> = onnx
                .graph
                .initializers
                .iter()
                .filter(|t| t.data_type == DataType::Float)
                .map(|t| (t.name.as_str(), t))
                .collect();
            let mut t = HashMap::new();
            for (name, _) in SHAPES {
                let key = onnx_name(name);
                let init = inits.get(key.as_str()).ok_or_else(|| {
                    model_err(format!("no initializer {key} (expected silero_vad_16k_op15.onnx; {} float initializers found)", inits.len()))
                })?;
                let data = init.to_f32().map_err(|e| model_err(format!("initializer {key}: {e}")))?;
                t.insert(name.to_string(), Tensor::from_vec(data, init.shape(), &Device::Cpu)?);
            }
            (WeightFormat::Onnx, t)
        };
        let get = |name: &str, shape: &[usize]| -> Result<Tensor> {
            let t = tensors.get(name).ok_or_else(|| model_err(format!("missing tensor {name}")))?;
            if t.dims() != shape {
                return Err(model_err(format!("tensor {name} has shape {:?}, expected {shape:?}", t.dims())));
            }
            let t = t.to_dtype(DType::F32)?;
            let v = t.flatten_all()?.to_vec1::<f32>()?;
            check_finite("VAD weight", &v).map_err(|_| model_err(format!("tensor {name} has non-finite values")))?;
            Ok(t)
        };
        let mut w = HashMap::new();
        for (name, shape) in SHAPES {
            w.insert(name, get(name, shape)?);
        }
        let dev = |t: &Tensor| t.to_device(device);
        // conv weight [out, in, 3] -> [3 * in, out] (row k * in + c), or only the centre tap
        // for conv4 (its input has one time step, so the other taps see padding).
        let convs = [("conv1", 3usize), ("conv2", 3), ("conv3", 3), ("conv4", 1)]
            .iter()
            .map(|(n, taps)| {
                let wt = &w[format!("{n}.weight").as_str()];
                let (o, c, _) = wt.dims3()?;
                let m = if *taps == 3 { wt.permute((2, 1, 0))?.reshape((3 * c, o))? } else { wt.narrow(2, 1, 1)?.reshape((o, c))?.t()? };
                let b = &w[format!("{n}.bias").as_str()];
                Ok((dev(&m.contiguous()?)?, dev(&b.reshape((1, o))?)?))
            })
            .collect::<Result<Vec<_>>>()?;
        let stft = w["stft_conv.weight"].reshape((258, 256))?;
        let stft_re = dev(&stft.narrow(0, 0, 129)?.t()?.contiguous()?)?;
        let stft_im = dev(&stft.narrow(0, 129, 129)?.t()?.contiguous()?)?;
        let bias = (&w["lstm_cell.bias_ih"] + &w["lstm_cell.bias_hh"])?;
        tracing::debug!(path = %path.display(), ?format, "loaded Silero VAD");
        Ok(Self {
            device: device.clone(),
            format,
            stft_re,
            stft_im,
            convs,
            w_ih_t: dev(&w["lstm_cell.weight_ih"].t()?.contiguous()?)?,
            bias: dev(&bias.reshape((1, 4 * HIDDEN))?)?,
            w_hh_t: w["lstm_cell.weight_hh"].t()?.contiguous()?.flatten_all()?.to_vec1()?,
            final_w: w["final_conv.weight"].flatten_all()?.to_vec1()?,
            final_b: w["final_conv.bias"].flatten_all()?.to_vec1::<f32>()?[0],
            h: vec![0.0; HIDDEN],
            c: vec![0.0; HIDDEN],
            context: vec![0.0; CONTEXT],
        })
    }

    pub fn weight_format(&self) -> WeightFormat {
        self.format
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Clears the recurrent state and the context (a new stream).
    pub fn reset(&mut self) {
        self.h.iter_mut().for_each(|x| *x = 0.0);
        self.c.iter_mut().for_each(|x| *x = 0.0);
        self.context.iter_mut().for_each(|x| *x = 0.0);
    }

    /// Speech probability of the next 512-sample window of a 16 kHz stream.
    pub fn process_window(&mut self, window: &[f32]) -> Result<f32> {
        if window.len() != WINDOW {
            return Err(Error::InvalidInput(format!("Silero VAD windows are {WINDOW} samples at 16 kHz, got {}", window.len())));
        }
        Ok(self.process_windows(window)?[0])
    }

    /// Probabilities of consecutive windows continuing the current state; `samples.len()`
    /// must be a multiple of 512.
    pub fn process_windows(&mut self, samples: &[f32]) -> Result<Vec<f32>> {
        if !samples.len().is_multiple_of(WINDOW) {
            return Err(Error::InvalidInput(format!("{} samples is not a whole number of {WINDOW}-sample windows", samples.len())));
        }
        check_finite("VAD input", samples)?;
        let mut out = Vec::with_capacity(samples.len() / WINDOW);
        for block in samples.chunks(BATCH * WINDOW) {
            let xg = self.input_projection(block)?;
            for g in xg.chunks_exact(4 * HIDDEN) {
                out.push(self.step(g));
            }
            self.context.copy_from_slice(&block[block.len() - CONTEXT..]);
        }
        Ok(out)
    }

    /// One probability per 512 samples of a whole 16 kHz recording, from a fresh state; the
    /// last partial window is zero-padded (as `silero_vad.get_speech_timestamps` does).
    pub fn probabilities(&mut self, samples: &[f32]) -> Result<Vec<f32>> {
        self.reset();
        let whole = samples.len() / WINDOW * WINDOW;
        let mut probs = self.process_windows(&samples[..whole])?;
        if whole < samples.len() {
            let mut last = samples[whole..].to_vec();
            last.resize(WINDOW, 0.0);
            probs.push(self.process_window(&last)?);
        }
        Ok(probs)
    }

    /// `W_ih · features + b_ih + b_hh` for each window of `block` (state-independent part).
    fn input_projection(&self, block: &[f32]) -> Result<Vec<f32>> {
        let n = block.len() / WINDOW;
        // Each window: 64 samples of context, 512 new ones, 64 reflected: 640 samples cut into
        // the STFT's 4 frames of 256 at hop 128 (im2col, rows of 256).
        let mut padded = [0f32; PADDED];
        let mut frames = vec![0f32; n * 4 * 256];
        for (i, f) in frames.chunks_exact_mut(4 * 256).enumerate() {
            if i == 0 {
                padded[..CONTEXT].copy_from_slice(&self.context);
            } else {
                padded[..CONTEXT].copy_from_slice(&block[i * WINDOW - CONTEXT..i * WINDOW]);
            }
            padded[CONTEXT..CONTEXT + WINDOW].copy_from_slice(&block[i * WINDOW..(i + 1) * WINDOW]);
            // Reflect padding by 64 on the right (edge sample not repeated).
            let l = CONTEXT + WINDOW;
            for j in 0..64 {
                padded[l + j] = padded[l - 2 - j];
            }
            for (t, dst) in f.chunks_exact_mut(256).enumerate() {
                dst.copy_from_slice(&padded[t * 128..t * 128 + 256]);
            }
        }
        let x = Tensor::from_vec(frames, (n * 4, 256), &self.device)?;
        let re = x.matmul(&self.stft_re)?;
        let im = x.matmul(&self.stft_im)?;
        let mag = (re.sqr()? + im.sqr()?)?.sqrt()?.reshape((n, 4, 129))?; // [window, time, bin]
        let dense = |h: Tensor, i: usize| -> Result<Tensor> {
            let (wm, b) = &self.convs[i];
            Ok(h.matmul(wm)?.broadcast_add(b)?.relu()?)
        };
        // conv1: kernel 3, padding 1, stride 1 over the 4 frames.
        let p = mag.pad_with_zeros(1, 1, 1)?; // [n, 6, 129]
        let cols = Tensor::cat(&[p.narrow(1, 0, 4)?, p.narrow(1, 1, 4)?, p.narrow(1, 2, 4)?], 2)?;
        let h = dense(cols.reshape((n * 4, 3 * 129))?, 0)?.reshape((n, 4, 128))?;
        // conv2: stride 2 -> 2 steps, taps at padded rows (0, 1, 2) and (2, 3, 4).
        let p = h.pad_with_zeros(1, 1, 1)?; // [n, 6, 128]
        let idx = |a: u32, b: u32| Tensor::new(&[a, b], &self.device);
        let cols = Tensor::cat(&[p.index_select(&idx(0, 2)?, 1)?, p.index_select(&idx(1, 3)?, 1)?, p.index_select(&idx(2, 4)?, 1)?], 2)?;
        let h = dense(cols.reshape((n * 2, 3 * 128))?, 1)?.reshape((n, 2, 64))?;
        // conv3: stride 2 -> 1 step, taps at padded rows 0, 1, 2.
        let p = h.pad_with_zeros(1, 1, 1)?; // [n, 4, 64]
        let h = dense(p.narrow(1, 0, 3)?.reshape((n, 3 * 64))?, 2)?; // [n, 64]
        // conv4: one step, only the centre tap sees data.
        let feats = dense(h, 3)?; // [n, 128]
        let g = feats.matmul(&self.w_ih_t)?.broadcast_add(&self.bias)?;
        Ok(g.to_device(&Device::Cpu)?.flatten_all()?.to_vec1::<f32>()?)
    }

    /// One LSTM step from precomputed input gates; returns the probability.
    fn step(&mut self, xg: &[f32]) -> f32 {
        let mut gates = [0f32; 4 * HIDDEN];
        gates.copy_from_slice(xg);
        for (col, &h) in self.w_hh_t.chunks_exact(4 * HIDDEN).zip(&self.h) {
            for (g, &w) in gates.iter_mut().zip(col) {
                *g += w * h;
            }
        }
        let mut logit = self.final_b;
        for k in 0..HIDDEN {
            let i = sigmoid(gates[k]);
            let f = sigmoid(gates[HIDDEN + k]);
            let g = gates[2 * HIDDEN + k].tanh();
            let o = sigmoid(gates[3 * HIDDEN + k]);
            let c = f * self.c[k] + i * g;
            self.c[k] = c;
            let h = o * c.tanh();
            self.h[k] = h;
            logit += self.final_w[k] * h.max(0.0);
        }
        sigmoid(logit)
    }
}
