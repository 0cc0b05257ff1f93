//! Streams of audio chunks and a VAD chunker over them.
//!
//! [`AudioStream`] is a pull interface (mono `f32` chunks at a fixed rate) implemented by a
//! file ([`FileStream`], decoded lazily), memory ([`SamplesStream`]), any iterator
//! ([`IterStream`]), any `futures::Stream` ([`BlockingStream`]), a resampling adapter
//! ([`Resampled`]) and, with the `mic` feature, the microphone (`MicInput`). Everything
//! downstream can therefore be tested without a sound card.
//!
//! [`VoicedChunker`] is push-based (feed samples, get finished [`VoicedSegment`]s); it is
//! driven by a blocking [`AudioStream`] with [`VoicedChunker::segments`] or by an async
//! `Stream` with [`voiced_segments`].

use crate::decode::Decoder;
use crate::error::{check_rate, Error, Result};
use crate::resample::Resampler;
use crate::vad::{SegmenterState, SileroVad, SpeechSegment, VadOptions, VadSegmenter, VAD_SAMPLE_RATE, WINDOW};
use futures::{Stream, StreamExt};
use std::collections::VecDeque;
use std::path::Path;

/// A source of mono audio chunks at a fixed sample rate.
pub trait AudioStream {
    /// Rate of every chunk.
    fn sample_rate(&self) -> u32;

    /// The next chunk (any length, possibly empty); `None` at the end.
    fn next_chunk(&mut self) -> Option<Result<Vec<f32>>>;

    /// This stream converted to another rate.
    fn resampled(self, to: u32) -> Result<Resampled<Self>>
    where
        Self: Sized,
    {
        Resampled::new(self, to)
    }

    /// Reads the rest of the stream into memory.
    fn collect_samples(&mut self) -> Result<Vec<f32>> {
        let mut out = Vec::new();
        while let Some(c) = self.next_chunk() {
            out.extend(c?);
        }
        Ok(out)
    }
}

impl<S: AudioStream + ?Sized> AudioStream for Box<S> {
    fn sample_rate(&self) -> u32 {
        (**self).sample_rate()
    }
    fn next_chunk(&mut self) -> Option<Result<Vec<f32>>> {
        (**self).next_chunk()
    }
}

/// A file decoded packet by packet.
#[derive(Debug)]
pub struct FileStream {
    decoder: Decoder,
}

impl FileStream {
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Ok(Self { decoder: Decoder::open(path)? })
    }
}

impl AudioStream for FileStream {
    fn sample_rate(&self) -> u32 {
        self.decoder.sample_rate()
    }
    fn next_chunk(&mut self) -> Option<Result<Vec<f32>>> {
        self.decoder.next_chunk()
    }
}

/// Samples in memory, served in chunks of a fixed length.
#[derive(Debug, Clone)]
pub struct SamplesStream {
    samples: Vec<f32>,
    rate: u32,
    chunk: usize,
    at: usize,
}

impl SamplesStream {
    pub fn new(samples: Vec<f32>, sample_rate: u32, chunk_len: usize) -> Result<Self> {
        check_rate(sample_rate)?;
        if chunk_len == 0 {
            return Err(Error::InvalidOption { name: "chunk_len", detail: "must be at least 1".into() });
        }
        Ok(Self { samples, rate: sample_rate, chunk: chunk_len, at: 0 })
    }
}

impl AudioStream for SamplesStream {
    fn sample_rate(&self) -> u32 {
        self.rate
    }
    fn next_chunk(&mut self) -> Option<Result<Vec<f32>>> {
        if self.at >= self.samples.len() {
            return None;
        }
        let end = (self.at + self.chunk).min(self.samples.len());
        let c = self.samples[self.at..end].to_vec();
        self.at = end;
        Some(Ok(c))
    }
}

/// Any iterator of chunks.
pub struct IterStream<I> {
    iter: I,
    rate: u32,
}

impl<I> IterStream<I> {
    pub fn new(iter: I, sample_rate: u32) -> Result<Self> {
        Ok(Self { iter, rate: check_rate(sample_rate)? })
    }
}

impl<I: Iterator<Item = Vec<f32>>> AudioStream for IterStream<I> {
    fn sample_rate(&self) -> u32 {
        self.rate
    }
    fn next_chunk(&mut self) -> Option<Result<Vec<f32>>> {
        self.iter.next().map(Ok)
    }
}

/// Any `futures::Stream` of chunk results, pulled by blocking on it (for a worker thread;
/// async code uses [`voiced_segments`] or the stream directly).
pub struct BlockingStream<S> {
    stream: S,
    rate: u32,
}

impl<S> BlockingStream<S> {
    pub fn new(stream: S, sample_rate: u32) -> Result<Self> {
        Ok(Self { stream, rate: check_rate(sample_rate)? })
    }
}

impl<S: Stream<Item = Result<Vec<f32>>> + Unpin> AudioStream for BlockingStream<S> {
    fn sample_rate(&self) -> u32 {
        self.rate
    }
    fn next_chunk(&mut self) -> Option<Result<Vec<f32>>> {
        futures::executor::block_on(self.stream.next())
    }
}

/// A stream converted to another rate chunk by chunk.
pub struct Resampled<S> {
    inner: S,
    resampler: Resampler,
    done: bool,
}

impl<S: AudioStream> Resampled<S> {
    pub fn new(inner: S, to: u32) -> Result<Self> {
        let resampler = Resampler::new(inner.sample_rate(), to)?;
        Ok(Self { inner, resampler, done: false })
    }

    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: AudioStream> AudioStream for Resampled<S> {
    fn sample_rate(&self) -> u32 {
        self.resampler.to_rate()
    }
    fn next_chunk(&mut self) -> Option<Result<Vec<f32>>> {
        if self.done {
            return None;
        }
        match self.inner.next_chunk() {
            Some(Ok(c)) => Some(self.resampler.process(&c)),
            Some(Err(e)) => {
                self.done = true;
                Some(Err(e))
            }
            None => {
                self.done = true;
                Some(self.resampler.finish())
            }
        }
    }
}

/// A voiced stretch of a stream: times in seconds from the start of the stream and its
/// 16 kHz samples (padding included).
#[derive(Debug, Clone, PartialEq)]
pub struct VoicedSegment {
    pub start_s: f64,
    pub end_s: f64,
    pub samples: Vec<f32>,
}

/// Cuts a live stream into voiced segments with Silero VAD: feed samples at the stream's rate
/// with [`VoicedChunker::push`] (they are resampled to 16 kHz), collect the segments whose
/// end is final, and call [`VoicedChunker::finish`] at the end. The segments equal
/// [`VadSegmenter::segments`] over the whole recording; only the audio a pending segment can
/// still need is kept.
pub struct VoicedChunker {
    vad: SileroVad,
    state: SegmenterState,
    resampler: Option<Resampler>,
    /// 16 kHz audio from global sample `buf_start`.
    buf: Vec<f32>,
    buf_start: usize,
    /// Samples of `buf` already run through the VAD (global index).
    analysed: usize,
    finished: bool,
}

impl std::fmt::Debug for VoicedChunker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VoicedChunker").field("analysed", &self.analysed).finish()
    }
}

impl VoicedChunker {
    /// A chunker for a stream at `sample_rate` (resampled to 16 kHz when it differs).
    pub fn new(mut vad: SileroVad, opts: VadOptions, sample_rate: u32) -> Result<Self> {
        let state = VadSegmenter::new(opts)?.start();
        vad.reset();
        let resampler = if check_rate(sample_rate)? == VAD_SAMPLE_RATE { None } else { Some(Resampler::new(sample_rate, VAD_SAMPLE_RATE)?) };
        Ok(Self { vad, state, resampler, buf: Vec::new(), buf_start: 0, analysed: 0, finished: false })
    }

    /// Feeds samples; returns the segments that became final.
    pub fn push(&mut self, samples: &[f32]) -> Result<Vec<VoicedSegment>> {
        if self.finished {
            return Err(Error::InvalidInput("VoicedChunker::push after finish".into()));
        }
        match self.resampler.as_mut() {
            Some(r) => {
                let s = r.process(samples)?;
                self.buf.extend_from_slice(&s);
            }
            None => {
                crate::error::check_finite("VAD input", samples)?;
                self.buf.extend_from_slice(samples);
            }
        }
        let end = self.buf_start + self.buf.len();
        let whole = (end - self.analysed) / WINDOW * WINDOW;
        let mut out = Vec::new();
        if whole > 0 {
            let from = self.analysed - self.buf_start;
            let probs = self.vad.process_windows(&self.buf[from..from + whole])?;
            self.analysed += whole;
            for p in probs {
                for seg in self.state.push(p) {
                    out.push(self.cut(seg));
                }
            }
        }
        self.trim();
        Ok(out)
    }

    /// Ends the stream; returns the remaining segments.
    pub fn finish(&mut self) -> Result<Vec<VoicedSegment>> {
        if self.finished {
            return Ok(Vec::new());
        }
        self.finished = true;
        if let Some(r) = self.resampler.as_mut() {
            let s = r.finish()?;
            self.buf.extend_from_slice(&s);
        }
        let end = self.buf_start + self.buf.len();
        let mut out = Vec::new();
        let whole = (end - self.analysed) / WINDOW * WINDOW;
        let from = self.analysed - self.buf_start;
        let mut probs = self.vad.process_windows(&self.buf[from..from + whole])?;
        if end > self.analysed + whole {
            let mut last = self.buf[from + whole..].to_vec();
            last.resize(WINDOW, 0.0);
            probs.push(self.vad.process_window(&last)?);
        }
        self.analysed = end;
        for p in probs {
            for seg in self.state.push(p) {
                out.push(self.cut(seg));
            }
        }
        for seg in self.state.finish(end as i64) {
            out.push(self.cut(seg));
        }
        Ok(out)
    }

    /// Pulls a whole [`AudioStream`] through the chunker, yielding segments as they become
    /// final.
    pub fn segments<S: AudioStream>(self, stream: S) -> Result<VoicedSegments<S>> {
        if stream.sample_rate() != self.input_rate() {
            return Err(Error::InvalidInput(format!(
                "the chunker was made for {} Hz, the stream is {} Hz",
                self.input_rate(),
                stream.sample_rate()
            )));
        }
        Ok(VoicedSegments { chunker: self, stream, ready: VecDeque::new(), done: false })
    }

    fn input_rate(&self) -> u32 {
        self.resampler.as_ref().map(|r| r.from_rate()).unwrap_or(VAD_SAMPLE_RATE)
    }

    /// Drops the VAD (e.g. to reuse it).
    pub fn into_vad(self) -> SileroVad {
        self.vad
    }

    fn cut(&self, seg: SpeechSegment) -> VoicedSegment {
        let end = self.buf_start + self.buf.len();
        let s = seg.start.clamp(self.buf_start, end) - self.buf_start;
        let e = seg.end.clamp(self.buf_start, end) - self.buf_start;
        if seg.start < self.buf_start {
            tracing::warn!(start = seg.start, kept_from = self.buf_start, "segment starts before the kept audio");
        }
        VoicedSegment { start_s: seg.start_s, end_s: seg.end_s, samples: self.buf[s..e.max(s)].to_vec() }
    }

    fn trim(&mut self) {
        let keep = self.state.earliest_pending_start().min(self.analysed);
        if keep > self.buf_start + 64 * 1024 {
            self.buf.drain(..keep - self.buf_start);
            self.buf_start = keep;
        }
    }
}

/// Iterator of [`VoicedSegment`]s over an [`AudioStream`] (see [`VoicedChunker::segments`]).
pub struct VoicedSegments<S> {
    chunker: VoicedChunker,
    stream: S,
    ready: VecDeque<VoicedSegment>,
    done: bool,
}

impl<S: AudioStream> Iterator for VoicedSegments<S> {
    type Item = Result<VoicedSegment>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(s) = self.ready.pop_front() {
                return Some(Ok(s));
            }
            if self.done {
                return None;
            }
            let r = match self.stream.next_chunk() {
                Some(Ok(c)) => self.chunker.push(&c),
                Some(Err(e)) => {
                    self.done = true;
                    return Some(Err(e));
                }
                None => {
                    self.done = true;
                    self.chunker.finish()
                }
            };
            match r {
                Ok(segs) => self.ready.extend(segs),
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            }
        }
    }
}

/// Voiced segments of an async stream of chunks at `sample_rate`, as an async stream.
pub fn voiced_segments<S>(
    stream: S,
    sample_rate: u32,
    vad: SileroVad,
    opts: VadOptions,
) -> Result<impl Stream<Item = Result<VoicedSegment>>>
where
    S: Stream<Item = Result<Vec<f32>>> + Unpin,
{
    let chunker = VoicedChunker::new(vad, opts, sample_rate)?;
    let state = (stream, chunker, VecDeque::<VoicedSegment>::new(), false);
    Ok(futures::stream::unfold(state, |(mut stream, mut chunker, mut ready, mut done)| async move {
        loop {
            if let Some(s) = ready.pop_front() {
                return Some((Ok(s), (stream, chunker, ready, done)));
            }
            if done {
                return None;
            }
            let r = match stream.next().await {
                Some(Ok(c)) => chunker.push(&c),
                Some(Err(e)) => Err(e),
                None => {
                    done = true;
                    chunker.finish()
                }
            };
            match r {
                Ok(segs) => ready.extend(segs),
                Err(e) => {
                    done = true;
                    return Some((Err(e), (stream, chunker, ready, done)));
                }
            }
        }
    }))
}
