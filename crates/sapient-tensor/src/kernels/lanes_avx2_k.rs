//! AVX2 and AVX-VNNI kernels for Q4_K and Q6_K on the k-quant lane kernels' packed layout
//! (`lanes_k.rs`), for machines without AVX-512: the same sixteen weight rows a group, taken
//! as two halves of eight, one row per 32-bit lane of a 256-bit register.
//!
//! A packed superblock's line `q` holds, for row `n`, dword `q` of the row's GGML superblock
//! at byte `64q + 4n`: its low 32 bytes are rows 0..8 and its high 32 bytes rows 8..16, so
//! each half loads its registers straight from the layout the AVX-512 kernels read (a line of
//! Q4_K nibbles is values `4k..4k + 4` of two 32-value sub-blocks; Q6_K's values come from a
//! line of low nibbles and one of high bits). With AVX-VNNI one `vpdpbusd` with four broadcast
//! activation bytes advances eight dot products by four values and each sub-block's sum is
//! multiplied by its scale (`vpmulld`), as on AVX-512; without it `vpmaddubsw` makes 16-bit
//! pair sums, added in 16 bits as far as they cannot overflow (a Q4_K sub-block's sixteen
//! 4-bit products a lane, two pairs of Q6_K's 6-bit ones), and one `vpmaddwd` with the scale
//! in both 16-bit halves widens them and multiplies by the scale at once. Q6_K's offset (its
//! values are stored as `q + 32`) is `-32 · Σ a` per sub-block: added before the scale with
//! AVX-VNNI, as `-32 · Σ_j sc_j · Σ a_j` (`vpmaddwd` on pairs of scales and activation sums)
//! once per superblock without. Q4_K's minimums are `Σ_j m_j · Σ a_j` by `vpmaddwd` on pairs.
//!
//! Arithmetic: that of the AVX-512 k-quant lane kernels ([`super::lanes_k::reference`]), bit
//! for bit, whichever level and number of activation rows: each superblock's integer sums are
//! exact (every route above gives the same integers), then `acc = fma(isum, d_w · d_a, acc)`
//! and for Q4_K `acc = fma(imin, -dmin_w · d_a, acc)`, superblock after superblock. So a batch
//! is bit-identical to its rows one at a time, and a model gives the same outputs on AVX2,
//! AVX-VNNI and AVX-512 machines without AMX.
//!
//! Safety: every function requires AVX2, FMA and F16C (AVX-VNNI too for `VNNI = true`),
//! checked at run time by the dispatcher ([`super::has_lanes_avx2`], [`super::has_vnni`]);
//! the packed weights hold the activations' width.

#![allow(clippy::missing_safety_doc, clippy::needless_range_loop, clippy::too_many_arguments)]

use super::dispatch::by_count;
use super::lanes::{passes, prefetch_l2, Packed};
use super::lanes_avx2::store;
use super::lanes_k::{ahead, dwords, head, SIDE};
use super::quant::{BlockQ8K, QType};
use std::arch::x86_64::*;

/// Activation rows one pass takes.
const PASS: usize = 8;
/// Activation rows a pass over the weight rows takes (they stay in L2 meanwhile).
const M_BLOCK: usize = 64;

#[inline(always)]
unsafe fn ld(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

/// Four activation bytes at `p`, broadcast.
#[inline(always)]
unsafe fn bcast(p: *const i8) -> __m256i {
    _mm256_set1_epi32(std::ptr::read_unaligned(p as *const i32))
}

/// Per lane, the exact sum of registers `w[k]` times activation bytes `qa[4k..4k + 4]`
/// (`k < N`), times the lane's scale: `sc` as i32 with AVX-VNNI, as the same i16 in both
/// halves of the lane without. The 16-bit sums of `vpmaddubsw` are added `group` at a time
/// (as many as stay within 16 bits).
#[inline(always)]
unsafe fn dot_scaled<const VNNI: bool, const N: usize>(w: &[__m256i], qa: *const i8, init: __m256i, sc: __m256i, group: usize) -> __m256i {
    if VNNI {
        let mut t = init;
        for k in 0..N {
            t = _mm256_dpbusd_avx_epi32(t, w[k], bcast(qa.add(4 * k)));
        }
        return _mm256_mullo_epi32(t, sc);
    }
    let mut s = _mm256_setzero_si256();
    let mut k = 0;
    while k < N {
        let mut p = _mm256_maddubs_epi16(w[k], bcast(qa.add(4 * k)));
        for i in k + 1..k + group {
            p = _mm256_add_epi16(p, _mm256_maddubs_epi16(w[i], bcast(qa.add(4 * i))));
        }
        s = _mm256_add_epi32(s, _mm256_madd_epi16(p, sc));
        k += group;
    }
    s
}

/// Byte `b` of each lane of `x` (scales 0..63, unsigned): as i32, or with `VNNI = false` as
/// i16 in both halves of the lane.
#[inline(always)]
unsafe fn scale_u8<const VNNI: bool>(x: __m256i, b: usize) -> __m256i {
    let s = _mm256_and_si256(_mm256_srlv_epi32(x, _mm256_set1_epi32(8 * b as i32)), _mm256_set1_epi32(0xff));
    if VNNI {
        s
    } else {
        _mm256_or_si256(s, _mm256_slli_epi32::<16>(s))
    }
}

/// Byte `b` of each lane of `x` (signed scales): as i32, or with `VNNI = false` as i16 in
/// both halves of the lane.
#[inline(always)]
unsafe fn scale_i8<const VNNI: bool>(x: __m256i, b: usize) -> __m256i {
    if VNNI {
        return _mm256_srai_epi32::<24>(_mm256_sllv_epi32(x, _mm256_set1_epi32(24 - 8 * b as i32)));
    }
    // Byte b to the high byte of both 16-bit halves, then shifted down with its sign (the
    // control is a constant plus b, not built byte by byte where b is not known at compile
    // time; its low bytes keep the high bit that zeroes them).
    let z = -128i8;
    let base = _mm256_setr_epi8(z, 0, z, 0, z, 4, z, 4, z, 8, z, 8, z, 12, z, 12, z, 0, z, 0, z, 4, z, 4, z, 8, z, 8, z, 12, z, 12);
    let ctl = _mm256_add_epi8(base, _mm256_set1_epi8(b as i8));
    _mm256_srai_epi16::<8>(_mm256_shuffle_epi8(x, ctl))
}

/// Two i16 of `v` as the halves of an i32, broadcast.
#[inline(always)]
unsafe fn pair16(v: &[i16; 16], lo: usize, hi: usize) -> __m256i {
    _mm256_set1_epi32((v[lo] as u16 as u32 | (v[hi] as u16 as u32) << 16) as i32)
}

/// Sixteen Q4_K weight rows (the group at `gp`, `nsb` superblocks; `nvalid` of them real)
/// against `R` activation rows (`acts`: each row's superblocks, `side`: its
/// [`side`](super::lanes_k::side) data). `dist`, `l1d`: bytes ahead to prefetch into L2 and
/// L1 (0: none).
#[inline(always)]
unsafe fn group_q4k<const VNNI: bool, const R: usize>(gp: *const u8, nsb: usize, nvalid: usize, acts: [*const BlockQ8K; R], side: [*const i32; R], outs: [*mut f32; R], dist: usize, l1d: usize) {
    const SB: usize = 64 * dwords(false);
    let m4 = _mm256_set1_epi8(0x0f);
    let pairs = _mm256_set1_epi32(0x00ff_00ff);
    let (k1, k2, k3) = (_mm256_set1_epi32(0x3f3f_3f3f), _mm256_set1_epi32(0x0f0f_0f0f), _mm256_set1_epi32(0x0303_0303));
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    for s in 0..nsb {
        let base = gp.add(s * SB);
        for h in 0..2 {
            let line = |q: usize| base.add(64 * q + 32 * h);
            // d and dmin of the eight rows: the low and high f16 of each lane of line 0.
            let hdr = ld(line(0));
            let dd = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi32(_mm256_and_si256(hdr, _mm256_set1_epi32(0xffff)), _mm256_srli_epi32::<16>(hdr)));
            let dw = _mm256_cvtph_ps(_mm256_castsi256_si128(dd));
            let dmin = _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(dd));
            // The 6-bit scales and minimums, as GGML's `get_scale_min_k4`.
            let (u0, u1, u2) = (ld(line(1)), ld(line(2)), ld(line(3)));
            let sc = [_mm256_and_si256(u0, k1), _mm256_or_si256(_mm256_and_si256(u2, k2), _mm256_slli_epi32::<4>(_mm256_and_si256(_mm256_srli_epi32::<6>(u0), k3)))];
            let mn_lo = _mm256_and_si256(u1, k1);
            let mn_hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32::<4>(u2), k2), _mm256_slli_epi32::<4>(_mm256_and_si256(_mm256_srli_epi32::<6>(u1), k3)));
            // i16 pairs (m0, m2), (m1, m3), (m4, m6), (m5, m7), as the side data's sums.
            let mp = [
                _mm256_and_si256(mn_lo, pairs),
                _mm256_and_si256(_mm256_srli_epi32::<8>(mn_lo), pairs),
                _mm256_and_si256(mn_hi, pairs),
                _mm256_and_si256(_mm256_srli_epi32::<8>(mn_hi), pairs),
            ];
            let mut isum = [_mm256_setzero_si256(); R];
            for j in 0..8 {
                if h == 0 {
                    // This superblock's lines ahead, an eighth at a time.
                    ahead(base.add(320 * j), 320, dist, l1d);
                }
                let scj = scale_u8::<VNNI>(sc[j / 4], j % 4);
                let at = 4 + 8 * (j / 2);
                let mut w = [_mm256_setzero_si256(); 8];
                for k in 0..8 {
                    let u = ld(line(at + k));
                    w[k] = if j % 2 == 0 { _mm256_and_si256(u, m4) } else { _mm256_and_si256(_mm256_srli_epi16::<4>(u), m4) };
                }
                for r in 0..R {
                    let qa = (*acts[r].add(s)).qs.as_ptr().add(32 * j);
                    // 16-bit sums of sixteen 4-bit products: at most 16 · 15 · 128.
                    isum[r] = _mm256_add_epi32(isum[r], dot_scaled::<VNNI, 8>(&w, qa, _mm256_setzero_si256(), scj, 8));
                }
            }
            for r in 0..R {
                let sd = side[r].add(SIDE * s);
                let mut im = _mm256_setzero_si256();
                for p in 0..4 {
                    im = _mm256_add_epi32(im, _mm256_madd_epi16(mp[p], _mm256_set1_epi32(*sd.add(p))));
                }
                let da = _mm256_set1_ps((*acts[r].add(s)).d);
                acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_mul_ps(dw, da), acc[r][h]);
                acc[r][h] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(im), _mm256_mul_ps(dmin, da), acc[r][h]);
            }
        }
    }
    for r in 0..R {
        store(acc[r][0], acc[r][1], nvalid, outs[r]);
    }
}

/// [`group_q4k`] for Q6_K.
#[inline(always)]
unsafe fn group_q6k<const VNNI: bool, const R: usize>(gp: *const u8, nsb: usize, nvalid: usize, acts: [*const BlockQ8K; R], side: [*const i32; R], outs: [*mut f32; R], dist: usize, l1d: usize) {
    const SB: usize = 64 * dwords(true);
    let m4 = _mm256_set1_epi8(0x0f);
    let m30 = _mm256_set1_epi8(0x30);
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    let sbs = gp.add(head(true, nsb));
    for s in 0..nsb {
        let base = sbs.add(s * SB);
        for h in 0..2 {
            let line = |q: usize| base.add(64 * q + 32 * h);
            let dw = _mm256_cvtph_ps(_mm_loadu_si128(gp.add(32 * s + 16 * h) as *const __m128i));
            let scr = [ld(line(48)), ld(line(49)), ld(line(50)), ld(line(51))];
            let mut isum = [_mm256_setzero_si256(); R];
            for hh in 0..2 {
                for t in 0..4 {
                    if h == 0 {
                        ahead(base.add(448 * (4 * hh + t)), 448, dist, l1d);
                    }
                    // Values 128hh + 32t + 4k + i: low four bits from a nibble of the ql
                    // bytes, the high two from bits 2t, 2t + 1 of the qh bytes.
                    // (Loops, not closures: a closure not inlined would lose the target
                    // features, and every intrinsic in it would become a call.)
                    let mut w = [_mm256_setzero_si256(); 8];
                    for k in 0..8 {
                        let ql = ld(line(16 * hh + 8 * (t & 1) + k));
                        let nib = if t >= 2 { _mm256_and_si256(_mm256_srli_epi16::<4>(ql), m4) } else { _mm256_and_si256(ql, m4) };
                        let qh = ld(line(32 + 8 * hh + k));
                        let hb = match t {
                            0 => _mm256_slli_epi16::<4>(qh),
                            1 => _mm256_slli_epi16::<2>(qh),
                            2 => qh,
                            _ => _mm256_srli_epi16::<2>(qh),
                        };
                        w[k] = _mm256_or_si256(nib, _mm256_and_si256(hb, m30));
                    }
                    for sub in 0..2 {
                        let j = 8 * hh + 2 * t + sub;
                        let scj = scale_i8::<VNNI>(scr[j / 4], j % 4);
                        for r in 0..R {
                            let qa = (*acts[r].add(s)).qs.as_ptr().add(16 * j);
                            // With AVX-VNNI the offset's `-32 · Σ a` starts the sum; 16-bit
                            // sums of four 6-bit products otherwise: at most 4 · 63 · 128.
                            let init = if VNNI { _mm256_set1_epi32(*side[r].add(SIDE * s + j)) } else { _mm256_setzero_si256() };
                            isum[r] = _mm256_add_epi32(isum[r], dot_scaled::<VNNI, 4>(&w[4 * sub..], qa, init, scj, 2));
                        }
                    }
                }
            }
            if !VNNI {
                // The offset: -32 · Σ_j sc_j · Σ a_j, on i16 pairs of scales (j, j + 2) and
                // of the activations' 16-value sums.
                let (mut lo, mut hi) = ([_mm256_setzero_si256(); 4], [_mm256_setzero_si256(); 4]);
                for q in 0..4 {
                    lo[q] = _mm256_srai_epi16::<8>(_mm256_slli_epi16::<8>(scr[q]));
                    hi[q] = _mm256_srai_epi16::<8>(scr[q]);
                }
                for r in 0..R {
                    let bs = &(*acts[r].add(s)).bsums;
                    let mut o = _mm256_setzero_si256();
                    for q in 0..4 {
                        o = _mm256_add_epi32(o, _mm256_madd_epi16(lo[q], pair16(bs, 4 * q, 4 * q + 2)));
                        o = _mm256_add_epi32(o, _mm256_madd_epi16(hi[q], pair16(bs, 4 * q + 1, 4 * q + 3)));
                    }
                    isum[r] = _mm256_sub_epi32(isum[r], _mm256_slli_epi32::<5>(o));
                }
            }
            for r in 0..R {
                let da = _mm256_set1_ps((*acts[r].add(s)).d);
                acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_mul_ps(dw, da), acc[r][h]);
            }
        }
    }
    for r in 0..R {
        store(acc[r][0], acc[r][1], nvalid, outs[r]);
    }
}

/// Output columns `r0..r1` (`r0` a multiple of 16) of the product of packed Q4_K or Q6_K
/// weights `w` (`q6`: Q6_K; groups of `gb` bytes) with `m` activation rows, into
/// `out[i * out_stride + j]`.
#[inline(always)]
unsafe fn range_of<const VNNI: bool>(q6: bool, w: &[u8], gb: usize, r0: usize, r1: usize, acts: &[BlockQ8K], side: &[i32], m: usize, out: *mut f32, out_stride: usize) {
    debug_assert!(w.len() >= r1.div_ceil(16) * gb && r0.is_multiple_of(16));
    let nsb = acts.len() / m.max(1);
    debug_assert_eq!(side.len(), acts.len() * SIDE);
    let p = w.as_ptr();
    // The row kernels' prefetch distances, as the AVX-512 k-quant lane kernels take them.
    let (dist, l1d) = (super::options().prefetch_l2, super::options().prefetch_l1);
    prefetch_l2(p.add(r0 / 16 * gb), dist.min((r1 - r0).div_ceil(16) * gb));
    passes!(@ BlockQ8K, SIDE, PASS, r0, r1, m, nsb, acts, side, out, out_stride, |g, nvalid, r, ap, sp, op, first_pass| {
        let (d, d1) = if first_pass { (dist, l1d) } else { (0, 0) };
        let gp = p.add(g / 16 * gb);
        macro_rules! go {
            ($n:literal) => {{
                let (a, c, o) = (std::array::from_fn(|i| ap[i]), std::array::from_fn(|i| sp[i]), std::array::from_fn(|i| op[i]));
                if q6 {
                    group_q6k::<VNNI, $n>(gp, nsb, nvalid, a, c, o, d, d1)
                } else {
                    group_q4k::<VNNI, $n>(gp, nsb, nvalid, a, c, o, d, d1)
                }
            }};
        }
        by_count!(r => go { 1, 2, 3, 4, 5, 6, 7; _ => 8 })
    });
}

#[inline(never)]
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn range_vnni(q6: bool, w: &[u8], gb: usize, r0: usize, r1: usize, acts: &[BlockQ8K], side: &[i32], m: usize, out: *mut f32, out_stride: usize) {
    range_of::<true>(q6, w, gb, r0, r1, acts, side, m, out, out_stride)
}

#[inline(never)]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn range_avx2(q6: bool, w: &[u8], gb: usize, r0: usize, r1: usize, acts: &[BlockQ8K], side: &[i32], m: usize, out: *mut f32, out_stride: usize) {
    range_of::<false>(q6, w, gb, r0, r1, acts, side, m, out, out_stride)
}

/// Output columns (weight rows) `r0..r1` (`r0` a multiple of 16) of the product of packed
/// Q4_K or Q6_K weights `p` with `m` activation rows (`acts`: `m` rows of superblocks;
/// `side`: their [`side`](super::lanes_k::side) data), into `out[i * out_stride + j]`; with
/// `vnni`, on AVX-VNNI.
pub unsafe fn range_packed(vnni: bool, p: &Packed, r0: usize, r1: usize, acts: &[BlockQ8K], side: &[i32], m: usize, out: *mut f32, out_stride: usize) {
    let (w, gb, q6) = (p.bytes(), p.group_bytes(), p.qtype() == QType::Q6K);
    debug_assert!(matches!(p.qtype(), QType::Q4K | QType::Q6K));
    if vnni {
        range_vnni(q6, w, gb, r0, r1, acts, side, m, out, out_stride)
    } else {
        range_avx2(q6, w, gb, r0, r1, acts, side, m, out, out_stride)
    }
}
