//! Chat templates with hostile messages. The first byte picks the mode: even, one of the
//! real templates below renders messages cut from the input (roles and contents split on NUL
//! bytes); odd, the rest of the input is itself the template, rendering a fixed conversation.
//! Every rendering is bounded by `TemplateLimits` (fuel and output size).
#![no_main]
use libfuzzer_sys::fuzz_target;
use sapient_tokenizers::{ChatTemplate, Message, RenderOptions};

const CHATML: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
const LLAMA3: &str = include_str!("../../tests/data/tokenizers/templates/llama3.1.jinja");
const HERMES: &str = include_str!("../../tests/data/tokenizers/templates/hermes3-tool-use.jinja");

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let text = String::from_utf8_lossy(rest);
    let mut opts = RenderOptions::default();
    if mode % 2 == 0 {
        let src = [CHATML, LLAMA3, HERMES][(mode as usize / 2) % 3];
        let Ok(t) = ChatTemplate::new(src, Some("<s>"), Some("</s>")) else { return };
        let parts: Vec<&str> = text.split('\0').collect();
        let msgs: Vec<Message> = parts
            .chunks(2)
            .map(|c| Message::new(c[0], c.get(1).copied().unwrap_or("")))
            .collect();
        if mode & 4 != 0 {
            opts.tools = serde_json::from_str(parts.last().copied().unwrap_or("")).ok();
        }
        let _ = t.render(&msgs, &opts);
    } else if let Ok(t) = ChatTemplate::new(&text, Some("<s>"), Some("</s>")) {
        let msgs = [Message::system("sys"), Message::user("hi"), Message::assistant("hello"), Message::user("x")];
        let _ = t.render(&msgs, &opts);
    }
});
