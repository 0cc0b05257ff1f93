//! The English G2P on the real misaki lexicons of the `kokoro-82m` preset:
//!
//! - word level against misaki 0.9.4's own `Lexicon` (tests/data/g2p_misaki_words.json, from
//!   `scripts/kokoro/g2p_reference.py`: lexicon words, capitals, all-caps, suffix rules on
//!   unlisted inflections, symbols, cardinals/years/ordinals/decimals/currency, and words of
//!   this repository's docs); every word misaki reads must match exactly, and the words it
//!   has nothing for must get a fallback reading in Kokoro's vocabulary;
//! - sentence level: context rules misaki documents (the/to before vowels, punctuation kept),
//!   and that everything we write is in the model's `vocab.json`.

use anyhow::Result;
use sapient_kokoro::{G2p, PhonemeVocab};
use std::sync::OnceLock;

struct Fixture {
    g2p: G2p,
    vocab: PhonemeVocab,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let r = sapient_hub::Hub::new()
            .and_then(|h| h.fetch_preset("kokoro-82m", &mut |_| {}))
            .expect("fetch kokoro-82m");
        let lex = r.files("lexicon");
        let find = |name: &str| lex.iter().find(|p| p.ends_with(name)).expect(name).clone();
        Fixture {
            g2p: G2p::load(&find("us_gold.json"), &find("us_silver.json")).expect("lexicons"),
            vocab: PhonemeVocab::from_file(r.file("vocab").expect("vocab")).expect("vocab.json"),
        }
    })
}

#[derive(serde::Deserialize)]
struct Row {
    text: String,
    currency: Option<String>,
    phonemes: Option<String>,
}

#[derive(serde::Deserialize)]
struct Reference {
    words: Vec<Row>,
}

#[test]
fn words_match_misaki_lexicon() -> Result<()> {
    let f = fixture();
    let r: Reference = serde_json::from_str(include_str!("data/g2p_misaki_words.json"))?;
    let (mut agree, mut total, mut fallback) = (0, 0, 0);
    let mut bad = Vec::new();
    for row in &r.words {
        let cur = row.currency.as_deref().and_then(|c| c.chars().next());
        let ours = f.g2p.lexicon_word(&row.text, cur);
        match &row.phonemes {
            Some(want) => {
                total += 1;
                if ours.as_deref() == Some(want.as_str()) {
                    agree += 1;
                } else {
                    bad.push(format!("{:?} ({:?}): ours {:?}, misaki {want:?}", row.text, cur, ours));
                }
            }
            None => {
                // misaki has nothing (Kokoro would call espeak or drop the word): ours must
                // still say something, in the vocabulary
                let fb = f.g2p.word(&row.text).unwrap_or_default();
                assert!(!fb.is_empty(), "no fallback for {:?}", row.text);
                let (_, skipped) = f.vocab.encode(&fb);
                assert!(skipped.is_empty(), "{:?} -> {fb:?}: outside the vocabulary {skipped:?}", row.text);
                fallback += 1;
            }
        }
    }
    eprintln!("misaki agreement: {agree}/{total} words; {fallback} words only the fallback reads");
    assert!(total > 250 && fallback > 10);
    assert!(bad.is_empty(), "{} of {total} differ:\n{}", bad.len(), bad.join("\n"));
    Ok(())
}

#[test]
fn sentences_use_context_and_keep_punctuation() {
    let g = &fixture().g2p;
    assert_eq!(g.phonemize("Hello, world!"), "həlˈO, wˈɜɹld!");
    // misaki: "the" is ði before a vowel, ðə before a consonant; "to" tʊ / tə
    let a = g.phonemize("the apple to eat");
    assert!(a.starts_with("ði ") && a.contains(" tʊ "), "{a}");
    let b = g.phonemize("the pear to buy");
    assert!(b.starts_with("ðə ") && b.contains(" tə "), "{b}");
    // a standalone dash, quotes and parentheses become Kokoro's symbols
    let c = g.phonemize("He said \"yes\" - (twice).");
    assert!(c.contains('“') && c.contains('”') && c.contains('—') && c.contains('(') && c.contains(')'), "{c}");
    // numbers and currency in running text
    let d = g.phonemize("It cost $3.50 in 1984.");
    assert!(d.contains("θɹˈi dˈɑləɹz ænd fˈɪfti sˈɛnts") && d.contains("nˌIntˈin ˈATi fˈɔɹ"), "{d}");
    // nothing speakable
    assert_eq!(g.phonemize("   "), "");
    assert_eq!(g.phonemize("#*~"), "");
}

#[test]
fn all_output_is_in_kokoro_vocabulary() {
    let f = fixture();
    let text = "Dr. Smith's café opened at 7:30 a.m. on May 3rd, 2024 — its 1st week's sales hit €1,250.75 \
        (up 12%)! Xylophones, quokkas & zephyrs; the naïve coöperative's API uses JSON/HTTP. \
        \"Why?\" asked O'Brien... She emailed 3 co-workers: well-known, state-of-the-art stuff.";
    let ps = f.g2p.phonemize(text);
    let (ids, skipped) = f.vocab.encode(&ps);
    assert!(skipped.is_empty(), "outside the vocabulary: {skipped:?} in {ps}");
    assert!(ids.len() > 150, "{ps}");
    assert_eq!(f.vocab.len(), 114);
}

#[test]
fn arbitrary_text_never_panics_and_stays_in_the_vocabulary() {
    let f = fixture();
    // a fixed pseudo-random mix of letters, accented and foreign letters, digits, number
    // punctuation, apostrophes, symbols, emoji and whitespace
    let pool: Vec<char> = "aAbBeEiIoOsStTyYzZ éÉñßøœæÆ漢字ひらがなКирилл 0123456789 ,.'’‘-_/:;!?…—–\"“”()[]$£€%&+@#*~^|\\<>=`´ \n\t🙂"
        .chars()
        .collect();
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..2000 {
        let len = (next() % 40) as usize;
        let text: String = (0..len).map(|_| pool[(next() % pool.len() as u64) as usize]).collect();
        let ps = f.g2p.phonemize(&text);
        let (_, skipped) = f.vocab.encode(&ps);
        assert!(skipped.is_empty(), "{text:?} -> {ps:?}: {skipped:?}");
        for chunk in sapient_kokoro::text::chunks(&f.g2p, &text, sapient_kokoro::MAX_PHONEMES) {
            assert!(!chunk.phonemes.is_empty() && chunk.phonemes.chars().count() <= sapient_kokoro::MAX_PHONEMES);
        }
    }
}
