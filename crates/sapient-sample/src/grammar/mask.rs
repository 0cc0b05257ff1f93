//! Token masks of a [`Grammar`]'s states, and what they reuse: per lexeme state, the tokens
//! that stay inside the lexeme and those that leave it (from the index, shared between
//! grammars); per parse stack, per state, and per set of stack tops, the masks seen so far.
//! Everything is built on first use.

use super::{Frame, Grammar, GrammarState, DEEPEST};
use crate::constraint::Constraint;
use crate::dfa::{Alias, DfaTable, DEAD};
use crate::builder::Node;
use crate::error::GrammarError;
use crate::hash::FastMap;
use crate::vocab::{BoundaryGroup, LexemeCells, LexemeTokens, TokenIndex, TokenMask, MAX_LEXEME_RESTS};
use std::sync::{Arc, Mutex};

/// Sets of stack tops whose [`TopMask`] a grammar keeps per vocabulary (a mask each: about
/// 19 KB with Qwen's vocabulary); states with other tops take the per-stack path.
const MAX_TOP_MASKS: usize = 256;
/// Trie steps one [`TopMask`]'s walk may take (a few milliseconds); tops whose walk would
/// take more (free text walks the whole trie) take the per-stack path.
const TOP_MASK_BUDGET: usize = 1 << 18;
/// Distinct first bytes of a set of tops above which it takes the per-stack path (a JSON
/// value starts with one of 17).
const MAX_TOP_FIRST_BYTES: usize = 48;

/// What a grammar's masks reuse, per vocabulary, all built on first use: per DFA and DFA
/// state, the lexeme's token sets (shared with other grammars through the index); the masks
/// of stacks, of states, and of stack tops seen so far.
#[derive(Debug)]
pub(super) struct LexemeTable {
    lexemes: Vec<Lexemes>,
    /// Masks of single parse stacks seen so far (shared by every generation with this
    /// grammar and vocabulary).
    stacks: Mutex<FastMap<Vec<Frame>, Arc<StackMask>>>,
    /// Whole masks of the states seen so far (the union over their stacks), shared.
    states: Mutex<FastMap<GrammarState, Arc<TokenMask>>>,
    /// What sets of stack tops allow on their own (see [`TopMask`]; `None`: their walk was
    /// too long), keyed by those tops.
    tops: Mutex<FastMap<GrammarState, Option<Arc<TopMask>>>>,
    /// Whether [`Grammar::prepare_in_background`] has started.
    background: std::sync::atomic::AtomicBool,
}

/// The tokens allowed by a set of stack tops, whatever lies below them. A state whose stacks
/// share a common part `below` and differ in their `tops` (a JSON value about to start: an
/// object, an array, a string, a number, `true`, `false` or `null`, each on the same stack
/// below) allows: the tokens consumed inside the tops with a parse still open after them
/// (`open`); the tokens after which every parse has closed the tops exactly at their end
/// (`closed`), if `below` can go on at all; and the tokens that close the tops part-way and
/// whose remainder `below` accepts (`rests`, checked per state; few: `1,` or `"a",`). Only
/// that check depends on `below`, so everything else is computed once per grammar and
/// vocabulary instead of once per nesting level.
#[derive(Debug)]
struct TopMask {
    open: TokenMask,
    closed: Vec<u32>,
    /// Token bytes after each point where the tops close, sorted, with their tokens.
    rests: BoundaryGroup,
    /// The longest stack (tops alone) an expansion held during the walk: the split is exact
    /// when `below`'s length plus this is within the grammar's stack limit.
    depth: usize,
}

/// One automaton's lexeme cells, and those of the automaton its aliased states behave as.
#[derive(Debug)]
struct Lexemes {
    own: LexemeCells,
    base: Option<(LexemeCells, Arc<Alias>)>,
}

/// Where a lexeme state finds its token sets: the cell, the automaton and state they are
/// built from, and (for an aliased state) how that automaton's states map back.
struct Resolved<'a> {
    cell: &'a std::sync::OnceLock<LexemeTokens>,
    dfa: &'a DfaTable,
    state: u32,
    here_of: Option<&'a [u32]>,
}

impl LexemeTable {
    fn resolve<'a>(&'a self, dfas: &'a [DfaTable], d: usize, s: usize) -> Option<Resolved<'a>> {
        let l = self.lexemes.get(d)?;
        if let Some((cells, alias)) = &l.base {
            if let Some(&b) = alias.base_of.get(s).filter(|&&b| b != DEAD) {
                return Some(Resolved { cell: cells.get(b as usize)?, dfa: &alias.base, state: b, here_of: Some(&alias.here_of) });
            }
        }
        Some(Resolved { cell: l.own.get(s)?, dfa: dfas.get(d)?, state: s as u32, here_of: None })
    }
    fn build<'a>(&'a self, index: &TokenIndex, dfas: &'a [DfaTable], d: usize, s: usize) -> Option<(&'a LexemeTokens, Option<&'a [u32]>)> {
        let r = self.resolve(dfas, d, s)?;
        let lt = r.cell.get_or_init(|| {
            let shadowed = match r.here_of {
                None => self.shadowed(index, d, s, r.dfa),
                Some(_) => None,
            };
            shadowed.unwrap_or_else(|| index.lexeme_tokens(r.dfa, r.state))
        });
        Some((lt, r.here_of))
    }

    /// The token sets of state `s` of automaton `d`, a product not aliased at `s`, from
    /// those of the base state it tracks (see [`TokenIndex::lexeme_tokens_shadowed`]).
    fn shadowed(&self, index: &TokenIndex, d: usize, s: usize, dfa: &DfaTable) -> Option<LexemeTokens> {
        let (cells, alias) = self.lexemes.get(d)?.base.as_ref()?;
        let b = *alias.shadow.get(s)?;
        let base = cells.get(b as usize)?.get_or_init(|| index.lexeme_tokens(&alias.base, b));
        index.lexeme_tokens_shadowed(dfa, s as u32, alias, base)
    }

    fn new(dfas: &[DfaTable], index: &TokenIndex) -> Self {
        Self {
            lexemes: dfas
                .iter()
                .map(|d| Lexemes { own: index.lexeme_cells(d), base: d.alias.as_ref().map(|a| (index.lexeme_cells(&a.base), a.clone())) })
                .collect(),
            stacks: Mutex::new(Default::default()),
            states: Mutex::new(Default::default()),
            tops: Mutex::new(Default::default()),
            background: Default::default(),
        }
    }
}

/// Stack masks kept per grammar and vocabulary before the cache is cleared.
const MAX_STACK_MASKS: usize = 1 << 16;

/// The mask of one parse stack.
#[derive(Debug)]
enum StackMask {
    /// Inside a regex lexeme: the DFA state's inner set plus these boundary tokens.
    Lexeme { dfa: u32, state: u32, extra: Vec<u32> },
    /// These tokens.
    Tokens(Vec<u32>),
    Full(TokenMask),
}

/// Token indexes kept per grammar before the oldest tables are dropped.
const MAX_INDEXES: usize = 4;

#[derive(Debug, Clone, Default)]
pub(super) struct LexemeCache(Arc<Mutex<Vec<IndexTable>>>);

/// A token index's uid and its tables.
type IndexTable = (u64, Arc<LexemeTable>);


impl Grammar {
    pub(super) fn lexeme_table(&self, index: &TokenIndex) -> Arc<LexemeTable> {
        let Ok(mut c) = self.lexemes.0.lock() else {
            // A poisoned lock: work without the shared table.
            return Arc::new(LexemeTable::new(&self.dfas, index));
        };
        if let Some((_, t)) = c.iter().find(|(uid, _)| *uid == index.uid) {
            return t.clone();
        }
        if c.len() >= MAX_INDEXES {
            c.remove(0);
        }
        let t = Arc::new(LexemeTable::new(&self.dfas, index));
        c.push((index.uid, t.clone()));
        t
    }

    /// Compute, for this vocabulary, the mask of the grammar's start state (what it needs
    /// is built on the way: the token sets of the lexeme states it meets, shared through the
    /// index with every grammar that has the same automata). Everything else is built when
    /// a mask first needs it, so a grammar's first mask costs what that state needs, not
    /// what the whole grammar could. Returns the time taken. [`crate::Matcher::new`] calls
    /// it; later generations with the same `Grammar` (or a clone) share what was built.
    pub fn prepare(&self, index: &TokenIndex) -> std::time::Duration {
        let t = std::time::Instant::now();
        if let Err(e) = self.mask_of(index, &self.start) {
            tracing::debug!(error = %e, "start mask not prepared");
        }
        t.elapsed()
    }

    /// Walk the trie with `tops` alone (a state whose parses stop, accepting, where the tops
    /// close): see [`TopMask`]. `None` when the walk would take more than `budget` steps (a
    /// choice of free text walks the whole trie); the steps taken are subtracted.
    fn top_mask(&self, index: &TokenIndex, tops: &GrammarState, budget: &mut usize) -> Result<Option<TopMask>, GrammarError> {
        let mut open = TokenMask::empty(index.vocab_size());
        let mut closed = Vec::new();
        // Tokens that go on after the tops close, and where their rest starts.
        let mut rests: Vec<(u32, u32)> = Vec::new();
        let mut states = vec![GrammarState::default(); index.max_depth + 1];
        states[0] = tops.clone();
        DEEPEST.with(|d| d.set(0));
        let mut i = 1;
        while i < index.nodes.len() {
            let Some(b) = budget.checked_sub(1) else { return Ok(None) };
            *budget = b;
            let n = index.nodes[i];
            let d = n.depth as usize;
            let (lo, hi) = states.split_at_mut(d);
            if !self.advance(&lo[d - 1], n.byte, &mut hi[0])? {
                i = n.end as usize;
                continue;
            }
            let s = &hi[0];
            let has_closed = s.stacks().any(|x| x.is_empty());
            let has_open = s.stacks().any(|x| !x.is_empty());
            let toks = &index.tok_ids[n.tok_start as usize..n.tok_end as usize];
            if has_open {
                for &t in toks {
                    open.set(t);
                }
            } else {
                closed.extend_from_slice(toks);
            }
            if has_closed {
                // The tokens below this node go on after the tops close.
                let (t0, t1) = (n.tok_end as usize, index.nodes[n.end as usize - 1].tok_end as usize);
                rests.extend(index.tok_ids[t0..t1].iter().map(|&tok| (tok, d as u32)));
            }
            i = if has_open { i + 1 } else { n.end as usize };
        }
        let depth = DEEPEST.with(|d| d.get()).max(tops.stacks().map(|s| s.len()).max().unwrap_or(0));
        let rest = |tok: u32, at: u32| &index.bytes[tok as usize][at as usize..];
        let mut rests: Vec<(u64, u32, u32)> = rests.into_iter().map(|(tok, at)| (crate::vocab::head(rest(tok, at)), tok, at)).collect();
        rests.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| rest(a.1, a.2).cmp(rest(b.1, b.2))));
        let rests = BoundaryGroup::from_sorted(0, 0, rests.iter().map(|&(_, tok, at)| (rest(tok, at), tok)));
        Ok(Some(TopMask { open, closed, rests, depth }))
    }

    /// The mask of a state with several stacks that share a part below, from what their
    /// tops allow on their own ([`TopMask`], computed on first use and kept); `None` when
    /// the tops' walk is too long or the tops go too deep.
    pub(super) fn split_mask(&self, index: &TokenIndex, table: &LexemeTable, state: &GrammarState) -> Result<Option<TokenMask>, GrammarError> {
        let (Some(first), Some(last)) = (state.stacks().next(), state.stacks().last()) else { return Ok(None) };
        // Stacks are sorted: the part common to all is the common part of the first and last.
        let k = first.iter().zip(last).take_while(|(a, b)| a == b).count();
        let mut tops = GrammarState::default();
        for st in state.stacks() {
            tops.push_stack(&st[k..]);
        }
        // Which tops are worth a walk of their own is decided on a miss ([`Self::top_mask_of`]).
        if tops.num_stacks() < 2 {
            return Ok(None);
        }
        let Some(tm) = self.top_mask_of(index, table, tops)? else { return Ok(None) };
        if k + tm.depth > self.max_depth {
            return Ok(None);
        }
        let mut mask = tm.open.clone();
        let mut below = GrammarState::default();
        self.expand(&first[..k], &mut below)?;
        below.normalize();
        if below.num_stacks() == 0 {
            return Ok(Some(mask));
        }
        for &t in &tm.closed {
            mask.set(t);
        }
        let mut extra = Vec::new();
        self.rests_from(&mut vec![below], &tm.rests, &mut extra)?;
        for t in extra {
            mask.set(t);
        }
        Ok(Some(mask))
    }

    /// Whether every stack of `tops` is non-empty and topped by a lexeme that has consumed
    /// nothing yet, and all of them together start with at most [`MAX_TOP_FIRST_BYTES`]
    /// bytes.
    fn tops_at_start(&self, tops: &GrammarState) -> bool {
        let mut first = [false; 256];
        for st in tops.stacks() {
            let Some(f) = st.last() else { return false };
            if *f != self.enter(f.node) {
                return false;
            }
            for b in 0..=255u8 {
                if self.consume(f, b).is_some() {
                    first[b as usize] = true;
                }
            }
        }
        first.iter().filter(|&&x| x).count() <= MAX_TOP_FIRST_BYTES
    }

    /// Build, on a thread of its own, the lexeme token sets of every state of the grammar's
    /// automata not built yet (the start states first), so that later masks find them
    /// ready; the thread stops when the grammar (every clone of it) is dropped, and is
    /// started once per grammar and vocabulary. [`crate::Matcher::new`] calls it after
    /// [`Grammar::prepare`]; a mask that needs a set before the thread reaches it builds it
    /// itself.
    pub fn prepare_in_background(&self, index: &Arc<TokenIndex>) {
        let table = self.lexeme_table(index);
        if table.background.swap(true, std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let weak = Arc::downgrade(&table);
        drop(table);
        let (dfas, index) = (self.dfas.clone(), index.clone());
        let run = move || {
            idle_priority();
            for (d, s) in nearest_first(&dfas) {
                let Some(table) = weak.upgrade() else { return };
                table.build(&index, &dfas, d, s);
            }
        };
        if let Err(e) = std::thread::Builder::new().name("sapient-grammar-prepare".into()).spawn(run) {
            tracing::debug!(error = %e, "no background preparation (masks build what they need)");
        }
    }

    /// Everything [`Grammar::prepare_in_background`] builds, built now on this thread (for
    /// callers that want no mask to pay for a lexeme set later). Returns the time taken.
    pub fn prepare_all(&self, index: &TokenIndex) -> std::time::Duration {
        let t = std::time::Instant::now();
        let table = self.lexeme_table(index);
        for (d, dfa) in self.dfas.iter().enumerate() {
            for s in 0..dfa.num_states() {
                table.build(index, &self.dfas, d, s);
            }
        }
        t.elapsed()
    }

    /// The [`TopMask`] of `tops`, from the table or computed (and kept, while the table
    /// holds fewer than [`MAX_TOP_MASKS`]).
    fn top_mask_of(&self, index: &TokenIndex, table: &LexemeTable, tops: GrammarState) -> Result<Option<Arc<TopMask>>, GrammarError> {
        let full = match table.tops.lock() {
            Ok(c) => match c.get(&tops) {
                Some(m) => return Ok(m.clone()),
                None => c.len() >= MAX_TOP_MASKS,
            },
            Err(_) => true,
        };
        // An empty stack would be the stack below itself: never a split of a state. Only
        // tops where values are about to start are worth a walk of their own: they recur at
        // every nesting level (a top inside its lexeme is cheaper per stack), and only when
        // they start with few bytes (free text would walk the whole trie).
        if full || !self.tops_at_start(&tops) {
            return Ok(None);
        }
        let mut budget = TOP_MASK_BUDGET;
        let m = self.top_mask(index, &tops, &mut budget)?.map(Arc::new);
        if let Ok(mut c) = table.tops.lock() {
            c.insert(tops, m.clone());
        }
        Ok(m)
    }

    /// Add to `extra` the tokens of each rest of `g` that `states[0]` accepts (rests sharing
    /// a prefix share its parse; a rejected prefix skips every rest that has it). `states`
    /// holds the states along the previous rest (`states[k]`: after its first k bytes).
    fn rests_from(&self, states: &mut Vec<GrammarState>, g: &BoundaryGroup, extra: &mut Vec<u32>) -> Result<(), GrammarError> {
        let mut prev: &[u8] = &[];
        let mut ok_depth = 0usize;
        let mut dead_at: Option<usize> = None;
        let mut i = 0;
        while i < g.len() {
            let (rest, toks) = g.rest(i);
            let l = prev.iter().zip(rest.iter()).take_while(|(a, b)| a == b).count();
            prev = rest;
            if dead_at.is_some_and(|d| l > d) {
                i += 1;
                continue; // the same rejected prefix
            }
            dead_at = None;
            let mut k = l.min(ok_depth);
            while k < rest.len() {
                if states.len() <= k + 1 {
                    states.push(GrammarState::default());
                }
                let (a, b) = states.split_at_mut(k + 1);
                if !self.advance(&a[k], rest[k], &mut b[0])? {
                    dead_at = Some(k);
                    break;
                }
                k += 1;
            }
            ok_depth = k;
            match dead_at {
                None => extra.extend_from_slice(toks),
                // A rejected first byte: no rest starting with it is accepted.
                Some(0) => {
                    i = g.next_first(i);
                    continue;
                }
                Some(_) => {}
            }
            i += 1;
        }
        Ok(())
    }

    /// The mask of a state holding one parse stack, from the cache or computed.
    fn stack_mask(&self, index: &TokenIndex, table: &LexemeTable, state: &GrammarState) -> Result<Arc<StackMask>, GrammarError> {
        if let Some(m) = table.stacks.lock().ok().and_then(|c| c.get(&state.frames).cloned()) {
            return Ok(m);
        }
        let m = match self.lexeme_mask(index, table, state)? {
            Some(m) => m,
            None => {
                // A literal on top: every allowed token starts with a prefix of its rest.
                let prefix: &[u8] = match state.frames.last().map(|f| (&self.nodes[f.node as usize], f.pos as usize)) {
                    Some((Node::Bytes(b), p)) => b.get(p..).unwrap_or_default(),
                    _ => &[],
                };
                if prefix.is_empty() {
                    let full = index.mask_by_walk(self, state)?;
                    if full.count() <= 4096 {
                        StackMask::Tokens(full.iter().collect())
                    } else {
                        StackMask::Full(full)
                    }
                } else {
                    let mut toks = Vec::new();
                    index.walk_from(self, state, prefix, |t| toks.push(t))?;
                    StackMask::Tokens(toks)
                }
            }
        };
        let m = Arc::new(m);
        if let Ok(mut c) = table.stacks.lock() {
            if c.len() >= MAX_STACK_MASKS {
                c.clear();
            }
            c.insert(state.frames.clone(), m.clone());
        }
        Ok(m)
    }

    /// Add a stack's mask to `out` (`None`: nothing yet).
    fn add_stack_mask(&self, index: &TokenIndex, table: &LexemeTable, m: &StackMask, out: &mut Option<TokenMask>) {
        match m {
            StackMask::Lexeme { dfa, state, extra } => {
                let inner = table.resolve(&self.dfas, *dfa as usize, *state as usize).and_then(|r| r.cell.get());
                let o = match (out.as_mut(), inner) {
                    (Some(o), Some(lt)) => {
                        o.union_with(&lt.inner);
                        o
                    }
                    (Some(o), None) => o,
                    (None, Some(lt)) => out.insert(lt.inner.clone()),
                    (None, None) => out.insert(TokenMask::empty(index.vocab_size())),
                };
                for &t in extra {
                    o.set(t);
                }
            }
            StackMask::Tokens(v) => {
                let o = out.get_or_insert_with(|| TokenMask::empty(index.vocab_size()));
                for &t in v {
                    o.set(t);
                }
            }
            StackMask::Full(f) => match out.as_mut() {
                Some(o) => o.union_with(f),
                None => *out = Some(f.clone()),
            },
        }
    }

    /// One parse whose top is a regex lexeme (strings, numbers, regexes): tokens that stay
    /// inside the lexeme come from the per-DFA-state set; only tokens that complete the
    /// lexeme part-way are checked against the state, each distinct rest of a token once
    /// (sorted, so rests sharing a prefix share its parse).
    fn lexeme_mask(&self, index: &TokenIndex, table: &LexemeTable, state: &GrammarState) -> Result<Option<StackMask>, GrammarError> {
        let Some(top) = state.frames.last().copied() else { return Ok(None) };
        let Node::Dfa(d) = self.nodes[top.node as usize] else { return Ok(None) };
        let Some((lt, here_of)) = table.build(index, &self.dfas, d as usize, top.pos as usize) else { return Ok(None) };
        if lt.num_rests > MAX_LEXEME_RESTS {
            // Most tokens leave the lexeme at once (e.g. whitespace): the walk prunes faster.
            return Ok(None);
        }
        let mut extra = Vec::new();
        let mut before = state.clone();
        let mut states: Vec<GrammarState> = vec![GrammarState::default()];
        for g in &lt.groups {
            // An aliased state's sets name the base automaton's states: map them back.
            let p = here_of.map_or(Some(g.p), |h| h.get(g.p as usize).copied().filter(|&p| p != DEAD));
            let (Some(t), Some(p)) = (before.frames.last_mut(), p) else { continue };
            t.pos = p;
            if !self.advance(&before, g.b, &mut states[0])? {
                continue;
            }
            self.rests_from(&mut states, g, &mut extra)?;
        }
        Ok(Some(StackMask::Lexeme { dfa: d, state: top.pos, extra }))
    }


    /// A state's mask (see [`Constraint::fast_mask`]), kept per state.
    pub(super) fn mask_of(&self, index: &TokenIndex, state: &GrammarState) -> Result<Option<Arc<TokenMask>>, GrammarError> {
        let table = self.lexeme_table(index);
        if let Some(m) = table.states.lock().ok().and_then(|c| c.get(state).cloned()) {
            return Ok(Some(m));
        }
        let mut mask: Option<TokenMask> = None;
        if state.ends.len() == 1 {
            let m = self.stack_mask(index, &table, state)?;
            self.add_stack_mask(index, &table, &m, &mut mask);
        } else if let Some(m) = self.split_mask(index, &table, state)? {
            mask = Some(m);
        } else {
            let mut single = GrammarState::default();
            for st in state.stacks() {
                single.clear();
                single.push_stack(st);
                let m = self.stack_mask(index, &table, &single)?;
                self.add_stack_mask(index, &table, &m, &mut mask);
            }
        }
        let mut mask = mask.unwrap_or_else(|| TokenMask::empty(index.vocab_size()));
        if self.is_accepting(state) {
            for &e in index.eos() {
                mask.set(e);
            }
        }
        let mask = Arc::new(mask);
        if let Ok(mut c) = table.states.lock() {
            // Bounded by memory: about 32 MiB of masks per grammar and vocabulary.
            let limit = ((32usize << 20) / index.vocab_size().div_ceil(8).max(1)).max(16);
            if c.len() >= limit {
                c.clear();
            }
            c.insert(state.clone(), mask.clone());
        }
        Ok(Some(mask))
    }
}

/// Run the calling thread only when a CPU would otherwise be idle (Linux `SCHED_IDLE`), so
/// background preparation never takes time from the model or the masks it would speed up.
fn idle_priority() {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: sched_setscheduler on the calling thread (pid 0) with a valid parameter;
        // it changes only this thread's scheduling class.
        let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
        if r != 0 {
            tracing::debug!("background preparation runs at normal priority (SCHED_IDLE refused)");
        }
    }
}

/// Every (automaton, state) of `dfas`, by how many bytes from its start state a state is
/// first reached (all the start states first, then the states one byte away, ...): the
/// order in which a generation is likely to need them.
fn nearest_first(dfas: &[DfaTable]) -> Vec<(usize, usize)> {
    let mut levels: Vec<Vec<(usize, usize)>> = Vec::new();
    for (d, t) in dfas.iter().enumerate() {
        let mut depth = vec![u32::MAX; t.num_states()];
        let mut queue = std::collections::VecDeque::from([t.start as usize]);
        if let Some(x) = depth.get_mut(t.start as usize) {
            *x = 0;
        }
        while let Some(s) = queue.pop_front() {
            let k = depth[s] as usize;
            if levels.len() <= k {
                levels.resize_with(k + 1, Vec::new);
            }
            levels[k].push((d, s));
            for b in 0..=255u8 {
                let n = t.next(s as u32, b);
                if n != DEAD && depth[n as usize] == u32::MAX {
                    depth[n as usize] = depth[s] + 1;
                    queue.push_back(n as usize);
                }
            }
        }
    }
    levels.concat()
}
