//! Hostile constraints: deeply nested JSON Schemas, huge regexes, regexes whose DFA explodes,
//! huge repetition bounds. Each compiles or fails with a `GrammarError` within a second.

use sapient_sample::{Grammar, GrammarError, MAX_PATTERN_BYTES, MAX_SCHEMA_DEPTH};
use serde_json::json;
use std::time::{Duration, Instant};

fn timed<T>(f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let r = f();
    assert!(t.elapsed() < Duration::from_secs(1), "took {:?}", t.elapsed());
    r
}

#[test]
fn deep_schemas_are_refused() {
    let mut s = json!({"type": "integer"});
    for _ in 0..1000 {
        s = json!({"type": "array", "items": s});
    }
    let e = timed(|| Grammar::json_schema(&s)).unwrap_err();
    assert_eq!(e, GrammarError::TooLarge { what: format!("schema nesting at #{}", "/items".repeat(MAX_SCHEMA_DEPTH)), limit: MAX_SCHEMA_DEPTH });
    // Nesting under the limit compiles.
    let mut s = json!({"type": "integer"});
    for _ in 0..32 {
        s = json!({"type": "object", "properties": {"a": s}, "required": ["a"]});
    }
    let g = timed(|| Grammar::json_schema(&s)).unwrap();
    let doc = format!("{}1{}", r#"{"a":"#.repeat(32), "}".repeat(32));
    assert!(sapient_sample::Constraint::matches(&g, doc.as_bytes()).unwrap());
}

#[test]
fn huge_regexes_are_refused() {
    let p = "a".repeat(MAX_PATTERN_BYTES + 1);
    let e = timed(|| Grammar::regex(&p)).unwrap_err();
    assert!(e.to_string().contains(&format!("a regex of {} bytes is over the limit of {MAX_PATTERN_BYTES}", p.len())), "{e}");
    let e = timed(|| Grammar::json_schema(&json!({"type": "string", "pattern": p}))).unwrap_err();
    assert!(matches!(e, GrammarError::TooLarge { .. }), "{e}");
}

#[test]
fn exploding_dfas_are_refused() {
    // Exponential DFA blow-up: the n-th character from the end is an 'a'.
    let e = timed(|| Grammar::regex("[ab]*a[ab]{24}")).unwrap_err();
    assert!(matches!(e, GrammarError::RegexTooLarge { .. } | GrammarError::InvalidRegex { .. }), "{e}");
}

#[test]
fn nested_counted_repetition_is_refused() {
    let e = timed(|| Grammar::regex("(((a{100}){100}){100}){100}")).unwrap_err();
    assert!(matches!(e, GrammarError::InvalidRegex { .. } | GrammarError::RegexTooLarge { .. }), "{e}");
}

#[test]
fn huge_repetition_bounds_compile_without_unrolling() {
    let s = json!({"type": "array", "items": {"type": "integer"}, "minItems": 0, "maxItems": 4294967295u64});
    let g = timed(|| Grammar::json_schema(&s)).unwrap();
    assert!(sapient_sample::Constraint::matches(&g, b"[1,2,3]").unwrap());
}

#[test]
fn huge_length_bounds() {
    let s = json!({"type": "string", "minLength": 1000000000, "maxLength": 1000000001});
    let _ = timed(|| Grammar::json_schema(&s));
}
