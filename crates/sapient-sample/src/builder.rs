//! The grammar's node arena and the JSON building blocks (whitespace, strings, numbers,
//! objects, arrays) shared by free JSON and the JSON Schema compiler.

use crate::dfa::DfaTable;
use crate::error::GrammarError;
use crate::number::{IntRange, NumRange};

pub(crate) type NodeId = u32;

#[derive(Debug, Clone)]
pub(crate) enum Node {
    Bytes(Box<[u8]>),
    Dfa(u32),
    /// An integer in a range (crate::number).
    Int(IntRange),
    /// A JSON number in a range, as JSON writes it (crate::number).
    Num(NumRange),
    Seq(Box<[NodeId]>),
    Choice(Box<[NodeId]>),
    Repeat { item: NodeId, sep: Option<NodeId>, min: u32, max: u32 },
}

/// How JSON text is laid out between its tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum JsonLayout {
    /// No whitespace at all: `{"a":1,"b":[true,null]}`. Every key, colon, comma and bracket
    /// is then the only continuation where the grammar needs one, so it is forced.
    Compact,
    /// One space after each colon and comma, nothing else, on one line (Python's
    /// `json.dumps` layout): `{"a": 1, "b": [true, null]}`. As forced as `Compact`.
    Spaced,
    /// Any JSON whitespace (spaces, tabs, newlines) between tokens, at most this many
    /// characters per gap. Small models wander into blank lines and runs of spaces with it.
    Flexible { max_whitespace: usize },
}

/// Options for JSON (free-form and schema). The default is [`JsonLayout::Compact`] (no
/// whitespace between tokens: that changes no value). Numbers are always allowed in every
/// form JSON has (RFC 8259: `2.0`, `19.90`, `-0.0`, `1e-7`), so the model writes its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JsonOptions {
    pub layout: JsonLayout,
    /// OpenAI's strict mode: an object schema that lists `properties` and says nothing of
    /// `additionalProperties` allows no other property (JSON Schema's own default allows
    /// any). An object schema that lists none (`{"type": "object"}`) stays any object.
    /// Off by default. See [`crate::strict_schema`] (the same for part of a grammar).
    pub strict: bool,
    /// How many levels deep a recursive `$ref` may nest (at least 1; 5 by default). A
    /// schema's `$ref` inside its own expansion is unrolled up to this many levels; at the
    /// last level the branches that would nest it again (an optional property, an array
    /// item, an `anyOf` branch) are removed, so the model is made to close the document
    /// instead of nesting without end. A schema whose recursion cannot stop (a required
    /// property that is its own type) is refused as unsatisfiable.
    pub max_ref_depth: u32,
    /// Deepest parse stack, in grammar frames (each level of JSON nesting takes two to four):
    /// 1 to [`MAX_STACK_DEPTH`], 2048 by default. Text that would need a deeper stack is not
    /// allowed: its tokens are masked out, and feeding it is rejected like any other text
    /// the grammar refuses. Free JSON (and a schema's free-form values) nest as deep as this
    /// allows; a grammar whose start alone needs more is refused.
    pub max_stack_depth: u32,
}

/// The largest [`JsonOptions::max_stack_depth`].
pub const MAX_STACK_DEPTH: u32 = 1 << 16;

impl Default for JsonOptions {
    fn default() -> Self {
        Self { layout: JsonLayout::Compact, strict: false, max_ref_depth: 5, max_stack_depth: 2048 }
    }
}

impl JsonOptions {
    /// Compact JSON (the default).
    pub fn compact() -> Self {
        Self::default()
    }
    /// One space after colons and commas.
    pub fn spaced() -> Self {
        Self { layout: JsonLayout::Spaced, ..Self::default() }
    }
    /// Flexible whitespace, at most `max_whitespace` characters per gap.
    pub fn flexible(max_whitespace: usize) -> Self {
        Self { layout: JsonLayout::Flexible { max_whitespace }, ..Self::default() }
    }
    /// [`JsonOptions::strict`] set.
    pub fn strict(self) -> Self {
        Self { strict: true, ..self }
    }
}

/// Any JSON number (RFC 8259) with at most 19 digits either side of the point (more than a
/// double tells apart: small models otherwise run on writing digits) and a two-digit exponent
/// (so that a double holds it).
pub(crate) const JSON_NUMBER: &str = r"-?(?:0|[1-9][0-9]{0,18})(?:\.[0-9]{1,19})?(?:[eE][+-]?[0-9]{1,2})?";

/// Builds the node arena (used by `Grammar::new` and the JSON Schema compiler).
pub(crate) struct Builder {
    pub nodes: Vec<Node>,
    pub dfas: Vec<DfaTable>,
    dfa_ids: std::collections::HashMap<(String, bool), NodeId>,
    /// Automata compiled by `dfa_of` (to be combined, not added).
    dfa_cache: std::collections::HashMap<(String, bool), DfaTable>,
    /// The keys other than these listed names, any JSON string's text ([`DfaTable::product`]
    /// of the any-key automaton without the names), by the names: objects that list the
    /// same properties share one.
    pub other_keys: std::collections::HashMap<Vec<String>, DfaTable>,
    pub json: JsonOptions,
    json_value: Option<NodeId>,
    ws: Option<Option<NodeId>>,
}

/// A `\uXXXX` escape: no lone surrogates (a high surrogate must be followed by a low one).
pub(crate) const JSON_UNICODE_ESCAPE: &str =
    r"\\u(?:[0-9a-cA-Ce-fE-F][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2}|[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2})";
pub(crate) const JSON_STRING: &str = concat!(
    r#""(?:[^"\\\x00-\x1F]|\\["\\/bfnrt]|"#,
    r"\\u(?:[0-9a-cA-Ce-fE-F][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2}|[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2})",
    r#")*""#
);

impl Builder {
    pub fn new(json: JsonOptions) -> Self {
        Self { nodes: Vec::new(), dfas: Vec::new(), dfa_ids: Default::default(), dfa_cache: Default::default(), other_keys: Default::default(), json, json_value: None, ws: None }
    }

    pub fn add(&mut self, n: Node) -> NodeId {
        self.nodes.push(n);
        (self.nodes.len() - 1) as NodeId
    }
    pub fn lit(&mut self, s: &str) -> NodeId {
        self.add(Node::Bytes(s.as_bytes().into()))
    }
    pub fn seq(&mut self, v: Vec<NodeId>) -> NodeId {
        self.add(Node::Seq(v.into()))
    }
    pub fn choice(&mut self, v: Vec<NodeId>) -> NodeId {
        self.add(Node::Choice(v.into()))
    }
    /// A regex lexeme; `json_safe` removes `"`, `\` and control bytes from its language.
    pub fn regex(&mut self, pattern: &str, json_safe: bool) -> Result<NodeId, GrammarError> {
        self.regex_by(pattern, json_safe, || {
            let forbid = |b: u8| json_safe && (b == b'"' || b == b'\\' || b < 0x20);
            DfaTable::new(pattern, &forbid)
        })
    }
    /// [`Builder::regex`], with `build` making the automaton of `pattern` if no grammar
    /// has yet (see [`crate::dfa::compiled_by`]).
    pub fn regex_by(&mut self, pattern: &str, json_safe: bool, build: impl FnOnce() -> Result<DfaTable, GrammarError>) -> Result<NodeId, GrammarError> {
        if let Some(&id) = self.dfa_ids.get(&(pattern.to_string(), json_safe)) {
            return Ok(id);
        }
        let t = crate::dfa::compiled_by(pattern, json_safe, build)?;
        tracing::debug!(pattern, states = t.num_states(), "regex compiled");
        self.dfas.push(t);
        let id = self.add(Node::Dfa((self.dfas.len() - 1) as u32));
        self.dfa_ids.insert((pattern.to_string(), json_safe), id);
        Ok(id)
    }
    /// A regex's automaton, not added to the grammar (to be combined with others first).
    pub fn dfa_of(&mut self, pattern: &str, json_safe: bool) -> Result<DfaTable, GrammarError> {
        let key = (pattern.to_string(), json_safe);
        if let Some(&id) = self.dfa_ids.get(&key) {
            if let Node::Dfa(d) = self.nodes[id as usize] {
                return Ok(self.dfas[d as usize].clone());
            }
        }
        if let Some(t) = self.dfa_cache.get(&key) {
            return Ok(t.clone());
        }
        let t = crate::dfa::compiled(pattern, json_safe)?;
        self.dfa_cache.insert(key, t.clone());
        Ok(t)
    }
    /// An automaton made by [`Builder::dfa_of`] and combined, as a lexeme.
    pub fn add_dfa(&mut self, t: DfaTable) -> NodeId {
        // Where it is any text (a searched pattern once found), its states take the token
        // sets of the any-text automaton, which every grammar shares.
        let t = match self.dfa_of("(?s:.)*", true) {
            Ok(any) => t.alias_any(&any),
            Err(_) => t,
        };
        self.dfas.push(t);
        self.add(Node::Dfa((self.dfas.len() - 1) as u32))
    }
    /// Text up to and including the first `stop` (`until`), or any text without `stop`.
    pub fn stop_string(&mut self, stop: &str, until: bool) -> Result<NodeId, GrammarError> {
        let key = (format!("{}{stop}", if until { "until:" } else { "without:" }), true);
        if let Some(&id) = self.dfa_ids.get(&key) {
            return Ok(id);
        }
        self.dfas.push(DfaTable::stop_string(stop.as_bytes(), until)?);
        let id = self.add(Node::Dfa((self.dfas.len() - 1) as u32));
        self.dfa_ids.insert(key, id);
        Ok(id)
    }
    /// An integer in `[lo, hi]`; `zero_frac`: also written with a fraction of zeros (`4.0`).
    pub fn int(&mut self, lo: i64, hi: i64, zero_frac: bool) -> Result<NodeId, GrammarError> {
        self.int_multiple(lo, hi, zero_frac, 1)
    }
    /// [`Builder::int`] with only the multiples of `multiple` (`multipleOf`).
    pub fn int_multiple(&mut self, lo: i64, hi: i64, zero_frac: bool, multiple: u64) -> Result<NodeId, GrammarError> {
        let r = IntRange { lo, hi, zero_frac, multiple: multiple.max(1) };
        if lo > hi || !r.hits(lo as i128, hi as i128) {
            return Err(GrammarError::Unsatisfiable(format!("no integer in [{lo}, {hi}] (multiple of {multiple})")));
        }
        Ok(self.add(Node::Int(r)))
    }
    /// A JSON number in a range (infinite ends are open).
    pub fn num(&mut self, lo: f64, hi: f64, lo_excl: bool, hi_excl: bool) -> Result<NodeId, GrammarError> {
        if lo.is_nan() || hi.is_nan() {
            return Err(GrammarError::Unsatisfiable("a number range with NaN".into()));
        }
        if lo.is_infinite() && hi.is_infinite() && lo < hi {
            return self.json_number();
        }
        let r = NumRange::new(lo, lo_excl, hi, hi_excl);
        if r.is_empty() {
            return Err(GrammarError::Unsatisfiable(format!("number range {lo}..{hi} is empty")));
        }
        Ok(self.add(Node::Num(r)))
    }
    /// Whitespace allowed in any gap between JSON tokens (only with a flexible layout).
    pub fn ws(&mut self) -> Result<Option<NodeId>, GrammarError> {
        if let Some(w) = self.ws {
            return Ok(w);
        }
        let w = match self.json.layout {
            JsonLayout::Flexible { max_whitespace: k } if k > 0 => Some(self.regex(&format!("[ \\t\\n\\r]{{0,{k}}}"), false)?),
            _ => None,
        };
        self.ws = Some(w);
        Ok(w)
    }
    /// What follows a colon or a comma: one space with the spaced layout, else `ws`.
    pub fn after_punct(&mut self) -> Result<Option<NodeId>, GrammarError> {
        match self.json.layout {
            JsonLayout::Spaced => Ok(Some(self.lit(" "))),
            _ => self.ws(),
        }
    }
    /// The separator between items and members: `,` with the layout's whitespace.
    pub fn comma(&mut self) -> Result<NodeId, GrammarError> {
        let ws = self.ws()?;
        let after = self.after_punct()?;
        let comma = self.lit(",");
        Ok(self.seq_ws(&[ws, Some(comma), after]))
    }
    /// `key : value` with the layout's whitespace.
    pub fn member(&mut self, key: NodeId, value: NodeId) -> Result<NodeId, GrammarError> {
        let ws = self.ws()?;
        let after = self.after_punct()?;
        let colon = self.lit(":");
        Ok(self.seq_ws(&[Some(key), ws, Some(colon), after, Some(value)]))
    }
    /// Any JSON number.
    pub fn json_number(&mut self) -> Result<NodeId, GrammarError> {
        self.regex(JSON_NUMBER, false)
    }
    /// This JSON value exactly (`const`, `enum`), laid out like generated JSON.
    pub fn json_const(&mut self, v: &serde_json::Value) -> Result<NodeId, GrammarError> {
        use serde_json::Value;
        Ok(match v {
            Value::Array(items) if !items.is_empty() => {
                let ws = self.ws()?;
                let sep = self.comma()?;
                let mut parts = vec![Some(self.lit("[")), ws];
                for (i, x) in items.iter().enumerate() {
                    if i > 0 {
                        parts.push(Some(sep));
                    }
                    parts.push(Some(self.json_const(x)?));
                }
                parts.extend([ws, Some(self.lit("]"))]);
                self.seq_ws(&parts)
            }
            Value::Object(m) if !m.is_empty() => {
                let ws = self.ws()?;
                let sep = self.comma()?;
                let mut parts = vec![Some(self.lit("{")), ws];
                for (i, (k, x)) in m.iter().enumerate() {
                    if i > 0 {
                        parts.push(Some(sep));
                    }
                    let key = self.lit(&serde_json::to_string(k).unwrap_or_default());
                    let val = self.json_const(x)?;
                    parts.push(Some(self.member(key, val)?));
                }
                parts.extend([ws, Some(self.lit("}"))]);
                self.seq_ws(&parts)
            }
            Value::Array(_) => {
                let ws = self.ws()?;
                let (o, c) = (self.lit("["), self.lit("]"));
                self.seq_ws(&[Some(o), ws, Some(c)])
            }
            Value::Object(_) => {
                let ws = self.ws()?;
                let (o, c) = (self.lit("{"), self.lit("}"));
                self.seq_ws(&[Some(o), ws, Some(c)])
            }
            // A number is the value, in any form JSON writes it (`1`, `1.0`, `1e0`).
            Value::Number(n) => match n.as_f64() {
                Some(x) if x.is_finite() => self.num(x, x, false, false)?,
                _ => self.lit(&n.to_string()),
            },
            other => self.lit(&serde_json::to_string(other).unwrap_or_default()),
        })
    }
    /// `ws a ws` style sequences: `None` entries (no whitespace) are skipped.
    pub fn seq_ws(&mut self, parts: &[Option<NodeId>]) -> NodeId {
        let v = parts.iter().flatten().copied().collect();
        self.seq(v)
    }
    pub fn json_string(&mut self) -> Result<NodeId, GrammarError> {
        self.regex(JSON_STRING, false)
    }
    /// Any JSON value (recursive).
    pub fn json_value(&mut self) -> Result<NodeId, GrammarError> {
        if let Some(v) = self.json_value {
            return Ok(v);
        }
        let value = self.choice(vec![]); // placeholder, filled below
        self.json_value = Some(value);
        let ws = self.ws()?;
        let string = self.json_string()?;
        let number = self.json_number()?;
        let lits: Vec<NodeId> = ["true", "false", "null"].iter().map(|s| self.lit(s)).collect();
        let sep = self.comma()?;
        let member = self.member(string, value)?;
        let obj = self.object_of(member, sep, ws)?;
        let arr = self.array_of(value, sep, ws, 0, u32::MAX)?;
        let mut alts = vec![obj, arr, string, number];
        alts.extend(lits);
        self.nodes[value as usize] = Node::Choice(alts.into());
        Ok(value)
    }
    /// `{ }` or `{ member (sep member)* }`.
    pub fn object_of(&mut self, member: NodeId, sep: NodeId, ws: Option<NodeId>) -> Result<NodeId, GrammarError> {
        let open = self.lit("{");
        let close = self.lit("}");
        let members = self.add(Node::Repeat { item: member, sep: Some(sep), min: 1, max: u32::MAX });
        let nonempty = self.seq_ws(&[Some(members), ws, Some(close)]);
        let body = self.choice(vec![close, nonempty]);
        Ok(self.seq_ws(&[Some(open), ws, Some(body)]))
    }
    pub fn array_of(&mut self, item: NodeId, sep: NodeId, ws: Option<NodeId>, min: u32, max: u32) -> Result<NodeId, GrammarError> {
        if min > max {
            return Err(GrammarError::Unsatisfiable(format!("array needs between {min} and {max} items")));
        }
        let open = self.lit("[");
        let close = self.lit("]");
        let mut alts = Vec::new();
        if min == 0 {
            alts.push(close);
        }
        if max > 0 {
            let items = self.add(Node::Repeat { item, sep: Some(sep), min: min.max(1), max });
            alts.push(self.seq_ws(&[Some(items), ws, Some(close)]));
        }
        let body = self.choice(alts);
        Ok(self.seq_ws(&[Some(open), ws, Some(body)]))
    }

}
