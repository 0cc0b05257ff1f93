//! A minimal protobuf walk over an ONNX `ModelProto` that returns the float initializers of
//! its main graph (enough for `silero_vad_16k_op15.onnx`, whose weights are initializers).

use crate::error::{Error, Result};
use std::collections::HashMap;
use std::path::Path;

/// A float32 initializer: dims and values.
pub(crate) struct Initializer {
    pub dims: Vec<usize>,
    pub data: Vec<f32>,
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed32(u32),
    Fixed64,
}

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self.b.get(self.at)?;
            self.at += 1;
            v |= ((byte & 0x7f) as u64) << shift;
            if byte & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }

    /// Next (field number, value); `None` at the end; `Some(Err)` when malformed.
    fn next(&mut self) -> Option<std::result::Result<(u64, Field<'a>), String>> {
        if self.at >= self.b.len() {
            return None;
        }
        let Some(key) = self.varint() else { return Some(Err("truncated key".into())) };
        let field = key >> 3;
        let v = match key & 7 {
            0 => match self.varint() {
                Some(v) => Field::Varint(v),
                None => return Some(Err("truncated varint".into())),
            },
            1 => {
                if self.at + 8 > self.b.len() {
                    return Some(Err("truncated fixed64".into()));
                }
                self.at += 8;
                Field::Fixed64
            }
            2 => {
                let Some(len) = self.varint() else { return Some(Err("truncated length".into())) };
                let end = self.at.checked_add(len as usize).filter(|&e| e <= self.b.len());
                let Some(end) = end else { return Some(Err(format!("field {field}: length {len} past the end"))) };
                let s = &self.b[self.at..end];
                self.at = end;
                Field::Bytes(s)
            }
            5 => {
                let Some(s) = self.b.get(self.at..self.at + 4) else { return Some(Err("truncated fixed32".into())) };
                self.at += 4;
                Field::Fixed32(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
            }
            w => return Some(Err(format!("unsupported wire type {w}"))),
        };
        Some(Ok((field, v)))
    }
}

/// Float initializers of the main graph of an ONNX file, by name.
pub(crate) fn read_initializers(path: &Path) -> Result<HashMap<String, Initializer>> {
    let bytes = std::fs::read(path).map_err(|source| Error::Io { path: path.to_path_buf(), source })?;
    let bad = |d: String| Error::Model { path: path.to_path_buf(), detail: format!("not a readable ONNX model: {d}") };
    if bytes.is_empty() {
        return Err(Error::EmptyInput { what: path.display().to_string() });
    }
    let mut model = Reader { b: &bytes, at: 0 };
    let mut graph = None;
    while let Some(f) = model.next() {
        if let (7, Field::Bytes(g)) = f.map_err(bad)? {
            graph = Some(g);
        }
    }
    let graph = graph.ok_or_else(|| bad("no graph".into()))?;
    let mut out = HashMap::new();
    let mut g = Reader { b: graph, at: 0 };
    while let Some(f) = g.next() {
        let (5, Field::Bytes(t)) = f.map_err(bad)? else { continue };
        let mut dims = Vec::new();
        let mut dtype = 0u64;
        let mut name = String::new();
        let mut raw: Option<&[u8]> = None;
        let mut floats = Vec::new();
        let mut r = Reader { b: t, at: 0 };
        while let Some(f) = r.next() {
            match f.map_err(bad)? {
                (1, Field::Varint(d)) => dims.push(d as usize),
                (1, Field::Bytes(packed)) => {
                    let mut p = Reader { b: packed, at: 0 };
                    while p.at < packed.len() {
                        dims.push(p.varint().ok_or_else(|| bad("truncated dims".into()))? as usize);
                    }
                }
                (2, Field::Varint(d)) => dtype = d,
                (4, Field::Fixed32(x)) => floats.push(f32::from_bits(x)),
                (4, Field::Bytes(packed)) => {
                    floats.extend(packed.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                }
                (8, Field::Bytes(n)) => name = String::from_utf8_lossy(n).into_owned(),
                (9, Field::Bytes(d)) => raw = Some(d),
                _ => {}
            }
        }
        if dtype != 1 {
            continue; // only FLOAT initializers matter here
        }
        let data: Vec<f32> = match raw {
            Some(d) => d.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            None => floats,
        };
        let n: usize = dims.iter().product();
        if data.len() != n {
            return Err(bad(format!("initializer {name}: {} values for dims {dims:?}", data.len())));
        }
        out.insert(name, Initializer { dims, data });
    }
    Ok(out)
}
