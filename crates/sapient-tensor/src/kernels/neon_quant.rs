//! ARM64 (aarch64) activation quantizers in plain NEON: the 8-bit blocks the quantized
//! products take ([`quantize_q8`], [`quantize_q8k`]) and the 8-bit KV cache's groups
//! ([`amax32`], [`round32`] for `attention_q8.rs`), each bit-identical to the portable code
//! (`quant.rs`, `attention_q8.rs`), so the products see the same blocks on every machine.
//!
//! The portable code's steps map onto single instructions with the same rounding: `f32::max`
//! of magnitudes is `fmaxnm` (NaNs ignored, the fold starts from 0), `round() as i32` is
//! `fcvtas` (to nearest, ties away from zero, saturating, NaN to 0), `round_ties_even() as
//! i8` after a clamp is `fcvtns` after `fmax`/`fmin`, and `as i8` of an i32 in range keeps its
//! low byte (`xtn`). The per-block scalars (scales, f16 roundings) are the portable code's.

use super::quant::{BlockQ8, BlockQ8K};
use std::arch::aarch64::*;

/// `max(0, max |x|)` over `N` vectors of four at `p`, NaNs ignored (the portable fold of
/// `f32::max` from 0).
#[inline(always)]
unsafe fn amax<const N: usize>(p: *const f32) -> f32 {
    let mut m = vdupq_n_f32(0.0);
    for k in 0..N {
        m = vmaxnmq_f32(m, vabsq_f32(vld1q_f32(p.add(4 * k))));
    }
    vmaxnmvq_f32(m)
}

/// Sixteen i32 values (each in i8 range, or wrapping as `as i8` does) to bytes in order.
#[inline(always)]
unsafe fn narrow16(r: [int32x4_t; 4]) -> int8x16_t {
    let lo = vcombine_s16(vmovn_s32(r[0]), vmovn_s32(r[1]));
    let hi = vcombine_s16(vmovn_s32(r[2]), vmovn_s32(r[3]));
    vcombine_s8(vmovn_s16(lo), vmovn_s16(hi))
}

/// `round(x * s)` (ties away from zero) for the sixteen values at `p`.
#[inline(always)]
unsafe fn round16(p: *const f32, s: f32) -> [int32x4_t; 4] {
    std::array::from_fn(|k| vcvtaq_s32_f32(vmulq_n_f32(vld1q_f32(p.add(4 * k)), s)))
}

/// [`super::quant::quantize_q8`] on NEON, bit-identical to it.
pub fn quantize_q8(x: &[f32], out: &mut [BlockQ8]) {
    for (chunk, b) in x.chunks_exact(32).zip(out.iter_mut()) {
        let p = chunk.as_ptr();
        // SAFETY: `chunk` holds 32 values; `b.qs` 32 bytes.
        unsafe {
            let d = amax::<8>(p) / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            let (r0, r1) = (round16(p, id), round16(p.add(16), id));
            let s = vaddq_s32(vaddq_s32(vaddq_s32(r0[0], r0[1]), vaddq_s32(r0[2], r0[3])), vaddq_s32(vaddq_s32(r1[0], r1[1]), vaddq_s32(r1[2], r1[3])));
            let sum = vaddvq_s32(s);
            vst1q_s8(b.qs.as_mut_ptr(), narrow16(r0));
            vst1q_s8(b.qs.as_mut_ptr().add(16), narrow16(r1));
            b.d = half::f16::from_f32(d).to_f32();
            b.s = half::f16::from_f32(sum as f32 * d).to_f32();
        }
    }
}

/// [`super::quant::quantize_q8k`] on NEON, bit-identical to it.
pub fn quantize_q8k(x: &[f32], out: &mut [BlockQ8K]) {
    for (chunk, b) in x.chunks_exact(256).zip(out.iter_mut()) {
        let p = chunk.as_ptr();
        // SAFETY: `chunk` holds 256 values; `b.qs` 256 bytes.
        unsafe {
            let amax = amax::<64>(p);
            if amax == 0.0 {
                *b = BlockQ8K::default();
                continue;
            }
            // The first value of largest magnitude, with its sign (as the portable quantizer).
            let max = chunk.iter().copied().find(|v| v.abs() == amax).unwrap_or(amax);
            let iscale = -128.0 / max;
            let top = vdupq_n_s32(127);
            for (k, s) in b.bsums.iter_mut().enumerate() {
                let r = round16(p.add(16 * k), iscale).map(|r| vminq_s32(r, top));
                let q = narrow16(r);
                *s = vaddlvq_s8(q);
                vst1q_s8(b.qs.as_mut_ptr().add(16 * k), q);
            }
            b.d = 1.0 / iscale;
        }
    }
}

/// `max |x|` over the 32 values at `x` (the 8-bit KV cache's groups).
///
/// # Safety
/// `x` must point to 32 readable values.
pub unsafe fn amax32(x: *const f32) -> f32 {
    amax::<8>(x)
}

/// `q = round(clamp(x * id, -127, 127))` (to nearest, ties to even) over the 32 values at
/// `x` into `q`; returns the sum of `q`.
///
/// # Safety
/// `x` must point to 32 readable values, `q` to 32 writable bytes.
pub unsafe fn round32(x: *const f32, id: f32, q: *mut i8) -> i32 {
    let (lo, hi) = (vdupq_n_f32(-127.0), vdupq_n_f32(127.0));
    let mut sum = vdupq_n_s32(0);
    for h in 0..2 {
        let r: [int32x4_t; 4] = std::array::from_fn(|k| {
            let v = vmulq_n_f32(vld1q_f32(x.add(16 * h + 4 * k)), id);
            vcvtnq_s32_f32(vminq_f32(vmaxq_f32(v, lo), hi))
        });
        sum = vaddq_s32(sum, vaddq_s32(vaddq_s32(r[0], r[1]), vaddq_s32(r[2], r[3])));
        vst1q_s8(q.add(16 * h), narrow16(r));
    }
    vaddvq_s32(sum)
}
