//! Our logits against an independent numpy implementation (scripts/reference/llama_numpy.py,
//! float64 on the dequantized GGUF weights), and KV-cache behaviour, on the real SmolLM2.
//!
//! Tolerance: our quantized matmuls quantize activations to 8 bits per block as llama.cpp
//! does (Q8_1 for Q4_1 weights, Q8_0 for the Q8_0 output head), and that noise accumulates
//! over 30 layers: measured max |ours - exact| over all positions is up to 1.65 (0.57 at the
//! last position of the short prompt, 1.0 on the 37-token one; logits span ~40). With every
//! weight dequantized to f32 it is 0.35, all of it from the Q8_0 head, and batched and
//! token-by-token forwards then agree to 0.01. With quantized weights the two orders
//! quantize activations differently and differ by up to 0.9, both equally far from exact.
//! We allow 2.0 absolute against the reference and 1.25 between the two orders, require 8 of
//! the reference's top 10, and its top-1 wherever its margin over the runner-up exceeds 1.0.

use anyhow::Result;
use candle_core::Device;
use sapient_llama::{Error, KvDtype, LlamaModel, Logits};
use serde_json::Value;

fn model(max: usize) -> Result<LlamaModel> {
    let r = sapient_hub::Hub::new()?.fetch_preset("smollm2-135m-instruct", &mut |_| {})?;
    Ok(sapient_llama::load(r.file("gguf")?, &Device::Cpu, Some(max))?)
}

fn reference(name: &str) -> Result<Value> {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/llama").join(name);
    Ok(serde_json::from_str(&std::fs::read_to_string(p)?)?)
}

fn ids_of(v: &Value, key: &str) -> Vec<u32> {
    v[key].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}
fn floats(v: &Value, key: &str) -> Vec<f32> {
    v[key].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

fn check(name: &str) -> Result<()> {
    check_with(name, KvDtype::F16)
}

fn check_with(name: &str, dtype: KvDtype) -> Result<()> {
    let r = reference(name)?;
    let ids = ids_of(&r, "ids");
    let mut m = model(256)?;
    m.set_kv_dtype(dtype)?;
    let all = m.forward(&ids, Logits::All)?.to_vec2::<f32>()?;
    let last = &all[ids.len() - 1];
    let (probe, want_last, want_5) = (ids_of(&r, "probe_ids"), floats(&r, "probe_logits_last"), floats(&r, "probe_logits_pos5"));
    let mut worst = 0f32;
    for (i, &t) in probe.iter().enumerate() {
        worst = worst.max((last[t as usize] - want_last[i]).abs());
        worst = worst.max((all[5][t as usize] - want_5[i]).abs());
    }
    let (top_ids, top_logits) = (ids_of(&r, "top50_ids"), floats(&r, "top50_logits"));
    for (i, &t) in top_ids.iter().enumerate().take(20) {
        worst = worst.max((last[t as usize] - top_logits[i]).abs());
    }
    assert!(worst < 2.0, "{name}: max |ours - reference| = {worst}");
    let mut ours_sorted: Vec<usize> = (0..last.len()).collect();
    ours_sorted.sort_by(|&a, &b| last[b].total_cmp(&last[a]));
    let overlap = ours_sorted[..10].iter().filter(|&&t| top_ids[..10].contains(&(t as u32))).count();
    assert!(overlap >= 8, "{name}: top-10 overlap {overlap}");
    if top_logits[0] - top_logits[1] > 1.0 {
        assert_eq!(ours_sorted[0] as u32, top_ids[0], "{name}: top-1");
    }
    eprintln!("{name} ({dtype} cache): max abs diff {worst:.3}, top-10 overlap {overlap}/10");
    Ok(())
}

#[test]
fn logits_match_numpy_reference() -> Result<()> {
    check("smollm2_logits_paris.json")?;
    check("smollm2_logits_system.json")
}

/// The 8-bit KV cache stays within the same tolerances of the exact reference.
#[test]
fn logits_match_numpy_reference_with_a_q8_0_cache() -> Result<()> {
    check_with("smollm2_logits_paris.json", KvDtype::Q8_0)?;
    check_with("smollm2_logits_system.json", KvDtype::Q8_0)
}

fn argmax(v: &[f32]) -> usize {
    (0..v.len()).max_by(|&a, &b| v[a].total_cmp(&v[b])).unwrap()
}

#[test]
fn kv_cache_consistency() -> Result<()> {
    let ids: Vec<u32> = ids_of(&reference("smollm2_logits_paris.json")?, "ids");
    let mut m = model(64)?;
    let batched = m.forward(&ids, Logits::All)?.to_vec2::<f32>()?;
    let last = m.forward(&[504], Logits::Last)?.to_vec2::<f32>()?;
    assert_eq!(m.cache_len(), ids.len() + 1);
    // Token by token gives the same logits (within accumulation-order noise).
    m.clear_cache();
    for (i, &t) in ids.iter().enumerate() {
        let l = m.forward(&[t], Logits::Last)?.to_vec2::<f32>()?;
        let d = l[0].iter().zip(&batched[i]).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(d < 1.25, "position {i}: {d}");
    }
    // Logits::Last equals the last row of Logits::All.
    m.clear_cache();
    let l = m.forward(&ids, Logits::Last)?.to_vec2::<f32>()?;
    assert_eq!(l.len(), 1);
    let d = l[0].iter().zip(&batched[ids.len() - 1]).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(d < 1e-4, "{d}");
    // Truncate and re-feed: the same as never having gone further.
    m.truncate_cache(10);
    assert_eq!(m.cache_len(), 10);
    let rest = m.forward(&ids[10..], Logits::All)?.to_vec2::<f32>()?;
    for (i, row) in rest.iter().enumerate() {
        let d = row.iter().zip(&batched[10 + i]).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(d < 1.25, "after truncate, position {}: {d}", 10 + i);
    }
    let again = m.forward(&[504], Logits::Last)?.to_vec2::<f32>()?;
    assert_eq!(argmax(&again[0]), argmax(&last[0]));
    Ok(())
}

#[test]
fn bad_inputs_are_errors() -> Result<()> {
    let mut m = model(16)?;
    match m.forward(&[1; 17], Logits::Last) {
        Err(Error::ContextOverflow { needed: 17, max: 16 }) => {}
        other => panic!("expected ContextOverflow, got {:?}", other.map(|t| t.dims().to_vec())),
    }
    assert!(matches!(m.forward(&[49_152], Logits::Last), Err(Error::TokenOutOfRange { .. })));
    assert!(matches!(m.forward(&[], Logits::Last), Err(Error::EmptyInput)));
    // Still usable after errors.
    assert_eq!(m.forward(&[1, 2], Logits::Last)?.dims(), &[1, 49_152]);
    // Unknown architecture.
    let mut w = sapient_tensor::GgufWriter::new();
    w.set("general.architecture", sapient_tensor::Value::String("mamba9".into()));
    let g = sapient_tensor::GgufFile::from_bytes("m.gguf", w.to_bytes())?;
    let e = sapient_llama::LlamaConfig::from_gguf(&g).unwrap_err().to_string();
    assert!(e.contains("mamba9") && e.contains("m.gguf"), "{e}");
    Ok(())
}
