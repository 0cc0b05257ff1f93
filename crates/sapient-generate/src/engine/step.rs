//! The executor: runs a step's [`Plan`]s on the model. One batched forward over every
//! planned row (into the slots the scheduler reserved), then, for each sequence whose rows
//! end what it had to feed, sampling (or verifying speculated guesses) and streaming its text
//! and log-probabilities; then every planned sequence's length in the cache is set to what it
//! keeps (rejected guesses dropped), full prompt blocks are shared and a hybrid's state
//! snapshots kept; sequences that finish are handed back to the scheduler to end.

use super::scheduler::{settle, Plan, Scheduler};
use super::{Event, Msg};
use crate::generation::FinishReason;
use crate::{Error, Result};
use sapient_llama::{BatchSeq, Logits};
use std::sync::atomic::Ordering;

impl Scheduler {
    /// The engine thread: take what the queue brings, run steps until stopped and idle.
    pub(super) fn run(&mut self, rx: std::sync::mpsc::Receiver<Msg>) {
        loop {
            let idle = self.running.is_empty() && self.preempted.is_empty() && self.waiting.is_empty();
            if self.shared.stop.load(Ordering::Relaxed) && idle {
                return;
            }
            if idle {
                match rx.recv() {
                    Ok(m) => self.receive(m),
                    Err(_) => return,
                }
            }
            while let Ok(m) = rx.try_recv() {
                self.receive(m);
            }
            // A bug in one step must not take every later request down with the thread:
            // what was in flight fails with the message, and the engine starts afresh.
            if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.step())) {
                let msg = p
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                tracing::error!("engine step panicked: {msg}");
                self.fail_all(&msg);
            }
            self.publish();
        }
    }

    /// One step: the scheduler's plans, then their execution.
    pub(super) fn step(&mut self) {
        let plans = self.schedule();
        if plans.is_empty() {
            return;
        }
        self.execute(&plans);
    }

    /// Run `plans` (see the module docs).
    pub(super) fn execute(&mut self, plans: &[Plan]) {
        let batch: Vec<BatchSeq<'_>> = plans
            .iter()
            .filter_map(|p| {
                let a = &self.running[p.idx];
                Some(BatchSeq {
                    seq: a.seq?,
                    tokens: &a.kv_tokens[p.start..p.start + p.n],
                    logits: p.logits,
                })
            })
            .collect();
        // Each sequence's LoRA adapters, beside its rows (none when no sequence has any).
        let loras: Vec<&[sapient_llama::LoraUse]> = if plans.iter().any(|p| !self.running[p.idx].lora.is_empty()) {
            plans.iter().filter(|p| self.running[p.idx].seq.is_some()).map(|p| self.running[p.idx].lora.as_slice()).collect()
        } else {
            Vec::new()
        };
        let result = match self.model.lock_inner() {
            Ok(mut inner) => {
                let r = inner.model.forward_reserved(&mut self.kv, &batch, &loras, &mut self.logits).map_err(Error::from);
                // The MTP head's input: every row's output-normed hidden state.
                if self.mtp.is_some() {
                    let rows: usize = batch.iter().map(|s| s.tokens.len()).sum();
                    self.hidden.clear();
                    self.hidden.extend_from_slice(inner.model.hidden(rows).unwrap_or(&[]));
                }
                r
            }
            Err(e) => Err(e),
        };
        drop((batch, loras));
        self.steps += 1;
        self.shared.steps.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = result {
            // A failed step fails its sequences (their state is unknown); others wait.
            let msg = e.to_string();
            let mut idxs: Vec<usize> = plans.iter().map(|p| p.idx).collect();
            idxs.sort_unstable();
            for &i in idxs.iter().rev() {
                let a = self.running.swap_remove(i);
                self.finish(a, Err(Error::Worker(format!("forward pass failed: {msg}"))));
            }
            return;
        }
        let vocab = self.model.info().vocab_size;
        let mut row = 0;
        // Each plan's first row in the batch (the hidden states' rows).
        let mut brow = 0;
        let hsize = self.mtp.as_ref().map_or(0, |m| m.hidden_size);
        let mut done: Vec<(usize, Result<FinishReason>)> = Vec::new();
        for p in plans {
            let a = &mut self.running[p.idx];
            let before = p.start;
            a.computed = p.start + p.n;
            let mut r = Ok(None);
            if let Some(which) = p.logits {
                let rows = if which == Logits::All { p.n } else { 1 };
                let logits = &mut self.logits[row * vocab..(row + rows) * vocab];
                row += rows;
                let tx = a.tx.clone();
                let mut emit = |piece| tx.send(Event::Text(piece)).is_ok();
                let had = a.dec.tokens().len();
                if a.drafts > 0 {
                    // Keep the guesses the model agrees with; the cache drops the others.
                    let drafts = a.kv_tokens[before + 1..before + p.n].to_vec();
                    let mut accepted = 0;
                    r = a.dec.verify(logits, vocab, &drafts, &self.eos, &mut emit, &mut accepted);
                    a.drafts = 0;
                    a.kv_tokens.truncate(before + 1);
                    a.computed = before + 1 + accepted;
                    // The draft's cache keeps what was accepted.
                    a.draft_computed = a.draft_computed.min(a.computed);
                } else {
                    let mut fed = 0;
                    r = a.dec.advance(logits, &self.eos, &mut emit, &mut fed);
                }
                let lps = a.dec.new_logprobs();
                if !lps.is_empty() {
                    let _ = a.tx.send(Event::Logprobs(lps));
                }
                let new = &a.dec.tokens()[had..];
                a.kv_tokens.extend_from_slice(new);
                self.shared.generated.fetch_add(new.len() as u64, Ordering::Relaxed);
                // Guesses past what was kept (rejected, or after an end) are not kept.
                a.computed = a.computed.min(a.kv_tokens.len());
            }
            // The cache holds what the sequence keeps of its rows (the forward left the
            // lengths to the scheduler); blocks past it go back.
            if let Some(seq) = a.seq {
                settle(&mut self.kv, seq, &mut a.computed);
                if self.mtp.is_some() {
                    let rows = self.hidden.get(brow * hsize..(brow + p.n) * hsize).unwrap_or(&[]);
                    super::mtp::record_hidden(a, p.start, a.computed, rows, hsize);
                }
                brow += p.n;
            }
            // Prompt blocks become shareable as soon as they are full.
            if a.shares_prefixes(&self.opts) && (a.computed <= a.dec.prompt_len() || p.logits.is_some()) {
                if let Some(seq) = a.seq {
                    let _ = self.kv.commit(seq, &a.kv_tokens[..a.computed]);
                }
            }
            // A hybrid's state where its prompt reaches a block boundary (the end of a chunk
            // of a multiple of the block size, or its last one) is kept for later requests.
            let a = &self.running[p.idx];
            if let (Some(seq), Some(end)) = (a.seq, self.snapshot_at(a)) {
                if a.computed <= end && a.computed.is_multiple_of(self.kv.block_size()) {
                    let _ = self.kv.snapshot_state(seq);
                }
            }
            match r {
                Ok(None) => {}
                Ok(Some(reason)) => done.push((p.idx, Ok(reason))),
                Err(e) => done.push((p.idx, Err(e))),
            }
        }
        done.sort_by_key(|d| std::cmp::Reverse(d.0));
        for (i, reason) in done {
            let mut a = self.running.swap_remove(i);
            let r = reason.and_then(|reason| Self::result(&mut a, reason));
            self.finish(a, r);
        }
    }
}
