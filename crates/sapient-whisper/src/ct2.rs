//! CTranslate2 `model.bin` (format version 6, `WhisperSpec`) to Whisper tensors under Hugging
//! Face transformers names.
//!
//! File layout (little-endian): `u32` version, string spec name, `u32` revision, `u32`
//! variable count; per variable: string name, `u8` ndim, `u32` dims, `u8` dtype (0 f32, 1 i8,
//! 2 i16, 3 i32, 4 f16, 5 bf16), `u32` byte count, data; then a `u32` alias count and (alias,
//! target) string pairs. A string is a `u16` length (terminating NUL included) and the bytes.
//!
//! CTranslate2 fuses the self-attention Q/K/V projections (`self_attention/linear_0`, rows
//! q, k, v) and the cross-attention K/V projections (`attention/linear_1`, rows k, v); the key
//! projections have no bias in Whisper, so their slice of the fused bias is zero. We split
//! them back and drop the (checked) zero key bias.

use crate::config::WhisperConfig;
use crate::{Error, Result};
use sapient_tensor::Limits;
use candle_core::{DType, Device, Tensor};
use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// Storage type of a CTranslate2 variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ct2Dtype {
    F32,
    I8,
    I16,
    I32,
    F16,
    Bf16,
}

impl Ct2Dtype {
    fn from_id(id: u8) -> Option<Self> {
        Some(match id {
            0 => Self::F32,
            1 => Self::I8,
            2 => Self::I16,
            3 => Self::I32,
            4 => Self::F16,
            5 => Self::Bf16,
            _ => return None,
        })
    }
    pub fn size(self) -> usize {
        match self {
            Self::I8 => 1,
            Self::I16 | Self::F16 | Self::Bf16 => 2,
            Self::F32 | Self::I32 => 4,
        }
    }
}

/// One variable of the file: its data is a range of the model's bytes (`Ct2Model::bytes`).
#[derive(Debug, Clone)]
pub struct Ct2Variable {
    pub name: String,
    pub shape: Vec<usize>,
    pub dtype: Ct2Dtype,
    data: Range<usize>,
}

/// A parsed CTranslate2 model file (held in memory).
#[derive(Debug)]
pub struct Ct2Model {
    pub path: PathBuf,
    pub version: u32,
    pub spec: String,
    pub revision: u32,
    pub variables: Vec<Ct2Variable>,
    /// alias -> target (e.g. `decoder/projection/weight` -> `decoder/embeddings/weight`).
    pub aliases: Vec<(String, String)>,
    bytes: Vec<u8>,
    index: HashMap<String, usize>,
}

struct Reader<'a> {
    path: &'a Path,
    b: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<Range<usize>> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.b.len());
        match end {
            Some(end) => {
                let r = self.pos..end;
                self.pos = end;
                Ok(r)
            }
            None => Err(Error::Truncated {
                path: self.path.to_path_buf(),
                what: what(),
                offset: self.pos,
                end: self.pos.saturating_add(n),
                len: self.b.len(),
            }),
        }
    }
    fn u8(&mut self, what: &dyn Fn() -> String) -> Result<u8> {
        let r = self.take(1, what)?;
        Ok(self.b[r.start])
    }
    fn u16(&mut self, what: &dyn Fn() -> String) -> Result<u16> {
        let r = self.take(2, what)?;
        Ok(u16::from_le_bytes([self.b[r.start], self.b[r.start + 1]]))
    }
    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        let r = self.take(4, what)?;
        let s = &self.b[r];
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String> {
        let n = self.u16(what)? as usize;
        let r = self.take(n, what)?;
        let mut s = &self.b[r];
        if let Some((&0, rest)) = s.split_last() {
            s = rest;
        }
        String::from_utf8(s.to_vec()).map_err(|_| Error::Corrupt {
            path: self.path.to_path_buf(),
            what: format!("{} is not UTF-8", what()),
        })
    }
}

impl Ct2Model {
    /// Read and parse a `model.bin`.
    pub fn open(path: &Path) -> Result<Self> {
        Self::open_with(path, &Limits::default())
    }

    /// [`Self::open`] under `limits`: the file is read whole, so a file larger than
    /// [`Limits::max_alloc`] is an error before anything is read.
    pub fn open_with(path: &Path, limits: &Limits) -> Result<Self> {
        let io = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let len = std::fs::metadata(path).map_err(io)?.len();
        limits.check(path, || "reading the CTranslate2 model into memory".into(), len)?;
        let bytes = std::fs::read(path).map_err(io)?;
        Self::parse(bytes, path)
    }

    /// Parse the bytes of a `model.bin` (`path` is only used in messages).
    pub fn parse(bytes: Vec<u8>, path: &Path) -> Result<Self> {
        let corrupt = |what: String| Error::Corrupt {
            path: path.to_path_buf(),
            what,
        };
        let mut r = Reader { path, b: &bytes, pos: 0 };
        let version = r.u32(&|| "format version".into())?;
        if !(5..=6).contains(&version) {
            return Err(corrupt(format!(
                "format version {version} (expected 5 or 6: is this a CTranslate2 model.bin?)"
            )));
        }
        let spec = r.string(&|| "spec name".into())?;
        let revision = r.u32(&|| "spec revision".into())?;
        let count = r.u32(&|| "variable count".into())? as usize;
        if count > 1_000_000 {
            return Err(corrupt(format!("implausible variable count {count}")));
        }
        // A variable takes at least 11 bytes (empty name, no dims): the count cannot size the
        // allocation beyond what the file holds.
        let mut variables = Vec::with_capacity(count.min(bytes.len() / 11));
        for i in 0..count {
            let name = r.string(&|| format!("name of variable {i}"))?;
            let what = |field: &str| format!("{field} of variable '{name}'");
            let ndim = r.u8(&|| what("ndim"))? as usize;
            let mut shape = Vec::with_capacity(ndim);
            for _ in 0..ndim {
                shape.push(r.u32(&|| what("dims"))? as usize);
            }
            let dt = r.u8(&|| what("dtype"))?;
            let dtype = Ct2Dtype::from_id(dt).ok_or_else(|| corrupt(format!("variable '{name}': unknown dtype id {dt}")))?;
            let nbytes = r.u32(&|| what("byte count"))? as usize;
            let elems = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
            if elems.and_then(|e| e.checked_mul(dtype.size())) != Some(nbytes) {
                return Err(corrupt(format!(
                    "variable '{name}': shape {shape:?} of {dtype:?} does not take {nbytes} bytes"
                )));
            }
            let data = r.take(nbytes, &|| what("data"))?;
            variables.push(Ct2Variable { name, shape, dtype, data });
        }
        let n_alias = r.u32(&|| "alias count".into())? as usize;
        if n_alias > 100_000 {
            return Err(corrupt(format!("implausible alias count {n_alias}")));
        }
        let mut aliases = Vec::with_capacity(n_alias.min(bytes.len().saturating_sub(r.pos) / 4));
        for i in 0..n_alias {
            let a = r.string(&|| format!("alias {i}"))?;
            let t = r.string(&|| format!("target of alias {i}"))?;
            aliases.push((a, t));
        }
        if r.pos != bytes.len() {
            return Err(corrupt(format!("{} trailing bytes after the aliases", bytes.len() - r.pos)));
        }
        let index = variables.iter().enumerate().map(|(i, v)| (v.name.clone(), i)).collect();
        Ok(Self {
            path: path.to_path_buf(),
            version,
            spec,
            revision,
            variables,
            aliases,
            bytes,
            index,
        })
    }

    /// A variable by name, following aliases.
    pub fn get(&self, name: &str) -> Option<&Ct2Variable> {
        if let Some(&i) = self.index.get(name) {
            return Some(&self.variables[i]);
        }
        let target = self.aliases.iter().find(|(a, _)| a == name)?;
        self.index.get(&target.1).map(|&i| &self.variables[i])
    }

    /// Raw bytes of a variable.
    pub fn data(&self, v: &Ct2Variable) -> &[u8] {
        &self.bytes[v.data.clone()]
    }

    fn require(&self, name: &str) -> Result<&Ct2Variable> {
        self.get(name).ok_or_else(|| Error::Corrupt {
            path: self.path.clone(),
            what: format!("missing variable '{name}'"),
        })
    }

    /// An integer scalar (`encoder/num_heads` ...).
    pub fn scalar_int(&self, name: &str) -> Result<i64> {
        let v = self.require(name)?;
        let d = self.data(v);
        let bad = || Error::Corrupt {
            path: self.path.clone(),
            what: format!("'{name}' is not an integer scalar"),
        };
        if !v.shape.is_empty() {
            return Err(bad());
        }
        Ok(match v.dtype {
            Ct2Dtype::I8 => d[0] as i8 as i64,
            Ct2Dtype::I16 => i16::from_le_bytes([d[0], d[1]]) as i64,
            Ct2Dtype::I32 => i32::from_le_bytes([d[0], d[1], d[2], d[3]]) as i64,
            _ => return Err(bad()),
        })
    }

    /// A float variable as a tensor in its stored dtype (f32, f16, bf16), with a shape check.
    pub fn tensor(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        let v = self.require(name)?;
        if v.shape != shape {
            return Err(Error::Corrupt {
                path: self.path.clone(),
                what: format!("'{name}' has shape {:?}, expected {shape:?}", v.shape),
            });
        }
        let dtype = match v.dtype {
            Ct2Dtype::F32 => DType::F32,
            Ct2Dtype::F16 => DType::F16,
            Ct2Dtype::Bf16 => DType::BF16,
            other => {
                return Err(Error::Corrupt {
                    path: self.path.clone(),
                    what: format!(
                        "'{name}' is stored as {other:?} (quantized CTranslate2 models are not supported; convert with --quantization float16)"
                    ),
                })
            }
        };
        Ok(Tensor::from_raw_buffer(self.data(v), dtype, shape, &Device::Cpu)?)
    }

    /// Model dimensions read from the tensor shapes and the `num_heads` scalars.
    pub fn dims(&self) -> Result<WhisperConfig> {
        if self.spec != "WhisperSpec" {
            return Err(Error::Corrupt {
                path: self.path.clone(),
                what: format!("spec '{}' is not a Whisper model (expected WhisperSpec)", self.spec),
            });
        }
        let shape = |name: &str| -> Result<Vec<usize>> { Ok(self.require(name)?.shape.clone()) };
        let conv1 = shape("encoder/conv1/weight")?;
        let emb = shape("decoder/embeddings/weight")?;
        let enc_pos = shape("encoder/position_encodings/encodings")?;
        let dec_pos = shape("decoder/position_encodings/encodings")?;
        let ffn = shape("encoder/layer_0/ffn/linear_0/weight")?;
        let dffn = shape("decoder/layer_0/ffn/linear_0/weight")?;
        let bad = |what: String| Error::Corrupt {
            path: self.path.clone(),
            what,
        };
        if conv1.len() != 3 || emb.len() != 2 || enc_pos.len() != 2 || dec_pos.len() != 2 || ffn.len() != 2 || dffn.len() != 2 {
            return Err(bad("unexpected tensor ranks".into()));
        }
        let count_layers = |prefix: &str| {
            (0..).take_while(|i| self.get(&format!("{prefix}/layer_{i}/ffn/linear_0/weight")).is_some()).count()
        };
        let heads = |name: &str| -> Result<usize> {
            let h = self.scalar_int(name)?;
            usize::try_from(h).ok().filter(|&h| h > 0).ok_or_else(|| bad(format!("{name} = {h}")))
        };
        let cfg = WhisperConfig {
            vocab_size: emb[0],
            num_mel_bins: conv1[1],
            d_model: conv1[0],
            encoder_layers: count_layers("encoder"),
            encoder_attention_heads: heads("encoder/num_heads")?,
            decoder_layers: count_layers("decoder"),
            decoder_attention_heads: heads("decoder/num_heads")?,
            encoder_ffn_dim: ffn[0],
            decoder_ffn_dim: dffn[0],
            max_source_positions: enc_pos[0],
            max_target_positions: dec_pos[0],
            ..WhisperConfig::default()
        };
        cfg.validate().map_err(bad)?;
        if emb[1] != cfg.d_model {
            return Err(bad(format!("embedding width {} != d_model {}", emb[1], cfg.d_model)));
        }
        Ok(cfg)
    }

    /// All weights under transformers names (`model.encoder.layers.0.self_attn.q_proj.weight`
    /// ...), in their stored dtype. Fused projections are split; the key bias slices are
    /// checked to be zero and dropped (transformers' Whisper has no key bias).
    pub fn to_hf_tensors(&self, cfg: &WhisperConfig) -> Result<Vec<(String, Tensor)>> {
        let d = cfg.d_model;
        let mut out: Vec<(String, Tensor)> = Vec::new();
        let mut put = |name: String, t: Tensor| out.push((name, t));
        let ln = |src: &str, dst: &str, put: &mut dyn FnMut(String, Tensor)| -> Result<()> {
            put(format!("{dst}.weight"), self.tensor(&format!("{src}/gamma"), &[d])?);
            put(format!("{dst}.bias"), self.tensor(&format!("{src}/beta"), &[d])?);
            Ok(())
        };
        let lin = |src: &str, dst: &str, o: usize, i: usize, put: &mut dyn FnMut(String, Tensor)| -> Result<()> {
            put(format!("{dst}.weight"), self.tensor(&format!("{src}/weight"), &[o, i])?);
            put(format!("{dst}.bias"), self.tensor(&format!("{src}/bias"), &[o])?);
            Ok(())
        };
        // Split a fused [n*d, d] projection into its n parts.
        let split = |src: &str, parts: &[&str], dst: &str, put: &mut dyn FnMut(String, Tensor)| -> Result<()> {
            let n = parts.len();
            let w = self.tensor(&format!("{src}/weight"), &[n * d, d])?;
            let b = self.tensor(&format!("{src}/bias"), &[n * d])?;
            for (k, part) in parts.iter().enumerate() {
                put(format!("{dst}.{part}.weight"), w.narrow(0, k * d, d)?.contiguous()?);
                let bk = b.narrow(0, k * d, d)?.contiguous()?;
                if *part == "k_proj" {
                    let m = bk.to_dtype(DType::F32)?.abs()?.max(0)?.to_scalar::<f32>()?;
                    if m != 0.0 {
                        return Err(Error::Corrupt {
                            path: self.path.clone(),
                            what: format!("'{src}/bias': the key slice is not zero (max |b| = {m}); Whisper has no key bias"),
                        });
                    }
                } else {
                    put(format!("{dst}.{part}.bias"), bk);
                }
            }
            Ok(())
        };
        let k = 3;
        put("model.encoder.conv1.weight".into(), self.tensor("encoder/conv1/weight", &[d, cfg.num_mel_bins, k])?);
        put("model.encoder.conv1.bias".into(), self.tensor("encoder/conv1/bias", &[d])?);
        put("model.encoder.conv2.weight".into(), self.tensor("encoder/conv2/weight", &[d, d, k])?);
        put("model.encoder.conv2.bias".into(), self.tensor("encoder/conv2/bias", &[d])?);
        put(
            "model.encoder.embed_positions.weight".into(),
            self.tensor("encoder/position_encodings/encodings", &[cfg.max_source_positions, d])?,
        );
        for i in 0..cfg.encoder_layers {
            let s = format!("encoder/layer_{i}");
            let t = format!("model.encoder.layers.{i}");
            ln(&format!("{s}/self_attention/layer_norm"), &format!("{t}.self_attn_layer_norm"), &mut put)?;
            split(&format!("{s}/self_attention/linear_0"), &["q_proj", "k_proj", "v_proj"], &format!("{t}.self_attn"), &mut put)?;
            lin(&format!("{s}/self_attention/linear_1"), &format!("{t}.self_attn.out_proj"), d, d, &mut put)?;
            ln(&format!("{s}/ffn/layer_norm"), &format!("{t}.final_layer_norm"), &mut put)?;
            lin(&format!("{s}/ffn/linear_0"), &format!("{t}.fc1"), cfg.encoder_ffn_dim, d, &mut put)?;
            lin(&format!("{s}/ffn/linear_1"), &format!("{t}.fc2"), d, cfg.encoder_ffn_dim, &mut put)?;
        }
        ln("encoder/layer_norm", "model.encoder.layer_norm", &mut put)?;
        put("model.decoder.embed_tokens.weight".into(), self.tensor("decoder/embeddings/weight", &[cfg.vocab_size, d])?);
        put(
            "model.decoder.embed_positions.weight".into(),
            self.tensor("decoder/position_encodings/encodings", &[cfg.max_target_positions, d])?,
        );
        for i in 0..cfg.decoder_layers {
            let s = format!("decoder/layer_{i}");
            let t = format!("model.decoder.layers.{i}");
            ln(&format!("{s}/self_attention/layer_norm"), &format!("{t}.self_attn_layer_norm"), &mut put)?;
            split(&format!("{s}/self_attention/linear_0"), &["q_proj", "k_proj", "v_proj"], &format!("{t}.self_attn"), &mut put)?;
            lin(&format!("{s}/self_attention/linear_1"), &format!("{t}.self_attn.out_proj"), d, d, &mut put)?;
            ln(&format!("{s}/attention/layer_norm"), &format!("{t}.encoder_attn_layer_norm"), &mut put)?;
            lin(&format!("{s}/attention/linear_0"), &format!("{t}.encoder_attn.q_proj"), d, d, &mut put)?;
            split(&format!("{s}/attention/linear_1"), &["k_proj", "v_proj"], &format!("{t}.encoder_attn"), &mut put)?;
            lin(&format!("{s}/attention/linear_2"), &format!("{t}.encoder_attn.out_proj"), d, d, &mut put)?;
            ln(&format!("{s}/ffn/layer_norm"), &format!("{t}.final_layer_norm"), &mut put)?;
            lin(&format!("{s}/ffn/linear_0"), &format!("{t}.fc1"), cfg.decoder_ffn_dim, d, &mut put)?;
            lin(&format!("{s}/ffn/linear_1"), &format!("{t}.fc2"), d, cfg.decoder_ffn_dim, &mut put)?;
        }
        ln("decoder/layer_norm", "model.decoder.layer_norm", &mut put)?;
        // The output projection (`decoder/projection/weight`) is an alias of the embedding
        // in every Whisper file: transformers ties it too, so nothing is written for it.
        if self.index.contains_key("decoder/projection/weight") {
            return Err(Error::Corrupt {
                path: self.path.clone(),
                what: "an untied output projection (not a Whisper model)".into(),
            });
        }
        Ok(out)
    }
}

/// Import a CTranslate2 Whisper model: its tensors under transformers names and the config
/// (dimensions from the weights, `alignment_heads`, `suppress_ids`, `suppress_ids_begin`,
/// `lang_ids` from the `config.json` beside `model.bin` when given).
pub fn import(model_bin: &Path, ct2_config: Option<&Path>) -> Result<(WhisperConfig, Vec<(String, Tensor)>)> {
    import_with(model_bin, ct2_config, &Limits::default())
}

/// [`import`] under `limits` (see [`Ct2Model::open_with`]).
pub fn import_with(
    model_bin: &Path,
    ct2_config: Option<&Path>,
    limits: &Limits,
) -> Result<(WhisperConfig, Vec<(String, Tensor)>)> {
    let m = Ct2Model::open_with(model_bin, limits)?;
    let mut cfg = m.dims()?;
    if let Some(p) = ct2_config {
        cfg.merge_ct2_config(p)?;
    }
    let tensors = m.to_hf_tensors(&cfg)?;
    Ok((cfg, tensors))
}

/// `cargo xtask convert ct2-to-safetensors`: write `model.safetensors` (in `dtype`) and a
/// transformers `config.json` (plus our generation fields) into `out_dir`. The files are
/// written beside their final names and renamed into place.
pub fn convert_to_safetensors(model_bin: &Path, ct2_config: Option<&Path>, out_dir: &Path, dtype: DType) -> Result<usize> {
    let (cfg, tensors) = import(model_bin, ct2_config)?;
    std::fs::create_dir_all(out_dir).map_err(|source| Error::Io {
        path: out_dir.to_path_buf(),
        source,
    })?;
    let mut map = HashMap::new();
    for (name, t) in tensors {
        map.insert(name, t.to_dtype(dtype)?);
    }
    let n = map.len();
    write_converted(&cfg, dtype, out_dir, "model.safetensors", |tmp| Ok(candle_core::safetensors::save(&map, tmp)?))?;
    Ok(n)
}

/// A CTranslate2 Whisper `model.bin` to a directory holding `model.gguf` (transformers
/// tensor names; the encoder layers' and the decoder's matrices in `quant`, as
/// [`crate::LoadOptions::quantized`] makes them at load, everything else f32) and
/// `config.json`. [`crate::Transcriber::load`] reads such a directory (with a
/// `tokenizer.json` beside) without quantizing anything at load. Returns the tensor count.
pub fn convert_to_gguf(model_bin: &Path, ct2_config: Option<&Path>, out_dir: &Path, quant: candle_core::quantized::GgmlDType) -> Result<usize> {
    use candle_core::quantized::{GgmlDType, QTensor};
    use sapient_tensor::gguf::TensorData;
    let (cfg, tensors) = import(model_bin, ct2_config)?;
    std::fs::create_dir_all(out_dir).map_err(|source| Error::Io {
        path: out_dir.to_path_buf(),
        source,
    })?;
    let n = tensors.len();
    let mut w = sapient_tensor::GgufWriter::new();
    w.set("general.architecture", sapient_tensor::Value::String("whisper".into()));
    w.set("general.file_type", sapient_tensor::Value::String(format!("{quant:?}").to_lowercase()));
    for (name, t) in tensors {
        let t = t.to_dtype(DType::F32)?;
        let dtype = crate::model::quantized_type(&name, t.dims(), Some(quant), Some(quant)).unwrap_or(GgmlDType::F32);
        let q = QTensor::quantize(&t, dtype)?;
        w.add_tensor(TensorData::from_qtensor(name, &q)?);
    }
    write_converted(&cfg, DType::F32, out_dir, "model.gguf", |tmp| Ok(w.write(tmp)?))?;
    Ok(n)
}

/// Write a converter's `config.json` (transformers names, `dtype`) and then its weights file
/// `weights` in `out_dir`, each through a temporary file renamed into place; `write` writes
/// the weights to the path it is given. The weights get the permissions an ordinary file
/// gets here (the umask's), as config.json.
fn write_converted(cfg: &WhisperConfig, dtype: DType, out_dir: &Path, weights: &str, write: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let cj = out_dir.join("config.json");
    let json = serde_json::to_string_pretty(&cfg.to_hf_json(dtype)).map_err(|e| Error::Config {
        path: cj.clone(),
        what: e.to_string(),
    })?;
    let tmp = out_dir.join(".config.json.tmp");
    std::fs::write(&tmp, json).map_err(|source| Error::Io { path: tmp.clone(), source })?;
    rename(&tmp, &cj)?;
    let out = out_dir.join(weights);
    let tmp = out_dir.join(format!(".{weights}.tmp"));
    write(&tmp)?;
    if let Ok(m) = std::fs::metadata(&cj) {
        let _ = std::fs::set_permissions(&tmp, m.permissions());
    }
    rename(&tmp, &out)
}

fn rename(from: &Path, to: &Path) -> Result<()> {
    std::fs::rename(from, to).map_err(|source| Error::Io {
        path: to.to_path_buf(),
        source,
    })
}
