//! `cargo xtask bench spec`: plain vs speculative (draft model) vs prompt-lookup decoding,
//! greedy, on code-writing prompts; tokens/s, acceptance, and a check that the outputs are
//! identical.

use anyhow::Result;
use sapient_generate::speculative::SpecConfig;
use sapient_generate::{Drafter, GenerationConfig, Message, Pipeline, PipelineOptions};
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, default_value = "qwen2.5-coder-1.5b-instruct")]
    pub target: String,
    #[arg(long, default_value = "qwen2.5-coder-0.5b-instruct")]
    pub draft: String,
    #[arg(long, default_value_t = 128)]
    pub max_tokens: usize,
    /// Initial K (adapts between 1 and --k-max).
    #[arg(long, default_value_t = 4)]
    pub k: usize,
    #[arg(long, default_value_t = 8)]
    pub k_max: usize,
    /// The draft computes logits only for token ids below this, end of sequence and the
    /// rarer ids already seen (0: every logit).
    #[arg(long, default_value_t = sapient_generate::speculative::DEFAULT_DRAFT_VOCAB)]
    pub draft_vocab: usize,
    #[arg(long, default_value = "target/bench/spec.json")]
    pub json: PathBuf,
}

const PROMPTS: &[&str] = &[
    "Write a Python function that checks whether a number is prime.",
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Write a Python class Stack with push, pop and peek methods.",
];

pub fn run(a: Args) -> Result<()> {
    let opts = || PipelineOptions { max_seq_len: Some(1024), ..Default::default() };
    let target = Pipeline::load(&a.target, opts(), |_| {})?;
    let draft = Pipeline::load(&a.draft, opts(), |_| {})?;
    let cfg = GenerationConfig::default().max_tokens(a.max_tokens);
    let spec = SpecConfig { k: a.k, k_max: a.k_max, draft_vocab: (a.draft_vocab > 0).then_some(a.draft_vocab), ..Default::default() };
    let (mut t_plain, mut t_spec, mut t_lookup) = (0f64, 0f64, 0f64);
    let (mut n_tokens, mut proposed, mut accepted, mut fwd) = (0usize, 0usize, 0usize, 0usize);
    let (mut t_draft, mut t_verify) = (0f64, 0f64);
    let (mut lk_prop, mut lk_acc) = (0usize, 0usize);
    let mut identical = true;
    for p in PROMPTS {
        let msgs = [Message::user(*p)];
        target.reset_cache();
        let t = Instant::now();
        let plain = target.chat(&msgs, &cfg)?;
        t_plain += t.elapsed().as_secs_f64();
        target.reset_cache();
        draft.reset_cache();
        let t = Instant::now();
        let (s, st) = target.chat_speculative(&msgs, &cfg, &Drafter::Model(&draft), &spec, |_| ControlFlow::Continue(()))?;
        t_spec += t.elapsed().as_secs_f64();
        target.reset_cache();
        let t = Instant::now();
        let (l, lt) = target.chat_speculative(&msgs, &cfg, &Drafter::PromptLookup { max_ngram: 3 }, &spec, |_| ControlFlow::Continue(()))?;
        t_lookup += t.elapsed().as_secs_f64();
        identical &= s.tokens == plain.tokens && l.tokens == plain.tokens;
        n_tokens += plain.tokens.len();
        proposed += st.proposed;
        accepted += st.accepted;
        fwd += st.target_forwards;
        t_draft += st.propose_time.as_secs_f64();
        t_verify += st.verify_time.as_secs_f64();
        lk_prop += lt.proposed;
        lk_acc += lt.accepted;
        println!("{p:?}: {} tokens; draft acceptance {:.0}%, lookup acceptance {:.0}%", plain.tokens.len(), 100.0 * st.acceptance_rate(), 100.0 * lt.acceptance_rate());
    }
    let tps = |t: f64| n_tokens as f64 / t;
    println!(
        "plain {:.1} tok/s | speculative {:.1} tok/s ({:.2}x, acceptance {:.0}%, {:.2} tokens per target forward) | prompt lookup {:.1} tok/s ({:.2}x, acceptance {:.0}%) | outputs identical: {identical}",
        tps(t_plain),
        tps(t_spec),
        t_plain / t_spec,
        100.0 * accepted as f64 / proposed.max(1) as f64,
        n_tokens as f64 / fwd.max(1) as f64,
        tps(t_lookup),
        t_plain / t_lookup,
        100.0 * lk_acc as f64 / lk_prop.max(1) as f64,
    );
    println!(
        "  speculative time: drafting {:.0}%, target forwards {:.0}% ({:.1} ms per target forward; plain decoding {:.1} ms per token)",
        100.0 * t_draft / t_spec,
        100.0 * t_verify / t_spec,
        1e3 * t_verify / fwd.max(1) as f64,
        1e3 * t_plain / n_tokens.max(1) as f64
    );
    if let Some(parent) = a.json.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(
        &a.json,
        serde_json::to_string_pretty(&serde_json::json!({
            "target": a.target, "draft": a.draft, "tokens": n_tokens,
            "plain_tok_s": tps(t_plain), "speculative_tok_s": tps(t_spec), "lookup_tok_s": tps(t_lookup),
            "draft_acceptance": accepted as f64 / proposed.max(1) as f64,
            "lookup_acceptance": lk_acc as f64 / lk_prop.max(1) as f64,
            "identical": identical, "draft_vocab": a.draft_vocab,
            "speculative_drafting_s": t_draft, "speculative_target_s": t_verify, "target_forwards": fwd,
        }))?,
    )?;
    anyhow::ensure!(identical, "speculative output differs from plain greedy decoding");
    Ok(())
}
