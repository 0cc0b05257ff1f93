//! Sequence state of hybrid models beside the KV blocks, and its snapshots for the prefix
//! cache.
//!
//! A hybrid's sequence carries one recurrent state (f32, `state_floats` values: every
//! linear-attention layer's convolution window and delta-rule matrices). It cannot be cut
//! back to an earlier position, so the prefix cache keeps copies of it: after a sequence's
//! forward ends exactly at the end of a registered block, [`KvCache::snapshot_state`] stores
//! the state under that block's chain hash, and [`KvCache::attach_prefix`] gives a new
//! sequence the registered blocks up to the last one with a snapshot, and that snapshot as
//! its state (as llama.cpp's hybrid memory and vLLM's prefix caching for Mamba layers keep
//! state at chosen positions). A snapshot goes when its block is unregistered (evicted or
//! written) or when its blocks are wanted: a state, and each snapshot of one, holds blocks of
//! the pool for its memory (its bytes over a block's, never written), so one budget covers
//! keys, values and states; snapshots give theirs back first when a sequence needs room.
//! Which snapshots exist is bookkeeping (`Book`); their values are the storage's (`HostKv`).

use super::book::Book;
use super::{KvCache, KvStorage, SeqId};
use crate::{Error, Result};

impl KvCache {
    /// Give every sequence `floats` values of recurrent state (a hybrid model's cache). Each
    /// sequence's state, and each snapshot of one, holds blocks of the pool for its memory
    /// ([`seq_state_blocks`](Self::seq_state_blocks)), so the budget covers it.
    pub(crate) fn with_seq_state(mut self, floats: usize) -> Self {
        self.book.stateful = floats > 0;
        self.store.set_state_floats(floats);
        let per_block = self.block_bytes().max(1);
        self.book.state_blocks = (floats * std::mem::size_of::<f32>()).div_ceil(per_block);
        self
    }
    /// Blocks of the pool one sequence's recurrent state holds (0 without sequence state):
    /// what a new sequence needs beside the blocks for its positions.
    pub fn seq_state_blocks(&self) -> usize {
        self.book.state_blocks
    }
    /// Whether sequences carry recurrent state (a hybrid model): then they cannot be
    /// truncated to a shorter non-zero length, and the prefix cache shares only blocks after
    /// which the state was kept ([`snapshot_state`](Self::snapshot_state)).
    pub fn has_seq_state(&self) -> bool {
        self.book.stateful
    }
    /// Bytes of recurrent state each sequence holds once it has run (0 without).
    pub fn seq_state_bytes(&self) -> usize {
        self.store.state_floats() * std::mem::size_of::<f32>()
    }
    /// The recurrent state of `id`, zeroed on first use; errors unless it has taken in
    /// exactly `start` positions (a forward that failed part-way leaves it out of step).
    #[cfg(test)]
    pub(crate) fn seq_state_at(&mut self, id: SeqId, start: usize) -> Result<&mut [f32]> {
        self.book.check_state_at(id, start)?;
        Ok(self.store.state_mut(id))
    }
    /// Record that the state of `id` has taken in `len` positions.
    #[cfg(test)]
    pub(crate) fn set_state_len(&mut self, id: SeqId, len: usize) -> Result<()> {
        self.book.set_state_len(id, len)
    }

    /// Roll `id`'s recurrent state back to where it stood after `len` positions: possible
    /// when its last forward kept the state after each of its rows (a speculative
    /// verification step: [`LlamaModel::set_keep_row_states`](crate::LlamaModel::set_keep_row_states)
    /// and a sequence asking for every row's logits, fewer rows than the chunked form
    /// takes) and `len` is one of them. Then rejected guesses cost nothing to undo; the
    /// attention layers' keys and values are cut with [`set_len`](Self::set_len) after.
    /// Without sequence state, or when the state already stands at `len`, it does nothing;
    /// elsewhere it is [`Error::StateRollback`] and changes nothing.
    pub fn rollback_state(&mut self, id: SeqId, len: usize) -> Result<()> {
        let held = self.book.seq(id)?.state_len;
        if !self.book.stateful || held == len {
            return Ok(());
        }
        if len > 0 && len < held && self.store.roll_back(id, len, held) {
            return self.book.set_state_len(id, len);
        }
        Err(Error::StateRollback { len, held })
    }

    /// Keep a copy of `id`'s recurrent state for the prefix cache, when it stands exactly at
    /// the end of the sequence's last registered block ([`commit`](Self::commit) first);
    /// returns whether it was kept. Without sequence state, or elsewhere, it does nothing.
    /// The snapshot holds blocks of the pool for its memory: free or least recently cached
    /// ones, else the oldest snapshots'; false when even that leaves too few.
    pub fn snapshot_state(&mut self, id: SeqId) -> Result<bool> {
        let r = self.book.snapshot_state(id);
        self.sync();
        r
    }
}

impl Book {
    /// Errors unless `id`'s state has taken in exactly `start` positions (a forward that
    /// failed part-way leaves it out of step).
    pub(crate) fn check_state_at(&self, id: SeqId, start: usize) -> Result<()> {
        let held = self.seq(id)?.state_len;
        if held != start {
            return Err(Error::StateRollback { len: start, held });
        }
        Ok(())
    }
    /// Record that the state of `id` has taken in `len` positions.
    pub(crate) fn set_state_len(&mut self, id: SeqId, len: usize) -> Result<()> {
        self.seq_mut(id)?.state_len = len;
        Ok(())
    }

    /// [`KvCache::snapshot_state`].
    fn snapshot_state(&mut self, id: SeqId) -> Result<bool> {
        let bs = self.block_size;
        let s = self.seq(id)?;
        let Some(&h) = s.hashes.last() else { return Ok(false) };
        if !self.stateful || s.state_len != s.hashes.len() * bs || !self.is_registered(h) {
            return Ok(false);
        }
        if self.snapshots.contains(&h) {
            return Ok(true);
        }
        Ok(self.save_snapshot(id, h))
    }

    /// [`KvCache::attach_prefix`] for a cache with sequence state: the matching registered
    /// blocks up to the last one with a snapshot, and that snapshot as the state.
    pub(super) fn attach_with_state(&mut self, id: SeqId, tokens: &[u32]) -> Result<usize> {
        let bs = self.block_size;
        let mut prev = 0u64;
        let mut upto = 0;
        for (i, chunk) in tokens[..tokens.len().saturating_sub(1)].chunks_exact(bs).enumerate() {
            let h = Self::chain_hash(prev, chunk);
            if !self.is_registered(h) {
                break;
            }
            if self.snapshots.contains(&h) {
                upto = i + 1;
            }
            prev = h;
        }
        if upto == 0 {
            return Ok(0);
        }
        let n = self.attach_blocks(id, &tokens[..upto * bs + 1])?;
        if n != upto * bs {
            return Err(Error::Internal("the prefix cache's blocks changed while attaching them"));
        }
        let h = *self.seq(id)?.hashes.last().ok_or(Error::Internal("attached blocks without hashes"))?;
        if !self.snapshots.contains(&h) {
            return Err(Error::Internal("a state snapshot vanished"));
        }
        self.restore_snapshot(id, h, n)?;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{cache, write};
    use super::*;

    /// A hybrid's sequence state: copied by `fork`, reset only by truncating to 0 (a shorter
    /// non-zero length is an error that changes nothing), out of step when a forward did
    /// not finish; shared by the prefix cache only up to a block with a snapshot.
    #[test]
    fn sequence_state_forks_rolls_back_only_to_zero_and_shares_snapshots() {
        let mut c = cache(16).with_seq_state(3);
        let toks: Vec<u32> = (0..10).collect();
        let a = c.new_seq();
        write(&mut c, a, &[1, 2, 3, 4, 5]);
        c.seq_state_at(a, 0).unwrap().copy_from_slice(&[1.0, 2.0, 3.0]);
        c.set_state_len(a, 5).unwrap();
        let b = c.fork(a).unwrap();
        assert_eq!(c.seq_state_at(b, 5).unwrap(), &[1.0, 2.0, 3.0]);
        assert!(matches!(c.seq_state_at(b, 4), Err(Error::StateRollback { len: 4, held: 5 })));
        assert!(matches!(c.truncate(a, 2), Err(Error::StateRollback { len: 2, held: 5 })));
        assert_eq!(c.len(a).unwrap(), 5);
        c.truncate(a, 0).unwrap();
        assert_eq!(c.seq_state_at(a, 0).unwrap(), &[0.0; 3]);
        // Registered blocks without a snapshot are not shared.
        c.commit(b, &toks).unwrap();
        assert!(!c.snapshot_state(b).unwrap(), "the state is past the block's end");
        let d = c.new_seq();
        assert_eq!(c.attach_prefix(d, &toks).unwrap(), 0);
        // A state that ends a registered block is kept, and given with the blocks.
        let e = c.new_seq();
        write(&mut c, e, &[1, 2, 3, 4, 5, 6, 7, 8]);
        c.seq_state_at(e, 0).unwrap().copy_from_slice(&[4.0, 5.0, 6.0]);
        c.set_state_len(e, 8).unwrap();
        c.commit(e, &toks).unwrap();
        assert!(c.snapshot_state(e).unwrap());
        let f = c.new_seq();
        assert_eq!(c.attach_prefix(f, &toks).unwrap(), 8);
        assert_eq!(c.seq_state_at(f, 8).unwrap(), &[4.0, 5.0, 6.0]);
        // Forgetting the prefix cache forgets the snapshots.
        c.truncate(e, 0).unwrap();
        c.free(f).unwrap();
        c.clear_prefix_cache();
        let g = c.new_seq();
        assert_eq!(c.attach_prefix(g, &toks).unwrap(), 0);
    }

    /// A state holds blocks of the pool for its memory (here 500 floats: two blocks of 1 KiB
    /// of keys and values), from its sequence's start to its end, and so does each snapshot; snapshots
    /// give theirs back when a sequence needs room, and a pool full of states refuses more
    /// positions.
    #[test]
    fn states_and_snapshots_take_blocks_of_the_budget() {
        let mut c = cache(8).with_seq_state(500);
        assert_eq!(c.seq_state_blocks(), 2);
        let a = c.new_seq();
        assert_eq!(c.usage().used_blocks, 2, "a new sequence holds its state's blocks");
        write(&mut c, a, &[1, 2, 3, 4]);
        c.set_state_len(a, 4).unwrap();
        assert_eq!(c.usage().used_blocks, 3);
        let toks: Vec<u32> = (0..5).collect();
        c.commit(a, &toks).unwrap();
        assert!(c.snapshot_state(a).unwrap());
        let u = c.usage();
        assert_eq!((u.used_blocks, u.cached_blocks), (3, 2), "the snapshot holds a state's blocks too, as a cache");
        let b = c.fork(a).unwrap();
        assert_eq!(c.usage().used_blocks, 5, "a fork's state is its own");
        assert_eq!(c.available_blocks(), 3, "the last free block and the snapshot's");
        // b's next position takes the last free block; the next block it needs, the
        // snapshot gives up.
        write(&mut c, b, &[5]);
        assert_eq!(c.usage().used_blocks, 6);
        write(&mut c, b, &[6, 7, 8, 9]);
        let u = c.usage();
        assert_eq!((u.used_blocks, u.cached_blocks), (7, 0));
        assert!(!c.snapshot_state(b).unwrap(), "no room for another snapshot");
        // Nothing left to give: a full pool refuses positions.
        assert!(matches!(c.reserve(b, 8), Err(Error::KvFull { .. })));
        c.free(b).unwrap();
        c.free(a).unwrap();
        assert_eq!(c.usage().used_blocks, 0, "freed sequences give their states' blocks back");
        assert_eq!(c.available_blocks(), 8);
    }
}
