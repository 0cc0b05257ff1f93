//! One sequence's decoding state: from logits to tokens and text.
//!
//! The engine keeps one [`Decoder`] per request and the single-sequence loop of models
//! without a batched forward keeps one too, so sampling, constraints and their forced runs,
//! end-of-sequence, stop strings, the token limit and the statistics are written once.

use crate::pipeline::{flush_tail, FinishReason, Generation, GenerationConfig, GenerationStats, Pipeline};
use crate::Result;
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
}

impl Decoder {
    pub(crate) fn new(pipeline: &Pipeline, prompt: Vec<u32>, cfg: GenerationConfig, submitted: Instant) -> Result<Self> {
        let sampler = Sampler::new(cfg.sampling.clone())?;
        let matcher = cfg.constraint.as_ref().map(|g| Matcher::new(g.clone(), pipeline.token_index()));
        Ok(Self {
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
        })
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
        let ts = Instant::now();
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
            self.tokens.push(t);
            *fed += 1;
            let piece = self.detok.push(t)?.unwrap_or_default();
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
        Ok(Generation {
            text: std::mem::take(&mut self.text),
            tokens: self.generated().to_vec(),
            finish,
            stats: self.stats.clone(),
        })
    }
}
