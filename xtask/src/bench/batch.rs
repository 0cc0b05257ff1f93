//! `cargo xtask bench batch`: many sequences through the engine. For each concurrency, B
//! requests of `--npp` prompt tokens each generate `--ntg` tokens (greedy, end-of-sequence
//! ignored): time to first token and aggregate decode tokens/s (medians of `--reps` runs,
//! taken in rounds over the concurrencies; the ratio to the first concurrency also as the
//! median of the rounds' own ratios), beside llama.cpp's
//! `llama-batched-bench` on the same GGUF with the same shape (`--vs-llamacpp DIR`). Then two
//! engine behaviours: a request sharing a long system prompt with the one before it (prefix
//! cache), and many sequences under a KV budget that holds only some of them (preemption),
//! with peak RSS.

use anyhow::{Context, Result};
use sapient_generate::{Engine, EngineOptions, GenerationConfig, KvBudget, KvDtype, KvOptions, Pipeline, PipelineOptions};
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    #[arg(long = "preset", default_values_t = vec!["smollm2-135m-instruct".to_string(), "qwen2.5-coder-0.5b-instruct".to_string()])]
    pub presets: Vec<String>,
    /// Concurrent sequences.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1, 2, 4, 8, 16])]
    pub npl: Vec<usize>,
    /// Prompt tokens per sequence.
    #[arg(long, default_value_t = 128)]
    pub npp: usize,
    /// Generated tokens per sequence.
    #[arg(long, default_value_t = 64)]
    pub ntg: usize,
    /// Directory holding llama.cpp's `llama-batched-bench` (scripts/build-llamacpp.sh).
    #[arg(long)]
    pub vs_llamacpp: Option<PathBuf>,
    /// Runs of each concurrency, in rounds over every `--npl` value (so a slow stretch of a
    /// shared machine falls on all of them alike); the medians are reported.
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Skip the prefix-cache and KV-budget runs.
    #[arg(long)]
    pub no_extras: bool,
    /// KV-budget run: this many sequences of `--budget-len` tokens (half prompt, half
    /// generated) under a budget holding a quarter of them.
    #[arg(long, default_value_t = 64)]
    pub budget_seqs: usize,
    #[arg(long, default_value_t = 512)]
    pub budget_len: usize,
    #[arg(long, default_value = "target/bench/batch.json")]
    pub json: PathBuf,
    /// How the KV cache stores keys and values: f16, or q8_0 (8 bits with a scale per 32).
    #[arg(long, default_value = "f16")]
    pub kv_type: KvDtype,
}

fn status_kb(key: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with(key)).map(|l| l.to_string()))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse::<f64>().ok()))
        .unwrap_or(0.0)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// A prompt of `n` token ids, different for each `seed` (no shared prefix).
fn prompt(n: usize, seed: usize, vocab: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 7919 + seed * 104_729 + 13) % (vocab - 1000) + 500) as u32).collect()
}

struct Point {
    ttft_median: f64,
    ttft_max: f64,
    decode_tok_s: f64,
    total_s: f64,
}

/// Positions' worth of KV cache one sequence's recurrent state takes (a hybrid's; 0 for
/// others): the budget holds it beside the positions.
fn state_positions(pipe: &Pipeline) -> Result<usize> {
    let g = sapient_tensor::GgufFile::open(&pipe.info().path)?;
    let c = sapient_llama::LlamaConfig::from_gguf(&g)?;
    let Some(h) = &c.hybrid else { return Ok(0) };
    let per_position = 2 * 2 * c.num_kv_heads * c.head_dim * h.linear_layers.iter().filter(|&&l| !l).count();
    Ok((h.state_floats() * 4).div_ceil(per_position.max(1)) + 32)
}

fn engine_point(pipe: &Pipeline, npl: usize, a: &Args) -> Result<Point> {
    let vocab = pipe.info().vocab_size;
    // Every prompt in the first step, then one decode row per sequence per step: the shape
    // llama-batched-bench measures.
    let opts = EngineOptions {
        kv: KvOptions { block_size: 32, budget: KvBudget::Tokens(npl * (a.npp + a.ntg + state_positions(pipe)?) + 64), dtype: a.kv_type },
        max_seqs: npl,
        max_step_tokens: npl * a.npp,
        prefill_chunk: a.npp,
        prefix_cache: false,
        ..Default::default()
    };
    let engine = Engine::new(pipe, opts)?;
    // Warm-up: first touch of the weights and the engine's scratch.
    engine.submit(prompt(16, 999, vocab), GenerationConfig { ignore_eos: true, ..GenerationConfig::default().max_tokens(2) })?.wait()?;
    let cfg = GenerationConfig { ignore_eos: true, ..GenerationConfig::default().max_tokens(a.ntg) };
    let t0 = Instant::now();
    let handles: Vec<_> = (0..npl).map(|s| engine.submit(prompt(a.npp, s, vocab), cfg.clone())).collect::<Result<_, _>>()?;
    let gens: Vec<_> = handles.into_iter().map(|h| h.wait()).collect::<Result<_, _>>()?;
    let total = t0.elapsed().as_secs_f64();
    let ttfts: Vec<f64> = gens.iter().map(|g| g.stats.time_to_first_token.as_secs_f64()).collect();
    let first_all = ttfts.iter().copied().fold(0.0, f64::max);
    // Tokens after every sequence had its first: (ntg - 1) per sequence.
    let decoded: usize = gens.iter().map(|g| g.tokens.len().saturating_sub(1)).sum();
    for g in &gens {
        anyhow::ensure!(g.tokens.len() == a.ntg, "a sequence generated {} of {} tokens", g.tokens.len(), a.ntg);
    }
    Ok(Point {
        ttft_median: median(ttfts.clone()),
        ttft_max: first_all,
        decode_tok_s: decoded as f64 / (total - first_all).max(1e-9),
        total_s: total,
    })
}

/// `llama-batched-bench` rows: (npl, S_PP t/s, S_TG t/s, T_PP s).
fn llama_batched(dir: &std::path::Path, model: &std::path::Path, a: &Args) -> Result<Vec<(usize, f64, f64, f64)>> {
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let max_npl = a.npl.iter().copied().max().unwrap_or(1);
    let ctx = max_npl * (a.npp + a.ntg) + 64;
    let npl: Vec<String> = a.npl.iter().map(|n| n.to_string()).collect();
    let out = std::process::Command::new(dir.join("llama-batched-bench"))
        .arg("-m")
        .arg(model)
        .args(["-c", &ctx.to_string(), "-b", "2048", "-ub", "512", "-t", &threads.to_string()])
        .args(["-npp", &a.npp.to_string(), "-ntg", &a.ntg.to_string(), "-npl", &npl.join(","), "--output-format", "jsonl"])
        .output()
        .with_context(|| format!("running {}/llama-batched-bench", dir.display()))?;
    anyhow::ensure!(out.status.success(), "llama-batched-bench failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let mut rows = Vec::new();
    for line in text.lines().filter(|l| l.trim_start().starts_with('{')) {
        let v: serde_json::Value = serde_json::from_str(line.trim()).context("llama-batched-bench JSON line")?;
        rows.push((
            v["pl"].as_u64().unwrap_or(0) as usize,
            v["speed_pp"].as_f64().unwrap_or(0.0),
            v["speed_tg"].as_f64().unwrap_or(0.0),
            v["t_pp"].as_f64().unwrap_or(0.0),
        ));
    }
    anyhow::ensure!(!rows.is_empty(), "no results from llama-batched-bench:\n{text}");
    Ok(rows)
}

pub fn run(a: Args) -> Result<()> {
    let mut results = Vec::new();
    for preset in &a.presets {
        // llama.cpp first, before the model is loaded here: a model of half the memory (a
        // 20B mixture of experts) then fits beside llama.cpp's page cache. A preset or a
        // path to a GGUF.
        let path = sapient_hub::Hub::new()?.resolve(preset, &mut |_| {})?.file("gguf")?.to_path_buf();
        let lcpp = match &a.vs_llamacpp {
            Some(dir) => Some(llama_batched(dir, &path, &a)?),
            None => None,
        };
        let pipe = Pipeline::load(preset, PipelineOptions { max_seq_len: Some(4096), ..Default::default() }, |_| {})?;
        println!("{preset} ({}), prompts of {} tokens, {} generated each, {} KV cache:", path.display(), a.npp, a.ntg, a.kv_type);
        let reps = a.reps.max(1);
        let mut runs: Vec<Vec<Point>> = a.npl.iter().map(|_| Vec::new()).collect();
        for _ in 0..reps {
            for (i, &npl) in a.npl.iter().enumerate() {
                runs[i].push(engine_point(&pipe, npl, &a)?);
            }
        }
        if reps > 1 {
            println!("  (medians of {reps} runs of each concurrency, in rounds)");
        }
        let mut single = None;
        // The ratios are to the first concurrency measured (one sequence by default).
        let against = match a.npl.first() {
            Some(1) | None => "one sequence".to_string(),
            Some(n) => format!("B={n}"),
        };
        for (&npl, ps) in a.npl.iter().zip(&runs) {
            let of = |f: fn(&Point) -> f64| median(ps.iter().map(f).collect());
            let p = Point { ttft_median: of(|p| p.ttft_median), ttft_max: of(|p| p.ttft_max), decode_tok_s: of(|p| p.decode_tok_s), total_s: of(|p| p.total_s) };
            let base = *single.get_or_insert(p.decode_tok_s);
            // The same ratio taken round by round (each run against the first concurrency's
            // run of the same round, minutes apart at most), then the median: a slow stretch
            // of the machine then moves both sides of a ratio alike.
            let paired = median(ps.iter().zip(&runs[0]).map(|(p, b)| p.decode_tok_s / b.decode_tok_s.max(1e-9)).collect());
            print!(
                "  B={npl:>2}: decode {:7.1} tok/s aggregate ({:.2}x {against}; {:.2}x paired by round) | first token median {:.3}s, last {:.3}s | total {:.2}s",
                p.decode_tok_s,
                p.decode_tok_s / base.max(1e-9),
                paired,
                p.ttft_median,
                p.ttft_max,
                p.total_s
            );
            let mut entry = serde_json::json!({
                "preset": preset, "kv_type": a.kv_type.name(), "npl": npl, "npp": a.npp, "ntg": a.ntg, "decode_tok_s": p.decode_tok_s,
                "ttft_median_s": p.ttft_median, "ttft_max_s": p.ttft_max, "total_s": p.total_s,
                "reps": reps, "decode_tok_s_runs": ps.iter().map(|p| p.decode_tok_s).collect::<Vec<_>>(), "vs_first_paired": paired,
                "machine": super::machine(),
            });
            if let Some(row) = lcpp.as_ref().and_then(|r| r.iter().find(|r| r.0 == npl)) {
                print!(
                    " || llama.cpp: decode {:7.1} tok/s, prompts {:.3}s => {:.2}x decode, {:.2}x first token",
                    row.2,
                    row.3,
                    p.decode_tok_s / row.2.max(1e-9),
                    row.3 / p.ttft_max.max(1e-9)
                );
                entry["llamacpp_decode_tok_s"] = row.2.into();
                entry["llamacpp_t_pp_s"] = row.3.into();
                entry["llamacpp_pp_tok_s"] = row.1.into();
            }
            println!();
            results.push(entry);
        }
        if !a.no_extras {
            results.push(prefix_run(&pipe, a.kv_type)?);
        }
    }
    if !a.no_extras {
        if let Some(preset) = a.presets.first() {
            let pipe = Pipeline::load(preset, PipelineOptions { max_seq_len: Some(4096), ..Default::default() }, |_| {})?;
            results.push(budget_run(&pipe, &a)?);
        }
    }
    println!("peak RSS of this run: {:.0} MB", status_kb("VmHWM:") / 1024.0);
    if let Some(parent) = a.json.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&a.json, serde_json::to_string_pretty(&results)?)?;
    println!("results written to {}", a.json.display());
    Ok(())
}

/// Two requests sharing a 1,000-token system prompt, one after the other.
fn prefix_run(pipe: &Pipeline, dtype: KvDtype) -> Result<serde_json::Value> {
    let defaults = EngineOptions::default();
    let engine = Engine::new(pipe, EngineOptions { kv: KvOptions { dtype, ..defaults.kv }, ..defaults })?;
    let vocab = pipe.info().vocab_size;
    let system = prompt(1000, 7, vocab);
    let ask = |q: usize| -> Vec<u32> { system.iter().copied().chain(prompt(12, 100 + q, vocab)).collect() };
    let cfg = GenerationConfig { ignore_eos: true, ..GenerationConfig::default().max_tokens(4) };
    let a = engine.submit(ask(1), cfg.clone())?.wait()?;
    let b = engine.submit(ask(2), cfg)?.wait()?;
    let (ta, tb) = (a.stats.time_to_first_token.as_secs_f64(), b.stats.time_to_first_token.as_secs_f64());
    println!(
        "  prefix cache: first request ({} prompt tokens) first token after {ta:.3}s; second, sharing 1000 of them ({} from the cache), after {tb:.3}s = {:.0}% of the first",
        a.stats.prompt_tokens,
        b.stats.reused_prompt_tokens,
        100.0 * tb / ta.max(1e-9)
    );
    Ok(serde_json::json!({"prefix_cache": {"ttft_first_s": ta, "ttft_second_s": tb, "reused": b.stats.reused_prompt_tokens}}))
}

/// Many sequences under a budget that holds a quarter of them at once.
fn budget_run(pipe: &Pipeline, a: &Args) -> Result<serde_json::Value> {
    let vocab = pipe.info().vocab_size;
    let fit = (a.budget_seqs / 4).max(1);
    let budget = fit * a.budget_len;
    let engine = Engine::new(
        pipe,
        EngineOptions { kv: KvOptions { block_size: 32, budget: KvBudget::Tokens(budget), dtype: a.kv_type }, prefix_cache: false, ..Default::default() },
    )?;
    let half = a.budget_len / 2;
    let cfg = GenerationConfig { ignore_eos: true, ..GenerationConfig::default().max_tokens(half) };
    let t0 = Instant::now();
    let handles: Vec<_> = (0..a.budget_seqs).map(|s| engine.submit(prompt(half, 1000 + s, vocab), cfg.clone())).collect::<Result<_, _>>()?;
    let mut done = 0;
    let mut peak_blocks = 0;
    for h in handles {
        let g = h.wait()?;
        anyhow::ensure!(g.tokens.len() == half, "a sequence generated {} of {half} tokens", g.tokens.len());
        done += 1;
        peak_blocks = peak_blocks.max(engine.metrics().kv.used_blocks);
    }
    let m = engine.metrics();
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "  KV budget ({}): {done} of {} sequences of {} tokens completed under a budget of {budget} positions ({} at once), {} preemptions, {:.1}s, {:.1} generated tok/s; KV {:.0} MB; RSS now {:.0} MB",
        pipe.info().id,
        a.budget_seqs,
        a.budget_len,
        fit,
        m.preemptions,
        secs,
        (a.budget_seqs * half) as f64 / secs,
        m.kv.bytes as f64 / 1e6,
        status_kb("VmRSS:") / 1024.0
    );
    Ok(serde_json::json!({"kv_budget": {"seqs": a.budget_seqs, "len": a.budget_len, "budget_tokens": budget, "completed": done, "preemptions": m.preemptions, "seconds": secs, "kv_bytes": m.kv.bytes}}))
}
