//! Greedy decoding against llama.cpp's greedy output on the same GGUF and prompts
//! (tests/data/llama/llamacpp_greedy.json, made by scripts/reference/llamacpp_greedy.sh:
//! `llama-simple`, CPU flash attention on as llama.cpp picks by default).
//!
//! Both quantize activations to 8 bits per row the same way and keep the KV cache in f16,
//! but sum in different orders (and llama.cpp's CPU flash attention rounds Q to f16 and
//! accumulates V in f16), so at a near-tie the arg-max can flip and the texts part ways from
//! there. Token-for-token equality over 64 free-running tokens is not a property llama.cpp
//! has with itself: the same binary with `-fa off` (scripts/reference/llamacpp_greedy.sh with
//! LLAMACPP_FA=off) agrees with its default flash-attention output for only 22, 10, 27, 25, 8
//! and 8 tokens (mean 16.7, no prompt identical), every divergence a near-tie (its own top-2
//! gap 0.03-0.15 logits, read from llama-simple's loop made to print its logits); its thread
//! count (1, 2, 4) changes nothing.
//!
//! So the test checks two things, measured at 31ecac6 (AVX2 and AVX-512 kernels give identical
//! logits there; figures for the portable kernels, SAPIENT_NO_AVX2, in brackets).
//! (1) Free-running: how many tokens agree before the first divergence:
//! 36, 6, 27, 64, 8, 19 (mean 26.7, one prompt identical) [16, 10, 24, 23, 8, 8: mean 14.8].
//! Every divergence is at a near-tie: our top-2 gap 0.01-0.22 logits, llama.cpp's pick our
//! runner-up. One flipped near-tie moves these a lot (at 90f099b, before the AVX-512 kernels
//! reduced in the AVX2 order, they were 36, 6, 27, 26, 42, 19). Against the `-fa off` reference
//! they are 22, 6, 28, 25, 19, 8 (mean 18.0), so the flash-attention run stays the reference.
//! (2) Teacher-forced on llama.cpp's own tokens (its text re-tokenizes to exactly the 64 ids it
//! generated): at each of the 384 steps, is our arg-max llama.cpp's token? It differs at 12
//! steps, llama.cpp's token our runner-up at 11 and third at one, our margin at most 0.339
//! logits [21 steps, at most 0.191] (`-fa off` reference: 19 steps, at most 0.497).
//! With the lane kernels (`kernels::lanes`: Q4_0/Q4_1 summed exactly per block, then one fused
//! multiply-add per block; AVX-512 BITALG machines) the same run gives 16, 37, 25, 8, 8, 64
//! (mean 26.3, one prompt identical) and 15 teacher-forced steps, our margin at most 0.432:
//! the same near-ties flipping the other way, within llama.cpp's own `-fa off` spread.
//! With the softmax's exponentials computed by `kernels::exp_approx` and summed in 16 lanes
//! (`kernels::softmax_unnormalized`, shared by every attention path) instead of libm's `expf`
//! summed in order: 10, 6, 24, 8, 8, 64 (mean 20.0, one prompt identical) and 15
//! teacher-forced steps, our margin at most 0.202 (closer to llama.cpp where they differ).
//! With attention scores summed key by key as a chain of fused multiply-adds over the head's
//! components (keys transposed in the cache, 16 per vector; `kernels::scores_chunks`) instead
//! of 16 lanes reduced by a tree: 22, 10, 24, 28, 8, 8 (mean 16.7, none identical: what
//! llama.cpp's `-fa off` run gives against its own default, prompt for prompt within three
//! tokens) and 14 teacher-forced steps, our margin at most 0.395.
//! Limits, covering these arithmetics: every prompt agrees for at least 6 tokens, a mean
//! agreement of at least 16 tokens (96 in all: llama.cpp agrees with its own `-fa off` run for
//! a mean of 16.7); at most 16 teacher-forced steps differ, each by less than 0.45 logits.
//! (Whether some prompt stays identical for all 64 tokens depends on a single near-tie, so it
//! is reported, not required.)

use anyhow::Result;
use candle_core::Device;
use serde_json::Value;

mod common;

#[test]
fn greedy_matches_llama_cpp() -> Result<()> {
    let r = sapient_hub::Hub::new()?.fetch_preset("smollm2-135m-instruct", &mut |_| {})?;
    let path = r.file("gguf")?;
    let g = sapient_tensor::GgufFile::open(path)?;
    let tok = sapient_tokenizers::Tokenizer::from_gguf(&g)?;
    let cfg = sapient_llama::LlamaConfig::from_gguf(&g)?;
    let mut m = sapient_llama::LlamaModel::load(&g, &cfg, &Device::Cpu, Some(256))?;
    // SAPIENT_LLAMACPP_GREEDY_JSON: compare with another reference run (figures above are for the committed one).
    let file = std::env::var_os("SAPIENT_LLAMACPP_GREEDY_JSON").map(std::path::PathBuf::from).unwrap_or_else(|| {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/llama/llamacpp_greedy.json")
    });
    let data: Value = serde_json::from_str(&std::fs::read_to_string(file)?)?;
    let mut full = 0;
    let mut prefixes = Vec::new();
    let (mut flips, mut steps, mut worst) = (0, 0, 0f32);
    let cases = data.as_array().unwrap();
    for case in cases {
        let prompt = case["prompt"].as_str().unwrap();
        let want = case["continuation"].as_str().unwrap();
        let c = common::compare(&mut m, &tok, prompt, want, &format!("{prompt:?}"))?;
        match c.agreed {
            None => full += 1,
            Some(n) => {
                assert!(n >= 6, "{prompt:?}: only {n} tokens agree");
                prefixes.push(n);
            }
        }
        worst = c.differ.iter().fold(worst, |w, d| w.max(d.2));
        flips += c.differ.len();
        steps += c.steps;
    }
    let mean = (prefixes.iter().sum::<usize>() + 64 * full) as f64 / cases.len() as f64;
    eprintln!("free-running: {full} of {} prompts identical for 64 tokens, the others agree for {prefixes:?} tokens, mean {mean:.1}", cases.len());
    eprintln!("teacher-forced: our arg-max differs from llama.cpp's token at {flips} of {steps} steps, margin at most {worst:.3}");
    assert!(prefixes.iter().sum::<usize>() + 64 * full >= 96, "mean agreement {mean:.1} tokens");
    assert!(flips <= 16, "{flips} of {steps} teacher-forced steps differ");
    assert!(worst < 0.45, "a teacher-forced step differs by {worst:.3} logits");
    Ok(())
}
