//! Chat templates: the model's own Jinja template run by minijinja with the Python-compatible
//! helpers real templates use (string methods, `raise_exception`, `strftime_now`, `tojson`
//! with Python's `json.dumps` output).

use crate::{Error, Result};
use minijinja::{Environment, ErrorKind, Value};
use serde::{Deserialize, Serialize};

/// One chat message. Extra fields (tool calls, names) go in `extra` and reach the template.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
    #[serde(flatten, default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Message {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self { role: role.into(), content: content.into(), extra: Default::default() }
    }
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }
}

#[derive(Clone, Debug)]
pub struct RenderOptions {
    /// Append the prompt that starts the assistant's turn.
    pub add_generation_prompt: bool,
    /// Tool definitions (JSON schema list) for templates that support tools.
    pub tools: Option<serde_json::Value>,
    /// Extra template variables (e.g. `date_string`, `enable_thinking`).
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Default for RenderOptions {
    fn default() -> Self {
        Self { add_generation_prompt: true, tools: None, extra: Default::default() }
    }
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos: Option<String>,
    eos: Option<String>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").field("len", &self.source.len()).finish()
    }
}

fn describe(e: &minijinja::Error) -> String {
    let mut s = e.to_string();
    if let Some(line) = e.line() {
        if !s.contains("line") {
            s.push_str(&format!(" (line {line})"));
        }
    }
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        s.push_str(&format!(": {inner}"));
        src = inner.source();
    }
    s
}

/// Python's `json.dumps(value, ensure_ascii=False, indent=indent)`.
fn py_json(v: &serde_json::Value, indent: Option<usize>) -> String {
    fn go(v: &serde_json::Value, indent: Option<usize>, level: usize, out: &mut String) {
        use serde_json::Value as J;
        let nl = |out: &mut String, level: usize| {
            if let Some(n) = indent {
                out.push('\n');
                out.push_str(&" ".repeat(n * level));
            }
        };
        match v {
            J::Array(a) if !a.is_empty() => {
                out.push('[');
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        out.push_str(if indent.is_some() { "," } else { ", " });
                    }
                    nl(out, level + 1);
                    go(x, indent, level + 1, out);
                }
                nl(out, level);
                out.push(']');
            }
            J::Object(o) if !o.is_empty() => {
                out.push('{');
                for (i, (k, x)) in o.iter().enumerate() {
                    if i > 0 {
                        out.push_str(if indent.is_some() { "," } else { ", " });
                    }
                    nl(out, level + 1);
                    out.push_str(&serde_json::to_string(k).unwrap_or_default());
                    out.push_str(": ");
                    go(x, indent, level + 1, out);
                }
                nl(out, level);
                out.push('}');
            }
            other => out.push_str(&serde_json::to_string(other).unwrap_or_default()),
        }
    }
    let mut out = String::new();
    go(v, indent, 0, &mut out);
    out
}

/// A small strftime for `strftime_now` (the directives chat templates use).
fn strftime(fmt: &str, unix: i64) -> String {
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400);
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    const MONTHS: [&str; 12] = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"];
    const DAYS: [&str; 7] = ["Thursday", "Friday", "Saturday", "Sunday", "Monday", "Tuesday", "Wednesday"];
    let month = MONTHS[(m - 1) as usize];
    let wday = DAYS[days.rem_euclid(7) as usize];
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y % 100)),
            Some('b') => out.push_str(&month[..3]),
            Some('B') => out.push_str(month),
            Some('a') => out.push_str(&wday[..3]),
            Some('A') => out.push_str(wday),
            Some('H') => out.push_str(&format!("{:02}", secs / 3600)),
            Some('M') => out.push_str(&format!("{:02}", secs / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", secs % 60)),
            Some('%') => out.push('%'),
            Some(o) => {
                out.push('%');
                out.push(o);
            }
            None => out.push('%'),
        }
    }
    out
}

impl ChatTemplate {
    /// Compile a template. Syntax errors are reported here, with the line.
    pub fn new(source: &str, bos_token: Option<&str>, eos_token: Option<&str>) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> std::result::Result<Value, minijinja::Error> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, format!("template raised: {msg}")))
        });
        env.add_function("strftime_now", |fmt: String| -> String {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs() as i64)
                .unwrap_or(0);
            strftime(&fmt, now)
        });
        env.add_filter(
            "tojson",
            |v: Value, kwargs: minijinja::value::Kwargs| -> std::result::Result<Value, minijinja::Error> {
                let indent: Option<usize> = kwargs.get("indent")?;
                let _: Option<bool> = kwargs.get("ensure_ascii")?;
                let _: Option<bool> = kwargs.get("sort_keys")?;
                kwargs.assert_all_used()?;
                let j = serde_json::to_value(&v)
                    .map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
                Ok(Value::from_safe_string(py_json(&j, indent)))
            },
        );
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| Error::Template(format!("cannot compile: {}", describe(&e))))?;
        Ok(Self {
            env,
            source: source.to_string(),
            bos: bos_token.map(String::from),
            eos: eos_token.map(String::from),
        })
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// Render a conversation.
    pub fn render(&self, messages: &[Message], opts: &RenderOptions) -> Result<String> {
        let tmpl = self.env.get_template("chat").map_err(|e| Error::Template(describe(&e)))?;
        let mut ctx = serde_json::Map::new();
        ctx.insert("messages".into(), serde_json::to_value(messages).map_err(|e| Error::Template(e.to_string()))?);
        ctx.insert("add_generation_prompt".into(), opts.add_generation_prompt.into());
        ctx.insert("bos_token".into(), self.bos.clone().unwrap_or_default().into());
        ctx.insert("eos_token".into(), self.eos.clone().unwrap_or_default().into());
        if let Some(t) = &opts.tools {
            ctx.insert("tools".into(), t.clone());
        }
        for (k, v) in &opts.extra {
            ctx.insert(k.clone(), v.clone());
        }
        tmpl.render(Value::from_serialize(&ctx)).map_err(|e| Error::Template(describe(&e)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_known_dates() {
        assert_eq!(strftime("%d %b %Y", 0), "01 Jan 1970");
        // 2024-07-26 00:00:00 UTC
        assert_eq!(strftime("%d %B %Y %A", 1_721_952_000), "26 July 2024 Friday");
        assert_eq!(strftime("%H:%M:%S %%", 3661), "01:01:01 %");
    }

    #[test]
    fn python_json() {
        let v: serde_json::Value = serde_json::json!({"a": [1, "é<"], "b": {}});
        assert_eq!(py_json(&v, None), r#"{"a": [1, "é<"], "b": {}}"#);
        assert_eq!(py_json(&v, Some(2)), "{\n  \"a\": [\n    1,\n    \"é<\"\n  ],\n  \"b\": {}\n}");
    }

    #[test]
    fn malformed_template_names_the_problem() {
        let e = ChatTemplate::new("{% for m in messages %}{{ m.content }}", None, None).unwrap_err();
        assert!(e.to_string().contains("cannot compile"), "{e}");
        let t = ChatTemplate::new("{{ raise_exception('roles must alternate') }}", None, None).unwrap();
        let e = t.render(&[], &RenderOptions::default()).unwrap_err();
        assert!(e.to_string().contains("roles must alternate"), "{e}");
    }
}
