//! Gemma 3 270M through the Pipeline (the engine, the SentencePiece tokenizer, the streaming
//! detokenizer): a raw prompt's greedy continuation starts as llama.cpp's does
//! (tests/data/llama/gemma3_llamacpp_greedy.json). Opt-in (253 MB GGUF): SAPIENT_GEMMA_TESTS=1.

use anyhow::Result;
use sapient_generate::{GenerationConfig, Pipeline, PipelineOptions};

#[test]
fn gemma3_pipeline_continues_like_llama_cpp() -> Result<()> {
    if std::env::var("SAPIENT_GEMMA_TESTS").ok().as_deref() != Some("1") {
        eprintln!("skipped: set SAPIENT_GEMMA_TESTS=1 (fetches the 253 MB Gemma 3 270M GGUF)");
        return Ok(());
    }
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/llama/gemma3_llamacpp_greedy.json");
    let cases: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(file)?)?;
    // "The three laws of thermodynamics are": identical to llama.cpp for 64 tokens in
    // crates/sapient-llama/tests/gemma3_llamacpp.rs.
    let case = &cases[2];
    let (prompt, want) = (case["prompt"].as_str().unwrap_or(""), case["continuation"].as_str().unwrap_or(""));
    let p = Pipeline::load("gemma-3-270m", PipelineOptions { max_seq_len: Some(512), ..Default::default() }, |_| {})?;
    let g = p.generate(prompt, &GenerationConfig::default().max_tokens(32))?;
    eprintln!("{prompt:?} -> {:?}", g.text);
    assert!(!g.text.is_empty() && want.starts_with(&g.text), "ours {:?}\nllama.cpp {want:?}", g.text);
    Ok(())
}
