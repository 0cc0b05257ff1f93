//! The aarch64 kernels against the portable ones, bit for bit, at every level the CPU has
//! (under `qemu-aarch64 -cpu max` all three; `-cpu cortex-a72` plain NEON only).

use super::super::neon::{rows_q8_at, rows_q8k_at, Level, MAX_ROWS};
use super::super::neon_mmla::pair_rows_q8;
use super::*;

const FORMATS: [QType; 7] = [QType::Q4_0, QType::Q4_1, QType::Q5_0, QType::Q5_1, QType::Q8_0, QType::Q4K, QType::Q6K];

/// Where each format keeps its f16 scales (random bytes there would be NaNs and infinities).
fn f16_offsets(t: QType) -> &'static [usize] {
    match t {
        QType::Q4_1 | QType::Q5_1 | QType::Q4K | QType::Q5K => &[0, 2],
        QType::Q6K => &[208],
        _ => &[0],
    }
}

/// Weight rows of random bytes (every bit pattern of the quants and scales) with finite scales.
fn random_rows(t: QType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let n = rows * cols / t.block_len() * t.block_bytes();
    let mut s = seed | 1;
    let mut bytes: Vec<u8> = (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 24) as u8
        })
        .collect();
    let scales = data(n / t.block_bytes() * 2, seed + 1);
    for (k, blk) in bytes.chunks_exact_mut(t.block_bytes()).enumerate() {
        for (j, &off) in f16_offsets(t).iter().enumerate() {
            let v = half::f16::from_f32(scales[2 * k + j] * 0.05).to_bits().to_le_bytes();
            blk[off..off + 2].copy_from_slice(&v);
        }
    }
    bytes
}

fn portable(t: QType, w: &[u8], acts: &QuantizedActs, i: usize) -> f32 {
    match t {
        QType::Q4_0 => quant::dot_q4_0(w, acts.row_q8(i)),
        QType::Q4_1 => quant::dot_q4_1(w, acts.row_q8(i)),
        QType::Q5_0 => quant::dot_q5_0(w, acts.row_q8(i)),
        QType::Q5_1 => quant::dot_q5_1(w, acts.row_q8(i)),
        QType::Q8_0 => quant::dot_q8_0(w, acts.row_q8(i)),
        QType::Q4K => quant::dot_q4k(w, acts.row_q8k(i)),
        QType::Q5K => quant::dot_q5k(w, acts.row_q8k(i)),
        QType::Q6K => quant::dot_q6k(w, acts.row_q8k(i)),
    }
}

fn levels() -> Vec<Level> {
    [Level::Neon, Level::Dotprod, Level::I8mm].into_iter().filter(|l| *l <= Level::detect()).collect()
}

/// Each weight row against groups of 1..=MAX_ROWS activation rows, at every level: the
/// portable dot's bits for every output, candle-quantized and random-byte weights alike.
#[test]
fn neon_rows_equal_portable_bit_for_bit() {
    let levels = levels();
    eprintln!("aarch64 levels under test: {levels:?}");
    assert!(levels.contains(&Level::Neon));
    let m = 7;
    for t in FORMATS {
        for cols in cols_for(t) {
            let rows = 5;
            let (q, _) = quantized(t, rows, cols, 11 + cols as u64);
            let candle = q.with_bytes(|b| b.to_vec());
            for bytes in [candle, random_rows(t, rows, cols, 5 + cols as u64)] {
                let w = QMatrix::from_bytes(t, rows, cols, bytes.clone()).expect("matrix");
                let x = data(m * cols, 3 + cols as u64);
                let acts = QuantizedActs::for_matrix(&w, &x, m);
                let rb = w.row_bytes();
                for j in 0..rows {
                    let wr = &bytes[j * rb..(j + 1) * rb];
                    let want: Vec<f32> = (0..m).map(|i| portable(t, wr, &acts, i)).collect();
                    for &level in &levels {
                        for g in 1..=MAX_ROWS {
                            for i0 in (0..m).step_by(g) {
                                let n = g.min(m - i0);
                                let mut out = [0f32; MAX_ROWS];
                                let done = if t.k_quant() {
                                    let rs: Vec<&[BlockQ8K]> = (i0..i0 + n).map(|i| acts.row_q8k(i)).collect();
                                    rows_q8k_at(level, t, wr, &rs, &mut out)
                                } else {
                                    let rs: Vec<&[BlockQ8]> = (i0..i0 + n).map(|i| acts.row_q8(i)).collect();
                                    rows_q8_at(level, t, wr, &rs, &mut out)
                                };
                                assert!(done, "{t:?} {level:?}: not taken");
                                for k in 0..n {
                                    let (got, want) = (out[k], want[i0 + k]);
                                    assert_eq!(got.to_bits(), want.to_bits(), "{t:?} {level:?} cols {cols} row {j} act {} of {n}: {got} vs {want}", i0 + k);
                                }
                            }
                        }
                    }
                }
                // Pairs of weight rows on smmla, where the CPU has i8mm.
                if Level::detect() == Level::I8mm && !t.k_quant() {
                    for g in 1..=MAX_ROWS {
                        let rs: Vec<&[BlockQ8]> = (0..g).map(|i| acts.row_q8(i)).collect();
                        let (mut o0, mut o1) = ([0f32; MAX_ROWS], [0f32; MAX_ROWS]);
                        assert!(pair_rows_q8(t, &bytes[..rb], &bytes[rb..2 * rb], &rs, &mut o0, &mut o1), "{t:?}: smmla not taken");
                        for i in 0..g {
                            for (j, o) in [o0[i], o1[i]].into_iter().enumerate() {
                                let want = portable(t, &bytes[j * rb..(j + 1) * rb], &acts, i);
                                assert_eq!(o.to_bits(), want.to_bits(), "{t:?} smmla cols {cols} ({i},{j}) of {g}: {o} vs {want}");
                            }
                        }
                    }
                }
                // The whole product through the dispatch (smmla for pairs of weight rows where
                // the CPU has i8mm, an odd last row on sdot): the same bits again.
                let mut out = vec![0f32; m * rows];
                w.matmul_quantized(&acts, &mut out);
                for i in 0..m {
                    for j in 0..rows {
                        let want = portable(t, &bytes[j * rb..(j + 1) * rb], &acts, i);
                        assert_eq!(out[i * rows + j].to_bits(), want.to_bits(), "{t:?} matmul ({i},{j})");
                    }
                }
            }
        }
    }
}

/// Formats without a NEON kernel are left to the portable code, and shapes the kernels do
/// not take are refused rather than read out of bounds.
#[test]
fn neon_refuses_what_it_does_not_take() {
    let a = [BlockQ8K::default(); 1];
    let mut out = [0f32; 1];
    assert!(!rows_q8k_at(Level::Neon, QType::Q5K, &[0u8; 176], &[&a[..]], &mut out));
    let b = [BlockQ8::default(); 1];
    let too_many: Vec<&[BlockQ8]> = vec![&b[..]; MAX_ROWS + 1];
    let mut out = [0f32; MAX_ROWS + 1];
    assert!(!rows_q8_at(Level::Neon, QType::Q8_0, &[0u8; 34], &too_many, &mut out));
    assert!(rows_q8_at(Level::Neon, QType::Q8_0, &[0u8; 34], &too_many[..1], &mut out));
}

/// Blocks of 32 values with what the quantizers must treat as the portable code does: NaNs
/// (ignored by the maximum, quantized to 0), infinities, an all-NaN block, signed zeros,
/// exact ties, a negative largest value first and a positive one of the same magnitude after.
fn awkward_values() -> Vec<f32> {
    let mut x = data(32 * 24, 41);
    x[3] = f32::NAN;
    x[40..48].fill(f32::NAN);
    x[64..96].fill(f32::NAN);
    x[100] = f32::INFINITY;
    x[130] = f32::NEG_INFINITY;
    x[160..192].fill(-0.0);
    x[192..224].copy_from_slice(&[-127.0, 127.0, 0.5, -0.5, 1.5, -2.5, 126.5, -126.5].repeat(4));
    x[230] = -3.0;
    x[231] = 3.0;
    x[300] = 1e30; // products that saturate
    x
}

/// The NEON activation quantizers give the portable blocks bit for bit, ordinary data and
/// the awkward values above (in 256-value blocks too, where the first value of largest
/// magnitude sets the sign of the scale).
#[test]
fn neon_quantizers_equal_portable_bit_for_bit() {
    use super::super::neon_quant;
    for x in [data(32 * 40, 9), awkward_values()] {
        let n = x.len() / 32;
        let (mut a, mut b) = (vec![BlockQ8::default(); n], vec![BlockQ8::default(); n]);
        quant::quantize_q8(&x, &mut a);
        neon_quant::quantize_q8(&x, &mut b);
        for (i, (p, q)) in a.iter().zip(&b).enumerate() {
            assert_eq!((p.d.to_bits(), p.s.to_bits(), p.qs), (q.d.to_bits(), q.s.to_bits(), q.qs), "q8 block {i}");
        }
        let n = x.len() / 256;
        let (mut a, mut b) = (vec![BlockQ8K::default(); n], vec![BlockQ8K::default(); n]);
        quant::quantize_q8k(&x[..n * 256], &mut a);
        neon_quant::quantize_q8k(&x[..n * 256], &mut b);
        for (i, (p, q)) in a.iter().zip(&b).enumerate() {
            assert_eq!((p.d.to_bits(), p.qs, p.bsums), (q.d.to_bits(), q.qs, q.bsums), "q8k block {i}");
        }
        assert!(a.iter().any(|b| b.d != 0.0), "some non-zero block");
    }
    // The 8-bit KV cache's groups: the maximum magnitude, and rounding (ties to even) after
    // a clamp, NaN to 0.
    let x = awkward_values();
    for g in x.chunks_exact(32) {
        // SAFETY: `g` holds 32 values, `q` 32 bytes.
        let amax = unsafe { neon_quant::amax32(g.as_ptr()) };
        assert_eq!(amax.to_bits(), g.iter().fold(0f32, |m, v| m.max(v.abs())).to_bits());
        for id in [1.0f32, 0.37, 127.0 / 3.5, 0.0, 1e9] {
            let mut q = [0i8; 32];
            // SAFETY: as above.
            let sum = unsafe { neon_quant::round32(g.as_ptr(), id, q.as_mut_ptr()) };
            let want: Vec<i8> = g.iter().map(|v| (v * id).clamp(-127.0, 127.0).round_ties_even() as i8).collect();
            assert_eq!(q.to_vec(), want, "id {id}");
            assert_eq!(sum, want.iter().map(|&v| v as i32).sum::<i32>());
        }
    }
}
