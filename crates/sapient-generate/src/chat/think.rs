//! A reasoning model's `<think>…</think>` block, split from the answer: whole
//! ([`split_reasoning`]) or as the text streams in ([`Splitter`]). The block counts when the
//! output starts with `<think>` (after whitespace), or anywhere up to a `</think>` when the
//! prompt already opened it ([`prompt_opens`]); the reasoning and the start of the answer
//! are trimmed. Servers give the block as `reasoning_content` (as DeepSeek's and vLLM's
//! OpenAI-compatible servers do), [`Generation::reasoning`](crate::Generation::reasoning)
//! holds it, and a reasoning budget counts the tokens inside it.

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// A piece of the split output.
#[derive(Debug, PartialEq)]
pub enum Part {
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

/// Splits a reasoning model's output, fed in pieces as it streams, into [`Part`]s.
#[derive(Debug)]
pub struct Splitter {
    state: State,
    /// Text not given out yet: a possible tag, or trailing whitespace of the reasoning.
    buf: String,
    /// The block opened (in the output or the prompt).
    entered: bool,
}

impl Splitter {
    /// `opened`: the prompt ends inside an open block (the template opened it).
    pub fn new(opened: bool) -> Self {
        Self { state: if opened { State::Think { started: false } } else { State::Start }, buf: String::new(), entered: opened }
    }

    /// Inside the block now (its opening tag seen or opened by the prompt, its closing tag
    /// not yet).
    pub fn in_block(&self) -> bool {
        matches!(self.state, State::Think { .. })
    }

    /// Whether the output held a block (its reasoning may be empty).
    pub fn had_block(&self) -> bool {
        self.entered
    }

    /// More of the output: the parts it completes (what may start a tag is held back).
    pub fn push(&mut self, text: &str) -> Vec<Part> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.state {
                State::Start => {
                    let t = self.buf.trim_start();
                    if let Some(rest) = t.strip_prefix(OPEN) {
                        self.buf = rest.to_string();
                        self.state = State::Think { started: false };
                        self.entered = true;
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

    /// Whether a block may still open: nothing but whitespace (or part of the tag) so far.
    pub fn may_open(&self) -> bool {
        self.state == State::Start
    }

    /// The end of the output: what was held back.
    pub fn finish(&mut self) -> Vec<Part> {
        let rest = std::mem::take(&mut self.buf);
        match self.state {
            State::Start if !rest.is_empty() => vec![Part::Content(rest)],
            State::Think { .. } if !rest.trim().is_empty() => vec![Part::Reasoning(rest.trim_end().to_string())],
            _ => vec![],
        }
    }
}

/// Whether a prompt ends inside an open block (the chat template opened it for the model).
pub fn prompt_opens(prompt: &str) -> bool {
    prompt.trim_end().ends_with(OPEN)
}

/// Split a whole output into its reasoning (inside `<think>…</think>`, at the start) and the
/// answer after it. A `</think>` with no `<think>` before it closes a block that the prompt
/// opened; an unclosed `<think>` (the output was cut) is all reasoning. Without a block the
/// reasoning is `None` and the answer the output, untouched.
pub fn split_reasoning(output: &str) -> (Option<String>, String) {
    let body = output.trim_start();
    let opened = !body.starts_with(OPEN) && body.find(CLOSE).is_some_and(|end| !body[..end].contains(OPEN));
    let mut s = Splitter::new(opened);
    let mut parts = s.push(output);
    parts.extend(s.finish());
    let (mut reasoning, mut answer) = (String::new(), String::new());
    for p in parts {
        match p {
            Part::Reasoning(r) => reasoning.push_str(&r),
            Part::Content(c) => answer.push_str(&c),
        }
    }
    (s.had_block().then_some(reasoning), answer)
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
            let want = split_reasoning(text);
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
    fn reasoning_is_split_from_the_answer() {
        let some = |r: &str, a: &str| (Some(r.to_string()), a.to_string());
        assert_eq!(split_reasoning("<think>\nLet me add.\n</think>\n\n4"), some("Let me add.", "4"));
        // Thinking switched off: the template put an empty block in the prompt; or the model wrote one.
        assert_eq!(split_reasoning("<think>\n\n</think>\n\nHello"), some("", "Hello"));
        // The prompt opened the block (DeepSeek-R1 style): only the closing tag is in the output.
        assert_eq!(split_reasoning("First, 2+2.\n</think>\nIt is 4."), some("First, 2+2.", "It is 4."));
        assert_eq!(split_reasoning("17 * 3 = 5\n</think>\n\nThe answer is: 5"), some("17 * 3 = 5", "The answer is: 5"));
        // Cut off while thinking.
        assert_eq!(split_reasoning("<think>Hmm, the"), some("Hmm, the", ""));
        // No block: the output is the answer, untouched.
        assert_eq!(split_reasoning("  Paris."), (None, "  Paris.".to_string()));
        // Tags later in an answer are text, not reasoning.
        assert_eq!(split_reasoning("Use <think> and </think> tags."), (None, "Use <think> and </think> tags.".to_string()));
        assert_eq!(split_reasoning("  </think>x"), some("", "x"));
        assert_eq!(split_reasoning("<thi"), (None, "<thi".to_string()));
        assert!(prompt_opens("<|im_start|>assistant\n<think>\n") && !prompt_opens("<think></think>"));
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
