//! Word error counting, as the tests and `cargo xtask bench whisper` score transcripts.

/// Lower-case words without punctuation (apostrophes inside words kept); "mr" is written
/// "mister", as the LibriVox transcripts do.
pub fn normalize(s: &str) -> Vec<String> {
    let cleaned: String = s
        .to_lowercase()
        .chars()
        .map(|c| if c.is_alphanumeric() || c == '\'' { c } else { ' ' })
        .collect();
    cleaned
        .split_whitespace()
        .map(|w| w.trim_matches('\'').to_string())
        .filter(|w| !w.is_empty())
        .map(|w| if w == "mr" { "mister".to_string() } else { w })
        .collect()
}

/// Word-level edit distance (substitutions + deletions + insertions).
pub fn word_errors<S: PartialEq>(reference: &[S], hypothesis: &[S]) -> usize {
    let mut prev: Vec<usize> = (0..=hypothesis.len()).collect();
    for (i, r) in reference.iter().enumerate() {
        let mut cur = vec![i + 1; hypothesis.len() + 1];
        for (j, h) in hypothesis.iter().enumerate() {
            let sub = prev[j] + usize::from(r != h);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[hypothesis.len()]
}

/// (errors, reference words) of a hypothesis against a reference, both [`normalize`]d.
pub fn wer_counts(reference: &str, hypothesis: &str) -> (usize, usize) {
    let r = normalize(reference);
    (word_errors(&r, &normalize(hypothesis)), r.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_substitutions_deletions_and_insertions() {
        assert_eq!(wer_counts("Mr. Dashwood's house, at last.", "mister dashwood's house at last"), (0, 5));
        assert_eq!(word_errors(&["a", "b", "c"], &["a", "x", "c", "d"]), 2);
        assert_eq!(word_errors(&["a", "b"], &[] as &[&str]), 2);
        assert_eq!(word_errors(&[] as &[&str], &["a"]), 1);
    }
}
