//! Kernels against straightforward references on random data. Weights are quantized by
//! candle's own (independent) quantizers, so the block layouts are checked too.

use super::quant::{self, BlockQ8, BlockQ8K, QType};
use super::*;
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

mod attention;
#[cfg(target_arch = "x86_64")]
mod lanes_avx2;
mod mapped;
#[cfg(target_arch = "aarch64")]
mod neon;
mod timing;

const ALL: [QType; 8] = [
    QType::Q4_0,
    QType::Q4_1,
    QType::Q5_0,
    QType::Q5_1,
    QType::Q8_0,
    QType::Q4K,
    QType::Q5K,
    QType::Q6K,
];

fn candle_dtype(t: QType) -> GgmlDType {
    match t {
        QType::Q4_0 => GgmlDType::Q4_0,
        QType::Q4_1 => GgmlDType::Q4_1,
        QType::Q5_0 => GgmlDType::Q5_0,
        QType::Q5_1 => GgmlDType::Q5_1,
        QType::Q8_0 => GgmlDType::Q8_0,
        QType::Q4K => GgmlDType::Q4K,
        QType::Q5K => GgmlDType::Q5K,
        QType::Q6K => GgmlDType::Q6K,
    }
}

/// Deterministic pseudo-random values with a few outliers, like real weights.
fn data(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|i| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let u = ((s >> 33) as f32) / (1u64 << 31) as f32 - 0.5;
            if i % 97 == 13 {
                u * 8.0
            } else {
                u
            }
        })
        .collect()
}

fn quantized(t: QType, rows: usize, cols: usize, seed: u64) -> (QMatrix, Vec<f32>) {
    let w = data(rows * cols, seed);
    let tensor = Tensor::from_vec(w, (rows, cols), &Device::Cpu).unwrap();
    let q = Arc::new(QTensor::quantize(&tensor, candle_dtype(t)).unwrap());
    let deq = q.dequantize(&Device::Cpu).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    (QMatrix::from_qtensor(&q).expect("kernel format"), deq)
}

fn cols_for(t: QType) -> Vec<usize> {
    if t.k_quant() {
        vec![256, 512, 1536]
    } else {
        vec![32, 96, 576, 896]
    }
}

fn close(a: f32, b: f32, rel: f32) -> bool {
    (a - b).abs() <= rel * (1.0 + a.abs().max(b.abs()))
}

#[test]
fn dequantize_matches_candle() {
    for t in ALL {
        for cols in cols_for(t) {
            let (m, deq) = quantized(t, 5, cols, 1);
            let mut row = vec![0f32; cols];
            for r in 0..5 {
                m.dequantize_row(r, &mut row);
                for (k, (a, b)) in row.iter().zip(&deq[r * cols..(r + 1) * cols]).enumerate() {
                    assert!(close(*a, *b, 1e-6), "{t:?} cols={cols} row {r} col {k}: {a} vs {b}");
                }
            }
        }
    }
}

/// Dequantized activation values of a quantized row, for f32 reference dots.
fn deq_acts_q8(b: &[BlockQ8]) -> Vec<f32> {
    b.iter().flat_map(|b| b.qs.iter().map(move |&q| q as f32 * b.d)).collect()
}
fn deq_acts_q8k(b: &[BlockQ8K]) -> Vec<f32> {
    b.iter().flat_map(|b| b.qs.iter().map(move |&q| q as f32 * b.d)).collect()
}

#[test]
fn activation_quantization_is_accurate() {
    let x = data(1024, 7);
    let mut b = vec![BlockQ8::default(); 32];
    quant::quantize_q8(&x, &mut b);
    let back = deq_acts_q8(&b);
    for (blk, (xs, ys)) in x.chunks(32).zip(back.chunks(32)).enumerate() {
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (a, y) in xs.iter().zip(ys) {
            assert!((a - y).abs() <= amax / 127.0 * 0.51 + 1e-3 * amax, "block {blk}: {a} vs {y}");
        }
        let sum: i32 = b[blk].qs.iter().map(|&q| q as i32).sum();
        assert!(close(b[blk].s, sum as f32 * b[blk].d, 2e-3));
    }
    let mut bk = vec![BlockQ8K::default(); 4];
    quant::quantize_q8k(&x, &mut bk);
    let back = deq_acts_q8k(&bk);
    for (xs, (ys, b)) in x.chunks(256).zip(back.chunks(256).zip(&bk)) {
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (a, y) in xs.iter().zip(ys) {
            assert!((a - y).abs() <= amax / 127.0 * 0.51 + 1e-6, "{a} vs {y}");
        }
        for (i, s) in b.bsums.iter().enumerate() {
            assert_eq!(*s as i32, b.qs[16 * i..16 * i + 16].iter().map(|&q| q as i32).sum::<i32>());
        }
    }
}

/// Scalar and dispatched (AVX2 where present) dots agree with the f32 dot of the dequantized
/// weight and the dequantized activations (the same arithmetic, up to summation order).
#[test]
fn dots_match_dequantized_reference() {
    for t in ALL {
        for cols in cols_for(t) {
            let rows = 9;
            let (m, deq) = quantized(t, rows, cols, 2 + cols as u64);
            let x = data(cols, 99);
            let acts = QuantizedActs::for_matrix(&m, &x, 1);
            let xa = if t.k_quant() { deq_acts_q8k(acts.row_q8k(0)) } else { deq_acts_q8(acts.row_q8(0)) };
            let rb = m.row_bytes();
            m.with_bytes(|bytes| {
                for r in 0..rows {
                    let w = &bytes[r * rb..(r + 1) * rb];
                    let wr = &deq[r * cols..(r + 1) * cols];
                    let want: f32 = wr.iter().zip(&xa).map(|(a, b)| a * b).sum();
                    let scale: f32 = wr.iter().zip(&xa).map(|(a, b)| (a * b).abs()).sum::<f32>() + 1e-6;
                    let (scalar, fast) = if t.k_quant() {
                        let a = acts.row_q8k(0);
                        let s = match t {
                            QType::Q4K => quant::dot_q4k(w, a),
                            QType::Q5K => quant::dot_q5k(w, a),
                            _ => quant::dot_q6k(w, a),
                        };
                        (s, dot_row_q8k(t, w, a))
                    } else {
                        let a = acts.row_q8(0);
                        let s = match t {
                            QType::Q4_0 => quant::dot_q4_0(w, a),
                            QType::Q4_1 => quant::dot_q4_1(w, a),
                            QType::Q5_0 => quant::dot_q5_0(w, a),
                            QType::Q5_1 => quant::dot_q5_1(w, a),
                            _ => quant::dot_q8_0(w, a),
                        };
                        (s, dot_row_q8(t, w, a))
                    };
                    // Q4_1/Q5_1 use the f16-rounded block sum `s`: slightly looser.
                    let tol = if matches!(t, QType::Q4_1 | QType::Q5_1) { 2e-3 } else { 1e-5 };
                    assert!((scalar - want).abs() <= tol * scale, "{t:?} cols={cols} row {r}: scalar {scalar} vs {want}");
                    assert!((fast - scalar).abs() <= 1e-5 * scale, "{t:?} cols={cols} row {r}: simd {fast} vs scalar {scalar}");
                    // Each SIMD variant this CPU has, not only the one dispatch picks.
                    #[cfg(target_arch = "x86_64")]
                    if has_avx2() && !t.k_quant() {
                        let a = acts.row_q8(0);
                        let (mut plain, mut vnni) = ([0f32], [0f32]);
                        // SAFETY: AVX2/FMA/F16C present (AVX-VNNI checked).
                        unsafe {
                            match t {
                                QType::Q4_0 => super::avx2::rows_q4_0(w, &[a], &mut plain),
                                QType::Q4_1 => super::avx2::rows_q4_1(w, &[a], &mut plain),
                                QType::Q5_0 => super::avx2::rows_q5_0(w, &[a], &mut plain),
                                QType::Q5_1 => super::avx2::rows_q5_1(w, &[a], &mut plain),
                                _ => super::avx2::rows_q8_0(w, &[a], &mut plain),
                            }
                            if has_vnni() {
                                match t {
                                    QType::Q4_0 => super::avx2::rows_q4_0_vnni(w, &[a], &mut vnni),
                                    QType::Q4_1 => super::avx2::rows_q4_1_vnni(w, &[a], &mut vnni),
                                    QType::Q5_0 => super::avx2::rows_q5_0_vnni(w, &[a], &mut vnni),
                                    QType::Q5_1 => super::avx2::rows_q5_1_vnni(w, &[a], &mut vnni),
                                    _ => super::avx2::rows_q8_0_vnni(w, &[a], &mut vnni),
                                }
                                assert_eq!(vnni[0].to_bits(), plain[0].to_bits(), "{t:?}: avx-vnni and avx2 must agree exactly");
                            }
                        }
                        assert!((plain[0] - scalar).abs() <= 1e-5 * scale, "{t:?}: avx2 {} vs scalar {scalar}", plain[0]);
                    }
                }
            });
        }
    }
}

/// The whole product against an f32 matmul of the dequantized weight and the original input:
/// the only difference is the 8-bit activation quantization.
#[test]
fn matmul_matches_f32_within_quantization_error() {
    for t in ALL {
        for cols in cols_for(t) {
            for (rows, m) in [(1, 1), (37, 1), (300, 3), (64, 17)] {
                let (w, deq) = quantized(t, rows, cols, 5);
                let x = data(m * cols, 11);
                let mut out = vec![0f32; m * rows];
                w.matmul(&x, m, &mut out);
                for i in 0..m {
                    for j in 0..rows {
                        let wr = &deq[j * cols..(j + 1) * cols];
                        let xr = &x[i * cols..(i + 1) * cols];
                        let want: f32 = wr.iter().zip(xr).map(|(a, b)| a * b).sum();
                        let norm = (wr.iter().map(|v| v * v).sum::<f32>() * xr.iter().map(|v| v * v).sum::<f32>()).sqrt();
                        let got = out[i * rows + j];
                        assert!((got - want).abs() <= 0.02 * norm + 1e-5, "{t:?} [{rows}x{cols}] x{m} ({i},{j}): {got} vs {want}");
                    }
                }
            }
        }
    }
}

/// The sixteen-rows kernels return their documented arithmetic bit for bit, for every number
/// of activation rows, whole and partial groups of weight rows, and odd block counts.
#[cfg(target_arch = "x86_64")]
#[test]
fn lane_kernels_match_their_reference() {
    if !has_lanes() {
        eprintln!("skipped: this CPU has no AVX-512 BITALG (or the lane kernels are off)");
        return;
    }
    for t in ALL.into_iter().filter(|t| lanes::computes(*t) && !t.k_quant()) {
        for cols in [32, 96, 576] {
            for (rows, m) in [(1, 1), (15, 1), (16, 3), (37, 1), (37, 9), (130, 17), (48, 8), (100, 70)] {
                let (w, _) = quantized(t, rows, cols, 5 + cols as u64 + rows as u64);
                let x = data(m * cols, 6 + m as u64);
                let acts = QuantizedActs::for_lane_kernels(t, &x, m, cols);
                let rb = w.row_bytes();
                let raw = w.with_bytes(|b| b.to_vec());
                // Both layouts: GGML's blocks and the packed one (which keeps every byte).
                let ggml = QMatrix::from_bytes_unpacked(t, rows, cols, raw.clone());
                let packed = ggml.packed_lanes().expect("a lane format");
                assert!(packed.is_packed() && !ggml.is_packed());
                assert!(packed.with_bytes(|b| b == &raw[..]), "{t:?} [{rows}x{cols}]: packing lost bytes");
                for w in [&ggml, &packed] {
                    let mut out = vec![0f32; m * rows];
                    w.matmul_quantized(&acts, &mut out);
                    for i in 0..m {
                        for j in 0..rows {
                            let want = lanes::reference(t, &raw[j * rb..(j + 1) * rb], acts.row_q8(i));
                            let got = out[i * rows + j];
                            assert_eq!(got.to_bits(), want.to_bits(), "{t:?} [{rows}x{cols}] x{m} ({i},{j}) packed {}: {got} vs {want}", w.is_packed());
                        }
                    }
                }
                // Rows read back from the packed layout: dequantized and gathered.
                let (mut a, mut b) = (vec![0f32; cols], vec![0f32; cols]);
                for r in [0, rows / 2, rows - 1] {
                    ggml.dequantize_row(r, &mut a);
                    packed.dequantize_row(r, &mut b);
                    assert_eq!(a, b);
                }
                let ids = [rows - 1, 0, rows / 3];
                let g = packed.gather_rows(&ids).unwrap();
                assert!(g.with_bytes(|gb| ids.iter().enumerate().all(|(k, &r)| gb[k * rb..(k + 1) * rb] == raw[r * rb..(r + 1) * rb])));
            }
        }
    }
}

/// The Q4_K and Q6_K sixteen-rows kernels return their documented arithmetic bit for bit
/// (so every row of a batch is what it gives alone) for 1..=40 activation rows, whole and
/// partial groups of weight rows; that is also what the exact k-quant kernels of `avx512`
/// (the AMX kernels' arithmetic) give. Packing keeps every byte.
#[cfg(target_arch = "x86_64")]
#[test]
fn k_lane_kernels_match_their_reference() {
    if !has_lanes() {
        eprintln!("skipped: this CPU has no AVX-512 BITALG (or the lane kernels are off)");
        return;
    }
    for t in [QType::Q4K, QType::Q6K] {
        for (rows, cols) in [(1, 256), (15, 512), (16, 256), (37, 768), (130, 256)] {
            let (w, _) = quantized(t, rows, cols, 41 + cols as u64 + rows as u64);
            let rb = w.row_bytes();
            let raw = w.with_bytes(|b| b.to_vec());
            let packed = QMatrix::from_bytes_unpacked(t, rows, cols, raw.clone()).packed_lanes().expect("a lane format");
            assert!(packed.is_packed());
            assert!(packed.with_bytes(|b| b == &raw[..]), "{t:?} [{rows}x{cols}]: packing lost bytes");
            const M: usize = 40;
            let x = data(M * cols, 9 + rows as u64);
            let all = QuantizedActs::for_lane_kernels(t, &x, M, cols);
            let (rawr, allr) = (&raw, &all);
            let want: Vec<f32> = (0..M).flat_map(|i| (0..rows).map(move |j| lanes_k::reference(t, &rawr[j * rb..(j + 1) * rb], allr.row_q8k(i)))).collect();
            // The exact AVX-512 kernels, one activation row at a time.
            let nsb = cols / 256;
            for i in 0..M {
                let mut bk = vec![super::avx512::BlockK::default(); nsb];
                super::avx512::blockk_from(all.row_q8k(i), &mut bk);
                for j in 0..rows {
                    let mut o = [0f32; 1];
                    // SAFETY: has_lanes() implies the AVX-512 features; rows are `cols` long.
                    unsafe {
                        if t == QType::Q4K {
                            super::avx512::rows_q4k_x(&raw[j * rb..(j + 1) * rb], &[&bk], &mut o)
                        } else {
                            super::avx512::rows_q6k_x(&raw[j * rb..(j + 1) * rb], &[&bk], &mut o)
                        }
                    }
                    assert_eq!(o[0].to_bits(), want[i * rows + j].to_bits(), "{t:?} [{rows}x{cols}] ({i},{j}): avx-512 exact {} vs reference {}", o[0], want[i * rows + j]);
                }
            }
            for m in 1..=M {
                // Rows `a0..a0 + m` of the 40 as one batch.
                let a0 = (M - m) / 2;
                let acts = QuantizedActs::for_lane_kernels(t, &x[a0 * cols..(a0 + m) * cols], m, cols);
                let mut out = vec![0f32; m * rows];
                packed.matmul_quantized(&acts, &mut out);
                for i in 0..m {
                    for j in 0..rows {
                        let (got, want) = (out[i * rows + j], want[(a0 + i) * rows + j]);
                        assert_eq!(got.to_bits(), want.to_bits(), "{t:?} [{rows}x{cols}] x{m} ({},{j}): {got} vs {want}", a0 + i);
                    }
                }
            }
            // Rows read back from the packed layout: dequantized and gathered.
            let (mut a, mut b) = (vec![0f32; cols], vec![0f32; cols]);
            for r in [0, rows / 2, rows - 1] {
                w.dequantize_row(r, &mut a);
                packed.dequantize_row(r, &mut b);
                assert_eq!(a, b);
            }
            let ids = [rows - 1, 0, rows / 3];
            let g = packed.gather_rows(&ids).unwrap();
            assert!(g.with_bytes(|gb| ids.iter().enumerate().all(|(k, &r)| gb[k * rb..(k + 1) * rb] == raw[r * rb..(r + 1) * rb])));
        }
    }
}

/// A batch of rows gives bit-identical results to the same rows one at a time.
#[test]
fn batched_rows_equal_single_rows() {
    for t in ALL {
        let cols = *cols_for(t).last().unwrap();
        let rows = 200;
        let (w, _) = quantized(t, rows, cols, 3);
        let m = 11; // two groups of four and a remainder of three
        let x = data(m * cols, 4);
        let mut all = vec![0f32; m * rows];
        w.matmul(&x, m, &mut all);
        for i in 0..m {
            let mut one = vec![0f32; rows];
            w.matmul(&x[i * cols..(i + 1) * cols], 1, &mut one);
            assert_eq!(one, all[i * rows..(i + 1) * rows], "{t:?} row {i}");
        }
    }
}

#[test]
fn from_bytes_checks_sizes() {
    assert!(QMatrix::from_bytes(QType::Q8_0, 2, 32, vec![0; 68]).is_ok());
    let e = QMatrix::from_bytes(QType::Q8_0, 2, 32, vec![0; 67]).unwrap_err();
    assert!(e.to_string().contains("needs 68 bytes"), "{e}");
    assert!(QMatrix::from_bytes(QType::Q4K, 1, 100, vec![]).is_err());
    // A matrix of no rows (a restricted output layer's empty head) multiplies to nothing.
    let empty = QMatrix::from_bytes(QType::Q8_0, 0, 64, vec![]).unwrap();
    for m in [1, 3, 9] {
        empty.matmul(&data(m * 64, 3), m, &mut []);
    }
}

#[test]
fn f32_helpers() {
    let x = data(37, 1);
    let y = data(37, 2);
    let want: f32 = x.iter().zip(&y).map(|(a, b)| a * b).sum();
    assert!(close(dot_f32(&x, &y), want, 1e-5));
}

#[test]
fn f16_helpers() {
    let x = data(45, 3);
    let y = data(45, 4);
    let mut yh = vec![0u16; 45];
    f32_to_f16(&y, &mut yh);
    let yr: Vec<f32> = yh.iter().map(|b| half::f16::from_bits(*b).to_f32()).collect();
    for (a, b) in y.iter().zip(&yr) {
        assert!((a - b).abs() <= a.abs() * 1e-3 + 1e-7, "{a} vs {b}");
    }
    let want: f32 = x.iter().zip(&yr).map(|(a, b)| a * b).sum();
    assert!(close(dot_f32_f16(&x, &yh), want, 1e-5));
    let mut z = x.clone();
    axpy_f16(-0.25, &yh, &mut z);
    for ((zi, xi), yi) in z.iter().zip(&x).zip(&yr) {
        assert!(close(*zi, xi - 0.25 * yi, 1e-6));
    }
}

/// The AVX-512 kernels (when this CPU has them) agree with the AVX2 ones on every format
/// they take (bit for bit but for Q6_K), for single rows, full groups of eight and remainders, and odd block
/// counts (a pair with one block).
#[test]
fn wide_kernels_match_narrow() {
    if !has_avx512() {
        eprintln!("skipped: this CPU has no AVX-512 VNNI");
        return;
    }
    for t in ALL.into_iter().filter(|t| wide_format(*t)) {
        for cols in cols_for(t) {
            for (rows, m) in [(3, 1), (37, 1), (517, 1), (37, 9), (130, 17)] {
                let (w, deq) = quantized(t, rows, cols, 21 + cols as u64);
                let x = data(m * cols, 8);
                let narrow = QuantizedActs::with_kernels(t, &x, m, cols, false);
                let wide = QuantizedActs::with_kernels(t, &x, m, cols, true);
                assert!((wide.wide || wide.amx_g != 0 || wide.lanes) && !narrow.wide && narrow.amx_g == 0 && !narrow.lanes);
                let (mut a, mut b) = (vec![0f32; m * rows], vec![0f32; m * rows]);
                w.matmul_quantized(&narrow, &mut a);
                w.matmul_quantized(&wide, &mut b);
                for i in 0..m {
                    let xa = if t.k_quant() { deq_acts_q8k(narrow.row_q8k(i)) } else { deq_acts_q8(narrow.row_q8(i)) };
                    for j in 0..rows {
                        let wr = &deq[j * cols..(j + 1) * cols];
                        let scale: f32 = wr.iter().zip(&xa).map(|(p, q)| (p * q).abs()).sum::<f32>() + 1e-6;
                        let (n, v) = (a[i * rows + j], b[i * rows + j]);
                        assert!((n - v).abs() <= 2e-5 * scale, "{t:?} [{rows}x{cols}] x{m} ({i},{j}): avx-512 {v} vs {n}");
                        // The row-at-a-time AVX-512 kernels of the 32-value formats reduce in
                        // the AVX2 kernels' order: bit-identical (with AVX-VNNI or AVX2 on the
                        // narrow side, which agree exactly). The lane kernels sum each block
                        // exactly instead (`lane_kernels_match_their_reference`).
                        if !t.k_quant() && has_avx2() && !wide.lanes {
                            assert_eq!(n.to_bits(), v.to_bits(), "{t:?} [{rows}x{cols}] x{m} ({i},{j}): avx-512 {v} vs {n}");
                        }
                    }
                }
            }
        }
    }
}

/// The AMX kernels (when this machine grants them): batches of every size class against the
/// portable dot of each (weight row, activation row), and bit-identical to the one-row
/// products; row counts that are not a multiple of the 16-row tile.
#[test]
#[cfg(target_arch = "x86_64")]
fn amx_kernels_match_reference_and_single_rows() {
    if !has_amx() {
        eprintln!("skipped: no AMX tile state on this machine");
        return;
    }
    for t in [QType::Q4K, QType::Q6K] {
        for cols in [256, 1536] {
            for (rows, m) in [(16, 2), (37, 5), (130, 8), (45, 9), (33, 17), (20, 3)] {
                let (w, _) = quantized(t, rows, cols, 31 + cols as u64 + m as u64);
                let x = data(m * cols, 12 + m as u64);
                let acts = QuantizedActs::for_matrix(&w, &x, m);
                let want_amx = super::amx::use_for(t, m);
                assert_eq!(acts.amx_g, if want_amx { super::amx::groups(t) } else { 0 });
                let mut all = vec![0f32; m * rows];
                w.matmul_quantized(&acts, &mut all);
                let rb = w.row_bytes();
                for i in 0..m {
                    let mut one = vec![0f32; rows];
                    w.matmul(&x[i * cols..(i + 1) * cols], 1, &mut one);
                    let a = acts.row_q8k(i);
                    w.with_bytes(|bytes| {
                        for j in 0..rows {
                            let wr = &bytes[j * rb..(j + 1) * rb];
                            let want = if t == QType::Q4K { quant::dot_q4k(wr, a) } else { quant::dot_q6k(wr, a) };
                            let got = all[i * rows + j];
                            assert!(close(got, want, 1e-5), "{t:?} [{rows}x{cols}] x{m} ({i},{j}): amx {got} vs {want}");
                            assert_eq!(got.to_bits(), one[j].to_bits(), "{t:?} [{rows}x{cols}] x{m} ({i},{j}): batch {got} vs one row {}", one[j]);
                        }
                    });
                }
                // The AVX-512 kernels with the same arithmetic (used where AMX is slower), in
                // groups of up to 8 rows: bit-identical too.
                let nsb = cols / 256;
                let mut bk = vec![super::avx512::BlockK::default(); m * nsb];
                for i in 0..m {
                    super::avx512::blockk_from(acts.row_q8k(i), &mut bk[i * nsb..(i + 1) * nsb]);
                }
                w.with_bytes(|bytes| {
                    for j in 0..rows {
                        let wr = &bytes[j * rb..(j + 1) * rb];
                        for i0 in (0..m).step_by(8) {
                            let g = (m - i0).min(8);
                            let rs: Vec<&[super::avx512::BlockK]> = (i0..i0 + g).map(|i| &bk[i * nsb..(i + 1) * nsb]).collect();
                            let mut o = [0f32; 8];
                            // SAFETY: has_amx() implies the AVX-512 features; rows are `cols` long.
                            unsafe {
                                if t == QType::Q4K {
                                    super::avx512::rows_q4k_x(wr, &rs, &mut o)
                                } else {
                                    super::avx512::rows_q6k_x(wr, &rs, &mut o)
                                }
                            }
                            for k in 0..g {
                                let want = all[(i0 + k) * rows + j];
                                assert_eq!(o[k].to_bits(), want.to_bits(), "{t:?} [{rows}x{cols}] x{m} ({},{j}): avx-512 exact {} vs amx {want}", i0 + k, o[k]);
                            }
                        }
                    }
                });
            }
        }
    }
}

/// The dispatched (SIMD) activation quantizers give exactly the portable ones' blocks, ties
/// included (away from zero), and sums that match their values. A zero block stays zero.
#[test]
fn simd_quantizers_match_portable() {
    // 67 blocks: sixteen at a time and three alone on the AVX-512 path.
    let mut x = data(2144, 17);
    x[256..512].fill(0.0);
    x[40] = -9.0; // a negative largest value
    // Scales whose f16 is subnormal, and sums whose f16 overflows.
    for (i, v) in x[1024..1056].iter_mut().enumerate() {
        *v = if i % 3 == 0 { 1e-5 } else { -4e-6 };
    }
    x[1056..1088].fill(1e5);
    x[2112] = -4e5;
    // A block of exact ties: scale 1, values k + 0.5 of both signs.
    let ties = [127.0f32, -30.5, 2.5, -0.5, 0.5, 1.5, -1.5, 126.5];
    for (i, v) in x[512..544].iter_mut().enumerate() {
        *v = ties[i % ties.len()];
    }
    let mut a = vec![BlockQ8::default(); 67];
    let mut b = vec![BlockQ8::default(); 67];
    quant::quantize_q8(&x, &mut a);
    quantize_q8(&x, &mut b);
    assert!(a[32].d > 0.0 && a[32].d < half::f16::MIN_POSITIVE.to_f32(), "a subnormal f16 scale");
    assert!(a[33].s.is_infinite() && a[66].s.is_infinite() && a[33].d.is_finite(), "sums beyond f16");
    for (i, (p, q)) in a.iter().zip(&b).enumerate() {
        assert_eq!(p.d.to_bits(), q.d.to_bits(), "block {i}");
        assert_eq!(p.qs, q.qs, "block {i}");
        assert_eq!(p.s.to_bits(), q.s.to_bits(), "block {i}");
        let sum: i32 = q.qs.iter().map(|&v| v as i32).sum();
        assert!(close(q.s, sum as f32 * q.d, 2e-3) || (q.s.is_infinite() && [33, 66].contains(&i)), "block {i}");
    }
    // Each SIMD path on its own (the dispatch above takes the widest).
    #[cfg(target_arch = "x86_64")]
    for (name, have) in [("avx2", has_avx2()), ("avx512", has_avx512())] {
        if !have {
            continue;
        }
        let mut c = vec![BlockQ8::default(); 67];
        // SAFETY: the instruction set checked just above.
        unsafe {
            if name == "avx2" {
                avx2::quantize_q8(&x, &mut c);
            } else {
                avx512::quantize_q8(&x, &mut c);
            }
        }
        for (i, (p, q)) in a.iter().zip(&c).enumerate() {
            assert_eq!((p.d.to_bits(), p.s.to_bits(), p.qs), (q.d.to_bits(), q.s.to_bits(), q.qs), "{name} block {i}");
        }
    }
    let mut a = vec![BlockQ8K::default(); 8];
    let mut b = vec![BlockQ8K::default(); 8];
    quant::quantize_q8k(&x, &mut a);
    quantize_q8k(&x, &mut b);
    for (i, (p, q)) in a.iter().zip(&b).enumerate() {
        assert_eq!(p.d.to_bits(), q.d.to_bits(), "block {i}");
        assert_eq!(p.qs, q.qs, "block {i}");
        assert_eq!(p.bsums, q.bsums, "block {i}");
    }
    assert!(b[1].qs.iter().all(|&v| v == 0) && b[1].d == 0.0);
}

/// One dispatch over several matrices of the same input (q/k/v, gate/up) gives exactly the
/// separate products, with formats that share an activation layout and ones that do not,
/// for decode-sized and batch inputs, on the pool and inline.
#[test]
fn matmul_group_matches_separate_products() {
    let cols = 512;
    let groups: [&[(QType, usize)]; 3] = [
        &[(QType::Q4_1, 37), (QType::Q8_0, 130), (QType::Q4_1, 5)],
        &[(QType::Q4K, 64), (QType::Q6K, 300), (QType::Q5K, 17), (QType::Q4K, 3)],
        &[(QType::Q4_0, 600)],
    ];
    for (gi, group) in groups.iter().enumerate() {
        let mats: Vec<QMatrix> = group.iter().enumerate().map(|(k, &(t, rows))| quantized(t, rows, cols, 7 + 31 * gi as u64 + k as u64).0).collect();
        for m in [1, 3, 9, 40] {
            let x = data(m * cols, 5 + m as u64);
            let want: Vec<Vec<f32>> = mats
                .iter()
                .map(|w| {
                    let mut o = vec![0f32; m * w.rows()];
                    w.matmul(&x, m, &mut o);
                    o
                })
                .collect();
            let mut got: Vec<Vec<f32>> = mats.iter().map(|w| vec![f32::NAN; m * w.rows()]).collect();
            let refs: Vec<&QMatrix> = mats.iter().collect();
            let mut outs: Vec<&mut [f32]> = got.iter_mut().map(|v| v.as_mut_slice()).collect();
            matmul_group(&refs, &x, m, &mut outs);
            for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                let same = g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "group {gi}, matrix {k} ({:?}), m = {m}: differs from its own product", group[k].0);
            }
        }
    }
}

/// Rows made by a `prep` in the quantization job (a residual add and a scaling here, on
/// packed and unpacked formats, one shared layout and two) give exactly the products of the
/// rows made first, and `x` ends up holding the prepared rows, on the pool and inline.
#[test]
fn matmul_group_prep_matches_prepared_input() {
    let cols = 512;
    let groups: [&[(QType, usize)]; 2] = [&[(QType::Q4_1, 70), (QType::Q4_1, 33)], &[(QType::Q4K, 64), (QType::Q6K, 40)]];
    for (gi, group) in groups.iter().enumerate() {
        let mut mats: Vec<QMatrix> = group.iter().enumerate().map(|(k, &(t, rows))| quantized(t, rows, cols, 3 + 17 * gi as u64 + k as u64).0).collect();
        #[cfg(target_arch = "x86_64")]
        if gi == 0 && has_lanes() {
            mats[1] = mats[1].packed_lanes().unwrap();
        }
        for m in [1, 2, 5, 16, 40] {
            let (a, b) = (data(m * cols, 11 + m as u64), data(m * cols, 12 + m as u64));
            let make = |r: std::ops::Range<usize>, rows: &mut [f32]| {
                for (i, v) in rows.iter_mut().enumerate() {
                    let j = r.start * cols + i;
                    *v = (a[j] + b[j]) * 0.75;
                }
            };
            let mut x = vec![0f32; m * cols];
            make(0..m, &mut x);
            let want: Vec<Vec<f32>> = mats
                .iter()
                .map(|w| {
                    let mut o = vec![0f32; m * w.rows()];
                    w.matmul(&x, m, &mut o);
                    o
                })
                .collect();
            let mut got: Vec<Vec<f32>> = mats.iter().map(|w| vec![f32::NAN; m * w.rows()]).collect();
            let refs: Vec<&QMatrix> = mats.iter().collect();
            let mut outs: Vec<&mut [f32]> = got.iter_mut().map(|v| v.as_mut_slice()).collect();
            let mut xp = vec![f32::NAN; m * cols];
            matmul_group_prep(&refs, &mut xp, m, &mut outs, &make);
            assert!(xp.iter().zip(&x).all(|(p, q)| p.to_bits() == q.to_bits()), "group {gi}, m = {m}: prepared rows differ");
            for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(g.iter().zip(w).all(|(p, q)| p.to_bits() == q.to_bits()), "group {gi}, matrix {k}, m = {m}: differs");
            }
        }
    }
}

#[test]
fn huge_pages_keep_weights_and_products() {
    // Several matrices of a few MiB, as a model's are, then the advice over the stretch they
    // span: the bytes and the products must come out the same (Linux copies the pages into
    // huge pages where it can; elsewhere nothing happens).
    let mats: Vec<(QMatrix, Vec<u8>)> = [(QType::Q5_0, 2304usize, 1024usize), (QType::Q8_0, 3072, 1024), (QType::Q6K, 1024, 2048)]
        .into_iter()
        .enumerate()
        .map(|(i, (t, rows, cols))| {
            let (m, _) = quantized(t, rows, cols, 40 + i as u64);
            let b = m.with_bytes(|b| b.to_vec());
            (m, b)
        })
        .collect();
    let x = data(4 * 2048, 9);
    let before: Vec<Vec<f32>> = mats
        .iter()
        .map(|(m, _)| {
            let mut out = vec![0f32; 4 * m.rows()];
            m.matmul(&x[..4 * m.cols()], 4, &mut out);
            out
        })
        .collect();
    huge_pages_for(&mats.iter().map(|(m, _)| m).collect::<Vec<_>>());
    for ((m, bytes), want) in mats.iter().zip(&before) {
        assert!(m.with_bytes(|b| b == &bytes[..]), "{:?} weights changed", m.qtype());
        let mut out = vec![0f32; 4 * m.rows()];
        m.matmul(&x[..4 * m.cols()], 4, &mut out);
        assert_eq!(&out, want, "{:?} product changed", m.qtype());
        for r in [1, 3] {
            // One row (the streaming-prefetch range kernels) equals that row of the batch.
            let mut one = vec![0f32; m.rows()];
            m.matmul(&x[(r - 1) * m.cols()..r * m.cols()], 1, &mut one);
            assert_eq!(&one[..], &want[(r - 1) * m.rows()..r * m.rows()], "{:?} row {r}", m.qtype());
        }
    }
}

#[test]
fn silu_mul_matches_portable_and_f64() {
    // Values across the range SwiGLU sees, the clamp edges and beyond, odd lengths (SIMD
    // body plus portable tail).
    let mut g: Vec<f32> = data(1003, 21).iter().map(|v| v * 12.0).collect();
    g.extend([0.0, -0.0, 1e-30, -1e-30, 87.5, -87.5, 88.5, -88.5, 100.0, -100.0, 1e4, -1e4, 0.5, -0.5, 20.0]);
    let u = data(g.len(), 22);
    let mut fast = g.clone();
    silu_mul(&mut fast, &u);
    for (i, ((&x, &uv), &got)) in g.iter().zip(&u).zip(&fast).enumerate() {
        let portable = x / (1.0 + exp_approx(-x)) * uv;
        assert_eq!(got.to_bits(), portable.to_bits(), "value {i}: x {x}: {got} vs portable {portable}");
        let exact = (x as f64 / (1.0 + (-(x as f64)).exp()) * uv as f64) as f32;
        // Below f32's normal range (e^-x overflows for x < -88.7) only the absolute error counts.
        let tol = (4.0 * f32::EPSILON * exact.abs()).max(1e-37);
        assert!((got - exact).abs() <= tol, "value {i}: x {x}: {got} vs {exact}");
    }
    // A prefill-sized input (split over the kernel pool): the same bits per value.
    let long_g: Vec<f32> = data(3 * 65536 + 5, 23).iter().map(|v| v * 12.0).collect();
    let long_u = data(long_g.len(), 24);
    let mut long = long_g.clone();
    silu_mul(&mut long, &long_u);
    for (i, ((&x, &uv), &got)) in long_g.iter().zip(&long_u).zip(&long).enumerate() {
        assert_eq!(got.to_bits(), (x / (1.0 + exp_approx(-x)) * uv).to_bits(), "long input, value {i}");
    }
    // The AVX2 kernel too where the dispatcher picked AVX-512: the same bits.
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        let mut narrow = g.clone();
        // SAFETY: AVX2 and FMA are present.
        let done = unsafe { super::avx2::silu_mul(&mut narrow, &u) };
        assert_eq!(done, g.len() / 8 * 8);
        for (a, b) in narrow[..done].iter().zip(&fast) {
            assert_eq!(a.to_bits(), b.to_bits());
        }
    }
    // Correctly rounded (f64's exp rounded to f32) on a sweep of inputs, all but the rare
    // value within ~1e-13 of a rounding boundary: none in this sweep.
    let mut off = 0;
    for i in 0..200_000 {
        let x = -104.0 + i as f32 * 0.000_961;
        let want = (x as f64).exp() as f32;
        if exp_approx(x) != want {
            off += 1;
        }
    }
    assert_eq!(off, 0, "exp_approx not correctly rounded");
    // Subnormal results, overflow, and the 0 / infinity beyond |n| > 192.
    for x in [-95.0f32, -103.0, -120.0, -140.0, 89.0, 100.0, 140.0] {
        let e = (x as f64).exp() as f32;
        let got = exp_approx(x);
        assert!(got == e || (x < -103.0 && got == 0.0), "exp({x}) = {got}, want {e}");
    }
}

/// `pack_for_lanes` lays a model's matrices out in one allocation: a clone sharing another's
/// storage packs once, the other formats stay as they are, and every product and row keeps
/// its values (the lane kernels' arithmetic, bit for bit).
#[cfg(target_arch = "x86_64")]
#[test]
fn pack_for_lanes_keeps_products_and_rows() {
    if !has_lanes() || !lanes::handles(QType::Q8_0) {
        eprintln!("skipped: no lane kernels for Q8_0 here");
        return;
    }
    let (a, _) = quantized(QType::Q8_0, 40, 96, 1);
    let (b, _) = quantized(QType::Q5_0, 33, 64, 2);
    let (k, _) = quantized(QType::Q6K, 20, 256, 3);
    let tied = a.clone();
    let before: Vec<Vec<u8>> = [&a, &b, &k].iter().map(|m| m.with_bytes(|x| x.to_vec())).collect();
    let (mut pa, mut pb, mut pk, mut pt) = (a.clone(), b.clone(), k.clone(), tied.clone());
    pack_for_lanes(&mut [&mut pa, &mut pb, &mut pk, &mut pt]);
    assert!(pa.is_packed() && pb.is_packed() && pt.is_packed());
    assert_eq!(pk.is_packed(), lanes::handles(QType::Q6K));
    match (&pa.storage, &pt.storage) {
        (super::qmatrix::Storage::Lanes(x), super::qmatrix::Storage::Lanes(y)) => assert!(Arc::ptr_eq(x, y), "a tied clone was packed twice"),
        _ => unreachable!(),
    }
    for (m, raw) in [&pa, &pb, &pk].into_iter().zip(&before) {
        assert!(m.with_bytes(|x| x == &raw[..]), "{:?}: bytes changed", m.qtype());
        for rows in [1, 5, 19] {
            let x = data(rows * m.cols(), rows as u64);
            let mut got = vec![0f32; rows * m.rows()];
            m.matmul(&x, rows, &mut got);
            let acts = QuantizedActs::for_matrix(m, &x, rows);
            let rb = m.row_bytes();
            for i in 0..rows {
                for j in 0..m.rows() {
                    let want = match (m.is_packed(), m.qtype().k_quant()) {
                        (true, false) => lanes::reference(m.qtype(), &raw[j * rb..(j + 1) * rb], acts.row_q8(i)),
                        (true, true) => lanes_k::reference(m.qtype(), &raw[j * rb..(j + 1) * rb], acts.row_q8k(i)),
                        (false, _) => got[i * m.rows() + j],
                    };
                    assert_eq!(got[i * m.rows() + j].to_bits(), want.to_bits(), "{:?} x{rows} ({i},{j})", m.qtype());
                }
            }
        }
    }
}

/// The vectorised f32 -> f16 conversion rounds as `half` does from the exact value (every
/// length, so the scalar tail is covered too; infinities, overflow, subnormals, ties).
#[test]
fn f32_to_f16_matches_half() {
    let mut x = data(1000, 77);
    for v in x.iter_mut().step_by(3) {
        *v *= 70000.0;
    }
    for v in x.iter_mut().skip(1).step_by(5) {
        *v *= 1e-6;
    }
    x.extend([f32::INFINITY, f32::NEG_INFINITY, 65520.0, -65504.0, 1.0 + 1.0 / 2048.0, 1.0 + 3.0 / 2048.0, 0.0, -0.0, 5.96e-8, 2.98e-8]);
    for n in [0, 1, 7, 8, 9, 15, 16, 17, x.len()] {
        let mut got = vec![0u16; n];
        f32_to_f16(&x[..n], &mut got);
        for (i, (&g, &v)) in got.iter().zip(&x[..n]).enumerate() {
            assert_eq!(g, half::f16::from_f64(v as f64).to_bits(), "value {i} of {n}: {v}");
        }
    }
}

/// Activations quantized and laid out for a product of many rows (split over the kernel pool)
/// are, row by row, what each row gives alone.
#[test]
fn batched_activation_layouts_match_single_rows() {
    let (m, cols) = (13, 1024);
    let x = data(m * cols, 5);
    for t in ALL {
        #[cfg(target_arch = "x86_64")]
        let variants = [(false, false), (has_avx512() && wide_format(t), false), (has_avx512() && wide_format(t), has_lanes() && lanes::handles(t))];
        #[cfg(not(target_arch = "x86_64"))]
        let variants = [(false, false)];
        for (wide, lanes_) in variants {
            let all = QuantizedActs::with_kernels_lanes(t, super::ActsIn::Ready(&x), m, cols, wide, lanes_);
            for i in 0..m {
                let one = QuantizedActs::with_kernels_lanes(t, super::ActsIn::Ready(&x[i * cols..(i + 1) * cols]), 1, cols, wide, lanes_);
                let what = format!("{t:?} wide {wide} lanes {lanes_} row {i}");
                if t.k_quant() {
                    let (a, b) = (all.row_q8k(i), one.row_q8k(0));
                    assert!(a.iter().zip(b).all(|(p, q)| p.d.to_bits() == q.d.to_bits() && p.qs == q.qs && p.bsums == q.bsums), "{what}");
                } else {
                    let (a, b) = (all.row_q8(i), one.row_q8(0));
                    assert!(a.iter().zip(b).all(|(p, q)| p.d.to_bits() == q.d.to_bits() && p.s.to_bits() == q.s.to_bits() && p.qs == q.qs), "{what}");
                }
                let nb = one.corr.len();
                assert_eq!(all.corr.get(i * nb..(i + 1) * nb).unwrap_or(&[]), &one.corr[..], "{what}: corrections");
                #[cfg(target_arch = "x86_64")]
                {
                    assert_eq!(all.wide, one.wide, "{what}");
                    if all.wide && t.k_quant() {
                        let (a, b) = (all.row_k(i), one.row_k(0));
                        assert!(a.iter().zip(b).all(|(p, q)| p.qs == q.qs && p.bsums == q.bsums && p.bs32 == q.bs32 && p.d.to_bits() == q.d.to_bits()), "{what}: blocks");
                    } else if all.wide {
                        let (a, b) = (all.row_pairs(i), one.row_pairs(0));
                        assert!(a.iter().zip(b).all(|(p, q)| p.qs == q.qs && p.c == q.c), "{what}: pairs");
                    }
                }
            }
        }
    }
}

