//! Synthetic LoRA adapters for SmolLM2-135M in llama.cpp's GGUF adapter format, written by
//! our GGUF writer: random `lora_a`/`lora_b` (splitmix values) for the q, k, v, output, gate,
//! up and down projections of a few layers. Shared by sapient-llama's `lora.rs` and
//! sapient-generate's `lora_smollm2.rs` (`#[path]`).

use super::splitmix::values;
use sapient_tensor::gguf::TensorData;
use sapient_tensor::{GgmlType, GgufWriter, Value};
use std::path::Path;

/// SmolLM2-135M's linear layers: GGUF name, `(out, in)`.
pub const SMOLLM2_LINEARS: [(&str, usize, usize); 7] = [
    ("attn_q", 576, 576),
    ("attn_k", 192, 576),
    ("attn_v", 192, 576),
    ("attn_output", 576, 576),
    ("ffn_gate", 1536, 576),
    ("ffn_up", 1536, 576),
    ("ffn_down", 576, 1536),
];

/// A tensor of f32 values.
pub fn f32_tensor(name: &str, shape: &[usize], v: &[f32]) -> TensorData {
    TensorData { name: name.into(), shape: shape.to_vec(), ggml_type: GgmlType::F32, data: v.iter().flat_map(|x| x.to_le_bytes()).collect() }
}

/// An adapter file with these metadata and tensors.
pub fn write(path: &Path, meta: &[(&str, Value)], tensors: Vec<TensorData>) -> anyhow::Result<()> {
    let mut w = GgufWriter::new();
    for (k, v) in meta {
        w.set(*k, v.clone());
    }
    for t in tensors {
        w.add_tensor(t);
    }
    w.write(path)?;
    Ok(())
}

/// The metadata of a llama LoRA adapter with `alpha`.
pub fn lora_meta(alpha: f32) -> Vec<(&'static str, Value)> {
    vec![
        ("general.architecture", Value::String("llama".into())),
        ("general.type", Value::String("adapter".into())),
        ("adapter.type", Value::String("lora".into())),
        ("adapter.lora.alpha", Value::F32(alpha)),
    ]
}

/// A rank-`rank` adapter on every linear layer of `layers`, its values from `seed`: `A`
/// uniform within ±sqrt(3/in) (unit variance of `x A^T` for unit inputs), `B` within ±0.07.
pub fn smollm2_adapter(path: &Path, seed: u64, layers: &[usize], rank: usize, alpha: f32) -> anyhow::Result<()> {
    let mut tensors = Vec::new();
    for (li, &layer) in layers.iter().enumerate() {
        for (ti, &(name, out, inp)) in SMOLLM2_LINEARS.iter().enumerate() {
            let index = seed * 1000 + (li * 10 + ti) as u64 * 2;
            let base = format!("blk.{layer}.{name}.weight");
            tensors.push(f32_tensor(&format!("{base}.lora_a"), &[rank, inp], &values(index, rank * inp, 0.0, (3.0 / inp as f64).sqrt())));
            tensors.push(f32_tensor(&format!("{base}.lora_b"), &[out, rank], &values(index + 1, out * rank, 0.0, 0.07)));
        }
    }
    write(path, &lora_meta(alpha), tensors)
}
