//! Shared by `kv_q8_accuracy.rs` (the kernels this CPU has) and `kv_q8_accuracy_avx2.rs`
//! (AVX-512 switched off): the 8-bit KV cache against the f16 one on the real SmolLM2-135M (Q4_1): greedy
//! continuations, and the logits of every step with the same tokens fed to both (teacher
//! forcing, so one early divergence does not hide how close later steps are).
//!
//! Measured (AVX-512; five prompts, one of 400 tokens, 64 steps each): the largest
//! |q8 - f16| of a step's logits is about 0.7 to 0.9 at the first step and up to 2.3 over
//! all steps, 0.97 on average (logits span ~40; this model's own 8-bit activations put it
//! 0.7 to 1.2 from an exact f64 forward, see `reference_logits.rs`); top-1 is the same on 311
//! of 320 steps; greedy continuations agree for 14, 57, 26, 13 and 64 tokens, parting where
//! the f16 cache's choice led by 0.02 to 0.3. We require: per-step max under 3.0 and its
//! mean under 1.25, top-1 agreement on at least 95% of the steps, every greedy
//! continuation's first 2 tokens the same and at least two of five agreeing for 16, and
//! where one parts, the f16 cache's choice ahead by under 0.75 (a near-tie).

use anyhow::Result;
use candle_core::Device;
use sapient_llama::{BatchSeq, KvBudget, KvDtype, KvOptions, LlamaModel, Logits};

const STEPS: usize = 64;

fn argmax(l: &[f32]) -> u32 {
    l.iter().enumerate().fold(0, |b, (i, x)| if *x > l[b] { i } else { b }) as u32
}

/// Feeds `prompt`, then `forced` tokens one at a time (or, where `forced` runs out, the
/// greedy choice), `STEPS` steps: the tokens chosen and the logits of every step.
fn run(model: &mut LlamaModel, dtype: KvDtype, prompt: &[u32], forced: Option<&[u32]>) -> Result<(Vec<u32>, Vec<Vec<f32>>)> {
    let mut kv = model.new_kv_cache(KvOptions { block_size: 32, budget: KvBudget::Tokens(1024), dtype })?;
    let seq = kv.new_seq();
    let mut logits = Vec::new();
    model.forward_batch(&mut kv, &[BatchSeq { seq, tokens: prompt, logits: Some(Logits::Last) }], &mut logits)?;
    let (mut toks, mut all) = (Vec::new(), Vec::new());
    for s in 0..STEPS {
        let t = forced.and_then(|f| f.get(s).copied()).unwrap_or_else(|| argmax(&logits));
        all.push(logits.clone());
        toks.push(t);
        model.forward_batch(&mut kv, &[BatchSeq { seq, tokens: &[t], logits: Some(Logits::Last) }], &mut logits)?;
    }
    Ok((toks, all))
}

/// Loads SmolLM2 with the kernels as configured in this process and checks the 8-bit cache
/// against the f16 one as this module's header says.
pub fn q8_0_cache_stays_close_to_f16() -> Result<()> {
    let r = sapient_hub::Hub::new()?.fetch_preset("smollm2-135m-instruct", &mut |_| {})?;
    let g = sapient_tensor::GgufFile::open(r.file("gguf")?)?;
    let tok = sapient_tokenizers::Tokenizer::from_gguf(&g)?;
    let mut model = sapient_llama::load(r.file("gguf")?, &Device::Cpu, Some(1024))?;
    let texts = [
        "The capital of France is",
        "def fibonacci(n):\n    if n < 2:\n        return n\n",
        "Once upon a time, in a small village at the edge of a great forest, there lived an old woodcutter and his three daughters. Every morning he",
        "In 1969, the Apollo 11 mission landed the first humans on the Moon. The astronauts were",
    ];
    let mut prompts: Vec<Vec<u32>> = texts.iter().map(|t| Ok(tok.encode(t, true)?)).collect::<Result<_>>()?;
    // A long one: attention over hundreds of cached positions.
    let mut long = Vec::new();
    while long.len() < 400 {
        long.extend(prompts.concat());
    }
    long.truncate(400);
    prompts.push(long);

    let (mut steps, mut top1, mut worst, mut sum_max, mut long_agree) = (0usize, 0usize, 0f32, 0f32, 0usize);
    for (i, p) in prompts.iter().enumerate() {
        let (want, ref_logits) = run(&mut model, KvDtype::F16, p, None)?;
        let (_, q8_logits) = run(&mut model, KvDtype::Q8_0, p, Some(&want))?;
        let (free, _) = run(&mut model, KvDtype::Q8_0, p, None)?;
        let agree = want.iter().zip(&free).take_while(|(a, b)| a == b).count();
        let mut prompt_worst = 0f32;
        for (a, b) in ref_logits.iter().zip(&q8_logits) {
            let d = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
            prompt_worst = prompt_worst.max(d);
            sum_max += d;
            steps += 1;
            top1 += usize::from(argmax(a) == argmax(b));
        }
        worst = worst.max(prompt_worst);
        // Where the greedy continuations part, the f16 cache's choice led the 8-bit one's by
        // little (the contexts are the same up to there).
        let margin = (agree < STEPS).then(|| ref_logits[agree][want[agree] as usize] - ref_logits[agree][free[agree] as usize]);
        eprintln!("prompt {i} ({} tokens): greedy agrees for {agree}/{STEPS} tokens (f16 margin where they part: {margin:?}), max |q8 - f16| {prompt_worst:.3}", p.len());
        assert!(agree >= 2, "prompt {i}: the q8_0 cache's greedy continuation departs after {agree} tokens");
        assert!(margin.is_none_or(|m| m < 0.75), "prompt {i}: parted at token {agree} where f16 led by {margin:?}");
        long_agree += usize::from(agree >= 16);
    }
    let mean = sum_max / steps as f32;
    eprintln!("{steps} steps: top-1 agrees on {top1}, max |q8 - f16| {worst:.3}, mean of the per-step max {mean:.3}");
    assert!(worst < 3.0, "max |q8 - f16| = {worst}");
    assert!(mean < 1.25, "mean per-step max |q8 - f16| = {mean}");
    assert!(long_agree >= 2, "only {long_agree} greedy continuations agree for 16 tokens");
    assert!(top1 * 100 >= steps * 95, "top-1 agrees on {top1} of {steps} steps");
    Ok(())
}
