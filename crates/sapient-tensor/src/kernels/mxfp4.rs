//! MXFP4 (OCP microscaling FP4), gpt-oss's expert weights: blocks of 32 E2M1 values sharing
//! an E8M0 scale, as ggml stores them (`block_mxfp4`: the scale byte, then 16 bytes whose low
//! nibbles hold values 0..16 and high nibbles values 16..32).
//!
//! Products follow ggml's arithmetic bit for bit (`ggml_vec_dot_mxfp4_q8_0_generic`): the
//! activations in Q8_0 blocks ([`quantize_q8`]), per block the integer sum of the doubled
//! E2M1 values times the 8-bit activations, scaled by the activation scale times half the
//! E8M0 scale, the blocks added in order. Each output is computed by the same function
//! whatever the number of rows, so rows do not depend on the batch.

use super::quant::{quantize_q8, BlockQ8};
use super::{for_row_chunks, SendPtr};
use crate::{Error, Result};

/// Bytes of one block of 32 values.
pub const MXFP4_BLOCK_BYTES: usize = 17;

/// E2M1 values doubled (ggml's `kvalues_mxfp4`); the scale is halved to match.
const KVALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

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

/// An MXFP4 `[rows, cols]` weight matrix in ggml's block layout, row-major.
#[derive(Clone)]
pub struct Mxfp4Matrix {
    rows: usize,
    cols: usize,
    bytes: Vec<u8>,
}

impl std::fmt::Debug for Mxfp4Matrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mxfp4Matrix").field("rows", &self.rows).field("cols", &self.cols).finish()
    }
}

impl Mxfp4Matrix {
    /// A matrix from ggml's blocks (`rows * cols / 32 * 17` bytes).
    pub fn from_bytes(rows: usize, cols: usize, bytes: Vec<u8>) -> Result<Self> {
        if !cols.is_multiple_of(32) {
            return Err(Error::Candle(candle_core::Error::Msg(format!("MXFP4 matrix: {cols} columns is not a multiple of 32"))));
        }
        let want = rows * cols / 32 * MXFP4_BLOCK_BYTES;
        if bytes.len() != want {
            return Err(Error::Candle(candle_core::Error::Msg(format!("MXFP4 [{rows}, {cols}] needs {want} bytes, got {}", bytes.len()))));
        }
        Ok(Self { rows, cols, bytes })
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

    /// Dequantize row `r` into `out` (`cols` long).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        dequantize_mxfp4(self.row(r), out);
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
}
