//! `tests/model.rs` with the kernels' AMX paths off (`KernelOptions::amx = false`): the f32
//! path that CPUs without AMX-BF16 take (im2col convolutions on f32 GEMMs instead of the bf16
//! ones), against the same onnxruntime reference and bounds.

/// Read by `model.rs`'s fixture.
const AMX: bool = false;

#[path = "model.rs"]
mod model;
