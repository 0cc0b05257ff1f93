//! What the chat-like endpoints share past the prompt: the choices in flight per model, each
//! choice's split of its text into reasoning, content and tool calls, and [`Turn`], one
//! generation driven for the endpoints that answer a single message (Anthropic Messages,
//! Responses) with its pieces as chat completions parses them.

use crate::error::{from_generate, ApiError};
use crate::tools::{self, Piece};
use crate::{AppState, Llm};
use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use sapient_generate::chat::OutputParser;
use sapient_generate::{Event, FinishReason, Generation, GenerationConfig, RequestHandle};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;

/// What a request turns into before it is submitted.
pub(crate) struct Prepared {
    /// One prompt per choice group (chat: one; completions: one per prompt).
    pub(crate) prompts: Vec<Vec<u32>>,
    pub(crate) cfg: GenerationConfig,
    pub(crate) n: usize,
    pub(crate) stream: bool,
    pub(crate) include_usage: bool,
    /// Tools are on: parse `<tool_call>` blocks out of the text.
    pub(crate) tools: bool,
    /// Chat: split a `<think>` block into `reasoning_content`; `Some(true)` when the prompt
    /// opened the block already.
    pub(crate) reasoning: Option<bool>,
    /// The model's tool-call syntax.
    pub(crate) tool_format: tools::Format,
    /// The conversation slot it runs in (`id_slot`).
    pub(crate) slot: Option<u32>,
}

/// Choices in flight for one model; given back when dropped.
pub(crate) struct InFlight {
    llm: Arc<Llm>,
    n: usize,
}

impl InFlight {
    pub(crate) fn take(st: &AppState, llm: &Arc<Llm>, n: usize) -> Result<Self, ApiError> {
        let limit = st.opts.max_queue.max(1);
        let prev = llm.in_flight.fetch_add(n, Ordering::SeqCst);
        if prev + n > limit {
            llm.in_flight.fetch_sub(n, Ordering::SeqCst);
            return Err(ApiError::overloaded(1));
        }
        Ok(Self { llm: llm.clone(), n })
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.llm.in_flight.fetch_sub(self.n, Ordering::SeqCst);
    }
}

/// Per choice: its parser and what it has said.
pub(crate) struct ChoiceState {
    pub(crate) format: tools::Format,
    pub(crate) parser: OutputParser,
    pub(crate) reasoning: String,
    pub(crate) call_ids: Vec<String>,
    pub(crate) content: String,
    pub(crate) calls: Vec<(String, String, String)>,
    pub(crate) started: bool,
    pub(crate) last: Option<Instant>,
    pub(crate) result: Option<Result<Generation, ApiError>>,
    /// Streaming with logprobs: a step's pieces wait for its log-probabilities.
    pub(crate) held: Vec<Piece>,
}

impl ChoiceState {
    pub(crate) fn new(tools: bool, reasoning: Option<bool>, format: tools::Format) -> Self {
        Self {
            format,
            parser: OutputParser::new(reasoning, format, tools),
            reasoning: String::new(),
            call_ids: vec![],
            content: String::new(),
            calls: vec![],
            started: false,
            last: None,
            result: None,
            held: Vec::new(),
        }
    }
    /// Split a piece of generated text into reasoning, content and call pieces.
    pub(crate) fn pieces(&mut self, text: &str) -> Vec<Piece> {
        self.parser.push(text)
    }
    pub(crate) fn finish_pieces(&mut self) -> Vec<Piece> {
        self.parser.finish()
    }
    /// Keep the pieces (for the whole answer) and give their ids to new calls.
    pub(crate) fn record(&mut self, pieces: &[Piece]) {
        for p in pieces {
            match p {
                Piece::Content(c) => self.content.push_str(c),
                Piece::Reasoning(r) => self.reasoning.push_str(r),
                Piece::CallStart { name, .. } => {
                    let id = self.format.call_id(&crate::new_id("call_"));
                    self.call_ids.push(id.clone());
                    self.calls.push((id, name.clone(), String::new()));
                }
                Piece::CallArgs { index, text } => {
                    if let Some(c) = self.calls.get_mut(*index) {
                        c.2.push_str(text);
                    }
                }
            }
        }
    }
    pub(crate) fn finish_reason(&self, g: &Generation) -> &'static str {
        match g.finish {
            FinishReason::MaxTokens | FinishReason::ContextFull => "length",
            _ if !self.calls.is_empty() => "tool_calls",
            _ => "stop",
        }
    }
}

/// One handle's events, tagged with its index.
type Tagged = std::pin::Pin<Box<dyn futures::Stream<Item = (usize, Event)> + Send>>;

/// Every handle's events, tagged with the handle's index, as they come.
pub(crate) fn merged(handles: Vec<RequestHandle>) -> futures::stream::SelectAll<Tagged> {
    futures::stream::select_all(handles.into_iter().enumerate().map(|(i, h)| {
        let s = futures::stream::unfold(h, |mut h| async move { h.next().await.map(|e| (e, h)) }).map(move |e| (i, e));
        Box::pin(s) as Tagged
    }))
}

pub(crate) fn tokio_stream_from(rx: mpsc::Receiver<Bytes>) -> impl futures::Stream<Item = Result<Bytes, std::convert::Infallible>> {
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (Ok(b), rx)) })
}


/// A step of a [`Turn`].
pub(crate) enum Step {
    /// More of the answer (never empty).
    Pieces(Vec<Piece>),
    /// The end: the last pieces (what was held back) and the generation.
    Done(Vec<Piece>, Generation),
    Failed(ApiError),
}

/// One generation of a chat request (one prompt, one choice), read step by step; dropping it
/// cancels the generation.
pub(crate) struct Turn {
    handle: RequestHandle,
    /// What the answer has said so far (content, reasoning, calls and their ids).
    pub(crate) state: ChoiceState,
    llm: Arc<Llm>,
    _guard: InFlight,
    t0: Instant,
    pub(crate) prompt_tokens: usize,
    done: bool,
}

impl Turn {
    /// Submit a prepared chat request of one prompt and one choice.
    pub(crate) fn start(st: &AppState, llm: Arc<Llm>, p: Prepared) -> Result<Self, ApiError> {
        let prompt = p.prompts.into_iter().next().ok_or_else(|| ApiError::internal("no prompt"))?;
        let guard = InFlight::take(st, &llm, 1)?;
        let prompt_tokens = prompt.len();
        // These routes (Messages, Responses) have no `lora` field: the global scales apply.
        let cfg = GenerationConfig { lora: llm.lora.global(), ..p.cfg };
        let handle = crate::slots::submit(&llm, p.slot, prompt, cfg)?;
        let state = ChoiceState::new(p.tools, p.reasoning, p.tool_format);
        Ok(Self { handle, state, llm, _guard: guard, t0: Instant::now(), prompt_tokens, done: false })
    }

    /// The next step; `None` after the end.
    pub(crate) async fn next(&mut self) -> Option<Step> {
        while !self.done {
            let Some(ev) = self.handle.next().await else {
                return Some(self.fail(ApiError::internal("the engine stopped before the request ended")));
            };
            match ev {
                Event::Text(t) => {
                    let now = Instant::now();
                    match self.state.last.replace(now) {
                        None => self.llm.stats.ttft.observe(self.t0.elapsed()),
                        Some(l) => self.llm.stats.inter_token.observe(now - l),
                    }
                    let pieces = self.state.pieces(&t);
                    self.state.record(&pieces);
                    if !pieces.is_empty() {
                        return Some(Step::Pieces(pieces));
                    }
                }
                Event::Done(Ok(g)) => {
                    let pieces = self.state.finish_pieces();
                    self.state.record(&pieces);
                    self.done = true;
                    self.llm.stats.e2e.observe(self.t0.elapsed());
                    self.llm.stats.requests_ok.fetch_add(1, Ordering::Relaxed);
                    return Some(Step::Done(pieces, g));
                }
                Event::Done(Err(e)) => return Some(self.fail(from_generate(e))),
                _ => {}
            }
        }
        None
    }

    fn fail(&mut self, e: ApiError) -> Step {
        self.done = true;
        self.llm.stats.requests_failed.fetch_add(1, Ordering::Relaxed);
        Step::Failed(e)
    }

    /// Run to the end: what the answer said, and the generation.
    pub(crate) async fn finish(mut self) -> Result<(ChoiceState, Generation), ApiError> {
        loop {
            match self.next().await {
                Some(Step::Pieces(_)) => {}
                Some(Step::Done(_, g)) => return Ok((std::mem::replace(&mut self.state, ChoiceState::new(false, None, tools::Format::Hermes)), g)),
                Some(Step::Failed(e)) => return Err(e),
                None => return Err(ApiError::internal("the request ended twice")),
            }
        }
    }

    /// Stream the turn as server-sent events: `first` at once, then what `emit` makes of each
    /// step (given the answer so far). Stops, cancelling the generation, when the client goes.
    pub(crate) fn stream(mut self, first: Vec<Bytes>, mut emit: impl FnMut(&Step, &ChoiceState) -> Vec<Bytes> + Send + 'static) -> Response {
        let (tx, rx) = mpsc::channel::<Bytes>(64);
        tokio::spawn(async move {
            for b in first {
                if tx.send(b).await.is_err() {
                    return;
                }
            }
            loop {
                let step = tokio::select! {
                    _ = tx.closed() => return,
                    s = self.next() => s,
                };
                let Some(step) = step else { return };
                let end = !matches!(step, Step::Pieces(_));
                for b in emit(&step, &self.state) {
                    if tx.send(b).await.is_err() {
                        return;
                    }
                }
                if end {
                    return;
                }
            }
        });
        sse_response(rx)
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        if !self.done {
            self.llm.stats.requests_cancelled.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A server-sent event stream of what comes through `rx`.
pub(crate) fn sse_response(rx: mpsc::Receiver<Bytes>) -> Response {
    let body = Body::from_stream(tokio_stream_from(rx));
    ([(header::CONTENT_TYPE, "text/event-stream"), (header::CACHE_CONTROL, "no-cache")], body).into_response()
}

/// A named server-sent event (`event: NAME`, then its JSON).
pub(crate) fn named_event(name: &str, v: &serde_json::Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {v}\n\n"))
}

/// Whether a generation ended on a stop string, and which one: the stop string that comes
/// first in the decoded tokens (the generation's text has it cut off).
pub(crate) fn matched_stop(llm: &Llm, g: &Generation, stops: &[String]) -> Option<String> {
    if g.finish != FinishReason::Stop || stops.is_empty() {
        return None;
    }
    let text = llm.engine.model().tokenizer().decode(&g.tokens, false).unwrap_or_default();
    let first = stops.iter().filter_map(|s| text.find(s.as_str()).map(|at| (at, s))).min_by_key(|(at, _)| *at);
    Some(first.map(|(_, s)| s.clone()).unwrap_or_else(|| stops[0].clone()))
}
