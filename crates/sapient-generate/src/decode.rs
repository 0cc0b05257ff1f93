//! One sequence's decoding state: from logits to tokens and text.
//!
//! The engine keeps one [`Decoder`] per request and the single-sequence loop of models
//! without a batched forward keeps one too, so sampling, constraints and their forced runs,
//! end-of-sequence, stop strings, the token limit and the statistics are written once.

use crate::chat::think::{self, split_reasoning};
use crate::generation::{flush_tail, FinishReason, Generation, GenerationConfig, GenerationStats, TokenLogprob};
use crate::model::Model;
use crate::speculative::{self, PromptLookup, Proposal, Proposer};
use crate::{Error, Result};
use rand::rngs::StdRng;
use rand::SeedableRng;
use sapient_sample::{Grammar, Matcher, Sampler};
use sapient_tokenizers::{StopMatcher, TokenStream};
use std::time::{Duration, Instant};

/// Longest run of constraint-forced tokens fed in one step after a sampled token.
const MAX_FORCED_RUN: usize = 16;

pub(crate) struct Decoder {
    pub(crate) cfg: GenerationConfig,
    sampler: Sampler,
    matcher: Option<Matcher<Grammar>>,
    detok: TokenStream,
    stops: StopMatcher,
    /// The text emitted so far.
    text: String,
    /// Prompt and generated tokens (the output and the penalties' history).
    tokens: Vec<u32>,
    prompt_len: usize,
    /// When the request arrived and when its prompt started being processed.
    submitted: Instant,
    pub(crate) started: Option<Instant>,
    first_token: Option<Instant>,
    pub(crate) stats: GenerationStats,
    lookup: Option<Lookup>,
    think: Think,
    /// With `cfg.logprobs`: one per generated token, and how many were handed out.
    logprobs: Vec<TokenLogprob>,
    logprobs_given: usize,
}

/// Where the output stands with a `<think>` block, for [`GenerationConfig::reasoning_budget`].
struct Think {
    /// The tokens that close a block (`\n</think>\n\n`), while there is a budget to keep.
    close: Option<Vec<u32>>,
    /// The output's text (what the stop matcher holds back included) split as the answer's
    /// reasoning is, to follow it in and out of the block.
    split: think::Splitter,
    /// Tokens generated inside the block so far.
    used: usize,
}

/// Speculation state ([`GenerationConfig::lookup`], or [`GenerationConfig::draft`] with the
/// engine's draft model proposing).
struct Lookup {
    /// `None`: the engine's draft model proposes.
    proposer: Option<PromptLookup>,
    spec: speculative::SpecConfig,
    k: usize,
    rng: StdRng,
    scratch: Vec<f32>,
}

impl Decoder {
    pub(crate) fn new(pipeline: &Model, prompt: Vec<u32>, mut cfg: GenerationConfig, submitted: Instant) -> Result<Self> {
        if let Some(k) = cfg.logprobs {
            if k > crate::MAX_TOP_LOGPROBS {
                return Err(Error::InvalidOptions(format!("logprobs: at most {} alternatives per token, not {k}", crate::MAX_TOP_LOGPROBS)));
            }
            // Every token from its own logits.
            cfg.fast_forward = false;
            cfg.lookup = None;
            cfg.draft = None;
        }
        if cfg.lookup.is_some() && cfg.draft.is_some() {
            return Err(Error::InvalidOptions("prompt lookup and a draft model cannot both propose for one request".into()));
        }
        let sampler = Sampler::new(cfg.sampling.clone())?;
        let matcher = cfg.constraint.as_ref().map(|g| Matcher::new(g.clone(), pipeline.token_index()));
        let spec = match (&cfg.lookup, &cfg.draft) {
            (Some(l), _) => Some((Some(PromptLookup { max_ngram: l.max_ngram.max(1) }), l.spec.clone())),
            (None, Some(d)) => Some((None, d.clone())),
            (None, None) => None,
        };
        let lookup = match spec {
            Some(_) if matcher.is_some() => return Err(Error::Unsupported("constrained generation with speculative decoding")),
            Some((proposer, spec)) => Some(Lookup {
                proposer,
                k: {
                    spec.validate()?;
                    spec.k.clamp(spec.k_min, spec.k_max)
                },
                spec,
                // Its own stream, seeded from the request's seed (acceptance draws).
                rng: match cfg.sampling.seed {
                    Some(s) => StdRng::seed_from_u64(s ^ 0x5eed_5eed_5eed_5eed),
                    None => StdRng::from_os_rng(),
                },
                scratch: Vec::new(),
            }),
            None => None,
        };
        let mut think = Think { close: None, split: think::Splitter::new(false), used: 0 };
        if let Some(_budget) = cfg.reasoning_budget {
            let tok = pipeline.tokenizer();
            think.close = Some(tok.encode("\n</think>\n\n", false)?);
            // A prompt that ends by opening the block (the template's, or a raw prompt's).
            let tail = &prompt[prompt.len().saturating_sub(8)..];
            think.split = think::Splitter::new(think::prompt_opens(&tok.decode(tail, false)?));
        }
        Ok(Self {
            think,
            lookup,
            sampler,
            matcher,
            detok: TokenStream::new(pipeline.tokenizer().clone(), cfg.skip_special_tokens),
            stops: StopMatcher::new(cfg.stop.clone()),
            cfg,
            text: String::new(),
            stats: GenerationStats { prompt_tokens: prompt.len(), ..Default::default() },
            prompt_len: prompt.len(),
            tokens: prompt,
            submitted,
            started: None,
            first_token: None,
            logprobs: Vec::new(),
            logprobs_given: 0,
        })
    }

    /// The log-probabilities of tokens chosen since the last call (none unless asked for).
    pub(crate) fn new_logprobs(&mut self) -> Vec<TokenLogprob> {
        let new = self.logprobs[self.logprobs_given..].to_vec();
        self.logprobs_given = self.logprobs.len();
        new
    }

    pub(crate) fn prompt_len(&self) -> usize {
        self.prompt_len
    }

    pub(crate) fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub(crate) fn generated(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }

    /// Choose the next token from `logits` (which the sampler may change in place), plus the
    /// run of tokens a constraint forces after it, and append them to the tokens; their text
    /// goes to `emit` (held back while it may start a stop string), which returns `false`
    /// when nobody listens any more. `Some` when the sequence is done; else the tokens to
    /// feed next are the last `fed` of [`tokens`](Self::tokens).
    pub(crate) fn advance(
        &mut self,
        logits: &mut [f32],
        eos: &[u32],
        emit: &mut dyn FnMut(String) -> bool,
        fed: &mut usize,
    ) -> Result<Option<FinishReason>> {
        *fed = 0;
        self.stats.forwards += 1;
        if let Some(close) = self.over_budget() {
            // The reasoning budget is spent: close the block without sampling.
            self.think.close = None;
            self.stats.forced_tokens += close.len();
            self.first_token.get_or_insert_with(Instant::now);
            for t in close {
                if self.cfg.logprobs.is_some() {
                    self.logprobs.push(TokenLogprob { token: t, logprob: 0.0, top: Vec::new() });
                }
                *fed += 1;
                if let Some(reason) = self.push(t, emit)? {
                    return Ok(Some(reason));
                }
                if self.generated().len() >= self.cfg.max_tokens {
                    return Ok(Some(FinishReason::MaxTokens));
                }
            }
            return Ok(None);
        }
        let ts = Instant::now();
        // The model's distribution, before the sampler changes the logits in place.
        let raw = self.cfg.logprobs.map(|_| logits.to_vec());
        let next = match self.matcher.as_mut() {
            Some(m) => self.sampler.sample_constrained(logits, &self.tokens, m)?,
            None => self.sampler.sample(logits, &self.tokens)?,
        };
        let now = Instant::now();
        if self.first_token.is_none() {
            self.first_token = Some(now);
            self.stats.time_to_first_token = now - self.submitted;
            self.stats.prefill = now - self.started.unwrap_or(self.submitted);
        }
        if (!self.cfg.ignore_eos || self.matcher.is_some()) && eos.contains(&next) {
            self.stats.sampling += ts.elapsed();
            return Ok(Some(FinishReason::Eos));
        }
        if let (Some(raw), Some(k)) = (raw, self.cfg.logprobs) {
            self.logprobs.push(TokenLogprob::from_logits(&raw, next, k));
        }
        let mut feed = vec![next];
        if let (Some(m), true) = (self.matcher.as_mut(), self.cfg.fast_forward) {
            while feed.len() < MAX_FORCED_RUN && self.tokens.len() - self.prompt_len + feed.len() < self.cfg.max_tokens {
                match m.forced_token() {
                    Ok(Some(t)) if !eos.contains(&t) => {
                        if m.consume(t).is_err() {
                            break;
                        }
                        feed.push(t);
                    }
                    _ => break,
                }
            }
            self.stats.forced_tokens += feed.len() - 1;
        }
        self.stats.sampling += ts.elapsed();
        for &t in &feed {
            *fed += 1;
            if let Some(reason) = self.push(t, emit)? {
                return Ok(Some(reason));
            }
        }
        if self.generated().len() >= self.cfg.max_tokens {
            return Ok(Some(FinishReason::MaxTokens));
        }
        // A complete text with nothing but end-of-sequence left: done, no forward needed.
        if let Some(m) = self.matcher.as_mut() {
            if m.is_accepting() && m.mask().map(|mk| mk.iter().all(|t| eos.contains(&t))).unwrap_or(false) {
                return Ok(Some(FinishReason::Eos));
            }
        }
        Ok(None)
    }

    /// With prompt lookup: up to `room` tokens guessed to follow [`tokens`](Self::tokens)
    /// (fewer near the token limit: the verification adds one of its own).
    pub(crate) fn propose(&mut self, room: usize) -> Vec<u32> {
        let left = self.cfg.max_tokens.saturating_sub(self.generated().len() + 1);
        let Some(l) = self.lookup.as_mut() else { return Vec::new() };
        let want = l.k.min(room).min(left);
        let Some(proposer) = l.proposer.as_mut().filter(|_| want > 0) else {
            return Vec::new();
        };
        match proposer.propose(&self.tokens, want, &self.cfg.sampling, &mut l.rng) {
            Ok(p) => p.tokens,
            Err(_) => Vec::new(),
        }
    }

    /// With [`GenerationConfig::draft`]: [`SpecConfig::draft_vocab`](speculative::SpecConfig::draft_vocab).
    pub(crate) fn draft_vocab(&self) -> Option<usize> {
        self.lookup.as_ref().and_then(|l| l.spec.draft_vocab)
    }

    /// With [`GenerationConfig::draft`]: how many tokens the engine's draft model should
    /// propose after [`tokens`](Self::tokens), at most `room` (0: none this step).
    pub(crate) fn draft_wanted(&self, room: usize) -> usize {
        let left = self.cfg.max_tokens.saturating_sub(self.generated().len() + 1);
        match &self.lookup {
            Some(l) if l.proposer.is_none() => l.k.min(room).min(left),
            _ => 0,
        }
    }

    /// Verify `drafts` (fed after the newest token) against the logits of those rows
    /// (`drafts.len() + 1` rows of `vocab`), keep the accepted ones and the token the model
    /// chose after them, as [`advance`](Self::advance) keeps a sampled token. `fed`: how many
    /// of the drafts were accepted.
    pub(crate) fn verify(
        &mut self,
        rows: &[f32],
        vocab: usize,
        drafts: &[u32],
        eos: &[u32],
        emit: &mut dyn FnMut(String) -> bool,
        accepted: &mut usize,
    ) -> Result<Option<FinishReason>> {
        *accepted = 0;
        let Some(l) = self.lookup.as_mut() else {
            return Err(Error::Worker("verification without speculative decoding".into()));
        };
        self.stats.forwards += 1;
        let ts = Instant::now();
        let proposal = Proposal { tokens: drafts.to_vec(), dists: None };
        let (n, next) = speculative::verify(rows, vocab, &proposal, &self.tokens, &self.cfg.sampling, &mut l.rng, &mut l.scratch)?;
        let Some(next) = next else {
            return Err(Error::Worker("verification rows missing".into()));
        };
        // K follows the acceptance rate, as in `speculative::generate`.
        l.k = l.spec.next_k(l.k, n, drafts.len());
        self.stats.proposed_tokens += drafts.len();
        self.stats.accepted_tokens += n;
        self.stats.sampling += ts.elapsed();
        *accepted = n;
        for &t in drafts[..n].iter().chain(std::iter::once(&next)) {
            if !self.cfg.ignore_eos && eos.contains(&t) {
                return Ok(Some(FinishReason::Eos));
            }
            if let Some(reason) = self.push(t, emit)? {
                return Ok(Some(reason));
            }
            if self.generated().len() >= self.cfg.max_tokens {
                return Ok(Some(FinishReason::MaxTokens));
            }
        }
        Ok(None)
    }

    /// The tokens that close the `<think>` block, when the budget for it is spent.
    fn over_budget(&self) -> Option<Vec<u32>> {
        let budget = self.cfg.reasoning_budget?;
        match &self.think.close {
            Some(close) if self.think.split.in_block() && self.think.used >= budget => Some(close.clone()),
            _ => None,
        }
    }

    /// Follow the output in and out of a `<think>` block (while there is a budget to keep).
    fn track_think(&mut self, piece: &str) {
        if self.think.close.is_none() {
            return;
        }
        let was_in = self.think.split.in_block();
        if was_in {
            self.think.used += 1;
        }
        self.think.split.push(piece);
        if !was_in && self.think.split.in_block() {
            self.think.used = 0;
        }
        // The block closed, or the answer started without one: nothing left to budget.
        if !self.think.split.in_block() && !self.think.split.may_open() {
            self.think.close = None;
        }
    }

    /// Append a chosen token and emit its text; `Some` when that ends the sequence.
    fn push(&mut self, t: u32, emit: &mut dyn FnMut(String) -> bool) -> Result<Option<FinishReason>> {
        self.tokens.push(t);
        let piece = self.detok.push(t)?.unwrap_or_default();
        self.track_think(&piece);
        let out = self.stops.push(&piece);
        if !out.emit.is_empty() {
            self.text.push_str(&out.emit);
            if !emit(out.emit) {
                return Ok(Some(FinishReason::Cancelled));
            }
        }
        if out.stopped {
            return Ok(Some(FinishReason::Stop));
        }
        Ok(None)
    }

    /// The whole generation, once it ended for `finish`: the text still held back goes to
    /// `emit` first.
    pub(crate) fn result(&mut self, mut finish: FinishReason, emit: &mut dyn FnMut(String) -> bool) -> Result<Generation> {
        let rest = flush_tail(&mut self.detok, &mut self.stops, &mut finish)?;
        if !rest.is_empty() {
            self.text.push_str(&rest);
            let _ = emit(rest);
        }
        self.stats.decode = self.first_token.map_or(Duration::ZERO, |f| f.elapsed());
        self.stats.generated_tokens = self.generated().len();
        let (reasoning, text) = match split_reasoning(&self.text) {
            (Some(r), answer) => (Some(r), answer),
            (None, _) => (None, std::mem::take(&mut self.text)),
        };
        Ok(Generation {
            text,
            reasoning,
            logprobs: std::mem::take(&mut self.logprobs),
            tokens: self.generated().to_vec(),
            finish,
            stats: self.stats.clone(),
        })
    }
}
