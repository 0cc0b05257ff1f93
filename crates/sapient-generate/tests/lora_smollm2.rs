//! LoRA adapters through `GenerationConfig::lora` on SmolLM2-135M-Instruct: requests without
//! adapters, with adapter A, with B and with both, run together in the engine's batched
//! steps (prompts in small chunks beside decode rows), each give to the token and to the
//! log-probability what they give alone in a fresh engine, and what the Pipeline gives; one
//! after another in one engine with the prefix cache on (same prompt) too: a request with
//! adapters takes no blocks computed without them. The adapters are synthetic (random
//! `lora_a`/`lora_b` written by our GGUF writer, sapient-llama's tests/common/lora.rs).

#[path = "../../sapient-llama/tests/common/splitmix.rs"]
mod splitmix;
#[path = "../../sapient-llama/tests/common/lora.rs"]
mod lora;

use anyhow::Result;
use sapient_generate::{Engine, EngineOptions, Generation, GenerationConfig, KvBudget, KvOptions, LoraUse, Message, Pipeline, PipelineOptions};
use std::path::Path;

fn engine_opts(chunked: bool) -> EngineOptions {
    let kv = KvOptions { block_size: 16, budget: KvBudget::Tokens(4096), ..KvOptions::default() };
    if chunked {
        EngineOptions { kv, prefill_chunk: 8, max_step_tokens: 24, ..EngineOptions::default() }
    } else {
        EngineOptions { kv, ..EngineOptions::default() }
    }
}

#[test]
fn requests_with_different_adapters_batch_together_as_alone() -> Result<()> {
    let p = Pipeline::load("smollm2-135m-instruct", PipelineOptions { max_seq_len: Some(1024), ..Default::default() }, |_| {})?;
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let (a_path, b_path) = (dir.join("gen-lora-a.gguf"), dir.join("gen-lora-b.gguf"));
    lora::smollm2_adapter(&a_path, 11, &[0, 5, 10, 15, 20, 25], 8, 16.0)?;
    lora::smollm2_adapter(&b_path, 12, &[2, 12, 22], 16, 32.0)?;
    let a = p.load_lora(&a_path)?;
    let b = p.load_lora(&b_path)?;
    assert_eq!((a, b, p.loras()?.len()), (0, 1, 2));
    let choices: Vec<Vec<LoraUse>> = vec![
        vec![],
        vec![LoraUse { id: a, scale: 1.0 }],
        vec![LoraUse { id: b, scale: 1.0 }],
        vec![LoraUse { id: a, scale: 0.5 }, LoraUse { id: b, scale: 0.8 }],
    ];
    let q = |text: &str| vec![Message::system("You are a helpful assistant."), Message::user(text)];
    // Every choice on one question (the same prompt: the prefix cache could share it), and
    // two more questions without and with A.
    let mut reqs: Vec<(Vec<Message>, Vec<LoraUse>)> = choices.iter().map(|c| (q("Name three colors."), c.clone())).collect();
    reqs.push((q("What is the capital of France?"), vec![]));
    reqs.push((q("What is the capital of France?"), choices[1].clone()));
    let cfg = |c: &[LoraUse]| GenerationConfig { ignore_eos: true, logprobs: Some(2), lora: c.to_vec(), ..GenerationConfig::default().max_tokens(24) };
    let alone: Vec<Generation> = reqs
        .iter()
        .map(|(m, c)| Ok(Engine::new(&p, engine_opts(false))?.submit_chat(m, cfg(c))?.wait()?))
        .collect::<Result<_>>()?;
    for (i, g) in alone.iter().enumerate() {
        eprintln!("request {i} ({:?}): {:?}", reqs[i].1, g.text);
    }
    // The adapters change the answers.
    for (i, g) in alone.iter().enumerate().take(4).skip(1) {
        assert_ne!(g.tokens, alone[0].tokens, "choice {i} gives the base model's answer");
    }
    assert_ne!(alone[5].tokens, alone[4].tokens);
    let same = |g: &Generation, want: &Generation, what: &str| {
        assert_eq!(g.tokens, want.tokens, "{what}: tokens");
        assert_eq!(g.logprobs, want.logprobs, "{what}: log-probabilities");
    };
    // Together, in small chunks.
    let e = Engine::new(&p, engine_opts(true))?;
    let handles: Vec<_> = reqs.iter().map(|(m, c)| e.submit_chat(m, cfg(c))).collect::<Result<_, _>>()?;
    for (i, h) in handles.into_iter().enumerate() {
        same(&h.wait()?, &alone[i], &format!("request {i} together"));
    }
    // One after another in one engine: the base model's prompt blocks are in the prefix cache
    // by the time the adapters' requests come.
    let e = Engine::new(&p, engine_opts(false))?;
    for (i, (m, c)) in reqs.iter().enumerate() {
        same(&e.submit_chat(m, cfg(c))?.wait()?, &alone[i], &format!("request {i} after the others"));
    }
    // The Pipeline's own generation.
    for i in [0, 3] {
        same(&p.chat(&reqs[i].0, &cfg(&reqs[i].1))?, &alone[i], &format!("request {i} by the Pipeline"));
    }
    // An adapter that is not loaded is refused at submission.
    assert!(e.submit_chat(&reqs[0].0, cfg(&[LoraUse { id: 7, scale: 1.0 }])).is_err());
    Ok(())
}
