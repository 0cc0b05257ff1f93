//! The Gemma 3 GGUF tokenizer (SentencePiece from `tokenizer.ggml.*`, 262k vocabulary, no
//! space prefix, whitespace runs and HTML tags as user-defined tokens) against llama.cpp's
//! `llama-tokenize` on a mixed corpus: tests/data/tokenizers/gemma3_llamacpp_ids.json, made
//! by scripts/reference/gemma3_llamacpp_ids.py. Opt-in (fetches the 253 MB Gemma 3 270M GGUF):
//! SAPIENT_GEMMA_TESTS=1.

use anyhow::{Context, Result};
use sapient_tokenizers::Tokenizer;
use serde_json::Value;
use std::path::PathBuf;

fn enabled() -> bool {
    if std::env::var("SAPIENT_GEMMA_TESTS").ok().as_deref() == Some("1") {
        return true;
    }
    eprintln!("skipped: set SAPIENT_GEMMA_TESTS=1 (fetches the 253 MB Gemma 3 270M GGUF)");
    false
}

fn gemma() -> Result<Tokenizer> {
    let path = sapient_hub::Hub::new()?.fetch_preset("gemma-3-270m", &mut |_| {})?.file("gguf")?.to_path_buf();
    let g = sapient_tensor::GgufFile::open(&path)?;
    Ok(Tokenizer::from_gguf(&g)?)
}

#[test]
fn gemma3_gguf_tokenizer_matches_llama_tokenize() -> Result<()> {
    if !enabled() {
        return Ok(());
    }
    let t0 = std::time::Instant::now();
    let tok = gemma()?;
    eprintln!("tokenizer built in {:.2} s", t0.elapsed().as_secs_f64());
    let file = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/tokenizers/gemma3_llamacpp_ids.json");
    let data: Value = serde_json::from_str(&std::fs::read_to_string(&file).with_context(|| file.display().to_string())?)?;
    let texts: Vec<String> = serde_json::from_value(data["texts"].clone())?;
    let ids: Vec<Vec<u32>> = serde_json::from_value(data["ids"].clone())?;
    assert_eq!(texts.len(), ids.len());
    assert!(texts.len() >= 50);
    let mut failed = Vec::new();
    let t0 = std::time::Instant::now();
    for (text, want) in texts.iter().zip(&ids) {
        let got = tok.encode(text, true)?;
        if &got != want {
            eprintln!("{text:?}\n  ours:      {got:?}\n  llama.cpp: {want:?}");
            failed.push(text.clone());
        }
    }
    eprintln!("{} texts encoded in {:.3} s", texts.len(), t0.elapsed().as_secs_f64());
    assert!(failed.is_empty(), "{} of {} texts differ from llama-tokenize", failed.len(), texts.len());
    // Decoding gives the text back (after the BOS), byte tokens and control tokens included
    // (not for a text that holds `▁` itself, which SentencePiece reads as a space).
    for (text, want) in texts.iter().zip(&ids).filter(|(t, _)| !t.contains('\u{2581}')) {
        assert_eq!(want[0], 2);
        assert_eq!(tok.decode(&want[1..], false)?, *text, "round trip of {text:?}");
    }
    // What the ids stand for: user-defined whitespace runs and tags, control tokens in text.
    let id = |s: &str| tok.token_to_id(s).with_context(|| s.to_string());
    assert_eq!(tok.encode("a  b", false)?, vec![id("a")?, id("  ")?, id("b")?]);
    assert_eq!(tok.encode("<start_of_turn>user", false)?, vec![id("<start_of_turn>")?, id("user")?]);
    assert!(tok.eos_token_ids().contains(&id("<end_of_turn>")?));
    assert_eq!(tok.bos_token_id(), Some(2));
    Ok(())
}
