//! The packed layout of the lane kernels ([`Packed`]): per group of sixteen weight rows,
//! pairs of blocks in the registers' order, all of a model's matrices in one allocation.

use super::*;

/// Where the parts of a 32-value format's block are (raw GGML layout) and where they go in
/// the packed one.
pub(super) struct Layout {
    /// Raw block bytes.
    pub(super) bytes: usize,
    /// Offset of the minimum (formats with one).
    pub(super) m_at: Option<usize>,
    /// Offset of the 32 high bits (5-bit formats).
    pub(super) qh_at: Option<usize>,
    /// Offset and length of the packed values (nibbles: 16 bytes, Q8_0: 32).
    pub(super) qs_at: usize,
    pub(super) qs_len: usize,
    /// XOR applied to the values (Q8_0 stored unsigned for `vpdpbusd`).
    pub(super) flip: u8,
}

impl Layout {
    pub(super) fn of(t: QType) -> Option<Self> {
        let l = |bytes, m_at, qh_at, qs_at, qs_len, flip| Some(Layout { bytes, m_at, qh_at, qs_at, qs_len, flip });
        match t {
            QType::Q4_0 => l(18, None, None, 2, 16, 0),
            QType::Q4_1 => l(20, Some(2), None, 4, 16, 0),
            QType::Q5_0 => l(22, None, Some(2), 6, 16, 0),
            QType::Q5_1 => l(24, Some(2), Some(4), 8, 16, 0),
            QType::Q8_0 => l(34, None, None, 2, 32, 0x80),
            _ => None,
        }
    }
    /// Packed bytes of one block's values, high bits and scales for sixteen rows.
    pub(super) fn parts(&self) -> (usize, usize, usize) {
        (16 * self.qs_len, if self.qh_at.is_some() { 64 } else { 0 }, if self.m_at.is_some() { 64 } else { 32 })
    }
    /// Byte offsets, inside a group, of row `n`'s block `b`: (values register base, high
    /// bits, scale, minimum). Value byte `4k + i` is at `values + 64k + i`.
    pub(super) fn places(&self, gb_pair: usize, n: usize, b: usize) -> (usize, usize, usize, usize) {
        let (qb, qh, sb) = self.parts();
        let pair = (b / 2) * gb_pair;
        let j = b % 2;
        (pair + j * qb + 4 * n, pair + 2 * qb + j * qh + 4 * n, pair + 2 * (qb + qh) + j * sb + 2 * n, pair + 2 * (qb + qh) + j * sb + 32 + 2 * n)
    }
}

/// One 64-byte line, the unit of packed storage (so that registers load aligned).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(super) struct Line([u8; 64]);

/// One allocation holding the packed matrices of a model, its start on a 2 MiB boundary so
/// that Linux can back all of it with huge pages (matrices allocated one by one are mostly
/// smaller than a huge page, each in its own mapping).
pub(super) struct Arena {
    pub(super) lines: Vec<Line>,
    pub(super) first: usize,
}

/// A 32-value weight matrix laid out for the lane kernels: for each group of sixteen rows,
/// pairs of blocks, each pair holding the two blocks' values already in the registers'
/// order (register `k` lane `n`: values `4k..4k + 4` of row `n`; Q8_0 made unsigned), then
/// their high bits (one dword per row), then their scales (and minimums) as sixteen f16. So a
/// block costs a few aligned loads instead of the transposition, gathers and unpacks of the
/// GGML layout, and one activation row runs as fast as the row-at-a-time kernels. The same
/// bytes as the GGML blocks (a pair is a whole number of cache lines; groups round up to
/// sixteen rows and an even number of blocks).
pub struct Packed {
    pub(super) qtype: QType,
    pub(super) cols: usize,
    pub(super) group_bytes: usize,
    pub(super) arena: std::sync::Arc<Arena>,
    /// Byte range in the arena (from its aligned start).
    pub(super) at: usize,
    pub(super) len: usize,
}

/// Packed bytes of `rows` rows of format `t` (`None`: not a lane format, or `cols` not whole
/// blocks).
pub(super) fn packed_len(t: QType, rows: usize, cols: usize) -> Option<(usize, usize)> {
    if t.k_quant() {
        return crate::kernels::lanes_k::packed_len(t, rows, cols);
    }
    let lay = Layout::of(t)?;
    if !cols.is_multiple_of(32) {
        return None;
    }
    let gb = (cols / 32).div_ceil(2) * 32 * lay.bytes;
    Some((gb, rows.div_ceil(16) * gb))
}

impl Packed {
    /// Pack several matrices (format, GGML blocks, rows, columns) into one allocation. `None`
    /// for a matrix the lane kernels do not take (or whose bytes are short).
    pub fn new_all(mats: &[(QType, &[u8], usize, usize)]) -> Vec<Option<Packed>> {
        const HUGE: usize = 2 << 20;
        let sizes: Vec<Option<(usize, usize)>> = mats
            .iter()
            .map(|&(t, raw, rows, cols)| packed_len(t, rows, cols).filter(|_| raw.len() >= rows * cols / t.block_len() * t.block_bytes()))
            .collect();
        let total: usize = sizes.iter().flatten().map(|s| s.1).sum();
        if total == 0 {
            return sizes.iter().map(|_| None).collect();
        }
        let extra = if total >= HUGE { HUGE / 64 } else { 0 };
        let mut lines = vec![Line([0; 64]); total / 64 + extra];
        let first = if extra == 0 { 0 } else { (lines.as_ptr() as usize).next_multiple_of(HUGE).wrapping_sub(lines.as_ptr() as usize) / 64 };
        {
            // SAFETY: `Line` is 64 plain bytes.
            let all = unsafe { std::slice::from_raw_parts_mut(lines.as_mut_ptr() as *mut u8, lines.len() * 64) };
            let mut at = first * 64;
            for (&(t, raw, rows, cols), size) in mats.iter().zip(&sizes) {
                if let Some((gb, len)) = *size {
                    pack_into(t, raw, rows, cols, gb, &mut all[at..at + len]);
                    at += len;
                }
            }
        }
        let arena = std::sync::Arc::new(Arena { lines, first });
        let mut at = 0;
        mats.iter()
            .zip(sizes)
            .map(|(&(t, _, _, cols), size)| {
                size.map(|(gb, len)| {
                    at += len;
                    Packed { qtype: t, cols, group_bytes: gb, arena: arena.clone(), at: at - len, len }
                })
            })
            .collect()
    }

    /// Row `r`'s GGML blocks, as they were packed.
    pub fn unpack_row(&self, r: usize, out: &mut [u8]) {
        let (len, bytes) = (self.qtype.block_len(), self.qtype.block_bytes());
        for (b, blk) in out.chunks_exact_mut(bytes).take(self.cols / len).enumerate() {
            self.unpack_block(r, b, blk);
        }
    }

    /// Block `b` of row `r` in GGML's layout (`out`: the block's bytes).
    pub fn unpack_block(&self, r: usize, b: usize, blk: &mut [u8]) {
        let src = self.bytes();
        let go = (r / 16) * self.group_bytes;
        if self.qtype.k_quant() {
            return crate::kernels::lanes_k::unpack_block(self.qtype, self.cols, &src[go..go + self.group_bytes], r % 16, b, blk);
        }
        let Some(lay) = Layout::of(self.qtype) else { return };
        let (v, h, d, m) = lay.places(32 * lay.bytes, r % 16, b);
        for i in 0..lay.qs_len {
            blk[lay.qs_at + i] = src[go + v + 64 * (i / 4) + i % 4] ^ lay.flip;
        }
        if let Some(at) = lay.qh_at {
            blk[at..at + 4].copy_from_slice(&src[go + h..go + h + 4]);
        }
        blk[..2].copy_from_slice(&src[go + d..go + d + 2]);
        if let Some(at) = lay.m_at {
            blk[at..at + 2].copy_from_slice(&src[go + m..go + m + 2]);
        }
    }

    /// The format of the packed matrix.
    pub fn qtype(&self) -> QType {
        self.qtype
    }

    /// Bytes of one group of sixteen rows.
    pub fn group_bytes(&self) -> usize {
        self.group_bytes
    }

    /// This matrix's packed bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.arena_bytes()[self.at..self.at + self.len]
    }

    /// The whole allocation's bytes (from its aligned start), which the matrices packed
    /// together share.
    pub fn arena_bytes(&self) -> &[u8] {
        let a = &self.arena;
        // SAFETY: `Line` is 64 plain bytes.
        unsafe { std::slice::from_raw_parts(a.lines.as_ptr().add(a.first) as *const u8, (a.lines.len() - a.first) * 64) }
    }
}

/// Pack `rows` rows of GGML blocks (`raw`) into `out` (groups of `gb` bytes, zeroed).
pub(super) fn pack_into(t: QType, raw: &[u8], rows: usize, cols: usize, gb: usize, out: &mut [u8]) {
    if t.k_quant() {
        return crate::kernels::lanes_k::pack_into(t, raw, rows, cols, gb, out);
    }
    let Some(lay) = Layout::of(t) else { return };
    let nb = cols / 32;
    let rb = nb * lay.bytes;
    let pair = 32 * lay.bytes;
    for r in 0..rows {
        let (g, n) = (r / 16, r % 16);
        let go = g * gb;
        for b in 0..nb {
            let blk = &raw[r * rb + b * lay.bytes..r * rb + (b + 1) * lay.bytes];
            let (v, h, d, m) = lay.places(pair, n, b);
            for (i, &q) in blk[lay.qs_at..lay.qs_at + lay.qs_len].iter().enumerate() {
                out[go + v + 64 * (i / 4) + i % 4] = q ^ lay.flip;
            }
            if let Some(at) = lay.qh_at {
                out[go + h..go + h + 4].copy_from_slice(&blk[at..at + 4]);
            }
            out[go + d..go + d + 2].copy_from_slice(&blk[..2]);
            if let Some(at) = lay.m_at {
                out[go + m..go + m + 2].copy_from_slice(&blk[at..at + 2]);
            }
        }
    }
}
