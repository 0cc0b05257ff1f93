//! all-MiniLM-L6-v2 (CI model set) against its model card, batching, truncation, errors.

use anyhow::Result;
use sapient_embed::{cosine, EmbedOptions, Embedder, Error, Precision, Task};

fn load(o: EmbedOptions) -> Result<Embedder> {
    Ok(Embedder::load("all-minilm-l6-v2", o, &mut |_| {})?)
}

const CARD: [&str; 3] = ["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."];

/// The similarities published on the model card (sentence-transformers' example).
#[test]
fn model_card_similarities() -> Result<()> {
    let e = load(EmbedOptions::default())?;
    assert_eq!((e.dimensions(), e.precision()), (384, Precision::Float));
    let s = CARD;
    let v = e.embed(&s)?;
    for x in &v {
        let n: f32 = x.iter().map(|a| a * a).sum::<f32>().sqrt();
        assert!((n - 1.0).abs() < 1e-5, "normalised: {n}");
    }
    let sims = [cosine(&v[0], &v[1]), cosine(&v[0], &v[2]), cosine(&v[1], &v[2])];
    eprintln!("similarities {sims:?}");
    for (got, want) in sims.iter().zip([0.666f32, 0.105, 0.141]) {
        assert!((got - want).abs() < 0.0005 + 1e-6, "{got} vs the model card's {want}");
    }
    Ok(())
}

/// The 8-bit products give the float ones' vectors to a cosine of 0.999 or more on these
/// sentences (the model card's similarities move by up to 0.002).
#[test]
fn q8_close_to_float() -> Result<()> {
    let f = load(EmbedOptions { precision: Precision::Float, ..Default::default() })?;
    let q = load(EmbedOptions { precision: Precision::Q8, ..Default::default() })?;
    assert_eq!((f.precision(), q.precision()), (Precision::Float, Precision::Q8));
    let long = "the river carried small boats past old stone houses ".repeat(12);
    let s = [&CARD[..], &["A man is eating food.", "A cheetah is running behind its prey.", &long]].concat();
    let (vf, vq) = (f.embed(&s)?, q.embed(&s)?);
    let worst = vf.iter().zip(&vq).map(|(a, b)| cosine(a, b)).fold(1.0f32, f32::min);
    eprintln!("smallest cosine(q8, float) over {} sentences = {worst}", s.len());
    assert!(worst >= 0.999, "{worst}");
    Ok(())
}

/// The default products (on CPUs with AVX-512 VNNI and no AMX-BF16, 16-bit integers) give
/// the f32 products' vectors to a cosine of 0.99999 and their similarities to 2e-4.
#[test]
fn float_close_to_f32() -> Result<()> {
    let f = load(EmbedOptions::default())?;
    let r = load(EmbedOptions { precision: Precision::F32, ..Default::default() })?;
    let long = "the river carried small boats past old stone houses ".repeat(12);
    let s = [&CARD[..], &["A man is eating food.", "A cheetah is running behind its prey.", &long]].concat();
    let (vf, vr) = (f.embed(&s)?, r.embed(&s)?);
    let worst = vf.iter().zip(&vr).map(|(a, b)| cosine(a, b)).fold(1.0f32, f32::min);
    let sim = |v: &[Vec<f32>], i: usize, j: usize| cosine(&v[i], &v[j]);
    let moved = [(0, 1), (0, 2), (1, 2)].iter().map(|&(i, j)| (sim(&vf, i, j) - sim(&vr, i, j)).abs()).fold(0.0f32, f32::max);
    eprintln!("smallest cosine(float, f32) over {} sentences = {worst}; similarities moved by up to {moved}", s.len());
    assert!(worst >= 0.99999 && moved <= 2e-4, "{worst} {moved}");
    Ok(())
}

/// A sentence alone and inside a batch of other lengths gives the same vector.
#[test]
fn batched_equals_single() -> Result<()> {
    let e = load(EmbedOptions::default())?;
    let texts = [
        "A man is eating food.",
        "A man is eating a piece of bread while sitting on a bench in the park on a sunny afternoon.",
        "The girl is carrying a baby.",
        "Hi",
        "A monkey is playing drums, and the crowd around it claps along to the rhythm with delight.",
        "Two men pushed carts through the woods.",
        "",
        "A cheetah is running behind its prey.",
        "A man is riding a white horse on an enclosed ground.",
    ];
    let batch = e.embed(&texts)?;
    let mut worst = 0.0f32;
    for (t, b) in texts.iter().zip(&batch) {
        let one = e.embed(&[t])?;
        for (x, y) in one[0].iter().zip(b) {
            worst = worst.max((x - y).abs());
        }
    }
    eprintln!("largest |batched - single| = {worst:e}");
    assert!(worst <= 1e-5, "{worst}");
    // A budget of a few tokens per forward splits the list and changes nothing either.
    let small = Embedder::load("all-minilm-l6-v2", EmbedOptions { batch_tokens: Some(20), ..Default::default() }, &mut |_| {})?;
    let split = small.embed(&texts)?;
    for (a, b) in split.iter().zip(&batch) {
        assert!(a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-5));
    }
    Ok(())
}

#[test]
fn tokenization_truncation_and_options() -> Result<()> {
    let e = load(EmbedOptions::default())?;
    // The tokenizer.json pads to 128: padding must be off.
    let ids = e.tokenize("The weather is lovely today.", Task::None)?;
    assert_eq!(ids.first(), Some(&101));
    assert_eq!(ids.last(), Some(&102));
    assert_eq!(ids.len(), 8, "{ids:?}");
    // sentence-transformers truncates at max_seq_length = 256 tokens, [SEP] kept.
    assert_eq!(e.max_tokens(), 256);
    let long = "word ".repeat(400);
    let t = e.tokenize(&long, Task::None)?;
    assert_eq!((t.len(), t[255]), (256, 102));
    // Truncation is what the model sees: two texts equal in their first 14 tokens embed alike.
    let short = load(EmbedOptions { max_tokens: Some(16), ..Default::default() })?;
    let v = short.embed(&["one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen", "one two three four five six seven eight nine ten eleven twelve thirteen fourteen sixteen"])?;
    assert!(cosine(&v[0], &v[1]) > 0.99999);
    // Matryoshka-style cut: shorter, unit length, close in direction for this pair.
    let cut = load(EmbedOptions { dimensions: Some(128), ..Default::default() })?;
    let v = cut.embed(&["The weather is lovely today."])?;
    assert_eq!(v[0].len(), 128);
    assert!((v[0].iter().map(|a| a * a).sum::<f32>() - 1.0).abs() < 1e-5);
    Ok(())
}

#[test]
fn clear_errors() -> Result<()> {
    let e = load(EmbedOptions::default())?;
    assert!(matches!(e.embed(&[]), Err(Error::EmptyInput)));
    let err = Embedder::load("no-such-embedder", EmbedOptions::default(), &mut |_| {}).unwrap_err().to_string();
    assert!(err.contains("unknown model 'no-such-embedder'"), "{err}");
    let err = load(EmbedOptions { dimensions: Some(1000), ..Default::default() }).unwrap_err().to_string();
    assert!(err.contains("1 to 384"), "{err}");
    // An LLM preset is not an encoder (checked before anything is fetched).
    let err = Embedder::load("smollm2-135m-instruct", EmbedOptions::default(), &mut |_| {}).unwrap_err().to_string();
    assert!(err.contains("not an embedding model"), "{err}");
    // The same model's GGUF given as a file: the architecture is named.
    let gguf = sapient_hub::Hub::new()?.fetch_preset("smollm2-135m-instruct", &mut |_| {})?.file("gguf")?.to_path_buf();
    let err = Embedder::load(&gguf.to_string_lossy(), EmbedOptions::default(), &mut |_| {}).unwrap_err().to_string();
    assert!(err.contains("architecture 'llama' is not a sentence encoder"), "{err}");
    Ok(())
}
