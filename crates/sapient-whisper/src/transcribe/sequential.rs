//! [`LongForm::Sequential`]: openai-whisper's loop of 30 s windows, each prompted with the
//! text before it, with temperature fallback and the checks that catch a decode copying its
//! prompt.

use super::*;

impl Transcriber {
    /// The transcription loop; `previous` (text tokens that came before this audio, for the
    /// streaming mode) replaces the initial prompt when given.
    pub(crate) fn transcribe_prompted(
        &self,
        samples: &[f32],
        opts: &TranscribeOptions,
        previous: Option<&[u32]>,
        on_segment: &mut dyn FnMut(&Segment),
    ) -> Result<Transcript> {
        self.check_options(opts)?;
        let tok = &self.tokenizer;
        let mut out = begin_transcript(samples, opts)?;
        let duration = out.duration;
        // Shorter than one mel frame: nothing to hear.
        if samples.len() < HOP_LENGTH {
            return Ok(out);
        }
        let mel = self.mel.log_mel_padded(samples, N_SAMPLES)?;
        let n_frames = self.model.n_frames();
        let content_frames = mel.n_frames.saturating_sub(n_frames);
        if content_frames == 0 {
            return Ok(out);
        }
        let mut language = opts.language.clone();
        // the first window encoded for the language detection, kept for the loop's first window
        let mut encoded = None;
        if tok.multilingual {
            if language.is_none() {
                let window = self.window(&mel, 0, n_frames)?;
                let cross = self.model.cross_kv(&self.model.encode(&window)?)?;
                let probs = detect_language(&self.model, tok, &cross)?;
                language = probs.first().map(|p| p.0.clone());
                tracing::debug!(language = ?language, "detected language");
                out.language_probs = probs;
                encoded = Some((n_frames, cross));
            }
        } else {
            language = Some("en".into());
        }
        out.language = language.clone().unwrap_or_default();

        let speech = match opts.vad_no_speech_threshold {
            Some(_) => self.vad_segments(samples)?,
            None => None,
        };
        let mut st = LoopState::new(self, opts, previous)?;
        st.encoded = encoded;
        while st.seek < content_frames {
            let segment_size = n_frames.min(content_frames - st.seek);
            let window = self.window(&mel, st.seek, segment_size)?;
            let (a, b) = (st.seek * HOP_LENGTH, (st.seek + segment_size) * HOP_LENGTH);
            let vad_speech = speech.as_ref().map(|sp| sp.iter().any(|&(s, e)| s < b && e > a));
            self.window_step(&window, segment_size, duration, opts, language.as_deref(), vad_speech, &mut st, &mut out.segments, on_segment)?;
        }
        let text_tokens: Vec<u32> = out.segments.iter().flat_map(|s| s.tokens.iter().copied()).collect();
        out.text = tok.decode_text(&text_tokens)?;
        Ok(out)
    }

    /// The options' own errors (temperatures, language and task for the model, sizes).
    pub(crate) fn check_options(&self, opts: &TranscribeOptions) -> Result<()> {
        if opts.temperatures.is_empty() {
            return Err(Error::Options("no temperature to decode with".into()));
        }
        if let Some(&t) = opts.temperatures.iter().find(|t| t.is_nan() || **t < 0.0) {
            return Err(Error::Options(format!("temperature {t} must be >= 0")));
        }
        let tok = &self.tokenizer;
        if !tok.multilingual {
            if let Some(l) = opts.language.as_deref().filter(|l| *l != "en") {
                return Err(Error::Options(format!("an English-only model cannot take language '{l}'")));
            }
            if opts.task == Task::Translate {
                return Err(Error::Options("an English-only model cannot translate".into()));
            }
        } else if let Some(l) = opts.language.as_deref() {
            tok.language_token(l)?;
        }
        if opts.beam_size == Some(0) || opts.best_of == 0 {
            return Err(Error::Options("beam_size and best_of must be at least 1".into()));
        }
        Ok(())
    }

    /// One window of the long-form loop: decode frames `[st.seek, st.seek + segment_size)`
    /// (already cut and zero-padded into `window`), append its segments to `segments`
    /// (handing each to `on_segment`) and move `st.seek` on. `duration` (s) bounds the last
    /// segment's end. The file mode and the streaming mode both run their windows through it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn window_step(
        &self,
        window: &Tensor,
        segment_size: usize,
        duration: f64,
        opts: &TranscribeOptions,
        language: Option<&str>,
        vad_speech: Option<bool>,
        st: &mut LoopState,
        segments: &mut Vec<Segment>,
        on_segment: &mut dyn FnMut(&Segment),
    ) -> Result<()> {
        let tok = &self.tokenizer;
        let time_offset = (st.seek * HOP_LENGTH) as f64 / SAMPLE_RATE as f64;
        let segment_duration = (segment_size * HOP_LENGTH) as f64 / SAMPLE_RATE as f64;
        let cross = match st.encoded.take() {
            // the same frames (from 0, a whole window) encoded already
            Some((len, cross)) if st.seek == 0 && len == segment_size => cross,
            _ => self.model.cross_kv(&self.model.encode(window)?)?,
        };
        let base = DecodeOptions {
            task: opts.task,
            language: language.map(str::to_string),
            beam_size: opts.beam_size,
            best_of: Some(opts.best_of),
            patience: opts.patience,
            length_penalty: opts.length_penalty,
            prompt: st.all_tokens[st.prompt_reset_since..].to_vec(),
            without_timestamps: opts.without_timestamps,
            seed: opts.seed.wrapping_add(st.seek as u64),
            ..DecodeOptions::default()
        };
        if let (Some(false), Some(vt)) = (vad_speech, opts.vad_no_speech_threshold) {
            // the VAD hears no speech: one decoder step tells whether Whisper agrees
            let probe = DecodeOptions { sample_len: Some(1), ..base.clone() };
            let r = decode_window(&self.model, tok, &cross, &probe)?;
            if r.no_speech_prob > vt {
                tracing::debug!(seek = st.seek, no_speech = r.no_speech_prob, "window skipped: no speech for the VAD and the model");
                st.seek += segment_size;
                return Ok(());
            }
        }
        let (result, unprompted) = self.decode_with_fallback(&cross, &base, opts, None)?;

        if let Some(nst) = opts.no_speech_threshold {
            let mut skip = result.no_speech_prob > nst;
            if let Some(lt) = opts.logprob_threshold {
                if result.avg_logprob > lt {
                    skip = false;
                }
            }
            if skip {
                tracing::debug!(seek = st.seek, no_speech = result.no_speech_prob, "window skipped as silent");
                st.seek += segment_size;
                return Ok(());
            }
        }

        let tokens = &result.tokens;
        let is_ts = |t: u32| t >= tok.timestamp_begin;
        let n = tokens.len();
        let single_timestamp_ending = n >= 2 && !is_ts(tokens[n - 2]) && is_ts(tokens[n - 1]);
        let mut consecutive: Vec<usize> = (1..n).filter(|&i| is_ts(tokens[i - 1]) && is_ts(tokens[i])).collect();
        let mut current: Vec<(f64, f64, Vec<u32>)> = Vec::new();
        if !consecutive.is_empty() {
            if single_timestamp_ending {
                consecutive.push(n);
            }
            let mut last_slice = 0;
            for &cur in &consecutive {
                let sliced = &tokens[last_slice..cur];
                let start = tok.timestamp_seconds(sliced[0]);
                let end = tok.timestamp_seconds(sliced[sliced.len() - 1]);
                current.push((time_offset + start, time_offset + end, sliced.to_vec()));
                last_slice = cur;
            }
            if single_timestamp_ending {
                st.seek += segment_size;
            } else {
                let last_pos = tokens[last_slice - 1].saturating_sub(tok.timestamp_begin) as usize;
                st.seek += last_pos * INPUT_STRIDE;
            }
        } else {
            let mut dur = segment_duration;
            if let Some(&last) = tokens.iter().rev().find(|&&t| is_ts(t)) {
                if last != tok.timestamp_begin {
                    dur = (last - tok.timestamp_begin) as f64 * TIME_PRECISION;
                }
            }
            current.push((time_offset, time_offset + dur, tokens.clone()));
            st.seek += segment_size;
        }
        let failed = result.looped || opts.compression_ratio_threshold.is_some_and(|c| result.compression_ratio > c);
        if failed {
            // every temperature looped: keep each sentence once
            let before: Vec<Vec<u32>> = segments.iter().rev().take(3).map(|s| text_of(&s.tokens, tok.eot)).collect();
            drop_repeats(&mut current, &before, tok.eot);
        }
        if unprompted {
            // without the previous text the window hears the end of its last word again
            if let (Some(prev), Some(first)) = (segments.last(), current.first_mut()) {
                drop_boundary_repeat(&mut first.2, &text_of(&prev.tokens, tok.eot), tok.eot);
            }
        }
        let mut segs: Vec<Segment> = Vec::with_capacity(current.len());
        for (start, end, toks) in current {
            let text = tok.decode_text(&toks)?;
            segs.push(Segment::decoded(seek_of(time_offset), start, end, text, toks, &result));
        }
        if opts.word_timestamps && !segs.is_empty() {
            self.add_word_timestamps(&mut segs, &cross, &base, time_offset, segment_size, &mut st.last_speech_timestamp)?;
            if !single_timestamp_ending {
                let last_word_end = segs.iter().rev().flat_map(|s| s.words.last()).map(|w| w.end).next();
                if let Some(e) = last_word_end.filter(|&e| e > time_offset) {
                    st.seek = (e * 100.0).round() as usize;
                }
            }
        }
        if unprompted {
            // decoded without the previous text: the next window is conditioned on this
            // window's text only
            st.prompt_reset_since = st.all_tokens.len();
        }
        for mut seg in segs {
            if seg.start == seg.end || seg.text.trim().is_empty() {
                continue;
            }
            st.all_tokens.extend(seg.tokens.iter().copied());
            seg.id = segments.len();
            seg.end = seg.end.min(duration.max(seg.start));
            segments.push(seg);
            if let Some(seg) = segments.last() {
                on_segment(seg);
            }
        }
        if !opts.condition_on_previous_text || result.temperature > 0.5 {
            st.prompt_reset_since = st.all_tokens.len();
        }
        Ok(())
    }

    /// Decode with the temperature fallback; `first`, when given, is the result at the first
    /// temperature (decoded already, in a batch). Returns the result and whether it was
    /// decoded without the prompt.
    ///
    /// A prompted decode at temperature 0 that repeats itself (stopped in a loop, or over the
    /// compression threshold) is decoded once more at temperature 0 without the prompt
    /// (openai-whisper's `condition_on_previous_text=False` for this window) before the
    /// sampled temperatures: the previous text is what a repetition loop most often copies
    /// (a window that starts in the middle of the prompt's last sentence hears it again and
    /// repeats it), and a deterministic decode of the audio alone is a better next try than
    /// a sample.
    pub(super) fn decode_with_fallback(&self, cross: &crate::model::CrossKv, base: &DecodeOptions, opts: &TranscribeOptions, first: Option<DecodeResult>) -> Result<(DecodeResult, bool)> {
        // Every temperature's result, and whether its compression ratio passed.
        let mut tried: Vec<(DecodeResult, bool)> = Vec::new();
        let mut first = first;
        let mut unprompted_retry = !base.prompt.is_empty();
        let mut plan: Vec<(usize, f32, bool)> = opts.temperatures.iter().enumerate().map(|(i, &t)| (i, t, false)).collect();
        let mut k = 0;
        while k < plan.len() {
            let (i, t, unprompted) = plan[k];
            k += 1;
            let mut o = base.clone();
            o.temperature = t;
            if unprompted {
                o.prompt.clear();
            }
            // A generator of its own for each temperature: with one seed for all, every
            // temperature drew the same uniforms, so the retries were not independent tries
            // (faster-whisper's sampler runs on between them).
            o.seed = base.seed ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            if t > 0.0 {
                o.beam_size = None;
            } else {
                o.best_of = None;
            }
            let r = match first.take() {
                Some(r) => r,
                None => decode_window(&self.model, &self.tokenizer, cross, &o)?,
            };
            let mut fallback = false;
            let mut compression_ok = true;
            if let Some(c) = opts.compression_ratio_threshold {
                if r.compression_ratio > c {
                    fallback = true;
                    compression_ok = false;
                }
            }
            if r.looped {
                // stopped in a repetition loop: repetitive text, as a high compression ratio
                fallback = true;
                compression_ok = false;
            }
            if let Some(l) = opts.logprob_threshold {
                if r.avg_logprob < l {
                    fallback = true;
                }
            }
            if let (Some(n), Some(l)) = (opts.no_speech_threshold, opts.logprob_threshold) {
                if r.no_speech_prob > n && r.avg_logprob < l {
                    fallback = false; // silence: no point in trying harder
                }
            }
            tracing::debug!(temperature = t, unprompted, avg_logprob = r.avg_logprob, compression = r.compression_ratio, fallback, looped = r.looped, "window decoded");
            tracing::trace!(tokens = ?r.tokens, "window tokens");
            if !fallback {
                let ts = self.tokenizer.timestamp_begin;
                let twice = repeats_a_sentence(&r.tokens, ts);
                if !unprompted && unprompted_retry && t == 0.0 && (twice || repeats_the_prompt(&r.tokens, &base.prompt, ts)) {
                    // One sentence said twice with others between, or the window opening
                    // with one of the prompt's last sentences: most often the previous text
                    // copied instead of the audio heard. The window decoded without the
                    // prompt (which cannot copy it) is kept if it passes and says no
                    // sentence twice; if it does, the audio repeats itself and the prompted
                    // result stands.
                    let mut o = o.clone();
                    o.prompt.clear();
                    let u = decode_window(&self.model, &self.tokenizer, cross, &o)?;
                    let passes = !u.looped
                        && opts.compression_ratio_threshold.is_none_or(|c| u.compression_ratio <= c)
                        && opts.logprob_threshold.is_none_or(|l| u.avg_logprob >= l);
                    tracing::debug!(passes, twice, avg_logprob = u.avg_logprob, "window said a sentence twice or the prompt's again: decoded without the prompt");
                    if passes && !repeats_a_sentence(&u.tokens, ts) {
                        return Ok((u, true));
                    }
                }
                return Ok((r, unprompted));
            }
            if t == 0.0 && !compression_ok && unprompted_retry {
                unprompted_retry = false;
                plan.insert(k, (i, t, true));
            }
            // a failed unprompted retry is not kept: the fallback's results are prompted
            if !unprompted {
                tried.push((r, compression_ok));
            }
        }
        let r = pick_after_fallback(tried).ok_or_else(|| Error::Options("no temperature to decode with".into()))?;
        Ok((r, false))
    }
}

/// Whether two segments of a window's `tokens` (text between timestamp tokens, those from
/// `timestamp_begin` on) say the same sentence of at least [`REPEAT_MIN_TOKENS`] tokens.
///
/// A prompted decode that copies the previous window's text instead of hearing the audio
/// says one of its sentences again and again, with other sentences between, which neither
/// the loop check (a repetition at the end) nor the compression ratio (a few sentences are
/// not compressible enough) catches. A speaker who says one long sentence twice within 30
/// seconds costs only a decode without the prompt.
pub(super) fn repeats_a_sentence(tokens: &[u32], timestamp_begin: u32) -> bool {
    let segments: Vec<&[u32]> = tokens.split(|&t| t >= timestamp_begin).filter(|s| s.len() >= REPEAT_MIN_TOKENS).collect();
    segments.iter().enumerate().any(|(i, a)| segments[i + 1..].contains(a))
}

/// Whether one of the first [`PROMPT_COPY_SEGMENTS`] segments of a window's `tokens` is one
/// of the last [`PROMPT_COPY_SEGMENTS`] segments of its `prompt` (the previous text), at
/// least [`REPEAT_MIN_TOKENS`] long.
///
/// A prompted decode can open by saying the previous window's last sentences again, with
/// timestamps stretched over the audio it did not hear (tiny.en greedy on the long-form
/// case: "Had he married a more amiable woman ... than" from 205 s to 231 s, the prompt's
/// second-to-last sentence, over audio of four other sentences), and then stop: no loop,
/// no repetition inside the window, a compression ratio and log probability that pass.
/// A window of real speech starts where the prompt's last segment ended, so it opens with
/// what comes after those sentences; a speaker who says a sentence again right away costs
/// only a decode without the prompt.
pub(super) fn repeats_the_prompt(tokens: &[u32], prompt: &[u32], timestamp_begin: u32) -> bool {
    let recent: Vec<&[u32]> = prompt.split(|&t| t >= timestamp_begin).filter(|s| !s.is_empty()).rev().take(PROMPT_COPY_SEGMENTS).collect();
    tokens
        .split(|&t| t >= timestamp_begin)
        .filter(|s| !s.is_empty())
        .take(PROMPT_COPY_SEGMENTS)
        .any(|s| s.len() >= REPEAT_MIN_TOKENS && recent.contains(&s))
}

/// Segments at the end of the prompt and at the start of the window that
/// [`repeats_the_prompt`] compares.
pub(super) const PROMPT_COPY_SEGMENTS: usize = 3;

/// The shortest sentence [`repeats_a_sentence`] counts (shorter ones, "Thank you.", are
/// said twice in earnest).
pub(super) const REPEAT_MIN_TOKENS: usize = 6;

/// When every temperature failed, the result faster-whisper keeps: the best average log
/// probability among those whose compression ratio passed (a looping text only when all
/// loop), reported at the last temperature tried (which decides the prompt reset).
pub(super) fn pick_after_fallback(tried: Vec<(DecodeResult, bool)>) -> Option<DecodeResult> {
    let last_t = tried.last().map(|(r, _)| r.temperature)?;
    let any_ok = tried.iter().any(|(_, ok)| *ok);
    let mut best: Option<DecodeResult> = None;
    for (r, ok) in tried {
        // `max` in Python keeps the first of equal values.
        if (ok || !any_ok) && best.as_ref().is_none_or(|b| r.avg_logprob > b.avg_logprob) {
            best = Some(r);
        }
    }
    best.map(|mut r| {
        r.temperature = last_t;
        r
    })
}

/// The state the long-form loop carries from one window to the next.
#[derive(Clone, Debug)]
pub(crate) struct LoopState {
    /// Text and timestamp tokens of the segments so far (the prompt of the next window).
    pub all_tokens: Vec<u32>,
    pub prompt_reset_since: usize,
    /// Mel frame the next window starts at.
    pub seek: usize,
    pub last_speech_timestamp: f64,
    /// The window from frame 0 of `.0` frames, encoded already (by the language detection).
    pub encoded: Option<(usize, crate::model::CrossKv)>,
}

impl LoopState {
    /// `previous` (text tokens that came before this audio) replaces the initial prompt.
    pub fn new(t: &Transcriber, opts: &TranscribeOptions, previous: Option<&[u32]>) -> Result<Self> {
        let mut all_tokens = Vec::new();
        match previous {
            Some(p) => all_tokens.extend_from_slice(p),
            None => {
                if let Some(p) = &opts.initial_prompt {
                    all_tokens.extend(t.tokenizer.encode(&format!(" {}", p.trim()))?);
                }
            }
        }
        Ok(Self { all_tokens, prompt_reset_since: 0, seek: 0, last_speech_timestamp: 0.0, encoded: None })
    }
}

pub(super) fn text_of(tokens: &[u32], eot: u32) -> Vec<u32> {
    tokens.iter().copied().filter(|&t| t < eot).collect()
}

/// Drops the first text tokens of `first` (a window's first segment, timestamps and all)
/// where they repeat the last text tokens of `prev` (the segment before it): up to three
/// tokens, the longest such overlap. A window decoded without the previous text, which
/// starts where the last segment ended, hears the end of that segment's last word and says
/// it again ("... amiable himself." then "himself. And ...").
pub(super) fn drop_boundary_repeat(first: &mut Vec<u32>, prev: &[u32], eot: u32) {
    let Some(at) = first.iter().position(|&t| t < eot) else {
        return;
    };
    let text: Vec<u32> = first[at..].iter().copied().take_while(|&t| t < eot).collect();
    let k = (1..=3.min(prev.len()).min(text.len())).rev().find(|&k| prev[prev.len() - k..] == text[..k]).unwrap_or(0);
    first.drain(at..at + k);
}

/// The segments of a looping result without the loop: a segment whose text is that of an
/// earlier one (in the window, or one of `before`, the last segments already decided) is
/// dropped, and one that loops inside itself is cut where the loop starts.
pub(super) fn drop_repeats(current: &mut Vec<(f64, f64, Vec<u32>)>, before: &[Vec<u32>], eot: u32) {
    let mut seen: Vec<Vec<u32>> = before.iter().filter(|t| !t.is_empty()).cloned().collect();
    current.retain_mut(|(_, _, toks)| {
        let text = text_of(toks, eot);
        if let Some(k) = crate::decode::loop_start(&text) {
            // cut before the k-th text token (timestamps before it kept)
            let mut n_text = 0;
            let cut = toks.iter().position(|&t| {
                let hit = t < eot && n_text == k;
                if t < eot {
                    n_text += 1;
                }
                hit
            });
            if let Some(c) = cut {
                toks.truncate(c);
            }
        }
        let text = text_of(toks, eot);
        if text.is_empty() || seen.contains(&text) {
            return false;
        }
        seen.push(text);
        true
    });
}

/// The segments of one chunk's tokens (batched mode): text between timestamp tokens, the
/// times offset by the chunk's start and kept within the chunk; text after the last
/// timestamp (or all of it, without timestamps) ends at the chunk's end. Also returns the
/// last timestamp (file time) and whether text came after it (the last segment).
pub(super) type Pieces = Vec<(f64, f64, Vec<u32>)>;

pub(super) fn chunk_segments(tok: &WhisperTokenizer, tokens: &[u32], offset: f64, chunk_end: f64) -> (Pieces, Option<f64>, bool) {
    let mut out = Vec::new();
    let mut start = offset;
    let mut last_ts = None;
    let mut text: Vec<u32> = Vec::new();
    for &t in tokens {
        if t >= tok.timestamp_begin {
            let time = (offset + tok.timestamp_seconds(t)).min(chunk_end);
            if !text.is_empty() {
                out.push((start, time.max(start), std::mem::take(&mut text)));
            }
            start = time;
            last_ts = Some(time);
        } else if t < tok.eot {
            text.push(t);
        }
    }
    let trailing = !text.is_empty();
    if trailing {
        out.push((start, chunk_end.max(start), text));
    }
    (out, last_ts, trailing)
}
