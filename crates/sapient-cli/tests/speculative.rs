//! `sapient generate --draft / --lookup` on SmolLM2: the printed answer is plain greedy
//! decoding's, the stats line reports the speculation, and bad combinations are refused.

use std::process::Command;

fn run(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sapient")).args(args).env("RUST_BACKTRACE", "0").output().expect("run sapient")
}

const PROMPT: &str = "Repeat this list exactly, then add one more fruit: apple, banana, cherry, date, elderberry, fig, grape.";

#[test]
fn draft_and_lookup_print_the_plain_answer() {
    let plain = run(&["generate", PROMPT, "-n", "48"]);
    assert!(plain.status.success(), "{}", String::from_utf8_lossy(&plain.stderr));
    assert!(plain.stdout.len() > 20, "{}", String::from_utf8_lossy(&plain.stdout));
    for extra in [&["--lookup"][..], &["--draft", "smollm2-135m-instruct", "--spec-k", "4"], &["--draft", "smollm2-135m-instruct", "--draft-vocab", "3000"], &["--draft", "smollm2-135m-instruct", "--draft-vocab", "0"]] {
        let mut args = vec!["generate", PROMPT, "-n", "48", "--stats"];
        args.extend_from_slice(extra);
        let out = run(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{extra:?}: {err}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&plain.stdout), "{extra:?}");
        let line = err.lines().find(|l| l.starts_with("[speculative:")).unwrap_or_else(|| panic!("{extra:?}: no stats line in {err}"));
        assert!(!line.contains(" 0 of "), "{extra:?}: proposals were made: {line}");
    }
    // --draft-vocab needs --draft; --draft and --lookup exclude each other.
    assert!(!run(&["generate", PROMPT, "--draft-vocab", "10"]).status.success());
    assert!(!run(&["generate", PROMPT, "--lookup", "--draft", "smollm2-135m-instruct"]).status.success());
    // An unknown draft model is an error that names it.
    let out = run(&["generate", PROMPT, "--draft", "no-such-draft"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no-such-draft"), "{}", String::from_utf8_lossy(&out.stderr));
}
