use sapient_embed::{EmbedOptions, Embedder, Precision};
use std::time::Instant;
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a: Vec<String> = std::env::args().collect();
    let model = a.get(1).map(String::as_str).unwrap_or("all-minilm-l6-v2");
    let precision = match a.get(2).map(String::as_str) { Some("f32") => Precision::F32, Some("q8") => Precision::Q8, _ => Precision::Float };
    let reps: usize = a.get(3).and_then(|v| v.parse().ok()).unwrap_or(5);
    let e = Embedder::load(model, EmbedOptions { precision, ..Default::default() }, &mut |_| {})?;
    let words = "the river quietly carried small boats past old stone houses while children watched from a wooden bridge and their parents talked about weather";
    let s: Vec<String> = (0..64).map(|i| format!("{} {}", i, words)).collect();
    for b in [1usize, 8, 64] {
        let t: Vec<&str> = s[..b].iter().map(String::as_str).collect();
        e.embed(&t)?;
        let mut best = f64::INFINITY;
        for _ in 0..reps { let t0 = Instant::now(); e.embed(&t)?; best = best.min(t0.elapsed().as_secs_f64()); }
        println!("{model} {precision:?} batch {b}: {:.1} sent/s", b as f64 / best);
    }
    Ok(())
}
