//! One-dimensional convolutions over time-major bf16 frames on Intel AMX-BF16 (or AVX512-BF16), one bf16
//! product per tile (weights and activations rounded to bf16, sums in f32): a third of the
//! tile work of [`super::DenseMatrix`]'s two-half products, for models whose activations
//! tolerate bf16 (Kokoro's vocoder runs on int8 activations in its reference export).
//!
//! No im2col. The input is a buffer of frames, each `ld` bf16 values (the input channels
//! rounded up to 32, zero past them), with the convolution's zero padding as zero frames
//! around the data. The A tile of 16 output frames, tap `kk` and input channels
//! `32 s .. 32 s + 32` is 16 rows of 64 bytes read in place from frames
//! `r * stride + kk * dilation` (`tileloadd` with a row stride of `stride * ld` values); the
//! weights are prepacked per 16 output channels, tap and 32 input channels as `tdpbf16ps`
//! B tiles. Two blocks of 16 frames times two panels of 16 channels per step (four sums in
//! tiles, four tile loads per four products); the bias is added, or the result added to the
//! output, as each 32 x 32 block is written. Rows of output frames are split over the kernel
//! pool.
//!
//! Without AMX, on AVX512-BF16 (`vdpbf16ps`, Zen 4), the same packed weights serve as
//! vectors: row `r` of a B tile is 16 output channels times input channels `2r, 2r + 1`, the
//! pairs `vdpbf16ps` multiplies, so each step loads one row per panel, broadcasts each frame's
//! pair of inputs, and adds into 2 panels x 8 frames of sums held in registers. Rows are
//! split over the pool as above, and with too few rows for it, panel pairs too.

use super::pool;

/// bf16 values per 16 x 32 tile.
const TILE: usize = 512;

/// bf16 bits of `x`, rounded to nearest even.
#[inline(always)]
pub fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    (b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16) as u16
}

/// Convolution weights `[out, in, k]` (PyTorch's `Conv1d` layout) prepacked for
/// [`ConvBf16::forward`].
pub struct ConvBf16 {
    cout: usize,
    cin: usize,
    ld: usize,
    k: usize,
    /// `[cout rounded to 32 / 16][k][ld / 32][512]`.
    tiles: Vec<u16>,
    /// Products on AMX tiles; else on AVX512-BF16 vectors.
    amx: bool,
}

impl std::fmt::Debug for ConvBf16 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let path = if self.amx { "AMX-BF16" } else { "AVX512-BF16" };
        f.debug_struct("ConvBf16").field("cout", &self.cout).field("cin", &self.cin).field("k", &self.k).field("path", &path).finish()
    }
}

impl ConvBf16 {
    /// From f32 weights `[cout, cin, k]`; `None` where neither AMX-BF16
    /// ([`super::has_amx_bf16`]) nor AVX512-BF16 ([`super::has_avx512_bf16`]) runs here.
    pub fn new(w: &[f32], cout: usize, cin: usize, k: usize) -> Option<Self> {
        let amx = super::has_amx_bf16();
        if !(amx || super::has_avx512_bf16()) || w.len() < cout * cin * k || cout == 0 || cin == 0 || k == 0 {
            return None;
        }
        let ld = cin.div_ceil(32) * 32;
        let (nb, kb) = (cout.div_ceil(32) * 2, ld / 32);
        let mut tiles = vec![0u16; nb * k * kb * TILE];
        for b in 0..nb {
            for kk in 0..k {
                for s in 0..kb {
                    let t = &mut tiles[((b * k + kk) * kb + s) * TILE..][..TILE];
                    for r in 0..16 {
                        for c in 0..16 {
                            for j in 0..2 {
                                let (o, i) = (b * 16 + c, s * 32 + 2 * r + j);
                                if o < cout && i < cin {
                                    t[r * 32 + c * 2 + j] = bf16_bits(w[(o * cin + i) * k + kk]);
                                }
                            }
                        }
                    }
                }
            }
        }
        Some(Self { cout, cin, ld, k, tiles, amx })
    }

    pub fn out_channels(&self) -> usize {
        self.cout
    }
    pub fn in_channels(&self) -> usize {
        self.cin
    }
    pub fn kernel(&self) -> usize {
        self.k
    }
    /// Values per input frame: the input channels rounded up to 32.
    pub fn ld(&self) -> usize {
        self.ld
    }
    /// Bytes of the packed weights.
    pub fn bytes(&self) -> usize {
        self.tiles.len() * 2
    }

    /// Input frames [`forward`](Self::forward) reads for `tout` output frames: the output
    /// rounded up to 32 frames, so the input needs zero frames past the last one used.
    pub fn frames_needed(&self, tout: usize, stride: usize, dilation: usize) -> usize {
        (tout.div_ceil(32) * 32 - 1) * stride + (self.k - 1) * dilation + 1
    }

    /// `out[r, o] = bias[o] + sum over kk, i of w[o, i, kk] x[r * stride + kk * dilation][i]`
    /// for `r < tout` (`out` `[tout, cout]`), or that added to `out` with `accumulate`.
    /// `x` holds frames of [`ld`](Self::ld) bf16 values (zero past `cin`), at least
    /// [`frames_needed`](Self::frames_needed) of them.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(&self, x: &[u16], tout: usize, stride: usize, dilation: usize, bias: Option<&[f32]>, accumulate: bool, out: &mut [f32]) {
        let cout = self.cout;
        assert!(stride >= 1 && dilation >= 1, "ConvBf16: stride and dilation must be >= 1");
        assert!(
            x.len() >= self.frames_needed(tout, stride, dilation) * self.ld,
            "ConvBf16: input is {} values, needs {} frames of {}",
            x.len(),
            self.frames_needed(tout, stride, dilation),
            self.ld
        );
        assert!(out.len() >= tout * cout, "ConvBf16: output is {} values, not {tout} x {cout}", out.len());
        if let Some(b) = bias {
            assert!(b.len() >= cout, "ConvBf16: bias is {} values, not {cout}", b.len());
        }
        if tout == 0 {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        {
            let blocks = tout.div_ceil(32);
            let pairs = cout.div_ceil(32);
            let threads = pool::pool().threads();
            let work = tout * cout * self.k * self.ld;
            // Chunks of rows; on AVX512-BF16, with too few rows for the pool, also groups of
            // panel pairs (each chunk then reads only its panels' weights).
            let (rchunks, groups) = if work < 1 << 20 {
                (1, 1)
            } else {
                let r = (threads * 8).min(blocks);
                (r, if self.amx || r >= threads * 4 { 1 } else { (threads * 4).div_ceil(r).min(pairs) })
            };
            let per = blocks.div_ceil(rchunks);
            let pper = pairs.div_ceil(groups);
            let chunks = rchunks * groups;
            let o = super::SendPtr(out.as_mut_ptr());
            let job = |c: usize| {
                let (rc, g) = (c / groups, c % groups);
                let (r0, r1) = (rc * per * 32, ((rc + 1) * per * 32).min(tout));
                let (p0, p1) = (g * pper, ((g + 1) * pper).min(pairs));
                if r0 >= r1 || p0 >= p1 {
                    return;
                }
                // SAFETY: AMX-BF16 and AVX-512, or AVX512-BF16, are present (checked at
                // construction); the asserts above bound every read; this chunk writes only
                // rows r0..r1 (and, on AVX512-BF16, the columns of panel pairs p0..p1).
                unsafe {
                    if self.amx {
                        self.rows(x, r0, r1, tout, stride, dilation, bias, accumulate, o.ptr())
                    } else {
                        self.rows_dp(x, (r0, r1), (p0, p1), stride, dilation, bias, accumulate, o.ptr())
                    }
                };
            };
            if chunks == 1 {
                job(0);
            } else {
                pool::pool().run_chunks(chunks, &job);
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (x, stride, dilation, bias, accumulate, out);
            unreachable!("ConvBf16 is only built where AMX-BF16 or AVX512-BF16 runs");
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn rows(&self, x: &[u16], r0: usize, r1: usize, tout: usize, stride: usize, dilation: usize, bias: Option<&[f32]>, accumulate: bool, out: *mut f32) {
        use std::arch::asm;
        use std::arch::x86_64::*;
        let (cout, ld, k) = (self.cout, self.ld, self.k);
        let kb = ld / 32;
        let pairs = cout.div_ceil(32);
        let panel = k * kb * TILE;
        let sa = stride * ld * 2; // bytes between A rows
        let mut c = [0.0f32; 32 * 32];
        super::amx::configure();
        for rb in (r0..r1).step_by(32) {
            let rows = (tout - rb).min(32);
            let xa = x.as_ptr().add(rb * stride * ld);
            for p in 0..pairs {
                let w0 = self.tiles.as_ptr().add(2 * p * panel);
                let w1 = w0.add(panel);
                asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3", options(nostack, nomem));
                for kk in 0..k {
                    let a0 = xa.add(kk * dilation * ld);
                    let a1 = a0.add(16 * stride * ld);
                    for s in 0..kb {
                        let wt = (kk * kb + s) * TILE;
                        asm!(
                            "tileloadd tmm4, [{a0} + {sa}*1]",
                            "tileloadd tmm6, [{b0} + {s64}*1]",
                            "tdpbf16ps tmm0, tmm4, tmm6",
                            "tileloadd tmm5, [{a1} + {sa}*1]",
                            "tdpbf16ps tmm2, tmm5, tmm6",
                            "tileloadd tmm7, [{b1} + {s64}*1]",
                            "tdpbf16ps tmm1, tmm4, tmm7",
                            "tdpbf16ps tmm3, tmm5, tmm7",
                            a0 = in(reg) a0.add(s * 32),
                            a1 = in(reg) a1.add(s * 32),
                            b0 = in(reg) w0.add(wt),
                            b1 = in(reg) w1.add(wt),
                            sa = in(reg) sa,
                            s64 = in(reg) 64usize,
                            options(nostack, readonly),
                        );
                    }
                }
                asm!(
                    "tilestored [{c} + {s128}*1], tmm0",
                    "tilestored [{c} + {s128}*1 + 64], tmm1",
                    "tilestored [{c} + {s128}*1 + 2048], tmm2",
                    "tilestored [{c} + {s128}*1 + 2112], tmm3",
                    c = in(reg) c.as_mut_ptr(),
                    s128 = in(reg) 128usize,
                    options(nostack),
                );
                let cols = (cout - p * 32).min(32);
                for j in (0..cols).step_by(16) {
                    let mask: u16 = if cols - j >= 16 { 0xFFFF } else { ((1u32 << (cols - j)) - 1) as u16 };
                    let col = p * 32 + j;
                    let bv = match bias {
                        Some(b) => _mm512_maskz_loadu_ps(mask, b.as_ptr().add(col)),
                        None => _mm512_setzero_ps(),
                    };
                    for r in 0..rows {
                        let dst = out.add((rb + r) * cout + col);
                        let mut v = _mm512_add_ps(_mm512_loadu_ps(c.as_ptr().add(r * 32 + j)), bv);
                        if accumulate {
                            v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, dst));
                        }
                        _mm512_mask_storeu_ps(dst, mask, v);
                    }
                }
            }
        }
        asm!("tilerelease", options(nostack, nomem));
    }
}

/// Frames per register block of the AVX512-BF16 path (a divisor of 32, so a block never
/// reads past [`ConvBf16::frames_needed`]).
const DP_FRAMES: usize = 8;

#[cfg(target_arch = "x86_64")]
impl ConvBf16 {
    /// Rows `r0..r1` on AVX512-BF16: for each pair of 16-channel panels `p0..p1`, blocks of
    /// [`DP_FRAMES`] output frames with their 2 x 8 sums in registers; per tap and pair of
    /// input channels, one 64-byte row of each panel's B tile (16 channels x the pair, the
    /// layout `vdpbf16ps` takes) and the pair of each frame broadcast. A panel pair's weights
    /// (`k * ld * 64` bytes) stay in L2 while the chunk's frames pass over them.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn rows_dp(&self, x: &[u16], (r0, r1): (usize, usize), (p0, p1): (usize, usize), stride: usize, dilation: usize, bias: Option<&[f32]>, accumulate: bool, out: *mut f32) {
        use std::arch::x86_64::*;
        let (cout, ld, k) = (self.cout, self.ld, self.k);
        let kstep = (ld / 32) * TILE;
        let panel = k * kstep;
        for p in p0..p1 {
            let w0 = self.tiles.as_ptr().add(2 * p * panel);
            let cols = (cout - p * 32).min(32);
            let masks = [if cols >= 16 { 0xFFFF } else { ((1u32 << cols) - 1) as u16 }, if cols >= 32 { 0xFFFF } else { ((1u32 << cols.saturating_sub(16)) - 1) as u16 }];
            let bv = match bias {
                Some(b) => [_mm512_maskz_loadu_ps(masks[0], b.as_ptr().add(p * 32)), _mm512_maskz_loadu_ps(masks[1], b.as_ptr().add(p * 32 + 16))],
                None => [_mm512_setzero_ps(); 2],
            };
            for rb in (r0..r1).step_by(DP_FRAMES) {
                let mut c = [_mm512_setzero_ps(); 2 * DP_FRAMES];
                dp_block(x.as_ptr().add(rb * stride * ld), stride * ld, dilation * ld, k, ld / 2, w0, panel, kstep, &mut c);
                for f in 0..(r1 - rb).min(DP_FRAMES) {
                    let dst = out.add((rb + f) * cout + p * 32);
                    for h in 0..2 {
                        if masks[h] == 0 {
                            continue;
                        }
                        let mut v = _mm512_add_ps(c[2 * f + h], bv[h]);
                        if accumulate {
                            v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(masks[h], dst.add(16 * h)));
                        }
                        _mm512_mask_storeu_ps(dst.add(16 * h), masks[h], v);
                    }
                }
            }
        }
    }
}

/// The sums of [`DP_FRAMES`] output frames (frame `f` at `xa + f * fstride`, tap `kk`
/// `kk * tstep` values on) times two panels of weights (`w0`, `w0 + panel`; tap `kk` at
/// `kk * kstep`, `pairs` rows of 32 bf16 values each) into `c[2 f]`, `c[2 f + 1]`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn dp_block(xa: *const u16, fstride: usize, tstep: usize, k: usize, pairs: usize, w0: *const u16, panel: usize, kstep: usize, c: &mut [std::arch::x86_64::__m512; 2 * DP_FRAMES]) {
    use std::arch::x86_64::*;
    let mut acc = *c;
    for kk in 0..k {
        let a = xa.add(kk * tstep);
        let b0p = w0.add(kk * kstep);
        let b1p = b0p.add(panel);
        for q in 0..pairs {
            let b0: __m512bh = std::mem::transmute(_mm512_loadu_si512(b0p.add(32 * q) as *const _));
            let b1: __m512bh = std::mem::transmute(_mm512_loadu_si512(b1p.add(32 * q) as *const _));
            for f in 0..DP_FRAMES {
                let v = (a.add(f * fstride + 2 * q) as *const i32).read_unaligned();
                let av: __m512bh = std::mem::transmute(_mm512_set1_epi32(v));
                acc[2 * f] = _mm512_dpbf16_ps(acc[2 * f], av, b0);
                acc[2 * f + 1] = _mm512_dpbf16_ps(acc[2 * f + 1], av, b1);
            }
        }
    }
    *c = acc;
}

#[cfg(test)]
mod tests {
    use super::{bf16_bits, ConvBf16};

    fn bf(v: f32) -> f64 {
        f32::from_bits((bf16_bits(v) as u32) << 16) as f64
    }

    #[test]
    fn matches_f64_reference_on_bf16_values() {
        // The last case is over 2^20 multiply-adds: its rows are split over the pool.
        for &(cout, cin, k, stride, dil, tout) in &[(40usize, 70usize, 3usize, 1usize, 1usize, 45usize), (64, 32, 7, 1, 3, 70), (22, 128, 1, 2, 1, 33), (32, 5, 5, 3, 2, 17), (48, 96, 3, 1, 1, 301)] {
            let w: Vec<f32> = (0..cout * cin * k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 61.0).collect();
            let Some(conv) = ConvBf16::new(&w, cout, cin, k) else {
                eprintln!("neither AMX-BF16 nor AVX512-BF16 here: nothing to test");
                return;
            };
            eprintln!("{conv:?}");
            let ld = conv.ld();
            let frames = conv.frames_needed(tout, stride, dil);
            let xf: Vec<f32> = (0..frames * cin).map(|i| ((i * 13 % 47) as f32 - 23.0) / 17.0 + (i as f32 * 1e-3).sin()).collect();
            let mut x = vec![0u16; frames * ld];
            for f in 0..frames {
                for i in 0..cin {
                    x[f * ld + i] = bf16_bits(xf[f * cin + i]);
                }
            }
            let bias: Vec<f32> = (0..cout).map(|j| j as f32 * 0.01 - 0.3).collect();
            let mut out = vec![0.5f32; tout * cout + 3];
            conv.forward(&x, tout, stride, dil, Some(&bias), false, &mut out);
            let mut acc = out.clone();
            conv.forward(&x, tout, stride, dil, Some(&bias), true, &mut acc);
            for r in 0..tout {
                for o in 0..cout {
                    let mut want = bias[o] as f64;
                    let mut scale = 0f64;
                    for kk in 0..k {
                        for i in 0..cin {
                            let p = bf(w[(o * cin + i) * k + kk]) * bf(xf[(r * stride + kk * dil) * cin + i]);
                            want += p;
                            scale += p.abs();
                        }
                    }
                    let got = out[r * cout + o] as f64;
                    assert!((got - want).abs() <= 1e-5 * scale + 1e-6, "{cout}x{cin}x{k} ({r},{o}): {got} vs {want}");
                    assert!((acc[r * cout + o] as f64 - 2.0 * got).abs() <= 1e-6 * got.abs() + 1e-6);
                }
            }
            assert_eq!(out[tout * cout..], [0.5; 3], "wrote past the output");
        }
    }
}
