//! Keywords rewritten into the ones the compiler builds: `not` (as the schema's negation,
//! for the forms that have one), `if`/`then`/`else`, `dependentRequired`,
//! `dependentSchemas` and the older `dependencies`.

use super::*;
use serde_json::json;

/// Every JSON type but those named (`number` includes `integer`).
fn types_except(names: &[&str]) -> Value {
    let all = ["null", "boolean", "object", "array", "number", "string"];
    let left: Vec<&str> = all.iter().copied().filter(|t| !(names.contains(t) || (*t == "number" && names.contains(&"integer")))).collect();
    if left.is_empty() {
        Value::Bool(false)
    } else {
        json!({ "type": left })
    }
}

/// `{"anyOf": [values of other types, this constraint within its type]}`.
fn or_other_types(ty: &str, inner: Value) -> Value {
    let other = types_except(&[ty]);
    let mut inner = match inner {
        Value::Object(m) => m,
        _ => return other,
    };
    inner.insert("type".into(), Value::from(ty));
    json!({ "anyOf": [other, Value::Object(inner)] })
}

/// A schema accepting exactly the values `s` rejects, for the forms that have one (types,
/// values, required properties, properties, bounds, and any of these combined with `anyOf`,
/// `allOf` or `not`); any other is refused by name.
pub(super) fn negate(root: &Value, s: &Value, path: &str, depth: usize) -> Result<Value, GrammarError> {
    if depth > 32 {
        return Err(GrammarError::TooLarge { what: format!("nested negations at {path}"), limit: 32 });
    }
    let obj = match s {
        Value::Bool(b) => return Ok(Value::Bool(!b)),
        Value::Object(o) => o,
        _ => return Err(invalid(path, "a schema must be an object or a boolean")),
    };
    let refuse = |k: &str| GrammarError::UnsupportedSchema { path: path.to_string(), keyword: format!("not with {k}") };
    let keys: Vec<&String> = obj.keys().filter(|k| !is_annotation(k)).collect();
    if keys.is_empty() {
        return Ok(Value::Bool(false));
    }
    // not (a and b) = (not a) or (not b): one keyword at a time.
    if keys.len() > 1 {
        if obj.contains_key("$ref") {
            return Err(refuse("$ref beside other keywords"));
        }
        let grouped = ["exclusiveMinimum", "exclusiveMaximum", "additionalProperties", "patternProperties", "items", "prefixItems", "additionalItems", "if", "then", "else", "contains", "minContains", "maxContains"];
        if let Some(k) = keys.iter().find(|k| grouped.contains(&k.as_str())) {
            return Err(refuse(k));
        }
        let alts = keys
            .iter()
            .map(|k| {
                let one: serde_json::Map<String, Value> = [((*k).clone(), obj[k.as_str()].clone())].into_iter().collect();
                negate(root, &Value::Object(one), path, depth + 1)
            })
            .collect::<Result<Vec<_>, _>>()?;
        return Ok(json!({ "anyOf": alts }));
    }
    let k = keys[0].as_str();
    let v = &obj[k];
    let n = |x: &Value| x.as_u64();
    Ok(match k {
        "type" => {
            let names: Vec<&str> = match v {
                Value::String(t) => vec![t.as_str()],
                Value::Array(a) => a.iter().filter_map(|t| t.as_str()).collect(),
                _ => return Err(invalid(path, "type must be a string or a list")),
            };
            types_except(&names)
        }
        "const" => json!({ NOT_VALUES: [v] }),
        "enum" => json!({ NOT_VALUES: v }),
        "required" => {
            let names: Vec<&str> = v.as_array().map(|a| a.iter().filter_map(|x| x.as_str()).collect()).unwrap_or_default();
            if names.is_empty() {
                return Ok(Value::Bool(false));
            }
            let mut alts = vec![types_except(&["object"])];
            alts.extend(names.iter().map(|name| json!({"type": "object", "properties": { *name: false }})));
            json!({ "anyOf": alts })
        }
        "properties" => {
            let props = v.as_object().ok_or_else(|| invalid(path, "properties must be an object"))?;
            let alts = props
                .iter()
                .map(|(name, sub)| Ok(json!({"type": "object", "required": [name], "properties": { name.as_str(): negate(root, sub, path, depth + 1)? }})))
                .collect::<Result<Vec<_>, GrammarError>>()?;
            if alts.is_empty() {
                return Ok(Value::Bool(false));
            }
            json!({ "anyOf": alts })
        }
        "anyOf" | "allOf" => {
            let list = v.as_array().ok_or_else(|| invalid(path, format!("{k} must be an array")))?;
            let alts = list.iter().map(|x| negate(root, x, path, depth + 1)).collect::<Result<Vec<_>, _>>()?;
            if k == "anyOf" {
                json!({ "allOf": alts })
            } else {
                json!({ "anyOf": alts })
            }
        }
        "not" => v.clone(),
        "$ref" => {
            let r = v.as_str().ok_or_else(|| invalid(path, "$ref must be a string"))?;
            let target = resolve(root, r).ok_or_else(|| GrammarError::UnresolvedRef(r.to_string()))?;
            negate(root, target, r, depth + 1)?
        }
        "minimum" => or_other_types("number", json!({ "exclusiveMaximum": v })),
        "maximum" => or_other_types("number", json!({ "exclusiveMinimum": v })),
        "exclusiveMinimum" if v.is_number() => or_other_types("number", json!({ "maximum": v })),
        "exclusiveMaximum" if v.is_number() => or_other_types("number", json!({ "minimum": v })),
        "minLength" | "minItems" | "minProperties" => {
            match n(v) {
                Some(0) => Value::Bool(false),
                Some(m) => or_other_types(counted_type(k), json!({ k.replace("min", "max"): m - 1 })),
                None => return Err(invalid(path, format!("{k} must be a non-negative integer"))),
            }
        }
        "maxLength" | "maxItems" | "maxProperties" => {
            match n(v) {
                Some(m) => or_other_types(counted_type(k), json!({ k.replace("max", "min"): m + 1 })),
                None => return Err(invalid(path, format!("{k} must be a non-negative integer"))),
            }
        }
        other => return Err(refuse(other)),
    })
}

/// `obj` with `not`, `if`/`then`/`else` and the dependency keywords replaced by an `allOf`
/// of what they mean, or `None` when it has none of them.
pub(super) fn expand(root: &Value, obj: &serde_json::Map<String, Value>, path: &str) -> Result<Option<Value>, GrammarError> {
    const KEYS: [&str; 7] = ["not", "if", "then", "else", "dependentRequired", "dependentSchemas", "dependencies"];
    if !KEYS.iter().any(|k| obj.contains_key(*k)) {
        return Ok(None);
    }
    let mut rest: serde_json::Map<String, Value> = obj.iter().filter(|(k, _)| !KEYS.contains(&k.as_str())).map(|(k, v)| (k.clone(), v.clone())).collect();
    let mut extra: Vec<Value> = match rest.remove("allOf") {
        Some(Value::Array(a)) => a,
        Some(_) => return Err(invalid(path, "allOf must be an array")),
        None => Vec::new(),
    };
    if let Some(n) = obj.get("not") {
        extra.push(negate(root, n, &format!("{path}/not"), 0)?);
    }
    if let Some(cond) = obj.get("if") {
        let (then, els) = (obj.get("then"), obj.get("else"));
        if then.is_some() || els.is_some() {
            let not_cond = negate(root, cond, &format!("{path}/if"), 0).map_err(|e| match e {
                GrammarError::UnsupportedSchema { path, keyword } => GrammarError::UnsupportedSchema { path, keyword: format!("if ({keyword})") },
                e => e,
            })?;
            let t = then.cloned().unwrap_or(Value::Bool(true));
            let e = els.cloned().unwrap_or(Value::Bool(true));
            extra.push(json!({ "anyOf": [{ "allOf": [cond, t] }, { "allOf": [not_cond, e] }] }));
        }
    }
    let absent = |name: &str| json!({ "anyOf": [types_except(&["object"]), {"type": "object", "properties": { name: false }}] });
    let mut dependency = |name: &str, dep: &Value, spath: &str| -> Result<(), GrammarError> {
        let present = match dep {
            Value::Array(names) => {
                let mut req = vec![Value::from(name)];
                req.extend(names.iter().cloned());
                json!({ "required": req })
            }
            Value::Object(_) | Value::Bool(_) => json!({ "allOf": [{ "required": [name] }, dep] }),
            _ => return Err(invalid(spath, "a dependency must be a list of names or a schema")),
        };
        extra.push(json!({ "anyOf": [absent(name), present] }));
        Ok(())
    };
    for key in ["dependentRequired", "dependentSchemas", "dependencies"] {
        match obj.get(key) {
            None => {}
            Some(Value::Object(m)) => {
                for (name, dep) in m {
                    dependency(name, dep, &format!("{path}/{key}"))?;
                }
            }
            Some(_) => return Err(invalid(path, format!("{key} must be an object"))),
        }
    }
    if extra.is_empty() {
        return Ok(Some(Value::Object(rest)));
    }
    rest.insert("allOf".into(), Value::Array(extra));
    Ok(Some(Value::Object(rest)))
}

/// The type a count keyword (`minLength`, `maxItems`, `minProperties`, ...) applies to.
fn counted_type(k: &str) -> &'static str {
    if k.ends_with("Length") {
        "string"
    } else if k.ends_with("Items") {
        "array"
    } else {
        "object"
    }
}
