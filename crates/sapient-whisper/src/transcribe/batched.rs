//! [`LongForm::Batched`]: the attached VAD's speech regions in chunks of up to 30 s, heard
//! `batch_size` at a time through the encoder and the decoder (faster-whisper's
//! `BatchedInferencePipeline`).

use super::sequential::{chunk_segments, drop_repeats};
use super::*;

impl Transcriber {
    /// [`LongForm::Batched`]: VAD chunks of up to 30 s of speech, `batch_size` at a time
    /// through the encoder and the decoder.
    pub(super) fn transcribe_batched(&self, samples: &[f32], opts: &TranscribeOptions, batch_size: usize, on_segment: &mut dyn FnMut(&Segment)) -> Result<Transcript> {
        self.check_options(opts)?;
        if batch_size == 0 {
            return Err(Error::Options("the batch size of batched transcription must be at least 1".into()));
        }
        if self.vad.is_none() {
            return Err(Error::Options(
                "batched transcription cuts the audio at the speech the VAD finds: attach one (Transcriber::set_vad; the CLI does unless --no-vad)".into(),
            ));
        }
        let tok = &self.tokenizer;
        let mut out = begin_transcript(samples, opts)?;
        let duration = out.duration;
        if samples.len() < HOP_LENGTH {
            return Ok(out);
        }
        let language = if !tok.multilingual {
            Some("en".to_string())
        } else if opts.language.is_some() {
            opts.language.clone()
        } else {
            let probs = self.detect_language(samples)?;
            out.language_probs = probs;
            out.language_probs.first().map(|p| p.0.clone())
        };
        out.language = language.clone().unwrap_or_default();
        let t_vad = std::time::Instant::now();
        let chunks = self.speech_chunks(samples)?;
        tracing::debug!(chunks = chunks.len(), vad_s = t_vad.elapsed().as_secs_f64(), "batched transcription");
        for c in &chunks {
            tracing::debug!(pieces = ?c.pieces, seconds = c.len() as f64 / SAMPLE_RATE as f64, "chunk");
        }
        let mut queue: std::collections::VecDeque<Chunk> = chunks.into();
        let mut segments: Vec<Segment> = Vec::new();
        let prompt = match &opts.initial_prompt {
            Some(p) => tok.encode(&format!(" {}", p.trim()))?,
            None => Vec::new(),
        };
        let n_frames = self.model.n_frames();
        let sr = SAMPLE_RATE as f64;
        while !queue.is_empty() {
            let batch: Vec<Chunk> = queue.drain(..batch_size.min(queue.len())).collect();
            // each chunk's log-mel window (its speech one after the other), zero-padded to 30 s
            let mut windows = Vec::with_capacity(batch.len());
            let mut frames = Vec::with_capacity(batch.len());
            let t0 = std::time::Instant::now();
            for chunk in &batch {
                // Padded by one STFT window, not 30 s: the content frames see the zeros
                // after the audio as they do in a 30 s padding (their normalisation too:
                // frames of zeros are at the floor), and the frames of the padding itself,
                // zeros in the window, are not computed.
                let mel = self.mel.log_mel_padded(&chunk.samples(samples), N_FFT)?;
                let content = (chunk.len() / HOP_LENGTH).clamp(1, n_frames.min(mel.n_frames));
                windows.push(self.window(&mel, 0, content)?);
                frames.push(content);
            }
            let t1 = std::time::Instant::now();
            let audio = self.model.encode(&Tensor::stack(&windows, 0)?)?;
            let crosses = self.model.cross_kv_batch(&audio)?;
            drop(audio);
            let t2 = std::time::Instant::now();
            let base = DecodeOptions {
                task: opts.task,
                language: language.clone(),
                beam_size: opts.beam_size,
                best_of: Some(opts.best_of),
                patience: opts.patience,
                length_penalty: opts.length_penalty,
                prompt: prompt.clone(),
                without_timestamps: opts.without_timestamps,
                seed: opts.seed,
                ..DecodeOptions::default()
            };
            let first = DecodeOptions { temperature: opts.temperatures[0], ..base.clone() };
            let first = DecodeOptions {
                beam_size: if first.temperature > 0.0 { None } else { first.beam_size },
                best_of: if first.temperature > 0.0 { first.best_of } else { None },
                seed: base.seed ^ 0x9E37_79B9_7F4A_7C15,
                ..first
            };
            let refs: Vec<&crate::model::CrossKv> = crosses.iter().collect();
            let results = decode_batch(&self.model, tok, &refs, &first)?;
            tracing::debug!(chunks = batch.len(), mel_s = (t1 - t0).as_secs_f64(), encode_s = (t2 - t1).as_secs_f64(), decode_s = t2.elapsed().as_secs_f64(), "batch decoded");
            for (((chunk, cross), r), &content) in batch.iter().zip(&crosses).zip(results).zip(&frames) {
                let time_offset = chunk.start() as f64 / sr;
                let chunk_len = chunk.len();
                let seed = opts.seed.wrapping_add(seek_of(time_offset) as u64);
                let base = DecodeOptions { seed, ..base.clone() };
                let (result, _) = self.decode_with_fallback(cross, &base, opts, Some(r))?;
                if let Some(nst) = opts.no_speech_threshold {
                    let speech = opts.logprob_threshold.is_some_and(|lt| result.avg_logprob > lt);
                    if result.no_speech_prob > nst && !speech {
                        tracing::debug!(start = time_offset, no_speech = result.no_speech_prob, "chunk skipped as silent");
                        continue;
                    }
                }
                // segments in chunk time
                let (mut current, last_ts, trailing) = chunk_segments(tok, &result.tokens, 0.0, chunk_len as f64 / sr);
                let failed = result.looped || opts.compression_ratio_threshold.is_some_and(|c| result.compression_ratio > c);
                if failed {
                    drop_repeats(&mut current, &[], tok.eot);
                } else if let Some(lt) = last_ts {
                    // Whisper often ends a window at a timestamp before its last sentence
                    // (the sequential loop's next window starts there): speech after the last
                    // timestamp goes back into the queue as a chunk of its own, and text
                    // decoded after that timestamp is dropped (it is decoded again there).
                    let rest = ((lt * sr).ceil() as usize).min(chunk_len);
                    let tail = chunk.tail(rest);
                    if rest > 0 && tail.len() >= SAMPLE_RATE as usize && tail.speech(self.chunk_pad()) >= SAMPLE_RATE as usize / 2 {
                        if trailing {
                            current.pop();
                        }
                        tracing::debug!(from = chunk.file_time(lt, false), "speech after the last timestamp: decoded again");
                        queue.push_back(tail);
                    }
                }
                let mut segs: Vec<Segment> = Vec::with_capacity(current.len());
                for (start, end, toks) in current {
                    segs.push(Segment::decoded(seek_of(time_offset), start, end, tok.decode_text(&toks)?, toks, &result));
                }
                if opts.word_timestamps && !segs.is_empty() {
                    let mut last_speech_timestamp = 0.0;
                    self.add_word_timestamps(&mut segs, cross, &base, 0.0, content, &mut last_speech_timestamp)?;
                }
                for mut seg in segs {
                    // chunk time to file time: a word by the piece its middle is in
                    for w in seg.words.iter_mut() {
                        let (start, end) = chunk.file_span(w.start, w.end);
                        w.start = start;
                        w.end = end;
                    }
                    seg.start = chunk.file_time(seg.start, false);
                    seg.end = chunk.file_time(seg.end, true).min(duration).max(seg.start);
                    if !seg.text.trim().is_empty() && seg.start < seg.end {
                        segments.push(seg);
                    }
                }
            }
        }
        // chunks decoded again from their last timestamp come later in the queue
        segments.sort_by(|x, y| x.start.total_cmp(&y.start));
        for mut seg in segments {
            seg.id = out.segments.len();
            out.segments.push(seg);
            if let Some(seg) = out.segments.last() {
                on_segment(seg);
            }
        }
        let text_tokens: Vec<u32> = out.segments.iter().flat_map(|s| s.tokens.iter().copied()).collect();
        out.text = tok.decode_text(&text_tokens)?;
        Ok(out)
    }

    /// The VAD options of [`LongForm::Batched`]: faster-whisper's `BatchedInferencePipeline`
    /// ones (speech regions of up to 30 s, cut at the last silence of 98 ms or more; a
    /// silence of 160 ms ends one; 400 ms of padding on each side, so that a word's soft
    /// onset is not cut off).
    pub(super) fn chunk_vad_options() -> sapient_audio::VadOptions {
        sapient_audio::VadOptions {
            max_speech_s: CHUNK_S,
            min_silence_ms: 160,
            min_speech_ms: 0,
            speech_pad_ms: CHUNK_PAD_MS,
            use_max_possible_silence_at_max_speech: false,
            ..Default::default()
        }
    }

    /// [`CHUNK_PAD_MS`] in samples.
    pub(super) fn chunk_pad(&self) -> usize {
        CHUNK_PAD_MS as usize * SAMPLE_RATE as usize / 1000
    }

    /// The chunks of [`LongForm::Batched`]: the attached VAD's padded speech regions, heard
    /// one after the other without the silence between them, up to 30 s of them per chunk
    /// (faster-whisper's `collect_chunks`).
    pub(super) fn speech_chunks(&self, samples: &[f32]) -> Result<Vec<Chunk>> {
        let Some(vad) = &self.vad else { return Ok(Vec::new()) };
        let mut vad = vad.lock().map_err(|_| Error::Options("the VAD's lock was poisoned by a panic".into()))?;
        let probs = vad.probabilities(samples)?;
        let seg = sapient_audio::VadSegmenter::new(Self::chunk_vad_options())?;
        let regions: Vec<(usize, usize)> = seg.segments(&probs, samples.len()).iter().map(|s| (s.start, s.end.min(samples.len()))).collect();
        Ok(collect_chunks(&regions, (CHUNK_S * SAMPLE_RATE as f64) as usize))
    }
}

/// Padding of the speech regions of [`LongForm::Batched`] (faster-whisper's default).
pub(super) const CHUNK_PAD_MS: u32 = 400;

/// A chunk of [`LongForm::Batched`]: speech regions of the audio (16 kHz sample ranges, in
/// order, not touching) heard one after the other, the silence between them left out.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Chunk {
    pub(super) pieces: Vec<(usize, usize)>,
}

impl Chunk {
    /// Samples of audio in the chunk.
    pub(super) fn len(&self) -> usize {
        self.pieces.iter().map(|&(s, e)| e - s).sum()
    }

    /// The sample of the file the chunk starts at.
    pub(super) fn start(&self) -> usize {
        self.pieces.first().map_or(0, |p| p.0)
    }

    /// The chunk's audio.
    pub(super) fn samples(&self, audio: &[f32]) -> Vec<f32> {
        let mut v = Vec::with_capacity(self.len());
        for &(s, e) in &self.pieces {
            v.extend_from_slice(&audio[s.min(audio.len())..e.min(audio.len())]);
        }
        v
    }

    /// The piece chunk time `t` (seconds) falls in, and the chunk sample that piece starts
    /// at. A time on the joint of two pieces is in the first when `is_end`, else in the
    /// second; times past the end are in the last piece.
    pub(super) fn piece_at(&self, t: f64, is_end: bool) -> (usize, usize) {
        let x = t * SAMPLE_RATE as f64;
        let mut acc = 0;
        for (i, &(s, e)) in self.pieces.iter().enumerate() {
            let end = (acc + e - s) as f64;
            if x < end || (is_end && x <= end) || i + 1 == self.pieces.len() {
                return (i, acc);
            }
            acc += e - s;
        }
        (0, 0)
    }

    /// File time (seconds) of chunk time `t`; see [`Chunk::piece_at`] for `is_end`.
    pub(super) fn file_time(&self, t: f64, is_end: bool) -> f64 {
        self.file_time_in(t, self.piece_at(t, is_end))
    }

    pub(super) fn file_time_in(&self, t: f64, (i, acc): (usize, usize)) -> f64 {
        let Some(&(s, e)) = self.pieces.get(i) else { return t };
        let x = (t * SAMPLE_RATE as f64 - acc as f64).clamp(0.0, (e - s) as f64);
        (s as f64 + x) / SAMPLE_RATE as f64
    }

    /// File times of a span of chunk time (a word), both in the piece its middle is in.
    pub(super) fn file_span(&self, start: f64, end: f64) -> (f64, f64) {
        let piece = self.piece_at((start + end) / 2.0, false);
        (self.file_time_in(start, piece), self.file_time_in(end, piece))
    }

    /// The chunk from chunk sample `from` on.
    pub(super) fn tail(&self, from: usize) -> Chunk {
        let mut acc = 0;
        let mut pieces = Vec::new();
        for &(s, e) in &self.pieces {
            let skip = from.saturating_sub(acc).min(e - s);
            if s + skip < e {
                pieces.push((s + skip, e));
            }
            acc += e - s;
        }
        Chunk { pieces }
    }

    /// Samples of speech in the chunk: each piece without the padding at its ends (`pad`
    /// samples each side).
    pub(super) fn speech(&self, pad: usize) -> usize {
        self.pieces.iter().map(|&(s, e)| (e - s).saturating_sub(2 * pad)).sum()
    }
}

/// faster-whisper's `collect_chunks`: speech regions (sample ranges, in order) gathered into
/// chunks of at most `max_len` samples of audio, a region that would take a chunk past it
/// starting the next; a region longer than `max_len` is cut to it. Regions that touch are
/// one piece.
pub(crate) fn collect_chunks(regions: &[(usize, usize)], max_len: usize) -> Vec<Chunk> {
    let mut out = Vec::new();
    let mut cur: Vec<(usize, usize)> = Vec::new();
    let mut cur_len = 0;
    for &(s, e) in regions {
        let e = e.min(s + max_len);
        if e <= s {
            continue;
        }
        if cur_len + (e - s) > max_len && !cur.is_empty() {
            out.push(Chunk { pieces: std::mem::take(&mut cur) });
            cur_len = 0;
        }
        match cur.last_mut() {
            Some(last) if last.1 >= s => last.1 = last.1.max(e),
            _ => cur.push((s, e)),
        }
        cur_len += e - s;
    }
    if !cur.is_empty() {
        out.push(Chunk { pieces: cur });
    }
    out
}
