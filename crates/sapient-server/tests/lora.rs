//! LoRA adapters over HTTP on 127.0.0.1 (port 0) with SmolLM2-135M-Instruct and a synthetic
//! adapter (sapient-llama's tests/common/lora.rs): `GET /lora-adapters` lists it, a request's
//! `lora` field picks it or leaves it off, a request without the field gets the global scale,
//! `POST /lora-adapters` changes that, and bad choices are 400s.

mod common;
#[path = "../../sapient-llama/tests/common/splitmix.rs"]
mod splitmix;
#[path = "../../sapient-llama/tests/common/lora.rs"]
mod lora;

use anyhow::{ensure, Context, Result};
use common::*;
use sapient_server::ServerOptions;
use serde_json::{json, Value};
use std::time::Duration;

async fn chat(addr: std::net::SocketAddr, lora: Option<Value>) -> Result<(u16, Value)> {
    let mut body = json!({"model": MODEL, "messages": [{"role": "user", "content": "Name three colors."}], "max_tokens": 16, "temperature": 0});
    if let Some(l) = lora {
        body["lora"] = l;
    }
    let r = post(addr, "/v1/chat/completions", &body).await?;
    Ok((r.status, r.json()?))
}

fn content(v: &Value) -> Result<String> {
    Ok(v["choices"][0]["message"]["content"].as_str().context("content")?.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_pick_adapters_and_the_global_scales_apply_otherwise() -> Result<()> {
    tokio::time::timeout(Duration::from_secs(240), async {
        let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("server-lora.gguf");
        lora::smollm2_adapter(&path, 21, &[0, 3, 6, 9, 12, 15, 18, 21, 24, 27], 16, 64.0)?;
        ensure!(pipeline().load_lora(&path)? == 0);
        let s = start(ServerOptions::default()).await?;
        let list = get(s.addr, "/lora-adapters").await?.json()?;
        ensure!(list == json!([{"id": 0, "path": path.display().to_string(), "scale": 1.0, "task_name": "", "prompt_prefix": ""}]), "{list}");

        let (st, off) = chat(s.addr, Some(json!([{"id": 0, "scale": 0.0}]))).await?;
        ensure!(st == 200, "{off}");
        let (_, on) = chat(s.addr, Some(json!([{"id": 0, "scale": 1.0}]))).await?;
        let (_, default) = chat(s.addr, None).await?;
        let (off, on, default) = (content(&off)?, content(&on)?, content(&default)?);
        eprintln!("off: {off:?}\non: {on:?}");
        ensure!(off != on, "the adapter changes nothing: {on:?}");
        ensure!(default == on, "no lora field: the global scale 1 applies ({default:?})");
        // Global scale 0: a request without the field is the base model's.
        let r = post(s.addr, "/lora-adapters", &json!([{"id": 0, "scale": 0.0}])).await?;
        ensure!(r.status == 200 && r.json()? == json!({"success": true}), "{}", r.text());
        ensure!(get(s.addr, "/lora-adapters").await?.json()?[0]["scale"] == 0.0);
        let (_, default) = chat(s.addr, None).await?;
        ensure!(content(&default)? == off, "global scale 0 still applies the adapter");
        let (_, on_again) = chat(s.addr, Some(json!([{"id": 0, "scale": 1.0}]))).await?;
        ensure!(content(&on_again)? == on);

        for bad in [json!([{"id": 3, "scale": 1.0}]), json!([{"scale": 1.0}]), json!("all"), json!([{"id": 0, "scale": "high"}])] {
            let (st, v) = chat(s.addr, Some(bad.clone())).await?;
            ensure!(st == 400 && v["error"]["param"] == "lora", "{bad}: {st} {v}");
        }
        let r = post(s.addr, "/lora-adapters", &json!({"id": 0})).await?;
        ensure!(r.status == 400, "{} {}", r.status, r.text());
        Ok(())
    })
    .await
    .context("timed out")?
}
