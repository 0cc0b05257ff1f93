//! The GBNF text to rules (as llama.cpp's `llama_grammar_parser` reads it): rule names of
//! letters, digits and `-`; `::=`; alternatives `|`; sequences; groups `( )`; string
//! literals `"..."` and character classes `[...]`, `[^...]` with the escapes `\x`, `\u`,
//! `\U`, `\t`, `\r`, `\n`, `\\`, `\"`, `\[`, `\]`, `\-`; `.`; the repetitions `*`, `+`, `?`,
//! `{m}`, `{m,}`, `{m,n}`; `#` comments. A rule ends at the end of its line, except inside
//! parentheses and after `|`.

use super::{Ast, Rule};
use crate::error::GrammarError;

/// Deepest nesting of parentheses.
const MAX_NESTING: usize = 64;
/// Most repetition operators on one item (`a*?+...`).
const MAX_SUFFIXES: usize = 8;
/// Largest count in `{m,n}`.
pub(super) const MAX_COUNT: u32 = 1_000_000;

/// A position in the text: its byte offset.
pub(super) type At = usize;

/// The 1-based line and column (in characters) of byte offset `at` of `src`.
pub(super) fn line_col(src: &str, at: At) -> (usize, usize) {
    let before = &src[..at.min(src.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

/// A GBNF error at byte offset `at` of `src`.
pub(super) fn error(src: &str, at: At, message: impl Into<String>) -> GrammarError {
    let (line, column) = line_col(src, at);
    GrammarError::Gbnf { line, column, message: message.into() }
}

pub(super) fn is_word(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'-'
}

struct Parser<'a> {
    src: &'a str,
    b: &'a [u8],
    pos: usize,
}

/// The rules of `src`, in order.
pub(super) fn parse(src: &str) -> Result<Vec<Rule>, GrammarError> {
    let mut p = Parser { src, b: src.as_bytes(), pos: 0 };
    p.space(true);
    let mut rules = Vec::new();
    while p.pos < p.b.len() {
        rules.push(p.rule()?);
    }
    Ok(rules)
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.pos).copied()
    }
    fn err(&self, at: At, message: impl Into<String>) -> GrammarError {
        error(self.src, at, message)
    }
    /// What is at `at`, for messages: the character or "the end of the text".
    fn what(&self, at: At) -> String {
        match self.src[at..].chars().next() {
            None => "the end of the text".into(),
            Some('\n') | Some('\r') => "the end of the line".into(),
            Some(c) => format!("`{c}`"),
        }
    }
    /// Skip spaces, tabs and comments (and line ends if `newline_ok`).
    fn space(&mut self, newline_ok: bool) {
        while let Some(c) = self.peek() {
            match c {
                b' ' | b'\t' => self.pos += 1,
                b'\r' | b'\n' if newline_ok => self.pos += 1,
                b'#' => {
                    while self.peek().is_some_and(|c| c != b'\r' && c != b'\n') {
                        self.pos += 1;
                    }
                }
                _ => break,
            }
        }
    }
    fn name(&mut self) -> Result<String, GrammarError> {
        let start = self.pos;
        while self.peek().is_some_and(is_word) {
            self.pos += 1;
        }
        if start == self.pos {
            return Err(self.err(start, format!("expected a rule name (letters, digits and `-`), found {}", self.what(start))));
        }
        Ok(self.src[start..self.pos].to_string())
    }

    fn rule(&mut self) -> Result<Rule, GrammarError> {
        let at = self.pos;
        let name = self.name()?;
        self.space(false);
        if !self.b[self.pos..].starts_with(b"::=") {
            let hint = if self.peek() == Some(b'_') { " (rule names are letters, digits and `-`, not `_`)" } else { "" };
            return Err(self.err(self.pos, format!("expected `::=` after the rule name `{name}`, found {}{hint}", self.what(self.pos))));
        }
        self.pos += 3;
        self.space(true);
        let body = self.alternates(false, 0)?;
        match self.peek() {
            None => {}
            Some(b'\r') | Some(b'\n') => self.pos += 1,
            Some(b')') => return Err(self.err(self.pos, "unbalanced `)`: no `(` is open")),
            Some(_) => return Err(self.err(self.pos, format!("unexpected {} in rule `{name}`", self.what(self.pos)))),
        }
        self.space(true);
        Ok(Rule { name, body, at })
    }

    fn alternates(&mut self, nested: bool, depth: usize) -> Result<Ast, GrammarError> {
        let mut alts = vec![self.sequence(nested, depth)?];
        while self.peek() == Some(b'|') {
            self.pos += 1;
            self.space(true);
            alts.push(self.sequence(nested, depth)?);
        }
        Ok(if alts.len() == 1 { alts.pop().unwrap_or(Ast::Seq(vec![])) } else { Ast::Alt(alts) })
    }

    fn sequence(&mut self, nested: bool, depth: usize) -> Result<Ast, GrammarError> {
        let mut items: Vec<Ast> = Vec::new();
        // Repetition operators applied to the last item so far.
        let mut suffixes = 0;
        while let Some(c) = self.peek() {
            let at = self.pos;
            let item = match c {
                b'"' => {
                    self.pos += 1;
                    let mut s = String::new();
                    loop {
                        match self.peek() {
                            None => return Err(self.err(at, "unterminated string literal: no closing `\"`")),
                            Some(b'"') => break,
                            Some(_) => s.push(self.char()?),
                        }
                    }
                    self.pos += 1;
                    Ast::Lit(s)
                }
                b'[' => self.class()?,
                b'<' | b'!' => {
                    return Err(self.err(at, "token references (`<[id]>`, `<token>`, `!<...>`) are not supported: the constraint applies to text, not to token ids"))
                }
                b'(' => {
                    if depth >= MAX_NESTING {
                        return Err(self.err(at, format!("parentheses nested more than {MAX_NESTING} deep")));
                    }
                    self.pos += 1;
                    self.space(true);
                    let inner = self.alternates(true, depth + 1)?;
                    if self.peek() != Some(b')') {
                        return Err(self.err(self.pos, format!("unbalanced `(`: found {} where the `)` closing it was expected", self.what(self.pos))));
                    }
                    self.pos += 1;
                    inner
                }
                b'.' => {
                    self.pos += 1;
                    Ast::Any
                }
                b'*' | b'+' | b'?' | b'{' => {
                    let (min, max) = self.repetition()?;
                    let Some(last) = items.pop() else {
                        return Err(self.err(at, format!("`{}` has nothing before it to repeat", c as char)));
                    };
                    suffixes += 1;
                    if suffixes > MAX_SUFFIXES {
                        return Err(self.err(at, format!("more than {MAX_SUFFIXES} repetition operators on one item")));
                    }
                    items.push(Ast::Rep { item: Box::new(last), min, max, at });
                    self.space(nested);
                    continue;
                }
                c if is_word(c) => Ast::Ref { name: self.name()?, rule: usize::MAX, at },
                _ => break,
            };
            suffixes = 0;
            items.push(item);
            self.space(nested);
        }
        Ok(if items.len() == 1 { items.pop().unwrap_or(Ast::Seq(vec![])) } else { Ast::Seq(items) })
    }

    /// `*`, `+`, `?` or `{m}`, `{m,}`, `{m,n}` at the current position: (min, max).
    fn repetition(&mut self) -> Result<(u32, Option<u32>), GrammarError> {
        let at = self.pos;
        let c = self.b[self.pos];
        self.pos += 1;
        match c {
            b'*' => return Ok((0, None)),
            b'+' => return Ok((1, None)),
            b'?' => return Ok((0, Some(1))),
            _ => {}
        }
        self.space(true);
        let min = self.count()?;
        self.space(true);
        let max = match self.peek() {
            Some(b'}') => Some(min),
            Some(b',') => {
                self.pos += 1;
                self.space(true);
                let max = if self.peek().is_some_and(|c| c.is_ascii_digit()) { Some(self.count()?) } else { None };
                self.space(true);
                if self.peek() != Some(b'}') {
                    return Err(self.err(self.pos, format!("expected `}}` to close the repetition, found {}", self.what(self.pos))));
                }
                max
            }
            _ => return Err(self.err(self.pos, format!("expected `,` or `}}` in the repetition, found {}", self.what(self.pos)))),
        };
        self.pos += 1;
        if max.is_some_and(|m| m < min) {
            return Err(self.err(at, format!("repetition {{{min},{}}}: the maximum is below the minimum", max.unwrap_or(0))));
        }
        Ok((min, max))
    }

    fn count(&mut self) -> Result<u32, GrammarError> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        if start == self.pos {
            return Err(self.err(start, format!("expected a number in the repetition, found {}", self.what(start))));
        }
        match self.src[start..self.pos].parse::<u32>() {
            Ok(n) if n <= MAX_COUNT => Ok(n),
            _ => Err(self.err(start, format!("repetition count {} is over the limit of {MAX_COUNT}", &self.src[start..self.pos]))),
        }
    }

    /// A character class `[...]` or `[^...]`.
    fn class(&mut self) -> Result<Ast, GrammarError> {
        let at = self.pos;
        self.pos += 1;
        let negated = self.peek() == Some(b'^');
        if negated {
            self.pos += 1;
        }
        let mut ranges = Vec::new();
        loop {
            match self.peek() {
                None => return Err(self.err(at, "unterminated character class: no closing `]`")),
                Some(b']') if ranges.is_empty() => return Err(self.err(at, "empty character class")),
                Some(b']') => break,
                Some(_) => {}
            }
            let lo_at = self.pos;
            let lo = self.code_point()?;
            let mut hi = lo;
            if self.peek() == Some(b'-') && self.b.get(self.pos + 1).is_some_and(|&c| c != b']') {
                self.pos += 1;
                hi = self.code_point()?;
                if hi < lo {
                    return Err(self.err(lo_at, format!("character range U+{lo:04X}-U+{hi:04X} is reversed")));
                }
            }
            ranges.push((lo, hi));
        }
        self.pos += 1;
        // Only Unicode scalar values occur in text: surrogates and code points above
        // U+10FFFF are dropped from the ranges.
        let ranges: Vec<(u32, u32)> = ranges
            .into_iter()
            .flat_map(|(lo, hi)| [(lo, hi.min(0xD7FF)), (lo.max(0xE000), hi.min(0x10FFFF))])
            .filter(|(lo, hi)| lo <= hi)
            .collect();
        if ranges.is_empty() && !negated {
            return Err(self.err(at, "the character class matches no character"));
        }
        Ok(Ast::Class { negated, ranges, at })
    }

    /// One character of a literal as a `char` (a code point that is not a Unicode scalar
    /// value can never be matched: an error).
    fn char(&mut self) -> Result<char, GrammarError> {
        let at = self.pos;
        let c = self.code_point()?;
        char::from_u32(c).ok_or_else(|| self.err(at, format!("U+{c:04X} is not a Unicode scalar value (a surrogate or above U+10FFFF): it never occurs in text")))
    }

    /// One character or escape, as a code point.
    fn code_point(&mut self) -> Result<u32, GrammarError> {
        let at = self.pos;
        let Some(c) = self.src[at..].chars().next() else {
            return Err(self.err(at, "unexpected end of the text"));
        };
        if c != '\\' {
            self.pos += c.len_utf8();
            return Ok(c as u32);
        }
        let Some(e) = self.src[at + 1..].chars().next() else {
            return Err(self.err(at, "unexpected end of the text after `\\`"));
        };
        self.pos += 1 + e.len_utf8();
        let digits = match e {
            'x' => 2,
            'u' => 4,
            'U' => 8,
            't' => return Ok('\t' as u32),
            'r' => return Ok('\r' as u32),
            'n' => return Ok('\n' as u32),
            '\\' | '"' | '[' | ']' | '-' => return Ok(e as u32),
            _ => return Err(self.err(at, format!("unknown escape `\\{e}` (known: \\x, \\u, \\U, \\t, \\r, \\n, \\\\, \\\", \\[, \\], \\-)"))),
        };
        let hex = self.b.get(self.pos..self.pos + digits).filter(|h| h.iter().all(u8::is_ascii_hexdigit));
        let Some(hex) = hex else {
            return Err(self.err(at, format!("`\\{e}` needs {digits} hex digits")));
        };
        self.pos += digits;
        let v = hex.iter().fold(0u64, |v, &h| v * 16 + (h as char).to_digit(16).unwrap_or(0) as u64);
        Ok(v.min(u32::MAX as u64) as u32)
    }
}
