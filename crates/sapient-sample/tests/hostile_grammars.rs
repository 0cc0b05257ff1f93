//! Hostile constraints: deeply nested JSON Schemas, huge regexes, regexes whose DFA explodes,
//! huge repetition bounds. Each compiles or fails with a `GrammarError` naming the limit,
//! bounded by a count (nesting levels, pattern bytes, DFA states, NFA bytes), not by time.

use sapient_sample::{Constraint, Grammar, GrammarError, MAX_GBNF_RULES, MAX_PATTERN_BYTES, MAX_REGEX_STATES, MAX_SCHEMA_DEPTH};
use std::time::Instant;
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
    // The bounded string's automaton is built directly and stops at the state limit.
    let e = Grammar::json_schema(&s).unwrap_err();
    assert!(matches!(&e, GrammarError::RegexTooLarge { states: MAX_REGEX_STATES, .. }), "{e}");
}

#[path = "../../sapient-tensor/tests/support/hostile.rs"]
mod support;

/// Mutated regexes, JSON Schemas and GBNF grammars through the compiler, then a few bytes through the
/// compiled grammar (the `grammar` fuzz target runs the same for longer).
#[test]
fn mutated_constraints_never_panic() {
    let seeds: Vec<Vec<u8>> = [
        "\u{0}[a-z]{2,5}(-[0-9]+)?\u{0}abc-12",
        "\u{0}(foo|bar)*baz\\d{3}\u{0}foobarbaz123",
        "\u{1}{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":8},\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\"]},\"maxItems\":3}},\"required\":[\"name\"]}\u{0}{\"name\":\"x\",\"age\":3}",
        "\u{1}{\"anyOf\":[{\"type\":\"number\",\"exclusiveMinimum\":1.5},{\"$ref\":\"#/$defs/d\"}],\"$defs\":{\"d\":{\"type\":\"string\",\"format\":\"date\"}}}\u{0}\"2024-01-02\"",
        "\u{2}root ::= expr \"=\" [0-9]+\nexpr ::= term ([-+*/] term)*  # c\nterm ::= [a-z]+ | \"(\" expr \")\" | \"\\x41\"{1,3}\u{0}(a+b)=12",
        "\u{2}root ::= [^\\n\"]* (\"\\\"\" .)? item?\nitem ::= \"- \" [\\u3041-\\u309F]+\u{0}abc- あ",
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
        let g = if mode % 3 == 0 {
            Grammar::regex(spec)
        } else if mode % 3 == 2 {
            Grammar::gbnf(spec)
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

/// GBNF grammars built to cost: the most rules, in a chain (each rule's regex holds the next
/// one's) and in a cycle (grammar nodes); a regex whose DFA explodes and a huge count (both
/// fall back to grammar nodes); too many rules. Each compiles or is refused in bounded time.
#[test]
fn hostile_gbnf_grammars() {
    let n = MAX_GBNF_RULES - 1;
    let chain: String = (0..n).map(|i| if i + 1 < n { format!("r{i} ::= \"a\" r{}? \"b\"\n", i + 1) } else { format!("r{i} ::= \"c\"\n") }).collect();
    let cycle: String = (0..n).map(|i| format!("r{i} ::= \"a\" r{} | \"b\"\n", (i + 1) % n)).collect();
    for (name, body) in [("chain", &chain), ("cycle", &cycle)] {
        let t = Instant::now();
        let g = Grammar::gbnf(&format!("root ::= r0\n{body}")).unwrap_or_else(|e| panic!("{name}: {e}"));
        println!("{name}: {} nodes, compiled in {:?}", g.num_nodes(), t.elapsed());
        assert!(t.elapsed() < Duration::from_secs(20), "{name}: {:?}", t.elapsed());
        // Within the parse stack's depth limit (JsonOptions::max_stack_depth).
        let text = if name == "chain" { format!("{}{}", "a".repeat(300), "b".repeat(300)) } else { format!("{}b", "a".repeat(500)) };
        assert!(g.matches(text.as_bytes()).unwrap(), "{name}");
        assert!(!g.matches(&text.as_bytes()[..text.len() - 1]).unwrap(), "{name}");
    }
    let t = Instant::now();
    let g = Grammar::gbnf("root ::= [ab]* \"a\" [ab]{24} \"-\" \"xy\"{100000}").unwrap();
    assert!(g.matches(format!("bba{}-{}", "b".repeat(24), "xy".repeat(100_000)).as_bytes()).unwrap());
    assert!(!g.matches(format!("bba{}-{}", "b".repeat(23), "xy".repeat(100_000)).as_bytes()).unwrap());
    assert!(!g.matches(format!("bba{}-{}", "b".repeat(24), "xy".repeat(99_999)).as_bytes()).unwrap());
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    let many: String = (0..=MAX_GBNF_RULES).map(|i| format!("r{i} ::= \"x\"\n")).collect();
    assert!(matches!(Grammar::gbnf(&format!("root ::= r0\n{many}")), Err(GrammarError::TooLarge { .. })));
}
