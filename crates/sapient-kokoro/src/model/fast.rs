//! Plain-buffer kernels of the generator's hot loop: transposes between `[c, t]` and the
//! time-major `[t, c]` layout the convolutions run in, and the fused instance norm + style
//! affine + Snake over time-major buffers, on the kernels' thread pool.

use sapient_tensor::kernels::{bf16_bits, pool::pool};

/// `x` `[rows, cols]` -> `[cols, rows]`.
pub fn transpose(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    debug_assert_eq!(x.len(), rows * cols);
    let mut out = vec![0f32; rows * cols];
    if rows == 0 || cols == 0 {
        return out;
    }
    const B: usize = 32;
    // one chunk per block of B output rows (input columns)
    pool().for_each_chunk_mut(&mut out, B * rows, |cb, o| {
        let c0 = cb * B;
        let nc = o.len() / rows;
        for r0 in (0..rows).step_by(B) {
            let r1 = (r0 + B).min(rows);
            for dc in 0..nc {
                let orow = &mut o[dc * rows..(dc + 1) * rows];
                for r in r0..r1 {
                    orow[r] = x[r * cols + c0 + dc];
                }
            }
        }
    });
    out
}

/// LeakyReLU in place.
pub fn leaky_relu_in_place(x: &mut [f32], slope: f32) {
    for v in x {
        *v = v.max(*v * slope);
    }
}

/// Per-channel mean and variance over time of a time-major `[t, c]` buffer (f64 sums).
fn channel_stats(x: &[f32], t: usize, c: usize) -> (Vec<f64>, Vec<f64>) {
    const ROWS: usize = 256;
    let chunks = t.div_ceil(ROWS);
    let x0: Vec<f64> = x[..c].iter().map(|&v| f64::from(v)).collect();
    // per chunk: sum and sum of squares of x - x0 (shifted for accuracy)
    let mut part = vec![0f64; chunks * 2 * c];
    pool().for_each_chunk_mut(&mut part, 2 * c, |ci, p| {
        let (s1, s2) = p.split_at_mut(c);
        for r in ci * ROWS..((ci + 1) * ROWS).min(t) {
            for (((a, b), &v), &z) in s1.iter_mut().zip(s2.iter_mut()).zip(&x[r * c..(r + 1) * c]).zip(&x0) {
                let d = f64::from(v) - z;
                *a += d;
                *b += d * d;
            }
        }
    });
    let n = t as f64;
    let mut mean = vec![0f64; c];
    let mut var = vec![0f64; c];
    for p in part.chunks_exact(2 * c) {
        for j in 0..c {
            mean[j] += p[j];
            var[j] += p[c + j];
        }
    }
    for j in 0..c {
        let m = mean[j] / n;
        var[j] = (var[j] / n - m * m).max(0.0);
        mean[j] = x0[j] + m;
    }
    (mean, var)
}

/// Lays out `dst` as `frames` bf16 frames of `ld` values with the data in frames
/// `front..front + t`: the frames around it zero (the convolution's padding), the values
/// past `c` in each data frame zero. `fill(row, dst_row)` writes one data frame's `ld`
/// values (rows in parallel on the pool).
fn bf16_frames(dst: &mut Vec<u16>, t: usize, ld: usize, front: usize, frames: usize, fill: impl Fn(usize, &mut [u16]) + Sync) {
    debug_assert!(front + t <= frames);
    dst.resize(frames * ld, 0);
    dst[..front * ld].fill(0);
    dst[(front + t) * ld..].fill(0);
    const ROWS: usize = 64;
    pool().for_each_chunk_mut(&mut dst[front * ld..(front + t) * ld], ROWS * ld, |ci, o| {
        for (j, row) in o.chunks_exact_mut(ld).enumerate() {
            fill(ci * ROWS + j, row);
        }
    });
}

/// A time-major `[t, c]` f32 buffer as bf16 frames (see [`bf16_frames`]).
pub fn to_bf16_frames(x: &[f32], t: usize, c: usize, dst: &mut Vec<u16>, ld: usize, front: usize, frames: usize) {
    bf16_frames(dst, t, ld, front, frames, |r, row| {
        for (o, &v) in row.iter_mut().zip(&x[r * c..(r + 1) * c]) {
            *o = bf16_bits(v);
        }
        row[c..].fill(0);
    });
}

/// [`norm_snake_tc`] written as bf16 frames for a convolution (see [`bf16_frames`]).
#[allow(clippy::too_many_arguments)]
pub fn norm_snake_tc_bf16(
    x: &[f32],
    t: usize,
    scale: &[f32],
    beta: &[f32],
    alpha: &[f32],
    inv_alpha: &[f32],
    dst: &mut Vec<u16>,
    (ld, front, frames): (usize, usize, usize),
) {
    let c = scale.len();
    debug_assert_eq!(x.len(), t * c);
    let (a, b) = norm_coefficients(x, t, scale, beta);
    bf16_frames(dst, t, ld, front, frames, |r, row| {
        snake_row_bf16(&x[r * c..(r + 1) * c], &a, &b, alpha, inv_alpha, row);
    });
}

/// Instance norm over time (eps 1e-5), then `scale * x + beta`, then LeakyReLU(`slope`), of
/// a time-major `[t, c]` buffer.
pub fn norm_leaky_tc(x: &[f32], t: usize, scale: &[f32], beta: &[f32], slope: f32) -> Vec<f32> {
    let c = scale.len();
    debug_assert_eq!(x.len(), t * c);
    let (a, b) = norm_coefficients(x, t, scale, beta);
    let mut out = vec![0f32; x.len()];
    const ROWS: usize = 64;
    pool().for_each_chunk_mut(&mut out, ROWS * c, |ci, o| {
        let xs = &x[ci * ROWS * c..ci * ROWS * c + o.len()];
        for (orow, xrow) in o.chunks_exact_mut(c).zip(xs.chunks_exact(c)) {
            for (((o, &v), &a), &b) in orow.iter_mut().zip(xrow).zip(&a).zip(&b) {
                let y = v.mul_add(a, b);
                *o = y.max(y * slope);
            }
        }
    });
    out
}

/// [`norm_leaky_tc`] written as bf16 frames for a convolution (see [`bf16_frames`]).
#[allow(clippy::too_many_arguments)]
pub fn norm_leaky_tc_bf16(x: &[f32], t: usize, scale: &[f32], beta: &[f32], slope: f32, dst: &mut Vec<u16>, (ld, front, frames): (usize, usize, usize)) {
    let c = scale.len();
    debug_assert_eq!(x.len(), t * c);
    let (a, b) = norm_coefficients(x, t, scale, beta);
    bf16_frames(dst, t, ld, front, frames, |r, row| {
        let (o, rest) = row.split_at_mut(c);
        for (((o, &v), &a), &b) in o.iter_mut().zip(&x[r * c..(r + 1) * c]).zip(&a).zip(&b) {
            let y = v.mul_add(a, b);
            *o = bf16_bits(y.max(y * slope));
        }
        rest.fill(0);
    });
}

/// Per channel `a`, `b` such that `a x + b` is the instance norm (eps 1e-5) then the affine.
fn norm_coefficients(x: &[f32], t: usize, scale: &[f32], beta: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let c = scale.len();
    let (mean, var) = channel_stats(x, t, c);
    let mut a = vec![0f32; c];
    let mut b = vec![0f32; c];
    for j in 0..c {
        let inv = 1.0 / (var[j] + 1e-5).sqrt();
        a[j] = (f64::from(scale[j]) * inv) as f32;
        b[j] = (f64::from(beta[j]) - mean[j] * f64::from(scale[j]) * inv) as f32;
    }
    (a, b)
}

/// Instance norm over time (eps 1e-5), then `scale * x + beta`, then Snake
/// (`y + 1/alpha sin(alpha y)^2`), of a time-major `[t, c]` buffer.
pub fn norm_snake_tc(x: &[f32], t: usize, scale: &[f32], beta: &[f32], alpha: &[f32], inv_alpha: &[f32]) -> Vec<f32> {
    let c = scale.len();
    debug_assert_eq!(x.len(), t * c);
    let (a, b) = norm_coefficients(x, t, scale, beta);
    let mut out = vec![0f32; x.len()];
    const ROWS: usize = 64;
    pool().for_each_chunk_mut(&mut out, ROWS * c, |ci, o| {
        let xs = &x[ci * ROWS * c..ci * ROWS * c + o.len()];
        for (orow, xrow) in o.chunks_exact_mut(c).zip(xs.chunks_exact(c)) {
            snake_row(xrow, &a, &b, alpha, inv_alpha, orow);
        }
    });
    out
}

sapient_tensor::simd_dispatch! {
    fn snake_row(x: &[f32], a: &[f32], b: &[f32], al: &[f32], ia: &[f32], out: &mut [f32]) = snake_portable for [has_avx512("avx512f,avx2,fma"), has_avx2("avx2,fma")];
}

sapient_tensor::simd_dispatch! {
    fn snake_row_bf16(x: &[f32], a: &[f32], b: &[f32], al: &[f32], ia: &[f32], out: &mut [u16]) = snake_bf16_portable for [has_avx512("avx512f,avx512bw,avx2,fma")];
}

/// Snake of one row to bf16: the first `x.len()` values of `out`, zeros after them.
#[inline(always)]
fn snake_bf16_portable(x: &[f32], a: &[f32], b: &[f32], al: &[f32], ia: &[f32], out: &mut [u16]) {
    let n = x.len();
    let (a, b, al, ia) = (&a[..n], &b[..n], &al[..n], &ia[..n]);
    let (o, rest) = out.split_at_mut(n);
    for j in 0..n {
        let y = x[j].mul_add(a[j], b[j]);
        let s = sin_sq(al[j] * y);
        let v = ia[j].mul_add(s, y).to_bits();
        o[j] = (v.wrapping_add(0x7FFF + ((v >> 16) & 1)) >> 16) as u16;
    }
    rest.fill(0);
}

#[inline(always)]
fn snake_portable(x: &[f32], a: &[f32], b: &[f32], al: &[f32], ia: &[f32], out: &mut [f32]) {
    let n = out.len();
    let (x, a, b, al, ia) = (&x[..n], &a[..n], &b[..n], &al[..n], &ia[..n]);
    for j in 0..n {
        let y = x[j].mul_add(a[j], b[j]);
        let s = sin_sq(al[j] * y);
        out[j] = ia[j].mul_add(s, y);
    }
}

/// `sin(z)^2`, branch-free so it vectorises: `z - j pi` with `j` the nearest integer to
/// `z / pi` (Cody-Waite, three parts of pi), then the Taylor series of sin to the 11th
/// power on [-pi/2, pi/2] (error below 6e-8).
#[inline(always)]
pub fn sin_sq(z: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer
    let j = (z * std::f32::consts::FRAC_1_PI + MAGIC) - MAGIC;
    let r = j.mul_add(-3.140_625, z);
    let r = j.mul_add(-9.675_026e-4, r);
    let r = j.mul_add(-1.509_958e-7, r);
    let r2 = r * r;
    let mut p = -2.505_210_8e-8f32; // -1/11!
    p = p.mul_add(r2, 2.755_731_9e-6); // 1/9!
    p = p.mul_add(r2, -1.984_127e-4); // -1/7!
    p = p.mul_add(r2, 8.333_333e-3); // 1/5!
    p = p.mul_add(r2, -0.166_666_67); // -1/3!
    let s = (p * r2).mul_add(r, r);
    s * s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sin_sq_matches_libm() {
        let mut worst = 0f32;
        for i in -200_000..200_000 {
            let z = i as f32 * 1.37e-3;
            let e = (sin_sq(z) - z.sin().powi(2)).abs();
            worst = worst.max(e);
        }
        assert!(worst < 1e-6, "worst {worst}");
    }

    #[test]
    fn transpose_round_trip() {
        let (r, c) = (37, 70);
        let x: Vec<f32> = (0..r * c).map(|v| v as f32).collect();
        let t = transpose(&x, r, c);
        assert_eq!(t[5 * r + 3], x[3 * c + 5]);
        assert_eq!(transpose(&t, c, r), x);
    }
}
