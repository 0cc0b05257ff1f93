//! A minimal ONNX reader: the protobuf messages a weight importer needs, parsed by hand.
//!
//! Read: `ModelProto` (ir_version, producer, opset_import, metadata_props, graph),
//! `GraphProto` (node, initializer, input, output, value_info), `NodeProto` (input, output,
//! name, op_type, domain, attribute), `AttributeProto` (every value kind; subgraphs are parsed
//! too, to a bounded depth), `TensorProto` (dims, data_type, raw_data or the typed
//! `*_data` fields, external data noted but not followed) and `ValueInfoProto` (tensor element
//! type and shape). Every other field is skipped by its wire type.
//!
//! Every read is bounds-checked: a length that runs past the end of the file is
//! [`Error::Truncated`] naming the field (`ModelProto.graph`, `GraphProto.initializer[12]`
//! ...); a length past the end of its enclosing message, a bad wire type, an overlong varint,
//! a tensor whose data does not match its dims and type are [`Error::Onnx`]. Tensor data is
//! not copied: `raw_data` stays a range of the (memory-mapped) file.

use crate::{Error, Limits, Result};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod wire;
use wire::Parser;

/// Subgraphs (If/Loop/Scan bodies) nest at most this deep.
const MAX_GRAPH_DEPTH: usize = 16;

enum Bytes {
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
}

/// The file's bytes and its path, shared by every tensor parsed from it.
struct Source {
    path: PathBuf,
    bytes: Bytes,
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

/// `TensorProto.DataType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    Float,
    Uint8,
    Int8,
    Uint16,
    Int16,
    Int32,
    Int64,
    String,
    Bool,
    Float16,
    Double,
    Uint32,
    Uint64,
    Complex64,
    Complex128,
    Bfloat16,
    /// Any other id (float8 variants, int4, undefined ...): kept, not decodable here.
    Other(i32),
}

impl DataType {
    pub fn from_id(id: i32) -> Self {
        match id {
            1 => Self::Float,
            2 => Self::Uint8,
            3 => Self::Int8,
            4 => Self::Uint16,
            5 => Self::Int16,
            6 => Self::Int32,
            7 => Self::Int64,
            8 => Self::String,
            9 => Self::Bool,
            10 => Self::Float16,
            11 => Self::Double,
            12 => Self::Uint32,
            13 => Self::Uint64,
            14 => Self::Complex64,
            15 => Self::Complex128,
            16 => Self::Bfloat16,
            other => Self::Other(other),
        }
    }

    /// Bytes per element in `raw_data` (None for strings and unknown types).
    pub fn size(self) -> Option<usize> {
        Some(match self {
            Self::Uint8 | Self::Int8 | Self::Bool => 1,
            Self::Uint16 | Self::Int16 | Self::Float16 | Self::Bfloat16 => 2,
            Self::Float | Self::Int32 | Self::Uint32 => 4,
            Self::Int64 | Self::Uint64 | Self::Double | Self::Complex64 => 8,
            Self::Complex128 => 16,
            Self::String | Self::Other(_) => return None,
        })
    }

    pub fn is_float(self) -> bool {
        matches!(self, Self::Float | Self::Float16 | Self::Bfloat16 | Self::Double)
    }
}

/// Where a tensor's values are.
#[derive(Debug, Clone, PartialEq)]
pub enum TensorData {
    /// `raw_data`: this byte range of the file, little-endian.
    Raw(Range<usize>),
    Float(Vec<f32>),
    /// `int32_data`: also holds int8/uint8/int16/uint16/bool values and float16/bfloat16 bits.
    Int32(Vec<i32>),
    Int64(Vec<i64>),
    Double(Vec<f64>),
    /// `uint64_data`: also holds uint32 values.
    Uint64(Vec<u64>),
    String(Vec<Vec<u8>>),
    /// `data_location: EXTERNAL`: the values are in another file (key/value pairs as given).
    External(Vec<(String, String)>),
    /// No data field at all (an empty tensor, or a tensor without values).
    Empty,
}

/// A `TensorProto`: an initializer, a `Constant` node's value, or a tensor attribute.
#[derive(Clone)]
pub struct OnnxTensor {
    pub name: String,
    pub dims: Vec<i64>,
    pub data_type: DataType,
    pub data: TensorData,
    src: Arc<Source>,
}

impl std::fmt::Debug for OnnxTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnnxTensor")
            .field("name", &self.name)
            .field("dims", &self.dims)
            .field("data_type", &self.data_type)
            .field("data", &self.data)
            .finish()
    }
}

/// A `NodeProto`.
#[derive(Debug, Clone)]
pub struct Node {
    pub name: String,
    pub op_type: String,
    pub domain: String,
    /// Input value names; an empty string is an omitted optional input.
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    pub attributes: Vec<Attribute>,
}

impl Node {
    pub fn attribute(&self, name: &str) -> Option<&AttributeValue> {
        self.attributes.iter().find(|a| a.name == name).map(|a| &a.value)
    }

    /// An `INT` attribute.
    pub fn attr_int(&self, name: &str) -> Option<i64> {
        match self.attribute(name)? {
            AttributeValue::Int(i) => Some(*i),
            _ => None,
        }
    }

    /// An `INTS` attribute.
    pub fn attr_ints(&self, name: &str) -> Option<&[i64]> {
        match self.attribute(name)? {
            AttributeValue::Ints(v) => Some(v),
            _ => None,
        }
    }

    /// A `FLOAT` attribute.
    pub fn attr_float(&self, name: &str) -> Option<f32> {
        match self.attribute(name)? {
            AttributeValue::Float(f) => Some(*f),
            _ => None,
        }
    }

    /// A `STRING` attribute (lossy UTF-8).
    pub fn attr_string(&self, name: &str) -> Option<String> {
        match self.attribute(name)? {
            AttributeValue::String(s) => Some(String::from_utf8_lossy(s).into_owned()),
            _ => None,
        }
    }

    /// A `TENSOR` attribute (a `Constant` node's `value`).
    pub fn attr_tensor(&self, name: &str) -> Option<&OnnxTensor> {
        match self.attribute(name)? {
            AttributeValue::Tensor(t) => Some(t),
            _ => None,
        }
    }
}

/// An `AttributeProto`.
#[derive(Debug, Clone)]
pub struct Attribute {
    pub name: String,
    pub value: AttributeValue,
}

#[derive(Debug, Clone)]
pub enum AttributeValue {
    Float(f32),
    Int(i64),
    String(Vec<u8>),
    Tensor(OnnxTensor),
    Graph(Box<Graph>),
    Floats(Vec<f32>),
    Ints(Vec<i64>),
    Strings(Vec<Vec<u8>>),
    Tensors(Vec<OnnxTensor>),
    Graphs(Vec<Graph>),
    /// A kind this reader does not decode (sparse tensors, type protos), by its type id.
    Unsupported(i32),
}

/// One dimension of a `ValueInfoProto` shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dim {
    Value(i64),
    Param(String),
    Unknown,
}

/// A `ValueInfoProto` (graph input/output): its name and, for tensors, element type and shape.
#[derive(Debug, Clone, PartialEq)]
pub struct ValueInfo {
    pub name: String,
    pub elem_type: Option<DataType>,
    pub shape: Option<Vec<Dim>>,
}

/// A `GraphProto`.
#[derive(Debug, Clone, Default)]
pub struct Graph {
    pub name: String,
    pub nodes: Vec<Node>,
    pub initializers: Vec<OnnxTensor>,
    pub inputs: Vec<ValueInfo>,
    pub outputs: Vec<ValueInfo>,
    pub value_info: Vec<ValueInfo>,
}

/// `OperatorSetIdProto`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpsetId {
    /// "" is the default `ai.onnx` domain.
    pub domain: String,
    pub version: i64,
}

/// A parsed ONNX model; tensors with `raw_data` point into the file's bytes.
pub struct OnnxModel {
    path: PathBuf,
    pub ir_version: i64,
    pub producer_name: String,
    pub producer_version: String,
    pub opset_import: Vec<OpsetId>,
    pub metadata: Vec<(String, String)>,
    pub graph: Graph,
}

impl std::fmt::Debug for OnnxModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnnxModel")
            .field("path", &self.path)
            .field("ir_version", &self.ir_version)
            .field("producer_name", &self.producer_name)
            .field("opset_import", &self.opset_import)
            .field("nodes", &self.graph.nodes.len())
            .field("initializers", &self.graph.initializers.len())
            .finish()
    }
}

impl OnnxModel {
    /// Maps and parses an `.onnx` file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(path, &Limits::default())
    }

    /// [`Self::open`] under `limits`: a tensor whose `f32` values would take more than
    /// [`Limits::max_alloc`] is an [`Error::Limit`].
    pub fn open_with(path: impl AsRef<Path>, limits: &Limits) -> Result<Self> {
        let path = path.as_ref();
        let io = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the map is read-only; like every reader of model files we assume the file is
        // not truncated underneath us while it is open.
        let mmap = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Self::parse(path.to_path_buf(), Bytes::Mmap(mmap), limits)
    }

    /// Parses a model held in memory; `path` only names it in errors.
    pub fn from_bytes(path: impl Into<PathBuf>, bytes: Vec<u8>) -> Result<Self> {
        Self::from_bytes_with(path, bytes, &Limits::default())
    }

    /// [`Self::from_bytes`] under `limits`.
    pub fn from_bytes_with(path: impl Into<PathBuf>, bytes: Vec<u8>, limits: &Limits) -> Result<Self> {
        Self::parse(path.into(), Bytes::Owned(bytes), limits)
    }

    fn parse(path: PathBuf, bytes: Bytes, limits: &Limits) -> Result<Self> {
        let src = Arc::new(Source { path, bytes });
        let p = Parser {
            path: &src.path,
            b: &src.bytes[..],
            arc: &src,
            limits: *limits,
        };
        let m = p.model(0..src.bytes.len())?;
        Ok(Self {
            path: src.path.clone(),
            ..m
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The opset version of a domain ("" or "ai.onnx" for the default one).
    pub fn opset(&self, domain: &str) -> Option<i64> {
        let want = if domain == "ai.onnx" { "" } else { domain };
        self.opset_import
            .iter()
            .find(|o| o.domain == want || (want.is_empty() && o.domain == "ai.onnx"))
            .map(|o| o.version)
    }
}

impl OnnxTensor {
    /// Number of elements (the product of the dims; 1 for a scalar).
    pub fn elem_count(&self) -> usize {
        // dims were checked non-negative and their product to fit in usize at parse time
        self.dims.iter().map(|&d| d as usize).product()
    }

    /// The shape as `usize`s.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().map(|&d| d as usize).collect()
    }

    /// The `raw_data` bytes, if the tensor stores its values there.
    pub fn raw(&self) -> Option<&[u8]> {
        match &self.data {
            TensorData::Raw(r) => self.src.bytes.get(r.clone()),
            _ => None,
        }
    }

    fn unsupported(&self, want: &str) -> Error {
        Error::Onnx {
            path: self.src.path.clone(),
            what: format!("tensor '{}'", self.name),
            offset: 0,
            problem: format!("cannot read {:?} data stored as {} as {want}", self.data_type, self.data_kind()),
        }
    }

    fn data_kind(&self) -> &'static str {
        match self.data {
            TensorData::Raw(_) => "raw_data",
            TensorData::Float(_) => "float_data",
            TensorData::Int32(_) => "int32_data",
            TensorData::Int64(_) => "int64_data",
            TensorData::Double(_) => "double_data",
            TensorData::Uint64(_) => "uint64_data",
            TensorData::String(_) => "string_data",
            TensorData::External(_) => "external data",
            TensorData::Empty => "no data",
        }
    }

    /// The values as `f32` (any numeric type; integers converted, float16/bfloat16 widened).
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        use DataType as D;
        let n = self.elem_count();
        if n == 0 {
            return Ok(Vec::new());
        }
        Ok(match (&self.data, self.data_type) {
            (TensorData::Raw(_), dt) => {
                let raw = self.raw().ok_or_else(|| self.unsupported("f32"))?;
                match dt {
                    D::Float => raw.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
                    D::Double => raw.chunks_exact(8).map(|c| f64::from_le_bytes(arr8(c)) as f32).collect(),
                    D::Float16 => raw
                        .chunks_exact(2)
                        .map(|c| half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
                        .collect(),
                    D::Bfloat16 => raw
                        .chunks_exact(2)
                        .map(|c| half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
                        .collect(),
                    D::Int8 => raw.iter().map(|&b| b as i8 as f32).collect(),
                    D::Uint8 | D::Bool => raw.iter().map(|&b| b as f32).collect(),
                    D::Int16 => raw.chunks_exact(2).map(|c| i16::from_le_bytes([c[0], c[1]]) as f32).collect(),
                    D::Uint16 => raw.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]]) as f32).collect(),
                    D::Int32 => raw.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f32).collect(),
                    D::Uint32 => raw.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f32).collect(),
                    D::Int64 => raw.chunks_exact(8).map(|c| i64::from_le_bytes(arr8(c)) as f32).collect(),
                    D::Uint64 => raw.chunks_exact(8).map(|c| u64::from_le_bytes(arr8(c)) as f32).collect(),
                    _ => return Err(self.unsupported("f32")),
                }
            }
            (TensorData::Float(v), _) => v.clone(),
            (TensorData::Double(v), _) => v.iter().map(|&x| x as f32).collect(),
            (TensorData::Int64(v), _) => v.iter().map(|&x| x as f32).collect(),
            (TensorData::Uint64(v), _) => v.iter().map(|&x| x as f32).collect(),
            (TensorData::Int32(v), D::Float16) => v.iter().map(|&x| half::f16::from_bits(x as u16).to_f32()).collect(),
            (TensorData::Int32(v), D::Bfloat16) => v.iter().map(|&x| half::bf16::from_bits(x as u16).to_f32()).collect(),
            (TensorData::Int32(v), D::Int8 | D::Uint8 | D::Int16 | D::Uint16 | D::Int32 | D::Bool) => {
                v.iter().map(|&x| x as f32).collect()
            }
            _ => return Err(self.unsupported("f32")),
        })
    }

    /// The values as `i64` (integer and bool types only).
    pub fn to_i64(&self) -> Result<Vec<i64>> {
        use DataType as D;
        if self.elem_count() == 0 {
            return Ok(Vec::new());
        }
        Ok(match (&self.data, self.data_type) {
            (TensorData::Raw(_), dt) => {
                let raw = self.raw().ok_or_else(|| self.unsupported("i64"))?;
                match dt {
                    D::Int8 => raw.iter().map(|&b| b as i8 as i64).collect(),
                    D::Uint8 | D::Bool => raw.iter().map(|&b| b as i64).collect(),
                    D::Int16 => raw.chunks_exact(2).map(|c| i16::from_le_bytes([c[0], c[1]]) as i64).collect(),
                    D::Uint16 => raw.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]]) as i64).collect(),
                    D::Int32 => raw.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64).collect(),
                    D::Uint32 => raw.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64).collect(),
                    D::Int64 => raw.chunks_exact(8).map(|c| i64::from_le_bytes(arr8(c))).collect(),
                    _ => return Err(self.unsupported("i64")),
                }
            }
            (TensorData::Int64(v), _) => v.clone(),
            (TensorData::Uint64(v), D::Uint32) => v.iter().map(|&x| x as i64).collect(),
            (TensorData::Int32(v), D::Int8 | D::Uint8 | D::Int16 | D::Uint16 | D::Int32 | D::Bool) => {
                v.iter().map(|&x| x as i64).collect()
            }
            _ => return Err(self.unsupported("i64")),
        })
    }

    /// A float tensor as a candle `f32` tensor on the CPU.
    pub fn to_candle_f32(&self) -> Result<candle_core::Tensor> {
        let v = self.to_f32()?;
        Ok(candle_core::Tensor::from_vec(v, self.shape(), &candle_core::Device::Cpu)?)
    }
}

fn arr8(c: &[u8]) -> [u8; 8] {
    let mut a = [0u8; 8];
    a.copy_from_slice(c);
    a
}

#[cfg(test)]
mod tests {
    use super::wire::Msg;
    use super::*;

    // The protobuf writer the integration tests use too (declared in formats/mod.rs).
    use crate::formats::protobuf::{field_bytes, field_int, varint};

    #[test]
    fn varint_limits() {
        let p = PathBuf::from("x");
        let arc = Arc::new(Source { path: p.clone(), bytes: Bytes::Owned(vec![]) });
        let ok = {
            let mut b = Vec::new();
            varint(u64::MAX, &mut b);
            b
        };
        assert_eq!(ok.len(), 10);
        let parser = Parser { path: &p, b: &ok, arc: &arc, limits: Limits::default() };
        let mut m = Msg { pos: 0, end: ok.len() };
        assert_eq!(parser.varint(&mut m, "v").unwrap(), u64::MAX);
        let bad = vec![0xff; 11];
        let parser = Parser { path: &p, b: &bad, arc: &arc, limits: Limits::default() };
        let mut m = Msg { pos: 0, end: bad.len() };
        assert!(matches!(parser.varint(&mut m, "v"), Err(Error::Onnx { .. })));
    }

    #[test]
    fn unpacked_and_packed_dims_agree() {
        let mut t1 = Vec::new();
        field_int(1, 2, &mut t1);
        field_int(1, 3, &mut t1);
        field_int(2, 1, &mut t1);
        let mut t2 = Vec::new();
        field_bytes(1, &[2, 3], &mut t2);
        field_int(2, 1, &mut t2);
        for mut t in [t1, t2] {
            let mut fl = Vec::new();
            for i in 0..6 {
                fl.extend_from_slice(&(i as f32).to_le_bytes());
            }
            field_bytes(4, &fl, &mut t);
            let p = PathBuf::from("x");
            let arc = Arc::new(Source { path: p.clone(), bytes: Bytes::Owned(t.clone()) });
            let parser = Parser { path: &p, b: &t, arc: &arc, limits: Limits::default() };
            let mut m = Msg { pos: 0, end: t.len() };
            let tensor = parser.tensor(&mut m, "t").unwrap();
            assert_eq!(tensor.dims, vec![2, 3]);
            assert_eq!(tensor.to_f32().unwrap(), vec![0., 1., 2., 3., 4., 5.]);
        }
    }
}
