//! The KV cache's bookkeeping, apart from its memory: block tables and lengths, reference
//! counts, the prefix cache's chain hashes and its eviction, and which recurrent-state
//! snapshots exist. Nothing here touches keys, values or state: what the memory must do (copy
//! a block before it is written, reset or copy a sequence's state, keep or drop a snapshot)
//! is queued as [`Effect`]s that [`super::KvCache`] hands to its storage ([`super::KvStorage`],
//! the backend's). So a device backend keeps this bookkeeping on the host as it is.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::{Hash, Hasher};

use super::SeqId;
use crate::{Error, Result};

/// What the storage must do for the bookkeeping, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Effect {
    /// Copy every layer's keys and values of block `from` into block `to` (copy on write).
    CopyBlock { from: u32, to: u32 },
    /// Sequence `seq`'s recurrent state back to zeros.
    ResetState(u32),
    /// Sequence `seq` is gone: its recurrent state with it.
    FreeState(u32),
    /// Sequence `to` starts with a copy of `from`'s recurrent state (a fork).
    CopyState { from: u32, to: u32 },
    /// Keep a copy of `seq`'s recurrent state under chain hash `hash`.
    SaveSnapshot { seq: u32, hash: u64 },
    /// Sequence `seq`'s recurrent state becomes the snapshot under `hash`.
    RestoreSnapshot { hash: u64, seq: u32 },
    /// The snapshot under `hash` is no longer needed.
    DropSnapshot(u64),
}

#[derive(Debug, Default, Clone)]
pub(super) struct Seq {
    pub(super) blocks: Vec<u32>,
    pub(super) len: usize,
    /// Chain hashes of the first `hashes.len()` full blocks (see [`Book::commit`]).
    pub(super) hashes: Vec<u64>,
    /// Positions the recurrent state has taken in (a hybrid model's; 0 without).
    pub(super) state_len: usize,
    /// Blocks of the pool held for its recurrent state's memory (a hybrid model's: the state
    /// counts against the same budget as keys and values; never written).
    pub(super) charge: Vec<u32>,
}

/// Block tables, reference counts, the prefix cache and the snapshots' records of a pool of
/// `refs.len()` blocks (see the module docs).
pub(crate) struct Book {
    pub(super) block_size: usize,
    refs: Vec<u32>,
    hash: Vec<Option<u64>>,
    /// Blocks with no reference and no hash, popped from the end (low ids first).
    free: Vec<u32>,
    /// Registered full blocks by chain hash.
    by_hash: HashMap<u64, u32>,
    /// Registered blocks nobody holds, by last use.
    lru: BTreeMap<u64, u32>,
    last_use: Vec<u64>,
    tick: u64,
    seqs: Vec<Option<Seq>>,
    spare_ids: Vec<u32>,
    /// Whether sequences carry recurrent state (a hybrid model).
    pub(super) stateful: bool,
    /// Chain hashes with a state snapshot, oldest first (`state.rs`).
    pub(super) snapshots: VecDeque<u64>,
    /// Blocks of the pool one recurrent state takes (its bytes over a block's, rounded up):
    /// every stateful sequence and every snapshot holds that many (`Seq::charge`,
    /// `snapshot_charge`), so the budget covers keys, values and states together.
    pub(super) state_blocks: usize,
    /// The blocks each snapshot holds for its memory.
    snapshot_charge: HashMap<u64, Vec<u32>>,
    effects: Vec<Effect>,
}

impl Book {
    pub(super) fn new(blocks: usize, block_size: usize) -> Self {
        Self {
            block_size,
            refs: vec![0; blocks],
            hash: vec![None; blocks],
            free: (0..blocks as u32).rev().collect(),
            by_hash: HashMap::new(),
            lru: BTreeMap::new(),
            last_use: vec![0; blocks],
            tick: 0,
            seqs: Vec::new(),
            spare_ids: Vec::new(),
            stateful: false,
            snapshots: VecDeque::new(),
            state_blocks: 0,
            snapshot_charge: HashMap::new(),
            effects: Vec::new(),
        }
    }

    /// What the storage must do since the last call, in order.
    pub(super) fn take_effects(&mut self) -> std::vec::Drain<'_, Effect> {
        self.effects.drain(..)
    }

    pub(super) fn total_blocks(&self) -> usize {
        self.refs.len()
    }
    /// Free blocks, and those only the prefix cache holds (cached blocks, snapshots' states).
    pub(super) fn available_blocks(&self) -> usize {
        self.free.len() + self.cached_blocks()
    }
    /// Blocks sequences hold (positions, and their states' memory).
    pub(super) fn used_blocks(&self) -> usize {
        self.refs.iter().filter(|&&r| r > 0).count() - self.snapshot_blocks()
    }
    /// Blocks only the prefix cache holds: registered blocks no sequence holds, and the
    /// memory of the snapshots' states.
    pub(super) fn cached_blocks(&self) -> usize {
        self.lru.len() + self.snapshot_blocks()
    }
    fn snapshot_blocks(&self) -> usize {
        // Every snapshot holds exactly a state's blocks (`save_snapshot`).
        self.snapshot_charge.len() * self.state_blocks
    }
    pub(super) fn num_seqs(&self) -> usize {
        self.seqs.iter().filter(|s| s.is_some()).count()
    }
    pub(super) fn is_registered(&self, h: u64) -> bool {
        self.by_hash.contains_key(&h)
    }

    pub(super) fn seq(&self, id: SeqId) -> Result<&Seq> {
        self.seqs.get(id.0 as usize).and_then(|s| s.as_ref()).ok_or(Error::UnknownSequence(id.0))
    }
    pub(super) fn seq_mut(&mut self, id: SeqId) -> Result<&mut Seq> {
        self.seqs.get_mut(id.0 as usize).and_then(|s| s.as_mut()).ok_or(Error::UnknownSequence(id.0))
    }

    /// Positions held for `id`.
    pub(crate) fn len(&self, id: SeqId) -> Result<usize> {
        Ok(self.seq(id)?.len)
    }

    /// The block table of `id` (blocks past its length may be reserved already).
    pub(crate) fn blocks(&self, id: SeqId) -> Result<&[u32]> {
        Ok(&self.seq(id)?.blocks)
    }

    /// The pool slot of position `pos` of a sequence with block table `blocks`.
    #[inline]
    pub(crate) fn slot(&self, blocks: &[u32], pos: usize) -> usize {
        blocks[pos / self.block_size] as usize * self.block_size + pos % self.block_size
    }

    pub(crate) fn block_size(&self) -> usize {
        self.block_size
    }

    pub(super) fn new_seq_with_capacity(&mut self, tokens: usize) -> SeqId {
        // Its state's blocks from the free ones now; what they lack it takes when it first
        // reserves, after taking a cached prefix (which evicting cached blocks or snapshots
        // for it here could cost).
        let charge = (0..self.state_blocks)
            .map_while(|_| {
                let b = self.free.pop()?;
                self.refs[b as usize] = 1;
                Some(b)
            })
            .collect();
        let seq = Seq { blocks: Vec::with_capacity(tokens.div_ceil(self.block_size)), charge, ..Default::default() };
        match self.spare_ids.pop() {
            Some(id) => {
                self.seqs[id as usize] = Some(seq);
                SeqId(id)
            }
            None => {
                self.seqs.push(Some(seq));
                SeqId(self.seqs.len() as u32 - 1)
            }
        }
    }

    pub(super) fn fork(&mut self, id: SeqId) -> Result<SeqId> {
        let mut s = self.seq(id)?.clone();
        for &b in &s.blocks {
            self.refs[b as usize] += 1;
        }
        let new = self.new_seq_with_capacity(0);
        // The fork's state is its own copy, with its own blocks for it.
        s.charge = std::mem::take(&mut self.seq_mut(new)?.charge);
        *self.seq_mut(new)? = s;
        if self.stateful {
            self.effects.push(Effect::CopyState { from: id.0, to: new.0 });
        }
        Ok(new)
    }

    pub(super) fn truncate(&mut self, id: SeqId, len: usize) -> Result<()> {
        let bs = self.block_size;
        let stateful = self.stateful;
        let s = self.seq_mut(id)?;
        let mut reset = false;
        // Cutting positions the state has not taken in (rejected guesses after a state
        // rollback, `KvCache::rollback_state`) leaves it as it is.
        if stateful && len < s.state_len.max(s.len) && (len == 0 || s.state_len != len) {
            if len > 0 {
                return Err(Error::StateRollback { len, held: s.state_len.max(s.len) });
            }
            s.state_len = 0;
            reset = true;
        }
        s.len = s.len.min(len);
        let keep = s.len.div_ceil(bs);
        let dropped: Vec<u32> = s.blocks.drain(keep.min(s.blocks.len())..).collect();
        s.hashes.truncate(s.len / bs);
        if reset {
            self.effects.push(Effect::ResetState(id.0));
        }
        // Last first: the free list is a stack, so the next sequence gets them back in
        // order, and consecutive slots keep the attention kernels' runs long.
        for b in dropped.into_iter().rev() {
            self.release(b);
        }
        Ok(())
    }

    pub(super) fn free(&mut self, id: SeqId) -> Result<()> {
        self.truncate(id, 0)?;
        for b in std::mem::take(&mut self.seq_mut(id)?.charge) {
            self.release(b);
        }
        self.seqs[id.0 as usize] = None;
        self.spare_ids.push(id.0);
        if self.stateful {
            self.effects.push(Effect::FreeState(id.0));
        }
        Ok(())
    }

    pub(super) fn set_len(&mut self, id: SeqId, len: usize) -> Result<()> {
        let bs = self.block_size;
        let stateful = self.stateful;
        let s = self.seq_mut(id)?;
        if len > s.blocks.len() * bs {
            return Err(Error::Internal("sequence length past its reserved blocks"));
        }
        if stateful && len > 0 && len < s.state_len {
            return Err(Error::StateRollback { len, held: s.state_len });
        }
        s.len = s.len.max(len);
        self.truncate(id, len)
    }

    fn release(&mut self, b: u32) {
        let r = &mut self.refs[b as usize];
        *r = r.saturating_sub(1);
        if *r == 0 {
            if self.hash[b as usize].is_some() {
                self.tick += 1;
                self.last_use[b as usize] = self.tick;
                self.lru.insert(self.tick, b);
            } else {
                self.free.push(b);
            }
        }
    }

    fn unregister(&mut self, b: u32) {
        if let Some(h) = self.hash[b as usize].take() {
            if self.by_hash.get(&h) == Some(&b) {
                self.by_hash.remove(&h);
                self.drop_snapshot(h);
            }
        }
    }

    /// Forget the snapshot under `h`, if there is one (its blocks go back to the pool).
    pub(super) fn drop_snapshot(&mut self, h: u64) {
        if let Some(i) = self.snapshots.iter().position(|&x| x == h) {
            self.snapshots.remove(i);
            self.effects.push(Effect::DropSnapshot(h));
            for b in self.snapshot_charge.remove(&h).unwrap_or_default() {
                self.release(b);
            }
        }
    }

    /// Forget the oldest snapshot; false when there is none.
    fn drop_oldest_snapshot(&mut self) -> bool {
        match self.snapshots.front().copied() {
            Some(h) => {
                self.drop_snapshot(h);
                true
            }
            None => false,
        }
    }

    /// Up to `n` blocks out of the pool for a state's memory (fewer when it has no more).
    fn take_charge(&mut self, n: usize) -> Vec<u32> {
        (0..n).map_while(|_| self.take_block()).collect()
    }

    /// A block with one reference: a free one, else the least recently used cached one, else
    /// one the oldest snapshot gives back.
    fn take_block(&mut self) -> Option<u32> {
        let b = loop {
            if let Some(b) = self.free.pop() {
                break b;
            }
            if let Some((_, b)) = self.lru.pop_first() {
                self.unregister(b);
                break b;
            }
            if !self.drop_oldest_snapshot() {
                return None;
            }
        };
        self.refs[b as usize] = 1;
        Some(b)
    }

    pub(super) fn blocks_needed(&self, id: SeqId, n: usize) -> Result<usize> {
        let s = self.seq(id)?;
        let bs = self.block_size;
        if n == 0 {
            return Ok(0);
        }
        let (first, last) = (s.len / bs, (s.len + n - 1) / bs);
        // What its state's charge still lacks (the pool was short when it was made).
        let mut need = self.state_blocks.saturating_sub(s.charge.len());
        for bi in first..=last {
            match s.blocks.get(bi) {
                None => need += 1,
                Some(&b) if self.refs[b as usize] > 1 => need += 1,
                Some(_) => {}
            }
        }
        Ok(need)
    }

    pub(super) fn reserve(&mut self, id: SeqId, n: usize) -> Result<()> {
        let need = self.blocks_needed(id, n)?;
        if need > self.available_blocks() {
            return Err(Error::KvFull { needed: need, available: self.available_blocks() });
        }
        if n == 0 {
            return Ok(());
        }
        let lacking = self.state_blocks.saturating_sub(self.seq(id)?.charge.len());
        let more = self.take_charge(lacking);
        self.seq_mut(id)?.charge.extend(more);
        let bs = self.block_size;
        let s = self.seq(id)?;
        let (first, last) = (s.len / bs, (s.len + n - 1) / bs);
        for bi in first..=last {
            let cur = self.seq(id)?.blocks.get(bi).copied();
            match cur {
                None => {
                    let b = self.take_block().ok_or(Error::Internal("KV pool ran dry after its check"))?;
                    self.seq_mut(id)?.blocks.push(b);
                }
                Some(b) if self.refs[b as usize] > 1 => {
                    let nb = self.take_block().ok_or(Error::Internal("KV pool ran dry after its check"))?;
                    self.effects.push(Effect::CopyBlock { from: b, to: nb });
                    self.refs[b as usize] -= 1;
                    self.seq_mut(id)?.blocks[bi] = nb;
                }
                Some(b) => self.unregister(b),
            }
        }
        // A block written from here on no longer matches a registered hash.
        let s = self.seq_mut(id)?;
        s.hashes.truncate(s.len / bs);
        Ok(())
    }

    pub(super) fn chain_hash(prev: u64, tokens: &[u32]) -> u64 {
        let mut h = std::hash::DefaultHasher::new();
        prev.hash(&mut h);
        tokens.hash(&mut h);
        h.finish()
    }

    /// Every registered block that holds a prefix of `tokens` (but its last token) into the
    /// empty sequence `id`; the positions taken.
    pub(super) fn attach_blocks(&mut self, id: SeqId, tokens: &[u32]) -> Result<usize> {
        let bs = self.block_size;
        let mut prev = 0u64;
        let mut taken = Vec::new();
        let mut hashes = Vec::new();
        for chunk in tokens[..tokens.len().saturating_sub(1)].chunks_exact(bs) {
            let h = Self::chain_hash(prev, chunk);
            let Some(&b) = self.by_hash.get(&h) else { break };
            if self.refs[b as usize] == 0 {
                self.lru.remove(&self.last_use[b as usize]);
            }
            self.refs[b as usize] += 1;
            taken.push(b);
            hashes.push(h);
            prev = h;
        }
        // The blocks a sequence held before (reserved, empty) go back.
        let old: Vec<u32> = std::mem::take(&mut self.seq_mut(id)?.blocks);
        for b in old {
            self.release(b);
        }
        let n = taken.len() * bs;
        let s = self.seq_mut(id)?;
        s.blocks = taken;
        s.hashes = hashes;
        s.len = n;
        Ok(n)
    }

    pub(super) fn commit(&mut self, id: SeqId, tokens: &[u32]) -> Result<()> {
        let bs = self.block_size;
        let s = self.seq(id)?;
        let full = s.len.min(tokens.len()) / bs;
        let done = s.hashes.len();
        if full <= done {
            return Ok(());
        }
        let mut prev = s.hashes.last().copied().unwrap_or(0);
        let blocks: Vec<u32> = s.blocks[done..full].to_vec();
        let mut new = Vec::with_capacity(full - done);
        for (i, b) in (done..full).zip(blocks) {
            let h = Self::chain_hash(prev, &tokens[i * bs..(i + 1) * bs]);
            if self.hash[b as usize].is_none() && !self.by_hash.contains_key(&h) {
                self.hash[b as usize] = Some(h);
                self.by_hash.insert(h, b);
            }
            new.push(h);
            prev = h;
        }
        self.seq_mut(id)?.hashes.extend(new);
        Ok(())
    }

    pub(super) fn clear_prefix_cache(&mut self) {
        while let Some((_, b)) = self.lru.pop_first() {
            self.unregister(b);
            self.free.push(b);
        }
        for b in 0..self.hash.len() as u32 {
            self.unregister(b);
        }
        for s in self.seqs.iter_mut().flatten() {
            s.hashes.clear();
        }
    }

    /// Record a snapshot of `id`'s state under `h`, with blocks of the pool for its memory
    /// (free ones, else the least recently used cached blocks, else the oldest snapshots');
    /// false, and no snapshot, when even that leaves too few.
    pub(super) fn save_snapshot(&mut self, id: SeqId, h: u64) -> bool {
        if self.available_blocks() < self.state_blocks {
            return false;
        }
        let charge = self.take_charge(self.state_blocks);
        self.snapshot_charge.insert(h, charge);
        self.snapshots.push_back(h);
        self.effects.push(Effect::SaveSnapshot { seq: id.0, hash: h });
        true
    }

    /// `id`'s state becomes the snapshot under `h`, having taken in `len` positions.
    pub(super) fn restore_snapshot(&mut self, id: SeqId, h: u64, len: usize) -> Result<()> {
        self.seq_mut(id)?.state_len = len;
        self.effects.push(Effect::RestoreSnapshot { hash: h, seq: id.0 });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The book asks the storage for a copy only when a shared block is written, for a
    /// state only with sequence state, and for nothing else.
    #[test]
    fn effects_name_what_the_memory_must_do() {
        let mut b = Book::new(4, 4);
        let a = b.new_seq_with_capacity(0);
        b.reserve(a, 6).unwrap();
        b.set_len(a, 6).unwrap();
        let f = b.fork(a).unwrap();
        assert_eq!(b.take_effects().count(), 0);
        b.reserve(f, 1).unwrap();
        let (old, new) = (b.blocks(a).unwrap()[1], b.blocks(f).unwrap()[1]);
        assert_ne!(old, new);
        assert_eq!(b.take_effects().collect::<Vec<_>>(), [Effect::CopyBlock { from: old, to: new }]);
        b.stateful = true;
        let g = b.fork(a).unwrap();
        b.free(g).unwrap();
        let (ga, gg) = (a.0, g.0);
        assert_eq!(b.take_effects().collect::<Vec<_>>(), [Effect::CopyState { from: ga, to: gg }, Effect::ResetState(gg), Effect::FreeState(gg)]);
    }
}
