//! `python3 fuzz/seeds.py` (seed corpus: one small GGUF per ggml type, every metadata type), then
//! `RUSTC_BOOTSTRAP=1 cargo fuzz run gguf -s none -- -max_total_time=300 -max_len=8192`
//! (stable toolchain; `-s none` skips sanitizers, which need nightly; overflow checks stay on).
//! Any panic is a bug: add the input as a case in crates/sapient-tensor/tests/gguf_corrupt.rs.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(g) = sapient_tensor::GgufFile::from_bytes("fuzz.gguf", data.to_vec()) {
        for (_, v) in g.metadata_ordered() {
            let _ = v.summary();
        }
        for t in g.tensors().to_vec() {
            let _ = g.tensor_bytes(&t.name);
            if let Ok(q) = g.qtensor(&t.name, &candle_core::Device::Cpu) {
                let _ = q.dequantize(&candle_core::Device::Cpu);
            }
        }
    }
});
