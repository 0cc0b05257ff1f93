//! The ONNX reader on hand-made protobuf bytes (every field kind, packed and unpacked repeated
//! fields, unknown fields skipped) and on bad input: truncations at every byte of a small
//! model, bad wire types, overlong varints, lengths past their enclosing message, tensor data
//! that does not match its dims, deep subgraph nesting.

use sapient_tensor::onnx::{AttributeValue, DataType, Dim, OnnxModel, TensorData};
use sapient_tensor::Error;

#[path = "support/protobuf.rs"]
mod protobuf;
use protobuf::{varint, Pb};

fn tensor_raw(name: &str, dims: &[i64], dt: i64, raw: &[u8]) -> Pb {
    let mut t = Pb::default();
    for &d in dims {
        t = t.int(1, d);
    }
    t.int(2, dt).str(8, name).bytes(9, raw)
}

fn value_info(name: &str, elem: i64, dims: &[Result<i64, &str>]) -> Pb {
    let mut shape = Pb::default();
    for d in dims {
        let dim = match d {
            Ok(v) => Pb::default().int(1, *v),
            Err(p) => Pb::default().str(2, p),
        };
        shape = shape.msg(1, &dim);
    }
    let tt = Pb::default().int(1, elem).msg(2, &shape);
    let tp = Pb::default().msg(1, &tt);
    Pb::default().str(1, name).msg(2, &tp)
}

/// A small model with one of each thing the importer relies on.
fn sample_model() -> Vec<u8> {
    let w: Vec<u8> = [1i8, -2, 3, -4, 5, -6].iter().map(|&v| v as u8).collect();
    let mut fl = Vec::new();
    for v in [0.5f32, 0.25] {
        fl.extend_from_slice(&v.to_le_bytes());
    }
    let init_w = tensor_raw("W_quantized", &[2, 3], 3, &w);
    // typed fields: packed float_data, unpacked int64_data, int32_data holding uint8
    let init_s = Pb::default().bytes(1, &[2]).int(2, 1).str(8, "W_scale").bytes(4, &fl);
    let init_i64 = Pb::default().int(1, 3).int(2, 7).str(8, "shape").int(7, -1).int(7, 0).int(7, 5);
    let init_zp = Pb::default().int(2, 2).str(8, "W_zero_point").int(5, 128);
    // float16 via int32_data bits, and a double via raw_data
    let init_h = Pb::default().int(1, 2).int(2, 10).str(8, "h").int(5, 0x3c00).int(5, 0xc000);
    let init_d = tensor_raw("d", &[1], 11, &1.5f64.to_le_bytes());

    let const_t = tensor_raw("", &[2], 1, &[0, 0, 128, 63, 0, 0, 0, 64]);
    let node_const = Pb::default()
        .str(2, "/dec/Constant_output_0")
        .str(3, "/dec/Constant")
        .str(4, "Constant")
        .msg(5, &Pb::default().str(1, "value").int(20, 4).msg(5, &const_t));
    let node_mm = Pb::default()
        .str(1, "x_q")
        .str(1, "W_quantized")
        .str(1, "")
        .str(1, "W_zero_point")
        .str(2, "y")
        .str(3, "/enc/fc/MatMul_quant")
        .str(4, "MatMulInteger")
        .msg(5, &Pb::default().str(1, "alpha").int(20, 1).f32(2, 0.2))
        .msg(5, &Pb::default().str(1, "axis").int(20, 2).int(3, -1))
        .msg(5, &Pb::default().str(1, "mode").int(20, 3).str(4, "linear"))
        .msg(5, &Pb::default().str(1, "pads").int(20, 7).bytes(8, &[1, 2, 3, 4]))
        .msg(5, &Pb::default().str(1, "scales").int(20, 6).bytes(7, &[0, 0, 128, 63, 0, 0, 0, 64]))
        .msg(5, &Pb::default().str(1, "names").int(20, 8).str(9, "a").str(9, "b"))
        // no `type` field (old exporters): inferred from the value field
        .msg(5, &Pb::default().str(1, "untyped").int(3, 7))
        .msg(5, &Pb::default().str(1, "empty_ints").int(20, 7))
        .str(7, "com.example")
        // an unknown field of each wire type is skipped
        .int(99, 5)
        .fixed64(98, 7)
        .f32(97, 1.0)
        .str(96, "ignored");
    let sub = Pb::default().str(2, "body").msg(1, &Pb::default().str(4, "Identity").str(1, "a").str(2, "b"));
    let node_if = Pb::default()
        .str(1, "cond")
        .str(2, "z")
        .str(4, "If")
        .msg(5, &Pb::default().str(1, "then_branch").int(20, 5).msg(6, &sub))
        .msg(5, &Pb::default().str(1, "else_branch").int(20, 5).msg(6, &sub));
    let graph = Pb::default()
        .msg(1, &node_const)
        .msg(1, &node_mm)
        .msg(1, &node_if)
        .str(2, "main")
        .msg(5, &init_w)
        .msg(5, &init_s)
        .msg(5, &init_i64)
        .msg(5, &init_zp)
        .msg(5, &init_h)
        .msg(5, &init_d)
        .msg(11, &value_info("tokens", 7, &[Ok(1), Err("T")]))
        .msg(12, &value_info("audio", 1, &[Err("N")]));
    Pb::default()
        .int(1, 9)
        .str(2, "pytorch")
        .str(3, "2.5")
        .msg(8, &Pb::default().int(2, 20))
        .msg(8, &Pb::default().str(1, "com.microsoft").int(2, 1))
        .msg(14, &Pb::default().str(1, "k").str(2, "v"))
        // the graph last, so that every truncation cuts into it or before it
        .msg(7, &graph)
        .0
}

#[test]
fn parses_every_field_kind() {
    let m = OnnxModel::from_bytes("mem.onnx", sample_model()).unwrap();
    assert_eq!(m.ir_version, 9);
    assert_eq!(m.producer_name, "pytorch");
    assert_eq!(m.producer_version, "2.5");
    assert_eq!(m.opset(""), Some(20));
    assert_eq!(m.opset("ai.onnx"), Some(20));
    assert_eq!(m.opset("com.microsoft"), Some(1));
    assert_eq!(m.metadata, vec![("k".to_string(), "v".to_string())]);
    let g = &m.graph;
    assert_eq!(g.name, "main");
    assert_eq!(g.nodes.len(), 3);
    assert_eq!(g.initializers.len(), 6);

    let w = &g.initializers[0];
    assert_eq!((w.name.as_str(), w.dims.clone(), w.data_type), ("W_quantized", vec![2, 3], DataType::Int8));
    assert_eq!(w.raw().unwrap().len(), 6);
    assert_eq!(w.to_f32().unwrap(), vec![1., -2., 3., -4., 5., -6.]);
    assert_eq!(w.to_i64().unwrap(), vec![1, -2, 3, -4, 5, -6]);
    assert_eq!(g.initializers[1].to_f32().unwrap(), vec![0.5, 0.25]);
    assert!(matches!(g.initializers[1].data, TensorData::Float(_)));
    assert_eq!(g.initializers[2].to_i64().unwrap(), vec![-1, 0, 5]);
    let zp = &g.initializers[3];
    assert_eq!((zp.dims.len(), zp.elem_count(), zp.data_type), (0, 1, DataType::Uint8));
    assert_eq!(zp.to_i64().unwrap(), vec![128]);
    assert_eq!(g.initializers[4].to_f32().unwrap(), vec![1.0, -2.0]);
    assert_eq!(g.initializers[5].to_f32().unwrap(), vec![1.5]);
    // a float tensor is not an integer one
    assert!(g.initializers[1].to_i64().is_err());

    let c = &g.nodes[0];
    assert_eq!(c.op_type, "Constant");
    assert_eq!(c.outputs, vec!["/dec/Constant_output_0"]);
    assert_eq!(c.attr_tensor("value").unwrap().to_f32().unwrap(), vec![1.0, 2.0]);

    let n = &g.nodes[1];
    assert_eq!(n.op_type, "MatMulInteger");
    assert_eq!(n.domain, "com.example");
    assert_eq!(n.inputs, vec!["x_q", "W_quantized", "", "W_zero_point"]);
    assert_eq!(n.attr_float("alpha"), Some(0.2));
    assert_eq!(n.attr_int("axis"), Some(-1));
    assert_eq!(n.attr_string("mode").as_deref(), Some("linear"));
    assert_eq!(n.attr_ints("pads"), Some(&[1i64, 2, 3, 4][..]));
    assert!(matches!(n.attribute("scales"), Some(AttributeValue::Floats(v)) if v == &vec![1.0, 2.0]));
    assert!(matches!(n.attribute("names"), Some(AttributeValue::Strings(v)) if v.len() == 2));
    assert_eq!(n.attr_int("untyped"), Some(7));
    assert_eq!(n.attr_ints("empty_ints"), Some(&[][..]));

    match g.nodes[2].attribute("then_branch") {
        Some(AttributeValue::Graph(b)) => {
            assert_eq!(b.name, "body");
            assert_eq!(b.nodes[0].op_type, "Identity");
        }
        other => panic!("then_branch: {other:?}"),
    }

    assert_eq!(g.inputs[0].name, "tokens");
    assert_eq!(g.inputs[0].elem_type, Some(DataType::Int64));
    assert_eq!(g.inputs[0].shape, Some(vec![Dim::Value(1), Dim::Param("T".into())]));
    assert_eq!(g.outputs[0].shape, Some(vec![Dim::Param("N".into())]));
}

/// Every truncation of the model is an error (never a panic), and a cut inside a field names
/// the field and says that the file is truncated.
#[test]
fn every_truncation_is_an_error() {
    let full = sample_model();
    for cut in 0..full.len() {
        let r = OnnxModel::from_bytes("cut.onnx", full[..cut].to_vec());
        let e = r.expect_err(&format!("cut at {cut} parsed"));
        let msg = e.to_string();
        assert!(msg.starts_with("cut.onnx: "), "{msg}");
        assert!(
            matches!(e, Error::Truncated { .. } | Error::Onnx { .. }),
            "cut at {cut}: {e:?}"
        );
    }
    // a cut in the middle of the graph field: the outer length runs past the end of the file
    let e = OnnxModel::from_bytes("cut.onnx", full[..full.len() / 2].to_vec()).unwrap_err();
    match &e {
        Error::Truncated { what, len, end, .. } => {
            assert_eq!(what, "ONNX ModelProto.graph");
            assert_eq!(*len as usize, full.len() / 2);
            assert!(*end as usize > full.len() / 2);
        }
        other => panic!("{other:?}"),
    }
    assert!(e.to_string().contains("file is truncated"), "{e}");
}

#[test]
fn empty_and_non_onnx_input() {
    let e = OnnxModel::from_bytes("e.onnx", vec![]).unwrap_err();
    assert!(e.to_string().contains("no graph"), "{e}");
    // a GGUF header: 'G' = field 8 wire 7, an invalid wire type
    let e = OnnxModel::from_bytes("g.onnx", b"GGUF\x03\x00\x00\x00".to_vec()).unwrap_err();
    assert!(matches!(e, Error::Onnx { .. }), "{e:?}");
    assert!(e.to_string().contains("wire type 7"), "{e}");
    // a model without graph
    let e = OnnxModel::from_bytes("x.onnx", Pb::default().int(1, 9).0).unwrap_err();
    assert!(e.to_string().contains("no graph"), "{e}");
    // a start-group wire type
    let e = OnnxModel::from_bytes("x.onnx", vec![0x0b]).unwrap_err();
    assert!(e.to_string().contains("start-group"), "{e}");
    // field number zero
    let e = OnnxModel::from_bytes("x.onnx", vec![0x00, 0x01]).unwrap_err();
    assert!(e.to_string().contains("field number 0"), "{e}");
}

#[test]
fn malformed_messages() {
    let model = |graph: &Pb| Pb::default().int(1, 9).msg(7, graph).0;
    let parse = |graph: &Pb| OnnxModel::from_bytes("m.onnx", model(graph)).unwrap_err().to_string();

    // a wrong wire type for a known field
    let e = parse(&Pb::default().int(2, 5));
    assert!(e.contains("GraphProto") || e.contains("ModelProto.graph.name"), "{e}");
    assert!(e.contains("expected 2 (length-delimited)"), "{e}");

    // raw_data shorter than dims x type size
    let t = tensor_raw("w", &[2, 3], 1, &[0; 20]);
    let e = parse(&Pb::default().msg(5, &t));
    assert!(e.contains("'w'") && e.contains("raw_data has 20 bytes") && e.contains("need 24"), "{e}");

    // typed data count mismatch
    let t = Pb::default().int(1, 3).int(2, 7).str(8, "s").int(7, 1);
    let e = parse(&Pb::default().msg(5, &t));
    assert!(e.contains("has 1 values, but dims [3] need 3"), "{e}");

    // negative dimension
    let t = tensor_raw("n", &[-1], 1, &[]);
    assert!(parse(&Pb::default().msg(5, &t)).contains("negative dimension"));

    // dims whose product overflows
    let t = tensor_raw("big", &[1 << 40, 1 << 40], 1, &[]);
    assert!(parse(&Pb::default().msg(5, &t)).contains("overflows"));

    // no data_type
    let t = Pb::default().int(1, 1).str(8, "nt");
    assert!(parse(&Pb::default().msg(5, &t)).contains("no data_type"));

    // two data fields
    let t = Pb::default().int(1, 1).int(2, 1).str(8, "two").bytes(4, &[0; 4]).bytes(9, &[0; 4]);
    assert!(parse(&Pb::default().msg(5, &t)).contains("more than one data field"));

    // a node without op_type
    let e = parse(&Pb::default().msg(1, &Pb::default().str(3, "nameless")));
    assert!(e.contains("no op_type"), "{e}");

    // an attribute whose type has no value field
    let n = Pb::default().str(4, "Relu").msg(5, &Pb::default().str(1, "alpha").int(20, 1));
    let e = parse(&Pb::default().msg(1, &n));
    assert!(e.contains("attribute 'alpha' has type 1 but no matching value field"), "{e}");

    // packed floats whose length is not a multiple of 4
    let t = Pb::default().int(1, 1).int(2, 1).str(8, "f").bytes(4, &[0; 5]);
    assert!(parse(&Pb::default().msg(5, &t)).contains("not a multiple of 4"));

    // an inner length past the end of its enclosing message (but inside the file)
    let mut inner = Vec::new();
    varint(5 << 3 | 2, &mut inner);
    varint(100, &mut inner);
    let mut bytes = model(&Pb(inner));
    bytes.extend_from_slice(&[0u8; 200]);
    let e = OnnxModel::from_bytes("m.onnx", bytes).unwrap_err();
    assert!(matches!(e, Error::Onnx { .. }), "{e:?}");
    assert!(e.to_string().contains("enclosing message ends at"), "{e}");

    // a string that is not UTF-8
    let e = parse(&Pb::default().bytes(2, &[0xff, 0xfe]));
    assert!(e.contains("not UTF-8"), "{e}");

    // an overlong varint (the value of an unknown field, read to skip it)
    let mut g = Vec::new();
    varint(99 << 3, &mut g);
    g.extend_from_slice(&[0xff; 11]);
    let e = OnnxModel::from_bytes("m.onnx", Pb::default().int(1, 9).bytes(7, &g).0).unwrap_err();
    assert!(e.to_string().contains("varint longer than"), "{e}");
}

#[test]
fn deep_subgraphs_are_refused() {
    let mut g = Pb::default().str(2, "leaf");
    for _ in 0..40 {
        let n = Pb::default().str(4, "If").msg(5, &Pb::default().str(1, "then_branch").int(20, 5).msg(6, &g));
        g = Pb::default().msg(1, &n);
    }
    let e = OnnxModel::from_bytes("deep.onnx", Pb::default().int(1, 9).msg(7, &g).0).unwrap_err();
    assert!(e.to_string().contains("nested deeper than"), "{e}");
}
