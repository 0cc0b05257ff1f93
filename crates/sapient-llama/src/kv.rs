//! The paged KV cache: a pool of fixed-size blocks shared by many sequences.
//!
//! Every layer's keys and values live in one buffer each, cut into blocks of `block_size`
//! positions, in f16 or, as an option ([`KvDtype::Q8_0`], llama.cpp's `q8_0` cache types),
//! in int8 with one f16 scale per group of 32 components of a head (about half the bytes,
//! so a budget in bytes holds about twice the positions). In f16, values are laid out
//! `[block][position in block][kv head][head dim]`, keys transposed within each block,
//! `[block][kv head][head dim][position in block]`; in 8 bits values the same, with their
//! scales `[slot][group]` beside them, and keys transposed by four components,
//! `[block][kv head][head dim / 4][position in block][4]`, their scales `[block][group][position
//! in block]` (the model writes and reads them; this module only moves whole blocks). A sequence
//! is a list of blocks (its block table) and a length; position `p` of a sequence is slot
//! `blocks[p / block_size] * block_size + p % block_size` of the pool, and the attention
//! kernels walk a sequence block by block (values of consecutive blocks in one go).
//!
//! - Blocks are reference-counted: [`KvCache::fork`] shares a sequence's blocks with a new
//!   one, and a shared block is copied before it is written (copy on write).
//! - **Prefix cache**: a full block can be registered under the hash of its tokens and of
//!   everything before them ([`KvCache::commit`]); a new sequence whose tokens start with
//!   registered blocks takes them ([`KvCache::attach_prefix`]) instead of recomputing them.
//!   A registered block nobody uses stays cached until its room is needed, least recently
//!   used first.
//! - The pool has a fixed number of blocks (the budget, in tokens or bytes). Its memory is
//!   mapped zeroed up front, each layer's keys and values apart ([`ZeroedMap`]), so the
//!   operating system commits pages only as they are written: 2 MiB pages where Linux allows
//!   (fewer TLB misses as decode streams the cache; at least 2 MiB a layer's keys or values
//!   once written), else 4 KiB ones. [`KvCache::reserve`] fails with [`Error::KvFull`]
//!   instead of growing; the engine preempts a sequence then.
//! - **Sequence state** (hybrid models such as Qwen3.5): each sequence also owns a fixed-size
//!   recurrent state for the linear-attention layers (their convolution windows and delta-rule
//!   matrices), made zeroed on its first forward, copied by [`KvCache::fork`], freed with the
//!   sequence, and reset when it is truncated to nothing. Such state cannot roll back to an
//!   earlier position, so truncating a sequence to a shorter non-zero length is an error; the
//!   prefix cache shares blocks only up to a block after which a copy of the state was kept
//!   ([`KvCache::snapshot_state`], `state.rs`).
//!
//! The bookkeeping and the memory are apart: `book.rs` holds the block tables, lengths,
//! reference counts, prefix hashes, eviction and which state snapshots exist, and touches no
//! memory; what the memory must do (copy a block on write, reset, copy or snapshot a state)
//! it queues as effects, which [`KvCache`] hands to its storage, the backend's
//! (`Backend::KvStore`; `host.rs`, host memory, for the CPU). A forward
//! pass takes the two apart: the model plans rows from the book, the backend reads and
//! writes the storage.

use crate::{Error, Result};

mod book;
mod host;
mod saved;
mod state;
pub(crate) use book::{Book, Effect};
pub(crate) use host::{HostKv, KvLayer, KvLayerMut};
pub use saved::KvLayout;

/// How much memory the cache may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvBudget {
    /// Room for this many positions (over all sequences).
    Tokens(usize),
    /// At most this many bytes of keys and values.
    Bytes(usize),
}

/// How the cache stores keys and values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum KvDtype {
    /// f16 (the default): 2 bytes per component.
    #[default]
    F16,
    /// int8 with an f16 scale per group of 32 components of a head (GGML's Q8_0 blocks,
    /// llama.cpp's `-ctk q8_0 -ctv q8_0`): 1.0625 bytes per component. The query is
    /// quantized to int8 for the key scores. Needs a head dimension that is a multiple of 32.
    #[allow(non_camel_case_types)]
    Q8_0,
}

impl KvDtype {
    /// The name as options spell it: `f16` or `q8_0`.
    pub fn name(self) -> &'static str {
        match self {
            Self::F16 => "f16",
            Self::Q8_0 => "q8_0",
        }
    }
    /// Bytes one layer's keys and values take per position, for `width` components each.
    pub fn bytes_per_position(self, width: usize) -> usize {
        match self {
            Self::F16 => 2 * width * 2,
            Self::Q8_0 => 2 * (width + width / Q8_GROUP * 2),
        }
    }
}

impl std::fmt::Display for KvDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for KvDtype {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "f16" => Ok(Self::F16),
            "q8_0" | "q8" => Ok(Self::Q8_0),
            _ => Err(Error::UnknownKvType(s.to_string())),
        }
    }
}

/// Components per scale in the 8-bit cache.
const Q8_GROUP: usize = sapient_tensor::kernels::Q8_GROUP;

/// Shape of a KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvOptions {
    /// Positions per block (a multiple of 16 for [`crate::LlamaModel::new_kv_cache`]).
    pub block_size: usize,
    pub budget: KvBudget,
    /// How keys and values are stored.
    pub dtype: KvDtype,
}

impl Default for KvOptions {
    fn default() -> Self {
        Self { block_size: 32, budget: KvBudget::Tokens(16 * 1024), dtype: KvDtype::F16 }
    }
}

/// The memory behind a [`KvCache`], owned by a backend ([`crate::backend::Backend::KvStore`]):
/// it carries out what the bookkeeping asks ([`Effect`]s) and is read and written by that
/// backend's operations. Host memory for the CPU ([`HostKv`]); a device backend keeps its
/// keys, values and states on the device and takes the same effects.
pub(crate) trait KvStorage {
    /// Do what the bookkeeping asks (copy a block, reset, copy, keep or restore a state).
    fn apply(&mut self, e: Effect);
    fn layers(&self) -> usize;
    /// Values per position per layer (kv heads x head dim) for keys, and for values.
    fn width(&self) -> usize;
    /// Values of recurrent state per sequence (0: none).
    fn state_floats(&self) -> usize;
    fn dtype(&self) -> KvDtype;
}

/// A sequence in a [`KvCache`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(u32);

/// Counters for monitoring.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvUsage {
    pub total_blocks: usize,
    /// Blocks held by at least one sequence (for its positions, or a hybrid model's
    /// recurrent state).
    pub used_blocks: usize,
    /// Blocks held by no sequence but kept for the prefix cache (with a hybrid model's state
    /// snapshots).
    pub cached_blocks: usize,
    pub block_size: usize,
    pub bytes: usize,
    /// Blocks one sequence's recurrent state holds (a hybrid model's; 0 without).
    pub state_blocks: usize,
}

impl KvUsage {
    /// Share of the blocks held by sequences, 0..=1.
    pub fn utilisation(&self) -> f64 {
        self.used_blocks as f64 / self.total_blocks.max(1) as f64
    }
}

/// The paged KV cache of one model (see the module docs): its bookkeeping (`book.rs`) and its
/// memory (`host.rs`, the CPU backend's storage).
pub struct KvCache {
    book: Book,
    store: HostKv,
}

impl KvCache {
    /// A cache for `layers` layers of `width` (= kv heads x head dim) values per position.
    pub fn new(layers: usize, width: usize, opts: KvOptions) -> Result<Self> {
        let bs = opts.block_size;
        if bs == 0 || width == 0 || layers == 0 {
            return Err(Error::Config(format!(
                "KV cache needs a block size, layers and a width (got {bs}, {layers}, {width})"
            )));
        }
        if opts.dtype == KvDtype::Q8_0 && !width.is_multiple_of(Q8_GROUP) {
            return Err(Error::Config(format!("a q8_0 KV cache needs rows in groups of {Q8_GROUP} (got {width} values)")));
        }
        let per_block_bytes = layers * bs * opts.dtype.bytes_per_position(width);
        let blocks = match opts.budget {
            KvBudget::Tokens(t) => t.div_ceil(bs),
            KvBudget::Bytes(b) => b / per_block_bytes,
        };
        if blocks == 0 {
            return Err(Error::Config(format!(
                "the KV budget {:?} holds no block of {bs} positions ({per_block_bytes} bytes)",
                opts.budget
            )));
        }
        if blocks > u32::MAX as usize / 2 {
            return Err(Error::Config(format!("KV budget of {blocks} blocks is too large")));
        }
        Ok(Self { book: Book::new(blocks, bs), store: HostKv::new(layers, width, bs, blocks, opts.dtype)? })
    }

    /// Hand the storage what the bookkeeping asked of it.
    fn sync(&mut self) {
        for e in self.book.take_effects() {
            self.store.apply(e);
        }
    }

    /// The bookkeeping and the storage apart, for a forward pass.
    pub(crate) fn parts(&mut self) -> (&mut Book, &mut HostKv) {
        (&mut self.book, &mut self.store)
    }

    pub fn block_size(&self) -> usize {
        self.book.block_size
    }
    /// How keys and values are stored.
    pub fn dtype(&self) -> KvDtype {
        self.store.dtype()
    }
    pub fn total_blocks(&self) -> usize {
        self.book.total_blocks()
    }
    /// Positions the whole pool holds.
    pub fn capacity_tokens(&self) -> usize {
        self.book.total_blocks() * self.book.block_size
    }
    /// Blocks a new sequence could get now (free, or cached and evictable).
    pub fn available_blocks(&self) -> usize {
        self.book.available_blocks()
    }
    /// Bytes of keys and values one block holds over every layer.
    pub(crate) fn block_bytes(&self) -> usize {
        self.store.layers() * self.book.block_size * self.dtype().bytes_per_position(self.store.width())
    }
    pub fn usage(&self) -> KvUsage {
        let total = self.book.total_blocks();
        KvUsage {
            total_blocks: total,
            used_blocks: self.book.used_blocks(),
            cached_blocks: self.book.cached_blocks(),
            block_size: self.book.block_size,
            bytes: total * self.block_bytes(),
            state_blocks: self.book.state_blocks,
        }
    }
    /// Sequences alive.
    pub fn num_seqs(&self) -> usize {
        self.book.num_seqs()
    }

    /// A new, empty sequence.
    pub fn new_seq(&mut self) -> SeqId {
        self.new_seq_with_capacity(0)
    }

    /// A new, empty sequence whose block table has room for `tokens` positions without
    /// reallocating.
    pub fn new_seq_with_capacity(&mut self, tokens: usize) -> SeqId {
        self.book.new_seq_with_capacity(tokens)
    }

    /// Positions held for `id`.
    pub fn len(&self, id: SeqId) -> Result<usize> {
        self.book.len(id)
    }

    /// The block table of `id` (blocks past its length may be reserved already).
    pub fn blocks(&self, id: SeqId) -> Result<&[u32]> {
        self.book.blocks(id)
    }

    /// The pool slot of position `pos` of a sequence with block table `blocks`.
    #[inline]
    pub fn slot(&self, blocks: &[u32], pos: usize) -> usize {
        self.book.slot(blocks, pos)
    }

    /// A new sequence sharing every block of `id` (copied when either writes into a shared one).
    pub fn fork(&mut self, id: SeqId) -> Result<SeqId> {
        let new = self.book.fork(id);
        self.sync();
        new
    }

    /// Keep the first `len` positions of `id` (speculative rollback, prefix reuse); blocks
    /// past them go back to the pool. With sequence state (a hybrid model), only truncating
    /// to 0 (or to what the sequence holds or more) is possible: anything else is an error
    /// and changes nothing.
    pub fn truncate(&mut self, id: SeqId, len: usize) -> Result<()> {
        let r = self.book.truncate(id, len);
        self.sync();
        r
    }

    /// Free `id` and its blocks (registered ones stay in the prefix cache).
    pub fn free(&mut self, id: SeqId) -> Result<()> {
        let r = self.book.free(id);
        self.sync();
        r
    }

    /// Blocks [`reserve`](Self::reserve) would need to take for `n` more positions of `id`.
    pub fn blocks_needed(&self, id: SeqId, n: usize) -> Result<usize> {
        self.book.blocks_needed(id, n)
    }

    /// Make positions `len..len + n` of `id` writable: take blocks for them, copy shared
    /// blocks that will be written, and drop the prefix-cache entry of a block about to
    /// change. Takes nothing when the pool cannot supply every block.
    pub fn reserve(&mut self, id: SeqId, n: usize) -> Result<()> {
        let r = self.book.reserve(id, n);
        self.sync();
        r
    }

    /// Record that `id` holds its first `len` positions: written by a forward into slots
    /// [`reserve`](Self::reserve) took (a longer length), or fewer than it held
    /// ([`truncate`](Self::truncate)). Reserved blocks past `len` go back to the pool. With
    /// sequence state (a hybrid model), `len` must be what the state has taken in (or 0);
    /// anything else is an error and changes nothing.
    pub fn set_len(&mut self, id: SeqId, len: usize) -> Result<()> {
        let r = self.book.set_len(id, len);
        self.sync();
        r
    }

    /// Give the empty sequence `id` the registered blocks that hold a prefix of `tokens`,
    /// leaving at least one token to compute (its logits are needed). Returns the number of
    /// positions taken. With sequence state (a hybrid), only up to the last block after
    /// which the state was kept, and that state with them (`state.rs`).
    pub fn attach_prefix(&mut self, id: SeqId, tokens: &[u32]) -> Result<usize> {
        if self.book.len(id)? != 0 {
            return Err(Error::Internal("attach_prefix on a sequence that holds positions"));
        }
        let r = if self.book.stateful { self.book.attach_with_state(id, tokens) } else { self.book.attach_blocks(id, tokens) };
        self.sync();
        r
    }

    /// Register the full blocks of `id` under the hashes of `tokens` (the sequence's tokens
    /// so far, at least its length), so later sequences can share them.
    pub fn commit(&mut self, id: SeqId, tokens: &[u32]) -> Result<()> {
        self.book.commit(id, tokens)
    }

    /// Forget every registered block (the prefix cache); sequences keep theirs.
    pub fn clear_prefix_cache(&mut self) {
        self.book.clear_prefix_cache();
        self.sync();
    }

    /// Keys and values of layer `li` (layouts in the module docs).
    #[cfg(test)]
    pub(crate) fn layer(&self, li: usize) -> KvLayer<'_> {
        self.store.layer(li)
    }
    #[cfg(test)]
    pub(crate) fn layer_mut(&mut self, li: usize) -> KvLayerMut<'_> {
        self.store.layer_mut(li)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Positions' values in the tests: 32 per position (one group of the 8-bit cache).
    const W: usize = 32;

    fn cache_of(blocks: usize, dtype: KvDtype) -> KvCache {
        KvCache::new(2, W, KvOptions { block_size: 4, budget: KvBudget::Tokens(blocks * 4), dtype }).unwrap()
    }
    pub(super) fn cache(blocks: usize) -> KvCache {
        cache_of(blocks, KvDtype::F16)
    }

    /// Writes `x` into every key value of a position (and its key scale in the 8-bit
    /// cache), `x + 1` into every value value.
    pub(super) fn write(c: &mut KvCache, id: SeqId, vals: &[u16]) {
        let len = c.len(id).unwrap();
        c.reserve(id, vals.len()).unwrap();
        let blocks = c.blocks(id).unwrap().to_vec();
        for (i, &x) in vals.iter().enumerate() {
            let slot = c.slot(&blocks, len + i);
            for li in 0..2 {
                match c.layer_mut(li) {
                    KvLayerMut::F16 { k, v } => {
                        k[slot * W..(slot + 1) * W].fill(x);
                        v[slot * W..(slot + 1) * W].fill(x + 1);
                    }
                    KvLayerMut::Q8 { k, v, ks, vs } => {
                        k[slot * W..(slot + 1) * W].fill(x as u8);
                        v[slot * W..(slot + 1) * W].fill((x + 1) as i8);
                        ks[slot] = x;
                        vs[slot] = x + 1;
                    }
                }
            }
        }
        c.set_len(id, len + vals.len()).unwrap();
    }

    fn read(c: &KvCache, id: SeqId) -> Vec<u16> {
        let blocks = c.blocks(id).unwrap();
        (0..c.len(id).unwrap())
            .map(|p| {
                let slot = c.slot(blocks, p);
                match c.layer(1) {
                    KvLayer::F16 { k, .. } => k[slot * W],
                    KvLayer::Q8 { k, v, ks, vs } => {
                        // Every part of the position moved together.
                        assert_eq!((ks[slot], vs[slot], v[slot * W + W - 1] as u16), (k[slot * W] as u16, k[slot * W] as u16 + 1, k[slot * W] as u16 + 1));
                        k[slot * W + W - 1] as u16
                    }
                }
            })
            .collect()
    }

    #[test]
    fn grow_truncate_free_return_blocks() {
        let mut c = cache(4);
        let a = c.new_seq();
        write(&mut c, a, &[1, 2, 3, 4, 5, 6]);
        assert_eq!(read(&c, a), [1, 2, 3, 4, 5, 6]);
        assert_eq!(c.usage().used_blocks, 2);
        c.truncate(a, 3).unwrap();
        assert_eq!(c.usage().used_blocks, 1);
        write(&mut c, a, &[9, 9]);
        assert_eq!(read(&c, a), [1, 2, 3, 9, 9]);
        c.free(a).unwrap();
        assert_eq!(c.usage().used_blocks, 0);
        assert_eq!(c.available_blocks(), 4);
        assert!(matches!(c.len(a), Err(Error::UnknownSequence(_))));
    }

    /// The engine's step: reserve, write, then record what the sequence keeps; reserved
    /// blocks past it go back.
    #[test]
    fn set_len_keeps_part_of_a_reserved_step_and_frees_the_rest() {
        let mut c = cache(4);
        let a = c.new_seq();
        write(&mut c, a, &[1, 2, 3]);
        c.reserve(a, 4).unwrap();
        assert_eq!((c.len(a).unwrap(), c.usage().used_blocks), (3, 2));
        // Two of the four rows kept (the newest token and one accepted guess).
        c.set_len(a, 5).unwrap();
        assert_eq!((c.len(a).unwrap(), c.usage().used_blocks), (5, 2));
        c.reserve(a, 2).unwrap();
        c.set_len(a, 4).unwrap();
        assert_eq!((c.len(a).unwrap(), c.usage().used_blocks), (4, 1));
        assert!(matches!(c.set_len(a, 9), Err(Error::Internal(_))));
        assert_eq!(c.len(a).unwrap(), 4);
    }

    #[test]
    fn budget_is_a_hard_limit_and_reserve_takes_nothing_on_failure() {
        let mut c = cache(2);
        let a = c.new_seq();
        write(&mut c, a, &[1, 2, 3, 4, 5]);
        let b = c.new_seq();
        let err = c.reserve(b, 5).unwrap_err();
        assert!(matches!(err, Error::KvFull { needed: 2, available: 0 }), "{err}");
        assert_eq!(c.blocks(b).unwrap().len(), 0);
        // Room in a's second block.
        write(&mut c, a, &[6, 7, 8]);
        assert!(matches!(c.reserve(a, 1), Err(Error::KvFull { .. })));
        assert!(KvCache::new(1, 4, KvOptions { block_size: 4, budget: KvBudget::Bytes(10), dtype: KvDtype::F16 }).err().map(|e| e.to_string()).unwrap_or_default().contains("holds no block"));
    }

    /// The 8-bit cache takes the same block bookkeeping, and about half the bytes.
    #[test]
    fn q8_cache_holds_twice_the_positions_of_a_byte_budget() {
        let opts = |dtype| KvOptions { block_size: 16, budget: KvBudget::Bytes(1 << 20), dtype };
        let f16 = KvCache::new(4, 128, opts(KvDtype::F16)).unwrap();
        let q8 = KvCache::new(4, 128, opts(KvDtype::Q8_0)).unwrap();
        assert_eq!(f16.capacity_tokens(), 512);
        // 1.0625 bytes a value against 2.
        assert_eq!(q8.capacity_tokens(), 960);
        assert!(q8.usage().bytes <= 1 << 20 && q8.usage().bytes > (1 << 20) - 4 * 16 * KvDtype::Q8_0.bytes_per_position(128));
        assert_eq!(q8.dtype(), KvDtype::Q8_0);
        let err = KvCache::new(4, 80, opts(KvDtype::Q8_0)).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("groups of 32"), "{err}");
        assert_eq!("Q8_0".parse::<KvDtype>().unwrap(), KvDtype::Q8_0);
        assert_eq!("f16".parse::<KvDtype>().unwrap(), KvDtype::F16);
        let err = "q4_0".parse::<KvDtype>().unwrap_err().to_string();
        assert!(err.contains("expected f16 or q8_0"), "{err}");
    }

    #[test]
    fn q8_fork_copies_scales_with_the_values() {
        let mut c = cache_of(8, KvDtype::Q8_0);
        let a = c.new_seq();
        write(&mut c, a, &[1, 2, 3, 4, 5, 6]);
        let b = c.fork(a).unwrap();
        write(&mut c, b, &[70, 80]);
        write(&mut c, a, &[7]);
        assert_eq!(read(&c, a), [1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(read(&c, b), [1, 2, 3, 4, 5, 6, 70, 80]);
        assert_ne!(c.blocks(a).unwrap()[1], c.blocks(b).unwrap()[1]);
        c.truncate(b, 5).unwrap();
        write(&mut c, b, &[9]);
        assert_eq!(read(&c, b), [1, 2, 3, 4, 5, 9]);
    }

    #[test]
    fn fork_shares_blocks_and_copies_on_write() {
        let mut c = cache(8);
        let a = c.new_seq();
        write(&mut c, a, &[1, 2, 3, 4, 5, 6]);
        let b = c.fork(a).unwrap();
        assert_eq!(c.usage().used_blocks, 2);
        write(&mut c, b, &[70, 80]);
        write(&mut c, a, &[7]);
        assert_eq!(read(&c, a), [1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(read(&c, b), [1, 2, 3, 4, 5, 6, 70, 80]);
        // The first block stays shared, the second was copied.
        assert_eq!(c.blocks(a).unwrap()[0], c.blocks(b).unwrap()[0]);
        assert_ne!(c.blocks(a).unwrap()[1], c.blocks(b).unwrap()[1]);
        assert_eq!(c.usage().used_blocks, 3);
    }

    #[test]
    fn prefix_cache_reuses_full_blocks_and_evicts_least_recent() {
        let mut c = cache(4);
        let toks: Vec<u32> = (0..10).collect();
        let a = c.new_seq();
        write(&mut c, a, &[10, 11, 12, 13, 14, 15, 16, 17, 18, 19]);
        c.commit(a, &toks).unwrap();
        c.free(a).unwrap();
        assert_eq!(c.usage().cached_blocks, 2);
        // Same first 8 tokens: both full blocks come back; one token must stay to compute.
        let b = c.new_seq();
        let mut other = toks[..8].to_vec();
        other.extend([99, 98]);
        assert_eq!(c.attach_prefix(b, &other).unwrap(), 8);
        assert_eq!(read(&c, b), [10, 11, 12, 13, 14, 15, 16, 17]);
        c.free(b).unwrap();
        // Exactly 8 tokens: only the first block (the last token is recomputed).
        let d = c.new_seq();
        assert_eq!(c.attach_prefix(d, &toks[..8]).unwrap(), 4);
        // A different first block matches nothing, even with the same second block.
        let e = c.new_seq();
        let mut diff = toks.clone();
        diff[0] = 77;
        assert_eq!(c.attach_prefix(e, &diff).unwrap(), 0);
        c.free(d).unwrap();
        c.free(e).unwrap();
        // Filling the pool evicts the cached blocks.
        let f = c.new_seq();
        write(&mut c, f, &[0; 16]);
        assert_eq!(c.usage().cached_blocks, 0);
        let g = c.new_seq();
        assert_eq!(c.attach_prefix(g, &toks).unwrap(), 0);
    }

    #[test]
    fn writing_into_a_registered_block_unregisters_it() {
        let mut c = cache(4);
        let toks: Vec<u32> = (0..8).collect();
        let a = c.new_seq();
        write(&mut c, a, &[1, 2, 3, 4, 5, 6, 7, 8]);
        c.commit(a, &toks).unwrap();
        // Roll back into the second block and write something else.
        c.truncate(a, 6).unwrap();
        write(&mut c, a, &[60, 70]);
        let b = c.new_seq();
        let mut probe = toks.clone();
        probe.push(100);
        // Only the first block still matches.
        assert_eq!(c.attach_prefix(b, &probe).unwrap(), 4);
    }
}
