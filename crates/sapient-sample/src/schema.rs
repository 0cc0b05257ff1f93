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

/// JSON Schema keywords refused by both the grammar and the validator.
pub(crate) const UNSUPPORTED: &[&str] = &[
    "not", "if", "then", "else", "patternProperties", "dependentRequired", "dependentSchemas",
    "dependencies", "propertyNames", "contains", "minContains", "maxContains", "multipleOf",
    "unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "$recursiveRef", "$anchor",
    "$dynamicAnchor", "$recursiveAnchor",
];

/// Keywords refused by the grammar only (the validator checks them).
pub(crate) const UNSUPPORTED_IN_GRAMMAR: &[&str] = &["uniqueItems"];

/// The JSON Schema keywords a grammar refuses with [`GrammarError::UnsupportedSchema`].
pub fn refused_keywords() -> impl Iterator<Item = &'static str> {
    UNSUPPORTED.iter().chain(UNSUPPORTED_IN_GRAMMAR).copied()
}

/// The JSON Schema keywords a grammar supports (annotations aside).
pub const SUPPORTED_KEYWORDS: &[&str] = &[
    "type", "properties", "required", "additionalProperties", "minProperties", "maxProperties",
    "items", "prefixItems", "additionalItems", "minItems", "maxItems", "enum", "const",
    "minLength", "maxLength", "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", "anyOf", "oneOf", "allOf", "$ref", "$defs", "definitions",
];
/// The annotation keywords a grammar ignores (they do not constrain a document).
pub const ANNOTATIONS: &[&str] = &[
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
    "readOnly", "writeOnly", "contentMediaType", "contentEncoding", "contentSchema", "$vocabulary",
];

/// The formats `format` supports.
pub(crate) const FORMATS: &[&str] = &["date", "time", "date-time", "email", "uuid", "uri", "ipv4"];

struct Ctx<'a> {
    root: &'a Value,
    /// Compiled `$ref`s by (reference, how many expansions of it enclose this one).
    refs: HashMap<(String, u32), NodeId>,
    /// How many expansions of each `$ref` enclose the subschema being compiled.
    active: HashMap<String, u32>,
    /// [`crate::JsonOptions::max_ref_depth`].
    max_ref_depth: u32,
    depth: usize,
}

/// How deeply subschemas may nest (each level is a recursive call of the compiler).
pub const MAX_SCHEMA_DEPTH: usize = 128;

pub(crate) fn compile(b: &mut Builder, schema: &Value) -> Result<NodeId, GrammarError> {
    let max_ref_depth = b.json.max_ref_depth;
    if max_ref_depth == 0 {
        return Err(GrammarError::InvalidOption("JsonOptions::max_ref_depth must be at least 1".into()));
    }
    let mut cx = Ctx { root: schema, refs: HashMap::new(), active: HashMap::new(), max_ref_depth, depth: 0 };
    node(b, &mut cx, schema, "#")
}

fn node(b: &mut Builder, cx: &mut Ctx, s: &Value, path: &str) -> Result<NodeId, GrammarError> {
    if cx.depth >= MAX_SCHEMA_DEPTH {
        return Err(GrammarError::TooLarge { what: format!("schema nesting at {path}"), limit: MAX_SCHEMA_DEPTH });
    }
    cx.depth += 1;
    let r = node_at_depth(b, cx, s, path);
    cx.depth -= 1;
    r
}

fn invalid(path: &str, message: impl Into<String>) -> GrammarError {
    GrammarError::InvalidSchema { path: path.to_string(), message: message.into() }
}


pub(crate) fn resolve<'v>(root: &'v Value, r: &str) -> Option<&'v Value> {
    let ptr = r.strip_prefix('#')?;
    if ptr.is_empty() {
        return Some(root);
    }
    let mut cur = root;
    for part in ptr.strip_prefix('/')?.split('/') {
        let part = part.replace("~1", "/").replace("~0", "~");
        cur = match cur {
            Value::Object(m) => m.get(&part)?,
            Value::Array(a) => a.get(part.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(cur)
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
    if obj.get("uniqueItems").is_some_and(|u| u != &Value::Bool(false)) {
        return Err(GrammarError::UnsupportedSchema { path: path.to_string(), keyword: "uniqueItems".into() });
    }
    if let Some(f) = obj.get("format") {
        let f = f.as_str().ok_or_else(|| invalid(path, "format must be a string"))?;
        if !FORMATS.contains(&f) {
            return Err(GrammarError::UnsupportedSchema { path: path.to_string(), keyword: format!("format {f:?}") });
        }
    }
    if let Some(all) = obj.get("allOf") {
        let merged = merge_all_of(cx.root, obj, all, path)?;
        return node(b, cx, &merged, &format!("{path}/allOf"));
    }
    if let Some(c) = obj.get("const") {
        return b.json_const(c);
    }
    if let Some(e) = obj.get("enum") {
        let e = e.as_array().ok_or_else(|| invalid(path, "enum must be an array"))?;
        if e.is_empty() {
            return Err(GrammarError::Unsatisfiable(format!("empty enum at {path}")));
        }
        let alts = e.iter().map(|v| b.json_const(v)).collect::<Result<_, _>>()?;
        return Ok(b.choice(alts));
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(list) = obj.get(key) {
            let list = list.as_array().ok_or_else(|| invalid(path, format!("{key} must be an array")))?;
            if list.is_empty() {
                return Err(invalid(path, format!("{key} must not be empty")));
            }
            // Keywords beside anyOf apply to every branch: merge them in.
            let mut alts = Vec::new();
            for (i, sub) in list.iter().enumerate() {
                let merged = merge_siblings(obj, sub, key);
                alts.push(node(b, cx, &merged, &format!("{path}/{key}/{i}"))?);
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
            if ["properties", "required", "additionalProperties", "minProperties", "maxProperties"].iter().any(|k| obj.contains_key(*k)) {
                vec!["object"]
            } else if ["items", "prefixItems", "minItems", "maxItems"].iter().any(|k| obj.contains_key(*k)) {
                vec!["array"]
            } else if ["minLength", "maxLength", "pattern", "format"].iter().any(|k| obj.contains_key(*k)) {
                vec!["string"]
            } else if ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"].iter().any(|k| obj.contains_key(*k)) {
                vec!["number"]
            } else {
                return b.json_value();
            }
        }
    };
    if types.is_empty() {
        return Err(GrammarError::Unsatisfiable(format!("empty type list at {path}")));
    }
    let mut alts = Vec::new();
    for t in types {
        alts.push(match t {
            "null" => b.lit("null"),
            "boolean" => {
                let (t, f) = (b.lit("true"), b.lit("false"));
                b.choice(vec![t, f])
            }
            "string" => string(b, obj, path)?,
            "integer" => integer(b, obj, path)?,
            "number" => number(b, obj, path)?,
            "array" => array(b, cx, obj, path)?,
            "object" => object(b, cx, obj, path)?,
            other => return Err(invalid(path, format!("unknown type {other:?}"))),
        });
    }
    Ok(if alts.len() == 1 { alts[0] } else { b.choice(alts) })
}

/// `sub` with the keywords of `parent` (other than `key`) added where `sub` lacks them.
fn merge_siblings(parent: &serde_json::Map<String, Value>, sub: &Value, key: &str) -> Value {
    let Value::Object(sub_obj) = sub else { return sub.clone() };
    if sub_obj.contains_key("$ref") {
        return sub.clone();
    }
    let mut m = sub_obj.clone();
    for (k, v) in parent {
        if k != key && !m.contains_key(k) && !is_annotation(k) {
            m.insert(k.clone(), v.clone());
        }
    }
    Value::Object(m)
}

/// `allOf` folded into one schema: the parent's other keywords and every branch (a
/// branch's `$ref` resolved) merged. Properties present in several branches become an
/// `allOf` of their schemas; `required` lists are joined; bounds take the tighter value;
/// any other keyword given different values in two branches is refused.
fn merge_all_of(root: &Value, parent: &serde_json::Map<String, Value>, all: &Value, path: &str) -> Result<Value, GrammarError> {
    let list = all.as_array().ok_or_else(|| invalid(path, "allOf must be an array"))?;
    if list.is_empty() {
        return Err(invalid(path, "allOf must not be empty"));
    }
    let mut acc: serde_json::Map<String, Value> =
        parent.iter().filter(|(k, _)| k.as_str() != "allOf").map(|(k, v)| (k.clone(), v.clone())).collect();
    for (i, sub) in list.iter().enumerate() {
        let mut sub = sub.clone();
        // Follow $refs (a chain of them; a cycle is refused).
        for _ in 0..32 {
            let Some(r) = sub.get("$ref").and_then(|r| r.as_str()).map(str::to_string) else { break };
            let target = resolve(root, &r).ok_or_else(|| GrammarError::UnresolvedRef(r.clone()))?.clone();
            let mut m = match target {
                Value::Object(m) => m,
                Value::Bool(true) => serde_json::Map::new(),
                _ => return Err(GrammarError::Unsatisfiable(format!("schema `false` in allOf at {path}"))),
            };
            if let Value::Object(o) = &sub {
                for (k, v) in o {
                    if k != "$ref" {
                        m.insert(k.clone(), v.clone());
                    }
                }
            }
            sub = Value::Object(m);
        }
        let sub = match sub {
            Value::Bool(true) => continue,
            Value::Bool(false) => return Err(GrammarError::Unsatisfiable(format!("schema `false` in allOf at {path}/{i}"))),
            Value::Object(m) => m,
            _ => return Err(invalid(&format!("{path}/{i}"), "a schema must be an object or a boolean")),
        };
        if sub.contains_key("$ref") {
            return Err(GrammarError::UnsupportedSchema { path: format!("{path}/{i}"), keyword: "allOf of recursive $refs".into() });
        }
        let sub = if let Some(inner) = sub.get("allOf") { merge_all_of(root, &sub, &inner.clone(), &format!("{path}/{i}"))? } else { Value::Object(sub) };
        let Value::Object(sub) = sub else { continue };
        // `additionalProperties` of one side applies to the other side's properties.
        let props_of = |m: &serde_json::Map<String, Value>| m.get("properties").and_then(|p| p.as_object()).cloned().unwrap_or_default();
        let (pa, pb) = (props_of(&acc), props_of(&sub));
        let (aa, ab) = (acc.get("additionalProperties").cloned(), sub.get("additionalProperties").cloned());
        let mut props = serde_json::Map::new();
        let mut dropped = Vec::new();
        for (name, s1) in pa.iter() {
            let e = match (pb.get(name), &ab) {
                (Some(s2), _) if s2 != s1 => serde_json::json!({"allOf": [s1, s2]}),
                (Some(_), _) | (None, None) | (None, Some(Value::Bool(true))) => s1.clone(),
                (None, Some(Value::Bool(false))) => {
                    dropped.push(name.clone());
                    continue;
                }
                (None, Some(extra)) => serde_json::json!({"allOf": [s1, extra]}),
            };
            props.insert(name.clone(), e);
        }
        for (name, s2) in pb.iter() {
            if pa.contains_key(name) {
                continue;
            }
            let e = match &aa {
                None | Some(Value::Bool(true)) => s2.clone(),
                Some(Value::Bool(false)) => {
                    dropped.push(name.clone());
                    continue;
                }
                Some(extra) => serde_json::json!({"allOf": [extra, s2]}),
            };
            props.insert(name.clone(), e);
        }
        let addl = match (aa, ab) {
            (None, x) | (x, None) => x,
            (Some(Value::Bool(false)), _) | (_, Some(Value::Bool(false))) => Some(Value::Bool(false)),
            (Some(Value::Bool(true)), x) | (x, Some(Value::Bool(true))) => x,
            (Some(x), Some(y)) => Some(serde_json::json!({"allOf": [x, y]})),
        };
        for (k, v) in sub {
            if is_annotation(&k) || k == "properties" || k == "additionalProperties" {
                continue;
            }
            let Some(old) = acc.get(&k).cloned() else {
                acc.insert(k, v);
                continue;
            };
            if old == v {
                continue;
            }
            let merged = match k.as_str() {
                "required" => {
                    let mut a = old.as_array().cloned().unwrap_or_default();
                    for x in v.as_array().cloned().unwrap_or_default() {
                        if !a.contains(&x) {
                            a.push(x);
                        }
                    }
                    Value::Array(a)
                }
                "minimum" | "exclusiveMinimum" | "minLength" | "minItems" | "minProperties" if old.is_number() && v.is_number() => {
                    if old.as_f64() >= v.as_f64() { old } else { v }
                }
                "maximum" | "exclusiveMaximum" | "maxLength" | "maxItems" | "maxProperties" if old.is_number() && v.is_number() => {
                    if old.as_f64() <= v.as_f64() { old } else { v }
                }
                "type" => {
                    let as_list = |t: &Value| -> Vec<Value> { match t { Value::Array(a) => a.clone(), x => vec![x.clone()] } };
                    let b2 = as_list(&v);
                    let (int, num) = (Value::from("integer"), Value::from("number"));
                    let both: Vec<Value> = as_list(&old)
                        .into_iter()
                        .filter_map(|t| {
                            if b2.contains(&t) {
                                Some(t)
                            } else if (t == num && b2.contains(&int)) || (t == int && b2.contains(&num)) {
                                Some(int.clone())
                            } else {
                                None
                            }
                        })
                        .collect();
                    if both.is_empty() {
                        return Err(GrammarError::Unsatisfiable(format!("allOf at {path} asks for types {old} and {v}")));
                    }
                    Value::Array(both)
                }
                _ => {
                    return Err(GrammarError::UnsupportedSchema { path: format!("{path}/{i}"), keyword: format!("allOf with two different {k:?}") });
                }
            };
            acc.insert(k, merged);
        }
        if let Some(req) = acc.get("required").and_then(|r| r.as_array()) {
            if let Some(name) = dropped.iter().find(|d| req.contains(&Value::from(d.as_str()))) {
                return Err(GrammarError::Unsatisfiable(format!("allOf at {path}: {name:?} is required but another branch forbids it")));
            }
        }
        if !props.is_empty() {
            acc.insert("properties".into(), Value::Object(props));
        }
        match addl {
            Some(x) => {
                acc.insert("additionalProperties".into(), x);
            }
            None => {
                acc.remove("additionalProperties");
            }
        }
    }
    Ok(Value::Object(acc))
}

fn is_annotation(k: &str) -> bool {
    ANNOTATIONS.contains(&k) || k == "$defs" || k == "definitions"
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

fn integer(b: &mut Builder, obj: &serde_json::Map<String, Value>, path: &str) -> Result<NodeId, GrammarError> {
    let (lo, lo_x, hi, hi_x) = bounds(obj, path)?;
    let clamp = |x: f64| if x <= i64::MIN as f64 { i64::MIN } else if x >= i64::MAX as f64 { i64::MAX } else { x as i64 };
    let lo_i = if lo.is_infinite() { i64::MIN } else if lo_x { clamp(lo.floor()).saturating_add(1) } else { clamp(lo.ceil()) };
    let hi_i = if hi.is_infinite() { i64::MAX } else if hi_x { clamp(hi.ceil()).saturating_sub(1) } else { clamp(hi.floor()) };
    b.int(lo_i, hi_i).map_err(|_| GrammarError::Unsatisfiable(format!("no integer in the range at {path}")))
}

fn number(b: &mut Builder, obj: &serde_json::Map<String, Value>, path: &str) -> Result<NodeId, GrammarError> {
    let (lo, lo_x, hi, hi_x) = bounds(obj, path)?;
    if lo.is_infinite() && hi.is_infinite() {
        return b.json_number();
    }
    b.float(lo, hi, lo_x, hi_x)
        .map_err(|e| GrammarError::Unsatisfiable(format!("at {path}: {e}")))
}

fn json_char() -> String {
    format!(r#"(?:[^"\\\x00-\x1F]|\\["\\/bfnrt]|{})"#, crate::builder::JSON_UNICODE_ESCAPE)
}

const DATE: &str = r"[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-9]))";
const DATE_TIME: &str = concat!(
    r"[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-9]))",
    r"T(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,6})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
);

pub(crate) fn format_regex(f: &str) -> Option<&'static str> {
    Some(match f {
        // Month lengths are respected; February 29 is allowed in every year.
        "date" => DATE,
        // RFC 3339 full-time: the offset is required.
        "time" => r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,6})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])",
        "date-time" => DATE_TIME,
        "uuid" => r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
        // Shorter than RFC 5321 allows (64 / 63 x 8): long runs are where small models loop.
        "email" => r"[A-Za-z0-9._%+-]{1,32}@[A-Za-z0-9-]{1,24}(?:\.[A-Za-z0-9-]{1,24}){1,3}",
        // Absolute http(s) URIs with a host name (a subset of RFC 3986 that validators accept).
        "uri" => r"https?://[a-z0-9](?:[a-z0-9-]{0,30}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,30}[a-z0-9])?){0,4}(?::[1-9][0-9]{0,4})?(?:/(?:[A-Za-z0-9._~!$&'()*+,;=:@-]|%[0-9A-Fa-f]{2}){0,32}){0,8}(?:\?(?:[A-Za-z0-9._~!$&'()*+,;=:@/?-]|%[0-9A-Fa-f]{2}){0,64})?",
        "ipv4" => r"(?:(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])",
        _ => return None,
    })
}

/// ECMAScript `\d`/`\D` are ASCII; in the `regex` crate they are Unicode. Rewrite them.
pub(crate) fn ecma_to_rust(p: &str) -> String {
    let mut out = String::with_capacity(p.len());
    let mut it = p.chars();
    while let Some(c) = it.next() {
        if c == '\\' {
            match it.next() {
                Some('d') => out.push_str("[0-9]"),
                Some('D') => out.push_str("[^0-9]"),
                Some(n) => {
                    out.push('\\');
                    out.push(n);
                }
                None => out.push('\\'),
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn string(b: &mut Builder, obj: &serde_json::Map<String, Value>, path: &str) -> Result<NodeId, GrammarError> {
    let min = get_u32(obj, "minLength", path)?;
    let max = get_u32(obj, "maxLength", path)?;
    let pattern = obj.get("pattern").map(|p| p.as_str().ok_or_else(|| invalid(path, "pattern must be a string"))).transpose()?;
    let format = obj.get("format").and_then(|f| f.as_str());
    let body: Option<String> = match (pattern, format) {
        (Some(p), _) => {
            let p = ecma_to_rust(p);
            let (start, end) = (p.starts_with('^'), p.ends_with('$') && !p.ends_with("\\$"));
            let core = &p[start as usize..p.len() - end as usize];
            Some(format!("{}(?:{core}){}", if start { "" } else { "(?s:.*)" }, if end { "" } else { "(?s:.*)" }))
        }
        (None, Some(f)) => match format_regex(f) {
            Some(r) => Some(r.to_string()),
            None => {
                tracing::warn!(path, format = f, "unknown string format is not enforced");
                None
            }
        },
        (None, None) => None,
    };
    if let Some(body) = body {
        if min.is_some() || max.is_some() {
            return Err(GrammarError::UnsupportedSchema { path: path.to_string(), keyword: "pattern/format with minLength/maxLength".into() });
        }
        let q1 = b.lit("\"");
        let inner = b.regex(&body, true).map_err(|e| match e {
            GrammarError::Unsatisfiable(_) => GrammarError::Unsatisfiable(format!(
                "pattern at {path} matches no string without quotes, backslashes or control characters"
            )),
            e => e,
        })?;
        let q2 = b.lit("\"");
        return Ok(b.seq(vec![q1, inner, q2]));
    }
    match (min, max) {
        (None, None) => b.json_string(),
        (lo, hi) => {
            let lo = lo.unwrap_or(0);
            if let Some(hi) = hi {
                if lo > hi {
                    return Err(GrammarError::Unsatisfiable(format!("minLength {lo} > maxLength {hi} at {path}")));
                }
            }
            let rep = match hi {
                Some(hi) => format!("{{{lo},{hi}}}"),
                None => format!("{{{lo},}}"),
            };
            b.regex(&format!("\"{}{rep}\"", json_char()), false)
        }
    }
}

fn array(b: &mut Builder, cx: &mut Ctx, obj: &serde_json::Map<String, Value>, path: &str) -> Result<NodeId, GrammarError> {
    // Positional items: `prefixItems`, or the older tuple form of `items`.
    let (prefix, rest_key): (&[Value], &str) = match (obj.get("prefixItems"), obj.get("items")) {
        (Some(Value::Array(p)), _) => (p.as_slice(), "items"),
        (Some(_), _) => return Err(invalid(path, "prefixItems must be an array")),
        (None, Some(Value::Array(p))) => (p.as_slice(), "additionalItems"),
        (None, _) => (&[], "items"),
    };
    let mut prefix_nodes = Vec::new();
    for (i, sub) in prefix.iter().enumerate() {
        prefix_nodes.push(node(b, cx, sub, &format!("{path}/prefixItems/{i}"))?);
    }
    let rest = match obj.get(rest_key) {
        None | Some(Value::Bool(true)) => Some(b.json_value()?),
        Some(Value::Bool(false)) => None,
        Some(s) => Some(node(b, cx, s, &format!("{path}/{rest_key}"))?),
    };
    let min = get_u32(obj, "minItems", path)?.unwrap_or(0);
    let mut max = get_u32(obj, "maxItems", path)?.unwrap_or(u32::MAX);
    if rest.is_none() {
        max = max.min(prefix_nodes.len() as u32);
    }
    if min > max {
        return Err(GrammarError::Unsatisfiable(format!("no array length in [{min}, {max}] at {path}")));
    }
    let ws = b.ws()?;
    let sep = b.comma()?;
    if prefix_nodes.is_empty() {
        let item = rest.ok_or_else(|| GrammarError::Unsatisfiable(format!("items: false with minItems at {path}")))?;
        if max == 0 {
            let (o, c) = (b.lit("["), b.lit("]"));
            return Ok(b.seq_ws(&[Some(o), ws, Some(c)]));
        }
        return b.array_of(item, sep, ws, min, max);
    }
    // after(i): the items from position i on (i > 0: each preceded by a comma), then `]`.
    let close = b.lit("]");
    let end = b.seq_ws(&[ws, Some(close)]);
    let p = prefix_nodes.len() as u32;
    let tail = match rest {
        Some(item) if max > p => {
            let lo = min.saturating_sub(p);
            let hi = if max == u32::MAX { u32::MAX } else { max - p };
            let one = b.seq(vec![sep, item]);
            let more = b.add(crate::builder::Node::Repeat { item: one, sep: None, min: lo, max: hi });
            b.seq(vec![more, end])
        }
        _ => end,
    };
    let mut after = tail;
    for i in (0..p).rev() {
        let item = prefix_nodes[i as usize];
        let take = if i == 0 { b.seq_ws(&[ws, Some(item), Some(after)]) } else { b.seq(vec![sep, item, after]) };
        after = if i >= min {
            let stop = if i == 0 { b.seq_ws(&[ws, Some(close)]) } else { end };
            b.choice(vec![take, stop])
        } else {
            take
        };
    }
    let open = b.lit("[");
    Ok(b.seq(vec![open, after]))
}

fn object(b: &mut Builder, cx: &mut Ctx, obj: &serde_json::Map<String, Value>, path: &str) -> Result<NodeId, GrammarError> {
    let ws = b.ws()?;
    let sep = b.comma()?;
    let required: Vec<&str> = match obj.get("required") {
        None => vec![],
        Some(Value::Array(a)) => a.iter().map(|v| v.as_str().ok_or_else(|| invalid(path, "required must list strings"))).collect::<Result<_, _>>()?,
        Some(_) => return Err(invalid(path, "required must be an array")),
    };
    let props = match obj.get("properties") {
        None => serde_json::Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(_) => return Err(invalid(path, "properties must be an object")),
    };
    let min = get_u32(obj, "minProperties", path)?.unwrap_or(0);
    let max = get_u32(obj, "maxProperties", path)?.unwrap_or(u32::MAX);
    // (member node, required) in schema order; required names without a schema take the
    // additionalProperties schema (any value when there is none).
    let mut members: Vec<(NodeId, bool)> = Vec::new();
    let mut names: Vec<String> = Vec::new();
    for (name, sub) in &props {
        let v = node(b, cx, sub, &format!("{path}/properties/{name}"))?;
        let key = b.json_const(&Value::String(name.clone()))?;
        members.push((b.member(key, v)?, required.contains(&name.as_str())));
        names.push(name.clone());
    }
    let extra_value = match obj.get("additionalProperties") {
        None => None,
        Some(Value::Bool(false)) => None,
        Some(Value::Bool(true)) => Some(b.json_value()?),
        Some(s) => Some(node(b, cx, s, &format!("{path}/additionalProperties"))?),
    };
    for r in &required {
        if !props.contains_key(*r) {
            let v = match (extra_value, obj.get("additionalProperties")) {
                (Some(v), _) => v,
                (None, Some(Value::Bool(false))) => {
                    return Err(GrammarError::Unsatisfiable(format!("{r:?} is required but not allowed at {path}")))
                }
                _ => b.json_value()?,
            };
            let key = b.json_const(&Value::String(r.to_string()))?;
            members.push((b.member(key, v)?, true));
            names.push(r.to_string());
        }
    }
    // Members beyond the listed ones: keys that are none of theirs (written without
    // escapes), any number of them when the schema asks for no property count. Without
    // `additionalProperties` none are generated (still valid).
    let extra = match extra_value {
        Some(v) if obj.get("additionalProperties").is_some() => {
            let key = if names.is_empty() { b.json_string()? } else { b.regex(&key_not_in(&names), false)? };
            Some(b.member(key, v)?)
        }
        _ => None,
    };
    let counted = min > 0 || max != u32::MAX;
    let mut memo: HashMap<(usize, u32, bool), Option<NodeId>> = HashMap::new();
    let body = object_tail(b, &members, extra, sep, min, max, counted, 0, 0, true, &mut memo)
        .ok_or_else(|| GrammarError::Unsatisfiable(format!("no object with between {min} and {max} properties at {path}")))?;
    let (open, close) = (b.lit("{"), b.lit("}"));
    Ok(b.seq_ws(&[Some(open), ws, Some(body), ws, Some(close)]))
}

/// The members from `j` on, `c` already present (`first`: none yet, so no comma before the
/// next). `None` when no choice satisfies the required ones and the property count.
#[allow(clippy::too_many_arguments)]
fn object_tail(
    b: &mut Builder,
    members: &[(NodeId, bool)],
    extra: Option<NodeId>,
    sep: NodeId,
    min: u32,
    max: u32,
    counted: bool,
    j: usize,
    c: u32,
    first: bool,
    memo: &mut HashMap<(usize, u32, bool), Option<NodeId>>,
) -> Option<NodeId> {
    let c = if counted { c } else { 0 };
    if let Some(&r) = memo.get(&(j, c, first)) {
        return r;
    }
    let r = if j == members.len() {
        let mut alts = Vec::new();
        if c >= min {
            alts.push(b.seq(vec![]));
        }
        if let Some(e) = extra {
            if c < max {
                let lo = min.saturating_sub(c).max(1);
                let hi = if max == u32::MAX { u32::MAX } else { max - c };
                let rep = b.add(crate::builder::Node::Repeat { item: e, sep: Some(sep), min: lo, max: hi });
                alts.push(if first { rep } else { b.seq(vec![sep, rep]) });
            }
        }
        match alts.len() {
            0 => None,
            1 => Some(alts[0]),
            _ => Some(b.choice(alts)),
        }
    } else {
        let (m, req) = members[j];
        let take = if c < max {
            object_tail(b, members, extra, sep, min, max, counted, j + 1, c + 1, false, memo)
                .map(|t| if first { b.seq(vec![m, t]) } else { b.seq(vec![sep, m, t]) })
        } else {
            None
        };
        let skip = if req { None } else { object_tail(b, members, extra, sep, min, max, counted, j + 1, c, first, memo) };
        match (take, skip) {
            (Some(x), Some(y)) => Some(b.choice(vec![x, y])),
            (x, y) => x.or(y),
        }
    };
    memo.insert((j, c, first), r);
    r
}

/// A regex for a JSON string (without escapes) that is none of `names`.
fn key_not_in(names: &[String]) -> String {
    const CH: &str = r#"[^"\\\x00-\x1F]"#;
    fn esc(c: char) -> String {
        regex_syntax_escape(&c.to_string())
    }
    fn rec(names: &[&str]) -> String {
        // names: the remaining suffixes of the names sharing the prefix read so far.
        let mut alts = Vec::new();
        if !names.contains(&"") {
            alts.push(String::new());
        }
        let mut firsts: Vec<char> = names.iter().filter_map(|n| n.chars().next()).collect();
        firsts.sort_unstable();
        firsts.dedup();
        let class: String = firsts.iter().map(|&c| esc(c)).collect();
        alts.push(if class.is_empty() { format!("{CH}+") } else { format!("(?:[^\"\\\\\\x00-\\x1F{class}]){CH}*") });
        for &c in &firsts {
            let rest: Vec<&str> = names.iter().filter(|n| n.starts_with(c)).map(|n| &n[c.len_utf8()..]).collect();
            alts.push(format!("{}(?:{})", esc(c), rec(&rest)));
        }
        alts.join("|")
    }
    let refs: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
    format!("\"(?:{})\"", rec(&refs))
}

/// Escape regex metacharacters (also inside a character class).
fn regex_syntax_escape(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if "\\.+*?()|[]{}^$#&-~".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::{Constraint, Grammar, GrammarError};
    use serde_json::json;

    /// A schema compiled compact (the default) and with flexible whitespace.
    struct G(Grammar, Grammar);
    fn gs(s: &serde_json::Value) -> Result<G, GrammarError> {
        let e = crate::Expr::JsonSchema(s.clone());
        Ok(G(Grammar::json_schema(s)?, Grammar::with_options(&e, crate::JsonOptions::flexible(24))?))
    }
    fn ok(g: &G, v: &serde_json::Value) -> bool {
        let compact = serde_json::to_string(v).unwrap();
        let pretty = serde_json::to_string_pretty(v).unwrap();
        let a = g.0.matches(compact.as_bytes()).unwrap();
        let b = g.1.matches(pretty.as_bytes()).unwrap();
        assert_eq!(a, b, "compact and pretty disagree on {compact}");
        assert!(!a || compact == pretty || !g.0.matches(pretty.as_bytes()).unwrap(), "compact grammar took whitespace");
        a
    }

    #[test]
    fn object_required_optional_and_order() {
        let s = json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 8},
                "age": {"type": "integer", "minimum": 0, "maximum": 150},
                "email": {"type": "string", "format": "email"},
                "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3}
            },
            "required": ["name", "age"]
        });
        let g = gs(&s).unwrap();
        assert!(ok(&g, &json!({"name": "Ann", "age": 30})));
        assert!(ok(&g, &json!({"name": "Ann", "age": 30, "tags": ["x"]})));
        assert!(ok(&g, &json!({"name": "Ann", "age": 0, "email": "a@b.co", "tags": ["x", "y", "z"]})));
        assert!(!ok(&g, &json!({"name": "Ann"})), "missing required");
        assert!(!ok(&g, &json!({"age": 3, "name": "Ann"})), "order is the schema's");
        assert!(!ok(&g, &json!({"name": "", "age": 1})), "minLength");
        assert!(!ok(&g, &json!({"name": "Annabelle!", "age": 1})), "maxLength");
        assert!(!ok(&g, &json!({"name": "A", "age": 151})), "maximum");
        assert!(!ok(&g, &json!({"name": "A", "age": 1, "tags": []})), "minItems");
        assert!(!ok(&g, &json!({"name": "A", "age": 1, "tags": ["a", "b", "c", "d"]})), "maxItems");
        assert!(!ok(&g, &json!({"name": "A", "age": 1, "email": "nope"})), "format");
        assert!(!ok(&g, &json!({"name": "A", "age": 1, "extra": 1})), "no additional properties");
    }

    #[test]
    fn all_optional_properties() {
        let s = json!({"properties": {"a": {"type": "boolean"}, "b": {"type": "null"}, "c": {"const": "x"}}});
        let g = gs(&s).unwrap();
        for v in [json!({}), json!({"a": true}), json!({"b": null}), json!({"c": "x"}), json!({"a": false, "c": "x"}), json!({"a": true, "b": null, "c": "x"})] {
            assert!(ok(&g, &v), "{v}");
        }
        for v in [json!({"c": "y"}), json!({"b": null, "a": true}), json!({"a": 1})] {
            assert!(!ok(&g, &v), "{v}");
        }
    }

    #[test]
    fn enum_const_anyof_ref_nested() {
        let s = json!({
            "$defs": {
                "node": {"type": "object", "properties": {
                    "value": {"type": "integer"},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}
                }, "required": ["value"]},
                "color": {"enum": ["red", "green", 3, null]}
            },
            "type": "object",
            "properties": {
                "tree": {"$ref": "#/$defs/node"},
                "color": {"$ref": "#/$defs/color"},
                "id": {"anyOf": [{"type": "string", "pattern": "^id-[0-9]{3}$"}, {"type": "integer", "exclusiveMinimum": 0}]},
                "kind": {"const": "fixed"},
                "ratio": {"type": "number", "minimum": 0, "maximum": 1}
            },
            "required": ["tree", "color", "id", "kind"]
        });
        let g = gs(&s).unwrap();
        let good = json!({"tree": {"value": 1, "children": [{"value": 2}, {"value": 3, "children": []}]}, "color": "green", "id": "id-042", "kind": "fixed", "ratio": 0.25});
        assert!(ok(&g, &good));
        assert!(ok(&g, &json!({"tree": {"value": -5}, "color": null, "id": 7, "kind": "fixed"})));
        for bad in [
            json!({"tree": {"value": 1}, "color": "blue", "id": 7, "kind": "fixed"}),
            json!({"tree": {"value": 1}, "color": 3, "id": "id-42", "kind": "fixed"}),
            json!({"tree": {"value": 1}, "color": 3, "id": 0, "kind": "fixed"}),
            json!({"tree": {"value": 1}, "color": 3, "id": 1, "kind": "other"}),
            json!({"tree": {"children": []}, "color": 3, "id": 1, "kind": "fixed"}),
            json!({"tree": {"value": 1, "children": [{"value": "x"}]}, "color": 3, "id": 1, "kind": "fixed"}),
            json!({"tree": {"value": 1}, "color": 3, "id": 1, "kind": "fixed", "ratio": 1.5}),
        ] {
            assert!(!ok(&g, &bad), "{bad}");
        }
    }

    #[test]
    fn type_lists_free_maps_and_true() {
        let g = gs(&json!({"type": ["string", "null"]})).unwrap();
        assert!(ok(&g, &json!("x")) && ok(&g, &json!(null)) && !ok(&g, &json!(1)));
        let g = gs(&json!({"type": "object", "additionalProperties": {"type": "integer"}})).unwrap();
        assert!(ok(&g, &json!({"a": 1, "b": 2})) && ok(&g, &json!({})) && !ok(&g, &json!({"a": "x"})));
        let g = gs(&json!(true)).unwrap();
        assert!(ok(&g, &json!({"any": [1, {"thing": null}]})));
        let g = gs(&json!({"type": "string", "pattern": "a+b"})).unwrap();
        assert!(ok(&g, &json!("xxaab!")) && !ok(&g, &json!("ba")));
    }

    #[test]
    fn date_formats_respect_month_lengths() {
        let g = gs(&json!({"type": "string", "format": "date"})).unwrap();
        for (d, want) in [("2024-02-29", true), ("2024-02-30", false), ("2024-04-31", false), ("2024-12-31", true), ("2024-13-01", false), ("2024-06-00", false)] {
            assert_eq!(ok(&g, &json!(d)), want, "{d}");
        }
        let g = gs(&json!({"type": "string", "format": "date-time"})).unwrap();
        assert!(ok(&g, &json!("2024-11-30T23:59:59Z")) && ok(&g, &json!("2024-01-01T00:00:00.5+02:00")));
        assert!(!ok(&g, &json!("2024-11-31T10:00:00Z")) && !ok(&g, &json!("2024-11-30T24:00:00Z")));
    }

    #[test]
    fn uri_percent_encodings_are_whole() {
        // A sampled document once ended a path in "%2" (a percent sign and one hex digit),
        // which RFC 3986 validators refuse.
        let g = gs(&json!({"type": "string", "format": "uri"})).unwrap();
        for (u, want) in [("https://a.example/x%2Fy", true), ("https://a.example/q?a=%20b", true), ("https://a.example/x%2", false), ("https://a.example/x%", false), ("https://a.example/%zz", false), ("https://a.example/?q=%2", false)] {
            assert_eq!(ok(&g, &json!(u)), want, "{u}");
        }
    }

    #[test]
    fn schema_errors_are_clear() {
        let cases = [
            (json!({"type": "integer", "minimum": 5, "maximum": 4}), "unsat"),
            (json!({"type": "integer", "minimum": 1.2, "maximum": 1.8}), "unsat"),
            (json!({"type": "number", "exclusiveMinimum": 1, "maximum": 1}), "unsat"),
            (json!({"type": "array", "minItems": 3, "maxItems": 2}), "unsat"),
            (json!({"type": "string", "minLength": 3, "maxLength": 2}), "unsat"),
            (json!({"enum": []}), "unsat"),
            (json!(false), "unsat"),
            (json!({"type": "string", "pattern": "^\"$"}), "unsat"),
            (json!({"type": "string", "pattern": "(unclosed"}), "regex"),
            (json!({"$ref": "#/$defs/missing"}), "ref"),
            (json!({"$ref": "http://example.com/s.json"}), "ref"),
            (json!({"not": {"type": "string"}}), "unsupported"),
            (json!({"type": "integer", "multipleOf": 3}), "unsupported"),
            (json!({"type": "strnig"}), "invalid"),
            (json!({"type": "object", "required": "name"}), "invalid"),
            (json!(3), "invalid"),
        ];
        for (s, kind) in cases {
            let Some(e) = gs(&s).err() else { panic!("{s} compiled") };
            let got = match e {
                GrammarError::Unsatisfiable(_) => "unsat",
                GrammarError::InvalidRegex { .. } => "regex",
                GrammarError::UnresolvedRef(_) => "ref",
                GrammarError::UnsupportedSchema { .. } => "unsupported",
                GrammarError::InvalidSchema { .. } => "invalid",
                ref other => panic!("{s}: unexpected {other}"),
            };
            assert_eq!(got, kind, "{s}: {e}");
        }
    }
}
