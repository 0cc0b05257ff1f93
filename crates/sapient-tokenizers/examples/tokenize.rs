//! Print the ids of a text: `cargo run --release -p sapient-tokenizers --example tokenize -- MODEL.gguf|tokenizer.json TEXT [--chat]`
fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let path = std::path::Path::new(&args[1]);
    let tok = if path.extension().is_some_and(|e| e == "gguf") {
        sapient_tokenizers::Tokenizer::from_gguf(&sapient_tensor::GgufFile::open(path)?)?
    } else {
        sapient_tokenizers::Tokenizer::from_file(path)?
    };
    let mut text = args[2].clone();
    if args.iter().any(|a| a == "--chat") {
        let t = tok.chat_template().ok_or_else(|| anyhow::anyhow!("no chat template"))?;
        text = t.render(&[sapient_tokenizers::Message::user(text)], &Default::default())?;
        println!("{text:?}");
    }
    let ids = tok.encode(&text, false)?;
    println!("{}", ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(","));
    Ok(())
}
