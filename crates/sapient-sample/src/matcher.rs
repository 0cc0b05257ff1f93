//! Token masks for a constraint's state, and [`Matcher`], which follows a generation.
//!
//! A mask is one walk over the vocabulary trie with the constraint's state advanced one byte
//! per trie edge: a rejected byte skips the whole subtree, so tokens sharing a prefix are
//! checked together and nothing is re-parsed from the start. [`Matcher`] tracks a
//! generation: it caches masks by parser state (grammar states repeat a lot, e.g. inside a
//! string), checks single tokens cheaply (used by the sampler-aware path in
//! [`crate::Sampler::sample_constrained`]), rolls back, and reports forced continuations.

use crate::constraint::Constraint;
use crate::error::GrammarError;
use crate::vocab::{TokenIndex, TokenMask};
use crate::Error;
use std::collections::HashMap;
use std::sync::Arc;

impl TokenIndex {
    /// Compute the allowed tokens for `state` (EOS included when the state is complete).
    /// Uses the constraint's accelerated path when it has one ([`Constraint::fast_mask`]).
    pub fn mask<C: Constraint>(&self, c: &C, state: &C::State) -> Result<TokenMask, GrammarError> {
        Ok(Arc::unwrap_or_clone(self.mask_shared(c, state)?))
    }

    /// [`TokenIndex::mask`], shared rather than copied where the constraint caches it (a
    /// [`crate::Grammar`] keeps the masks of the states it has seen, per vocabulary).
    pub fn mask_shared<C: Constraint>(&self, c: &C, state: &C::State) -> Result<Arc<TokenMask>, GrammarError> {
        if let Some(m) = c.fast_mask(self, state)? {
            return Ok(m);
        }
        Ok(Arc::new(self.mask_by_walk(c, state)?))
    }

    /// The mask by walking the whole trie with the constraint (no acceleration).
    pub fn mask_by_walk<C: Constraint>(&self, c: &C, state: &C::State) -> Result<TokenMask, GrammarError> {
        self.mask_by_walk_from(c, state, &[])
    }

    /// The mask by walking the trie, only below `prefix` (the caller knows every allowed
    /// token starts with a prefix of it, e.g. a literal; its first two bytes are looked up).
    pub(crate) fn mask_by_walk_from<C: Constraint>(&self, c: &C, state: &C::State, prefix: &[u8]) -> Result<TokenMask, GrammarError> {
        let mut mask = TokenMask::empty(self.bytes.len());
        self.walk_from(c, state, prefix, |t| mask.set(t))?;
        Ok(mask)
    }

    /// The tokens allowed after `state` (EOS included when complete), each passed to `f`,
    /// walking only below `prefix` (see [`TokenIndex::mask_by_walk_from`]).
    pub(crate) fn walk_from<C: Constraint>(&self, c: &C, state: &C::State, prefix: &[u8], mut f: impl FnMut(u32)) -> Result<(), GrammarError> {
        let depth = if prefix.is_empty() { self.max_depth + 1 } else { 2 };
        let mut states: Vec<C::State> = vec![C::State::default(); depth];
        states[0] = state.clone();
        let (mut i, end) = match *prefix {
            [] => (1, self.nodes.len()),
            [b0] => match self.root_child[b0 as usize] {
                0 => (0, 0),
                n => (n as usize, self.nodes[n as usize].end as usize),
            },
            [b0, b1, ..] => {
                let n1 = self.root_child[b0 as usize] as usize;
                let n2 = self.root_child2[(b0 as usize) << 8 | b1 as usize] as usize;
                let (lo, hi) = states.split_at_mut(1);
                if n1 != 0 && c.advance(&lo[0], b0, &mut hi[0])? {
                    let n = self.nodes[n1];
                    for &t in &self.tok_ids[n.tok_start as usize..n.tok_end as usize] {
                        f(t);
                    }
                    if n2 == 0 { (0, 0) } else { (n2, self.nodes[n2].end as usize) }
                } else {
                    (0, 0)
                }
            }
        };
        while i < end {
            let n = self.nodes[i];
            let d = n.depth as usize;
            if states.len() <= d {
                states.resize(d + 1, C::State::default());
            }
            let (lo, hi) = states.split_at_mut(d);
            if c.advance(&lo[d - 1], n.byte, &mut hi[0])? {
                for &t in &self.tok_ids[n.tok_start as usize..n.tok_end as usize] {
                    f(t);
                }
                i += 1;
            } else {
                i = n.end as usize;
            }
        }
        if c.is_accepting(state) {
            for &e in &self.eos {
                f(e);
            }
        }
        Ok(())
    }

    /// Is `token` allowed after `state`? Returns the next state if so.
    pub fn check_token<C: Constraint>(&self, c: &C, state: &C::State, token: u32) -> Result<Option<C::State>, GrammarError> {
        if self.eos.contains(&token) {
            return Ok(c.is_accepting(state).then(|| state.clone()));
        }
        if !self.in_trie.get(token as usize).copied().unwrap_or(false) {
            return Ok(None);
        }
        c.advance_bytes(state, &self.bytes[token as usize])
    }
}

/// Counters kept by a [`Matcher`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MatcherStats {
    /// Single-token checks (sampler-aware path).
    pub token_checks: usize,
    /// Full masks computed by walking the trie.
    pub masks_computed: usize,
    /// Full masks served from the cache.
    pub mask_cache_hits: usize,
}

/// Cached masks kept per matcher before the cache is cleared.
const MASK_CACHE: usize = 256;

/// A constraint being followed token by token.
#[derive(Debug)]
pub struct Matcher<C: Constraint> {
    constraint: Arc<C>,
    index: Arc<TokenIndex>,
    state: C::State,
    history: Vec<C::State>,
    finished: bool,
    cache: HashMap<C::State, Arc<TokenMask>>,
    stats: MatcherStats,
    /// Forced tokens still to come (in order, reversed), valid while `history.len()` is
    /// `pending_at`.
    pending: Vec<u32>,
    pending_at: usize,
}

impl<C: Constraint> Clone for Matcher<C> {
    fn clone(&self) -> Self {
        Self {
            constraint: self.constraint.clone(),
            index: self.index.clone(),
            state: self.state.clone(),
            history: self.history.clone(),
            finished: self.finished,
            cache: self.cache.clone(),
            stats: self.stats,
            pending: self.pending.clone(),
            pending_at: self.pending_at,
        }
    }
}

impl<C: Constraint> Matcher<C> {
    /// Follow `constraint` over `index`'s vocabulary; first calls
    /// [`Constraint::prepare`] (done once per grammar and vocabulary).
    pub fn new(constraint: Arc<C>, index: Arc<TokenIndex>) -> Self {
        constraint.prepare(&index);
        let state = constraint.start();
        Self {
            constraint,
            index,
            state,
            history: Vec::new(),
            finished: false,
            cache: HashMap::new(),
            stats: MatcherStats::default(),
            pending: Vec::new(),
            pending_at: 0,
        }
    }
    pub fn constraint(&self) -> &C {
        &self.constraint
    }
    pub fn index(&self) -> &TokenIndex {
        &self.index
    }
    pub fn state(&self) -> &C::State {
        &self.state
    }
    pub fn stats(&self) -> MatcherStats {
        self.stats
    }
    /// The text so far is complete (EOS would be allowed).
    pub fn is_accepting(&self) -> bool {
        self.constraint.is_accepting(&self.state)
    }
    /// An EOS token was consumed.
    pub fn is_finished(&self) -> bool {
        self.finished
    }
    /// Tokens consumed so far (rollback depth available).
    pub fn num_tokens(&self) -> usize {
        self.history.len()
    }

    /// Is `token` allowed next? (Walks only this token's bytes.)
    pub fn allows(&mut self, token: u32) -> Result<bool, Error> {
        self.stats.token_checks += 1;
        if self.finished {
            return Ok(false);
        }
        Ok(self.index.check_token(&*self.constraint, &self.state, token)?.is_some())
    }

    /// Advance by `token`; `Error::TokenRejected` if the constraint does not allow it.
    pub fn consume(&mut self, token: u32) -> Result<(), Error> {
        if self.finished {
            return Err(Error::TokenRejected(token));
        }
        let next = self.index.check_token(&*self.constraint, &self.state, token)?.ok_or(Error::TokenRejected(token))?;
        if self.pending_at == self.history.len() && self.pending.last() == Some(&token) {
            self.pending.pop();
            self.pending_at += 1;
        } else {
            self.pending.clear();
        }
        self.history.push(std::mem::replace(&mut self.state, next));
        if self.index.eos.contains(&token) {
            self.finished = true;
        }
        Ok(())
    }

    /// Advance by raw bytes (e.g. forced text), counted as one step for rollback.
    pub fn consume_bytes(&mut self, bytes: &[u8]) -> Result<(), Error> {
        let next = self
            .constraint
            .advance_bytes(&self.state, bytes)?
            .ok_or_else(|| Error::BytesRejected(String::from_utf8_lossy(bytes).into_owned()))?;
        self.history.push(std::mem::replace(&mut self.state, next));
        Ok(())
    }

    /// Undo the last `n` consumed steps.
    pub fn rollback(&mut self, n: usize) -> Result<(), Error> {
        if n > self.history.len() {
            return Err(Error::Rollback { requested: n, available: self.history.len() });
        }
        for _ in 0..n {
            if let Some(s) = self.history.pop() {
                self.state = s;
            }
        }
        if n > 0 {
            self.finished = false;
            self.pending.clear();
        }
        Ok(())
    }

    /// The full mask for the current state (cached by state). `Error::DeadEnd` if no token,
    /// EOS included, is allowed: the grammar cannot be completed with this vocabulary.
    pub fn mask(&mut self) -> Result<Arc<TokenMask>, Error> {
        if let Some(m) = self.cache.get(&self.state) {
            self.stats.mask_cache_hits += 1;
            return Ok(m.clone());
        }
        self.stats.masks_computed += 1;
        let m = self.compute_mask_shared()?;
        if self.cache.len() >= MASK_CACHE {
            self.cache.clear();
        }
        self.cache.insert(self.state.clone(), m.clone());
        Ok(m)
    }

    /// The full mask without the matcher's cache (benchmarks; a grammar's own cache of
    /// masks by state may still serve it).
    pub fn compute_mask_uncached(&mut self) -> Result<TokenMask, Error> {
        self.stats.masks_computed += 1;
        if self.finished {
            return Ok(TokenMask::empty(self.index.vocab_size()));
        }
        Ok(Arc::unwrap_or_clone(self.compute_mask_shared()?))
    }

    fn compute_mask_shared(&mut self) -> Result<Arc<TokenMask>, Error> {
        if self.finished {
            return Ok(Arc::new(TokenMask::empty(self.index.vocab_size())));
        }
        let m = self.index.mask_shared(&*self.constraint, &self.state)?;
        if m.is_empty() {
            tracing::warn!(state = ?self.state, "constraint reached a dead end");
            return Err(Error::DeadEnd);
        }
        Ok(m)
    }

    /// Bytes the constraint forces next: while exactly one byte is possible and the text is
    /// not complete, that byte (at most `limit`). The caller may append them without
    /// sampling; to keep the model's tokenization natural, tokenize the forced text and
    /// feed all but the last token, which may merge with what follows.
    pub fn forced_bytes(&self, limit: usize) -> Result<Vec<u8>, Error> {
        let c = &*self.constraint;
        let mut out = Vec::new();
        let mut cur = self.state.clone();
        let mut next = C::State::default();
        let mut only = C::State::default();
        while out.len() < limit && !self.finished && !c.is_accepting(&cur) {
            let mut found: Option<u8> = None;
            for b in 0..=255u8 {
                if c.advance(&cur, b, &mut next)? {
                    if found.is_some() {
                        return Ok(out);
                    }
                    found = Some(b);
                    std::mem::swap(&mut only, &mut next);
                }
            }
            let Some(b) = found else { return Ok(out) };
            out.push(b);
            std::mem::swap(&mut cur, &mut only);
        }
        Ok(out)
    }

    /// A token to append without sampling, if the constraint forces one: the only token
    /// the mask allows, or, when the index has the model's tokenizer
    /// ([`TokenIndex::with_tokenizer`]) and the constraint forces several bytes, the first
    /// of the tokenizer's split of those bytes (never the last token of the split, which
    /// could merge with what follows). Appending it never changes what the grammar accepts.
    pub fn forced_token(&mut self) -> Result<Option<u32>, Error> {
        if self.finished {
            return Ok(None);
        }
        if self.pending_at == self.history.len() {
            if let Some(&t) = self.pending.last() {
                return Ok(Some(t));
            }
        }
        if let Some(t) = self.forced_by_tokenizer()? {
            return Ok(Some(t));
        }
        self.forced_single_token()
    }

    /// Whether `already` choices plus the single-byte tokens allowed now make at least two
    /// (then no token is forced), checked byte by byte without computing the mask.
    fn two_choices(&self, already: usize) -> Result<bool, Error> {
        let c = &*self.constraint;
        let mut n = already;
        let mut tmp = C::State::default();
        for b in 0..=255u8 {
            if self.index.single_byte[b as usize] && c.advance(&self.state, b, &mut tmp)? {
                n += 1;
                if n >= 2 {
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }

    /// The forced bytes split by the tokenizer: queue all tokens but the last.
    fn forced_by_tokenizer(&mut self) -> Result<Option<u32>, Error> {
        let Some(tokenize) = self.index.tokenize.0.clone() else { return Ok(None) };
        // Cheap test first: two allowed single-byte tokens mean nothing is forced.
        if self.two_choices(0)? {
            return Ok(None);
        }
        let c = &*self.constraint;
        let bytes = self.forced_bytes(48)?;
        let text = match std::str::from_utf8(&bytes) {
            Ok(t) => t,
            Err(e) => std::str::from_utf8(&bytes[..e.valid_up_to()]).unwrap_or_default(),
        };
        if text.len() < 2 {
            return Ok(None);
        }
        let Some(mut toks) = tokenize(text) else { return Ok(None) };
        toks.pop();
        // Check the split spells the forced text and each token is allowed in turn.
        let mut st = self.state.clone();
        let mut spelled = 0usize;
        for &t in &toks {
            let Some(b) = self.index.token_bytes(t) else { return Ok(None) };
            if bytes.get(spelled..spelled + b.len()) != Some(b) {
                return Ok(None);
            }
            spelled += b.len();
            match self.index.check_token(c, &st, t)? {
                Some(next) => st = next,
                None => return Ok(None),
            }
        }
        toks.reverse();
        self.pending = toks;
        self.pending_at = self.history.len();
        Ok(self.pending.last().copied())
    }

    /// If the full mask allows exactly one token, that token.
    fn forced_single_token(&mut self) -> Result<Option<u32>, Error> {
        // Cheap test first: two allowed single-byte tokens (or one and EOS) mean no token is
        // forced, without computing the mask.
        if self.two_choices(usize::from(self.constraint.is_accepting(&self.state)))? {
            return Ok(None);
        }
        let m = self.mask()?;
        let mut it = m.iter();
        Ok(match (it.next(), it.next()) {
            (Some(t), None) => Some(t),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grammar::{Expr, Grammar};

    /// A small vocabulary: single bytes for digits and punctuation, some multi-byte pieces.
    fn vocab() -> (Vec<Vec<u8>>, Vec<&'static str>) {
        let words = vec![
            "<eos>", "{", "}", "\"", ":", ",", " ", "0", "1", "2", "12", "123", "a", "ab", "abc", "b", "\"a", "\":",
            "\": ", "{\"", "true", "false", "null", "[", "]", "x", "\",", "<special>", "", "name", "\"name\"", "5,",
        ];
        (words.iter().map(|w| w.as_bytes().to_vec()).collect(), words)
    }

    fn brute(c: &Grammar, st: &<Grammar as Constraint>::State, toks: &[Vec<u8>], special: &[u32]) -> Vec<u32> {
        let mut v = Vec::new();
        for (i, t) in toks.iter().enumerate() {
            if i == 0 {
                if c.is_accepting(st) {
                    v.push(0);
                }
                continue;
            }
            if t.is_empty() || special.contains(&(i as u32)) {
                continue;
            }
            if c.advance_bytes(st, t).unwrap().is_some() {
                v.push(i as u32);
            }
        }
        v
    }

    #[test]
    fn trie_mask_equals_brute_force() {
        let (toks, _) = vocab();
        let special = [27u32];
        let idx = TokenIndex::new(toks.clone(), &[0], &special);
        let tools = vec![crate::grammar::Tool::new("f", serde_json::json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}))];
        let grammars = [
            Grammar::new(&Expr::text_or_tool_calls("ab", "</f>", tools)).unwrap(),
            Grammar::new(&Expr::stop_at("abc").then(Expr::literal("1"))).unwrap(),
            Grammar::json().unwrap(),
            Grammar::regex("a[bc]*|12+").unwrap(),
            Grammar::json_schema(&serde_json::json!({"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer", "maximum": 12}}, "required": ["name"]})).unwrap(),
        ];
        let prefixes: [&[&str]; 5] = [
            &["", "x", "a", "12 a", "xab\n", "ab\n{\"name\":\"f\",\"arguments\":{\"a\":1", "ab\n{\"name\":\"f\",\"arguments\":{\"a\":1}}\n</f>"],
            &["", "a", "ab", "x abab", "abc"],
            &["", "{", "{\"", "{\"a\":", "[1", "[1,", "\"ab", "true"],
            &["", "a", "ab", "1", "12"],
            &["", "{", "{\"", "{\"name", "{\"name\":\"x\"", "{\"name\":\"x\",\"n\":1", "{\"name\":\"x\",\"n\":12}"],
        ];
        for (g, ps) in grammars.iter().zip(prefixes) {
            for p in ps {
                let st = g.advance_bytes(&g.start(), p.as_bytes()).unwrap().expect(p);
                let m = idx.mask(g, &st).unwrap();
                let got: Vec<u32> = m.iter().collect();
                assert_eq!(got, brute(g, &st, &toks, &special), "prefix {p:?}");
                assert_eq!(m, idx.mask_by_walk(g, &st).unwrap(), "prefix {p:?}");
            }
        }
    }

    #[test]
    fn matcher_consume_rollback_and_dead_end() {
        let (toks, words) = vocab();
        let id = |w: &str| words.iter().position(|x| *x == w).unwrap() as u32;
        let idx = Arc::new(TokenIndex::new(toks, &[0], &[27]));
        let g = Arc::new(Grammar::new(&Expr::one_of(["abc", "ab1"])).unwrap());
        let mut m = Matcher::new(g.clone(), idx.clone());
        assert!(m.allows(id("ab")).unwrap() && m.allows(id("abc")).unwrap() && !m.allows(id("b")).unwrap());
        assert!(!m.allows(0).unwrap(), "EOS before completion");
        m.consume(id("ab")).unwrap();
        assert!(matches!(m.consume(id("ab")), Err(Error::TokenRejected(_))));
        let mask: Vec<u32> = m.mask().unwrap().iter().collect();
        assert_eq!(mask, vec![id("1")], "only '1' completes 'ab1'; 'c' has no token");
        assert_eq!(m.forced_token().unwrap(), Some(id("1")));
        m.consume(id("1")).unwrap();
        assert!(m.is_accepting() && m.allows(0).unwrap());
        m.consume(0).unwrap();
        assert!(m.is_finished());
        m.rollback(2).unwrap();
        assert!(!m.is_finished() && !m.is_accepting());
        assert!(m.allows(id("1")).unwrap());
        assert!(matches!(m.rollback(5), Err(Error::Rollback { .. })));
        // A grammar the vocabulary cannot spell: a dead end is an error, not a loop.
        let g = Arc::new(Grammar::new(&Expr::literal("zz")).unwrap());
        let mut m = Matcher::new(g, idx);
        assert!(matches!(m.mask(), Err(Error::DeadEnd)));
    }

    #[test]
    fn mask_cache_and_forced_bytes() {
        let (toks, words) = vocab();
        let id = |w: &str| words.iter().position(|x| *x == w).unwrap() as u32;
        let idx = Arc::new(TokenIndex::new(toks, &[0], &[27]));
        let schema = serde_json::json!({"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]});
        let g = Arc::new(Grammar::json_schema(&schema).unwrap());
        let mut m = Matcher::new(g.clone(), idx);
        // By default (compact JSON) the key is forced with the brace.
        assert_eq!(m.forced_bytes(64).unwrap(), b"{\"name\":\"");
        m.consume(id("{")).unwrap();
        assert_eq!(m.forced_bytes(64).unwrap(), b"\"name\":\"");
        let flexible = crate::builder::JsonOptions::flexible(24);
        let gf = Arc::new(Grammar::with_options(&Expr::JsonSchema(schema), flexible).unwrap());
        let mut mf = Matcher::new(gf, m.index.clone());
        mf.consume(id("{")).unwrap();
        // With flexible whitespace, optional whitespace or the key may come.
        assert_eq!(mf.forced_bytes(64).unwrap(), b"");
        let a = mf.mask().unwrap();
        let b = mf.mask().unwrap();
        assert_eq!(a, b);
        assert_eq!(mf.stats().masks_computed, 1);
        assert_eq!(mf.stats().mask_cache_hits, 1);
        assert!(a.is_allowed(id("\"name\"")) && a.is_allowed(id("\"")) && a.is_allowed(id(" ")) && !a.is_allowed(id("\"a")));
    }

    #[test]
    fn forced_text_split_by_the_tokenizer() {
        let (toks, words) = vocab();
        let id = |w: &str| words.iter().position(|x| *x == w).unwrap() as u32;
        // A greedy longest-match tokenizer over the toy vocabulary stands in for the model's.
        let words2: Vec<String> = words.iter().map(|w| w.to_string()).collect();
        let tokenize: crate::Tokenize = Arc::new(move |text: &str| {
            let mut out = Vec::new();
            let mut rest = text;
            while !rest.is_empty() {
                let (i, w) = words2.iter().enumerate().filter(|(i, w)| *i != 0 && *i != 27 && !w.is_empty() && rest.starts_with(w.as_str())).max_by_key(|(_, w)| w.len())?;
                out.push(i as u32);
                rest = &rest[w.len()..];
            }
            Some(out)
        });
        let idx = Arc::new(TokenIndex::new(toks.clone(), &[0], &[27]).with_tokenizer(tokenize));
        let schema = serde_json::json!({"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]});
        let g = Arc::new(Grammar::json_schema(&schema).unwrap());
        let mut m = Matcher::new(g.clone(), idx);
        // `{"name":"` is forced: split `{"` `name` `":` `"`, the last held back.
        let mut fed = Vec::new();
        while let Some(t) = m.forced_token().unwrap() {
            m.consume(t).unwrap();
            fed.push(t);
        }
        assert_eq!(fed, vec![id("{\""), id("name"), id("\":")]);
        // Without the tokenizer only single allowed tokens are forced: none here.
        let mut plain = Matcher::new(g, Arc::new(TokenIndex::new(toks, &[0], &[27])));
        assert_eq!(plain.forced_token().unwrap(), None);
        // Rolling back drops the queue; the same tokens are found again.
        m.rollback(2).unwrap();
        assert_eq!(m.forced_token().unwrap(), Some(id("name")));
    }
}
