//! nomic-embed-text-v1.5 (F16 GGUF, 274 MB: opt-in with SAPIENT_NOMIC_TESTS=1) against a
//! float64 numpy forward pass (scripts/embed/nomic_numpy.py) and llama.cpp's
//! `llama-embedding` on the same file (scripts/embed/nomic_llamacpp.sh), on the 20 sentences
//! of tests/data/embed/sentences.txt (task prefixes written in the text).

use anyhow::{Context, Result};
use sapient_embed::{cosine, EmbedOptions, Embedder, Precision, Task};
use std::path::PathBuf;

fn enabled() -> bool {
    let on = std::env::var("SAPIENT_NOMIC_TESTS").is_ok_and(|v| v == "1");
    if !on {
        eprintln!("skipped: set SAPIENT_NOMIC_TESTS=1 to fetch nomic-embed-text-v1.5 (274 MB) and run this test");
    }
    on
}

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/embed").join(name)
}

fn sentences() -> Result<Vec<String>> {
    Ok(std::fs::read_to_string(data("sentences.txt"))?.lines().filter(|l| !l.trim().is_empty()).map(String::from).collect())
}

fn vectors(name: &str, dim: usize) -> Result<Vec<Vec<f32>>> {
    let b = std::fs::read(data(name)).with_context(|| name.to_string())?;
    let v: Vec<f32> = b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    Ok(v.chunks_exact(dim).map(<[f32]>::to_vec).collect())
}

fn compare(ours: &[Vec<f32>], reference: &[Vec<f32>], what: &str, limit: f32) {
    assert_eq!(ours.len(), reference.len(), "{what}: number of vectors");
    let worst = ours.iter().zip(reference).map(|(a, b)| 1.0 - cosine(a, b)).fold(0.0f32, f32::max);
    let diff = ours.iter().zip(reference).flat_map(|(a, b)| a.iter().zip(b).map(|(x, y)| (x - y).abs())).fold(0.0f32, f32::max);
    eprintln!("{what}: largest cosine distance over {} sentences = {worst:e} (f32), largest |difference| of a component = {diff:e}", ours.len());
    assert!(worst < limit, "{what}: cosine distance {worst} >= {limit}");
}

/// The cosine distance allowed against the float64 reference: `float` for the float
/// products; 3e-3 for the 8-bit ones (measured 1.8e-3 on these sentences).
fn limit(e: &Embedder, float: f32) -> f32 {
    if e.precision() == Precision::Q8 {
        3e-3
    } else {
        float
    }
}

#[test]
fn matches_numpy_and_llamacpp() -> Result<()> {
    if !enabled() {
        return Ok(());
    }
    for precision in [Precision::Float, Precision::Q8] {
        eprintln!("{precision:?}");
        matches_references(Embedder::load("nomic-embed-text-v1.5", EmbedOptions { precision, ..Default::default() }, &mut |_| {})?)?;
    }
    Ok(())
}

fn matches_references(e: Embedder) -> Result<()> {
    assert_eq!((e.dimensions(), e.max_tokens()), (768, 2048));
    let s = sentences()?;
    assert_eq!(s.len(), 20);
    // Token ids: the `tokenizers` library's BertWordPieceTokenizer on the GGUF vocabulary.
    let ids: Vec<Vec<u32>> = serde_json::from_str(&std::fs::read_to_string(data("nomic_numpy_ids.json"))?)?;
    for (t, want) in s.iter().zip(&ids) {
        assert_eq!(&e.tokenize(t, Task::None)?, want, "{t}");
    }
    let refs: Vec<&str> = s.iter().map(String::as_str).collect();
    let ours = e.embed(&refs)?;
    compare(&ours, &vectors("nomic_numpy.f32", 768)?, "numpy float64", limit(&e, 1e-4));
    compare(&ours, &vectors("nomic_llamacpp.f32", 768)?, "llama-embedding", limit(&e, 1e-3));
    // One at a time gives the batch's vectors.
    for (t, b) in refs.iter().zip(&ours).take(4) {
        let one = e.embed(&[t])?;
        assert!(one[0].iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-5), "{t}");
    }
    Ok(())
}

#[test]
fn task_prefixes_and_matryoshka() -> Result<()> {
    if !enabled() {
        return Ok(());
    }
    let s = sentences()?;
    let reference = vectors("nomic_numpy.f32", 768)?;
    // Task::Query writes the prefix that sentence 0 carries in the file.
    let q = Embedder::load("nomic-embed-text-v1.5", EmbedOptions { task: Task::Query, ..Default::default() }, &mut |_| {})?;
    let bare = s[0].strip_prefix("search_query: ").context("sentence 0 is a query")?;
    compare(&q.embed(&[bare])?, &reference[..1], "query prefix", limit(&q, 1e-4));
    // Matryoshka, nomic's recipe applied to the float64 reference: layer norm, cut, normalise.
    let m = Embedder::load("nomic-embed-text-v1.5", EmbedOptions { dimensions: Some(256), ..Default::default() }, &mut |_| {})?;
    let refs: Vec<&str> = s.iter().map(String::as_str).collect();
    let ours = m.embed(&refs[..5])?;
    let want: Vec<Vec<f32>> = reference[..5]
        .iter()
        .map(|v| {
            let n = v.len() as f64;
            let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
            let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
            let mut c: Vec<f64> = v.iter().take(256).map(|&x| (x as f64 - mean) / (var + 1e-5).sqrt()).collect();
            let norm = c.iter().map(|x| x * x).sum::<f64>().sqrt();
            c.iter_mut().for_each(|x| *x /= norm);
            c.into_iter().map(|x| x as f32).collect()
        })
        .collect();
    assert!(ours.iter().all(|v| v.len() == 256));
    compare(&ours, &want, "matryoshka 256", limit(&m, 1e-4));
    // Retrieval sanity: each query is closest to its own passage among the documents.
    let d = Embedder::load("nomic-embed-text-v1.5", EmbedOptions::default(), &mut |_| {})?;
    let all = d.embed(&refs)?;
    for (qi, want) in [(0usize, 1usize), (3, 4), (6, 5), (9, 8), (16, 17)] {
        let best = (0..s.len()).filter(|&i| s[i].starts_with("search_document")).max_by(|&a, &b| cosine(&all[qi], &all[a]).total_cmp(&cosine(&all[qi], &all[b])));
        assert_eq!(best, Some(want), "query {qi}: {}", s[qi]);
    }
    Ok(())
}
