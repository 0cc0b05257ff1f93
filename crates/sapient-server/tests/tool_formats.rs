//! Tool calls in the Llama 3, Mistral and gpt-oss (harmony) syntaxes: SmolLM2's weights under
//! Llama 3.2's, Mistral's and gpt-oss's own chat templates (tests/data/tokenizers/templates),
//! so the server picks each family's format from the template. A required call comes back as OpenAI `tool_calls`,
//! whole and streamed (the arguments in pieces as they are generated), with arguments that
//! follow the schema; the call and its result go
//! back through the template (Mistral's checks its nine-character call ids) to a final
//! answer.

mod common;

use anyhow::{ensure, Context, Result};
use common::*;
use sapient_generate::{Pipeline, PipelineOptions};
use sapient_server::ServerOptions;
use serde_json::{json, Value};
use std::time::Duration;

fn with_template(file: &str) -> Result<Pipeline> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/tokenizers/templates").join(file);
    let template = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
    Ok(Pipeline::load(MODEL, PipelineOptions { max_seq_len: Some(2048), chat_template: Some(template), ..Default::default() }, |_| {})?)
}

fn weather() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}}, "required": ["city"], "additionalProperties": false}}}])
}

async fn round_trip(file: &str, id_len: Option<usize>) -> Result<()> {
    let pipe = with_template(file)?;
    let s = start_with(&pipe, ServerOptions::default()).await?;
    let question = json!([{"role": "user", "content": "What is the weather in Paris?"}]);
    let req = json!({"model": MODEL, "messages": question, "tools": weather(), "tool_choice": "required", "max_tokens": 48, "temperature": 0});
    let r = post(s.addr, "/v1/chat/completions", &req).await?;
    ensure!(r.status == 200, "{file}: {}", r.text());
    let v = r.json()?;
    ensure!(v["choices"][0]["finish_reason"] == "tool_calls", "{file}: {v}");
    let call = &v["choices"][0]["message"]["tool_calls"][0];
    ensure!(call["function"]["name"] == "get_weather", "{file}: {v}");
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().context("arguments")?)?;
    ensure!(args["city"].as_str().is_some_and(|c| !c.is_empty() && c.chars().count() <= 30) && args.as_object().map(|o| o.len()) == Some(1), "{file}: {args}");
    let id = call["id"].as_str().context("id")?.to_string();
    if let Some(n) = id_len {
        ensure!(id.len() == n && id.bytes().all(|b| b.is_ascii_alphanumeric()), "{file}: id {id}");
    }

    // Streamed: the same call, from the tool_calls deltas.
    let mut sreq = req.clone();
    sreq["stream"] = json!(true);
    let events = post(s.addr, "/v1/chat/completions", &sreq).await?.events();
    // As OpenAI streams them: a first delta with the id, type and name, then the arguments
    // in pieces as they are generated, which put together are the whole answer's arguments.
    let (mut name, mut streamed_args, mut deltas) = (String::new(), String::new(), Vec::new());
    for e in &events[..events.len().saturating_sub(1)] {
        let c: Value = serde_json::from_str(e)?;
        for tc in c["choices"][0]["delta"]["tool_calls"].as_array().into_iter().flatten() {
            ensure!(tc["index"] == 0, "{file}: {tc}");
            name.push_str(tc["function"]["name"].as_str().unwrap_or_default());
            streamed_args.push_str(tc["function"]["arguments"].as_str().unwrap_or_default());
            deltas.push(tc.clone());
        }
    }
    let first = deltas.first().context("no tool_calls delta")?;
    ensure!(
        first["id"].as_str().is_some_and(|i| !i.is_empty()) && first["type"] == "function" && first["function"]["name"] == "get_weather",
        "{file}: first delta {first}"
    );
    let arg_pieces = deltas.iter().filter(|d| d["function"]["arguments"].as_str().is_some_and(|a| !a.is_empty())).count();
    ensure!(arg_pieces > 1, "{file}: the arguments came in {arg_pieces} delta(s): {deltas:?}");
    ensure!(deltas[1..].iter().all(|d| d.get("id").is_none() && d["function"].get("name").is_none()), "{file}: {deltas:?}");
    ensure!(
        name == "get_weather" && streamed_args == call["function"]["arguments"].as_str().unwrap_or_default() && serde_json::from_str::<Value>(&streamed_args)? == args,
        "{file}: streamed {name} {streamed_args}"
    );
    eprintln!("{file}: arguments in {arg_pieces} deltas");

    // The call and its result go back through the template to an answer.
    let mut turns = question.as_array().context("array")?.clone();
    turns.push(json!({"role": "assistant", "content": null, "tool_calls": [call]}));
    turns.push(json!({"role": "tool", "tool_call_id": id, "content": "{\"temperature_c\": 21, \"sky\": \"clear\"}"}));
    let r = post(s.addr, "/v1/chat/completions", &json!({"model": MODEL, "messages": turns, "tools": weather(), "tool_choice": "none", "max_tokens": 16, "temperature": 0})).await?;
    ensure!(r.status == 200, "{file}: {}", r.text());
    let v = r.json()?;
    // (What SmolLM2 answers under a foreign template may be empty; that it is an answer, not
    // a call, and that the template took the call and its result, is the point.)
    ensure!(v["choices"][0]["message"]["content"].is_string() && v["choices"][0]["message"]["tool_calls"].is_null(), "{file}: {v}");
    eprintln!("{file}: get_weather({args}) id {id}; after the result: {:?}", v["choices"][0]["message"]["content"]);
    if id_len.is_some() {
        // Mistral's template refuses call ids of another length: a 400 that says so.
        turns[1]["tool_calls"][0]["id"] = json!("call_1");
        turns[2]["tool_call_id"] = json!("call_1");
        let r = post(s.addr, "/v1/chat/completions", &json!({"model": MODEL, "messages": turns, "max_tokens": 4})).await?;
        ensure!(r.status == 400 && r.text().contains("length 9"), "{file}: {} {}", r.status, r.text());
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llama3_and_mistral_tool_calls() -> Result<()> {
    tokio::time::timeout(Duration::from_secs(240), async {
        round_trip("llama3.2.jinja", None).await?;
        round_trip("mistral-v3.jinja", Some(9)).await?;
        round_trip("gpt-oss.jinja", None).await
    })
    .await?
}

/// gpt-oss's channels: the analysis channel comes back as `reasoning_content`, the final one
/// as `content`, whole and streamed (the output forced by a grammar, since SmolLM2 does not
/// write harmony by itself).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn harmony_channels() -> Result<()> {
    let pipe = with_template("gpt-oss.jinja")?;
    let s = start_with(&pipe, ServerOptions::default()).await?;
    let forced = r#"root ::= "<|channel|>analysis<|message|>The user greets me.<|end|><|start|>assistant<|channel|>final<|message|>Hello there!""#;
    let req = json!({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "grammar": forced, "max_tokens": 64, "temperature": 0});
    let r = post(s.addr, "/v1/chat/completions", &req).await?;
    ensure!(r.status == 200, "{}", r.text());
    let v = r.json()?;
    let m = &v["choices"][0]["message"];
    ensure!(m["reasoning_content"] == "The user greets me." && m["content"] == "Hello there!" && m["tool_calls"].is_null(), "{v}");
    let mut sreq = req.clone();
    sreq["stream"] = json!(true);
    let events = post(s.addr, "/v1/chat/completions", &sreq).await?.events();
    let (mut reasoning, mut content) = (String::new(), String::new());
    for e in &events[..events.len().saturating_sub(1)] {
        let c: Value = serde_json::from_str(e)?;
        reasoning.push_str(c["choices"][0]["delta"]["reasoning_content"].as_str().unwrap_or_default());
        content.push_str(c["choices"][0]["delta"]["content"].as_str().unwrap_or_default());
    }
    ensure!(reasoning == "The user greets me." && content == "Hello there!", "streamed {reasoning:?} {content:?}");
    Ok(())
}
