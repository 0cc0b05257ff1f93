//! Print the ids of a text:
//! `cargo run --release -p sapient-tokenizers --example tokenize -- MODEL.gguf|tokenizer.json TEXT [--chat]`
//! With `--chat`, TEXT is first rendered as a user message with the model's chat template.
fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--chat").collect();
    let chat = std::env::args().any(|a| a == "--chat");
    let [path, text] = args.as_slice() else {
        anyhow::bail!("usage: tokenize MODEL.gguf|tokenizer.json TEXT [--chat]");
    };
    let path = std::path::Path::new(path);
    let tok = if path.extension().is_some_and(|e| e == "gguf") {
        sapient_tokenizers::Tokenizer::from_gguf(&sapient_tensor::GgufFile::open(path)?)?
    } else {
        sapient_tokenizers::Tokenizer::from_file(path)?
    };
    let mut text = text.clone();
    if chat {
        let t = tok
            .chat_template()
            .ok_or_else(|| anyhow::anyhow!("no chat template"))?;
        text = t.render(
            &[sapient_tokenizers::Message::user(text)],
            &Default::default(),
        )?;
        println!("{text:?}");
    }
    let ids = tok.encode(&text, chat)?;
    println!(
        "{}",
        ids.iter()
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(",")
    );
    Ok(())
}
