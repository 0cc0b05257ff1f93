//! Constrained generation and typed tasks on Qwen2.5-Coder-0.5B (its 151,936-logit head and
//! Qwen vocabulary); opt-in: SAPIENT_QWEN_TESTS=1 (the model is 0.5 GB).

use anyhow::Result;
use sapient_generate::{FinishReason, GenerationConfig, Grammar, Message, Pipeline, PipelineOptions, SamplerConfig, Task};

#[derive(Debug, sapient_sample::Schema, sapient_sample::Parse)]
struct Function {
    #[parse(pattern = "^[a-z_][a-z0-9_]{0,30}$")]
    name: String,
    #[parse(max_items = 4)]
    parameters: Vec<Parameter>,
    returns: Kind,
}

#[derive(Debug, sapient_sample::Schema, sapient_sample::Parse)]
struct Parameter {
    #[parse(pattern = "^[a-z_][a-z0-9_]{0,20}$")]
    name: String,
    kind: Kind,
}

#[derive(Debug, PartialEq, sapient_sample::Schema, sapient_sample::Parse)]
enum Kind {
    Int,
    Str,
    Bool,
    List,
}

#[test]
fn qwen_fills_a_typed_task_and_a_regex() -> Result<()> {
    if std::env::var("SAPIENT_QWEN_TESTS").ok().as_deref() != Some("1") {
        eprintln!("skipped: set SAPIENT_QWEN_TESTS=1 (fetches the 0.5 GB Qwen2.5-Coder-0.5B GGUF)");
        return Ok(());
    }
    let p = Pipeline::load("qwen2.5-coder-0.5b-instruct", PipelineOptions { max_seq_len: Some(1024), ..Default::default() }, |_| {})?;
    let task = Task::builder_for::<Function>("You describe Python function signatures as JSON.").build()?;
    let f = task.run_blocking("def repeat(text: str, times: int) -> str", &p)?;
    eprintln!("{f:?}");
    assert_eq!(f.name, "repeat");
    let params: Vec<(&str, &Kind)> = f.parameters.iter().map(|p| (p.name.as_str(), &p.kind)).collect();
    assert_eq!(params, [("text", &Kind::Str), ("times", &Kind::Int)]);
    assert_eq!(f.returns, Kind::Str);
    // Sampled too: every seed gives a value of the type.
    for seed in [1, 2] {
        let sampled = Task::builder_for::<Function>("You describe Python function signatures as JSON.")
            .config(GenerationConfig::default().max_tokens(400).sampling(SamplerConfig { temperature: 0.8, top_k: Some(40), seed: Some(seed), ..Default::default() }))
            .build()?
            .run_blocking("def is_even(n: int) -> bool", &p)?;
        eprintln!("{sampled:?}");
        assert!(sampled.parameters.len() <= 4 && sampled.parameters.iter().all(|p| !p.name.is_empty()));
    }
    let ip = Grammar::regex(r"((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])")?;
    let g = p.chat(&[Message::user("What is the IP address of the loopback interface?")], &GenerationConfig::default().max_tokens(20).constrain(ip))?;
    eprintln!("{}", g.text);
    assert_eq!(g.finish, FinishReason::Eos);
    let parts: Vec<u32> = g.text.split('.').map(|x| x.parse()).collect::<Result<_, _>>()?;
    assert!(parts.len() == 4 && parts.iter().all(|&x| x < 256), "{:?}", g.text);
    Ok(())
}
