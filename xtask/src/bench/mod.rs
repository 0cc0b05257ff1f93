//! `cargo xtask bench <suite>`: each suite measures SAPIENT and its reference in the
//! same run and prints ratios; results are also written as JSON under `target/bench/`.

use anyhow::Result;

mod audio;
mod batch;
mod embed;
mod kernels;
mod llm;
mod sample;
mod schemas;
mod serve;
mod spec;
mod step_cost;
mod tts;
mod voice;
mod whisper;
mod whisper_profile;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub suite: Suite,
}

#[derive(clap::Subcommand)]
pub enum Suite {
    /// Log-mel and Silero VAD against numpy / onnxruntime.
    Audio(audio::Args),
    /// Many sequences through the engine at 1..16 at once (aggregate decode tokens/s, time to
    /// first token), prefix cache, KV budget; `--vs-llamacpp DIR` runs llama-batched-bench too.
    Batch(batch::Args),
    /// Sentence embeddings (all-MiniLM-L6-v2 vs onnxruntime, nomic-embed-text-v1.5 vs
    /// llama-embedding): sentences/s and tokens/s for batches of 1, 8 and 64.
    Embed(embed::Args),
    /// Quantized matrix kernels: GMAC/s in cache and GB/s from memory per format and
    /// activation rows (`--stream`: multi-row products with weights from memory).
    Kernels(kernels::Args),
    /// LLM prefill/decode tokens/s, TTFT, peak RSS; `--vs-llamacpp DIR` runs llama-bench too.
    Llm(llm::Args),
    /// Constrained-generation mask time per token (JSON schema, regex, free JSON) on the
    /// SmolLM2 and Qwen vocabularies; `--schemas`: coverage and time to first mask on
    /// public JSON Schema corpora.
    Sample(sample::Args),
    /// `sapient serve` against llama.cpp's `llama-server` (same GGUF): N concurrent streaming
    /// clients on loopback; time to first token, inter-token latency, aggregate tokens/s, errors.
    Serve(serve::Args),
    /// Plain vs speculative vs prompt-lookup decoding (Qwen2.5-Coder 1.5B with the 0.5B draft).
    Spec(spec::Args),
    /// One forward of n new tokens after a cached prefix against one token (the cost model
    /// of speculative verification and of the batched step).
    StepCost(step_cost::Args),
    /// Kokoro-82M real-time factor and time to first audio against onnxruntime on the same
    /// int8 ONNX file, phoneme ids and styles.
    Tts(tts::Args),
    /// The spoken conversation loop at real-time pace: end of speech to first reply audio
    /// (p50/p95), each stage's cost, the question's and the reply's word error rates.
    Voice(voice::Args),
    /// Whisper real-time factor and WER against faster-whisper on the same CTranslate2 weights.
    Whisper(whisper::Args),
    /// Where one Whisper window's time goes: encoder, cross K/V, decoding steps, beams.
    WhisperProfile(whisper_profile::Args),
}

/// The machine the figures come from, as a line: the CPU model, its family and model
/// numbers (two VMs of the same name can be different generations: "AMD EPYC" family 25
/// model 17 is a Zen 4, family 26 a Zen 5, and their figures differ) and the threads.
pub fn machine() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |k: &str| {
        info.lines()
            .find(|l| l.split(':').next().is_some_and(|n| n.trim() == k))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
    };
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    match (field("model name"), field("cpu family"), field("model")) {
        (Some(name), Some(fam), Some(model)) => format!("{name} (cpu family {fam}, model {model}), {threads} threads"),
        (Some(name), _, _) => format!("{name}, {threads} threads"),
        _ => format!("{} ({threads} threads)", std::env::consts::ARCH),
    }
}

pub fn run(args: Args) -> Result<()> {
    println!("machine: {}", machine());
    match args.suite {
        Suite::Audio(a) => audio::run(a),
        Suite::Batch(a) => batch::run(a),
        Suite::Embed(a) => embed::run(a),
        Suite::Kernels(a) => kernels::run(a),
        Suite::Llm(a) => llm::run(a),
        Suite::Sample(a) => sample::run(a),
        Suite::Serve(a) => serve::run(a),
        Suite::Spec(a) => spec::run(a),
        Suite::StepCost(a) => step_cost::run(a),
        Suite::Tts(a) => tts::run(a),
        Suite::Voice(a) => voice::run(a),
        Suite::Whisper(a) => whisper::run(a),
        Suite::WhisperProfile(a) => whisper_profile::run(a),
    }
}
