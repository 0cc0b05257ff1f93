//! Chat templates that loop, grow or recurse, and hostile messages: each rendering ends within
//! a second, over a limit with an error that names it (`TemplateLimits`).

use sapient_tokenizers::{ChatTemplate, Message, RenderOptions, TemplateLimits};
use std::time::{Duration, Instant};

fn render(src: &str, messages: &[Message], limits: Option<TemplateLimits>) -> (Result<String, String>, Duration) {
    let mut t = ChatTemplate::new(src, Some("<s>"), Some("</s>")).unwrap();
    if let Some(l) = limits {
        t.set_limits(l);
    }
    let start = Instant::now();
    let r = t.render(messages, &RenderOptions::default()).map_err(|e| e.to_string());
    (r, start.elapsed())
}

const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}";

#[test]
fn a_template_that_loops_runs_out_of_fuel() {
    let src = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
    let (r, t) = render(src, &[], None);
    let e = r.unwrap_err();
    assert!(e.contains("ran more than 5000000 instructions (TemplateLimits::fuel)"), "{e}");
    assert!(t < Duration::from_secs(1), "{t:?}");
}

#[test]
fn a_rendering_over_the_output_limit_stops() {
    let src = "{% for i in range(100000) %}{{ messages[0].content }}{% endfor %}";
    let m = [Message::user("x".repeat(1000))];
    let (r, t) = render(src, &m, None);
    let e = r.unwrap_err();
    assert!(e.contains("longer than the limit of 16777216 bytes (TemplateLimits::max_output_bytes)"), "{e}");
    assert!(t < Duration::from_secs(1), "{t:?}");
    // A message alone over a smaller limit.
    let limits = TemplateLimits { max_output_bytes: 1 << 20, ..TemplateLimits::default() };
    let (r, _) = render(CHATML, &[Message::user("y".repeat(2 << 20))], Some(limits));
    assert!(r.unwrap_err().contains("limit of 1048576 bytes"));
}

#[test]
fn recursion_is_bounded() {
    let src = "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}";
    let (r, t) = render(src, &[], None);
    let e = r.unwrap_err();
    assert!(e.contains("recursion") || e.contains("instructions"), "{e}");
    assert!(t < Duration::from_secs(1), "{t:?}");
}

#[test]
fn hostile_messages_are_text() {
    // Template syntax, control characters and invalid roles inside messages are rendered as
    // text, never evaluated.
    let m = [
        Message::new("{{ 7 * 7 }}", "{% for i in range(10) %}x{% endfor %}\u{0}\u{1b}[2J"),
        Message::user("}}{{ raise_exception('boom') }}"),
    ];
    let (r, _) = render(CHATML, &m, None);
    assert_eq!(
        r.unwrap(),
        "<|im_start|>{{ 7 * 7 }}\n{% for i in range(10) %}x{% endfor %}\u{0}\u{1b}[2J<|im_end|>\n\
         <|im_start|>user\n}}{{ raise_exception('boom') }}<|im_end|>\n"
    );
}
