//! Random GBNF grammars against a reference matcher written here, independent of the engine:
//! a grammar is generated as a small tree, written out as GBNF text, compiled with
//! `Grammar::gbnf`, and the texts it accepts are compared with the tree's own meaning (the set
//! of positions each part can end at, memoized per rule and position). Recursion is only ever
//! entered after a literal, so no grammar is left-recursive. The texts: ones derived from the
//! tree (mostly accepted) and random ones over the same characters (mostly refused).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sapient_sample::{Constraint, Grammar, GrammarError};
use std::collections::{BTreeSet, HashMap};

#[derive(Debug, Clone)]
enum E {
    Lit(String),
    /// Characters, or every character but these.
    Class(Vec<char>, bool),
    Any,
    Ref(usize),
    Seq(Vec<E>),
    Alt(Vec<E>),
    Rep(Box<E>, u32, Option<u32>),
}

const CHARS: [char; 6] = ['a', 'b', 'c', '(', ')', 'é'];

fn lit(rng: &mut StdRng) -> E {
    let n = rng.random_range(1..=2);
    E::Lit((0..n).map(|_| CHARS[rng.random_range(0..CHARS.len())]).collect())
}

/// A random expression of rule `me` among `n` rules; references to rules at or before `me`
/// come right after a literal.
fn expr(rng: &mut StdRng, me: usize, n: usize, depth: u32) -> E {
    let leaf = depth == 0 || rng.random_range(0..3) == 0;
    if leaf {
        return match rng.random_range(0..6) {
            0 | 1 => lit(rng),
            2 => E::Class((0..rng.random_range(1..=3)).map(|_| CHARS[rng.random_range(0..CHARS.len())]).collect(), rng.random_range(0..4) == 0),
            3 => E::Any,
            _ => {
                let r = rng.random_range(0..n);
                if r <= me { E::Seq(vec![lit(rng), E::Ref(r)]) } else { E::Ref(r) }
            }
        };
    }
    match rng.random_range(0..3) {
        0 => E::Seq((0..rng.random_range(2..=3)).map(|_| expr(rng, me, n, depth - 1)).collect()),
        1 => E::Alt((0..rng.random_range(2..=3)).map(|_| expr(rng, me, n, depth - 1)).collect()),
        _ => {
            let min = rng.random_range(0..=2);
            let max = if rng.random_range(0..2) == 0 { None } else { Some(min + rng.random_range(0..=2)) };
            E::Rep(Box::new(expr(rng, me, n, depth - 1)), min, max)
        }
    }
}

fn esc(c: char) -> String {
    match c {
        '"' | '\\' | '[' | ']' | '-' => format!("\\{c}"),
        'é' => "\\u00e9".into(),
        c => c.to_string(),
    }
}

fn write(e: &E) -> String {
    match e {
        E::Lit(s) => format!("\"{}\"", s.chars().map(esc).collect::<String>()),
        E::Class(cs, neg) => format!("[{}{}]", if *neg { "^" } else { "" }, cs.iter().map(|&c| esc(c)).collect::<String>()),
        E::Any => ".".into(),
        E::Ref(r) => format!("r{r}"),
        E::Seq(v) => format!("({})", v.iter().map(write).collect::<Vec<_>>().join(" ")),
        E::Alt(v) => format!("({})", v.iter().map(write).collect::<Vec<_>>().join(" | ")),
        E::Rep(x, min, max) => match (min, max) {
            (0, None) => format!("{}*", write(x)),
            (1, None) => format!("{}+", write(x)),
            (0, Some(1)) => format!("{}?", write(x)),
            (m, None) => format!("{}{{{m},}}", write(x)),
            (m, Some(k)) if m == k => format!("{}{{{m}}}", write(x)),
            (m, Some(k)) => format!("{}{{{m},{k}}}", write(x)),
        },
    }
}

/// The reference: where `e` can end when started at `pos` of `t`.
struct Ref<'a> {
    rules: &'a [E],
    t: Vec<char>,
    memo: HashMap<(usize, usize), BTreeSet<usize>>,
}

impl Ref<'_> {
    fn ends(&mut self, e: &E, pos: usize) -> BTreeSet<usize> {
        let t = &self.t;
        match e {
            E::Lit(s) => {
                let s: Vec<char> = s.chars().collect();
                if t[pos..].starts_with(&s) { [pos + s.len()].into() } else { BTreeSet::new() }
            }
            E::Class(cs, neg) => t.get(pos).filter(|c| cs.contains(c) != *neg).map(|_| [pos + 1].into()).unwrap_or_default(),
            E::Any => if pos < t.len() { [pos + 1].into() } else { BTreeSet::new() },
            E::Ref(r) => {
                if let Some(s) = self.memo.get(&(*r, pos)) {
                    return s.clone();
                }
                let rules = self.rules;
                let s = self.ends(&rules[*r], pos);
                self.memo.insert((*r, pos), s.clone());
                s
            }
            E::Seq(v) => {
                let mut cur: BTreeSet<usize> = [pos].into();
                for x in v {
                    cur = cur.iter().flat_map(|&p| self.ends(x, p)).collect();
                }
                cur
            }
            E::Alt(v) => v.iter().flat_map(|x| self.ends(x, pos)).collect(),
            E::Rep(x, min, max) => {
                let mut level: BTreeSet<usize> = [pos].into();
                let mut out = BTreeSet::new();
                let mut k = 0;
                loop {
                    if k >= *min {
                        let before = out.len();
                        out.extend(level.iter().copied());
                        // Unbounded, past the minimum: stop once nothing new is reached.
                        if max.is_none() && out.len() == before && k > *min {
                            break;
                        }
                    }
                    if max.is_some_and(|m| k >= m) || level.is_empty() {
                        break;
                    }
                    level = level.iter().flat_map(|&p| self.ends(x, p)).collect();
                    k += 1;
                }
                out
            }
        }
    }
}

fn accepts(rules: &[E], text: &str) -> bool {
    let mut r = Ref { rules, t: text.chars().collect(), memo: HashMap::new() };
    let n = r.t.len();
    r.ends(&E::Ref(0), 0).contains(&n)
}

/// A random text of `e` (`None` when the depth runs out).
fn derive(rules: &[E], e: &E, rng: &mut StdRng, depth: u32) -> Option<String> {
    Some(match e {
        E::Lit(s) => s.clone(),
        E::Class(cs, false) => cs[rng.random_range(0..cs.len())].to_string(),
        E::Class(cs, true) => CHARS.iter().chain(['x', '\n'].iter()).find(|c| !cs.contains(c))?.to_string(),
        E::Any => CHARS[rng.random_range(0..CHARS.len())].to_string(),
        E::Ref(r) => {
            if depth == 0 {
                return None;
            }
            derive(rules, &rules[*r], rng, depth - 1)?
        }
        E::Seq(v) => v.iter().map(|x| derive(rules, x, rng, depth)).collect::<Option<String>>()?,
        E::Alt(v) => {
            let start = rng.random_range(0..v.len());
            (0..v.len()).find_map(|i| derive(rules, &v[(start + i) % v.len()], rng, depth))?
        }
        E::Rep(x, min, max) => {
            let n = rng.random_range(*min..=max.unwrap_or(min + 2));
            (0..n).map(|_| derive(rules, x, rng, depth)).collect::<Option<String>>()?
        }
    })
}

#[test]
fn random_grammars_agree_with_the_reference() {
    let mut rng = StdRng::seed_from_u64(2024);
    let (mut compiled, mut refused, mut texts, mut accepted) = (0, 0, 0, 0);
    for case in 0..2000 {
        let n = rng.random_range(1..=4);
        let rules: Vec<E> = (0..n).map(|me| expr(&mut rng, me, n, 3)).collect();
        let src: String = rules.iter().enumerate().map(|(i, e)| format!("r{i} ::= {}\n", write(e))).collect::<String>() + "root ::= r0\n";
        let g = match Grammar::gbnf(&src) {
            Ok(g) => g,
            // The generator may write a rule that cannot finish, or a repetition of something
            // empty that recurses: refusals the module documents.
            Err(GrammarError::Gbnf { message, .. }) if message.contains("can never finish") || message.contains("empty text") => {
                refused += 1;
                continue;
            }
            Err(e) => panic!("case {case}: {e}\n{src}"),
        };
        compiled += 1;
        // Derived texts up to 40 characters (the reference is quadratic in the length).
        let mut cands: Vec<String> = (0..12).filter_map(|_| derive(&rules, &E::Ref(0), &mut rng, 4)).filter(|t| t.chars().count() <= 40).collect();
        cands.extend((0..12).map(|_| (0..rng.random_range(0..7)).map(|_| CHARS[rng.random_range(0..CHARS.len())]).collect::<String>()));
        for t in cands {
            let want = accepts(&rules, &t);
            let got = match g.matches(t.as_bytes()) {
                Ok(m) => m,
                Err(GrammarError::TooAmbiguous(_)) => continue,
                Err(e) => panic!("case {case}: {t:?}: {e}\n{src}"),
            };
            assert_eq!(got, want, "case {case}: {t:?}\n{src}");
            texts += 1;
            accepted += got as usize;
        }
    }
    println!("{compiled} grammars compiled, {refused} refused; {texts} texts compared, {accepted} accepted");
    assert!(compiled >= 1500 && texts >= 30_000 && accepted >= 10_000, "{compiled} {texts} {accepted}");
}
