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
    // Absent additionalProperties: any further property, after the listed ones.
    assert!(ok(&g, &json!({"name": "A", "age": 1, "extra": {"any": [1, "x"]}})), "additional properties");
    assert!(!g.0.matches(br#"{"name":"A","age":1,"extra":1,"name":"B"}"#).unwrap(), "a listed key again");
    // Strict mode (OpenAI's): none.
    let strict = Grammar::with_options(&crate::Expr::JsonSchema(s.clone()), crate::JsonOptions::default().strict()).unwrap();
    assert!(!strict.matches(br#"{"name":"A","age":1,"extra":1}"#).unwrap());
    assert!(strict.matches(br#"{"name":"A","age":1}"#).unwrap());
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
        (json!({"not": {"pattern": "a"}}), "unsupported"),
        (json!({"type": "string", "pattern": "(?=a)b"}), "unsupported"),
        (json!({"type": "number", "multipleOf": 0.01}), "unsupported"),
        (json!({"type": "integer", "multipleOf": 3, "minimum": 1, "maximum": 2}), "unsat"),
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


#[test]
fn numbers_as_the_model_writes_them() {
    let g = gs(&json!({"type": "object", "properties": {"price": {"type": "number"}, "qty": {"type": "number"}}, "required": ["price", "qty"]})).unwrap();
    for doc in [r#"{"price":2.0,"qty":10.0}"#, r#"{"price":19.90,"qty":1.50}"#, r#"{"price":1e-7,"qty":-0.0}"#, r#"{"price":-0,"qty":3E+2}"#] {
        assert!(g.0.matches(doc.as_bytes()).unwrap(), "{doc}");
    }
    // Ranged numbers keep every written form of an in-range value, and no other value.
    let g = gs(&json!({"type": "number", "minimum": 0, "maximum": 100, "exclusiveMaximum": 100})).unwrap();
    for (doc, want) in [("99.990", true), ("1e2", false), ("99.9999999999", true), ("100.0", false), ("-0.0", true), ("0.5e1", true)] {
        assert_eq!(g.0.matches(doc.as_bytes()).unwrap(), want, "{doc}");
    }
    // Integers: `4.0` is one from draft 6 on, not in draft 4.
    let g = gs(&json!({"type": "integer", "maximum": 5})).unwrap();
    assert!(g.0.matches(b"4.0").unwrap() && g.0.matches(b"-0").unwrap() && !g.0.matches(b"4.5").unwrap() && !g.0.matches(b"6.0").unwrap());
    let g = gs(&json!({"$schema": "http://json-schema.org/draft-04/schema#", "type": "integer"})).unwrap();
    assert!(g.0.matches(b"4").unwrap() && !g.0.matches(b"4.0").unwrap());
}

#[test]
fn free_form_objects_carry_data() {
    let g = gs(&json!({"type": "object", "properties": {"kwargs": {"type": "object"}, "metadata": {"type": "object"}}, "required": ["kwargs"]})).unwrap();
    assert!(ok(&g, &json!({"kwargs": {"a": 1, "b": [true, {"c": null}]}, "metadata": {"k": "v"}})));
    assert!(ok(&g, &json!({"kwargs": {}})));
    // Strict mode closes objects that list properties, never free-form ones.
    let strict = Grammar::with_options(&crate::Expr::JsonSchema(json!({"type": "object", "properties": {"kwargs": {"type": "object"}}})), crate::JsonOptions::default().strict()).unwrap();
    assert!(strict.matches(br#"{"kwargs":{"a":1}}"#).unwrap() && !strict.matches(br#"{"kwargs":{},"x":1}"#).unwrap());
}

#[test]
fn negation_conditions_and_dependencies() {
    let g = gs(&json!({"type": "string", "not": {"enum": ["admin", "root"]}})).unwrap();
    assert!(ok(&g, &json!("alice")) && ok(&g, &json!("admins")) && !ok(&g, &json!("admin")) && !ok(&g, &json!("root")));
    let g = gs(&json!({"not": {"type": ["string", "object"]}})).unwrap();
    assert!(ok(&g, &json!(1)) && ok(&g, &json!([1])) && !ok(&g, &json!("x")) && !ok(&g, &json!({})));
    let g = gs(&json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "not": {"required": ["a", "b"]}})).unwrap();
    assert!(ok(&g, &json!({"a": 1})) && ok(&g, &json!({"b": 1})) && !ok(&g, &json!({"a": 1, "b": 2})));
    let g = gs(&json!({
        "type": "object",
        "properties": {"kind": {"enum": ["int", "text"]}, "value": {}},
        "required": ["kind", "value"],
        "if": {"properties": {"kind": {"const": "int"}}},
        "then": {"properties": {"value": {"type": "integer"}}},
        "else": {"properties": {"value": {"type": "string"}}}
    }))
    .unwrap();
    assert!(ok(&g, &json!({"kind": "int", "value": 3})) && ok(&g, &json!({"kind": "text", "value": "x"})));
    assert!(!ok(&g, &json!({"kind": "int", "value": "3"})) && !ok(&g, &json!({"kind": "text", "value": 3})));
    let g = gs(&json!({"type": "object", "properties": {"card": {"type": "string"}, "cvv": {"type": "string"}}, "dependentRequired": {"card": ["cvv"]}})).unwrap();
    assert!(ok(&g, &json!({"card": "1", "cvv": "2"})) && ok(&g, &json!({"cvv": "2"})) && !ok(&g, &json!({"card": "1"})));
}

#[test]
fn pattern_properties_names_and_lengths() {
    let g = gs(&json!({"type": "object", "patternProperties": {"^x-": {"type": "string"}, "^n_": {"type": "integer"}}, "additionalProperties": {"type": "boolean"}})).unwrap();
    assert!(ok(&g, &json!({"x-a": "s", "n_b": 1, "other": true})));
    assert!(!ok(&g, &json!({"x-a": 1})) && !ok(&g, &json!({"n_b": "s"})) && !ok(&g, &json!({"other": 1})));
    let g = gs(&json!({"type": "object", "propertyNames": {"pattern": "^[a-z]+$", "maxLength": 4}})).unwrap();
    assert!(ok(&g, &json!({"abc": 1, "wxyz": [2]})) && !ok(&g, &json!({"ABC": 1})) && !ok(&g, &json!({"abcde": 1})));
    // A pattern and length bounds together, and ECMA 262 escapes.
    let g = gs(&json!({"type": "string", "pattern": "^\\w+@\\d+$", "minLength": 4, "maxLength": 6})).unwrap();
    assert!(ok(&g, &json!("ab@12")) && !ok(&g, &json!("a@1")) && !ok(&g, &json!("abcd@12")) && !ok(&g, &json!("ab@1x")));
    let g = gs(&json!({"type": "string", "pattern": "^[\\x41-\\x43\\/]+$"})).unwrap();
    assert!(ok(&g, &json!("AB/C")) && !ok(&g, &json!("AD")));
    // Unknown formats are annotations; uniqueItems is accepted (not enforced).
    assert!(ok(&gs(&json!({"type": "string", "format": "int32"})).unwrap(), &json!("anything")));
    assert!(ok(&gs(&json!({"type": "array", "uniqueItems": true})).unwrap(), &json!([1, 2])));
}

/// A length-bounded string's automaton, with transitions computed from the item's, is the
/// regex compiler's automaton of the same pattern: state by state, and on strings of
/// escapes, multi-byte characters, surrogate pairs, quotes and control bytes around the
/// bounds.
#[test]
fn bounded_strings_built_directly_match_the_regex() {
    use crate::dfa::DfaTable;
    let item = crate::dfa::compiled(&super::string::json_char(), false).unwrap();
    let pieces: [&[u8]; 12] = [b"a", b" ", "é".as_bytes(), "日".as_bytes(), "😀".as_bytes(), br#"\n"#, br#"\""#, br"\u0041", br"\uD83D\uDE00", br"\uD83D", b"\"", b"\x01"];
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for (lo, hi) in [(0, Some(0)), (0, Some(3)), (2, Some(5)), (3, None), (0, None), (4, Some(4))] {
        let rep = match hi {
            Some(h) => format!("{{{lo},{h}}}"),
            None => format!("{{{lo},}}"),
        };
        let pattern = format!("\"{}{rep}\"", super::string::json_char());
        let by_regex = DfaTable::new(&pattern, &|_| false).unwrap();
        let direct = DfaTable::quoted_repeat(&item, lo, hi, &pattern).unwrap().expect("one JSON character is an item");
        // Every state pair reached from both starts: the same bytes lead on, the same
        // points accept, and a state goes on exactly when some byte leads on.
        let mut pairs = std::collections::HashSet::new();
        let mut todo = vec![(direct.start, by_regex.start)];
        while let Some((d, r)) = todo.pop() {
            if !pairs.insert((d, r)) {
                continue;
            }
            assert_eq!(direct.accepting[d as usize], by_regex.accepting[r as usize], "{lo}..{hi:?}: state {d}");
            let mut goes_on = false;
            for b in 0..=255u8 {
                let (nd, nr) = (direct.next(d, b), by_regex.next(r, b));
                assert_eq!(nd == crate::dfa::DEAD, nr == crate::dfa::DEAD, "{lo}..{hi:?}: state {d} byte {b}");
                if nd != crate::dfa::DEAD {
                    goes_on = true;
                    todo.push((nd, nr));
                }
            }
            assert_eq!(direct.can_consume[d as usize], goes_on, "{lo}..{hi:?}: state {d}");
        }
        let mut seen = [0usize; 2];
        for _ in 0..3000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let mut text = b"\"".to_vec();
            for k in 0..seed % 9 {
                text.extend_from_slice(pieces[((seed >> (4 * k + 8)) % 12) as usize]);
            }
            if seed >> 60 != 0 {
                text.push(b'"');
            }
            let m = by_regex.matches(&text);
            assert_eq!(direct.matches(&text), m, "{lo}..{hi:?} on {:?}", String::from_utf8_lossy(&text));
            seen[usize::from(m)] += 1;
        }
        assert!(seen[0] > 20 && seen[1] > 20, "{lo}..{hi:?}: accepted / rejected {seen:?}");
    }
}

/// `if`s on one property's value (a discriminator) in an `allOf` mean what they say: the
/// value's `then` applies, and with the property absent every `then` whose `if` does not
/// require it.
#[test]
fn discriminating_ifs() {
    let s = json!({"type": "object", "properties": {"kind": {"enum": ["a", "b", "c", "d"]}, "x": {}, "y": {}}, "allOf": [
        {"if": {"properties": {"kind": {"const": "a"}}}, "then": {"required": ["x"]}},
        {"if": {"properties": {"kind": {"const": "b"}}}, "then": {"required": ["y"]}},
        {"if": {"properties": {"kind": {"const": "c"}}, "required": ["kind"]}, "then": {"properties": {"x": {"type": "integer"}}}},
        {"if": {"properties": {"kind": {"const": "d"}}, "required": ["kind"]}, "then": {"properties": {"y": {"type": "string"}}}},
    ]});
    let g = gs(&s).unwrap();
    for (doc, valid) in [
        (json!({"kind": "a", "x": 1}), true),
        (json!({"kind": "a"}), false),
        (json!({"kind": "b", "y": 1}), true),
        (json!({"kind": "b", "x": 1}), false),
        (json!({"kind": "c", "x": 1}), true),
        (json!({"kind": "c", "x": "s"}), false),
        (json!({"kind": "d", "y": "s"}), true),
        (json!({"kind": "d", "y": 1}), false),
        (json!({"x": "s", "y": 2}), true),
        (json!({"x": 1}), false),
        (json!({"kind": "e", "x": 1, "y": 1}), false),
    ] {
        assert_eq!(ok(&g, &doc), valid, "{doc}");
        assert_eq!(crate::validate::validate(&s, &doc).unwrap().is_ok(), valid, "validator on {doc}");
    }
}

#[test]
fn all_of_branches_differing_only_in_unread_keywords_merge() {
    // As SchemaStore's schemas write them: each branch with its own editor hints.
    let s = json!({"allOf": [
        {"type": "object", "properties": {"a": {"type": "integer"}}, "markdownDescription": "one", "x-taplo": {"hidden": true}, "id": "first"},
        {"properties": {"b": {"type": "string", "maxLength": 3}}, "required": ["a"], "markdownDescription": "two", "x-taplo": {"hidden": false}, "id": "second"}
    ]});
    let g = gs(&s).unwrap();
    assert!(ok(&g, &json!({"a": 1, "b": "xyz"})));
    assert!(!ok(&g, &json!({"b": "xyz"})));
    assert!(!ok(&g, &json!({"a": 1, "b": "long"})));
    // A keyword the compiler reads still has to agree.
    let e = gs(&json!({"allOf": [{"format": "date"}, {"format": "email"}]}));
    assert!(matches!(e, Err(GrammarError::UnsupportedSchema { .. })), "{:?}", e.err());
}

#[test]
fn all_of_with_listed_values_keeps_the_values_every_branch_accepts() {
    // As Azure Pipelines' schema narrows a task name: a long anyOf of enums, then a pattern.
    let names: Vec<serde_json::Value> = (0..40).map(|i| json!({"description": format!("task {i}"), "ignoreCase": "value", "enum": [format!("Task{i}@1")]})).collect();
    let s = json!({"allOf": [{"anyOf": names}, {"pattern": "^Task3[0-9]?@1$"}]});
    let g = gs(&s).unwrap();
    for (doc, valid) in [(json!("Task3@1"), true), (json!("Task35@1"), true), (json!("Task2@1"), false), (json!("Task3@2"), false), (json!(3), false)] {
        assert_eq!(ok(&g, &doc), valid, "{doc}");
        assert_eq!(crate::validate::validate(&s, &doc).unwrap().is_ok(), valid, "validator on {doc}");
    }
    // Values the listing branch itself limits further, a `$ref`ed listing, keywords beside
    // `allOf`, and no value left.
    let s = json!({
        "$defs": {"sizes": {"enum": ["s", "m", "xl", 7]}},
        "allOf": [{"$ref": "#/$defs/sizes"}, {"anyOf": [{"type": "string", "maxLength": 1}, {"type": "integer"}]}],
        "not": {"const": 7}
    });
    let g = gs(&s).unwrap();
    for (doc, valid) in [(json!("s"), true), (json!("m"), true), (json!("xl"), false), (json!(7), false)] {
        assert_eq!(ok(&g, &doc), valid, "{doc}");
    }
    let e = gs(&json!({"allOf": [{"enum": ["a", "b"]}, {"minLength": 2}]}));
    assert!(matches!(e, Err(GrammarError::Unsatisfiable(_))), "{:?}", e.err());
}

#[test]
fn branches_sharing_their_siblings_keywords_are_each_exact() {
    // Every branch of the anyOf carries the same sibling properties (compiled once and
    // shared), in its own order, with its own recursion.
    let s = json!({
        "$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"}, "next": {"$ref": "#/$defs/node"}}, "required": ["v"]}},
        "type": "object",
        "properties": {"id": {"type": "integer", "minimum": 0}, "tree": {"$ref": "#/$defs/node"}, "note": {"type": "string", "maxLength": 4}},
        "required": ["id"],
        "doNotSuggest": true,
        "anyOf": [
            {"properties": {"kind": {"const": "a"}, "note": {"pattern": "^a"}}, "required": ["kind"]},
            {"properties": {"kind": {"const": "b"}, "tree": {"required": ["next"]}}, "required": ["kind"]},
            {"properties": {"kind": {"const": "c"}}, "required": ["kind"]}
        ]
    });
    let g = gs(&s).unwrap();
    for (doc, valid) in [
        (json!({"id": 1, "kind": "a"}), true),
        (json!({"id": 1, "note": "ab", "kind": "a"}), true),
        (json!({"id": 1, "note": "ba", "kind": "a"}), false),
        (json!({"id": 1, "note": "ba", "kind": "c"}), true),
        (json!({"id": 1, "note": "abcde", "kind": "c"}), false),
        (json!({"id": -1, "kind": "c"}), false),
        (json!({"id": 1, "tree": {"v": 1, "next": {"v": 2}}, "kind": "b"}), true),
        (json!({"id": 1, "tree": {"v": 1}, "kind": "b"}), false),
        (json!({"id": 1, "tree": {"v": 1}, "kind": "c"}), true),
        (json!({"id": 1, "kind": "d"}), false),
    ] {
        assert_eq!(ok(&g, &doc), valid, "{doc}");
        assert_eq!(crate::validate::validate(&s, &doc).unwrap().is_ok(), valid, "validator on {doc}");
    }
}

#[test]
fn unknown_keywords_are_ignored_everywhere() {
    // Editor hints and extensions constrain nothing, in property names too.
    let s = json!({"type": "object", "propertyNames": {"pattern": "^[a-z]+$", "x-hint": "lower case", "markdownDescription": "names"}, "additionalProperties": {"type": "integer", "x-order": 2}});
    let g = gs(&s).unwrap();
    assert!(ok(&g, &json!({"ab": 1})));
    assert!(!ok(&g, &json!({"Ab": 1})));
    assert!(!ok(&g, &json!({"ab": "x"})));
}
