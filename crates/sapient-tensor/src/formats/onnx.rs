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

// ---------------------------------------------------------------------------------------------
// protobuf wire format

const VARINT: u8 = 0;
const I64: u8 = 1;
const LEN: u8 = 2;
const I32: u8 = 5;

fn wire_name(w: u8) -> &'static str {
    match w {
        0 => "varint",
        1 => "64-bit",
        2 => "length-delimited",
        3 => "start-group",
        4 => "end-group",
        5 => "32-bit",
        _ => "invalid",
    }
}

struct Parser<'a> {
    path: &'a Path,
    b: &'a [u8],
    arc: &'a Arc<Source>,
    limits: Limits,
}

/// A cursor over one message: `pos..end` of the file.
struct Msg {
    pos: usize,
    end: usize,
}

impl<'a> Parser<'a> {
    fn err(&self, what: &str, offset: usize, problem: impl Into<String>) -> Error {
        Error::Onnx {
            path: self.path.to_path_buf(),
            what: what.to_string(),
            offset: offset as u64,
            problem: problem.into(),
        }
    }

    fn varint(&self, m: &mut Msg, what: &str) -> Result<u64> {
        let start = m.pos;
        let mut v: u64 = 0;
        for i in 0..10 {
            if m.pos >= m.end {
                return Err(self.past_end(what, start, m.pos + 1, m.end));
            }
            let byte = self.b[m.pos];
            m.pos += 1;
            if i == 9 && byte > 1 {
                return Err(self.err(what, start, "varint longer than 64 bits"));
            }
            v |= ((byte & 0x7f) as u64) << (7 * i);
            if byte & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(self.err(what, start, "varint longer than 10 bytes"))
    }

    /// `needed_end` is past `limit` (the end of the enclosing message): truncated file or
    /// malformed length.
    fn past_end(&self, what: &str, offset: usize, needed_end: usize, limit: usize) -> Error {
        if needed_end > self.b.len() && limit == self.b.len() {
            Error::Truncated {
                path: self.path.to_path_buf(),
                what: format!("ONNX {what}"),
                offset: offset as u64,
                end: needed_end as u64,
                len: self.b.len() as u64,
            }
        } else {
            self.err(
                what,
                offset,
                format!("needs bytes up to {needed_end} but its enclosing message ends at {limit}"),
            )
        }
    }

    fn fixed(&self, m: &mut Msg, n: usize, what: &str) -> Result<Range<usize>> {
        let end = m.pos.saturating_add(n);
        if end > m.end {
            return Err(self.past_end(what, m.pos, end, m.end));
        }
        let r = m.pos..end;
        m.pos = end;
        Ok(r)
    }

    fn len_delim(&self, m: &mut Msg, what: &str) -> Result<Range<usize>> {
        let at = m.pos;
        let len = self.varint(m, what)?;
        let len = usize::try_from(len).map_err(|_| self.err(what, at, format!("length {len} does not fit in memory")))?;
        let end = m.pos.saturating_add(len);
        if end > m.end {
            return Err(self.past_end(what, at, end, m.end));
        }
        let r = m.pos..end;
        m.pos = end;
        Ok(r)
    }

    /// Next (field number, wire type), or None at the end of the message.
    fn key(&self, m: &mut Msg, msg: &str) -> Result<Option<(u64, u8)>> {
        if m.pos >= m.end {
            return Ok(None);
        }
        let at = m.pos;
        let k = self.varint(m, msg)?;
        let field = k >> 3;
        let wire = (k & 7) as u8;
        if field == 0 {
            return Err(self.err(msg, at, "field number 0"));
        }
        if !matches!(wire, VARINT | I64 | LEN | I32) {
            return Err(self.err(
                msg,
                at,
                format!("field {field} has wire type {wire} ({}), which ONNX never uses", wire_name(wire)),
            ));
        }
        Ok(Some((field, wire)))
    }

    fn skip(&self, m: &mut Msg, wire: u8, what: &str) -> Result<()> {
        match wire {
            VARINT => {
                self.varint(m, what)?;
            }
            I64 => {
                self.fixed(m, 8, what)?;
            }
            I32 => {
                self.fixed(m, 4, what)?;
            }
            _ => {
                self.len_delim(m, what)?;
            }
        }
        Ok(())
    }

    fn expect(&self, m: &Msg, wire: u8, want: u8, what: &str) -> Result<()> {
        if wire == want {
            Ok(())
        } else {
            Err(self.err(
                what,
                m.pos,
                format!("wire type {} ({}), expected {} ({})", wire, wire_name(wire), want, wire_name(want)),
            ))
        }
    }

    fn string(&self, m: &mut Msg, wire: u8, what: &str) -> Result<String> {
        self.expect(m, wire, LEN, what)?;
        let r = self.len_delim(m, what)?;
        let at = r.start;
        String::from_utf8(self.b[r].to_vec()).map_err(|_| self.err(what, at, "string is not UTF-8"))
    }

    fn bytes(&self, m: &mut Msg, wire: u8, what: &str) -> Result<Vec<u8>> {
        self.expect(m, wire, LEN, what)?;
        let r = self.len_delim(m, what)?;
        Ok(self.b[r].to_vec())
    }

    fn int(&self, m: &mut Msg, wire: u8, what: &str) -> Result<i64> {
        self.expect(m, wire, VARINT, what)?;
        Ok(self.varint(m, what)? as i64)
    }

    fn sub(&self, m: &mut Msg, wire: u8, what: &str) -> Result<Msg> {
        self.expect(m, wire, LEN, what)?;
        let r = self.len_delim(m, what)?;
        Ok(Msg { pos: r.start, end: r.end })
    }

    /// A repeated varint field, packed (wire 2) or not (wire 0); values appended to `out`.
    fn varints(&self, m: &mut Msg, wire: u8, what: &str, out: &mut Vec<u64>) -> Result<()> {
        match wire {
            VARINT => out.push(self.varint(m, what)?),
            LEN => {
                let r = self.len_delim(m, what)?;
                let mut p = Msg { pos: r.start, end: r.end };
                while p.pos < p.end {
                    out.push(self.varint(&mut p, what)?);
                }
            }
            _ => return self.expect(m, wire, VARINT, what),
        }
        Ok(())
    }

    /// A repeated fixed-width field (`N` bytes), packed or not; raw chunks appended to `out`.
    fn fixeds<const N: usize>(&self, m: &mut Msg, wire: u8, what: &str, out: &mut Vec<[u8; N]>) -> Result<()> {
        let single = if N == 4 { I32 } else { I64 };
        if wire == single {
            let r = self.fixed(m, N, what)?;
            let mut a = [0u8; N];
            a.copy_from_slice(&self.b[r]);
            out.push(a);
            return Ok(());
        }
        self.expect(m, wire, LEN, what)?;
        let r = self.len_delim(m, what)?;
        if r.len() % N != 0 {
            return Err(self.err(what, r.start, format!("packed length {} is not a multiple of {N}", r.len())));
        }
        out.extend(self.b[r].chunks_exact(N).map(|c| {
            let mut a = [0u8; N];
            a.copy_from_slice(c);
            a
        }));
        Ok(())
    }

    fn model(&self, r: Range<usize>) -> Result<OnnxModel> {
        let mut m = Msg { pos: r.start, end: r.end };
        let what = "ModelProto";
        let mut ir_version = None;
        let mut producer_name = String::new();
        let mut producer_version = String::new();
        let mut opset_import = Vec::new();
        let mut metadata = Vec::new();
        let mut graph = None;
        while let Some((field, wire)) = self.key(&mut m, what)? {
            match field {
                1 => ir_version = Some(self.int(&mut m, wire, "ModelProto.ir_version")?),
                2 => producer_name = self.string(&mut m, wire, "ModelProto.producer_name")?,
                3 => producer_version = self.string(&mut m, wire, "ModelProto.producer_version")?,
                7 => {
                    let mut g = self.sub(&mut m, wire, "ModelProto.graph")?;
                    graph = Some(self.graph(&mut g, "ModelProto.graph", 0)?);
                }
                8 => {
                    let w = format!("ModelProto.opset_import[{}]", opset_import.len());
                    let mut s = self.sub(&mut m, wire, &w)?;
                    let mut o = OpsetId {
                        domain: String::new(),
                        version: 0,
                    };
                    while let Some((f, wt)) = self.key(&mut s, &w)? {
                        match f {
                            1 => o.domain = self.string(&mut s, wt, &w)?,
                            2 => o.version = self.int(&mut s, wt, &w)?,
                            _ => self.skip(&mut s, wt, &w)?,
                        }
                    }
                    opset_import.push(o);
                }
                14 => {
                    let w = format!("ModelProto.metadata_props[{}]", metadata.len());
                    let mut s = self.sub(&mut m, wire, &w)?;
                    metadata.push(self.string_pair(&mut s, &w)?);
                }
                _ => self.skip(&mut m, wire, &format!("ModelProto field {field}"))?,
            }
        }
        let graph = graph.ok_or_else(|| self.err(what, r.start, "no graph: not an ONNX model (or an empty one)"))?;
        let ir_version = ir_version.ok_or_else(|| self.err(what, r.start, "no ir_version: not an ONNX model"))?;
        Ok(OnnxModel {
            path: PathBuf::new(),
            ir_version,
            producer_name,
            producer_version,
            opset_import,
            metadata,
            graph,
        })
    }

    fn string_pair(&self, s: &mut Msg, what: &str) -> Result<(String, String)> {
        let (mut k, mut v) = (String::new(), String::new());
        while let Some((f, wt)) = self.key(s, what)? {
            match f {
                1 => k = self.string(s, wt, what)?,
                2 => v = self.string(s, wt, what)?,
                _ => self.skip(s, wt, what)?,
            }
        }
        Ok((k, v))
    }

    fn graph(&self, m: &mut Msg, what: &str, depth: usize) -> Result<Graph> {
        if depth > MAX_GRAPH_DEPTH {
            return Err(self.err(what, m.pos, format!("subgraphs nested deeper than {MAX_GRAPH_DEPTH}")));
        }
        let mut g = Graph::default();
        while let Some((field, wire)) = self.key(m, what)? {
            match field {
                1 => {
                    let w = format!("{what}.node[{}]", g.nodes.len());
                    let mut s = self.sub(m, wire, &w)?;
                    g.nodes.push(self.node(&mut s, &w, depth)?);
                }
                2 => g.name = self.string(m, wire, &format!("{what}.name"))?,
                5 => {
                    let w = format!("{what}.initializer[{}]", g.initializers.len());
                    let mut s = self.sub(m, wire, &w)?;
                    g.initializers.push(self.tensor(&mut s, &w)?);
                }
                11..=13 => {
                    let list = match field {
                        11 => ("input", &mut g.inputs),
                        12 => ("output", &mut g.outputs),
                        _ => ("value_info", &mut g.value_info),
                    };
                    let w = format!("{what}.{}[{}]", list.0, list.1.len());
                    let mut s = self.sub(m, wire, &w)?;
                    list.1.push(self.value_info(&mut s, &w)?);
                }
                _ => self.skip(m, wire, &format!("{what} field {field}"))?,
            }
        }
        Ok(g)
    }

    fn node(&self, m: &mut Msg, what: &str, depth: usize) -> Result<Node> {
        let mut n = Node {
            name: String::new(),
            op_type: String::new(),
            domain: String::new(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            attributes: Vec::new(),
        };
        while let Some((field, wire)) = self.key(m, what)? {
            match field {
                1 => n.inputs.push(self.string(m, wire, &format!("{what}.input"))?),
                2 => n.outputs.push(self.string(m, wire, &format!("{what}.output"))?),
                3 => n.name = self.string(m, wire, &format!("{what}.name"))?,
                4 => n.op_type = self.string(m, wire, &format!("{what}.op_type"))?,
                7 => n.domain = self.string(m, wire, &format!("{what}.domain"))?,
                5 => {
                    let w = format!("{what}.attribute[{}]", n.attributes.len());
                    let mut s = self.sub(m, wire, &w)?;
                    n.attributes.push(self.attribute(&mut s, &w, depth)?);
                }
                _ => self.skip(m, wire, &format!("{what} field {field}"))?,
            }
        }
        if n.op_type.is_empty() {
            return Err(self.err(what, m.pos, format!("node '{}' has no op_type", n.name)));
        }
        Ok(n)
    }

    fn attribute(&self, m: &mut Msg, what: &str, depth: usize) -> Result<Attribute> {
        let mut name = String::new();
        let mut ty: Option<i32> = None;
        // the last singular value field seen, and the repeated ones (in case `type` is absent)
        let mut single: Option<AttributeValue> = None;
        let (mut floats, mut ints) = (Vec::<[u8; 4]>::new(), Vec::<u64>::new());
        let (mut strings, mut tensors, mut graphs) = (Vec::new(), Vec::new(), Vec::new());
        let mut seen_repeated: Option<i32> = None;
        while let Some((field, wire)) = self.key(m, what)? {
            match field {
                1 => name = self.string(m, wire, &format!("{what}.name"))?,
                20 => ty = Some(self.int(m, wire, &format!("{what}.type"))? as i32),
                2 => {
                    let w = format!("{what}.f");
                    self.expect(m, wire, I32, &w)?;
                    let r = self.fixed(m, 4, &w)?;
                    single = Some(AttributeValue::Float(f32::from_le_bytes([
                        self.b[r.start],
                        self.b[r.start + 1],
                        self.b[r.start + 2],
                        self.b[r.start + 3],
                    ])));
                }
                3 => single = Some(AttributeValue::Int(self.int(m, wire, &format!("{what}.i"))?)),
                4 => single = Some(AttributeValue::String(self.bytes(m, wire, &format!("{what}.s"))?)),
                5 => {
                    let w = format!("{what}.t");
                    let mut s = self.sub(m, wire, &w)?;
                    single = Some(AttributeValue::Tensor(self.tensor(&mut s, &w)?));
                }
                6 => {
                    let w = format!("{what}.g");
                    let mut s = self.sub(m, wire, &w)?;
                    single = Some(AttributeValue::Graph(Box::new(self.graph(&mut s, &w, depth + 1)?)));
                }
                7 => {
                    self.fixeds::<4>(m, wire, &format!("{what}.floats"), &mut floats)?;
                    seen_repeated = Some(6);
                }
                8 => {
                    self.varints(m, wire, &format!("{what}.ints"), &mut ints)?;
                    seen_repeated = Some(7);
                }
                9 => {
                    strings.push(self.bytes(m, wire, &format!("{what}.strings"))?);
                    seen_repeated = Some(8);
                }
                10 => {
                    let w = format!("{what}.tensors[{}]", tensors.len());
                    let mut s = self.sub(m, wire, &w)?;
                    tensors.push(self.tensor(&mut s, &w)?);
                    seen_repeated = Some(9);
                }
                11 => {
                    let w = format!("{what}.graphs[{}]", graphs.len());
                    let mut s = self.sub(m, wire, &w)?;
                    graphs.push(self.graph(&mut s, &w, depth + 1)?);
                    seen_repeated = Some(10);
                }
                _ => self.skip(m, wire, &format!("{what} field {field}"))?,
            }
        }
        let value = match ty.or(seen_repeated) {
            Some(6) => AttributeValue::Floats(floats.into_iter().map(f32::from_le_bytes).collect()),
            Some(7) => AttributeValue::Ints(ints.into_iter().map(|v| v as i64).collect()),
            Some(8) => AttributeValue::Strings(strings),
            Some(9) => AttributeValue::Tensors(tensors),
            Some(10) => AttributeValue::Graphs(graphs),
            Some(t @ (1..=5)) => match single {
                Some(v) if attr_kind(&v) == t => v,
                _ => {
                    return Err(self.err(
                        what,
                        m.pos,
                        format!("attribute '{name}' has type {t} but no matching value field"),
                    ))
                }
            },
            Some(other) if ty.is_some() => AttributeValue::Unsupported(other),
            _ => match single {
                Some(v) => v,
                None => AttributeValue::Unsupported(0),
            },
        };
        Ok(Attribute { name, value })
    }

    fn value_info(&self, m: &mut Msg, what: &str) -> Result<ValueInfo> {
        let mut v = ValueInfo {
            name: String::new(),
            elem_type: None,
            shape: None,
        };
        while let Some((field, wire)) = self.key(m, what)? {
            match field {
                1 => v.name = self.string(m, wire, &format!("{what}.name"))?,
                2 => {
                    // TypeProto { tensor_type = 1: { elem_type = 1, shape = 2 } }
                    let w = format!("{what}.type");
                    let mut tp = self.sub(m, wire, &w)?;
                    while let Some((f, wt)) = self.key(&mut tp, &w)? {
                        if f != 1 {
                            self.skip(&mut tp, wt, &w)?;
                            continue;
                        }
                        let w = format!("{w}.tensor_type");
                        let mut tt = self.sub(&mut tp, wt, &w)?;
                        while let Some((f, wt)) = self.key(&mut tt, &w)? {
                            match f {
                                1 => v.elem_type = Some(DataType::from_id(self.int(&mut tt, wt, &w)? as i32)),
                                2 => {
                                    let w = format!("{w}.shape");
                                    let mut sh = self.sub(&mut tt, wt, &w)?;
                                    let mut dims = Vec::new();
                                    while let Some((f, wt)) = self.key(&mut sh, &w)? {
                                        if f != 1 {
                                            self.skip(&mut sh, wt, &w)?;
                                            continue;
                                        }
                                        let w = format!("{w}.dim[{}]", dims.len());
                                        let mut d = self.sub(&mut sh, wt, &w)?;
                                        let mut dim = Dim::Unknown;
                                        while let Some((f, wt)) = self.key(&mut d, &w)? {
                                            match f {
                                                1 => dim = Dim::Value(self.int(&mut d, wt, &w)?),
                                                2 => dim = Dim::Param(self.string(&mut d, wt, &w)?),
                                                _ => self.skip(&mut d, wt, &w)?,
                                            }
                                        }
                                        dims.push(dim);
                                    }
                                    v.shape = Some(dims);
                                }
                                _ => self.skip(&mut tt, wt, &w)?,
                            }
                        }
                    }
                }
                _ => self.skip(m, wire, &format!("{what} field {field}"))?,
            }
        }
        Ok(v)
    }

    fn tensor(&self, m: &mut Msg, what: &str) -> Result<OnnxTensor> {
        let start = m.pos;
        let mut name = String::new();
        let mut dims_raw: Vec<u64> = Vec::new();
        let mut data_type = None;
        let mut raw: Option<Range<usize>> = None;
        let mut floats: Vec<[u8; 4]> = Vec::new();
        let mut doubles: Vec<[u8; 8]> = Vec::new();
        let (mut int32s, mut int64s, mut uint64s) = (Vec::<u64>::new(), Vec::<u64>::new(), Vec::<u64>::new());
        let mut strings: Vec<Vec<u8>> = Vec::new();
        let mut external = Vec::new();
        let mut location_external = false;
        let mut kinds = 0u32; // bit per data field seen
        while let Some((field, wire)) = self.key(m, what)? {
            match field {
                1 => self.varints(m, wire, &format!("{what}.dims"), &mut dims_raw)?,
                2 => data_type = Some(DataType::from_id(self.int(m, wire, &format!("{what}.data_type"))? as i32)),
                8 => name = self.string(m, wire, &format!("{what}.name"))?,
                9 => {
                    let w = format!("{what} ('{name}').raw_data");
                    self.expect(m, wire, LEN, &w)?;
                    raw = Some(self.len_delim(m, &w)?);
                    kinds |= 1;
                }
                4 => {
                    self.fixeds::<4>(m, wire, &format!("{what}.float_data"), &mut floats)?;
                    kinds |= 2;
                }
                5 => {
                    self.varints(m, wire, &format!("{what}.int32_data"), &mut int32s)?;
                    kinds |= 4;
                }
                6 => {
                    strings.push(self.bytes(m, wire, &format!("{what}.string_data"))?);
                    kinds |= 8;
                }
                7 => {
                    self.varints(m, wire, &format!("{what}.int64_data"), &mut int64s)?;
                    kinds |= 16;
                }
                10 => {
                    self.fixeds::<8>(m, wire, &format!("{what}.double_data"), &mut doubles)?;
                    kinds |= 32;
                }
                11 => {
                    self.varints(m, wire, &format!("{what}.uint64_data"), &mut uint64s)?;
                    kinds |= 64;
                }
                13 => {
                    let w = format!("{what}.external_data[{}]", external.len());
                    let mut s = self.sub(m, wire, &w)?;
                    external.push(self.string_pair(&mut s, &w)?);
                }
                14 => location_external = self.int(m, wire, &format!("{what}.data_location"))? == 1,
                3 => return Err(self.err(what, m.pos, format!("tensor '{name}' is a segment of a split tensor, which is not supported"))),
                _ => self.skip(m, wire, &format!("{what} field {field}"))?,
            }
        }
        let label = if name.is_empty() { what.to_string() } else { format!("{what} ('{name}')") };
        let data_type = data_type.ok_or_else(|| self.err(&label, start, "no data_type"))?;
        let mut dims = Vec::with_capacity(dims_raw.len());
        let mut count: usize = 1;
        for &d in &dims_raw {
            let d = d as i64;
            if d < 0 {
                return Err(self.err(&label, start, format!("negative dimension {d} in {dims_raw:?}")));
            }
            count = count
                .checked_mul(d as usize)
                .ok_or_else(|| self.err(&label, start, "element count overflows"))?;
            dims.push(d);
        }
        if kinds.count_ones() > 1 {
            return Err(self.err(&label, start, "more than one data field is set"));
        }
        self.limits
            .check(self.path, || format!("{label}: {count} values as f32"), (count as u64).saturating_mul(4))?;
        let data = if location_external {
            TensorData::External(external)
        } else if let Some(r) = raw {
            let size = data_type
                .size()
                .ok_or_else(|| self.err(&label, start, format!("raw_data for type {data_type:?}, which has no fixed size")))?;
            let want = count.saturating_mul(size);
            if r.len() != want {
                return Err(self.err(
                    &label,
                    r.start,
                    format!("raw_data has {} bytes, but dims {dims:?} of {data_type:?} need {want}", r.len()),
                ));
            }
            TensorData::Raw(r)
        } else {
            let (got, data) = match kinds {
                2 => (floats.len(), TensorData::Float(floats.into_iter().map(f32::from_le_bytes).collect())),
                4 => (int32s.len(), TensorData::Int32(int32s.into_iter().map(|v| v as i32).collect())),
                8 => (strings.len(), TensorData::String(strings)),
                16 => (int64s.len(), TensorData::Int64(int64s.into_iter().map(|v| v as i64).collect())),
                32 => (doubles.len(), TensorData::Double(doubles.into_iter().map(f64::from_le_bytes).collect())),
                64 => (uint64s.len(), TensorData::Uint64(uint64s)),
                _ => (0, TensorData::Empty),
            };
            if got != count && !(got == 0 && matches!(data, TensorData::Empty) && count == 0) {
                // complex types store two values per element
                let pairs = matches!(data_type, DataType::Complex64 | DataType::Complex128) && got == 2 * count;
                if !pairs {
                    return Err(self.err(
                        &label,
                        start,
                        format!("has {got} values, but dims {dims:?} need {count}"),
                    ));
                }
            }
            data
        };
        Ok(OnnxTensor {
            name,
            dims,
            data_type,
            data,
            src: Arc::clone(self.arc),
        })
    }
}

fn attr_kind(v: &AttributeValue) -> i32 {
    match v {
        AttributeValue::Float(_) => 1,
        AttributeValue::Int(_) => 2,
        AttributeValue::String(_) => 3,
        AttributeValue::Tensor(_) => 4,
        AttributeValue::Graph(_) => 5,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
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
