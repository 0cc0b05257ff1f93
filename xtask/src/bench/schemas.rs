//! `cargo xtask bench sample --schemas`: JSON Schema coverage and compile cost on public
//! corpora, with the Qwen2.5 vocabulary.
//!
//! The corpus is the sets of crates/sapient-sample/tests/data/json_schema_sets.toml fetched
//! through sapient-hub (sha256-pinned, cached under `$SAPIENT_HOME/packages/`): SchemaStore's
//! catalogue (583 schemas of configuration files) and the draft 2020-12 groups of the
//! JSON-Schema-Test-Suite, whose valid and invalid documents say whether a compiled grammar
//! is right. For each schema: whether it compiles (refused: by which error and keyword),
//! time to first mask (`Grammar::json_schema` + `Matcher::new` + the first mask), the
//! documents right (`Grammar::matches` on the compact document equals the suite's `valid`),
//! and the mask time per token along a walk: the first valid document the grammar accepts,
//! tokenized, else a seeded random walk of allowed tokens.
//!
//! Each schema runs in a worker process (this binary with `--schema-worker`) under a time
//! limit (`--schema-timeout`); one that runs past it is reported as a timeout and the worker
//! is restarted. With `--vs-llguidance PYTHON`, scripts/sample/llguidance_schemas.py does the
//! same in a worker of its own under the same limit, on the same schemas, documents and
//! token ids, and both are printed side by side.

use super::sample::{index_for, load_tokenizer, Args, Series};
use anyhow::{Context, Result};
use sapient_sample::{Constraint, Grammar, GrammarError, Matcher};
use serde_json::{json, Value};
use std::io::{BufRead, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// Tokens walked per schema for the mask times.
const WALK: usize = 32;
/// The sets of the manifest that make the bench's corpus.
const SETS: &[&str] = &["schemastore", "draft2020-12"];
const MANIFEST: &str = "crates/sapient-sample/tests/data/json_schema_sets.toml";

#[derive(serde::Deserialize)]
struct Manifest {
    set: Vec<sapient_hub::FileSet>,
}

struct Job {
    source: &'static str,
    id: String,
    schema: Value,
    /// Compact JSON text and whether the suite says it is valid.
    docs: Vec<(String, bool)>,
}

fn corpus(limit: Option<usize>) -> Result<(Vec<Job>, usize)> {
    let hub = sapient_hub::Hub::new()?;
    let manifest: Manifest = toml::from_str(&std::fs::read_to_string(MANIFEST).with_context(|| format!("reading {MANIFEST}"))?)?;
    let mut jobs = Vec::new();
    let mut unreadable = 0;
    for &name in SETS {
        let set = manifest.set.iter().find(|s| s.name == name).with_context(|| format!("{MANIFEST} has no set {name}"))?;
        let source: &'static str = name;
        let mut n = 0;
        for f in hub.fetch_file_set(set, &mut |_| {})? {
            let stem = f.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
            let bytes = std::fs::read(&f)?;
            let text = String::from_utf8_lossy(&bytes);
            let Ok(v) = serde_json::from_str::<Value>(text.trim_start_matches('\u{feff}')) else {
                unreadable += 1;
                continue;
            };
            let groups = if set.package == "jsonschema" { v.as_array().cloned().unwrap_or_default() } else { vec![json!({"schema": v})] };
            for (i, g) in groups.into_iter().enumerate() {
                if limit.is_some_and(|l| n >= l) {
                    break;
                }
                n += 1;
                let docs = g["tests"]
                    .as_array()
                    .map(|t| t.iter().map(|c| (c["data"].to_string(), c["valid"].as_bool().unwrap_or(false))).collect())
                    .unwrap_or_default();
                let id = if set.package == "jsonschema" { format!("{stem}#{i}") } else { stem.clone() };
                jobs.push(Job { source, id, schema: g["schema"].clone(), docs });
            }
        }
    }
    Ok((jobs, unreadable))
}

/// A worker process answering one JSON line per job line, killed and restarted when a job
/// runs past the limit.
struct Worker {
    cmd: Vec<String>,
    child: Child,
    stdin: ChildStdin,
    rx: mpsc::Receiver<String>,
    ready: Value,
}

impl Worker {
    fn start(cmd: &[String]) -> Result<Self> {
        let mut child = Command::new(&cmd[0])
            .args(&cmd[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", cmd.join(" ")))?;
        let stdin = child.stdin.take().context("worker stdin")?;
        let stdout = child.stdout.take().context("worker stdout")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            // Lines that are not JSON objects (the bench's banner) are not answers.
            for line in std::io::BufReader::new(stdout).lines().map_while(|l| l.ok()).filter(|l| l.starts_with('{')) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let ready = rx.recv_timeout(Duration::from_secs(300)).with_context(|| format!("{} did not start", cmd.join(" ")))?;
        Ok(Self { cmd: cmd.to_vec(), child, stdin, rx, ready: serde_json::from_str(&ready)? })
    }

    /// The answer to `job`, or `{"timeout": true}` (the worker is then restarted).
    fn ask(&mut self, job: &Value, limit: Duration) -> Result<Value> {
        writeln!(self.stdin, "{job}")?;
        self.stdin.flush()?;
        match self.rx.recv_timeout(limit) {
            Ok(line) => Ok(serde_json::from_str(&line)?),
            Err(e) => {
                let _ = self.child.kill();
                let _ = self.child.wait();
                *self = Self::start(&self.cmd)?;
                Ok(match e {
                    mpsc::RecvTimeoutError::Timeout => json!({"timeout": true}),
                    mpsc::RecvTimeoutError::Disconnected => json!({"error": "the worker died (crash or abort)"}),
                })
            }
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The error's kind, with the keyword where it names one.
fn refusal(e: &GrammarError) -> String {
    match e {
        GrammarError::UnsupportedSchema { keyword, .. } => format!("unsupported `{keyword}`"),
        GrammarError::UnresolvedRef(r) => format!("unresolved $ref{}", if r.contains("://") { " (remote)" } else { "" }),
        other => format!("{other:?}").split(|c: char| !c.is_alphanumeric()).next().unwrap_or("error").to_string(),
    }
}

/// The worker side: `cargo xtask bench sample --schema-worker`.
pub fn worker(vocab: &str) -> Result<()> {
    let hub = sapient_hub::Hub::new()?;
    let tok = load_tokenizer(&hub, vocab)?;
    let index = Arc::new(index_for(&tok));
    let eos = tok.eos_token_ids().to_vec();
    std::panic::set_hook(Box::new(|_| {}));
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", json!({"ready": vocab}))?;
    out.flush()?;
    for line in std::io::stdin().lock().lines() {
        let job: Value = serde_json::from_str(&line?)?;
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| measure(&job, &tok, &index, &eos)));
        let answer = match r {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => json!({"error": format!("{e:#}")}),
            Err(p) => {
                let msg = p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned());
                json!({"panic": msg.unwrap_or_default()})
            }
        };
        writeln!(out, "{answer}")?;
        out.flush()?;
    }
    Ok(())
}

fn measure(job: &Value, tok: &sapient_tokenizers::Tokenizer, index: &Arc<sapient_sample::TokenIndex>, eos: &[u32]) -> Result<Value> {
    let t0 = Instant::now();
    let g = match Grammar::json_schema(&job["schema"]) {
        Ok(g) => Arc::new(g),
        Err(e) => return Ok(json!({"refused": refusal(&e), "message": e.to_string()})),
    };
    let compile_us = t0.elapsed().as_secs_f64() * 1e6;
    let mut m = Matcher::new(g.clone(), index.clone());
    let first = m.mask()?;
    let first_mask_us = t0.elapsed().as_secs_f64() * 1e6;
    let docs: Vec<(String, bool)> = serde_json::from_value(job["docs"].clone())?;
    let mut right = 0;
    let mut replay = None;
    for (doc, valid) in &docs {
        let ok = g.matches(doc.as_bytes()).unwrap_or(false);
        right += usize::from(ok == *valid);
        if ok && replay.is_none() {
            replay = Some(tok.encode(doc, false)?);
        }
    }
    let mut masks = Vec::new();
    let mut walked = Vec::new();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let steps = replay.as_ref().map_or(WALK, |r| r.len());
    for i in 0..steps {
        let t = Instant::now();
        let mask = if i == 0 { first.clone() } else { Arc::new(m.compute_mask_uncached()?) };
        if i > 0 {
            masks.push(t.elapsed().as_secs_f64() * 1e6);
        }
        let token = match &replay {
            Some(r) if mask.is_allowed(r[i]) => r[i],
            Some(_) => break,
            None => {
                let ids: Vec<u32> = mask.iter().filter(|t| !eos.contains(t)).collect();
                if ids.is_empty() {
                    break;
                }
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                ids[(rng % ids.len() as u64) as usize]
            }
        };
        m.consume(token)?;
        walked.push(token);
    }
    Ok(json!({"compile_us": compile_us, "first_mask_us": first_mask_us, "docs_right": right, "masks_us": masks, "tokens": walked}))
}

/// One side's figures over the corpus.
#[derive(Default)]
struct Side {
    compiled: usize,
    timeouts: usize,
    errors: usize,
    refused: std::collections::BTreeMap<String, usize>,
    docs_right: usize,
    docs_of_compiled: usize,
    first_mask_ms: Vec<f64>,
    /// Time to first mask on the schemas both sides compiled.
    first_mask_both_ms: Vec<f64>,
    mask_us: Vec<f64>,
}

impl Side {
    fn add(&mut self, r: &Value, docs: usize) {
        if r.get("timeout").is_some() {
            self.timeouts += 1;
        } else if let Some(why) = r.get("refused") {
            let why = why.as_str().unwrap_or("?");
            *self.refused.entry(why.chars().take(60).collect()).or_default() += 1;
        } else if r.get("compile_us").is_some() {
            self.compiled += 1;
            self.docs_right += r["docs_right"].as_u64().unwrap_or(0) as usize;
            self.docs_of_compiled += docs;
            self.first_mask_ms.push(r["first_mask_us"].as_f64().unwrap_or(0.0) / 1e3);
            self.mask_us.extend(r["masks_us"].as_array().into_iter().flatten().filter_map(Value::as_f64));
        } else {
            self.errors += 1;
            *self.refused.entry(format!("error: {}", r).chars().take(60).collect()).or_default() += 1;
        }
    }

    fn summary(&self, n: usize, docs: usize) -> Value {
        let q = |v: &[f64], p: f64| if v.is_empty() { f64::NAN } else { Series(v.to_vec()).q(p) };
        json!({
            "schemas": n, "compiled": self.compiled, "timeouts": self.timeouts, "errors": self.errors,
            "docs": docs, "docs_right": self.docs_right, "docs_of_compiled": self.docs_of_compiled,
            "first_mask_ms": {"p50": q(&self.first_mask_ms, 0.5), "p99": q(&self.first_mask_ms, 0.99), "max": q(&self.first_mask_ms, 1.0)},
            "first_mask_both_ms": {"p50": q(&self.first_mask_both_ms, 0.5), "p99": q(&self.first_mask_both_ms, 0.99), "max": q(&self.first_mask_both_ms, 1.0), "schemas": self.first_mask_both_ms.len()},
            "mask_us": {"p50": q(&self.mask_us, 0.5), "p99": q(&self.mask_us, 0.99), "max": q(&self.mask_us, 1.0), "steps": self.mask_us.len()},
            "refused": self.refused,
        })
    }
}

pub fn run(a: &Args) -> Result<()> {
    let (mut jobs, unreadable) = corpus(a.schema_limit)?;
    if !a.schema_ids.is_empty() {
        jobs.retain(|j| a.schema_ids.contains(&j.id));
    }
    let limit = Duration::from_secs_f64(a.schema_timeout);
    let exe = std::env::current_exe()?.display().to_string();
    let ours_cmd: Vec<String> = [exe.as_str(), "bench", "sample", "--schema-worker", "--schema-vocab", &a.schema_vocab].map(String::from).to_vec();
    let mut ours = Worker::start(&ours_cmd)?;
    let mut llg = match &a.vs_llguidance {
        Some(py) => {
            let hub = sapient_hub::Hub::new()?;
            let tok = load_tokenizer(&hub, &a.schema_vocab)?;
            let dir = std::path::PathBuf::from("target/bench/llguidance").join(&a.schema_vocab);
            std::fs::create_dir_all(&dir)?;
            let tok_path = dir.join("tokenizer.json");
            tok.inner().save(&tok_path, false).map_err(|e| anyhow::anyhow!("saving {}: {e}", tok_path.display()))?;
            let eos: Vec<String> = tok.eos_token_ids().iter().map(|t| t.to_string()).collect();
            let cmd = [py.display().to_string(), "scripts/sample/llguidance_schemas.py".into(), tok_path.display().to_string(), eos.join(",")];
            Some(Worker::start(&cmd)?)
        }
        None => None,
    };
    let sources: Vec<&str> = SETS.to_vec();
    let mut sides: Vec<(Side, Side)> = sources.iter().map(|_| Default::default()).collect();
    let mut rows = Vec::new();
    let t = Instant::now();
    for (i, job) in jobs.iter().enumerate() {
        let s = sources.iter().position(|s| *s == job.source).unwrap_or(0);
        let mut line = json!({"schema": job.schema, "docs": job.docs});
        let r = ours.ask(&line, limit)?;
        sides[s].0.add(&r, job.docs.len());
        let mut row = json!({"source": job.source, "id": job.id, "docs": job.docs.len(), "ours": r});
        if let Some(w) = llg.as_mut() {
            line["tokens"] = row["ours"]["tokens"].clone();
            line["walk"] = json!(WALK);
            let l = w.ask(&line, limit)?;
            sides[s].1.add(&l, job.docs.len());
            if let (Some(a), Some(b)) = (r["first_mask_us"].as_f64(), l["first_mask_us"].as_f64()) {
                sides[s].0.first_mask_both_ms.push(a / 1e3);
                sides[s].1.first_mask_both_ms.push(b / 1e3);
            }
            row["llguidance"] = l;
        }
        for side in ["ours", "llguidance"] {
            let max = row[side]["masks_us"].as_array().into_iter().flatten().filter_map(Value::as_f64).fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))));
            if let (Some(o), Some(max)) = (row[side].as_object_mut(), max) {
                o.insert("mask_max_us".into(), json!(max));
            }
        }
        if let Some(o) = row["ours"].as_object_mut() {
            o.remove("tokens");
            o.remove("masks_us");
        }
        if let Some(o) = row["llguidance"].as_object_mut() {
            o.remove("masks_us");
        }
        rows.push(row);
        if (i + 1) % 100 == 0 {
            eprintln!("  {} / {} schemas, {:.0} s", i + 1, jobs.len(), t.elapsed().as_secs_f64());
        }
    }
    println!(
        "JSON Schema corpus on {} ({} schemas, {} unreadable files skipped; {:.0} s per schema at most; one thread)",
        a.schema_vocab,
        jobs.len(),
        unreadable,
        a.schema_timeout
    );
    let mut summaries = Vec::new();
    for (s, (o, l)) in sources.iter().zip(&sides) {
        let n = jobs.iter().filter(|j| j.source == *s).count();
        let docs: usize = jobs.iter().filter(|j| j.source == *s).map(|j| j.docs.len()).sum();
        let (so, sl) = (o.summary(n, docs), l.summary(n, docs));
        print_side_by_side(s, &so, llg.as_ref().map(|w| (&sl, &w.ready)));
        summaries.push(json!({"source": s, "ours": so, "llguidance": llg.as_ref().map(|_| sl)}));
    }
    print_slowest(&rows, a.slowest);
    let out = std::path::Path::new("target/bench/sample-schemas.json");
    if let Some(p) = out.parent() {
        std::fs::create_dir_all(p)?;
    }
    std::fs::write(out, serde_json::to_string_pretty(&json!({"summary": summaries, "schemas": rows}))?)?;
    println!("per-schema results: {}", out.display());
    Ok(())
}

fn print_side_by_side(source: &str, o: &Value, l: Option<(&Value, &Value)>) {
    let n = o["schemas"].as_u64().unwrap_or(0) as f64;
    let docs = o["docs"].as_u64().unwrap_or(0) as f64;
    let pct = |v: &Value, k: &str, of: f64| format!("{} ({:.1}%)", v[k], 100.0 * v[k].as_f64().unwrap_or(0.0) / of.max(1.0));
    let f = |v: &Value, a: &str, b: &str| v[a][b].as_f64().unwrap_or(f64::NAN);
    let version = l.map(|(_, r)| r["ready"].as_str().unwrap_or("?").to_string()).unwrap_or_default();
    println!("\n{source}: {n} schemas, {docs} documents");
    println!("  {:<26} {:>22} {:>22} {:>8}", "", "SAPIENT", format!("llguidance {version}"), "ours/llg");
    let row = |name: &str, ours: String, theirs: Option<String>, ratio: Option<f64>| {
        let ratio = ratio.filter(|r| r.is_finite()).map(|r| format!("{r:.2}x")).unwrap_or_default();
        println!("  {name:<26} {ours:>22} {:>22} {ratio:>8}", theirs.unwrap_or_default());
    };
    let count = |k: &str, of: f64| (pct(o, k, of), l.map(|(v, _)| pct(v, k, of)));
    let (a, b) = count("compiled", n);
    row("compiled", a, b, None);
    let (a, b) = count("timeouts", n);
    row("timeouts", a, b, None);
    if docs > 0.0 {
        let (a, b) = count("docs_right", docs);
        row("documents right", a, b, None);
    }
    for (name, group, key, unit) in [
        ("first mask p50", "first_mask_ms", "p50", "ms"),
        ("first mask p99", "first_mask_ms", "p99", "ms"),
        ("first mask max", "first_mask_ms", "max", "ms"),
        ("  both compiled: p50", "first_mask_both_ms", "p50", "ms"),
        ("  both compiled: p99", "first_mask_both_ms", "p99", "ms"),
        ("  both compiled: max", "first_mask_both_ms", "max", "ms"),
        ("mask p50", "mask_us", "p50", "us"),
        ("mask p99", "mask_us", "p99", "us"),
    ] {
        if group == "first_mask_both_ms" && l.is_none() {
            continue;
        }
        let ours = f(o, group, key);
        let theirs = l.map(|(v, _)| f(v, group, key));
        row(&format!("{name} ({unit})"), format!("{ours:.2}"), theirs.map(|t| format!("{t:.2}")), theirs.map(|t| ours / t));
    }
    let top = |v: &Value| -> String {
        let mut r: Vec<(String, u64)> = v["refused"].as_object().into_iter().flatten().map(|(k, n)| (k.clone(), n.as_u64().unwrap_or(0))).collect();
        r.sort_by_key(|x| std::cmp::Reverse(x.1));
        r.iter().take(8).map(|(k, n)| format!("{k} ×{n}")).collect::<Vec<_>>().join("; ")
    };
    println!("  refused (SAPIENT): {}", top(o));
    if let Some((v, _)) = l {
        println!("  refused (llguidance): {}", top(v));
    }
}

/// The `n` schemas with the longest time to first mask and the `n` with the longest mask
/// step on our side, with llguidance's figures for the same schemas.
fn print_slowest(rows: &[Value], n: usize) {
    if n == 0 {
        return;
    }
    for (title, key, unit, scale) in [("time to first mask", "first_mask_us", "ms", 1e3), ("longest mask step", "mask_max_us", "us", 1.0)] {
        let mut by: Vec<&Value> = rows.iter().filter(|r| r["ours"][key].is_f64()).collect();
        by.sort_by(|a, b| b["ours"][key].as_f64().unwrap_or(0.0).total_cmp(&a["ours"][key].as_f64().unwrap_or(0.0)));
        println!("\nslowest by {title} ({unit}; ours, llguidance):");
        for r in by.iter().take(n) {
            let theirs = match r["llguidance"][key].as_f64() {
                Some(t) => format!("{:.2}", t / scale),
                None if r["llguidance"].get("refused").is_some() => "refused".into(),
                None if r["llguidance"].get("timeout").is_some() => "timeout".into(),
                None => "-".into(),
            };
            println!("  {:<14} {:<22} {:>10.2} {:>10}", r["source"].as_str().unwrap_or(""), r["id"].as_str().unwrap_or(""), r["ours"][key].as_f64().unwrap_or(0.0) / scale, theirs);
        }
    }
}
