//! What every encoder shares: layer normalization and full (bidirectional) self-attention,
//! used by Whisper (its encoder, and the decoder's norms), the sentence embedders (BERT,
//! nomic-bert) and Kokoro's ALBERT, so each exists once.
//!
//! - [`LayerNorm`] / [`layer_norm`]: statistics accumulated in f64 (exact to the rounding of
//!   the result whatever the row's scale), AVX-512 where rows are a multiple of 16 values;
//!   rows over the kernel pool when there are many.
//! - [`self_attention`]: `softmax(scale · q kᵀ) v` per head of each of several sequences
//!   packed in one buffer (each attends to itself only, so a batch of sentences needs no
//!   padding or mask). Short sequences run one unit of the pool per (sequence, head) with the
//!   keys transposed in L1 ([`short`]); long ones (Whisper's 1500 frames, long documents) run
//!   per sequence on the kernel fitted to the CPU: AMX-BF16 products, the fused AVX-512 f32
//!   kernel ([`crate::kernels::attention_f32`]) for heads of 64, or blocks of query rows as
//!   two `gemm` products per head ([`head_attention`]).

mod attention;
mod norm;
mod short;

pub use attention::{head_attention, self_attention, AttentionScratch, LONG_SEQUENCE};
pub use norm::{layer_norm, LayerNorm};

#[cfg(test)]
mod tests;
