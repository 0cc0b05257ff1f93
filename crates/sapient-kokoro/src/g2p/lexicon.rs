//! misaki's US English lexicons (`us_gold.json`, `us_silver.json`: word -> phonemes in
//! Kokoro's alphabet, some entries keyed by part of speech) and the word-level rules of
//! `misaki.en.Lexicon` (0.9.4): gold before silver, capitalised and all-caps forms, stress
//! marks, `-s` / `-ed` / `-ing` / `'s` suffixes on known stems, letters spelled out for
//! all-caps words, numbers through [`super::numbers`].
//!
//! We have no part-of-speech tagger: entries keyed by tag take their `DEFAULT` (or the
//! `None` variant at the end of a sentence, as misaki does), and the few words misaki
//! decides by tag (`a`, `I`, `in`, ...) use the readings that are right in running text.

use crate::{Error, Result};
use std::path::Path;

pub(crate) const PRIMARY: char = 'ˈ';
pub(crate) const SECONDARY: char = 'ˌ';
const VOWELS: &str = "AIOQWYaiuæɑɒɔəɛɜɪʊʌᵻ";
pub(crate) const CONSONANTS: &str = "bdfhjklmnpstvwzðŋɡɹɾʃʒʤʧθ";
const US_TAUS: &str = "AIOWYiuæɑəɛɪɹʊʌ";
const DIPHTHONGS: &str = "AIOQWYʤʧ";

pub(crate) fn is_vowel(c: char) -> bool {
    VOWELS.contains(c)
}

/// misaki's `stress_weight`: diphthongs and affricates count double.
pub(crate) fn stress_weight(ps: &str) -> usize {
    ps.chars().map(|c| if DIPHTHONGS.contains(c) { 2 } else { 1 }).sum()
}

/// One lexicon value: a phoneme string, or readings by part of speech.
#[derive(Debug, Clone, Copy)]
enum Entry<'a> {
    Plain(&'a str),
    Tagged {
        default: Option<&'a str>,
        /// The `"None"` key: the reading when nothing follows (end of sentence).
        at_end: Option<Option<&'a str>>,
    },
}

/// A stretch of [`Table::text`].
#[derive(Debug, Clone, Copy)]
struct Span {
    at: u32,
    len: u32,
}

/// `Slot::val.len` of a tagged entry; its `at` is then the index in [`Table::tagged`].
const TAGGED: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Slot {
    key: Span,
    val: Span,
}

#[derive(Debug, Clone, Copy)]
struct TaggedSpans {
    default: Option<Span>,
    at_end: Option<Option<Span>>,
}

/// One lexicon, compact: every key and reading in one string, the entries (16 bytes each)
/// sorted by key and found by binary search. A map of `String`s took about 30 MB of heap per
/// lexicon (two allocations and a bucket per entry); this takes about 6.
#[derive(Debug, Default)]
struct Table {
    text: String,
    slots: Vec<Slot>,
    tagged: Vec<TaggedSpans>,
}

impl Table {
    fn push_str(&mut self, s: &str) -> Option<Span> {
        let at = u32::try_from(self.text.len()).ok()?;
        let len = u32::try_from(s.len()).ok().filter(|&l| l != TAGGED)?;
        at.checked_add(len)?;
        self.text.push_str(s);
        Some(Span { at, len })
    }

    fn str(&self, s: Span) -> &str {
        let at = s.at as usize;
        self.text.get(at..at + s.len as usize).unwrap_or("")
    }

    fn key(&self, i: usize) -> &str {
        self.str(self.slots[i].key)
    }

    fn find(&self, w: &str) -> Option<usize> {
        self.slots.binary_search_by(|s| self.str(s.key).cmp(w)).ok()
    }

    fn get(&self, w: &str) -> Option<Entry<'_>> {
        let val = self.slots[self.find(w)?].val;
        if val.len != TAGGED {
            return Some(Entry::Plain(self.str(val)));
        }
        let t = self.tagged.get(val.at as usize)?;
        Some(Entry::Tagged {
            default: t.default.map(|s| self.str(s)),
            at_end: t.at_end.map(|v| v.map(|s| self.str(s))),
        })
    }

    fn contains_key(&self, w: &str) -> bool {
        self.find(w).is_some()
    }

    fn len(&self) -> usize {
        self.slots.len()
    }

    /// Sorted by key, the later of equal keys kept (as a JSON object read into a map).
    fn sort_dedup(&mut self) {
        let text = std::mem::take(&mut self.text);
        let k = |s: &Slot| &text[s.key.at as usize..(s.key.at + s.key.len) as usize];
        // stable: equal keys stay in file order, and the last of each run is kept
        self.slots.sort_by(|a, b| k(a).cmp(k(b)));
        let mut out: Vec<Slot> = Vec::with_capacity(self.slots.len());
        for s in self.slots.drain(..) {
            match out.last_mut() {
                Some(last) if k(last) == k(&s) => *last = s,
                _ => out.push(s),
            }
        }
        self.slots = out;
        self.text = text;
    }
}

/// Reads the lexicon's JSON object entry by entry into a [`Table`] (no map of every value
/// beside it).
struct TableVisitor;

impl<'de> serde::de::Visitor<'de> for TableVisitor {
    type Value = Table;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an object of word -> phonemes (a string, or an object of readings by tag)")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> std::result::Result<Table, A::Error> {
        use serde::de::Error as _;
        let mut t = Table::default();
        let too_big = || A::Error::custom("lexicon over 4 GB");
        while let Some(k) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            let v: serde_json::Value = map.next_value()?;
            let key = t.push_str(&k).ok_or_else(too_big)?;
            let val = match v {
                serde_json::Value::String(s) => t.push_str(&s).ok_or_else(too_big)?,
                serde_json::Value::Object(m) => {
                    let mut get = |tag: &str| -> Result<Option<Option<Span>>, A::Error> {
                        match m.get(tag) {
                            None => Ok(None),
                            Some(x) => match x.as_str() {
                                Some(s) => Ok(Some(Some(t.push_str(s).ok_or_else(too_big)?))),
                                None => Ok(Some(None)),
                            },
                        }
                    };
                    let default = get("DEFAULT")?.flatten();
                    let at_end = get("None")?;
                    let at = u32::try_from(t.tagged.len()).map_err(|_| too_big())?;
                    t.tagged.push(TaggedSpans { default, at_end });
                    Span { at, len: TAGGED }
                }
                other => return Err(A::Error::custom(format!("entry {k:?}: not a string or object: {other}"))),
            };
            t.slots.push(Slot { key, val });
        }
        Ok(t)
    }
}

/// The right context misaki carries from the following word.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Ctx {
    /// `Some(true)`: the next word starts with a vowel sound; `Some(false)`: a consonant;
    /// `None`: nothing follows in this clause (punctuation or end).
    pub future_vowel: Option<bool>,
}

/// Word lookups. `tagged` selects the readings for running text (see the module docs);
/// without it the rules are misaki's with no part-of-speech tag.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mode {
    pub running_text: bool,
    pub ctx: Option<Ctx>,
}

/// The gold and silver lexicons, with misaki's capitalisation variants added.
pub struct Lexicon {
    gold: Table,
    silver: Table,
}

const SYMBOLS: [(&str, &str); 4] = [("%", "percent"), ("&", "and"), ("+", "plus"), ("@", "at")];

fn symbol_word(w: &str) -> Option<&'static str> {
    SYMBOLS.iter().find(|(s, _)| *s == w).map(|(_, n)| *n)
}

/// Python's `str.capitalize` (first char upper, the rest lower).
fn capitalize(w: &str) -> String {
    let mut cs = w.chars();
    match cs.next() {
        Some(f) => f.to_uppercase().chain(cs.flat_map(|c| c.to_lowercase())).collect(),
        None => String::new(),
    }
}

fn is_alpha(w: &str) -> bool {
    !w.is_empty() && w.chars().all(char::is_alphabetic)
}

fn is_lexicon_chars(w: &str) -> bool {
    w.chars().all(|c| c.is_ascii_alphabetic() || c == '\'' || c == '-')
}

pub(crate) fn is_upper(w: &str) -> bool {
    w.to_uppercase() == w
}

pub(crate) fn is_lower(w: &str) -> bool {
    w.to_lowercase() == w
}

/// misaki's `apply_stress`: `stress` < -1 drops all marks, -1 (or <= 0 with a primary) demotes,
/// 0..1 adds a secondary to an unmarked word, >= 1 promotes a lone secondary, > 1 adds a
/// primary to an unmarked word.
pub(crate) fn apply_stress(ps: &str, stress: Option<f32>) -> String {
    let Some(s) = stress else { return ps.to_string() };
    let has_p = ps.contains(PRIMARY);
    let has_s = ps.contains(SECONDARY);
    let has_vowel = ps.chars().any(is_vowel);
    if s < -1.0 {
        ps.replace([PRIMARY, SECONDARY], "")
    } else if s == -1.0 || ((s == 0.0 || s == -0.5) && has_p) {
        ps.replace(SECONDARY, "").replace(PRIMARY, &SECONDARY.to_string())
    } else if (s == 0.0 || s == 0.5 || s == 1.0) && !has_p && !has_s {
        if !has_vowel {
            return ps.to_string();
        }
        restress(&format!("{SECONDARY}{ps}"))
    } else if s >= 1.0 && !has_p && has_s {
        ps.replace(SECONDARY, &PRIMARY.to_string())
    } else if s > 1.0 && !has_p && !has_s {
        if !has_vowel {
            return ps.to_string();
        }
        restress(&format!("{PRIMARY}{ps}"))
    } else {
        ps.to_string()
    }
}

/// Moves each stress mark to just before the next vowel.
fn restress(ps: &str) -> String {
    let cs: Vec<char> = ps.chars().collect();
    let mut keyed: Vec<(f64, char)> = cs.iter().enumerate().map(|(i, &c)| (i as f64, c)).collect();
    for (i, &c) in cs.iter().enumerate() {
        if c == PRIMARY || c == SECONDARY {
            if let Some(j) = (i..cs.len()).find(|&j| is_vowel(cs[j])) {
                keyed[i].0 = j as f64 - 0.5;
            }
        }
    }
    keyed.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    keyed.into_iter().map(|(_, c)| c).collect()
}

fn parse_lexicon(path: &Path) -> Result<Table> {
    let bad = |what: String| Error::Config {
        path: path.to_path_buf(),
        what: format!("lexicon: {what}"),
    };
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let mut de = serde_json::Deserializer::from_str(&text);
    let mut t = serde::Deserializer::deserialize_map(&mut de, TableVisitor).map_err(|e| bad(e.to_string()))?;
    de.end().map_err(|e| bad(e.to_string()))?;
    drop(text);
    t.sort_dedup();
    // misaki's grow_dictionary: "word" also answers "Word", and "Word" answers "word" (the
    // reading shared, only the new key stored)
    let mut extra: Vec<(String, Span)> = Vec::new();
    for (i, slot) in t.slots.iter().enumerate() {
        let k = t.key(i);
        if k.chars().count() < 2 {
            continue;
        }
        let lower = k.to_lowercase();
        let new = if k == lower {
            Some(capitalize(k)).filter(|cap| cap != k)
        } else if k == capitalize(&lower) {
            Some(lower)
        } else {
            None
        };
        if let Some(n) = new.filter(|n| !t.contains_key(n)) {
            extra.push((n, slot.val));
        }
    }
    // two entries growing the same key: the first (in key order) wins
    extra.sort_by(|a, b| a.0.cmp(&b.0));
    extra.dedup_by(|later, first| later.0 == first.0);
    for (k, val) in extra {
        let key = t.push_str(&k).ok_or_else(|| bad("over 4 GB".into()))?;
        t.slots.push(Slot { key, val });
    }
    t.sort_dedup();
    t.text.shrink_to_fit();
    t.slots.shrink_to_fit();
    t.tagged.shrink_to_fit();
    Ok(t)
}

impl Lexicon {
    /// Reads `us_gold.json` and `us_silver.json` (the `kokoro-82m` preset's `lexicon` files).
    pub fn load(gold: &Path, silver: &Path) -> Result<Self> {
        Ok(Self {
            gold: parse_lexicon(gold)?,
            silver: parse_lexicon(silver)?,
        })
    }

    /// Entries in the gold lexicon (capitalisation variants included).
    pub fn gold_len(&self) -> usize {
        self.gold.len()
    }

    fn gold_str(&self, w: &str) -> Option<String> {
        match self.gold.get(w)? {
            Entry::Plain(s) => Some(s.to_string()),
            Entry::Tagged { default, .. } => default.map(str::to_string),
        }
    }

    fn resolve(e: Entry<'_>, ctx: Option<Ctx>) -> Option<String> {
        match e {
            Entry::Plain(s) => Some(s.to_string()),
            Entry::Tagged { default, at_end } => {
                if let (Some(c), Some(v)) = (ctx, at_end) {
                    if c.future_vowel.is_none() {
                        return v.map(str::to_string);
                    }
                }
                default.map(str::to_string)
            }
        }
    }

    /// Letters spelled out (`get_NNP`): "FBI" -> ˌɛfbˌiˈI.
    pub(crate) fn spell(&self, word: &str) -> Option<String> {
        let mut ps = String::new();
        for c in word.chars().filter(|c| c.is_alphabetic()) {
            ps.push_str(&self.gold_str(&c.to_uppercase().to_string())?);
        }
        let ps = apply_stress(&ps, Some(0.0));
        Some(match ps.rfind(SECONDARY) {
            Some(i) => format!("{}{PRIMARY}{}", &ps[..i], &ps[i + SECONDARY.len_utf8()..]),
            None => ps,
        })
    }

    /// The gold (else silver) entry of exactly this spelling, default reading.
    pub(crate) fn lookup_plain(&self, w: &str) -> Option<String> {
        self.gold
            .get(w)
            .or_else(|| self.silver.get(w))
            .and_then(|e| Self::resolve(e, None))
    }

    fn is_known(&self, word: &str) -> bool {
        if self.gold.contains_key(word) || symbol_word(word).is_some() || self.silver.contains_key(word) {
            return true;
        }
        if !is_alpha(word) || !is_lexicon_chars(word) {
            return false;
        }
        if word.chars().count() == 1 {
            return true;
        }
        if word == word.to_uppercase() && self.gold.contains_key(&word.to_lowercase()) {
            return true;
        }
        let rest: String = word.chars().skip(1).collect();
        rest == rest.to_uppercase()
    }

    pub(crate) fn lookup(&self, word: &str, stress: Option<f32>, ctx: Option<Ctx>) -> Option<String> {
        let mut word = word.to_string();
        if is_upper(&word) && !self.gold.contains_key(&word) {
            word = word.to_lowercase();
        }
        let ps = match self.gold.get(&word) {
            Some(e) => Self::resolve(e, ctx),
            None => self.silver.get(&word).and_then(|e| Self::resolve(e, ctx)),
        };
        match ps {
            Some(ps) => Some(apply_stress(&ps, stress)),
            None => self.spell(&word),
        }
    }

    pub(crate) fn suffix_s(stem: &str) -> Option<String> {
        let last = stem.chars().last()?;
        Some(if "ptkfθ".contains(last) {
            format!("{stem}s")
        } else if "szʃʒʧʤ".contains(last) {
            format!("{stem}ᵻz")
        } else {
            format!("{stem}z")
        })
    }

    fn stem_s(&self, word: &str, stress: Option<f32>, ctx: Option<Ctx>) -> Option<String> {
        let n = word.chars().count();
        if n < 3 || !word.ends_with('s') {
            return None;
        }
        let stem = if !word.ends_with("ss") && self.is_known(&word[..word.len() - 1]) {
            word[..word.len() - 1].to_string()
        } else if (word.ends_with("'s") || (n > 4 && word.ends_with("es") && !word.ends_with("ies")))
            && self.is_known(&word[..word.len() - 2])
        {
            word[..word.len() - 2].to_string()
        } else if n > 4 && word.ends_with("ies") && self.is_known(&format!("{}y", &word[..word.len() - 3])) {
            format!("{}y", &word[..word.len() - 3])
        } else {
            return None;
        };
        Self::suffix_s(&self.lookup(&stem, stress, ctx)?)
    }

    pub(crate) fn suffix_ed(stem: &str) -> Option<String> {
        let cs: Vec<char> = stem.chars().collect();
        let last = *cs.last()?;
        Some(if "pkfθʃsʧ".contains(last) {
            format!("{stem}t")
        } else if last == 'd' {
            format!("{stem}ᵻd")
        } else if last != 't' {
            format!("{stem}d")
        } else if cs.len() < 2 {
            format!("{stem}ɪd")
        } else if US_TAUS.contains(cs[cs.len() - 2]) {
            format!("{}ɾᵻd", &stem[..stem.len() - 't'.len_utf8()])
        } else {
            format!("{stem}ᵻd")
        })
    }

    fn stem_ed(&self, word: &str, stress: Option<f32>, ctx: Option<Ctx>) -> Option<String> {
        let n = word.chars().count();
        if n < 4 || !word.ends_with('d') {
            return None;
        }
        let stem = if !word.ends_with("dd") && self.is_known(&word[..word.len() - 1]) {
            &word[..word.len() - 1]
        } else if n > 4 && word.ends_with("ed") && !word.ends_with("eed") && self.is_known(&word[..word.len() - 2]) {
            &word[..word.len() - 2]
        } else {
            return None;
        };
        Self::suffix_ed(&self.lookup(stem, stress, ctx)?)
    }

    pub(crate) fn suffix_ing(stem: &str) -> Option<String> {
        let cs: Vec<char> = stem.chars().collect();
        if cs.is_empty() {
            return None;
        }
        if cs.len() > 1 && cs[cs.len() - 1] == 't' && US_TAUS.contains(cs[cs.len() - 2]) {
            return Some(format!("{}ɾɪŋ", &stem[..stem.len() - 1]));
        }
        Some(format!("{stem}ɪŋ"))
    }

    fn stem_ing(&self, word: &str, stress: Option<f32>, ctx: Option<Ctx>) -> Option<String> {
        let n = word.chars().count();
        if n < 5 || !word.ends_with("ing") {
            return None;
        }
        let base = &word[..word.len() - 3];
        let doubled = {
            let cs: Vec<char> = word.chars().collect();
            let k = cs.len();
            (k >= 5 && cs[k - 4] == cs[k - 5] && "bcdgklmnprstvxz".contains(cs[k - 4])) || word.ends_with("cking")
        };
        let stem = if n > 5 && self.is_known(base) {
            base.to_string()
        } else if self.is_known(&format!("{base}e")) {
            format!("{base}e")
        } else if n > 5 && doubled && self.is_known(&word[..word.len() - 4]) {
            word[..word.len() - 4].to_string()
        } else {
            return None;
        };
        Self::suffix_ing(&self.lookup(&stem, stress, ctx)?)
    }

    fn special_case(&self, word: &str, stress: Option<f32>, mode: Mode) -> Option<String> {
        let fv = mode.ctx.and_then(|c| c.future_vowel);
        if let Some(w) = symbol_word(word) {
            return self.lookup(w, None, mode.ctx);
        }
        let trimmed = word.trim_matches('.');
        if trimmed.contains('.')
            && is_alpha(&word.replace('.', ""))
            && word.split('.').map(|p| p.chars().count()).max().unwrap_or(0) < 3
        {
            return self.spell(word);
        }
        match word {
            "a" | "A" => Some(if mode.running_text { "ɐ" } else { "ˈA" }.to_string()),
            "am" | "Am" | "AM" => {
                if fv.is_none() || word != "am" || stress.is_some_and(|s| s > 0.0) {
                    self.gold_str("am")
                } else {
                    Some("ɐm".into())
                }
            }
            "an" | "An" | "AN" => Some("ɐn".into()),
            "I" if mode.running_text => Some(format!("{SECONDARY}I")),
            "to" | "To" => match fv {
                None => self.gold_str("to"),
                Some(false) => Some("tə".into()),
                Some(true) => Some("tʊ".into()),
            },
            "in" | "In" => {
                let primary = fv.is_none() || !mode.running_text;
                Some(format!("{}ɪn", if primary { "ˈ" } else { "" }))
            }
            "the" | "The" => Some(if fv == Some(true) { "ði" } else { "ðə" }.into()),
            "vs" | "vs." | "Vs." if mode.running_text => self.lookup("versus", None, mode.ctx),
            "used" | "Used" | "USED" => match self.gold.get("used") {
                Some(Entry::Tagged { default, .. }) => default.map(str::to_string),
                Some(Entry::Plain(s)) => Some(s.to_string()),
                None => None,
            },
            _ => None,
        }
    }

    pub(crate) fn get_word(&self, word: &str, stress: Option<f32>, mode: Mode) -> Option<String> {
        if let Some(ps) = self.special_case(word, stress, mode) {
            return Some(ps);
        }
        let ctx = mode.ctx;
        let wl = word.to_lowercase();
        let mut word = word.to_string();
        let rest: String = word.chars().skip(1).collect();
        if word.chars().count() > 1
            && is_alpha(&word.replace('\'', ""))
            && word != wl
            && !self.gold.contains_key(&word)
            && !self.silver.contains_key(&word)
            && (is_upper(&word) || is_lower(&rest))
            && (self.gold.contains_key(&wl)
                || self.silver.contains_key(&wl)
                || self.stem_s(&wl, stress, ctx).is_some()
                || self.stem_ed(&wl, stress, ctx).is_some()
                || self.stem_ing(&wl, stress, ctx).is_some())
        {
            word = wl;
        }
        if self.is_known(&word) {
            return self.lookup(&word, stress, ctx);
        }
        if let Some(base) = word.strip_suffix("s'") {
            let alt = format!("{base}'s");
            if self.is_known(&alt) {
                return self.lookup(&alt, stress, ctx);
            }
        }
        if let Some(base) = word.strip_suffix('\'') {
            if self.is_known(base) {
                return self.lookup(base, stress, ctx);
            }
        }
        self.stem_s(&word, stress, ctx)
            .or_else(|| self.stem_ed(&word, stress, ctx))
            .or_else(|| self.stem_ing(&word, Some(stress.unwrap_or(0.5)), ctx))
    }

    pub(crate) fn plural(&self, unit: &str) -> Option<String> {
        self.stem_s(&format!("{unit}s"), None, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stress_rules() {
        assert_eq!(apply_stress("həlˈO", Some(-2.0)), "həlO");
        assert_eq!(apply_stress("həlˈO", Some(-1.0)), "həlˌO");
        assert_eq!(apply_stress("wʌn", Some(2.0)), "wˈʌn");
        assert_eq!(apply_stress("wʌn", Some(0.0)), "wˌʌn");
        assert_eq!(apply_stress("ɛnˌi", Some(1.0)), "ɛnˈi");
        assert_eq!(apply_stress("st", Some(2.0)), "st");
    }

    #[test]
    fn table_reads_entries_tags_duplicates_and_grows_cases() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("lex.json");
        let json = r#"{"hello": "həlˈO", "Paris": "pˈɛɹɪs", "used": {"DEFAULT": "jˈuzd", "VBD": "jˈust", "None": null},
            "read": {"DEFAULT": "ɹˈid", "None": "ɹˈɛd"}, "x": "ˈɛks", "hello": "hɛlˈO", "caf\u00e9": "kæfˈA", "NASA": "nˈæsə"}"#;
        std::fs::write(&p, json).unwrap();
        let t = parse_lexicon(&p).unwrap();
        // the later of two equal keys, as a JSON object read into a map
        assert!(matches!(t.get("hello"), Some(Entry::Plain("hɛlˈO"))));
        // grown: lower -> Capitalised and Capitalised -> lower, one letter and all-caps not
        assert!(matches!(t.get("Hello"), Some(Entry::Plain("hɛlˈO"))));
        assert!(matches!(t.get("paris"), Some(Entry::Plain("pˈɛɹɪs"))));
        assert!(matches!(t.get("Café"), Some(Entry::Plain("kæfˈA"))));
        assert!(t.get("X").is_none() && t.get("nasa").is_none() && t.get("Nasa").is_none());
        assert!(matches!(t.get("used"), Some(Entry::Tagged { default: Some("jˈuzd"), at_end: Some(None) })));
        assert!(matches!(t.get("Read"), Some(Entry::Tagged { default: Some("ɹˈid"), at_end: Some(Some("ɹˈɛd")) })));
        assert!(t.get("hell").is_none() && t.get("").is_none() && t.get("zzz").is_none());
        // hello Hello Paris paris used Used read Read x café Café NASA
        assert_eq!(t.len(), 12);

        for bad in [r#"{"a": 1}"#, r#"["a"]"#, r#"{"a": "b""#, r#"{"a": "b"} x"#] {
            std::fs::write(&p, bad).unwrap();
            assert!(matches!(parse_lexicon(&p), Err(Error::Config { .. })), "{bad}");
        }
    }

    #[test]
    fn capitalize_like_python() {
        assert_eq!(capitalize("hELLO"), "Hello");
        assert_eq!(capitalize("'tis"), "'tis");
    }
}
