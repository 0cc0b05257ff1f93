//! An HF `tokenizer.json` (written to a fresh directory, so no config files sit beside it):
//! `Tokenizer::from_file`, then an encode/decode round and the token bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
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
