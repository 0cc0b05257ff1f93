//! Kokoro's `TextEncoder`: embedding, `n_layer` x (conv, channel layer norm, LeakyReLU 0.2),
//! then a bidirectional LSTM. No masking is needed for one unpadded utterance.

use super::fast;
use super::nn::{BiLstm, Conv1d, LayerNorm};
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
            embedding: w.get("text_encoder.embedding.weight")?,
            cnn,
            lstm: BiLstm::load(w, "text_encoder.lstm")?,
        })
    }

    /// `ids` (padded) -> time-major `[t, hidden]`.
    pub fn forward(&self, ids: &[u32]) -> Result<Vec<f32>> {
        let (vocab, c) = self.embedding.dims2()?;
        let emb: Vec<f32> = self.embedding.flatten_all()?.to_vec1()?;
        let t = ids.len();
        let mut x = Vec::with_capacity(t * c);
        for &id in ids {
            let id = id as usize;
            if id >= vocab {
                return Err(crate::Error::Input(format!("phoneme id {id} is outside the text encoder's vocabulary ({vocab})")));
            }
            x.extend_from_slice(&emb[id * c..(id + 1) * c]);
        }
        for (conv, ln) in &self.cnn {
            let (mut y, _) = conv.forward_tc(&x, t)?;
            ln.rows(&mut y); // over channels
            fast::leaky_relu_in_place(&mut y, 0.2);
            x = y;
        }
        self.lstm.forward_vec(&x, t)
    }
}
