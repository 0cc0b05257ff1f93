//! The constraint compiler: the first byte picks a regex (even) or a JSON Schema (odd) from
//! the rest of the input up to a NUL byte; what follows the NUL is fed to the compiled
//! grammar byte by byte.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sapient_sample::{Constraint, Grammar};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let (spec, input) = match rest.iter().position(|&b| b == 0) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    let Ok(spec) = std::str::from_utf8(spec) else { return };
    let g = if mode % 2 == 0 {
        Grammar::regex(spec)
    } else {
        let Ok(schema) = serde_json::from_str::<serde_json::Value>(spec) else { return };
        Grammar::json_schema(&schema)
    };
    if let Ok(g) = g {
        let mut st = g.start();
        let mut next = Default::default();
        for &b in input {
            match g.advance(&st, b, &mut next) {
                Ok(true) => std::mem::swap(&mut st, &mut next),
                _ => break,
            }
        }
        let _ = g.is_accepting(&st);
    }
});
