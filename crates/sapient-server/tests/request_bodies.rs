//! Request bodies checked without a model (`check_request`, what each endpoint does before it
//! needs one): hostile bodies give the 4xx the server would answer, naming the field, and a
//! CI-sized mutation run over well-formed bodies of every endpoint never panics (the fuzz
//! target `server_request` runs the same function for longer).

#[path = "../../sapient-tensor/tests/support/hostile.rs"]
mod support;

use sapient_server::{check_request, Endpoint, ServerOptions};
use serde_json::json;
use std::time::{Duration, Instant};

const VOCAB: usize = 49152;

fn check(e: Endpoint, body: &str) -> Result<(), sapient_server::ApiError> {
    check_request(e, body.as_bytes(), &ServerOptions::default(), VOCAB)
}

/// Well-formed bodies of each endpoint (also the mutation seeds).
fn good() -> Vec<(Endpoint, String)> {
    let schema = json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}}, "required": ["name", "age"]});
    let tool = json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}});
    vec![
        (Endpoint::ChatCompletions, json!({"model": "m", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], "temperature": 0.7, "top_p": 0.9, "max_tokens": 16, "stop": ["\n\n"], "logit_bias": {"42": -100}, "seed": 7, "stream": true, "stream_options": {"include_usage": true}}).to_string()),
        (Endpoint::ChatCompletions, json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "A person"}]}], "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}}).to_string()),
        (Endpoint::ChatCompletions, json!({"messages": [{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]}, {"role": "tool", "tool_call_id": "c1", "content": "18 C"}], "tools": [tool], "tool_choice": "auto"}).to_string()),
        (Endpoint::ChatCompletions, json!({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}, "n": 2}).to_string()),
        (Endpoint::Completions, json!({"model": "m", "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}).to_string()),
        (Endpoint::Completions, json!({"prompt": [[1, 2, 3], [4, 5]], "n": 2, "stop": "."}).to_string()),
        (Endpoint::ChatCompletions, json!({"messages": [{"role": "user", "content": "Yes or no?"}], "grammar": "root ::= (\"yes\" | \"no\") \".\"?"}).to_string()),
        (Endpoint::Completions, json!({"prompt": "2+2=", "grammar": "root ::= [0-9]+ # digits\n"}).to_string()),
        (Endpoint::Embeddings, json!({"model": "all-minilm-l6-v2", "input": ["The weather is lovely today.", "It's so sunny outside!"], "encoding_format": "base64"}).to_string()),
        (Endpoint::Embeddings, json!({"input": [[101, 2023, 102]]}).to_string()),
        (Endpoint::Speech, json!({"model": "tts-1", "input": "Hello there.", "voice": "af_heart", "speed": 1.2, "response_format": "pcm"}).to_string()),
        (Endpoint::Speech, json!({"input": "Hi.", "voice": {"id": "alloy"}}).to_string()),
    ]
}

#[test]
fn well_formed_bodies_pass() {
    for (e, b) in good() {
        assert!(check(e, &b).is_ok(), "{e:?} {b}: {:?}", check(e, &b).err());
    }
}

#[test]
fn bad_bodies_are_4xx_naming_the_field() {
    // Nesting where any JSON value is taken (a message's content).
    let deep = format!("{{\"messages\": [{{\"role\": \"user\", \"content\": {}{}}}]}}", "[".repeat(100_000), "]".repeat(100_000));
    let deep_schema = {
        let mut s = json!({"type": "string"});
        for _ in 0..200 {
            s = json!({"type": "array", "items": s});
        }
        json!({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", "json_schema": {"schema": s}}}).to_string()
    };
    let many_prompts = json!({"prompt": vec!["a"; 40], "n": 1}).to_string();
    let cases: Vec<(Endpoint, String, u16, Option<&str>)> = vec![
        (Endpoint::ChatCompletions, "{\"messages\": [".into(), 400, None),
        (Endpoint::ChatCompletions, "\u{0}\u{ff}garbage".into(), 400, None),
        (Endpoint::ChatCompletions, deep, 400, None),
        (Endpoint::ChatCompletions, json!({"messages": "hi"}).to_string(), 400, Some("messages")),
        (Endpoint::ChatCompletions, json!({"messages": []}).to_string(), 400, Some("messages")),
        (Endpoint::ChatCompletions, json!({"messages": [{"role": "wizard", "content": "x"}]}).to_string(), 400, Some("messages[0].role")),
        (Endpoint::ChatCompletions, json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}).to_string(), 400, Some("messages[0].content")),
        (Endpoint::ChatCompletions, json!({"messages": [{"role": "user", "content": "x"}], "temperature": 3}).to_string(), 400, Some("temperature")),
        (Endpoint::ChatCompletions, json!({"messages": [{"role": "user", "content": "x"}], "top_p": 0}).to_string(), 400, Some("top_p")),
        (Endpoint::ChatCompletions, json!({"messages": [{"role": "user", "content": "x"}], "n": 1000}).to_string(), 400, Some("n")),
        (Endpoint::ChatCompletions, json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}).to_string(), 400, Some("max_tokens")),
        (Endpoint::ChatCompletions, json!({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"49152": 1}}).to_string(), 400, Some("logit_bias")),
        (Endpoint::ChatCompletions, json!({"messages": [{"role": "user", "content": "x"}], "stop": vec!["a"; 17]}).to_string(), 400, Some("stop")),
        (Endpoint::ChatCompletions, json!({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21}).to_string(), 400, Some("top_logprobs")),
        (Endpoint::ChatCompletions, json!({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}).to_string(), 400, Some("top_logprobs")),
        (Endpoint::ChatCompletions, json!({"messages": [{"role": "user", "content": "x"}], "logprobs": 3}).to_string(), 400, Some("logprobs")),
        (Endpoint::Completions, json!({"prompt": "x", "logprobs": true}).to_string(), 400, Some("logprobs")),
        (Endpoint::Completions, json!({"prompt": "x", "logprobs": -1}).to_string(), 400, Some("logprobs")),
        (Endpoint::ChatCompletions, json!({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}}).to_string(), 400, Some("response_format")),
        // Nested deeper than serde_json's limit (128): invalid JSON before it is a schema.
        (Endpoint::ChatCompletions, deep_schema, 400, None),
        (Endpoint::ChatCompletions, json!({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "string", "minLength": 1_000_000_000u64}}}}).to_string(), 400, Some("response_format.json_schema.schema")),
        (Endpoint::ChatCompletions, json!({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "array", "contains": {}}}}}).to_string(), 400, Some("response_format.json_schema.schema")),
        (Endpoint::ChatCompletions, json!({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": ""}}]}).to_string(), 400, Some("tools[0]")),
        (Endpoint::ChatCompletions, json!({"messages": [{"role": "user", "content": "x"}], "grammar": "root ::= (\"a\""}).to_string(), 400, Some("grammar")),
        (Endpoint::ChatCompletions, json!({"messages": [{"role": "user", "content": "x"}], "grammar": "root ::= root \"a\" | \"b\""}).to_string(), 400, Some("grammar")),
        (Endpoint::ChatCompletions, json!({"messages": [{"role": "user", "content": "x"}], "grammar": "root ::= \"a\"", "response_format": {"type": "json_object"}}).to_string(), 400, Some("grammar")),
        (Endpoint::ChatCompletions, json!({"messages": [{"role": "user", "content": "x"}], "grammar": "root ::= \"a\"", "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}).to_string(), 400, Some("grammar")),
        (Endpoint::Completions, json!({"prompt": "x", "grammar": "root ::= undefined-rule"}).to_string(), 400, Some("grammar")),
        (Endpoint::Completions, json!({"prompt": [49152]}).to_string(), 400, Some("prompt")),
        (Endpoint::Completions, json!({"prompt": {}}).to_string(), 400, Some("prompt")),
        (Endpoint::Completions, many_prompts, 400, Some("prompt")),
        (Endpoint::Completions, json!({"prompt": "x", "echo": true}).to_string(), 400, Some("echo")),
        (Endpoint::Embeddings, json!({"input": []}).to_string(), 400, Some("input")),
        (Endpoint::Embeddings, json!({"input": [1, "a"]}).to_string(), 400, Some("input")),
        (Endpoint::Embeddings, json!({"input": "x", "encoding_format": "hex"}).to_string(), 400, Some("encoding_format")),
        (Endpoint::Speech, json!({"input": " "}).to_string(), 400, Some("input")),
        (Endpoint::Speech, json!({"input": "x".repeat(9000)}).to_string(), 400, Some("input")),
        (Endpoint::Speech, json!({"input": "x", "speed": 10}).to_string(), 400, Some("speed")),
        (Endpoint::Speech, json!({"input": "x", "voice": 3}).to_string(), 400, Some("voice")),
        (Endpoint::Speech, json!({"input": "x", "response_format": "mp3"}).to_string(), 400, Some("response_format")),
        (Endpoint::Speech, json!({"input": 5}).to_string(), 400, Some("input")),
    ];
    for (e, body, status, param) in cases {
        let t = Instant::now();
        let Err(err) = check(e, &body) else { panic!("{e:?} {body:.200} is accepted") };
        assert!(t.elapsed() < Duration::from_secs(1), "{e:?} {body:.200}: {:?}", t.elapsed());
        assert_eq!(err.status.as_u16(), status, "{e:?} {body:.200}: {err}");
        assert_eq!(err.param.as_deref(), param, "{e:?} {body:.200}: {err}");
    }
    let big = vec![b' '; (2 << 20) + 1];
    let err = check_request(Endpoint::ChatCompletions, &big, &ServerOptions::default(), VOCAB).expect_err("over the body limit");
    assert_eq!(err.status.as_u16(), 413);
}

#[test]
fn mutated_request_bodies_never_panic() {
    let good = good();
    for (i, (e, _)) in good.iter().enumerate() {
        // Each endpoint sees its own seeds (and those of the others, which mostly fail).
        let seeds: Vec<Vec<u8>> = good.iter().map(|(_, b)| b.clone().into_bytes()).collect();
        if good[..i].iter().any(|(p, _)| p == e) {
            continue;
        }
        let (ran, ok) = support::mutation_run(&format!("server-{e:?}"), &seeds, 100_000, Duration::from_secs(2), |d| check_request(*e, d, &ServerOptions::default(), VOCAB).is_ok());
        assert!(ran >= 500 && ok >= 10, "{e:?}: {ok} of {ran} accepted");
    }
}
