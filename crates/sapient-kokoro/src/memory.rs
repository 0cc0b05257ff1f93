//! The memory probe of loading and synthesis.

/// Where memory goes, stage by stage: this process's resident set now and its peak so far
/// (`VmRSS`, `VmHWM` of /proc/self/status, MB) as a `tracing` debug event of target
/// `sapient_kokoro::memory` (`RUST_LOG=sapient_kokoro::memory=debug`); nothing is read when
/// that target is off or there is no such file.
pub(crate) fn memory_probe(stage: &str) {
    if !tracing::enabled!(target: "sapient_kokoro::memory", tracing::Level::DEBUG) {
        return;
    }
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else { return };
    let mb = |key: &str| -> Option<f64> {
        let line = status.lines().find(|l| l.starts_with(key))?;
        Some(line.split_whitespace().nth(1)?.parse::<f64>().ok()? / 1024.0)
    };
    if let (Some(rss), Some(hwm)) = (mb("VmRSS:"), mb("VmHWM:")) {
        tracing::debug!(target: "sapient_kokoro::memory", "{stage}: resident {rss:.1} MB, peak {hwm:.1} MB");
    }
}
