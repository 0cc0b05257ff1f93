//! AVX-512 kernels for the 32-value formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) that take sixteen
//! weight rows at a time, one per 32-bit lane, against any number of activation rows.
//!
//! For each block the sixteen rows' values are transposed into eight registers (register
//! `k`, lane `n`: values `4k..4k + 4` of row `n`), so one `vpdpbusd` with four broadcast
//! activation bytes advances sixteen dot products by four values, and a block of one
//! activation row costs eight of them, one conversion and one fused multiply-add for all
//! sixteen rows. The transposition (16 loads, 8 unpacks, 8 nibble masks) and the scales (one
//! gather) are paid once per block and shared by every activation row, so the work per
//! further activation row is ~11 instructions per 512 multiply-adds where the row-at-a-time
//! kernels of `avx512` spend ~60.
//!
//! Arithmetic, the same for every number of activation rows and every grouping of rows
//! (so a batch is bit-identical to its rows one at a time): per output, the exact integer
//! sum of each block `S_b` (offset formats corrected in integers: `S_b = Σ u·a - off·Σ a`),
//! then `acc = fma(S_b, d_w·d_a, acc)` block after block; formats with a minimum add
//! `accm = fma(m_w, s_a, accm)` in their own chain and return `acc + accm`. [`reference`]
//! computes the same in plain Rust (the tests compare bit for bit).
//!
//! With many activation rows, packed weights take their integer block sums from AMX tiles
//! instead (`group_packed_amx`, from
//! [`KernelOptions::lanes_amx_rows`](super::KernelOptions::lanes_amx_rows) rows): a packed
//! block's eight registers are already a B tile (sixteen columns of four bytes), so one
//! `tdpbsud` gives every activation row's sums for the sixteen weight rows, and the fold into
//! the accumulators is the one above. Same results, bit for bit.
//!
//! Layout: model loaders call [`pack_for_lanes`](super::pack_for_lanes), which lays the
//! matrices out once in the registers' order ([`Packed`]: per group of sixteen rows, pairs of
//! blocks) in one allocation starting on a 2 MiB boundary, so a block costs a few aligned
//! loads and one activation row (decode) streams as fast as the row-at-a-time kernels. Q4_0
//! and Q4_1 in GGML's layout take these kernels too, transposing each block once for all
//! activation rows; Q5_0, Q5_1 and Q8_0 only once packed
//! ([`LanesFormats::Q4`](super::LanesFormats::Q4) leaves them on the row-at-a-time kernels).
//! Activation rows go `M_BLOCK` at a time past all of a thread's weight rows, so they stay
//! in L2, and the weights are prefetched one block's share at a time ahead of the loads. On the
//! AMX path blocks alternate between two sets of tiles, so one block's tiles run while the
//! last one's sums are folded, and the nibble formats are unpacked into a small buffer a few
//! blocks ahead of their tile loads.
//!
//! Safety: every function requires AVX-512 F/BW/VL/VNNI/BITALG, FMA and F16C (checked at
//! run time by the dispatcher, [`super::has_lanes`]), the AMX path also AMX-TILE/INT8 with
//! the tile state granted ([`super::has_amx`]); the weight rows hold `acts`' width.

#![allow(clippy::missing_safety_doc, clippy::needless_range_loop, clippy::too_many_arguments)]

use super::dispatch::by_count;
use super::quant::{BlockQ8, BlockQ8K, QType};
use std::arch::asm;
use std::arch::x86_64::*;

mod pack;
pub use pack::Packed;

/// Most activation rows one kernel pass takes (their accumulators stay in registers; formats
/// with a minimum keep two per row and take half as many).
const PASS: usize = 16;

/// A 32-value weight format as these kernels see it.
trait Fmt {
    const BYTES: usize;
    /// Offset that makes the stored values unsigned (subtracted in integers), 0 for formats
    /// with a minimum.
    const OFF: i32;
    const HAS_M: bool;
    /// Activation rows per pass over GGML's layout (packed weights take [`PASS`]).
    const PASS: usize = if Self::HAS_M { PASS / 2 } else { PASS };
    /// The eight transposed registers of block `base` of the sixteen rows at byte offsets
    /// `offs` (also as a vector, `voffs`, for gathers).
    unsafe fn weights(base: *const u8, offs: &[i32; 16], voffs: __m512i) -> [__m512i; 8];
    /// The packed layout ([`Packed`]): bytes of one block's values for sixteen rows, of its
    /// high bits (0 without), of its scales (and minimums).
    const QB: usize = if Self::BYTES == 34 { 512 } else { 256 };
    const QH: usize;
    const SB: usize = if Self::HAS_M { 64 } else { 32 };
    /// Bytes of a pair of blocks of sixteen rows.
    const PB: usize = 2 * (Self::QB + Self::QH + Self::SB);
    /// The eight registers of a packed block: values at `q`, high bits at `qh`.
    unsafe fn packed(q: *const u8, qh: *const u8) -> [__m512i; 8];
}

/// Eight registers of values from four registers of packed nibbles at `q`.
#[inline(always)]
unsafe fn packed_nibbles(q: *const u8) -> [__m512i; 8] {
    let u = |k: usize| _mm512_loadu_si512(q.add(64 * k) as *const __m512i);
    let m = _mm512_set1_epi8(0x0f);
    let lo = |v: __m512i| _mm512_and_si512(v, m);
    let hi = |v: __m512i| _mm512_and_si512(_mm512_srli_epi16::<4>(v), m);
    let (u0, u1, u2, u3) = (u(0), u(1), u(2), u(3));
    [lo(u0), lo(u1), lo(u2), lo(u3), hi(u0), hi(u1), hi(u2), hi(u3)]
}

#[inline(always)]
unsafe fn ld128(p: *const u8) -> __m128i {
    _mm_loadu_si128(p as *const __m128i)
}

/// `Z_j` lane `l` = the 16 bytes at `base + at + offs[4l + j]`; transposed so that register
/// `k` lane `n` is dword `k` of row `n`'s 16 bytes.
#[inline(always)]
unsafe fn transpose16(base: *const u8, at: usize, offs: &[i32; 16]) -> [__m512i; 4] {
    let p = |n: usize| base.add(at).offset(offs[n] as isize);
    let z = |j: usize| {
        let v = _mm512_castsi128_si512(ld128(p(j)));
        let v = _mm512_inserti32x4::<1>(v, ld128(p(4 + j)));
        let v = _mm512_inserti32x4::<2>(v, ld128(p(8 + j)));
        _mm512_inserti32x4::<3>(v, ld128(p(12 + j)))
    };
    let (z0, z1, z2, z3) = (z(0), z(1), z(2), z(3));
    let t0 = _mm512_unpacklo_epi32(z0, z1);
    let t1 = _mm512_unpackhi_epi32(z0, z1);
    let t2 = _mm512_unpacklo_epi32(z2, z3);
    let t3 = _mm512_unpackhi_epi32(z2, z3);
    [_mm512_unpacklo_epi64(t0, t2), _mm512_unpackhi_epi64(t0, t2), _mm512_unpacklo_epi64(t1, t3), _mm512_unpackhi_epi64(t1, t3)]
}

/// Sixteen rows' 16 nibble bytes at `at` to eight registers of values (low nibbles are values
/// 0..16, high nibbles 16..32).
#[inline(always)]
unsafe fn nibbles(base: *const u8, at: usize, offs: &[i32; 16]) -> [__m512i; 8] {
    let u = transpose16(base, at, offs);
    let m = _mm512_set1_epi8(0x0f);
    let lo = |v: __m512i| _mm512_and_si512(v, m);
    let hi = |v: __m512i| _mm512_and_si512(_mm512_srli_epi16::<4>(v), m);
    [lo(u[0]), lo(u[1]), lo(u[2]), lo(u[3]), hi(u[0]), hi(u[1]), hi(u[2]), hi(u[3])]
}

/// Control bytes for `vpshufbitqmb`: register `k` byte `4n + i` takes bit `4k + i` of row
/// `n`'s 32 high bits (two rows per 64-bit lane).
static HIGH_BITS: [[u8; 64]; 8] = {
    let mut t = [[0u8; 64]; 8];
    let mut k = 0;
    while k < 8 {
        let mut j = 0;
        while j < 64 {
            t[k][j] = (32 * ((j % 8) / 4) + 4 * k + j % 4) as u8;
            j += 1;
        }
        k += 1;
    }
    t
};

/// Adds 16 to each value whose high bit is set (`qh`: row `n`'s 32 bits in lane `n`).
#[inline(always)]
unsafe fn with_high_bits(w: &mut [__m512i; 8], qh: __m512i) {
    let sixteen = _mm512_set1_epi8(0x10);
    for k in 0..8 {
        let ctl = _mm512_loadu_si512(HIGH_BITS[k].as_ptr() as *const __m512i);
        let bits = _mm512_bitshuffle_epi64_mask(qh, ctl);
        w[k] = _mm512_mask_add_epi8(w[k], bits, w[k], sixteen);
    }
}

struct Q40;
struct Q41;
struct Q50;
struct Q51;
struct Q80;

impl Fmt for Q40 {
    const BYTES: usize = 18;
    const OFF: i32 = 8;
    const HAS_M: bool = false;
    const QH: usize = 0;
    #[inline(always)]
    unsafe fn weights(base: *const u8, offs: &[i32; 16], _: __m512i) -> [__m512i; 8] {
        nibbles(base, 2, offs)
    }
    #[inline(always)]
    unsafe fn packed(q: *const u8, _: *const u8) -> [__m512i; 8] {
        packed_nibbles(q)
    }
}

impl Fmt for Q41 {
    const BYTES: usize = 20;
    const OFF: i32 = 0;
    const HAS_M: bool = true;
    const QH: usize = 0;
    #[inline(always)]
    unsafe fn weights(base: *const u8, offs: &[i32; 16], _: __m512i) -> [__m512i; 8] {
        nibbles(base, 4, offs)
    }
    #[inline(always)]
    unsafe fn packed(q: *const u8, _: *const u8) -> [__m512i; 8] {
        packed_nibbles(q)
    }
}

impl Fmt for Q50 {
    const BYTES: usize = 22;
    const OFF: i32 = 16;
    const HAS_M: bool = false;
    const QH: usize = 64;
    #[inline(always)]
    unsafe fn weights(base: *const u8, offs: &[i32; 16], voffs: __m512i) -> [__m512i; 8] {
        let mut w = nibbles(base, 6, offs);
        with_high_bits(&mut w, _mm512_i32gather_epi32::<1>(voffs, base.add(2) as *const i32));
        w
    }
    #[inline(always)]
    unsafe fn packed(q: *const u8, qh: *const u8) -> [__m512i; 8] {
        let mut w = packed_nibbles(q);
        with_high_bits(&mut w, _mm512_loadu_si512(qh as *const __m512i));
        w
    }
}

impl Fmt for Q51 {
    const BYTES: usize = 24;
    const OFF: i32 = 0;
    const HAS_M: bool = true;
    const QH: usize = 64;
    #[inline(always)]
    unsafe fn weights(base: *const u8, offs: &[i32; 16], voffs: __m512i) -> [__m512i; 8] {
        let mut w = nibbles(base, 8, offs);
        with_high_bits(&mut w, _mm512_i32gather_epi32::<1>(voffs, base.add(4) as *const i32));
        w
    }
    #[inline(always)]
    unsafe fn packed(q: *const u8, qh: *const u8) -> [__m512i; 8] {
        let mut w = packed_nibbles(q);
        with_high_bits(&mut w, _mm512_loadu_si512(qh as *const __m512i));
        w
    }
}

impl Fmt for Q80 {
    const BYTES: usize = 34;
    const OFF: i32 = 128;
    const HAS_M: bool = false;
    const QH: usize = 0;
    #[inline(always)]
    unsafe fn packed(q: *const u8, _: *const u8) -> [__m512i; 8] {
        std::array::from_fn(|k| _mm512_loadu_si512(q.add(64 * k) as *const __m512i))
    }
    #[inline(always)]
    unsafe fn weights(base: *const u8, offs: &[i32; 16], _: __m512i) -> [__m512i; 8] {
        // Z_j = [row j's 32 bytes | row j + 8's]: 128-bit lanes (row j dwords 0..4, 4..8,
        // row j + 8 dwords 0..4, 4..8). In-lane 4x4 transposes of Z_0..Z_3 and of Z_4..Z_7,
        // then one two-source permute per register puts rows 0..16 in order.
        let p = |n: usize| base.add(2).offset(offs[n] as isize);
        let z = |j: usize| _mm512_inserti64x4::<1>(_mm512_castsi256_si512(_mm256_loadu_si256(p(j) as *const __m256i)), _mm256_loadu_si256(p(j + 8) as *const __m256i));
        let tr = |z0: __m512i, z1: __m512i, z2: __m512i, z3: __m512i| {
            let t0 = _mm512_unpacklo_epi32(z0, z1);
            let t1 = _mm512_unpackhi_epi32(z0, z1);
            let t2 = _mm512_unpacklo_epi32(z2, z3);
            let t3 = _mm512_unpackhi_epi32(z2, z3);
            [_mm512_unpacklo_epi64(t0, t2), _mm512_unpackhi_epi64(t0, t2), _mm512_unpacklo_epi64(t1, t3), _mm512_unpackhi_epi64(t1, t3)]
        };
        // u[k] lanes: rows 0..4 dword k, rows 0..4 dword 4 + k, rows 8..12 dword k, rows
        // 8..12 dword 4 + k; v[k] the same for rows 4..8 and 12..16.
        let u = tr(z(0), z(1), z(2), z(3));
        let v = tr(z(4), z(5), z(6), z(7));
        // 64-bit lane indices: 128-bit lanes (u.0, v.0, u.2, v.2) and (u.1, v.1, u.3, v.3).
        let lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
        let hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
        let f = |x: __m512i| _mm512_xor_si512(x, _mm512_set1_epi8(-128));
        let a = |k: usize| f(_mm512_permutex2var_epi64(u[k], lo, v[k]));
        let b = |k: usize| f(_mm512_permutex2var_epi64(u[k], hi, v[k]));
        [a(0), a(1), a(2), a(3), b(0), b(1), b(2), b(3)]
    }
}

#[inline(always)]
unsafe fn rd32(p: *const i8) -> i32 {
    std::ptr::read_unaligned(p as *const i32)
}

/// One block `b` of sixteen weight rows (`w`, scales `dw`, minimums `mw`) into the `R`
/// activation rows' accumulators: the exact integer sum, then the fused multiply-add.
#[inline(always)]
unsafe fn block<F: Fmt, const R: usize>(w: &[__m512i; 8], dw: __m512, mw: __m512, b: usize, acts: &[*const BlockQ8; R], corr: &[*const i32; R], acc: &mut [__m512; R], accm: &mut [__m512; R]) {
    for r in 0..R {
        let a = &*acts[r].add(b);
        let mut s = if F::OFF != 0 { _mm512_set1_epi32(*corr[r].add(b)) } else { _mm512_setzero_si512() };
        let q = a.qs.as_ptr();
        for k in 0..8 {
            s = _mm512_dpbusd_epi32(s, w[k], _mm512_set1_epi32(rd32(q.add(4 * k))));
        }
        let dd = _mm512_mul_ps(dw, _mm512_set1_ps(a.d));
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), dd, acc[r]);
        if F::HAS_M {
            accm[r] = _mm512_fmadd_ps(mw, _mm512_set1_ps(a.s), accm[r]);
        }
    }
}

/// Where block `b`'s sixteen f16 scales (then, for formats with one, its sixteen minimums)
/// are in a packed group at `gp`.
#[inline(always)]
unsafe fn packed_scales<F: Fmt>(gp: *const u8, b: usize) -> *const u8 {
    gp.add((b >> 1) * F::PB + 2 * (F::QB + F::QH) + (b & 1) * F::SB)
}

/// The minimums' chain of formats with one, for packed weights (`gp`: a group's pairs):
/// `accm = fma(m_w, s_a, accm)` block after block, the same sums as [`block`] makes beside
/// the integer ones, in a loop of their own so that the tiles' loop keeps one accumulator a
/// row (and a pass takes sixteen rows, not eight).
#[inline(always)]
unsafe fn packed_mins<F: Fmt, const R: usize>(gp: *const u8, nb: usize, acts: &[*const BlockQ8; R], accm: &mut [__m512; R]) {
    for b in 0..nb {
        let mw = _mm512_cvtph_ps(_mm256_loadu_si256(packed_scales::<F>(gp, b).add(32) as *const __m256i));
        for r in 0..R {
            accm[r] = _mm512_fmadd_ps(mw, _mm512_set1_ps((*acts[r].add(b)).s), accm[r]);
        }
    }
}

/// The `nvalid` outputs of each activation row.
#[inline(always)]
unsafe fn store<F: Fmt, const R: usize>(acc: &[__m512; R], accm: &[__m512; R], nvalid: usize, outs: &[*mut f32; R]) {
    let mask: __mmask16 = if nvalid >= 16 { 0xffff } else { (1u16 << nvalid) - 1 };
    for r in 0..R {
        let v = if F::HAS_M { _mm512_add_ps(acc[r], accm[r]) } else { acc[r] };
        _mm512_mask_storeu_ps(outs[r], mask, v);
    }
}

/// Sixteen weight rows starting at `p` (`nvalid` of them real; the others repeat the last and
/// are not stored) against `R` activation rows: `outs[r][n]` for row `n`.
#[inline(always)]
unsafe fn group<F: Fmt, const R: usize>(p: *const u8, rb: usize, nvalid: usize, nb: usize, acts: [*const BlockQ8; R], corr: [*const i32; R], outs: [*mut f32; R], next: *const u8) {
    let lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    let rows = _mm512_min_epi32(lane, _mm512_set1_epi32(nvalid as i32 - 1));
    let voffs = _mm512_mullo_epi32(rows, _mm512_set1_epi32(rb as i32));
    let offs: [i32; 16] = std::mem::transmute(voffs);
    let mut acc = [_mm512_setzero_ps(); R];
    let mut accm = [_mm512_setzero_ps(); R];
    for b in 0..nb {
        let base = p.add(b * F::BYTES);
        // The next sixteen rows into L2 in the order they will be read: each row's line
        // past this block's bytes whenever the block crosses a line of the row.
        let at = b * F::BYTES;
        if b == 0 || at / 64 != (at - F::BYTES) / 64 {
            let ahead = if b == 0 { 0 } else { 64 };
            for n in 0..16 {
                _mm_prefetch::<_MM_HINT_T1>(next.wrapping_add(n * rb + at + ahead) as *const i8);
            }
        }
        let hdr = _mm512_i32gather_epi32::<1>(voffs, base as *const i32);
        let dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(hdr));
        let mw = if F::HAS_M { _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(hdr))) } else { _mm512_setzero_ps() };
        let w = F::weights(base, &offs, voffs);
        block::<F, R>(&w, dw, mw, b, &acts, &corr, &mut acc, &mut accm);
    }
    store::<F, R>(&acc, &accm, nvalid, &outs);
}

/// Dispatch on the number of activation rows (1..=PASS).
macro_rules! by_rows {
    ($f:ident, $fmt:ty, $r:expr, $p:expr, $rb:expr, $nv:expr, $nb:expr, $acts:expr, $corr:expr, $outs:expr, $next:expr) => {{
        let (a, c, o) = ($acts, $corr, $outs);
        macro_rules! go {
            ($n:literal) => {
                $f::<$fmt, $n>($p, $rb, $nv, $nb, std::array::from_fn(|i| a[i]), std::array::from_fn(|i| c[i]), std::array::from_fn(|i| o[i]), $next)
            };
        }
        by_count!($r => go { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15; _ => 16 })
    }};
}

/// The passes of a product over weight rows `r0..r1` (groups of sixteen) and `m` activation
/// rows: activation rows in blocks of `M_BLOCK`, each block taken by every group of the range
/// before the next (a block's activations stay in L2 while the weight rows pass, instead of
/// all `m` rows streaming from memory once per sixteen weight rows), `pass` rows at a time.
/// `$body` sees the group's first row `g`, its `nvalid` real rows, the pass's `r` rows as
/// pointer arrays (`ap` activations, `cp` corrections, `op` outputs; the last row repeated to
/// [`PASS`]) and whether this is the first pass over the weights. (A macro: a closure would
/// not carry the kernels' target features.) With `@ T, S` first: activations of block type
/// `T` (32-value blocks otherwise) and `S` corrections per block (1 otherwise).
macro_rules! passes {
    (@ $t:ty, $per:expr, $pass:expr, $r0:expr, $r1:expr, $m:expr, $nb:expr, $acts:expr, $corr:expr, $out:expr, $stride:expr,
     |$g:ident, $nvalid:ident, $r:ident, $ap:ident, $cp:ident, $op:ident, $first:ident| $body:block) => {{
        let (r0, r1, m, nb, acts, corr, out, stride): (usize, usize, usize, usize, &[$t], &[i32], *mut f32, usize) =
            ($r0, $r1, $m, $nb, $acts, $corr, $out, $stride);
        let mut m0 = 0;
        while m0 < m {
            let m1 = (m0 + M_BLOCK).min(m);
            let mut $g = r0;
            while $g < r1 {
                let $nvalid = (r1 - $g).min(16);
                let mut a0 = m0;
                while a0 < m1 {
                    let $r = (m1 - a0).min($pass);
                    let row = |i: usize| a0 + i.min($r - 1);
                    let $ap: [*const $t; PASS] = std::array::from_fn(|i| acts.as_ptr().add(row(i) * nb));
                    let $cp: [*const i32; PASS] = std::array::from_fn(|i| if corr.is_empty() { std::ptr::null() } else { corr.as_ptr().add(row(i) * nb * $per) });
                    let $op: [*mut f32; PASS] = std::array::from_fn(|i| out.add(row(i) * stride + $g));
                    let $first = a0 == 0;
                    $body
                    a0 += $r;
                }
                $g += 16;
            }
            m0 = m1;
        }
    }};
    ($pass:expr, $($rest:tt)*) => {
        passes!(@ BlockQ8, 1, $pass, $($rest)*)
    };
}
pub(super) use passes;

#[inline(never)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512bitalg,avx2,fma,f16c")]
unsafe fn range_of<F: Fmt>(w: &[u8], rb: usize, r0: usize, r1: usize, acts: &[BlockQ8], corr: &[i32], m: usize, out: *mut f32, out_stride: usize) {
    debug_assert!(w.len() >= r1 * rb && r0.is_multiple_of(16));
    let nb = rb / F::BYTES;
    debug_assert_eq!(acts.len(), m * nb);
    let p = w.as_ptr();
    // The first sixteen rows are read before any prefetch of the loop below reaches them:
    // ask for them (into L2, their first lines into L1) up front, as the decode of a small
    // matrix otherwise starts with a row of misses per thread and matrix.
    let first = p.add(r0 * rb);
    let len = (r1 - r0).min(16) * rb;
    let mut off = 0;
    while off < len {
        _mm_prefetch::<_MM_HINT_T1>(first.add(off) as *const i8);
        off += 64;
    }
    for n in 0..(r1 - r0).min(16) {
        _mm_prefetch::<_MM_HINT_T0>(first.add(n * rb) as *const i8);
        _mm_prefetch::<_MM_HINT_T0>(first.add(n * rb).wrapping_add(64) as *const i8);
    }
    passes!(F::PASS, r0, r1, m, nb, acts, corr, out, out_stride, |g, nvalid, r, ap, cp, op, _first| {
        let gp = p.add(g * rb);
        by_rows!(group, F, r, gp, rb, nvalid, nb, ap, cp, op, gp.wrapping_add(16 * rb));
    });
}

/// Activation rows a pass over the weight rows takes (see [`range_of`]).
const M_BLOCK: usize = 64;

/// Ask for the `len` bytes at `at` into L2.
#[inline(always)]
pub(super) unsafe fn prefetch_l2(at: *const u8, len: usize) {
    let mut off = 0;
    while off < len {
        _mm_prefetch::<_MM_HINT_T1>(at.wrapping_add(off) as *const i8);
        off += 64;
    }
}

/// [`group`] on packed weights: the sixteen rows' blocks at `gp` (a group of [`Packed`]),
/// the same arithmetic. `dist`, `l1d`: bytes ahead to prefetch into L2 and L1 (0: none).
#[inline(always)]
unsafe fn group_packed<F: Fmt, const R: usize>(gp: *const u8, dist: usize, nvalid: usize, nb: usize, acts: [*const BlockQ8; R], corr: [*const i32; R], outs: [*mut f32; R], l1d: usize) {
    let mut acc = [_mm512_setzero_ps(); R];
    let mut accm = [_mm512_setzero_ps(); R];
    for b in 0..nb {
        let pair = gp.add((b >> 1) * F::PB);
        let j = b & 1;
        // This block's half of the pair, `l1d` (into L1) and `dist` (into L2) bytes ahead:
        // spread over the blocks rather than in bursts.
        super::lanes_k::ahead(pair.add(j * F::PB / 2), F::PB / 2, dist, l1d);
        let sp = packed_scales::<F>(gp, b);
        let (dw, mw) = if F::HAS_M {
            let v = _mm512_loadu_si512(sp as *const __m512i);
            (_mm512_cvtph_ps(_mm512_castsi512_si256(v)), _mm512_cvtph_ps(_mm512_extracti64x4_epi64::<1>(v)))
        } else {
            (_mm512_cvtph_ps(_mm256_loadu_si256(sp as *const __m256i)), _mm512_setzero_ps())
        };
        let w = F::packed(pair.add(j * F::QB), pair.add(2 * F::QB + j * F::QH));
        block::<F, R>(&w, dw, mw, b, &acts, &corr, &mut acc, &mut accm);
    }
    store::<F, R>(&acc, &accm, nvalid, &outs);
}

/// Tile registers of [`group_packed_amx`], for `r` activation rows: per block of a pair
/// (tmm0..2 the even block, tmm3..5 the odd one) the sums C (`r` x 16 i32), the activations
/// A (`r` x 32 signed bytes) and the weights B (8 x 64 unsigned bytes: the packed block's
/// eight registers, which are already the tile's layout).
#[inline(always)]
unsafe fn amx_configure(r: usize) {
    #[repr(C, align(64))]
    struct Cfg([u8; 64]);
    let mut c = Cfg([0; 64]);
    c.0[0] = 1;
    for (t, rows, colsb) in [(0, r, 64u16), (1, r, 32), (2, 8, 64), (3, r, 64), (4, r, 32), (5, 8, 64)] {
        c.0[16 + 2 * t..18 + 2 * t].copy_from_slice(&colsb.to_le_bytes());
        c.0[48 + t] = rows as u8;
    }
    asm!("ldtilecfg [{}]", in(reg) c.0.as_ptr(), options(nostack, readonly));
}

#[inline(always)]
unsafe fn amx_release() {
    asm!("tilerelease", options(nostack, nomem));
}

/// The integer sums of one block (activations at `a`, rows `astride` bytes apart; weights at
/// `b`, 64 bytes a row) into `c` (`r` rows of 16 i32), on tile set `$c, $a, $b` (blocks
/// alternate between two sets, so that one block's tiles need not wait for the last's).
macro_rules! amx_block {
    ($name:ident, $tc:literal, $ta:literal, $tb:literal) => {
        #[inline(always)]
        unsafe fn $name(a: *const u8, astride: usize, b: *const u8, c: *mut u8) {
            asm!(
                concat!("tilezero tmm", $tc),
                concat!("tileloadd tmm", $ta, ", [{a} + {st}*1]"),
                concat!("tileloadd tmm", $tb, ", [{b} + {s}*1]"),
                concat!("tdpbsud tmm", $tc, ", tmm", $ta, ", tmm", $tb),
                concat!("tilestored [{c} + {s}*1], tmm", $tc),
                a = in(reg) a,
                st = in(reg) astride,
                b = in(reg) b,
                c = in(reg) c,
                s = in(reg) 64usize,
                options(nostack),
            );
        }
    };
}
amx_block!(amx_block_even, "0", "1", "2");
amx_block!(amx_block_odd, "3", "4", "5");

/// Blocks of unpacked weights [`group_packed_amx`] keeps (unpacked this many blocks ahead,
/// less one).
const UNPACKED: usize = 4;

/// Scratch of [`group_packed_amx`]: two blocks' sums and [`UNPACKED`] blocks' unpacked
/// weights.
#[repr(C, align(64))]
struct AmxScratch {
    c: [[u8; 1024]; 2],
    w: [[u8; 512]; UNPACKED],
}

/// [`group_packed`] with the integer sums from AMX tiles (tiles configured for `R` rows by
/// [`amx_configure`]): per block one `tdpbsud` of the `R` activation rows by the sixteen
/// weight rows, then per row the same correction and fused multiply-adds, so the results
/// are the lane kernels' bit for bit and each further activation row costs ~5 vector
/// instructions per block instead of ~12. The activation rows are consecutive in `acts[0]`
/// (`nb` blocks each).
#[inline(always)]
unsafe fn group_packed_amx<F: Fmt, const R: usize>(gp: *const u8, dist: usize, nvalid: usize, nb: usize, acts: [*const BlockQ8; R], corr: [*const i32; R], outs: [*mut f32; R], l1d: usize) {
    let mut acc = [_mm512_setzero_ps(); R];
    let mut accm = [_mm512_setzero_ps(); R];
    // Every byte of the scratch read below is written first (the sums by the tiles, the
    // weights by the stores).
    let mut sc = std::mem::MaybeUninit::<AmxScratch>::uninit();
    let (cbuf, wbuf) = {
        let p = sc.as_mut_ptr();
        (std::ptr::addr_of_mut!((*p).c) as *mut u8, std::ptr::addr_of_mut!((*p).w) as *mut u8)
    };
    let astride = nb * std::mem::size_of::<BlockQ8>();
    let a0 = (acts[0] as *const u8).add(std::mem::offset_of!(BlockQ8, qs));
    // Block `$b`'s sums into the scratch, on the tiles of its parity: the weights as B tiles
    // (Q8_0's packed values are the tile; the other formats' registers are unpacked into the
    // scratch). (Macros: a closure would not carry the kernels' target features.)
    macro_rules! issue {
        ($b:expr) => {{
            let b: usize = $b;
            let j = b & 1;
            let pair = gp.add((b >> 1) * F::PB);
            if j == 0 && dist != 0 {
                let mut l = 0;
                while l < F::PB {
                    if l1d != 0 {
                        _mm_prefetch::<_MM_HINT_T0>(pair.wrapping_add(l1d + l) as *const i8);
                    }
                    _mm_prefetch::<_MM_HINT_T1>(pair.wrapping_add(dist + l) as *const i8);
                    l += 64;
                }
            }
            let wt = if F::BYTES == 34 { pair.add(j * F::QB) } else { wbuf.add(512 * (b % UNPACKED)) as *const u8 };
            let ab = a0.add(b * std::mem::size_of::<BlockQ8>());
            if j == 0 {
                amx_block_even(ab, astride, wt, cbuf);
            } else {
                amx_block_odd(ab, astride, wt, cbuf.add(1024));
            }
        }};
    }
    // The other formats' weights are unpacked into the scratch a few blocks before their
    // tiles load them (a tile load right after the stores to its bytes waits for them).
    macro_rules! unpack {
        ($b:expr) => {{
            let b: usize = $b;
            if F::BYTES != 34 && b < nb {
                let j = b & 1;
                let pair = gp.add((b >> 1) * F::PB);
                let w = F::packed(pair.add(j * F::QB), pair.add(2 * F::QB + j * F::QH));
                let dst = wbuf.add(512 * (b % UNPACKED));
                for k in 0..8 {
                    _mm512_store_si512(dst.add(64 * k) as *mut __m512i, w[k]);
                }
            }
        }};
    }
    for b in 0..UNPACKED - 1 {
        unpack!(b);
    }
    // Software-pipelined by one block: block b + 1's tiles run while block b's sums are
    // folded.
    issue!(0);
    for b in 0..nb {
        unpack!(b + UNPACKED - 1);
        if b + 1 < nb {
            issue!(b + 1);
        }
        let j = b & 1;
        let dw = _mm512_cvtph_ps(_mm256_loadu_si256(packed_scales::<F>(gp, b) as *const __m256i));
        for r in 0..R {
            let a = &*acts[r].add(b);
            let mut s = _mm512_load_si512(cbuf.add(1024 * j + 64 * r) as *const __m512i);
            if F::OFF != 0 {
                s = _mm512_add_epi32(s, _mm512_set1_epi32(*corr[r].add(b)));
            }
            let dd = _mm512_mul_ps(dw, _mm512_set1_ps(a.d));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), dd, acc[r]);
        }
    }
    if F::HAS_M {
        packed_mins::<F, R>(gp, nb, &acts, &mut accm);
    }
    store::<F, R>(&acc, &accm, nvalid, &outs);
}

/// [`range_of`] on packed weights (`w`: groups of `gb` bytes). With `amx_rows` > 0 and at
/// least that many activation rows, the integer sums come from AMX tiles
/// ([`group_packed_amx`]; the caller checked that the machine has them).
#[inline(never)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512bitalg,avx2,fma,f16c")]
unsafe fn range_packed_of<F: Fmt>(w: &[u8], gb: usize, r0: usize, r1: usize, acts: &[BlockQ8], corr: &[i32], m: usize, out: *mut f32, out_stride: usize, amx_rows: usize) {
    debug_assert!(w.len() >= r1.div_ceil(16) * gb && r0.is_multiple_of(16));
    let nb = acts.len() / m.max(1);
    let p = w.as_ptr();
    let dist = PACKED_AHEAD_L2;
    // The first lines of the range, read before the prefetches of the loop reach them.
    prefetch_l2(p.add(r0 / 16 * gb), dist.min((r1 - r0).div_ceil(16) * gb));
    let amx = amx_rows > 0 && m >= amx_rows;
    let mut tiles_for = 0;
    // The tiles' path takes sixteen rows a pass for every format (the minimums' chain has its
    // own loop there; in the lane kernels' loop, where two accumulators a row halve the
    // rows a pass, a loop of its own was slower: Q4_1 4864x896, 4 to 16 rows, 10-20%).
    let pass = if amx { PASS } else { F::PASS };
    passes!(pass, r0, r1, m, nb, acts, corr, out, out_stride, |g, nvalid, r, ap, cp, op, first_pass| {
        // Prefetch ahead only on the first pass over the weights.
        let (d, d1) = if first_pass { (dist, PACKED_AHEAD_L1) } else { (0, 0) };
        if amx {
            if tiles_for != r {
                amx_configure(r);
                tiles_for = r;
            }
            by_rows!(group_packed_amx, F, r, p.add(g / 16 * gb), d, nvalid, nb, ap, cp, op, d1);
        } else {
            by_rows!(group_packed, F, r, p.add(g / 16 * gb), d, nvalid, nb, ap, cp, op, d1);
        }
    });
    if tiles_for != 0 {
        amx_release();
    }
}

/// How far ahead (bytes) the packed kernels ask for weights into L2 and L1. Both, one
/// block's share at a time: into L2 alone, or in bursts of a whole pair, one sequence's
/// decode of Qwen2.5-0.5B (Q5_0/Q8_0) streamed its weights ~10% slower than the row-at-a-time
/// kernels; so it is level or ahead (2-core Xeon VM, 4096/1024 against 2048..8192/0..2048).
pub(super) const PACKED_AHEAD_L2: usize = 4096;
pub(super) const PACKED_AHEAD_L1: usize = 1024;

/// [`range`] on weights packed by [`Packed::new_all`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512bitalg,avx2,fma,f16c")]
pub unsafe fn range_packed(p: &Packed, r0: usize, r1: usize, acts: &[BlockQ8], corr: &[i32], m: usize, out: *mut f32, out_stride: usize) {
    let (w, gb) = (p.bytes(), p.group_bytes);
    let amx = if super::has_amx() { super::options().lanes_amx_rows } else { 0 };
    match p.qtype {
        QType::Q4_0 => range_packed_of::<Q40>(w, gb, r0, r1, acts, corr, m, out, out_stride, amx),
        QType::Q4_1 => range_packed_of::<Q41>(w, gb, r0, r1, acts, corr, m, out, out_stride, amx),
        QType::Q5_0 => range_packed_of::<Q50>(w, gb, r0, r1, acts, corr, m, out, out_stride, amx),
        QType::Q5_1 => range_packed_of::<Q51>(w, gb, r0, r1, acts, corr, m, out, out_stride, amx),
        QType::Q8_0 => range_packed_of::<Q80>(w, gb, r0, r1, acts, corr, m, out, out_stride, amx),
        _ => unreachable!("packed k-quant weights go to range_packed_k"),
    }
}

/// [`range_packed`] for packed Q4_K and Q6_K weights (`acts`: `m` rows of superblocks,
/// `side`: their `lanes_k::side` data).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn range_packed_k(p: &Packed, r0: usize, r1: usize, acts: &[BlockQ8K], side: &[i32], m: usize, out: *mut f32, out_stride: usize) {
    super::lanes_k::range_packed(p.qtype == QType::Q6K, p.bytes(), p.group_bytes, r0, r1, acts, side, m, out, out_stride)
}

/// Output columns (weight rows) `r0..r1` of the product of weights `w` (format `t`, rows of
/// `rb` bytes; `r0` a multiple of 16) with `m` activation rows (`acts`: `m` rows of `rb /
/// bytes-per-block` blocks; `corr`: per block `-offset * sum(qs)` for the offset formats,
/// empty otherwise), into `out[i * out_stride + j]`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512bitalg,avx2,fma,f16c")]
pub unsafe fn range(t: QType, w: &[u8], rb: usize, r0: usize, r1: usize, acts: &[BlockQ8], corr: &[i32], m: usize, out: *mut f32, out_stride: usize) {
    match t {
        QType::Q4_0 => range_of::<Q40>(w, rb, r0, r1, acts, corr, m, out, out_stride),
        QType::Q4_1 => range_of::<Q41>(w, rb, r0, r1, acts, corr, m, out, out_stride),
        QType::Q5_0 => range_of::<Q50>(w, rb, r0, r1, acts, corr, m, out, out_stride),
        QType::Q5_1 => range_of::<Q51>(w, rb, r0, r1, acts, corr, m, out, out_stride),
        QType::Q8_0 => range_of::<Q80>(w, rb, r0, r1, acts, corr, m, out, out_stride),
        _ => unreachable!("the lane kernels take the 32-value formats"),
    }
}

/// Whether products of format `t` go to the lane kernels. Q4_0 and Q4_1 do. The others do
/// when the options say [`LanesFormats::All`](super::LanesFormats::All) (the default), and
/// then only once packed ([`unpacked`]): in GGML's layout one activation row of Q5_0 or
/// Q8_0 weights streamed from memory took ~12% longer through these than through the
/// row-at-a-time kernels, packed it takes no longer. (A kernel with these kernels' arithmetic
/// that reads GGML's layout row after row, reducing sixteen rows' partial sums with a shuffle
/// tree, decoded no faster.)
pub fn handles(t: QType) -> bool {
    if matches!(t, QType::Q4K | QType::Q6K) {
        return super::options().lanes_kquants && !super::has_amx();
    }
    match super::options().lanes_formats {
        super::LanesFormats::Q4 => matches!(t, QType::Q4_0 | QType::Q4_1),
        super::LanesFormats::All => matches!(t, QType::Q4_0 | QType::Q4_1 | QType::Q5_0 | QType::Q5_1 | QType::Q8_0),
    }
}

/// Whether products of format `t` take the lane kernels from GGML's layout too (else only
/// once packed): the 4-bit formats, whose sixteen rows transpose cheaply.
pub fn unpacked(t: QType) -> bool {
    matches!(t, QType::Q4_0 | QType::Q4_1)
}

/// Every format the lane kernels can compute (for the tests).
#[cfg(test)]
pub fn computes(t: QType) -> bool {
    matches!(t, QType::Q4_0 | QType::Q4_1 | QType::Q5_0 | QType::Q5_1 | QType::Q8_0 | QType::Q4K | QType::Q6K)
}

/// The offset subtracted in integers for format `t` (0: the format has a minimum).
pub fn offset(t: QType) -> i32 {
    match t {
        QType::Q4_0 => Q40::OFF,
        QType::Q5_0 => Q50::OFF,
        QType::Q8_0 => Q80::OFF,
        // Q6_K's values are stored as q + 32 (its activations' side data differs from Q4_K's).
        QType::Q6K => 32,
        _ => 0,
    }
}

/// `-offset * sum(qs)` of each block (the integer correction of the offset formats).
pub fn corrections(blocks: &[BlockQ8], off: i32, out: &mut [i32]) {
    for (c, b) in out.iter_mut().zip(blocks) {
        *c = -off * b.qs.iter().map(|&q| q as i32).sum::<i32>();
    }
}

/// The lane kernels' arithmetic in plain Rust, for one weight row (format `t`) and one
/// activation row: what they return, bit for bit.
#[cfg(test)]
pub fn reference(t: QType, w: &[u8], act: &[BlockQ8]) -> f32 {
    let bytes = t.block_bytes();
    let f16 = |p: &[u8]| half::f16::from_bits(u16::from_le_bytes([p[0], p[1]])).to_f32();
    let (mut acc, mut accm) = (0f32, 0f32);
    for (blk, a) in w.chunks_exact(bytes).zip(act) {
        let d = f16(blk);
        let (vals, m): ([i32; 32], f32) = match t {
            QType::Q4_0 | QType::Q4_1 => {
                let qs = &blk[if t == QType::Q4_0 { 2 } else { 4 }..];
                (std::array::from_fn(|i| (if i < 16 { qs[i] & 15 } else { qs[i - 16] >> 4 }) as i32), if t == QType::Q4_1 { f16(&blk[2..]) } else { 0.0 })
            }
            QType::Q5_0 | QType::Q5_1 => {
                let (qh_at, qs_at) = if t == QType::Q5_0 { (2, 6) } else { (4, 8) };
                let qh = u32::from_le_bytes([blk[qh_at], blk[qh_at + 1], blk[qh_at + 2], blk[qh_at + 3]]);
                let qs = &blk[qs_at..];
                let v = |i: usize| (if i < 16 { qs[i] & 15 } else { qs[i - 16] >> 4 }) as i32 + 16 * ((qh >> i) & 1) as i32;
                (std::array::from_fn(v), if t == QType::Q5_1 { f16(&blk[2..]) } else { 0.0 })
            }
            QType::Q8_0 => (std::array::from_fn(|i| blk[2 + i] as i8 as i32 + 128), 0.0),
            _ => unreachable!("the lane kernels take the 32-value formats"),
        };
        let off = offset(t);
        let s: i32 = vals.iter().zip(&a.qs).map(|(&v, &q)| v * q as i32).sum::<i32>() - off * a.qs.iter().map(|&q| q as i32).sum::<i32>();
        acc = (s as f32).mul_add(d * a.d, acc);
        if t == QType::Q4_1 || t == QType::Q5_1 {
            accm = m.mul_add(a.s, accm);
        }
    }
    if t == QType::Q4_1 || t == QType::Q5_1 {
        acc + accm
    } else {
        acc
    }
}
