//! Retrieval-augmented generation: embed a few passages into a `VectorIndex`, retrieve the
//! ones closest to a question, and let an LLM answer from them through
//! `sapient_generate::Pipeline`.
//!
//! ```sh
//! cargo run --release -p sapient-embed --example rag -- "When was the Eiffel Tower finished?"
//! cargo run --release -p sapient-embed --example rag -- --embedder nomic-embed-text-v1.5 --llm qwen2.5-coder-0.5b-instruct "..."
//! ```

use anyhow::Result;
use sapient_embed::{EmbedOptions, Embedder, Task, VectorIndex};
use sapient_generate::{GenerationConfig, Message, Pipeline};

const PASSAGES: &[&str] = &[
    "The Eiffel Tower in Paris was completed in March 1889 as the entrance arch of the World's Fair.",
    "The Eiffel Tower is 330 metres tall and was the tallest man-made structure until 1930.",
    "Gustave Eiffel's company designed and built the tower; Maurice Koechlin drew its first sketch.",
    "The Great Wall of China stretches for thousands of kilometres across northern China.",
    "Mount Fuji, Japan's highest mountain, last erupted in 1707.",
    "The Colosseum in Rome could hold between 50,000 and 80,000 spectators.",
    "Sourdough bread rises thanks to wild yeast and lactic acid bacteria in the starter.",
    "The Rust programming language reached version 1.0 in May 2015.",
];

fn main() -> Result<()> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut take = |flag: &str, default: &str| -> String {
        match args.iter().position(|a| a == flag) {
            Some(i) if i + 1 < args.len() => {
                let v = args.remove(i + 1);
                args.remove(i);
                v
            }
            _ => default.to_string(),
        }
    };
    let embedder_id = take("--embedder", "all-minilm-l6-v2");
    let llm_id = take("--llm", "smollm2-135m-instruct");
    let question = if args.is_empty() { "When was the Eiffel Tower finished?".to_string() } else { args.join(" ") };

    let embedder = Embedder::load(&embedder_id, EmbedOptions::default(), &mut |_| {})?;
    let mut index = VectorIndex::new(&embedder_id, embedder.dimensions());
    for (p, v) in PASSAGES.iter().zip(embedder.embed_as(PASSAGES, Task::Document)?) {
        index.add(p, &v)?;
    }
    let q = embedder.embed_as(&[&question], Task::Query)?;
    let hits = index.search(&q[0], 3)?;
    eprintln!("retrieved:");
    for h in &hits {
        eprintln!("  {:.3}  {}", h.score, h.text);
    }
    let context: String = hits.iter().map(|h| format!("- {}\n", h.text)).collect();
    let pipe = Pipeline::from_pretrained(&llm_id)?;
    let messages = [
        Message::system("Answer the question using only the facts given. Answer in one sentence."),
        Message::user(format!("Facts:\n{context}\nQuestion: {question}")),
    ];
    let answer = pipe.chat(&messages, &GenerationConfig::default().max_tokens(64))?;
    println!("{}", answer.text.trim());
    Ok(())
}
