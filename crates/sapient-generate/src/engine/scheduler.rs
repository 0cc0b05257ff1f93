//! The scheduler: what runs in a step, decided without running the model (only a draft
//! model, when there is one, proposes its guesses while the step is planned). It admits waiting
//! requests (taking cached prefixes and kept session caches), cancels, builds each step's
//! [`Plan`]s (decode rows first, then prompt chunks within the step's token budget),
//! reserves their KV blocks, preempts the newest sequence when the cache is full, shifts or
//! ends sequences at the context length, and ends requests (their blocks to the prefix cache
//! or their session). [`super::step`] runs the plans on the model.

use super::{Active, ContextPolicy, Draft, EngineOptions, Event, Msg, NewRequest, Shared};
use crate::decode::Decoder;
use crate::generation::{FinishReason, Generation, GenerationStats};
use crate::model::{common_prefix, Model};
use crate::{Error, Result};
use sapient_llama::{KvCache, Logits, SeqId};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// A finished session request's sequence, kept for the session's next request.
pub(super) struct Kept {
    pub(super) seq: SeqId,
    /// The tokens in its cache.
    pub(super) tokens: Vec<u32>,
    /// When it was kept (a step count), for giving back the oldest first.
    pub(super) at: u64,
    /// The LoRA adapters its keys and values were computed with.
    pub(super) lora: Vec<sapient_llama::LoraUse>,
}

pub(super) struct Scheduler {
    pub(super) model: Model,
    pub(super) opts: EngineOptions,
    pub(super) kv: KvCache,
    pub(super) shared: Arc<Shared>,
    pub(super) waiting: VecDeque<NewRequest>,
    /// Preempted sequences, resumed before new requests.
    pub(super) preempted: VecDeque<Active>,
    pub(super) running: Vec<Active>,
    pub(super) sessions: HashMap<u64, Kept>,
    pub(super) logits: Vec<f32>,
    pub(super) eos: Vec<u32>,
    pub(super) steps: u64,
    pub(super) draft: Option<Draft>,
    /// A hybrid model's MTP head, when it has one (`mtp.rs`).
    pub(super) mtp: Option<super::mtp::MtpDraft>,
    /// The output-normed hidden states of the last step's rows (with an MTP head).
    pub(super) hidden: Vec<f32>,
}

/// What one running sequence feeds in a step: plain data, made by the scheduler (with the
/// blocks for it reserved) and run by the executor ([`super::step`]).
pub(super) struct Plan {
    /// The sequence's index in [`Scheduler::running`].
    pub(super) idx: usize,
    /// The first of its `kv_tokens` fed: what the cache holds for it.
    pub(super) start: usize,
    /// How many are fed: a prompt chunk, one decode token, a run a constraint forces, or the
    /// newest token and the guesses after it.
    pub(super) n: usize,
    /// Which logits: none for a prompt chunk that does not end the prompt, the last row to
    /// sample, every row to verify guesses.
    pub(super) logits: Option<Logits>,
}

impl Scheduler {
    pub(super) fn new(model: Model, opts: EngineOptions, kv: KvCache, shared: Arc<Shared>) -> Self {
        let eos = model.tokenizer().eos_token_ids().to_vec();
        Self {
            model,
            opts,
            kv,
            shared,
            waiting: VecDeque::new(),
            preempted: VecDeque::new(),
            running: Vec::new(),
            sessions: HashMap::new(),
            logits: Vec::new(),
            eos,
            steps: 0,
            draft: None,
            mtp: None,
            hidden: Vec::new(),
        }
    }

    /// Fail every admitted request (after a panic: their state is unknown), free the whole
    /// cache and the kept sessions. Waiting requests stay queued.
    pub(super) fn fail_all(&mut self, msg: &str) {
        let failed: Vec<Active> = self.running.drain(..).chain(self.preempted.drain(..)).collect();
        for mut a in failed {
            a.seq = None;
            self.shared.finished.fetch_add(1, Ordering::Relaxed);
            let _ = a.tx.send(Event::Done(Err(Error::Worker(format!("the engine step failed: {msg}")))));
        }
        self.sessions.clear();
        if let Ok(mut m) = self.shared.sessions.lock() {
            m.clear();
        }
        match self.model.lock_inner().and_then(|inner| Ok(inner.model.new_kv_cache(self.opts.kv)?)) {
            Ok(kv) => self.kv = kv,
            Err(e) => tracing::error!("cannot make a fresh KV cache after a failed step: {e}"),
        }
        if let Some(d) = &mut self.draft {
            match d.model.lock_inner().and_then(|inner| Ok(inner.model.new_kv_cache(self.opts.kv)?)) {
                Ok(kv) => d.kv = kv,
                Err(e) => tracing::error!("cannot make a fresh draft KV cache after a failed step: {e}"),
            }
        }
        if let Some(m) = &mut self.mtp {
            match self.model.lock_inner().and_then(|inner| Ok(inner.model.new_mtp_cache(self.opts.kv)?)) {
                Ok(kv) => m.kv = kv,
                Err(e) => tracing::error!("cannot make a fresh MTP KV cache after a failed step: {e}"),
            }
        }
    }

    pub(super) fn receive(&mut self, m: Msg) {
        match m {
            Msg::Request(r) => self.waiting.push_back(*r),
            Msg::EndSession(s) => self.forget_session(s),
            Msg::Reset => {
                let all: Vec<u64> = self.sessions.keys().copied().collect();
                for s in all {
                    self.forget_session(s);
                }
                self.kv.clear_prefix_cache();
            }
            Msg::Wake => {}
            Msg::Save(s, reply) => {
                let _ = reply.send(self.save(s));
            }
            Msg::Restore(s, saved, reply) => {
                let _ = reply.send(self.restore(s, *saved));
            }
        }
    }

    /// Take session `s`'s kept sequence (it stops counting as kept).
    pub(super) fn take_kept(&mut self, s: u64) -> Option<Kept> {
        if let Ok(mut m) = self.shared.sessions.lock() {
            m.remove(&s);
        }
        self.sessions.remove(&s)
    }

    pub(super) fn forget_session(&mut self, s: u64) {
        if let Some(k) = self.take_kept(s) {
            let _ = self.kv.free(k.seq);
        }
    }

    /// Give back the oldest kept session sequence; whether there was one.
    pub(super) fn reclaim(&mut self) -> bool {
        match self.sessions.iter().min_by_key(|(_, k)| k.at).map(|(s, _)| *s) {
            Some(s) => {
                self.forget_session(s);
                true
            }
            None => false,
        }
    }

    pub(super) fn publish(&self) {
        self.shared.waiting.store(self.waiting.len() + self.preempted.len(), Ordering::Relaxed);
        self.shared.running.store(self.running.len(), Ordering::Relaxed);
        if let Ok(mut k) = self.shared.kv.lock() {
            *k = self.kv.usage();
        }
    }
    /// This step's decisions, before any model runs: cancelled requests leave, waiting ones
    /// are admitted, and the running sequences get their rows with their KV blocks reserved
    /// (preempting when the cache is full). Empty when there is nothing to run.
    pub(super) fn schedule(&mut self) -> Vec<Plan> {
        self.drop_cancelled();
        self.admit();
        if self.running.is_empty() {
            return Vec::new();
        }
        self.plan()
    }

    pub(super) fn result(a: &mut Active, finish: FinishReason) -> Result<Generation> {
        let tx = a.tx.clone();
        a.dec.result(finish, &mut |piece| tx.send(Event::Text(piece)).is_ok())
    }

    /// End a request: its blocks go (full ones to the prefix cache; the whole sequence kept
    /// for its session), its receiver gets the result.
    pub(super) fn finish(&mut self, mut a: Active, r: Result<Generation>) {
        self.free_draft(&mut a);
        match (a.session, a.seq, r.is_ok()) {
            (Some(s), Some(seq), true) => {
                if a.shares_prefixes(&self.opts) {
                    let _ = self.kv.commit(seq, &a.kv_tokens[..a.computed.min(a.kv_tokens.len())]);
                }
                // A request that ran beside another of its session replaces that one's kept cache.
                self.forget_session(s);
                let tokens = a.kv_tokens[..a.computed.min(a.kv_tokens.len())].to_vec();
                if let Ok(mut m) = self.shared.sessions.lock() {
                    m.insert(s, tokens.len());
                }
                self.sessions.insert(s, Kept { seq, tokens, at: self.steps, lora: a.lora.clone() });
                a.seq = None;
            }
            _ => self.release(&mut a),
        }
        let cancelled = matches!(&r, Ok(g) if g.finish == FinishReason::Cancelled);
        if cancelled {
            self.shared.cancelled.fetch_add(1, Ordering::Relaxed);
        } else {
            self.shared.finished.fetch_add(1, Ordering::Relaxed);
        }
        let _ = a.tx.send(Event::Done(r));
    }

    fn drop_cancelled(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].cancelled() {
                let mut a = self.running.swap_remove(i);
                let r = Self::result(&mut a, FinishReason::Cancelled);
                self.finish(a, r);
            } else {
                i += 1;
            }
        }
        let mut i = 0;
        while i < self.preempted.len() {
            if self.preempted[i].cancelled() {
                if let Some(mut a) = self.preempted.remove(i) {
                    let r = Self::result(&mut a, FinishReason::Cancelled);
                    self.finish(a, r);
                }
            } else {
                i += 1;
            }
        }
        let mut i = 0;
        while i < self.waiting.len() {
            if self.waiting[i].cancelled() {
                if let Some(r) = self.waiting.remove(i) {
                    self.shared.cancelled.fetch_add(1, Ordering::Relaxed);
                    let g = Generation {
                        text: String::new(),
                        reasoning: None,
                        tokens: Vec::new(),
                        logprobs: Vec::new(),
                        finish: FinishReason::Cancelled,
                        stats: GenerationStats { prompt_tokens: r.prompt.len(), ..Default::default() },
                    };
                    let _ = r.tx.send(Event::Done(Ok(g)));
                }
            } else {
                i += 1;
            }
        }
    }

    /// Blocks a sequence needs to hold `tokens` positions.
    fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.kv.block_size())
    }

    fn admit(&mut self) {
        // Headroom: every running sequence may need a new block in the next step.
        let headroom = self.running.len();
        // Blocks that admitted sequences still need for the tokens they have not fed yet (a
        // prompt or a preempted sequence's recomputation, from an earlier step or admitted a
        // moment ago in this loop): they are promised, so a new sequence that needs them too
        // waits rather than being preempted as soon as the promised prompts are fed.
        let mut owed: usize = self
            .running
            .iter()
            .filter(|a| a.kv_tokens.len() > a.computed + 1)
            .map(|a| self.blocks_for(a.kv_tokens.len() + 1).saturating_sub(self.blocks_for(a.computed)))
            .sum();
        while self.running.len() < self.opts.max_seqs {
            let resume = !self.preempted.is_empty();
            let tokens_needed = match (resume, self.waiting.front()) {
                (true, _) => self.preempted.front().map_or(0, |a| a.kv_tokens.len() + 1),
                (false, Some(r)) => r.prompt.len() + 1,
                (false, None) => break,
            };
            // Its positions' blocks, and a hybrid's recurrent state's (freed when preempted).
            let need = self.blocks_for(tokens_needed) + self.kv.seq_state_blocks();
            if need > self.kv.total_blocks() {
                // Alone it can never fit.
                let err = Error::TooLargeForCache { needed: tokens_needed, capacity: self.kv.capacity_tokens() };
                if resume {
                    if let Some(mut a) = self.preempted.pop_front() {
                        let r = Self::result(&mut a, FinishReason::ContextFull);
                        self.finish(a, r);
                    }
                } else if let Some(r) = self.waiting.pop_front() {
                    let _ = r.tx.send(Event::Done(Err(err)));
                }
                continue;
            }
            // Kept session caches give way to requests that are waiting.
            while need + headroom + owed > self.kv.available_blocks() && self.reclaim() {}
            if need + headroom + owed > self.kv.available_blocks() && !self.running.is_empty() {
                break;
            }
            let mut a = if resume {
                match self.preempted.pop_front() {
                    Some(a) => a,
                    None => break,
                }
            } else {
                let Some(r) = self.waiting.pop_front() else { break };
                match self.activate(r) {
                    Some(a) => a,
                    None => continue,
                }
            };
            let kept = match a.session {
                Some(s) if !resume => self.take_kept(s),
                _ => None,
            };
            let (seq, reused) = match kept {
                Some(k) => {
                    // Everything the new prompt starts with, keeping at least one token to feed
                    // (nothing when the adapters differ).
                    let common = if k.lora == a.lora { common_prefix(&k.tokens, &a.kv_tokens).min(a.kv_tokens.len() - 1) } else { 0 };
                    match self.kv.truncate(k.seq, common) {
                        Ok(()) => (k.seq, common),
                        Err(_) => {
                            let _ = self.kv.free(k.seq);
                            (self.kv.new_seq(), 0)
                        }
                    }
                }
                None => {
                    let seq = self.kv.new_seq();
                    let reused = if a.shares_prefixes(&self.opts) { self.kv.attach_prefix(seq, &a.kv_tokens).unwrap_or(0) } else { 0 };
                    (seq, reused)
                }
            };
            a.seq = Some(seq);
            a.computed = reused;
            if !resume {
                a.dec.stats.reused_prompt_tokens = reused;
                self.shared.prompt.fetch_add(a.dec.prompt_len() as u64, Ordering::Relaxed);
                self.shared.cached.fetch_add(reused as u64, Ordering::Relaxed);
            }
            a.dec.started.get_or_insert_with(Instant::now);
            owed += need.saturating_sub(self.blocks_for(reused));
            self.running.push(a);
        }
    }

    fn activate(&mut self, r: NewRequest) -> Option<Active> {
        let lora = r.cfg.lora.clone();
        match Decoder::new(&self.model, r.prompt.clone(), r.cfg, r.submitted) {
            Ok(dec) => Some(Active {
                id: r.id,
                seq: None,
                kv_tokens: r.prompt,
                computed: 0,
                session: r.session,
                dec,
                tx: r.tx,
                cancel: r.cancel,
                drafts: 0,
                draft_seq: None,
                draft_computed: 0,
                mtp_h: Vec::new(),
                mtp_h0: 0,
                lora,
            }),
            Err(e) => {
                let _ = r.tx.send(Event::Done(Err(e)));
                None
            }
        }
    }

    /// This step's rows, with their blocks reserved (preempting when the cache is full).
    fn plan(&mut self) -> Vec<Plan> {
        let max_seq = self.model.info().max_seq_len;
        // Decoding sequences first (one token, or a forced run), oldest first; then prompts.
        let mut order: Vec<usize> = (0..self.running.len()).collect();
        order.sort_by_key(|&i| {
            let a = &self.running[i];
            (a.computed < a.dec.prompt_len(), a.id)
        });
        if let (Some(d), false) = (&mut self.draft, self.kv.has_seq_state()) {
            // Not for hybrid models (only their own MTP head drafts for them).
            d.propose(&mut self.running, &self.eos, self.model.info().vocab_size, max_seq);
        } else if let Some(m) = &mut self.mtp {
            // A hybrid's own MTP head: its recurrent state rolls back to the accepted guesses.
            m.propose(&self.model, &mut self.running, &self.eos, max_seq);
        }
        // Prompt lookup: decoding sequences that speculate feed their guesses after their
        // newest token, to be verified by this step's forward. Not for hybrid models (their
        // state rolls back only within a short verification step: the MTP head's).
        let speculate = !self.kv.has_seq_state();
        for a in self.running.iter_mut() {
            if speculate && a.drafts == 0 && a.computed >= a.dec.prompt_len() && a.kv_tokens.len() == a.computed + 1 {
                let guesses = a.dec.propose(max_seq.saturating_sub(a.computed + 1));
                a.drafts = guesses.len();
                a.kv_tokens.extend_from_slice(&guesses);
            }
        }
        let mut plans = Vec::new();
        let mut budget = self.opts.max_step_tokens;
        let mut context_full = Vec::new();
        let mut shift = Vec::new();
        for i in order {
            let a = &self.running[i];
            let pending = a.kv_tokens.len() - a.computed;
            if pending == 0 {
                continue;
            }
            let mut n = if pending == 1 || a.drafts > 0 { pending } else { pending.min(self.opts.prefill_chunk).min(budget) };
            if let Some(end) = self.snapshot_at(a).filter(|&end| a.computed < end) {
                // A hybrid's prompt stops at its last block boundary once, for a state snapshot.
                n = n.min(end - a.computed);
            }
            if n == 0 {
                continue;
            }
            if a.computed + n > max_seq {
                match self.opts.context {
                    ContextPolicy::Shift { keep } if a.kv_tokens.len() > keep + 2 => shift.push((i, keep)),
                    _ => context_full.push(a.id),
                }
                continue;
            }
            let logits = (a.computed + n == a.kv_tokens.len()).then_some(if a.drafts > 0 { Logits::All } else { Logits::Last });
            plans.push(Plan { idx: i, start: a.computed, n, logits });
            budget = budget.saturating_sub(n);
        }
        for (i, keep) in shift {
            // Recomputed from the next step on, as prompt chunks.
            let a = &mut self.running[i];
            a.drop_drafts();
            let len = a.kv_tokens.len();
            let keep = keep.min(len / 2);
            let drop = (len - keep) / 2;
            a.kv_tokens.drain(keep..keep + drop);
            a.computed = a.computed.min(keep);
            if let Some(seq) = a.seq {
                settle(&mut self.kv, seq, &mut a.computed);
            }
            a.draft_computed = a.draft_computed.min(a.computed);
            self.shared.context_shifts.fetch_add(1, Ordering::Relaxed);
        }
        // Reserve; when the cache is full, preempt the newest sequence and try again.
        let mut k = 0;
        while k < plans.len() {
            let (idx, n) = (plans[k].idx, plans[k].n);
            let Some(seq) = self.running[idx].seq else {
                k += 1;
                continue;
            };
            match self.kv.reserve(seq, n) {
                Ok(()) => k += 1,
                // Kept session caches go before running sequences are preempted.
                Err(_) if self.reclaim() => {}
                Err(_) => {
                    // The newest running sequence other than those already reserved goes first.
                    let victim = (0..self.running.len())
                        .filter(|&j| !plans[..k].iter().any(|p| p.idx == j))
                        .max_by_key(|&j| self.running[j].id);
                    match victim {
                        Some(v) if v != idx || self.running.len() > 1 => {
                            self.preempt(v, &mut plans);
                            if v == idx {
                                continue;
                            }
                        }
                        _ => {
                            // Alone and still no room.
                            context_full.push(self.running[idx].id);
                            plans.remove(k);
                        }
                    }
                }
            }
        }
        for id in context_full {
            // Indices shift as sequences leave: fix the plans.
            if let Some(i) = self.running.iter().position(|a| a.id == id) {
                let mut a = Self::take_planned(&mut self.running, i, &mut plans);
                let r = Self::result(&mut a, FinishReason::ContextFull);
                self.finish(a, r);
            }
        }
        plans
    }

    /// Remove running sequence `i`, dropping its plan and renumbering the plan of the sequence
    /// `swap_remove` moves into its place.
    fn take_planned(running: &mut Vec<Active>, i: usize, plans: &mut Vec<Plan>) -> Active {
        plans.retain(|p| p.idx != i);
        let a = running.swap_remove(i);
        let moved = running.len();
        for p in plans.iter_mut().filter(|p| p.idx == moved) {
            p.idx = i;
        }
        a
    }

    /// Give back `a`'s sequence: full blocks to the prefix cache (when on), the rest freed.
    pub(super) fn release(&mut self, a: &mut Active) {
        self.free_draft(a);
        if let Some(seq) = a.seq.take() {
            if a.shares_prefixes(&self.opts) {
                let _ = self.kv.commit(seq, &a.kv_tokens[..a.computed.min(a.kv_tokens.len())]);
            }
            let _ = self.kv.free(seq);
        }
    }

    /// Give back `a`'s sequence in the draft model's cache.
    fn free_draft(&mut self, a: &mut Active) {
        if let Some(seq) = a.draft_seq.take() {
            if let Some(d) = &mut self.draft {
                let _ = d.kv.free(seq);
            } else if let Some(m) = &mut self.mtp {
                let _ = m.kv.free(seq);
            }
        }
        a.draft_computed = 0;
        a.mtp_h.clear();
        a.mtp_h0 = 0;
    }

    /// For a hybrid model with the prefix cache: the prompt position (its last block boundary
    /// before its last token) where the recurrent state is kept for later requests.
    pub(super) fn snapshot_at(&self, a: &Active) -> Option<usize> {
        let bs = self.kv.block_size();
        let end = a.dec.prompt_len().saturating_sub(1) / bs * bs;
        (self.kv.has_seq_state() && a.shares_prefixes(&self.opts) && end > 0).then_some(end)
    }

    /// Free `v`'s blocks (full ones stay in the prefix cache) and queue it for recomputation.
    fn preempt(&mut self, v: usize, plans: &mut Vec<Plan>) {
        // The sequence (and a hybrid's recurrent state with it) is freed: it is recomputed
        // from its tokens when it comes back.
        let mut a = Self::take_planned(&mut self.running, v, plans);
        a.drop_drafts();
        self.release(&mut a);
        a.computed = 0;
        self.shared.preemptions.fetch_add(1, Ordering::Relaxed);
        self.preempted.push_back(a);
    }
}

/// Make `seq` hold `computed` positions: what a step wrote and the sequence keeps, or fewer
/// (a context shift). Where the cache cannot (a hybrid model's recurrent state goes back
/// only to 0), empty it so that everything is recomputed. Every change of a running
/// sequence's length in the cache goes through here (or through admission, which gives a
/// sequence its cached prefix, and [`Scheduler::release`]).
pub(super) fn settle(kv: &mut KvCache, seq: SeqId, computed: &mut usize) {
    // A hybrid's state goes back to the last accepted guess from the states its
    // verification step kept (or, where it cannot, the sequence is recomputed).
    let rolled = kv.rollback_state(seq, *computed);
    if rolled.is_err() || kv.set_len(seq, *computed).is_err() {
        let _ = kv.truncate(seq, 0);
        *computed = 0;
    }
}