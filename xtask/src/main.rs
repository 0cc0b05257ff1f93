//! Developer tasks: `cargo xtask fetch`, `cargo xtask convert`, `cargo xtask bench`.
//!
//! Each subcommand lives in its own module so that they can grow apart.

use anyhow::Result;
use clap::{Parser, Subcommand};

mod bench;
mod convert;
mod fetch;
mod inspect;

#[derive(Parser)]
#[command(name = "xtask", about = "SAPIENT developer tasks")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Fetch model presets (or a group of them) into the cache, verifying sha256.
    Fetch(fetch::Args),
    /// Run benchmarks against the references in the same run (see docs/benchmarks.md).
    Bench(bench::Args),
    /// Convert between GGUF and HF safetensors, quantizing (docs/convert.md).
    Convert(convert::Args),
    /// Print a GGUF file's architecture, hyper-parameters and tensors.
    Inspect(inspect::Args),
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    // Kernel options come from the environment here (SAPIENT_THREADS, SAPIENT_NO_AVX512, ...);
    // the libraries take them as values.
    let (kernels, warnings) = sapient_tensor::kernels::KernelOptions::from_env();
    for w in warnings {
        tracing::warn!("{w}");
    }
    sapient_tensor::kernels::configure(kernels)?;
    match Cli::parse().cmd {
        Cmd::Fetch(args) => fetch::run(args),
        Cmd::Bench(args) => bench::run(args),
        Cmd::Inspect(args) => inspect::run(args),
        Cmd::Convert(args) => convert::run(args),
    }
}
