//! Deterministic mutation fuzzing of the GGUF reader (runs in CI; `fuzz/` has the
//! cargo-fuzz target for longer runs). Valid files are corrupted in many ways; the reader
//! must return an error or a file whose every tensor and key can be read, never panic.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use sapient_tensor::gguf::{GgufFile, GgufWriter, TensorData, Value};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

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
    let seeds = seeds();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut parsed = 0;
    let total = 20_000;
    for iter in 0..total {
        let mut b = seeds[iter % seeds.len()].clone();
        let n_mut = 1 + rng.below(4);
        for _ in 0..n_mut {
            if b.len() < 16 {
                break;
            }
            match rng.below(6) {
                0 => {
                    let i = rng.below(b.len());
                    b[i] = rng.next() as u8;
                }
                1 => {
                    // Overwrite 8 bytes with an extreme value (counts, lengths, offsets, dims).
                    let i = rng.below(b.len().saturating_sub(8));
                    let v = [u64::MAX, 1 << 62, 1 << 32, 0, 255, 7][rng.below(6)];
                    b[i..i + 8].copy_from_slice(&v.to_le_bytes());
                }
                2 => b.truncate(rng.below(b.len())),
                3 => {
                    let i = rng.below(b.len());
                    let extra: Vec<u8> = (0..rng.below(16)).map(|_| rng.next() as u8).collect();
                    b.splice(i..i, extra);
                }
                4 => {
                    let i = rng.below(b.len());
                    let len = rng.below(32).min(b.len() - i);
                    b.drain(i..i + len);
                }
                _ => {
                    // Overwrite 4 bytes (type ids, dims counts, versions).
                    let i = rng.below(b.len().saturating_sub(4));
                    let v = rng.below(64) as u32;
                    b[i..i + 4].copy_from_slice(&v.to_le_bytes());
                }
            }
        }
        let r = std::panic::catch_unwind(|| exercise(b.clone()));
        if let Ok(true) = r {
            parsed += 1;
        }
        if r.is_err() {
            let path = std::env::temp_dir().join(format!("gguf-fuzz-crash-{iter}.gguf"));
            let _ = std::fs::write(&path, &b);
            panic!("iteration {iter} panicked; input saved to {}", path.display());
        }
    }
    // Many mutations hit tensor data and still parse: those exercise the loaders.
    assert!(parsed > total / 20, "only {parsed} of {total} mutated files parsed");
    eprintln!("{parsed} of {total} mutated files parsed and were read whole");
}
