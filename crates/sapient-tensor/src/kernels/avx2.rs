//! AVX2 + FMA dot products (x86_64). Each function computes exactly what its scalar twin in
//! [`super::quant`] computes, up to float summation order; the tests check them against each
//! other and against dequantized f32 arithmetic.
//!
//! Safety: every function here requires the `avx2` and `fma` CPU features (checked once at
//! run time by the dispatcher) and that `w` holds at least `a.len()` blocks of its format.

#![allow(clippy::missing_safety_doc)]

use super::quant::{BlockQ8, BlockQ8K};
use std::arch::x86_64::*;

/// The f16 at byte offset `off` of `w` times `s`, in all 8 lanes.
///
/// Converting all lanes (rather than one) keeps the compiler from inserting the value into a
/// stale register (`vpinsrw`), which would chain each block to the previous accumulator.
#[inline(always)]
unsafe fn f16x8_mul(w: &[u8], off: usize, s: f32) -> __m256 {
    let bits = std::ptr::read_unaligned(w.as_ptr().add(off) as *const i16);
    _mm256_mul_ps(_mm256_cvtph_ps(_mm_set1_epi16(bits)), _mm256_set1_ps(s))
}

/// The sum of `v`'s eight values.
#[inline(always)]
pub(super) unsafe fn hsum_ps(v: __m256) -> f32 {
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps(v, 1);
    let s = _mm_add_ps(lo, hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// 16 bytes of nibbles to 32 bytes: low nibbles in the low lane, high nibbles in the high lane.
#[inline(always)]
unsafe fn nibbles32(p: *const u8) -> __m256i {
    let tmp = _mm_loadu_si128(p as *const __m128i);
    let both = _mm256_set_m128i(_mm_srli_epi16(tmp, 4), tmp);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0f))
}

/// 32 bits to 32 bytes of 0xFF (bit set) or 0x00.
#[inline(always)]
unsafe fn bits32(x: u32) -> __m256i {
    let shuf = _mm256_set_epi64x(
        0x0303030303030303,
        0x0202020202020202,
        0x0101010101010101,
        0x0000000000000000,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x as i32), shuf);
    let mask = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe_u64 as i64);
    let bytes = _mm256_or_si256(bytes, mask);
    _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1))
}

/// Sum of products of unsigned bytes `x` and signed bytes `y`, as 8 f32 lanes. With
/// `VNNI` one `vpdpbusd` does what `vpmaddubsw` + `vpmaddwd` do.
#[inline(always)]
unsafe fn mul_sum_us8<const VNNI: bool>(x: __m256i, y: __m256i) -> __m256 {
    if VNNI {
        _mm256_cvtepi32_ps(_mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), x, y))
    } else {
        let dot = _mm256_maddubs_epi16(x, y);
        _mm256_cvtepi32_ps(_mm256_madd_epi16(dot, _mm256_set1_epi16(1)))
    }
}

/// A 32-value weight format: what is decoded once per weight block, and how that block
/// meets one activation block. Multi-row products decode each weight block once for up to
/// [`MAX_ROWS`] activation rows; a single row is the same code with one row, so results are
/// bit-identical whatever the batch.
trait Fmt32 {
    const BYTES: usize;
    /// Whether the format has a per-block minimum (an offset term).
    const HAS_M: bool;
    type W: Copy;
    unsafe fn weight(p: *const u8) -> Self::W;
    /// (scale vector, integer-dot vector, offset term in lane 1)
    unsafe fn row<const VNNI: bool>(w: Self::W, a: &BlockQ8) -> (__m256, __m256, __m128);
}

/// Most activation rows a multi-row kernel takes at once.
pub const MAX_ROWS: usize = 4;

struct Q40;
struct Q41;
struct Q50;
struct Q51;
struct Q80;

/// Signed weights: the shared part of `mul_sum_i8` (|x|) plus x itself for the sign.
#[derive(Clone, Copy)]
struct SignedW {
    ax: __m256i,
    x: __m256i,
    d: __m256,
}

#[inline(always)]
unsafe fn signed_row<const VNNI: bool>(w: SignedW, a: &BlockQ8) -> (__m256, __m256, __m128) {
    let y = _mm256_loadu_si256(a.qs.as_ptr() as *const __m256i);
    let d = _mm256_mul_ps(w.d, _mm256_set1_ps(a.d));
    (d, mul_sum_us8::<VNNI>(w.ax, _mm256_sign_epi8(y, w.x)), _mm_setzero_ps())
}

#[inline(always)]
unsafe fn f16x8(p: *const u8) -> __m256 {
    _mm256_cvtph_ps(_mm_set1_epi16(std::ptr::read_unaligned(p as *const i16)))
}

#[inline(always)]
unsafe fn signed_w(x: __m256i, d: __m256) -> SignedW {
    SignedW { ax: _mm256_sign_epi8(x, x), x, d }
}

/// Unsigned weights with a per-block minimum: `d` and `m` converted together.
#[derive(Clone, Copy)]
struct MinW {
    x: __m256i,
    dm: __m128,
}

#[inline(always)]
unsafe fn min_row<const VNNI: bool>(w: MinW, a: &BlockQ8) -> (__m256, __m256, __m128) {
    let y = _mm256_loadu_si256(a.qs.as_ptr() as *const __m256i);
    let ds = _mm_castpd_ps(_mm_load1_pd(&a.d as *const f32 as *const f64)); // a.d a.s a.d a.s
    let prod = _mm_mul_ps(w.dm, ds); // d*a.d, m*a.s
    (_mm256_broadcastss_ps(prod), mul_sum_us8::<VNNI>(w.x, y), prod)
}

#[inline(always)]
unsafe fn dm_of(p: *const u8) -> __m128 {
    _mm_cvtph_ps(_mm_set1_epi32(std::ptr::read_unaligned(p as *const i32))) // d m d m
}

impl Fmt32 for Q40 {
    const HAS_M: bool = false;
    const BYTES: usize = 18;
    type W = SignedW;
    #[inline(always)]
    unsafe fn weight(p: *const u8) -> SignedW {
        signed_w(_mm256_sub_epi8(nibbles32(p.add(2)), _mm256_set1_epi8(8)), f16x8(p))
    }
    #[inline(always)]
    unsafe fn row<const VNNI: bool>(w: SignedW, a: &BlockQ8) -> (__m256, __m256, __m128) {
        signed_row::<VNNI>(w, a)
    }
}

impl Fmt32 for Q41 {
    const HAS_M: bool = true;
    const BYTES: usize = 20;
    type W = MinW;
    #[inline(always)]
    unsafe fn weight(p: *const u8) -> MinW {
        MinW { x: nibbles32(p.add(4)), dm: dm_of(p) }
    }
    #[inline(always)]
    unsafe fn row<const VNNI: bool>(w: MinW, a: &BlockQ8) -> (__m256, __m256, __m128) {
        min_row::<VNNI>(w, a)
    }
}

impl Fmt32 for Q50 {
    const HAS_M: bool = false;
    const BYTES: usize = 22;
    type W = SignedW;
    #[inline(always)]
    unsafe fn weight(p: *const u8) -> SignedW {
        let qh = std::ptr::read_unaligned(p.add(2) as *const u32);
        // (nibble | high bit << 4) - 16 == nibble | (high bit clear ? 0xF0 : 0) as i8
        let hi = _mm256_andnot_si256(bits32(qh), _mm256_set1_epi8(0xf0u8 as i8));
        signed_w(_mm256_or_si256(nibbles32(p.add(6)), hi), f16x8(p))
    }
    #[inline(always)]
    unsafe fn row<const VNNI: bool>(w: SignedW, a: &BlockQ8) -> (__m256, __m256, __m128) {
        signed_row::<VNNI>(w, a)
    }
}

impl Fmt32 for Q51 {
    const HAS_M: bool = true;
    const BYTES: usize = 24;
    type W = MinW;
    #[inline(always)]
    unsafe fn weight(p: *const u8) -> MinW {
        let qh = std::ptr::read_unaligned(p.add(4) as *const u32);
        let hi = _mm256_and_si256(bits32(qh), _mm256_set1_epi8(0x10));
        MinW { x: _mm256_or_si256(nibbles32(p.add(8)), hi), dm: dm_of(p) }
    }
    #[inline(always)]
    unsafe fn row<const VNNI: bool>(w: MinW, a: &BlockQ8) -> (__m256, __m256, __m128) {
        min_row::<VNNI>(w, a)
    }
}

impl Fmt32 for Q80 {
    const HAS_M: bool = false;
    const BYTES: usize = 34;
    type W = SignedW;
    #[inline(always)]
    unsafe fn weight(p: *const u8) -> SignedW {
        signed_w(_mm256_loadu_si256(p.add(2) as *const __m256i), f16x8(p))
    }
    #[inline(always)]
    unsafe fn row<const VNNI: bool>(w: SignedW, a: &BlockQ8) -> (__m256, __m256, __m128) {
        signed_row::<VNNI>(w, a)
    }
}

/// One weight row against `R` activation rows (each `blocks` long). Two accumulator chains
/// per row (even and odd blocks): one chain would make each block wait for the previous
/// fused multiply-add. Every row sees the same operations in the same order whatever `R`.
#[inline(always)]
unsafe fn rows32<F: Fmt32, const VNNI: bool, const R: usize>(w: &[u8], acts: [&[BlockQ8]; R], out: &mut [f32]) {
    let n = acts[0].len();
    let p = w.as_ptr();
    let mut acc = [[_mm256_setzero_ps(); R]; 2];
    let mut accm = [[_mm_setzero_ps(); R]; 2];
    // (A function, not a closure: a closure here would not inherit the caller's target
    // features and would be called per block.)
    #[inline(always)]
    unsafe fn step<F: Fmt32, const VNNI: bool, const R: usize>(
        p: *const u8,
        acts: &[&[BlockQ8]; R],
        i: usize,
        acc: &mut [__m256; R],
        accm: &mut [__m128; R],
    ) {
        let wb = F::weight(p.add(i * F::BYTES));
        for r in 0..R {
            let (d, q, m) = F::row::<VNNI>(wb, acts[r].get_unchecked(i));
            acc[r] = _mm256_fmadd_ps(d, q, acc[r]);
            if F::HAS_M {
                accm[r] = _mm_add_ps(accm[r], m);
            }
        }
    }
    let [acc0, acc1] = &mut acc;
    let [accm0, accm1] = &mut accm;
    let mut i = 0;
    while i + 2 <= n {
        step::<F, VNNI, R>(p, &acts, i, acc0, accm0);
        step::<F, VNNI, R>(p, &acts, i + 1, acc1, accm1);
        i += 2;
    }
    if i < n {
        step::<F, VNNI, R>(p, &acts, i, acc0, accm0);
    }
    for r in 0..R {
        let s = hsum_ps(_mm256_add_ps(acc[0][r], acc[1][r]));
        out[r] = if F::HAS_M { s + _mm_cvtss_f32(_mm_movehdup_ps(_mm_add_ps(accm[0][r], accm[1][r]))) } else { s };
    }
}

/// Dispatch on the number of rows (1..=MAX_ROWS) to a const-generic instantiation.
macro_rules! by_rows {
    ($f:ident, [$($g:tt),*], $w:expr, $acts:expr, $out:expr) => {{
        let acts = $acts;
        match acts.len() {
            1 => $f::<$($g,)* 1>($w, [acts[0]], $out),
            2 => $f::<$($g,)* 2>($w, [acts[0], acts[1]], $out),
            3 => $f::<$($g,)* 3>($w, [acts[0], acts[1], acts[2]], $out),
            _ => $f::<$($g,)* 4>($w, [acts[0], acts[1], acts[2], acts[3]], $out),
        }
    }};
}

macro_rules! wrappers32 {
    ($($name:ident, $vnni:ident => $fmt:ty;)*) => {$(
        /// One weight row against 1..=4 activation rows; `out[r]` for row `r`.
        #[target_feature(enable = "avx2,fma,f16c")]
        pub unsafe fn $name(w: &[u8], acts: &[&[BlockQ8]], out: &mut [f32]) {
            by_rows!(rows32, [$fmt, false], w, acts, out)
        }
        /// With AVX-VNNI (`vpdpbusd`); bit-identical to the AVX2 version.
        #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
        pub unsafe fn $vnni(w: &[u8], acts: &[&[BlockQ8]], out: &mut [f32]) {
            by_rows!(rows32, [$fmt, true], w, acts, out)
        }
    )*};
}

wrappers32! {
    rows_q4_0, rows_q4_0_vnni => Q40;
    rows_q4_1, rows_q4_1_vnni => Q41;
    rows_q5_0, rows_q5_0_vnni => Q50;
    rows_q5_1, rows_q5_1_vnni => Q51;
    rows_q8_0, rows_q8_0_vnni => Q80;
}

/// Scales (low 8 x u8) and mins (high 8 x u8) of a Q4_K/Q5_K block as 16 x i16.
#[inline(always)]
pub(super) unsafe fn k4_scales_mins(q: *const u8) -> __m256i {
    const KMASK1: u32 = 0x3f3f3f3f;
    const KMASK2: u32 = 0x0f0f0f0f;
    const KMASK3: u32 = 0x03030303;
    let mut u = [0u32; 4];
    std::ptr::copy_nonoverlapping(q, u.as_mut_ptr() as *mut u8, 12);
    u[3] = ((u[2] >> 4) & KMASK2) | (((u[1] >> 6) & KMASK3) << 4);
    let uaux = u[1] & KMASK1;
    u[1] = (u[2] & KMASK2) | (((u[0] >> 6) & KMASK3) << 4);
    u[2] = uaux;
    u[0] &= KMASK1;
    _mm256_cvtepu8_epi16(_mm_set_epi32(u[3] as i32, u[2] as i32, u[1] as i32, u[0] as i32))
}

/// Broadcast i16 lane `i` (0..8) of the low 128 bits of `v` to all 16 lanes.
#[inline(always)]
unsafe fn bcast16(v: __m128i, i: usize) -> __m256i {
    let lo = (2 * i) as i8;
    let m = _mm_set_epi8(
        lo + 1, lo, lo + 1, lo, lo + 1, lo, lo + 1, lo, lo + 1, lo, lo + 1, lo, lo + 1, lo, lo + 1, lo,
    );
    let b = _mm_shuffle_epi8(v, m);
    _mm256_set_m128i(b, b)
}

/// Sum over a k-quant block's mins: `sum_j mins[j] * (bsums[2j] + bsums[2j+1])` as i32 x 4.
#[inline(always)]
unsafe fn k4_mins_dot(ms: __m256i, bsums: *const i16) -> __m128i {
    let q8sums = _mm256_loadu_si256(bsums as *const __m256i);
    let q8s = _mm_hadd_epi16(_mm256_castsi256_si128(q8sums), _mm256_extracti128_si256(q8sums, 1));
    _mm_madd_epi16(_mm256_extracti128_si256(ms, 1), q8s)
}

#[inline(always)]
unsafe fn q4k_rows<const R: usize>(w: &[u8], acts: [&[BlockQ8K]; R], out: &mut [f32]) {
    let m4 = _mm256_set1_epi8(0x0f);
    let mut acc = [_mm256_setzero_ps(); R];
    let mut acc_m = [_mm_setzero_ps(); R];
    let p = w.as_ptr();
    for i in 0..acts[0].len() {
        let bw = p.add(i * 144);
        let dw = f16x8(bw);
        let dminw = f16x8(bw.add(2));
        let ms = k4_scales_mins(bw.add(4));
        let sc = _mm256_castsi256_si128(ms);
        let mut sumi = [_mm256_setzero_si256(); R];
        for j in 0..4 {
            let sl = bcast16(sc, 2 * j);
            let sh = bcast16(sc, 2 * j + 1);
            let bits = _mm256_loadu_si256(bw.add(16 + 32 * j) as *const __m256i);
            let lo = _mm256_and_si256(bits, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
            for r in 0..R {
                let q8 = acts[r].get_unchecked(i).qs.as_ptr().add(64 * j);
                let y0 = _mm256_loadu_si256(q8 as *const __m256i);
                let y1 = _mm256_loadu_si256(q8.add(32) as *const __m256i);
                let p0 = _mm256_madd_epi16(sl, _mm256_maddubs_epi16(lo, y0));
                let p1 = _mm256_madd_epi16(sh, _mm256_maddubs_epi16(hi, y1));
                sumi[r] = _mm256_add_epi32(sumi[r], _mm256_add_epi32(p0, p1));
            }
        }
        for r in 0..R {
            let ba = acts[r].get_unchecked(i);
            let d = _mm256_mul_ps(dw, _mm256_set1_ps(ba.d));
            let dmin = _mm256_mul_ps(dminw, _mm256_set1_ps(-ba.d));
            let prod = k4_mins_dot(ms, ba.bsums.as_ptr());
            acc_m[r] = _mm_fmadd_ps(_mm256_castps256_ps128(dmin), _mm_cvtepi32_ps(prod), acc_m[r]);
            acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi[r]), acc[r]);
        }
    }
    for r in 0..R {
        let m = _mm_add_ps(acc_m[r], _mm_movehl_ps(acc_m[r], acc_m[r]));
        let m = _mm_add_ss(m, _mm_movehdup_ps(m));
        out[r] = hsum_ps(acc[r]) + _mm_cvtss_f32(m);
    }
}

/// One Q4_K weight row against 1..=4 activation rows.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn rows_q4k(w: &[u8], acts: &[&[BlockQ8K]], out: &mut [f32]) {
    by_rows!(q4k_rows, [], w, acts, out)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q5k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let m4 = _mm256_set1_epi8(0x0f);
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = _mm_setzero_ps();
    let p = w.as_ptr();
    for (i, ba) in a.iter().enumerate() {
        let bw = p.add(i * 176);
        let d = f16x8_mul(w, i * 176, ba.d);
        let dmin = f16x8_mul(w, i * 176 + 2, -ba.d);
        let ms = k4_scales_mins(bw.add(4));
        let prod = k4_mins_dot(ms, ba.bsums.as_ptr());
        acc_m = _mm_fmadd_ps(_mm256_castps256_ps128(dmin), _mm_cvtepi32_ps(prod), acc_m);
        let sc = _mm256_castsi256_si128(ms);
        let hbits = _mm256_loadu_si256(bw.add(16) as *const __m256i);
        let mut q5 = bw.add(48);
        let mut q8 = ba.qs.as_ptr();
        let mut sumi = _mm256_setzero_si256();
        let one = _mm256_set1_epi8(1);
        for j in 0..4 {
            let sl = bcast16(sc, 2 * j);
            let sh = bcast16(sc, 2 * j + 1);
            let bits = _mm256_loadu_si256(q5 as *const __m256i);
            q5 = q5.add(32);
            // high bit 2j of each qh byte -> 0x10, and bit 2j+1 -> 0x10
            let h = _mm256_srl_epi16(hbits, _mm_cvtsi32_si128((2 * j) as i32));
            let h0 = _mm256_slli_epi16(_mm256_and_si256(h, one), 4);
            let h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 1), one), 4);
            let lo = _mm256_or_si256(_mm256_and_si256(bits, m4), h0);
            let hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(bits, 4), m4), h1);
            let y0 = _mm256_loadu_si256(q8 as *const __m256i);
            let y1 = _mm256_loadu_si256(q8.add(32) as *const __m256i);
            q8 = q8.add(64);
            let p0 = _mm256_madd_epi16(sl, _mm256_maddubs_epi16(lo, y0));
            let p1 = _mm256_madd_epi16(sh, _mm256_maddubs_epi16(hi, y1));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
        }
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    let m = _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m));
    let m = _mm_add_ss(m, _mm_movehdup_ps(m));
    hsum_ps(acc) + _mm_cvtss_f32(m)
}

/// i16 x 16: low 8 lanes = `sc[i]`, high 8 lanes = `sc[i + 1]` (sign-extended).
#[inline(always)]
unsafe fn q6_scale_pair(sc: *const i8, i: usize) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(*sc.add(i + 1) as i16), _mm_set1_epi16(*sc.add(i) as i16))
}

#[inline(always)]
unsafe fn q6k_rows<const R: usize>(w: &[u8], acts: [&[BlockQ8K]; R], out: &mut [f32]) {
    let m4 = _mm256_set1_epi8(0x0f);
    let m2 = _mm256_set1_epi8(0x03);
    let m32 = _mm256_set1_epi8(32);
    let mut acc = [_mm256_setzero_ps(); R];
    let p = w.as_ptr();
    for i in 0..acts[0].len() {
        let bw = p.add(i * 210);
        let dw = f16x8(bw.add(208));
        let sc = bw.add(192) as *const i8;
        let mut sumi = [_mm256_setzero_si256(); R];
        for j in 0..2 {
            let ql = bw.add(64 * j);
            let b1 = _mm256_loadu_si256(ql as *const __m256i);
            let b2 = _mm256_loadu_si256(ql.add(32) as *const __m256i);
            let bh = _mm256_loadu_si256(bw.add(128 + 32 * j) as *const __m256i);
            let h0 = _mm256_slli_epi16(_mm256_and_si256(bh, m2), 4);
            let h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bh, 2), m2), 4);
            let h2 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bh, 4), m2), 4);
            let h3 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bh, 6), m2), 4);
            let xs = [
                _mm256_or_si256(_mm256_and_si256(b1, m4), h0),
                _mm256_or_si256(_mm256_and_si256(b2, m4), h1),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b1, 4), m4), h2),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b2, 4), m4), h3),
            ];
            for (k, x) in xs.into_iter().enumerate() {
                let s = q6_scale_pair(sc, 8 * j + 2 * k);
                for r in 0..R {
                    let q8 = acts[r].get_unchecked(i).qs.as_ptr().add(128 * j + 32 * k);
                    let y = _mm256_loadu_si256(q8 as *const __m256i);
                    let pr = _mm256_sub_epi16(_mm256_maddubs_epi16(x, y), _mm256_maddubs_epi16(m32, y));
                    sumi[r] = _mm256_add_epi32(sumi[r], _mm256_madd_epi16(s, pr));
                }
            }
        }
        for r in 0..R {
            let d = _mm256_mul_ps(dw, _mm256_set1_ps(acts[r].get_unchecked(i).d));
            acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi[r]), acc[r]);
        }
    }
    for r in 0..R {
        out[r] = hsum_ps(acc[r]);
    }
}

/// One Q6_K weight row against 1..=4 activation rows.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn rows_q6k(w: &[u8], acts: &[&[BlockQ8K]], out: &mut [f32]) {
    by_rows!(q6k_rows, [], w, acts, out)
}

/// Dot product of two f32 slices of equal length.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_f32(x: &[f32], y: &[f32]) -> f32 {
    let n = x.len().min(y.len());
    let (px, py) = (x.as_ptr(), y.as_ptr());
    let mut a0 = _mm256_setzero_ps();
    let mut a1 = _mm256_setzero_ps();
    let mut i = 0;
    while i + 16 <= n {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(px.add(i)), _mm256_loadu_ps(py.add(i)), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(px.add(i + 8)), _mm256_loadu_ps(py.add(i + 8)), a1);
        i += 16;
    }
    let mut s = hsum_ps(_mm256_add_ps(a0, a1));
    while i < n {
        s += *px.add(i) * *py.add(i);
        i += 1;
    }
    s
}

/// Dot products of `R` f32 rows `xs` with one f16 row `y` (raw bits): each row's result is
/// computed by exactly the instructions a single row would see (attention relies on it).
#[inline(always)]
unsafe fn dots_f32_f16<const R: usize>(xs: [&[f32]; R], y: &[u16], out: &mut [f32]) {
    let n = y.len();
    let py = y.as_ptr();
    let mut a0 = [_mm256_setzero_ps(); R];
    let mut a1 = [_mm256_setzero_ps(); R];
    let mut i = 0;
    while i + 16 <= n {
        let y0 = _mm256_cvtph_ps(_mm_loadu_si128(py.add(i) as *const __m128i));
        let y1 = _mm256_cvtph_ps(_mm_loadu_si128(py.add(i + 8) as *const __m128i));
        for r in 0..R {
            let px = xs[r].as_ptr();
            a0[r] = _mm256_fmadd_ps(_mm256_loadu_ps(px.add(i)), y0, a0[r]);
            a1[r] = _mm256_fmadd_ps(_mm256_loadu_ps(px.add(i + 8)), y1, a1[r]);
        }
        i += 16;
    }
    for r in 0..R {
        let mut s = hsum_ps(_mm256_add_ps(a0[r], a1[r]));
        for j in i..n {
            s += *xs[r].get_unchecked(j) * half::f16::from_bits(*py.add(j)).to_f32();
        }
        *out.get_unchecked_mut(r) = s;
    }
}

/// Dot product of f32 `x` with f16 `y` (raw bits); `y.len() <= x.len()`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_f32_f16(x: &[f32], y: &[u16]) -> f32 {
    let mut o = [0f32];
    dots_f32_f16::<1>([x], y, &mut o);
    o[0]
}

/// `ys[r] += a[r] * x` with f16 `x` (raw bits), each row as a single-row call would do it.
#[inline(always)]
unsafe fn axpys_f16<const R: usize>(a: [f32; R], x: &[u16], ys: [*mut f32; R]) {
    let n = x.len();
    let px = x.as_ptr();
    let mut va = [_mm256_setzero_ps(); R];
    for r in 0..R {
        va[r] = _mm256_set1_ps(a[r]); // (a loop, not a closure: see `round32`)
    }
    let mut i = 0;
    while i + 8 <= n {
        let xv = _mm256_cvtph_ps(_mm_loadu_si128(px.add(i) as *const __m128i));
        for r in 0..R {
            let py = ys[r].add(i);
            _mm256_storeu_ps(py, _mm256_fmadd_ps(va[r], xv, _mm256_loadu_ps(py)));
        }
        i += 8;
    }
    for j in i..n {
        let xv = half::f16::from_bits(*px.add(j)).to_f32();
        for r in 0..R {
            *ys[r].add(j) += a[r] * xv;
        }
    }
}

/// `y += a * x` with f16 `x` (raw bits); `x.len() <= y.len()`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn axpy_f16(a: f32, x: &[u16], y: &mut [f32]) {
    axpys_f16::<1>([a], x, [y.as_mut_ptr()])
}

/// Largest |v| of 8 lanes.
#[inline(always)]
unsafe fn hmax_abs(v: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)))
}

/// `roundf` in 8 lanes: to nearest, ties away from zero (as the portable quantizers and
/// ggml's reference ones; real activations do hit ties, and rounding them to even instead
/// changed SmolLM2's greedy answers).
#[inline(always)]
unsafe fn round_away(x: __m256) -> __m256 {
    let sign = _mm256_set1_ps(-0.0);
    let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(x);
    let frac = _mm256_andnot_ps(sign, _mm256_sub_ps(x, t)); // exact
    let up = _mm256_cmp_ps::<_CMP_GE_OQ>(frac, _mm256_set1_ps(0.5));
    let one = _mm256_or_ps(_mm256_and_ps(x, sign), _mm256_set1_ps(1.0)); // +-1 with x's sign
    _mm256_add_ps(t, _mm256_and_ps(up, one))
}

/// 32 rounded values ([`round_away`]) of `p[i] * s` as i32 x 8 x 4.
#[inline(always)]
unsafe fn round32(p: *const f32, s: f32) -> [__m256i; 4] {
    // (No closure here: a closure does not inherit the caller's target features, and its
    // intrinsics would become calls, halving the prefill's speed.)
    let m = _mm256_set1_ps(s);
    let mut out = [_mm256_setzero_si256(); 4];
    for (k, o) in out.iter_mut().enumerate() {
        *o = _mm256_cvtps_epi32(round_away(_mm256_mul_ps(_mm256_loadu_ps(p.add(8 * k)), m)));
    }
    out
}

/// 32 i32 values (each in i8 range) packed to 32 bytes in order.
#[inline(always)]
unsafe fn pack32(r: [__m256i; 4]) -> __m256i {
    let a = _mm256_packs_epi32(r[0], r[1]);
    let b = _mm256_packs_epi32(r[2], r[3]);
    let c = _mm256_packs_epi16(a, b);
    _mm256_permutevar8x32_epi32(c, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

#[inline(always)]
unsafe fn hsum_epi32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32::<1>(s)))
}

/// [`super::quant::quantize_q8`] with AVX2, bit-identical to it.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn quantize_q8(x: &[f32], out: &mut [BlockQ8]) {
    let sign = _mm256_set1_ps(-0.0);
    for (chunk, b) in x.chunks_exact(32).zip(out.iter_mut()) {
        let p = chunk.as_ptr();
        let mut m = _mm256_andnot_ps(sign, _mm256_loadu_ps(p));
        for o in [8, 16, 24] {
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(p.add(o))));
        }
        let d = hmax_abs(m) / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let r = round32(p, id);
        let sum = hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(r[0], r[1]), _mm256_add_epi32(r[2], r[3])));
        _mm256_storeu_si256(b.qs.as_mut_ptr() as *mut __m256i, pack32(r));
        b.d = half::f16::from_f32(d).to_f32();
        b.s = half::f16::from_f32(sum as f32 * d).to_f32();
    }
}

/// [`super::quant::quantize_q8k`] with AVX2, bit-identical to it.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn quantize_q8k(x: &[f32], out: &mut [BlockQ8K]) {
    let sign = _mm256_set1_ps(-0.0);
    for (chunk, b) in x.chunks_exact(256).zip(out.iter_mut()) {
        let p = chunk.as_ptr();
        let mut m = _mm256_setzero_ps();
        for o in (0..256).step_by(8) {
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(p.add(o))));
        }
        let amax = hmax_abs(m);
        if amax == 0.0 {
            *b = BlockQ8K::default();
            continue;
        }
        // The first value of largest magnitude, with its sign (as the scalar quantizer).
        let max = chunk.iter().copied().find(|v| v.abs() == amax).unwrap_or(amax);
        let iscale = -128.0 / max;
        for (k, o) in (0..256).step_by(32).enumerate() {
            let mut r = round32(p.add(o), iscale);
            for v in &mut r {
                *v = _mm256_min_epi32(*v, _mm256_set1_epi32(127));
            }
            let s0 = hsum_epi32(_mm256_add_epi32(r[0], r[1]));
            let s1 = hsum_epi32(_mm256_add_epi32(r[2], r[3]));
            b.bsums[2 * k] = s0 as i16;
            b.bsums[2 * k + 1] = s1 as i16;
            _mm256_storeu_si256(b.qs.as_mut_ptr().add(o) as *mut __m256i, pack32(r));
        }
        b.d = 1.0 / iscale;
    }
}

/// [`super::scores_chunks`] with `Q` queries, `U` chunks of 16 keys (two vectors each) at a
/// time.
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn scores_chunks<const Q: usize, const U: usize>(qs: [*const f32; Q], hd: usize, kc: *const u16, bases: &[usize], pitch: usize, scale: f32, out: *mut f32, ostride: usize) {
    let sc = _mm256_set1_ps(scale);
    let mut c = 0;
    while c < bases.len() {
        let u = (bases.len() - c).min(U);
        let k: [*const u16; U] = std::array::from_fn(|x| kc.add(bases[c + x.min(u - 1)]));
        let mut acc = [[[_mm256_setzero_ps(); 2]; U]; Q];
        for d in 0..hd {
            let kv: [[__m256; 2]; U] = std::array::from_fn(|x| {
                let p = k[x].add(d * pitch);
                [_mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)), _mm256_cvtph_ps(_mm_loadu_si128(p.add(8) as *const __m128i))]
            });
            for i in 0..Q {
                let q = _mm256_set1_ps(*qs[i].add(d));
                for x in 0..U {
                    acc[i][x][0] = _mm256_fmadd_ps(q, kv[x][0], acc[i][x][0]);
                    acc[i][x][1] = _mm256_fmadd_ps(q, kv[x][1], acc[i][x][1]);
                }
            }
        }
        for i in 0..Q {
            for x in 0..u {
                let o = out.add(i * ostride + 16 * (c + x));
                _mm256_storeu_ps(o, _mm256_mul_ps(acc[i][x][0], sc));
                _mm256_storeu_ps(o.add(8), _mm256_mul_ps(acc[i][x][1], sc));
            }
        }
        c += u;
    }
}

/// [`super::values_f16`] (`hd` a multiple of 8): `8 * NB` outputs of each row in registers
/// over all the values.
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn values_w<const R: usize, const NB: usize>(w: [*const f32; R], vc: *const u16, stride: usize, hd: usize, t0: usize, t1: usize, ys: [*mut f32; R]) {
    let mut d0 = 0;
    while d0 < hd {
        let nb = ((hd - d0) / 8).min(NB);
        let mut acc = [[_mm256_setzero_ps(); NB]; R];
        for r in 0..R {
            for b in 0..nb {
                acc[r][b] = _mm256_loadu_ps(ys[r].add(d0 + 8 * b));
            }
        }
        for t in t0..t1 {
            let px = vc.add(t * stride + d0);
            for b in 0..nb {
                let x = _mm256_cvtph_ps(_mm_loadu_si128(px.add(8 * b) as *const __m128i));
                for r in 0..R {
                    acc[r][b] = _mm256_fmadd_ps(_mm256_set1_ps(*w[r].add(t - t0)), x, acc[r][b]);
                }
            }
        }
        for r in 0..R {
            for b in 0..nb {
                _mm256_storeu_ps(ys[r].add(d0 + 8 * b), acc[r][b]);
            }
        }
        d0 += 8 * nb;
    }
}

/// e^x of 4 f32 lanes as [`super::exp_approx`] computes it (the same bits).
#[inline(always)]
pub(super) unsafe fn exp4(x: __m128) -> __m128 {
    let x = _mm256_min_pd(_mm256_max_pd(_mm256_cvtps_pd(x), _mm256_set1_pd(-110.0)), _mm256_set1_pd(100.0));
    let n = _mm256_round_pd::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_pd(x, _mm256_set1_pd(std::f64::consts::LOG2_E)));
    let r = _mm256_fmadd_pd(n, _mm256_set1_pd(-std::f64::consts::LN_2), x);
    let mut p = _mm256_set1_pd(super::EXP_TAYLOR[0]);
    for c in &super::EXP_TAYLOR[1..] {
        p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(*c));
    }
    // 2^n: n + 1023 in the exponent field (n is integral, |n| < 160). Adding 2^52 puts
    // the integer n in the low mantissa bits.
    let nb = _mm256_castpd_si256(_mm256_add_pd(n, _mm256_set1_pd(4503599627370496.0 + 1023.0)));
    let pow2 = _mm256_castsi256_pd(_mm256_slli_epi64::<52>(nb));
    _mm256_cvtpd_ps(_mm256_mul_pd(p, pow2))
}

/// [`super::silu_mul`] on whole vectors of 8; returns how many values it did.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn silu_mul(g: &mut [f32], u: &[f32]) -> usize {
    let one = _mm256_set1_ps(1.0);
    let n_all = g.len().min(u.len()) / 8 * 8;
    let mut i = 0;
    while i < n_all {
        let gv = _mm256_loadu_ps(g.as_ptr().add(i));
        let x = _mm256_sub_ps(_mm256_setzero_ps(), gv);
        let e = _mm256_set_m128(exp4(_mm256_extractf128_ps::<1>(x)), exp4(_mm256_castps256_ps128(x)));
        let s = _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)), _mm256_loadu_ps(u.as_ptr().add(i)));
        _mm256_storeu_ps(g.as_mut_ptr().add(i), s);
        i += 8;
    }
    n_all
}

/// f32 to f16 bits, eight at a time, rounded to nearest even as `half::f16::from_f32` (which
/// takes the same F16C instruction one value at a time); returns how many values it did (a
/// multiple of 8).
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn f32_to_f16(x: &[f32], out: &mut [u16]) -> usize {
    let n = x.len().min(out.len()) / 8 * 8;
    for i in (0..n).step_by(8) {
        let v = _mm256_loadu_ps(x.as_ptr().add(i));
        _mm_storeu_si128(out.as_mut_ptr().add(i) as *mut __m128i, _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v));
    }
    n
}
