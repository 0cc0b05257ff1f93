//! A blocked f32 GEMM for dense weights on AVX-512 or AVX2 ([`Panels`]), for encoders
//! without AMX-BF16 ([`super::DenseMatrix::from_f32_blocked`]).
//!
//! Weights `[n, k]` are packed at load into panels of 32 output columns: panel `p` holds, for
//! each input `t`, the 32 weights `w[32p + c][t]` side by side (zero past `n`), so a step
//! of the inner loop is two aligned vector loads. The micro-kernel keeps a tile of up to
//! [`ROWS`] activation rows by 32 columns in 24 registers and for each input broadcasts each
//! row's value once for two fused multiply-adds. Rows go in slabs whose activations stay in
//! L2 while every panel of the thread's share passes over them; the panels are split over
//! the kernel pool. Bias (and GELU) is applied to each tile as it is stored.
//!
//! Each output is one chain of fused multiply-adds over `t = 0..k` in order (bias added
//! after), whatever the number of rows or their grouping: a row gives the same bits alone
//! as in any batch. The AVX2 kernel (`dense_avx2.rs`: tiles of 6 rows by 16 columns in 16
//! ymm registers) does the same chains, so it gives the AVX-512 kernel's bits.

use super::dense::{Elem, Level};
use super::pool;
use super::SendPtr;

/// Most activation rows of one micro-kernel tile (24 accumulators).
pub const ROWS: usize = 12;
/// Output columns per panel.
const COLS: usize = 32;

/// Dense `[n, k]` weights packed in panels of 32 columns (see the module docs): f32, or f16
/// (f16 sources keep their bytes: half the memory traffic, widened in registers, the same
/// products).
pub struct Panels {
    n: usize,
    k: usize,
    /// `[n / 32][k][32]`.
    w: Data,
}

enum Data {
    F32(Vec<f32>),
    F16(Vec<u16>),
}

/// `[n / 32][k][32]` of `get(row, col)`, zero past `n`.
fn pack<T: Copy + Default>(n: usize, k: usize, get: impl Fn(usize, usize) -> T) -> Vec<T> {
    let np = n.div_ceil(COLS);
    let mut w = vec![T::default(); np * k * COLS];
    for p in 0..np {
        for c in 0..COLS.min(n - p * COLS) {
            let row = p * COLS + c;
            for t in 0..k {
                w[(p * k + t) * COLS + c] = get(row, t);
            }
        }
    }
    w
}

impl Panels {
    /// Packs `get(row, col)` of an `[n, k]` matrix of f32 values.
    pub fn new(n: usize, k: usize, get: impl Fn(usize, usize) -> f32) -> Self {
        Self { n, k, w: Data::F32(pack(n, k, get)) }
    }

    /// Packs `get(row, col)` of an `[n, k]` matrix of f16 values (their bits).
    pub fn new_f16(n: usize, k: usize, get: impl Fn(usize, usize) -> u16) -> Self {
        Self { n, k, w: Data::F16(pack(n, k, get)) }
    }

    /// `out[m, n] = x[m, k] · wᵀ (+ bias)`, then GELU (erf form,
    /// [`super::gelu_erf_in_place`]) when `gelu`. Needs AVX-512 F or AVX2
    /// ([`Level::detect`]).
    pub fn matmul(&self, x: &[f32], m: usize, bias: Option<&[f32]>, gelu: bool, out: &mut [f32]) {
        let Some(level) = Level::detect() else { panic!("Panels::matmul needs AVX-512 or AVX2") };
        self.matmul_at(level, x, m, bias, gelu, out)
    }

    /// [`matmul`](Self::matmul) with the micro-kernel of `level`.
    pub(super) fn matmul_at(&self, level: Level, x: &[f32], m: usize, bias: Option<&[f32]>, gelu: bool, out: &mut [f32]) {
        let (n, k) = (self.n, self.k);
        assert!(level.runs_here(), "Panels::matmul: no {level:?} on this CPU");
        assert!(x.len() >= m * k && out.len() >= m * n, "Panels::matmul: input or output too short");
        assert!(bias.is_none_or(|b| b.len() >= n), "Panels::matmul: bias too short");
        if m == 0 || n == 0 {
            return;
        }
        let np = n.div_ceil(COLS);
        #[cfg(target_arch = "x86_64")]
        let tr = if level == Level::Avx512 { ROWS } else { super::dense_avx2::ROWS };
        #[cfg(not(target_arch = "x86_64"))]
        let tr = ROWS;
        // Rows per slab: their activations within ~256 KB (L2), a whole number of tiles.
        let slab = ((1usize << 16) / k.max(1)).clamp(ROWS, 16 * ROWS) / ROWS * ROWS;
        let (chunks, per) = pool::pool().panel_chunks(m * n * k, np);
        let o = SendPtr(out.as_mut_ptr());
        let job = |c: usize| {
            let (p0, p1) = (c * per, ((c + 1) * per).min(np));
            ROWS_PACKED.with(|buf| {
                let mut buf = buf.borrow_mut();
                for s0 in (0..m).step_by(slab) {
                    let s1 = (s0 + slab).min(m);
                    pack_rows(&x[s0 * k..s1 * k], k, tr, &mut buf);
                    for p in p0..p1 {
                        let cols = (n - p * COLS).min(COLS);
                        let b = bias.map(|b| &b[p * COLS..p * COLS + cols]);
                        let mut r = s0;
                        while r < s1 {
                            let rows = (s1 - r).min(tr);
                            // SAFETY: the CPU has `level` (the caller's contract); the tile of
                            // rows r..r + rows is packed at (r - s0) * k; this chunk alone
                            // writes the columns of panels p0..p1, every row.
                            unsafe {
                                let (xp, out) = (buf.as_ptr().add((r - s0) * k), o.ptr().add(r * n + p * COLS));
                                match &self.w {
                                    Data::F32(w) => tile::<f32>(level, xp, k, rows, &w[p * k * COLS..(p + 1) * k * COLS], cols, b, gelu, out, n),
                                    Data::F16(w) => tile::<u16>(level, xp, k, rows, &w[p * k * COLS..(p + 1) * k * COLS], cols, b, gelu, out, n),
                                }
                            }
                            r += rows;
                        }
                    }
                }
            });
        };
        if chunks == 1 {
            job(0);
        } else {
            pool::pool().run_chunks(chunks, &job);
        }
    }
}

thread_local! {
    /// A thread's slab of activation rows, packed by [`pack_rows`].
    static ROWS_PACKED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Rows of `k` values (`x`) into `buf` as tiles of `tr` rows (the last may have fewer): the
/// tile of rows `i..i + rows` at `i * k`, value `t` of its row `r` at `t * rows + r`, so the
/// micro-kernel reads each step's values from one address on.
fn pack_rows(x: &[f32], k: usize, tr: usize, buf: &mut Vec<f32>) {
    let m = x.len() / k.max(1);
    buf.clear();
    buf.resize(m * k, 0.0);
    for i in (0..m).step_by(tr) {
        let rows = (m - i).min(tr);
        let dst = &mut buf[i * k..(i + rows) * k];
        for r in 0..rows {
            for (t, &v) in x[(i + r) * k..(i + r + 1) * k].iter().enumerate() {
                dst[t * rows + r] = v;
            }
        }
    }
}

/// One tile of rows times one panel with the micro-kernel of `level` (which the CPU has).
#[allow(clippy::too_many_arguments)]
#[cfg(target_arch = "x86_64")]
unsafe fn tile<E: Elem>(level: Level, x: *const f32, k: usize, rows: usize, panel: &[E], cols: usize, bias: Option<&[f32]>, gelu: bool, out: *mut f32, ldo: usize) {
    match level {
        Level::Avx512 => tile512(x, k, rows, panel, cols, bias, gelu, out, ldo),
        Level::AvxVnni | Level::Avx2 => super::dense_avx2::f32_tile(x, k, rows, panel, cols, bias, gelu, out, ldo),
    }
}

#[allow(clippy::too_many_arguments)]
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma,f16c")]
unsafe fn tile512<E: Elem>(x: *const f32, k: usize, rows: usize, panel: &[E], cols: usize, bias: Option<&[f32]>, gelu: bool, out: *mut f32, ldo: usize) {
    macro_rules! rows {
        ($($r:literal)*) => {
            match rows {
                $($r => tile_r::<E, $r>(x, k, panel.as_ptr(), cols, bias, gelu, out, ldo),)*
                _ => unreachable!("tiles have 1 to ROWS rows"),
            }
        };
    }
    rows!(1 2 3 4 5 6 7 8 9 10 11 12)
}

#[cfg(not(target_arch = "x86_64"))]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<E: Elem>(_: Level, _: *const f32, _: usize, _: usize, _: &[E], _: usize, _: Option<&[f32]>, _: bool, _: *mut f32, _: usize) {
    unreachable!("Panels::matmul needs AVX-512 or AVX2")
}

/// `R` rows of activations (packed: value `t` of row `r` at `x[t * R + r]`) times one
/// panel, to `out` (rows `ldo` apart; `cols` of the 32 columns real).
#[allow(clippy::too_many_arguments)]
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn tile_r<E: Elem, const R: usize>(x: *const f32, k: usize, w: *const E, cols: usize, bias: Option<&[f32]>, gelu: bool, out: *mut f32, ldo: usize) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    for t in 0..k {
        let (w0, w1) = E::load32(w.add(t * COLS));
        for (r, a) in acc.iter_mut().enumerate() {
            let v = _mm512_set1_ps(*x.add(t * R + r));
            a[0] = _mm512_fmadd_ps(v, w0, a[0]);
            a[1] = _mm512_fmadd_ps(v, w1, a[1]);
        }
    }
    store_tile(&acc, cols, bias, gelu, out, ldo);
}

/// The sums of a tile of rows times one panel of 32 columns (`acc[r]`: row `r`'s two
/// vectors) plus the bias, GELU'd when `gelu`, to `out` (rows `ldo` apart; `cols` of the
/// 32 columns real).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) unsafe fn store_tile(acc: &[[std::arch::x86_64::__m512; 2]], cols: usize, bias: Option<&[f32]>, gelu: bool, out: *mut f32, ldo: usize) {
    use std::arch::x86_64::*;
    // The GELU buffer below holds at most this kernel's tile.
    debug_assert!(acc.len() <= ROWS, "a tile of {} rows", acc.len());
    let mask = |h: usize| -> u16 {
        let c = cols.saturating_sub(16 * h).min(16);
        ((1u32 << c) - 1) as u16
    };
    let (m0, m1) = (mask(0), mask(1));
    let (b0, b1) = match bias {
        Some(b) => (_mm512_maskz_loadu_ps(m0, b.as_ptr()), _mm512_maskz_loadu_ps(m1, b.as_ptr().add(16))),
        None => (_mm512_setzero_ps(), _mm512_setzero_ps()),
    };
    if !gelu {
        for (r, a) in acc.iter().enumerate() {
            let o = out.add(r * ldo);
            _mm512_mask_storeu_ps(o, m0, _mm512_add_ps(a[0], b0));
            _mm512_mask_storeu_ps(o.add(16), m1, _mm512_add_ps(a[1], b1));
        }
        return;
    }
    // GELU over the whole tile in one call, then its rows out.
    let mut v = [0.0f32; ROWS * COLS];
    for (r, a) in acc.iter().enumerate() {
        _mm512_storeu_ps(v.as_mut_ptr().add(r * COLS), _mm512_add_ps(a[0], b0));
        _mm512_storeu_ps(v.as_mut_ptr().add(r * COLS + 16), _mm512_add_ps(a[1], b1));
    }
    super::gelu_erf_in_place(&mut v[..acc.len() * COLS]);
    for r in 0..acc.len() {
        let (s, o) = (v.as_ptr().add(r * COLS), out.add(r * ldo));
        _mm512_mask_storeu_ps(o, m0, _mm512_loadu_ps(s));
        _mm512_mask_storeu_ps(o.add(16), m1, _mm512_loadu_ps(s.add(16)));
    }
}

#[cfg(test)]
mod tests {
    use super::{Level, Panels};

    /// At every level this CPU has (AVX-512, AVX2): within f32 rounding of the f64 product,
    /// GELU in the product the same as after it, a row alone the same as in a batch, and
    /// every level the same bits.
    #[test]
    fn matches_f64_reference_rows_alone_and_gelu() {
        let levels = Level::all_here();
        if levels.is_empty() {
            eprintln!("no AVX-512 or AVX2 here: nothing to test");
            return;
        }
        eprintln!("levels: {levels:?}");
        // A partial panel and odd inputs; whole panels; inputs long enough for short slabs.
        for (n, k) in [(70usize, 83usize), (96, 64), (40, 1536)] {
            let w: Vec<f32> = (0..n * k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 61.0 + (i as f32).cos() * 1e-3).collect();
            let bias: Vec<f32> = (0..n).map(|j| j as f32 * 0.01 - 0.3).collect();
            let h: Vec<u16> = w.iter().map(|&v| half::f16::from_f32(v).to_bits()).collect();
            let hf: Vec<f32> = h.iter().map(|&b| half::f16::from_bits(b).to_f32()).collect();
            check(&levels, &Panels::new(n, k, |r, c| w[r * k + c]), &w, n, k, &bias);
            // f16 weights: the products of their f32 values.
            check(&levels, &Panels::new_f16(n, k, |r, c| h[r * k + c]), &hf, n, k, &bias);
        }
    }

    fn check(levels: &[Level], p: &Panels, w: &[f32], n: usize, k: usize, bias: &[f32]) {
        for m in [1usize, 5, 6, 7, 12, 13, 31, 70, 200] {
            let x: Vec<f32> = (0..m * k).map(|i| ((i * 13 % 47) as f32 - 23.0) / 17.0 + (i as f32 * 1e-3).sin()).collect();
            let mut out = vec![f32::NAN; m * n];
            p.matmul_at(levels[0], &x, m, Some(bias), false, &mut out);
            for i in 0..m {
                for j in 0..n {
                    let r: f64 = (0..k).map(|t| x[i * k + t] as f64 * w[j * k + t] as f64).sum::<f64>() + bias[j] as f64;
                    let scale: f64 = (0..k).map(|t| (x[i * k + t] as f64 * w[j * k + t] as f64).abs()).sum();
                    assert!((out[i * n + j] as f64 - r).abs() <= 1e-6 * scale + 1e-6, "n={n} k={k} m={m} ({i},{j}): {} vs {r}", out[i * n + j]);
                }
            }
            crate::kernels::dense::same_at_every_level(levels, m, n, k, &out, &|l, x, m, bias, gelu, out| p.matmul_at(l, x, m, bias, gelu, out), &x, bias);
        }
    }
}
