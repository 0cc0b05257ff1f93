//! `cargo xtask bench step-cost`: what one forward of `n` new tokens costs after a cached
//! prefix, against one token (the cost model of speculative verification and of the
//! engine's batched step): the mean and best time of each `n` over `--reps` forwards, each
//! on a fork of the prefix's sequence (which works for hybrids, whose recurrent state
//! cannot be cut back; their verification steps keep the state after each row and roll
//! back to the first, as the engine's do, and that is timed too).
//!
//! With an MTP head (Qwen3.5), also what the head costs: a guess (one row) and a catch-up
//! of `n` rows; and from those figures, for each number of guesses `k` a step, the
//! acceptance rate a guess needs for MTP speculation to beat plain decoding. A round of
//! `k` guesses costs a catch-up of up to `k + 1` rows (the last round's accepted tokens),
//! `k - 1` guesses and a verification of `k + 1` rows; with each guess accepted with
//! probability `p`, it yields `(1 - p^(k+1)) / (1 - p)` tokens.

use anyhow::{Context, Result};
use candle_core::Device;
use sapient_llama::{BatchSeq, KvBudget, KvCache, KvDtype, KvOptions, LlamaModel, Logits, SeqId};
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// A preset id or a local `.gguf` file.
    #[arg(long, default_value = "qwen2.5-coder-0.5b-instruct")]
    pub model: String,
    /// Tokens in the cache before each measured forward.
    #[arg(long, default_value_t = 100)]
    pub prefix: usize,
    /// New tokens per forward, each measured in turn.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1, 2, 3, 4, 5, 6, 8, 9])]
    pub tokens: Vec<usize>,
    /// Forwards per size.
    #[arg(long, default_value_t = 12)]
    pub reps: usize,
}

/// A paged cache with room for a few sequences of `positions` (and their recurrent states).
fn cache(m: &LlamaModel, positions: usize, mtp: bool) -> Result<KvCache> {
    let opts = |extra: usize| KvOptions { block_size: 16, budget: KvBudget::Tokens(4 * positions + extra * 16), dtype: KvDtype::F16 };
    let kv = if mtp { m.new_mtp_cache(opts(0))? } else { m.new_kv_cache(opts(0))? };
    let state = kv.seq_state_blocks();
    Ok(if state == 0 { kv } else { m.new_kv_cache(opts(4 * state))? })
}

/// Mean and best of the seconds `reps` runs of `f` measured.
fn time(reps: usize, mut f: impl FnMut() -> Result<f64>) -> Result<(f64, f64)> {
    let (mut best, mut sum) = (f64::MAX, 0.0);
    for _ in 0..reps.max(1) {
        let s = f()?;
        best = best.min(s);
        sum += s;
    }
    Ok((sum / reps.max(1) as f64, best))
}

pub fn run(a: Args) -> Result<()> {
    let path = if a.model.ends_with(".gguf") {
        PathBuf::from(&a.model)
    } else {
        let preset = sapient_hub::Hub::new()?.fetch_preset(&a.model, &mut |_| {})?;
        preset.file("gguf").with_context(|| format!("{} has no GGUF file", a.model))?.to_path_buf()
    };
    println!("model: {}, prefix {} tokens, {} forwards each", path.display(), a.prefix, a.reps);
    let most = a.tokens.iter().max().copied().unwrap_or(1);
    let mut m = sapient_llama::load(&path, &Device::Cpu, Some(a.prefix + most + 16))?;
    m.set_keep_row_states(true);
    let mut kv = cache(&m, a.prefix + most + 16, false)?;
    let hybrid = kv.has_seq_state();
    let ids: Vec<u32> = (0..a.prefix as u32).map(|i| 100 + (i * 37) % 5000).collect();
    let base = kv.new_seq();
    let mut buf = Vec::new();
    m.forward_batch(&mut kv, &[BatchSeq { seq: base, tokens: &ids, logits: Some(Logits::Last) }], &mut buf)?;
    let mut costs: Vec<(usize, f64)> = Vec::new();
    for &n in &a.tokens {
        let feed: Vec<u32> = (0..n as u32).map(|i| 200 + i * 11).collect();
        let logits = Some(if n == 1 { Logits::Last } else { Logits::All });
        let mut fork: Option<SeqId> = None;
        let (mean, best) = time(a.reps, || {
            if let Some(f) = fork.take() {
                kv.free(f)?;
            }
            let f = kv.fork(base)?;
            fork = Some(f);
            let t = Instant::now();
            m.forward_batch(&mut kv, &[BatchSeq { seq: f, tokens: &feed, logits }], &mut buf)?;
            // A verification that keeps only its first row (every guess rejected).
            if hybrid && n > 1 {
                kv.rollback_state(f, a.prefix + 1)?;
                kv.set_len(f, a.prefix + 1)?;
            }
            Ok(t.elapsed().as_secs_f64())
        })?;
        if let Some(f) = fork {
            kv.free(f)?;
        }
        let one = costs.first().map_or(mean, |c| c.1);
        println!("n={n}: mean {:.2} ms, best {:.2} ms, {:.2}x one token", mean * 1e3, best * 1e3, mean / one);
        costs.push((n, mean));
    }
    if m.has_mtp() {
        mtp_costs(&mut m, &a, &costs)?;
    }
    Ok(())
}

/// The MTP head's guess and catch-up costs, and the acceptance rate at which speculating
/// with it pays (see the module docs).
fn mtp_costs(m: &mut LlamaModel, a: &Args, costs: &[(usize, f64)]) -> Result<()> {
    let h = m.config().hidden_size;
    let most = a.tokens.iter().max().copied().unwrap_or(1);
    let mut kv = cache(m, a.prefix + most + 16, true)?;
    let s = kv.new_seq();
    let ids: Vec<u32> = (0..a.prefix as u32).map(|i| 100 + (i * 37) % 5000).collect();
    // The hidden states' values do not change what a forward costs.
    let hidden = vec![0.5f32; (a.prefix + most) * h];
    let mut buf = Vec::new();
    m.mtp_forward(&mut kv, &[BatchSeq { seq: s, tokens: &ids, logits: None }], &hidden, &mut buf)?;
    let mut mtp: Vec<(usize, f64)> = Vec::new();
    for &n in &a.tokens {
        let feed: Vec<u32> = (0..n as u32).map(|i| 200 + i * 11).collect();
        let (mean, _) = time(a.reps, || {
            let t = Instant::now();
            m.mtp_forward(&mut kv, &[BatchSeq { seq: s, tokens: &feed, logits: Some(Logits::Last) }], &hidden, &mut buf)?;
            let took = t.elapsed().as_secs_f64();
            kv.truncate(s, a.prefix)?;
            Ok(took)
        })?;
        println!("MTP head, {n} rows: mean {:.2} ms", mean * 1e3);
        mtp.push((n, mean));
    }
    let cost = |table: &[(usize, f64)], n: usize| table.iter().find(|c| c.0 == n).map(|c| c.1);
    let Some(one) = cost(costs, 1) else { return Ok(()) };
    for k in 1..=3 {
        let (Some(verify), Some(guess), Some(catch_up)) = (cost(costs, k + 1), cost(&mtp, 1), cost(&mtp, k + 1)) else { continue };
        let round = verify + catch_up + (k - 1) as f64 * guess;
        // Tokens a round must yield to beat plain decoding, and the acceptance that gives them.
        let need = round / one;
        let tokens = |p: f64| (0..=k).map(|i| p.powi(i as i32)).sum::<f64>();
        let pays = if tokens(1.0) <= need {
            "never (even every guess accepted is too few tokens)".to_string()
        } else {
            let (mut lo, mut hi) = (0.0, 1.0);
            for _ in 0..50 {
                let mid = (lo + hi) / 2.0;
                if tokens(mid) < need { lo = mid } else { hi = mid }
            }
            format!("above {:.0}% acceptance per guess", 100.0 * hi)
        };
        println!(
            "MTP k={k}: a round costs {:.2} ms ({:.2}x a decode step: verify {:.2}, catch-up {:.2}, {} more guesses at {:.2}); pays {pays}",
            round * 1e3,
            need,
            verify * 1e3,
            catch_up * 1e3,
            k - 1,
            guess * 1e3
        );
    }
    Ok(())
}
