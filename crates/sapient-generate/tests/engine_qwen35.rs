//! The Engine on a hybrid model (the synthetic Qwen3.5 of sapient-llama's tests: Gated
//! DeltaNet layers with per-sequence recurrent state beside the paged KV cache): every
//! sequence of a batch of 8 mixed-length prompts, half joining mid-way, gives exactly the
//! tokens it gives alone; a budget that forces preemption (which frees a sequence's state and
//! recomputes it) completes every sequence with the same tokens; the prefix cache gives a
//! second request the blocks and a snapshot of the state, and the answer a fresh prefill gives.

mod common;
use common::wait_idle;
#[path = "../../sapient-llama/tests/common/qwen35.rs"]
mod qwen35;

use anyhow::Result;
use sapient_generate::{Engine, EngineOptions, FinishReason, Generation, GenerationConfig, KvBudget, KvDtype, KvOptions, Pipeline, PipelineOptions, SamplerConfig};
use std::time::{Duration, Instant};

/// The synthetic model (its file lives as long as the first value) and its pipeline.
fn setup() -> Result<(qwen35::Synthetic, Pipeline)> {
    let file = qwen35::Synthetic::build(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")))?;
    let path = file.path().to_str().ok_or_else(|| anyhow::anyhow!("path"))?;
    let p = Pipeline::load(path, PipelineOptions { max_seq_len: Some(512), ..Default::default() }, |_| {})?;
    Ok((file, p))
}

/// Eight prompts of 3 to about 180 tokens.
fn prompts(p: &Pipeline) -> Result<Vec<Vec<u32>>> {
    let texts = [
        "Hi there",
        "The quick brown fox jumps over the lazy dog.",
        &"A long prompt that goes on for a while, so that it is cut into several prefill chunks. ".repeat(9),
        "What is the capital of France?",
        "fn main() { println!(\"hello\"); }",
        &"Numbers: 1 2 3 4 5 6 7 8 9 10 11 12. ".repeat(5),
        "Translate 'good morning' into Spanish.",
        "Write a haiku about the sea, then explain it in one sentence.",
    ];
    Ok(texts.iter().map(|t| p.tokenizer().encode(t, false)).collect::<Result<_, _>>()?)
}

fn opts(kv_tokens: usize) -> EngineOptions {
    EngineOptions { kv: KvOptions { block_size: 16, budget: KvBudget::Tokens(kv_tokens), dtype: KvDtype::F16 }, ..Default::default() }
}

fn alone(p: &Pipeline, prompts: &[Vec<u32>], cfg: impl Fn(usize) -> GenerationConfig) -> Result<Vec<Generation>> {
    let e = Engine::new(p, opts(4096))?;
    Ok(prompts.iter().enumerate().map(|(i, q)| e.submit(q.clone(), cfg(i))?.wait()).collect::<Result<_, _>>()?)
}

/// The first `first` prompts, then the rest once tokens are being generated.
fn submit_staggered(e: &Engine, qs: &[Vec<u32>], first: usize, cfg: impl Fn(usize) -> GenerationConfig) -> Result<Vec<(usize, sapient_generate::RequestHandle)>> {
    let mut handles: Vec<_> = qs.iter().take(first).enumerate().map(|(i, q)| Ok((i, e.submit(q.clone(), cfg(i))?))).collect::<Result<_>>()?;
    let t = Instant::now();
    while e.metrics().generated_tokens < 4 {
        anyhow::ensure!(t.elapsed() < Duration::from_secs(30), "no token generated: {:?}", e.metrics());
        std::thread::sleep(Duration::from_millis(1));
    }
    for (i, q) in qs.iter().enumerate().skip(first) {
        handles.push((i, e.submit(q.clone(), cfg(i))?));
    }
    Ok(handles)
}

#[test]
fn hybrid_requests_give_what_they_give_alone() -> Result<()> {
    let (_file, p) = setup()?;
    let qs = prompts(&p)?;
    // Greedy, and every third sampled with its own seed.
    let cfg = |i: usize| {
        let c = GenerationConfig { ignore_eos: true, ..GenerationConfig::default().max_tokens(20) };
        if i % 3 == 2 {
            c.sampling(SamplerConfig { temperature: 0.8, top_p: Some(0.9), seed: Some(i as u64), ..Default::default() })
        } else {
            c
        }
    };
    let alone = alone(&p, &qs, cfg)?;
    // Small prompt chunks and steps: prompts are split and mixed with decode rows.
    let e = Engine::new(&p, EngineOptions { prefill_chunk: 8, max_step_tokens: 24, ..opts(4096) })?;
    // The rest join once the first ones decode.
    let handles = submit_staggered(&e, &qs, 4, cfg)?;
    for (i, h) in handles {
        let g = h.wait()?;
        assert_eq!(g.tokens, alone[i].tokens, "request {i} ({} prompt tokens): batched vs alone", qs[i].len());
        assert_eq!(g.finish, FinishReason::MaxTokens);
    }
    let m = e.metrics();
    assert!(m.finished == 8 && m.cached_prompt_tokens == 0, "{m:?}");
    wait_idle(&e)?;
    Ok(())
}

#[test]
fn hybrid_budget_holds_through_preemption() -> Result<()> {
    let (_file, p) = setup()?;
    let qs = prompts(&p)?;
    let cfg = |_| GenerationConfig { ignore_eos: true, ..GenerationConfig::default().max_tokens(40) };
    let alone = alone(&p, &qs, cfg)?;
    // Room for about three of these sequences at a time, each with its recurrent state (which
    // takes blocks of the same budget).
    let state = {
        let e = Engine::new(&p, opts(4096))?;
        e.submit(qs[0].clone(), GenerationConfig::default().max_tokens(1))?.wait()?;
        // The engine publishes its cache's figures after the step that answered.
        let t = Instant::now();
        while e.metrics().kv.total_blocks == 0 {
            anyhow::ensure!(t.elapsed() < Duration::from_secs(10), "no KV figures published");
            std::thread::sleep(Duration::from_millis(5));
        }
        e.metrics().kv.state_blocks * 16
    };
    assert!(state > 0, "a hybrid's state takes blocks of the budget");
    let longest = qs.iter().map(|q| q.len() + 40).max().unwrap_or(0);
    let budget = 3 * (longest + state) + 16;
    let e = Engine::new(&p, EngineOptions { prefix_cache: false, ..opts(budget) })?;
    let handles: Vec<_> = qs.iter().enumerate().map(|(i, q)| e.submit(q.clone(), cfg(i))).collect::<Result<_, _>>()?;
    for (i, h) in handles.into_iter().enumerate() {
        assert_eq!(h.wait()?.tokens, alone[i].tokens, "request {i} under preemption");
    }
    let m = e.metrics();
    assert!(m.preemptions > 0 && m.finished == 8, "admission alone should not be enough here: {m:?}");
    assert!(m.kv.total_blocks * 16 <= budget + 16, "{m:?}");
    wait_idle(&e)?;
    Ok(())
}

/// The prefix cache keeps, beside a hybrid's blocks, its recurrent state where a prompt chunk
/// ends on a block boundary: a second request sharing a long system prompt takes the blocks
/// and the state up to the last such point inside the shared part, and answers what a fresh
/// prefill answers.
#[test]
fn hybrid_prefix_cache_reuses_the_state_snapshot() -> Result<()> {
    let (_file, p) = setup()?;
    let tok = p.tokenizer();
    let system = "You are a meticulous assistant for a hardware store. ".repeat(8);
    let ask = |q: &str| tok.encode(&format!("{system}{q}"), false);
    let cfg = GenerationConfig::default().max_tokens(8);
    let chunked = |prefix_cache| EngineOptions { prefill_chunk: 32, prefix_cache, ..opts(4096) };
    let e = Engine::new(&p, chunked(true))?;
    let a = e.submit(ask("Do you sell hammers?")?, cfg.clone())?.wait()?;
    let b = e.submit(ask("Where are the nails?")?, cfg.clone())?.wait()?;
    let (pa, pb) = (ask("Do you sell hammers?")?, ask("Where are the nails?")?);
    assert_eq!(a.stats.reused_prompt_tokens, 0);
    // The first request's state was kept at the ends of its chunks of 32 and at its last
    // block boundary (blocks of 16) before its last token: the second takes the furthest of
    // those inside what the two share.
    let last = (pa.len() - 1) / 16 * 16;
    let kept = (1..=last / 32).map(|i| i * 32).chain([last]);
    let want = kept.filter(|&k| k <= common(&pa, &pb) && k < pb.len()).max().unwrap_or(0);
    assert_eq!(b.stats.reused_prompt_tokens, want, "{} shared tokens", common(&pa, &pb));
    assert!(want >= 64);
    let fresh = Engine::new(&p, chunked(false))?;
    let c = fresh.submit(ask("Where are the nails?")?, cfg)?.wait()?;
    assert_eq!(c.stats.reused_prompt_tokens, 0);
    assert_eq!(c.tokens, b.tokens, "prefix cache (blocks and state snapshot) vs fresh");
    Ok(())
}

fn common(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// MTP speculation (the checkpoint's own multi-token-prediction head drafts, the step's
/// forward verifies, the recurrent state rolls back to the last accepted guess): greedy
/// requests give exactly the tokens of plain greedy decoding, batched with each other and
/// with plain requests, some joining mid-way, with a prompt longer than the chunked form's
/// 64 positions and small prefill chunks. Random weights make the head guess badly, so most
/// guesses are rejected (each one a rollback); the figures are printed.
#[test]
fn mtp_speculation_gives_plain_greedy_tokens() -> Result<()> {
    let (_file, p) = setup()?;
    let qs = prompts(&p)?;
    assert!(qs.iter().any(|q| q.len() > 64));
    let plain = GenerationConfig { ignore_eos: true, ..GenerationConfig::default().max_tokens(24) };
    let alone = alone(&p, &qs, |_| plain.clone())?;
    let spec = |i: usize| match i % 4 {
        3 => plain.clone(),
        _ => GenerationConfig { draft: Some(sapient_generate::speculative::SpecConfig { k: 1 + i % 3, ..Default::default() }), ..plain.clone() },
    };
    let e = Engine::new(&p, EngineOptions { prefill_chunk: 16, max_step_tokens: 48, ..opts(4096) })?;
    let handles = submit_staggered(&e, &qs, 5, spec)?;
    let (mut proposed, mut accepted) = (0, 0);
    for (i, h) in handles {
        let g = h.wait()?;
        assert_eq!(g.tokens, alone[i].tokens, "request {i} ({} prompt tokens): MTP speculation vs plain", qs[i].len());
        if i % 4 != 3 {
            assert!(g.stats.proposed_tokens > 0, "request {i} drafted nothing");
        }
        proposed += g.stats.proposed_tokens;
        accepted += g.stats.accepted_tokens;
    }
    eprintln!("MTP on random weights: {accepted} of {proposed} guesses accepted");
    wait_idle(&e)?;
    Ok(())
}

/// MTP speculation where the guesses are right: a synthetic checkpoint tweaked so that one
/// token wins every position of the main model and of the MTP head (one embedding dimension
/// large for every token and largest for that token, which the residual stream carries to
/// the tied output layer; the head's `eh_proj` passes the normed embedding through). Every
/// guess is accepted, the recurrent state stays where the verification left it, and the
/// tokens are plain greedy decoding's, for requests with one to three guesses a step.
#[test]
fn mtp_speculation_with_accepted_guesses_gives_plain_greedy_tokens() -> Result<()> {
    const WIN: usize = 1000;
    const DIM: usize = 5;
    let tweak = |name: &str, v: &mut [f32]| {
        let h = qwen35::H;
        if name == "token_embd.weight" {
            for (t, row) in v.chunks_exact_mut(h).enumerate() {
                row[DIM] = if t == WIN { 100.0 } else { 50.0 };
            }
        } else if name == format!("blk.{}.nextn.eh_proj.weight", qwen35::LAYERS) {
            for i in 0..h {
                v[i * 2 * h + i] += 3.0;
            }
        }
    };
    let file = qwen35::Synthetic::build_tweaked(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")), &tweak)?;
    let path = file.path().to_str().ok_or_else(|| anyhow::anyhow!("path"))?;
    let p = Pipeline::load(path, PipelineOptions { max_seq_len: Some(512), ..Default::default() }, |_| {})?;
    let qs = prompts(&p)?;
    let plain = GenerationConfig { ignore_eos: true, ..GenerationConfig::default().max_tokens(16) };
    let alone = alone(&p, &qs, |_| plain.clone())?;
    let e = Engine::new(&p, opts(4096))?;
    let spec = |i: usize| GenerationConfig { draft: Some(sapient_generate::speculative::SpecConfig { k: 1 + i % 3, adaptive: false, ..Default::default() }), ..plain.clone() };
    let handles = submit_staggered(&e, &qs, 4, spec)?;
    for (i, h) in handles {
        let g = h.wait()?;
        assert_eq!(g.tokens, alone[i].tokens, "request {i}: MTP speculation vs plain");
        assert!(g.stats.accepted_tokens > 0 && g.stats.forwards < g.tokens.len(), "request {i}: {:?}", g.stats);
    }
    assert!(alone.iter().all(|g| g.tokens.iter().all(|&t| t as usize == WIN)), "the tweak makes one token win: {:?}", alone[0].tokens);
    wait_idle(&e)?;
    Ok(())
}
