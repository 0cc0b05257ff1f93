//! What a batched forward takes: each sequence's rows and which logits it wants.

use crate::backend::{Seg, Step};
use crate::kv::{Book, SeqId};
use crate::{Error, Result};

/// Whether `forward` returns logits for every new position or only the last one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    Last,
    All,
}

/// One sequence's part of a batched forward
/// ([`LlamaModel::forward_batch`](crate::LlamaModel::forward_batch),
/// [`forward_reserved`](crate::LlamaModel::forward_reserved)): `tokens` at the positions
/// after what the cache holds for `seq`, and which logits to return (`None`: none, e.g. a
/// prompt chunk that does not end the prompt).
#[derive(Debug, Clone, Copy)]
pub struct BatchSeq<'a> {
    pub seq: SeqId,
    pub tokens: &'a [u32],
    pub logits: Option<Logits>,
}

/// Where the rows of `batch` go: each sequence's positions after what `kv` holds for it, in
/// the slots its block table reserves.
pub(crate) fn plan(kv: &Book, batch: &[BatchSeq<'_>], step: &mut Step) -> Result<()> {
    step.pos.clear();
    step.slot.clear();
    step.segs.clear();
    step.tabs.clear();
    step.out_rows.clear();
    for s in batch {
        let (start, blocks) = (kv.len(s.seq)?, kv.blocks(s.seq)?);
        let row0 = step.pos.len();
        let m = s.tokens.len();
        if (start + m).div_ceil(kv.block_size()) > blocks.len() {
            return Err(Error::Internal("forward_batch on positions that were not reserved"));
        }
        step.segs.push(Seg { seq: s.seq, row0, n: m, start, tab0: step.tabs.len(), tabn: blocks.len(), keep: s.logits == Some(Logits::All) });
        step.tabs.extend_from_slice(blocks);
        for i in 0..m {
            step.pos.push(start + i);
            step.slot.push(kv.slot(blocks, start + i));
        }
        match s.logits {
            None => {}
            Some(Logits::Last) => step.out_rows.push(row0 + m - 1),
            Some(Logits::All) => step.out_rows.extend(row0..row0 + m),
        }
    }
    // Every row has a slot of its own (the backend writes rows' keys and values in parallel).
    if step.slot.len() > 1 {
        let mut seen = step.slot.clone();
        seen.sort_unstable();
        if seen.windows(2).any(|w| w[0] == w[1]) {
            return Err(Error::Internal("two rows of a batch write the same KV cache slot"));
        }
    }
    Ok(())
}
