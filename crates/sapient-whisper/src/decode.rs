//! Decoding one 30 s window as openai-whisper's `decoding.py` does: the initial tokens
//! (previous text, start of transcript, language, task), logit filters (suppress blank,
//! suppress tokens, timestamp rules), greedy / sampled / beam-search decoding, ranking by
//! length-normalised log probability, and the no-speech probability.

use crate::model::{CrossKv, KvCache, Whisper};
use crate::tokenizer::WhisperTokenizer;
use crate::{Error, Result};
use candle_core::Tensor;
use std::collections::HashMap;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Task {
    #[default]
    Transcribe,
    /// Into English.
    Translate,
}

impl std::str::FromStr for Task {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "transcribe" => Ok(Task::Transcribe),
            "translate" => Ok(Task::Translate),
            _ => Err(Error::Options(format!("task '{s}' (expected transcribe or translate)"))),
        }
    }
}

/// Options of one window's decoding (`DecodingOptions`).
#[derive(Clone, Debug)]
pub struct DecodeOptions {
    pub task: Task,
    /// Language code (`en`, `fr`, ...); required for multilingual models (detect it first).
    pub language: Option<String>,
    /// 0 = greedy (or beam search when `beam_size` is set); above 0, sampling.
    pub temperature: f32,
    /// Beam search with this many beams (temperature 0 only).
    pub beam_size: Option<usize>,
    /// Candidates sampled at temperature > 0 (the best one is kept).
    pub best_of: Option<usize>,
    /// Beam search stops after `round(beam_size * patience)` finished candidates.
    pub patience: f32,
    /// None: rank by log probability / length; Some(a): by the Google NMT penalty.
    pub length_penalty: Option<f32>,
    /// Text tokens of the previous window(s) or an initial prompt.
    pub prompt: Vec<u32>,
    pub without_timestamps: bool,
    /// Latest first timestamp, in seconds.
    pub max_initial_timestamp: Option<f32>,
    pub suppress_blank: bool,
    /// Maximum tokens to sample (default: half the context, 224).
    pub sample_len: Option<usize>,
    /// Seed of the sampler at temperature > 0.
    pub seed: u64,
}

impl Default for DecodeOptions {
    fn default() -> Self {
        Self {
            task: Task::Transcribe,
            language: None,
            temperature: 0.0,
            beam_size: None,
            best_of: None,
            patience: 1.0,
            length_penalty: None,
            prompt: Vec::new(),
            without_timestamps: false,
            max_initial_timestamp: Some(1.0),
            suppress_blank: true,
            sample_len: None,
            seed: 0,
        }
    }
}

/// Result of one window (`DecodingResult`).
#[derive(Clone, Debug, PartialEq)]
pub struct DecodeResult {
    /// Sampled tokens, text and timestamps, without the final end of text.
    pub tokens: Vec<u32>,
    pub text: String,
    pub avg_logprob: f32,
    pub no_speech_prob: f32,
    pub temperature: f32,
    pub compression_ratio: f32,
    /// The decode was stopped because its text repeated itself ([`loop_start`]): a failed
    /// result, as one over the compression-ratio threshold.
    pub looped: bool,
}

/// Where a repetition loop at the end of `text` starts: the tail is one block of `p` tokens
/// repeated at least three times (eight times for blocks of one to three tokens), spanning
/// at least 24 tokens. Returns the index of the first repetition after the block's first
/// occurrence (what is left once the loop is cut), or None.
///
/// Whisper's failure on noise, music and early seeks is to say one sentence over and over
/// until the 224-token limit; stopping at the third repetition saves the rest of the steps,
/// and the transcript keeps the sentence once.
pub fn loop_start(text: &[u32]) -> Option<usize> {
    const MIN_SPAN: usize = 24;
    let n = text.len();
    if n < MIN_SPAN {
        return None;
    }
    for p in 1..=n / 3 {
        let reps_needed = if p < 4 { 8 } else { 3 };
        let need = (p * reps_needed).max(MIN_SPAN);
        if need > n {
            continue;
        }
        // the last `need` tokens have period p
        if (n - need..n - p).all(|i| text[i] == text[i + p]) {
            // extend back while the period holds
            let mut start = n - need;
            while start > 0 && text[start - 1] == text[start - 1 + p] {
                start -= 1;
            }
            return Some(start + p);
        }
    }
    None
}

/// Whether the text tokens (timestamps and specials left out) of `sampled` end in a loop.
fn is_looping(sampled: &[u32], eot: u32, scratch: &mut Vec<u32>) -> bool {
    scratch.clear();
    scratch.extend(sampled.iter().copied().filter(|&t| t < eot));
    loop_start(scratch).is_some()
}

/// gzip-style compression ratio of a text (`len(bytes) / len(zlib.compress(bytes))`): high
/// for repetitive output.
pub fn compression_ratio(text: &str) -> f32 {
    let b = text.as_bytes();
    if b.is_empty() {
        return 0.0;
    }
    let z = miniz_oxide::deflate::compress_to_vec_zlib(b, 6);
    b.len() as f32 / z.len() as f32
}

fn log_softmax(x: &[f32]) -> Vec<f32> {
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if m == f32::NEG_INFINITY {
        return vec![f32::NEG_INFINITY; x.len()];
    }
    let s: f64 = x.iter().map(|&v| ((v - m) as f64).exp()).sum();
    let lse = m + s.ln() as f32;
    x.iter().map(|&v| v - lse).collect()
}

/// The largest value (-inf for none, NaNs left out), as `fold(f32::NEG_INFINITY, f32::max)`
/// gives it, in 16 lanes (a maximum does not depend on the order): a pass over the
/// vocabulary at the vector rate instead of a chain of scalar maxima.
fn max_value(x: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 16];
    let mut chunks = x.chunks_exact(16);
    for c in &mut chunks {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l = if v > *l { v } else { *l };
        }
    }
    let rest = chunks.remainder().iter().copied().fold(f32::NEG_INFINITY, f32::max);
    lanes.iter().copied().fold(rest, f32::max)
}

fn logsumexp(x: &[f32]) -> f32 {
    let m = max_value(x);
    if m == f32::NEG_INFINITY {
        return m;
    }
    // f32 terms (the kernels' vectorised exp, a relative error of about 1e-7 as libm's),
    // summed in 16 lanes per block and in f64 over the blocks
    let s: f64 = x.chunks(1024).map(|c| crate::decoder::exp_sum(c, m) as f64).sum();
    m + s.ln() as f32
}

/// Indices of the `k` largest values, largest first (ties: lower index first).
fn top_k(x: &[f32], k: usize) -> Vec<usize> {
    let mut best: Vec<usize> = Vec::with_capacity(k + 1);
    if k == 0 {
        return best;
    }
    // blocks of 16 whose values are all at or below the k-th best so far are passed over
    // in one vector comparison (what the value-by-value test would do with each of them)
    for (c, block) in x.chunks(16).enumerate() {
        if best.len() == k {
            let floor = x[best[k - 1]];
            if block.iter().fold(true, |all, &v| all & (v <= floor)) {
                continue;
            }
        }
        for (j, &v) in block.iter().enumerate() {
            if best.len() == k && v <= x[best[k - 1]] {
                continue;
            }
            let pos = best.iter().position(|&b| v > x[b]).unwrap_or(best.len());
            best.insert(pos, c * 16 + j);
            best.truncate(k);
        }
    }
    best
}

/// Small deterministic generator for sampling (splitmix64).
struct Rng(u64);
impl Rng {
    fn next_f64(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The logit filters of one decoding run.
pub(crate) struct Filters {
    pub sample_begin: usize,
    suppress_blank: Vec<u32>,
    suppress: Vec<u32>,
    timestamps: bool,
    max_initial_timestamp_index: Option<usize>,
    eot: u32,
    no_timestamps: u32,
    timestamp_begin: u32,
}

impl Filters {
    pub fn new(model: &Whisper, tok: &WhisperTokenizer, opts: &DecodeOptions, sample_begin: usize) -> Result<Self> {
        let cfg = &model.config;
        let suppress_blank = if !opts.suppress_blank {
            Vec::new()
        } else if cfg.begin_suppress_tokens.is_empty() {
            let mut v = tok.encode(" ")?;
            v.push(tok.eot);
            v
        } else {
            cfg.begin_suppress_tokens.clone()
        };
        let mut suppress = if cfg.suppress_tokens.is_empty() {
            tok.non_speech_tokens()?
        } else {
            cfg.suppress_tokens.clone()
        };
        suppress.extend([tok.transcribe, tok.translate, tok.sot, tok.sot_prev, tok.sot_lm, tok.no_speech]);
        suppress.retain(|&t| (t as usize) < cfg.vocab_size);
        suppress.sort_unstable();
        suppress.dedup();
        Ok(Self {
            sample_begin,
            suppress_blank,
            suppress,
            timestamps: !opts.without_timestamps,
            max_initial_timestamp_index: opts.max_initial_timestamp.map(|s| (s / 0.02).round() as usize),
            eot: tok.eot,
            no_timestamps: tok.no_timestamps,
            timestamp_begin: tok.timestamp_begin,
        })
    }

    /// Apply the filters to one row of logits given the tokens so far.
    pub fn apply(&self, logits: &mut [f32], tokens: &[u32]) {
        let ninf = f32::NEG_INFINITY;
        if tokens.len() == self.sample_begin {
            for &t in &self.suppress_blank {
                logits[t as usize] = ninf;
            }
        }
        for &t in &self.suppress {
            logits[t as usize] = ninf;
        }
        if !self.timestamps {
            return;
        }
        let tb = self.timestamp_begin as usize;
        logits[self.no_timestamps as usize] = ninf;
        let sampled = &tokens[self.sample_begin.min(tokens.len())..];
        let is_ts = |t: u32| t >= self.timestamp_begin;
        let last_was_timestamp = sampled.last().is_some_and(|&t| is_ts(t));
        let penultimate_was_timestamp = sampled.len() < 2 || is_ts(sampled[sampled.len() - 2]);
        if last_was_timestamp {
            if penultimate_was_timestamp {
                logits[tb..].fill(ninf);
            } else {
                logits[..self.eot as usize].fill(ninf);
            }
        }
        if let Some(&last_ts) = sampled.iter().rev().find(|&&t| is_ts(t)) {
            // timestamps do not decrease, and a segment has a non-zero length
            let upto = if last_was_timestamp && !penultimate_was_timestamp { last_ts } else { last_ts + 1 } as usize;
            let n = logits.len();
            logits[tb..upto.min(n)].fill(ninf);
        }
        if tokens.len() == self.sample_begin {
            logits[..tb].fill(ninf);
            if let Some(i) = self.max_initial_timestamp_index {
                let last_allowed = tb + i;
                if last_allowed + 1 < logits.len() {
                    logits[last_allowed + 1..].fill(ninf);
                }
            }
        }
        // a timestamp when their total probability beats every text token (compared in
        // logits: both sides would subtract the same normaliser)
        let ts = logsumexp(&logits[tb..]);
        let text_max = max_value(&logits[..tb]);
        if ts > text_max {
            logits[..tb].fill(ninf);
        }
    }
}

/// The initial tokens of a window and the index of the start-of-transcript token in them.
pub fn initial_tokens(model: &Whisper, tok: &WhisperTokenizer, opts: &DecodeOptions) -> Result<(Vec<u32>, usize)> {
    let n_ctx = model.config.max_target_positions;
    let mut seq = vec![tok.sot];
    if tok.multilingual {
        let lang = opts
            .language
            .as_deref()
            .ok_or_else(|| Error::Options("a multilingual model needs a language (detect it first)".into()))?;
        seq.push(tok.language_token(lang)?);
        seq.push(match opts.task {
            Task::Transcribe => tok.transcribe,
            Task::Translate => tok.translate,
        });
    } else {
        if let Some(l) = opts.language.as_deref() {
            if l != "en" {
                return Err(Error::Options(format!("an English-only model cannot take language '{l}'")));
            }
        }
        if opts.task == Task::Translate {
            return Err(Error::Options("an English-only model cannot translate".into()));
        }
    }
    if opts.without_timestamps {
        seq.push(tok.no_timestamps);
    }
    let mut out = Vec::new();
    if !opts.prompt.is_empty() {
        out.push(tok.sot_prev);
        let keep = n_ctx / 2 - 1;
        let p = &opts.prompt[opts.prompt.len().saturating_sub(keep)..];
        out.extend_from_slice(p);
    }
    let sot_index = out.len();
    out.extend(seq);
    Ok((out, sot_index))
}

/// Language probabilities of a window (multilingual models), most likely first.
pub fn detect_language(model: &Whisper, tok: &WhisperTokenizer, cross: &CrossKv) -> Result<Vec<(String, f32)>> {
    if !tok.multilingual {
        return Ok(vec![("en".to_string(), 1.0)]);
    }
    let mut cache = KvCache::new();
    let x = Tensor::new(&[[tok.sot]], model.device())?;
    let h = model.decode(&x, cross, &mut cache, None)?;
    let logits: Vec<f32> = model.logits(&h.squeeze(0)?)?.squeeze(0)?.to_vec1()?;
    let lang: Vec<f32> = tok.languages.iter().map(|l| logits[l.1 as usize]).collect();
    let lp = log_softmax(&lang);
    let mut out: Vec<(String, f32)> = tok.languages.iter().zip(lp).map(|(l, p)| (l.0.clone(), p.exp())).collect();
    out.sort_by(|a, b| b.1.total_cmp(&a.1));
    Ok(out)
}

fn rows_of(logits: &Tensor) -> Result<Vec<Vec<f32>>> {
    Ok(logits.to_vec2()?)
}

/// Decode one window whose cross-attention keys and values are `cross`.
pub fn decode_window(model: &Whisper, tok: &WhisperTokenizer, cross: &CrossKv, opts: &DecodeOptions) -> Result<DecodeResult> {
    let (mut search, initial, sot_index) = Search::new(model, tok, opts)?;
    let sample_begin = initial.len();
    let device = model.device();

    // first forward: the initial tokens once, then the cache repeated for the group
    let mut cache = KvCache::new();
    let x = Tensor::new(initial.as_slice(), device)?.unsqueeze(0)?;
    let h = model.decode(&x, cross, &mut cache, None)?.squeeze(0)?;
    let rows = Tensor::new(&[sot_index as u32, (sample_begin - 1) as u32], device)?;
    let l = rows_of(&model.logits(&h.index_select(&rows, 0)?)?)?;
    search.no_speech_prob = log_softmax(&l[0])[tok.no_speech as usize].exp();
    let n_group = search.n_group;
    if n_group > 1 {
        cache.reorder(&vec![0u32; n_group])?;
    }
    let mut logits_rows: Vec<Vec<f32>> = vec![l[1].clone(); n_group];
    loop {
        match search.advance(&mut logits_rows) {
            Step::Done => break,
            Step::Reorder(sources) => cache.reorder(&sources)?,
            Step::Continue => {}
        }
        let last = search.last_tokens();
        let x = Tensor::new(last.as_slice(), device)?.unsqueeze(1)?;
        let h = model.decode(&x, cross, &mut cache, None)?;
        // the group's row buffers take the new logits (no fresh allocations per step)
        model.logits_rows_into(&h.squeeze(1)?, &mut logits_rows)?;
    }
    search.finish(tok)
}

/// Decode several windows together (the batched long-form mode): one decoder step runs
/// over the current token of every live beam (or sample) of every window, each window
/// attending to its own cross-attention keys and values, through the same kernels as one
/// window's rows. Each window's result is what [`decode_window`] gives it alone (the same
/// search, the same options; the floating-point sums agree but for the matrix kernels'
/// row blocking).
pub fn decode_batch(model: &Whisper, tok: &WhisperTokenizer, crosses: &[&CrossKv], opts: &DecodeOptions) -> Result<Vec<DecodeResult>> {
    if crosses.is_empty() {
        return Ok(Vec::new());
    }
    if crosses.len() == 1 {
        return crosses.iter().map(|c| decode_window(model, tok, c, opts)).collect();
    }
    let n = crosses.len();
    let mut searches = Vec::with_capacity(n);
    let mut initial = Vec::new();
    let mut sot_index = 0;
    for _ in 0..n {
        let (s, i, si) = Search::new(model, tok, opts)?;
        searches.push(s);
        initial = i;
        sot_index = si;
    }
    let sample_begin = initial.len();
    let n_group = searches[0].n_group;
    let d = model.config.d_model;

    // first forward: every window's initial tokens (the same tokens, each window's audio)
    let mut cache = KvCache::new();
    let tokens: Vec<u32> = (0..n).flat_map(|_| initial.iter().copied()).collect();
    let groups: Vec<(&CrossKv, usize)> = crosses.iter().map(|&c| (c, 1)).collect();
    let h = model.decode_groups(&tokens, n, sample_begin, &groups, &mut cache)?.reshape((n * sample_begin, d))?;
    let picks: Vec<u32> = (0..n).flat_map(|w| [(w * sample_begin + sot_index) as u32, (w * sample_begin + sample_begin - 1) as u32]).collect();
    let picks = Tensor::new(picks.as_slice(), model.device())?;
    let l = rows_of(&model.logits(&h.index_select(&picks, 0)?)?)?;
    let mut rows_of_window: Vec<Vec<Vec<f32>>> = Vec::with_capacity(n);
    for (w, s) in searches.iter_mut().enumerate() {
        s.no_speech_prob = log_softmax(&l[2 * w])[tok.no_speech as usize].exp();
        rows_of_window.push(vec![l[2 * w + 1].clone(); n_group]);
    }
    let repeat: Vec<u32> = (0..n as u32).flat_map(|w| std::iter::repeat_n(w, n_group)).collect();
    cache.reorder(&repeat)?;

    // live windows, in cache row order (n_group rows each)
    let mut live: Vec<usize> = (0..n).collect();
    loop {
        let mut keep: Vec<u32> = Vec::with_capacity(live.len() * n_group);
        let mut still: Vec<usize> = Vec::with_capacity(live.len());
        // the live windows' steps (independent searches) spread over the kernel pool
        let mut steps: Vec<StepJob<'_, '_>> = searches
            .iter_mut()
            .zip(rows_of_window.iter_mut())
            .enumerate()
            .filter(|(w, _)| live.contains(w))
            .map(|(_, (s, rows))| (s, rows, None))
            .collect();
        if live.len() * n_group >= 16 {
            sapient_tensor::kernels::pool::pool().for_each_chunk_mut(&mut steps, 1, |_, part| advance_all(part));
        } else {
            // a row per window (greedy): less work than a hand-off to the pool is worth
            advance_all(&mut steps);
        }
        let steps: Vec<Step> = steps.into_iter().map(|(_, _, step)| step.unwrap_or(Step::Done)).collect();
        for ((slot, &w), step) in live.iter().enumerate().zip(steps) {
            let base = (slot * n_group) as u32;
            match step {
                Step::Done => continue,
                Step::Reorder(sources) => keep.extend(sources.iter().map(|&r| base + r)),
                Step::Continue => keep.extend(base..base + n_group as u32),
            }
            still.push(w);
        }
        if still.is_empty() {
            break;
        }
        cache.reorder(&keep)?;
        live = still;
        let tokens: Vec<u32> = live.iter().flat_map(|&w| searches[w].last_tokens()).collect();
        let groups: Vec<(&CrossKv, usize)> = live.iter().map(|&w| (crosses[w], n_group)).collect();
        let rows = tokens.len();
        let h = model.decode_groups(&tokens, rows, 1, &groups, &mut cache)?.reshape((rows, d))?;
        // the live windows' row buffers take the new logits (no fresh allocations per step)
        let mut l: Vec<Vec<f32>> = live.iter().flat_map(|&w| std::mem::take(&mut rows_of_window[w])).collect();
        model.logits_rows_into(&h, &mut l)?;
        let mut it = l.into_iter();
        for &w in &live {
            rows_of_window[w] = it.by_ref().take(n_group).collect();
        }
    }
    searches.into_iter().map(|s| s.finish(tok)).collect()
}

/// One window's search, its logits rows and what its step gives.
type StepJob<'s, 'a> = (&'s mut Search<'a>, &'s mut Vec<Vec<f32>>, Option<Step>);

fn advance_all(jobs: &mut [StepJob<'_, '_>]) {
    for (s, rows, step) in jobs.iter_mut() {
        *step = Some(s.advance(rows));
    }
}

/// What a decoding step leaves the caller to do before the next forward.
enum Step {
    /// The search is over.
    Done,
    /// Next forward with the cache rows as they are.
    Continue,
    /// Reorder the group's cache rows first (beam search): row `i` becomes old row `sources[i]`.
    Reorder(Vec<u32>),
}

/// The search over one window: greedy, sampled (best of) or beam search, fed one step of
/// logits at a time (one row per member of the group).
struct Search<'a> {
    opts: &'a DecodeOptions,
    filters: Filters,
    beam: Option<usize>,
    n_group: usize,
    n_ctx: usize,
    sample_begin: usize,
    sample_len: usize,
    eot: u32,
    seqs: Vec<Vec<u32>>,
    sum_logprobs: Vec<f32>,
    finished: Vec<(Vec<u32>, f32)>,
    max_candidates: usize,
    rng: Rng,
    scratch: Vec<u32>,
    step: usize,
    no_speech_prob: f32,
}

impl<'a> Search<'a> {
    /// The search, the initial tokens and the index of the start-of-transcript among them.
    fn new(model: &Whisper, tok: &WhisperTokenizer, opts: &'a DecodeOptions) -> Result<(Self, Vec<u32>, usize)> {
        let n_ctx = model.config.max_target_positions;
        let (initial, sot_index) = initial_tokens(model, tok, opts)?;
        let sample_begin = initial.len();
        let sample_len = opts.sample_len.unwrap_or(n_ctx / 2);
        if sample_begin >= n_ctx {
            return Err(Error::Options(format!("{sample_begin} initial tokens leave no room in {n_ctx}")));
        }
        let beam = if opts.temperature == 0.0 { opts.beam_size.filter(|&b| b > 1) } else { None };
        if opts.beam_size == Some(0) || opts.best_of == Some(0) {
            return Err(Error::Options("beam_size and best_of must be at least 1".into()));
        }
        if opts.temperature.is_nan() || opts.temperature < 0.0 {
            return Err(Error::Options(format!("temperature {} must be >= 0", opts.temperature)));
        }
        let n_group = match beam {
            Some(b) => b,
            None if opts.temperature > 0.0 => opts.best_of.unwrap_or(1),
            None => 1,
        };
        let filters = Filters::new(model, tok, opts, sample_begin)?;
        let max_candidates = beam.map(|b| ((b as f32 * opts.patience).round() as usize).max(1)).unwrap_or(0);
        let search = Self {
            opts,
            filters,
            beam,
            n_group,
            n_ctx,
            sample_begin,
            sample_len,
            eot: tok.eot,
            seqs: vec![initial.clone(); n_group],
            sum_logprobs: vec![0f32; n_group],
            finished: Vec::new(),
            max_candidates,
            rng: Rng(opts.seed ^ 0x5EED),
            scratch: Vec::new(),
            step: 0,
            no_speech_prob: f32::NAN,
        };
        Ok((search, initial, sot_index))
    }

    /// The last token of each member of the group (the next forward's input).
    fn last_tokens(&self) -> Vec<u32> {
        self.seqs.iter().map(|s| *s.last().unwrap_or(&self.eot)).collect()
    }

    /// One step: filter the group's logits rows, pick the next tokens.
    fn advance(&mut self, logits_rows: &mut [Vec<f32>]) -> Step {
        let (eot, sample_begin, opts) = (self.eot, self.sample_begin, self.opts);
        let step = self.step;
        self.step += 1;
        for (row, seq) in logits_rows.iter_mut().zip(&self.seqs) {
            self.filters.apply(row, seq);
        }
        let completed;
        let mut reorder = None;
        if let Some(beam_size) = self.beam {
            // candidates: each beam's top beam_size + 1 continuations
            let mut scores: HashMap<Vec<u32>, (f32, usize)> = HashMap::new();
            for (j, row) in logits_rows.iter().enumerate() {
                let lse = logsumexp(row);
                for t in top_k(row, beam_size + 1) {
                    if row[t] == f32::NEG_INFINITY {
                        continue;
                    }
                    let mut s = self.seqs[j].clone();
                    s.push(t as u32);
                    scores.insert(s, (self.sum_logprobs[j] + (row[t] - lse), j));
                }
            }
            let mut ranked: Vec<(Vec<u32>, (f32, usize))> = scores.into_iter().collect();
            ranked.sort_by(|a, b| b.1 .0.total_cmp(&a.1 .0).then_with(|| a.0.cmp(&b.0)));
            let mut next = Vec::new();
            let mut sources = Vec::new();
            let mut next_lp = Vec::new();
            let mut newly_finished = Vec::new();
            for (s, (score, src)) in ranked {
                if s.last() == Some(&eot) {
                    newly_finished.push((s, score));
                } else {
                    next.push(s);
                    sources.push(src as u32);
                    next_lp.push(score);
                    if next.len() == beam_size {
                        break;
                    }
                }
            }
            for f in newly_finished {
                if self.finished.len() >= self.max_candidates {
                    break;
                }
                self.finished.push(f);
            }
            completed = self.finished.len() >= self.max_candidates || next.is_empty();
            if next.is_empty() {
                return Step::Done;
            }
            while next.len() < beam_size {
                // fewer live candidates than beams (tiny vocabularies only): repeat the best
                next.push(next[0].clone());
                sources.push(sources[0]);
                next_lp.push(next_lp[0]);
            }
            self.seqs = next;
            self.sum_logprobs = next_lp;
            if self.seqs.iter().all(|s| is_looping(&s[sample_begin..], eot, &mut self.scratch)) {
                // every live beam says the same thing over and over: a failed decode
                return Step::Done;
            }
            reorder = Some(sources);
        } else {
            for (j, row) in logits_rows.iter().enumerate() {
                let seq = &mut self.seqs[j];
                let last = *seq.last().unwrap_or(&eot);
                if last == eot && seq.len() > sample_begin {
                    seq.push(eot);
                    continue;
                }
                let lse = logsumexp(row);
                let t = if opts.temperature > 0.0 {
                    // softmax(row / T) without materialising it: the normaliser, then a scan
                    let inv_t = 1.0 / opts.temperature;
                    let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let w = |v: f32| ((v - m) * inv_t).exp();
                    let z: f64 = row.chunks(1024).map(|c| c.iter().map(|&v| w(v)).sum::<f32>() as f64).sum();
                    let mut u = self.rng.next_f64() * z;
                    let mut pick = row.iter().rposition(|&v| v > f32::NEG_INFINITY).unwrap_or(0);
                    for (i, &v) in row.iter().enumerate() {
                        let pi = w(v) as f64;
                        if u < pi {
                            pick = i;
                            break;
                        }
                        u -= pi;
                    }
                    pick
                } else {
                    // the first of the largest (token 0 where every logit is -inf or NaN,
                    // which the filters never leave)
                    first_max(row)
                };
                self.sum_logprobs[j] += row[t] - lse;
                seq.push(t as u32);
                if (t as u32) < eot && is_looping(&seq[sample_begin..], eot, &mut self.scratch) {
                    // stopped here: the loop would run to the token limit
                    seq.push(eot);
                }
            }
            completed = self.seqs.iter().all(|s| s.last() == Some(&eot));
        }
        if completed || self.seqs[0].len() >= self.n_ctx || step + 1 == self.sample_len {
            return Step::Done;
        }
        match reorder {
            Some(sources) => Step::Reorder(sources),
            None => Step::Continue,
        }
    }

    /// The best candidate as the window's result.
    fn finish(self, tok: &WhisperTokenizer) -> Result<DecodeResult> {
        let (eot, sample_begin, opts, n_group) = (self.eot, self.sample_begin, self.opts, self.n_group);
        let mut scratch = self.scratch;
        // candidates: finished ones for beam search (topped up by the live beams), else the group
        let mut candidates: Vec<(Vec<u32>, f32)> = if self.beam.is_some() {
            let mut c = self.finished;
            if c.len() < n_group {
                let mut live: Vec<(Vec<u32>, f32)> = self.seqs.into_iter().zip(self.sum_logprobs).collect();
                live.sort_by(|a, b| b.1.total_cmp(&a.1));
                for s in live {
                    if c.len() >= n_group {
                        break;
                    }
                    c.push(s);
                }
            }
            c
        } else {
            self.seqs.into_iter().zip(self.sum_logprobs).collect()
        };
        for c in candidates.iter_mut() {
            let s = &c.0[sample_begin.min(c.0.len())..];
            let end = s.iter().position(|&t| t == eot).unwrap_or(s.len());
            c.0 = s[..end].to_vec();
        }
        let score = |toks: &[u32], lp: f32| -> f32 {
            let len = toks.len() as f32;
            let penalty = match opts.length_penalty {
                None => len,
                Some(a) => ((5.0 + len) / 6.0).powf(a),
            };
            lp / penalty.max(f32::MIN_POSITIVE)
        };
        if tracing::enabled!(tracing::Level::TRACE) {
            // the final ranking (near ties decide words such as "ill-disposed" against
            // "old-sposed")
            for (toks, lp) in &candidates {
                let text = tok.decode_text(toks).unwrap_or_default();
                tracing::trace!(score = score(toks, *lp), sum_logprob = lp, len = toks.len(), text, "candidate");
            }
        }
        // a looping candidate only when every candidate loops
        let looping: Vec<bool> = candidates.iter().map(|c| is_looping(&c.0, eot, &mut scratch)).collect();
        let all_loop = looping.iter().all(|&l| l);
        let best = candidates
            .iter()
            .enumerate()
            .filter(|(i, _)| all_loop || !looping[*i])
            .max_by(|a, b| score(&a.1 .0, a.1 .1).total_cmp(&score(&b.1 .0, b.1 .1)).then(b.0.cmp(&a.0)))
            .map(|(i, _)| i)
            .ok_or_else(|| Error::Options("decoding produced no candidate".into()))?;
        let looped = looping[best];
        let (tokens, sum_lp) = candidates.swap_remove(best);
        let text = tok.decode_text(&tokens)?.trim().to_string();
        let avg_logprob = sum_lp / (tokens.len() as f32 + 1.0);
        Ok(DecodeResult {
            compression_ratio: compression_ratio(&text),
            tokens,
            text,
            avg_logprob,
            no_speech_prob: self.no_speech_prob,
            temperature: opts.temperature,
            looped,
        })
    }
}

/// The index of the first largest value of `row` (0 where every value is `-inf` or NaN: NaN
/// compares false and is never taken).
fn first_max(row: &[f32]) -> usize {
    let mut best = (0, f32::NEG_INFINITY);
    for (i, &v) in row.iter().enumerate() {
        if v > best.1 {
            best = (i, v);
        }
    }
    best.0
}

#[cfg(test)]
mod tests {
    use super::{logsumexp, loop_start, max_value};
    use crate::decoder::lane_sum;

    #[test]
    fn vocabulary_passes_match_the_scalar_definitions() {
        for n in [0usize, 1, 15, 16, 17, 33, 1000, 51_864] {
            // values with repeats (ties), -inf for suppressed tokens
            let x: Vec<f32> = (0..n).map(|i| if i % 7 == 3 { f32::NEG_INFINITY } else { ((i * 7919 % 1013) as f32 - 500.0) * 0.03 }).collect();
            let want_max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(max_value(&x).to_bits(), want_max.to_bits(), "n={n}");
            let finite: Vec<f32> = x.iter().map(|v| v.max(-1.0)).collect();
            let want_sum: f64 = finite.iter().map(|&v| v as f64).sum();
            let scale = finite.iter().map(|v| v.abs() as f64).sum::<f64>().max(1.0);
            assert!((lane_sum(&finite, |v| v) as f64 - want_sum).abs() <= 1e-5 * scale, "n={n}");
            if n > 0 {
                let lse = x.iter().map(|&v| ((v - want_max) as f64).exp()).sum::<f64>().ln() + want_max as f64;
                assert!((logsumexp(&x) as f64 - lse).abs() <= 1e-5 * lse.abs().max(1.0), "n={n}: {} {lse}", logsumexp(&x));
            }
        }
        assert_eq!(max_value(&[f32::NEG_INFINITY; 20]), f32::NEG_INFINITY);
    }

    #[test]
    fn loops_are_found_at_the_end_only() {
        // a 9-token sentence said three times after 5 other tokens: the loop starts at the
        // second saying
        let sentence: Vec<u32> = (100..109).collect();
        let mut t: Vec<u32> = (1..=5).collect();
        for _ in 0..3 {
            t.extend(&sentence);
        }
        assert_eq!(loop_start(&t), Some(5 + 9));
        // twice is not yet a loop (and a different last token ends it)
        assert_eq!(loop_start(&t[..5 + 18]), None);
        t.push(7);
        assert_eq!(loop_start(&t), None);
        // short blocks need eight repetitions: "no, no, no" is speech
        let no: Vec<u32> = [1u32, 2].repeat(7);
        assert_eq!(loop_start(&no), None);
        let mut many = vec![9u32, 9, 9];
        many.extend([1u32, 2].repeat(12));
        assert_eq!(loop_start(&many), Some(5));
        // one token over and over
        assert_eq!(loop_start(&[4u32; 30]), Some(1));
        // spans under 24 tokens are never loops
        assert_eq!(loop_start(&[5u32, 6, 7, 8, 9, 10, 11].repeat(3)), None);
        assert_eq!(loop_start(&[]), None);
    }
}

