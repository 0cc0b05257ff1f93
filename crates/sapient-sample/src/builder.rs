//! The grammar's node arena and the JSON building blocks (whitespace, strings, numbers,
//! objects, arrays) shared by free JSON and the JSON Schema compiler.

use crate::dfa::DfaTable;
use crate::error::GrammarError;

/// Most integer digits of a ranged decimal number.
pub(crate) const MAX_INT_DIGITS: u32 = 15;
/// Most fraction digits of a ranged decimal number.
pub(crate) const MAX_FRAC_DIGITS: u32 = 12;

pub(crate) type NodeId = u32;

#[derive(Debug, Clone)]
pub(crate) enum Node {
    Bytes(Box<[u8]>),
    Dfa(u32),
    Int { lo: i64, hi: i64 },
    Float { lo: f64, hi: f64, lo_excl: bool, hi_excl: bool },
    StopAt { stop: Box<[u8]>, fail: Box<[u32]> },
    Seq(Box<[NodeId]>),
    Choice(Box<[NodeId]>),
    Repeat { item: NodeId, sep: Option<NodeId>, min: u32, max: u32 },
}

/// Options for JSON (free-form and schema).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct JsonOptions {
    /// Whitespace allowed between JSON tokens (spaces, tabs, newlines), per gap. 0 gives
    /// compact JSON. Bounded so a model cannot loop on whitespace.
    pub max_whitespace: usize,
}

impl Default for JsonOptions {
    fn default() -> Self {
        Self { max_whitespace: 24 }
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
pub(crate) const JSON_NUMBER: &str = r"-?(?:0|[1-9][0-9]{0,15})(?:\.[0-9]{1,15})?(?:[eE][+-]?[0-9]{1,2})?";

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
        // The decimal form has at most 15 integer and 12 fractional digits: check that some
        // such number is in range (the smallest multiple of 1e-12 above the low bound).
        if lo.is_finite() {
            let scale = 10f64.powi(MAX_FRAC_DIGITS as i32);
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
        Ok(self.add(Node::Float { lo, hi, lo_excl, hi_excl }))
    }
    /// JSON whitespace node, or `None` for compact JSON.
    pub fn ws(&mut self) -> Result<Option<NodeId>, GrammarError> {
        if let Some(w) = self.ws {
            return Ok(w);
        }
        let w = match self.json.max_whitespace {
            0 => None,
            k => Some(self.regex(&format!("[ \\t\\n\\r]{{0,{k}}}"), false)?),
        };
        self.ws = Some(w);
        Ok(w)
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
        let number = self.regex(JSON_NUMBER, false)?;
        let lits: Vec<NodeId> = ["true", "false", "null"].iter().map(|s| self.lit(s)).collect();
        let comma = self.lit(",");
        let sep = self.seq_ws(&[ws, Some(comma), ws]);
        // object
        let colon = self.lit(":");
        let member = self.seq_ws(&[Some(string), ws, Some(colon), ws, Some(value)]);
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

pub(crate) fn kmp_failure(p: &[u8]) -> Vec<u32> {
    let mut f = vec![0u32; p.len()];
    let mut k = 0usize;
    for i in 1..p.len() {
        while k > 0 && p[i] != p[k] {
            k = f[k - 1] as usize;
        }
        if p[i] == p[k] {
            k += 1;
        }
        f[i] = k as u32;
    }
    f
}
