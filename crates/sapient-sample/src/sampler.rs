//! The sampler chain (see the crate docs for its order): penalties, logit bias, temperature,
//! top-k, top-p, min-p and a seeded draw, and the constrained sampling that checks candidates
//! against a [`Matcher`] in probability order.

use crate::{Constraint, Error, Matcher, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;

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

/// The index of the largest logit (the first of equals; NaN and `-inf` never taken).
///
/// Two passes the compiler vectorizes (the maximum in sixteen lanes, then the first index
/// holding it) rather than one branchy scalar pass: greedy decoding takes this once per
/// sequence and token over the whole vocabulary, on the engine's thread while the kernels'
/// workers wait.
pub fn argmax(logits: &[f32]) -> Result<u32> {
    const L: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; L];
    let chunks = logits.chunks_exact(L);
    let tail = chunks.remainder();
    for c in chunks {
        for (m, &l) in lanes.iter_mut().zip(c) {
            // NaN compares false and is skipped.
            *m = if l > *m { l } else { *m };
        }
    }
    let mut max = f32::NEG_INFINITY;
    for &l in lanes.iter().chain(tail) {
        max = if l > max { l } else { max };
    }
    if max == f32::NEG_INFINITY {
        return Err(Error::NoCandidates);
    }
    logits.iter().position(|&l| l == max).map(|i| i as u32).ok_or(Error::NoCandidates)
}

/// A candidate token: its id, its logit over the temperature, its probability.
#[derive(Clone, Copy, Debug)]
struct Cand {
    id: u32,
    logit: f32,
    p: f32,
}

/// Most likely first; equal logits by id.
fn best_first(a: &Cand, b: &Cand) -> std::cmp::Ordering {
    b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id))
}

/// Visit `c` best first ([`best_first`]) until `visit` returns true (its index), sorting only
/// as far as the visit goes: the best 256, then the next three times as many, and so on,
/// each stretch picked out in linear time (`select_nth_unstable_by`) and then sorted. The
/// order is the full sort's, whose cost (~6 ms for a 152k vocabulary) a token with
/// temperature sampling paid before, for every sequence, on the engine's thread.
fn walk_best_first(c: &mut [Cand], mut visit: impl FnMut(&Cand) -> bool) -> Option<usize> {
    let n = c.len();
    let (mut done, mut end) = (0, 256);
    while done < n {
        let e = end.min(n);
        if e < n {
            c[done..].select_nth_unstable_by(e - done - 1, best_first);
        }
        c[done..e].sort_unstable_by(best_first);
        if let Some(i) = c[done..e].iter().position(&mut visit) {
            return Some(done + i);
        }
        done = e;
        end = 4 * e;
    }
    None
}

/// `e^x` for `x <= 0` (0 below -87), within a few units in the last place: Cody-Waite
/// reduction and Cephes' `expf` polynomial, in plain arithmetic that the compiler vectorizes
/// (the library's `expf` is a call per value: ~1 ms for a 152k vocabulary).
#[inline(always)]
fn exp_nonpositive(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer
    let x = x.max(-87.0);
    let n = (x * std::f32::consts::LOG2_E + MAGIC) - MAGIC;
    let r = x - n * 0.693_359_4 - n * -2.121_944_4e-4;
    let p = ((((1.987_569_1e-4 * r + 1.398_2e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r + 0.166_666_65) * r + 0.5;
    let e = p * r * r + r + 1.0;
    e * f32::from_bits(((n as i32 + 127) << 23) as u32)
}

/// The candidates after temperature and top-k, with their probabilities (over the
/// candidates), into `cands` (cleared first), in no particular order.
fn candidates_into(logits: &[f32], cfg: &SamplerConfig, cands: &mut Vec<Cand>) -> Result<()> {
    let t = cfg.temperature.max(f32::MIN_POSITIVE);
    cands.clear();
    cands.extend(logits.iter().enumerate().filter(|(_, l)| l.is_finite()).map(|(i, &l)| Cand { id: i as u32, logit: l / t, p: 0.0 }));
    if cands.is_empty() {
        return Err(Error::NoCandidates);
    }
    if let Some(k) = cfg.top_k {
        if k == 0 {
            // `SamplerConfig::validate` refuses it too; this is reachable without it.
            return Err(Error::InvalidParameter("top_k must be at least 1".into()));
        }
        if k < cands.len() {
            cands.select_nth_unstable_by(k - 1, best_first);
            cands.truncate(k);
        }
    }
    let max = cands.iter().map(|c| c.logit).fold(f32::NEG_INFINITY, f32::max);
    // Eight partial sums: one chain of dependent additions would cost more than the rest.
    let mut sums = [0f64; 8];
    for chunk in cands.chunks_mut(8) {
        for (c, s) in chunk.iter_mut().zip(&mut sums) {
            c.p = exp_nonpositive(c.logit - max);
            *s += c.p as f64;
        }
    }
    let sum: f64 = sums.iter().sum();
    for c in cands.iter_mut() {
        c.p = (c.p as f64 / sum) as f32;
    }
    Ok(())
}

/// [`candidates_into`] a new vector.
fn candidates(logits: &[f32], cfg: &SamplerConfig) -> Result<Vec<Cand>> {
    let mut cands = Vec::new();
    candidates_into(logits, cfg, &mut cands)?;
    Ok(cands)
}

/// The candidates' total probability (in f64, in their present order), by which the kept
/// ones are renormalised.
fn mass(cands: &[Cand]) -> f32 {
    cands.iter().map(|c| c.p as f64).sum::<f64>() as f32
}

/// Whether `cfg` filters nothing beyond temperature and top-k.
fn plain(cfg: &SamplerConfig) -> bool {
    cfg.top_p.is_none_or(|p| p >= 1.0) && cfg.min_p.is_none()
}

/// Candidates after temperature, top-k, top-p and min-p: (token, probability), probabilities
/// renormalised, most likely first.
pub fn filtered_distribution(logits: &[f32], cfg: &SamplerConfig) -> Result<Vec<(u32, f32)>> {
    let mut cands = candidates(logits, cfg)?;
    let mut sorted = false;
    if let Some(p) = cfg.top_p.filter(|&p| p < 1.0) {
        // The most likely first until their mass reaches p.
        let mut acc = 0f32;
        let keep = walk_best_first(&mut cands, |c| {
            acc += c.p;
            acc >= p
        });
        cands.truncate(keep.map_or(cands.len(), |i| i + 1));
        sorted = true;
    }
    if let Some(mp) = cfg.min_p {
        let best = if sorted { cands[0].p } else { cands.iter().map(|c| c.p).fold(0f32, f32::max) };
        let threshold = best * mp;
        cands.retain(|c| c.p >= threshold);
    }
    // Summed before the sort (as the plain draw in `Sampler::sample` sums it).
    let total = mass(&cands);
    if !sorted {
        cands.sort_unstable_by(best_first);
    }
    Ok(cands.into_iter().map(|c| (c.id, c.p / total)).collect())
}

/// A sampler: the configuration and its seeded RNG.
#[derive(Debug, Clone)]
pub struct Sampler {
    cfg: SamplerConfig,
    rng: StdRng,
    /// The candidates of the last draw (kept: a vocabulary's worth is ~2 MB).
    scratch: Vec<Cand>,
}

impl Sampler {
    pub fn new(cfg: SamplerConfig) -> Result<Self> {
        cfg.validate()?;
        let rng = match cfg.seed {
            Some(s) => StdRng::seed_from_u64(s),
            None => StdRng::from_os_rng(),
        };
        Ok(Self { cfg, rng, scratch: Vec::new() })
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
        if plain(&self.cfg) {
            // Every candidate stays: draw walking them best first, sorted only as far as the
            // draw goes (the same token as walking [`filtered_distribution`]'s list).
            let cands = &mut self.scratch;
            candidates_into(logits, &self.cfg, cands)?;
            let total = mass(cands);
            let r: f32 = self.rng.random();
            let mut acc = 0f32;
            let hit = walk_best_first(cands, |c| {
                acc += c.p / total;
                r < acc
            });
            // Past the end by rounding: the last (least likely) candidate, as the list's.
            return Ok(cands[hit.unwrap_or(cands.len() - 1)].id);
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

/// How many of the best candidates greedy constrained decoding checks before it computes
/// the full mask.
const GREEDY_CANDIDATES: usize = 32;
/// How many rejected draws before a sampled constrained step computes the full mask.
const MAX_REJECTIONS: usize = 16;

/// The `k` largest finite logits, best first (ties: lower id first), in one pass.
fn top_candidates(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
    for (i, &l) in logits.iter().enumerate() {
        if !l.is_finite() && l != f32::INFINITY {
            continue;
        }
        if top.len() == k && top.last().is_some_and(|w| l <= w.1) {
            continue;
        }
        let pos = top.partition_point(|c| c.1 >= l);
        top.insert(pos, (i as u32, l));
        top.truncate(k);
    }
    top
}

impl Sampler {
    /// Pick the next token under a constraint and advance `matcher` by it.
    ///
    /// The result follows the chain of [`Sampler::sample`] applied to the logits with every
    /// disallowed token masked out first (so top-k keeps the k best *allowed* tokens), but
    /// without computing the mask in the common case:
    /// - greedy: the best candidates are checked in logit order (only their own bytes are
    ///   walked) and the first allowed one is taken; the full mask is computed only when
    ///   none of the best `GREEDY_CANDIDATES` (32) is allowed;
    /// - top-k / top-p: the best candidates are checked in order until the filtered set of
    ///   allowed tokens is decided whatever the unchecked tokens are (top-p uses bounds on the
    ///   allowed mass), then the draw is made from it;
    /// - otherwise (temperature, min-p): draws are made from the distribution and a
    ///   disallowed draw is removed and redrawn, which samples the masked distribution exactly.
    ///
    /// When that does not settle within 64 candidates or 16 draws, the mask is applied to the
    /// logits and the ordinary chain runs on them.
    pub fn sample_constrained<C: Constraint>(&mut self, logits: &mut [f32], history: &[u32], matcher: &mut Matcher<C>) -> Result<u32> {
        apply_penalties(logits, history, &self.cfg);
        for (&t, &b) in &self.cfg.logit_bias {
            if let Some(l) = logits.get_mut(t as usize) {
                *l += b;
            }
        }
        let tok = if self.cfg.is_greedy() {
            self.greedy_constrained(logits, matcher)?
        } else {
            self.draw_constrained(logits, matcher)?
        };
        matcher.consume(tok)?;
        Ok(tok)
    }

    fn greedy_constrained<C: Constraint>(&mut self, logits: &mut [f32], m: &mut Matcher<C>) -> Result<u32> {
        for (t, _) in top_candidates(logits, GREEDY_CANDIDATES) {
            if m.allows(t)? {
                return Ok(t);
            }
        }
        tracing::trace!("no top candidate allowed: full mask");
        m.mask()?.apply(logits);
        argmax(logits)
    }

    fn draw(&mut self, dist: &[(u32, f32)], mass: f32, skip: &[bool]) -> Option<usize> {
        let r: f32 = self.rng.random::<f32>() * mass;
        let mut acc = 0f32;
        let mut last = None;
        for (i, &(_, p)) in dist.iter().enumerate() {
            if skip.get(i).copied().unwrap_or(false) {
                continue;
            }
            acc += p;
            last = Some(i);
            if r < acc {
                return Some(i);
            }
        }
        last
    }

    /// Mask-then-filter sampling, checking candidates lazily (see `sample_constrained`).
    fn draw_constrained<C: Constraint>(&mut self, logits: &mut [f32], m: &mut Matcher<C>) -> Result<u32> {
        let cfg = self.cfg.clone();
        let t = cfg.temperature.max(f32::MIN_POSITIVE);
        let cands = top_candidates(logits, WALK_CANDIDATES);
        let Some(&(_, max)) = cands.first() else { return Err(Error::NoCandidates) };
        // Probabilities over the whole vocabulary (one pass for the normaliser).
        let z: f64 = logits.iter().filter(|l| l.is_finite()).map(|&l| (((l - max) / t) as f64).exp()).sum();
        let prob = |l: f32| (((l - max) / t) as f64).exp() / z;
        let top_p = cfg.top_p.filter(|&p| p < 1.0).map(f64::from);
        if cfg.top_k.is_some() || top_p.is_some() {
            // Walk candidates best first, keep the allowed ones, stop once the filtered set
            // over allowed tokens cannot change whatever the unvisited tokens are.
            let mut valid: Vec<(u32, f64)> = Vec::new();
            let mut visited = 0f64;
            for &(id, l) in &cands {
                visited += prob(l);
                if m.allows(id)? {
                    valid.push((id, prob(l)));
                } else {
                    continue;
                }
                if let Some(set) = decided(&valid, (1.0 - visited).max(0.0), cfg.top_k, top_p, cfg.min_p) {
                    return self.draw_f64(&set);
                }
            }
            tracing::trace!("filtered set not decided by the best candidates: full mask");
        } else {
            // No top-k/top-p: rejection from the distribution, truncated by min-p relative
            // to the best allowed token, is exact.
            let mut first: Option<f64> = None;
            for &(id, l) in &cands {
                if m.allows(id)? {
                    first = Some(prob(l));
                    break;
                }
            }
            if let Some(p_first) = first {
                let threshold = cfg.min_p.map_or(0.0, |mp| mp as f64 * p_first);
                let dist: Vec<(u32, f64)> =
                    filtered_distribution(logits, &SamplerConfig { min_p: None, ..cfg.clone() })?
                        .into_iter()
                        .map(|(i, _)| (i, prob(logits[i as usize])))
                        .filter(|c| c.1 >= threshold)
                        .collect();
                let mut rejected = vec![false; dist.len()];
                let mut mass: f64 = dist.iter().map(|c| c.1).sum();
                for _ in 0..MAX_REJECTIONS {
                    let r = self.rng.random::<f64>() * mass;
                    let mut acc = 0f64;
                    let mut pick = None;
                    for (i, c) in dist.iter().enumerate() {
                        if rejected[i] {
                            continue;
                        }
                        acc += c.1;
                        pick = Some(i);
                        if r < acc {
                            break;
                        }
                    }
                    let Some(i) = pick else { break };
                    if m.allows(dist[i].0)? {
                        return Ok(dist[i].0);
                    }
                    rejected[i] = true;
                    mass -= dist[i].1;
                    if mass <= 0.0 {
                        break;
                    }
                }
            }
            tracing::trace!("too many rejected draws: full mask");
        }
        m.mask()?.apply(logits);
        let dist = filtered_distribution(logits, &cfg)?;
        self.draw(&dist, 1.0, &[]).map(|i| dist[i].0).ok_or(Error::NoCandidates)
    }

    fn draw_f64(&mut self, set: &[(u32, f64)]) -> Result<u32> {
        let total: f64 = set.iter().map(|c| c.1).sum();
        let r = self.rng.random::<f64>() * total;
        let mut acc = 0f64;
        for &(t, p) in set {
            acc += p;
            if r < acc {
                return Ok(t);
            }
        }
        set.last().map(|c| c.0).ok_or(Error::NoCandidates)
    }
}

/// Candidates walked before a sampled constrained step computes the full mask.
const WALK_CANDIDATES: usize = 64;

/// Given the allowed candidates found so far (best first, unnormalised probabilities) and
/// the probability mass not yet visited, the final filtered set (top-k, then top-p on the
/// renormalised allowed distribution, then min-p) if it no longer depends on the unvisited
/// tokens.
fn decided(valid: &[(u32, f64)], rest: f64, top_k: Option<usize>, top_p: Option<f64>, min_p: Option<f32>) -> Option<Vec<(u32, f64)>> {
    let (set, k_full) = match top_k {
        Some(k) if valid.len() >= k => (&valid[..k], true),
        _ => (valid, false),
    };
    let a: f64 = set.iter().map(|c| c.1).sum();
    let (v_lo, v_hi) = if k_full { (a, a) } else { (a, a + rest) };
    let cut = |v: f64| -> Option<usize> {
        match top_p {
            None => k_full.then_some(set.len()),
            Some(p) => {
                let mut acc = 0f64;
                for (i, c) in set.iter().enumerate() {
                    acc += c.1;
                    if acc >= p * v {
                        return Some(i + 1);
                    }
                }
                k_full.then_some(set.len())
            }
        }
    };
    let n = cut(v_hi)?;
    if cut(v_lo)? != n {
        return None;
    }
    let mut out = set[..n].to_vec();
    if let Some(mp) = min_p {
        let threshold = out[0].1 * mp as f64;
        out.retain(|c| c.1 >= threshold);
    }
    Some(out)
}

#[cfg(test)]
mod tests;
