//! Speculative decoding on the synthetic Qwen3.5 (tests/common/qwen35.rs): the MTP head
//! against a plain implementation of llama.cpp's `graph_mtp`, and the recurrent state rolled
//! back after a verification step against plain decoding.

#[path = "common/qwen35.rs"]
mod qwen35;

use anyhow::{Context, Result};
use candle_core::{DType, Device};
use sapient_llama::{BatchSeq, KvBudget, KvCache, KvDtype, KvOptions, LlamaConfig, LlamaModel, Logits, SeqId};
use sapient_tensor::WeightSource;
use std::path::Path;

fn tmp() -> &'static Path {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
}

fn load(path: &Path) -> Result<LlamaModel> {
    let g = sapient_tensor::GgufFile::open(path)?;
    let cfg = LlamaConfig::from_gguf(&g)?;
    Ok(LlamaModel::load(&g, &cfg, &Device::Cpu, Some(512))?)
}

fn opts() -> KvOptions {
    KvOptions { block_size: 16, budget: KvBudget::Tokens(2048), dtype: KvDtype::F16 }
}

fn argmax(l: &[f32]) -> u32 {
    l.iter().enumerate().fold(0, |b, (i, x)| if *x > l[b] { i } else { b }) as u32
}

/// One forward of `tokens` appended to `seq`; the logits of every row (`all`) or the last.
fn run(m: &mut LlamaModel, kv: &mut KvCache, seq: SeqId, tokens: &[u32], all: bool) -> Result<Vec<f32>> {
    let mut out = Vec::new();
    let logits = Some(if all { Logits::All } else { Logits::Last });
    m.forward_batch(kv, &[BatchSeq { seq, tokens, logits }], &mut out)?;
    Ok(out)
}

/// A verification step of the newest token and three guesses, rolled back to each number
/// of accepted guesses (none, some, all), then decoding on: every logit is bit for bit what
/// plain decoding (one position a step) gives, since the state after each verified row is
/// the one the recurrence computed for that row, and rows do not depend on their batch.
/// A length the step did not cover cannot be rolled back to, and changes nothing.
#[test]
fn verification_rolls_the_recurrent_state_back_to_plain_decoding() -> Result<()> {
    let file = qwen35::Synthetic::build(tmp())?;
    let mut m = load(file.path())?;
    m.set_keep_row_states(true);
    let mut kv = m.new_kv_cache(opts())?;
    let vocab = m.config().vocab_size;
    let prompt: Vec<u32> = (0..40u32).map(|i| (i * 7919 + 13) % 5000).collect();
    // Plain greedy decoding: the reference tokens and the logits after each.
    let plain = kv.new_seq();
    let mut logits = run(&mut m, &mut kv, plain, &prompt, false)?;
    let mut greedy = Vec::new();
    let mut plain_logits = Vec::new();
    for _ in 0..9 {
        let t = argmax(&logits);
        greedy.push(t);
        logits = run(&mut m, &mut kv, plain, &[t], false)?;
        plain_logits.push(logits.clone());
    }
    let n = prompt.len();
    for accepted in 0..=3 {
        // Guesses: the greedy tokens up to `accepted`, then a wrong one.
        let mut guesses: Vec<u32> = greedy[1..4].to_vec();
        if accepted < 3 {
            guesses[accepted] = (greedy[accepted + 1] + 1) % vocab as u32;
        }
        let s = kv.new_seq();
        run(&mut m, &mut kv, s, &prompt, false)?;
        let mut fed = vec![greedy[0]];
        fed.extend(&guesses);
        let rows = run(&mut m, &mut kv, s, &fed, true)?;
        // The verification rows give plain decoding's logits where the guesses were right.
        for r in 0..=accepted {
            assert_eq!(&rows[r * vocab..(r + 1) * vocab], &plain_logits[r][..], "accepted {accepted}: verified row {r}");
        }
        let keep = n + 1 + accepted;
        if accepted < 3 {
            let e = kv.rollback_state(s, n).err().context("a length the step did not cover")?;
            assert!(matches!(e, sapient_llama::Error::StateRollback { .. }), "{e}");
        }
        kv.rollback_state(s, keep)?;
        kv.set_len(s, keep)?;
        // Decode on from the token after the accepted ones.
        let mut t = greedy[accepted + 1];
        for (i, want) in plain_logits.iter().enumerate().skip(accepted + 1).take(4) {
            let l = run(&mut m, &mut kv, s, &[t], false)?;
            assert_eq!(&l[..], &want[..], "accepted {accepted}: decode step {i} after the rollback");
            t = greedy[i + 1];
        }
        kv.free(s)?;
    }
    Ok(())
}

/// RMSNorm of `x` by `w` (eps 1e-6, as the synthetic file states).
fn rms(x: &[f32], w: &[f32]) -> Vec<f32> {
    let ss = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let inv = 1.0 / (ss + 1e-6).sqrt();
    x.iter().zip(w).map(|(v, w)| v * inv * w).collect()
}

/// `W x` for a row-major `[out, in]` weight.
fn matvec(w: &[f32], x: &[f32]) -> Vec<f32> {
    w.chunks_exact(x.len()).map(|r| r.iter().zip(x).map(|(a, b)| a * b).sum()).collect()
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// The MTP head at position 0 (one key: attention gives its value, whatever the query and
/// RoPE), against llama.cpp's `graph_mtp` written out plainly from the file's f32 weights:
/// `eh_proj([enorm(embed(t)) | hnorm(h)])`, the gated-attention layer, the MLP,
/// `shared_head_norm` and the tied output layer. This pins the order of the concatenation
/// and which norm goes where. Tolerance: the head's keys and values are cached in f16.
#[test]
fn mtp_head_matches_llama_cpps_graph_at_position_zero() -> Result<()> {
    use qwen35::{FF, H, HD, HEADS, KV, LAYERS};
    let file = qwen35::Synthetic::build(tmp())?;
    let mut m = load(file.path())?;
    assert!(m.has_mtp());
    let g = sapient_tensor::GgufFile::open(file.path())?;
    let w = |name: &str, shape: &[usize]| -> Result<Vec<f32>> {
        Ok(WeightSource::tensor(&g, name, shape, &Device::Cpu, DType::F32)?.flatten_all()?.to_vec1::<f32>()?)
    };
    let vocab = m.config().vocab_size;
    let b = |n: &str| format!("blk.{LAYERS}.{n}.weight");
    let token = 1234u32;
    let hidden: Vec<f32> = (0..H).map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.3).collect();
    let embed = w("token_embd.weight", &[vocab, H])?;
    let e = rms(&embed[token as usize * H..(token as usize + 1) * H], &w(&b("nextn.enorm"), &[H])?);
    let hn = rms(&hidden, &w(&b("nextn.hnorm"), &[H])?);
    let cat: Vec<f32> = e.iter().chain(&hn).copied().collect();
    let x = matvec(&w(&b("nextn.eh_proj"), &[H, 2 * H])?, &cat);
    let xn = rms(&x, &w(&b("attn_norm"), &[H])?);
    let qg = matvec(&w(&b("attn_q"), &[2 * HEADS * HD, H])?, &xn);
    let v = matvec(&w(&b("attn_v"), &[KV * HD, H])?, &xn);
    let mut att = vec![0f32; HEADS * HD];
    for hd in 0..HEADS {
        let kvh = hd / (HEADS / KV);
        for j in 0..HD {
            let gate = qg[hd * 2 * HD + HD + j];
            att[hd * HD + j] = v[kvh * HD + j] / (1.0 + (-gate).exp());
        }
    }
    let o = matvec(&w(&b("attn_output"), &[H, HEADS * HD])?, &att);
    let x: Vec<f32> = x.iter().zip(&o).map(|(a, b)| a + b).collect();
    let xn = rms(&x, &w(&b("post_attention_norm"), &[H])?);
    let gate = matvec(&w(&b("ffn_gate"), &[FF, H])?, &xn);
    let up = matvec(&w(&b("ffn_up"), &[FF, H])?, &xn);
    let act: Vec<f32> = gate.iter().zip(&up).map(|(g, u)| silu(*g) * u).collect();
    let down = matvec(&w(&b("ffn_down"), &[H, FF])?, &act);
    let x: Vec<f32> = x.iter().zip(&down).map(|(a, b)| a + b).collect();
    let want_hidden = rms(&x, &w(&b("nextn.shared_head_norm"), &[H])?);
    let want = matvec(&embed, &want_hidden);
    let mut kv = m.new_mtp_cache(opts())?;
    let s = kv.new_seq();
    let mut got = Vec::new();
    m.mtp_forward(&mut kv, &[BatchSeq { seq: s, tokens: &[token], logits: Some(Logits::Last) }], &hidden, &mut got)?;
    let top = want.iter().fold(0f32, |a, v| a.max(v.abs()));
    let worst = want.iter().zip(&got).fold(0f32, |a, (x, y)| a.max((x - y).abs()));
    assert!(worst < 1e-3 * top.max(1.0), "MTP logits differ by {worst} (largest {top})");
    assert_eq!(argmax(&got), argmax(&want));
    let gh = m.mtp_hidden(1).context("the head's hidden state")?;
    let hw = want_hidden.iter().zip(gh).fold(0f32, |a, (x, y)| a.max((x - y).abs()));
    assert!(hw < 1e-3, "MTP hidden state differs by {hw}");
    // A second position attends over both (its result depends on the first's cached keys).
    let before = got.clone();
    m.mtp_forward(&mut kv, &[BatchSeq { seq: s, tokens: &[token], logits: Some(Logits::Last) }], &hidden, &mut got)?;
    assert_eq!(kv.len(s)?, 2);
    assert_ne!(before, got, "position 1 sees position 0 and its own RoPE");
    Ok(())
}
