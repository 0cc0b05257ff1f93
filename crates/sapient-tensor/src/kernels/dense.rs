//! Dense f32 matrix products for unquantized weights (f32, or f16 widened at load), split over
//! the kernel [`pool`](super::pool) by blocks of output columns.

use super::pool;
use super::SendPtr as OutPtr;

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

#[cfg(test)]
mod tests {
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
