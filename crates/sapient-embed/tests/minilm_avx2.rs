//! all-MiniLM-L6-v2 at the AVX2 level (the AVX-512 kernels switched off for this process, as
//! on CPUs without them): the model card's similarities, the 16-bit integer products close to
//! the f32 ones, and a sentence's vector the same bits alone as in a batch.

use anyhow::Result;
use sapient_embed::{cosine, EmbedOptions, Embedder, Precision};
use sapient_tensor::kernels;

/// The AVX2 level for this process; false where the CPU has no AVX2 (nothing to test).
fn avx2_level() -> Result<bool> {
    kernels::configure(kernels::KernelOptions { avx512: false, ..Default::default() })?;
    Ok(kernels::has_avx2() && !kernels::has_avx512())
}

#[test]
fn model_card_and_batches_at_the_avx2_level() -> Result<()> {
    if !avx2_level()? {
        eprintln!("no AVX2 here: nothing to test");
        return Ok(());
    }
    let e = Embedder::load("all-minilm-l6-v2", EmbedOptions::default(), &mut |_| {})?;
    let r = Embedder::load("all-minilm-l6-v2", EmbedOptions { precision: Precision::F32, ..Default::default() }, &mut |_| {})?;
    let texts = ["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium.", "A man is riding a white horse on an enclosed ground."];
    let (v, f) = (e.embed(&texts)?, r.embed(&texts)?);
    let sims = [cosine(&v[0], &v[1]), cosine(&v[0], &v[2]), cosine(&v[1], &v[2])];
    eprintln!("AVX2 level (AVX-VNNI: {}): similarities {sims:?}", kernels::has_vnni());
    for (got, want) in sims.iter().zip([0.666f32, 0.105, 0.141]) {
        assert!((got - want).abs() < 0.0005 + 1e-6, "{got} vs the model card's {want}");
    }
    for (a, b) in v.iter().zip(&f) {
        assert!(cosine(a, b) >= 0.99999, "integer against f32 products: cosine {}", cosine(a, b));
    }
    // Both kinds of products give each sentence the same bits alone as in the batch.
    for (m, batch) in [(&e, &v), (&r, &f)] {
        for (t, b) in texts.iter().zip(batch.iter()) {
            assert!(m.embed(&[t])?[0] == *b, "{t:?} alone differs from in the batch");
        }
    }
    Ok(())
}
