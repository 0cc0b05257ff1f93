//! MXFP4 products on aarch64 with `sdot` (dotprod): the packed groups of sixteen rows of
//! `mxfp4_lanes.rs`, each line read as four registers of four rows. A 16-entry table lookup
//! (`tbl`) turns nibbles into the doubled E2M1 values (signed, no offset), one `sdot` with
//! four broadcast activation bytes advances four rows' dot products; per block the exact
//! integer sums, converted to f32, times `d_a · d_w/2`, added block after block: the
//! portable loop's roundings bit for bit.
//!
//! Safety: [`run_sdot`] requires the dotprod extension (checked by the dispatcher); the
//! packed bytes hold `groups` groups of `nb` blocks.

#![allow(clippy::missing_safety_doc)]

use super::mxfp4_lanes::{group_bytes, head};
use super::neon::{Dot, Sdot};
use super::quant::BlockQ8;
use std::arch::aarch64::*;

/// Activation rows one pass takes.
const PASS: usize = 4;

/// `out[i * rows + r]` for the rows of groups `groups` and the activation rows `acts` (`nb`
/// blocks each).
#[target_feature(enable = "dotprod")]
pub(super) unsafe fn run_sdot(packed: &[u8], nb: usize, rows: usize, groups: std::ops::Range<usize>, acts: &[BlockQ8], out: *mut f32) {
    let m = acts.len() / nb.max(1);
    let gb = group_bytes(nb);
    let table = vld1q_s8(super::mxfp4::KVALUES.as_ptr());
    let low = vdupq_n_u8(0x0f);
    for g in groups {
        let gp = packed.as_ptr().add(g * gb);
        for quad in 0..4 {
            let first = g * 16 + 4 * quad;
            if first >= rows {
                break;
            }
            let valid = (rows - first).min(4);
            let mut i0 = 0;
            while i0 < m {
                let np = (m - i0).min(PASS);
                let mut acc = [vdupq_n_f32(0.0); PASS];
                for b in 0..nb {
                    let lines = gp.add(head(nb) + b * 256 + 16 * quad);
                    let mut w = [vdupq_n_s8(0); 8];
                    for q in 0..4 {
                        let l = vld1q_u8(lines.add(64 * q));
                        w[q] = vqtbl1q_s8(table, vandq_u8(l, low));
                        w[4 + q] = vqtbl1q_s8(table, vshrq_n_u8::<4>(l));
                    }
                    let sc = gp.add(b * 16 + 4 * quad);
                    let e: [f32; 4] = std::array::from_fn(|n| super::e8m0_to_f32_half(*sc.add(n)));
                    let dw = vld1q_f32(e.as_ptr());
                    for p in 0..np {
                        let a = &acts[(i0 + p) * nb + b];
                        let qa = a.qs.as_ptr();
                        let mut s = vdupq_n_s32(0);
                        for (k, w) in w.iter().enumerate() {
                            let x = std::ptr::read_unaligned(qa.add(4 * (k % 4) + 16 * (k / 4)) as *const i32);
                            s = Sdot::dot(s, *w, vreinterpretq_s8_s32(vdupq_n_s32(x)));
                        }
                        let d = vmulq_f32(vdupq_n_f32(a.d), dw);
                        acc[p] = vaddq_f32(acc[p], vmulq_f32(d, vcvtq_f32_s32(s)));
                    }
                }
                for (p, acc) in acc.iter().enumerate().take(np) {
                    let mut v = [0f32; 4];
                    vst1q_f32(v.as_mut_ptr(), *acc);
                    std::ptr::copy_nonoverlapping(v.as_ptr(), out.add((i0 + p) * rows + first), valid);
                }
                i0 += np;
            }
        }
    }
}
