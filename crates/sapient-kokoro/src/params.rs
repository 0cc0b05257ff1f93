//! Every parameter of Kokoro's PyTorch model (`kokoro.KModel`) with its shape, derived from the
//! config: the names and layouts the ONNX import writes and the model loads.
//!
//! Names are `KModel.state_dict()` names: `bert.*` (transformers' `AlbertModel`),
//! `bert_encoder.*`, `predictor.*`, `text_encoder.*`, `decoder.*`. Convolutions under
//! `weight_norm` are listed as one folded `weight` (what inference uses and what the ONNX
//! export holds) and flagged [`ParamSpec::weight_norm`]: a PyTorch checkpoint stores them as
//! `weight_g` (shape `[out, 1, 1]`) and `weight_v` (the weight's shape) instead.
//! `bert.pooler.*` is listed as [`ParamSpec::optional`]: `KModel` never runs the pooler, so
//! the ONNX export does not have it.

use crate::config::KokoroConfig;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamSpec {
    pub name: String,
    pub shape: Vec<usize>,
    /// A weight-normed convolution's weight (folded here; `weight_g`/`weight_v` in PyTorch).
    pub weight_norm: bool,
    /// Not needed for inference (absent from the ONNX export).
    pub optional: bool,
}

struct List(Vec<ParamSpec>);

impl List {
    fn p(&mut self, name: String, shape: &[usize]) {
        self.0.push(ParamSpec {
            name,
            shape: shape.to_vec(),
            weight_norm: false,
            optional: false,
        });
    }
    fn linear(&mut self, m: &str, inp: usize, out: usize) {
        self.p(format!("{m}.weight"), &[out, inp]);
        self.p(format!("{m}.bias"), &[out]);
    }
    fn layer_norm(&mut self, m: &str, n: usize) {
        self.p(format!("{m}.weight"), &[n]);
        self.p(format!("{m}.bias"), &[n]);
    }
    /// A Conv1d (`transposed`: ConvTranspose1d, weight `[in, out/groups, k]`).
    #[allow(clippy::too_many_arguments)]
    fn conv(&mut self, m: &str, inp: usize, out: usize, k: usize, groups: usize, bias: bool, wn: bool, transposed: bool) {
        let shape = if transposed { [inp, out / groups, k] } else { [out, inp / groups, k] };
        self.0.push(ParamSpec {
            name: format!("{m}.weight"),
            shape: shape.to_vec(),
            weight_norm: wn,
            optional: false,
        });
        if bias {
            self.p(format!("{m}.bias"), &[out]);
        }
    }
    /// A one-layer bidirectional LSTM (PyTorch layout, gates i, f, g, o).
    fn lstm(&mut self, m: &str, inp: usize, hidden: usize) {
        for sfx in ["", "_reverse"] {
            self.p(format!("{m}.weight_ih_l0{sfx}"), &[4 * hidden, inp]);
            self.p(format!("{m}.weight_hh_l0{sfx}"), &[4 * hidden, hidden]);
            self.p(format!("{m}.bias_ih_l0{sfx}"), &[4 * hidden]);
            self.p(format!("{m}.bias_hh_l0{sfx}"), &[4 * hidden]);
        }
    }
    /// `AdaIN1d`/`AdaLayerNorm`: a linear map from the style to a scale and a shift per channel.
    fn adain(&mut self, m: &str, style: usize, channels: usize) {
        self.linear(&format!("{m}.fc"), style, 2 * channels);
    }
    /// `AdainResBlk1d`.
    fn adain_res_blk(&mut self, m: &str, din: usize, dout: usize, style: usize, upsample: bool) {
        self.conv(&format!("{m}.conv1"), din, dout, 3, 1, true, true, false);
        self.conv(&format!("{m}.conv2"), dout, dout, 3, 1, true, true, false);
        self.adain(&format!("{m}.norm1"), style, din);
        self.adain(&format!("{m}.norm2"), style, dout);
        if din != dout {
            self.conv(&format!("{m}.conv1x1"), din, dout, 1, 1, false, true, false);
        }
        if upsample {
            self.conv(&format!("{m}.pool"), din, din, 3, din, true, true, true);
        }
    }
    /// `AdaINResBlock1` (the generator's residual blocks).
    fn adain_res_block1(&mut self, m: &str, ch: usize, k: usize, dilations: usize, style: usize) {
        for (list, n) in [("convs1", dilations), ("convs2", dilations)] {
            for i in 0..n {
                self.conv(&format!("{m}.{list}.{i}"), ch, ch, k, 1, true, true, false);
            }
        }
        for list in ["adain1", "adain2"] {
            for i in 0..dilations {
                self.adain(&format!("{m}.{list}.{i}"), style, ch);
            }
        }
        for list in ["alpha1", "alpha2"] {
            for i in 0..dilations {
                self.p(format!("{m}.{list}.{i}"), &[1, ch, 1]);
            }
        }
    }
}

/// Every parameter of `KModel` for this config, in module order.
pub fn expected_params(cfg: &KokoroConfig) -> Vec<ParamSpec> {
    let mut l = List(Vec::new());
    let b = &cfg.plbert;
    let (h, e) = (b.hidden_size, b.embedding_size);
    // ALBERT
    l.p("bert.embeddings.word_embeddings.weight".into(), &[cfg.n_token, e]);
    l.p("bert.embeddings.position_embeddings.weight".into(), &[b.max_position_embeddings, e]);
    l.p("bert.embeddings.token_type_embeddings.weight".into(), &[b.type_vocab_size, e]);
    l.layer_norm("bert.embeddings.LayerNorm", e);
    l.linear("bert.encoder.embedding_hidden_mapping_in", e, h);
    let layer = "bert.encoder.albert_layer_groups.0.albert_layers.0";
    l.layer_norm(&format!("{layer}.full_layer_layer_norm"), h);
    for proj in ["query", "key", "value", "dense"] {
        l.linear(&format!("{layer}.attention.{proj}"), h, h);
    }
    l.layer_norm(&format!("{layer}.attention.LayerNorm"), h);
    l.linear(&format!("{layer}.ffn"), h, b.intermediate_size);
    l.linear(&format!("{layer}.ffn_output"), b.intermediate_size, h);
    let pooler = l.0.len();
    l.linear("bert.pooler", h, h);
    for p in &mut l.0[pooler..] {
        p.optional = true;
    }
    l.linear("bert_encoder", h, cfg.hidden_dim);

    // prosody predictor
    let (d, s) = (cfg.hidden_dim, cfg.style_dim);
    for i in 0..cfg.n_layer {
        l.lstm(&format!("predictor.text_encoder.lstms.{}", 2 * i), d + s, d / 2);
        l.adain(&format!("predictor.text_encoder.lstms.{}", 2 * i + 1), s, d);
    }
    l.lstm("predictor.lstm", d + s, d / 2);
    l.linear("predictor.duration_proj.linear_layer", d, cfg.max_dur);
    l.lstm("predictor.shared", d + s, d / 2);
    for branch in ["F0", "N"] {
        l.adain_res_blk(&format!("predictor.{branch}.0"), d, d, s, false);
        l.adain_res_blk(&format!("predictor.{branch}.1"), d, d / 2, s, true);
        l.adain_res_blk(&format!("predictor.{branch}.2"), d / 2, d / 2, s, false);
    }
    l.conv("predictor.F0_proj", d / 2, 1, 1, 1, true, false, false);
    l.conv("predictor.N_proj", d / 2, 1, 1, 1, true, false, false);

    // text encoder
    l.p("text_encoder.embedding.weight".into(), &[cfg.n_token, d]);
    for i in 0..cfg.n_layer {
        l.conv(&format!("text_encoder.cnn.{i}.0"), d, d, cfg.text_encoder_kernel_size, 1, true, true, false);
        l.p(format!("text_encoder.cnn.{i}.1.gamma"), &[d]);
        l.p(format!("text_encoder.cnn.{i}.1.beta"), &[d]);
    }
    l.lstm("text_encoder.lstm", d, d / 2);

    // iSTFTNet decoder
    let i = &cfg.istftnet;
    let (enc, asr) = (1024, cfg.dim_in);
    l.adain_res_blk("decoder.encode", d + 2, enc, s, false);
    for k in 0..4 {
        let out = if k == 3 { 512 } else { enc };
        l.adain_res_blk(&format!("decoder.decode.{k}"), enc + 2 + asr, out, s, k == 3);
    }
    l.conv("decoder.F0_conv", 1, 1, 3, 1, true, true, false);
    l.conv("decoder.N_conv", 1, 1, 3, 1, true, true, false);
    l.conv("decoder.asr_res.0", d, asr, 1, 1, true, true, false);
    let g = "decoder.generator";
    l.linear(&format!("{g}.m_source.l_linear"), 9, 1);
    let n_up = i.upsample_rates.len();
    let nfft2 = i.gen_istft_n_fft + 2;
    for u in 0..n_up {
        let c = i.upsample_initial_channel >> (u + 1);
        if u + 1 < n_up {
            let stride: usize = i.upsample_rates[u + 1..].iter().product();
            l.conv(&format!("{g}.noise_convs.{u}"), nfft2, c, 2 * stride, 1, true, false, false);
        } else {
            l.conv(&format!("{g}.noise_convs.{u}"), nfft2, c, 1, 1, true, false, false);
        }
    }
    for u in 0..n_up {
        let c = i.upsample_initial_channel >> (u + 1);
        let k = if u + 1 < n_up { 7 } else { 11 };
        l.adain_res_block1(&format!("{g}.noise_res.{u}"), c, k, 3, s);
    }
    for (u, &k) in i.upsample_kernel_sizes.iter().enumerate() {
        let (cin, cout) = (i.upsample_initial_channel >> u, i.upsample_initial_channel >> (u + 1));
        l.conv(&format!("{g}.ups.{u}"), cin, cout, k, 1, true, true, true);
    }
    let mut r = 0;
    for u in 0..n_up {
        let c = i.upsample_initial_channel >> (u + 1);
        for (k, dil) in i.resblock_kernel_sizes.iter().zip(&i.resblock_dilation_sizes) {
            l.adain_res_block1(&format!("{g}.resblocks.{r}"), c, *k, dil.len(), s);
            r += 1;
        }
    }
    let c = i.upsample_initial_channel >> n_up;
    l.conv(&format!("{g}.conv_post"), c, nfft2, 7, 1, true, true, false);
    l.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_shapes_non_empty() {
        let p = expected_params(&KokoroConfig::v1_0());
        let mut names: Vec<_> = p.iter().map(|p| p.name.as_str()).collect();
        names.sort();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n);
        assert!(p.iter().all(|p| p.shape.iter().all(|&d| d > 0)));
        // the ALBERT pooler is the only optional module
        assert!(p.iter().filter(|p| p.optional).all(|p| p.name.starts_with("bert.pooler.")));
    }
}
