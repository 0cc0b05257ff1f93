//! Regular expressions compiled to a byte-level DFA table.
//!
//! `regex-automata` builds a dense DFA (all-matches semantics, anchored at the start); we
//! copy the states reachable from the start into a plain `u32` table of 256 transitions per
//! state, drop every state that cannot reach a match (so "not dead" means "can still
//! complete"), and record which states accept at end of input. The table is what the
//! grammar engine and the token walk use: one array load per byte.

use crate::error::GrammarError;
use regex_automata::dfa::{dense, Automaton, StartKind};
use regex_automata::util::start;
use regex_automata::{Anchored, MatchKind};
use std::collections::HashMap;
use std::sync::Arc;

/// No transition (the byte is rejected).
pub(crate) const DEAD: u32 = u32::MAX;

/// Most DFA states a regex may need: compiling one that needs more stops once the
/// determinizer's table would hold this many states of the regex's alphabet (or once it
/// would take more than 16 MiB, for wide alphabets), with [`GrammarError::RegexTooLarge`].
/// This bounds a compile's work by a count of states, whatever the pattern.
pub const MAX_REGEX_STATES: usize = 200_000;
/// The longest regex pattern compiled (a JSON Schema `pattern` too).
pub const MAX_PATTERN_BYTES: usize = 64 << 10;
/// Heap bounds on compiling one regex: its NFA, and the DFA determinized from it.
const MAX_NFA_BYTES: usize = 16 << 20;
const MAX_DFA_BYTES: usize = 16 << 20;

/// Automata of patterns kept for the whole process: the JSON string and number, the
/// formats and the any-key automaton recur in every schema, and compiling them is most of a
/// small schema's compile time. Bounded: automata with at most this many states, and this
/// many states in all (about 1 KiB each; then the cache starts over).
const MAX_CACHED_STATES: usize = 4096;
const MAX_CACHED_TOTAL: usize = 1 << 15;

/// The automaton of `pattern` ([`DfaTable::new`]; `json_safe` leaves out `"`, `\` and
/// control bytes), from the process-wide cache or compiled.
pub(crate) fn compiled(pattern: &str, json_safe: bool) -> Result<DfaTable, GrammarError> {
    compiled_by(pattern, json_safe, || {
        let forbid = |b: u8| json_safe && (b == b'"' || b == b'\\' || b < 0x20);
        DfaTable::new(pattern, &forbid)
    })
}

/// [`compiled`], with `build` making the automaton of `pattern` when the cache has none
/// (a construction faster than the regex compiler's, for the same language).
pub(crate) fn compiled_by(pattern: &str, json_safe: bool, build: impl FnOnce() -> Result<DfaTable, GrammarError>) -> Result<DfaTable, GrammarError> {
    type Cache = std::sync::Mutex<([crate::hash::FastMap<String, DfaTable>; 2], usize)>;
    static CACHE: std::sync::OnceLock<Cache> = std::sync::OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(t) = cache.lock().ok().and_then(|c| c.0[usize::from(json_safe)].get(pattern).cloned()) {
        return Ok(t);
    }
    let mut t = build()?;
    t.source = Some(format!("{}{pattern}", if json_safe { "json-safe:" } else { "any:" }).into());
    if t.num_states() <= MAX_CACHED_STATES {
        if let Ok(mut c) = cache.lock() {
            let (maps, total) = &mut *c;
            if *total + t.num_states() > MAX_CACHED_TOTAL {
                maps.iter_mut().for_each(|m| m.clear());
                *total = 0;
            }
            *total += t.num_states();
            maps[usize::from(json_safe)].insert(pattern.to_string(), t.clone());
        }
    }
    Ok(t)
}

#[derive(Debug, Clone)]
pub(crate) struct DfaTable {
    /// The transitions (shared: a table is cloned into every grammar that uses it).
    pub trans: Trans,
    /// The input read so far (from the start state) is a full match.
    pub accepting: Arc<[bool]>,
    /// Some byte leads to a live state.
    pub can_consume: Arc<[bool]>,
    pub start: u32,
    /// Set on `a.product(b, false, ..)`: the states where the text has left `b`'s language
    /// for good behave as `a`'s states from there on, so their token sets are `a`'s (and
    /// shared wherever `a` is: the keys of an object that are not its listed names).
    pub alias: Option<std::sync::Arc<Alias>>,
    /// The pattern it was compiled from (by [`compiled`]), naming it whatever its size.
    pub source: Option<std::sync::Arc<str>>,
}

/// The transitions of a [`DfaTable`].
#[derive(Debug, Clone)]
pub(crate) enum Trans {
    /// `t[s * 256 + byte]`: next state or `DEAD`.
    Dense(Arc<[u32]>),
    /// A [`DfaTable::quoted_repeat`] automaton: computed from its item's on each step, as
    /// it has a state per count and item state (a string of up to 4000 characters would
    /// otherwise be a table of 48,000 states of 256 transitions). Its token sets come from
    /// the item's too (see `crate::vocab::ItemTokens`).
    Counted(Arc<Counted>),
}

/// The layout of a [`DfaTable::quoted_repeat`] automaton: state 0 before the opening quote,
/// `1 + i * per_count + k` after `i` items and then the item's `k`-th inner state (`k = 0`:
/// between items), the last state after the closing quote.
#[derive(Debug)]
pub(crate) struct Counted {
    pub item: DfaTable,
    pub lo: u32,
    pub hi: Option<u32>,
    /// Counts kept apart (no upper bound: counts from `lo` on are one).
    pub cap: u32,
    pub per_count: u32,
    /// Per item state: its number inside an item (`DEAD` for the item's ends).
    inner: Vec<u32>,
    /// Per number inside an item: the item state.
    item_state: Vec<u32>,
    /// The state after the closing quote.
    last: u32,
}

impl Counted {
    /// The transition the dense table of the construction would hold (see
    /// [`DfaTable::quoted_repeat`]), states that cannot complete left out.
    #[inline]
    fn next(&self, s: u32, b: u8) -> u32 {
        let m = self.per_count;
        if s == 0 {
            return if b == b'"' { 1 } else { DEAD };
        }
        if s >= self.last {
            return DEAD;
        }
        let (i, k) = ((s - 1) / m, (s - 1) % m);
        if k == 0 && b == b'"' {
            return if i >= self.lo { self.last } else { DEAD };
        }
        let t = self.item.next(self.item_state[k as usize], b);
        if t == DEAD {
            return DEAD;
        }
        let full = self.hi.is_some_and(|h| i >= h);
        if self.item.accepting[t as usize] {
            // An item completed: one more (no upper bound: counts stop at the cap).
            if full {
                DEAD
            } else {
                1 + (i + 1).min(self.cap) * m
            }
        } else if full {
            // No room for the item begun: it could never complete.
            DEAD
        } else {
            1 + i * m + self.inner[t as usize]
        }
    }
}

/// The states of a product that behave as the states of one of its factors (see
/// [`DfaTable::alias`]).
#[derive(Debug)]
pub(crate) struct Alias {
    pub base: DfaTable,
    /// Per state here: the base's state it behaves as, or `DEAD`.
    pub base_of: Vec<u32>,
    /// Per base state: the state here that behaves as it, or `DEAD`.
    pub here_of: Vec<u32>,
    /// For a product (`a.product(b, false, ..)`), per state here: the state of the base
    /// (`a`) it tracks, aliased or not (empty otherwise). A state not aliased yet takes the
    /// token sets of the state it tracks, corrected where the text still follows `b`.
    pub shadow: Vec<u32>,
}

impl DfaTable {
    /// Compile `pattern` so that a byte string is accepted iff the whole string matches.
    /// Bytes in `forbidden` are removed from the language (used to keep pattern-constrained
    /// JSON strings free of quotes, backslashes and control characters).
    pub fn new(pattern: &str, forbidden: &dyn Fn(u8) -> bool) -> Result<Self, GrammarError> {
        Self::with_max_states(pattern, forbidden, MAX_REGEX_STATES)
    }

    /// [`DfaTable::new`] with at most `max_states` DFA states (see [`MAX_REGEX_STATES`]).
    pub(crate) fn with_max_states(pattern: &str, forbidden: &dyn Fn(u8) -> bool, max_states: usize) -> Result<Self, GrammarError> {
        use regex_automata::nfa::thompson;
        // The innermost cause says what is wrong with the pattern.
        let bad = |e: &dyn std::error::Error| {
            let mut msg = e.to_string();
            let mut src = e.source();
            while let Some(s) = src {
                msg = s.to_string();
                src = s.source();
            }
            GrammarError::InvalidRegex { pattern: pattern.to_string(), message: msg }
        };
        let too_large = || GrammarError::RegexTooLarge { pattern: pattern.to_string(), states: max_states };
        if pattern.len() > MAX_PATTERN_BYTES {
            return Err(GrammarError::TooLarge {
                what: format!("a regex of {} bytes", pattern.len()),
                limit: MAX_PATTERN_BYTES,
            });
        }
        let nfa = thompson::Compiler::new()
            // Counted repetitions multiply: `(a{100}){100}...` or a JSON string's
            // `minLength: 1e9` would build an NFA of gigabytes without this bound.
            .configure(thompson::Config::new().nfa_size_limit(Some(MAX_NFA_BYTES)).which_captures(thompson::WhichCaptures::None))
            .build(pattern)
            .map_err(|e| bad(&e))?;
        // A dense state is one transition (4 bytes) per class of the alphabet, rounded up to
        // a power of two: the table limit that stops the determinizer at `max_states` states.
        let stride = nfa.byte_classes().alphabet_len().next_power_of_two();
        let table_limit = max_states.saturating_mul(stride * 4).min(MAX_DFA_BYTES);
        let dfa = dense::Builder::new()
            .configure(
                dense::Config::new()
                    .match_kind(MatchKind::All)
                    .start_kind(StartKind::Anchored)
                    .dfa_size_limit(Some(table_limit))
                    .determinize_size_limit(Some(MAX_DFA_BYTES)),
            )
            .build_from_nfa(&nfa)
            .map_err(|e| if e.is_size_limit_exceeded() { too_large() } else { bad(&e) })?;
        let start = dfa
            .start_state(&start::Config::new().anchored(Anchored::Yes))
            .map_err(|e| bad(&e))?;
        // Breadth-first copy of the reachable states.
        let mut ids: HashMap<regex_automata::util::primitives::StateID, u32> = HashMap::new();
        let mut order = vec![start];
        ids.insert(start, 0);
        let mut trans: Vec<u32> = Vec::new();
        let mut accepting = Vec::new();
        let mut i = 0;
        while i < order.len() {
            let s = order[i];
            i += 1;
            accepting.push(dfa.is_match_state(dfa.next_eoi_state(s)));
            let base = trans.len();
            trans.resize(base + 256, DEAD);
            for b in 0..=255u8 {
                if forbidden(b) {
                    continue;
                }
                let t = dfa.next_state(s, b);
                if dfa.is_dead_state(t) || dfa.is_quit_state(t) {
                    continue;
                }
                let next = match ids.get(&t) {
                    Some(&n) => n,
                    None => {
                        let n = order.len() as u32;
                        if order.len() >= max_states {
                            return Err(too_large());
                        }
                        ids.insert(t, n);
                        order.push(t);
                        n
                    }
                };
                trans[base + b as usize] = next;
            }
        }
        Self::finish(trans, accepting, pattern)
    }

    /// Drop the states that cannot reach an accepting one (so "not dead" means "can still
    /// complete"); `what` names the language in the error when nothing is left.
    fn finish(mut trans: Vec<u32>, accepting: Vec<bool>, what: &str) -> Result<Self, GrammarError> {
        let n = accepting.len();
        // Live = can reach an accepting state: backwards search from the accepting ones, over
        // the reversed edges laid out flat (each state's predecessors in one run).
        let mut starts = vec![0u32; n + 1];
        for &t in trans.iter().filter(|&&t| t != DEAD) {
            starts[t as usize + 1] += 1;
        }
        for i in 0..n {
            starts[i + 1] += starts[i];
        }
        let mut fill = starts.clone();
        let mut preds = vec![0u32; starts[n] as usize];
        for (s, row) in trans.chunks_exact(256).enumerate() {
            for &t in row.iter().filter(|&&t| t != DEAD) {
                preds[fill[t as usize] as usize] = s as u32;
                fill[t as usize] += 1;
            }
        }
        let mut live = accepting.clone();
        let mut stack: Vec<u32> = (0..n as u32).filter(|&s| accepting[s as usize]).collect();
        while let Some(t) = stack.pop() {
            for &s in &preds[starts[t as usize] as usize..starts[t as usize + 1] as usize] {
                if !live[s as usize] {
                    live[s as usize] = true;
                    stack.push(s);
                }
            }
        }
        if !live[0] {
            return Err(GrammarError::Unsatisfiable(format!("regex {what:?} matches no string")));
        }
        if live.iter().any(|&l| !l) {
            for t in trans.iter_mut() {
                if *t != DEAD && !live[*t as usize] {
                    *t = DEAD;
                }
            }
        }
        let can_consume = trans.chunks_exact(256).map(|row| row.iter().any(|&t| t != DEAD)).collect();
        Ok(Self { trans: Trans::Dense(trans.into()), accepting: accepting.into(), can_consume, start: 0, alias: None, source: None })
    }

    /// `"`, then from `lo` to `hi` (no bound: `None`) strings of `item`, then `"`: a JSON
    /// string of bounded length when `item` is one JSON character or escape, built directly
    /// (the regex compiler takes a second for a few thousand characters). `None` when some
    /// string of `item` is the prefix of another (the construction needs each item's end to
    /// be known where it is reached) or `item` takes `"`.
    pub(crate) fn quoted_repeat(item: &DfaTable, lo: u32, hi: Option<u32>, what: &str) -> Result<Option<Self>, GrammarError> {
        let n = item.num_states();
        let terminal = (0..n).all(|s| !item.accepting[s] || !item.can_consume[s]);
        if !terminal || item.accepting[item.start as usize] || item.next(item.start, b'"') != DEAD {
            return Ok(None);
        }
        // Inside an item: its states that are not ends, numbered 0.. with the start first.
        let mut inner = vec![DEAD; n];
        let mut m = 0u32;
        for s in std::iter::once(item.start as usize).chain(0..n) {
            if !item.accepting[s] && inner[s] == DEAD {
                inner[s] = m;
                m += 1;
            }
        }
        // Counts 0..=cap items (no upper bound: the count stops at `lo`).
        let cap = hi.unwrap_or(lo) as usize;
        let states = (cap + 1).saturating_mul(m as usize).saturating_add(2);
        if states > MAX_REGEX_STATES {
            return Err(GrammarError::RegexTooLarge { pattern: what.to_string(), states: MAX_REGEX_STATES });
        }
        if hi.is_some_and(|h| h < lo) {
            return Err(GrammarError::Unsatisfiable(format!("regex {what:?} matches no string")));
        }
        // State 0: before the opening quote; 1 + i * m + inner[s]: i items read, then the
        // item's state s; the last: after the closing quote. The transitions are computed
        // ([`Counted::next`]); which states accept or can go on is known from the layout.
        let last = states as u32 - 1;
        let mut item_state = vec![0u32; m as usize];
        for (s, &k) in inner.iter().enumerate() {
            if k != DEAD {
                item_state[k as usize] = s as u32;
            }
        }
        let mut accepting = vec![false; states];
        accepting[last as usize] = true;
        // Every state but the last can go on, except inside an item with no room left for it.
        let mut can_consume = vec![true; states];
        can_consume[last as usize] = false;
        if let Some(h) = hi {
            let full = 1 + h as usize * m as usize;
            can_consume[full + 1..last as usize].iter_mut().for_each(|c| *c = false);
        }
        let c = Counted { item: item.clone(), lo, hi, cap: cap as u32, per_count: m, inner, item_state, last };
        Ok(Some(Self { trans: Trans::Counted(Arc::new(c)), accepting: accepting.into(), can_consume: can_consume.into(), start: 0, alias: None, source: None }))
    }

    /// Exactly the byte strings `words` (a trie: no regex to compile); `forbidden` bytes
    /// are removed from the language as in [`DfaTable::new`], so a word holding one is left
    /// out. `what` names the language in the error when nothing is left.
    pub(crate) fn words<'a>(words: impl IntoIterator<Item = &'a [u8]>, forbidden: &dyn Fn(u8) -> bool, what: &str) -> Result<Self, GrammarError> {
        let mut trans = vec![DEAD; 256];
        let mut accepting = vec![false];
        for w in words {
            if w.iter().any(|&b| forbidden(b)) {
                continue;
            }
            let mut s = 0usize;
            for &b in w {
                let t = trans[s * 256 + b as usize];
                s = if t == DEAD {
                    let n = accepting.len();
                    if n >= MAX_REGEX_STATES {
                        return Err(GrammarError::RegexTooLarge { pattern: what.to_string(), states: MAX_REGEX_STATES });
                    }
                    trans[s * 256 + b as usize] = n as u32;
                    trans.resize(trans.len() + 256, DEAD);
                    accepting.push(false);
                    n
                } else {
                    t as usize
                };
            }
            accepting[s] = true;
        }
        Self::finish(trans, accepting, what)
    }

    /// The strings of `self` that are also in `other` (`keep_other`), or that are not
    /// (`!keep_other`), as one table of at most `max_states` states. `what` names the result
    /// in errors.
    pub(crate) fn product(&self, other: &DfaTable, keep_other: bool, max_states: usize, what: &str) -> Result<Self, GrammarError> {
        let mut ids: crate::hash::FastMap<(u32, u32), u32> = Default::default();
        let mut order = vec![(self.start, other.start)];
        ids.insert((self.start, other.start), 0);
        let (mut trans, mut accepting) = (Vec::new(), Vec::new());
        let mut i = 0;
        while i < order.len() {
            let (a, b) = order[i];
            i += 1;
            let b_acc = b != DEAD && other.accepting[b as usize];
            accepting.push(self.accepting[a as usize] && b_acc == keep_other);
            let base = trans.len();
            trans.resize(base + 256, DEAD);
            for byte in 0..=255u8 {
                let na = self.next(a, byte);
                if na == DEAD {
                    continue;
                }
                let nb = if b == DEAD { DEAD } else { other.next(b, byte) };
                if nb == DEAD && keep_other {
                    continue;
                }
                let next = match ids.get(&(na, nb)) {
                    Some(&n) => n,
                    None => {
                        if order.len() >= max_states {
                            return Err(GrammarError::RegexTooLarge { pattern: what.to_string(), states: max_states });
                        }
                        let n = order.len() as u32;
                        ids.insert((na, nb), n);
                        order.push((na, nb));
                        n
                    }
                };
                trans[base + byte as usize] = next;
            }
        }
        let mut t = Self::finish(trans, accepting, what)?;
        if !keep_other && self.alias.is_none() {
            let shadow = order.iter().map(|&(a, _)| a).collect();
            let mut alias = Alias { base: self.clone(), base_of: vec![DEAD; order.len()], here_of: vec![DEAD; self.num_states()], shadow };
            for (i, &(a, b)) in order.iter().enumerate() {
                if b == DEAD {
                    alias.base_of[i] = a;
                    alias.here_of[a as usize] = i as u32;
                }
            }
            if alias.base_of.iter().any(|&a| a != DEAD) {
                t.alias = Some(std::sync::Arc::new(alias));
            }
        }
        Ok(t)
    }

    /// `self`, with its states that behave as the states of `any` (an automaton of any
    /// text: `(?s:.)*`) aliased to them (see [`DfaTable::alias`]), so that their token sets
    /// are those of `any`'s states, built once for every grammar: a pattern searched in a
    /// string (`.*x.*`) is any text once `x` has been read. Left as it is when it has an
    /// alias already, when no state behaves so, or when it is too large to look.
    pub(crate) fn alias_any(mut self, any: &DfaTable) -> Self {
        const MAX_SCANNED: usize = 2048;
        let n = self.num_states();
        if self.alias.is_some() || n > MAX_SCANNED || (self.source.is_some() && self.source == any.source) {
            return self;
        }
        let live = |t: &DfaTable, s: u32| -> [u64; 4] {
            let mut m = [0u64; 4];
            for b in 0..=255u8 {
                if t.next(s, b) != DEAD {
                    m[b as usize / 64] |= 1 << (b % 64);
                }
            }
            m
        };
        let any_start = live(any, any.start);
        let mut base_of = vec![DEAD; n];
        let mut pairs: Vec<(u32, u32)> = Vec::new();
        let mut found: crate::hash::FastMap<u32, u32> = Default::default();
        for u in 0..n as u32 {
            if base_of[u as usize] != DEAD || !self.accepting[u as usize] || self.accepting[u as usize] != any.accepting[any.start as usize] || live(&self, u) != any_start {
                continue;
            }
            // Walk both automata together from (u, any's start): every pair must agree on
            // acceptance and on which bytes lead on, and each state here meet one state of
            // `any` only.
            found.clear();
            pairs.clear();
            pairs.push((u, any.start));
            let mut ok = true;
            while let Some((d, a)) = pairs.pop() {
                match found.get(&d) {
                    Some(&x) if x == a => continue,
                    Some(_) => ok = false,
                    None if base_of[d as usize] != DEAD && base_of[d as usize] != a => ok = false,
                    None => {}
                }
                if !ok || self.accepting[d as usize] != any.accepting[a as usize] {
                    ok = false;
                    break;
                }
                found.insert(d, a);
                for b in 0..=255u8 {
                    let (nd, na) = (self.next(d, b), any.next(a, b));
                    if (nd == DEAD) != (na == DEAD) {
                        ok = false;
                        break;
                    }
                    if nd != DEAD && found.get(&nd) != Some(&na) {
                        pairs.push((nd, na));
                    }
                }
                if !ok {
                    break;
                }
            }
            if ok {
                for (&d, &a) in &found {
                    base_of[d as usize] = a;
                }
            }
        }
        if base_of.iter().all(|&a| a == DEAD) {
            return self;
        }
        let mut here_of = vec![DEAD; any.num_states()];
        for (d, &a) in base_of.iter().enumerate() {
            if a != DEAD && here_of[a as usize] == DEAD {
                here_of[a as usize] = d as u32;
            }
        }
        self.alias = Some(Arc::new(Alias { base: any.clone(), base_of, here_of, shadow: Vec::new() }));
        self
    }

    /// Text over any bytes around `stop` (KMP automaton; state k = the last k bytes read
    /// are `stop`'s first k). `until`: the text ends at the first occurrence of `stop`
    /// (included); otherwise: any text that does not contain `stop`.
    pub fn stop_string(stop: &[u8], until: bool) -> Result<Self, GrammarError> {
        if stop.is_empty() {
            return Err(GrammarError::Unsatisfiable("empty stop string".into()));
        }
        let n = stop.len();
        // KMP failure function.
        let mut fail = vec![0usize; n];
        let mut k = 0usize;
        for i in 1..n {
            while k > 0 && stop[i] != stop[k] {
                k = fail[k - 1];
            }
            if stop[i] == stop[k] {
                k += 1;
            }
            fail[i] = k;
        }
        let states = if until { n + 1 } else { n };
        let mut trans = vec![DEAD; states * 256];
        for s in 0..n {
            for b in 0..=255u8 {
                let mut k = s;
                while k > 0 && stop[k] != b {
                    k = fail[k - 1];
                }
                if stop[k] == b {
                    k += 1;
                }
                if k < states {
                    trans[s * 256 + b as usize] = k as u32;
                }
            }
        }
        let accepting = (0..states).map(|s| if until { s == n } else { true }).collect();
        let can_consume = (0..states).map(|s| s < n).collect();
        Ok(Self { trans: Trans::Dense(trans.into()), accepting, can_consume, start: 0, alias: None, source: None })
    }

    #[inline]
    pub fn next(&self, s: u32, b: u8) -> u32 {
        match &self.trans {
            Trans::Dense(t) => t[s as usize * 256 + b as usize],
            Trans::Counted(c) => c.next(s, b),
        }
    }

    /// The dense table of transitions (`None` for a computed one).
    pub fn dense(&self) -> Option<&[u32]> {
        match &self.trans {
            Trans::Dense(t) => Some(t),
            Trans::Counted(_) => None,
        }
    }

    /// How a [`DfaTable::quoted_repeat`] automaton's states count items.
    pub fn counted(&self) -> Option<&Arc<Counted>> {
        match &self.trans {
            Trans::Counted(c) => Some(c),
            Trans::Dense(_) => None,
        }
    }

    pub fn num_states(&self) -> usize {
        self.accepting.len()
    }

    /// Whole-string match.
    pub fn matches(&self, bytes: &[u8]) -> bool {
        let mut s = self.start;
        for &b in bytes {
            s = self.next(s, b);
            if s == DEAD {
                return false;
            }
        }
        self.accepting[s as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn none(_: u8) -> bool {
        false
    }

    #[test]
    fn whole_string_semantics_and_alternatives() {
        // All-matches semantics keeps the longer alternative alive after "a".
        let d = DfaTable::new("a|ab|abc", &none).unwrap();
        for (s, ok) in [("a", true), ("ab", true), ("abc", true), ("", false), ("abcd", false), ("b", false)] {
            assert_eq!(d.matches(s.as_bytes()), ok, "{s:?}");
        }
        let d = DfaTable::new(r"[0-9]{2,3}-[a-z]+", &none).unwrap();
        assert!(d.matches(b"12-ab") && d.matches(b"123-x"));
        assert!(!d.matches(b"1-ab") && !d.matches(b"1234-ab") && !d.matches(b"12-"));
    }

    #[test]
    fn dead_states_are_pruned() {
        // After "x" nothing can complete "xy$" with a 'z': the transition is absent.
        let d = DfaTable::new("xy", &none).unwrap();
        let s = d.next(d.start, b'x');
        assert_ne!(s, DEAD);
        assert_eq!(d.next(s, b'z'), DEAD);
        assert!(d.can_consume[s as usize] && !d.accepting[s as usize]);
        let end = d.next(s, b'y');
        assert!(d.accepting[end as usize] && !d.can_consume[end as usize]);
    }

    #[test]
    fn unicode_is_utf8() {
        let d = DfaTable::new("é+", &none).unwrap();
        assert!(d.matches("ééé".as_bytes()));
        assert!(!d.matches(&[0xC3]));
        let d = DfaTable::new(".", &none).unwrap();
        assert!(d.matches("€".as_bytes()) && !d.matches(&[0xFF]));
    }

    #[test]
    fn stop_strings() {
        let until = DfaTable::stop_string(b"abab", true).unwrap();
        for (s, ok) in [("abab", true), ("xxababab", false), ("xaababab", false), ("aabab", true), ("aba", false), ("ab ab", false)] {
            assert_eq!(until.matches(s.as_bytes()), ok, "{s:?}");
        }
        let without = DfaTable::stop_string(b"abab", false).unwrap();
        for (s, ok) in [("", true), ("aba", true), ("abaab", true), ("xabab", false), ("abaaba", true), ("ababa", false)] {
            assert_eq!(without.matches(s.as_bytes()), ok, "{s:?}");
        }
    }

    #[test]
    fn dfa_size_is_bounded_by_a_count_of_states() {
        // "The (k+1)-th byte from the end is an a": a DFA must remember the last k+1 bytes,
        // and regex-automata's DFAs report a match one byte late, so theirs remember k+2:
        // 2^(k+2) states, and the start state. It grows exponentially with k.
        let pattern = |k: u32| format!("[ab]*a[ab]{{{k}}}");
        let limit = 1000;
        for k in 0..=7 {
            let d = DfaTable::with_max_states(&pattern(k), &none, limit).unwrap();
            assert_eq!(d.num_states(), (1 << (k + 2)) + 1, "k = {k}");
        }
        // 1025 states and more are refused, an exponential blow-up at once: the determinizer
        // stops at the limit instead of building 2^26 states.
        for k in [8, 24] {
            let e = DfaTable::with_max_states(&pattern(k), &none, limit).unwrap_err();
            assert_eq!(e, GrammarError::RegexTooLarge { pattern: pattern(k), states: limit }, "k = {k}");
        }
    }

    #[test]
    fn errors_are_reported() {
        match DfaTable::new("(ab", &none) {
            Err(GrammarError::InvalidRegex { message, .. }) => assert!(message.contains("unclosed group"), "{message}"),
            other => panic!("{other:?}"),
        }
        // Only a quote could match but quotes are forbidden.
        assert!(matches!(DfaTable::new("\"", &|b| b == b'"'), Err(GrammarError::Unsatisfiable(_))));
        assert!(DfaTable::new(r"[^\x00-\x{10FFFF}]", &none).is_err());
    }

    /// A product's aliased states behave exactly as their base states: same acceptance,
    /// and every byte leads to aliases of the same next states (or nowhere in both).
    #[test]
    fn product_aliases_behave_as_their_base() {
        let json_safe = |b: u8| b == b'"' || b == b'\\' || b < 0x20;
        let any = DfaTable::new("(?s:.)*", &json_safe).unwrap();
        let listed = DfaTable::new("a|ab|abc|é", &json_safe).unwrap();
        let keys = any.product(&listed, false, 1000, "keys").unwrap();
        let alias = keys.alias.as_ref().expect("aliased states");
        let mut seen = 0;
        for (s, &b) in alias.base_of.iter().enumerate() {
            if b == DEAD {
                continue;
            }
            seen += 1;
            assert_eq!(alias.here_of[b as usize], s as u32);
            assert_eq!(keys.accepting[s], any.accepting[b as usize]);
            for x in 0..=255u8 {
                let (n, nb) = (keys.next(s as u32, x), any.next(b, x));
                assert_eq!(n == DEAD, nb == DEAD, "state {s} byte {x}");
                if n != DEAD {
                    assert_eq!(alias.base_of[n as usize], nb, "state {s} byte {x}");
                }
            }
        }
        assert!(seen >= 2, "{seen} aliased states");
        // Within the listed names nothing is aliased: "ab" is still being spelled.
        let st = b"ab".iter().fold(keys.start, |s, &x| keys.next(s, x));
        assert_eq!(alias.base_of[st as usize], DEAD);
        assert!(keys.alias.is_some() && any.product(&listed, true, 1000, "both").unwrap().alias.is_none());
    }
}
