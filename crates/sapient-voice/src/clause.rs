//! Cutting a reply streamed as text pieces into clauses that are spoken as soon as they are
//! complete: at punctuation followed by a space (`.` `!` `?` `;` `:` `,` and the dash), or
//! after a number of words when no punctuation comes. The first clause is cut after a few
//! words, so that the first audio waits neither for a long sentence nor for Kokoro on one
//! (its time grows with the audio's length); each later clause may be twice as long as the
//! one before (up to a limit), so that Kokoro's prosody has longer stretches while the audio
//! already spoken covers the time it takes.

/// Where a reply is cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClauseOptions {
    /// Most words in the first clause (cut at a space after this many without punctuation).
    pub first_max_words: usize,
    /// Most words in any clause: the second clause is cut at twice `first_max_words`, the
    /// third at four times, and so on up to this.
    pub max_words: usize,
    /// Fewest words a later clause is cut at on a comma (shorter ones wait for more text:
    /// Kokoro's prosody is better on longer clauses, and the first clause has already
    /// started the audio).
    pub min_words_at_comma: usize,
}

impl Default for ClauseOptions {
    fn default() -> Self {
        Self { first_max_words: 4, max_words: 30, min_words_at_comma: 4 }
    }
}

/// Text pieces in, clauses out ([`ClauseSplitter::push`], then [`ClauseSplitter::finish`]).
#[derive(Debug, Clone)]
pub struct ClauseSplitter {
    opts: ClauseOptions,
    buf: String,
    emitted: usize,
}

fn is_break(c: char, comma: bool) -> bool {
    matches!(c, '.' | '!' | '?' | ';' | ':' | '\u{2026}' | '\u{2014}') || (comma && c == ',')
}

impl ClauseSplitter {
    pub fn new(opts: ClauseOptions) -> Self {
        Self { opts, buf: String::new(), emitted: 0 }
    }

    /// Feeds a piece of the reply; returns the clauses it completed (trimmed, never empty).
    pub fn push(&mut self, piece: &str) -> Vec<String> {
        self.buf.push_str(piece);
        let mut out = Vec::new();
        while let Some(cut) = self.next_cut() {
            let clause: String = self.buf.drain(..cut).collect();
            let clause = clause.trim();
            if !clause.is_empty() {
                out.push(clause.to_string());
                self.emitted += 1;
            }
        }
        out
    }

    /// The rest of the reply (None when nothing is left).
    pub fn finish(&mut self) -> Option<String> {
        let rest = std::mem::take(&mut self.buf);
        let rest = rest.trim();
        (!rest.is_empty()).then(|| {
            self.emitted += 1;
            rest.to_string()
        })
    }

    /// Byte offset just after the next clause in the buffer, if one is complete: a break
    /// character followed by whitespace, or the space after the word limit.
    fn next_cut(&self) -> Option<usize> {
        let grown = self.opts.first_max_words.saturating_mul(1usize.checked_shl(self.emitted.min(16) as u32).unwrap_or(usize::MAX));
        let max = grown.min(self.opts.max_words.max(self.opts.first_max_words));
        let mut words = 0;
        let mut in_word = false;
        let mut prev: Option<(usize, char)> = None;
        for (i, c) in self.buf.char_indices() {
            if c.is_whitespace() {
                if let Some((pi, pc)) = prev {
                    let comma_ok = self.emitted == 0 || words >= self.opts.min_words_at_comma;
                    if is_break(pc, comma_ok) && words > 0 {
                        return Some(pi + pc.len_utf8());
                    }
                }
                if in_word && words >= max {
                    return Some(i);
                }
                in_word = false;
            } else if !in_word {
                in_word = true;
                words += 1;
            }
            prev = Some((i, c));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(pieces: &[&str], opts: ClauseOptions) -> Vec<String> {
        let mut s = ClauseSplitter::new(opts);
        let mut out: Vec<String> = pieces.iter().flat_map(|p| s.push(p)).collect();
        out.extend(s.finish());
        out
    }

    #[test]
    fn cuts_at_punctuation_followed_by_space() {
        let opts = ClauseOptions { first_max_words: 8, ..ClauseOptions::default() };
        let got = split(&["The capital", " of France is Paris.", " It is", " big, old and beautiful!", " Yes"], opts);
        assert_eq!(got, ["The capital of France is Paris.", "It is big, old and beautiful!", "Yes"]);
    }

    #[test]
    fn numbers_and_abbreviations_do_not_cut() {
        let opts = ClauseOptions { first_max_words: 20, ..ClauseOptions::default() };
        let got = split(&["It costs 3.5 dollars or 1,000 yen", " in total."], opts);
        assert_eq!(got, ["It costs 3.5 dollars or 1,000 yen in total."]);
    }

    #[test]
    fn first_clause_is_short_without_punctuation() {
        let opts = ClauseOptions { first_max_words: 3, max_words: 5, min_words_at_comma: 4 };
        let got = split(&["one two three four five six seven eight nine ten eleven"], opts);
        assert_eq!(got, ["one two three", "four five six seven eight", "nine ten eleven"]);
    }

    #[test]
    fn clauses_grow_twice_as_long_up_to_the_limit() {
        let opts = ClauseOptions { first_max_words: 2, max_words: 6, min_words_at_comma: 4 };
        let text = (1..=20).map(|i| format!("w{i}")).collect::<Vec<_>>().join(" ");
        let got = split(&[&text], opts);
        let lens: Vec<usize> = got.iter().map(|c| c.split_whitespace().count()).collect();
        assert_eq!(lens, [2, 4, 6, 6, 2]);
    }

    #[test]
    fn first_clause_cuts_at_a_comma_later_ones_wait() {
        let got = split(&["Well, I think so, yes, and then some more words, here."], ClauseOptions::default());
        assert_eq!(got, ["Well,", "I think so, yes,", "and then some more words,", "here."]);
    }

    #[test]
    fn empty_and_whitespace_give_nothing() {
        assert!(split(&["", "  ", "\n"], ClauseOptions::default()).is_empty());
    }
}
