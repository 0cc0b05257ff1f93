//! Tool calls through the library, the way the server makes them
//! ([`Pipeline::chat_tools_with`]): the tools described in the system prompt, a constraint
//! that requires a call, and the call parsed out of the answer, as the text streams and
//! whole ([`Generation::tool_calls`]), on the real SmolLM2-135M-Instruct (fetched on first
//! use).

use anyhow::{ensure, Context, Result};
use sapient_generate::chat::{ChatTools, Choice, Format, Function, Piece, ToolCall};
use sapient_generate::{GenerationConfig, Message, Pipeline, PipelineOptions};
use serde_json::{json, Value};
use std::ops::ControlFlow;

#[test]
fn a_required_call_comes_back_parsed() -> Result<()> {
    let p = Pipeline::load("smollm2-135m-instruct", PipelineOptions { max_seq_len: Some(1024), ..Default::default() }, |_| {})?;
    let weather = Function::new(
        "get_weather",
        json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}}, "required": ["city"], "additionalProperties": false}),
    );
    let tools = ChatTools { functions: vec![weather], choice: Choice::Required, parallel: false };
    let msgs = [Message::user("What is the weather in Paris?")];
    let cfg = GenerationConfig::default().max_tokens(60);

    // Streamed as the server streams it, and whole from the generation.
    let mut pieces = Vec::new();
    let (g, reply) = p.chat_tools_with(&msgs, &tools, &cfg, |piece| {
        pieces.push(piece.clone());
        ControlFlow::Continue(())
    })?;
    let parsed = g.tool_calls(Format::Hermes);
    ensure!(parsed == reply, "whole {parsed:?}, streamed {reply:?}");
    ensure!(parsed.content.is_empty(), "a required call leaves no text: {:?}", g.text);
    let [ToolCall { name, arguments }] = parsed.calls.as_slice() else { anyhow::bail!("one call expected: {:?}", g.text) };
    ensure!(name == "get_weather", "{name}");
    // The arguments follow the schema: an object with only a short string `city`.
    let args: Value = serde_json::from_str(arguments).with_context(|| format!("arguments are JSON: {arguments}"))?;
    let obj = args.as_object().context("arguments are an object")?;
    let city = obj.get("city").and_then(Value::as_str).context("a string city")?;
    ensure!(obj.len() == 1 && city.chars().count() <= 30, "{args}");

    // The stream gave the same call: its start once, then its arguments in pieces.
    ensure!(pieces.first() == Some(&Piece::CallStart { index: 0, name: name.clone() }), "{pieces:?}");
    let streamed: String = pieces.iter().filter_map(|x| if let Piece::CallArgs { index: 0, text } = x { Some(text.as_str()) } else { None }).collect();
    ensure!(&streamed == arguments, "streamed {streamed:?}, whole {arguments:?}");
    ensure!(pieces.iter().all(|x| matches!(x, Piece::CallStart { .. } | Piece::CallArgs { .. })), "{pieces:?}");
    Ok(())
}
