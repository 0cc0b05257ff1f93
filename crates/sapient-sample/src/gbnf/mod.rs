//! llama.cpp's GBNF grammar format compiled to the grammar engine ([`Grammar::gbnf`]).
//!
//! The text is read as llama.cpp reads it (`parse.rs`); generation starts at the rule
//! `root`. Terminals match Unicode characters written as UTF-8, as in llama.cpp.
//!
//! Compilation: a rule that does not recurse (directly or through others) is one regex
//! lexeme, the rules it uses inlined (unless one of them can match the empty text: then
//! the rule is built of its parts), shared by every place that uses it; runs of terminals
//! in a sequence, and the terminal alternatives of a choice, are merged into one lexeme. So
//! masks use the lexemes' precomputed token sets. What recurses becomes grammar nodes: a
//! node per rule, sequences, choices and repetitions. A regex that would be too large falls
//! back to nodes.
//!
//! Refused with a [`GrammarError::Gbnf`] naming the line and column: syntax errors,
//! undefined and twice-defined rules, a missing `root`, left recursion (which llama.cpp
//! refuses too), a `root` that can never finish, an unbounded repetition of something that
//! can be empty and that is not regular, token references (`<[id]>`, `<token>`).

mod parse;
#[cfg(test)]
mod tests;

use crate::builder::{Builder, JsonOptions, Node, NodeId};
use crate::dfa::{DfaTable, MAX_PATTERN_BYTES};
use crate::error::GrammarError;
use crate::grammar::Grammar;
use parse::{error, At};
use std::collections::{HashMap, HashSet};

/// The longest GBNF text compiled.
pub const MAX_GBNF_BYTES: usize = 1 << 20;
/// DFA states a merged regex may take before it falls back to grammar nodes.
const MERGED_MAX_STATES: usize = 20_000;
/// Merged regexes that may fail to compile (too large) before no more are tried.
const MAX_REGEX_FAILURES: usize = 16;
/// Bytes of regex kept for the regular rules, all together (each rule's regex holds those of
/// the rules it uses): past it, rules are built as nodes.
const RX_BUDGET: usize = 8 * MAX_PATTERN_BYTES;
/// Bytes of merged regex compiled, all together: past it, parts are built as nodes.
const COMPILE_BUDGET: usize = 64 * MAX_PATTERN_BYTES;
/// Most rules in a grammar.
pub const MAX_GBNF_RULES: usize = 10_000;

/// A rule: `name ::= body`, defined at byte offset `at`.
#[derive(Debug)]
pub(crate) struct Rule {
    name: String,
    body: Ast,
    at: At,
}

/// A GBNF expression.
#[derive(Debug)]
pub(crate) enum Ast {
    Lit(String),
    /// Ranges of Unicode scalar values (inclusive), or every character but those.
    Class { negated: bool, ranges: Vec<(u32, u32)>, at: At },
    /// `.`: any character.
    Any,
    /// A rule by name (`rule`: its index, set once the names are resolved).
    Ref { name: String, rule: usize, at: At },
    Seq(Vec<Ast>),
    Alt(Vec<Ast>),
    Rep { item: Box<Ast>, min: u32, max: Option<u32>, at: At },
}

impl Grammar {
    /// Compile a grammar in llama.cpp's GBNF format (rules `name ::= ...`, generation from
    /// `root`). Errors name the line and column ([`GrammarError::Gbnf`]).
    ///
    /// ```
    /// use sapient_sample::{Constraint, Grammar};
    /// let g = Grammar::gbnf(r#"root ::= "yes" | "no" | num
    /// num ::= [1-9] [0-9]{0,2}   # up to 999"#)?;
    /// assert!(g.matches(b"no")? && g.matches(b"250")? && !g.matches(b"0")?);
    /// # Ok::<(), sapient_sample::GrammarError>(())
    /// ```
    pub fn gbnf(text: &str) -> Result<Self, GrammarError> {
        let opts = JsonOptions::default();
        let mut b = Builder::new(opts);
        let root = compile(&mut b, text)?;
        Self::from_parts_with(b.nodes, b.dfas, root, opts.max_stack_depth as usize)
    }
}

/// Build the nodes of the GBNF grammar `src` into `b`; returns the root.
pub(crate) fn compile(b: &mut Builder, src: &str) -> Result<NodeId, GrammarError> {
    if src.len() > MAX_GBNF_BYTES {
        return Err(GrammarError::TooLarge { what: format!("a GBNF grammar of {} bytes", src.len()), limit: MAX_GBNF_BYTES });
    }
    let mut rules = parse::parse(src)?;
    if rules.len() > MAX_GBNF_RULES {
        return Err(GrammarError::TooLarge { what: format!("a GBNF grammar of {} rules", rules.len()), limit: MAX_GBNF_RULES });
    }
    let mut index: HashMap<String, usize> = HashMap::new();
    for (i, r) in rules.iter().enumerate() {
        if let Some(&first) = index.get(&r.name) {
            let (line, _) = parse::line_col(src, rules[first].at);
            return Err(error(src, r.at, format!("rule `{}` is defined twice (first on line {line})", r.name)));
        }
        index.insert(r.name.clone(), i);
    }
    let Some(&root) = index.get("root") else {
        return Err(error(src, 0, "the grammar has no `root` rule (generation starts from `root`)"));
    };
    let mut refs: Vec<Vec<usize>> = Vec::with_capacity(rules.len());
    for r in rules.iter_mut() {
        let mut out = Vec::new();
        resolve(&mut r.body, &index, src, &mut out)?;
        out.sort_unstable();
        out.dedup();
        refs.push(out);
    }
    let nullable = fixpoint(&rules, nullable);
    let productive = fixpoint(&rules, productive);
    if !productive[root] {
        return Err(error(src, rules[root].at, "rule `root` can never finish: every way through it recurses without end"));
    }
    left_recursion(&rules, &nullable, src)?;
    // Rules that reach no recursion, in an order where a rule comes after those it uses.
    let (regular, order) = regular_rules(&refs);
    let mut c = Compiler {
        b,
        nullable: &nullable,
        regular,
        rx: vec![None; rules.len()],
        rule_nodes: vec![None; rules.len()],
        placeholders: HashSet::new(),
        todo: Vec::new(),
        regexes: HashMap::new(),
        failures: 0,
        compiled: 0,
        src,
    };
    let mut kept = 0;
    for r in order {
        // A rule that uses one that can be empty (`ws ::= [ ]*`) keeps it a lexeme of its
        // own: inlined, its first bytes would be allowed after every accepting state of the
        // rule's DFA, and every such state would take the tokens starting with them as
        // boundary tokens (json.gbnf's `ws` inlined in `string` and `number` makes the
        // tokens computed ahead cost over three times as much).
        if refs[r].iter().any(|&s| nullable[s]) {
            continue;
        }
        let mut s = String::new();
        if c.write_rx(&rules[r].body, &mut s) && kept + s.len() <= RX_BUDGET {
            kept += s.len();
            c.rx[r] = Some(s);
        }
    }
    let start = c.node(&Ast::Ref { name: "root".into(), rule: root, at: rules[root].at })?;
    while let Some(r) = c.todo.pop() {
        let id = c.node(&rules[r].body)?;
        let Some(ph) = c.rule_nodes[r] else { continue };
        c.b.nodes[ph as usize] = if c.placeholders.contains(&id) { Node::Seq(vec![id].into()) } else { c.b.nodes[id as usize].clone() };
    }
    Ok(start)
}

/// Whether `a` refers to no rule.
fn terminals_only(a: &Ast) -> bool {
    match a {
        Ast::Lit(_) | Ast::Class { .. } | Ast::Any => true,
        Ast::Ref { .. } => false,
        Ast::Seq(v) | Ast::Alt(v) => v.iter().all(terminals_only),
        Ast::Rep { item, .. } => terminals_only(item),
    }
}

/// Set each reference's rule index (in `out` too); an undefined name is an error.
fn resolve(a: &mut Ast, index: &HashMap<String, usize>, src: &str, out: &mut Vec<usize>) -> Result<(), GrammarError> {
    match a {
        Ast::Ref { name, rule, at } => match index.get(name.as_str()) {
            Some(&i) => {
                *rule = i;
                out.push(i);
            }
            None => return Err(error(src, *at, format!("undefined rule `{name}`"))),
        },
        Ast::Seq(v) | Ast::Alt(v) => {
            for x in v {
                resolve(x, index, src, out)?;
            }
        }
        Ast::Rep { item, .. } => resolve(item, index, src, out)?,
        Ast::Lit(_) | Ast::Class { .. } | Ast::Any => {}
    }
    Ok(())
}

/// The least set of rules whose bodies satisfy `holds` (given the set so far).
fn fixpoint(rules: &[Rule], holds: impl Fn(&Ast, &[bool]) -> bool) -> Vec<bool> {
    let mut set = vec![false; rules.len()];
    loop {
        let mut changed = false;
        for (i, r) in rules.iter().enumerate() {
            if !set[i] && holds(&r.body, &set) {
                set[i] = true;
                changed = true;
            }
        }
        if !changed {
            return set;
        }
    }
}

/// Whether `a` can match the empty text (`rules`: which rules can).
fn nullable(a: &Ast, rules: &[bool]) -> bool {
    match a {
        Ast::Lit(s) => s.is_empty(),
        Ast::Class { .. } | Ast::Any => false,
        Ast::Ref { rule, .. } => rules[*rule],
        Ast::Seq(v) => v.iter().all(|x| nullable(x, rules)),
        Ast::Alt(v) => v.iter().any(|x| nullable(x, rules)),
        Ast::Rep { item, min, .. } => *min == 0 || nullable(item, rules),
    }
}

/// Whether `a` can match some finite text (`rules`: which rules can).
fn productive(a: &Ast, rules: &[bool]) -> bool {
    match a {
        Ast::Lit(_) | Ast::Class { .. } | Ast::Any => true,
        Ast::Ref { rule, .. } => rules[*rule],
        Ast::Seq(v) => v.iter().all(|x| productive(x, rules)),
        Ast::Alt(v) => v.iter().any(|x| productive(x, rules)),
        Ast::Rep { item, min, .. } => *min == 0 || productive(item, rules),
    }
}

/// The rules `a` may enter before consuming any input.
fn first_refs(a: &Ast, nullable_rules: &[bool], out: &mut Vec<usize>) {
    match a {
        Ast::Ref { rule, .. } => out.push(*rule),
        Ast::Seq(v) => {
            for x in v {
                first_refs(x, nullable_rules, out);
                if !nullable(x, nullable_rules) {
                    break;
                }
            }
        }
        Ast::Alt(v) => v.iter().for_each(|x| first_refs(x, nullable_rules, out)),
        Ast::Rep { item, max, .. } if *max != Some(0) => first_refs(item, nullable_rules, out),
        _ => {}
    }
}

/// Refuse a rule that can reach itself without consuming input, naming the cycle.
fn left_recursion(rules: &[Rule], nullable_rules: &[bool], src: &str) -> Result<(), GrammarError> {
    let first: Vec<Vec<usize>> = rules
        .iter()
        .map(|r| {
            let mut v = Vec::new();
            first_refs(&r.body, nullable_rules, &mut v);
            v
        })
        .collect();
    // 0 = unvisited, 1 = on the path, 2 = done.
    let mut mark = vec![0u8; rules.len()];
    for start in 0..rules.len() {
        if mark[start] != 0 {
            continue;
        }
        let mut path: Vec<(usize, usize)> = vec![(start, 0)];
        mark[start] = 1;
        while let Some(&mut (r, ref mut next)) = path.last_mut() {
            if let Some(&s) = first[r].get(*next) {
                *next += 1;
                match mark[s] {
                    0 => {
                        mark[s] = 1;
                        path.push((s, 0));
                    }
                    1 => {
                        let from = path.iter().position(|&(x, _)| x == s).unwrap_or(0);
                        let mut names: Vec<&str> = path[from..].iter().map(|&(x, _)| rules[x].name.as_str()).collect();
                        names.push(&rules[s].name);
                        return Err(error(
                            src,
                            rules[s].at,
                            format!(
                                "rule `{}` is left-recursive ({}): it can reach itself without consuming input, which the engine (like llama.cpp) cannot run; rewrite it with repetition, e.g. `list ::= item (\",\" item)*` instead of `list ::= list \",\" item | item`",
                                rules[s].name,
                                names.join(" -> ")
                            ),
                        ));
                    }
                    _ => {}
                }
            } else {
                mark[r] = 2;
                path.pop();
            }
        }
    }
    Ok(())
}

/// Which rules reach no recursion (their own or another's), and those rules in an order where
/// each comes after the rules it refers to.
fn regular_rules(refs: &[Vec<usize>]) -> (Vec<bool>, Vec<usize>) {
    let n = refs.len();
    let mut users: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut pending: Vec<usize> = refs.iter().map(Vec::len).collect();
    for (r, out) in refs.iter().enumerate() {
        for &s in out {
            users[s].push(r);
        }
    }
    let mut order: Vec<usize> = (0..n).filter(|&r| pending[r] == 0).collect();
    let mut i = 0;
    while i < order.len() {
        let s = order[i];
        i += 1;
        for &u in &users[s] {
            pending[u] -= 1;
            if pending[u] == 0 {
                order.push(u);
            }
        }
    }
    let mut regular = vec![false; n];
    for &r in &order {
        regular[r] = true;
    }
    (regular, order)
}

struct Compiler<'a> {
    b: &'a mut Builder,
    nullable: &'a [bool],
    regular: Vec<bool>,
    /// Each regular rule's regex (`None`: not regular, or too long).
    rx: Vec<Option<String>>,
    /// Each rule's node, once referred to as a node.
    rule_nodes: Vec<Option<NodeId>>,
    placeholders: HashSet<NodeId>,
    /// Rules whose nodes are placeholders still to fill.
    todo: Vec<usize>,
    /// Regexes compiled (`None`: too large).
    regexes: HashMap<String, Option<NodeId>>,
    failures: usize,
    /// Bytes of merged regex compiled so far.
    compiled: usize,
    src: &'a str,
}

impl Compiler<'_> {
    /// Whether `a` can be one regex.
    fn is_regular(&self, a: &Ast) -> bool {
        match a {
            Ast::Lit(_) | Ast::Class { .. } | Ast::Any => true,
            Ast::Ref { rule, .. } => self.regular[*rule] && self.rx[*rule].is_some(),
            Ast::Seq(v) | Ast::Alt(v) => v.iter().all(|x| self.is_regular(x)),
            Ast::Rep { item, .. } => self.is_regular(item),
        }
    }

    /// Append `a` (regular) as a regex to `out`; false if it does not fit
    /// [`MAX_PATTERN_BYTES`].
    fn write_rx(&self, a: &Ast, out: &mut String) -> bool {
        match a {
            Ast::Lit(s) => out.push_str(&regex::escape(s)),
            Ast::Class { negated, ranges, .. } => {
                if ranges.is_empty() {
                    out.push_str("(?s:.)");
                } else {
                    out.push_str(if *negated { "[^" } else { "[" });
                    for &(lo, hi) in ranges {
                        out.push_str(&format!("\\x{{{lo:X}}}"));
                        if hi != lo {
                            out.push_str(&format!("-\\x{{{hi:X}}}"));
                        }
                    }
                    out.push(']');
                }
            }
            Ast::Any => out.push_str("(?s:.)"),
            Ast::Ref { rule, .. } => match &self.rx[*rule] {
                Some(r) => {
                    out.push_str("(?:");
                    out.push_str(r);
                    out.push(')');
                }
                None => return false,
            },
            Ast::Seq(v) => return self.write_all(v.iter(), "", out),
            Ast::Alt(v) => return self.write_all(v.iter(), "|", out),
            Ast::Rep { item, min, max, .. } => {
                out.push_str("(?:");
                if !self.write_rx(item, out) {
                    return false;
                }
                out.push_str(&match max {
                    Some(m) => format!("){{{min},{m}}}"),
                    None => format!("){{{min},}}"),
                });
            }
        }
        out.len() <= MAX_PATTERN_BYTES
    }

    /// `(?:a)(?:b)...` (`sep` "") or `(?:a|b|...)` (`sep` "|").
    fn write_all<'x>(&self, items: impl Iterator<Item = &'x Ast>, sep: &str, out: &mut String) -> bool {
        out.push_str("(?:");
        for (i, x) in items.enumerate() {
            if i > 0 {
                out.push_str(sep);
            }
            if sep.is_empty() {
                out.push_str("(?:");
            }
            if !self.write_rx(x, out) {
                return false;
            }
            if sep.is_empty() {
                out.push(')');
            }
        }
        out.push(')');
        out.len() <= MAX_PATTERN_BYTES
    }

    /// The regex's lexeme, or `None` if it is too large (then the caller builds nodes).
    fn try_regex(&mut self, pattern: String) -> Option<NodeId> {
        if let Some(&id) = self.regexes.get(&pattern) {
            return id;
        }
        if self.failures >= MAX_REGEX_FAILURES || self.compiled + pattern.len() > COMPILE_BUDGET {
            return None;
        }
        self.compiled += pattern.len();
        let id = match DfaTable::with_max_states(&pattern, &|_| false, MERGED_MAX_STATES) {
            Ok(t) => {
                tracing::debug!(pattern, states = t.num_states(), "GBNF lexeme compiled");
                Some(self.b.add_dfa(t))
            }
            Err(e) => {
                tracing::debug!(pattern, error = %e, "GBNF lexeme left to grammar nodes");
                self.failures += 1;
                None
            }
        };
        self.regexes.insert(pattern, id);
        id
    }

    /// `a` as a node: one regex if it is a regular rule or made of terminals only (not a
    /// plain literal), else nodes.
    fn node(&mut self, a: &Ast) -> Result<NodeId, GrammarError> {
        let whole = match a {
            Ast::Lit(_) => false,
            Ast::Ref { .. } => self.is_regular(a),
            _ => terminals_only(a),
        };
        if whole {
            let mut p = String::new();
            if self.write_rx(a, &mut p) {
                if let Some(id) = self.try_regex(p) {
                    return Ok(id);
                }
            }
        }
        Ok(match a {
            Ast::Lit(s) => self.b.lit(s),
            Ast::Class { at, .. } => {
                let mut p = String::new();
                self.write_rx(a, &mut p);
                self.b.regex(&p, false).map_err(|e| error(self.src, *at, format!("character class: {e}")))?
            }
            Ast::Any => self.b.regex("(?s:.)", false)?,
            Ast::Ref { rule, .. } => self.rule_node(*rule),
            Ast::Seq(v) => {
                let parts = self.merged(v, false)?;
                if parts.len() == 1 { parts[0] } else { self.b.seq(parts) }
            }
            Ast::Alt(v) => {
                let parts = self.merged(v, true)?;
                if parts.len() == 1 { parts[0] } else { self.b.choice(parts) }
            }
            Ast::Rep { item, min, max, at } => {
                if max.is_none() && nullable(item, self.nullable) {
                    // Whole, as one regex, if it is regular.
                    let mut p = String::new();
                    if self.is_regular(a) && self.write_rx(a, &mut p) {
                        if let Some(id) = self.try_regex(p) {
                            return Ok(id);
                        }
                    }
                    return Err(error(
                        self.src,
                        *at,
                        "this unbounded repetition repeats something that can match the empty text; outside the grammar's regular parts (compiled as regexes) the engine needs every repetition to consume input: make the repeated part non-empty",
                    ));
                }
                let item = self.node(item)?;
                self.b.add(Node::Repeat { item, sep: None, min: *min, max: max.unwrap_or(u32::MAX) })
            }
        })
    }

    /// The items of a sequence (`alt` false) or the alternatives of a choice as nodes, those
    /// made of terminals merged into one regex where they are next to each other (a sequence)
    /// or anywhere (a choice). A regular rule stays its own lexeme, shared by every place
    /// that uses it: merged into each, its DFA states would be repeated in each lexeme, and
    /// the tokens of every DFA state are computed ahead for each vocabulary.
    fn merged(&mut self, items: &[Ast], alt: bool) -> Result<Vec<NodeId>, GrammarError> {
        let mut parts = Vec::new();
        let mut run: Vec<&Ast> = Vec::new();
        for x in items {
            if terminals_only(x) {
                run.push(x);
            } else {
                if !alt {
                    self.flush(&mut run, alt, &mut parts)?;
                }
                parts.push(self.node(x)?);
            }
        }
        self.flush(&mut run, alt, &mut parts)?;
        Ok(parts)
    }

    fn flush(&mut self, run: &mut Vec<&Ast>, alt: bool, parts: &mut Vec<NodeId>) -> Result<(), GrammarError> {
        if run.len() > 1 {
            let mut p = String::new();
            if self.write_all(run.iter().copied(), if alt { "|" } else { "" }, &mut p) {
                if let Some(id) = self.try_regex(p) {
                    parts.push(id);
                    run.clear();
                    return Ok(());
                }
            }
        }
        for x in run.drain(..) {
            parts.push(self.node(x)?);
        }
        Ok(())
    }

    /// The node of rule `r` (a placeholder filled once its body is built).
    fn rule_node(&mut self, r: usize) -> NodeId {
        if let Some(id) = self.rule_nodes[r] {
            return id;
        }
        let id = self.b.choice(vec![]);
        self.rule_nodes[r] = Some(id);
        self.placeholders.insert(id);
        self.todo.push(r);
        id
    }
}
