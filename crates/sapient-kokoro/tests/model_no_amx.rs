//! `tests/model.rs` with the kernels' bf16 paths off (`KernelOptions::amx` and
//! `avx512_bf16` false): the f32 path that CPUs with neither AMX-BF16 nor AVX512-BF16 take
//! (im2col convolutions on f32 GEMMs instead of the bf16 ones), against the same onnxruntime
//! reference and bounds.

/// Read by `model.rs`'s fixture.
const AMX: bool = false;

#[path = "model.rs"]
mod model;
