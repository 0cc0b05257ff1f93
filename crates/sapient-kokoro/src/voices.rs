//! Kokoro voice packs: per voice a `[510, 1, 256]` (or `[510, 256]`) f32 table of style
//! vectors, one row per utterance length.
//!
//! - [`Voices::load`] reads a `.npz` (one `<name>.npy` per voice, as `numpy.savez` or
//!   `numpy.savez_compressed` writes it: kokoro-onnx's `voices-v1.0.bin` and our `voices_ja.npz`), a
//!   single `.npy` (the voice is named after the file stem), a `.safetensors` file (one
//!   tensor per voice) or a PyTorch `.pt`/`.pth` archive: a bare tensor as `torch.save(pack)`
//!   writes hexgrad/Kokoro-82M's `voices/*.pt` (named after the file stem), or a dict of
//!   named tensors.
//! - [`Voices::get`] takes a voice name or a blend `"jf_alpha:0.6,jm_kumo:0.4"`: the weighted
//!   sum of the packs with the weights **normalised to sum to 1** (`"a,b"` without weights is
//!   the plain average, as kokoro's `KPipeline` does for `"a,b"`). An unknown name is an error
//!   that lists the voices there are.
//! - [`VoicePack::style_for`] picks the style row for an utterance: the row index is the number
//!   of phonemes (kokoro-onnx's `voice[len(tokens)]`; kokoro's `KPipeline` takes
//!   `pack[len(phonemes) - 1]`, a neighbouring row).

use crate::{Error, Result};
use candle_core::{DType, Device, Tensor};
use sapient_tensor::npy;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One voice: `rows` style vectors of `dim` (256) floats.
#[derive(Debug, Clone, PartialEq)]
pub struct VoicePack {
    name: String,
    rows: usize,
    dim: usize,
    data: Vec<f32>,
}

impl VoicePack {
    /// A pack from a flat row-major `[rows, dim]` table.
    pub fn new(name: impl Into<String>, rows: usize, dim: usize, data: Vec<f32>) -> Result<Self> {
        let name = name.into();
        if rows == 0 || dim == 0 || data.len() != rows * dim {
            return Err(Error::Voice(format!(
                "voice '{name}': {} values do not make a [{rows}, {dim}] table",
                data.len()
            )));
        }
        if let Some(i) = data.iter().position(|v| !v.is_finite()) {
            return Err(Error::Voice(format!("voice '{name}': value {i} is not finite")));
        }
        Ok(Self { name, rows, dim, data })
    }

    fn from_tensor(name: &str, t: &Tensor) -> Result<Self> {
        let dims = t.dims().to_vec();
        let (rows, dim) = match dims.as_slice() {
            [r, 1, d] | [r, d] => (*r, *d),
            _ => {
                return Err(Error::Voice(format!(
                    "voice '{name}' has shape {dims:?}, expected [rows, 1, dim] or [rows, dim] (Kokoro: [510, 1, 256])"
                )))
            }
        };
        let data = t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
        Self::new(name, rows, dim, data)
    }

    /// The voice's name (for a blend, the spec it was made from).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Number of style rows (510 for Kokoro's packs): the longest utterance is `rows - 1`
    /// phonemes.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Length of one style vector (256: the decoder's 128 then the prosody predictor's 128).
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The style vector for an utterance of `n_phonemes` phonemes (row `n_phonemes`).
    pub fn style_for(&self, n_phonemes: usize) -> Result<&[f32]> {
        if n_phonemes >= self.rows {
            return Err(Error::Voice(format!(
                "voice '{}' has {} style rows: an utterance can have at most {} phonemes, this one has {n_phonemes} (split the text)",
                self.name,
                self.rows,
                self.rows - 1
            )));
        }
        Ok(&self.data[n_phonemes * self.dim..(n_phonemes + 1) * self.dim])
    }
}

/// A set of named voice packs.
#[derive(Debug, Clone)]
pub struct Voices {
    path: PathBuf,
    packs: BTreeMap<String, VoicePack>,
}

/// The tensors of a PyTorch archive (`torch.save`): a dict of named tensors, or one bare
/// tensor, named after the file stem. candle's pickle reader gives the tensor directory; the
/// data is read here, each tensor's declared size checked against its zip entry and `limits`
/// before anything is allocated.
fn read_pt(path: &Path, limits: &sapient_tensor::Limits) -> std::result::Result<Vec<(String, Tensor)>, String> {
    use candle_core::pickle::{Object, Stack};
    let infos = candle_core::pickle::read_pth_tensor_info(path, false, None).map_err(|e| e.to_string())?;
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let mut zip = zip::ZipArchive::new(std::io::BufReader::new(file)).map_err(|e| e.to_string())?;
    if !infos.is_empty() {
        return infos
            .iter()
            .map(|info| Ok((info.name.clone(), read_pt_tensor(&mut zip, info, path, limits)?)))
            .collect();
    }
    let pkl = zip
        .file_names()
        .filter_map(|n| n.ok().map(|n| n.into_owned()))
        .find(|n| n.ends_with("data.pkl"))
        .ok_or("no data.pkl in the archive")?;
    let mut stack = Stack::empty();
    {
        let entry = zip.by_name(&pkl).map_err(|e| e.to_string())?;
        stack.read_loop(&mut std::io::BufReader::new(entry)).map_err(|e| e.to_string())?;
    }
    let obj = stack.finalize().map_err(|e| e.to_string())?;
    let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or("voice").to_string();
    let dir = PathBuf::from(pkl.strip_suffix(".pkl").unwrap_or(&pkl));
    let info = obj
        .into_tensor_info(Object::Unicode(name.clone()), &dir)
        .map_err(|e| e.to_string())?
        .ok_or("the archive holds neither a tensor nor a dict of tensors")?;
    Ok(vec![(name, read_pt_tensor(&mut zip, &info, path, limits)?)])
}

/// One tensor's data from its zip entry, as f32.
fn read_pt_tensor<R: std::io::Read + std::io::Seek>(
    zip: &mut zip::ZipArchive<R>,
    info: &candle_core::pickle::TensorInfo,
    path: &Path,
    limits: &sapient_tensor::Limits,
) -> std::result::Result<Tensor, String> {
    use std::io::Read;
    if !info.layout.is_contiguous() {
        return Err(format!("tensor '{}' is not contiguous ({:?})", info.name, info.layout));
    }
    let elem = info.dtype.size_in_bytes();
    let dims = info.layout.shape().dims().to_vec();
    let n = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    let nbytes = n.and_then(|n| n.checked_mul(elem));
    let skip = info.layout.start_offset().checked_mul(elem);
    let (Some(n), Some(nbytes), Some(skip)) = (n, nbytes, skip) else {
        return Err(format!("tensor '{}': shape {dims:?} overflows", info.name));
    };
    let mut entry = zip.by_name(&info.path).map_err(|e| format!("{}: {e}", info.path))?;
    let held = entry.size();
    if (skip as u64).saturating_add(nbytes as u64) > held {
        return Err(format!(
            "tensor '{}': shape {dims:?} of {:?} at element {} needs {} bytes, but its entry '{}' holds {held}",
            info.name,
            info.dtype,
            info.layout.start_offset(),
            skip as u64 + nbytes as u64,
            info.path
        ));
    }
    limits
        .check(path, || format!("tensor '{}'", info.name), nbytes as u64)
        .map_err(|e| e.to_string())?;
    std::io::copy(&mut entry.by_ref().take(skip as u64), &mut std::io::sink()).map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    entry
        .by_ref()
        .take(nbytes as u64)
        .read_to_end(&mut raw)
        .map_err(|e| format!("tensor '{}': {e}", info.name))?;
    if raw.len() != nbytes {
        return Err(format!("tensor '{}': {} values of {:?} expected, the entry ends early", info.name, n, info.dtype));
    }
    let values: Vec<f32> = match info.dtype {
        DType::F32 => raw.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
        DType::F64 => raw.chunks_exact(8).map(|b| f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as f32).collect(),
        DType::F16 => raw.chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
        DType::BF16 => raw.chunks_exact(2).map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
        other => return Err(format!("tensor '{}' is {other:?}; voices are floating point", info.name)),
    };
    Tensor::from_vec(values, dims, &Device::Cpu).map_err(|e| e.to_string())
}

impl Voices {
    /// Reads a `.npz`, `.npy`, `.safetensors` or `.pt` voice file (see the module docs).
    pub fn load(path: &Path) -> Result<Self> {
        Self::load_with(path, &sapient_tensor::Limits::default())
    }

    /// [`Self::load`] under `limits` (what the file may make the loader allocate; see
    /// [`sapient_tensor::Limits`]).
    pub fn load_with(path: &Path, limits: &sapient_tensor::Limits) -> Result<Self> {
        let bad = |what: String| Error::Voice(format!("{}: {what}", path.display()));
        if !path.is_file() {
            return Err(bad("no such voice file".into()));
        }
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase)
            .unwrap_or_default();
        let named: Vec<(String, Tensor)> = match ext.as_str() {
            "npz" | "bin" => npy::read_npz_with(path, limits)
                .and_then(|arrays| arrays.into_iter().map(|(n, a)| Ok((n, a.to_candle_f32()?))).collect())
                .map_err(|e| bad(format!("not a readable .npz (numpy.savez archive of .npy arrays): {e}")))?,
            "npy" => {
                let t = npy::read_npy_with(path, limits)
                    .and_then(|a| a.to_candle_f32())
                    .map_err(|e| bad(format!("not a readable .npy: {e}")))?;
                let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("voice").to_string();
                vec![(stem, t)]
            }
            "safetensors" => candle_core::safetensors::load(path, &Device::Cpu)
                .map_err(|e| bad(format!("not a readable safetensors file: {e}")))?
                .into_iter()
                .collect(),
            "pt" | "pth" => std::panic::catch_unwind(|| read_pt(path, limits))
                // candle's pickle reader overflows a shift on some LONG1 values (a panic
                // where overflow checks are on): a corrupt file, not a crash.
                .unwrap_or_else(|_| Err("the pickle is corrupt (candle's reader panicked)".into()))
                .map_err(|e| bad(format!("not a readable PyTorch archive: {e}")))?,
            _ => return Err(bad("unknown voice file type (expected .npz, .npy, .safetensors or .pt)".into())),
        };
        let mut packs = BTreeMap::new();
        for (name, t) in named {
            let name = name.strip_suffix(".npy").unwrap_or(&name).to_string();
            let pack = VoicePack::from_tensor(&name, &t).map_err(|e| bad(e.to_string()))?;
            packs.insert(name, pack);
        }
        Self::from_packs(path, packs.into_values())
    }

    /// A set from packs already in memory (names must be unique, all of one shape).
    pub fn from_packs(path: &Path, packs: impl IntoIterator<Item = VoicePack>) -> Result<Self> {
        let mut map = BTreeMap::new();
        for p in packs {
            if let Some(first) = map.values().next().map(|f: &VoicePack| (f.rows, f.dim)) {
                if first != (p.rows, p.dim) {
                    return Err(Error::Voice(format!(
                        "{}: voice '{}' is [{}, {}], others are [{}, {}]",
                        path.display(),
                        p.name,
                        p.rows,
                        p.dim,
                        first.0,
                        first.1
                    )));
                }
            }
            if map.contains_key(&p.name) {
                return Err(Error::Voice(format!("{}: voice '{}' twice", path.display(), p.name)));
            }
            map.insert(p.name.clone(), p);
        }
        if map.is_empty() {
            return Err(Error::Voice(format!("{}: no voices", path.display())));
        }
        Ok(Self {
            path: path.to_path_buf(),
            packs: map,
        })
    }

    /// Voice names, sorted.
    pub fn names(&self) -> Vec<&str> {
        self.packs.keys().map(String::as_str).collect()
    }

    pub fn len(&self) -> usize {
        self.packs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.packs.is_empty()
    }

    /// A voice (`"jf_alpha"`) or a blend (`"jf_alpha:0.6,jm_kumo:0.4"`, weights normalised to
    /// sum to 1; `"a,b"` is the average). Weights must be finite and non-negative with a
    /// positive sum; a name may not repeat.
    pub fn get(&self, spec: &str) -> Result<VoicePack> {
        let spec = spec.trim();
        if spec.is_empty() {
            return Err(Error::Voice(format!("empty voice name; voices: {}", self.names().join(", "))));
        }
        let mut parts: Vec<(&VoicePack, f64)> = Vec::new();
        for item in spec.split(',') {
            let item = item.trim();
            let (name, w) = match item.split_once(':') {
                Some((n, w)) => {
                    let w: f64 = w.trim().parse().map_err(|_| {
                        Error::Voice(format!("voice spec '{spec}': weight '{}' of '{}' is not a number", w.trim(), n.trim()))
                    })?;
                    (n.trim(), w)
                }
                None => (item, 1.0),
            };
            if !w.is_finite() || w < 0.0 {
                return Err(Error::Voice(format!("voice spec '{spec}': weight {w} of '{name}' must be finite and >= 0")));
            }
            let pack = self.packs.get(name).ok_or_else(|| {
                Error::Voice(format!(
                    "unknown voice '{name}' in {}; voices: {}",
                    self.path.display(),
                    self.names().join(", ")
                ))
            })?;
            if parts.iter().any(|(p, _)| p.name == pack.name) {
                return Err(Error::Voice(format!("voice spec '{spec}': '{name}' appears twice")));
            }
            parts.push((pack, w));
        }
        if parts.len() == 1 {
            return Ok(parts[0].0.clone());
        }
        let total: f64 = parts.iter().map(|(_, w)| w).sum();
        if total <= 0.0 {
            return Err(Error::Voice(format!("voice spec '{spec}': the weights sum to 0")));
        }
        let first = parts[0].0;
        let mut acc = vec![0f64; first.data.len()];
        for (p, w) in &parts {
            let w = w / total;
            for (a, v) in acc.iter_mut().zip(&p.data) {
                *a += w * f64::from(*v);
            }
        }
        VoicePack::new(spec, first.rows, first.dim, acc.into_iter().map(|v| v as f32).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pack(name: &str, v: f32) -> VoicePack {
        VoicePack::new(name, 3, 2, (0..6).map(|i| v + i as f32).collect()).unwrap()
    }

    #[test]
    fn blend_normalises_and_rows_index_by_phoneme_count() {
        let v = Voices::from_packs(Path::new("mem"), [pack("a", 0.0), pack("b", 10.0)]).unwrap();
        assert_eq!(v.names(), ["a", "b"]);
        assert_eq!(v.get("a").unwrap().style_for(1).unwrap(), &[2.0, 3.0]);
        // 0.6 * a + 0.4 * b, and the same with weights 3:2
        let b = v.get("a:0.6, b:0.4").unwrap();
        assert_eq!(b.style_for(0).unwrap(), &[4.0, 5.0]);
        assert_eq!(v.get("a:3,b:2").unwrap().style_for(2).unwrap(), &[8.0, 9.0]);
        assert_eq!(v.get("a,b").unwrap().style_for(0).unwrap(), &[5.0, 6.0]);
        assert!(b.style_for(3).unwrap_err().to_string().contains("at most 2 phonemes"));
    }

    #[test]
    fn bad_specs_are_errors() {
        let v = Voices::from_packs(Path::new("mem"), [pack("a", 0.0), pack("b", 10.0)]).unwrap();
        let e = v.get("c").unwrap_err().to_string();
        assert!(e.contains("unknown voice 'c'") && e.contains("a, b"), "{e}");
        for bad in ["", "a:x", "a:-1,b:1", "a:0,b:0", "a,a", "a:inf"] {
            assert!(v.get(bad).is_err(), "{bad}");
        }
        assert!(VoicePack::new("x", 2, 2, vec![0.0; 3]).is_err());
        assert!(VoicePack::new("x", 1, 1, vec![f32::NAN]).is_err());
    }
}
