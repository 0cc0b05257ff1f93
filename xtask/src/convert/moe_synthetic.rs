//! `cargo xtask convert synthetic-moe ARCH OUT.gguf`: small mixture-of-experts checkpoints
//! with the real layer structure and random weights, written straight to GGUF (llama.cpp's
//! names, stacked expert tensors), and the token ids of the prompts they are checked on:
//!
//! - `qwen3moe`: Qwen3-MoE (per-head q/k RMSNorm, heads wider than hidden / heads), 16 experts,
//!   top 4, softmax then renormalized weights; experts in Q8_0;
//! - `qwen3moe-mxfp4`: the same with experts in MXFP4 (gpt-oss's format; random blocks);
//! - `gpt-oss`: gpt-oss's layers (llama.cpp's `openai-moe`): biases on the attention
//!   projections, the router and the experts, a learned sink per head, an 8-position
//!   sliding window on even layers, YaRN (factor 4 over an original context of 16), the
//!   clamped SwiGLU and the softmax over the chosen experts; 8 experts, top 4, MXFP4;
//! - `qwen2moe`: Qwen2-MoE (q/k/v biases), 8 experts, top 4, softmax weights not
//!   renormalized, and a shared expert (twice an expert's width) gated per token; experts in
//!   Q8_0;
//! - `llama-moe`: Mixtral's layout under llama.cpp's `llama` architecture (interleaved RoPE),
//!   8 experts, top 2; experts in Q4_0.
//!
//! All have an output layer of their own. The tokenizer is SmolLM2's (copied from its GGUF); attention, embeddings and the router
//! stay F32 (as llama.cpp's quantizer keeps `ffn_gate_inp`), so the reference and we route
//! on nearly the same logits. Every weight is a function of its tensor's index and element
//! index, so the test rebuilds the file scripts/reference/moe_synthetic.py ran llama.cpp on
//! (references in tests/data/llama/<arch>_synthetic.json).

use anyhow::{bail, Context, Result};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use sapient_tensor::gguf::TensorData;
use sapient_tensor::{GgmlType, GgufFile, GgufWriter, Value};
use std::path::Path;

/// Hidden width, query heads, key/value heads.
const H: usize = 64;
const HEADS: usize = 4;
const KV: usize = 2;
/// Layers, and the width of one expert.
const LAYERS: usize = 2;
const FF: usize = 64;
/// The width of qwen2moe's shared expert.
const SHARED_FF: usize = 128;
/// gpt-oss's sliding window (128 in the real models): short, so that the prompts pass it.
const WINDOW: usize = 8;

/// The prompts the references are taken on.
pub const PROMPTS: [&str; 3] = [
    "The quick brown fox jumps over the lazy dog. def main():\n    return 42",
    "Once upon a time, in a small village at the edge of a great forest, there lived",
    "1, 2, 3, 5, 8, 13, 21,",
];

/// One architecture's shape.
struct Spec {
    arch: &'static str,
    experts: usize,
    used: usize,
    head_dim: usize,
    qk_norm: bool,
    /// The experts' format: a candle type, or `None` for MXFP4 (random valid blocks).
    expert_type: Option<GgmlDType>,
    /// gpt-oss's additions: biases on the attention projections, the router and the experts,
    /// attention sinks, a sliding window on even layers, YaRN.
    gpt_oss: bool,
    /// qwen2moe's additions: q/k/v biases and a shared expert.
    qwen2moe: bool,
}

fn spec(name: &str) -> Result<Spec> {
    Ok(match name {
        "qwen3moe" => Spec { arch: "qwen3moe", experts: 16, used: 4, head_dim: 32, qk_norm: true, expert_type: Some(GgmlDType::Q8_0), gpt_oss: false, qwen2moe: false },
        "qwen3moe-mxfp4" => Spec { arch: "qwen3moe", experts: 16, used: 4, head_dim: 32, qk_norm: true, expert_type: None, gpt_oss: false, qwen2moe: false },
        "qwen2moe" => Spec { arch: "qwen2moe", experts: 8, used: 4, head_dim: H / HEADS, qk_norm: false, expert_type: Some(GgmlDType::Q8_0), gpt_oss: false, qwen2moe: true },
        "llama-moe" => Spec { arch: "llama", experts: 8, used: 2, head_dim: H / HEADS, qk_norm: false, expert_type: Some(GgmlDType::Q4_0), gpt_oss: false, qwen2moe: false },
        "gpt-oss" => Spec { arch: "gpt-oss", experts: 8, used: 4, head_dim: 32, qk_norm: false, expert_type: None, gpt_oss: true, qwen2moe: false },
        other => bail!("unknown synthetic MoE '{other}' (qwen3moe, qwen3moe-mxfp4, qwen2moe, llama-moe, gpt-oss)"),
    })
}

/// `n` values uniform in `offset +- scale`, from a 64-bit mix of (`seed`, element index).
pub(super) fn values(seed: u64, n: usize, offset: f32, scale: f32) -> Vec<f32> {
    (0..n as u64)
        .map(|i| {
            let mut z = (seed << 40) ^ i ^ 0x2545_F491_4F6C_DD1D;
            for _ in 0..2 {
                z ^= z >> 33;
                z = z.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
            }
            z ^= z >> 33;
            let u = (z >> 11) as f64 / (1u64 << 53) as f64;
            offset + ((u - 0.5) * 2.0) as f32 * scale
        })
        .collect()
}

/// `blocks` random MXFP4 blocks: scales 2^-7 to 2^-5 (E8M0 121 to 123; the values are twice
/// the E2M1 codes times half the scale), codes uniform.
fn mxfp4_blocks(seed: u64, blocks: usize) -> Vec<u8> {
    let bytes = values(seed, blocks * 17, 0.5, 0.5);
    bytes
        .chunks_exact(17)
        .flat_map(|b| std::iter::once(121 + (b[0] * 3.0) as u8 % 3).chain(b[1..].iter().map(|&u| (u * 256.0) as u8)))
        .collect()
}

/// Copies the `tokenizer.*` metadata of the GGUF `tok` to `w`, its per-token arrays (tokens,
/// types, scores) padded to `vocab` entries: token `i` past the tokenizer's own is named
/// `pad_name(i)`, of type `pad_type`, score 0. Fails when the tokenizer has more than `vocab`
/// tokens or as many types as tokens.
pub(super) fn copy_tokenizer(tok: &GgufFile, w: &mut GgufWriter, vocab: usize, pad_name: impl Fn(usize) -> String, pad_type: i32) -> Result<()> {
    let n = tok.get_array("tokenizer.ggml.tokens")?.len();
    if n > vocab {
        bail!("the tokenizer has {n} tokens, more than the model's {vocab}");
    }
    let types = tok.get_array("tokenizer.ggml.token_type")?.len();
    if types != n {
        bail!("the tokenizer has {n} tokens and {types} token types");
    }
    for (key, v) in tok.metadata_ordered() {
        if !key.starts_with("tokenizer.") {
            continue;
        }
        let v = match (key, v) {
            ("tokenizer.ggml.tokens", Value::Array(t, a)) => Value::Array(*t, a.iter().cloned().chain((n..vocab).map(|i| Value::String(pad_name(i)))).collect()),
            ("tokenizer.ggml.token_type", Value::Array(t, a)) => Value::Array(*t, a.iter().cloned().chain((n..vocab).map(|_| Value::I32(pad_type))).collect()),
            ("tokenizer.ggml.scores", Value::Array(t, a)) => Value::Array(*t, a.iter().cloned().chain((n..vocab).map(|_| Value::F32(0.0))).collect()),
            _ => v.clone(),
        };
        w.set(key, v);
    }
    Ok(())
}

/// Write the synthetic checkpoint `name` to `out` with the tokenizer of the GGUF `tokenizer`;
/// returns the token ids of [`PROMPTS`] under that tokenizer.
pub fn write(name: &str, tokenizer: &Path, out: &Path) -> Result<Vec<Vec<u32>>> {
    let s = spec(name)?;
    let tok_gguf = GgufFile::open(tokenizer)?;
    let tok = sapient_tokenizers::Tokenizer::from_gguf(&tok_gguf)?;
    let vocab = tok_gguf.get_array("tokenizer.ggml.tokens")?.len();
    let mut w = GgufWriter::new();
    let a = s.arch;
    let k = |x: &str| format!("{a}.{x}");
    w.set("general.architecture", Value::String(a.into()))
        .set("general.name", Value::String(format!("synthetic {name}")))
        .set(k("context_length"), Value::U32(4096))
        .set(k("embedding_length"), Value::U32(H as u32))
        .set(k("block_count"), Value::U32(LAYERS as u32))
        .set(k("feed_forward_length"), Value::U32(FF as u32))
        .set(k("attention.head_count"), Value::U32(HEADS as u32))
        .set(k("attention.head_count_kv"), Value::U32(KV as u32))
        .set(k("attention.key_length"), Value::U32(s.head_dim as u32))
        .set(k("attention.value_length"), Value::U32(s.head_dim as u32))
        .set(k("attention.layer_norm_rms_epsilon"), Value::F32(1e-6))
        .set(k("rope.freq_base"), Value::F32(1_000_000.0))
        .set(k("rope.dimension_count"), Value::U32(s.head_dim as u32))
        .set(k("vocab_size"), Value::U32(vocab as u32))
        .set(k("expert_count"), Value::U32(s.experts as u32))
        .set(k("expert_used_count"), Value::U32(s.used as u32));
    if a != "llama" {
        w.set(k("expert_feed_forward_length"), Value::U32(FF as u32));
    }
    if s.qwen2moe {
        w.set(k("expert_shared_feed_forward_length"), Value::U32(SHARED_FF as u32));
    }
    if s.gpt_oss {
        w.set(k("attention.sliding_window"), Value::U32(WINDOW as u32))
            .set(k("rope.scaling.type"), Value::String("yarn".into()))
            .set(k("rope.scaling.factor"), Value::F32(4.0))
            .set(k("rope.scaling.original_context_length"), Value::U32(16));
    }
    // The vocabulary is the tokenizer's own: nothing to pad.
    copy_tokenizer(&tok_gguf, &mut w, vocab, |i| format!("[PAD{i}]"), 5)?;
    let mut index = 0u64;
    let mut add = |w: &mut GgufWriter, name: String, shape: &[usize], offset: f32, scale: f32, ty: Option<GgmlDType>| -> Result<()> {
        index += 1;
        let n: usize = shape.iter().product();
        let Some(ty) = ty else {
            w.add_tensor(TensorData { name, shape: shape.to_vec(), ggml_type: GgmlType::MXFP4, data: mxfp4_blocks(index, n / 32) });
            return Ok(());
        };
        let t = Tensor::from_vec(values(index, n, offset, scale), shape, &Device::Cpu)?;
        w.add_tensor(TensorData::from_qtensor(name, &QTensor::quantize(&t, ty)?)?);
        Ok(())
    };
    let lin = |fan_in: usize| (3.0 / fan_in as f32).sqrt();
    let f32_ = Some(GgmlDType::F32);
    add(&mut w, "token_embd.weight".into(), &[vocab, H], 0.0, 1.0, f32_)?;
    let (hd, e) = (s.head_dim, s.experts);
    for l in 0..LAYERS {
        let p = |x: &str| format!("blk.{l}.{x}.weight");
        add(&mut w, p("attn_norm"), &[H], 1.0, 0.2, f32_)?;
        add(&mut w, p("attn_q"), &[HEADS * hd, H], 0.0, lin(H), f32_)?;
        add(&mut w, p("attn_k"), &[KV * hd, H], 0.0, lin(H), f32_)?;
        add(&mut w, p("attn_v"), &[KV * hd, H], 0.0, lin(H), f32_)?;
        if s.qk_norm {
            add(&mut w, p("attn_q_norm"), &[hd], 1.0, 0.2, f32_)?;
            add(&mut w, p("attn_k_norm"), &[hd], 1.0, 0.2, f32_)?;
        }
        add(&mut w, p("attn_output"), &[H, HEADS * hd], 0.0, lin(HEADS * hd), f32_)?;
        add(&mut w, p(if s.gpt_oss { "post_attention_norm" } else { "ffn_norm" }), &[H], 1.0, 0.2, f32_)?;
        add(&mut w, p("ffn_gate_inp"), &[e, H], 0.0, lin(H), f32_)?;
        add(&mut w, p("ffn_gate_exps"), &[e, FF, H], 0.0, lin(H), s.expert_type)?;
        add(&mut w, p("ffn_up_exps"), &[e, FF, H], 0.0, lin(H), s.expert_type)?;
        add(&mut w, p("ffn_down_exps"), &[e, H, FF], 0.0, lin(FF), s.expert_type)?;
        if s.qwen2moe {
            add(&mut w, format!("blk.{l}.attn_q.bias"), &[HEADS * hd], 0.0, 0.2, f32_)?;
            add(&mut w, format!("blk.{l}.attn_k.bias"), &[KV * hd], 0.0, 0.2, f32_)?;
            add(&mut w, format!("blk.{l}.attn_v.bias"), &[KV * hd], 0.0, 0.2, f32_)?;
            add(&mut w, p("ffn_gate_inp_shexp"), &[H], 0.0, lin(H), f32_)?;
            add(&mut w, p("ffn_gate_shexp"), &[SHARED_FF, H], 0.0, lin(H), s.expert_type)?;
            add(&mut w, p("ffn_up_shexp"), &[SHARED_FF, H], 0.0, lin(H), s.expert_type)?;
            add(&mut w, p("ffn_down_shexp"), &[H, SHARED_FF], 0.0, lin(SHARED_FF), s.expert_type)?;
        }
        if s.gpt_oss {
            let b = |x: &str| format!("blk.{l}.{x}.bias");
            for (name, shape) in [
                (b("attn_q"), vec![HEADS * hd]),
                (b("attn_k"), vec![KV * hd]),
                (b("attn_v"), vec![KV * hd]),
                (b("attn_output"), vec![H]),
                (b("ffn_gate_inp"), vec![e]),
                (b("ffn_gate_exps"), vec![e, FF]),
                (b("ffn_up_exps"), vec![e, FF]),
                (b("ffn_down_exps"), vec![e, H]),
            ] {
                add(&mut w, name, &shape, 0.0, 0.2, f32_)?;
            }
            add(&mut w, p("attn_sinks"), &[HEADS], 0.0, 2.0, f32_)?;
        }
    }
    add(&mut w, "output_norm.weight".into(), &[H], 1.0, 0.2, f32_)?;
    add(&mut w, "output.weight".into(), &[vocab, H], 0.0, lin(H), f32_)?;
    w.write(out).with_context(|| out.display().to_string())?;
    PROMPTS.iter().map(|p| Ok(tok.encode(p, true)?)).collect()
}

#[cfg(test)]
mod tests;
