//! The GGUF reader on the real model files (fetched through the hub on first use).

use anyhow::Result;
use sapient_tensor::{GgmlType, GgufFile};

fn open(preset: &str) -> Result<GgufFile> {
    let r = sapient_hub::Hub::new()?.fetch_preset(preset, &mut |_| {})?;
    Ok(GgufFile::open(r.file("gguf")?)?)
}

#[test]
fn smollm2_lists_with_hyper_parameters() -> Result<()> {
    let g = open("smollm2-135m-instruct")?;
    assert_eq!(g.version(), 3);
    assert_eq!(g.architecture()?, "llama");
    assert_eq!(g.tensors().len(), 272);
    assert_eq!(g.get_usize("llama.block_count")?, 30);
    assert_eq!(g.get_usize("llama.embedding_length")?, 576);
    assert_eq!(g.get_usize("llama.attention.head_count")?, 9);
    assert_eq!(g.get_usize("llama.attention.head_count_kv")?, 3);
    assert_eq!(g.get_usize("llama.context_length")?, 8192);
    assert_eq!(g.get_f64("llama.rope.freq_base")?, 100_000.0);
    assert_eq!(g.get_array("tokenizer.ggml.tokens")?.len(), 49_152);
    assert!(g.get_str("tokenizer.chat_template")?.contains("<|im_start|>"));
    let count = |t: GgmlType| g.tensors().iter().filter(|i| i.ggml_type == t).count();
    assert_eq!((count(GgmlType::Q4_1), count(GgmlType::Q8_0), count(GgmlType::F32)), (210, 1, 61));
    assert!(!g.contains_tensor("output.weight"), "tied embeddings");
    assert_eq!(g.tensor_info("token_embd.weight").unwrap().shape, vec![49_152, 576]);
    Ok(())
}

/// Opt-in (0.5 GB): SAPIENT_QWEN_TESTS=1.
#[test]
fn qwen_lists_with_hyper_parameters() -> Result<()> {
    if std::env::var("SAPIENT_QWEN_TESTS").ok().as_deref() != Some("1") {
        eprintln!("skipped: set SAPIENT_QWEN_TESTS=1 (fetches the 0.5 GB Qwen2.5-Coder-0.5B GGUF)");
        return Ok(());
    }
    let g = open("qwen2.5-coder-0.5b-instruct")?;
    assert_eq!(g.architecture()?, "qwen2");
    assert_eq!(g.tensors().len(), 291);
    assert_eq!(g.get_usize("qwen2.block_count")?, 24);
    assert_eq!(g.get_usize("qwen2.embedding_length")?, 896);
    assert_eq!(g.get_usize("qwen2.attention.head_count")?, 14);
    assert_eq!(g.get_usize("qwen2.attention.head_count_kv")?, 2);
    assert_eq!(g.get_f64("qwen2.rope.freq_base")?, 1_000_000.0);
    assert_eq!(g.get_array("tokenizer.ggml.tokens")?.len(), 151_936);
    assert!(g.contains_tensor("output.weight") && g.contains_tensor("blk.0.attn_q.bias"));
    for t in [GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q6_K, GgmlType::Q4_K, GgmlType::F32] {
        assert!(g.tensors().iter().any(|i| i.ggml_type == t), "{t}");
    }
    Ok(())
}
