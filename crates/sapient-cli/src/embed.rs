//! `sapient embed` (sentence embeddings as JSON, a cosine matrix, or a vector index file) and
//! `sapient search` (nearest passages of an index to a query).

use anyhow::{bail, Context, Result};
use clap::Args;
use sapient_embed::{cosine, EmbedOptions, Embedder, Task, VectorIndex};
use std::io::{Read, Write};
use std::path::PathBuf;

#[derive(Args)]
pub struct EmbedArgs {
    /// Texts to embed (each one a sentence or passage); see also --file.
    texts: Vec<String>,
    /// Read texts from a file, one per non-empty line (`-` for standard input).
    #[arg(short, long)]
    file: Option<PathBuf>,
    /// An embedding preset (all-minilm-l6-v2, nomic-embed-text-v1.5), a GGUF file or a
    /// sentence-transformers directory.
    #[arg(short, long, default_value = "all-minilm-l6-v2", env = "SAPIENT_EMBED_MODEL")]
    model: String,
    /// What the texts are for, for models with task prefixes (nomic-embed): none, query,
    /// document, clustering, classification. Default: document with --index-out, else none.
    #[arg(long)]
    task: Option<String>,
    /// Matryoshka truncation to this many dimensions.
    #[arg(long)]
    dimensions: Option<usize>,
    /// Truncate each text to this many tokens (default: the model's limit).
    #[arg(long)]
    max_tokens: Option<usize>,
    /// Print the cosine similarity matrix (one JSON array per row) instead of the vectors.
    #[arg(long)]
    similarity: bool,
    /// Write a vector index of the texts to this file (for `sapient search`) instead of
    /// printing vectors.
    #[arg(long)]
    index_out: Option<PathBuf>,
}

#[derive(Args)]
pub struct SearchArgs {
    /// The question or query text.
    query: String,
    /// An index written by `sapient embed --index-out`.
    #[arg(long)]
    index: PathBuf,
    /// How many passages to print.
    #[arg(short, default_value_t = 5)]
    k: usize,
    /// The embedding model (default: the one that built the index).
    #[arg(short, long)]
    model: Option<String>,
    /// Print JSON lines `{"rank", "score", "index", "text"}`.
    #[arg(long)]
    json: bool,
}

fn load(model: &str, o: EmbedOptions) -> Result<Embedder> {
    let mut bars = crate::Bars::default();
    let e = Embedder::load(model, o, &mut |p| bars.update(p)).with_context(|| format!("loading embedding model '{model}'"))?;
    bars.finish();
    Ok(e)
}

pub fn embed(a: EmbedArgs) -> Result<()> {
    let mut texts = a.texts.clone();
    if let Some(f) = &a.file {
        let mut s = String::new();
        if f.as_os_str() == "-" {
            std::io::stdin().read_to_string(&mut s).context("reading standard input")?;
        } else {
            s = std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        }
        texts.extend(s.lines().map(str::trim).filter(|l| !l.is_empty()).map(String::from));
    }
    if texts.is_empty() {
        bail!("nothing to embed: give texts as arguments or --file FILE");
    }
    let task: Task = match (&a.task, &a.index_out) {
        (Some(t), _) => t.parse()?,
        (None, Some(_)) => Task::Document,
        (None, None) => Task::None,
    };
    let e = load(&a.model, EmbedOptions { dimensions: a.dimensions, max_tokens: a.max_tokens, task, ..Default::default() })?;
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let vecs = e.embed(&refs)?;
    if let Some(path) = &a.index_out {
        let mut ix = VectorIndex::new(&a.model, e.dimensions());
        for (t, v) in texts.iter().zip(&vecs) {
            ix.add(t, v)?;
        }
        ix.save(path)?;
        eprintln!("wrote {} passages ({} dimensions, {}) to {}", ix.len(), ix.dimensions(), a.model, path.display());
    } else {
        let mut out = std::io::stdout().lock();
        for x in &vecs {
            let line = if a.similarity {
                serde_json::to_string(&vecs.iter().map(|y| cosine(x, y)).collect::<Vec<f32>>())?
            } else {
                serde_json::to_string(x)?
            };
            match writeln!(out, "{line}") {
                // `sapient embed ... | head`: stop quietly when the reader goes away.
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
                r => r?,
            }
        }
    }
    Ok(())
}

pub fn search(a: SearchArgs) -> Result<()> {
    let ix = VectorIndex::load(&a.index)?;
    let model = a.model.clone().unwrap_or_else(|| ix.model().to_string());
    let dims = ix.dimensions();
    let e = load(&model, EmbedOptions { task: Task::Query, ..Default::default() })?;
    // An index built with Matryoshka truncation: embed the query at the same width.
    let e = if e.dimensions() != dims && dims < e.dimensions() {
        load(&model, EmbedOptions { task: Task::Query, dimensions: Some(dims), ..Default::default() })?
    } else {
        e
    };
    let q = e.embed(&[&a.query])?;
    for (rank, h) in ix.search(&q[0], a.k)?.iter().enumerate() {
        if a.json {
            println!("{}", serde_json::json!({"rank": rank + 1, "score": h.score, "index": h.index, "text": h.text}));
        } else {
            println!("{:.4}\t{}", h.score, h.text);
        }
    }
    Ok(())
}
