//! AVX-512 kernels for Q4_K and Q6_K that take sixteen weight rows at a time, one per 32-bit
//! lane, against any number of activation rows: the k-quant counterpart of `lanes.rs`.
//!
//! Layout ([`Packed`](super::lanes::Packed), made at load): for each group of sixteen rows
//! and each 256-value superblock, the sixteen rows' superblock bytes transposed by dwords
//! (line `q`, lane `n`: dword `q` of row `n`'s GGML superblock; Q4_K 36 lines, Q6_K 52), for
//! Q6_K after the group's f16 superblock scales, sixteen per superblock. The same bytes as the
//! GGML blocks (but Q6_K's scales rounding up to a line per group), and every register the
//! kernels need is one aligned load: a line of Q4_K nibbles holds values `4k..4k + 4` of two
//! 32-value sub-blocks for sixteen rows, so one mask (or shift) gives the register one
//! `vpdpbusd` with four broadcast activation bytes advances sixteen dot products by.
//!
//! Arithmetic, the same for every number of activation rows and every grouping of them (a
//! batch is bit-identical to its rows one at a time), and the same as the exact k-quant
//! arithmetic of `amx.rs` and `avx512::rows_q4k_x` / `rows_q6k_x`: per output and superblock
//! the exact integer sums, each sub-block's sum multiplied by its scale in integers
//! (`vpmulld`), Q4_K's minimums `imin = Σ m_j · Σ a` from the activations' sums
//! (`vpdpwssd`), Q6_K's offset (stored values are `q + 32`) as `-32 · Σ a` added to each
//! sub-block's sum; then `acc = fma(isum, d_w · d_a, acc)` and for Q4_K `acc = fma(imin,
//! -dmin_w · d_a, acc)`, superblock after superblock. [`reference`] computes the same in
//! plain Rust (the tests compare bit for bit).
//!
//! Safety: every function requires AVX-512 F/BW/VL/VNNI, FMA and F16C (checked at run time
//! by the dispatcher, [`super::has_lanes`]); the packed weights hold the activations' width.

#![allow(clippy::missing_safety_doc, clippy::needless_range_loop, clippy::too_many_arguments)]

use super::dispatch::by_count;
use super::avx512::dpwssd;
use super::quant::{BlockQ8K, QType};
use std::arch::x86_64::*;

/// Activation rows one kernel pass takes (their integer and float accumulators stay in
/// registers beside a sub-block's eight weight registers).
const PASS: usize = 8;

/// Activation rows a pass over the weight rows takes (they stay in L2 while the weights pass).
const M_BLOCK: usize = 64;

/// i32 per activation row and superblock of the side array [`side`] makes.
pub const SIDE: usize = 16;

/// Dwords of a superblock the kernels read transposed: Q4_K's 144 bytes, Q6_K's first 208
/// (its f16 scale goes after the group's superblocks).
pub(super) const fn dwords(q6: bool) -> usize {
    if q6 {
        52
    } else {
        36
    }
}

/// Whether `t` is a format of these kernels, and which.
fn q6_of(t: QType) -> Option<bool> {
    match t {
        QType::Q4K => Some(false),
        QType::Q6K => Some(true),
        _ => None,
    }
}

/// Packed bytes of a group of sixteen rows, and of `rows` rows, of format `t` (`None`: not
/// Q4_K or Q6_K, or `cols` not whole superblocks).
pub fn packed_len(t: QType, rows: usize, cols: usize) -> Option<(usize, usize)> {
    let q6 = q6_of(t)?;
    if !cols.is_multiple_of(256) {
        return None;
    }
    let nsb = cols / 256;
    let gb = head(q6, nsb) + nsb * 64 * dwords(q6);
    Some((gb, rows.div_ceil(16) * gb))
}

/// Bytes before a group's superblocks: Q6_K's f16 scales, sixteen per superblock (first, so
/// that the group is read in order).
pub(super) fn head(q6: bool, nsb: usize) -> usize {
    if q6 {
        (nsb * 32).next_multiple_of(64)
    } else {
        0
    }
}

/// Where byte `i` of row `n`'s superblock `s` goes in its group (`nsb` superblocks a row).
fn place(q6: bool, nsb: usize, n: usize, s: usize, i: usize) -> usize {
    let nd = dwords(q6);
    if i < 4 * nd {
        head(q6, nsb) + s * 64 * nd + 64 * (i / 4) + 4 * n + i % 4
    } else {
        32 * s + 2 * n + (i - 4 * nd)
    }
}

/// Pack `rows` rows of GGML superblocks (`raw`) into `out` (groups of `gb` bytes, zeroed).
pub fn pack_into(t: QType, raw: &[u8], rows: usize, cols: usize, gb: usize, out: &mut [u8]) {
    let Some(q6) = q6_of(t) else { return };
    let (nsb, bytes) = (cols / 256, t.block_bytes());
    let rb = nsb * bytes;
    for r in 0..rows {
        let go = (r / 16) * gb;
        for s in 0..nsb {
            let blk = &raw[r * rb + s * bytes..r * rb + (s + 1) * bytes];
            for (q, d) in blk.chunks(4).enumerate() {
                let at = go + place(q6, nsb, r % 16, s, 4 * q);
                out[at..at + d.len()].copy_from_slice(d);
            }
        }
    }
}

/// Superblock `s` of row `n` of a packed group (`group`: its bytes) in GGML's layout.
pub fn unpack_block(t: QType, cols: usize, group: &[u8], n: usize, s: usize, blk: &mut [u8]) {
    let Some(q6) = q6_of(t) else { return };
    let nsb = cols / 256;
    for (q, d) in blk[..t.block_bytes()].chunks_mut(4).enumerate() {
        let at = place(q6, nsb, n, s, 4 * q);
        let len = d.len();
        d.copy_from_slice(&group[at..at + len]);
    }
}

/// The per-superblock side data of an activation row for format `t` (`out`: [`SIDE`] i32 a
/// superblock). Q4_K: the 32-value sums as i16 pairs lined up with the kernels' pairs of
/// minimums (`(s0, s2), (s1, s3), (s4, s6), (s5, s7)`); Q6_K: `-32 ·` each 16-value sum.
pub fn side(t: QType, blocks: &[BlockQ8K], out: &mut [i32]) {
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(SIDE)) {
        o.fill(0);
        if t == QType::Q6K {
            for (o, &s) in o.iter_mut().zip(&b.bsums) {
                *o = -32 * s as i32;
            }
        } else {
            let s32 = |j: usize| (b.bsums[2 * j] as i32 + b.bsums[2 * j + 1] as i32) as u16 as u32;
            for (p, (x, y)) in [(0, 2), (1, 3), (4, 6), (5, 7)].into_iter().enumerate() {
                o[p] = (s32(x) | s32(y) << 16) as i32;
            }
        }
    }
}

/// Four activation bytes at `p`, broadcast.
#[inline(always)]
unsafe fn bcast(p: *const i8) -> __m512i {
    _mm512_set1_epi32(std::ptr::read_unaligned(p as *const i32))
}

/// Ask for a group's superblock (`len` bytes at `at`) ahead: `dist` bytes into L2, `l1d`
/// into L1 (0: none).
#[inline(always)]
pub(super) unsafe fn ahead(at: *const u8, len: usize, dist: usize, l1d: usize) {
    if dist == 0 {
        return;
    }
    let mut l = 0;
    while l < len {
        if l1d != 0 {
            _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(l1d + l) as *const i8);
        }
        _mm_prefetch::<_MM_HINT_T1>(at.wrapping_add(dist + l) as *const i8);
        l += 64;
    }
}

/// The `nvalid` outputs of each activation row.
#[inline(always)]
unsafe fn store<const R: usize>(acc: &[__m512; R], nvalid: usize, outs: &[*mut f32; R]) {
    let mask: __mmask16 = if nvalid >= 16 { 0xffff } else { (1u16 << nvalid) - 1 };
    for r in 0..R {
        _mm512_mask_storeu_ps(outs[r], mask, acc[r]);
    }
}

/// Sixteen Q4_K weight rows (the group at `gp`, `nsb` superblocks; `nvalid` of them real)
/// against `R` activation rows (`acts`: each row's superblocks, `side`: its [`side`] data).
#[inline(always)]
unsafe fn group_q4k<const R: usize>(gp: *const u8, nsb: usize, nvalid: usize, acts: [*const BlockQ8K; R], side: [*const i32; R], outs: [*mut f32; R], dist: usize, l1d: usize) {
    const SB: usize = 64 * dwords(false);
    let m4 = _mm512_set1_epi8(0x0f);
    let byte = _mm512_set1_epi32(0xff);
    let pairs = _mm512_set1_epi32(0x00ff_00ff);
    let mut acc = [_mm512_setzero_ps(); R];
    for s in 0..nsb {
        let base = gp.add(s * SB);
        macro_rules! ld {
            ($q:expr) => {
                _mm512_load_si512(base.add(64 * ($q)) as *const __m512i)
            };
        }
        let hdr = ld!(0);
        let dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(hdr));
        let dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(hdr)));
        // The 6-bit scales and minimums of the sixteen rows, as GGML's `get_scale_min_k4`.
        let (u0, u1, u2) = (ld!(1), ld!(2), ld!(3));
        let (k1, k2, k3) = (_mm512_set1_epi32(0x3f3f_3f3f), _mm512_set1_epi32(0x0f0f_0f0f), _mm512_set1_epi32(0x0303_0303));
        let sc = [
            _mm512_and_si512(u0, k1),
            _mm512_or_si512(_mm512_and_si512(u2, k2), _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(u0), k3))),
        ];
        let mn_lo = _mm512_and_si512(u1, k1);
        let mn_hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32::<4>(u2), k2), _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(u1), k3)));
        // i16 pairs (m0, m2), (m1, m3), (m4, m6), (m5, m7).
        let mp = [
            _mm512_and_si512(mn_lo, pairs),
            _mm512_and_si512(_mm512_srli_epi32::<8>(mn_lo), pairs),
            _mm512_and_si512(mn_hi, pairs),
            _mm512_and_si512(_mm512_srli_epi32::<8>(mn_hi), pairs),
        ];
        let mut isum = [_mm512_setzero_si512(); R];
        for j in 0..8 {
            // This superblock's lines ahead, an eighth at a time.
            ahead(base.add(320 * j), 320, dist, l1d);
            let scj = _mm512_and_si512(_mm512_srlv_epi32(sc[j / 4], _mm512_set1_epi32(8 * (j % 4) as i32)), byte);
            let at = 4 + 8 * (j / 2);
            let mut w = [_mm512_setzero_si512(); 8];
            for k in 0..8 {
                let u = ld!(at + k);
                w[k] = if j % 2 == 0 { _mm512_and_si512(u, m4) } else { _mm512_and_si512(_mm512_srli_epi16::<4>(u), m4) };
            }
            for r in 0..R {
                let qa = (*acts[r].add(s)).qs.as_ptr().add(32 * j);
                let mut t = _mm512_setzero_si512();
                for k in 0..8 {
                    t = _mm512_dpbusd_epi32(t, w[k], bcast(qa.add(4 * k)));
                }
                isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(t, scj));
            }
        }
        for r in 0..R {
            let sd = side[r].add(SIDE * s);
            let mut im = _mm512_setzero_si512();
            for p in 0..4 {
                im = dpwssd(im, mp[p], _mm512_set1_epi32(*sd.add(p)));
            }
            let da = _mm512_set1_ps((*acts[r].add(s)).d);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]), _mm512_mul_ps(dw, da), acc[r]);
            acc[r] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(im), _mm512_mul_ps(dmin, da), acc[r]);
        }
    }
    store::<R>(&acc, nvalid, &outs);
}

/// [`group_q4k`] for Q6_K.
#[inline(always)]
unsafe fn group_q6k<const R: usize>(gp: *const u8, nsb: usize, nvalid: usize, acts: [*const BlockQ8K; R], side: [*const i32; R], outs: [*mut f32; R], dist: usize, l1d: usize) {
    const SB: usize = 64 * dwords(true);
    let m4 = _mm512_set1_epi8(0x0f);
    let m30 = _mm512_set1_epi8(0x30);
    let mut acc = [_mm512_setzero_ps(); R];
    let sbs = gp.add(head(true, nsb));
    for s in 0..nsb {
        let base = sbs.add(s * SB);
        macro_rules! ld {
            ($q:expr) => {
                _mm512_load_si512(base.add(64 * ($q)) as *const __m512i)
            };
        }
        let dw = _mm512_cvtph_ps(_mm256_loadu_si256(gp.add(32 * s) as *const __m256i));
        let scr = [ld!(48), ld!(49), ld!(50), ld!(51)];
        let mut isum = [_mm512_setzero_si512(); R];
        for h in 0..2 {
            for t in 0..4 {
                ahead(base.add(448 * (4 * h + t)), 448, dist, l1d);
                // Values 128h + 32t + 4k + i: low four bits from a nibble of the ql bytes,
                // the high two from bits 2t, 2t + 1 of the qh bytes.
                let mut w = [_mm512_setzero_si512(); 8];
                for k in 0..8 {
                    let ql = ld!(16 * h + 8 * (t & 1) + k);
                    let nib = if t >= 2 { _mm512_and_si512(_mm512_srli_epi16::<4>(ql), m4) } else { _mm512_and_si512(ql, m4) };
                    let qh = ld!(32 + 8 * h + k);
                    let hb = match t {
                        0 => _mm512_slli_epi16::<4>(qh),
                        1 => _mm512_slli_epi16::<2>(qh),
                        2 => qh,
                        _ => _mm512_srli_epi16::<2>(qh),
                    };
                    w[k] = _mm512_or_si512(nib, _mm512_and_si512(hb, m30));
                }
                for sub in 0..2 {
                    let j = 8 * h + 2 * t + sub;
                    // Scale j: byte j % 4 of line 48 + j / 4, sign-extended.
                    let scj = _mm512_srai_epi32::<24>(_mm512_sllv_epi32(scr[j / 4], _mm512_set1_epi32(24 - 8 * (j % 4) as i32)));
                    for r in 0..R {
                        let qa = (*acts[r].add(s)).qs.as_ptr().add(16 * j);
                        let mut x = _mm512_set1_epi32(*side[r].add(SIDE * s + j));
                        for k in 0..4 {
                            x = _mm512_dpbusd_epi32(x, w[4 * sub + k], bcast(qa.add(4 * k)));
                        }
                        isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(x, scj));
                    }
                }
            }
        }
        for r in 0..R {
            let da = _mm512_set1_ps((*acts[r].add(s)).d);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]), _mm512_mul_ps(dw, da), acc[r]);
        }
    }
    store::<R>(&acc, nvalid, &outs);
}

/// Dispatch on the number of activation rows (1..=PASS).
macro_rules! by_rows {
    ($f:ident, $r:expr, $($arg:expr),*; $acts:expr, $side:expr, $outs:expr; $($tail:expr),*) => {{
        let (a, c, o) = ($acts, $side, $outs);
        macro_rules! go {
            ($n:literal) => {
                $f::<$n>($($arg),*, std::array::from_fn(|i| a[i]), std::array::from_fn(|i| c[i]), std::array::from_fn(|i| o[i]), $($tail),*)
            };
        }
        by_count!($r => go { 1, 2, 3, 4, 5, 6, 7; _ => 8 })
    }};
}

/// Output columns (weight rows) `r0..r1` (`r0` a multiple of 16) of the product of packed
/// Q4_K or Q6_K weights (`w`: groups of `gb` bytes; `q6`: Q6_K) with `m` activation rows
/// (`acts`: `m` rows of `nsb` superblocks; `side`: their [`side`] data), into
/// `out[i * out_stride + j]`.
#[inline(never)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn range_packed(q6: bool, w: &[u8], gb: usize, r0: usize, r1: usize, acts: &[BlockQ8K], side: &[i32], m: usize, out: *mut f32, out_stride: usize) {
    debug_assert!(w.len() >= r1.div_ceil(16) * gb && r0.is_multiple_of(16));
    let nsb = acts.len() / m.max(1);
    debug_assert_eq!(side.len(), acts.len() * SIDE);
    let p = w.as_ptr();
    // How far ahead (bytes) to ask for weights into L2 and L1, a superblock's eighth at a
    // time: the row kernels' distances (`KernelOptions::prefetch_l2` / `prefetch_l1`, 8 and 2
    // KiB by default). One row streaming from memory on one thread (k_lane_timing, 32 copies
    // of 896x4864) took 0.89x (Q4_K) and 0.66x (Q6_K) the row kernels' speed with the 32-value
    // lane kernels' 4 and 1 KiB asked for a superblock at a time, 1.18x and 1.08x so.
    let (dist, l1d) = (super::options().prefetch_l2, super::options().prefetch_l1);
    // The first lines of the range, read before the prefetches of the loop reach them.
    let first = p.add(r0 / 16 * gb);
    let mut off = 0;
    while off < dist.min((r1 - r0).div_ceil(16) * gb) {
        _mm_prefetch::<_MM_HINT_T1>(first.add(off) as *const i8);
        off += 64;
    }
    let mut m0 = 0;
    while m0 < m {
        let m1 = (m0 + M_BLOCK).min(m);
        let mut g = r0;
        while g < r1 {
            let nvalid = (r1 - g).min(16);
            let gp = p.add(g / 16 * gb);
            let mut a0 = m0;
            while a0 < m1 {
                let r = (m1 - a0).min(PASS);
                let row = |i: usize| a0 + i.min(r - 1);
                let ap: [*const BlockQ8K; PASS] = std::array::from_fn(|i| acts.as_ptr().add(row(i) * nsb));
                let sp: [*const i32; PASS] = std::array::from_fn(|i| side.as_ptr().add(row(i) * nsb * SIDE));
                let op: [*mut f32; PASS] = std::array::from_fn(|i| out.add(row(i) * out_stride + g));
                // Prefetch ahead only on the first pass over the weights.
                let (d, d1) = if a0 == 0 { (dist, l1d) } else { (0, 0) };
                if q6 {
                    by_rows!(group_q6k, r, gp, nsb, nvalid; ap, sp, op; d, d1);
                } else {
                    by_rows!(group_q4k, r, gp, nsb, nvalid; ap, sp, op; d, d1);
                }
                a0 += r;
            }
            g += 16;
        }
        m0 = m1;
    }
}

/// These kernels' arithmetic in plain Rust, for one weight row (format `t`, GGML layout) and
/// one activation row: what they return, bit for bit.
#[cfg(test)]
pub fn reference(t: QType, w: &[u8], act: &[BlockQ8K]) -> f32 {
    use super::quant::{f16_at, scales_mins_k4};
    let mut acc = 0f32;
    for (bw, a) in w.chunks_exact(t.block_bytes()).zip(act) {
        if t == QType::Q4K {
            let (d, dmin) = (f16_at(bw, 0), f16_at(bw, 2));
            let (sc, mn) = scales_mins_k4(&bw[4..16]);
            let qs = &bw[16..144];
            let v = |i: usize| {
                let b = qs[32 * (i / 64) + i % 32];
                (if i % 64 < 32 { b & 15 } else { b >> 4 }) as i32
            };
            let isum: i32 = (0..8).map(|j| sc[j] as i32 * (0..32).map(|l| v(32 * j + l) * a.qs[32 * j + l] as i32).sum::<i32>()).sum();
            let imin: i32 = (0..8).map(|j| mn[j] as i32 * a.qs[32 * j..32 * j + 32].iter().map(|&q| q as i32).sum::<i32>()).sum();
            acc = (isum as f32).mul_add(d * a.d, acc);
            acc = (imin as f32).mul_add(-dmin * a.d, acc);
        } else {
            let (ql, qh, sc, d) = (&bw[..128], &bw[128..192], &bw[192..208], f16_at(bw, 208));
            let v = |i: usize| {
                let (h, t, l) = (i / 128, i % 128 / 32, i % 32);
                let lo = ql[64 * h + 32 * (t & 1) + l] >> (4 * (t / 2)) & 15;
                let hi = qh[32 * h + l] >> (2 * t) & 3;
                (lo | hi << 4) as i32 - 32
            };
            let isum: i32 = (0..16).map(|j| sc[j] as i8 as i32 * (0..16).map(|l| v(16 * j + l) * a.qs[16 * j + l] as i32).sum::<i32>()).sum();
            acc = (isum as f32).mul_add(d * a.d, acc);
        }
    }
    acc
}
