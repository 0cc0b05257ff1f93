//! `cargo xtask bench step-cost`: what one forward of `n` new tokens costs after a cached
//! prefix, against one token (the cost model of speculative verification and of the
//! engine's batched step): the mean and best time of each `n` over `--reps` forwards, the
//! cache cut back to the prefix after each.

use anyhow::{Context, Result};
use candle_core::Device;
use sapient_llama::Logits;
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

pub fn run(a: Args) -> Result<()> {
    let path = if a.model.ends_with(".gguf") {
        PathBuf::from(&a.model)
    } else {
        let preset = sapient_hub::Hub::new()?.fetch_preset(&a.model, &mut |_| {})?;
        preset.file("gguf").with_context(|| format!("{} has no GGUF file", a.model))?.to_path_buf()
    };
    println!("model: {}, prefix {} tokens, {} forwards each", path.display(), a.prefix, a.reps);
    let mut m = sapient_llama::load(&path, &Device::Cpu, Some(a.prefix + a.tokens.iter().max().copied().unwrap_or(1) + 16))?;
    let ids: Vec<u32> = (0..a.prefix as u32).map(|i| 100 + (i * 37) % 5000).collect();
    m.forward(&ids, Logits::Last)?;
    let mut buf = Vec::new();
    let mut base = None;
    for n in a.tokens {
        let feed: Vec<u32> = (0..n as u32).map(|i| 200 + i * 11).collect();
        let (mut best, mut sum) = (f64::MAX, 0.0);
        for _ in 0..a.reps.max(1) {
            let t = Instant::now();
            m.forward_into(&feed, if n == 1 { Logits::Last } else { Logits::All }, &mut buf)?;
            let s = t.elapsed().as_secs_f64();
            best = best.min(s);
            sum += s;
            m.truncate_cache(a.prefix);
        }
        let mean = sum / a.reps.max(1) as f64;
        let one = *base.get_or_insert(mean);
        println!("n={n}: mean {:.2} ms, best {:.2} ms, {:.2}x one token", mean * 1e3, best * 1e3, mean / one);
    }
    Ok(())
}
