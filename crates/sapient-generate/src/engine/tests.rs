//! Scheduling decisions without a model: the scheduler over a fake forward pass (no weights;
//! each row's logits pick the byte after the row's token, and `z` is followed by the end of
//! text) and a byte-level tokenizer written for the test. Each test steps the scheduler by
//! hand and checks the plans it makes (who feeds how many tokens, with which logits) and what
//! every request gets back.

use super::scheduler::Scheduler;
use super::{EngineOptions, Event, Msg, NewRequest, Shared};
use crate::generation::{FinishReason, Generation, GenerationConfig};
use crate::model::{Forward, Model, ModelInfo};
use sapient_llama::{BatchSeq, KvBudget, KvCache, KvOptions, Logits, LoraInfo, LoraUse};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::mpsc;

const EOS: u32 = 256;
const VOCAB: usize = 257;

/// The token the fake model predicts after `t`.
fn next(t: u32) -> u32 {
    match t {
        t if t == u32::from(b'z') => EOS,
        t => (t + 1) % 256,
    }
}

/// Each forward's rows, as (tokens fed, logits asked) per sequence.
type Calls = Arc<Mutex<Vec<Vec<(Vec<u32>, Option<Logits>)>>>>;

struct Fake {
    calls: Calls,
}

impl Fake {
    fn logits(batch: &[BatchSeq<'_>], out: &mut Vec<f32>) -> usize {
        out.clear();
        let mut rows = 0;
        for b in batch {
            let n = match b.logits {
                None => 0,
                Some(Logits::Last) => 1,
                Some(Logits::All) => b.tokens.len(),
            };
            for &t in &b.tokens[b.tokens.len() - n..] {
                let mut row = vec![0.0f32; VOCAB];
                row[next(t) as usize] = 10.0;
                out.extend_from_slice(&row);
            }
            rows += n;
        }
        rows
    }
}

impl Forward for Fake {
    fn new_kv_cache(&self, opts: KvOptions) -> sapient_llama::Result<KvCache> {
        KvCache::new(1, 8, opts)
    }
    fn forward_reserved(&mut self, _kv: &mut KvCache, batch: &[BatchSeq<'_>], _loras: &[&[LoraUse]], out: &mut Vec<f32>) -> sapient_llama::Result<usize> {
        if let Ok(mut c) = self.calls.lock() {
            c.push(batch.iter().map(|b| (b.tokens.to_vec(), b.logits)).collect());
        }
        Ok(Self::logits(batch, out))
    }
    fn forward_batch(&mut self, _kv: &mut KvCache, batch: &[BatchSeq<'_>], out: &mut Vec<f32>) -> sapient_llama::Result<usize> {
        Ok(Self::logits(batch, out))
    }
    fn restrict_logits(&mut self, _keep: Option<(usize, &[u32])>) -> sapient_llama::Result<bool> {
        Ok(false)
    }
    fn clear_cache(&mut self) {}
    fn load_lora(&mut self, path: &std::path::Path) -> sapient_llama::Result<usize> {
        Err(sapient_llama::Error::Config(format!("the fake model takes no adapter ({})", path.display())))
    }
    fn loras(&self) -> Vec<LoraInfo> {
        Vec::new()
    }
}

/// A byte-level tokenizer: token `b` is byte `b`, 256 is `<|endoftext|>` (the end of text).
/// Written and loaded once for every test.
fn tokenizer() -> sapient_tokenizers::Tokenizer {
    static T: std::sync::OnceLock<sapient_tokenizers::Tokenizer> = std::sync::OnceLock::new();
    T.get_or_init(write_tokenizer).clone()
}

fn write_tokenizer() -> sapient_tokenizers::Tokenizer {
    let vocab: serde_json::Map<String, serde_json::Value> =
        sapient_tokenizers::byte_to_unicode().into_iter().enumerate().map(|(i, c)| (c.to_string(), serde_json::Value::from(i))).collect();
    let json = serde_json::json!({
        "version": "1.0",
        "added_tokens": [{"id": EOS, "content": "<|endoftext|>", "single_word": false, "lstrip": false,
                          "rstrip": false, "normalized": false, "special": true}],
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "vocab": vocab, "merges": []},
    });
    let dir = std::env::temp_dir().join(format!("sapient-engine-tests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    std::fs::write(dir.join("tokenizer.json"), json.to_string()).expect("write tokenizer.json");
    std::fs::write(dir.join("tokenizer_config.json"), r#"{"eos_token": "<|endoftext|>"}"#).expect("write tokenizer_config.json");
    sapient_tokenizers::Tokenizer::from_file(&dir.join("tokenizer.json")).expect("the test tokenizer loads")
}

struct Harness {
    sched: Scheduler,
    calls: Calls,
    next_id: u64,
}

/// What one request got back: its streamed text and its end.
struct Request {
    rx: mpsc::UnboundedReceiver<Event>,
    cancel: Arc<AtomicBool>,
    streamed: String,
    done: Option<crate::Result<Generation>>,
}

impl Request {
    fn drain(&mut self) {
        while let Ok(e) = self.rx.try_recv() {
            match e {
                Event::Text(t) => self.streamed.push_str(&t),
                Event::Done(r) => self.done = Some(r),
                Event::Logprobs(_) => {}
            }
        }
    }

    fn generation(&mut self) -> &Generation {
        self.drain();
        match &self.done {
            Some(Ok(g)) => g,
            other => panic!("the request has not finished well: {:?}", other.as_ref().map(|r| r.as_ref().err())),
        }
    }
}

impl Harness {
    fn new(opts: EngineOptions) -> Self {
        let calls = Calls::default();
        let info = ModelInfo {
            id: "fake".into(),
            path: Default::default(),
            architecture: "fake".into(),
            context_length: 512,
            max_seq_len: 512,
            vocab_size: VOCAB,
            has_chat_template: false,
        };
        let fake = Fake { calls: calls.clone() };
        let kv = fake.new_kv_cache(opts.kv).expect("a KV cache");
        let model = Model::with_forward(Box::new(fake), tokenizer(), info);
        let sched = Scheduler::new(model, opts, kv, Arc::new(Shared::default()));
        Self { sched, calls, next_id: 1 }
    }

    fn submit(&mut self, prompt: &[u8], max_tokens: usize) -> Request {
        let (tx, rx) = mpsc::unbounded_channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let r = NewRequest {
            id: self.next_id,
            prompt: prompt.iter().map(|&b| u32::from(b)).collect(),
            cfg: GenerationConfig::default().max_tokens(max_tokens),
            tx,
            cancel: cancel.clone(),
            session: None,
            submitted: Instant::now(),
        };
        self.next_id += 1;
        self.sched.receive(Msg::Request(Box::new(r)));
        Request { rx, cancel, streamed: String::new(), done: None }
    }

    /// One step; what it planned, as (request id, tokens fed, logits) in batch order.
    fn step(&mut self) -> Vec<(u64, usize, Option<Logits>)> {
        let plans = self.sched.schedule();
        let planned = plans.iter().map(|p| (self.sched.running[p.idx].id, p.n, p.logits)).collect();
        if !plans.is_empty() {
            self.sched.execute(&plans);
        }
        planned
    }

    /// Steps until nothing is left to run; every step's plan.
    fn run(&mut self) -> Vec<Vec<(u64, usize, Option<Logits>)>> {
        let mut steps = Vec::new();
        for _ in 0..1000 {
            let s = self.step();
            if s.is_empty() && self.sched.waiting.is_empty() && self.sched.preempted.is_empty() {
                return steps;
            }
            steps.push(s);
        }
        panic!("the scheduler did not finish its requests in 1000 steps");
    }

    fn preemptions(&self) -> u64 {
        self.sched.shared.preemptions.load(Ordering::Relaxed)
    }
}

fn opts(block: usize, blocks: usize, step: usize, chunk: usize, prefix_cache: bool) -> EngineOptions {
    EngineOptions {
        kv: KvOptions { block_size: block, budget: KvBudget::Tokens(block * blocks), ..KvOptions::default() },
        max_seqs: 16,
        max_step_tokens: step,
        prefill_chunk: chunk,
        prefix_cache,
        ..EngineOptions::default()
    }
}

/// `n` bytes counting up from `first` (wrapping within printable lowercase letters).
fn prompt(first: u8, n: usize) -> Vec<u8> {
    (0..n).map(|i| b'a' + ((first - b'a') as usize + i) as u8 % 26).collect()
}

/// What the fake model writes after `prompt`, at most `max` tokens (without the end of text).
fn expected(prompt: &[u8], max: usize) -> String {
    let mut t = u32::from(*prompt.last().unwrap_or(&b'a'));
    let mut s = String::new();
    for _ in 0..max {
        t = next(t);
        if t == EOS {
            break;
        }
        s.push(t as u8 as char);
    }
    s
}

const L: Option<Logits> = Some(Logits::Last);

#[test]
fn prompts_are_fed_in_chunks_within_the_step_budget() {
    // Steps of 24 tokens, prompt chunks of at most 16: the older request's chunk first, the
    // newer one takes what is left; decoding rows come before prompt chunks.
    let mut h = Harness::new(opts(16, 64, 24, 16, false));
    let pa = prompt(b'a', 40);
    let pb = prompt(b'c', 20);
    let mut a = h.submit(&pa, 3);
    let mut b = h.submit(&pb, 3);
    let steps = h.run();
    assert_eq!(
        steps,
        vec![
            vec![(1, 16, None), (2, 8, None)],
            vec![(1, 16, None), (2, 8, None)],
            vec![(1, 8, L), (2, 4, L)],
            vec![(1, 1, L), (2, 1, L)],
            vec![(1, 1, L), (2, 1, L)],
        ]
    );
    for (r, p) in [(&mut a, &pa), (&mut b, &pb)] {
        let g = r.generation().clone();
        assert_eq!(g.text, expected(p, 3));
        assert_eq!(g.finish, FinishReason::MaxTokens);
        assert_eq!(r.streamed, g.text, "the streamed text is the whole text, once");
    }
    // The forward saw exactly the prompt, chunk after chunk, then the sampled tokens.
    let fed: Vec<u32> = h.calls.lock().unwrap().iter().map(|c| c[0].0.clone()).collect::<Vec<_>>().concat();
    let mut want: Vec<u32> = pa.iter().map(|&b| u32::from(b)).collect();
    want.extend(expected(&pa, 2).bytes().map(u32::from));
    assert_eq!(fed, want);
}

#[test]
fn a_request_ends_at_the_end_of_text() {
    let mut h = Harness::new(opts(16, 64, 64, 64, false));
    let mut r = h.submit(b"uvw", 50);
    h.run();
    let g = r.generation();
    assert_eq!(g.text, "xyz");
    assert_eq!(g.finish, FinishReason::Eos);
    assert_eq!(h.sched.kv.usage().used_blocks, 0, "a finished sequence gives its blocks back");
}

#[test]
fn admission_waits_for_room_instead_of_preempting() {
    // Four blocks of 4: one 10-token prompt (3 blocks with its first token) fits, a second
    // does not; it waits until the first ends, and nothing is computed twice.
    let mut h = Harness::new(opts(4, 4, 64, 64, false));
    let pa = prompt(b'a', 10);
    let pb = prompt(b'k', 10);
    let mut a = h.submit(&pa, 2);
    let mut b = h.submit(&pb, 2);
    let steps = h.run();
    assert_eq!(
        steps,
        vec![vec![(1, 10, L)], vec![(1, 1, L)], vec![(2, 10, L)], vec![(2, 1, L)]],
        "the second request runs once the first is done"
    );
    assert_eq!(h.preemptions(), 0);
    assert_eq!(a.generation().text, expected(&pa, 2));
    assert_eq!(b.generation().text, expected(&pb, 2));
}

#[test]
fn the_newest_sequence_is_preempted_and_recomputed_exactly() {
    // Four blocks of 4: two 5-token prompts fit (2 blocks each); when both grow past 8
    // positions one has to go: the newer one, which later comes back, recomputes what it
    // had, and ends with the text it would have had alone, streamed once.
    let mut h = Harness::new(opts(4, 4, 64, 64, false));
    let pa = prompt(b'a', 5);
    let pb = prompt(b'j', 5);
    let mut a = h.submit(&pa, 6);
    let mut b = h.submit(&pb, 6);
    let steps = h.run();
    assert_eq!(h.preemptions(), 1);
    let first_alone = steps.iter().position(|s| s.len() == 1).expect("a step with one sequence");
    assert!(steps[..first_alone].iter().all(|s| s.iter().map(|p| p.0).eq([1, 2])), "{steps:?}");
    // Request 1 runs alone to its end; then request 2 comes back with its prompt and the
    // tokens it had generated, fed again in one chunk.
    let back = steps.iter().position(|s| s.iter().any(|p| p.0 == 2 && p.1 > 1) && s != &steps[0]).expect("request 2 resumes");
    assert!(steps[first_alone..back].iter().all(|s| s.iter().all(|p| p.0 == 1)), "{steps:?}");
    // It had sampled a token in each step it shared with request 1.
    assert_eq!(steps[back], vec![(2, 5 + first_alone, L)], "{steps:?}");
    for (r, p) in [(&mut a, &pa), (&mut b, &pb)] {
        let g = r.generation().clone();
        assert_eq!(g.text, expected(p, 6));
        assert_eq!(r.streamed, g.text, "nothing streamed twice or lost");
    }
    assert_eq!(h.sched.kv.usage().used_blocks, 0);
}

#[test]
fn a_preempted_sequence_takes_its_full_blocks_back_from_the_prefix_cache() {
    // Five blocks of 4: the same two requests; when request 2 is preempted its two full
    // blocks go to the prefix cache, and when it comes back only the token after them is fed.
    let mut h = Harness::new(opts(4, 5, 64, 64, true));
    let pa = prompt(b'a', 5);
    let pb = prompt(b'j', 5);
    let mut a = h.submit(&pa, 6);
    let mut b = h.submit(&pb, 6);
    let steps = h.run();
    assert_eq!(h.preemptions(), 1);
    let gone = steps.iter().position(|s| !s.iter().any(|p| p.0 == 2)).expect("request 2 is preempted");
    let resumed = steps[gone..].iter().find_map(|s| s.iter().find(|p| p.0 == 2)).expect("request 2 resumes");
    // 5 prompt tokens and 4 generated ones when it left, 8 of them in full blocks.
    assert_eq!(*resumed, (2, 1, L), "{steps:?}");
    assert_eq!(a.generation().text, expected(&pa, 6));
    assert_eq!(b.generation().text, expected(&pb, 6));
}

#[test]
fn cancelled_requests_leave_at_the_next_step_and_free_their_blocks() {
    let mut h = Harness::new(opts(4, 16, 64, 64, false));
    let mut a = h.submit(&prompt(b'a', 6), 20);
    let mut b = h.submit(&prompt(b'a', 6), 20);
    assert_eq!(h.step(), vec![(1, 6, L), (2, 6, L)]);
    let held = h.sched.kv.usage().used_blocks;
    b.cancel.store(true, Ordering::Relaxed);
    assert_eq!(h.step(), vec![(1, 1, L)], "the cancelled request is not fed again");
    assert_eq!(h.sched.kv.usage().used_blocks, held - 2, "its two blocks are free");
    let g = b.generation();
    assert_eq!(g.finish, FinishReason::Cancelled);
    // A waiting request cancelled before it runs never gets a sequence.
    let mut c = h.submit(&prompt(b'a', 6), 20);
    drop(c.rx);
    c.rx = mpsc::unbounded_channel().1;
    assert_eq!(h.step(), vec![(1, 1, L)]);
    a.cancel.store(true, Ordering::Relaxed);
    assert_eq!(h.step(), vec![]);
    assert_eq!(h.sched.kv.usage().used_blocks, 0);
    assert_eq!(a.generation().finish, FinishReason::Cancelled);
}

#[test]
fn a_prompt_that_can_never_fit_fails_alone() {
    let mut h = Harness::new(opts(4, 4, 64, 64, false));
    let mut big = h.submit(&prompt(b'a', 20), 2);
    let mut small = h.submit(&prompt(b'a', 5), 2);
    h.run();
    big.drain();
    assert!(
        matches!(big.done, Some(Err(crate::Error::TooLargeForCache { .. }))),
        "{:?}",
        big.done.as_ref().map(|r| r.as_ref().err())
    );
    assert_eq!(small.generation().text, expected(&prompt(b'a', 5), 2));
}
