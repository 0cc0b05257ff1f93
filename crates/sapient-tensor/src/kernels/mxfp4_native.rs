//! MXFP4 products read in place from ggml's blocks (a memory-mapped file's pages, which are
//! not repacked): sixteen (AVX-512) or eight (AVX2, AVX-VNNI) weight rows at a time, one per
//! 32-bit lane, as `mxfp4_lanes.rs` computes them, the lanes filled at each block by a
//! transpose of the rows' sixteen nibble bytes (four lines: line `q`, lane `n` holds bytes
//! `4q..4q + 4` of row `n`'s block, the packed layout's line) and a gather of their scale
//! bytes.
//!
//! Arithmetic, bit for bit that of the packed kernels and so of
//! [`dot_mxfp4_q8`](super::dot_mxfp4_q8) (ggml's generic dot product): per block the exact
//! integer sum, converted to f32, multiplied by `d_a · d_w/2` and added to the running sum,
//! block after block, with no fused multiply-add.
//!
//! Safety: the `unsafe` kernels require the features they are compiled for (checked at run
//! time by the dispatcher); `raw` holds `rows` rows of `nb` blocks.

#![allow(clippy::missing_safety_doc)]

use super::mxfp4_lanes::{half_scales16, half_scales8, run16, run8};
use super::quant::BlockQ8;
use super::MXFP4_BLOCK_BYTES;
use std::arch::x86_64::*;

/// The `N` rows from `first` of `raw` (rows of `rb` bytes; rows past the end repeat the last
/// one, their outputs are not written) and their distances from the first, for the gather
/// of their scale bytes.
#[inline(always)]
unsafe fn row_ptrs<const N: usize>(raw: &[u8], first: usize, rows: usize, rb: usize) -> ([*const u8; N], [i32; N]) {
    let rp: [*const u8; N] = std::array::from_fn(|n| raw.as_ptr().add((first + n).min(rows - 1) * rb));
    let dist: [i32; N] = std::array::from_fn(|n| (rp[n] as usize - rp[0] as usize) as i32);
    (rp, dist)
}

/// At every fourth block `b` (at byte `o` of each row), the rows' bytes 512 ahead into L1.
#[inline(always)]
unsafe fn prefetch_ahead(rp: &[*const u8], b: usize, o: usize) {
    if b.is_multiple_of(4) {
        for p in rp {
            _mm_prefetch::<_MM_HINT_T0>(p.add(o + 512) as *const i8);
        }
    }
}

/// `out[i * rows + r]` for the rows of groups of sixteen `groups` (each as two halves of
/// eight) and the activation rows `acts` (`nb` blocks each, `off` their offsets).
#[inline(always)]
unsafe fn run_impl<const VNNI: bool>(raw: &[u8], nb: usize, rows: usize, groups: std::ops::Range<usize>, acts: &[BlockQ8], off: &[i32], out: *mut f32) {
    let rb = nb * MXFP4_BLOCK_BYTES;
    let half = |first: usize| {
        let (rp, dist) = row_ptrs::<8>(raw, first, rows, rb);
        (rp, _mm256_loadu_si256(dist.as_ptr() as *const __m256i))
    };
    let block = |(rp, idx): &([*const u8; 8], __m256i), b: usize| {
        let o = b * MXFP4_BLOCK_BYTES;
        prefetch_ahead(rp, b, o);
        // Rows n and n + 4 in the two halves of register n.
        let y: [__m256i; 4] = std::array::from_fn(|n| _mm256_set_m128i(_mm_loadu_si128(rp[n + 4].add(o + 1) as *const __m128i), _mm_loadu_si128(rp[n].add(o + 1) as *const __m128i)));
        let (t0, t1) = (_mm256_unpacklo_epi32(y[0], y[1]), _mm256_unpacklo_epi32(y[2], y[3]));
        let (t2, t3) = (_mm256_unpackhi_epi32(y[0], y[1]), _mm256_unpackhi_epi32(y[2], y[3]));
        // Lanes 0..4 rows 0..4, lanes 4..8 rows 4..8: dwords 0, 1, 2, 3.
        let lines = [_mm256_unpacklo_epi64(t0, t1), _mm256_unpackhi_epi64(t0, t1), _mm256_unpacklo_epi64(t2, t3), _mm256_unpackhi_epi64(t2, t3)];
        let e = _mm256_and_si256(_mm256_i32gather_epi32::<1>(rp[0].add(o) as *const i32, *idx), _mm256_set1_epi32(0xff));
        (lines, half_scales8(e))
    };
    run8::<_, VNNI>(nb, rows, groups, acts, off, out, half, block)
}

#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn run_avx2(raw: &[u8], nb: usize, rows: usize, groups: std::ops::Range<usize>, acts: &[BlockQ8], off: &[i32], out: *mut f32) {
    run_impl::<false>(raw, nb, rows, groups, acts, off, out)
}

#[target_feature(enable = "avx2,fma,avxvnni")]
pub(super) unsafe fn run_avx_vnni(raw: &[u8], nb: usize, rows: usize, groups: std::ops::Range<usize>, acts: &[BlockQ8], off: &[i32], out: *mut f32) {
    run_impl::<true>(raw, nb, rows, groups, acts, off, out)
}

/// AVX-512: sixteen rows a group as the packed kernel computes them (`mxfp4_lanes::run16`),
/// each 128-bit lane `k` of the four transposed registers holding rows `4k..4k + 4`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
pub(super) unsafe fn run_avx512(raw: &[u8], nb: usize, rows: usize, groups: std::ops::Range<usize>, acts: &[BlockQ8], off: &[i32], out: *mut f32) {
    let rb = nb * MXFP4_BLOCK_BYTES;
    let group = |g: usize| {
        let (rp, dist) = row_ptrs::<16>(raw, g * 16, rows, rb);
        (rp, _mm512_loadu_si512(dist.as_ptr() as *const _))
    };
    let block = |(rp, idx): &([*const u8; 16], __m512i), b: usize| {
        let o = b * MXFP4_BLOCK_BYTES;
        prefetch_ahead(rp, b, o);
        let x = |n: usize| _mm_loadu_si128(rp[n].add(o + 1) as *const __m128i);
        let y: [__m512i; 4] = std::array::from_fn(|n| {
            let lo = _mm256_set_m128i(x(n + 4), x(n));
            let hi = _mm256_set_m128i(x(n + 12), x(n + 8));
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
        });
        let (t0, t1) = (_mm512_unpacklo_epi32(y[0], y[1]), _mm512_unpacklo_epi32(y[2], y[3]));
        let (t2, t3) = (_mm512_unpackhi_epi32(y[0], y[1]), _mm512_unpackhi_epi32(y[2], y[3]));
        let lines = [_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1), _mm512_unpacklo_epi64(t2, t3), _mm512_unpackhi_epi64(t2, t3)];
        let e = _mm512_and_si512(_mm512_i32gather_epi32::<1>(*idx, rp[0].add(o) as *const _), _mm512_set1_epi32(0xff));
        (lines, half_scales16(e))
    };
    run16(nb, rows, groups, acts, off, out, group, block)
}
