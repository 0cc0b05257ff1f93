//! `cargo xtask bench sample`: structured generation on real vocabularies and models.
//!
//! Masks: for each vocabulary (SmolLM2's 49,152 tokens, Qwen's 151,669 in its
//! tokenizer.json) and each constraint (a nested JSON schema, a regex, free JSON, compact
//! JSON as SAPIENT generates it by default), the grammar is compiled (`compile`) and
//! prepared for the vocabulary (`prepare`: the per-DFA-state token sets, what `Matcher::new`
//! does once per grammar), then a valid document tokenized with the model's own tokenizer
//! is replayed token by token. At every step we time, on one thread: `trie walk` (the full
//! mask by walking the vocabulary trie with the parser, no acceleration), `mask`
//! (`TokenIndex::mask`, the full mask with the precomputed sets, no mask cache), `cached`
//! (`Matcher::mask()`, which also caches whole masks by parser state) and `check` (one
//! token checked, what sampler-aware sampling does when the sampler's first choice is
//! allowed). Every step checks that `mask` equals the plain walk and holds the document's
//! token. With `--vs-llguidance PYTHON`, `scripts/sample/llguidance_masks.py` replays the
//! same token ids through llguidance with the same tokenizer (exported as tokenizer.json),
//! in the same run.
//!
//! End to end (`--e2e MODELS`): on each model, greedy and sampled, a document of the
//! nested schema generated with the constraint (forced tokens fed with the sampled one in
//! one forward) against unconstrained generation of as many tokens (`ignore_eos`), decode
//! wall time; with `--validate N`: N sampled documents per schema, validated with Python's
//! `jsonschema`.
//!
//! `--schemas`: coverage and compile cost on public schema corpora (xtask/src/bench/schemas.rs).

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
    /// Models for the end-to-end constrained vs unconstrained runs ("none" to skip).
    #[arg(long, value_delimiter = ',', default_value = "smollm2-135m-instruct,qwen2.5-coder-0.5b-instruct")]
    pub e2e: Vec<String>,
    /// Repetitions of each end-to-end run (the median is reported); 0 skips them (with
    /// `--validate`, only the sampled documents).
    #[arg(long, default_value_t = 3)]
    pub e2e_reps: usize,
    /// Python with the `llguidance` and `numpy` packages: run llguidance on the same
    /// documents and tokenizers (scripts/sample/llguidance_masks.py).
    #[arg(long)]
    pub vs_llguidance: Option<PathBuf>,
    /// Also sample this many documents per schema (the validation schemas) with the first `--e2e` model
    /// and validate them with Python's `jsonschema` (scripts/sample/validate_jsonschema.py).
    #[arg(long, default_value_t = 0)]
    pub validate: usize,
    #[arg(long, default_value = "target/bench/sample-docs.jsonl")]
    pub validate_out: PathBuf,
    /// Python with `jsonschema` for `--validate` (with `rfc3339-validator` and `rfc3987`
    /// its format checker also checks times and URIs).
    #[arg(long, default_value = "python3")]
    pub python: PathBuf,
    /// Instead of the above: JSON Schema coverage, documents right, time to first mask and
    /// mask times on public corpora (SchemaStore, the JSON-Schema-Test-Suite); see
    /// xtask/src/bench/schemas.rs. With `--vs-llguidance`, llguidance on the same schemas.
    #[arg(long)]
    pub schemas: bool,
    /// The vocabulary for `--schemas`.
    #[arg(long, default_value = "qwen-tokenizer")]
    pub schema_vocab: String,
    /// Seconds one schema may take (compile, first mask, documents, walk) before it is
    /// reported as a timeout.
    #[arg(long, default_value_t = 10.0)]
    pub schema_timeout: f64,
    /// At most this many schemas from each set of the corpus.
    #[arg(long)]
    pub schema_limit: Option<usize>,
    /// Only the schemas of these ids (as in target/bench/sample-schemas.json: a file's hash
    /// for SchemaStore, `FILE#GROUP` for the test suite).
    #[arg(long, value_delimiter = ',')]
    pub schema_ids: Vec<String>,
    /// List the N schemas with the longest time to first mask and the N with the longest
    /// mask step (ours), with llguidance's figures beside them.
    #[arg(long, default_value_t = 10)]
    pub slowest: usize,
    /// Internal: the worker process of `--schemas`.
    #[arg(long, hide = true)]
    pub schema_worker: bool,
}

pub(crate) fn load_tokenizer(hub: &sapient_hub::Hub, preset: &str) -> Result<Tokenizer> {
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

const NESTED_DOC: &str = concat!(
    r#"{"id":"ord-004211","customer":{"name":"Amélie Poulain","email":"amelie.poulain@example.fr","#,
    r#""address":{"street":"15 rue des Trois Frères","city":"Paris","country":"FR","zip":"75018"}},"#,
    r#""items":[{"sku":"GNOME-GARDEN-01","quantity":1,"price":24.9,"gift":true},"#,
    r#"{"sku":"PHOTO-BOOTH-STRIP","quantity":12,"price":3.5},"#,
    r#"{"sku":"CREME-BRULEE-SPOON","quantity":2,"price":7.25,"gift":false}],"#,
    r#""status":"paid","notes":"Leave the parcel with the grocer downstairs, Monsieur Collignon, if nobody answers."}"#
);

pub(crate) const REGEX: &str = r"(Mr|Ms|Dr)\. [A-Z][a-z]{1,15} [A-Z][a-z]{1,20}, born (19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01]), phone \+[0-9]{1,3} [0-9]{3}-[0-9]{3}-[0-9]{4}, email [a-z0-9.]{1,30}@[a-z0-9]{1,20}\.(com|org|net|fr)";
const REGEX_DOC: &str = "Dr. Grace Hopper, born 1906-12-09, phone +1 212-555-0147, email grace.hopper@navy.org";

const FREE_DOC: &str = r#"{"model":"smollm2","layers":30,"rope":{"theta":100000,"scaling":null},"vocab":[49152,"byte-level"],"tied":true,"notes":"a small \"instruct\" model\nwith 135M parameters","ratios":[0.5,0.001,-2.25]}"#;

pub(crate) struct Series(pub(crate) Vec<f64>);

impl Series {
    pub(crate) fn q(&self, p: f64) -> f64 {
        let mut v = self.0.clone();
        v.sort_by(|a, b| a.total_cmp(b));
        v[((v.len() - 1) as f64 * p).round() as usize]
    }
    fn mean(&self) -> f64 {
        self.0.iter().sum::<f64>() / self.0.len() as f64
    }
    fn max(&self) -> f64 {
        self.0.iter().copied().fold(0.0, f64::max)
    }
    fn json(&self) -> serde_json::Value {
        serde_json::json!({"median": self.q(0.5), "p99": self.q(0.99), "max": self.max(), "mean": self.mean()})
    }
}

/// Builds a workload's grammar (timed as its compile time).
type GrammarFn = Box<dyn Fn() -> Result<Grammar>>;

/// What each workload is for llguidance: (kind, grammar).
fn llg_spec(name: &str) -> (&'static str, serde_json::Value) {
    match name {
        "regex" => ("regex", serde_json::Value::from(REGEX)),
        "free JSON" => ("json", serde_json::Value::Null),
        _ => ("json_schema", nested_schema()),
    }
}

pub fn run(a: Args) -> Result<()> {
    if a.schema_worker {
        return super::schemas::worker(&a.schema_vocab);
    }
    if a.schemas {
        return super::schemas::run(&a);
    }
    let hub = sapient_hub::Hub::new()?;
    let mut results = Vec::new();
    println!("one thread; mask times per token in microseconds (median / p99 / max)");
    for preset in &a.vocab {
        let tok = load_tokenizer(&hub, preset).with_context(|| format!("loading the {preset} vocabulary"))?;
        let t = Instant::now();
        let index = Arc::new(index_for(&tok));
        println!("{preset}: {} tokens, trie of {} nodes built in {:.0} ms", index.vocab_size(), index.num_nodes(), t.elapsed().as_secs_f64() * 1e3);
        let workloads: Vec<(&str, GrammarFn, &str)> = vec![
            ("json-schema (nested)", Box::new(|| Ok(Grammar::json_schema(&nested_schema())?)), NESTED_DOC),
            ("regex", Box::new(|| Ok(Grammar::regex(REGEX)?)), REGEX_DOC),
            ("free JSON", Box::new(|| Ok(Grammar::json()?)), FREE_DOC),
        ];
        let mut llg_workloads = Vec::new();
        let mut ours = Vec::new();
        for (name, make, doc) in workloads {
            let tokens = tok.encode(doc, false)?;
            let t0 = Instant::now();
            let g = Arc::new(make()?);
            let compile_ms = t0.elapsed().as_secs_f64() * 1e3;
            let prepare_ms = g.prepare_all(&index).as_secs_f64() * 1e3;
            let mut m = Matcher::new(g.clone(), index.clone());
            let (mut walk, mut full, mut cached, mut check) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            let mut forced = 0usize;
            let mut allowed_sum = 0usize;
            for &t in &tokens {
                let t0 = Instant::now();
                let walked = index.mask_by_walk(&*g, m.state())?;
                walk.push(t0.elapsed().as_secs_f64() * 1e6);
                let t0 = Instant::now();
                let mask = index.mask_shared(&*g, m.state())?;
                full.push(t0.elapsed().as_secs_f64() * 1e6);
                allowed_sum += mask.count();
                anyhow::ensure!(*mask == walked, "{name}: the accelerated mask differs from the trie walk");
                anyhow::ensure!(mask.is_allowed(t), "{name}: token {t} ({:?}) of the document is not in its mask", tok.decode(&[t], false)?);
                let t0 = Instant::now();
                let cm = m.mask()?;
                cached.push(t0.elapsed().as_secs_f64() * 1e6);
                anyhow::ensure!(cm == mask, "cached mask differs");
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
            let (walk, full, cached, check) = (Series(walk), Series(full), Series(cached), Series(check));
            println!(
                "  {name:<22} {:>4} tokens | compile {compile_ms:>6.1} ms + prepare {prepare_ms:>7.1} ms ({} DFA states) | trie walk {:>7.1} / {:>8.1} / {:>8.1} | mask {:>6.1} / {:>6.1} / {:>7.1} | cached {:>6.1} / {:>6.1} / {:>7.1} | check {:>5.2} / {:>5.2} | {:.0} allowed on average, {forced} forced",
                tokens.len(), g.num_dfa_states(),
                walk.q(0.5), walk.q(0.99), walk.max(),
                full.q(0.5), full.q(0.99), full.max(),
                cached.q(0.5), cached.q(0.99), cached.max(),
                check.q(0.5), check.q(0.99),
                allowed_sum as f64 / tokens.len() as f64,
            );
            ours.push((name, compile_ms + prepare_ms, full.q(0.5), full.q(0.99), full.max()));
            results.push(serde_json::json!({
                "vocab": preset, "vocab_size": index.vocab_size(), "workload": name, "tokens": tokens.len(),
                "compile_ms": compile_ms, "prepare_ms": prepare_ms, "dfa_states": g.num_dfa_states(),
                "trie_walk_us": walk.json(), "mask_us": full.json(), "cached_us": cached.json(),
                "check_us": check.json(), "forced_tokens": forced,
            }));
            let (kind, grammar) = llg_spec(name);
            llg_workloads.push(serde_json::json!({"name": name, "kind": kind, "grammar": grammar, "tokens": tokens}));
        }
        if let Some(py) = &a.vs_llguidance {
            let r = llguidance(py, &tok, &llg_workloads, preset)?;
            println!("  llguidance {} on the same token ids (tokenizer loaded in {:.0} ms):", r["llguidance"].as_str().unwrap_or("?"), r["tokenizer_ms"].as_f64().unwrap_or(0.0));
            println!("    {:<22} | {:>22} | {:>24} | {:>24}", "", "compile (ms): ours / llg", "mask median (us): ours / llg", "p99 / max (us): ours | llg");
            for (w, (name, ours_ms, med, p99, max)) in r["workloads"].as_array().cloned().unwrap_or_default().iter().zip(&ours) {
                let l = &w["mask_us"];
                println!(
                    "    {name:<22} | {ours_ms:>10.1} / {:>9.1} | {med:>12.1} / {:>9.1} | {p99:.1} / {max:.1} | {:.1} / {:.1}",
                    w["compile_us"].as_f64().unwrap_or(0.0) / 1e3,
                    l["median"].as_f64().unwrap_or(0.0),
                    l["p99"].as_f64().unwrap_or(0.0),
                    l["max"].as_f64().unwrap_or(0.0),
                );
            }
            results.push(serde_json::json!({"vocab": preset, "llguidance": r}));
        }
    }
    let mut e2e = Vec::new();
    for model in a.e2e.iter().filter(|m| m.as_str() != "none" && a.e2e_reps > 0) {
        e2e.push(end_to_end(model, a.e2e_reps)?);
    }
    if a.validate > 0 {
        if let Some(model) = a.e2e.iter().find(|m| m.as_str() != "none") {
            validate(model, a.validate, &a.validate_out, &a.python)?;
        }
    }
    let results = serde_json::json!({"masks": results, "end_to_end": e2e});
    if let Some(parent) = a.json.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&a.json, serde_json::to_string_pretty(&results)?)?;
    Ok(())
}

/// Run scripts/sample/llguidance_masks.py with `python` on the workloads (the tokenizer
/// exported as tokenizer.json).
fn llguidance(python: &std::path::Path, tok: &Tokenizer, workloads: &[serde_json::Value], preset: &str) -> Result<serde_json::Value> {
    let dir = PathBuf::from("target/bench/llguidance").join(preset);
    std::fs::create_dir_all(&dir)?;
    let tok_path = dir.join("tokenizer.json");
    tok.inner().save(&tok_path, false).map_err(|e| anyhow::anyhow!("saving {}: {e}", tok_path.display()))?;
    let input = dir.join("in.json");
    let output = dir.join("out.json");
    let spec = serde_json::json!({"tokenizer": tok_path, "eos": tok.eos_token_ids(), "workloads": workloads});
    std::fs::write(&input, serde_json::to_string(&spec)?)?;
    let status = std::process::Command::new(python)
        .arg("scripts/sample/llguidance_masks.py")
        .arg(&input)
        .arg(&output)
        .status()
        .with_context(|| format!("running {}", python.display()))?;
    anyhow::ensure!(status.success(), "llguidance_masks.py failed");
    Ok(serde_json::from_str(&std::fs::read_to_string(&output)?)?)
}

/// On `model`, greedy and sampled: a document of the nested schema generated with the
/// constraint (forced tokens fed in the forward of the sampled token before them), against
/// unconstrained generation of as many tokens (`ignore_eos`, so the same number of decode
/// steps as writing that document without a constraint). Decode wall time (sampling, masks
/// and forwards; the prompt's prefill excluded), median of `reps` runs each.
fn end_to_end(model: &str, reps: usize) -> Result<serde_json::Value> {
    use sapient_generate::{GenerationConfig, Message, Pipeline, PipelineOptions, SamplerConfig};
    let p = Pipeline::load(model, PipelineOptions { max_seq_len: Some(2048), ..Default::default() }, |_| {})?;
    let schema = nested_schema();
    let t = Instant::now();
    let g = Arc::new(Grammar::json_schema(&schema)?);
    let compile = t.elapsed();
    let prepare = g.prepare_all(&p.token_index());
    let msgs = [
        Message::system("You are a helpful assistant that answers in JSON."),
        Message::user(format!("Write a realistic order with two items as JSON following this schema:\n{schema}")),
    ];
    println!(
        "end to end, {model}, nested schema (compiled in {:.1} ms, prepared for the vocabulary in {:.0} ms); decode wall time, median of {reps}:",
        compile.as_secs_f64() * 1e3,
        prepare.as_secs_f64() * 1e3
    );
    let mut out = Vec::new();
    for (mode, sampling) in [
        ("greedy", SamplerConfig::greedy()),
        ("sampled", SamplerConfig { temperature: 0.8, top_p: Some(0.95), seed: Some(7), ..Default::default() }),
    ] {
        let mut con = GenerationConfig::default().max_tokens(600).sampling(sampling.clone());
        con.constraint = Some(g.clone());
        let (mut c_ms, mut u_ms) = (Vec::new(), Vec::new());
        let mut last = None;
        for _ in 0..reps {
            p.reset_cache();
            let r = p.chat(&msgs, &con)?;
            c_ms.push(r.stats.decode.as_secs_f64() * 1e3);
            let n = r.tokens.len();
            let free = GenerationConfig { ignore_eos: true, ..GenerationConfig::default().max_tokens(n).sampling(sampling.clone()) };
            p.reset_cache();
            let u = p.chat(&msgs, &free)?;
            anyhow::ensure!(u.tokens.len() == n, "unconstrained run stopped after {} of {n} tokens", u.tokens.len());
            u_ms.push(u.stats.decode.as_secs_f64() * 1e3);
            last = Some(r);
        }
        let Some(r) = last else { continue };
        let (c, u) = (Series(c_ms).q(0.5), Series(u_ms).q(0.5));
        let n = r.tokens.len();
        let forced = r.stats.forced_tokens;
        // One forward per sampled token; the last one needs none when only EOS can follow.
        let valid = serde_json::from_str::<serde_json::Value>(&r.text).is_ok_and(|v| sapient_sample::validate(&schema, &v).is_ok_and(|x| x.is_ok()));
        println!(
            "  {mode:<8} {n:>4} tokens, {forced} forced ({:.0}%), forwards saved {forced} | constrained {c:>7.0} ms | unconstrained, same length {u:>7.0} ms | {:.2}x | valid {valid} | finish {:?}",
            100.0 * forced as f64 / n.max(1) as f64,
            u / c.max(1e-9),
            r.finish
        );
        out.push(serde_json::json!({
            "model": model, "mode": mode, "tokens": n, "forced": forced, "constrained_ms": c, "unconstrained_ms": u,
            "speedup": u / c.max(1e-9), "valid": valid, "text": r.text,
        }));
    }
    Ok(serde_json::json!({"model": model, "compile_ms": compile.as_secs_f64() * 1e3, "prepare_ms": prepare.as_secs_f64() * 1e3, "runs": out}))
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
        // Written to cover the rest of the supported keywords.
        ("event", serde_json::json!({
            "type": "object",
            "properties": {
                "id": {"type": "string", "format": "uuid"},
                "when": {"type": "array", "prefixItems": [{"type": "string", "format": "date"}, {"type": "string", "format": "time"}], "items": false, "minItems": 2},
                "url": {"type": "string", "format": "uri"},
                "host": {"type": "string", "format": "ipv4"},
                "kind": {"oneOf": [
                    {"type": "object", "properties": {"type": {"const": "talk"}, "speaker": {"type": "string", "maxLength": 24}}, "required": ["type", "speaker"], "additionalProperties": false},
                    {"type": "object", "properties": {"type": {"const": "break"}, "minutes": {"type": "integer", "minimum": 5, "maximum": 60}}, "required": ["type", "minutes"], "additionalProperties": false}
                ]},
                "room": {"enum": [{"floor": 1, "name": "Ada"}, {"floor": 2, "name": "Grace"}, null]},
                "tags": {"type": "object", "properties": {"level": {"enum": ["intro", "advanced"]}}, "additionalProperties": {"type": "string", "maxLength": 12}, "maxProperties": 3}
            },
            "required": ["id", "when", "kind", "room"],
            "additionalProperties": false
        })),
        ("config", serde_json::json!({
            "$defs": {
                "named": {"type": "object", "properties": {"name": {"type": "string", "pattern": "^[a-z][a-z0-9_]{0,15}$"}}, "required": ["name"]},
                "node": {"type": "object", "properties": {"label": {"type": "string", "maxLength": 12}, "children": {"type": "array", "maxItems": 2, "items": {"$ref": "#/$defs/node"}}}, "required": ["label"], "additionalProperties": false}
            },
            "allOf": [
                {"$ref": "#/$defs/named"},
                {"type": "object", "properties": {"version": {"type": "integer", "minimum": 1, "maximum": 99}, "ratio": {"type": "number", "exclusiveMinimum": 0, "maximum": 1}, "tree": {"$ref": "#/$defs/node"}}, "required": ["version", "ratio"]}
            ],
            "minProperties": 3
        })),
        ("tool call", serde_json::json!({
            "anyOf": [
                {"type": "object", "properties": {"name": {"const": "get_weather"}, "arguments": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}, "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city"], "additionalProperties": false}}, "required": ["name", "arguments"], "additionalProperties": false},
                {"type": "object", "properties": {"name": {"const": "search"}, "arguments": {"type": "object", "properties": {"query": {"type": "string", "minLength": 1, "maxLength": 60}, "max_results": {"type": "integer", "minimum": 1, "maximum": 10}}, "required": ["query"], "additionalProperties": false}}, "required": ["name", "arguments"], "additionalProperties": false}
            ]
        })),
    ]
}

/// Sample `n` documents per schema, write them as JSONL and validate them with Python's
/// `jsonschema` package.
fn validate(model: &str, n: usize, out: &std::path::Path, python: &std::path::Path) -> Result<()> {
    use sapient_generate::{GenerationConfig, Message, Pipeline, PipelineOptions, SamplerConfig};
    use std::io::Write;
    let p = Pipeline::load(model, PipelineOptions { max_seq_len: Some(3072), ..Default::default() }, |_| {})?;
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let mut f = std::io::BufWriter::new(std::fs::File::create(out)?);
    println!("validation: {n} sampled documents per schema with {model} (temperature 0.8, top-p 0.95), seed by seed over the schemas");
    let schemas = validation_schemas()
        .into_iter()
        .map(|(name, schema)| {
            let g = Arc::new(Grammar::json_schema(&schema)?);
            let msgs = [
                Message::system("You are a helpful assistant that answers in JSON."),
                Message::user(format!("Write a realistic example that follows this JSON schema:\n{schema}")),
            ];
            Ok((name, schema, g, msgs))
        })
        .collect::<Result<Vec<_>>>()?;
    // Seeds in the outer loop, so that a run stopped early has as many documents of each
    // schema (the JSONL is flushed after each document and can be validated as it grows).
    let mut tokens = vec![0usize; schemas.len()];
    let t = Instant::now();
    for seed in 0..n as u64 {
        for (i, (name, schema, g, msgs)) in schemas.iter().enumerate() {
            let mut cfg = GenerationConfig::default()
                .max_tokens(2048)
                .sampling(SamplerConfig { temperature: 0.8, top_p: Some(0.95), seed: Some(seed), ..Default::default() });
            cfg.constraint = Some(g.clone());
            let r = p.chat(msgs, &cfg)?;
            tokens[i] += r.tokens.len();
            writeln!(f, "{}", serde_json::json!({"schema_name": name, "schema": schema, "seed": seed, "tokens": r.tokens.len(), "text": r.text, "finish": format!("{:?}", r.finish)}))?;
            f.flush()?;
        }
        println!("  seed {seed}: {} documents so far, {:.0} s", (seed as usize + 1) * schemas.len(), t.elapsed().as_secs_f64());
    }
    for ((name, ..), tok) in schemas.iter().zip(&tokens) {
        println!("  {name}: {n} documents, {:.0} tokens on average", *tok as f64 / n as f64);
    }
    f.flush()?;
    drop(f);
    let status = std::process::Command::new(python).arg("scripts/sample/validate_jsonschema.py").arg(out).status();
    match status {
        Ok(s) => anyhow::ensure!(s.success(), "jsonschema validation failed (see above)"),
        Err(e) => println!("{} not available ({e}); validate {} with scripts/sample/validate_jsonschema.py", python.display(), out.display()),
    }
    Ok(())
}
