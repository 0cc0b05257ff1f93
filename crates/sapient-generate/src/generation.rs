//! What to generate and what comes back: the request's settings, the generation with its
//! statistics, and the text handling every decoding path shares.

use crate::Result;
use sapient_sample::{Grammar, SamplerConfig};
use sapient_tokenizers::{StopMatcher, TokenStream};
use std::sync::Arc;
use std::time::Duration;

/// What to generate.
#[derive(Debug, Clone)]
pub struct GenerationConfig {
    pub max_tokens: usize,
    pub sampling: SamplerConfig,
    /// Stop when any of these strings appears in the output (it is not included).
    pub stop: Vec<String>,
    /// Keep going past end-of-sequence tokens.
    pub ignore_eos: bool,
    pub skip_special_tokens: bool,
    /// Structured generation: every token is checked against this grammar (regex, JSON
    /// Schema, ... see `sapient_sample::Expr`), and generation ends with end-of-sequence
    /// as soon as the grammar is complete and nothing else is allowed, or when the model
    /// chooses to end a complete text.
    pub constraint: Option<Arc<Grammar>>,
    /// With a constraint: append the tokens it forces without sampling (`Matcher::forced_token`:
    /// the only allowed token, or text the constraint forces, such as a key with its quotes
    /// and colon, split by the model's tokenizer, all but its last token) and feed such runs
    /// (up to 16 tokens) to the model with the sampled token before them in one forward pass.
    /// The CPU forward computes batches under 32 rows row by row, bit-identical to single
    /// decode steps. The tokenizer's split of forced text need not be the tokens the model
    /// would have sampled one by one, so the text can differ from a run without it.
    pub fast_forward: bool,
    /// Speculative decoding by prompt lookup, verified in the engine's batched step (see
    /// [`LookupDecoding`](crate::speculative::LookupDecoding)). Greedy output is exactly
    /// plain greedy decoding's; sampled output keeps the model's distribution. Pays off when
    /// the answer repeats its input (code edits, extraction, quoting). Not with a constraint.
    pub lookup: Option<crate::speculative::LookupDecoding>,
    /// Speculative decoding with the draft model of an engine made by [`Engine::with_draft`](crate::Engine::with_draft)
    /// (and by [`Pipeline::chat_speculative`](crate::Pipeline::chat_speculative) with [`Drafter::Model`](crate::Drafter::Model)): each decode step the
    /// draft proposes K tokens (its greedy choices, one batched draft forward per proposed
    /// token over every speculating sequence), the target verifies them in its batched step.
    /// Greedy output is exactly plain greedy decoding's; sampled output keeps the target's
    /// distribution. `draft_vocab` does not apply. Not with a constraint, nor with `lookup`.
    /// On an engine over a hybrid model with a multi-token-prediction head (Qwen3.5), the
    /// head drafts instead, at most [`MTP_MAX_DRAFTS`](crate::engine::MTP_MAX_DRAFTS) tokens a step.
    pub draft: Option<crate::speculative::SpecConfig>,
    /// The chat template's thinking switch (`enable_thinking`, as Qwen3's and SmolLM3's
    /// templates read it) for [`Pipeline::chat`](crate::Pipeline::chat) and [`Engine::submit_chat`](crate::Engine::submit_chat); `None`: the
    /// template's default. Templates without the switch ignore it.
    pub thinking: Option<bool>,
    /// Close a `<think>` block after this many tokens inside it (`\n</think>\n\n` is fed
    /// without sampling), so that a reasoning model gets to its answer; a block the prompt
    /// opens counts from the first generated token.
    pub reasoning_budget: Option<usize>,
    /// Log-probabilities of the chosen tokens with this many of the most likely alternatives
    /// (0 to [`MAX_TOP_LOGPROBS`]), from the model's distribution before the sampler's
    /// changes (temperature, penalties, filters, constraint masks), as OpenAI's `logprobs`:
    /// [`Generation::logprobs`], and [`Event::Logprobs`](crate::Event::Logprobs) after each
    /// step's text. Every token then gets its own forward: forced runs and prompt lookup
    /// are off. Tokens a reasoning budget forces have log-probability 0 and no alternatives.
    pub logprobs: Option<usize>,
    /// LoRA adapters applied to this request, by the ids the model's
    /// [`load_lora`](crate::Model::load_lora) gave them, each with its scale (none: the base
    /// model). Requests with different adapters run in the same batched steps (the base
    /// weights read once, each adapter's low-rank product over its own rows); a request with
    /// adapters neither takes nor gives prefix-cache blocks.
    pub lora: Vec<sapient_llama::LoraUse>,
}

/// Most alternatives [`GenerationConfig::logprobs`] gives per token (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// A chosen token's log-probability and the most likely alternatives at its position.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f32,
    /// Most likely first, `(token, logprob)`.
    pub top: Vec<(u32, f32)>,
}

impl TokenLogprob {
    /// From a position's raw logits: `token`'s log-softmax and the `k` most likely tokens.
    pub fn from_logits(logits: &[f32], token: u32, k: usize) -> Self {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
        let lse = max + sum.ln() as f32;
        let lp = |l: f32| if l.is_finite() { l - lse } else { f32::NEG_INFINITY };
        let k = k.min(MAX_TOP_LOGPROBS).min(logits.len());
        let mut top: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
        if k > 0 {
            // One pass keeping the k best, highest first (ties: lower id first).
            for (i, &l) in logits.iter().enumerate() {
                if top.len() == k && l <= top[k - 1].1 {
                    continue;
                }
                let at = top.partition_point(|&(_, x)| x >= l);
                top.insert(at, (i as u32, l));
                top.truncate(k);
            }
        }
        Self {
            token,
            logprob: logits.get(token as usize).map_or(f32::NEG_INFINITY, |&l| lp(l)),
            top: top.into_iter().map(|(t, l)| (t, lp(l))).collect(),
        }
    }
}

impl Default for GenerationConfig {
    fn default() -> Self {
        Self {
            max_tokens: 256,
            sampling: SamplerConfig::default(),
            stop: Vec::new(),
            ignore_eos: false,
            skip_special_tokens: true,
            constraint: None,
            fast_forward: true,
            lookup: None,
            draft: None,
            thinking: None,
            reasoning_budget: None,
            logprobs: None,
            lora: Vec::new(),
        }
    }
}

impl GenerationConfig {
    pub fn max_tokens(mut self, n: usize) -> Self {
        self.max_tokens = n;
        self
    }
    pub fn sampling(mut self, s: SamplerConfig) -> Self {
        self.sampling = s;
        self
    }
    pub fn stop(mut self, s: impl Into<String>) -> Self {
        self.stop.push(s.into());
        self
    }
    /// Constrain the output to `grammar` (e.g. `Grammar::json_schema(&schema)?`).
    pub fn constrain(mut self, grammar: Grammar) -> Self {
        self.constraint = Some(Arc::new(grammar));
        self
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// The model produced an end-of-sequence token.
    Eos,
    /// A stop string appeared.
    Stop,
    MaxTokens,
    /// The context is full.
    ContextFull,
    /// The consumer stopped listening.
    Cancelled,
}

#[derive(Debug, Clone, Default)]
pub struct GenerationStats {
    pub prompt_tokens: usize,
    /// Prompt tokens found already in the KV cache (not recomputed).
    pub reused_prompt_tokens: usize,
    pub generated_tokens: usize,
    /// Generated tokens appended without sampling because the constraint forced them.
    pub forced_tokens: usize,
    /// With [`GenerationConfig::lookup`] or [`GenerationConfig::draft`]: tokens proposed, and
    /// those the model accepted.
    pub proposed_tokens: usize,
    pub accepted_tokens: usize,
    /// With [`GenerationConfig::draft`]: this request's share of the draft model's forwards
    /// (part of `decode`).
    pub draft_time: Duration,
    /// Forward passes whose logits chose tokens (the prompt's last and every decode step;
    /// fewer than the tokens when forced runs or accepted guesses came along).
    pub forwards: usize,
    /// Time spent choosing tokens (sampler, constraint checks and masks, fast-forward),
    /// part of `decode`.
    pub sampling: Duration,
    pub prefill: Duration,
    pub decode: Duration,
    pub time_to_first_token: Duration,
}

impl GenerationStats {
    /// Prompt tokens actually processed per second.
    pub fn prefill_tokens_per_s(&self) -> f64 {
        (self.prompt_tokens - self.reused_prompt_tokens) as f64 / self.prefill.as_secs_f64().max(1e-9)
    }
    /// Generated tokens per second (sampling included), after the prompt was processed.
    pub fn decode_tokens_per_s(&self) -> f64 {
        self.generated_tokens as f64 / self.decode.as_secs_f64().max(1e-9)
    }
}

#[derive(Debug, Clone)]
pub struct Generation {
    /// The answer: the whole output, or with a reasoning block, what follows it.
    pub text: String,
    /// What a reasoning model wrote inside `<think>…</think>` before its answer (Qwen3,
    /// DeepSeek-R1 style; the opening tag may be in the prompt instead); `None` without one.
    /// The streamed pieces carry the whole output, tags included.
    pub reasoning: Option<String>,
    pub tokens: Vec<u32>,
    /// With [`GenerationConfig::logprobs`]: one per token of [`tokens`](Self::tokens).
    pub logprobs: Vec<TokenLogprob>,
    pub finish: FinishReason,
    pub stats: GenerationStats,
}

impl Generation {
    /// The answer split into reasoning, text and the tool calls in `format`'s syntax (see
    /// [`chat::parse_tool_calls`](crate::chat::parse_tool_calls)).
    pub fn tool_calls(&self, format: crate::chat::Format) -> crate::chat::Reply {
        let mut reply = crate::chat::parse_tool_calls(format, &self.text);
        reply.reasoning = self.reasoning.clone().unwrap_or_default();
        reply
    }
}

/// The text still held back at the end of a generation: an incomplete character in the
/// detokenizer and a possible stop-string prefix. Nothing when it stopped or was cancelled.
pub(crate) fn flush_tail(detok: &mut TokenStream, stops: &mut StopMatcher, finish: &mut FinishReason) -> Result<String> {
    if matches!(finish, FinishReason::Stop | FinishReason::Cancelled) {
        return Ok(String::new());
    }
    let tail = detok.finish()?.unwrap_or_default();
    let out = stops.push(&tail);
    let mut rest = out.emit;
    if out.stopped {
        *finish = FinishReason::Stop;
    } else {
        rest.push_str(&stops.flush());
    }
    Ok(rest)
}
