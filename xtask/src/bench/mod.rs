//! `cargo xtask bench <suite>`: each suite measures SAPIENT and its reference in the
//! same run and prints ratios; results are also written as JSON under `target/bench/`.

use anyhow::Result;

mod audio;
mod llm;
mod sample;
mod spec;
mod tts;
mod whisper;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub suite: Suite,
}

#[derive(clap::Subcommand)]
pub enum Suite {
    /// Log-mel and Silero VAD against numpy / onnxruntime.
    Audio(audio::Args),
    /// LLM prefill/decode tokens/s, TTFT, peak RSS; `--vs-llamacpp DIR` runs llama-bench too.
    Llm(llm::Args),
    /// Constrained-generation mask time per token (JSON schema, regex, free JSON) on the
    /// SmolLM2 and Qwen vocabularies.
    Sample(sample::Args),
    /// Plain vs speculative vs prompt-lookup decoding (Qwen2.5-Coder 1.5B with the 0.5B draft).
    Spec(spec::Args),
    /// Kokoro-82M real-time factor and time to first audio against onnxruntime on the same
    /// int8 ONNX file, phoneme ids and styles.
    Tts(tts::Args),
    /// Whisper real-time factor and WER against faster-whisper on the same CTranslate2 weights.
    Whisper(whisper::Args),
}

pub fn run(args: Args) -> Result<()> {
    match args.suite {
        Suite::Audio(a) => audio::run(a),
        Suite::Llm(a) => llm::run(a),
        Suite::Sample(a) => sample::run(a),
        Suite::Spec(a) => spec::run(a),
        Suite::Tts(a) => tts::run(a),
        Suite::Whisper(a) => whisper::run(a),
    }
}
