//! The server over HTTP on 127.0.0.1 (port 0) with the real SmolLM2-135M-Instruct: chat whole
//! and streamed, completions, JSON Schema output, a tool-call round trip, error statuses, the
//! queue limit, and a client that disconnects mid-stream (its sequence and KV blocks are freed).

mod common;

use anyhow::{ensure, Context, Result};
use common::*;
use sapient_generate::{GenerationConfig, Message};
use sapient_server::ServerOptions;
use serde_json::{json, Value};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const LIMIT: Duration = Duration::from_secs(240);

fn question() -> Value {
    json!([{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "What is the capital of France?"}])
}

/// Content of a stream's chat deltas joined, the finish reasons, and the usage chunk.
fn join_stream(events: &[String]) -> Result<(String, Vec<String>, Option<Value>)> {
    ensure!(events.last().map(String::as_str) == Some("[DONE]"), "stream does not end with [DONE]: {events:?}");
    let mut text = String::new();
    let mut reasons = Vec::new();
    let mut usage = None;
    for e in &events[..events.len() - 1] {
        let v: Value = serde_json::from_str(e).with_context(|| format!("event {e}"))?;
        ensure!(v["object"] == "chat.completion.chunk", "{v}");
        if v["usage"].is_object() {
            ensure!(v["choices"].as_array().is_some_and(|c| c.is_empty()), "the usage chunk has no choices: {v}");
            usage = Some(v["usage"].clone());
        }
        for c in v["choices"].as_array().into_iter().flatten() {
            if let Some(t) = c["delta"]["content"].as_str() {
                text.push_str(t);
            }
            if let Some(r) = c["finish_reason"].as_str() {
                reasons.push(r.to_string());
            }
        }
    }
    Ok((text, reasons, usage))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_whole_and_streamed_match_the_pipeline() -> Result<()> {
    tokio::time::timeout(LIMIT, async {
        let s = start(ServerOptions::default()).await?;
        let health = get(s.addr, "/health").await?;
        ensure!(health.status == 200, "health {}", health.text());
        let models = get(s.addr, "/v1/models").await?.json()?;
        ensure!(models["data"][0]["id"] == MODEL, "{models}");

        let req = json!({"model": MODEL, "messages": question(), "max_tokens": 24, "temperature": 0});
        let r = post(s.addr, "/v1/chat/completions", &req).await?;
        ensure!(r.status == 200, "{}", r.text());
        let v = r.json()?;
        let answer = v["choices"][0]["message"]["content"].as_str().context("content")?.to_string();
        // The engine behind the server gives what the plain pipeline gives, greedily.
        let msgs = vec![Message::system("You are a helpful assistant."), Message::user("What is the capital of France?")];
        let want = pipeline().chat(&msgs, &GenerationConfig::default().max_tokens(24))?;
        ensure!(answer == want.text, "server {answer:?} vs pipeline {:?}", want.text);
        ensure!(answer.contains("Paris"), "{answer}");
        ensure!(v["object"] == "chat.completion" && v["choices"][0]["message"]["role"] == "assistant", "{v}");
        let reason = if want.tokens.len() >= 24 { "length" } else { "stop" };
        ensure!(v["choices"][0]["finish_reason"] == reason, "{v}");
        let prompt_tokens = pipeline().tokenizer().encode(&pipeline().render_chat(&msgs)?, false)?.len();
        ensure!(v["usage"]["prompt_tokens"] == prompt_tokens, "usage {} vs {prompt_tokens}", v["usage"]);
        ensure!(v["usage"]["completion_tokens"] == want.tokens.len(), "{}", v["usage"]);
        ensure!(v["usage"]["total_tokens"] == prompt_tokens + want.tokens.len());

        let mut sreq = req.clone();
        sreq["stream"] = json!(true);
        sreq["stream_options"] = json!({"include_usage": true});
        let r = post(s.addr, "/v1/chat/completions", &sreq).await?;
        ensure!(r.status == 200 && r.header("content-type") == Some("text/event-stream"), "{} {:?}", r.status, r.headers);
        let events = r.events();
        ensure!(events.len() > 3, "{events:?}");
        let (text, reasons, usage) = join_stream(&events)?;
        ensure!(text == answer, "streamed {text:?} vs whole {answer:?}");
        ensure!(reasons == vec![reason.to_string()], "{reasons:?}");
        let usage = usage.context("include_usage gives a usage chunk")?;
        ensure!(usage["completion_tokens"] == want.tokens.len() && usage["prompt_tokens"] == prompt_tokens, "{usage}");

        // Multi-turn: the earlier answer goes back in.
        let mut turns = question();
        turns.as_array_mut().context("array")?.extend([json!({"role": "assistant", "content": answer}), json!({"role": "user", "content": "And of Germany?"})]);
        let r = post(s.addr, "/v1/chat/completions", &json!({"model": MODEL, "messages": turns, "max_tokens": 16, "temperature": 0})).await?;
        ensure!(r.status == 200, "{}", r.text());
        ensure!(r.json()?["usage"]["prompt_tokens"].as_u64().unwrap_or(0) > prompt_tokens as u64 + 5);

        // n = 2 sampled choices with a seed: two answers, reproducible.
        let nreq = json!({"model": MODEL, "messages": question(), "max_tokens": 12, "temperature": 0.9, "seed": 7, "n": 2});
        let a = post(s.addr, "/v1/chat/completions", &nreq).await?.json()?;
        let b = post(s.addr, "/v1/chat/completions", &nreq).await?.json()?;
        ensure!(a["choices"].as_array().map(Vec::len) == Some(2), "{a}");
        ensure!(a["choices"] == b["choices"], "same seed, same choices: {a} vs {b}");
        Ok(())
    })
    .await?
}

/// `logprobs` / `top_logprobs` (chat) and `logprobs: N` (completions): the pipeline's own
/// log-probabilities, whole and streamed alike, with each token's text and bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_whole_and_streamed() -> Result<()> {
    tokio::time::timeout(LIMIT, async {
        let s = start(ServerOptions::default()).await?;
        let req = json!({"model": MODEL, "messages": question(), "max_tokens": 12, "temperature": 0, "logprobs": true, "top_logprobs": 3});
        let v = post(s.addr, "/v1/chat/completions", &req).await?.json()?;
        let content = v["choices"][0]["logprobs"]["content"].as_array().context("logprobs.content")?.clone();
        let msgs = vec![Message::system("You are a helpful assistant."), Message::user("What is the capital of France?")];
        let want = pipeline().chat(&msgs, &GenerationConfig { logprobs: Some(3), ..GenerationConfig::default().max_tokens(12) })?;
        ensure!(content.len() == want.tokens.len() && v["usage"]["completion_tokens"] == want.tokens.len(), "{v}");
        let mut bytes = Vec::new();
        for (e, w) in content.iter().zip(&want.logprobs) {
            ensure!((e["logprob"].as_f64().unwrap_or(1.0) - w.logprob as f64).abs() < 1e-6, "{e} vs {w:?}");
            let top = e["top_logprobs"].as_array().context("top_logprobs")?;
            ensure!(top.len() == 3 && top[0]["token"] == e["token"] && top[0]["logprob"] == e["logprob"], "greedy takes the most likely: {e}");
            let b: Vec<u8> = serde_json::from_value(e["bytes"].clone())?;
            ensure!(String::from_utf8_lossy(&b) == e["token"].as_str().unwrap_or_default(), "{e}");
            bytes.extend(b);
        }
        let text = v["choices"][0]["message"]["content"].as_str().context("content")?;
        ensure!(String::from_utf8_lossy(&bytes).trim_end() == text.trim_end(), "tokens spell the answer: {text:?}");

        // Streamed: the chunks' logprobs add up to the whole answer's.
        let mut sreq = req.clone();
        sreq["stream"] = json!(true);
        let events = post(s.addr, "/v1/chat/completions", &sreq).await?.events();
        let (streamed_text, _, _) = join_stream(&events)?;
        ensure!(streamed_text == text, "{streamed_text:?} vs {text:?}");
        let mut streamed = Vec::new();
        for e in &events[..events.len() - 1] {
            let c: Value = serde_json::from_str(e)?;
            streamed.extend(c["choices"][0]["logprobs"]["content"].as_array().cloned().unwrap_or_default());
        }
        ensure!(streamed == content, "streamed logprobs differ");

        // Completions: the legacy shape.
        let creq = json!({"model": MODEL, "prompt": "The capital of France is", "max_tokens": 6, "temperature": 0, "logprobs": 2});
        let c = post(s.addr, "/v1/completions", &creq).await?.json()?;
        let lp = &c["choices"][0]["logprobs"];
        let n = c["usage"]["completion_tokens"].as_u64().context("usage")? as usize;
        for key in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
            ensure!(lp[key].as_array().map(Vec::len) == Some(n), "{key}: {lp}");
        }
        ensure!(lp["top_logprobs"].as_array().into_iter().flatten().all(|t| t.as_object().is_some_and(|o| o.len() == 2)), "{lp}");
        ensure!(lp["text_offset"][0] == 0, "{lp}");
        // Without asking, null.
        let plain = post(s.addr, "/v1/chat/completions", &json!({"model": MODEL, "messages": question(), "max_tokens": 4})).await?.json()?;
        ensure!(plain["choices"][0]["logprobs"].is_null(), "{plain}");
        Ok(())
    })
    .await?
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_and_stop_strings() -> Result<()> {
    tokio::time::timeout(LIMIT, async {
        let s = start(ServerOptions::default()).await?;
        let r = post(s.addr, "/v1/completions", &json!({"model": MODEL, "prompt": "def fibonacci(n):", "max_tokens": 20, "temperature": 0})).await?;
        ensure!(r.status == 200, "{}", r.text());
        let v = r.json()?;
        let want = pipeline().generate("def fibonacci(n):", &GenerationConfig::default().max_tokens(20))?;
        ensure!(v["object"] == "text_completion" && v["choices"][0]["text"] == want.text.as_str(), "{v} vs {:?}", want.text);
        // A stop string ends the text before it.
        let cut = want.text.char_indices().nth(want.text.chars().count() / 2).map(|(i, _)| i).unwrap_or(0);
        let stop: String = want.text[cut..].chars().take(3).collect();
        let r = post(s.addr, "/v1/completions", &json!({"model": MODEL, "prompt": "def fibonacci(n):", "max_tokens": 20, "temperature": 0, "stop": [stop]})).await?;
        let v = r.json()?;
        let text = v["choices"][0]["text"].as_str().context("text")?;
        ensure!(want.text.starts_with(text) && !text.contains(stop.as_str()) && v["choices"][0]["finish_reason"] == "stop", "{v} stop {stop:?}");
        Ok(())
    })
    .await?
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_schema_output_is_valid() -> Result<()> {
    tokio::time::timeout(LIMIT, async {
        let s = start(ServerOptions::default()).await?;
        let schema = json!({
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0, "maximum": 150}, "city": {"enum": ["Paris", "Berlin", "Rome"]}},
            "required": ["name", "age", "city"],
            "additionalProperties": false
        });
        for stream in [false, true] {
            let req = json!({"model": MODEL, "stream": stream, "temperature": 0, "max_tokens": 64,
                "messages": [{"role": "user", "content": "Describe a person living in France as JSON."}],
                "response_format": {"type": "json_schema", "json_schema": {"name": "person", "strict": true, "schema": schema}}});
            let r = post(s.addr, "/v1/chat/completions", &req).await?;
            ensure!(r.status == 200, "{}", r.text());
            let text = if stream { join_stream(&r.events())?.0 } else { r.json()?["choices"][0]["message"]["content"].as_str().context("content")?.to_string() };
            let v: Value = serde_json::from_str(&text).with_context(|| format!("not JSON: {text}"))?;
            let o = v.as_object().context("an object")?;
            ensure!(o.len() == 3, "{v}");
            ensure!(o["name"].as_str().is_some_and(|n| n.chars().count() <= 20), "{v}");
            ensure!(o["age"].as_u64().is_some_and(|a| a <= 150), "{v}");
            ensure!(["Paris", "Berlin", "Rome"].contains(&o["city"].as_str().unwrap_or("")), "{v}");
        }
        let r = post(s.addr, "/v1/chat/completions", &json!({"model": MODEL, "max_tokens": 32, "temperature": 0,
            "messages": [{"role": "user", "content": "Give me a JSON object about a cat."}], "response_format": {"type": "json_object"}})).await?;
        let text = r.json()?["choices"][0]["message"]["content"].as_str().context("content")?.to_string();
        let finish = r.json()?["choices"][0]["finish_reason"].clone();
        if finish == "stop" {
            serde_json::from_str::<Value>(&text).with_context(|| format!("json_object gives JSON: {text}"))?;
        }
        Ok(())
    })
    .await?
}

fn weather_tool() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}, "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"], "additionalProperties": false}}}])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_call_round_trip() -> Result<()> {
    tokio::time::timeout(LIMIT, async {
        let s = start(ServerOptions::default()).await?;
        let ask = json!([{"role": "user", "content": "What is the weather like in Paris today?"}]);
        let req = json!({"model": MODEL, "messages": ask, "tools": weather_tool(), "tool_choice": "required", "parallel_tool_calls": false, "temperature": 0, "max_tokens": 64});
        let r = post(s.addr, "/v1/chat/completions", &req).await?;
        ensure!(r.status == 200, "{}", r.text());
        let v = r.json()?;
        let c = &v["choices"][0];
        ensure!(c["finish_reason"] == "tool_calls", "{v}");
        let call = &c["message"]["tool_calls"][0];
        ensure!(call["type"] == "function" && call["function"]["name"] == "get_weather", "{v}");
        ensure!(call["id"].as_str().is_some_and(|i| i.starts_with("call_")), "{v}");
        let args_text = call["function"]["arguments"].as_str().context("arguments are a string")?;
        let args: Value = serde_json::from_str(args_text).with_context(|| format!("arguments are JSON: {args_text}"))?;
        ensure!(args["city"].is_string() && ["celsius", "fahrenheit"].contains(&args["unit"].as_str().unwrap_or("")), "{args}");
        ensure!(args.as_object().map(|o| o.len()) == Some(2), "{args}");

        // Streamed: the same call, as tool_calls deltas.
        let mut sreq = req.clone();
        sreq["stream"] = json!(true);
        let r = post(s.addr, "/v1/chat/completions", &sreq).await?;
        let (mut name, mut sargs, mut reason, mut id) = (String::new(), String::new(), String::new(), String::new());
        for e in r.events().iter().filter(|e| e.as_str() != "[DONE]") {
            let ev: Value = serde_json::from_str(e)?;
            let ch = &ev["choices"][0];
            for tc in ch["delta"]["tool_calls"].as_array().into_iter().flatten() {
                ensure!(tc["index"] == 0, "{ev}");
                name.push_str(tc["function"]["name"].as_str().unwrap_or(""));
                sargs.push_str(tc["function"]["arguments"].as_str().unwrap_or(""));
                id.push_str(tc["id"].as_str().unwrap_or(""));
            }
            if let Some(f) = ch["finish_reason"].as_str() {
                reason = f.into();
            }
        }
        ensure!(name == "get_weather" && sargs == args_text && reason == "tool_calls" && id.starts_with("call_"), "{name} {sargs} {reason} {id}");

        // The result goes back as a tool message; the model answers in text.
        let mut turns = ask.as_array().cloned().context("array")?;
        turns.push(json!({"role": "assistant", "content": null, "tool_calls": c["message"]["tool_calls"]}));
        turns.push(json!({"role": "tool", "tool_call_id": call["id"], "content": "{\"temperature\": 21, \"sky\": \"sunny\"}"}));
        let r = post(s.addr, "/v1/chat/completions", &json!({"model": MODEL, "messages": turns, "tools": weather_tool(), "tool_choice": "none", "temperature": 0, "max_tokens": 48})).await?;
        ensure!(r.status == 200, "{}", r.text());
        let v2 = r.json()?;
        let answer = v2["choices"][0]["message"]["content"].as_str().context("a text answer")?;
        ensure!(!answer.trim().is_empty() && v2["choices"][0]["message"]["tool_calls"].is_null(), "{v2}");
        // The call and its result reached the prompt.
        let first = v["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
        ensure!(v2["usage"]["prompt_tokens"].as_u64().unwrap_or(0) > first + 30, "{} vs {first}", v2["usage"]);
        Ok(())
    })
    .await?
}

/// llama-server's `grammar` field (GBNF) on chat, streamed chat and completions: the output
/// follows the grammar (checked with the `regex` crate) and ends there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gbnf_grammar_field_constrains_the_output() -> Result<()> {
    tokio::time::timeout(LIMIT, async {
        let s = start(ServerOptions::default()).await?;
        let list = "# two to four list items\nroot ::= item{2,4}\nitem ::= \"- \" [A-Z] [a-z ]{0,24} \"\\n\"\n";
        let re = regex::Regex::new(r"^(?:- [A-Z][a-z ]{0,24}\n){2,4}$")?;
        for stream in [false, true] {
            let req = json!({"model": MODEL, "stream": stream, "temperature": 0, "max_tokens": 100, "grammar": list,
                "messages": [{"role": "user", "content": "List some fruits."}]});
            let r = post(s.addr, "/v1/chat/completions", &req).await?;
            ensure!(r.status == 200, "{}", r.text());
            let (text, finish) = if stream {
                let (t, reasons, _) = join_stream(&r.events())?;
                (t, reasons.first().cloned().unwrap_or_default())
            } else {
                let v = r.json()?;
                (v["choices"][0]["message"]["content"].as_str().context("content")?.to_string(), v["choices"][0]["finish_reason"].as_str().unwrap_or("").to_string())
            };
            ensure!(finish == "stop" && re.is_match(&text), "stream {stream}: {finish} {text:?}");
        }
        let req = json!({"model": MODEL, "prompt": "Water boils at a temperature in degrees Fahrenheit of", "max_tokens": 12, "temperature": 0,
            "grammar": "root ::= \" \" [1-9] [0-9]{0,2} \" degrees\""});
        let v = post(s.addr, "/v1/completions", &req).await?.json()?;
        let text = v["choices"][0]["text"].as_str().context("text")?;
        ensure!(regex::Regex::new(r"^ [1-9][0-9]{0,2} degrees$")?.is_match(text) && v["choices"][0]["finish_reason"] == "stop", "{v}");
        let bad = json!({"model": MODEL, "messages": question(), "grammar": "root ::= \"a\" | (\"b\""});
        let v = expect_error(post(s.addr, "/v1/chat/completions", &bad).await?, 400, "line 1, column").await?;
        ensure!(v["error"]["param"] == "grammar" && v["error"]["code"] == "invalid_grammar", "{v}");
        Ok(())
    })
    .await?
}

async fn expect_error(r: common::Reply, status: u16, needle: &str) -> Result<Value> {
    ensure!(r.status == status, "want {status}, got {} {}", r.status, r.text());
    let v = r.json()?;
    let e = &v["error"];
    ensure!(e["message"].as_str().is_some_and(|m| m.contains(needle)), "message lacks {needle:?}: {v}");
    ensure!(e["type"].is_string() && e.get("param").is_some() && e.get("code").is_some(), "{v}");
    Ok(v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_have_openai_shape_and_status() -> Result<()> {
    tokio::time::timeout(LIMIT, async {
        let s = start(ServerOptions { max_body_bytes: 16384, ..ServerOptions::default() }).await?;
        let a = s.addr;
        expect_error(send(a, "POST", "/v1/chat/completions", &[], b"{not json").await?, 400, "JSON").await?;
        let v = expect_error(post(a, "/v1/chat/completions", &json!({"model": MODEL})).await?, 400, "messages").await?;
        ensure!(v["error"]["type"] == "invalid_request_error", "{v}");
        let v = expect_error(post(a, "/v1/chat/completions", &json!({"model": MODEL, "messages": question(), "temperature": 5})).await?, 400, "temperature").await?;
        ensure!(v["error"]["param"] == "temperature", "{v}");
        expect_error(post(a, "/v1/chat/completions", &json!({"model": MODEL, "messages": [{"role": "wizard", "content": "hi"}]})).await?, 400, "wizard").await?;
        // A schema keyword we cannot enforce is refused by name, never ignored.
        let bad = json!({"model": MODEL, "messages": question(), "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array", "contains": {"type": "string"}}}}});
        let v = expect_error(post(a, "/v1/chat/completions", &bad).await?, 400, "contains").await?;
        ensure!(v["error"]["param"] == "response_format.json_schema.schema", "{v}");
        let v = expect_error(post(a, "/v1/chat/completions", &json!({"model": "gpt-4o", "messages": question()})).await?, 404, "gpt-4o").await?;
        ensure!(v["error"]["code"] == "model_not_found", "{v}");
        expect_error(get(a, "/v1/nothing").await?, 404, "/v1/nothing").await?;
        expect_error(get(a, "/v1/chat/completions").await?, 405, "GET").await?;
        let big = json!({"model": MODEL, "messages": [{"role": "user", "content": "x".repeat(20_000)}]});
        expect_error(post(a, "/v1/chat/completions", &big).await?, 413, "16384").await?;
        expect_error(post(a, "/v1/chat/completions", &json!({"model": MODEL, "messages": question(), "logprobs": true, "top_logprobs": 30})).await?, 400, "top_logprobs").await?;
        expect_error(post(a, "/v1/chat/completions", &json!({"model": MODEL, "messages": question(), "tool_choice": "required"})).await?, 400, "tools").await?;
        let too_long = json!({"model": MODEL, "prompt": "hello ".repeat(2100)});
        expect_error(post(a, "/v1/completions", &too_long).await?, 400, "context").await?;
        // Nothing above started a generation.
        let m = s.server.engine_metrics(MODEL)?;
        ensure!(m.running == 0 && m.waiting == 0 && m.generated_tokens == 0, "{m:?}");

        // An API key guards every route but /health.
        let k = start(ServerOptions { api_key: Some("sk-test-123".into()), ..ServerOptions::default() }).await?;
        ensure!(get(k.addr, "/health").await?.status == 200);
        expect_error(get(k.addr, "/v1/models").await?, 401, "API key").await?;
        expect_error(send(k.addr, "GET", "/metrics", &[("Authorization", "Bearer wrong")], b"").await?, 401, "API key").await?;
        ensure!(send(k.addr, "GET", "/v1/models", &[("Authorization", "Bearer sk-test-123")], b"").await?.status == 200);
        ensure!(send(k.addr, "GET", "/metrics", &[("Authorization", "Bearer sk-test-123")], b"").await?.status == 200);
        // Opted in, /metrics answers without the key; every other route still needs it.
        let pm = start(ServerOptions { api_key: Some("sk-test-123".into()), public_metrics: true, ..ServerOptions::default() }).await?;
        let r = get(pm.addr, "/metrics").await?;
        ensure!(r.status == 200 && String::from_utf8_lossy(&r.body).contains("sapient:num_requests_running"), "{} {:?}", r.status, String::from_utf8_lossy(&r.body));
        expect_error(get(pm.addr, "/v1/models").await?, 401, "API key").await?;
        expect_error(post(pm.addr, "/v1/chat/completions", &json!({"model": MODEL, "messages": question()})).await?, 401, "API key").await?;

        // CORS: off by default; for a listed origin, preflights are answered before the key
        // is checked and answers carry the origin; other origins get no CORS headers.
        let pre = [("Origin", "http://localhost:3000"), ("Access-Control-Request-Method", "POST"), ("Access-Control-Request-Headers", "authorization, content-type")];
        let r = send(a, "OPTIONS", "/v1/chat/completions", &pre, b"").await?;
        ensure!(r.header("access-control-allow-origin").is_none() && r.status == 405, "no CORS unless asked: {} {:?}", r.status, r.headers);
        let c = start(ServerOptions { api_key: Some("sk-test-123".into()), cors_origins: vec!["http://localhost:3000".into()], ..ServerOptions::default() }).await?;
        let r = send(c.addr, "OPTIONS", "/v1/chat/completions", &pre, b"").await?;
        ensure!(r.status == 204 && r.header("access-control-allow-origin") == Some("http://localhost:3000"), "{} {:?}", r.status, r.headers);
        ensure!(r.header("access-control-allow-headers") == Some("authorization, content-type") && r.header("access-control-allow-methods").is_some_and(|m| m.contains("POST")), "{:?}", r.headers);
        let r = send(c.addr, "GET", "/v1/models", &[("Origin", "http://localhost:3000"), ("Authorization", "Bearer sk-test-123")], b"").await?;
        ensure!(r.status == 200 && r.header("access-control-allow-origin") == Some("http://localhost:3000"), "{:?}", r.headers);
        let r = send(c.addr, "GET", "/v1/models", &[("Origin", "http://localhost:3000")], b"").await?;
        ensure!(r.status == 401 && r.header("access-control-allow-origin").is_some(), "a refused request still tells the page why: {:?}", r.headers);
        let r = send(c.addr, "OPTIONS", "/v1/chat/completions", &[("Origin", "https://evil.example"), ("Access-Control-Request-Method", "POST")], b"").await?;
        ensure!(r.header("access-control-allow-origin").is_none(), "{:?}", r.headers);
        Ok(())
    })
    .await?
}

/// Open a streamed request and read until `events` data events have come; returns the socket.
async fn open_stream(addr: std::net::SocketAddr, body: &Value, events: usize) -> Result<tokio::net::TcpStream> {
    let mut sock = tokio::net::TcpStream::connect(addr).await?;
    sock.write_all(&request_bytes("POST", "/v1/completions", &[], body.to_string().as_bytes())).await?;
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while String::from_utf8_lossy(&seen).matches("data: ").count() < events {
        let n = sock.read(&mut buf).await?;
        ensure!(n > 0, "stream closed early: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    ensure!(seen.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&seen));
    Ok(sock)
}

fn endless(eos: &[u32]) -> Value {
    let bias: serde_json::Map<String, Value> = eos.iter().map(|t| (t.to_string(), json!(-100))).collect();
    json!({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 1500, "temperature": 0, "stream": true, "logit_bias": bias})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_cancels_and_frees_blocks() -> Result<()> {
    tokio::time::timeout(LIMIT, async {
        let s = start(ServerOptions::default()).await?;
        let body = endless(pipeline().tokenizer().eos_token_ids());
        for _ in 0..3 {
            let sock = open_stream(s.addr, &body, 4).await?;
            let m = s.server.engine_metrics(MODEL)?;
            ensure!(m.running == 1 && m.kv.used_blocks > 0, "the request runs: {m:?}");
            drop(sock);
            wait_idle(s.addr).await?;
        }
        let m = wait_idle(s.addr).await?;
        let generated = metric(&m, "sapient:generation_tokens_total").context("counter")?;
        ensure!(generated < 1000.0, "generation stopped early, not at max_tokens: {generated}");
        ensure!(metric(&m, "sapient:requests_cancelled_total") == Some(3.0), "{m}");
        ensure!(m.contains("sapient:time_to_first_token_seconds_bucket") && m.contains("sapient:kv_cache_usage_perc"), "{m}");
        // And the server still answers.
        let r = post(s.addr, "/v1/chat/completions", &json!({"model": MODEL, "messages": question(), "max_tokens": 4, "temperature": 0})).await?;
        ensure!(r.status == 200, "{}", r.text());
        Ok(())
    })
    .await?
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_queue_is_429_with_retry_after() -> Result<()> {
    tokio::time::timeout(LIMIT, async {
        let s = start(ServerOptions { max_queue: 1, ..ServerOptions::default() }).await?;
        let sock = open_stream(s.addr, &endless(pipeline().tokenizer().eos_token_ids()), 2).await?;
        let r = post(s.addr, "/v1/chat/completions", &json!({"model": MODEL, "messages": question(), "max_tokens": 4})).await?;
        ensure!(r.header("retry-after").is_some(), "{:?}", r.headers);
        let v = expect_error(r, 429, "queue").await?;
        ensure!(v["error"]["type"] == "rate_limit_error", "{v}");
        drop(sock);
        wait_idle(s.addr).await?;
        let r = post(s.addr, "/v1/chat/completions", &json!({"model": MODEL, "messages": question(), "max_tokens": 4})).await?;
        ensure!(r.status == 200, "{}", r.text());
        Ok(())
    })
    .await?
}
