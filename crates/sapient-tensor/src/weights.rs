//! One interface the model crates load weights through, whatever the file format.

use crate::gguf::GgufFile;
use crate::kernels::QMatrix;
use crate::{Error, Limits, Result};
use candle_core::quantized::{QMatMul, QTensor};
use candle_core::{DType, Device, Module, Tensor};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A loaded weight: quantized blocks kept as they are, or a dense tensor.
#[derive(Debug, Clone)]
pub enum Weight {
    Quantized(Arc<QTensor>),
    Dense(Tensor),
}

impl Weight {
    pub fn shape(&self) -> &[usize] {
        match self {
            Weight::Quantized(q) => q.shape().dims(),
            Weight::Dense(t) => t.dims(),
        }
    }
    /// Dense values in `dtype`.
    pub fn dequantize(&self, device: &Device, dtype: DType) -> Result<Tensor> {
        Ok(match self {
            Weight::Quantized(q) => q.dequantize(device)?.to_dtype(dtype)?,
            Weight::Dense(t) => t.to_device(device)?.to_dtype(dtype)?,
        })
    }
}

/// A source of named weights: a GGUF file, safetensors files, or anything else that can hand
/// out tensors by name.
pub trait WeightSource: Send + Sync {
    /// The file(s) behind this source, for error messages.
    fn location(&self) -> &Path;
    fn contains(&self, name: &str) -> bool;
    /// Row-major shape of a tensor, if present.
    fn shape_of(&self, name: &str) -> Option<Vec<usize>>;
    /// Load a weight, kept quantized when it is stored quantized.
    fn load(&self, name: &str, device: &Device) -> Result<Weight>;
    fn names(&self) -> Vec<String>;

    /// The stored bytes and GGML type of a tensor of a GGUF file (`None` elsewhere), for the
    /// formats candle has no type for (MXFP4).
    fn ggml_bytes(&self, _name: &str) -> Option<(crate::GgmlType, &[u8])> {
        None
    }

    /// The stored bytes and GGML type of a tensor of a GGUF file as a view sharing the file's
    /// memory map (`None` elsewhere): weights the kernels read in place, never copied.
    fn ggml_mapped(&self, _name: &str) -> Option<(crate::GgmlType, crate::MappedBytes)> {
        None
    }

    /// Load and check the shape.
    fn load_checked(&self, name: &str, shape: &[usize], device: &Device) -> Result<Weight> {
        match self.shape_of(name) {
            None => Err(Error::MissingTensor {
                path: self.location().to_path_buf(),
                tensor: name.to_string(),
            }),
            Some(actual) if actual != shape => Err(Error::ShapeMismatch {
                path: self.location().to_path_buf(),
                tensor: name.to_string(),
                expected: shape.to_vec(),
                actual,
            }),
            Some(_) => self.load(name, device),
        }
    }

    /// A dense tensor in `dtype`, shape-checked.
    fn tensor(&self, name: &str, shape: &[usize], device: &Device, dtype: DType) -> Result<Tensor> {
        self.load_checked(name, shape, device)?.dequantize(device, dtype)
    }
}

impl WeightSource for GgufFile {
    fn location(&self) -> &Path {
        self.path()
    }
    fn contains(&self, name: &str) -> bool {
        self.contains_tensor(name)
    }
    fn shape_of(&self, name: &str) -> Option<Vec<usize>> {
        self.tensor_info(name).map(|t| t.shape.clone())
    }
    fn load(&self, name: &str, device: &Device) -> Result<Weight> {
        Ok(Weight::Quantized(Arc::new(self.qtensor(name, device)?)))
    }
    fn names(&self) -> Vec<String> {
        self.tensors().iter().map(|t| t.name.clone()).collect()
    }
    fn ggml_bytes(&self, name: &str) -> Option<(crate::GgmlType, &[u8])> {
        let t = self.tensor_info(name)?.ggml_type;
        Some((t, self.tensor_bytes(name).ok()?))
    }
    fn ggml_mapped(&self, name: &str) -> Option<(crate::GgmlType, crate::MappedBytes)> {
        let t = self.tensor_info(name)?.ggml_type;
        Some((t, self.tensor_bytes_shared(name).ok()?))
    }
}

/// One or more memory-mapped safetensors files (tensors are copied out one at a time; the
/// files themselves are never read whole into memory).
pub struct SafetensorsFiles {
    paths: Vec<PathBuf>,
    inner: candle_core::safetensors::MmapedSafetensors,
    limits: Limits,
}

impl SafetensorsFiles {
    pub fn open<P: AsRef<Path>>(paths: &[P]) -> Result<Self> {
        Self::open_with(paths, &Limits::default())
    }

    /// [`Self::open`] under `limits`: a tensor larger than [`Limits::max_alloc`] is an
    /// [`Error::Limit`] when it is loaded. (The header itself is checked by the `safetensors`
    /// crate: at most 100 MB of JSON, every tensor's byte range inside the file and matching
    /// its shape and dtype.)
    pub fn open_with<P: AsRef<Path>>(paths: &[P], limits: &Limits) -> Result<Self> {
        let paths: Vec<PathBuf> = paths.iter().map(|p| p.as_ref().to_path_buf()).collect();
        let Some(first) = paths.first() else {
            return Err(Error::Safetensors {
                path: PathBuf::new(),
                what: "no safetensors file given".into(),
            });
        };
        for p in &paths {
            if !p.exists() {
                return Err(Error::Io {
                    path: p.clone(),
                    source: std::io::Error::new(std::io::ErrorKind::NotFound, "file not found"),
                });
            }
        }
        // SAFETY: read-only maps of files we do not modify.
        let inner = unsafe { candle_core::safetensors::MmapedSafetensors::multi(&paths) }
            .map_err(|e| Error::Safetensors {
                path: first.clone(),
                what: format!("cannot read safetensors: {e}"),
            })?;
        Ok(Self {
            paths,
            inner,
            limits: *limits,
        })
    }

    pub fn paths(&self) -> &[PathBuf] {
        &self.paths
    }
}

impl WeightSource for SafetensorsFiles {
    fn location(&self) -> &Path {
        &self.paths[0]
    }
    fn contains(&self, name: &str) -> bool {
        self.inner.get(name).is_ok()
    }
    fn shape_of(&self, name: &str) -> Option<Vec<usize>> {
        self.inner.get(name).ok().map(|v| v.shape().to_vec())
    }
    fn load(&self, name: &str, device: &Device) -> Result<Weight> {
        if let Ok(view) = self.inner.get(name) {
            self.limits.check(&self.paths[0], || format!("tensor '{name}'"), view.data().len() as u64)?;
        }
        let t = self.inner.load(name, device).map_err(|e| Error::Safetensors {
            path: self.paths[0].clone(),
            what: format!("tensor '{name}': {e}"),
        })?;
        Ok(Weight::Dense(t))
    }
    fn names(&self) -> Vec<String> {
        self.inner.tensors().into_iter().map(|(n, _)| n).collect()
    }
}

/// Open whatever `path` is: a `.gguf` file, a `.safetensors` file, or a directory holding
/// `*.safetensors` (HF layout, possibly sharded).
pub fn open_weights(path: &Path) -> Result<Box<dyn WeightSource>> {
    open_weights_with(path, &Limits::default())
}

/// [`open_weights`] under `limits` (see [`Limits`]).
pub fn open_weights_with(path: &Path, limits: &Limits) -> Result<Box<dyn WeightSource>> {
    if path.is_dir() {
        let mut files: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(|source| Error::Io {
                path: path.to_path_buf(),
                source,
            })?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
            .collect();
        files.sort();
        if files.is_empty() {
            let gguf: Vec<PathBuf> = std::fs::read_dir(path)
                .map_err(|source| Error::Io {
                    path: path.to_path_buf(),
                    source,
                })?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|e| e == "gguf"))
                .collect();
            if gguf.len() == 1 {
                return Ok(Box::new(GgufFile::open_with(&gguf[0], limits)?));
            }
            return Err(Error::Safetensors {
                path: path.to_path_buf(),
                what: "directory holds no *.safetensors (and not exactly one *.gguf)".into(),
            });
        }
        return Ok(Box::new(SafetensorsFiles::open_with(&files, limits)?));
    }
    let mut magic = [0u8; 4];
    {
        use std::io::Read;
        let mut f = std::fs::File::open(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let n = f.read(&mut magic).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        if n < 4 {
            return Err(Error::Truncated {
                path: path.to_path_buf(),
                what: "file header".into(),
                offset: 0,
                end: 4,
                len: n as u64,
            });
        }
    }
    if &magic == b"GGUF" {
        Ok(Box::new(GgufFile::open_with(path, limits)?))
    } else if path.extension().is_some_and(|e| e == "safetensors") {
        Ok(Box::new(SafetensorsFiles::open_with(&[path], limits)?))
    } else {
        Err(Error::BadMagic {
            path: path.to_path_buf(),
            magic: magic.to_vec(),
        })
    }
}

/// Without the AVX-512 kernels, inputs with at least this many rows use a dequantized weight
/// and the dense f32 GEMM on the CPU.
pub const DENSE_PREFILL_ROWS: usize = 32;

/// From how many rows a product leaves the quantized kernels for the dense f32 GEMM: never
/// with the AVX-512 kernels (their int8 products beat the GEMM at every batch size),
/// [`DENSE_PREFILL_ROWS`] otherwise. [`KernelOptions::dense_rows`](crate::kernels::KernelOptions::dense_rows) overrides.
pub fn dense_prefill_rows() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        crate::kernels::options().dense_rows.unwrap_or(if crate::kernels::has_avx512() || crate::kernels::has_lanes_avx2() { usize::MAX } else { DENSE_PREFILL_ROWS })
    })
}

/// A linear layer over a quantized or dense weight of shape `[out, in]`, with optional bias.
#[derive(Debug, Clone)]
pub struct Linear {
    weight: QMatMul,
    /// The same weight for our CPU kernels, when its format has one.
    kernel: Option<QMatrix>,
    /// Whether batches of [`DENSE_PREFILL_ROWS`] rows or more also use the kernels (8-bit
    /// activations) where [`dense_prefill_rows`] allows, instead of the dense f32 GEMM.
    long_batch_kernels: bool,
    bias: Option<Tensor>,
    out_features: usize,
    in_features: usize,
}

impl Linear {
    pub fn new(weight: Weight, bias: Option<Tensor>) -> Result<Self> {
        let shape = weight.shape().to_vec();
        if shape.len() != 2 {
            return Err(Error::Candle(candle_core::Error::Msg(format!(
                "linear weight must be 2-D, got shape {shape:?}"
            ))));
        }
        let kernel = match &weight {
            Weight::Quantized(q) => QMatrix::from_qtensor(q),
            Weight::Dense(_) => None,
        };
        let weight = match weight {
            Weight::Quantized(q) => QMatMul::from_arc(q)?,
            Weight::Dense(t) => QMatMul::Tensor(t),
        };
        Ok(Self {
            weight,
            kernel,
            long_batch_kernels: false,
            bias,
            out_features: shape[0],
            in_features: shape[1],
        })
    }

    /// Load `{prefix}.weight` (and `{prefix}.bias` when `bias`) with shape checks.
    pub fn load(
        src: &dyn WeightSource,
        prefix: &str,
        out_features: usize,
        in_features: usize,
        bias: bool,
        device: &Device,
        dtype: DType,
    ) -> Result<Self> {
        let w = src.load_checked(&format!("{prefix}.weight"), &[out_features, in_features], device)?;
        let w = match w {
            // Dense weights are used in the activation dtype.
            Weight::Dense(t) => Weight::Dense(t.to_dtype(dtype)?),
            q => q,
        };
        let b = if bias {
            Some(src.tensor(&format!("{prefix}.bias"), &[out_features], device, dtype)?)
        } else {
            None
        };
        Self::new(w, b)
    }

    pub fn out_features(&self) -> usize {
        self.out_features
    }
    pub fn in_features(&self) -> usize {
        self.in_features
    }
    /// The bias, if any.
    pub fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }
    /// The weight as a kernel matrix (CPU, quantized in a format the kernels handle).
    pub fn kernel(&self) -> Option<&QMatrix> {
        self.kernel.as_ref()
    }
    /// Let batches of [`DENSE_PREFILL_ROWS`] rows or more use the quantized kernels too (with
    /// the AVX-512 kernels; see [`dense_prefill_rows`]). Off by default: their 8-bit
    /// activations are what llama.cpp does for LLMs, but Whisper's q8_0 decoder lost words
    /// with them on long batches (WER 0.099 against 0.042 on the LibriVox clips).
    pub fn with_long_batch_kernels(mut self, on: bool) -> Self {
        self.long_batch_kernels = on;
        self
    }
}

impl Module for Linear {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let rows = x.elem_count() / self.in_features.max(1);
        let limit = if self.long_batch_kernels { dense_prefill_rows() } else { DENSE_PREFILL_ROWS };
        let fast = self.kernel.as_ref().filter(|_| rows < limit && x.dtype() == DType::F32);
        let y = if let Some(k) = fast {
            // Decode and short batches: our quantized kernels (row-invariant, threaded).
            let xs = x.flatten_all()?.to_vec1::<f32>()?;
            let mut out = vec![0f32; rows * self.out_features];
            k.matmul(&xs, rows, &mut out);
            let mut dims = x.dims().to_vec();
            if let Some(last) = dims.last_mut() {
                *last = self.out_features;
            }
            Tensor::from_vec(out, dims, x.device())?
        } else {
            // x: [.., in] @ w^T: [in, out]
            let dense = |w: &Tensor| -> candle_core::Result<Tensor> {
                let w = w.t()?;
                match x.dims() {
                    [b, s, i] => x.reshape((b * s, *i))?.matmul(&w)?.reshape((*b, *s, ())),
                    _ => x.broadcast_matmul(&w),
                }
            };
            match &self.weight {
                QMatMul::Tensor(w) => dense(w)?,
                // Many rows at once (prefill): candle's quantized CPU matmul runs one row at a
                // time, so dequantizing the weight once and using the f32 GEMM is ~10x faster.
                QMatMul::QTensor(q) if x.device().is_cpu() && rows >= DENSE_PREFILL_ROWS => {
                    dense(&q.dequantize(x.device())?)?
                }
                q => q.forward(x)?,
            }
        };
        match &self.bias {
            Some(b) => y.broadcast_add(b),
            None => Ok(y),
        }
    }
}
