//! Multi-row products streaming weights from memory (speculative verification's case):
//! wall time per matrix for m = 1..9 activation rows, weights not in cache.
//! `cargo run --release -p sapient-tensor --example gemm_stream [rows cols]`
//! (`GEMM_BYTES=1`: one copy of the matrix, read from cache where it fits;
//! `GEMM_FORMATS=Q5_0,Q8_0`: other formats than the default Q4_K,Q6_K.)
mod common;

use candle_core::quantized::GgmlDType;
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (rows, cols) = (args.first().copied().unwrap_or(8960), args.get(1).copied().unwrap_or(1536));
    let all = [("Q4_0", GgmlDType::Q4_0), ("Q4_1", GgmlDType::Q4_1), ("Q5_0", GgmlDType::Q5_0), ("Q8_0", GgmlDType::Q8_0), ("Q4_K", GgmlDType::Q4K), ("Q6_K", GgmlDType::Q6K)];
    let want = std::env::var("GEMM_FORMATS").unwrap_or_else(|_| "Q4_K,Q6_K".into());
    let total = std::env::var("GEMM_BYTES").ok().and_then(|v| v.parse().ok()).unwrap_or(512usize << 20);
    for (name, dt) in all.into_iter().filter(|(n, _)| want.split(',').any(|w| w == *n)) {
        let (_, mats) = common::quantized_copies(dt, rows, cols, total)?;
        let copies = mats.len();
        let mut line = format!("{name} {rows}x{cols}:");
        let mut base = 0.0;
        for mr in [1usize, 2, 3, 4, 5, 6, 8, 9] {
            let xm: Vec<f32> = (0..mr * cols).map(|i| (i as f32 * 0.37).sin()).collect();
            let mut outm = vec![0f32; mr * rows];
            for mm in &mats {
                mm.matmul(&xm, mr, &mut outm);
            }
            let st = Instant::now();
            let reps = if copies == 1 { 200 } else { 3 };
            for _ in 0..reps {
                for mm in &mats {
                    mm.matmul(&xm, mr, &mut outm);
                }
            }
            let per = st.elapsed().as_secs_f64() / (reps * copies) as f64;
            if mr == 1 {
                base = per;
            }
            line += &format!(" m={mr} {:.0}us ({:.2}x, {:.0} GMAC/s)", per * 1e6, per / base, (rows * cols * mr) as f64 / per / 1e9);
        }
        println!("{line}");
    }
    Ok(())
}
