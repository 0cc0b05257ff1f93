//! A JSON Schema validator for the keywords the grammar compiler supports (see `schema.rs`).
//!
//! The grammar generates a subset of the documents a schema describes (properties in schema
//! order, bounded whitespace, strings with a pattern written without escapes, ...); this
//! checks a parsed value against the schema itself, so [`crate::Parse::parse`] accepts
//! exactly the JSON the schema describes, in any property order and formatting.
//!
//! Semantics are those of draft 2020-12 where the drafts differ: `integer` is any number with
//! no fractional part (`1.0` included), `minLength`/`maxLength` count code points, `pattern`
//! is searched anywhere (ECMAScript `\d` is ASCII), keywords beside `$ref` apply too, `oneOf`
//! needs exactly one branch, `uniqueItems` is checked, and `format` (`date`, `time`,
//! `date-time`, `uuid`, `email`, `ipv4`, as bounded as the grammar's) is asserted.

use crate::error::GrammarError;
use crate::spec::json_eq;
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// Why a value does not satisfy a schema: where (a JSON pointer into the value) and what.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("at {path:?}: {message}")]
pub struct Invalid {
    pub path: String,
    pub message: String,
}

/// Check `value` against `schema`: `Ok(Ok(()))` if it satisfies it, `Ok(Err(why))` if not,
/// `Err` if the schema is malformed or uses a keyword the grammar compiler refuses.
pub fn validate(schema: &Value, value: &Value) -> Result<Result<(), Invalid>, GrammarError> {
    validate_in(schema, schema, value)
}

/// [`validate`] against `schema`, a subschema of `root` (its `$ref`s resolved in `root`).
pub(crate) fn validate_in(root: &Value, schema: &Value, value: &Value) -> Result<Result<(), Invalid>, GrammarError> {
    let cx = Cx { root };
    match cx.check(schema, value, "", "#", 0) {
        Ok(()) => Ok(Ok(())),
        Err(Fail::Invalid(i)) => Ok(Err(i)),
        Err(Fail::Schema(e)) => Err(e),
    }
}

enum Fail {
    Invalid(Invalid),
    Schema(GrammarError),
}

impl From<GrammarError> for Fail {
    fn from(e: GrammarError) -> Self {
        Fail::Schema(e)
    }
}

fn bad(path: &str, message: String) -> Fail {
    Fail::Invalid(Invalid { path: path.to_string(), message })
}

fn schema_err(spath: &str, message: impl Into<String>) -> Fail {
    Fail::Schema(GrammarError::InvalidSchema { path: spath.to_string(), message: message.into() })
}

struct Cx<'a> {
    root: &'a Value,
}

/// A compiled regex, shared (a clone of a `regex::Regex` would build its own search
/// cache on first use).
fn regex_cached(pattern: &str) -> Result<std::sync::Arc<regex::Regex>, GrammarError> {
    static CACHE: OnceLock<Mutex<HashMap<String, std::sync::Arc<regex::Regex>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(r) = cache.lock().ok().and_then(|c| c.get(pattern).cloned()) {
        return Ok(r);
    }
    let r = std::sync::Arc::new(
        regex::Regex::new(pattern).map_err(|e| GrammarError::InvalidRegex { pattern: pattern.to_string(), message: e.to_string() })?,
    );
    if let Ok(mut c) = cache.lock() {
        c.insert(pattern.to_string(), r.clone());
    }
    Ok(r)
}

fn is_integer(v: &Value) -> bool {
    v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|x| x.is_finite() && x.fract() == 0.0)
}

fn num(o: &Map<String, Value>, k: &str) -> Option<f64> {
    o.get(k).and_then(|v| v.as_f64())
}

fn count(o: &Map<String, Value>, k: &str, spath: &str) -> Result<Option<u64>, Fail> {
    match o.get(k) {
        None => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| schema_err(spath, format!("{k} must be a non-negative integer"))),
    }
}

impl Cx<'_> {
    fn check(&self, s: &Value, v: &Value, path: &str, spath: &str, depth: usize) -> Result<(), Fail> {
        if depth > 512 {
            return Err(Fail::Schema(GrammarError::Loop));
        }
        let o = match s {
            Value::Bool(true) => return Ok(()),
            Value::Bool(false) => return Err(bad(path, "the schema is `false`".into())),
            Value::Object(o) => o,
            _ => return Err(schema_err(spath, "a schema must be an object or a boolean")),
        };
        for k in crate::spec::UNSUPPORTED {
            if o.contains_key(*k) {
                return Err(Fail::Schema(GrammarError::UnsupportedSchema { path: spath.to_string(), keyword: k.to_string() }));
            }
        }
        if let Some(r) = o.get("$ref") {
            let r = r.as_str().ok_or_else(|| schema_err(spath, "$ref must be a string"))?;
            let target = crate::spec::resolve(self.root, r).ok_or_else(|| GrammarError::UnresolvedRef(r.to_string()))?;
            self.check(target, v, path, r, depth + 1)?;
        }
        if let Some(c) = o.get("const") {
            if !json_eq(c, v) {
                return Err(bad(path, format!("{v} is not the constant {c}")));
            }
        }
        if let Some(e) = o.get("enum") {
            let e = e.as_array().ok_or_else(|| schema_err(spath, "enum must be an array"))?;
            if !e.iter().any(|x| json_eq(x, v)) {
                return Err(bad(path, format!("{v} is not one of the enum's values")));
            }
        }
        if let Some(list) = o.get("anyOf") {
            let list = list.as_array().ok_or_else(|| schema_err(spath, "anyOf must be an array"))?;
            let mut ok = false;
            for (i, sub) in list.iter().enumerate() {
                match self.check(sub, v, path, &format!("{spath}/anyOf/{i}"), depth + 1) {
                    Ok(()) => {
                        ok = true;
                        break;
                    }
                    Err(Fail::Invalid(_)) => {}
                    Err(e) => return Err(e),
                }
            }
            if !ok {
                return Err(bad(path, format!("{v} matches no branch of anyOf")));
            }
        }
        if let Some(list) = o.get("oneOf") {
            let list = list.as_array().ok_or_else(|| schema_err(spath, "oneOf must be an array"))?;
            let mut n = 0;
            for (i, sub) in list.iter().enumerate() {
                match self.check(sub, v, path, &format!("{spath}/oneOf/{i}"), depth + 1) {
                    Ok(()) => n += 1,
                    Err(Fail::Invalid(_)) => {}
                    Err(e) => return Err(e),
                }
            }
            if n != 1 {
                return Err(bad(path, format!("{v} matches {n} branches of oneOf, not exactly one")));
            }
        }
        // Does `v` satisfy `sub`? (Invalid is an answer, a schema error is not.)
        let holds = |sub: &Value, sp: &str| -> Result<bool, Fail> {
            match self.check(sub, v, path, sp, depth + 1) {
                Ok(()) => Ok(true),
                Err(Fail::Invalid(_)) => Ok(false),
                Err(e) => Err(e),
            }
        };
        if let Some(n) = o.get("not") {
            if holds(n, &format!("{spath}/not"))? {
                return Err(bad(path, format!("{v} satisfies the schema under not")));
            }
        }
        if let Some(cond) = o.get("if") {
            let (branch, key) = if holds(cond, &format!("{spath}/if"))? { (o.get("then"), "then") } else { (o.get("else"), "else") };
            if let Some(b) = branch {
                self.check(b, v, path, &format!("{spath}/{key}"), depth + 1)?;
            }
        }
        if let Value::Object(m) = v {
            for key in ["dependentRequired", "dependentSchemas", "dependencies"] {
                let Some(deps) = o.get(key) else { continue };
                let deps = deps.as_object().ok_or_else(|| schema_err(spath, format!("{key} must be an object")))?;
                for (name, dep) in deps.iter().filter(|(name, _)| m.contains_key(name.as_str())) {
                    match dep {
                        Value::Array(names) => {
                            if let Some(missing) = names.iter().filter_map(|n| n.as_str()).find(|n| !m.contains_key(*n)) {
                                return Err(bad(path, format!("{name:?} is present, so {missing:?} is required")));
                            }
                        }
                        _ => self.check(dep, v, path, &format!("{spath}/{key}/{name}"), depth + 1)?,
                    }
                }
            }
        }
        if let Some(list) = o.get("allOf") {
            let list = list.as_array().ok_or_else(|| schema_err(spath, "allOf must be an array"))?;
            for (i, sub) in list.iter().enumerate() {
                self.check(sub, v, path, &format!("{spath}/allOf/{i}"), depth + 1)?;
            }
        }
        if let Some(t) = o.get("type") {
            let types: Vec<&str> = match t {
                Value::String(t) => vec![t.as_str()],
                Value::Array(a) => a.iter().map(|x| x.as_str().ok_or_else(|| schema_err(spath, "type list must hold strings"))).collect::<Result<_, _>>()?,
                _ => return Err(schema_err(spath, "type must be a string or a list")),
            };
            let mut ok = false;
            for t in types {
                ok |= match t {
                    "null" => v.is_null(),
                    "boolean" => v.is_boolean(),
                    "string" => v.is_string(),
                    "integer" => is_integer(v),
                    "number" => v.is_number(),
                    "array" => v.is_array(),
                    "object" => v.is_object(),
                    other => return Err(schema_err(spath, format!("unknown type {other:?}"))),
                };
            }
            if !ok {
                return Err(bad(path, format!("{v} is not of type {t}")));
            }
        }
        match v {
            Value::Number(n) => self.number(o, n.as_f64().unwrap_or(f64::NAN), v, path),
            Value::String(st) => self.string(o, st, path, spath),
            Value::Array(a) => self.array(o, a, path, spath, depth),
            Value::Object(m) => self.object(o, m, path, spath, depth),
            _ => Ok(()),
        }
    }

    fn number(&self, o: &Map<String, Value>, x: f64, v: &Value, path: &str) -> Result<(), Fail> {
        if num(o, "minimum").is_some_and(|m| x < m) || num(o, "maximum").is_some_and(|m| x > m) {
            return Err(bad(path, format!("{v} is out of the range")));
        }
        let excl = |k: &str, bound: &str| match o.get(k) {
            Some(Value::Bool(true)) => num(o, bound),
            Some(b) => b.as_f64(),
            None => None,
        };
        if excl("exclusiveMinimum", "minimum").is_some_and(|m| x <= m) || excl("exclusiveMaximum", "maximum").is_some_and(|m| x >= m) {
            return Err(bad(path, format!("{v} is out of the exclusive range")));
        }
        if let Some(m) = num(o, "multipleOf").filter(|m| *m > 0.0) {
            let q = x / m;
            if !q.is_finite() || (q - q.round()).abs() > 1e-9 * q.abs().max(1.0) {
                return Err(bad(path, format!("{v} is not a multiple of {m}")));
            }
        }
        Ok(())
    }

    fn string(&self, o: &Map<String, Value>, st: &str, path: &str, spath: &str) -> Result<(), Fail> {
        let n = st.chars().count() as u64;
        if count(o, "minLength", spath)?.is_some_and(|m| n < m) || count(o, "maxLength", spath)?.is_some_and(|m| n > m) {
            return Err(bad(path, format!("{st:?} has {n} characters, outside minLength/maxLength")));
        }
        if let Some(p) = o.get("pattern") {
            let p = p.as_str().ok_or_else(|| schema_err(spath, "pattern must be a string"))?;
            if !regex_cached(&crate::spec::ecma_to_rust(p).map_err(|e| match e {
                GrammarError::UnsupportedSchema { keyword, .. } => GrammarError::UnsupportedSchema { path: spath.to_string(), keyword },
                e => e,
            })?)?
            .is_match(st)
            {
                return Err(bad(path, format!("{st:?} does not match the pattern {p:?}")));
            }
        }
        // An unknown format is an annotation.
        if let Some((f, re)) = o.get("format").and_then(|f| f.as_str()).and_then(|f| Some((f, crate::spec::format_regex(f)?))) {
            if !regex_cached(&format!("^(?:{re})$"))?.is_match(st) {
                return Err(bad(path, format!("{st:?} is not a valid {f}")));
            }
        }
        Ok(())
    }

    fn array(&self, o: &Map<String, Value>, a: &[Value], path: &str, spath: &str, depth: usize) -> Result<(), Fail> {
        let n = a.len() as u64;
        if count(o, "minItems", spath)?.is_some_and(|m| n < m) || count(o, "maxItems", spath)?.is_some_and(|m| n > m) {
            return Err(bad(path, format!("{n} items, outside minItems/maxItems")));
        }
        // Positional schemas (`prefixItems`, or the tuple form of `items`), then the rest.
        let (prefix, rest_key): (&[Value], &str) = match (o.get("prefixItems"), o.get("items")) {
            (Some(Value::Array(p)), _) => (p.as_slice(), "items"),
            (Some(_), _) => return Err(schema_err(spath, "prefixItems must be an array")),
            (None, Some(Value::Array(p))) => (p.as_slice(), "additionalItems"),
            (None, _) => (&[], "items"),
        };
        for (i, x) in a.iter().enumerate() {
            let (sub, sp) = match prefix.get(i) {
                Some(s) => (s, format!("{spath}/prefixItems/{i}")),
                None => match o.get(rest_key) {
                    Some(s) => (s, format!("{spath}/{rest_key}")),
                    None => continue,
                },
            };
            self.check(sub, x, &format!("{path}/{i}"), &sp, depth + 1)?;
        }
        if o.get("uniqueItems") == Some(&Value::Bool(true)) {
            for i in 0..a.len() {
                if a[..i].iter().any(|y| json_eq(y, &a[i])) {
                    return Err(bad(path, format!("item {i} repeats an earlier one (uniqueItems)")));
                }
            }
        }
        Ok(())
    }

    fn object(&self, o: &Map<String, Value>, m: &Map<String, Value>, path: &str, spath: &str, depth: usize) -> Result<(), Fail> {
        let props = match o.get("properties") {
            None => None,
            Some(Value::Object(p)) => Some(p),
            Some(_) => return Err(schema_err(spath, "properties must be an object")),
        };
        let n = m.len() as u64;
        if count(o, "minProperties", spath)?.is_some_and(|x| n < x) || count(o, "maxProperties", spath)?.is_some_and(|x| n > x) {
            return Err(bad(path, format!("{n} properties, outside minProperties/maxProperties")));
        }
        match o.get("required") {
            None => {}
            Some(Value::Array(r)) => {
                for name in r {
                    let name = name.as_str().ok_or_else(|| schema_err(spath, "required must list strings"))?;
                    if !m.contains_key(name) {
                        return Err(bad(path, format!("missing the required property {name:?}")));
                    }
                }
            }
            Some(_) => return Err(schema_err(spath, "required must be an array")),
        }
        let patterns: Vec<(std::sync::Arc<regex::Regex>, &Value, &String)> = match o.get("patternProperties") {
            None => vec![],
            Some(Value::Object(pp)) => pp
                .iter()
                .map(|(p, sub)| {
                    let re = crate::spec::ecma_to_rust(p)?;
                    Ok((regex_cached(&re)?, sub, p))
                })
                .collect::<Result<_, GrammarError>>()?,
            Some(_) => return Err(schema_err(spath, "patternProperties must be an object")),
        };
        for (k, x) in m {
            let p = format!("{path}/{}", k.replace('~', "~0").replace('/', "~1"));
            if let Some(pn) = o.get("propertyNames") {
                self.check(pn, &Value::String(k.clone()), &p, &format!("{spath}/propertyNames"), depth + 1)?;
            }
            let mut matched = false;
            for (re, sub, pat) in &patterns {
                if re.is_match(k) {
                    matched = true;
                    self.check(sub, x, &p, &format!("{spath}/patternProperties/{pat}"), depth + 1)?;
                }
            }
            match props.and_then(|ps| ps.get(k)) {
                Some(sub) => self.check(sub, x, &p, &format!("{spath}/properties/{k}"), depth + 1)?,
                None if matched => {}
                None => match o.get("additionalProperties") {
                    None => {}
                    Some(ap) => self.check(ap, x, &p, &format!("{spath}/additionalProperties"), depth + 1).map_err(|e| match e {
                        Fail::Invalid(i) if ap == &Value::Bool(false) => bad(&i.path, format!("the property {k:?} is not allowed")),
                        e => e,
                    })?,
                },
            }
        }
        Ok(())
    }
}


#[cfg(test)]
mod tests {
    use super::validate;
    use serde_json::json;

    fn ok(s: &serde_json::Value, v: serde_json::Value) -> bool {
        validate(s, &v).expect("schema is supported").is_ok()
    }

    #[test]
    fn keywords() {
        let s = json!({
            "$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["v"], "additionalProperties": false}},
            "type": "object",
            "properties": {
                "name": {"type": "string", "pattern": "^[A-Z][a-z]+$", "maxLength": 5},
                "age": {"type": "integer", "minimum": 1, "exclusiveMaximum": 100},
                "tags": {"type": "array", "items": {"enum": ["a", "b", 1]}, "minItems": 1, "maxItems": 2, "uniqueItems": true},
                "tree": {"$ref": "#/$defs/node"},
                "id": {"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 0}]},
                "k": {"const": {"x": [1, 2.0]}},
                "when": {"type": "string", "format": "date"}
            },
            "required": ["name"],
            "additionalProperties": false
        });
        assert!(ok(&s, json!({"name": "Ann"})));
        // Any property order, integers written as 2.0, numbers compared by value in const.
        assert!(ok(&s, json!({"tags": ["a", 1], "age": 99.0, "name": "Bo", "k": {"x": [1.0, 2]}, "when": "2024-02-29"})));
        assert!(ok(&s, json!({"name": "Ann", "tree": {"kids": [{"v": 1}, {"v": 2, "kids": []}], "v": 0}})));
        assert!(ok(&s, json!({"name": "Ann", "id": 3.5})) && ok(&s, json!({"name": "Ann", "id": -3})), "one branch each");
        for v in [
            json!({}),
            json!({"name": "ann"}),
            json!({"name": "Annabel"}),
            json!({"name": "Ann", "age": 100}),
            json!({"name": "Ann", "age": 0}),
            json!({"name": "Ann", "age": 1.5}),
            json!({"name": "Ann", "tags": []}),
            json!({"name": "Ann", "tags": ["a", "b", 1]}),
            json!({"name": "Ann", "tags": ["a", "a"]}),
            json!({"name": "Ann", "tags": ["c"]}),
            json!({"name": "Ann", "tree": {"v": 1, "kids": [{"v": "x"}]}}),
            json!({"name": "Ann", "tree": {"v": 1, "extra": 1}}),
            json!({"name": "Ann", "id": 3}),
            json!({"name": "Ann", "k": {"x": [1]}}),
            json!({"name": "Ann", "when": "2024-02-30"}),
            json!({"name": "Ann", "other": 1}),
            json!([1]),
        ] {
            assert!(!ok(&s, v.clone()), "{v}");
        }
        assert!(matches!(validate(&json!({"not": {}}), &json!(1)), Ok(Err(_))));
        assert!(validate(&json!({"contains": {}}), &json!([1])).is_err());
        assert!(validate(&json!({"$ref": "#/nowhere"}), &json!(1)).is_err());
    }
}
