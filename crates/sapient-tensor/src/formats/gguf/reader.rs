//! A GGUF v2/v3 reader over a memory map (or any byte buffer). Every read is bounds-checked:
//! corrupt or truncated input gives an [`Error`] that names the file and what broke, never a
//! panic and never an allocation sized by an untrusted count.

use super::types::{GgmlType, Value, ValueType};
use crate::{Error, Limits, Result};
use candle_core::quantized::{ggml_file::qtensor_from_ggml, QTensor};
use candle_core::{Device, Tensor};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub const GGUF_MAGIC: &[u8; 4] = b"GGUF";
pub const DEFAULT_ALIGNMENT: u64 = 32;
const MAX_DIMS: u32 = 4;
const MAX_DEPTH: usize = 8;

/// Where a tensor lives and what it is.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// Shape in row-major (candle / PyTorch) order: the reverse of ggml's `ne`.
    pub shape: Vec<usize>,
    pub ggml_type: GgmlType,
    /// Offset relative to the start of the data section.
    pub offset: u64,
    /// Size in bytes of the tensor data.
    pub size: u64,
}

impl TensorInfo {
    pub fn elem_count(&self) -> usize {
        self.shape.iter().product()
    }
}

enum Bytes {
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Mmap(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// Bytes of a tensor shared with the file they were read from: the memory map itself (or the
/// buffer an in-memory file was parsed from), kept alive by every view of it. Weights held
/// this way take no anonymous memory: their pages belong to the file, the kernel reads them
/// from disk on first touch and may evict them again under memory pressure.
#[derive(Clone)]
pub struct MappedBytes {
    bytes: Arc<Bytes>,
    start: usize,
    len: usize,
}

impl MappedBytes {
    /// Bytes owned by the view itself (no file behind them).
    pub fn from_vec(v: Vec<u8>) -> Self {
        let len = v.len();
        Self { bytes: Arc::new(Bytes::Owned(v)), start: 0, len }
    }

    /// The sub-range `range` of these bytes, sharing them; `None` when it is out of bounds.
    pub fn slice(&self, range: std::ops::Range<usize>) -> Option<Self> {
        if range.start > range.end || range.end > self.len {
            return None;
        }
        Some(Self { bytes: self.bytes.clone(), start: self.start + range.start, len: range.len() })
    }

    /// Whether the bytes are pages of a memory-mapped file (not anonymous memory).
    pub fn is_mapped(&self) -> bool {
        matches!(*self.bytes, Bytes::Mmap(_))
    }

    /// Read these bytes' pages in now and map them (`MADV_POPULATE_READ`, Linux 5.14+; else
    /// a read-ahead hint), when the whole file fits in the memory the system has available:
    /// the first passes over weights read in place then take no page faults. A file larger
    /// than that is left to be read on demand. Returns whether it asked.
    pub fn prefault(&self) -> bool {
        #[cfg(target_os = "linux")]
        if let Bytes::Mmap(m) = &*self.bytes {
            if self.len == 0 || mem_available().is_none_or(|a| m.len() as u64 > a) {
                return false;
            }
            let page = 4096usize;
            let a = (m.as_ptr() as usize + self.start) & !(page - 1);
            let b = m.as_ptr() as usize + self.start + self.len;
            // SAFETY: the range lies inside the mapping (page-aligned down to its start, which
            // is page-aligned); both advices only read pages in, never change them.
            unsafe {
                if libc::madvise(a as *mut libc::c_void, b - a, libc::MADV_POPULATE_READ) != 0 {
                    libc::madvise(a as *mut libc::c_void, b - a, libc::MADV_WILLNEED);
                }
            }
            return true;
        }
        false
    }
}

/// `MemAvailable` of `/proc/meminfo`, in bytes.
#[cfg(target_os = "linux")]
fn mem_available() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

impl std::ops::Deref for MappedBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes[self.start..self.start + self.len]
    }
}

impl std::fmt::Debug for MappedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedBytes").field("len", &self.len).field("mapped", &self.is_mapped()).finish()
    }
}

/// An open GGUF file: its metadata, tensor directory and (mapped) data.
pub struct GgufFile {
    path: PathBuf,
    bytes: Arc<Bytes>,
    version: u32,
    metadata: BTreeMap<String, Value>,
    /// Metadata keys in file order (for faithful rewriting).
    key_order: Vec<String>,
    tensors: Vec<TensorInfo>,
    index: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
    limits: Limits,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata_keys", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

struct Cursor<'a> {
    path: &'a Path,
    buf: &'a [u8],
    pos: usize,
    limits: Limits,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        let end = (self.pos as u64).checked_add(n);
        match end {
            Some(end) if end <= self.buf.len() as u64 => {
                let s = &self.buf[self.pos..end as usize];
                self.pos = end as usize;
                Ok(s)
            }
            _ => Err(Error::Truncated {
                path: self.path.to_path_buf(),
                what: what(),
                offset: self.pos as u64,
                end: end.unwrap_or(u64::MAX),
                len: self.buf.len() as u64,
            }),
        }
    }
    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N]> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }
    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }
    fn malformed(&self, what: String) -> Error {
        Error::Malformed {
            path: self.path.to_path_buf(),
            what,
        }
    }
    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String> {
        let len = self.u64(what)?;
        let bytes = self.take(len, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_string()),
            Err(_) => {
                tracing::warn!(file = %self.path.display(), "{}: invalid UTF-8, replaced", what());
                Ok(String::from_utf8_lossy(bytes).into_owned())
            }
        }
    }
    fn value(&mut self, ty: ValueType, key: &str, depth: usize) -> Result<Value> {
        let what = || format!("value of metadata key '{key}'");
        Ok(match ty {
            ValueType::U8 => Value::U8(self.array::<1>(&what)?[0]),
            ValueType::I8 => Value::I8(self.array::<1>(&what)?[0] as i8),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(&what)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(&what)?)),
            ValueType::U32 => Value::U32(u32::from_le_bytes(self.array(&what)?)),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(&what)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(&what)?)),
            ValueType::U64 => Value::U64(u64::from_le_bytes(self.array(&what)?)),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(&what)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(&what)?)),
            ValueType::Bool => match self.array::<1>(&what)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(self.malformed(format!("metadata key '{key}': bool value {b}"))),
            },
            ValueType::String => Value::String(self.string(&what)?),
            ValueType::Array => {
                if depth >= MAX_DEPTH {
                    return Err(self.malformed(format!(
                        "metadata key '{key}': arrays nested deeper than {MAX_DEPTH}"
                    )));
                }
                let tid = self.u32(&what)?;
                let ety = ValueType::from_id(tid).ok_or_else(|| {
                    self.malformed(format!("metadata key '{key}': unknown array element type {tid}"))
                })?;
                let n = self.u64(&what)?;
                // Every element takes at least one byte: a count beyond the remaining bytes
                // is corrupt, and checking it first bounds the allocation below.
                if n > self.remaining() {
                    return Err(Error::Truncated {
                        path: self.path.to_path_buf(),
                        what: format!("array of {n} elements for metadata key '{key}'"),
                        offset: self.pos as u64,
                        end: (self.pos as u64).saturating_add(n),
                        len: self.buf.len() as u64,
                    });
                }
                self.limits.check(
                    self.path,
                    || format!("metadata key '{key}': array of {n} values"),
                    n.saturating_mul(std::mem::size_of::<Value>() as u64),
                )?;
                let mut v = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    v.push(self.value(ety, key, depth + 1)?);
                }
                Value::Array(ety, v)
            }
        })
    }
}

impl GgufFile {
    /// Open and memory-map a GGUF file, parsing its header and tensor directory.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(path, &Limits::default())
    }

    /// [`Self::open`] under `limits`: a metadata array or a dequantized tensor larger than
    /// [`Limits::max_alloc`] is an [`Error::Limit`].
    pub fn open_with(path: impl AsRef<Path>, limits: &Limits) -> Result<Self> {
        let path = path.as_ref();
        let io = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let bytes = if len == 0 {
            Bytes::Owned(Vec::new())
        } else {
            // SAFETY: the map is read-only; like every mmap user we rely on the file not being
            // truncated underneath us while it is open.
            Bytes::Mmap(unsafe { memmap2::Mmap::map(&file) }.map_err(io)?)
        };
        Self::parse(path.to_path_buf(), bytes, limits)
    }

    /// Parse a GGUF image held in memory (`name` is used in error messages).
    pub fn from_bytes(name: impl Into<PathBuf>, bytes: Vec<u8>) -> Result<Self> {
        Self::from_bytes_with(name, bytes, &Limits::default())
    }

    /// [`Self::from_bytes`] under `limits`.
    pub fn from_bytes_with(name: impl Into<PathBuf>, bytes: Vec<u8>, limits: &Limits) -> Result<Self> {
        Self::parse(name.into(), Bytes::Owned(bytes), limits)
    }

    fn parse(path: PathBuf, bytes: Bytes, limits: &Limits) -> Result<Self> {
        let mut c = Cursor {
            path: &path,
            buf: &bytes,
            pos: 0,
            limits: *limits,
        };
        if c.buf.len() < 4 || &c.buf[..4] != GGUF_MAGIC {
            return Err(Error::BadMagic {
                path: path.clone(),
                magic: c.buf[..c.buf.len().min(4)].to_vec(),
            });
        }
        c.pos = 4;
        let version = c.u32(&|| "version".into())?;
        if version != 2 && version != 3 {
            return Err(Error::UnsupportedVersion {
                path: path.clone(),
                version,
            });
        }
        let n_tensors = c.u64(&|| "tensor count".into())?;
        let n_kv = c.u64(&|| "metadata count".into())?;
        // A key/value pair takes at least 12 bytes and a tensor info at least 24.
        if n_kv.saturating_mul(12) > c.remaining() || n_tensors.saturating_mul(24) > c.remaining() {
            return Err(c.malformed(format!(
                "header claims {n_kv} metadata entries and {n_tensors} tensors, more than the {} bytes of the file can hold",
                c.buf.len()
            )));
        }
        let mut metadata = BTreeMap::new();
        let mut key_order = Vec::with_capacity(n_kv as usize);
        for i in 0..n_kv {
            let key = c.string(&|| format!("key of metadata entry {i}"))?;
            let tid = c.u32(&|| format!("type of metadata key '{key}'"))?;
            let ty = ValueType::from_id(tid)
                .ok_or_else(|| c.malformed(format!("metadata key '{key}' has unknown type {tid}")))?;
            let value = c.value(ty, &key, 0)?;
            if metadata.insert(key.clone(), value).is_some() {
                return Err(c.malformed(format!("duplicate metadata key '{key}'")));
            }
            key_order.push(key);
        }
        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_int() {
                Some(a) if a > 0 && (a as u64).is_power_of_two() && a <= 1 << 20 => a as u64,
                _ => {
                    return Err(c.malformed(format!(
                        "general.alignment = {} is not a power of two",
                        v.summary()
                    )))
                }
            },
        };
        let mut tensors = Vec::with_capacity(n_tensors as usize);
        let mut index = HashMap::with_capacity(n_tensors as usize);
        for i in 0..n_tensors {
            let name = c.string(&|| format!("name of tensor {i}"))?;
            let what = || format!("info of tensor '{name}'");
            let n_dims = c.u32(&what)?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(c.malformed(format!("tensor '{name}' has {n_dims} dimensions (1 to {MAX_DIMS} allowed)")));
            }
            let mut ne = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                ne.push(c.u64(&what)?);
            }
            let tid = c.u32(&what)?;
            let offset = c.u64(&what)?;
            let ggml_type = GgmlType::from_id(tid).ok_or_else(|| Error::UnknownGgmlType {
                path: path.clone(),
                tensor: name.clone(),
                id: tid,
            })?;
            // Bound the product of the non-zero dimensions: with a zero among them the element
            // count is 0, but a product taken in another order (candle's) would still overflow.
            ne.iter()
                .filter(|&&d| d != 0)
                .try_fold(1u64, |acc, &d| acc.checked_mul(d))
                .filter(|&n| n <= (1u64 << 40))
                .ok_or_else(|| c.malformed(format!("tensor '{name}' has absurd dimensions {ne:?}")))?;
            let n_elem: u64 = ne.iter().product();
            if ne[0] % ggml_type.block_layout().0 as u64 != 0 {
                return Err(c.malformed(format!(
                    "tensor '{name}': row length {} is not a multiple of the {ggml_type} block size {}",
                    ne[0],
                    ggml_type.block_layout().0
                )));
            }
            let size = ggml_type
                .bytes_for(n_elem)
                .ok_or_else(|| c.malformed(format!("tensor '{name}' size overflows")))?;
            if offset % alignment != 0 {
                return Err(c.malformed(format!(
                    "tensor '{name}' offset {offset} is not a multiple of the alignment {alignment}"
                )));
            }
            let shape: Vec<usize> = ne.iter().rev().map(|&d| d as usize).collect();
            if index.insert(name.clone(), tensors.len()).is_some() {
                return Err(c.malformed(format!("duplicate tensor name '{name}'")));
            }
            tensors.push(TensorInfo {
                name,
                shape,
                ggml_type,
                offset,
                size,
            });
        }
        let data_offset = (c.pos as u64).div_ceil(alignment) * alignment;
        let len = bytes.len() as u64;
        for t in &tensors {
            let start = data_offset.saturating_add(t.offset);
            let end = start.saturating_add(t.size);
            if end > len {
                return Err(Error::TensorOutOfBounds {
                    path: path.clone(),
                    tensor: t.name.clone(),
                    start,
                    end,
                    len,
                });
            }
        }
        Ok(Self {
            path,
            bytes: Arc::new(bytes),
            version,
            metadata,
            key_order,
            tensors,
            index,
            alignment,
            data_offset,
            limits: *limits,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
    pub fn version(&self) -> u32 {
        self.version
    }
    pub fn alignment(&self) -> u64 {
        self.alignment
    }
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }
    pub fn file_size(&self) -> u64 {
        self.bytes.len() as u64
    }
    pub fn metadata(&self) -> &BTreeMap<String, Value> {
        &self.metadata
    }
    /// Metadata in file order.
    pub fn metadata_ordered(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.key_order
            .iter()
            .filter_map(|k| self.metadata.get(k).map(|v| (k.as_str(), v)))
    }
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }
    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }
    pub fn contains_tensor(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    fn require(&self, key: &str) -> Result<&Value> {
        self.metadata.get(key).ok_or_else(|| Error::MissingKey {
            path: self.path.clone(),
            key: key.to_string(),
        })
    }

    fn key_type(&self, key: &str, expected: &'static str, v: &Value) -> Error {
        Error::KeyType {
            path: self.path.clone(),
            key: key.to_string(),
            expected,
            actual: v.value_type().name(),
        }
    }

    /// An integer key of any width.
    pub fn get_int(&self, key: &str) -> Result<i128> {
        let v = self.require(key)?;
        v.as_int().ok_or_else(|| self.key_type(key, "integer", v))
    }
    pub fn get_usize(&self, key: &str) -> Result<usize> {
        let v = self.require(key)?;
        v.as_int()
            .and_then(|i| usize::try_from(i).ok())
            .ok_or_else(|| self.key_type(key, "non-negative integer", v))
    }
    pub fn get_f64(&self, key: &str) -> Result<f64> {
        let v = self.require(key)?;
        v.as_f64().ok_or_else(|| self.key_type(key, "number", v))
    }
    pub fn get_str(&self, key: &str) -> Result<&str> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| self.key_type(key, "string", v))
    }
    pub fn get_array(&self, key: &str) -> Result<&[Value]> {
        let v = self.require(key)?;
        v.as_array().ok_or_else(|| self.key_type(key, "array", v))
    }
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>> {
        let arr = self.get_array(key)?;
        arr.iter()
            .map(|v| v.as_str().ok_or_else(|| self.key_type(key, "array of strings", v)))
            .collect()
    }
    /// `general.architecture` (e.g. `llama`, `qwen2`).
    pub fn architecture(&self) -> Result<&str> {
        self.get_str("general.architecture")
    }

    /// The raw bytes of a tensor.
    pub fn tensor_bytes(&self, name: &str) -> Result<&[u8]> {
        let t = self.info_or_err(name)?;
        let start = (self.data_offset + t.offset) as usize;
        Ok(&self.bytes[start..start + t.size as usize])
    }

    /// The stored bytes of a tensor as a view sharing the file's memory map (no copy).
    pub fn tensor_bytes_shared(&self, name: &str) -> Result<MappedBytes> {
        let t = self.info_or_err(name)?;
        let start = (self.data_offset + t.offset) as usize;
        Ok(MappedBytes { bytes: self.bytes.clone(), start, len: t.size as usize })
    }

    fn info_or_err(&self, name: &str) -> Result<&TensorInfo> {
        self.tensor_info(name).ok_or_else(|| Error::MissingTensor {
            path: self.path.clone(),
            tensor: name.to_string(),
        })
    }

    /// A tensor as a candle `QTensor`, kept in its stored (quantized) type.
    pub fn qtensor(&self, name: &str, device: &Device) -> Result<QTensor> {
        let t = self.info_or_err(name)?;
        let dtype = t.ggml_type.to_candle().ok_or_else(|| Error::UnsupportedGgmlType {
            path: self.path.clone(),
            tensor: name.to_string(),
            ty: t.ggml_type.name(),
        })?;
        let raw = self.tensor_bytes(name)?;
        // candle reinterprets the bytes as blocks: the start must be aligned for f32 / f16.
        // Data in a mapped file is aligned by construction; a misaligned buffer is copied.
        if (raw.as_ptr() as usize).is_multiple_of(8) {
            Ok(qtensor_from_ggml(dtype, raw, t.shape.clone(), device)?)
        } else {
            let mut aligned = vec![0u64; raw.len().div_ceil(8)];
            bytemuck::cast_slice_mut::<u64, u8>(&mut aligned)[..raw.len()].copy_from_slice(raw);
            let bytes = &bytemuck::cast_slice::<u64, u8>(&aligned)[..raw.len()];
            Ok(qtensor_from_ggml(dtype, bytes, t.shape.clone(), device)?)
        }
    }

    /// A tensor dequantized to f32.
    pub fn tensor(&self, name: &str, device: &Device) -> Result<Tensor> {
        let t = self.info_or_err(name)?;
        self.limits.check(
            &self.path,
            || format!("tensor '{name}' dequantized to f32"),
            (t.elem_count() as u64).saturating_mul(4),
        )?;
        Ok(self.qtensor(name, device)?.dequantize(device)?)
    }

    /// Like [`Self::qtensor`], checking the shape against what the caller expects.
    pub fn qtensor_checked(&self, name: &str, shape: &[usize], device: &Device) -> Result<QTensor> {
        let t = self.info_or_err(name)?;
        if t.shape != shape {
            return Err(Error::ShapeMismatch {
                path: self.path.clone(),
                tensor: name.to_string(),
                expected: shape.to_vec(),
                actual: t.shape.clone(),
            });
        }
        self.qtensor(name, device)
    }
}
