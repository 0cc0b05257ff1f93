//! `cargo xtask convert`: GGUF <-> HF safetensors for LLaMA-family models, with quantization.
//!
//! - `gguf-to-safetensors IN.gguf OUT_DIR [--dtype f32|f16|bf16]`: dequantized weights under
//!   transformers names, `config.json`, `tokenizer.json`, `tokenizer_config.json`.
//! - `safetensors-to-gguf IN_DIR OUT.gguf --type f16|q8_0|q4_0|q4_1|q4_k|q5_k|q6_k`: the
//!   metadata llama.cpp expects (architecture, hyper-parameters, tokenizer, chat template).
//!
//! llama.cpp's converter permutes the Q and K rows of arch `llama` so that its interleaved
//! RoPE matches transformers' rotate-half; we undo that going to HF and apply it coming back.

mod llama;

use anyhow::Result;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(clap::Subcommand)]
pub enum Cmd {
    /// GGUF (llama / qwen2 / mistral) to an HF directory.
    GgufToSafetensors {
        input: PathBuf,
        out_dir: PathBuf,
        #[arg(long, default_value = "f32")]
        dtype: String,
    },
    /// HF directory (config.json, *.safetensors, tokenizer.json) to GGUF.
    SafetensorsToGguf {
        input: PathBuf,
        output: PathBuf,
        #[arg(long = "type", default_value = "q8_0")]
        ty: String,
    },
}

pub fn run(args: Args) -> Result<()> {
    match args.cmd {
        Cmd::GgufToSafetensors { input, out_dir, dtype } => {
            let n = llama::gguf_to_safetensors(&input, &out_dir, &dtype)?;
            println!("wrote {n} tensors, config.json, tokenizer.json, tokenizer_config.json to {}", out_dir.display());
        }
        Cmd::SafetensorsToGguf { input, output, ty } => {
            let n = llama::safetensors_to_gguf(&input, &output, &ty)?;
            println!("wrote {} ({n} tensors, {ty})", output.display());
        }
    }
    Ok(())
}
