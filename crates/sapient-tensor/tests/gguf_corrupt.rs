//! The GGUF reader on synthetic files: round trips and every kind of corrupt input.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use sapient_tensor::gguf::{GgmlType, GgufFile, GgufWriter, TensorData, Value, ValueType};
use sapient_tensor::Error;

fn sample_writer() -> GgufWriter {
    let dev = Device::Cpu;
    let mut w = GgufWriter::new();
    w.set("general.architecture", Value::String("llama".into()))
        .set("llama.block_count", Value::U32(2))
        .set("llama.rope.freq_base", Value::F32(10000.0))
        .set("some.i64", Value::I64(-5))
        .set("some.bool", Value::Bool(true))
        .set("some.f64", Value::F64(0.25))
        .set("tokenizer.ggml.tokens", Value::string_array(["a", "b", "<0x0A>"]))
        .set("empty", Value::Array(ValueType::U8, vec![]))
        .set(
            "nested",
            Value::Array(ValueType::Array, vec![Value::i32_array([1, 2]), Value::i32_array([3])]),
        );
    let x = Tensor::arange(0f32, 64.0 * 32.0, &dev).unwrap().reshape((64, 32)).unwrap();
    let x = (x / 1000.0).unwrap();
    let q = QTensor::quantize(&x, GgmlDType::Q8_0).unwrap();
    w.add_tensor(TensorData::from_qtensor("blk.0.w", &q).unwrap());
    let head = (Tensor::arange(0f32, 96.0, &dev).unwrap().reshape((3, 32)).unwrap() / 1000.0).unwrap();
    let f = QTensor::quantize(&head, GgmlDType::F32).unwrap();
    w.add_tensor(TensorData::from_qtensor("norm", &f).unwrap());
    w
}

#[test]
fn round_trip_metadata_and_tensors() {
    let bytes = sample_writer().to_bytes();
    let g = GgufFile::from_bytes("mem.gguf", bytes).unwrap();
    assert_eq!(g.version(), 3);
    assert_eq!(g.architecture().unwrap(), "llama");
    assert_eq!(g.get_usize("llama.block_count").unwrap(), 2);
    assert_eq!(g.get_f64("llama.rope.freq_base").unwrap(), 10000.0);
    assert_eq!(g.get_int("some.i64").unwrap(), -5);
    assert_eq!(g.get("some.bool"), Some(&Value::Bool(true)));
    assert_eq!(g.get_str_array("tokenizer.ggml.tokens").unwrap(), vec!["a", "b", "<0x0A>"]);
    assert_eq!(g.get_array("empty").unwrap().len(), 0);
    assert_eq!(g.get_array("nested").unwrap().len(), 2);
    let order: Vec<&str> = g.metadata_ordered().map(|(k, _)| k).collect();
    assert_eq!(order[0], "general.architecture");
    assert_eq!(g.tensors().len(), 2);
    let t = g.tensor_info("blk.0.w").unwrap();
    assert_eq!(t.shape, vec![64, 32]);
    assert_eq!(t.ggml_type, GgmlType::Q8_0);
    let deq = g.tensor("blk.0.w", &Device::Cpu).unwrap();
    let x = Tensor::arange(0f32, 64.0 * 32.0, &Device::Cpu).unwrap().reshape((64, 32)).unwrap();
    let x = (x / 1000.0).unwrap();
    let err: f32 = (deq - &x).unwrap().abs().unwrap().max_all().unwrap().to_scalar().unwrap();
    assert!(err < 0.02, "Q8_0 round trip error {err}");
    let norm = g.tensor("norm", &Device::Cpu).unwrap();
    assert_eq!(norm.dims(), &[3, 32]);
    assert_eq!(norm.flatten_all().unwrap().to_vec1::<f32>().unwrap()[33], 33.0 / 1000.0);
    // Writing what we read gives the same bytes.
    let mut w2 = GgufWriter::new();
    for (k, v) in g.metadata_ordered() {
        w2.set(k, v.clone());
    }
    for t in g.tensors() {
        w2.add_tensor(TensorData {
            name: t.name.clone(),
            shape: t.shape.clone(),
            ggml_type: t.ggml_type,
            data: g.tensor_bytes(&t.name).unwrap().to_vec(),
        });
    }
    assert_eq!(w2.to_bytes(), sample_writer().to_bytes());
}

fn parse(bytes: Vec<u8>) -> Error {
    GgufFile::from_bytes("bad.gguf", bytes).expect_err("corrupt input must be rejected")
}

#[test]
fn wrong_magic() {
    let mut b = sample_writer().to_bytes();
    b[0] = b'X';
    let e = parse(b);
    assert!(matches!(e, Error::BadMagic { .. }), "{e}");
    assert!(e.to_string().contains("bad.gguf") && e.to_string().contains("not a GGUF"), "{e}");
    assert!(matches!(parse(vec![]), Error::BadMagic { .. }));
    assert!(matches!(parse(b"GG".to_vec()), Error::BadMagic { .. }));
}

#[test]
fn unsupported_version() {
    let mut b = sample_writer().to_bytes();
    b[4] = 7;
    assert!(matches!(parse(b), Error::UnsupportedVersion { version: 7, .. }));
}

#[test]
fn every_truncation_is_an_error_not_a_panic() {
    let b = sample_writer().to_bytes();
    // Cut at every length below the full size: each must fail cleanly.
    for len in 0..b.len() {
        let r = GgufFile::from_bytes("cut.gguf", b[..len].to_vec());
        let e = r.expect_err(&format!("truncated at {len} must fail"));
        let msg = e.to_string();
        assert!(msg.contains("cut.gguf"), "error must name the file: {msg}");
    }
    // The last tensor's data cut short names that tensor.
    let e = parse(b[..b.len() - 1].to_vec());
    match e {
        Error::TensorOutOfBounds { tensor, .. } => assert_eq!(tensor, "norm"),
        other => panic!("expected TensorOutOfBounds, got {other}"),
    }
}

#[test]
fn unknown_ggml_type_names_the_tensor() {
    let mut w = GgufWriter::new();
    w.set("general.architecture", Value::String("llama".into()));
    w.add_tensor(TensorData {
        name: "weird".into(),
        shape: vec![4],
        ggml_type: GgmlType::F32,
        data: vec![0; 16],
    });
    let mut b = w.to_bytes();
    // The type id sits right before the 8-byte offset at the end of the tensor info.
    let name_pos = b.windows(5).position(|w| w == b"weird").unwrap();
    let type_pos = name_pos + 5 + 4 + 8;
    b[type_pos..type_pos + 4].copy_from_slice(&99u32.to_le_bytes());
    match parse(b) {
        Error::UnknownGgmlType { tensor, id, .. } => {
            assert_eq!(tensor, "weird");
            assert_eq!(id, 99);
        }
        other => panic!("expected UnknownGgmlType, got {other}"),
    }
}

#[test]
fn unsupported_but_known_type_lists_then_fails_on_load() {
    let mut w = GgufWriter::new();
    w.add_tensor(TensorData {
        name: "iq".into(),
        shape: vec![256],
        ggml_type: GgmlType::IQ2_XXS,
        data: vec![0; 66],
    });
    let g = GgufFile::from_bytes("iq.gguf", w.to_bytes()).unwrap();
    assert_eq!(g.tensors()[0].ggml_type, GgmlType::IQ2_XXS);
    let e = g.qtensor("iq", &Device::Cpu).unwrap_err();
    assert!(matches!(e, Error::UnsupportedGgmlType { ty: "IQ2_XXS", .. }), "{e}");
}

#[test]
fn absurd_counts_do_not_allocate() {
    let mut b = Vec::new();
    b.extend_from_slice(b"GGUF");
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&u64::MAX.to_le_bytes()); // tensors
    b.extend_from_slice(&u64::MAX.to_le_bytes()); // kv
    assert!(matches!(parse(b), Error::Malformed { .. }));

    // A string length far beyond the file.
    let mut b = Vec::new();
    b.extend_from_slice(b"GGUF");
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(&1u64.to_le_bytes());
    b.extend_from_slice(&u64::MAX.to_le_bytes());
    b.extend_from_slice(&[0u8; 16]);
    assert!(matches!(parse(b), Error::Truncated { .. }));
}

#[test]
fn shape_mismatch_names_tensor_and_shapes() {
    let g = GgufFile::from_bytes("mem.gguf", sample_writer().to_bytes()).unwrap();
    let e = g.qtensor_checked("blk.0.w", &[32, 64], &Device::Cpu).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("blk.0.w") && msg.contains("[64, 32]") && msg.contains("[32, 64]"), "{msg}");
    let e = g.qtensor("nope", &Device::Cpu).unwrap_err();
    assert!(matches!(e, Error::MissingTensor { .. }));
    let e = g.get_str("llama.block_count").unwrap_err();
    assert!(e.to_string().contains("expected string"), "{e}");
    let e = g.get_usize("missing.key").unwrap_err();
    assert!(matches!(e, Error::MissingKey { .. }));
}

#[test]
fn misaligned_buffers_load() {
    // Tensor data at an offset that is not 8-aligned in memory is copied, not misread.
    let g = GgufFile::from_bytes("mem.gguf", sample_writer().to_bytes()).unwrap();
    let a = g.tensor("norm", &Device::Cpu).unwrap();
    assert_eq!(a.dims(), &[3, 32]);
}

/// What the `gguf` fuzz target does with an input: parse, then read every tensor. Must not panic.
fn read_everything(bytes: Vec<u8>) -> Result<(), Error> {
    let g = GgufFile::from_bytes("fuzz.gguf", bytes)?;
    for (_, v) in g.metadata_ordered() {
        let _ = v.summary();
    }
    for t in g.tensors().to_vec() {
        g.tensor_bytes(&t.name)?;
        if let Ok(q) = g.qtensor(&t.name, &Device::Cpu) {
            let _ = q.dequantize(&Device::Cpu);
        }
    }
    Ok(())
}

/// One tensor, no metadata: `ne` in ggml order, type id, then `data_len` zero bytes of data.
fn one_tensor(ne: &[u64], ty: u32, data_len: usize) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(b"GGUF");
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&1u64.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(&1u64.to_le_bytes());
    b.push(b't');
    b.extend_from_slice(&(ne.len() as u32).to_le_bytes());
    for d in ne {
        b.extend_from_slice(&d.to_le_bytes());
    }
    b.extend_from_slice(&ty.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    b.resize(b.len().div_ceil(32) * 32 + data_len, 0);
    b
}

/// Found by `cargo fuzz` (crash-2c1f8dce...): a zero dimension made the element count 0 and
/// passed our overflow check, while candle's product of the dimensions, taken in the other
/// order, overflowed (a panic with overflow checks on, a wrong count without).
#[test]
fn fuzz_zero_dim_with_huge_dims_is_rejected() {
    let crash: Vec<u8> = [
        "4747554603000000010000000000000000000000000000000400000000000000",
        "6700000004000000000000000000000000140000000000000067650000003000",
        "0080000000000000090000000000000000000000000167616c6e6800002d0000",
    ]
    .concat()
    .as_bytes()
    .chunks(2)
    .map(|h| u8::from_str_radix(std::str::from_utf8(h).unwrap(), 16).unwrap())
    .collect();
    assert_eq!(crash.len(), 96);
    let e = read_everything(crash).expect_err("absurd dimensions");
    assert!(e.to_string().contains("absurd dimensions"), "{e}");

    let e = read_everything(one_tensor(&[0, 1 << 62, 1 << 62], 0, 0)).expect_err("absurd dimensions");
    assert!(matches!(e, Error::Malformed { .. }) && e.to_string().contains("'t'"), "{e}");
    // An empty tensor with sane dimensions is fine.
    read_everything(one_tensor(&[32, 0], 8, 0)).unwrap();
    let g = GgufFile::from_bytes("empty.gguf", one_tensor(&[32, 0, 4], 8, 0)).unwrap();
    assert_eq!(g.tensors()[0].shape, vec![4, 0, 32]);
    assert_eq!(g.tensor_bytes("t").unwrap().len(), 0);
}
