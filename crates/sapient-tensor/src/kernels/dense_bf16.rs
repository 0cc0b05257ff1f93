//! Dense (f32 or f16) weights prepacked at load for Intel AMX-BF16 products at close to f32
//! accuracy, for encoders whose weights are not quantized (sentence embedders).
//!
//! Each f32 value `x` is split into two bf16 values, `hi = bf16(x)` and `lo = bf16(x - hi)`
//! (round to nearest even), which together hold 16 of its 24 mantissa bits (relative error
//! below 2^-16; an f16 weight's 11 bits are held exactly). A product sums the three terms
//! that matter, `a_hi·b_hi + a_hi·b_lo + a_lo·b_hi` (the dropped `a_lo·b_lo` is below 2^-16
//! of the product), with `tdpbf16ps`, which accumulates in f32: three tile products per
//! 16 x 16 x 32 block, still several times the f32 FMA rate of the vector units.
//!
//! Layout. Weights `[n, k]` are stored as tiles of 16 output columns by 32 inputs, in
//! `tdpbf16ps`'s B layout (tile row `r` holds, for each column `c`, the pair of inputs
//! `2r, 2r + 1`): f32 sources as their `hi` and `lo` tiles, f16 sources as f16 tiles (half
//! the bytes to read), split per panel of 16 columns when a product uses them. Activations
//! are split into A tiles, padded to a multiple of 32 rows and 32 columns: for each block of
//! 16 rows and each 32 inputs, a `hi` and a `lo` tile of 1 KB, contiguous, so tile loads
//! stream. Split weights are multiplied two panels at a time against two blocks of rows (four
//! sums in tiles, eight tile loads per twelve products); the bias (and GELU for
//! [`DenseMatrix::matmul_gelu`]) is applied to each 32 x 32 block of sums while in cache.
//!
//! Every output element depends only on its own input row and the weights, so a row gives
//! the same bits alone or in any batch. Machines without AMX-BF16 keep the weights in f32
//! and use [`super::matmul_f32`], whose batches of more than 8 rows take a GEMM that sums in
//! another order than one row does (on AVX512-BF16 the two-half products would cost three
//! `vdpbf16ps` per pair of products, slower than f32 FMAs), unless the weights are packed for
//! the blocked f32 or 16-bit integer kernels (AVX-512 or AVX2).
//!
//! [`DenseMatrix::from_f32_bf16`] is the lower-precision option for models that tolerate
//! it: bf16 weights and activations, one product, f32 sums, as a one-tap
//! [`super::ConvBf16`] over the rows (AMX-BF16 or AVX512-BF16).

use super::dense::Level;
use super::pool;
use std::cell::RefCell;

/// bf16 (or f16) values per 16 x 32 tile.
const TILE: usize = 512;

enum Store {
    /// `[n, k]` f32 for [`super::matmul_f32`] (no AMX-BF16 on this machine).
    F32(Vec<f32>),
    /// `[n / 16][k / 32][hi tile, lo tile]`.
    Split(Vec<u16>),
    /// `[n / 16][k / 32][f16 tile]`.
    F16(Vec<u16>),
    /// bf16 weights, one bf16 product ([`DenseMatrix::from_f32_bf16`]): a one-tap
    /// convolution over the rows.
    Bf16(super::ConvBf16),
    /// f32 panels for the blocked AVX-512 or AVX2 kernel ([`DenseMatrix::from_f32_blocked`]).
    Panels(super::dense_f32::Panels),
    /// 13-bit integer panels for the AVX512-VNNI, AVX-VNNI or AVX2 kernel
    /// ([`DenseMatrix::from_f32_int16`]).
    Int(super::dense_i16::IntPanels),
}

/// A dense weight matrix `[n, k]` (PyTorch's `[out, in]` layout) prepacked for
/// [`DenseMatrix::matmul`].
pub struct DenseMatrix {
    n: usize,
    k: usize,
    store: Store,
}

impl std::fmt::Debug for DenseMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.store {
            Store::F32(_) => "f32",
            Store::Split(_) => "bf16x2 (AMX)",
            Store::F16(_) => "f16 (AMX)",
            Store::Bf16(_) => "bf16",
            Store::Panels(_) => "f32 panels (AVX-512 / AVX2)",
            Store::Int(_) => "13-bit x 14-bit integers (VNNI / AVX2)",
        };
        f.debug_struct("DenseMatrix").field("n", &self.n).field("k", &self.k).field("store", &kind).finish()
    }
}

/// Whether products of [`DenseMatrix`] run on AMX-BF16 here (AMX-TILE and AMX-BF16 with the
/// tile state granted, AVX-512; [`super::KernelOptions::amx`] turns it off).
pub fn has_amx_bf16() -> bool {
    use std::sync::atomic::{AtomicU8, Ordering};
    static STATE: AtomicU8 = AtomicU8::new(0);
    match STATE.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => {
            #[cfg(target_arch = "x86_64")]
            let yes = super::has_amx() && std::arch::x86_64::__cpuid_count(7, 0).edx & (1 << 22) != 0;
            #[cfg(not(target_arch = "x86_64"))]
            let yes = false;
            STATE.store(if yes { 1 } else { 2 }, Ordering::Relaxed);
            yes
        }
    }
}

#[inline(always)]
fn split1(x: f32) -> (u16, u16) {
    let h = super::bf16_bits(x);
    (h, super::bf16_bits(x - f32::from_bits((h as u32) << 16)))
}

/// Tiles `[n / 16][k / 32][512]` of `get(row, col)`, zero outside `n x k`.
fn pack<T: Copy>(n: usize, k: usize, zero: T, get: impl Fn(usize, usize) -> T) -> Vec<T> {
    let (nb, kb) = (n.div_ceil(16), k.div_ceil(32));
    let mut v = vec![zero; nb * kb * TILE];
    for b in 0..nb {
        for s in 0..kb {
            let t = &mut v[(b * kb + s) * TILE..][..TILE];
            for r in 0..16 {
                for c in 0..16 {
                    for j in 0..2 {
                        let (row, col) = (b * 16 + c, s * 32 + 2 * r + j);
                        if row < n && col < k {
                            t[r * 32 + c * 2 + j] = get(row, col);
                        }
                    }
                }
            }
        }
    }
    v
}

impl DenseMatrix {
    /// From f32 values `[n, k]`.
    pub fn from_f32(w: &[f32], n: usize, k: usize) -> Self {
        assert!(w.len() >= n * k, "DenseMatrix: weight is {} values, not {n} x {k}", w.len());
        if !has_amx_bf16() {
            return Self { n, k, store: Store::F32(w[..n * k].to_vec()) };
        }
        let p = pack(n, k, 0.0f32, |r, c| w[r * k + c]);
        let mut v = vec![0u16; p.len() * 2];
        for (t, o) in p.chunks_exact(TILE).zip(v.chunks_exact_mut(2 * TILE)) {
            let (hi, lo) = o.split_at_mut(TILE);
            for i in 0..TILE {
                (hi[i], lo[i]) = split1(t[i]);
            }
        }
        Self { n, k, store: Store::Split(v) }
    }

    /// From f16 values `[n, k]` (their bits), kept in f16 where AMX-BF16 runs the products.
    pub fn from_f16_bits(w: &[u16], n: usize, k: usize) -> Self {
        assert!(w.len() >= n * k, "DenseMatrix: weight is {} values, not {n} x {k}", w.len());
        if !has_amx_bf16() {
            let f: Vec<f32> = w[..n * k].iter().map(|&b| half::f16::from_bits(b).to_f32()).collect();
            return Self { n, k, store: Store::F32(f) };
        }
        Self { n, k, store: Store::F16(pack(n, k, 0u16, |r, c| w[r * k + c])) }
    }

    /// [`from_f32`](Self::from_f32), except that without AMX-BF16, on AVX-512 or AVX2, the
    /// products take the blocked f32 kernel of `dense_f32.rs` instead of
    /// [`super::matmul_f32`] (faster for a few rows to a few thousand; a row gives the same
    /// bits alone as in a batch, and the same bits on AVX2 as on AVX-512).
    pub fn from_f32_blocked(w: &[f32], n: usize, k: usize) -> Self {
        assert!(w.len() >= n * k, "DenseMatrix: weight is {} values, not {n} x {k}", w.len());
        if has_amx_bf16() || Level::detect().is_none() {
            return Self::from_f32(w, n, k);
        }
        Self { n, k, store: Store::Panels(super::dense_f32::Panels::new(n, k, |r, c| w[r * k + c])) }
    }

    /// [`from_f16_bits`](Self::from_f16_bits) with the choice of
    /// [`from_f32_blocked`](Self::from_f32_blocked); the blocked kernel keeps the weights in
    /// f16 (half the bytes to read) and widens them in registers.
    pub fn from_f16_bits_blocked(w: &[u16], n: usize, k: usize) -> Self {
        assert!(w.len() >= n * k, "DenseMatrix: weight is {} values, not {n} x {k}", w.len());
        if has_amx_bf16() || Level::detect().is_none() {
            return Self::from_f16_bits(w, n, k);
        }
        Self { n, k, store: Store::Panels(super::dense_f32::Panels::new_f16(n, k, |r, c| w[r * k + c])) }
    }

    /// From f32 values `[n, k]` as 13-bit integers (one scale per row), each product
    /// quantizing its activations to 14 bits per block of 32 and summing with 16-bit
    /// multiply-adds: AVX512-VNNI's or AVX-VNNI's `vpdpwssd` (twice the f32 FMA rate), or
    /// AVX2's `vpmaddwd` (the error bounds are in `dense_i16.rs`: under 2^-13 of a row's
    /// largest weight, 2^-14 of a block's largest activation); `None` without AVX-512 VNNI
    /// or AVX2 ([`super::has_avx512`], [`super::has_avx2`]). A row gives the same bits alone
    /// as in a batch, and every level the same bits.
    pub fn from_f32_int16(w: &[f32], n: usize, k: usize) -> Option<Self> {
        assert!(w.len() >= n * k, "DenseMatrix: weight is {} values, not {n} x {k}", w.len());
        Level::detect().is_some().then(|| Self { n, k, store: Store::Int(super::dense_i16::IntPanels::new(n, k, |r, c| w[r * k + c])) })
    }

    /// [`from_f32_int16`](Self::from_f32_int16) of f16 values (their bits).
    pub fn from_f16_bits_int16(w: &[u16], n: usize, k: usize) -> Option<Self> {
        assert!(w.len() >= n * k, "DenseMatrix: weight is {} values, not {n} x {k}", w.len());
        let get = |r: usize, c: usize| half::f16::from_bits(w[r * k + c]).to_f32();
        Level::detect().is_some().then(|| Self { n, k, store: Store::Int(super::dense_i16::IntPanels::new(n, k, get)) })
    }

    /// From f32 values `[n, k]` rounded to bf16, each product rounding its activations to
    /// bf16 too and summing in f32 (relative error of a product about 2^-8: for models that
    /// tolerate it, at a third of the tile work of the two-half products on AMX-BF16 and
    /// twice the f32 FMA rate on AVX512-BF16); `None` where neither runs here
    /// ([`super::ConvBf16::new`]).
    pub fn from_f32_bf16(w: &[f32], n: usize, k: usize) -> Option<Self> {
        assert!(w.len() >= n * k, "DenseMatrix: weight is {} values, not {n} x {k}", w.len());
        let c = super::ConvBf16::new(&w[..n * k], n, k, 1)?;
        Some(Self { n, k, store: Store::Bf16(c) })
    }

    pub fn rows(&self) -> usize {
        self.n
    }
    pub fn cols(&self) -> usize {
        self.k
    }

    /// `out[m, n] = x[m, k] · wᵀ (+ bias)`, split over the kernel pool by output columns.
    pub fn matmul(&self, x: &[f32], m: usize, bias: Option<&[f32]>, out: &mut [f32]) {
        self.product(x, m, bias, false, out)
    }

    /// `out[m, n] = gelu(x[m, k] · wᵀ (+ bias))`, GELU in its erf form
    /// ([`super::gelu_erf_in_place`]), applied to each block of results while it is still in
    /// cache: the same values as [`DenseMatrix::matmul`] followed by that function.
    pub fn matmul_gelu(&self, x: &[f32], m: usize, bias: Option<&[f32]>, out: &mut [f32]) {
        self.product(x, m, bias, true, out)
    }

    /// A one-dimensional convolution whose im2col rows this matrix multiplies (weights
    /// `[n, taps * cin]`, tap major), from the time-major input without building those rows,
    /// where the weights are 16-bit integers ([`from_f32_int16`](Self::from_f32_int16)): see
    /// [`super::dense_i16::IntPanels::conv`] (the same bits as [`matmul`](Self::matmul) on
    /// the rows). `false` (nothing written) elsewhere, for the caller's own im2col product.
    pub fn conv(&self, x: &[f32], shape: super::ConvShape, bias: Option<&[f32]>, out: &mut [f32]) -> bool {
        match &self.store {
            Store::Int(p) => p.conv(x, shape, bias, out),
            _ => false,
        }
    }

    fn product(&self, x: &[f32], m: usize, bias: Option<&[f32]>, gelu: bool, out: &mut [f32]) {
        let (n, k) = (self.n, self.k);
        assert!(x.len() >= m * k, "DenseMatrix::matmul: input is {} values, not {m} x {k}", x.len());
        assert!(out.len() >= m * n, "DenseMatrix::matmul: output is {} values, not {m} x {n}", out.len());
        if let Some(b) = bias {
            assert!(b.len() >= n, "DenseMatrix::matmul: bias is {} values, not {n}", b.len());
        }
        if m == 0 || n == 0 {
            return;
        }
        match &self.store {
            Store::Panels(p) => p.matmul(x, m, bias, gelu, out),
            Store::Int(p) => p.matmul(x, m, bias, gelu, out),
            Store::F32(w) => {
                super::matmul_f32(w, n, k, x, m, out);
                if let Some(b) = bias {
                    for r in out[..m * n].chunks_exact_mut(n) {
                        for (o, b) in r.iter_mut().zip(b) {
                            *o += b;
                        }
                    }
                }
                if gelu {
                    super::gelu_erf_in_place(&mut out[..m * n]);
                }
            }
            Store::Bf16(c) => {
                BF16_ROWS.with(|a| {
                    let mut a = a.borrow_mut();
                    let ld = c.ld();
                    let frames = c.frames_needed(m, 1, 1);
                    a.clear();
                    a.resize(frames * ld, 0);
                    // rows rounded (and GELU below) over the pool when there are many
                    let rows = 64;
                    let convert = |c: usize, dst: &mut [u16]| {
                        for (row, dst) in x[c * rows * k..(m * k).min((c + 1) * rows * k)].chunks_exact(k).zip(dst.chunks_exact_mut(ld)) {
                            for (d, &v) in dst.iter_mut().zip(row) {
                                *d = super::bf16_bits(v);
                            }
                        }
                    };
                    if m * k < 1 << 16 {
                        for (c, dst) in a[..m * ld].chunks_mut(rows * ld).enumerate() {
                            convert(c, dst);
                        }
                    } else {
                        pool::pool().for_each_chunk_mut(&mut a[..m * ld], rows * ld, convert);
                    }
                    c.forward(&a, m, 1, 1, bias, false, out);
                });
                if gelu {
                    if m * n < 1 << 16 {
                        super::gelu_erf_in_place(&mut out[..m * n]);
                    } else {
                        pool::pool().for_each_chunk_mut(&mut out[..m * n], 64 * n, |_, c| super::gelu_erf_in_place(c));
                    }
                }
            }
            #[cfg(target_arch = "x86_64")]
            Store::Split(w) => amx_product(w, false, n, k, x, m, bias, gelu, out),
            #[cfg(target_arch = "x86_64")]
            Store::F16(w) => amx_product(w, true, n, k, x, m, bias, gelu, out),
            #[cfg(not(target_arch = "x86_64"))]
            _ => unreachable!("AMX stores are only built on x86_64"),
        }
    }
}

use super::SendPtr as Ptr;

thread_local! {
    /// The caller's split activations: `[rows / 16][k / 32][hi tile, lo tile]`, each tile
    /// 16 rows of 32 values, contiguous (A tiles load with a 64-byte stride).
    static ACTS: RefCell<Vec<u16>> = const { RefCell::new(Vec::new()) };
    /// The caller's activations rounded to bf16 for [`Store::Bf16`], rows of
    /// [`super::ConvBf16::ld`] values.
    static BF16_ROWS: RefCell<Vec<u16>> = const { RefCell::new(Vec::new()) };
    /// A worker's split panel of f16 weights.
    static PANEL: RefCell<Vec<u16>> = const { RefCell::new(Vec::new()) };
}

#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn amx_product(w: &[u16], f16: bool, n: usize, k: usize, x: &[f32], m: usize, bias: Option<&[f32]>, gelu: bool, out: &mut [f32]) {
    let kb = k.div_ceil(32);
    let kp = kb * 32;
    let mp = m.div_ceil(32) * 32;
    ACTS.with(|a| {
        let mut a = a.borrow_mut();
        if a.len() < 2 * mp * kp {
            a.resize(2 * mp * kp, 0);
        }
        // Split the activations, rows over the pool when there are many.
        let ap = Ptr(a.as_mut_ptr());
        const ROWS: usize = 32;
        let split = |c: usize| {
            for i in c * ROWS..((c + 1) * ROWS).min(mp) {
                // SAFETY: row i's slots of the tiles (mp * kp pairs of values) belong to this
                // chunk only; AVX-512 is present (has_amx_bf16).
                unsafe {
                    let dst = ap.ptr().add((i / 16) * kb * 2 * TILE + (i % 16) * 32);
                    if i < m {
                        split_row_tiles(&x[i * k..(i + 1) * k], kb, dst);
                    } else {
                        for s in 0..kb {
                            std::ptr::write_bytes(dst.add(s * 2 * TILE), 0, 32);
                            std::ptr::write_bytes(dst.add(s * 2 * TILE + TILE), 0, 32);
                        }
                    }
                }
            }
        };
        let schunks = mp.div_ceil(ROWS);
        if schunks == 1 || mp * kp < 64 * 1024 {
            (0..schunks).for_each(split);
        } else {
            pool::pool().run_chunks(schunks, &split);
        }
        // Rows per slab: the slab's split activations stay within ~512 KB (L2) while every
        // panel of columns passes over them (256 KB to 8 MB: within the noise on 64
        // sentences); f16 panels are split once per slab, so those take at least 128 rows
        // (5% faster than 32 on nomic-embed's 3072-wide down projection).
        let slab = ((1 << 19) / (kp * 4)).clamp(if f16 { 128 } else { 32 }, 1 << 20) / 32 * 32;
        let nbs = n.div_ceil(16);
        // Split weights go in pairs of panels (32 columns), f16 ones one panel at a time.
        let unit = if f16 { 1 } else { 2 };
        let units = nbs.div_ceil(unit);
        let threads = pool::pool().threads();
        let chunks = if m * n * k < 1 << 20 { 1 } else { (threads * 4).min(units) };
        let per = units.div_ceil(chunks) * unit;
        let o = Ptr(out.as_mut_ptr());
        let acts = a.as_ptr() as usize;
        let job = |c: usize| {
            let (b0, b1) = (c * per, ((c + 1) * per).min(nbs));
            if b0 >= b1 {
                return;
            }
            PANEL.with(|p| {
                let mut p = p.borrow_mut();
                if f16 && p.len() < kb * 2 * TILE {
                    p.resize(kb * 2 * TILE, 0);
                }
                // SAFETY: AMX-BF16 and AVX-512 are present; the buffers hold mp x kp
                // activations and nbs x kb tiles; this chunk writes only its columns.
                unsafe { panel_products(w, f16, &mut p, (b0, b1), kb, acts as *const u16, m, mp, slab, n, bias, gelu, o.ptr()) }
            });
        };
        if chunks == 1 {
            job(0);
        } else {
            pool::pool().run_chunks(chunks, &job);
        }
    });
}

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Round the f32 lanes of `b` (bits) to bf16, returned in the high halves (low halves zero).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn rne16(b: __m512i) -> __m512i {
    let lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
    let r = _mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
    _mm512_and_si512(r, _mm512_set1_epi32(0xFFFF_0000u32 as i32))
}

/// Split 16 f32 lanes into bf16 hi and lo at `h`, `l`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn split16(v: __m512, h: *mut u16, l: *mut u16) {
    let hb = rne16(_mm512_castps_si512(v));
    let r = _mm512_sub_ps(v, _mm512_castsi512_ps(hb));
    let lb = rne16(_mm512_castps_si512(r));
    _mm256_storeu_si256(h as *mut __m256i, _mm512_cvtepi32_epi16(_mm512_srli_epi32(hb, 16)));
    _mm256_storeu_si256(l as *mut __m256i, _mm512_cvtepi32_epi16(_mm512_srli_epi32(lb, 16)));
}

/// Split one row of activations into its slots of the A tiles: 32 values per tile at
/// `dst + s * 2 TILE` (hi) and `+ TILE` (lo), zero past the row's end.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn split_row_tiles(x: &[f32], kb: usize, dst: *mut u16) {
    let k = x.len();
    for s in 0..kb {
        let (h, l) = (dst.add(s * 2 * TILE), dst.add(s * 2 * TILE + TILE));
        let c0 = s * 32;
        for half in [0usize, 16] {
            let c = c0 + half;
            let v = if c + 16 <= k {
                _mm512_loadu_ps(x.as_ptr().add(c))
            } else if c < k {
                _mm512_maskz_loadu_ps(((1u32 << (k - c)) - 1) as u16, x.as_ptr().add(c))
            } else {
                _mm512_setzero_ps()
            };
            split16(v, h.add(half), l.add(half));
        }
    }
}

/// Split one f16 tile at `src` into hi/lo tiles at `dst`, prefetching the source `ahead`
/// bytes on.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn split_f16_tile(src: *const u16, dst: *mut u16) {
    for i in (0..TILE).step_by(32) {
        _mm_prefetch::<_MM_HINT_T0>((src.add(i) as *const i8).add(AHEAD));
        let v = _mm512_cvtph_ps(_mm256_loadu_si256(src.add(i) as *const __m256i));
        split16(v, dst.add(i), dst.add(TILE + i));
        let v = _mm512_cvtph_ps(_mm256_loadu_si256(src.add(i + 16) as *const __m256i));
        split16(v, dst.add(i + 16), dst.add(TILE + i + 16));
    }
}

/// How far ahead of their use weights are prefetched (bytes): a few tiles, across the page
/// boundaries the hardware prefetchers stop at.
const AHEAD: usize = 8192;

/// Rows `r0..r1` of a block of sums `c` (rows of `ld` values; `cols` of them real) to `out`
/// (rows `n` apart), adding `bias` (its first `cols` values) and applying GELU when asked.
/// The two-panel product runs it a few rows per step on the previous block, while the tile
/// unit works on the next.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn epilogue(c: &mut [f32], ld: usize, r0: usize, r1: usize, cols: usize, bias: Option<&[f32]>, gelu: bool, out: *mut f32, n: usize) {
    if r0 >= r1 {
        return;
    }
    let mask = |j: usize| -> u16 { if cols - j >= 16 { 0xFFFF } else { ((1u32 << (cols - j)) - 1) as u16 } };
    for j in (0..cols).step_by(16) {
        let bv = match bias {
            Some(b) => _mm512_maskz_loadu_ps(mask(j), b.as_ptr().add(j)),
            None => _mm512_setzero_ps(),
        };
        for r in r0..r1 {
            let p = c.as_mut_ptr().add(r * ld + j);
            let v = _mm512_add_ps(_mm512_loadu_ps(p), bv);
            if gelu {
                _mm512_storeu_ps(p, v);
            } else {
                _mm512_mask_storeu_ps(out.add(r * n + j), mask(j), v);
            }
        }
    }
    if gelu {
        super::gelu_erf_in_place(&mut c[r0 * ld..r1 * ld]);
        for r in r0..r1 {
            for j in (0..cols).step_by(16) {
                _mm512_mask_storeu_ps(out.add(r * n + j), mask(j), _mm512_loadu_ps(c.as_ptr().add(r * ld + j)));
            }
        }
    }
}

// The tiles (`amx::configure`: eight of 16 x 64 bytes). One panel at a time: tmm0/1 the sums
// of two row blocks, tmm2/3 the weights' hi/lo, tmm4/5 and tmm6/7 the two row blocks'
// activations hi/lo. Two panels at a time: tmm0-3 the sums of 2 row blocks x 2 panels,
// tmm4/5 the row blocks' activations, tmm6/7 the panels' weights.
#[cfg(target_arch = "x86_64")]
use super::amx::configure;

#[allow(clippy::too_many_arguments)]
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,f16c")]
unsafe fn panel_products(
    w: &[u16],
    f16: bool,
    scratch: &mut [u16],
    (b0, b1): (usize, usize),
    kb: usize,
    acts: *const u16,
    m: usize,
    mp: usize,
    slab: usize,
    n: usize,
    bias: Option<&[f32]>,
    gelu: bool,
    out: *mut f32,
) {
    use std::arch::asm;
    // Bytes from one row block's tiles to the next's.
    let blk = kb * 2 * TILE;
    let mut c = [0.0f32; 32 * 32];
    let mut cs = [[0.0f32; 32 * 32]; 2];
    configure();
    for s0 in (0..mp).step_by(slab) {
        let s1 = (s0 + slab).min(mp);
        let mut b = b0;
        while b < b1 {
            let pair = !f16 && b + 1 < b1;
            let cols = (n - b * 16).min(if pair { 32 } else { 16 });
            let bias_b = bias.map(|v| &v[b * 16..]);
            if pair {
                let p0 = w.as_ptr().add(b * kb * 2 * TILE);
                let p1 = p0.add(kb * 2 * TILE);
                // The previous block's sums (in `cs[cur ^ 1]`) and its first row, finished a
                // few rows per step of the next block's products.
                let mut prev: Option<usize> = None;
                let mut cur = 0usize;
                let per_step = 32usize.div_ceil(kb);
                for r0 in (s0..s1).step_by(32) {
                    asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3", options(nostack, nomem));
                    let a0 = acts.add((r0 / 16) * blk);
                    for s in 0..kb {
                        let (x0, x1) = (p0.add(s * 2 * TILE), p1.add(s * 2 * TILE));
                        if r0 == s0 {
                            for l in (0..2 * TILE * 2).step_by(64) {
                                _mm_prefetch::<_MM_HINT_T0>((x0 as *const i8).add(AHEAD + l));
                                _mm_prefetch::<_MM_HINT_T0>((x1 as *const i8).add(AHEAD + l));
                            }
                        }
                        asm!(
                            // Three phases that each share a tile with the next (eight
                            // loads for twelve products); in each, the tile loaded next is
                            // read first, so its load waits least on the products before.
                            // hi x lo
                            "tileloadd tmm4, [{a0} + {s64}*1]",
                            "tileloadd tmm6, [{x0} + {s64}*1 + 1024]",
                            "tdpbf16ps tmm0, tmm4, tmm6",
                            "tileloadd tmm5, [{a1} + {s64}*1]",
                            "tdpbf16ps tmm2, tmm5, tmm6",
                            "tileloadd tmm7, [{x1} + {s64}*1 + 1024]",
                            "tdpbf16ps tmm1, tmm4, tmm7",
                            "tdpbf16ps tmm3, tmm5, tmm7",
                            // hi x hi
                            "tileloadd tmm6, [{x0} + {s64}*1]",
                            "tdpbf16ps tmm0, tmm4, tmm6",
                            "tdpbf16ps tmm2, tmm5, tmm6",
                            "tileloadd tmm7, [{x1} + {s64}*1]",
                            "tdpbf16ps tmm1, tmm4, tmm7",
                            "tdpbf16ps tmm3, tmm5, tmm7",
                            // lo x hi
                            "tileloadd tmm4, [{a0} + {s64}*1 + 1024]",
                            "tdpbf16ps tmm0, tmm4, tmm6",
                            "tdpbf16ps tmm1, tmm4, tmm7",
                            "tileloadd tmm5, [{a1} + {s64}*1 + 1024]",
                            "tdpbf16ps tmm2, tmm5, tmm6",
                            "tdpbf16ps tmm3, tmm5, tmm7",
                            x0 = in(reg) x0,
                            x1 = in(reg) x1,
                            s64 = in(reg) 64usize,
                            a0 = in(reg) a0.add(s * 2 * TILE),
                            a1 = in(reg) a0.add(blk + s * 2 * TILE),
                            options(nostack, readonly),
                        );
                        if let Some(q0) = prev {
                            let rows = m.saturating_sub(q0).min(32);
                            epilogue(&mut cs[cur ^ 1], 32, s * per_step, ((s + 1) * per_step).min(rows), cols, bias_b, gelu, out.add(q0 * n + b * 16), n);
                        }
                    }
                    asm!(
                        "tilestored [{c} + {s128}*1], tmm0",
                        "tilestored [{c} + {s128}*1 + 64], tmm1",
                        "tilestored [{c} + {s128}*1 + 2048], tmm2",
                        "tilestored [{c} + {s128}*1 + 2112], tmm3",
                        c = in(reg) cs[cur].as_mut_ptr(),
                        s128 = in(reg) 128usize,
                        options(nostack),
                    );
                    prev = Some(r0);
                    cur ^= 1;
                }
                if let Some(q0) = prev {
                    let rows = m.saturating_sub(q0).min(32);
                    epilogue(&mut cs[cur ^ 1], 32, 0, rows.min(32), cols, bias_b, gelu, out.add(q0 * n + b * 16), n);
                }
                b += 2;
                continue;
            }
            // f16 weights are split into `scratch` tile by tile during the first pass of the
            // slab (the vector units split tile s + 1 while the tile unit multiplies tile s).
            let src = w.as_ptr().add(b * kb * TILE);
            let panel: *const u16 = if f16 { scratch.as_ptr() } else { w.as_ptr().add(b * kb * 2 * TILE) };
            for r0 in (s0..s1).step_by(32) {
                let first = f16 && r0 == s0;
                if first {
                    split_f16_tile(src, scratch.as_mut_ptr());
                }
                asm!("tilezero tmm0", "tilezero tmm1", options(nostack, nomem));
                let a0 = acts.add((r0 / 16) * blk);
                for s in 0..kb {
                    let bt = panel.add(s * 2 * TILE);
                    if !f16 && r0 == s0 {
                        for l in (0..2 * TILE * 2).step_by(64) {
                            _mm_prefetch::<_MM_HINT_T0>((bt as *const i8).add(AHEAD + l));
                        }
                    }
                    asm!(
                        // The two row blocks' sums alternate, so each product
                        // waits less on the one before it into the same tile.
                        "tileloadd tmm2, [{b} + {s64}*1]",
                        "tileloadd tmm4, [{a0} + {s64}*1]",
                        "tileloadd tmm6, [{a1} + {s64}*1]",
                        "tdpbf16ps tmm0, tmm4, tmm2",
                        "tdpbf16ps tmm1, tmm6, tmm2",
                        "tileloadd tmm3, [{b} + {s64}*1 + 1024]",
                        "tdpbf16ps tmm0, tmm4, tmm3",
                        "tdpbf16ps tmm1, tmm6, tmm3",
                        "tileloadd tmm5, [{a0} + {s64}*1 + 1024]",
                        "tileloadd tmm7, [{a1} + {s64}*1 + 1024]",
                        "tdpbf16ps tmm0, tmm5, tmm2",
                        "tdpbf16ps tmm1, tmm7, tmm2",
                        b = in(reg) bt,
                        s64 = in(reg) 64usize,
                        a0 = in(reg) a0.add(s * 2 * TILE),
                        a1 = in(reg) a0.add(blk + s * 2 * TILE),
                        options(nostack, readonly),
                    );
                    if first && s + 1 < kb {
                        split_f16_tile(src.add((s + 1) * TILE), scratch.as_mut_ptr().add((s + 1) * 2 * TILE));
                    }
                }
                asm!(
                    "tilestored [{c} + {s64}*1], tmm0",
                    "tilestored [{c} + {s64}*1 + 1024], tmm1",
                    c = in(reg) c.as_mut_ptr(),
                    s64 = in(reg) 64usize,
                    options(nostack),
                );
                let rows = m.saturating_sub(r0).min(32);
                epilogue(&mut c, 16, 0, rows, cols, bias_b, gelu, out.add(r0 * n + b * 16), n);
            }
            b += 1;
        }
    }
    asm!("tilerelease", options(nostack, nomem));
}

#[cfg(test)]
mod tests {
    use super::DenseMatrix;

    /// `xr`: the activation as the product sees it; `tol`: the bound on the error relative
    /// to the sum of the products' magnitudes.
    fn check(d: &DenseMatrix, w: &dyn Fn(usize, usize) -> f64, n: usize, k: usize, bias: &[f32]) {
        check_with(d, w, &|v| v as f64, 2e-5, n, k, bias)
    }

    #[allow(clippy::too_many_arguments)]
    fn check_with(d: &DenseMatrix, w: &dyn Fn(usize, usize) -> f64, xr: &dyn Fn(f32) -> f64, tol: f64, n: usize, k: usize, bias: &[f32]) {
        for m in [1usize, 5, 31, 32, 33, 70] {
            let x: Vec<f32> = (0..m * k).map(|i| ((i * 13 % 47) as f32 - 23.0) / 17.0 + (i as f32 * 1e-3).sin()).collect();
            let mut out = vec![0.0f32; m * n];
            d.matmul(&x, m, Some(bias), &mut out);
            for i in 0..m {
                for j in 0..n {
                    let r: f64 = (0..k).map(|t| xr(x[i * k + t]) * w(j, t)).sum::<f64>() + bias[j] as f64;
                    let scale: f64 = (0..k).map(|t| (xr(x[i * k + t]) * w(j, t)).abs()).sum();
                    let err = (out[i * n + j] as f64 - r).abs();
                    assert!(err <= tol * scale + 1e-6, "m={m} ({i},{j}): {} vs {r} (scale {scale})", out[i * n + j]);
                }
            }
            // GELU fused into the product: the same bits as applied afterwards.
            let mut g = vec![0.0f32; m * n];
            d.matmul_gelu(&x, m, Some(bias), &mut g);
            let mut want = out.clone();
            crate::kernels::gelu_erf_in_place(&mut want);
            assert_eq!(g, want, "m={m}: matmul_gelu differs from matmul then gelu");
            // A row gives the same bits alone as in the batch (the tile products; the f32
            // fallback's batches take a GEMM that sums in another order).
            if m > 1 && !matches!(d.store, super::Store::F32(_)) {
                let mut one = vec![0.0f32; n];
                d.matmul(&x[(m - 1) * k..], 1, Some(bias), &mut one);
                assert_eq!(one, out[(m - 1) * n..], "m={m}: last row alone differs");
            }
        }
    }

    #[test]
    fn f32_and_f16_weights_match_f64_reference() {
        // Odd sizes: a partial column panel and a partial tile of inputs.
        let (n, k) = (70, 83);
        check_sizes(n, k);
    }

    #[test]
    fn panel_pairs_and_whole_tiles_match_f64_reference() {
        // An even number of panels (pairs only) and whole tiles of inputs, as in BERT's layers.
        check_sizes(96, 64);
    }

    #[test]
    fn bf16_weights_match_f64_reference_on_bf16_values() {
        let bf = |v: f32| f32::from_bits((crate::kernels::bf16_bits(v) as u32) << 16) as f64;
        // A partial panel and tile; then enough work for the pool's chunks (rows and panels).
        for (n, k) in [(70usize, 83usize), (96, 64), (200, 160)] {
            let w: Vec<f32> = (0..n * k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 61.0 + (i as f32).cos() * 1e-3).collect();
            let bias: Vec<f32> = (0..n).map(|j| j as f32 * 0.01 - 0.3).collect();
            let Some(d) = DenseMatrix::from_f32_bf16(&w, n, k) else {
                eprintln!("neither AMX-BF16 nor AVX512-BF16 here: nothing to test");
                return;
            };
            eprintln!("{d:?}");
            check_with(&d, &|j, t| bf(w[j * k + t]), &bf, 1e-5, n, k, &bias);
        }
    }

    fn check_sizes(n: usize, k: usize) {
        let w: Vec<f32> = (0..n * k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 61.0 + (i as f32).cos() * 1e-3).collect();
        let bias: Vec<f32> = (0..n).map(|j| j as f32 * 0.01 - 0.3).collect();
        let d = DenseMatrix::from_f32(&w, n, k);
        eprintln!("{d:?}");
        check(&d, &|j, t| w[j * k + t] as f64, n, k, &bias);
        let h: Vec<u16> = w.iter().map(|&v| half::f16::from_f32(v).to_bits()).collect();
        let d = DenseMatrix::from_f16_bits(&h, n, k);
        check(&d, &|j, t| half::f16::from_bits(h[j * k + t]).to_f64(), n, k, &bias);
        let d = DenseMatrix::from_f32_blocked(&w, n, k);
        eprintln!("{d:?}");
        check(&d, &|j, t| w[j * k + t] as f64, n, k, &bias);
        let d = DenseMatrix::from_f16_bits_blocked(&h, n, k);
        check(&d, &|j, t| half::f16::from_bits(h[j * k + t]).to_f64(), n, k, &bias);
    }
}
