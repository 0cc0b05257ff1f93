//! Tokenizers and chat templates against reference outputs (Python `tokenizers` and jinja2,
//! made by scripts/tokenizers/*.py) on real models fetched through the hub.

use anyhow::{Context, Result};
use sapient_hub::Hub;
use sapient_tokenizers::{
    ChatTemplate, Error, Message, RenderOptions, StopMatcher, TokenStream, Tokenizer,
};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/tokenizers")
        .join(name)
}

fn json(path: &Path) -> Result<Value> {
    let s = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    Ok(serde_json::from_str(&s)?)
}

fn corpus() -> Result<Vec<String>> {
    Ok(serde_json::from_value(json(&data("corpus.json"))?)?)
}

fn preset_file(id: &str, role: &str) -> Result<PathBuf> {
    Ok(Hub::new()?
        .fetch_preset(id, &mut |_| {})?
        .file(role)?
        .to_path_buf())
}

fn expected_ids(name: &str) -> Result<Vec<Vec<u32>>> {
    Ok(serde_json::from_value(json(&data(name))?["ids"].clone())?)
}

fn smollm2() -> Result<Tokenizer> {
    let g = sapient_tensor::GgufFile::open(preset_file("smollm2-135m-instruct", "gguf")?)?;
    Ok(Tokenizer::from_gguf(&g)?)
}

fn qwen_json() -> Result<Tokenizer> {
    Ok(Tokenizer::from_file(&preset_file(
        "qwen-tokenizer",
        "tokenizer",
    )?)?)
}

/// Every corpus text encodes to the reference ids, and the ids decode back to the text.
fn check_corpus(tok: &Tokenizer, expected: &str) -> Result<()> {
    let want = expected_ids(expected)?;
    let texts = corpus()?;
    assert_eq!(
        texts.len(),
        want.len(),
        "{expected} is out of date: rerun scripts/tokenizers/expected_ids.py"
    );
    for (text, ids) in texts.iter().zip(want) {
        assert_eq!(tok.encode(text, false)?, ids, "{expected}: text {text:?}");
        assert_eq!(
            tok.decode(&ids, false)?,
            *text,
            "{expected}: round trip of {text:?}"
        );
    }
    Ok(())
}

#[test]
fn smollm2_from_gguf_matches_reference_ids() -> Result<()> {
    let tok = smollm2()?;
    check_corpus(&tok, "smollm2_gguf_ids.json")?;
    assert_eq!(tok.vocab_size(), 49152);
    assert_eq!(
        (tok.bos_token_id(), tok.bos_token()),
        (Some(1), Some("<|im_start|>"))
    );
    assert_eq!(tok.eos_token(), Some("<|im_end|>"));
    // <|im_end|> (the EOS) first, then <|endoftext|>.
    assert_eq!(tok.eos_token_ids(), &[2, 0]);
    assert!(!tok.add_bos());
    assert!(tok.chat_template().is_some());
    Ok(())
}

#[test]
fn qwen_tokenizer_json_matches_reference_ids() -> Result<()> {
    let tok = qwen_json()?;
    check_corpus(&tok, "qwen_tokenizer_json_ids.json")?;
    assert!(
        tok.chat_template().is_some(),
        "template from tokenizer_config.json"
    );
    assert_eq!(tok.eos_token(), Some("<|im_end|>"));
    assert!(tok.eos_token_ids().starts_with(&[151645]) && tok.eos_token_ids().contains(&151643));
    assert_eq!(tok.bos_token_id(), None);
    Ok(())
}

#[test]
fn llama3_tokenizer_json_matches_reference_ids() -> Result<()> {
    let tok = Tokenizer::from_file(&preset_file("llama3-tokenizer", "tokenizer")?)?;
    check_corpus(&tok, "llama3_tokenizer_json_ids.json")?;
    // 128,000 + 256 specials + <|image|> (a Llama 3.2 tokenizer).
    assert_eq!(tok.vocab_size(), 128_257);
    assert_eq!(
        (tok.bos_token_id(), tok.bos_token()),
        (Some(128_000), Some("<|begin_of_text|>"))
    );
    // No add_bos_token in its tokenizer_config.json: the post-processor adds BOS.
    assert!(tok.add_bos());
    assert_eq!(tok.encode("Hi", true)?, vec![128_000, 13347]);
    assert_eq!(tok.eos_token_ids()[0], 128_001, "<|end_of_text|>");
    assert!(tok.eos_token_ids().contains(&128_009), "<|eot_id|>");
    assert!(
        tok.chat_template().is_none(),
        "this tokenizer_config.json has no template"
    );
    Ok(())
}

/// The key check: a tokenizer built from the Qwen2.5 GGUF metadata encodes like the HF
/// tokenizer.json. Opt-in (the GGUF is 0.5 GB): SAPIENT_QWEN_TESTS=1.
#[test]
fn qwen_gguf_tokenizer_equals_hf_tokenizer_json() -> Result<()> {
    if std::env::var("SAPIENT_QWEN_TESTS").ok().as_deref() != Some("1") {
        eprintln!("skipped: set SAPIENT_QWEN_TESTS=1 (fetches the 0.5 GB Qwen2.5-Coder-0.5B GGUF)");
        return Ok(());
    }
    let g = sapient_tensor::GgufFile::open(preset_file("qwen2.5-coder-0.5b-instruct", "gguf")?)?;
    let from_gguf = Tokenizer::from_gguf(&g)?;
    // The reference ids (Python tokenizers on the HF tokenizer.json).
    check_corpus(&from_gguf, "qwen_tokenizer_json_ids.json")?;
    // And on the fly against our HF tokenizer.json loader, on longer texts: this crate's sources.
    let hf = qwen_json()?;
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut n = 0;
    for file in [
        "src/lib.rs",
        "src/gguf.rs",
        "src/template.rs",
        "src/stream.rs",
        "tests/reference.rs",
    ] {
        let text = std::fs::read_to_string(dir.join(file))?;
        let ids = from_gguf.encode(&text, false)?;
        assert_eq!(ids, hf.encode(&text, false)?, "{file}");
        assert_eq!(from_gguf.decode(&ids, false)?, text);
        n += ids.len();
    }
    eprintln!("{n} tokens of source code agree");
    // The specials the GGUF defines (Qwen2.5's; the Qwen3 tokenizer.json adds more past them).
    for id in 151_643..=151_664u32 {
        let s = from_gguf.id_to_token(id).expect("special in the GGUF");
        assert_eq!(hf.token_to_id(&s), Some(id), "{s}");
        assert_eq!(
            from_gguf.encode(&format!("x{s}y"), false)?,
            hf.encode(&format!("x{s}y"), false)?,
            "{s}"
        );
    }
    assert_eq!(from_gguf.eos_token(), Some("<|im_end|>"));
    assert!(
        from_gguf.eos_token_ids().contains(&151_643),
        "<|endoftext|> ends a generation too"
    );
    let tpl = from_gguf
        .chat_template()
        .expect("Qwen GGUF has a chat template");
    let want = json(&data("rendered.json"))?;
    let want = want["renderings"]
        .as_array()
        .and_then(|r| {
            r.iter()
                .find(|r| r["template"] == "qwen2.5" && r["conversation"] == 0)
        })
        .and_then(|r| r["rendered"].as_str())
        .context("qwen2.5 rendering")?
        .to_string();
    let convs = json(&data("conversations.json"))?;
    let messages: Vec<Message> = serde_json::from_value(convs[0]["messages"].clone())?;
    assert_eq!(tpl.render(&messages, &RenderOptions::default())?, want);
    Ok(())
}

/// Compare our renderings with jinja2's (`renderings`: template source, conversation, bos/eos,
/// and the rendered string, or `{"error": message}` when the template's raise_exception fired,
/// or `{"failure": ...}` when jinja2 itself failed on the template: there minijinja may be more
/// lenient, e.g. a `for` loop over `none` renders nothing instead of raising a TypeError).
fn check_renderings(
    file: &Value,
    source_of: &dyn Fn(&Value) -> Result<String>,
) -> Result<(usize, Vec<String>)> {
    let convs = json(&data("conversations.json"))?;
    let mut other_convs: std::collections::HashMap<String, Value> = Default::default();
    let date = std::time::UNIX_EPOCH
        + std::time::Duration::from_secs(file["date_unix"].as_u64().context("date_unix")?);
    let mut failures = Vec::new();
    let mut n = 0;
    for r in file["renderings"].as_array().context("renderings")? {
        let name = r["template"].as_str().context("template")?;
        let i = r["conversation"].as_u64().context("conversation")? as usize;
        // Thinking-mode renderings name their own conversations file and extra variables.
        let c = match r["conversations"].as_str() {
            Some(f) => {
                if !other_convs.contains_key(f) {
                    other_convs.insert(f.to_string(), json(&data(f))?);
                }
                &other_convs[f][i]
            }
            None => &convs[i],
        };
        let messages: Vec<Message> = serde_json::from_value(c["messages"].clone())?;
        let opts = RenderOptions {
            add_generation_prompt: c
                .get("add_generation_prompt")
                .and_then(|v| v.as_bool())
                .unwrap_or(true),
            tools: c.get("tools").cloned(),
            extra: r["extra"].as_object().cloned().unwrap_or_default(),
            date: Some(date),
        };
        n += 1;
        let ours = ChatTemplate::new(&source_of(r)?, r["bos"].as_str(), r["eos"].as_str())
            .and_then(|t| t.render(&messages, &opts));
        let problem = match (&r["rendered"], ours) {
            (Value::String(want), Ok(got)) if *want == got => None,
            (Value::String(want), Ok(got)) => Some(format!(
                "rendered differently:\n--- jinja2\n{want}\n--- ours\n{got}"
            )),
            (Value::String(_), Err(e)) => Some(format!("failed: {e}")),
            (want, Ok(_)) if want.get("failure").is_some() => None,
            (want, Ok(_)) => Some(format!("rendered, but jinja2 raised {want}")),
            (want, Err(e)) => match want["error"].as_str() {
                Some(msg) if !e.to_string().contains(msg) => {
                    Some(format!("raised {e}, jinja2 raised {msg}"))
                }
                _ => None,
            },
        };
        if let Some(p) = problem {
            failures.push(format!("{name}, conversation {i}: {p}"));
        }
    }
    Ok((n, failures))
}

#[test]
fn templates_render_like_jinja2() -> Result<()> {
    let file = json(&data("rendered.json"))?;
    let (n, failures) = check_renderings(&file, &|r| {
        let name = r["template"].as_str().context("template")?;
        Ok(std::fs::read_to_string(data(&format!(
            "templates/{name}.jinja"
        )))?)
    })?;
    assert!(n >= 100, "{n} renderings");
    assert!(
        failures.is_empty(),
        "{} of {n} differ:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
    Ok(())
}

/// Opt-in: every template of a folder (llama.cpp's models/templates has ~70 real ones), rendered by
/// jinja2 with `render_templates.py --sweep DIR OUT.json`; SAPIENT_TEMPLATE_SWEEP=OUT.json.
#[test]
fn template_sweep_renders_like_jinja2() -> Result<()> {
    let Some(path) = std::env::var_os("SAPIENT_TEMPLATE_SWEEP") else {
        eprintln!(
            "skipped: set SAPIENT_TEMPLATE_SWEEP to the output of render_templates.py --sweep"
        );
        return Ok(());
    };
    let file = json(Path::new(&path))?;
    let (n, failures) = check_renderings(&file, &|r| {
        Ok(std::fs::read_to_string(
            r["path"].as_str().context("path")?,
        )?)
    })?;
    eprintln!("{} of {n} renderings agree with jinja2", n - failures.len());
    for f in &failures {
        eprintln!("{}\n", f.chars().take(1500).collect::<String>());
    }
    let max_failures: usize = std::env::var("SAPIENT_TEMPLATE_SWEEP_MAX_FAILURES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!(
        failures.len() <= max_failures,
        "{} of {n} differ",
        failures.len()
    );
    Ok(())
}

/// Stream `ids` one at a time; the chunks must add up to `decode(ids)` and never end inside a
/// character.
fn check_stream(tok: &Tokenizer, ids: &[u32], skip_special: bool) -> Result<()> {
    let mut s = TokenStream::new(tok.clone(), skip_special);
    let mut out = String::new();
    for &id in ids {
        if let Some(piece) = s.push(id)? {
            out.push_str(&piece);
        }
    }
    if let Some(rest) = s.finish()? {
        out.push_str(&rest);
    }
    assert_eq!(out, tok.decode(ids, skip_special)?, "ids {ids:?}");
    Ok(())
}

#[test]
fn streaming_detokenizer_adds_up_to_decode() -> Result<()> {
    for tok in [smollm2()?, qwen_json()?] {
        for text in corpus()? {
            let ids = tok.encode(&text, false)?;
            // Real text: no replacement character ever reaches the output.
            let mut s = TokenStream::new(tok.clone(), false);
            for &id in &ids {
                if let Some(piece) = s.push(id)? {
                    assert!(
                        !piece.contains('\u{FFFD}'),
                        "partial character emitted for {text:?}"
                    );
                }
            }
            check_stream(&tok, &ids, false)?;
            check_stream(&tok, &ids, true)?;
        }
        // Random ids (invalid UTF-8 byte sequences included), deterministic.
        let n = tok.vocab_size() as u64;
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..200 {
            let ids: Vec<u32> = (0..24)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    // Mostly low ids (single bytes and short pieces), some anywhere.
                    (if x.is_multiple_of(3) { x % n } else { x % 300 }) as u32
                })
                .collect();
            check_stream(&tok, &ids, false)?;
            check_stream(&tok, &ids, true)?;
        }
    }
    Ok(())
}

#[test]
fn streaming_holds_back_split_characters() -> Result<()> {
    let tok = smollm2()?;
    // "é" is two bytes; in GPT-2's byte alphabet they are the tokens "Ã" and "©".
    let (a, b) = (
        tok.token_to_id("Ã").context("Ã")?,
        tok.token_to_id("©").context("©")?,
    );
    let hi = tok.encode("hi", false)?;
    let mut s = TokenStream::new(tok.clone(), false);
    assert_eq!(s.push(hi[0])?, Some("hi".into()));
    assert_eq!(s.push(a)?, None, "first byte of é held back");
    assert_eq!(s.push(b)?, Some("é".into()));
    // A lone first byte at the very end comes out as U+FFFD, as decode gives it.
    assert_eq!(s.push(a)?, None);
    assert_eq!(s.finish()?, Some("\u{FFFD}".into()));
    assert_eq!(s.tokens().len(), 4);
    // A bad id is an error, and the stream goes on.
    assert!(matches!(
        s.push(1_000_000),
        Err(Error::UnknownId { id: 1_000_000, .. })
    ));
    s.reset();
    assert_eq!(s.push(hi[0])?, Some("hi".into()));
    Ok(())
}

#[test]
fn token_bytes_spell_the_text() -> Result<()> {
    for tok in [smollm2()?, qwen_json()?] {
        let table = tok.token_bytes();
        assert_eq!(table.len(), tok.vocab_size());
        for text in corpus()? {
            let ids = tok.encode(&text, false)?;
            let bytes: Vec<u8> = ids
                .iter()
                .flat_map(|&i| table[i as usize].iter().copied())
                .collect();
            assert_eq!(bytes, text.as_bytes(), "{text:?}");
        }
        // A byte-level token that is half a character.
        let id = tok.token_to_id("Ã").context("Ã")?;
        assert_eq!(table[id as usize], vec![0xC3]);
    }
    Ok(())
}

#[test]
fn special_tokens_and_stop_strings() -> Result<()> {
    let tok = smollm2()?;
    let ids = tok.encode("<|im_start|>user\nhi<|im_end|>", false)?;
    assert_eq!(ids[0], 1);
    assert_eq!(*ids.last().unwrap(), 2);
    assert_eq!(tok.decode(&ids, true)?, "user\nhi");
    assert_eq!(tok.decode(&ids, false)?, "<|im_start|>user\nhi<|im_end|>");
    let mut m = StopMatcher::new(vec!["\n\n".into()]);
    let a = m.push("line one\n");
    assert_eq!(a.emit, "line one");
    let b = m.push("\nline two");
    assert!(b.stopped && b.emit.is_empty());
    assert!(matches!(
        tok.decode(&[999_999], false),
        Err(Error::UnknownId {
            id: 999_999,
            vocab_size: 49152
        })
    ));
    Ok(())
}

/// A tokenizer folder as HF writes it: tokenizer.json plus tokenizer_config.json,
/// chat_template.jinja and generation_config.json.
#[test]
fn from_file_reads_the_files_beside_it() -> Result<()> {
    let dir = std::env::temp_dir().join(format!("sapient-tok-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let vocab: serde_json::Map<String, Value> = ["<s>", "</s>", "<eot>", "h", "i", "hi"]
        .iter()
        .enumerate()
        .map(|(i, t)| (t.to_string(), Value::from(i)))
        .collect();
    let tokenizer = serde_json::json!({
        "version": "1.0",
        "added_tokens": [
            {"id": 0, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
            {"id": 1, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
            {"id": 2, "content": "<eot>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}
        ],
        "model": {"type": "BPE", "vocab": vocab, "merges": [["h", "i"]]}
    });
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string())?;
    std::fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"bos_token": {"content": "<s>"}, "eos_token": "</s>", "add_bos_token": true, "chat_template": "ignored"}"#,
    )?;
    std::fs::write(
        dir.join("chat_template.jinja"),
        "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}",
    )?;
    std::fs::write(
        dir.join("generation_config.json"),
        r#"{"eos_token_id": [1, 2]}"#,
    )?;
    let tok = Tokenizer::from_file(&dir.join("tokenizer.json"))?;
    assert_eq!(tok.encode("hi", true)?, vec![0, 5]);
    assert_eq!(
        (tok.bos_token(), tok.eos_token()),
        (Some("<s>"), Some("</s>"))
    );
    assert_eq!(tok.eos_token_ids(), &[1, 2]);
    let out = tok
        .chat_template()
        .context("template")?
        .render(&[Message::user("hi")], &RenderOptions::default())?;
    assert_eq!(out, "<s>hi</s>");
    assert_eq!(tok.token_bytes()[5], b"hi");
    // A broken config is an error naming the file.
    std::fs::write(dir.join("tokenizer_config.json"), "{not json")?;
    let e = Tokenizer::from_file(&dir.join("tokenizer.json"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("tokenizer_config.json"), "{e}");
    std::fs::write(dir.join("tokenizer_config.json"), "{}")?;
    std::fs::write(dir.join("chat_template.jinja"), "{% if %}")?;
    let e = Tokenizer::from_file(&dir.join("tokenizer.json"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("chat template"), "{e}");
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

#[test]
fn bad_inputs_are_clear_errors() {
    let e = Tokenizer::from_file(Path::new("/nonexistent/tokenizer.json")).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/tokenizer.json"), "{e}");
    // A GGUF with an unknown tokenizer model.
    let mut w = sapient_tensor::GgufWriter::new();
    w.set(
        "tokenizer.ggml.model",
        sapient_tensor::Value::String("wordpiece9".into()),
    )
    .set(
        "tokenizer.ggml.tokens",
        sapient_tensor::Value::string_array(["a", "b"]),
    );
    let g = sapient_tensor::GgufFile::from_bytes("t.gguf", w.to_bytes()).unwrap();
    let e = Tokenizer::from_gguf(&g).unwrap_err();
    assert!(matches!(e, Error::UnsupportedModel { .. }));
    let e = e.to_string();
    assert!(e.contains("wordpiece9") && e.contains("t.gguf"), "{e}");
    let e = ChatTemplate::new("{% if %}", None, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("chat template"), "{e}");
}
