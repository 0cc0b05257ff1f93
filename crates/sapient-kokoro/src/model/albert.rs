//! PL-BERT: transformers' `AlbertModel` (one shared layer run `num_hidden_layers` times),
//! its last hidden state only (no pooler), with every position attended (one utterance).

use super::nn::{LayerNorm, Linear};
use crate::{KokoroConfig, KokoroWeights, Result};
use candle_core::{Tensor, D};

pub struct Albert {
    word: Tensor,
    pos: Tensor,
    token_type0: Tensor,
    emb_ln: LayerNorm,
    mapping_in: Linear,
    q: Linear,
    k: Linear,
    v: Linear,
    dense: Linear,
    attn_ln: LayerNorm,
    ffn: Linear,
    ffn_out: Linear,
    full_ln: LayerNorm,
    heads: usize,
    layers: usize,
}

impl Albert {
    pub fn load(w: &KokoroWeights, cfg: &KokoroConfig) -> Result<Self> {
        let l = "bert.encoder.albert_layer_groups.0.albert_layers.0";
        let ln = |m: &str| LayerNorm::load(w, &format!("{m}.weight"), &format!("{m}.bias"), 1e-12);
        let lin = |m: &str| Linear::load(w, m, true);
        Ok(Self {
            word: w.get("bert.embeddings.word_embeddings.weight")?.clone(),
            pos: w.get("bert.embeddings.position_embeddings.weight")?.clone(),
            token_type0: w.get("bert.embeddings.token_type_embeddings.weight")?.narrow(0, 0, 1)?,
            emb_ln: ln("bert.embeddings.LayerNorm")?,
            mapping_in: lin("bert.encoder.embedding_hidden_mapping_in")?,
            q: lin(&format!("{l}.attention.query"))?,
            k: lin(&format!("{l}.attention.key"))?,
            v: lin(&format!("{l}.attention.value"))?,
            dense: lin(&format!("{l}.attention.dense"))?,
            attn_ln: ln(&format!("{l}.attention.LayerNorm"))?,
            ffn: lin(&format!("{l}.ffn"))?,
            ffn_out: lin(&format!("{l}.ffn_output"))?,
            full_ln: ln(&format!("{l}.full_layer_layer_norm"))?,
            heads: cfg.plbert.num_attention_heads,
            layers: cfg.plbert.num_hidden_layers,
        })
    }

    /// `ids` (padded) `[t]` -> `[t, hidden]`.
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let t = ids.dims1()?;
        let x = self
            .word
            .index_select(ids, 0)?
            .add(&self.pos.narrow(0, 0, t)?)?
            .broadcast_add(&self.token_type0)?;
        let mut x = self.mapping_in.forward(&self.emb_ln.forward(&x)?)?;
        let hidden = x.dims2()?.1;
        let hd = hidden / self.heads;
        let scale = 1.0 / (hd as f64).sqrt();
        for _ in 0..self.layers {
            let split = |y: Tensor| -> Result<Tensor> { Ok(y.reshape((t, self.heads, hd))?.transpose(0, 1)?.contiguous()?) };
            let q = (split(self.q.forward(&x)?)? * scale)?;
            let k = split(self.k.forward(&x)?)?;
            let v = split(self.v.forward(&x)?)?;
            let scores = q.matmul(&k.transpose(1, 2)?)?;
            let probs = softmax_last(&scores)?;
            let ctx = probs.matmul(&v)?.transpose(0, 1)?.reshape((t, hidden))?;
            let a = self.attn_ln.forward(&(self.dense.forward(&ctx)? + &x)?)?;
            let f = self.ffn_out.forward(&self.ffn.forward(&a)?.gelu()?)?;
            x = self.full_ln.forward(&(f + a)?)?;
        }
        Ok(x)
    }
}

fn softmax_last(x: &Tensor) -> Result<Tensor> {
    let m = x.max_keepdim(D::Minus1)?;
    let e = x.broadcast_sub(&m)?.exp()?;
    Ok(e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?)
}
