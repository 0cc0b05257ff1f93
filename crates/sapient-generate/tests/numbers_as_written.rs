//! A JSON Schema constraint never changes the numbers a model writes: every form JSON allows
//! (`2.0`, `19.90`, `1e-7`, `-0.0`) can be written token by token, and a real model asked to
//! copy a document copies it the same with the constraint as without.

use anyhow::Result;
use sapient_generate::{FinishReason, GenerationConfig, Grammar, Message, Pipeline, PipelineOptions};
use sapient_sample::Matcher;
use std::sync::Arc;

fn schema() -> serde_json::Value {
    serde_json::json!({
        "type": "object",
        "properties": {"price": {"type": "number"}, "qty": {"type": "number", "minimum": -5, "maximum": 100}},
        "required": ["price", "qty"]
    })
}

const DOCS: [&str; 4] = [
    r#"{"price":2.0,"qty":10.0}"#,
    r#"{"price":19.90,"qty":1.50}"#,
    r#"{"price":1e-7,"qty":-0.0}"#,
    r#"{"price":-12.500E+2,"qty":99.99}"#,
];

fn load(preset: &str) -> Pipeline {
    Pipeline::load(preset, PipelineOptions { max_seq_len: Some(512), ..Default::default() }, |_| {}).expect("the model loads")
}

/// Every token of each document, as the model's tokenizer splits it, is allowed in turn by
/// the constraint's token masks, and the document is complete at its end.
fn tokens_are_allowed(p: &Pipeline) -> Result<()> {
    let grammar = Arc::new(Grammar::json_schema(&schema())?);
    let index = p.model().token_index();
    for doc in DOCS {
        let ids = p.model().tokenizer().encode(doc, false)?;
        let mut m = Matcher::new(grammar.clone(), index.clone());
        for &t in &ids {
            assert!(m.mask()?.is_allowed(t), "{doc}: token {t} refused after {:?}", m.stats());
            m.consume(t)?;
        }
        assert!(m.is_accepting(), "{doc} is complete");
    }
    Ok(())
}

/// Copies of each document, greedy, with and without the constraint: where the model copies
/// the numbers without it, it copies them the same with it. The documents are shown spaced
/// (`{"price": 2.0, ...}`, as the model writes JSON), and the constraint uses that layout, so
/// that only the numbers' rules are compared (the compact layout changes the text the model
/// continues from, and with it a small model's choices).
fn copies_are_unchanged(p: &Pipeline, all_exact: bool) -> Result<()> {
    let grammar = Grammar::with_options(&sapient_generate::Expr::JsonSchema(schema()), sapient_generate::JsonOptions::spaced())?;
    let mut exact = 0;
    for doc in DOCS {
        let spaced = doc.replace(':', ": ").replace(',', ", ");
        let q = vec![Message::user(format!("Copy this JSON exactly: {spaced}"))];
        let free = p.chat(&q, &GenerationConfig::default().max_tokens(48))?;
        let held = p.chat(&q, &GenerationConfig::default().max_tokens(48).constrain(grammar.clone()))?;
        eprintln!("{doc}\n  free: {:?}\n  held: {:?} ({:?})", free.text, held.text, held.finish);
        assert_eq!(held.finish, FinishReason::Eos, "the constrained copy completes");
        let held_v: serde_json::Value = serde_json::from_str(&held.text)?;
        assert!(held_v["price"].is_number() && held_v["qty"].is_number());
        // The numbers' texts as the model wrote them.
        let numbers = |t: &str| -> Vec<String> {
            let mut out = Vec::new();
            let mut cur = String::new();
            for c in t.chars() {
                if c.is_ascii_digit() || ".-+eE".contains(c) && !cur.is_empty() || c == '-' {
                    cur.push(c);
                } else if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
            }
            if !cur.is_empty() {
                out.push(cur);
            }
            out
        };
        let want = numbers(doc);
        if numbers(&free.text).starts_with(&want) {
            assert_eq!(numbers(&held.text), want, "the constraint changed the numbers the model writes");
        }
        if numbers(&held.text) == want {
            exact += 1;
        }
    }
    if all_exact {
        assert_eq!(exact, DOCS.len(), "every document copied exactly");
    }
    Ok(())
}

#[test]
fn smollm2_numbers_as_written() -> Result<()> {
    let p = load("smollm2-135m-instruct");
    tokens_are_allowed(&p)?;
    copies_are_unchanged(&p, true)
}

/// The issue's own example: Qwen2.5-Coder 0.5B (a 491 MB download; opt-in).
#[test]
#[ignore]
fn qwen_copies_numbers_exactly() -> Result<()> {
    let p = load("qwen2.5-coder-0.5b-instruct");
    tokens_are_allowed(&p)?;
    copies_are_unchanged(&p, true)
}
