//! End-to-end tests of SAPIENT across its crates, on the CI model set (fetched through the
//! hub on first use). The tests are the `[[test]]` targets beside this file:
//!
//! - `speech_roundtrip.rs`: text -> Kokoro-82M speech -> resampled to 16 kHz -> Whisper
//!   tiny.en text, word error rate bounded.
//! - `no_unwrap.rs`: library code takes no `unwrap()` / `expect(..)`.
//! - `module_cycles.rs`: the modules inside each crate depend one way.
//!
//! Run them with `cargo test --release -p sapient-e2e`; `cargo test --release --workspace`
//! runs them too. The command line is tested end to end in `crates/sapient-cli/tests`.

/// The top-level README's example, compiled as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctest;

/// sapient-llama's README example, compiled here (as a doc test of this crate) so that the
/// crate's own sources need no doctest hook.
#[cfg(doctest)]
#[doc = include_str!("../crates/sapient-llama/README.md")]
struct LlamaReadmeDoctest;

/// Every `.rs` file under `dir`, recursively (for the source checks: `no_unwrap.rs`,
/// `module_cycles.rs`).
pub fn rs_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}
