//! Layer normalization, once for every encoder.

use crate::kernels::{pool, SendPtr};
use crate::{Error, Result};

/// Rows per unit of the pool.
const ROWS: usize = 32;
/// Below this many values in all, rows are normalised on the calling thread.
const INLINE: usize = 64 * 1024;

/// A layer norm's weights: each row of `dim()` values becomes `(x - mean) / sqrt(var + eps)
/// * w + b`, with the mean and variance accumulated in f64.
#[derive(Clone, Debug)]
pub struct LayerNorm {
    w: Vec<f32>,
    b: Vec<f32>,
    eps: f32,
}

impl LayerNorm {
    /// Fails (naming both lengths) when `w` and `b` differ in length or are empty.
    pub fn new(w: Vec<f32>, b: Vec<f32>, eps: f32) -> Result<Self> {
        if w.len() != b.len() || w.is_empty() {
            return Err(Error::Shape(format!("layer norm: weight of {} values, bias of {}", w.len(), b.len())));
        }
        Ok(Self { w, b, eps })
    }

    /// The row length.
    pub fn dim(&self) -> usize {
        self.w.len()
    }

    /// Each row of `x` (a whole number of rows) in place.
    pub fn rows(&self, x: &mut [f32]) {
        let xp = SendPtr(x.as_mut_ptr());
        // SAFETY: each row is read and written by one unit only; `x` outlives the call.
        self.over_rows(x.len(), &|i| unsafe { self.row_raw(xp.ptr().add(i), xp.ptr().add(i)) });
    }

    /// Each row of `x` into the same row of `out` (at least as long as `x`).
    pub fn rows_to(&self, x: &[f32], out: &mut [f32]) {
        assert!(out.len() >= x.len(), "layer norm: output of {} values for {} inputs", out.len(), x.len());
        let op = SendPtr(out.as_mut_ptr());
        // SAFETY: in bounds of both (checked above); each output row is written by one unit.
        self.over_rows(x.len(), &|i| unsafe { self.row_raw(x.as_ptr().add(i), op.ptr().add(i)) });
    }

    /// `x = norm(x + y)` row by row: the residual and the norm after it, in one pass.
    pub fn add_rows(&self, x: &mut [f32], y: &[f32]) {
        assert!(y.len() >= x.len(), "layer norm: residual of {} values for {}", y.len(), x.len());
        let xp = SendPtr(x.as_mut_ptr());
        let d = self.dim();
        self.over_rows(x.len(), &|i| {
            // SAFETY: row `i / d` belongs to this unit only; in bounds of `x` and `y`.
            let r = unsafe { std::slice::from_raw_parts_mut(xp.ptr().add(i), d) };
            for (a, b) in r.iter_mut().zip(&y[i..i + d]) {
                *a += b;
            }
            // SAFETY: as above.
            unsafe { self.row_raw(r.as_ptr(), r.as_mut_ptr()) };
        });
    }

    /// Calls `f(offset)` for the start of every row of a buffer of `len` values, rows in
    /// units of [`ROWS`] over the pool when there are many.
    fn over_rows(&self, len: usize, f: &(dyn Fn(usize) + Sync)) {
        let d = self.dim();
        assert!(len.is_multiple_of(d), "layer norm: {len} values are not rows of {d}");
        let rows = len / d;
        let job = |c: usize| (c * ROWS..((c + 1) * ROWS).min(rows)).for_each(|r| f(r * d));
        let chunks = rows.div_ceil(ROWS);
        if chunks <= 1 || len < INLINE {
            (0..chunks).for_each(job);
        } else {
            pool::pool().run_chunks(chunks, &job);
        }
    }

    /// # Safety
    /// `src` and `dst` hold `dim()` values each (they may be the same row).
    unsafe fn row_raw(&self, src: *const f32, dst: *mut f32) {
        norm_raw(src, dst, self.dim(), &self.w, &self.b, self.eps)
    }
}

/// One row in place: `(r - mean) / sqrt(var + eps) * w + b`, statistics in f64. `w` and `b`
/// hold at least `r.len()` values.
pub fn layer_norm(r: &mut [f32], w: &[f32], b: &[f32], eps: f32) {
    assert!(w.len() >= r.len() && b.len() >= r.len(), "layer norm: weights of {} / {} values for a row of {}", w.len(), b.len(), r.len());
    let p = r.as_mut_ptr();
    // SAFETY: the row is `r`, read before each value is written.
    unsafe { norm_raw(p, p, r.len(), w, b, eps) }
}

/// # Safety
/// `src` and `dst` hold `n` values (they may be equal); `w` and `b` at least `n`.
unsafe fn norm_raw(src: *const f32, dst: *mut f32, n: usize, w: &[f32], b: &[f32], eps: f32) {
    #[cfg(target_arch = "x86_64")]
    if n.is_multiple_of(16) && crate::kernels::has_avx512() {
        // SAFETY: AVX-512 F is present; lengths as the caller promises.
        return norm_avx512(src, dst, n, w, b, eps);
    }
    let x = std::slice::from_raw_parts(src, n);
    let len = n as f64;
    let mean = x.iter().map(|&v| v as f64).sum::<f64>() / len;
    let var = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / len;
    let inv = 1.0 / (var + eps as f64).sqrt();
    for i in 0..n {
        // read before write: `dst` may be `src`
        let v = *src.add(i) as f64;
        *dst.add(i) = ((v - mean) * inv) as f32 * w[i] + b[i];
    }
}

/// [`norm_raw`] with 8 lanes of f64 sums (rows of a multiple of 16 values).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn norm_avx512(src: *const f32, dst: *mut f32, len: usize, w: &[f32], b: &[f32], eps: f32) {
    use std::arch::x86_64::*;
    let wide = |i: usize| {
        let v = _mm512_loadu_ps(src.add(i));
        (_mm512_cvtps_pd(_mm512_castps512_ps256(v)), _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)))))
    };
    let (mut s0, mut s1) = (_mm512_setzero_pd(), _mm512_setzero_pd());
    for i in (0..len).step_by(16) {
        let (a, c) = wide(i);
        s0 = _mm512_add_pd(s0, a);
        s1 = _mm512_add_pd(s1, c);
    }
    let mean = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1)) / len as f64;
    let m = _mm512_set1_pd(mean);
    let (mut q0, mut q1) = (_mm512_setzero_pd(), _mm512_setzero_pd());
    for i in (0..len).step_by(16) {
        let (a, c) = wide(i);
        let (a, c) = (_mm512_sub_pd(a, m), _mm512_sub_pd(c, m));
        q0 = _mm512_fmadd_pd(a, a, q0);
        q1 = _mm512_fmadd_pd(c, c, q1);
    }
    let var = _mm512_reduce_add_pd(_mm512_add_pd(q0, q1)) / len as f64;
    let inv = _mm512_set1_pd(1.0 / (var + eps as f64).sqrt());
    for i in (0..len).step_by(16) {
        let (a, c) = wide(i);
        let lo = _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_sub_pd(a, m), inv));
        let hi = _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_sub_pd(c, m), inv));
        let v = _mm512_castpd_ps(_mm512_insertf64x4::<1>(_mm512_castps_pd(_mm512_castps256_ps512(lo)), _mm256_castps_pd(hi)));
        let v = _mm512_add_ps(_mm512_mul_ps(v, _mm512_loadu_ps(w.as_ptr().add(i))), _mm512_loadu_ps(b.as_ptr().add(i)));
        _mm512_storeu_ps(dst.add(i), v);
    }
}
