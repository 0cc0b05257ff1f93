//! The `sapient` binary as a child process, for the tests that start it: a handle that kills
//! it when dropped, its stderr lines on a channel, and the wait for the address it listens on
//! and for its `/health`.

#![allow(dead_code)]

use anyhow::{ensure, Context, Result};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

/// A child process killed when dropped (unless it has exited).
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The `sapient` binary of this build.
pub fn sapient() -> Command {
    Command::new(env!("CARGO_BIN_EXE_sapient"))
}

/// Start `cmd` with `RUST_LOG=warn`, stdin and stdout closed; its stderr lines arrive on the
/// receiver as they are written.
pub fn spawn(mut cmd: Command) -> Result<(Proc, Receiver<String>)> {
    let mut child = cmd
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting sapient")?;
    let stderr = child.stderr.take().context("stderr")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    Ok((Proc(child), rx))
}

/// The address a server says it listens on (`listening on http://ADDR`), waiting at most
/// `within`; `check` sees every line before it.
pub fn listening(rx: &Receiver<String>, within: Duration, mut check: impl FnMut(&str) -> Result<()>) -> Result<SocketAddr> {
    let t = Instant::now();
    loop {
        let line = rx.recv_timeout(within.saturating_sub(t.elapsed())).context("the server did not start listening")?;
        check(&line)?;
        if let Some(a) = line.split("listening on http://").nth(1).and_then(|r| r.split_whitespace().next()) {
            return Ok(a.parse()?);
        }
    }
}

/// Until `addr` answers `path` with 200 (at most 120 s).
pub async fn wait_ready(addr: SocketAddr, path: &str) -> Result<()> {
    let t = Instant::now();
    loop {
        if crate::common::get(addr, path).await.is_ok_and(|r| r.status == 200) {
            return Ok(());
        }
        ensure!(t.elapsed() < Duration::from_secs(120), "{addr}{path} not 200 after 120 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
