//! The forward pass on the real SmolLM2 GGUF: its batching invariance and the restricted
//! output layer (its logits against independent references: reference_logits.rs,
//! llamacpp_greedy.rs).

use anyhow::Result;
use candle_core::Device;
use sapient_llama::{LlamaModel, Logits};

fn model() -> Result<LlamaModel> {
    let r = sapient_hub::Hub::new()?.fetch_preset("smollm2-135m-instruct", &mut |_| {})?;
    Ok(sapient_llama::load(r.file("gguf")?, &Device::Cpu, Some(512))?)
}

fn rows(t: candle_core::Tensor) -> Result<Vec<Vec<f32>>> {
    Ok(t.to_vec2::<f32>()?)
}

/// A batch of new tokens gives bit-identical logits to the same tokens one at a time
/// (speculative verification reproduces plain decoding exactly), and with the AVX-512
/// kernels a prefill-sized batch does too.
#[test]
fn batch_equals_one_at_a_time() -> Result<()> {
    let mut m = model()?;
    let prompt: Vec<u32> = vec![1, 504, 3458, 282, 4649, 314];
    m.forward(&prompt, Logits::Last)?;
    let next: Vec<u32> = vec![2215, 28, 1142, 7, 19, 4003, 17];
    let batched = rows(m.forward(&next, Logits::All)?)?;
    m.truncate_cache(prompt.len());
    for (i, &t) in next.iter().enumerate() {
        let one = rows(m.forward(&[t], Logits::Last)?)?.remove(0);
        assert!(one == batched[i], "position {i}: batched logits differ from single-token logits");
    }
    // And through a cache that has grown past its first allocation.
    m.clear_cache();
    let long: Vec<u32> = (0..300u32).map(|i| 50 + i * 13 % 3000).collect();
    m.forward(&long, Logits::Last)?;
    let batched = rows(m.forward(&next[..3], Logits::All)?)?;
    m.truncate_cache(long.len());
    for (i, &t) in next[..3].iter().enumerate() {
        assert!(rows(m.forward(&[t], Logits::Last)?)?.remove(0) == batched[i], "long context, position {i}");
    }
    // A prefill-sized batch (70 tokens, after a 20-token prefix) against the same tokens in
    // pieces of 1, 5 and the rest: where every batch size runs on the quantized kernels
    // (AVX-512), the whole forward is row-invariant, so a reused prefix gives the same
    // logits as a fresh prompt.
    if sapient_tensor::weights::dense_prefill_rows() > 70 {
        let toks: Vec<u32> = (0..90u32).map(|i| 77 + i * 29 % 5000).collect();
        m.clear_cache();
        m.forward(&toks[..20], Logits::Last)?;
        let whole = rows(m.forward(&toks[20..], Logits::All)?)?;
        m.truncate_cache(20);
        let mut pieces = rows(m.forward(&toks[20..21], Logits::All)?)?;
        pieces.extend(rows(m.forward(&toks[21..26], Logits::All)?)?);
        pieces.extend(rows(m.forward(&toks[26..], Logits::All)?)?);
        for (i, (a, b)) in whole.iter().zip(&pieces).enumerate() {
            assert!(a == b, "prefill batch vs pieces, position {i}");
        }
    }
    Ok(())
}


/// A restricted output layer (speculative drafts) gives exactly the full layer's logits for
/// the kept ids and `-inf` for the others, and lifting it brings every logit back.
#[test]
fn restricted_logits_equal_the_full_ones_where_kept() -> Result<()> {
    let mut m = model()?;
    let prompt: Vec<u32> = (0..12u32).map(|i| 100 + i * 37 % 4000).collect();
    let (first, extra) = (3000usize, [40000u32, 2, 49151]);
    let mut full = Vec::new();
    let mut part = Vec::new();
    m.forward_into(&prompt, Logits::All, &mut full)?;
    m.clear_cache();
    assert!(m.restrict_logits(Some((first, &extra)))?);
    m.forward_into(&prompt, Logits::All, &mut part)?;
    assert_eq!(full.len(), part.len());
    let vocab = m.config().vocab_size;
    for (r, (f, p)) in full.chunks_exact(vocab).zip(part.chunks_exact(vocab)).enumerate() {
        for id in 0..vocab {
            if id < first || extra.contains(&(id as u32)) {
                assert_eq!(f[id].to_bits(), p[id].to_bits(), "row {r} id {id}");
            } else {
                assert_eq!(p[id], f32::NEG_INFINITY, "row {r} id {id}");
            }
        }
    }
    m.clear_cache();
    assert!(!m.restrict_logits(Some((vocab, &[])))?, "a limit past the vocabulary restricts nothing");
    // No head at all: only the listed ids get logits (no panic on the empty product).
    assert!(m.restrict_logits(Some((0, &extra)))?);
    m.forward_into(&prompt, Logits::Last, &mut part)?;
    let last = &full[(prompt.len() - 1) * vocab..];
    for id in 0..vocab {
        let want = if extra.contains(&(id as u32)) { last[id] } else { f32::NEG_INFINITY };
        assert_eq!(part[id].to_bits(), want.to_bits(), "id {id} with an empty head");
    }
    m.clear_cache();
    assert!(!m.restrict_logits(None)?);
    m.forward_into(&prompt, Logits::All, &mut part)?;
    assert_eq!(full, part);
    Ok(())
}
