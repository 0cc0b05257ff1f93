//! Reading ONNX's protobuf wire format into the model's types, within the limits that keep
//! a malformed or hostile file from taking the process down.

use super::*;

pub(super) const VARINT: u8 = 0;
pub(super) const I64: u8 = 1;
pub(super) const LEN: u8 = 2;
pub(super) const I32: u8 = 5;

pub(super) fn wire_name(w: u8) -> &'static str {
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

pub(super) struct Parser<'a> {
    pub(super) path: &'a Path,
    pub(super) b: &'a [u8],
    pub(super) arc: &'a Arc<Source>,
    pub(super) limits: Limits,
}

/// A cursor over one message: `pos..end` of the file.
pub(super) struct Msg {
    pub(super) pos: usize,
    pub(super) end: usize,
}

impl<'a> Parser<'a> {
    pub(super) fn err(&self, what: &str, offset: usize, problem: impl Into<String>) -> Error {
        Error::Onnx {
            path: self.path.to_path_buf(),
            what: what.to_string(),
            offset: offset as u64,
            problem: problem.into(),
        }
    }

    pub(super) fn varint(&self, m: &mut Msg, what: &str) -> Result<u64> {
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
    pub(super) fn past_end(&self, what: &str, offset: usize, needed_end: usize, limit: usize) -> Error {
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

    pub(super) fn fixed(&self, m: &mut Msg, n: usize, what: &str) -> Result<Range<usize>> {
        let end = m.pos.saturating_add(n);
        if end > m.end {
            return Err(self.past_end(what, m.pos, end, m.end));
        }
        let r = m.pos..end;
        m.pos = end;
        Ok(r)
    }

    pub(super) fn len_delim(&self, m: &mut Msg, what: &str) -> Result<Range<usize>> {
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
    pub(super) fn key(&self, m: &mut Msg, msg: &str) -> Result<Option<(u64, u8)>> {
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

    pub(super) fn skip(&self, m: &mut Msg, wire: u8, what: &str) -> Result<()> {
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

    pub(super) fn expect(&self, m: &Msg, wire: u8, want: u8, what: &str) -> Result<()> {
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

    pub(super) fn string(&self, m: &mut Msg, wire: u8, what: &str) -> Result<String> {
        self.expect(m, wire, LEN, what)?;
        let r = self.len_delim(m, what)?;
        let at = r.start;
        String::from_utf8(self.b[r].to_vec()).map_err(|_| self.err(what, at, "string is not UTF-8"))
    }

    pub(super) fn bytes(&self, m: &mut Msg, wire: u8, what: &str) -> Result<Vec<u8>> {
        self.expect(m, wire, LEN, what)?;
        let r = self.len_delim(m, what)?;
        Ok(self.b[r].to_vec())
    }

    pub(super) fn int(&self, m: &mut Msg, wire: u8, what: &str) -> Result<i64> {
        self.expect(m, wire, VARINT, what)?;
        Ok(self.varint(m, what)? as i64)
    }

    pub(super) fn sub(&self, m: &mut Msg, wire: u8, what: &str) -> Result<Msg> {
        self.expect(m, wire, LEN, what)?;
        let r = self.len_delim(m, what)?;
        Ok(Msg { pos: r.start, end: r.end })
    }

    /// A repeated varint field, packed (wire 2) or not (wire 0); values appended to `out`.
    pub(super) fn varints(&self, m: &mut Msg, wire: u8, what: &str, out: &mut Vec<u64>) -> Result<()> {
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
    pub(super) fn fixeds<const N: usize>(&self, m: &mut Msg, wire: u8, what: &str, out: &mut Vec<[u8; N]>) -> Result<()> {
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

    pub(super) fn model(&self, r: Range<usize>) -> Result<OnnxModel> {
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

    pub(super) fn string_pair(&self, s: &mut Msg, what: &str) -> Result<(String, String)> {
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

    pub(super) fn graph(&self, m: &mut Msg, what: &str, depth: usize) -> Result<Graph> {
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

    pub(super) fn node(&self, m: &mut Msg, what: &str, depth: usize) -> Result<Node> {
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

    pub(super) fn attribute(&self, m: &mut Msg, what: &str, depth: usize) -> Result<Attribute> {
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

    pub(super) fn value_info(&self, m: &mut Msg, what: &str) -> Result<ValueInfo> {
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

    pub(super) fn tensor(&self, m: &mut Msg, what: &str) -> Result<OnnxTensor> {
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

pub(super) fn attr_kind(v: &AttributeValue) -> i32 {
    match v {
        AttributeValue::Float(_) => 1,
        AttributeValue::Int(_) => 2,
        AttributeValue::String(_) => 3,
        AttributeValue::Tensor(_) => 4,
        AttributeValue::Graph(_) => 5,
        _ => 0,
    }
}
