//! The Whisper model on the CPU: the encoder (`encoder.rs`) and the decoder (`decoder.rs`), each
//! on plain f32 buffers and sapient-tensor's kernels and thread pool; candle tensors only
//! carry the weights at load and the values between the steps of this API. The decoder
//! keeps a self-attention KV cache per batch row (appended per step, reordered for beam
//! search) and computes the cross-attention keys and values once per 30 s window
//! ([`CrossKv`]); those are shared by every beam: the queries of all beams are stacked
//! into one product per head. Another device is an error ("no backend for ... yet").

use crate::config::WhisperConfig;
use crate::decoder;
use crate::{Error, Result};
use candle_core::{DType, Device, Tensor};
use sapient_tensor::encoder::LayerNorm;
use sapient_tensor::kernels::{self, DenseMatrix, QMatrix};
use sapient_tensor::{Weight, WeightSource};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Tensors held in memory under their names (a CTranslate2 import), as a [`WeightSource`].
pub struct TensorMap {
    path: PathBuf,
    map: HashMap<String, Tensor>,
}

impl TensorMap {
    pub fn new(path: &Path, tensors: Vec<(String, Tensor)>) -> Self {
        Self {
            path: path.to_path_buf(),
            map: tensors.into_iter().collect(),
        }
    }
}

impl WeightSource for TensorMap {
    fn location(&self) -> &Path {
        &self.path
    }
    fn contains(&self, name: &str) -> bool {
        self.map.contains_key(name)
    }
    fn shape_of(&self, name: &str) -> Option<Vec<usize>> {
        self.map.get(name).map(|t| t.dims().to_vec())
    }
    fn load(&self, name: &str, device: &Device) -> sapient_tensor::Result<Weight> {
        match self.map.get(name) {
            Some(t) => Ok(Weight::Dense(t.to_device(device)?)),
            None => Err(sapient_tensor::Error::MissingTensor {
                path: self.path.clone(),
                tensor: name.to_string(),
            }),
        }
    }
    fn names(&self) -> Vec<String> {
        self.map.keys().cloned().collect()
    }
}

/// A [`WeightSource`] that hands out the matrices of the encoder layers and / or of the decoder
/// (projections, MLP, and the token embedding, which is also the output projection)
/// quantized, for sapient-tensor's quantized kernels. Everything else (convolutions,
/// positions, norms, biases) passes through.
pub struct QuantizeWeights<'a> {
    pub inner: &'a dyn WeightSource,
    /// For the encoder layers' linear layers.
    pub encoder: Option<candle_core::quantized::GgmlDType>,
    /// For the decoder's linear layers and the token embedding / output projection.
    pub decoder: Option<candle_core::quantized::GgmlDType>,
}

impl QuantizeWeights<'_> {
    fn wants(&self, name: &str, shape: &[usize]) -> Option<candle_core::quantized::GgmlDType> {
        quantized_type(name, shape, self.encoder, self.decoder)
    }
}

/// The type a tensor (transformers name, row-major shape) is quantized to with these encoder /
/// decoder settings: the encoder layers' and the decoder's matrices (not the positions) whose
/// rows fill whole blocks; `None` for what stays f32.
pub fn quantized_type(
    name: &str,
    shape: &[usize],
    encoder: Option<candle_core::quantized::GgmlDType>,
    decoder: Option<candle_core::quantized::GgmlDType>,
) -> Option<candle_core::quantized::GgmlDType> {
    let dtype = if name.starts_with("model.decoder.") && !name.contains("embed_positions") {
        decoder?
    } else if name.starts_with("model.encoder.layers.") {
        encoder?
    } else {
        return None;
    };
    (name.ends_with(".weight") && shape.len() == 2 && shape[1].is_multiple_of(dtype.block_size())).then_some(dtype)
}

impl WeightSource for QuantizeWeights<'_> {
    fn location(&self) -> &Path {
        self.inner.location()
    }
    fn contains(&self, name: &str) -> bool {
        self.inner.contains(name)
    }
    fn shape_of(&self, name: &str) -> Option<Vec<usize>> {
        self.inner.shape_of(name)
    }
    fn load(&self, name: &str, device: &Device) -> sapient_tensor::Result<Weight> {
        let w = self.inner.load(name, device)?;
        match w {
            Weight::Dense(t) => match self.wants(name, t.dims()) {
                Some(dtype) => {
                    let q = candle_core::quantized::QTensor::quantize(&t.to_dtype(DType::F32)?, dtype)?;
                    Ok(Weight::Quantized(std::sync::Arc::new(q)))
                }
                None => Ok(Weight::Dense(t)),
            },
            w => Ok(w),
        }
    }
    fn names(&self) -> Vec<String> {
        self.inner.names()
    }
}

/// The f32 values of a (1-D) tensor.
fn values(src: &dyn WeightSource, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
    Ok(src.tensor(name, shape, &Device::Cpu, DType::F32)?.flatten_all()?.to_vec1()?)
}

/// A decoder linear layer: sapient-tensor's kernel matrix when quantized (dequantized to f32
/// for a format the kernels lack), the f32 matrix otherwise.
fn linear(src: &dyn WeightSource, prefix: &str, out: usize, inp: usize, bias: bool) -> Result<decoder::Lin> {
    let w = src.load_checked(&format!("{prefix}.weight"), &[out, inp], &Device::Cpu)?;
    let w = matrix(w)?;
    let b = if bias { Some(values(src, &format!("{prefix}.bias"), &[out])?) } else { None };
    Ok(decoder::Lin { w, b })
}

/// A linear layer for many rows with f32 activations (the cross-attention keys and values
/// of the encoded audio, 1500 rows per window), a quantized weight dequantized: quantizing
/// the encoder's output to Q8_0 for these products costs the transcripts accuracy (tiny.en
/// q8_0 fell into repetition loops), and at this many rows the dense products are as fast.
/// [`DenseMatrix`] (AMX-BF16 bf16 pairs) where the CPU has it; else, for a quantized (lossy)
/// weight on AVX512-BF16, bf16 products (weights and activations rounded to bf16, f32 sums,
/// as the quantized encoder's products: each value keeps 8 significant bits, against Q8_0's
/// 8 bits per block of 32); else the f32 matrix.
fn linear_dense(src: &dyn WeightSource, prefix: &str, out: usize, inp: usize, bias: bool) -> Result<decoder::Lin> {
    let w = src.load_checked(&format!("{prefix}.weight"), &[out, inp], &Device::Cpu)?;
    let lossy = matches!(w, Weight::Quantized(_));
    let t = w.dequantize(&Device::Cpu, DType::F32)?.contiguous()?;
    let dense = if kernels::has_amx_bf16() {
        let v: Vec<f32> = t.flatten_all()?.to_vec1()?;
        Some(DenseMatrix::from_f32(&v, out, inp))
    } else if lossy && kernels::has_avx512_bf16() {
        let v: Vec<f32> = t.flatten_all()?.to_vec1()?;
        DenseMatrix::from_f32_bf16(&v, out, inp)
    } else {
        None
    };
    let w = match dense {
        Some(m) => decoder::Mat::D(std::sync::Arc::new(m)),
        None => decoder::Mat::F(t),
    };
    let b = if bias { Some(values(src, &format!("{prefix}.bias"), &[out])?) } else { None };
    Ok(decoder::Lin { w, b })
}

fn matrix(w: Weight) -> Result<decoder::Mat> {
    Ok(match w {
        Weight::Quantized(q) => match QMatrix::from_qtensor(&q) {
            Some(m) => decoder::Mat::Q(m),
            None => decoder::Mat::F(q.dequantize(&Device::Cpu)?.to_dtype(DType::F32)?.contiguous()?),
        },
        Weight::Dense(t) => decoder::Mat::F(t.to_dtype(DType::F32)?.contiguous()?),
    })
}

fn norm(src: &dyn WeightSource, prefix: &str, d: usize) -> Result<decoder::Norm> {
    Ok(decoder::Norm(LayerNorm::new(values(src, &format!("{prefix}.weight"), &[d])?, values(src, &format!("{prefix}.bias"), &[d])?, 1e-5)?))
}

pub use crate::decoder::CrossKv;

/// Self-attention cache of a decoding run: per layer and batch row, the keys and values.
#[derive(Default)]
pub struct KvCache {
    buf: decoder::BufCache,
    len: usize,
}

impl KvCache {
    pub fn new() -> Self {
        Self::default()
    }
    /// Tokens held.
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Reorder (and repeat) the batch rows: row `i` becomes old row `rows[i]` (beam search).
    pub fn reorder(&mut self, rows: &[u32]) -> Result<()> {
        let b = self.buf.batch();
        if let Some(&bad) = rows.iter().find(|&&r| r as usize >= b && b > 0) {
            return Err(Error::Options(format!("reorder: row {bad} of a cache of {b} rows")));
        }
        if b > 0 {
            self.buf.reorder(rows);
        }
        Ok(())
    }
}

/// Cross-attention scores (scaled q·k, before the softmax) of the alignment heads for the
/// tokens of one forward pass: per head, [B, T, S].
pub type AlignmentWeights = Vec<Tensor>;

pub struct Whisper {
    pub config: WhisperConfig,
    device: Device,
    /// The encoder on plain buffers and the kernels.
    encoder: crate::encoder::Encoder,
    /// The token embedding [vocab, d]: f32, or the quantized output projection.
    embed: decoder::Embed,
    /// The output projection: the embedding, quantized when the decoder is.
    proj: decoder::Mat,
    dec_pos: Tensor,
    /// The decoder on plain buffers.
    decoder: decoder::CpuDecoder,
    /// [`Whisper::logits_rows`]'s product, kept between steps.
    logits_buf: std::sync::Mutex<Vec<f32>>,
}

impl Whisper {
    /// Build the model from weights under transformers names. Whisper runs on the CPU in
    /// f32 (another device or dtype is an error).
    pub fn load(config: WhisperConfig, src: &dyn WeightSource, device: &Device, dtype: DType) -> Result<Self> {
        config.validate().map_err(|what| Error::Config {
            path: src.location().to_path_buf(),
            what,
        })?;
        if !device.is_cpu() {
            return Err(Error::Options(format!("no backend for {device:?} yet: Whisper runs on the CPU")));
        }
        if dtype != DType::F32 {
            return Err(Error::Options(format!("Whisper runs in f32 on the CPU, not {dtype:?}")));
        }
        let d = config.d_model;
        let heads = config.decoder_attention_heads;
        let mut layers = Vec::with_capacity(config.decoder_layers);
        for i in 0..config.decoder_layers {
            let p = format!("model.decoder.layers.{i}");
            let (sa, ca) = (format!("{p}.self_attn"), format!("{p}.encoder_attn"));
            // transformers' Whisper has no key bias; a checkpoint that carries a (zero) one works too.
            let kb = |a: &str| src.contains(&format!("{a}.k_proj.bias"));
            layers.push(decoder::Layer {
                attn_ln: norm(src, &format!("{p}.self_attn_layer_norm"), d)?,
                q: linear(src, &format!("{sa}.q_proj"), d, d, true)?,
                k: linear(src, &format!("{sa}.k_proj"), d, d, kb(&sa))?,
                v: linear(src, &format!("{sa}.v_proj"), d, d, true)?,
                o: linear(src, &format!("{sa}.out_proj"), d, d, true)?,
                cross_ln: norm(src, &format!("{p}.encoder_attn_layer_norm"), d)?,
                cq: linear(src, &format!("{ca}.q_proj"), d, d, true)?,
                ck: linear_dense(src, &format!("{ca}.k_proj"), d, d, kb(&ca))?,
                cv: linear_dense(src, &format!("{ca}.v_proj"), d, d, true)?,
                co: linear(src, &format!("{ca}.out_proj"), d, d, true)?,
                mlp_ln: norm(src, &format!("{p}.final_layer_norm"), d)?,
                fc1: linear(src, &format!("{p}.fc1"), config.decoder_ffn_dim, d, true)?,
                fc2: linear(src, &format!("{p}.fc2"), d, config.decoder_ffn_dim, true)?,
            });
        }
        let emb_w = src.load_checked("model.decoder.embed_tokens.weight", &[config.vocab_size, d], device)?;
        let (mut proj, mut embed) = match emb_w {
            Weight::Quantized(q) => match matrix(Weight::Quantized(q))? {
                // the input embedding looks its rows up in the quantized output projection
                // (as CTranslate2's int8 does): no f32 copy of [vocab, d]
                decoder::Mat::Q(m) => (decoder::Mat::Q(m.clone()), decoder::Embed::Q(m)),
                decoder::Mat::F(t) => (decoder::Mat::F(t.clone()), decoder::Embed::F(t)),
                decoder::Mat::D(_) => return Err(Error::Mismatch("embedding: unexpected dense matrix".into())),
            },
            w => {
                let t = w.dequantize(device, DType::F32)?.contiguous()?;
                (decoder::Mat::F(t.clone()), decoder::Embed::F(t))
            }
        };
        // Quantized matrices in the lane kernels' layout (beams and batched windows are
        // several rows per step), the tied embedding and projection packed once.
        {
            let mut mats: Vec<&mut QMatrix> = Vec::new();
            for l in layers.iter_mut() {
                for lin in [&mut l.q, &mut l.k, &mut l.v, &mut l.o, &mut l.cq, &mut l.co, &mut l.fc1, &mut l.fc2] {
                    if let decoder::Mat::Q(m) = &mut lin.w {
                        mats.push(m);
                    }
                }
            }
            if let decoder::Mat::Q(m) = &mut proj {
                mats.push(m);
            }
            if let decoder::Embed::Q(m) = &mut embed {
                mats.push(m);
            }
            kernels::pack_for_lanes(&mut mats);
            let mats: Vec<&QMatrix> = mats.into_iter().map(|m| &*m).collect();
            kernels::huge_pages_for(&mats);
        }
        let decoder = decoder::CpuDecoder { layers, ln: norm(src, "model.decoder.layer_norm", d)?, heads, d };
        Ok(Self {
            encoder: crate::encoder::Encoder::load(src, &config)?,
            embed,
            proj,
            dec_pos: src.tensor("model.decoder.embed_positions.weight", &[config.max_target_positions, d], device, DType::F32)?,
            decoder,
            logits_buf: std::sync::Mutex::new(Vec::new()),
            config,
            device: device.clone(),
        })
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The activations' dtype (f32).
    pub fn dtype(&self) -> DType {
        DType::F32
    }

    /// Mel frames one window takes (3000 for 30 s).
    pub fn n_frames(&self) -> usize {
        self.config.max_source_positions * 2
    }

    /// Encode a log-mel window [n_mels, 2 * max_source_positions] (or a batch [B, n_mels, frames]).
    pub fn encode(&self, mel: &Tensor) -> Result<Tensor> {
        let mel = if mel.rank() == 2 { mel.unsqueeze(0)? } else { mel.clone() };
        let (b, m, frames) = mel.dims3()?;
        if m != self.config.num_mel_bins || frames != self.n_frames() {
            return Err(Error::Mismatch(format!(
                "the encoder takes [{}, {}] mel frames, got [{m}, {frames}]",
                self.config.num_mel_bins,
                self.n_frames()
            )));
        }
        let mel = mel.to_device(&Device::Cpu)?.to_dtype(DType::F32)?.contiguous()?;
        let (n, d) = (self.config.max_source_positions, self.config.d_model);
        let mut out = vec![0f32; b * n * d];
        decoder::with_f32(&mel, |v| self.encoder.forward(v, b, &mut out))??;
        Ok(Tensor::from_vec(out, (b, n, d), &self.device)?)
    }

    /// Cross-attention keys and values of an encoded window ([1, S, d]).
    pub fn cross_kv(&self, audio: &Tensor) -> Result<CrossKv> {
        let (b, _, _) = audio.dims3()?;
        if b != 1 {
            return Err(Error::Options(format!("cross_kv takes one window, got a batch of {b}")));
        }
        let mut v = self.cross_kv_batch(audio)?;
        v.pop().ok_or_else(|| Error::Mismatch("cross_kv: no window".into()))
    }

    /// Cross-attention keys and values of a batch of encoded windows ([B, S, d]), one
    /// [`CrossKv`] per window: each projection runs once over all B × S rows.
    pub fn cross_kv_batch(&self, audio: &Tensor) -> Result<Vec<CrossKv>> {
        let (b, s, d) = audio.dims3()?;
        if d != self.config.d_model {
            return Err(Error::Mismatch(format!("encoded audio of width {d}, the decoder takes {}", self.config.d_model)));
        }
        let audio = audio.to_dtype(DType::F32)?.contiguous()?;
        let pitch = s.div_ceil(16) * 16;
        let mut out: Vec<CrossKv> = (0..b).map(|_| CrossKv { k: Vec::new(), v: Vec::new(), src: s, pitch }).collect();
        let (nh, hd) = (self.decoder.heads, d / self.decoder.heads);
        let (mut k, mut v) = (Vec::new(), Vec::new());
        let mut kt = vec![0f32; pitch * d];
        let mut vt = vec![0f32; s * d];
        for l in &self.decoder.layers {
            decoder::with_f32(&audio, |x| -> Result<()> {
                l.ck.forward(x, b * s, &mut k)?;
                l.cv.forward(x, b * s, &mut v)
            })??;
            for (bi, c) in out.iter_mut().enumerate() {
                // keys [H, P / 16, Dh, 16], values [H, S, Dh]
                let (kw, vw) = (&k[bi * s * d..(bi + 1) * s * d], &v[bi * s * d..(bi + 1) * s * d]);
                for (chunk, rows) in kw.chunks(16 * d).enumerate() {
                    for c in 0..d {
                        let (h, e) = (c / hd, c % hd);
                        let dst = &mut kt[h * hd * pitch + (chunk * hd + e) * 16..][..16];
                        for (o, r) in dst.iter_mut().zip(rows.chunks_exact(d)) {
                            *o = r[c];
                        }
                    }
                }
                for (j, vr) in vw.chunks_exact(d).enumerate() {
                    for h in 0..nh {
                        vt[(h * s + j) * hd..(h * s + j + 1) * hd].copy_from_slice(&vr[h * hd..(h + 1) * hd]);
                    }
                }
                let mut k16 = vec![0u16; pitch * d];
                let mut v16 = vec![0u16; s * d];
                sapient_tensor::kernels::f32_to_f16(&kt, &mut k16);
                sapient_tensor::kernels::f32_to_f16(&vt, &mut v16);
                c.k.push(k16);
                c.v.push(v16);
            }
        }
        Ok(out)
    }

    /// Decoder forward of `b` rows of `t` tokens after what `cache` holds, where the rows
    /// attend to different windows: `groups` lists, in row order, each window and how many
    /// consecutive rows attend to it (rows add up to `b`). Every row is at the same position
    /// (the cache holds as many tokens for each). Returns the final hidden states [b, t, d],
    /// as [`Whisper::decode`] does for one window.
    pub fn decode_groups(&self, tokens: &[u32], b: usize, t: usize, groups: &[(&CrossKv, usize)], cache: &mut KvCache) -> Result<Tensor> {
        let offset = cache.len;
        self.check_positions(offset + t)?;
        let cross: Vec<decoder::CrossGroup> = groups.iter().map(|(c, rows)| decoder::CrossGroup { kv: c, rows: *rows }).collect();
        let h = self.decoder.forward(tokens, b, t, offset, &self.embed, &self.dec_pos, &cross, &mut cache.buf, None)?;
        cache.len = offset + t;
        Ok(Tensor::from_vec(h, (b, t, self.config.d_model), &self.device)?)
    }

    /// `n` decoder positions fit the model's learned position table.
    fn check_positions(&self, n: usize) -> Result<()> {
        if n > self.config.max_target_positions {
            return Err(Error::Options(format!("{n} tokens exceed the decoder's {} positions", self.config.max_target_positions)));
        }
        Ok(())
    }

    /// Decoder forward over `tokens` ([B, T]) after what `cache` holds. Returns the final
    /// hidden states [B, T, d] (see [`Whisper::logits`]) and, when `alignment` is set, the
    /// cross-attention weights of the alignment heads.
    pub fn decode(
        &self,
        tokens: &Tensor,
        cross: &CrossKv,
        cache: &mut KvCache,
        alignment: Option<&mut AlignmentWeights>,
    ) -> Result<Tensor> {
        let (b, t) = tokens.dims2()?;
        let offset = cache.len;
        self.check_positions(offset + t)?;
        let toks: Vec<u32> = tokens.flatten_all()?.to_vec1()?;
        let group = [decoder::CrossGroup { kv: cross, rows: b }];
        let heads = &self.config.alignment_heads;
        let mut scores = alignment.is_some().then(|| vec![Vec::new(); heads.len()]);
        let align = scores.as_mut().map(|s| decoder::Align { heads, scores: s });
        let h = self.decoder.forward(&toks, b, t, offset, &self.embed, &self.dec_pos, &group, &mut cache.buf, align)?;
        cache.len = offset + t;
        if let (Some(al), Some(mut scores)) = (alignment, scores) {
            // in the order of the layers, then of the list
            let mut order: Vec<usize> = (0..heads.len()).collect();
            order.sort_by_key(|&i| heads[i].0);
            for i in order {
                let s = std::mem::take(&mut scores[i]);
                let src = s.len() / (b * t).max(1);
                al.push(Tensor::from_vec(s, (b, t, src), &self.device)?);
            }
        }
        Ok(Tensor::from_vec(h, (b, t, self.config.d_model), &self.device)?)
    }

    /// Logits [N, vocab] (f32) of hidden rows [N, d].
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        let rows = hidden.dim(0)?;
        let x: Vec<f32> = hidden.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
        let vocab = self.proj.rows();
        let mut out = vec![0f32; rows * vocab];
        self.proj.matmul(&x, rows, &mut out)?;
        Ok(Tensor::from_vec(out, (rows, vocab), &self.device)?)
    }

    /// [`Whisper::logits`] as one `Vec` per row (what the searches take) in `split` (resized
    /// to the hidden rows; each row's buffer reused), copied out of the product on the kernel
    /// pool.
    pub fn logits_rows_into(&self, hidden: &Tensor, split: &mut Vec<Vec<f32>>) -> Result<()> {
        let rows = hidden.dim(0)?;
        let x: Vec<f32> = hidden.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
        let vocab = self.proj.rows();
        // the product's buffer is kept between calls (no zeroing or fresh pages per step)
        let mut out = self.logits_buf.lock().map(|mut b| std::mem::take(&mut *b)).unwrap_or_default();
        out.resize(rows * vocab, 0.0);
        self.proj.matmul(&x, rows, &mut out[..rows * vocab])?;
        split.resize_with(rows, Vec::new);
        kernels::pool::pool().for_each_chunk_mut(split, 1, |r, row| {
            for v in row.iter_mut() {
                v.clear();
                v.extend_from_slice(&out[r * vocab..(r + 1) * vocab]);
            }
        });
        if let Ok(mut b) = self.logits_buf.lock() {
            *b = out;
        }
        Ok(())
    }
}
