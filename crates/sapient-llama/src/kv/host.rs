//! The KV cache's memory in host RAM, the CPU backend's storage: each layer's keys and
//! values in mappings of their own (layouts in the module docs of [`crate::kv`]), each
//! sequence's recurrent state, and the state snapshots the prefix cache keeps. It does what
//! the bookkeeping ([`super::book`]) asks through [`Effect`]s and knows nothing of block
//! tables or hashes beyond them.

use std::collections::HashMap;

use sapient_tensor::kernels::ZeroedMap;

use super::book::Effect;
use super::{KvDtype, KvStorage, SeqId, Q8_GROUP};

/// The layers' keys and values, each in a mapping of its own ([`ZeroedMap`]).
pub(super) enum Store {
    /// f16 bits, per layer.
    F16 { k: Vec<ZeroedMap<u16>>, v: Vec<ZeroedMap<u16>> },
    /// Per layer: keys (int8 + 128), values (int8), and their f16 scales.
    Q8 { k: Vec<ZeroedMap<u8>>, v: Vec<ZeroedMap<i8>>, ks: Vec<ZeroedMap<u16>>, vs: Vec<ZeroedMap<u16>> },
}

/// One layer of the cache, as the backend reads it.
#[derive(Clone, Copy)]
pub(crate) enum KvLayer<'a> {
    F16 { k: &'a [u16], v: &'a [u16] },
    Q8 { k: &'a [u8], v: &'a [i8], ks: &'a [u16], vs: &'a [u16] },
}

/// One layer of the cache, as the backend writes it.
pub(crate) enum KvLayerMut<'a> {
    F16 { k: &'a mut [u16], v: &'a mut [u16] },
    Q8 { k: &'a mut [u8], v: &'a mut [i8], ks: &'a mut [u16], vs: &'a mut [u16] },
}

/// Host memory of a KV cache of `blocks` blocks (see the module docs).
pub(crate) struct HostKv {
    block_size: usize,
    /// `kv heads * head dim`: values per position per layer for keys (and for values).
    width: usize,
    layers: usize,
    pub(super) store: Store,
    /// Values of recurrent state per sequence (0: none, a plain transformer).
    state_floats: usize,
    /// Per sequence id: its recurrent state (empty until its first forward).
    states: Vec<Vec<f32>>,
    /// Recurrent state after registered blocks, by chain hash.
    snapshots: HashMap<u64, Vec<f32>>,
    /// Per sequence id: the state after each row of its last verification step (the first
    /// row's position and the rows), for rolling back rejected guesses (`state.rs`).
    rows: HashMap<u32, (usize, usize, Vec<f32>)>,
    /// The memory of a freed sequence's kept rows, for the next sequence that keeps some.
    spare_rows: Vec<f32>,
}

impl HostKv {
    /// Zeroed mappings for `blocks` blocks: pages are committed only once written.
    pub(super) fn new(layers: usize, width: usize, block_size: usize, blocks: usize, dtype: KvDtype) -> crate::Result<Self> {
        let per_layer = blocks.checked_mul(block_size * width).ok_or_else(|| crate::Error::Config("KV budget overflows".into()))?;
        let store = match dtype {
            KvDtype::F16 => Store::F16 {
                k: (0..layers).map(|_| ZeroedMap::new(per_layer)).collect(),
                v: (0..layers).map(|_| ZeroedMap::new(per_layer)).collect(),
            },
            KvDtype::Q8_0 => Store::Q8 {
                k: (0..layers).map(|_| ZeroedMap::new(per_layer)).collect(),
                v: (0..layers).map(|_| ZeroedMap::new(per_layer)).collect(),
                ks: (0..layers).map(|_| ZeroedMap::new(per_layer / Q8_GROUP)).collect(),
                vs: (0..layers).map(|_| ZeroedMap::new(per_layer / Q8_GROUP)).collect(),
            },
        };
        Ok(Self { block_size, width, layers, store, state_floats: 0, states: Vec::new(), snapshots: HashMap::new(), rows: HashMap::new(), spare_rows: Vec::new() })
    }

    pub(super) fn set_state_floats(&mut self, floats: usize) {
        self.state_floats = floats;
    }

    pub(crate) fn block_size(&self) -> usize {
        self.block_size
    }

    /// Keys and values of layer `li`.
    pub(crate) fn layer(&self, li: usize) -> KvLayer<'_> {
        match &self.store {
            Store::F16 { k, v } => KvLayer::F16 { k: &k[li], v: &v[li] },
            Store::Q8 { k, v, ks, vs } => KvLayer::Q8 { k: &k[li], v: &v[li], ks: &ks[li], vs: &vs[li] },
        }
    }
    pub(crate) fn layer_mut(&mut self, li: usize) -> KvLayerMut<'_> {
        match &mut self.store {
            Store::F16 { k, v } => KvLayerMut::F16 { k: &mut k[li], v: &mut v[li] },
            Store::Q8 { k, v, ks, vs } => KvLayerMut::Q8 { k: &mut k[li], v: &mut v[li], ks: &mut ks[li], vs: &mut vs[li] },
        }
    }

    /// The recurrent state of sequence `seq`, zeroed on first use (the bookkeeping has
    /// checked where it stands).
    pub(crate) fn state_mut(&mut self, seq: SeqId) -> &mut [f32] {
        let i = seq.0 as usize;
        if self.states.len() <= i {
            self.states.resize_with(i + 1, Vec::new);
        }
        let s = &mut self.states[i];
        if s.len() != self.state_floats {
            *s = vec![0.0; self.state_floats];
        }
        s
    }

    /// Where a step that keeps the state after each of its `n` rows of `seq` (positions
    /// `start..start + n`) writes them: `n` states one after another, for
    /// [`roll_back`](Self::roll_back).
    pub(crate) fn row_states_mut(&mut self, seq: SeqId, start: usize, n: usize) -> &mut [f32] {
        let sf = self.state_floats;
        let spare = &mut self.spare_rows;
        let r = self.rows.entry(seq.0).or_insert_with(|| (0, 0, std::mem::take(spare)));
        r.0 = start;
        r.1 = n;
        if r.2.len() < n * sf {
            r.2.resize(n * sf, 0.0);
        }
        &mut r.2[..n * sf]
    }
    /// A step that does not keep them: the rows kept before no longer follow the state (the
    /// memory stays with the sequence for its next verification step).
    pub(crate) fn forget_row_states(&mut self, seq: SeqId) {
        if let Some(r) = self.rows.get_mut(&seq.0) {
            r.1 = 0;
        }
    }
    /// Make `seq`'s state the one after position `len - 1`, from the rows its last step
    /// kept, when that step ended at `held` and covered that position; returns whether it
    /// could.
    pub(super) fn roll_back(&mut self, seq: SeqId, len: usize, held: usize) -> bool {
        let sf = self.state_floats;
        let (t, rows) = match self.rows.get_mut(&seq.0) {
            Some((start, n, rows)) if *start + *n == held && len > *start && len <= held => {
                // Used up: the rows no longer follow the state; their memory stays for the
                // next step (taken out while the state is written, then put back).
                *n = 0;
                (len - *start - 1, std::mem::take(rows))
            }
            _ => return false,
        };
        self.state_mut(seq).copy_from_slice(&rows[t * sf..(t + 1) * sf]);
        if let Some(r) = self.rows.get_mut(&seq.0) {
            r.2 = rows;
        }
        true
    }

    fn copy_block(&mut self, from: u32, to: u32) {
        fn copy<T: Copy, L: std::ops::DerefMut<Target = [T]>>(layers: &mut [L], n: usize, from: u32, to: u32) {
            let (f, t) = (from as usize * n, to as usize * n);
            for layer in layers {
                layer.copy_within(f..f + n, t);
            }
        }
        let n = self.block_size * self.width;
        match &mut self.store {
            Store::F16 { k, v } => {
                copy(k, n, from, to);
                copy(v, n, from, to);
            }
            Store::Q8 { k, v, ks, vs } => {
                copy(k, n, from, to);
                copy(v, n, from, to);
                copy(ks, n / Q8_GROUP, from, to);
                copy(vs, n / Q8_GROUP, from, to);
            }
        }
    }

    /// The state of `seq` as it is (empty if it never ran).
    fn state(&self, seq: u32) -> &[f32] {
        self.states.get(seq as usize).map_or(&[], |s| s.as_slice())
    }
    fn state_slot(&mut self, seq: u32) -> &mut Vec<f32> {
        let i = seq as usize;
        if self.states.len() <= i {
            self.states.resize_with(i + 1, Vec::new);
        }
        &mut self.states[i]
    }
}

impl KvStorage for HostKv {
    fn apply(&mut self, e: Effect) {
        // Any change of a state outside a forward makes its kept rows stale.
        match &e {
            Effect::ResetState(seq) | Effect::FreeState(seq) | Effect::CopyState { to: seq, .. } | Effect::RestoreSnapshot { seq, .. } => {
                if let Some((_, _, rows)) = self.rows.remove(seq) {
                    if rows.len() > self.spare_rows.len() {
                        self.spare_rows = rows;
                    }
                }
            }
            _ => {}
        }
        match e {
            Effect::CopyBlock { from, to } => self.copy_block(from, to),
            Effect::ResetState(seq) => self.state_slot(seq).fill(0.0),
            Effect::FreeState(seq) => *self.state_slot(seq) = Vec::new(),
            Effect::CopyState { from, to } => {
                let s = self.state(from).to_vec();
                *self.state_slot(to) = s;
            }
            Effect::SaveSnapshot { seq, hash } => {
                let s = self.state(seq).to_vec();
                self.snapshots.insert(hash, s);
            }
            Effect::RestoreSnapshot { hash, seq } => {
                let s = self.snapshots.get(&hash).cloned().unwrap_or_default();
                *self.state_slot(seq) = s;
            }
            Effect::DropSnapshot(hash) => {
                self.snapshots.remove(&hash);
            }
        }
    }
    fn layers(&self) -> usize {
        self.layers
    }
    fn width(&self) -> usize {
        self.width
    }
    fn state_floats(&self) -> usize {
        self.state_floats
    }
    fn dtype(&self) -> KvDtype {
        match self.store {
            Store::F16 { .. } => KvDtype::F16,
            Store::Q8 { .. } => KvDtype::Q8_0,
        }
    }
}
