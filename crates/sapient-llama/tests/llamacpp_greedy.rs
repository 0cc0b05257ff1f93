//! Greedy decoding against llama.cpp's greedy output on the same GGUF and prompts
//! (tests/data/llama/llamacpp_greedy.json, made by scripts/reference/llamacpp_greedy.sh).
//!
//! Both quantize activations to 8 bits per row the same way and keep the KV cache in f16,
//! but sum in different orders (and llama.cpp's CPU flash attention accumulates V in f16),
//! so at a near-tie the arg-max can flip and the texts part ways from there. Measured with
//! our kernels (sapient-tensor `kernels`, the plain-buffer CPU forward): 1 of 6 prompts is
//! identical for 64 tokens and the others agree for 36, 6, 27, 8 and 19 tokens (mean 26.7;
//! with an f32 KV cache the mean was 12.2, with candle's kernels 17). Checked against the
//! exact float64 numpy reference (scripts/reference/llama_numpy.py): at such near-ties
//! neither side is "the" exact one; both are within 8-bit activation noise. This test pins
//! the state (no regression below it): every prompt agrees for at least its first 5 tokens,
//! at least one prompt is identical, and the mean agreement is at least 20 tokens.

use anyhow::Result;
use candle_core::Device;
use sapient_llama::Logits;
use serde_json::Value;

#[test]
fn greedy_matches_llama_cpp() -> Result<()> {
    let r = sapient_hub::Hub::new()?.fetch_preset("smollm2-135m-instruct", &mut |_| {})?;
    let path = r.file("gguf")?;
    let g = sapient_tensor::GgufFile::open(path)?;
    let tok = sapient_tokenizers::Tokenizer::from_gguf(&g)?;
    let cfg = sapient_llama::LlamaConfig::from_gguf(&g)?;
    let mut m = sapient_llama::LlamaModel::load(&g, &cfg, &Device::Cpu, Some(256))?;
    let data: Value = serde_json::from_str(&std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/llama/llamacpp_greedy.json"),
    )?)?;
    let mut full = 0;
    let mut prefixes = Vec::new();
    let cases = data.as_array().unwrap();
    for case in cases {
        let prompt = case["prompt"].as_str().unwrap();
        let want = case["continuation"].as_str().unwrap();
        m.clear_cache();
        let ids = tok.encode(prompt, true)?;
        let mut logits = m.forward(&ids, Logits::Last)?;
        let mut out = Vec::new();
        let mut agreed = None;
        for i in 0..64 {
            let next = logits.squeeze(0)?.argmax(0)?.to_scalar::<u32>()?;
            if tok.eos_token_ids().contains(&next) {
                break;
            }
            out.push(next);
            let text = tok.decode(&out, false)?;
            if agreed.is_none() && !want.starts_with(text.trim_end_matches('\u{FFFD}')) {
                agreed = Some(i);
            }
            logits = m.forward(&[next], Logits::Last)?;
        }
        let text = tok.decode(&out, false)?;
        match agreed {
            None => {
                assert_eq!(text, want, "{prompt:?}");
                full += 1;
            }
            Some(n) => {
                eprintln!("{prompt:?}: agrees for {n} tokens, then\n  ours:      {:?}\n  llama.cpp: {:?}", text, want);
                assert!(n >= 5, "{prompt:?}: only {n} tokens agree");
                prefixes.push(n);
            }
        }
    }
    eprintln!("{full} of {} prompts identical to llama.cpp for 64 tokens", cases.len());
    eprintln!("diverging prompts agree for {prefixes:?} tokens");
    let mean = (prefixes.iter().sum::<usize>() + 64 * full) as f64 / cases.len() as f64;
    eprintln!("mean agreement {mean:.1} tokens");
    assert!(mean >= 20.0, "mean agreement {mean:.1} tokens");
    assert!(full >= 1, "no prompt identical to llama.cpp for 64 tokens");
    Ok(())
}
