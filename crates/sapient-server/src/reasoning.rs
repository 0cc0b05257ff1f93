//! A reasoning model's `<think>…</think>` block, split from the answer as text streams in:
//! the block goes to `reasoning_content`, the rest to `content` (as DeepSeek's and vLLM's
//! OpenAI-compatible servers do). The same rule as `sapient_generate::split_reasoning`: an
//! output that starts with `<think>` (after whitespace), or any output when the prompt
//! already opened the block; the reasoning and the start of the answer are trimmed.

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// A piece of the split output.
#[derive(Debug, PartialEq)]
pub(crate) enum Part {
    Reasoning(String),
    Content(String),
}

#[derive(Debug, PartialEq)]
enum State {
    /// Nothing but whitespace yet: the block may still open.
    Start,
    /// Inside the block (`started`: some reasoning was given out).
    Think { started: bool },
    /// After the block: the answer's leading whitespace is dropped.
    After,
    Answer,
}

#[derive(Debug)]
pub(crate) struct Splitter {
    state: State,
    /// Text not given out yet: a possible tag, or trailing whitespace of the reasoning.
    buf: String,
}

impl Splitter {
    /// `opened`: the prompt ends inside an open block (the template opened it).
    pub(crate) fn new(opened: bool) -> Self {
        Self { state: if opened { State::Think { started: false } } else { State::Start }, buf: String::new() }
    }

    pub(crate) fn push(&mut self, text: &str) -> Vec<Part> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.state {
                State::Start => {
                    let t = self.buf.trim_start();
                    if let Some(rest) = t.strip_prefix(OPEN) {
                        self.buf = rest.to_string();
                        self.state = State::Think { started: false };
                    } else if OPEN.starts_with(t) {
                        return out; // empty, or a prefix of the tag
                    } else {
                        self.state = State::Answer;
                    }
                }
                State::Think { started } => {
                    if !started {
                        let t = self.buf.trim_start();
                        if t.is_empty() {
                            self.buf.clear();
                            return out;
                        }
                        self.buf = t.to_string();
                    }
                    if let Some(end) = self.buf.find(CLOSE) {
                        let r = self.buf[..end].trim_end();
                        if !r.is_empty() {
                            out.push(Part::Reasoning(r.to_string()));
                        }
                        self.buf = self.buf[end + CLOSE.len()..].to_string();
                        self.state = State::After;
                        continue;
                    }
                    // Hold back what may start the closing tag, and trailing whitespace
                    // (dropped if the tag follows it).
                    let keep = (1..CLOSE.len()).rev().find(|&k| self.buf.ends_with(&CLOSE[..k])).unwrap_or(0);
                    let cut = self.buf.len() - keep;
                    let cut = self.buf[..cut].trim_end().len();
                    if cut > 0 {
                        out.push(Part::Reasoning(self.buf[..cut].to_string()));
                        self.buf.drain(..cut);
                        self.state = State::Think { started: true };
                    }
                    return out;
                }
                State::After => {
                    let t = self.buf.trim_start();
                    if t.is_empty() {
                        self.buf.clear();
                        return out;
                    }
                    self.buf = t.to_string();
                    self.state = State::Answer;
                }
                State::Answer => {
                    if !self.buf.is_empty() {
                        out.push(Part::Content(std::mem::take(&mut self.buf)));
                    }
                    return out;
                }
            }
        }
    }

    /// The end of the output: what was held back.
    pub(crate) fn finish(&mut self) -> Vec<Part> {
        let rest = std::mem::take(&mut self.buf);
        match self.state {
            State::Start if !rest.is_empty() => vec![Part::Content(rest)],
            State::Think { .. } if !rest.trim().is_empty() => vec![Part::Reasoning(rest.trim_end().to_string())],
            _ => vec![],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Split `text` fed in pieces of `n` bytes (on char boundaries); joined reasoning and
    /// content.
    fn split(opened: bool, text: &str, n: usize) -> (Option<String>, String) {
        let mut s = Splitter::new(opened);
        let mut parts = Vec::new();
        let chars: Vec<char> = text.chars().collect();
        for c in chars.chunks(n) {
            parts.extend(s.push(&c.iter().collect::<String>()));
        }
        parts.extend(s.finish());
        let (mut r, mut c) = (None::<String>, String::new());
        for p in parts {
            match p {
                Part::Reasoning(t) => r.get_or_insert_with(String::new).push_str(&t),
                Part::Content(t) => c.push_str(&t),
            }
        }
        (r, c)
    }

    #[test]
    fn splits_like_split_reasoning_at_any_chunking() {
        let cases = [
            "<think>\nLet me add 2 and 2.\n</think>\n\nIt is 4.",
            "  <think>a</think>b",
            "<think>\n\n</think>\n\nNo thoughts.",
            "<think>unfinished thought",
            "Plain answer, no block.",
            "<thinking is not a tag",
            "",
            "<thi",
        ];
        for text in cases {
            let want = sapient_generate::split_reasoning(text);
            // split_reasoning keeps the whole output as the answer when there is no block;
            // so does the splitter.
            for n in 1..=9 {
                let got = split(false, text, n);
                let want_r = want.0.clone().filter(|r| !r.is_empty());
                assert_eq!((got.0, got.1.as_str()), (want_r, want.1.as_str()), "{text:?} in pieces of {n}");
            }
        }
    }

    #[test]
    fn a_stray_close_tag_is_content_unless_the_prompt_opened_the_block() {
        let text = "Answer mentioning </think> late";
        assert_eq!(split(false, text, 3), (None, text.to_string()));
        assert_eq!(split(true, text, 3), (Some("Answer mentioning".into()), "late".into()));
    }

    #[test]
    fn a_block_the_prompt_opened() {
        for n in 1..=7 {
            assert_eq!(split(true, "\nweighing options\n</think>\n\nDone.", n), (Some("weighing options".into()), "Done.".into()));
            assert_eq!(split(true, "still thinking ", n), (Some("still thinking".into()), String::new()));
        }
        // Trailing whitespace inside the block never leaks, even across pieces.
        let mut s = Splitter::new(true);
        assert_eq!(s.push("a "), vec![Part::Reasoning("a".into())]);
        assert_eq!(s.push(" b"), vec![Part::Reasoning("  b".into())]);
        assert_eq!(s.push("\n</th"), vec![]);
        assert_eq!(s.push("ink>x"), vec![Part::Content("x".into())]);
    }
}
