//! What JSON Schema itself says, shared by the grammar compiler (`schema/`) and the
//! validator (`validate.rs`): the keywords neither handles, `$ref` pointers, ECMA 262
//! patterns in the `regex` crate's syntax, the formats asserted, and equality of values.

use crate::error::GrammarError;
use serde_json::Value;

/// JSON Schema keywords refused by both the grammar and the validator.
pub(crate) const UNSUPPORTED: &[&str] = &[
    "contains", "minContains", "maxContains",
    "unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "$recursiveRef", "$anchor",
    "$dynamicAnchor", "$recursiveAnchor",
];

pub(crate) fn resolve<'v>(root: &'v Value, r: &str) -> Option<&'v Value> {
    let ptr = r.strip_prefix('#')?;
    if ptr.is_empty() {
        return Some(root);
    }
    let mut cur = root;
    for part in ptr.strip_prefix('/')?.split('/') {
        let part = part.replace("~1", "/").replace("~0", "~");
        cur = match cur {
            Value::Object(m) => m.get(&part)?,
            Value::Array(a) => a.get(part.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(cur)
}

const DATE: &str = r"[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-9]))";
const DATE_TIME: &str = concat!(
    r"[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-9]))",
    r"T(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,6})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
);

pub(crate) fn format_regex(f: &str) -> Option<&'static str> {
    Some(match f {
        // Month lengths are respected; February 29 is allowed in every year.
        "date" => DATE,
        // RFC 3339 full-time: the offset is required.
        "time" => r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,6})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])",
        "date-time" => DATE_TIME,
        "uuid" => r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
        // Shorter than RFC 5321 allows (64 / 63 x 8): long runs are where small models loop.
        "email" => r"[A-Za-z0-9._%+-]{1,32}@[A-Za-z0-9-]{1,24}(?:\.[A-Za-z0-9-]{1,24}){1,3}",
        // Absolute http(s) URIs with a host name (a subset of RFC 3986 that validators accept).
        "uri" => r"https?://[a-z0-9](?:[a-z0-9-]{0,30}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,30}[a-z0-9])?){0,4}(?::[1-9][0-9]{0,4})?(?:/(?:[A-Za-z0-9._~!$&'()*+,;=:@-]|%[0-9A-Fa-f]{2}){0,32}){0,8}(?:\?(?:[A-Za-z0-9._~!$&'()*+,;=:@/?-]|%[0-9A-Fa-f]{2}){0,64})?",
        "ipv4" => r"(?:(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])",
        _ => return None,
    })
}

/// A JSON Schema `pattern` (ECMA 262 syntax) in the `regex` crate's syntax: `\d`, `\w` and
/// their negations are ASCII as in ECMAScript, `\/` and other escaped punctuation are the
/// character itself, `\cX` is a control character; lookarounds and backreferences, which no
/// automaton can check, are refused by name.
pub(crate) fn ecma_to_rust(p: &str) -> Result<String, GrammarError> {
    let unsupported = |what: &str| GrammarError::UnsupportedSchema { path: String::new(), keyword: format!("pattern {p:?}: {what}") };
    let mut out = String::with_capacity(p.len());
    let mut it = p.chars().peekable();
    let mut in_class = false;
    while let Some(c) = it.next() {
        match c {
            '\\' => match it.next() {
                Some('d') => out.push_str(if in_class { "0-9" } else { "[0-9]" }),
                Some('D') => out.push_str("[^0-9]"),
                Some('w') => out.push_str(if in_class { "0-9A-Za-z_" } else { "[0-9A-Za-z_]" }),
                Some('W') => out.push_str("[^0-9A-Za-z_]"),
                Some('c') => match it.next() {
                    Some(l) if l.is_ascii_alphabetic() => out.push_str(&format!("\\x{:02X}", (l as u8) % 32)),
                    _ => return Err(unsupported("\\c without a letter")),
                },
                Some('0') if !it.peek().is_some_and(|n| n.is_ascii_digit()) => out.push_str("\\x00"),
                Some(n @ '1'..='9') => return Err(unsupported(&format!("backreference \\{n}"))),
                Some('k') if it.peek() == Some(&'<') => return Err(unsupported("named backreference")),
                // Escaped punctuation is the character; other escapes mean the same in both.
                Some(n) => {
                    out.push('\\');
                    out.push(n);
                }
                None => return Err(unsupported("a trailing backslash")),
            },
            '[' if !in_class => {
                in_class = true;
                out.push('[');
                if it.peek() == Some(&'^') {
                    out.push('^');
                    it.next();
                }
                // `[]` matches nothing and `[^]` anything in ECMAScript; a leading `]` is literal
                // in the regex crate, so spell these out.
                if it.peek() == Some(&']') {
                    it.next();
                    in_class = false;
                    if out.ends_with("[^") {
                        out.truncate(out.len() - 2);
                        out.push_str("(?s:.)");
                    } else {
                        out.truncate(out.len() - 1);
                        out.push_str("[^\\x00-\\x{10FFFF}]");
                    }
                }
            }
            '[' => out.push_str("\\["),
            ']' if in_class => {
                in_class = false;
                out.push(']');
            }
            '&' | '~' | '-' if in_class && it.peek() == Some(&c) => {
                // `&&`, `~~` and `--` are class set operations in the regex crate.
                it.next();
                for _ in 0..2 {
                    out.push('\\');
                    out.push(c);
                }
            }
            '(' if !in_class && it.peek() == Some(&'?') => {
                let rest: String = it.clone().take(3).collect();
                if rest.starts_with("?=") || rest.starts_with("?!") || rest.starts_with("?<=") || rest.starts_with("?<!") {
                    return Err(unsupported("lookaround"));
                }
                out.push('(');
            }
            _ => out.push(c),
        }
    }
    Ok(out)
}

/// JSON equality with numbers compared by value (`1` equals `1.0`, as JSON Schema says).
pub(crate) fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64(), x.as_u64(), y.as_u64()) {
            (Some(p), Some(q), _, _) => p == q,
            (_, _, Some(p), Some(q)) => p == q,
            _ => x.as_f64() == y.as_f64(),
        },
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(p, q)| json_eq(p, q)),
        (Value::Object(x), Value::Object(y)) => x.len() == y.len() && x.iter().all(|(k, p)| y.get(k).is_some_and(|q| json_eq(p, q))),
        _ => a == b,
    }
}
