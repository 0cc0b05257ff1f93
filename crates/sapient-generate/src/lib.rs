//! `sapient-generate`: from a model id to streamed text.
//!
//! ```no_run
//! use sapient_generate::{GenerationConfig, Message, Pipeline};
//! # fn main() -> Result<(), sapient_generate::Error> {
//! let pipe = Pipeline::from_pretrained("smollm2-135m-instruct")?;
//! let out = pipe.chat(&[Message::user("What is the capital of France?")], &GenerationConfig::default())?;
//! println!("{}", out.text);
//! # Ok(()) }
//! ```
//!
//! A [`Pipeline`] is a cheap handle (clone it freely). Its generations run on its own
//! [`Engine`], so calls from several threads are decoded together in one batched forward
//! per step, and each generation reuses the longest prefix of the previous one already in
//! the KV cache, so a chat only processes each turn's new tokens. For many requests with
//! their own streams (a server), use an [`Engine`] directly.

pub mod chat;
pub mod engine;
mod decode;
mod generation;
mod model;
mod pipeline;
pub mod speculative;
mod stream;
pub mod task;

pub use chat::split_reasoning;
pub use generation::{FinishReason, Generation, GenerationConfig, GenerationStats, TokenLogprob, MAX_TOP_LOGPROBS};
pub use model::{Model, ModelInfo};
pub use pipeline::{Drafter, Pipeline, PipelineOptions};
pub use sapient_hub::Progress;
pub use sapient_sample::{Expr, Grammar, JsonOptions, SamplerConfig};
pub use sapient_tensor::DeviceRequest;
pub use sapient_tokenizers::Message;
pub use engine::{ContextPolicy, Engine, EngineMetrics, EngineOptions, Event, RequestHandle, SavedSession, Session};
pub use sapient_llama::{KvBudget, KvDtype, KvLayout, KvOptions, LoraInfo, LoraUse};
pub use stream::TextStream;
pub use task::{Task, TaskBuilder, TaskStream};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(transparent)]
    Hub(#[from] sapient_hub::Error),
    #[error(transparent)]
    Tokenizer(#[from] sapient_tokenizers::Error),
    #[error(transparent)]
    Model(#[from] sapient_llama::Error),
    #[error(transparent)]
    Weights(#[from] sapient_tensor::Error),
    #[error(transparent)]
    Sample(#[from] sapient_sample::Error),
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    #[error("'{reference}' is a {kind} model, not a language model")]
    NotALanguageModel { reference: String, kind: String },
    #[error("'{reference}': no model file found ({what})")]
    NoModelFile { reference: String, what: String },
    #[error("the prompt is {tokens} tokens but the context holds {max} (leave room for at least one new token)")]
    PromptTooLong { tokens: usize, max: usize },
    #[error("model '{0}' has no chat template in its metadata; use generate() with a raw prompt")]
    NoChatTemplate(String),
    #[error("'{draft}' cannot draft for '{target}': {what}")]
    VocabMismatch { target: String, draft: String, what: String },
    #[error("empty prompt")]
    EmptyPrompt,
    #[error("not supported: {0}")]
    Unsupported(&'static str),
    #[error(transparent)]
    Parse(#[from] sapient_sample::ParseError),
    #[error("the request needs {needed} KV positions but the engine's cache holds {capacity} (raise the engine's KV budget)")]
    TooLargeForCache { needed: usize, capacity: usize },
    #[error("invalid options: {0}")]
    InvalidOptions(String),
    #[error("the generation worker stopped unexpectedly: {0}")]
    Worker(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The README's example, compiled as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctest;
