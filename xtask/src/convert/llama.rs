//! LLaMA-family conversion: name table, Q/K permutation, metadata, tokenizer.

use anyhow::{bail, Context, Result};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use sapient_llama::{Arch, LlamaConfig};
use sapient_tensor::gguf::{GgufWriter, TensorData, Value};
use sapient_tensor::GgufFile;
use serde_json::json;
use std::collections::HashMap;
use std::path::Path;

/// (GGUF per-layer name, HF per-layer name).
const LAYER_NAMES: &[(&str, &str)] = &[
    ("attn_norm.weight", "input_layernorm.weight"),
    ("ffn_norm.weight", "post_attention_layernorm.weight"),
    ("attn_q.weight", "self_attn.q_proj.weight"),
    ("attn_q.bias", "self_attn.q_proj.bias"),
    ("attn_k.weight", "self_attn.k_proj.weight"),
    ("attn_k.bias", "self_attn.k_proj.bias"),
    ("attn_v.weight", "self_attn.v_proj.weight"),
    ("attn_v.bias", "self_attn.v_proj.bias"),
    ("attn_output.weight", "self_attn.o_proj.weight"),
    ("ffn_gate.weight", "mlp.gate_proj.weight"),
    ("ffn_up.weight", "mlp.up_proj.weight"),
    ("ffn_down.weight", "mlp.down_proj.weight"),
    ("attn_q_norm.weight", "self_attn.q_norm.weight"),
    ("attn_k_norm.weight", "self_attn.k_norm.weight"),
];
/// phi3's fused projections, looked up before `LAYER_NAMES`: llama.cpp keeps HF's fused
/// gate/up projection (gate rows first) as `ffn_up`.
const PHI3_LAYER_NAMES: &[(&str, &str)] = &[
    ("attn_qkv.weight", "self_attn.qkv_proj.weight"),
    ("ffn_up.weight", "mlp.gate_up_proj.weight"),
];
const GLOBAL_NAMES: &[(&str, &str)] = &[
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("output_norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
];

fn layer_names(arch: Arch) -> impl Iterator<Item = &'static (&'static str, &'static str)> {
    let fused: &[(&str, &str)] = if arch == Arch::Phi3 { PHI3_LAYER_NAMES } else { &[] };
    fused.iter().chain(LAYER_NAMES)
}

fn gguf_to_hf_name(arch: Arch, name: &str) -> Option<String> {
    if let Some((_, hf)) = GLOBAL_NAMES.iter().find(|(g, _)| *g == name) {
        return Some(hf.to_string());
    }
    let rest = name.strip_prefix("blk.")?;
    let (layer, what) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    layer_names(arch).find(|(g, _)| *g == what).map(|(_, hf)| format!("model.layers.{layer}.{hf}"))
}

fn hf_to_gguf_name(arch: Arch, name: &str) -> Option<String> {
    if let Some((g, _)) = GLOBAL_NAMES.iter().find(|(_, hf)| *hf == name) {
        return Some(g.to_string());
    }
    let rest = name.strip_prefix("model.layers.")?;
    let (layer, what) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    layer_names(arch).find(|(_, hf)| *hf == what).map(|(g, _)| format!("blk.{layer}.{g}"))
}

/// llama.cpp's `permute` for Q/K rows (HF rotate-half -> interleaved pairs), or its inverse.
fn permute_qk(w: &Tensor, n_head: usize, inverse: bool) -> Result<Tensor> {
    let dims = w.dims().to_vec();
    let Some(&rows) = dims.first() else { bail!("Q/K projection is a scalar") };
    if n_head == 0 || rows % (2 * n_head) != 0 {
        bail!("Q/K projection with {rows} rows does not split into {n_head} heads of rotary pairs");
    }
    let rest: usize = dims[1..].iter().product();
    let half = rows / n_head / 2;
    let t = if inverse {
        w.reshape((n_head, half, 2, rest))?.transpose(1, 2)?
    } else {
        w.reshape((n_head, 2, half, rest))?.transpose(1, 2)?
    };
    Ok(t.contiguous()?.reshape(dims)?)
}

fn qk_heads(cfg: &LlamaConfig, name: &str) -> Option<usize> {
    if !matches!(cfg.arch, Arch::Llama | Arch::Mistral) {
        return None;
    }
    if name.contains("attn_q.") || name.contains("q_proj.") {
        Some(cfg.num_heads)
    } else if name.contains("attn_k.") || name.contains("k_proj.") {
        Some(cfg.num_kv_heads)
    } else {
        None
    }
}

pub fn gguf_to_safetensors(input: &Path, out_dir: &Path, dtype: &str) -> Result<usize> {
    let dtype = match dtype {
        "f32" => DType::F32,
        "f16" => DType::F16,
        "bf16" => DType::BF16,
        other => bail!("unsupported dtype '{other}' (f32, f16, bf16)"),
    };
    let g = GgufFile::open(input)?;
    let cfg = LlamaConfig::from_gguf(&g)?;
    std::fs::create_dir_all(out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let mut tensors: HashMap<String, Tensor> = HashMap::new();
    for info in g.tensors() {
        let Some(hf) = gguf_to_hf_name(cfg.arch, &info.name) else {
            if info.name == "rope_freqs.weight" {
                continue;
            }
            bail!("{}: tensor '{}' has no transformers name (unsupported layout)", input.display(), info.name);
        };
        let mut t = g.tensor(&info.name, &Device::Cpu)?;
        if let Some(h) = qk_heads(&cfg, &info.name) {
            t = permute_qk(&t, h, true)?;
        }
        tensors.insert(hf, t.to_dtype(dtype)?);
    }
    let n = tensors.len();
    candle_core::safetensors::save(&tensors, out_dir.join("model.safetensors"))?;
    let tok = sapient_tokenizers::Tokenizer::from_gguf(&g)?;
    tok.inner()
        .save(out_dir.join("tokenizer.json"), false)
        .map_err(|e| anyhow::anyhow!("writing tokenizer.json: {e}"))?;
    let (model_type, arch_class) = match cfg.arch {
        Arch::Llama => ("llama", "LlamaForCausalLM"),
        Arch::Qwen2 => ("qwen2", "Qwen2ForCausalLM"),
        Arch::Mistral => ("mistral", "MistralForCausalLM"),
        Arch::Phi3 => ("phi3", "Phi3ForCausalLM"),
        Arch::Gemma3 => bail!("gemma3 conversion is not supported (the GGUF's norms have Gemma's +1 folded in)"),
        Arch::Qwen3 => ("qwen3", "Qwen3ForCausalLM"),
        Arch::Qwen35 => bail!("qwen35 conversion is not supported (hybrid linear attention)"),
        Arch::Qwen3Moe | Arch::Qwen2Moe | Arch::GptOss => bail!("{} conversion is not supported (mixtures of experts load from GGUF)", cfg.arch.name()),
    };
    let config = json!({
        "architectures": [arch_class],
        "model_type": model_type,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "partial_rotary_factor": (cfg.rope_dim != cfg.head_dim).then(|| cfg.rope_dim as f64 / cfg.head_dim as f64),
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "max_position_embeddings": cfg.max_position_embeddings,
        "vocab_size": cfg.vocab_size,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "attention_bias": cfg.qkv_bias,
        "bos_token_id": tok.bos_token_id(),
        "eos_token_id": g.get("tokenizer.ggml.eos_token_id").and_then(|v| v.as_int()).map(|v| v as u32),
        "torch_dtype": match dtype { DType::F16 => "float16", DType::BF16 => "bfloat16", _ => "float32" },
        "hidden_act": "silu",
        "gguf_tokenizer_pre": g.get("tokenizer.ggml.pre").and_then(|v| v.as_str()),
    });
    std::fs::write(out_dir.join("config.json"), serde_json::to_string_pretty(&config)?)?;
    let tc = json!({
        "bos_token": tok.bos_token(),
        "eos_token": tok.eos_token(),
        "add_bos_token": tok.add_bos(),
        "chat_template": g.get("tokenizer.chat_template").and_then(|v| v.as_str()),
    });
    std::fs::write(out_dir.join("tokenizer_config.json"), serde_json::to_string_pretty(&tc)?)?;
    // safetensors writes through a private temporary file (mode 0600): give the weights the
    // same permissions as the other files (the umask's).
    let perm = std::fs::metadata(out_dir.join("config.json"))?.permissions();
    std::fs::set_permissions(out_dir.join("model.safetensors"), perm)?;
    Ok(n)
}

fn parse_type(s: &str) -> Result<GgmlDType> {
    Ok(match s.to_ascii_lowercase().as_str() {
        "f32" => GgmlDType::F32,
        "f16" => GgmlDType::F16,
        "q8_0" => GgmlDType::Q8_0,
        "q4_0" => GgmlDType::Q4_0,
        "q4_1" => GgmlDType::Q4_1,
        "q4_k" => GgmlDType::Q4K,
        "q5_k" => GgmlDType::Q5K,
        "q6_k" => GgmlDType::Q6K,
        other => bail!("unsupported type '{other}' (f32, f16, q8_0, q4_0, q4_1, q4_k, q5_k, q6_k)"),
    })
}

/// llama.cpp's `general.file_type` (LLAMA_FTYPE_*).
fn file_type(t: GgmlDType) -> u32 {
    match t {
        GgmlDType::F32 => 0,
        GgmlDType::F16 => 1,
        GgmlDType::Q4_0 => 2,
        GgmlDType::Q4_1 => 3,
        GgmlDType::Q8_0 => 7,
        GgmlDType::Q4K => 15,
        GgmlDType::Q5K => 17,
        GgmlDType::Q6K => 18,
        _ => 0,
    }
}

/// Tokenizer metadata from an HF tokenizer.json (byte-level BPE only).
fn tokenizer_metadata(dir: &Path, w: &mut GgufWriter, pre_hint: Option<&str>) -> Result<()> {
    let path = dir.join("tokenizer.json");
    let tj: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).with_context(|| path.display().to_string())?)?;
    let model = &tj["model"];
    if model["type"].as_str() != Some("BPE") {
        bail!("{}: only byte-level BPE tokenizers convert to GGUF for now", path.display());
    }
    let vocab = model["vocab"].as_object().context("tokenizer.json: model.vocab")?;
    let mut tokens: Vec<(u32, String)> = vocab.iter().map(|(k, v)| (v.as_u64().unwrap_or(0) as u32, k.clone())).collect();
    let mut types: HashMap<u32, i32> = HashMap::new();
    for a in tj["added_tokens"].as_array().into_iter().flatten() {
        let id = a["id"].as_u64().unwrap_or(0) as u32;
        let content = a["content"].as_str().unwrap_or_default().to_string();
        if !tokens.iter().any(|(i, _)| *i == id) {
            tokens.push((id, content));
        }
        types.insert(id, if a["special"].as_bool().unwrap_or(false) { 3 } else { 4 });
    }
    tokens.sort();
    let n = tokens.len();
    if tokens.iter().enumerate().any(|(i, (id, _))| *id as usize != i) {
        bail!("{}: token ids are not contiguous 0..{n}", path.display());
    }
    let merges: Vec<String> = model["merges"]
        .as_array()
        .context("tokenizer.json: model.merges")?
        .iter()
        .map(|m| match m {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Array(p) if p.len() == 2 => {
                format!("{} {}", p[0].as_str().unwrap_or(""), p[1].as_str().unwrap_or(""))
            }
            _ => String::new(),
        })
        .collect();
    if let Some(i) = merges.iter().position(|m| m.split(' ').count() != 2) {
        bail!("{}: merge {i} is not a pair of tokens", path.display());
    }
    let pre = match pre_hint {
        Some(p) => p.to_string(),
        None => {
            let s = tj["pre_tokenizer"].to_string();
            if s.contains("\"Digits\"") {
                "smollm".into()
            } else if s.contains("\\\\p{N}{1,3}") || s.contains("\\p{N}{1,3}") {
                "llama-bpe".into()
            } else if s.contains("Split") {
                "qwen2".into()
            } else {
                "default".into()
            }
        }
    };
    w.set("tokenizer.ggml.model", Value::String("gpt2".into()))
        .set("tokenizer.ggml.pre", Value::String(pre))
        .set("tokenizer.ggml.tokens", Value::string_array(tokens.iter().map(|t| t.1.as_str())))
        .set("tokenizer.ggml.token_type", Value::i32_array((0..n as u32).map(|i| *types.get(&i).unwrap_or(&1))))
        .set("tokenizer.ggml.merges", Value::string_array(merges.iter()));
    let tc: serde_json::Value = std::fs::read_to_string(dir.join("tokenizer_config.json"))
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or_default();
    let id_of = |key: &str| -> Option<u32> {
        let s = match &tc[key] {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Object(o) => o.get("content")?.as_str()?.to_string(),
            _ => return None,
        };
        tokens.iter().find(|(_, t)| *t == s).map(|(i, _)| *i)
    };
    if let Some(b) = id_of("bos_token") {
        w.set("tokenizer.ggml.bos_token_id", Value::U32(b));
    }
    if let Some(e) = id_of("eos_token") {
        w.set("tokenizer.ggml.eos_token_id", Value::U32(e));
    }
    if let Some(p) = id_of("pad_token") {
        w.set("tokenizer.ggml.padding_token_id", Value::U32(p));
    }
    w.set("tokenizer.ggml.add_bos_token", Value::Bool(tc["add_bos_token"].as_bool().unwrap_or(false)));
    if let Some(t) = tc["chat_template"].as_str() {
        w.set("tokenizer.chat_template", Value::String(t.to_string()));
    }
    Ok(())
}

pub fn safetensors_to_gguf(input: &Path, output: &Path, ty: &str) -> Result<usize> {
    let qtype = parse_type(ty)?;
    let cfg = LlamaConfig::from_hf_config(&input.join("config.json"))?;
    let arch = match cfg.arch {
        Arch::Llama => "llama",
        Arch::Qwen2 => "qwen2",
        Arch::Mistral => "llama",
        Arch::Phi3 => "phi3",
        Arch::Gemma3 => bail!("gemma3 conversion is not supported"),
        Arch::Qwen3 => "qwen3",
        Arch::Qwen35 => bail!("qwen35 conversion is not supported (hybrid linear attention)"),
        Arch::Qwen3Moe | Arch::Qwen2Moe | Arch::GptOss => bail!("{} conversion is not supported (mixtures of experts load from GGUF)", cfg.arch.name()),
    };
    let raw_cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(input.join("config.json"))?)?;
    let src = sapient_tensor::open_weights(input)?;
    let mut w = GgufWriter::new();
    let k = |s: &str| format!("{arch}.{s}");
    w.set("general.architecture", Value::String(arch.into()))
        .set("general.name", Value::String(input.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()))
        .set("general.file_type", Value::U32(file_type(qtype)))
        .set("general.quantization_version", Value::U32(2))
        .set(k("context_length"), Value::U32(cfg.max_position_embeddings as u32))
        .set(k("embedding_length"), Value::U32(cfg.hidden_size as u32))
        .set(k("block_count"), Value::U32(cfg.num_layers as u32))
        .set(k("feed_forward_length"), Value::U32(cfg.intermediate_size as u32))
        .set(k("attention.head_count"), Value::U32(cfg.num_heads as u32))
        .set(k("attention.head_count_kv"), Value::U32(cfg.num_kv_heads as u32))
        .set(k("attention.layer_norm_rms_epsilon"), Value::F32(cfg.rms_norm_eps as f32))
        .set(k("rope.freq_base"), Value::F32(cfg.rope_theta))
        .set(k("rope.dimension_count"), Value::U32(cfg.rope_dim as u32))
        .set(k("vocab_size"), Value::U32(cfg.vocab_size as u32));
    if cfg.head_dim * cfg.num_heads != cfg.hidden_size {
        // Qwen3: heads wider than hidden_size / heads.
        w.set(k("attention.key_length"), Value::U32(cfg.head_dim as u32))
            .set(k("attention.value_length"), Value::U32(cfg.head_dim as u32));
    }
    tokenizer_metadata(input, &mut w, raw_cfg["gguf_tokenizer_pre"].as_str())?;
    let mut names = src.names();
    // llama.cpp's order: embeddings, then layers in order, then the head.
    let order = |n: &String| -> (usize, usize, String) {
        match hf_to_gguf_name(cfg.arch, n) {
            Some(g) if g.starts_with("token_embd") => (0, 0, g),
            Some(g) if g.starts_with("blk.") => {
                let l = g[4..].split('.').next().and_then(|x| x.parse().ok()).unwrap_or(0);
                (1, l, g)
            }
            Some(g) => (2, 0, g),
            None => (3, 0, n.clone()),
        }
    };
    names.sort_by_key(order);
    let mut count = 0;
    for name in names {
        let Some(gname) = hf_to_gguf_name(cfg.arch, &name) else {
            if name.contains("rotary_emb") {
                continue;
            }
            bail!("{}: tensor '{name}' has no GGUF name (unsupported layout)", input.display());
        };
        let mut t = src.load(&name, &Device::Cpu)?.dequantize(&Device::Cpu, DType::F32)?;
        if let Some(h) = qk_heads(&cfg, &gname) {
            t = permute_qk(&t, h, false)?;
        }
        let t = t.contiguous()?;
        // Norms, biases and other 1-D tensors stay F32; rows that are not a whole number of
        // blocks fall back to Q8_0, then F16 (llama.cpp does the same).
        let dtype = if t.rank() < 2 {
            GgmlDType::F32
        } else {
            let row = t.dims()[t.rank() - 1];
            [qtype, GgmlDType::Q8_0, GgmlDType::F16]
                .into_iter()
                .find(|d| row % d.block_size() == 0)
                .unwrap_or(GgmlDType::F32)
        };
        let q = QTensor::quantize(&t, dtype)?;
        w.add_tensor(TensorData::from_qtensor(gname, &q)?);
        count += 1;
    }
    if let Some(sapient_llama::RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings }) =
        &cfg.rope_scaling
    {
        // llama.cpp's converter: Llama 3.1 scaling as one divisor per rotary frequency.
        let old = *original_max_position_embeddings as f64;
        let (factor, low, high) = (*factor as f64, *low_freq_factor as f64, *high_freq_factor as f64);
        let factors: Vec<f32> = (0..cfg.rope_dim / 2)
            .map(|i| {
                let freq = 1.0 / (cfg.rope_theta as f64).powf(2.0 * i as f64 / cfg.rope_dim as f64);
                let wavelen = 2.0 * std::f64::consts::PI / freq;
                if wavelen < old / high {
                    1.0
                } else if wavelen > old / low {
                    factor as f32
                } else {
                    let smooth = (old / wavelen - low) / (high - low);
                    (1.0 / ((1.0 - smooth) / factor + smooth)) as f32
                }
            })
            .collect();
        let t = Tensor::from_vec(factors, cfg.rope_dim / 2, &Device::Cpu)?;
        w.add_tensor(TensorData::from_qtensor("rope_freqs.weight", &QTensor::quantize(&t, GgmlDType::F32)?)?);
        count += 1;
    }
    if !cfg.tie_word_embeddings && !src.contains("lm_head.weight") {
        bail!("{}: config says untied embeddings but lm_head.weight is missing", input.display());
    }
    w.write(output)?;
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sapient_llama::Logits;

    #[test]
    fn permutation_round_trips() -> Result<()> {
        let w = Tensor::arange(0f32, 8.0 * 3.0 * 4.0, &Device::Cpu)?.reshape((8 * 3, 4))?;
        let p = permute_qk(&w, 3, false)?;
        assert_ne!(p.to_vec2::<f32>()?, w.to_vec2::<f32>()?);
        let back = permute_qk(&p, 3, true)?;
        assert_eq!(back.to_vec2::<f32>()?, w.to_vec2::<f32>()?);
        // Row order within a head: rotate-half halves interleaved.
        let rows: Vec<f32> = p.narrow(1, 0, 1)?.flatten_all()?.to_vec1()?;
        assert_eq!(&rows[..8], &[0., 16., 4., 20., 8., 24., 12., 28.]);
        Ok(())
    }

    #[test]
    fn names_map_both_ways() {
        for n in ["token_embd.weight", "output.weight", "blk.7.attn_q.bias", "blk.29.ffn_down.weight"] {
            let hf = gguf_to_hf_name(Arch::Llama, n).unwrap();
            assert_eq!(hf_to_gguf_name(Arch::Llama, &hf).unwrap(), n);
        }
        assert_eq!(gguf_to_hf_name(Arch::Llama, "blk.3.attn_k.weight").unwrap(), "model.layers.3.self_attn.k_proj.weight");
        assert!(gguf_to_hf_name(Arch::Llama, "blk.x.attn_k.weight").is_none());
        // phi3: fused QKV and gate/up, both ways; the unfused names still map.
        for (g, hf) in [
            ("blk.2.attn_qkv.weight", "model.layers.2.self_attn.qkv_proj.weight"),
            ("blk.2.ffn_up.weight", "model.layers.2.mlp.gate_up_proj.weight"),
            ("blk.2.ffn_down.weight", "model.layers.2.mlp.down_proj.weight"),
        ] {
            assert_eq!(gguf_to_hf_name(Arch::Phi3, g).unwrap(), hf);
            assert_eq!(hf_to_gguf_name(Arch::Phi3, hf).unwrap(), g);
        }
        assert_eq!(gguf_to_hf_name(Arch::Llama, "blk.2.ffn_up.weight").unwrap(), "model.layers.2.mlp.up_proj.weight");
    }

    #[test]
    fn bad_input_is_a_clear_error() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let msg = |e: anyhow::Error| format!("{e:#}");
        // Unknown types.
        let e = msg(gguf_to_safetensors(&dir.path().join("x.gguf"), dir.path(), "q4").unwrap_err());
        assert!(e.contains("unsupported dtype 'q4'"), "{e}");
        let e = msg(safetensors_to_gguf(dir.path(), &dir.path().join("o.gguf"), "q3_k").unwrap_err());
        assert!(e.contains("unsupported type 'q3_k'"), "{e}");
        // A GGUF that is not a LLaMA-family LLM.
        let g = dir.path().join("whisper.gguf");
        let mut w = GgufWriter::new();
        w.set("general.architecture", Value::String("whisper".into()));
        w.write(&g)?;
        let e = msg(gguf_to_safetensors(&g, &dir.path().join("hf"), "f32").unwrap_err());
        assert!(e.contains("whisper"), "{e}");
        // An HF directory without config.json.
        let e = msg(safetensors_to_gguf(dir.path(), &dir.path().join("o.gguf"), "q8_0").unwrap_err());
        assert!(e.contains("config.json"), "{e}");
        // Q/K rows that do not split into heads.
        let w = Tensor::zeros((10, 4), DType::F32, &Device::Cpu)?;
        assert!(permute_qk(&w, 3, false).is_err());
        Ok(())
    }

    /// SmolLM2 GGUF -> safetensors (f32) -> GGUF Q8_0: tensors within Q8_0 error of the
    /// original, metadata the same, and the HF directory itself runs through the HF loading
    /// path (rotate-half RoPE on un-permuted weights) to the same greedy tokens as the GGUF.
    #[test]
    fn smollm2_round_trip() -> Result<()> {
        let orig = sapient_hub::Hub::new()?.fetch_preset("smollm2-135m-instruct", &mut |_| {})?.file("gguf")?.to_path_buf();
        let dir = tempfile::tempdir()?;
        let hf = dir.path().join("hf");
        gguf_to_safetensors(&orig, &hf, "f32")?;
        let out = dir.path().join("smollm2.q8_0.gguf");
        safetensors_to_gguf(&hf, &out, "q8_0")?;
        let a = GgufFile::open(&orig)?;
        let b = GgufFile::open(&out)?;
        assert_eq!(a.tensors().len(), b.tensors().len());
        for t in a.tensors() {
            let ta = a.tensor(&t.name, &Device::Cpu)?;
            let tb = b.tensor(&t.name, &Device::Cpu)?;
            assert_eq!(ta.dims(), tb.dims(), "{}", t.name);
            let scale: f32 = ta.abs()?.max_all()?.to_scalar()?;
            let err: f32 = (ta - tb)?.abs()?.max_all()?.to_scalar()?;
            // Q8_0: 8-bit steps of max/127 per 32-element block.
            assert!(err <= scale / 127.0 + 1e-6, "{}: err {err} vs scale {scale}", t.name);
        }
        for key in [
            "llama.block_count", "llama.embedding_length", "llama.attention.head_count", "llama.attention.head_count_kv",
            "llama.rope.freq_base", "llama.context_length", "tokenizer.ggml.tokens", "tokenizer.ggml.merges",
            "tokenizer.ggml.token_type", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
            "tokenizer.ggml.pre", "tokenizer.chat_template", "tokenizer.ggml.model",
        ] {
            let (va, vb) = (a.get(key), b.get(key));
            assert!(va.is_some(), "{key} missing in the original");
            match (va.and_then(|v| v.as_f64()), vb.and_then(|v| v.as_f64())) {
                (Some(x), Some(y)) => assert!((x - y).abs() <= 1e-6 * x.abs().max(1.0), "{key}: {x} vs {y}"),
                _ => assert_eq!(va, vb, "{key}"),
            }
        }
        // Q4_K: 576-wide rows are not whole 256-blocks and fall back to Q8_0; ffn_down
        // (1536-wide rows) is Q4_K; norms stay F32; the token embedding is quantized.
        use sapient_tensor::gguf::GgmlType;
        let q4k = dir.path().join("smollm2.q4_k.gguf");
        safetensors_to_gguf(&hf, &q4k, "q4_k")?;
        let c = GgufFile::open(&q4k)?;
        let ty = |n: &str| c.tensor_info(n).map(|t| t.ggml_type);
        assert_eq!(ty("blk.0.ffn_down.weight"), Some(GgmlType::Q4_K));
        assert_eq!(ty("blk.0.attn_q.weight"), Some(GgmlType::Q8_0));
        assert_eq!(ty("token_embd.weight"), Some(GgmlType::Q8_0));
        assert_eq!(ty("output_norm.weight"), Some(GgmlType::F32));
        assert_eq!(c.get("general.file_type").and_then(|v| v.as_int()), Some(15));
        // Greedy tokens: the original GGUF vs the HF directory (f32 weights) agree while the
        // exact model's choices are clear; compare the first 8.
        let ids = [1u32, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198];
        let greedy = |m: &mut sapient_llama::LlamaModel| -> Result<Vec<u32>> {
            let mut l = m.forward(&ids, Logits::Last)?;
            let mut out = vec![];
            for _ in 0..8 {
                let t = l.squeeze(0)?.argmax(0)?.to_scalar::<u32>()?;
                out.push(t);
                l = m.forward(&[t], Logits::Last)?;
            }
            Ok(out)
        };
        let mut m1 = sapient_llama::load(&orig, &Device::Cpu, Some(64))?;
        let mut m2 = sapient_llama::load(&hf, &Device::Cpu, Some(64))?;
        let mut m3 = sapient_llama::load(&out, &Device::Cpu, Some(64))?;
        let g1 = greedy(&mut m1)?;
        assert_eq!(&g1[..6], &[504, 3575, 282, 4649, 314, 7042], "The capital of France is Paris");
        assert_eq!(greedy(&mut m2)?, g1, "HF directory (f32)");
        assert_eq!(greedy(&mut m3)?, g1, "re-quantized Q8_0 GGUF");
        Ok(())
    }
}
