//! gpt-oss's harmony format, the output's side: the answer is a run of messages, each a
//! header and a body,
//!
//! ```text
//! <|channel|>analysis<|message|>The user asks for the weather.<|end|>
//! <|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>
//! <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>
//! ```
//!
//! (the prompt ends with `<|start|>assistant`, so the first header follows at once). The
//! `analysis` channel is reasoning, `final` (and `commentary` to no one, a preamble) is the
//! answer's text, and a message to `functions.NAME` (the recipient in the header, before or
//! after the channel, as llama.cpp accepts) is a call whose body is its arguments. Messages
//! to other recipients (built-in tools) are dropped. [`Harmony`] splits the text as it
//! streams: bodies come out as they are written, with what may start a marker held back.

use super::parser::Scanner;
use super::Piece;
use sapient_sample::Expr;
use serde_json::Value;

/// How a call written by the constraint starts (the recipient in the channel header).
pub const CALL_OPEN: &str = "<|channel|>commentary to=functions.";
/// What follows the function's name in a constrained call.
const CALL_HEADER_END: &str = " <|constrain|>json<|message|>";
const MESSAGE: &str = "<|message|>";
/// What ends a message's body.
const ENDS: [&str; 4] = ["<|end|>", "<|call|>", "<|return|>", "<|start|>"];

/// A call to `name` with arguments following `schema`, after [`CALL_OPEN`].
pub(crate) fn call_expr(name: &str, schema: Value) -> Expr {
    Expr::seq([Expr::literal(format!("{name}{CALL_HEADER_END}")), Expr::JsonSchema(schema)])
}

/// Where a message's body goes.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Body {
    Reasoning,
    Content,
    Call(usize),
    Dropped,
}

#[derive(Debug)]
enum State {
    /// Before a message's `<|message|>`: its header.
    Header,
    Body(Body),
}

/// Splits harmony output into reasoning, content and calls as it streams.
#[derive(Debug)]
pub struct Harmony {
    buf: String,
    state: State,
    calls: usize,
    /// Messages to functions are calls (otherwise dropped).
    tools: bool,
}

impl Harmony {
    pub fn new(tools: bool) -> Self {
        Self { buf: String::new(), state: State::Header, calls: 0, tools }
    }

    /// More of the output: the pieces it completes.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.feed(text)
    }

    /// The end of the output: everything held back.
    pub fn finish(&mut self) -> Vec<Piece> {
        self.flush()
    }
}

impl Scanner for Harmony {
    fn buffer(&mut self) -> &mut String {
        &mut self.buf
    }

    fn run(&mut self, out: &mut Vec<Piece>, end: bool) {
        loop {
            match self.state {
                State::Header => {
                    if let Some(i) = self.buf.find(MESSAGE) {
                        let header = self.buf[..i].to_string();
                        self.buf.drain(..i + MESSAGE.len());
                        let body = self.open(&header, out);
                        self.state = State::Body(body);
                        continue;
                    }
                    let t = self.buf.trim_start();
                    let header = ["<|", "to="].iter().any(|m| t.starts_with(m) || m.starts_with(t));
                    if header {
                        // Wait for the rest (a header cut short at the end gives nothing).
                        if end {
                            self.buf.clear();
                        }
                        return;
                    }
                    // Text with no header: the answer's.
                    self.state = State::Body(Body::Content);
                }
                State::Body(body) => {
                    let found = ENDS.iter().filter_map(|m| self.buf.find(m).map(|i| (i, m.len()))).min();
                    let (give, skip) = match found {
                        // `<|start|>` stays: it opens the next header.
                        Some((i, len)) => (i, if self.buf[i..].starts_with("<|start|>") { i } else { i + len }),
                        None if end => (self.buf.len(), self.buf.len()),
                        None => {
                            let keep = ENDS.iter().map(|m| super::parser::partial_suffix(&self.buf, m)).max().unwrap_or(0);
                            (self.buf.len() - keep, self.buf.len() - keep)
                        }
                    };
                    let text: String = self.buf[..give].to_string();
                    self.buf.drain(..skip);
                    if !text.is_empty() {
                        match body {
                            Body::Reasoning => out.push(Piece::Reasoning(text)),
                            Body::Content => out.push(Piece::Content(text)),
                            Body::Call(index) => out.push(Piece::CallArgs { index, text }),
                            Body::Dropped => {}
                        }
                    }
                    if found.is_none() {
                        return;
                    }
                    self.state = State::Header;
                }
            }
        }
    }
}

impl Harmony {
    /// A message's header read: where its body goes (a call starts here).
    fn open(&mut self, header: &str, out: &mut Vec<Piece>) -> Body {
        let word = |after: &str| -> Option<String> {
            let i = header.rfind(after)? + after.len();
            let w: String = header[i..].chars().take_while(|c| !c.is_whitespace() && *c != '<').collect();
            Some(w)
        };
        match (word("to="), word("<|channel|>").as_deref()) {
            (Some(to), _) if to.starts_with("functions.") => {
                if !self.tools {
                    return Body::Dropped;
                }
                let index = self.calls;
                self.calls += 1;
                out.push(Piece::CallStart { index, name: to["functions.".len()..].to_string() });
                Body::Call(index)
            }
            (Some(to), _) if to != "assistant" => Body::Dropped,
            (_, Some("analysis")) => Body::Reasoning,
            _ => Body::Content,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::Reply;

    fn split(text: &str, step: usize, tools: bool) -> Reply {
        let mut h = Harmony::new(tools);
        let mut reply = Reply::default();
        let chars: Vec<char> = text.chars().collect();
        for c in chars.chunks(step) {
            for p in h.push(&c.iter().collect::<String>()) {
                reply.push(&p);
            }
        }
        for p in h.finish() {
            reply.push(&p);
        }
        reply
    }

    #[test]
    fn channels_split_in_any_chunking() {
        let text = "<|channel|>analysis<|message|>User greets. Answer <b>.<|end|><|start|>assistant<|channel|>final<|message|>Hello <|there|>!<|return|>";
        for step in [1, 2, 3, 7, 1000] {
            let r = split(text, step, true);
            assert_eq!((r.reasoning.as_str(), r.content.as_str(), r.calls.len()), ("User greets. Answer <b>.", "Hello <|there|>!", 0), "step {step}");
        }
    }

    #[test]
    fn llama_cpp_cases() {
        // The gpt-oss cases of llama.cpp's tests/test-chat.cpp (its PEG parser's), with
        // `special_function({"arg1": 1})` and `edit(..)` as the tools.
        let call = |name: &str, args: &str| vec![crate::chat::ToolCall { name: name.into(), arguments: args.into() }];
        let hello = "Hello, world!\nWhat's up?";
        let cases: [(&str, &str, &str, Vec<crate::chat::ToolCall>); 9] = [
            ("<|channel|>final<|message|>Hello, world!\nWhat's up?", "", hello, vec![]),
            ("<|channel|>commentary<|message|>Hello, world!\nWhat's up?", "", hello, vec![]),
            ("<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant<|channel|>final<|message|>Hello, world!\nWhat's up?", "I'm\nthinking", hello, vec![]),
            ("<|channel|>analysis<|message|>I'm\nthinking", "I'm\nthinking", "", vec![]),
            (" to=functions.special_function<|channel|>analysis<|message|>{\"arg1\": 1}", "", "", call("special_function", "{\"arg1\": 1}")),
            ("<|channel|>analysis to=functions.special_function<|message|>{\"arg1\": 1}", "", "", call("special_function", "{\"arg1\": 1}")),
            (" to=functions.special_function<|channel|>analysis <|constrain|>json<|message|>{\"arg1\": 1}", "", "", call("special_function", "{\"arg1\": 1}")),
            (
                "<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant to=functions.special_function<|channel|>analysis<|message|>{\"arg1\": 1}",
                "I'm\nthinking",
                "",
                call("special_function", "{\"arg1\": 1}"),
            ),
            (
                "<|channel|>analysis<|message|>Thinking about edit...<|end|><|start|>assistant<|channel|>commentary to=functions.edit <|constrain|>json<|message|>{\"oldString\": \"if (part < railCount - 1) {\", \"newString\": \"if (part < 4) {\", \"replaceAll\": false}<|call|>",
                "Thinking about edit...",
                "",
                call("edit", "{\"oldString\": \"if (part < railCount - 1) {\", \"newString\": \"if (part < 4) {\", \"replaceAll\": false}"),
            ),
        ];
        for (text, reasoning, content, calls) in cases {
            for step in [1, 3, 1000] {
                let r = split(text, step, true);
                assert_eq!((r.reasoning.as_str(), r.content.as_str(), &r.calls), (reasoning, content, &calls), "{text:?} step {step}");
            }
        }
        // Without tools, calls and messages to built-in tools are dropped; text with no header
        // is the answer.
        let r = split("<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}<|call|>", 2, false);
        assert_eq!(r, Reply::default());
        let r = split("<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>commentary to=browser.search<|message|>{}<|call|>", 2, true);
        assert_eq!((r.reasoning.as_str(), r.calls.len()), ("x", 0));
        assert_eq!(split("Plain <text>.", 1, true).content, "Plain <text>.");
    }

    #[test]
    fn the_template_takes_tools_calls_and_results() {
        use crate::chat::{tools, Choice, Format, Function, PastCall, ToolStyle};
        use sapient_sample::Constraint;
        use serde_json::json;
        // openai/gpt-oss-120b's template, as llama.cpp's models/templates carries it.
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/tokenizers/templates/gpt-oss.jinja");
        let source = std::fs::read_to_string(path).unwrap();
        let style = ToolStyle::of_template(&source);
        assert_eq!(style, ToolStyle { native: true, format: Format::Harmony });
        let f = Function::new("get_weather", json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}));
        let mut f = f;
        f.definition["function"]["description"] = json!("Current weather");
        let mut msgs = vec![sapient_tokenizers::Message::system("Be brief."), sapient_tokenizers::Message::user("Weather in Paris?")];
        msgs.push(style.assistant(String::new(), &[PastCall { id: json!("call_1"), name: "get_weather".into(), arguments: json!({"city": "Paris"}) }]));
        style.push_result(&mut msgs, Some("call_1"), "{\"c\": 21}");
        let mut opts = sapient_tokenizers::RenderOptions { date: Some(std::time::UNIX_EPOCH), ..Default::default() };
        style.offer(std::slice::from_ref(&f), &mut msgs, &mut opts);
        let t = sapient_tokenizers::ChatTemplate::new(&source, None, None).unwrap();
        let text = t.render(&msgs, &opts).unwrap();
        for want in [
            "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: 1970-01-01\n\nReasoning: medium\n\n",
            "Calls to these tools must go to the commentary channel: 'functions'.<|end|>",
            "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n# Tools\n\n## functions\n\nnamespace functions {\n\n// Current weather\ntype get_weather = (_: {\ncity: string,\n}) => any;\n\n} // namespace functions<|end|>",
            "<|start|>user<|message|>Weather in Paris?<|end|>",
            "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Paris\"}<|call|>",
            "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>\"{\\\"c\\\": 21}\"<|end|>",
        ] {
            assert!(text.contains(want), "{want:?} not in\n{text}");
        }
        assert!(text.ends_with("<|end|><|start|>assistant"), "{text}");
        // A required call is constrained from its channel header to its arguments.
        let g = tools::grammar_for(Format::Harmony, &[f], &Choice::Required, true, Default::default()).unwrap().unwrap();
        let ok = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}";
        assert!(g.advance_bytes(&g.start(), ok.as_bytes()).unwrap().is_some_and(|st| g.is_accepting(&st)));
        assert!(g.advance_bytes(&g.start(), b"<|channel|>commentary to=functions.other").unwrap().is_none());
        assert!(g.advance_bytes(&g.start(), b"<|channel|>final").unwrap().is_none());
        // It parses back to the call.
        assert_eq!(split(ok, 2, true).calls[0].arguments, "{\"city\":\"Paris\"}");
    }
}
