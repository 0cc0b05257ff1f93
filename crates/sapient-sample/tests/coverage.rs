//! The JSON Schema coverage table in docs/structured.md, checked: each supported keyword's
//! schema compiles, its grammar and the validator accept the first document and reject the
//! second; each refused keyword's schema fails with `UnsupportedSchema` naming it; every
//! keyword the code knows is in the table.

use anyhow::{bail, Context, Result};
use sapient_sample::{Constraint, Grammar, GrammarError};

#[derive(PartialEq)]
enum Status {
    Supported,
    Refused,
    Ignored,
}

struct Row {
    keyword: String,
    status: Status,
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
        let status = match cells[1].trim().split(' ').next() {
            Some("supported" | "supported:") => Status::Supported,
            Some("refused") => Status::Refused,
            Some("ignored") => Status::Ignored,
            other => bail!("status {other:?} in {line}"),
        };
        let schema = serde_json::from_str(&code(cells[2]).context("schema in backticks")?).with_context(|| format!("schema of {line}"))?;
        out.push(Row { keyword, status, schema, accepted: code(cells[3]), rejected: code(cells[4]) });
    }
    Ok(out)
}

#[test]
fn coverage_table_matches_the_code() -> Result<()> {
    let rows = rows()?;
    assert!(rows.len() > 40, "{} rows", rows.len());
    // The grammar and the validator accept the first document and reject the second.
    let verdicts = |k: &str, schema: &serde_json::Value, yes: &str, no: &str| -> Result<()> {
        let g = Grammar::json_schema(schema).with_context(|| format!("{k}: {schema}"))?;
        assert!(g.matches(yes.as_bytes())?, "{k}: the grammar rejects {yes}");
        assert!(!g.matches(no.as_bytes())?, "{k}: the grammar accepts {no}");
        let v: serde_json::Value = serde_json::from_str(yes)?;
        assert!(sapient_sample::validate(schema, &v)?.is_ok(), "{k}: the validator rejects {yes}");
        let v: serde_json::Value = serde_json::from_str(no)?;
        assert!(sapient_sample::validate(schema, &v)?.is_err(), "{k}: the validator accepts {no}");
        Ok(())
    };
    for r in &rows {
        let g = Grammar::json_schema(&r.schema);
        if r.status != Status::Refused {
            let (Some(yes), Some(no)) = (&r.accepted, &r.rejected) else { bail!("{}: documents missing", r.keyword) };
            verdicts(&r.keyword, &r.schema, yes, no)?;
            if r.status == Status::Ignored {
                // The same verdicts without the keyword: it changes nothing.
                let mut without = r.schema.clone();
                without.as_object_mut().context("schema object")?.remove(&r.keyword).context("the keyword is in its schema")?;
                verdicts(&r.keyword, &without, yes, no)?;
            }
        } else {
            match g {
                Err(GrammarError::UnsupportedSchema { keyword, .. }) => {
                    assert!(keyword.contains(&r.keyword), "{}: the error names {keyword:?}", r.keyword)
                }
                other => bail!("{}: expected UnsupportedSchema, got {other:?}", r.keyword),
            }
        }
    }
    let listed = |k: &str, status: Status| rows.iter().any(|r| r.keyword == k && r.status == status);
    for k in sapient_sample::SUPPORTED_KEYWORDS {
        assert!(listed(k, Status::Supported), "{k} is supported but not in the table");
    }
    for k in sapient_sample::refused_keywords() {
        assert!(listed(k, Status::Refused), "{k} is refused but not in the table");
    }
    for k in sapient_sample::ANNOTATIONS {
        assert!(listed(k, Status::Ignored), "{k} is ignored but not in the table");
    }
    Ok(())
}
