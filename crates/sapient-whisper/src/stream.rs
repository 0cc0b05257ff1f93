//! Streaming transcription: audio pushed in chunks of any size (a file read packet by packet,
//! a microphone) is cut into voiced stretches by Silero VAD ([`VoicedChunker`]); each stretch
//! is transcribed once, as soon as the VAD has closed it, conditioned on the text of the
//! stretches before it, and its segments are handed out with times from the start of the
//! stream. Confirmed audio is never transcribed again.

use crate::transcribe::{Segment, TranscribeOptions, Transcriber, Transcript};
use crate::{Error, Result};
use sapient_audio::{AudioStream, SileroVad, VadOptions, VoicedChunker, VoicedSegment};

/// VAD settings for transcription: stretches end after 1 s of silence (a segment is decided
/// about a second after its speech ends), keep 300 ms of padding, and are cut (at their
/// longest silence) before 30 s so that each one fits a Whisper window. faster-whisper's
/// `vad_filter` waits 2 s; on the LibriVox test audio both give the same text.
pub fn default_vad_options() -> VadOptions {
    VadOptions { min_silence_ms: 1000, speech_pad_ms: 300, max_speech_s: 29.0, ..VadOptions::default() }
}

/// Push-based streaming transcription.
pub struct StreamingTranscriber<'a> {
    t: &'a Transcriber,
    chunker: VoicedChunker,
    opts: TranscribeOptions,
    previous: Vec<u32>,
    transcript: Transcript,
    samples_seen: usize,
    rate: u32,
    /// 16 kHz audio after the last decided stretch (for partial text), and its start (s).
    pending: Vec<f32>,
    pending_start: f64,
    resampler: Option<sapient_audio::Resampler>,
}

impl<'a> StreamingTranscriber<'a> {
    /// A stream at `sample_rate` (resampled to 16 kHz inside).
    pub fn new(t: &'a Transcriber, vad: SileroVad, vad_opts: VadOptions, sample_rate: u32, opts: TranscribeOptions) -> Result<Self> {
        let chunker = VoicedChunker::new(vad, vad_opts, sample_rate)?;
        let mut previous = Vec::new();
        if let Some(p) = &opts.initial_prompt {
            previous = t.tokenizer.encode(&format!(" {}", p.trim()))?;
        }
        Ok(Self {
            t,
            chunker,
            opts,
            previous,
            transcript: Transcript { language: String::new(), ..Default::default() },
            samples_seen: 0,
            rate: sample_rate,
            pending: Vec::new(),
            pending_start: 0.0,
            resampler: if sample_rate == 16_000 { None } else { Some(sapient_audio::Resampler::new(sample_rate, 16_000)?) },
        })
    }

    /// Feed samples; returns the segments decided by them (possibly none).
    pub fn push(&mut self, samples: &[f32]) -> Result<Vec<Segment>> {
        self.samples_seen += samples.len();
        match self.resampler.as_mut() {
            Some(r) => self.pending.extend(r.process(samples)?),
            None => self.pending.extend_from_slice(samples),
        }
        let voiced = self.chunker.push(samples)?;
        self.transcribe_voiced(voiced)
    }

    /// Unconfirmed text of the audio after the last decided stretch (greedy, no fallback,
    /// conditioned on the confirmed text); it may change until the VAD closes the stretch.
    /// Empty when nothing is pending. At most the last 30 s are looked at.
    pub fn partial(&self) -> Result<String> {
        let max = sapient_audio::mel::N_SAMPLES;
        let audio = &self.pending[self.pending.len().saturating_sub(max)..];
        if audio.len() < 16_000 / 10 {
            return Ok(String::new());
        }
        let opts = TranscribeOptions {
            temperatures: vec![0.0],
            beam_size: None,
            word_timestamps: false,
            language: self.opts.language.clone().or_else(|| (!self.transcript.language.is_empty()).then(|| self.transcript.language.clone())),
            ..self.opts.clone()
        };
        let prev = if self.opts.condition_on_previous_text { Some(self.previous.as_slice()) } else { None };
        let r = self.t.transcribe_prompted(audio, &opts, prev, &mut |_| {})?;
        Ok(r.text.trim().to_string())
    }

    /// End of the stream: the last segments, and the whole transcript.
    pub fn finish(mut self) -> Result<(Vec<Segment>, Transcript)> {
        let voiced = self.chunker.finish()?;
        let last = self.transcribe_voiced(voiced)?;
        let mut t = self.transcript;
        t.duration = self.samples_seen as f64 / self.rate as f64;
        let tokens: Vec<u32> = t.segments.iter().flat_map(|s| s.tokens.iter().copied()).collect();
        t.text = self.t.tokenizer.decode_text(&tokens)?;
        Ok((last, t))
    }

    /// Seconds of audio received so far.
    pub fn seconds_received(&self) -> f64 {
        self.samples_seen as f64 / self.rate as f64
    }

    fn transcribe_voiced(&mut self, voiced: Vec<VoicedSegment>) -> Result<Vec<Segment>> {
        let mut out = Vec::new();
        if let Some(end) = voiced.last().map(|v| v.end_s) {
            // what is decided no longer counts as pending
            let drop = (((end - self.pending_start) * 16_000.0).round().max(0.0) as usize).min(self.pending.len());
            self.pending.drain(..drop);
            self.pending_start += drop as f64 / 16_000.0;
        }
        for v in voiced {
            let mut opts = self.opts.clone();
            if opts.language.is_none() && !self.transcript.language.is_empty() {
                opts.language = Some(self.transcript.language.clone());
            }
            let prev = if self.opts.condition_on_previous_text { Some(self.previous.as_slice()) } else { None };
            let r = self.t.transcribe_prompted(&v.samples, &opts, prev, &mut |_| {})?;
            if self.transcript.language.is_empty() {
                self.transcript.language = r.language.clone();
                self.transcript.language_probs = r.language_probs.clone();
            }
            for mut s in r.segments {
                s.start += v.start_s;
                s.end += v.start_s;
                for w in &mut s.words {
                    w.start += v.start_s;
                    w.end += v.start_s;
                }
                s.seek += (v.start_s * 100.0).round() as usize;
                s.id = self.transcript.segments.len();
                if s.temperature <= 0.5 || !self.opts.condition_on_previous_text {
                    self.previous.extend(s.tokens.iter().copied());
                } else {
                    self.previous.clear();
                }
                self.transcript.segments.push(s.clone());
                out.push(s);
            }
        }
        Ok(out)
    }
}

impl Transcriber {
    /// Transcribe any [`AudioStream`] through the VAD, handing each segment to `on_segment`
    /// as soon as it is decided.
    pub fn transcribe_stream<S: AudioStream>(
        &self,
        mut stream: S,
        vad: SileroVad,
        vad_opts: VadOptions,
        opts: &TranscribeOptions,
        on_segment: &mut dyn FnMut(&Segment),
    ) -> Result<Transcript> {
        let mut st = StreamingTranscriber::new(self, vad, vad_opts, stream.sample_rate(), opts.clone())?;
        while let Some(chunk) = stream.next_chunk() {
            for s in st.push(&chunk.map_err(Error::Audio)?)? {
                on_segment(&s);
            }
        }
        let (last, t) = st.finish()?;
        for s in &last {
            on_segment(s);
        }
        Ok(t)
    }
}
