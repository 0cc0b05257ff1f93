//! Kokoro voice packs as PyTorch archives (`.pt`, a zip with a pickle): `Voices::load_with`
//! on the input written to a file.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
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
