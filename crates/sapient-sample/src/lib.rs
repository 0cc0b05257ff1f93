//! `sapient-sample`: logits processors and seeded sampling.
//!
//! The chain runs in this documented order (the order of Hugging Face `generate`):
//! 1. repetition penalty (CTRL-style: positive logits divided, negative multiplied),
//!    presence and frequency penalties, over the last `penalty_last_n` tokens;
//! 2. logit bias;
//! 3. temperature (0 means greedy: the arg-max is taken and nothing else runs);
//! 4. top-k, 5. top-p (nucleus), 6. min-p (relative to the most likely token);
//! 7. a draw from the remaining distribution with a seeded RNG.
//!
//! The same seed, logits and history give the same token.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("invalid sampling parameter: {0}")]
    InvalidParameter(String),
    #[error("no token can be sampled: every logit is -inf or NaN")]
    NoCandidates,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Sampling parameters. `Default` is greedy decoding.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerConfig {
    /// 0 = greedy.
    pub temperature: f32,
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
    pub min_p: Option<f32>,
    /// 1.0 = off.
    pub repetition_penalty: f32,
    /// Subtracted once from the logit of every token present in the window. 0 = off.
    pub presence_penalty: f32,
    /// Subtracted per occurrence in the window. 0 = off.
    pub frequency_penalty: f32,
    /// How many of the most recent tokens the penalties look at.
    pub penalty_last_n: usize,
    pub logit_bias: HashMap<u32, f32>,
    /// `None` seeds from the OS.
    pub seed: Option<u64>,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: None,
            top_p: None,
            min_p: None,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 64,
            logit_bias: HashMap::new(),
            seed: None,
        }
    }
}

impl SamplerConfig {
    pub fn greedy() -> Self {
        Self::default()
    }

    /// A common chat setting: temperature 0.7, top-p 0.9.
    pub fn creative(seed: Option<u64>) -> Self {
        Self {
            temperature: 0.7,
            top_p: Some(0.9),
            seed,
            ..Self::default()
        }
    }

    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidParameter(m));
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return bad(format!("temperature must be >= 0, got {}", self.temperature));
        }
        if self.top_k == Some(0) {
            return bad("top_k must be at least 1".into());
        }
        if let Some(p) = self.top_p {
            if !(p > 0.0 && p <= 1.0) {
                return bad(format!("top_p must be in (0, 1], got {p}"));
            }
        }
        if let Some(p) = self.min_p {
            if !(0.0..=1.0).contains(&p) {
                return bad(format!("min_p must be in [0, 1], got {p}"));
            }
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty.is_finite()) {
            return bad(format!("repetition_penalty must be > 0, got {}", self.repetition_penalty));
        }
        if !self.presence_penalty.is_finite() || !self.frequency_penalty.is_finite() {
            return bad("presence/frequency penalties must be finite".into());
        }
        Ok(())
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }
}

/// Apply the repetition, presence and frequency penalties in place.
pub fn apply_penalties(logits: &mut [f32], history: &[u32], cfg: &SamplerConfig) {
    if cfg.repetition_penalty == 1.0 && cfg.presence_penalty == 0.0 && cfg.frequency_penalty == 0.0 {
        return;
    }
    let window = &history[history.len().saturating_sub(cfg.penalty_last_n)..];
    let mut counts: HashMap<u32, u32> = HashMap::new();
    for &t in window {
        *counts.entry(t).or_default() += 1;
    }
    for (&t, &n) in &counts {
        let Some(l) = logits.get_mut(t as usize) else { continue };
        if cfg.repetition_penalty != 1.0 {
            *l = if *l > 0.0 { *l / cfg.repetition_penalty } else { *l * cfg.repetition_penalty };
        }
        *l -= cfg.presence_penalty + cfg.frequency_penalty * n as f32;
    }
}

/// The index of the largest finite logit.
pub fn argmax(logits: &[f32]) -> Result<u32> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &l) in logits.iter().enumerate() {
        if l.is_nan() || l == f32::NEG_INFINITY {
            continue;
        }
        if best.is_none_or(|(_, b)| l > b) {
            best = Some((i, l));
        }
    }
    best.map(|(i, _)| i as u32).ok_or(Error::NoCandidates)
}

/// Candidates after temperature, top-k, top-p and min-p: (token, probability), probabilities
/// renormalised, most likely first.
pub fn filtered_distribution(logits: &[f32], cfg: &SamplerConfig) -> Result<Vec<(u32, f32)>> {
    let t = cfg.temperature.max(f32::MIN_POSITIVE);
    let mut cands: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .filter(|(_, l)| l.is_finite())
        .map(|(i, &l)| (i as u32, l / t))
        .collect();
    if cands.is_empty() {
        return Err(Error::NoCandidates);
    }
    let by_logit = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    if let Some(k) = cfg.top_k {
        if k < cands.len() {
            cands.select_nth_unstable_by(k - 1, by_logit);
            cands.truncate(k);
        }
    }
    cands.sort_unstable_by(by_logit);
    let max = cands[0].1;
    let mut sum = 0f64;
    for c in cands.iter_mut() {
        c.1 = (c.1 - max).exp();
        sum += c.1 as f64;
    }
    for c in cands.iter_mut() {
        c.1 = (c.1 as f64 / sum) as f32;
    }
    if let Some(p) = cfg.top_p {
        if p < 1.0 {
            let mut acc = 0f32;
            let mut keep = cands.len();
            for (i, c) in cands.iter().enumerate() {
                acc += c.1;
                if acc >= p {
                    keep = i + 1;
                    break;
                }
            }
            cands.truncate(keep);
        }
    }
    if let Some(mp) = cfg.min_p {
        let threshold = cands[0].1 * mp;
        cands.retain(|c| c.1 >= threshold);
    }
    let total: f32 = cands.iter().map(|c| c.1).sum();
    for c in cands.iter_mut() {
        c.1 /= total;
    }
    Ok(cands)
}

/// A sampler: the configuration and its seeded RNG.
#[derive(Debug, Clone)]
pub struct Sampler {
    cfg: SamplerConfig,
    rng: StdRng,
}

impl Sampler {
    pub fn new(cfg: SamplerConfig) -> Result<Self> {
        cfg.validate()?;
        let rng = match cfg.seed {
            Some(s) => StdRng::seed_from_u64(s),
            None => StdRng::from_os_rng(),
        };
        Ok(Self { cfg, rng })
    }

    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// Pick the next token. `logits` is modified (penalties, bias). `history` holds the tokens
    /// so far (prompt and generated) for the penalties.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> Result<u32> {
        apply_penalties(logits, history, &self.cfg);
        for (&t, &b) in &self.cfg.logit_bias {
            if let Some(l) = logits.get_mut(t as usize) {
                *l += b;
            }
        }
        if self.cfg.is_greedy() {
            return argmax(logits);
        }
        let dist = filtered_distribution(logits, &self.cfg)?;
        let r: f32 = self.rng.random();
        let mut acc = 0f32;
        for &(t, p) in &dist {
            acc += p;
            if r < acc {
                return Ok(t);
            }
        }
        Ok(dist[dist.len() - 1].0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn softmax(l: &[f32]) -> Vec<f32> {
        let m = l.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f32> = l.iter().map(|x| (x - m).exp()).collect();
        let s: f32 = e.iter().sum();
        e.iter().map(|x| x / s).collect()
    }

    #[test]
    fn greedy_picks_argmax_and_skips_nan() {
        let mut s = Sampler::new(SamplerConfig::greedy()).unwrap();
        assert_eq!(s.sample(&mut [0.1, 3.0, f32::NAN, 2.0], &[]).unwrap(), 1);
        assert!(matches!(argmax(&[f32::NAN, f32::NEG_INFINITY]), Err(Error::NoCandidates)));
    }

    #[test]
    fn temperature_scales_distribution() {
        let logits = [1.0f32, 2.0, 3.0];
        let cfg = SamplerConfig { temperature: 2.0, ..Default::default() };
        let d = filtered_distribution(&logits, &cfg).unwrap();
        let expect = softmax(&[0.5, 1.0, 1.5]);
        assert_eq!(d[0].0, 2);
        for (t, p) in d {
            assert!((p - expect[t as usize]).abs() < 1e-6);
        }
    }

    #[test]
    fn top_k_keeps_k_best() {
        let cfg = SamplerConfig { temperature: 1.0, top_k: Some(2), ..Default::default() };
        let d = filtered_distribution(&[0.0, 5.0, 1.0, 4.0], &cfg).unwrap();
        let ids: Vec<u32> = d.iter().map(|c| c.0).collect();
        assert_eq!(ids, vec![1, 3]);
        let e = softmax(&[5.0, 4.0]);
        assert!((d[0].1 - e[0]).abs() < 1e-6 && (d[1].1 - e[1]).abs() < 1e-6);
    }

    #[test]
    fn top_p_keeps_smallest_nucleus() {
        // probabilities 0.5, 0.3, 0.2 (from logs)
        let logits = [0.5f32.ln(), 0.3f32.ln(), 0.2f32.ln()];
        let cfg = SamplerConfig { temperature: 1.0, top_p: Some(0.75), ..Default::default() };
        let d = filtered_distribution(&logits, &cfg).unwrap();
        assert_eq!(d.len(), 2);
        assert!((d[0].1 - 0.625).abs() < 1e-5 && (d[1].1 - 0.375).abs() < 1e-5);
        let cfg = SamplerConfig { temperature: 1.0, top_p: Some(0.5), ..Default::default() };
        assert_eq!(filtered_distribution(&logits, &cfg).unwrap().len(), 1);
    }

    #[test]
    fn min_p_is_relative_to_top() {
        let logits = [0.5f32.ln(), 0.3f32.ln(), 0.2f32.ln()];
        let cfg = SamplerConfig { temperature: 1.0, min_p: Some(0.5), ..Default::default() };
        let d = filtered_distribution(&logits, &cfg).unwrap();
        // 0.2 < 0.5 * 0.5 is dropped, 0.3 stays.
        assert_eq!(d.iter().map(|c| c.0).collect::<Vec<_>>(), vec![0, 1]);
    }

    #[test]
    fn penalties_math() {
        let cfg = SamplerConfig {
            repetition_penalty: 2.0,
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            ..Default::default()
        };
        let mut l = [4.0f32, -4.0, 1.0];
        apply_penalties(&mut l, &[0, 1, 1], &cfg);
        assert_eq!(l[0], 4.0 / 2.0 - 0.5 - 0.25);
        assert_eq!(l[1], -4.0 * 2.0 - 0.5 - 0.5);
        assert_eq!(l[2], 1.0);
        // Only the last n tokens count.
        let cfg = SamplerConfig { frequency_penalty: 1.0, penalty_last_n: 1, ..Default::default() };
        let mut l = [0.0f32, 0.0];
        apply_penalties(&mut l, &[0, 0, 1], &cfg);
        assert_eq!(l, [0.0, -1.0]);
    }

    #[test]
    fn seed_reproduces_and_frequencies_follow_distribution() {
        let logits = [0.5f32.ln(), 0.3f32.ln(), 0.2f32.ln()];
        let cfg = SamplerConfig { temperature: 1.0, seed: Some(42), ..Default::default() };
        let run = |cfg: &SamplerConfig| {
            let mut s = Sampler::new(cfg.clone()).unwrap();
            (0..20000).map(|_| s.sample(&mut logits.clone(), &[]).unwrap()).collect::<Vec<_>>()
        };
        let a = run(&cfg);
        assert_eq!(a, run(&cfg));
        let other = run(&SamplerConfig { seed: Some(7), ..cfg.clone() });
        assert_ne!(a, other);
        let mut counts = [0usize; 3];
        for t in a {
            counts[t as usize] += 1;
        }
        for (i, p) in [0.5, 0.3, 0.2].iter().enumerate() {
            let f = counts[i] as f64 / 20000.0;
            assert!((f - p).abs() < 0.015, "token {i}: {f} vs {p}");
        }
    }

    #[test]
    fn logit_bias_can_ban() {
        let mut bias = HashMap::new();
        bias.insert(1u32, f32::NEG_INFINITY);
        let mut s = Sampler::new(SamplerConfig { logit_bias: bias, ..Default::default() }).unwrap();
        assert_eq!(s.sample(&mut [1.0, 9.0, 2.0], &[]).unwrap(), 2);
    }

    #[test]
    fn invalid_parameters_are_rejected() {
        for cfg in [
            SamplerConfig { temperature: -1.0, ..Default::default() },
            SamplerConfig { top_k: Some(0), ..Default::default() },
            SamplerConfig { top_p: Some(1.5), ..Default::default() },
            SamplerConfig { min_p: Some(-0.1), ..Default::default() },
            SamplerConfig { repetition_penalty: 0.0, ..Default::default() },
        ] {
            assert!(matches!(Sampler::new(cfg), Err(Error::InvalidParameter(_))));
        }
    }
}
