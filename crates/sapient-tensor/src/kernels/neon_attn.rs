//! ARM64 (aarch64) NEON kernels for the LLM's attention over its KV cache: the scores of
//! queries against keys of the f16 cache ([`scores_chunks`]) and of the 8-bit one
//! ([`scores_q8`]), the softmax ([`softmax`]) and the weighted sums of values ([`values`],
//! [`values_q8`]). Each does the portable code's operations in its order (`attention.rs`,
//! `attention_q8.rs`), lane by lane, so the results are its bits:
//!
//! - a key's score is a chain of fused multiply-adds (`fmla`) over the components, each of
//!   the 16 keys of a chunk in a lane of its own (four vectors), f16 widened exactly by `fcvtl`;
//! - the 8-bit cache's group sums are exact integers, by `sdot` with dotprod or widening
//!   multiplies without (`sum(k q)`, the keys' bias of 128 taken off each byte first, which
//!   is the portable `sum((k + 128) q) - 128 sum(q)`), then scaled and chained in f32 as there;
//! - the softmax's `e^x` is [`super::exp_approx`]'s f64 polynomial in two f64 lanes, its
//!   sum in sixteen lanes folded as [`super::attention`] folds them;
//! - a weighted sum is one fused multiply-add per output and value, in order of the values.
//!
//! `fcvtl` is written as inline assembly: its `std::arch` intrinsic needs the f16 type, which
//! is not stable yet.

use super::neon::{f16p, Dot, Sdot};
use std::arch::aarch64::*;
use std::arch::asm;

/// Four f16 (raw bits at `p`) to f32, exactly.
#[inline(always)]
unsafe fn f16x4(p: *const u16) -> float32x4_t {
    let h = vld1_u16(p);
    let o: float32x4_t;
    asm!("fcvtl {o:v}.4s, {h:v}.4h", o = lateout(vreg) o, h = in(vreg) h, options(pure, nomem, nostack, preserves_flags));
    o
}

/// `e^x` lane by lane as [`super::exp_approx`] computes it (in f64, rounded once to f32).
#[inline(always)]
unsafe fn exp2d(x: float64x2_t) -> float64x2_t {
    let x = vminq_f64(vmaxq_f64(x, vdupq_n_f64(-110.0)), vdupq_n_f64(100.0));
    let n = vrndnq_f64(vmulq_f64(x, vdupq_n_f64(std::f64::consts::LOG2_E)));
    let r = vfmaq_f64(x, n, vdupq_n_f64(-std::f64::consts::LN_2));
    let mut p = vdupq_n_f64(super::EXP_TAYLOR[0]);
    for c in &super::EXP_TAYLOR[1..] {
        p = vfmaq_f64(vdupq_n_f64(*c), p, r);
    }
    let e = vshlq_n_s64::<52>(vaddq_s64(vcvtq_s64_f64(n), vdupq_n_s64(1023)));
    vmulq_f64(p, vreinterpretq_f64_s64(e))
}

/// `e^x` in four f32 lanes (see [`exp2d`]).
#[inline(always)]
unsafe fn exp4(x: float32x4_t) -> float32x4_t {
    let lo = exp2d(vcvt_f64_f32(vget_low_f32(x)));
    let hi = exp2d(vcvt_high_f64_f32(x));
    vcvt_high_f32_f64(vcvt_f32_f64(lo), hi)
}

/// [`super::softmax_unnormalized`] on NEON: the exponentials in place, the inverse of their
/// sum, the portable bits.
pub fn softmax(sc: &mut [f32]) -> f32 {
    let n = sc.len();
    let p = sc.as_mut_ptr();
    let mut lanes = [0f32; 16];
    // SAFETY: every access is below `n`.
    unsafe {
        let mut m = vdupq_n_f32(f32::NEG_INFINITY);
        let mut i = 0;
        while i + 4 <= n {
            m = vmaxnmq_f32(m, vld1q_f32(p.add(i)));
            i += 4;
        }
        let max = sc[i..].iter().fold(vmaxnmvq_f32(m), |a, v| a.max(*v));
        let vmax = vdupq_n_f32(max);
        let mut acc = [vdupq_n_f32(0.0); 4];
        i = 0;
        while i + 16 <= n {
            for (k, a) in acc.iter_mut().enumerate() {
                let e = exp4(vsubq_f32(vld1q_f32(p.add(i + 4 * k)), vmax));
                vst1q_f32(p.add(i + 4 * k), e);
                *a = vaddq_f32(*a, e);
            }
            i += 16;
        }
        for (k, a) in acc.iter().enumerate() {
            vst1q_f32(lanes.as_mut_ptr().add(4 * k), *a);
        }
        for (j, v) in sc[i..].iter_mut().enumerate() {
            *v = super::exp_approx(*v - max);
            lanes[j] += *v;
        }
    }
    1.0 / super::attention::fold16(lanes)
}

/// [`super::scores_chunks`] for `Q` queries, `U` chunks of 16 keys (four vectors each) at a
/// time.
///
/// # Safety
/// The ranges [`super::scores_chunks`] checks: `hd` components of each query, keys at
/// `kc + bases[c] + d * pitch` (16 each, `d < hd`), outputs at `out + i * ostride + 16 c`.
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
pub unsafe fn scores_chunks<const Q: usize, const U: usize>(qs: [*const f32; Q], hd: usize, kc: *const u16, bases: &[usize], pitch: usize, scale: f32, out: *mut f32, ostride: usize) {
    let mut c = 0;
    while c < bases.len() {
        let u = (bases.len() - c).min(U);
        // A short last group repeats its last chunk (results not stored).
        let k: [*const u16; U] = std::array::from_fn(|x| kc.add(bases[c + x.min(u - 1)]));
        let mut acc = [[[vdupq_n_f32(0.0); 4]; U]; Q];
        for d in 0..hd {
            let kv: [[float32x4_t; 4]; U] = std::array::from_fn(|x| std::array::from_fn(|h| f16x4(k[x].add(d * pitch + 4 * h))));
            for i in 0..Q {
                let q = *qs[i].add(d);
                for x in 0..U {
                    for h in 0..4 {
                        acc[i][x][h] = vfmaq_n_f32(acc[i][x][h], kv[x][h], q);
                    }
                }
            }
        }
        for i in 0..Q {
            for x in 0..u {
                let o = out.add(i * ostride + 16 * (c + x));
                for h in 0..4 {
                    vst1q_f32(o.add(4 * h), vmulq_n_f32(acc[i][x][h], scale));
                }
            }
        }
        c += u;
    }
}

/// [`super::values_f16_runs`] for `R` rows: sixteen outputs of each row at a time in
/// registers over all the runs, then four at a time.
///
/// # Safety
/// The ranges [`super::values_f16_runs`] checks (`hd` a multiple of 4), `vc` already at the
/// head's offset; the rows are distinct and `hd` long.
pub unsafe fn values<const R: usize>(w: [*const f32; R], vc: *const u16, stride: usize, hd: usize, runs: &[(usize, usize)], ys: [*mut f32; R]) {
    let mut d0 = 0;
    while d0 + 16 <= hd {
        values_block::<R, 4>(w, vc.add(d0), stride, runs, ys.map(|y| y.add(d0)));
        d0 += 16;
    }
    while d0 < hd {
        values_block::<R, 1>(w, vc.add(d0), stride, runs, ys.map(|y| y.add(d0)));
        d0 += 4;
    }
}

/// `4 NB` outputs of `R` rows.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
unsafe fn values_block<const R: usize, const NB: usize>(w: [*const f32; R], vc: *const u16, stride: usize, runs: &[(usize, usize)], ys: [*mut f32; R]) {
    let mut acc: [[float32x4_t; NB]; R] = std::array::from_fn(|r| std::array::from_fn(|b| vld1q_f32(ys[r].add(4 * b))));
    let mut k = 0;
    for &(t0, n) in runs {
        for t in t0..t0 + n {
            let p = vc.add(t * stride);
            let x: [float32x4_t; NB] = std::array::from_fn(|b| f16x4(p.add(4 * b)));
            for r in 0..R {
                let a = *w[r].add(k + t - t0);
                for b in 0..NB {
                    acc[r][b] = vfmaq_n_f32(acc[r][b], x[b], a);
                }
            }
        }
        k += n;
    }
    for r in 0..R {
        for b in 0..NB {
            vst1q_f32(ys[r].add(4 * b), acc[r][b]);
        }
    }
}

/// Four keys' dot products of four bytes each: lane `j` gains `sum(a[4j..4j+4] b[4j..4j+4])`
/// (what one `sdot` does).
trait Quad {
    unsafe fn quad(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t;
}

/// `sdot`. Only callable from a function compiled with `dotprod`.
struct QuadSdot;
impl Quad for QuadSdot {
    #[inline(always)]
    unsafe fn quad(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
        Sdot::dot(acc, a, b)
    }
}

/// Plain NEON: products widened to i16, pairs to i32 (`saddlp`), pairs of those (`addp`).
struct QuadMull;
impl Quad for QuadMull {
    #[inline(always)]
    unsafe fn quad(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
        let lo = vpaddlq_s16(vmull_s8(vget_low_s8(a), vget_low_s8(b)));
        let hi = vpaddlq_s16(vmull_high_s8(a, b));
        vaddq_s32(acc, vpaddq_s32(lo, hi))
    }
}

/// One query of [`super::scores_chunks_q8`]: its int8 components and per group its scale.
#[derive(Clone, Copy)]
pub struct QueryRef<'a> {
    pub q: &'a [i8],
    pub d: &'a [f32],
}

/// The ranges [`super::scores_chunks_q8`] checks, `Q` queries of `ng` groups.
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
#[inline(always)]
unsafe fn scores_q8_with<D: Quad, const Q: usize>(qs: [QueryRef<'_>; Q], ng: usize, kc: *const u8, ks: *const u16, bases: &[usize], sbases: &[usize], pitch: usize, scale: f32, out: *mut f32, ostride: usize) {
    let bias = vdupq_n_u8(0x80);
    for (c, (&b, &sb)) in bases.iter().zip(sbases).enumerate() {
        let (k, kd) = (kc.add(b), ks.add(sb));
        let mut s = [[vdupq_n_f32(0.0); 4]; Q];
        for g in 0..ng {
            let mut acc = [[vdupq_n_s32(0); 4]; Q];
            for quad in g * 8..g * 8 + 8 {
                let kv: [int8x16_t; 4] = std::array::from_fn(|h| vreinterpretq_s8_u8(veorq_u8(vld1q_u8(k.add(quad * 4 * pitch + 16 * h)), bias)));
                for i in 0..Q {
                    let qb = vreinterpretq_s8_s32(vdupq_n_s32((qs[i].q.as_ptr().add(quad * 4) as *const i32).read_unaligned()));
                    for h in 0..4 {
                        acc[i][h] = D::quad(acc[i][h], kv[h], qb);
                    }
                }
            }
            let dk: [float32x4_t; 4] = std::array::from_fn(|h| f16x4(kd.add(g * pitch + 4 * h)));
            for i in 0..Q {
                let dq = *qs[i].d.get_unchecked(g);
                for h in 0..4 {
                    s[i][h] = vfmaq_f32(s[i][h], vcvtq_f32_s32(acc[i][h]), vmulq_n_f32(dk[h], dq));
                }
            }
        }
        for i in 0..Q {
            for h in 0..4 {
                vst1q_f32(out.add(i * ostride + 16 * c + 4 * h), vmulq_n_f32(s[i][h], scale));
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "dotprod")]
unsafe fn scores_q8_sdot<const Q: usize>(qs: [QueryRef<'_>; Q], ng: usize, kc: *const u8, ks: *const u16, bases: &[usize], sbases: &[usize], pitch: usize, scale: f32, out: *mut f32, ostride: usize) {
    scores_q8_with::<QuadSdot, Q>(qs, ng, kc, ks, bases, sbases, pitch, scale, out, ostride)
}

/// [`super::scores_chunks_q8`] for up to two queries at a time, with `sdot` where the CPU
/// has dotprod ([`super::has_dotprod`]).
///
/// # Safety
/// The ranges [`super::scores_chunks_q8`] checks; each query `ng * 32` components and `ng`
/// scales long.
#[allow(clippy::too_many_arguments)]
pub unsafe fn scores_q8(qs: &[QueryRef<'_>], ng: usize, kc: *const u8, ks: *const u16, bases: &[usize], sbases: &[usize], pitch: usize, scale: f32, out: *mut f32, ostride: usize) {
    let sdot = super::has_dotprod();
    for (p, pair) in qs.chunks(2).enumerate() {
        let o = out.add(2 * p * ostride);
        match (pair, sdot) {
            ([a, b], true) => scores_q8_sdot::<2>([*a, *b], ng, kc, ks, bases, sbases, pitch, scale, o, ostride),
            ([a, b], false) => scores_q8_with::<QuadMull, 2>([*a, *b], ng, kc, ks, bases, sbases, pitch, scale, o, ostride),
            (_, true) => scores_q8_sdot::<1>([pair[0]], ng, kc, ks, bases, sbases, pitch, scale, o, ostride),
            (_, false) => scores_q8_with::<QuadMull, 1>([pair[0]], ng, kc, ks, bases, sbases, pitch, scale, o, ostride),
        }
    }
}

/// [`super::values_q8`] for `R` rows: sixteen outputs (half a group) of each row at a time
/// in registers over all the values.
///
/// # Safety
/// The ranges [`super::values_q8`] checks (`hd` a multiple of 32), `vc` and `vs` already at
/// the head's offsets; the rows are distinct and `hd` long.
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
pub unsafe fn values_q8<const R: usize>(w: [*const f32; R], vc: *const i8, vs: *const u16, stride: usize, sstride: usize, hd: usize, t0: usize, t1: usize, ys: [*mut f32; R]) {
    for d0 in (0..hd).step_by(16) {
        let mut acc: [[float32x4_t; 4]; R] = std::array::from_fn(|r| std::array::from_fn(|b| vld1q_f32(ys[r].add(d0 + 4 * b))));
        for t in t0..t1 {
            let v = vld1q_s8(vc.add(t * stride + d0));
            let (lo, hi) = (vmovl_s8(vget_low_s8(v)), vmovl_high_s8(v));
            let x = [
                vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))),
                vcvtq_f32_s32(vmovl_high_s16(lo)),
                vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))),
                vcvtq_f32_s32(vmovl_high_s16(hi)),
            ];
            let ds = f16p(vs.add(t * sstride + d0 / 32) as *const u8);
            for r in 0..R {
                let a = *w[r].add(t - t0) * ds;
                for b in 0..4 {
                    acc[r][b] = vfmaq_n_f32(acc[r][b], x[b], a);
                }
            }
        }
        for r in 0..R {
            for b in 0..4 {
                vst1q_f32(ys[r].add(d0 + 4 * b), acc[r][b]);
            }
        }
    }
}
