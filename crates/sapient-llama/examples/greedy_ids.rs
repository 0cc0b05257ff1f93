//! Greedy-decode from raw token ids (a plumbing check without a tokenizer):
//! `cargo run --release -p sapient-llama --example greedy_ids -- MODEL.gguf 1,2,3 [N]`
use anyhow::{Context, Result};
use sapient_llama::Logits;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).context("usage: greedy_ids MODEL ID,ID,... [N]")?;
    let ids: Vec<u32> = args
        .get(2)
        .context("token ids")?
        .split(',')
        .map(|s| s.trim().parse())
        .collect::<Result<_, _>>()?;
    let n: usize = args.get(3).map(|s| s.parse()).transpose()?.unwrap_or(32);
    let t0 = std::time::Instant::now();
    let mut m = sapient_llama::load(path.as_ref(), &candle_core::Device::Cpu, Some(2048))?;
    eprintln!("loaded in {:?}", t0.elapsed());
    let t0 = std::time::Instant::now();
    let mut logits = m.forward(&ids, Logits::Last)?;
    eprintln!("prefill {} tokens in {:?}", ids.len(), t0.elapsed());
    let mut out = Vec::new();
    let t0 = std::time::Instant::now();
    for _ in 0..n {
        let next = logits.squeeze(0)?.argmax(0)?.to_scalar::<u32>()?;
        out.push(next);
        logits = m.forward(&[next], Logits::Last)?;
    }
    eprintln!("decode {n} tokens in {:?} ({:.1} tok/s)", t0.elapsed(), n as f64 / t0.elapsed().as_secs_f64());
    println!("{}", out.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(","));
    Ok(())
}
