//! AVX-512 (F, BW, VL, VNNI) kernels: one weight row against up to [`MAX_ROWS`] activation
//! rows, the weights decoded once per block for all of them.
//!
//! Activations come in layouts made for these kernels ([`Pair`] for the 32-value formats,
//! [`BlockK`] for Q4_K and Q6_K), built once per product by `QuantizedActs`, so that the work
//! per (weight row, activation row) pair is a few instructions per 64 values:
//!
//! - 32-value formats: two blocks per 512-bit register. Weights are made unsigned (Q4_0 and
//!   Q5_0 nibbles as stored, Q8_0 with its sign bit flipped) and `vpdpbusd` starts from a
//!   correction the activation layout carries (`-offset * sum of each 4 activations`), so the
//!   integer sum is exact; then one conversion, one scale product and one fused multiply-add.
//! - k-quants: `vpmaddubsw` then `vpdpwssd` with the sub-block scales, a whole 256-value
//!   superblock summed in integers before its one scaling.
//!
//! Every output is computed by the same instructions in the same order whatever the number
//! of rows, so batches are bit-identical to single rows (speculative decoding relies on it).
//! For the 32-value formats the sums are also reduced in the AVX2 kernels' order, so results
//! are bit-identical to theirs (the same model gives the same tokens with and without
//! AVX-512); the k-quants reduce in their own order (fewer instructions per activation row)
//! and differ from the AVX2 kernels by rounding.
//!
//! Safety: every function requires AVX-512 F/BW/VL/VNNI, FMA and F16C (checked once at run
//! time by the dispatcher) and that `w` holds the row the activation length implies.

#![allow(clippy::missing_safety_doc, clippy::needless_range_loop)]

use super::dispatch::by_count;
use super::quant::{BlockQ8, BlockQ8K};
use std::arch::x86_64::*;

/// Most activation rows a kernel call takes.
pub const MAX_ROWS: usize = 8;

/// 64 activation values (two 32-value blocks) for the 32-value weight formats.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub struct Pair {
    pub qs: [i8; 64],
    /// Block scales: lanes 0..8 the first block's, 8..16 the second's.
    pub d: [f32; 16],
    /// Formats without a minimum: `-offset * (sum of 4 consecutive qs)` per i32 lane (the
    /// start of `vpdpbusd`). Formats with a minimum: f32 bits, lane 1 the first block's
    /// `s = d * sum(qs)`, lane 3 the second's, zero elsewhere (lined up with the
    /// `[d0, m0, d1, m1]` the weights' block headers convert to).
    pub c: [u32; 16],
}

impl Default for Pair {
    fn default() -> Self {
        Self { qs: [0; 64], d: [0.0; 16], c: [0; 16] }
    }
}

/// 256 activation values for Q4_K and Q6_K.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub struct BlockK {
    pub qs: [i8; 256],
    /// Sums of each 16 values (Q6_K's offset correction).
    pub bsums: [i16; 16],
    /// `-d * (sum of each 32 values)` (Q4_K's minimums, one product per sub-block).
    pub mb: [f32; 8],
    /// Sums of each 32 values (Q4_K's minimums in integers, for the exact kernels).
    pub bs32: [i16; 8],
    pub d: f32,
}

impl Default for BlockK {
    fn default() -> Self {
        Self { qs: [0; 256], bsums: [0; 16], mb: [0.0; 8], bs32: [0; 8], d: 0.0 }
    }
}

/// The offset that makes a format's weights unsigned (0 for formats with a minimum).
pub fn offset(t: super::QType) -> i32 {
    use super::QType::*;
    match t {
        Q4_0 => 8,
        Q5_0 => 16,
        Q8_0 => 128,
        _ => 0,
    }
}

/// Lay out quantized 32-value blocks as pairs for a format with weight offset `off` (0: the
/// format has a minimum and `c` carries the block sums `s`).
pub fn pairs_from(blocks: &[BlockQ8], off: i32, out: &mut [Pair]) {
    debug_assert_eq!(out.len(), blocks.len().div_ceil(2));
    for (p, o) in out.iter_mut().enumerate() {
        *o = Pair::default();
        for h in 0..2 {
            let Some(b) = blocks.get(2 * p + h) else { break };
            o.qs[32 * h..32 * h + 32].copy_from_slice(&b.qs);
            o.d[8 * h..8 * h + 8].fill(b.d);
            if off == 0 {
                o.c[1 + 2 * h] = b.s.to_bits();
            } else {
                for l in 0..8 {
                    let s: i32 = b.qs[4 * l..4 * l + 4].iter().map(|&q| q as i32).sum();
                    o.c[8 * h + l] = (-off * s) as u32;
                }
            }
        }
    }
}

/// Lay out quantized 256-value blocks for the k-quant kernels.
pub fn blockk_from(blocks: &[BlockQ8K], out: &mut [BlockK]) {
    for (b, o) in blocks.iter().zip(out.iter_mut()) {
        o.qs = b.qs;
        o.bsums = b.bsums;
        for k in 0..8 {
            let s32 = b.bsums[2 * k] as i32 + b.bsums[2 * k + 1] as i32;
            o.mb[k] = -b.d * s32 as f32;
            // At most 32 * 128 in magnitude.
            o.bs32[k] = s32 as i16;
        }
        o.d = b.d;
    }
}

/// `vpdpwssd` itself: LLVM otherwise splits the intrinsic into `vpmaddwd` + `vpaddd` for
/// generic x86-64 tuning, one more instruction per 32 products.
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
pub(super) unsafe fn dpwssd(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
    let mut r = acc;
    std::arch::asm!("vpdpwssd {r}, {a}, {b}", r = inout(zmm_reg) r, a = in(zmm_reg) a, b = in(zmm_reg) b, options(pure, nomem, nostack));
    r
}

#[inline(always)]
unsafe fn rd16(p: *const u8) -> i16 {
    std::ptr::read_unaligned(p as *const i16)
}

#[inline(always)]
unsafe fn rd32(p: *const u8) -> u32 {
    std::ptr::read_unaligned(p as *const u32)
}

/// Lanes 0..8 = lane 0 of `v`, lanes 8..16 = lane `1` of `v` (as f32).
#[inline(always)]
unsafe fn spread01(v: __m128) -> __m512 {
    let idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(v))
}

/// Two blocks' 16 nibble bytes (`q1` zero for a missing second block) to 64 values: the
/// first block's low nibbles, its high nibbles, then the second block's.
#[inline(always)]
unsafe fn nib_pair(q0: __m128i, q1: __m128i) -> __m512i {
    let t = _mm512_castsi256_si512(_mm256_set_m128i(q1, q0));
    let z = _mm512_shuffle_i64x2::<0x50>(t, t); // [q0, q0, q1, q1]
    let z = _mm512_mask_srli_epi16::<4>(z, 0xFF00_FF00, z);
    _mm512_and_si512(z, _mm512_set1_epi8(0x0f))
}

/// A 32-value weight format as the kernels see it: two blocks at once.
trait Fmt {
    const BYTES: usize;
    const HAS_M: bool;
    /// Unsigned values, scales `d` (spread as in [`Pair::d`]) and minimums (lanes 1 and 3 of
    /// the last value, the first and second block's; unused without a minimum) of blocks at
    /// `p` and `p + BYTES` (`two` false: only the first exists).
    unsafe fn pair(p: *const u8, two: bool) -> (__m512i, __m512, __m128);
}

struct Q40;
struct Q41;
struct Q50;
struct Q51;
struct Q80;

#[inline(always)]
unsafe fn load128_or_zero(p: *const u8, yes: bool) -> __m128i {
    if yes {
        _mm_loadu_si128(p as *const __m128i)
    } else {
        _mm_setzero_si128()
    }
}

/// f16 scales `d0`, `d1` spread.
#[inline(always)]
unsafe fn d_pair(p: *const u8, bytes: usize, two: bool) -> __m512 {
    let d1 = if two { rd16(p.add(bytes)) } else { 0 };
    spread01(_mm_cvtph_ps(_mm_set_epi16(0, 0, 0, 0, 0, 0, d1, rd16(p))))
}

/// f16 `d`, `m` at the start of each block: `d` spread, and `[d0, m0, d1, m1]`.
#[inline(always)]
unsafe fn dm_pair(p: *const u8, bytes: usize, two: bool) -> (__m512, __m128) {
    let dm1 = if two { rd32(p.add(bytes)) } else { 0 };
    let v = _mm_cvtph_ps(_mm_set_epi32(0, 0, dm1 as i32, rd32(p) as i32));
    let idx = _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0);
    (_mm512_permutexvar_ps(idx, _mm512_castps128_ps512(v)), v)
}

impl Fmt for Q40 {
    const BYTES: usize = 18;
    const HAS_M: bool = false;
    #[inline(always)]
    unsafe fn pair(p: *const u8, two: bool) -> (__m512i, __m512, __m128) {
        let w = nib_pair(_mm_loadu_si128(p.add(2) as *const __m128i), load128_or_zero(p.add(18 + 2), two));
        (w, d_pair(p, 18, two), _mm_setzero_ps())
    }
}

impl Fmt for Q41 {
    const BYTES: usize = 20;
    const HAS_M: bool = true;
    #[inline(always)]
    unsafe fn pair(p: *const u8, two: bool) -> (__m512i, __m512, __m128) {
        let w = nib_pair(_mm_loadu_si128(p.add(4) as *const __m128i), load128_or_zero(p.add(20 + 4), two));
        let (d, m) = dm_pair(p, 20, two);
        (w, d, m)
    }
}

/// Adds 16 to each value whose high bit (`qh` of the first block in the low 32 mask bits,
/// of the second in the high 32) is set.
#[inline(always)]
unsafe fn with_high_bits(w: __m512i, qh0: u32, qh1: u32) -> __m512i {
    let k: __mmask64 = qh0 as u64 | (qh1 as u64) << 32;
    _mm512_mask_add_epi8(w, k, w, _mm512_set1_epi8(0x10))
}

impl Fmt for Q50 {
    const BYTES: usize = 22;
    const HAS_M: bool = false;
    #[inline(always)]
    unsafe fn pair(p: *const u8, two: bool) -> (__m512i, __m512, __m128) {
        let w = nib_pair(_mm_loadu_si128(p.add(6) as *const __m128i), load128_or_zero(p.add(22 + 6), two));
        let qh1 = if two { rd32(p.add(22 + 2)) } else { 0 };
        (with_high_bits(w, rd32(p.add(2)), qh1), d_pair(p, 22, two), _mm_setzero_ps())
    }
}

impl Fmt for Q51 {
    const BYTES: usize = 24;
    const HAS_M: bool = true;
    #[inline(always)]
    unsafe fn pair(p: *const u8, two: bool) -> (__m512i, __m512, __m128) {
        let w = nib_pair(_mm_loadu_si128(p.add(8) as *const __m128i), load128_or_zero(p.add(24 + 8), two));
        let qh1 = if two { rd32(p.add(24 + 4)) } else { 0 };
        let (d, m) = dm_pair(p, 24, two);
        (with_high_bits(w, rd32(p.add(4)), qh1), d, m)
    }
}

impl Fmt for Q80 {
    const BYTES: usize = 34;
    const HAS_M: bool = false;
    #[inline(always)]
    unsafe fn pair(p: *const u8, two: bool) -> (__m512i, __m512, __m128) {
        let lo = _mm256_loadu_si256(p.add(2) as *const __m256i);
        let hi = if two { _mm256_loadu_si256(p.add(34 + 2) as *const __m256i) } else { _mm256_setzero_si256() };
        let w = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
        (_mm512_xor_si512(w, _mm512_set1_epi8(-128)), d_pair(p, 34, two), _mm_setzero_ps())
    }
}

/// One weight row of `nblocks` 32-value blocks against `R` activation rows.
#[inline(always)]
unsafe fn rows_pairs<F: Fmt, const R: usize>(w: &[u8], acts: [&[Pair]; R], out: &mut [f32]) {
    rows_pairs_of::<F, R, false, false>(w, acts, out, super::Ahead::NONE)
}

/// [`rows_pairs`]; `EVEN`: the row has an even number of blocks (every pair is whole, no
/// check per pair; the same instructions otherwise).
#[inline(always)]
unsafe fn rows_pairs_of<F: Fmt, const R: usize, const EVEN: bool, const STREAM: bool>(w: &[u8], acts: [&[Pair]; R], out: &mut [f32], pf: super::Ahead) {
    let np = acts[0].len();
    let nblocks = w.len() / F::BYTES;
    let p = w.as_ptr();
    let mut acc = [_mm512_setzero_ps(); R];
    let mut accm = [_mm_setzero_ps(); R];
    for i in 0..np {
        if STREAM {
            // The bytes `pf`'s distances ahead of this pair (past the row: the next rows).
            pf.stream(p.wrapping_add(2 * i * F::BYTES), 2 * F::BYTES);
        }
        let two = EVEN || 2 * i + 1 < nblocks;
        let (wu, dw, mw) = F::pair(p.add(2 * i * F::BYTES), two);
        for r in 0..R {
            let a = acts[r].get_unchecked(i);
            let qa = _mm512_load_si512(a.qs.as_ptr() as *const __m512i);
            let c = _mm512_load_si512(a.c.as_ptr() as *const __m512i);
            let isum = _mm512_dpbusd_epi32(if F::HAS_M { _mm512_setzero_si512() } else { c }, wu, qa);
            let dd = _mm512_mul_ps(dw, _mm512_load_ps(a.d.as_ptr()));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), dd, acc[r]);
            if F::HAS_M {
                accm[r] = _mm_add_ps(accm[r], _mm_mul_ps(mw, _mm_castsi128_ps(_mm512_castsi512_si128(c))));
            }
        }
    }
    for r in 0..R {
        *out.get_unchecked_mut(r) = finish_pairs::<F>(acc[r], accm[r]);
    }
}

/// The final sum of one output of the pair kernels. Lanes 0..8 hold the even blocks' sums
/// and 8..16 the odd ones', as the AVX2 kernel's two accumulators: reduce them in its order,
/// so that the two give bit-identical results.
#[inline(always)]
unsafe fn finish_pairs<F: Fmt>(acc: __m512, accm: __m128) -> f32 {
    let mut s = hsum8(_mm256_add_ps(_mm512_castps512_ps256(acc), _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc)))));
    if F::HAS_M {
        let m: [f32; 4] = std::mem::transmute(accm);
        s += m[1] + m[3];
    }
    s
}

/// Horizontal sum of 8 lanes in the AVX2 kernels' order.
#[inline(always)]
unsafe fn hsum8(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// Dispatch on the number of rows (1..=MAX_ROWS) to a const-generic instantiation.
macro_rules! by_rows {
    ($f:ident, [$($g:tt),*], $w:expr, $acts:expr, $out:expr) => {{
        let a = $acts;
        macro_rules! go {
            ($n:literal) => {
                $f::<$($g,)* $n>($w, std::array::from_fn(|i| a[i]), $out)
            };
        }
        by_count!(a.len() => go { 1, 2, 3, 4, 5, 6, 7; _ => 8 })
    }};
}

macro_rules! wrappers {
    ($($name:ident => $fmt:ty;)*) => {$(
        /// One weight row against 1..=8 activation rows; `out[r]` for row `r`.
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        pub unsafe fn $name(w: &[u8], acts: &[&[Pair]], out: &mut [f32]) {
            by_rows!(rows_pairs, [$fmt], w, acts, out)
        }
    )*};
}

wrappers! {
    rows_q4_0 => Q40;
    rows_q4_1 => Q41;
    rows_q5_0 => Q50;
    rows_q5_1 => Q51;
    rows_q8_0 => Q80;
}

use super::avx2::k4_scales_mins;

#[repr(C, align(64))]
struct Idx([[i16; 32]; 4]);

/// Q4_K step `j`: i16 lanes 0..16 take scale `2j`, lanes 16..32 scale `2j + 1`.
static Q4K_IDX: Idx = {
    let mut t = [[0i16; 32]; 4];
    let mut j = 0;
    while j < 4 {
        let mut e = 0;
        while e < 32 {
            t[j][e] = (2 * j + e / 16) as i16;
            e += 1;
        }
        j += 1;
    }
    Idx(t)
};

/// Q6_K step `s` (64 values): i16 lane `e` takes scale `4s + e / 8` (one per 16 values).
static Q6K_IDX: Idx = {
    let mut t = [[0i16; 32]; 4];
    let mut s = 0;
    while s < 4 {
        let mut e = 0;
        while e < 32 {
            t[s][e] = (4 * s + e / 8) as i16;
            e += 1;
        }
        s += 1;
    }
    Idx(t)
};

#[inline(always)]
unsafe fn idx(t: &Idx, j: usize) -> __m512i {
    _mm512_load_si512(t.0[j].as_ptr() as *const __m512i)
}

#[inline(always)]
pub(super) fn f16_bits(p: *const u8) -> f32 {
    // SAFETY: callers pass a pointer inside the weight row.
    half::f16::from_bits(unsafe { std::ptr::read_unaligned(p as *const u16) }).to_f32()
}


/// Q4_K step `j` (0..4) of the superblock at `bw`: its 64 unsigned values, the low nibbles
/// of stored bytes 32 j .. 32 j + 32 then their high nibbles.
#[inline(always)]
unsafe fn q4k_step(bw: *const u8, j: usize) -> __m512i {
    let bits = _mm256_loadu_si256(bw.add(16 + 32 * j) as *const __m256i);
    let z = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(bits), bits);
    _mm512_and_si512(_mm512_mask_srli_epi16::<4>(z, 0xFFFF_0000, z), _mm512_set1_epi8(0x0f))
}

/// Q4_K `[d, dmin]` of the superblock at `bw`.
#[inline(always)]
unsafe fn q4k_d_dmin(bw: *const u8) -> (f32, f32) {
    let v = _mm_cvtph_ps(_mm_cvtsi32_si128(rd32(bw) as i32));
    (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
}

/// Q6_K half `h` (0..2) of the superblock at `bw`: values 128 h .. 128 h + 64 and
/// 128 h + 64 .. 128 h + 128, unsigned (q + 32).
#[inline(always)]
pub(super) unsafe fn q6k_half(bw: *const u8, h: usize) -> [__m512i; 2] {
    let m4 = _mm512_set1_epi8(0x0f);
    let m2 = _mm512_set1_epi8(0x03);
    let b = _mm512_loadu_si512(bw.add(64 * h) as *const __m512i);
    let bh = _mm256_loadu_si256(bw.add(128 + 32 * h) as *const __m256i);
    let bhz = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(bh), bh);
    let s2 = _mm512_mask_srli_epi16::<2>(bhz, 0xFFFF_0000, bhz); // [bh, bh >> 2]
    let h01 = _mm512_slli_epi16::<4>(_mm512_and_si512(s2, m2));
    let h23 = _mm512_slli_epi16::<4>(_mm512_and_si512(_mm512_srli_epi16::<4>(s2), m2));
    [
        _mm512_or_si512(_mm512_and_si512(b, m4), h01),
        _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16::<4>(b), m4), h23),
    ]
}

/// One Q4_K superblock folded into a row's sum in the exact arithmetic the AMX kernels share
/// (`amx::drain_q4k`): `fma(isum, d * da, acc)`, then `fma(imin, -dmin * da, acc)`.
#[inline(always)]
fn q4k_fold(acc: f32, isum: i32, imin: i32, d: f32, dmin: f32, da: f32) -> f32 {
    let acc = (isum as f32).mul_add(d * da, acc);
    (imin as f32).mul_add(-dmin * da, acc)
}

/// The sums of the 4 lanes of `a` and of `b`.
#[inline(always)]
unsafe fn reduce2_epi32x4(a: __m128i, b: __m128i) -> (i32, i32) {
    let mm = _mm256_set_m128i(b, a);
    let mm = _mm256_add_epi32(mm, _mm256_shuffle_epi32::<0x4E>(mm));
    let mm = _mm256_add_epi32(mm, _mm256_shuffle_epi32::<0xB1>(mm));
    (_mm256_cvtsi256_si32(mm), _mm_cvtsi128_si32(_mm256_extracti128_si256::<1>(mm)))
}

/// Superblock `bw` of a Q4_K row against the matching superblock of `R` activation rows:
/// each row's 16 i32 lanes of scaled products (`ms`: the superblock's unpacked scales and
/// mins, [`k4_scales_mins`]), the weights decoded once for all rows.
#[inline(always)]
unsafe fn q4k_sb_sums<const R: usize>(bw: *const u8, ms: __m256i, acts: [&BlockK; R]) -> [__m512i; R] {
    let msz = _mm512_castsi256_si512(ms);
    let mut sumi = [_mm512_setzero_si512(); R];
    for j in 0..4 {
        let wq = q4k_step(bw, j);
        let sc = _mm512_permutexvar_epi16(idx(&Q4K_IDX, j), msz);
        for r in 0..R {
            let qa = _mm512_load_si512(acts[r].qs.as_ptr().add(64 * j) as *const __m512i);
            sumi[r] = dpwssd(sumi[r], _mm512_maddubs_epi16(wq, qa), sc);
        }
    }
    sumi
}

/// A Q4_K superblock's mins times an activation row's 32-value sums, in 4 i32 lanes.
#[inline(always)]
unsafe fn q4k_mins(ms: __m256i, b: &BlockK) -> __m128i {
    _mm_madd_epi16(_mm256_extracti128_si256::<1>(ms), _mm_loadu_si128(b.bs32.as_ptr() as *const __m128i))
}

/// Superblock `bw` of a Q6_K row against the matching superblock of `R` activation rows:
/// each row's 16 i32 lanes of scaled products less the offset correction (the stored values
/// are q + 32: 32 * the sum of scale x activation sums), the weights decoded once.
#[inline(always)]
unsafe fn q6k_sb_sums<const R: usize>(bw: *const u8, acts: [&BlockK; R]) -> [__m512i; R] {
    let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(bw.add(192) as *const __m128i));
    let scz = _mm512_castsi256_si512(sc16);
    let mut sumi = [_mm512_setzero_si512(); R];
    for h in 0..2 {
        let xs = q6k_half(bw, h);
        for (k, x) in xs.into_iter().enumerate() {
            let s = 2 * h + k;
            let sc = _mm512_permutexvar_epi16(idx(&Q6K_IDX, s), scz);
            for r in 0..R {
                let qa = _mm512_load_si512(acts[r].qs.as_ptr().add(64 * s) as *const __m512i);
                sumi[r] = dpwssd(sumi[r], _mm512_maddubs_epi16(x, qa), sc);
            }
        }
    }
    for r in 0..R {
        let corr = _mm256_madd_epi16(sc16, _mm256_loadu_si256(acts[r].bsums.as_ptr() as *const __m256i));
        sumi[r] = _mm512_sub_epi32(sumi[r], _mm512_zextsi256_si512(_mm256_slli_epi32::<5>(corr)));
    }
    sumi
}

/// The activation rows' superblock `i`.
#[inline(always)]
unsafe fn blocks_at<'a, const R: usize>(acts: &[&'a [BlockK]; R], i: usize) -> [&'a BlockK; R] {
    std::array::from_fn(|r| acts[r].get_unchecked(i))
}

/// Per superblock and activation row: four `vpmaddubsw` + `vpdpwssd` (64 values each) into
/// sixteen i32 lanes, then one conversion and one fused multiply-add by `dw * d` into a
/// 512-bit sum; the minimums take one fused multiply-add of eight floats (the weights'
/// `dmin * min` by the activations' `-d * sum`, both made once). Reduced at the end.
#[inline(always)]
unsafe fn q4k_rows<const R: usize>(w: &[u8], acts: [&[BlockK]; R], out: &mut [f32]) {
    q4k_rows_pf(w, acts, out, super::Ahead::NONE)
}

/// [`q4k_rows`], prefetching as it goes along the row (see [`super::Ahead::stream`]).
#[inline(always)]
unsafe fn q4k_rows_pf<const R: usize>(w: &[u8], acts: [&[BlockK]; R], out: &mut [f32], pf: super::Ahead) {
    let mut acc = [_mm512_setzero_ps(); R];
    let mut accm = [_mm256_setzero_ps(); R];
    let p = w.as_ptr();
    for i in 0..acts[0].len() {
        let bw = p.add(i * 144);
        pf.stream(bw, 144);
        // [dw, dmin] from the two f16 at the block's start.
        let dd = _mm_cvtph_ps(_mm_cvtsi32_si128(rd32(bw) as i32));
        let dwv = _mm512_broadcastss_ps(dd);
        let dminv = _mm256_broadcastss_ps(_mm_movehdup_ps(dd));
        let ms = k4_scales_mins(bw.add(4));
        let wm = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_extracti128_si256::<1>(ms))), dminv);
        let sumi = q4k_sb_sums(bw, ms, blocks_at(&acts, i));
        for r in 0..R {
            let b = acts[r].get_unchecked(i);
            let d = _mm512_mul_ps(dwv, _mm512_set1_ps(b.d));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi[r]), d, acc[r]);
            accm[r] = _mm256_fmadd_ps(wm, _mm256_loadu_ps(b.mb.as_ptr()), accm[r]);
        }
    }
    for r in 0..R {
        *out.get_unchecked_mut(r) = _mm512_reduce_add_ps(acc[r]) + hsum8(accm[r]);
    }
}

#[inline(always)]
unsafe fn q6k_rows<const R: usize>(w: &[u8], acts: [&[BlockK]; R], out: &mut [f32]) {
    q6k_rows_pf(w, acts, out, super::Ahead::NONE)
}

/// [`q6k_rows`], prefetching as it goes along the row (see [`super::Ahead::stream`]).
#[inline(always)]
unsafe fn q6k_rows_pf<const R: usize>(w: &[u8], acts: [&[BlockK]; R], out: &mut [f32], pf: super::Ahead) {
    let mut acc = [_mm512_setzero_ps(); R];
    let p = w.as_ptr();
    for i in 0..acts[0].len() {
        let bw = p.add(i * 210);
        pf.stream(bw, 210);
        let dw = f16_bits(bw.add(208));
        let blocks = blocks_at(&acts, i);
        let sumi = q6k_sb_sums(bw, blocks);
        for r in 0..R {
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi[r]), _mm512_set1_ps(dw * blocks[r].d), acc[r]);
        }
    }
    for r in 0..R {
        *out.get_unchecked_mut(r) = _mm512_reduce_add_ps(acc[r]);
    }
}

/// `roundf` in 16 lanes: to nearest, ties away from zero, as `avx2::round_away`.
#[inline(always)]
unsafe fn round_away16(x: __m512) -> __m512 {
    let t = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(x);
    let frac = _mm512_abs_ps(_mm512_sub_ps(x, t)); // exact
    let up = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(frac, _mm512_set1_ps(0.5));
    // +-1 with x's sign (integer operations: the float ones need AVX512DQ).
    let one = _mm512_or_si512(_mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(i32::MIN)), _mm512_castps_si512(_mm512_set1_ps(1.0)));
    _mm512_mask_add_ps(t, up, t, _mm512_castsi512_ps(one))
}

/// Sixteen vectors reduced lane-wise by `$op` (an `__m512` operation) into one: lane `k` of
/// the result is `$op` over the sixteen lanes of `$v[k]`, by a tree of two-source shuffles
/// (15 operations for sixteen vectors instead of four per vector). For max or an integer
/// sum, which are exact, the result is that of any other order. (A macro: a closure would
/// not carry the target features.)
macro_rules! reduce16 {
    ($v:expr, $op:expr) => {{
        let v: &[__m512; 16] = $v;
        let op = $op;
        // Two blocks per vector (8 lanes each), then four (4 lanes each in 128-bit quarters).
        let h: [__m512; 8] = std::array::from_fn(|i| op(_mm512_shuffle_f32x4::<0x44>(v[2 * i], v[2 * i + 1]), _mm512_shuffle_f32x4::<0xEE>(v[2 * i], v[2 * i + 1])));
        let q: [__m512; 4] = std::array::from_fn(|i| op(_mm512_shuffle_f32x4::<0x88>(h[2 * i], h[2 * i + 1]), _mm512_shuffle_f32x4::<0xDD>(h[2 * i], h[2 * i + 1])));
        // Quarter j: two lanes of block j, two of block 4 + j (then 8 + j, 12 + j).
        let e0 = op(_mm512_shuffle_ps::<0x44>(q[0], q[1]), _mm512_shuffle_ps::<0xEE>(q[0], q[1]));
        let e1 = op(_mm512_shuffle_ps::<0x44>(q[2], q[3]), _mm512_shuffle_ps::<0xEE>(q[2], q[3]));
        // Lane 4j + i: block 4i + j.
        let f = op(_mm512_shuffle_ps::<0x88>(e0, e1), _mm512_shuffle_ps::<0xDD>(e0, e1));
        _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), f)
    }};
}

/// [`super::quant::quantize_q8`] with AVX-512, bit-identical to it: sixteen blocks at a time
/// (their largest magnitudes and sums reduced together, their scales divided and rounded
/// to f16 as one vector), the rest a block at a time (a block in two vectors).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn quantize_q8(x: &[f32], out: &mut [BlockQ8]) {
    let n16 = out.len().min(x.len() / 32) / 16 * 16;
    for (xs, bs) in x[..n16 * 32].chunks_exact(512).zip(out[..n16].chunks_exact_mut(16)) {
        let p = xs.as_ptr();
        let ld = |k: usize| (_mm512_loadu_ps(p.add(32 * k)), _mm512_loadu_ps(p.add(32 * k + 16)));
        let amax: [__m512; 16] = std::array::from_fn(|k| {
            let (v0, v1) = ld(k);
            _mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1))
        });
        let d = _mm512_div_ps(reduce16!(&amax, |a, b| _mm512_max_ps(a, b)), _mm512_set1_ps(127.0));
        let nz = _mm512_cmp_ps_mask::<_CMP_NEQ_OQ>(d, _mm512_setzero_ps());
        let id = _mm512_maskz_div_ps(nz, _mm512_set1_ps(1.0), d);
        let mut ids = [0f32; 16];
        _mm512_storeu_ps(ids.as_mut_ptr(), id);
        let sums: [__m512; 16] = std::array::from_fn(|k| {
            let (v0, v1) = ld(k);
            let idk = _mm512_set1_ps(ids[k]);
            let r0 = _mm512_cvtps_epi32(round_away16(_mm512_mul_ps(v0, idk)));
            let r1 = _mm512_cvtps_epi32(round_away16(_mm512_mul_ps(v1, idk)));
            // Values within -127..=127: the truncating narrowing keeps them.
            let q = bs[k].qs.as_mut_ptr();
            _mm_storeu_si128(q as *mut __m128i, _mm512_cvtepi32_epi8(r0));
            _mm_storeu_si128(q.add(16) as *mut __m128i, _mm512_cvtepi32_epi8(r1));
            _mm512_castsi512_ps(_mm512_add_epi32(r0, r1))
        });
        let sum = _mm512_castps_si512(reduce16!(&sums, |a, b| _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(a), _mm512_castps_si512(b)))));
        // Rounded to f16 and back (to nearest, ties to even, as `half`).
        let f16 = |v: __m512| _mm512_cvtph_ps(_mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v));
        let (mut ds, mut ss) = ([0f32; 16], [0f32; 16]);
        _mm512_storeu_ps(ds.as_mut_ptr(), f16(d));
        _mm512_storeu_ps(ss.as_mut_ptr(), f16(_mm512_mul_ps(_mm512_cvtepi32_ps(sum), d)));
        for (k, b) in bs.iter_mut().enumerate() {
            b.d = ds[k];
            b.s = ss[k];
        }
    }
    for (chunk, b) in x[n16 * 32..].chunks_exact(32).zip(out[n16..].iter_mut()) {
        let p = chunk.as_ptr();
        let (v0, v1) = (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16)));
        let d = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1))) / 127.0;
        let id = _mm512_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
        let r0 = _mm512_cvtps_epi32(round_away16(_mm512_mul_ps(v0, id)));
        let r1 = _mm512_cvtps_epi32(round_away16(_mm512_mul_ps(v1, id)));
        let sum = _mm512_reduce_add_epi32(_mm512_add_epi32(r0, r1));
        // Values within -127..=127: the truncating narrowing keeps them.
        _mm_storeu_si128(b.qs.as_mut_ptr() as *mut __m128i, _mm512_cvtepi32_epi8(r0));
        _mm_storeu_si128(b.qs.as_mut_ptr().add(16) as *mut __m128i, _mm512_cvtepi32_epi8(r1));
        b.d = half::f16::from_f32(d).to_f32();
        b.s = half::f16::from_f32(sum as f32 * d).to_f32();
    }
}

/// One Q4_K weight row against 1..=8 activation rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn rows_q4k(w: &[u8], acts: &[&[BlockK]], out: &mut [f32]) {
    by_rows!(q4k_rows, [], w, acts, out)
}

/// One Q6_K weight row against 1..=8 activation rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn rows_q6k(w: &[u8], acts: &[&[BlockK]], out: &mut [f32]) {
    by_rows!(q6k_rows, [], w, acts, out)
}

mod exact;
pub use exact::{range_k_x, rows_q4k_x, rows_q6k_x};

/// Weight rows `r0..r1` (`rb` bytes each, from `w`) against ONE activation row, `out[j]` for
/// row `j`, prefetching as it goes ([`super::Ahead::stream`]); each output is computed exactly
/// as the one-row call of the multi-row kernel computes it. One call per stretch of rows
/// instead of one per row: a decode product of a small model (SmolLM2's rows are 360 bytes)
/// spent a sixth of its time in the per-row dispatch around the kernel.
macro_rules! range_k_wrappers {
    ($($name:ident => $body:ident;)*) => {$(
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        pub unsafe fn $name(w: &[u8], rb: usize, r0: usize, r1: usize, act: &[BlockK], out: *mut f32, pf: super::Ahead) {
            debug_assert!(w.len() >= r1 * rb);
            let p = w.as_ptr();
            for j in r0..r1 {
                let mut o = [0f32; 1];
                $body::<1>(std::slice::from_raw_parts(p.add(j * rb), rb), [act], &mut o, pf);
                *out.add(j) = o[0];
            }
        }
    )*};
}

/// The range kernels of the 32-value formats: rows with an even number of blocks (every
/// matrix of the models here) skip the per-pair check for a missing second block.
#[inline(always)]
unsafe fn range_pairs<F: Fmt>(w: &[u8], rb: usize, r0: usize, r1: usize, act: &[Pair], out: *mut f32, pf: super::Ahead) {
    debug_assert!(w.len() >= r1 * rb);
    let p = w.as_ptr();
    let even = (rb / F::BYTES).is_multiple_of(2);
    for j in r0..r1 {
        let mut o = [0f32; 1];
        let row = std::slice::from_raw_parts(p.add(j * rb), rb);
        if even {
            rows_pairs_of::<F, 1, true, true>(row, [act], &mut o, pf);
        } else {
            rows_pairs_of::<F, 1, false, true>(row, [act], &mut o, pf);
        }
        *out.add(j) = o[0];
    }
}

macro_rules! range_pair_wrappers {
    ($($name:ident => $fmt:ty;)*) => {$(
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        pub unsafe fn $name(w: &[u8], rb: usize, r0: usize, r1: usize, act: &[Pair], out: *mut f32, pf: super::Ahead) {
            range_pairs::<$fmt>(w, rb, r0, r1, act, out, pf)
        }
    )*};
}

range_pair_wrappers! {
    range_q4_0 => Q40;
    range_q4_1 => Q41;
    range_q5_0 => Q50;
    range_q5_1 => Q51;
    range_q8_0 => Q80;
}

range_k_wrappers! {
    range_q4k => q4k_rows_pf;
    range_q6k => q6k_rows_pf;
}

/// e^x of 8 f32 lanes as [`super::exp_approx`] computes it (the same bits).
#[inline(always)]
pub(super) unsafe fn exp8(x: __m256) -> __m256 {
    let x = _mm512_min_pd(_mm512_max_pd(_mm512_cvtps_pd(x), _mm512_set1_pd(-110.0)), _mm512_set1_pd(100.0));
    let n = _mm512_roundscale_pd::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_pd(x, _mm512_set1_pd(std::f64::consts::LOG2_E)));
    let r = _mm512_fmadd_pd(n, _mm512_set1_pd(-std::f64::consts::LN_2), x);
    let mut p = _mm512_set1_pd(super::EXP_TAYLOR[0]);
    for c in &super::EXP_TAYLOR[1..] {
        p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(*c));
    }
    _mm512_cvtpd_ps(_mm512_scalef_pd(p, n))
}

/// [`super::silu_mul`] on whole vectors of 16; returns how many values it did.
#[target_feature(enable = "avx512f")]
pub unsafe fn silu_mul(g: &mut [f32], u: &[f32]) -> usize {
    let one = _mm512_set1_ps(1.0);
    let n_all = g.len().min(u.len()) / 16 * 16;
    let mut i = 0;
    while i < n_all {
        let gv = _mm512_loadu_ps(g.as_ptr().add(i));
        let x = _mm512_sub_ps(_mm512_setzero_ps(), gv);
        let lo = exp8(_mm512_castps512_ps256(x));
        let hi = exp8(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(x))));
        let e = _mm512_castpd_ps(_mm512_insertf64x4::<1>(_mm512_castps_pd(_mm512_castps256_ps512(lo)), _mm256_castps_pd(hi)));
        let s = _mm512_mul_ps(_mm512_div_ps(gv, _mm512_add_ps(one, e)), _mm512_loadu_ps(u.as_ptr().add(i)));
        _mm512_storeu_ps(g.as_mut_ptr().add(i), s);
        i += 16;
    }
    n_all
}

/// The first `n` of 16 lanes (all of them from 16 on).
#[inline(always)]
pub fn lanes16(n: usize) -> __mmask16 {
    if n >= 16 {
        0xffff
    } else {
        ((1u32 << n) - 1) as __mmask16
    }
}

/// `dst[t * ldd + j] = src[j * lds + t]` for the `rows` rows `j` and `cols` columns `t` of
/// `src`, 16 rows at a time by masked gathers, with zeros for `rows <= j < rows.div_ceil(16)
/// * 16` (so `ldd` is at least that).
#[target_feature(enable = "avx512f")]
pub unsafe fn transpose_gather(src: *const f32, lds: usize, rows: usize, cols: usize, dst: *mut f32, ldd: usize) {
    let idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(lds as i32));
    for j in (0..rows).step_by(16) {
        let m = lanes16(rows - j);
        for t in 0..cols {
            // SAFETY (caller): the unmasked lanes read rows j.. of `src`.
            let g = _mm512_mask_i32gather_ps::<4>(_mm512_setzero_ps(), m, idx, src.add(j * lds + t));
            _mm512_storeu_ps(dst.add(t * ldd + j), g);
        }
    }
}
