//! The multi-token-prediction (MTP, "NextN") head of Qwen3.5 checkpoints: one more
//! full-attention layer stored after the main stack (`blk.N.*`, N the main layer count),
//! with `blk.N.nextn.{eh_proj, enorm, hnorm}` and, when present, `nextn.shared_head_norm`
//! and `nextn.shared_head_head`, as llama.cpp's `llama_model_qwen35::graph_mtp` runs it:
//!
//! ```text
//! e      = enorm(embed(token at position p))
//! h      = hnorm(hidden of position p - 1)        (the main model's output-normed state)
//! x      = eh_proj([e | h])                        (embedding first, then the hidden)
//! x      = the layer (gated attention over the head's own cache at position p, MLP)
//! hidden = shared_head_norm(x)                     (output_norm when the file has none)
//! logits = shared_head_head(hidden)                (the model's output layer when none)
//! ```
//!
//! The logits guess the token at position `p + 1`; `hidden` stands in for the main model's
//! hidden state when the head drafts a second token after its first guess. The head's keys
//! and values live in a cache of their own ([`LlamaModel::new_mtp_cache`]), one position per
//! token as the main model's, so it is cut back like any attention cache.

use super::{linears, Bufs, Layer, LlamaModel, Mixer, Transformer};
use crate::backend::{Backend, Step};
use crate::batch::{plan, BatchSeq};
use crate::cpu::check_block_size;
use crate::kv::{Book, KvCache, KvOptions, KvStorage};
use crate::lora::{Adapters, LoraCtx};
use crate::{Error, Result};
use candle_core::{DType, Device};
use sapient_tensor::WeightSource;

/// The MTP head's weights and its step's activations.
pub(crate) struct Mtp<B: Backend> {
    layer: Layer<B>,
    eh_proj: B::Lin,
    enorm: B::Vector,
    hnorm: B::Vector,
    head_norm: B::Vector,
    /// Its own output layer (`nextn.shared_head_head`), else the model's.
    head: Option<B::Lin>,
    buf: Bufs<B::Buf>,
    step: Step,
    /// The hidden rows it takes, normed embeddings and hidden rows, and their concatenation.
    input: B::Buf,
    e: B::Buf,
    h: B::Buf,
    cat: B::Buf,
    /// Its output-normed rows of the last forward.
    hidden: B::Buf,
    /// No adapters apply to it.
    lora: Adapters,
}

impl<B: Backend> Mtp<B> {
    /// The head of block `i` (the first after the main stack), `layer` its loaded layer;
    /// `(h, vocab)` the model's hidden size and vocabulary.
    pub(super) fn load(backend: &B, src: &dyn WeightSource, i: usize, (h, vocab): (usize, usize), layer: Layer<B>) -> Result<Self> {
        let dev = Device::Cpu;
        let vector = |name: &str| -> Result<B::Vector> { Ok(backend.vector(src.tensor(name, &[h], &dev, DType::F32)?.to_vec1::<f32>()?)) };
        let nextn = |what: &str| format!("blk.{i}.nextn.{what}.weight");
        if src.contains(&nextn("embed_tokens")) {
            return Err(Error::Config(format!("{}: an MTP layer with its own embedding table is not supported", src.location().display())));
        }
        if !matches!(layer.mixer, Mixer::Attention(_)) {
            return Err(Error::Internal("the MTP layer has no attention"));
        }
        let name = nextn("eh_proj");
        let eh_proj = backend.linear(src.load_checked(&name, &[h, 2 * h], &dev)?, None, &name)?;
        let head_norm = if src.contains(&nextn("shared_head_norm")) { nextn("shared_head_norm") } else { "output_norm.weight".into() };
        let head = match src.contains(&nextn("shared_head_head")) {
            true => {
                let name = nextn("shared_head_head");
                let w = src.load_checked(&name, &[vocab, h], &dev)?;
                Some(backend.linear(w, None, &name)?)
            }
            false => None,
        };
        Ok(Self {
            layer,
            eh_proj,
            enorm: vector(&nextn("enorm"))?,
            hnorm: vector(&nextn("hnorm"))?,
            head_norm: vector(&head_norm)?,
            head,
            buf: Bufs::default(),
            step: Step::default(),
            input: B::Buf::default(),
            e: B::Buf::default(),
            h: B::Buf::default(),
            cat: B::Buf::default(),
            hidden: B::Buf::default(),
            lora: Adapters::default(),
        })
    }

    /// Its linear layers, for the backend's last pass over the weights.
    pub(super) fn linears(&mut self) -> Vec<&mut B::Lin> {
        let mut w = linears(std::slice::from_mut(&mut self.layer), &mut self.eh_proj);
        w.extend(self.head.as_mut());
        w
    }
}

impl<B: Backend> Transformer<B> {
    /// The MTP head over `batch` in its cache (slots reserved by the caller), its input hidden
    /// rows in the head's `input` (one per token, in batch order); logits of the rows each
    /// sequence asks for into `logits`, every row's output-normed state into the head's
    /// `hidden`. Every row is computed as it is alone.
    fn mtp_forward(&mut self, book: &mut Book, kv: &mut B::KvStore, batch: &[BatchSeq<'_>], logits: &mut Vec<f32>) -> Result<usize> {
        let Self { backend, dims: d, output, embed, mtp, .. } = self;
        let m = mtp.as_deref_mut().ok_or(Error::Internal("the model has no MTP head"))?;
        let Mtp { layer, eh_proj, enorm, hnorm, head_norm, head, buf: b, step, input, e, h: hn, cat, hidden, lora } = m;
        let Mixer::Attention(a) = &layer.mixer else { return Err(Error::Internal("the MTP layer has no attention")) };
        let n: usize = batch.iter().map(|s| s.tokens.len()).sum();
        let (h, q_out, kv_out, inter) = (d.hidden, d.heads * d.head_dim, d.kv_heads * d.head_dim, d.inter);
        if kv.width() != kv_out || kv.layers() != 1 || kv.state_floats() != 0 {
            return Err(Error::Internal("the MTP cache was made for another model"));
        }
        check_block_size(book.block_size())?;
        for (buf, len) in [(&mut b.x, h), (&mut b.xn, h), (&mut b.q, q_out), (&mut b.k, kv_out), (&mut b.v, kv_out), (&mut b.att, q_out), (&mut b.y, h), (&mut b.g, inter), (&mut b.u, inter), (&mut b.qg, 2 * q_out), (&mut b.gate, q_out)] {
            B::reserve(buf, n * len);
        }
        for (buf, len) in [(&mut *e, h), (&mut *hn, h), (&mut *cat, 2 * h), (&mut *hidden, h)] {
            B::reserve(buf, n * len);
        }
        plan(book, batch, step)?;
        backend.embed(embed, batch.iter().flat_map(|s| s.tokens.iter().copied()), h, e);
        let all: Vec<usize> = (0..n).collect();
        backend.rms_norm_rows(e, &all, enorm, d.eps, &mut b.xn);
        backend.rms_norm_rows(input, &all, hnorm, d.eps, hn);
        backend.concat_rows(&b.xn, h, hn, h, n, cat);
        backend.linear_rows(eh_proj, cat, n, true, &mut b.x)?;
        let lo = LoraCtx { adapters: lora, uses: &[] };
        Self::attention(backend, d, (0, layer, a), b, false, n, true, (&lo, step), kv)?;
        Self::mlp(backend, d, (0, layer), b, n, true, (&lo, step))?;
        backend.add(&mut b.x, &b.y, n * h);
        backend.rms_norm_rows(&b.x, &all, head_norm, d.eps, hidden);
        let rows = step.out_rows.len();
        backend.rms_norm_rows(&b.x, &step.out_rows, head_norm, d.eps, &mut b.xn);
        backend.logits(head.as_ref().unwrap_or(output), &b.xn, rows, true, d.softcap, logits)?;
        Ok(rows)
    }
}

impl LlamaModel {
    /// Whether the checkpoint has an MTP head (`mtp.rs`) this model loaded.
    pub fn has_mtp(&self) -> bool {
        self.net.mtp.is_some()
    }

    /// A cache for the MTP head's keys and values ([`mtp_forward`](Self::mtp_forward)):
    /// one layer, no recurrent state. Errors without a head.
    pub fn new_mtp_cache(&self, opts: KvOptions) -> Result<KvCache> {
        if !self.has_mtp() {
            return Err(Error::Config("the model has no MTP head".into()));
        }
        check_block_size(opts.block_size)?;
        self.check_kv_dtype(opts.dtype)?;
        KvCache::new(1, self.cfg.num_kv_heads * self.cfg.head_dim, opts)
    }

    /// Keep, after every forward of the main model, the output-normed hidden state of each
    /// row ([`hidden`](Self::hidden)): the MTP head's input.
    pub fn set_keep_hidden(&mut self, on: bool) {
        self.net.keep_hidden = on;
    }

    /// With [`set_keep_hidden`](Self::set_keep_hidden): the output-normed hidden states of
    /// the first `rows` rows of the last forward (`rows x hidden`); `None` past what it kept.
    pub fn hidden(&self, rows: usize) -> Option<&[f32]> {
        self.net.hidden.get(..rows * self.cfg.hidden_size).filter(|_| self.net.keep_hidden)
    }

    /// Keep a hybrid's recurrent state after each row of every sequence that asks for
    /// every row's logits in fewer rows than the chunked form takes (a speculative
    /// verification step), so that [`KvCache::rollback_state`] can undo rejected guesses.
    pub fn set_keep_row_states(&mut self, on: bool) {
        self.net.keep_rows = on;
    }

    /// The MTP head over `batch` in `kv` (from [`new_mtp_cache`](Self::new_mtp_cache)),
    /// appended as [`forward_batch`](Self::forward_batch) appends: each token at the next
    /// position of its sequence, with `hidden` its row of the main model's output-normed
    /// hidden state at the position before (`tokens x hidden`, batch order; zeros for
    /// position 0), or the head's own [`mtp_hidden`](Self::mtp_hidden) when it drafts on.
    /// Logits of the rows asked for go into `out`; returns their number.
    pub fn mtp_forward(&mut self, kv: &mut KvCache, batch: &[BatchSeq<'_>], hidden: &[f32], out: &mut Vec<f32>) -> Result<usize> {
        self.check_batch(kv, batch, &[])?;
        let n: usize = batch.iter().map(|s| s.tokens.len()).sum();
        let m = self.net.mtp.as_deref_mut().ok_or(Error::Internal("the model has no MTP head"))?;
        let hs = hidden.get(..n * self.cfg.hidden_size).ok_or(Error::Config(format!("{} hidden values for {n} MTP rows", hidden.len())))?;
        m.input.clear();
        m.input.extend_from_slice(hs);
        for s in batch {
            kv.reserve(s.seq, s.tokens.len())?;
        }
        let (book, store) = kv.parts();
        let rows = self.net.mtp_forward(book, store, batch, out)?;
        for s in batch {
            let len = kv.len(s.seq)? + s.tokens.len();
            kv.set_len(s.seq, len)?;
        }
        Ok(rows)
    }

    /// The MTP head's output-normed hidden states of the first `rows` rows of its last
    /// forward: the hidden input of its next guess.
    pub fn mtp_hidden(&self, rows: usize) -> Option<&[f32]> {
        self.net.mtp.as_ref().and_then(|m| m.hidden.get(..rows * self.cfg.hidden_size))
    }
}
