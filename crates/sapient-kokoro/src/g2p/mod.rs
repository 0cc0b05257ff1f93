//! English grapheme-to-phoneme conversion for Kokoro (American English, misaki's alphabet).
//!
//! A port of the lexicon path of misaki 0.9.4 (`misaki.en.G2P`, what Kokoro's `KPipeline`
//! runs for `lang_code='a'`), without spaCy:
//!
//! - text is split at whitespace, punctuation is peeled off words and kept as phoneme tokens
//!   (`; : , . ! ? — … " ( ) “ ”`), a standalone dash is read as `—`;
//! - a word written without spaces is cut into sub-tokens like misaki's `subtokenize`
//!   (letters, numbers, camelCase humps, hyphens, apostrophes), then the longest spans are
//!   looked up first ("well-known" whole before "well" + "known");
//! - words go through [`lexicon`] (gold, then silver, suffix rules, numbers) with the right
//!   context misaki uses ("the" -> ði before a vowel, "to" -> tə / tʊ);
//! - words the lexicons do not know go to [`fallback`] (compounds, letter-to-sound rules,
//!   spelling), so every word with a letter gets phonemes;
//! - like Kokoro v1.0 (misaki `version=None`), flap `ɾ` is written `T` and `ʔ` `t`.
//!
//! No part-of-speech tagger: entries keyed by tag take their default reading, which
//! misreads some heteronyms ("read" as present tense, "live" as the adjective).

pub mod fallback;
pub mod lexicon;
pub mod numbers;

use crate::{Error, Result};
use lexicon::{apply_stress, stress_weight, Ctx, Lexicon, Mode, CONSONANTS, PRIMARY};
use std::path::Path;

/// Titles and abbreviations whose final dot does not end a sentence (nor make a pause).
pub(crate) const ABBREVIATIONS: &[&str] = &[
    "mr", "mrs", "ms", "dr", "st", "jr", "sr", "prof", "vs", "etc", "e.g", "i.e", "inc", "ltd", "co", "no", "fig",
    "approx", "dept", "est", "mt", "gen", "col", "lt", "sgt", "capt", "rev", "hon", "u.s", "u.k", "a.m", "p.m",
];

/// Punctuation Kokoro's vocabulary has and misaki keeps as phonemes.
pub const PUNCTUATION: &str = ";:,.!?—…\"()“”";
const NON_QUOTE_PUNCTS: &str = ";:,.!?—…";
const SUBTOKEN_JUNKS: &str = "',-._‘’/";

/// The English G2P: misaki's lexicons plus the rules around them.
pub struct G2p {
    lex: Lexicon,
}

/// One sub-token of a word written without spaces.
#[derive(Debug, Clone)]
struct Sub {
    text: String,
    is_head: bool,
    phonemes: Option<String>,
    prespace: bool,
}

#[derive(Debug, Clone)]
enum Piece {
    /// Punctuation, already phonemes.
    Punct(String),
    /// A currency symbol: silent, read after the number that follows.
    Currency(char),
    Word(Vec<Sub>),
}

#[derive(Debug, Clone)]
struct Token {
    piece: Piece,
    /// Whitespace follows.
    space: bool,
}

impl G2p {
    /// From misaki's `us_gold.json` and `us_silver.json`.
    pub fn load(gold: &Path, silver: &Path) -> Result<Self> {
        Ok(Self {
            lex: Lexicon::load(gold, silver)?,
        })
    }

    /// From a directory holding `us_gold.json` and `us_silver.json` (the `kokoro-82m` preset).
    pub fn from_dir(dir: &Path) -> Result<Self> {
        Self::load(&dir.join("us_gold.json"), &dir.join("us_silver.json"))
    }

    pub fn lexicon(&self) -> &Lexicon {
        &self.lex
    }

    /// One word as misaki's `Lexicon` reads it with no part-of-speech tag and nothing after
    /// it (`None` when the lexicons and number rules have nothing: no fallback here).
    /// `currency` is a symbol written before a number (`$`, `£`, `€`).
    pub fn lexicon_word(&self, word: &str, currency: Option<char>) -> Option<String> {
        let mode = Mode {
            running_text: false,
            ctx: Some(Ctx::default()),
        };
        lexicon_lookup(&self.lex, word, currency, true, mode).map(|p| finish(&p))
    }

    /// A word's phonemes as [`Self::phonemize`] reads it alone, the fallback included.
    pub fn word(&self, word: &str) -> Option<String> {
        let out = self.phonemize(word);
        (!out.is_empty()).then_some(out)
    }

    /// Text -> phonemes in Kokoro's alphabet (words separated by spaces, punctuation kept).
    /// Characters that are neither letters, digits nor known punctuation/symbols are dropped
    /// (with a `tracing` debug line); the result may be empty (then there is nothing to say).
    pub fn phonemize(&self, text: &str) -> String {
        self.phonemize_with_words(text).0
    }

    /// [`phonemize`](Self::phonemize), and each spoken word of the text with its phonemes in
    /// order (punctuation and words with no phonemes left out): what word timestamps are
    /// computed from.
    pub fn phonemize_with_words(&self, text: &str) -> (String, Vec<(String, String)>) {
        let mut tokens = tokenize(&normalize(text));
        // right to left, carrying whether the next word starts with a vowel
        let mut ctx = Ctx::default();
        let n = tokens.len();
        for i in (0..n).rev() {
            let currency = match i.checked_sub(1).map(|j| &tokens[j].piece) {
                Some(Piece::Currency(c)) if !tokens[i - 1].space => Some(*c),
                _ => None,
            };
            match &mut tokens[i].piece {
                Piece::Punct(p) => {
                    ctx = next_ctx(ctx, p);
                }
                Piece::Currency(_) => {}
                Piece::Word(subs) => {
                    self.word_group(subs, &mut ctx, currency);
                }
            }
        }
        let mut out = String::new();
        let mut words = Vec::new();
        for t in &tokens {
            match &t.piece {
                Piece::Punct(p) => out.push_str(p),
                Piece::Currency(_) => {}
                Piece::Word(subs) => {
                    let mut ps = String::new();
                    for s in subs {
                        let p = s.phonemes.as_deref().unwrap_or("");
                        if s.prespace && !ps.is_empty() && !ps.ends_with(' ') && !p.is_empty() {
                            ps.push(' ');
                        }
                        ps.push_str(p);
                    }
                    if !ps.trim().is_empty() {
                        let text: String = subs.iter().map(|s| s.text.as_str()).collect();
                        words.push((text, finish(ps.trim())));
                    }
                    out.push_str(&ps);
                }
            }
            if t.space && !out.is_empty() && !out.ends_with(' ') {
                out.push(' ');
            }
        }
        (finish(out.trim()), words)
    }

    /// misaki's span search over one word's sub-tokens, then its `resolve_tokens`.
    fn word_group(&self, w: &mut [Sub], ctx: &mut Ctx, currency: Option<char>) {
        let (mut left, mut right) = (0usize, w.len());
        while left < right {
            let text: String = w[left..right].iter().map(|s| s.text.as_str()).collect();
            let cur = if right == w.len() { currency } else { None };
            let mode = Mode {
                running_text: true,
                ctx: Some(*ctx),
            };
            let found = if w[left..right].iter().any(|s| s.phonemes.is_some()) {
                None
            } else {
                lexicon_lookup(&self.lex, &text, cur, w[left].is_head, mode)
            };
            if let Some(ps) = found {
                *ctx = next_ctx(*ctx, &ps);
                w[left].phonemes = Some(ps);
                for s in &mut w[left + 1..right] {
                    s.phonemes = Some(String::new());
                }
                right = left;
                left = 0;
            } else if left + 1 < right {
                left += 1;
            } else {
                right -= 1;
                let s = &mut w[right];
                if s.phonemes.is_none() {
                    if s.text.chars().all(|c| SUBTOKEN_JUNKS.contains(c)) {
                        s.phonemes = Some(String::new());
                    } else {
                        let fb = fallback::fallback(&self.lex, &s.text);
                        if fb.is_none() {
                            tracing::debug!(text = %s.text, "no phonemes for this; dropped");
                        }
                        if let Some(ps) = &fb {
                            *ctx = next_ctx(*ctx, ps);
                        }
                        s.phonemes = Some(fb.unwrap_or_default());
                    }
                }
                left = 0;
            }
        }
        resolve_tokens(w);
    }
}

/// Kokoro v1.0's alphabet: flap and glottal stop written `T` and `t`.
fn finish(ps: &str) -> String {
    ps.replace('ɾ', "T").replace('ʔ', "t")
}

/// misaki's `token_context`: does the next sound start with a vowel (None after punctuation)?
fn next_ctx(prev: Ctx, ps: &str) -> Ctx {
    for c in ps.chars() {
        if NON_QUOTE_PUNCTS.contains(c) {
            return Ctx { future_vowel: None };
        }
        if lexicon::is_vowel(c) {
            return Ctx {
                future_vowel: Some(true),
            };
        }
        if CONSONANTS.contains(c) {
            return Ctx {
                future_vowel: Some(false),
            };
        }
    }
    prev
}

/// misaki's `resolve_tokens`: spaces between the pieces of mixed words ("5km", "a/b"), else
/// at most half of the pieces keep a primary stress.
fn resolve_tokens(w: &mut [Sub]) {
    let text: String = w.iter().map(|s| s.text.as_str()).collect();
    let classes: std::collections::BTreeSet<u8> = text
        .chars()
        .filter(|c| !SUBTOKEN_JUNKS.contains(*c))
        .map(|c| {
            if c.is_alphabetic() {
                0
            } else if c.is_ascii_digit() {
                1
            } else {
                2
            }
        })
        .collect();
    let prespace = text.contains(' ') || text.contains('/') || classes.len() > 1;
    for s in w.iter_mut().skip(1) {
        s.prespace = prespace;
    }
    if prespace {
        return;
    }
    let idx: Vec<(bool, usize, usize)> = w
        .iter()
        .enumerate()
        .filter_map(|(i, s)| {
            let p = s.phonemes.as_deref().filter(|p| !p.is_empty())?;
            Some((p.contains(PRIMARY), stress_weight(p), i))
        })
        .collect();
    if idx.len() == 2 && w[idx[0].2].text.chars().count() == 1 {
        let i = idx[1].2;
        if let Some(p) = &w[i].phonemes {
            w[i].phonemes = Some(apply_stress(p, Some(-0.5)));
        }
        return;
    }
    let primaries = idx.iter().filter(|x| x.0).count();
    if idx.len() < 2 || primaries <= idx.len().div_ceil(2) {
        return;
    }
    let mut sorted = idx.clone();
    sorted.sort();
    for &(_, _, i) in sorted.iter().take(idx.len() / 2) {
        if let Some(p) = &w[i].phonemes {
            w[i].phonemes = Some(apply_stress(p, Some(-0.5)));
        }
    }
}

/// Typographic variants to the forms the rules know; every whitespace run is one space.
pub(crate) fn normalize(text: &str) -> String {
    let t = text
        .replace("...", "…")
        .replace(['‘', '’', 'ʼ', '`', '´'], "'")
        .replace(['«', '»', '„'], "\"")
        .replace('–', "—");
    t.split_whitespace().collect::<Vec<_>>().join(" ")
}

const LEADING: &str = "\"“”([{";
const TRAILING: &str = ".,;:!?\"”)]}…";

fn punct_phonemes(c: char, open_quote: &mut bool) -> String {
    match c {
        '"' => {
            *open_quote = !*open_quote;
            if *open_quote { "“" } else { "”" }.to_string()
        }
        '“' => {
            *open_quote = true;
            "“".into()
        }
        '”' => {
            *open_quote = false;
            "”".into()
        }
        '[' | '{' => "(".into(),
        ']' | '}' => ")".into(),
        c => c.to_string(),
    }
}

fn tokenize(text: &str) -> Vec<Token> {
    let mut out: Vec<Token> = Vec::new();
    let mut open_quote = false;
    let all: Vec<&str> = text.split(' ').filter(|c| !c.is_empty()).collect();
    for (ci, chunk) in all.iter().enumerate() {
        let last_chunk = ci + 1 == all.len();
        let start = out.len();
        let chars: Vec<char> = chunk.chars().collect();
        let (mut a, mut b) = (0usize, chars.len());
        while a < b && (LEADING.contains(chars[a]) || numbers::currency_units(chars[a]).is_some()) {
            let c = chars[a];
            out.push(Token {
                piece: match numbers::currency_units(c) {
                    Some(_) => Piece::Currency(c),
                    None => Piece::Punct(punct_phonemes(c, &mut open_quote)),
                },
                space: false,
            });
            a += 1;
        }
        let mut trail = Vec::new();
        while b > a && TRAILING.contains(chars[b - 1]) {
            // keep the final dot of an abbreviation with dots inside ("U.S.")
            if chars[b - 1] == '.' && chars[a..b - 1].contains(&'.') && chars[a..b - 1].iter().all(|c| c.is_alphabetic() || *c == '.') {
                break;
            }
            // "Dr." / "Mr." inside a sentence: the dot is not a pause
            if chars[b - 1] == '.' && !last_chunk && trail.is_empty() {
                let core: String = chars[a..b - 1].iter().collect::<String>().to_lowercase();
                if ABBREVIATIONS.contains(&core.as_str()) {
                    b -= 1;
                    continue;
                }
            }
            trail.push(chars[b - 1]);
            b -= 1;
        }
        let core: String = chars[a..b].iter().collect();
        if !core.is_empty() {
            if core.chars().all(|c| c == '-' || c == '—') {
                out.push(Token {
                    piece: Piece::Punct("—".into()),
                    space: false,
                });
            } else {
                let subs: Vec<Sub> = subtokenize(&core)
                    .into_iter()
                    .enumerate()
                    .map(|(i, t)| Sub {
                        text: t,
                        is_head: i == 0,
                        phonemes: None,
                        prespace: false,
                    })
                    .collect();
                if !subs.is_empty() {
                    out.push(Token {
                        piece: Piece::Word(subs),
                        space: false,
                    });
                }
            }
        }
        for &c in trail.iter().rev() {
            out.push(Token {
                piece: Piece::Punct(punct_phonemes(c, &mut open_quote)),
                space: false,
            });
        }
        if out.len() > start {
            if let Some(last) = out.last_mut() {
                last.space = true;
            }
        }
    }
    out
}

fn is_apos(c: char) -> bool {
    c == '\''
}

/// misaki's `subtokenize` regex, by hand (no look-ahead in the regex crate):
/// leading apostrophes | an upper-case letter before Upper+lower | a number with `,`/`.`
/// (a leading `-`) | a run of `-`/`_` | 2+ apostrophes | letters up to a lower->Upper hump |
/// letters with inner apostrophes | any other single character | trailing apostrophes.
pub(crate) fn subtokenize(word: &str) -> Vec<String> {
    let cs: Vec<char> = word.chars().collect();
    let n = cs.len();
    let mut out = Vec::new();
    let mut i = 0;
    let letter_run_end = |start: usize| -> usize {
        // \p{L}+(?:'\p{L})*
        let mut j = start;
        while j < n && cs[j].is_alphabetic() {
            j += 1;
        }
        while j + 1 < n && is_apos(cs[j]) && cs[j + 1].is_alphabetic() {
            j += 1;
            while j < n && cs[j].is_alphabetic() {
                j += 1;
            }
        }
        j
    };
    while i < n {
        let c = cs[i];
        let start = i;
        if i == 0 && is_apos(c) {
            while i < n && is_apos(cs[i]) {
                i += 1;
            }
        } else if c.is_uppercase() && i + 2 < n && cs[i + 1].is_uppercase() && cs[i + 2].is_lowercase() {
            i += 1;
        } else if c.is_ascii_digit()
            || (i == 0 && c == '-' && i + 1 < n && cs[i + 1].is_ascii_digit())
            || ((c == ',' || c == '.') && i + 1 < n && cs[i + 1].is_ascii_digit())
        {
            if c == '-' {
                i += 1;
            }
            while i < n && (cs[i].is_ascii_digit() || ((cs[i] == ',' || cs[i] == '.') && i + 1 < n && cs[i + 1].is_ascii_digit())) {
                i += 1;
            }
        } else if c == '-' || c == '_' {
            while i < n && (cs[i] == '-' || cs[i] == '_') {
                i += 1;
            }
        } else if is_apos(c) && i + 1 < n && is_apos(cs[i + 1]) {
            while i < n && is_apos(cs[i]) {
                i += 1;
            }
        } else if c.is_alphabetic() {
            let end = letter_run_end(i);
            // the lazy "letters ending lower-case before an upper-case" alternative
            let hump = (i..end.saturating_sub(1)).find(|&k| cs[k].is_lowercase() && cs[k + 1].is_uppercase());
            i = match hump {
                Some(k) => k + 1,
                None => end,
            };
        } else if is_apos(c) && cs[i..].iter().all(|&x| is_apos(x)) {
            i = n;
        } else {
            i += 1;
        }
        if i == start {
            i += 1;
        }
        out.push(cs[start..i].iter().collect());
    }
    out
}

/// Kokoro's phoneme vocabulary (`vocab.json`: symbol -> id).
#[derive(Debug, Clone)]
pub struct PhonemeVocab {
    map: std::collections::HashMap<char, u32>,
}

impl PhonemeVocab {
    /// From the model config's vocabulary (single-character symbols; others are ignored).
    pub fn new(vocab: &std::collections::BTreeMap<String, u32>) -> Result<Self> {
        let mut map = std::collections::HashMap::new();
        for (k, &v) in vocab {
            let mut cs = k.chars();
            if let (Some(c), None) = (cs.next(), cs.next()) {
                map.insert(c, v);
            }
        }
        if map.is_empty() {
            return Err(Error::Input("the phoneme vocabulary is empty (no vocab.json?)".into()));
        }
        Ok(Self { map })
    }

    /// From a `vocab.json` file (`{"vocab": {...}}` or a bare map).
    pub fn from_file(path: &Path) -> Result<Self> {
        Self::new(&crate::model::read_vocab(path)?)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn contains(&self, c: char) -> bool {
        self.map.contains_key(&c)
    }

    /// Phonemes -> ids. Symbols outside the vocabulary are skipped with a `tracing` warning
    /// (and returned in the second value), never an error: the G2P only writes vocabulary
    /// symbols, so a skip means hand-written phonemes with a foreign symbol.
    pub fn encode(&self, phonemes: &str) -> (Vec<u32>, Vec<char>) {
        let mut ids = Vec::with_capacity(phonemes.len());
        let mut skipped = Vec::new();
        for c in phonemes.chars() {
            match self.map.get(&c) {
                Some(&id) => ids.push(id),
                None => skipped.push(c),
            }
        }
        if !skipped.is_empty() {
            tracing::warn!(?skipped, "phonemes outside Kokoro's vocabulary skipped");
        }
        (ids, skipped)
    }
}

/// misaki's `Lexicon.__call__` for one token: its phonemes, or `None` when the lexicons,
/// rules and number readings have nothing (the caller's fallback decides). `currency` is the
/// symbol before a number (`$`, `£`, `€`); `is_head` is false for the non-first piece of a
/// word written without spaces (digits there are read one by one). Here rather than in
/// `lexicon` so that `numbers` (which looks words up) sits between the two.
fn lexicon_lookup(lex: &Lexicon, text: &str, currency: Option<char>, is_head: bool, mode: Mode) -> Option<String> {
    let word: String = text.chars().map(|c| if c == '‘' || c == '’' { '\'' } else { c }).collect();
    let stress = if lexicon::is_lower(&word) {
        None
    } else if lexicon::is_upper(&word) {
        Some(2.0)
    } else {
        Some(0.5)
    };
    if let Some(ps) = lex.get_word(&word, stress, mode) {
        // a currency symbol before a word read as a word: its unit, in the plural, after it
        return Some(match currency.and_then(numbers::currency_units).and_then(|(unit, _)| lex.plural(unit)) {
            Some(c) => format!("{ps} {c}"),
            None => ps,
        });
    }
    if numbers::is_number(&word, is_head) {
        return numbers::get_number(lex, &word, currency, is_head);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subtokens_like_misaki() {
        assert_eq!(subtokenize("iPhone"), ["i", "Phone"]);
        assert_eq!(subtokenize("McDonald"), ["Mc", "Donald"]);
        assert_eq!(subtokenize("well-known"), ["well", "-", "known"]);
        assert_eq!(subtokenize("don't"), ["don't"]);
        assert_eq!(subtokenize("5km"), ["5", "km"]);
        assert_eq!(subtokenize("1,234.5"), ["1,234.5"]);
        assert_eq!(subtokenize("-7"), ["-7"]);
        assert_eq!(subtokenize("dogs'"), ["dogs", "'"]);
        assert_eq!(subtokenize("a/b"), ["a", "/", "b"]);
    }
}
