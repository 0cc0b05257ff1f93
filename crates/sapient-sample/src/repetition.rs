//! Detecting a generation that repeats itself: the same stretch back to back, again and again.

use std::collections::VecDeque;

/// When [`RepetitionDetector`] reports a loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RepetitionOptions {
    /// The longest repeating unit looked for (in items: tokens, or characters of text).
    pub max_period: usize,
    /// How many times the unit must appear back to back (the first occurrence included, at
    /// least 2).
    pub min_repeats: usize,
    /// The repeated stretch (all its copies together) must be at least this long, so that
    /// a short unit ("ha", a run of dashes) needs many copies before it counts.
    pub min_len: usize,
}

impl RepetitionOptions {
    /// For characters of generated text: a unit of up to 400 characters seen 3 times in a
    /// row, covering at least 160 characters (a sentence said three times, or a short
    /// phrase dozens of times).
    pub fn text() -> Self {
        Self {
            max_period: 400,
            min_repeats: 3,
            min_len: 160,
        }
    }

    /// For token ids: a unit of up to 100 tokens seen 3 times in a row, covering at least 40
    /// tokens.
    pub fn tokens() -> Self {
        Self {
            max_period: 100,
            min_repeats: 3,
            min_len: 40,
        }
    }
}

/// A loop found by [`RepetitionDetector::push`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repetition {
    /// Length of the repeating unit.
    pub period: usize,
    /// Length of the repeated stretch that ends at the newest item: the unit's copies, the
    /// first one included (so `len - period` items are repeats).
    pub len: usize,
}

impl Repetition {
    /// Complete copies of the unit in the stretch.
    pub fn copies(&self) -> usize {
        self.len / self.period.max(1)
    }
}

/// Follows a sequence item by item (tokens, or the characters of a streamed answer) and
/// reports when its end is one unit repeated back to back: a model stuck in a loop.
///
/// For every period `p` up to `max_period` it keeps how many of the newest items equal the
/// item `p` before them; the newest `run + p` items then repeat a unit of `p`. Each push
/// costs `O(max_period)`, memory is `O(max_period)`.
///
/// ```
/// use sapient_sample::{RepetitionDetector, RepetitionOptions};
/// let mut d = RepetitionDetector::new(RepetitionOptions { max_period: 50, min_repeats: 3, min_len: 20 });
/// let text = "Pi is a number. It is a mathematical truth. It is a mathematical truth. It is a mathematical truth.";
/// let found = text.chars().find_map(|c| d.push(c)).expect("a loop");
/// assert_eq!(found.period, " It is a mathematical truth.".len());
/// ```
#[derive(Debug, Clone)]
pub struct RepetitionDetector<T> {
    opts: RepetitionOptions,
    /// The newest `max_period` items, oldest first.
    recent: VecDeque<T>,
    /// `runs[p - 1]`: how many of the newest items equal the item `p` before them.
    runs: Vec<usize>,
}

impl<T: PartialEq + Clone> RepetitionDetector<T> {
    pub fn new(opts: RepetitionOptions) -> Self {
        let opts = RepetitionOptions {
            max_period: opts.max_period.max(1),
            min_repeats: opts.min_repeats.max(2),
            min_len: opts.min_len,
        };
        Self {
            recent: VecDeque::with_capacity(opts.max_period + 1),
            runs: vec![0; opts.max_period],
            opts,
        }
    }

    /// Forgets everything pushed so far.
    pub fn reset(&mut self) {
        self.recent.clear();
        self.runs.iter_mut().for_each(|r| *r = 0);
    }

    /// Adds the next item; `Some` when the sequence now ends in a loop (the shortest unit
    /// that qualifies).
    pub fn push(&mut self, item: T) -> Option<Repetition> {
        let n = self.recent.len();
        let mut found = None;
        for p in 1..=self.opts.max_period {
            let run = &mut self.runs[p - 1];
            // `recent[n - p]` is the item `p` before the new one.
            if p <= n && self.recent[n - p] == item {
                *run += 1;
            } else {
                *run = 0;
            }
            let len = *run + p;
            if found.is_none()
                && *run > 0
                && len >= p * self.opts.min_repeats
                && len >= self.opts.min_len
            {
                found = Some(Repetition { period: p, len });
            }
        }
        if n == self.opts.max_period {
            self.recent.pop_front();
        }
        self.recent.push_back(item);
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn first_loop(opts: RepetitionOptions, s: &str) -> Option<(usize, Repetition)> {
        let mut d = RepetitionDetector::new(opts);
        s.chars()
            .enumerate()
            .find_map(|(i, c)| d.push(c).map(|r| (i, r)))
    }

    #[test]
    fn finds_a_repeated_sentence_when_its_third_copy_ends() {
        let unit = " It is a mathematical truth that pi is irrational and never ends.";
        let text = format!(
            "Pi is the ratio of a circle's circumference to its diameter!{}",
            unit.repeat(5)
        );
        let (at, r) = first_loop(RepetitionOptions::text(), &text).expect("loop");
        assert_eq!(r.period, unit.len());
        // Reported at the last character of the third copy, not before.
        let prefix = text.len() - 5 * unit.len();
        assert_eq!(at, prefix + 3 * unit.len() - 1);
        assert_eq!(r.copies(), 3);
    }

    #[test]
    fn ordinary_text_and_short_repeats_pass() {
        let prose = "The quick brown fox jumps over the lazy dog. A stitch in time saves nine. \
                     | a | b |\n|---|---|\n| 1 | 2 |\nHa ha ha! Well, well, well. 1, 2, 3, 4, 5, 6, 7, 8, 9, 10.";
        assert_eq!(first_loop(RepetitionOptions::text(), prose), None);
        // The same sentence twice is not a loop (three copies are needed).
        let twice = "This is fine and it is meant to be said again. ".repeat(2);
        assert_eq!(first_loop(RepetitionOptions::text(), &twice), None);
        // A short unit needs min_len characters: 100 dashes pass, 200 do not.
        assert_eq!(
            first_loop(RepetitionOptions::text(), &"-".repeat(100)),
            None
        );
        let (at, r) = first_loop(RepetitionOptions::text(), &"-".repeat(200)).expect("loop");
        assert_eq!((at, r.period), (159, 1));
    }

    #[test]
    fn longest_period_and_reset() {
        let opts = RepetitionOptions {
            max_period: 10,
            min_repeats: 2,
            min_len: 0,
        };
        let unit = "abcdefghij"; // period 10 = max_period: found
        assert_eq!(
            first_loop(opts, &unit.repeat(2)).map(|(i, r)| (i, r.period)),
            Some((19, 10))
        );
        let unit = "abcdefghijk"; // period 11 > max_period: never
        assert_eq!(first_loop(opts, &unit.repeat(4)), None);
        let mut d = RepetitionDetector::new(RepetitionOptions {
            max_period: 4,
            min_repeats: 3,
            min_len: 0,
        });
        assert!([1, 2, 1, 2, 1].into_iter().all(|t| d.push(t).is_none()));
        assert_eq!(d.push(2), Some(Repetition { period: 2, len: 6 }));
        d.reset();
        assert!([2, 1, 2].into_iter().all(|t| d.push(t).is_none()));
    }

    #[test]
    fn token_loops() {
        let mut d = RepetitionDetector::new(RepetitionOptions::tokens());
        let intro: Vec<u32> = (100..130).collect();
        let unit: Vec<u32> = (1..=15).collect();
        let seq: Vec<u32> = intro
            .iter()
            .chain(unit.iter().cycle().take(60))
            .copied()
            .collect();
        let (at, r) = seq
            .iter()
            .enumerate()
            .find_map(|(i, &t)| d.push(t).map(|r| (i, r)))
            .expect("loop");
        assert_eq!(r.period, 15);
        assert_eq!(at, 30 + 45 - 1); // three copies make 45 >= min_len 40
    }
}
