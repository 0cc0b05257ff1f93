//! Kokoro's int8 ONNX export (kokoro-onnx `kokoro-v1.0.int8.onnx`) to PyTorch-named f32
//! tensors: dequantized, laid out as `KModel`'s parameters, every weight of the graph
//! accounted for. The rules are documented in `docs/kokoro.md`; in short:
//!
//! - **Dequantization** `(q - zero_point) * scale`, per tensor or per channel, with the
//!   zero point and scale the graph feeds the consuming op: `MatMulInteger` (weight `B` is
//!   `[in, out]`, per-column scale found through `Cast -> Mul(scale_x * scale_w)`),
//!   `ConvInteger` (same way, through the optional integer bias `Add`), `DynamicQuantizeLSTM`
//!   (its `W_scale`/`W_zero_point`/`R_scale`/`R_zero_point` inputs, per direction) and
//!   `DequantizeLinear` after a `Gather` of a quantized embedding table.
//! - **Layout**: `MatMul`/`MatMulInteger` weights are transposed back to `nn.Linear`'s
//!   `[out, in]`; LSTM weights go from ONNX's `[dir, in, 4h]` (gates i, o, f, c) to PyTorch's
//!   `weight_ih_l0[_reverse]` `[4h, in]` (gates i, f, g, o), and `B` is split into
//!   `bias_ih`/`bias_hh`.
//! - **Names**: an initializer that keeps its PyTorch name keeps it (`encoder.` and
//!   `decoder.decoder.` prefixes of the export's wrapper module become `""` and `decoder.`);
//!   `onnx::*` and graph-path constants (`/encoder/F0.1/Mul_1_output_0`) get the name of the
//!   module whose op consumes them, from the op's scope (`/encoder/F0.1/conv1/Conv_quant`
//!   -> `predictor.F0.1.conv1.weight`), resolved against [`crate::params::expected_params`]
//!   (a scope that is a suffix of exactly one module resolves to it: the export drops
//!   `predictor` from scopes called through `F0Ntrain`). Where a bias is wired to the same op
//!   its PyTorch name must agree.
//! - **Accounting**: every float or quantized initializer ends up mapped, as the quantization
//!   data of a mapped weight, or as a documented non-parameter constant (fills such as
//!   LayerNorm's ones, `1/alpha` of a mapped Snake `alpha`, small arithmetic constants, the
//!   export's STFT bases); anything else is an error, as is a missing or mis-shaped parameter.

use crate::config::KokoroConfig;
use crate::params::{expected_params, ParamSpec};
use crate::{Error, Result};
use candle_core::{DType, Device, Tensor};
use sapient_tensor::onnx::{DataType, Node, OnnxModel, OnnxTensor};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

/// A parameter recovered from the graph.
#[derive(Debug, Clone)]
pub struct Mapped {
    pub name: String,
    pub shape: Vec<usize>,
    /// The initializers it was computed from (quantized data first).
    pub sources: Vec<String>,
    /// How: "float", "MatMulInteger", "ConvInteger", "DynamicQuantizeLSTM", "DequantizeLinear",
    /// "MatMul" (float, transposed).
    pub how: &'static str,
}

/// What became of every initializer of the graph.
#[derive(Debug, Default, Clone)]
pub struct ImportReport {
    pub mapped: Vec<Mapped>,
    /// Scales and zero points consumed by a mapped weight's dequantization.
    pub quant_params: Vec<String>,
    /// Float initializers that are not parameters, with the reason.
    pub constants: Vec<(String, String)>,
    /// Integer initializers that are not weights (shapes, axes, indices).
    pub int_constants: Vec<String>,
    /// Expected parameters the export does not have (only optional ones; others are errors).
    pub absent_optional: Vec<String>,
}

impl ImportReport {
    pub fn param_count(&self) -> usize {
        self.mapped.iter().map(|m| m.shape.iter().product::<usize>()).sum()
    }
}

/// The import: PyTorch-named f32 tensors (CPU) and the report.
pub struct Imported {
    pub tensors: BTreeMap<String, Tensor>,
    pub report: ImportReport,
}

struct Ctx<'a> {
    path: &'a Path,
    nodes: &'a [Node],
    init: HashMap<&'a str, &'a OnnxTensor>,
    producer: HashMap<&'a str, usize>,
    consumers: HashMap<&'a str, Vec<usize>>,
    /// expected parameter names -> spec, and every module prefix of them
    spec: HashMap<String, ParamSpec>,
    modules: HashSet<String>,
}

/// A weight as imported: f32 values, or the quantized bytes with what dequantizes them
/// (a quarter of the memory; [`Param::to_tensor`] dequantizes when the model is built).
#[derive(Debug, Clone, PartialEq)]
pub struct Param {
    shape: Vec<usize>,
    data: Data,
}

#[derive(Debug, Clone, PartialEq)]
enum Data {
    F32(Vec<f32>),
    Q(Quantized),
}

/// Quantized values: element `i` is `(q[i] - zero[c]) * scale[c]` with
/// `c = (i / inner) % channels` (one scale or zero point: the same for every element).
#[derive(Debug, Clone, PartialEq)]
struct Quantized {
    /// int8 (as its bytes) or uint8
    q: Vec<u8>,
    signed: bool,
    scale: Vec<f32>,
    zero: Vec<f32>,
    inner: usize,
}

impl Quantized {
    fn value(&self, i: usize, v: u8) -> f32 {
        let qv = if self.signed { f32::from(v as i8) } else { f32::from(v) };
        let pick = |t: &[f32]| if t.len() == 1 { t[0] } else { t[(i / self.inner.max(1)) % t.len()] };
        (qv - pick(&self.zero)) * pick(&self.scale)
    }

    fn to_f32(&self) -> Vec<f32> {
        self.q.iter().enumerate().map(|(i, &v)| self.value(i, v)).collect()
    }

    fn per_tensor(&self) -> bool {
        self.scale.len() == 1 && self.zero.len() == 1
    }

    /// Elements `range` (whole channels or a per-tensor quantization) as their own tensor.
    fn slice(&self, range: std::ops::Range<usize>) -> Quantized {
        let c = (range.start / self.inner.max(1)) % self.scale.len().max(self.zero.len()).max(1);
        let pick = |t: &[f32]| if t.len() == 1 { t[0] } else { t[c] };
        Quantized {
            q: self.q[range].to_vec(),
            signed: self.signed,
            scale: vec![pick(&self.scale)],
            zero: vec![pick(&self.zero)],
            inner: 1,
        }
    }

    /// The row-major `[rows, cols]` matrix transposed; quantized per tensor or per column.
    fn transposed(&self, rows: usize, cols: usize) -> Result<Quantized, String> {
        let inner = if self.per_tensor() {
            1
        } else if self.inner == 1 && self.scale.len().max(self.zero.len()) == cols {
            rows
        } else {
            return Err(format!("a [{rows}, {cols}] matrix quantized along neither the whole tensor nor its columns"));
        };
        Ok(Quantized { q: transpose(&self.q, rows, cols), inner, ..self.clone() })
    }
}

impl Param {
    fn f32(shape: Vec<usize>, data: Vec<f32>) -> Self {
        Self { shape, data: Data::F32(data) }
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn elem_count(&self) -> usize {
        self.shape.iter().product()
    }

    /// The f32 values (dequantized when quantized).
    pub fn values(&self) -> Vec<f32> {
        match &self.data {
            Data::F32(v) => v.clone(),
            Data::Q(q) => q.to_f32(),
        }
    }

    /// The values as a CPU f32 tensor.
    pub fn to_tensor(&self) -> Result<Tensor> {
        Ok(Tensor::from_vec(self.values(), self.shape.as_slice(), &Device::Cpu)?)
    }
}

/// The import with quantized weights left quantized (see [`import_compact`]).
pub struct ImportedCompact {
    pub params: BTreeMap<String, Param>,
    pub report: ImportReport,
}

impl<'a> Ctx<'a> {
    fn err(&self, what: impl Into<String>) -> Error {
        Error::Import {
            path: self.path.to_path_buf(),
            what: what.into(),
        }
    }

    fn init(&self, name: &str) -> Option<&'a OnnxTensor> {
        self.init.get(name).copied()
    }

    fn need_init(&self, node: &Node, idx: usize, what: &str) -> Result<&'a OnnxTensor> {
        let name = node.inputs.get(idx).map(String::as_str).unwrap_or("");
        self.init(name).ok_or_else(|| {
            self.err(format!(
                "{} '{}': input {idx} ({what}) '{name}' is not an initializer",
                node.op_type, node.name
            ))
        })
    }

    fn consumers_of(&self, value: &str) -> impl Iterator<Item = &'a Node> + '_ {
        self.consumers.get(value).into_iter().flatten().map(|&i| &self.nodes[i])
    }

    fn producer_of(&self, value: &str) -> Option<&'a Node> {
        self.producer.get(value).map(|&i| &self.nodes[i])
    }

    /// Follows an integer op's output (`[Add int bias] -> Cast -> Mul(_, S)`) to the weight's
    /// scale initializer (`S = Mul(x_scale, w_scale)`), and the float bias when the op has a
    /// quantized bias `Add` (`Reshape <- Cast <- Floor <- Div(bias, S)`).
    fn follow_scale(&self, node: &'a Node) -> Result<(&'a OnnxTensor, Option<&'a str>)> {
        let ctx = || format!("{} '{}'", node.op_type, node.name);
        let mut value = node.outputs.first().map(String::as_str).unwrap_or("");
        let mut bias = None;
        for _ in 0..4 {
            let next: Vec<&'a Node> = self.consumers_of(value).collect();
            let &[n] = next.as_slice() else {
                return Err(self.err(format!("{}: output '{value}' has {} consumers, expected one", ctx(), next.len())));
            };
            match n.op_type.as_str() {
                "Cast" => value = &n.outputs[0],
                "Add" if bias.is_none() => {
                    let other = n.inputs.iter().find(|i| i.as_str() != value).map(String::as_str).unwrap_or("");
                    bias = Some(self.trace_bias(other).ok_or_else(|| {
                        self.err(format!("{}: integer bias '{other}' does not come from a float bias initializer", ctx()))
                    })?);
                    value = &n.outputs[0];
                }
                "Mul" => {
                    let s = n.inputs.iter().find(|i| i.as_str() != value).map(String::as_str).unwrap_or("");
                    let prod = self.producer_of(s).filter(|p| p.op_type == "Mul").ok_or_else(|| {
                        self.err(format!("{}: output scale '{s}' is not a product of the input and weight scales", ctx()))
                    })?;
                    let inits: Vec<&OnnxTensor> = prod.inputs.iter().filter_map(|i| self.init(i)).collect();
                    let [w] = inits.as_slice() else {
                        return Err(self.err(format!("{}: scale product '{}' has {} initializer inputs, expected one (the weight scale)", ctx(), prod.name, inits.len())));
                    };
                    return Ok((w, bias));
                }
                other => return Err(self.err(format!("{}: unexpected {other} '{}' between the integer op and its scale", ctx(), n.name))),
            }
        }
        Err(self.err(format!("{}: no scale multiplication within 4 ops", ctx())))
    }

    /// `value` <- ... <- `Div(bias_initializer, scale)`: the bias initializer's name.
    fn trace_bias(&self, value: &str) -> Option<&'a str> {
        let mut p = self.producer_of(value)?;
        for _ in 0..6 {
            if p.op_type == "Div" {
                let b = p.inputs.first()?;
                return self.init(b).map(|t| t.name.as_str());
            }
            p = self.producer_of(p.inputs.first()?)?;
        }
        None
    }

    /// The module a node belongs to, from its scope (`/encoder/F0.1/conv1/Conv_quant`),
    /// resolved against the expected modules.
    fn scope_module(&self, node: &Node) -> Result<String> {
        let segs: Vec<&str> = node.name.split('/').filter(|s| !s.is_empty()).collect();
        let Some((_op, scope)) = segs.split_last() else {
            return Err(self.err(format!("{} node '{}' has no scope in its name", node.op_type, node.name)));
        };
        let mut path: Vec<String> = Vec::new();
        let mut rest = scope;
        // the export's wrapper: /encoder/... is KModel itself, /decoder/decoder/... its decoder
        match rest {
            ["encoder", tail @ ..] => rest = tail,
            ["decoder", "decoder", tail @ ..] => {
                path.push("decoder".into());
                rest = tail;
            }
            _ => return Err(self.err(format!("node '{}': scope outside /encoder and /decoder/decoder", node.name))),
        }
        for seg in rest {
            // `attention_1`: the second call of a shared module
            let seg = strip_call_suffix(seg);
            // `cnn.0` then `cnn.0.0`: a Sequential's child repeats its parent's path
            if let Some(last) = path.last() {
                if seg.starts_with(&format!("{last}.")) {
                    path.pop();
                }
            }
            path.push(seg.to_string());
        }
        let joined = path.join(".");
        if self.modules.contains(&joined) {
            return Ok(joined);
        }
        let suffix = format!(".{joined}");
        let cands: Vec<&String> = self.modules.iter().filter(|m| m.ends_with(&suffix)).collect();
        match cands.as_slice() {
            [one] => Ok((*one).clone()),
            [] => Err(self.err(format!("node '{}': scope '{joined}' is no module of Kokoro", node.name))),
            many => Err(self.err(format!("node '{}': scope '{joined}' is ambiguous: {many:?}", node.name))),
        }
    }
}

fn strip_call_suffix(seg: &str) -> &str {
    match seg.rsplit_once('_') {
        Some((head, n)) if !head.is_empty() && !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => head,
        _ => seg,
    }
}

/// An export name with a PyTorch name in it (`encoder.bert...`, `decoder.decoder.x`), mapped
/// to `KModel`'s name; None for `onnx::*` and graph-path names.
pub fn pytorch_name(export_name: &str) -> Option<String> {
    if export_name.starts_with('/') || export_name.contains("::") || export_name.contains(':') {
        return None;
    }
    if let Some(rest) = export_name.strip_prefix("decoder.decoder.") {
        return Some(format!("decoder.{rest}"));
    }
    export_name.strip_prefix("encoder.").map(str::to_string)
}

fn shape_of(t: &OnnxTensor) -> Vec<usize> {
    t.shape()
}

/// `(q - zero_point) * scale`, with the scale/zero point per tensor (one element) or per
/// index of `axis`.
pub fn dequantize(q: &OnnxTensor, scale: &OnnxTensor, zero_point: Option<&OnnxTensor>, axis: usize) -> Result<Vec<f32>, String> {
    quantized(q, scale, zero_point, axis).map(|q| q.to_f32())
}

/// [`dequantize`]'s operands kept as bytes, scales and zero points.
fn quantized(q: &OnnxTensor, scale: &OnnxTensor, zero_point: Option<&OnnxTensor>, axis: usize) -> Result<Quantized, String> {
    let bad = |what: String| format!("dequantizing '{}': {what}", q.name);
    if !matches!(q.data_type, DataType::Int8 | DataType::Uint8) {
        return Err(bad(format!("quantized data is {:?}, expected int8 or uint8", q.data_type)));
    }
    let dims = q.shape();
    let signed = q.data_type == DataType::Int8;
    // The stored bytes as they are; values kept in other fields (int32_data) through f32.
    let bytes: Vec<u8> = match q.raw() {
        Some(raw) if q.elem_count() > 0 => raw.to_vec(),
        _ => q.to_f32().map_err(|e| e.to_string())?.iter().map(|&v| if signed { (v as i8) as u8 } else { v as u8 }).collect(),
    };
    let s = scale.to_f32().map_err(|e| e.to_string())?;
    let z = match zero_point {
        Some(z) => z.to_f32().map_err(|e| e.to_string())?,
        None => vec![0.0],
    };
    if s.is_empty() || z.is_empty() {
        return Err(bad("empty scale or zero point".into()));
    }
    let per = if s.len() == 1 && z.len() == 1 {
        1
    } else {
        let n = dims.get(axis).copied().unwrap_or(0);
        for (what, len) in [("scale", s.len()), ("zero point", z.len())] {
            if len != 1 && len != n {
                return Err(bad(format!("{what} has {len} values; per-channel along axis {axis} of {dims:?} needs {n}")));
            }
        }
        n
    };
    let inner: usize = if per <= 1 { 1 } else { dims[axis + 1..].iter().product() };
    Ok(Quantized { q: bytes, signed, scale: s, zero: z, inner })
}

/// Transposes a row-major `[rows, cols]` matrix.
fn transpose<T: Copy + Default>(data: &[T], rows: usize, cols: usize) -> Vec<T> {
    let mut out = vec![T::default(); data.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = data[r * cols + c];
        }
    }
    out
}

/// ONNX LSTM gate blocks (i, o, f, c) -> PyTorch (i, f, g, o), rows of `cols` values.
fn reorder_gates<T: Copy>(rows_data: &[T], hidden: usize, cols: usize) -> Vec<T> {
    let block = hidden * cols;
    let mut out = Vec::with_capacity(rows_data.len());
    for onnx_gate in [0usize, 2, 3, 1] {
        out.extend_from_slice(&rows_data[onnx_gate * block..(onnx_gate + 1) * block]);
    }
    out
}

struct Out<'a> {
    ctx: &'a Ctx<'a>,
    tensors: BTreeMap<String, Param>,
    report: ImportReport,
    /// initializer name -> the parameter(s) it went into
    used: HashMap<String, String>,
    quant: HashSet<String>,
}

impl<'a> Out<'a> {
    fn add(&mut self, name: String, raw: Param, sources: Vec<String>, how: &'static str) -> Result<()> {
        if let Some(prev) = self.tensors.get(&name) {
            // a weight shared by several ops (ALBERT's one layer run 12 times): same values
            if prev.shape == raw.shape && (prev.data == raw.data || prev.values() == raw.values()) {
                return Ok(());
            }
            return Err(self.ctx.err(format!("two different tensors map to '{name}' (from {sources:?})")));
        }
        for s in &sources {
            // an LSTM's B feeds four parameters; deduplicated zero points feed many
            self.used.entry(s.clone()).or_insert_with(|| name.clone());
        }
        self.report.mapped.push(Mapped {
            name: name.clone(),
            shape: raw.shape.clone(),
            sources,
            how,
        });
        self.tensors.insert(name, raw);
        Ok(())
    }

    fn quant_params(&mut self, names: &[&str]) {
        for n in names {
            if !n.is_empty() {
                self.quant.insert(n.to_string());
            }
        }
    }
}

/// Imports the graph's weights under `KModel` names, checked against `cfg`'s parameter list.
pub fn import(model: &OnnxModel, cfg: &KokoroConfig) -> Result<Imported> {
    let compact = import_compact(model, cfg)?;
    let mut tensors = BTreeMap::new();
    for (name, p) in compact.params {
        tensors.insert(name, p.to_tensor()?);
    }
    Ok(Imported { tensors, report: compact.report })
}

/// [`import`] with the quantized weights kept quantized (one byte a value instead of four
/// until each is dequantized by [`Param::to_tensor`]).
pub fn import_compact(model: &OnnxModel, cfg: &KokoroConfig) -> Result<ImportedCompact> {
    let g = &model.graph;
    let specs = expected_params(cfg);
    let mut modules = HashSet::new();
    for s in &specs {
        let mut m = s.name.as_str();
        while let Some((head, _)) = m.rsplit_once('.') {
            modules.insert(head.to_string());
            m = head;
        }
    }
    let mut ctx = Ctx {
        path: model.path(),
        nodes: &g.nodes,
        init: g.initializers.iter().map(|t| (t.name.as_str(), t)).collect(),
        producer: HashMap::new(),
        consumers: HashMap::new(),
        spec: specs.iter().map(|s| (s.name.clone(), s.clone())).collect(),
        modules,
    };
    for (i, n) in g.nodes.iter().enumerate() {
        for o in &n.outputs {
            ctx.producer.insert(o.as_str(), i);
        }
        for inp in &n.inputs {
            if !inp.is_empty() {
                ctx.consumers.entry(inp.as_str()).or_default().push(i);
            }
        }
    }
    let ctx = ctx;
    let mut out = Out {
        ctx: &ctx,
        tensors: BTreeMap::new(),
        report: ImportReport::default(),
        used: HashMap::new(),
        quant: HashSet::new(),
    };

    for node in &g.nodes {
        match node.op_type.as_str() {
            "MatMulInteger" => {
                let b = ctx.need_init(node, 1, "B")?;
                let zp = node.inputs.get(3).and_then(|n| ctx.init(n));
                let (scale, _) = ctx.follow_scale(node)?;
                let [k, n] = shape_of(b)[..] else {
                    return Err(ctx.err(format!("MatMulInteger '{}': weight '{}' is not 2-D", node.name, b.name)));
                };
                let deq = quantized(b, scale, zp, 1).and_then(|q| q.transposed(k, n)).map_err(|e| ctx.err(format!("'{}': {e}", b.name)))?;
                let name = match b.name.strip_suffix("_quantized").and_then(pytorch_name) {
                    Some(n) => n,
                    None => format!("{}.weight", ctx.scope_module(node)?),
                };
                let mut src = vec![b.name.clone(), scale.name.clone()];
                src.extend(zp.map(|z| z.name.clone()));
                out.quant_params(&[scale.name.as_str(), zp.map(|z| z.name.as_str()).unwrap_or("")]);
                out.add(name, Param { shape: vec![n, k], data: Data::Q(deq) }, src, "MatMulInteger")?;
            }
            "ConvInteger" => {
                let w = ctx.need_init(node, 1, "w")?;
                let zp = node.inputs.get(3).and_then(|n| ctx.init(n));
                let (scale, bias) = ctx.follow_scale(node)?;
                let deq = quantized(w, scale, zp, 0).map_err(|e| ctx.err(e))?;
                let module = match w.name.strip_suffix("_quantized").and_then(pytorch_name) {
                    Some(n) => n.strip_suffix(".weight").map(str::to_string).unwrap_or(n),
                    None => ctx.scope_module(node)?,
                };
                if let Some(b) = bias {
                    let bn = pytorch_name(b);
                    if bn.as_deref() != Some(&format!("{module}.bias")) {
                        return Err(ctx.err(format!(
                            "ConvInteger '{}': weight placed in '{module}' but its bias is '{b}'",
                            node.name
                        )));
                    }
                }
                let mut src = vec![w.name.clone(), scale.name.clone()];
                src.extend(zp.map(|z| z.name.clone()));
                out.quant_params(&[scale.name.as_str(), zp.map(|z| z.name.as_str()).unwrap_or("")]);
                out.add(format!("{module}.weight"), Param { shape: shape_of(w), data: Data::Q(deq) }, src, "ConvInteger")?;
            }
            "DynamicQuantizeLSTM" => lstm(&ctx, &mut out, node)?,
            "DequantizeLinear" => {
                let x = node.inputs.first().map(String::as_str).unwrap_or("");
                // directly an initializer, or a Gather from a quantized table
                let table = match ctx.init(x) {
                    Some(t) => t,
                    None => match ctx.producer_of(x) {
                        Some(p) if p.op_type == "Gather" => ctx.need_init(p, 0, "quantized table")?,
                        _ => return Err(ctx.err(format!("DequantizeLinear '{}': input '{x}' is neither an initializer nor a Gather of one", node.name))),
                    },
                };
                let scale = ctx.need_init(node, 1, "scale")?;
                let zp = node.inputs.get(2).and_then(|n| ctx.init(n));
                let axis = node.attr_int("axis").unwrap_or(1);
                let dims = shape_of(table);
                let axis = if axis < 0 { axis + dims.len() as i64 } else { axis } as usize;
                let deq = quantized(table, scale, zp, axis).map_err(|e| ctx.err(e))?;
                let name = table
                    .name
                    .strip_suffix("_quantized")
                    .and_then(pytorch_name)
                    .ok_or_else(|| ctx.err(format!("DequantizeLinear '{}': table '{}' has no PyTorch name", node.name, table.name)))?;
                let mut src = vec![table.name.clone(), scale.name.clone()];
                src.extend(zp.map(|z| z.name.clone()));
                out.quant_params(&[scale.name.as_str(), zp.map(|z| z.name.as_str()).unwrap_or("")]);
                out.add(name, Param { shape: dims, data: Data::Q(deq) }, src, "DequantizeLinear")?;
            }
            "MatMul" => {
                let Some(w) = node.inputs.get(1).and_then(|n| ctx.init(n)) else { continue };
                let [k, n] = shape_of(w)[..] else {
                    return Err(ctx.err(format!("MatMul '{}': weight '{}' is not 2-D", node.name, w.name)));
                };
                let name = match pytorch_name(&w.name) {
                    Some(n) => n,
                    None => format!("{}.weight", ctx.scope_module(node)?),
                };
                let data = transpose(&w.to_f32()?, k, n);
                out.add(name, Param::f32(vec![n, k], data), vec![w.name.clone()], "MatMul")?;
            }
            "Conv" | "ConvTranspose" => {
                let w = ctx.need_init(node, 1, "weight")?;
                if pytorch_name(&w.name).is_some() {
                    continue; // kept by name below (or an export buffer)
                }
                let module = ctx.scope_module(node)?;
                if let Some(b) = node.inputs.get(2).filter(|b| !b.is_empty()) {
                    if pytorch_name(b).as_deref() != Some(&format!("{module}.bias")) {
                        return Err(ctx.err(format!("{} '{}': weight placed in '{module}' but its bias is '{b}'", node.op_type, node.name)));
                    }
                }
                let how = if node.op_type == "Conv" { "Conv" } else { "ConvTranspose" };
                out.add(format!("{module}.weight"), Param::f32(shape_of(w), w.to_f32()?), vec![w.name.clone()], how)?;
            }
            _ => {}
        }
    }

    // Float initializers under PyTorch names, and the accounting of everything else.
    let mut reciprocal_candidates = Vec::new();
    for t in &g.initializers {
        if out.used.contains_key(&t.name) || out.quant.contains(&t.name) {
            if out.quant.contains(&t.name) {
                out.report.quant_params.push(t.name.clone());
            }
            continue;
        }
        if !t.data_type.is_float() && !matches!(t.data_type, DataType::Int8 | DataType::Uint8) {
            out.report.int_constants.push(t.name.clone());
            continue;
        }
        if let Some(name) = pytorch_name(&t.name) {
            if ctx.spec.contains_key(&name) {
                let raw = Param::f32(shape_of(t), t.to_f32()?);
                out.add(name, raw, vec![t.name.clone()], "float")?;
                continue;
            }
            // the export's STFT module (not part of KModel): bases computed from n_fft/hop
            if name.starts_with("decoder.generator.stft.") && t.data_type.is_float() {
                out.report
                    .constants
                    .push((t.name.clone(), "STFT basis/window of the export's STFT module, computed from n_fft and hop, not a KModel parameter".into()));
                continue;
            }
            return Err(ctx.err(format!("initializer '{}' has a PyTorch name ('{name}') that is no Kokoro parameter", t.name)));
        }
        if t.data_type.is_float() {
            reciprocal_candidates.push(t);
        } else {
            return Err(ctx.err(format!("quantized initializer '{}' {:?} is consumed by no op this importer knows", t.name, t.dims)));
        }
    }
    for t in reciprocal_candidates {
        let v = t.to_f32()?;
        let reason = if v.len() <= 32 {
            Some(format!("{}-element arithmetic constant", v.len()))
        } else if v.iter().all(|&x| x == v[0]) {
            Some(format!("fill of {} ({} elements)", v[0], v.len()))
        } else {
            reciprocal_of(&out, t, &v).map(|p| format!("1/{p} (derived)"))
        };
        match reason {
            Some(r) => out.report.constants.push((t.name.clone(), r)),
            None => {
                return Err(ctx.err(format!(
                    "float initializer '{}' {:?} is no parameter this importer can place (consumed by {:?})",
                    t.name,
                    t.dims,
                    ctx.consumers_of(&t.name).map(|n| n.name.as_str()).collect::<Vec<_>>()
                )))
            }
        }
    }

    // Every expected parameter present with its shape.
    let mut missing = Vec::new();
    for s in &specs {
        match out.tensors.get(&s.name) {
            Some(r) if r.shape == s.shape => {}
            Some(r) => return Err(ctx.err(format!("'{}' has shape {:?}, the config gives {:?}", s.name, r.shape, s.shape))),
            None if s.optional => out.report.absent_optional.push(s.name.clone()),
            None => missing.push(s.name.clone()),
        }
    }
    if !missing.is_empty() {
        return Err(ctx.err(format!("{} parameters not found in the graph: {}", missing.len(), missing.join(", "))));
    }
    if let Some(extra) = out.tensors.keys().find(|k| !ctx.spec.contains_key(*k)) {
        return Err(ctx.err(format!("'{extra}' was recovered from the graph but is no Kokoro parameter")));
    }

    let params = std::mem::take(&mut out.tensors);
    let mut report = out.report;
    report.mapped.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(ImportedCompact { params, report })
}

/// A float constant that is `1 / p` for a mapped parameter `p` of the same shape in the same
/// module (the Snake activation's `1/alpha`): that parameter's name.
fn reciprocal_of(out: &Out<'_>, t: &OnnxTensor, v: &[f32]) -> Option<String> {
    let shape = t.shape();
    out.tensors.iter().find_map(|(name, raw)| {
        (raw.shape == shape
            && raw.values().iter().zip(v).all(|(&a, &r)| a != 0.0 && ((1.0 / a) - r).abs() <= 1e-6 * r.abs().max(1.0)))
        .then(|| name.clone())
    })
}

fn lstm(ctx: &Ctx, out: &mut Out, node: &Node) -> Result<()> {
    let w = ctx.need_init(node, 1, "W")?;
    let r = ctx.need_init(node, 2, "R")?;
    let b = ctx.need_init(node, 3, "B")?;
    let (ws, wz) = (ctx.need_init(node, 8, "W_scale")?, ctx.need_init(node, 9, "W_zero_point")?);
    let (rs, rz) = (ctx.need_init(node, 10, "R_scale")?, ctx.need_init(node, 11, "R_zero_point")?);
    let module = ctx.scope_module(node)?;
    let dir = node.attr_string("direction").unwrap_or_else(|| "forward".into());
    let hidden = node.attr_int("hidden_size").unwrap_or(0) as usize;
    let [nd, input, h4] = shape_of(w)[..] else {
        return Err(ctx.err(format!("LSTM '{}': W is not 3-D", node.name)));
    };
    if dir != "bidirectional" || nd != 2 || h4 != 4 * hidden || shape_of(r) != [2, hidden, 4 * hidden] || shape_of(b) != [2, 8 * hidden] {
        return Err(ctx.err(format!(
            "LSTM '{}': expected a bidirectional LSTM with W [2, in, 4h], R [2, h, 4h], B [2, 8h]; got {dir}, h={hidden}, W {:?}, R {:?}, B {:?}",
            node.name, w.dims, r.dims, b.dims
        )));
    }
    let wd = quantized(w, ws, Some(wz), 0).map_err(|e| ctx.err(e))?;
    let rd = quantized(r, rs, Some(rz), 0).map_err(|e| ctx.err(e))?;
    let bd = b.to_f32()?;
    out.quant_params(&[ws.name.as_str(), wz.name.as_str(), rs.name.as_str(), rz.name.as_str()]);
    for d in 0..2 {
        let sfx = if d == 0 { "" } else { "_reverse" };
        // one direction's matrix, quantized per tensor, transposed and its gates reordered
        let part = |q: &Quantized, rows: usize| -> Result<Param> {
            let mut one = q.slice(d * rows * h4..(d + 1) * rows * h4).transposed(rows, h4).map_err(|e| ctx.err(e))?;
            one.q = reorder_gates(&one.q, hidden, rows);
            Ok(Param { shape: vec![h4, rows], data: Data::Q(one) })
        };
        let bias = &bd[d * 8 * hidden..(d + 1) * 8 * hidden];
        let parts = [
            (format!("{module}.weight_ih_l0{sfx}"), part(&wd, input)?, vec![w.name.clone(), ws.name.clone(), wz.name.clone()]),
            (format!("{module}.weight_hh_l0{sfx}"), part(&rd, hidden)?, vec![r.name.clone(), rs.name.clone(), rz.name.clone()]),
            (format!("{module}.bias_ih_l0{sfx}"), Param::f32(vec![h4], reorder_gates(&bias[..h4], hidden, 1)), vec![b.name.clone()]),
            (format!("{module}.bias_hh_l0{sfx}"), Param::f32(vec![h4], reorder_gates(&bias[h4..], hidden, 1)), vec![b.name.clone()]),
        ];
        for (name, param, src) in parts {
            out.add(name, param, src, "DynamicQuantizeLSTM")?;
        }
    }
    Ok(())
}

/// Reads `onnx_path`, imports it and writes `model.safetensors` (in `dtype`) and
/// `config.json` (`cfg`, with its vocabulary) into `out_dir`. Returns the report.
pub fn convert_to_safetensors(onnx_path: &Path, cfg: &KokoroConfig, out_dir: &Path, dtype: DType) -> Result<ImportReport> {
    let model = OnnxModel::open(onnx_path)?;
    let imported = import(&model, cfg)?;
    std::fs::create_dir_all(out_dir).map_err(|source| Error::Io {
        path: out_dir.to_path_buf(),
        source,
    })?;
    let mut map = HashMap::new();
    for (name, t) in imported.tensors {
        map.insert(name, t.to_dtype(dtype)?);
    }
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Io { path, source }
    };
    let cj = out_dir.join("config.json");
    let tmp = out_dir.join(".config.json.tmp");
    let text = serde_json::to_string_pretty(&cfg.to_json()).map_err(|e| Error::Config {
        path: cj.clone(),
        what: e.to_string(),
    })?;
    std::fs::write(&tmp, text).map_err(io(&tmp))?;
    std::fs::rename(&tmp, &cj).map_err(io(&cj))?;
    let st = out_dir.join("model.safetensors");
    let tmp = out_dir.join(".model.safetensors.tmp");
    candle_core::safetensors::save(&map, &tmp)?;
    // the weights get the permissions an ordinary new file gets here (config.json's), not the
    // private ones of safetensors' temporary file
    if let Ok(m) = std::fs::metadata(&cj) {
        let _ = std::fs::set_permissions(&tmp, m.permissions());
    }
    std::fs::rename(&tmp, &st).map_err(io(&st))?;
    Ok(imported.report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(pytorch_name("encoder.bert.x.weight").as_deref(), Some("bert.x.weight"));
        assert_eq!(pytorch_name("decoder.decoder.generator.ups.0.bias").as_deref(), Some("decoder.generator.ups.0.bias"));
        assert_eq!(pytorch_name("onnx::MatMul_6547"), None);
        assert_eq!(pytorch_name("/encoder/F0.1/Mul_output_0"), None);
        assert_eq!(pytorch_name("x_scales_mul:0"), None);
        assert_eq!(strip_call_suffix("attention_1"), "attention");
        assert_eq!(strip_call_suffix("F0_proj"), "F0_proj");
        assert_eq!(strip_call_suffix("albert_layers.0"), "albert_layers.0");
    }

    #[test]
    fn gate_reorder() {
        // 4 gates of hidden 1, one column: ONNX i o f c -> PyTorch i f g o
        assert_eq!(reorder_gates(&[0., 1., 2., 3.], 1, 1), vec![0., 2., 3., 1.]);
        assert_eq!(transpose(&[1., 2., 3., 4., 5., 6.], 2, 3), vec![1., 4., 2., 5., 3., 6.]);
    }
}
