//! The server's request bodies: the first byte picks the endpoint (chat completions,
//! completions, embeddings, speech), the rest is its JSON body, parsed and checked as the
//! server does before it needs a model (`sapient_server::check_request`; JSON Schemas in
//! `response_format` and tools are compiled to grammars).
#![no_main]
use libfuzzer_sys::fuzz_target;
use sapient_server::{check_request, Endpoint, ServerOptions};

fuzz_target!(|data: &[u8]| {
    let Some((&which, body)) = data.split_first() else { return };
    let endpoint = match which % 4 {
        0 => Endpoint::ChatCompletions,
        1 => Endpoint::Completions,
        2 => Endpoint::Embeddings,
        _ => Endpoint::Speech,
    };
    let _ = check_request(endpoint, body, &ServerOptions::default(), 49152);
});
