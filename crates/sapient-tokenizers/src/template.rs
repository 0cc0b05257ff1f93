//! Chat templates: the model's own Jinja template run by minijinja with the Python-compatible
//! helpers real templates use (string methods, `raise_exception`, `strftime_now`, `tojson`
//! with Python's `json.dumps` output).

use crate::{Error, Result};
use minijinja::value::ValueKind;
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
        Self {
            role: role.into(),
            content: content.into(),
            extra: Default::default(),
        }
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

/// What a rendering gets besides the messages.
#[derive(Clone, Debug)]
pub struct RenderOptions {
    /// Append the prompt that starts the assistant's turn.
    pub add_generation_prompt: bool,
    /// Tool definitions (a JSON list of `{"type": "function", "function": {...}}`) for templates
    /// that support tools. `None` is passed to the template as `none`, as HF does.
    pub tools: Option<serde_json::Value>,
    /// Extra template variables (e.g. `enable_thinking`, `documents`, `date_string`).
    pub extra: serde_json::Map<String, serde_json::Value>,
    /// The time `strftime_now` formats (UTC). `None`: now.
    pub date: Option<std::time::SystemTime>,
}

impl Default for RenderOptions {
    fn default() -> Self {
        Self {
            add_generation_prompt: true,
            tools: None,
            extra: Default::default(),
            date: None,
        }
    }
}

/// Bounds on one rendering, so that a template (it comes with the model file) and the
/// messages it renders (they may come from the network) cannot run or grow without end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TemplateLimits {
    /// Template instructions one rendering may execute (minijinja's fuel): the bound on its
    /// time. The chat templates of the models in the registry take a few thousand for a
    /// short conversation.
    pub fuel: u64,
    /// The most bytes a rendering may produce.
    pub max_output_bytes: usize,
}

impl Default for TemplateLimits {
    fn default() -> Self {
        Self { fuel: 5_000_000, max_output_bytes: 16 << 20 }
    }
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos: Option<String>,
    eos: Option<String>,
    limits: TemplateLimits,
}

/// A writer that stops at a byte limit.
struct CappedWriter {
    out: Vec<u8>,
    max: usize,
    over: bool,
}

impl std::io::Write for CappedWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.out.len().saturating_add(buf.len()) > self.max {
            self.over = true;
            return Err(std::io::Error::other("output limit"));
        }
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("len", &self.source.len())
            .finish()
    }
}

/// The context variable that carries [`RenderOptions::date`] to `strftime_now`.
const NOW_VAR: &str = "__sapient_strftime_now_unix";

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

/// Python's `json.dumps(value, ensure_ascii=False, indent=indent, separators=..., sort_keys=...)`.
fn py_json(
    v: &serde_json::Value,
    indent: Option<usize>,
    separators: Option<(&str, &str)>,
    sort_keys: bool,
) -> String {
    struct Fmt<'a> {
        indent: Option<usize>,
        item: &'a str,
        key: &'a str,
        sort_keys: bool,
    }
    fn go(f: &Fmt, v: &serde_json::Value, level: usize, out: &mut String) {
        use serde_json::Value as J;
        let nl = |out: &mut String, level: usize| {
            if let Some(n) = f.indent {
                out.push('\n');
                out.push_str(&" ".repeat(n * level));
            }
        };
        match v {
            J::Array(a) if !a.is_empty() => {
                out.push('[');
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        out.push_str(f.item);
                    }
                    nl(out, level + 1);
                    go(f, x, level + 1, out);
                }
                nl(out, level);
                out.push(']');
            }
            J::Object(o) if !o.is_empty() => {
                out.push('{');
                let mut entries: Vec<(&String, &J)> = o.iter().collect();
                if f.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(b.0));
                }
                for (i, (k, x)) in entries.into_iter().enumerate() {
                    if i > 0 {
                        out.push_str(f.item);
                    }
                    nl(out, level + 1);
                    out.push_str(&serde_json::to_string(k).unwrap_or_default());
                    out.push_str(f.key);
                    go(f, x, level + 1, out);
                }
                nl(out, level);
                out.push('}');
            }
            other => out.push_str(&serde_json::to_string(other).unwrap_or_default()),
        }
    }
    let (item, key) = separators.unwrap_or(if indent.is_some() {
        (",", ": ")
    } else {
        (", ", ": ")
    });
    let mut out = String::new();
    go(
        &Fmt {
            indent,
            item,
            key,
            sort_keys,
        },
        v,
        0,
        &mut out,
    );
    out
}

/// Characters Python's `str.isprintable()` rejects (an approximation without Unicode tables:
/// controls, separators other than the space, format characters in common use).
fn py_unprintable(c: char) -> bool {
    matches!(c as u32,
        0..=0x1f | 0x7f..=0xa0 | 0xad | 0x600..=0x605 | 0x61c | 0x6dd | 0x70f | 0x1680 | 0x180e
        | 0x2000..=0x200f | 0x2028..=0x202f | 0x205f..=0x2064 | 0x2066..=0x206f | 0x3000
        | 0xd800..=0xf8ff | 0xfeff | 0xfff9..=0xfffb | 0xe0000..=0xe007f | 0xf0000..)
}

/// Python's `repr()` of a string.
fn py_repr_str(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if py_unprintable(c) => {
                let n = c as u32;
                if n < 0x100 {
                    out.push_str(&format!("\\x{n:02x}"));
                } else if n < 0x10000 {
                    out.push_str(&format!("\\u{n:04x}"));
                } else {
                    out.push_str(&format!("\\U{n:08x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// Python's `repr()` of a value (strings quoted), as jinja2 prints the items of a list or dict.
fn py_repr(v: &Value, out: &mut String) {
    match v.kind() {
        ValueKind::String => py_repr_str(v.as_str().unwrap_or_default(), out),
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            for (i, x) in v.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                py_repr(&x, out);
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, k) in v.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                py_repr(&k, out);
                out.push_str(": ");
                py_repr(&v.get_item(&k).unwrap_or_default(), out);
            }
            out.push('}');
        }
        _ => py_str(v, out),
    }
}

/// Python's `str()` of a value, as jinja2 prints `{{ value }}` and `value|string`:
/// `True`/`False`/`None`, containers as their `repr()`.
fn py_str(v: &Value, out: &mut String) {
    match v.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if v.is_true() { "True" } else { "False" }),
        ValueKind::Seq | ValueKind::Map | ValueKind::Iterable => py_repr(v, out),
        _ => out.push_str(&v.to_string()),
    }
}

/// HF's `{% generation %}...{% endgeneration %}` (marks assistant text for training masks) is
/// a jinja2 extension; it renders its body, like `{% if true %}`.
fn rewrite_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        // "%}" after the "{%" ("{%}" is not a tag end).
        let Some(end) = tag[2..].find("%}").map(|e| e + 2) else {
            out.push_str(tag);
            return out;
        };
        let inner = &tag[2..end];
        let (lead, body) = match inner.strip_prefix(['-', '+']) {
            Some(b) => (&inner[..1], b),
            None => ("", inner),
        };
        let (body, trail) = match body.strip_suffix(['-', '+']) {
            Some(b) => (b, &body[b.len()..]),
            None => (body, ""),
        };
        let replacement = match body.trim() {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match replacement {
            Some(r) => out.push_str(&format!("{{%{lead} {r} {trail}%}}")),
            None => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
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
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
    ];
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
        let limits = TemplateLimits::default();
        env.set_fuel(Some(limits.fuel));
        // As HF transformers' apply_chat_template sets up jinja2.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(|out, state, value| match value.kind() {
            ValueKind::None | ValueKind::Bool | ValueKind::Seq | ValueKind::Map => {
                let mut s = String::new();
                py_str(value, &mut s);
                out.write_str(&s)
                    .map_err(|e| minijinja::Error::new(ErrorKind::WriteFailure, e.to_string()))
            }
            _ => minijinja::escape_formatter(out, state, value),
        });
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<Value, minijinja::Error> {
                Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    format!("template raised: {msg}"),
                ))
            },
        );
        env.add_function(
            "strftime_now",
            |state: &minijinja::State, fmt: String| -> String {
                let unix = state
                    .lookup(NOW_VAR)
                    .and_then(|v| i64::try_from(v).ok())
                    .unwrap_or_else(|| {
                        std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .map(|d| d.as_secs() as i64)
                            .unwrap_or(0)
                    });
                strftime(&fmt, unix)
            },
        );
        env.add_filter("string", |v: Value| -> Value {
            if v.kind() == ValueKind::String {
                return v;
            }
            let mut s = String::new();
            py_str(&v, &mut s);
            Value::from(s)
        });
        env.add_filter(
            "tojson",
            |v: Value,
             kwargs: minijinja::value::Kwargs|
             -> std::result::Result<Value, minijinja::Error> {
                let indent: Option<usize> = kwargs.get("indent")?;
                let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
                let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
                let separators: Option<Vec<String>> = kwargs.get("separators")?;
                kwargs.assert_all_used()?;
                if v.is_undefined() {
                    return Err(minijinja::Error::new(
                        ErrorKind::UndefinedError,
                        "tojson of an undefined value",
                    ));
                }
                let j = serde_json::to_value(&v).map_err(|e| {
                    minijinja::Error::new(ErrorKind::InvalidOperation, e.to_string())
                })?;
                let seps = match &separators {
                    Some(s) if s.len() == 2 => Some((s[0].as_str(), s[1].as_str())),
                    Some(_) => {
                        return Err(minijinja::Error::new(
                            ErrorKind::InvalidOperation,
                            "separators must be two strings",
                        ))
                    }
                    None => None,
                };
                let mut out = py_json(&j, indent, seps, sort_keys.unwrap_or(false));
                if ensure_ascii == Some(true) {
                    out = out
                        .chars()
                        .map(|c| match c as u32 {
                            n if n < 0x80 => c.to_string(),
                            n if n < 0x10000 => format!("\\u{n:04x}"),
                            n => {
                                let n = n - 0x10000;
                                format!(
                                    "\\u{:04x}\\u{:04x}",
                                    0xd800 + (n >> 10),
                                    0xdc00 + (n & 0x3ff)
                                )
                            }
                        })
                        .collect();
                }
                // A plain string, as HF's json.dumps gives (not jinja2's Markup).
                Ok(Value::from(out))
            },
        );
        // Python: strings, lists, dicts (and jinja2's Undefined) iterate; None and numbers do not
        // (minijinja would iterate `none` as empty).
        env.add_test("iterable", |v: Value| {
            matches!(
                v.kind(),
                ValueKind::String
                    | ValueKind::Seq
                    | ValueKind::Map
                    | ValueKind::Iterable
                    | ValueKind::Bytes
                    | ValueKind::Undefined
            )
        });
        env.add_template_owned("chat", rewrite_generation_tags(source))
            .map_err(|e| Error::Template(format!("cannot compile: {}", describe(&e))))?;
        Ok(Self {
            env,
            source: source.to_string(),
            bos: bos_token.map(String::from),
            eos: eos_token.map(String::from),
            limits,
        })
    }

    /// Bound every later rendering by `limits` (default [`TemplateLimits::default`]).
    pub fn set_limits(&mut self, limits: TemplateLimits) {
        self.env.set_fuel(Some(limits.fuel));
        self.limits = limits;
    }

    pub fn limits(&self) -> TemplateLimits {
        self.limits
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// Render a conversation. The template sees what HF's `apply_chat_template` passes:
    /// `messages`, `tools` and `documents` (`none` when absent), `add_generation_prompt`,
    /// `bos_token`, `eos_token`, and the extra variables.
    pub fn render(&self, messages: &[Message], opts: &RenderOptions) -> Result<String> {
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| Error::Template(describe(&e)))?;
        let mut ctx = serde_json::Map::new();
        ctx.insert(
            "messages".into(),
            serde_json::to_value(messages).map_err(|e| Error::Template(e.to_string()))?,
        );
        ctx.insert(
            "tools".into(),
            opts.tools.clone().unwrap_or(serde_json::Value::Null),
        );
        ctx.insert("documents".into(), serde_json::Value::Null);
        ctx.insert(
            "add_generation_prompt".into(),
            opts.add_generation_prompt.into(),
        );
        ctx.insert(
            "bos_token".into(),
            self.bos.clone().unwrap_or_default().into(),
        );
        ctx.insert(
            "eos_token".into(),
            self.eos.clone().unwrap_or_default().into(),
        );
        if let Some(date) = opts.date {
            let unix = match date.duration_since(std::time::UNIX_EPOCH) {
                Ok(d) => d.as_secs() as i64,
                Err(e) => -(e.duration().as_secs() as i64),
            };
            ctx.insert(NOW_VAR.into(), unix.into());
        }
        for (k, v) in &opts.extra {
            ctx.insert(k.clone(), v.clone());
        }
        let mut w = CappedWriter { out: Vec::new(), max: self.limits.max_output_bytes, over: false };
        match tmpl.render_captured_to(Value::from_serialize(&ctx), &mut w) {
            Ok(_) => String::from_utf8(w.out).map_err(|e| Error::Template(format!("rendered text is not UTF-8: {e}"))),
            Err(_) if w.over => Err(Error::Template(format!(
                "the rendering is longer than the limit of {} bytes (TemplateLimits::max_output_bytes)",
                self.limits.max_output_bytes
            ))),
            Err(e) if e.kind() == ErrorKind::OutOfFuel => Err(Error::Template(format!(
                "the template ran more than {} instructions (TemplateLimits::fuel): it loops, or the conversation is too long",
                self.limits.fuel
            ))),
            Err(e) => Err(Error::Template(describe(&e))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(src: &str, messages: &[Message], opts: &RenderOptions) -> Result<String> {
        ChatTemplate::new(src, Some("<s>"), Some("</s>"))?.render(messages, opts)
    }

    #[test]
    fn strftime_known_dates() {
        assert_eq!(strftime("%d %b %Y", 0), "01 Jan 1970");
        // 2024-07-26 00:00:00 UTC
        assert_eq!(
            strftime("%d %B %Y %A", 1_721_952_000),
            "26 July 2024 Friday"
        );
        assert_eq!(strftime("%H:%M:%S %%", 3661), "01:01:01 %");
        assert_eq!(strftime("%Y-%m-%d %a", 951_782_400), "2000-02-29 Tue");
    }

    #[test]
    fn strftime_now_uses_the_render_date() -> Result<()> {
        let opts = RenderOptions {
            date: Some(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_721_952_000)),
            ..Default::default()
        };
        assert_eq!(
            render("{{ strftime_now('%d %b %Y') }}", &[], &opts)?,
            "26 Jul 2024"
        );
        // Without a date: today, whatever it is.
        assert_eq!(
            render("{{ strftime_now('%Y') }}", &[], &RenderOptions::default())?.len(),
            4
        );
        Ok(())
    }

    #[test]
    fn python_json() {
        let v: serde_json::Value = serde_json::json!({"b": [1, "é<\n"], "a": {}});
        assert_eq!(
            py_json(&v, None, None, false),
            r#"{"b": [1, "é<\n"], "a": {}}"#
        );
        assert_eq!(
            py_json(&v, Some(2), None, false),
            "{\n  \"b\": [\n    1,\n    \"é<\\n\"\n  ],\n  \"a\": {}\n}"
        );
        assert_eq!(
            py_json(&v, None, Some((",", ":")), true),
            r#"{"a":{},"b":[1,"é<\n"]}"#
        );
    }

    #[test]
    fn tojson_filter_kwargs() -> Result<()> {
        let m = [Message::user("naïve")];
        let o = RenderOptions::default();
        assert_eq!(
            render("{{ messages[0] | tojson }}", &m, &o)?,
            r#"{"role": "user", "content": "naïve"}"#
        );
        assert_eq!(
            render(
                "{{ messages[0] | tojson(ensure_ascii=true, sort_keys=true) }}",
                &m,
                &o
            )?,
            r#"{"content": "na\u00efve", "role": "user"}"#
        );
        assert_eq!(
            render("{{ messages[0] | tojson(indent=1) }}", &m, &o)?,
            "{\n \"role\": \"user\",\n \"content\": \"naïve\"\n}"
        );
        assert!(render("{{ messages[0] | tojson(colour=1) }}", &m, &o).is_err());
        Ok(())
    }

    #[test]
    fn python_printing() -> Result<()> {
        let mut m = Message::assistant("");
        m.extra.insert("args".into(), serde_json::json!({"city": "São Paulo", "n": 2, "ok": true, "x": null, "l": ["it's", "a\tb"]}));
        let o = RenderOptions {
            tools: None,
            ..Default::default()
        };
        assert_eq!(
            render(
                "{{ messages[0].args }}|{{ true }}|{{ none }}|{{ tools }}|{{ [1, 'a'] | string }}",
                &[m],
                &o
            )?,
            r#"{'city': 'São Paulo', 'n': 2, 'ok': True, 'x': None, 'l': ["it's", 'a\tb']}|True|None|None|[1, 'a']"#
        );
        let mut s = String::new();
        py_repr_str("zw\u{200d}j \u{a0}\\", &mut s);
        assert_eq!(s, r"'zw\u200dj \xa0\\'");
        Ok(())
    }

    #[test]
    fn python_methods_and_loop_controls() -> Result<()> {
        let m = [
            Message::user("  Hello World  "),
            Message::assistant("a,b,c"),
        ];
        let src = "{% for m in messages %}{% if m.role == 'assistant' %}{% break %}{% endif %}\
                   [{{ m.content.strip().lower() }}|{{ m.content.startswith('  H') }}]{% endfor %}\
                   {{ messages[1].content.split(',') | join('+') }}{% for k, v in messages[0].items() %}{{ k }}{% endfor %}";
        assert_eq!(
            render(src, &m, &RenderOptions::default())?,
            "[hello world|True]a+b+crolecontent"
        );
        Ok(())
    }

    #[test]
    fn generation_tags_render_their_body() -> Result<()> {
        let src = "{% for m in messages %}{%- generation -%} <{{ m.content }}> {%- endgeneration %}{% endfor %}";
        assert_eq!(
            render(src, &[Message::assistant("x")], &RenderOptions::default())?,
            "<x>"
        );
        assert_eq!(
            rewrite_generation_tags("{%+ generation %}a{% endgeneration -%}"),
            "{%+ if true %}a{% endif -%}"
        );
        Ok(())
    }

    #[test]
    fn malformed_template_names_the_problem() {
        let e = ChatTemplate::new(
            "Hello\n{% for m in messages %}\n{{ m.content }}",
            None,
            None,
        )
        .unwrap_err();
        let e = e.to_string();
        assert!(e.contains("cannot compile") && e.contains("line"), "{e}");
        let e = ChatTemplate::new("line 1\nline 2\n{{ messages[0 }}", None, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 3"), "{e}");
        let t =
            ChatTemplate::new("{{ raise_exception('roles must alternate') }}", None, None).unwrap();
        let e = t.render(&[], &RenderOptions::default()).unwrap_err();
        assert!(matches!(e, Error::Template(_)));
        assert!(e.to_string().contains("roles must alternate"), "{e}");
    }
}
