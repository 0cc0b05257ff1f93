//! Gemma 3 270M (gemma3: sliding-window and global layers, q/k norms, post-norms, GeGLU)
//! against llama.cpp on the same GGUF: greedy continuations of raw prompts from
//! `llama-simple` (tests/data/llama/gemma3_llamacpp_greedy.json, made by
//! scripts/reference/llamacpp_greedy.sh with LLAMACPP_BOS_TEXT='<bos>' and
//! LLAMACPP_EXTRA_PROMPT_FILE=tests/data/llama/gemma3_long_prompt.txt, the first 137 lines of
//! CPython 3.11's heapq.py, 1,640 tokens: past the 512-position window of the local layers).
//! The same standard as llamacpp_greedy.rs: free-running agreement, and teacher-forced on
//! llama.cpp's tokens our arg-max may differ only at near-ties. And the batch property: a
//! sequence in a batch (chunked prefill over small scattered blocks, beside other sequences)
//! gets bit-identical logits to itself alone. Opt-in (253 MB GGUF): SAPIENT_GEMMA_TESTS=1.
//!
//! Measured (AVX-512 machine; the GELU computed exactly, where llama.cpp's CPU backend looks
//! it up in an f16 table: emulating that table made the agreement worse, 21 flips and a mean
//! of 14.7 tokens): free-running, the seven prompts agree with llama.cpp for 10, 33, 64, 27,
//! 11, 2 and 42 tokens (mean 27.0, the long prompt 42, one identical); every divergence is a
//! near-tie. Teacher-forced, our arg-max differs at 12 of 447 steps, llama.cpp's token our
//! runner-up at 11 and third at one, our margin at most 0.669 logits (Gemma's logits run
//! higher than SmolLM2's: their difference from llama.cpp's is 0.21 on average, 1.6 at most,
//! as the logits test measures). Limits: at least one prompt identical, 150 agreeing tokens
//! in all, at most 16 teacher-forced steps differing, each with llama.cpp's token among our
//! top 3 and a margin under 0.75.

use anyhow::Result;
use candle_core::Device;
use sapient_llama::{BatchSeq, KvBudget, KvOptions, LlamaModel, Logits};
use serde_json::Value;

mod common;
use common::top2;

fn enabled() -> bool {
    if std::env::var("SAPIENT_GEMMA_TESTS").ok().as_deref() == Some("1") {
        return true;
    }
    eprintln!("skipped: set SAPIENT_GEMMA_TESTS=1 (fetches the 253 MB Gemma 3 270M GGUF)");
    false
}

fn load() -> Result<(sapient_tokenizers::Tokenizer, LlamaModel)> {
    let r = sapient_hub::Hub::new()?.fetch_preset("gemma-3-270m", &mut |_| {})?;
    let g = sapient_tensor::GgufFile::open(r.file("gguf")?)?;
    let tok = sapient_tokenizers::Tokenizer::from_gguf(&g)?;
    let cfg = sapient_llama::LlamaConfig::from_gguf(&g)?;
    assert_eq!(cfg.arch, sapient_llama::Arch::Gemma3);
    let flags = cfg.sliding_window_layers.clone().unwrap_or_default();
    let global: Vec<usize> = (0..cfg.num_layers).filter(|&i| !flags[i]).collect();
    assert_eq!((cfg.sliding_window, global), (Some(512), vec![5, 11, 17]));
    let m = LlamaModel::load(&g, &cfg, &Device::Cpu, Some(2048))?;
    Ok((tok, m))
}

fn data() -> Result<Vec<(String, String)>> {
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/llama/gemma3_llamacpp_greedy.json");
    let data: Value = serde_json::from_str(&std::fs::read_to_string(file)?)?;
    Ok(data
        .as_array()
        .map(|a| a.iter().map(|c| (c["prompt"].as_str().unwrap_or("").to_string(), c["continuation"].as_str().unwrap_or("").to_string())).collect())
        .unwrap_or_default())
}

#[test]
fn gemma3_greedy_matches_llama_cpp() -> Result<()> {
    if !enabled() {
        return Ok(());
    }
    let (tok, mut m) = load()?;
    let cases = data()?;
    assert_eq!(cases.len(), 7);
    let mut full = 0;
    let mut prefixes = Vec::new();
    let (mut flips, mut steps, mut worst) = (0, 0, 0f32);
    for (prompt, want) in &cases {
        let short: String = prompt.chars().take(40).collect();
        let c = common::compare(&mut m, &tok, prompt, want, &format!("{short:?}"))?;
        match c.agreed {
            None => full += 1,
            Some(n) => prefixes.push(n),
        }
        for &(i, rank, margin) in &c.differ {
            assert!(rank <= 3, "{short:?} step {i}: llama.cpp's token is our number {rank}");
            worst = worst.max(margin);
        }
        flips += c.differ.len();
        steps += c.steps;
    }
    let agreed_total = prefixes.iter().sum::<usize>() + 64 * full;
    let mean = agreed_total as f64 / cases.len() as f64;
    eprintln!("free-running: {full} of {} prompts identical for 64 tokens, the others agree for {prefixes:?} tokens, mean {mean:.1}", cases.len());
    eprintln!("teacher-forced: our arg-max differs from llama.cpp's token at {flips} of {steps} steps, margin at most {worst:.3}");
    assert!(full >= LIMIT_IDENTICAL, "{full} prompts identical to llama.cpp for 64 tokens");
    assert!(agreed_total >= 150, "mean agreement {mean:.1} tokens");
    assert!(flips <= LIMIT_FLIPS, "{flips} of {steps} teacher-forced steps differ");
    assert!(worst < LIMIT_MARGIN, "a teacher-forced step differs by {worst:.3} logits");
    Ok(())
}

const LIMIT_IDENTICAL: usize = 1;
const LIMIT_FLIPS: usize = 16;
const LIMIT_MARGIN: f32 = 0.75;

#[test]
fn gemma3_batches_give_what_each_sequence_gets_alone() -> Result<()> {
    if !enabled() {
        return Ok(());
    }
    let (tok, mut m) = load()?;
    let cases = data()?;
    let prompts: Vec<Vec<u32>> = [&cases[6].0, &cases[0].0, &cases[1].0].iter().map(|p| tok.encode(p, true)).collect::<Result<_, _>>()?;
    assert!(prompts[0].len() > 1500);
    let steps = 4;
    // Alone: the whole prompt in one forward, then greedy steps.
    let mut alone = Vec::new();
    for p in &prompts {
        let mut kv = m.new_kv_cache(KvOptions { block_size: 64, budget: KvBudget::Tokens(2048), ..KvOptions::default() })?;
        let seq = kv.new_seq();
        let mut logits = Vec::new();
        let mut got = Vec::new();
        m.forward_batch(&mut kv, &[BatchSeq { seq, tokens: p, logits: Some(Logits::Last) }], &mut logits)?;
        for _ in 0..steps {
            got.push(logits.iter().map(|x| x.to_bits()).collect::<Vec<u32>>());
            let t = top2(&logits).0;
            m.forward_batch(&mut kv, &[BatchSeq { seq, tokens: &[t], logits: Some(Logits::Last) }], &mut logits)?;
        }
        alone.push(got);
    }
    // Together: 16-position blocks from one pool, the long prompt in chunks of 100 beside the
    // short ones, which are decoding by then.
    let mut kv = m.new_kv_cache(KvOptions { block_size: 16, budget: KvBudget::Tokens(4096), ..KvOptions::default() })?;
    let seqs: Vec<_> = prompts.iter().map(|_| kv.new_seq()).collect();
    let mut fed = [0usize; 3];
    let mut next: Vec<Option<u32>> = vec![None; 3];
    let mut got: Vec<Vec<Vec<u32>>> = vec![Vec::new(); 3];
    let mut logits = Vec::new();
    while got.iter().any(|g| g.len() < steps) {
        let mut feeds: Vec<(usize, Vec<u32>)> = Vec::new();
        for i in 0..3 {
            if got[i].len() == steps {
                continue;
            }
            if fed[i] < prompts[i].len() {
                let n = (prompts[i].len() - fed[i]).min(100);
                feeds.push((i, prompts[i][fed[i]..fed[i] + n].to_vec()));
            } else if let Some(t) = next[i] {
                feeds.push((i, vec![t]));
            }
        }
        let batch: Vec<BatchSeq> = feeds
            .iter()
            .map(|(i, t)| BatchSeq {
                seq: seqs[*i],
                tokens: t,
                logits: (fed[*i] + t.len() >= prompts[*i].len()).then_some(Logits::Last),
            })
            .collect();
        m.forward_batch(&mut kv, &batch, &mut logits)?;
        let vocab = m.config().vocab_size;
        let mut row = 0;
        for (i, t) in &feeds {
            let prefill = fed[*i] < prompts[*i].len();
            fed[*i] += if prefill { t.len() } else { 0 };
            if fed[*i] >= prompts[*i].len() {
                let l = &logits[row * vocab..(row + 1) * vocab];
                row += 1;
                got[*i].push(l.iter().map(|x| x.to_bits()).collect());
                next[*i] = Some(top2(l).0);
            }
        }
    }
    for i in 0..3 {
        assert!(got[i] == alone[i], "sequence {i}: batched logits differ from its logits alone");
    }
    Ok(())
}

/// Our logits against llama.cpp's (its library on the same GGUF, each prompt one batch:
/// tests/data/llama/gemma3_llamacpp_logits.json from scripts/reference/gemma3_llamacpp_logits.py)
/// at llama.cpp's top 10 ids of every kept position, the long prompt's positions past the
/// sliding window included. Measured: max 1.61 (1.06 past position 512), mean 0.210 over
/// 1,540 values (logits around 15-30); llama.cpp's top-1 is ours at all 115 positions where it
/// leads by more than 0.5.
#[test]
fn gemma3_logits_match_llama_cpp() -> Result<()> {
    if !enabled() {
        return Ok(());
    }
    let (_, mut m) = load()?;
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/llama/gemma3_llamacpp_logits.json");
    let data: Value = serde_json::from_str(&std::fs::read_to_string(file)?)?;
    let cases = data["cases"].as_array().cloned().unwrap_or_default();
    assert_eq!(cases.len(), 7);
    let (mut worst, mut sum, mut count, mut top1_differs, mut top1_checked) = (0f32, 0f64, 0usize, 0usize, 0usize);
    let mut worst_far = 0f32;
    for case in &cases {
        let ids: Vec<u32> = serde_json::from_value(case["ids"].clone())?;
        let positions = case["positions"].as_array().cloned().unwrap_or_default();
        m.clear_cache();
        let mut fed = 0;
        let mut case_worst = 0f32;
        for p in &positions {
            let pos = p["pos"].as_u64().unwrap_or(0) as usize;
            let top: Vec<(u32, f32)> = serde_json::from_value(p["top"].clone())?;
            let logits = m.forward(&ids[fed..=pos], Logits::Last)?.squeeze(0)?.to_vec1::<f32>()?;
            fed = pos + 1;
            for &(id, want) in &top {
                let d = (logits[id as usize] - want).abs();
                case_worst = case_worst.max(d);
                if pos >= 512 {
                    worst_far = worst_far.max(d);
                }
                sum += d as f64;
                count += 1;
            }
            // Where llama.cpp's best leads clearly, it is ours too.
            if top[0].1 - top[1].1 > 0.5 {
                top1_checked += 1;
                if top2(&logits).0 != top[0].0 {
                    top1_differs += 1;
                }
            }
        }
        eprintln!("{} tokens, {} positions: max |ours - llama.cpp| {case_worst:.3}", ids.len(), positions.len());
        worst = worst.max(case_worst);
    }
    eprintln!(
        "max |ours - llama.cpp| {worst:.3} (past position 512: {worst_far:.3}), mean {:.4} over {count}; top-1 differs at {top1_differs} of {top1_checked} positions with a margin > 0.5",
        sum / count as f64
    );
    assert!(worst < LIMIT_LOGIT_DIFF, "max |ours - llama.cpp| {worst:.3}");
    assert!(sum / (count as f64) < LIMIT_LOGIT_MEAN, "mean |ours - llama.cpp| {:.4}", sum / count as f64);
    assert_eq!(top1_differs, 0);
    Ok(())
}

const LIMIT_LOGIT_DIFF: f32 = 2.0;
const LIMIT_LOGIT_MEAN: f64 = 0.3;
