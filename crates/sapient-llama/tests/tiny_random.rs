//! Plumbing on a tiny random-weight model written as GGUF (shapes, masks, RoPE variants):
//! not model behaviour, which the SmolLM2 tests cover.

use anyhow::Result;
use candle_core::{Device, Tensor};
use sapient_llama::{BatchSeq, KvBudget, KvOptions, LlamaConfig, LlamaModel, Logits};
use sapient_tensor::gguf::{GgmlType, GgufFile, GgufWriter, TensorData, Value};

const H: usize = 64;
const HEADS: usize = 4;
const KV: usize = 2;
const FF: usize = 96;
const VOCAB: usize = 50;
const LAYERS: usize = 2;

/// Weights stored as F32 (`F32`), as F32 holding values rounded to f16 (`F32Rounded`) or as
/// F16 (`F16`: the same values as `F32Rounded`).
#[derive(Clone, Copy, PartialEq)]
enum Store {
    F32,
    F32Rounded,
    F16,
}

fn tensor(name: &str, shape: &[usize], seed: u64, store: Store) -> TensorData {
    let n: usize = shape.iter().product();
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let values = (0..n).map(|_| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        ((x >> 11) as f64 / (1u64 << 53) as f64 - 0.5) as f32 * 0.4
    });
    // Norm weights stay F32 (as in real GGUF files).
    let store = if shape.len() == 1 { Store::F32 } else { store };
    let (ggml_type, data): (_, Vec<u8>) = match store {
        Store::F32 => (GgmlType::F32, values.flat_map(f32::to_le_bytes).collect()),
        Store::F32Rounded => (GgmlType::F32, values.flat_map(|v| half::f16::from_f32(v).to_f32().to_le_bytes()).collect()),
        Store::F16 => (GgmlType::F16, values.flat_map(|v| half::f16::from_f32(v).to_le_bytes()).collect()),
    };
    TensorData { name: name.into(), shape: shape.to_vec(), ggml_type, data }
}

fn tiny(extra: &[(&str, Value)]) -> Result<GgufFile> {
    tiny_stored(extra, Store::F32)
}

fn tiny_stored(extra: &[(&str, Value)], store: Store) -> Result<GgufFile> {
    let mut w = GgufWriter::new();
    w.set("general.architecture", Value::String("llama".into()))
        .set("llama.block_count", Value::U32(LAYERS as u32))
        .set("llama.embedding_length", Value::U32(H as u32))
        .set("llama.feed_forward_length", Value::U32(FF as u32))
        .set("llama.attention.head_count", Value::U32(HEADS as u32))
        .set("llama.attention.head_count_kv", Value::U32(KV as u32))
        .set("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5))
        .set("llama.context_length", Value::U32(128))
        .set("llama.vocab_size", Value::U32(VOCAB as u32));
    for (k, v) in extra {
        w.set(*k, v.clone());
    }
    let d = H / HEADS;
    let mut seed = 1;
    let mut t = |name: &str, shape: &[usize]| {
        seed += 1;
        tensor(name, shape, seed, store)
    };
    w.add_tensor(t("token_embd.weight", &[VOCAB, H]));
    for l in 0..LAYERS {
        for (n, s) in [
            ("attn_norm.weight", vec![H]),
            ("ffn_norm.weight", vec![H]),
            ("attn_q.weight", vec![HEADS * d, H]),
            ("attn_k.weight", vec![KV * d, H]),
            ("attn_v.weight", vec![KV * d, H]),
            ("attn_output.weight", vec![H, HEADS * d]),
            ("ffn_gate.weight", vec![FF, H]),
            ("ffn_up.weight", vec![FF, H]),
            ("ffn_down.weight", vec![H, FF]),
        ] {
            w.add_tensor(t(&format!("blk.{l}.{n}"), &s));
        }
    }
    w.add_tensor(t("output_norm.weight", &[H]));
    Ok(GgufFile::from_bytes("tiny.gguf", w.to_bytes())?)
}

fn load(g: &GgufFile) -> Result<LlamaModel> {
    Ok(LlamaModel::load(g, &LlamaConfig::from_gguf(g)?, &Device::Cpu, Some(128))?)
}

fn max_diff(a: &Tensor, b: &Tensor) -> Result<f32> {
    Ok((a - b)?.abs()?.max_all()?.to_scalar()?)
}

const IDS: [u32; 40] = [
    1, 5, 9, 13, 2, 44, 7, 30, 21, 8, 3, 17, 29, 40, 11, 6, 25, 38, 12, 4, 33, 19, 27, 10, 45, 15, 36, 22, 14, 31, 9, 2,
    48, 16, 23, 37, 5, 28, 41, 18,
];

fn batched_vs_sequential(g: &GgufFile) -> Result<(Tensor, f32)> {
    let mut m = load(g)?;
    let all = m.forward(&IDS, Logits::All)?;
    m.clear_cache();
    let mut rows = Vec::new();
    for &t in &IDS {
        rows.push(m.forward(&[t], Logits::Last)?);
    }
    let seq = Tensor::cat(&rows, 0)?;
    let d = max_diff(&all, &seq)?;
    Ok((all, d))
}

#[test]
fn sliding_window_masks_old_keys_consistently() -> Result<()> {
    let plain = tiny(&[])?;
    let windowed = tiny(&[("llama.attention.sliding_window", Value::U32(8))])?;
    let wide = tiny(&[("llama.attention.sliding_window", Value::U32(64))])?;
    let (a, d) = batched_vs_sequential(&plain)?;
    assert!(d < 1e-4, "no window: batched vs sequential {d}");
    let (w, d) = batched_vs_sequential(&windowed)?;
    assert!(d < 1e-4, "window 8: batched vs sequential {d}");
    // Positions inside the window are unaffected, later ones see fewer keys.
    assert!(max_diff(&a.narrow(0, 0, 8)?, &w.narrow(0, 0, 8)?)? < 1e-5);
    assert!(max_diff(&a.narrow(0, 20, 20)?, &w.narrow(0, 20, 20)?)? > 1e-3);
    // A window longer than the sequence changes nothing.
    let (x, _) = batched_vs_sequential(&wide)?;
    assert!(max_diff(&a, &x)? < 1e-5);
    Ok(())
}

#[test]
fn rope_scaling_variants_change_positions_only_as_configured() -> Result<()> {
    let plain = tiny(&[])?;
    let linear = tiny(&[
        ("llama.rope.scaling.type", Value::String("linear".into())),
        ("llama.rope.scaling.factor", Value::F32(4.0)),
    ])?;
    let (a, _) = batched_vs_sequential(&plain)?;
    let (l, d) = batched_vs_sequential(&linear)?;
    assert!(d < 1e-4, "{d}");
    // Position 0 has no rotation either way; later positions differ.
    assert!(max_diff(&a.narrow(0, 0, 1)?, &l.narrow(0, 0, 1)?)? < 1e-5);
    assert!(max_diff(&a.narrow(0, 10, 30)?, &l.narrow(0, 10, 30)?)? > 1e-3);
    let cfg = LlamaConfig::from_gguf(&linear)?;
    assert_eq!(cfg.rope_scaling, Some(sapient_llama::RopeScaling::Linear { factor: 4.0 }));
    Ok(())
}

#[test]
fn wrong_shapes_are_named() -> Result<()> {
    let g = tiny(&[("llama.embedding_length", Value::U32(32))])?;
    let cfg = LlamaConfig::from_gguf(&g)?;
    let e = LlamaModel::load(&g, &cfg, &Device::Cpu, None).err().expect("shape mismatch").to_string();
    assert!(e.contains("token_embd.weight") && e.contains("[50, 64]") && e.contains("[50, 32]"), "{e}");
    Ok(())
}

/// Dense weights (the dense kernels): each sequence of a batch gets bit for bit the logits it
/// gets alone, as with quantized weights (tests/batch_identity.rs).
#[test]
fn dense_weights_give_each_sequence_of_a_batch_what_it_gets_alone() -> Result<()> {
    let g = tiny(&[])?;
    let mut m = load(&g)?;
    let prompts: [&[u32]; 3] = [&IDS[..1], &IDS[3..14], &IDS];
    let opts = KvOptions { block_size: 16, budget: KvBudget::Tokens(512), ..KvOptions::default() };
    let mut alone = Vec::new();
    for p in prompts {
        let mut kv = m.new_kv_cache(opts)?;
        let seq = kv.new_seq();
        let mut out = Vec::new();
        m.forward_batch(&mut kv, &[BatchSeq { seq, tokens: p, logits: Some(Logits::All) }], &mut out)?;
        alone.push(out);
    }
    let mut kv = m.new_kv_cache(opts)?;
    let seqs: Vec<_> = prompts.iter().map(|_| kv.new_seq()).collect();
    let batch: Vec<BatchSeq> = prompts.iter().zip(&seqs).map(|(p, &seq)| BatchSeq { seq, tokens: p, logits: Some(Logits::All) }).collect();
    let mut out = Vec::new();
    m.forward_batch(&mut kv, &batch, &mut out)?;
    let together: Vec<f32> = alone.concat();
    assert_eq!(out.len(), together.len());
    assert!(out.iter().zip(&together).all(|(a, b)| a.to_bits() == b.to_bits()), "a batch changed some sequence's logits");
    Ok(())
}

/// F16 GGUF tensors load as the values they hold: the same logits as F32 tensors holding
/// those values.
#[test]
fn f16_weights_load_as_their_values() -> Result<()> {
    let (a, _) = batched_vs_sequential(&tiny_stored(&[], Store::F32Rounded)?)?;
    let (b, _) = batched_vs_sequential(&tiny_stored(&[], Store::F16)?)?;
    let d = max_diff(&a, &b)?;
    assert!(d < 1e-5, "F16 vs F32 storage of the same values: {d}");
    Ok(())
}

/// The forward pass runs on the CPU with f32 activations; anything else is an error naming
/// what was asked for.
#[test]
fn other_activation_dtypes_are_an_error_naming_them() -> Result<()> {
    let g = tiny(&[])?;
    let cfg = LlamaConfig::from_gguf(&g)?;
    let e = match LlamaModel::load_with_dtype(&g, &cfg, &Device::Cpu, Some(64), candle_core::DType::BF16) {
        Ok(_) => anyhow::bail!("loaded with bf16 activations"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("bf16") && e.contains("cpu") && e.contains("no LLM backend"), "{e}");
    Ok(())
}
