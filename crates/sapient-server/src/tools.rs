//! Tool calls, the HTTP side: `tools` and `tool_choice` read from a request, and grammar
//! errors as 400s. The chat-format rules themselves (each model family's call syntax, the
//! prompt, the constraint, the streamed parser) are sapient-generate's [`chat`] module, which
//! library users share.

use crate::error::ApiError;
use sapient_generate::chat;
pub use sapient_generate::chat::{Choice, Format, Function, Piece};
use serde_json::{json, Value};

/// Read `tools` and `tool_choice`.
pub fn parse(tools: Option<&Value>, choice: Option<&Value>) -> Result<(Vec<Function>, Choice), ApiError> {
    let mut out = Vec::new();
    if let Some(t) = tools {
        let list = t.as_array().ok_or_else(|| ApiError::invalid_param("tools", "'tools' must be an array"))?;
        for (i, t) in list.iter().enumerate() {
            let param = format!("tools[{i}]");
            let kind = t.get("type").and_then(Value::as_str).unwrap_or("function");
            if kind != "function" {
                return Err(ApiError::invalid_param(param, format!("tool type '{kind}' is not supported (only 'function')")));
            }
            let f = t.get("function").ok_or_else(|| ApiError::invalid_param(&param, "a tool needs a 'function' object"))?;
            let name = f
                .get("name")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .ok_or_else(|| ApiError::invalid_param(&param, "a function needs a non-empty 'name'"))?;
            if out.iter().any(|x: &Function| x.name == name) {
                return Err(ApiError::invalid_param(param, format!("two tools are named '{name}'")));
            }
            let parameters = f.get("parameters").cloned().unwrap_or_else(|| json!({"type": "object", "properties": {}}));
            out.push(Function { name: name.to_string(), parameters, definition: json!({"type": "function", "function": f}) });
        }
    }
    let choice = match choice {
        None | Some(Value::Null) => {
            if out.is_empty() {
                Choice::None
            } else {
                Choice::Auto
            }
        }
        Some(Value::String(s)) => match s.as_str() {
            "none" => Choice::None,
            "auto" => Choice::Auto,
            "required" => Choice::Required,
            other => return Err(ApiError::invalid_param("tool_choice", format!("unknown tool_choice '{other}' (none, auto, required, or a named function)"))),
        },
        Some(v) => {
            let name = v
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| ApiError::invalid_param("tool_choice", "tool_choice must be 'none', 'auto', 'required' or {\"type\": \"function\", \"function\": {\"name\": ...}}"))?;
            if !out.iter().any(|f| f.name == name) {
                return Err(ApiError::invalid_param("tool_choice", format!("tool_choice names '{name}', which is not in 'tools'")));
            }
            Choice::Named(name.to_string())
        }
    };
    if choice != Choice::None && out.is_empty() {
        return Err(ApiError::invalid_param("tool_choice", "tool_choice needs 'tools'"));
    }
    Ok((out, choice))
}

/// [`chat::tools::grammar_for`] with its errors as 400s.
pub fn grammar_for(format: Format, tools: &[Function], choice: &Choice, parallel: bool, json: sapient_sample::JsonOptions) -> Result<Option<sapient_sample::Grammar>, ApiError> {
    chat::tools::grammar_for(format, tools, choice, parallel, json).map_err(|e| schema_error("tools", e))
}

/// A grammar error as a 400 (naming the unsupported keyword, if that is what it is).
pub fn schema_error(param: &str, e: sapient_sample::GrammarError) -> ApiError {
    use sapient_sample::GrammarError as G;
    let msg = match &e {
        G::UnsupportedSchema { path, keyword } => {
            format!("JSON Schema keyword '{keyword}' (at {path}) is not supported by this server's structured output, so the schema cannot be enforced")
        }
        other => format!("cannot enforce this schema: {other}"),
    };
    ApiError::invalid_param(param, msg).with_code(if matches!(e, G::UnsupportedSchema { .. }) { "unsupported_schema" } else { "invalid_schema" })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_tool_choice_and_unsupported_schema_are_400s() {
        let t = json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "array", "contains": {}}}}}}]);
        let (tools, choice) = parse(Some(&t), None).unwrap();
        assert_eq!(choice, Choice::Auto);
        assert_eq!(tools[0].definition, json!({"type": "function", "function": t[0]["function"]}));
        let e = grammar_for(Format::Hermes, &tools, &choice, true, Default::default()).unwrap_err();
        assert_eq!(e.status.as_u16(), 400);
        assert!(e.message.contains("contains"), "{}", e.message);
        let e = parse(Some(&t), Some(&json!({"type": "function", "function": {"name": "nope"}}))).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tool_choice"));
        let e = parse(Some(&json!([{"type": "function", "function": {"name": "f"}}, {"function": {"name": "f"}}])), None).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tools[1]"));
        assert_eq!(parse(None, None).unwrap().1, Choice::None);
        assert!(parse(None, Some(&json!("required"))).is_err(), "tool_choice needs tools");
    }
}
