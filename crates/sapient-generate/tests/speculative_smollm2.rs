//! Speculative decoding on the real SmolLM2: greedy output identical to plain greedy decoding.

use anyhow::Result;
use sapient_generate::speculative::SpecConfig;
use sapient_generate::{Drafter, FinishReason, GenerationConfig, Message, Pipeline, PipelineOptions};
use std::ops::ControlFlow;

fn load() -> Result<Pipeline> {
    Ok(Pipeline::load("smollm2-135m-instruct", PipelineOptions { max_seq_len: Some(1024), ..Default::default() }, |_| {})?)
}

const PROMPT: &str = "Repeat this list exactly, then add one more fruit: apple, banana, cherry, date, elderberry, fig, grape.";

#[test]
fn prompt_lookup_and_draft_model_match_plain_greedy() -> Result<()> {
    let target = load()?;
    let cfg = GenerationConfig::default().max_tokens(40);
    let msgs = vec![Message::user(PROMPT)];
    let plain = target.chat(&msgs, &cfg)?;
    target.reset_cache();

    let (g, stats) = target.chat_speculative(&msgs, &cfg, &Drafter::PromptLookup { max_ngram: 3 }, &SpecConfig::default(), |_| ControlFlow::Continue(()))?;
    assert_eq!(g.tokens, plain.tokens, "prompt lookup changes nothing under greedy");
    assert_eq!(g.text, plain.text);
    assert!(stats.accepted > 0, "the answer repeats the prompt, so lookups get accepted: {stats:?}");
    assert!(stats.target_forwards < g.tokens.len() + 1, "fewer target forwards than tokens: {stats:?}");

    // The same model as its own draft: everything is accepted.
    let draft = load()?;
    target.reset_cache();
    let full = SpecConfig { draft_vocab: None, ..Default::default() };
    let (g2, s2) = target.chat_speculative(&msgs, &cfg, &Drafter::Model(&draft), &full, |_| ControlFlow::Continue(()))?;
    assert_eq!(g2.tokens, plain.tokens);
    assert!(s2.acceptance_rate() > 0.9, "{s2:?}");
    assert!(s2.tokens_per_target_forward() > 2.0, "{s2:?}");
    // A second turn reuses both caches and still matches.
    let (g3, _) = target.chat_speculative(&msgs, &cfg, &Drafter::Model(&draft), &SpecConfig::default(), |_| ControlFlow::Continue(()))?;
    assert_eq!(g3.tokens, plain.tokens);
    assert!(g3.stats.reused_prompt_tokens > 0);
    // A draft restricted to the first 2000 token ids (and the rare ones the text brings):
    // the output is still the target's own; proposals still get accepted.
    target.reset_cache();
    draft.reset_cache();
    let small = SpecConfig { draft_vocab: Some(2000), ..Default::default() };
    let (g5, s5) = target.chat_speculative(&msgs, &cfg, &Drafter::Model(&draft), &small, |_| ControlFlow::Continue(()))?;
    assert_eq!(g5.tokens, plain.tokens);
    assert!(s5.acceptance_rate() > 0.5, "{s5:?}");
    assert!(plain.tokens.iter().any(|&t| t >= 2000), "the answer has a rare token, so the extra ids matter");
    // The draft pipeline answers plain requests with every logit again.
    draft.reset_cache();
    assert_eq!(draft.chat(&msgs, &cfg)?.tokens, plain.tokens);
    // Max tokens and stop strings behave as in plain decoding.
    let (g4, _) = target.chat_speculative(&msgs, &GenerationConfig::default().max_tokens(7), &Drafter::PromptLookup { max_ngram: 3 }, &SpecConfig::default(), |_| ControlFlow::Continue(()))?;
    assert_eq!(g4.tokens, plain.tokens[..7]);
    assert_eq!(g4.finish, FinishReason::MaxTokens);
    // Drafting with the same pipeline object is refused.
    assert!(target.chat_speculative(&msgs, &cfg, &Drafter::Model(&target), &SpecConfig::default(), |_| ControlFlow::Continue(())).is_err());
    Ok(())
}
