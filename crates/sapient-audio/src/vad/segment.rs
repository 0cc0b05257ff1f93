//! Speech segments from per-window probabilities: a port of
//! `silero_vad.utils_vad.get_speech_timestamps_from_probs` (hysteresis with `threshold` and
//! `threshold - 0.15`, minimum speech and silence, maximum speech with a cut at the longest
//! silence, padding split between close segments), written as a state machine fed one
//! probability at a time so that the streaming [`crate::stream::VoicedChunker`] and the
//! offline [`VadSegmenter::segments`] give identical results.

use super::silero::{VAD_SAMPLE_RATE, WINDOW};
use crate::error::{Error, Result};

/// Segmenter options (defaults are Silero's).
#[derive(Debug, Clone, PartialEq)]
pub struct VadOptions {
    /// Probability at or above which a window is speech.
    pub threshold: f32,
    /// Probability below which speech ends; default `max(threshold - 0.15, 0.01)`.
    pub neg_threshold: Option<f32>,
    /// Segments shorter than this are dropped.
    pub min_speech_ms: u32,
    /// Silence needed to end a segment.
    pub min_silence_ms: u32,
    /// Padding added on each side of a segment.
    pub speech_pad_ms: u32,
    /// Longer segments are cut (at the longest silence inside when there is one).
    pub max_speech_s: f64,
    /// Silences shorter than this are not cut candidates at `max_speech_s`.
    pub min_silence_at_max_speech_ms: u32,
    /// Cut at the longest silence (true) or the last one (false).
    pub use_max_possible_silence_at_max_speech: bool,
}

impl Default for VadOptions {
    fn default() -> Self {
        Self {
            threshold: 0.5,
            neg_threshold: None,
            min_speech_ms: 250,
            min_silence_ms: 100,
            speech_pad_ms: 30,
            max_speech_s: f64::INFINITY,
            min_silence_at_max_speech_ms: 98,
            use_max_possible_silence_at_max_speech: true,
        }
    }
}

impl VadOptions {
    fn validate(&self) -> Result<()> {
        let bad = |name, detail: String| Err(Error::InvalidOption { name, detail });
        if !(self.threshold > 0.0 && self.threshold < 1.0) {
            return bad("threshold", format!("{} is not in (0, 1)", self.threshold));
        }
        if let Some(n) = self.neg_threshold {
            if !(n > 0.0 && n <= self.threshold) {
                return bad("neg_threshold", format!("{n} is not in (0, threshold]"));
            }
        }
        if self.max_speech_s.is_nan() || self.max_speech_s <= 0.0 {
            return bad("max_speech_s", format!("{} is not positive", self.max_speech_s));
        }
        let sr = VAD_SAMPLE_RATE as f64;
        if self.max_speech_s.is_finite() && sr * self.max_speech_s - WINDOW as f64 - 2.0 * self.pad_samples() <= 0.0 {
            return bad("max_speech_s", format!("{} s leaves no room for a window and the padding", self.max_speech_s));
        }
        Ok(())
    }

    fn pad_samples(&self) -> f64 {
        VAD_SAMPLE_RATE as f64 * self.speech_pad_ms as f64 / 1000.0
    }
}

/// A speech segment: sample indices at 16 kHz and seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpeechSegment {
    pub start: usize,
    pub end: usize,
    pub start_s: f64,
    pub end_s: f64,
}

impl SpeechSegment {
    fn new(start: i64, end: i64) -> Self {
        let (start, end) = (start.max(0) as usize, end.max(0) as usize);
        let sr = VAD_SAMPLE_RATE as f64;
        Self { start, end, start_s: start as f64 / sr, end_s: end as f64 / sr }
    }

    pub fn duration_s(&self) -> f64 {
        self.end_s - self.start_s
    }
}

/// Turns per-window probabilities into [`SpeechSegment`]s.
#[derive(Debug, Clone)]
pub struct VadSegmenter {
    opts: VadOptions,
}

impl VadSegmenter {
    pub fn new(opts: VadOptions) -> Result<Self> {
        opts.validate()?;
        Ok(Self { opts })
    }

    pub fn options(&self) -> &VadOptions {
        &self.opts
    }

    /// Segments of a whole recording: `probs` has one value per 512 samples of
    /// `audio_len` samples at 16 kHz.
    pub fn segments(&self, probs: &[f32], audio_len: usize) -> Vec<SpeechSegment> {
        let mut st = SegmenterState::new(&self.opts);
        let mut out = Vec::new();
        for &p in probs {
            out.extend(st.push(p));
        }
        out.extend(st.finish(audio_len as i64));
        out
    }

    /// An incremental segmenter (see [`SegmenterState`]).
    pub fn start(&self) -> SegmenterState {
        SegmenterState::new(&self.opts)
    }
}

/// The segmenter fed one probability at a time. [`SegmenterState::push`] returns the segments
/// that became final (their padding can no longer change); [`SegmenterState::finish`] the
/// rest.
#[derive(Debug, Clone)]
pub struct SegmenterState {
    threshold: f32,
    neg_threshold: f32,
    min_speech: f64,
    pad: f64,
    max_speech: f64,
    min_silence: f64,
    min_silence_at_max: f64,
    use_max_poss: bool,
    window: i64,
    // get_speech_timestamps_from_probs state
    i: i64,
    triggered: bool,
    current_start: Option<i64>,
    temp_end: i64,
    prev_end: i64,
    next_start: i64,
    possible_ends: Vec<(i64, i64)>,
    // padding stage: a raw segment waiting for its neighbour, its start already padded
    pending: Option<(i64, i64)>,
    first: bool,
    /// The previous segment was handed out before this one was known: its gap is at least
    /// 2 * pad, so this one's start gets the full padding.
    pad_next: bool,
}

impl SegmenterState {
    fn new(o: &VadOptions) -> Self {
        let sr = VAD_SAMPLE_RATE as f64;
        let pad = o.pad_samples();
        Self {
            threshold: o.threshold,
            neg_threshold: o.neg_threshold.unwrap_or((o.threshold - 0.15).max(0.01)),
            min_speech: sr * o.min_speech_ms as f64 / 1000.0,
            pad,
            max_speech: sr * o.max_speech_s - WINDOW as f64 - 2.0 * pad,
            min_silence: sr * o.min_silence_ms as f64 / 1000.0,
            min_silence_at_max: sr * o.min_silence_at_max_speech_ms as f64 / 1000.0,
            use_max_poss: o.use_max_possible_silence_at_max_speech,
            window: WINDOW as i64,
            i: 0,
            triggered: false,
            current_start: None,
            temp_end: 0,
            prev_end: 0,
            next_start: 0,
            possible_ends: Vec::new(),
            pending: None,
            first: true,
            pad_next: false,
        }
    }

    /// Samples covered by the probabilities pushed so far.
    pub fn position(&self) -> usize {
        (self.i * self.window) as usize
    }

    /// The earliest sample a segment not yet returned can start at (audio before it is no
    /// longer needed by a chunker).
    pub fn earliest_pending_start(&self) -> usize {
        let mut e = (self.i * self.window) as f64 - self.pad;
        if let Some((s, _)) = self.pending {
            e = e.min(s as f64);
        }
        if let Some(s) = self.current_start {
            e = e.min(s as f64 - self.pad);
        }
        e.max(0.0) as usize
    }

    /// While a stretch of speech is open (a window reached the threshold and the silence
    /// since has not yet closed it): the sample it started at. For turn-taking on a live
    /// stream (speech started, the user still talking).
    pub fn speech_start(&self) -> Option<usize> {
        if self.triggered {
            self.current_start.map(|s| s.max(0) as usize)
        } else {
            None
        }
    }

    /// While speech is open and the last windows were below the negative threshold: the
    /// sample that silence began at (the stretch ends once it lasts `min_silence_ms`).
    pub fn silence_start(&self) -> Option<usize> {
        (self.triggered && self.temp_end != 0).then_some(self.temp_end.max(0) as usize)
    }

    /// Feeds the probability of the next window.
    pub fn push(&mut self, prob: f32) -> Vec<SpeechSegment> {
        let mut done = Vec::new();
        let cur = self.window * self.i;
        self.i += 1;
        let raw = self.step(prob, cur);
        for seg in raw {
            self.add_raw(seg, &mut done);
        }
        // The pending segment is final once no later segment can start within 2 * pad. (`cur`
        // rather than the next window's start: the last window may be partial, and this keeps
        // `end + pad` inside the audio.)
        let earliest_next = if self.triggered { self.current_start.unwrap_or(cur) } else { cur };
        if let Some((s, e)) = self.pending {
            if (earliest_next - e) as f64 >= 2.0 * self.pad {
                done.push(SpeechSegment::new(s, (e as f64 + self.pad) as i64));
                self.pending = None;
                self.pad_next = true;
            }
        }
        done
    }

    /// Ends the recording of `audio_len` samples.
    pub fn finish(&mut self, audio_len: i64) -> Vec<SpeechSegment> {
        let mut done = Vec::new();
        if let Some(start) = self.current_start.take() {
            if (audio_len - start) as f64 > self.min_speech {
                self.add_raw((start, audio_len), &mut done);
            }
        }
        self.triggered = false;
        if let Some((s, e)) = self.pending.take() {
            done.push(SpeechSegment::new(s, (audio_len as f64).min(e as f64 + self.pad) as i64));
        }
        done
    }

    /// Padding stage (`for i, speech in enumerate(speeches)` in Python), one segment at a time.
    fn add_raw(&mut self, (start, end): (i64, i64), done: &mut Vec<SpeechSegment>) {
        let mut start = start;
        if self.first || self.pad_next {
            start = (start as f64 - self.pad).max(0.0) as i64;
            self.first = false;
            self.pad_next = false;
        }
        if let Some((ps, pe)) = self.pending.take() {
            let silence = start - pe;
            if (silence as f64) < 2.0 * self.pad {
                done.push(SpeechSegment::new(ps, pe + silence.div_euclid(2)));
                start = (start - silence.div_euclid(2)).max(0);
            } else {
                // end + pad cannot pass the audio's end: a later segment starts after it.
                done.push(SpeechSegment::new(ps, (pe as f64 + self.pad) as i64));
                start = (start as f64 - self.pad).max(0.0) as i64;
            }
        }
        self.pending = Some((start, end));
    }

    /// One iteration of the Python loop; returns raw segments appended to `speeches`.
    fn step(&mut self, p: f32, cur: i64) -> Vec<(i64, i64)> {
        let mut out = Vec::new();
        if p >= self.threshold && self.temp_end != 0 {
            let sil = cur - self.temp_end;
            if sil as f64 > self.min_silence_at_max {
                self.possible_ends.push((self.temp_end, sil));
            }
            self.temp_end = 0;
            if self.next_start < self.prev_end {
                self.next_start = cur;
            }
        }
        if p >= self.threshold && !self.triggered {
            self.triggered = true;
            self.current_start = Some(cur);
            return out;
        }
        if self.triggered {
            if let Some(start) = self.current_start {
                if (cur - start) as f64 > self.max_speech {
                    if self.use_max_poss && !self.possible_ends.is_empty() {
                        let mut best = self.possible_ends[0];
                        for &pe in &self.possible_ends[1..] {
                            if pe.1 > best.1 {
                                best = pe; // Python's max keeps the first of equal maxima
                            }
                        }
                        let (prev_end, dur) = best;
                        out.push((start, prev_end));
                        self.current_start = None;
                        let next_start = prev_end + dur;
                        if next_start < prev_end + cur {
                            self.current_start = Some(next_start);
                        } else {
                            self.triggered = false;
                        }
                        self.prev_end = 0;
                        self.next_start = 0;
                        self.temp_end = 0;
                        self.possible_ends.clear();
                    } else if self.prev_end != 0 {
                        out.push((start, self.prev_end));
                        self.current_start = None;
                        if self.next_start < self.prev_end {
                            self.triggered = false;
                        } else {
                            self.current_start = Some(self.next_start);
                        }
                        self.prev_end = 0;
                        self.next_start = 0;
                        self.temp_end = 0;
                        self.possible_ends.clear();
                    } else {
                        out.push((start, cur));
                        self.current_start = None;
                        self.prev_end = 0;
                        self.next_start = 0;
                        self.temp_end = 0;
                        self.triggered = false;
                        self.possible_ends.clear();
                        return out;
                    }
                }
            }
        }
        if p < self.neg_threshold && self.triggered {
            if self.temp_end == 0 {
                self.temp_end = cur;
            }
            let sil_now = cur - self.temp_end;
            if !self.use_max_poss && sil_now as f64 > self.min_silence_at_max {
                self.prev_end = self.temp_end;
            }
            if (sil_now as f64) < self.min_silence {
                return out;
            }
            if let Some(start) = self.current_start.take() {
                if (self.temp_end - start) as f64 > self.min_speech {
                    out.push((start, self.temp_end));
                }
            }
            self.prev_end = 0;
            self.next_start = 0;
            self.temp_end = 0;
            self.triggered = false;
            self.possible_ends.clear();
        }
        out
    }
}
