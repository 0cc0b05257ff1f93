//! Helpers shared by the engine tests.

use anyhow::Result;
use sapient_generate::Engine;
use std::time::{Duration, Instant};

/// Wait (up to a minute) until `engine` has nothing running or waiting and holds no block.
pub fn wait_idle(engine: &Engine) -> Result<()> {
    let t = Instant::now();
    while engine.metrics().running > 0 || engine.metrics().waiting > 0 || engine.metrics().kv.used_blocks > 0 {
        anyhow::ensure!(t.elapsed() < Duration::from_secs(60), "engine did not go idle: {:?}", engine.metrics());
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}
