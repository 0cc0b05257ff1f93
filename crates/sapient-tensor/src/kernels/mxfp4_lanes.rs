//! MXFP4 products sixteen weight rows at a time, one per 32-bit lane (AVX-512 VNNI, AVX2
//! and AVX-VNNI; `neon_mxfp4.rs` reads the same layout on aarch64), in the style of `lanes.rs`.
//!
//! Layout ([`pack`], made at load): per group of sixteen rows, first the rows' E8M0 scale
//! bytes (sixteen per block, the group's blocks in order, rounded up to 64 bytes), then per
//! block four lines of 64 bytes: line `q`, lane `n` holds bytes `4q..4q + 4` of row `n`'s
//! sixteen nibble bytes. The low nibbles of a line are values `4q..4q + 4` of the block, the
//! high nibbles values `16 + 4q..16 + 4q + 4`; one 16-entry byte shuffle turns them into
//! E2M1 values doubled plus 12 (unsigned, 0..24), and one `vpdpbusd` with four broadcast
//! activation bytes advances sixteen dot products. The same bytes as ggml's blocks (rows
//! padded to a multiple of sixteen with zeros).
//!
//! Arithmetic, bit for bit that of [`dot_mxfp4_q8`](super::dot_mxfp4_q8) (ggml's generic
//! dot product) for every output and every number of activation rows: per block the exact
//! integer sum (the offset of 12 taken back as `12 · Σ a`), converted to f32, multiplied by
//! `d_a · d_w/2` (one rounding) and added to the running sum (another), block after block.
//! No fused multiply-add, so the roundings are the portable loop's.
//!
//! Safety: the `unsafe` kernels require the features they are compiled for (checked at run
//! time by the dispatcher); the packed bytes hold `groups` groups of `nb` blocks.

#![allow(clippy::missing_safety_doc)]

use super::quant::BlockQ8;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// E2M1 values doubled (ggml's `kvalues_mxfp4`) plus 12: unsigned bytes for `vpdpbusd`.
#[cfg(target_arch = "x86_64")]
const KVALUES_U: [u8; 16] = [12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0];

/// Bytes of a group's scales (sixteen per block, rounded up to a 64-byte line).
pub(super) fn head(nb: usize) -> usize {
    (nb * 16).next_multiple_of(64)
}

/// Bytes of one group of sixteen rows of `nb` blocks.
pub(super) fn group_bytes(nb: usize) -> usize {
    head(nb) + nb * 256
}

/// Pack `rows` rows of ggml MXFP4 blocks (`raw`, `nb` blocks a row) into groups of sixteen.
pub(super) fn pack(raw: &[u8], rows: usize, nb: usize) -> Vec<u8> {
    let gb = group_bytes(nb);
    let mut out = vec![0u8; rows.div_ceil(16) * gb];
    let rb = nb * super::MXFP4_BLOCK_BYTES;
    for r in 0..rows {
        let (g, n) = (r / 16 * gb, r % 16);
        for b in 0..nb {
            let blk = &raw[r * rb + b * 17..r * rb + (b + 1) * 17];
            out[g + b * 16 + n] = blk[0];
            for q in 0..4 {
                let at = g + head(nb) + b * 256 + q * 64 + 4 * n;
                out[at..at + 4].copy_from_slice(&blk[1 + 4 * q..5 + 4 * q]);
            }
        }
    }
    out
}

/// Block `b` of row `n` of a packed group in ggml's layout.
pub(super) fn unpack_block(group: &[u8], nb: usize, n: usize, b: usize) -> [u8; 17] {
    let mut blk = [0u8; 17];
    blk[0] = group[b * 16 + n];
    for q in 0..4 {
        let at = head(nb) + b * 256 + q * 64 + 4 * n;
        blk[1 + 4 * q..5 + 4 * q].copy_from_slice(&group[at..at + 4]);
    }
    blk
}

/// `12 · Σ qs` of each activation block (the offset of [`KVALUES_U`] to take back).
#[cfg(target_arch = "x86_64")]
pub(super) fn offsets(acts: &[BlockQ8]) -> Vec<i32> {
    acts.iter().map(|a| 12 * a.qs.iter().map(|&q| q as i32).sum::<i32>()).collect()
}

/// Activation rows one pass takes (their accumulators stay in registers).
#[cfg(target_arch = "x86_64")]
const PASS: usize = 4;

/// Half the E8M0 scales of sixteen rows (bytes at `p`), as `e8m0_to_f32_half` gives them.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn scales16(p: *const u8) -> __m512 {
    half_scales16(_mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i)))
}

/// Half the E8M0 scales `e` (one byte value per lane), as `e8m0_to_f32_half` gives them.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) unsafe fn half_scales16(e: __m512i) -> __m512 {
    let small = _mm512_sllv_epi32(_mm512_set1_epi32(0x0020_0000), e);
    let big = _mm512_slli_epi32::<23>(_mm512_sub_epi32(e, _mm512_set1_epi32(1)));
    let lt2 = _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2));
    _mm512_castsi512_ps(_mm512_mask_blend_epi32(lt2, big, small))
}

/// AVX-512: `out[i * rows + r]` for the rows of groups `groups` and the activation rows
/// `acts` (`nb` blocks each, `off` their [`offsets`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
pub(super) unsafe fn run_avx512(packed: &[u8], nb: usize, rows: usize, groups: std::ops::Range<usize>, acts: &[BlockQ8], off: &[i32], out: *mut f32) {
    let gb = group_bytes(nb);
    let group = |g: usize| packed.as_ptr().add(g * gb);
    let block = |gp: &*const u8, b: usize| {
        let lines = gp.add(head(nb) + b * 256);
        _mm_prefetch::<_MM_HINT_T0>(lines.add(1024) as *const i8);
        let l: [__m512i; 4] = std::array::from_fn(|q| _mm512_loadu_si512(lines.add(64 * q) as *const _));
        (l, scales16(gp.add(b * 16)))
    };
    run16(nb, rows, groups, acts, off, out, group, block)
}

/// The AVX-512 products of groups of sixteen rows, each block's four lines (line `q`, lane
/// `n`: bytes `4q..4q + 4` of row `n`'s nibbles) and half scales given by `block(state, b)`
/// for the `state` that `group(g)` gives (the packed layout, or ggml's transposed as it goes).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn run16<S>(nb: usize, rows: usize, groups: std::ops::Range<usize>, acts: &[BlockQ8], off: &[i32], out: *mut f32, group: impl Fn(usize) -> S, block: impl Fn(&S, usize) -> ([__m512i; 4], __m512)) {
    let m = acts.len() / nb.max(1);
    let table = _mm512_broadcast_i32x4(_mm_loadu_si128(KVALUES_U.as_ptr() as *const __m128i));
    let low = _mm512_set1_epi8(0x0f);
    for g in groups {
        let state = group(g);
        let valid = (rows - g * 16).min(16);
        let mut i0 = 0;
        while i0 < m {
            let np = (m - i0).min(PASS);
            let mut acc = [_mm512_setzero_ps(); PASS];
            for b in 0..nb {
                let (lines, dw) = block(&state, b);
                let mut w = [_mm512_setzero_si512(); 8];
                for (q, l) in lines.iter().enumerate() {
                    w[q] = _mm512_shuffle_epi8(table, _mm512_and_si512(*l, low));
                    w[4 + q] = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16::<4>(*l), low));
                }
                for p in 0..np {
                    let a = &acts[(i0 + p) * nb + b];
                    let qa = a.qs.as_ptr();
                    let mut s = _mm512_set1_epi32(-off[(i0 + p) * nb + b]);
                    for (k, w) in w.iter().enumerate() {
                        s = _mm512_dpbusd_epi32(s, *w, _mm512_set1_epi32(std::ptr::read_unaligned(qa.add(4 * (k % 4) + 16 * (k / 4)) as *const i32)));
                    }
                    let d = _mm512_mul_ps(_mm512_set1_ps(a.d), dw);
                    acc[p] = _mm512_add_ps(acc[p], _mm512_mul_ps(d, _mm512_cvtepi32_ps(s)));
                }
            }
            for (p, acc) in acc.iter().enumerate().take(np) {
                let mut v = [0f32; 16];
                _mm512_storeu_ps(v.as_mut_ptr(), *acc);
                let o = out.add((i0 + p) * rows + g * 16);
                std::ptr::copy_nonoverlapping(v.as_ptr(), o, valid);
            }
            i0 += np;
        }
    }
}

/// Half the E8M0 scales of eight rows (bytes at `p`).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn scales8(p: *const u8) -> __m256 {
    half_scales8(_mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i)))
}

/// [`half_scales16`] for eight lanes.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) unsafe fn half_scales8(e: __m256i) -> __m256 {
    let small = _mm256_sllv_epi32(_mm256_set1_epi32(0x0020_0000), e);
    let big = _mm256_slli_epi32::<23>(_mm256_sub_epi32(e, _mm256_set1_epi32(1)));
    // e < 2 as unsigned: e is 0..255, so a signed compare is the same.
    let lt2 = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
    _mm256_castsi256_ps(_mm256_blendv_epi8(big, small, lt2))
}

/// Per lane, `Σ w[k] · a[k]` over eight registers of unsigned weights and the broadcast
/// activation dwords, plus `init`: one `vpdpbusd` each with AVX-VNNI, else `vpmaddubsw`
/// (at most 2 · 24 · 127 per 16-bit sum: no saturation) and `vpmaddwd`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn dot8<const VNNI: bool>(w: &[__m256i; 8], qa: *const i8, init: __m256i) -> __m256i {
    let a = |k: usize| _mm256_set1_epi32(std::ptr::read_unaligned(qa.add(4 * (k % 4) + 16 * (k / 4)) as *const i32));
    if VNNI {
        let mut s = init;
        for (k, w) in w.iter().enumerate() {
            s = _mm256_dpbusd_avx_epi32(s, *w, a(k));
        }
        return s;
    }
    // Two 16-bit products added per step stay within 16 bits (2 · 6096).
    let mut s = init;
    for k in (0..8).step_by(2) {
        let p = _mm256_add_epi16(_mm256_maddubs_epi16(w[k], a(k)), _mm256_maddubs_epi16(w[k + 1], a(k + 1)));
        s = _mm256_add_epi32(s, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
    }
    s
}

/// AVX2 (`VNNI`: AVX-VNNI): as [`run_avx512`], each group as two halves of eight rows.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn run_avx2_impl<const VNNI: bool>(packed: &[u8], nb: usize, rows: usize, groups: std::ops::Range<usize>, acts: &[BlockQ8], off: &[i32], out: *mut f32) {
    let gb = group_bytes(nb);
    // A half: its group's bytes and which half (0, 1) it is.
    let half = |first: usize| (packed.as_ptr().add(first / 16 * gb), first % 16 / 8);
    let block = |&(gp, h): &(*const u8, usize), b: usize| {
        let lines = gp.add(head(nb) + b * 256 + 32 * h);
        _mm_prefetch::<_MM_HINT_T0>(lines.add(1024) as *const i8);
        let l: [__m256i; 4] = std::array::from_fn(|q| _mm256_loadu_si256(lines.add(64 * q) as *const __m256i));
        (l, scales8(gp.add(b * 16 + 8 * h)))
    };
    run8::<_, VNNI>(nb, rows, groups, acts, off, out, half, block)
}

/// The AVX2 products of groups of sixteen rows as two halves of eight, each block's four
/// lines (line `q`, lane `n`: bytes `4q..4q + 4` of row `n`'s nibbles) and half scales given
/// by `block(state, b)` for the `state` that `half(first row)` gives (the packed layout, or
/// ggml's transposed as it goes).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn run8<S, const VNNI: bool>(nb: usize, rows: usize, groups: std::ops::Range<usize>, acts: &[BlockQ8], off: &[i32], out: *mut f32, half: impl Fn(usize) -> S, block: impl Fn(&S, usize) -> ([__m256i; 4], __m256)) {
    let m = acts.len() / nb.max(1);
    let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_U.as_ptr() as *const __m128i));
    let low = _mm256_set1_epi8(0x0f);
    for g in groups {
        for h in 0..2 {
            let first = g * 16 + 8 * h;
            if first >= rows {
                break;
            }
            let state = half(first);
            let valid = (rows - first).min(8);
            let mut i0 = 0;
            while i0 < m {
                let np = (m - i0).min(PASS);
                let mut acc = [_mm256_setzero_ps(); PASS];
                for b in 0..nb {
                    let (lines, dw) = block(&state, b);
                    let mut w = [_mm256_setzero_si256(); 8];
                    for (q, l) in lines.iter().enumerate() {
                        w[q] = _mm256_shuffle_epi8(table, _mm256_and_si256(*l, low));
                        w[4 + q] = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16::<4>(*l), low));
                    }
                    for p in 0..np {
                        let a = &acts[(i0 + p) * nb + b];
                        let s = dot8::<VNNI>(&w, a.qs.as_ptr(), _mm256_set1_epi32(-off[(i0 + p) * nb + b]));
                        let d = _mm256_mul_ps(_mm256_set1_ps(a.d), dw);
                        acc[p] = _mm256_add_ps(acc[p], _mm256_mul_ps(d, _mm256_cvtepi32_ps(s)));
                    }
                }
                for (p, acc) in acc.iter().enumerate().take(np) {
                    let mut v = [0f32; 8];
                    _mm256_storeu_ps(v.as_mut_ptr(), *acc);
                    std::ptr::copy_nonoverlapping(v.as_ptr(), out.add((i0 + p) * rows + first), valid);
                }
                i0 += np;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn run_avx2(packed: &[u8], nb: usize, rows: usize, groups: std::ops::Range<usize>, acts: &[BlockQ8], off: &[i32], out: *mut f32) {
    run_avx2_impl::<false>(packed, nb, rows, groups, acts, off, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avxvnni")]
pub(super) unsafe fn run_avx_vnni(packed: &[u8], nb: usize, rows: usize, groups: std::ops::Range<usize>, acts: &[BlockQ8], off: &[i32], out: *mut f32) {
    run_avx2_impl::<true>(packed, nb, rows, groups, acts, off, out)
}
