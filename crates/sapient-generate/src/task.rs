//! Typed tasks: a system prompt, a Rust type with `#[derive(Schema, Parse)]`, and a model.
//!
//! ```no_run
//! # use sapient_generate::{Pipeline, Task};
//! # #[derive(Debug, sapient_sample::Schema, sapient_sample::Parse)]
//! # struct Character { name: String }
//! # fn main() -> sapient_generate::Result<()> {
//! let model = Pipeline::from_pretrained("smollm2-135m-instruct")?;
//! let task = Task::builder_for::<Character>("You write characters as JSON.").build()?;
//! let mut stream = task.run("A wizard", &model);
//! while let Some(chunk) = stream.blocking_next() {
//!     print!("{chunk}");
//! }
//! let character: Character = stream.result_blocking()?;
//! # Ok(()) }
//! ```

use crate::{GenerationConfig, Message, Pipeline, Result, TextStream};
use futures::Stream;
use sapient_sample::{Grammar, Parse, Schema};
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// A typed task: generating always yields JSON that parses into `T`.
#[derive(Debug, Clone)]
pub struct Task<T> {
    system: String,
    cfg: GenerationConfig,
    _t: PhantomData<fn() -> T>,
}

/// Builds a [`Task`].
#[derive(Debug, Clone)]
pub struct TaskBuilder<T> {
    system: String,
    cfg: GenerationConfig,
    constraint: Option<Arc<Grammar>>,
    _t: PhantomData<fn() -> T>,
}

impl Task<()> {
    /// A task whose answers are `T`s (`T::grammar()` constrains the generation).
    pub fn builder_for<T: Schema + Parse + 'static>(system_prompt: impl Into<String>) -> TaskBuilder<T> {
        TaskBuilder {
            system: system_prompt.into(),
            cfg: GenerationConfig::default().max_tokens(1024),
            constraint: None,
            _t: PhantomData,
        }
    }
}

impl<T: Schema + Parse + 'static> TaskBuilder<T> {
    /// Sampling, token limit and the rest (its `constraint` is replaced by the task's).
    pub fn config(mut self, cfg: GenerationConfig) -> Self {
        self.cfg = cfg;
        self
    }
    /// Use this grammar instead of `T`'s own: any constraint whose output `T::from_json`
    /// can read (for example the schema with tighter bounds).
    pub fn with_constraints(mut self, grammar: Grammar) -> Self {
        self.constraint = Some(Arc::new(grammar));
        self
    }
    pub fn build(self) -> Result<Task<T>> {
        let g = match self.constraint {
            Some(g) => g,
            None => T::grammar().map_err(sapient_sample::Error::from)?,
        };
        let mut cfg = self.cfg;
        cfg.constraint = Some(g);
        Ok(Task { system: self.system, cfg, _t: PhantomData })
    }
}

impl<T: Parse + 'static> Task<T> {
    fn messages(&self, input: &str) -> Vec<Message> {
        vec![Message::system(self.system.clone()), Message::user(input)]
    }
    /// Start the task on `model`: a stream of text chunks that ends in a `T`.
    pub fn run(&self, input: &str, model: &Pipeline) -> TaskStream<T> {
        TaskStream { text: model.stream_chat(&self.messages(input), &self.cfg), _t: PhantomData }
    }
    /// Run to the end on this thread.
    pub fn run_blocking(&self, input: &str, model: &Pipeline) -> Result<T> {
        let g = model.chat(&self.messages(input), &self.cfg)?;
        parse_json(&g.text)
    }
}

fn parse_json<T: Parse>(text: &str) -> Result<T> {
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| sapient_sample::ParseError::Json(format!("{e} in {text:?}")))?;
    Ok(T::from_json(&v)?)
}

/// The text of a running task, then its typed result.
pub struct TaskStream<T> {
    text: TextStream,
    _t: PhantomData<fn() -> T>,
}

impl<T: Parse> TaskStream<T> {
    /// The next chunk, outside an async runtime.
    pub fn blocking_next(&mut self) -> Option<String> {
        self.text.blocking_next()
    }
    /// Wait for the end and parse the value.
    pub async fn result(self) -> Result<T> {
        let g = self.text.finish().await?;
        parse_json(&g.text)
    }
    /// [`Self::result`] outside an async runtime.
    pub fn result_blocking(self) -> Result<T> {
        let g = self.text.finish_blocking()?;
        parse_json(&g.text)
    }
}

impl<T> Stream for TaskStream<T> {
    type Item = String;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<String>> {
        Pin::new(&mut self.text).poll_next(cx)
    }
}
