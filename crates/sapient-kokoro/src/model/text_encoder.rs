//! Kokoro's `TextEncoder`: embedding, `n_layer` x (conv, channel layer norm, LeakyReLU 0.2),
//! then a bidirectional LSTM. No masking is needed for one unpadded utterance.

use super::nn::{leaky_relu, BiLstm, Conv1d, LayerNorm};
use crate::{KokoroConfig, KokoroWeights, Result};
use candle_core::Tensor;

pub struct TextEncoder {
    embedding: Tensor,
    cnn: Vec<(Conv1d, LayerNorm)>,
    lstm: BiLstm,
}

impl TextEncoder {
    pub fn load(w: &KokoroWeights, cfg: &KokoroConfig) -> Result<Self> {
        let k = cfg.text_encoder_kernel_size;
        let cnn = (0..cfg.n_layer)
            .map(|i| -> Result<_> {
                Ok((
                    Conv1d::load(w, &format!("text_encoder.cnn.{i}.0"), true, 1, (k - 1) / 2, 1)?,
                    LayerNorm::load(w, &format!("text_encoder.cnn.{i}.1.gamma"), &format!("text_encoder.cnn.{i}.1.beta"), 1e-5)?,
                ))
            })
            .collect::<Result<_>>()?;
        Ok(Self {
            embedding: w.get("text_encoder.embedding.weight")?.clone(),
            cnn,
            lstm: BiLstm::load(w, "text_encoder.lstm")?,
        })
    }

    /// `ids` (padded) `[t]` -> `[hidden, t]`.
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let mut x = self.embedding.index_select(ids, 0)?.t()?.contiguous()?; // [c, t]
        for (conv, ln) in &self.cnn {
            let y = conv.forward(&x)?;
            let y = ln.forward(&y.t()?)?; // over channels
            x = leaky_relu(&y, 0.2)?.t()?.contiguous()?;
        }
        Ok(self.lstm.forward(&x.t()?.contiguous()?)?.t()?.contiguous()?)
    }
}
