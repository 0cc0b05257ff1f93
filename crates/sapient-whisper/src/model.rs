//! The Whisper model: the encoder ([`crate::encoder`], on plain buffers and sapient-tensor's
//! kernels) and the decoder. The
//! decoder keeps a self-attention KV cache per layer (appended per step, reordered for beam
//! search) and computes the cross-attention keys and values once per 30 s window
//! ([`CrossKv`]); those are shared by every beam: the queries of all beams are stacked along
//! the sequence axis of one matmul per head.

use crate::config::WhisperConfig;
use crate::cpu;
use crate::{Error, Result};
use candle_core::{DType, Device, Module, Tensor, D};
use sapient_tensor::{Linear, Weight, WeightSource};
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

struct Ctx<'a> {
    src: &'a dyn WeightSource,
    device: &'a Device,
    dtype: DType,
}

impl Ctx<'_> {
    fn tensor(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        Ok(self.src.tensor(name, shape, self.device, self.dtype)?)
    }
    /// A linear layer, with the weight for the plain-buffer decoder: sapient-tensor's
    /// kernel matrix when quantized (None for a format it lacks), the f32 tensor otherwise.
    fn linear_cpu(&self, prefix: &str, out: usize, inp: usize, bias: bool) -> Result<(Linear, Option<cpu::Lin>)> {
        let w = self.src.load_checked(&format!("{prefix}.weight"), &[out, inp], self.device)?;
        let w = match w {
            Weight::Dense(t) => Weight::Dense(t.to_dtype(self.dtype)?.contiguous()?),
            q => q,
        };
        let dense = match &w {
            Weight::Dense(t) if self.device.is_cpu() && self.dtype == DType::F32 => Some(t.clone()),
            _ => None,
        };
        let b = if bias { Some(self.tensor(&format!("{prefix}.bias"), &[out])?) } else { None };
        let bias_vec = match &b {
            Some(b) => Some(b.to_dtype(DType::F32)?.to_vec1::<f32>()?),
            None => None,
        };
        let l = Linear::new(w, b)?;
        let mat = match (l.kernel(), dense) {
            (Some(k), _) if self.dtype == DType::F32 => Some(cpu::Mat::Q(k.clone())),
            (None, Some(t)) => Some(cpu::Mat::F(t)),
            _ => None,
        };
        Ok((l, mat.map(|w| cpu::Lin { w, b: bias_vec })))
    }
    fn norm_cpu(&self, ln: &LayerNorm) -> Result<cpu::Norm> {
        Ok(cpu::Norm { w: ln.w.to_dtype(DType::F32)?.to_vec1()?, b: ln.b.to_dtype(DType::F32)?.to_vec1()? })
    }
    fn ln(&self, prefix: &str, d: usize) -> Result<LayerNorm> {
        Ok(LayerNorm {
            w: self.tensor(&format!("{prefix}.weight"), &[d])?,
            b: self.tensor(&format!("{prefix}.bias"), &[d])?,
        })
    }
}

struct LayerNorm {
    w: Tensor,
    b: Tensor,
}

impl LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(candle_nn::ops::layer_norm(x, &self.w, &self.b, 1e-5)?)
    }
}

struct Attention {
    q: Linear,
    k: Linear,
    v: Linear,
    out: Linear,
    heads: usize,
    head_dim: usize,
}

impl Attention {
    /// The attention's projections, with the plain-buffer decoder's q, k, v, out (when all have one).
    fn load_cpu(c: &Ctx, prefix: &str, d: usize, heads: usize) -> Result<(Self, Option<[cpu::Lin; 4]>)> {
        let k_bias = c.src.contains(&format!("{prefix}.k_proj.bias"));
        let (q, cq) = c.linear_cpu(&format!("{prefix}.q_proj"), d, d, true)?;
        let (k, ck) = c.linear_cpu(&format!("{prefix}.k_proj"), d, d, k_bias)?;
        let (v, cv) = c.linear_cpu(&format!("{prefix}.v_proj"), d, d, true)?;
        let (out, co) = c.linear_cpu(&format!("{prefix}.out_proj"), d, d, true)?;
        let lins = match (cq, ck, cv, co) {
            (Some(a), Some(b), Some(c), Some(d)) => Some([a, b, c, d]),
            _ => None,
        };
        Ok((Self { q, k, v, out, heads, head_dim: d / heads }, lins))
    }

    /// [B, T, d] -> [B, H, T, Dh]
    fn split(&self, x: &Tensor) -> Result<Tensor> {
        let (b, t, _) = x.dims3()?;
        Ok(x.reshape((b, t, self.heads, self.head_dim))?.transpose(1, 2)?.contiguous()?)
    }

    /// [B, H, T, Dh] -> [B, T, d]
    fn merge(&self, x: &Tensor) -> Result<Tensor> {
        let (b, h, t, dh) = x.dims4()?;
        Ok(x.transpose(1, 2)?.reshape((b, t, h * dh))?)
    }

    fn scale(&self) -> f64 {
        1.0 / (self.head_dim as f64).sqrt()
    }
}

struct DecoderLayer {
    attn_ln: LayerNorm,
    attn: Attention,
    cross_ln: LayerNorm,
    cross: Attention,
    mlp_ln: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

fn mlp(ln: &LayerNorm, fc1: &Linear, fc2: &Linear, x: &Tensor) -> Result<Tensor> {
    let h = fc1.forward(&ln.forward(x)?)?.gelu_erf()?;
    Ok(fc2.forward(&h)?)
}

/// Cross-attention keys and values of one encoded window, per decoder layer:
/// keys as [H, Dh, S] (transposed once), values as [H, S, Dh].
pub struct CrossKv {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
}

/// Self-attention cache of a decoding run: per layer [B, H, len, Dh].
#[derive(Default)]
pub struct KvCache {
    kv: Vec<Option<(Tensor, Tensor)>>,
    /// The plain-buffer decoder's cache (a cache is used by one path only).
    buf: cpu::BufCache,
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
        if self.buf.batch() > 0 {
            self.buf.reorder(rows);
            return Ok(());
        }
        let Some(Some((k0, _))) = self.kv.first() else {
            return Ok(());
        };
        let idx = Tensor::new(rows, k0.device())?;
        for e in self.kv.iter_mut().flatten() {
            *e = (e.0.index_select(&idx, 0)?, e.1.index_select(&idx, 0)?);
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
    dtype: DType,
    /// The encoder on plain buffers and the kernels.
    encoder: crate::encoder::Encoder,
    embed: Tensor,
    /// The embedding as a quantized output projection (when the decoder is quantized).
    proj: Option<Linear>,
    dec_pos: Tensor,
    dec_layers: Vec<DecoderLayer>,
    dec_ln: LayerNorm,
    /// The decoder on plain buffers (CPU, f32 activations), used for decoding steps.
    plain: Option<cpu::CpuDecoder>,
    use_plain: bool,
}

impl Whisper {
    /// Build the model from weights under transformers names.
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
        let c = Ctx { src, device, dtype };
        let d = config.d_model;
        let mut dec_layers = Vec::with_capacity(config.decoder_layers);
        let mut plain_layers = Some(Vec::with_capacity(config.decoder_layers));
        for i in 0..config.decoder_layers {
            let p = format!("model.decoder.layers.{i}");
            let heads = config.decoder_attention_heads;
            let (attn, sa) = Attention::load_cpu(&c, &format!("{p}.self_attn"), d, heads)?;
            let (cross, ca) = Attention::load_cpu(&c, &format!("{p}.encoder_attn"), d, heads)?;
            let (fc1, f1) = c.linear_cpu(&format!("{p}.fc1"), config.decoder_ffn_dim, d, true)?;
            let (fc2, f2) = c.linear_cpu(&format!("{p}.fc2"), d, config.decoder_ffn_dim, true)?;
            let l = DecoderLayer {
                attn_ln: c.ln(&format!("{p}.self_attn_layer_norm"), d)?,
                attn,
                cross_ln: c.ln(&format!("{p}.encoder_attn_layer_norm"), d)?,
                cross,
                mlp_ln: c.ln(&format!("{p}.final_layer_norm"), d)?,
                fc1,
                fc2,
            };
            plain_layers = match (plain_layers, sa, ca, f1, f2) {
                (Some(mut v), Some([q, k, vv, o]), Some([cq, _, _, co]), Some(fc1), Some(fc2)) => {
                    v.push(cpu::Layer {
                        attn_ln: c.norm_cpu(&l.attn_ln)?,
                        q,
                        k,
                        v: vv,
                        o,
                        cross_ln: c.norm_cpu(&l.cross_ln)?,
                        cq,
                        co,
                        mlp_ln: c.norm_cpu(&l.mlp_ln)?,
                        fc1,
                        fc2,
                    });
                    Some(v)
                }
                _ => None,
            };
            dec_layers.push(l);
        }
        let dec_ln = c.ln("model.decoder.layer_norm", d)?;
        let plain = match plain_layers {
            Some(layers) if device.is_cpu() && dtype == DType::F32 => Some(cpu::CpuDecoder {
                layers,
                ln: c.norm_cpu(&dec_ln)?,
                heads: config.decoder_attention_heads,
                d,
            }),
            _ => None,
        };
        let use_plain = true;
        let emb_w = src.load_checked("model.decoder.embed_tokens.weight", &[config.vocab_size, d], device)?;
        let embed = emb_w.dequantize(device, dtype)?;
        let proj = match emb_w {
            Weight::Quantized(q) => Some(Linear::new(Weight::Quantized(q), None)?),
            Weight::Dense(_) => None,
        };
        Ok(Self {
            encoder: crate::encoder::Encoder::load(src, &config)?,
            embed,
            proj,
            dec_pos: c.tensor("model.decoder.embed_positions.weight", &[config.max_target_positions, d])?,
            dec_layers,
            dec_ln,
            plain,
            use_plain,
            config,
            device: device.clone(),
            dtype,
        })
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Whether decoding steps run on plain buffers (the CPU default) or as candle ops
    /// ([`LoadOptions::candle_decoder`](crate::LoadOptions::candle_decoder), or this); the results agree to f32
    /// rounding. Returns whether the plain path is in use (it exists for f32 on the CPU).
    pub fn set_plain_decoder(&mut self, on: bool) -> bool {
        self.use_plain = on;
        self.plain.is_some() && on
    }
    pub fn dtype(&self) -> DType {
        self.dtype
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
        cpu::with_f32(&mel, |v| self.encoder.forward(v, b, &mut out))??;
        Ok(Tensor::from_vec(out, (b, n, d), &self.device)?)
    }

    /// Cross-attention keys and values of an encoded window ([1, S, d]).
    pub fn cross_kv(&self, audio: &Tensor) -> Result<CrossKv> {
        let (b, _, _) = audio.dims3()?;
        if b != 1 {
            return Err(Error::Options(format!("cross_kv takes one window, got a batch of {b}")));
        }
        let mut k = Vec::with_capacity(self.dec_layers.len());
        let mut v = Vec::with_capacity(self.dec_layers.len());
        for l in &self.dec_layers {
            let a = &l.cross;
            k.push(a.split(&a.k.forward(audio)?)?.squeeze(0)?.t()?.contiguous()?);
            v.push(a.split(&a.v.forward(audio)?)?.squeeze(0)?);
        }
        Ok(CrossKv { k, v })
    }

    /// Cross-attention keys and values of a batch of encoded windows ([B, S, d]), one
    /// [`CrossKv`] per window: each projection runs once over all B × S rows.
    pub fn cross_kv_batch(&self, audio: &Tensor) -> Result<Vec<CrossKv>> {
        let (b, _, _) = audio.dims3()?;
        let mut out: Vec<CrossKv> = (0..b).map(|_| CrossKv { k: Vec::new(), v: Vec::new() }).collect();
        for l in &self.dec_layers {
            let a = &l.cross;
            let k = a.split(&a.k.forward(audio)?)?;
            let v = a.split(&a.v.forward(audio)?)?;
            for (bi, c) in out.iter_mut().enumerate() {
                c.k.push(k.get(bi)?.t()?.contiguous()?);
                c.v.push(v.get(bi)?.contiguous()?);
            }
        }
        Ok(out)
    }

    /// Whether [`Whisper::decode_groups`] is available: the decoder on plain buffers (f32 on
    /// the CPU) and in use.
    pub fn has_plain_decoder(&self) -> bool {
        self.plain.is_some() && self.use_plain
    }

    /// Decoder forward (plain-buffer decoder only) of `b` rows of `t` tokens after what
    /// `cache` holds, where the rows attend to different windows: `groups` lists, in row
    /// order, each window and how many consecutive rows attend to it (rows add up to `b`).
    /// Every row is at the same position (the cache holds as many tokens for each). Returns
    /// the final hidden states [b, t, d], as [`Whisper::decode`] does for one window.
    pub fn decode_groups(&self, tokens: &[u32], b: usize, t: usize, groups: &[(&CrossKv, usize)], cache: &mut KvCache) -> Result<Tensor> {
        let p = self
            .plain
            .as_ref()
            .filter(|_| self.use_plain)
            .ok_or_else(|| Error::Options("decoding several windows in one batch needs the plain-buffer decoder (f32 on the CPU)".into()))?;
        if !cache.kv.is_empty() {
            return Err(Error::Options("this cache belongs to the candle decoder".into()));
        }
        let offset = cache.len;
        self.check_positions(offset + t)?;
        let cross: Vec<cpu::CrossGroup> = groups.iter().map(|(c, rows)| cpu::CrossGroup { k: &c.k, v: &c.v, rows: *rows }).collect();
        let h = p.forward(tokens, b, t, offset, &self.embed, &self.dec_pos, &cross, &mut cache.buf)?;
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
        if let Some(p) = self.plain.as_ref().filter(|_| self.use_plain && alignment.is_none() && cache.kv.is_empty()) {
            let toks: Vec<u32> = tokens.flatten_all()?.to_vec1()?;
            let group = [cpu::CrossGroup { k: &cross.k, v: &cross.v, rows: b }];
            let h = p.forward(&toks, b, t, offset, &self.embed, &self.dec_pos, &group, &mut cache.buf)?;
            cache.len = offset + t;
            return Ok(Tensor::from_vec(h, (b, t, self.config.d_model), &self.device)?);
        }
        if cache.buf.batch() > 0 {
            return Err(Error::Options("this cache belongs to the plain-buffer decoder".into()));
        }
        if cache.kv.is_empty() {
            cache.kv = vec![None; self.dec_layers.len()];
        }
        let pos = self.dec_pos.narrow(0, offset, t)?;
        let mut x = self.embed.index_select(&tokens.flatten_all()?, 0)?.reshape((b, t, ()))?.broadcast_add(&pos)?;
        let mask = if t > 1 {
            let total = offset + t;
            let m: Vec<f32> = (0..t)
                .flat_map(|i| (0..total).map(move |j| if j > offset + i { f32::NEG_INFINITY } else { 0.0 }))
                .collect();
            Some(Tensor::from_vec(m, (t, total), &self.device)?.to_dtype(self.dtype)?)
        } else {
            None
        };
        let mut alignment = alignment;
        let d = self.config.d_model;
        for (li, l) in self.dec_layers.iter().enumerate() {
            // self-attention with the cache
            let h = l.attn_ln.forward(&x)?;
            let a = &l.attn;
            let q = a.split(&a.q.forward(&h)?)?;
            let k = a.split(&a.k.forward(&h)?)?;
            let v = a.split(&a.v.forward(&h)?)?;
            let (k, v) = match &cache.kv[li] {
                Some((pk, pv)) => (Tensor::cat(&[pk, &k], 2)?, Tensor::cat(&[pv, &v], 2)?),
                None => (k, v),
            };
            let mut w = (q.matmul(&k.t()?)? * a.scale())?;
            if let Some(m) = &mask {
                w = w.broadcast_add(m)?;
            }
            let w = candle_nn::ops::softmax_last_dim(&w)?;
            let o = a.merge(&w.matmul(&v)?)?;
            cache.kv[li] = Some((k, v));
            x = (x + a.out.forward(&o)?)?;
            // cross-attention: the beams' queries side by side, [H, B*T, Dh]
            let h = l.cross_ln.forward(&x)?;
            let c = &l.cross;
            let q = c.q.forward(&h)?.reshape((b * t, c.heads, c.head_dim))?.transpose(0, 1)?.contiguous()?;
            let w = (q.matmul(&cross.k[li])? * c.scale())?;
            if let Some(al) = alignment.as_deref_mut() {
                for &(layer, head) in &self.config.alignment_heads {
                    if layer == li {
                        let s = w.dim(D::Minus1)?;
                        al.push(w.get(head)?.reshape((b, t, s))?);
                    }
                }
            }
            let w = candle_nn::ops::softmax_last_dim(&w)?;
            let o = w.matmul(&cross.v[li])?.transpose(0, 1)?.reshape((b, t, d))?;
            x = (x + c.out.forward(&o)?)?;
            x = (&x + mlp(&l.mlp_ln, &l.fc1, &l.fc2, &x)?)?;
        }
        cache.len = offset + t;
        self.dec_ln.forward(&x)
    }

    /// Logits [N, vocab] (f32) of hidden rows [N, d].
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        let rows = hidden.dim(0)?;
        if self.plain.is_some() && self.use_plain && hidden.dtype() == DType::F32 {
            // the quantized projection on the kernels, or the f32 embedding on our threads
            let w = match self.proj.as_ref().and_then(Linear::kernel) {
                Some(k) => cpu::Mat::Q(k.clone()),
                None => cpu::Mat::F(self.embed.clone()),
            };
            let x: Vec<f32> = hidden.flatten_all()?.to_vec1()?;
            let vocab = w.rows();
            let mut out = vec![0f32; rows * vocab];
            w.matmul(&x, rows, &mut out)?;
            return Ok(Tensor::from_vec(out, (rows, vocab), &self.device)?);
        }
        let l = if let Some(p) = self.proj.as_ref().filter(|_| rows < sapient_tensor::weights::DENSE_PREFILL_ROWS) {
            p.forward(hidden)?
        } else if rows <= 16 {
            // few rows (decoding steps): the embedding as the row-major left operand, so the
            // GEMM streams it once instead of packing a transposed copy
            self.embed.matmul(&hidden.t()?.contiguous()?)?.t()?.contiguous()?
        } else {
            hidden.matmul(&self.embed.t()?)?
        };
        Ok(l.to_dtype(DType::F32)?)
    }
}
