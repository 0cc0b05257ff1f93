//! Numbers as JSON writes them (RFC 8259): an optional `-`, an integer part without leading
//! zeros, an optional fraction of any digits (trailing zeros included) and an optional
//! exponent, in a range. The grammar reads a number one byte at a time; these functions say
//! whether a byte may follow and whether the number may end here. A prefix is allowed only
//! if some number in the range starts with it, so a range never leads the model into a dead
//! end, and the value is compared exactly in decimal (not through `f64`), so `0.1` with
//! `minimum: 0.1` is in range and `0.1000000000000000001` with `maximum: 0.1` is not.
//!
//! Integers (`type: integer`) are read by their own node: digits, and where the schema's
//! draft counts `4.0` as an integer (draft 6 and later), a fraction of zeros.
//!
//! State of a number in a frame (`pos`, `aux`):
//! - `aux`: the significant digits read so far (`m`, at most 19 of them);
//! - `pos`: bit 0 `-`, bits 1-3 the phase, bit 4 integer part is `0`, bit 6 the exponent is
//!   negative, bits 7-16 the power of ten of the last digit (`e`, ten bits of two's
//!   complement), bits 17-30 the exponent read. A new frame (all zeros) is a number not
//!   started.
//!
//! The magnitude read is then exactly `m * 10^e` (times the exponent's power of ten).

use std::cmp::Ordering;

/// Largest exponent written (`1e99`, `1e-99`); more is refused.
pub(crate) const MAX_EXPONENT: u32 = 99;
/// Ten bits hold the last kept digit's place.
const E_BIAS: i32 = 512;
/// How far the last kept digit's place may go either way: with the exponent, every number
/// stays within what a double holds without underflow (1e-299 and up).
const MAX_PLACE: i32 = 200;
/// Below this many significant digits another one is kept exactly.
const KEEP: u64 = 1_000_000_000_000_000_000;

/// A magnitude `m * 10^e`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Mag {
    m: u64,
    e: i32,
}

fn ndigits(m: u64) -> i32 {
    if m == 0 {
        0
    } else {
        m.ilog10() as i32 + 1
    }
}

impl Mag {
    const ZERO: Mag = Mag { m: 0, e: 0 };
    fn order(self) -> i32 {
        ndigits(self.m) + self.e
    }
    fn shift(self, by: i32) -> Mag {
        Mag { m: self.m, e: self.e + by }
    }
    fn cmp(self, o: Mag) -> Ordering {
        match (self.m == 0, o.m == 0) {
            (true, true) => return Ordering::Equal,
            (true, false) => return Ordering::Less,
            (false, true) => return Ordering::Greater,
            _ => {}
        }
        match self.order().cmp(&o.order()) {
            Ordering::Equal => {}
            c => return c,
        }
        let (da, db) = (ndigits(self.m), ndigits(o.m));
        let a = self.m as u128 * 10u128.pow((db - da).max(0) as u32);
        let b = o.m as u128 * 10u128.pow((da - db).max(0) as u32);
        a.cmp(&b)
    }
    /// The exact decimal value of a finite `f64`'s magnitude (its shortest representation).
    fn of_f64(x: f64) -> Mag {
        let s = format!("{:e}", x.abs());
        let (mant, exp) = s.split_once('e').unwrap_or((&s, "0"));
        let exp: i32 = exp.parse().unwrap_or(0);
        let (int, frac) = mant.split_once('.').unwrap_or((mant, ""));
        let m = format!("{int}{frac}").parse::<u64>().unwrap_or(0);
        Mag { m, e: exp - frac.len() as i32 }
    }
}

/// One end of a range: a signed value and whether it is included.
#[derive(Debug, Clone, Copy, PartialEq)]
struct End {
    neg: bool,
    mag: Mag,
    incl: bool,
}

/// The range of a number node.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct NumRange {
    lo: Option<End>,
    hi: Option<End>,
}

impl NumRange {
    /// An infinite end is the largest double (numbers past it do not parse as one); the
    /// bounds must not be NaN.
    pub(crate) fn new(lo: f64, lo_excl: bool, hi: f64, hi_excl: bool) -> Self {
        let end = |x: f64, excl: bool| {
            let (x, excl) = if x.is_finite() { (x, excl) } else { (f64::MAX.copysign(x), false) };
            Some(End { neg: x < 0.0, mag: Mag::of_f64(x), incl: !excl })
        };
        NumRange { lo: end(lo, lo_excl), hi: end(hi, hi_excl) }
    }
    /// The magnitudes a number of this sign may have, or `None` when none.
    fn mags(&self, neg: bool) -> Option<MagRange> {
        // For a positive number the range's upper end bounds the magnitude from above, for
        // a negative one its lower end does (negated). `-0` is 0.
        let (toward, away) = if neg { (self.hi, self.lo) } else { (self.lo, self.hi) };
        let mut r = MagRange { lo: Mag::ZERO, lo_incl: true, hi: None, hi_incl: true };
        if let Some(t) = toward {
            // neg: value <= t means mag >= -t; pos: value >= t means mag >= t.
            if t.neg != neg || t.mag.m == 0 {
                // The bound is on the other side of zero (or at zero): only 0 can be at it.
                if t.mag.m == 0 && !t.incl {
                    r.lo_incl = false;
                }
            } else {
                r.lo = t.mag;
                r.lo_incl = t.incl;
            }
        }
        if let Some(a) = away {
            if a.mag.m != 0 && a.neg != neg {
                return None; // e.g. a positive number below a negative maximum
            }
            if a.mag.m == 0 {
                if !a.incl {
                    return None;
                }
                r.hi = Some(Mag::ZERO);
            } else {
                r.hi = Some(a.mag);
                r.hi_incl = a.incl;
            }
        }
        let empty = match r.hi {
            Some(h) => match r.lo.cmp(h) {
                Ordering::Greater => true,
                Ordering::Equal => !(r.lo_incl && r.hi_incl),
                Ordering::Less => false,
            },
            None => false,
        };
        (!empty).then_some(r)
    }
    pub(crate) fn is_empty(&self) -> bool {
        self.mags(false).is_none() && self.mags(true).is_none()
    }
}

#[derive(Debug, Clone, Copy)]
struct MagRange {
    lo: Mag,
    lo_incl: bool,
    hi: Option<Mag>,
    hi_incl: bool,
}

impl MagRange {
    /// Is `x` in the range?
    fn holds(&self, x: Mag) -> bool {
        self.above_lo(x) && self.below_hi(x)
    }
    /// `x` is at least the lower end.
    fn above_lo(&self, x: Mag) -> bool {
        match x.cmp(self.lo) {
            Ordering::Greater => true,
            Ordering::Equal => self.lo_incl,
            Ordering::Less => false,
        }
    }
    /// `x` is at most the upper end.
    fn below_hi(&self, x: Mag) -> bool {
        match self.hi {
            None => true,
            Some(h) => match x.cmp(h) {
                Ordering::Less => true,
                Ordering::Equal => self.hi_incl,
                Ordering::Greater => false,
            },
        }
    }
    /// The largest `k` with `x * 10^k` at most the upper end, or `None`
    /// when there is no upper end.
    fn top_shift(&self, x: Mag) -> Option<i32> {
        let h = self.hi?;
        if h.m == 0 {
            return Some(i32::MIN); // only 0 fits, and x > 0
        }
        let k = h.order() - x.order();
        Some(if self.below_hi(x.shift(k)) { k } else { k - 1 })
    }
    /// The smallest `k` with `x * 10^k` at least the lower end.
    fn bottom_shift(&self, x: Mag) -> i32 {
        if self.lo.m == 0 {
            return i32::MIN;
        }
        let k = self.lo.order() - x.order();
        let ok = self.above_lo(x.shift(k));
        if ok {
            k
        } else {
            k + 1
        }
    }
}

/// The phases of reading a number.
const START: u32 = 0; // nothing yet, or `-`
const INT: u32 = 1;
const POINT: u32 = 2; // `.` read, no fraction digit yet
const FRAC: u32 = 3;
const EXP: u32 = 4; // `e` read
const EXP_SIGN: u32 = 5;
const EXP_DIGITS: u32 = 6;

#[derive(Debug, Clone, Copy)]
struct NumState {
    neg: bool,
    phase: u32,
    int_zero: bool,
    exp_neg: bool,
    e: i32,
    x: u32,
    m: u64,
}

impl NumState {
    fn unpack(pos: u32, aux: u64) -> Self {
        NumState {
            neg: pos & 1 != 0,
            phase: (pos >> 1) & 7,
            int_zero: pos & 16 != 0,
            exp_neg: pos & 64 != 0,
            e: (((pos >> 7) & 1023) as i32 ^ E_BIAS) - E_BIAS,
            x: (pos >> 17) & 0x3FFF,
            m: aux,
        }
    }
    fn pack(&self) -> (u32, u64) {
        let pos = self.neg as u32
            | self.phase << 1
            | (self.int_zero as u32) << 4
            | (self.exp_neg as u32) << 6
            | ((self.e & 1023) as u32) << 7
            | self.x << 17;
        (pos, self.m)
    }
    fn mag(&self) -> Mag {
        Mag { m: self.m, e: self.e }
    }
    /// Read one more mantissa digit (`int`: of the integer part). More than 19 significant
    /// digits (more than a double tells apart) are refused: a small model otherwise runs on
    /// writing digits (`12.1234567890000000...`).
    fn digit(&mut self, d: u8, int: bool) -> Option<()> {
        if self.m >= KEEP {
            return None;
        }
        self.m = self.m * 10 + d as u64;
        if !int {
            self.e -= 1;
        }
        (-MAX_PLACE..=MAX_PLACE).contains(&self.e).then_some(())
    }
    fn exponent(&self) -> i32 {
        if self.exp_neg {
            -(self.x as i32)
        } else {
            self.x as i32
        }
    }
}

pub(crate) fn num_accepting(pos: u32, aux: u64, r: &NumRange) -> bool {
    let s = NumState::unpack(pos, aux);
    if !matches!(s.phase, INT | FRAC | EXP_DIGITS) {
        return false;
    }
    let Some(mr) = r.mags(s.neg) else { return false };
    let x = if s.phase == EXP_DIGITS { s.mag().shift(s.exponent()) } else { s.mag() };
    mr.holds(if x.m == 0 { Mag::ZERO } else { x })
}

/// Can the number read so far still end in the range?
fn num_feasible(s: &NumState, r: &NumRange) -> bool {
    let Some(mr) = r.mags(s.neg) else { return false };
    let cap = MAX_EXPONENT as i32;
    match s.phase {
        START => true,
        INT | POINT | FRAC => {
            if s.m == 0 {
                // 0, 0.000...: any magnitude is still reachable through the fraction and
                // the exponent (0.5e3).
                return true;
            }
            // Reachable: [V, V + u) * 10^k: k >= 0 more integer digits, or any k through an
            // exponent. An exponent may bring the value into the range only after a single
            // integer digit (scientific notation, `5e-4`, `2.5e3`): digits written plainly
            // must fit on their own, so a model writing an out-of-range `123456...` is
            // stopped, not led on digit after digit towards an exponent.
            let Some(top) = mr.top_shift(s.mag()) else { return true };
            let scientific = s.int_zero || ndigits(s.m) + s.e == 1;
            let k = match (scientific, s.phase) {
                (true, _) => top,
                (false, INT) if top >= 0 => top,
                (false, _) if top >= 0 => 0,
                _ => return false,
            };
            if k < -cap - MAX_PLACE {
                return false;
            }
            let next = Mag { m: s.m + 1, e: s.e }.shift(k);
            next.cmp(mr.lo) == Ordering::Greater
        }
        _ => {
            if s.m == 0 {
                return mr.holds(Mag::ZERO);
            }
            let top = mr.top_shift(s.mag()).unwrap_or(i32::MAX).min(cap);
            let bottom = mr.bottom_shift(s.mag()).max(-cap);
            if bottom > top {
                return false;
            }
            // The exponents still reachable, as ranges of their magnitude.
            let sign = |a: i32, b: i32| if s.exp_neg { (-b, -a) } else { (a, b) };
            let hits = |a: i32, b: i32| {
                let (a, b) = sign(a, b.min(cap));
                a <= b && a <= top && b >= bottom
            };
            match s.phase {
                EXP => hits(0, cap) || (bottom <= 0 && top >= -cap),
                EXP_SIGN => hits(0, cap),
                _ if s.x == 0 => hits(0, cap),
                _ => {
                    let (mut lo, mut width) = (s.x as i64, 1i64);
                    while lo <= cap as i64 {
                        if hits(lo as i32, (lo + width - 1).min(cap as i64) as i32) {
                            return true;
                        }
                        lo *= 10;
                        width *= 10;
                    }
                    false
                }
            }
        }
    }
}

pub(crate) fn num_consume(pos: u32, aux: u64, b: u8, r: &NumRange) -> Option<(u32, u64)> {
    let mut s = NumState::unpack(pos, aux);
    match (s.phase, b) {
        (START, b'-') if !s.neg => s.neg = true,
        (START, b'0') => {
            s.phase = INT;
            s.int_zero = true;
        }
        (START, b'1'..=b'9') => {
            s.phase = INT;
            s.m = (b - b'0') as u64;
        }
        (INT, b'0'..=b'9') if !s.int_zero => s.digit(b - b'0', true)?,
        (INT, b'.') => s.phase = POINT,
        (POINT | FRAC, b'0'..=b'9') => {
            s.phase = FRAC;
            s.digit(b - b'0', false)?;
        }
        (INT | FRAC, b'e' | b'E') => s.phase = EXP,
        (EXP, b'+') => s.phase = EXP_SIGN,
        (EXP, b'-') => {
            s.phase = EXP_SIGN;
            s.exp_neg = true;
        }
        (EXP | EXP_SIGN | EXP_DIGITS, b'0'..=b'9') => {
            s.phase = EXP_DIGITS;
            s.x = s.x * 10 + (b - b'0') as u32;
            if s.x > MAX_EXPONENT {
                return None;
            }
        }
        _ => return None,
    }
    num_feasible(&s, r).then(|| s.pack())
}

/// The bytes that can appear in a number.
pub(crate) const NUM_BYTES: &[u8] = b"-+.eE0123456789";

/// The range of an integer node; `zero_frac`: `4.0` (a fraction of zeros) is an integer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct IntRange {
    pub lo: i64,
    pub hi: i64,
    pub zero_frac: bool,
    /// `multipleOf` (1 when there is none).
    pub multiple: u64,
}

impl IntRange {
    /// Is some multiple in the signed range `[a, b]`, within the range?
    pub(crate) fn hits(&self, a: i128, b: i128) -> bool {
        let (a, b) = (a.max(self.lo as i128), b.min(self.hi as i128));
        let m = self.multiple.max(1) as i128;
        a <= b && a.div_euclid(m) * m + if a.rem_euclid(m) == 0 { 0 } else { m } <= b
    }
}

// Integer state: pos = `-` | `.` read << 1 | a fraction digit read << 2 | digits << 3,
// aux = magnitude.

fn int_split(pos: u32) -> (bool, bool, bool, u32) {
    (pos & 1 == 1, pos & 2 == 2, pos & 4 == 4, pos >> 3)
}

fn signed(neg: bool, mag: u64) -> i128 {
    if neg {
        -(mag as i128)
    } else {
        mag as i128
    }
}

pub(crate) fn int_accepting(pos: u32, aux: u64, r: &IntRange) -> bool {
    let (neg, point, frac, digits) = int_split(pos);
    let v = signed(neg, aux);
    digits > 0 && point == frac && r.hits(v, v)
}

fn int_feasible(neg: bool, digits: u32, mag: u64, more: bool, r: &IntRange) -> bool {
    // Is some magnitude in [a, b] (signed) in the range, and a multiple?
    let hit = |a: i128, b: i128| if neg { r.hits(-b, -a) } else { r.hits(a, b) };
    if digits == 0 {
        return hit(0, i64::MAX as i128 + 1);
    }
    if mag == 0 || !more {
        return hit(mag as i128, mag as i128);
    }
    let mut scale: i128 = 1;
    let m = mag as i128;
    loop {
        let a = m * scale;
        if a > i64::MAX as i128 + 1 {
            return false;
        }
        if hit(a, a + scale - 1) {
            return true;
        }
        scale *= 10;
    }
}

pub(crate) fn int_consume(pos: u32, aux: u64, b: u8, r: &IntRange) -> Option<(u32, u64)> {
    let (mut neg, mut point, mut frac, mut digits) = int_split(pos);
    let mut mag = aux;
    match b {
        b'-' if digits == 0 && !neg => neg = true,
        b'.' if r.zero_frac && digits > 0 && !point => point = true,
        b'0' if point => frac = true,
        b'0'..=b'9' if !point => {
            if digits > 0 && mag == 0 {
                return None;
            }
            mag = mag.checked_mul(10)?.checked_add((b - b'0') as u64)?;
            digits += 1;
        }
        _ => return None,
    }
    int_feasible(neg, digits, mag, !point, r).then_some((neg as u32 | (point as u32) << 1 | (frac as u32) << 2 | digits << 3, mag))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The (pos, aux) state after `s` byte by byte through `step`, `None` if a byte is refused.
    fn feed(s: &str, step: impl Fn(u32, u64, u8) -> Option<(u32, u64)>) -> Option<(u32, u64)> {
        s.bytes().try_fold((0, 0), |(pos, aux), b| step(pos, aux, b))
    }
    fn num_ok(r: &NumRange, s: &str) -> bool {
        feed(s, |p, a, b| num_consume(p, a, b, r)).is_some_and(|(p, a)| num_accepting(p, a, r))
    }
    fn num_prefix(r: &NumRange, s: &str) -> bool {
        feed(s, |p, a, b| num_consume(p, a, b, r)).is_some()
    }
    fn in_range(x: f64, lo: f64, lo_x: bool, hi: f64, hi_x: bool) -> bool {
        (if lo_x { x > lo } else { x >= lo }) && (if hi_x { x < hi } else { x <= hi })
    }

    #[test]
    fn any_json_number_in_an_open_range() {
        let r = NumRange::new(f64::NEG_INFINITY, false, f64::INFINITY, false);
        for s in ["0", "-0", "-0.0", "2.0", "10.000", "19.90", "1.50", "1e-7", "1E+99", "-12.5e3", "0.0001", "1e0009", "1e-99", "1234567890123456789", "0.000123456789012345678"] {
            assert!(num_ok(&r, s), "{s}");
        }
        for s in ["", "-", "01", "1.", ".5", "+1", "1e", "1e+", "--1", "0x1", "1e99999", "00", "-01", "1e309", "-2e308", "1e-100", "12345678901234567890", "2.0000000000000000000"] {
            assert!(!num_ok(&r, s), "{s}");
        }
    }

    #[test]
    fn ranges_are_exact_in_decimal() {
        let r = NumRange::new(0.1, false, 0.3, false);
        for (s, want) in [
            ("0.1", true), ("0.10", true), ("0.3", true), ("0.30000", true), ("0.300000000000000000", true), ("0.3000000000000000001", false),
            ("0.0999999999999999999", false), ("0.2", true), ("1e-1", true), ("3e-1", true), ("30e-2", false), ("3.0e-1", true),
            ("0.31", false), ("-0.2", false), ("0", false), ("2.5e-1", true), ("0.25E0", true),
        ] {
            assert_eq!(num_ok(&r, s), want, "{s}");
        }
        // Exclusive ends, negative ranges, -0.
        let r = NumRange::new(-1.0, true, 0.0, false);
        for (s, want) in [("-1", false), ("-1.0", false), ("-0.99", true), ("0", true), ("-0", true), ("-0.0", true), ("0.0", true), ("1e-9", false), ("-1e-9", true), ("-10e-1", false)] {
            assert_eq!(num_ok(&r, s), want, "{s}");
        }
        let r = NumRange::new(0.0, true, f64::INFINITY, false);
        assert!(!num_ok(&r, "0") && !num_ok(&r, "0.000") && num_ok(&r, "0.001") && num_ok(&r, "5e99") && !num_prefix(&r, "-"));
    }

    /// Some completion of `s` within `depth` more bytes is a number in range.
    fn completes(r: &NumRange, s: &str, alphabet: &[u8], depth: usize) -> bool {
        num_ok(r, s)
            || (depth > 0
                && alphabet.iter().any(|&c| {
                    let t = format!("{s}{}", c as char);
                    num_prefix(r, &t) && completes(r, &t, alphabet, depth - 1)
                }))
    }

    #[test]
    fn plain_digits_out_of_range_are_stopped() {
        // A model writing 123456789 where the maximum is 50 is stopped at once, not led on.
        let r = NumRange::new(0.0, false, 50.0, false);
        assert!(num_prefix(&r, "12") && !num_prefix(&r, "123") && !num_prefix(&r, "5.5.") && num_prefix(&r, "5.5e0"));
        assert!(num_ok(&r, "1.2e1") && !num_prefix(&r, "120"));
    }

    #[test]
    fn no_prefix_leads_to_a_dead_end() {
        // Every allowed prefix has some allowed completion: checked by a bounded search over
        // short texts for a few ranges, against the value computed with f64.
        let ranges = [(-1.5, false, 2.25, false), (0.0, false, 0.0, false), (5.0, false, 6.0, false), (100.0, true, 1000.0, true), (-3.0, false, -2.5, false), (1e-3, false, 2e-3, true)];
        let alphabet = b"-+.e0159";
        for (lo, lo_x, hi, hi_x) in ranges {
            let r = NumRange::new(lo, lo_x, hi, hi_x);
            let mut frontier = vec![String::new()];
            for _ in 0..4 {
                let mut next = Vec::new();
                for p in &frontier {
                    for &c in alphabet {
                        let s = format!("{p}{}", c as char);
                        let allowed = num_prefix(&r, &s);
                        if num_ok(&r, &s) {
                            let v: f64 = s.parse().unwrap();
                            assert!(in_range(v, lo, lo_x, hi, hi_x), "{s} accepted in {lo}..{hi}");
                        } else if let Ok(v) = s.parse::<f64>() {
                            // Refused in range only when written with an exponent after
                            // several integer digits that are out of range on their own.
                            let json = serde_json::from_str::<serde_json::Value>(&s).is_ok();
                            let plain: f64 = s.split(['e', 'E']).next().unwrap_or("").parse().unwrap_or(f64::NAN);
                            let int_digits = s.trim_start_matches('-').split(['.', 'e', 'E']).next().map_or(0, str::len);
                            let excused = s.contains(['e', 'E']) && int_digits > 1 && !in_range(plain, lo, lo_x, hi, hi_x);
                            assert!(!(json && in_range(v, lo, lo_x, hi, hi_x)) || excused, "{s} refused in {lo}..{hi}");
                        }
                        if allowed {
                            // Some completion exists: search a little deeper.
                            let found = completes(&r, &s, b"-+.e0123456789", 4);
                            assert!(found, "prefix {s:?} allowed in {lo}..{hi} but no completion found");
                            next.push(s);
                        }
                    }
                }
                frontier = next;
            }
        }
    }

    #[test]
    fn integers() {
        let r = IntRange { lo: -20, hi: 150, zero_frac: true, multiple: 1 };
        let ok = |r: &IntRange, s: &str| feed(s, |p, a, b| int_consume(p, a, b, r)).is_some_and(|(p, a)| int_accepting(p, a, r));
        for (s, want) in [("4", true), ("4.0", true), ("4.00", true), ("4.", false), ("4.5", false), ("-0", true), ("150.0", true), ("151", false), ("-21.0", false), ("007", false)] {
            assert_eq!(ok(&r, s), want, "{s}");
        }
        let strict = IntRange { zero_frac: false, ..r.clone() };
        assert!(ok(&strict, "4") && !ok(&strict, "4.0"));
        let threes = IntRange { multiple: 3, ..r };
        for (s, want) in [("0", true), ("3", true), ("4", false), ("-18", true), ("-21", false), ("150", true), ("12.0", true)] {
            assert_eq!(ok(&threes, s), want, "{s}");
        }
        // "14" goes on to 141, 144, 147; "16" is no multiple and 160 is past 150: refused.
        let prefix = |s: &[u8]| s.iter().try_fold((0, 0), |st, &b| int_consume(st.0, st.1, b, &threes)).is_some();
        assert!(prefix(b"14") && !prefix(b"16"));
    }
}
