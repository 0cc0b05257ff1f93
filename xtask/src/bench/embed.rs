//! `cargo xtask bench embed`: sentence embeddings, sapient-embed against references in the
//! same run: sentences/s and tokens/s for batches of 1, 8 and 64 sentences of about 30 tokens.
//!
//! - all-MiniLM-L6-v2 (F32): onnxruntime on the same weights (the BERT graph written by
//!   scripts/embed/bench_reference.py, padded batches with a mask), `--python` with numpy,
//!   onnx, onnxruntime and safetensors.
//! - nomic-embed-text-v1.5 (F16 GGUF): llama.cpp's `llama-embedding` on the same file
//!   (`--llamacpp DIR`), all sentences of a batch in one batch. Its time is read from its
//!   log's time stamps (verbosity 4): from the `batch_decode` line to the
//!   `llama_perf_context_print` lines, i.e. the encode, pooling and printing the vectors,
//!   without start-up, load and tokenization. (Its own `prompt eval time` reads 0 ms for 64
//!   sequences in this build.) Without those lines: the process's wall time less that of a
//!   run on one 3-token text.
//!
//! Times are per call, the best of `2 x --reps` samples, each sample the mean of as many
//! calls as make about 64 sentences (64 calls at batch 1, 8 at batch 8, one at batch 64; the
//! MiniLM reference alike; llama-embedding runs once per sample). Ours takes `--reps`
//! samples after a warm-up before the reference and `--reps` after it (on a shared machine
//! the load changes while one side runs), the references `2 x --reps` in one go. Ours is
//! `Embedder::embed` from text (tokenization included), the references' from token ids
//! (onnxruntime) or their own tokenization (llama.cpp).

use anyhow::{Context, Result};
use sapient_embed::{EmbedOptions, Embedder, Precision, Task};
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// Python with numpy, onnx, onnxruntime and safetensors (a venv outside the repo); without
    /// it the MiniLM reference is skipped.
    #[arg(long, env = "SAPIENT_REF_PYTHON")]
    pub python: Option<PathBuf>,
    /// llama.cpp's bin directory (with llama-embedding); without it the nomic reference is
    /// skipped.
    #[arg(long, env = "SAPIENT_LLAMACPP_BIN")]
    pub llamacpp: Option<PathBuf>,
    /// Which models: minilm, nomic (default both).
    #[arg(long, value_delimiter = ',', default_value = "minilm,nomic")]
    pub models: Vec<String>,
    /// Threads for the references (ours uses the kernel pool: SAPIENT_THREADS, default all).
    #[arg(long)]
    pub threads: Option<usize>,
    /// How ours multiplies: float (the default), f32 or q8.
    #[arg(long, default_value = "float")]
    pub precision: String,
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    #[arg(long, default_value = "target/bench/embed.json")]
    pub json: PathBuf,
}

const BATCHES: [usize; 3] = [1, 8, 64];

const WORDS: &[&str] = &[
    "the", "river", "quietly", "carried", "small", "boats", "past", "old", "stone", "houses", "while", "children",
    "watched", "from", "a", "wooden", "bridge", "and", "their", "parents", "talked", "about", "weather", "markets",
    "music", "trains", "that", "arrived", "late", "every", "winter", "morning", "near", "city", "library", "where",
    "students", "read", "history", "books", "under", "bright", "lamps", "until", "evening", "bells", "rang", "twice",
];

/// 64 sentences, each grown word by word to 30 tokens (`[CLS]` and `[SEP]` included).
fn sentences(e: &Embedder) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for i in 0..64usize {
        let mut words: Vec<&str> = Vec::new();
        let mut j = 0usize;
        loop {
            words.push(WORDS[(i * 7 + j * 13 + j * j) % WORDS.len()]);
            j += 1;
            let s = format!("{}.", words.join(" "));
            if e.tokenize(&s, Task::None)?.len() >= 30 {
                out.push(s);
                break;
            }
        }
    }
    Ok(out)
}

struct Row {
    model: &'static str,
    batch: usize,
    tokens: usize,
    ours: f64,
    reference: Option<(String, f64)>,
}

/// Calls per timed sample: a sample covers about 64 sentences (64 calls of 1, 8 of 8, one of
/// 64), so a small batch's time is a mean over many calls rather than one call of a few
/// milliseconds (both sides alike: the MiniLM reference script repeats the same way).
fn calls_per_sample(batch: usize) -> usize {
    (64 / batch.max(1)).max(1)
}

/// Seconds per call of `Embedder::embed(texts)`: the best of `reps` samples, each the mean of
/// [`calls_per_sample`] calls.
fn time_ours(e: &Embedder, texts: &[&str], reps: usize) -> Result<f64> {
    e.embed(texts)?;
    let calls = calls_per_sample(texts.len());
    let mut best = f64::INFINITY;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        for _ in 0..calls {
            e.embed(texts)?;
        }
        best = best.min(t.elapsed().as_secs_f64() / calls as f64);
    }
    Ok(best)
}

fn options(a: &Args) -> Result<EmbedOptions> {
    let precision = match a.precision.as_str() {
        "float" => Precision::Float,
        "f32" => Precision::F32,
        "q8" => Precision::Q8,
        other => anyhow::bail!("--precision {other}: float, f32 or q8"),
    };
    Ok(EmbedOptions { precision, ..Default::default() })
}

/// The model loaded as `--precision` asks, its products named.
fn load(a: &Args, id: &str) -> Result<Embedder> {
    let e = Embedder::load(id, options(a)?, &mut |_| {})?;
    println!("{id}: products {:?}", e.precision());
    Ok(e)
}

fn threads(a: &Args) -> usize {
    a.threads.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1))
}

fn minilm(a: &Args, rows: &mut Vec<Row>) -> Result<()> {
    let e = load(a, "all-minilm-l6-v2")?;
    let s = sentences(&e)?;
    let mut ids = Vec::new();
    for &b in &BATCHES {
        let texts: Vec<&str> = s[..b].iter().map(String::as_str).collect();
        let toks: Vec<Vec<u32>> = texts.iter().map(|t| e.tokenize(t, Task::None)).collect::<Result<_, _>>()?;
        let n = toks.iter().map(Vec::len).sum();
        let ours = time_ours(&e, &texts, a.reps)?;
        rows.push(Row { model: "all-MiniLM-L6-v2", batch: b, tokens: n, ours, reference: None });
        ids.push(toks);
    }
    let Some(py) = &a.python else {
        println!("(no --python / SAPIENT_REF_PYTHON: the onnxruntime side of MiniLM is skipped)");
        return Ok(());
    };
    let st = sapient_hub::Hub::new()?.fetch_preset("all-minilm-l6-v2", &mut |_| {})?.file("safetensors")?.to_path_buf();
    std::fs::create_dir_all("target/bench")?;
    let input = PathBuf::from("target/bench/embed-input.json");
    std::fs::write(&input, serde_json::to_string(&serde_json::json!({"batches": ids, "reps": 2 * a.reps.max(1), "threads": threads(a)}))?)?;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/embed/bench_reference.py");
    let out = std::process::Command::new(py).arg(&script).arg(&st).arg(&input).output().with_context(|| format!("running {}", py.display()))?;
    anyhow::ensure!(out.status.success(), "bench_reference.py failed: {}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).context("bench_reference.py output")?;
    // The reference's first embedding is the same sentence's: check we measure the same thing.
    let check: Vec<f32> = r["check"].as_array().into_iter().flatten().filter_map(|v| v.as_f64()).map(|v| v as f32).collect();
    let ours = e.embed(&[s[0].as_str()])?;
    println!("MiniLM check: cosine(ours, onnxruntime) on sentence 0 = {:.7}", sapient_embed::cosine(&ours[0], &check));
    let name = format!("onnxruntime {} ({} threads)", r["onnxruntime"].as_str().unwrap_or("?"), threads(a));
    let secs: Vec<f64> = r["seconds"].as_array().into_iter().flatten().filter_map(|v| v.as_f64()).collect();
    let start = rows.len() - BATCHES.len();
    for (row, t) in rows[start..].iter_mut().zip(secs) {
        row.reference = Some((name.clone(), t));
    }
    again(&e, &s, a.reps, &mut rows[start..])
}

/// Ours a second time, after the reference: the best of both passes.
fn again(e: &Embedder, s: &[String], reps: usize, rows: &mut [Row]) -> Result<()> {
    for (row, &b) in rows.iter_mut().zip(&BATCHES) {
        let texts: Vec<&str> = s[..b].iter().map(String::as_str).collect();
        row.ours = row.ours.min(time_ours(e, &texts, reps)?);
    }
    Ok(())
}

/// Time stamp in seconds of `llama-embedding`'s last log line containing `what`, e.g.
/// `0.00.266.533 I batch_decode: ...` (minutes, seconds, milliseconds, microseconds).
fn stamp(stderr: &str, what: &str) -> Option<f64> {
    let line = stderr.lines().rev().find(|l| l.contains(what))?;
    let p: Vec<f64> = line.split_whitespace().next()?.split('.').map(|x| x.parse().ok()).collect::<Option<_>>()?;
    match p.as_slice() {
        [m, s, ms, us] => Some(m * 60.0 + s + ms * 1e-3 + us * 1e-6),
        _ => None,
    }
}

/// From the `batch_decode` log line to the perf print (encode, pooling, printing).
fn encode_time(stderr: &str) -> Option<f64> {
    Some(stamp(stderr, "llama_perf_context_print")? - stamp(stderr, "batch_decode")?)
}

/// One `llama-embedding` process on `file`: its wall time, and its encode time when the log
/// shows it.
fn run_llama(bin: &Path, gguf: &Path, file: &Path, threads: usize) -> Result<(f64, Option<f64>)> {
    let t = Instant::now();
    let out = std::process::Command::new(bin.join("llama-embedding"))
        .arg("-m")
        .arg(gguf)
        .arg("-f")
        .arg(file)
        .args(["--pooling", "mean", "--embd-normalize", "2", "-c", "2048", "-b", "2048", "-ub", "2048", "--embd-output-format", "array"])
        .args(["-t", &threads.to_string(), "-lv", "4"])
        .output()
        .with_context(|| format!("running {}", bin.join("llama-embedding").display()))?;
    let secs = t.elapsed().as_secs_f64();
    let err = String::from_utf8_lossy(&out.stderr);
    anyhow::ensure!(out.status.success(), "llama-embedding failed: {}", err.lines().rev().take(5).collect::<Vec<_>>().join(" | "));
    Ok((secs, encode_time(&err)))
}

fn nomic(a: &Args, rows: &mut Vec<Row>) -> Result<()> {
    let r = sapient_hub::Hub::new()?.fetch_preset("nomic-embed-text-v1.5", &mut |_| {})?;
    let gguf = r.file("gguf")?.to_path_buf();
    let e = load(a, "nomic-embed-text-v1.5")?;
    let s = sentences(&e)?;
    let start = rows.len();
    for &b in &BATCHES {
        let texts: Vec<&str> = s[..b].iter().map(String::as_str).collect();
        let n = texts.iter().map(|t| e.tokenize(t, Task::None).map(|v| v.len())).sum::<Result<usize, _>>()?;
        let ours = time_ours(&e, &texts, a.reps)?;
        rows.push(Row { model: "nomic-embed-text-v1.5", batch: b, tokens: n, ours, reference: None });
    }
    let Some(bin) = &a.llamacpp else {
        println!("(no --llamacpp / SAPIENT_LLAMACPP_BIN: the llama-embedding side of nomic is skipped)");
        return Ok(());
    };
    std::fs::create_dir_all("target/bench")?;
    // Best of llama-embedding's encode time from its log (or of the wall time).
    let best_of = |file: &Path| -> Result<(f64, Option<f64>)> {
        let (mut wall, mut eval) = (f64::INFINITY, Some(f64::INFINITY));
        for _ in 0..=2 * a.reps.max(1) {
            let (w, e) = run_llama(bin, &gguf, file, threads(a))?;
            wall = wall.min(w);
            eval = eval.zip(e).map(|(a, b)| a.min(b));
        }
        Ok((wall, eval))
    };
    let empty = PathBuf::from("target/bench/embed-0.txt");
    std::fs::write(&empty, "x\n")?;
    let (wall0, _) = best_of(&empty)?;
    for (i, &b) in BATCHES.iter().enumerate() {
        let file = PathBuf::from(format!("target/bench/embed-{b}.txt"));
        std::fs::write(&file, s[..b].join("\n") + "\n")?;
        let (wall, eval) = best_of(&file)?;
        let (t, how) = match eval {
            Some(e) => (e, "log: decode to end"),
            None => {
                println!("(llama-embedding's log shows no batch_decode / perf lines: wall time less a 3-token run's {wall0:.3} s)");
                (wall - wall0, "wall - load")
            }
        };
        rows[start + i].reference = Some((format!("llama-embedding ({} threads, {how})", threads(a)), t.max(1e-4)));
    }
    again(&e, &s, a.reps, &mut rows[start..])
}

pub fn run(a: Args) -> Result<()> {
    let mut rows = Vec::new();
    for m in &a.models {
        match m.as_str() {
            "minilm" => minilm(&a, &mut rows)?,
            "nomic" => nomic(&a, &mut rows)?,
            other => anyhow::bail!("unknown model '{other}' (minilm, nomic)"),
        }
    }
    println!("per call, best of {} samples of about 64 sentences each (ours: half before the reference, half after); ours: Embedder::embed from text (tokenization included)", 2 * a.reps.max(1));
    println!("{:<22} {:>5} {:>6} {:>12} {:>12} {:>36} {:>12} {:>12} {:>8}", "model", "batch", "tokens", "ours sent/s", "ours tok/s", "reference", "ref sent/s", "ref tok/s", "ours/ref");
    let mut json = Vec::new();
    for r in &rows {
        let (rn, rs) = match &r.reference {
            Some((n, t)) => (n.clone(), *t),
            None => ("-".into(), f64::NAN),
        };
        println!(
            "{:<22} {:>5} {:>6} {:>12.1} {:>12.0} {:>36} {:>12.1} {:>12.0} {:>7.2}x",
            r.model,
            r.batch,
            r.tokens,
            r.batch as f64 / r.ours,
            r.tokens as f64 / r.ours,
            rn,
            r.batch as f64 / rs,
            r.tokens as f64 / rs,
            rs / r.ours
        );
        json.push(serde_json::json!({"model": r.model, "batch": r.batch, "tokens": r.tokens, "ours_seconds": r.ours,
            "reference": r.reference.as_ref().map(|x| x.0.clone()), "reference_seconds": r.reference.as_ref().map(|x| x.1)}));
    }
    if let Some(parent) = a.json.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&a.json, serde_json::to_string_pretty(&serde_json::json!({"machine": super::machine(), "runs": json}))?)?;
    println!("wrote {}", a.json.display());
    Ok(())
}
