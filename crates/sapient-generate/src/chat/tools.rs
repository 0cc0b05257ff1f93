//! Tool calls, the formats' side: the prompt that tells a model about its tools
//! ([`system_prompt`]), the constraint that keeps its calls valid ([`grammar_for`]), and the
//! call syntax of each model family ([`Format`], picked from the chat template): Qwen2.5 /
//! Hermes `<tool_call>` blocks, Llama 3.1 / 3.2 JSON calls, Mistral's `[TOOL_CALLS]` lists
//! and gpt-oss's harmony messages. [`OutputParser`](super::OutputParser) turns the output
//! back into calls.

use sapient_sample::{Expr, Grammar, GrammarError, JsonOptions};
use serde_json::{json, Value};

/// Markers of the Qwen2.5 / Hermes tool-call format: `<tool_call>\n{"name": .., "arguments": ..}\n</tool_call>`.
pub const OPEN: &str = "<tool_call>";
pub const CLOSE: &str = "</tool_call>";

/// Mistral's marker before a list of calls.
pub const MISTRAL_OPEN: &str = "[TOOL_CALLS]";
/// How a Llama 3 JSON call starts (the whole answer is the call).
pub(crate) const LLAMA3_OPEN: &str = "{\"name\"";

/// A model family's tool-call syntax.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Qwen2.5, Hermes and templates without their own: `<tool_call>\n{"name": .., "arguments": ..}\n</tool_call>`,
    /// after any text, several in a row.
    Hermes,
    /// Llama 3.1 / 3.2 JSON tool calling: the whole answer is one `{"name": .., "parameters": ..}`.
    Llama3,
    /// Mistral: `[TOOL_CALLS] [{"name": .., "arguments": ..}, ..]` after any text; call ids of
    /// nine letters and digits, as its template requires.
    Mistral,
    /// gpt-oss's harmony format: the answer is messages on channels (`analysis`: reasoning,
    /// `final`: the answer), and a call is a message to a function,
    /// `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{..}<|call|>`
    /// (see [`harmony`](super::harmony)). Its markers are special tokens, which the output
    /// keeps.
    Harmony,
}

impl Format {
    /// The syntax a chat template renders tool calls in.
    pub fn detect(template: &str) -> Self {
        if template.contains("<|channel|>") && template.contains("<|start|>assistant") {
            Format::Harmony
        } else if template.contains(MISTRAL_OPEN) {
            Format::Mistral
        } else if template.contains("<|python_tag|>") || (template.contains("ipython") && template.contains("\"parameters\"")) {
            Format::Llama3
        } else {
            Format::Hermes
        }
    }

    /// What starts a call in this syntax (text without it is plain text).
    pub fn marker(self) -> &'static str {
        match self {
            Format::Hermes => OPEN,
            Format::Llama3 => LLAMA3_OPEN,
            Format::Mistral => MISTRAL_OPEN,
            Format::Harmony => super::harmony::CALL_OPEN,
        }
    }

    /// The key a call's arguments go under.
    pub(crate) fn args_key(self) -> &'static str {
        if self == Format::Llama3 {
            "parameters"
        } else {
            "arguments"
        }
    }

    /// A call's id in this syntax from a unique one (`call_…`): the same, or for Mistral
    /// nine letters and digits hashed from it.
    pub fn call_id(self, unique: &str) -> String {
        let id = unique.to_string();
        if self == Format::Mistral {
            let h = id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
            const ABC: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
            (0..9).map(|i| ABC[((h >> (i * 6)) % ABC.len() as u64) as usize] as char).collect()
        } else {
            id
        }
    }
}

/// A function the model may call.
#[derive(Debug, Clone)]
pub struct Function {
    pub name: String,
    pub parameters: Value,
    /// The client's whole definition (`{"type": "function", "function": {...}}`), for templates.
    pub definition: Value,
}

impl Function {
    /// A function by its name and JSON Schema of its arguments (OpenAI's definition shape).
    pub fn new(name: impl Into<String>, parameters: Value) -> Self {
        let name = name.into();
        let definition = json!({"type": "function", "function": {"name": name, "parameters": parameters}});
        Self { name, parameters, definition }
    }
}

/// Which calls the model may make (OpenAI's `tool_choice`).
#[derive(Debug, Clone, PartialEq)]
pub enum Choice {
    None,
    Auto,
    Required,
    Named(String),
}

/// The constraint for a tool choice (`None` for [`Choice::None`]): free text or calls (auto),
/// or calls only (required, named); each call's arguments follow its function's schema.
pub fn grammar(tools: &[Function], choice: &Choice, parallel: bool, json: JsonOptions) -> Result<Option<Grammar>, GrammarError> {
    grammar_for(Format::Hermes, tools, choice, parallel, json)
}

/// [`grammar`] in a model family's syntax. Llama 3 answers with one call (its templates
/// take one per turn); Mistral's list holds one call unless `parallel`.
pub fn grammar_for(format: Format, tools: &[Function], choice: &Choice, parallel: bool, json: JsonOptions) -> Result<Option<Grammar>, GrammarError> {
    let offered: Vec<&Function> = match choice {
        Choice::None => return Ok(None),
        Choice::Named(n) => tools.iter().filter(|f| &f.name == n).collect(),
        Choice::Auto | Choice::Required => tools.iter().collect(),
    };
    let calls: Vec<Value> = offered
        .iter()
        .map(|t| {
            // A function with `strict: true` (OpenAI's strict mode) gets no argument beyond
            // those its schema lists.
            let strict = t.definition.pointer("/function/strict").or_else(|| t.definition.get("strict")) == Some(&Value::Bool(true));
            let params = if strict { sapient_sample::strict_schema(&t.parameters) } else { t.parameters.clone() };
            json!({
                "type": "object",
                "properties": {"name": {"const": t.name}, format.args_key(): params},
                "required": ["name", format.args_key()],
                "additionalProperties": false
            })
        })
        .collect();
    if format == Format::Harmony {
        return match choice {
            // Its channels open with special tokens, which a constraint cannot let the model
            // choose: only a call the constraint writes from its start is constrained.
            Choice::Auto | Choice::None => Ok(None),
            _ => {
                let alts = offered.iter().zip(&calls).map(|(t, c)| super::harmony::call_expr(&t.name, c["properties"]["arguments"].clone()));
                Grammar::with_options(&Expr::seq([Expr::literal(super::harmony::CALL_OPEN), Expr::choice(alts)]), json).map(Some)
            }
        };
    }
    let any = json!({"anyOf": calls});
    let e = match format {
        Format::Hermes | Format::Harmony => hermes_calls(Expr::JsonSchema(any), choice, parallel),
        Format::Llama3 => {
            let call = Expr::JsonSchema(any);
            match choice {
                Choice::Auto => Expr::choice([Expr::text_without(LLAMA3_OPEN), call]),
                _ => call,
            }
        }
        Format::Mistral => {
            let mut list = json!({"type": "array", "items": any, "minItems": 1});
            if !parallel {
                list["maxItems"] = json!(1);
            }
            let list = Expr::seq([Expr::literal(" "), Expr::JsonSchema(list)]);
            match choice {
                // Text, or text up to the marker and the list after it.
                Choice::Auto => Expr::choice([Expr::text_without(MISTRAL_OPEN), Expr::seq([Expr::stop_at(MISTRAL_OPEN), list])]),
                _ => Expr::seq([Expr::literal(MISTRAL_OPEN), list]),
            }
        }
    };
    Grammar::with_options(&e, json).map(Some)
}

fn hermes_calls(call: Expr, choice: &Choice, parallel: bool) -> Expr {
    // "\n" CALL "\n" CLOSE, then (parallel) more of "\n" OPEN that.
    let one = Expr::seq([Expr::literal("\n"), call, Expr::literal("\n"), Expr::literal(CLOSE)]);
    let calls = if parallel {
        Expr::seq([one.clone(), Expr::seq([Expr::literal("\n"), Expr::literal(OPEN), one]).repeat(0, None)])
    } else {
        one
    };
    match choice {
        Choice::Auto => Expr::choice([Expr::text_without(OPEN), Expr::seq([Expr::stop_at(OPEN), calls])]),
        _ => Expr::seq([Expr::literal(OPEN), calls]),
    }
}

/// The system-prompt text that describes the tools (Qwen2.5's wording), for chat templates
/// that do not render `tools` themselves.
pub fn system_prompt(tools: &[Function]) -> String {
    let mut s = String::from(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>",
    );
    for t in tools {
        s.push('\n');
        s.push_str(&t.definition.to_string());
    }
    s.push_str("\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use sapient_sample::Constraint;

    fn f_needing_a() -> Vec<Function> {
        vec![Function::new("f", json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}))]
    }

    #[test]
    fn grammar_forces_a_call_when_required() {
        let g = grammar(&f_needing_a(), &Choice::Required, false, Default::default()).unwrap().unwrap();
        let ok = "<tool_call>\n{\"name\":\"f\",\"arguments\":{\"a\":3}}\n</tool_call>";
        let st = g.advance_bytes(&g.start(), ok.as_bytes()).unwrap().expect("a valid call");
        assert!(g.is_accepting(&st));
        assert!(g.advance_bytes(&g.start(), b"Hello").unwrap().is_none(), "text is not allowed when a call is required");
        assert!(g.advance_bytes(&g.start(), b"<tool_call>\n{\"name\":\"g\"").unwrap().is_none(), "unknown function");
    }

    #[test]
    fn formats_are_told_apart_by_their_templates() {
        let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/tokenizers/templates");
        for (file, want) in [
            ("llama3.1.jinja", Format::Llama3),
            ("llama3.2.jinja", Format::Llama3),
            ("mistral-v3.jinja", Format::Mistral),
            ("mistral-nemo.jinja", Format::Mistral),
            ("qwen2.5.jinja", Format::Hermes),
            ("hermes3-tool-use.jinja", Format::Hermes),
        ] {
            let src = std::fs::read_to_string(data.join(file)).unwrap();
            assert_eq!(Format::detect(&src), want, "{file}");
        }
        let id = Format::Mistral.call_id("call_1");
        assert!(id.len() == 9 && id.bytes().all(|b| b.is_ascii_alphanumeric()), "{id}");
        assert_ne!(id, Format::Mistral.call_id("call_2"));
        assert_eq!(Format::Hermes.call_id("call_1"), "call_1");
    }

    #[test]
    fn llama3_and_mistral_grammars() {
        let tools = f_needing_a();
        let accepts = |g: &Grammar, s: &str| g.advance_bytes(&g.start(), s.as_bytes()).unwrap().is_some_and(|st| g.is_accepting(&st));
        let g = grammar_for(Format::Llama3, &tools, &Choice::Required, true, Default::default()).unwrap().unwrap();
        assert!(accepts(&g, "{\"name\":\"f\",\"parameters\":{\"a\":3}}"));
        assert!(!accepts(&g, "{\"name\":\"f\",\"arguments\":{\"a\":3}}"), "Llama 3 calls take parameters");
        assert!(!accepts(&g, "Sure."));
        let g = grammar_for(Format::Llama3, &tools, &Choice::Auto, true, Default::default()).unwrap().unwrap();
        assert!(accepts(&g, "Sure.") && accepts(&g, "{\"name\":\"f\",\"parameters\":{\"a\":3}}"));
        assert!(g.advance_bytes(&g.start(), b"{\"name\":\"g\"").unwrap().is_none(), "unknown function");
        let g = grammar_for(Format::Mistral, &tools, &Choice::Auto, false, Default::default()).unwrap().unwrap();
        assert!(accepts(&g, "Sure.") && accepts(&g, "Let me see.[TOOL_CALLS] [{\"name\":\"f\",\"arguments\":{\"a\":3}}]"));
        assert!(!accepts(&g, "[TOOL_CALLS] [{\"name\":\"f\",\"arguments\":{\"a\":3}},{\"name\":\"f\",\"arguments\":{\"a\":4}}]"), "one call unless parallel");
        let g = grammar_for(Format::Mistral, &tools, &Choice::Required, true, Default::default()).unwrap().unwrap();
        assert!(accepts(&g, "[TOOL_CALLS] [{\"name\":\"f\",\"arguments\":{\"a\":3}},{\"name\":\"f\",\"arguments\":{\"a\":4}}]"));
        assert!(!accepts(&g, "Sure."));
    }
}
