//! ARM64 (aarch64) kernels for the quantized row products: plain NEON on every aarch64 CPU,
//! `sdot` where the CPU has the dotprod extension (Armv8.2+: Apple M-series, Graviton 2+,
//! Cortex-A76+). One weight row against up to [`MAX_ROWS`] activation rows a call, each
//! weight block decoded once for all of them; with the i8mm extension (Apple M2+, Graviton
//! 3+) products of two or more activation rows take two weight rows at a time on `smmla`
//! (`neon_mmla.rs`).
//!
//! Every output is the portable code's arithmetic (`quant.rs`) bit for bit: a block's integer
//! sum is exact whichever instructions form it, and the f32 steps (the weight block's scale
//! times the activation block's, times the sum, added to the row's total block by block) are
//! the same operations in the same order. So a batch of rows gives the bits of the rows one at
//! a time, on every level ([`Level`]) and on machines without NEON.
//!
//! `sdot` and `smmla` are written as inline assembly: their `std::arch` intrinsics are not
//! stable yet. They appear only in functions compiled with the matching target feature.
//!
//! The activations these products take are quantized on NEON too (`neon_quant.rs`), and
//! the LLM's attention over its KV cache has NEON kernels of its own (`neon_attn.rs`); both
//! give the portable bits. No kernel computes in fp16: the contract is the portable f32
//! arithmetic bit for bit, which f16 products and sums (an 11-bit significand) would break;
//! f16 values (scales, the KV cache) are only widened to f32, exactly (`fcvt`, `fcvtl`).

use super::quant::{BlockQ8, BlockQ8K, QType};
use std::arch::aarch64::*;
use std::arch::asm;

/// Most activation rows a kernel call takes at once.
pub const MAX_ROWS: usize = 4;

/// Which aarch64 instructions a product uses (each level is also the one below plus its
/// extension; the results are the same bits on all).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Plain NEON: widening multiplies (`smull`) and pairwise accumulation (`sadalp`).
    Neon,
    /// `sdot`: sixteen byte products into four i32 lanes per instruction.
    Dotprod,
    /// `smmla` (i8mm) for pairs of weight rows against pairs of activation rows, `sdot`
    /// for the rest.
    I8mm,
}

impl Level {
    /// The widest level this CPU has and the kernel options allow.
    pub fn detect() -> Level {
        if super::has_i8mm() {
            Level::I8mm
        } else if super::has_dotprod() {
            Level::Dotprod
        } else {
            Level::Neon
        }
    }
}

/// Sixteen products of signed bytes summed into four i32 lanes (which lane takes which
/// products differs between implementations; callers use only the lanes' total or add
/// vectors lane by lane before that total).
pub(super) trait Dot {
    unsafe fn dot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t;
}

/// `sdot` (dotprod). Only callable from a function compiled with `dotprod`.
pub(super) struct Sdot;
impl Dot for Sdot {
    #[inline(always)]
    unsafe fn dot(mut acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
        asm!("sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b", acc = inout(vreg) acc, a = in(vreg) a, b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags));
        acc
    }
}

/// Plain NEON: products widened to i16, adjacent pairs accumulated into i32 (a pair of
/// products fits i16's range only as i32, which `sadalp` gives).
pub(super) struct Mull;
impl Dot for Mull {
    #[inline(always)]
    unsafe fn dot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
        let lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
        let hi = vmull_high_s8(a, b);
        vpadalq_s16(vpadalq_s16(acc, lo), hi)
    }
}

/// A 32-value weight format: each block decoded once into 32 signed bytes (the first 16 meet
/// activations 0..16, the other 16 activations 16..32), its scale and minimum.
pub(super) trait Fmt32 {
    const BYTES: usize;
    /// Whether the format has a per-block minimum (`acc += d * ad * s + m * as`).
    const HAS_M: bool;
    unsafe fn weight(p: *const u8) -> (int8x16_t, int8x16_t, f32, f32);
}

pub(super) struct Q40;
pub(super) struct Q41;
pub(super) struct Q50;
pub(super) struct Q51;
pub(super) struct Q80;

/// The f16 at `p` as f32 (exact), by the base instruction set's `fcvt` (the `half` crate
/// converts in software, or checks the CPU each call, on targets without the fp16 feature).
#[inline(always)]
pub(super) unsafe fn f16p(p: *const u8) -> f32 {
    let h = f32::from_bits(std::ptr::read_unaligned(p as *const u16) as u32);
    let s: f32;
    asm!("fcvt {s:s}, {h:h}", s = lateout(vreg) s, h = in(vreg) h, options(pure, nomem, nostack, preserves_flags));
    s
}

/// Low and high nibbles of 16 bytes.
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> (uint8x16_t, uint8x16_t) {
    let x = vld1q_u8(p);
    (vandq_u8(x, vdupq_n_u8(0x0f)), vshrq_n_u8::<4>(x))
}

/// Q5's fifth bits (a little-endian u32 at `p`) as 0x10 in the bytes that have them: bits
/// 0..16 for the low nibbles, 16..32 for the high ones.
#[inline(always)]
unsafe fn fifth_bits(p: *const u8) -> (uint8x16_t, uint8x16_t) {
    const BYTE_OF: [u8; 32] = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3];
    const BIT: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    let qh = vreinterpretq_u8_u32(vdupq_n_u32(std::ptr::read_unaligned(p as *const u32)));
    let bit = vld1q_u8(BIT.as_ptr());
    let ten = vdupq_n_u8(0x10);
    let lo = vandq_u8(vtstq_u8(vqtbl1q_u8(qh, vld1q_u8(BYTE_OF.as_ptr())), bit), ten);
    let hi = vandq_u8(vtstq_u8(vqtbl1q_u8(qh, vld1q_u8(BYTE_OF.as_ptr().add(16))), bit), ten);
    (lo, hi)
}

impl Fmt32 for Q40 {
    const BYTES: usize = 18;
    const HAS_M: bool = false;
    #[inline(always)]
    unsafe fn weight(p: *const u8) -> (int8x16_t, int8x16_t, f32, f32) {
        let (lo, hi) = nibbles(p.add(2));
        let e = vdupq_n_s8(8);
        (vsubq_s8(vreinterpretq_s8_u8(lo), e), vsubq_s8(vreinterpretq_s8_u8(hi), e), f16p(p), 0.0)
    }
}

impl Fmt32 for Q41 {
    const BYTES: usize = 20;
    const HAS_M: bool = true;
    #[inline(always)]
    unsafe fn weight(p: *const u8) -> (int8x16_t, int8x16_t, f32, f32) {
        let (lo, hi) = nibbles(p.add(4));
        (vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi), f16p(p), f16p(p.add(2)))
    }
}

impl Fmt32 for Q50 {
    const BYTES: usize = 22;
    const HAS_M: bool = false;
    #[inline(always)]
    unsafe fn weight(p: *const u8) -> (int8x16_t, int8x16_t, f32, f32) {
        let (lo, hi) = nibbles(p.add(6));
        let (hl, hh) = fifth_bits(p.add(2));
        let e = vdupq_n_s8(16);
        let lo = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(lo, hl)), e);
        let hi = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(hi, hh)), e);
        (lo, hi, f16p(p), 0.0)
    }
}

impl Fmt32 for Q51 {
    const BYTES: usize = 24;
    const HAS_M: bool = true;
    #[inline(always)]
    unsafe fn weight(p: *const u8) -> (int8x16_t, int8x16_t, f32, f32) {
        let (lo, hi) = nibbles(p.add(8));
        let (hl, hh) = fifth_bits(p.add(4));
        (vreinterpretq_s8_u8(vorrq_u8(lo, hl)), vreinterpretq_s8_u8(vorrq_u8(hi, hh)), f16p(p), f16p(p.add(2)))
    }
}

impl Fmt32 for Q80 {
    const BYTES: usize = 34;
    const HAS_M: bool = false;
    #[inline(always)]
    unsafe fn weight(p: *const u8) -> (int8x16_t, int8x16_t, f32, f32) {
        (vld1q_s8(p.add(2) as *const i8), vld1q_s8(p.add(18) as *const i8), f16p(p), 0.0)
    }
}

/// Blocks every row has: the weight row's, cut to the shortest activation row.
#[inline(always)]
pub(super) fn blocks<T>(w: &[u8], bytes: usize, acts: &[&[T]]) -> usize {
    acts.iter().fold(w.len() / bytes, |n, a| n.min(a.len()))
}

/// One block's contribution to a row's total, as the portable code adds it.
#[inline(always)]
pub(super) fn add_block<F: Fmt32>(acc: f32, d: f32, m: f32, a: &BlockQ8, s: i32) -> f32 {
    let t = d * a.d * s as f32;
    if F::HAS_M {
        acc + (t + m * a.s)
    } else {
        acc + t
    }
}

/// One weight row of format `F` against `R` activation rows.
#[inline(always)]
unsafe fn rows32<F: Fmt32, D: Dot, const R: usize>(w: &[u8], acts: &[&[BlockQ8]], out: &mut [f32]) {
    let acts = &acts[..R];
    let nb = blocks(w, F::BYTES, acts);
    let mut acc = [0f32; R];
    for b in 0..nb {
        let (lo, hi, d, m) = F::weight(w.as_ptr().add(b * F::BYTES));
        for (r, acc) in acc.iter_mut().enumerate() {
            // SAFETY (caller's): `b < nb`, at most every row's length.
            let a = acts.get_unchecked(r).get_unchecked(b);
            let q = a.qs.as_ptr();
            let s = vaddvq_s32(D::dot(D::dot(vdupq_n_s32(0), lo, vld1q_s8(q)), hi, vld1q_s8(q.add(16))));
            *acc = add_block::<F>(*acc, d, m, a, s);
        }
    }
    out[..R].copy_from_slice(&acc);
}

/// Q4_K's twelve bytes of 6-bit scales and mins at `p` (`quant::scales_mins_k4`'s unpacking) as
/// two vectors of eight bytes, by 32-bit masks and shifts (GGML's `utmp` trick) instead of
/// byte by byte.
#[inline(always)]
unsafe fn scales_mins_k4v(p: *const u8) -> (uint8x8_t, uint8x8_t) {
    const K1: u32 = 0x3f3f_3f3f;
    const K2: u32 = 0x0f0f_0f0f;
    const K3: u32 = 0x0303_0303;
    let u = |i: usize| std::ptr::read_unaligned(p.add(4 * i) as *const u32);
    let (u0, u1, u2) = (u(0), u(1), u(2));
    let sc = (u0 & K1) as u64 | (((u2 & K2) | (((u0 >> 6) & K3) << 4)) as u64) << 32;
    let mn = (u1 & K1) as u64 | ((((u2 >> 4) & K2) | (((u1 >> 6) & K3) << 4)) as u64) << 32;
    (vcreate_u8(sc), vcreate_u8(mn))
}

/// Q4_K: the eight sub-blocks' 6-bit scales and mins, the block's 256 nibbles as signed
/// bytes (vector `i` meets activations `16 i..16 i + 16`, scale `sc[i / 4]`), then per row the
/// integer sums scaled as the portable code does. A row's eight sub-block sums are reduced
/// together by pairwise adds (`addp`) into two vectors of four totals, then multiplied by
/// the scales and added up (one multiply and one multiply-add a block instead of one per
/// sub-block, which on Neoverse cores share the single vector multiply pipe).
#[inline(always)]
unsafe fn rows_q4k<D: Dot, const R: usize>(w: &[u8], acts: &[&[BlockQ8K]], out: &mut [f32]) {
    let acts = &acts[..R];
    let nb = blocks(w, 144, acts);
    let mut acc = [0f32; R];
    for b in 0..nb {
        let bw = w.as_ptr().add(b * 144);
        let (dw, dminw) = (f16p(bw), f16p(bw.add(2)));
        let (sc, mn) = scales_mins_k4v(bw.add(4));
        let sc = vreinterpretq_s16_u16(vmovl_u8(sc));
        let (sc_lo, sc_hi) = (vmovl_s16(vget_low_s16(sc)), vmovl_high_s16(sc));
        let mn = vreinterpretq_s16_u16(vmovl_u8(mn));
        let mut q = [vdupq_n_s8(0); 16];
        for c in 0..4 {
            let (l0, h0) = nibbles(bw.add(16 + 32 * c));
            let (l1, h1) = nibbles(bw.add(32 + 32 * c));
            q[4 * c] = vreinterpretq_s8_u8(l0);
            q[4 * c + 1] = vreinterpretq_s8_u8(l1);
            q[4 * c + 2] = vreinterpretq_s8_u8(h0);
            q[4 * c + 3] = vreinterpretq_s8_u8(h1);
        }
        for (r, acc) in acc.iter_mut().enumerate() {
            let a = acts.get_unchecked(r).get_unchecked(b);
            let p = a.qs.as_ptr();
            // (A loop, not a closure: a closure does not inherit the caller's target features.)
            let mut s = [vdupq_n_s32(0); 8];
            for (k, s) in s.iter_mut().enumerate() {
                *s = D::dot(D::dot(*s, q[2 * k], vld1q_s8(p.add(32 * k))), q[2 * k + 1], vld1q_s8(p.add(32 * k + 16)));
            }
            let t_lo = vpaddq_s32(vpaddq_s32(s[0], s[1]), vpaddq_s32(s[2], s[3]));
            let t_hi = vpaddq_s32(vpaddq_s32(s[4], s[5]), vpaddq_s32(s[6], s[7]));
            let sumi = vaddvq_s32(vmlaq_s32(vmulq_s32(t_lo, sc_lo), t_hi, sc_hi));
            let bs = vpaddq_s16(vld1q_s16(a.bsums.as_ptr()), vld1q_s16(a.bsums.as_ptr().add(8)));
            let summ = vaddvq_s32(vmlal_high_s16(vmull_s16(vget_low_s16(mn), vget_low_s16(bs)), mn, bs));
            let (d, dmin) = (dw * a.d, dminw * a.d);
            *acc += d * sumi as f32 - dmin * summ as f32;
        }
    }
    out[..R].copy_from_slice(&acc);
}

/// Q6_K: the block's 256 six-bit values as signed bytes, vector `i` meeting activations
/// `16 i..16 i + 16` with scale `sc[i]`.
#[inline(always)]
unsafe fn rows_q6k<D: Dot, const R: usize>(w: &[u8], acts: &[&[BlockQ8K]], out: &mut [f32]) {
    let acts = &acts[..R];
    let nb = blocks(w, 210, acts);
    let mut acc = [0f32; R];
    let (m4, m3, e) = (vdupq_n_u8(0x0f), vdupq_n_u8(0x30), vdupq_n_s8(32));
    let six = |low: uint8x16_t, high: uint8x16_t| vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(low, vandq_u8(high, m3))), e);
    for b in 0..nb {
        let p = w.as_ptr().add(b * 210);
        let dw = f16p(p.add(208));
        let sc = p.add(192) as *const i8;
        let mut q = [vdupq_n_s8(0); 16];
        for h in 0..2 {
            for g in 0..2 {
                let l0 = vld1q_u8(p.add(64 * h + 16 * g));
                let l1 = vld1q_u8(p.add(64 * h + 32 + 16 * g));
                let hb = vld1q_u8(p.add(128 + 32 * h + 16 * g));
                let i = 8 * h + g;
                q[i] = six(vandq_u8(l0, m4), vshlq_n_u8::<4>(hb));
                q[i + 2] = six(vandq_u8(l1, m4), vshlq_n_u8::<2>(hb));
                q[i + 4] = six(vshrq_n_u8::<4>(l0), hb);
                q[i + 6] = six(vshrq_n_u8::<4>(l1), vshrq_n_u8::<2>(hb));
            }
        }
        for (r, acc) in acc.iter_mut().enumerate() {
            let a = acts.get_unchecked(r).get_unchecked(b);
            let p8 = a.qs.as_ptr();
            let mut sumi = vdupq_n_s32(0);
            for (i, qi) in q.iter().enumerate() {
                let s = D::dot(vdupq_n_s32(0), *qi, vld1q_s8(p8.add(16 * i)));
                sumi = vmlaq_n_s32(sumi, s, *sc.add(i) as i32);
            }
            *acc += dw * a.d * vaddvq_s32(sumi) as f32;
        }
    }
    out[..R].copy_from_slice(&acc);
}

/// `$go!(F)` with `F` the 32-value format type of `$t` (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0); the
/// caller returns false for any other format.
macro_rules! by_format32 {
    ($t:expr, $go:ident) => {
        match $t {
            QType::Q4_0 => $go!(Q40),
            QType::Q4_1 => $go!(Q41),
            QType::Q5_0 => $go!(Q50),
            QType::Q5_1 => $go!(Q51),
            QType::Q8_0 => $go!(Q80),
            _ => return false,
        }
    };
}
pub(super) use by_format32;

/// [`rows_q8`] with dot products `D`.
#[inline(always)]
unsafe fn rows_q8_with<D: Dot>(t: QType, w: &[u8], acts: &[&[BlockQ8]], out: &mut [f32]) -> bool {
    macro_rules! go {
        ($f:ty) => {
            match acts.len() {
                1 => rows32::<$f, D, 1>(w, acts, out),
                2 => rows32::<$f, D, 2>(w, acts, out),
                3 => rows32::<$f, D, 3>(w, acts, out),
                _ => rows32::<$f, D, 4>(w, acts, out),
            }
        };
    }
    by_format32!(t, go);
    true
}

/// [`rows_q8k`] with dot products `D`.
#[inline(always)]
unsafe fn rows_q8k_with<D: Dot>(t: QType, w: &[u8], acts: &[&[BlockQ8K]], out: &mut [f32]) -> bool {
    macro_rules! go {
        ($k:ident) => {
            match acts.len() {
                1 => $k::<D, 1>(w, acts, out),
                2 => $k::<D, 2>(w, acts, out),
                3 => $k::<D, 3>(w, acts, out),
                _ => $k::<D, 4>(w, acts, out),
            }
        };
    }
    match t {
        QType::Q4K => go!(rows_q4k),
        QType::Q6K => go!(rows_q6k),
        _ => return false,
    }
    true
}

#[target_feature(enable = "dotprod")]
unsafe fn rows_q8_sdot(t: QType, w: &[u8], acts: &[&[BlockQ8]], out: &mut [f32]) -> bool {
    rows_q8_with::<Sdot>(t, w, acts, out)
}

#[target_feature(enable = "dotprod")]
unsafe fn rows_q8k_sdot(t: QType, w: &[u8], acts: &[&[BlockQ8K]], out: &mut [f32]) -> bool {
    rows_q8k_with::<Sdot>(t, w, acts, out)
}

/// Checks what the kernels index without bounds checks: 1..=[`MAX_ROWS`] rows and outputs.
fn fits<T>(acts: &[&[T]], out: &[f32]) -> bool {
    !acts.is_empty() && acts.len() <= MAX_ROWS && out.len() >= acts.len()
}

/// `out[r] = dot(w, acts[r])` for one weight row of a 32-value format at `level` (which the
/// CPU must have: [`Level::detect`] or below); false for a format these kernels leave to the
/// portable code, or a shape they do not take.
pub fn rows_q8_at(level: Level, t: QType, w: &[u8], acts: &[&[BlockQ8]], out: &mut [f32]) -> bool {
    if !fits(acts, out) || level > Level::detect() {
        return false;
    }
    // SAFETY: the row count and output length were checked; the blocks read are cut to
    // every row's length (`blocks`); dotprod is present from `Level::Dotprod` on.
    unsafe {
        match level {
            Level::Neon => rows_q8_with::<Mull>(t, w, acts, out),
            _ => rows_q8_sdot(t, w, acts, out),
        }
    }
}

/// Like [`rows_q8_at`] for Q4_K and Q6_K.
pub fn rows_q8k_at(level: Level, t: QType, w: &[u8], acts: &[&[BlockQ8K]], out: &mut [f32]) -> bool {
    if !fits(acts, out) || level > Level::detect() {
        return false;
    }
    // SAFETY: as in `rows_q8_at`.
    unsafe {
        match level {
            Level::Neon => rows_q8k_with::<Mull>(t, w, acts, out),
            _ => rows_q8k_sdot(t, w, acts, out),
        }
    }
}

#[cfg(sapient_mca)]
#[path = "neon_mca.rs"]
mod mca;
