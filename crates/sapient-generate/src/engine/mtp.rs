//! MTP speculation: a hybrid model's own multi-token-prediction head drafts the guesses
//! (`sapient_llama`'s `model/mtp.rs`), the step's forward verifies them, and the recurrent
//! state rolls back to the last accepted token ([`KvCache::rollback_state`]).
//!
//! The head's cache holds one position per token, as the main model's: position `q` was
//! computed from token `q` and the main model's output-normed hidden state at `q - 1`. Each
//! step's forward keeps every row's hidden state; a sequence keeps those of the positions it
//! kept ([`record_hidden`]) until the head catches up. To draft, the head first takes the
//! positions since its last catch-up up to the newest token (one batched forward over every
//! speculating sequence; its logits at the newest token give the first guess), then each
//! further guess from the previous guess and the head's own hidden state. Only the positions
//! computed from the main model's states stay in its cache: the guesses' are cut before the
//! next catch-up. Positions whose hidden states the sequence never saw (a prefix taken from
//! the prefix cache, a session's kept tokens) take zeros: the guesses get worse there, never
//! the output.

use super::Active;
use crate::model::Model;
use sapient_llama::{BatchSeq, KvCache, Logits};
use std::time::Instant;

/// Most guesses the head drafts per step (the request's [`SpecConfig`](crate::speculative::SpecConfig)
/// `k` is capped at it): one head trained to guess one token ahead degrades fast when it
/// drafts on its own guesses, and a verification step of at most this plus one rows keeps
/// the recurrent state of each row for the rollback (longer steps take the chunked form).
pub const MTP_MAX_DRAFTS: usize = 3;

/// The MTP head's cache and buffers in an engine whose model has one.
pub(super) struct MtpDraft {
    pub(super) kv: KvCache,
    logits: Vec<f32>,
    /// The hidden rows of the head's next forward.
    input: Vec<f32>,
    /// The model's hidden size.
    pub(super) hidden_size: usize,
}

impl MtpDraft {
    pub(super) fn new(kv: KvCache, hidden_size: usize) -> Self {
        Self { kv, logits: Vec::new(), input: Vec::new(), hidden_size }
    }

    /// Every decoding sequence of `running` that asks for speculation
    /// ([`GenerationConfig::draft`](crate::GenerationConfig::draft)) gets up to
    /// [`MTP_MAX_DRAFTS`] guesses after its newest token, to be verified by this step's
    /// forward (see the module docs). A failed head forward only costs the guesses.
    pub(super) fn propose(&mut self, model: &Model, running: &mut [Active], eos: &[u32], max_seq: usize) {
        let want: Vec<(usize, usize)> = running
            .iter()
            .enumerate()
            .filter(|(_, a)| a.drafts == 0 && a.computed >= a.dec.prompt_len() && a.kv_tokens.len() == a.computed + 1)
            .map(|(i, a)| (i, a.dec.draft_wanted(max_seq.saturating_sub(a.computed + 1)).min(MTP_MAX_DRAFTS)))
            .filter(|&(_, k)| k > 0)
            .collect();
        if want.is_empty() {
            return;
        }
        let Ok(mut inner) = model.lock_inner() else { return };
        let (vocab, h) = (model.info().vocab_size, self.hidden_size);
        let started = Instant::now();
        // Catch up: each sequence's positions since the last catch-up, to its newest token.
        let mut feeds: Vec<Vec<u32>> = Vec::with_capacity(want.len());
        self.input.clear();
        for &(i, _) in &want {
            let a = &mut running[i];
            a.draft_computed = a.draft_computed.min(a.computed);
            let seq = *a.draft_seq.get_or_insert_with(|| self.kv.new_seq());
            if self.kv.truncate(seq, a.draft_computed).is_err() {
                let _ = self.kv.free(seq);
                a.draft_seq = Some(self.kv.new_seq());
                a.draft_computed = 0;
            }
            for q in a.draft_computed..=a.computed {
                match q.checked_sub(1).and_then(|p| p.checked_sub(a.mtp_h0)).filter(|&r| (r + 1) * h <= a.mtp_h.len()) {
                    Some(r) => self.input.extend_from_slice(&a.mtp_h[r * h..(r + 1) * h]),
                    None => self.input.resize(self.input.len() + h, 0.0),
                }
            }
            feeds.push(a.kv_tokens[a.draft_computed..=a.computed].to_vec());
        }
        let mut guesses: Vec<Vec<u32>> = vec![Vec::new(); want.len()];
        let mut live: Vec<usize> = (0..want.len()).collect();
        let mut ok = true;
        while !live.is_empty() {
            let batch: Vec<BatchSeq<'_>> = live
                .iter()
                .zip(&feeds)
                .filter_map(|(&w, f)| Some(BatchSeq { seq: running[want[w].0].draft_seq?, tokens: f, logits: Some(Logits::Last) }))
                .collect();
            let rows: usize = feeds.iter().map(Vec::len).sum();
            if let Err(e) = inner.model.mtp_forward(&mut self.kv, &batch, &self.input, &mut self.logits) {
                tracing::debug!("MTP forward failed, no guesses this step: {e}");
                ok = false;
                break;
            }
            // Each sequence's last row: its guess, and the hidden state its next guess takes.
            let hid = inner.model.mtp_hidden(rows).unwrap_or(&[]);
            self.input.clear();
            let (mut next, mut end) = (Vec::new(), 0);
            for (row, &w) in live.iter().enumerate() {
                end += feeds[row].len();
                let logits = &self.logits[row * vocab..(row + 1) * vocab];
                // No guess from logits with nothing finite.
                let Ok(best) = sapient_sample::argmax(logits) else { continue };
                guesses[w].push(best);
                // Nothing after an end of sequence.
                if guesses[w].len() < want[w].1 && !eos.contains(&best) {
                    next.push(w);
                    self.input.extend_from_slice(hid.get((end - 1) * h..end * h).unwrap_or(&[]));
                }
            }
            live = next;
            feeds = live.iter().map(|&w| guesses[w].last().map_or_else(Vec::new, |&g| vec![g])).collect();
        }
        let took = started.elapsed();
        for (w, &(i, _)) in want.iter().enumerate() {
            let a = &mut running[i];
            if !ok {
                if let Some(seq) = a.draft_seq.take() {
                    let _ = self.kv.free(seq);
                }
                a.draft_computed = 0;
                continue;
            }
            // The head keeps the positions computed from the main model's states; the hidden
            // states before the newest token are no longer needed.
            a.draft_computed = a.computed + 1;
            a.mtp_h.clear();
            a.mtp_h0 = a.computed;
            a.drafts = guesses[w].len();
            a.kv_tokens.extend_from_slice(&guesses[w]);
            a.dec.stats.draft_time += took / want.len() as u32;
        }
    }
}

/// After a step: `a` kept positions `start..end` of its rows, whose output-normed hidden
/// states are `rows` (`hidden` values each, from position `start` on); keep them for the
/// MTP head's next catch-up (a gap before them, from the prefix cache, starts afresh).
pub(super) fn record_hidden(a: &mut Active, start: usize, end: usize, rows: &[f32], hidden: usize) {
    if end <= start {
        return;
    }
    if a.mtp_h0 + a.mtp_h.len() / hidden != start {
        a.mtp_h.clear();
        a.mtp_h0 = start;
    }
    a.mtp_h.extend_from_slice(rows.get(..(end - start) * hidden).unwrap_or(&[]));
}
