//! 100 random documents per schema: tokens are drawn uniformly from each step's mask (an
//! adversarial "model" that explores every corner of the grammar) until end-of-sequence,
//! then the text is parsed by serde_json and checked by an independent JSON Schema
//! validator written here (the `regex` crate for patterns). Also checks that every step's
//! mask equals a brute-force check of every token.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sapient_sample::{Constraint, Grammar, Matcher, TokenIndex};
use serde_json::{json, Value};
use std::sync::Arc;

mod common;
use common::{mutations, valid};

/// End-of-sequence is id 0; then printable ASCII bytes, a newline, some UTF-8 and some
/// multi-byte tokens like a BPE vocabulary has.
fn vocab() -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = vec![b"</s>".to_vec()];
    v.extend((0x20u8..0x7F).map(|b| vec![b]));
    for t in [
        "\n", "é", "日本", "{\"", "\":", "\": ", "\", \"", "\"}", "\"]", "true", "false", "null", "12", "0.", "-1", "\n  ",
        "\\n", "\\u00e9", "\\\"", "ab", "ing", " the", ".com", "@", "1e", "E+", ",\n", "  ", "[]", "{}", "name", "age",
    ] {
        v.push(t.as_bytes().to_vec());
    }
    v
}

fn schemas() -> Vec<(&'static str, Value)> {
    vec![
        ("character", json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "pattern": "^[A-Z][a-z]{1,10} [A-Z][a-z]{1,10}$"},
                "age": {"type": "integer", "minimum": 1, "maximum": 100},
                "description": {"type": "string", "maxLength": 40}
            },
            "required": ["name", "age", "description"]
        })),
        ("order", json!({
            "type": "object",
            "properties": {
                "id": {"type": "string", "pattern": "^ord-\\d{4}$"},
                "email": {"type": "string", "format": "email"},
                "items": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
                    "type": "object",
                    "properties": {"sku": {"type": "string", "minLength": 2, "maxLength": 6}, "qty": {"type": "integer", "minimum": 1, "maximum": 50}, "price": {"type": "number", "minimum": 0, "maximum": 1000}},
                    "required": ["sku", "qty"]
                }},
                "status": {"enum": ["pending", "paid", "shipped"]},
                "gift": {"type": "boolean"},
                "notes": {"type": ["string", "null"], "maxLength": 20}
            },
            "required": ["id", "items", "status"]
        })),
        ("tree", json!({
            "$defs": {"node": {"type": "object", "properties": {
                "label": {"type": "string", "maxLength": 8},
                "children": {"type": "array", "maxItems": 2, "items": {"$ref": "#/$defs/node"}}
            }, "required": ["label"]}},
            "$ref": "#/$defs/node"
        })),
        ("event", json!({
            "type": "object",
            "properties": {
                "kind": {"const": "click"},
                "target": {"anyOf": [{"type": "string", "maxLength": 10}, {"type": "integer", "minimum": 0}]},
                "meta": {"type": ["object", "null"], "additionalProperties": {"type": "number"}}
            },
            "required": ["kind", "target"]
        })),
        ("geo", json!({
            "type": "object",
            "properties": {
                "lat": {"type": "number", "minimum": -90, "maximum": 90},
                "lon": {"type": "number", "exclusiveMinimum": -180, "exclusiveMaximum": 180},
                "count": {"type": "integer", "minimum": -5, "maximum": 10},
                "ratio": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
                "tags": {"type": "array", "items": {"enum": ["a", "b", 3, null, true]}, "maxItems": 4}
            },
            "required": ["lat", "lon", "count", "ratio"]
        })),
    ]
}

#[test]
fn hundred_random_documents_per_schema_validate() {
    let toks = vocab();
    let index = Arc::new(TokenIndex::new(toks.clone(), &[0], &[]));
    let mut rng = StdRng::seed_from_u64(2026);
    for (name, schema) in schemas() {
        let g = Arc::new(Grammar::json_schema(&schema).unwrap_or_else(|e| panic!("{name}: {e}")));
        let mut lengths = Vec::new();
        let mut agree = [0usize; 2];
        for i in 0..100 {
            let mut m = Matcher::new(g.clone(), index.clone());
            let mut text = Vec::new();
            for step in 0.. {
                assert!(step < 5000, "{name} #{i}: no end after 5000 tokens: {}", String::from_utf8_lossy(&text));
                let mask = m.mask().unwrap_or_else(|e| panic!("{name} #{i}: {e} after {:?}", String::from_utf8_lossy(&text)));
                let allowed: Vec<u32> = mask.iter().filter(|&t| t != 0).collect();
                // Every allowed token really continues the text; EOS only when complete.
                if step % 7 == 0 {
                    for (t, b) in toks.iter().enumerate().skip(1) {
                        let ok = g.advance_bytes(m.state(), b).unwrap().is_some();
                        assert_eq!(mask.is_allowed(t as u32), ok, "{name}: token {:?} after {:?}", String::from_utf8_lossy(b), String::from_utf8_lossy(&text));
                    }
                    assert_eq!(mask.is_allowed(0), g.is_accepting(m.state()));
                }
                let t = if allowed.is_empty() || (mask.is_allowed(0) && rng.random::<f32>() < 0.5) {
                    0
                } else {
                    allowed[rng.random_range(0..allowed.len())]
                };
                m.consume(t).unwrap();
                if t == 0 {
                    break;
                }
                text.extend_from_slice(&toks[t as usize]);
            }
            let s = String::from_utf8(text).unwrap_or_else(|e| panic!("{name} #{i}: not UTF-8: {e}"));
            let v: Value = serde_json::from_str(&s).unwrap_or_else(|e| panic!("{name} #{i}: {e}: {s}"));
            if let Err(e) = valid(&schema, &schema, &v) {
                panic!("{name} #{i}: {e}: {s}");
            }
            lengths.push(s.len());
            // The crate's validator (what `Parse::parse` uses) accepts what the grammar writes,
            // and agrees with the independent one on edited copies (keys reordered, removed,
            // added; values replaced).
            assert_eq!(sapient_sample::validate(&schema, &v).unwrap(), Ok(()), "{name} #{i}: {s}");
            for edited in mutations(&v, &mut rng, 5) {
                let ours = sapient_sample::validate(&schema, &edited).unwrap();
                let theirs = valid(&schema, &schema, &edited);
                assert_eq!(ours.is_ok(), theirs.is_ok(), "{name}: {edited}: ours {ours:?}, independent {theirs:?}");
                agree[ours.is_ok() as usize] += 1;
            }
        }
        let mean = lengths.iter().sum::<usize>() as f64 / lengths.len() as f64;
        eprintln!("{name}: 100 documents, mean {mean:.0} bytes; edited copies valid/invalid: {}/{}", agree[1], agree[0]);
        assert!(agree[0] >= 50 && agree[1] >= 50, "{name}: the edits test both answers: {agree:?}");
    }
}

#[test]
fn validator_rejects_what_it_should() {
    // The oracle is not vacuous: invalid documents fail it.
    let (_, s) = &schemas()[1];
    for bad in [
        json!({"id": "ord-12", "items": [{"sku": "ab", "qty": 1}], "status": "paid"}),
        json!({"id": "ord-1234", "items": [], "status": "paid"}),
        json!({"id": "ord-1234", "items": [{"sku": "ab", "qty": 51}], "status": "paid"}),
        json!({"id": "ord-1234", "items": [{"sku": "ab", "qty": 1}], "status": "lost"}),
        json!({"id": "ord-1234", "items": [{"sku": "ab", "qty": 1}], "status": "paid", "email": "x"}),
    ] {
        assert!(valid(s, s, &bad).is_err(), "{bad}");
    }
    assert!(valid(s, s, &json!({"id": "ord-1234", "items": [{"sku": "ab", "qty": 1}], "status": "paid"})).is_ok());
}

#[test]
fn hundred_random_free_json_documents_parse() {
    let toks = vocab();
    let index = Arc::new(TokenIndex::new(toks.clone(), &[0], &[]));
    let g = Arc::new(Grammar::json().unwrap());
    let mut rng = StdRng::seed_from_u64(7);
    let mut kinds = std::collections::BTreeSet::new();
    for i in 0..100 {
        let mut m = Matcher::new(g.clone(), index.clone());
        let mut text = Vec::new();
        loop {
            assert!(text.len() < 20_000, "#{i}: runaway document");
            let mask = m.mask().unwrap();
            let allowed: Vec<u32> = mask.iter().filter(|&t| t != 0).collect();
            let t = if allowed.is_empty() || (mask.is_allowed(0) && rng.random::<f32>() < 0.5) { 0 } else { allowed[rng.random_range(0..allowed.len())] };
            m.consume(t).unwrap();
            if t == 0 {
                break;
            }
            text.extend_from_slice(&toks[t as usize]);
        }
        let s = String::from_utf8(text).unwrap();
        let v: Value = serde_json::from_str(&s).unwrap_or_else(|e| panic!("#{i}: {e}: {s}"));
        kinds.insert(match v {
            Value::Null => "null",
            Value::Bool(_) => "bool",
            Value::Number(_) => "number",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::Object(_) => "object",
        });
    }
    // The walk reaches every kind of value at the top level.
    assert_eq!(kinds.len(), 6, "{kinds:?}");
}

/// How deeply `children` nest in a tree document (a node alone is depth 1).
fn tree_depth(v: &Value) -> usize {
    1 + v.get("children").and_then(Value::as_array).map_or(0, |c| c.iter().map(tree_depth).max().unwrap_or(0))
}

#[test]
fn recursive_refs_nest_at_most_max_ref_depth_levels() {
    use sapient_sample::{Expr, GrammarError, JsonOptions};
    let schema = json!({
        "$defs": {"node": {"type": "object", "properties": {
            "label": {"type": "string", "maxLength": 4},
            "children": {"type": "array", "maxItems": 2, "items": {"$ref": "#/$defs/node"}}
        }, "required": ["label"], "additionalProperties": false}},
        "$ref": "#/$defs/node"
    });
    let opts = JsonOptions { max_ref_depth: 3, ..JsonOptions::default() };
    let g = Arc::new(Grammar::with_options(&Expr::JsonSchema(schema.clone()), opts).unwrap());
    // Three levels are accepted; at the third, `children` may only be empty.
    let three = r#"{"label":"a","children":[{"label":"b","children":[{"label":"c","children":[]}]}]}"#;
    let s = g.advance_bytes(&g.start(), three.as_bytes()).unwrap().expect("three levels are allowed");
    assert!(g.is_accepting(&s));
    let at_bound = r#"{"label":"a","children":[{"label":"b","children":[{"label":"c","children":["#;
    let s = g.advance_bytes(&g.start(), at_bound.as_bytes()).unwrap().expect("an array at the bound");
    assert!(g.advance_bytes(&s, b"{").unwrap().is_none(), "a fourth level is refused");
    assert!(g.advance_bytes(&s, b"]}]}]}").unwrap().is_some_and(|s| g.is_accepting(&s)));
    // The default allows five levels, not six.
    let dflt = Grammar::json_schema(&schema).unwrap();
    let nest = |n: usize| "{\"label\":\"x\",\"children\":[".repeat(n);
    assert!(dflt.advance_bytes(&dflt.start(), nest(4).as_bytes()).unwrap().is_some_and(|s| dflt.advance_bytes(&s, b"{").unwrap().is_some()));
    assert!(dflt.advance_bytes(&dflt.start(), nest(5).as_bytes()).unwrap().is_some_and(|s| dflt.advance_bytes(&s, b"{").unwrap().is_none()));

    // Random documents (the adversarial walker of the test above) stay valid and stop at the
    // bound, and some reach it.
    let toks = vocab();
    let index = Arc::new(TokenIndex::new(toks.clone(), &[0], &[]));
    let mut rng = StdRng::seed_from_u64(24);
    let mut deepest = 0;
    for i in 0..100 {
        let mut m = Matcher::new(g.clone(), index.clone());
        let mut text = Vec::new();
        loop {
            assert!(text.len() < 20_000, "#{i}: runaway document");
            let mask = m.mask().unwrap();
            let allowed: Vec<u32> = mask.iter().filter(|&t| t != 0).collect();
            assert!(!allowed.is_empty() || mask.is_allowed(0), "#{i}: dead end after {}", String::from_utf8_lossy(&text));
            // Nest eagerly: prefer tokens that open an array or object (and the `children`
            // key's letters), so the walk runs into the bound.
            let opening: Vec<u32> = allowed.iter().copied().filter(|&t| toks[t as usize].iter().any(|b| b"{[c".contains(b))).collect();
            let t = match opening.len() {
                n if n > 0 && rng.random::<f32>() < 0.8 => opening[rng.random_range(0..n)],
                _ if allowed.is_empty() || (mask.is_allowed(0) && rng.random::<f32>() < 0.5) => 0,
                _ => allowed[rng.random_range(0..allowed.len())],
            };
            m.consume(t).unwrap();
            if t == 0 {
                break;
            }
            text.extend_from_slice(&toks[t as usize]);
        }
        let s = String::from_utf8(text).unwrap();
        let v: Value = serde_json::from_str(&s).unwrap_or_else(|e| panic!("#{i}: {e}: {s}"));
        if let Err(e) = valid(&schema, &schema, &v) {
            panic!("#{i}: {e}: {s}");
        }
        assert!(tree_depth(&v) <= 3, "#{i}: nested {} levels: {s}", tree_depth(&v));
        deepest = deepest.max(tree_depth(&v));
    }
    assert_eq!(deepest, 3, "the walk reaches the bound");

    // A recursion that cannot stop is refused, not generated without end.
    let endless = json!({"$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}, "required": ["next"]}}, "$ref": "#/$defs/n"});
    assert!(matches!(Grammar::json_schema(&endless), Err(GrammarError::Unsatisfiable(_))));
    // ... unless a branch ends it.
    let list = json!({"$defs": {"n": {"type": "object", "properties": {"next": {"anyOf": [{"$ref": "#/$defs/n"}, {"type": "null"}]}}, "required": ["next"]}}, "$ref": "#/$defs/n"});
    let g = Grammar::with_options(&Expr::JsonSchema(list), JsonOptions { max_ref_depth: 2, ..JsonOptions::default() }).unwrap();
    assert!(g.advance_bytes(&g.start(), br#"{"next":{"next":null}}"#).unwrap().is_some_and(|s| g.is_accepting(&s)));
    assert!(g.advance_bytes(&g.start(), br#"{"next":{"next":{"#).unwrap().is_none());
    // Limits out of range are clear errors.
    for bad in [JsonOptions { max_ref_depth: 0, ..JsonOptions::default() }, JsonOptions { max_stack_depth: 0, ..JsonOptions::default() }] {
        assert!(matches!(Grammar::with_options(&Expr::JsonSchema(schema.clone()), bad), Err(GrammarError::InvalidOption(_))), "{bad:?}");
    }
}

#[test]
fn stack_depth_is_an_option() {
    use sapient_sample::{Expr, GrammarError, JsonOptions};
    let depth = |d: u32| JsonOptions { max_stack_depth: d, ..JsonOptions::default() };
    // Free JSON nests as deep as the stack allows, and no deeper.
    let g = Grammar::with_options(&Expr::Json, depth(64)).unwrap();
    let mut s = g.start();
    let mut levels = 0;
    while let Some(next) = g.advance_bytes(&s, b"[").unwrap() {
        s = next;
        levels += 1;
        assert!(levels < 1000);
    }
    assert!((10..64).contains(&levels), "{levels} levels in 64 frames");
    let g2 = Grammar::with_options(&Expr::Json, depth(128)).unwrap();
    assert!(g2.advance_bytes(&g2.start(), "[".repeat(levels + 1).as_bytes()).unwrap().is_some());
    // A grammar whose start alone needs a deeper stack is refused, naming the limit.
    let nested = Expr::seq([Expr::seq([Expr::seq([Expr::seq([Expr::literal("a")])])])]);
    assert!(matches!(Grammar::with_options(&nested, depth(2)), Err(GrammarError::TooLarge { limit: 2, .. })));
    assert!(Grammar::with_options(&nested, depth(5)).is_ok());
}
