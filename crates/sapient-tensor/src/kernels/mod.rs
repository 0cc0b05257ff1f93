//! Our own CPU kernels for quantized matrix products.
//!
//! LLM decoding on a CPU reads every weight once per token, so it is bound by memory
//! bandwidth; candle's quantized matrix-vector products reach only a fraction of it. These
//! kernels keep the weights in their GGML block layout (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K,
//! Q5_K, Q6_K; [`QMatrix`] borrows candle's `QTensor` without a copy) or a packed copy of it,
//! quantize the activations to 8 bits per row (as llama.cpp does), and compute integer dot
//! products, each block's sum scaled once. Work is split by weight rows over a persistent
//! thread pool ([`pool`]).
//!
//! Which kernel takes a product is decided at run time from the CPU, widest first (each step
//! can be turned off in [`KernelOptions`]: `avx512`, `avx2`, `amx`, `lanes`, ...):
//!
//! - the 32-value formats take the sixteen-rows lane kernels of `lanes.rs` (AVX-512 VNNI)
//!   for any number of activation rows once packed ([`pack_for_lanes`], which model loaders
//!   call), Q4_0 and Q4_1 in GGML's layout too; from
//!   [`KernelOptions::lanes_amx_rows`] rows, packed weights take their integer sums from AMX
//!   tiles; without AVX-512, packed matrices of those formats take the same kernels on
//!   256-bit registers (`lanes_avx2.rs`, `vpdpbusd` with AVX-VNNI, `vpmaddubsw` without),
//!   which return the same results bit for bit;
//! - Q4_K and Q6_K follow the AMX arithmetic on machines with AMX (`amx.rs`, or the AVX-512
//!   kernels with the same arithmetic where `amx::use_for` leaves a product to them), and
//!   the lane kernels of `lanes_k.rs` once packed on machines without; without AVX-512, the
//!   same kernels on 256-bit registers (`lanes_avx2_k.rs`), with the same results bit for
//!   bit;
//! - everything else runs one weight row at a time on `avx512.rs` (up to 8 activation rows
//!   per weight row, every format but Q5_K), `avx2.rs`, or the portable code of `quant.rs`.
//!   Without the AVX-512 kernels, a caller may take products of many rows to a dense f32
//!   GEMM on the dequantized weight instead ([`crate::weights::dense_prefill_rows`]).
//!
//! A product of many activation rows is split into several chunks of weight rows per thread,
//! claimed one at a time, so a thread the OS deschedules holds up only its chunk; one
//! activation row (decode) takes one contiguous stretch per thread, run by one kernel call so
//! that its prefetching streams on ([`rows_per_thread`]). The activations are quantized and
//! laid out on the pool too, a range of rows per thread. [`matmul_group`] runs several
//! products of one input (q/k/v, gate/up) in one dispatch, and [`matmul_group_prep`] makes
//! each range's input rows (a residual add and RMSNorm, a gated activation) in the job that
//! quantizes them, so that work costs no dispatch of its own.
//!
//! Every output element is computed by the same function whatever the number of activation
//! rows, so a batch of rows gives bit-identical results to the same rows one at a time
//! (speculative decoding relies on that). On machines with AMX ([`has_amx`]) Q4_K and Q6_K
//! products follow the AMX kernels' arithmetic whichever kernel runs them (`amx.rs`); on
//! machines with the lane kernels and without AMX, packed Q4_K and Q6_K matrices take the
//! sixteen-rows kernels of `lanes_k.rs` (`lanes_avx2_k.rs` without AVX-512), which compute
//! the same exact arithmetic.
//!
//! Where things are: this file holds the row products by format and the small element-wise
//! helpers; `qmatrix.rs` the quantized matrix ([`QMatrix`]) and its dispatch over the
//! instruction sets, `group.rs` several products of one input in one dispatch, `acts.rs` the
//! activations' 8-bit layouts ([`QuantizedActs`]) and their per-thread scratch, `par.rs` how
//! work is split over the pool; `detect.rs` what the CPU can do,
//! `options.rs` the knobs ([`KernelOptions`], passed at load), `pool.rs` the one thread pool,
//! `memory.rs` huge pages and prefetch distances; the products by instruction set in
//! `avx2.rs`, `avx512.rs`, `lanes.rs`, `lanes_avx2.rs`, `lanes_k.rs`, `lanes_avx2_k.rs` and
//! `amx.rs` (on ARM64 `neon.rs` and `neon_mmla.rs`, with the activation quantizers in
//! `neon_quant.rs` and the LLM attention in `neon_attn.rs`, all bit-identical to the portable
//! code), the block formats in
//! `quant.rs` (MXFP4, gpt-oss's expert format, in `mxfp4.rs`); dense f32/bf16 products in `dense.rs`, `dense_f32.rs` and
//! `dense_bf16.rs` (16-bit integer ones for them on AVX512-VNNI in `dense_i16.rs`, their AVX2 /
//! AVX-VNNI levels in `dense_avx2.rs`); element-wise
//! activations in `act.rs`; attention over an f16 KV cache in `attention.rs` and over an 8-bit one
//! in `attention_q8.rs`, an encoder's full attention (f32 on AVX-512, bf16 on AVX512-BF16) in
//! `attention_full.rs`.

// Much of the machinery here (prefetch distances, scratch for the AMX and lane layouts, the
// x86 kernels' constants) is used only by the x86 kernels: on other targets it is dead.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code, unused_imports, unused_variables, unused_mut, unused_macros))]

mod act;
mod acts;
mod group;
mod par;
mod qmatrix;
#[cfg(target_arch = "x86_64")]
mod amx;
mod attention;
mod attention_full;
mod attention_q8;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
pub(crate) use avx512::{lanes16, transpose_gather};
#[cfg(target_arch = "x86_64")]
mod lanes;
#[cfg(target_arch = "x86_64")]
mod lanes_k;
#[cfg(target_arch = "x86_64")]
mod lanes_avx2;
#[cfg(target_arch = "x86_64")]
mod lanes_avx2_k;
#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "aarch64")]
mod neon_mmla;
#[cfg(target_arch = "aarch64")]
mod neon_attn;
#[cfg(target_arch = "aarch64")]
mod neon_quant;
mod dense;
#[cfg(target_arch = "x86_64")]
mod dense_avx2;
mod dense_bf16;
mod dense_f32;
mod dense_i16;
mod conv_bf16;
mod detect;
mod dispatch;
mod memory;
mod mxfp4;
mod mxfp4_lanes;
#[cfg(target_arch = "x86_64")]
mod mxfp4_native;
#[cfg(target_arch = "aarch64")]
mod neon_mxfp4;
mod options;
pub mod delta;
pub mod pool;
pub mod quant;

pub use options::{configure, options, AmxQ6k, KernelOptions, LanesFormats};

use crate::gguf::GgmlType;
use crate::{Error, Result};
use candle_core::quantized::QTensor;
pub use act::{exp_f32, exp_in_place, gelu_erf_in_place};
pub use attention::{attention_row_f32, axpy_f16, dot_f32_f16, prefetch_values, scores_chunks, softmax_unnormalized, softmax_with_sink, values_f16, values_f16_runs, MAX_QUERIES, MAX_VALUE_ROWS};
pub use attention_q8::{quantize_q8_f16, scores_chunks_q8, values_q8, QueryQ8, Q8_GROUP};
pub use attention_full::{attention_bf16, attention_f32, has_attention_bf16, has_attention_f32, FULL_HEAD_DIM};
pub use dense::matmul_f32;
pub use mxfp4::{dequantize_mxfp4, dot_mxfp4_q8, e8m0_to_f32_half, Mxfp4Matrix, MXFP4_BLOCK_BYTES};
pub use detect::{has_amx, has_avx2, has_avx512, has_avx512_bf16, has_dotprod, has_i8mm, has_lanes, has_lanes_avx2, has_neon, has_vnni};
pub use memory::{huge_pages, huge_pages_for, release_freed, ZeroedMap};
pub(crate) use memory::Ahead;
use memory::prefetch;
pub use dense_bf16::{has_amx_bf16, DenseMatrix};
pub use dense_i16::ConvShape;
pub use conv_bf16::{bf16_bits, ConvBf16};
use quant::{BlockQ8, BlockQ8K, QType};
pub use acts::QuantizedActs;
use acts::{return_scratch, take_scratch};
#[cfg(target_arch = "x86_64")]
use acts::SCRATCH_AMX_ACC;
pub use group::{matmul_group, matmul_group_prep, Prep, MAX_GROUP};
use group::ActsIn;
pub use par::{rows_per_thread, SendPtr};
use par::{by_rows, chunk_len, for_row_chunks, run_chunks};
pub use qmatrix::{pack_for_lanes, QMatrix};
use std::cell::RefCell;
use std::sync::Arc;

impl QType {
    /// The kernel format for a GGML type, if the kernels handle it.
    pub fn from_ggml(t: GgmlType) -> Option<Self> {
        Some(match t {
            GgmlType::Q4_0 => QType::Q4_0,
            GgmlType::Q4_1 => QType::Q4_1,
            GgmlType::Q5_0 => QType::Q5_0,
            GgmlType::Q5_1 => QType::Q5_1,
            GgmlType::Q8_0 => QType::Q8_0,
            GgmlType::Q4_K => QType::Q4K,
            GgmlType::Q5_K => QType::Q5K,
            GgmlType::Q6_K => QType::Q6K,
            _ => return None,
        })
    }

    /// The kernel format for a candle quantized dtype, if the kernels handle it.
    pub fn from_candle(t: candle_core::quantized::GgmlDType) -> Option<Self> {
        use candle_core::quantized::GgmlDType as D;
        Some(match t {
            D::Q4_0 => QType::Q4_0,
            D::Q4_1 => QType::Q4_1,
            D::Q5_0 => QType::Q5_0,
            D::Q5_1 => QType::Q5_1,
            D::Q8_0 => QType::Q8_0,
            D::Q4K => QType::Q4K,
            D::Q5K => QType::Q5K,
            D::Q6K => QType::Q6K,
            _ => return None,
        })
    }
}

/// Whether the AVX-512 kernels handle format `t`.
fn wide_format(t: QType) -> bool {
    t != QType::Q5K
}

/// One weight row (`t` blocks) against 1..=[`MAX_ROWS`] quantized activation rows:
/// `out[r] = dot(w, acts[r])`. The weight block is decoded once for all rows; the result for
/// a row does not depend on which other rows came with it.
#[inline]
pub fn rows_q8(t: QType, w: &[u8], acts: &[&[BlockQ8]], out: &mut [f32]) {
    debug_assert!(!acts.is_empty() && acts.len() <= MAX_ROWS && out.len() >= acts.len());
    #[cfg(target_arch = "aarch64")]
    if has_neon() && neon::rows_q8_at(neon::Level::detect(), t, w, acts, out) {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if has_vnni() {
        // SAFETY: AVX2, FMA, F16C and AVX-VNNI are present; callers pass matching lengths.
        unsafe {
            return match t {
                QType::Q4_0 => avx2::rows_q4_0_vnni(w, acts, out),
                QType::Q4_1 => avx2::rows_q4_1_vnni(w, acts, out),
                QType::Q5_0 => avx2::rows_q5_0_vnni(w, acts, out),
                QType::Q5_1 => avx2::rows_q5_1_vnni(w, acts, out),
                QType::Q8_0 => avx2::rows_q8_0_vnni(w, acts, out),
                _ => unreachable!("k-quants use rows_q8k"),
            };
        }
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2, FMA and F16C are present.
        unsafe {
            return match t {
                QType::Q4_0 => avx2::rows_q4_0(w, acts, out),
                QType::Q4_1 => avx2::rows_q4_1(w, acts, out),
                QType::Q5_0 => avx2::rows_q5_0(w, acts, out),
                QType::Q5_1 => avx2::rows_q5_1(w, acts, out),
                QType::Q8_0 => avx2::rows_q8_0(w, acts, out),
                _ => unreachable!("k-quants use rows_q8k"),
            };
        }
    }
    for (o, a) in out.iter_mut().zip(acts) {
        *o = match t {
            QType::Q4_0 => quant::dot_q4_0(w, a),
            QType::Q4_1 => quant::dot_q4_1(w, a),
            QType::Q5_0 => quant::dot_q5_0(w, a),
            QType::Q5_1 => quant::dot_q5_1(w, a),
            QType::Q8_0 => quant::dot_q8_0(w, a),
            _ => unreachable!("k-quants use rows_q8k"),
        };
    }
}

/// Like [`rows_q8`] for the k-quants.
#[inline]
pub fn rows_q8k(t: QType, w: &[u8], acts: &[&[BlockQ8K]], out: &mut [f32]) {
    debug_assert!(!acts.is_empty() && acts.len() <= MAX_ROWS && out.len() >= acts.len());
    #[cfg(target_arch = "aarch64")]
    if has_neon() && neon::rows_q8k_at(neon::Level::detect(), t, w, acts, out) {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2, FMA and F16C are present.
        unsafe {
            match t {
                QType::Q4K => return avx2::rows_q4k(w, acts, out),
                QType::Q6K => return avx2::rows_q6k(w, acts, out),
                QType::Q5K => {
                    for (o, a) in out.iter_mut().zip(acts) {
                        *o = avx2::dot_q5k(w, a);
                    }
                    return;
                }
                _ => unreachable!("32-value formats use rows_q8"),
            }
        }
    }
    for (o, a) in out.iter_mut().zip(acts) {
        *o = match t {
            QType::Q4K => quant::dot_q4k(w, a),
            QType::Q5K => quant::dot_q5k(w, a),
            QType::Q6K => quant::dot_q6k(w, a),
            _ => unreachable!("32-value formats use rows_q8"),
        };
    }
}

/// Quantize activations to 32-value blocks (AVX-512, AVX2 or NEON where present,
/// bit-identical to the portable code).
pub fn quantize_q8(x: &[f32], out: &mut [BlockQ8]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx512() {
        // SAFETY: AVX-512 F/BW/VL, AVX2, FMA and F16C are present.
        return unsafe { avx512::quantize_q8(x, out) };
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2, FMA and F16C are present.
        return unsafe { avx2::quantize_q8(x, out) };
    }
    #[cfg(target_arch = "aarch64")]
    if has_neon() {
        return neon_quant::quantize_q8(x, out);
    }
    quant::quantize_q8(x, out)
}

/// Quantize activations to 256-value blocks (see [`quantize_q8`]).
pub fn quantize_q8k(x: &[f32], out: &mut [BlockQ8K]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2, FMA and F16C are present.
        return unsafe { avx2::quantize_q8k(x, out) };
    }
    #[cfg(target_arch = "aarch64")]
    if has_neon() {
        return neon_quant::quantize_q8k(x, out);
    }
    quant::quantize_q8k(x, out)
}

/// Dot product of one weight row with one quantized activation row.
pub fn dot_row_q8(t: QType, w: &[u8], a: &[BlockQ8]) -> f32 {
    let mut o = [0f32];
    rows_q8(t, w, &[a], &mut o);
    o[0]
}

/// Dot product of one k-quant weight row with one quantized activation row.
pub fn dot_row_q8k(t: QType, w: &[u8], a: &[BlockQ8K]) -> f32 {
    let mut o = [0f32];
    rows_q8k(t, w, &[a], &mut o);
    o[0]
}

/// Most activation rows the kernels take at once.
#[cfg(target_arch = "x86_64")]
pub const MAX_ROWS: usize = avx2::MAX_ROWS;
/// Most activation rows the kernels take at once.
#[cfg(not(target_arch = "x86_64"))]
pub const MAX_ROWS: usize = 4;

/// f32 dot product.
#[inline]
pub fn dot_f32(x: &[f32], y: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 and FMA are present.
        return unsafe { avx2::dot_f32(x, y) };
    }
    x.iter().zip(y).map(|(a, b)| a * b).sum()
}

/// `g[i] = silu(g[i]) * u[i]` (SwiGLU's gating, `silu(x) = x / (1 + e^-x)`), over
/// `min(g.len(), u.len())` values. `e^-x` comes from [`exp_approx`], computed by the same
/// operations in every SIMD width and in the portable code, so results do not depend on the
/// machine's instruction set. A decode step of Qwen2.5-0.5B spent ~280 us per token in libm's
/// scalar `expf` here. From 8k values (a batch's step, a prompt) the values are split over the
/// kernel pool, in pieces of at most 16k: on one thread the pool's other threads would wait.
pub fn silu_mul(g: &mut [f32], u: &[f32]) {
    const CHUNK: usize = 16 * 1024;
    let n = g.len().min(u.len());
    if n < 8 * 1024 {
        return silu_mul_range(&mut g[..n], &u[..n]);
    }
    let chunk = (n.div_ceil(pool::pool().threads()).div_ceil(16) * 16).min(CHUNK);
    let gp = SendPtr(g.as_mut_ptr());
    pool::pool().run_chunks(n.div_ceil(chunk), &|c| {
        let r = c * chunk..((c + 1) * chunk).min(n);
        // SAFETY: chunks are disjoint ranges of `g`, which outlives the call.
        let gs = unsafe { std::slice::from_raw_parts_mut(gp.ptr().add(r.start), r.len()) };
        silu_mul_range(gs, &u[r]);
    });
}

/// `x[i] = silu(x[i])` on one thread: [`silu_mul_range`] with every factor one, so the
/// same bits as the gate there.
pub fn silu_in_place(x: &mut [f32]) {
    const ONES: [f32; 256] = [1.0; 256];
    for c in x.chunks_mut(ONES.len()) {
        silu_mul_range(c, &ONES[..c.len()]);
    }
}

/// [`silu_mul`] on one thread.
pub fn silu_mul_range(g: &mut [f32], u: &[f32]) {
    let n = g.len().min(u.len());
    let (g, u) = (&mut g[..n], &u[..n]);
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    {
        if has_avx512() {
            // SAFETY: AVX-512 F is present; the kernel reads and writes whole vectors of
            // 16 inside `g` and `u` and returns how many values it did.
            done = unsafe { avx512::silu_mul(g, u) };
        } else if has_avx2() {
            // SAFETY: AVX2 and FMA are present; as above with vectors of 8.
            done = unsafe { avx2::silu_mul(g, u) };
        }
    }
    for (g, &u) in g[done..].iter_mut().zip(&u[done..]) {
        *g = *g / (1.0 + exp_approx(-*g)) * u;
    }
}

/// `e^x`, computed in f64 and rounded once to f32: correctly rounded but for inputs within
/// ~1e-13 of a rounding boundary, so it gives libm's `expf` bits almost always (a cheaper f32
/// polynomial moved greedy decoding off llama.cpp's tokens in tests/llamacpp_greedy.rs).
/// `x = n ln 2 + r`, `|r| <= ln 2 / 2`, a degree-11 Taylor polynomial for `e^r` (truncation
/// below 1e-14), times `2^n`. The SIMD kernels repeat these operations lane by lane (fused
/// multiply-adds included), so all give the same bits.
#[inline(always)]
pub fn exp_approx(x: f32) -> f32 {
    let x = (x as f64).clamp(-110.0, 100.0);
    let n = (x * std::f64::consts::LOG2_E).round_ties_even();
    let r = n.mul_add(-std::f64::consts::LN_2, x);
    let mut p = EXP_TAYLOR[0];
    for c in &EXP_TAYLOR[1..] {
        p = p.mul_add(r, *c);
    }
    (p * f64::from_bits(((n as i64 + 1023) as u64) << 52)) as f32
}

/// `1 / k!` for k = 11 down to 0.
pub(crate) const EXP_TAYLOR: [f64; 12] = {
    let mut t = [1.0f64; 12];
    let mut k = 1;
    let mut f = 1.0f64;
    while k < 12 {
        f *= k as f64;
        t[11 - k] = 1.0 / f;
        k += 1;
    }
    t
};

/// Round f32 values to f16 (raw bits), e.g. into an f16 KV cache.
pub fn f32_to_f16(x: &[f32], out: &mut [u16]) {
    let n = x.len().min(out.len());
    #[allow(unused_mut)]
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 and F16C are present; the kernel stays inside the first `n` values.
        done = unsafe { avx2::f32_to_f16(&x[..n], &mut out[..n]) };
    }
    for (o, v) in out[done..n].iter_mut().zip(&x[done..n]) {
        *o = half::f16::from_f32(*v).to_bits();
    }
}

#[cfg(test)]
mod tests;
