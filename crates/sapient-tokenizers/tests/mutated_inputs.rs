//! CI-sized mutation runs over what this crate reads from outside: `tokenizer.json`, GGUF
//! tokenizer metadata and chat templates rendering mutated messages (the `fuzz/` targets run
//! the same code for longer). Any panic fails, naming the input saved to the temp dir.

#[path = "../../sapient-tensor/tests/support/hostile.rs"]
mod support;

use sapient_tensor::gguf::{GgufWriter, Value};
use sapient_tensor::GgufFile;
use sapient_tokenizers::{ChatTemplate, Message, RenderOptions, Tokenizer};
use std::time::Duration;

const BUDGET: Duration = Duration::from_secs(3);

const TOKENIZER_JSON: &str = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[{"id":4,"content":"<|im_end|>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}],"normalizer":null,"pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true},"post_processor":null,"decoder":{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":true,"use_regex":true},"model":{"type":"BPE","dropout":null,"unk_token":null,"continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,"vocab":{"a":0,"b":1,"ab":2,"Ġ":3,"<|im_end|>":4},"merges":["a b"]}}"#;

#[test]
fn mutated_tokenizer_json_never_panics() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("tokenizer.json");
    std::fs::write(&p, TOKENIZER_JSON).unwrap();
    let t = Tokenizer::from_file(&p).unwrap();
    assert_eq!(t.encode("ab a", false).unwrap(), vec![2, 3, 0]);
    let (ran, ok) = support::mutation_run("tokenizer.json", &[TOKENIZER_JSON.as_bytes().to_vec()], 5_000, BUDGET, |d| {
        if std::fs::write(&p, d).is_err() {
            return false;
        }
        let Ok(t) = Tokenizer::from_file(&p) else { return false };
        if let Ok(ids) = t.encode("ab ba <|im_end|> \u{e9}", true) {
            let _ = t.decode(&ids, false);
        }
        let _ = t.token_bytes();
        true
    });
    // JSON breaks under most mutations; those that keep it valid reach the tokenizer.
    assert!(ran >= 300 && ok >= 3, "{ok} of {ran} loaded");
}

fn gguf_tokenizer() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.set("general.architecture", Value::String("llama".into()))
        .set("tokenizer.ggml.model", Value::String("gpt2".into()))
        .set("tokenizer.ggml.pre", Value::String("smollm".into()))
        .set("tokenizer.ggml.tokens", Value::string_array(["a", "b", "ab", "Ġ", "<|im_end|>", "<|im_start|>"]))
        .set("tokenizer.ggml.token_type", Value::i32_array([1, 1, 1, 1, 3, 3]))
        .set("tokenizer.ggml.merges", Value::string_array(["a b"]))
        .set("tokenizer.ggml.bos_token_id", Value::U32(5))
        .set("tokenizer.ggml.eos_token_id", Value::U32(4))
        .set(
            "tokenizer.chat_template",
            Value::String("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}".into()),
        );
    w.to_bytes()
}

#[test]
fn mutated_gguf_tokenizer_metadata_never_panics() {
    let seed = gguf_tokenizer();
    let t = Tokenizer::from_gguf(&GgufFile::from_bytes("seed.gguf", seed.clone()).unwrap()).unwrap();
    assert_eq!(t.encode("ab", false).unwrap(), vec![2]);
    let (ran, ok) = support::mutation_run("gguf tokenizer", &[seed], 20_000, BUDGET, |d| {
        let Ok(g) = GgufFile::from_bytes("m.gguf", d.to_vec()) else { return false };
        let Ok(t) = Tokenizer::from_gguf(&g) else { return false };
        if let Ok(ids) = t.encode("ab ba <|im_end|>", true) {
            let _ = t.decode(&ids, false);
        }
        if let Some(ct) = t.chat_template() {
            let _ = ct.render(&[Message::user("hi")], &RenderOptions::default());
        }
        true
    });
    assert!(ran >= 500 && ok > ran / 50, "{ok} of {ran} loaded");
}

#[test]
fn templates_render_mutated_messages() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/tokenizers/templates");
    let templates: Vec<ChatTemplate> = ["llama3.1.jinja", "hermes3-tool-use.jinja", "mistral-v3.jinja", "gemma2.jinja"]
        .iter()
        .map(|n| ChatTemplate::new(&std::fs::read_to_string(dir.join(n)).unwrap(), Some("<s>"), Some("</s>")).unwrap())
        .collect();
    let seed = "user\0Hello {{ there }}\0assistant\0{% raw %}hi\0user\0<|im_end|>\u{1b}\0tool\0{\"a\": [1, {}]}".as_bytes().to_vec();
    let (ran, ok) = support::mutation_run("templates", &[seed], 20_000, BUDGET, |d| {
        let text = String::from_utf8_lossy(d);
        let parts: Vec<&str> = text.split('\0').collect();
        let msgs: Vec<Message> = parts.chunks(2).map(|c| Message::new(c[0], c.get(1).copied().unwrap_or(""))).collect();
        let opts = RenderOptions { tools: serde_json::from_str(parts.last().copied().unwrap_or("")).ok(), ..Default::default() };
        let t = &templates[d.len() % templates.len()];
        t.render(&msgs, &opts).is_ok()
    });
    // Templates raise on roles they do not know: many renderings are errors, none panics.
    assert!(ran >= 500 && ok > 0, "{ok} of {ran} rendered");
}

/// Regression: a JSON syntax error inside the `decoder` section made the `tokenizers` crate
/// panic (it unwraps the decoder's deserialization); it is now an error naming the position,
/// as a decoder of the wrong shape is.
#[test]
fn malformed_decoder_sections_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("tokenizer.json");
    let good = r#""decoder":{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":true,"use_regex":true}"#;
    assert!(TOKENIZER_JSON.contains(good));
    for (bad, want) in [
        (r#""decoder":{"type":"ByteLevel","add_prefix_space" true}"#, "invalid JSON: expected `:`"),
        (r#""decoder":{"type":7}"#, "did not match any variant"),
        (r#""decoder":[1,2]"#, "did not match any variant"),
    ] {
        std::fs::write(&p, TOKENIZER_JSON.replace(good, bad)).unwrap();
        let e = Tokenizer::from_file(&p).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("tokenizer.json") && e.contains(want), "{bad}: {e}");
    }
}

/// Regression (found by the `tokenizer_json` fuzz target): a merge whose result is longer than
/// every token of the vocabulary made the `tokenizers` crate index out of bounds.
#[test]
fn a_merge_outside_the_vocabulary_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("tokenizer.json");
    let bad = TOKENIZER_JSON.replace(r#""vocab":{"a":0,"b":1,"ab":2,"Ġ":3,"<|im_end|>":4}"#, r#""vocab":{"a":8,"b":1}"#);
    assert_ne!(bad, TOKENIZER_JSON);
    std::fs::write(&p, bad).unwrap();
    let e = Tokenizer::from_file(&p).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains(r#"merge 0 ("a" "b") makes "ab", which is not in the vocabulary"#), "{e}");
}
