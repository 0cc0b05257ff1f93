//! GGUF tokenizer metadata (`tokenizer.ggml.*`) to a tokenizer: `Tokenizer::from_gguf`, then
//! an encode/decode round (commands: docs/reliability.md).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(g) = sapient_tensor::GgufFile::from_bytes("fuzz.gguf", data.to_vec()) else { return };
    if let Ok(t) = sapient_tokenizers::Tokenizer::from_gguf(&g) {
        if let Ok(ids) = t.encode("Hello, world! <|im_end|> 123", true) {
            let _ = t.decode(&ids, false);
        }
        let _ = t.token_bytes();
        if let Some(ct) = t.chat_template() {
            let _ = ct.render(&[sapient_tokenizers::Message::user("hi")], &Default::default());
        }
    }
});
