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
use crate::vocab::{TokenIndex, TokenMask};
use mask::LexemeCache;
use std::sync::Arc;

mod mask;

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
/// Expansion steps for one byte before `Loop`.
const EXPAND_BUDGET: usize = 100_000;

/// A compiled [`Expr`].
#[derive(Debug, Clone)]
pub struct Grammar {
    pub(crate) nodes: Vec<Node>,
    pub(crate) dfas: Arc<[DfaTable]>,
    start: GrammarState,
    /// Deepest stack ([`JsonOptions::max_stack_depth`]); a parse that would go deeper is
    /// dropped (a byte that would need it is not allowed).
    max_depth: usize,
    /// Per token index, DFA and DFA state: tokens inside the lexeme and boundary groups.
    lexemes: LexemeCache,
}

impl Grammar {
    /// Compile an expression.
    pub fn new(e: &Expr) -> Result<Self, GrammarError> {
        Self::with_options(e, JsonOptions::default())
    }
    pub fn with_options(e: &Expr, json: JsonOptions) -> Result<Self, GrammarError> {
        Self::compiled(json, |b| build(b, e))
    }
    /// The grammar of what `root` builds, with `json`'s options.
    fn compiled(json: JsonOptions, root: impl FnOnce(&mut Builder) -> Result<NodeId, GrammarError>) -> Result<Self, GrammarError> {
        let mut b = Builder::new(json);
        if json.max_stack_depth == 0 || json.max_stack_depth > crate::builder::MAX_STACK_DEPTH {
            return Err(GrammarError::InvalidOption(format!(
                "JsonOptions::max_stack_depth must be between 1 and {}, got {}",
                crate::builder::MAX_STACK_DEPTH,
                json.max_stack_depth
            )));
        }
        let root = root(&mut b)?;
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
        // Compiled from the caller's value: a copy of a large schema cost as much as
        // compiling parts of it.
        Self::compiled(JsonOptions::default(), |b| crate::schema::compile(b, schema))
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
        let mut g = Self { nodes, dfas: dfas.into(), start: GrammarState::default(), max_depth, lexemes: LexemeCache::default() };
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
        self.mask_of(index, state)
    }

    /// The start state's mask now ([`Grammar::prepare`]), everything else on a thread of its
    /// own ([`Grammar::prepare_in_background`]).
    fn prepare(&self, index: &Arc<TokenIndex>) {
        Grammar::prepare(self, index);
        self.prepare_in_background(index);
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
mod tests;
