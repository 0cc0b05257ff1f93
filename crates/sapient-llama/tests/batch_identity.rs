//! Batched forward passes over the paged KV cache give every sequence exactly what it gets
//! alone: eight prompts of mixed lengths, some joining while others decode, prompts fed in
//! chunks beside decode rows, blocks scattered over the pool, one prompt taking another's
//! cached prefix. Logits are compared bit for bit, and greedy tokens follow from them.

use anyhow::Result;
use candle_core::Device;
use sapient_llama::{BatchSeq, KvBudget, KvCache, KvDtype, KvOptions, LlamaModel, Logits, SeqId};

const STEPS: usize = 10;

fn argmax(l: &[f32]) -> u32 {
    l.iter().enumerate().fold(0, |b, (i, x)| if *x > l[b] { i } else { b }) as u32
}

fn bits(l: &[f32]) -> Vec<u32> {
    l.iter().map(|x| x.to_bits()).collect()
}

fn prompts(tok: &sapient_tokenizers::Tokenizer) -> Result<Vec<Vec<u32>>> {
    let texts = [
        "The capital of France is",
        "def fibonacci(n):\n    if n < 2:\n        return n\n",
        "Once upon a time, in a small village at the edge of a great forest, there lived an old woodcutter and his three daughters. Every morning he",
        "Hi",
        "List three prime numbers:",
        "In 1969, the Apollo 11 mission landed the first humans on the Moon. The astronauts were Neil Armstrong, Buzz Aldrin and Michael Collins, who stayed in orbit. After the landing,",
        "Water boils at",
        // Shares its first 40+ tokens with the third prompt (a cached prefix).
        "Once upon a time, in a small village at the edge of a great forest, there lived an old woodcutter and his three daughters. The youngest",
    ];
    texts.iter().map(|t| Ok(tok.encode(t, true)?)).collect()
}

/// Greedy decoding of `prompt` alone: the logits of each step.
fn alone(model: &mut LlamaModel, prompt: &[u32], dtype: KvDtype) -> Result<Vec<Vec<u32>>> {
    let mut kv = model.new_kv_cache(KvOptions { block_size: 64, budget: KvBudget::Tokens(1024), dtype })?;
    let seq = kv.new_seq();
    let mut out = Vec::new();
    let mut logits = Vec::new();
    model.forward_batch(&mut kv, &[BatchSeq { seq, tokens: prompt, logits: Some(Logits::Last) }], &mut logits)?;
    for _ in 0..STEPS {
        out.push(bits(&logits));
        let t = argmax(&logits);
        model.forward_batch(&mut kv, &[BatchSeq { seq, tokens: &[t], logits: Some(Logits::Last) }], &mut logits)?;
    }
    Ok(out)
}

struct Running {
    seq: SeqId,
    prompt: Vec<u32>,
    fed: usize,
    next: Option<u32>,
    got: Vec<Vec<u32>>,
}

#[test]
fn every_sequence_in_a_batch_gets_what_it_gets_alone() -> Result<()> {
    batch_against_alone(KvDtype::F16)
}

/// The same with the 8-bit KV cache: its queries are quantized per row, so rows stay
/// independent of the batch.
#[test]
fn every_sequence_in_a_batch_gets_what_it_gets_alone_q8_0() -> Result<()> {
    batch_against_alone(KvDtype::Q8_0)
}

fn batch_against_alone(dtype: KvDtype) -> Result<()> {
    let r = sapient_hub::Hub::new()?.fetch_preset("smollm2-135m-instruct", &mut |_| {})?;
    let g = sapient_tensor::GgufFile::open(r.file("gguf")?)?;
    let tok = sapient_tokenizers::Tokenizer::from_gguf(&g)?;
    let mut model = sapient_llama::load(r.file("gguf")?, &Device::Cpu, Some(1024))?;
    assert!(model.supports_batches());
    let prompts = prompts(&tok)?;
    let lens: Vec<usize> = prompts.iter().map(|p| p.len()).collect();
    assert!(lens.iter().min() < Some(&4) && lens.iter().max() > Some(&30), "mixed lengths: {lens:?}");
    let reference: Vec<Vec<Vec<u32>>> = prompts.iter().map(|p| alone(&mut model, p, dtype)).collect::<Result<_>>()?;

    // The smallest blocks, a pool shared by all: sequences' blocks interleave.
    let mut kv: KvCache = model.new_kv_cache(KvOptions { block_size: 16, budget: KvBudget::Tokens(2048), dtype })?;
    let joins = [0, 0, 1, 2, 4, 4, 6, 9];
    // Prompt chunks that do not line up with the blocks.
    let chunk = 12;
    let mut running: Vec<Option<Running>> = (0..prompts.len()).map(|_| None).collect();
    let mut logits = Vec::new();
    let mut reused = 0;
    let mut step = 0;
    loop {
        for (i, &j) in joins.iter().enumerate() {
            if j == step {
                let seq = kv.new_seq();
                // The last prompt may start from the third one's blocks (once they are full).
                let fed = kv.attach_prefix(seq, &prompts[i])?;
                reused += fed;
                running[i] = Some(Running { seq, prompt: prompts[i].clone(), fed, next: None, got: Vec::new() });
            }
        }
        let mut batch = Vec::new();
        let mut who = Vec::new();
        let mut feeds: Vec<(usize, Vec<u32>, bool)> = Vec::new();
        for (i, r) in running.iter().enumerate() {
            let Some(r) = r else { continue };
            if r.got.len() == STEPS {
                continue;
            }
            if r.fed < r.prompt.len() {
                let n = (r.prompt.len() - r.fed).min(chunk);
                let last = r.fed + n == r.prompt.len();
                feeds.push((i, r.prompt[r.fed..r.fed + n].to_vec(), last));
            } else if let Some(t) = r.next {
                feeds.push((i, vec![t], true));
            }
        }
        if feeds.is_empty() && step > *joins.iter().max().unwrap_or(&0) {
            break;
        }
        for (i, toks, want) in &feeds {
            let r = running[*i].as_ref().map(|r| r.seq).ok_or_else(|| anyhow::anyhow!("no sequence"))?;
            batch.push(BatchSeq { seq: r, tokens: toks, logits: want.then_some(Logits::Last) });
            if *want {
                who.push(*i);
            }
        }
        if !batch.is_empty() {
            let rows = model.forward_batch(&mut kv, &batch, &mut logits)?;
            assert_eq!(rows, who.len());
        }
        let vocab = model.config().vocab_size;
        for (i, toks, _) in &feeds {
            let r = running[*i].as_mut().ok_or_else(|| anyhow::anyhow!("no sequence"))?;
            if r.fed < r.prompt.len() {
                r.fed += toks.len();
                if r.fed == r.prompt.len() {
                    kv.commit(r.seq, &r.prompt)?;
                }
            }
        }
        for (row, &i) in who.iter().enumerate() {
            let r = running[i].as_mut().ok_or_else(|| anyhow::anyhow!("no sequence"))?;
            let l = &logits[row * vocab..(row + 1) * vocab];
            r.got.push(bits(l));
            r.next = Some(argmax(l));
        }
        step += 1;
        assert!(step < 200, "the schedule did not finish");
    }
    // The last prompt takes the third's full blocks of their common prefix.
    let common = prompts[2].iter().zip(&prompts[7]).take_while(|(a, b)| a == b).count();
    assert!(common >= 16, "the prompts share {common} tokens");
    assert_eq!(reused, common / 16 * 16, "positions taken from the prefix cache");
    for (i, r) in running.iter().enumerate() {
        let r = r.as_ref().ok_or_else(|| anyhow::anyhow!("prompt {i} never ran"))?;
        assert_eq!(r.got.len(), STEPS, "prompt {i}");
        for (s, (a, b)) in reference[i].iter().zip(&r.got).enumerate() {
            assert!(a == b, "prompt {i} (length {}), step {s}: batched logits differ from alone ({dtype} cache)", lens[i]);
        }
    }
    Ok(())
}

/// A long input fed in pieces (`set_prefill_chunk`) gives the logits of every position, and
/// the next decode step, exactly as one piece does.
#[test]
fn prefill_in_pieces_equals_one_piece() -> Result<()> {
    let r = sapient_hub::Hub::new()?.fetch_preset("smollm2-135m-instruct", &mut |_| {})?;
    let g = sapient_tensor::GgufFile::open(r.file("gguf")?)?;
    let tok = sapient_tokenizers::Tokenizer::from_gguf(&g)?;
    let mut model = sapient_llama::load(r.file("gguf")?, &Device::Cpu, Some(1024))?;
    let text = prompts(&tok)?.concat();
    let mut prompt = Vec::new();
    while prompt.len() < 300 {
        prompt.extend_from_slice(&text);
    }
    prompt.truncate(300);
    let mut run = |chunk: usize| -> Result<(Vec<u32>, Vec<u32>)> {
        model.set_prefill_chunk(chunk);
        model.clear_cache();
        let mut all = Vec::new();
        model.forward_into(&prompt, Logits::All, &mut all)?;
        let next = argmax(&all[all.len() - model.config().vocab_size..]);
        let mut step = Vec::new();
        model.forward_into(&[next], Logits::Last, &mut step)?;
        Ok((bits(&all), bits(&step)))
    };
    let whole = run(1000)?;
    assert_eq!(whole.0.len(), 300 * model_vocab(&g)?, "logits of every position");
    for chunk in [128, 77] {
        let pieces = run(chunk)?;
        if sapient_tensor::kernels::has_avx512() {
            assert!(pieces == whole, "pieces of {chunk}: logits differ from one piece");
        } else {
            let (a, b) = (&pieces.0, &whole.0);
            let worst = a.iter().zip(b).map(|(x, y)| (f32::from_bits(*x) - f32::from_bits(*y)).abs()).fold(0f32, f32::max);
            assert!(worst < 0.05, "pieces of {chunk}: logits differ by {worst}");
        }
    }
    Ok(())
}

fn model_vocab(g: &sapient_tensor::GgufFile) -> Result<usize> {
    Ok(sapient_llama::LlamaConfig::from_gguf(g)?.vocab_size)
}
