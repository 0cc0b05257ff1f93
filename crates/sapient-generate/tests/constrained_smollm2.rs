//! Constrained generation on the real SmolLM2-135M-Instruct: whatever the model would have
//! said, the output matches the regex / JSON schema / choice, and ends when it is complete.
//! Outputs are checked with serde_json and plain string checks, not with our own grammar.

use anyhow::Result;
use sapient_generate::{Expr, FinishReason, GenerationConfig, Grammar, Message, Pipeline, PipelineOptions, SamplerConfig};
use std::sync::OnceLock;

fn pipeline() -> &'static Pipeline {
    static P: OnceLock<Pipeline> = OnceLock::new();
    P.get_or_init(|| {
        Pipeline::load("smollm2-135m-instruct", PipelineOptions { max_seq_len: Some(1024), ..Default::default() }, |_| {})
            .expect("SmolLM2 loads")
    })
}

fn ask(q: &str) -> Vec<Message> {
    vec![Message::system("You are a helpful assistant."), Message::user(q)]
}

/// Two capitalised ASCII words of 2..=11 letters separated by one space.
fn is_name(s: &str) -> bool {
    let parts: Vec<&str> = s.split(' ').collect();
    parts.len() == 2
        && parts.iter().all(|w| {
            let mut c = w.chars();
            (2..=11).contains(&w.len())
                && c.next().is_some_and(|f| f.is_ascii_uppercase())
                && c.all(|x| x.is_ascii_lowercase())
        })
}

#[test]
fn character_json_schema_greedy_and_sampled() -> Result<()> {
    // kalosm's Character example: a patterned name, a ranged age and a description.
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "pattern": "^[A-Z][a-z]{1,10} [A-Z][a-z]{1,10}$"},
            "age": {"type": "integer", "minimum": 1, "maximum": 100},
            "description": {"type": "string", "maxLength": 80}
        },
        "required": ["name", "age", "description"],
        "additionalProperties": false
    });
    let grammar = Grammar::json_schema(&schema)?;
    let p = pipeline();
    let q = ask("Describe a fictional character as JSON with a name, an age and a description.");
    let mut configs = vec![GenerationConfig::default()];
    for seed in [1, 2, 3] {
        configs.push(GenerationConfig::default().sampling(SamplerConfig { temperature: 0.9, top_p: Some(0.95), seed: Some(seed), ..Default::default() }));
    }
    for cfg in configs {
        // Enough tokens for the longest text the grammar allows (one byte per token), so every
        // run must end with the grammar complete whatever the model writes.
        let cfg = cfg.max_tokens(700).constrain(grammar.clone());
        let g = p.chat(&q, &cfg)?;
        eprintln!("{} tokens, {:.1} tok/s: {}", g.tokens.len(), g.stats.decode_tokens_per_s(), g.text);
        assert_eq!(g.finish, FinishReason::Eos, "the grammar completes: {:?}", g.text);
        let v: serde_json::Value = serde_json::from_str(&g.text).map_err(|e| anyhow::anyhow!("{e}: {:?}", g.text))?;
        let o = v.as_object().expect("an object");
        assert_eq!(o.len(), 3, "{v}");
        let name = o["name"].as_str().expect("name is a string");
        assert!(is_name(name), "name {name:?}");
        let age = o["age"].as_i64().expect("age is an integer");
        assert!((1..=100).contains(&age), "age {age}");
        let d = o["description"].as_str().expect("description is a string");
        assert!(d.chars().count() <= 80, "description {d:?}");
    }
    Ok(())
}

#[test]
fn regex_and_choice() -> Result<()> {
    let p = pipeline();
    let date = Grammar::regex(r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])")?;
    let g = p.chat(&ask("When did the Apollo 11 mission land on the Moon? Give the date."), &GenerationConfig::default().max_tokens(20).constrain(date))?;
    eprintln!("date: {}", g.text);
    assert_eq!(g.finish, FinishReason::Eos, "{:?}", g.text);
    let parts: Vec<&str> = g.text.split('-').collect();
    assert_eq!(parts.len(), 3, "{:?}", g.text);
    let (y, m, d): (u32, u32, u32) = (parts[0].parse()?, parts[1].parse()?, parts[2].parse()?);
    assert!(parts[0].len() == 4 && parts[1].len() == 2 && parts[2].len() == 2, "{:?}", g.text);
    assert!((1900..2100).contains(&y) && (1..=12).contains(&m) && (1..=31).contains(&d), "{:?}", g.text);

    let yes_no = Grammar::new(&Expr::one_of(["yes", "no"]))?;
    for seed in [5, 6] {
        let cfg = GenerationConfig::default()
            .max_tokens(8)
            .sampling(SamplerConfig { temperature: 1.0, seed: Some(seed), ..Default::default() })
            .constrain(yes_no.clone());
        let g = p.chat(&ask("Is Paris the capital of France? Answer yes or no."), &cfg)?;
        assert!(g.text == "yes" || g.text == "no", "{:?}", g.text);
        assert_eq!(g.finish, FinishReason::Eos);
    }
    Ok(())
}

#[test]
fn free_json_and_unsupported_speculative() -> Result<()> {
    let p = pipeline();
    let cfg = GenerationConfig::default().max_tokens(120).constrain(Grammar::json()?);
    let g = p.chat(&ask("Give a JSON array of three fruits with their colours."), &cfg)?;
    eprintln!("{:?}: {}", g.finish, g.text);
    if g.finish == FinishReason::Eos {
        serde_json::from_str::<serde_json::Value>(&g.text).map_err(|e| anyhow::anyhow!("{e}: {:?}", g.text))?;
    } else {
        // Cut by max_tokens: still a valid JSON prefix, so it must not be rejected as garbage.
        assert_eq!(g.finish, FinishReason::MaxTokens);
        assert!(g.text.starts_with(['{', '[', '"']) || g.text.starts_with(|c: char| c.is_ascii_digit() || c == '-' || c == 't' || c == 'f' || c == 'n'), "{:?}", g.text);
    }
    let r = p.chat_speculative(
        &ask("hi"),
        &cfg,
        &sapient_generate::Drafter::PromptLookup { max_ngram: 3 },
        &Default::default(),
        |_| std::ops::ControlFlow::Continue(()),
    );
    assert!(matches!(r, Err(sapient_generate::Error::Unsupported(_))));
    Ok(())
}

#[test]
fn fast_forward_feeds_forced_text_and_skips_forwards() -> Result<()> {
    // Compact JSON: keys and punctuation are forced text, split by the tokenizer and fed
    // without sampling. That split need not be the tokens the model would have sampled, so
    // the text may differ from a run without fast-forward; both must be valid.
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 20},
            "country": {"enum": ["France", "Germany", "Japan"]},
            "population_millions": {"type": "number", "minimum": 0, "maximum": 50}
        },
        "required": ["city", "country", "population_millions"],
        "additionalProperties": false
    });
    let grammar = Grammar::with_options(&Expr::JsonSchema(schema), sapient_generate::JsonOptions::compact())?;
    let p = pipeline();
    let q = ask("Give the capital of France as JSON.");
    let on = GenerationConfig::default().max_tokens(60).constrain(grammar.clone());
    let off = GenerationConfig { fast_forward: false, ..on.clone() };
    let a = p.chat(&q, &on)?;
    let b = p.chat(&q, &off)?;
    eprintln!("{} tokens, {} forced: {}", a.tokens.len(), a.stats.forced_tokens, a.text);
    assert_eq!(b.stats.forced_tokens, 0);
    // The three keys with their quotes and colons are forced text (at least one token each).
    assert!(a.stats.forced_tokens >= 3, "forced tokens: {}", a.stats.forced_tokens);
    for g in [&a, &b] {
        let v: serde_json::Value = serde_json::from_str(&g.text)?;
        assert!(["France", "Germany", "Japan"].contains(&v["country"].as_str().unwrap_or("")), "{v}");
        assert!(v["population_millions"].as_f64().is_some_and(|x| (0.0..=50.0).contains(&x)), "{v}");
        assert_eq!(g.finish, FinishReason::Eos);
    }
    Ok(())
}

/// kalosm's blog example end to end: a derived type, its grammar, the model, the typed value.
#[derive(Debug, sapient_sample::Schema, sapient_sample::Parse)]
struct Character {
    #[parse(pattern = r"^[A-Z][a-z]{1,10} [A-Z][a-z]{1,10}$")]
    name: String,
    #[parse(range = 1..=100)]
    age: u8,
    #[parse(max_len = 80)]
    description: String,
}

#[test]
fn derived_character_end_to_end() -> Result<()> {
    use sapient_sample::Parse;
    let g = Character::grammar()?;
    let cfg = GenerationConfig { constraint: Some(g), ..GenerationConfig::default().max_tokens(150) };
    let out = pipeline().chat(&ask("Create a fantasy character as JSON."), &cfg)?;
    eprintln!("{}", out.text);
    assert_eq!(out.finish, FinishReason::Eos);
    let c = Character::parse(&out.text)?;
    assert!(is_name(&c.name) && (1..=100).contains(&c.age) && c.description.chars().count() <= 80, "{c:?}");
    Ok(())
}

#[test]
fn typed_task_streams_then_parses() -> Result<()> {
    use sapient_generate::Task;
    let task = Task::builder_for::<Character>("You are a helpful assistant. You describe characters as JSON.").build()?;
    let mut stream = task.run("A wise old wizard.", pipeline());
    let mut printed = String::new();
    while let Some(chunk) = stream.blocking_next() {
        printed.push_str(&chunk);
    }
    let c = stream.result_blocking()?;
    eprintln!("{printed}");
    assert!(printed.contains(&c.name), "the streamed text is the parsed value's source: {printed:?}");
    assert!(is_name(&c.name) && (1..=100).contains(&c.age) && c.description.chars().count() <= 80, "{c:?}");
    // The async way gives the same value (greedy), and run_blocking too.
    let again = futures::executor::block_on(task.run("A wise old wizard.", pipeline()).result())?;
    assert_eq!((again.name, again.age), (c.name.clone(), c.age));
    let blocking = task.run_blocking("A wise old wizard.", pipeline())?;
    assert_eq!(blocking.description, c.description);
    Ok(())
}

#[test]
fn typed_task_with_constraints_uses_the_given_grammar() -> Result<()> {
    use sapient_generate::Task;
    // Tighter than Character's own schema: an age in the nineties and a description of at
    // most 12 characters, which the model would not write unprompted.
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "pattern": "^[A-Z][a-z]{1,10} [A-Z][a-z]{1,10}$"},
            "age": {"type": "integer", "minimum": 90, "maximum": 99},
            "description": {"type": "string", "maxLength": 12}
        },
        "required": ["name", "age", "description"]
    });
    let task = Task::builder_for::<Character>("You are a helpful assistant. You describe characters as JSON.")
        .with_constraints(Grammar::json_schema(&schema)?)
        .build()?;
    let c = task.run_blocking("A young knight.", pipeline())?;
    eprintln!("{c:?}");
    assert!(is_name(&c.name) && (90..=99).contains(&c.age) && c.description.chars().count() <= 12, "{c:?}");
    // Without it, the type's own grammar: the same prompt gives a longer description.
    let own = Task::builder_for::<Character>("You are a helpful assistant. You describe characters as JSON.").build()?;
    let d = own.run_blocking("A young knight.", pipeline())?;
    eprintln!("{d:?}");
    assert!(d.description.chars().count() > 12 || !(90..=99).contains(&d.age), "the tighter grammar made a difference: {d:?}");
    Ok(())
}
