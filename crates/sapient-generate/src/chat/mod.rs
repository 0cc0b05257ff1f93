//! Chat-format rules: how tools are put to a model and what its output means beyond its
//! text, the same for a library user and for `sapient serve`.
//!
//! - [`think`]: a reasoning model's `<think>` block.
//! - [`tools`]: the call syntax of each model family ([`Format`]), the system prompt that
//!   describes tools, and the constraint that keeps calls valid.
//! - [`ToolStyle`]: how a chat template takes tools (its own `tools` variable, or the system
//!   prompt) and earlier calls and results.
//! - [`Parser`]: the calls out of the text as it streams; [`OutputParser`]: reasoning and
//!   calls at once, as the server gives them out; [`Reply`]: the parts put together.
//!
//! [`Pipeline::chat_tools_with`](crate::Pipeline::chat_tools_with) does it all for one
//! conversation; [`parse_tool_calls`] parses a whole answer:
//!
//! ```
//! use sapient_generate::chat::{parse_tool_calls, tools::Format};
//! let out = parse_tool_calls(Format::Hermes, "Checking.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>");
//! assert_eq!(out.content, "Checking.");
//! assert_eq!(out.calls[0].name, "get_weather");
//! assert_eq!(out.calls[0].arguments, "{\"city\": \"Paris\"}");
//! ```

pub mod harmony;
mod parser;
mod style;
pub mod think;
pub mod tools;

pub use parser::{Parser, Piece};
pub use style::{PastCall, ToolStyle};
pub use think::split_reasoning;
pub use tools::{Choice, Format, Function};

/// A call the model made: its function's name and its arguments (JSON text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    pub name: String,
    pub arguments: String,
}

/// A chat answer split into its parts: reasoning, the text outside calls, and the calls.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reply {
    /// The reasoning block's text (a server's `reasoning_content`).
    pub reasoning: String,
    /// The text outside reasoning and calls.
    pub content: String,
    pub calls: Vec<ToolCall>,
}

impl Reply {
    /// Add a piece of the streamed parse.
    pub fn push(&mut self, piece: &Piece) {
        match piece {
            Piece::Content(c) => self.content.push_str(c),
            Piece::Reasoning(r) => self.reasoning.push_str(r),
            Piece::CallStart { name, .. } => self.calls.push(ToolCall { name: name.clone(), arguments: String::new() }),
            Piece::CallArgs { index, text } => {
                if let Some(c) = self.calls.get_mut(*index) {
                    c.arguments.push_str(text);
                }
            }
        }
    }
}

/// The functions a chat offers and which calls the model may make.
#[derive(Debug, Clone)]
pub struct ChatTools {
    pub functions: Vec<Function>,
    pub choice: Choice,
    /// Several calls in one answer (OpenAI's `parallel_tool_calls`).
    pub parallel: bool,
}

impl ChatTools {
    /// `functions` offered with [`Choice::Auto`] (text or calls), several calls allowed.
    pub fn auto(functions: Vec<Function>) -> Self {
        Self { functions, choice: Choice::Auto, parallel: true }
    }
}

/// The tool calls in a whole answer (after any reasoning block), in `format`'s syntax.
pub fn parse_tool_calls(format: Format, answer: &str) -> Reply {
    let mut p = OutputParser::new(None, format, true);
    let mut pieces = p.push(answer);
    pieces.extend(p.finish());
    let mut out = Reply::default();
    for piece in &pieces {
        out.push(piece);
    }
    out
}

/// Splits a chat answer as it streams, the way `sapient serve` gives it out: the reasoning
/// block into [`Piece::Reasoning`] and the rest through the tool-call parser, or in
/// [`Format::Harmony`], the channels ([`harmony::Harmony`]).
#[derive(Debug)]
pub struct OutputParser {
    inner: Inner,
}

#[derive(Debug)]
enum Inner {
    Split { think: Option<think::Splitter>, tools: Option<Parser> },
    Harmony(harmony::Harmony),
}

impl OutputParser {
    /// `reasoning`: split a `<think>` block, `Some(true)` when the prompt opened it
    /// ([`think::prompt_opens`]); `format`: the model's syntax; `tools`: parse calls.
    pub fn new(reasoning: Option<bool>, format: Format, tools: bool) -> Self {
        let inner = match format {
            Format::Harmony => Inner::Harmony(harmony::Harmony::new(tools)),
            _ => Inner::Split { think: reasoning.map(think::Splitter::new), tools: tools.then(|| Parser::for_format(format)) },
        };
        Self { inner }
    }

    /// More of the output: the pieces it completes.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        match &mut self.inner {
            Inner::Harmony(h) => h.push(text),
            Inner::Split { think, tools } => {
                let parts = match think {
                    Some(s) => s.push(text),
                    None => vec![think::Part::Content(text.to_string())],
                };
                after_reasoning(tools, parts, false)
            }
        }
    }

    /// The end of the output: everything held back.
    pub fn finish(&mut self) -> Vec<Piece> {
        match &mut self.inner {
            Inner::Harmony(h) => h.finish(),
            Inner::Split { think, tools } => {
                let parts = think.as_mut().map(|s| s.finish()).unwrap_or_default();
                after_reasoning(tools, parts, true)
            }
        }
    }
}

/// The answer's text through the tool-call parser; reasoning as it is.
fn after_reasoning(tools: &mut Option<Parser>, parts: Vec<think::Part>, end: bool) -> Vec<Piece> {
    let mut out = Vec::new();
    for p in parts {
        match p {
            think::Part::Reasoning(r) => out.push(Piece::Reasoning(r)),
            think::Part::Content(c) => match tools {
                Some(p) => out.extend(p.push(&c)),
                None => out.push(Piece::Content(c)),
            },
        }
    }
    if end {
        out.extend(tools.as_mut().map(|p| p.finish()).unwrap_or_default());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasoning_then_calls_in_any_chunking() {
        let text = "<think>\nThe user wants weather.\n</think>\n\nSure.<tool_call>\n{\"name\": \"w\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        for n in [1, 2, 5, 1000] {
            let mut p = OutputParser::new(Some(false), Format::Hermes, true);
            let mut pieces = Vec::new();
            let chars: Vec<char> = text.chars().collect();
            for c in chars.chunks(n) {
                pieces.extend(p.push(&c.iter().collect::<String>()));
            }
            pieces.extend(p.finish());
            let reasoning: String = pieces.iter().filter_map(|x| if let Piece::Reasoning(r) = x { Some(r.as_str()) } else { None }).collect();
            let content: String = pieces.iter().filter_map(|x| if let Piece::Content(r) = x { Some(r.as_str()) } else { None }).collect();
            let args: String = pieces.iter().filter_map(|x| if let Piece::CallArgs { text, .. } = x { Some(text.as_str()) } else { None }).collect();
            assert_eq!((reasoning.as_str(), content.as_str(), args.as_str()), ("The user wants weather.", "Sure.", "{\"city\": \"Paris\"}"), "pieces of {n}");
            assert!(pieces.contains(&Piece::CallStart { index: 0, name: "w".into() }), "pieces of {n}");
        }
        // Without reasoning or tools asked for, the text passes as content.
        let mut p = OutputParser::new(None, Format::Hermes, false);
        assert_eq!(p.push(text), vec![Piece::Content(text.into())]);
        assert!(p.finish().is_empty());
    }

    #[test]
    fn whole_answers_in_each_syntax() {
        let want = |content: &str, calls: &[(&str, &str)]| Reply {
            reasoning: String::new(),
            content: content.into(),
            calls: calls.iter().map(|(n, a)| ToolCall { name: n.to_string(), arguments: a.to_string() }).collect(),
        };
        assert_eq!(parse_tool_calls(Format::Llama3, "{\"name\": \"f\", \"parameters\": {\"a\": 1}}"), want("", &[("f", "{\"a\": 1}")]));
        assert_eq!(
            parse_tool_calls(Format::Mistral, "Two. [TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {}}, {\"name\": \"g\", \"arguments\": {\"b\": [2]}}]"),
            want("Two. ", &[("f", "{}"), ("g", "{\"b\": [2]}")])
        );
        assert_eq!(parse_tool_calls(Format::Hermes, "No calls here."), want("No calls here.", &[]));
    }
}
