//! Plumbing on a tiny random-weight model written as GGUF (shapes, masks, RoPE variants):
//! not model behaviour, which the SmolLM2 tests cover.

use anyhow::Result;
use candle_core::{Device, Tensor};
use sapient_llama::{LlamaConfig, LlamaModel, Logits};
use sapient_tensor::gguf::{GgmlType, GgufFile, GgufWriter, TensorData, Value};

const H: usize = 64;
const HEADS: usize = 4;
const KV: usize = 2;
const FF: usize = 96;
const VOCAB: usize = 50;
const LAYERS: usize = 2;

fn f32_tensor(name: &str, shape: &[usize], seed: u64) -> TensorData {
    let n: usize = shape.iter().product();
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let data: Vec<u8> = (0..n)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let v = ((x >> 11) as f64 / (1u64 << 53) as f64 - 0.5) as f32 * 0.4;
            v.to_le_bytes()
        })
        .collect();
    TensorData { name: name.into(), shape: shape.to_vec(), ggml_type: GgmlType::F32, data }
}

fn tiny(extra: &[(&str, Value)]) -> Result<GgufFile> {
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
        f32_tensor(name, shape, seed)
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
