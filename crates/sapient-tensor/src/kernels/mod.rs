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
//!   tiles;
//! - Q4_K and Q6_K follow the AMX arithmetic on machines with AMX (`amx.rs`, or the AVX-512
//!   kernels with the same arithmetic where `amx::use_for` leaves a product to them), and
//!   the lane kernels of `lanes_k.rs` once packed on machines without;
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
//! sixteen-rows kernels of `lanes_k.rs`, which compute the same exact arithmetic.
//!
//! Where things are: this file holds the quantized matrix ([`QMatrix`]), its dispatch over
//! the instruction sets and the activations' 8-bit layouts; `detect.rs` what the CPU can do,
//! `options.rs` the knobs ([`KernelOptions`], passed at load), `pool.rs` the one thread pool,
//! `memory.rs` huge pages and prefetch distances; the products by instruction set in
//! `avx2.rs`, `avx512.rs`, `lanes.rs`, `lanes_k.rs` and `amx.rs`, the block formats in
//! `quant.rs` (MXFP4, gpt-oss's expert format, in `mxfp4.rs`); dense f32/bf16 products in `dense.rs`, `dense_f32.rs` and `dense_bf16.rs`; element-wise
//! activations in `act.rs`; attention over an f16 KV cache in `attention.rs` and over an 8-bit one
//! in `attention_q8.rs`, an encoder's full attention (f32 on AVX-512, bf16 on AVX512-BF16) in
//! `attention_full.rs`.

mod act;
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
mod lanes;
#[cfg(target_arch = "x86_64")]
mod lanes_k;
mod dense;
mod dense_bf16;
mod dense_f32;
mod conv_bf16;
mod detect;
mod memory;
mod mxfp4;
mod options;
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
pub use detect::{has_amx, has_avx2, has_avx512, has_avx512_bf16, has_lanes, has_vnni};
pub use memory::{huge_pages, huge_pages_for, release_freed, ZeroedMap};
pub(crate) use memory::Ahead;
use memory::prefetch;
pub use dense_bf16::{has_amx_bf16, DenseMatrix};
pub use conv_bf16::{bf16_bits, ConvBf16};
use quant::{BlockQ8, BlockQ8K, QType};
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

/// Quantize activations to 32-value blocks (AVX-512 or AVX2 where present, bit-identical
/// to the portable code).
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
    quant::quantize_q8(x, out)
}

/// Quantize activations to 256-value blocks (see [`quantize_q8`]).
pub fn quantize_q8k(x: &[f32], out: &mut [BlockQ8K]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2, FMA and F16C are present.
        return unsafe { avx2::quantize_q8k(x, out) };
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

#[derive(Clone)]
enum Storage {
    Candle(Arc<QTensor>),
    Bytes(Arc<Vec<u8>>),
    /// Laid out for the lane kernels (`lanes::Packed`), instead of GGML's blocks.
    #[cfg(target_arch = "x86_64")]
    Lanes(Arc<lanes::Packed>),
}

/// A quantized `[rows, cols]` weight matrix in GGML block layout, row-major.
#[derive(Clone)]
pub struct QMatrix {
    qtype: QType,
    rows: usize,
    cols: usize,
    storage: Storage,
}

impl std::fmt::Debug for QMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QMatrix")
            .field("qtype", &self.qtype)
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .finish()
    }
}

impl QMatrix {
    /// Wrap a CPU candle quantized tensor of shape `[rows, cols]` (no copy). `None` when its
    /// format has no kernel here, it is not 2-D, or it is not on the CPU.
    pub fn from_qtensor(q: &Arc<QTensor>) -> Option<Self> {
        let qtype = QType::from_candle(q.dtype())?;
        let (rows, cols) = match q.shape().dims() {
            [r, c] => (*r, *c),
            _ => return None,
        };
        if !matches!(q.device(), candle_core::Device::Cpu) || cols % qtype.block_len() != 0 {
            return None;
        }
        let m = Self {
            qtype,
            rows,
            cols,
            storage: Storage::Candle(q.clone()),
        };
        // Must be borrowable as bytes of the expected size.
        if m.bytes_len() != rows * m.row_bytes() {
            return None;
        }
        m.with_bytes(huge_pages);
        Some(m)
    }

    /// Packed for the lane kernels whatever the options say (tests compare both layouts).
    #[cfg(all(test, target_arch = "x86_64"))]
    fn packed_lanes(&self) -> Option<QMatrix> {
        let p = self.with_bytes(|b| lanes::Packed::new_all(&[(self.qtype, b, self.rows, self.cols)]).pop().flatten())?;
        Some(QMatrix {
            qtype: self.qtype,
            rows: self.rows,
            cols: self.cols,
            storage: Storage::Lanes(Arc::new(p)),
        })
    }

    /// A matrix from raw GGML blocks (`rows * cols / block_len * block_bytes` bytes).
    pub fn from_bytes(qtype: QType, rows: usize, cols: usize, bytes: Vec<u8>) -> Result<Self> {
        if !cols.is_multiple_of(qtype.block_len()) {
            return Err(Error::Candle(candle_core::Error::Msg(format!(
                "{qtype:?} matrix: {cols} columns is not a multiple of the block length {}",
                qtype.block_len()
            ))));
        }
        let want = rows * cols / qtype.block_len() * qtype.block_bytes();
        if bytes.len() != want {
            return Err(Error::Candle(candle_core::Error::Msg(format!(
                "{qtype:?} [{rows}, {cols}] needs {want} bytes, got {}",
                bytes.len()
            ))));
        }
        huge_pages(&bytes);
        Ok(Self {
            qtype,
            rows,
            cols,
            storage: Storage::Bytes(Arc::new(bytes)),
        })
    }

    /// [`from_bytes`](Self::from_bytes) kept in GGML's layout (tests compare the layouts).
    #[cfg(test)]
    fn from_bytes_unpacked(qtype: QType, rows: usize, cols: usize, bytes: Vec<u8>) -> QMatrix {
        Self {
            qtype,
            rows,
            cols,
            storage: Storage::Bytes(Arc::new(bytes)),
        }
    }

    pub fn qtype(&self) -> QType {
        self.qtype
    }
    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn cols(&self) -> usize {
        self.cols
    }
    pub fn row_bytes(&self) -> usize {
        self.cols / self.qtype.block_len() * self.qtype.block_bytes()
    }

    fn bytes_len(&self) -> usize {
        match &self.storage {
            Storage::Candle(q) => q.data().map(|d| d.len()).unwrap_or(0),
            Storage::Bytes(b) => b.len(),
            #[cfg(target_arch = "x86_64")]
            Storage::Lanes(_) => self.rows * self.row_bytes(),
        }
    }

    /// The raw blocks (GGML layout). On the CPU candle hands out its buffer without copying;
    /// a matrix packed for the lane kernels is unpacked into a temporary copy.
    pub fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        f(&self.raw_bytes())
    }

    /// The addresses the weights occupy in memory (for huge pages).
    pub(crate) fn span(&self) -> (usize, usize) {
        let s = |b: &[u8]| (b.as_ptr() as usize, b.as_ptr() as usize + b.len());
        match &self.storage {
            #[cfg(target_arch = "x86_64")]
            Storage::Lanes(p) => s(p.bytes()),
            _ => self.with_bytes(s),
        }
    }

    /// Whether the weights are laid out for the lane kernels.
    pub fn is_packed(&self) -> bool {
        #[cfg(target_arch = "x86_64")]
        return matches!(self.storage, Storage::Lanes(_));
        #[cfg(not(target_arch = "x86_64"))]
        false
    }

    /// The first `n` rows (at most all of them) as a matrix of their own, sharing the storage.
    pub fn head(&self, n: usize) -> QMatrix {
        QMatrix {
            qtype: self.qtype,
            rows: n.min(self.rows),
            cols: self.cols,
            storage: self.storage.clone(),
        }
    }

    /// Rows `ids` (each `< rows()`) copied into a matrix of their own, in that order.
    pub fn gather_rows(&self, ids: &[usize]) -> Result<QMatrix> {
        let rb = self.row_bytes();
        #[cfg(target_arch = "x86_64")]
        if let Storage::Lanes(p) = &self.storage {
            let mut out = vec![0u8; ids.len() * rb];
            for (&r, row) in ids.iter().zip(out.chunks_exact_mut(rb)) {
                if r < self.rows {
                    p.unpack_row(r, row);
                }
            }
            // Packed too, so that the rows keep this matrix's arithmetic.
            let mut g = QMatrix::from_bytes(self.qtype, ids.len(), self.cols, out)?;
            pack_for_lanes(&mut [&mut g]);
            return Ok(g);
        }
        let mut out = Vec::with_capacity(ids.len() * rb);
        self.with_bytes(|b| {
            for &r in ids {
                if let Some(row) = b.get(r * rb..(r + 1) * rb) {
                    out.extend_from_slice(row);
                }
            }
        });
        QMatrix::from_bytes(self.qtype, ids.len(), self.cols, out)
    }

    /// Dequantize row `r` into `out` (`cols` long).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let rb = self.row_bytes();
        #[cfg(target_arch = "x86_64")]
        if let Storage::Lanes(p) = &self.storage {
            // Block by block (no allocation: the embedding lookup of every decode step).
            let mut blk = [0u8; 256];
            let (len, bytes) = (self.qtype.block_len(), self.qtype.block_bytes());
            for (b, o) in out.chunks_exact_mut(len).take(self.cols / len).enumerate() {
                p.unpack_block(r, b, &mut blk[..bytes]);
                quant::dequantize_row(self.qtype, &blk[..bytes], o);
            }
            return;
        }
        self.with_bytes(|b| quant::dequantize_row(self.qtype, &b[r * rb..(r + 1) * rb], out));
    }

    /// `out[i, j] = sum_k x[i, k] * w[j, k]` for `m` rows of `x` (`[m, cols]`, row-major);
    /// `out` is `[m, rows]`. Runs on the kernel thread pool.
    pub fn matmul(&self, x: &[f32], m: usize, out: &mut [f32]) {
        assert_eq!(x.len(), m * self.cols, "QMatrix::matmul: x has the wrong length");
        assert_eq!(out.len(), m * self.rows, "QMatrix::matmul: out has the wrong length");
        let acts = QuantizedActs::for_matrix(self, x, m);
        self.matmul_quantized(&acts, out);
    }

    /// Whether this matrix's products take the lane kernels (on a CPU with them, for the
    /// formats [`lanes::handles`]): Q4_0 and Q4_1 in GGML's layout too, the other 32-value
    /// formats and Q4_K/Q6_K once packed ([`pack_for_lanes`]); in GGML's layout those run on
    /// the row kernels. Fixed per matrix, so its rows never mix arithmetics.
    fn takes_lanes(&self) -> bool {
        #[cfg(target_arch = "x86_64")]
        return has_lanes() && lanes::handles(self.qtype) && (self.is_packed() || lanes::unpacked(self.qtype));
        #[cfg(not(target_arch = "x86_64"))]
        false
    }

    /// Like [`matmul`](Self::matmul) with activations already quantized for this format
    /// (several matrices reading the same input share one quantization).
    pub fn matmul_quantized(&self, acts: &QuantizedActs, out: &mut [f32]) {
        let m = acts.m;
        assert!(acts.fits(self), "activation format does not match");
        assert_eq!(acts.cols, self.cols, "activation width does not match");
        assert_eq!(out.len(), m * self.rows, "QMatrix::matmul: out has the wrong length");
        let out_ptr = SendPtr(out.as_mut_ptr());
        let bytes = self.bytes_for(acts);
        for_row_chunks(self.rows, m, self.rows * m * self.cols, &|range: std::ops::Range<usize>| {
            self.product_rows(&bytes, acts, &out_ptr, range)
        });
    }

    /// The GGML blocks: borrowed (on the CPU candle hands out its buffer without copying),
    /// or unpacked into a copy for a packed matrix.
    fn raw_bytes(&self) -> std::borrow::Cow<'_, [u8]> {
        match &self.storage {
            Storage::Candle(q) => q.data().unwrap_or(std::borrow::Cow::Borrowed(&[])),
            Storage::Bytes(b) => std::borrow::Cow::Borrowed(&b[..]),
            #[cfg(target_arch = "x86_64")]
            Storage::Lanes(p) => {
                let rb = self.row_bytes();
                let mut raw = vec![0u8; self.rows * rb];
                for (r, row) in raw.chunks_exact_mut(rb).enumerate() {
                    p.unpack_row(r, row);
                }
                std::borrow::Cow::Owned(raw)
            }
        }
    }

    /// The bytes the products with `acts` read: the GGML blocks ([`raw_bytes`](Self::raw_bytes)),
    /// or nothing for packed weights with activations for the lane kernels (their products
    /// read the packed layout, [`Self::product_rows`]).
    fn bytes_for(&self, acts: &QuantizedActs) -> std::borrow::Cow<'_, [u8]> {
        if self.is_packed() && acts.lanes {
            return std::borrow::Cow::Borrowed(&[]);
        }
        self.raw_bytes()
    }

    /// Output columns `range` (weight rows) of the product, on the calling thread. `out`
    /// points at the `[m, rows]` output.
    fn product_rows(&self, bytes: &[u8], acts: &QuantizedActs, out_ptr: &SendPtr, range: std::ops::Range<usize>) {
        #[cfg(target_arch = "x86_64")]
        if acts.amx_g != 0 {
            return self.product_rows_amx(bytes, acts, out_ptr, range);
        }
        #[cfg(target_arch = "x86_64")]
        if acts.lanes {
            // SAFETY: has_lanes() held when `acts` was laid out for these kernels, for this
            // format (`fits`); chunks start at multiples of 16 rows (`chunk_len`) and each
            // writes a disjoint range of output columns.
            if let Storage::Lanes(p) = &self.storage {
                if acts.k_quant {
                    unsafe { lanes::range_packed_k(p, range.start, range.end, &acts.q8k, &acts.corr, acts.m, out_ptr.0, self.rows) };
                } else {
                    unsafe { lanes::range_packed(p, range.start, range.end, &acts.q8, &acts.corr, acts.m, out_ptr.0, self.rows) };
                }
                return;
            }
            unsafe {
                lanes::range(self.qtype, bytes, self.row_bytes(), range.start, range.end, &acts.q8, &acts.corr, acts.m, out_ptr.0, self.rows);
            }
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if acts.wide {
            return self.product_rows_wide(bytes, acts, out_ptr, range);
        }
        let (m, rows, rb, t) = (acts.m, self.rows, self.row_bytes(), self.qtype);
        let mut tmp = [0f32; MAX_ROWS];
        let pf = Ahead::of(rb);
        let end = range.end;
        pf.begin(bytes, rb, range.start, end);
        for j in range.start..end {
            let wrow = &bytes[j * rb..(j + 1) * rb];
            // Ask for rows ahead: one core's hardware prefetching alone does not keep up
            // with the kernels when weights come from DRAM.
            pf.at(bytes, rb, j, end);
            let mut i0 = 0;
            while i0 < m {
                let g = (m - i0).min(MAX_ROWS);
                if acts.k_quant {
                    let mut rs: [&[BlockQ8K]; MAX_ROWS] = [&[]; MAX_ROWS];
                    for (k, r) in rs.iter_mut().take(g).enumerate() {
                        *r = acts.row_q8k(i0 + k);
                    }
                    rows_q8k(t, wrow, &rs[..g], &mut tmp);
                } else {
                    let mut rs: [&[BlockQ8]; MAX_ROWS] = [&[]; MAX_ROWS];
                    for (k, r) in rs.iter_mut().take(g).enumerate() {
                        *r = acts.row_q8(i0 + k);
                    }
                    rows_q8(t, wrow, &rs[..g], &mut tmp);
                }
                for (k, v) in tmp[..g].iter().enumerate() {
                    // SAFETY: each chunk writes a disjoint range of output columns.
                    unsafe { *out_ptr.0.add((i0 + k) * rows + j) = *v };
                }
                i0 += g;
            }
        }
    }

    /// [`product_rows`](Self::product_rows) with the AMX kernels (Q4_K, Q6_K; two or more
    /// activation rows).
    #[cfg(target_arch = "x86_64")]
    fn product_rows_amx(&self, bytes: &[u8], acts: &QuantizedActs, out_ptr: &SendPtr, range: std::ops::Range<usize>) {
        let mut acc = take_scratch(&SCRATCH_AMX_ACC, amx::chunks(self.qtype, acts.m));
        // SAFETY: has_amx() held when `acts` was laid out for AMX, for this format (`fits`);
        // the weight rows are `cols` long; each chunk writes a disjoint range of columns.
        unsafe {
            amx::product(self.qtype, bytes, self.row_bytes(), range.start, range.end, &acts.amx_tiles, &acts.amx_sbs, acts.m, out_ptr.0, self.rows, &mut acc);
        }
        return_scratch(&SCRATCH_AMX_ACC, acc);
    }

    /// [`product_rows`](Self::product_rows) with the AVX-512 kernels: the chunk's weight rows
    /// go by groups of up to [`avx512::MAX_ROWS`] activation rows (a group stays in L1).
    #[cfg(target_arch = "x86_64")]
    fn product_rows_wide(&self, bytes: &[u8], acts: &QuantizedActs, out_ptr: &SendPtr, range: std::ops::Range<usize>) {
        const G: usize = avx512::MAX_ROWS;
        let (m, rows, rb, t) = (acts.m, self.rows, self.row_bytes(), self.qtype);
        let mut tmp = [0f32; G];
        let pf = Ahead::of(rb);
        let end = range.end;
        // One activation row (decode): one kernel call per stretch of weight rows, each row
        // computed exactly as the loop below computes it. (A kernel taking four weight rows
        // per call, sharing the activation loads, was within the noise on a Zen 5 VM and
        // 1.3-2.4x slower than one row at a time on a Zen 4 one: examples/gemm_stream,
        // Q4_0/Q5_0/Q8_0 4864x896 from memory; Qwen2.5-0.5B decode step 21-25 -> 15-16 ms.)
        if m == 1 {
            pf.begin_stream(bytes, range.start * rb);
            let (r0, o) = (range.start, out_ptr.0);
            // SAFETY: as below; the range kernels write outputs r0..end of the one row, a
            // range no other chunk writes.
            unsafe {
                match t {
                    QType::Q4_0 => avx512::range_q4_0(bytes, rb, r0, end, acts.row_pairs(0), o, pf),
                    QType::Q4_1 => avx512::range_q4_1(bytes, rb, r0, end, acts.row_pairs(0), o, pf),
                    QType::Q5_0 => avx512::range_q5_0(bytes, rb, r0, end, acts.row_pairs(0), o, pf),
                    QType::Q5_1 => avx512::range_q5_1(bytes, rb, r0, end, acts.row_pairs(0), o, pf),
                    QType::Q8_0 => avx512::range_q8_0(bytes, rb, r0, end, acts.row_pairs(0), o, pf),
                    QType::Q4K | QType::Q6K if has_amx() => avx512::range_k_x(t == QType::Q6K, bytes, rb, r0, end, acts.row_k(0), o, pf),
                    QType::Q4K => avx512::range_q4k(bytes, rb, r0, end, acts.row_k(0), o, pf),
                    QType::Q6K => avx512::range_q6k(bytes, rb, r0, end, acts.row_k(0), o, pf),
                    QType::Q5K => unreachable!("Q5_K is not laid out wide"),
                }
            }
            return;
        }
        pf.begin(bytes, rb, range.start, end);
        // On machines with AMX, k-quant products of any number of rows use the exact
        // arithmetic of the AMX kernels (whichever kernel runs them).
        let exact = has_amx();
        let mut i0 = 0;
        while i0 < m {
            let g = (m - i0).min(G);
            let mut rp: [&[avx512::Pair]; G] = [&[]; G];
            let mut rk: [&[avx512::BlockK]; G] = [&[]; G];
            for k in 0..g {
                if acts.k_quant {
                    rk[k] = acts.row_k(i0 + k);
                } else {
                    rp[k] = acts.row_pairs(i0 + k);
                }
            }
            for j in range.start..end {
                let wrow = &bytes[j * rb..(j + 1) * rb];
                if i0 == 0 {
                    pf.at(bytes, rb, j, end);
                }
                // SAFETY: has_avx512() held when `acts` was laid out wide; the rows
                // are `cols` long in this matrix's format.
                unsafe {
                    match t {
                        QType::Q4_0 => avx512::rows_q4_0(wrow, &rp[..g], &mut tmp),
                        QType::Q4_1 => avx512::rows_q4_1(wrow, &rp[..g], &mut tmp),
                        QType::Q5_0 => avx512::rows_q5_0(wrow, &rp[..g], &mut tmp),
                        QType::Q5_1 => avx512::rows_q5_1(wrow, &rp[..g], &mut tmp),
                        QType::Q8_0 => avx512::rows_q8_0(wrow, &rp[..g], &mut tmp),
                        QType::Q4K if exact => avx512::rows_q4k_x(wrow, &rk[..g], &mut tmp),
                        QType::Q6K if exact => avx512::rows_q6k_x(wrow, &rk[..g], &mut tmp),
                        QType::Q4K => avx512::rows_q4k(wrow, &rk[..g], &mut tmp),
                        QType::Q6K => avx512::rows_q6k(wrow, &rk[..g], &mut tmp),
                        QType::Q5K => unreachable!("Q5_K is not laid out wide"),
                    }
                }
                for (k, v) in tmp[..g].iter().enumerate() {
                    // SAFETY: each chunk writes a disjoint range of output columns.
                    unsafe { *out_ptr.0.add((i0 + k) * rows + j) = *v };
                }
            }
            i0 += g;
        }
    }
}

/// Lay out the matrices whose products go to the lane kernels ([`lanes::handles`], on a
/// machine with them) in those kernels' packed layout, all in one allocation backed by huge
/// pages where Linux allows: the same results, one activation row (decode) as fast as the
/// row-at-a-time kernels and many rows faster. The other matrices are left as they are. A
/// loader calls this once with a model's matrices (each may be a clone of another's: equal
/// matrices are packed once); the GGML blocks they were made from can then be dropped.
pub fn pack_for_lanes(mats: &mut [&mut QMatrix]) {
    #[cfg(target_arch = "x86_64")]
    {
        if !has_lanes() {
            return;
        }
        let wanted: Vec<usize> = (0..mats.len()).filter(|&i| lanes::handles(mats[i].qtype) && !mats[i].is_packed()).collect();
        // Matrices sharing storage (a tied embedding and output layer) pack once.
        let key = |m: &QMatrix| match &m.storage {
            Storage::Candle(q) => Arc::as_ptr(q) as *const u8 as usize,
            Storage::Bytes(b) => Arc::as_ptr(b) as *const u8 as usize,
            Storage::Lanes(p) => Arc::as_ptr(p) as *const u8 as usize,
        };
        let mut firsts: Vec<usize> = Vec::new();
        for &i in &wanted {
            if !firsts.iter().any(|&f| key(mats[f]) == key(mats[i]) && mats[f].rows == mats[i].rows) {
                firsts.push(i);
            }
        }
        let raws: Vec<std::borrow::Cow<'_, [u8]>> = firsts.iter().map(|&i| mats[i].raw_bytes()).collect();
        let specs: Vec<(QType, &[u8], usize, usize)> = firsts.iter().zip(&raws).map(|(&i, r)| (mats[i].qtype, &r[..], mats[i].rows, mats[i].cols)).collect();
        let packed = lanes::Packed::new_all(&specs);
        if let Some(p) = packed.iter().flatten().next() {
            huge_pages(p.arena_bytes());
        }
        let packed: Vec<(usize, Option<Arc<lanes::Packed>>)> = firsts.iter().map(|&i| key(mats[i])).zip(packed.into_iter().map(|p| p.map(Arc::new))).collect();
        drop(raws);
        for &i in &wanted {
            let k = key(mats[i]);
            if let Some((_, Some(p))) = packed.iter().find(|(pk, _)| *pk == k) {
                mats[i].storage = Storage::Lanes(p.clone());
            }
        }
        // The GGML blocks of matrices nothing else holds were freed just now: hand their
        // pages back to the system (the allocator keeps freed heap memory, in huge pages
        // here, which would leave the model's resident size at both copies).
        if packed.iter().filter_map(|(_, p)| p.as_ref()).map(|p| p.bytes().len()).sum::<usize>() >= 16 << 20 {
            memory::release_freed();
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = mats;
}

/// Most matrices [`matmul_group`] takes.
pub const MAX_GROUP: usize = 4;

/// Several products of the same input in one dispatch on the kernel pool (the q, k and v
/// projections, or gate and up): `outs[i] = x @ mats[i]^T`, `[m, mats[i].rows()]` each.
/// The input is quantized once per activation format the matrices need, and the results are
/// exactly those of separate [`QMatrix::matmul`] calls.
pub fn matmul_group(mats: &[&QMatrix], x: &[f32], m: usize, outs: &mut [&mut [f32]]) {
    group(mats, ActsIn::Ready(x), m, outs)
}

/// Fills a range of rows of a product's input (`rows` starts at the range's first row)
/// before they are quantized; see [`matmul_group_prep`].
pub type Prep<'a> = &'a (dyn Fn(std::ops::Range<usize>, &mut [f32]) + Sync);

/// [`matmul_group`] whose input rows are first made by `prep` (`prep(r, rows)` writes rows
/// `r` of `x`, `rows` being `x[r.start * cols..r.end * cols]`; a residual add and RMSNorm,
/// the gated activation), in the same pool job as their quantization: each row range is
/// prepared and quantized by one thread, so the preparation costs no dispatch of its own
/// and runs on all threads. Rows must not depend on one another. The results are those of
/// `prep(0..m, x)` followed by [`matmul_group`].
pub fn matmul_group_prep(mats: &[&QMatrix], x: &mut [f32], m: usize, outs: &mut [&mut [f32]], prep: Prep<'_>) {
    group(mats, ActsIn::Prep(x, prep), m, outs)
}

/// A product's input: ready, or to be made row range by row range ([`matmul_group_prep`]).
enum ActsIn<'a, 'p> {
    Ready(&'a [f32]),
    Prep(&'a mut [f32], Prep<'p>),
}

fn group(mats: &[&QMatrix], xin: ActsIn<'_, '_>, m: usize, outs: &mut [&mut [f32]]) {
    assert!(!mats.is_empty() && mats.len() <= MAX_GROUP, "matmul_group takes 1 to {MAX_GROUP} matrices");
    assert_eq!(mats.len(), outs.len(), "matmul_group: one output per matrix");
    let cols = mats[0].cols;
    // The first quantization prepares the rows (`pending`); the others read them (`x`).
    let (mut x, mut pending): (&[f32], _) = match xin {
        ActsIn::Ready(x) => (x, None),
        ActsIn::Prep(x, prep) => (&[], Some((x, prep))),
    };
    assert_eq!(pending.as_ref().map_or(x.len(), |p| p.0.len()), m * cols, "matmul_group: x has the wrong length");
    // Activations: one quantization per distinct format key.
    let mut acts: [Option<QuantizedActs>; MAX_GROUP] = Default::default();
    let mut which = [0usize; MAX_GROUP];
    let mut bytes: [std::borrow::Cow<'_, [u8]>; MAX_GROUP] = Default::default();
    let mut ptrs: [SendPtr; MAX_GROUP] = std::array::from_fn(|_| SendPtr(std::ptr::null_mut()));
    let mut first = [0usize; MAX_GROUP + 1];
    let mut chunk = [0usize; MAX_GROUP];
    let mut work = 0;
    for (i, (w, out)) in mats.iter().zip(outs.iter_mut()).enumerate() {
        assert_eq!(w.cols, cols, "matmul_group: matrices of different widths");
        assert_eq!(out.len(), m * w.rows, "matmul_group: out has the wrong length");
        which[i] = match acts.iter().position(|a| a.as_ref().is_some_and(|a| a.fits(w))) {
            Some(k) => k,
            None => {
                let k = acts.iter().position(Option::is_none).unwrap_or(0);
                acts[k] = Some(match pending.take() {
                    Some((xm, prep)) => {
                        let a = QuantizedActs::for_matrix_prep(w, xm, m, prep);
                        x = xm;
                        a
                    }
                    None => QuantizedActs::for_matrix(w, x, m),
                });
                k
            }
        };
        bytes[i] = match &acts[which[i]] {
            Some(a) => w.bytes_for(a),
            None => Default::default(),
        };
        ptrs[i] = SendPtr(out.as_mut_ptr());
        chunk[i] = chunk_len(w.rows, m);
        first[i + 1] = first[i] + w.rows.div_ceil(chunk[i]);
        work += w.rows * m * cols;
    }
    let n = mats.len();
    let job = |c: usize| {
        let mut i = 0;
        while c >= first[i + 1] {
            i += 1;
        }
        let r0 = (c - first[i]) * chunk[i];
        let range = r0..(r0 + chunk[i]).min(mats[i].rows);
        if let Some(a) = &acts[which[i]] {
            mats[i].product_rows(&bytes[i], a, &ptrs[i], range);
        }
    };
    run_chunks(first[n], work, &job);
}

/// Split `rows` weight rows into chunks and run `job` on each chunk's range: on the kernel
/// pool when the product (`work` multiply-adds) is large enough, several chunks per thread so
/// that a descheduled thread delays little (see `pool::Pool::run_chunks`).
fn for_row_chunks(rows: usize, m: usize, work: usize, job: &(dyn Fn(std::ops::Range<usize>) + Sync)) {
    let chunk = chunk_len(rows, m);
    let chunks = rows.div_ceil(chunk);
    run_chunks(chunks, work, &|c: usize| job(c * chunk..((c + 1) * chunk).min(rows)));
}

/// Run `job` on chunks `0..chunks`: on the kernel pool when the product (`work`
/// multiply-adds) is large enough to pay for it, else inline.
fn run_chunks(chunks: usize, work: usize, job: &(dyn Fn(usize) + Sync)) {
    if work < 64 * 1024 {
        (0..chunks).for_each(job);
    } else {
        pool::pool().run_chunks(chunks, job);
    }
}

/// Rows per chunk when `m` rows (`values` values in all) of cheap per-row work are split
/// over the kernel pool: one chunk per thread when there are several rows and enough values
/// to pay for a dispatch (a batch's step: otherwise the pool's other threads wait on it),
/// else all `m` rows in one chunk.
pub fn rows_per_thread(m: usize, values: usize) -> usize {
    let nth = pool::pool().threads();
    if m < 2 || nth == 1 || values < 2048 {
        return m.max(1);
    }
    m.div_ceil(nth)
}

/// Run `f` on the rows `0..m` of an activation layout (`values` values in all), in the
/// ranges [`rows_per_thread`] gives. Each row comes out the same either way.
fn by_rows(m: usize, values: usize, f: &(dyn Fn(std::ops::Range<usize>) + Sync)) {
    let per = rows_per_thread(m, values);
    if per >= m {
        return f(0..m);
    }
    pool::pool().run_chunks(m.div_ceil(per), &|c| f(c * per..((c + 1) * per).min(m)));
}

/// Weight rows per chunk of a product over `rows` weight rows and `m` activation rows.
fn chunk_len(rows: usize, m: usize) -> usize {
    let nth = pool::pool().threads();
    if nth == 1 {
        return rows.max(1);
    }
    if m <= 16 {
        // Decode (one sequence, or a batch of up to 16): memory-bound, so each thread reads
        // one contiguous stretch (the prefetching runs on without restarting at every chunk;
        // on a quiet 2-core machine this is ~1.3x the tokens/s of 8 chunks per thread for one
        // row, and 3-6% more for 4 to 16 rows of Qwen2.5-0.5B).
        // (At least 16: a matrix of no rows, a restricted output layer's empty head, is
        // then zero chunks rather than a division by zero.)
        return (rows.div_ceil(nth).div_ceil(16) * 16).max(16);
    }
    (rows / (nth * 8)).clamp(16, 512).div_ceil(16) * 16
}

/// A raw pointer into one output buffer, shared by the pool's threads while each writes its
/// own disjoint part of the buffer (the one such wrapper in the workspace; for plain chunks
/// of a slice, [`pool::Pool::for_each_chunk_mut`] needs no pointer at all).
///
/// Creating one is safe; dereferencing [`ptr`](Self::ptr) is `unsafe`, and the caller must
/// ensure that the buffer outlives every use and that no two threads touch the same element.
pub struct SendPtr<T = f32>(pub *mut T);
// SAFETY: the wrapper only moves the address between threads; every dereference is an
// `unsafe` block at the call site that writes a range no other thread touches.
unsafe impl<T: Send> Sync for SendPtr<T> {}
unsafe impl<T: Send> Send for SendPtr<T> {}

impl<T> SendPtr<T> {
    /// The pointer (a method, so that closures capture the `SendPtr`, not its field).
    pub fn ptr(&self) -> *mut T {
        self.0
    }
}

thread_local! {
    static SCRATCH_Q8: RefCell<Vec<BlockQ8>> = const { RefCell::new(Vec::new()) };
    static SCRATCH_Q8K: RefCell<Vec<BlockQ8K>> = const { RefCell::new(Vec::new()) };
}

#[cfg(target_arch = "x86_64")]
thread_local! {
    static SCRATCH_PAIRS: RefCell<Vec<avx512::Pair>> = const { RefCell::new(Vec::new()) };
    static SCRATCH_CORR: RefCell<Vec<i32>> = const { RefCell::new(Vec::new()) };
    static SCRATCH_BLOCKK: RefCell<Vec<avx512::BlockK>> = const { RefCell::new(Vec::new()) };
    static SCRATCH_AMX_TILES: RefCell<Vec<amx::Tile>> = const { RefCell::new(Vec::new()) };
    static SCRATCH_AMX_SBS: RefCell<Vec<amx::SbActs>> = const { RefCell::new(Vec::new()) };
    static SCRATCH_AMX_ACC: RefCell<Vec<[[f32; 16]; 16]>> = const { RefCell::new(Vec::new()) };
}

/// Take a per-thread scratch vector, cleared and resized to `n`.
fn take_scratch<T: Clone + Default + 'static>(key: &'static std::thread::LocalKey<RefCell<Vec<T>>>, n: usize) -> Vec<T> {
    let mut v = key.with(|c| std::mem::take(&mut *c.borrow_mut()));
    v.clear();
    v.resize(n, T::default());
    v
}

/// A per-thread scratch vector of length `n` for a caller that overwrites every element: its
/// contents are left from the last use (a batch's activations are not zeroed just before
/// they are written), and an empty vector when `n` is 0 (the slot stays for another user).
fn take_to_fill<T: Clone + Default + 'static>(key: &'static std::thread::LocalKey<RefCell<Vec<T>>>, n: usize) -> Vec<T> {
    if n == 0 {
        return Vec::new();
    }
    let mut v = key.with(|c| std::mem::take(&mut *c.borrow_mut()));
    if v.len() < n {
        v.resize(n, T::default());
    } else {
        v.truncate(n);
    }
    v
}

/// Give a scratch vector back to its per-thread slot (the larger one stays).
fn return_scratch<T: 'static>(key: &'static std::thread::LocalKey<RefCell<Vec<T>>>, v: Vec<T>) {
    if v.capacity() > 0 {
        key.with(|c| {
            let mut c = c.borrow_mut();
            if c.capacity() < v.capacity() {
                *c = v;
            }
        });
    }
}

/// Activation rows quantized for one weight format.
pub struct QuantizedActs {
    m: usize,
    cols: usize,
    k_quant: bool,
    q8: Vec<BlockQ8>,
    q8k: Vec<BlockQ8K>,
    /// Laid out for the AVX-512 kernels (`pairs` / `blockk` hold the rows).
    wide: bool,
    /// Laid out for the sixteen-rows kernels (`lanes`): `q8` plus `corr`.
    lanes: bool,
    /// Per block `-off * sum(qs)` for the lane kernels of the offset formats; for Q4_K and
    /// Q6_K, per superblock their `lanes_k::side` data.
    corr: Vec<i32>,
    /// The weight offset the pair layout was made for (`avx512::offset`).
    off: i32,
    #[cfg(target_arch = "x86_64")]
    pairs: Vec<avx512::Pair>,
    #[cfg(target_arch = "x86_64")]
    blockk: Vec<avx512::BlockK>,
    /// Laid out for the AMX kernels: sub-blocks per step of the format (`amx::groups`), 0 if
    /// not.
    amx_g: usize,
    #[cfg(target_arch = "x86_64")]
    amx_tiles: Vec<amx::Tile>,
    #[cfg(target_arch = "x86_64")]
    amx_sbs: Vec<amx::SbActs>,
}

impl QuantizedActs {
    /// Quantize `m` rows of `w.cols()` values for the products of `w`. Reuses per-thread
    /// buffers (returned by `Drop`), so the decode loop does not allocate.
    pub fn for_matrix(w: &QMatrix, x: &[f32], m: usize) -> Self {
        Self::with_kernels_lanes(w.qtype, ActsIn::Ready(x), m, w.cols, has_avx512() && wide_format(w.qtype), w.takes_lanes())
    }

    /// [`for_matrix`](Self::for_matrix) of the rows `prep` writes into `x`, each range
    /// prepared by the thread that quantizes it (see [`matmul_group_prep`]).
    fn for_matrix_prep(w: &QMatrix, x: &mut [f32], m: usize, prep: Prep<'_>) -> Self {
        Self::with_kernels_lanes(w.qtype, ActsIn::Prep(x, prep), m, w.cols, has_avx512() && wide_format(w.qtype), w.takes_lanes())
    }

    /// Laid out for the AVX-512 kernels when `wide` (which needs [`has_avx512`]) or for the
    /// AVX2/portable ones; the lane kernels for the formats that take them unpacked.
    #[cfg(test)]
    fn with_kernels(t: QType, x: &[f32], m: usize, cols: usize, wide: bool) -> Self {
        #[cfg(target_arch = "x86_64")]
        let lanes = has_lanes() && lanes::handles(t) && lanes::unpacked(t);
        #[cfg(not(target_arch = "x86_64"))]
        let lanes = false;
        Self::with_kernels_lanes(t, ActsIn::Ready(x), m, cols, wide, lanes)
    }

    /// [`with_kernels`](Self::with_kernels); `lanes`: the sixteen-rows kernels where they
    /// apply (only when [`has_lanes`] holds).
    fn with_kernels_lanes(t: QType, xin: ActsIn<'_, '_>, m: usize, cols: usize, wide: bool, lanes: bool) -> Self {
        // The input: ready to read, or written by `prep` range by range (through `xp`, so
        // that no reference covers rows another thread is writing).
        let (xr, xp, prep): (&[f32], SendPtr, Option<Prep<'_>>) = match xin {
            ActsIn::Ready(x) => {
                assert_eq!(x.len(), m * cols);
                (x, SendPtr(std::ptr::null_mut()), None)
            }
            ActsIn::Prep(x, prep) => {
                assert_eq!(x.len(), m * cols);
                (&[], SendPtr(x.as_mut_ptr()), Some(prep))
            }
        };
        let k_quant = t.k_quant();
        let mut s = Self {
            m,
            cols,
            k_quant,
            q8: Vec::new(),
            q8k: Vec::new(),
            wide: false,
            lanes: false,
            corr: Vec::new(),
            off: 0,
            #[cfg(target_arch = "x86_64")]
            pairs: Vec::new(),
            #[cfg(target_arch = "x86_64")]
            blockk: Vec::new(),
            amx_g: 0,
            #[cfg(target_arch = "x86_64")]
            amx_tiles: Vec::new(),
            #[cfg(target_arch = "x86_64")]
            amx_sbs: Vec::new(),
        };
        // The layout the products take, decided before any row is quantized so that each
        // row range below is quantized and laid out in one pass, on the kernel pool when
        // there are several rows (a batch's decode step: otherwise the pool's other threads
        // wait on this serial work before every product).
        #[cfg(target_arch = "x86_64")]
        let to_lanes = wide && lanes && lanes::handles(t);
        #[cfg(target_arch = "x86_64")]
        let to_amx = !to_lanes && wide && amx::use_for(t, m) && has_amx();
        #[cfg(target_arch = "x86_64")]
        let to_wide = !to_lanes && !to_amx && wide && has_avx512() && wide_format(t);
        let (nq8, nq8k) = if k_quant { (0, cols / 256) } else { (cols / 32, 0) };
        s.q8 = take_to_fill(&SCRATCH_Q8, m * nq8);
        s.q8k = take_to_fill(&SCRATCH_Q8K, m * nq8k);
        #[cfg(target_arch = "x86_64")]
        let (npairs, nk) = (if to_wide && !k_quant { nq8.div_ceil(2) } else { 0 }, if to_wide && k_quant { nq8k } else { 0 });
        #[cfg(target_arch = "x86_64")]
        {
            s.off = if to_lanes {
                lanes::offset(t)
            } else if to_wide && !k_quant {
                avx512::offset(t)
            } else {
                0
            };
            if to_lanes && k_quant {
                s.corr = take_to_fill(&SCRATCH_CORR, m * nq8k * lanes_k::SIDE);
            } else if to_lanes && s.off != 0 {
                s.corr = take_to_fill(&SCRATCH_CORR, m * nq8);
            }
            s.pairs = take_to_fill(&SCRATCH_PAIRS, m * npairs);
            s.blockk = take_to_fill(&SCRATCH_BLOCKK, m * nk);
        }
        {
            let q8 = SendPtr(s.q8.as_mut_ptr());
            let q8k = SendPtr(s.q8k.as_mut_ptr());
            #[cfg(target_arch = "x86_64")]
            let (corr, pairs, blockk) = (SendPtr(s.corr.as_mut_ptr()), SendPtr(s.pairs.as_mut_ptr()), SendPtr(s.blockk.as_mut_ptr()));
            #[cfg(target_arch = "x86_64")]
            let (with_corr, off) = (!s.corr.is_empty(), s.off);
            let rows = |r: std::ops::Range<usize>| {
                // SAFETY: each call gets its own range of rows, and every buffer holds `m`
                // rows of its per-row length, so the slices below are disjoint parts of
                // buffers that outlive the call.
                let part = |p: *mut u8, per: usize, size: usize| unsafe { (p.add(r.start * per * size), r.len() * per) };
                let xs: &[f32] = match prep {
                    None => &xr[r.start * cols..r.end * cols],
                    Some(prep) => {
                        // SAFETY: the range's rows of the caller's `x` (exclusively borrowed
                        // for this call), written by this thread only.
                        let rows_x = unsafe { std::slice::from_raw_parts_mut(xp.ptr().add(r.start * cols), r.len() * cols) };
                        prep(r.clone(), rows_x);
                        rows_x
                    }
                };
                if k_quant {
                    let (p, n) = part(q8k.ptr() as *mut u8, nq8k, std::mem::size_of::<BlockQ8K>());
                    let out = unsafe { std::slice::from_raw_parts_mut(p as *mut BlockQ8K, n) };
                    for (xr, br) in xs.chunks_exact(cols).zip(out.chunks_exact_mut(nq8k)) {
                        quantize_q8k(xr, br);
                    }
                    #[cfg(target_arch = "x86_64")]
                    if with_corr {
                        let (p, n) = part(corr.ptr() as *mut u8, nq8k * lanes_k::SIDE, std::mem::size_of::<i32>());
                        lanes_k::side(t, out, unsafe { std::slice::from_raw_parts_mut(p as *mut i32, n) });
                    }
                    #[cfg(target_arch = "x86_64")]
                    if nk > 0 {
                        let (p, n) = part(blockk.ptr() as *mut u8, nk, std::mem::size_of::<avx512::BlockK>());
                        avx512::blockk_from(out, unsafe { std::slice::from_raw_parts_mut(p as *mut avx512::BlockK, n) });
                    }
                } else {
                    let (p, n) = part(q8.ptr() as *mut u8, nq8, std::mem::size_of::<BlockQ8>());
                    let out = unsafe { std::slice::from_raw_parts_mut(p as *mut BlockQ8, n) };
                    for (xr, br) in xs.chunks_exact(cols).zip(out.chunks_exact_mut(nq8)) {
                        quantize_q8(xr, br);
                    }
                    #[cfg(target_arch = "x86_64")]
                    if with_corr {
                        let (p, n) = part(corr.ptr() as *mut u8, nq8, std::mem::size_of::<i32>());
                        lanes::corrections(out, off, unsafe { std::slice::from_raw_parts_mut(p as *mut i32, n) });
                    }
                    #[cfg(target_arch = "x86_64")]
                    if npairs > 0 {
                        let (p, n) = part(pairs.ptr() as *mut u8, npairs, std::mem::size_of::<avx512::Pair>());
                        let prs = unsafe { std::slice::from_raw_parts_mut(p as *mut avx512::Pair, n) };
                        for (br, pr) in out.chunks_exact(nq8).zip(prs.chunks_exact_mut(npairs)) {
                            avx512::pairs_from(br, off, pr);
                        }
                    }
                }
            };
            by_rows(m, m * cols, &rows);
        }
        #[cfg(target_arch = "x86_64")]
        {
            s.lanes = to_lanes;
            s.wide = to_wide;
            if to_amx {
                let nsb = cols / 256;
                let chunks = amx::chunks(t, m);
                let mut tiles = take_scratch(&SCRATCH_AMX_TILES, chunks * nsb * 4);
                let mut sbs = take_scratch(&SCRATCH_AMX_SBS, chunks * nsb);
                amx::acts_from(t, &s.q8k, m, nsb, &mut tiles, &mut sbs);
                s.amx_g = amx::groups(t);
                s.amx_tiles = tiles;
                s.amx_sbs = sbs;
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = wide;
        s
    }
    /// Lay out (quantized 32-value) activations for the lane kernels of format `t`.
    #[cfg(all(test, target_arch = "x86_64"))]
    fn lay_out_lanes(&mut self, t: QType) {
        self.lanes = true;
        self.off = lanes::offset(t);
        if self.k_quant {
            let mut c = take_scratch(&SCRATCH_CORR, self.q8k.len() * lanes_k::SIDE);
            lanes_k::side(t, &self.q8k, &mut c);
            self.corr = c;
        } else if self.off != 0 {
            let mut c = take_scratch(&SCRATCH_CORR, self.q8.len());
            lanes::corrections(&self.q8, self.off, &mut c);
            self.corr = c;
        }
    }

    /// Activations for the lane kernels of any format they can compute (tests; needs
    /// [`has_lanes`]).
    #[cfg(all(test, target_arch = "x86_64"))]
    fn for_lane_kernels(t: QType, x: &[f32], m: usize, cols: usize) -> Self {
        let mut s = Self::with_kernels_lanes(t, ActsIn::Ready(x), m, cols, false, false);
        s.lay_out_lanes(t);
        s
    }

    /// Whether these activations can be used with the products of `w`: the AVX2/portable
    /// layouts serve every format of their kind (32-value or k-quant); the AVX-512 pair
    /// layout carries the weight offset of its format; the lane layout serves the matrices
    /// that take the lane kernels.
    pub fn fits(&self, w: &QMatrix) -> bool {
        let t = w.qtype;
        if t.k_quant() != self.k_quant {
            return false;
        }
        #[cfg(target_arch = "x86_64")]
        if self.amx_g != 0 {
            return amx::handles(t) && amx::groups(t) == self.amx_g;
        }
        #[cfg(target_arch = "x86_64")]
        if self.lanes {
            // (Tests run the kernels of every format they compute; in use, only the formats
            // that go to them take them, so a format never mixes arithmetics.)
            #[cfg(test)]
            if lanes::computes(t) && (!t.k_quant() || w.is_packed()) {
                return lanes::offset(t) == self.off;
            }
            return w.takes_lanes() && lanes::offset(t) == self.off;
        }
        if !self.wide {
            return true;
        }
        #[cfg(target_arch = "x86_64")]
        if w.takes_lanes() {
            return false;
        }
        #[cfg(target_arch = "x86_64")]
        return wide_format(t) && (self.k_quant || avx512::offset(t) == self.off);
        #[cfg(not(target_arch = "x86_64"))]
        false
    }

    #[cfg(target_arch = "x86_64")]
    fn row_pairs(&self, i: usize) -> &[avx512::Pair] {
        let n = (self.cols / 32).div_ceil(2);
        &self.pairs[i * n..(i + 1) * n]
    }
    #[cfg(target_arch = "x86_64")]
    fn row_k(&self, i: usize) -> &[avx512::BlockK] {
        let n = self.cols / 256;
        &self.blockk[i * n..(i + 1) * n]
    }
    fn row_q8(&self, i: usize) -> &[BlockQ8] {
        let n = self.cols / 32;
        &self.q8[i * n..(i + 1) * n]
    }
    fn row_q8k(&self, i: usize) -> &[BlockQ8K] {
        let n = self.cols / 256;
        &self.q8k[i * n..(i + 1) * n]
    }
}

impl Drop for QuantizedActs {
    fn drop(&mut self) {
        return_scratch(&SCRATCH_Q8, std::mem::take(&mut self.q8));
        return_scratch(&SCRATCH_Q8K, std::mem::take(&mut self.q8k));
        #[cfg(target_arch = "x86_64")]
        {
            return_scratch(&SCRATCH_PAIRS, std::mem::take(&mut self.pairs));
            return_scratch(&SCRATCH_CORR, std::mem::take(&mut self.corr));
            return_scratch(&SCRATCH_BLOCKK, std::mem::take(&mut self.blockk));
            return_scratch(&SCRATCH_AMX_TILES, std::mem::take(&mut self.amx_tiles));
            return_scratch(&SCRATCH_AMX_SBS, std::mem::take(&mut self.amx_sbs));
        }
    }
}

#[cfg(test)]
mod tests;
