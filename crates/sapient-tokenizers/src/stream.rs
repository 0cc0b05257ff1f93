//! Streaming detokenization and stop-sequence matching.

use crate::{Result, Tokenizer};
use std::collections::HashMap;

/// GPT-2's byte-to-unicode table: the printable character byte-level BPE vocabularies write
/// for each byte.
pub fn byte_to_unicode() -> [char; 256] {
    let mut bs: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut cs = bs.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !bs.contains(&b) {
            bs.push(b);
            cs.push(256 + n);
            n += 1;
        }
    }
    let mut out = [' '; 256];
    for (b, c) in bs.into_iter().zip(cs) {
        out[b as usize] = char::from_u32(c).unwrap_or(' ');
    }
    out
}

/// [`byte_to_unicode`] inverted: the byte each byte-level character stands for.
pub(crate) fn unicode_to_byte() -> HashMap<char, u8> {
    byte_to_unicode().into_iter().enumerate().map(|(b, c)| (c, b as u8)).collect()
}

/// `<0x0A>` style SentencePiece byte tokens.
pub(crate) fn parse_byte_token(s: &str) -> Option<u8> {
    let hex = s.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() == 2 {
        u8::from_str_radix(hex, 16).ok()
    } else {
        None
    }
}

/// Turns tokens into text as they arrive. Text is only emitted once it is complete UTF-8,
/// and the concatenation of everything emitted equals `decode(all tokens)`.
///
/// Each step decodes a short window of recent tokens (the tokens of the previous chunk and
/// the new ones) and emits what the new tokens add to it, so the cost per token does not grow
/// with the length of the generation. The window's first tokens give context for decoders that
/// look at neighbours (SentencePiece's leading space, byte-fallback runs).
#[derive(Clone, Debug)]
pub struct TokenStream {
    tokenizer: Tokenizer,
    skip_special: bool,
    tokens: Vec<u32>,
    /// Start of the decoding window.
    prefix: usize,
    /// Tokens before this index have been emitted.
    read: usize,
}

impl TokenStream {
    pub fn new(tokenizer: Tokenizer, skip_special: bool) -> Self {
        Self {
            tokenizer,
            skip_special,
            tokens: Vec::new(),
            prefix: 0,
            read: 0,
        }
    }

    /// Add a token; returns new text when there is some. A token that ends in the middle of a
    /// UTF-8 character (a byte token) is held until the character is complete.
    pub fn push(&mut self, id: u32) -> Result<Option<String>> {
        // Checked before it joins the window, so a bad id leaves the stream usable.
        self.tokenizer.check_ids(&[id])?;
        self.tokens.push(id);
        self.step(false)
    }

    fn step(&mut self, last: bool) -> Result<Option<String>> {
        let before = self
            .tokenizer
            .decode(&self.tokens[self.prefix..self.read], self.skip_special)?;
        let text = self
            .tokenizer
            .decode(&self.tokens[self.prefix..], self.skip_special)?;
        // An incomplete character decodes as U+FFFD at the end: wait for the rest.
        if text.len() <= before.len() || (!last && text.ends_with('\u{FFFD}')) {
            return Ok(None);
        }
        let new = match text.strip_prefix(before.as_str()) {
            Some(new) => new.to_string(),
            None => {
                // The decoder changed earlier text (not seen with byte-level or SentencePiece
                // decoders); emit what follows the common part.
                let common = text
                    .char_indices()
                    .zip(before.chars())
                    .take_while(|((_, a), b)| a == b)
                    .last()
                    .map(|((i, c), _)| i + c.len_utf8())
                    .unwrap_or(0);
                text[common..].to_string()
            }
        };
        self.prefix = self.read;
        self.read = self.tokens.len();
        Ok((!new.is_empty()).then_some(new))
    }

    /// Emit whatever is still held back (an incomplete character at the very end, as U+FFFD).
    pub fn finish(&mut self) -> Result<Option<String>> {
        if self.read == self.tokens.len() {
            return Ok(None);
        }
        self.step(true)
    }

    /// All tokens pushed so far.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Start over (e.g. a new turn), keeping the tokenizer.
    pub fn reset(&mut self) {
        self.tokens.clear();
        self.prefix = 0;
        self.read = 0;
    }
}

/// What [`StopMatcher::push`] lets through.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StopOutput {
    /// Text safe to show: it cannot be part of a stop string.
    pub emit: String,
    /// A stop string was found; `emit` ends right before it.
    pub stopped: bool,
    /// Which stop string matched.
    pub matched: Option<String>,
}

/// Finds stop strings in streamed text, holding back a tail that could be the start of one.
#[derive(Debug, Clone)]
pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
    done: bool,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> Self {
        Self {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            pending: String::new(),
            done: false,
        }
    }

    pub fn push(&mut self, chunk: &str) -> StopOutput {
        if self.done {
            return StopOutput {
                emit: String::new(),
                stopped: true,
                matched: None,
            };
        }
        self.pending.push_str(chunk);
        // The earliest stop string wins.
        let hit = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()).map(|i| (i, s.clone())))
            .min_by_key(|(i, _)| *i);
        if let Some((i, s)) = hit {
            let emit = self.pending[..i].to_string();
            self.pending.clear();
            self.done = true;
            return StopOutput {
                emit,
                stopped: true,
                matched: Some(s),
            };
        }
        // Hold back the longest suffix that is a prefix of some stop string.
        let mut hold = 0;
        for s in &self.stops {
            for (i, _) in s.char_indices().skip(1) {
                if self.pending.ends_with(&s[..i]) {
                    hold = hold.max(i);
                }
            }
        }
        let cut = self.pending.len() - hold;
        let emit = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        StopOutput {
            emit,
            stopped: false,
            matched: None,
        }
    }

    /// The held-back text, at the end of a generation with no stop.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_matcher_holds_back_partial_matches() {
        let mut m = StopMatcher::new(vec!["</answer>".into(), "STOP".into()]);
        assert_eq!(m.push("Hello </an").emit, "Hello ");
        let o = m.push("swer> more");
        assert!(o.stopped);
        assert_eq!(o.emit, "");
        assert_eq!(o.matched.as_deref(), Some("</answer>"));

        let mut m = StopMatcher::new(vec!["STOP".into()]);
        assert_eq!(m.push("ST").emit, "");
        assert_eq!(m.push("ART").emit, "START");
        assert_eq!(m.push("x S").emit, "x ");
        assert_eq!(m.flush(), "S");

        let mut m = StopMatcher::new(vec!["ab".into(), "b".into()]);
        let o = m.push("xab");
        assert_eq!((o.emit.as_str(), o.matched.as_deref()), ("x", Some("ab")));
    }

    #[test]
    fn multibyte_stop_strings() {
        let mut m = StopMatcher::new(vec!["日本".into()]);
        assert_eq!(m.push("こんにちは日").emit, "こんにちは");
        let o = m.push("本語");
        assert!(o.stopped && o.emit.is_empty());
    }

    #[test]
    fn byte_tables() {
        let t = unicode_to_byte();
        assert_eq!(t.len(), 256);
        assert_eq!(t[&'Ġ'], b' ');
        assert_eq!(t[&'Ċ'], b'\n');
        assert_eq!(t[&'a'], b'a');
        assert_eq!(parse_byte_token("<0x0A>"), Some(10));
        assert_eq!(parse_byte_token("<0x0A"), None);
    }
}
