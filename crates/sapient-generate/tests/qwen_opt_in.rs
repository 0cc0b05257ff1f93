//! Qwen2.5-Coder-0.5B writes a working Python function (opt-in: SAPIENT_QWEN_TESTS=1; the
//! model is 0.5 GB). The code is run with python3 and checked on inputs.

use anyhow::Result;
use sapient_generate::{GenerationConfig, Message, Pipeline, PipelineOptions};

fn extract_code(text: &str) -> String {
    match text.split("```").nth(1) {
        Some(block) => block.trim_start_matches("python").trim_start_matches('\n').to_string(),
        None => text.to_string(),
    }
}

#[test]
fn qwen_writes_a_correct_python_function() -> Result<()> {
    if std::env::var("SAPIENT_QWEN_TESTS").ok().as_deref() != Some("1") {
        eprintln!("skipped: set SAPIENT_QWEN_TESTS=1 (fetches the 0.5 GB Qwen2.5-Coder-0.5B GGUF)");
        return Ok(());
    }
    let p = Pipeline::load("qwen2.5-coder-0.5b-instruct", PipelineOptions { max_seq_len: Some(1024), ..Default::default() }, |_| {})?;
    let msgs = [Message::user(
        "Write a Python function `is_palindrome(s)` that returns True if the string s reads the same forwards and backwards, ignoring case. Only the code.",
    )];
    let g = p.chat(&msgs, &GenerationConfig::default().max_tokens(200))?;
    eprintln!("{}", g.text);
    let code = extract_code(&g.text);
    let check = format!(
        "{code}\nassert is_palindrome('Racecar')\nassert is_palindrome('abba')\nassert not is_palindrome('abc')\nprint('ok')\n"
    );
    let out = std::process::Command::new("python3").arg("-c").arg(&check).output()?;
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("ok"),
        "generated code failed:\n{code}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}
