//! Intel AMX (AMX-TILE + AMX-INT8) kernels for Q4_K and Q6_K products with two or more
//! activation rows: speculative verification and prefill.
//!
//! `tdpbusd` multiplies a 16 x 64 tile of unsigned bytes by a 64 x 16 tile of signed bytes
//! into 16 x 16 i32 sums (~1.1 TMAC/s on one Xeon core, ~10x its AVX-512 VNNI kernels'
//! peak), which takes the integer work of every further activation row off the vector
//! units.
//!
//! Layout. The A tile is 16 weight rows x 64 values of one superblock step (the weights'
//! nibbles unpacked to bytes, no transposition). The B tile holds the activations of up to
//! 8 (Q4_K) or 4 (Q6_K) rows in 16 columns, one column per (activation row, sub-block)
//! pair, the other sub-block's bytes zeroed, so each output column is the integer dot
//! product of one sub-block: C[n][(m, g)]. The sub-block scales are then applied in
//! integers (`vpmulld`), the mins / offsets too (`vpdpwssd`), and per superblock the exact
//! integer sum is scaled once: `acc = fma(isum, dw * da, acc)` (and, for Q4_K, `acc =
//! fma(imin, -dmin * da, acc)`). That folding of the sums, ~34 vector instructions per
//! weight row and superblock, and the unpacking cost more than the tiles (~560 cycles a
//! step against 90 for its tile instructions alone): a 5-row verification of Qwen2.5-1.5B
//! took 75 ms against 82-84 ms with the same arithmetic on AVX-512 on a 2-core Xeon.
//!
//! The tiles need AMX-INT8 and the tile state granted by Linux (`arch_prctl`);
//! [`KernelOptions::amx`](super::KernelOptions::amx) turns them off (`SAPIENT_NO_AMX` in the
//! binaries), and [`use_for`] picks per product (`SAPIENT_AMX_Q6K=all|never` overrides it
//! for Q6_K).
//!
//! On a machine that uses these kernels, every other Q4_K/Q6_K product computes the same
//! exact integer sums and the same fused multiply-adds per superblock: one activation row
//! through `avx512::range_k_x`, batches that [`use_for`] leaves to AVX-512 through
//! `avx512::rows_q4k_x` / `rows_q6k_x`. So a batch of rows is bit-identical to the rows one
//! at a time (speculative decoding relies on it), and a prompt's logits do not depend on how
//! it was batched.
//!
//! Safety: the functions require AVX-512 F/BW/VL/VNNI, FMA, F16C and AMX with the tile
//! state granted to the process ([`available`] checks all of it once).

#![allow(clippy::missing_safety_doc, clippy::needless_range_loop)]

use super::avx512::{dpwssd, f16_bits};
use super::quant::{BlockQ8K, QType};
use std::arch::asm;
use std::arch::x86_64::*;

/// Whether the CPU has AMX-TILE and AMX-INT8, the OS enables the tile state (XCR0 bits 17
/// and 18), and Linux grants it to this process (`arch_prctl(ARCH_REQ_XCOMP_PERM)`). Some
/// VMs list the CPU flags without the state; then this is false and nothing here runs.
pub fn available() -> bool {
    // SAFETY: cpuid is always available on x86_64; xgetbv only after the OSXSAVE bit says so.
    unsafe {
        let l7 = __cpuid_count(7, 0);
        let tile = l7.edx & (1 << 24) != 0;
        let int8 = l7.edx & (1 << 25) != 0;
        if !(tile && int8) {
            return false;
        }
        let l1 = __cpuid(1);
        if l1.ecx & (1 << 27) == 0 {
            return false;
        }
        let xcr0 = xgetbv0();
        if xcr0 & (0b11 << 17) != 0b11 << 17 {
            return false;
        }
    }
    request_tile_state()
}

#[target_feature(enable = "xsave")]
unsafe fn xgetbv0() -> u64 {
    _xgetbv(0)
}

#[cfg(target_os = "linux")]
fn request_tile_state() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: a plain system call with integer arguments.
    unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
}

#[cfg(not(target_os = "linux"))]
fn request_tile_state() -> bool {
    false
}

/// Whether a product of `m` activation rows with weights of format `t` goes to the AMX
/// kernels; the others, on a machine with AMX, go to the AVX-512 kernels with the same exact
/// arithmetic (`avx512::rows_q4k_x`, `rows_q6k_x`), so the choice never changes a result.
/// Q6_K takes 4 activation rows per tile, and 5 to 8 rows (two passes) were slower than the
/// AVX-512 kernels on a 2-core Xeon: a 5-token forward of Qwen2.5-1.5B 75.3-75.7 ms against
/// 77-79 ms with AMX for all (`examples/step_cost`). [`super::KernelOptions::amx_q6k`] overrides.
pub fn use_for(t: QType, m: usize) -> bool {
    use super::AmxQ6k;
    match t {
        QType::Q4K => m >= 2,
        QType::Q6K => {
            m >= 2
                && match super::options().amx_q6k {
                    AmxQ6k::All => true,
                    AmxQ6k::Never => false,
                    AmxQ6k::Auto => !(5..=8).contains(&m),
                }
        }
        _ => false,
    }
}

/// Whether format `t` has AMX kernels here.
pub fn handles(t: QType) -> bool {
    matches!(t, QType::Q4K | QType::Q6K)
}

/// Sub-blocks per 64-value step of format `t` (the columns one activation row takes in a B
/// tile): Q4_K's sub-blocks are 32 values, Q6_K's 16.
pub fn groups(t: QType) -> usize {
    match t {
        QType::Q6K => 4,
        _ => 2,
    }
}

/// Activation rows per B tile for format `t` (16 columns, `groups(t)` a row).
pub fn rows_per_chunk(t: QType) -> usize {
    16 / groups(t)
}

/// B tiles' chunks of activation rows a product of `m` rows takes ([`acts_from`]'s layout,
/// `product`'s accumulators).
pub fn chunks(t: QType, m: usize) -> usize {
    m.div_ceil(rows_per_chunk(t))
}

/// One 16 x 64-byte tile.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub struct Tile(pub [u8; 1024]);

impl Default for Tile {
    fn default() -> Self {
        Tile([0; 1024])
    }
}

/// Per (chunk of activation rows, superblock): the rows' scales and the integer vectors the
/// mins (Q4_K) or offsets (Q6_K) need, laid out in the B tile's columns.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub struct SbActs {
    /// Lane (m, g): row m's scale `d`.
    pub d: [f32; 16],
    /// Q4_K, step j: lane (m, 0) the i16 pair (sum of sub-block 2j, of 2j + 1) of row m,
    /// lane (m, 1) zero. Q6_K, half t < 2: lane (m, q) the i16 pair (sum of 16-value group
    /// 8t + 2q, of 8t + 2q + 1).
    pub v: [[i32; 16]; 4],
}

impl Default for SbActs {
    fn default() -> Self {
        Self { d: [0.0; 16], v: [[0; 16]; 4] }
    }
}

/// Lay out `m` quantized activation rows (`nsb` superblocks each, row-major in `q8k`) for
/// weights of format `t`: tiles `[chunk][superblock][step]`, side data `[chunk][superblock]`.
pub fn acts_from(t: QType, q8k: &[BlockQ8K], m: usize, nsb: usize, tiles: &mut [Tile], sbs: &mut [SbActs]) {
    let g = groups(t);
    let r = rows_per_chunk(t);
    let chunks = chunks(t, m);
    debug_assert_eq!(tiles.len(), chunks * nsb * 4);
    debug_assert_eq!(sbs.len(), chunks * nsb);
    let k4_per_group = 16 / g;
    for c in 0..chunks {
        for sb in 0..nsb {
            let side = &mut sbs[c * nsb + sb];
            *side = SbActs::default();
            for j in 0..4 {
                tiles[(c * nsb + sb) * 4 + j] = Tile::default();
            }
            for mi in 0..r {
                let row = c * r + mi;
                if row >= m {
                    break;
                }
                let b = &q8k[row * nsb + sb];
                for j in 0..4 {
                    let tile = &mut tiles[(c * nsb + sb) * 4 + j].0;
                    for k4 in 0..16 {
                        let gi = k4 / k4_per_group;
                        let col = mi * g + gi;
                        // Q6_K: step j holds values 64 j .. 64 j + 64 in order. Q4_K: step j
                        // holds sub-blocks (S, S + 2) with S = 4 (j / 2) + j % 2, the low or
                        // high nibbles of 64 stored bytes (`unpack_q4k_x4`).
                        let src = if g == 2 { 32 * (4 * (j / 2) + j % 2 + 2 * gi) + 4 * (k4 % 8) } else { 64 * j + 4 * k4 };
                        for e in 0..4 {
                            tile[64 * k4 + 4 * col + e] = b.qs[src + e] as u8;
                        }
                    }
                }
                for gi in 0..g {
                    side.d[mi * g + gi] = b.d;
                }
                let pair = |lo: i32, hi: i32| (lo as i16 as u16 as u32 | (hi as i16 as u16 as u32) << 16) as i32;
                if g == 2 {
                    for j in 0..4 {
                        let s = |k: usize| b.bsums[2 * k] as i32 + b.bsums[2 * k + 1] as i32;
                        side.v[j][mi * 2] = pair(s(2 * j), s(2 * j + 1));
                    }
                } else {
                    for t2 in 0..2 {
                        for q in 0..4 {
                            let k = 8 * t2 + 2 * q;
                            side.v[t2][mi * 4 + q] = pair(b.bsums[k] as i32, b.bsums[k + 1] as i32);
                        }
                    }
                }
            }
        }
    }
}

#[repr(C, align(64))]
struct TileCfg([u8; 64]);

/// Eight 16 x 64-byte tiles (here: tmm0..3 the sums of the four steps, tmm4/tmm6 weights,
/// tmm5/tmm7 activations; `dense_bf16` uses the same shapes).
#[inline(always)]
pub(super) unsafe fn configure() {
    let mut c = TileCfg([0; 64]);
    c.0[0] = 1;
    for t in 0..8 {
        c.0[16 + 2 * t] = 64;
        c.0[48 + t] = 16;
    }
    asm!("ldtilecfg [{}]", in(reg) c.0.as_ptr(), options(nostack, readonly));
}

#[inline(always)]
unsafe fn release() {
    asm!("tilerelease", options(nostack, nomem));
}

/// The four steps of one superblock: C_j = A_j (at `a + 1024 j`) x B_j (at `b + 1024 j`),
/// stored to `c + 1024 j`.
#[inline(always)]
unsafe fn four_steps(a: *const u8, b: *const u8, c: *mut u8) {
    asm!(
        "tileloadd tmm4, [{a} + {s}*1]",
        "tileloadd tmm5, [{b} + {s}*1]",
        "tilezero tmm0",
        "tdpbusd tmm0, tmm4, tmm5",
        "tileloadd tmm6, [{a} + {s}*1 + 1024]",
        "tileloadd tmm7, [{b} + {s}*1 + 1024]",
        "tilezero tmm1",
        "tdpbusd tmm1, tmm6, tmm7",
        "tileloadd tmm4, [{a} + {s}*1 + 2048]",
        "tileloadd tmm5, [{b} + {s}*1 + 2048]",
        "tilezero tmm2",
        "tdpbusd tmm2, tmm4, tmm5",
        "tileloadd tmm6, [{a} + {s}*1 + 3072]",
        "tileloadd tmm7, [{b} + {s}*1 + 3072]",
        "tilezero tmm3",
        "tdpbusd tmm3, tmm6, tmm7",
        "tilestored [{c} + {s}*1], tmm0",
        "tilestored [{c} + {s}*1 + 1024], tmm1",
        "tilestored [{c} + {s}*1 + 2048], tmm2",
        "tilestored [{c} + {s}*1 + 3072], tmm3",
        a = in(reg) a,
        b = in(reg) b,
        c = in(reg) c,
        s = in(reg) 64usize,
        options(nostack),
    );
}

/// 16 weight rows of one superblock, unpacked, with their scales.
#[repr(C, align(64))]
struct Unpacked {
    /// `a[j][n]`: row n's 64 values of step j (unsigned).
    a: [[[u8; 64]; 16]; 4],
    /// Q4_K: row n's 8 sub-block scales as i32, in the steps' pair order (0, 2, 1, 3, 4, 6,
    /// 5, 7). Q6_K: its 16 scales as i32.
    sc: [[i32; 16]; 16],
    /// Q4_K: row n's mins as i16 (8). Q6_K: its 16 scales as i16.
    pairs: [[i16; 16]; 16],
    /// Row n's `[d, dmin]` (Q6_K: `d` only).
    dm: [[f32; 2]; 16],
}

/// Byte indices of the scale unpacking (per 128-bit lane: one row's 12 scale bytes).
#[repr(C, align(64))]
struct Shuf([i8; 64]);

/// A 16-byte pattern repeated in each 128-bit lane.
const fn per_lane(l: [i8; 16]) -> Shuf {
    let mut t = [0i8; 64];
    let mut i = 0;
    while i < 64 {
        t[i] = l[i % 16];
        i += 1;
    }
    Shuf(t)
}

// Scales in the order the tile steps pair them: (0, 2), (1, 3), (4, 6), (5, 7).
static K4_A: Shuf = per_lane([0, 2, 1, 3, 8, 10, 9, 11, 4, 5, 6, 7, 8, 9, 10, 11]);
static K4_B: Shuf = per_lane([-128, -128, -128, -128, 0, 2, 1, 3, -128, -128, -128, -128, 4, 5, 6, 7]);

/// Four Q4_K rows' 6-bit scales and mins (12 bytes at `p[r]` each), as in `k4_scales_mins`:
/// per 128-bit lane r, bytes `[sc0, sc2, sc1, sc3, sc4, sc6, sc5, sc7, mn0..8]` of row r
/// (the scales in the order of the tile steps' sub-block pairs).
#[inline(always)]
unsafe fn k4_scales_mins_x4(p: [*const u8; 4]) -> __m512i {
    let s = _mm512_castsi128_si512(_mm_loadu_si128(p[0] as *const __m128i));
    let s = _mm512_inserti32x4::<1>(s, _mm_loadu_si128(p[1] as *const __m128i));
    let s = _mm512_inserti32x4::<2>(s, _mm_loadu_si128(p[2] as *const __m128i));
    let s = _mm512_inserti32x4::<3>(s, _mm_loadu_si128(p[3] as *const __m128i));
    let a = _mm512_shuffle_epi8(s, _mm512_load_si512(K4_A.0.as_ptr() as *const __m512i));
    let b = _mm512_shuffle_epi8(s, _mm512_load_si512(K4_B.0.as_ptr() as *const __m512i));
    let hib = _mm512_and_si512(_mm512_srli_epi16::<2>(b), _mm512_set1_epi8(0x30));
    let m4 = _mm512_set1_epi8(0x0f);
    let t1 = _mm512_and_si512(a, _mm512_set1_epi8(63));
    let t2 = _mm512_or_si512(_mm512_and_si512(a, m4), hib);
    let t3 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16::<4>(a), m4), hib);
    // Per lane: bytes 0..4 and 8..12 from t1, 4..8 from t2, 12..16 from t3.
    let r = _mm512_mask_blend_epi8(0x00F0_00F0_00F0_00F0, t1, t2);
    _mm512_mask_blend_epi8(0xF000_F000_F000_F000, r, t3)
}

/// Four Q4_K rows (`bw[r]` at their superblock) into rows `n..n + 4` of `u`.
#[inline(always)]
unsafe fn unpack_q4k_x4(bw: [*const u8; 4], n: usize, u: &mut Unpacked) {
    let m4 = _mm512_set1_epi8(0x0f);
    for (r, &p) in bw.iter().enumerate() {
        // Steps 2h and 2h + 1: the low and the high nibbles of stored bytes 64 h .. 64 h + 64,
        // i.e. sub-blocks (4h, 4h + 2) and (4h + 1, 4h + 3); the activations are laid out to
        // match (`acts_from`), and the scales paired the same way.
        for h in 0..2 {
            let v = _mm512_loadu_si512(p.add(16 + 64 * h) as *const __m512i);
            _mm512_store_si512(u.a[2 * h][n + r].as_mut_ptr() as *mut __m512i, _mm512_and_si512(v, m4));
            _mm512_store_si512(u.a[2 * h + 1][n + r].as_mut_ptr() as *mut __m512i, _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4));
        }
        let v = _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(p as *const i32)));
        _mm_storel_epi64(u.dm[n + r].as_mut_ptr() as *mut __m128i, _mm_castps_si128(v));
    }
    let ms = k4_scales_mins_x4([bw[0].add(4), bw[1].add(4), bw[2].add(4), bw[3].add(4)]);
    let lanes = [
        _mm512_castsi512_si128(ms),
        _mm512_extracti32x4_epi32::<1>(ms),
        _mm512_extracti32x4_epi32::<2>(ms),
        _mm512_extracti32x4_epi32::<3>(ms),
    ];
    for (r, x) in lanes.into_iter().enumerate() {
        _mm256_storeu_si256(u.sc[n + r].as_mut_ptr() as *mut __m256i, _mm256_cvtepu8_epi32(x));
        _mm_storeu_si128(u.pairs[n + r].as_mut_ptr() as *mut __m128i, _mm_cvtepu8_epi16(_mm_srli_si128::<8>(x)));
    }
}

#[inline(always)]
unsafe fn unpack_q6k(bw: *const u8, n: usize, u: &mut Unpacked) {
    for h in 0..2 {
        let [x0, x1] = super::avx512::q6k_half(bw, h);
        _mm512_store_si512(u.a[2 * h][n].as_mut_ptr() as *mut __m512i, x0);
        _mm512_store_si512(u.a[2 * h + 1][n].as_mut_ptr() as *mut __m512i, x1);
    }
    let sc = _mm_loadu_si128(bw.add(192) as *const __m128i);
    _mm512_storeu_si512(u.sc[n].as_mut_ptr() as *mut __m512i, _mm512_cvtepi8_epi32(sc));
    _mm256_storeu_si256(u.pairs[n].as_mut_ptr() as *mut __m256i, _mm256_cvtepi8_epi16(sc));
    u.dm[n][0] = f16_bits(bw.add(208));
}

/// Fold one chunk's step sums (`cbuf`, as C tiles) of one superblock into `acc[n]`.
#[inline(always)]
unsafe fn drain_q4k(cbuf: &[Tile; 4], u: &Unpacked, side: &SbActs, acc: &mut [[f32; 16]; 16], nn: usize) {
    let dvec = _mm512_load_ps(side.d.as_ptr());
    let v: [__m512i; 4] = std::array::from_fn(|j| _mm512_load_si512(side.v[j].as_ptr() as *const __m512i));
    for n in 0..nn {
        let c = |j: usize| _mm512_load_si512(cbuf[j].0.as_ptr().add(64 * n) as *const __m512i);
        let sc = u.sc[n].as_ptr() as *const i64;
        let mut isum = _mm512_mullo_epi32(c(0), _mm512_set1_epi64(*sc));
        for j in 1..4 {
            isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(c(j), _mm512_set1_epi64(*sc.add(j))));
        }
        let tot = _mm512_add_epi32(isum, _mm512_shuffle_epi32::<0xB1>(isum));
        let mp = u.pairs[n].as_ptr() as *const i32;
        let mut im = _mm512_setzero_si512();
        for (j, vj) in v.iter().enumerate() {
            im = dpwssd(im, _mm512_set1_epi32(*mp.add(j)), *vj);
        }
        let dd = _mm512_mul_ps(_mm512_set1_ps(u.dm[n][0]), dvec);
        let dmn = _mm512_mul_ps(_mm512_set1_ps(u.dm[n][1]), dvec);
        let mut a = _mm512_loadu_ps(acc[n].as_ptr());
        a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tot), dd, a);
        // acc - imin * (dmin * da): the one-row kernel's fma(imin, -dmin * da, acc).
        a = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(im), dmn, a);
        _mm512_storeu_ps(acc[n].as_mut_ptr(), a);
    }
}

#[inline(always)]
unsafe fn drain_q6k(cbuf: &[Tile; 4], u: &Unpacked, side: &SbActs, acc: &mut [[f32; 16]; 16], nn: usize) {
    let dvec = _mm512_load_ps(side.d.as_ptr());
    let v0 = _mm512_load_si512(side.v[0].as_ptr() as *const __m512i);
    let v1 = _mm512_load_si512(side.v[1].as_ptr() as *const __m512i);
    for n in 0..nn {
        let c = |j: usize| _mm512_load_si512(cbuf[j].0.as_ptr().add(64 * n) as *const __m512i);
        let sc = u.sc[n].as_ptr();
        let b4 = |s: usize| _mm512_broadcast_i32x4(_mm_loadu_si128(sc.add(4 * s) as *const __m128i));
        let mut isum = _mm512_mullo_epi32(c(0), b4(0));
        for s in 1..4 {
            isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(c(s), b4(s)));
        }
        let p = u.pairs[n].as_ptr();
        let p0 = _mm512_broadcast_i32x4(_mm_loadu_si128(p as *const __m128i));
        let p1 = _mm512_broadcast_i32x4(_mm_loadu_si128(p.add(8) as *const __m128i));
        let corr = dpwssd(dpwssd(_mm512_setzero_si512(), p0, v0), p1, v1);
        let x = _mm512_sub_epi32(isum, _mm512_slli_epi32::<5>(corr));
        let x = _mm512_add_epi32(x, _mm512_shuffle_epi32::<0xB1>(x));
        let x = _mm512_add_epi32(x, _mm512_shuffle_epi32::<0x4E>(x));
        let dd = _mm512_mul_ps(_mm512_set1_ps(u.dm[n][0]), dvec);
        let a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(x), dd, _mm512_loadu_ps(acc[n].as_ptr()));
        _mm512_storeu_ps(acc[n].as_mut_ptr(), a);
    }
}

/// Weight rows `r0..r1` of a Q4_K or Q6_K matrix (`rb` bytes a row, `nsb` superblocks)
/// against `m` activation rows laid out by [`acts_from`]; `out[i * rows + j]` for activation
/// row i and weight row j. `acc` is scratch of [`chunks`]`(t, m)` blocks.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn product(
    t: QType,
    w: &[u8],
    rb: usize,
    r0: usize,
    r1: usize,
    tiles: &[Tile],
    sbs: &[SbActs],
    m: usize,
    out: *mut f32,
    rows: usize,
    acc: &mut [[[f32; 16]; 16]],
) {
    let g = groups(t);
    let per = rows_per_chunk(t);
    let chunks = chunks(t, m);
    let bb = t.block_bytes();
    let nsb = rb / bb;
    debug_assert!(acc.len() >= chunks && tiles.len() >= chunks * nsb * 4 && w.len() >= r1 * rb);
    if r0 >= r1 || nsb == 0 {
        return;
    }
    // A software pipeline over tasks (16-row group, superblock, chunk of activation rows):
    // while the tile unit multiplies task k, the vector units fold task k - 1's sums and
    // unpack the next superblock. Each superblock and each task's sums have two buffers, so
    // a step never waits on the stores of the step just before it.
    let mut u: [Unpacked; 2] = std::mem::zeroed();
    let mut cbuf = [[Tile::default(); 4]; 2];
    let groups_n = (r1 - r0).div_ceil(16);
    let steps = groups_n * nsb;
    let tasks = steps * chunks;
    let unpack = |step: usize, u: &mut Unpacked| {
        let (grp, sb) = (step / nsb, step % nsb);
        let n0 = r0 + 16 * grp;
        let nn = (r1 - n0).min(16);
        for n4 in (0..16).step_by(4) {
            let mut bw = [std::ptr::null(); 4];
            for (r, p) in bw.iter_mut().enumerate() {
                // Rows past the end repeat the last row (read, never written out).
                let row = n0 + (n4 + r).min(nn - 1);
                *p = w.as_ptr().add(row * rb + sb * bb);
                // Two superblocks ahead in the same row, or the next group's row: sixteen
                // interleaved streams are more than the hardware prefetchers follow.
                // (1, 2 or 4 superblocks ahead: within the noise in the model.)
                let ahead = if sb + 2 < nsb { row * rb + (sb + 2) * bb } else { (row + 16) * rb + (sb + 2 - nsb) * bb };
                if let Some(b) = w.get(ahead..ahead + bb) {
                    super::prefetch(b);
                }
            }
            match t {
                QType::Q6K => {
                    for (r, p) in bw.into_iter().enumerate() {
                        unpack_q6k(p, n4 + r, u);
                    }
                }
                _ => unpack_q4k_x4(bw, n4, u),
            }
        }
    };
    for a in acc[..chunks].iter_mut() {
        *a = [[0.0; 16]; 16];
    }
    configure();
    unpack(0, &mut u[0]);
    for k in 0..=tasks {
        if k < tasks {
            let (step, c) = (k / chunks, k % chunks);
            let sb = step % nsb;
            let bt = tiles.as_ptr().add((c * nsb + sb) * 4) as *const u8;
            four_steps(u[step % 2].a.as_ptr() as *const u8, bt, cbuf[k % 2].as_mut_ptr() as *mut u8);
        }
        if k > 0 {
            let kp = k - 1;
            let (step, c) = (kp / chunks, kp % chunks);
            let (grp, sb) = (step / nsb, step % nsb);
            let n0 = r0 + 16 * grp;
            let nn = (r1 - n0).min(16);
            let side = &sbs[c * nsb + sb];
            match t {
                QType::Q6K => drain_q6k(&cbuf[kp % 2], &u[step % 2], side, &mut acc[c], nn),
                _ => drain_q4k(&cbuf[kp % 2], &u[step % 2], side, &mut acc[c], nn),
            }
            if sb == nsb - 1 && c == chunks - 1 {
                for (c, a) in acc[..chunks].iter_mut().enumerate() {
                    for mi in 0..per {
                        let i = c * per + mi;
                        if i >= m {
                            break;
                        }
                        for (n, an) in a.iter().enumerate().take(nn) {
                            *out.add(i * rows + n0 + n) = an[mi * g];
                        }
                    }
                    *a = [[0.0; 16]; 16];
                }
            }
        }
        // The next superblock, after task k - 1 no longer needs the buffer it reuses.
        if k < tasks && k % chunks == chunks - 1 && k / chunks + 1 < steps {
            let next = k / chunks + 1;
            unpack(next, &mut u[next % 2]);
        }
    }
    release();
}
