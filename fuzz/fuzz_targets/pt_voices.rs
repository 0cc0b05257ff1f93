//! Kokoro voice packs as PyTorch archives (`.pt`, a zip with a pickle): `Voices::load_with`
//! on the input written to a file.
//! The loader catches panics of the third-party parser it calls (candle's pickle reader, the
//! tokenizers crate) and turns them into errors; libFuzzer's panic hook would abort on those
//! caught panics, so the hook is replaced by a silent one. A panic that escapes the loader still
//! unwinds out of the target and is reported as a crash.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    static QUIET: std::sync::Once = std::sync::Once::new();
    QUIET.call_once(|| std::panic::set_hook(Box::new(|_| {})));
    let dir = if std::path::Path::new("/dev/shm").is_dir() { "/dev/shm".into() } else { std::env::temp_dir() };
    let path = dir.join(format!("sapient-fuzz-{}.pt", std::process::id()));
    if std::fs::write(&path, data).is_err() {
        return;
    }
    let limits = sapient_tensor::Limits::default().max_alloc_bytes(64 << 20);
    if let Ok(v) = sapient_kokoro::Voices::load_with(&path, &limits) {
        for n in v.names() {
            if let Ok(p) = v.get(n) {
                let _ = p.style_for(3);
            }
        }
    }
});
