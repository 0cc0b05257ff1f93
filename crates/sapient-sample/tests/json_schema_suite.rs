//! The official JSON-Schema-Test-Suite against `Grammar::json_schema`: for every test group
//! of the draft 2020-12 and draft 7 keyword files (not `optional/`), the schema is compiled;
//! when it compiles, every test document, written compactly (`serde_json::to_string`, the
//! form a constrained model writes), must be matched by the grammar exactly when the suite
//! says it is valid. A schema the grammar refuses (an unsupported keyword, a `$ref` to
//! another document, ...) is counted as refused, by reason.
//!
//! The suite comes from the `jsonschema` sdist through sapient-hub (sha256-pinned, cached
//! under `$SAPIENT_HOME/packages/`); see tests/data/json_schema_sets.toml. The per-file table
//! is printed (`--nocapture`) and written to `$CARGO_TARGET_TMPDIR/json_schema_suite.md`.
//!
//! The floors below are the figures of the grammar as it is: agreement must not fall under
//! them, and nothing may panic.

use sapient_sample::{Constraint, Grammar, GrammarError};
use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Share of the documents of compiled schemas on which the grammar agrees with the suite.
const FLOOR_AGREE_RATE: f64 = 0.75;
/// Documents right over the whole suite (a refused schema gets none of its documents right).
const FLOOR_AGREED: usize = 1180;

#[derive(serde::Deserialize)]
struct Sets {
    set: Vec<sapient_hub::FileSet>,
}

#[derive(Default)]
struct Tally {
    groups: usize,
    compiled: usize,
    refused: BTreeMap<String, usize>,
    docs: usize,
    agreed: usize,
    valid_rejected: usize,
    invalid_accepted: usize,
    docs_of_refused: usize,
    panics: usize,
}

impl Tally {
    fn add(&mut self, o: &Tally) {
        self.groups += o.groups;
        self.compiled += o.compiled;
        for (k, v) in &o.refused {
            *self.refused.entry(k.clone()).or_default() += v;
        }
        self.docs += o.docs;
        self.agreed += o.agreed;
        self.valid_rejected += o.valid_rejected;
        self.invalid_accepted += o.invalid_accepted;
        self.docs_of_refused += o.docs_of_refused;
        self.panics += o.panics;
    }

    /// A table row; `reasons`: with the reasons for refusals.
    fn row(&self, name: &str, reasons: bool) -> String {
        let refused: Vec<String> = self.refused.iter().filter(|_| reasons).map(|(k, v)| format!("{k} ×{v}")).collect();
        let rate = if self.docs > 0 { format!("{:.1}%", 100.0 * self.agreed as f64 / self.docs as f64) } else { "–".into() };
        format!(
            "| {name} | {} | {} | {} | {} | {} | {} | {} | {rate} | {} |",
            self.groups,
            self.compiled,
            self.groups - self.compiled,
            self.docs,
            self.agreed,
            self.valid_rejected,
            self.invalid_accepted,
            if refused.is_empty() { "".into() } else { refused.join(", ") },
        )
    }
}

/// Why a schema was refused, as a short label: the error kind and, where it names one, the
/// keyword.
fn reason(e: &GrammarError) -> String {
    match e {
        GrammarError::UnsupportedSchema { keyword, .. } => format!("unsupported `{keyword}`"),
        GrammarError::UnresolvedRef(r) if r.contains("://") => "remote $ref".into(),
        GrammarError::UnresolvedRef(_) => "unresolved $ref".into(),
        GrammarError::InvalidRegex { .. } => "invalid regex".into(),
        GrammarError::InvalidSchema { message, .. } => format!("invalid schema ({})", message.split(':').next().unwrap_or(message)),
        other => {
            let d = format!("{other:?}");
            d.split(|c: char| !c.is_alphanumeric()).next().unwrap_or("error").to_string()
        }
    }
}

fn run_file(path: &std::path::Path) -> anyhow::Result<Tally> {
    let groups: Vec<serde_json::Value> = serde_json::from_slice(&std::fs::read(path)?)?;
    let mut t = Tally::default();
    for g in &groups {
        t.groups += 1;
        let tests = g["tests"].as_array().cloned().unwrap_or_default();
        let compiled = catch_unwind(AssertUnwindSafe(|| Grammar::json_schema(&g["schema"])));
        let grammar = match compiled {
            Ok(Ok(grammar)) => grammar,
            Ok(Err(e)) => {
                *t.refused.entry(reason(&e)).or_default() += 1;
                t.docs_of_refused += tests.len();
                continue;
            }
            Err(_) => {
                eprintln!("PANIC compiling {} / {}", path.display(), g["description"]);
                t.panics += 1;
                *t.refused.entry("panic".into()).or_default() += 1;
                t.docs_of_refused += tests.len();
                continue;
            }
        };
        t.compiled += 1;
        for case in &tests {
            let doc = serde_json::to_string(&case["data"])?;
            let valid = case["valid"].as_bool().unwrap_or(false);
            t.docs += 1;
            let got = match catch_unwind(AssertUnwindSafe(|| grammar.matches(doc.as_bytes()))) {
                Ok(Ok(m)) => m,
                // An error while matching (a limit) counts as not matching.
                Ok(Err(_)) => false,
                Err(_) => {
                    eprintln!("PANIC matching {doc} against {} / {}", path.display(), g["description"]);
                    t.panics += 1;
                    continue;
                }
            };
            match (valid, got) {
                (v, g) if v == g => t.agreed += 1,
                (true, false) => t.valid_rejected += 1,
                _ => t.invalid_accepted += 1,
            }
        }
    }
    Ok(t)
}

#[test]
fn json_schema_test_suite() -> anyhow::Result<()> {
    let sets: Sets = toml::from_str(include_str!("data/json_schema_sets.toml"))?;
    let hub = sapient_hub::Hub::new()?;
    let header = "| file | groups | compiled | refused | documents of compiled schemas | agreed | valid rejected | invalid accepted | agreement | refused because |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---|";
    let mut md = String::new();
    let mut all = Tally::default();
    for set in sets.set.iter().filter(|s| s.package == "jsonschema") {
        let files = hub.fetch_file_set(set, &mut |_| {})?;
        let mut total = Tally::default();
        md.push_str(&format!("\n### {}\n\n{header}\n", set.name));
        for f in &files {
            let name = f.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
            let t = run_file(f)?;
            md.push_str(&t.row(&name, true));
            md.push('\n');
            total.add(&t);
        }
        md.push_str(&total.row(&format!("**all {}**", set.name), false));
        md.push('\n');
        all.add(&total);
    }
    let rate = all.agreed as f64 / all.docs.max(1) as f64;
    let summary = format!(
        "\n{} groups: {} compiled ({:.1}%), {} refused; documents of compiled schemas: {} of {} agreed ({:.2}%: {} valid rejected, {} invalid accepted); documents of refused schemas: {}; panics: {}\n",
        all.groups,
        all.compiled,
        100.0 * all.compiled as f64 / all.groups.max(1) as f64,
        all.groups - all.compiled,
        all.agreed,
        all.docs,
        100.0 * rate,
        all.valid_rejected,
        all.invalid_accepted,
        all.docs_of_refused,
        all.panics,
    );
    md.push_str(&summary);
    let mut reasons: Vec<(&String, &usize)> = all.refused.iter().collect();
    reasons.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    md.push_str("\n| refused because (both drafts) | schemas |\n|---|---:|\n");
    for (why, n) in reasons {
        md.push_str(&format!("| {why} | {n} |\n"));
    }
    println!("{md}");
    let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("json_schema_suite.md");
    std::fs::write(&out, &md)?;
    assert_eq!(all.panics, 0, "panics in the grammar (see stderr)");
    assert!(rate >= FLOOR_AGREE_RATE, "agreement on compiled schemas {rate:.4} fell under the floor {FLOOR_AGREE_RATE}");
    assert!(all.agreed >= FLOOR_AGREED, "documents right {} fell under the floor {FLOOR_AGREED}", all.agreed);
    Ok(())
}
