//! What the weights of a layer are called in GGUF files and in Hugging Face checkpoints.

use crate::config::WeightLayout;

pub(crate) struct Names {
    pub layout: WeightLayout,
}

impl Names {
    pub fn embed(&self) -> String {
        match self.layout {
            WeightLayout::Gguf => "token_embd.weight".into(),
            WeightLayout::HuggingFace => "model.embed_tokens.weight".into(),
        }
    }
    pub fn output_norm(&self) -> String {
        match self.layout {
            WeightLayout::Gguf => "output_norm.weight".into(),
            WeightLayout::HuggingFace => "model.norm.weight".into(),
        }
    }
    pub fn output(&self) -> String {
        match self.layout {
            WeightLayout::Gguf => "output".into(),
            WeightLayout::HuggingFace => "lm_head".into(),
        }
    }
    /// Prefix (without `.weight`) of a per-layer tensor.
    pub fn layer(&self, i: usize, what: &str) -> String {
        match self.layout {
            WeightLayout::Gguf => format!("blk.{i}.{what}"),
            WeightLayout::HuggingFace => {
                let hf = match what {
                    "attn_norm" => "input_layernorm",
                    "ffn_norm" => "post_attention_layernorm",
                    "attn_q" => "self_attn.q_proj",
                    "attn_k" => "self_attn.k_proj",
                    "attn_v" => "self_attn.v_proj",
                    "attn_qkv" => "self_attn.qkv_proj",
                    "attn_output" => "self_attn.o_proj",
                    "ffn_gate" => "mlp.gate_proj",
                    "ffn_up" => "mlp.up_proj",
                    "ffn_gate_up" => "mlp.gate_up_proj",
                    "ffn_down" => "mlp.down_proj",
                    "attn_q_norm" => "self_attn.q_norm",
                    "attn_k_norm" => "self_attn.k_norm",
                    other => other,
                };
                format!("model.layers.{i}.{hf}")
            }
        }
    }
}
