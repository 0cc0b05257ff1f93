//! MXFP4 (OCP microscaling FP4), gpt-oss's expert weights: blocks of 32 E2M1 values sharing
//! an E8M0 scale, as ggml stores them (`block_mxfp4`: the scale byte, then 16 bytes whose low
//! nibbles hold values 0..16 and high nibbles values 16..32).
//!
//! Products follow ggml's arithmetic bit for bit (`ggml_vec_dot_mxfp4_q8_0_generic`): the
//! activations in Q8_0 blocks ([`quantize_q8`]), per block the integer sum of the doubled
//! E2M1 values times the 8-bit activations, scaled by the activation scale times half the
//! E8M0 scale, the blocks added in order. Each output is computed by the same function
//! whatever the number of rows, so rows do not depend on the batch.
//!
//! On x86_64 with AVX2 or AVX-512, and on aarch64 with dotprod, a matrix made from a copy of
//! the blocks is packed sixteen rows at a time at load and multiplied by the kernels of
//! `mxfp4_lanes.rs` and `neon_mxfp4.rs` (the same arithmetic, bit for bit); elsewhere (or
//! with those levels turned off) by the portable loop here. A matrix read in place from a
//! memory-mapped file ([`Mxfp4Matrix::from_mapped`]) keeps ggml's layout: on x86_64 the
//! kernels of `mxfp4_native.rs` transpose eight rows' blocks as they go (the same
//! arithmetic again); elsewhere the portable loop.

use super::quant::{quantize_q8, BlockQ8};
use super::{for_row_chunks, run_chunks, SendPtr};
use crate::{Error, MappedBytes, Result};

/// Bytes of one block of 32 values.
pub const MXFP4_BLOCK_BYTES: usize = 17;

/// E2M1 values doubled (ggml's `kvalues_mxfp4`); the scale is halved to match.
pub(super) const KVALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Half the E8M0 scale `2^(e - 127)`, as ggml's `ggml_e8m0_to_fp32_half` (denormal for
/// `e < 2`).
#[inline]
pub fn e8m0_to_f32_half(e: u8) -> f32 {
    let bits = if e < 2 { 0x0020_0000u32 << e } else { (e as u32 - 1) << 23 };
    f32::from_bits(bits)
}

/// Dequantize whole blocks `w` into `out` (32 values a block).
pub fn dequantize_mxfp4(w: &[u8], out: &mut [f32]) {
    for (b, o) in w.chunks_exact(MXFP4_BLOCK_BYTES).zip(out.chunks_exact_mut(32)) {
        let d = e8m0_to_f32_half(b[0]);
        for (j, &q) in b[1..].iter().enumerate() {
            o[j] = KVALUES[(q & 15) as usize] as f32 * d;
            o[j + 16] = KVALUES[(q >> 4) as usize] as f32 * d;
        }
    }
}

/// The dot product of MXFP4 blocks `w` with Q8_0 activation blocks `a` (ggml's arithmetic).
#[inline]
pub fn dot_mxfp4_q8(w: &[u8], a: &[BlockQ8]) -> f32 {
    let mut sum = 0f32;
    for (b, a) in w.chunks_exact(MXFP4_BLOCK_BYTES).zip(a) {
        let d = a.d * e8m0_to_f32_half(b[0]);
        let (mut lo, mut hi) = (0i32, 0i32);
        for (j, &q) in b[1..].iter().enumerate() {
            lo += a.qs[j] as i32 * KVALUES[(q & 15) as usize] as i32;
            hi += a.qs[j + 16] as i32 * KVALUES[(q >> 4) as usize] as i32;
        }
        sum += d * (lo + hi) as f32;
    }
    sum
}

/// Run `job` on ranges of the groups of sixteen rows of a `rows`-row matrix times `m`
/// activation rows (`work` multiply-adds): one stretch per thread for a decode's few rows
/// (memory bound), eight per thread for more.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn for_groups(rows: usize, m: usize, work: usize, job: &(dyn Fn(std::ops::Range<usize>) + Sync)) {
    let (groups, nth) = (rows.div_ceil(16), super::pool::pool().threads());
    let chunk = if m <= 16 { groups.div_ceil(nth) } else { groups / (nth * 8) }.max(1);
    run_chunks(groups.div_ceil(chunk), work, &|c: usize| job(c * chunk..((c + 1) * chunk).min(groups)));
}

/// Which kernels multiply a matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Level {
    /// The portable loop on ggml's blocks.
    Portable,
    /// AVX2 on packed rows.
    Avx2,
    /// AVX-VNNI on packed rows.
    AvxVnni,
    /// AVX-512 VNNI on packed rows.
    Avx512,
    /// aarch64 `sdot` on packed rows.
    Sdot,
}

impl Level {
    /// The widest level this CPU has and the kernel options allow.
    pub(crate) fn detect() -> Self {
        if super::has_dotprod() {
            Level::Sdot
        } else if super::has_avx512() {
            Level::Avx512
        } else if super::has_vnni() {
            Level::AvxVnni
        } else if super::has_avx2() {
            Level::Avx2
        } else {
            Level::Portable
        }
    }
}

/// An MXFP4 `[rows, cols]` weight matrix: ggml's blocks row-major (`packed` false: the
/// portable level, or blocks read in place from a file), or packed sixteen rows at a time
/// for the SIMD kernels.
#[derive(Clone)]
pub struct Mxfp4Matrix {
    rows: usize,
    cols: usize,
    bytes: MappedBytes,
    level: Level,
    packed: bool,
}

impl std::fmt::Debug for Mxfp4Matrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mxfp4Matrix").field("rows", &self.rows).field("cols", &self.cols).finish()
    }
}

impl Mxfp4Matrix {
    /// A matrix from ggml's blocks (`rows * cols / 32 * 17` bytes).
    pub fn from_bytes(rows: usize, cols: usize, bytes: Vec<u8>) -> Result<Self> {
        Self::with_level(rows, cols, bytes, Level::detect())
    }

    /// A matrix reading ggml's blocks in place from `bytes` (a view of a memory-mapped
    /// file: never copied, never packed).
    pub fn from_mapped(rows: usize, cols: usize, bytes: MappedBytes) -> Result<Self> {
        Self::mapped_with_level(rows, cols, bytes, Level::detect())
    }

    /// As [`Self::from_bytes`], multiplied by the kernels of `level` (which the CPU must have).
    pub(crate) fn with_level(rows: usize, cols: usize, bytes: Vec<u8>, level: Level) -> Result<Self> {
        Self::check(rows, cols, bytes.len())?;
        let (bytes, packed) = match level {
            Level::Portable => (bytes, false),
            _ => (super::mxfp4_lanes::pack(&bytes, rows, cols / 32), true),
        };
        Ok(Self { rows, cols, bytes: MappedBytes::from_vec(bytes), level, packed })
    }

    /// As [`Self::from_mapped`], multiplied by the kernels of `level` (which the CPU must
    /// have; on aarch64 ggml's layout takes the portable loop).
    pub(crate) fn mapped_with_level(rows: usize, cols: usize, bytes: MappedBytes, level: Level) -> Result<Self> {
        Self::check(rows, cols, bytes.len())?;
        let level = if cfg!(target_arch = "x86_64") { level } else { Level::Portable };
        Ok(Self { rows, cols, bytes, level, packed: false })
    }

    fn check(rows: usize, cols: usize, len: usize) -> Result<()> {
        if !cols.is_multiple_of(32) {
            return Err(Error::Candle(candle_core::Error::Msg(format!("MXFP4 matrix: {cols} columns is not a multiple of 32"))));
        }
        let want = rows * cols / 32 * MXFP4_BLOCK_BYTES;
        if len != want {
            return Err(Error::Candle(candle_core::Error::Msg(format!("MXFP4 [{rows}, {cols}] needs {want} bytes, got {len}"))));
        }
        Ok(())
    }

    /// Whether the matrix reads ggml's blocks in place from a file ([`Self::from_mapped`]).
    pub fn is_mapped(&self) -> bool {
        self.bytes.is_mapped()
    }
    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn cols(&self) -> usize {
        self.cols
    }
    fn row(&self, r: usize) -> &[u8] {
        let rb = self.cols / 32 * MXFP4_BLOCK_BYTES;
        &self.bytes[r * rb..(r + 1) * rb]
    }

    /// Row `r` in ggml's blocks (unpacked where the matrix is packed).
    pub fn row_blocks(&self, r: usize) -> std::borrow::Cow<'_, [u8]> {
        if !self.packed {
            return std::borrow::Cow::Borrowed(self.row(r));
        }
        let nb = self.cols / 32;
        let gb = super::mxfp4_lanes::group_bytes(nb);
        let group = &self.bytes[r / 16 * gb..(r / 16 + 1) * gb];
        std::borrow::Cow::Owned((0..nb).flat_map(|b| super::mxfp4_lanes::unpack_block(group, nb, r % 16, b)).collect())
    }

    /// Dequantize row `r` into `out` (`cols` long).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        dequantize_mxfp4(&self.row_blocks(r), out);
    }

    /// `out[i, j] = sum_k x[i, k] * w[j, k]` for `m` rows of `x` (`[m, cols]`); `out` is
    /// `[m, rows]`. Runs on the kernel pool.
    pub fn matmul(&self, x: &[f32], m: usize, out: &mut [f32]) {
        assert_eq!(x.len(), m * self.cols, "Mxfp4Matrix::matmul: x has the wrong length");
        assert_eq!(out.len(), m * self.rows, "Mxfp4Matrix::matmul: out has the wrong length");
        let nb = self.cols / 32;
        let mut acts = vec![BlockQ8::default(); m * nb];
        for (xr, ar) in x.chunks_exact(self.cols).zip(acts.chunks_exact_mut(nb.max(1))) {
            quantize_q8(xr, ar);
        }
        let rows = self.rows;
        let out_ptr = SendPtr(out.as_mut_ptr());
        #[cfg(target_arch = "aarch64")]
        if self.level == Level::Sdot && self.packed {
            for_groups(rows, m, rows * m * self.cols, &|groups| {
                // SAFETY: as below, with dotprod for `Level::Sdot`.
                unsafe { super::neon_mxfp4::run_sdot(&self.bytes, nb, rows, groups, &acts, out_ptr.ptr()) };
            });
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if self.level != Level::Portable {
            use super::{mxfp4_lanes as k, mxfp4_native as n};
            let off = k::offsets(&acts);
            type Kernel = unsafe fn(&[u8], usize, usize, std::ops::Range<usize>, &[BlockQ8], &[i32], *mut f32);
            let kernel: Kernel = match (self.level, self.packed) {
                (Level::Avx512, true) => k::run_avx512,
                (Level::AvxVnni, true) => k::run_avx_vnni,
                (_, true) => k::run_avx2,
                (Level::Avx512, false) => n::run_avx512,
                (Level::AvxVnni, false) => n::run_avx_vnni,
                (_, false) => n::run_avx2,
            };
            for_groups(rows, m, rows * m * self.cols, &|groups| {
                // SAFETY: the CPU has the level's features (`with_level`'s contract); the
                // bytes hold every group of `nb` blocks, packed or `rows` rows of ggml's; `out` is `m * rows` long and
                // each group's rows are written by one thread only.
                unsafe { kernel(&self.bytes, nb, rows, groups, &acts, &off, out_ptr.ptr()) };
            });
            return;
        }
        for_row_chunks(rows, m, rows * m * self.cols, &|range: std::ops::Range<usize>| {
            for r in range {
                let w = self.row(r);
                for i in 0..m {
                    let v = dot_mxfp4_q8(w, &acts[i * nb..(i + 1) * nb]);
                    // SAFETY: `out` is `m * rows` long (checked above) and outlives the call;
                    // each weight row `r` belongs to one chunk, so element (i, r) is written
                    // by one thread only.
                    unsafe { *out_ptr.ptr().add(i * rows + r) = v };
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn splitmix(mut z: u64) -> u64 {
        z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// The blocks and activations of scripts/reference/mxfp4_ggml.c, against ggml's
    /// dequantization, Q8_0 activation scales and dot products on them
    /// (tests/data/mxfp4_ggml.json): bit for bit against its portable dot product, within
    /// 1e-5 of its SIMD one (which adds in another order; measured 1.5e-6).
    #[test]
    fn mxfp4_matches_ggml_bit_for_bit() {
        let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/mxfp4_ggml.json");
        let data: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&file).expect("tests/data/mxfp4_ggml.json")).expect("json");
        let n = |k: &str| data[k].as_u64().expect("count") as usize;
        let (rows, blocks, acts) = (n("rows"), n("blocks"), n("acts"));
        let bits = |k: &str| -> Vec<u32> { data[k].as_array().expect("array").iter().map(|v| v.as_u64().expect("bits") as u32).collect() };
        let cols = blocks * 32;
        let mut w = vec![0u8; rows * blocks * MXFP4_BLOCK_BYTES];
        for r in 0..rows {
            for b in 0..blocks {
                let z = splitmix((1u64 << 32) + (r * blocks + b) as u64);
                let blk = &mut w[(r * blocks + b) * 17..(r * blocks + b + 1) * 17];
                blk[0] = if z % 64 < 3 { (z % 64) as u8 } else { (100 + (z >> 8) % 51) as u8 };
                for j in 0..16 {
                    blk[1 + j] = (splitmix((2u64 << 32) + ((r * blocks + b) * 16 + j) as u64) >> 56) as u8;
                }
            }
        }
        let x: Vec<f32> = (0..acts * cols).map(|i| ((splitmix((3u64 << 32) + i as u64) >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32).collect();
        let m = Mxfp4Matrix::from_bytes(rows, cols, w.clone()).expect("matrix");
        let mut deq = vec![0f32; rows * cols];
        for r in 0..rows {
            m.dequantize_row(r, &mut deq[r * cols..(r + 1) * cols]);
        }
        assert_eq!(deq.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), bits("dequant"), "dequantize_row_mxfp4");
        let mut q = vec![BlockQ8::default(); acts * blocks];
        for (xr, qr) in x.chunks_exact(cols).zip(q.chunks_exact_mut(blocks)) {
            quantize_q8(xr, qr);
        }
        let scales: Vec<u32> = q.iter().map(|b| half::f16::from_f32(b.d).to_bits() as u32).collect();
        assert_eq!(scales, bits("q8_scales"), "quantize_row_q8_0_ref's scales");
        let (generic, simd) = (bits("dot_generic"), bits("dot_simd"));
        let mut out = vec![0f32; acts * rows];
        m.matmul(&x, acts, &mut out);
        for r in 0..rows {
            for a in 0..acts {
                let d = dot_mxfp4_q8(&w[r * blocks * 17..(r + 1) * blocks * 17], &q[a * blocks..(a + 1) * blocks]);
                assert_eq!(d.to_bits(), generic[r * acts + a], "row {r}, activation {a}: {d} vs ggml's {}", f32::from_bits(generic[r * acts + a]));
                assert_eq!(out[a * rows + r].to_bits(), d.to_bits(), "matmul vs dot");
                let s = f32::from_bits(simd[r * acts + a]);
                assert!((d - s).abs() <= 1e-5 * s.abs().max(1.0), "row {r}, activation {a}: {d} vs ggml's SIMD {s}");
            }
        }
    }

    /// The levels this CPU has (the portable loop always).
    fn levels() -> Vec<Level> {
        let mut v = vec![Level::Portable];
        #[cfg(target_arch = "aarch64")]
        if std::arch::is_aarch64_feature_detected!("dotprod") {
            v.push(Level::Sdot);
        }
        #[cfg(target_arch = "x86_64")]
        {
            let f = |x: &str| match x {
                "avx2" => std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma"),
                "avxvnni" => std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") && std::is_x86_feature_detected!("avxvnni"),
                _ => {
                    std::is_x86_feature_detected!("avx512f")
                        && std::is_x86_feature_detected!("avx512bw")
                        && std::is_x86_feature_detected!("avx512vl")
                        && std::is_x86_feature_detected!("avx512vnni")
                }
            };
            for (name, l) in [("avx2", Level::Avx2), ("avxvnni", Level::AvxVnni), ("avx512", Level::Avx512)] {
                if f(name) {
                    v.push(l);
                }
            }
        }
        v
    }

    /// Every level's product equals the portable loop's bit for bit (and so ggml's generic dot
    /// product) on random blocks with every kind of scale (denormal, 1, huge), rows that are
    /// not a multiple of sixteen and every activation count up to past a pass; the packed
    /// rows unpack to the blocks they were made of.
    #[test]
    fn every_level_matches_the_portable_loop() {
        let (rows, nb) = (37, 5);
        let cols = nb * 32;
        let mut w = vec![0u8; rows * nb * MXFP4_BLOCK_BYTES];
        for (i, blk) in w.chunks_exact_mut(MXFP4_BLOCK_BYTES).enumerate() {
            let z = splitmix(7 << 32 | i as u64);
            // Denormal (0, 1), the smallest normals, 2^0, large and the largest scales.
            blk[0] = [0u8, 1, 2, 3, 127, 126, 200, 254, 255][(z % 9) as usize];
            if z.is_multiple_of(5) {
                blk[0] = (z >> 8) as u8;
            }
            for (j, b) in blk[1..].iter_mut().enumerate() {
                *b = (splitmix(8 << 32 | (i * 16 + j) as u64) >> 40) as u8;
            }
        }
        let reference = Mxfp4Matrix::with_level(rows, cols, w.clone(), Level::Portable).expect("matrix");
        for (level, mapped) in levels().into_iter().flat_map(|l| [(l, false), (l, true)]) {
            let mat = if mapped {
                Mxfp4Matrix::mapped_with_level(rows, cols, MappedBytes::from_vec(w.clone()), level).expect("matrix")
            } else {
                Mxfp4Matrix::with_level(rows, cols, w.clone(), level).expect("matrix")
            };
            assert_eq!(mat.packed, !mapped && level != Level::Portable);
            for r in 0..rows {
                assert_eq!(&mat.row_blocks(r)[..], &w[r * nb * 17..(r + 1) * nb * 17], "{level:?} (in place: {mapped}): row {r} unpacked");
            }
            for m in [1usize, 2, 3, 4, 5, 8, 9, 17, 33] {
                // Activations of mixed magnitudes (a few rows all zero).
                let x: Vec<f32> = (0..m * cols)
                    .map(|i| {
                        let z = splitmix(9 << 32 | (m * 1000 + i) as u64);
                        let mag = [0.0f32, 1e-30, 1e-3, 1.0, 1e4][(i / cols + (z % 3) as usize) % 5];
                        ((z >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32 * mag
                    })
                    .collect();
                let (mut got, mut want) = (vec![0f32; m * rows], vec![0f32; m * rows]);
                mat.matmul(&x, m, &mut got);
                reference.matmul(&x, m, &mut want);
                for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                    assert!(g.to_bits() == e.to_bits() || (g.is_nan() && e.is_nan()), "{level:?} (in place: {mapped}), {m} rows: output {i}: {g} vs the portable {e}");
                }
            }
        }
    }
}
