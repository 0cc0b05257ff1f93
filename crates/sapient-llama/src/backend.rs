//! The seam between the model and the hardware it runs on.
//!
//! `model.rs` writes the transformer once (which weights a layer has, the order of the
//! operations, what each architecture adds) against [`Backend`]: a small set of operations
//! on rows of activations (linear layers alone or several on the same input, RMSNorm, RoPE,
//! writing keys and values into the paged KV cache and attending over it, the gated MLP
//! activation, residual adds, embedding rows, logits), and the forms a backend keeps weights
//! in (`Lin`, `Vector`, `Embed`), made from the loaded weights. The CPU backend (`cpu.rs`) is
//! the only one; the model is generic over the trait and monomorphized, so the seam costs
//! nothing at run time. A CUDA or Metal backend would implement the same trait, with its
//! buffers and its KV cache storage ([`Backend::KvStore`]) on the device; until one exists, loading on such a
//! device is [`Error::NoBackend`](crate::Error::NoBackend).
//!
//! Operations take `n` rows of activations of a known width, stored row-major in a `Buf`;
//! `len` arguments count values (`rows x width`). What rows a step has, where they sit in
//! their sequences and in the cache, is the [`Step`], made by the model from the KV cache's
//! block tables.

use crate::config::{Activation, DeltaShape};
use crate::kv::{KvStorage, SeqId};
use crate::moe::Experts;
use crate::Result;
use sapient_tensor::{GgmlType, MappedBytes, Weight};

/// Shapes and constants of the forward pass.
#[derive(Clone)]
pub(crate) struct Dims {
    pub hidden: usize,
    pub inter: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub rope_dim: usize,
    pub interleaved: bool,
    pub eps: f32,
    pub vocab: usize,
    /// Attention scores scale.
    pub attn_scale: f32,
    /// Embedding rows multiplied by this (Gemma).
    pub embed_scale: Option<f32>,
    pub activation: Activation,
    /// Final logits become `cap * tanh(logits / cap)`.
    pub softcap: Option<f32>,
}

/// One sequence's rows in a step: rows `row0..row0 + n` at positions `start..start + n`,
/// its block table at `tabs[tab0..tab0 + tabn]` of the [`Step`].
#[derive(Clone, Copy)]
pub(crate) struct Seg {
    pub seq: SeqId,
    pub row0: usize,
    pub n: usize,
    pub start: usize,
    pub tab0: usize,
    pub tabn: usize,
    /// It asks for every row's logits (a speculative verification step): with
    /// [`Step::keep_rows`], a hybrid keeps the recurrent state after each of its rows.
    pub keep: bool,
}

/// Where one forward step's rows go.
#[derive(Default)]
pub(crate) struct Step {
    /// Per row: its position in its sequence and its slot in the KV cache.
    pub pos: Vec<usize>,
    pub slot: Vec<usize>,
    /// Per sequence of the batch, and their block tables one after another.
    pub segs: Vec<Seg>,
    pub tabs: Vec<u32>,
    /// Rows whose logits are wanted.
    pub out_rows: Vec<usize>,
    /// Keep the recurrent state after each row of the sequences marked [`Seg::keep`]
    /// that take the recurrence position by position, for rolling back rejected guesses.
    pub keep_rows: bool,
}

/// The small weights of a linear-attention layer in a backend's form, with where its state
/// starts in a sequence's.
pub(crate) struct DeltaVectors<V> {
    pub shape: DeltaShape,
    /// Offset of this layer's stretch in a sequence's state.
    pub offset: usize,
    /// `[conv dim][conv_kernel]`
    pub conv: V,
    pub dt_bias: V,
    /// `-exp(A_log)` per value head.
    pub a: V,
    /// The gated RMSNorm's weight (`head_dim`).
    pub norm: V,
}

/// The projections [`Backend::delta_net`] reads, `n` rows each.
pub(crate) struct DeltaInputs<'a, T> {
    /// `conv dim` a row.
    pub qkv: &'a T,
    /// `value dim` a row.
    pub z: &'a T,
    /// `v_heads` a row each.
    pub beta: &'a T,
    pub alpha: &'a T,
}

/// Which RoPE table a layer uses.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum RopeTable {
    /// The model's base frequency.
    Main,
    /// The sliding-window layers' own base (Gemma 3).
    SlidingWindow,
}

/// One adapter's part of a layer's product: its pair, its scale (alpha and rank included),
/// and the rows it applies to.
pub(crate) struct LoraWork<'a> {
    pub rank: usize,
    pub a: &'a [f32],
    pub b: &'a [f32],
    pub scale: f32,
    pub rows: Vec<std::ops::Range<usize>>,
}

/// The operations the model is written in (see the module documentation).
pub(crate) trait Backend {
    /// Rows of f32 activations.
    type Buf: Default;
    /// A linear layer: weight `[out, in]` and optional bias.
    type Lin;
    /// A weight vector (norms).
    type Vector;
    /// The token embedding table.
    type Embed;
    /// The memory of a paged KV cache in this backend's form (host memory for the CPU): the
    /// layers' keys and values by block and the sequences' recurrent states. Its bookkeeping
    /// (block tables, lengths, prefix hashes) is the backend-independent [`crate::kv::Book`];
    /// the storage does what that asks ([`KvStorage::apply`]).
    type KvStore: KvStorage;

    /// A linear layer from a loaded `[out, in]` weight named `name` (for errors and logs).
    fn linear(&self, w: Weight, bias: Option<Vec<f32>>, name: &str) -> Result<Self::Lin>;
    /// A linear layer reading `[rows, cols]` blocks of format `ty` (ggml's layout) in place
    /// from `blocks`, a view of the memory-mapped file (the experts of a mixture, most of its
    /// bytes): `None` where this backend does not multiply that format in place (the caller
    /// then loads a copy). MXFP4 has no other way in.
    #[allow(clippy::too_many_arguments)]
    fn linear_mapped(&self, ty: GgmlType, rows: usize, cols: usize, blocks: MappedBytes, bias: Option<Vec<f32>>, name: &str) -> Result<Option<Self::Lin>>;
    fn vector(&self, v: Vec<f32>) -> Self::Vector;
    /// The embedding table from a loaded `[vocab, hidden]` weight.
    fn embedding(&self, w: &Weight, name: &str) -> Result<Self::Embed>;
    /// `out[r] += scale * B (A x[r])` for the rows of each LoRA adapter's work,
    /// `x` `in_w` wide and `out` `out_w` wide: each adapter's low-rank product over the rows
    /// of the sequences that chose it. (The adapters' matrices are host f32: a device backend
    /// would keep copies of its own.)
    fn lora_rows(&mut self, x: &Self::Buf, in_w: usize, out: &mut Self::Buf, out_w: usize, work: &[LoraWork<'_>]);
    /// `(out, in)` of a linear layer.
    fn lin_shape(l: &Self::Lin) -> (usize, usize);
    fn vector_len(v: &Self::Vector) -> usize;
    /// Rows of `width` values the table holds.
    fn embed_rows(e: &Self::Embed, width: usize) -> usize;
    /// Every weight is loaded: a last pass over them (the CPU backend packs the quantized
    /// matrices for its kernels and asks for huge pages).
    fn loaded(&self, lins: Vec<&mut Self::Lin>, embed: &mut Self::Embed);
    /// Make `b` hold at least `len` values.
    fn reserve(b: &mut Self::Buf, len: usize);

    /// The embedding rows of `tokens` (all below the table's rows), `width` values each.
    fn embed(&mut self, e: &Self::Embed, tokens: impl Iterator<Item = u32>, width: usize, out: &mut Self::Buf);
    /// `out = x W^T + b` for `n` rows. `exact`: every row's result as it is alone, whatever
    /// the batch (else long batches may take a faster product whose sums depend on them).
    fn linear_rows(&mut self, l: &Self::Lin, x: &Self::Buf, n: usize, exact: bool, out: &mut Self::Buf) -> Result<()>;
    /// Split each of `n` rows of `x` into consecutive pieces, `outs[i].1` values wide, into
    /// `outs[i].0` (a fused projection's parts).
    fn split_rows(&mut self, x: &Self::Buf, n: usize, outs: &mut [(&mut Self::Buf, usize)]);
    /// `x += y` over `n` rows when `y` is given (a residual), then `xn` = the RMSNorm of `x`
    /// by `w` (its width the rows' width), and the linear layers `ls` (1 to 4) of `xn` into
    /// `outs`, each as [`linear_rows`](Self::linear_rows) gives it; fused where the backend
    /// can.
    #[allow(clippy::too_many_arguments)]
    fn add_norm_linear_group(
        &mut self,
        x: &mut Self::Buf,
        y: Option<&Self::Buf>,
        w: &Self::Vector,
        eps: f32,
        xn: &mut Self::Buf,
        ls: &[&Self::Lin],
        n: usize,
        exact: bool,
        outs: &mut [&mut Self::Buf],
    ) -> Result<()>;
    /// The mixture-of-experts feed-forward of `n` rows of `xn` (normed) given their router
    /// `logits`, into `out` (`moe.rs`): each expert once over all the rows routed to it.
    fn moe(&mut self, experts: &Experts<Self::Lin>, xn: &Self::Buf, logits: &Self::Buf, n: usize, exact: bool, out: &mut Self::Buf) -> Result<()>;
    /// `g = act(g) * u` over `n` rows `width` wide, then [`linear_rows`](Self::linear_rows)
    /// of `g` by `l`; fused where the backend can.
    #[allow(clippy::too_many_arguments)]
    fn glu_linear(&mut self, act: Activation, g: &mut Self::Buf, u: &Self::Buf, width: usize, l: &Self::Lin, n: usize, exact: bool, out: &mut Self::Buf) -> Result<()>;
    /// [`rms_norm`](Self::rms_norm) in place (`w` may be narrower than a row: per head).
    fn rms_norm_in_place(&mut self, x: &mut Self::Buf, w: &Self::Vector, len: usize, eps: f32);
    /// RMSNorm of rows `rows` of `x` (`w`-wide) into consecutive rows of `out`.
    fn rms_norm_rows(&mut self, x: &Self::Buf, rows: &[usize], w: &Self::Vector, eps: f32, out: &mut Self::Buf);
    /// `x *= s` over the first `len` values.
    fn scale(&mut self, x: &mut Self::Buf, len: usize, s: f32);
    /// `x += y` over the first `len` values.
    fn add(&mut self, x: &mut Self::Buf, y: &Self::Buf, len: usize);
    /// RoPE on each head of the step's query rows (`heads x head dim` each) and key rows
    /// (`kv heads x head dim`), at each row's position, then the keys and the values into
    /// their slots of layer `layer`'s cache; one pass over each row where the backend can.
    #[allow(clippy::too_many_arguments)]
    fn rope_write_kv(&mut self, kv: &mut Self::KvStore, layer: usize, q: &mut Self::Buf, k: &mut Self::Buf, v: &Self::Buf, step: &Step, table: RopeTable);
    /// Causal grouped-query attention of the step's queries over their sequences' cached keys
    /// and values in layer `layer` (within `window` positions when it is set), with a learned
    /// sink logit per head in each softmax's denominator when `sinks` is given.
    #[allow(clippy::too_many_arguments)]
    fn attention(&mut self, kv: &Self::KvStore, layer: usize, window: Option<usize>, sinks: Option<&Self::Vector>, q: &Self::Buf, step: &Step, out: &mut Self::Buf);
    /// Logits of `rows` rows of `x` through the output layer into `out` (`rows x vocab`,
    /// resized), soft-capped when `softcap` is set.
    fn logits(&mut self, output: &Self::Lin, x: &Self::Buf, rows: usize, exact: bool, softcap: Option<f32>, out: &mut Vec<f32>) -> Result<()>;
    /// Compute logits only for token ids `0..first` and `extra` (the others `-inf`), or for
    /// all again with `None`; returns whether they are restricted now.
    fn restrict_logits(&mut self, output: &Self::Lin, keep: Option<(usize, &[u32])>) -> Result<bool>;

    /// Per head, split `n` rows of a query-and-gate projection (`heads x [query | gate]`,
    /// `head_dim` each) into queries `q` and output gates `gate` (`heads x head_dim` a row).
    fn split_query_gate(&mut self, qg: &Self::Buf, n: usize, heads: usize, head_dim: usize, q: &mut Self::Buf, gate: &mut Self::Buf);
    /// `x *= sigmoid(g)` over the first `len` values (gated attention's output gate).
    fn mul_sigmoid(&mut self, x: &mut Self::Buf, g: &Self::Buf, len: usize);
    /// The Gated DeltaNet of a linear-attention layer over the step's rows (`deltanet.rs`):
    /// from its projections `p` to the gated-norm output of its value heads in `out`
    /// (`value dim` a row), each sequence's recurrent state in `kv` updated in place.
    fn delta_net(&mut self, kv: &mut Self::KvStore, w: &DeltaVectors<Self::Vector>, p: DeltaInputs<'_, Self::Buf>, step: &Step, out: &mut Self::Buf) -> Result<()>;
    /// Each of `n` rows of `out` becomes the row of `a` (`wa` wide) followed by the row of
    /// `b` (`wb` wide) (the MTP head's input).
    #[allow(clippy::too_many_arguments)]
    fn concat_rows(&mut self, a: &Self::Buf, wa: usize, b: &Self::Buf, wb: usize, n: usize, out: &mut Self::Buf);
}
