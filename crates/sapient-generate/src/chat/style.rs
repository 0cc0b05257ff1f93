//! How a chat template takes tools ([`ToolStyle`]): in its own `tools` variable and its own
//! message fields, or (templates without tool support) described in the system prompt with
//! earlier calls and results written out as Hermes `<tool_call>` / `<tool_response>` text.

use super::tools::{self, Choice, Format, Function, CLOSE, OPEN};
use sapient_sample::{Expr, Grammar, GrammarError, JsonOptions};
use sapient_tokenizers::{Message, RenderOptions};
use serde_json::{json, Value};

/// A call from an earlier assistant turn, to render back into the conversation.
#[derive(Debug, Clone, PartialEq)]
pub struct PastCall {
    /// The call's id as the client gave it (`null` when it gave none).
    pub id: Value,
    pub name: String,
    pub arguments: Value,
}

/// How a chat template takes tools, and the call syntax its model answers in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolStyle {
    /// The template renders `tools`, assistant `tool_calls` and `tool` messages itself.
    pub native: bool,
    pub format: Format,
}

impl ToolStyle {
    /// The style of a chat template, from its source: native when it mentions both `tools`
    /// and `tool_call`, in the syntax [`Format::detect`] finds; otherwise Hermes in the
    /// system prompt.
    pub fn of_template(source: &str) -> Self {
        let native = source.contains("tools") && source.contains("tool_call");
        Self { native, format: if native { Format::detect(source) } else { Format::Hermes } }
    }

    /// Offer `fns` to the model: as the template's `tools`, or described in the system prompt
    /// (appended to a leading system message, or one put first).
    pub fn offer(self, fns: &[Function], msgs: &mut Vec<Message>, opts: &mut RenderOptions) {
        if fns.is_empty() {
            return;
        }
        if self.native {
            opts.tools = Some(Value::Array(fns.iter().map(|f| f.definition.clone()).collect()));
            return;
        }
        let prompt = tools::system_prompt(fns);
        match msgs.first_mut() {
            Some(m) if m.role == "system" => m.content = format!("{}\n\n{prompt}", m.content),
            _ => msgs.insert(0, Message::system(prompt)),
        }
    }

    /// The constraint on the answer: calls as `choice` asks ([`tools::grammar_for`]), or
    /// with [`Choice::None`] and tools offered, text that never starts a call.
    pub fn constraint(self, fns: &[Function], choice: &Choice, parallel: bool, json: JsonOptions) -> Result<Option<Grammar>, GrammarError> {
        match choice {
            // Harmony's channels open with special tokens, which no constraint allows.
            Choice::None if fns.is_empty() || self.format == Format::Harmony => Ok(None),
            Choice::None => Grammar::new(&Expr::text_without(self.format.marker())).map(Some),
            _ => tools::grammar_for(self.format, fns, choice, parallel, json),
        }
    }

    /// The generation must keep special tokens in its text for the parser: Mistral's call
    /// marker (with `tools` on) and harmony's channel markers are special tokens.
    pub fn keeps_special_tokens(self, tools: bool) -> bool {
        match self.format {
            Format::Mistral => tools,
            Format::Harmony => true,
            _ => false,
        }
    }

    /// An assistant turn that made `calls`: the template's `tool_calls` field, or the calls
    /// written after the text as `<tool_call>` blocks.
    pub fn assistant(self, text: String, calls: &[PastCall]) -> Message {
        if calls.is_empty() {
            return Message::assistant(text);
        }
        if self.native {
            let mut msg = Message::assistant(text);
            let list: Vec<Value> = calls
                .iter()
                .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
                .collect();
            msg.extra.insert("tool_calls".into(), Value::Array(list));
            return msg;
        }
        let mut s = text;
        for c in calls {
            if !s.is_empty() {
                s.push('\n');
            }
            s.push_str(&format!("{OPEN}\n{}\n{CLOSE}", json!({"name": c.name, "arguments": c.arguments})));
        }
        Message::assistant(s)
    }

    /// Add a tool's result: a `tool` message with its `tool_call_id`, or a
    /// `<tool_response>` block in a user turn (consecutive results share one, as Qwen2.5's
    /// template does).
    pub fn push_result(self, msgs: &mut Vec<Message>, call_id: Option<&str>, text: &str) {
        if self.native {
            let mut msg = Message::new("tool", text);
            if let Some(id) = call_id {
                msg.extra.insert("tool_call_id".into(), json!(id));
            }
            msgs.push(msg);
            return;
        }
        let block = format!("<tool_response>\n{text}\n</tool_response>");
        match msgs.last_mut() {
            Some(last) if last.role == "user" && last.content.ends_with("</tool_response>") => {
                last.content.push('\n');
                last.content.push_str(&block);
            }
            _ => msgs.push(Message::user(block)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sapient_sample::Constraint;

    #[test]
    fn plain_templates_get_tools_in_the_system_prompt_and_calls_as_text() {
        let style = ToolStyle::of_template("{% for m in messages %}{{ m.content }}{% endfor %}");
        assert_eq!(style, ToolStyle { native: false, format: Format::Hermes });
        let fns = [Function::new("f", json!({"type": "object"}))];
        let mut msgs = vec![Message::system("Be brief."), Message::user("Hi")];
        let mut opts = RenderOptions::default();
        style.offer(&fns, &mut msgs, &mut opts);
        assert!(opts.tools.is_none());
        assert!(msgs[0].content.starts_with("Be brief.\n\n# Tools") && msgs[0].content.contains("\"name\":\"f\""), "{}", msgs[0].content);
        let call = PastCall { id: json!("call_1"), name: "f".into(), arguments: json!({"a": 1}) };
        let m = style.assistant("Sure.".into(), &[call]);
        assert_eq!(m.content, "Sure.\n<tool_call>\n{\"name\":\"f\",\"arguments\":{\"a\":1}}\n</tool_call>");
        style.push_result(&mut msgs, Some("call_1"), "1");
        style.push_result(&mut msgs, Some("call_2"), "2");
        let last = msgs.last().map(|m| (m.role.as_str(), m.content.as_str()));
        assert_eq!(last, Some(("user", "<tool_response>\n1\n</tool_response>\n<tool_response>\n2\n</tool_response>")));
    }

    #[test]
    fn native_templates_take_the_fields() {
        let style = ToolStyle::of_template("{% if tools %}{{ tools }}{% endif %}[TOOL_CALLS] {{ m.tool_calls }}");
        assert_eq!(style, ToolStyle { native: true, format: Format::Mistral });
        assert!(style.keeps_special_tokens(true) && !style.keeps_special_tokens(false));
        let fns = [Function::new("f", json!({"type": "object"}))];
        let mut msgs = vec![Message::user("Hi")];
        let mut opts = RenderOptions::default();
        style.offer(&fns, &mut msgs, &mut opts);
        assert_eq!(msgs.len(), 1);
        assert_eq!(opts.tools, Some(json!([fns[0].definition])));
        let m = style.assistant(String::new(), &[PastCall { id: json!("abcdefghi"), name: "f".into(), arguments: json!({}) }]);
        assert_eq!(m.extra["tool_calls"][0]["function"]["name"], "f");
        style.push_result(&mut msgs, Some("abcdefghi"), "ok");
        assert_eq!(msgs[1].extra["tool_call_id"], "abcdefghi");
        // tool_choice none with tools offered: text, never a call.
        let g = style.constraint(&fns, &Choice::None, true, JsonOptions::default()).unwrap().unwrap();
        assert!(g.advance_bytes(&g.start(), b"Hello").unwrap().is_some());
        assert!(g.advance_bytes(&g.start(), b"Hello [TOOL_CALLS]").unwrap().is_none());
        assert!(style.constraint(&[], &Choice::None, true, JsonOptions::default()).unwrap().is_none());
    }
}
