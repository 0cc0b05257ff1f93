//! `cargo xtask bench kernels`: throughput of sapient-tensor's quantized matrix kernels on
//! random matrices, for one machine's record (no reference in the same run: candle's own
//! quantized matmul is printed beside ours for the one-row case).
//!
//! - default (`gemv`): per format, the in-cache cost (thread CPU time, so run it with
//!   `SAPIENT_THREADS=1`) for 1, 4, 8, 64 and 512 activation rows, then one-row products
//!   streaming 256 MB of weights from memory (GB/s), and candle's kernel on cached weights;
//! - `--stream`: wall time per matrix for 1 to 9 activation rows with the weights streamed
//!   from memory (speculative verification's case); `--bytes 1` keeps one copy, read from
//!   cache where it fits.

use anyhow::Result;
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Module, Tensor};
use sapient_tensor::kernels::QMatrix;
use std::sync::Arc;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// Weight rows (default: 4864, or 8960 with --stream).
    #[arg(long)]
    pub rows: Option<usize>,
    /// Weight columns.
    #[arg(long, default_value_t = 1536)]
    pub cols: usize,
    /// Multi-row products streaming the weights from memory instead.
    #[arg(long)]
    pub stream: bool,
    /// Formats (default: all with a kernel; Q4_K,Q6_K with --stream).
    #[arg(long, value_delimiter = ',')]
    pub formats: Vec<String>,
    /// Bytes of distinct weight copies to cycle through (default 256 MiB, 512 MiB with
    /// --stream); 1 = a single copy.
    #[arg(long)]
    pub bytes: Option<usize>,
}

const FORMATS: [(&str, GgmlDType); 7] = [
    ("Q4_0", GgmlDType::Q4_0),
    ("Q4_1", GgmlDType::Q4_1),
    ("Q5_0", GgmlDType::Q5_0),
    ("Q8_0", GgmlDType::Q8_0),
    ("Q4_K", GgmlDType::Q4K),
    ("Q5_K", GgmlDType::Q5K),
    ("Q6_K", GgmlDType::Q6K),
];

pub fn run(a: Args) -> Result<()> {
    let default_formats: &[&str] = if a.stream { &["Q4_K", "Q6_K"] } else { &[] };
    let chosen: Vec<(&str, GgmlDType)> = FORMATS
        .into_iter()
        .filter(|(n, _)| {
            if a.formats.is_empty() {
                default_formats.is_empty() || default_formats.contains(n)
            } else {
                a.formats.iter().any(|f| f.eq_ignore_ascii_case(n))
            }
        })
        .collect();
    anyhow::ensure!(
        !chosen.is_empty(),
        "no format among {:?}",
        FORMATS.map(|f| f.0)
    );
    println!(
        "threads: {} (SAPIENT_THREADS)",
        sapient_tensor::kernels::pool::pool().threads()
    );
    if a.stream {
        stream(&a, &chosen)
    } else {
        gemv(&a, &chosen)
    }
}

/// A random `[rows, cols]` matrix quantized to `dt`, copied into distinct buffers until
/// the copies hold more than `total` bytes (enough of them to exceed the caches); also the
/// candle tensor they came from.
fn quantized_copies(
    dt: GgmlDType,
    rows: usize,
    cols: usize,
    total: usize,
) -> Result<(Arc<QTensor>, Vec<QMatrix>)> {
    let t = Tensor::randn(0f32, 1.0, (rows, cols), &Device::Cpu)?;
    let q = Arc::new(QTensor::quantize(&t, dt)?);
    let m = QMatrix::from_qtensor(&q).ok_or_else(|| anyhow::anyhow!("{dt:?} has no kernel"))?;
    let bytes = m.rows() * m.row_bytes();
    let mut mats: Vec<QMatrix> = (0..total / bytes + 1)
        .map(|_| {
            let mut b = vec![0u8; bytes];
            m.with_bytes(|s| b.copy_from_slice(s));
            Ok(QMatrix::from_bytes(m.qtype(), rows, cols, b)?)
        })
        .collect::<Result<_>>()?;
    // Laid out as a model loader lays them out (packed for the lane kernels where they apply).
    sapient_tensor::kernels::pack_for_lanes(&mut mats.iter_mut().collect::<Vec<_>>());
    Ok((q, mats))
}

/// CPU time of this thread (immune to other processes' load, unlike wall time).
fn cpu_time() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn gemv(a: &Args, formats: &[(&str, GgmlDType)]) -> Result<()> {
    let (rows, cols) = (a.rows.unwrap_or(4864), a.cols);
    for &(name, dt) in formats {
        let (q, mats) = quantized_copies(dt, rows, cols, a.bytes.unwrap_or(256 << 20))?;
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
            line += &format!(
                ", {mr} rows {:.1} GMAC/s ({:.2}x the single-row cost per row)",
                macs * mr as f64 / per / 1e9,
                per / mr as f64 / (ns_block * blocks_per * 1e-9)
            );
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
        // candle's own kernel on one copy for comparison
        let cq = candle_core::quantized::QMatMul::from_arc(q.clone())?;
        let xt = Tensor::from_slice(&x, (1, cols), &Device::Cpu)?;
        let st = Instant::now();
        let n = 20;
        for _ in 0..n {
            cq.forward(&xt)?;
        }
        let cs = st.elapsed().as_secs_f64();
        println!(
            "{name}: {ns_block:.2} ns/block in cache (thread CPU time, {:.1} GB/s)",
            blocks_per * m.qtype().block_bytes() as f64 / (ns_block * blocks_per)
        );
        println!(
            "{name}: ours {:.1} GB/s ({:.0} us per {rows}x{cols}), candle (cached) {:.1} GB/s",
            gb / s,
            s / (copies * reps) as f64 * 1e6,
            (bytes * n) as f64 / 1e9 / cs
        );
    }
    Ok(())
}

fn stream(a: &Args, formats: &[(&str, GgmlDType)]) -> Result<()> {
    let (rows, cols) = (a.rows.unwrap_or(8960), a.cols);
    for &(name, dt) in formats {
        let (_, mats) = quantized_copies(dt, rows, cols, a.bytes.unwrap_or(512 << 20))?;
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
            line += &format!(
                " m={mr} {:.0}us ({:.2}x, {:.0} GMAC/s)",
                per * 1e6,
                per / base,
                (rows * cols * mr) as f64 / per / 1e9
            );
        }
        println!("{line}");
    }
    Ok(())
}
