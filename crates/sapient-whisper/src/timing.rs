//! Word-level timestamps as openai-whisper's `timing.py`: the decoder is run once more over
//! a window's text tokens, the cross-attention scores of the alignment heads are softmaxed
//! over the audio frames, standardised per head, median-filtered along time and averaged;
//! dynamic time warping of the negated matrix aligns tokens to 20 ms frames, and words start
//! where their first token's path enters a new row.

use crate::model::{CrossKv, KvCache, Whisper};
use crate::tokenizer::WhisperTokenizer;
use crate::Result;
use candle_core::Tensor;

/// A word with its time span (seconds from the start of the audio).
#[derive(Clone, Debug, PartialEq)]
pub struct Word {
    /// The text, with its leading space and merged punctuation.
    pub word: String,
    pub start: f64,
    pub end: f64,
    /// Mean probability of the word's tokens.
    pub probability: f32,
    pub tokens: Vec<u32>,
}

/// Encoder positions per second (1500 per 30 s).
const TOKENS_PER_SECOND: f64 = 50.0;
const MEDFILT_WIDTH: usize = 7;
const PREPEND_PUNCTUATIONS: &str = "\"'“¿([{-";
const APPEND_PUNCTUATIONS: &str = "\"'.。,，!！?？:：”)]}、";

/// Dynamic time warping of a cost matrix [n, m] (row-major); returns the path as
/// (text index, time index) pairs from (0, 0) to (n - 1, m - 1).
pub fn dtw(x: &[f32], n: usize, m: usize) -> Vec<(usize, usize)> {
    let inf = f32::INFINITY;
    let w = m + 1;
    let mut cost = vec![inf; (n + 1) * w];
    let mut trace = vec![-1i8; (n + 1) * w];
    cost[0] = 0.0;
    for j in 1..=m {
        for i in 1..=n {
            let c0 = cost[(i - 1) * w + j - 1];
            let c1 = cost[(i - 1) * w + j];
            let c2 = cost[i * w + j - 1];
            let (c, t) = if c0 < c1 && c0 < c2 {
                (c0, 0)
            } else if c1 < c0 && c1 < c2 {
                (c1, 1)
            } else {
                (c2, 2)
            };
            cost[i * w + j] = x[(i - 1) * m + j - 1] + c;
            trace[i * w + j] = t;
        }
    }
    trace[..=m].fill(2);
    for i in 0..=n {
        trace[i * w] = 1;
    }
    let (mut i, mut j) = (n, m);
    let mut path = Vec::new();
    while i > 0 || j > 0 {
        path.push((i.saturating_sub(1), j.saturating_sub(1)));
        match trace[i * w + j] {
            0 => {
                i -= 1;
                j -= 1;
            }
            1 => i -= 1,
            _ => j -= 1,
        }
    }
    path.reverse();
    path
}

/// Median filter of width `w` (odd) along rows of [rows, cols], reflect padding as scipy/torch.
fn median_filter(x: &mut [f32], rows: usize, cols: usize, w: usize) {
    if cols <= w / 2 {
        return;
    }
    let p = w / 2;
    let mut buf = vec![0f32; w];
    let mut padded = vec![0f32; cols + 2 * p];
    for r in 0..rows {
        let row = &mut x[r * cols..(r + 1) * cols];
        for (k, slot) in padded.iter_mut().enumerate() {
            let idx = k as isize - p as isize;
            let idx = if idx < 0 { -idx } else if idx >= cols as isize { 2 * (cols as isize - 1) - idx } else { idx };
            *slot = row[idx as usize];
        }
        for c in 0..cols {
            buf.copy_from_slice(&padded[c..c + w]);
            buf.sort_by(|a, b| a.total_cmp(b));
            row[c] = buf[p];
        }
    }
}

/// Split text tokens into words (tokens grouped; a new word at a leading space, punctuation
/// or a special token), as openai-whisper's `split_tokens_on_spaces`.
pub fn split_words(tok: &WhisperTokenizer, tokens: &[u32]) -> Result<(Vec<String>, Vec<Vec<u32>>)> {
    // first on unicode boundaries: tokens until the text decodes without a replacement char
    let mut subwords = Vec::new();
    let mut subword_tokens = Vec::new();
    let mut cur = Vec::new();
    for &t in tokens {
        cur.push(t);
        let text = if t >= tok.eot { String::new() } else { tok.inner().decode(&cur, false)? };
        if !text.contains('\u{fffd}') || t >= tok.eot {
            subwords.push(text);
            subword_tokens.push(std::mem::take(&mut cur));
        }
    }
    let mut words: Vec<String> = Vec::new();
    let mut word_tokens: Vec<Vec<u32>> = Vec::new();
    for (sw, st) in subwords.into_iter().zip(subword_tokens) {
        let special = st[0] >= tok.eot;
        let with_space = sw.starts_with(' ');
        let trimmed = sw.trim();
        let punctuation = !trimmed.is_empty() && trimmed.chars().all(|c| c.is_ascii_punctuation());
        if special || with_space || punctuation || words.is_empty() {
            words.push(sw);
            word_tokens.push(st);
        } else if let (Some(w), Some(wt)) = (words.last_mut(), word_tokens.last_mut()) {
            w.push_str(&sw);
            wt.extend(st);
        }
    }
    Ok((words, word_tokens))
}

/// Word timings of `text_tokens` (text only, no timestamps) decoded from a window whose
/// cross-attention keys/values are `cross` and which holds `num_frames` mel frames of audio.
/// Times are relative to the window. The initial tokens are `sot_sequence` (start of
/// transcript, language, task).
pub fn find_alignment(
    model: &Whisper,
    tok: &WhisperTokenizer,
    cross: &CrossKv,
    sot_sequence: &[u32],
    text_tokens: &[u32],
    num_frames: usize,
) -> Result<Vec<Word>> {
    if text_tokens.is_empty() || model.config.alignment_heads.is_empty() {
        return Ok(Vec::new());
    }
    let mut tokens: Vec<u32> = sot_sequence.to_vec();
    tokens.push(tok.no_timestamps);
    tokens.extend_from_slice(text_tokens);
    tokens.push(tok.eot);
    let mut cache = KvCache::new();
    let mut al = Vec::new();
    let x = Tensor::new(tokens.as_slice(), model.device())?.unsqueeze(0)?;
    let h = model.decode(&x, cross, &mut cache, Some(&mut al))?.squeeze(0)?;
    // probabilities of the text tokens
    let start = sot_sequence.len();
    let logits: Vec<Vec<f32>> = model.logits(&h.narrow(0, start, text_tokens.len())?)?.to_vec2()?;
    let eot = tok.eot as usize;
    let probs: Vec<f32> = logits
        .iter()
        .zip(text_tokens)
        .map(|(row, &t)| {
            let row = &row[..eot];
            let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let s: f32 = row.iter().map(|v| (v - m).exp()).sum();
            ((row[t as usize] - m).exp()) / s
        })
        .collect();
    // alignment matrix: [tokens, frames/2], averaged over heads
    let n_tok = tokens.len();
    let frames = (num_frames / 2).clamp(1, model.config.max_source_positions);
    let mut matrix = vec![0f32; n_tok * frames];
    for w in &al {
        let w = w.squeeze(0)?.narrow(1, 0, frames)?;
        let w = candle_nn::ops::softmax_last_dim(&w.contiguous()?)?;
        let mut v: Vec<f32> = w.flatten_all()?.to_vec1()?;
        // standardise each frame column over the tokens
        for c in 0..frames {
            let col: Vec<f32> = (0..n_tok).map(|r| v[r * frames + c]).collect();
            let mean = col.iter().sum::<f32>() / n_tok as f32;
            let var = col.iter().map(|x| (x - mean) * (x - mean)).sum::<f32>() / n_tok as f32;
            let std = var.sqrt().max(1e-10);
            for r in 0..n_tok {
                v[r * frames + c] = (v[r * frames + c] - mean) / std;
            }
        }
        median_filter(&mut v, n_tok, frames, MEDFILT_WIDTH);
        for (m, x) in matrix.iter_mut().zip(&v) {
            *m += x / al.len() as f32;
        }
    }
    // rows of the text tokens and the end of text: [start, n_tok - 1)
    let rows = n_tok - 1 - start;
    let cost: Vec<f32> = matrix[start * frames..(n_tok - 1) * frames].iter().map(|x| -x).collect();
    let path = dtw(&cost, rows, frames);
    let mut with_eot: Vec<u32> = text_tokens.to_vec();
    with_eot.push(tok.eot);
    let (words, word_tokens) = split_words(tok, &with_eot)?;
    if word_tokens.len() <= 1 {
        return Ok(Vec::new());
    }
    // times where the path enters a new text row
    let mut jump_times = Vec::new();
    let mut prev_row = None;
    for &(r, t) in &path {
        if prev_row != Some(r) {
            jump_times.push(t as f64 / TOKENS_PER_SECOND);
            prev_row = Some(r);
        }
    }
    let mut boundaries = vec![0usize];
    for wt in &word_tokens[..word_tokens.len() - 1] {
        boundaries.push(boundaries.last().copied().unwrap_or(0) + wt.len());
    }
    let mut out = Vec::new();
    let mut tok_i = 0;
    for (k, (word, wt)) in words.iter().zip(&word_tokens).enumerate().take(word_tokens.len() - 1) {
        let s = jump_times.get(boundaries[k]).copied().unwrap_or(0.0);
        let e = jump_times.get(boundaries[k + 1]).copied().unwrap_or(s);
        let p: f32 = wt.iter().enumerate().map(|(i, _)| probs.get(tok_i + i).copied().unwrap_or(0.0)).sum::<f32>() / wt.len() as f32;
        tok_i += wt.len();
        out.push(Word { word: word.clone(), start: s, end: e, probability: p, tokens: wt.clone() });
    }
    Ok(out)
}

/// Attach opening punctuation to the next word and closing punctuation to the previous one
/// (the absorbed entries are left with no text and no tokens; times are not changed), as
/// openai-whisper's `merge_punctuations`.
pub fn merge_punctuations(words: &mut [Word]) {
    if words.len() < 2 {
        return;
    }
    let (mut i, mut j) = (words.len() as isize - 2, words.len() - 1);
    while i >= 0 {
        let iu = i as usize;
        let prev = words[iu].word.clone();
        if prev.starts_with(' ') && PREPEND_PUNCTUATIONS.contains(prev.trim()) {
            let toks = std::mem::take(&mut words[iu].tokens);
            words[j].word = prev + &words[j].word;
            words[j].tokens.splice(0..0, toks);
            words[iu].word.clear();
        } else {
            j = iu;
        }
        i -= 1;
    }
    let (mut i, mut j) = (0usize, 1usize);
    while j < words.len() {
        let next = words[j].word.clone();
        if !words[i].word.ends_with(' ') && APPEND_PUNCTUATIONS.contains(next.as_str()) {
            let toks = std::mem::take(&mut words[j].tokens);
            words[i].word.push_str(&next);
            words[i].tokens.extend(toks);
            words[j].word.clear();
        } else {
            i = j;
        }
        j += 1;
    }
}

/// openai-whisper's clean-up of implausibly long words at sentence boundaries, given the
/// median word duration.
pub fn truncate_long_words(words: &mut [Word]) -> (f64, f64) {
    let mut d: Vec<f64> = words.iter().map(|w| w.end - w.start).filter(|&d| d > 0.0).collect();
    if d.is_empty() {
        return (0.0, 0.0);
    }
    d.sort_by(|a, b| a.total_cmp(b));
    let median = if d.len() % 2 == 1 { d[d.len() / 2] } else { (d[d.len() / 2 - 1] + d[d.len() / 2]) / 2.0 };
    let median = median.min(0.7);
    let max_duration = median * 2.0;
    let ends = ".。!！?？";
    for i in 1..words.len() {
        if words[i].end - words[i].start > max_duration {
            if ends.contains(words[i].word.as_str()) {
                words[i].end = words[i].start + max_duration;
            } else if ends.contains(words[i - 1].word.as_str()) {
                words[i].start = words[i].end - max_duration;
            }
        }
    }
    (median, max_duration)
}
