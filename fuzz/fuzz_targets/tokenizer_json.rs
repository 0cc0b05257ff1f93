//! An HF `tokenizer.json` (written to a fresh directory, so no config files sit beside it):
//! `Tokenizer::from_file`, then an encode/decode round and the token bytes.
//! The loader catches panics of the third-party parser it calls (candle's pickle reader, the
//! tokenizers crate) and turns them into errors; libFuzzer's panic hook would abort on those
//! caught panics, so the hook is replaced by a silent one. A panic that escapes the loader still
//! unwinds out of the target and is reported as a crash.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    static QUIET: std::sync::Once = std::sync::Once::new();
    QUIET.call_once(|| std::panic::set_hook(Box::new(|_| {})));
    let base = if std::path::Path::new("/dev/shm").is_dir() { "/dev/shm".into() } else { std::env::temp_dir() };
    let dir = base.join(format!("sapient-fuzz-tok-{}", std::process::id()));
    if std::fs::create_dir_all(&dir).is_err() {
        return;
    }
    let path = dir.join("tokenizer.json");
    if std::fs::write(&path, data).is_err() {
        return;
    }
    if let Ok(t) = sapient_tokenizers::Tokenizer::from_file(&path) {
        if let Ok(ids) = t.encode("Hello, world! \u{e9}\u{4e2d} 123", true) {
            let _ = t.decode(&ids, false);
        }
        let _ = t.token_bytes();
    }
});
