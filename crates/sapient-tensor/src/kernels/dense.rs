//! Dense f32 matrix products for unquantized weights (f32, or f16 widened at load), split over
//! the kernel [`pool`](super::pool) by blocks of output columns; and what the blocked dense
//! kernels (`dense_f32.rs`, `dense_i16.rs`, `dense_avx2.rs`) share: their instruction-set
//! [`Level`] and the panel elements' loads ([`Elem`]).

use super::pool;
use super::SendPtr as OutPtr;

/// Which micro-kernels the blocked dense products ([`super::dense_f32::Panels`],
/// [`super::dense_i16::IntPanels`]) run: the same results at every level (see
/// `dense_avx2.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Level {
    /// AVX-512 (with VNNI for the integer products).
    Avx512,
    /// AVX2 and FMA, with AVX-VNNI's `vpdpwssd` on ymm for the integer products.
    AvxVnni,
    /// AVX2 and FMA.
    Avx2,
}

impl Level {
    /// The widest level in use here ([`super::has_avx512`], [`super::has_vnni`],
    /// [`super::has_avx2`]); `None` on other CPUs.
    pub(super) fn detect() -> Option<Self> {
        if super::has_avx512() {
            Some(Self::Avx512)
        } else if super::has_vnni() {
            Some(Self::AvxVnni)
        } else if super::has_avx2() {
            Some(Self::Avx2)
        } else {
            None
        }
    }

    /// Whether this CPU has the level's instructions, whatever the options.
    pub(super) fn runs_here(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            let avx2 = has!("avx2") && has!("fma") && has!("f16c");
            match self {
                Self::Avx512 => avx2 && has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("avx512vnni"),
                Self::AvxVnni => avx2 && has!("avxvnni"),
                Self::Avx2 => avx2,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    }

    /// The levels this CPU can run, whatever the options (for tests).
    #[cfg(test)]
    pub(super) fn all_here() -> Vec<Self> {
        [Self::Avx512, Self::AvxVnni, Self::Avx2].into_iter().filter(|l| l.runs_here()).collect()
    }
}

/// A panel's element: 32 of them widened to two vectors of f32 (16 to two of 8 for AVX2).
pub(super) trait Elem: Copy {
    #[cfg(target_arch = "x86_64")]
    unsafe fn load32(p: *const Self) -> (std::arch::x86_64::__m512, std::arch::x86_64::__m512);
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(p: *const Self) -> (std::arch::x86_64::__m256, std::arch::x86_64::__m256);
}

impl Elem for f32 {
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load32(p: *const f32) -> (std::arch::x86_64::__m512, std::arch::x86_64::__m512) {
        use std::arch::x86_64::*;
        (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16)))
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const f32) -> (std::arch::x86_64::__m256, std::arch::x86_64::__m256) {
        use std::arch::x86_64::*;
        (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)))
    }
}

impl Elem for u16 {
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load32(p: *const u16) -> (std::arch::x86_64::__m512, std::arch::x86_64::__m512) {
        use std::arch::x86_64::*;
        (_mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)), _mm512_cvtph_ps(_mm256_loadu_si256(p.add(16) as *const __m256i)))
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const u16) -> (std::arch::x86_64::__m256, std::arch::x86_64::__m256) {
        use std::arch::x86_64::*;
        (_mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)), _mm256_cvtph_ps(_mm_loadu_si128(p.add(8) as *const __m128i)))
    }
}

/// `out[m, n] = x[m, k] · w[n, k]ᵀ` (a linear layer with `w` in PyTorch's `[out, in]` layout).
/// Up to 8 rows: dot products ([`super::dot_f32`]), each weight row read once for all rows;
/// more: the `gemm` crate on each chunk of columns. Every output row is computed from its own
/// input row only, so rows do not depend on what else is in the batch (up to the last bits:
/// the two paths sum in different orders).
pub fn matmul_f32(w: &[f32], n: usize, k: usize, x: &[f32], m: usize, out: &mut [f32]) {
    assert!(w.len() >= n * k, "matmul_f32: weight is {} values, not {n} x {k}", w.len());
    assert!(x.len() >= m * k, "matmul_f32: input is {} values, not {m} x {k}", x.len());
    assert!(out.len() >= m * n, "matmul_f32: output is {} values, not {m} x {n}", out.len());
    if m == 0 || n == 0 {
        return;
    }
    let threads = pool::pool().threads();
    let chunks = if n * k * m < 64 * 1024 { 1 } else { (threads * 4).min(n.div_ceil(16)) };
    let per = n.div_ceil(chunks);
    let out_ptr = OutPtr(out.as_mut_ptr());
    let work = |c: usize| {
        let out_ptr = &out_ptr;
        let (n0, n1) = (c * per, ((c + 1) * per).min(n));
        if n0 >= n1 {
            return;
        }
        if m <= 8 {
            for j in n0..n1 {
                let wr = &w[j * k..(j + 1) * k];
                for i in 0..m {
                    // SAFETY: element (i, j) is in bounds and belongs to this chunk only.
                    unsafe { *out_ptr.0.add(i * n + j) = super::dot_f32(&x[i * k..(i + 1) * k], wr) };
                }
            }
        } else {
            // SAFETY: the pointers and strides stay inside `x`, `w` (rows n0..n1) and `out`
            // (columns n0..n1 of every row), checked above; this chunk writes only its columns.
            unsafe {
                gemm::gemm(
                    m,
                    n1 - n0,
                    k,
                    out_ptr.0.add(n0),
                    1,
                    n as isize,
                    false,
                    x.as_ptr(),
                    1,
                    k as isize,
                    w.as_ptr().add(n0 * k),
                    k as isize,
                    1,
                    0.0,
                    1.0,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                );
            }
        }
    };
    if chunks == 1 {
        work(0);
    } else {
        pool::pool().run_chunks(chunks, &work);
    }
}

/// A blocked product (`product(level, x, m, bias, gelu, out)`) whose `m` rows gave `out`
/// at `levels[0]`: the same bits at every level, without the bias too; GELU in the
/// product the same as after it; the last row alone the same as in the batch.
#[cfg(test)]
#[allow(clippy::type_complexity, clippy::too_many_arguments)]
pub(super) fn same_at_every_level(levels: &[Level], m: usize, n: usize, k: usize, out: &[f32], product: &dyn Fn(Level, &[f32], usize, Option<&[f32]>, bool, &mut [f32]), x: &[f32], bias: &[f32]) {
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<u32>>();
    let mut plain = vec![f32::NAN; m * n];
    product(levels[0], x, m, None, false, &mut plain);
    for &l in levels {
        let mut o = vec![f32::NAN; m * n];
        product(l, x, m, Some(bias), false, &mut o);
        assert!(bits(&o) == bits(out), "n={n} k={k} m={m}: {l:?} differs from {:?}", levels[0]);
        product(l, x, m, None, false, &mut o);
        assert!(bits(&o) == bits(&plain), "n={n} k={k} m={m}: {l:?} without bias differs from {:?}", levels[0]);
        let mut g = vec![0.0f32; m * n];
        product(l, x, m, Some(bias), true, &mut g);
        let mut want = out.to_vec();
        crate::kernels::gelu_erf_in_place(&mut want);
        assert!(bits(&g) == bits(&want), "n={n} k={k} m={m}: {l:?}: GELU in the product differs from GELU after it");
        let mut one = vec![0.0f32; n];
        product(l, &x[(m - 1) * k..], 1, Some(bias), false, &mut one);
        assert!(bits(&one) == bits(&out[(m - 1) * n..m * n]), "n={n} k={k} m={m}: {l:?}: the last row alone differs");
    }
}

#[cfg(test)]
mod tests {
    use super::Level;

    /// Microseconds per product at each level this CPU has, on the sentence embedders' shapes:
    /// the blocked f32 panels, the 16-bit integer panels, and [`super::matmul_f32`] (what
    /// runs without them). One thread (`SAPIENT_THREADS=1` to keep the pool to it too).
    #[test]
    #[ignore]
    fn dense_timing() {
        use super::super::{dense_f32::Panels, dense_i16::IntPanels};
        let best = |f: &mut dyn FnMut()| {
            f();
            (0..5).map(|_| {
                let t = std::time::Instant::now();
                f();
                t.elapsed().as_secs_f64() * 1e6
            }).fold(f64::INFINITY, f64::min)
        };
        for (n, k) in [(1152usize, 384usize), (1536, 384), (384, 1536), (3072, 768), (768, 3072)] {
            let w: Vec<f32> = (0..n * k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 61.0).collect();
            let (f, q) = (Panels::new(n, k, |r, c| w[r * k + c]), IntPanels::new(n, k, |r, c| w[r * k + c]));
            for m in [30usize, 240, 960] {
                let x: Vec<f32> = (0..m * k).map(|i| ((i * 13 % 47) as f32 - 23.0) / 17.0).collect();
                let mut out = vec![0.0f32; m * n];
                let mut line = format!("{n}x{k} m={m}: matmul_f32 {:.0}", best(&mut || super::matmul_f32(&w, n, k, &x, m, &mut out)));
                for l in Level::all_here() {
                    let tf = best(&mut || f.matmul_at(l, &x, m, None, false, &mut out));
                    let ti = best(&mut || q.matmul_at(l, &x, m, None, false, &mut out));
                    line += &format!(" | {l:?}: f32 {tf:.0} i16 {ti:.0}");
                }
                eprintln!("{line}");
            }
        }
    }

    #[test]
    fn matches_f64_reference_for_few_and_many_rows() {
        let (n, k) = (70, 53);
        let w: Vec<f32> = (0..n * k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 61.0).collect();
        for m in [1usize, 3, 8, 9, 40] {
            let x: Vec<f32> = (0..m * k).map(|i| ((i * 13 % 47) as f32 - 23.0) / 17.0).collect();
            let mut out = vec![0.0f32; m * n];
            super::matmul_f32(&w, n, k, &x, m, &mut out);
            for i in 0..m {
                for j in 0..n {
                    let r: f64 = (0..k).map(|t| x[i * k + t] as f64 * w[j * k + t] as f64).sum();
                    assert!((out[i * n + j] as f64 - r).abs() < 1e-4, "m={m} ({i},{j}): {} vs {r}", out[i * n + j]);
                }
            }
        }
    }
}
