//! Attention over an 8-bit KV cache, as llama.cpp's `q8_0` cache types: every key and value
//! is kept as int8 components with one f16 scale per group of [`Q8_GROUP`] components along
//! the head dimension (GGML's Q8_0 block: `d = max|x| / 127`, `q = round(x / d)`).
//!
//! Keys are stored as in the f16 cache, transposed in chunks of 16 positions, but by four
//! components at a time: the four bytes of components `4c..4c + 4` of one key sit together,
//! and the 16 keys of a chunk follow each other (64 bytes), each byte biased by 128 (`k + 128`,
//! unsigned). The query is quantized to int8 in the same groups ([`QueryQ8`]), and one
//! `vpdpbusd` adds four components' products for each of 16 keys at once: the sum of a group
//! is an exact integer (`sum((k + 128) q) - 128 sum(q)`), then scaled by the key's and the
//! query's scales and added up in f32 in order of the groups, per key lane. Values stay in
//! rows of int8 with their group scales ([`values_q8`]: one fused multiply-add per output
//! and value, by `weight * scale`, in order of the values). Every path (AVX-512 VNNI, AVX2
//! with 16-bit products, NEON on ARM64 with `sdot` or widening multiplies (`neon_attn.rs`),
//! or portable) does the same integer sums and the same f32 operations in the same order, so
//! the results are bit-identical whatever the machine, the number of queries or keys a call
//! takes, or the batch: a row gives what it gives alone.
//!
//! A component costs 1.0625 bytes against the f16 cache's 2, so a budget in bytes holds 1.88
//! times the positions; the head dimension must be a multiple of [`Q8_GROUP`].

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
use super::dispatch::by_count;
use super::{has_avx2, has_avx512};
#[cfg(target_arch = "aarch64")]
use super::{has_neon, neon_attn, neon_quant};
use super::MAX_QUERIES;
use super::MAX_VALUE_ROWS;

/// Components per scale along the head dimension in the 8-bit KV cache (the head dimension
/// must be a multiple of it).
pub const Q8_GROUP: usize = 32;

/// Quantizes `x` (a multiple of [`Q8_GROUP`] long) as the 8-bit cache keeps keys and
/// values: per group of 32, `d = max|x| / 127` rounded to f16 (its bits into `d`), and `q =
/// round(x / d)` (to nearest, ties to even; 0 for an all-zero group).
pub fn quantize_q8_f16(x: &[f32], q: &mut [i8], d: &mut [u16]) {
    for ((xs, qs), dd) in x.chunks_exact(Q8_GROUP).zip(q.chunks_exact_mut(Q8_GROUP)).zip(d.iter_mut()) {
        let h = half::f16::from_f32(amax32(xs) / 127.0);
        let df = h.to_f32();
        let id = if df > 0.0 && df.is_finite() { 1.0 / df } else { 0.0 };
        round32(xs, id, qs);
        *dd = h.to_bits();
    }
}

/// `max |x|` over a group of 32.
#[inline]
fn amax32(x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if has_avx512() && x.len() == Q8_GROUP {
        // SAFETY: AVX-512 F is present; `x` holds 32 values.
        return unsafe { x512::amax32(x.as_ptr()) };
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx2() && x.len() == Q8_GROUP {
        // SAFETY: AVX2 is present; `x` holds 32 values.
        return unsafe { xavx2::amax32(x.as_ptr()) };
    }
    #[cfg(target_arch = "aarch64")]
    if has_neon() && x.len() == Q8_GROUP {
        // SAFETY: `x` holds 32 values.
        return unsafe { neon_quant::amax32(x.as_ptr()) };
    }
    x.iter().fold(0f32, |m, v| m.max(v.abs()))
}

/// `q = round(clamp(x * id, -127, 127))` (to nearest, ties to even) over a group of 32;
/// returns the sum of `q`.
#[inline]
fn round32(x: &[f32], id: f32, q: &mut [i8]) -> i32 {
    #[cfg(target_arch = "x86_64")]
    if has_avx512() && x.len() == Q8_GROUP && q.len() == Q8_GROUP {
        // SAFETY: AVX-512 F/BW is present; `x` and `q` hold 32 values.
        return unsafe { x512::round32(x.as_ptr(), id, q.as_mut_ptr()) };
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx2() && x.len() == Q8_GROUP && q.len() == Q8_GROUP {
        // SAFETY: AVX2 is present; `x` and `q` hold 32 values.
        return unsafe { xavx2::round32(x.as_ptr(), id, q.as_mut_ptr()) };
    }
    #[cfg(target_arch = "aarch64")]
    if has_neon() && x.len() == Q8_GROUP && q.len() == Q8_GROUP {
        // SAFETY: `x` and `q` hold 32 values.
        return unsafe { neon_quant::round32(x.as_ptr(), id, q.as_mut_ptr()) };
    }
    let mut sum = 0;
    for (o, &v) in q.iter_mut().zip(x) {
        *o = (v * id).clamp(-127.0, 127.0).round_ties_even() as i8;
        sum += *o as i32;
    }
    sum
}

/// A query quantized for [`scores_chunks_q8`]: int8 components, and per group of
/// [`Q8_GROUP`] its scale and `-128 x` the sum of its components (which takes the keys'
/// bias of 128 back out of the integer sums).
#[derive(Debug, Default, Clone)]
pub struct QueryQ8 {
    q: Vec<i8>,
    d: Vec<f32>,
    corr: Vec<i32>,
}

impl QueryQ8 {
    /// Quantizes `x` (a multiple of [`Q8_GROUP`] long; a shorter tail is dropped) in place
    /// of what the query held: per group `d = max|x| / 127` (f32), `q = round(x / d)` (to
    /// nearest, ties to even).
    pub fn set(&mut self, x: &[f32]) {
        let g = x.len() / Q8_GROUP;
        self.q.resize(g * Q8_GROUP, 0);
        self.d.resize(g, 0.0);
        self.corr.resize(g, 0);
        for (((xs, qs), d), c) in x.chunks_exact(Q8_GROUP).zip(self.q.chunks_exact_mut(Q8_GROUP)).zip(&mut self.d).zip(&mut self.corr) {
            *d = amax32(xs) / 127.0;
            let id = if *d > 0.0 && d.is_finite() { 1.0 / *d } else { 0.0 };
            *c = -128 * round32(xs, id, qs);
        }
    }

    /// Components held.
    pub fn len(&self) -> usize {
        self.q.len()
    }
    pub fn is_empty(&self) -> bool {
        self.q.is_empty()
    }
}

/// Attention scores of quantized queries against keys of the 8-bit cache (see the module
/// docs), stored transposed by four components: byte `d % 4` of component quad `d / 4` of
/// key `j` of a chunk is `kc[bases[c] + (d / 4) * 4 * pitch + 4 * j + d % 4]` (`k + 128`),
/// and the f16 scale of its group `g` is `ks[sbases[c] + g * pitch + j]`, for `d` in `0..hd`
/// (`hd` = the queries' length, a multiple of [`Q8_GROUP`]).
///
/// `out[i * ostride + 16 * c + j]` becomes `s * scale`, where `s` runs over the groups `g`
/// from 0 up: `s = fma(sum_g as f32, dk_g * dq_g, s)` from `s = 0`, `sum_g` the exact
/// integer dot product of the group's int8 components, `dk_g` and `dq_g` the key's and the
/// query's scales. At most [`MAX_QUERIES`] queries.
#[allow(clippy::too_many_arguments)]
pub fn scores_chunks_q8(qs: &[&QueryQ8], kc: &[u8], ks: &[u16], bases: &[usize], sbases: &[usize], pitch: usize, scale: f32, out: &mut [f32], ostride: usize) {
    let nq = qs.len();
    assert!((1..=MAX_QUERIES).contains(&nq), "scores_chunks_q8: 1 to {MAX_QUERIES} queries");
    let hd = qs[0].len();
    assert!(hd.is_multiple_of(Q8_GROUP) && qs.iter().all(|q| q.len() == hd), "scores_chunks_q8: queries of different lengths, or not in whole groups");
    assert!(pitch >= 16, "scores_chunks_q8: pitch under 16");
    assert!(bases.len() == sbases.len(), "scores_chunks_q8: as many scale offsets as chunks");
    let ng = hd / Q8_GROUP;
    if hd > 0 {
        let span = (hd / 4 - 1) * 4 * pitch + 64;
        let sspan = (ng - 1) * pitch + 16;
        assert!(bases.iter().all(|&b| b + span <= kc.len()), "scores_chunks_q8: keys out of range");
        assert!(sbases.iter().all(|&b| b + sspan <= ks.len()), "scores_chunks_q8: key scales out of range");
    }
    assert!(ostride >= 16 * bases.len() && out.len() >= (nq - 1) * ostride + 16 * bases.len(), "scores_chunks_q8: output too short");
    #[cfg(target_arch = "x86_64")]
    if has_avx512() {
        let o = out.as_mut_ptr();
        macro_rules! go {
            ($q:literal, $u:literal) => {{
                let q: [&QueryQ8; $q] = std::array::from_fn(|i| qs[i]);
                // SAFETY: AVX-512 F/BW/VL/VNNI and F16C are present; ranges checked above.
                unsafe { x512::scores::<$q, $u>(q, ng, kc.as_ptr(), ks.as_ptr(), bases, sbases, pitch, scale, o, ostride) }
            }};
        }
        by_count!(nq => go { 1 (4), 2 (4), 3 (2), 4 (2), 5 (1), 6 (1), 7 (1); _ => 8 (1) });
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        for (i, q) in qs.iter().enumerate() {
            // SAFETY: AVX2, FMA and F16C are present; ranges checked above.
            unsafe { xavx2::scores(q, kc.as_ptr(), ks.as_ptr(), bases, sbases, pitch, scale, out[i * ostride..].as_mut_ptr()) }
        }
        return;
    }
    #[cfg(target_arch = "aarch64")]
    if has_neon() {
        let q: [neon_attn::QueryRef<'_>; MAX_QUERIES] = std::array::from_fn(|i| {
            let q = qs[i.min(nq - 1)];
            neon_attn::QueryRef { q: &q.q, d: &q.d }
        });
        // SAFETY: NEON is present (dotprod is checked inside); ranges checked above, and
        // every query holds `ng` groups (its length is `hd`).
        unsafe { neon_attn::scores_q8(&q[..nq], ng, kc.as_ptr(), ks.as_ptr(), bases, sbases, pitch, scale, out.as_mut_ptr(), ostride) };
        return;
    }
    scores_portable(qs, kc, ks, bases, sbases, pitch, scale, out, ostride);
}

#[allow(clippy::too_many_arguments)]
fn scores_portable(qs: &[&QueryQ8], kc: &[u8], ks: &[u16], bases: &[usize], sbases: &[usize], pitch: usize, scale: f32, out: &mut [f32], ostride: usize) {
    for (c, (&b, &sb)) in bases.iter().zip(sbases).enumerate() {
        for (i, q) in qs.iter().enumerate() {
            for j in 0..16 {
                let mut s = 0f32;
                for (g, (&dq, &corr)) in q.d.iter().zip(&q.corr).enumerate() {
                    let mut acc = corr;
                    for d in g * Q8_GROUP..(g + 1) * Q8_GROUP {
                        acc += kc[b + d / 4 * 4 * pitch + 4 * j + d % 4] as i32 * q.q[d] as i32;
                    }
                    let dk = half::f16::from_bits(ks[sb + g * pitch + j]).to_f32();
                    s = (acc as f32).mul_add(dk * dq, s);
                }
                out[i * ostride + 16 * c + j] = s * scale;
            }
        }
    }
}

/// The weighted sums of attention over values of the 8-bit cache: for values `t0..t1`
/// (component `d` of value `t` at `vc[t * stride + off + d]`, its group's f16 scale at
/// `vs[t * sstride + soff + d / 32]`, `hd` = the outputs' length, a multiple of
/// [`Q8_GROUP`]), in order of `t`, `ys[r][d] = fma(ws[r][t - t0] * scale, value_t[d],
/// ys[r][d])`. Every path does exactly these operations in this order. At most
/// [`MAX_VALUE_ROWS`] rows.
#[allow(clippy::too_many_arguments)]
pub fn values_q8(ws: &[&[f32]], vc: &[i8], vs: &[u16], stride: usize, sstride: usize, off: usize, soff: usize, t0: usize, t1: usize, ys: &mut [&mut [f32]]) {
    let nr = ys.len();
    assert!(nr == ws.len() && (1..=MAX_VALUE_ROWS).contains(&nr), "values_q8: 1 to {MAX_VALUE_ROWS} rows, as many weights");
    let hd = ys[0].len();
    assert!(hd.is_multiple_of(Q8_GROUP) && ys.iter().all(|y| y.len() == hd), "values_q8: outputs of different lengths, or not in whole groups");
    assert!(t1 <= t0 || (t1 - 1) * stride + off + hd <= vc.len(), "values_q8: values out of range");
    assert!(t1 <= t0 || hd == 0 || (t1 - 1) * sstride + soff + hd / Q8_GROUP <= vs.len(), "values_q8: value scales out of range");
    assert!(ws.iter().all(|w| w.len() >= t1.saturating_sub(t0)), "values_q8: weight rows too short");
    if t1 <= t0 || hd == 0 {
        return;
    }
    // The sums in registers over all the values: AVX-512, NEON.
    #[cfg(target_arch = "x86_64")]
    let in_registers = has_avx512();
    #[cfg(target_arch = "aarch64")]
    let in_registers = has_neon();
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    if in_registers {
        let (v, s) = (vc[off..].as_ptr(), vs[soff..].as_ptr());
        macro_rules! go {
            ($r:literal) => {{
                let w: [*const f32; $r] = std::array::from_fn(|i| ws[i].as_ptr());
                let y: [*mut f32; $r] = std::array::from_fn(|i| ys[i].as_mut_ptr());
                // SAFETY: AVX-512 F/BW/VL and F16C are present (x86), or NEON (aarch64);
                // ranges checked above; the rows are distinct `&mut` slices of `hd` values.
                #[cfg(target_arch = "x86_64")]
                unsafe { x512::values::<$r>(w, v, s, stride, sstride, hd, t0, t1, y) }
                #[cfg(target_arch = "aarch64")]
                unsafe { neon_attn::values_q8::<$r>(w, v, s, stride, sstride, hd, t0, t1, y) }
            }};
        }
        by_count!(nr => go { 1, 2, 3; _ => 4 });
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        for (w, y) in ws.iter().zip(ys.iter_mut()) {
            // SAFETY: AVX2, FMA and F16C are present; ranges checked above.
            unsafe { xavx2::values(w.as_ptr(), vc[off..].as_ptr(), vs[soff..].as_ptr(), stride, sstride, hd, t0, t1, y.as_mut_ptr()) }
        }
        return;
    }
    values_portable(ws, vc, vs, stride, sstride, off, soff, t0, t1, ys);
}

#[allow(clippy::too_many_arguments)]
fn values_portable(ws: &[&[f32]], vc: &[i8], vs: &[u16], stride: usize, sstride: usize, off: usize, soff: usize, t0: usize, t1: usize, ys: &mut [&mut [f32]]) {
    let hd = ys[0].len();
    for t in t0..t1 {
        let x = &vc[t * stride + off..t * stride + off + hd];
        for (w, y) in ws.iter().zip(ys.iter_mut()) {
            let a = w[t - t0];
            for (g, (yg, xg)) in y.chunks_exact_mut(Q8_GROUP).zip(x.chunks_exact(Q8_GROUP)).enumerate() {
                let ag = a * half::f16::from_bits(vs[t * sstride + soff + g]).to_f32();
                for (yd, &xd) in yg.iter_mut().zip(xg) {
                    *yd = ag.mul_add(xd as f32, *yd);
                }
            }
        }
    }
}

/// The AVX2 paths (no VNNI needed): the same integer sums, by 16-bit products.
#[cfg(target_arch = "x86_64")]
mod xavx2 {
    #![allow(clippy::missing_safety_doc)]
    use super::{QueryQ8, Q8_GROUP};
    use std::arch::x86_64::*;

    /// [`super::amax32`]: the largest magnitude of 32 values (exact in any order).
    #[target_feature(enable = "avx2")]
    pub unsafe fn amax32(x: *const f32) -> f32 {
        let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
        let m = (0..4).fold(_mm256_setzero_ps(), |m, i| _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x.add(8 * i)), abs)));
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)))
    }

    /// [`super::round32`]: `round(clamp(x * id, -127, 127))`, ties to even (the default
    /// rounding mode), to `q`; returns their sum.
    #[target_feature(enable = "avx2")]
    pub unsafe fn round32(x: *const f32, id: f32, q: *mut i8) -> i32 {
        let (lo, hi, vid) = (_mm256_set1_ps(-127.0), _mm256_set1_ps(127.0), _mm256_set1_ps(id));
        let i: [__m256i; 4] = std::array::from_fn(|h| _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(_mm256_loadu_ps(x.add(8 * h)), vid), lo), hi)));
        // Packing works per 128-bit lane: dwords come out as 0 2 4 6 1 3 5 7 of the order.
        let b = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
        _mm256_storeu_si256(q as *mut __m256i, _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
        let s = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
        let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s)))
    }

    /// [`super::scores_chunks_q8`] for one query: each group's sums of four products per key
    /// by `vpmaddwd` on the bytes widened to 16 bits (exact), pairs added at the group's end.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn scores(q: &QueryQ8, kc: *const u8, ks: *const u16, bases: &[usize], sbases: &[usize], pitch: usize, scale: f32, out: *mut f32) {
        let sc = _mm256_set1_ps(scale);
        let order = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
        for (c, (&b, &sb)) in bases.iter().zip(sbases).enumerate() {
            let k = kc.add(b);
            let mut s = [_mm256_setzero_ps(); 2];
            for g in 0..q.d.len() {
                // Four keys per accumulator, two 32-bit halves of each key's sum.
                let mut acc = [_mm256_setzero_si256(); 4];
                for quad in g * 8..g * 8 + 8 {
                    let qb = q.q.as_ptr().add(quad * 4);
                    let pat = (0..4).fold(0u64, |p, i| p | ((*qb.add(i) as i16 as u16 as u64) << (16 * i)));
                    let qv = _mm256_set1_epi64x(pat as i64);
                    for (h, a) in acc.iter_mut().enumerate() {
                        let kb = _mm256_cvtepu8_epi16(_mm_loadu_si128(k.add(quad * 4 * pitch + 16 * h) as *const __m128i));
                        *a = _mm256_add_epi32(*a, _mm256_madd_epi16(kb, qv));
                    }
                }
                let corr = _mm256_set1_epi32(q.corr[g]);
                let f = _mm256_set1_ps(q.d[g]);
                for (half, sh) in s.iter_mut().enumerate() {
                    let sums = _mm256_permutevar8x32_epi32(_mm256_hadd_epi32(acc[2 * half], acc[2 * half + 1]), order);
                    let sums = _mm256_add_epi32(sums, corr);
                    let dk = _mm256_cvtph_ps(_mm_loadu_si128(ks.add(sb + g * pitch + 8 * half) as *const __m128i));
                    *sh = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(dk, f), *sh);
                }
            }
            _mm256_storeu_ps(out.add(16 * c), _mm256_mul_ps(s[0], sc));
            _mm256_storeu_ps(out.add(16 * c + 8), _mm256_mul_ps(s[1], sc));
        }
    }

    /// [`super::values_q8`] for one row, a group of 32 outputs at a time.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn values(w: *const f32, vc: *const i8, vs: *const u16, stride: usize, sstride: usize, hd: usize, t0: usize, t1: usize, y: *mut f32) {
        for g in 0..hd / Q8_GROUP {
            let yg = y.add(g * Q8_GROUP);
            let mut acc: [__m256; 4] = std::array::from_fn(|h| _mm256_loadu_ps(yg.add(8 * h)));
            for t in t0..t1 {
                let px = vc.add(t * stride + g * Q8_GROUP);
                let ds = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(*vs.add(t * sstride + g) as i32)));
                let a = _mm256_set1_ps(*w.add(t - t0) * ds);
                for (h, acc) in acc.iter_mut().enumerate() {
                    let x = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(px.add(8 * h) as *const __m128i)));
                    *acc = _mm256_fmadd_ps(a, x, *acc);
                }
            }
            for (h, acc) in acc.iter().enumerate() {
                _mm256_storeu_ps(yg.add(8 * h), *acc);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x512 {
    #![allow(clippy::missing_safety_doc, clippy::needless_range_loop)]
    use super::QueryQ8;
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx512f")]
    pub unsafe fn amax32(x: *const f32) -> f32 {
        let a = _mm512_abs_ps(_mm512_loadu_ps(x));
        let b = _mm512_abs_ps(_mm512_loadu_ps(x.add(16)));
        _mm512_reduce_max_ps(_mm512_max_ps(a, b))
    }

    #[target_feature(enable = "avx512f,avx512bw")]
    pub unsafe fn round32(x: *const f32, id: f32, q: *mut i8) -> i32 {
        let (lo, hi) = (_mm512_set1_ps(-127.0), _mm512_set1_ps(127.0));
        let vid = _mm512_set1_ps(id);
        let mut sum = _mm512_setzero_si512();
        for h in 0..2 {
            let v = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(_mm512_loadu_ps(x.add(16 * h)), vid), lo), hi);
            // Round to nearest, ties to even (the default rounding mode).
            let i = _mm512_cvt_roundps_epi32::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v);
            sum = _mm512_add_epi32(sum, i);
            _mm_storeu_si128(q.add(16 * h) as *mut __m128i, _mm512_cvtepi32_epi8(i));
        }
        _mm512_reduce_add_epi32(sum)
    }

    /// [`super::scores_chunks_q8`] with `Q` queries, `U` chunks at a time.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub unsafe fn scores<const Q: usize, const U: usize>(qs: [&QueryQ8; Q], ng: usize, kc: *const u8, ks: *const u16, bases: &[usize], sbases: &[usize], pitch: usize, scale: f32, out: *mut f32, ostride: usize) {
        let sc = _mm512_set1_ps(scale);
        let qp: [*const i8; Q] = std::array::from_fn(|i| qs[i].q.as_ptr());
        let mut c = 0;
        while c < bases.len() {
            let u = (bases.len() - c).min(U);
            // A short last group repeats its last chunk (results not stored).
            let k: [*const u8; U] = std::array::from_fn(|x| kc.add(bases[c + x.min(u - 1)]));
            let kd: [*const u16; U] = std::array::from_fn(|x| ks.add(sbases[c + x.min(u - 1)]));
            let mut s = [[_mm512_setzero_ps(); U]; Q];
            for g in 0..ng {
                let mut acc: [[__m512i; U]; Q] = std::array::from_fn(|i| [_mm512_set1_epi32(qs[i].corr[g]); U]);
                for quad in g * 8..g * 8 + 8 {
                    let kv: [__m512i; U] = std::array::from_fn(|x| _mm512_loadu_si512(k[x].add(quad * 4 * pitch) as *const _));
                    for i in 0..Q {
                        let qb = _mm512_set1_epi32((qp[i].add(quad * 4) as *const i32).read_unaligned());
                        for x in 0..U {
                            acc[i][x] = _mm512_dpbusd_epi32(acc[i][x], kv[x], qb);
                        }
                    }
                }
                for x in 0..U {
                    let dk = _mm512_cvtph_ps(_mm256_loadu_si256(kd[x].add(g * pitch) as *const __m256i));
                    for i in 0..Q {
                        let f = _mm512_mul_ps(dk, _mm512_set1_ps(qs[i].d[g]));
                        s[i][x] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[i][x]), f, s[i][x]);
                    }
                }
            }
            for i in 0..Q {
                for x in 0..u {
                    _mm512_storeu_ps(out.add(i * ostride + 16 * (c + x)), _mm512_mul_ps(s[i][x], sc));
                }
            }
            c += u;
        }
    }

    /// [`super::values_q8`]: 64 outputs (two groups) of each row in registers over all the
    /// values, then the last 32 if the head has an odd number of groups.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub unsafe fn values<const R: usize>(w: [*const f32; R], vc: *const i8, vs: *const u16, stride: usize, sstride: usize, hd: usize, t0: usize, t1: usize, ys: [*mut f32; R]) {
        let mut d0 = 0;
        while d0 < hd {
            if hd - d0 >= 64 {
                block::<R, 2>(w, vc.add(d0), vs.add(d0 / 32), stride, sstride, t0, t1, ys.map(|y| y.add(d0)));
            } else {
                block::<R, 1>(w, vc.add(d0), vs.add(d0 / 32), stride, sstride, t0, t1, ys.map(|y| y.add(d0)));
            }
            d0 += 64;
        }
    }

    /// `G` groups of 32 outputs per row.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    unsafe fn block<const R: usize, const G: usize>(w: [*const f32; R], vc: *const i8, vs: *const u16, stride: usize, sstride: usize, t0: usize, t1: usize, ys: [*mut f32; R]) {
        let mut acc: [[[__m512; 2]; G]; R] = std::array::from_fn(|r| std::array::from_fn(|g| std::array::from_fn(|h| _mm512_loadu_ps(ys[r].add(32 * g + 16 * h)))));
        for t in t0..t1 {
            let px = vc.add(t * stride);
            let x: [[__m512; 2]; G] = std::array::from_fn(|g| std::array::from_fn(|h| _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(px.add(32 * g + 16 * h) as *const __m128i)))));
            let ps = vs.add(t * sstride);
            let bits = if G == 2 { (ps as *const i32).read_unaligned() } else { *ps as i32 };
            let mut ds = [0f32; 4];
            _mm_storeu_ps(ds.as_mut_ptr(), _mm_cvtph_ps(_mm_cvtsi32_si128(bits)));
            for r in 0..R {
                let wt = *w[r].add(t - t0);
                for g in 0..G {
                    let a = _mm512_set1_ps(wt * ds[g]);
                    for h in 0..2 {
                        acc[r][g][h] = _mm512_fmadd_ps(a, x[g][h], acc[r][g][h]);
                    }
                }
            }
        }
        for r in 0..R {
            for g in 0..G {
                for h in 0..2 {
                    _mm512_storeu_ps(ys[r].add(32 * g + 16 * h), acc[r][g][h]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vals(n: usize, seed: usize) -> Vec<f32> {
        (0..n).map(|i| (((i * 7919 + seed * 104_729) % 1999) as f32 / 1999.0 - 0.5) * (1.0 + (i % 7) as f32)).collect()
    }

    /// Quantization keeps every component within half a step of its group's scale.
    #[test]
    fn quantize_rounds_to_the_nearest_step() {
        let x = vals(96, 3);
        let (mut q, mut d) = (vec![0i8; 96], vec![0u16; 3]);
        quantize_q8_f16(&x, &mut q, &mut d);
        for g in 0..3 {
            let dg = half::f16::from_bits(d[g]).to_f32();
            let amax = x[g * 32..(g + 1) * 32].iter().fold(0f32, |m, v| m.max(v.abs()));
            assert!((dg - amax / 127.0).abs() <= amax / 127.0 * 1e-3, "scale {dg} for max {amax}");
            for i in g * 32..(g + 1) * 32 {
                assert!((q[i] as f32 * dg - x[i]).abs() <= dg * 0.5 + 1e-6, "{i}: {} vs {}", q[i] as f32 * dg, x[i]);
            }
        }
        let mut z = (vec![1i8; 32], vec![1u16; 1]);
        quantize_q8_f16(&[0.0; 32], &mut z.0, &mut z.1);
        assert!(z.0.iter().all(|&v| v == 0) && z.1[0] == 0);
    }

    /// The vector quantization gives the portable one's bytes, ties included.
    #[test]
    fn quantize_paths_agree() {
        let mut x = vals(32, 5);
        x[3] = 2.5 * x[0].abs() / 127.0 * 127.0 / x[0].abs().max(1e-9);
        x[7] = -0.0;
        for id in [1.0f32, 3.0, 127.0 / 3.5, 0.0, 1e9] {
            let (mut a, mut b) = ([0i8; 32], [0i8; 32]);
            let sa = round32(&x, id, &mut a);
            let mut sb = 0;
            for (o, &v) in b.iter_mut().zip(&x) {
                *o = (v * id).clamp(-127.0, 127.0).round_ties_even() as i8;
                sb += *o as i32;
            }
            assert_eq!((a, sa), (b, sb), "id {id}");
            #[cfg(target_arch = "x86_64")]
            if has_avx2() {
                let mut c = [0i8; 32];
                // SAFETY: AVX2 is present; `x` and `c` hold 32 values.
                let sc = unsafe { xavx2::round32(x.as_ptr(), id, c.as_mut_ptr()) };
                assert_eq!((c, sc), (b, sb), "AVX2, id {id}");
            }
        }
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert_eq!(amax32(&x), amax);
        // Ties go to even, as on every path.
        let (mut q, halves) = ([0i8; 32], [0.5f32; 32]);
        round32(&halves, 5.0, &mut q);
        assert!(q.iter().all(|&v| v == 2), "{q:?}");
        #[cfg(target_arch = "x86_64")]
        if has_avx2() {
            // SAFETY: AVX2 is present; the arrays hold 32 values.
            unsafe {
                assert_eq!(xavx2::amax32(x.as_ptr()), amax, "AVX2");
                let mut q = [0i8; 32];
                xavx2::round32(halves.as_ptr(), 5.0, q.as_mut_ptr());
                assert!(q.iter().all(|&v| v == 2), "AVX2: {q:?}");
            }
        }
    }

    /// A key block laid out as the cache keeps it: `n` keys of `hd` components, `bs` positions.
    fn key_block(keys: &[Vec<f32>], hd: usize, bs: usize) -> (Vec<u8>, Vec<u16>) {
        let ng = hd / Q8_GROUP;
        let (mut kc, mut ks) = (vec![0u8; hd * bs], vec![0u16; ng * bs]);
        let (mut q, mut d) = (vec![0i8; hd], vec![0u16; ng]);
        for (j, k) in keys.iter().enumerate() {
            quantize_q8_f16(k, &mut q, &mut d);
            for c in 0..hd {
                kc[c / 4 * 4 * bs + 4 * j + c % 4] = (q[c] as u8) ^ 0x80;
            }
            for g in 0..ng {
                ks[g * bs + j] = d[g];
            }
        }
        (kc, ks)
    }

    /// The kernel's scores are the portable ones, bit for bit, for any number of queries and
    /// chunks, and close to the f32 scores of the unquantized vectors.
    #[test]
    fn scores_match_the_portable_path_and_the_exact_scores() {
        for hd in [32, 64, 128] {
            let bs = 64;
            let keys: Vec<Vec<f32>> = (0..bs).map(|j| vals(hd, j + 1)).collect();
            let (kc, ks) = key_block(&keys, hd, bs);
            let raw: Vec<Vec<f32>> = (0..MAX_QUERIES).map(|i| vals(hd, 100 + i)).collect();
            let qs: Vec<QueryQ8> = raw.iter().map(|x| {
                let mut q = QueryQ8::default();
                q.set(x);
                q
            }).collect();
            for nq in 1..=MAX_QUERIES {
                for nc in 1..=4 {
                    let bases: Vec<usize> = (0..nc).map(|c| 4 * 16 * c).collect();
                    let sbases: Vec<usize> = (0..nc).map(|c| 16 * c).collect();
                    let refs: Vec<&QueryQ8> = qs[..nq].iter().collect();
                    let ostride = 16 * nc + 3;
                    let mut a = vec![0f32; nq * ostride];
                    let mut b = a.clone();
                    scores_chunks_q8(&refs, &kc, &ks, &bases, &sbases, bs, 0.125, &mut a, ostride);
                    scores_portable(&refs, &kc, &ks, &bases, &sbases, bs, 0.125, &mut b, ostride);
                    assert_eq!(a, b, "hd {hd}, {nq} queries, {nc} chunks");
                    #[cfg(target_arch = "x86_64")]
                    if has_avx2() {
                        let mut c = vec![0f32; nq * ostride];
                        for (i, q) in refs.iter().enumerate() {
                            // SAFETY: AVX2, FMA and F16C are present; the ranges are those above.
                            unsafe { xavx2::scores(q, kc.as_ptr(), ks.as_ptr(), &bases, &sbases, bs, 0.125, c[i * ostride..].as_mut_ptr()) };
                        }
                        assert_eq!(c, b, "avx2: hd {hd}, {nq} queries, {nc} chunks");
                    }
                    for i in 0..nq {
                        for j in 0..16 * nc {
                            let exact: f32 = raw[i].iter().zip(&keys[j]).map(|(x, y)| x * y).sum::<f32>() * 0.125;
                            let norm: f32 = raw[i].iter().map(|x| x * x).sum::<f32>().sqrt() * keys[j].iter().map(|x| x * x).sum::<f32>().sqrt() * 0.125;
                            assert!((a[i * ostride + j] - exact).abs() <= 0.02 * norm, "hd {hd}: {} vs {exact} (norm {norm})", a[i * ostride + j]);
                        }
                    }
                }
            }
        }
    }

    /// The values kernel gives the portable path's bits, and the dequantized values' sums.
    #[test]
    fn values_match_the_portable_path() {
        for hd in [32, 64, 96, 128] {
            let (n, stride) = (37, hd * 2 + 32);
            let ng = stride / Q8_GROUP;
            let mut vc = vec![0i8; n * stride];
            let mut vs = vec![0u16; n * ng];
            for t in 0..n {
                quantize_q8_f16(&vals(stride, t), &mut vc[t * stride..(t + 1) * stride], &mut vs[t * ng..(t + 1) * ng]);
            }
            let w: Vec<Vec<f32>> = (0..MAX_VALUE_ROWS).map(|r| vals(n, 50 + r).iter().map(|x| x.abs()).collect()).collect();
            for nr in 1..=MAX_VALUE_ROWS {
                let (off, soff) = (hd, hd / Q8_GROUP);
                let ws: Vec<&[f32]> = w[..nr].iter().map(|x| &x[3..]).collect();
                let mut a: Vec<Vec<f32>> = (0..nr).map(|r| vals(hd, 9 + r)).collect();
                let mut b = a.clone();
                let mut want = a.clone();
                {
                    let mut ya: Vec<&mut [f32]> = a.iter_mut().map(|y| y.as_mut_slice()).collect();
                    values_q8(&ws, &vc, &vs, stride, ng, off, soff, 3, n, &mut ya);
                    let mut yb: Vec<&mut [f32]> = b.iter_mut().map(|y| y.as_mut_slice()).collect();
                    values_portable(&ws, &vc, &vs, stride, ng, off, soff, 3, n, &mut yb);
                }
                assert_eq!(a, b, "hd {hd}, {nr} rows");
                #[cfg(target_arch = "x86_64")]
                if has_avx2() {
                    let mut c: Vec<Vec<f32>> = (0..nr).map(|r| vals(hd, 9 + r)).collect();
                    for (w, y) in ws.iter().zip(c.iter_mut()) {
                        // SAFETY: AVX2, FMA and F16C are present; the ranges are those above.
                        unsafe { xavx2::values(w.as_ptr(), vc[off..].as_ptr(), vs[soff..].as_ptr(), stride, ng, hd, 3, n, y.as_mut_ptr()) };
                    }
                    assert_eq!(c, b, "avx2: hd {hd}, {nr} rows");
                }
                for (r, y) in want.iter_mut().enumerate() {
                    for t in 3..n {
                        for d in 0..hd {
                            let dv = half::f16::from_bits(vs[t * ng + soff + d / 32]).to_f32();
                            y[d] += ws[r][t - 3] * dv * vc[t * stride + off + d] as f32;
                        }
                    }
                }
                for (x, y) in a.iter().flatten().zip(want.iter().flatten()) {
                    assert!((x - y).abs() <= 1e-4 * (1.0 + y.abs()), "{x} vs {y}");
                }
            }
        }
    }
}
