//! Detecting a generation that repeats itself: most of what it has said lately it had
//! already said, word for word.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashSet, VecDeque};
use std::hash::{Hash, Hasher};

/// When [`RepetitionDetector`] reports a loop.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RepetitionOptions {
    /// Length of the runs compared (items: words of text, or token ids).
    pub ngram: usize,
    /// How many of the newest runs are looked at.
    pub window: usize,
    /// The share of those runs that must have appeared earlier for a loop (0..=1).
    pub min_repeated: f32,
}

impl RepetitionOptions {
    /// For the words of generated text: three quarters of the last 64 runs of 8 words
    /// already said (a paragraph coming round again, with a word changed here and there).
    pub fn words() -> Self {
        Self { ngram: 8, window: 64, min_repeated: 0.75 }
    }

    /// For token ids: three quarters of the last 96 runs of 10 tokens already generated.
    pub fn tokens() -> Self {
        Self { ngram: 10, window: 96, min_repeated: 0.75 }
    }
}

/// A loop found by [`RepetitionDetector::push`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repetition {
    /// How many of the window's runs had appeared before.
    pub repeated: usize,
    /// How many items were pushed before the window's first run began: the text up to there
    /// is what was said before the loop took over.
    pub since: usize,
}

/// Follows a sequence item by item (the words of a streamed answer, or token ids) and
/// reports when it has started to go round in circles: most of its recent runs of
/// `ngram` items repeat earlier ones exactly. Near-repeats count as long as most runs are
/// exact (a paragraph said again with one word changed still repeats the runs that do not
/// touch that word), and a loop's period does not matter.
///
/// Each push costs one hash of `ngram` items; memory grows with the number of distinct
/// runs seen (one `u64` each).
///
/// ```
/// use sapient_sample::{RepetitionDetector, RepetitionOptions};
/// let mut d = RepetitionDetector::new(RepetitionOptions { ngram: 4, window: 16, min_repeated: 0.75 });
/// let text = "Pi is a number. It is a mathematical truth that never ends. ".repeat(4);
/// let found = text.split_whitespace().find_map(|w| d.push(w.to_string()));
/// assert!(found.is_some());
/// ```
#[derive(Debug, Clone)]
pub struct RepetitionDetector<T> {
    opts: RepetitionOptions,
    /// The newest `ngram` items.
    recent: VecDeque<T>,
    /// Hashes of every run seen so far.
    seen: HashSet<u64>,
    /// For the newest `window` runs, whether each had been seen before.
    flags: VecDeque<bool>,
    repeated: usize,
    pushed: usize,
}

impl<T: Hash + Clone> RepetitionDetector<T> {
    pub fn new(opts: RepetitionOptions) -> Self {
        let opts = RepetitionOptions {
            ngram: opts.ngram.max(1),
            window: opts.window.max(1),
            min_repeated: opts.min_repeated.clamp(0.0, 1.0),
        };
        Self {
            recent: VecDeque::with_capacity(opts.ngram),
            seen: HashSet::new(),
            flags: VecDeque::with_capacity(opts.window),
            repeated: 0,
            pushed: 0,
            opts,
        }
    }

    /// Forgets everything pushed so far.
    pub fn reset(&mut self) {
        *self = Self::new(self.opts);
    }

    /// Adds the next item; `Some` when the sequence now loops.
    pub fn push(&mut self, item: T) -> Option<Repetition> {
        self.pushed += 1;
        if self.recent.len() == self.opts.ngram {
            self.recent.pop_front();
        }
        self.recent.push_back(item);
        if self.recent.len() < self.opts.ngram {
            return None;
        }
        let mut h = DefaultHasher::new();
        self.recent.iter().for_each(|x| x.hash(&mut h));
        let again = !self.seen.insert(h.finish());
        if self.flags.len() == self.opts.window && self.flags.pop_front() == Some(true) {
            self.repeated -= 1;
        }
        self.flags.push_back(again);
        self.repeated += again as usize;
        let full = self.flags.len() == self.opts.window;
        (full && self.repeated as f32 >= self.opts.min_repeated * self.opts.window as f32).then(|| Repetition {
            repeated: self.repeated,
            since: self.pushed - (self.opts.window + self.opts.ngram - 1),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn first_loop(text: &str) -> Option<(usize, Repetition)> {
        let mut d = RepetitionDetector::new(RepetitionOptions::words());
        text.split_whitespace().enumerate().find_map(|(i, w)| d.push(w.to_string()).map(|r| (i, r)))
    }

    const STORY: &str = "Pi is a fundamental mathematical constant representing the ratio of a circle's \
        circumference to its diameter. It is an irrational number that has been observed in many \
        places throughout history, from ancient civilizations to modern science and engineering.";

    #[test]
    fn a_paragraph_coming_round_again_is_a_loop() {
        let a = "Pi has been observed in numerous natural phenomena throughout history, from the orbits \
                 of planets around stars to the shape of the Earth's crust and its pull on other bodies.";
        let b = "Pi has been used in various applications throughout history, from engineering and \
                 architecture to music and physics. Its unique properties have inspired countless solutions.";
        // As SmolLM2 does it: the two paragraphs alternate, one word changing between rounds.
        let a2 = a.replace("numerous", "various");
        let text = [STORY, a, b, &a2, b, a, b, &a2, b].join("\n\n");
        let (at, r) = first_loop(&text).expect("loop");
        let words = |s: &str| s.split_whitespace().count();
        let first_round = words(STORY) + words(a) + words(b);
        // Found during the third paragraph pair at the latest, not during the first pair.
        assert!(at > first_round && at < first_round + 2 * (words(a) + words(b)), "{at}");
        assert!(r.since >= words(STORY) && r.repeated >= 48, "{r:?}");
    }

    #[test]
    fn ordinary_text_passes() {
        // Prose that reuses phrases, lists and a table, none of it a loop.
        let text = format!(
            "{STORY} The number pi is used in geometry. The number e is used in calculus. The \
             number i is used in algebra. | a | b |\n|---|---|\n| 1 | 2 |\n| 3 | 4 | Step 1: mix the \
             flour. Step 2: mix the eggs. Step 3: mix the two. In short, pi is a number, e is a \
             number and i is a number, and each of them is used in many places. {STORY}"
        );
        assert_eq!(first_loop(&text), None);
        // The same sentence said twice is not a loop either.
        assert_eq!(first_loop(&format!("{STORY} {STORY}")), None);
    }

    #[test]
    fn token_loops_and_reset() {
        let mut d = RepetitionDetector::new(RepetitionOptions::tokens());
        let intro: Vec<u32> = (100..300).collect();
        let unit: Vec<u32> = (1..=37).collect();
        let seq: Vec<u32> = intro.iter().chain(unit.iter().cycle().take(400)).copied().collect();
        let (at, r) = seq.iter().enumerate().find_map(|(i, &t)| d.push(t).map(|r| (i, r))).expect("loop");
        // The runs start repeating one period into the loop; 72 of 96 must repeat.
        assert_eq!(at, 200 + 37 + 9 + 72 - 1);
        assert_eq!((r.repeated, r.since), (72, at + 1 - (96 + 9)));
        d.reset();
        assert!(intro.iter().all(|&t| d.push(t).is_none()));
    }
}
