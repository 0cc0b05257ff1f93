//! Token sets of length-bounded strings without a trie walk per count.
//!
//! A string of `lo..=hi` characters ([`DfaTable::quoted_repeat`]) has a state per count of
//! characters read, and each would need its own walk of the whole vocabulary (milliseconds)
//! the first time a generation reaches it. Which tokens a count allows depends only on how
//! many characters each token holds: one walk with the unbounded item per vocabulary sorts
//! the tokens by that number ([`ItemTokens`]), and a count's sets are then unions of those
//! groups.

use crate::dfa::{Counted, DfaTable, DEAD};
use crate::vocab::{BoundaryGroup, LexemeTokens, TokenIndex, TokenMask};

/// The vocabulary's tokens by what they do from between two items (outside the opening
/// quote), with `k` the number of items they complete:
#[derive(Debug)]
pub(crate) struct ItemTokens {
    /// `open[k]`: tokens of `k` complete items, or `k - 1` and the start of another (that
    /// one needs room for `k`), all tokens with at most `k` (prefix unions).
    open: Vec<TokenMask>,
    /// `closed[k]`: tokens of at most `k` items then the closing quote (prefix unions).
    closed: Vec<TokenMask>,
    /// Tokens of `k` items, the closing quote, then more: (k, rest start, token), sorted by
    /// the rest.
    leaving: Vec<(u32, u32, u32)>,
}

impl ItemTokens {
    pub(crate) fn new(index: &TokenIndex, item: &DfaTable) -> Self {
        let vocab = index.vocab_size();
        let mut open_k: Vec<(u32, u32)> = Vec::new();
        let mut closed_k: Vec<(u32, u32)> = Vec::new();
        let mut leaving: Vec<(u32, u32, u32)> = Vec::new();
        // Per depth: the item state and the items completed.
        let mut st = vec![(item.start, 0u32); index.max_depth + 1];
        let mut i = 1;
        while i < index.nodes.len() {
            let n = index.nodes[i];
            let d = n.depth as usize;
            let (s, k) = st[d - 1];
            let toks = &index.tok_ids[n.tok_start as usize..n.tok_end as usize];
            if s == item.start && n.byte == b'"' {
                // The closing quote: tokens ending here close the string, those below go on
                // after it.
                closed_k.extend(toks.iter().map(|&t| (k, t)));
                let last = index.nodes[n.end as usize - 1].tok_end as usize;
                leaving.extend(index.tok_ids[n.tok_end as usize..last].iter().map(|&t| (k, d as u32, t)));
                i = n.end as usize;
                continue;
            }
            let t = item.next(s, n.byte);
            if t == DEAD {
                i = n.end as usize;
                continue;
            }
            let next = if item.accepting[t as usize] { (item.start, k + 1) } else { (t, k) };
            st[d] = next;
            // A token ending inside an item needs room for that item too.
            let room = next.1 + u32::from(next.0 != item.start);
            open_k.extend(toks.iter().map(|&t| (room, t)));
            i += 1;
        }
        let prefix_unions = |mut v: Vec<(u32, u32)>| -> Vec<TokenMask> {
            v.sort_unstable();
            let top = v.last().map_or(0, |x| x.0 as usize);
            let mut out = Vec::with_capacity(top + 1);
            let mut m = TokenMask::empty(vocab);
            let mut j = 0;
            for k in 0..=top as u32 {
                while j < v.len() && v[j].0 == k {
                    m.set(v[j].1);
                    j += 1;
                }
                out.push(m.clone());
            }
            out
        };
        let rest = |&(_, at, t): &(u32, u32, u32)| -> &[u8] { index.token_bytes(t).and_then(|b| b.get(at as usize..)).unwrap_or_default() };
        leaving.sort_unstable_by(|a, b| rest(a).cmp(rest(b)).then(a.2.cmp(&b.2)));
        Self { open: prefix_unions(open_k), closed: prefix_unions(closed_k), leaving }
    }

    /// The token sets of `dfa`'s state `s`, if it lies between two items (elsewhere: `None`,
    /// the state takes the walk).
    pub(crate) fn lexeme_tokens(&self, index: &TokenIndex, c: &Counted, s: u32) -> Option<LexemeTokens> {
        let m = c.per_count;
        if s == 0 || m == 0 || !(s - 1).is_multiple_of(m) || (s - 1) / m > c.cap {
            return None;
        }
        let i = (s - 1) / m;
        // Items this count may still take (none: unbounded), and must take before the quote.
        let room = c.hi.map(|h| h.saturating_sub(i));
        let need = c.lo.saturating_sub(i);
        fn upto(v: &[TokenMask], k: Option<u32>) -> Option<&TokenMask> {
            k.and_then(|k| v.get(k as usize)).or(v.last())
        }
        let mut inner = upto(&self.open, room).cloned().unwrap_or_else(|| TokenMask::empty(index.vocab_size()));
        if room.is_none_or(|r| r >= need) {
            if let Some(all) = upto(&self.closed, room) {
                let mut closing = all.clone();
                if let Some(short) = need.checked_sub(1).and_then(|k| upto(&self.closed, Some(k))) {
                    closing.remove_all(short);
                }
                inner.union_with(&closing);
            }
        }
        // Tokens that close the string and go on. The parse after them depends only on the
        // state after the quote (the last), so they make one group, whichever count the
        // quote comes at; its state before the quote is any of theirs.
        let fits = |k: u32| k >= need && room.is_none_or(|r| k <= r);
        let mut groups = Vec::new();
        if let Some(k) = self.leaving.iter().map(|l| l.0).find(|&k| fits(k)) {
            // `k` more items read, between items (from the cap on, when unbounded, the cap's).
            let p = 1 + (i + k).min(c.cap) * m;
            let rests = self.leaving.iter().filter(|l| fits(l.0)).map(|&(_, at, t)| (index.token_bytes(t).and_then(|b| b.get(at as usize..)).unwrap_or_default(), t));
            groups.push(BoundaryGroup::from_sorted(p, b'"', rests));
        }
        let num_rests = groups.iter().map(|g| g.len()).sum();
        Some(LexemeTokens { inner, groups, num_rests })
    }
}
