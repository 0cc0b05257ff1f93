//! Hyper-parameters of a LLaMA-family model, read from GGUF metadata or an HF `config.json`.

use crate::moe::{MoeConfig, MoeStyle};
use crate::{Error, Result};
use sapient_tensor::GgufFile;
use serde::Deserialize;
use std::path::Path;

/// The architectures this crate runs. They share one implementation and differ in details.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen2,
    Mistral,
    Phi3,
    /// Gemma 3: embeddings scaled by sqrt(d), norms before and after attention and MLP,
    /// per-head q/k RMSNorm, GeGLU (tanh GELU), interleaved sliding-window and global layers
    /// with their own RoPE bases. GGUF only.
    Gemma3,
    /// Qwen3: Qwen2's layout with per-head q/k RMSNorm and no QKV bias.
    Qwen3,
    /// Qwen3.5: a hybrid of Gated DeltaNet (linear attention) layers and gated full-attention
    /// layers with q/k RMSNorm and partial RoPE (see [`HybridConfig`]). GGUF only.
    Qwen35,
    /// Qwen3-MoE: Qwen3's attention, a mixture-of-experts feed-forward. GGUF only.
    Qwen3Moe,
    /// Qwen1.5-MoE / Qwen2-MoE: Qwen2's attention (q/k/v biases), a mixture of experts whose
    /// softmax weights are not renormalized, and a shared expert gated per token. GGUF only.
    Qwen2Moe,
    /// gpt-oss (llama.cpp's `openai-moe`): attention with biases and learned sinks, sliding
    /// windows on alternating layers, YaRN, MXFP4 experts with biases. GGUF only.
    GptOss,
}

impl Arch {
    pub fn parse(name: &str, file: &Path) -> Result<Self> {
        match name.to_ascii_lowercase().as_str() {
            "llama" | "smollm" | "llamaforcausallm" => Ok(Arch::Llama),
            "qwen2" | "qwen2forcausallm" => Ok(Arch::Qwen2),
            "mistral" | "mistralforcausallm" => Ok(Arch::Mistral),
            "phi3" | "phi3forcausallm" => Ok(Arch::Phi3),
            "gemma3" | "gemma3_text" | "gemma3forcausallm" => Ok(Arch::Gemma3),
            "qwen3" | "qwen3forcausallm" => Ok(Arch::Qwen3),
            "qwen35" | "qwen3_5" | "qwen3_5_text" | "qwen3_5forcausallm" | "qwen3_5forconditionalgeneration" => Ok(Arch::Qwen35),
            "qwen3moe" | "qwen3_moe" | "qwen3moeforcausallm" => Ok(Arch::Qwen3Moe),
            "qwen2moe" | "qwen2_moe" | "qwen2moeforcausallm" => Ok(Arch::Qwen2Moe),
            "gpt-oss" | "gpt_oss" | "gptossforcausallm" => Ok(Arch::GptOss),
            _ => Err(Error::UnsupportedArchitecture {
                arch: name.to_string(),
                path: file.to_path_buf(),
            }),
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Mistral => "mistral",
            Arch::Phi3 => "phi3",
            Arch::Gemma3 => "gemma3",
            Arch::Qwen3 => "qwen3",
            Arch::Qwen35 => "qwen35",
            Arch::Qwen3Moe => "qwen3moe",
            Arch::Qwen2Moe => "qwen2moe",
            Arch::GptOss => "gpt-oss",
        }
    }
}

/// RoPE frequency scaling.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Positions divided by `factor`.
    Linear { factor: f32 },
    /// Llama 3.1 style: low frequencies scaled, high kept, smooth in between.
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_max_position_embeddings: usize,
    },
    /// Explicit per-frequency divisors (GGUF `rope_freqs.weight`).
    FreqFactors(Vec<f32>),
    /// YaRN, as ggml's `rope_yarn` with llama.cpp's defaults (extrapolation factor 1, beta
    /// fast 32, beta slow 1): frequencies between the correction dimensions of the original
    /// context ramped from interpolated (divided by `factor`) to kept, cosines and sines
    /// scaled by `1 + 0.1 ln(factor)`.
    Yarn { factor: f32, original_context: usize },
}

/// The MLP's gate activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// SwiGLU: silu(gate) * up.
    Silu,
    /// GeGLU with GELU's tanh approximation: gelu_tanh(gate) * up.
    GeluTanh,
}

/// Where the weights came from decides the names and the RoPE pairing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightLayout {
    /// llama.cpp names (`blk.N.attn_q.weight`); llama-arch Q/K rows permuted for interleaved RoPE.
    Gguf,
    /// transformers names (`model.layers.N.self_attn.q_proj.weight`); rotate-half RoPE.
    HuggingFace,
}

#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    pub arch: Arch,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f32,
    pub rope_dim: usize,
    pub rope_scaling: Option<RopeScaling>,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    pub qkv_bias: bool,
    pub sliding_window: Option<usize>,
    /// Interleaved (GPT-J) RoPE pairs instead of rotate-half (NeoX).
    pub rope_interleaved: bool,
    pub layout: WeightLayout,
    /// Which layers use `sliding_window` (`None`: all of them). Gemma 3 interleaves
    /// sliding-window (local) layers with global ones.
    pub sliding_window_layers: Option<Vec<bool>>,
    /// RoPE base of the sliding-window layers when it differs from `rope_theta`.
    pub rope_theta_swa: Option<f32>,
    /// Embeddings multiplied by this (Gemma: sqrt(hidden_size)).
    pub embed_scale: Option<f32>,
    /// Per-head RMSNorm of queries and keys before RoPE (`attn_q_norm` / `attn_k_norm`).
    pub qk_norm: bool,
    /// RMSNorm of the attention and MLP outputs before they join the residual
    /// (`post_attention_norm` / `post_ffw_norm`).
    pub post_norms: bool,
    pub activation: Activation,
    /// Attention scores scale (default 1/sqrt(head_dim)).
    pub attn_scale: Option<f32>,
    /// Final logits become `cap * tanh(logits / cap)`.
    pub final_logit_softcap: Option<f32>,
    /// Which layers are linear attention, and their shapes (Qwen3.5); `None`: every layer is
    /// full attention.
    pub hybrid: Option<HybridConfig>,
    /// A mixture-of-experts feed-forward in every layer instead of one MLP (`moe.rs`).
    pub moe: Option<MoeConfig>,
}

impl LlamaConfig {
    /// Read the hyper-parameters from GGUF metadata.
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let arch_name = g.architecture()?;
        let arch = Arch::parse(arch_name, g.path())?;
        let key = |k: &str| format!("{arch_name}.{k}");
        let hidden_size = g.get_usize(&key("embedding_length"))?;
        let num_heads = g.get_usize(&key("attention.head_count"))?;
        let num_kv_heads = match g.get(&key("attention.head_count_kv")) {
            Some(_) => g.get_usize(&key("attention.head_count_kv"))?,
            None => num_heads,
        };
        if num_heads == 0 || num_kv_heads == 0 || num_heads % num_kv_heads != 0 || hidden_size % num_heads != 0 {
            return Err(Error::Config(format!(
                "{}: {num_heads} heads / {num_kv_heads} kv heads / hidden {hidden_size} do not divide",
                g.path().display()
            )));
        }
        let head_dim = match g.get(&key("attention.key_length")) {
            Some(_) => g.get_usize(&key("attention.key_length"))?,
            None => hidden_size / num_heads,
        };
        let rope_dim = match g.get(&key("rope.dimension_count")) {
            Some(_) => g.get_usize(&key("rope.dimension_count"))?,
            None => head_dim,
        };
        let vocab_size = match g.get(&key("vocab_size")) {
            Some(_) => g.get_usize(&key("vocab_size"))?,
            None => g.get_array("tokenizer.ggml.tokens")?.len(),
        };
        let rope_scaling = match g.get(&key("rope.scaling.type")).and_then(|v| v.as_str()) {
            Some("linear") => Some(RopeScaling::Linear {
                factor: g.get_f64(&key("rope.scaling.factor"))? as f32,
            }),
            Some("yarn") => Some(RopeScaling::Yarn {
                factor: g.get_f64(&key("rope.scaling.factor"))? as f32,
                original_context: match g.get(&key("rope.scaling.original_context_length")) {
                    Some(_) => g.get_usize(&key("rope.scaling.original_context_length"))?,
                    None => g.get_usize(&key("context_length"))?,
                },
            }),
            Some("none") | None => None,
            Some(other) => {
                tracing::warn!("rope scaling type '{other}' not supported; ignoring it");
                None
            }
        };
        if g.contains_tensor("rope_factors_long.weight") || g.contains_tensor("rope_factors_short.weight") {
            return Err(Error::Config(format!(
                "{}: LongRoPE scaling (rope_factors_long/short: Phi-3 128k, Phi-3.5, Phi-4-mini) is not supported yet",
                g.path().display()
            )));
        }
        let rope_scaling = match g.tensor_info("rope_freqs.weight") {
            Some(_) => {
                let t = g.tensor("rope_freqs.weight", &candle_core::Device::Cpu)?;
                Some(RopeScaling::FreqFactors(t.flatten_all()?.to_vec1::<f32>()?))
            }
            None => rope_scaling,
        };
        let sliding_window = g
            .get(&key("attention.sliding_window"))
            .and_then(|v| v.as_int())
            .filter(|&w| w > 0)
            .map(|w| w as usize);
        Self {
            arch,
            hidden_size,
            // Mixtures of experts may state only the experts' width.
            intermediate_size: match g.get(&key("feed_forward_length")) {
                None if g.get(&key("expert_feed_forward_length")).is_some() => g.get_usize(&key("expert_feed_forward_length"))?,
                _ => g.get_usize(&key("feed_forward_length"))?,
            },
            num_layers: g.get_usize(&key("block_count"))?,
            num_heads,
            num_kv_heads,
            head_dim,
            vocab_size,
            rms_norm_eps: g.get_f64(&key("attention.layer_norm_rms_epsilon"))?,
            rope_theta: match g.get(&key("rope.freq_base")) {
                Some(_) => g.get_f64(&key("rope.freq_base"))? as f32,
                None => 10_000.0,
            },
            rope_dim,
            rope_scaling,
            max_position_embeddings: match g.get(&key("context_length")) {
                Some(_) => g.get_usize(&key("context_length"))?,
                None => 4096,
            },
            tie_word_embeddings: !g.contains_tensor("output.weight"),
            qkv_bias: g.contains_tensor("blk.0.attn_q.bias"),
            sliding_window,
            // llama.cpp runs llama (and mistral, exported as llama) with interleaved pairs;
            // qwen2, phi3 and gemma3 with NeoX rotate-half.
            rope_interleaved: matches!(arch, Arch::Llama | Arch::Mistral),
            layout: WeightLayout::Gguf,
            sliding_window_layers: None,
            rope_theta_swa: None,
            embed_scale: None,
            qk_norm: false,
            post_norms: false,
            activation: Activation::Silu,
            attn_scale: None,
            final_logit_softcap: None,
            hybrid: None,
            moe: None,
        }
        .with_gguf_arch(g, arch_name)
    }

    /// What GGUF metadata adds for architectures beyond the LLaMA layout, as llama.cpp reads it.
    fn with_gguf_arch(mut self, g: &GgufFile, arch_name: &str) -> Result<Self> {
        let key = |k: &str| format!("{arch_name}.{k}");
        let f32_key = |k: &str| -> Result<Option<f32>> {
            match g.get(&key(k)) {
                Some(_) => Ok(Some(g.get_f64(&key(k))? as f32)),
                None => Ok(None),
            }
        };
        if matches!(self.arch, Arch::Qwen3 | Arch::Qwen3Moe) {
            self.qk_norm = true;
        }
        if self.arch == Arch::Qwen35 {
            self.qk_norm = true;
            let hybrid = HybridConfig::from_gguf(g, arch_name, self.num_layers)?;
            self.num_layers -= hybrid.mtp_layers;
            hybrid.check_rope_sections(g, arch_name, self.rope_dim)?;
            self.hybrid = Some(hybrid);
        }
        let style = match self.arch {
            Arch::GptOss => MoeStyle::GptOss,
            Arch::Qwen2Moe => MoeStyle::Qwen2Moe,
            _ => MoeStyle::Renormalized,
        };
        self.moe = MoeConfig::from_gguf(g, arch_name, self.intermediate_size, style)?;
        if matches!(self.arch, Arch::Qwen3Moe | Arch::Qwen2Moe | Arch::GptOss) && self.moe.is_none() {
            return Err(Error::Config(format!("{}: {arch_name} without expert_count", g.path().display())));
        }
        if self.arch == Arch::GptOss {
            // llama.cpp's `load_swa_pattern(ml, 2)`: even layers in the window, odd ones full.
            self.sliding_window_layers = Some((0..self.num_layers).map(|i| i % 2 == 0).collect());
        }
        if self.arch == Arch::Gemma3 {
            // llama.cpp `llama_model_gemma3::load_arch_hparams` and its graph.
            self.embed_scale = Some((self.hidden_size as f32).sqrt());
            self.qk_norm = true;
            self.post_norms = true;
            self.activation = Activation::GeluTanh;
            self.final_logit_softcap = f32_key("final_logit_softcapping")?.filter(|&c| c > 0.0);
            // gemma_pytorch: the 27B model scales queries by 1/sqrt(hidden / heads).
            self.attn_scale = Some(if self.num_layers == 62 {
                1.0 / ((self.hidden_size / self.num_heads) as f32).sqrt()
            } else {
                1.0 / (self.head_dim as f32).sqrt()
            });
            if self.sliding_window.is_some() {
                // `attention.sliding_window_pattern`: a list of per-layer flags, or n (every
                // n-th layer global); llama.cpp's default for gemma3 is 6.
                let pattern = match g.get(&key("attention.sliding_window_pattern")) {
                    Some(v) => match v.as_int() {
                        Some(n) => Err(n),
                        None => Ok(g
                            .get_array(&key("attention.sliding_window_pattern"))?
                            .iter()
                            .map(|x| x.as_int().map(|i| i != 0))
                            .collect::<Option<Vec<bool>>>()
                            .ok_or_else(|| Error::Config(format!("{}: sliding_window_pattern holds non-integers", g.path().display())))?),
                    },
                    None => Err(6),
                };
                let layers = match pattern {
                    Ok(flags) if flags.len() == self.num_layers => flags,
                    Ok(flags) => {
                        return Err(Error::Config(format!(
                            "{}: sliding_window_pattern has {} flags for {} layers",
                            g.path().display(),
                            flags.len(),
                            self.num_layers
                        )))
                    }
                    Err(n) if n <= 0 => vec![true; self.num_layers],
                    Err(n) => (0..self.num_layers).map(|i| (i as i128) % n < n - 1).collect(),
                };
                self.sliding_window_layers = Some(layers);
                self.rope_theta_swa = Some(f32_key("rope.freq_base_swa")?.unwrap_or(10_000.0));
            }
        }
        Ok(self)
    }

    /// Whether layer `i` attends within the sliding window.
    pub fn layer_window(&self, i: usize) -> Option<usize> {
        match &self.sliding_window_layers {
            Some(flags) if !flags.get(i).copied().unwrap_or(false) => None,
            _ => self.sliding_window,
        }
    }

    /// Read an HF `config.json`.
    pub fn from_hf_config(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
        let c: HfConfig = serde_json::from_str(&text)
            .map_err(|e| Error::Config(format!("{}: invalid config.json: {e}", path.display())))?;
        let arch = Arch::parse(
            c.model_type.as_deref().or(c.architectures.first().map(|s| s.as_str())).unwrap_or("?"),
            path,
        )?;
        if matches!(arch, Arch::Qwen3Moe | Arch::Qwen2Moe | Arch::GptOss) {
            return Err(Error::Config(format!(
                "{}: mixtures of experts load from GGUF only (convert the checkpoint with llama.cpp's convert_hf_to_gguf.py)",
                path.display()
            )));
        }
        if matches!(arch, Arch::Gemma3 | Arch::Qwen35) {
            return Err(Error::Config(format!(
                "{}: {} loads from GGUF only (convert the checkpoint with llama.cpp's convert_hf_to_gguf.py)",
                path.display(),
                arch.name()
            )));
        }
        let num_kv_heads = c.num_key_value_heads.unwrap_or(c.num_attention_heads);
        if c.num_attention_heads == 0 || num_kv_heads == 0 || !c.num_attention_heads.is_multiple_of(num_kv_heads) {
            return Err(Error::Config(format!("{}: bad head counts", path.display())));
        }
        let head_dim = c.head_dim.unwrap_or(c.hidden_size / c.num_attention_heads);
        let rope_scaling = match c.rope_scaling {
            Some(serde_json::Value::Object(m)) => {
                let ty = m
                    .get("rope_type")
                    .or(m.get("type"))
                    .and_then(|v| v.as_str())
                    .unwrap_or("");
                let f = |k: &str, d: f64| m.get(k).and_then(|v| v.as_f64()).unwrap_or(d) as f32;
                match ty {
                    "linear" => Some(RopeScaling::Linear { factor: f("factor", 1.0) }),
                    "llama3" => Some(RopeScaling::Llama3 {
                        factor: f("factor", 8.0),
                        low_freq_factor: f("low_freq_factor", 1.0),
                        high_freq_factor: f("high_freq_factor", 4.0),
                        original_max_position_embeddings: m
                            .get("original_max_position_embeddings")
                            .and_then(|v| v.as_u64())
                            .unwrap_or(8192) as usize,
                    }),
                    "default" | "" => None,
                    "longrope" | "su" => {
                        return Err(Error::Config(format!(
                            "{}: LongRoPE scaling ('{ty}': Phi-3 128k, Phi-3.5, Phi-4-mini) is not supported yet",
                            path.display()
                        )))
                    }
                    other => {
                        tracing::warn!("rope scaling type '{other}' not supported; ignoring it");
                        None
                    }
                }
            }
            _ => None,
        };
        Ok(Self {
            arch,
            hidden_size: c.hidden_size,
            intermediate_size: c.intermediate_size,
            num_layers: c.num_hidden_layers,
            num_heads: c.num_attention_heads,
            num_kv_heads,
            head_dim,
            vocab_size: c.vocab_size,
            rms_norm_eps: c.rms_norm_eps.unwrap_or(1e-6),
            rope_theta: c.rope_theta.unwrap_or(10_000.0),
            // Phi-3-family configs rotate only part of each head (Phi-4-mini: 0.75).
            rope_dim: match c.partial_rotary_factor {
                Some(f) if f > 0.0 && f <= 1.0 => ((head_dim as f64 * f) as usize) & !1,
                Some(f) => return Err(Error::Config(format!("{}: partial_rotary_factor {f} is not in (0, 1]", path.display()))),
                None => head_dim,
            },
            rope_scaling,
            max_position_embeddings: c.max_position_embeddings.unwrap_or(4096),
            tie_word_embeddings: c.tie_word_embeddings.unwrap_or(false),
            qkv_bias: c.attention_bias.unwrap_or(arch == Arch::Qwen2),
            sliding_window: if c.use_sliding_window.unwrap_or(arch == Arch::Mistral) {
                c.sliding_window
            } else {
                None
            },
            rope_interleaved: false,
            layout: WeightLayout::HuggingFace,
            sliding_window_layers: None,
            rope_theta_swa: None,
            embed_scale: None,
            qk_norm: arch == Arch::Qwen3,
            post_norms: false,
            activation: Activation::Silu,
            attn_scale: None,
            final_logit_softcap: None,
            hybrid: None,
            moe: None,
        })
    }
}

#[derive(Deserialize)]
struct HfConfig {
    #[serde(default)]
    architectures: Vec<String>,
    model_type: Option<String>,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    vocab_size: usize,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f32>,
    rope_scaling: Option<serde_json::Value>,
    partial_rotary_factor: Option<f64>,
    max_position_embeddings: Option<usize>,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    sliding_window: Option<usize>,
    use_sliding_window: Option<bool>,
}

/// What makes a model a hybrid: which layers are linear attention, and their shapes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HybridConfig {
    /// Per layer of the main stack: whether it is linear attention (else full attention).
    pub linear_layers: Vec<bool>,
    /// Taps of the causal convolution.
    pub conv_kernel: usize,
    /// Query/key heads of the linear layers (`ssm.group_count`).
    pub k_heads: usize,
    /// Value heads (`ssm.time_step_rank`); a multiple of `k_heads`.
    pub v_heads: usize,
    /// Width of a key, query and value head (`ssm.state_size`).
    pub head_dim: usize,
    /// Multi-token-prediction layers stored after the main stack (`nextn_predict_layers`);
    /// they are not run by the forward pass.
    pub mtp_layers: usize,
}

impl HybridConfig {
    /// Read from GGUF metadata as llama.cpp's `llama_model_qwen35::load_arch_hparams` does;
    /// `block_count` counts the MTP layers too.
    pub(crate) fn from_gguf(g: &GgufFile, arch: &str, block_count: usize) -> Result<Self> {
        let key = |k: &str| format!("{arch}.{k}");
        let bad = |what: String| Error::Config(format!("{}: {what}", g.path().display()));
        let opt = |k: &str| -> Result<Option<usize>> {
            match g.get(&key(k)) {
                Some(_) => Ok(Some(g.get_usize(&key(k))?)),
                None => Ok(None),
            }
        };
        let conv_kernel = g.get_usize(&key("ssm.conv_kernel"))?;
        let inner = g.get_usize(&key("ssm.inner_size"))?;
        let head_dim = g.get_usize(&key("ssm.state_size"))?;
        let v_heads = g.get_usize(&key("ssm.time_step_rank"))?;
        let k_heads = g.get_usize(&key("ssm.group_count"))?;
        if conv_kernel == 0 || head_dim == 0 || k_heads == 0 || v_heads % k_heads != 0 || v_heads.checked_mul(head_dim) != Some(inner) {
            return Err(bad(format!(
                "linear attention shapes do not fit: conv kernel {conv_kernel}, {k_heads} key heads, {v_heads} value heads of {head_dim}, inner size {inner}"
            )));
        }
        let mtp_layers = opt("nextn_predict_layers")?.unwrap_or(0);
        if mtp_layers >= block_count {
            return Err(bad(format!("{mtp_layers} MTP layers of {block_count} blocks leave no main layer")));
        }
        let main = block_count - mtp_layers;
        let linear_layers = match g.get(&key("attention.recurrent_layers")) {
            Some(_) => {
                let flags = g
                    .get_array(&key("attention.recurrent_layers"))?
                    .iter()
                    .map(|v| v.as_int().map(|i| i != 0))
                    .collect::<Option<Vec<bool>>>()
                    .ok_or_else(|| bad("attention.recurrent_layers holds values that are not flags".into()))?;
                if flags.len() < main {
                    return Err(bad(format!("attention.recurrent_layers has {} flags for {main} layers", flags.len())));
                }
                flags[..main].to_vec()
            }
            None => {
                let every = opt("full_attention_interval")?.unwrap_or(4).max(1);
                (0..main).map(|i| (i + 1) % every != 0).collect()
            }
        };
        Ok(Self { linear_layers, conv_kernel, k_heads, v_heads, head_dim, mtp_layers })
    }

    /// Qwen3.5 rotates with interleaved M-RoPE; for text every section takes the token's
    /// position, so it is NeoX RoPE over `rope_dim` unless a section would take the fourth
    /// (always 0 for text) position, which is refused rather than run wrong.
    pub(crate) fn check_rope_sections(&self, g: &GgufFile, arch: &str, rope_dim: usize) -> Result<()> {
        let key = format!("{arch}.rope.dimension_sections");
        if g.get(&key).is_none() {
            return Ok(());
        }
        let s: Vec<usize> = g.get_array(&key)?.iter().map(|v| v.as_int().map(|i| usize::try_from(i.max(0)).unwrap_or(usize::MAX)).unwrap_or(0)).chain(std::iter::repeat(0)).take(4).collect();
        let total = s.iter().fold(0usize, |t, &x| t.saturating_add(x));
        // ggml's `ggml_mrope_cache_init` for GGML_ROPE_TYPE_IMROPE.
        let within = |sector: usize, k: usize| sector < s[k].saturating_mul(3);
        let fourth = |sector: usize| !((sector.is_multiple_of(3) && within(sector, 0)) || (sector % 3 == 1 && within(sector, 1)) || (sector % 3 == 2 && within(sector, 2)));
        if total == 0 || (0..rope_dim / 2).any(|i| fourth(i % total)) {
            return Err(Error::Config(format!(
                "{}: rope sections {s:?} give some of the {rope_dim} rotated dimensions the fourth M-RoPE position, which is not supported",
                g.path().display()
            )));
        }
        Ok(())
    }

    /// The shapes of layer state and kernels.
    pub(crate) fn shape(&self) -> DeltaShape {
        DeltaShape { conv_kernel: self.conv_kernel, k_heads: self.k_heads, v_heads: self.v_heads, head_dim: self.head_dim }
    }

    /// Number of linear-attention layers.
    pub fn num_linear(&self) -> usize {
        self.linear_layers.iter().filter(|&&l| l).count()
    }

    /// Values of recurrent state a sequence holds (all linear layers).
    pub fn state_floats(&self) -> usize {
        self.num_linear() * self.shape().layer_floats()
    }
}

/// Shapes of one linear-attention layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DeltaShape {
    pub conv_kernel: usize,
    pub k_heads: usize,
    pub v_heads: usize,
    pub head_dim: usize,
}

impl DeltaShape {
    pub fn key_dim(&self) -> usize {
        self.k_heads * self.head_dim
    }
    pub fn value_dim(&self) -> usize {
        self.v_heads * self.head_dim
    }
    /// Channels of the convolution: `q | k | v`.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }
    pub fn conv_floats(&self) -> usize {
        (self.conv_kernel - 1) * self.conv_dim()
    }
    /// State values of one layer of one sequence: the convolution window, then the matrices.
    pub fn layer_floats(&self) -> usize {
        self.conv_floats() + self.v_heads * self.head_dim * self.head_dim
    }
}
