//! The AVX2 and AVX-VNNI sixteen-rows kernels against the lane kernels' reference, bit for
//! bit, on every byte pattern a block can hold.

use super::super::lanes::{self, Packed};
use super::super::lanes_avx2;
use super::super::quant::QType;
use super::super::QuantizedActs;
use super::{data, quantized};

/// Raw blocks of format `t` from pseudo-random bytes (every value pattern, Q8_0's -128
/// included), with scales and minimums small finite f16 values.
fn random_blocks(t: QType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9e3779b97f4a7c15) | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let (bytes, halves) = (t.block_bytes(), if matches!(t, QType::Q4_1 | QType::Q5_1) { 2 } else { 1 });
    let mut raw = vec![0u8; rows * cols / 32 * bytes];
    for blk in raw.chunks_exact_mut(bytes) {
        blk.iter_mut().for_each(|b| *b = next() as u8);
        for h in 0..halves {
            // Exponent 8..15 with a random sign and mantissa: |x| in about 2^-7..2^0.
            let v = (next() as u16 & 0x83ff) | ((8 + (next() % 8) as u16) << 10);
            blk[2 * h..2 * h + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
    raw
}

/// Both levels this CPU has (AVX-VNNI: the `vpdpbusd` route; AVX2: `vpmaddubsw`), each format,
/// random and extreme weights and activations (rows of one repeated large value quantize to
/// +-127), partial groups and several numbers of activation rows.
#[test]
fn avx2_lane_kernels_match_the_lane_reference() {
    if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")) {
        eprintln!("skipped: no AVX2/FMA/F16C");
        return;
    }
    let vnni = is_x86_feature_detected!("avxvnni");
    let mut checked = 0;
    for t in [QType::Q4_0, QType::Q4_1, QType::Q5_0, QType::Q5_1, QType::Q8_0] {
        for (rows, cols, m) in [(1, 32, 1), (16, 64, 3), (37, 96, 9), (130, 576, 17), (48, 128, 1), (20, 256, 70)] {
            for random in [false, true] {
                let raw = if random { random_blocks(t, rows, cols, 11 + rows as u64) } else { quantized(t, rows, cols, 3 + cols as u64).0.with_bytes(|b| b.to_vec()) };
                let mut x = data(m * cols, 7 + m as u64);
                for (i, v) in x.iter_mut().take(cols).enumerate() {
                    *v = if i % 3 == 0 { -50.0 } else { 50.0 };
                }
                let acts = QuantizedActs::for_lane_kernels(t, &x, m, cols);
                let p = Packed::new_all(&[(t, &raw, rows, cols)]).pop().flatten().expect("a packed format");
                let rb = raw.len() / rows;
                for level in [false, true].into_iter().filter(|&v| !v || vnni) {
                    let mut out = vec![f32::NAN; m * rows];
                    // Ranges starting at each chunk boundary the pool uses (multiples of 16).
                    let mut r0 = 0;
                    while r0 < rows {
                        let r1 = (r0 + 32).min(rows);
                        // SAFETY: AVX2/FMA/F16C (and AVX-VNNI for `level`) are present; the
                        // packed rows are `cols` wide, `out` is `[m, rows]`.
                        unsafe { lanes_avx2::range_packed(level, &p, r0, r1, &acts.q8, &acts.corr, m, out.as_mut_ptr(), rows) };
                        r0 = r1;
                    }
                    for i in 0..m {
                        for j in 0..rows {
                            let want = lanes::reference(t, &raw[j * rb..(j + 1) * rb], acts.row_q8(i));
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
