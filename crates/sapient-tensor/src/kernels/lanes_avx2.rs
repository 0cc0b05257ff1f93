//! AVX2 and AVX-VNNI kernels for the 32-value formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) on the
//! lane kernels' packed layout ([`Packed`]), for machines without AVX-512: the same sixteen
//! weight rows a group, taken as two halves of eight, one row per 32-bit lane of a 256-bit
//! register.
//!
//! A packed block's register `k` holds, for row `n`, the dword of values `4k..4k + 4` at byte
//! `64k + 4n`: its low 32 bytes are rows 0..8 and its high 32 bytes rows 8..16, so each half
//! loads its eight registers straight from the layout the AVX-512 kernels read. With AVX-VNNI
//! one `vpdpbusd` with four broadcast activation bytes advances eight dot products by four
//! values; without it `vpmaddubsw` makes 16-bit pair sums, added in 16 bits as far as they
//! cannot overflow (sixteen 4-bit products, eight 5-bit ones), then widened by one
//! `vpmaddwd`. Q8_0 without AVX-VNNI multiplies the values' magnitudes by the activations with
//! the values' signs (`vpsignb`), so a pair sum stays within 16 bits.
//!
//! Arithmetic: that of the AVX-512 lane kernels ([`super::lanes::reference`]), bit for bit,
//! whichever level and number of activation rows: each block's integer sum is exact (every
//! route above gives the same integer), then `acc = fma(S_b, d_w·d_a, acc)` block after block
//! and, for the formats with a minimum, `accm = fma(m_w, s_a, accm)` in a chain of its own,
//! returning `acc + accm`. So a batch is bit-identical to its rows one at a time, and a model
//! gives the same outputs on AVX2, AVX-VNNI and AVX-512 machines.
//!
//! Safety: every function requires AVX2, FMA and F16C (AVX-VNNI too for `VNNI = true`),
//! checked at run time by the dispatcher ([`super::has_lanes_avx2`], [`super::has_vnni`]);
//! the packed weights hold `acts`' width.

#![allow(clippy::missing_safety_doc, clippy::needless_range_loop, clippy::too_many_arguments)]

use super::dispatch::by_count;
use super::lanes::{passes, prefetch_l2, Packed, PACKED_AHEAD_L1, PACKED_AHEAD_L2};
use super::lanes_k::ahead;
use super::quant::{BlockQ8, QType};
use std::arch::x86_64::*;

/// Most activation rows one pass takes (formats with a minimum take half as many).
const PASS: usize = 8;
/// Activation rows a pass over the weight rows takes (they stay in L2 meanwhile).
const M_BLOCK: usize = 64;

/// A 32-value format's packed block as these kernels see it.
trait Fmt {
    /// Offset subtracted in integers (0 for formats with a minimum).
    const OFF: i32;
    const HAS_M: bool;
    /// Values of 5 bits (a 16-bit sum may hold eight products, not sixteen).
    const FIVE: bool;
    /// Q8_0: values stored as `q + 128`.
    const Q8: bool;
    /// Packed bytes of one block's values, high bits and scales for sixteen rows.
    const QB: usize;
    const QH: usize;
    const SB: usize = if Self::HAS_M { 64 } else { 32 };
    const PB: usize = 2 * (Self::QB + Self::QH + Self::SB);
    const PASS: usize = if Self::HAS_M { PASS / 2 } else { PASS };
}

struct Q40;
struct Q41;
struct Q50;
struct Q51;
struct Q80;

macro_rules! fmt {
    ($t:ty, $off:expr, $m:expr, $five:expr, $q8:expr, $qb:expr, $qh:expr) => {
        impl Fmt for $t {
            const OFF: i32 = $off;
            const HAS_M: bool = $m;
            const FIVE: bool = $five;
            const Q8: bool = $q8;
            const QB: usize = $qb;
            const QH: usize = $qh;
        }
    };
}
fmt!(Q40, 8, false, false, false, 256, 0);
fmt!(Q41, 0, true, false, false, 256, 0);
fmt!(Q50, 16, false, true, false, 256, 64);
fmt!(Q51, 0, true, true, false, 256, 64);
fmt!(Q80, 128, false, false, true, 512, 0);

#[inline(always)]
unsafe fn ld(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

/// Register `k` of half `h` of a packed block: values at `q`, high bits at `qh`. Q8_0's are
/// its unsigned values (`q + 128`) with AVX-VNNI and its signed ones without.
#[inline(always)]
unsafe fn weights<F: Fmt, const VNNI: bool>(q: *const u8, qh: *const u8, h: usize) -> [__m256i; 8] {
    if F::Q8 {
        let flip = _mm256_set1_epi8(if VNNI { 0 } else { -128 });
        return std::array::from_fn(|k| _mm256_xor_si256(ld(q.add(64 * k + 32 * h)), flip));
    }
    let m = _mm256_set1_epi8(0x0f);
    let u: [__m256i; 4] = std::array::from_fn(|k| ld(q.add(64 * k + 32 * h)));
    let mut w: [__m256i; 8] = std::array::from_fn(|k| if k < 4 { _mm256_and_si256(u[k], m) } else { _mm256_and_si256(_mm256_srli_epi16::<4>(u[k - 4]), m) });
    if F::FIVE {
        // Register k byte i of lane n is value 4k + i of row n: bit 4(k % 2) + i of byte k / 2
        // of the row's 32 high bits (lane n of `bits`).
        let bits = ld(qh.add(32 * h));
        let sixteen = _mm256_set1_epi8(0x10);
        for k in 0..8 {
            let b = (k / 2) as i8;
            let ctl = _mm256_setr_epi8(b, b, b, b, b + 4, b + 4, b + 4, b + 4, b + 8, b + 8, b + 8, b + 8, b + 12, b + 12, b + 12, b + 12, b, b, b, b, b + 4, b + 4, b + 4, b + 4, b + 8, b + 8, b + 8, b + 8, b + 12, b + 12, b + 12, b + 12);
            let s = 4 * (k % 2);
            let sel = _mm256_set1_epi32(i32::from_le_bytes([1 << s, 2 << s, 4 << s, 8 << s]));
            let set = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(bits, ctl), sel), sel);
            w[k] = _mm256_or_si256(w[k], _mm256_and_si256(set, sixteen));
        }
    }
    w
}

#[inline(always)]
unsafe fn bcast(q: *const i8, k: usize) -> __m256i {
    _mm256_set1_epi32(std::ptr::read_unaligned(q.add(4 * k) as *const i32))
}

/// `init` plus the exact integer sum, per lane, of the eight registers' values times the
/// activation bytes `q` (register `k` against bytes `4k..4k + 4`).
#[inline(always)]
unsafe fn dot<F: Fmt, const VNNI: bool>(w: &[__m256i; 8], q: *const i8, init: __m256i) -> __m256i {
    if VNNI {
        let mut s = init;
        for k in 0..8 {
            s = _mm256_dpbusd_avx_epi32(s, w[k], bcast(q, k));
        }
        return s;
    }
    let ones = _mm256_set1_epi16(1);
    if F::Q8 {
        // |w| * (a with w's sign): a pair sum is at most 2 * 128 * 127 in magnitude.
        let mut s = init;
        for k in 0..8 {
            let p = _mm256_maddubs_epi16(_mm256_abs_epi8(w[k]), _mm256_sign_epi8(bcast(q, k), w[k]));
            s = _mm256_add_epi32(s, _mm256_madd_epi16(p, ones));
        }
        return s;
    }
    // Pair sums of at most 2 * 31 * 127 (5-bit) or 2 * 15 * 127 (4-bit): four, or all eight,
    // add up within 16 bits.
    let p: [__m256i; 8] = std::array::from_fn(|k| _mm256_maddubs_epi16(w[k], bcast(q, k)));
    let sum4 = |a: usize| _mm256_add_epi16(_mm256_add_epi16(p[a], p[a + 1]), _mm256_add_epi16(p[a + 2], p[a + 3]));
    if F::FIVE {
        _mm256_add_epi32(init, _mm256_add_epi32(_mm256_madd_epi16(sum4(0), ones), _mm256_madd_epi16(sum4(4), ones)))
    } else {
        _mm256_add_epi32(init, _mm256_madd_epi16(_mm256_add_epi16(sum4(0), sum4(4)), ones))
    }
}

/// Sixteen packed weight rows at `gp` (`nvalid` of them real) against `R` activation rows:
/// `outs[r][n]` for row `n`. `dist`, `l1d`: bytes ahead to prefetch into L2 and L1 (0: none).
#[inline(always)]
unsafe fn group<F: Fmt, const VNNI: bool, const R: usize>(gp: *const u8, dist: usize, nvalid: usize, nb: usize, acts: [*const BlockQ8; R], corr: [*const i32; R], outs: [*mut f32; R], l1d: usize) {
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    let mut accm = [[_mm256_setzero_ps(); 2]; R];
    // Q8_0 without AVX-VNNI multiplies signed values: no offset to take back.
    let with_corr = F::OFF != 0 && (VNNI || !F::Q8);
    for b in 0..nb {
        let pair = gp.add((b >> 1) * F::PB);
        let j = b & 1;
        ahead(pair.add(j * F::PB / 2), F::PB / 2, dist, l1d);
        let sp = pair.add(2 * (F::QB + F::QH) + j * F::SB);
        for h in 0..2 {
            let dw = _mm256_cvtph_ps(_mm_loadu_si128(sp.add(16 * h) as *const __m128i));
            let mw = if F::HAS_M { _mm256_cvtph_ps(_mm_loadu_si128(sp.add(32 + 16 * h) as *const __m128i)) } else { _mm256_setzero_ps() };
            let w = weights::<F, VNNI>(pair.add(j * F::QB), pair.add(2 * F::QB + j * F::QH), h);
            for r in 0..R {
                let a = &*acts[r].add(b);
                let init = if with_corr { _mm256_set1_epi32(*corr[r].add(b)) } else { _mm256_setzero_si256() };
                let s = dot::<F, VNNI>(&w, a.qs.as_ptr(), init);
                let dd = _mm256_mul_ps(dw, _mm256_set1_ps(a.d));
                acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), dd, acc[r][h]);
                if F::HAS_M {
                    accm[r][h] = _mm256_fmadd_ps(mw, _mm256_set1_ps(a.s), accm[r][h]);
                }
            }
        }
    }
    for r in 0..R {
        let x = |h: usize| if F::HAS_M { _mm256_add_ps(acc[r][h], accm[r][h]) } else { acc[r][h] };
        store(x(0), x(1), nvalid, outs[r]);
    }
}

/// The first `nvalid` (at most 16) of a group's outputs, rows 0..8 in `lo` and 8..16 in `hi`.
#[inline(always)]
pub(super) unsafe fn store(lo: __m256, hi: __m256, nvalid: usize, out: *mut f32) {
    let mut v = [0f32; 16];
    _mm256_storeu_ps(v.as_mut_ptr(), lo);
    _mm256_storeu_ps(v.as_mut_ptr().add(8), hi);
    std::ptr::copy_nonoverlapping(v.as_ptr(), out, nvalid.min(16));
}

/// Output columns `r0..r1` (`r0` a multiple of 16) of the product of packed weights `w`
/// (groups of `gb` bytes) with `m` activation rows, into `out[i * out_stride + j]`.
#[inline(always)]
unsafe fn range_of<F: Fmt, const VNNI: bool>(w: &[u8], gb: usize, r0: usize, r1: usize, acts: &[BlockQ8], corr: &[i32], m: usize, out: *mut f32, out_stride: usize) {
    debug_assert!(w.len() >= r1.div_ceil(16) * gb && r0.is_multiple_of(16));
    let nb = acts.len() / m.max(1);
    let p = w.as_ptr();
    let dist = PACKED_AHEAD_L2;
    prefetch_l2(p.add(r0 / 16 * gb), dist.min((r1 - r0).div_ceil(16) * gb));
    passes!(F::PASS, r0, r1, m, nb, acts, corr, out, out_stride, |g, nvalid, r, ap, cp, op, first_pass| {
        let (d, d1) = if first_pass { (dist, PACKED_AHEAD_L1) } else { (0, 0) };
        let gp = p.add(g / 16 * gb);
        macro_rules! go {
            ($n:literal) => {
                group::<F, VNNI, $n>(gp, d, nvalid, nb, std::array::from_fn(|i| ap[i]), std::array::from_fn(|i| cp[i]), std::array::from_fn(|i| op[i]), d1)
            };
        }
        by_count!(r => go { 1, 2, 3, 4, 5, 6, 7; _ => 8 })
    });
}

macro_rules! level {
    ($name:ident, $vnni:literal, $feat:literal) => {
        #[inline(never)]
        #[target_feature(enable = $feat)]
        unsafe fn $name(p: &Packed, r0: usize, r1: usize, acts: &[BlockQ8], corr: &[i32], m: usize, out: *mut f32, out_stride: usize) {
            let (w, gb) = (p.bytes(), p.group_bytes());
            match p.qtype() {
                QType::Q4_0 => range_of::<Q40, $vnni>(w, gb, r0, r1, acts, corr, m, out, out_stride),
                QType::Q4_1 => range_of::<Q41, $vnni>(w, gb, r0, r1, acts, corr, m, out, out_stride),
                QType::Q5_0 => range_of::<Q50, $vnni>(w, gb, r0, r1, acts, corr, m, out, out_stride),
                QType::Q5_1 => range_of::<Q51, $vnni>(w, gb, r0, r1, acts, corr, m, out, out_stride),
                QType::Q8_0 => range_of::<Q80, $vnni>(w, gb, r0, r1, acts, corr, m, out, out_stride),
                _ => unreachable!("these kernels take the packed 32-value formats"),
            }
        }
    };
}
level!(range_vnni, true, "avx2,fma,f16c,avxvnni");
level!(range_avx2, false, "avx2,fma,f16c");

/// Output columns (weight rows) `r0..r1` (`r0` a multiple of 16) of the product of packed
/// weights `p` (a 32-value format) with `m` activation rows (`acts`: `m` rows of blocks;
/// `corr`: per block `-offset * sum(qs)` for the offset formats, empty otherwise), into
/// `out[i * out_stride + j]`; with `vnni`, on AVX-VNNI.
pub unsafe fn range_packed(vnni: bool, p: &Packed, r0: usize, r1: usize, acts: &[BlockQ8], corr: &[i32], m: usize, out: *mut f32, out_stride: usize) {
    if vnni {
        range_vnni(p, r0, r1, acts, corr, m, out, out_stride)
    } else {
        range_avx2(p, r0, r1, acts, corr, m, out, out_stride)
    }
}

/// Whether products of format `t` go to these kernels once packed: the 32-value formats that
/// [`LanesFormats`](super::LanesFormats) names, and Q4_K and Q6_K (`lanes_avx2_k.rs`) unless
/// [`KernelOptions::lanes_kquants`](super::KernelOptions::lanes_kquants) is off.
pub fn handles(t: QType) -> bool {
    if matches!(t, QType::Q4K | QType::Q6K) {
        return super::options().lanes_kquants;
    }
    match super::options().lanes_formats {
        super::LanesFormats::Q4 => matches!(t, QType::Q4_0 | QType::Q4_1),
        super::LanesFormats::All => matches!(t, QType::Q4_0 | QType::Q4_1 | QType::Q5_0 | QType::Q5_1 | QType::Q8_0),
    }
}
