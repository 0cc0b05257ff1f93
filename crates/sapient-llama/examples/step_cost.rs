//! Cost of one forward of n tokens after a cached prefix (speculative verification's cost
//! model): `cargo run --release -p sapient-llama --example step_cost -- MODEL.gguf [PREFIX]`
use anyhow::{Context, Result};
use candle_core::Device;
use sapient_llama::Logits;
use std::time::Instant;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).context("usage: step_cost MODEL [PREFIX]")?;
    let prefix: usize = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(100);
    let mut m = sapient_llama::load(std::path::Path::new(path), &Device::Cpu, Some(1024))?;
    let ids: Vec<u32> = (0..prefix as u32).map(|i| 100 + (i * 37) % 5000).collect();
    m.forward(&ids, Logits::Last)?;
    let reps = 12;
    let mut buf = Vec::new();
    let mut base = 0.0;
    let ns: Vec<usize> = match args.get(3) {
        Some(l) => l.split(',').map(|s| s.parse()).collect::<Result<_, _>>()?,
        None => vec![1, 2, 3, 4, 5, 6, 8, 9],
    };
    let reps: usize = std::env::var("REPS").ok().and_then(|s| s.parse().ok()).unwrap_or(reps);
    for n in ns {
        let feed: Vec<u32> = (0..n as u32).map(|i| 200 + i * 11).collect();
        let mut best = f64::MAX;
        let mut sum = 0.0;
        for _ in 0..reps {
            let t = Instant::now();
            m.forward_into(&feed, if n == 1 { Logits::Last } else { Logits::All }, &mut buf)?;
            let s = t.elapsed().as_secs_f64();
            best = best.min(s);
            sum += s;
            m.truncate_cache(prefix);
        }
        if n == 1 {
            base = sum / reps as f64;
        }
        println!("n={n}: mean {:.2} ms, best {:.2} ms, {:.2}x one token", sum / reps as f64 * 1e3, best * 1e3, sum / reps as f64 / base);
    }
    Ok(())
}
