//! The Engine on the real SmolLM2-135M-Instruct: concurrent requests give what they give
//! alone, cancellation frees blocks, the KV budget holds through preemption, the prefix cache
//! serves a shared system prompt, requests that cannot fit are errors, and a session saved
//! from one engine continues in another to the token; the first three with the 8-bit KV
//! cache too.

mod common;
use common::wait_idle;
use anyhow::Result;
use sapient_generate::{
    Engine, EngineOptions, Event, FinishReason, Generation, GenerationConfig, KvBudget, KvDtype, KvOptions, Message, Pipeline,
    PipelineOptions, SamplerConfig,
};
use std::sync::OnceLock;

fn pipeline() -> &'static Pipeline {
    static P: OnceLock<Pipeline> = OnceLock::new();
    P.get_or_init(|| {
        Pipeline::load("smollm2-135m-instruct", PipelineOptions { max_seq_len: Some(1024), ..Default::default() }, |_| {})
            .expect("SmolLM2 loads")
    })
}

fn questions() -> Vec<Vec<Message>> {
    [
        "What is the capital of France?",
        "Name three colors.",
        "Write a haiku about the sea.",
        "Hi",
        "Explain in two sentences why the sky is blue, and mention Rayleigh scattering by name.",
        "What is 12 times 12?",
        "Give me a short list of fruits that are red, and say which one is your favourite and why.",
        "Translate 'good morning' into Spanish.",
    ]
    .iter()
    .map(|q| vec![Message::system("You are a helpful assistant."), Message::user(*q)])
    .collect()
}

fn small(opts: EngineOptions) -> EngineOptions {
    small_with(opts, KvDtype::F16)
}

fn small_with(opts: EngineOptions, dtype: KvDtype) -> EngineOptions {
    EngineOptions { kv: KvOptions { block_size: 16, budget: KvBudget::Tokens(4096), dtype }, ..opts }
}

#[test]
fn concurrent_requests_give_what_they_give_alone() -> Result<()> {
    concurrent_against_alone(KvDtype::F16)
}

/// The same with the 8-bit KV cache: every request gives, to the bit, what it gives alone.
#[test]
fn concurrent_requests_give_what_they_give_alone_q8_0() -> Result<()> {
    concurrent_against_alone(KvDtype::Q8_0)
}

fn concurrent_against_alone(dtype: KvDtype) -> Result<()> {
    let p = pipeline();
    let qs = questions();
    // Different seeds and temperatures too: a sampled request's draws are its own.
    let cfg = |i: usize| {
        let c = GenerationConfig::default().max_tokens(24);
        if i % 3 == 2 {
            c.sampling(SamplerConfig { temperature: 0.8, top_p: Some(0.9), seed: Some(i as u64), ..Default::default() })
        } else {
            c
        }
    };
    let alone: Vec<Generation> = {
        let e = Engine::new(p, small_with(EngineOptions::default(), dtype))?;
        qs.iter().enumerate().map(|(i, q)| e.submit_chat(q, cfg(i))?.wait()).collect::<Result<_, _>>()?
    };
    // The greedy ones equal the Pipeline's own answers (its engine keeps f16).
    for (i, q) in qs.iter().enumerate().filter(|(i, _)| i % 3 != 2 && dtype == KvDtype::F16) {
        let g = p.chat(q, &cfg(i))?;
        assert_eq!(g.tokens, alone[i].tokens, "request {i}: engine alone vs Pipeline");
    }
    // Small prompt chunks and steps: prompts are split and mixed with decode rows.
    let e = Engine::new(p, small_with(EngineOptions { prefill_chunk: 8, max_step_tokens: 24, ..Default::default() }, dtype))?;
    let mut handles = Vec::new();
    for (i, q) in qs.iter().enumerate().take(4) {
        handles.push((i, e.submit_chat(q, cfg(i))?));
    }
    // Wait until the first streams text, then the rest join mid-way.
    let (i0, mut h0) = handles.remove(0);
    let first_text = match h0.blocking_next() {
        Some(Event::Text(t)) => t,
        Some(Event::Done(r)) => anyhow::bail!("request 0 ended before streaming: {:?}", r.map(|g| g.text)),
        Some(other) => anyhow::bail!("unexpected event {other:?}"),
        None => anyhow::bail!("request 0 vanished"),
    };
    for (i, q) in qs.iter().enumerate().skip(4) {
        handles.push((i, e.submit_chat(q, cfg(i))?));
    }
    let g0 = h0.wait()?;
    assert!(alone[i0].text.starts_with(&first_text));
    assert_eq!(g0.tokens, alone[i0].tokens, "request {i0}");
    for (i, h) in handles {
        let g = h.wait()?;
        assert_eq!(g.tokens, alone[i].tokens, "request {i}: concurrent vs alone");
        assert_eq!(g.text, alone[i].text, "request {i}");
    }
    let m = e.metrics();
    assert!(m.steps > 0 && m.finished == 8, "{m:?}");
    wait_idle(&e)?;
    Ok(())
}

#[test]
fn a_dropped_receiver_cancels_and_frees_its_blocks() -> Result<()> {
    let e = Engine::new(pipeline(), small(EngineOptions::default()))?;
    let cfg = GenerationConfig { ignore_eos: true, ..GenerationConfig::default().max_tokens(400) };
    let mut h = e.submit_chat(&questions()[2], cfg)?;
    let mut got = 0;
    while got < 3 {
        match h.blocking_next() {
            Some(Event::Text(_)) => got += 1,
            other => anyhow::bail!("unexpected {other:?}"),
        }
    }
    assert!(e.metrics().kv.used_blocks > 0);
    drop(h);
    wait_idle(&e)?;
    let m = e.metrics();
    assert_eq!(m.cancelled, 1, "{m:?}");
    assert!(m.generated_tokens < 400, "generation stopped early: {m:?}");
    Ok(())
}

#[test]
fn the_budget_holds_through_preemption() -> Result<()> {
    budget_through_preemption(KvDtype::F16)
}

#[test]
fn the_budget_holds_through_preemption_q8_0() -> Result<()> {
    budget_through_preemption(KvDtype::Q8_0)
}

fn budget_through_preemption(dtype: KvDtype) -> Result<()> {
    let p = pipeline();
    let qs = questions();
    let cfg = GenerationConfig { ignore_eos: true, ..GenerationConfig::default().max_tokens(48) };
    let alone: Vec<Generation> = {
        let e = Engine::new(p, small_with(EngineOptions::default(), dtype))?;
        qs.iter().map(|q| e.submit_chat(q, cfg.clone())?.wait()).collect::<Result<_, _>>()?
    };
    // Room for about three of these sequences at a time, no prefix cache to lean on.
    let longest = alone.iter().map(|g| g.stats.prompt_tokens + 48).max().unwrap_or(0);
    let budget = 3 * longest + 16;
    let e = Engine::new(
        p,
        EngineOptions { kv: KvOptions { block_size: 16, budget: KvBudget::Tokens(budget), dtype }, prefix_cache: false, ..Default::default() },
    )?;
    let handles: Vec<_> = qs.iter().map(|q| e.submit_chat(q, cfg.clone())).collect::<Result<_, _>>()?;
    let mut peak = 0;
    for (i, h) in handles.into_iter().enumerate() {
        let g = h.wait()?;
        peak = peak.max(e.metrics().kv.used_blocks);
        assert_eq!(g.tokens, alone[i].tokens, "request {i} under preemption ({dtype} cache)");
        assert_eq!(g.finish, FinishReason::MaxTokens);
    }
    let m = e.metrics();
    assert!(m.kv.total_blocks * 16 <= budget + 16, "{m:?}");
    assert!(m.preemptions > 0 && m.finished == 8, "admission alone should not be enough here: {m:?}");
    assert!(peak <= m.kv.total_blocks);
    Ok(())
}

#[test]
fn a_shared_system_prompt_comes_from_the_prefix_cache() -> Result<()> {
    shared_system_prompt(KvDtype::F16)
}

#[test]
fn a_shared_system_prompt_comes_from_the_prefix_cache_q8_0() -> Result<()> {
    shared_system_prompt(KvDtype::Q8_0)
}

fn shared_system_prompt(dtype: KvDtype) -> Result<()> {
    let p = pipeline();
    let e = Engine::new(p, small_with(EngineOptions::default(), dtype))?;
    let system = "You are a meticulous assistant for a hardware store. ".repeat(12);
    let ask = |q: &str| vec![Message::system(system.clone()), Message::user(q)];
    let cfg = GenerationConfig::default().max_tokens(8);
    let a = e.submit_chat(&ask("Do you sell hammers?"), cfg.clone())?.wait()?;
    let b = e.submit_chat(&ask("Where are the nails?"), cfg)?.wait()?;
    assert_eq!(a.stats.reused_prompt_tokens, 0);
    assert!(b.stats.reused_prompt_tokens >= 100, "reused {} of {}", b.stats.reused_prompt_tokens, b.stats.prompt_tokens);
    assert!(b.stats.prompt_tokens - b.stats.reused_prompt_tokens < 32);
    // The cached prefix gives what computing it afresh gives.
    let fresh = Engine::new(p, EngineOptions { prefix_cache: false, ..small_with(EngineOptions::default(), dtype) })?;
    let c = fresh.submit_chat(&ask("Where are the nails?"), GenerationConfig::default().max_tokens(8))?.wait()?;
    assert_eq!(c.stats.reused_prompt_tokens, 0);
    assert_eq!(b.tokens, c.tokens, "{dtype} cache: prefix-cache answer vs fresh");
    Ok(())
}

#[test]
fn requests_that_cannot_fit_are_errors() -> Result<()> {
    let p = pipeline();
    let e = Engine::new(p, EngineOptions { kv: KvOptions { block_size: 16, budget: KvBudget::Tokens(64), ..KvOptions::default() }, ..Default::default() })?;
    let long = vec![Message::user("word ".repeat(100))];
    let err = e.submit_chat(&long, GenerationConfig::default())?.wait().unwrap_err();
    assert!(matches!(err, sapient_generate::Error::TooLargeForCache { capacity: 64, .. }), "{err}");
    // The engine keeps serving.
    let ok = e.submit_chat(&[Message::user("Hi")], GenerationConfig::default().max_tokens(4))?.wait()?;
    assert!(!ok.tokens.is_empty());
    assert!(e.submit(Vec::new(), GenerationConfig::default()).is_err());
    assert!(Engine::new(p, EngineOptions { max_seqs: 0, ..Default::default() }).is_err());
    Ok(())
}

#[test]
fn a_context_shift_keeps_a_long_generation_going() -> Result<()> {
    use sapient_generate::ContextPolicy;
    let p = Pipeline::load("smollm2-135m-instruct", PipelineOptions { max_seq_len: Some(128), ..Default::default() }, |_| {})?;
    let cfg = GenerationConfig { ignore_eos: true, ..GenerationConfig::default().max_tokens(300) };
    let q = &questions()[2];
    let stop = Engine::new(&p, small(EngineOptions::default()))?.submit_chat(q, cfg.clone())?.wait()?;
    assert_eq!(stop.finish, FinishReason::ContextFull);
    assert_eq!(stop.stats.prompt_tokens + stop.tokens.len(), 129, "the context holds 128 positions and the last token needs none");
    assert_eq!(stop.stats.generated_tokens, stop.tokens.len(), "a request ended by a full context counts its tokens");
    let e = Engine::new(&p, small(EngineOptions { context: ContextPolicy::Shift { keep: 16 }, ..Default::default() }))?;
    let shifted = e.submit_chat(q, cfg)?.wait()?;
    assert_eq!(shifted.finish, FinishReason::MaxTokens);
    assert_eq!(shifted.tokens.len(), 300);
    // The same tokens up to the first shift.
    assert_eq!(shifted.tokens[..stop.tokens.len()], stop.tokens[..]);
    assert!(e.metrics().context_shifts >= 2, "{:?}", e.metrics());
    Ok(())
}

#[test]
fn a_session_keeps_its_conversation_to_the_token() -> Result<()> {
    let p = pipeline();
    let engine = Engine::new(p, small(EngineOptions { prefix_cache: false, ..Default::default() }))?;
    let session = engine.session()?;
    let cfg = GenerationConfig::default().max_tokens(20);
    let mut msgs = questions()[0].clone();
    let encode = |m: &[Message]| -> Result<Vec<u32>> { Ok(p.tokenizer().encode(&p.render_chat(m)?, false)?) };
    let first_prompt = encode(&msgs)?;
    let first = engine.submit_in(&session, first_prompt.clone(), cfg.clone())?.wait()?;
    assert_eq!(first.stats.reused_prompt_tokens, 0);
    // Kept: the prompt and every answer token that was fed.
    assert_eq!(session.cached_tokens(), session_cap(&first_prompt, &first), "{:?}", first.finish);
    msgs.push(Message::assistant(first.text.clone()));
    msgs.push(Message::user("And of Italy?"));
    let second_prompt = encode(&msgs)?;
    let second = engine.submit_in(&session, second_prompt.clone(), cfg.clone())?.wait()?;
    // The prefix cache is off: the reuse is the session's, not a whole number of blocks.
    let common = first_prompt.iter().chain(&first.tokens).zip(&second_prompt).take_while(|(a, b)| a == b).count();
    assert!(common > first_prompt.len(), "the second prompt starts with the first turn");
    assert_eq!(second.stats.reused_prompt_tokens, common.min(session_cap(&first_prompt, &first)));
    // The same request without the session gives the same tokens (nothing reused).
    let fresh = engine.submit(second_prompt, cfg)?.wait()?;
    assert_eq!(fresh.stats.reused_prompt_tokens, 0);
    assert_eq!(fresh.tokens, second.tokens);
    // Dropping the session gives its blocks back.
    drop(session);
    wait_idle(&engine)?;
    Ok(())
}

#[test]
fn a_saved_session_continues_in_another_engine_to_the_token() -> Result<()> {
    let p = pipeline();
    let opts = small(EngineOptions { prefix_cache: false, ..Default::default() });
    let a = Engine::new(p, opts.clone())?;
    let sa = a.session()?;
    assert!(a.save_session(&sa).unwrap_err().to_string().contains("keeps no cache"));
    let cfg = GenerationConfig::default().max_tokens(20);
    let mut msgs = questions()[0].clone();
    let encode = |m: &[Message]| -> Result<Vec<u32>> { Ok(p.tokenizer().encode(&p.render_chat(m)?, false)?) };
    let first_prompt = encode(&msgs)?;
    let first = a.submit_in(&sa, first_prompt.clone(), cfg.clone())?.wait()?;
    let saved = a.save_session(&sa)?;
    assert_eq!(saved.tokens.len(), session_cap(&first_prompt, &first));
    assert_eq!(saved.tokens[..first_prompt.len()], first_prompt[..]);
    msgs.push(Message::assistant(first.text.clone()));
    msgs.push(Message::user("And of Italy?"));
    let second_prompt = encode(&msgs)?;
    let uninterrupted = a.submit_in(&sa, second_prompt.clone(), cfg.clone())?.wait()?;

    // A fresh engine given the saved cache continues exactly as the first one did.
    let b = Engine::new(p, opts.clone())?;
    let sb = b.session()?;
    b.restore_session(&sb, saved.clone())?;
    assert_eq!(sb.cached_tokens(), saved.tokens.len());
    let restored = b.submit_in(&sb, second_prompt.clone(), cfg.clone())?.wait()?;
    assert!(restored.stats.reused_prompt_tokens > first_prompt.len(), "the saved turn is reused: {:?}", restored.stats);
    assert_eq!(restored.stats.reused_prompt_tokens, uninterrupted.stats.reused_prompt_tokens);
    assert_eq!(restored.tokens, uninterrupted.tokens);

    // What does not fit is refused, and the session keeps nothing from it.
    let q8 = Engine::new(p, small_with(EngineOptions::default(), KvDtype::Q8_0))?;
    let e = q8.restore_session(&q8.session()?, saved.clone()).unwrap_err().to_string();
    assert!(e.contains("this engine's is") && e.contains("q8_0"), "{e}");
    let s2 = b.session()?;
    let mut short = saved.clone();
    short.kv.truncate(short.kv.len() - 1);
    assert!(b.restore_session(&s2, short).unwrap_err().to_string().contains("does not fit"));
    let mut foreign = saved.clone();
    foreign.tokens[3] = u32::MAX;
    assert!(b.restore_session(&s2, foreign).unwrap_err().to_string().contains("outside the vocabulary"));
    assert_eq!(s2.cached_tokens(), 0);
    assert!(b.restore_session(&a.session()?, saved).unwrap_err().to_string().contains("another engine"));
    drop((sa, sb, s2));
    wait_idle(&b)?;
    Ok(())
}

/// What a session keeps after `g`: its prompt and the tokens fed back (all of them when the
/// model ended with end-of-sequence, all but the last when the limit cut it).
fn session_cap(prompt: &[u32], g: &Generation) -> usize {
    let unfed = usize::from(g.finish == FinishReason::MaxTokens);
    prompt.len() + g.tokens.len() - unfed
}

#[test]
fn pipeline_calls_from_several_threads_run_together() -> Result<()> {
    let p = pipeline();
    let qs = questions();
    let cfg = GenerationConfig::default().max_tokens(16);
    let alone: Vec<Vec<u32>> = qs[..4].iter().map(|q| p.chat(q, &cfg).map(|g| g.tokens)).collect::<Result<_, _>>()?;
    let together: Vec<Vec<u32>> = std::thread::scope(|s| {
        let hs: Vec<_> = qs[..4].iter().map(|q| s.spawn(|| p.chat(q, &cfg).map(|g| g.tokens))).collect();
        hs.into_iter().map(|h| h.join().expect("no panic")).collect::<Result<_, _>>()
    })?;
    assert_eq!(together, alone);
    Ok(())
}

#[test]
fn prompt_lookup_in_the_batched_step_keeps_greedy_output() -> Result<()> {
    use sapient_generate::speculative::LookupDecoding;
    let p = pipeline();
    let engine = Engine::new(p, small(EngineOptions::default()))?;
    let repeat = |items: &str| {
        vec![Message::user(format!("Repeat this list exactly, then add one more: {items}."))]
    };
    let prompts = [
        repeat("apple, banana, cherry, date, elderberry, fig, grape"),
        repeat("red, orange, yellow, green, blue, indigo, violet"),
        questions()[1].clone(),
        repeat("Monday, Tuesday, Wednesday, Thursday, Friday"),
    ];
    let plain_cfg = GenerationConfig::default().max_tokens(40);
    let plain: Vec<Generation> = prompts.iter().map(|m| engine.submit_chat(m, plain_cfg.clone())?.wait()).collect::<Result<_, _>>()?;
    // All at once, speculating (and one plain request beside them).
    let spec_cfg = GenerationConfig { lookup: Some(LookupDecoding::default()), ..plain_cfg.clone() };
    let handles: Vec<_> = prompts
        .iter()
        .enumerate()
        .map(|(i, m)| engine.submit_chat(m, if i == 2 { plain_cfg.clone() } else { spec_cfg.clone() }))
        .collect::<Result<_, _>>()?;
    let spec: Vec<Generation> = handles.into_iter().map(|h| h.wait()).collect::<Result<_, _>>()?;
    for (a, b) in plain.iter().zip(&spec) {
        assert_eq!(a.tokens, b.tokens, "{:?} vs {:?}", a.text, b.text);
        assert_eq!(a.text, b.text);
    }
    let (proposed, accepted, forwards, tokens) = spec.iter().fold((0, 0, 0, 0), |acc, g| {
        (acc.0 + g.stats.proposed_tokens, acc.1 + g.stats.accepted_tokens, acc.2 + g.stats.forwards, acc.3 + g.tokens.len())
    });
    assert!(accepted > 0 && accepted <= proposed, "lists repeat the prompt: {proposed} proposed, {accepted} accepted");
    assert!(forwards < tokens, "accepted guesses save forwards: {forwards} forwards for {tokens} tokens");
    // Sampled: the same seed gives the same tokens, speculating or not together with others.
    let sampled = GenerationConfig {
        sampling: SamplerConfig { temperature: 0.8, seed: Some(5), ..Default::default() },
        ..spec_cfg.clone()
    };
    let a = engine.submit_chat(&prompts[0], sampled.clone())?.wait()?;
    let b = engine.submit_chat(&prompts[0], sampled.clone())?.wait()?;
    assert_eq!(a.tokens, b.tokens);
    // Not with a constraint.
    let constrained = GenerationConfig { lookup: Some(LookupDecoding::default()), ..GenerationConfig::default() }
        .constrain(sapient_generate::Grammar::regex("[a-z]+")?);
    assert!(engine.submit_chat(&prompts[0], constrained)?.wait().is_err());
    // K bounds that make no sense are an error naming them.
    let bounds = sapient_generate::speculative::SpecConfig { k_min: 5, k_max: 2, ..Default::default() };
    let bad = GenerationConfig { lookup: Some(LookupDecoding { spec: bounds, ..Default::default() }), ..plain_cfg.clone() };
    match engine.submit_chat(&prompts[0], bad)?.wait() {
        Err(e) => assert!(e.to_string().contains("k_min"), "{e}"),
        Ok(g) => panic!("bad K bounds accepted: {:?}", g.text),
    }
    wait_idle(&engine)?;
    Ok(())
}

/// Draft-model speculation in the batched step (`Engine::with_draft`): a second copy of
/// SmolLM2 drafts for several requests at once, some joining while others decode; every
/// greedy answer is token for token what plain decoding gives, the draft's guesses are
/// accepted, and the target runs fewer forwards than it writes tokens.
#[test]
fn a_draft_model_in_the_batched_step_keeps_greedy_output() -> Result<()> {
    use sapient_generate::speculative::LookupDecoding;
    let p = pipeline();
    let draft = Pipeline::load("smollm2-135m-instruct", PipelineOptions { max_seq_len: Some(1024), ..Default::default() }, |_| {})?;
    let plain_cfg = GenerationConfig::default().max_tokens(40);
    let qs = questions();
    let plain_engine = Engine::new(p, small(EngineOptions::default()))?;
    let plain: Vec<Generation> = qs.iter().map(|m| plain_engine.submit_chat(m, plain_cfg.clone())?.wait()).collect::<Result<_, _>>()?;
    // Asking for a draft from an engine without one is an error naming the fix.
    let spec = sapient_generate::speculative::SpecConfig::default();
    let draft_cfg = GenerationConfig { draft: Some(spec.clone()), ..plain_cfg.clone() };
    let err = plain_engine.submit_chat(&qs[0], draft_cfg.clone()).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("with_draft"), "{err}");
    wait_idle(&plain_engine)?;
    drop(plain_engine);
    // The target itself cannot be its own draft object.
    assert!(Engine::with_draft(p, p, small(EngineOptions::default())).is_err());

    let engine = Engine::with_draft(p, &draft, small(EngineOptions::default()))?;
    // Half at once (one of them plain), the rest after the first has streamed a token.
    let full = GenerationConfig { draft: Some(sapient_generate::speculative::SpecConfig { draft_vocab: None, ..spec.clone() }), ..plain_cfg.clone() };
    let cfg_for = |i: usize| match i {
        2 => plain_cfg.clone(),
        5 => full.clone(),
        _ => draft_cfg.clone(),
    };
    let mut first: Vec<_> = (0..4).map(|i| engine.submit_chat(&qs[i], cfg_for(i))).collect::<Result<_, _>>()?;
    assert!(matches!(first[0].blocking_next(), Some(Event::Text(_))), "the first request streams");
    let later: Vec<_> = (4..qs.len()).map(|i| engine.submit_chat(&qs[i], cfg_for(i))).collect::<Result<_, _>>()?;
    let got: Vec<Generation> = first.into_iter().chain(later).map(|h| h.wait()).collect::<Result<_, _>>()?;
    for (i, (a, b)) in plain.iter().zip(&got).enumerate() {
        assert_eq!(a.tokens, b.tokens, "request {i}: {:?} vs {:?}", a.text, b.text);
        assert_eq!(a.text, b.text);
    }
    let (proposed, accepted, forwards, tokens) = got.iter().enumerate().filter(|(i, _)| *i != 2).fold((0, 0, 0, 0), |acc, (_, g)| {
        (acc.0 + g.stats.proposed_tokens, acc.1 + g.stats.accepted_tokens, acc.2 + g.stats.forwards, acc.3 + g.tokens.len())
    });
    assert!(accepted * 10 >= proposed * 9, "the same weights draft: nearly every guess is accepted ({accepted} of {proposed})");
    assert!(forwards * 2 < tokens, "accepted guesses save target forwards: {forwards} forwards for {tokens} tokens");
    assert_eq!(got[2].stats.proposed_tokens, 0, "a plain request beside them does not speculate");
    // Sampled with a seed: the same tokens every time.
    let sampled = GenerationConfig { sampling: SamplerConfig { temperature: 0.8, seed: Some(5), ..Default::default() }, ..draft_cfg.clone() };
    let a = engine.submit_chat(&qs[6], sampled.clone())?.wait()?;
    let b = engine.submit_chat(&qs[6], sampled)?.wait()?;
    assert_eq!(a.tokens, b.tokens);
    // Not with prompt lookup at the same time.
    let both = GenerationConfig { lookup: Some(LookupDecoding::default()), ..draft_cfg.clone() };
    assert!(engine.submit_chat(&qs[0], both)?.wait().is_err());
    wait_idle(&engine)?;
    Ok(())
}

/// `GenerationConfig::logprobs`: one entry per generated token, from the model's own
/// distribution (the same whatever the sampler does to it), streamed after each step's text
/// and whole in the result; constrained tokens get theirs too.
#[test]
fn logprobs_of_the_chosen_tokens() -> Result<()> {
    let p = pipeline();
    let engine = Engine::new(p, small(EngineOptions::default()))?;
    let msgs = &questions()[0];
    let run = |cfg: GenerationConfig| -> Result<(Generation, Vec<sapient_generate::TokenLogprob>)> {
        let mut h = engine.submit_chat(msgs, cfg)?;
        let mut streamed = Vec::new();
        while let Some(e) = h.blocking_next() {
            match e {
                Event::Logprobs(l) => streamed.extend(l),
                Event::Done(r) => return Ok((r?, streamed)),
                _ => {}
            }
        }
        anyhow::bail!("no end")
    };
    let greedy = GenerationConfig { logprobs: Some(5), ..GenerationConfig::default().max_tokens(12) };
    let (g, streamed) = run(greedy.clone())?;
    assert_eq!(g.logprobs, streamed, "streamed and final logprobs agree");
    assert_eq!(g.logprobs.iter().map(|l| l.token).collect::<Vec<_>>(), g.tokens);
    for l in &g.logprobs {
        assert_eq!(l.top.len(), 5);
        // Greedy takes the most likely token, whose log-probability heads the list.
        assert_eq!(l.top[0], (l.token, l.logprob));
        assert!(l.top.windows(2).all(|w| w[0].1 >= w[1].1) && l.logprob <= 0.0);
        let mass: f32 = l.top.iter().map(|t| t.1.exp()).sum();
        assert!(mass > 0.0 && mass <= 1.0 + 1e-5, "{mass}");
    }
    // The same generation without logprobs: same tokens (asking for them changes nothing).
    let plain = engine.submit_chat(msgs, GenerationConfig::default().max_tokens(12))?.wait()?;
    assert_eq!(plain.tokens, g.tokens);
    assert!(plain.logprobs.is_empty());
    // Sampling hot: the first position's distribution is the model's, not the sampler's.
    let hot = GenerationConfig {
        logprobs: Some(5),
        sampling: SamplerConfig { temperature: 1.8, seed: Some(3), ..Default::default() },
        ..GenerationConfig::default().max_tokens(1)
    };
    let (h, _) = run(hot)?;
    assert_eq!(h.logprobs[0].top, g.logprobs[0].top);
    // A constraint's forced tokens each get their own logits, hence log-probabilities.
    let grammar = sapient_generate::Grammar::new(&sapient_generate::Expr::Regex("The capital is (Paris|Rome)\\.".into()))?;
    let cons = GenerationConfig { logprobs: Some(0), constraint: Some(std::sync::Arc::new(grammar)), ..GenerationConfig::default().max_tokens(32) };
    let (c, _) = run(cons)?;
    assert!(c.text.starts_with("The capital is "), "{}", c.text);
    assert_eq!(c.logprobs.len(), c.tokens.len());
    assert!(c.logprobs.iter().all(|l| l.top.is_empty() && l.logprob <= 0.0 && l.logprob.is_finite()));
    // Too many alternatives is an error naming the limit.
    let e = engine.submit_chat(msgs, GenerationConfig { logprobs: Some(21), ..GenerationConfig::default() })?.wait().unwrap_err();
    assert!(e.to_string().contains("at most 20"), "{e}");
    wait_idle(&engine)
}
