//! `cargo xtask convert synthetic-moe --full-size ARCH OUT.gguf`: mixtures of experts with
//! the real models' shapes and random weights, for speed and memory measurements at full
//! size (no reference logits: the small checkpoints of `moe_synthetic.rs` are the ones
//! checked against llama.cpp):
//!
//! - `gpt-oss`: gpt-oss-20b (openai/gpt-oss-20b's config.json: 24 layers, hidden 2880, 64
//!   query heads and 8 key/value heads of 64, 32 experts of width 2880, top 4, vocabulary
//!   201088, a 128-position sliding window on even layers, sinks, YaRN factor 32 over 4096,
//!   RoPE base 150000), experts in MXFP4 and the rest in Q8_0 as ggml-org's GGUF has them
//!   (router, norms, biases and sinks F32): about 12.1 GB;
//! - `qwen3moe`: Qwen3-30B-A3B (48 layers, hidden 2048, 32 query heads and 4 key/value heads
//!   of 128, 128 experts of width 768, top 8, vocabulary 151936) in llama.cpp's Q4_K_M mix
//!   (Q4_K; Q6_K for `attn_v`, the output layer and `ffn_down_exps` where Q4_K_M gives them
//!   more bits): about 18 GB.
//!
//! The quantized blocks are written directly with valid random scales (no f16 copy of the
//! model is ever made, on disk or in memory), tensor by tensor as the file is written, each
//! from a generator seeded by the tensor's index: the same file every time. The vocabulary is
//! SmolLM2's tokenizer padded with unused tokens to the model's size. Random weights route
//! about uniformly over the experts.

use super::moe_synthetic::copy_tokenizer;
use anyhow::{bail, Context, Result};
use half::f16;
use sapient_tensor::gguf::TensorSpec;
use sapient_tensor::{GgmlType, GgufFile, GgufWriter, Value};
use std::io::Write;
use std::path::Path;

/// The types of the tensors a full-size model has.
#[derive(Clone, Copy)]
enum Ty {
    F32,
    Q8_0,
    Q4K,
    Q6K,
    Mxfp4,
}

impl Ty {
    fn ggml(self) -> GgmlType {
        match self {
            Ty::F32 => GgmlType::F32,
            Ty::Q8_0 => GgmlType::Q8_0,
            Ty::Q4K => GgmlType::Q4_K,
            Ty::Q6K => GgmlType::Q6_K,
            Ty::Mxfp4 => GgmlType::MXFP4,
        }
    }
}

/// One tensor: name, shape, type, and the magnitude of its values (`offset ± scale` for F32,
/// about `scale` for the quantized ones).
struct T {
    name: String,
    shape: Vec<usize>,
    ty: Ty,
    offset: f32,
    scale: f32,
}

/// A 64-bit generator (splitmix64) seeded per tensor.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
    fn fill(&mut self, out: &mut [u8]) {
        for c in out.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }
}

/// One block of `ty` with values of about `scale` into `out` (the block's bytes).
fn block(ty: Ty, scale: f32, r: &mut Rng, out: &mut [u8]) {
    let f16b = |v: f32| f16::from_f32(v).to_le_bytes();
    match ty {
        Ty::Q8_0 => {
            out[..2].copy_from_slice(&f16b(scale / 127.0 * (0.75 + 0.5 * r.unit())));
            r.fill(&mut out[2..34]);
        }
        Ty::Q4K => {
            // d times a 6-bit scale times a 4-bit value, minus dmin times a 6-bit minimum.
            out[..2].copy_from_slice(&f16b(scale / (32.0 * 8.0) * (0.75 + 0.5 * r.unit())));
            out[2..4].copy_from_slice(&f16b(scale / (32.0 * 2.0) * (0.75 + 0.5 * r.unit())));
            r.fill(&mut out[4..144]);
        }
        Ty::Q6K => {
            r.fill(&mut out[..208]);
            out[208..210].copy_from_slice(&f16b(scale / (32.0 * 64.0) * (0.75 + 0.5 * r.unit())));
        }
        Ty::Mxfp4 => {
            // Half the E8M0 scale times the doubled E2M1 values (up to 12): about `scale`.
            let e = (127.0 + (scale / 6.0).log2()).round() as i32 + (r.next() % 3) as i32 - 1;
            out[0] = e.clamp(1, 254) as u8;
            r.fill(&mut out[1..17]);
        }
        Ty::F32 => unreachable!("F32 tensors are not written in blocks"),
    }
}

/// Write tensor `t`'s bytes to `w`, a megabyte at a time.
fn write_tensor(t: &T, seed: u64, w: &mut dyn Write) -> std::io::Result<()> {
    let mut r = Rng(seed.wrapping_mul(0xD1B5_4A32_D192_ED03) ^ 0x5851_F42D_4C95_7F2D);
    let n: usize = t.shape.iter().product();
    let mut buf = Vec::with_capacity(1 << 20);
    if let Ty::F32 = t.ty {
        for _ in 0..n {
            buf.extend_from_slice(&(t.offset + (r.unit() * 2.0 - 1.0) * t.scale).to_le_bytes());
            if buf.len() >= 1 << 20 {
                w.write_all(&buf)?;
                buf.clear();
            }
        }
        return w.write_all(&buf);
    }
    let (len, bytes) = t.ty.ggml().block_layout();
    let mut blk = vec![0u8; bytes];
    for _ in 0..n / len {
        block(t.ty, t.scale, &mut r, &mut blk);
        buf.extend_from_slice(&blk);
        if buf.len() >= 1 << 20 {
            w.write_all(&buf)?;
            buf.clear();
        }
    }
    w.write_all(&buf)
}

/// A model's shape.
struct Shape {
    arch: &'static str,
    layers: usize,
    hidden: usize,
    heads: usize,
    kv: usize,
    head_dim: usize,
    experts: usize,
    used: usize,
    ff: usize,
    vocab: usize,
    gpt_oss: bool,
}

fn shape(arch: &str) -> Result<Shape> {
    Ok(match arch {
        "gpt-oss" => Shape { arch: "gpt-oss", layers: 24, hidden: 2880, heads: 64, kv: 8, head_dim: 64, experts: 32, used: 4, ff: 2880, vocab: 201_088, gpt_oss: true },
        "qwen3moe" => Shape { arch: "qwen3moe", layers: 48, hidden: 2048, heads: 32, kv: 4, head_dim: 128, experts: 128, used: 8, ff: 768, vocab: 151_936, gpt_oss: false },
        other => bail!("no full-size synthetic MoE '{other}' (gpt-oss, qwen3moe)"),
    })
}

/// Whether llama.cpp's Q4_K_M gives layer `l` of `n` more bits in `ffn_down` (its
/// `use_more_bits`: the first and last eighth, and every third layer between).
fn more_bits(l: usize, n: usize) -> bool {
    l < n / 8 || l >= 7 * n / 8 || (l - n / 8) % 3 == 2
}

/// The tensors of `s` in file order.
fn tensors(s: &Shape) -> Vec<T> {
    let mut v = Vec::new();
    let mut add = |name: String, shape: Vec<usize>, ty: Ty, offset: f32, scale: f32| v.push(T { name, shape, ty, offset, scale });
    let lin = |fan_in: usize| (3.0 / fan_in as f32).sqrt();
    let (h, hd, e, ff) = (s.hidden, s.head_dim, s.experts, s.ff);
    let (q, kv) = (s.heads * hd, s.kv * hd);
    let dense = if s.gpt_oss { Ty::Q8_0 } else { Ty::Q4K };
    add("token_embd.weight".into(), vec![s.vocab, h], dense, 0.0, 1.0);
    for l in 0..s.layers {
        let p = |x: &str| format!("blk.{l}.{x}.weight");
        let b = |x: &str| format!("blk.{l}.{x}.bias");
        add(p("attn_norm"), vec![h], Ty::F32, 1.0, 0.2);
        add(p("attn_q"), vec![q, h], dense, 0.0, lin(h));
        add(p("attn_k"), vec![kv, h], dense, 0.0, lin(h));
        add(p("attn_v"), vec![kv, h], if s.gpt_oss { Ty::Q8_0 } else { Ty::Q6K }, 0.0, lin(h));
        add(p("attn_output"), vec![h, q], dense, 0.0, lin(q));
        if s.gpt_oss {
            for (name, n) in [(b("attn_q"), q), (b("attn_k"), kv), (b("attn_v"), kv), (b("attn_output"), h)] {
                add(name, vec![n], Ty::F32, 0.0, 0.2);
            }
            add(p("attn_sinks"), vec![s.heads], Ty::F32, 0.0, 2.0);
            add(p("post_attention_norm"), vec![h], Ty::F32, 1.0, 0.2);
            add(p("ffn_gate_inp"), vec![e, h], Ty::F32, 0.0, lin(h));
            add(b("ffn_gate_inp"), vec![e], Ty::F32, 0.0, 0.2);
            add(p("ffn_gate_exps"), vec![e, ff, h], Ty::Mxfp4, 0.0, lin(h));
            add(p("ffn_up_exps"), vec![e, ff, h], Ty::Mxfp4, 0.0, lin(h));
            add(p("ffn_down_exps"), vec![e, h, ff], Ty::Mxfp4, 0.0, lin(ff));
            add(b("ffn_gate_exps"), vec![e, ff], Ty::F32, 0.0, 0.2);
            add(b("ffn_up_exps"), vec![e, ff], Ty::F32, 0.0, 0.2);
            add(b("ffn_down_exps"), vec![e, h], Ty::F32, 0.0, 0.2);
        } else {
            add(p("attn_q_norm"), vec![hd], Ty::F32, 1.0, 0.2);
            add(p("attn_k_norm"), vec![hd], Ty::F32, 1.0, 0.2);
            add(p("ffn_norm"), vec![h], Ty::F32, 1.0, 0.2);
            add(p("ffn_gate_inp"), vec![e, h], Ty::F32, 0.0, lin(h));
            add(p("ffn_gate_exps"), vec![e, ff, h], Ty::Q4K, 0.0, lin(h));
            add(p("ffn_up_exps"), vec![e, ff, h], Ty::Q4K, 0.0, lin(h));
            add(p("ffn_down_exps"), vec![e, h, ff], if more_bits(l, s.layers) { Ty::Q6K } else { Ty::Q4K }, 0.0, lin(ff));
        }
    }
    add("output_norm.weight".into(), vec![h], Ty::F32, 1.0, 0.2);
    add("output.weight".into(), vec![s.vocab, h], if s.gpt_oss { Ty::Q8_0 } else { Ty::Q6K }, 0.0, lin(h));
    v
}

/// Write the full-size synthetic `arch` to `out`, with the tokenizer of the GGUF `tokenizer`
/// padded to the model's vocabulary. Returns the file's size.
pub fn write(arch: &str, tokenizer: &Path, out: &Path) -> Result<u64> {
    let s = shape(arch)?;
    let tok = GgufFile::open(tokenizer)?;
    let mut w = GgufWriter::new();
    let k = |x: &str| format!("{}.{x}", s.arch);
    w.set("general.architecture", Value::String(s.arch.into()))
        .set("general.name", Value::String(format!("synthetic full-size {arch}")))
        .set(k("context_length"), Value::U32(if s.gpt_oss { 131_072 } else { 40_960 }))
        .set(k("embedding_length"), Value::U32(s.hidden as u32))
        .set(k("block_count"), Value::U32(s.layers as u32))
        .set(k("feed_forward_length"), Value::U32(if s.gpt_oss { s.ff } else { 6144 } as u32))
        .set(k("attention.head_count"), Value::U32(s.heads as u32))
        .set(k("attention.head_count_kv"), Value::U32(s.kv as u32))
        .set(k("attention.key_length"), Value::U32(s.head_dim as u32))
        .set(k("attention.value_length"), Value::U32(s.head_dim as u32))
        .set(k("attention.layer_norm_rms_epsilon"), Value::F32(if s.gpt_oss { 1e-5 } else { 1e-6 }))
        .set(k("rope.freq_base"), Value::F32(if s.gpt_oss { 150_000.0 } else { 1_000_000.0 }))
        .set(k("rope.dimension_count"), Value::U32(s.head_dim as u32))
        .set(k("vocab_size"), Value::U32(s.vocab as u32))
        .set(k("expert_count"), Value::U32(s.experts as u32))
        .set(k("expert_used_count"), Value::U32(s.used as u32))
        .set(k("expert_feed_forward_length"), Value::U32(s.ff as u32));
    if s.gpt_oss {
        w.set(k("attention.sliding_window"), Value::U32(128))
            .set(k("rope.scaling.type"), Value::String("yarn".into()))
            .set(k("rope.scaling.factor"), Value::F32(32.0))
            .set(k("rope.scaling.original_context_length"), Value::U32(4096));
    }
    // The token arrays padded with unused, user-defined (type 4) tokens to the model's vocabulary.
    copy_tokenizer(&tok, &mut w, s.vocab, |i| format!("<|unused_{i}|>"), 4)?;
    let ts = tensors(&s);
    let specs: Vec<TensorSpec> = ts.iter().map(|t| TensorSpec { name: t.name.clone(), shape: t.shape.clone(), ggml_type: t.ty.ggml() }).collect();
    w.write_streamed(out, &specs, &mut |i, out| write_tensor(&ts[i], i as u64 + 1, out)).with_context(|| out.display().to_string())?;
    Ok(std::fs::metadata(out)?.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tensor list has the real models' parameter counts: gpt-oss-20b 20.9B (3.6B
    /// active, as its model card counts them: without the embedding table), Qwen3-30B-A3B
    /// 30.5B (3.3B active, with it).
    #[test]
    fn full_size_shapes_have_the_real_parameter_counts() -> Result<()> {
        for (arch, total, active, with_embd) in [("gpt-oss", 20.9e9, 3.6e9, false), ("qwen3moe", 30.5e9, 3.3e9, true)] {
            let s = shape(arch)?;
            let ts = tensors(&s);
            let n = |t: &T| t.shape.iter().product::<usize>() as f64;
            let all: f64 = ts.iter().map(n).sum();
            let experts: f64 = ts.iter().filter(|t| t.name.contains("_exps")).map(n).sum();
            let embd = n(&ts[0]);
            let act = all - experts - if with_embd { 0.0 } else { embd } + experts * s.used as f64 / s.experts as f64;
            assert!((all / total - 1.0).abs() < 0.02, "{arch}: {all:.3e} parameters");
            assert!((act / active - 1.0).abs() < 0.05, "{arch}: {act:.3e} active parameters");
        }
        Ok(())
    }

    /// Every block the generator writes decodes to finite values of about the asked scale.
    #[test]
    fn random_blocks_are_valid() {
        let mut r = Rng(1);
        for ty in [Ty::Q8_0, Ty::Q4K, Ty::Q6K, Ty::Mxfp4] {
            let g = ty.ggml();
            let (len, bytes) = g.block_layout();
            let mut blk = vec![0u8; bytes];
            let mut vals = vec![0f32; len];
            for _ in 0..64 {
                block(ty, 0.03, &mut r, &mut blk);
                match sapient_tensor::kernels::quant::QType::from_ggml(g) {
                    Some(q) => sapient_tensor::kernels::quant::dequantize_row(q, &blk, &mut vals),
                    None => sapient_tensor::kernels::dequantize_mxfp4(&blk, &mut vals),
                }
                let max = vals.iter().fold(0f32, |m, v| m.max(v.abs()));
                assert!(vals.iter().all(|v| v.is_finite()) && max > 0.003 && max < 0.3, "{g}: max {max}");
            }
        }
    }
}
