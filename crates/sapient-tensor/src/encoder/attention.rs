//! Full self-attention for every encoder: the dispatch between the short-sequence units
//! ([`super::short`]) and the long-sequence kernels, and the latter.

use crate::kernels::{self, pool, DenseMatrix, SendPtr};
use std::cell::RefCell;
use std::ops::Range;

/// Sequences at least this long run on the long-sequence kernels (one sequence at a time,
/// its heads and blocks of query rows over the pool); shorter ones one (sequence, head) per
/// unit with the keys in L1.
pub const LONG_SEQUENCE: usize = 192;

/// Buffers of the long-sequence kernels, kept between calls by the caller.
#[derive(Default)]
pub struct AttentionScratch {
    /// The fused AVX-512 kernel's packed keys and values.
    packed: Vec<f32>,
    /// The AMX kernel's per-head queries, keys (then values transposed), scores, output.
    hq: Vec<f32>,
    hk: Vec<f32>,
    p: Vec<f32>,
    ho: Vec<f32>,
}

/// `softmax(scale · q kᵀ) v` for each head of each sequence: row `i` of `qkv` (`3 d` values,
/// `d = heads · head_dim`) holds position `i`'s queries, keys and values side by side (head
/// `h` at `h · head_dim` within each); `seqs` are the position ranges of independent
/// sequences (each attends to its own positions only); `out` gets row `i`'s `d` values.
pub fn self_attention(qkv: &[f32], seqs: &[Range<usize>], heads: usize, head_dim: usize, scale: f32, out: &mut [f32], scratch: &mut AttentionScratch) {
    let d = heads * head_dim;
    let rows = seqs.iter().map(|s| s.end).max().unwrap_or(0);
    assert!(qkv.len() >= rows * 3 * d && out.len() >= rows * d, "self-attention: {rows} positions of {heads} x {head_dim} need {} and {} values, got {} and {}", rows * 3 * d, rows * d, qkv.len(), out.len());
    let (long, short): (Vec<Range<usize>>, Vec<Range<usize>>) = seqs.iter().filter(|s| !s.is_empty()).cloned().partition(|s| s.len() >= LONG_SEQUENCE);
    if !short.is_empty() {
        super::short::attention(qkv, &short, heads, head_dim, scale, out);
    }
    for s in long {
        let (n, ld) = (s.len(), 3 * d);
        let (q, o) = (&qkv[s.start * ld..s.end * ld], &mut out[s.start * d..s.end * d]);
        if kernels::has_amx_bf16() {
            dense(q, n, heads, head_dim, scale, scratch, o);
        } else if head_dim != kernels::FULL_HEAD_DIM || !kernels::attention_f32(q, ld, n, heads, scale, &mut scratch.packed, o) {
            blocked(q, n, heads, head_dim, scale, o);
        }
    }
}

fn grow(v: &mut Vec<f32>, n: usize) {
    if v.len() < n {
        v.resize(n, 0.0);
    }
}

/// Query rows per product of [`dense`] (a multiple of 32, the products' row tile).
const QUERY_BLOCK: usize = 512;

/// One sequence as [`DenseMatrix`] products (AMX-BF16, close to f32 accuracy), one head at a
/// time: the head's keys, then its values transposed, are packed as the product's weights;
/// each product is split over the pool.
fn dense(qkv: &[f32], n: usize, heads: usize, hd: usize, scale: f32, s: &mut AttentionScratch, out: &mut [f32]) {
    let d = heads * hd;
    let ld = 3 * d;
    let AttentionScratch { hq, hk, p, ho, .. } = s;
    grow(hq, n * hd);
    grow(hk, n * hd);
    grow(p, QUERY_BLOCK.min(n) * n);
    grow(ho, QUERY_BLOCK.min(n) * hd);
    for h in 0..heads {
        for (i, (q, k)) in hq.chunks_exact_mut(hd).zip(hk.chunks_exact_mut(hd)).take(n).enumerate() {
            let r = &qkv[i * ld..];
            for (a, b) in q.iter_mut().zip(&r[h * hd..(h + 1) * hd]) {
                *a = b * scale;
            }
            k.copy_from_slice(&r[d + h * hd..d + (h + 1) * hd]);
        }
        let keys = DenseMatrix::from_f32(&hk[..n * hd], n, hd);
        // values transposed: [hd, n]
        for (j, r) in qkv.chunks_exact(ld).take(n).enumerate() {
            for (c, v) in r[2 * d + h * hd..2 * d + (h + 1) * hd].iter().enumerate() {
                hk[c * n + j] = *v;
            }
        }
        let values = DenseMatrix::from_f32(&hk[..n * hd], hd, n);
        // blocks of query rows: the scores of one block, not of all n, in memory
        for i0 in (0..n).step_by(QUERY_BLOCK) {
            let rows = QUERY_BLOCK.min(n - i0);
            let p = &mut p[..rows * n];
            keys.matmul(&hq[i0 * hd..(i0 + rows) * hd], rows, None, p);
            pool::pool().for_each_chunk_mut(p, ROWS_PER_CHUNK * n, |_, c| c.chunks_exact_mut(n).for_each(softmax));
            values.matmul(p, rows, None, &mut ho[..rows * hd]);
            for (o, r) in out[i0 * d..(i0 + rows) * d].chunks_exact_mut(d).zip(ho.chunks_exact(hd)) {
                o[h * hd..(h + 1) * hd].copy_from_slice(r);
            }
        }
    }
}

/// Rows of scores per pool chunk of [`dense`]'s softmax.
const ROWS_PER_CHUNK: usize = 32;

/// A row of scores to probabilities in place.
fn softmax(row: &mut [f32]) {
    let inv = kernels::softmax_unnormalized(row);
    for v in row.iter_mut() {
        *v *= inv;
    }
}

thread_local! {
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Query rows per unit of [`blocked`].
const BLOCK: usize = 64;

/// One sequence in units of one head and [`BLOCK`] query rows on the pool: scaled scores
/// against all keys with the `gemm` crate, softmax, product with the values.
fn blocked(qkv: &[f32], n: usize, heads: usize, hd: usize, scale: f32, out: &mut [f32]) {
    let d = heads * hd;
    let ld = 3 * d;
    let blocks = n.div_ceil(BLOCK);
    let out_ptr = SendPtr(out.as_mut_ptr());
    let work = |u: usize| {
        let out_ptr = &out_ptr;
        let (h, blk) = (u / blocks, u % blocks);
        let (i0, i1) = (blk * BLOCK, ((blk + 1) * BLOCK).min(n));
        let rows = i1 - i0;
        SCORES.with(|sc| {
            let mut sc = sc.borrow_mut();
            grow(&mut sc, rows * n);
            let s = &mut sc[..rows * n];
            // SAFETY: operands in bounds by construction ([rows, hd] of q and [n, hd] of k and
            // v with row stride 3d inside `qkv`, [n, 3d]); each unit writes its own rows of
            // one head of `out`.
            unsafe {
                head_attention(
                    (rows, n, hd),
                    (qkv.as_ptr().add(i0 * ld + h * hd), 1, ld as isize),
                    (qkv.as_ptr().add(d + h * hd), ld as isize, 1),
                    (qkv.as_ptr().add(2 * d + h * hd), 1, ld as isize),
                    (out_ptr.ptr().add(i0 * d + h * hd), d as isize),
                    scale,
                    s,
                    |s| s.chunks_exact_mut(n).for_each(softmax),
                );
            }
        })
    };
    pool::pool().run_chunks(heads * blocks, &work);
}

/// One head's attention as two products on strided operands (`(pointer, column stride, row
/// stride)` in elements): `s = scale * q k^T` ([rows, src] in `s`), `between(s)` (the softmax,
/// and whatever must see the scores before it), then `out = s v` (`(pointer, row stride)`,
/// unit column stride). `dims` = (rows, src, head dim).
///
/// # Safety
/// `q` is [rows, hd], `k` [hd, src] and `v` [src, hd] readable at their strides; `out` is
/// [rows, hd] writable at its row stride, by this call alone; `s` holds rows * src values.
#[allow(clippy::too_many_arguments)]
pub unsafe fn head_attention(
    (rows, src, hd): (usize, usize, usize),
    q: (*const f32, isize, isize),
    k: (*const f32, isize, isize),
    v: (*const f32, isize, isize),
    out: (*mut f32, isize),
    scale: f32,
    s: &mut [f32],
    between: impl FnOnce(&mut [f32]),
) {
    unsafe {
        gemm::gemm(rows, src, hd, s.as_mut_ptr(), 1, src as isize, false, q.0, q.1, q.2, k.0, k.1, k.2, 0.0, scale, false, false, false, gemm::Parallelism::None);
    }
    between(s);
    unsafe {
        gemm::gemm(rows, hd, src, out.0, 1, out.1, false, s.as_ptr(), 1, src as isize, v.0, v.1, v.2, 0.0, 1.0, false, false, false, gemm::Parallelism::None);
    }
}
