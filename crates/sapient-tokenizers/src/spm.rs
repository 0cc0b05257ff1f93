//! llama.cpp's SentencePiece (`tokenizer.ggml.model = llama`) encoder, step for step, so a
//! GGUF's text gives the ids llama.cpp gives:
//! 1. control, user-defined and unknown tokens written in the text are cut out first, longest
//!    token text first, each token splitting every piece of text still unsplit at all its
//!    occurrences (some models strip whitespace beside them);
//! 2. each remaining piece, with a leading space when the model adds one and the piece starts
//!    the text or follows a token of step 1, has its spaces replaced by `▁`, is split into
//!    UTF-8 characters, and adjacent symbols are merged while any pair forms a token: the pair
//!    whose token has the highest score first, the leftmost among equal scores;
//! 3. a symbol that is not a token becomes its bytes' `<0xNN>` tokens.
//!
//! The `tokenizers` BPE built beside it (merges ranked by score) gives the same ids in
//! nearly every case but differs where two different pairs make the same token, and it cuts
//! user-defined tokens out leftmost-longest rather than longest-first.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

/// GGUF token types (llama.cpp `llama_token_type`).
const TYPE_UNKNOWN: i128 = 2;
const TYPE_CONTROL: i128 = 3;
const TYPE_USER_DEFINED: i128 = 4;

struct Special {
    text: String,
    id: u32,
    /// Whitespace before the token is dropped (llama.cpp `LLAMA_TOKEN_ATTR_LSTRIP`).
    lstrip: bool,
    /// Whitespace after the token is dropped (`LLAMA_TOKEN_ATTR_RSTRIP`).
    rstrip: bool,
}

pub(crate) struct SpmEncoder {
    /// Token text to id; the last id wins where a text repeats, as in llama.cpp.
    ids: HashMap<String, u32>,
    scores: Vec<f32>,
    bytes: [Option<u32>; 256],
    unk: Option<u32>,
    /// Longest text first.
    specials: Vec<Special>,
    add_space_prefix: bool,
}

impl std::fmt::Debug for SpmEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpmEncoder")
            .field("tokens", &self.scores.len())
            .field("specials", &self.specials.len())
            .field("add_space_prefix", &self.add_space_prefix)
            .finish()
    }
}

enum Fragment<'a> {
    Text(&'a str),
    Token(u32),
}

#[derive(Clone, Copy)]
struct Symbol {
    /// Byte range in the escaped text.
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate merge: ordered by score, then leftmost first (llama.cpp `llm_bigram_spm`).
struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Bigram {
    fn cmp(&self, o: &Self) -> Ordering {
        self.score.total_cmp(&o.score).then_with(|| o.left.cmp(&self.left))
    }
}

impl SpmEncoder {
    /// `tokens`, `scores` and `types` are the GGUF arrays (of equal length); `model_name` is
    /// `general.name` (llama.cpp strips whitespace after Phi-3's special tokens).
    pub(crate) fn new(
        tokens: &[&str],
        scores: &[f32],
        types: &[i128],
        unk: Option<u32>,
        add_space_prefix: bool,
        model_name: &str,
    ) -> Self {
        let mut ids = HashMap::with_capacity(tokens.len());
        for (i, t) in tokens.iter().enumerate() {
            ids.insert(t.to_string(), i as u32);
        }
        let mut bytes = [None; 256];
        for (b, slot) in bytes.iter_mut().enumerate() {
            *slot = ids
                .get(&format!("<0x{b:02X}>"))
                .or_else(|| std::str::from_utf8(&[b as u8]).ok().and_then(|s| ids.get(s)))
                .copied();
        }
        let name = model_name.to_ascii_lowercase();
        let phi3 = name.contains("phi-3") || name.contains("phi3");
        let mut specials: Vec<Special> = tokens
            .iter()
            .zip(types)
            .enumerate()
            .filter(|(_, (t, &ty))| !t.is_empty() && matches!(ty, TYPE_UNKNOWN | TYPE_CONTROL | TYPE_USER_DEFINED))
            .map(|(i, (t, _))| Special {
                text: t.to_string(),
                id: i as u32,
                lstrip: false,
                rstrip: phi3 && !matches!(*t, "<unk>" | "<s>" | "<|endoftext|>"),
            })
            .collect();
        if phi3 {
            if let Some(&id) = ids.get("</s>") {
                if !specials.iter().any(|s| s.id == id) {
                    specials.push(Special { text: "</s>".into(), id, lstrip: false, rstrip: true });
                }
            }
        }
        specials.sort_by(|a, b| b.text.len().cmp(&a.text.len()).then(a.id.cmp(&b.id)));
        Self {
            ids,
            scores: scores.to_vec(),
            bytes,
            unk,
            specials,
            add_space_prefix,
        }
    }

    /// Token ids of `text` (no BOS/EOS); special tokens written in the text are parsed.
    pub(crate) fn encode(&self, text: &str, out: &mut Vec<u32>) {
        let mut prev_special = true;
        for f in self.partition(text) {
            match f {
                Fragment::Token(id) => {
                    out.push(id);
                    prev_special = true;
                }
                Fragment::Text(s) => {
                    let mut t = String::with_capacity(s.len() * 3 / 2 + 3);
                    if self.add_space_prefix && prev_special {
                        t.push('\u{2581}');
                    }
                    for c in s.chars() {
                        t.push(if c == ' ' { '\u{2581}' } else { c });
                    }
                    self.session(&t, out);
                    prev_special = false;
                }
            }
        }
    }

    /// Step 1: the text cut at the special tokens written in it.
    fn partition<'a>(&self, text: &'a str) -> Vec<Fragment<'a>> {
        let mut frags = vec![Fragment::Text(text)];
        if text.is_empty() {
            return Vec::new();
        }
        let mut present = [false; 256];
        for &b in text.as_bytes() {
            present[b as usize] = true;
        }
        for sp in &self.specials {
            if !present[sp.text.as_bytes()[0] as usize] {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len());
            for f in frags {
                let Fragment::Text(mut rest) = f else {
                    next.push(f);
                    continue;
                };
                while let Some(at) = rest.find(sp.text.as_str()) {
                    let mut left = &rest[..at];
                    if sp.lstrip {
                        left = left.trim_end_matches(|c: char| c.is_ascii_whitespace() || c == '\x0b');
                    }
                    if !left.is_empty() {
                        next.push(Fragment::Text(left));
                    }
                    next.push(Fragment::Token(sp.id));
                    rest = &rest[at + sp.text.len()..];
                    if sp.rstrip {
                        rest = rest.trim_start_matches(|c: char| c.is_ascii_whitespace() || c == '\x0b');
                    }
                }
                if !rest.is_empty() {
                    next.push(Fragment::Text(rest));
                }
            }
            frags = next;
        }
        frags
    }

    fn token(&self, s: &str) -> Option<u32> {
        self.ids.get(s).copied()
    }

    /// Steps 2 and 3 for one piece of escaped text.
    fn session(&self, text: &str, out: &mut Vec<u32>) {
        let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
        for (i, (start, c)) in text.char_indices().enumerate() {
            let len = c.len_utf8();
            symbols.push(Symbol {
                start,
                len,
                prev: i.checked_sub(1),
                next: (start + len < text.len()).then_some(i + 1),
            });
        }
        if symbols.is_empty() {
            return;
        }
        let mut queue = BinaryHeap::new();
        let add = |symbols: &[Symbol], queue: &mut BinaryHeap<Bigram>, l: Option<usize>, r: Option<usize>| {
            let (Some(l), Some(r)) = (l, r) else { return };
            let (a, b) = (symbols[l], symbols[r]);
            let s = &text[a.start..a.start + a.len + b.len];
            let Some(id) = self.token(s) else { return };
            let Some(&score) = self.scores.get(id as usize) else { return };
            queue.push(Bigram { left: l, right: r, score, size: s.len() });
        };
        for i in 1..symbols.len() {
            add(&symbols, &mut queue, Some(i - 1), Some(i));
        }
        while let Some(bg) = queue.pop() {
            let (l, r) = (symbols[bg.left], symbols[bg.right]);
            if l.len == 0 || r.len == 0 || l.len + r.len != bg.size {
                continue;
            }
            symbols[bg.left].len += r.len;
            symbols[bg.right].len = 0;
            symbols[bg.left].next = r.next;
            if let Some(n) = r.next {
                symbols[n].prev = Some(bg.left);
            }
            let (prev, next) = (symbols[bg.left].prev, symbols[bg.left].next);
            add(&symbols, &mut queue, prev, Some(bg.left));
            add(&symbols, &mut queue, Some(bg.left), next);
        }
        // Every merged symbol is a token; a single character that is not one becomes its
        // bytes (llama.cpp's `resegment`).
        let mut i = Some(0);
        while let Some(k) = i {
            let s = &text[symbols[k].start..symbols[k].start + symbols[k].len];
            match self.token(s) {
                Some(id) => out.push(id),
                None => out.extend(s.bytes().filter_map(|b| self.bytes[b as usize].or(self.unk))),
            }
            i = symbols[k].next;
        }
    }
}
