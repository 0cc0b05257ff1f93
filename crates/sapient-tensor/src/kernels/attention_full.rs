//! Full (non-causal) self-attention of an encoder, fused: scores, softmax and the product
//! with the values of a few query rows at a time, with no `[n, n]` score matrix in memory.
//! Two variants with the same structure and interface:
//!
//! - [`attention_f32`] (AVX-512 F): every value and sum in f32, as an unfused f32 attention
//!   (only the order of the sums differs).
//! - [`attention_bf16`] (AVX512-BF16, `vdpbf16ps`): queries, keys, values and the softmax's
//!   probabilities rounded to bf16, every sum in f32 (about the accuracy of 8-bit quantized
//!   products, at twice the f32 FMA rate).
//!
//! Keys and values are packed once per call (per head, zero past the last position): keys as
//! groups of 16 positions, for each head channel (f32) or pair of channels (bf16) one
//! 64-byte row holding it for the 16 positions; values as, for each position (f32) or pair of
//! positions (bf16), the 64 head channels. A unit of the kernel pool is one head and
//! [`QUERY_ROWS`] query rows, taken [`R`] rows at a time: their scores against all keys (`R`
//! x 64 sums in registers, each query value or pair broadcast), the softmax in f32 (rounded
//! to bf16 for the bf16 variant), the products with the values (`R` x 64 sums in registers),
//! scaled by the softmax's `1 / sum` as they are written. The head's packed keys and values
//! (at 1500 positions a quarter of a megabyte in bf16, twice that in f32) stay in L2 while its
//! units pass over them; a unit's scores stay in L1.

use super::{pool, SendPtr};
use std::cell::RefCell;

/// The head size these kernels take (every Whisper size has it).
pub const FULL_HEAD_DIM: usize = 64;
const HD: usize = FULL_HEAD_DIM;
/// Query rows per step (`R` x 4 sums in registers).
const R: usize = 6;
/// Query rows per unit of the pool.
const QUERY_ROWS: usize = 8 * R;
/// Key groups of 16 per step of the scores.
const KG: usize = 4;

thread_local! {
    /// A unit's scores (`R` rows of the padded positions, f32) and bf16 probabilities.
    static SCORES: RefCell<(Vec<f32>, Vec<u16>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Whether [`attention_bf16`] runs here (AVX512-BF16, [`super::has_avx512_bf16`]).
pub fn has_attention_bf16() -> bool {
    super::has_avx512_bf16()
}

/// Whether [`attention_f32`] runs here (the AVX-512 kernels, [`super::has_avx512`]).
pub fn has_attention_f32() -> bool {
    super::has_avx512()
}

/// Full attention of `n` positions over `heads` heads of [`FULL_HEAD_DIM`] channels, in
/// bf16 products (see the module docs): row `i` of `qkv` (rows `ld` values apart) holds
/// position `i`'s queries at `0..d`, keys at `d..2d` and values at `2d..3d` (`d = heads *
/// 64`, head `h` at `64 h` within each); `out[i, h * 64 + c]` (`[n, d]`) is head `h`'s
/// softmax(`scale` q·kᵀ)·v. `packed` is the caller's buffer for the packed keys and values,
/// kept between calls. Returns `false` (and leaves `out` alone) where AVX512-BF16 does not
/// run here.
#[allow(clippy::too_many_arguments)]
pub fn attention_bf16(qkv: &[f32], ld: usize, n: usize, heads: usize, scale: f32, packed: &mut Vec<u16>, out: &mut [f32]) -> bool {
    if !has_attention_bf16() {
        return false;
    }
    full::<u16>(qkv, ld, n, heads, scale, packed, out);
    true
}

/// [`attention_bf16`]'s computation with every value in f32 (AVX-512 F): the result of an
/// f32 attention up to the order of its sums. Returns `false` (and leaves `out` alone) where
/// the AVX-512 kernels do not run here.
#[allow(clippy::too_many_arguments)]
pub fn attention_f32(qkv: &[f32], ld: usize, n: usize, heads: usize, scale: f32, packed: &mut Vec<f32>, out: &mut [f32]) -> bool {
    if !has_attention_f32() {
        return false;
    }
    full::<f32>(qkv, ld, n, heads, scale, packed, out);
    true
}

/// The packed element of a variant: bf16 bits (`u16`) or `f32`.
trait Elem: Copy + Default + Send + Sync + 'static {
    /// Pack group `g` of head `h` into `dst` (the head's buffer of `2 np 64` elements).
    ///
    /// # Safety
    /// The CPU has the variant's instructions; `dst` holds the head's buffer.
    #[cfg(target_arch = "x86_64")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn pack_group(qkv: &[f32], ld: usize, n: usize, d: usize, h: usize, g: usize, dst: *mut Self, np: usize);
    /// Query rows `r0..r1` of head `h` over its packed keys and values `kv`.
    ///
    /// # Safety
    /// As [`Elem::pack_group`]; `s` and `p` hold `R * np` values; the unit writes rows
    /// `r0..r1` of head `h`'s columns of `out` only.
    #[cfg(target_arch = "x86_64")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn unit(qkv: &[f32], ld: usize, n: usize, np: usize, d: usize, h: usize, rows: (usize, usize), scale: f32, kv: &[Self], s: &mut [f32], p: &mut [u16], out: *mut f32);
}

#[cfg(target_arch = "x86_64")]
impl Elem for u16 {
    unsafe fn pack_group(qkv: &[f32], ld: usize, n: usize, d: usize, h: usize, g: usize, dst: *mut u16, np: usize) {
        pack_group_bf16(qkv, ld, n, d, h, g, dst, np)
    }
    unsafe fn unit(qkv: &[f32], ld: usize, n: usize, np: usize, d: usize, h: usize, rows: (usize, usize), scale: f32, kv: &[u16], s: &mut [f32], p: &mut [u16], out: *mut f32) {
        unit_bf16(qkv, ld, n, np, d, h, rows, scale, kv, s, p, out)
    }
}

#[cfg(target_arch = "x86_64")]
impl Elem for f32 {
    unsafe fn pack_group(qkv: &[f32], ld: usize, n: usize, d: usize, h: usize, g: usize, dst: *mut f32, np: usize) {
        pack_group_f32(qkv, ld, n, d, h, g, dst, np)
    }
    unsafe fn unit(qkv: &[f32], ld: usize, n: usize, np: usize, d: usize, h: usize, rows: (usize, usize), scale: f32, kv: &[f32], s: &mut [f32], _p: &mut [u16], out: *mut f32) {
        unit_f32(qkv, ld, n, np, d, h, rows, scale, kv, s, out)
    }
}

#[cfg(not(target_arch = "x86_64"))]
impl Elem for u16 {}
#[cfg(not(target_arch = "x86_64"))]
impl Elem for f32 {}

/// The driver of both variants (the caller checked the instructions).
#[allow(clippy::too_many_arguments)]
fn full<T: Elem>(qkv: &[f32], ld: usize, n: usize, heads: usize, scale: f32, packed: &mut Vec<T>, out: &mut [f32]) {
    let d = heads * HD;
    assert!(ld >= 3 * d, "attention: rows of {ld} values hold no {heads} heads of q, k and v");
    assert!(n == 0 || qkv.len() >= (n - 1) * ld + 3 * d, "attention: qkv is {} values, not {n} rows of {ld}", qkv.len());
    assert!(out.len() >= n * d, "attention: output is {} values, not {n} x {d}", out.len());
    if n == 0 || heads == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    {
        // Positions padded to whole steps of the scores (KG groups of 16).
        let np = n.div_ceil(16 * KG) * 16 * KG;
        let per_head = 2 * np * HD;
        if packed.len() < heads * per_head {
            packed.resize(heads * per_head, T::default());
        }
        let groups = np / 16;
        let pk = SendPtr(packed.as_mut_ptr());
        // Pack: units of one head and 16 positions (their keys' group, their values).
        pool::pool().run_chunks(heads * groups, &|u| {
            let (h, g) = (u / groups, u % groups);
            // SAFETY: unit (h, g) writes only group g of head h's keys and values (positions
            // 16g..16g + 16), inside `packed` (heads * per_head values).
            unsafe { T::pack_group(qkv, ld, n, d, h, g, pk.ptr().add(h * per_head), np) };
        });
        let blocks = n.div_ceil(QUERY_ROWS);
        let o = SendPtr(out.as_mut_ptr());
        let packed = &packed[..];
        pool::pool().run_chunks(heads * blocks, &|u| {
            let (h, b) = (u / blocks, u % blocks);
            let (r0, r1) = (b * QUERY_ROWS, ((b + 1) * QUERY_ROWS).min(n));
            SCORES.with(|sc| {
                let mut sc = sc.borrow_mut();
                let (s, p) = &mut *sc;
                if s.len() < R * np {
                    s.resize(R * np, 0.0);
                }
                if p.len() < R * np {
                    p.resize(R * np, 0);
                }
                let kv = &packed[h * per_head..(h + 1) * per_head];
                // SAFETY: the caller checked the variant's instructions; the unit writes rows
                // r0..r1 of head h's columns of `out` only.
                unsafe { T::unit(qkv, ld, n, np, d, h, (r0, r1), scale, kv, s, p, o.ptr()) };
            });
        });
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (scale, packed, out);
}

/// Group `g` (positions `16 g ..`) of head `h`'s keys and values into `dst` (the head's
/// packed buffer: `np * 64` key values, then `np * 64` value values), zero past `n`.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn pack_group_f32(qkv: &[f32], ld: usize, n: usize, d: usize, h: usize, g: usize, dst: *mut f32, np: usize) {
    // keys: [g][channel][16 positions]
    let kd = dst.add(g * 16 * HD);
    // values: [position][64 channels]
    let vd = dst.add(np * HD);
    for c in 0..16 {
        let j = g * 16 + c;
        if j < n {
            let k = &qkv[j * ld + d + h * HD..][..HD];
            for (r, &kv) in k.iter().enumerate() {
                *kd.add(r * 16 + c) = kv;
            }
            std::ptr::copy_nonoverlapping(qkv[j * ld + 2 * d + h * HD..][..HD].as_ptr(), vd.add(j * HD), HD);
        } else {
            for r in 0..HD {
                *kd.add(r * 16 + c) = 0.0;
            }
            std::ptr::write_bytes(vd.add(j * HD), 0, HD);
        }
    }
}

/// The softmax of score row `row` (`n` values) in place, unnormalised (`e^(s - max)`);
/// returns `1 / sum`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn softmax_row(row: &mut [f32]) -> f32 {
    use std::arch::x86_64::*;
    let mut m = _mm512_set1_ps(f32::NEG_INFINITY);
    let mut c = row.chunks_exact(16);
    for v in &mut c {
        m = _mm512_max_ps(m, _mm512_loadu_ps(v.as_ptr()));
    }
    let mut max = _mm512_reduce_max_ps(m);
    for &v in c.remainder() {
        max = max.max(v);
    }
    for v in row.iter_mut() {
        *v -= max;
    }
    super::exp_in_place(row);
    let mut sum = _mm512_setzero_ps();
    let full = row.len() / 16 * 16;
    for j in (0..full).step_by(16) {
        sum = _mm512_add_ps(sum, _mm512_loadu_ps(row.as_ptr().add(j)));
    }
    let mut total = _mm512_reduce_add_ps(sum);
    for &v in &row[full..] {
        total += v;
    }
    1.0 / total
}

/// [`Elem::unit`] in f32.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
unsafe fn unit_f32(qkv: &[f32], ld: usize, n: usize, np: usize, d: usize, h: usize, (r0, r1): (usize, usize), scale: f32, kv: &[f32], s: &mut [f32], out: *mut f32) {
    use std::arch::x86_64::*;
    let keys = kv.as_ptr();
    let vals = kv.as_ptr().add(np * HD);
    let mut q = [[0f32; HD]; R];
    for i0 in (r0..r1).step_by(R) {
        let rr = (r1 - i0).min(R);
        for (i, qi) in q.iter_mut().enumerate() {
            if i < rr {
                let row = &qkv[(i0 + i) * ld + h * HD..][..HD];
                for (v, x) in qi.iter_mut().zip(row) {
                    *v = x * scale;
                }
            } else {
                *qi = [0.0; HD];
            }
        }
        // scores: R rows x KG groups of 16 positions per step
        for g0 in (0..np / 16).step_by(KG) {
            let mut acc = [[_mm512_setzero_ps(); KG]; R];
            let kg = keys.add(g0 * 16 * HD);
            for r in 0..HD {
                let mut b = [_mm512_setzero_ps(); KG];
                for (t, bt) in b.iter_mut().enumerate() {
                    *bt = _mm512_loadu_ps(kg.add(t * 16 * HD + r * 16));
                }
                for i in 0..R {
                    let a = _mm512_set1_ps(q[i][r]);
                    for t in 0..KG {
                        acc[i][t] = _mm512_fmadd_ps(a, b[t], acc[i][t]);
                    }
                }
            }
            for (i, acc_i) in acc.iter().enumerate().take(rr) {
                for (t, a) in acc_i.iter().enumerate() {
                    _mm512_storeu_ps(s.as_mut_ptr().add(i * np + (g0 + t) * 16), *a);
                }
            }
        }
        // softmax (unnormalised; 1 / sum applied to the output); zero weights past `n`
        let mut inv = [0f32; R];
        for i in 0..R {
            if i >= rr {
                s[i * np..(i + 1) * np].fill(0.0);
                continue;
            }
            inv[i] = softmax_row(&mut s[i * np..i * np + n]);
            s[i * np + n..(i + 1) * np].fill(0.0);
        }
        // probabilities x values: R rows x 64 channels
        let mut acc = [[_mm512_setzero_ps(); HD / 16]; R];
        let sp = s.as_ptr();
        for j in 0..n {
            let vr = vals.add(j * HD);
            let b = [_mm512_loadu_ps(vr), _mm512_loadu_ps(vr.add(16)), _mm512_loadu_ps(vr.add(32)), _mm512_loadu_ps(vr.add(48))];
            for i in 0..R {
                let a = _mm512_set1_ps(*sp.add(i * np + j));
                for t in 0..HD / 16 {
                    acc[i][t] = _mm512_fmadd_ps(a, b[t], acc[i][t]);
                }
            }
        }
        for (i, acc_i) in acc.iter().enumerate().take(rr) {
            let sc = _mm512_set1_ps(inv[i]);
            let dst = out.add((i0 + i) * d + h * HD);
            for (t, a) in acc_i.iter().enumerate() {
                _mm512_storeu_ps(dst.add(16 * t), _mm512_mul_ps(*a, sc));
            }
        }
    }
}

/// Group `g` (positions `16 g ..`) of head `h`'s keys and values into `dst` (the head's
/// packed buffer: `np * 64` key values, then `np * 64` value values), zero past `n`.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn pack_group_bf16(qkv: &[f32], ld: usize, n: usize, d: usize, h: usize, g: usize, dst: *mut u16, np: usize) {
    use super::bf16_bits;
    let pair = |a: f32, b: f32| bf16_bits(a) as u32 | (bf16_bits(b) as u32) << 16;
    // keys: [g][r][16 positions] pairs
    let kd = dst.add(g * 16 * HD) as *mut u32;
    for c in 0..16 {
        let j = g * 16 + c;
        if j < n {
            let k = &qkv[j * ld + d + h * HD..][..HD];
            for r in 0..HD / 2 {
                *kd.add(r * 16 + c) = pair(k[2 * r], k[2 * r + 1]);
            }
        } else {
            for r in 0..HD / 2 {
                *kd.add(r * 16 + c) = 0;
            }
        }
    }
    // values: [pair of positions][64 channels] pairs
    let vd = dst.add(np * HD) as *mut u32;
    for jp in g * 8..g * 8 + 8 {
        let row = |j: usize| (j < n).then(|| &qkv[j * ld + 2 * d + h * HD..][..HD]);
        let (v0, v1) = (row(2 * jp), row(2 * jp + 1));
        for c in 0..HD {
            let a = v0.map_or(0.0, |v| v[c]);
            let b = v1.map_or(0.0, |v| v[c]);
            *vd.add(jp * HD + c) = pair(a, b);
        }
    }
}

/// [`Elem::unit`] in bf16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
unsafe fn unit_bf16(qkv: &[f32], ld: usize, n: usize, np: usize, d: usize, h: usize, (r0, r1): (usize, usize), scale: f32, kv: &[u16], s: &mut [f32], p: &mut [u16], out: *mut f32) {
    use std::arch::x86_64::*;
    let keys = kv.as_ptr() as *const u32;
    let vals = kv.as_ptr().add(np * HD) as *const u32;
    let mut q = [[0u32; HD / 2]; R];
    for i0 in (r0..r1).step_by(R) {
        let rr = (r1 - i0).min(R);
        for (i, qi) in q.iter_mut().enumerate() {
            if i < rr {
                let row = &qkv[(i0 + i) * ld + h * HD..][..HD];
                for (r, v) in qi.iter_mut().enumerate() {
                    *v = super::bf16_bits(row[2 * r] * scale) as u32 | (super::bf16_bits(row[2 * r + 1] * scale) as u32) << 16;
                }
            } else {
                *qi = [0; HD / 2];
            }
        }
        // scores: R rows x KG groups of 16 positions per step
        for g0 in (0..np / 16).step_by(KG) {
            let mut acc = [[_mm512_setzero_ps(); KG]; R];
            let kg = keys.add(g0 * 16 * HD / 2);
            for r in 0..HD / 2 {
                let mut b = [_mm512_setzero_si512(); KG];
                for (t, bt) in b.iter_mut().enumerate() {
                    *bt = _mm512_loadu_si512(kg.add(t * 16 * HD / 2 + r * 16) as *const _);
                }
                for i in 0..R {
                    let a: __m512bh = std::mem::transmute(_mm512_set1_epi32(q[i][r] as i32));
                    for t in 0..KG {
                        acc[i][t] = _mm512_dpbf16_ps(acc[i][t], a, std::mem::transmute::<__m512i, __m512bh>(b[t]));
                    }
                }
            }
            for (i, acc_i) in acc.iter().enumerate().take(rr) {
                for (t, a) in acc_i.iter().enumerate() {
                    _mm512_storeu_ps(s.as_mut_ptr().add(i * np + (g0 + t) * 16), *a);
                }
            }
        }
        // softmax (unnormalised; 1 / sum applied to the output), rounded to bf16
        let mut inv = [0f32; R];
        for i in 0..R {
            let pr = p.as_mut_ptr().add(i * np);
            if i >= rr {
                std::ptr::write_bytes(pr, 0, np);
                continue;
            }
            let row = &mut s[i * np..i * np + n];
            inv[i] = softmax_row(row);
            let full = n / 16 * 16;
            for j in (0..full).step_by(16) {
                let v = _mm512_loadu_ps(row.as_ptr().add(j));
                _mm256_storeu_si256(pr.add(j) as *mut __m256i, std::mem::transmute::<__m256bh, __m256i>(_mm512_cvtneps_pbh(v)));
            }
            for j in full..n {
                *pr.add(j) = super::bf16_bits(row[j]);
            }
            std::ptr::write_bytes(pr.add(n), 0, np - n);
        }
        // probabilities x values: R rows x 64 channels
        let mut acc = [[_mm512_setzero_ps(); HD / 16]; R];
        let pp = p.as_ptr() as *const u32;
        for jp in 0..np / 2 {
            let vr = vals.add(jp * HD);
            let b = [
                _mm512_loadu_si512(vr as *const _),
                _mm512_loadu_si512(vr.add(16) as *const _),
                _mm512_loadu_si512(vr.add(32) as *const _),
                _mm512_loadu_si512(vr.add(48) as *const _),
            ];
            for i in 0..R {
                let a: __m512bh = std::mem::transmute(_mm512_set1_epi32(*pp.add(i * np / 2 + jp) as i32));
                for t in 0..HD / 16 {
                    acc[i][t] = _mm512_dpbf16_ps(acc[i][t], a, std::mem::transmute::<__m512i, __m512bh>(b[t]));
                }
            }
        }
        for (i, acc_i) in acc.iter().enumerate().take(rr) {
            let sc = _mm512_set1_ps(inv[i]);
            let dst = out.add((i0 + i) * d + h * HD);
            for (t, a) in acc_i.iter().enumerate() {
                _mm512_storeu_ps(dst.add(16 * t), _mm512_mul_ps(*a, sc));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{attention_bf16, attention_f32, FULL_HEAD_DIM};

    /// Both variants against an f64 reference on the same inputs: the bf16 roundings of q, k,
    /// v and the probabilities keep each output within a small fraction of the values'
    /// magnitude; f32 within f32 rounding.
    #[test]
    fn matches_f64_attention() {
        for &(n, heads) in &[(1usize, 1usize), (7, 2), (70, 1), (301, 3)] {
            let d = heads * FULL_HEAD_DIM;
            let ld = 3 * d + 5;
            let qkv: Vec<f32> = (0..n * ld).map(|i| ((i * 37 % 101) as f32 - 50.0) / 40.0 + (i as f32 * 1e-3).sin()).collect();
            let scale = 1.0 / (FULL_HEAD_DIM as f32).sqrt();
            let mut want = vec![0f64; n * d];
            for h in 0..heads {
                for i in 0..n {
                    let q = &qkv[i * ld + h * 64..][..64];
                    let s: Vec<f64> = (0..n)
                        .map(|j| {
                            let k = &qkv[j * ld + d + h * 64..][..64];
                            q.iter().zip(k).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() * scale as f64
                        })
                        .collect();
                    let max = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = s.iter().map(|v| (v - max).exp()).collect();
                    let total: f64 = e.iter().sum();
                    for c in 0..64 {
                        want[i * d + h * 64 + c] = (0..n).map(|j| e[j] / total * qkv[j * ld + 2 * d + h * 64 + c] as f64).sum();
                    }
                }
            }
            let check = |name: &str, out: &[f32], tol: f64| {
                assert_eq!(out[n * d..], [7.0; 3], "{name}: wrote past the output");
                for (i, (&got, &w)) in out[..n * d].iter().zip(&want).enumerate() {
                    assert!((got as f64 - w).abs() < tol, "{name} n {n}: output {i}: {got} vs {w}");
                }
            };
            let mut out = vec![7.0f32; n * d + 3];
            if attention_bf16(&qkv, ld, n, heads, scale, &mut Vec::new(), &mut out) {
                check("bf16", &out, 0.03);
            } else {
                eprintln!("no AVX512-BF16 here: bf16 not tested");
            }
            let mut out = vec![7.0f32; n * d + 3];
            // The packed buffer is reused between calls of different sizes.
            let mut packed = vec![1.0f32; 5];
            if attention_f32(&qkv, ld, n, heads, scale, &mut packed, &mut out) {
                check("f32", &out, 2e-5);
                let mut again = vec![7.0f32; n * d + 3];
                assert!(attention_f32(&qkv, ld, n, heads, scale, &mut packed, &mut again));
                assert_eq!(out, again, "f32 n {n}: the same inputs gave different outputs");
            } else {
                eprintln!("no AVX-512 here: f32 not tested");
            }
        }
    }
}
