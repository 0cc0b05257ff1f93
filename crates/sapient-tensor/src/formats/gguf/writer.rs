//! A GGUF v3 writer: metadata in insertion order, tensors aligned as the spec asks.

use super::reader::DEFAULT_ALIGNMENT;
use super::types::{GgmlType, Value, ValueType};
use crate::{Error, Result};
use candle_core::quantized::QTensor;
use std::io::Write;
use std::path::Path;

/// Tensor data to write: already encoded bytes of `ggml_type`.
#[derive(Debug, Clone)]
pub struct TensorData {
    pub name: String,
    /// Row-major (candle) shape; written reversed as ggml's `ne`.
    pub shape: Vec<usize>,
    pub ggml_type: GgmlType,
    pub data: Vec<u8>,
}

impl TensorData {
    /// Take the encoded blocks of a candle `QTensor`.
    pub fn from_qtensor(name: impl Into<String>, q: &QTensor) -> Result<Self> {
        Ok(Self {
            name: name.into(),
            shape: q.shape().dims().to_vec(),
            ggml_type: GgmlType::from_candle(q.dtype()),
            data: q.data()?.into_owned(),
        })
    }
}

/// A tensor [`GgufWriter::write_streamed`] writes: its bytes come from a callback.
#[derive(Debug, Clone)]
pub struct TensorSpec {
    pub name: String,
    /// Row-major (candle) shape.
    pub shape: Vec<usize>,
    pub ggml_type: GgmlType,
}

/// Zeros up to `to` bytes into the data section (`written` so far).
fn pad_to(w: &mut (impl Write + ?Sized), written: &mut u64, to: u64) -> std::io::Result<()> {
    if to > *written {
        w.write_all(&vec![0u8; (to - *written) as usize])?;
        *written = to;
    }
    Ok(())
}

/// A writer that counts the bytes through it.
struct Counted<'a, W: Write> {
    inner: &'a mut W,
    n: u64,
}

impl<W: Write> Write for Counted<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let k = self.inner.write(buf)?;
        self.n += k as u64;
        Ok(k)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

#[derive(Debug, Default)]
pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
    tensors: Vec<TensorData>,
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Set a metadata key (replacing an earlier value of the same key, keeping its place).
    pub fn set(&mut self, key: impl Into<String>, value: Value) -> &mut Self {
        let key = key.into();
        match self.metadata.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.metadata.push((key, value)),
        }
        self
    }

    pub fn add_tensor(&mut self, t: TensorData) -> &mut Self {
        self.tensors.push(t);
        self
    }

    fn alignment(&self) -> u64 {
        self.metadata
            .iter()
            .find(|(k, _)| k == "general.alignment")
            .and_then(|(_, v)| v.as_int())
            .map(|a| a as u64)
            .unwrap_or(DEFAULT_ALIGNMENT)
    }

    /// The header (metadata and tensor table, padded to the alignment) for tensors of
    /// `(name, shape, type, bytes)`, and each tensor's offset in the data section.
    fn header<'a>(&self, tensors: impl Iterator<Item = (&'a str, &'a [usize], GgmlType, u64)>) -> (Vec<u8>, Vec<u64>) {
        let alignment = self.alignment();
        let tensors: Vec<_> = tensors.collect();
        let mut header = Vec::new();
        header.extend_from_slice(b"GGUF");
        header.extend_from_slice(&3u32.to_le_bytes());
        header.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
        header.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            write_str(&mut header, k);
            header.extend_from_slice(&(v.value_type() as u32).to_le_bytes());
            write_value(&mut header, v);
        }
        let mut offset = 0u64;
        let mut offsets = Vec::with_capacity(tensors.len());
        for (name, shape, ty, len) in tensors {
            write_str(&mut header, name);
            header.extend_from_slice(&(shape.len() as u32).to_le_bytes());
            for &d in shape.iter().rev() {
                header.extend_from_slice(&(d as u64).to_le_bytes());
            }
            header.extend_from_slice(&ty.id().to_le_bytes());
            header.extend_from_slice(&offset.to_le_bytes());
            offsets.push(offset);
            offset = (offset + len).div_ceil(alignment) * alignment;
        }
        let pad = (header.len() as u64).div_ceil(alignment) * alignment - header.len() as u64;
        header.resize(header.len() + pad as usize, 0);
        (header, offsets)
    }

    /// Serialize to a writer.
    pub fn write_to(&self, w: &mut impl Write) -> std::io::Result<()> {
        let (header, offsets) = self.header(self.tensors.iter().map(|t| (t.name.as_str(), &t.shape[..], t.ggml_type, t.data.len() as u64)));
        w.write_all(&header)?;
        let mut written = 0u64;
        for (t, &off) in self.tensors.iter().zip(&offsets) {
            pad_to(w, &mut written, off)?;
            w.write_all(&t.data)?;
            written += t.data.len() as u64;
        }
        Ok(())
    }

    /// Write this writer's metadata and the tensors `specs` (its own tensors are left out) to
    /// `path` atomically, each tensor's bytes produced by `fill(index, out)` as the file is
    /// written: files larger than memory. `fill` must write exactly the spec's bytes.
    pub fn write_streamed(&self, path: impl AsRef<Path>, specs: &[TensorSpec], fill: &mut dyn FnMut(usize, &mut dyn Write) -> std::io::Result<()>) -> Result<()> {
        let path = path.as_ref();
        let io = |source| Error::Io { path: path.to_path_buf(), source };
        let mut lens = Vec::with_capacity(specs.len());
        for t in specs {
            let n: u64 = t.shape.iter().map(|&d| d as u64).product();
            let len = t.ggml_type.bytes_for(n).ok_or_else(|| Error::Malformed { path: path.to_path_buf(), what: format!("tensor '{}': {:?} is not whole blocks of {}", t.name, t.shape, t.ggml_type) })?;
            lens.push(len);
        }
        let (header, offsets) = self.header(specs.iter().zip(&lens).map(|(t, &len)| (t.name.as_str(), &t.shape[..], t.ggml_type, len)));
        let tmp = path.with_extension("gguf.partial");
        {
            let f = std::fs::File::create(&tmp).map_err(io)?;
            let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
            w.write_all(&header).map_err(io)?;
            let mut written = 0u64;
            for (i, (&off, &len)) in offsets.iter().zip(&lens).enumerate() {
                pad_to(&mut w, &mut written, off).map_err(io)?;
                let mut counted = Counted { inner: &mut w, n: 0 };
                fill(i, &mut counted).map_err(io)?;
                if counted.n != len {
                    return Err(Error::Malformed { path: path.to_path_buf(), what: format!("tensor '{}' needs {len} bytes, {} were written", specs[i].name, counted.n) });
                }
                written += len;
            }
            w.flush().map_err(io)?;
        }
        std::fs::rename(&tmp, path).map_err(io)?;
        Ok(())
    }

    /// Write to `path` atomically (a temporary file renamed into place).
    pub fn write(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        for t in &self.tensors {
            let n: u64 = t.shape.iter().map(|&d| d as u64).product();
            if t.ggml_type.bytes_for(n) != Some(t.data.len() as u64) {
                return Err(Error::Malformed {
                    path: path.to_path_buf(),
                    what: format!(
                        "tensor '{}' of shape {:?} and type {} needs {:?} bytes, got {}",
                        t.name,
                        t.shape,
                        t.ggml_type,
                        t.ggml_type.bytes_for(n),
                        t.data.len()
                    ),
                });
            }
        }
        let io = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let tmp = path.with_extension("gguf.partial");
        {
            let f = std::fs::File::create(&tmp).map_err(io)?;
            let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
            self.write_to(&mut w).map_err(io)?;
            w.flush().map_err(io)?;
        }
        std::fs::rename(&tmp, path).map_err(io)?;
        Ok(())
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::new();
        // Writing to a Vec cannot fail.
        let _ = self.write_to(&mut v);
        v
    }
}

fn write_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn write_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(b) => out.push(*b as u8),
        Value::String(s) => write_str(out, s),
        Value::Array(t, items) => {
            out.extend_from_slice(&(*t as u32).to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for it in items {
                write_value(out, it);
            }
        }
    }
}

/// Helpers to build metadata values.
impl Value {
    pub fn string_array<S: AsRef<str>>(items: impl IntoIterator<Item = S>) -> Value {
        Value::Array(
            ValueType::String,
            items.into_iter().map(|s| Value::String(s.as_ref().to_string())).collect(),
        )
    }
    pub fn f32_array(items: impl IntoIterator<Item = f32>) -> Value {
        Value::Array(ValueType::F32, items.into_iter().map(Value::F32).collect())
    }
    pub fn i32_array(items: impl IntoIterator<Item = i32>) -> Value {
        Value::Array(ValueType::I32, items.into_iter().map(Value::I32).collect())
    }
}
