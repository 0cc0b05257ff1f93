//! Timings of the kernels (ignored tests, run by hand with `--ignored --nocapture`).

use super::*;

/// Timing of the lane kernels against the row-at-a-time ones (not a test: run with
/// `cargo test --release -p sapient-tensor --lib lane_timing -- --ignored --nocapture`).
#[cfg(target_arch = "x86_64")]
#[test]
#[ignore]
fn lane_timing() {
    let only = std::env::var("ONLY").ok();
    let copies: usize = std::env::var("COPIES").ok().and_then(|c| c.parse().ok()).unwrap_or(1);
    if let Some(n) = std::env::var("AMX_ROWS").ok().and_then(|c| c.parse().ok()) {
        configure(KernelOptions { lanes_amx_rows: n, ..KernelOptions::default() }).expect("the first configuration");
    }
    for t in [QType::Q4_0, QType::Q4_1, QType::Q5_0, QType::Q8_0] {
        for (rows, cols) in [(128, 896), (896, 896), (4864, 896), (16384, 896), (151936, 896)] {
            if only.as_ref().is_some_and(|o| !format!("{t:?}{rows}").contains(o.as_str())) {
                continue;
            }
            let (w, _) = quantized(t, rows, cols, 1);
            let ws: Vec<QMatrix> = (0..copies).map(|_| QMatrix::from_bytes_unpacked(t, rows, cols, w.with_bytes(|b| b.to_vec()))).collect();
            let ps: Vec<QMatrix> = ws.iter().map(|w| w.packed_lanes().unwrap()).collect();
            if std::env::var_os("HUGE").is_some() {
                huge_pages_for(&ws.iter().chain(&ps).collect::<Vec<_>>());
            }
            let ms: Vec<usize> = std::env::var("MS").ok().map(|v| v.split(',').filter_map(|m| m.parse().ok()).collect()).unwrap_or(vec![1, 4, 16]);
            for &m in &ms {
                if rows > 100_000 && m > 1 {
                    continue;
                }
                let x = data(m * cols, 2);
                let mut out = vec![0f32; m * rows];
                let mut time = |ws: &[QMatrix]| {
                    let acts = QuantizedActs::for_matrix(&ws[0], &x, m);
                    let reps = (2000 / m).min(4_000_000 / rows).max(20) * copies;
                    let t0 = std::time::Instant::now();
                    for i in 0..reps {
                        ws[i % copies].matmul_quantized(&acts, &mut out);
                    }
                    t0.elapsed().as_secs_f64() / reps as f64 * 1e6
                };
                // GGML's layout (the kernels it takes here) and the packed one.
                let (a, c) = (time(&ws), time(&ps));
                println!("{t:?} {rows}x{cols} m={m}: GGML layout {a:.1} us, packed {c:.1} us ({:.2}x)", a / c);
            }
        }
    }
}

/// The activation quantizer's AVX2 and AVX-512 paths on a batch's rows (`cargo test
/// --release -p sapient-tensor --lib quantize_q8_timing -- --ignored --nocapture`; `ROWS=n`, 16 by default).
#[cfg(target_arch = "x86_64")]
#[test]
#[ignore]
fn quantize_q8_timing() {
    if !has_avx512() {
        return;
    }
    let rows: usize = std::env::var("ROWS").ok().and_then(|c| c.parse().ok()).unwrap_or(16).max(1);
    for cols in [576usize, 1536, 4864] {
        let x = data(rows * cols, 3);
        let mut b = vec![BlockQ8::default(); rows * cols / 32];
        let reps = 20_000_000 / (rows * cols);
        let mut time = |wide: bool| {
            let t0 = std::time::Instant::now();
            for _ in 0..reps {
                // SAFETY: AVX-512 (and so AVX2) checked above.
                unsafe {
                    if wide {
                        avx512::quantize_q8(std::hint::black_box(&x), &mut b);
                    } else {
                        avx2::quantize_q8(std::hint::black_box(&x), &mut b);
                    }
                }
            }
            t0.elapsed().as_secs_f64() / reps as f64 * 1e6
        };
        let (a, w, a2, w2) = (time(false), time(true), time(false), time(true));
        println!("{rows} x {cols}: avx2 {:.2} us, avx512 {:.2} us", a.min(a2), w.min(w2));
    }
}

/// The clock of the timing tests, in seconds: with `CPU_TIME` set, the kernels on one
/// thread and this thread's CPU time (which a busy machine disturbs less); else the
/// monotonic clock.
#[cfg(target_arch = "x86_64")]
fn timing_clock() -> impl Fn() -> f64 {
    let cpu_time = std::env::var_os("CPU_TIME").is_some();
    if cpu_time {
        configure(KernelOptions { threads: Some(1), ..KernelOptions::default() }).expect("the first configuration");
    }
    let clock = if cpu_time { libc::CLOCK_THREAD_CPUTIME_ID } else { libc::CLOCK_MONOTONIC };
    move || {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: a plain system call writing the timespec it is given.
        unsafe { libc::clock_gettime(clock, &mut ts) };
        ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
    }
}

/// Q4_K and Q6_K products of a 896x4864 matrix (Qwen2.5-0.5B's ffn_down) in GGML's layout on
/// the row-at-a-time AVX-512 kernels and packed on the sixteen-rows ones (`cargo test
/// --release -p sapient-tensor --lib k_lane_timing -- --ignored --nocapture`; `MS=1,4`;
/// `CPU_TIME=1`: one thread, timed by its CPU time, which a busy machine disturbs less).
#[cfg(target_arch = "x86_64")]
#[test]
#[ignore]
fn k_lane_timing() {
    let now = timing_clock();
    for t in [QType::Q4K, QType::Q6K] {
        let (rows, cols) = (896, 4864);
        let (w, _) = quantized(t, rows, cols, 1);
        // `COPIES=n`: cycle through n copies (from memory rather than cache once they exceed it).
        let copies: usize = std::env::var("COPIES").ok().and_then(|c| c.parse().ok()).unwrap_or(1);
        let ggmls: Vec<QMatrix> = (0..copies).map(|_| QMatrix::from_bytes_unpacked(t, rows, cols, w.with_bytes(|b| b.to_vec()))).collect();
        let packeds: Vec<QMatrix> = ggmls.iter().map(|g| g.packed_lanes().unwrap()).collect();
        let ms: Vec<usize> = std::env::var("MS").ok().map(|v| v.split(',').filter_map(|m| m.parse().ok()).collect()).unwrap_or(vec![1, 4, 8, 16]);
        for &m in &ms {
            let x = data(m * cols, 2);
            let mut out = vec![0f32; m * rows];
            let mut time = |ws: &[QMatrix]| {
                let acts = QuantizedActs::for_matrix(&ws[0], &x, m);
                let reps = (4000 / m).max(50).next_multiple_of(copies);
                ws[0].matmul_quantized(&acts, &mut out);
                let t0 = now();
                for i in 0..reps {
                    ws[i % copies].matmul_quantized(&acts, &mut out);
                }
                (now() - t0) / reps as f64 * 1e6
            };
            // Alternating, best of three each.
            let (mut a, mut c) = (f64::MAX, f64::MAX);
            for _ in 0..3 {
                a = a.min(time(&ggmls));
                c = c.min(time(&packeds));
            }
            println!("{t:?} {rows}x{cols} m={m}: GGML layout {a:.1} us, packed {c:.1} us ({:.2}x)", a / c);
        }
    }
}

/// The products of one decode step of a SmolLM2-135M-shaped model (30 layers of Q4_1 q, k,
/// v, o, gate, up, down at width 576, a Q8_0 49152x576 output layer), packed as a loader
/// packs them, for 1, 4 and 16 activation rows on the kernel pool (`cargo test --release -p
/// sapient-tensor --lib smol_step_timing -- --ignored --nocapture`; `MS=1,4`, `ROUNDS=n`;
/// `CPU_TIME=1` as for [`timing_clock`]; best of the rounds, the row counts alternating).
#[cfg(target_arch = "x86_64")]
#[test]
#[ignore]
fn smol_step_timing() {
    let now = timing_clock();
    let (d, ff, kv, vocab, layers) = (576usize, 1536usize, 192usize, 49152usize, 30usize);
    let shapes = [(d, d), (kv, d), (kv, d), (d, d), (ff, d), (ff, d), (d, ff)];
    let one: Vec<(QMatrix, usize, usize)> = shapes.iter().enumerate().map(|(i, &(r, c))| (quantized(QType::Q4_1, r, c, i as u64 + 1).0, r, c)).collect();
    let mut mats: Vec<QMatrix> = (0..layers)
        .flat_map(|_| one.iter().map(|(m, r, c)| QMatrix::from_bytes_unpacked(QType::Q4_1, *r, *c, m.with_bytes(|b| b.to_vec()))))
        .collect();
    mats.push(quantized(QType::Q8_0, vocab, d, 9).0);
    {
        let mut refs: Vec<&mut QMatrix> = mats.iter_mut().collect();
        pack_for_lanes(&mut refs);
    }
    let ms: Vec<usize> = std::env::var("MS").ok().map(|v| v.split(',').filter_map(|m| m.parse().ok()).collect()).unwrap_or(vec![1, 4, 16]);
    let rounds: usize = std::env::var("ROUNDS").ok().and_then(|c| c.parse().ok()).unwrap_or(5);
    let mut best = vec![[f64::MAX; 4]; ms.len()];
    for _ in 0..rounds {
        for (mi, &m) in ms.iter().enumerate() {
            let x = data(m * ff, 2);
            let (mut q, mut k, mut v, mut o) = (vec![0f32; m * d], vec![0f32; m * kv], vec![0f32; m * kv], vec![0f32; m * d]);
            let (mut g, mut u, mut dn, mut lg) = (vec![0f32; m * ff], vec![0f32; m * ff], vec![0f32; m * d], vec![0f32; m * vocab]);
            let reps = 8;
            let mut t = [0f64; 4];
            for _ in 0..reps {
                for l in 0..layers {
                    let w = &mats[7 * l..7 * l + 7];
                    let t0 = now();
                    matmul_group(&[&w[0], &w[1], &w[2]], &x[..m * d], m, &mut [&mut q, &mut k, &mut v]);
                    w[3].matmul(&x[..m * d], m, &mut o);
                    let t1 = now();
                    matmul_group(&[&w[4], &w[5]], &x[..m * d], m, &mut [&mut g, &mut u]);
                    let t2 = now();
                    w[6].matmul(&x[..m * ff], m, &mut dn);
                    let t3 = now();
                    t[0] += t1 - t0;
                    t[1] += t2 - t1;
                    t[2] += t3 - t2;
                }
                let t0 = now();
                mats[7 * layers].matmul(&x[..m * d], m, &mut lg);
                t[3] += now() - t0;
            }
            for (b, t) in best[mi].iter_mut().zip(t) {
                *b = b.min(t / reps as f64 * 1e3);
            }
        }
    }
    let base: f64 = best[0].iter().sum();
    for (&m, b) in ms.iter().zip(&best) {
        let s: f64 = b.iter().sum();
        println!("m={m:2}: step {s:.3} ms ({:.2}x of m={}; per row {:.3} ms) | qkv+o {:.3}, gate+up {:.3}, down {:.3}, output {:.3}", s / base, ms[0], s / m as f64, b[0], b[1], b[2], b[3]);
    }
}
