//! Deterministic mutation fuzzing of the GGUF reader (runs in CI; `fuzz/` has the
//! cargo-fuzz target for longer runs). Valid files are corrupted in many ways; the reader
//! must return an error or a file whose every tensor and key can be read, never panic.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use sapient_tensor::gguf::{GgufFile, GgufWriter, TensorData, Value};

#[path = "support/hostile.rs"]
mod support;

fn seeds() -> Vec<Vec<u8>> {
    let dev = Device::Cpu;
    let mut out = Vec::new();
    for (i, ty) in [GgmlDType::Q8_0, GgmlDType::Q4_1, GgmlDType::Q4K, GgmlDType::F16].into_iter().enumerate() {
        let mut w = GgufWriter::new();
        w.set("general.architecture", Value::String("llama".into()))
            .set("llama.block_count", Value::U32(1))
            .set("tokenizer.ggml.tokens", Value::string_array(["a", "bb", "<0x0A>"]))
            .set("f", Value::f32_array([1.0, 2.0]));
        let x = Tensor::arange(0f32, 256.0 * 2.0, &dev).unwrap().reshape((2, 256)).unwrap();
        let q = QTensor::quantize(&(x / 100.0).unwrap(), ty).unwrap();
        w.add_tensor(TensorData::from_qtensor(format!("t{i}"), &q).unwrap());
        w.add_tensor(TensorData {
            name: "norm".into(),
            shape: vec![4],
            ggml_type: sapient_tensor::GgmlType::F32,
            data: vec![0; 16],
        });
        out.push(w.to_bytes());
    }
    out
}

fn exercise(bytes: Vec<u8>) -> bool {
    let Ok(g) = GgufFile::from_bytes("fuzz.gguf", bytes) else { return false };
    for (k, v) in g.metadata_ordered() {
        let _ = (k, v.summary(), v.as_int(), v.as_f64());
    }
    let _ = g.architecture();
    let _ = g.get_str_array("tokenizer.ggml.tokens");
    for t in g.tensors().to_vec() {
        let _ = g.tensor_bytes(&t.name);
        if let Ok(q) = g.qtensor(&t.name, &Device::Cpu) {
            let _ = q.dequantize(&Device::Cpu);
        }
    }
    true
}

#[test]
fn mutated_files_never_panic() {
    // The mutations of the other formats' tests (support/hostile.rs); no time budget, so the
    // run is the same on every machine.
    let total = 20_000;
    let (ran, parsed) = support::mutation_run("gguf", &seeds(), total, std::time::Duration::MAX, |b| exercise(b.to_vec()));
    assert_eq!(ran, total);
    // Many mutations hit tensor data and still parse: those exercise the loaders.
    assert!(parsed > total / 20, "only {parsed} of {total} mutated files parsed");
}
