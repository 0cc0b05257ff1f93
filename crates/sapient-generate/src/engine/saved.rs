//! A session's kept cache taken out of an engine and put back into another (of the same
//! model and KV layout): [`Engine::save_session`] and [`Engine::restore_session`]. The
//! restored session's next request reuses every token of its prompt that the saved tokens
//! start with, exactly as if the earlier requests had run on this engine.

use super::{Engine, Kept, Msg, Scheduler, Session};
use crate::{Error, Result};
use sapient_llama::KvLayout;
use std::sync::Arc;

/// A session's cache: its tokens and their keys and values
/// ([`sapient_llama::KvCache::export_seq`]'s bytes), with the layout they fit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedSession {
    pub tokens: Vec<u32>,
    pub layout: KvLayout,
    pub kv: Vec<u8>,
}

/// Replies of the engine's thread.
pub(super) type Reply<T> = std::sync::mpsc::Sender<Result<T>>;

impl Engine {
    fn ask<T>(&self, session: &Session, msg: impl FnOnce(u64, Reply<T>) -> Msg) -> Result<T> {
        if !Arc::ptr_eq(&session.shared, &self.shared) {
            return Err(Error::InvalidOptions("the session belongs to another engine".into()));
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let sent = self.tx.as_ref().is_some_and(|t| t.send(msg(session.id, tx)).is_ok());
        if !sent {
            return Err(Error::Worker("the engine has stopped".into()));
        }
        rx.recv().map_err(|_| Error::Worker("the engine stopped before it answered".into()))?
    }

    /// What `session` keeps in the cache now (after its last request finished): fails when
    /// it keeps nothing (no request finished yet, or one runs).
    pub fn save_session(&self, session: &Session) -> Result<SavedSession> {
        self.ask(session, Msg::Save)
    }

    /// Give `session` the cache of `saved` (replacing what it kept), taken from an engine of
    /// the same model and KV layout; kept sessions of others give their room back if needed.
    /// Fails on another layout, a size that does not match, tokens outside the vocabulary or
    /// past the context, and no room.
    pub fn restore_session(&self, session: &Session, saved: SavedSession) -> Result<()> {
        self.ask(session, |id, reply| Msg::Restore(id, Box::new(saved), reply))
    }
}

impl Scheduler {
    pub(super) fn save(&self, s: u64) -> Result<SavedSession> {
        let k = self.sessions.get(&s).ok_or_else(|| Error::InvalidOptions("the session keeps no cache (no request of it finished, or one runs)".into()))?;
        if self.kv.len(k.seq)? != k.tokens.len() {
            return Err(Error::Worker("a kept sequence's length differs from its tokens".into()));
        }
        Ok(SavedSession { tokens: k.tokens.clone(), layout: self.kv.layout(), kv: self.kv.export_seq(k.seq)? })
    }

    pub(super) fn restore(&mut self, s: u64, saved: SavedSession) -> Result<()> {
        let here = self.kv.layout();
        if saved.layout != here {
            return Err(Error::InvalidOptions(format!("the saved cache is {}, this engine's is {here}", saved.layout)));
        }
        let (vocab, max) = (self.model.info().vocab_size, self.model.info().max_seq_len);
        if let Some(t) = saved.tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::InvalidOptions(format!("the saved tokens hold id {t}, outside the vocabulary of {vocab}")));
        }
        if saved.tokens.is_empty() || saved.tokens.len() >= max {
            return Err(Error::PromptTooLong { tokens: saved.tokens.len(), max });
        }
        self.forget_session(s);
        let seq = self.kv.new_seq();
        loop {
            match self.kv.import_seq(seq, saved.tokens.len(), &saved.kv) {
                Ok(()) => break,
                Err(sapient_llama::Error::KvFull { .. }) if self.reclaim() => {}
                Err(e) => {
                    let _ = self.kv.free(seq);
                    return Err(e.into());
                }
            }
        }
        if let Ok(mut m) = self.shared.sessions.lock() {
            m.insert(s, saved.tokens.len());
        }
        self.sessions.insert(s, Kept { seq, tokens: saved.tokens, at: self.steps, lora: Vec::new() });
        Ok(())
    }
}
