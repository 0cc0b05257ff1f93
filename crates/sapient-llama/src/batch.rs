//! What a batched forward takes: each sequence's rows and which logits it wants.

use crate::kv::SeqId;

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

