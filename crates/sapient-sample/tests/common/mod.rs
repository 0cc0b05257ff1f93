//! Shared by the integration tests: a small JSON Schema validator written independently of
//! the crate (the subset the test schemas use, draft 2020-12 semantics) and random
//! mutations of JSON documents, to check that what the crate accepts is what the schema says.

#![allow(dead_code)]

use rand::rngs::StdRng;
use rand::Rng;
use serde_json::{json, Value};

pub fn resolve<'a>(root: &'a Value, r: &str) -> &'a Value {
    let mut cur = root;
    for part in r.trim_start_matches("#/").split('/').filter(|p| !p.is_empty() && *p != "#") {
        cur = &cur[part];
    }
    cur
}

/// A small JSON Schema validator (the subset these schemas use), independent of the grammar.
pub fn valid(root: &Value, s: &Value, v: &Value) -> Result<(), String> {
    let o = match s {
        Value::Bool(true) => return Ok(()),
        Value::Object(o) => o,
        _ => return Err("bad schema".into()),
    };
    if let Some(r) = o.get("$ref").and_then(|r| r.as_str()) {
        return valid(root, resolve(root, r), v);
    }
    if let Some(c) = o.get("const") {
        return if c == v { Ok(()) } else { Err(format!("{v} != const {c}")) };
    }
    if let Some(e) = o.get("enum").and_then(|e| e.as_array()) {
        return if e.contains(v) { Ok(()) } else { Err(format!("{v} not in enum")) };
    }
    if let Some(a) = o.get("anyOf").and_then(|a| a.as_array()) {
        return if a.iter().any(|s| valid(root, s, v).is_ok()) { Ok(()) } else { Err(format!("{v} matches no anyOf branch")) };
    }
    if let Some(t) = o.get("type") {
        let types: Vec<&str> = match t {
            Value::String(t) => vec![t],
            Value::Array(a) => a.iter().filter_map(|x| x.as_str()).collect(),
            _ => vec![],
        };
        let ok = types.iter().any(|t| match *t {
            "null" => v.is_null(),
            "boolean" => v.is_boolean(),
            "string" => v.is_string(),
            "integer" => v.as_f64().is_some_and(|x| x.fract() == 0.0),
            "number" => v.is_number(),
            "array" => v.is_array(),
            "object" => v.is_object(),
            _ => false,
        });
        if !ok {
            return Err(format!("{v} is not of type {t}"));
        }
    }
    if let Some(x) = v.as_f64() {
        let f = |k: &str| o.get(k).and_then(|b| b.as_f64());
        if f("minimum").is_some_and(|m| x < m) || f("maximum").is_some_and(|m| x > m) {
            return Err(format!("{v} out of range"));
        }
        if f("exclusiveMinimum").is_some_and(|m| x <= m) || f("exclusiveMaximum").is_some_and(|m| x >= m) {
            return Err(format!("{v} out of exclusive range"));
        }
    }
    if let Some(st) = v.as_str() {
        let n = st.chars().count() as u64;
        if o.get("minLength").and_then(|m| m.as_u64()).is_some_and(|m| n < m) || o.get("maxLength").and_then(|m| m.as_u64()).is_some_and(|m| n > m) {
            return Err(format!("{st:?} has the wrong length"));
        }
        if let Some(p) = o.get("pattern").and_then(|p| p.as_str()) {
            let re = regex::Regex::new(&p.replace("\\d", "[0-9]")).map_err(|e| e.to_string())?;
            if !re.is_match(st) {
                return Err(format!("{st:?} does not match {p}"));
            }
        }
        if o.get("format").and_then(|f| f.as_str()) == Some("email") {
            let re = regex::Regex::new(r"^[^@\s]+@[^@\s]+\.[^@\s]+$").map_err(|e| e.to_string())?;
            if !re.is_match(st) {
                return Err(format!("{st:?} is not an email"));
            }
        }
    }
    if let Some(a) = v.as_array() {
        let n = a.len() as u64;
        if o.get("minItems").and_then(|m| m.as_u64()).is_some_and(|m| n < m) || o.get("maxItems").and_then(|m| m.as_u64()).is_some_and(|m| n > m) {
            return Err(format!("array of {n} items"));
        }
        if let Some(items) = o.get("items") {
            for x in a {
                valid(root, items, x)?;
            }
        }
    }
    if let Some(m) = v.as_object() {
        let props = o.get("properties").and_then(|p| p.as_object());
        for r in o.get("required").and_then(|r| r.as_array()).into_iter().flatten() {
            if !m.contains_key(r.as_str().unwrap_or("")) {
                return Err(format!("missing {r}"));
            }
        }
        for (k, x) in m {
            match props.and_then(|p| p.get(k)) {
                Some(ps) => valid(root, ps, x)?,
                None => match o.get("additionalProperties") {
                    Some(Value::Bool(false)) => return Err(format!("extra property {k}")),
                    Some(ap) => valid(root, ap, x)?,
                    None => {}
                },
            }
        }
    }
    Ok(())
}


/// A few random edits of `v` (each a whole new document): a value replaced somewhere, an
/// object key removed or added, an array item removed or duplicated, an object's keys
/// reversed. Many are still valid, many not.
pub fn mutations(v: &Value, rng: &mut StdRng, n: usize) -> Vec<Value> {
    (0..n).map(|_| mutate(v, rng)).collect()
}

fn replacement(rng: &mut StdRng) -> Value {
    let pool = [
        json!(null), json!(true), json!(0), json!(1), json!(-7), json!(3.5), json!(101), json!(1e6), json!(""), json!("x"),
        json!("Ann Lee"), json!("a@b.co"), json!("ord-1234"), json!("Mage"), json!("rogue"), json!("Passive"),
        json!("a very long string that goes well past the usual small bounds of the schemas here"),
        json!([]), json!(["a"]), json!({}), json!({"Bonus": 3}), json!({"Spell": {"name": "x", "cost": 3}}),
    ];
    pool[rng.random_range(0..pool.len())].clone()
}

fn mutate(v: &Value, rng: &mut StdRng) -> Value {
    // Pick a node by walking down at random (as a JSON pointer), then edit it.
    let mut out = v.clone();
    let mut ptr = String::new();
    let mut node = v;
    while rng.random::<f32>() < 0.6 {
        match node {
            Value::Object(m) if !m.is_empty() => {
                let (k, x) = m.iter().nth(rng.random_range(0..m.len())).expect("index in range");
                ptr = format!("{ptr}/{}", k.replace('~', "~0").replace('/', "~1"));
                node = x;
            }
            Value::Array(a) if !a.is_empty() => {
                let i = rng.random_range(0..a.len());
                ptr = format!("{ptr}/{i}");
                node = &a[i];
            }
            _ => break,
        }
    }
    let cur = out.pointer_mut(&ptr).expect("the pointer was built from the document");
    match cur {
        Value::Object(m) if !m.is_empty() => match rng.random_range(0..3) {
            0 => {
                let k = m.keys().nth(rng.random_range(0..m.len())).cloned().unwrap_or_default();
                m.remove(&k);
            }
            1 => {
                m.insert("extra".into(), replacement(rng));
            }
            _ => {
                let reversed: serde_json::Map<String, Value> = std::mem::take(m).into_iter().rev().collect();
                *m = reversed;
            }
        },
        Value::Array(a) if !a.is_empty() && rng.random::<bool>() => {
            if rng.random::<bool>() {
                a.pop();
            } else {
                let x = a[0].clone();
                a.push(x);
            }
        }
        other => *other = replacement(rng),
    }
    out
}
