//! `sapient-sample`: logits processors and seeded sampling.
//!
//! The chain runs in this documented order (the order of Hugging Face `generate`):
//! 1. repetition penalty (CTRL-style: positive logits divided, negative multiplied),
//!    presence and frequency penalties, over the last `penalty_last_n` tokens;
//! 2. logit bias;
//! 3. temperature (0 means greedy: the arg-max is taken and nothing else runs);
//! 4. top-k, 5. top-p (nucleus), 6. min-p (relative to the most likely token);
//! 7. a draw from the remaining distribution with a seeded RNG.
//!
//! The same seed, logits and history give the same token.
//!
//! Structured generation: [`Expr`] / [`Grammar`] (regex, choice, literal, ranged numbers,
//! sequence, repetition, stop-on-string, free JSON, JSON Schema) implement the
//! [`Constraint`] trait, an incremental byte-level parser with cloneable states;
//! [`TokenIndex`] computes token masks over a vocabulary trie; [`Matcher`] follows a
//! generation token by token; [`Sampler::sample_constrained`] checks candidates in
//! probability order and computes a full mask only when none of them is valid.
//!
//! ```
//! use sapient_sample::{Expr, Grammar, Matcher, Sampler, SamplerConfig, TokenIndex};
//! use std::sync::Arc;
//!
//! // A toy vocabulary (a real one comes from `Tokenizer::token_bytes`); id 0 ends the text.
//! let vocab: Vec<Vec<u8>> = ["</s>", "{", "}", "\"", ":", "age", "name", " ", "4", "2", "x"]
//!     .iter().map(|t| t.as_bytes().to_vec()).collect();
//! let index = Arc::new(TokenIndex::new(vocab, &[0], &[]));
//! let schema = serde_json::json!({"type": "object", "properties": {"age": {"type": "integer", "maximum": 120}}, "required": ["age"]});
//! let grammar = Arc::new(Grammar::json_schema(&schema)?);
//! let mut m = Matcher::new(grammar, index);
//! let mut sampler = Sampler::new(SamplerConfig::greedy())?;
//! let mut text = Vec::new();
//! loop {
//!     let mut logits = vec![0.0f32; 11];
//!     logits[10] = 5.0; // the "model" wants "x", which is never allowed
//!     logits[8] = 1.0;  // then "4"
//!     let t = sampler.sample_constrained(&mut logits, &[], &mut m)?;
//!     if t == 0 { break; }
//!     text.extend_from_slice(m.index().token_bytes(t).unwrap_or_default());
//! }
//! let text = String::from_utf8(text).unwrap();
//! assert_eq!(serde_json::from_str::<serde_json::Value>(&text)?["age"].as_u64().map(|a| a <= 120), Some(true));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

// Modules from the bottom layer up; each uses only the ones listed before it.
mod error;
mod hash;
mod dfa;
mod vocab;
mod constraint;
mod matcher;
mod builder;
mod number;
mod schema;
mod spec;
mod grammar;
mod gbnf;
mod validate;
pub mod typed;
mod recommended;
mod repetition;
mod sampler;

pub use builder::{JsonLayout, JsonOptions, MAX_STACK_DEPTH};
pub use constraint::Constraint;
pub use error::GrammarError;
pub use gbnf::{MAX_GBNF_BYTES, MAX_GBNF_RULES};
pub use grammar::{Expr, Frame, Grammar, GrammarState, Tool};
pub use matcher::{Matcher, MatcherStats};
pub use dfa::{MAX_PATTERN_BYTES, MAX_REGEX_STATES};
pub use schema::{refused_keywords, strict_schema, ANNOTATIONS, MAX_SCHEMA_DEPTH, SUPPORTED_KEYWORDS};
pub use vocab::{TokenIndex, TokenMask, Tokenize};
pub use repetition::{Repetition, RepetitionDetector, RepetitionOptions};
/// `#[derive(Schema, Parse)]` (the traits of the same names are in [`typed`]).
pub use sapient_derive::{Parse, Schema};
pub use typed::{Parse, ParseError, Schema};
pub use validate::{validate, Invalid};
pub use sampler::{apply_penalties, argmax, filtered_distribution, Sampler, SamplerConfig};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("invalid sampling parameter: {0}")]
    InvalidParameter(String),
    #[error("no token can be sampled: every logit is -inf or NaN")]
    NoCandidates,
    #[error(transparent)]
    Grammar(#[from] GrammarError),
    #[error("token {0} is not allowed by the constraint here")]
    TokenRejected(u32),
    #[error("text {0:?} is not allowed by the constraint here")]
    BytesRejected(String),
    #[error("the constraint reached a dead end: no token of the vocabulary can continue it")]
    DeadEnd,
    #[error("cannot roll back {requested} steps, only {available} were taken")]
    Rollback { requested: usize, available: usize },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;


/// The README's example, compiled as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctest;
