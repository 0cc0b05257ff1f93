//! `cargo xtask bench <suite>`: each suite measures SAPIENT and its reference in the
//! same run and prints ratios; results are also written as JSON under `target/bench/`.

use anyhow::Result;

mod audio;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub suite: Suite,
}

#[derive(clap::Subcommand)]
pub enum Suite {
    /// Log-mel and Silero VAD against numpy / onnxruntime.
    Audio(audio::Args),
}

pub fn run(args: Args) -> Result<()> {
    match args.suite {
        Suite::Audio(a) => audio::run(a),
    }
}
