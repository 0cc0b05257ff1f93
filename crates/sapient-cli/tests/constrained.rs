//! `sapient generate --regex / --json-schema / --json / --grammar` on SmolLM2: the printed answer
//! matches the constraint; a bad constraint is refused before any generation.

use std::process::Command;

fn run(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sapient")).args(args).env("RUST_BACKTRACE", "0").output().expect("run sapient")
}

#[test]
fn regex_json_schema_and_errors() {
    let out = run(&["generate", "When did the Berlin Wall fall? Give the date.", "--regex", "(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let parts: Vec<&str> = text.split('-').collect();
    assert!(parts.len() == 3 && parts[0].len() == 4 && parts[1].len() == 2 && parts[2].len() == 2, "{text:?}");
    assert!(parts.iter().all(|p| p.chars().all(|c| c.is_ascii_digit())), "{text:?}");

    let dir = tempfile::tempdir().unwrap();
    let schema = dir.path().join("city.json");
    std::fs::write(
        &schema,
        r#"{"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}, "population": {"type": "integer", "minimum": 0}}, "required": ["city", "population"]}"#,
    )
    .unwrap();
    let out = run(&["generate", "What is the largest city in Japan? Answer in JSON.", "--json-schema", schema.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert!(v["city"].as_str().is_some_and(|c| c.chars().count() <= 30) && v["population"].as_u64().is_some(), "{v}");

    let out = run(&["generate", "List three colours as a JSON array.", "--json", "-n", "300", "--stats"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    if String::from_utf8_lossy(&out.stderr).contains("finish: Eos") {
        serde_json::from_str::<serde_json::Value>(&text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
    } else {
        // Cut by the token limit: still the start of a JSON value.
        assert!(text.starts_with(['{', '[', '"']), "{text:?}");
    }

    let out = run(&["generate", "x", "--regex", "(unclosed"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unclosed group"), "{err}");
    std::fs::write(&schema, r#"{"type": "integer", "minimum": 5, "maximum": 1}"#).unwrap();
    let out = run(&["generate", "x", "--json-schema", schema.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unsatisfiable"), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn gbnf_grammar_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("answer.gbnf");
    // A sentence then a number, as llama.cpp's GBNF.
    std::fs::write(&path, "# the answer in one line\nroot ::= \"The answer is \" num \".\"\nnum ::= [1-9] [0-9]{0,3}\n").unwrap();
    let out = run(&["generate", "What is 12 times 7?", "--grammar", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let num = text.strip_prefix("The answer is ").and_then(|t| t.strip_suffix('.')).unwrap_or_else(|| panic!("{text:?}"));
    assert!((1..=4).contains(&num.len()) && num.chars().all(|c| c.is_ascii_digit()) && !num.starts_with('0'), "{text:?}");

    std::fs::write(&path, "root ::= \"a\" item\nitem ::= [0-9\n").unwrap();
    let out = run(&["generate", "x", "--grammar", path.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 2, column 10") && err.contains("unterminated character class"), "{err}");
}
