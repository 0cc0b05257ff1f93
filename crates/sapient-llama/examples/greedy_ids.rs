//! Greedy-decode from raw token ids (a plumbing check without a tokenizer):
//! `cargo run --release -p sapient-llama --example greedy_ids -- MODEL.gguf 1,2,3 [N]`
//! (the kernel options from the environment, as the `sapient` command line takes them).
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
    // The kernels' options from the environment (`SAPIENT_NO_AVX2`, `SAPIENT_NO_NEON`, ...).
    let (opts, warnings) = sapient_tensor::kernels::KernelOptions::from_env();
    warnings.iter().for_each(|w| eprintln!("{w}"));
    sapient_tensor::kernels::configure(opts)?;
    let t0 = std::time::Instant::now();
    let mut m = if std::env::var_os("DENSE").is_some() {
        // Every weight dequantized to f32: isolates the effect of quantized activations.
        struct Dense(sapient_tensor::GgufFile);
        impl sapient_tensor::WeightSource for Dense {
            fn location(&self) -> &std::path::Path { self.0.path() }
            fn contains(&self, n: &str) -> bool { self.0.contains_tensor(n) }
            fn shape_of(&self, n: &str) -> Option<Vec<usize>> { self.0.tensor_info(n).map(|t| t.shape.clone()) }
            fn load(&self, n: &str, d: &candle_core::Device) -> sapient_tensor::Result<sapient_tensor::Weight> {
                if n == "token_embd.weight" { return sapient_tensor::WeightSource::load(&self.0, n, d); }
                Ok(sapient_tensor::Weight::Dense(self.0.tensor(n, d)?))
            }
            fn names(&self) -> Vec<String> { sapient_tensor::WeightSource::names(&self.0) }
        }
        let g = sapient_tensor::GgufFile::open(path)?;
        let cfg = sapient_llama::LlamaConfig::from_gguf(&g)?;
        sapient_llama::LlamaModel::load(&Dense(g), &cfg, &candle_core::Device::Cpu, Some(2048))?
    } else {
        sapient_llama::load(path.as_ref(), &candle_core::Device::Cpu, Some(2048))?
    };
    eprintln!("loaded in {:?}", t0.elapsed());
    let t0 = std::time::Instant::now();
    if let Some(out) = std::env::var_os("ALL_LOGITS") {
        let l = m.forward(&ids, Logits::All)?.flatten_all()?.to_vec1::<f32>()?;
        let bytes: Vec<u8> = l.iter().flat_map(|x| x.to_le_bytes()).collect();
        std::fs::write(out, bytes)?;
        m.clear_cache();
        let mut rows = Vec::new();
        for &t in &ids {
            rows.extend(m.forward(&[t], Logits::Last)?.flatten_all()?.to_vec1::<f32>()?);
        }
        let bytes: Vec<u8> = rows.iter().flat_map(|x| x.to_le_bytes()).collect();
        std::fs::write("/tmp/seq.bin", bytes)?;
        m.clear_cache();
    }
    let mut logits = if std::env::var_os("ONE_BY_ONE").is_some() {
        let mut l = None;
        for &t in &ids {
            l = Some(m.forward(&[t], Logits::Last)?);
        }
        l.context("empty prompt")?
    } else {
        m.forward(&ids, Logits::Last)?
    };
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
