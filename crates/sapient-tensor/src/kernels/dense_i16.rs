//! Dense weights as 13-bit integers, multiplied by 14-bit activations with AVX512-VNNI's
//! `vpdpwssd` (32 multiply-adds of 16-bit pairs per instruction, twice the f32 FMA rate),
//! for encoders whose f32 or f16 weights run on CPUs without AMX-BF16.
//!
//! Each weight row (output column) is scaled to integers of at most 4095 in magnitude (one
//! f32 scale per row, rounded half away from zero); each activation row to at most 8191
//! per block of 32 inputs (one scale per block, rounded to nearest even), so an outlier
//! costs only its block's precision. A block's 32 products sum exactly in i32
//! (32 x 4095 x 8191 < 2^31); each block's sum is converted and multiplied by its
//! activation scale into f32 sums, which the weight scale multiplies at the end. The error
//! of a weight is at most half of 1/4095 of its row's largest, of an activation half of
//! 1/8191 of its block's largest: on the sentence embedders' test sentences the
//! similarities move by under 1e-4 from the f32 products (8-bit Q8_0 weights move them by
//! 2e-3).
//!
//! Layout: weights in panels of 32 columns, `[n / 32][k / 2][32][2]` (a `vpdpwssd` B
//! operand per 16 columns and 2 inputs), `k` padded to a multiple of 32 with zeros.
//! Activations are quantized once per product into tiles of [`ROWS`] rows, block by block:
//! the pair of inputs `2t, 2t + 1` of a block of row `r` at `r * 16 + t` (each row's block
//! one contiguous vector store; the micro-kernel broadcasts one pair per row and step), with
//! their scales `[k / 32][rows]`. The micro-kernel keeps a tile's i32 block sums and f32
//! sums in registers (24 vectors). Each output depends only on its own input row: a row
//! gives the same bits alone as in any batch.
//!
//! Without AVX-512, AVX2 runs the same product on the same layout (`dense_avx2.rs`: tiles of
//! 6 rows by 16 columns, `vpmaddwd` + `vpaddd`, or AVX-VNNI's `vpdpwssd` on ymm): the same
//! integers, exact sums and f32 operations in the same order, so the same bits.

use super::dense::Level;
use super::pool;
use super::SendPtr;
use std::cell::RefCell;

/// Most activation rows of one micro-kernel tile (12 i32 and 12 f32 accumulators).
pub const ROWS: usize = 6;
/// Output columns per panel.
const COLS: usize = 32;
/// Inputs per activation scale.
const BLOCK: usize = 32;
/// Largest weight and activation integers (see the module docs).
const WMAX: f32 = 4095.0;
const AMAX: f32 = 8191.0;

/// Dense `[n, k]` weights as integer panels (see the module docs).
pub struct IntPanels {
    n: usize,
    k: usize,
    /// `k` rounded up to a multiple of [`BLOCK`].
    kp: usize,
    /// `[n / 32][kp / 2][32][2]`.
    w: Vec<i16>,
    /// Per output column: the value of 1 in its integers (zero past `n`).
    scale: Vec<f32>,
}

impl IntPanels {
    /// Quantizes `get(row, col)` of an `[n, k]` matrix of f32 values.
    pub fn new(n: usize, k: usize, get: impl Fn(usize, usize) -> f32) -> Self {
        let kp = k.div_ceil(BLOCK) * BLOCK;
        let np = n.div_ceil(COLS);
        let mut w = vec![0i16; np * kp * COLS];
        let mut scale = vec![0.0f32; np * COLS];
        let mut row = vec![0.0f32; k];
        for (j, sc) in scale[..n].iter_mut().enumerate() {
            for (t, v) in row.iter_mut().enumerate() {
                *v = get(j, t);
            }
            let amax = row.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let d = amax / WMAX;
            let id = if d > 0.0 { 1.0 / d } else { 0.0 };
            *sc = d;
            let (p, c) = (j / COLS, j % COLS);
            for (t, &v) in row.iter().enumerate() {
                w[(p * kp / 2 + t / 2) * 2 * COLS + c * 2 + t % 2] = (v * id).round() as i16;
            }
        }
        Self { n, k, kp, w, scale }
    }

    /// `out[m, n] = x[m, k] · wᵀ (+ bias)`, then GELU (erf form,
    /// [`super::gelu_erf_in_place`]) when `gelu`. Needs AVX-512 with VNNI or AVX2
    /// ([`Level::detect`]).
    pub fn matmul(&self, x: &[f32], m: usize, bias: Option<&[f32]>, gelu: bool, out: &mut [f32]) {
        let Some(level) = Level::detect() else { panic!("IntPanels::matmul needs AVX-512 VNNI or AVX2") };
        self.matmul_at(level, x, m, bias, gelu, out)
    }

    /// [`matmul`](Self::matmul) with the micro-kernels of `level`.
    pub(super) fn matmul_at(&self, level: Level, x: &[f32], m: usize, bias: Option<&[f32]>, gelu: bool, out: &mut [f32]) {
        let (n, k, kp) = (self.n, self.k, self.kp);
        assert!(level.runs_here(), "IntPanels::matmul: no {level:?} on this CPU");
        assert!(x.len() >= m * k && out.len() >= m * n, "IntPanels::matmul: input or output too short");
        assert!(bias.is_none_or(|b| b.len() >= n), "IntPanels::matmul: bias too short");
        if m == 0 || n == 0 {
            return;
        }
        ACTS.with(|a| {
            let (q, s) = &mut *a.borrow_mut();
            quantize_rows(level, x, m, k, kp, q, s);
            self.tiles(level, q, s, m, bias, gelu, out);
        });
    }

    /// The product of `m` rows quantized into tiles (`q`, `s`, see the module docs) by the
    /// panels, to `out[m, n]`.
    #[allow(clippy::too_many_arguments)]
    fn tiles(&self, level: Level, q: &[i32], s: &[f32], m: usize, bias: Option<&[f32]>, gelu: bool, out: &mut [f32]) {
        let (n, k, kp) = (self.n, self.k, self.kp);
        let np = n.div_ceil(COLS);
        // Rows per slab: their integers within ~512 KB (L2), a whole number of tiles.
        let slab = ((1usize << 18) / kp).clamp(ROWS, 64 * ROWS) / ROWS * ROWS;
        let (chunks, per) = pool::pool().panel_chunks(m * n * k, np);
        let o = SendPtr(out.as_mut_ptr());
        let job = |c: usize| {
            let (p0, p1) = (c * per, ((c + 1) * per).min(np));
            for s0 in (0..m).step_by(slab) {
                let s1 = (s0 + slab).min(m);
                for p in p0..p1 {
                    let cols = (n - p * COLS).min(COLS);
                    let b = bias.map(|b| &b[p * COLS..p * COLS + cols]);
                    let w = &self.w[p * kp * COLS..(p + 1) * kp * COLS];
                    let ws = &self.scale[p * COLS..(p + 1) * COLS];
                    for r in (s0..s1).step_by(ROWS) {
                        let rows = (s1 - r).min(ROWS);
                        // SAFETY: the CPU has `level` (asserted); the tile of rows r..r + rows
                        // is quantized at r * kp / 2 (pairs) and its scales at r * kp / 32;
                        // this chunk alone writes the columns of panels p0..p1, every row.
                        unsafe {
                            let xq = q.as_ptr().add(r * kp / 2);
                            let xs = s.as_ptr().add(r * kp / BLOCK);
                            tile(level, xq, xs, kp, rows, w, ws, cols, b, gelu, o.ptr().add(r * n + p * COLS), n);
                        }
                    }
                }
            }
        };
        if chunks == 1 {
            job(0);
        } else {
            pool::pool().run_chunks(chunks, &job);
        }
    }

    /// A one-dimensional convolution as this product, the weights `[n, taps * cin]` (tap
    /// major): `out[tout, n]` from the time-major input `x[t, cin]`, output frame `r` reading
    /// input frames `r * stride + tap * dilation - pad` (zeros outside). The same bits as
    /// [`matmul`](Self::matmul) on the im2col rows (each row the taps' frames side by side),
    /// as each block of 32 inputs lies in one frame and is quantized alike: every frame is
    /// quantized once instead of once per tap, and the tiles are gathered from its integers.
    /// `false` (nothing written) where this does not apply: `cin` not a multiple of 32, other
    /// shapes than the weight's, or no AVX-512 VNNI or AVX2.
    pub fn conv(&self, x: &[f32], g: ConvShape, bias: Option<&[f32]>, out: &mut [f32]) -> bool {
        let Some(level) = Level::detect() else { return false };
        let span = g.dilation * (g.taps.max(1) - 1);
        let padded = g.t + 2 * g.pad;
        if !g.cin.is_multiple_of(BLOCK) || g.cin * g.taps != self.k || g.stride == 0 || x.len() < g.t * g.cin || padded <= span || bias.is_some_and(|b| b.len() < self.n) {
            return false;
        }
        let tout = (padded - span - 1) / g.stride + 1;
        if out.len() < tout * self.n || self.n == 0 {
            return false;
        }
        let (kp, fb) = (self.kp, g.cin / BLOCK);
        FRAMES.with(|f| {
            let (fq, fs) = &mut *f.borrow_mut();
            quantize_rows_flat(level, x, g.t, g.cin, fq, fs);
            ACTS.with(|a| {
                let (q, s) = &mut *a.borrow_mut();
                grow_tiles(q, s, tout, kp);
                let (qp, sp) = (SendPtr(q.as_mut_ptr()), SendPtr(s.as_mut_ptr()));
                let (fq, fs) = (&fq[..], &fs[..]);
                let gather = |tile: usize| {
                    let r0 = tile * ROWS;
                    let rows = (tout - r0).min(ROWS);
                    for r in 0..rows {
                        for tap in 0..g.taps {
                            let frame = ((r0 + r) * g.stride + tap * g.dilation).checked_sub(g.pad).filter(|&j| j < g.t);
                            for c in 0..fb {
                                let b = tap * fb + c;
                                // SAFETY: the tile's pairs (r0 * kp / 2 ..) and scales
                                // (r0 * kp / 32 ..) belong to this job only, within tout rows.
                                unsafe {
                                    let dst = qp.ptr().add(r0 * kp / 2 + b * rows * BLOCK / 2 + r * BLOCK / 2);
                                    let sc = sp.ptr().add(r0 * kp / BLOCK + b * rows + r);
                                    match frame {
                                        Some(j) => {
                                            std::ptr::copy_nonoverlapping(fq.as_ptr().add((j * fb + c) * BLOCK / 2), dst, BLOCK / 2);
                                            *sc = fs[j * fb + c];
                                        }
                                        None => {
                                            std::ptr::write_bytes(dst, 0, BLOCK / 2);
                                            *sc = 0.0;
                                        }
                                    }
                                }
                            }
                        }
                    }
                };
                let tiles = tout.div_ceil(ROWS);
                if tout * kp < 1 << 16 || tiles == 1 {
                    (0..tiles).for_each(gather);
                } else {
                    pool::pool().run_chunks(tiles, &gather);
                }
                self.tiles(level, q, s, tout, bias, false, out);
            });
        });
        true
    }
}

/// The shape of a convolution for [`IntPanels::conv`]: `t` input frames of `cin` values,
/// `taps` taps `dilation` frames apart, `stride`, `pad` zero frames at both ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvShape {
    pub t: usize,
    pub cin: usize,
    pub taps: usize,
    pub stride: usize,
    pub dilation: usize,
    pub pad: usize,
}

thread_local! {
    /// [`IntPanels::conv`]'s input frames, quantized: pairs `[t][cin / 2]`, scales `[t][cin / 32]`.
    static FRAMES: RefCell<(Vec<i32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// `m` rows of `k` values (`k` a multiple of [`BLOCK`]) quantized block by block in place:
/// block `b` of row `r` to pairs `(r * k / 32 + b) * 16` and scale `r * k / 32 + b`, rows
/// over the pool when there are many.
fn quantize_rows_flat(level: Level, x: &[f32], m: usize, k: usize, q: &mut Vec<i32>, s: &mut Vec<f32>) {
    let blocks = m * k / BLOCK;
    q.resize(blocks * BLOCK / 2, 0);
    s.resize(blocks, 0.0);
    const CHUNK: usize = 64;
    let (qp, sp) = (SendPtr(q.as_mut_ptr()), SendPtr(s.as_mut_ptr()));
    let job = |ci: usize| {
        for b in ci * CHUNK..((ci + 1) * CHUNK).min(blocks) {
            let v = &x[b * BLOCK..(b + 1) * BLOCK];
            // SAFETY: block b's pairs and scale belong to this job only; the CPU has `level`.
            unsafe {
                let dst = qp.ptr().add(b * BLOCK / 2);
                *sp.ptr().add(b) = match level {
                    Level::Avx512 => quantize_block(v, dst),
                    Level::AvxVnni | Level::Avx2 => quantize_block_avx2(v, dst),
                };
            }
        }
    };
    let chunks = blocks.div_ceil(CHUNK);
    if m * k < 1 << 16 || chunks == 1 {
        (0..chunks).for_each(job);
    } else {
        pool::pool().run_chunks(chunks, &job);
    }
}

thread_local! {
    /// The caller's quantized activations (pairs of i16 as i32, in tiles) and their scales.
    static ACTS: RefCell<(Vec<i32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Room in `q` and `s` for `m` rows of `kp` quantized values in tiles, grown only (whoever
/// fills them writes every pair and scale below `m` rows).
fn grow_tiles(q: &mut Vec<i32>, s: &mut Vec<f32>, m: usize, kp: usize) {
    if q.len() < m * kp / 2 {
        q.resize(m * kp / 2, 0);
    }
    if s.len() < m * kp / BLOCK {
        s.resize(m * kp / BLOCK, 0.0);
    }
}

/// `m` rows of `k` values into tiles of [`ROWS`] rows (see the module docs), rows over the
/// pool when there are many, with the instructions of `level` (which the CPU has).
fn quantize_rows(level: Level, x: &[f32], m: usize, k: usize, kp: usize, q: &mut Vec<i32>, s: &mut Vec<f32>) {
    // Every pair and scale below m rows is written (padding blocks as zeros): grow only.
    grow_tiles(q, s, m, kp);
    let (qp, sp) = (SendPtr(q.as_mut_ptr()), SendPtr(s.as_mut_ptr()));
    let job = |tile: usize| {
        let r0 = tile * ROWS;
        let rows = (m - r0).min(ROWS);
        for r in 0..rows {
            let row = &x[(r0 + r) * k..(r0 + r + 1) * k];
            // SAFETY: the tile's pairs (r0 * kp / 2 .. (r0 + rows) * kp / 2) and scales
            // belong to this job only; the CPU has `level` (asserted by the caller).
            unsafe {
                let (dst, sc) = (qp.ptr().add(r0 * kp / 2 + r * BLOCK / 2), sp.ptr().add(r0 * kp / BLOCK + r));
                match level {
                    Level::Avx512 => quantize_row(row, kp, rows, dst, sc),
                    Level::AvxVnni | Level::Avx2 => {
                        for b in 0..kp / BLOCK {
                            let v = &row[(b * BLOCK).min(k)..((b + 1) * BLOCK).min(k)];
                            *sc.add(b * rows) = quantize_block_avx2(v, dst.add(b * rows * BLOCK / 2));
                        }
                    }
                }
            }
        }
    };
    let tiles = m.div_ceil(ROWS);
    if m * k < 1 << 16 || tiles == 1 {
        (0..tiles).for_each(job);
    } else {
        pool::pool().run_chunks(tiles, &job);
    }
}

/// One row's `kp / BLOCK` blocks (the values of `row`, zeros after them) by
/// [`quantize_block`]: block `b`'s pairs to `dst + b * rows * 16`, its scale to
/// `sc + b * rows` (a tile of `rows` rows).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn quantize_row(row: &[f32], kp: usize, rows: usize, dst: *mut i32, sc: *mut f32) {
    let k = row.len();
    for b in 0..kp / BLOCK {
        let v = row.get((b * BLOCK).min(k)..((b + 1) * BLOCK).min(k)).unwrap_or_default();
        *sc.add(b * rows) = quantize_block(v, dst.add(b * rows * BLOCK / 2));
    }
}

/// Up to [`BLOCK`] values (zeros after them) as integers of at most [`AMAX`] in magnitude,
/// rounded to nearest even: their 16 pairs to `dst[..16]`; returns the value of 1.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn quantize_block(v: &[f32], dst: *mut i32) -> f32 {
    use std::arch::x86_64::*;
    let n = v.len().min(BLOCK);
    let (a, b) = if n == BLOCK {
        (_mm512_loadu_ps(v.as_ptr()), _mm512_loadu_ps(v.as_ptr().add(16)))
    } else {
        let (m0, m1) = (((1u32 << n.min(16)) - 1) as u16, ((1u32 << n.saturating_sub(16)) - 1) as u16);
        (_mm512_maskz_loadu_ps(m0, v.as_ptr()), _mm512_maskz_loadu_ps(m1, v.as_ptr().add(16.min(n))))
    };
    let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    let d = amax / AMAX;
    let id = _mm512_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
    let lo = _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(a, id)));
    let hi = _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(b, id)));
    let pairs = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
    _mm512_storeu_si512(dst as *mut _, pairs);
    d
}

/// [`quantize_block`] on AVX2: the same integers and scale (the largest magnitude is exact
/// in any order, and the rest is the same f32 operations).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn quantize_block_avx2(v: &[f32], dst: *mut i32) -> f32 {
    use std::arch::x86_64::*;
    let mut x = [0.0f32; BLOCK];
    let n = v.len().min(BLOCK);
    x[..n].copy_from_slice(&v[..n]);
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let xv: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(x.as_ptr().add(8 * i)));
    let m = xv.iter().fold(_mm256_setzero_ps(), |m, &a| _mm256_max_ps(m, _mm256_and_ps(a, abs)));
    let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
    let d = amax / AMAX;
    let id = _mm256_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
    let q: [__m256i; 4] = std::array::from_fn(|i| _mm256_cvtps_epi32(_mm256_mul_ps(xv[i], id)));
    // Each 128-bit lane packs its halves: 0-3 8-11 4-7 12-15, put back in order.
    let lo = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(q[0], q[1]));
    let hi = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256(dst as *mut __m256i, lo);
    _mm256_storeu_si256(dst.add(8) as *mut __m256i, hi);
    d
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn quantize_row(_: &[f32], _: usize, _: usize, _: *mut i32, _: *mut f32) {
    unreachable!("IntPanels::matmul needs AVX-512 or AVX2")
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn quantize_block(_: &[f32], _: *mut i32) -> f32 {
    unreachable!("IntPanels::matmul needs AVX-512 or AVX2")
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn quantize_block_avx2(_: &[f32], _: *mut i32) -> f32 {
    unreachable!("IntPanels::matmul needs AVX-512 or AVX2")
}

/// One tile of rows times one panel with the micro-kernel of `level` (which the CPU has).
#[allow(clippy::too_many_arguments)]
#[cfg(target_arch = "x86_64")]
unsafe fn tile(level: Level, xq: *const i32, xs: *const f32, kp: usize, rows: usize, w: &[i16], ws: &[f32], cols: usize, bias: Option<&[f32]>, gelu: bool, out: *mut f32, ldo: usize) {
    match level {
        Level::Avx512 => tile512(xq, xs, kp, rows, w, ws, cols, bias, gelu, out, ldo),
        Level::AvxVnni | Level::Avx2 => super::dense_avx2::i16_tile(level == Level::AvxVnni, xq, xs, kp, rows, w, ws, cols, bias, gelu, out, ldo),
    }
}

#[allow(clippy::too_many_arguments)]
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma")]
unsafe fn tile512(xq: *const i32, xs: *const f32, kp: usize, rows: usize, w: &[i16], ws: &[f32], cols: usize, bias: Option<&[f32]>, gelu: bool, out: *mut f32, ldo: usize) {
    macro_rules! rows {
        ($($r:literal)*) => {
            match rows {
                $($r => tile_r::<$r>(xq, xs, kp, w.as_ptr(), ws.as_ptr(), cols, bias, gelu, out, ldo),)*
                _ => unreachable!("tiles have 1 to ROWS rows"),
            }
        };
    }
    rows!(1 2 3 4 5 6)
}

#[cfg(not(target_arch = "x86_64"))]
#[allow(clippy::too_many_arguments)]
unsafe fn tile(_: Level, _: *const i32, _: *const f32, _: usize, _: usize, _: &[i16], _: &[f32], _: usize, _: Option<&[f32]>, _: bool, _: *mut f32, _: usize) {
    unreachable!("IntPanels::matmul needs AVX-512 or AVX2")
}

/// `R` rows of quantized activations times one panel, to `out` (rows `ldo` apart; `cols`
/// of the 32 columns real).
#[allow(clippy::too_many_arguments)]
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn tile_r<const R: usize>(xq: *const i32, xs: *const f32, kp: usize, w: *const i16, ws: *const f32, cols: usize, bias: Option<&[f32]>, gelu: bool, out: *mut f32, ldo: usize) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    for b in 0..kp / BLOCK {
        let (xb, wb) = (xq.add(b * BLOCK / 2 * R), w.add(b * BLOCK * COLS));
        let (w0, w1) = (_mm512_loadu_si512(wb as *const _), _mm512_loadu_si512(wb.add(COLS) as *const _));
        let mut sum = [[_mm512_setzero_si512(); 2]; R];
        for (r, s) in sum.iter_mut().enumerate() {
            let a = _mm512_set1_epi32(*xb.add(r * BLOCK / 2));
            s[0] = _mm512_madd_epi16(a, w0);
            s[1] = _mm512_madd_epi16(a, w1);
        }
        for t in 1..BLOCK / 2 {
            let wt = wb.add(t * 2 * COLS);
            let (w0, w1) = (_mm512_loadu_si512(wt as *const _), _mm512_loadu_si512(wt.add(COLS) as *const _));
            for (r, s) in sum.iter_mut().enumerate() {
                let a = _mm512_set1_epi32(*xb.add(r * BLOCK / 2 + t));
                s[0] = _mm512_dpwssd_epi32(s[0], a, w0);
                s[1] = _mm512_dpwssd_epi32(s[1], a, w1);
            }
        }
        for (r, (a, s)) in acc.iter_mut().zip(&sum).enumerate() {
            let d = _mm512_set1_ps(*xs.add(b * R + r));
            a[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[0]), d, a[0]);
            a[1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[1]), d, a[1]);
        }
    }
    let (s0, s1) = (_mm512_loadu_ps(ws), _mm512_loadu_ps(ws.add(16)));
    for a in acc.iter_mut() {
        a[0] = _mm512_mul_ps(a[0], s0);
        a[1] = _mm512_mul_ps(a[1], s1);
    }
    super::dense_f32::store_tile(&acc, cols, bias, gelu, out, ldo);
}

#[cfg(test)]
mod tests {
    use super::{ConvShape, IntPanels, Level};

    /// The convolution from frames quantized once gives the bits of the product on the
    /// im2col rows, padding, stride and dilation included; shapes it does not take say so.
    #[test]
    fn conv_is_the_im2col_product() {
        if Level::detect().is_none() {
            eprintln!("no AVX-512 VNNI or AVX2 here: nothing to test");
            return;
        }
        for (cin, n, taps, stride, dilation, pad, t) in [(64usize, 40usize, 3usize, 1usize, 1usize, 1usize, 50usize), (32, 70, 7, 1, 3, 9, 33), (96, 32, 11, 1, 5, 25, 200), (64, 33, 4, 2, 1, 2, 41), (32, 16, 1, 1, 1, 0, 7)] {
            let k = cin * taps;
            let w: Vec<f32> = (0..n * k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 61.0).collect();
            let bias: Vec<f32> = (0..n).map(|j| j as f32 * 0.01 - 0.3).collect();
            let p = IntPanels::new(n, k, |r, c| w[r * k + c]);
            let x: Vec<f32> = (0..t * cin).map(|i| ((i * 13 % 47) as f32 - 23.0) / 17.0 + if i % 50 == 7 { 40.0 } else { 0.0 }).collect();
            let tout = (t + 2 * pad - dilation * (taps - 1) - 1) / stride + 1;
            let mut cols = vec![0f32; tout * k];
            for r in 0..tout {
                for tap in 0..taps {
                    let j = (r * stride + tap * dilation) as isize - pad as isize;
                    if (0..t as isize).contains(&j) {
                        let j = j as usize;
                        cols[r * k + tap * cin..r * k + (tap + 1) * cin].copy_from_slice(&x[j * cin..(j + 1) * cin]);
                    }
                }
            }
            let mut want = vec![f32::NAN; tout * n];
            p.matmul(&cols, tout, Some(&bias), false, &mut want);
            let mut got = vec![f32::NAN; tout * n];
            assert!(p.conv(&x, ConvShape { t, cin, taps, stride, dilation, pad }, Some(&bias), &mut got));
            let same = want.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "cin={cin} taps={taps} stride={stride} dilation={dilation} pad={pad}: not the im2col product's bits");
        }
        let p = IntPanels::new(8, 3 * 40, |r, c| (r + c) as f32);
        let mut out = vec![0f32; 64];
        assert!(!p.conv(&[0.0; 400], ConvShape { t: 10, cin: 40, taps: 3, stride: 1, dilation: 1, pad: 1 }, None, &mut out), "40 channels are not whole blocks");
    }

    /// At every level this CPU has (AVX-512 VNNI, AVX-VNNI, AVX2): within the rounding of the
    /// integers of the f64 product, GELU in the product the same as after it, a row alone the
    /// same as in a batch, and every level the same bits.
    #[test]
    fn close_to_f64_reference_rows_alone_and_gelu() {
        let levels = Level::all_here();
        if levels.is_empty() {
            eprintln!("no AVX-512 VNNI or AVX2 here: nothing to test");
            return;
        }
        eprintln!("levels: {levels:?}");
        // A partial panel and odd inputs; whole panels; long inputs.
        for (n, k) in [(70usize, 83usize), (96, 64), (40, 1536)] {
            let w: Vec<f32> = (0..n * k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 61.0 + (i as f32).cos() * 1e-3).collect();
            let bias: Vec<f32> = (0..n).map(|j| j as f32 * 0.01 - 0.3).collect();
            let p = IntPanels::new(n, k, |r, c| w[r * k + c]);
            for m in [1usize, 5, 6, 7, 31, 70, 200] {
                // An outlier every 50 values: only its block loses precision.
                let x: Vec<f32> = (0..m * k).map(|i| ((i * 13 % 47) as f32 - 23.0) / 17.0 + if i % 50 == 7 { 40.0 } else { 0.0 }).collect();
                let mut out = vec![f32::NAN; m * n];
                p.matmul_at(levels[0], &x, m, Some(&bias), false, &mut out);
                for i in 0..m {
                    let xr = &x[i * k..(i + 1) * k];
                    // Half a step of each activation's block.
                    let dx: Vec<f64> = (0..k).map(|t| xr[t / 32 * 32..(t / 32 * 32 + 32).min(k)].iter().fold(0.0f64, |a, v| a.max(v.abs() as f64)) / 8191.0 / 2.0).collect();
                    for j in 0..n {
                        let wr = &w[j * k..(j + 1) * k];
                        let dw = wr.iter().fold(0.0f64, |a, v| a.max(v.abs() as f64)) / 4095.0 / 2.0;
                        let r: f64 = (0..k).map(|t| xr[t] as f64 * wr[t] as f64).sum::<f64>() + bias[j] as f64;
                        let scale: f64 = (0..k).map(|t| (xr[t] as f64 * wr[t] as f64).abs()).sum();
                        // The rounding of the integers, bounded term by term, and f32 sums.
                        let bound: f64 = (0..k).map(|t| xr[t].abs() as f64 * dw + wr[t].abs() as f64 * dx[t] + dx[t] * dw).sum::<f64>() + 1e-6 * scale + 1e-6;
                        let err = (out[i * n + j] as f64 - r).abs();
                        assert!(err <= bound, "n={n} k={k} m={m} ({i},{j}): {} vs {r}, bound {bound}", out[i * n + j]);
                    }
                }
                crate::kernels::dense::same_at_every_level(&levels, m, n, k, &out, &|l, x, m, bias, gelu, out| p.matmul_at(l, x, m, bias, gelu, out), &x, &bias);
            }
        }
    }
}
