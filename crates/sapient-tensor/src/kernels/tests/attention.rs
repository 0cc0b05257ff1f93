//! The attention kernels: scores, weighted values and value runs, bit for bit against
//! fused multiply-add chains in order.

use super::*;

/// A score as `scores_chunks` defines it: fused multiply-adds over the components in order.
fn chain_score(q: &[f32], key: impl Fn(usize) -> u16, scale: f32) -> f32 {
    let mut s = 0f32;
    for (d, qd) in q.iter().enumerate() {
        s = qd.mul_add(half::f16::from_bits(key(d)).to_f32(), s);
    }
    s * scale
}

/// `scores_chunks` gives every query, in calls of 1 to 8 queries and any number of chunks,
/// exactly the fused multiply-add chain of its key, and is within f32 rounding of an f64 dot
/// product; head sizes of the usual models and odd ones.
#[test]
fn chunk_scores_equal_the_chain_for_any_number_of_queries() {
    for hd in [64, 128, 80, 256, 37, 1] {
        let pitch = 32; // keys of a 32-position block, transposed
        let nchunks = 11;
        let mut kc = vec![0u16; hd * pitch * 6 + 16];
        f32_to_f16(&data(kc.len(), 70 + hd as u64), &mut kc);
        // Chunks at both halves of several blocks, in no particular order.
        let bases: Vec<usize> = (0..nchunks).map(|c| ((c * 7) % 6) * hd * pitch + (c % 2) * 16).collect();
        let qs: Vec<Vec<f32>> = (0..MAX_QUERIES).map(|r| data(hd, 80 + r as u64)).collect();
        for nq in 1..=MAX_QUERIES {
            for take in [1, 2, 3, nchunks] {
                let q: Vec<&[f32]> = qs[..nq].iter().map(|v| &v[..]).collect();
                let ostride = 16 * take + 5;
                let mut out = vec![f32::NAN; nq * ostride];
                scores_chunks(&q, &kc, &bases[..take], pitch, 0.125, &mut out, ostride);
                for i in 0..nq {
                    for (c, &b) in bases[..take].iter().enumerate() {
                        for j in 0..16 {
                            let want = chain_score(&qs[i], |d| kc[b + d * pitch + j], 0.125);
                            let got = out[i * ostride + 16 * c + j];
                            assert_eq!(got.to_bits(), want.to_bits(), "hd {hd}, {nq} queries, chunk {c} key {j} row {i}");
                            let exact: f64 = (0..hd).map(|d| qs[i][d] as f64 * half::f16::from_bits(kc[b + d * pitch + j]).to_f64()).sum::<f64>() * 0.125;
                            assert!((got as f64 - exact).abs() <= 1e-5 * (1.0 + exact.abs()), "{got} vs {exact}");
                        }
                    }
                }
            }
        }
        // The AVX2 kernel (taken on machines without AVX-512) gives the same bits.
        #[cfg(target_arch = "x86_64")]
        if has_avx2() {
            let ostride = 16 * nchunks;
            let mut want = vec![0f32; 3 * ostride];
            let q: Vec<&[f32]> = qs[..3].iter().map(|v| &v[..]).collect();
            scores_chunks(&q, &kc, &bases, pitch, 0.5, &mut want, ostride);
            let mut got = vec![0f32; 3 * ostride];
            // SAFETY: AVX2, FMA and F16C are present; the ranges are those checked above.
            unsafe { super::avx2::scores_chunks::<3, 2>([q[0].as_ptr(), q[1].as_ptr(), q[2].as_ptr()], hd, kc.as_ptr(), &bases, pitch, 0.5, got.as_mut_ptr(), ostride) };
            assert_eq!(got, want, "avx2, hd {hd}");
        }
    }
}

/// `values_f16` gives each row exactly the fused multiply-adds in order of the values,
/// whatever the number of rows, and cutting a run of values in two changes nothing.
#[test]
fn weighted_values_equal_ordered_fmas() {
    for hd in [64, 128, 96, 80, 52, 37] {
        let (stride, off, keys) = (3 * hd, hd, 23);
        let mut cache = vec![0u16; keys * stride];
        f32_to_f16(&data(keys * stride, 41), &mut cache);
        let ws: Vec<Vec<f32>> = (0..MAX_VALUE_ROWS).map(|r| data(keys, 90 + r as u64)).collect();
        for (t0, t1) in [(0, 23), (3, 10), (5, 6), (2, 2), (1, 20)] {
            for nr in 1..=MAX_VALUE_ROWS {
                let mut want: Vec<Vec<f32>> = (0..nr).map(|r| data(hd, 60 + r as u64)).collect();
                for (r, y) in want.iter_mut().enumerate() {
                    for t in t0..t1 {
                        let a = ws[r][t - t0];
                        for d in 0..hd {
                            y[d] = a.mul_add(half::f16::from_bits(cache[t * stride + off + d]).to_f32(), y[d]);
                        }
                    }
                }
                let mut got: Vec<Vec<f32>> = (0..nr).map(|r| data(hd, 60 + r as u64)).collect();
                let w: Vec<&[f32]> = ws[..nr].iter().map(|v| &v[..]).collect();
                let mid = (t0 + t1) / 2;
                {
                    let mut ys: Vec<&mut [f32]> = got.iter_mut().map(|v| &mut v[..]).collect();
                    values_f16(&w, &cache, stride, off, t0, mid, &mut ys);
                    let w2: Vec<&[f32]> = ws[..nr].iter().map(|v| &v[mid - t0..]).collect();
                    values_f16(&w2, &cache, stride, off, mid, t1, &mut ys);
                }
                assert_eq!(got, want, "hd {hd}, {nr} rows, span {t0}..{t1}");
                #[cfg(target_arch = "x86_64")]
                if has_avx2() && hd % 8 == 0 && nr == 2 {
                    let mut avx: Vec<Vec<f32>> = (0..2).map(|r| data(hd, 60 + r as u64)).collect();
                    let y = [avx[0].as_mut_ptr(), avx[1].as_mut_ptr()];
                    // SAFETY: AVX2, FMA and F16C are present; the values t0..t1 are in the
                    // cache and the rows are `hd` long.
                    unsafe { super::avx2::values_w::<2, 4>([ws[0].as_ptr(), ws[1].as_ptr()], cache[off..].as_ptr(), stride, hd, t0, t1, y) };
                    assert_eq!(avx, want, "avx2, hd {hd}, span {t0}..{t1}");
                }
            }
        }
    }
}

/// `values_f16_runs` over runs of values scattered in the cache (blocks of a paged cache, in
/// any order) gives each row exactly the fused multiply-adds in order of the runs.
#[test]
fn weighted_value_runs_equal_ordered_fmas() {
    for hd in [64, 128, 96, 80, 52, 37] {
        let (stride, off, keys) = (3 * hd, hd, 50);
        let mut cache = vec![0u16; keys * stride];
        f32_to_f16(&data(keys * stride, 43), &mut cache);
        let runs = [(32usize, 16usize), (0, 5), (20, 0), (40, 10), (8, 1)];
        let total: usize = runs.iter().map(|r| r.1).sum();
        let ws: Vec<Vec<f32>> = (0..MAX_VALUE_ROWS).map(|r| data(total, 70 + r as u64)).collect();
        for nr in 1..=MAX_VALUE_ROWS {
            let mut want: Vec<Vec<f32>> = (0..nr).map(|r| data(hd, 80 + r as u64)).collect();
            for (r, y) in want.iter_mut().enumerate() {
                let mut k = 0;
                for &(t0, n) in &runs {
                    for t in t0..t0 + n {
                        for d in 0..hd {
                            y[d] = ws[r][k].mul_add(half::f16::from_bits(cache[t * stride + off + d]).to_f32(), y[d]);
                        }
                        k += 1;
                    }
                }
            }
            let mut got: Vec<Vec<f32>> = (0..nr).map(|r| data(hd, 80 + r as u64)).collect();
            let w: Vec<&[f32]> = ws[..nr].iter().map(|v| &v[..]).collect();
            let mut ys: Vec<&mut [f32]> = got.iter_mut().map(|v| &mut v[..]).collect();
            values_f16_runs(&w, &cache, stride, off, &runs, &mut ys);
            assert_eq!(got, want, "hd {hd}, {nr} rows");
        }
    }
}
