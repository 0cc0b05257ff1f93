//! A loaded language model with its tokenizer, shared by the [`Pipeline`](crate::Pipeline),
//! the [`Engine`](crate::Engine) and each request's decoder.

use crate::{Error, Result};
use sapient_llama::{BatchSeq, KvCache, KvOptions, LlamaModel, LoraInfo, LoraUse};
use sapient_sample::TokenIndex;
use sapient_tokenizers::{Message, RenderOptions, Tokenizer};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

#[derive(Debug, Clone)]
pub struct ModelInfo {
    /// The reference it was loaded from (preset id, path or repo).
    pub id: String,
    pub path: PathBuf,
    pub architecture: String,
    pub context_length: usize,
    pub max_seq_len: usize,
    pub vocab_size: usize,
    pub has_chat_template: bool,
}

/// What the engine and the pipeline ask of a model's forward pass: the seam between deciding
/// what runs (the scheduler) and running it. [`LlamaModel`] is the implementation; the
/// engine's tests drive the scheduler with a fake one (no weights).
pub(crate) trait Forward: Send {
    /// A KV cache shaped for this model.
    fn new_kv_cache(&self, opts: KvOptions) -> sapient_llama::Result<KvCache>;
    /// One batched forward into slots the caller reserved (the caller sets the lengths), each
    /// sequence with its LoRA adapters (`loras` empty: none for any).
    fn forward_reserved(&mut self, kv: &mut KvCache, batch: &[BatchSeq<'_>], loras: &[&[LoraUse]], out: &mut Vec<f32>) -> sapient_llama::Result<usize>;
    /// One batched forward that reserves its own slots and sets the lengths (a draft model).
    fn forward_batch(&mut self, kv: &mut KvCache, batch: &[BatchSeq<'_>], out: &mut Vec<f32>) -> sapient_llama::Result<usize>;
    /// Compute only these logits (a draft's reduced output layer); `None`: all again.
    fn restrict_logits(&mut self, keep: Option<(usize, &[u32])>) -> sapient_llama::Result<bool>;
    /// Forget any cache the model keeps itself.
    fn clear_cache(&mut self);
    /// Load a LoRA adapter for this model; its id.
    fn load_lora(&mut self, path: &std::path::Path) -> sapient_llama::Result<usize>;
    /// The LoRA adapters loaded, by id.
    fn loras(&self) -> Vec<LoraInfo>;
    /// A hybrid's multi-token-prediction head (`LlamaModel::has_mtp`): its hidden size when
    /// there is one. The engine's fake models have none.
    fn mtp_hidden_size(&self) -> Option<usize> {
        None
    }
    /// Keep every row's output-normed hidden state and, for verification steps, a hybrid's
    /// state after each row (`LlamaModel::set_keep_hidden`, `set_keep_row_states`).
    fn keep_for_mtp(&mut self, _on: bool) {}
    /// The first `rows` hidden states of the last forward.
    fn hidden(&self, _rows: usize) -> Option<&[f32]> {
        None
    }
    /// The MTP head's cache, forward and own hidden states (`LlamaModel::new_mtp_cache`,
    /// `mtp_forward`, `mtp_hidden`).
    fn new_mtp_cache(&self, _opts: KvOptions) -> sapient_llama::Result<KvCache> {
        Err(sapient_llama::Error::Config("the model has no MTP head".into()))
    }
    fn mtp_forward(&mut self, _kv: &mut KvCache, _batch: &[BatchSeq<'_>], _hidden: &[f32], _out: &mut Vec<f32>) -> sapient_llama::Result<usize> {
        Err(sapient_llama::Error::Config("the model has no MTP head".into()))
    }
    fn mtp_hidden(&self, _rows: usize) -> Option<&[f32]> {
        None
    }
}

impl Forward for LlamaModel {
    fn new_kv_cache(&self, opts: KvOptions) -> sapient_llama::Result<KvCache> {
        LlamaModel::new_kv_cache(self, opts)
    }
    fn forward_reserved(&mut self, kv: &mut KvCache, batch: &[BatchSeq<'_>], loras: &[&[LoraUse]], out: &mut Vec<f32>) -> sapient_llama::Result<usize> {
        LlamaModel::forward_reserved_lora(self, kv, batch, loras, out)
    }
    fn forward_batch(&mut self, kv: &mut KvCache, batch: &[BatchSeq<'_>], out: &mut Vec<f32>) -> sapient_llama::Result<usize> {
        LlamaModel::forward_batch(self, kv, batch, out)
    }
    fn restrict_logits(&mut self, keep: Option<(usize, &[u32])>) -> sapient_llama::Result<bool> {
        LlamaModel::restrict_logits(self, keep)
    }
    fn clear_cache(&mut self) {
        LlamaModel::clear_cache(self)
    }
    fn load_lora(&mut self, path: &std::path::Path) -> sapient_llama::Result<usize> {
        LlamaModel::load_lora(self, path)
    }
    fn loras(&self) -> Vec<LoraInfo> {
        LlamaModel::loras(self)
    }
    fn mtp_hidden_size(&self) -> Option<usize> {
        self.has_mtp().then_some(self.config().hidden_size)
    }
    fn keep_for_mtp(&mut self, on: bool) {
        self.set_keep_hidden(on);
        self.set_keep_row_states(on);
    }
    fn hidden(&self, rows: usize) -> Option<&[f32]> {
        LlamaModel::hidden(self, rows)
    }
    fn new_mtp_cache(&self, opts: KvOptions) -> sapient_llama::Result<KvCache> {
        LlamaModel::new_mtp_cache(self, opts)
    }
    fn mtp_forward(&mut self, kv: &mut KvCache, batch: &[BatchSeq<'_>], hidden: &[f32], out: &mut Vec<f32>) -> sapient_llama::Result<usize> {
        LlamaModel::mtp_forward(self, kv, batch, hidden, out)
    }
    fn mtp_hidden(&self, rows: usize) -> Option<&[f32]> {
        LlamaModel::mtp_hidden(self, rows)
    }
}

pub(crate) struct Inner {
    pub(crate) model: Box<dyn Forward>,
}

/// A loaded language model with its tokenizer (what a [`Pipeline`](crate::Pipeline) derefs
/// to and an [`Engine`](crate::Engine) runs). Clones share the weights.
#[derive(Clone)]
pub struct Model {
    pub(crate) inner: Arc<Mutex<Inner>>,
    pub(crate) tokenizer: Tokenizer,
    pub(crate) info: Arc<ModelInfo>,
    /// The vocabulary trie for constrained generation, built on first use.
    pub(crate) token_index: Arc<std::sync::OnceLock<Arc<TokenIndex>>>,
}

impl Model {
    pub(crate) fn new(model: LlamaModel, tokenizer: Tokenizer, info: ModelInfo) -> Self {
        Self::with_forward(Box::new(model), tokenizer, info)
    }

    /// A model whose forward pass is `model` (the engine's tests give a fake one).
    pub(crate) fn with_forward(model: Box<dyn Forward>, tokenizer: Tokenizer, info: ModelInfo) -> Self {
        Self {
            tokenizer,
            info: Arc::new(info),
            token_index: Arc::default(),
            inner: Arc::new(Mutex::new(Inner { model })),
        }
    }

    /// The vocabulary prepared for token masks (built once, on first use): special tokens
    /// are never allowed by a constraint, end-of-sequence tokens only when it is complete.
    pub fn token_index(&self) -> Arc<TokenIndex> {
        self.token_index
            .get_or_init(|| {
                let special: Vec<u32> = self
                    .tokenizer
                    .inner()
                    .get_added_tokens_decoder()
                    .iter()
                    .filter(|(_, t)| t.special)
                    .map(|(id, _)| *id)
                    .collect();
                // The tokenizer splits text the constraint forces (fed without sampling).
                let tok = self.tokenizer.clone();
                let tokenize: sapient_sample::Tokenize = Arc::new(move |text: &str| tok.encode(text, false).ok());
                Arc::new(TokenIndex::new(self.tokenizer.token_bytes(), self.tokenizer.eos_token_ids(), &special).with_tokenizer(tokenize))
            })
            .clone()
    }

    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The chat prompt the model's template renders for `messages` (with the generation prompt).
    pub fn render_chat(&self, messages: &[Message]) -> Result<String> {
        self.render_chat_with(messages, None)
    }

    /// [`render_chat`](Self::render_chat) with the template's thinking switch
    /// ([`GenerationConfig::thinking`](crate::GenerationConfig::thinking)).
    pub fn render_chat_with(&self, messages: &[Message], thinking: Option<bool>) -> Result<String> {
        let mut opts = RenderOptions::default();
        if let Some(t) = thinking {
            opts.extra.insert("enable_thinking".into(), t.into());
        }
        Ok(self.render_chat_tools(messages, &[], opts)?.0)
    }

    /// The chat prompt with `tools` offered the way the template takes them
    /// ([`ToolStyle::offer`](crate::chat::ToolStyle::offer)), and that way (the syntax the
    /// model calls in).
    pub fn render_chat_tools(&self, messages: &[Message], tools: &[crate::chat::Function], mut opts: RenderOptions) -> Result<(String, crate::chat::ToolStyle)> {
        let template = self
            .tokenizer
            .chat_template()
            .ok_or_else(|| Error::NoChatTemplate(self.info.id.clone()))?;
        let style = crate::chat::ToolStyle::of_template(template.source());
        let mut msgs = messages.to_vec();
        style.offer(tools, &mut msgs, &mut opts);
        Ok((template.render(&msgs, &opts)?, style))
    }

    /// Load a LoRA adapter (llama.cpp's GGUF adapter format) for this model, checked against
    /// it; returns its id for [`GenerationConfig::lora`](crate::GenerationConfig::lora).
    /// Every clone of the model (engines, pipelines) gets it.
    pub fn load_lora(&self, path: &std::path::Path) -> Result<usize> {
        Ok(self.lock_inner()?.model.load_lora(path)?)
    }

    /// The LoRA adapters loaded, by id.
    pub fn loras(&self) -> Result<Vec<sapient_llama::LoraInfo>> {
        Ok(self.lock_inner()?.model.loras())
    }

    /// Whether `other` is this model (a clone of it).
    pub fn same_model(&self, other: &Model) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    pub(crate) fn lock_inner(&self) -> Result<std::sync::MutexGuard<'_, Inner>> {
        match self.inner.lock() {
            Ok(g) => Ok(g),
            Err(poisoned) => {
                // A forward that panicked leaves nothing half-written that the next one
                // reads (its buffers are refilled, the caches are the callers'); go on.
                self.inner.clear_poison();
                let mut g = poisoned.into_inner();
                g.model.clear_cache();
                Ok(g)
            }
        }
    }

    /// Check that `other` can draft for this model: same vocabulary, token for token.
    pub fn check_same_vocab(&self, other: &Model) -> Result<()> {
        let (a, b) = (&self.tokenizer, &other.tokenizer);
        let n = a.vocab_size().min(self.info.vocab_size);
        let m = b.vocab_size().min(other.info.vocab_size);
        let mismatch = |what: String| Error::VocabMismatch { target: self.info.id.clone(), draft: other.info.id.clone(), what };
        if n != m {
            return Err(mismatch(format!("{n} vs {m} tokens")));
        }
        for id in 0..n as u32 {
            if a.id_to_token(id) != b.id_to_token(id) {
                return Err(mismatch(format!("token {id} is {:?} vs {:?}", a.id_to_token(id), b.id_to_token(id))));
            }
        }
        Ok(())
    }
}

/// How many tokens `a` and `b` start with in common.
pub(crate) fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}
