//! Multi-row products streaming weights from memory (speculative verification's case):
//! wall time per matrix for m = 1..9 activation rows, weights not in cache.
//! `cargo run --release -p sapient-tensor --example gemm_stream [rows cols]`
mod common;

use candle_core::quantized::GgmlDType;
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (rows, cols) = (args.first().copied().unwrap_or(8960), args.get(1).copied().unwrap_or(1536));
    for (name, dt) in [("Q4_K", GgmlDType::Q4K), ("Q6_K", GgmlDType::Q6K)] {
        let (_, mats) = common::quantized_copies(dt, rows, cols, 512 << 20)?;
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
            let reps = 3;
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
