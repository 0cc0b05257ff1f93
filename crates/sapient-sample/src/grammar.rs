//! The built-in constraint: an [`Expr`] (literals, regexes, choices, sequences,
//! repetitions with separators, ranged integers and floats, stop-on-string, free JSON, JSON
//! Schema) compiled into an arena of nodes (`builder.rs`) and run as a small pushdown
//! automaton. Its state is a set of stacks (alternatives still alive, so ambiguous grammars
//! such as `"a" | "ab"` work); the top frame of every stack is a node that consumes bytes (a
//! literal, a DFA lexeme, a number, a stop string). Regex lexemes run on a byte table
//! (`dfa.rs`), one load per byte.
//!
//! Building fails with a [`GrammarError`] for invalid or unsatisfiable regexes and
//! schemas; at run time an expansion that would loop (a grammar recursing without
//! consuming input) is reported as [`GrammarError::Loop`] instead of looping.

use crate::builder::{Builder, JsonOptions, Node, NodeId};
use crate::number;
use crate::constraint::Constraint;
use crate::dfa::{DfaTable, DEAD};
use crate::error::GrammarError;
use crate::vocab::{LexemeTokens, TokenIndex, TokenMask};
use std::sync::{Arc, Mutex, OnceLock};

/// A constraint expression. Build with the constructors and combinators, then compile with
/// [`Grammar::new`].
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    /// Exactly this text.
    Literal(String),
    /// A regular expression (`regex` crate syntax) that the whole text must match.
    Regex(String),
    /// One of the alternatives.
    Choice(Vec<Expr>),
    /// Each in turn.
    Seq(Vec<Expr>),
    /// `item (separator item)*`, between `min` and `max` items.
    Repeat { item: Box<Expr>, separator: Option<Box<Expr>>, min: usize, max: Option<usize> },
    /// A decimal integer (`-?(0|[1-9][0-9]*)`) in `[min, max]`.
    Integer { min: Option<i64>, max: Option<i64> },
    /// A decimal number (`-?(0|[1-9][0-9]*)(\.[0-9]+)?`, at most 15 integer and 12
    /// fractional digits) in `[min, max]`.
    Float { min: Option<f64>, max: Option<f64> },
    /// Any text up to and including the first occurrence of this string.
    StopAt(String),
    /// Any text that does not contain this string.
    TextWithout(String),
    /// Free text, or tool calls: see [`Expr::text_or_tool_calls`].
    ToolCalls { open: String, close: String, tools: Vec<Tool> },
    /// Any JSON value.
    Json,
    /// JSON text valid against this JSON Schema (see `schema.rs` for what is supported).
    JsonSchema(serde_json::Value),
}

impl Expr {
    pub fn literal(s: impl Into<String>) -> Self {
        Expr::Literal(s.into())
    }
    pub fn regex(p: impl Into<String>) -> Self {
        Expr::Regex(p.into())
    }
    pub fn choice<I: IntoIterator<Item = Expr>>(alts: I) -> Self {
        Expr::Choice(alts.into_iter().collect())
    }
    /// One of these strings.
    pub fn one_of<S: AsRef<str>, I: IntoIterator<Item = S>>(strings: I) -> Self {
        Expr::Choice(strings.into_iter().map(|s| Expr::literal(s.as_ref())).collect())
    }
    pub fn seq<I: IntoIterator<Item = Expr>>(parts: I) -> Self {
        Expr::Seq(parts.into_iter().collect())
    }
    pub fn integer(min: Option<i64>, max: Option<i64>) -> Self {
        Expr::Integer { min, max }
    }
    pub fn float(min: Option<f64>, max: Option<f64>) -> Self {
        Expr::Float { min, max }
    }
    pub fn stop_at(s: impl Into<String>) -> Self {
        Expr::StopAt(s.into())
    }
    pub fn json() -> Self {
        Expr::Json
    }
    /// Any text that does not contain `s`.
    pub fn text_without(s: impl Into<String>) -> Self {
        Expr::TextWithout(s.into())
    }
    /// What a chat model with tools may answer: free text (without `open`), or text
    /// ending in `open` followed by one or more tool calls, each
    /// `open "\n" {"name": NAME, "arguments": ARGS} "\n" close` (separated by "\n"), where
    /// `ARGS` follows the schema of the tool named. Qwen2.5's template uses
    /// `open = "<tool_call>"`, `close = "</tool_call>"`. The switch is made by the model:
    /// both branches stay open until it writes `open`. The JSON layout is the grammar's
    /// ([`JsonOptions`]).
    pub fn text_or_tool_calls(open: impl Into<String>, close: impl Into<String>, tools: Vec<Tool>) -> Self {
        Expr::ToolCalls { open: open.into(), close: close.into(), tools }
    }
    pub fn json_schema(schema: serde_json::Value) -> Self {
        Expr::JsonSchema(schema)
    }
    /// `self` then `next`.
    pub fn then(self, next: Expr) -> Self {
        match self {
            Expr::Seq(mut v) => {
                v.push(next);
                Expr::Seq(v)
            }
            e => Expr::Seq(vec![e, next]),
        }
    }
    /// `self` or `other`.
    pub fn or(self, other: Expr) -> Self {
        match self {
            Expr::Choice(mut v) => {
                v.push(other);
                Expr::Choice(v)
            }
            e => Expr::Choice(vec![e, other]),
        }
    }
    /// `self` repeated `min..=max` times (unbounded if `max` is `None`).
    pub fn repeat(self, min: usize, max: Option<usize>) -> Self {
        Expr::Repeat { item: Box::new(self), separator: None, min, max }
    }
    /// `self (sep self)*`, `min..=max` items.
    pub fn separated_by(self, sep: Expr, min: usize, max: Option<usize>) -> Self {
        Expr::Repeat { item: Box::new(self), separator: Some(Box::new(sep)), min, max }
    }
    /// `self` or nothing.
    pub fn optional(self) -> Self {
        Expr::Choice(vec![self, Expr::Seq(vec![])])
    }
}

/// A tool a model may call: its name and the JSON Schema of its arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    pub parameters: serde_json::Value,
}

impl Tool {
    pub fn new(name: impl Into<String>, parameters: serde_json::Value) -> Self {
        Self { name: name.into(), parameters }
    }
}

fn tool_calls(b: &mut Builder, open: &str, close: &str, tools: &[Tool]) -> Result<NodeId, GrammarError> {
    if tools.is_empty() {
        return Err(GrammarError::Unsatisfiable("a tool-call grammar needs at least one tool".into()));
    }
    if open.is_empty() {
        return Err(GrammarError::Unsatisfiable("the tool-call trigger is empty".into()));
    }
    let calls: Vec<serde_json::Value> = tools
        .iter()
        .map(|t| {
            serde_json::json!({
                "type": "object",
                "properties": {"name": {"const": t.name}, "arguments": t.parameters},
                "required": ["name", "arguments"],
                "additionalProperties": false
            })
        })
        .collect();
    let call = crate::schema::compile(b, &serde_json::json!({"anyOf": calls}))?;
    let text = b.stop_string(open, false)?;
    let lead = b.stop_string(open, true)?;
    let (nl, open_lit, close_lit) = (b.lit("\n"), b.lit(open), b.lit(close));
    let first = b.seq(vec![nl, call, nl, close_lit]);
    let another = b.seq(vec![nl, open_lit, nl, call, nl, close_lit]);
    let more = b.add(Node::Repeat { item: another, sep: None, min: 0, max: u32::MAX });
    let with_calls = b.seq(vec![lead, first, more]);
    Ok(b.choice(vec![text, with_calls]))
}

pub(crate) fn build(b: &mut Builder, e: &Expr) -> Result<NodeId, GrammarError> {
    Ok(match e {
        Expr::Literal(s) => b.lit(s),
        Expr::Regex(p) => b.regex(p, false)?,
        Expr::Choice(v) => {
            if v.is_empty() {
                return Err(GrammarError::Unsatisfiable("empty choice".into()));
            }
            let ids = v.iter().map(|x| build(b, x)).collect::<Result<Vec<_>, _>>()?;
            b.choice(ids)
        }
        Expr::Seq(v) => {
            let ids = v.iter().map(|x| build(b, x)).collect::<Result<Vec<_>, _>>()?;
            b.seq(ids)
        }
        Expr::Repeat { item, separator, min, max } => {
            let max = max.map_or(u32::MAX, |m| m.min(u32::MAX as usize - 1) as u32);
            let min = (*min).min(u32::MAX as usize - 1) as u32;
            if min > max {
                return Err(GrammarError::Unsatisfiable(format!("repetition between {min} and {max} times")));
            }
            let item = build(b, item)?;
            let sep = separator.as_ref().map(|s| build(b, s)).transpose()?;
            b.add(Node::Repeat { item, sep, min, max })
        }
        Expr::Integer { min, max } => b.int(min.unwrap_or(i64::MIN), max.unwrap_or(i64::MAX), false)?,
        Expr::Float { min, max } => {
            b.num(min.unwrap_or(f64::NEG_INFINITY), max.unwrap_or(f64::INFINITY), false, false)?
        }
        Expr::StopAt(s) => b.stop_string(s, true)?,
        Expr::TextWithout(s) => b.stop_string(s, false)?,
        Expr::ToolCalls { open, close, tools } => tool_calls(b, open, close, tools)?,
        Expr::Json => b.json_value()?,
        Expr::JsonSchema(v) => crate::schema::compile(b, v)?,
    })
}


/// One frame of a parse stack. `pos` and `aux` mean different things per node kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Frame {
    node: u32,
    pos: u32,
    aux: u64,
}

/// A [`Grammar`]'s parse state: the stacks still alive, stored flat (`frames`, split by
/// `ends`). An empty stack means the input so far is complete. Stacks are kept sorted and
/// deduplicated, so equal states compare and hash equal (masks are cached by state).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct GrammarState {
    frames: Vec<Frame>,
    ends: Vec<u32>,
}

impl GrammarState {
    fn stacks(&self) -> impl Iterator<Item = &[Frame]> {
        let mut start = 0usize;
        self.ends.iter().map(move |&e| {
            let s = &self.frames[start..e as usize];
            start = e as usize;
            s
        })
    }
    fn push_stack(&mut self, s: &[Frame]) {
        self.frames.extend_from_slice(s);
        self.ends.push(self.frames.len() as u32);
    }
    fn clear(&mut self) {
        self.frames.clear();
        self.ends.clear();
    }
    /// How many parses are alive (0 = dead).
    pub fn num_stacks(&self) -> usize {
        self.ends.len()
    }
    fn normalize(&mut self) {
        if self.ends.len() < 2 {
            return;
        }
        // Usually already sorted and unique: check before copying.
        let mut prev: Option<&[Frame]> = None;
        let mut sorted = true;
        for s in self.stacks() {
            if prev.is_some_and(|p| p >= s) {
                sorted = false;
                break;
            }
            prev = Some(s);
        }
        if sorted {
            return;
        }
        let mut stacks: Vec<Vec<Frame>> = self.stacks().map(|s| s.to_vec()).collect();
        stacks.sort_unstable();
        stacks.dedup();
        self.clear();
        for s in &stacks {
            self.push_stack(s);
        }
    }
}

/// Reused buffers for expansion (one set per thread, so `advance` does not allocate).
#[derive(Default)]
struct Scratch {
    st: Vec<Frame>,
    work: Vec<Frame>,
    work_ends: Vec<usize>,
    copy: Vec<Frame>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
    /// The longest stack any expansion on this thread has held since it was last reset
    /// (see [`Grammar::top_mask`]).
    static DEEPEST: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Most stacks alive at once before `TooAmbiguous`.
const MAX_STACKS: usize = 512;
/// Distinct token rests leaving a lexeme above which its precomputed set is not used.
const MAX_LEXEME_RESTS: usize = 4096;
/// Choice nodes whose tops' tokens are computed ahead (a mask each: about 19 KB with Qwen's
/// vocabulary); states at the others take the per-stack path.
const MAX_CHOICE_TOPS: usize = 256;
/// Trie steps all the choice nodes' walks may take together (about 0.1 s at most), a fifth
/// of them for one; a choice whose walk would take more (free text walks the whole trie)
/// takes the per-stack path.
const CHOICE_TOPS_BUDGET: usize = 1 << 20;
/// Expansion steps for one byte before `Loop`.
const EXPAND_BUDGET: usize = 100_000;

/// A compiled [`Expr`].
#[derive(Debug, Clone)]
pub struct Grammar {
    pub(crate) nodes: Vec<Node>,
    pub(crate) dfas: Vec<DfaTable>,
    start: GrammarState,
    /// Deepest stack ([`JsonOptions::max_stack_depth`]); a parse that would go deeper is
    /// dropped (a byte that would need it is not allowed).
    max_depth: usize,
    /// Per token index, DFA and DFA state: tokens inside the lexeme and boundary groups.
    lexemes: LexemeCache,
}

/// Per DFA, per DFA state: the lexeme's token sets, built once (by [`Grammar::prepare`] or
/// on first use).
#[derive(Debug)]
struct LexemeTable {
    lexemes: Vec<Vec<OnceLock<LexemeTokens>>>,
    /// Masks of single parse stacks seen so far (shared by every generation with this
    /// grammar and vocabulary).
    stacks: Mutex<FastMap<Vec<Frame>, Arc<StackMask>>>,
    /// Whole masks of the states seen so far (the union over their stacks), shared.
    states: Mutex<FastMap<GrammarState, Arc<TokenMask>>>,
    /// What the tops of the stacks that enter each choice node allow on their own (see
    /// [`TopMask`]), keyed by those tops; built once per grammar and vocabulary.
    tops: OnceLock<FastMap<GrammarState, TopMask>>,
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
    rests: crate::vocab::BoundaryGroup,
    /// The longest stack (tops alone) an expansion held during the walk: the split is exact
    /// when `below`'s length plus this is within the grammar's stack limit.
    depth: usize,
}

/// A hash map keyed by parse states with a cheap multiplicative hash (the keys are small
/// integers; no untrusted input chooses them).
type FastMap<K, V> = std::collections::HashMap<K, V, std::hash::BuildHasherDefault<FxHasher>>;

/// The rustc "Fx" hash: rotate, xor, multiply per word.
#[derive(Default, Clone, Copy)]
struct FxHasher(u64);

impl FxHasher {
    #[inline]
    fn add(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl std::hash::Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        for &b in chunks.remainder() {
            self.add(b as u64);
        }
    }
    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(i as u64);
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(i as u64);
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

impl LexemeTable {
    fn new(dfas: &[DfaTable]) -> Self {
        Self {
            lexemes: dfas.iter().map(|d| (0..d.num_states()).map(|_| OnceLock::new()).collect()).collect(),
            stacks: Mutex::new(Default::default()),
            states: Mutex::new(Default::default()),
            tops: OnceLock::new(),
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
struct LexemeCache(Arc<Mutex<Vec<IndexTable>>>);

/// A token index's uid and its tables.
type IndexTable = (u64, Arc<LexemeTable>);


impl Grammar {
    /// Compile an expression.
    pub fn new(e: &Expr) -> Result<Self, GrammarError> {
        Self::with_options(e, JsonOptions::default())
    }
    pub fn with_options(e: &Expr, json: JsonOptions) -> Result<Self, GrammarError> {
        let mut b = Builder::new(json);
        if json.max_stack_depth == 0 || json.max_stack_depth > crate::builder::MAX_STACK_DEPTH {
            return Err(GrammarError::InvalidOption(format!(
                "JsonOptions::max_stack_depth must be between 1 and {}, got {}",
                crate::builder::MAX_STACK_DEPTH,
                json.max_stack_depth
            )));
        }
        let root = build(&mut b, e)?;
        Self::from_parts_with(b.nodes, b.dfas, root, json.max_stack_depth as usize)
    }
    /// A regex constraint.
    pub fn regex(pattern: &str) -> Result<Self, GrammarError> {
        Self::new(&Expr::regex(pattern))
    }
    /// Any JSON value.
    pub fn json() -> Result<Self, GrammarError> {
        Self::new(&Expr::Json)
    }
    /// JSON valid against `schema`.
    pub fn json_schema(schema: &serde_json::Value) -> Result<Self, GrammarError> {
        Self::new(&Expr::JsonSchema(schema.clone()))
    }

    #[cfg(test)]
    pub(crate) fn from_parts(nodes: Vec<Node>, dfas: Vec<DfaTable>, root: NodeId) -> Result<Self, GrammarError> {
        Self::from_parts_with(nodes, dfas, root, JsonOptions::default().max_stack_depth as usize)
    }

    pub(crate) fn from_parts_with(mut nodes: Vec<Node>, dfas: Vec<DfaTable>, root: NodeId, max_depth: usize) -> Result<Self, GrammarError> {
        if !prune_unproductive(&mut nodes, root) {
            return Err(GrammarError::Unsatisfiable(
                "the grammar accepts no finite text (a recursion that cannot stop, e.g. a required property of its own type nested deeper than JsonOptions::max_ref_depth)".into(),
            ));
        }
        check_grammar(&nodes, &dfas)?;
        let mut g = Self { nodes, dfas, start: GrammarState::default(), max_depth, lexemes: LexemeCache::default() };
        let mut st = GrammarState::default();
        g.expand(&[g.enter(root)], &mut st)?;
        st.normalize();
        if st.num_stacks() == 0 {
            let deeper = Self { max_depth: usize::MAX, ..g.clone() };
            let mut st2 = GrammarState::default();
            if deeper.expand(&[deeper.enter(root)], &mut st2).is_ok() && st2.num_stacks() > 0 {
                return Err(GrammarError::TooLarge { what: "the parse stack the grammar starts with (JsonOptions::max_stack_depth)".into(), limit: max_depth });
            }
            return Err(GrammarError::Unsatisfiable("the grammar accepts nothing".into()));
        }
        g.start = st;
        Ok(g)
    }

    /// Number of nodes (for diagnostics).
    pub fn num_nodes(&self) -> usize {
        self.nodes.len()
    }

    /// DFA states over all the grammar's regex lexemes (for diagnostics).
    pub fn num_dfa_states(&self) -> usize {
        self.dfas.iter().map(|d| d.num_states()).sum()
    }

    fn lexeme_table(&self, index: &TokenIndex) -> Arc<LexemeTable> {
        let Ok(mut c) = self.lexemes.0.lock() else {
            // A poisoned lock: work without the shared table.
            return Arc::new(LexemeTable::new(&self.dfas));
        };
        if let Some((_, t)) = c.iter().find(|(uid, _)| *uid == index.uid) {
            return t.clone();
        }
        if c.len() >= MAX_INDEXES {
            c.remove(0);
        }
        let t = Arc::new(LexemeTable::new(&self.dfas));
        c.push((index.uid, t.clone()));
        t
    }

    /// Compute ahead, for this vocabulary, what masks need per regex-lexeme state (the tokens
    /// that stay inside the lexeme and those that leave it, per DFA state), so that no mask
    /// computed later pays for it. Returns the time taken (nothing is redone on a second
    /// call). [`crate::Matcher::new`] calls it, so a grammar's first generation pays it
    /// before its first token; later generations with the same `Grammar` (or a clone) share
    /// the result.
    pub fn prepare(&self, index: &TokenIndex) -> std::time::Duration {
        let t = std::time::Instant::now();
        let table = self.lexeme_table(index);
        for (d, states) in table.lexemes.iter().enumerate() {
            for (s, cell) in states.iter().enumerate() {
                cell.get_or_init(|| index.lexeme_tokens(&self.dfas[d], s as u32));
            }
        }
        table.tops.get_or_init(|| self.choice_tops(index));
        t.elapsed()
    }

    /// For each choice node whose alternatives start more than one parse (the first
    /// [`MAX_CHOICE_TOPS`]): those parses' tops and what they allow on their own ([`TopMask`]).
    fn choice_tops(&self, index: &TokenIndex) -> FastMap<GrammarState, TopMask> {
        let mut out = FastMap::default();
        let mut budget = CHOICE_TOPS_BUDGET;
        for (i, n) in self.nodes.iter().enumerate() {
            if !matches!(n, Node::Choice(_)) || out.len() >= MAX_CHOICE_TOPS || budget == 0 {
                continue;
            }
            let mut tops = GrammarState::default();
            if self.expand(&[self.enter(i as NodeId)], &mut tops).is_err() {
                continue;
            }
            tops.normalize();
            // An empty stack would be the stack below itself: never a split of a state.
            if tops.num_stacks() < 2 || tops.stacks().any(|s| s.is_empty()) || out.contains_key(&tops) {
                continue;
            }
            // One walk takes at most a fifth of the whole budget.
            let mut own = budget.min(CHOICE_TOPS_BUDGET / 5);
            let r = self.top_mask(index, &tops, &mut own);
            budget -= budget.min(CHOICE_TOPS_BUDGET / 5) - own;
            if let Ok(Some(m)) = r {
                out.insert(tops, m);
            }
        }
        tracing::debug!(tops = out.len(), steps = CHOICE_TOPS_BUDGET - budget, "choice tops computed");
        out
    }

    /// Walk the trie with `tops` alone (a state whose parses stop, accepting, where the tops
    /// close): see [`TopMask`]. `None` when the walk would take more than `budget` steps (a
    /// choice of free text walks the whole trie); the steps taken are subtracted.
    fn top_mask(&self, index: &TokenIndex, tops: &GrammarState, budget: &mut usize) -> Result<Option<TopMask>, GrammarError> {
        let mut open = TokenMask::empty(index.vocab_size());
        let mut closed = Vec::new();
        let mut rests: std::collections::HashMap<Vec<u8>, Vec<u32>> = Default::default();
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
                for j in i + 1..n.end as usize {
                    let m = index.nodes[j];
                    for &tok in &index.tok_ids[m.tok_start as usize..m.tok_end as usize] {
                        rests.entry(index.bytes[tok as usize][d..].to_vec()).or_default().push(tok);
                    }
                }
            }
            i = if has_open { i + 1 } else { n.end as usize };
        }
        let depth = DEEPEST.with(|d| d.get()).max(tops.stacks().map(|s| s.len()).max().unwrap_or(0));
        let mut rests: Vec<_> = rests.into_iter().collect();
        rests.sort_unstable();
        Ok(Some(TopMask { open, closed, rests: crate::vocab::BoundaryGroup::new(0, 0, &rests), depth }))
    }

    /// The mask of a state with several stacks that share a part below and whose tops are
    /// in the grammar's precomputed [`TopMask`]s; `None` otherwise.
    fn split_mask(&self, index: &TokenIndex, table: &LexemeTable, state: &GrammarState) -> Result<Option<TokenMask>, GrammarError> {
        let tops_map = table.tops.get_or_init(|| self.choice_tops(index));
        if tops_map.is_empty() {
            return Ok(None);
        }
        let (Some(first), Some(last)) = (state.stacks().next(), state.stacks().last()) else { return Ok(None) };
        // Stacks are sorted: the part common to all is the common part of the first and last.
        let k = first.iter().zip(last).take_while(|(a, b)| a == b).count();
        let mut tops = GrammarState::default();
        for st in state.stacks() {
            tops.push_stack(&st[k..]);
        }
        let Some(tm) = tops_map.get(&tops) else { return Ok(None) };
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

    /// Add to `extra` the tokens of each rest of `g` that `states[0]` accepts (rests sharing
    /// a prefix share its parse; a rejected prefix skips every rest that has it). `states`
    /// holds the states along the previous rest (`states[k]`: after its first k bytes).
    fn rests_from(&self, states: &mut Vec<GrammarState>, g: &crate::vocab::BoundaryGroup, extra: &mut Vec<u32>) -> Result<(), GrammarError> {
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
                let inner = table.lexemes.get(*dfa as usize).and_then(|v| v.get(*state as usize)).and_then(|c| c.get());
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
        let Some(cell) = table.lexemes.get(d as usize).and_then(|v| v.get(top.pos as usize)) else { return Ok(None) };
        let lt = cell.get_or_init(|| index.lexeme_tokens(&self.dfas[d as usize], top.pos));
        if lt.num_rests > MAX_LEXEME_RESTS {
            // Most tokens leave the lexeme at once (e.g. whitespace): the walk prunes faster.
            return Ok(None);
        }
        let mut extra = Vec::new();
        let mut before = state.clone();
        let mut states: Vec<GrammarState> = vec![GrammarState::default()];
        for g in &lt.groups {
            if let Some(t) = before.frames.last_mut() {
                t.pos = g.p;
            }
            if !self.advance(&before, g.b, &mut states[0])? {
                continue;
            }
            self.rests_from(&mut states, g, &mut extra)?;
        }
        Ok(Some(StackMask::Lexeme { dfa: d, state: top.pos, extra }))
    }

    fn enter(&self, node: NodeId) -> Frame {
        let pos = match &self.nodes[node as usize] {
            Node::Dfa(d) => self.dfas[*d as usize].start,
            _ => 0,
        };
        Frame { node, pos, aux: 0 }
    }

    fn is_consuming(&self, f: &Frame) -> bool {
        matches!(
            self.nodes[f.node as usize],
            Node::Bytes(_) | Node::Dfa(_) | Node::Int(_) | Node::Num(_)
        )
    }

    /// For a consuming frame: (complete here, can take another byte).
    fn frame_status(&self, f: &Frame) -> (bool, bool) {
        match &self.nodes[f.node as usize] {
            Node::Bytes(b) => {
                let done = f.pos as usize == b.len();
                (done, !done)
            }
            Node::Dfa(d) => {
                let t = &self.dfas[*d as usize];
                (t.accepting[f.pos as usize], t.can_consume[f.pos as usize])
            }
            Node::Int(r) => {
                let acc = number::int_accepting(f.pos, f.aux, r);
                let can = b"-.0123456789".iter().any(|&b| number::int_consume(f.pos, f.aux, b, r).is_some());
                (acc, can)
            }
            Node::Num(r) => {
                let acc = number::num_accepting(f.pos, f.aux, r);
                let can = number::NUM_BYTES.iter().any(|&b| number::num_consume(f.pos, f.aux, b, r).is_some());
                (acc, can)
            }
            _ => (false, false),
        }
    }

    /// A consuming frame takes one byte.
    #[inline]
    fn consume(&self, f: &Frame, b: u8) -> Option<Frame> {
        match &self.nodes[f.node as usize] {
            Node::Dfa(d) => {
                let t = self.dfas[*d as usize].next(f.pos, b);
                (t != DEAD).then_some(Frame { pos: t, ..*f })
            }
            Node::Bytes(lit) => (lit.get(f.pos as usize) == Some(&b)).then_some(Frame { pos: f.pos + 1, ..*f }),
            Node::Int(r) => number::int_consume(f.pos, f.aux, b, r).map(|(pos, aux)| Frame { pos, aux, ..*f }),
            Node::Num(r) => number::num_consume(f.pos, f.aux, b, r).map(|(pos, aux)| Frame { pos, aux, ..*f }),
            _ => None,
        }
    }

    /// Expand `stack` until every resulting stack has a consuming top that can take a byte
    /// (or is empty = complete); append them to `out`.
    fn expand(&self, stack: &[Frame], out: &mut GrammarState) -> Result<(), GrammarError> {
        SCRATCH.with(|c| match c.try_borrow_mut() {
            Ok(mut sc) => self.expand_with(stack, out, &mut sc),
            Err(_) => self.expand_with(stack, out, &mut Scratch::default()),
        })
    }

    fn expand_with(&self, stack: &[Frame], out: &mut GrammarState, sc: &mut Scratch) -> Result<(), GrammarError> {
        let Scratch { st, work, work_ends, .. } = sc;
        work.clear();
        work_ends.clear();
        work.extend_from_slice(stack);
        work_ends.push(work.len());
        let mut budget = EXPAND_BUDGET;
        let mut deepest = 0;
        while let Some(end) = work_ends.pop() {
            let start = work_ends.last().copied().unwrap_or(0);
            st.clear();
            st.extend_from_slice(&work[start..end]);
            work.truncate(start);
            loop {
                budget = budget.checked_sub(1).ok_or(GrammarError::Loop)?;
                deepest = deepest.max(st.len());
                if st.len() > self.max_depth {
                    break; // too deep: this parse is dropped
                }
                let Some(top) = st.last().copied() else {
                    out.push_stack(st);
                    break;
                };
                if self.is_consuming(&top) {
                    let (done, can) = self.frame_status(&top);
                    if done {
                        work.extend_from_slice(&st[..st.len() - 1]);
                        work_ends.push(work.len());
                    }
                    if can {
                        out.push_stack(st);
                    }
                    break;
                }
                match &self.nodes[top.node as usize] {
                    Node::Seq(children) => {
                        if (top.pos as usize) < children.len() {
                            let c = children[top.pos as usize];
                            if let Some(t) = st.last_mut() {
                                t.pos += 1;
                            }
                            st.push(self.enter(c));
                        } else {
                            st.pop();
                        }
                    }
                    Node::Choice(alts) => {
                        st.pop();
                        let Some((first, rest)) = alts.split_first() else { break };
                        for &a in rest {
                            work.extend_from_slice(st);
                            work.push(self.enter(a));
                            work_ends.push(work.len());
                        }
                        st.push(self.enter(*first));
                    }
                    Node::Repeat { item, sep, min, max } => {
                        let count = top.pos;
                        let more = count < *max;
                        if count >= *min {
                            if more {
                                work.extend_from_slice(&st[..st.len() - 1]);
                                work_ends.push(work.len());
                            } else {
                                st.pop();
                                continue;
                            }
                        }
                        if !more {
                            break;
                        }
                        if let Some(t) = st.last_mut() {
                            // Without an upper bound the count only matters up to max(min, 1):
                            // saturate it so states (and cached masks) repeat across items.
                            t.pos = if *max == u32::MAX { (count + 1).min((*min).max(1)) } else { count + 1 };
                        }
                        st.push(self.enter(*item));
                        if count > 0 {
                            if let Some(s) = sep {
                                st.push(self.enter(*s));
                            }
                        }
                    }
                    _ => break,
                }
            }
            if out.num_stacks() > MAX_STACKS {
                return Err(GrammarError::TooAmbiguous(MAX_STACKS));
            }
        }
        DEEPEST.with(|d| d.set(d.get().max(deepest)));
        Ok(())
    }
}

impl Constraint for Grammar {
    type State = GrammarState;

    fn start(&self) -> GrammarState {
        self.start.clone()
    }

    fn advance(&self, state: &GrammarState, b: u8, out: &mut GrammarState) -> Result<bool, GrammarError> {
        // Fast path: one parse whose top stays inside its lexeme (no completion to expand).
        if state.ends.len() == 1 {
            if let Some(top) = state.frames.last() {
                if let Node::Dfa(d) = self.nodes[top.node as usize] {
                    let t = &self.dfas[d as usize];
                    let n = t.next(top.pos, b);
                    if n == DEAD {
                        return Ok(false);
                    }
                    if !t.accepting[n as usize] && t.can_consume[n as usize] {
                        out.frames.clone_from(&state.frames);
                        out.ends.clone_from(&state.ends);
                        if let Some(f) = out.frames.last_mut() {
                            f.pos = n;
                        }
                        return Ok(true);
                    }
                }
                let Some(nf) = self.consume(top, b) else { return Ok(false) };
                let (done, can) = self.frame_status(&nf);
                if !done && can {
                    out.frames.clone_from(&state.frames);
                    out.ends.clone_from(&state.ends);
                    if let Some(t) = out.frames.last_mut() {
                        *t = nf;
                    }
                    return Ok(true);
                }
            }
        }
        out.clear();
        SCRATCH.with(|c| -> Result<(), GrammarError> {
            let mut owned;
            let mut guard = c.try_borrow_mut();
            let sc: &mut Scratch = match guard {
                Ok(ref mut g) => g,
                Err(_) => {
                    owned = Scratch::default();
                    &mut owned
                }
            };
            for st in state.stacks() {
                let Some(top) = st.last() else { continue };
                if let Some(nf) = self.consume(top, b) {
                    let mut copy = std::mem::take(&mut sc.copy);
                    copy.clear();
                    copy.extend_from_slice(st);
                    if let Some(t) = copy.last_mut() {
                        *t = nf;
                    }
                    let r = self.expand_with(&copy, out, sc);
                    sc.copy = copy;
                    r?;
                }
            }
            Ok(())
        })?;
        out.normalize();
        Ok(out.num_stacks() > 0)
    }

    fn is_accepting(&self, state: &GrammarState) -> bool {
        state.stacks().any(|s| s.is_empty())
    }

    /// The union of the masks of each parse stack (a token is allowed from a set of stacks
    /// iff it is allowed from one of them): stacks topped by a regex lexeme use the
    /// precomputed lexeme sets, the others walk the trie with that stack alone (literal,
    /// number and stop-string tops prune the walk at once).
    fn fast_mask(&self, index: &TokenIndex, state: &GrammarState) -> Result<Option<Arc<TokenMask>>, GrammarError> {
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

    fn prepare(&self, index: &TokenIndex) {
        Grammar::prepare(self, index);
    }
}

/// The least set of nodes for which `holds(node, set)` is true, grown until nothing changes
/// (a property of a node that follows from its children's: productive, nullable).
fn least_fixpoint(nodes: &[Node], holds: impl Fn(&Node, &[bool]) -> bool) -> Vec<bool> {
    let mut set = vec![false; nodes.len()];
    loop {
        let mut changed = false;
        for (i, n) in nodes.iter().enumerate() {
            if !set[i] && holds(n, &set) {
                set[i] = true;
                changed = true;
            }
        }
        if !changed {
            return set;
        }
    }
}

/// Remove what can derive no finite text: choice alternatives, and items of repetitions
/// that may be empty (a `$ref` beyond `max_ref_depth` is an empty choice, and so is every
/// sequence needing one). Returns whether `root` still derives some text.
fn prune_unproductive(nodes: &mut [Node], root: NodeId) -> bool {
    let ok = least_fixpoint(nodes, |n, ok| match n {
        Node::Bytes(_) | Node::Dfa(_) | Node::Int(_) | Node::Num(_) => true,
        Node::Seq(c) => c.iter().all(|&c| ok[c as usize]),
        Node::Choice(c) => c.iter().any(|&c| ok[c as usize]),
        Node::Repeat { item, sep, min, .. } => *min == 0 || (ok[*item as usize] && (*min <= 1 || sep.is_none_or(|s| ok[s as usize]))),
    });
    if ok.iter().all(|&o| o) {
        return ok.get(root as usize).copied().unwrap_or(false);
    }
    for (i, n) in nodes.iter_mut().enumerate() {
        if !ok[i] {
            continue;
        }
        match n {
            Node::Choice(c) if c.iter().any(|&x| !ok[x as usize]) => {
                *c = c.iter().copied().filter(|&x| ok[x as usize]).collect();
            }
            Node::Repeat { item, max, .. } if !ok[*item as usize] => *max = 0,
            Node::Repeat { sep: Some(s), max, .. } if !ok[*s as usize] => *max = (*max).min(1),
            _ => {}
        }
    }
    ok.get(root as usize).copied().unwrap_or(false)
}

/// Reject unbounded repetitions of items that can match the empty string and left
/// recursion (either would make the expansion loop).
fn check_grammar(nodes: &[Node], dfas: &[DfaTable]) -> Result<(), GrammarError> {
    let nullable = least_fixpoint(nodes, |n, nullable| match n {
        Node::Bytes(b) => b.is_empty(),
        Node::Dfa(d) => dfas[*d as usize].accepting[dfas[*d as usize].start as usize],
        Node::Int(_) | Node::Num(_) => false,
        Node::Seq(c) => c.iter().all(|&c| nullable[c as usize]),
        Node::Choice(c) => c.iter().any(|&c| nullable[c as usize]),
        Node::Repeat { item, min, .. } => *min == 0 || nullable[*item as usize],
    });
    for n in nodes {
        if let Node::Repeat { item, sep, max, .. } = n {
            let sep_null = sep.is_none_or(|s| nullable[s as usize]);
            if *max == u32::MAX && nullable[*item as usize] && sep_null {
                return Err(GrammarError::NullableRepeat);
            }
        }
    }
    // Left recursion: a cycle through nodes entered without consuming input.
    let first = |n: &Node| -> Vec<NodeId> {
        match n {
            Node::Seq(c) => {
                let mut v = Vec::new();
                for &x in c.iter() {
                    v.push(x);
                    if !nullable[x as usize] {
                        break;
                    }
                }
                v
            }
            Node::Choice(c) => c.to_vec(),
            Node::Repeat { item, sep, .. } => {
                let mut v = vec![*item];
                v.extend(sep);
                v
            }
            _ => vec![],
        }
    };
    // 0 = unvisited, 1 = on the DFS stack, 2 = done
    let mut mark = vec![0u8; nodes.len()];
    for root in 0..nodes.len() {
        if mark[root] != 0 {
            continue;
        }
        let mut stack: Vec<(usize, Vec<NodeId>)> = vec![(root, first(&nodes[root]))];
        mark[root] = 1;
        while let Some((n, next)) = stack.last_mut() {
            match next.pop() {
                Some(c) => match mark[c as usize] {
                    1 => return Err(GrammarError::Loop),
                    0 => {
                        mark[c as usize] = 1;
                        let f = first(&nodes[c as usize]);
                        stack.push((c as usize, f));
                    }
                    _ => {}
                },
                None => {
                    mark[*n] = 2;
                    stack.pop();
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(e: Expr) -> Grammar {
        Grammar::new(&e).unwrap()
    }
    fn ok(g: &Grammar, s: &str) -> bool {
        g.matches(s.as_bytes()).unwrap()
    }
    /// Is `s` a prefix of something the grammar accepts?
    fn prefix(g: &Grammar, s: &str) -> bool {
        g.advance_bytes(&g.start(), s.as_bytes()).unwrap().is_some()
    }

    #[test]
    fn literal_choice_and_ambiguity() {
        let c = g(Expr::one_of(["a", "ab", "abc", "b"]));
        for (s, want) in [("a", true), ("ab", true), ("abc", true), ("b", true), ("", false), ("ac", false), ("abcd", false)] {
            assert_eq!(ok(&c, s), want, "{s:?}");
        }
        // "a" is both complete and a prefix of longer alternatives.
        let st = c.advance_bytes(&c.start(), b"a").unwrap().unwrap();
        assert!(c.is_accepting(&st) && st.num_stacks() == 3);
    }

    #[test]
    fn sequence_repeat_separator() {
        let item = Expr::regex("[a-z]+");
        let list = Expr::literal("[").then(item.separated_by(Expr::literal(", "), 1, Some(3))).then(Expr::literal("]"));
        let c = g(list);
        assert!(ok(&c, "[a]") && ok(&c, "[ab, c]") && ok(&c, "[a, b, c]"));
        assert!(!ok(&c, "[]") && !ok(&c, "[a, b, c, d]") && !ok(&c, "[a,b]") && !ok(&c, "[a, ]"));
        // repeat without separator, min 2
        let c = g(Expr::literal("ab").repeat(2, None));
        assert!(!ok(&c, "ab") && ok(&c, "abab") && ok(&c, "ababab") && !ok(&c, "aba"));
        // optional
        let c = g(Expr::literal("x").then(Expr::literal("y").optional()).then(Expr::literal("z")));
        assert!(ok(&c, "xz") && ok(&c, "xyz") && !ok(&c, "xyyz"));
    }

    #[test]
    fn regex_followed_by_overlapping_literal() {
        // The lexeme may stop at any accepting point: "a*" then "a" needs both parses.
        let c = g(Expr::regex("a*").then(Expr::literal("ab")));
        assert!(ok(&c, "ab") && ok(&c, "aaab") && !ok(&c, "aaa") && !ok(&c, "b"));
    }

    #[test]
    fn integer_ranges() {
        let c = g(Expr::integer(Some(-20), Some(150)));
        for v in -25..160i64 {
            assert_eq!(ok(&c, &v.to_string()), (-20..=150).contains(&v), "{v}");
        }
        assert!(ok(&c, "-0"), "-0 is 0");
        for bad in ["007", "01", "", "-", "1.0", "+1"] {
            assert!(!ok(&c, bad), "{bad:?}");
        }
        // Prefixes that cannot reach the range are rejected at once.
        assert!(!prefix(&c, "160") && !prefix(&c, "-21") && prefix(&c, "15") && prefix(&c, "-2"));
        let c = g(Expr::integer(Some(1000), None));
        assert!(prefix(&c, "9") && !ok(&c, "999") && ok(&c, "1000") && !prefix(&c, "0") && !prefix(&c, "-"));
        let c = g(Expr::integer(None, None));
        assert!(ok(&c, &i64::MIN.to_string()) && ok(&c, &i64::MAX.to_string()));
        assert!(!ok(&c, "9223372036854775808"));
        assert!(matches!(Grammar::new(&Expr::integer(Some(5), Some(4))), Err(GrammarError::Unsatisfiable(_))));
    }

    #[test]
    fn float_ranges() {
        // Numbers as JSON writes them, compared exactly in decimal (crate::number has more).
        let c = g(Expr::float(Some(-1.5), Some(2.25)));
        for (s, want) in [
            ("0", true), ("2.25", true), ("2.26", false), ("2.250", true), ("-1.5", true), ("-1.51", false),
            ("1.", false), ("3", false), ("-0.5", true), ("00.1", false), ("2.2", true), (".5", false),
            ("-0", true), ("-0.0", true), ("1.0", true), ("0.000001", true), ("0.0000001", true), ("225e-2", false), ("2.25e0", true), ("2.3e0", false),
        ] {
            assert_eq!(ok(&c, s), want, "{s:?}");
        }
        // 3e-1 is in range, 3e+1 is not.
        assert!(prefix(&c, "3e-") && !prefix(&c, "3e+") && !prefix(&c, "2.3e0") && prefix(&c, "2.2") && prefix(&c, "2.25000"));
        // exclusive bounds through the builder
        let mut b = Builder::new(JsonOptions::default());
        let n = b.num(0.0, 1.0, true, true).unwrap();
        let c = Grammar::from_parts(b.nodes, b.dfas, n).unwrap();
        assert!(!ok(&c, "0") && !ok(&c, "1") && ok(&c, "0.5") && !ok(&c, "1.0") && ok(&c, "0.99999999") && ok(&c, "1e-99") && !ok(&c, "1e-300"));
        let mut b = Builder::new(JsonOptions::default());
        assert!(b.num(1.0, 0.5, false, false).is_err(), "empty range");
        // No dead end: a prefix is only allowed if some number in range follows.
        let mut b = Builder::new(JsonOptions::default());
        let n = b.num(0.0, 0.0, false, false).unwrap();
        let c = Grammar::from_parts(b.nodes, b.dfas, n).unwrap();
        assert!(ok(&c, "0") && ok(&c, "0.0") && ok(&c, "-0") && !prefix(&c, "0.01") && !prefix(&c, "1"));
    }

    #[test]
    fn stop_at_string() {
        let c = g(Expr::stop_at("</end>"));
        assert!(ok(&c, "</end>") && ok(&c, "abc </en</end>") && !ok(&c, "abc") && !ok(&c, "</end> x"));
        // After the stop string nothing more is accepted.
        let st = c.advance_bytes(&c.start(), b"x</end>").unwrap().unwrap();
        let mut out = GrammarState::default();
        assert!(!c.advance(&st, b'x', &mut out).unwrap());
    }

    #[test]
    fn free_json() {
        let c = g(Expr::Json);
        let flex = Grammar::with_options(&Expr::Json, JsonOptions::flexible(24)).unwrap();
        let spaced = Grammar::with_options(&Expr::Json, JsonOptions::spaced()).unwrap();
        for s in ["1", "-0.5", "\"a\\n\\u00e9\"", "true", "null", "[]", "{}", "[1,[2,{\"a\":null}]]", "\"é日本\"", "\"\\uD83D\\uDE00\""] {
            assert!(ok(&c, s) && ok(&flex, s), "{s}");
        }
        // Whitespace only in the flexible layout; one space after , and : in the spaced one.
        for s in ["[1, [2, {\"a\": null}]]", "{\"a\": {\"b\": [true, false]}, \"c\": \"d\"}"] {
            assert!(!ok(&c, s) && ok(&flex, s) && ok(&spaced, s), "{s}");
        }
        for s in ["{ \"k\" : 1 }", "[\n1]"] {
            assert!(!ok(&c, s) && ok(&flex, s) && !ok(&spaced, s), "{s}");
        }
        for s in ["", "01", "[1,]", "{\"a\"}", "{a: 1}", "\"\\x\"", "[1 2]", "tru", "{\"a\":1,}", "\"\n\"", "\"\\uD800\"", "\"\\uDE00\"", "1.", "-"] {
            assert!(!ok(&c, s) && !ok(&flex, s), "{s}");
        }
        // Numbers in every form JSON has, whatever the layout.
        for (s, want) in [("0.5", true), ("0.1234567", true), ("2.50", true), ("-0", true), ("-0.0", true), ("1e3", true), ("1E-7", true), ("10", true), ("+1", false), ("1e", false)] {
            assert_eq!(ok(&c, s), want, "{s}");
        }
        // Check against serde_json on generated random-ish documents.
        let docs = [
            serde_json::json!({"a": [1, 2.5, -3], "b": {"c": "x\"y", "d": null}, "e": []}),
            serde_json::json!([{"k": true}, "s", 0, {"nested": {"deeper": [[], {}]}}]),
        ];
        for d in docs {
            assert!(ok(&c, &serde_json::to_string(&d).unwrap()));
            assert!(ok(&flex, &serde_json::to_string_pretty(&d).unwrap()));
            assert!(!ok(&c, &serde_json::to_string_pretty(&d).unwrap()));
        }
    }

    #[test]
    fn tool_calls_or_text() {
        let tools = vec![
            Tool::new("get_weather", serde_json::json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})),
            Tool::new("add", serde_json::json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]})),
        ];
        let c = g(Expr::text_or_tool_calls("<tool_call>", "</tool_call>", tools));
        let call = "<tool_call>\n{\"name\":\"add\",\"arguments\":{\"a\":1,\"b\":2}}\n</tool_call>";
        let weather = "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}\n</tool_call>";
        for s in ["", "Hello! 2 < 3, <tool and </tool_call> are text.", call, &format!("Let me add them.\n{call}"), &format!("{call}\n{weather}")] {
            assert!(ok(&c, s), "{s:?}");
        }
        for s in [
            "text <tool_call>",
            "<tool_call>\n{\"name\":\"sub\",\"arguments\":{}}\n</tool_call>",
            "<tool_call>\n{\"name\":\"add\",\"arguments\":{\"a\":1}}\n</tool_call>",
            "<tool_call>\n{\"name\":\"add\",\"arguments\":{\"a\":1,\"b\":2}}\n</tool_call> and more text",
        ] {
            assert!(!ok(&c, s), "{s:?}");
        }
        assert!(matches!(Grammar::new(&Expr::text_or_tool_calls("<t>", "</t>", vec![])), Err(GrammarError::Unsatisfiable(_))));
    }

    #[test]
    fn build_errors() {
        assert!(matches!(Grammar::regex("a("), Err(GrammarError::InvalidRegex { .. })));
        assert!(matches!(Grammar::new(&Expr::regex("a*").repeat(0, None)), Err(GrammarError::NullableRepeat)));
        assert!(matches!(Grammar::new(&Expr::Choice(vec![])), Err(GrammarError::Unsatisfiable(_))));
        assert!(matches!(
            Grammar::new(&Expr::literal("a").repeat(3, Some(2))),
            Err(GrammarError::Unsatisfiable(_))
        ));
    }

    #[test]
    fn left_recursion_is_reported_not_looped() {
        // value := value "x" | "y"  (left recursive): the expansion must stop with Loop.
        let mut b = Builder::new(JsonOptions::default());
        let v = b.choice(vec![]);
        let x = b.lit("x");
        let y = b.lit("y");
        let rec = b.seq(vec![v, x]);
        b.nodes[v as usize] = Node::Choice(vec![rec, y].into());
        let r = Grammar::from_parts(b.nodes, b.dfas, v);
        assert!(matches!(r, Err(GrammarError::Loop)), "{r:?}");
    }

    /// States where a value starts take the split path (the tops' tokens computed once,
    /// the rests after them per state): every mask equals the plain walk, over random
    /// documents, with tokens that run from one value into what follows it, and with stack
    /// limits small enough that the tops' depth matters.
    #[test]
    fn split_masks_equal_the_walk() {
        let words = [
            "<eos>", "{", "}", "[", "]", ",", ":", "\"", "\"a", "\"a\"", "\"a\",", "\"\"", "\"\"}", "1", "12", "1,", "0}", "1]",
            "true", "true,", "null]", "false}", "[[", "[[[", "[{", "{\"", "{\"a\":", "{}", "[]", "[],", "{},", "]}", "}]",
            "a", "-", "-1", ".5", "0.5,", "\":", "\",\"", "t", "n", "nu", "f", "2", "0", "]]", "}}", "\":[", "\":{",
        ];
        let toks: Vec<Vec<u8>> = words.iter().map(|w| w.as_bytes().to_vec()).collect();
        let idx = TokenIndex::new(toks, &[0], &[]);
        let schema = serde_json::json!({
            "type": "object",
            "properties": {"a": {"anyOf": [{"type": "integer"}, {"type": "array", "items": {"type": ["string", "null", "boolean"]}}]}, "b": {}},
            "required": ["a"]
        });
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut rand = move |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        let mut split = 0;
        // After the first item, the stack below goes deeper than the item did (into the
        // separator): at the stack limit it cannot go on, and a token ending the item is not
        // allowed.
        let pair = serde_json::json!({"type": "array", "prefixItems": [{"type": ["integer", "null"]}, {"type": "integer"}], "items": false, "minItems": 2});
        for depth in (3u32..=16).chain([2048]) {
            let opts = JsonOptions { max_stack_depth: depth, ..JsonOptions::default() };
            for e in [Expr::Json, Expr::JsonSchema(schema.clone()), Expr::JsonSchema(pair.clone())] {
                let Ok(g) = Grammar::with_options(&e, opts) else { continue };
                let table = g.lexeme_table(&idx);
                for _ in 0..40 {
                    let mut st = g.start();
                    for _ in 0..30 {
                        let m = idx.mask(&g, &st).unwrap();
                        assert_eq!(m, idx.mask_by_walk(&g, &st).unwrap(), "depth {depth}, {e:?}, state {st:?}");
                        if st.num_stacks() > 1 && g.split_mask(&idx, &table, &st).unwrap().is_some() {
                            split += 1;
                        }
                        let allowed: Vec<u32> = m.iter().filter(|&t| t != 0).collect();
                        if allowed.is_empty() {
                            break;
                        }
                        let t = allowed[rand(allowed.len())];
                        st = g.advance_bytes(&st, words[t as usize].as_bytes()).unwrap().unwrap();
                    }
                }
            }
        }
        assert!(split > 200, "{split} masks took the split path");
    }

    #[test]
    fn states_roll_back() {
        let c = g(Expr::Json);
        let s1 = c.advance_bytes(&c.start(), b"[1,").unwrap().unwrap();
        let s2 = c.advance_bytes(&s1, b"2]").unwrap().unwrap();
        assert!(c.is_accepting(&s2) && !c.is_accepting(&s1));
        // Going back to s1 and taking another path works, s2 is untouched.
        let s3 = c.advance_bytes(&s1, b"\"x\"]").unwrap().unwrap();
        assert!(c.is_accepting(&s3) && c.is_accepting(&s2));
        assert_eq!(c.advance_bytes(&s1, b"2]").unwrap().unwrap(), s2);
    }
}
