use anyhow::{Context, Result};
use sapient_tensor::GgufFile;
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// A GGUF file.
    pub file: PathBuf,
    /// Also list every tensor (name, shape, type).
    #[arg(long)]
    pub tensors: bool,
    /// Also print every metadata key (long arrays summarised).
    #[arg(long)]
    pub metadata: bool,
}

pub fn run(args: Args) -> Result<()> {
    let g = GgufFile::open(&args.file).with_context(|| format!("reading {}", args.file.display()))?;
    let arch = g.architecture().unwrap_or("?").to_string();
    println!("file:         {}", args.file.display());
    println!("gguf version: {}", g.version());
    println!("architecture: {arch}");
    println!("tensors:      {}", g.tensors().len());
    println!("metadata:     {} keys", g.metadata().len());
    for key in [
        "block_count",
        "embedding_length",
        "feed_forward_length",
        "attention.head_count",
        "attention.head_count_kv",
        "context_length",
        "rope.freq_base",
        "attention.layer_norm_rms_epsilon",
        "vocab_size",
    ] {
        if let Some(v) = g.get(&format!("{arch}.{key}")) {
            println!("  {arch}.{key} = {}", v.summary());
        }
    }
    if let Ok(tokens) = g.get_array("tokenizer.ggml.tokens") {
        println!("  vocabulary: {} tokens ({})", tokens.len(), g.get_str("tokenizer.ggml.model").unwrap_or("?"));
    }
    let mut by_type: BTreeMap<&str, (usize, u64)> = BTreeMap::new();
    for t in g.tensors() {
        let e = by_type.entry(t.ggml_type.name()).or_default();
        e.0 += 1;
        e.1 += t.size;
    }
    for (ty, (n, bytes)) in by_type {
        println!("  {ty:>6}: {n:4} tensors, {:.1} MB", bytes as f64 / 1e6);
    }
    if args.metadata {
        for (k, v) in g.metadata_ordered() {
            println!("{k} = {}", v.summary());
        }
    }
    if args.tensors {
        for t in g.tensors() {
            println!("{:40} {:>6} {:?}", t.name, t.ggml_type.name(), t.shape);
        }
    }
    Ok(())
}
