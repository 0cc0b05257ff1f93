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

#[inline(always)]
unsafe fn hsum_ps(v: __m256) -> f32 {
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

/// Sum of products of signed bytes `x` and `y`, as 8 f32 lanes.
#[inline(always)]
unsafe fn mul_sum_i8<const VNNI: bool>(x: __m256i, y: __m256i) -> __m256 {
    let ax = _mm256_sign_epi8(x, x);
    let sy = _mm256_sign_epi8(y, x);
    mul_sum_us8::<VNNI>(ax, sy)
}

/// `[d * a.d, m * a.s]` (lanes 0 and 1) for a block starting with two f16 `d, m`, and the
/// first broadcast to all 8 lanes: one conversion and one multiply for both.
#[inline(always)]
unsafe fn dm_scales(w: &[u8], off: usize, a: &BlockQ8) -> (__m256, __m128) {
    let bits = std::ptr::read_unaligned(w.as_ptr().add(off) as *const i32);
    let dm = _mm_cvtph_ps(_mm_set1_epi32(bits)); // d m d m
    let ds = _mm_castpd_ps(_mm_load1_pd(&a.d as *const f32 as *const f64)); // a.d a.s a.d a.s
    let prod = _mm_mul_ps(dm, ds);
    (_mm256_broadcastss_ps(prod), prod)
}

/// Runs `block(i)` (returning the block's scale and integer-dot vectors, and a per-block
/// offset term) over `n` blocks with two independent accumulator chains: one chain would
/// make every block wait for the previous fused multiply-add (4 cycles).
#[inline(always)]
unsafe fn sum_blocks(n: usize, block: impl Fn(usize) -> (__m256, __m256, __m128)) -> f32 {
    let mut a0 = _mm256_setzero_ps();
    let mut a1 = _mm256_setzero_ps();
    let mut m0 = _mm_setzero_ps();
    let mut m1 = _mm_setzero_ps();
    let mut i = 0;
    while i + 2 <= n {
        let (d0, q0, o0) = block(i);
        let (d1, q1, o1) = block(i + 1);
        a0 = _mm256_fmadd_ps(d0, q0, a0);
        a1 = _mm256_fmadd_ps(d1, q1, a1);
        m0 = _mm_add_ps(m0, o0);
        m1 = _mm_add_ps(m1, o1);
        i += 2;
    }
    if i < n {
        let (d0, q0, o0) = block(i);
        a0 = _mm256_fmadd_ps(d0, q0, a0);
        m0 = _mm_add_ps(m0, o0);
    }
    // The offset term of a block is in lane 1 of its vector.
    let m = _mm_add_ps(m0, m1);
    hsum_ps(_mm256_add_ps(a0, a1)) + _mm_cvtss_f32(_mm_movehdup_ps(m))
}

// The per-format bodies are macros expanded inside each `#[target_feature]` function, so
// that their closures inherit the function's features and inline (a closure in a plain
// generic helper would be compiled without AVX2 and called per block).
macro_rules! body_q4_0 {
    ($w:ident, $a:ident, $vnni:expr) => {{
        const VNNI: bool = $vnni;
        let (w, a) = ($w, $a);
    let p = w.as_ptr();
    sum_blocks(a.len(), |i| {
        let ba = a.get_unchecked(i);
        let bw = p.add(i * 18);
        let d = f16x8_mul(w, i * 18, ba.d);
        let qx = _mm256_sub_epi8(nibbles32(bw.add(2)), _mm256_set1_epi8(8));
        let qy = _mm256_loadu_si256(ba.qs.as_ptr() as *const __m256i);
        (d, mul_sum_i8::<VNNI>(qx, qy), _mm_setzero_ps())
    })
    }};
}

macro_rules! body_q4_1 {
    ($w:ident, $a:ident, $vnni:expr) => {{
        const VNNI: bool = $vnni;
        let (w, a) = ($w, $a);
    let p = w.as_ptr();
    sum_blocks(a.len(), |i| {
        let ba = a.get_unchecked(i);
        let bw = p.add(i * 20);
        let (d, m) = dm_scales(w, i * 20, ba);
        let qx = nibbles32(bw.add(4));
        let qy = _mm256_loadu_si256(ba.qs.as_ptr() as *const __m256i);
        (d, mul_sum_us8::<VNNI>(qx, qy), m)
    })
    }};
}

macro_rules! body_q5_0 {
    ($w:ident, $a:ident, $vnni:expr) => {{
        const VNNI: bool = $vnni;
        let (w, a) = ($w, $a);
    let p = w.as_ptr();
    sum_blocks(a.len(), |i| {
        let ba = a.get_unchecked(i);
        let bw = p.add(i * 22);
        let d = f16x8_mul(w, i * 22, ba.d);
        let qh = std::ptr::read_unaligned(bw.add(2) as *const u32);
        let lo = nibbles32(bw.add(6));
        // (nibble | high bit << 4) - 16 == nibble | (high bit clear ? 0xF0 : 0) as i8
        let hi = _mm256_andnot_si256(bits32(qh), _mm256_set1_epi8(0xf0u8 as i8));
        let qx = _mm256_or_si256(lo, hi);
        let qy = _mm256_loadu_si256(ba.qs.as_ptr() as *const __m256i);
        (d, mul_sum_i8::<VNNI>(qx, qy), _mm_setzero_ps())
    })
    }};
}

macro_rules! body_q5_1 {
    ($w:ident, $a:ident, $vnni:expr) => {{
        const VNNI: bool = $vnni;
        let (w, a) = ($w, $a);
    let p = w.as_ptr();
    sum_blocks(a.len(), |i| {
        let ba = a.get_unchecked(i);
        let bw = p.add(i * 24);
        let (d, m) = dm_scales(w, i * 24, ba);
        let qh = std::ptr::read_unaligned(bw.add(4) as *const u32);
        let lo = nibbles32(bw.add(8));
        let hi = _mm256_and_si256(bits32(qh), _mm256_set1_epi8(0x10));
        let qx = _mm256_or_si256(lo, hi);
        let qy = _mm256_loadu_si256(ba.qs.as_ptr() as *const __m256i);
        (d, mul_sum_us8::<VNNI>(qx, qy), m)
    })
    }};
}

macro_rules! body_q8_0 {
    ($w:ident, $a:ident, $vnni:expr) => {{
        const VNNI: bool = $vnni;
        let (w, a) = ($w, $a);
    let p = w.as_ptr();
    sum_blocks(a.len(), |i| {
        let ba = a.get_unchecked(i);
        let bw = p.add(i * 34);
        let d = f16x8_mul(w, i * 34, ba.d);
        let qx = _mm256_loadu_si256(bw.add(2) as *const __m256i);
        let qy = _mm256_loadu_si256(ba.qs.as_ptr() as *const __m256i);
        (d, mul_sum_i8::<VNNI>(qx, qy), _mm_setzero_ps())
    })
    }};
}

macro_rules! wrappers {
    ($($name:ident, $vnni:ident => $body:ident;)*) => {$(
        #[target_feature(enable = "avx2,fma,f16c")]
        pub unsafe fn $name(w: &[u8], a: &[BlockQ8]) -> f32 {
            $body!(w, a, false)
        }
        /// With AVX-VNNI (`vpdpbusd`).
        #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
        pub unsafe fn $vnni(w: &[u8], a: &[BlockQ8]) -> f32 {
            $body!(w, a, true)
        }
    )*};
}

wrappers! {
    dot_q4_0, dot_q4_0_vnni => body_q4_0;
    dot_q4_1, dot_q4_1_vnni => body_q4_1;
    dot_q5_0, dot_q5_0_vnni => body_q5_0;
    dot_q5_1, dot_q5_1_vnni => body_q5_1;
    dot_q8_0, dot_q8_0_vnni => body_q8_0;
}

/// Scales (low 8 x u8) and mins (high 8 x u8) of a Q4_K/Q5_K block as 16 x i16.
#[inline(always)]
unsafe fn k4_scales_mins(q: *const u8) -> __m256i {
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

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q4k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let m4 = _mm256_set1_epi8(0x0f);
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = _mm_setzero_ps();
    let p = w.as_ptr();
    for (i, ba) in a.iter().enumerate() {
        let bw = p.add(i * 144);
        let d = f16x8_mul(w, i * 144, ba.d);
        let dmin = f16x8_mul(w, i * 144 + 2, -ba.d);
        let ms = k4_scales_mins(bw.add(4));
        let prod = k4_mins_dot(ms, ba.bsums.as_ptr());
        acc_m = _mm_fmadd_ps(_mm256_castps256_ps128(dmin), _mm_cvtepi32_ps(prod), acc_m);
        let sc = _mm256_castsi256_si128(ms);
        let mut q4 = bw.add(16);
        let mut q8 = ba.qs.as_ptr();
        let mut sumi = _mm256_setzero_si256();
        for j in 0..4 {
            let sl = bcast16(sc, 2 * j);
            let sh = bcast16(sc, 2 * j + 1);
            let bits = _mm256_loadu_si256(q4 as *const __m256i);
            q4 = q4.add(32);
            let lo = _mm256_and_si256(bits, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
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

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q6k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let m4 = _mm256_set1_epi8(0x0f);
    let m2 = _mm256_set1_epi8(0x03);
    let m32 = _mm256_set1_epi8(32);
    let mut acc = _mm256_setzero_ps();
    let p = w.as_ptr();
    for (i, ba) in a.iter().enumerate() {
        let bw = p.add(i * 210);
        let d = f16x8_mul(w, i * 210 + 208, ba.d);
        let mut ql = bw;
        let mut qh = bw.add(128);
        let sc = bw.add(192) as *const i8;
        let mut q8 = ba.qs.as_ptr();
        let mut sumi = _mm256_setzero_si256();
        for j in 0..2 {
            let b1 = _mm256_loadu_si256(ql as *const __m256i);
            let b2 = _mm256_loadu_si256(ql.add(32) as *const __m256i);
            ql = ql.add(64);
            let bh = _mm256_loadu_si256(qh as *const __m256i);
            qh = qh.add(32);
            let h0 = _mm256_slli_epi16(_mm256_and_si256(bh, m2), 4);
            let h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bh, 2), m2), 4);
            let h2 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bh, 4), m2), 4);
            let h3 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bh, 6), m2), 4);
            let x0 = _mm256_or_si256(_mm256_and_si256(b1, m4), h0);
            let x1 = _mm256_or_si256(_mm256_and_si256(b2, m4), h1);
            let x2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b1, 4), m4), h2);
            let x3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b2, 4), m4), h3);
            let xs = [x0, x1, x2, x3];
            for (k, x) in xs.into_iter().enumerate() {
                let y = _mm256_loadu_si256(q8.add(32 * k) as *const __m256i);
                let p = _mm256_sub_epi16(_mm256_maddubs_epi16(x, y), _mm256_maddubs_epi16(m32, y));
                let s = q6_scale_pair(sc, 8 * j + 2 * k);
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(s, p));
            }
            q8 = q8.add(128);
        }
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc)
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

/// `y += a * x`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn axpy_f32(a: f32, x: &[f32], y: &mut [f32]) {
    let n = x.len().min(y.len());
    let (px, py) = (x.as_ptr(), y.as_mut_ptr());
    let va = _mm256_set1_ps(a);
    let mut i = 0;
    while i + 8 <= n {
        let v = _mm256_fmadd_ps(va, _mm256_loadu_ps(px.add(i)), _mm256_loadu_ps(py.add(i)));
        _mm256_storeu_ps(py.add(i), v);
        i += 8;
    }
    while i < n {
        *py.add(i) += a * *px.add(i);
        i += 1;
    }
}
