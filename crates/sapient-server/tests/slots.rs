//! Saved KV slots over HTTP on 127.0.0.1 (port 0) with SmolLM2-135M-Instruct: a conversation
//! run in slot 0 is saved to a file, restored into slot 3 of a fresh server, and its next turn
//! there equals the uninterrupted one; bad names, damaged and foreign files are refused.

mod common;

use anyhow::{ensure, Context, Result};
use common::*;
use sapient_server::ServerOptions;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(240);

fn turn(messages: &Value, slot: u32) -> Value {
    json!({"model": MODEL, "messages": messages, "max_tokens": 16, "temperature": 0, "id_slot": slot})
}

async fn chat(addr: std::net::SocketAddr, body: &Value) -> Result<(String, u64)> {
    let r = post(addr, "/v1/chat/completions", body).await?;
    ensure!(r.status == 200, "{} {}", r.status, r.text());
    let v = r.json()?;
    let text = v["choices"][0]["message"]["content"].as_str().context("content")?.to_string();
    Ok((text, v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0)))
}

async fn slot(addr: std::net::SocketAddr, id: u32, action: &str, filename: &str) -> Result<Reply> {
    post(addr, &format!("/slots/{id}?action={action}"), &json!({"filename": filename})).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saved_slot_continues_in_a_fresh_server() -> Result<()> {
    tokio::time::timeout(LIMIT, async {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("slots");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let opts = ServerOptions { slot_save_path: Some(dir.clone()), ..ServerOptions::default() };
        let a = start(opts.clone()).await?;
        let mut msgs = json!([{"role": "user", "content": "What is the capital of France?"}]);
        let (first, _) = chat(a.addr, &turn(&msgs, 0)).await?;
        let r = slot(a.addr, 0, "save", "paris.bin").await?;
        ensure!(r.status == 200, "{}", r.text());
        let v = r.json()?;
        let saved = v["n_saved"].as_u64().context("n_saved")?;
        ensure!(v["id_slot"] == 0 && v["filename"] == "paris.bin" && saved > 10, "{v}");
        ensure!(v["n_written"].as_u64() == Some(std::fs::metadata(dir.join("paris.bin"))?.len()), "{v}");
        ensure!(v["timings"]["save_ms"].is_number(), "{v}");

        if let Some(m) = msgs.as_array_mut() {
            m.push(json!({"role": "assistant", "content": first}));
            m.push(json!({"role": "user", "content": "And of Italy?"}));
        }
        let (uninterrupted, reused_a) = chat(a.addr, &turn(&msgs, 0)).await?;

        // A fresh server (its own engine and cache) given the file continues the same way.
        let b = start(opts.clone()).await?;
        let r = slot(b.addr, 3, "restore", "paris.bin").await?;
        ensure!(r.status == 200, "{}", r.text());
        let v = r.json()?;
        ensure!(v["id_slot"] == 3 && v["n_restored"].as_u64() == Some(saved) && v["timings"]["restore_ms"].is_number(), "{v}");
        let (restored, reused_b) = chat(b.addr, &turn(&msgs, 3)).await?;
        ensure!(restored == uninterrupted, "restored {restored:?}, uninterrupted {uninterrupted:?}");
        ensure!(reused_b >= saved.min(reused_a) && reused_b > 10, "the restored slot is reused: {reused_b} of {saved} ({reused_a} on the first server)");

        // What is refused.
        for name in ["../paris.bin", "a/b.bin", ".hidden", ""] {
            let r = slot(b.addr, 3, "restore", name).await?;
            ensure!(r.status == 400 && r.text().contains("invalid file name"), "{name:?}: {} {}", r.status, r.text());
        }
        let r = slot(b.addr, 3, "restore", "missing.bin").await?;
        ensure!(r.status == 404, "{} {}", r.status, r.text());
        let bytes = std::fs::read(dir.join("paris.bin"))?;
        std::fs::write(dir.join("short.bin"), &bytes[..bytes.len() / 2])?;
        let r = slot(b.addr, 3, "restore", "short.bin").await?;
        ensure!(r.status == 400 && r.text().contains("damaged or truncated"), "{} {}", r.status, r.text());
        std::fs::write(dir.join("junk.bin"), b"GGUF\x03\x00\x00\x00 certainly not a slot file, whatever it claims to be at all")?;
        let r = slot(b.addr, 3, "restore", "junk.bin").await?;
        ensure!(r.status == 400 && r.text().contains("not a saved slot file"), "{} {}", r.status, r.text());
        // Another model: its identity differs, the checksum made to match.
        let mut other = bytes[..bytes.len() - 32].to_vec();
        other[20] ^= 0xff;
        let sum = sha256(&other);
        other.extend_from_slice(&sum);
        std::fs::write(dir.join("other.bin"), &other)?;
        let r = slot(b.addr, 3, "restore", "other.bin").await?;
        ensure!(r.status == 400 && r.text().contains("saved from another model"), "{} {}", r.status, r.text());
        let r = slot(b.addr, 3, "rewind", "paris.bin").await?;
        ensure!(r.status == 400 && r.text().contains("unknown action"), "{} {}", r.status, r.text());
        let r = slot(b.addr, 5000, "save", "x.bin").await?;
        ensure!(r.status == 400, "{} {}", r.status, r.text());
        let r = slot(b.addr, 7, "save", "x.bin").await?;
        ensure!(r.status == 400 && r.text().contains("holds nothing"), "{} {}", r.status, r.text());
        let r = slot(b.addr, 3, "erase", "").await?;
        ensure!(r.status == 200 && r.json()?["id_slot"] == 3, "{}", r.text());
        // Without a slot directory the routes are off.
        let c = start(ServerOptions::default()).await?;
        let r = slot(c.addr, 0, "save", "paris.bin").await?;
        ensure!(r.status == 501 && r.text().contains("--slot-save-path"), "{} {}", r.status, r.text());
        Ok(())
    })
    .await
    .context("timed out")?
}

fn sha256(b: &[u8]) -> Vec<u8> {
    use sha2::Digest;
    sha2::Sha256::digest(b).to_vec()
}
