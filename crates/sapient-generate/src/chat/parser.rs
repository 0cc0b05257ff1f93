//! Tool calls, the output's side: [`Parser`] splits generated text into content and calls
//! as it streams, in each [`Format`]: a call starts once its name is whole, and its arguments
//! stream as they come.

use super::tools::{Format, CLOSE, LLAMA3_OPEN, MISTRAL_OPEN, OPEN};
use serde_json::Value;

/// One piece of a parsed answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    Content(String),
    /// Text of a reasoning model's `<think>` block (chat's `reasoning_content`; the tool
    /// parser never gives it).
    Reasoning(String),
    /// A call starts: its index among the answer's calls, and its function's name.
    CallStart { index: usize, name: String },
    /// More of a call's `arguments` (JSON text).
    CallArgs { index: usize, text: String },
}

#[derive(Debug)]
enum State {
    /// Llama 3: nothing but a possible start of a call yet.
    Start,
    /// Llama 3 and Mistral: the calls, parsed when the answer ends (what does not stream:
    /// another key order than the constraint's).
    Calls,
    /// Llama 3's call object or Mistral's list, streamed: `buf` holds the text since the call
    /// (Llama 3) or the marker (Mistral), `at` how much of it is parsed, `first` the number
    /// of calls before it.
    Json { at: usize, step: Step, first: usize },
    Text,
    /// Inside a call (after OPEN): the text so far, the header's length once parsed, the
    /// bytes of arguments already given out.
    Call { header: Option<usize>, emitted: usize },
    /// After a call's CLOSE: whitespace, another OPEN, or text.
    Between,
}

/// Where the streamed parse of a Llama 3 call or a Mistral list is.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// Mistral: before the list's `[`.
    List,
    /// Before a call's `{"name": "..", "arguments": ` is whole.
    Header,
    /// In a call's arguments.
    Args(Scan),
    /// After the arguments: the call object's `}`.
    Close,
    /// Mistral: after a call, `,` and another, or the list's `]`.
    Next,
    /// After the calls.
    Done,
}

/// The scan of a JSON value's text, as it comes.
#[derive(Debug, Clone, Copy, Default)]
struct Scan {
    depth: usize,
    string: bool,
    escape: bool,
    started: bool,
}

impl Scan {
    /// Scan more of the value: where in `b` its text starts (after leading whitespace) and,
    /// once it is whole, where it ends.
    fn feed(&mut self, b: &[u8]) -> (usize, Option<usize>) {
        let mut from = if self.started { 0 } else { b.len() };
        for (i, &c) in b.iter().enumerate() {
            if !self.started {
                if c.is_ascii_whitespace() {
                    continue;
                }
                self.started = true;
                from = i;
            }
            if self.string {
                if self.escape {
                    self.escape = false;
                } else if c == b'\\' {
                    self.escape = true;
                } else if c == b'"' {
                    self.string = false;
                    if self.depth == 0 {
                        return (from, Some(i + 1));
                    }
                }
                continue;
            }
            match c {
                b'"' => self.string = true,
                b'{' | b'[' => self.depth += 1,
                b'}' | b']' if self.depth == 0 => return (from, Some(i)),
                b'}' | b']' => {
                    self.depth -= 1;
                    if self.depth == 0 {
                        return (from, Some(i + 1));
                    }
                }
                // The end of a number or literal.
                b',' if self.depth == 0 => return (from, Some(i)),
                c if c.is_ascii_whitespace() && self.depth == 0 => return (from, Some(i)),
                _ => {}
            }
        }
        (from, None)
    }
}

/// Splits generated text into content and tool calls as it streams.
#[derive(Debug)]
pub struct Parser {
    buf: String,
    state: State,
    calls: usize,
    format: Format,
}

/// Bytes of a call held back while streaming its arguments: the end `}` and CLOSE with a
/// little whitespace must not be given out as arguments.
const HOLD: usize = CLOSE.len() + 8;

impl Default for Parser {
    fn default() -> Self {
        Self::new()
    }
}

impl Parser {
    pub fn new() -> Self {
        Self::for_format(Format::Hermes)
    }

    /// A parser for a model family's syntax.
    pub fn for_format(format: Format) -> Self {
        Self { buf: String::new(), state: if format == Format::Llama3 { State::Start } else { State::Text }, calls: 0, format }
    }

    /// Number of calls started so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.feed(text)
    }

    /// The end of the text: everything held back.
    pub fn finish(&mut self) -> Vec<Piece> {
        self.flush()
    }
}

/// A streamed splitter of output into pieces: text fed into its buffer, pieces out as its
/// scan completes them.
pub(super) trait Scanner {
    fn buffer(&mut self) -> &mut String;
    /// Scan the buffer (`end`: nothing more comes, give out what is held back).
    fn run(&mut self, out: &mut Vec<Piece>, end: bool);

    fn feed(&mut self, text: &str) -> Vec<Piece> {
        self.buffer().push_str(text);
        let mut out = Vec::new();
        self.run(&mut out, false);
        out
    }

    fn flush(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        self.run(&mut out, true);
        out
    }
}

impl Scanner for Parser {
    fn buffer(&mut self) -> &mut String {
        &mut self.buf
    }

    fn run(&mut self, out: &mut Vec<Piece>, end: bool) {
        loop {
            match &mut self.state {
                State::Start => {
                    let t = self.buf.trim_start();
                    if t.starts_with(LLAMA3_OPEN) {
                        self.state = State::Json { at: 0, step: Step::Header, first: self.calls };
                    } else if !end && LLAMA3_OPEN.starts_with(t) {
                        return;
                    } else {
                        self.state = State::Text;
                    }
                }
                State::Calls => {
                    if end {
                        let body = std::mem::take(&mut self.buf);
                        match whole_calls(self.format, &body) {
                            Some(calls) => {
                                for (name, args) in calls {
                                    let index = self.calls;
                                    self.calls += 1;
                                    out.push(Piece::CallStart { index, name });
                                    out.push(Piece::CallArgs { index, text: args });
                                }
                            }
                            // Not calls after all (cut short, or not JSON): the text as it was.
                            None if self.format == Format::Mistral => out.push(Piece::Content(format!("{MISTRAL_OPEN}{body}"))),
                            None => out.push(Piece::Content(body)),
                        }
                    }
                    return;
                }
                State::Json { at, step, first } => {
                    let (at, step, first) = (*at, *step, *first);
                    if !self.json(at, step, first, out, end) {
                        return;
                    }
                }
                State::Text if self.format == Format::Llama3 => {
                    if !self.buf.is_empty() {
                        out.push(Piece::Content(std::mem::take(&mut self.buf)));
                    }
                    return;
                }
                State::Text if self.format == Format::Mistral => {
                    if let Some(i) = self.buf.find(MISTRAL_OPEN) {
                        let before = &self.buf[..i];
                        if !before.is_empty() {
                            out.push(Piece::Content(before.to_string()));
                        }
                        self.buf.drain(..i + MISTRAL_OPEN.len());
                        self.state = State::Json { at: 0, step: Step::List, first: self.calls };
                        continue;
                    }
                    let keep = if end { 0 } else { partial_suffix(&self.buf, MISTRAL_OPEN) };
                    let give = self.buf.len() - keep;
                    if give > 0 {
                        out.push(Piece::Content(self.buf[..give].to_string()));
                        self.buf.drain(..give);
                    }
                    return;
                }
                State::Text => {
                    if let Some(i) = self.buf.find(OPEN) {
                        if i > 0 {
                            out.push(Piece::Content(self.buf[..i].to_string()));
                        }
                        self.buf.drain(..i + OPEN.len());
                        self.state = State::Call { header: None, emitted: 0 };
                        continue;
                    }
                    let keep = if end { 0 } else { partial_suffix(&self.buf, OPEN) };
                    let give = self.buf.len() - keep;
                    if give > 0 {
                        out.push(Piece::Content(self.buf[..give].to_string()));
                        self.buf.drain(..give);
                    }
                    return;
                }
                State::Between => {
                    let trimmed = self.buf.trim_start();
                    if trimmed.starts_with(OPEN) {
                        let skip = self.buf.len() - trimmed.len() + OPEN.len();
                        self.buf.drain(..skip);
                        self.state = State::Call { header: None, emitted: 0 };
                        continue;
                    }
                    if (trimmed.is_empty() || OPEN.starts_with(trimmed)) && !end {
                        return;
                    }
                    if trimmed.is_empty() {
                        self.buf.clear();
                        return;
                    }
                    self.state = State::Text;
                }
                State::Call { header, emitted } => {
                    let index = self.calls;
                    if header.is_none() {
                        if let Some((name, len)) = parse_header(&self.buf) {
                            *header = Some(len);
                            self.calls += 1;
                            out.push(Piece::CallStart { index, name });
                        }
                    }
                    let index = if header.is_some() { self.calls - 1 } else { index };
                    if let Some(j) = self.buf.find(CLOSE) {
                        let body = self.buf[..j].to_string();
                        self.buf.drain(..j + CLOSE.len());
                        let (h, e) = (*header, *emitted);
                        self.state = State::Between;
                        match h {
                            Some(h) => {
                                let args = args_text(&body[h..]);
                                if e < args.len() && args.is_char_boundary(e) {
                                    out.push(Piece::CallArgs { index, text: args[e..].to_string() });
                                }
                            }
                            None => match whole_call(&body) {
                                Some((name, args)) => {
                                    self.calls += 1;
                                    out.push(Piece::CallStart { index, name });
                                    out.push(Piece::CallArgs { index, text: args });
                                }
                                // Not a call after all: give the text back as content.
                                None => out.push(Piece::Content(format!("{OPEN}{body}{CLOSE}"))),
                            },
                        }
                        continue;
                    }
                    if end {
                        // Cut short (max_tokens): what there is.
                        match *header {
                            Some(h) => {
                                let rest = &self.buf[h..];
                                let rest = &rest[..rest.len() - partial_suffix(rest, CLOSE)];
                                let args = args_text(rest);
                                if *emitted < args.len() && args.is_char_boundary(*emitted) {
                                    out.push(Piece::CallArgs { index, text: args[*emitted..].to_string() });
                                }
                            }
                            None => out.push(Piece::Content(format!("{OPEN}{}", self.buf))),
                        }
                        self.buf.clear();
                        self.state = State::Text;
                        return;
                    }
                    if let Some(h) = *header {
                        let mut upto = self.buf.len().saturating_sub(HOLD).max(h);
                        while !self.buf.is_char_boundary(upto) {
                            upto -= 1;
                        }
                        if upto > h + *emitted {
                            out.push(Piece::CallArgs { index, text: self.buf[h + *emitted..upto].to_string() });
                            *emitted = upto - h;
                        }
                    }
                    return;
                }
            }
        }
    }
}

impl Parser {
    /// One step of [`State::Json`]; false when it needs more text (or the text has ended).
    fn json(&mut self, at: usize, step: Step, first: usize, out: &mut Vec<Piece>, end: bool) -> bool {
        let rest = &self.buf[at..];
        let t = rest.trim_start();
        let past = |n: usize| at + rest.len() - t.len() + n;
        // Wait for more, unless the text has ended.
        let more = t.is_empty() && !end;
        let next = match step {
            Step::List if t.starts_with('[') => Some((past(1), Step::Header)),
            Step::Header => match header(rest, self.format.args_key()) {
                Head::Whole(name, len) => {
                    out.push(Piece::CallStart { index: self.calls, name });
                    self.calls += 1;
                    Some((at + len, Step::Args(Scan::default())))
                }
                Head::Partial if !end => return false,
                _ => None,
            },
            Step::Args(mut scan) => {
                let (from, stop) = scan.feed(rest.as_bytes());
                let to = stop.unwrap_or(rest.len());
                if to > from {
                    out.push(Piece::CallArgs { index: self.calls - 1, text: rest[from..to].to_string() });
                }
                match stop {
                    Some(_) => Some((at + to, Step::Close)),
                    None if end => {
                        // Cut short (max_tokens): the arguments there are.
                        self.buf.clear();
                        self.state = State::Text;
                        return false;
                    }
                    None => {
                        self.state = State::Json { at: self.buf.len(), step: Step::Args(scan), first };
                        return false;
                    }
                }
            }
            Step::Close if t.starts_with('}') => Some((past(1), if self.format == Format::Mistral { Step::Next } else { Step::Done })),
            Step::Next if t.starts_with(',') => Some((past(1), Step::Header)),
            Step::Next if t.starts_with(']') => Some((past(1), Step::Done)),
            Step::Done if t.is_empty() => {
                if end {
                    self.buf.clear();
                }
                return false;
            }
            _ if more => return false,
            _ => None,
        };
        match next {
            Some((at, step)) => self.state = State::Json { at, step, first },
            // Not calls in the expected shape: parsed whole at the end if none has started,
            // else the rest is text (dropped if only whitespace).
            None if self.calls == first => self.state = State::Calls,
            None => {
                self.buf.drain(..at);
                self.state = State::Text;
                if end && self.buf.trim().is_empty() {
                    self.buf.clear();
                    return false;
                }
            }
        }
        true
    }
}

/// The length of the longest suffix of `s` that is a proper prefix of `pat`.
pub(super) fn partial_suffix(s: &str, pat: &str) -> usize {
    (1..pat.len().min(s.len() + 1))
        .rev()
        .find(|&k| s.is_char_boundary(s.len() - k) && pat.starts_with(&s[s.len() - k..]))
        .unwrap_or(0)
}

/// How much of a call's header there is.
enum Head {
    /// The function's name and the header's length.
    Whole(String, usize),
    /// The text so far could still become one.
    Partial,
    Invalid,
}

/// `ws { ws "name" ws : ws "NAME" ws , ws "arguments" ws : ws` at the start of `s` (with
/// `key` for "arguments").
fn header(s: &str, key: &str) -> Head {
    // Err(true): the text ends inside the header; Err(false): it is not one.
    fn go(s: &str, key: &str) -> Result<(String, usize), bool> {
        let b = s.as_bytes();
        let mut i = 0;
        let ws = |i: &mut usize| {
            while *i < b.len() && b[*i].is_ascii_whitespace() {
                *i += 1;
            }
        };
        let lit = |i: &mut usize, l: &str| -> Result<(), bool> {
            let r = &b[*i..];
            if r.starts_with(l.as_bytes()) {
                *i += l.len();
                Ok(())
            } else {
                Err(l.as_bytes().starts_with(r))
            }
        };
        ws(&mut i);
        lit(&mut i, "{")?;
        ws(&mut i);
        lit(&mut i, "\"name\"")?;
        ws(&mut i);
        lit(&mut i, ":")?;
        ws(&mut i);
        match b.get(i) {
            None => return Err(true),
            Some(b'"') => {}
            Some(_) => return Err(false),
        }
        // The JSON string: up to the first unescaped quote.
        let start = i;
        i += 1;
        while i < b.len() {
            match b[i] {
                b'\\' => i += 2,
                b'"' => break,
                _ => i += 1,
            }
        }
        if i >= b.len() {
            return Err(true);
        }
        i += 1;
        let name: String = serde_json::from_str(&s[start..i]).map_err(|_| false)?;
        ws(&mut i);
        lit(&mut i, ",")?;
        ws(&mut i);
        lit(&mut i, &format!("\"{key}\""))?;
        ws(&mut i);
        lit(&mut i, ":")?;
        Ok((name, i))
    }
    match go(s, key) {
        Ok((name, len)) => Head::Whole(name, len),
        Err(true) => Head::Partial,
        Err(false) => Head::Invalid,
    }
}

/// Hermes: the header and its whitespace, with the first byte of the arguments after it.
fn parse_header(s: &str) -> Option<(String, usize)> {
    match header(s, "arguments") {
        Head::Whole(name, mut len) => {
            len += s[len..].len() - s[len..].trim_start().len();
            (len < s.len()).then_some((name, len))
        }
        _ => None,
    }
}

/// The arguments' text from the rest of a call after its header: without the call object's
/// closing brace and the whitespace around it.
fn args_text(rest: &str) -> &str {
    let t = rest.trim_end();
    t.strip_suffix('}').unwrap_or(t).trim_end()
}

/// Llama 3's call object or Mistral's list of them, parsed whole: names and arguments (JSON
/// text).
fn whole_calls(format: Format, body: &str) -> Option<Vec<(String, String)>> {
    let v: Value = serde_json::from_str(body.trim()).ok()?;
    let one = |c: &Value| -> Option<(String, String)> {
        let name = c.get("name")?.as_str()?.to_string();
        let args = match c.get(format.args_key()).or_else(|| c.get("arguments")).or_else(|| c.get("parameters")) {
            Some(Value::String(s)) => s.clone(),
            Some(a) => a.to_string(),
            None => "{}".into(),
        };
        Some((name, args))
    };
    match (format, &v) {
        (Format::Mistral, Value::Array(list)) if !list.is_empty() => list.iter().map(one).collect(),
        (Format::Llama3, Value::Object(_)) => Some(vec![one(&v)?]),
        _ => None,
    }
}

/// A call's body parsed whole: `{"name": .., "arguments": ..}` in any key order.
fn whole_call(body: &str) -> Option<(String, String)> {
    let v: Value = serde_json::from_str(body.trim()).ok()?;
    let name = v.get("name")?.as_str()?.to_string();
    let args = match v.get("arguments") {
        Some(Value::String(s)) => s.clone(),
        Some(a) => a.to_string(),
        None => "{}".into(),
    };
    Some((name, args))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(pieces: &[Piece]) -> (String, Vec<(String, String)>) {
        let mut content = String::new();
        let mut calls: Vec<(String, String)> = Vec::new();
        for p in pieces {
            match p {
                Piece::Content(c) => content.push_str(c),
                Piece::CallStart { index, name } => {
                    assert_eq!(*index, calls.len());
                    calls.push((name.clone(), String::new()));
                }
                Piece::CallArgs { index, text } => calls[*index].1.push_str(text),
                Piece::Reasoning(r) => panic!("the tool parser gave reasoning: {r}"),
            }
        }
        (content, calls)
    }

    fn parse_in_pieces(text: &str, step: usize) -> (String, Vec<(String, String)>) {
        parse_format_in_pieces(Format::Hermes, text, step)
    }

    fn parse_format_in_pieces(format: Format, text: &str, step: usize) -> (String, Vec<(String, String)>) {
        let mut p = Parser::for_format(format);
        let mut all = Vec::new();
        let chars: Vec<char> = text.chars().collect();
        for c in chars.chunks(step) {
            all.extend(p.push(&c.iter().collect::<String>()));
        }
        all.extend(p.finish());
        collect(&all)
    }

    #[test]
    fn content_and_calls_split_the_same_in_any_chunking() {
        let text = "Let me look. <tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\",\"unit\":\"c\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"time\", \"arguments\": {}}\n</tool_call>";
        for step in [1, 2, 3, 5, 7, 13, 1000] {
            let (content, calls) = parse_in_pieces(text, step);
            assert_eq!(content, "Let me look. ", "step {step}");
            assert_eq!(
                calls,
                vec![("get_weather".into(), "{\"city\":\"Paris\",\"unit\":\"c\"}".into()), ("time".into(), "{}".into())],
                "step {step}"
            );
        }
    }

    #[test]
    fn a_call_cut_short_keeps_its_arguments_only() {
        for step in [1, 3, 1000] {
            let (content, calls) = parse_in_pieces("<tool_call>\n{\"name\":\"f\",\"arguments\":{\"a\":1}}\n</tool_c", step);
            assert_eq!(content, "");
            assert_eq!(calls, vec![("f".to_string(), "{\"a\":1}".to_string())], "step {step}");
        }
    }

    #[test]
    fn plain_text_and_lookalikes_stay_content() {
        for text in ["Hello <tool a>", "x <tool_cal", "<tool_call>not json</tool_call> done", "é<tool_call>"] {
            for step in [1, 4, 100] {
                let (content, calls) = parse_in_pieces(text, step);
                if text.ends_with("<tool_call>") {
                    assert_eq!(content, "é<tool_call>", "{text} {step}");
                } else {
                    assert_eq!(content, text, "{text} {step}");
                }
                assert!(calls.is_empty());
            }
        }
    }




    #[test]
    fn llama3_and_mistral_calls_parse_in_any_chunking() {
        let llama = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}";
        let mistral = "Checking. [TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"time\", \"arguments\": {}}]";
        for step in [1, 2, 5, 1000] {
            let (c, calls) = parse_format_in_pieces(Format::Llama3, llama, step);
            assert_eq!((c.as_str(), calls), ("", vec![("get_weather".to_string(), "{\"city\": \"Paris\"}".to_string())]), "step {step}");
            let (c, calls) = parse_format_in_pieces(Format::Mistral, mistral, step);
            assert_eq!(c, "Checking. ", "step {step}");
            assert_eq!(calls, vec![("get_weather".into(), "{\"city\": \"Paris\"}".into()), ("time".into(), "{}".into())], "step {step}");
            // Text stays text: a Llama 3 answer that is not a call, one that only starts like
            // one, a Mistral answer without the marker, a marker with no list after it.
            for (f, t) in [(Format::Llama3, "Paris is sunny."), (Format::Llama3, "{\"nam is not a call"), (Format::Llama3, "  {\"name\": oops"), (Format::Mistral, "No tools [TOOL_CALL"), (Format::Mistral, "[TOOL_CALLS] nope")] {
                let (c, calls) = parse_format_in_pieces(f, t, step);
                assert!(calls.is_empty(), "{t}");
                assert_eq!(c.trim(), t.trim(), "{f:?} {t} step {step}");
            }
        }
    }

    #[test]
    fn llama3_and_mistral_arguments_stream_as_they_come() {
        // Braces and quotes inside strings, nested values, a number last.
        let args = "{\"q\": \"a}b\\\"]\", \"n\": [1, {\"x\": [2]}], \"k\": -3.5e2}";
        let llama = format!(" {{\"name\": \"f\", \"parameters\": {args}}} ");
        let mistral = format!("[TOOL_CALLS] [{{\"name\": \"f\", \"arguments\": {args}}},{{\"name\":\"g\",\"arguments\":7}}]");
        for (format, text, want) in [(Format::Llama3, llama, vec![("f", args)]), (Format::Mistral, mistral, vec![("f", args), ("g", "7")])] {
            for step in [1, 2, 3, 1000] {
                let mut p = Parser::for_format(format);
                let mut all = Vec::new();
                let mut first_args_at = None;
                let chars: Vec<char> = text.chars().collect();
                for (k, c) in chars.chunks(step).enumerate() {
                    let pieces = p.push(&c.iter().collect::<String>());
                    if first_args_at.is_none() && pieces.iter().any(|x| matches!(x, Piece::CallArgs { .. })) {
                        first_args_at = Some(k * step);
                    }
                    all.extend(pieces);
                }
                all.extend(p.finish());
                let (content, calls) = collect(&all);
                assert_eq!(content, "", "{format:?} step {step}");
                let want: Vec<(String, String)> = want.iter().map(|(n, a)| (n.to_string(), a.to_string())).collect();
                assert_eq!(calls, want, "{format:?} step {step}");
                // The arguments start before the text ends, in many pieces at small steps.
                assert!(first_args_at.is_some_and(|k| k < text.len() / 2), "{format:?} step {step}");
                let pieces = all.iter().filter(|x| matches!(x, Piece::CallArgs { index: 0, .. })).count();
                assert!(step == 1000 || pieces >= args.len() / step / 2, "{format:?} step {step}: {pieces} pieces");
            }
        }
        // Cut short: the arguments there are, no content.
        for (format, text) in [(Format::Llama3, "{\"name\": \"f\", \"parameters\": {\"a\": [1, 2"), (Format::Mistral, "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {\"a\": [1, 2")] {
            for step in [1, 4, 1000] {
                let (c, calls) = parse_format_in_pieces(format, text, step);
                assert_eq!((c.as_str(), calls), ("", vec![("f".to_string(), "{\"a\": [1, 2".to_string())]), "{format:?} step {step}");
            }
        }
        // Another key order than the constraint's does not stream but still parses whole.
        let (c, calls) = parse_format_in_pieces(Format::Mistral, "[TOOL_CALLS] [{\"arguments\": {\"a\": 1}, \"name\": \"f\"}]", 2);
        assert_eq!((c.as_str(), calls), ("", vec![("f".to_string(), "{\"a\":1}".to_string())]));
    }

}
