//! Turn-taking on the input: Silero VAD window by window (sapient-audio's [`SileroVad`] and
//! its segmenter, [`SegmenterState`], with the end-of-turn silence as its minimum silence),
//! and the 16 kHz audio of the turn being spoken.

use crate::{Result, TurnOptions};
use sapient_audio::vad::SegmenterState;
use sapient_audio::{SileroVad, VadOptions, VadSegmenter};

/// Silero's window at 16 kHz.
const WINDOW: usize = 512;
pub(crate) const RATE: usize = 16_000;

pub(crate) fn ms_to_samples(ms: u32) -> usize {
    ms as usize * RATE / 1000
}

/// What the input did (sample indices at 16 kHz from the start of the stream).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum TurnEvent {
    /// A window reached the threshold: the user may be speaking.
    Started { at: usize },
    /// The speech has lasted `barge_in_ms`: it interrupts a reply being played.
    Confirmed { at: usize },
    /// Silence of `pause_ms` inside the speech: `[start, end)` is what was said so far.
    Paused { start: usize, end: usize },
    /// Speech again after a pause was reported: the turn goes on.
    Resumed,
    /// The silence lasted `end_of_turn_ms`: the turn is `[start, end)`.
    Ended { start: usize, end: usize },
    /// The speech stopped before `min_speech_ms`: not a turn.
    Dropped { at: usize },
}

/// The segmenter for `opts`: a stretch of speech ends after the end-of-turn silence, and
/// shorter ones than the minimum speech are dropped; no padding.
fn segmenter(opts: &TurnOptions) -> Result<VadSegmenter> {
    opts.validate()?;
    Ok(VadSegmenter::new(VadOptions {
        threshold: opts.threshold,
        min_speech_ms: opts.min_speech_ms,
        min_silence_ms: opts.end_of_turn_ms,
        speech_pad_ms: 0,
        ..VadOptions::default()
    })?)
}

pub(crate) struct TurnDetector {
    vad: SileroVad,
    seg: SegmenterState,
    segmenter: VadSegmenter,
    opts: TurnOptions,
    /// 16 kHz samples not yet a whole window.
    partial: Vec<f32>,
    /// Audio kept, `audio[0]` being sample `audio_start` of the stream.
    audio: Vec<f32>,
    audio_start: usize,
    /// Samples the VAD has seen (whole windows), and the stream position the segmenter
    /// started at (its sample indices count from there).
    pos: usize,
    base: usize,
    /// The open stretch's start, once reported; whether it was confirmed; the silence
    /// start reported as a pause.
    started: Option<usize>,
    confirmed: bool,
    paused_at: Option<usize>,
}

impl TurnDetector {
    pub(crate) fn new(vad: SileroVad, opts: TurnOptions) -> Result<Self> {
        let segmenter = segmenter(&opts)?;
        Ok(Self {
            vad,
            seg: segmenter.start(),
            segmenter,
            opts,
            partial: Vec::new(),
            audio: Vec::new(),
            audio_start: 0,
            pos: 0,
            base: 0,
            started: None,
            confirmed: false,
            paused_at: None,
        })
    }

    /// Samples of 16 kHz audio received so far.
    pub(crate) fn position(&self) -> usize {
        self.audio_start + self.audio.len()
    }

    pub(crate) fn set_options(&mut self, opts: TurnOptions) -> Result<()> {
        self.segmenter = segmenter(&opts)?;
        self.opts = opts;
        self.restart();
        Ok(())
    }

    /// Feeds 16 kHz samples; returns what they did. With `detect` false the audio is only
    /// kept (turns are committed by hand).
    pub(crate) fn push(&mut self, s16: &[f32], detect: bool) -> Result<Vec<TurnEvent>> {
        self.audio.extend_from_slice(s16);
        let mut out = Vec::new();
        if !detect {
            return Ok(out);
        }
        self.partial.extend_from_slice(s16);
        let whole = self.partial.len() / WINDOW * WINDOW;
        if whole == 0 {
            return Ok(out);
        }
        let windows: Vec<f32> = self.partial.drain(..whole).collect();
        let probs = self.vad.process_windows(&windows)?;
        for p in probs {
            self.pos += WINDOW;
            let segs = self.seg.push(p);
            for s in segs {
                out.push(TurnEvent::Ended { start: s.start + self.base, end: s.end + self.base });
                self.started = None;
                self.confirmed = false;
                self.paused_at = None;
            }
            self.observe(&mut out);
        }
        Ok(out)
    }

    /// End of the input: an open stretch long enough is a turn.
    pub(crate) fn finish(&mut self) -> Vec<TurnEvent> {
        let base = self.base;
        let seen = (self.pos - base) as i64;
        let mut out: Vec<TurnEvent> =
            self.seg.finish(seen).into_iter().map(|s| TurnEvent::Ended { start: s.start + base, end: s.end + base }).collect();
        if out.is_empty() {
            if let Some(at) = self.started {
                out.push(TurnEvent::Dropped { at });
            }
        }
        self.restart();
        out
    }

    /// The audio `[start, end)` with the prefix padding before it and up to
    /// `trailing_ms` after it (as far as received).
    pub(crate) fn turn_audio(&self, start: usize, end: usize, trailing_ms: u32) -> Vec<f32> {
        let from = start.saturating_sub(ms_to_samples(self.opts.prefix_padding_ms)).max(self.audio_start);
        let to = (end + ms_to_samples(trailing_ms)).min(self.position()).max(from);
        self.audio[from - self.audio_start..to - self.audio_start].to_vec()
    }

    /// Everything kept (a turn committed by hand), and forget it.
    pub(crate) fn take_all(&mut self) -> Vec<f32> {
        let all = std::mem::take(&mut self.audio);
        self.audio_start += all.len();
        self.restart();
        all
    }

    /// Forget the audio kept and any open stretch (`input_audio_buffer.clear`).
    pub(crate) fn clear(&mut self) {
        self.audio_start += self.audio.len();
        self.audio.clear();
        self.restart();
    }

    /// Forget the audio of a turn that has been handed on (everything up to `end`), keeping
    /// the prefix padding for the next one.
    pub(crate) fn consumed(&mut self, end: usize) {
        let keep_from = end.max(self.audio_start);
        let n = (keep_from - self.audio_start).min(self.audio.len());
        self.audio.drain(..n);
        self.audio_start += n;
    }

    fn restart(&mut self) {
        self.seg = self.segmenter.start();
        self.seg_offset_reset();
        self.started = None;
        self.confirmed = false;
        self.paused_at = None;
    }

    /// The segmenter counts samples from its own start, `base` in the stream.
    fn seg_offset_reset(&mut self) {
        self.partial.clear();
        self.pos = self.position();
        self.base = self.pos;
    }

    fn observe(&mut self, out: &mut Vec<TurnEvent>) {
        let base = self.base;
        match self.seg.speech_start() {
            Some(s) => {
                let s = s + base;
                if self.started.is_none() {
                    self.started = Some(s);
                    self.confirmed = false;
                    self.paused_at = None;
                    out.push(TurnEvent::Started { at: s });
                }
                let silence = self.seg.silence_start().map(|x| x + base);
                if !self.confirmed && silence.is_none() && self.pos >= s + ms_to_samples(self.opts.barge_in_ms) {
                    self.confirmed = true;
                    out.push(TurnEvent::Confirmed { at: self.pos });
                }
                match silence {
                    Some(q) if self.paused_at != Some(q) && self.pos >= q + ms_to_samples(self.opts.pause_ms) => {
                        self.paused_at = Some(q);
                        out.push(TurnEvent::Paused { start: s, end: q });
                    }
                    None if self.paused_at.is_some() => {
                        self.paused_at = None;
                        out.push(TurnEvent::Resumed);
                    }
                    _ => {}
                }
            }
            None => {
                if let Some(at) = self.started.take() {
                    out.push(TurnEvent::Dropped { at });
                }
            }
        }
    }

    /// Outside speech, keep only the prefix padding (call after the events of a push are
    /// handled: a turn that just ended still needs its audio).
    pub(crate) fn trim(&mut self) {
        if self.started.is_some() {
            return;
        }
        let keep = ms_to_samples(self.opts.prefix_padding_ms) + WINDOW;
        if self.audio.len() > keep + RATE {
            let n = self.audio.len() - keep;
            self.audio.drain(..n);
            self.audio_start += n;
        }
    }
}
