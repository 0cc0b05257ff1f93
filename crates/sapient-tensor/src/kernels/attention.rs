//! Attention over an f16 KV cache: scores of query rows against cached keys, the softmax,
//! and the probability-weighted sum of cached values.
//!
//! Every score is computed exactly as [`dot_f32_f16`] computes it (the same products, the same
//! accumulators and the same additions), every value row exactly as [`axpy_f16`] calls in key
//! order would accumulate it, and [`softmax_unnormalized`] gives the same bits on every path,
//! so a row's attention does not depend on how many rows, keys or heads a call takes: a
//! prompt's rows, a decode step's single row and speculative verification rows agree bit for
//! bit. The AVX-512 kernels (head sizes that are multiples of 16) keep the AVX2 kernels'
//! order of additions: a 16-lane accumulator holds the AVX2 kernels' two 8-lane ones, and 16
//! sums are reduced together by a tree of shuffles that adds the same pairs as `hsum`.

#[cfg(target_arch = "x86_64")]
use super::avx2;
use super::exp_approx;
#[cfg(target_arch = "x86_64")]
use super::{has_avx2, has_avx512};

/// Dot product of f32 `x` with f16 `y` (raw bits, as in an f16 KV cache).
#[inline]
pub fn dot_f32_f16(x: &[f32], y: &[u16]) -> f32 {
    let n = x.len().min(y.len());
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2, FMA and F16C are present; `y` is cut to `x`'s length.
        return unsafe { avx2::dot_f32_f16(x, &y[..n]) };
    }
    x.iter()
        .zip(y)
        .map(|(a, b)| a * half::f16::from_bits(*b).to_f32())
        .sum()
}

/// Attention scores of four query rows against keys `t0..t1` of an f16 cache (key `t` at
/// `kc[t * stride + off..][..hd]`): `out[r][t - t0] = dot(qs[r], key) * scale`, each exactly
/// as [`dot_f32_f16`] computes it.
#[allow(clippy::too_many_arguments)]
pub fn scores4_f16(qs: [&[f32]; 4], kc: &[u16], stride: usize, off: usize, t0: usize, t1: usize, scale: f32, out: [&mut [f32]; 4]) {
    let hd = qs.iter().map(|q| q.len()).min().unwrap_or(0);
    assert!(t1 <= t0 || (t1 - 1) * stride + off + hd <= kc.len(), "scores4_f16: keys out of range");
    assert!(out.iter().all(|o| o.len() >= t1.saturating_sub(t0)), "scores4_f16: output rows too short");
    #[cfg(target_arch = "x86_64")]
    if has_avx512() && hd.is_multiple_of(16) {
        // SAFETY: AVX-512 F/VL, FMA and F16C are present; ranges checked above.
        return unsafe {
            x512::scores::<4>(qs.map(|q| q.as_ptr()), kc[off.min(kc.len())..].as_ptr(), stride, hd, t0, t1, scale, out.map(|o| o.as_mut_ptr()))
        };
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2, FMA and F16C are present; ranges checked above.
        return unsafe {
            avx2::scores4_f16(qs, &kc[off.min(kc.len())..], stride, hd, t0, t1, scale, out.map(|o| o.as_mut_ptr()))
        };
    }
    for t in t0..t1 {
        let key = &kc[t * stride + off..t * stride + off + hd];
        for r in 0..4 {
            out[r][t - t0] = dot_f32_f16(qs[r], key) * scale;
        }
    }
}

/// Attention outputs of four rows from values `t0..t1` of an f16 cache: `ys[r] +=
/// (p[r][t - t0] * inv[r]) * value_t` in order of `t`, each row exactly as [`axpy_f16`] calls
/// would do it.
#[allow(clippy::too_many_arguments)]
pub fn values4_f16(p: [&[f32]; 4], inv: [f32; 4], vc: &[u16], stride: usize, off: usize, t0: usize, t1: usize, ys: [&mut [f32]; 4]) {
    let hd = ys.iter().map(|y| y.len()).min().unwrap_or(0);
    assert!(t1 <= t0 || (t1 - 1) * stride + off + hd <= vc.len(), "values4_f16: values out of range");
    assert!(p.iter().all(|pr| pr.len() >= t1.saturating_sub(t0)), "values4_f16: probability rows too short");
    #[cfg(target_arch = "x86_64")]
    if has_avx512() && hd.is_multiple_of(16) {
        // SAFETY: AVX-512 F/VL, FMA and F16C are present; ranges checked above; the rows
        // are distinct `&mut` slices at least `hd` long.
        return unsafe {
            x512::values::<4>(p.map(|x| x.as_ptr()), inv, vc[off.min(vc.len())..].as_ptr(), stride, hd, t0, t1, ys.map(|y| y.as_mut_ptr()))
        };
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2, FMA and F16C are present; ranges checked above; the rows are
        // distinct `&mut` slices at least `hd` long.
        return unsafe {
            avx2::values4_f16(p.map(|x| x.as_ptr()), inv, &vc[off.min(vc.len())..], stride, hd, t0, t1, ys.map(|y| y.as_mut_ptr()))
        };
    }
    for t in t0..t1 {
        let v = &vc[t * stride + off..t * stride + off + hd];
        for r in 0..4 {
            axpy_f16(p[r][t - t0] * inv[r], v, ys[r]);
        }
    }
}

/// [`scores4_f16`] for one query row: `out[t - t0] = dot(q, key_t) * scale`, each exactly as
/// [`dot_f32_f16`] computes it (a decode step's attention, without a call per key).
#[allow(clippy::too_many_arguments)]
pub fn scores1_f16(q: &[f32], kc: &[u16], stride: usize, off: usize, t0: usize, t1: usize, scale: f32, out: &mut [f32]) {
    let hd = q.len();
    assert!(t1 <= t0 || (t1 - 1) * stride + off + hd <= kc.len(), "scores1_f16: keys out of range");
    assert!(out.len() >= t1.saturating_sub(t0), "scores1_f16: output row too short");
    #[cfg(target_arch = "x86_64")]
    if has_avx512() && hd.is_multiple_of(16) {
        // SAFETY: AVX-512 F/VL, FMA and F16C are present; ranges checked above.
        return unsafe {
            x512::scores::<1>([q.as_ptr()], kc[off.min(kc.len())..].as_ptr(), stride, hd, t0, t1, scale, [out.as_mut_ptr()])
        };
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2, FMA and F16C are present; ranges checked above.
        return unsafe {
            avx2::scores1_f16(q, &kc[off.min(kc.len())..], stride, hd, t0, t1, scale, out.as_mut_ptr())
        };
    }
    for t in t0..t1 {
        out[t - t0] = dot_f32_f16(q, &kc[t * stride + off..t * stride + off + hd]) * scale;
    }
}

/// [`values4_f16`] for one row: `y += (p[t - t0] * inv) * value_t` in order of `t`, exactly
/// as [`axpy_f16`] calls would do it.
#[allow(clippy::too_many_arguments)]
pub fn values1_f16(p: &[f32], inv: f32, vc: &[u16], stride: usize, off: usize, t0: usize, t1: usize, y: &mut [f32]) {
    let hd = y.len();
    assert!(t1 <= t0 || (t1 - 1) * stride + off + hd <= vc.len(), "values1_f16: values out of range");
    assert!(p.len() >= t1.saturating_sub(t0), "values1_f16: probability row too short");
    #[cfg(target_arch = "x86_64")]
    if has_avx512() && hd.is_multiple_of(16) {
        // SAFETY: AVX-512 F/VL, FMA and F16C are present; ranges checked above.
        return unsafe {
            x512::values::<1>([p.as_ptr()], [inv], vc[off.min(vc.len())..].as_ptr(), stride, hd, t0, t1, [y.as_mut_ptr()])
        };
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2, FMA and F16C are present; ranges checked above.
        return unsafe {
            avx2::values1_f16(p.as_ptr(), inv, &vc[off.min(vc.len())..], stride, hd, t0, t1, y.as_mut_ptr())
        };
    }
    for t in t0..t1 {
        axpy_f16(p[t - t0] * inv, &vc[t * stride + off..t * stride + off + hd], y);
    }
}

/// `y += a * x` with f16 `x` (raw bits).
#[inline]
pub fn axpy_f16(a: f32, x: &[u16], y: &mut [f32]) {
    let n = x.len().min(y.len());
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2, FMA and F16C are present; `x` is cut to `y`'s length.
        return unsafe { avx2::axpy_f16(a, &x[..n], y) };
    }
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += a * half::f16::from_bits(*xi).to_f32();
    }
}

/// A row of attention scores to `e^(score - max)` in place ([`exp_approx`]); returns `1 /
/// sum`, by which the caller scales each weight as it accumulates the values. The sum runs in
/// 16 lanes (value `i` into lane `i % 16`) folded in halves at the end, on every path.
pub fn softmax_unnormalized(sc: &mut [f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if has_avx512() {
        // SAFETY: AVX-512 F/VL, FMA and F16C are present.
        return unsafe { x512::softmax(sc) };
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 and FMA are present.
        return unsafe { softmax_avx2(sc) };
    }
    softmax_portable(sc)
}

fn softmax_portable(sc: &mut [f32]) -> f32 {
    let max = sc.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v));
    let mut lanes = [0f32; 16];
    for (i, v) in sc.iter_mut().enumerate() {
        *v = exp_approx(*v - max);
        lanes[i % 16] += *v;
    }
    1.0 / fold16(lanes)
}

/// The sum of 16 lanes as `hsum` reduces them: halves, quarters, pairs.
#[inline(always)]
fn fold16(l: [f32; 16]) -> f32 {
    let s: [f32; 8] = std::array::from_fn(|i| l[i] + l[i + 8]);
    let t: [f32; 4] = std::array::from_fn(|i| s[i] + s[i + 4]);
    (t[0] + t[2]) + (t[1] + t[3])
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn softmax_avx2(sc: &mut [f32]) -> f32 {
    use std::arch::x86_64::*;
    let n = sc.len();
    let p = sc.as_mut_ptr();
    let mut m = _mm256_set1_ps(f32::NEG_INFINITY);
    let mut i = 0;
    while i + 8 <= n {
        m = _mm256_max_ps(m, _mm256_loadu_ps(p.add(i)));
        i += 8;
    }
    let mut mx = [0f32; 8];
    _mm256_storeu_ps(mx.as_mut_ptr(), m);
    let max = sc[i..]
        .iter()
        .chain(&mx)
        .fold(f32::NEG_INFINITY, |a, v| a.max(*v));
    let vmax = _mm256_set1_ps(max);
    let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    i = 0;
    while i + 16 <= n {
        let a = _mm256_sub_ps(_mm256_loadu_ps(p.add(i)), vmax);
        let b = _mm256_sub_ps(_mm256_loadu_ps(p.add(i + 8)), vmax);
        let ea = _mm256_set_m128(avx2::exp4(_mm256_extractf128_ps::<1>(a)), avx2::exp4(_mm256_castps256_ps128(a)));
        let eb = _mm256_set_m128(avx2::exp4(_mm256_extractf128_ps::<1>(b)), avx2::exp4(_mm256_castps256_ps128(b)));
        _mm256_storeu_ps(p.add(i), ea);
        _mm256_storeu_ps(p.add(i + 8), eb);
        lo = _mm256_add_ps(lo, ea);
        hi = _mm256_add_ps(hi, eb);
        i += 16;
    }
    let mut lanes = [0f32; 16];
    _mm256_storeu_ps(lanes.as_mut_ptr(), lo);
    _mm256_storeu_ps(lanes.as_mut_ptr().add(8), hi);
    for (j, v) in sc[i..].iter_mut().enumerate() {
        *v = exp_approx(*v - max);
        lanes[j] += *v;
    }
    1.0 / fold16(lanes)
}

#[cfg(target_arch = "x86_64")]
mod x512 {
    #![allow(clippy::missing_safety_doc, clippy::needless_range_loop)]
    use super::super::avx512::exp8;
    use std::arch::x86_64::*;

    /// Lanes `n..16` off.
    #[inline(always)]
    fn first(n: usize) -> __mmask16 {
        if n >= 16 {
            0xffff
        } else {
            ((1u32 << n) - 1) as __mmask16
        }
    }

    #[inline(always)]
    unsafe fn exp16(x: __m512) -> __m512 {
        let lo = exp8(_mm512_castps512_ps256(x));
        let hi = exp8(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(x))));
        _mm512_castpd_ps(_mm512_insertf64x4::<1>(_mm512_castps_pd(_mm512_castps256_ps512(lo)), _mm256_castps_pd(hi)))
    }

    /// [`super::fold16`] of one vector.
    #[inline(always)]
    unsafe fn fold(v: __m512) -> f32 {
        let s = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))));
        let t = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s));
        let u = _mm_add_ps(t, _mm_movehl_ps(t, t));
        _mm_cvtss_f32(_mm_add_ss(u, _mm_movehdup_ps(u)))
    }

    #[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
    pub unsafe fn softmax(sc: &mut [f32]) -> f32 {
        let n = sc.len();
        let p = sc.as_mut_ptr();
        let mut m = _mm512_set1_ps(f32::NEG_INFINITY);
        let mut i = 0;
        while i < n {
            let k = first(n - i);
            m = _mm512_mask_max_ps(m, k, m, _mm512_maskz_loadu_ps(k, p.add(i)));
            i += 16;
        }
        let vmax = _mm512_set1_ps(_mm512_reduce_max_ps(m));
        let mut sum = _mm512_setzero_ps();
        i = 0;
        while i < n {
            let k = first(n - i);
            let e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, p.add(i)), vmax));
            _mm512_mask_storeu_ps(p.add(i), k, e);
            sum = _mm512_mask_add_ps(sum, k, sum, e);
            i += 16;
        }
        1.0 / fold(sum)
    }

    /// Slot of key `j` of a block of 16 so that [`tree`] leaves key `j`'s sum in lane `j`.
    const SLOT: [usize; 16] = [0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15];

    /// The 16 sums of 16 accumulators, each added in `hsum`'s order (the halves of the two
    /// 8-lane accumulators, then quarters, pairs, and the last two), slot `4q + i` in lane
    /// `q + 4i`.
    #[inline(always)]
    unsafe fn tree(a: &[__m512; 16]) -> __m512 {
        let s: [__m512; 8] = std::array::from_fn(|k| { _mm512_add_ps(_mm512_shuffle_f32x4::<0x44>(a[2 * k], a[2 * k + 1]), _mm512_shuffle_f32x4::<0xEE>(a[2 * k], a[2 * k + 1])) });
        let t: [__m512; 4] = std::array::from_fn(|m| { _mm512_add_ps(_mm512_shuffle_f32x4::<0x88>(s[2 * m], s[2 * m + 1]), _mm512_shuffle_f32x4::<0xDD>(s[2 * m], s[2 * m + 1])) });
        let u: [__m512; 2] = std::array::from_fn(|p| { _mm512_add_ps(_mm512_shuffle_ps::<0x44>(t[2 * p], t[2 * p + 1]), _mm512_shuffle_ps::<0xEE>(t[2 * p], t[2 * p + 1])) });
        _mm512_add_ps(_mm512_shuffle_ps::<0x88>(u[0], u[1]), _mm512_shuffle_ps::<0xDD>(u[0], u[1]))
    }

    /// `out[r][t - t0] = dot(qs[r], key_t) * scale` for keys `t0..t1` (key `t` at
    /// `kc[t * stride..][..hd]`, `hd` a multiple of 16), 16 keys at a time.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
    pub unsafe fn scores<const R: usize>(qs: [*const f32; R], kc: *const u16, stride: usize, hd: usize, t0: usize, t1: usize, scale: f32, out: [*mut f32; R]) {
        let sc = _mm512_set1_ps(scale);
        let mut acc = [[_mm512_setzero_ps(); 16]; R];
        let mut t = t0;
        while t < t1 {
            let nk = (t1 - t).min(16);
            for j in 0..16 {
                let mut a = [_mm512_setzero_ps(); R];
                if j < nk {
                    let pk = kc.add((t + j) * stride);
                    let mut c = 0;
                    while c < hd {
                        let k = _mm512_cvtph_ps(_mm256_loadu_si256(pk.add(c) as *const __m256i));
                        for r in 0..R {
                            a[r] = _mm512_fmadd_ps(_mm512_loadu_ps(qs[r].add(c)), k, a[r]);
                        }
                        c += 16;
                    }
                }
                for r in 0..R {
                    acc[r][SLOT[j]] = a[r];
                }
            }
            for r in 0..R {
                _mm512_mask_storeu_ps(out[r].add(t - t0), first(nk), _mm512_mul_ps(tree(&acc[r]), sc));
            }
            t += nk;
        }
    }

    /// `ys[r] += (p[r][t - t0] * inv[r]) * value_t` for values `t0..t1` in order of `t`
    /// (`hd` a multiple of 16), up to 64 outputs of each row in registers over all the values.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
    pub unsafe fn values<const R: usize>(p: [*const f32; R], inv: [f32; R], vc: *const u16, stride: usize, hd: usize, t0: usize, t1: usize, ys: [*mut f32; R]) {
        let mut d0 = 0;
        while d0 < hd {
            match (hd - d0) / 16 {
                1 => {
                    values_block::<R, 1>(p, inv, vc.add(d0), stride, t0, t1, ys.map(|y| y.add(d0)))
                }
                2 => {
                    values_block::<R, 2>(p, inv, vc.add(d0), stride, t0, t1, ys.map(|y| y.add(d0)))
                }
                3 => {
                    values_block::<R, 3>(p, inv, vc.add(d0), stride, t0, t1, ys.map(|y| y.add(d0)))
                }
                _ => {
                    values_block::<R, 4>(p, inv, vc.add(d0), stride, t0, t1, ys.map(|y| y.add(d0)))
                }
            }
            d0 += 64;
        }
    }

    #[inline(always)]
    unsafe fn values_block<const R: usize, const NB: usize>(p: [*const f32; R], inv: [f32; R], vc: *const u16, stride: usize, t0: usize, t1: usize, ys: [*mut f32; R]) {
        let mut acc: [[__m512; NB]; R] = std::array::from_fn(|r| std::array::from_fn(|b| _mm512_loadu_ps(ys[r].add(16 * b))));
        for t in t0..t1 {
            let px = vc.add(t * stride);
            let x: [__m512; NB] = std::array::from_fn(|b| { _mm512_cvtph_ps(_mm256_loadu_si256(px.add(16 * b) as *const __m256i)) });
            for r in 0..R {
                let va = _mm512_set1_ps(*p[r].add(t - t0) * inv[r]);
                for b in 0..NB {
                    acc[r][b] = _mm512_fmadd_ps(va, x[b], acc[r][b]);
                }
            }
        }
        for r in 0..R {
            for b in 0..NB {
                _mm512_storeu_ps(ys[r].add(16 * b), acc[r][b]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every path gives the portable softmax's bits, for lengths around the vector widths,
    /// and the weights are e^(x - max) to f32 precision.
    #[test]
    fn softmax_paths_agree() {
        for n in (1..70).chain([255, 256, 257, 1000]) {
            let x: Vec<f32> = (0..n)
                .map(|i| ((i * 7919 % 113) as f32 - 50.0) * 0.37)
                .collect();
            let mut a = x.clone();
            let mut b = x.clone();
            let ia = softmax_unnormalized(&mut a);
            let ib = softmax_portable(&mut b);
            assert_eq!(ia.to_bits(), ib.to_bits(), "n={n}");
            assert_eq!(a, b, "n={n}");
            #[cfg(target_arch = "x86_64")]
            if has_avx2() {
                let mut c = x.clone();
                // SAFETY: AVX2 and FMA are present.
                let ic = unsafe { softmax_avx2(&mut c) };
                assert_eq!((ic.to_bits(), &c), (ib.to_bits(), &b), "avx2 n={n}");
            }
            let max = x.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v)) as f64;
            let sum: f64 = x.iter().map(|v| (*v as f64 - max).exp()).sum();
            for (v, w) in x.iter().zip(&a) {
                let want = (*v as f64 - max).exp();
                assert!((*w as f64 - want).abs() <= 1e-5 * want, "n={n}: {w} vs {want}");
            }
            assert!((1.0 / ia as f64 - sum).abs() <= 1e-5 * sum, "n={n}");
        }
    }
}
