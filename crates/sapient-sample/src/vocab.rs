//! A model vocabulary as a byte trie, and token masks.
//!
//! [`TokenIndex`] holds the vocabulary as a byte trie laid out in pre-order (each node knows
//! where its subtree ends), built once per tokenizer. [`TokenMask`] is a set of token ids.

use crate::dfa::{Counted, DfaTable, DEAD};
use crate::hash::FxHasher;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

#[derive(Debug, Clone, Copy)]
pub(crate) struct TrieNode {
    pub(crate) byte: u8,
    pub(crate) depth: u16,
    /// Index one past this node's subtree.
    pub(crate) end: u32,
    pub(crate) tok_start: u32,
    pub(crate) tok_end: u32,
}

/// The model's tokenizer for forced text (see [`TokenIndex::with_tokenizer`]): the token
/// ids of a UTF-8 text, `None` if it cannot say.
pub type Tokenize = Arc<dyn Fn(&str) -> Option<Vec<u32>> + Send + Sync>;

#[derive(Clone, Default)]
pub(crate) struct TokenizeFn(pub Option<Tokenize>);

impl std::fmt::Debug for TokenizeFn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "Some(tokenizer)" } else { "None" })
    }
}

/// A model vocabulary prepared for mask computation.
#[derive(Debug, Clone)]
pub struct TokenIndex {
    pub(crate) nodes: Vec<TrieNode>,
    pub(crate) tok_ids: Vec<u32>,
    pub(crate) bytes: Vec<Vec<u8>>,
    /// In the trie (not special, not empty).
    pub(crate) in_trie: Vec<bool>,
    pub(crate) eos: Vec<u32>,
    pub(crate) max_depth: usize,
    /// Unique per index (keys the per-grammar lexeme caches).
    pub(crate) uid: u64,
    /// Whether each byte on its own is a token (in the trie).
    pub(crate) single_byte: [bool; 256],
    /// How the model's tokenizer splits forced text.
    pub(crate) tokenize: TokenizeFn,
    /// The trie node of each first byte (0: no token starts with it).
    pub(crate) root_child: [u32; 256],
    /// The trie node of each two first bytes, `[256 * b0 + b1]` (0: none).
    pub(crate) root_child2: Arc<[u32]>,
    /// Lexeme token sets shared by the grammars that use this index.
    pub(crate) lexemes: Arc<Mutex<LexemeStore>>,
    /// The bytes below the nodes with large subtrees (a lexeme state that loops on all of
    /// them takes the whole subtree at once).
    pub(crate) subtree_bytes: Arc<SubtreeBytes>,
    /// Per item automaton of a length-bounded string (by its pattern): the tokens by the
    /// items they hold (see [`ItemTokens`]), built on first use.
    item_tokens: Arc<Mutex<HashMap<Arc<str>, Arc<ItemTokens>>>>,
}

static NEXT_UID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Tokens that leave a lexeme into the same DFA state: (a DFA state before the boundary
/// byte, the byte, [(rest of the token after the byte, token ids)]).
/// Stored flat (the rests' bytes and token ids each in one array), so that a mask reads them
/// in order rather than chasing a pointer per rest.
#[derive(Debug)]
pub(crate) struct BoundaryGroup {
    pub p: u32,
    pub b: u8,
    /// The rests' bytes, concatenated in sorted order; rest `i` ends at `rest_ends[i]`.
    rest_bytes: Vec<u8>,
    rest_ends: Vec<u32>,
    /// The token ids of each rest; rest `i`'s end at `tok_ends[i]`.
    toks: Vec<u32>,
    tok_ends: Vec<u32>,
    /// The first rest after rest `i` whose first byte differs from its first byte (a
    /// rejected first byte skips all the rests that start with it at once).
    next_first: Vec<u32>,
}

impl BoundaryGroup {
    /// A group from its (rest, token) pairs sorted by rest (equal rests adjacent).
    pub(crate) fn from_sorted<'a>(p: u32, b: u8, rests: impl Iterator<Item = (&'a [u8], u32)>) -> Self {
        let mut g = Self { p, b, rest_bytes: Vec::new(), rest_ends: Vec::new(), toks: Vec::new(), tok_ends: Vec::new(), next_first: Vec::new() };
        let mut firsts: Vec<Option<u8>> = Vec::new();
        let mut prev: Option<&[u8]> = None;
        for (r, t) in rests {
            if prev != Some(r) {
                if prev.is_some() {
                    g.tok_ends.push(g.toks.len() as u32);
                }
                g.rest_bytes.extend_from_slice(r);
                g.rest_ends.push(g.rest_bytes.len() as u32);
                firsts.push(r.first().copied());
                prev = Some(r);
            }
            g.toks.push(t);
        }
        if prev.is_some() {
            g.tok_ends.push(g.toks.len() as u32);
        }
        let n = firsts.len();
        g.next_first = vec![n as u32; n];
        for i in (0..n.saturating_sub(1)).rev() {
            g.next_first[i] = if firsts[i] == firsts[i + 1] { g.next_first[i + 1] } else { i as u32 + 1 };
        }
        g
    }
    pub fn len(&self) -> usize {
        self.rest_ends.len()
    }
    /// Rest `i` (in sorted order) and its token ids.
    pub fn rest(&self, i: usize) -> (&[u8], &[u32]) {
        let (r0, t0) = if i == 0 { (0, 0) } else { (self.rest_ends[i - 1] as usize, self.tok_ends[i - 1] as usize) };
        (&self.rest_bytes[r0..self.rest_ends[i] as usize], &self.toks[t0..self.tok_ends[i] as usize])
    }
    /// The first rest after rest `i` that starts with another byte.
    pub fn next_first(&self, i: usize) -> usize {
        self.next_first[i] as usize
    }
}

/// For one DFA state: the tokens that stay inside the lexeme (allowed whatever the parse
/// stack below holds) and, grouped by where they leave it, the tokens that complete the
/// lexeme part-way (checked against the full state at mask time).
#[derive(Debug)]
pub(crate) struct LexemeTokens {
    pub inner: TokenMask,
    pub groups: Vec<BoundaryGroup>,
    /// Distinct rests over all groups (the parser checks per mask).
    pub num_rests: usize,
}

impl TokenIndex {
    /// `token_bytes[id]` is what token `id` decodes to (see
    /// `sapient_tokenizers::Tokenizer::token_bytes`). `eos` ids are allowed exactly when the
    /// constraint is complete; `special` ids (and tokens with no bytes) are never allowed.
    pub fn new(token_bytes: Vec<Vec<u8>>, eos: &[u32], special: &[u32]) -> Self {
        let n = token_bytes.len();
        let mut in_trie = vec![true; n];
        for &s in special.iter().chain(eos) {
            if let Some(x) = in_trie.get_mut(s as usize) {
                *x = false;
            }
        }
        for (i, b) in token_bytes.iter().enumerate() {
            if b.is_empty() {
                in_trie[i] = false;
            }
        }
        let mut order: Vec<u32> = (0..n as u32).filter(|&i| in_trie[i as usize]).collect();
        order.sort_unstable_by(|&a, &b| token_bytes[a as usize].cmp(&token_bytes[b as usize]).then(a.cmp(&b)));
        let mut nodes = vec![TrieNode { byte: 0, depth: 0, end: 0, tok_start: 0, tok_end: 0 }];
        let mut tok_ids = Vec::with_capacity(order.len());
        let mut path: Vec<usize> = vec![0]; // node index per depth
        let mut prev: &[u8] = &[];
        let mut max_depth = 0;
        for &id in &order {
            let bytes = &token_bytes[id as usize];
            let lcp = prev.iter().zip(bytes.iter()).take_while(|(a, b)| a == b).count();
            // Close the nodes below the common prefix.
            while path.len() > lcp + 1 {
                if let Some(ix) = path.pop() {
                    nodes[ix].end = nodes.len() as u32;
                }
            }
            for (d, &byte) in bytes.iter().enumerate().skip(lcp) {
                let t = tok_ids.len() as u32;
                nodes.push(TrieNode { byte, depth: (d + 1) as u16, end: 0, tok_start: t, tok_end: t });
                path.push(nodes.len() - 1);
            }
            tok_ids.push(id);
            if let Some(&last) = path.last() {
                nodes[last].tok_end = tok_ids.len() as u32;
            }
            max_depth = max_depth.max(bytes.len());
            prev = bytes;
        }
        while let Some(ix) = path.pop() {
            nodes[ix].end = nodes.len() as u32;
        }
        tracing::debug!(tokens = order.len(), nodes = nodes.len(), max_depth, "token index built");
        let uid = NEXT_UID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut single_byte = [false; 256];
        for (i, b) in token_bytes.iter().enumerate() {
            if b.len() == 1 && in_trie[i] {
                single_byte[b[0] as usize] = true;
            }
        }
        let mut root_child = [0u32; 256];
        let mut root_child2 = vec![0u32; 1 << 16];
        let mut b0 = 0usize;
        for (i, n) in nodes.iter().enumerate().skip(1) {
            if n.depth == 1 {
                root_child[n.byte as usize] = i as u32;
                b0 = n.byte as usize;
            } else if n.depth == 2 {
                root_child2[b0 << 8 | n.byte as usize] = i as u32;
            }
        }
        let subtree = Arc::new(SubtreeBytes::new(&nodes));
        Self {
            nodes,
            tok_ids,
            bytes: token_bytes,
            in_trie,
            eos: eos.to_vec(),
            max_depth,
            uid,
            single_byte,
            tokenize: TokenizeFn(None),
            root_child,
            root_child2: root_child2.into(),
            lexemes: Default::default(),
            subtree_bytes: subtree,
            item_tokens: Default::default(),
        }
    }

    /// Give the index the model's tokenizer: [`crate::Matcher::forced_token`] then also
    /// returns the tokens of text the constraint forces over several tokens (a key, `":"`),
    /// split as the tokenizer splits that text, all but the last (which could merge with
    /// what follows).
    pub fn with_tokenizer(mut self, tokenize: Tokenize) -> Self {
        self.tokenize = TokenizeFn(Some(tokenize));
        self
    }

    pub fn vocab_size(&self) -> usize {
        self.bytes.len()
    }
    pub fn eos(&self) -> &[u32] {
        &self.eos
    }
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.bytes.get(id as usize).map(|b| b.as_slice())
    }
    /// Trie nodes (for diagnostics and benchmarks).
    pub fn num_nodes(&self) -> usize {
        self.nodes.len()
    }

    /// Walk the trie with a DFA alone from state `s` (see [`LexemeTokens`]).
    pub(crate) fn lexeme_tokens(&self, dfa: &DfaTable, s: u32) -> LexemeTokens {
        if let Some(lt) = dfa.counted().and_then(|c| self.item_tokens(&c.item)?.lexeme_tokens(self, c, s)) {
            return lt;
        }
        let mut w = Walk::new(self, s);
        if !self.walk_lexeme(dfa, 1, self.nodes.len(), &mut w) {
            // Too many to check per mask (a length-bounded lexeme: every longer token leaves
            // it): masks of this state walk the trie instead.
            return LexemeTokens { inner: w.inner, groups: Vec::new(), num_rests: usize::MAX };
        }
        let groups = self.groups_of(w.leaving);
        let num_rests = groups.iter().map(|g| g.len()).sum();
        LexemeTokens { inner: w.inner, groups, num_rests }
    }

    /// Walk the trie nodes `from..to` (the whole trie from node 1, or one node's subtree)
    /// with `dfa`, `w.st` and `w.acc` holding the states and first accept points along the
    /// path above `from`: tokens that stay inside the lexeme go to `w.inner`, those that
    /// leave it (after a point where it could end) to `w.leaving`. `false` when too many
    /// leave to be checked per mask.
    fn walk_lexeme(&self, dfa: &DfaTable, from: usize, to: usize, w: &mut Walk) -> bool {
        match dfa.dense() {
            Some(trans) => self.walk_lexeme_by(dfa, |p, b| trans[p as usize * 256 + b as usize], from, to, w),
            None => self.walk_lexeme_by(dfa, |p, b| dfa.next(p, b), from, to, w),
        }
    }

    /// [`TokenIndex::walk_lexeme`] with `next` the automaton's transitions.
    fn walk_lexeme_by(&self, dfa: &DfaTable, next: impl Fn(u32, u8) -> u32, from: usize, to: usize, w: &mut Walk) -> bool {
        let accepting: &[bool] = &dfa.accepting;
        let nodes = &self.nodes[..];
        let mut i = from;
        while i < to {
            let n = nodes[i];
            let d = n.depth as usize;
            let p = w.st[d - 1];
            let t = next(p, n.byte);
            if t == DEAD {
                // The token leaves the lexeme: possible only after a point where it could end.
                let a = w.acc[d - 1];
                if a != NO_ACCEPT {
                    if w.leaving.len() > 4 * MAX_LEXEME_RESTS {
                        return false;
                    }
                    let (ap, ab, ad) = unpack_accept(a);
                    let into = dfa.next(ap, ab);
                    let (t0, t1) = (n.tok_start as usize, nodes[n.end as usize - 1].tok_end as usize);
                    w.leaving.extend(self.tok_ids[t0..t1].iter().map(|&tok| Leaving { into, p: ap, b: ab, tok, at: ad as u32, head: head(&self.bytes[tok as usize][ad..]) }));
                }
                i = n.end as usize;
                continue;
            }
            w.st[d] = t;
            w.acc[d] = if w.acc[d - 1] != NO_ACCEPT {
                w.acc[d - 1]
            } else if accepting[t as usize] {
                pack_accept(p, n.byte, d)
            } else {
                NO_ACCEPT
            };
            // Every byte taken by the lexeme: allowed whatever follows it.
            let (t0, t1) = (n.tok_start as usize, n.tok_end as usize);
            for &tok in &self.tok_ids[t0..t1] {
                w.inner.set(tok);
            }
            if let Some(below) = self.subtree_bytes.of(i) {
                let lp = w.loops.entry(t).or_insert_with(|| ByteSet::loops_of(dfa, t));
                if below.within(lp) {
                    // Every byte below keeps the automaton in `t`: every token below stays
                    // inside the lexeme.
                    let last = nodes[n.end as usize - 1].tok_end as usize;
                    for &tok in &self.tok_ids[t1..last] {
                        w.inner.set(tok);
                    }
                    i = n.end as usize;
                    continue;
                }
            }
            i += 1;
        }
        true
    }

    /// Leaving tokens grouped by the state they leave into (see [`BoundaryGroup`]).
    fn groups_of(&self, mut leaving: Vec<Leaving>) -> Vec<BoundaryGroup> {
        let rest = |l: &Leaving| &self.bytes[l.tok as usize][l.at as usize..];
        leaving.sort_unstable_by(|a, b| (a.into, a.head).cmp(&(b.into, b.head)).then_with(|| rest(a).cmp(rest(b))));
        let mut groups: Vec<BoundaryGroup> = leaving
            .chunk_by(|a, b| a.into == b.into)
            .map(|g| BoundaryGroup::from_sorted(g[0].p, g[0].b, g.iter().map(|l| (rest(l), l.tok))))
            .collect();
        groups.sort_unstable_by_key(|g| (g.p, g.b));
        groups
    }

    /// The token sets of state `s` of a product `dfa` that is not aliased to its base (its
    /// text still follows the other factor's), from those of the base state it tracks
    /// (`base`, of `alias.shadow[s]`): the two differ only for tokens whose text follows
    /// the other factor past a point where the base could end, or ends in it (there the
    /// product may refuse what the base takes); only those parts of the trie are walked
    /// with the product, every other token keeps the base's verdict. `None` when the base's
    /// sets cannot be used (too many rests, or a rest from a base state with no state
    /// here): the state takes its own walk.
    pub(crate) fn lexeme_tokens_shadowed(&self, dfa: &DfaTable, s: u32, alias: &crate::dfa::Alias, base: &LexemeTokens) -> Option<LexemeTokens> {
        let shadow = |x: u32| alias.shadow.get(x as usize).copied().filter(|&b| b != DEAD);
        if base.num_rests == usize::MAX || alias.base_of.get(s as usize).is_none_or(|&b| b != DEAD) {
            return None;
        }
        let bt = &alias.base;
        let nodes = &self.nodes[..];
        let mut w = Walk::new(self, s);
        w.inner = base.inner.clone();
        // Tokens whose base verdict does not hold here.
        let mut removed = TokenMask::empty(self.bytes.len());
        // Per depth: the base state tracked, and whether the base could end on the path.
        let mut sb = vec![DEAD; self.max_depth + 1];
        let mut base_acc = vec![false; self.max_depth + 1];
        sb[0] = shadow(s)?;
        let mut i = 1;
        while i < nodes.len() {
            let n = nodes[i];
            let d = n.depth as usize;
            let (p, pb) = (w.st[d - 1], sb[d - 1]);
            let t = dfa.next(p, n.byte);
            let sub = n.tok_start as usize..nodes[n.end as usize - 1].tok_end as usize;
            if base_acc[d - 1] {
                // The base could end above: the product's verdict for the whole subtree.
                for &tok in &self.tok_ids[sub] {
                    w.inner.unset(tok);
                    removed.set(tok);
                }
                if !self.walk_lexeme(dfa, i, n.end as usize, &mut w) {
                    return None;
                }
                i = n.end as usize;
                continue;
            }
            if t == DEAD {
                // Nothing could end above: the product refuses the subtree. So does the base
                // if it dies here too; otherwise its verdict goes.
                if bt.next(pb, n.byte) != DEAD {
                    for &tok in &self.tok_ids[sub] {
                        w.inner.unset(tok);
                        removed.set(tok);
                    }
                }
                i = n.end as usize;
                continue;
            }
            if alias.base_of.get(t as usize).is_some_and(|&b| b != DEAD) {
                // Aliased from here on, with nothing that could end above: the product
                // behaves as the base on the whole subtree.
                i = n.end as usize;
                continue;
            }
            // Still following the other factor: tokens ending here stay inside (in both);
            // go on below.
            w.st[d] = t;
            w.acc[d] = if dfa.accepting[t as usize] { pack_accept(p, n.byte, d) } else { NO_ACCEPT };
            sb[d] = shadow(t)?;
            base_acc[d] = bt.accepting[sb[d] as usize];
            i += 1;
        }
        // The base's rests that still hold, with its states named as here.
        let mut groups = Vec::new();
        for g in &base.groups {
            let kept: Vec<(&[u8], u32)> = (0..g.len()).flat_map(|k| {
                let (r, toks) = g.rest(k);
                toks.iter().filter(|&&t| !removed.is_allowed(t)).map(move |&t| (r, t))
            }).collect();
            if kept.is_empty() {
                continue;
            }
            let p = alias.here_of.get(g.p as usize).copied().filter(|&p| p != DEAD)?;
            groups.push(BoundaryGroup::from_sorted(p, g.b, kept.into_iter()));
        }
        groups.extend(self.groups_of(w.leaving));
        let num_rests = groups.iter().map(|g| g.len()).sum();
        Some(LexemeTokens { inner: w.inner, groups, num_rests })
    }

    /// The tokens of this vocabulary by how many of `item`'s strings they hold (`None` for
    /// an item without a pattern to name it by).
    fn item_tokens(&self, item: &DfaTable) -> Option<Arc<ItemTokens>> {
        let name = item.source.clone()?;
        if let Some(t) = self.item_tokens.lock().ok()?.get(&name) {
            return Some(t.clone());
        }
        // Built outside the lock (a walk of the vocabulary); a race builds it twice.
        let t = Arc::new(ItemTokens::new(self, item));
        self.item_tokens.lock().ok()?.insert(name, t.clone());
        Some(t)
    }

    /// The cells of [`LexemeTokens`] of `dfa`'s states: shared by every grammar with this
    /// index whose automaton has the same transitions (a JSON string, a number, a format),
    /// filled on first use.
    pub(crate) fn lexeme_cells(&self, dfa: &DfaTable) -> LexemeCells {
        let fresh = || -> LexemeCells { (0..dfa.num_states()).map(|_| OnceLock::new()).collect() };
        if dfa.num_states() > MAX_STORED_LEXEME_STATES / 8 {
            return fresh();
        }
        // Named by its pattern if it has one, else by its dense table (small ones only:
        // hashing and comparing a large table would cost more than sharing saves; a computed
        // one has no table to name it by, so it is never shared unnamed).
        let mut h = FxHasher::default();
        match (&dfa.source, dfa.dense()) {
            (Some(src), _) => std::hash::Hash::hash(src, &mut h),
            (None, Some(trans)) if dfa.num_states() <= MAX_SHARED_LEXEME_STATES => {
                std::hash::Hash::hash(trans, &mut h);
                std::hash::Hash::hash(&dfa.accepting, &mut h);
            }
            (None, _) => return fresh(),
        }
        let key = std::hash::Hasher::finish(&h);
        let Ok(mut store) = self.lexemes.lock() else { return fresh() };
        if let Some(e) = store.map.get_mut(&key).and_then(|v| v.iter_mut().find(|e| e.name.names(dfa))) {
            e.shared = true;
            return e.cells.clone();
        }
        if store.states + dfa.num_states() > MAX_STORED_LEXEME_STATES {
            // Full: keep the automata more than one grammar has used (the JSON string, the
            // keys of any name, formats), drop the others; if that is not enough, start over.
            store.map.values_mut().for_each(|v| v.retain(|e| e.shared));
            store.map.retain(|_, v| !v.is_empty());
            store.states = store.map.values().flatten().map(|e| e.cells.len()).sum();
            if store.states + dfa.num_states() > MAX_STORED_LEXEME_STATES {
                store.map.clear();
                store.states = 0;
            }
        }
        let name = match &dfa.source {
            Some(src) => StoreKey::Source(src.clone()),
            None => StoreKey::Table(Arc::new(dfa.clone())),
        };
        let c = fresh();
        store.states += dfa.num_states();
        store.map.entry(key).or_default().push(StoreEntry { name, cells: c.clone(), shared: false });
        c
    }
}

/// An automaton's cells in a [`LexemeStore`], and whether a second grammar has asked for them.
#[derive(Debug)]
struct StoreEntry {
    name: StoreKey,
    cells: LexemeCells,
    shared: bool,
}

/// What names an automaton in a [`LexemeStore`].
#[derive(Debug)]
enum StoreKey {
    Source(Arc<str>),
    Table(Arc<DfaTable>),
}

impl StoreKey {
    fn names(&self, d: &DfaTable) -> bool {
        match self {
            StoreKey::Source(s) => d.source.as_ref() == Some(s),
            StoreKey::Table(t) => d.source.is_none() && t.dense().is_some() && t.dense() == d.dense() && t.accepting == d.accepting,
        }
    }
}

/// A token leaving a lexeme (see [`TokenIndex::lexeme_tokens`]).
struct Leaving {
    into: u32,
    p: u32,
    b: u8,
    tok: u32,
    /// Where the token's rest starts.
    at: u32,
    /// The rest's first bytes (see [`head`]), to sort by without reading the rest.
    head: u64,
}

/// The state of a walk of the trie with a lexeme's automaton (see
/// [`TokenIndex::walk_lexeme`]).
struct Walk {
    /// Per depth: the automaton's state, and the first point on the path where the lexeme
    /// could end, packed by `pack_accept` (`NO_ACCEPT`: none yet).
    st: Vec<u32>,
    acc: Vec<u64>,
    inner: TokenMask,
    leaving: Vec<Leaving>,
    /// Per state met at a node with a summarized subtree: the bytes that keep it there
    /// (then the whole subtree stays inside the lexeme).
    loops: crate::hash::FastMap<u32, ByteSet>,
}

impl Walk {
    fn new(index: &TokenIndex, s: u32) -> Self {
        let mut st = vec![0u32; index.max_depth + 1];
        st[0] = s;
        Self { st, acc: vec![NO_ACCEPT; index.max_depth + 1], inner: TokenMask::empty(index.bytes.len()), leaving: Vec::new(), loops: Default::default() }
    }
}

/// The first eight bytes of `rest` as a number that orders as the bytes do (a shorter rest
/// before a longer one with the same bytes; ties broken by the rest itself).
pub(crate) fn head(rest: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    let n = rest.len().min(7);
    w[..n].copy_from_slice(&rest[..n]);
    // The last byte holds the length (up to 7), so "a" sorts before "a\0".
    w[7] = rest.len().min(7) as u8;
    u64::from_be_bytes(w)
}

/// A point where a lexeme could end (DFA state before the byte, the byte, depth after it),
/// packed in one word; `NO_ACCEPT` for none.
const NO_ACCEPT: u64 = u64::MAX;
fn pack_accept(p: u32, b: u8, d: usize) -> u64 {
    (p as u64) << 32 | (b as u64) << 24 | (d as u64 & 0xff_ffff)
}
fn unpack_accept(a: u64) -> (u32, u8, usize) {
    ((a >> 32) as u32, (a >> 24) as u8, (a & 0xff_ffff) as usize)
}

/// A set of bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ByteSet([u64; 4]);

impl ByteSet {
    fn insert(&mut self, b: u8) {
        self.0[b as usize / 64] |= 1 << (b % 64);
    }
    fn union(&mut self, o: &ByteSet) {
        for (a, b) in self.0.iter_mut().zip(o.0) {
            *a |= b;
        }
    }
    fn within(&self, o: &ByteSet) -> bool {
        self.0.iter().zip(o.0).all(|(a, b)| a & !b == 0)
    }
    /// The bytes on which `dfa` stays in state `t`.
    fn loops_of(dfa: &DfaTable, t: u32) -> Self {
        let mut s = Self::default();
        for b in 0..=255u8 {
            if dfa.next(t, b) == t {
                s.insert(b);
            }
        }
        s
    }
}

/// Trie nodes with at least this many nodes below them have their subtree's bytes
/// summarized ([`SubtreeBytes`]).
const SUMMARIZED_SUBTREE: u32 = 16;

/// The bytes below each trie node of at least [`SUMMARIZED_SUBTREE`] descendants (not the
/// node's own byte).
#[derive(Debug, Default)]
pub(crate) struct SubtreeBytes {
    /// Per node: its set in `sets`, or `u32::MAX`.
    at: Vec<u32>,
    sets: Vec<ByteSet>,
}

impl SubtreeBytes {
    fn new(nodes: &[TrieNode]) -> Self {
        // Parents from the pre-order layout (a node's parent is the last node before it one
        // level up), then children before parents: backwards.
        let mut last_at = vec![0u32; nodes.iter().map(|n| n.depth as usize).max().unwrap_or(0) + 1];
        let mut parent = vec![0u32; nodes.len()];
        for (i, n) in nodes.iter().enumerate().skip(1) {
            let d = n.depth as usize;
            parent[i] = last_at[d - 1];
            last_at[d] = i as u32;
        }
        let mut below = vec![ByteSet::default(); nodes.len()];
        let mut out = Self { at: vec![u32::MAX; nodes.len()], sets: Vec::new() };
        for i in (1..nodes.len()).rev() {
            let n = nodes[i];
            let mut mine = below[i];
            if n.end.saturating_sub(i as u32 + 1) >= SUMMARIZED_SUBTREE {
                out.at[i] = out.sets.len() as u32;
                out.sets.push(mine);
            }
            mine.insert(n.byte);
            below[parent[i] as usize].union(&mine);
        }
        out
    }
    #[inline]
    fn of(&self, node: usize) -> Option<&ByteSet> {
        self.sets.get(*self.at.get(node)? as usize)
    }
}

/// Distinct token rests leaving a lexeme state above which its sets are not used (its masks
/// walk the trie with the whole parse instead).
pub(crate) const MAX_LEXEME_RESTS: usize = 4096;

/// One lexeme's [`LexemeTokens`] per DFA state, each computed on first use.
pub(crate) type LexemeCells = Arc<[OnceLock<LexemeTokens>]>;

/// Automata without a pattern and with more states keep their lexeme sets per grammar.
const MAX_SHARED_LEXEME_STATES: usize = 512;
/// DFA states whose cells an index keeps for all grammars before it starts over (about
/// 20 KB each once filled, with a 150k-token vocabulary).
const MAX_STORED_LEXEME_STATES: usize = 8192;

/// The lexeme cells an index shares between grammars, by the hash of the automaton.
#[derive(Debug, Default)]
pub(crate) struct LexemeStore {
    map: HashMap<u64, Vec<StoreEntry>>,
    states: usize,
}

/// A set of allowed token ids (a bitset over the vocabulary).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenMask {
    bits: Vec<u64>,
    len: usize,
}

impl TokenMask {
    pub fn empty(len: usize) -> Self {
        Self { bits: vec![0; len.div_ceil(64)], len }
    }
    #[inline]
    pub fn set(&mut self, id: u32) {
        if (id as usize) < self.len {
            self.bits[id as usize / 64] |= 1 << (id % 64);
        }
    }
    #[inline]
    pub(crate) fn unset(&mut self, id: u32) {
        if (id as usize) < self.len {
            self.bits[id as usize / 64] &= !(1 << (id % 64));
        }
    }
    #[inline]
    pub fn is_allowed(&self, id: u32) -> bool {
        (id as usize) < self.len && self.bits[id as usize / 64] >> (id % 64) & 1 == 1
    }
    pub fn count(&self) -> usize {
        self.bits.iter().map(|w| w.count_ones() as usize).sum()
    }
    pub fn is_empty(&self) -> bool {
        self.bits.iter().all(|&w| w == 0)
    }
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.bits.iter().enumerate().flat_map(|(i, &w)| {
            let mut w = w;
            std::iter::from_fn(move || {
                if w == 0 {
                    return None;
                }
                let b = w.trailing_zeros();
                w &= w - 1;
                Some(i as u32 * 64 + b)
            })
        })
    }
    /// Drop the tokens of `other` (same vocabulary size).
    pub(crate) fn remove_all(&mut self, other: &TokenMask) {
        for (a, b) in self.bits.iter_mut().zip(&other.bits) {
            *a &= !*b;
        }
    }
    /// Add the tokens of `other` (same vocabulary size).
    pub fn union_with(&mut self, other: &TokenMask) {
        for (a, b) in self.bits.iter_mut().zip(&other.bits) {
            *a |= *b;
        }
    }
    /// Set the logits of disallowed tokens to -inf.
    pub fn apply(&self, logits: &mut [f32]) {
        for (i, l) in logits.iter_mut().enumerate() {
            if !self.is_allowed(i as u32) {
                *l = f32::NEG_INFINITY;
            }
        }
    }
}

// ---- Token sets of length-bounded strings without a trie walk per count.
//
// A string of `lo..=hi` characters ([`DfaTable::quoted_repeat`]) has a state per count of
// characters read, and each would need its own walk of the whole vocabulary (milliseconds)
// the first time a generation reaches it. Which tokens a count allows depends only on how
// many characters each token holds: one walk with the unbounded item per vocabulary sorts
// the tokens by that number ([`ItemTokens`]), and a count's sets are then unions of those
// groups.

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

#[cfg(test)]
mod tests {
    /// Sorting by `head` then by the bytes is sorting by the bytes.
    #[test]
    fn head_orders_as_the_bytes() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut rests: Vec<Vec<u8>> = (0..2000).map(|_| (0..next() % 11).map(|_| [0u8, 1, b'a', b'b', 255][(next() % 5) as usize]).collect()).collect();
        rests.extend([vec![], vec![0], vec![0, 0], vec![b'a'], vec![b'a', 0], vec![b'a'; 7], vec![b'a'; 8], vec![b'a'; 9]]);
        let mut by_head = rests.clone();
        by_head.sort_by(|a, b| super::head(a).cmp(&super::head(b)).then_with(|| a.cmp(b)));
        rests.sort();
        assert_eq!(by_head, rests);
    }
}
