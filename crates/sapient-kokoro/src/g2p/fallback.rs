//! The fallback for words the lexicons do not know (misaki would call espeak-ng here; Kokoro's
//! pipeline without espeak drops such words). It never fails for a word with a letter in it:
//!
//! 1. a compound of lexicon words ("smartwatch" -> smart + watch; pieces of 3+ letters, the
//!    later pieces' primary stress demoted);
//! 2. letter-to-sound rules: longest-match English spellings (`tion`, `igh`, `ch`, a
//!    vowel-consonant-`e` long vowel ...), primary stress on the first vowel, short vowels of
//!    the other syllables reduced to ə;
//! 3. all-caps words up to 5 letters, and anything the rules leave without a vowel, are
//!    spelled out letter by letter.
//!
//! Letters with diacritics are read as their base letter; other characters are dropped.

use super::lexicon::{is_vowel, Lexicon, PRIMARY, SECONDARY};

/// A word's phonemes when the lexicons have none; `None` only when it has no letters.
pub(crate) fn fallback(lex: &Lexicon, word: &str) -> Option<String> {
    // an unknown word's possessive: the word, then the -s rule ("Kokoro's" -> ...z)
    for apos in ["'s", "’s"] {
        if let Some(stem) = word.strip_suffix(apos).filter(|s| !s.is_empty()) {
            return fallback(lex, stem).and_then(|ps| Lexicon::suffix_s(&ps));
        }
    }
    let letters: String = word.chars().filter_map(base_letter).collect();
    if letters.is_empty() {
        return None;
    }
    let n = letters.chars().count();
    if n <= 5 && letters.chars().all(|c| c.is_ascii_uppercase()) && n > 1 {
        if let Some(ps) = lex.spell(&letters) {
            return Some(ps);
        }
    }
    let lower = letters.to_ascii_lowercase();
    if let Some(ps) = compound(lex, &lower) {
        return Some(ps);
    }
    let ps = letter_to_sound(&lower);
    if ps.chars().any(is_vowel) {
        return Some(ps);
    }
    lex.spell(&letters)
}

/// The ASCII letter of a (possibly accented) letter; `None` for anything else.
fn base_letter(c: char) -> Option<char> {
    if c.is_ascii_alphabetic() {
        return Some(c);
    }
    let lower = c.to_lowercase().next().unwrap_or(c);
    let b = match lower {
        'à' | 'á' | 'â' | 'ã' | 'ä' | 'å' | 'ā' | 'ă' | 'ą' => 'a',
        'ç' | 'ć' | 'č' => 'c',
        'è' | 'é' | 'ê' | 'ë' | 'ē' | 'ė' | 'ę' | 'ě' => 'e',
        'ì' | 'í' | 'î' | 'ï' | 'ī' | 'į' => 'i',
        'ñ' | 'ń' | 'ň' => 'n',
        'ò' | 'ó' | 'ô' | 'õ' | 'ö' | 'ø' | 'ō' | 'ő' => 'o',
        'ù' | 'ú' | 'û' | 'ü' | 'ū' | 'ů' | 'ű' => 'u',
        'ý' | 'ÿ' => 'y',
        'ś' | 'š' | 'ş' => 's',
        'ź' | 'ż' | 'ž' => 'z',
        'ł' => 'l',
        'ß' => 's',
        _ => return None,
    };
    Some(if c.is_uppercase() { b.to_ascii_uppercase() } else { b })
}

/// Two or three lexicon words of 3+ letters that spell the word exactly (longest first piece).
fn compound(lex: &Lexicon, w: &str) -> Option<String> {
    fn known(lex: &Lexicon, s: &str) -> Option<String> {
        if s.len() < 3 {
            return None;
        }
        let ps = lex.lookup_plain(s)?;
        Some(ps)
    }
    fn split(lex: &Lexicon, w: &str, depth: usize) -> Option<Vec<String>> {
        if let Some(ps) = known(lex, w) {
            return Some(vec![ps]);
        }
        if depth == 0 {
            return None;
        }
        for i in (3..w.len().saturating_sub(2)).rev() {
            if let Some(head) = known(lex, &w[..i]) {
                if let Some(mut rest) = split(lex, &w[i..], depth - 1) {
                    rest.insert(0, head);
                    return Some(rest);
                }
            }
        }
        None
    }
    let parts = split(lex, w, 2)?;
    if parts.len() < 2 {
        return None;
    }
    let mut out = String::new();
    for (i, p) in parts.iter().enumerate() {
        if i == 0 {
            out.push_str(p);
        } else {
            out.push_str(&p.replace(SECONDARY, "").replace(PRIMARY, &SECONDARY.to_string()));
        }
    }
    Some(out)
}

/// Spelling -> phonemes, longest match first. `V` marks a vowel phoneme slot that may be
/// reduced when unstressed.
const RULES: &[(&str, &str)] = &[
    ("tion", "ʃən"),
    ("sion", "ʒən"),
    ("ture", "ʧəɹ"),
    ("eigh", "A"),
    ("augh", "ɔ"),
    ("ough", "O"),
    ("tch", "ʧ"),
    ("sch", "sk"),
    ("igh", "I"),
    ("dge", "ʤ"),
    ("que", "k"),
    ("ai", "A"),
    ("ay", "A"),
    ("ee", "i"),
    ("ea", "i"),
    ("ei", "A"),
    ("ey", "i"),
    ("ie", "i"),
    ("oa", "O"),
    ("oo", "u"),
    ("ou", "W"),
    ("ow", "O"),
    ("oi", "Y"),
    ("oy", "Y"),
    ("au", "ɔ"),
    ("aw", "ɔ"),
    ("ew", "u"),
    ("ue", "u"),
    ("ui", "u"),
    ("ar", "ɑɹ"),
    ("er", "əɹ"),
    ("ir", "ɜɹ"),
    ("ur", "ɜɹ"),
    ("or", "ɔɹ"),
    ("ch", "ʧ"),
    ("sh", "ʃ"),
    ("th", "θ"),
    ("ph", "f"),
    ("wh", "w"),
    ("ck", "k"),
    ("ng", "ŋ"),
    ("qu", "kw"),
    ("gh", "ɡ"),
    ("kn", "n"),
    ("wr", "ɹ"),
    ("x", "ks"),
    ("b", "b"),
    ("d", "d"),
    ("f", "f"),
    ("h", "h"),
    ("j", "ʤ"),
    ("k", "k"),
    ("l", "l"),
    ("m", "m"),
    ("n", "n"),
    ("p", "p"),
    ("q", "k"),
    ("r", "ɹ"),
    ("s", "s"),
    ("t", "t"),
    ("v", "v"),
    ("w", "w"),
    ("z", "z"),
];

fn is_vowel_letter(c: u8) -> bool {
    matches!(c, b'a' | b'e' | b'i' | b'o' | b'u' | b'y')
}

/// Rule-based letter-to-sound for a lowercase ASCII word.
pub(crate) fn letter_to_sound(w: &str) -> String {
    let b = w.as_bytes();
    let n = b.len();
    // a final silent 'e' (not the only vowel): "make", "kokore"
    let vowels = b.iter().filter(|&&c| is_vowel_letter(c)).count();
    let silent_e = n > 2 && b[n - 1] == b'e' && vowels > 1 && !is_vowel_letter(b[n - 2]);
    let end = if silent_e { n - 1 } else { n };
    // phoneme units; `true` = a short vowel that may reduce
    let mut units: Vec<(String, bool)> = Vec::new();
    let mut seen_vowel = false;
    let mut i = 0;
    while i < end {
        let c = b[i];
        // a single vowel letter
        if is_vowel_letter(c) && !RULES.iter().any(|(g, _)| g.len() > 1 && w[i..end].starts_with(g)) {
            let next_is_vowel = i + 1 < end && is_vowel_letter(b[i + 1]);
            // vowel + one consonant + silent e, or a first vowel in an open syllable
            // (vowel, one consonant, vowel: "ko-ko-ro", "na-tion"): long
            let open_first = !seen_vowel
                && i + 2 < end
                && !is_vowel_letter(b[i + 1])
                && b[i + 1] != b'x'
                && is_vowel_letter(b[i + 2])
                && c != b'y';
            let long = (silent_e && i + 2 == end && !is_vowel_letter(b[i + 1])) || open_first;
            seen_vowel = true;
            let (p, reducible) = match (c, long) {
                (b'y', _) if i == 0 => ("j", false),
                (b'y', _) if i + 1 == end => (if vowels == 1 { "I" } else { "i" }, false),
                (b'a', true) => ("A", false),
                (b'e', true) => ("i", false),
                (b'i', true) | (b'y', true) => ("I", false),
                (b'o', true) => ("O", false),
                (b'u', true) => ("u", false),
                (b'a', false) if i + 1 == end => ("ə", false),
                (b'o', false) if i + 1 == end => ("O", false),
                (b'i', false) if i + 1 == end => ("i", false),
                (b'e', false) if i + 1 == end => ("i", false),
                (b'u', false) if i + 1 == end => ("u", false),
                (b'a', false) => ("æ", true),
                (b'e', false) => ("ɛ", true),
                (b'i', false) | (b'y', false) => ("ɪ", true),
                (b'o', false) => (if next_is_vowel { "O" } else { "ɑ" }, true),
                _ => ("ʌ", true),
            };
            units.push((p.to_string(), reducible));
            i += 1;
            continue;
        }
        // c / g soft before e, i, y
        if (c == b'c' || c == b'g') && i + 1 < n && matches!(b[i + 1], b'e' | b'i' | b'y') {
            units.push((if c == b'c' { "s" } else { "ʤ" }.to_string(), false));
            i += 1;
            continue;
        }
        if c == b'c' {
            units.push(("k".to_string(), false));
            i += 1;
            continue;
        }
        if c == b'g' && !(i + 1 < n && b[i + 1] == b'h') {
            units.push(("ɡ".to_string(), false));
            i += 1;
            continue;
        }
        // s between vowels, or final after a voiced sound: z
        if c == b's' && i > 0 && i + 1 < end && is_vowel_letter(b[i - 1]) && is_vowel_letter(b[i + 1]) {
            units.push(("z".to_string(), false));
            i += 1;
            continue;
        }
        let mut matched = false;
        for (g, p) in RULES {
            if w[i..end].starts_with(g) {
                // "kn"/"wr" only at the start; "gh" silent inside a word
                if (*g == "kn" || *g == "wr") && i != 0 {
                    continue;
                }
                let p = if *g == "gh" && i != 0 { "" } else { p };
                // a doubled consonant is one sound
                let same_as_prev = i > 0 && g.len() == 1 && b[i - 1] == c && !is_vowel_letter(c);
                if !same_as_prev && !p.is_empty() {
                    units.push((p.to_string(), false));
                }
                i += g.len();
                matched = true;
                break;
            }
        }
        if !matched {
            i += 1;
        }
    }
    // stress: primary before the first vowel unit; other short vowels reduce to ə
    let mut out = String::new();
    let mut stressed = false;
    for (p, reducible) in units {
        let has_vowel = p.chars().any(is_vowel);
        if has_vowel && !stressed {
            stressed = true;
            // put the mark before the vowel inside the unit
            for ch in p.chars() {
                if is_vowel(ch) && !out.contains(PRIMARY) {
                    out.push(PRIMARY);
                }
                out.push(ch);
            }
            continue;
        }
        if has_vowel && reducible {
            out.push('ə');
        } else {
            out.push_str(&p);
        }
    }
    if out.ends_with("ss") {
        out.pop();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_give_a_stressed_pronounceable_reading() {
        for w in ["kokoro", "blag", "frame", "nation", "xyzzy", "strengths", "aeiou"] {
            let ps = letter_to_sound(w);
            assert!(ps.chars().any(is_vowel), "{w}: {ps}");
            assert_eq!(ps.matches(PRIMARY).count(), 1, "{w}: {ps}");
            assert!(ps.chars().all(|c| c == PRIMARY || is_vowel(c) || super::super::lexicon::CONSONANTS.contains(c)), "{w}: {ps}");
        }
    }
}
