//! The ONNX reader: parse a model, read every initializer and tensor attribute as f32/i64.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sapient_tensor::onnx::{AttributeValue, OnnxModel};

fuzz_target!(|data: &[u8]| {
    let limits = sapient_tensor::Limits::default().max_alloc_bytes(64 << 20);
    let Ok(m) = OnnxModel::from_bytes_with("fuzz.onnx", data.to_vec(), &limits) else { return };
    let _ = m.opset("");
    for t in &m.graph.initializers {
        let _ = (t.to_f32(), t.to_i64(), t.shape(), t.raw());
    }
    for n in &m.graph.nodes {
        for a in &n.attributes {
            if let AttributeValue::Tensor(t) = &a.value {
                let _ = (t.to_f32(), t.to_i64());
            }
        }
    }
});
