//! `cargo xtask convert`: GGUF <-> HF safetensors for LLaMA-family models, with quantization.
//!
//! - `gguf-to-safetensors IN.gguf OUT_DIR [--dtype f32|f16|bf16]`: dequantized weights under
//!   transformers names, `config.json`, `tokenizer.json`, `tokenizer_config.json`.
//! - `safetensors-to-gguf IN_DIR OUT.gguf --type f16|q8_0|q4_0|q4_1|q4_k|q5_k|q6_k`: the
//!   metadata llama.cpp expects (architecture, hyper-parameters, tokenizer, chat template).
//!
//! - `ct2-to-safetensors MODEL OUT_DIR [--dtype f16|f32|bf16]`: a CTranslate2 Whisper
//!   `model.bin` (a path, a directory holding it, or a preset such as `whisper-tiny.en`) to
//!   transformers' layout (fused Q/K/V and cross K/V split, no key bias), `config.json` with
//!   the alignment heads, suppressed tokens and language ids; `tokenizer.json` is copied.
//!
//! - `ct2-to-gguf MODEL OUT_DIR [--type q8_0]`: the same Whisper weights as `model.gguf`
//!   with the encoder layers' and decoder's matrices quantized (the rest f32) and
//!   `config.json`; `Transcriber::load` reads the directory without quantizing at load.
//!
//! - `kokoro-onnx-to-safetensors MODEL OUT_DIR [--dtype f32|f16|bf16] [--report FILE]`: the
//!   Kokoro-82M int8 ONNX export (a path, a directory holding `kokoro-v1.0.int8.onnx`, or the
//!   preset `kokoro-82m`) to `KModel`-named safetensors and Kokoro's `config.json` (with the
//!   `vocab.json` beside the file); names and dequantization in docs/kokoro.md.
//!
//! - `synthetic-moe ARCH OUT.gguf`: a small mixture-of-experts checkpoint with random weights
//!   (`qwen3moe`, `qwen3moe-mxfp4`, `qwen2moe`, `llama-moe`, `gpt-oss`; see `moe_synthetic.rs`) and its test prompts' token ids in
//!   `OUT.ids`, for the reference scripts.
//!
//! - `synthetic-qwen35 SIZE OUT.gguf`: Qwen3.5 at a real model's shapes (`0.8b`, `2b`) with
//!   random weights in F16, for speed measurements after llama.cpp's `llama-quantize` (see
//!   `qwen35_synthetic.rs`).
//!
//! llama.cpp's converter permutes the Q and K rows of arch `llama` so that its interleaved
//! RoPE matches transformers' rotate-half; we undo that going to HF and apply it coming back.

mod kokoro;
mod llama;
mod moe_full;
mod moe_synthetic;
mod qwen35_synthetic;
#[cfg(test)]
mod synthetic;

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
    /// CTranslate2 Whisper model.bin (path, directory or preset) to an HF directory.
    Ct2ToSafetensors {
        input: String,
        out_dir: PathBuf,
        #[arg(long, default_value = "f16")]
        dtype: String,
    },
    /// CTranslate2 Whisper model.bin (path, directory or preset) to model.gguf (quantized
    /// matrices) + config.json + tokenizer.json.
    Ct2ToGguf {
        input: String,
        out_dir: PathBuf,
        #[arg(long = "type", default_value = "q8_0")]
        ty: String,
    },
    /// A small synthetic mixture-of-experts GGUF (qwen3moe, qwen3moe-mxfp4, llama-moe, gpt-oss) and its prompts' ids (OUT.ids).
    /// With `--full-size`, the real model's shapes instead (gpt-oss: gpt-oss-20b, qwen3moe:
    /// Qwen3-30B-A3B; random quantized blocks written directly, 12 to 18 GB; no ids).
    SyntheticMoe {
        arch: String,
        output: PathBuf,
        #[arg(long)]
        full_size: bool,
    },
    /// Qwen3.5 at a real size's shapes (0.8b, 2b) with random F16 weights, for speed runs.
    SyntheticQwen35 { size: String, output: PathBuf },
    /// Kokoro-82M int8 ONNX (path, directory or preset) to KModel-named safetensors + config.json.
    KokoroOnnxToSafetensors {
        input: String,
        out_dir: PathBuf,
        #[arg(long, default_value = "f32")]
        dtype: String,
        /// Also write what became of every initializer (mapped, quantization data, constants) as JSON.
        #[arg(long)]
        report: Option<PathBuf>,
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
        Cmd::Ct2ToSafetensors { input, out_dir, dtype } => ct2_to_safetensors(&input, &out_dir, &dtype)?,
        Cmd::Ct2ToGguf { input, out_dir, ty } => ct2_to_gguf(&input, &out_dir, &ty)?,
        Cmd::SyntheticMoe { arch, output, full_size } => {
            let tok = sapient_hub::Hub::new()?.fetch_preset("smollm2-135m-instruct", &mut |_| {})?;
            if full_size {
                let bytes = moe_full::write(&arch, tok.file("gguf")?, &output)?;
                println!("wrote {} ({:.2} GB)", output.display(), bytes as f64 / 1e9);
                return Ok(());
            }
            let ids = moe_synthetic::write(&arch, tok.file("gguf")?, &output)?;
            let lines: Vec<String> = ids.iter().map(|p| p.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(",")).collect();
            std::fs::write(output.with_extension("ids"), lines.join("\n") + "\n")?;
            println!("wrote {} and its prompts' ids", output.display());
        }
        Cmd::SyntheticQwen35 { size, output } => {
            let tok = sapient_hub::Hub::new()?.fetch_preset("qwen2.5-coder-0.5b-instruct", &mut |_| {})?;
            qwen35_synthetic::write(&size, tok.file("gguf")?, &output)?;
            println!("wrote {}", output.display());
        }
        Cmd::KokoroOnnxToSafetensors { input, out_dir, dtype, report } => {
            kokoro::onnx_to_safetensors(&input, &out_dir, &dtype, report.as_deref())?
        }
    }
    Ok(())
}

/// The CTranslate2 `model.bin` of a path, a directory or a preset, and its directory.
fn ct2_input(input: &str) -> Result<(PathBuf, PathBuf)> {
    use anyhow::Context;
    let path = std::path::Path::new(input);
    let (bin, dir) = if path.is_file() {
        (path.to_path_buf(), path.parent().map(|p| p.to_path_buf()).unwrap_or_default())
    } else if path.is_dir() {
        (path.join("model.bin"), path.to_path_buf())
    } else {
        let m = sapient_hub::Hub::new()?
            .resolve(input, &mut |_| {})
            .with_context(|| format!("'{input}' is neither a file, a directory nor a preset"))?;
        (m.file("model")?.to_path_buf(), m.dir.clone())
    };
    Ok((bin, dir))
}

fn ct2_to_gguf(input: &str, out_dir: &std::path::Path, ty: &str) -> Result<()> {
    use anyhow::{bail, Context};
    let quant = match ty {
        "q8_0" => candle_core::quantized::GgmlDType::Q8_0,
        other => bail!("--type {other}: expected q8_0"),
    };
    let (bin, dir) = ct2_input(input)?;
    let config = dir.join("config.json");
    let config = config.is_file().then_some(config);
    let n = sapient_whisper::ct2::convert_to_gguf(&bin, config.as_deref(), out_dir, quant)
        .with_context(|| format!("converting {}", bin.display()))?;
    let tok = dir.join("tokenizer.json");
    anyhow::ensure!(tok.is_file(), "no tokenizer.json beside {}", bin.display());
    std::fs::copy(&tok, out_dir.join("tokenizer.json")).with_context(|| format!("copying {}", tok.display()))?;
    println!("wrote model.gguf ({n} tensors, {ty}), config.json, tokenizer.json to {}", out_dir.display());
    Ok(())
}

fn ct2_to_safetensors(input: &str, out_dir: &std::path::Path, dtype: &str) -> Result<()> {
    use anyhow::{bail, Context};
    let dtype = match dtype {
        "f16" => candle_core::DType::F16,
        "f32" => candle_core::DType::F32,
        "bf16" => candle_core::DType::BF16,
        other => bail!("--dtype {other}: expected f16, f32 or bf16"),
    };
    let (bin, dir) = ct2_input(input)?;
    let config = dir.join("config.json");
    let config = config.is_file().then_some(config);
    let n = sapient_whisper::ct2::convert_to_safetensors(&bin, config.as_deref(), out_dir, dtype)
        .with_context(|| format!("converting {}", bin.display()))?;
    let tok = dir.join("tokenizer.json");
    if tok.is_file() {
        std::fs::copy(&tok, out_dir.join("tokenizer.json")).with_context(|| format!("copying {}", tok.display()))?;
    } else {
        eprintln!("note: no tokenizer.json beside {}; copy one into {} to load it", bin.display(), out_dir.display());
    }
    println!("wrote {n} tensors ({dtype:?}), config.json{} to {}", if tok.is_file() { ", tokenizer.json" } else { "" }, out_dir.display());
    Ok(())
}
