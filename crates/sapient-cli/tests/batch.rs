//! `sapient generate --batch FILE`: every line answered, in input order, each as it is
//! answered alone; bad files are clear errors.

use std::process::Command;

fn run(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sapient")).args(args).env("RUST_BACKTRACE", "0").output().expect("run sapient")
}

#[test]
fn batch_answers_every_line_in_order() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("prompts.txt");
    let prompts = ["What is the capital of France?", "", "Name three colors.", "What is 12 times 12?"];
    std::fs::write(&file, prompts.join("\n")).expect("write prompts");
    let sys = "You are a helpful assistant.";
    let out = run(&["generate", "--batch", file.to_str().unwrap_or_default(), "--system", sys, "-n", "24", "--stats"]);
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    // Each answer equals the single-prompt answer (greedy), in input order.
    let mut expected = Vec::new();
    for p in prompts.iter().filter(|p| !p.is_empty()) {
        let one = run(&["generate", p, "--system", sys, "-n", "24"]);
        assert!(one.status.success());
        expected.push(String::from_utf8_lossy(&one.stdout).trim_end().to_string());
    }
    assert_eq!(text.trim_end(), expected.join("\n\n"));
    assert!(expected[0].contains("Paris"), "{expected:?}");
    let stats = String::from_utf8_lossy(&out.stderr);
    assert!(stats.contains("3 requests") && stats.contains("tok/s aggregate") && stats.contains("first token after"), "{stats}");

    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, "\n  \n").expect("write");
    let out = run(&["generate", "--batch", empty.to_str().unwrap_or_default()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("has no prompts"));
    let out = run(&["generate", "--batch", "/nonexistent/prompts.txt"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/prompts.txt"));
}
