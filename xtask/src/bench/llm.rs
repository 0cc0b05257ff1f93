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
    /// Presets (or local GGUF paths) to measure.
    #[arg(long = "preset", default_values_t = vec!["smollm2-135m-instruct".to_string()])]
    pub presets: Vec<String>,
    /// Prompt lengths to measure prefill at (comma-separated; the first is the headline).
    #[arg(long, value_delimiter = ',', default_values_t = vec![512])]
    pub pp: Vec<usize>,
    #[arg(long, default_value_t = 128)]
    pub tg: usize,
    /// Context depths to measure decode at besides 0 (comma-separated): `tg` tokens decoded
    /// after a prefix of that many tokens (llama-bench's `-d`).
    #[arg(long, value_delimiter = ',', default_values_t = Vec::<usize>::new())]
    pub depth: Vec<usize>,
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
        for ahead in c.iter().skip(i * 64 + AHEAD).step_by(8).take(8) {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: prefetching never faults; the address is inside `c`.
            unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(ahead as *const u64 as *const i8) };
            #[cfg(target_arch = "aarch64")]
            // SAFETY: as above (`prfm` never faults either).
            unsafe { std::arch::asm!("prfm pldl1keep, [{p}]", p = in(reg) ahead as *const u64, options(nostack, readonly, preserves_flags)) };
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

/// llama-bench's figures: prefill tokens/s per prompt length, decode tokens/s per depth.
struct LlamaBench {
    pp: Vec<(usize, f64)>,
    tg: Vec<(usize, f64)>,
}

fn llama_bench(dir: &std::path::Path, model: &std::path::Path, a: &Args) -> Result<LlamaBench> {
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let list = |v: &[usize]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",");
    let run = |args: &[String]| -> Result<serde_json::Value> {
        let out = std::process::Command::new(dir.join("llama-bench"))
            .arg("-m")
            .arg(model)
            .args(args)
            .args(["-r", &a.reps.to_string(), "-t", &threads.to_string(), "-o", "json"])
            .output()
            .with_context(|| format!("running {}/llama-bench", dir.display()))?;
        anyhow::ensure!(out.status.success(), "llama-bench failed: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).context("llama-bench JSON")
    };
    let mut r = LlamaBench { pp: Vec::new(), tg: Vec::new() };
    let v = run(&["-p".into(), list(&a.pp), "-n".into(), "0".into()])?;
    for row in v.as_array().into_iter().flatten() {
        if let (Some(p), Some(0)) = (row["n_prompt"].as_u64(), row["n_gen"].as_u64()) {
            r.pp.push((p as usize, row["avg_ts"].as_f64().unwrap_or(0.0)));
        }
    }
    let depths: Vec<usize> = std::iter::once(0).chain(a.depth.iter().copied()).collect();
    let v = run(&["-p".into(), "0".into(), "-n".into(), a.tg.to_string(), "-d".into(), list(&depths)])?;
    for row in v.as_array().into_iter().flatten() {
        if let (Some(0), Some(g)) = (row["n_prompt"].as_u64(), row["n_gen"].as_u64()) {
            if g as usize == a.tg {
                r.tg.push((row["n_depth"].as_u64().unwrap_or(0) as usize, row["avg_ts"].as_f64().unwrap_or(0.0)));
            }
        }
    }
    Ok(r)
}

fn lookup(v: &[(usize, f64)], k: usize) -> f64 {
    v.iter().find(|x| x.0 == k).map_or(0.0, |x| x.1)
}

pub fn run(a: Args) -> Result<()> {
    let hub = sapient_hub::Hub::new()?;
    let mut results = Vec::new();
    let mut measured = Vec::new();
    for preset in &a.presets {
        let r = hub.resolve(preset, &mut |_| {})?;
        let path = r.file("gguf")?.to_path_buf();
        let file_size = std::fs::metadata(&path)?.len() as f64;
        let size = decode_bytes(&path)?;
        let t0 = Instant::now();
        let max_pp = a.pp.iter().copied().max().unwrap_or(1).max(1);
        let max_depth = a.depth.iter().copied().max().unwrap_or(0);
        let mut m = sapient_llama::load(&path, &Device::Cpu, Some(max_pp.max(max_depth) + a.tg + 8))?;
        let load_s = t0.elapsed().as_secs_f64();
        let vocab = m.config().vocab_size as u32;
        let prompt: Vec<u32> = (0..max_pp.max(max_depth) as u32).map(|i| (i * 7919 + 13) % vocab).collect();
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
        // Prefill at every prompt length; the first is the headline (with time to first token).
        let mut pp_at = Vec::new();
        for (k, &n) in a.pp.iter().enumerate() {
            let mut rates = Vec::new();
            for _ in 0..a.reps {
                m.clear_cache();
                let t = Instant::now();
                m.forward_into(&prompt[..n], Logits::Last, &mut logits)?;
                let _first = argmax(&logits)?;
                let dt = t.elapsed().as_secs_f64();
                rates.push(n as f64 / dt);
                if k == 0 {
                    ttft.push(dt);
                }
            }
            if k == 0 {
                pp = rates.clone();
            }
            pp_at.push((n, median(rates)));
        }
        // Decode from an empty context and after each depth.
        let mut tg_at = Vec::new();
        for &d in std::iter::once(&0).chain(a.depth.iter()) {
            let mut rates = Vec::new();
            for _ in 0..a.reps {
                m.clear_cache();
                if d > 0 {
                    m.forward_into(&prompt[..d], Logits::Last, &mut logits)?;
                }
                let mut tok = 1u32;
                let t = Instant::now();
                for _ in 0..a.tg {
                    m.forward_into(&[tok], Logits::Last, &mut logits)?;
                    tok = argmax(&logits)?;
                }
                rates.push(a.tg as f64 / t.elapsed().as_secs_f64());
            }
            if d == 0 {
                tg = rates.clone();
            }
            tg_at.push((d, median(rates)));
        }
        let (pp, tg, ttft) = (median(pp), median(tg), median(ttft));
        let rss = rss_mb();
        let after = (bandwidth_gbs(true), bandwidth_gbs(false));
        drop(m);
        println!(
            "{preset}: pp{} {pp:.1} tok/s | tg{} {tg:.1} tok/s | ttft({} tokens) {ttft:.3}s | load {load_s:.2}s | RSS {rss:.0} MB (file {:.0} MB, {:.0} MB read per decoded token)",
            a.pp[0],
            a.tg,
            a.pp[0],
            file_size / 1e6,
            size / 1e6
        );
        let mut entry = serde_json::json!({
            "preset": preset, "file_bytes": file_size, "decode_bytes_per_token": size, "pp": a.pp[0], "tg": a.tg,
            "pp_tok_s": pp, "tg_tok_s": tg, "ttft_s": ttft, "load_s": load_s, "rss_mb": rss,
            "pp_at": pp_at, "tg_at_depth": tg_at,
        });
        for &(n, r) in pp_at.iter().skip(1) {
            println!("  pp{n} {r:.1} tok/s");
        }
        for &(d, r) in tg_at.iter().skip(1) {
            println!("  tg{} after {d} tokens {r:.1} tok/s", a.tg);
        }
        if let Some(dir) = &a.vs_llamacpp {
            let l = llama_bench(dir, &path, &a)?;
            let (lpp, ltg) = (lookup(&l.pp, a.pp[0]), lookup(&l.tg, 0));
            println!(
                "  llama.cpp: pp{} {lpp:.1} tok/s | tg{} {ltg:.1} tok/s  => sapient/llama.cpp: pp {:.2}x, tg {:.2}x",
                a.pp[0],
                a.tg,
                pp / lpp.max(1e-9),
                tg / ltg.max(1e-9)
            );
            for &(n, r) in pp_at.iter().skip(1) {
                let lr = lookup(&l.pp, n);
                println!("  llama.cpp pp{n} {lr:.1} tok/s => {:.2}x", r / lr.max(1e-9));
            }
            for &(d, r) in tg_at.iter().skip(1) {
                let lr = lookup(&l.tg, d);
                println!("  llama.cpp tg{} after {d} tokens {lr:.1} tok/s => {:.2}x", a.tg, r / lr.max(1e-9));
            }
            entry["llamacpp_pp_tok_s"] = lpp.into();
            entry["llamacpp_tg_tok_s"] = ltg.into();
            entry["llamacpp_pp_at"] = serde_json::json!(l.pp);
            entry["llamacpp_tg_at_depth"] = serde_json::json!(l.tg);
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
