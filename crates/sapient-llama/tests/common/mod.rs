// Each test crate uses part of this module.
#![allow(dead_code)]

//! What the llama.cpp comparisons share: greedy decoding of one prompt free-running and
//! teacher-forced on llama.cpp's continuation (tests/data/llama/*_greedy.json, made by
//! scripts/reference/llamacpp_greedy.sh).

use anyhow::Result;
use sapient_llama::{LlamaModel, Logits};
use sapient_tokenizers::Tokenizer;

/// Arg-max, the runner-up, and the gap between them (logits).
pub fn top2(l: &[f32]) -> (u32, u32, f32) {
    let mut best = (0usize, f32::NEG_INFINITY);
    let mut second = (0usize, f32::NEG_INFINITY);
    for (i, &x) in l.iter().enumerate() {
        if x > best.1 {
            second = best;
            best = (i, x);
        } else if x > second.1 {
            second = (i, x);
        }
    }
    (best.0 as u32, second.0 as u32, best.1 - second.1)
}

/// How one prompt's greedy decoding compares with llama.cpp's continuation `want`.
pub struct Comparison {
    /// Free-running: `None` when all 64 tokens give llama.cpp's text, else how many agree
    /// before the first divergence.
    pub agreed: Option<usize>,
    /// Teacher-forced on llama.cpp's tokens: each step where our arg-max is not llama.cpp's
    /// token, as (step, rank of llama.cpp's token in our logits, our margin over it).
    pub differ: Vec<(usize, usize, f32)>,
    /// Teacher-forced steps (llama.cpp's tokens).
    pub steps: usize,
}

/// Decodes `prompt` greedily for 64 tokens (1) free-running and (2) teacher-forced on the
/// tokens of llama.cpp's continuation `want`, printing where and by how much they part.
/// `label` names the prompt in messages.
pub fn compare(m: &mut LlamaModel, tok: &Tokenizer, prompt: &str, want: &str, label: &str) -> Result<Comparison> {
    let ids = tok.encode(prompt, true)?;
    // (1) Free-running greedy.
    m.clear_cache();
    let mut logits = m.forward(&ids, Logits::Last)?.squeeze(0)?.to_vec1::<f32>()?;
    let mut out = Vec::new();
    let mut agreed = None;
    for i in 0..64 {
        let (next, second, gap) = top2(&logits);
        if tok.eos_token_ids().contains(&next) {
            break;
        }
        out.push(next);
        let text = tok.decode(&out, false)?;
        if agreed.is_none() && !want.starts_with(text.trim_end_matches('\u{FFFD}')) {
            agreed = Some(i);
            eprintln!(
                "{label} ({} tokens): agrees for {i} tokens, then ours {:?} over {:?} by {gap:.3}",
                ids.len(),
                tok.decode(&[next], false)?,
                tok.decode(&[second], false)?
            );
        }
        logits = m.forward(&[next], Logits::Last)?.squeeze(0)?.to_vec1::<f32>()?;
    }
    let text = tok.decode(&out, false)?;
    match agreed {
        None => {
            assert_eq!(text, want, "{label}");
            eprintln!("{label} ({} tokens): identical for 64 tokens", ids.len());
        }
        Some(_) => eprintln!("  ours:      {text:?}\n  llama.cpp: {want:?}"),
    }
    // (2) Teacher-forced on llama.cpp's tokens.
    let theirs = tok.encode(want, false)?;
    assert_eq!(tok.decode(&theirs, false)?, want, "{label}: llama.cpp's text does not re-tokenize to itself");
    m.clear_cache();
    let mut logits = m.forward(&ids, Logits::Last)?.squeeze(0)?.to_vec1::<f32>()?;
    let mut differ = Vec::new();
    for (i, &t) in theirs.iter().enumerate() {
        let (best, _, _) = top2(&logits);
        if best != t {
            let margin = logits[best as usize] - logits[t as usize];
            let rank = 1 + logits.iter().filter(|&&x| x > logits[t as usize]).count();
            differ.push((i, rank, margin));
        }
        if i + 1 < theirs.len() {
            logits = m.forward(&[t], Logits::Last)?.squeeze(0)?.to_vec1::<f32>()?;
        }
    }
    eprintln!("  teacher-forced: our arg-max differs at (step, rank of llama.cpp's token, margin) {differ:.3?}");
    Ok(Comparison { agreed, differ, steps: theirs.len() })
}
