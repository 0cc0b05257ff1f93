//! Kokoro's parameters by `KModel` name, shape-checked against the config: from the
//! safetensors `cargo xtask convert kokoro-onnx-to-safetensors` writes, from a PyTorch
//! checkpoint converted to safetensors under the same names (weight-normed convolutions as
//! `weight_g`/`weight_v`, folded here; a `module.` after the top-level name is accepted), or
//! straight from the ONNX file.

use crate::config::KokoroConfig;
use crate::params::{expected_params, ParamSpec};
use crate::{Error, Result};
use candle_core::{DType, Device, Tensor};
use sapient_tensor::WeightSource;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Every inference parameter of Kokoro, on one device: dense, or (imported from the int8
/// ONNX file) still quantized until [`get`](KokoroWeights::get) dequantizes it, so that
/// loading never holds the whole model in f32.
#[derive(Clone)]
pub struct KokoroWeights {
    path: PathBuf,
    device: Device,
    dtype: DType,
    tensors: HashMap<String, Entry>,
}

#[derive(Clone)]
enum Entry {
    Dense(Tensor),
    Imported(Arc<crate::onnx_import::Param>),
}

impl Entry {
    fn elem_count(&self) -> usize {
        match self {
            Entry::Dense(t) => t.elem_count(),
            Entry::Imported(p) => p.elem_count(),
        }
    }
}

impl std::fmt::Debug for KokoroWeights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KokoroWeights")
            .field("path", &self.path)
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl KokoroWeights {
    /// Loads every non-optional parameter of `cfg` from `src` (shape-checked), folding
    /// `weight_g`/`weight_v` pairs into `weight`.
    pub fn load(src: &dyn WeightSource, cfg: &KokoroConfig, device: &Device, dtype: DType) -> Result<Self> {
        let path = src.location().to_path_buf();
        let names = src.names();
        let mut tensors = HashMap::new();
        let mut problems = Vec::new();
        let find = |name: &str| -> Option<String> {
            if src.contains(name) {
                return Some(name.to_string());
            }
            // `bert.module.embeddings...`: the top-level modules of kokoro-v1_0.pth were saved
            // from DataParallel wrappers
            let (top, rest) = name.split_once('.')?;
            let alt = format!("{top}.module.{rest}");
            src.contains(&alt).then_some(alt)
        };
        for spec in expected_params(cfg).iter().filter(|s| !s.optional) {
            match load_one(src, spec, &find, device, dtype) {
                Ok(Some(t)) => {
                    tensors.insert(spec.name.clone(), Entry::Dense(t));
                }
                Ok(None) => problems.push(format!("missing '{}' {:?}", spec.name, spec.shape)),
                Err(e) => problems.push(e),
            }
        }
        if !problems.is_empty() {
            let n = problems.len();
            problems.truncate(12);
            return Err(Error::Weights {
                path,
                what: format!("{n} problem(s): {}{}", problems.join("; "), if n > 12 { "; ..." } else { "" }),
            });
        }
        let unused = names.len().saturating_sub(tensors.len());
        if unused > 0 {
            tracing::debug!("{}: {unused} tensors not used by inference (pooler, weight_g/v pairs, buffers)", path.display());
        }
        Ok(Self {
            path,
            device: device.clone(),
            dtype,
            tensors,
        })
    }

    /// Imports the ONNX export in memory (see [`crate::onnx_import`]).
    pub fn from_onnx(onnx: &Path, cfg: &KokoroConfig, device: &Device, dtype: DType) -> Result<Self> {
        Self::from_onnx_with(onnx, cfg, device, dtype, &sapient_tensor::Limits::default())
    }

    /// [`from_onnx`](Self::from_onnx) under `limits` (see [`sapient_tensor::Limits`]).
    pub fn from_onnx_with(onnx: &Path, cfg: &KokoroConfig, device: &Device, dtype: DType, limits: &sapient_tensor::Limits) -> Result<Self> {
        let model = sapient_tensor::onnx::OnnxModel::open_with(onnx, limits)?;
        crate::memory::memory_probe("load: ONNX file read");
        let imported = crate::onnx_import::import_compact(&model, cfg)?;
        crate::memory::memory_probe("load: ONNX imported");
        // the file's mapping goes now: the imported weights are copies
        drop(model);
        let tensors = imported.params.into_iter().map(|(name, p)| (name, Entry::Imported(Arc::new(p)))).collect();
        Ok(Self {
            path: onnx.to_path_buf(),
            device: device.clone(),
            dtype,
            tensors,
        })
    }

    /// Parameter `name` (dequantized now when it was imported quantized).
    pub fn get(&self, name: &str) -> Result<Tensor> {
        match self.tensors.get(name) {
            Some(Entry::Dense(t)) => Ok(t.clone()),
            Some(Entry::Imported(p)) => Ok(p.to_tensor()?.to_device(&self.device)?.to_dtype(self.dtype)?),
            None => Err(Error::Weights {
                path: self.path.clone(),
                what: format!("no parameter '{name}'"),
            }),
        }
    }

    /// Drops the parameters of module `prefix` (names starting with `prefix.`): the model's
    /// constructor releases each module's dense weights once it has packed them, so the two
    /// copies never coexist in full.
    pub(crate) fn release(&mut self, prefix: &str) {
        let p = format!("{prefix}.");
        self.tensors.retain(|k, _| !k.starts_with(&p));
        // the dequantized copies and packing buffers just freed go back to the system, so the
        // next module's packing does not add to them
        sapient_tensor::kernels::release_freed();
    }

    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// Total number of parameter values.
    pub fn param_count(&self) -> usize {
        self.tensors.values().map(Entry::elem_count).sum()
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }
}

/// One parameter: Ok(None) when absent, Err(text) when present but wrong.
fn load_one(
    src: &dyn WeightSource,
    spec: &ParamSpec,
    find: &dyn Fn(&str) -> Option<String>,
    device: &Device,
    dtype: DType,
) -> Result<Option<Tensor>, String> {
    if let Some(name) = find(&spec.name) {
        let t = src.tensor(&name, &spec.shape, device, dtype).map_err(|e| e.to_string())?;
        return Ok(Some(t));
    }
    if !spec.weight_norm {
        return Ok(None);
    }
    let module = spec.name.strip_suffix(".weight").unwrap_or(&spec.name);
    let (Some(g), Some(v)) = (find(&format!("{module}.weight_g")), find(&format!("{module}.weight_v"))) else {
        return Ok(None);
    };
    let mut g_shape = vec![1; spec.shape.len()];
    g_shape[0] = spec.shape[0];
    let g = src.tensor(&g, &g_shape, device, DType::F32).map_err(|e| e.to_string())?;
    let v = src.tensor(&v, &spec.shape, device, DType::F32).map_err(|e| e.to_string())?;
    fold_weight_norm(&g, &v)
        .and_then(|w| w.to_dtype(dtype))
        .map(Some)
        .map_err(|e| format!("folding '{module}.weight_g/_v': {e}"))
}

/// `torch.nn.utils.weight_norm` with `dim=0`: `w = g * v / ||v||`, the norm over every
/// dimension but the first.
pub fn fold_weight_norm(g: &Tensor, v: &Tensor) -> candle_core::Result<Tensor> {
    let dims: Vec<usize> = (1..v.rank()).collect();
    let norm = v.sqr()?.sum_keepdim(dims)?.sqrt()?;
    v.broadcast_mul(&g.broadcast_div(&norm)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weight_norm_fold() {
        let dev = Device::Cpu;
        let v = Tensor::new(&[[[3f32, 4.0]], [[0.0, 2.0]]], &dev).unwrap(); // [2,1,2]
        let g = Tensor::new(&[[[10f32]], [[0.5]]], &dev).unwrap();
        let w = fold_weight_norm(&g, &v).unwrap();
        let w: Vec<f32> = w.flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(w, vec![6.0, 8.0, 0.0, 0.5]);
    }
}
