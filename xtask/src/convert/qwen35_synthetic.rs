//! `cargo xtask convert synthetic-qwen35 SIZE OUT.gguf`: a Qwen3.5 checkpoint at a real
//! model's shapes with random weights, in F16 (matrices) and F32 (norms, convolution, decay
//! vectors), for speed measurements: quantize it with llama.cpp's `llama-quantize OUT.gguf
//! OUT-q4_k_m.gguf Q4_K_M` and run `cargo xtask bench llm --preset PATH` on it.
//!
//! Shapes (`0.8b`, `2b`) are those of Qwen/Qwen3.5-0.8B's and Qwen3.5-2B's `config.json`
//! (`text_config`): hybrid layers `[linear, linear, linear, full]` repeated
//! (`full_attention_interval` 4), Gated DeltaNet with 16 key and 16 value heads of 128,
//! a convolution of 4 taps, gated full attention with 256-wide heads and 2 key/value heads,
//! partial interleaved M-RoPE (a quarter of the head, sections 11/11/10), tied embeddings,
//! a vocabulary of 248,320 and one MTP layer. The tokenizer is Qwen2.5's (the cached
//! `qwen2.5-coder-0.5b-instruct` GGUF's metadata), padded with unused `[PADn]` tokens to the
//! vocabulary size as llama.cpp's converter pads Qwen vocabularies.
//!
//! The weights are uniform with the scales of the small synthetic checkpoints (a linear
//! layer keeps unit variance, norms around 1), so the activations stay finite through every
//! layer; the text they produce is meaningless.

use super::moe_synthetic::{copy_tokenizer, values};
use anyhow::{bail, Context, Result};
use sapient_tensor::gguf::TensorData;
use sapient_tensor::{GgmlType, GgufFile, GgufWriter, Value};
use std::path::Path;

/// The shapes of one size.
struct Dims {
    hidden: usize,
    ff: usize,
    layers: usize,
    heads: usize,
    kv: usize,
    head_dim: usize,
    k_heads: usize,
    v_heads: usize,
    state: usize,
}

const VOCAB: usize = 248_320;
const INTERVAL: usize = 4;
const CONV: usize = 4;
const SECTIONS: [i32; 4] = [11, 11, 10, 0];

fn dims(size: &str) -> Result<Dims> {
    Ok(match size {
        "0.8b" => Dims { hidden: 1024, ff: 3584, layers: 24, heads: 8, kv: 2, head_dim: 256, k_heads: 16, v_heads: 16, state: 128 },
        "2b" => Dims { hidden: 2048, ff: 6144, layers: 24, heads: 8, kv: 2, head_dim: 256, k_heads: 16, v_heads: 16, state: 128 },
        other => bail!("unknown Qwen3.5 size '{other}' (0.8b, 2b)"),
    })
}

/// Write the synthetic Qwen3.5 of `size` to `out`, its tokenizer from the GGUF `tok`.
pub fn write(size: &str, tok: &Path, out: &Path) -> Result<()> {
    let d = dims(size)?;
    let mut w = GgufWriter::new();
    let a = |k: &str| format!("qwen35.{k}");
    let u = |v: usize| Value::U32(v as u32);
    w.set("general.architecture", Value::String("qwen35".into()))
        .set("general.name", Value::String(format!("qwen35-{size}-synthetic")))
        .set(a("block_count"), u(d.layers + 1))
        .set(a("nextn_predict_layers"), u(1))
        .set(a("context_length"), u(262_144))
        .set(a("embedding_length"), u(d.hidden))
        .set(a("feed_forward_length"), u(d.ff))
        .set(a("attention.head_count"), u(d.heads))
        .set(a("attention.head_count_kv"), u(d.kv))
        .set(a("attention.key_length"), u(d.head_dim))
        .set(a("attention.value_length"), u(d.head_dim))
        .set(a("attention.layer_norm_rms_epsilon"), Value::F32(1e-6))
        .set(a("rope.freq_base"), Value::F32(10_000_000.0))
        .set(a("rope.dimension_count"), u(d.head_dim / 4))
        .set(a("rope.dimension_sections"), Value::i32_array(SECTIONS))
        .set(a("full_attention_interval"), u(INTERVAL))
        .set(a("ssm.conv_kernel"), u(CONV))
        .set(a("ssm.state_size"), u(d.state))
        .set(a("ssm.group_count"), u(d.k_heads))
        .set(a("ssm.time_step_rank"), u(d.v_heads))
        .set(a("ssm.inner_size"), u(d.v_heads * d.state));
    // Padded with unused (type 5) `[PADn]` tokens, as llama.cpp's converter pads Qwen vocabularies.
    let g = GgufFile::open(tok)?;
    copy_tokenizer(&g, &mut w, VOCAB, |i| format!("[PAD{i}]"), 5).with_context(|| tok.display().to_string())?;
    let mut index = 0u64;
    // Matrices in F16, vectors (and the 4-tap convolution) in F32, as llama.cpp's converter.
    let mut add = |w: &mut GgufWriter, name: String, shape: Vec<usize>, offset: f32, scale: f32| {
        index += 1;
        let v = values(index, shape.iter().product(), offset, scale);
        let (ggml_type, data) = if shape.len() == 2 && shape[1] > CONV {
            (GgmlType::F16, v.into_iter().flat_map(|x| half::f16::from_f32(x).to_le_bytes()).collect())
        } else {
            (GgmlType::F32, v.into_iter().flat_map(f32::to_le_bytes).collect())
        };
        w.add_tensor(TensorData { name, shape, ggml_type, data });
    };
    let h = d.hidden;
    let lin = |i: usize| (3.0 / i as f32).sqrt();
    add(&mut w, "token_embd.weight".into(), vec![VOCAB, h], 0.0, 1.0);
    add(&mut w, "output_norm.weight".into(), vec![h], 1.0, 0.2);
    let (key_dim, value_dim) = (d.k_heads * d.state, d.v_heads * d.state);
    for l in 0..=d.layers {
        let p = |n: &str| format!("blk.{l}.{n}.weight");
        add(&mut w, p("attn_norm"), vec![h], 1.0, 0.2);
        add(&mut w, p("post_attention_norm"), vec![h], 1.0, 0.2);
        if l < d.layers && (l + 1) % INTERVAL != 0 {
            add(&mut w, p("attn_qkv"), vec![2 * key_dim + value_dim, h], 0.0, lin(h));
            add(&mut w, p("attn_gate"), vec![value_dim, h], 0.0, lin(h));
            add(&mut w, p("ssm_conv1d"), vec![2 * key_dim + value_dim, CONV], 0.0, 0.5);
            add(&mut w, format!("blk.{l}.ssm_dt.bias"), vec![d.v_heads], 0.0, 1.0);
            // -exp(A_log): decays between exp(-1.5 softplus) and exp(-0.5 softplus).
            add(&mut w, format!("blk.{l}.ssm_a"), vec![d.v_heads], -1.0, 0.5);
            add(&mut w, p("ssm_beta"), vec![d.v_heads, h], 0.0, lin(h));
            add(&mut w, p("ssm_alpha"), vec![d.v_heads, h], 0.0, lin(h));
            add(&mut w, p("ssm_norm"), vec![d.state], 1.0, 0.2);
            add(&mut w, p("ssm_out"), vec![h, value_dim], 0.0, lin(value_dim));
        } else {
            let qd = d.heads * d.head_dim;
            add(&mut w, p("attn_q"), vec![2 * qd, h], 0.0, lin(h));
            add(&mut w, p("attn_k"), vec![d.kv * d.head_dim, h], 0.0, lin(h));
            add(&mut w, p("attn_v"), vec![d.kv * d.head_dim, h], 0.0, lin(h));
            add(&mut w, p("attn_q_norm"), vec![d.head_dim], 1.0, 0.2);
            add(&mut w, p("attn_k_norm"), vec![d.head_dim], 1.0, 0.2);
            add(&mut w, p("attn_output"), vec![h, qd], 0.0, lin(qd));
        }
        add(&mut w, p("ffn_gate"), vec![d.ff, h], 0.0, lin(h));
        add(&mut w, p("ffn_up"), vec![d.ff, h], 0.0, lin(h));
        add(&mut w, p("ffn_down"), vec![h, d.ff], 0.0, lin(d.ff));
        if l == d.layers {
            add(&mut w, p("nextn.eh_proj"), vec![h, 2 * h], 0.0, lin(2 * h));
            add(&mut w, p("nextn.enorm"), vec![h], 1.0, 0.2);
            add(&mut w, p("nextn.hnorm"), vec![h], 1.0, 0.2);
            add(&mut w, p("nextn.shared_head_norm"), vec![h], 1.0, 0.2);
        }
    }
    w.write(out).with_context(|| out.display().to_string())?;
    Ok(())
}
