//! Speculative decoding on hand-made distributions: greedy equivalence and
//! distribution preservation under rejection sampling.

use sapient_generate::speculative::{generate, CausalLm, DraftModel, PromptLookup, SpecConfig};
use sapient_generate::Result;
use sapient_sample::SamplerConfig;
use std::collections::HashMap;
use std::ops::ControlFlow;

/// A "model" whose next-token logits depend only on the previous token.
struct TableLm {
    table: Vec<Vec<f32>>,
    cache: Vec<u32>,
    forwards: usize,
    /// Logits kept: ids below `.0` and those in `.1` (the rest `-inf`), as a restricted draft.
    keep: Option<(usize, Vec<u32>)>,
}

impl TableLm {
    fn new(probs: &[&[f32]]) -> Self {
        Self { table: probs.iter().map(|r| r.iter().map(|p| p.ln()).collect()).collect(), cache: vec![], forwards: 0, keep: None }
    }
}

impl CausalLm for TableLm {
    fn forward_all(&mut self, tokens: &[u32], out: &mut Vec<f32>) -> Result<()> {
        self.forwards += 1;
        self.cache.extend_from_slice(tokens);
        out.clear();
        for &t in tokens {
            let row = self.table[t as usize].iter().enumerate().map(|(id, &l)| match &self.keep {
                Some((first, extra)) if id >= *first && !extra.contains(&(id as u32)) => f32::NEG_INFINITY,
                _ => l,
            });
            out.extend(row);
        }
        Ok(())
    }
    fn restrict_logits(&mut self, keep: Option<(usize, &[u32])>) -> Result<bool> {
        self.keep = keep.map(|(f, e)| (f, e.to_vec()));
        Ok(self.keep.is_some())
    }
    fn cache_len(&self) -> usize {
        self.cache.len()
    }
    fn truncate(&mut self, len: usize) {
        self.cache.truncate(len);
    }
}

const P: [&[f32]; 3] = [&[0.6, 0.3, 0.1], &[0.2, 0.2, 0.6], &[0.1, 0.7, 0.2]];
const Q: [&[f32]; 3] = [&[0.2, 0.5, 0.3], &[0.5, 0.4, 0.1], &[0.3, 0.3, 0.4]];

fn plain_greedy(prompt: &[u32], n: usize) -> Vec<u32> {
    let mut m = TableLm::new(&P);
    let mut seq = prompt.to_vec();
    let mut l = Vec::new();
    m.forward_last(prompt, &mut l).unwrap();
    let mut out = vec![];
    for _ in 0..n {
        let t = sapient_sample::argmax(&l).unwrap();
        out.push(t);
        seq.push(t);
        m.forward_last(&[t], &mut l).unwrap();
    }
    out
}

#[test]
fn greedy_output_equals_plain_greedy_and_uses_fewer_target_forwards() {
    let prompt = [0u32, 1, 2];
    let want = plain_greedy(&prompt, 12);
    let mut target = TableLm::new(&P);
    // A draft equal to the target: everything is accepted.
    let mut draft_model = TableLm::new(&P);
    let (out, stats) = generate(
        &mut target,
        &mut DraftModel::new(&mut draft_model),
        &prompt,
        &SamplerConfig::greedy(),
        &SpecConfig { k: 4, adaptive: false, ..Default::default() },
        12,
        &[],
        |_| ControlFlow::Continue(()),
    )
    .unwrap();
    assert_eq!(out, want);
    assert_eq!(stats.acceptance_rate(), 1.0);
    assert!(stats.target_forwards <= 1 + 12 / 4 + 1, "{stats:?}");
    // A poor draft still gives exactly the target's greedy output.
    let mut target = TableLm::new(&P);
    let mut bad = TableLm::new(&Q);
    let (out, stats) = generate(&mut target, &mut DraftModel::new(&mut bad), &prompt, &SamplerConfig::greedy(), &SpecConfig::default(), 12, &[], |_| ControlFlow::Continue(())).unwrap();
    assert_eq!(out, want);
    assert!(stats.acceptance_rate() < 1.0);
    // Prompt lookup too.
    let mut target = TableLm::new(&P);
    let (out, _) = generate(&mut target, &mut PromptLookup::default(), &prompt, &SamplerConfig::greedy(), &SpecConfig::default(), 12, &[], |_| ControlFlow::Continue(())).unwrap();
    assert_eq!(out, want);
    // The target cache holds exactly the sequence minus its last token.
    assert_eq!(target.cache_len(), prompt.len() + 12 - 1);
}

fn exact_target_probs(prompt_last: u32, n: usize) -> HashMap<Vec<u32>, f64> {
    let mut m: HashMap<Vec<u32>, f64> = HashMap::new();
    m.insert(vec![], 1.0);
    for _ in 0..n {
        let mut next = HashMap::new();
        for (s, p) in m {
            let last = *s.last().unwrap_or(&prompt_last) as usize;
            for (t, &pt) in P[last].iter().enumerate() {
                let mut s2 = s.clone();
                s2.push(t as u32);
                *next.entry(s2).or_insert(0.0) += p * pt as f64;
            }
        }
        m = next;
    }
    m
}

#[derive(Clone, Copy, Debug)]
enum Mode {
    Draft,
    Lookup,
    /// A draft whose logits cover only id 0 and the ids seen so far (id 2 is not in the
    /// prompt, so it cannot be proposed until the target itself produces it).
    RestrictedDraft,
}

fn empirical(n_runs: u64, mode: Mode) -> HashMap<Vec<u32>, f64> {
    let mut counts: HashMap<Vec<u32>, f64> = HashMap::new();
    for seed in 0..n_runs {
        let mut target = TableLm::new(&P);
        let sampling = SamplerConfig { temperature: 1.0, seed: Some(seed), ..Default::default() };
        let spec = SpecConfig { k: 3, adaptive: false, ..Default::default() };
        let (out, _) = match mode {
            Mode::Lookup => {
                let prompt = [2u32, 0, 1, 0];
                generate(&mut target, &mut PromptLookup::default(), &prompt, &sampling, &spec, 3, &[], |_| ControlFlow::Continue(())).unwrap()
            }
            Mode::Draft => {
                let prompt = [2u32, 0, 1, 0];
                let mut d = TableLm::new(&Q);
                generate(&mut target, &mut DraftModel::new(&mut d), &prompt, &sampling, &spec, 3, &[], |_| ControlFlow::Continue(())).unwrap()
            }
            Mode::RestrictedDraft => {
                let prompt = [0u32, 1, 0];
                let mut d = TableLm::new(&Q);
                let mut proposer = DraftModel::new(&mut d).with_vocab(Some(1), &[]);
                generate(&mut target, &mut proposer, &prompt, &sampling, &spec, 3, &[], |_| ControlFlow::Continue(())).unwrap()
            }
        };
        *counts.entry(out).or_insert(0.0) += 1.0 / n_runs as f64;
    }
    counts
}

#[test]
fn rejection_sampling_preserves_the_target_distribution() {
    let exact = exact_target_probs(0, 3);
    for mode in [Mode::Draft, Mode::Lookup, Mode::RestrictedDraft] {
        let n = 30_000;
        let emp = empirical(n, mode);
        // Each of the 27 three-token sequences: |f - p| within 4.5 standard errors.
        for (s, &p) in &exact {
            let f = emp.get(s).copied().unwrap_or(0.0);
            let se = (p * (1.0 - p) / n as f64).sqrt();
            assert!((f - p).abs() < 4.5 * se + 1e-4, "{mode:?} seq {s:?}: empirical {f:.4} vs exact {p:.4}");
        }
        assert!(emp.keys().all(|k| exact.contains_key(k)));
    }
}
