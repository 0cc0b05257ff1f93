//! Sampling settings for interactive use: a model's own recommendation
//! (`generation_config.json`) or the usual llama.cpp / ollama defaults.

use crate::SamplerConfig;
use std::fmt;

impl SamplerConfig {
    /// The defaults of llama.cpp and ollama for chat: temperature 0.8, top-k 40, top-p 0.95,
    /// min-p 0.05, repetition penalty 1.1 over the last 64 tokens.
    pub fn chat_defaults(seed: Option<u64>) -> Self {
        Self {
            temperature: 0.8,
            top_k: Some(40),
            top_p: Some(0.95),
            min_p: Some(0.05),
            repetition_penalty: 1.1,
            penalty_last_n: 64,
            seed,
            ..Self::default()
        }
    }

    /// The sampling settings of a Hugging Face `generation_config.json`, or `None` when it
    /// sets none of `do_sample`, `temperature`, `top_k`, `top_p`, `min_p`,
    /// `repetition_penalty` (many only name the special tokens).
    ///
    /// Keys it leaves out take the values `transformers` uses (temperature 1, top-k 50, no
    /// top-p, min-p or penalty); `"do_sample": false` means greedy decoding. Unlike
    /// `transformers`, a file that sets a temperature without `do_sample` samples: that is
    /// what its author recommends.
    ///
    /// ```
    /// use sapient_sample::SamplerConfig;
    /// let qwen = serde_json::json!({"do_sample": true, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05});
    /// let cfg = SamplerConfig::from_generation_config(&qwen).unwrap();
    /// assert_eq!((cfg.temperature, cfg.top_k, cfg.top_p), (0.7, Some(20), Some(0.8)));
    /// assert!(SamplerConfig::from_generation_config(&serde_json::json!({"eos_token_id": 2})).is_none());
    /// ```
    pub fn from_generation_config(json: &serde_json::Value) -> Option<Self> {
        const KEYS: [&str; 6] = [
            "do_sample",
            "temperature",
            "top_k",
            "top_p",
            "min_p",
            "repetition_penalty",
        ];
        if !KEYS
            .iter()
            .any(|k| json.get(k).is_some_and(|v| !v.is_null()))
        {
            return None;
        }
        let float = |k: &str| {
            json.get(k)
                .and_then(serde_json::Value::as_f64)
                .map(|v| v as f32)
        };
        let mut cfg = Self {
            temperature: float("temperature").unwrap_or(1.0),
            top_k: match json.get("top_k").and_then(serde_json::Value::as_u64) {
                Some(0) => None,
                Some(k) => Some(k as usize),
                None => Some(50),
            },
            top_p: float("top_p").filter(|&p| p < 1.0),
            min_p: float("min_p").filter(|&p| p > 0.0),
            repetition_penalty: float("repetition_penalty").unwrap_or(1.0),
            ..Self::default()
        };
        if json.get("do_sample").and_then(serde_json::Value::as_bool) == Some(false) {
            cfg.temperature = 0.0;
        }
        Some(cfg)
    }
}

/// `temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, repetition penalty 1.1 over the last
/// 64 tokens, seed 7`, or `greedy` (only the settings that do something are named).
impl fmt::Display for SamplerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if self.is_greedy() {
            parts.push("greedy".to_string());
        } else {
            parts.push(format!("temperature {}", self.temperature));
            if let Some(k) = self.top_k {
                parts.push(format!("top-k {k}"));
            }
            if let Some(p) = self.top_p {
                parts.push(format!("top-p {p}"));
            }
            if let Some(p) = self.min_p {
                parts.push(format!("min-p {p}"));
            }
        }
        let mut penalties = Vec::new();
        if self.repetition_penalty != 1.0 {
            penalties.push(format!("repetition penalty {}", self.repetition_penalty));
        }
        if self.presence_penalty != 0.0 {
            penalties.push(format!("presence penalty {}", self.presence_penalty));
        }
        if self.frequency_penalty != 0.0 {
            penalties.push(format!("frequency penalty {}", self.frequency_penalty));
        }
        if !penalties.is_empty() {
            parts.push(format!(
                "{} over the last {} tokens",
                penalties.join(", "),
                self.penalty_last_n
            ));
        }
        if !self.logit_bias.is_empty() {
            parts.push(format!("{} logit biases", self.logit_bias.len()));
        }
        if let (false, Some(seed)) = (self.is_greedy(), self.seed) {
            parts.push(format!("seed {seed}"));
        }
        f.write_str(&parts.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn generation_config_values_and_defaults() {
        let llama =
            json!({"bos_token_id": 128000, "do_sample": true, "temperature": 0.6, "top_p": 0.9});
        let c = SamplerConfig::from_generation_config(&llama).unwrap();
        assert_eq!(
            (
                c.temperature,
                c.top_k,
                c.top_p,
                c.min_p,
                c.repetition_penalty
            ),
            (0.6, Some(50), Some(0.9), None, 1.0)
        );
        let greedy =
            SamplerConfig::from_generation_config(&json!({"do_sample": false, "temperature": 0.6}))
                .unwrap();
        assert!(greedy.is_greedy());
        let no_top_k =
            SamplerConfig::from_generation_config(&json!({"top_k": 0, "top_p": 1.0})).unwrap();
        assert_eq!(
            (no_top_k.top_k, no_top_k.top_p, no_top_k.temperature),
            (None, None, 1.0)
        );
        assert!(SamplerConfig::from_generation_config(
            &json!({"eos_token_id": [1, 2], "temperature": null})
        )
        .is_none());
        assert!(SamplerConfig::chat_defaults(None).validate().is_ok());
    }

    #[test]
    fn display_names_what_is_used() {
        assert_eq!(
            SamplerConfig::chat_defaults(Some(7)).to_string(),
            "temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, repetition penalty 1.1 over the last 64 tokens, seed 7"
        );
        assert_eq!(SamplerConfig::greedy().to_string(), "greedy");
    }
}
