//! Strings: length bounds, `pattern` (ECMA 262 syntax), `format`.

use super::*;
use crate::spec::{ecma_to_rust, format_regex};
use crate::dfa::DfaTable;

pub(super) fn json_char() -> String {
    format!(r#"(?:[^"\\\x00-\x1F]|\\["\\/bfnrt]|{})"#, crate::builder::JSON_UNICODE_ESCAPE)
}

/// The regex of a string's content for a `pattern`: searched anywhere, as JSON Schema says
/// (anchors in the pattern keep their meaning).
pub(crate) fn pattern_regex(p: &str, path: &str) -> Result<String, GrammarError> {
    let p = ecma_to_rust(p).map_err(|e| match e {
        GrammarError::UnsupportedSchema { keyword, .. } => GrammarError::UnsupportedSchema { path: path.to_string(), keyword },
        e => e,
    })?;
    Ok(format!("(?s:.)*(?:{p})(?s:.)*"))
}

/// Most states a string's content automaton may have when a pattern or format is combined
/// with length bounds or excluded values.
const MAX_COMBINED_STATES: usize = 20_000;

pub(super) fn string(b: &mut Builder, obj: &serde_json::Map<String, Value>, path: &str) -> Result<NodeId, GrammarError> {
    let min = get_u32(obj, "minLength", path)?;
    let max = get_u32(obj, "maxLength", path)?;
    if let (Some(lo), Some(hi)) = (min, max) {
        if lo > hi {
            return Err(GrammarError::Unsatisfiable(format!("minLength {lo} > maxLength {hi} at {path}")));
        }
    }
    let pattern = obj.get("pattern").map(|p| p.as_str().ok_or_else(|| invalid(path, "pattern must be a string"))).transpose()?;
    let format = match obj.get("format").and_then(|f| f.as_str()) {
        Some(f) => match format_regex(f) {
            Some(r) => Some(r),
            None => {
                // The specification's default: an unknown format is an annotation.
                tracing::debug!(path, format = f, "unknown string format is not asserted");
                None
            }
        },
        None => None,
    };
    let excluded: Vec<&str> = not_values(obj).filter_map(|v| v.as_str()).collect();
    let mut parts: Vec<String> = Vec::new();
    if let Some(p) = pattern {
        parts.push(pattern_regex(p, path)?);
    }
    if let Some(f) = format {
        parts.push(f.to_string());
    }
    if parts.is_empty() && excluded.is_empty() {
        // Escapes allowed: a length counts characters, an escape is one.
        let rep = match (min, max) {
            (None, None) => return b.json_string(),
            (lo, Some(hi)) => format!("{{{},{hi}}}", lo.unwrap_or(0)),
            (lo, None) => format!("{{{},}}", lo.unwrap_or(0)),
        };
        let pattern = format!("\"{}{rep}\"", json_char());
        return b.regex_by(&pattern, false, || {
            let item = crate::dfa::compiled(&json_char(), false)?;
            match DfaTable::quoted_repeat(&item, min.unwrap_or(0), max, &pattern)? {
                Some(t) => Ok(t),
                None => DfaTable::new(&pattern, &|_| false),
            }
        });
    }
    let content = content_dfa(b, &parts, min, max, &excluded, path)?;
    let inner = b.add_dfa(content);
    let (q1, q2) = (b.lit("\""), b.lit("\""));
    Ok(b.seq(vec![q1, inner, q2]))
}

/// A string's content as one automaton, written without escapes: every regex of `parts`
/// (all must match), the length bounds, and none of the `excluded` values.
fn content_dfa(b: &mut Builder, parts: &[String], min: Option<u32>, max: Option<u32>, excluded: &[&str], path: &str) -> Result<DfaTable, GrammarError> {
    let what = format!("the string at {path}");
    let unsat = |e: GrammarError| match e {
        GrammarError::Unsatisfiable(_) => GrammarError::Unsatisfiable(format!(
            "{what} can be no string without quotes, backslashes or control characters"
        )),
        e => e,
    };
    let mut content = b.dfa_of(parts.first().map(String::as_str).unwrap_or("(?s:.)*"), true).map_err(unsat)?;
    for p in parts.iter().skip(1) {
        let other = b.dfa_of(p, true).map_err(unsat)?;
        content = content.product(&other, true, MAX_COMBINED_STATES, &what).map_err(unsat)?;
    }
    if min.is_some() || max.is_some() {
        let rep = match max {
            Some(hi) => format!("(?s:.){{{},{hi}}}", min.unwrap_or(0)),
            None => format!("(?s:.){{{},}}", min.unwrap_or(0)),
        };
        let len = b.dfa_of(&rep, true)?;
        content = content.product(&len, true, MAX_COMBINED_STATES, &what).map_err(unsat)?;
    }
    if !excluded.is_empty() {
        let alts: Vec<String> = excluded.iter().map(|s| regex_syntax_escape(s)).collect();
        let ex = b.dfa_of(&alts.join("|"), true)?;
        content = content.product(&ex, false, MAX_COMBINED_STATES, &what).map_err(unsat)?;
    }
    Ok(content)
}

/// The keys `propertyNames` allows, as an automaton over their text (keys are written
/// without escapes); `None` when it allows none.
pub(super) fn key_content(b: &mut Builder, s: &Value, path: &str) -> Result<Option<DfaTable>, GrammarError> {
    let obj = match s {
        Value::Bool(false) => return Ok(None),
        Value::Bool(true) => return Ok(Some(b.dfa_of("(?s:.)*", true)?)),
        Value::Object(o) => o,
        _ => return Err(invalid(path, "a schema must be an object or a boolean")),
    };
    for k in obj.keys() {
        let known = ["pattern", "minLength", "maxLength", "format", "enum", "const", "type", NOT_VALUES].contains(&k.as_str());
        if !known && !is_annotation(k) {
            return Err(GrammarError::UnsupportedSchema { path: path.to_string(), keyword: format!("propertyNames with {k}") });
        }
    }
    if obj.get("type").is_some_and(|t| t != "string") {
        return Ok(None);
    }
    let mut parts = Vec::new();
    if let Some(p) = obj.get("pattern").and_then(|p| p.as_str()) {
        parts.push(pattern_regex(p, path)?);
    }
    if let Some(f) = obj.get("format").and_then(|f| f.as_str()).and_then(format_regex) {
        parts.push(f.to_string());
    }
    let values: Option<Vec<&str>> = match (obj.get("const"), obj.get("enum")) {
        (Some(c), _) => Some(c.as_str().into_iter().collect()),
        (None, Some(Value::Array(e))) => Some(e.iter().filter_map(|v| v.as_str()).collect()),
        _ => None,
    };
    if let Some(vals) = values {
        if vals.is_empty() {
            return Ok(None);
        }
        parts.push(vals.iter().map(|v| regex_syntax_escape(v)).collect::<Vec<_>>().join("|"));
    }
    let excluded: Vec<&str> = not_values(obj).filter_map(|v| v.as_str()).collect();
    let (min, max) = (get_u32(obj, "minLength", path)?, get_u32(obj, "maxLength", path)?);
    match content_dfa(b, &parts, min, max, &excluded, path) {
        Ok(d) => Ok(Some(d)),
        Err(GrammarError::Unsatisfiable(_)) => Ok(None),
        Err(e) => Err(e),
    }
}
