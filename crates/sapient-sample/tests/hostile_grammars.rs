//! Hostile constraints: deeply nested JSON Schemas, huge regexes, regexes whose DFA explodes,
//! huge repetition bounds. Each compiles or fails with a `GrammarError` naming the limit,
//! bounded by a count (nesting levels, pattern bytes, DFA states, NFA bytes), not by time.

use sapient_sample::{Grammar, GrammarError, MAX_PATTERN_BYTES, MAX_REGEX_STATES, MAX_SCHEMA_DEPTH};
use serde_json::json;
use std::time::Duration;

#[test]
fn deep_schemas_are_refused() {
    let mut s = json!({"type": "integer"});
    for _ in 0..1000 {
        s = json!({"type": "array", "items": s});
    }
    let e = Grammar::json_schema(&s).unwrap_err();
    assert_eq!(e, GrammarError::TooLarge { what: format!("schema nesting at #{}", "/items".repeat(MAX_SCHEMA_DEPTH)), limit: MAX_SCHEMA_DEPTH });
    // Nesting under the limit compiles.
    let mut s = json!({"type": "integer"});
    for _ in 0..32 {
        s = json!({"type": "object", "properties": {"a": s}, "required": ["a"]});
    }
    let g = Grammar::json_schema(&s).unwrap();
    let doc = format!("{}1{}", r#"{"a":"#.repeat(32), "}".repeat(32));
    assert!(sapient_sample::Constraint::matches(&g, doc.as_bytes()).unwrap());
}

#[test]
fn huge_regexes_are_refused() {
    let p = "a".repeat(MAX_PATTERN_BYTES + 1);
    let e = Grammar::regex(&p).unwrap_err();
    assert!(e.to_string().contains(&format!("a regex of {} bytes is over the limit of {MAX_PATTERN_BYTES}", p.len())), "{e}");
    let e = Grammar::json_schema(&json!({"type": "string", "pattern": p})).unwrap_err();
    assert!(matches!(e, GrammarError::TooLarge { .. }), "{e}");
}

#[test]
fn exploding_dfas_are_refused() {
    // Exponential DFA blow-up: the 25th byte from the end is an 'a' (2^25 states). The
    // determinizer stops at the state limit (the unit test in dfa.rs checks that limit
    // state by state on smaller ones).
    let p = "[ab]*a[ab]{24}";
    let e = Grammar::regex(p).unwrap_err();
    assert_eq!(e, GrammarError::RegexTooLarge { pattern: p.into(), states: MAX_REGEX_STATES });
    let e = Grammar::json_schema(&json!({"type": "string", "pattern": p})).unwrap_err();
    assert!(matches!(e, GrammarError::RegexTooLarge { states: MAX_REGEX_STATES, .. }), "{e}");
}

#[test]
fn nested_counted_repetition_is_refused() {
    // 10^8 copies of `a`: the NFA alone is over its size bound.
    let e = Grammar::regex("(((a{100}){100}){100}){100}").unwrap_err();
    assert!(matches!(&e, GrammarError::InvalidRegex { message, .. } if message.contains("during NFA compilation exceeded limit")), "{e}");
}

#[test]
fn huge_repetition_bounds_compile_without_unrolling() {
    let s = json!({"type": "array", "items": {"type": "integer"}, "minItems": 0, "maxItems": 4294967295u64});
    let g = Grammar::json_schema(&s).unwrap();
    assert!(sapient_sample::Constraint::matches(&g, b"[1,2,3]").unwrap());
}

#[test]
fn huge_length_bounds() {
    let s = json!({"type": "string", "minLength": 1000000000, "maxLength": 1000000001});
    let e = Grammar::json_schema(&s).unwrap_err();
    assert!(matches!(&e, GrammarError::InvalidRegex { message, .. } if message.contains("during NFA compilation exceeded limit")), "{e}");
}

#[path = "../../sapient-tensor/tests/support/hostile.rs"]
mod support;

/// Mutated regexes and JSON Schemas through the compiler, then a few bytes through the
/// compiled grammar (the `grammar` fuzz target runs the same for longer).
#[test]
fn mutated_constraints_never_panic() {
    let seeds: Vec<Vec<u8>> = [
        "\u{0}[a-z]{2,5}(-[0-9]+)?\u{0}abc-12",
        "\u{0}(foo|bar)*baz\\d{3}\u{0}foobarbaz123",
        "\u{1}{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":8},\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\"]},\"maxItems\":3}},\"required\":[\"name\"]}\u{0}{\"name\":\"x\",\"age\":3}",
        "\u{1}{\"anyOf\":[{\"type\":\"number\",\"exclusiveMinimum\":1.5},{\"$ref\":\"#/$defs/d\"}],\"$defs\":{\"d\":{\"type\":\"string\",\"format\":\"date\"}}}\u{0}\"2024-01-02\"",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    let (ran, ok) = support::mutation_run("grammar", &seeds, 20_000, Duration::from_secs(3), |d| {
        let Some((&mode, rest)) = d.split_first() else { return false };
        let (spec, input) = match rest.iter().position(|&b| b == 0) {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, &[][..]),
        };
        let Ok(spec) = std::str::from_utf8(spec) else { return false };
        let g = if mode % 2 == 0 {
            Grammar::regex(spec)
        } else {
            match serde_json::from_str::<serde_json::Value>(spec) {
                Ok(s) => Grammar::json_schema(&s),
                Err(_) => return false,
            }
        };
        let Ok(g) = g else { return false };
        let _ = sapient_sample::Constraint::matches(&g, input);
        true
    });
    assert!(ran >= 300 && ok > ran / 50, "{ok} of {ran} compiled");
}
