//! llama-server's `/tokenize`, `/detokenize` and `/apply-template` over HTTP on 127.0.0.1 with
//! SmolLM2-135M-Instruct, checked against the model's own tokenizer and template and against
//! the prompt chat completions counts; the `/v1/responses` store's count and age limits; the
//! Anthropic routes' key header and error shape.

mod common;

use anyhow::{ensure, Context, Result};
use common::*;
use sapient_server::ServerOptions;
use serde_json::{json, Value};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(240);

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().into_iter().flatten().filter_map(Value::as_u64).map(|t| t as u32).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_detokenize_and_apply_template() -> Result<()> {
    tokio::time::timeout(LIMIT, async {
        let s = start(ServerOptions::default()).await?;
        let tok = pipeline().tokenizer();
        let text = "Héllo, wörld! <|im_start|>user\n  spaces\tand 日本語 ✓";
        let r = post(s.addr, "/tokenize", &json!({"content": text})).await?.json()?;
        let tokens = ids(&r["tokens"]);
        ensure!(tokens == tok.encode(text, false)?, "{r}");
        ensure!(tokens.contains(&tok.token_to_id("<|im_start|>").context("im_start")?), "special tokens written in the text are parsed");
        let back = post(s.addr, "/detokenize", &json!({"tokens": tokens})).await?.json()?;
        ensure!(back["content"] == text, "round trip: {back}");

        // Pieces: each id with its text (or bytes where a piece is not UTF-8 on its own);
        // their bytes spell the text.
        let r = post(s.addr, "/tokenize", &json!({"content": text, "with_pieces": true})).await?.json()?;
        let mut bytes = Vec::new();
        let mut got = Vec::new();
        for p in r["tokens"].as_array().context("tokens")? {
            got.push(p["id"].as_u64().context("id")? as u32);
            match &p["piece"] {
                Value::String(s) => bytes.extend_from_slice(s.as_bytes()),
                Value::Array(b) => bytes.extend(b.iter().filter_map(Value::as_u64).map(|b| b as u8)),
                other => anyhow::bail!("piece {other}"),
            }
        }
        ensure!(got == tokens && String::from_utf8(bytes)? == text, "{r}");

        // The template's prompt: what the tokenizer's template renders, and what chat
        // completions counts as its prompt.
        let messages = json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]);
        let r = post(s.addr, "/apply-template", &json!({"messages": messages})).await?.json()?;
        let prompt = r["prompt"].as_str().context("prompt")?.to_string();
        let want = tok.chat_template().context("template")?.render(
            &[sapient_generate::Message::system("Be brief."), sapient_generate::Message::user("What is 2+2?")],
            &Default::default(),
        )?;
        ensure!(prompt == want && prompt.ends_with("<|im_start|>assistant\n"), "{prompt:?}");
        let n = ids(&post(s.addr, "/tokenize", &json!({"content": prompt})).await?.json()?["tokens"]).len();
        let chat = post(s.addr, "/v1/chat/completions", &json!({"messages": messages, "max_tokens": 1})).await?.json()?;
        ensure!(chat["usage"]["prompt_tokens"] == n, "chat counts {} prompt tokens, tokenize {n}", chat["usage"]);

        // Bad input: a clear 400 naming the field.
        let r = post(s.addr, "/detokenize", &json!({"tokens": [u32::MAX]})).await?;
        ensure!(r.status == 400 && r.json()?["error"]["param"] == "tokens", "{}", r.text());
        let r = post(s.addr, "/tokenize", &json!({"content": 5})).await?;
        ensure!(r.status == 400 && r.json()?["error"]["param"] == "content", "{}", r.text());
        Ok(())
    })
    .await
    .context("timed out")?
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_store_keeps_the_newest_for_a_while() -> Result<()> {
    tokio::time::timeout(LIMIT, async {
        let s = start(ServerOptions { responses_max: 2, ..ServerOptions::default() }).await?;
        let addr = s.addr;
        let mut made = Vec::new();
        for i in 0..3 {
            let r = post(s.addr, "/v1/responses", &json!({"input": format!("Say {i}"), "max_output_tokens": 2})).await?;
            ensure!(r.status == 200, "{}", r.text());
            made.push(r.json()?["id"].as_str().context("id")?.to_string());
        }
        let unstored = post(s.addr, "/v1/responses", &json!({"input": "Hi", "max_output_tokens": 2, "store": false})).await?.json()?;
        let status = |id: &str| {
            let path = format!("/v1/responses/{id}");
            async move { get(addr, &path).await.map(|r| r.status) }
        };
        ensure!(status(&made[0]).await? == 404, "the oldest of three goes beyond responses_max 2");
        ensure!(status(&made[1]).await? == 200 && status(&made[2]).await? == 200, "the newest two stay");
        ensure!(status(unstored["id"].as_str().context("id")?).await? == 404, "store: false keeps nothing");
        let r = post(s.addr, "/v1/responses", &json!({"previous_response_id": made[0], "input": "Hi", "max_output_tokens": 2})).await?;
        ensure!(r.status == 404 && r.text().contains(&made[0]), "{}", r.text());
        let d = send(s.addr, "DELETE", &format!("/v1/responses/{}", made[1]), &[], b"").await?;
        ensure!(d.status == 200 && d.json()?["deleted"] == true, "{}", d.text());
        ensure!(status(&made[1]).await? == 404, "deleted");
        drop(s);
        let s = start(ServerOptions { responses_ttl: Duration::from_millis(300), ..ServerOptions::default() }).await?;
        let r = post(s.addr, "/v1/responses", &json!({"input": "Hi", "max_output_tokens": 2})).await?.json()?;
        tokio::time::sleep(Duration::from_millis(400)).await;
        let r = get(s.addr, &format!("/v1/responses/{}", r["id"].as_str().context("id")?)).await?;
        ensure!(r.status == 404, "older than responses_ttl: {}", r.text());
        Ok(())
    })
    .await
    .context("timed out")?
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_routes_take_x_api_key_and_answer_anthropic_errors() -> Result<()> {
    tokio::time::timeout(LIMIT, async {
        let s = start(ServerOptions { api_key: Some("k1".into()), max_body_bytes: 4096, ..ServerOptions::default() }).await?;
        let body = json!({"max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}).to_string();
        let shape = |r: &Reply, status: u16, kind: &str| -> Result<()> {
            let v = r.json()?;
            ensure!(r.status == status && v["type"] == "error" && v["error"]["type"] == kind && v["error"]["message"].is_string(), "{status} {kind}: {} {v}", r.status);
            Ok(())
        };
        shape(&send(s.addr, "POST", "/v1/messages", &[], body.as_bytes()).await?, 401, "authentication_error")?;
        shape(&send(s.addr, "POST", "/v1/messages", &[("x-api-key", "nope")], body.as_bytes()).await?, 401, "authentication_error")?;
        let ok = send(s.addr, "POST", "/v1/messages", &[("x-api-key", "k1")], body.as_bytes()).await?;
        ensure!(ok.status == 200 && ok.json()?["type"] == "message", "{}", ok.text());
        let big = json!({"max_tokens": 2, "messages": [{"role": "user", "content": "x".repeat(8000)}]}).to_string();
        shape(&send(s.addr, "POST", "/v1/messages", &[("x-api-key", "k1")], big.as_bytes()).await?, 413, "request_too_large")?;
        shape(&send(s.addr, "POST", "/v1/messages", &[("x-api-key", "k1")], b"{not json").await?, 400, "invalid_request_error")?;
        shape(&send(s.addr, "GET", "/v1/messages", &[("x-api-key", "k1")], b"").await?, 405, "invalid_request_error")?;
        // The OpenAI routes take x-api-key too, and keep OpenAI's error shape.
        let r = send(s.addr, "GET", "/v1/models", &[("x-api-key", "k1")], b"").await?;
        ensure!(r.status == 200, "{}", r.text());
        let r = send(s.addr, "GET", "/v1/models", &[("x-api-key", "nope")], b"").await?;
        ensure!(r.status == 401 && r.json()?["error"]["code"] == "invalid_api_key", "{}", r.text());
        Ok(())
    })
    .await
    .context("timed out")?
}
