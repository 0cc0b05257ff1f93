//! `sapient-embed`: sentence embeddings on SAPIENT's CPU kernels, and a small vector index.
//!
//! One encoder definition runs BERT checkpoints (transformers `config.json` + safetensors,
//! with sentence-transformers' pooling and normalisation files, e.g. all-MiniLM-L6-v2) and
//! `bert` / `nomic-bert` GGUF files (e.g. nomic-embed-text-v1.5). Texts are tokenized with
//! WordPiece (from `tokenizer.json`, with its padding and truncation switched off, or from
//! GGUF metadata), truncated to the model's length, packed into one batch without padding
//! (each sequence attends only to itself), pooled (mean, CLS or last token, from the model's
//! config) and L2-normalised when the model asks for it.
//!
//! ```no_run
//! use sapient_embed::{Embedder, EmbedOptions};
//! let e = Embedder::load("all-minilm-l6-v2", EmbedOptions::default(), &mut |_| {})?;
//! let v = e.embed(&["The weather is lovely today.", "It's so sunny outside!"])?;
//! println!("{}", sapient_embed::cosine(&v[0], &v[1]));
//! # Ok::<(), sapient_embed::Error>(())
//! ```

mod config;
pub mod index;
mod model;

pub use config::{Arch, EncoderConfig, Pooling};
pub use model::Precision;
pub use index::{Hit, VectorIndex};
pub use sapient_hub::Progress;

use std::ops::Range;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(transparent)]
    Hub(#[from] sapient_hub::Error),
    #[error(transparent)]
    Tensor(#[from] sapient_tensor::Error),
    #[error(transparent)]
    Tokenizer(#[from] sapient_tokenizers::Error),
    #[error("tensor: {0}")]
    Candle(#[from] candle_core::Error),
    #[error("{path}: architecture '{found}' is not a sentence encoder this crate runs (bert, nomic-bert)")]
    Architecture { path: PathBuf, found: String },
    #[error("{path}: {what}")]
    Config { path: PathBuf, what: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("nothing to embed: the list of texts is empty")]
    EmptyInput,
    #[error("token id {id} is outside the model's vocabulary of {vocab}")]
    Token { id: u32, vocab: usize },
    #[error("{tokens} tokens is more than the model's {max} positions")]
    TooLong { tokens: usize, max: usize },
    #[error("{0}")]
    Options(String),
    #[error("model '{0}' has neither a GGUF file nor config.json + safetensors + tokenizer.json")]
    NoWeights(String),
    #[error("vector index {path}: {what}")]
    Index { path: PathBuf, what: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What a text is embedded for; models trained with task prefixes (nomic-embed) put the
/// matching prefix before the text, others ignore it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Task {
    /// No prefix (the text is used as given).
    #[default]
    None,
    /// A search query (`search_query: `).
    Query,
    /// A passage to be found (`search_document: `).
    Document,
    /// `clustering: `.
    Clustering,
    /// `classification: `.
    Classification,
}

impl Task {
    /// nomic-embed's prefix for this task.
    pub fn prefix(self) -> &'static str {
        match self {
            Task::None => "",
            Task::Query => "search_query: ",
            Task::Document => "search_document: ",
            Task::Clustering => "clustering: ",
            Task::Classification => "classification: ",
        }
    }
}

impl std::str::FromStr for Task {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "none" => Task::None,
            "query" | "search_query" => Task::Query,
            "document" | "search_document" => Task::Document,
            "clustering" => Task::Clustering,
            "classification" => Task::Classification,
            _ => return Err(Error::Options(format!("task '{s}' is not none, query, document, clustering or classification"))),
        })
    }
}

/// Choices made at load time; `None` means the model's own setting.
#[derive(Debug, Clone, Default)]
pub struct EmbedOptions {
    /// Truncate inputs to this many tokens (special tokens included); at most the model's.
    pub max_tokens: Option<usize>,
    /// Matryoshka truncation to this many dimensions (then re-normalised).
    pub dimensions: Option<usize>,
    pub pooling: Option<Pooling>,
    pub normalize: Option<bool>,
    /// The task prefix `embed` uses (see [`Embedder::embed_as`]).
    pub task: Task,
    /// Most tokens run in one forward pass (default 16384); longer lists are split.
    pub batch_tokens: Option<usize>,
    /// How the linear layers multiply (default [`Precision::Float`]).
    pub precision: Precision,
}

/// A loaded sentence encoder.
pub struct Embedder {
    id: String,
    model: model::Encoder,
    tokenizer: tokenizers::Tokenizer,
    max_tokens: usize,
    pooling: Pooling,
    normalize: bool,
    dimensions: usize,
    task: Task,
    batch_tokens: usize,
    sep: Option<u32>,
}

impl std::fmt::Debug for Embedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedder").field("id", &self.id).field("config", &self.model.cfg).finish()
    }
}

fn file_beside(dir: &Path, names: &[&str]) -> Option<PathBuf> {
    names.iter().map(|n| dir.join(n)).find(|p| p.is_file())
}

impl Embedder {
    /// A preset id (`all-minilm-l6-v2`, `nomic-embed-text-v1.5`), a `.gguf` file, a
    /// sentence-transformers / transformers directory, or a Hub repo id; fetched through
    /// sapient-hub when needed, with progress (downloads, then `Loading`).
    pub fn load(id: &str, options: EmbedOptions, progress: &mut dyn FnMut(Progress)) -> Result<Self> {
        let hub = sapient_hub::Hub::new()?;
        if let Ok(p) = hub.registry().get(id) {
            if p.kind != "embedding" && !Path::new(id).exists() {
                return Err(Error::Options(format!("'{id}' is a {} preset, not an embedding model (run `sapient models`)", p.kind)));
            }
        }
        let r = hub.resolve(id, progress)?;
        let mut loading = |f: f32| progress(Progress::Loading { progress: f });
        let (cfg, weights, gguf, tokenizer): (EncoderConfig, Box<dyn sapient_tensor::WeightSource>, bool, sapient_tokenizers::Tokenizer) =
            if let Ok(path) = r.file("gguf") {
                let g = sapient_tensor::GgufFile::open(path)?;
                let cfg = EncoderConfig::from_gguf(&g)?;
                let tok = sapient_tokenizers::Tokenizer::from_gguf(&g)?;
                (cfg, Box::new(g), true, tok)
            } else {
                let (Ok(config), Ok(_), Ok(tj)) = (r.file("config"), r.file("safetensors"), r.file("tokenizer")) else {
                    return Err(Error::NoWeights(id.to_string()));
                };
                let dir = config.parent().unwrap_or(Path::new("."));
                // Preset files are named by role; a sentence-transformers folder keeps its layout.
                let pooling = r.file("pooling").ok().map(Path::to_path_buf).or_else(|| file_beside(dir, &["1_Pooling/config.json"]));
                let modules = r.file("modules").ok().map(Path::to_path_buf).or_else(|| file_beside(dir, &["modules.json"]));
                let sentence = r.file("sentence_config").ok().map(Path::to_path_buf).or_else(|| file_beside(dir, &["sentence_bert_config.json"]));
                let cfg = EncoderConfig::from_hf(config, pooling.as_deref(), modules.as_deref(), sentence.as_deref())?;
                let w = sapient_tensor::SafetensorsFiles::open(r.files("safetensors"))?;
                (cfg, Box::new(w), false, sapient_tokenizers::Tokenizer::from_file(tj)?)
            };
        let model = model::Encoder::load(cfg, weights.as_ref(), gguf, options.precision, &mut loading)?;
        Self::new(id, model, tokenizer, options)
    }

    fn new(id: &str, model: model::Encoder, tok: sapient_tokenizers::Tokenizer, o: EmbedOptions) -> Result<Self> {
        let cfg = &model.cfg;
        let mut tokenizer = tok.inner().clone();
        // tokenizer.json files often pad every input to a fixed length (all-MiniLM-L6-v2's
        // pads to 128) and truncate: we batch without padding and truncate ourselves.
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(None)
            .map_err(|e| Error::Options(format!("tokenizer: {e}")))?;
        let max_tokens = match o.max_tokens {
            Some(0) | Some(1) | Some(2) => return Err(Error::Options("max_tokens must be at least 3 ([CLS] text [SEP])".into())),
            Some(m) => m.min(cfg.max_tokens),
            None => cfg.max_tokens,
        };
        let dimensions = match o.dimensions {
            None => cfg.dim,
            Some(d) if d == 0 || d > cfg.dim => return Err(Error::Options(format!("dimensions {d}: the model gives 1 to {}", cfg.dim))),
            Some(d) => d,
        };
        let sep = tokenizer.token_to_id("[SEP]");
        Ok(Self {
            id: id.to_string(),
            max_tokens,
            pooling: o.pooling.unwrap_or(cfg.pooling),
            normalize: o.normalize.unwrap_or(cfg.normalize),
            dimensions,
            task: o.task,
            batch_tokens: o.batch_tokens.unwrap_or(16384).max(1),
            sep,
            tokenizer,
            model,
        })
    }

    pub fn id(&self) -> &str {
        &self.id
    }
    pub fn config(&self) -> &EncoderConfig {
        &self.model.cfg
    }
    /// Length of the vectors `embed` returns.
    pub fn dimensions(&self) -> usize {
        self.dimensions
    }
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }
    /// How the linear layers multiply ([`EmbedOptions::precision`]).
    pub fn precision(&self) -> Precision {
        self.model.precision
    }

    /// Token ids of one text as the model sees it (prefix, special tokens, truncation).
    pub fn tokenize(&self, text: &str, task: Task) -> Result<Vec<u32>> {
        let text = if self.model.cfg.task_prefixes { format!("{}{text}", task.prefix()) } else { text.to_string() };
        let enc = self.tokenizer.encode_fast(text.as_str(), true).map_err(|e| Error::Options(format!("tokenizing: {e}")))?;
        let mut ids = enc.get_ids().to_vec();
        if ids.len() > self.max_tokens {
            // Keep the closing [SEP] (what truncating the text before adding it gives).
            let last = *ids.last().unwrap_or(&0);
            ids.truncate(self.max_tokens);
            if Some(last) == self.sep {
                ids[self.max_tokens - 1] = last;
            }
        }
        if ids.is_empty() {
            return Err(Error::Options("the tokenizer gave no tokens (no [CLS]/[SEP] post-processor?)".into()));
        }
        Ok(ids)
    }

    /// Embed texts with the task chosen at load ([`EmbedOptions::task`]).
    pub fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        self.embed_as(texts, self.task)
    }

    /// Embed texts for a task (nomic-embed: `Task::Query` for questions, `Task::Document`
    /// for the passages searched).
    pub fn embed_as(&self, texts: &[&str], task: Task) -> Result<Vec<Vec<f32>>> {
        if texts.is_empty() {
            return Err(Error::EmptyInput);
        }
        let toks = texts.iter().map(|t| self.tokenize(t, task)).collect::<Result<Vec<_>>>()?;
        self.embed_tokens(&toks)
    }

    /// Embed pre-tokenized sequences (each with its special tokens).
    pub fn embed_tokens(&self, seqs: &[Vec<u32>]) -> Result<Vec<Vec<f32>>> {
        if seqs.is_empty() {
            return Err(Error::EmptyInput);
        }
        let mut out = Vec::with_capacity(seqs.len());
        let mut start = 0;
        while start < seqs.len() {
            // As many sequences as fit in the token budget (at least one).
            let mut end = start;
            let mut n = 0;
            while end < seqs.len() && (end == start || n + seqs[end].len() <= self.batch_tokens) {
                n += seqs[end].len();
                end += 1;
            }
            let ids: Vec<u32> = seqs[start..end].iter().flatten().copied().collect();
            let mut ranges: Vec<Range<usize>> = Vec::with_capacity(end - start);
            let mut o = 0;
            for s in &seqs[start..end] {
                if s.is_empty() {
                    return Err(Error::Options("an empty token sequence".into()));
                }
                ranges.push(o..o + s.len());
                o += s.len();
            }
            let h = self.model.forward(&ids, &ranges)?;
            for r in &ranges {
                out.push(self.pool(&h, r.clone()));
            }
            start = end;
        }
        Ok(out)
    }

    fn pool(&self, h: &[f32], r: Range<usize>) -> Vec<f32> {
        let d = self.model.cfg.dim;
        let mut v: Vec<f32> = match self.pooling {
            Pooling::Cls => h[r.start * d..(r.start + 1) * d].to_vec(),
            Pooling::Last => h[(r.end - 1) * d..r.end * d].to_vec(),
            Pooling::Mean => {
                let mut acc = vec![0.0f64; d];
                for i in r.clone() {
                    for (a, &x) in acc.iter_mut().zip(&h[i * d..(i + 1) * d]) {
                        *a += x as f64;
                    }
                }
                acc.iter().map(|a| (a / r.len() as f64) as f32).collect()
            }
        };
        if self.dimensions < d {
            if self.model.cfg.matryoshka {
                // nomic-embed's recipe: layer norm (no affine), cut, normalise.
                let ones = vec![1.0f32; d];
                let zeros = vec![0.0f32; d];
                sapient_tensor::encoder::layer_norm(&mut v, &ones, &zeros, 1e-5);
            }
            v.truncate(self.dimensions);
        }
        if self.normalize || self.dimensions < d {
            normalize(&mut v);
        }
        v
    }
}

/// Scale to unit length (a zero vector stays zero).
pub fn normalize(v: &mut [f32]) {
    let n = v.iter().map(|&x| (x as f64) * (x as f64)).sum::<f64>().sqrt();
    if n > 0.0 {
        for x in v {
            *x = (*x as f64 / n) as f32;
        }
    }
}

/// Cosine similarity.
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let (mut ab, mut aa, mut bb) = (0.0f64, 0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        ab += x as f64 * y as f64;
        aa += x as f64 * x as f64;
        bb += y as f64 * y as f64;
    }
    if aa == 0.0 || bb == 0.0 {
        return 0.0;
    }
    (ab / (aa.sqrt() * bb.sqrt())) as f32
}

/// The README's example, compiled as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctest;
