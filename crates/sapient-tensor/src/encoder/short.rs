//! Self-attention of short sequences: one unit of the pool per (sequence, head), the
//! head's keys transposed once so each query's scores are vector multiply-adds over keys.

use crate::kernels::{self, pool, SendPtr};
use std::ops::Range;

/// `softmax(scale q kᵀ) v` of every sequence with itself, per head, over the pool.
/// `qkv`: rows of `[q | k | v]` (3 dim); `ctx`: rows of dim.
pub(super) fn attention(qkv: &[f32], seqs: &[Range<usize>], heads: usize, hd: usize, scale: f32, ctx: &mut [f32]) {
    let d = heads * hd;
    let out = SendPtr(ctx.as_mut_ptr());
    let units = seqs.len() * heads;
    let fma = kernels::has_avx2();
    #[cfg(target_arch = "x86_64")]
    let wide = kernels::has_avx512() && hd.is_multiple_of(32);
    let job = |u: usize| {
        let (s, h) = (&seqs[u / heads], u % heads);
        let o = out.ptr();
        #[cfg(target_arch = "x86_64")]
        if wide {
            SCRATCH.with(|b| {
                let (kt, p) = &mut *b.borrow_mut();
                // SAFETY: AVX-512 F is present; hd is a multiple of 32.
                unsafe { attend_avx512(qkv, s.clone(), h, hd, d, scale, o, kt, p) };
            });
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if fma {
            // SAFETY: AVX2 and FMA are present.
            unsafe { attend_fma(qkv, s.clone(), h, hd, d, scale, o) };
            return;
        }
        let _ = fma;
        attend(qkv, s.clone(), h, hd, d, scale, o);
    };
    let work: usize = seqs.iter().map(|s| s.len() * s.len()).sum::<usize>() * d;
    // The AVX-512 path does one sentence of 30 tokens (work 345k) in ~20 us: worth
    // splitting its heads over the pool (a dispatch costs a few us); 8 tokens are not.
    #[cfg(target_arch = "x86_64")]
    let inline = if wide { 64 * 1024 } else { 32 * 1024 };
    #[cfg(not(target_arch = "x86_64"))]
    let inline = 64 * 1024;
    if work < inline || units == 1 {
        (0..units).for_each(job);
    } else {
        pool::pool().run_chunks(units, &job);
    }
}

thread_local! {
    /// A worker's keys of one head, transposed, and its scores.
    static SCRATCH: std::cell::RefCell<(Vec<f32>, Vec<f32>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// [`attend`] on AVX-512 for head sizes that are multiples of 32: the head's keys are
/// transposed once (`kt[dim][key]`), so each query's scores are 16 keys per vector
/// multiply-add; softmax is [`kernels::softmax_unnormalized`]; the weighted sum of values runs
/// over 32 dimensions at a time.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn attend_avx512(qkv: &[f32], s: Range<usize>, h: usize, hd: usize, d: usize, scale: f32, out: *mut f32, kt: &mut Vec<f32>, p: &mut Vec<f32>) {
    use std::arch::x86_64::*;
    let l = s.len();
    let lp = l.div_ceil(16) * 16;
    let scale = _mm512_set1_ps(scale);
    // Keys transposed 16 at a time by masked gathers (the padding keys become zeros), so no
    // element is stored twice and none one by one.
    kt.clear();
    kt.reserve(hd * lp);
    // SAFETY: the keys of sequence `s`, head `h`, lie inside `qkv`; `kt` holds `hd * lp`.
    kernels::transpose_gather(qkv.as_ptr().add(s.start * 3 * d + d + h * hd), 3 * d, l, hd, kt.as_mut_ptr(), lp);
    kt.set_len(hd * lp);
    p.clear();
    p.resize(lp, 0.0);
    let (ktp, pp) = (kt.as_ptr(), p.as_mut_ptr());
    let vbase = qkv.as_ptr().add(s.start * 3 * d + 2 * d + h * hd);
    for qi in s.clone() {
        let q = qkv.as_ptr().add(qi * 3 * d + h * hd);
        for j in (0..lp).step_by(16) {
            let mut acc = [_mm512_setzero_ps(); 4];
            for t in (0..hd).step_by(4) {
                for (u, a) in acc.iter_mut().enumerate() {
                    *a = _mm512_fmadd_ps(_mm512_set1_ps(*q.add(t + u)), _mm512_loadu_ps(ktp.add((t + u) * lp + j)), *a);
                }
            }
            let v = _mm512_mul_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])), scale);
            _mm512_storeu_ps(pp.add(j), v);
        }
        let ps = std::slice::from_raw_parts_mut(pp, l);
        let inv = _mm512_set1_ps(kernels::softmax_unnormalized(ps));
        for c in (0..hd).step_by(32) {
            // Even keys into (a0, a1), odd ones into (b0, b1): four chains, all in registers.
            let (mut a0, mut a1, mut b0, mut b1) = (_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps());
            let mut j = 0;
            while j + 1 < l {
                let (v0, v1) = (vbase.add(j * 3 * d + c), vbase.add((j + 1) * 3 * d + c));
                let (w0, w1) = (_mm512_set1_ps(*pp.add(j)), _mm512_set1_ps(*pp.add(j + 1)));
                a0 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(v0), a0);
                a1 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(v0.add(16)), a1);
                b0 = _mm512_fmadd_ps(w1, _mm512_loadu_ps(v1), b0);
                b1 = _mm512_fmadd_ps(w1, _mm512_loadu_ps(v1.add(16)), b1);
                j += 2;
            }
            if j < l {
                let v0 = vbase.add(j * 3 * d + c);
                let w0 = _mm512_set1_ps(*pp.add(j));
                a0 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(v0), a0);
                a1 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(v0.add(16)), a1);
            }
            // SAFETY (caller): (token qi, head h) is written by this unit only.
            let o = out.add(qi * d + h * hd + c);
            _mm512_storeu_ps(o, _mm512_mul_ps(_mm512_add_ps(a0, b0), inv));
            _mm512_storeu_ps(o.add(16), _mm512_mul_ps(_mm512_add_ps(a1, b1), inv));
        }
    }
}

/// [`attend`] compiled with FMA (`exp_approx`'s multiply-adds are otherwise library calls).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_fma(qkv: &[f32], s: Range<usize>, h: usize, hd: usize, d: usize, scale: f32, out: *mut f32) {
    attend(qkv, s, h, hd, d, scale, out)
}

/// Head `h` of sequence `s`: writes `out[token * d + h * hd..][..hd]` for its tokens (`out`:
/// the `[tokens, d]` context, whose other heads and sequences other units write).
#[inline(always)]
fn attend(qkv: &[f32], s: Range<usize>, h: usize, hd: usize, d: usize, scale: f32, out: *mut f32) {
    let l = s.len();
    let mut p = vec![0.0f32; l];
    let mut acc = vec![0.0f32; hd];
    for qi in s.clone() {
        let q = &qkv[qi * 3 * d + h * hd..][..hd];
        let mut max = f32::NEG_INFINITY;
        for (j, ki) in s.clone().enumerate() {
            let k = &qkv[ki * 3 * d + d + h * hd..][..hd];
            p[j] = kernels::dot_f32(q, k) * scale;
            max = max.max(p[j]);
        }
        let mut sum = 0.0f32;
        for v in p.iter_mut() {
            *v = kernels::exp_approx(*v - max);
            sum += *v;
        }
        acc.fill(0.0);
        for (j, vi) in s.clone().enumerate() {
            let v = &qkv[vi * 3 * d + 2 * d + h * hd..][..hd];
            let w = p[j];
            for (a, &x) in acc.iter_mut().zip(v) {
                *a += w * x;
            }
        }
        let inv = 1.0 / sum;
        // SAFETY: (token qi, head h) is written by this unit only; in bounds of the context,
        // which has a row of d for every token of `qkv`.
        let o = unsafe { std::slice::from_raw_parts_mut(out.add(qi * d + h * hd), hd) };
        for (o, a) in o.iter_mut().zip(&acc) {
            *o = a * inv;
        }
    }
}
