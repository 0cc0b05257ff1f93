//! Streaming transcription: audio pushed in chunks of any size (a file read packet by packet,
//! a microphone).
//!
//! The default mode, [`StreamMode::Windows`], decodes exactly the file mode's 30 s windows
//! (each starting at the last complete timestamp of the one before), each as soon as the
//! audio it covers has arrived (the last ones when the stream ends). Its log-mel frames are
//! computed incrementally ([`sapient_audio::MelStream`]) and equal the file mode's, so a
//! window's segments are the file mode's segments: they are handed out as soon as the window
//! is decoded and never looked at again. The audio after the last decided window is open:
//! Silero VAD watches it, and at each pause (the VAD closing a stretch of speech) the open
//! audio is decoded once, greedily, for unconfirmed partial text
//! ([`StreamUpdate::partial`]).
//!
//! Identity with the file mode holds by construction with one proviso: Whisper's log-mel
//! floors every frame at 8 (log10 units) below the loudest frame of the whole recording; a
//! stream only knows the loudest frame so far. The two differ only when a window is decided
//! before a louder frame arrives *and* that window holds frames 80 dB below the new peak
//! (digital silence); [`StreamingTranscriber::finish`] reports windows decided under a floor
//! that later moved ([`StreamingTranscriber::floor_changes`]).
//!
//! [`StreamMode::VadStretches`] is the low-latency alternative: each VAD stretch (closed by
//! 1 s of silence, at most 29 s) is decoded once, conditioned on the text before it, so
//! segments come out about a second after their speech ends. Its text is not the file
//! mode's (a stretch heard on its own is not heard as inside a 30 s window).

use crate::decode::detect_language;
use crate::transcribe::{LoopState, Segment, TranscribeOptions, Transcriber, Transcript};
use crate::{Error, Result};
use candle_core::Tensor;
use sapient_audio::mel::{HOP_LENGTH, N_SAMPLES, SAMPLE_RATE};
use sapient_audio::{AudioStream, MelStream, SileroVad, VadOptions, VoicedChunker, VoicedSegment};
use std::time::Instant;

/// VAD settings for transcription: stretches end after 1 s of silence, keep 300 ms of
/// padding, and are cut (at their longest silence) before 30 s so that each one fits a
/// Whisper window. faster-whisper's `vad_filter` waits 2 s.
pub fn default_vad_options() -> VadOptions {
    VadOptions { min_silence_ms: 1000, speech_pad_ms: 300, max_speech_s: 29.0, ..VadOptions::default() }
}

/// How a stream is cut into what gets decoded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StreamMode {
    /// The file mode's 30 s windows: the same text as [`Transcriber::transcribe`]; segments
    /// are decided when a window's audio is complete (up to 30 s after they are spoken),
    /// with partial text at pauses in between.
    #[default]
    Windows,
    /// Each VAD stretch on its own: segments about a second after their speech ends, but not
    /// always the file mode's text.
    VadStretches,
}

impl std::str::FromStr for StreamMode {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "windows" => Ok(StreamMode::Windows),
            "vad" => Ok(StreamMode::VadStretches),
            _ => Err(Error::Options(format!("stream mode '{s}' (expected windows or vad)"))),
        }
    }
}

/// How far behind the stream the transcription is.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Backlog {
    /// Seconds of received audio not yet decided.
    pub undecided_s: f64,
    /// Decoding time over audio time of the windows (or stretches) decoded so far; `None`
    /// before the first one.
    pub real_time_factor: Option<f64>,
    /// Estimated seconds of computation to decide the undecided audio
    /// (`undecided_s * real_time_factor`).
    pub time_left_s: Option<f64>,
    /// Seconds of audio still to arrive before the next window is complete
    /// ([`StreamMode::Windows`]; 0 in the VAD mode).
    pub next_window_in_s: f64,
}

/// What one [`StreamingTranscriber::push_update`] produced.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StreamUpdate {
    /// Segments decided by this chunk (final).
    pub segments: Vec<Segment>,
    /// New unconfirmed text of the open audio, when this chunk ended a stretch of speech.
    pub partial: Option<String>,
    pub backlog: Backlog,
}

/// Push-based streaming transcription.
pub struct StreamingTranscriber<'a> {
    t: &'a Transcriber,
    chunker: VoicedChunker,
    opts: TranscribeOptions,
    mode: StreamMode,
    partials_at_pauses: bool,
    transcript: Transcript,
    samples_seen: usize,
    rate: u32,
    resampler: Option<sapient_audio::Resampler>,
    /// 16 kHz samples received.
    received: usize,
    // windows mode
    mel: MelStream,
    /// Loudest log10 frame value so far and the floor each decided window used.
    max_log10: f32,
    floors: Vec<f32>,
    state: LoopState,
    language: Option<String>,
    // VAD mode: text so far, and the 16 kHz audio after the last decided stretch
    previous: Vec<u32>,
    pending: Vec<f32>,
    pending_start: f64,
    // real-time factor
    decode_s: f64,
    decoded_audio_s: f64,
}

impl<'a> StreamingTranscriber<'a> {
    /// A stream at `sample_rate` (resampled to 16 kHz inside), in [`StreamMode::Windows`].
    pub fn new(t: &'a Transcriber, vad: SileroVad, vad_opts: VadOptions, sample_rate: u32, opts: TranscribeOptions) -> Result<Self> {
        t.check_options(&opts)?;
        let chunker = VoicedChunker::new(vad, vad_opts, sample_rate)?;
        let mut previous = Vec::new();
        if let Some(p) = &opts.initial_prompt {
            previous = t.tokenizer.encode(&format!(" {}", p.trim()))?;
        }
        let state = LoopState::new(t, &opts, None)?;
        let language = if t.tokenizer.multilingual { opts.language.clone() } else { Some("en".to_string()) };
        Ok(Self {
            t,
            chunker,
            mode: StreamMode::Windows,
            partials_at_pauses: true,
            transcript: Transcript { language: language.clone().unwrap_or_default(), ..Default::default() },
            samples_seen: 0,
            rate: sample_rate,
            resampler: if sample_rate == 16_000 { None } else { Some(sapient_audio::Resampler::new(sample_rate, 16_000)?) },
            received: 0,
            mel: t.mel.stream(),
            max_log10: f32::NEG_INFINITY,
            floors: Vec::new(),
            state,
            language,
            previous,
            pending: Vec::new(),
            pending_start: 0.0,
            decode_s: 0.0,
            decoded_audio_s: 0.0,
            opts,
        })
    }

    /// Choose the mode (before the first push).
    pub fn with_mode(mut self, mode: StreamMode) -> Self {
        self.mode = mode;
        self
    }

    /// Whether [`StreamingTranscriber::push_update`] decodes the open audio at each pause for
    /// partial text (default: yes).
    pub fn with_partials_at_pauses(mut self, on: bool) -> Self {
        self.partials_at_pauses = on;
        self
    }

    pub fn mode(&self) -> StreamMode {
        self.mode
    }

    /// Feed samples; returns the segments decided by them (possibly none).
    pub fn push(&mut self, samples: &[f32]) -> Result<Vec<Segment>> {
        let partials = std::mem::replace(&mut self.partials_at_pauses, false);
        let r = self.push_update(samples);
        self.partials_at_pauses = partials;
        Ok(r?.segments)
    }

    /// Feed samples; returns the segments decided by them, new partial text when they ended
    /// a stretch of speech, and the backlog.
    pub fn push_update(&mut self, samples: &[f32]) -> Result<StreamUpdate> {
        if let Some(i) = samples.iter().position(|x| !x.is_finite()) {
            return Err(Error::Options(format!("sample {} of the stream is not a finite number", self.samples_seen + i)));
        }
        self.samples_seen += samples.len();
        let s16 = match self.resampler.as_mut() {
            Some(r) => r.process(samples)?,
            None => samples.to_vec(),
        };
        let voiced = self.chunker.push(samples)?;
        let mut up = StreamUpdate::default();
        match self.mode {
            StreamMode::Windows => {
                self.feed_mel(&s16)?;
                up.segments = self.decode_windows(false)?;
                if self.partials_at_pauses && !voiced.is_empty() {
                    let p = self.partial()?;
                    up.partial = Some(p);
                }
            }
            StreamMode::VadStretches => {
                self.received += s16.len();
                self.pending.extend(s16);
                up.segments = self.transcribe_voiced(voiced)?;
                if self.partials_at_pauses && !up.segments.is_empty() {
                    up.partial = Some(String::new());
                }
            }
        }
        up.backlog = self.backlog();
        Ok(up)
    }

    /// Unconfirmed text of the audio after the last decided window (or stretch): decoded
    /// greedily, without fallback, conditioned on the decided text; it may change until the
    /// audio is decided. Empty when nothing is pending. At most 30 s are looked at.
    pub fn partial(&self) -> Result<String> {
        let opts = TranscribeOptions {
            temperatures: vec![0.0],
            beam_size: None,
            word_timestamps: false,
            ..self.opts.clone()
        };
        match self.mode {
            StreamMode::Windows => {
                let nf = self.t.model.n_frames();
                let avail = self.mel.n_frames();
                let len = avail.saturating_sub(self.state.seek).min(nf);
                if len < 10 {
                    return Ok(String::new());
                }
                if self.language.is_none() {
                    // not detected yet: on the open audio, not kept
                    let w = self.window(0, avail.min(nf))?;
                    let cross = self.t.model.cross_kv(&self.t.model.encode(&w)?)?;
                    let probs = detect_language(&self.t.model, &self.t.tokenizer, &cross)?;
                    let lang = probs.first().map(|p| p.0.clone());
                    return self.partial_text(len, &opts, lang.as_deref());
                }
                let lang = self.language.clone();
                self.partial_text(len, &opts, lang.as_deref())
            }
            StreamMode::VadStretches => {
                let audio = &self.pending[self.pending.len().saturating_sub(N_SAMPLES)..];
                if audio.len() < 16_000 / 10 {
                    return Ok(String::new());
                }
                let lang = self.opts.language.clone().or_else(|| (!self.transcript.language.is_empty()).then(|| self.transcript.language.clone()));
                let opts = TranscribeOptions { language: lang, ..opts };
                let prev = if self.opts.condition_on_previous_text { Some(self.previous.as_slice()) } else { None };
                let r = self.t.transcribe_prompted(audio, &opts, prev, &mut |_| {})?;
                Ok(r.text.trim().to_string())
            }
        }
    }

    fn partial_text(&self, len: usize, opts: &TranscribeOptions, language: Option<&str>) -> Result<String> {
        let window = self.window(self.state.seek, len)?;
        let mut st = self.state.clone();
        let mut segs = Vec::new();
        let received_s = self.received as f64 / SAMPLE_RATE as f64;
        self.t.window_step(&window, len, received_s, opts, language, None, &mut st, &mut segs, &mut |_| {})?;
        let tokens: Vec<u32> = segs.iter().flat_map(|s| s.tokens.iter().copied()).collect();
        Ok(self.t.tokenizer.decode_text(&tokens)?.trim().to_string())
    }

    /// End of the stream: the last segments, and the whole transcript.
    pub fn finish(mut self) -> Result<(Vec<Segment>, Transcript)> {
        let tail = match self.resampler.as_mut() {
            Some(r) => r.finish()?,
            None => Vec::new(),
        };
        let voiced = self.chunker.finish()?;
        let last = match self.mode {
            StreamMode::Windows => {
                self.feed_mel(&tail)?;
                if self.received >= HOP_LENGTH {
                    // the file mode pads 30 s of zeros before its STFT
                    self.feed_mel_padding()?;
                    self.decode_windows(true)?
                } else {
                    Vec::new()
                }
            }
            StreamMode::VadStretches => self.transcribe_voiced(voiced)?,
        };
        let mut t = self.transcript;
        if t.language.is_empty() && self.mode == StreamMode::Windows {
            // nothing decoded (under one mel frame): "en", as the file mode says
            t.language = "en".into();
        }
        t.duration = self.samples_seen as f64 / self.rate as f64;
        let tokens: Vec<u32> = t.segments.iter().flat_map(|s| s.tokens.iter().copied()).collect();
        t.text = self.t.tokenizer.decode_text(&tokens)?;
        Ok((last, t))
    }

    /// Seconds of audio received so far.
    pub fn seconds_received(&self) -> f64 {
        self.samples_seen as f64 / self.rate as f64
    }

    /// The segments decided so far.
    pub fn transcript(&self) -> &Transcript {
        &self.transcript
    }

    /// Windows decided under a log-mel floor that a louder frame later raised (their frames
    /// 80 dB below the new peak, if any, differ from the file mode's). 0 in the VAD mode.
    pub fn floor_changes(&self) -> usize {
        let floor = self.max_log10 - 8.0;
        self.floors.iter().filter(|&&f| f != floor).count()
    }

    /// How far behind the stream the transcription is, and an estimate of the time needed
    /// to catch up from the real-time factor measured so far.
    pub fn backlog(&self) -> Backlog {
        let received_s = self.received as f64 / SAMPLE_RATE as f64;
        let (undecided_s, next_window_in_s) = match self.mode {
            StreamMode::Windows => {
                let seek_s = (self.state.seek * HOP_LENGTH) as f64 / SAMPLE_RATE as f64;
                let nf = self.t.model.n_frames();
                let need = (self.state.seek + nf) * HOP_LENGTH + sapient_audio::mel::N_FFT / 2;
                ((received_s - seek_s).max(0.0), need.saturating_sub(self.received) as f64 / SAMPLE_RATE as f64)
            }
            StreamMode::VadStretches => (self.pending.len() as f64 / SAMPLE_RATE as f64, 0.0),
        };
        let rtf = (self.decoded_audio_s > 0.0).then(|| self.decode_s / self.decoded_audio_s);
        Backlog { undecided_s, real_time_factor: rtf, time_left_s: rtf.map(|r| r * undecided_s), next_window_in_s }
    }

    fn feed_mel(&mut self, s16: &[f32]) -> Result<()> {
        if s16.is_empty() {
            return Ok(());
        }
        self.received += s16.len();
        let before = self.mel.n_frames();
        self.mel.push(s16)?;
        self.update_max(before);
        Ok(())
    }

    fn feed_mel_padding(&mut self) -> Result<()> {
        let before = self.mel.n_frames();
        self.mel.push(&vec![0f32; N_SAMPLES])?;
        self.mel.finish()?;
        self.update_max(before);
        Ok(())
    }

    fn update_max(&mut self, from: usize) {
        for f in from..self.mel.n_frames() {
            if let Some(fr) = self.mel.log10_frame(f) {
                self.max_log10 = fr.iter().copied().fold(self.max_log10, f32::max);
            }
        }
    }

    /// Frames `[seek, seek + len)` normalised as the file mode does (with the loudest frame
    /// so far), zero-padded to one window.
    fn window(&self, seek: usize, len: usize) -> Result<Tensor> {
        let nf = self.t.model.n_frames();
        let n_mels = self.t.mel.n_mels();
        let floor = self.max_log10 - 8.0;
        let mut w = vec![0f32; n_mels * nf];
        let len = len.min(nf).min(self.mel.n_frames().saturating_sub(seek));
        for t in 0..len {
            let fr = self.mel.log10_frame(seek + t).ok_or_else(|| Error::Options(format!("mel frame {} not computed", seek + t)))?;
            for (m, &v) in fr.iter().enumerate() {
                w[m * nf + t] = (v.max(floor) + 4.0) / 4.0;
            }
        }
        Ok(Tensor::from_vec(w, (n_mels, nf), self.t.model.device())?)
    }

    /// Decode every window whose audio is complete (all the rest when `finished`).
    fn decode_windows(&mut self, finished: bool) -> Result<Vec<Segment>> {
        let nf = self.t.model.n_frames();
        // the file mode's content: len / 160 frames (its mel has 30 s of padding after them)
        let content = self.received / HOP_LENGTH;
        let duration = self.received as f64 / SAMPLE_RATE as f64;
        let mut out = Vec::new();
        loop {
            let seek = self.state.seek;
            let segment_size = if finished {
                if seek >= content {
                    break;
                }
                nf.min(content - seek)
            } else {
                // a frame is computed once its STFT window has arrived: equal to the file
                // mode's, which pads with zeros only after the last sample
                if self.mel.n_frames() < seek + nf {
                    break;
                }
                nf
            };
            let started = Instant::now();
            if self.language.is_none() {
                let w = self.window(0, nf)?;
                let cross = self.t.model.cross_kv(&self.t.model.encode(&w)?)?;
                let probs = detect_language(&self.t.model, &self.t.tokenizer, &cross)?;
                self.language = probs.first().map(|p| p.0.clone());
                self.transcript.language = self.language.clone().unwrap_or_default();
                self.transcript.language_probs = probs;
            }
            let window = self.window(seek, segment_size)?;
            let first_new = self.transcript.segments.len();
            let lang = self.language.clone();
            self.t.window_step(&window, segment_size, duration, &self.opts, lang.as_deref(), None, &mut self.state, &mut self.transcript.segments, &mut |_| {})?;
            self.floors.push(self.max_log10 - 8.0);
            self.decode_s += started.elapsed().as_secs_f64();
            self.decoded_audio_s += (segment_size * HOP_LENGTH) as f64 / SAMPLE_RATE as f64;
            out.extend(self.transcript.segments[first_new..].iter().cloned());
            if self.state.seek <= seek {
                // window_step always moves on; guard against a loop all the same
                return Err(Error::Options(format!("the window at frame {seek} did not move the stream on")));
            }
        }
        Ok(out)
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
            let started = Instant::now();
            let mut opts = self.opts.clone();
            if opts.language.is_none() && !self.transcript.language.is_empty() {
                opts.language = Some(self.transcript.language.clone());
            }
            let prev = if self.opts.condition_on_previous_text { Some(self.previous.as_slice()) } else { None };
            let r = self.t.transcribe_prompted(&v.samples, &opts, prev, &mut |_| {})?;
            self.decode_s += started.elapsed().as_secs_f64();
            self.decoded_audio_s += v.samples.len() as f64 / SAMPLE_RATE as f64;
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
    /// Transcribe any [`AudioStream`] in [`StreamMode::Windows`] (the file mode's text),
    /// handing each segment to `on_segment` as soon as it is decided.
    pub fn transcribe_stream<S: AudioStream>(
        &self,
        stream: S,
        vad: SileroVad,
        vad_opts: VadOptions,
        opts: &TranscribeOptions,
        on_segment: &mut dyn FnMut(&Segment),
    ) -> Result<Transcript> {
        self.transcribe_stream_mode(stream, vad, vad_opts, StreamMode::Windows, opts, on_segment)
    }

    /// As [`Transcriber::transcribe_stream`], in the given mode.
    pub fn transcribe_stream_mode<S: AudioStream>(
        &self,
        mut stream: S,
        vad: SileroVad,
        vad_opts: VadOptions,
        mode: StreamMode,
        opts: &TranscribeOptions,
        on_segment: &mut dyn FnMut(&Segment),
    ) -> Result<Transcript> {
        let mut st = StreamingTranscriber::new(self, vad, vad_opts, stream.sample_rate(), opts.clone())?.with_mode(mode);
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
