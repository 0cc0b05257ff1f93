//! The AVX2 and AVX-VNNI sixteen-rows kernels against the lane kernels' reference, bit for
//! bit, on every byte pattern a block can hold.

use super::super::lanes::{self, Packed};
use super::super::{lanes_avx2, lanes_avx2_k, lanes_k};
use super::super::quant::QType;
use super::super::QuantizedActs;
use super::{data, quantized};

/// Raw blocks of format `t` from pseudo-random bytes (every value pattern, Q8_0's -128 and
/// Q6_K's scale -128 included), with scales and minimums small finite f16 values.
fn random_blocks(t: QType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9e3779b97f4a7c15) | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    // Where a block's f16 values are: the scale and minimum first, Q6_K's scale last.
    let (bytes, f16s) = (t.block_bytes(), match t {
        QType::Q4_1 | QType::Q5_1 | QType::Q4K => &[0, 2][..],
        QType::Q6K => &[208][..],
        _ => &[0][..],
    });
    let mut raw = vec![0u8; rows * cols / t.block_len() * bytes];
    for blk in raw.chunks_exact_mut(bytes) {
        blk.iter_mut().for_each(|b| *b = next() as u8);
        for &at in f16s {
            // Exponent 8..15 with a random sign and mantissa: |x| in about 2^-7..2^0.
            let v = (next() as u16 & 0x83ff) | ((8 + (next() % 8) as u16) << 10);
            blk[at..at + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
    raw
}

/// Activation rows: pseudo-random, the first row alternating between two large values
/// (quantized to the extremes, -128 for 256-value blocks).
fn extreme_acts(m: usize, cols: usize) -> Vec<f32> {
    let mut x = data(m * cols, 7 + m as u64);
    for (i, v) in x.iter_mut().take(cols).enumerate() {
        *v = if i % 3 == 0 { -50.0 } else { 50.0 };
    }
    x
}

/// Formats `ts` on both levels this CPU has (AVX-VNNI: the `vpdpbusd` route; AVX2:
/// `vpmaddubsw`) at each `(rows, cols, m)`, random and candle-quantized weights, extreme
/// activations, against the reference bit for bit. `run(vnni, packed, acts, r0, r1, out)`
/// computes output columns `r0..r1` into the `[m, rows]` `out`; `want(t, raw row, acts, i)` is
/// the reference for activation row `i`. Checks that the extreme row reaches `min_act`.
fn check_levels(ts: &[QType], shapes: &[(usize, usize, usize)], min_act: i8, run: impl Fn(bool, &Packed, &QuantizedActs, usize, usize, &mut [f32]), want: impl Fn(QType, &[u8], &QuantizedActs, usize) -> f32) {
    if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")) {
        eprintln!("skipped: no AVX2/FMA/F16C");
        return;
    }
    let vnni = is_x86_feature_detected!("avxvnni");
    let mut checked = 0;
    for &t in ts {
        for &(rows, cols, m) in shapes {
            for random in [false, true] {
                let raw = if random { random_blocks(t, rows, cols, 11 + rows as u64) } else { quantized(t, rows, cols, 3 + cols as u64).0.with_bytes(|b| b.to_vec()) };
                let acts = QuantizedActs::for_lane_kernels(t, &extreme_acts(m, cols), m, cols);
                let lowest = if t.k_quant() { acts.q8k.iter().flat_map(|b| b.qs).min() } else { acts.q8.iter().flat_map(|b| b.qs).min() };
                assert_eq!(lowest, Some(min_act), "{t:?}: the extreme activation row's lowest value");
                let p = Packed::new_all(&[(t, &raw, rows, cols)]).pop().flatten().expect("a packed format");
                let rb = raw.len() / rows;
                for level in [false, true].into_iter().filter(|&v| !v || vnni) {
                    let mut out = vec![f32::NAN; m * rows];
                    // Ranges starting at each chunk boundary the pool uses (multiples of 16).
                    let mut r0 = 0;
                    while r0 < rows {
                        let r1 = (r0 + 32).min(rows);
                        run(level, &p, &acts, r0, r1, &mut out);
                        r0 = r1;
                    }
                    for i in 0..m {
                        for j in 0..rows {
                            let want = want(t, &raw[j * rb..(j + 1) * rb], &acts, i);
                            let got = out[i * rows + j];
                            assert_eq!(got.to_bits(), want.to_bits(), "{t:?} [{rows}x{cols}] x{m} ({i},{j}) vnni {level} random {random}: {got} vs {want}");
                            checked += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 0);
}

/// The 32-value formats' kernels ([`check_levels`]; rows of one repeated large value quantize
/// to +-127), partial groups and several numbers of activation rows.
#[test]
fn avx2_lane_kernels_match_the_lane_reference() {
    let ts = [QType::Q4_0, QType::Q4_1, QType::Q5_0, QType::Q5_1, QType::Q8_0];
    let shapes = [(1, 32, 1), (16, 64, 3), (37, 96, 9), (130, 576, 17), (48, 128, 1), (20, 256, 70)];
    check_levels(&ts, &shapes, -127, |vnni, p, acts, r0, r1, out| {
        let (m, rows) = (acts.m, out.len() / acts.m);
        // SAFETY: AVX2/FMA/F16C (and AVX-VNNI for `vnni`) are present (`check_levels`); the
        // packed rows are `cols` wide, `out` is `[m, rows]`.
        unsafe { lanes_avx2::range_packed(vnni, p, r0, r1, &acts.q8, &acts.corr, m, out.as_mut_ptr(), rows) }
    }, |t, w, acts, i| lanes::reference(t, w, acts.row_q8(i)));
}

/// The Q4_K and Q6_K kernels against the k-quant lane kernels' reference ([`check_levels`]:
/// random superblocks hold every value, scale and minimum pattern, Q6_K's scale -128
/// included; the extreme activations reach -128), partial groups, one and many rows.
#[test]
fn avx2_k_lane_kernels_match_the_lane_reference() {
    let shapes = [(1, 256, 1), (16, 512, 3), (37, 768, 9), (130, 256, 17), (48, 1280, 1), (20, 256, 70)];
    check_levels(&[QType::Q4K, QType::Q6K], &shapes, -128, |vnni, p, acts, r0, r1, out| {
        let (m, rows) = (acts.m, out.len() / acts.m);
        // SAFETY: as above.
        unsafe { lanes_avx2_k::range_packed(vnni, p, r0, r1, &acts.q8k, &acts.corr, m, out.as_mut_ptr(), rows) }
    }, |t, w, acts, i| lanes_k::reference(t, w, acts.row_q8k(i)));
}

/// One thread's time per product, these kernels against the AVX2 row-at-a-time ones, both
/// levels (`cargo test --release -p sapient-tensor --lib avx2_lane_timing -- --ignored
/// --nocapture`).
#[test]
#[ignore]
fn avx2_lane_timing() {
    use super::super::avx2;
    if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c") && is_x86_feature_detected!("avxvnni")) {
        eprintln!("skipped: no AVX2/FMA/F16C/AVX-VNNI");
        return;
    }
    type RowsFn = unsafe fn(&[u8], &[&[super::super::quant::BlockQ8]], &mut [f32]);
    let rows_fns: [(QType, RowsFn, RowsFn); 3] = [(QType::Q4_1, avx2::rows_q4_1, avx2::rows_q4_1_vnni), (QType::Q5_0, avx2::rows_q5_0, avx2::rows_q5_0_vnni), (QType::Q8_0, avx2::rows_q8_0, avx2::rows_q8_0_vnni)];
    for (t, plain, vnni_rows) in rows_fns {
        for (rows, cols) in [(1536, 576), (4864, 896)] {
            let raw = quantized(t, rows, cols, 1).0.with_bytes(|b| b.to_vec());
            let p = Packed::new_all(&[(t, &raw, rows, cols)]).pop().flatten().expect("a packed format");
            let rb = raw.len() / rows;
            for m in [1, 16, 64] {
                let x = data(m * cols, 2);
                let acts = QuantizedActs::for_lane_kernels(t, &x, m, cols);
                let mut out = vec![0f32; m * rows];
                let reps = (400 / m).max(4);
                for vnni in [false, true] {
                    let t0 = std::time::Instant::now();
                    for _ in 0..reps {
                        // SAFETY: as in the test above.
                        unsafe { lanes_avx2::range_packed(vnni, &p, 0, rows, &acts.q8, &acts.corr, m, out.as_mut_ptr(), rows) };
                    }
                    let lanes_us = t0.elapsed().as_secs_f64() * 1e6 / reps as f64;
                    let f = if vnni { vnni_rows } else { plain };
                    let t0 = std::time::Instant::now();
                    let mut tmp = [0f32; 4];
                    for _ in 0..reps {
                        for j in 0..rows {
                            for i0 in (0..m).step_by(4) {
                                let g = (m - i0).min(4);
                                let a: [&[super::super::quant::BlockQ8]; 4] = std::array::from_fn(|i| acts.row_q8((i0 + i).min(m - 1)));
                                // SAFETY: AVX2 (and AVX-VNNI for `vnni`) checked by the caller's CPU.
                                unsafe { f(&raw[j * rb..(j + 1) * rb], &a[..g], &mut tmp) };
                            }
                        }
                    }
                    let rows_us = t0.elapsed().as_secs_f64() * 1e6 / reps as f64;
                    println!("{t:?} {rows}x{cols} m={m} vnni={vnni}: lanes {lanes_us:.0} us, rows {rows_us:.0} us ({:.2}x)", rows_us / lanes_us);
                }
            }
        }
    }
}

/// One thread's time per Q4_K / Q6_K product of Qwen2.5-0.5B's ffn_down shape (896x4864),
/// these kernels against the AVX2 row-at-a-time ones, both levels (`cargo test --release -p
/// sapient-tensor --lib avx2_k_lane_timing -- --ignored --nocapture`).
#[test]
#[ignore]
fn avx2_k_lane_timing() {
    use super::super::avx2;
    use super::super::quant::BlockQ8K;
    if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c") && is_x86_feature_detected!("avxvnni")) {
        eprintln!("skipped: no AVX2/FMA/F16C/AVX-VNNI");
        return;
    }
    type RowsFn = unsafe fn(&[u8], &[&[BlockQ8K]], &mut [f32]);
    let rows_fns: [(QType, RowsFn); 2] = [(QType::Q4K, avx2::rows_q4k), (QType::Q6K, avx2::rows_q6k)];
    for (t, rows_fn) in rows_fns {
        let (rows, cols) = (896, 4864);
        let raw = quantized(t, rows, cols, 1).0.with_bytes(|b| b.to_vec());
        let p = Packed::new_all(&[(t, &raw, rows, cols)]).pop().flatten().expect("a packed format");
        let rb = raw.len() / rows;
        for m in [1, 16, 64] {
            let acts = QuantizedActs::for_lane_kernels(t, &data(m * cols, 2), m, cols);
            let mut out = vec![0f32; m * rows];
            let reps = (400 / m).max(4);
            let t0 = std::time::Instant::now();
            let mut tmp = [0f32; 4];
            for _ in 0..reps {
                for j in 0..rows {
                    for i0 in (0..m).step_by(4) {
                        let a: [&[BlockQ8K]; 4] = std::array::from_fn(|i| acts.row_q8k((i0 + i).min(m - 1)));
                        // SAFETY: AVX2/FMA/F16C checked above; rows are `cols` long.
                        unsafe { rows_fn(&raw[j * rb..(j + 1) * rb], &a[..(m - i0).min(4)], &mut tmp) };
                    }
                }
            }
            let rows_us = t0.elapsed().as_secs_f64() * 1e6 / reps as f64;
            for vnni in [false, true] {
                let t0 = std::time::Instant::now();
                for _ in 0..reps {
                    // SAFETY: as in the test above.
                    unsafe { lanes_avx2_k::range_packed(vnni, &p, 0, rows, &acts.q8k, &acts.corr, m, out.as_mut_ptr(), rows) };
                }
                let lanes_us = t0.elapsed().as_secs_f64() * 1e6 / reps as f64;
                println!("{t:?} {rows}x{cols} m={m} vnni={vnni}: lanes {lanes_us:.0} us, AVX2 rows {rows_us:.0} us ({:.2}x)", rows_us / lanes_us);
            }
        }
    }
}
