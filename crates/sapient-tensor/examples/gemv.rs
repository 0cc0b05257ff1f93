//! Matrix-vector throughput of the quantized kernels, in GB/s of weights read.
//! `cargo run --release -p sapient-tensor --example gemv [rows cols]`
mod common;

use candle_core::quantized::GgmlDType;
use candle_core::{Device, Tensor};
use std::time::Instant;

/// CPU time of this thread (immune to other processes' load, unlike wall time).
fn cpu_time() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn main() -> anyhow::Result<()> {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (rows, cols) = (args.first().copied().unwrap_or(4864), args.get(1).copied().unwrap_or(1536));
    // Enough distinct matrices to exceed the caches (~256 MB of f32 source is too much; use 64 MB of weights).
    for (name, dt) in [("Q4_0", GgmlDType::Q4_0), ("Q4_1", GgmlDType::Q4_1), ("Q5_0", GgmlDType::Q5_0), ("Q8_0", GgmlDType::Q8_0), ("Q4_K", GgmlDType::Q4K), ("Q5_K", GgmlDType::Q5K), ("Q6_K", GgmlDType::Q6K)] {
        let (q, mats) = common::quantized_copies(dt, rows, cols, 256 << 20)?;
        let m = &mats[0];
        let bytes = m.rows() * m.row_bytes();
        let copies = mats.len();
        let x: Vec<f32> = (0..cols).map(|i| (i as f32).sin()).collect();
        let mut out = vec![0f32; rows];
        for mm in &mats {
            mm.matmul(&x, 1, &mut out);
        }
        let reps = 3;
        // Compute-bound: one small matrix that stays in L2, thread CPU time.
        let small = &mats[0];
        let t0 = cpu_time();
        let mut it = 0;
        while cpu_time() - t0 < 0.3 {
            small.matmul(&x, 1, &mut out);
            it += 1;
        }
        let blocks_per = (rows * cols / m.qtype().block_len()) as f64;
        let ns_block = (cpu_time() - t0) / (it as f64 * blocks_per) * 1e9;
        // Several activation rows at once (speculative verification, short batches, prefill).
        let macs = (rows * cols) as f64;
        let mut line = format!("{name}: 1 row {:.1} GMAC/s", macs / (ns_block * blocks_per));
        for mr in [4usize, 8, 64, 512] {
            let xm: Vec<f32> = (0..mr * cols).map(|i| (i as f32 * 0.37).sin()).collect();
            let mut outm = vec![0f32; mr * rows];
            let t0 = cpu_time();
            let mut itm = 0;
            while cpu_time() - t0 < 0.3 {
                small.matmul(&xm, mr, &mut outm);
                itm += 1;
            }
            let per = (cpu_time() - t0) / itm as f64;
            line += &format!(", {mr} rows {:.1} GMAC/s ({:.2}x the single-row cost per row)", macs * mr as f64 / per / 1e9, per / mr as f64 / (ns_block * blocks_per * 1e-9));
        }
        println!("{line} (thread CPU time; run with SAPIENT_THREADS=1)");
        let start = Instant::now();
        for _ in 0..reps {
            for mm in &mats {
                mm.matmul(&x, 1, &mut out);
            }
        }
        let s = start.elapsed().as_secs_f64();
        let gb = (bytes * copies * reps) as f64 / 1e9;
        // candle's own kernel on one copy set for comparison
        let cq = candle_core::quantized::QMatMul::from_arc(q.clone())?;
        let xt = Tensor::from_slice(&x, (1, cols), &Device::Cpu)?;
        use candle_core::Module;
        let st = Instant::now();
        let n = 20;
        for _ in 0..n {
            cq.forward(&xt)?;
        }
        let cs = st.elapsed().as_secs_f64();
        println!("{name}: {ns_block:.2} ns/block in cache (thread CPU time, {:.1} GB/s); ", blocks_per * m.qtype().block_bytes() as f64 / (ns_block * blocks_per));
        println!("{name}: ours {:.1} GB/s ({:.0} us per {rows}x{cols}), candle (cached) {:.1} GB/s", gb / s, s / (copies * reps) as f64 * 1e6, (bytes * n) as f64 / 1e9 / cs);
    }
    Ok(())
}
