//! The AVX2 micro-kernels of the dense encoder products, for CPUs without AVX-512 (AMD Zen 2
//! and 3, Intel's laptop and desktop cores): the blocked f32 product of `dense_f32.rs` with
//! FMA, and the 16-bit integer product of `dense_i16.rs` with `vpmaddwd` + `vpaddd`, or
//! AVX-VNNI's `vpdpwssd` on ymm where it exists.
//!
//! Both take the AVX-512 kernels' packed weights and activations as they are and do, per
//! output, the same operations in the same order, so the results are bit-identical to the
//! AVX-512 kernels': each f32 output is one chain of fused multiply-adds over its inputs in
//! order; each integer block sum is exact, then converted, scaled and accumulated with the
//! same fused multiply-adds. With 16 ymm registers a tile is up to 6 rows by 16 columns
//! (half a panel of 32): 12 f32 accumulators (or 12 i32 block sums), two weight vectors and
//! a broadcast; a panel's two halves are two passes over the tile's activations, which stay
//! in L1.

use super::dense::Elem;
use super::dispatch::by_count;
use std::arch::x86_64::*;

/// Most activation rows of a tile.
pub const ROWS: usize = 6;
/// Columns of a weight panel (both layouts).
const COLS: usize = 32;
/// Inputs per activation scale of the integer products.
const BLOCK: usize = 32;

/// [`super::dense_f32`]'s product of one tile of up to [`ROWS`] rows (packed: value `t` of
/// row `r` at `x[t * rows + r]`) and one panel of `[k][32]` weights, to `out` (rows `ldo`
/// apart; `cols` of the 32 columns real).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f32_tile<E: Elem>(x: *const f32, k: usize, rows: usize, panel: &[E], cols: usize, bias: Option<&[f32]>, gelu: bool, out: *mut f32, ldo: usize) {
    debug_assert!((1..=ROWS).contains(&rows), "a tile of {rows} rows");
    macro_rules! go {
        ($r:literal) => {
            f32_tile_r::<E, $r>(x, k, panel.as_ptr(), cols, bias, gelu, out, ldo)
        };
    }
    by_count!(rows => go { 1, 2, 3, 4, 5; _ => 6 })
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn f32_tile_r<E: Elem, const R: usize>(x: *const f32, k: usize, w: *const E, cols: usize, bias: Option<&[f32]>, gelu: bool, out: *mut f32, ldo: usize) {
    for h in 0..cols.div_ceil(16) {
        let w = w.add(16 * h);
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        for t in 0..k {
            let (w0, w1) = E::load16(w.add(t * COLS));
            for (r, a) in acc.iter_mut().enumerate() {
                let v = _mm256_broadcast_ss(&*x.add(t * R + r));
                a[0] = _mm256_fmadd_ps(v, w0, a[0]);
                a[1] = _mm256_fmadd_ps(v, w1, a[1]);
            }
        }
        store_half(&acc, h, cols, bias, gelu, out, ldo);
    }
}

/// [`super::dense_i16`]'s product of one tile of up to [`ROWS`] rows of quantized
/// activations (pairs as i32 at `xq[b * 16 * rows + r * 16 + t]`, scales at
/// `xs[b * rows + r]`) and one panel of `[kp / 2][32][2]` integer weights with their column
/// scales `ws`, to `out` (rows `ldo` apart; `cols` of the 32 columns real). `vnni`: AVX-VNNI
/// is present.
#[allow(clippy::too_many_arguments)]
pub unsafe fn i16_tile(vnni: bool, xq: *const i32, xs: *const f32, kp: usize, rows: usize, w: &[i16], ws: &[f32], cols: usize, bias: Option<&[f32]>, gelu: bool, out: *mut f32, ldo: usize) {
    if vnni {
        i16_tile_vnni(xq, xs, kp, rows, w, ws, cols, bias, gelu, out, ldo)
    } else {
        i16_tile_avx2(xq, xs, kp, rows, w, ws, cols, bias, gelu, out, ldo)
    }
}

#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn i16_tile_avx2(xq: *const i32, xs: *const f32, kp: usize, rows: usize, w: &[i16], ws: &[f32], cols: usize, bias: Option<&[f32]>, gelu: bool, out: *mut f32, ldo: usize) {
    i16_tile_rows::<false>(xq, xs, kp, rows, w, ws, cols, bias, gelu, out, ldo)
}

#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn i16_tile_vnni(xq: *const i32, xs: *const f32, kp: usize, rows: usize, w: &[i16], ws: &[f32], cols: usize, bias: Option<&[f32]>, gelu: bool, out: *mut f32, ldo: usize) {
    i16_tile_rows::<true>(xq, xs, kp, rows, w, ws, cols, bias, gelu, out, ldo)
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn i16_tile_rows<const VNNI: bool>(xq: *const i32, xs: *const f32, kp: usize, rows: usize, w: &[i16], ws: &[f32], cols: usize, bias: Option<&[f32]>, gelu: bool, out: *mut f32, ldo: usize) {
    debug_assert!((1..=ROWS).contains(&rows), "a tile of {rows} rows");
    macro_rules! go {
        ($r:literal) => {
            i16_tile_r::<$r, VNNI>(xq, xs, kp, w.as_ptr(), ws.as_ptr(), cols, bias, gelu, out, ldo)
        };
    }
    by_count!(rows => go { 1, 2, 3, 4, 5; _ => 6 })
}

/// `acc + a · b` over pairs of 16-bit values into 32-bit lanes (exact: the callers' sums stay
/// within i32): AVX-VNNI's `vpdpwssd` itself when `VNNI` (LLVM would otherwise split it into
/// `vpmaddwd` + `vpaddd` for generic tuning), else those two.
#[inline(always)]
unsafe fn dpwssd<const VNNI: bool>(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
    if VNNI {
        vpdpwssd(acc, a, b)
    } else {
        _mm256_add_epi32(acc, _mm256_madd_epi16(a, b))
    }
}

#[inline]
#[target_feature(enable = "avx2,avxvnni")]
unsafe fn vpdpwssd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
    let mut r = acc;
    std::arch::asm!("{{vex}} vpdpwssd {r}, {a}, {b}", r = inout(ymm_reg) r, a = in(ymm_reg) a, b = in(ymm_reg) b, options(pure, nomem, nostack));
    r
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn i16_tile_r<const R: usize, const VNNI: bool>(xq: *const i32, xs: *const f32, kp: usize, w: *const i16, ws: *const f32, cols: usize, bias: Option<&[f32]>, gelu: bool, out: *mut f32, ldo: usize) {
    for h in 0..cols.div_ceil(16) {
        // Columns 16h.. of a pair step: 16 columns of two values.
        let w = w.add(32 * h);
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        for b in 0..kp / BLOCK {
            let (xb, wb) = (xq.add(b * BLOCK / 2 * R), w.add(b * BLOCK * COLS));
            let mut sum = [[_mm256_setzero_si256(); 2]; R];
            for t in 0..BLOCK / 2 {
                let wt = wb.add(t * 2 * COLS);
                let (w0, w1) = (_mm256_loadu_si256(wt as *const __m256i), _mm256_loadu_si256(wt.add(16) as *const __m256i));
                for (r, s) in sum.iter_mut().enumerate() {
                    let a = _mm256_set1_epi32(*xb.add(r * BLOCK / 2 + t));
                    s[0] = dpwssd::<VNNI>(s[0], a, w0);
                    s[1] = dpwssd::<VNNI>(s[1], a, w1);
                }
            }
            for (r, (a, s)) in acc.iter_mut().zip(&sum).enumerate() {
                let d = _mm256_set1_ps(*xs.add(b * R + r));
                a[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[0]), d, a[0]);
                a[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[1]), d, a[1]);
            }
        }
        let (s0, s1) = (_mm256_loadu_ps(ws.add(16 * h)), _mm256_loadu_ps(ws.add(16 * h + 8)));
        for a in acc.iter_mut() {
            a[0] = _mm256_mul_ps(a[0], s0);
            a[1] = _mm256_mul_ps(a[1], s1);
        }
        store_half(&acc, h, cols, bias, gelu, out, ldo);
    }
}

/// Half `h` of a tile's sums (`acc[r]`: columns `16h..16h + 16` of row `r`) plus the bias
/// (zero where there is none, as the AVX-512 store adds), GELU'd when `gelu`, to `out` (rows
/// `ldo` apart; `cols` of the panel's 32 columns real).
#[inline(always)]
unsafe fn store_half(acc: &[[__m256; 2]], h: usize, cols: usize, bias: Option<&[f32]>, gelu: bool, out: *mut f32, ldo: usize) {
    let c = (cols - 16 * h).min(16);
    let mut b = [0.0f32; 16];
    if let Some(bias) = bias {
        b[..c].copy_from_slice(&bias[16 * h..16 * h + c]);
    }
    let (b0, b1) = (_mm256_loadu_ps(b.as_ptr()), _mm256_loadu_ps(b.as_ptr().add(8)));
    let out = out.add(16 * h);
    if !gelu && c == 16 {
        for (r, a) in acc.iter().enumerate() {
            let o = out.add(r * ldo);
            _mm256_storeu_ps(o, _mm256_add_ps(a[0], b0));
            _mm256_storeu_ps(o.add(8), _mm256_add_ps(a[1], b1));
        }
        return;
    }
    // The tile through a buffer: GELU over it in one call, the real columns out.
    let mut v = [0.0f32; ROWS * 16];
    for (r, a) in acc.iter().enumerate() {
        _mm256_storeu_ps(v.as_mut_ptr().add(r * 16), _mm256_add_ps(a[0], b0));
        _mm256_storeu_ps(v.as_mut_ptr().add(r * 16 + 8), _mm256_add_ps(a[1], b1));
    }
    if gelu {
        super::gelu_erf_in_place(&mut v[..acc.len() * 16]);
    }
    for r in 0..acc.len() {
        std::ptr::copy_nonoverlapping(v.as_ptr().add(r * 16), out.add(r * ldo), c);
    }
}
