//! Block formats and portable (scalar) kernels.
//!
//! Weights stay in the GGML block layouts they are stored in (byte slices, read unaligned).
//! Activations are quantized per row to 8 bits as llama.cpp does: 32-element blocks
//! ([`BlockQ8`], scale rounded to f16 precision like GGML's `block_q8_0`/`block_q8_1`) for the
//! 32-element weight formats, 256-element blocks ([`BlockQ8K`]) for the k-quants. A dot
//! product is then an integer sum per block, scaled once.

// The reference dot products and dequantizers follow GGML's C code index for index (`qs[j]`
// beside `ba.qs[j + 16]`), which iterators would obscure.
#![allow(clippy::needless_range_loop)]

use half::f16;

/// A weight format the kernels handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QType {
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4K,
    Q5K,
    Q6K,
}

impl QType {
    /// Elements per block.
    pub const fn block_len(self) -> usize {
        match self {
            QType::Q4_0 | QType::Q4_1 | QType::Q5_0 | QType::Q5_1 | QType::Q8_0 => 32,
            QType::Q4K | QType::Q5K | QType::Q6K => 256,
        }
    }
    /// Bytes per block.
    pub const fn block_bytes(self) -> usize {
        match self {
            QType::Q4_0 => 18,
            QType::Q4_1 => 20,
            QType::Q5_0 => 22,
            QType::Q5_1 => 24,
            QType::Q8_0 => 34,
            QType::Q4K => 144,
            QType::Q5K => 176,
            QType::Q6K => 210,
        }
    }
    /// Whether activations use [`BlockQ8K`] (else [`BlockQ8`]).
    pub const fn k_quant(self) -> bool {
        matches!(self, QType::Q4K | QType::Q5K | QType::Q6K)
    }
}

/// An activation block of 32 values: `x ≈ d * qs`, `s = d * sum(qs)`.
#[derive(Debug, Clone, Copy)]
#[repr(C, align(8))]
pub struct BlockQ8 {
    pub d: f32,
    pub s: f32,
    pub qs: [i8; 32],
}

impl Default for BlockQ8 {
    fn default() -> Self {
        Self { d: 0.0, s: 0.0, qs: [0; 32] }
    }
}

/// An activation block of 256 values: `x ≈ d * qs`, `bsums[i]` = sum of `qs[16i..16i+16]`.
#[derive(Debug, Clone, Copy)]
#[repr(C, align(8))]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; 256],
    pub bsums: [i16; 16],
}

impl Default for BlockQ8K {
    fn default() -> Self {
        Self { d: 0.0, qs: [0; 256], bsums: [0; 16] }
    }
}

#[inline(always)]
pub(crate) fn f16_at(b: &[u8], off: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[off], b[off + 1]])).to_f32()
}

#[inline(always)]
fn round_f16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

/// Quantize `x` (a multiple of 32 long) into 32-element blocks.
pub fn quantize_q8(x: &[f32], out: &mut [BlockQ8]) {
    debug_assert_eq!(x.len(), out.len() * 32);
    for (chunk, b) in x.chunks_exact(32).zip(out.iter_mut()) {
        let amax = chunk.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut sum = 0i32;
        for (q, &v) in b.qs.iter_mut().zip(chunk) {
            let r = (v * id).round() as i32;
            *q = r as i8;
            sum += r;
        }
        b.d = round_f16(d);
        b.s = round_f16(sum as f32 * d);
    }
}

/// Quantize `x` (a multiple of 256 long) into 256-element blocks (GGML's `block_q8_K`).
pub fn quantize_q8k(x: &[f32], out: &mut [BlockQ8K]) {
    debug_assert_eq!(x.len(), out.len() * 256);
    for (chunk, b) in x.chunks_exact(256).zip(out.iter_mut()) {
        let mut amax = 0f32;
        let mut max = 0f32;
        for &v in chunk {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            *b = BlockQ8K::default();
            continue;
        }
        let iscale = -128.0 / max;
        for (q, &v) in b.qs.iter_mut().zip(chunk) {
            let r = (iscale * v).round() as i32;
            *q = r.min(127) as i8;
        }
        for (s, q) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
            *s = q.iter().map(|&v| v as i16).sum();
        }
        b.d = 1.0 / iscale;
    }
}

// ---- scalar dot products: one weight row (bytes) against one quantized activation row ----

pub fn dot_q4_0(w: &[u8], a: &[BlockQ8]) -> f32 {
    let mut acc = 0f32;
    for (bw, ba) in w.chunks_exact(18).zip(a) {
        let d = f16_at(bw, 0);
        let qs = &bw[2..18];
        let mut s = 0i32;
        for j in 0..16 {
            let lo = (qs[j] & 0x0f) as i32 - 8;
            let hi = (qs[j] >> 4) as i32 - 8;
            s += lo * ba.qs[j] as i32 + hi * ba.qs[j + 16] as i32;
        }
        acc += d * ba.d * s as f32;
    }
    acc
}

pub fn dot_q4_1(w: &[u8], a: &[BlockQ8]) -> f32 {
    let mut acc = 0f32;
    for (bw, ba) in w.chunks_exact(20).zip(a) {
        let d = f16_at(bw, 0);
        let m = f16_at(bw, 2);
        let qs = &bw[4..20];
        let mut s = 0i32;
        for j in 0..16 {
            s += (qs[j] & 0x0f) as i32 * ba.qs[j] as i32 + (qs[j] >> 4) as i32 * ba.qs[j + 16] as i32;
        }
        acc += d * ba.d * s as f32 + m * ba.s;
    }
    acc
}

pub fn dot_q5_0(w: &[u8], a: &[BlockQ8]) -> f32 {
    let mut acc = 0f32;
    for (bw, ba) in w.chunks_exact(22).zip(a) {
        let d = f16_at(bw, 0);
        let qh = u32::from_le_bytes([bw[2], bw[3], bw[4], bw[5]]);
        let qs = &bw[6..22];
        let mut s = 0i32;
        for j in 0..16 {
            let h0 = ((qh >> j) & 1) << 4;
            let h1 = ((qh >> (j + 16)) & 1) << 4;
            let lo = ((qs[j] & 0x0f) as u32 | h0) as i32 - 16;
            let hi = ((qs[j] >> 4) as u32 | h1) as i32 - 16;
            s += lo * ba.qs[j] as i32 + hi * ba.qs[j + 16] as i32;
        }
        acc += d * ba.d * s as f32;
    }
    acc
}

pub fn dot_q5_1(w: &[u8], a: &[BlockQ8]) -> f32 {
    let mut acc = 0f32;
    for (bw, ba) in w.chunks_exact(24).zip(a) {
        let d = f16_at(bw, 0);
        let m = f16_at(bw, 2);
        let qh = u32::from_le_bytes([bw[4], bw[5], bw[6], bw[7]]);
        let qs = &bw[8..24];
        let mut s = 0i32;
        for j in 0..16 {
            let h0 = ((qh >> j) & 1) << 4;
            let h1 = ((qh >> (j + 16)) & 1) << 4;
            let lo = ((qs[j] & 0x0f) as u32 | h0) as i32;
            let hi = ((qs[j] >> 4) as u32 | h1) as i32;
            s += lo * ba.qs[j] as i32 + hi * ba.qs[j + 16] as i32;
        }
        acc += d * ba.d * s as f32 + m * ba.s;
    }
    acc
}

pub fn dot_q8_0(w: &[u8], a: &[BlockQ8]) -> f32 {
    let mut acc = 0f32;
    for (bw, ba) in w.chunks_exact(34).zip(a) {
        let d = f16_at(bw, 0);
        let mut s = 0i32;
        for j in 0..32 {
            s += bw[2 + j] as i8 as i32 * ba.qs[j] as i32;
        }
        acc += d * ba.d * s as f32;
    }
    acc
}

/// The 6-bit scales and mins of a Q4_K/Q5_K block (GGML's `get_scale_min_k4`).
#[inline(always)]
pub(crate) fn scales_mins_k4(q: &[u8]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    for j in 0..8 {
        if j < 4 {
            sc[j] = q[j] & 63;
            mn[j] = q[j + 4] & 63;
        } else {
            sc[j] = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
            mn[j] = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
        }
    }
    (sc, mn)
}

pub fn dot_q4k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    dot_k4(w, a, false)
}

pub fn dot_q5k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    dot_k4(w, a, true)
}

/// Q4_K, or Q5_K (`high`: a 32-byte plane of fifth bits before the nibbles).
fn dot_k4(w: &[u8], a: &[BlockQ8K], high: bool) -> f32 {
    let bytes = if high { 176 } else { 144 };
    let mut acc = 0f32;
    for (bw, ba) in w.chunks_exact(bytes).zip(a) {
        let d = f16_at(bw, 0) * ba.d;
        let dmin = f16_at(bw, 2) * ba.d;
        let (sc, mn) = scales_mins_k4(&bw[4..16]);
        let (qh, qs) = if high { (Some(&bw[16..48]), &bw[48..176]) } else { (None, &bw[16..144]) };
        let mut sumi = 0i32;
        let mut summ = 0i32;
        for c in 0..4 {
            let q = &qs[32 * c..32 * c + 32];
            let (mut s0, mut s1) = (0i32, 0i32);
            for l in 0..32 {
                let (h0, h1) = match qh {
                    Some(qh) => (((qh[l] >> (2 * c)) & 1) << 4, ((qh[l] >> (2 * c + 1)) & 1) << 4),
                    None => (0, 0),
                };
                s0 += ((q[l] & 0x0f) | h0) as i32 * ba.qs[64 * c + l] as i32;
                s1 += ((q[l] >> 4) | h1) as i32 * ba.qs[64 * c + 32 + l] as i32;
            }
            sumi += sc[2 * c] as i32 * s0 + sc[2 * c + 1] as i32 * s1;
            let b0 = ba.bsums[4 * c] as i32 + ba.bsums[4 * c + 1] as i32;
            let b1 = ba.bsums[4 * c + 2] as i32 + ba.bsums[4 * c + 3] as i32;
            summ += mn[2 * c] as i32 * b0 + mn[2 * c + 1] as i32 * b1;
        }
        acc += d * sumi as f32 - dmin * summ as f32;
    }
    acc
}

pub fn dot_q6k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let mut acc = 0f32;
    for (bw, ba) in w.chunks_exact(210).zip(a) {
        let ql = &bw[0..128];
        let qh = &bw[128..192];
        let sc = &bw[192..208];
        let d = f16_at(bw, 208) * ba.d;
        let mut sumi = 0i32;
        for half in 0..2 {
            let ql = &ql[64 * half..];
            let qh = &qh[32 * half..];
            let q8 = &ba.qs[128 * half..];
            let sc = &sc[8 * half..];
            let mut s = [0i32; 8];
            for l in 0..32 {
                let is = l / 16;
                let q1 = ((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) as i32 - 32;
                let q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                s[is] += q1 * q8[l] as i32;
                s[is + 2] += q2 * q8[l + 32] as i32;
                s[is + 4] += q3 * q8[l + 64] as i32;
                s[is + 6] += q4 * q8[l + 96] as i32;
            }
            for k in 0..8 {
                sumi += sc[k] as i8 as i32 * s[k];
            }
        }
        acc += d * sumi as f32;
    }
    acc
}

/// Dequantize one row of `t` blocks (portable; used by tests and as a reference).
pub fn dequantize_row(t: QType, w: &[u8], out: &mut [f32]) {
    let bl = t.block_len();
    for (bw, y) in w.chunks_exact(t.block_bytes()).zip(out.chunks_exact_mut(bl)) {
        match t {
            QType::Q4_0 => {
                let d = f16_at(bw, 0);
                for j in 0..16 {
                    y[j] = ((bw[2 + j] & 0x0f) as i32 - 8) as f32 * d;
                    y[j + 16] = ((bw[2 + j] >> 4) as i32 - 8) as f32 * d;
                }
            }
            QType::Q4_1 => {
                let (d, m) = (f16_at(bw, 0), f16_at(bw, 2));
                for j in 0..16 {
                    y[j] = (bw[4 + j] & 0x0f) as f32 * d + m;
                    y[j + 16] = (bw[4 + j] >> 4) as f32 * d + m;
                }
            }
            QType::Q5_0 | QType::Q5_1 => {
                let (d, m, qh, qs) = if t == QType::Q5_0 {
                    (f16_at(bw, 0), None, u32::from_le_bytes([bw[2], bw[3], bw[4], bw[5]]), &bw[6..22])
                } else {
                    (f16_at(bw, 0), Some(f16_at(bw, 2)), u32::from_le_bytes([bw[4], bw[5], bw[6], bw[7]]), &bw[8..24])
                };
                for j in 0..16 {
                    let lo = ((qs[j] & 0x0f) as u32 | (((qh >> j) & 1) << 4)) as i32;
                    let hi = ((qs[j] >> 4) as u32 | (((qh >> (j + 16)) & 1) << 4)) as i32;
                    match m {
                        None => {
                            y[j] = (lo - 16) as f32 * d;
                            y[j + 16] = (hi - 16) as f32 * d;
                        }
                        Some(m) => {
                            y[j] = lo as f32 * d + m;
                            y[j + 16] = hi as f32 * d + m;
                        }
                    }
                }
            }
            QType::Q8_0 => {
                let d = f16_at(bw, 0);
                for j in 0..32 {
                    y[j] = bw[2 + j] as i8 as f32 * d;
                }
            }
            QType::Q4K | QType::Q5K => {
                let (d, dmin) = (f16_at(bw, 0), f16_at(bw, 2));
                let (sc, mn) = scales_mins_k4(&bw[4..16]);
                let (qh, qs) = if t == QType::Q4K { (None, &bw[16..144]) } else { (Some(&bw[16..48]), &bw[48..176]) };
                for c in 0..4 {
                    let (d0, m0) = (d * sc[2 * c] as f32, dmin * mn[2 * c] as f32);
                    let (d1, m1) = (d * sc[2 * c + 1] as f32, dmin * mn[2 * c + 1] as f32);
                    for l in 0..32 {
                        let q = qs[32 * c + l];
                        let (h0, h1) = match qh {
                            Some(qh) => (((qh[l] >> (2 * c)) & 1) << 4, ((qh[l] >> (2 * c + 1)) & 1) << 4),
                            None => (0, 0),
                        };
                        y[64 * c + l] = d0 * ((q & 0x0f) | h0) as f32 - m0;
                        y[64 * c + 32 + l] = d1 * ((q >> 4) | h1) as f32 - m1;
                    }
                }
            }
            QType::Q6K => {
                let d = f16_at(bw, 208);
                for half in 0..2 {
                    let ql = &bw[64 * half..];
                    let qh = &bw[128 + 32 * half..];
                    let sc = &bw[192 + 8 * half..];
                    let y = &mut y[128 * half..];
                    for l in 0..32 {
                        let is = l / 16;
                        let q1 = ((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) as i32 - 32;
                        let q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                        let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                        let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                        y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
                        y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
                        y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
                        y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
                    }
                }
            }
        }
    }
}
