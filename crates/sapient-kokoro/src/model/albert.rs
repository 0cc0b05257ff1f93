//! PL-BERT: transformers' `AlbertModel` (one shared layer run `num_hidden_layers` times),
//! its last hidden state only (no pooler), with every position attended (one utterance), on
//! plain time-major buffers: the products on [`DenseMatrix`](sapient_tensor::kernels::DenseMatrix)
//! (query, key and value as one), attention per head on the kernels' pool.

use super::nn::{LayerNorm, Linear};
use crate::{Error, KokoroConfig, KokoroWeights, Result};
use sapient_tensor::encoder;
use sapient_tensor::kernels::{exp_in_place, pool::pool};

pub struct Albert {
    word: Vec<f32>,
    pos: Vec<f32>,
    token_type0: Vec<f32>,
    emb: usize,
    vocab: usize,
    max_pos: usize,
    emb_ln: LayerNorm,
    mapping_in: Linear,
    qkv: Linear,
    dense: Linear,
    attn_ln: LayerNorm,
    ffn: Linear,
    ffn_out: Linear,
    full_ln: LayerNorm,
    heads: usize,
    layers: usize,
}

fn vec_of(w: &KokoroWeights, name: &str) -> Result<(Vec<f32>, usize, usize)> {
    let t = w.get(name)?;
    let (r, c) = t.dims2()?;
    Ok((t.flatten_all()?.to_vec1()?, r, c))
}

impl Albert {
    pub fn load(w: &KokoroWeights, cfg: &KokoroConfig) -> Result<Self> {
        let l = "bert.encoder.albert_layer_groups.0.albert_layers.0";
        let ln = |m: &str| LayerNorm::load(w, &format!("{m}.weight"), &format!("{m}.bias"), 1e-12);
        let lin = |m: &str| Linear::load(w, m, true);
        let (word, vocab, emb) = vec_of(w, "bert.embeddings.word_embeddings.weight")?;
        let (pos, max_pos, _) = vec_of(w, "bert.embeddings.position_embeddings.weight")?;
        let (tt, _, _) = vec_of(w, "bert.embeddings.token_type_embeddings.weight")?;
        // query, key and value as one [3 hidden, hidden] product
        let mut qkv_w = Vec::new();
        let mut qkv_b = Vec::new();
        let mut hidden = 0;
        for m in ["query", "key", "value"] {
            let (v, _, c) = vec_of(w, &format!("{l}.attention.{m}.weight"))?;
            hidden = c;
            qkv_w.extend(v);
            qkv_b.extend(w.get(&format!("{l}.attention.{m}.bias"))?.flatten_all()?.to_vec1::<f32>()?);
        }
        let heads = cfg.plbert.num_attention_heads;
        if heads == 0 || hidden % heads != 0 {
            return Err(Error::Input(format!("ALBERT: {hidden} hidden values do not split into {heads} heads")));
        }
        Ok(Self {
            token_type0: tt[..emb].to_vec(),
            word,
            pos,
            emb,
            vocab,
            max_pos,
            emb_ln: ln("bert.embeddings.LayerNorm")?,
            mapping_in: lin("bert.encoder.embedding_hidden_mapping_in")?,
            qkv: Linear::from_parts(&qkv_w, 3 * hidden, hidden, Some(qkv_b)),
            dense: lin(&format!("{l}.attention.dense"))?,
            attn_ln: ln(&format!("{l}.attention.LayerNorm"))?,
            ffn: lin(&format!("{l}.ffn"))?,
            ffn_out: lin(&format!("{l}.ffn_output"))?,
            full_ln: ln(&format!("{l}.full_layer_layer_norm"))?,
            heads,
            layers: cfg.plbert.num_hidden_layers,
        })
    }

    /// `ids` (padded) -> `[t, hidden]` (time-major).
    pub fn forward(&self, ids: &[u32]) -> Result<Vec<f32>> {
        let t = ids.len();
        let e = self.emb;
        if t > self.max_pos {
            return Err(Error::Input(format!("{t} ids, ALBERT has {} positions", self.max_pos)));
        }
        let mut x = vec![0f32; t * e];
        for (i, (row, &id)) in x.chunks_exact_mut(e).zip(ids).enumerate() {
            let id = id as usize;
            if id >= self.vocab {
                return Err(Error::Input(format!("phoneme id {id} is outside ALBERT's vocabulary ({})", self.vocab)));
            }
            let (wr, pr) = (&self.word[id * e..(id + 1) * e], &self.pos[i * e..(i + 1) * e]);
            for (((o, &a), &b), &c) in row.iter_mut().zip(wr).zip(pr).zip(&self.token_type0) {
                *o = a + b + c;
            }
        }
        self.emb_ln.rows(&mut x);
        let mut h = self.mapping_in.forward_vec(&x, t, e)?;
        let hidden = self.mapping_in.out_features();
        let hd = hidden / self.heads;
        let scale = 1.0 / (hd as f32).sqrt();
        let mut scratch = encoder::AttentionScratch::default();
        for _ in 0..self.layers {
            let qkv = self.qkv.forward_vec(&h, t, hidden)?;
            let mut ctx = vec![0f32; t * hidden];
            encoder::self_attention(&qkv, std::slice::from_ref(&(0..t)), self.heads, hd, scale, &mut ctx, &mut scratch);
            let mut a = self.dense.forward_vec(&ctx, t, hidden)?;
            for (v, r) in a.iter_mut().zip(&h) {
                *v += r;
            }
            self.attn_ln.rows(&mut a);
            let mut f = self.ffn.forward_vec(&a, t, hidden)?;
            gelu_tanh_in_place(&mut f);
            let mut o = self.ffn_out.forward_vec(&f, t, self.ffn.out_features())?;
            for (v, r) in o.iter_mut().zip(&a) {
                *v += r;
            }
            self.full_ln.rows(&mut o);
            h = o;
        }
        Ok(h)
    }
}

/// GELU, tanh form (`gelu_new`, candle's `gelu`): `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`,
/// with `tanh(u) = 1 - 2 / (exp(2u) + 1)`.
fn gelu_tanh_in_place(x: &mut [f32]) {
    const ROWS: usize = 4096;
    pool().for_each_chunk_mut(x, ROWS, |_, c| {
        let mut e: Vec<f32> = c.iter().map(|&v| 2.0 * 0.797_884_6 * v.mul_add(0.044_715 * v * v, v)).collect();
        exp_in_place(&mut e);
        for (v, &e) in c.iter_mut().zip(&e) {
            let th = 1.0 - 2.0 / (e + 1.0);
            *v = 0.5 * *v * (1.0 + th);
        }
    });
}
