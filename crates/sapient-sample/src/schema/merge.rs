//! `allOf` and sibling keywords merged into one schema.

use super::*;
use serde_json::json;

/// `sub` with the keywords of `parent` (other than `key`) added where `sub` lacks them.
pub(super) fn merge_siblings(parent: &serde_json::Map<String, Value>, sub: &Value, key: &str) -> Value {
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
pub(super) fn merge_all_of(root: &Value, parent: &serde_json::Map<String, Value>, all: &Value, path: &str) -> Result<Value, GrammarError> {
    let list = all.as_array().ok_or_else(|| invalid(path, "allOf must be an array"))?;
    if list.is_empty() {
        return Err(invalid(path, "allOf must not be empty"));
    }
    let discriminated = discriminate(list);
    let list = discriminated.as_ref().unwrap_or(list);
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
        // not, if/then/else and dependencies as the allOf they mean.
        let sub = match super::rewrite::expand(root, &sub, &format!("{path}/{i}"))? {
            Some(Value::Object(m)) => m,
            _ => sub,
        };
        let mut sub = match sub.get("allOf") {
            Some(inner) => match merge_all_of(root, &sub, inner, &format!("{path}/{i}"))? {
                Value::Object(m) => m,
                _ => continue,
            },
            None => sub,
        };
        // `additionalProperties` of one side applies to the other side's properties.
        let props_of = |m: &mut serde_json::Map<String, Value>| match m.remove("properties") {
            Some(Value::Object(p)) => p,
            _ => serde_json::Map::new(),
        };
        let (pa, mut pb) = (props_of(&mut acc), props_of(&mut sub));
        let (aa, ab) = (acc.get("additionalProperties").cloned(), sub.get("additionalProperties").cloned());
        let mut props = serde_json::Map::new();
        let mut dropped = Vec::new();
        for (name, s1) in pa {
            let e = match (pb.remove(&name), &ab) {
                (Some(s2), _) if s2 != s1 => serde_json::json!({"allOf": [s1, s2]}),
                (Some(_), _) | (None, None) | (None, Some(Value::Bool(true))) => s1,
                (None, Some(Value::Bool(false))) => {
                    dropped.push(name);
                    continue;
                }
                (None, Some(extra)) => serde_json::json!({"allOf": [s1, extra]}),
            };
            props.insert(name, e);
        }
        for (name, s2) in pb {
            let e = match &aa {
                None | Some(Value::Bool(true)) => s2,
                Some(Value::Bool(false)) => {
                    dropped.push(name);
                    continue;
                }
                Some(extra) => serde_json::json!({"allOf": [extra, s2]}),
            };
            props.insert(name, e);
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
                "anyOf" | "oneOf" => {
                    // (a1 or a2) and (b1 or b2): every pair of branches.
                    let (xs, ys) = (old.as_array().cloned().unwrap_or_default(), v.as_array().cloned().unwrap_or_default());
                    if xs.len() * ys.len() > MAX_BRANCHES {
                        return Err(GrammarError::TooLarge { what: format!("anyOf branches of the allOf at {path}"), limit: MAX_BRANCHES });
                    }
                    Value::Array(xs.iter().flat_map(|x| ys.iter().map(move |y| serde_json::json!({"allOf": [x, y]}))).collect())
                }
                NOT_VALUES => {
                    let mut a = old.as_array().cloned().unwrap_or_default();
                    a.extend(v.as_array().cloned().unwrap_or_default());
                    Value::Array(a)
                }
                "pattern" => {
                    let mut extra = acc.get(PATTERNS).and_then(|p| p.as_array()).cloned().unwrap_or_default();
                    extra.push(v);
                    acc.insert(PATTERNS.into(), Value::Array(extra));
                    old
                }
                PATTERNS => {
                    let mut a = old.as_array().cloned().unwrap_or_default();
                    a.extend(v.as_array().cloned().unwrap_or_default());
                    Value::Array(a)
                }
                "enum" | "const" => {
                    let as_list = |k: &str, x: &Value| if k == "const" { vec![x.clone()] } else { x.as_array().cloned().unwrap_or_default() };
                    let ys = as_list(&k, &v);
                    let both: Vec<Value> = as_list(&k, &old).into_iter().filter(|x| ys.iter().any(|y| crate::spec::json_eq(x, y))).collect();
                    if both.is_empty() {
                        return Err(GrammarError::Unsatisfiable(format!("allOf at {path} has no value in both {k} lists")));
                    }
                    if k == "const" { both[0].clone() } else { Value::Array(both) }
                }
                "items" | "additionalItems" | "propertyNames" | "contains" => serde_json::json!({"allOf": [old, v]}),
                "patternProperties" => {
                    let mut m = old.as_object().cloned().unwrap_or_default();
                    for (p, x) in v.as_object().cloned().unwrap_or_default() {
                        let e = match m.remove(&p) {
                            Some(y) if y != x => serde_json::json!({"allOf": [y, x]}),
                            _ => x,
                        };
                        m.insert(p, e);
                    }
                    Value::Object(m)
                }
                "prefixItems" => {
                    let (mut xs, ys) = (old.as_array().cloned().unwrap_or_default(), v.as_array().cloned().unwrap_or_default());
                    for (j, y) in ys.into_iter().enumerate() {
                        match xs.get_mut(j) {
                            Some(x) => *x = serde_json::json!({"allOf": [x.clone(), y]}),
                            None => xs.push(y),
                        }
                    }
                    Value::Array(xs)
                }
                "uniqueItems" => Value::Bool(old == Value::Bool(true) || v == Value::Bool(true)),
                // A keyword no part of the compiler reads (an editor's `markdownDescription`,
                // `x-...` extensions, draft 4's `id`) constrains nothing: either value does.
                _ if !SUPPORTED_KEYWORDS.contains(&k.as_str()) && !crate::spec::UNSUPPORTED.contains(&k.as_str()) && !k.starts_with("$sapient-") => old,
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


/// `sub`'s parts if it is `{"if": {"properties": {P: {"const": c}}}, "then": T}` with a string
/// `c` (the `if` may also require P; no `else`): (P, c, whether the `if` requires P, T).
fn if_const(sub: &Value) -> Option<(&str, &Value, bool, &Value)> {
    let o = sub.as_object()?;
    if o.keys().any(|k| !["if", "then"].contains(&k.as_str()) && !is_annotation(k)) {
        return None;
    }
    let (cond, then) = (o.get("if")?.as_object()?, o.get("then")?);
    if cond.keys().any(|k| !["properties", "required"].contains(&k.as_str()) && !is_annotation(k)) {
        return None;
    }
    let props = cond.get("properties")?.as_object()?;
    let (name, c) = props.iter().next().filter(|_| props.len() == 1)?;
    let c = c.as_object()?;
    if c.keys().any(|k| k != "const" && !is_annotation(k)) {
        return None;
    }
    let value = c.get("const").filter(|v| v.is_string())?;
    let required = match cond.get("required") {
        None => false,
        Some(Value::Array(r)) if r.len() == 1 && r[0] == name.as_str() => true,
        Some(_) => return None,
    };
    Some((name.as_str(), value, required, then))
}

/// An `allOf` whose branches include several `if`s on one property's value (a
/// discriminator: `"if": {"properties": {"type": {"const": "a"}}}, "then": ...` for each
/// kind), with those branches replaced by the one `anyOf` they mean: an object whose
/// property has one of the values and that value's `then`, one with another value, or
/// (as every `if` holds then, unless it requires the property) a value without the
/// property under all the `then`s. As separate `if`s, each would double the branches of
/// the merged schema. `None` when there is no such group.
fn discriminate(list: &[Value]) -> Option<Vec<Value>> {
    let parts: Vec<_> = list.iter().map(if_const).collect();
    let (name, required) = parts.iter().flatten().map(|p| (p.0, p.2)).find(|&(n, r)| parts.iter().flatten().filter(|p| p.0 == n && p.2 == r).count() >= 2)?;
    let group: Vec<(&Value, &Value)> = parts.iter().flatten().filter(|p| p.0 == name && p.2 == required).map(|p| (p.1, p.3)).collect();
    let values: Vec<&Value> = group.iter().map(|g| g.0).collect();
    if values.iter().enumerate().any(|(i, v)| values[..i].contains(v)) {
        return None;
    }
    let mut alts: Vec<Value> = group
        .iter()
        .map(|(v, then)| json!({"allOf": [{"type": "object", "required": [name], "properties": {name: {"const": v}}}, then]}))
        .collect();
    alts.push(json!({"type": "object", "required": [name], "properties": {name: {NOT_VALUES: values}}}));
    let absent = json!({"anyOf": [{"not": {"type": "object"}}, {"type": "object", "properties": {name: false}}]});
    if required {
        alts.push(absent);
    } else {
        let mut all = vec![absent];
        all.extend(group.iter().map(|g| g.1.clone()));
        alts.push(json!({"allOf": all}));
    }
    let mut out: Vec<Value> = list.iter().zip(&parts).filter(|(_, p)| !p.is_some_and(|p| p.0 == name && p.2 == required)).map(|(v, _)| v.clone()).collect();
    out.push(json!({"anyOf": alts}));
    Some(out)
}

/// An `allOf` of which a branch lists its values (`enum`, `const`, or an `anyOf` of such):
/// those values that the schema's other branches and keywords accept, each checked by the
/// validator, rather than the branches merged (narrowing a property that is a long `anyOf`
/// of enums, once per alternative of an `anyOf` around it, made merging quadratic). `None`
/// (merge them) when the validator cannot decide every value, or the schema holds the
/// compiler's own keywords (which the validator does not read).
pub(super) fn all_of_values(b: &mut Builder, cx: &Ctx, s: &Value, all: &Value, path: &str) -> Result<Option<NodeId>, GrammarError> {
    let (Some(list), Some(obj)) = (all.as_array(), s.as_object()) else { return Ok(None) };
    let Some((src, (values, exact))) = list.iter().enumerate().find_map(|(i, x)| Some((i, listed_values(cx.root, x, 0)?))) else {
        return Ok(None);
    };
    fn own_keywords(v: &Value) -> bool {
        match v {
            Value::Object(m) => m.iter().any(|(k, x)| k.starts_with("$sapient-") || own_keywords(x)),
            Value::Array(a) => a.iter().any(own_keywords),
            _ => false,
        }
    }
    if own_keywords(s) {
        return Ok(None);
    }
    // What each value must also satisfy: the other branches, the source branch unless its
    // values satisfy it by construction, and the keywords beside `allOf`.
    let rest = obj
        .keys()
        .any(|k| k != "allOf" && !is_annotation(k))
        .then(|| Value::Object(obj.iter().filter(|(k, _)| k.as_str() != "allOf").map(|(k, v)| (k.clone(), v.clone())).collect()));
    let checks: Vec<&Value> = list.iter().enumerate().filter(|&(i, _)| i != src || !exact).map(|(_, x)| x).chain(rest.as_ref()).collect();
    let mut kept = Vec::with_capacity(values.len());
    'values: for v in values {
        for c in &checks {
            match crate::validate::validate_in(cx.root, c, &v) {
                Ok(Ok(())) => {}
                Ok(Err(_)) => continue 'values,
                Err(_) => return Ok(None),
            }
        }
        kept.push(v);
    }
    value_choice(b, &kept, path).map(Some)
}

/// The values a schema lists (`enum`, `const`, an `anyOf` whose every branch lists values;
/// `$ref`s followed) and whether every one of them satisfies it (nothing else constrains
/// them); `None` when it lists none.
fn listed_values(root: &Value, x: &Value, depth: usize) -> Option<(Vec<Value>, bool)> {
    if depth > 32 {
        return None;
    }
    let m = x.as_object()?;
    if let Some(r) = m.get("$ref").and_then(Value::as_str) {
        let (v, exact) = listed_values(root, resolve(root, r)?, depth + 1)?;
        return Some((v, exact && m.keys().all(|k| k == "$ref" || is_annotation(k))));
    }
    let plain = |extra: &str| m.keys().all(|k| k == extra || is_annotation(k));
    match (m.get("const"), m.get("enum"), m.get("anyOf")) {
        (Some(c), _, _) => Some((vec![c.clone()], plain("const"))),
        (None, Some(Value::Array(e)), _) => Some((e.clone(), plain("enum"))),
        (None, None, Some(Value::Array(alts))) if !alts.is_empty() => {
            let mut all = Vec::new();
            let mut exact = plain("anyOf");
            for a in alts {
                let (v, e) = listed_values(root, a, depth + 1)?;
                all.extend(v);
                exact &= e;
            }
            Some((all, exact))
        }
        _ => None,
    }
}
