//! The exact k-quant kernels: Q4_K and Q6_K rows in the AMX kernels' arithmetic (per
//! superblock the exact integer sums, then fused multiply-adds), so that decode on machines
//! whose batches go through AMX gives bit for bit what the batches give.

use super::*;

/// Lane 0 and lane 8 of `x` + `y` arrangement: the sums of `a`'s and `b`'s 16 lanes.
#[inline(always)]
unsafe fn reduce2_epi32(a: __m512i, b: __m512i) -> (i32, i32) {
    // [a.lo256 + a.hi256 | b.lo256 + b.hi256]
    let t = _mm512_add_epi32(_mm512_shuffle_i64x2::<0x44>(a, b), _mm512_shuffle_i64x2::<0xEE>(a, b));
    let t = _mm512_add_epi32(t, _mm512_shuffle_i64x2::<0xB1>(t, t));
    let t = _mm512_add_epi32(t, _mm512_shuffle_epi32::<0x4E>(t));
    let t = _mm512_add_epi32(t, _mm512_shuffle_epi32::<0xB1>(t));
    (_mm512_cvtsi512_si32(t), _mm_cvtsi128_si32(_mm512_extracti32x4_epi32::<2>(t)))
}

/// One Q4_K superblock's integer sum of scaled products (16 lanes) and of mins x 32-value
/// sums (4 lanes).
#[inline(always)]
unsafe fn q4k_sb_ints(bw: *const u8, b: &BlockK) -> (__m512i, __m128i) {
    let ms = k4_scales_mins(bw.add(4));
    let [sumi] = q4k_sb_sums(bw, ms, [b]);
    (sumi, q4k_mins(ms, b))
}

/// One Q4_K weight row against one activation row in the AMX kernels' arithmetic: per
/// superblock the exact integer sums (scaled products, mins) and two fused multiply-adds,
/// `acc = fma(isum, dw * da, acc)`, `acc = fma(imin, -dmin * da, acc)`, so that the result
/// is bit-identical to `amx::product`'s for the same row in any batch. Superblocks go in
/// pairs to share the horizontal sums.
#[inline(always)]
unsafe fn q4k_row_x(w: &[u8], a: &[BlockK], pf: crate::kernels::Ahead) -> f32 {
    let p = w.as_ptr();
    let mut acc = 0f32;
    let mut i = 0;
    while i + 2 <= a.len() {
        let (b0, b1) = (&a[i], &a[i + 1]);
        let (bw0, bw1) = (p.add(i * 144), p.add((i + 1) * 144));
        pf.stream(bw0, 2 * 144);
        let (s0, m0) = q4k_sb_ints(bw0, b0);
        let (s1, m1) = q4k_sb_ints(bw1, b1);
        let (is0, is1) = reduce2_epi32(s0, s1);
        let (im0, im1) = reduce2_epi32x4(m0, m1);
        let (d0, n0) = q4k_d_dmin(bw0);
        let (d1, n1) = q4k_d_dmin(bw1);
        acc = q4k_fold(acc, is0, im0, d0, n0, b0.d);
        acc = q4k_fold(acc, is1, im1, d1, n1, b1.d);
        i += 2;
    }
    if i < a.len() {
        let b = &a[i];
        let bw = p.add(i * 144);
        pf.stream(bw, 144);
        let (s, m) = q4k_sb_ints(bw, b);
        let is = _mm512_reduce_add_epi32(s);
        let im = _mm512_reduce_add_epi32(_mm512_zextsi128_si512(m));
        let (d, n) = q4k_d_dmin(bw);
        acc = q4k_fold(acc, is, im, d, n, b.d);
    }
    acc
}

/// Like [`q4k_row_x`] for Q6_K: `acc = fma(isum, dw * da, acc)` per superblock.
#[inline(always)]
unsafe fn q6k_row_x(w: &[u8], a: &[BlockK], pf: crate::kernels::Ahead) -> f32 {
    let p = w.as_ptr();
    let mut acc = 0f32;
    let mut i = 0;
    while i + 2 <= a.len() {
        let (b0, b1) = (&a[i], &a[i + 1]);
        let (bw0, bw1) = (p.add(i * 210), p.add((i + 1) * 210));
        pf.stream(bw0, 2 * 210);
        let ([s0], [s1]) = (q6k_sb_sums(bw0, [b0]), q6k_sb_sums(bw1, [b1]));
        let (is0, is1) = reduce2_epi32(s0, s1);
        acc = (is0 as f32).mul_add(f16_bits(bw0.add(208)) * b0.d, acc);
        acc = (is1 as f32).mul_add(f16_bits(bw1.add(208)) * b1.d, acc);
        i += 2;
    }
    if i < a.len() {
        let b = &a[i];
        let bw = p.add(i * 210);
        pf.stream(bw, 210);
        let [s] = q6k_sb_sums(bw, [b]);
        let is = _mm512_reduce_add_epi32(s);
        acc = (is as f32).mul_add(f16_bits(bw.add(208)) * b.d, acc);
    }
    acc
}

/// [`q4k_row_x`] for one weight row against `R` activation rows: each output computed by
/// exactly the one-row arithmetic (so also equal to `amx::product`'s), the weights decoded
/// once for all rows.
#[inline(always)]
unsafe fn q4k_rows_x<const R: usize>(w: &[u8], acts: [&[BlockK]; R], out: &mut [f32]) {
    let p = w.as_ptr();
    let mut acc = [0f32; R];
    for i in 0..acts[0].len() {
        let bw = p.add(i * 144);
        let ms = k4_scales_mins(bw.add(4));
        let blocks = blocks_at(&acts, i);
        let sumi = q4k_sb_sums(bw, ms, blocks);
        let (d, dmin) = q4k_d_dmin(bw);
        let mut r = 0;
        while r < R {
            let b0 = blocks[r];
            let m0 = q4k_mins(ms, b0);
            if r + 1 < R {
                let b1 = blocks[r + 1];
                let m1 = q4k_mins(ms, b1);
                let (is0, is1) = reduce2_epi32(sumi[r], sumi[r + 1]);
                let (im0, im1) = reduce2_epi32x4(m0, m1);
                acc[r] = q4k_fold(acc[r], is0, im0, d, dmin, b0.d);
                acc[r + 1] = q4k_fold(acc[r + 1], is1, im1, d, dmin, b1.d);
                r += 2;
            } else {
                let is = _mm512_reduce_add_epi32(sumi[r]);
                let im = _mm512_reduce_add_epi32(_mm512_zextsi128_si512(m0));
                acc[r] = q4k_fold(acc[r], is, im, d, dmin, b0.d);
                r += 1;
            }
        }
    }
    out[..R].copy_from_slice(&acc);
}

/// [`q6k_row_x`] for `R` activation rows (see [`q4k_rows_x`]).
#[inline(always)]
unsafe fn q6k_rows_x<const R: usize>(w: &[u8], acts: [&[BlockK]; R], out: &mut [f32]) {
    let p = w.as_ptr();
    let mut acc = [0f32; R];
    for i in 0..acts[0].len() {
        let bw = p.add(i * 210);
        let blocks = blocks_at(&acts, i);
        let sumi = q6k_sb_sums(bw, blocks);
        let dw = f16_bits(bw.add(208));
        let mut r = 0;
        while r < R {
            if r + 1 < R {
                let (is0, is1) = reduce2_epi32(sumi[r], sumi[r + 1]);
                acc[r] = (is0 as f32).mul_add(dw * blocks[r].d, acc[r]);
                acc[r + 1] = (is1 as f32).mul_add(dw * blocks[r + 1].d, acc[r + 1]);
                r += 2;
            } else {
                let is = _mm512_reduce_add_epi32(sumi[r]);
                acc[r] = (is as f32).mul_add(dw * blocks[r].d, acc[r]);
                r += 1;
            }
        }
    }
    out[..R].copy_from_slice(&acc);
}

/// One Q4_K weight row against 1..=8 activation rows, [`q4k_rows_x`]'s exact arithmetic.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn rows_q4k_x(w: &[u8], acts: &[&[BlockK]], out: &mut [f32]) {
    by_rows!(q4k_rows_x, [], w, acts, out)
}

/// One Q6_K weight row against 1..=8 activation rows, [`q6k_rows_x`]'s exact arithmetic.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn rows_q6k_x(w: &[u8], acts: &[&[BlockK]], out: &mut [f32]) {
    by_rows!(q6k_rows_x, [], w, acts, out)
}

/// Weight rows `r0..r1` against one activation row with [`q4k_row_x`] / [`q6k_row_x`]:
/// decode on machines whose batches go through the AMX kernels.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn range_k_x(q6: bool, w: &[u8], rb: usize, r0: usize, r1: usize, act: &[BlockK], out: *mut f32, pf: crate::kernels::Ahead) {
    debug_assert!(w.len() >= r1 * rb);
    let p = w.as_ptr();
    for j in r0..r1 {
        let row = std::slice::from_raw_parts(p.add(j * rb), rb);
        *out.add(j) = if q6 { q6k_row_x(row, act, pf) } else { q4k_row_x(row, act, pf) };
    }
}
