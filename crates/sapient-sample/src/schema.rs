//! JSON Schema to grammar nodes.
//!
//! Supported: `type` (one or a list), `properties` / `required` (properties are generated
//! in the order the schema lists them; optional ones may be left out), `additionalProperties`
//! (only used when no `properties` are given: a free map of that schema), `items`,
//! `minItems` / `maxItems`, `enum`, `const`, `minLength` / `maxLength`, `pattern` (anchored
//! with `^...$` or searched anywhere; such strings are generated without escapes), `format`
//! (`date`, `time`, `date-time`, `uuid`, `email` with a local part of at most 32 characters
//! and at most four domain labels of 24, `ipv4`; others ignored with a warning),
//! `minimum` / `maximum` / `exclusiveMinimum` / `exclusiveMaximum` for integers and numbers,
//! `anyOf`, `oneOf` (treated as `anyOf`), a one-element `allOf`, `$ref` within the schema
//! (`#`, `#/$defs/..`, `#/definitions/..`, any JSON pointer; recursion allowed), and boolean
//! schemas. Annotations (`title`, `description`, `default`, `examples`, ...) are ignored.
//! Keywords that change validity but are not implemented (`not`, `if`, `patternProperties`,
//! `multipleOf`, ...) are an error, so a grammar never silently accepts less than its
//! schema promises... except `uniqueItems`, which is common and only warned about.

use crate::builder::{Builder, NodeId, JSON_NUMBER};
use crate::error::GrammarError;
use serde_json::Value;
use std::collections::HashMap;

pub(crate) const UNSUPPORTED: &[&str] = &[
    "not", "if", "then", "else", "patternProperties", "dependentRequired", "dependentSchemas",
    "dependencies", "propertyNames", "contains", "minContains", "maxContains", "multipleOf",
    "minProperties", "maxProperties", "unevaluatedProperties", "unevaluatedItems", "prefixItems",
    "additionalItems", "$dynamicRef", "$recursiveRef",
];

struct Ctx<'a> {
    root: &'a Value,
    refs: HashMap<String, NodeId>,
}

pub(crate) fn compile(b: &mut Builder, schema: &Value) -> Result<NodeId, GrammarError> {
    let mut cx = Ctx { root: schema, refs: HashMap::new() };
    node(b, &mut cx, schema, "#")
}

fn invalid(path: &str, message: impl Into<String>) -> GrammarError {
    GrammarError::InvalidSchema { path: path.to_string(), message: message.into() }
}

fn json_lit(b: &mut Builder, v: &Value) -> NodeId {
    let s = serde_json::to_string(v).unwrap_or_default();
    b.lit(&s)
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

fn node(b: &mut Builder, cx: &mut Ctx, s: &Value, path: &str) -> Result<NodeId, GrammarError> {
    let obj = match s {
        Value::Bool(true) => return b.json_value(),
        Value::Bool(false) => return Err(GrammarError::Unsatisfiable(format!("schema `false` at {path}"))),
        Value::Object(o) => o,
        _ => return Err(invalid(path, "a schema must be an object or a boolean")),
    };
    if let Some(r) = obj.get("$ref") {
        let r = r.as_str().ok_or_else(|| invalid(path, "$ref must be a string"))?;
        if let Some(&id) = cx.refs.get(r) {
            return Ok(id);
        }
        let target = resolve(cx.root, r).ok_or_else(|| GrammarError::UnresolvedRef(r.to_string()))?;
        let placeholder = b.choice(vec![]);
        cx.refs.insert(r.to_string(), placeholder);
        let inner = node(b, cx, target, r)?;
        b.nodes[placeholder as usize] = crate::builder::Node::Choice(vec![inner].into());
        return Ok(placeholder);
    }
    for k in UNSUPPORTED {
        if obj.contains_key(*k) {
            return Err(GrammarError::UnsupportedSchema { path: path.to_string(), keyword: k.to_string() });
        }
    }
    if obj.get("uniqueItems") == Some(&Value::Bool(true)) {
        tracing::warn!(path, "uniqueItems is not enforced during generation");
    }
    if let Some(c) = obj.get("const") {
        return Ok(json_lit(b, c));
    }
    if let Some(e) = obj.get("enum") {
        let e = e.as_array().ok_or_else(|| invalid(path, "enum must be an array"))?;
        if e.is_empty() {
            return Err(GrammarError::Unsatisfiable(format!("empty enum at {path}")));
        }
        let alts = e.iter().map(|v| json_lit(b, v)).collect();
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
    if let Some(all) = obj.get("allOf") {
        match all.as_array().map(|a| a.as_slice()) {
            Some([one]) => {
                let merged = merge_siblings(obj, one, "allOf");
                return node(b, cx, &merged, &format!("{path}/allOf/0"));
            }
            _ => return Err(GrammarError::UnsupportedSchema { path: path.to_string(), keyword: "allOf".into() }),
        }
    }
    let types: Vec<&str> = match obj.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(a)) => {
            a.iter().map(|t| t.as_str().ok_or_else(|| invalid(path, "type list must hold strings"))).collect::<Result<_, _>>()?
        }
        Some(_) => return Err(invalid(path, "type must be a string or a list")),
        None => {
            if obj.contains_key("properties") || obj.contains_key("required") || obj.contains_key("additionalProperties") {
                vec!["object"]
            } else if obj.contains_key("items") || obj.contains_key("minItems") || obj.contains_key("maxItems") {
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

fn is_annotation(k: &str) -> bool {
    matches!(k, "title" | "description" | "default" | "examples" | "$schema" | "$id" | "$comment" | "$defs" | "definitions")
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
        return b.regex(JSON_NUMBER, false);
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
        "time" => r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,6})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])?",
        "date-time" => DATE_TIME,
        "uuid" => r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
        // Shorter than RFC 5321 allows (64 / 63 x 8): long runs are where small models loop.
        "email" => r"[A-Za-z0-9._%+-]{1,32}@[A-Za-z0-9-]{1,24}(?:\.[A-Za-z0-9-]{1,24}){1,3}",
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
    let item = match obj.get("items") {
        None => b.json_value()?,
        Some(Value::Array(_)) => {
            return Err(GrammarError::UnsupportedSchema { path: path.to_string(), keyword: "items (tuple form)".into() })
        }
        Some(s) => node(b, cx, s, &format!("{path}/items"))?,
    };
    let min = get_u32(obj, "minItems", path)?.unwrap_or(0);
    let max = get_u32(obj, "maxItems", path)?.unwrap_or(u32::MAX);
    if min > max {
        return Err(GrammarError::Unsatisfiable(format!("minItems {min} > maxItems {max} at {path}")));
    }
    let ws = b.ws()?;
    let comma = b.lit(",");
    let sep = b.seq_ws(&[ws, Some(comma), ws]);
    b.array_of(item, sep, ws, min, max)
}

fn object(b: &mut Builder, cx: &mut Ctx, obj: &serde_json::Map<String, Value>, path: &str) -> Result<NodeId, GrammarError> {
    let ws = b.ws()?;
    let comma = b.lit(",");
    let sep = b.seq_ws(&[ws, Some(comma), ws]);
    let colon = b.lit(":");
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
    if props.is_empty() && required.is_empty() {
        let open = b.lit("{");
        let close = b.lit("}");
        return match obj.get("additionalProperties") {
            Some(Value::Bool(false)) => Ok(b.seq_ws(&[Some(open), ws, Some(close)])),
            other => {
                let value = match other {
                    None | Some(Value::Bool(true)) => b.json_value()?,
                    Some(s) => node(b, cx, s, &format!("{path}/additionalProperties"))?,
                };
                let key = b.json_string()?;
                let member = b.seq_ws(&[Some(key), ws, Some(colon), ws, Some(value)]);
                b.object_of(member, sep, ws)
            }
        };
    }
    // (member node, required) in schema order; required names without a schema take any value.
    let mut members: Vec<(NodeId, bool)> = Vec::new();
    for (name, sub) in &props {
        let v = node(b, cx, sub, &format!("{path}/properties/{name}"))?;
        let key = json_lit(b, &Value::String(name.clone()));
        let m = b.seq_ws(&[Some(key), ws, Some(colon), ws, Some(v)]);
        members.push((m, required.contains(&name.as_str())));
    }
    for r in &required {
        if !props.contains_key(*r) {
            let v = b.json_value()?;
            let key = json_lit(b, &Value::String(r.to_string()));
            let m = b.seq_ws(&[Some(key), ws, Some(colon), ws, Some(v)]);
            members.push((m, true));
        }
    }
    let n = members.len();
    // tail[j]: what may follow once members before j are decided (each preceded by a comma).
    let mut tail = vec![0 as NodeId; n + 1];
    tail[n] = b.seq(vec![]);
    for j in (0..n).rev() {
        let (m, req) = members[j];
        let with = b.seq(vec![sep, m, tail[j + 1]]);
        tail[j] = if req { with } else { b.choice(vec![with, tail[j + 1]]) };
    }
    // The first member present: any up to and including the first required one.
    let mut alts = Vec::new();
    let first_req = members.iter().position(|m| m.1);
    for j in 0..=first_req.unwrap_or(n.saturating_sub(1)).min(n - 1) {
        alts.push(b.seq(vec![members[j].0, tail[j + 1]]));
    }
    let open = b.lit("{");
    let close = b.lit("}");
    let nonempty_body = b.choice(alts);
    let nonempty = b.seq_ws(&[Some(nonempty_body), ws, Some(close)]);
    let body = if first_req.is_none() { b.choice(vec![close, nonempty]) } else { nonempty };
    Ok(b.seq_ws(&[Some(open), ws, Some(body)]))
}

#[cfg(test)]
mod tests {
    use crate::{Constraint, Grammar, GrammarError};
    use serde_json::json;

    fn ok(g: &Grammar, v: &serde_json::Value) -> bool {
        let compact = serde_json::to_string(v).unwrap();
        let pretty = serde_json::to_string_pretty(v).unwrap();
        let a = g.matches(compact.as_bytes()).unwrap();
        let b = g.matches(pretty.as_bytes()).unwrap();
        assert_eq!(a, b, "compact and pretty disagree on {compact}");
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
        let g = Grammar::json_schema(&s).unwrap();
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
        let g = Grammar::json_schema(&s).unwrap();
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
        let g = Grammar::json_schema(&s).unwrap();
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
        let g = Grammar::json_schema(&json!({"type": ["string", "null"]})).unwrap();
        assert!(ok(&g, &json!("x")) && ok(&g, &json!(null)) && !ok(&g, &json!(1)));
        let g = Grammar::json_schema(&json!({"type": "object", "additionalProperties": {"type": "integer"}})).unwrap();
        assert!(ok(&g, &json!({"a": 1, "b": 2})) && ok(&g, &json!({})) && !ok(&g, &json!({"a": "x"})));
        let g = Grammar::json_schema(&json!(true)).unwrap();
        assert!(ok(&g, &json!({"any": [1, {"thing": null}]})));
        let g = Grammar::json_schema(&json!({"type": "string", "pattern": "a+b"})).unwrap();
        assert!(ok(&g, &json!("xxaab!")) && !ok(&g, &json!("ba")));
    }

    #[test]
    fn date_formats_respect_month_lengths() {
        let g = Grammar::json_schema(&json!({"type": "string", "format": "date"})).unwrap();
        for (d, want) in [("2024-02-29", true), ("2024-02-30", false), ("2024-04-31", false), ("2024-12-31", true), ("2024-13-01", false), ("2024-06-00", false)] {
            assert_eq!(ok(&g, &json!(d)), want, "{d}");
        }
        let g = Grammar::json_schema(&json!({"type": "string", "format": "date-time"})).unwrap();
        assert!(ok(&g, &json!("2024-11-30T23:59:59Z")) && ok(&g, &json!("2024-01-01T00:00:00.5+02:00")));
        assert!(!ok(&g, &json!("2024-11-31T10:00:00Z")) && !ok(&g, &json!("2024-11-30T24:00:00Z")));
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
            let e = Grammar::json_schema(&s).expect_err(&s.to_string());
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
