//! `cargo xtask bench llm`: prefill (pp) and decode (tg) tokens/s, time to first token and
//! peak RSS for a preset, llama.cpp's `llama-bench` on the same GGUF in the same run
//! (`--vs-llamacpp DIR`), and a memory-bandwidth probe stating the decode ceiling.

use anyhow::{Context, Result};
use candle_core::Device;
use sapient_llama::Logits;
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// Presets to measure.
    #[arg(long = "preset", default_values_t = vec!["smollm2-135m-instruct".to_string()])]
    pub presets: Vec<String>,
    #[arg(long, default_value_t = 512)]
    pub pp: usize,
    #[arg(long, default_value_t = 128)]
    pub tg: usize,
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Directory holding llama.cpp's `llama-bench` (see scripts/build-llamacpp.sh).
    #[arg(long)]
    pub vs_llamacpp: Option<PathBuf>,
    /// Where to write the JSON results.
    #[arg(long, default_value = "target/bench/llm.json")]
    pub json: PathBuf,
}

/// Resident memory now (after the model ran: weights, KV cache, scratch). The process-wide
/// high-water mark would include the bandwidth probe's buffer (freed after each probe).
fn rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmRSS:")).map(|l| l.to_string()))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse::<f64>().ok()))
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

/// Sum of `c`, asking for the data 2 KiB ahead (as the kernels prefetch weight rows: one
/// core's hardware prefetcher alone does not reach the memory's bandwidth on every machine).
fn sum_prefetched(c: &[u64]) -> u64 {
    const AHEAD: usize = 2048 / 8;
    let mut acc = 0u64;
    for (i, block) in c.chunks(64).enumerate() {
        #[cfg(target_arch = "x86_64")]
        for ahead in c.iter().skip(i * 64 + AHEAD).step_by(8).take(8) {
            // SAFETY: prefetching never faults; the address is inside `c`.
            unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(ahead as *const u64 as *const i8) };
        }
        acc = block.iter().fold(acc, |a, &x| a.wrapping_add(x));
    }
    acc
}

/// Sum of `c` with no software prefetching (a plain read: the hardware prefetchers only).
fn sum_plain(c: &[u64]) -> u64 {
    c.iter().fold(0u64, |a, &x| a.wrapping_add(x))
}

/// Read bandwidth with all cores: sum a 1 GiB buffer a few times, with software prefetching
/// (`prefetch`, as the kernels read weights) or as a plain read.
fn bandwidth_gbs(prefetch: bool) -> f64 {
    let n = (1usize << 30) / 8;
    let buf: Vec<u64> = (0..n as u64).collect();
    // Backed by 2 MiB pages as the model's weights are (sapient-tensor asks Linux for them):
    // on the Intel VM of session 8 that alone moved the probe from ~29 to ~33 GB/s.
    // SAFETY: a u64 slice viewed as its bytes.
    sapient_tensor::kernels::huge_pages(unsafe { std::slice::from_raw_parts(buf.as_ptr() as *const u8, n * 8) });
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let mut best = 0f64;
    for _ in 0..5 {
        let t = Instant::now();
        let total: u64 = std::thread::scope(|s| {
            let chunk = n.div_ceil(threads);
            let hs: Vec<_> = buf
                .chunks(chunk)
                .map(|c| s.spawn(move || if prefetch { sum_prefetched(c) } else { sum_plain(c) }))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap_or(0)).fold(0u64, |a, x| a.wrapping_add(x))
        });
        std::hint::black_box(total);
        best = best.max((n * 8) as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    best
}

/// Bytes of weights a decode step reads: every tensor, except the token embedding table when
/// the model has a separate output matrix (a step reads one row of it). The KV cache reads
/// (under 2 MB per token at tg128 for these models) are left out.
fn decode_bytes(path: &std::path::Path) -> Result<f64> {
    let g = sapient_tensor::gguf::GgufFile::open(path)?;
    let total: u64 = g.tensors().iter().map(|t| t.size).sum();
    let embd = match (g.tensor_info("token_embd.weight"), g.contains_tensor("output.weight")) {
        (Some(t), true) => t.size - t.size / t.shape.first().copied().unwrap_or(1).max(1) as u64,
        _ => 0,
    };
    Ok((total - embd) as f64)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn llama_bench(dir: &std::path::Path, model: &std::path::Path, a: &Args) -> Result<(f64, f64)> {
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let out = std::process::Command::new(dir.join("llama-bench"))
        .arg("-m")
        .arg(model)
        .args(["-p", &a.pp.to_string(), "-n", &a.tg.to_string(), "-r", &a.reps.to_string(), "-t", &threads.to_string(), "-o", "json"])
        .output()
        .with_context(|| format!("running {}/llama-bench", dir.display()))?;
    anyhow::ensure!(out.status.success(), "llama-bench failed: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).context("llama-bench JSON")?;
    let mut pp = 0.0;
    let mut tg = 0.0;
    for r in v.as_array().into_iter().flatten() {
        let ts = r["avg_ts"].as_f64().unwrap_or(0.0);
        if r["n_prompt"].as_u64() == Some(a.pp as u64) && r["n_gen"].as_u64() == Some(0) {
            pp = ts;
        }
        if r["n_gen"].as_u64() == Some(a.tg as u64) && r["n_prompt"].as_u64() == Some(0) {
            tg = ts;
        }
    }
    Ok((pp, tg))
}

pub fn run(a: Args) -> Result<()> {
    let hub = sapient_hub::Hub::new()?;
    let mut results = Vec::new();
    let mut measured = Vec::new();
    for preset in &a.presets {
        let r = hub.fetch_preset(preset, &mut |_| {})?;
        let path = r.file("gguf")?.to_path_buf();
        let file_size = std::fs::metadata(&path)?.len() as f64;
        let size = decode_bytes(&path)?;
        let t0 = Instant::now();
        let mut m = sapient_llama::load(&path, &Device::Cpu, Some(a.pp + a.tg + 8))?;
        let load_s = t0.elapsed().as_secs_f64();
        let vocab = m.config().vocab_size as u32;
        let prompt: Vec<u32> = (0..a.pp as u32).map(|i| (i * 7919 + 13) % vocab).collect();
        // Warm-up (first-touch of weights and caches).
        m.forward(&prompt[..16.min(prompt.len())], Logits::Last)?;
        let mut pp = Vec::new();
        let mut tg = Vec::new();
        let mut ttft = Vec::new();
        // One logits buffer for every step, as the Pipeline keeps.
        let mut logits = Vec::new();
        let argmax = |l: &[f32]| sapient_sample::argmax(l).map_err(anyhow::Error::from);
        // The bandwidth probe right before and right after this model's runs: the memory
        // bandwidth of a shared machine moves by a third within a minute, so the ceiling is
        // taken from the probes next to the decode it is compared with.
        let before = (bandwidth_gbs(true), bandwidth_gbs(false));
        for _ in 0..a.reps {
            m.clear_cache();
            let t = Instant::now();
            m.forward_into(&prompt, Logits::Last, &mut logits)?;
            let _first = argmax(&logits)?;
            let dt = t.elapsed().as_secs_f64();
            pp.push(a.pp as f64 / dt);
            ttft.push(dt);
            m.clear_cache();
            let mut tok = 1u32;
            let t = Instant::now();
            for _ in 0..a.tg {
                m.forward_into(&[tok], Logits::Last, &mut logits)?;
                tok = argmax(&logits)?;
            }
            tg.push(a.tg as f64 / t.elapsed().as_secs_f64());
        }
        let (pp, tg, ttft) = (median(pp), median(tg), median(ttft));
        let rss = rss_mb();
        let after = (bandwidth_gbs(true), bandwidth_gbs(false));
        drop(m);
        println!(
            "{preset}: pp{} {pp:.1} tok/s | tg{} {tg:.1} tok/s | ttft({} tokens) {ttft:.3}s | load {load_s:.2}s | RSS {rss:.0} MB (file {:.0} MB, {:.0} MB read per decoded token)",
            a.pp,
            a.tg,
            a.pp,
            file_size / 1e6,
            size / 1e6
        );
        let mut entry = serde_json::json!({
            "preset": preset, "file_bytes": file_size, "decode_bytes_per_token": size, "pp": a.pp, "tg": a.tg,
            "pp_tok_s": pp, "tg_tok_s": tg, "ttft_s": ttft, "load_s": load_s, "rss_mb": rss,
        });
        if let Some(dir) = &a.vs_llamacpp {
            let (lpp, ltg) = llama_bench(dir, &path, &a)?;
            println!(
                "  llama.cpp: pp{} {lpp:.1} tok/s | tg{} {ltg:.1} tok/s  => sapient/llama.cpp: pp {:.2}x, tg {:.2}x",
                a.pp,
                a.tg,
                pp / lpp.max(1e-9),
                tg / ltg.max(1e-9)
            );
            entry["llamacpp_pp_tok_s"] = lpp.into();
            entry["llamacpp_tg_tok_s"] = ltg.into();
        }
        measured.push((tg, size, before, after));
        results.push(entry);
    }
    let machine = super::machine();
    for (entry, (tg, size, before, after)) in results.iter_mut().zip(measured) {
        let (bw, plain) = ((before.0 + after.0) / 2.0, (before.1 + after.1) / 2.0);
        let ceiling = bw * 1e9 / size;
        let plain_ceiling = plain * 1e9 / size;
        println!(
            "  {}: memory read bandwidth (all cores, best of 5 x 1 GiB, mean of the probes before and after its runs) {bw:.1} GB/s with software prefetching ({:.1}, {:.1}), {plain:.1} GB/s plain ({:.1}, {:.1}): decode at {:.0}% of the {ceiling:.0} tok/s ceiling (prefetching read), {:.0}% of {plain_ceiling:.0} (plain read)",
            entry["preset"],
            before.0,
            after.0,
            before.1,
            after.1,
            100.0 * tg / ceiling,
            100.0 * tg / plain_ceiling
        );
        entry["machine"] = machine.clone().into();
        entry["bandwidth_gbs"] = bw.into();
        entry["bandwidth_gbs_before_after"] = serde_json::json!([before.0, after.0]);
        entry["tg_ceiling_tok_s"] = ceiling.into();
        entry["plain_bandwidth_gbs"] = plain.into();
        entry["plain_bandwidth_gbs_before_after"] = serde_json::json!([before.1, after.1]);
        entry["tg_plain_ceiling_tok_s"] = plain_ceiling.into();
    }
    if let Some(parent) = a.json.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&a.json, serde_json::to_string_pretty(&results)?)?;
    println!("results written to {}", a.json.display());
    Ok(())
}
