//! Hostile files for every loader of this crate (GGUF, safetensors, ONNX, npy/npz): huge
//! declared sizes, zero and negative dimensions, lengths past the end, deep nesting, sizes over
//! a `Limits` ceiling. Each must be an error naming the problem, within a second, with a heap
//! peak no larger than the file (the allocator below measures it).

#[path = "support/hostile.rs"]
mod support;

use sapient_tensor::npy::{parse_npy_with, Npz};
use sapient_tensor::onnx::OnnxModel;
use sapient_tensor::{GgufFile, Limits, SafetensorsFiles, WeightSource};
use support::hostile;

#[global_allocator]
static METER: support::Meter = support::Meter;

// ---- GGUF, written by hand ----

fn gstr(s: &str) -> Vec<u8> {
    let mut b = (s.len() as u64).to_le_bytes().to_vec();
    b.extend(s.as_bytes());
    b
}

/// A GGUF v3 image: `kvs` are raw key/value records, `tensors` (name, ggml ne, type id, offset).
fn gguf(kvs: &[Vec<u8>], tensors: &[(&str, Vec<u64>, u32, u64)], data: usize) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend((tensors.len() as u64).to_le_bytes());
    b.extend((kvs.len() as u64).to_le_bytes());
    for kv in kvs {
        b.extend(kv);
    }
    for (name, ne, ty, off) in tensors {
        b.extend(gstr(name));
        b.extend((ne.len() as u32).to_le_bytes());
        for d in ne {
            b.extend(d.to_le_bytes());
        }
        b.extend(ty.to_le_bytes());
        b.extend(off.to_le_bytes());
    }
    while !b.len().is_multiple_of(32) {
        b.push(0);
    }
    b.extend(vec![0u8; data]);
    b
}

fn kv_u8_array(key: &str, n_declared: u64, n_present: usize) -> Vec<u8> {
    let mut b = gstr(key);
    b.extend(9u32.to_le_bytes()); // array
    b.extend(0u32.to_le_bytes()); // of u8
    b.extend(n_declared.to_le_bytes());
    b.extend(vec![7u8; n_present]);
    b
}

fn open_gguf(b: &[u8], limits: &Limits) -> Result<GgufFile, sapient_tensor::Error> {
    GgufFile::from_bytes_with("hostile.gguf", b.to_vec(), limits)
}

#[test]
fn gguf_hostile_headers() {
    let l = Limits::default();
    // A tensor that declares 2^40 f32 elements in a 100-byte file.
    let b = gguf(&[], &[("t", vec![1 << 20, 1 << 20], 0, 0)], 64);
    let m = hostile("gguf 2^40 elements", b.len(), || open_gguf(&b, &l));
    assert!(m.contains("tensor 't' data") && m.contains("runs past the end"), "{m}");
    // Dimensions whose product overflows.
    let b = gguf(&[], &[("t", vec![u64::MAX / 2, 4], 0, 0)], 64);
    let m = hostile("gguf overflowing dims", b.len(), || open_gguf(&b, &l));
    assert!(m.contains("absurd dimensions"), "{m}");
    // An offset past the end.
    let b = gguf(&[], &[("t", vec![8], 0, 1 << 40)], 64);
    let m = hostile("gguf offset past the end", b.len(), || open_gguf(&b, &l));
    assert!(m.contains("runs past the end"), "{m}");
    // A metadata array of 2^60 elements.
    let b = gguf(&[kv_u8_array("a", 1 << 60, 16)], &[], 0);
    let m = hostile("gguf 2^60-element array", b.len(), || open_gguf(&b, &l));
    assert!(m.contains("array of 1152921504606846976 elements for metadata key 'a'"), "{m}");
    // A string of u64::MAX bytes.
    let mut kv = gstr("s");
    kv.extend(8u32.to_le_bytes());
    kv.extend(u64::MAX.to_le_bytes());
    let b = gguf(&[kv], &[], 0);
    let m = hostile("gguf huge string", b.len(), || open_gguf(&b, &l));
    assert!(m.contains("truncated") && m.contains("metadata key 's'"), "{m}");
    // 2^40 metadata entries and tensors claimed by a 40-byte header.
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend((1u64 << 40).to_le_bytes());
    b.extend((1u64 << 40).to_le_bytes());
    let m = hostile("gguf huge counts", b.len(), || open_gguf(&b, &l));
    assert!(m.contains("more than the 24 bytes of the file can hold"), "{m}");
    // Arrays nested 100 deep.
    let mut kv = gstr("deep");
    kv.extend(9u32.to_le_bytes());
    for _ in 0..100 {
        kv.extend(9u32.to_le_bytes());
        kv.extend(1u64.to_le_bytes());
    }
    let b = gguf(&[kv], &[], 0);
    let m = hostile("gguf deep arrays", b.len(), || open_gguf(&b, &l));
    assert!(m.contains("nested deeper than"), "{m}");
    // No dimensions at all.
    let b = gguf(&[], &[("t", vec![], 0, 0)], 64);
    let m = hostile("gguf 0 dims", b.len(), || open_gguf(&b, &l));
    assert!(m.contains("has 0 dimensions"), "{m}");
}

#[test]
fn gguf_zero_sized_dimension_is_an_empty_tensor() {
    // A zero among the dims is an empty tensor, not an error: it loads with no elements.
    let b = gguf(&[], &[("t", vec![32, 0], 0, 0)], 32);
    let g = GgufFile::from_bytes("zero.gguf", b).unwrap();
    assert_eq!(g.tensor_info("t").unwrap().shape, vec![0, 32]);
    assert_eq!(g.tensor_bytes("t").unwrap().len(), 0);
}

#[test]
fn gguf_limits_name_the_key_and_the_tensor() {
    // A metadata array whose values would take more than the ceiling.
    let b = gguf(&[kv_u8_array("tokenizer.ggml.token_type", 4096, 4096)], &[], 0);
    let l = Limits::default().max_alloc_bytes(4096);
    let m = hostile("gguf array over the limit", b.len(), || open_gguf(&b, &l));
    assert!(m.contains("metadata key 'tokenizer.ggml.token_type': array of 4096 values needs"), "{m}");
    assert!(m.contains("over the limit of 4096 bytes"), "{m}");
    // A Q8_0 tensor whose f32 values are over the ceiling (its blocks are not).
    let b = gguf(&[], &[("w", vec![256, 4], 8, 0)], 4 * 8 * 34);
    let g = open_gguf(&b, &Limits::default().max_alloc_bytes(2048)).unwrap();
    let e = g.tensor("w", &candle_core::Device::Cpu).unwrap_err().to_string();
    assert!(e.contains("tensor 'w' dequantized to f32 needs 4096 bytes, over the limit of 2048"), "{e}");
    assert!(g.qtensor("w", &candle_core::Device::Cpu).is_ok());
}

// ---- safetensors ----

fn safetensors(header: &str, data: usize) -> Vec<u8> {
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend(header.as_bytes());
    b.extend(vec![0u8; data]);
    b
}

fn open_st(dir: &std::path::Path, name: &str, bytes: &[u8], limits: &Limits) -> Result<Vec<usize>, sapient_tensor::Error> {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    let (r, peak, elapsed) = support::measure(|| {
        let f = SafetensorsFiles::open_with(&[&p], limits)?;
        for n in f.names() {
            f.load(&n, &candle_core::Device::Cpu)?;
        }
        Ok(f.names().len())
    });
    assert!(elapsed < std::time::Duration::from_secs(1), "{name}: {elapsed:?}");
    assert!(peak <= bytes.len() + support::SLACK, "{name}: {peak} bytes");
    r.map(|n| vec![n])
}

#[test]
fn safetensors_hostile_headers() {
    let dir = tempfile::tempdir().unwrap();
    let l = Limits::default();
    let err = |name: &str, b: &[u8], l: &Limits| open_st(dir.path(), name, b, l).unwrap_err().to_string();
    // A header length of 2^60.
    let mut b = (1u64 << 60).to_le_bytes().to_vec();
    b.extend(b"{}");
    let m = err("huge-header.safetensors", &b, &l);
    assert!(m.contains("cannot read safetensors") && m.contains("header"), "{m}");
    // A tensor of 2^40 elements with 16 bytes of data.
    let b = safetensors(r#"{"t":{"dtype":"F32","shape":[1099511627776],"data_offsets":[0,16]}}"#, 16);
    let m = err("huge-shape.safetensors", &b, &l);
    assert!(m.contains("cannot read safetensors"), "{m}");
    // Offsets past the end of the file.
    let b = safetensors(r#"{"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16000000000]}}"#, 16);
    let m = err("past-end.safetensors", &b, &l);
    assert!(m.contains("cannot read safetensors"), "{m}");
    // A negative dimension.
    let b = safetensors(r#"{"t":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}}"#, 16);
    let m = err("negative.safetensors", &b, &l);
    assert!(m.contains("cannot read safetensors"), "{m}");
    // Deeply nested JSON in the header.
    let deep = format!(r#"{{"__metadata__":{}{}}}"#, "[".repeat(10_000), "]".repeat(10_000));
    let b = safetensors(&deep, 0);
    let m = err("deep.safetensors", &b, &l);
    assert!(m.contains("cannot read safetensors"), "{m}");
    // A tensor over the ceiling.
    let b = safetensors(r#"{"t":{"dtype":"F32","shape":[256],"data_offsets":[0,1024]}}"#, 1024);
    let m = err("limit.safetensors", &b, &Limits::default().max_alloc_bytes(512));
    assert!(m.contains("tensor 't' needs 1024 bytes, over the limit of 512"), "{m}");
    // Zero-sized dimensions are an empty tensor.
    let b = safetensors(r#"{"t":{"dtype":"F32","shape":[0,4],"data_offsets":[0,0]}}"#, 0);
    assert_eq!(open_st(dir.path(), "zero.safetensors", &b, &l).unwrap(), vec![1]);
}

// ---- ONNX ----

#[path = "support/protobuf.rs"]
mod protobuf;
use protobuf::{field_bytes, field_int, varint};

/// A model whose graph has the one initializer `tensor`.
fn onnx_with(tensor: &[u8]) -> Vec<u8> {
    let mut g = Vec::new();
    field_bytes(5, tensor, &mut g);
    let mut m = Vec::new();
    field_int(1, 9, &mut m);
    field_bytes(7, &g, &mut m);
    m
}

#[test]
fn onnx_hostile_tensors() {
    let l = Limits::default();
    let open = |b: &[u8], l: &Limits| OnnxModel::from_bytes_with("hostile.onnx", b.to_vec(), l);
    // raw_data whose length runs 2^62 bytes past the end.
    let mut t = Vec::new();
    field_int(1, 4, &mut t);
    field_int(2, 1, &mut t);
    field_bytes(8, b"w", &mut t);
    varint(9 << 3 | 2, &mut t);
    varint(1 << 62, &mut t);
    let b = onnx_with(&t);
    let m = hostile("onnx length past the end", b.len(), || open(&b, &l));
    assert!(m.contains("truncated") && m.contains("('w').raw_data needs bytes 14..4611686018427387927"), "{m}");
    // dims of 2^40 x 2^40 with 4 bytes of data.
    let mut t = Vec::new();
    field_int(1, 1 << 40, &mut t);
    field_int(1, 1 << 40, &mut t);
    field_int(2, 1, &mut t);
    field_bytes(8, b"w", &mut t);
    field_bytes(9, &[0; 4], &mut t);
    let b = onnx_with(&t);
    let m = hostile("onnx huge dims", b.len(), || open(&b, &l));
    assert!(m.contains("overflows") || m.contains("raw_data has 4 bytes"), "{m}");
    // A negative dimension.
    let mut t = Vec::new();
    field_int(1, -3i64 as u64, &mut t);
    field_int(2, 1, &mut t);
    field_bytes(8, b"w", &mut t);
    let b = onnx_with(&t);
    let m = hostile("onnx negative dim", b.len(), || open(&b, &l));
    assert!(m.contains("negative dimension -3"), "{m}");
    // 1000 packed float_data values under a 1000-byte ceiling.
    let mut t = Vec::new();
    field_int(1, 1000, &mut t);
    field_int(2, 1, &mut t);
    field_bytes(8, b"w", &mut t);
    field_bytes(4, &[0u8; 4000], &mut t);
    let b = onnx_with(&t);
    let tight = Limits::default().max_alloc_bytes(1000);
    let m = hostile("onnx over the limit", 2 * b.len(), || open(&b, &tight));
    assert!(m.contains("1000 values as f32 needs 4000 bytes, over the limit of 1000"), "{m}");
}

// ---- npy / npz ----

fn npy(descr: &str, shape: &str, data: &[u8]) -> Vec<u8> {
    let header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}\n");
    let mut b = b"\x93NUMPY\x01\x00".to_vec();
    b.extend((header.len() as u16).to_le_bytes());
    b.extend(header.as_bytes());
    b.extend(data);
    b
}

#[test]
fn npy_hostile_arrays() {
    let l = Limits::default();
    let p = std::path::Path::new("hostile.npy");
    let b = npy("<f4", "(1099511627776,)", &[0; 16]);
    let m = hostile("npy 2^40 elements", b.len(), || parse_npy_with(&b, p, &l));
    assert!(m.contains("16 data bytes for shape [1099511627776]"), "{m}");
    // Regression (found by the `npy` fuzz target): an empty array whose other dimensions
    // overflow when multiplied made candle's stride computation panic.
    let b = npy("<f4", "(0, 1099511627776, 1099511627776)", &[]);
    let m = hostile("npy empty with huge dims", b.len(), || parse_npy_with(&b, p, &l));
    assert!(m.contains("shape (0, 1099511627776, 1099511627776) is too large"), "{m}");
    let empty = parse_npy_with(&npy("<f4", "(0, 3)", &[]), p, &l).unwrap();
    assert_eq!(empty.to_candle_f32().unwrap().dims(), &[0, 3]);
    let b = npy("<f4", "(-4,)", &[0; 16]);
    let m = hostile("npy negative dim", b.len(), || parse_npy_with(&b, p, &l));
    assert!(m.contains("bad shape (-4,)"), "{m}");
    let mut b = npy("<f4", "(4,)", &[0; 16]);
    b[8..10].copy_from_slice(&u16::MAX.to_le_bytes());
    let m = hostile("npy header past the end", b.len(), || parse_npy_with(&b, p, &l));
    assert!(m.contains("truncated header"), "{m}");
    let b = npy("<f8", "(64,)", &[0; 512]);
    let m = hostile("npy over the limit", b.len(), || parse_npy_with(&b, p, &Limits::default().max_alloc_bytes(100)));
    assert!(m.contains("array of shape [64] (F64) needs 512 bytes, over the limit of 100"), "{m}");
}

/// A zip end-of-central-directory record claiming `count` entries at `dir`.
fn eocd(count: u16, dir: u32) -> Vec<u8> {
    let mut b = vec![0x50, 0x4b, 0x05, 0x06, 0, 0, 0, 0];
    b.extend(count.to_le_bytes());
    b.extend(count.to_le_bytes());
    b.extend(0u32.to_le_bytes());
    b.extend(dir.to_le_bytes());
    b.extend(0u16.to_le_bytes());
    b
}

#[test]
fn npz_hostile_archives() {
    let l = Limits::default();
    // 65535 entries claimed by a 22-byte archive.
    let b = eocd(u16::MAX, 0);
    let m = hostile("npz 65535 entries", b.len(), || Npz::from_bytes_with("hostile.npz", b.clone(), &l));
    assert!(m.contains("corrupt zip central directory"), "{m}");
    // A directory offset past the end.
    let b = eocd(1, 1 << 30);
    let m = hostile("npz directory past the end", b.len(), || Npz::from_bytes_with("hostile.npz", b.clone(), &l));
    assert!(m.contains("corrupt zip central directory"), "{m}");
    // A deflated entry that declares 4 GiB once inflated.
    let name = b"a.npy";
    let mut zip = Vec::new();
    zip.extend([0x50, 0x4b, 0x03, 0x04]);
    zip.extend([0u8; 22]);
    zip.extend((name.len() as u16).to_le_bytes());
    zip.extend(0u16.to_le_bytes());
    zip.extend(name);
    zip.extend([0x03, 0x00]); // an empty deflate stream
    let dir = zip.len() as u32;
    let mut cd = vec![0x50, 0x4b, 0x01, 0x02];
    cd.extend([0u8; 6]);
    cd.extend(8u16.to_le_bytes()); // deflated
    cd.extend([0u8; 8]);
    cd.extend(2u32.to_le_bytes()); // compressed size
    cd.extend(u32::MAX.to_le_bytes()); // size
    cd.extend((name.len() as u16).to_le_bytes());
    cd.extend([0u8; 12]);
    cd.extend(0u32.to_le_bytes()); // local header offset
    cd.extend(name);
    zip.extend(cd);
    zip.extend(eocd(1, dir));
    let z = Npz::from_bytes_with("bomb.npz", zip.clone(), &Limits::default().max_alloc_bytes(1 << 20)).unwrap();
    let m = hostile("npz inflation over the limit", zip.len(), || z.get("a"));
    assert!(m.contains("entry 'a.npy' inflated needs 4294967295 bytes, over the limit of 1048576"), "{m}");
}

// ---- CI-sized mutation runs (the `fuzz/` targets run the same loaders for longer) ----

const BUDGET: std::time::Duration = std::time::Duration::from_secs(3);

/// A zip archive of stored entries, as `numpy.savez` writes it.
fn zip_stored(entries: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut cd = Vec::new();
    for (name, data) in entries {
        let local = out.len() as u32;
        out.extend([0x50, 0x4b, 0x03, 0x04]);
        out.extend([0u8; 14]);
        out.extend((data.len() as u32).to_le_bytes());
        out.extend((data.len() as u32).to_le_bytes());
        out.extend((name.len() as u16).to_le_bytes());
        out.extend(0u16.to_le_bytes());
        out.extend(name.as_bytes());
        out.extend(data);
        cd.extend([0x50, 0x4b, 0x01, 0x02]);
        cd.extend([0u8; 16]);
        cd.extend((data.len() as u32).to_le_bytes());
        cd.extend((data.len() as u32).to_le_bytes());
        cd.extend((name.len() as u16).to_le_bytes());
        cd.extend([0u8; 12]);
        cd.extend(local.to_le_bytes());
        cd.extend(name.as_bytes());
    }
    let dir = out.len() as u32;
    out.extend(cd);
    let mut e = eocd(entries.len() as u16, dir);
    e[12..16].copy_from_slice(&((out.len() as u32 - dir).to_le_bytes()));
    out.extend(e);
    out
}

#[test]
fn mutated_npy_and_npz_never_panic() {
    let f32s: Vec<u8> = (0..24).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let a = npy("<f4", "(2, 3, 4)", &f32s);
    let b = npy("|u1", "(5,)", &[1, 2, 3, 4, 5]);
    let c = npy("<i8", "()", &7i64.to_le_bytes());
    let z = zip_stored(&[("a.npy", a.clone()), ("b.npy", b.clone())]);
    assert_eq!(Npz::from_bytes("seed.npz", z.clone()).unwrap().arrays().unwrap().len(), 2);
    let limits = Limits::default().max_alloc_bytes(1 << 20);
    let (ran, ok) = support::mutation_run("npy", &[a, b, c, z], 20_000, BUDGET, |d| {
        let mut ok = false;
        if let Ok(x) = parse_npy_with(d, "m.npy".as_ref(), &limits) {
            let _ = (x.to_f32(), x.to_f64());
            ok = true;
        }
        if let Ok(z) = Npz::from_bytes_with("m.npz", d.to_vec(), &limits) {
            ok |= z.arrays().is_ok();
        }
        ok
    });
    assert!(ran >= 1000 && ok > ran / 20, "{ok} of {ran} parsed");
}

#[test]
fn mutated_onnx_never_panics() {
    let mut t = Vec::new();
    field_int(1, 2, &mut t);
    field_int(1, 3, &mut t);
    field_int(2, 1, &mut t);
    field_bytes(8, b"w", &mut t);
    field_bytes(9, &[0u8; 24], &mut t);
    let mut t2 = Vec::new();
    field_int(1, 3, &mut t2);
    field_int(2, 7, &mut t2);
    field_bytes(8, b"shape", &mut t2);
    field_bytes(7, &[1, 2, 3], &mut t2);
    let mut attr = Vec::new();
    field_bytes(1, b"value", &mut attr);
    field_int(20, 4, &mut attr);
    field_bytes(5, &t2, &mut attr);
    let mut node = Vec::new();
    field_bytes(1, b"x", &mut node);
    field_bytes(2, b"y", &mut node);
    field_bytes(4, b"Constant", &mut node);
    field_bytes(5, &attr, &mut node);
    let mut g = Vec::new();
    field_bytes(1, &node, &mut g);
    field_bytes(5, &t, &mut g);
    field_bytes(5, &t2, &mut g);
    let mut m = Vec::new();
    field_int(1, 9, &mut m);
    field_bytes(7, &g, &mut m);
    let seed = OnnxModel::from_bytes("seed.onnx", m.clone()).unwrap();
    assert_eq!((seed.graph.initializers.len(), seed.graph.nodes.len()), (2, 1));
    let limits = Limits::default().max_alloc_bytes(1 << 20);
    let (ran, ok) = support::mutation_run("onnx", &[m], 20_000, BUDGET, |d| {
        let Ok(model) = OnnxModel::from_bytes_with("m.onnx", d.to_vec(), &limits) else { return false };
        for t in &model.graph.initializers {
            let _ = (t.to_f32(), t.to_i64());
        }
        true
    });
    assert!(ran >= 1000 && ok > ran / 50, "{ok} of {ran} parsed");
}

#[test]
fn mutated_safetensors_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.safetensors");
    let s1 = safetensors(
        r#"{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"b":{"dtype":"BF16","shape":[4],"data_offsets":[16,24]}}"#,
        24,
    );
    let limits = Limits::default().max_alloc_bytes(1 << 20);
    let (ran, ok) = support::mutation_run("safetensors", &[s1], 2_000, BUDGET, |d| {
        if std::fs::write(&p, d).is_err() {
            return false;
        }
        let Ok(f) = SafetensorsFiles::open_with(&[&p], &limits) else { return false };
        for n in f.names() {
            if let Ok(w) = f.load(&n, &candle_core::Device::Cpu) {
                let _ = w.dequantize(&candle_core::Device::Cpu, candle_core::DType::F32);
            }
        }
        true
    });
    // Most mutations break the JSON header; those that do not reach the tensor loads.
    assert!(ran >= 200 && ok >= 5, "{ok} of {ran} parsed");
}
