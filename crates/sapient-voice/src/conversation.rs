//! [`VoiceLoop`]: the conversation's state machine. Audio pushed in goes through the VAD's
//! turn-taking; a turn is transcribed (mostly while the user is still pausing) and answered
//! on the engine; the reply's clauses come back as audio; speech during the reply
//! interrupts it.

use crate::reply::{self, heard_text, ReplyMsg, ReplyThreads, SpeechSettings, SpokenClause};
use crate::turn::{TurnDetector, TurnEvent, RATE};
use crate::{Error, Event, Playout, ReplyStatus, ReplyTimings, Result, VoiceModels, VoiceOptions};
use sapient_audio::{Resampler, SileroVad};
use sapient_generate::{GenerationConfig, Message, Session};
use sapient_whisper::TranscribeOptions;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Audio after the end of speech given to Whisper with the turn.
const TRAILING_MS: u32 = 200;

/// The reply being generated or played.
struct Reply {
    id: u64,
    threads: ReplyThreads,
    text_done: bool,
    audio_done: bool,
    generated: String,
    clauses: Vec<SpokenClause>,
    /// Samples produced, and played (pulled, or by the clock).
    produced: usize,
    played: usize,
    started: Instant,
    /// When the reply became the conversation's (its start, or for a reply started early,
    /// the end of the turn).
    released: Instant,
    first_audio: Option<Instant>,
    timings: ReplyTimings,
    interrupted: bool,
    /// The assistant message's index in the history once the reply is done.
    in_history: Option<usize>,
}

impl Reply {
    fn finished(&self) -> bool {
        self.text_done && self.audio_done
    }
}

/// A reply started at a pause on the pause's text ([`crate::TurnOptions::early_reply`]):
/// its threads run, its messages wait in their channel until the turn ends at that pause.
struct Early {
    reply: Reply,
    /// The turn `[start, end)` so far and its text, as at the pause.
    start: usize,
    end: usize,
}

/// Whisper on a pause's audio, on a thread of its own (the audio thread goes on hearing
/// the silence); its text comes back on `rx`.
struct PauseJob {
    start: usize,
    end: usize,
    rx: std::sync::mpsc::Receiver<Result<String>>,
    /// When the pause was seen.
    at: Instant,
}

/// A spoken conversation (see the crate docs).
pub struct VoiceLoop {
    models: VoiceModels,
    opts: VoiceOptions,
    session: Session,
    resampler: Option<Resampler>,
    turns: TurnDetector,
    history: Vec<Message>,
    events: VecDeque<Event>,
    /// The latest partial transcript: the turn's `[start, end)` and its text.
    partial: Option<(usize, usize, String)>,
    /// When the last window of speech arrived (the end of the user's speech, on the wall
    /// clock) and the transcription time of the turn that followed.
    speech_end: Option<Instant>,
    /// When the input reached each recent position (16 kHz samples), to date the end of
    /// the speech once the turn is over.
    arrivals: VecDeque<(usize, Instant)>,
    last_transcribe_ms: f64,
    next_id: u64,
    reply: Option<Reply>,
    early: Option<Early>,
    /// The transcription of the latest pause, while it runs.
    pause_job: Option<PauseJob>,
    /// The history length whose prompt prefix the session's cache holds (prefilled at the
    /// start of the user's speech).
    prewarmed: Option<usize>,
    /// The prefill's request, kept until the next one (dropping it would cancel it).
    prewarm: Option<sapient_generate::RequestHandle>,
    /// Whether a pause's transcription runs in the background (off: the push that saw the
    /// pause waits for it, as [`crate::file::run`] wants).
    pauses_in_background: bool,
    /// Reply audio not yet pulled ([`Playout::Pull`]).
    queue: VecDeque<f32>,
}

impl VoiceLoop {
    /// A conversation over `models`, with its own Silero VAD (one per conversation: it keeps
    /// the stream's state) and options.
    pub fn new(models: VoiceModels, vad: SileroVad, opts: VoiceOptions) -> Result<Self> {
        opts.validate()?;
        let session = models.llm.engine().session()?;
        let turns = TurnDetector::new(vad, opts.turn.clone().unwrap_or_default())?;
        let resampler = if opts.input_rate as usize == RATE { None } else { Some(Resampler::new(opts.input_rate, RATE as u32)?) };
        Ok(Self {
            models,
            opts,
            session,
            resampler,
            turns,
            history: Vec::new(),
            events: VecDeque::new(),
            partial: None,
            speech_end: None,
            arrivals: VecDeque::new(),
            last_transcribe_ms: 0.0,
            next_id: 1,
            reply: None,
            early: None,
            pause_job: None,
            prewarmed: None,
            prewarm: None,
            pauses_in_background: true,
            queue: VecDeque::new(),
        })
    }

    /// Whether Whisper on a pause runs beside the audio (the default: live audio goes on
    /// being heard while it runs) or the push that saw the pause waits for it (audio pushed
    /// faster than real time, as if the models took no time: [`crate::file::run`]).
    pub fn set_pauses_in_background(&mut self, on: bool) {
        self.pauses_in_background = on;
    }

    pub fn options(&self) -> &VoiceOptions {
        &self.opts
    }

    /// Change the options (`session.update`). The input rate, if changed, applies to the
    /// audio pushed from now on.
    pub fn update(&mut self, opts: VoiceOptions) -> Result<()> {
        opts.validate()?;
        self.drop_early();
        if opts.turn != self.opts.turn {
            self.turns.set_options(opts.turn.clone().unwrap_or_default())?;
        }
        if opts.input_rate != self.opts.input_rate {
            self.resampler = if opts.input_rate as usize == RATE { None } else { Some(Resampler::new(opts.input_rate, RATE as u32)?) };
        }
        self.opts = opts;
        Ok(())
    }

    /// Whether Kokoro has `voice` (a name or a blend).
    pub fn check_voice(&self, voice: &str) -> Result<()> {
        self.models.tts.voices().get(voice)?;
        Ok(())
    }

    /// Sample rate of the reply's audio (Kokoro's, 24 kHz).
    pub fn output_rate(&self) -> u32 {
        self.models.tts.sample_rate()
    }

    /// The conversation so far (user turns as transcribed, replies as heard), without the
    /// system prompt.
    pub fn history(&self) -> &[Message] {
        &self.history
    }

    /// The next event, if any (call after each push or pull).
    pub fn next_event(&mut self) -> Option<Event> {
        self.pump(false);
        self.events.pop_front()
    }

    /// Every pending event.
    pub fn drain_events(&mut self) -> Vec<Event> {
        self.pump(false);
        self.events.drain(..).collect()
    }

    /// Whether a reply is being generated or has audio not yet played.
    pub fn replying(&self) -> bool {
        self.reply.as_ref().is_some_and(|r| !r.finished() || r.played < r.produced)
    }

    /// Audio in (mono, `input_rate`). Turn events, transcription and barge-in happen here;
    /// a turn's transcription runs on this thread.
    pub fn push_audio(&mut self, samples: &[f32]) -> Result<()> {
        if let Some(i) = samples.iter().position(|x| !x.is_finite()) {
            return Err(Error::Options(format!("input sample {i} is not a finite number")));
        }
        self.pump(false);
        let s16 = match self.resampler.as_mut() {
            Some(r) => r.process(samples)?,
            None => samples.to_vec(),
        };
        let detect = self.opts.turn.is_some();
        let evs = self.turns.push(&s16, detect)?;
        let now = self.turns.position();
        self.arrivals.push_back((now, Instant::now()));
        let keep = RATE * 2 + self.opts.turn.as_ref().map_or(0, |t| t.end_of_turn_ms as usize * RATE / 1000);
        while self.arrivals.front().is_some_and(|(p, _)| p + keep < now) {
            self.arrivals.pop_front();
        }
        self.turn_events(evs)?;
        self.poll_pause(false)?;
        if detect {
            self.turns.trim();
        }
        Ok(())
    }

    /// End of the input: a turn still open is closed (and answered).
    pub fn finish_input(&mut self) -> Result<()> {
        if let Some(r) = self.resampler.as_mut() {
            let tail = r.finish()?;
            let evs = self.turns.push(&tail, self.opts.turn.is_some())?;
            self.turn_events(evs)?;
        }
        if self.opts.turn.is_some() {
            let evs = self.turns.finish();
            self.turn_events(evs)?;
        }
        Ok(())
    }

    /// Up to `n` samples of the reply's audio at [`output_rate`](Self::output_rate), padded
    /// with silence to `n` ([`Playout::Pull`]); what is returned counts as played. With
    /// `wait`, blocks until the reply has produced enough audio or ended (a file processed
    /// faster than real time, as if the models took no time).
    pub fn pull_audio(&mut self, n: usize, wait: bool) -> Vec<f32> {
        self.pump(false);
        if wait {
            while self.queue.len() < n && self.reply.as_ref().is_some_and(|r| !r.finished()) {
                self.pump(true);
            }
        }
        let k = n.min(self.queue.len());
        let mut out: Vec<f32> = self.queue.drain(..k).collect();
        if let Some(r) = self.reply.as_mut() {
            r.played = (r.played + k).min(r.produced);
        }
        out.resize(n, 0.0);
        out
    }

    /// Add a message to the history without audio (`conversation.item.create`).
    pub fn add_message(&mut self, message: Message) {
        self.drop_early();
        self.history.push(message);
    }

    /// Forget the input audio kept (`input_audio_buffer.clear`).
    pub fn clear_input(&mut self) {
        self.drop_early();
        self.pause_job = None;
        self.turns.clear();
        self.partial = None;
    }

    /// The input audio kept since the last turn, transcribed as a user turn
    /// (`input_audio_buffer.commit`); returns its text. No reply is started.
    pub fn commit(&mut self) -> Result<String> {
        let audio = self.turns.take_all();
        if audio.len() < RATE / 10 {
            return Err(Error::Options(format!("{} ms of audio to commit: at least 100 ms are needed", audio.len() * 1000 / RATE)));
        }
        self.partial = None;
        self.pause_job = None;
        self.drop_early();
        self.user_turn(&audio, None)
    }

    /// Start a reply to the conversation so far (`response.create`); its id. A reply still
    /// being generated is [`Error::Busy`].
    pub fn respond(&mut self) -> Result<u64> {
        self.pump(false);
        if let Some(r) = &self.reply {
            if !r.finished() {
                return Err(Error::Busy(r.id));
            }
        }
        self.drop_early();
        let reply = self.start_reply(None)?;
        Ok(self.release(reply))
    }

    /// A reply to the history, and `user` after it when given (a turn not yet ended), its
    /// threads started; not yet the conversation's ([`Self::release`]).
    fn start_reply(&self, user: Option<&str>) -> Result<Reply> {
        let engine = self.models.llm.engine();
        let mut messages = vec![Message::system(self.opts.instructions.clone())];
        // the same messages as once `user` is in the history
        let from = (self.history.len() + usize::from(user.is_some())).saturating_sub(self.opts.max_history).min(self.history.len());
        messages.extend(self.history[from..].iter().cloned());
        messages.extend(user.map(|u| Message::user(u.to_string())));
        let prompt = engine.model().render_chat(&messages)?;
        let ids = engine.model().tokenizer().encode(&prompt, false).map_err(sapient_generate::Error::from)?;
        let cfg = GenerationConfig { max_tokens: self.opts.max_reply_tokens, sampling: self.opts.sampling.clone(), ..GenerationConfig::default() };
        let handle = engine.submit_in(&self.session, ids, cfg)?;
        let settings = SpeechSettings { speak: self.opts.speak, voice: self.opts.voice.clone(), speed: self.opts.speed, clauses: self.opts.clauses };
        let threads = reply::spawn(handle, self.models.tts.clone(), settings)?;
        let now = Instant::now();
        Ok(Reply {
            id: 0,
            threads,
            text_done: false,
            audio_done: false,
            generated: String::new(),
            clauses: Vec::new(),
            produced: 0,
            played: 0,
            started: now,
            released: now,
            first_audio: None,
            timings: ReplyTimings::default(),
            interrupted: false,
            in_history: None,
        })
    }

    /// `reply` becomes the conversation's reply, with the next id: its messages are
    /// handled (events, audio) from now on.
    fn release(&mut self, mut reply: Reply) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.queue.clear();
        reply.id = id;
        reply.released = Instant::now();
        reply.timings.transcribe_ms = self.last_transcribe_ms;
        reply.timings.early_ms = ms(reply.released - reply.started);
        reply.timings.end_of_turn_ms = self.speech_end.map(|e| ms(reply.released.saturating_duration_since(e)));
        reply.timings.start_after_speech_end_ms = self.speech_end.map(|e| ms(reply.started.saturating_duration_since(e)));
        self.reply = Some(reply);
        self.events.push_back(Event::ResponseStarted { response: id });
        id
    }

    /// Stops the reply started early, unheard (its turn did not end at its pause).
    fn drop_early(&mut self) {
        if let Some(e) = self.early.take() {
            e.reply.threads.cancel.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Stop the reply (`response.cancel`): generation stops at the next engine step, audio
    /// not yet played is dropped, and the history keeps what was heard.
    pub fn cancel(&mut self) -> bool {
        self.interrupt(None)
    }

    /// Block until the reply (if any) is generated and spoken; its events are queued.
    pub fn wait_reply(&mut self) {
        while self.reply.as_ref().is_some_and(|r| !r.finished()) {
            self.pump(true);
        }
    }

    fn turn_events(&mut self, evs: Vec<TurnEvent>) -> Result<()> {
        let ms_of = |s: usize| (s * 1000 / RATE) as u64;
        for ev in evs {
            match ev {
                TurnEvent::Started { at } => {
                    self.events.push_back(Event::SpeechStarted { audio_ms: ms_of(at) });
                    self.prewarm();
                }
                TurnEvent::Confirmed { at } => {
                    if self.opts.turn.as_ref().is_some_and(|t| t.interrupt) && self.replying() {
                        self.interrupt(Some(ms_of(at)));
                    }
                }
                TurnEvent::Paused { start, end } => {
                    // Whisper on its own thread: the audio thread goes on seeing the silence
                    self.drop_early();
                    let audio = self.turns.turn_audio(start, end, TRAILING_MS);
                    let (tx, rx) = std::sync::mpsc::channel();
                    let (whisper, opts) = (self.models.transcriber.clone(), self.transcribe_options());
                    std::thread::Builder::new()
                        .name("sapient-voice-pause".into())
                        .spawn(move || {
                            let r = whisper.transcribe(&audio, &opts).map(|t| t.text.trim().to_string()).map_err(Error::from);
                            let _ = tx.send(r);
                        })
                        .map_err(|e| Error::Worker(format!("cannot start the pause's transcription thread: {e}")))?;
                    self.pause_job = Some(PauseJob { start, end, rx, at: Instant::now() });
                    if !self.pauses_in_background {
                        self.poll_pause(true)?;
                    }
                }
                TurnEvent::Resumed => {
                    self.drop_early();
                    self.pause_job = None;
                }
                TurnEvent::Ended { start, end } => {
                    let arrived = self.arrivals.iter().find(|(p, _)| *p >= end).map(|(_, t)| *t);
                    self.speech_end = Some(arrived.unwrap_or_else(Instant::now));
                    self.events.push_back(Event::SpeechStopped { audio_ms: ms_of(end) });
                    // the pause this turn ended at, still being transcribed: its text is the turn's
                    let waited = Instant::now();
                    let mut waited_ms = 0.0;
                    if self.pause_job.as_ref().is_some_and(|j| j.start == start && j.end >= end) {
                        self.poll_pause(true)?;
                        waited_ms = ms(waited.elapsed());
                    }
                    self.pause_job = None;
                    let reuse = match &self.partial {
                        Some((s, e, t)) if *s == start && *e >= end => Some(t.clone()),
                        _ => None,
                    };
                    let audio = self.turns.turn_audio(start, end, TRAILING_MS);
                    self.turns.consumed(end);
                    self.partial = None;
                    let reused = reuse.is_some();
                    let text = self.user_turn(&audio, reuse)?;
                    if reused {
                        self.last_transcribe_ms = waited_ms;
                    }
                    let respond = self.opts.turn.as_ref().is_some_and(|t| t.respond);
                    // the reply started at this turn's last pause, on the same text, is the one
                    let fits = self.early.as_ref().is_some_and(|e| reused && e.start == start && e.end >= end);
                    let early = if fits { self.early.take() } else { None };
                    self.drop_early();
                    if respond && !text.is_empty() && self.reply.as_ref().is_none_or(|r| r.finished()) {
                        match early {
                            Some(e) => {
                                self.pump(false);
                                self.release(e.reply);
                            }
                            None => {
                                self.respond()?;
                            }
                        }
                    } else if let Some(e) = early {
                        e.reply.threads.cancel.store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                }
                TurnEvent::Dropped { .. } => {
                    self.drop_early();
                    self.pause_job = None;
                }
            }
        }
        Ok(())
    }

    /// A user turn: transcribed (or the partial text reused), added to the history.
    fn user_turn(&mut self, audio: &[f32], reuse: Option<String>) -> Result<String> {
        let started = Instant::now();
        let (text, reused) = match reuse {
            Some(t) => (t, true),
            None => (self.transcribe(audio)?.0, false),
        };
        let transcribe_ms = if reused { 0.0 } else { ms(started.elapsed()) };
        self.last_transcribe_ms = transcribe_ms;
        self.events.push_back(Event::Transcript { text: text.clone(), audio_ms: (audio.len() * 1000 / RATE) as u64, transcribe_ms, reused });
        if !text.is_empty() {
            self.history.push(Message::user(text.clone()));
        }
        Ok(text)
    }

    fn transcribe_options(&self) -> TranscribeOptions {
        TranscribeOptions {
            language: self.opts.language.clone(),
            temperatures: vec![0.0],
            condition_on_previous_text: false,
            // a turn is short: no timestamp tokens to decode
            without_timestamps: true,
            vad_no_speech_threshold: None,
            ..TranscribeOptions::default()
        }
    }

    fn transcribe(&self, audio: &[f32]) -> Result<(String, Duration)> {
        let started = Instant::now();
        let t = self.models.transcriber.transcribe(audio, &self.transcribe_options())?;
        Ok((t.text.trim().to_string(), started.elapsed()))
    }

    /// The pause's transcription, if done (with `wait`, once done): the partial text, and
    /// the reply started on it ([`crate::TurnOptions::early_reply`]).
    fn poll_pause(&mut self, wait: bool) -> Result<()> {
        let Some(job) = &self.pause_job else { return Ok(()) };
        let got = if wait {
            job.rx.recv().map_err(|_| Error::Worker("the pause's transcription thread stopped".into()))
        } else {
            match job.rx.try_recv() {
                Ok(r) => Ok(r),
                Err(std::sync::mpsc::TryRecvError::Empty) => return Ok(()),
                Err(std::sync::mpsc::TryRecvError::Disconnected) => Err(Error::Worker("the pause's transcription thread stopped".into())),
            }
        };
        let (start, end, at) = (job.start, job.end, job.at);
        self.pause_job = None;
        let text = got??;
        tracing::debug!(ms = ms(at.elapsed()), %text, "pause transcribed");
        if !text.is_empty() {
            self.events.push_back(Event::TranscriptPartial { text: text.clone() });
        }
        let early = self.opts.turn.as_ref().is_some_and(|t| t.respond && t.early_reply);
        if early && !text.is_empty() && self.reply.as_ref().is_none_or(|r| r.finished()) {
            let mut reply = self.start_reply(Some(&text))?;
            reply.timings.pause_transcribe_ms = Some(ms(reply.started.saturating_duration_since(at)));
            self.early = Some(Early { reply, start, end });
        }
        self.partial = Some((start, end, text));
        Ok(())
    }

    /// Prefill the prompt up to the user's turn (system prompt and history) in the
    /// session's cache while the user speaks, so that the reply's prompt processing is only
    /// the turn's own tokens. Once per history; not while a reply is generated.
    fn prewarm(&mut self) {
        let n = self.history.len();
        if self.prewarmed == Some(n) || self.reply.as_ref().is_some_and(|r| !r.finished()) || self.early.is_some() {
            return;
        }
        let engine = self.models.llm.engine();
        let from = (n + 1).saturating_sub(self.opts.max_history).min(n);
        let mut messages = vec![Message::system(self.opts.instructions.clone())];
        messages.extend(self.history[from..].iter().cloned());
        let Ok(prompt) = engine.model().render_chat(&messages) else { return };
        let Ok(ids) = engine.model().tokenizer().encode(&prompt, false) else { return };
        let cfg = GenerationConfig { max_tokens: 1, sampling: sapient_generate::SamplerConfig::greedy(), ..GenerationConfig::default() };
        if let Ok(h) = engine.submit_in(&self.session, ids, cfg) {
            self.prewarm = Some(h);
            self.prewarmed = Some(n);
        }
    }

    /// Barge-in (`at`: where the speech was confirmed, ms of input) or cancel.
    fn interrupt(&mut self, at: Option<u64>) -> bool {
        self.pump(false);
        let rate = self.output_rate();
        let clock = self.opts.playout == Playout::Clock;
        let Some(r) = self.reply.as_mut() else { return false };
        if r.finished() && r.played >= r.produced && !clock {
            return false;
        }
        if clock {
            r.played = clock_played(r, rate);
            if r.finished() && r.played >= r.produced {
                return false;
            }
        }
        r.threads.cancel.store(true, std::sync::atomic::Ordering::Relaxed);
        r.interrupted = true;
        r.produced = r.played;
        self.queue.clear();
        let heard = heard_text(&r.clauses, r.played, rate);
        if let Some(i) = r.in_history {
            if let Some(m) = self.history.get_mut(i) {
                *m = Message::assistant(heard.clone());
            }
        }
        let played_ms = (r.played as u64 * 1000) / u64::from(rate);
        self.events.push_back(Event::Interrupted { response: r.id, audio_ms: at, played_ms, heard: heard.clone() });
        true
    }

    /// Handle what the reply's threads sent (with `block`, wait for one message first).
    fn pump(&mut self, block: bool) {
        let rate = self.output_rate();
        let Some(r) = self.reply.as_mut() else { return };
        let mut msgs = Vec::new();
        if block && !r.finished() {
            match r.threads.rx.recv_timeout(Duration::from_secs(30)) {
                Ok(m) => msgs.push(m),
                Err(_) => {
                    r.text_done = true;
                    r.audio_done = true;
                    self.events.push_back(Event::Error { message: "the reply's threads stopped answering".into() });
                }
            }
        }
        msgs.extend(r.threads.rx.try_iter());
        for m in msgs {
            match m {
                ReplyMsg::Text(t, at) => {
                    if r.timings.first_token_ms.is_none() {
                        r.timings.first_token_ms = Some(ms(at.saturating_duration_since(r.started)));
                    }
                    r.generated.push_str(&t);
                    if !r.interrupted {
                        self.events.push_back(Event::TextDelta { response: r.id, text: t });
                    }
                }
                ReplyMsg::Audio { text, samples, words, synth, at } => {
                    if r.interrupted {
                        continue;
                    }
                    if r.first_audio.is_none() {
                        let now = Instant::now();
                        r.first_audio = Some(now);
                        r.timings.first_audio_ms = Some(ms(at.saturating_duration_since(r.started)));
                        r.timings.first_clause_synth_ms = Some(ms(synth));
                        r.timings.speech_end_to_first_audio_ms = self.speech_end.map(|e| ms(now.saturating_duration_since(e)));
                    }
                    r.clauses.push(SpokenClause { text: text.clone(), words, start: r.produced, len: samples.len() });
                    r.produced += samples.len();
                    if self.opts.playout == Playout::Pull {
                        self.queue.extend(samples.iter().copied());
                    }
                    self.events.push_back(Event::Audio { response: r.id, text, samples, synth_ms: ms(synth) });
                }
                ReplyMsg::Skipped { text, why } => {
                    tracing::warn!(clause = %text, %why, "a clause of the reply was not spoken");
                }
                ReplyMsg::TextDone(g) => {
                    r.text_done = true;
                    match g {
                        Ok(g) => {
                            r.timings.prompt_tokens = g.stats.prompt_tokens;
                            r.timings.reused_prompt_tokens = g.stats.reused_prompt_tokens;
                            r.timings.generated_tokens = g.stats.generated_tokens;
                        }
                        Err(e) => self.events.push_back(Event::Error { message: format!("the reply failed: {e}") }),
                    }
                }
                ReplyMsg::AudioDone => r.audio_done = true,
            }
        }
        if r.finished() && r.in_history.is_none() {
            r.timings.total_ms = ms(r.started.elapsed());
            let status = if r.interrupted { ReplyStatus::Interrupted } else { ReplyStatus::Completed };
            let text = if r.interrupted { heard_text(&r.clauses, r.played, rate) } else { r.generated.trim().to_string() };
            if !text.is_empty() {
                self.history.push(Message::assistant(text.clone()));
                r.in_history = Some(self.history.len() - 1);
            } else {
                r.in_history = Some(usize::MAX);
            }
            self.events.push_back(Event::ResponseDone { response: r.id, status, text, generated: r.generated.clone(), timings: r.timings.clone() });
        }
    }
}

/// Samples of the reply played by the clock: real time since its first audio.
fn clock_played(r: &Reply, rate: u32) -> usize {
    r.first_audio.map_or(0, |t| ((t.elapsed().as_secs_f64() * rate as f64) as usize).min(r.produced))
}

impl Drop for VoiceLoop {
    fn drop(&mut self) {
        if let Some(r) = &self.reply {
            r.threads.cancel.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        self.drop_early();
    }
}
