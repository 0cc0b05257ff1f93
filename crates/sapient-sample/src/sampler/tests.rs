//! The sampler chain's tests.

use super::*;
use crate::*;

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

/// The sampler's exponential against the library's, over its whole range.
#[test]
fn exp_nonpositive_is_within_a_few_ulps() {
    let mut worst = 0f64;
    for i in 0..=2_000_000 {
        let x = -87.0 * i as f32 / 2_000_000.0;
        let (got, want) = (exp_nonpositive(x) as f64, (x as f64).exp());
        worst = worst.max(((got - want) / want).abs());
    }
    assert!(worst < 4e-7, "relative error {worst}");
    assert_eq!(exp_nonpositive(0.0), 1.0);
    assert_eq!(exp_nonpositive(-1000.0), exp_nonpositive(-87.0));
}

/// A configuration that was never validated gets an error for top-k 0, not a panic.
#[test]
fn unvalidated_top_k_zero_is_an_error() {
    let cfg = SamplerConfig { temperature: 1.0, top_k: Some(0), ..Default::default() };
    assert!(matches!(filtered_distribution(&[1.0, 2.0], &cfg), Err(Error::InvalidParameter(_))));
}

/// The old full-sort filter: every candidate sorted, then top-p and min-p.
fn full_sort_distribution(logits: &[f32], cfg: &SamplerConfig) -> Vec<(u32, f32)> {
    let t = cfg.temperature.max(f32::MIN_POSITIVE);
    let mut c: Vec<(u32, f32)> = logits.iter().enumerate().filter(|(_, l)| l.is_finite()).map(|(i, &l)| (i as u32, l / t)).collect();
    c.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    if let Some(k) = cfg.top_k {
        c.truncate(k);
    }
    let max = c[0].1;
    let z: f64 = c.iter().map(|x| ((x.1 - max).exp()) as f64).sum();
    let mut p: Vec<(u32, f32)> = c.iter().map(|x| (x.0, (((x.1 - max).exp()) as f64 / z) as f32)).collect();
    if let Some(tp) = cfg.top_p.filter(|&tp| tp < 1.0) {
        let mut acc = 0f32;
        let keep = p.iter().position(|x| {
            acc += x.1;
            acc >= tp
        });
        p.truncate(keep.map_or(p.len(), |i| i + 1));
    }
    if let Some(mp) = cfg.min_p {
        let th = p[0].1 * mp;
        p.retain(|x| x.1 >= th);
    }
    let total = p.iter().map(|x| x.1 as f64).sum::<f64>() as f32;
    p.into_iter().map(|(i, x)| (i, x / total)).collect()
}

/// The filters that sort only as far as they need (top-p, min-p, the plain draw) keep
/// the full sort's tokens, order and probabilities, on a large vocabulary with ties.
#[test]
fn partial_sorting_matches_the_full_sort() {
    let mut rng = StdRng::seed_from_u64(11);
    let n = 20_000;
    for case in 0..12 {
        // Peaked and flat distributions; some ties (logits on a coarse grid).
        let spread = [2.0f32, 8.0, 30.0][case % 3];
        let logits: Vec<f32> = (0..n).map(|_| (rng.random_range(-spread..spread) * 4.0).round() / 4.0).collect();
        let cfgs = [
            SamplerConfig { temperature: 0.8, top_p: Some(0.9), ..Default::default() },
            SamplerConfig { temperature: 1.0, top_p: Some(0.5), min_p: Some(0.05), ..Default::default() },
            SamplerConfig { temperature: 1.3, min_p: Some(0.1), ..Default::default() },
            SamplerConfig { temperature: 1.0, top_k: Some(300), top_p: Some(0.95), ..Default::default() },
            SamplerConfig { temperature: 1.0, ..Default::default() },
        ];
        for cfg in &cfgs {
            let got = filtered_distribution(&logits, cfg).unwrap();
            let want = full_sort_distribution(&logits, cfg);
            assert_eq!(got.len(), want.len(), "{cfg:?}");
            for (g, w) in got.iter().zip(&want) {
                assert_eq!(g.0, w.0, "{cfg:?}");
                assert!((g.1 - w.1).abs() <= 1e-6 * w.1.max(1e-30) + 1e-12, "{cfg:?}: {} vs {}", g.1, w.1);
            }
        }
        // The plain draw (no list built) picks what walking the list picks, seed for seed.
        let cfg = SamplerConfig { temperature: 1.0, seed: Some(case as u64), ..Default::default() };
        let (mut a, mut b) = (Sampler::new(cfg.clone()).unwrap(), StdRng::seed_from_u64(case as u64));
        let list = filtered_distribution(&logits, &cfg).unwrap();
        for _ in 0..200 {
            let got = a.sample(&mut logits.clone(), &[]).unwrap();
            let r: f32 = b.random();
            let mut acc = 0f32;
            let want = list.iter().find(|x| {
                acc += x.1;
                r < acc
            });
            assert_eq!(got, want.map_or(list[list.len() - 1].0, |x| x.0));
        }
    }
}

/// The vectorized argmax against a plain scan (the first of the largest, NaN and -inf
/// skipped), on lengths around the sixteen lanes, with ties, NaN and infinities.
#[test]
fn argmax_is_the_first_of_the_largest() {
    let plain = |l: &[f32]| {
        let mut best: Option<(usize, f32)> = None;
        for (i, &x) in l.iter().enumerate() {
            if !x.is_nan() && x != f32::NEG_INFINITY && best.is_none_or(|(_, b)| x > b) {
                best = Some((i, x));
            }
        }
        best.map(|(i, _)| i as u32)
    };
    let mut rng = StdRng::seed_from_u64(7);
    for len in [1usize, 15, 16, 17, 33, 100, 1000] {
        for case in 0..50 {
            let l: Vec<f32> = (0..len)
                .map(|_| match rng.random_range(0..20) {
                    0 => f32::NAN,
                    1 => f32::NEG_INFINITY,
                    2 if case % 5 == 0 => f32::INFINITY,
                    3 => -0.0,
                    // Few distinct values: many ties.
                    _ => rng.random_range(-3..4) as f32,
                })
                .collect();
            assert_eq!(argmax(&l).ok(), plain(&l), "{l:?}");
        }
    }
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
fn chain_order_top_k_before_top_p_before_min_p() {
    // p = 0.4, 0.3, 0.2, 0.1. top-k 3 renormalises to 4/9, 3/9, 2/9; top-p 0.75 then keeps
    // two (4/9 + 3/9 >= 0.75), whereas on the full distribution it would keep three.
    let logits = [0.4f32.ln(), 0.3f32.ln(), 0.2f32.ln(), 0.1f32.ln()];
    let cfg = SamplerConfig { temperature: 1.0, top_k: Some(3), top_p: Some(0.75), ..Default::default() };
    let d = filtered_distribution(&logits, &cfg).unwrap();
    assert_eq!(d.iter().map(|c| c.0).collect::<Vec<_>>(), vec![0, 1]);
    assert!((d[0].1 - 4.0 / 7.0).abs() < 1e-5 && (d[1].1 - 3.0 / 7.0).abs() < 1e-5);
    let cfg = SamplerConfig { temperature: 1.0, top_p: Some(0.75), ..Default::default() };
    assert_eq!(filtered_distribution(&logits, &cfg).unwrap().len(), 3);
    // min-p after top-p: of the nucleus {0.4, 0.3, 0.2} renormalised, 0.2/0.9 < 0.6 * 0.4/0.9.
    let cfg = SamplerConfig { temperature: 1.0, top_p: Some(0.75), min_p: Some(0.6), ..Default::default() };
    assert_eq!(filtered_distribution(&logits, &cfg).unwrap().iter().map(|c| c.0).collect::<Vec<_>>(), vec![0, 1]);
}

#[test]
fn bias_applies_before_temperature() {
    let mut bias = HashMap::new();
    bias.insert(1u32, 2.0f32);
    let cfg = SamplerConfig { temperature: 2.0, logit_bias: bias, seed: Some(3), ..Default::default() };
    let mut s = Sampler::new(cfg).unwrap();
    let n = 20000;
    let ones = (0..n).filter(|_| s.sample(&mut [0.0, 0.0], &[]).unwrap() == 1).count();
    // (0 + 2) / 2 = 1 against 0: p = e / (1 + e)
    let p = std::f64::consts::E / (1.0 + std::f64::consts::E);
    assert!((ones as f64 / n as f64 - p).abs() < 0.015, "{ones}");
}

/// Vocabulary: 0 = EOS, 1..=4 = "a" "b" "c" "d", then 40 filler tokens "x0".. "x39".
fn small_index() -> std::sync::Arc<TokenIndex> {
    let mut toks: Vec<Vec<u8>> = vec![b"</s>".to_vec(), b"a".to_vec(), b"b".to_vec(), b"c".to_vec(), b"d".to_vec()];
    toks.extend((0..40).map(|i| format!("x{i}").into_bytes()));
    std::sync::Arc::new(TokenIndex::new(toks, &[0], &[]))
}

#[test]
fn constrained_greedy_checks_candidates_then_falls_back() {
    let idx = small_index();
    let g = std::sync::Arc::new(Grammar::regex("[bd]c?").unwrap());
    let mut m = Matcher::new(g.clone(), idx.clone());
    let mut s = Sampler::new(SamplerConfig::greedy()).unwrap();
    let mut logits = vec![0f32; 45];
    logits[1] = 5.0; // "a" best but not allowed
    logits[4] = 4.0; // "d"
    logits[2] = 3.0; // "b"
    assert_eq!(s.sample_constrained(&mut logits.clone(), &[], &mut m).unwrap(), 4);
    assert_eq!(m.stats().masks_computed, 0, "decided by checking candidates");
    assert!(m.stats().token_checks <= 2);
    // Now "c" or EOS. Make both rank below 32 filler tokens: the full mask decides.
    let mut logits = vec![1f32; 45];
    logits[3] = -1.0;
    logits[0] = -2.0;
    assert_eq!(s.sample_constrained(&mut logits, &[], &mut m).unwrap(), 3);
    assert_eq!(m.stats().masks_computed, 1);
    // Only EOS is left.
    assert_eq!(s.sample_constrained(&mut [0f32; 45], &[], &mut m).unwrap(), 0);
    assert!(m.is_finished());
}

#[test]
fn constrained_sampling_follows_the_restricted_distribution() {
    let idx = small_index();
    let g = std::sync::Arc::new(Grammar::regex("[bd]").unwrap());
    let mut m = Matcher::new(g, idx);
    let mut logits = vec![f32::NEG_INFINITY; 45];
    for (t, p) in [(1, 0.4f32), (2, 0.3), (3, 0.2), (4, 0.1)] {
        logits[t] = p.ln();
    }
    let mut s = Sampler::new(SamplerConfig { temperature: 1.0, seed: Some(11), ..Default::default() }).unwrap();
    let n = 20000;
    let mut b = 0;
    for _ in 0..n {
        let t = s.sample_constrained(&mut logits.clone(), &[], &mut m).unwrap();
        assert!(t == 2 || t == 4, "{t}");
        b += (t == 2) as usize;
        m.rollback(1).unwrap();
    }
    // 0.3 / (0.3 + 0.1)
    assert!((b as f64 / n as f64 - 0.75).abs() < 0.015, "{b}");
    // top-k 1 keeps only "a", which is not allowed: the mask is applied before the chain
    // and the best allowed token ("b") is the only candidate left.
    let mut s = Sampler::new(SamplerConfig { temperature: 1.0, top_k: Some(1), seed: Some(1), ..Default::default() }).unwrap();
    for _ in 0..20 {
        assert_eq!(s.sample_constrained(&mut logits.clone(), &[], &mut m).unwrap(), 2);
        m.rollback(1).unwrap();
    }
}

#[test]
fn constrained_sampling_masks_before_the_filters() {
    // Allowed: "b", "d" and the filler tokens x10..x19 (ids 15..=24), and x1.
    let idx = small_index();
    let g = std::sync::Arc::new(Grammar::regex("[bd]|x1[0-9]").unwrap());
    let logits: Vec<f32> = (0..45).map(|i| ((i * 37 % 45) as f32 / 9.0) - if i == 0 { 50.0 } else { 0.0 }).collect();
    // (x1, a prefix of x10..x19, is allowed too.)
    let mask = Matcher::new(g.clone(), idx.clone()).mask().unwrap();
    assert_eq!(mask.iter().collect::<Vec<_>>(), [2, 4, 6].into_iter().chain(15..=24).collect::<Vec<u32>>());
    let mut masked = logits.clone();
    mask.apply(&mut masked);
    let configs = [
        SamplerConfig { temperature: 1.0, top_k: Some(3), ..Default::default() },
        SamplerConfig { temperature: 0.7, top_p: Some(0.6), ..Default::default() },
        SamplerConfig { temperature: 1.3, top_k: Some(5), top_p: Some(0.8), min_p: Some(0.2), ..Default::default() },
        SamplerConfig { temperature: 1.0, min_p: Some(0.3), ..Default::default() },
        SamplerConfig { temperature: 2.0, ..Default::default() },
    ];
    for (ci, cfg) in configs.into_iter().enumerate() {
        let expected = filtered_distribution(&masked, &cfg).unwrap();
        let mut s = Sampler::new(SamplerConfig { seed: Some(ci as u64), ..cfg.clone() }).unwrap();
        let mut m = Matcher::new(g.clone(), idx.clone());
        let n = 20000;
        let mut counts = vec![0usize; 45];
        for _ in 0..n {
            let t = s.sample_constrained(&mut logits.clone(), &[], &mut m).unwrap();
            counts[t as usize] += 1;
            m.rollback(1).unwrap();
        }
        for (t, &c) in counts.iter().enumerate() {
            let want = expected.iter().find(|e| e.0 == t as u32).map_or(0.0, |e| e.1 as f64);
            let got = c as f64 / n as f64;
            assert!((got - want).abs() < 0.015, "config {ci}: token {t}: {got} vs {want}");
        }
        assert!(m.stats().masks_computed <= 1, "config {ci}: {:?}", m.stats());
    }
}

#[test]
fn constrained_dead_end_is_an_error_not_a_loop() {
    // "ab" then "q": the vocabulary has no "q", so after "ab" no token continues.
    let idx = small_index();
    let g = std::sync::Arc::new(Grammar::regex("abq").unwrap());
    for cfg in [SamplerConfig::greedy(), SamplerConfig { temperature: 1.0, top_p: Some(0.9), seed: Some(1), ..Default::default() }] {
        let mut m = Matcher::new(g.clone(), idx.clone());
        let mut s = Sampler::new(cfg).unwrap();
        assert_eq!(s.sample_constrained(&mut [0f32; 45], &[], &mut m).unwrap(), 1);
        assert_eq!(s.sample_constrained(&mut [0f32; 45], &[], &mut m).unwrap(), 2);
        assert!(matches!(s.sample_constrained(&mut [0f32; 45], &[], &mut m), Err(Error::DeadEnd)));
    }
}

#[test]
fn top_candidates_match_a_full_sort() {
    let logits: Vec<f32> = (0..500).map(|i| ((i * 7919) % 1000) as f32 / 10.0 - if i % 13 == 0 { f32::INFINITY } else { 0.0 }).collect();
    let mut all: Vec<(u32, f32)> = logits.iter().enumerate().filter(|(_, l)| l.is_finite()).map(|(i, &l)| (i as u32, l)).collect();
    all.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    assert_eq!(top_candidates(&logits, 32), all[..32].to_vec());
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
