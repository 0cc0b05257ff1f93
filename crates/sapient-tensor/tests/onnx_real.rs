//! The ONNX reader on the real Kokoro-82M int8 export (fetched through the hub on first use),
//! whole and truncated.

use anyhow::Result;
use sapient_tensor::onnx::{DataType, Dim, OnnxModel};
use sapient_tensor::Error;

fn path() -> Result<std::path::PathBuf> {
    let r = sapient_hub::Hub::new()?.fetch_preset("kokoro-82m", &mut |_| {})?;
    Ok(r.file("onnx")?.to_path_buf())
}

#[test]
fn kokoro_graph_lists() -> Result<()> {
    let m = OnnxModel::open(path()?)?;
    assert_eq!(m.ir_version, 9);
    assert_eq!(m.producer_name, "onnx.quantize");
    assert_eq!(m.opset(""), Some(20));
    assert_eq!(m.opset("com.microsoft"), Some(1));
    let g = &m.graph;
    assert_eq!(g.nodes.len(), 3614);
    assert_eq!(g.initializers.len(), 775);
    let count = |op: &str| g.nodes.iter().filter(|n| n.op_type == op).count();
    assert_eq!(
        (count("MatMulInteger"), count("ConvInteger"), count("DynamicQuantizeLSTM"), count("DequantizeLinear")),
        (148, 87, 6, 4)
    );
    let names: Vec<&str> = g.inputs.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["tokens", "style", "speed"]);
    assert_eq!(g.inputs[0].elem_type, Some(DataType::Int64));
    assert_eq!(g.inputs[1].shape.as_ref().map(|s| s.len()), Some(2));
    assert_eq!(g.inputs[1].shape.as_ref().unwrap()[1], Dim::Value(256));
    assert_eq!(g.outputs[0].name, "audio");

    // one initializer of each kind the importer reads
    let get = |n: &str| g.initializers.iter().find(|t| t.name == n).unwrap();
    let q = get("onnx::MatMul_6547_quantized");
    assert_eq!((q.dims.clone(), q.data_type), (vec![128, 768], DataType::Int8));
    assert_eq!(q.raw().unwrap().len(), 128 * 768);
    let s = get("onnx::MatMul_6547_scale");
    assert_eq!((s.dims.clone(), s.data_type), (vec![768], DataType::Float));
    assert!(s.to_f32()?.iter().all(|&v| v > 0.0 && v < 1.0));
    let c = get("/encoder/F0.0/Mul_output_0_quantized");
    assert_eq!((c.dims.clone(), c.data_type), (vec![512, 512, 3], DataType::Uint8));
    let lstm = g.nodes.iter().find(|n| n.op_type == "DynamicQuantizeLSTM").unwrap();
    assert_eq!(lstm.attr_string("direction").as_deref(), Some("bidirectional"));
    assert_eq!(lstm.attr_int("hidden_size"), Some(256));
    assert_eq!(lstm.inputs.len(), 12);
    let total: usize = g.initializers.iter().map(|t| t.elem_count()).sum();
    assert_eq!(total, 81_217_957);
    Ok(())
}

/// Cuts of the real file (every length in its first 4 KiB, then a few far into the graph):
/// each is an error that says the file is truncated, never a panic.
#[test]
fn kokoro_truncations_are_errors() -> Result<()> {
    let bytes = std::fs::read(path()?)?;
    let len = bytes.len();
    let mut cuts: Vec<usize> = (0..4096).collect();
    cuts.extend([len / 3, len / 2, len - 1_000_000, len - 1]);
    for cut in cuts {
        let e = OnnxModel::from_bytes("cut.onnx", bytes[..cut].to_vec()).expect_err(&format!("cut at {cut} parsed"));
        if cut > 24 {
            // past the graph field's key at byte 24: inside the graph
            match &e {
                Error::Truncated { len: l, .. } => assert_eq!(*l as usize, cut),
                other => panic!("cut at {cut}: {other}"),
            }
        } else {
            assert!(matches!(e, Error::Truncated { .. } | Error::Onnx { .. }), "cut at {cut}: {e}");
        }
    }
    // a cut inside the graph names the graph field
    let e = OnnxModel::from_bytes("cut.onnx", bytes[..len / 2].to_vec()).unwrap_err();
    assert!(e.to_string().contains("ModelProto.graph"), "{e}");
    Ok(())
}

/// Bytes flipped in the header give errors or a model, never a panic.
#[test]
fn kokoro_header_corruptions_do_not_panic() -> Result<()> {
    let bytes = std::fs::read(path()?)?;
    let head = 64 * 1024;
    let mut rng = 0x9e3779b97f4a7c15u64;
    for _ in 0..200 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let mut b = bytes[..head].to_vec();
        let at = (rng as usize) % head;
        b[at] ^= (rng >> 32) as u8 | 1;
        let _ = OnnxModel::from_bytes("flip.onnx", b);
    }
    Ok(())
}
