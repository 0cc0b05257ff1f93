//! A sequence's keys and values as bytes, to be written out and read back into a cache of
//! the same shape (a saved conversation, llama-server's slot save and restore).
//!
//! The bytes are, for each layer in order, each of its buffers (f16: keys, then values;
//! 8-bit: keys, values, key scales, value scales), the sequence's blocks in order, each block
//! as the cache lays it out (module docs of [`crate::kv`]), little-endian. Only a cache with the
//! same layers, width, block size and storage type reads them back
//! ([`KvCache::seq_bytes`] is their size); naming the model they belong to is up to the
//! caller.

use super::host::Store;
use super::{KvCache, KvStorage, SeqId, Q8_GROUP};
use crate::{Error, Result};

/// Append the `n`-value regions of `blocks` of one buffer.
fn put<T: Copy, const B: usize>(out: &mut Vec<u8>, buf: &[T], blocks: &[u32], n: usize, le: fn(T) -> [u8; B]) {
    for &b in blocks {
        let start = b as usize * n;
        for &x in &buf[start..start + n] {
            out.extend_from_slice(&le(x));
        }
    }
}

/// Fill the `n`-value regions of `blocks` of one buffer from `data` (advanced past them).
fn take<T: Copy, const B: usize>(data: &mut &[u8], buf: &mut [T], blocks: &[u32], n: usize, from: fn([u8; B]) -> T) {
    for &b in blocks {
        let start = b as usize * n;
        let (mine, rest) = data.split_at(n * B);
        for (x, c) in buf[start..start + n].iter_mut().zip(mine.chunks_exact(B)) {
            let mut a = [0u8; B];
            a.copy_from_slice(c);
            *x = from(a);
        }
        *data = rest;
    }
}

/// What must match for [`KvCache::import_seq`] to read what [`KvCache::export_seq`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLayout {
    pub layers: usize,
    /// Values per position per layer (KV heads x head dimension).
    pub width: usize,
    pub block_size: usize,
    pub dtype: super::KvDtype,
}

impl std::fmt::Display for KvLayout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} layers x {} values in {} (blocks of {})", self.layers, self.width, self.dtype, self.block_size)
    }
}

/// Saved sequences hold keys and values only, not a hybrid model's recurrent state.
fn no_seq_state(kv: &KvCache) -> Result<()> {
    if kv.has_seq_state() {
        return Err(Error::Config("saving or restoring a hybrid model's sequences (recurrent state) is not supported yet".into()));
    }
    Ok(())
}

impl KvCache {
    /// The cache's shape, as saved sequences are checked against it.
    pub fn layout(&self) -> KvLayout {
        KvLayout { layers: self.store.layers(), width: self.store.width(), block_size: self.book.block_size, dtype: self.dtype() }
    }

    /// Bytes [`export_seq`](Self::export_seq) writes for a sequence of `len` positions
    /// (whole blocks).
    pub fn seq_bytes(&self, len: usize) -> usize {
        len.div_ceil(self.book.block_size) * self.book.block_size * self.store.layers() * self.dtype().bytes_per_position(self.store.width())
    }

    /// The keys and values of sequence `id`'s positions (layout in the module docs).
    pub fn export_seq(&self, id: SeqId) -> Result<Vec<u8>> {
        no_seq_state(self)?;
        let s = self.book.seq(id)?;
        let blocks = &s.blocks[..s.len.div_ceil(self.book.block_size)];
        let n = self.book.block_size * self.store.width();
        let mut out = Vec::with_capacity(self.seq_bytes(s.len));
        for li in 0..self.store.layers() {
            match &self.store.store {
                Store::F16 { k, v } => {
                    put(&mut out, &k[li], blocks, n, u16::to_le_bytes);
                    put(&mut out, &v[li], blocks, n, u16::to_le_bytes);
                }
                Store::Q8 { k, v, ks, vs } => {
                    put(&mut out, &k[li], blocks, n, u8::to_le_bytes);
                    put(&mut out, &v[li], blocks, n, i8::to_le_bytes);
                    put(&mut out, &ks[li], blocks, n / Q8_GROUP, u16::to_le_bytes);
                    put(&mut out, &vs[li], blocks, n / Q8_GROUP, u16::to_le_bytes);
                }
            }
        }
        Ok(out)
    }

    /// Fill the empty sequence `id` with `len` positions from `data`, what
    /// [`export_seq`](Self::export_seq) wrote for `len` positions in a cache of the same
    /// shape. Fails, taking nothing, when `data` is not exactly that size or the pool lacks
    /// the blocks.
    pub fn import_seq(&mut self, id: SeqId, len: usize, data: &[u8]) -> Result<()> {
        no_seq_state(self)?;
        if self.book.seq(id)?.len != 0 {
            return Err(Error::Internal("import_seq into a sequence that holds positions"));
        }
        let want = self.seq_bytes(len);
        if data.len() != want {
            return Err(Error::Config(format!(
                "saved KV state of {} bytes does not fit this cache: {len} positions of {} layers x {} values in {} take {want}",
                data.len(),
                self.store.layers(),
                self.store.width(),
                self.dtype()
            )));
        }
        self.reserve(id, len)?;
        let blocks: Vec<u32> = self.book.seq(id)?.blocks[..len.div_ceil(self.book.block_size)].to_vec();
        let n = self.book.block_size * self.store.width();
        let mut rest = data;
        for li in 0..self.store.layers() {
            match &mut self.store.store {
                Store::F16 { k, v } => {
                    take(&mut rest, &mut k[li], &blocks, n, u16::from_le_bytes);
                    take(&mut rest, &mut v[li], &blocks, n, u16::from_le_bytes);
                }
                Store::Q8 { k, v, ks, vs } => {
                    take(&mut rest, &mut k[li], &blocks, n, u8::from_le_bytes);
                    take(&mut rest, &mut v[li], &blocks, n, i8::from_le_bytes);
                    take(&mut rest, &mut ks[li], &blocks, n / Q8_GROUP, u16::from_le_bytes);
                    take(&mut rest, &mut vs[li], &blocks, n / Q8_GROUP, u16::from_le_bytes);
                }
            }
        }
        self.set_len(id, len)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{KvBudget, KvDtype, KvLayer, KvLayerMut, KvOptions};
    use super::*;

    const W: usize = 32;

    fn cache(blocks: usize, dtype: KvDtype) -> KvCache {
        KvCache::new(3, W, KvOptions { block_size: 4, budget: KvBudget::Tokens(blocks * 4), dtype }).unwrap()
    }

    /// A value for (layer, position, component, buffer) that differs everywhere.
    fn val(li: usize, pos: usize, j: usize, which: usize) -> u16 {
        (li * 7919 + pos * 131 + j * 3 + which) as u16
    }

    /// Every position's keys, values (and scales) of `id`, layer by layer.
    fn contents(c: &KvCache, id: SeqId) -> Vec<Vec<u16>> {
        let blocks = c.blocks(id).unwrap().to_vec();
        let mut out = Vec::new();
        for li in 0..3 {
            for pos in 0..c.len(id).unwrap() {
                let slot = c.slot(&blocks, pos);
                let r = slot * W..(slot + 1) * W;
                out.push(match c.layer(li) {
                    KvLayer::F16 { k, v } => k[r.clone()].iter().chain(&v[r]).copied().collect(),
                    KvLayer::Q8 { k, v, ks, vs } => {
                        let mut p: Vec<u16> = k[r.clone()].iter().map(|&x| x as u16).chain(v[r].iter().map(|&x| x as u8 as u16)).collect();
                        p.extend([ks[slot], vs[slot]]);
                        p
                    }
                });
            }
        }
        out
    }

    fn fill(c: &mut KvCache, id: SeqId, len: usize) {
        c.reserve(id, len).unwrap();
        let blocks = c.blocks(id).unwrap().to_vec();
        for pos in 0..len {
            let slot = c.slot(&blocks, pos);
            for li in 0..3 {
                match c.layer_mut(li) {
                    KvLayerMut::F16 { k, v } => {
                        for j in 0..W {
                            k[slot * W + j] = val(li, pos, j, 0);
                            v[slot * W + j] = val(li, pos, j, 1);
                        }
                    }
                    KvLayerMut::Q8 { k, v, ks, vs } => {
                        for j in 0..W {
                            k[slot * W + j] = val(li, pos, j, 0) as u8;
                            v[slot * W + j] = val(li, pos, j, 1) as u8 as i8;
                        }
                        ks[slot] = val(li, pos, 0, 2);
                        vs[slot] = val(li, pos, 0, 3);
                    }
                }
            }
        }
        c.set_len(id, len).unwrap();
    }

    #[test]
    fn a_sequence_comes_back_position_for_position() {
        for dtype in [KvDtype::F16, KvDtype::Q8_0] {
            let mut a = cache(8, dtype);
            // Another sequence first, so the saved one's blocks are not the first ones.
            let other = a.new_seq();
            fill(&mut a, other, 5);
            let id = a.new_seq();
            fill(&mut a, id, 10);
            let bytes = a.export_seq(id).unwrap();
            assert_eq!(bytes.len(), a.seq_bytes(10));
            assert_eq!(bytes.len(), 12 * 3 * dtype.bytes_per_position(W), "three whole blocks of four");

            let mut b = cache(8, dtype);
            let id2 = b.new_seq();
            b.import_seq(id2, 10, &bytes).unwrap();
            assert_eq!(b.len(id2).unwrap(), 10);
            assert_eq!(contents(&b, id2), contents(&a, id), "{dtype}");
            // The restored sequence grows as any other.
            b.reserve(id2, 3).unwrap();
        }
    }

    #[test]
    fn bytes_of_another_shape_are_refused() {
        let mut a = cache(8, KvDtype::F16);
        let id = a.new_seq();
        fill(&mut a, id, 6);
        let bytes = a.export_seq(id).unwrap();
        let mut b = cache(8, KvDtype::Q8_0);
        let id2 = b.new_seq();
        let e = b.import_seq(id2, 6, &bytes).unwrap_err().to_string();
        assert!(e.contains("does not fit this cache") && e.contains("q8_0"), "{e}");
        assert_eq!(b.len(id2).unwrap(), 0, "nothing taken");
        let mut c = cache(8, KvDtype::F16);
        let id3 = c.new_seq();
        assert!(c.import_seq(id3, 6, &bytes[..bytes.len() - 1]).is_err(), "truncated");
        assert!(c.import_seq(id3, 9, &bytes).is_err(), "another length");
        // A pool too small for the sequence: KvFull, nothing taken.
        let mut d = cache(1, KvDtype::F16);
        let id4 = d.new_seq();
        assert!(matches!(d.import_seq(id4, 6, &bytes), Err(Error::KvFull { .. })));
        assert_eq!(d.available_blocks(), 1);
    }
}
