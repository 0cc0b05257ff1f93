//! Kernels of the gated delta rule (Gated DeltaNet linear attention, `sapient-llama`'s
//! `deltanet.rs`): one position's state update ([`delta_step`]) and the small f32 products
//! the chunked form of a prompt is made of ([`dots_nt_many`], [`axpy`], [`rank_update`]).
//!
//! A head's state is a `s x s` matrix `m`, row `j` holding value `j`'s weights over the key
//! (`m[j][i] = S[i][j]` in ggml's terms). Every function has an AVX-512 form (rows a multiple
//! of 16 values), an AVX2 + FMA form (multiples of 8) and the portable code; the SIMD forms
//! sum in a different order from the portable one, so results agree to rounding, not bits.

use super::detect::{has_avx2, has_avx512};

/// One position of the gated delta rule on a head's state `m` (`s` rows of `s`, `s =
/// k.len()`): `m *= decay`, `m[j] += beta (v[j] - m[j].k) k`, `o[j] = scale m[j].q`, each row
/// read and written once.
#[allow(clippy::too_many_arguments)]
pub fn delta_step(m: &mut [f32], k: &[f32], q: &[f32], v: &[f32], decay: f32, beta: f32, scale: f32, o: &mut [f32]) {
    let s = k.len();
    assert!(q.len() == s && v.len() >= s && o.len() >= s && m.len() >= s * s, "delta_step: shapes");
    #[cfg(target_arch = "x86_64")]
    {
        if s.is_multiple_of(16) && has_avx512() {
            // SAFETY: AVX-512F is present; the lengths are checked above.
            return unsafe { x86::step_512(m, k, q, v, decay, beta, scale, o) };
        }
        if s.is_multiple_of(8) && has_avx2() {
            // SAFETY: AVX2 and FMA are present; the lengths are checked above.
            return unsafe { x86::step_256(m, k, q, v, decay, beta, scale, o) };
        }
    }
    for (j, row) in m[..s * s].chunks_exact_mut(s).enumerate() {
        let mk: f32 = row.iter().zip(k).map(|(a, b)| a * b).sum::<f32>() * decay;
        let d = (v[j] - mk) * beta;
        let mut mq = 0f32;
        for ((e, &ki), &qi) in row.iter_mut().zip(k).zip(q) {
            *e = *e * decay + d * ki;
            mq += *e * qi;
        }
        o[j] = mq * scale;
    }
}

/// `out[r * ld + c] = a_r . b_c` for the `n` rows `a_r = a[r * lda..][..s]` of each `a`
/// matrix (with its `out`) and the `m` rows `b_c = b[c * ldb..][..s]` (products with the
/// second matrix transposed, as a chunk's key-key, query-key and state-key products are);
/// the AVX-512 form transposes `b` once for all of them.
#[allow(clippy::too_many_arguments)]
pub fn dots_nt_many(a: &mut [(&[f32], &mut [f32])], lda: usize, n: usize, b: &[f32], ldb: usize, m: usize, s: usize, ld: usize) {
    if n == 0 || m == 0 {
        return;
    }
    assert!(b.len() >= (m - 1) * ldb + s, "dots_nt_many: shapes");
    assert!(a.iter().all(|(a, out)| a.len() >= (n - 1) * lda + s && out.len() >= (n - 1) * ld + m), "dots_nt_many: shapes");
    #[cfg(target_arch = "x86_64")]
    if has_avx512() {
        // SAFETY: AVX-512F is present; every row read or written lies inside its slice (checked above).
        return BT.with(|bt| unsafe { x86::dots_nt_512(a, lda, n, b.as_ptr(), ldb, m, s, ld, &mut bt.borrow_mut()) });
    }
    for (a, out) in a.iter_mut() {
        for r in 0..n {
            let ar = &a[r * lda..r * lda + s];
            for c in 0..m {
                out[r * ld + c] = super::dot_f32(ar, &b[c * ldb..c * ldb + s]);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
thread_local! {
    /// [`dots_nt_many`]'s transposed `b`.
    static BT: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `y += alpha x`.
pub fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 and FMA are present.
        return unsafe { x86::axpy_256(alpha, x, y) };
    }
    for (y, &x) in y.iter_mut().zip(x) {
        *y += alpha * x;
    }
}

/// A chunk's state update: `m[j] = decay m[j] + sum_u c[u * s + j] x_u` for the `s` rows of
/// `m` (each `s` long) and the `n` rows `x_u = x[u * ldx..][..s]`.
pub fn rank_update(m: &mut [f32], s: usize, decay: f32, c: &[f32], x: &[f32], ldx: usize, n: usize) {
    assert!(m.len() >= s * s && c.len() >= n * s && (n == 0 || x.len() >= (n - 1) * ldx + s), "rank_update: shapes");
    #[cfg(target_arch = "x86_64")]
    if s.is_multiple_of(16) && has_avx512() {
        // SAFETY: AVX-512F is present; the lengths are checked above.
        return unsafe { x86::rank_update_512(m, s, decay, c, x.as_ptr(), ldx, n) };
    }
    for (j, row) in m[..s * s].chunks_exact_mut(s).enumerate() {
        for e in row.iter_mut() {
            *e *= decay;
        }
        for u in 0..n {
            axpy(c[u * s + j], &x[u * ldx..u * ldx + s], row);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::super::avx2::hsum_ps as hsum;
    use std::arch::x86_64::*;

    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f")]
    pub unsafe fn step_512(m: &mut [f32], k: &[f32], q: &[f32], v: &[f32], decay: f32, beta: f32, scale: f32, o: &mut [f32]) {
        let s = k.len();
        let (pk, pq) = (k.as_ptr(), q.as_ptr());
        let dv = _mm512_set1_ps(decay);
        for j in 0..s {
            let row = m.as_mut_ptr().add(j * s);
            let mut acc = _mm512_setzero_ps();
            let mut i = 0;
            while i < s {
                acc = _mm512_fmadd_ps(_mm512_loadu_ps(row.add(i)), _mm512_loadu_ps(pk.add(i)), acc);
                i += 16;
            }
            let d = (v[j] - _mm512_reduce_add_ps(acc) * decay) * beta;
            let dd = _mm512_set1_ps(d);
            let mut aq = _mm512_setzero_ps();
            i = 0;
            while i < s {
                let e = _mm512_fmadd_ps(_mm512_loadu_ps(row.add(i)), dv, _mm512_mul_ps(dd, _mm512_loadu_ps(pk.add(i))));
                _mm512_storeu_ps(row.add(i), e);
                aq = _mm512_fmadd_ps(e, _mm512_loadu_ps(pq.add(i)), aq);
                i += 16;
            }
            o[j] = _mm512_reduce_add_ps(aq) * scale;
        }
    }

    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn step_256(m: &mut [f32], k: &[f32], q: &[f32], v: &[f32], decay: f32, beta: f32, scale: f32, o: &mut [f32]) {
        let s = k.len();
        let (pk, pq) = (k.as_ptr(), q.as_ptr());
        let dv = _mm256_set1_ps(decay);
        for j in 0..s {
            let row = m.as_mut_ptr().add(j * s);
            let mut acc = _mm256_setzero_ps();
            let mut i = 0;
            while i < s {
                acc = _mm256_fmadd_ps(_mm256_loadu_ps(row.add(i)), _mm256_loadu_ps(pk.add(i)), acc);
                i += 8;
            }
            let d = (v[j] - hsum(acc) * decay) * beta;
            let dd = _mm256_set1_ps(d);
            let mut aq = _mm256_setzero_ps();
            i = 0;
            while i < s {
                let e = _mm256_fmadd_ps(_mm256_loadu_ps(row.add(i)), dv, _mm256_mul_ps(dd, _mm256_loadu_ps(pk.add(i))));
                _mm256_storeu_ps(row.add(i), e);
                aq = _mm256_fmadd_ps(e, _mm256_loadu_ps(pq.add(i)), aq);
                i += 8;
            }
            o[j] = hsum(aq) * scale;
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn axpy_256(alpha: f32, x: &[f32], y: &mut [f32]) {
        let n = x.len().min(y.len());
        let (px, py) = (x.as_ptr(), y.as_mut_ptr());
        let a = _mm256_set1_ps(alpha);
        let mut i = 0;
        while i + 8 <= n {
            _mm256_storeu_ps(py.add(i), _mm256_fmadd_ps(a, _mm256_loadu_ps(px.add(i)), _mm256_loadu_ps(py.add(i))));
            i += 8;
        }
        while i < n {
            *py.add(i) += alpha * *px.add(i);
            i += 1;
        }
    }

    /// [`super::dots_nt_many`]: `b` transposed by masked gathers into `bt` (`[s][m]`, `m`
    /// padded to 16 with zeros), then tiles of up to 4 rows by 64 outputs, each an f32
    /// multiply-add chain over `i` in order (a broadcast value of `a` times 16 of `bt`).
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f")]
    pub unsafe fn dots_nt_512(a: &mut [(&[f32], &mut [f32])], lda: usize, n: usize, b: *const f32, ldb: usize, m: usize, s: usize, ld: usize, bt: &mut Vec<f32>) {
        let mp = m.div_ceil(16) * 16;
        bt.clear();
        bt.reserve(s * mp);
        // SAFETY (caller): `b` holds `m` rows of `s` values `ldb` apart; `bt` holds `s * mp`.
        super::super::transpose_gather(b, ldb, m, s, bt.as_mut_ptr(), mp);
        bt.set_len(s * mp);
        let btp = bt.as_ptr();
        for (a, out) in a.iter_mut() {
            let (a, out) = (a.as_ptr(), out.as_mut_ptr());
            for r in (0..n).step_by(4) {
                for c in (0..mp).step_by(64) {
                    let (ap, bp, op, cols) = (a.add(r * lda), btp.add(c), out.add(r * ld + c), (m - c).min(64));
                    macro_rules! tiles {
                        ($($rr:literal)*) => {
                            match ((n - r).min(4), cols.div_ceil(16)) {
                                $(($rr, 1) => nn_tile::<$rr, 1>(ap, lda, bp, mp, s, op, ld, cols),
                                ($rr, 2) => nn_tile::<$rr, 2>(ap, lda, bp, mp, s, op, ld, cols),
                                ($rr, 3) => nn_tile::<$rr, 3>(ap, lda, bp, mp, s, op, ld, cols),
                                ($rr, _) => nn_tile::<$rr, 4>(ap, lda, bp, mp, s, op, ld, cols),)*
                                _ => unreachable!("1 to 4 rows"),
                            }
                        };
                    }
                    tiles!(1 2 3 4);
                }
            }
        }
    }

    /// `R` rows of `a` times `V` vectors of 16 columns of `bt` (rows `mp` apart), the first
    /// `cols` columns stored to `out` (rows `ld` apart).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    unsafe fn nn_tile<const R: usize, const V: usize>(a: *const f32, lda: usize, bt: *const f32, mp: usize, s: usize, out: *mut f32, ld: usize, cols: usize) {
        let mut acc = [[_mm512_setzero_ps(); V]; R];
        for i in 0..s {
            let mut bv = [_mm512_setzero_ps(); V];
            for (v, b) in bv.iter_mut().enumerate() {
                *b = _mm512_loadu_ps(bt.add(i * mp + 16 * v));
            }
            for (x, acc) in acc.iter_mut().enumerate() {
                let av = _mm512_set1_ps(*a.add(x * lda + i));
                for (acc, &b) in acc.iter_mut().zip(&bv) {
                    *acc = _mm512_fmadd_ps(av, b, *acc);
                }
            }
        }
        for (x, acc) in acc.iter().enumerate() {
            for (v, &acc) in acc.iter().enumerate() {
                _mm512_mask_storeu_ps(out.add(x * ld + 16 * v), super::super::lanes16(cols - 16 * v), acc);
            }
        }
    }

    /// [`super::rank_update`]: two rows of `m` by 64 values per pass (eight independent
    /// multiply-add chains over the chunk's rows, each loaded key row serving both rows), then
    /// 16 values at a time for what is left of a row.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn rank_update_512(m: &mut [f32], s: usize, decay: f32, c: &[f32], x: *const f32, ldx: usize, n: usize) {
        let dv = _mm512_set1_ps(decay);
        let mut j = 0;
        while j < s {
            let rows = (s - j).min(2);
            let mut i = 0;
            if rows == 2 {
                while i + 64 <= s {
                    let p0 = m.as_mut_ptr().add(j * s + i);
                    let mut a: [[__m512; 4]; 2] = std::array::from_fn(|r| std::array::from_fn(|v| _mm512_mul_ps(_mm512_loadu_ps(p0.add(r * s + 16 * v)), dv)));
                    for u in 0..n {
                        let xv: [__m512; 4] = std::array::from_fn(|v| _mm512_loadu_ps(x.add(u * ldx + i + 16 * v)));
                        for (r, a) in a.iter_mut().enumerate() {
                            let cv = _mm512_set1_ps(*c.get_unchecked(u * s + j + r));
                            for (a, &xv) in a.iter_mut().zip(&xv) {
                                *a = _mm512_fmadd_ps(cv, xv, *a);
                            }
                        }
                    }
                    for (r, a) in a.iter().enumerate() {
                        for (v, &a) in a.iter().enumerate() {
                            _mm512_storeu_ps(p0.add(r * s + 16 * v), a);
                        }
                    }
                    i += 64;
                }
            }
            while i < s {
                let p0 = m.as_mut_ptr().add(j * s + i);
                let mut a0 = _mm512_mul_ps(_mm512_loadu_ps(p0), dv);
                let mut a1 = if rows == 2 { _mm512_mul_ps(_mm512_loadu_ps(p0.add(s)), dv) } else { _mm512_setzero_ps() };
                for u in 0..n {
                    let xv = _mm512_loadu_ps(x.add(u * ldx + i));
                    a0 = _mm512_fmadd_ps(_mm512_set1_ps(*c.get_unchecked(u * s + j)), xv, a0);
                    if rows == 2 {
                        a1 = _mm512_fmadd_ps(_mm512_set1_ps(*c.get_unchecked(u * s + j + 1)), xv, a1);
                    }
                }
                _mm512_storeu_ps(p0, a0);
                if rows == 2 {
                    _mm512_storeu_ps(p0.add(s), a1);
                }
                i += 16;
            }
            j += 2;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vals(n: usize, seed: u32) -> Vec<f32> {
        (0..n as u32).map(|i| ((i.wrapping_mul(2654435761) ^ seed.wrapping_mul(40503)) % 1000) as f32 / 500.0 - 1.0).collect()
    }

    /// The SIMD forms agree with the plain arithmetic written out here.
    #[test]
    fn kernels_match_plain_arithmetic() {
        for s in [16, 24, 128] {
            let (k, q, v) = (vals(s, 1), vals(s, 2), vals(s, 3));
            let mut m = vals(s * s, 4);
            let mut want = m.clone();
            let mut o = vec![0f32; s];
            delta_step(&mut m, &k, &q, &v, 0.9, 0.7, 0.5, &mut o);
            for j in 0..s {
                let row = &mut want[j * s..(j + 1) * s];
                row.iter_mut().for_each(|e| *e *= 0.9);
                let d = (v[j] - row.iter().zip(&k).map(|(a, b)| a * b).sum::<f32>()) * 0.7;
                row.iter_mut().zip(&k).for_each(|(e, &ki)| *e += d * ki);
                let oj = row.iter().zip(&q).map(|(a, b)| a * b).sum::<f32>() * 0.5;
                assert!((o[j] - oj).abs() < 1e-4 * (1.0 + oj.abs()), "s {s} o[{j}] {} vs {oj}", o[j]);
            }
            assert!(m.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-4), "s {s}: state");
            // dots_nt_many on 5 x 6 rows; rank_update with 3 rows.
            let (a, b) = (vals(5 * s, 5), vals(6 * s, 6));
            let mut out = vec![0f32; 5 * 7];
            dots_nt_many(&mut [(&a, &mut out)], s, 5, &b, s, 6, s, 7);
            for r in 0..5 {
                for c in 0..6 {
                    let want: f32 = a[r * s..(r + 1) * s].iter().zip(&b[c * s..(c + 1) * s]).map(|(x, y)| x * y).sum();
                    assert!((out[r * 7 + c] - want).abs() < 1e-4 * (1.0 + want.abs()));
                }
            }
            let c = vals(3 * s, 7);
            let mut m2 = vals(s * s, 8);
            let before = m2.clone();
            rank_update(&mut m2, s, 0.5, &c, &a, s, 3);
            for j in 0..s {
                for i in 0..s {
                    let want = 0.5 * before[j * s + i] + (0..3).map(|u| c[u * s + j] * a[u * s + i]).sum::<f32>();
                    assert!((m2[j * s + i] - want).abs() < 1e-4, "rank_update s {s} [{j}][{i}]");
                }
            }
        }
    }
}
