//! The grammar's node arena and the JSON building blocks (whitespace, strings, numbers,
//! objects, arrays) shared by free JSON and the JSON Schema compiler.

use crate::dfa::DfaTable;
use crate::error::GrammarError;

/// Most integer digits of a ranged decimal number.
pub(crate) const MAX_INT_DIGITS: u32 = 15;
/// Most fraction digits a number may have ([`JsonOptions::max_fraction_digits`] is capped
/// here).
pub(crate) const MAX_FRAC_DIGITS: u32 = 12;

pub(crate) type NodeId = u32;

#[derive(Debug, Clone)]
pub(crate) enum Node {
    Bytes(Box<[u8]>),
    Dfa(u32),
    Int { lo: i64, hi: i64 },
    /// A decimal number in a range; `max_frac`: most fraction digits (a fraction never ends
    /// in 0, and there is no `-0`).
    Float { lo: f64, hi: f64, lo_excl: bool, hi_excl: bool, max_frac: u32 },
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

/// Options for JSON (free-form and schema): the layout between tokens and the form numbers
/// take. The default is canonical: [`JsonLayout::Compact`], numbers with at most 6 fraction
/// digits, no trailing zeros in a fraction, no `-0` and no exponent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JsonOptions {
    pub layout: JsonLayout,
    /// Most digits after the decimal point (1 to 12). A fraction never ends in `0`
    /// (`2.5`, not `2.50`), and `-0` (`-0.0`, ...) is never generated.
    pub max_fraction_digits: u32,
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
        Self { layout: JsonLayout::Compact, max_fraction_digits: 6, max_ref_depth: 5, max_stack_depth: 2048 }
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
    /// Flexible whitespace, at most `max_whitespace` characters per gap; numbers may then
    /// also take an exponent (`1e-3`).
    pub fn flexible(max_whitespace: usize) -> Self {
        Self { layout: JsonLayout::Flexible { max_whitespace }, ..Self::default() }
    }
    pub(crate) fn frac_digits(&self) -> u32 {
        self.max_fraction_digits.clamp(1, MAX_FRAC_DIGITS)
    }
    /// The regex of an unbounded JSON number under these options.
    pub(crate) fn number_regex(&self) -> String {
        let f = self.frac_digits();
        let frac = if f == 1 { r"\.[1-9]".to_string() } else { format!(r"\.[0-9]{{0,{}}}[1-9]", f - 1) };
        let exp = if matches!(self.layout, JsonLayout::Flexible { .. }) { r"(?:[eE][+-]?[1-9][0-9]?)?" } else { "" };
        // No `-0`: a negative number has a non-zero digit somewhere.
        format!(r"(?:(?:0|[1-9][0-9]{{0,15}})(?:{frac})?|-(?:[1-9][0-9]{{0,15}}(?:{frac})?|0{frac})){exp}")
    }
}

/// Builds the node arena (used by `Grammar::new` and the JSON Schema compiler).
pub(crate) struct Builder {
    pub nodes: Vec<Node>,
    pub dfas: Vec<DfaTable>,
    dfa_ids: std::collections::HashMap<(String, bool), NodeId>,
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
        Self { nodes: Vec::new(), dfas: Vec::new(), dfa_ids: Default::default(), json, json_value: None, ws: None }
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
        if let Some(&id) = self.dfa_ids.get(&(pattern.to_string(), json_safe)) {
            return Ok(id);
        }
        let forbid = |b: u8| json_safe && (b == b'"' || b == b'\\' || b < 0x20);
        let t = DfaTable::new(pattern, &forbid)?;
        tracing::debug!(pattern, states = t.num_states(), "regex compiled");
        self.dfas.push(t);
        let id = self.add(Node::Dfa((self.dfas.len() - 1) as u32));
        self.dfa_ids.insert((pattern.to_string(), json_safe), id);
        Ok(id)
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
    pub fn int(&mut self, lo: i64, hi: i64) -> Result<NodeId, GrammarError> {
        if lo > hi {
            return Err(GrammarError::Unsatisfiable(format!("integer range [{lo}, {hi}] is empty")));
        }
        Ok(self.add(Node::Int { lo, hi }))
    }
    pub fn float(&mut self, lo: f64, hi: f64, lo_excl: bool, hi_excl: bool) -> Result<NodeId, GrammarError> {
        if lo.is_nan() || hi.is_nan() || lo > hi || (lo == hi && (lo_excl || hi_excl)) {
            return Err(GrammarError::Unsatisfiable(format!("number range {lo}..{hi} is empty")));
        }
        // The decimal form has at most 15 integer and `max_frac` fractional digits: check
        // that some such number is in range (the smallest multiple of 10^-max_frac above
        // the low bound).
        let max_frac = self.json.frac_digits();
        if lo.is_finite() {
            let scale = 10f64.powi(max_frac as i32);
            let mut c = (lo * scale).ceil();
            if lo_excl && c / scale <= lo {
                c += 1.0;
            }
            let x = c / scale;
            if !(x < hi || (x == hi && !hi_excl)) || x.abs() >= 10f64.powi(MAX_INT_DIGITS as i32) {
                return Err(GrammarError::Unsatisfiable(format!("no decimal number in range {lo}..{hi}")));
            }
        } else if hi.is_finite() && hi.abs() >= 10f64.powi(MAX_INT_DIGITS as i32) && hi < 0.0 {
            return Err(GrammarError::Unsatisfiable(format!("no decimal number in range {lo}..{hi}")));
        }
        Ok(self.add(Node::Float { lo, hi, lo_excl, hi_excl, max_frac }))
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
    /// An unbounded JSON number under the options' number policy.
    pub fn json_number(&mut self) -> Result<NodeId, GrammarError> {
        let r = self.json.number_regex();
        self.regex(&r, false)
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
