//! Numbers as misaki reads them (`Lexicon.get_number` on `num2words` English text): cardinals,
//! years (`1984` -> nineteen eighty-four), ordinals (`21st`), decimals (`3.14` -> three point
//! one four), thousands separators, negatives, currency (`$3.50` -> three dollars and fifty
//! cents), digit strings (`007`) and `-s` / `-ed` / `-ing` suffixes (`1990s`); every word is
//! then looked up in the lexicon.

use super::lexicon::Lexicon;

const ONES: [&str; 20] = [
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
    "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen",
];
const TENS: [&str; 10] = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"];
const SCALES: [&str; 7] = ["", "thousand", "million", "billion", "trillion", "quadrillion", "quintillion"];
const ORDINALS: [&str; 4] = ["st", "nd", "rd", "th"];

/// `(unit, subunit)` of a currency symbol.
pub(crate) fn currency_units(c: char) -> Option<(&'static str, &'static str)> {
    match c {
        '$' => Some(("dollar", "cent")),
        '£' => Some(("pound", "pence")),
        '€' => Some(("euro", "cent")),
        _ => None,
    }
}

fn below_1000(n: u64, out: &mut Vec<&'static str>) {
    let (h, r) = (n / 100, n % 100);
    if h > 0 {
        out.push(ONES[h as usize]);
        out.push("hundred");
    }
    if r >= 20 {
        out.push(TENS[(r / 10) as usize]);
        if r % 10 > 0 {
            out.push(ONES[(r % 10) as usize]);
        }
    } else if r > 0 || h == 0 {
        out.push(ONES[r as usize]);
    }
}

/// num2words' English cardinal, as the words misaki keeps ("and" and punctuation dropped).
pub(crate) fn cardinal(n: u64) -> Vec<&'static str> {
    if n == 0 {
        return vec!["zero"];
    }
    let mut groups = Vec::new();
    let mut m = n;
    while m > 0 {
        groups.push(m % 1000);
        m /= 1000;
    }
    let mut out = Vec::new();
    for (i, &g) in groups.iter().enumerate().rev() {
        if g == 0 {
            continue;
        }
        below_1000(g, &mut out);
        if i > 0 {
            out.push(SCALES[i]);
        }
    }
    out
}

/// num2words' ordinal: the cardinal with its last word made ordinal.
pub(crate) fn ordinal(n: u64) -> Vec<String> {
    let mut words: Vec<String> = cardinal(n).into_iter().map(str::to_string).collect();
    if let Some(last) = words.last_mut() {
        *last = match last.as_str() {
            "one" => "first".into(),
            "two" => "second".into(),
            "three" => "third".into(),
            "five" => "fifth".into(),
            "eight" => "eighth".into(),
            "nine" => "ninth".into(),
            "twelve" => "twelfth".into(),
            w if w.ends_with('y') => format!("{}ieth", &w[..w.len() - 1]),
            w => format!("{w}th"),
        };
    }
    words
}

/// num2words' year: 1984 -> nineteen eighty-four, 1905 -> nineteen oh-five, 1900 -> nineteen
/// hundred; 2005, 1005, 100 and five-digit years as cardinals.
pub(crate) fn year(n: u64) -> Vec<&'static str> {
    let (high, low) = (n / 100, n % 100);
    if high == 0 || (high % 10 == 0 && low < 10) || high >= 100 {
        return cardinal(n);
    }
    let mut out = cardinal(high);
    if low == 0 {
        out.push("hundred");
    } else if low < 10 {
        out.push("oh");
        out.extend(cardinal(low));
    } else {
        out.extend(cardinal(low));
    }
    out
}

fn is_digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// misaki's `is_number`: digits with `,` `.` (a leading `-` for a head token) and one suffix.
pub(crate) fn is_number(word: &str, is_head: bool) -> bool {
    if !word.chars().any(|c| c.is_ascii_digit()) {
        return false;
    }
    let mut w = word;
    for s in ["ing", "'d", "ed", "'s", "st", "nd", "rd", "th", "s"] {
        if let Some(b) = w.strip_suffix(s) {
            w = b;
            break;
        }
    }
    w.chars()
        .enumerate()
        .all(|(i, c)| c.is_ascii_digit() || c == ',' || c == '.' || (is_head && i == 0 && c == '-'))
}

fn parse_u64(s: &str) -> Option<u64> {
    if s.len() > 18 {
        return None;
    }
    s.parse().ok()
}

struct Reader<'a> {
    lex: &'a Lexicon,
    parts: Vec<String>,
    ok: bool,
}

impl Reader<'_> {
    fn push_word(&mut self, w: &str, stress: Option<f32>) {
        match self.lex.lookup(w, stress, None) {
            Some(p) => self.parts.push(p),
            None => self.ok = false,
        }
    }

    fn words<S: AsRef<str>>(&mut self, ws: &[S]) {
        for w in ws {
            let w = w.as_ref();
            self.push_word(w, if w == "point" { Some(-2.0) } else { None });
        }
    }

    /// A digit string as a cardinal, or digit by digit when it is too long for one.
    fn int(&mut self, digits: &str) {
        match parse_u64(digits) {
            Some(n) => self.words(&cardinal(n)),
            None => self.digits(digits),
        }
    }

    fn digits(&mut self, digits: &str) {
        for c in digits.chars() {
            if let Some(d) = c.to_digit(10) {
                self.words(&cardinal(u64::from(d)));
            }
        }
    }
}

/// misaki's `get_number` (`word` passed [`is_number`]).
pub(crate) fn get_number(lex: &Lexicon, word: &str, currency: Option<char>, is_head: bool) -> Option<String> {
    // the suffix: trailing [a-z']+
    let split = word
        .char_indices()
        .rev()
        .take_while(|(_, c)| c.is_ascii_lowercase() || *c == '\'')
        .last()
        .map(|(i, _)| i)
        .unwrap_or(word.len());
    let (mut num, suffix) = (&word[..split], &word[split..]);
    let mut r = Reader {
        lex,
        parts: Vec::new(),
        ok: true,
    };
    if let Some(rest) = num.strip_prefix('-') {
        r.push_word("minus", None);
        num = rest;
    }
    let units = currency.and_then(currency_units);
    if is_digits(num) && ORDINALS.contains(&suffix) {
        let n = parse_u64(num)?;
        r.words(&ordinal(n));
    } else if r.parts.is_empty() && num.len() == 4 && units.is_none() && is_digits(num) {
        r.words(&year(parse_u64(num)?));
    } else if !is_head && !num.contains('.') {
        let n = num.replace(',', "");
        let b = n.as_bytes();
        if b.first() == Some(&b'0') || n.len() > 3 {
            r.digits(&n);
        } else if n.len() == 3 && !n.ends_with("00") {
            r.int(&n[..1]);
            if b[1] == b'0' {
                r.push_word("O", Some(-2.0));
                r.digits(&n[2..]);
            } else {
                r.int(&n[1..]);
            }
        } else {
            r.int(&n);
        }
    } else if num.matches('.').count() > 1 || !is_head {
        for part in num.replace(',', "").split('.') {
            if part.is_empty() {
                continue;
            }
            let b = part.as_bytes();
            if b[0] == b'0' || (part.len() != 2 && b[1..].iter().any(|&d| d != b'0')) {
                r.digits(part);
            } else {
                r.int(part);
            }
        }
    } else if let (Some((unit, sub)), true) = (units, is_currency(num)) {
        let clean = num.replace(',', "");
        let mut pairs: Vec<(u64, &str)> = clean
            .split('.')
            .zip([unit, sub])
            .map(|(n, u)| (if n.is_empty() { Some(0) } else { parse_u64(n) }).map(|v| (v, u)))
            .collect::<Option<_>>()?;
        if pairs.len() > 1 {
            if pairs[1].0 == 0 {
                pairs.truncate(1);
            } else if pairs[0].0 == 0 {
                pairs.remove(0);
            }
        }
        for (i, (n, u)) in pairs.iter().enumerate() {
            if i > 0 {
                r.push_word("and", None);
            }
            r.words(&cardinal(*n));
            let unit_ps = if *n != 1 && *u != "pence" {
                lex.plural(u)
            } else {
                lex.lookup(u, None, None)
            };
            match unit_ps {
                Some(p) => r.parts.push(p),
                None => r.ok = false,
            }
        }
    } else if is_digits(num) {
        r.int(num);
    } else if !num.contains('.') {
        let n = num.replace(',', "");
        if !is_digits(&n) {
            return None;
        }
        match parse_u64(&n) {
            Some(v) if ORDINALS.contains(&suffix) => r.words(&ordinal(v)),
            Some(v) => r.words(&cardinal(v)),
            None => r.digits(&n),
        }
    } else {
        // a decimal: num2words(float(word)) = integer part, "point", the fraction's digits
        // (trailing zeros dropped, as the float drops them)
        let n = num.replace(',', "");
        let (int, frac) = n.split_once('.').unwrap_or((&n, ""));
        let frac = frac.trim_end_matches('0');
        if !int.is_empty() && !is_digits(int) || !frac.chars().all(|c| c.is_ascii_digit()) {
            return None;
        }
        if int.is_empty() {
            // ".5": "point" then each digit
            r.push_word("point", Some(-2.0));
            r.digits(frac);
        } else {
            r.int(int);
            if !frac.is_empty() {
                r.push_word("point", Some(-2.0));
                r.digits(frac);
            }
        }
    }
    if !r.ok || r.parts.is_empty() {
        return None;
    }
    let ps = r.parts.join(" ");
    match suffix {
        "s" | "'s" => Lexicon::suffix_s(&ps),
        "ed" | "'d" => Lexicon::suffix_ed(&ps),
        "ing" => Lexicon::suffix_ing(&ps),
        _ => Some(ps),
    }
}

fn is_currency(word: &str) -> bool {
    match word.matches('.').count() {
        0 => true,
        1 => word.split('.').nth(1).is_some_and(|c| c.len() < 3),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn num2words_shapes() {
        assert_eq!(cardinal(1_234_567).join(" "), "one million two hundred thirty four thousand five hundred sixty seven");
        assert_eq!(cardinal(100).join(" "), "one hundred");
        assert_eq!(year(1905).join(" "), "nineteen oh five");
        assert_eq!(year(2005).join(" "), "two thousand five");
        assert_eq!(year(1900).join(" "), "nineteen hundred");
        assert_eq!(ordinal(22).join(" "), "twenty second");
        assert_eq!(ordinal(30).join(" "), "thirtieth");
    }
}
