//! `smmla` (the aarch64 i8mm extension) for products of two or more activation rows in the
//! 32-value formats: one instruction multiplies a 2x8 block of weight bytes (eight values of
//! two weight rows) with an 8x2 block of activation bytes (eight values of two activation
//! rows), so four of them give a block's four integer sums for two weight rows against two
//! activation rows, already side by side in one vector.
//!
//! The f32 steps then run lane by lane with the portable code's operations in its order
//! (`neon.rs`), so every output has the portable bits, as on the `sdot` kernels: a product
//! may mix the two (an odd last weight row, a single activation row) freely.

use super::neon::{blocks, by_format32, rows_q8_at, Fmt32, Level, MAX_ROWS, Q40, Q41, Q50, Q51, Q80};
use super::quant::{BlockQ8, QType};
use super::{QuantizedActs, SendPtr};
use std::arch::aarch64::*;
use std::arch::asm;

/// `acc + A * B^T` for A, B two rows of eight signed bytes each (lanes: A0.B0, A0.B1,
/// A1.B0, A1.B1). Only callable from a function compiled with `i8mm`.
#[inline(always)]
unsafe fn smmla(mut acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    asm!("smmla {acc:v}.4s, {a:v}.16b, {b:v}.16b", acc = inout(vreg) acc, a = in(vreg) a, b = in(vreg) b,
        options(pure, nomem, nostack, preserves_flags));
    acc
}

#[inline(always)]
unsafe fn zip_lo(a: int8x16_t, b: int8x16_t) -> int8x16_t {
    vreinterpretq_s8_s64(vzip1q_s64(vreinterpretq_s64_s8(a), vreinterpretq_s64_s8(b)))
}

#[inline(always)]
unsafe fn zip_hi(a: int8x16_t, b: int8x16_t) -> int8x16_t {
    vreinterpretq_s8_s64(vzip2q_s64(vreinterpretq_s64_s8(a), vreinterpretq_s64_s8(b)))
}

/// Weight rows `w0` and `w1` of format `F` against `acts` (pairs of rows; an odd last row is
/// paired with itself): `out0[r]`, `out1[r]` their dots with row `r`. `P` pairs.
#[inline(always)]
unsafe fn pair32<F: Fmt32, const P: usize>(w0: &[u8], w1: &[u8], acts: &[&[BlockQ8]], out0: &mut [f32], out1: &mut [f32]) {
    let n = acts.len();
    let nb = blocks(w0, F::BYTES, acts).min(blocks(w1, F::BYTES, acts));
    let row = |r: usize| *acts.get_unchecked(r.min(n - 1));
    let mut acc = [vdupq_n_f32(0.0); P];
    for b in 0..nb {
        let (lo0, hi0, d0, m0) = F::weight(w0.as_ptr().add(b * F::BYTES));
        let (lo1, hi1, d1, m1) = F::weight(w1.as_ptr().add(b * F::BYTES));
        let wq = [zip_lo(lo0, lo1), zip_hi(lo0, lo1), zip_lo(hi0, hi1), zip_hi(hi0, hi1)];
        let dw = vcombine_f32(vdup_n_f32(d0), vdup_n_f32(d1));
        let mw = vcombine_f32(vdup_n_f32(m0), vdup_n_f32(m1));
        for (p, acc) in acc.iter_mut().enumerate() {
            let (a, c) = (row(2 * p).get_unchecked(b), row(2 * p + 1).get_unchecked(b));
            let (qa, qc) = (a.qs.as_ptr(), c.qs.as_ptr());
            let (a0, a1, c0, c1) = (vld1q_s8(qa), vld1q_s8(qa.add(16)), vld1q_s8(qc), vld1q_s8(qc.add(16)));
            let mut s = vdupq_n_s32(0);
            s = smmla(s, wq[0], zip_lo(a0, c0));
            s = smmla(s, wq[1], zip_hi(a0, c0));
            s = smmla(s, wq[2], zip_lo(a1, c1));
            s = smmla(s, wq[3], zip_hi(a1, c1));
            // [a.d, c.d] and [a.s, c.s], twice: the lanes are (w0, a), (w0, c), (w1, a), (w1, c).
            let (ds, cs) = (vld1_f32(a as *const BlockQ8 as *const f32), vld1_f32(c as *const BlockQ8 as *const f32));
            let (dd, ss) = (vzip1_f32(ds, cs), vzip2_f32(ds, cs));
            let t = vmulq_f32(vmulq_f32(dw, vcombine_f32(dd, dd)), vcvtq_f32_s32(s));
            let t = if F::HAS_M { vaddq_f32(t, vmulq_f32(mw, vcombine_f32(ss, ss))) } else { t };
            *acc = vaddq_f32(*acc, t);
        }
    }
    let mut lanes = [0f32; 4];
    for (p, acc) in acc.iter().enumerate() {
        vst1q_f32(lanes.as_mut_ptr(), *acc);
        for (k, r) in [2 * p, 2 * p + 1].into_iter().enumerate() {
            if r < n {
                out0[r] = lanes[k];
                out1[r] = lanes[2 + k];
            }
        }
    }
}

#[target_feature(enable = "dotprod,i8mm")]
unsafe fn pair_q8_i8mm(t: QType, w0: &[u8], w1: &[u8], acts: &[&[BlockQ8]], out0: &mut [f32], out1: &mut [f32]) -> bool {
    macro_rules! go {
        ($f:ty) => {
            if acts.len() <= 2 {
                pair32::<$f, 1>(w0, w1, acts, out0, out1)
            } else {
                pair32::<$f, 2>(w0, w1, acts, out0, out1)
            }
        };
    }
    by_format32!(t, go);
    true
}

/// Weight rows `w0` and `w1` of a 32-value format against 1..=[`MAX_ROWS`] activation rows
/// on `smmla`; false where the CPU lacks i8mm (or it is turned off), for other formats, or a
/// shape the kernel does not take.
pub fn pair_rows_q8(t: QType, w0: &[u8], w1: &[u8], acts: &[&[BlockQ8]], out0: &mut [f32], out1: &mut [f32]) -> bool {
    let n = acts.len();
    if n == 0 || n > MAX_ROWS || out0.len() < n || out1.len() < n || Level::detect() < Level::I8mm {
        return false;
    }
    // SAFETY: i8mm and dotprod are present; row and output counts checked above; the
    // blocks read are cut to every row's length (`blocks`).
    unsafe { pair_q8_i8mm(t, w0, w1, acts, out0, out1) }
}

/// Output columns `range` (weight rows) of a product with two or more activation rows of a
/// 32-value format, weight rows two at a time ([`pair_rows_q8`]; a last odd one on `sdot`);
/// false, with nothing written, where these kernels do not take the product.
pub(super) fn product_rows(t: QType, bytes: &[u8], rb: usize, acts: &QuantizedActs, out: &SendPtr, range: std::ops::Range<usize>, rows: usize) -> bool {
    if acts.k_quant || acts.m < 2 || t.k_quant() || Level::detect() < Level::I8mm {
        return false;
    }
    let m = acts.m;
    let (mut o0, mut o1) = ([0f32; MAX_ROWS], [0f32; MAX_ROWS]);
    let mut rs: [&[BlockQ8]; MAX_ROWS] = [&[]; MAX_ROWS];
    let mut j = range.start;
    while j < range.end {
        let pair = j + 1 < range.end;
        let w0 = &bytes[j * rb..(j + 1) * rb];
        let w1 = if pair { &bytes[(j + 1) * rb..(j + 2) * rb] } else { w0 };
        for i0 in (0..m).step_by(MAX_ROWS) {
            let g = (m - i0).min(MAX_ROWS);
            for (k, r) in rs.iter_mut().take(g).enumerate() {
                *r = acts.row_q8(i0 + k);
            }
            let done = if pair { pair_rows_q8(t, w0, w1, &rs[..g], &mut o0, &mut o1) } else { rows_q8_at(Level::Dotprod, t, w0, &rs[..g], &mut o0) };
            debug_assert!(done, "i8mm and dotprod were checked");
            for k in 0..g {
                // SAFETY: each chunk writes a disjoint range of output columns.
                unsafe {
                    *out.0.add((i0 + k) * rows + j) = o0[k];
                    if pair {
                        *out.0.add((i0 + k) * rows + j + 1) = o1[k];
                    }
                }
            }
        }
        j += if pair { 2 } else { 1 };
    }
    true
}
