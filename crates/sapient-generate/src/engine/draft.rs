//! Draft-model speculation ([`super::Engine::with_draft`]): the draft's own cache, and its
//! guesses appended to the decoding sequences before a step's forward (which verifies them).

use super::Active;
use crate::model::Model;
use sapient_llama::{BatchSeq, KvCache, Logits};
use std::time::Instant;

/// The draft model of [`Engine::with_draft`](super::Engine::with_draft), with its own cache.
pub(super) struct Draft {
    pub(super) model: Model,
    pub(super) kv: KvCache,
    pub(super) logits: Vec<f32>,
}

impl Draft {
    /// Draft-model speculation: every decoding sequence of `running` whose request asks for
    /// it ([`GenerationConfig::draft`](crate::GenerationConfig::draft)) gets up to K guesses
    /// appended after its newest token, to be verified by this step's forward. The draft
    /// first catches up with what the sequence holds (its prompt, then the tokens accepted
    /// since), then proposes its greedy choice one token at a time, each a batched forward
    /// over all those sequences. A failed draft forward (e.g. its cache full) only costs the
    /// guesses: those sequences decode plainly. `target_vocab`: the target model's
    /// vocabulary (no guess outside it); `max_seq`: its context length.
    pub(super) fn propose(&mut self, running: &mut [Active], eos: &[u32], target_vocab: usize, max_seq: usize) {
        let want: Vec<(usize, usize)> = running
            .iter()
            .enumerate()
            .filter(|(_, a)| a.drafts == 0 && a.computed >= a.dec.prompt_len() && a.kv_tokens.len() == a.computed + 1)
            .map(|(i, a)| (i, a.dec.draft_wanted(max_seq.saturating_sub(a.computed + 1))))
            .filter(|&(_, k)| k > 0)
            .collect();
        if want.is_empty() {
            return;
        }
        let Ok(mut inner) = self.model.lock_inner() else { return };
        let vocab = self.model.info().vocab_size;
        for &(i, _) in &want {
            let a = &mut running[i];
            // At least the newest token is fed, so that its logits give the first guess.
            a.draft_computed = a.draft_computed.min(a.kv_tokens.len() - 1);
            let seq = *a.draft_seq.get_or_insert_with(|| self.kv.new_seq());
            if self.kv.truncate(seq, a.draft_computed).is_err() {
                let _ = self.kv.free(seq);
                a.draft_seq = Some(self.kv.new_seq());
                a.draft_computed = 0;
            }
        }
        let started = Instant::now();
        // Logits of the frequent ids only (`SpecConfig::draft_vocab`, the largest the
        // requests ask for), the end-of-sequence ids and the rarer ones their text holds.
        let first = want.iter().try_fold(0usize, |m, &(i, _)| running[i].dec.draft_vocab().map(|v| m.max(v)));
        let restricted = match first {
            Some(first) if first < vocab => {
                let mut extra: Vec<u32> = eos.to_vec();
                for &(i, _) in &want {
                    extra.extend(running[i].kv_tokens.iter().filter(|&&t| t as usize >= first));
                }
                extra.sort_unstable();
                extra.dedup();
                inner.model.restrict_logits(Some((first, &extra))).unwrap_or(false)
            }
            _ => false,
        };
        let mut guesses: Vec<Vec<u32>> = vec![Vec::new(); want.len()];
        let mut live: Vec<usize> = (0..want.len()).collect();
        let mut feeds: Vec<Vec<u32>> = Vec::new();
        while !live.is_empty() {
            feeds.clear();
            for &w in &live {
                let a = &running[want[w].0];
                feeds.push(match guesses[w].last() {
                    Some(&g) => vec![g],
                    None => a.kv_tokens[a.draft_computed..].to_vec(),
                });
            }
            let batch: Vec<BatchSeq<'_>> = live
                .iter()
                .zip(&feeds)
                .filter_map(|(&w, f)| Some(BatchSeq { seq: running[want[w].0].draft_seq?, tokens: f, logits: Some(Logits::Last) }))
                .collect();
            let result = inner.model.forward_batch(&mut self.kv, &batch, &mut self.logits);
            if let Err(e) = result {
                if restricted {
                    let _ = inner.model.restrict_logits(None);
                }
                // The cache lengths of this batch are unknown: start those sequences afresh.
                tracing::debug!("draft forward failed, no guesses this step: {e}");
                for &(i, _) in &want {
                    let a = &mut running[i];
                    if let Some(seq) = a.draft_seq.take() {
                        let _ = self.kv.free(seq);
                    }
                    a.draft_computed = 0;
                }
                return;
            }
            for (row, &w) in live.iter().enumerate() {
                let logits = &self.logits[row * vocab..(row + 1) * vocab];
                running[want[w].0].draft_computed += feeds[row].len();
                // No guess from logits with nothing finite, nor a token the target lacks.
                if let Some(best) = sapient_sample::argmax(logits).ok().filter(|&t| (t as usize) < target_vocab) {
                    guesses[w].push(best);
                }
            }
            live.retain(|&w| {
                let g = &guesses[w];
                // Nothing after an end of sequence (nor after a token the target lacks).
                g.len() < want[w].1 && g.last().is_some_and(|t| !eos.contains(t))
            });
        }
        if restricted {
            // Other users of the draft pipeline get every logit.
            let _ = inner.model.restrict_logits(None);
        }
        let took = started.elapsed();
        for (w, &(i, _)) in want.iter().enumerate() {
            let a = &mut running[i];
            a.drafts = guesses[w].len();
            a.kv_tokens.extend_from_slice(&guesses[w]);
            a.dec.stats.draft_time += took / want.len() as u32;
        }
    }
}
