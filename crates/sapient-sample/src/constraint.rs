//! The [`Constraint`] trait: an incremental byte-level parser with cloneable states.
//!
//! A [`Constraint`] turns a state and one byte into the next state (or a rejection); states
//! are `Clone`, so a caller can keep earlier states and roll back. The built-in one is
//! [`crate::Grammar`] (`grammar/`).

use crate::error::GrammarError;
use crate::vocab::{TokenIndex, TokenMask};
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;

/// An incremental parser over bytes whose state can be cloned (and so rolled back).
pub trait Constraint: Send + Sync {
    type State: Clone + Eq + Hash + Debug + Default + Send + Sync;
    /// The state before any input.
    fn start(&self) -> Self::State;
    /// Feed one byte: `Ok(true)` and `out` holds the next state, `Ok(false)` if the byte is
    /// rejected (`out` is then unspecified).
    fn advance(&self, state: &Self::State, byte: u8, out: &mut Self::State) -> Result<bool, GrammarError>;
    /// The input so far is complete (generation may stop here).
    fn is_accepting(&self, state: &Self::State) -> bool;
    /// Feed several bytes; `None` if any is rejected.
    fn advance_bytes(&self, state: &Self::State, bytes: &[u8]) -> Result<Option<Self::State>, GrammarError> {
        let mut cur = state.clone();
        let mut next = Self::State::default();
        for &b in bytes {
            if !self.advance(&cur, b, &mut next)? {
                return Ok(None);
            }
            std::mem::swap(&mut cur, &mut next);
        }
        Ok(Some(cur))
    }
    /// Optional acceleration of [`TokenIndex::mask`]: return the mask for `state`
    /// computed some faster way (possibly shared with a cache), or `None` to let the index
    /// walk its trie.
    fn fast_mask(&self, _index: &TokenIndex, _state: &Self::State) -> Result<Option<Arc<TokenMask>>, GrammarError> {
        Ok(None)
    }
    /// Compute ahead whatever [`Constraint::fast_mask`] needs for this vocabulary (called by
    /// [`crate::Matcher::new`]; it may also start work that goes on in the background); by
    /// default nothing.
    fn prepare(&self, _index: &Arc<TokenIndex>) {}
    /// Whether `bytes` as a whole is accepted from the start state.
    fn matches(&self, bytes: &[u8]) -> Result<bool, GrammarError> {
        Ok(self.advance_bytes(&self.start(), bytes)?.is_some_and(|s| self.is_accepting(&s)))
    }
}
