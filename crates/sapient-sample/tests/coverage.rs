//! The JSON Schema coverage table in docs/structured.md, checked: each supported keyword's
//! schema compiles, its grammar and the validator accept the first document and reject the
//! second; each refused keyword's schema fails with `UnsupportedSchema` naming it; every
//! keyword the code knows is in the table.

use anyhow::{bail, Context, Result};
use sapient_sample::{Constraint, Grammar, GrammarError};

struct Row {
    keyword: String,
    supported: bool,
    schema: serde_json::Value,
    accepted: Option<String>,
    rejected: Option<String>,
}

fn code(cell: &str) -> Option<String> {
    let c = cell.trim();
    (c.len() >= 2 && c.starts_with('`') && c.ends_with('`')).then(|| c[1..c.len() - 1].to_string())
}

fn rows() -> Result<Vec<Row>> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/structured.md");
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    let start = text.find("| keyword | status |").context("the coverage table is missing")?;
    let mut out = Vec::new();
    for line in text[start..].lines().skip(2) {
        if !line.starts_with('|') {
            break;
        }
        let cells: Vec<&str> = line.trim().trim_matches('|').split('|').collect();
        anyhow::ensure!(cells.len() == 5, "row without 5 cells: {line}");
        let keyword = cells[0].trim().split('`').nth(1).context("keyword in backticks")?.to_string();
        let supported = match cells[1].trim().split(' ').next() {
            Some("supported" | "supported:") => true,
            Some("refused") => false,
            other => bail!("status {other:?} in {line}"),
        };
        let schema = serde_json::from_str(&code(cells[2]).context("schema in backticks")?).with_context(|| format!("schema of {line}"))?;
        out.push(Row { keyword, supported, schema, accepted: code(cells[3]), rejected: code(cells[4]) });
    }
    Ok(out)
}

#[test]
fn coverage_table_matches_the_code() -> Result<()> {
    let rows = rows()?;
    assert!(rows.len() > 40, "{} rows", rows.len());
    for r in &rows {
        let g = Grammar::json_schema(&r.schema);
        if r.supported {
            let g = g.with_context(|| format!("{}: {}", r.keyword, r.schema))?;
            let (Some(yes), Some(no)) = (&r.accepted, &r.rejected) else { bail!("{}: documents missing", r.keyword) };
            assert!(g.matches(yes.as_bytes())?, "{}: the grammar rejects {yes}", r.keyword);
            assert!(!g.matches(no.as_bytes())?, "{}: the grammar accepts {no}", r.keyword);
            let v: serde_json::Value = serde_json::from_str(yes)?;
            assert!(sapient_sample::validate(&r.schema, &v)?.is_ok(), "{}: the validator rejects {yes}", r.keyword);
            let v: serde_json::Value = serde_json::from_str(no)?;
            assert!(sapient_sample::validate(&r.schema, &v)?.is_err(), "{}: the validator accepts {no}", r.keyword);
        } else {
            match g {
                Err(GrammarError::UnsupportedSchema { keyword, .. }) => {
                    assert!(keyword.contains(&r.keyword), "{}: the error names {keyword:?}", r.keyword)
                }
                other => bail!("{}: expected UnsupportedSchema, got {other:?}", r.keyword),
            }
        }
    }
    let listed = |k: &str, supported: bool| rows.iter().any(|r| r.keyword == k && r.supported == supported);
    for k in sapient_sample::SUPPORTED_KEYWORDS {
        assert!(listed(k, true), "{k} is supported but not in the table");
    }
    for k in sapient_sample::refused_keywords() {
        assert!(listed(k, false), "{k} is refused but not in the table");
    }
    Ok(())
}
