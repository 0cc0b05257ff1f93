//! JSON Schema to grammar nodes.
//!
//! The keywords, and what happens with each, are listed in `KEYWORDS` (the table in
//! docs/structured.md is checked against it by a test). In short: `type` (one or a list),
//! `properties` / `required` (generated in the order the schema lists them; optional ones
//! may be left out), `additionalProperties` (`false`, `true` or a schema: further members
//! after the listed ones, with keys other than theirs), `minProperties` / `maxProperties`,
//! `items`, `prefixItems` (and the older tuple form of `items` with `additionalItems`),
//! `minItems` / `maxItems`, `enum` and `const` of any JSON, `minLength` / `maxLength`,
//! `pattern` (anchored with `^...$` or searched anywhere; such strings are generated without
//! escapes), `format` (`date`, `time`, `date-time`, `email`, `uuid`, `uri`, `ipv4`),
//! `minimum` / `maximum` / `exclusiveMinimum` / `exclusiveMaximum`, `anyOf`, `oneOf`
//! (generated as `anyOf`), `allOf` (merged into one schema), `$ref` within the schema (`#`,
//! `#/$defs/..`, `#/definitions/..`, any JSON pointer; recursion unrolled up to
//! `JsonOptions::max_ref_depth` levels, deeper branches removed), and boolean
//! schemas. Annotations (`title`, `description`, `default`, `examples`, ...) are ignored.
//! Every other JSON Schema keyword (`not`, `if`, `uniqueItems`, `multipleOf`,
//! `patternProperties`, an unknown `format`, ...) is a [`GrammarError::UnsupportedSchema`]
//! naming it: a grammar never silently accepts more than its schema allows. Keys that are
//! not JSON Schema keywords at all (`x-...` extensions) are ignored, as validators do.

use crate::builder::{Builder, NodeId};
use crate::error::GrammarError;
use serde_json::Value;
use std::collections::HashMap;

/// Keywords refused by the grammar only (the validator checks them).
pub(crate) const UNSUPPORTED_IN_GRAMMAR: &[&str] = &[];

/// The JSON Schema keywords a grammar refuses with [`GrammarError::UnsupportedSchema`].
pub fn refused_keywords() -> impl Iterator<Item = &'static str> {
    UNSUPPORTED.iter().chain(UNSUPPORTED_IN_GRAMMAR).copied()
}

/// The JSON Schema keywords a grammar supports (annotations aside).
pub const SUPPORTED_KEYWORDS: &[&str] = &[
    "type", "properties", "required", "additionalProperties", "minProperties", "maxProperties",
    "items", "prefixItems", "additionalItems", "minItems", "maxItems", "enum", "const",
    "minLength", "maxLength", "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", "anyOf", "oneOf", "allOf", "$ref", "$defs", "definitions", "not", "if", "then",
    "else", "patternProperties", "propertyNames", "dependentRequired", "dependentSchemas", "dependencies",
    "multipleOf",
];
/// The annotation keywords a grammar ignores (they do not constrain a document).
pub const ANNOTATIONS: &[&str] = &[
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
    "readOnly", "writeOnly", "contentMediaType", "contentEncoding", "contentSchema", "$vocabulary",
];


struct Ctx<'a> {
    root: &'a Value,
    /// Compiled `$ref`s by (reference, how many expansions of it enclose this one).
    refs: HashMap<(String, u32), NodeId>,
    /// How many expansions of each `$ref` enclose the subschema being compiled.
    active: HashMap<String, u32>,
    /// [`crate::JsonOptions::max_ref_depth`].
    max_ref_depth: u32,
    depth: usize,
    /// `4.0` is an integer (draft 6 and later; not in draft 4 and earlier).
    zero_frac_ints: bool,
    /// Subschemas compiled inside schemas the compiler built (a merged `allOf`, an `anyOf`
    /// branch merged with its siblings, a rewritten `not` / `if`), by their content (see
    /// [`Ctx::key`]): there the same subschema recurs as a copy per branch, compiled once.
    memo: HashMap<[u64; 3], NodeId>,
    /// Two independent keyed hashes of the content of every object within each such schema
    /// being compiled (innermost last), by its address: each is hashed once, bottom-up,
    /// while it is alive (so no two of these addresses can be the same value's; the
    /// schema's own places, reached through `$ref`, are never among them).
    hashes: Vec<HashMap<usize, [u64; 2]>>,
    hashers: [std::collections::hash_map::RandomState; 2],
}

impl Ctx<'_> {
    /// The memo key of `s` if it lies in a schema the compiler built (see [`Ctx::hashes`]): its
    /// content's two hashes (property order included: it sets the order of generation) and
    /// a hash of the `$ref` expansions in progress (a recursive reference compiles
    /// differently at each level). A false match needs a collision of 128 bits.
    fn key(&self, s: &Value) -> Option<[u64; 3]> {
        use std::hash::BuildHasher;
        let addr = s as *const Value as usize;
        let [h0, h1] = *self.hashes.iter().rev().find_map(|m| m.get(&addr))?;
        let mut active: Vec<(&String, &u32)> = self.active.iter().filter(|(_, &n)| n > 0).collect();
        active.sort_unstable();
        Some([h0, h1, self.hashers[0].hash_one(&active)])
    }

    /// Hash `v` and every value below it (see [`Ctx::hashes`]); objects are recorded.
    fn hash_tree(&self, v: &Value, out: &mut HashMap<usize, [u64; 2]>) -> [u64; 2] {
        use std::hash::{BuildHasher, Hash, Hasher};
        let mut hs = self.hashers.each_ref().map(|r| r.build_hasher());
        let mut feed = |f: &dyn Fn(&mut std::hash::DefaultHasher)| hs.iter_mut().for_each(f);
        match v {
            Value::Null => feed(&|h| h.write_u8(0)),
            Value::Bool(b) => feed(&|h| h.write_u8(1 + u8::from(*b))),
            Value::Number(n) => feed(&|h| (3u8, n).hash(h)),
            Value::String(s) => feed(&|h| (4u8, s).hash(h)),
            Value::Array(a) => {
                feed(&|h| (5u8, a.len()).hash(h));
                for x in a {
                    let c = self.hash_tree(x, out);
                    hs.iter_mut().zip(c).for_each(|(h, c)| h.write_u64(c));
                }
            }
            Value::Object(m) => {
                feed(&|h| (6u8, m.len()).hash(h));
                for (k, x) in m {
                    let c = self.hash_tree(x, out);
                    hs.iter_mut().zip(c).for_each(|(h, c)| (k, c).hash(h));
                }
            }
        }
        let r = hs.map(|h| h.finish());
        if v.is_object() {
            out.insert(v as *const Value as usize, r);
        }
        r
    }
}

/// How deeply subschemas may nest (each level is a recursive call of the compiler).
pub const MAX_SCHEMA_DEPTH: usize = 128;

pub(crate) fn compile(b: &mut Builder, schema: &Value) -> Result<NodeId, GrammarError> {
    let max_ref_depth = b.json.max_ref_depth;
    if max_ref_depth == 0 {
        return Err(GrammarError::InvalidOption("JsonOptions::max_ref_depth must be at least 1".into()));
    }
    let strict;
    let schema = if b.json.strict {
        strict = strict_schema(schema);
        &strict
    } else {
        schema
    };
    let draft = schema.get("$schema").and_then(|s| s.as_str()).unwrap_or("");
    let zero_frac_ints = !(draft.contains("draft-04") || draft.contains("draft-03"));
    let mut cx = Ctx {
        root: schema,
        refs: HashMap::new(),
        active: HashMap::new(),
        max_ref_depth,
        depth: 0,
        zero_frac_ints,
        memo: HashMap::new(),
        hashes: Vec::new(),
        hashers: Default::default(),
    };
    node(b, &mut cx, schema, "#")
}

fn node(b: &mut Builder, cx: &mut Ctx, s: &Value, path: &str) -> Result<NodeId, GrammarError> {
    if cx.depth >= MAX_SCHEMA_DEPTH {
        return Err(GrammarError::TooLarge { what: format!("schema nesting at {path}"), limit: MAX_SCHEMA_DEPTH });
    }
    let key = if matches!(s, Value::Object(m) if !m.is_empty()) { cx.key(s) } else { None };
    if let Some(&id) = key.as_ref().and_then(|k| cx.memo.get(k)) {
        return Ok(id);
    }
    cx.depth += 1;
    let r = node_at_depth(b, cx, s, path);
    cx.depth -= 1;
    if let (Some(k), Ok(id)) = (key, &r) {
        cx.memo.insert(k, *id);
    }
    r
}

/// [`node`] on a schema the compiler built (see [`Ctx::memo`]).
fn synthesized(b: &mut Builder, cx: &mut Ctx, s: &Value, path: &str) -> Result<NodeId, GrammarError> {
    let mut hashes = HashMap::new();
    cx.hash_tree(s, &mut hashes);
    cx.hashes.push(hashes);
    let r = node(b, cx, s, path);
    cx.hashes.pop();
    r
}

fn invalid(path: &str, message: impl Into<String>) -> GrammarError {
    GrammarError::InvalidSchema { path: path.to_string(), message: message.into() }
}


fn node_at_depth(b: &mut Builder, cx: &mut Ctx, s: &Value, path: &str) -> Result<NodeId, GrammarError> {
    let obj = match s {
        Value::Bool(true) => return b.json_value(),
        Value::Bool(false) => return Err(GrammarError::Unsatisfiable(format!("schema `false` at {path}"))),
        Value::Object(o) => o,
        _ => return Err(invalid(path, "a schema must be an object or a boolean")),
    };
    if let Some(r) = obj.get("$ref") {
        let r = r.as_str().ok_or_else(|| invalid(path, "$ref must be a string"))?;
        // Keywords beside `$ref` apply too (draft 2019-09 and later).
        if obj.keys().any(|k| k != "$ref" && !is_annotation(k)) {
            let rest: serde_json::Map<String, Value> = obj.iter().filter(|(k, _)| k.as_str() != "$ref").map(|(k, v)| (k.clone(), v.clone())).collect();
            let all = serde_json::json!({"allOf": [{"$ref": r}, Value::Object(rest)]});
            return synthesized(b, cx, &all, path);
        }
        // A recursive `$ref` is unrolled: each level of nesting is its own copy (regex
        // lexemes are shared), up to `max_ref_depth` levels; deeper, the reference accepts
        // nothing, and the grammar's pruning removes the branches that would need it (an
        // optional property, an array item), so the document is forced to close.
        let k = cx.active.get(r).copied().unwrap_or(0);
        let key = (r.to_string(), k);
        if let Some(&id) = cx.refs.get(&key) {
            return Ok(id);
        }
        let target = resolve(cx.root, r).ok_or_else(|| GrammarError::UnresolvedRef(r.to_string()))?;
        if k >= cx.max_ref_depth {
            return Ok(b.choice(vec![]));
        }
        let placeholder = b.choice(vec![]);
        cx.refs.insert(key, placeholder);
        *cx.active.entry(r.to_string()).or_default() += 1;
        let inner = node(b, cx, target, r);
        if let Some(a) = cx.active.get_mut(r) {
            *a -= 1;
        }
        b.nodes[placeholder as usize] = crate::builder::Node::Choice(vec![inner?].into());
        return Ok(placeholder);
    }
    for k in UNSUPPORTED {
        if obj.contains_key(*k) {
            return Err(GrammarError::UnsupportedSchema { path: path.to_string(), keyword: k.to_string() });
        }
    }
    if obj.get("uniqueItems") == Some(&Value::Bool(true)) {
        tracing::warn!(path, "uniqueItems is not enforced while generating (the array's items may repeat)");
    }
    if let Some(rewritten) = rewrite::expand(cx.root, obj, path)? {
        return synthesized(b, cx, &rewritten, path);
    }
    if let Some(all) = obj.get("allOf") {
        if let Some(id) = all_of_values(b, cx, s, all, path)? {
            return Ok(id);
        }
        let merged = merge_all_of(cx.root, obj, all, path)?;
        return synthesized(b, cx, &merged, &format!("{path}/allOf"));
    }
    if obj.contains_key("const") || obj.contains_key("enum") {
        return values(b, obj, path);
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(list) = obj.get(key) {
            let list = list.as_array().ok_or_else(|| invalid(path, format!("{key} must be an array")))?;
            if list.is_empty() {
                return Err(invalid(path, format!("{key} must not be empty")));
            }
            // Keywords beside anyOf apply to every branch: each branch is merged with them.
            // A branch that no value can satisfy (a type the siblings exclude) is dropped.
            let parent: serde_json::Map<String, Value> = obj.iter().filter(|(k, _)| k.as_str() != key).map(|(k, v)| (k.clone(), v.clone())).collect();
            let plain = parent.keys().all(|k| is_annotation(k));
            let mut alts = Vec::new();
            let mut first_err = None;
            for (i, sub) in list.iter().enumerate() {
                let bpath = format!("{path}/{key}/{i}");
                let merged = if plain || sub.get("$ref").is_some() {
                    Ok(merge_siblings(obj, sub, key))
                } else {
                    merge_all_of(cx.root, &parent, &Value::Array(vec![sub.clone()]), &bpath)
                };
                match merged.and_then(|m| synthesized(b, cx, &m, &bpath)) {
                    Ok(n) => alts.push(n),
                    Err(e @ GrammarError::Unsatisfiable(_)) => {
                        first_err.get_or_insert(e);
                    }
                    Err(e) => return Err(e),
                }
            }
            if alts.is_empty() {
                return Err(first_err.unwrap_or_else(|| GrammarError::Unsatisfiable(format!("no branch of {key} at {path}"))));
            }
            return Ok(b.choice(alts));
        }
    }
    let types: Vec<&str> = match obj.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(a)) => {
            a.iter().map(|t| t.as_str().ok_or_else(|| invalid(path, "type list must hold strings"))).collect::<Result<_, _>>()?
        }
        Some(_) => return Err(invalid(path, "type must be a string or a list")),
        None => {
            if ["properties", "required", "additionalProperties", "minProperties", "maxProperties", "patternProperties", "propertyNames"].iter().any(|k| obj.contains_key(*k)) {
                vec!["object"]
            } else if ["items", "prefixItems", "additionalItems", "minItems", "maxItems"].iter().any(|k| obj.contains_key(*k)) {
                vec!["array"]
            } else if ["minLength", "maxLength", "pattern", "format"].iter().any(|k| obj.contains_key(*k)) {
                vec!["string"]
            } else if ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"].iter().any(|k| obj.contains_key(*k)) {
                vec!["number"]
            } else if obj.contains_key(NOT_VALUES) {
                vec!["null", "boolean", "object", "array", "number", "string"]
            } else {
                return b.json_value();
            }
        }
    };
    if types.is_empty() {
        return Err(GrammarError::Unsatisfiable(format!("empty type list at {path}")));
    }
    // `number` includes the integers.
    let types: Vec<&str> = if types.contains(&"number") { types.into_iter().filter(|t| *t != "integer").collect() } else { types };
    // Values `not` excludes: null and booleans drop out here, strings in the string's
    // automaton; numbers, arrays and objects cannot be told apart by their text.
    let excluded: Vec<Value> = not_values(obj).cloned().collect();
    for v in &excluded {
        let ty = match v {
            Value::Number(_) => Some(["number", "integer"]),
            Value::Array(_) => Some(["array", "array"]),
            Value::Object(_) => Some(["object", "object"]),
            _ => None,
        };
        if let Some(ty) = ty {
            if types.iter().any(|t| ty.contains(t)) {
                return Err(GrammarError::UnsupportedSchema { path: path.to_string(), keyword: format!("not with the value {v}") });
            }
        }
    }
    let mut alts = Vec::new();
    for t in types {
        alts.push(match t {
            "null" | "boolean" => {
                let lits = if t == "null" { vec![("null", Value::Null)] } else { vec![("true", Value::Bool(true)), ("false", Value::Bool(false))] };
                let left: Vec<NodeId> = lits.into_iter().filter(|(_, v)| !excluded.contains(v)).map(|(l, _)| b.lit(l)).collect();
                if left.is_empty() {
                    continue;
                }
                b.choice(left)
            }
            "string" => string(b, obj, path)?,
            "integer" => integer(b, cx.zero_frac_ints, obj, path)?,
            "number" => number(b, obj, path)?,
            "array" => array(b, cx, obj, path)?,
            "object" => object(b, cx, obj, path)?,
            other => return Err(invalid(path, format!("unknown type {other:?}"))),
        });
    }
    match alts.len() {
        0 => Err(GrammarError::Unsatisfiable(format!("every value is excluded at {path}"))),
        1 => Ok(alts[0]),
        _ => Ok(b.choice(alts)),
    }
}

/// `const` / `enum`: the listed values that the schema's other keywords also accept.
fn values(b: &mut Builder, obj: &serde_json::Map<String, Value>, path: &str) -> Result<NodeId, GrammarError> {
    let mut list: Vec<Value> = match (obj.get("const"), obj.get("enum")) {
        (Some(c), _) => vec![c.clone()],
        (None, Some(Value::Array(e))) => e.clone(),
        (None, Some(_)) => return Err(invalid(path, "enum must be an array")),
        (None, None) => vec![],
    };
    if let (Some(_), Some(e)) = (obj.get("const"), obj.get("enum")) {
        let e = e.as_array().ok_or_else(|| invalid(path, "enum must be an array"))?;
        list.retain(|v| e.iter().any(|x| crate::spec::json_eq(x, v)));
    }
    let rest: serde_json::Map<String, Value> = obj.iter().filter(|(k, _)| !["const", "enum"].contains(&k.as_str())).map(|(k, v)| (k.clone(), v.clone())).collect();
    if rest.keys().any(|k| !is_annotation(k)) {
        let rest = Value::Object(rest);
        // Keep the values the rest accepts; a keyword the validator cannot check keeps them.
        list.retain(|v| !matches!(crate::validate::validate(&rest, v), Ok(Err(_))));
        list.retain(|v| !not_values(obj).any(|x| crate::spec::json_eq(x, v)));
    }
    value_choice(b, &list, path)
}

/// A choice of the values `list` of an `enum` or `const` at `path` (none: unsatisfiable).
fn value_choice(b: &mut Builder, list: &[Value], path: &str) -> Result<NodeId, GrammarError> {
    if list.is_empty() {
        return Err(GrammarError::Unsatisfiable(format!("no value of the enum or const at {path} is allowed")));
    }
    let alts = list.iter().map(|v| b.json_const(v)).collect::<Result<_, _>>()?;
    Ok(b.choice(alts))
}

/// `schema` in OpenAI's strict mode: every object schema that lists `properties` (or
/// `patternProperties`) and says nothing of `additionalProperties` gets
/// `"additionalProperties": false`, so no unlisted property is allowed; an object schema
/// listing none (`{"type": "object"}`) stays any object. The branches of an `allOf` are left
/// open at their top (they are merged, and each would forbid the others' properties).
pub fn strict_schema(schema: &Value) -> Value {
    fn walk(s: &Value, close: bool) -> Value {
        let Value::Object(m) = s else { return s.clone() };
        let mut out = serde_json::Map::new();
        for (k, v) in m {
            let v = match (k.as_str(), v) {
                ("properties" | "patternProperties" | "$defs" | "definitions" | "dependentSchemas", Value::Object(sub)) => {
                    Value::Object(sub.iter().map(|(n, x)| (n.clone(), walk(x, true))).collect())
                }
                ("anyOf" | "oneOf" | "prefixItems" | "items", Value::Array(list)) => Value::Array(list.iter().map(|x| walk(x, true)).collect()),
                ("allOf", Value::Array(list)) => Value::Array(list.iter().map(|x| walk(x, false)).collect()),
                ("items" | "additionalProperties" | "additionalItems" | "not" | "if" | "then" | "else" | "propertyNames" | "contains", x) => walk(x, true),
                (_, x) => x.clone(),
            };
            out.insert(k.clone(), v);
        }
        let lists = out.contains_key("properties") || out.contains_key("patternProperties");
        if close && lists && !out.contains_key("additionalProperties") {
            out.insert("additionalProperties".into(), Value::Bool(false));
        }
        Value::Object(out)
    }
    walk(schema, true)
}

/// Internal keyword: values excluded by a `not` of `const` / `enum`.
pub(crate) const NOT_VALUES: &str = "$sapient-not";
/// Internal keyword: further patterns a string must match (two `allOf` branches' patterns).
pub(crate) const PATTERNS: &str = "$sapient-patterns";
/// Most `anyOf` branches an `allOf` of several `anyOf`s is expanded to.
const MAX_BRANCHES: usize = 256;

fn not_values(obj: &serde_json::Map<String, Value>) -> impl Iterator<Item = &Value> {
    obj.get(NOT_VALUES).and_then(|v| v.as_array()).into_iter().flatten()
}

/// Whether a key constrains nothing here: an annotation, `$defs` / `definitions` (read
/// through `$ref` only), or a key that is no keyword this compiler acts on (an extension
/// such as `x-...`, an editor hint such as `doNotSuggest`), ignored as validators ignore
/// unknown keywords. Such keys never make a schema take a slower path (a merge, a check of
/// enum values).
fn is_annotation(k: &str) -> bool {
    if k == "$defs" || k == "definitions" || ANNOTATIONS.contains(&k) {
        return true;
    }
    !(SUPPORTED_KEYWORDS.contains(&k) || UNSUPPORTED.contains(&k) || k.starts_with("$sapient-") || k == "uniqueItems")
}

fn get_u32(obj: &serde_json::Map<String, Value>, k: &str, path: &str) -> Result<Option<u32>, GrammarError> {
    match obj.get(k) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .map(|x| Some(x.min(u32::MAX as u64 - 1) as u32))
            .ok_or_else(|| invalid(path, format!("{k} must be a non-negative integer"))),
    }
}

fn get_f64(obj: &serde_json::Map<String, Value>, k: &str, path: &str) -> Result<Option<f64>, GrammarError> {
    match obj.get(k) {
        None | Some(Value::Bool(_)) => Ok(None),
        Some(v) => v.as_f64().map(Some).ok_or_else(|| invalid(path, format!("{k} must be a number"))),
    }
}

/// (low, low exclusive, high, high exclusive), accepting draft-4 boolean exclusives too.
fn bounds(obj: &serde_json::Map<String, Value>, path: &str) -> Result<(f64, bool, f64, bool), GrammarError> {
    let (mut lo, mut lo_x) = (get_f64(obj, "minimum", path)?.unwrap_or(f64::NEG_INFINITY), false);
    let (mut hi, mut hi_x) = (get_f64(obj, "maximum", path)?.unwrap_or(f64::INFINITY), false);
    match obj.get("exclusiveMinimum") {
        Some(Value::Bool(true)) => lo_x = true,
        Some(v) if v.is_number() => {
            let x = v.as_f64().unwrap_or(f64::NEG_INFINITY);
            if x >= lo {
                lo = x;
                lo_x = true;
            }
        }
        _ => {}
    }
    match obj.get("exclusiveMaximum") {
        Some(Value::Bool(true)) => hi_x = true,
        Some(v) if v.is_number() => {
            let x = v.as_f64().unwrap_or(f64::INFINITY);
            if x <= hi {
                hi = x;
                hi_x = true;
            }
        }
        _ => {}
    }
    Ok((lo, lo_x, hi, hi_x))
}

fn integer(b: &mut Builder, zero_frac: bool, obj: &serde_json::Map<String, Value>, path: &str) -> Result<NodeId, GrammarError> {
    let (lo, lo_x, hi, hi_x) = bounds(obj, path)?;
    let clamp = |x: f64| if x <= i64::MIN as f64 { i64::MIN } else if x >= i64::MAX as f64 { i64::MAX } else { x as i64 };
    let lo_i = if lo.is_infinite() { i64::MIN } else if lo_x { clamp(lo.floor()).saturating_add(1) } else { clamp(lo.ceil()) };
    let hi_i = if hi.is_infinite() { i64::MAX } else if hi_x { clamp(hi.ceil()).saturating_sub(1) } else { clamp(hi.floor()) };
    let multiple = match multiple_of(obj, path)? {
        None => 1,
        Some(Multiple::Integer(m)) => m,
        // Every integer is a multiple of 0.5, 0.25, 0.1, ...
        Some(Multiple::UnitFraction) => 1,
    };
    b.int_multiple(lo_i, hi_i, zero_frac, multiple).map_err(|_| GrammarError::Unsatisfiable(format!("no integer in the range at {path}")))
}

enum Multiple {
    Integer(u64),
    /// 1/k for an integer k.
    UnitFraction,
}

/// `multipleOf`, where it can be enforced: a positive integer, or (for integers) one over
/// an integer; other values are refused by name.
fn multiple_of(obj: &serde_json::Map<String, Value>, path: &str) -> Result<Option<Multiple>, GrammarError> {
    let Some(m) = obj.get("multipleOf") else { return Ok(None) };
    let x = m.as_f64().filter(|x| *x > 0.0 && x.is_finite()).ok_or_else(|| invalid(path, "multipleOf must be a positive number"))?;
    if let Some(k) = m.as_u64() {
        return Ok(Some(Multiple::Integer(k)));
    }
    let inv = 1.0 / x;
    if (inv - inv.round()).abs() < 1e-9 {
        return Ok(Some(Multiple::UnitFraction));
    }
    Err(GrammarError::UnsupportedSchema { path: path.to_string(), keyword: format!("multipleOf {m}") })
}

fn number(b: &mut Builder, obj: &serde_json::Map<String, Value>, path: &str) -> Result<NodeId, GrammarError> {
    match multiple_of(obj, path)? {
        // Multiples of an integer are integers (written `6` or `6.0`).
        Some(Multiple::Integer(_)) => return integer(b, true, obj, path),
        Some(Multiple::UnitFraction) => {
            return Err(GrammarError::UnsupportedSchema { path: path.to_string(), keyword: format!("multipleOf {} on a number", obj["multipleOf"]) })
        }
        None => {}
    }
    let (lo, lo_x, hi, hi_x) = bounds(obj, path)?;
    b.num(lo, hi, lo_x, hi_x)
        .map_err(|e| GrammarError::Unsatisfiable(format!("at {path}: {e}")))
}


mod merge;
mod object;
mod rewrite;
mod string;
#[cfg(test)]
mod tests;

pub(crate) use crate::spec::{resolve, UNSUPPORTED};
use object::regex_syntax_escape;
use merge::{all_of_values, merge_all_of, merge_siblings};
use object::{array, object};
use string::string;
