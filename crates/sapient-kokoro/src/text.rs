//! Text splitting for synthesis: sentences (the streaming unit), and phoneme strings cut under
//! the model's 510-phoneme limit at the best boundary (sentence end, then `;` `:`, then `,`
//! `—` and quotes/parentheses, then a space, and only then anywhere), like Kokoro's own
//! pipeline waterfall.

use crate::g2p::{G2p, ABBREVIATIONS};

/// Splits text into sentences: after `.` `!` `?` `…` (and any closing quotes or brackets)
/// followed by whitespace, except after an abbreviation ("Mr.", "e.g.") or an initial ("J."),
/// and at blank lines / line breaks. Empty pieces are dropped; each piece is trimmed.
pub fn split_sentences(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for para in text.split('\n') {
        let cs: Vec<char> = para.chars().collect();
        let mut start = 0;
        let mut i = 0;
        while i < cs.len() {
            let c = cs[i];
            if matches!(c, '.' | '!' | '?' | '…') {
                let mut j = i + 1;
                while j < cs.len() && matches!(cs[j], '.' | '!' | '?' | '…' | '"' | '”' | '\'' | '’' | ')' | ']') {
                    j += 1;
                }
                let at_space = j >= cs.len() || cs[j].is_whitespace();
                if at_space && !(c == '.' && is_abbreviation(&cs[start..i])) {
                    push_trimmed(&mut out, &cs[start..j]);
                    start = j;
                }
                i = j;
                continue;
            }
            i += 1;
        }
        push_trimmed(&mut out, &cs[start..]);
    }
    out
}

fn push_trimmed(out: &mut Vec<String>, cs: &[char]) {
    let s: String = cs.iter().collect();
    let s = s.trim();
    if !s.is_empty() {
        out.push(s.to_string());
    }
}

/// Is the word just before a dot an abbreviation or a single-letter initial?
fn is_abbreviation(before: &[char]) -> bool {
    let word: String = before
        .iter()
        .rev()
        .take_while(|c| !c.is_whitespace() && !matches!(c, '(' | '"' | '“'))
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    let lower = word.to_lowercase();
    if word.chars().count() == 1 && word.chars().all(char::is_alphabetic) {
        return true;
    }
    ABBREVIATIONS.contains(&lower.as_str())
}

/// Cuts a phoneme string into pieces of at most `max` symbols (characters), at the best
/// boundary before the limit; pieces are trimmed and never empty.
pub fn split_phonemes(phonemes: &str, max: usize) -> Vec<String> {
    let max = max.max(1);
    let mut out = Vec::new();
    let mut rest: Vec<char> = phonemes.trim().chars().collect();
    while rest.len() > max {
        let window = &rest[..=max.min(rest.len() - 1)];
        // cut after position k (exclusive end = k + 1), the best class first
        let classes: [&dyn Fn(char) -> bool; 4] = [
            &|c| matches!(c, '.' | '!' | '?' | '…'),
            &|c| matches!(c, ';' | ':'),
            &|c| matches!(c, ',' | '—' | '”' | ')' | '"'),
            &|c| c == ' ',
        ];
        let mut cut = None;
        for class in classes {
            if let Some(k) = (0..window.len().min(max)).rev().find(|&k| class(window[k]) && k > 0) {
                cut = Some(k + 1);
                break;
            }
        }
        let cut = cut.unwrap_or(max);
        let piece: String = rest[..cut].iter().collect();
        let piece = piece.trim();
        if !piece.is_empty() {
            out.push(piece.to_string());
        }
        rest = rest[cut..].to_vec();
        while rest.first() == Some(&' ') {
            rest.remove(0);
        }
    }
    let last: String = rest.iter().collect();
    let last = last.trim();
    if !last.is_empty() {
        out.push(last.to_string());
    }
    out
}

/// One unit of synthesis: the text it came from and its phonemes (at most the limit).
#[derive(Debug, Clone, PartialEq)]
pub struct Chunk {
    pub text: String,
    pub phonemes: String,
}

/// Text -> sentence chunks of at most `max` phonemes (a long sentence gives several chunks
/// with the same `text`). Sentences without speakable content are left out.
pub fn chunks(g2p: &G2p, text: &str, max: usize) -> Vec<Chunk> {
    let mut out = Vec::new();
    for sentence in split_sentences(text) {
        let ps = g2p.phonemize(&sentence);
        if !ps.chars().any(|c| c.is_alphabetic()) {
            continue;
        }
        for piece in split_phonemes(&ps, max) {
            out.push(Chunk {
                text: sentence.clone(),
                phonemes: piece,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentences() {
        assert_eq!(
            split_sentences("Hello there. Mr. Smith paid $3.50! Is it J. R. R. Tolkien? Yes…\nNew line"),
            ["Hello there.", "Mr. Smith paid $3.50!", "Is it J. R. R. Tolkien?", "Yes…", "New line"]
        );
        assert_eq!(split_sentences("  "), Vec::<String>::new());
        assert_eq!(split_sentences("He said \"stop.\" Then left."), ["He said \"stop.\"", "Then left."]);
    }

    #[test]
    fn phoneme_limit() {
        let words: Vec<String> = (0..200).map(|i| format!("wˈɜɹd{i}")).collect();
        let text = words.join(" ");
        let pieces = split_phonemes(&text, 510);
        assert!(pieces.len() > 1);
        assert!(pieces.iter().all(|p| p.chars().count() <= 510 && !p.is_empty()));
        // nothing lost but the spaces at the cuts
        let joined: String = pieces.join(" ");
        assert_eq!(joined, text);
        // a clause boundary is preferred to a space
        let clause = format!("{}, {}", "a ".repeat(200).trim(), "b ".repeat(200).trim());
        let pieces = split_phonemes(&clause, 510);
        assert!(pieces[0].ends_with(','), "{}", pieces[0]);
        // no boundary at all: a hard cut
        let pieces = split_phonemes(&"x".repeat(1100), 510);
        assert_eq!(pieces.iter().map(|p| p.chars().count()).collect::<Vec<_>>(), [510, 510, 80]);
    }
}
