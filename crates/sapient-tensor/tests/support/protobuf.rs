//! A tiny protobuf writer for hand-made ONNX messages, shared by the ONNX reader's tests
//! (`src/formats/onnx.rs`'s unit tests through `src/formats/mod.rs`, tests/onnx_reader.rs, tests/hostile_files.rs; included with
//! `#[path]`): free functions that append one field, and [`Pb`], a builder over them.
// Each test binary uses part of it.
#![allow(dead_code)]

/// Appends `v` as a base-128 varint.
pub fn varint(mut v: u64, out: &mut Vec<u8>) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

/// Appends field `field` as a varint (wire type 0).
pub fn field_int(field: u64, v: u64, out: &mut Vec<u8>) {
    varint(field << 3, out);
    varint(v, out);
}

/// Appends field `field` as length-delimited bytes (wire type 2).
pub fn field_bytes(field: u64, b: &[u8], out: &mut Vec<u8>) {
    varint(field << 3 | 2, out);
    varint(b.len() as u64, out);
    out.extend_from_slice(b);
}

/// A message built field by field.
#[derive(Default, Clone)]
pub struct Pb(pub Vec<u8>);

impl Pb {
    pub fn int(mut self, field: u64, v: i64) -> Self {
        field_int(field, v as u64, &mut self.0);
        self
    }
    pub fn bytes(mut self, field: u64, b: &[u8]) -> Self {
        field_bytes(field, b, &mut self.0);
        self
    }
    pub fn str(self, field: u64, s: &str) -> Self {
        self.bytes(field, s.as_bytes())
    }
    pub fn msg(self, field: u64, m: &Pb) -> Self {
        self.bytes(field, &m.0)
    }
    pub fn f32(mut self, field: u64, v: f32) -> Self {
        varint(field << 3 | 5, &mut self.0);
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn fixed64(mut self, field: u64, v: u64) -> Self {
        varint(field << 3 | 1, &mut self.0);
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
}
