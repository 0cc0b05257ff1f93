//! Attention over an f16 KV cache: scores of query rows against cached keys, the softmax,
//! and the probability-weighted sum of cached values; and one head of one query row over an
//! f32 cache of rows ([`attention_row_f32`], an encoder-decoder's self-attention).
//!
//! Keys are kept transposed in chunks of 16 ([`scores_chunks`]): each key has a vector lane
//! of its own, and its score is a chain of fused multiply-adds over the head's components, so
//! there is no horizontal sum and the result does not depend on the vector width or on how
//! many queries share a call. Values stay in rows ([`values_f16`]: one fused multiply-add
//! per output and value, in order of the values), and [`softmax_unnormalized`] gives the same
//! bits on every path. So a row's attention does not depend on how many rows, keys or heads
//! a call takes: a prompt's rows, a decode step's single row and speculative verification
//! rows agree bit for bit (AVX-512, AVX2, NEON on ARM64 (`neon_attn.rs`), or portable). A call
//! takes up to [`MAX_QUERIES`] queries that share a KV head
//! (the query heads of a grouped-query group, and neighbouring rows of a prompt when the
//! group has fewer heads), so each key read serves all of them.

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
use super::dispatch::by_count;
#[cfg(target_arch = "x86_64")]
use super::avx2;
use super::exp_approx;
#[cfg(target_arch = "x86_64")]
use super::{has_avx2, has_avx512};
#[cfg(target_arch = "aarch64")]
use super::{has_neon, neon_attn};

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

/// Most query rows [`scores_chunks`] and [`values_f16`] take in one call.
pub const MAX_QUERIES: usize = 8;
/// Rows [`values_f16`] takes in one call.
pub const MAX_VALUE_ROWS: usize = 4;

/// Attention scores against keys stored transposed in chunks of 16, as the paged KV cache
/// keeps them: component `d` of the 16 keys of a chunk is `kc[base + d * pitch..][..16]`
/// (f16 bits), for `d` in `0..hd` (`hd` = the queries' length).
///
/// `out[i * ostride + 16 * c + j]` becomes `score(qs[i], key j of chunk bases[c]) * scale`,
/// where a score is the chain of fused multiply-adds `s = fma(q[d], key[d], s)` for `d` from
/// 0 up, starting from `s = 0`. Each key sits in a vector lane of its own, so every path (any
/// number of queries or chunks, 16 or 8 lanes, or none) gives the same bits: a decode step's
/// one row, a prompt's rows and speculative verification agree exactly, with no horizontal
/// sums. At most [`MAX_QUERIES`] queries.
pub fn scores_chunks(qs: &[&[f32]], kc: &[u16], bases: &[usize], pitch: usize, scale: f32, out: &mut [f32], ostride: usize) {
    let nq = qs.len();
    assert!((1..=MAX_QUERIES).contains(&nq), "scores_chunks: 1 to {MAX_QUERIES} queries");
    let hd = qs[0].len();
    assert!(qs.iter().all(|q| q.len() == hd), "scores_chunks: queries of different lengths");
    assert!(pitch >= 16 || hd <= 1, "scores_chunks: pitch under 16");
    let span = if hd == 0 { 0 } else { (hd - 1) * pitch + 16 };
    assert!(bases.iter().all(|&b| b + span <= kc.len()), "scores_chunks: keys out of range");
    assert!(ostride >= 16 * bases.len() && out.len() >= (nq - 1) * ostride + 16 * bases.len(), "scores_chunks: output too short");
    #[cfg(target_arch = "x86_64")]
    if has_avx512() {
        let o = out.as_mut_ptr();
        macro_rules! go {
            ($q:literal, $u:literal) => {{
                let q: [*const f32; $q] = std::array::from_fn(|i| qs[i].as_ptr());
                // SAFETY: AVX-512 F/VL, FMA and F16C are present; ranges checked above.
                unsafe { x512::scores_chunks::<$q, $u>(q, hd, kc.as_ptr(), bases, pitch, scale, o, ostride) }
            }};
        }
        by_count!(nq => go { 1 (8), 2 (8), 3 (4), 4 (4), 5 (3), 6 (2), 7 (2); _ => 8 (2) });
        return;
    }
    // Four queries at a time: AVX2 (two vectors of 8 per chunk), NEON (four of 4).
    #[cfg(target_arch = "x86_64")]
    let by_fours = has_avx2();
    #[cfg(target_arch = "aarch64")]
    let by_fours = has_neon();
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    if by_fours {
        for (g, part) in qs.chunks(4).enumerate() {
            let o = out[g * 4 * ostride..].as_mut_ptr();
            macro_rules! go {
                ($q:literal, $u:literal) => {{
                    let q: [*const f32; $q] = std::array::from_fn(|i| part[i].as_ptr());
                    // SAFETY: AVX2, FMA and F16C are present (x86), or NEON (aarch64); ranges
                    // checked above.
                    #[cfg(target_arch = "x86_64")]
                    unsafe { avx2::scores_chunks::<$q, $u>(q, hd, kc.as_ptr(), bases, pitch, scale, o, ostride) }
                    #[cfg(target_arch = "aarch64")]
                    unsafe { neon_attn::scores_chunks::<$q, $u>(q, hd, kc.as_ptr(), bases, pitch, scale, o, ostride) }
                }};
            }
            by_count!(part.len() => go { 1 (4), 2 (2), 3 (1); _ => 4 (1) });
        }
        return;
    }
    for (c, &b) in bases.iter().enumerate() {
        for (i, q) in qs.iter().enumerate() {
            for j in 0..16 {
                let mut s = 0f32;
                for (d, qd) in q.iter().enumerate() {
                    s = qd.mul_add(half::f16::from_bits(kc[b + d * pitch + j]).to_f32(), s);
                }
                out[i * ostride + 16 * c + j] = s * scale;
            }
        }
    }
}

/// The weighted sums of attention: for values `t0..t1` of an f16 cache (value `t` at
/// `vc[t * stride + off..][..hd]`, `hd` = the outputs' length), in order of `t`,
/// `ys[r][d] = fma(ws[r][t - t0], value_t[d], ys[r][d])`. Every path does exactly these
/// fused multiply-adds in this order, so a row's result does not depend on how many rows a
/// call takes or where a run of values is cut. At most [`MAX_VALUE_ROWS`] rows.
#[allow(clippy::too_many_arguments)]
pub fn values_f16(ws: &[&[f32]], vc: &[u16], stride: usize, off: usize, t0: usize, t1: usize, ys: &mut [&mut [f32]]) {
    values_f16_runs(ws, vc, stride, off, &[(t0, t1.saturating_sub(t0))], ys);
}

/// [`values_f16`] over several runs of values in one call (the blocks of a paged cache):
/// run `(s, n)` is values `s..s + n`, and the runs follow each other in the weights, so the
/// `k`-th value over all the runs is weighted by `ws[r][k]`. The same fused multiply-adds in
/// the same order as one [`values_f16`] call a run, so the same bits; the AVX-512 path keeps
/// the sums in registers from one run to the next.
pub fn values_f16_runs(ws: &[&[f32]], vc: &[u16], stride: usize, off: usize, runs: &[(usize, usize)], ys: &mut [&mut [f32]]) {
    let nr = ys.len();
    assert!(nr == ws.len() && (1..=MAX_VALUE_ROWS).contains(&nr), "values_f16: 1 to {MAX_VALUE_ROWS} rows, as many weights");
    let hd = ys[0].len();
    assert!(ys.iter().all(|y| y.len() == hd), "values_f16: outputs of different lengths");
    assert!(runs.iter().all(|&(s, n)| n == 0 || (s + n - 1) * stride + off + hd <= vc.len()), "values_f16: values out of range");
    let total: usize = runs.iter().map(|r| r.1).sum();
    assert!(ws.iter().all(|w| w.len() >= total), "values_f16: weight rows too short");
    if total == 0 {
        return;
    }
    // The sums in registers over all the runs: AVX-512 (16 lanes), NEON (4).
    #[cfg(target_arch = "x86_64")]
    let in_registers = has_avx512() && hd.is_multiple_of(16);
    #[cfg(target_arch = "aarch64")]
    let in_registers = has_neon() && hd.is_multiple_of(4);
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    if in_registers {
        let v = vc[off..].as_ptr();
        macro_rules! go {
            ($r:literal) => {{
                let w: [*const f32; $r] = std::array::from_fn(|i| ws[i].as_ptr());
                let y: [*mut f32; $r] = std::array::from_fn(|i| ys[i].as_mut_ptr());
                // SAFETY: AVX-512 F/VL, FMA and F16C are present (x86), or NEON (aarch64);
                // ranges checked above; the rows are distinct `&mut` slices of `hd` values.
                #[cfg(target_arch = "x86_64")]
                unsafe { x512::values::<$r>(w, v, stride, hd, runs, y) }
                #[cfg(target_arch = "aarch64")]
                unsafe { neon_attn::values::<$r>(w, v, stride, hd, runs, y) }
            }};
        }
        by_count!(nr => go { 1, 2, 3; _ => 4 });
        return;
    }
    let mut k = 0;
    for &(t0, n) in runs {
        let t1 = t0 + n;
        if n == 0 {
            continue;
        }
        #[cfg(target_arch = "x86_64")]
        if has_avx2() && hd.is_multiple_of(8) {
            let v = vc[off..].as_ptr();
            macro_rules! go {
                ($r:literal, $nb:literal) => {{
                    let w: [*const f32; $r] = std::array::from_fn(|i| ws[i][k..].as_ptr());
                    let y: [*mut f32; $r] = std::array::from_fn(|i| ys[i].as_mut_ptr());
                    // SAFETY: AVX2, FMA and F16C are present; ranges checked above; the rows
                    // are distinct `&mut` slices of `hd` values.
                    unsafe { avx2::values_w::<$r, $nb>(w, v, stride, hd, t0, t1, y) }
                }};
            }
            by_count!(nr => go { 1 (8), 2 (4), 3 (2); _ => 4 (2) });
            k += n;
            continue;
        }
        for t in t0..t1 {
            let x = &vc[t * stride + off..t * stride + off + hd];
            for (w, y) in ws.iter().zip(ys.iter_mut()) {
                let a = w[k + t - t0];
                for (yd, xd) in y.iter_mut().zip(x) {
                    *yd = a.mul_add(half::f16::from_bits(*xd).to_f32(), *yd);
                }
            }
        }
        k += n;
    }
}

/// Ask for the first `max` values [`values_f16_runs`] (or [`values_q8`](super::values_q8),
/// or its scales) will read (`hd` elements at `vc[t * stride + off..]` for `t` in each run)
/// to be brought into L2, without waiting for them: a line at a time, in order. Called before
/// a unit's scores, the values arrive while the keys are scored (decode of many sequences
/// reads each one's values once, from memory, in short runs that the hardware prefetchers
/// barely start on). Changes nothing but timing.
pub fn prefetch_values<T>(vc: &[T], stride: usize, off: usize, hd: usize, runs: &[(usize, usize)], max: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
        if hd == 0 {
            return;
        }
        let (p, e) = (vc.as_ptr() as *const u8, std::mem::size_of::<T>());
        let mut left = max;
        for &(s, n) in runs {
            let n = n.min(left);
            left -= n;
            for t in s..s + n {
                // Every cache line of the value, wherever it starts.
                let a = p.wrapping_add(e * (t * stride + off));
                let (mut l, end) = (a.wrapping_sub(a as usize % 64), a.wrapping_add(e * hd));
                while l < end {
                    // SAFETY: prefetching never faults, whatever the address; addresses are
                    // only formed with wrapping arithmetic.
                    unsafe { _mm_prefetch::<_MM_HINT_T1>(l as *const i8) };
                    l = l.wrapping_add(64);
                }
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (vc, stride, off, hd, runs, max);
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
    #[cfg(target_arch = "aarch64")]
    if has_neon() {
        return neon_attn::softmax(sc);
    }
    softmax_portable(sc)
}

/// [`softmax_unnormalized`] with a sink: the exponentials of `sc` less their maximum with
/// `sink` (a learned logit of the head that no value goes with, gpt-oss's attention sinks
/// as ggml's `soft_max` takes them), and the inverse of their sum with the sink's.
pub fn softmax_with_sink(sc: &mut [f32], sink: f32) -> f32 {
    let max = sc.iter().fold(sink, |m, &x| m.max(x));
    let mut sum = 0f64;
    for x in sc.iter_mut() {
        *x = (*x - max).exp();
        sum += *x as f64;
    }
    sum += (sink - max).exp() as f64;
    (1.0 / sum) as f32
}

/// One head of one query row's attention over `s.len()` cached positions: `o` (`hd =
/// q.len()` values) becomes softmax(`scale` q·kⱼ)·vⱼ, where key and value `j` are
/// `k[j * d + off..][..hd]` and `v[j * d + off..][..hd]` (rows of `d` values, the head at
/// `off`); `s` holds the scores, then the weights. On AVX-512 with `hd` a multiple of 16 up
/// to 64, or AVX2 with `hd` a multiple of 8 up to 64, the query and the weighted sums stay in
/// registers (one pass over the keys, one over the values).
///
/// # Panics
/// When `o` is not `hd` long or the cache holds fewer than `s.len()` rows.
#[allow(clippy::too_many_arguments)]
pub fn attention_row_f32(q: &[f32], k: &[f32], v: &[f32], d: usize, off: usize, scale: f32, s: &mut [f32], o: &mut [f32]) {
    let (hd, len) = (q.len(), s.len());
    assert!(o.len() == hd && (len == 0 || ((len - 1) * d + off + hd <= k.len().min(v.len()))), "self-attention: cache too short");
    #[cfg(target_arch = "x86_64")]
    if has_avx512() && hd.is_multiple_of(16) && hd <= 64 {
        // SAFETY: AVX-512 F and FMA are present; every read is within the ranges checked above.
        unsafe {
            match hd / 16 {
                1 => x512::head::<1>(q, k, v, d, off, scale, s, o),
                2 => x512::head::<2>(q, k, v, d, off, scale, s, o),
                3 => x512::head::<3>(q, k, v, d, off, scale, s, o),
                _ => x512::head::<4>(q, k, v, d, off, scale, s, o),
            }
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx2() && hd.is_multiple_of(8) && hd <= 64 {
        // SAFETY: AVX2 and FMA are present; `hd` is a multiple of 8 up to 64 and every read is
        // within the ranges checked above.
        unsafe { row_avx2(q, k, v, d, off, scale, s, o) };
        return;
    }
    for (j, sv) in s.iter_mut().enumerate() {
        *sv = super::dot_f32(q, &k[j * d + off..j * d + off + hd]) * scale;
    }
    let inv = softmax_unnormalized(s);
    o.fill(0.0);
    for (j, &p) in s.iter().enumerate() {
        let p = p * inv;
        for (ov, vv) in o.iter_mut().zip(&v[j * d + off..j * d + off + hd]) {
            *ov += p * vv;
        }
    }
}

/// [`attention_row_f32`] on AVX2 (`hd` a multiple of 8 up to 64, the ranges checked).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
unsafe fn row_avx2(q: &[f32], k: &[f32], v: &[f32], d: usize, off: usize, scale: f32, s: &mut [f32], o: &mut [f32]) {
    macro_rules! go {
        ($nb:literal) => {
            head_avx2::<$nb>(q, k, v, d, off, scale, s, o)
        };
    }
    by_count!(q.len() / 8 => go { 1, 2, 3, 4, 5, 6, 7; _ => 8 })
}

/// [`attention_row_f32`] for a head of `8 * NB` values on AVX2: the query and the weighted
/// sums in registers.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn head_avx2<const NB: usize>(q: &[f32], k: &[f32], v: &[f32], d: usize, off: usize, scale: f32, s: &mut [f32], o: &mut [f32]) {
    use std::arch::x86_64::*;
    let qv: [__m256; NB] = std::array::from_fn(|b| _mm256_loadu_ps(q.as_ptr().add(8 * b)));
    let (kp, vp) = (k.as_ptr().add(off), v.as_ptr().add(off));
    for (j, sv) in s.iter_mut().enumerate() {
        let kr = kp.add(j * d);
        let mut acc = _mm256_mul_ps(qv[0], _mm256_loadu_ps(kr));
        for (b, qb) in qv.iter().enumerate().skip(1) {
            acc = _mm256_fmadd_ps(*qb, _mm256_loadu_ps(kr.add(8 * b)), acc);
        }
        let h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps::<1>(acc));
        let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
        *sv = _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h))) * scale;
    }
    let inv = softmax_unnormalized(s);
    let mut acc = [_mm256_setzero_ps(); NB];
    for (j, &p) in s.iter().enumerate() {
        let (pv, vr) = (_mm256_set1_ps(p), vp.add(j * d));
        for (b, a) in acc.iter_mut().enumerate() {
            *a = _mm256_fmadd_ps(pv, _mm256_loadu_ps(vr.add(8 * b)), *a);
        }
    }
    let iv = _mm256_set1_ps(inv);
    for (b, a) in acc.iter().enumerate() {
        _mm256_storeu_ps(o.as_mut_ptr().add(8 * b), _mm256_mul_ps(*a, iv));
    }
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
pub(super) fn fold16(l: [f32; 16]) -> f32 {
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
    use super::super::avx512::{exp8, lanes16 as first};
    use std::arch::x86_64::*;

    /// [`super::attention_row_f32`] for a head of `16 * NB` values: the query and the
    /// weighted sums in registers.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
    pub unsafe fn head<const NB: usize>(q: &[f32], k: &[f32], v: &[f32], d: usize, off: usize, scale: f32, s: &mut [f32], o: &mut [f32]) {
        unsafe {
            let qv: [__m512; NB] = std::array::from_fn(|b| _mm512_loadu_ps(q.as_ptr().add(16 * b)));
            let (kp, vp) = (k.as_ptr().add(off), v.as_ptr().add(off));
            for (j, sv) in s.iter_mut().enumerate() {
                let kr = kp.add(j * d);
                let mut acc = _mm512_mul_ps(qv[0], _mm512_loadu_ps(kr));
                for b in 1..NB {
                    acc = _mm512_fmadd_ps(qv[b], _mm512_loadu_ps(kr.add(16 * b)), acc);
                }
                *sv = _mm512_reduce_add_ps(acc) * scale;
            }
            let inv = super::softmax_unnormalized(s);
            let mut acc = [_mm512_setzero_ps(); NB];
            for (j, &p) in s.iter().enumerate() {
                let (pv, vr) = (_mm512_set1_ps(p), vp.add(j * d));
                for b in 0..NB {
                    acc[b] = _mm512_fmadd_ps(pv, _mm512_loadu_ps(vr.add(16 * b)), acc[b]);
                }
            }
            let iv = _mm512_set1_ps(inv);
            for b in 0..NB {
                _mm512_storeu_ps(o.as_mut_ptr().add(16 * b), _mm512_mul_ps(acc[b], iv));
            }
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

    /// [`super::scores_chunks`] with `Q` queries, `U` chunks at a time (`Q * U` accumulators).
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
    pub unsafe fn scores_chunks<const Q: usize, const U: usize>(qs: [*const f32; Q], hd: usize, kc: *const u16, bases: &[usize], pitch: usize, scale: f32, out: *mut f32, ostride: usize) {
        let sc = _mm512_set1_ps(scale);
        let mut c = 0;
        while c < bases.len() {
            let u = (bases.len() - c).min(U);
            // A short last group repeats its last chunk (results not stored).
            let k: [*const u16; U] = std::array::from_fn(|x| kc.add(bases[c + x.min(u - 1)]));
            // The next group's chunks (another block of the paged cache, where the hardware's
            // stream prefetch does not reach) are fetched while this group is summed.
            let kn: [*const u16; U] = std::array::from_fn(|x| bases.get(c + u + x).map_or(k[x], |&b| kc.add(b)));
            let mut acc = [[_mm512_setzero_ps(); U]; Q];
            for d in 0..hd {
                for p in kn {
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(d * pitch) as *const i8);
                }
                let kv: [__m512; U] = std::array::from_fn(|x| _mm512_cvtph_ps(_mm256_loadu_si256(k[x].add(d * pitch) as *const __m256i)));
                for i in 0..Q {
                    let q = _mm512_set1_ps(*qs[i].add(d));
                    for x in 0..U {
                        acc[i][x] = _mm512_fmadd_ps(q, kv[x], acc[i][x]);
                    }
                }
            }
            for i in 0..Q {
                for x in 0..u {
                    _mm512_storeu_ps(out.add(i * ostride + 16 * (c + x)), _mm512_mul_ps(acc[i][x], sc));
                }
            }
            c += u;
        }
    }

    /// [`super::values_f16_runs`] (`hd` a multiple of 16): up to 64 outputs of each row in
    /// registers over all the runs of values.
    #[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
    pub unsafe fn values<const R: usize>(w: [*const f32; R], vc: *const u16, stride: usize, hd: usize, runs: &[(usize, usize)], ys: [*mut f32; R]) {
        let mut d0 = 0;
        while d0 < hd {
            match (hd - d0) / 16 {
                1 => values_block::<R, 1>(w, vc.add(d0), stride, runs, ys.map(|y| y.add(d0))),
                2 => values_block::<R, 2>(w, vc.add(d0), stride, runs, ys.map(|y| y.add(d0))),
                3 => values_block::<R, 3>(w, vc.add(d0), stride, runs, ys.map(|y| y.add(d0))),
                _ => values_block::<R, 4>(w, vc.add(d0), stride, runs, ys.map(|y| y.add(d0))),
            }
            d0 += 64;
        }
    }

    /// How many rows of values ahead [`values_block`] prefetches (into L1; they are mostly in
    /// L2 already, [`super::prefetch_values`]). 32 against 16 in a single-thread probe of 16
    /// sequences x 160 positions of SmolLM2's shapes on the Zen 4: 4.7-5.1 ms a step against
    /// 4.9-5.4 (6 alternating rounds, 32 ahead the faster in each); 64 was slower.
    const AHEAD: usize = 32;

    #[inline(always)]
    unsafe fn values_block<const R: usize, const NB: usize>(w: [*const f32; R], vc: *const u16, stride: usize, runs: &[(usize, usize)], ys: [*mut f32; R]) {
        let mut acc: [[__m512; NB]; R] = std::array::from_fn(|r| std::array::from_fn(|b| _mm512_loadu_ps(ys[r].add(16 * b))));
        let mut w = w;
        for (ri, &(t0, n)) in runs.iter().enumerate() {
            let mut px = vc.add(t0 * stride);
            // The values come from memory a block at a time: fetch `AHEAD` rows ahead, into the
            // next run near the end of this one (a prefetch never faults, and addresses are
            // only formed with wrapping arithmetic).
            let next = runs.get(ri + 1).map_or(px, |&(s, _)| vc.wrapping_add(s * stride));
            for i in 0..n {
                let pf = if i + AHEAD < n { px.wrapping_add(AHEAD * stride) } else { next.wrapping_add((i + AHEAD - n) * stride) };
                for l in 0..(NB * 32).div_ceil(64) {
                    _mm_prefetch::<_MM_HINT_T0>(pf.wrapping_add(32 * l) as *const i8);
                }
                let x: [__m512; NB] = std::array::from_fn(|b| _mm512_cvtph_ps(_mm256_loadu_si256(px.add(16 * b) as *const __m256i)));
                for r in 0..R {
                    let va = _mm512_set1_ps(*w[r].add(i));
                    for b in 0..NB {
                        acc[r][b] = _mm512_fmadd_ps(va, x[b], acc[r][b]);
                    }
                }
                px = px.add(stride);
            }
            w = w.map(|p| p.add(n));
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

    /// One head of one row over cached f32 rows equals the attention in f64, for every head
    /// size the AVX-512 path takes and one it does not (48 + 8), at several cache lengths, on
    /// the path the CPU takes and on the AVX2 one (every multiple of 8 up to 64).
    #[test]
    fn attention_row_matches_f64() {
        for hd in [8usize, 16, 24, 32, 40, 48, 56, 64] {
            let (heads, off_head) = (3usize, 1usize);
            let d = heads * hd;
            let off = off_head * hd;
            for len in [1usize, 2, 17, 100] {
                let val = |i: usize, salt: usize| (((i * 7919 + salt * 104_729) % 1009) as f32 / 1009.0 - 0.5) * 2.0;
                let q: Vec<f32> = (0..hd).map(|i| val(i, 1)).collect();
                let k: Vec<f32> = (0..len * d).map(|i| val(i, 2)).collect();
                let v: Vec<f32> = (0..len * d).map(|i| val(i, 3)).collect();
                let scale = 1.0 / (hd as f32).sqrt();
                let mut s = vec![0f32; len];
                let mut o = vec![0f32; hd];
                attention_row_f32(&q, &k, &v, d, off, scale, &mut s, &mut o);
                let mut outs = vec![o];
                #[cfg(target_arch = "x86_64")]
                if has_avx2() {
                    let mut o = vec![0f32; hd];
                    // SAFETY: AVX2 and FMA are present; `hd` is a multiple of 8 up to 64 and
                    // the cache holds `len` rows of `d`.
                    unsafe { row_avx2(&q, &k, &v, d, off, scale, &mut s, &mut o) };
                    outs.push(o);
                }
                let sc: Vec<f64> = (0..len).map(|j| (0..hd).map(|e| q[e] as f64 * k[j * d + off + e] as f64).sum::<f64>() * scale as f64).collect();
                let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let w: Vec<f64> = sc.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = w.iter().sum();
                for (path, o) in outs.iter().enumerate() {
                    for e in 0..hd {
                        let want: f64 = (0..len).map(|j| w[j] * v[j * d + off + e] as f64).sum::<f64>() / z;
                        assert!((o[e] as f64 - want).abs() <= 1e-5, "path {path} hd={hd} len={len} e={e}: {} vs {want}", o[e]);
                    }
                }
            }
        }
    }
}
