//! Micro-benchmark (divan) of constrained-generation token masks, the per-token work of
//! `cargo xtask bench sample` without its trie-walk baseline and end-to-end runs:
//!
//! ```sh
//! cargo bench -p sapient-generate --bench constrained_mask
//! cargo bench -p sapient-generate --bench constrained_mask -- smollm2   # one vocabulary (or qwen)
//! ```
//!
//! A valid document for each constraint (a nested JSON schema, a regex, free JSON) is
//! tokenized with the vocabulary's tokenizer and replayed once to record the parser state
//! before each token. `mask` times `TokenIndex::mask` at every one of those states (the
//! per-DFA-state token sets are built during the replay, so this is the warm case) and
//! `check` times checking the document's own token against each state (what sampler-aware
//! sampling does when the sampler's choice is allowed). Divan reports the time per
//! document and, with the item counter, per token.

use sapient_sample::{Constraint, Grammar, GrammarState, Matcher, TokenIndex};
use sapient_tokenizers::Tokenizer;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

fn main() {
    divan::main();
}

const WORKLOADS: &[&str] = &["json-schema-nested", "regex", "free-json"];

fn nested_schema() -> serde_json::Value {
    serde_json::json!({
        "type": "object",
        "properties": {
            "id": {"type": "string", "pattern": "^ord-[0-9]{6}$"},
            "customer": {"type": "object", "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 64},
                "email": {"type": "string", "format": "email"},
                "address": {"type": "object", "properties": {
                    "street": {"type": "string"}, "city": {"type": "string"},
                    "country": {"enum": ["FR", "DE", "US", "JP"]},
                    "zip": {"type": "string", "pattern": "^[0-9]{5}$"}
                }, "required": ["street", "city", "country"]}
            }, "required": ["name", "address"]},
            "items": {"type": "array", "minItems": 1, "maxItems": 20, "items": {"type": "object", "properties": {
                "sku": {"type": "string"},
                "quantity": {"type": "integer", "minimum": 1, "maximum": 1000},
                "price": {"type": "number", "minimum": 0},
                "gift": {"type": "boolean"}
            }, "required": ["sku", "quantity", "price"]}},
            "status": {"enum": ["pending", "paid", "shipped"]},
            "notes": {"type": ["string", "null"]}
        },
        "required": ["id", "customer", "items", "status"]
    })
}

const NESTED_DOC: &str = r#"{
  "id": "ord-004211",
  "customer": {
    "name": "Amélie Poulain",
    "email": "amelie.poulain@example.fr",
    "address": {"street": "15 rue des Trois Frères", "city": "Paris", "country": "FR", "zip": "75018"}
  },
  "items": [
    {"sku": "GNOME-GARDEN-01", "quantity": 1, "price": 24.9, "gift": true},
    {"sku": "PHOTO-BOOTH-STRIP", "quantity": 12, "price": 3.5}
  ],
  "status": "paid",
  "notes": "Leave the parcel with the grocer downstairs if nobody answers."
}"#;
const REGEX: &str = r"(Mr|Ms|Dr)\. [A-Z][a-z]{1,15} [A-Z][a-z]{1,20}, born (19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01]), phone \+[0-9]{1,3} [0-9]{3}-[0-9]{3}-[0-9]{4}, email [a-z0-9.]{1,30}@[a-z0-9]{1,20}\.(com|org|net|fr)";
const REGEX_DOC: &str = "Dr. Grace Hopper, born 1906-12-09, phone +1 212-555-0147, email grace.hopper@navy.org";
const FREE_DOC: &str = r#"{"model": "smollm2", "layers": 30, "rope": {"theta": 100000, "scaling": null}, "vocab": [49152, "byte-level"], "tied": true, "notes": "a small \"instruct\" model\nwith 135M parameters", "ratios": [0.5, 1e-3, -2.25]}"#;

/// A replayed document: the grammar, the vocabulary index, and (state, next token) pairs.
struct Replay {
    grammar: Arc<Grammar>,
    index: Arc<TokenIndex>,
    steps: Vec<(GrammarState, u32)>,
}

fn tokenizer(preset: &str) -> (Tokenizer, Arc<TokenIndex>) {
    let hub = sapient_hub::Hub::new().expect("hub");
    let m = hub.fetch_preset(preset, &mut |_| {}).unwrap_or_else(|e| panic!("fetching {preset}: {e}"));
    let tok = match m.file("tokenizer") {
        Ok(p) => Tokenizer::from_file(p).expect("tokenizer.json"),
        Err(_) => Tokenizer::from_gguf(&sapient_tensor::GgufFile::open(m.file("gguf").expect("gguf")).expect("gguf opens")).expect("tokenizer"),
    };
    let special: Vec<u32> = tok.inner().get_added_tokens_decoder().iter().filter(|(_, t)| t.special).map(|(id, _)| *id).collect();
    let index = Arc::new(TokenIndex::new(tok.token_bytes(), tok.eos_token_ids(), &special));
    (tok, index)
}

/// Loaded vocabularies by preset, and replays by (vocabulary, workload).
type Cache<K, V> = OnceLock<Mutex<HashMap<K, V>>>;

fn replay(vocab: &str, workload: &str) -> Arc<Replay> {
    static TOKENIZERS: Cache<String, (Arc<Tokenizer>, Arc<TokenIndex>)> = OnceLock::new();
    static REPLAYS: Cache<(String, String), Arc<Replay>> = OnceLock::new();
    let key = (vocab.to_string(), workload.to_string());
    if let Some(r) = REPLAYS.get_or_init(Default::default).lock().unwrap().get(&key) {
        return r.clone();
    }
    let (tok, index) = TOKENIZERS
        .get_or_init(Default::default)
        .lock()
        .unwrap()
        .entry(vocab.to_string())
        .or_insert_with(|| {
            let (t, i) = tokenizer(vocab);
            (Arc::new(t), i)
        })
        .clone();
    // The documents have whitespace: flexible JSON layout (the default is compact).
    let flexible = sapient_sample::JsonOptions::flexible(24);
    let (grammar, doc) = match workload {
        "json-schema-nested" => (Grammar::with_options(&sapient_sample::Expr::JsonSchema(nested_schema()), flexible).unwrap(), NESTED_DOC),
        "regex" => (Grammar::regex(REGEX).unwrap(), REGEX_DOC),
        _ => (Grammar::with_options(&sapient_sample::Expr::Json, flexible).unwrap(), FREE_DOC),
    };
    let grammar = Arc::new(grammar);
    let mut m = Matcher::new(grammar.clone(), index.clone());
    let mut steps = Vec::new();
    for t in tok.encode(doc, false).unwrap() {
        // Build the per-DFA-state sets on the way (the warm case), and check the document.
        assert!(index.mask(&*grammar, m.state()).unwrap().is_allowed(t));
        steps.push((m.state().clone(), t));
        m.consume(t).unwrap();
    }
    assert!(grammar.is_accepting(m.state()), "{workload}: the document completes the grammar");
    let r = Arc::new(Replay { grammar, index, steps });
    REPLAYS.get_or_init(Default::default).lock().unwrap().insert(key, r.clone());
    r
}

fn bench_mask(bencher: divan::Bencher, vocab: &str, workload: &str) {
    let r = replay(vocab, workload);
    bencher.counter(divan::counter::ItemsCount::new(r.steps.len())).bench(|| {
        for (state, _) in &r.steps {
            divan::black_box(r.index.mask(&*r.grammar, state).unwrap());
        }
    });
}

fn bench_check(bencher: divan::Bencher, vocab: &str, workload: &str) {
    let r = replay(vocab, workload);
    bencher.counter(divan::counter::ItemsCount::new(r.steps.len())).bench(|| {
        for (state, t) in &r.steps {
            divan::black_box(r.index.check_token(&*r.grammar, state, *t).unwrap());
        }
    });
}

/// SmolLM2's vocabulary (49,152 tokens).
mod smollm2 {
    #[divan::bench(args = super::WORKLOADS)]
    fn mask(b: divan::Bencher, w: &str) {
        super::bench_mask(b, "smollm2-135m-instruct", w)
    }
    #[divan::bench(args = super::WORKLOADS)]
    fn check(b: divan::Bencher, w: &str) {
        super::bench_check(b, "smollm2-135m-instruct", w)
    }
}

/// Qwen2.5's vocabulary (151,669 tokens in its tokenizer.json).
mod qwen {
    #[divan::bench(args = super::WORKLOADS)]
    fn mask(b: divan::Bencher, w: &str) {
        super::bench_mask(b, "qwen-tokenizer", w)
    }
    #[divan::bench(args = super::WORKLOADS)]
    fn check(b: divan::Bencher, w: &str) {
        super::bench_check(b, "qwen-tokenizer", w)
    }
}
