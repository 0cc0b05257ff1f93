//! Fault test: 100 clients on loopback that go away at random points (before sending, halfway
//! through the body, before the answer, in the middle of a stream), beside a few that finish.
//! The server keeps answering, nothing fails on its side (no 5xx), and once they are gone
//! the engine holds no sequence, queue entry or KV block.

mod common;

use anyhow::{ensure, Context, Result};
use common::*;
use sapient_server::ServerOptions;
use serde_json::{json, Value};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const CLIENTS: u64 = 100;

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One client; `Ok(true)` when it read a whole answer.
async fn client(addr: std::net::SocketAddr, i: u64) -> Result<bool> {
    let r = splitmix(i);
    let stream = r & 1 == 0;
    let body: Value = if (r >> 1).is_multiple_of(2) {
        json!({"model": MODEL, "prompt": format!("Story {i}: once upon a time"), "max_tokens": 8 + (r >> 8) % 56, "temperature": 0.7, "seed": i, "stream": stream})
    } else {
        json!({"model": MODEL, "messages": [{"role": "user", "content": format!("Tell me fact number {i} about the sea.")}], "max_tokens": 8 + (r >> 8) % 56, "stream": stream})
    };
    let path = if body.get("prompt").is_some() { "/v1/completions" } else { "/v1/chat/completions" };
    let bytes = request_bytes("POST", path, &[], body.to_string().as_bytes());
    let mut sock = tokio::net::TcpStream::connect(addr).await?;
    match (r >> 16) % 6 {
        // Gone before sending anything.
        0 => Ok(false),
        // Gone halfway through the body.
        1 => {
            sock.write_all(&bytes[..bytes.len() / 2]).await?;
            Ok(false)
        }
        // Gone right after the request, or a little later, before reading.
        2 => {
            sock.write_all(&bytes).await?;
            tokio::time::sleep(Duration::from_millis((r >> 24) % 40)).await;
            Ok(false)
        }
        // Gone after some of the answer.
        3 | 4 => {
            sock.write_all(&bytes).await?;
            let want = 1 + ((r >> 24) % 600) as usize;
            let mut seen = 0;
            let mut buf = [0u8; 512];
            while seen < want {
                let n = sock.read(&mut buf).await?;
                if n == 0 {
                    return Ok(true); // the whole answer was shorter
                }
                seen += n;
            }
            Ok(false)
        }
        // Stays to the end.
        _ => {
            sock.write_all(&bytes).await?;
            let mut raw = Vec::new();
            sock.read_to_end(&mut raw).await?;
            ensure!(raw.starts_with(b"HTTP/1.1 200"), "client {i}: {}", String::from_utf8_lossy(&raw));
            Ok(true)
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_clients_disconnecting_at_random_points() -> Result<()> {
    tokio::time::timeout(Duration::from_secs(240), async {
        let s = start(ServerOptions::default()).await?;
        let tasks: Vec<_> = (0..CLIENTS).map(|i| tokio::spawn(client(s.addr, i))).collect();
        let mut finished = 0;
        for t in tasks {
            if t.await?? {
                finished += 1;
            }
        }
        let m = wait_idle(s.addr).await?;
        let cancelled = metric(&m, "sapient:requests_cancelled_total").context("cancelled counter")?;
        ensure!(cancelled >= 10.0, "clients that left mid-answer were cancelled: {cancelled}");
        ensure!(m.lines().any(|l| l.starts_with("sapient:http_responses_total{code=\"200\"}")), "responses are counted by code:\n{m}");
        ensure!(!m.lines().any(|l| l.starts_with("sapient:http_responses_total{code=\"5")), "no server errors:\n{m}");
        let e = s.server.engine_metrics(MODEL)?;
        ensure!(e.running == 0 && e.waiting == 0 && e.kv.used_blocks == 0, "{e:?}");
        // And it still answers.
        let r = post(s.addr, "/v1/chat/completions", &json!({"model": MODEL, "messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 8, "temperature": 0})).await?;
        ensure!(r.status == 200, "{}", r.text());
        eprintln!("{CLIENTS} clients: {finished} read a whole answer, {cancelled} requests cancelled, engine idle");
        Ok(())
    })
    .await?
}
