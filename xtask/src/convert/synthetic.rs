//! Architectures without real weights here, on synthetic checkpoints: the real layer structure
//! and RoPE settings, a few small layers, the Qwen tokenizer, and weights that are a function
//! of their tensor and element index, so a test builds the same checkpoint the reference
//! script made its references from:
//! - Qwen3 (per-head q/k RMSNorm, no QKV bias, heads wider than hidden / heads, tied
//!   embeddings): scripts/reference/qwen3_synthetic.py, tests/data/llama/qwen3_synthetic.json;
//! - Llama 3.2 style (llama3 RoPE scaling with a 64-position original context and a 169-token
//!   prompt, tied embeddings, no output.weight): scripts/reference/llama3_rope_synthetic.py,
//!   tests/data/llama/llama3_rope_synthetic.json;
//! - Phi-3 (fused QKV and gate/up projections, RoPE over 3/4 of each head as Phi-4-mini, an
//!   untied lm_head): scripts/reference/phi3_synthetic.py, tests/data/llama/phi3_synthetic.json.
//!
//! Each checks the HF directory (F32 safetensors, on the dense kernels) against the script's
//! float64 numpy forward pass at every position, and the q8_0 GGUF `safetensors_to_gguf`
//! writes (the quantized kernels) against llama.cpp on the same GGUF: its logits at every position, its 24
//! greedy tokens, and llama-tokenize's ids against our tokenizer from that GGUF.

use anyhow::{Context, Result};
use candle_core::{Device, Tensor};
use sapient_llama::Logits;
use serde_json::Value;
use std::collections::HashMap;

const H: usize = 64;
const I: usize = 160;
const LAYERS: usize = 3;
const HEADS: usize = 4;
const KV: usize = 2;
const HD: usize = 32;

#[path = "../../../crates/sapient-llama/tests/common/splitmix.rs"]
mod splitmix;
use splitmix::values;

/// Name, shape, offset and scale of a tensor's values.
type TensorSpec = (String, Vec<usize>, f64, f64);

/// A tensor list in index order: the embedding, `layers` blocks of `block(l)`, the final
/// norm, then `head` (the scripts' `tensors`). Norm weights are 1 +- 0.2, linear weights
/// 0 +- sqrt(3 / fan-in).
fn stacked(vocab: usize, layers: usize, block: impl Fn(&Layer) -> Vec<TensorSpec>, head: Vec<TensorSpec>) -> Vec<TensorSpec> {
    let mut out = vec![("model.embed_tokens.weight".to_string(), vec![vocab, H], 0.0, 1.0)];
    for l in 0..layers {
        out.extend(block(&Layer(l)));
    }
    out.push(("model.norm.weight".to_string(), vec![H], 1.0, 0.2));
    out.extend(head);
    out
}

/// The names and value ranges of one block's tensors.
struct Layer(usize);

impl Layer {
    fn norm(&self, n: &str, d: usize) -> TensorSpec {
        (format!("model.layers.{}.{n}", self.0), vec![d], 1.0, 0.2)
    }
    fn linear(&self, n: &str, o: usize, i: usize) -> TensorSpec {
        (format!("model.layers.{}.{n}", self.0), vec![o, i], 0.0, (3.0 / i as f64).sqrt())
    }
}

/// qwen3_synthetic.py's `tensors`, in index order.
fn qwen3_tensors(vocab: usize) -> Vec<TensorSpec> {
    stacked(
        vocab,
        LAYERS,
        |b| {
            vec![
                b.norm("input_layernorm.weight", H),
                b.linear("self_attn.q_proj.weight", HEADS * HD, H),
                b.linear("self_attn.k_proj.weight", KV * HD, H),
                b.linear("self_attn.v_proj.weight", KV * HD, H),
                b.norm("self_attn.q_norm.weight", HD),
                b.norm("self_attn.k_norm.weight", HD),
                b.linear("self_attn.o_proj.weight", H, HEADS * HD),
                b.norm("post_attention_layernorm.weight", H),
                b.linear("mlp.gate_proj.weight", I, H),
                b.linear("mlp.up_proj.weight", I, H),
                b.linear("mlp.down_proj.weight", H, I),
            ]
        },
        vec![],
    )
}

fn top10(v: &Value) -> Result<Vec<Vec<(u32, f32)>>> {
    Ok(serde_json::from_value(v.clone())?)
}

/// Build the checkpoint described by tests/data/llama/`name` and check it against its references;
/// returns the loaded GGUF config.
fn check(name: &str, tensors: fn(usize) -> Vec<TensorSpec>) -> Result<sapient_llama::LlamaConfig> {
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/llama").join(name);
    let data: Value = serde_json::from_str(&std::fs::read_to_string(&file).with_context(|| file.display().to_string())?)?;
    let r = sapient_hub::Hub::new()?.fetch_preset("qwen-tokenizer", &mut |_| {})?;
    let dir = tempfile::tempdir()?;
    let hf = dir.path().join("qwen3-synthetic");
    std::fs::create_dir_all(&hf)?;
    for role in ["tokenizer", "tokenizer_config"] {
        let src = r.file(role)?;
        std::fs::copy(src, hf.join(src.file_name().context("file name")?))?;
    }
    std::fs::write(hf.join("config.json"), serde_json::to_string_pretty(&data["config"])?)?;
    let vocab = data["config"]["vocab_size"].as_u64().context("vocab_size")? as usize;
    let mut map = HashMap::new();
    for (i, (name, shape, offset, scale)) in tensors(vocab).into_iter().enumerate() {
        let n = shape.iter().product();
        map.insert(name, Tensor::from_vec(values(i as u64 + 1, n, offset, scale), shape, &Device::Cpu)?);
    }
    candle_core::safetensors::save(&map, hf.join("model.safetensors"))?;
    let ids: Vec<u32> = serde_json::from_value(data["ids"].clone())?;

    // The HF directory (F32 weights: the dense kernels) against numpy.
    let mut m = sapient_llama::load(&hf, &Device::Cpu, Some(256))?;
    let all = m.forward(&ids, Logits::All)?.to_vec2::<f32>()?;
    let numpy = top10(&data["numpy_top10"])?;
    assert_eq!(numpy.len(), ids.len());
    // Measured 4.6e-3 (qwen3), 4.2e-3 (llama3), 8.5e-4 (phi3) on logits ~20: nearly all of
    // it from the keys and values cached in f16 (as llama.cpp's default cache), since with
    // f32 dot products instead of the AMX-BF16 products it is 4.9e-3 (qwen3). The top token
    // must match where numpy's margin over the runner-up exceeds twice the tolerance (the
    // llama3 prompt has a position where it is 2.5e-4).
    const TOLERANCE: f32 = 1e-2;
    let mut worst = 0f32;
    for (p, (row, want)) in all.iter().zip(&numpy).enumerate() {
        for &(id, l) in want {
            worst = worst.max((row[id as usize] - l).abs());
        }
        let best = row.iter().enumerate().fold(0, |b, (i, x)| if *x > row[b] { i } else { b });
        if want[0].1 - want[1].1 > 2.0 * TOLERANCE {
            assert_eq!(best as u32, want[0].0, "position {p}: top token");
        }
    }
    eprintln!("{name}: HF directory vs numpy float64: max |diff| {worst:.2e} over the top 10 of {} positions", ids.len());
    assert!(worst < TOLERANCE, "HF directory vs numpy: {worst}");

    // The q8_0 GGUF on the CPU kernels against llama.cpp on the same file.
    let gguf = dir.path().join("synthetic.q8_0.gguf");
    super::llama::safetensors_to_gguf(&hf, &gguf, "q8_0")?;
    let g = sapient_tensor::GgufFile::open(&gguf)?;
    let tok = sapient_tokenizers::Tokenizer::from_gguf(&g)?;
    let prompt = data["prompt"].as_str().context("prompt")?;
    assert_eq!(tok.encode(prompt, true)?, ids, "our tokenizer from the GGUF vs llama-tokenize");
    let cfg = sapient_llama::LlamaConfig::from_gguf(&g)?;
    let mut m = sapient_llama::LlamaModel::load(&g, &cfg, &Device::Cpu, Some(256))?;
    let theirs = top10(&data["llamacpp_top10"])?;
    let (mut worst, mut vs_numpy, mut llamacpp_vs_numpy) = (0f32, 0f32, 0f32);
    for (p, want) in theirs.iter().enumerate() {
        m.clear_cache();
        let row = m.forward(&ids[..=p], Logits::Last)?.squeeze(0)?.to_vec1::<f32>()?;
        for &(id, l) in want {
            worst = worst.max((row[id as usize] - l).abs());
        }
        for &(id, l) in &numpy[p] {
            vs_numpy = vs_numpy.max((row[id as usize] - l).abs());
            if let Some(&(_, t)) = want.iter().find(|x| x.0 == id) {
                llamacpp_vs_numpy = llamacpp_vs_numpy.max((t - l).abs());
            }
        }
    }
    eprintln!(
        "{name}: q8_0 GGUF vs llama.cpp: max |diff| {worst:.3} over the top 10 of {} positions; vs numpy (F32 weights): ours {vs_numpy:.3}, llama.cpp's {llamacpp_vs_numpy:.3}",
        theirs.len()
    );
    // Measured: 0.249 from llama.cpp; 0.250 from numpy on the unquantized weights, where
    // llama.cpp is 0.328 away (q8_0 weights and 8-bit activations in both; logits ~20).
    assert!(worst < 0.4, "GGUF vs llama.cpp: {worst}");
    assert!(vs_numpy < 0.4, "GGUF vs numpy: {vs_numpy}");
    let want: Vec<u32> = serde_json::from_value(data["llamacpp_greedy"].clone())?;
    m.clear_cache();
    let mut logits = m.forward(&ids, Logits::Last)?.squeeze(0)?.to_vec1::<f32>()?;
    let mut got = Vec::new();
    for _ in 0..want.len() {
        let t = logits.iter().enumerate().fold(0, |b, (i, x)| if *x > logits[b] { i } else { b }) as u32;
        got.push(t);
        logits = m.forward(&[t], Logits::Last)?.squeeze(0)?.to_vec1::<f32>()?;
    }
    assert_eq!(got, want, "greedy tokens vs llama.cpp's");
    Ok(cfg)
}

#[test]
fn qwen3_synthetic_matches_numpy_and_llama_cpp() -> Result<()> {
    let cfg = check("qwen3_synthetic.json", qwen3_tensors)?;
    assert_eq!(cfg.arch, sapient_llama::Arch::Qwen3);
    assert!(cfg.qk_norm && !cfg.qkv_bias && cfg.head_dim == HD && cfg.head_dim * cfg.num_heads != cfg.hidden_size);
    Ok(())
}

/// llama3_rope_synthetic.py's `tensors`, in index order.
fn llama3_tensors(vocab: usize) -> Vec<TensorSpec> {
    const HD: usize = H / HEADS;
    stacked(
        vocab,
        2,
        |b| {
            vec![
                b.norm("input_layernorm.weight", H),
                b.linear("self_attn.q_proj.weight", HEADS * HD, H),
                b.linear("self_attn.k_proj.weight", KV * HD, H),
                b.linear("self_attn.v_proj.weight", KV * HD, H),
                b.linear("self_attn.o_proj.weight", H, HEADS * HD),
                b.norm("post_attention_layernorm.weight", H),
                b.linear("mlp.gate_proj.weight", I, H),
                b.linear("mlp.up_proj.weight", I, H),
                b.linear("mlp.down_proj.weight", H, I),
            ]
        },
        vec![],
    )
}

/// Llama 3.1/3.2 RoPE scaling from HF `rope_scaling` (the HF directory) and from the GGUF's
/// `rope_freqs.weight` (written by the converter as llama.cpp's does), past the original
/// context: without the scaling, numpy's logits move by up to 4.8 from llama.cpp's.
#[test]
fn llama3_rope_scaling_matches_numpy_and_llama_cpp() -> Result<()> {
    let cfg = check("llama3_rope_synthetic.json", llama3_tensors)?;
    assert_eq!(cfg.arch, sapient_llama::Arch::Llama);
    assert!(matches!(cfg.rope_scaling, Some(sapient_llama::RopeScaling::FreqFactors(_))) && cfg.tie_word_embeddings);
    Ok(())
}

/// phi3_synthetic.py's `tensors`, in index order.
fn phi3_tensors(vocab: usize) -> Vec<TensorSpec> {
    const HD: usize = H / HEADS;
    stacked(
        vocab,
        2,
        |b| {
            vec![
                b.norm("input_layernorm.weight", H),
                b.linear("self_attn.qkv_proj.weight", (HEADS + 2 * KV) * HD, H),
                b.linear("self_attn.o_proj.weight", H, HEADS * HD),
                b.norm("post_attention_layernorm.weight", H),
                b.linear("mlp.gate_up_proj.weight", 2 * I, H),
                b.linear("mlp.down_proj.weight", H, I),
            ]
        },
        vec![("lm_head.weight".to_string(), vec![vocab, H], 0.0, (3.0 / H as f64).sqrt())],
    )
}

/// Phi-3: the fused projections through `cargo xtask convert` (llama.cpp's `attn_qkv` and
/// `ffn_up` holding gate and up), partial RoPE from HF `partial_rotary_factor` and from the
/// GGUF's `rope.dimension_count`, an untied output layer.
#[test]
fn phi3_synthetic_matches_numpy_and_llama_cpp() -> Result<()> {
    let cfg = check("phi3_synthetic.json", phi3_tensors)?;
    assert_eq!(cfg.arch, sapient_llama::Arch::Phi3);
    assert!(!cfg.tie_word_embeddings && cfg.rope_dim == 12 && cfg.head_dim == 16);
    // LongRoPE (Phi-3 128k, Phi-3.5) is refused by name rather than run without its scaling.
    let dir = tempfile::tempdir()?;
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/llama/phi3_synthetic.json");
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(file)?)?;
    config = config["config"].take();
    config["rope_scaling"] = serde_json::json!({"type": "longrope", "short_factor": vec![1.0; 6], "long_factor": vec![2.0; 6]});
    std::fs::write(dir.path().join("config.json"), config.to_string())?;
    let e = sapient_llama::LlamaConfig::from_hf_config(&dir.path().join("config.json")).unwrap_err().to_string();
    assert!(e.contains("LongRoPE") && e.contains("longrope"), "{e}");
    Ok(())
}
