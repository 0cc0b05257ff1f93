//! NumPy's `.npy` arrays and `.npz` archives (a zip of `.npy` files, stored or deflated, as
//! `numpy.savez` and `numpy.savez_compressed` write them).
//!
//! Read: little-endian (or byte-sized) `bool`, `int8..int64`, `uint8..uint64`, `float16`,
//! `float32` and `float64` arrays in C order, `.npy` format versions 1 to 3. Every length and
//! offset is bounds-checked; anything else (Fortran order, big-endian, object arrays, zip64
//! archives, other compression methods) is an [`Error::Npy`] naming the file and the problem.
//!
//! ```no_run
//! # fn main() -> sapient_tensor::Result<()> {
//! use sapient_tensor::npy::{read_npy, Npz};
//! let filters = Npz::open("mel_filters.npz")?.get("mel_80")?; // [80, 201]
//! assert_eq!(filters.shape, [80, 201]);
//! let values: Vec<f32> = filters.to_f32()?;
//! let reference = read_npy("expected.npy")?.to_f64()?;
//! # let _ = (values, reference); Ok(()) }
//! ```

use crate::{Error, Limits, Result};
use std::path::{Path, PathBuf};

/// The element type of a `.npy` array (its `descr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NpyDtype {
    Bool,
    I8,
    I16,
    I32,
    I64,
    U8,
    U16,
    U32,
    U64,
    F16,
    F32,
    F64,
}

impl NpyDtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Self::Bool | Self::I8 | Self::U8 => 1,
            Self::I16 | Self::U16 | Self::F16 => 2,
            Self::I32 | Self::U32 | Self::F32 => 4,
            Self::I64 | Self::U64 | Self::F64 => 8,
        }
    }

    /// From a `descr` such as `<f4`, `|u1` or `<i8` (`None` for anything else).
    fn from_descr(d: &str) -> Option<Self> {
        let (order, code) = d.split_at_checked(1)?;
        let t = match code {
            "b1" => Self::Bool,
            "i1" => Self::I8,
            "u1" => Self::U8,
            "i2" => Self::I16,
            "u2" => Self::U16,
            "f2" => Self::F16,
            "i4" => Self::I32,
            "u4" => Self::U32,
            "f4" => Self::F32,
            "i8" => Self::I64,
            "u8" => Self::U64,
            "f8" => Self::F64,
            _ => return None,
        };
        // byte-sized types are written with '|' (no order); wider ones must be little-endian
        let ok = order == "<"
            || (t.size() == 1 && order == "|")
            || (order == "=" && cfg!(target_endian = "little"));
        ok.then_some(t)
    }
}

/// One array: its shape, element type and little-endian bytes in C order.
#[derive(Debug, Clone)]
pub struct NpyArray {
    pub shape: Vec<usize>,
    pub dtype: NpyDtype,
    bytes: Vec<u8>,
}

impl NpyArray {
    /// Number of elements (the product of the shape; 1 for a scalar).
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The data bytes (little-endian, C order).
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The values as `f64` (every element type converts; 64-bit integers may round).
    pub fn to_f64(&self) -> Result<Vec<f64>> {
        Ok(self.convert(|x| x))
    }

    /// The values as `f32` (every element type converts, rounding to nearest).
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        if self.dtype == NpyDtype::F32 {
            return Ok(self
                .bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect());
        }
        Ok(self.convert(|x| x as f32))
    }

    fn convert<T>(&self, f: impl Fn(f64) -> T) -> Vec<T> {
        use NpyDtype as D;
        let b = &self.bytes;
        let n = self.dtype.size();
        let it = b.chunks_exact(n);
        match self.dtype {
            D::Bool | D::U8 => it.map(|c| f(c[0] as f64)).collect(),
            D::I8 => it.map(|c| f(c[0] as i8 as f64)).collect(),
            D::I16 => it
                .map(|c| f(i16::from_le_bytes([c[0], c[1]]) as f64))
                .collect(),
            D::U16 => it
                .map(|c| f(u16::from_le_bytes([c[0], c[1]]) as f64))
                .collect(),
            D::F16 => it
                .map(|c| f(half::f16::from_le_bytes([c[0], c[1]]).to_f64()))
                .collect(),
            D::I32 => it
                .map(|c| f(i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64))
                .collect(),
            D::U32 => it
                .map(|c| f(u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64))
                .collect(),
            D::F32 => it
                .map(|c| f(f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64))
                .collect(),
            D::I64 => it.map(|c| f(i64::from_le_bytes(arr8(c)) as f64)).collect(),
            D::U64 => it.map(|c| f(u64::from_le_bytes(arr8(c)) as f64)).collect(),
            D::F64 => it.map(|c| f(f64::from_le_bytes(arr8(c)))).collect(),
        }
    }

    /// The array as a candle `f32` tensor on the CPU.
    pub fn to_candle_f32(&self) -> Result<candle_core::Tensor> {
        Ok(candle_core::Tensor::from_vec(
            self.to_f32()?,
            self.shape.as_slice(),
            &candle_core::Device::Cpu,
        )?)
    }
}

fn arr8(c: &[u8]) -> [u8; 8] {
    [c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]
}

fn bad(path: &Path, what: impl Into<String>) -> Error {
    Error::Npy {
        path: path.to_path_buf(),
        what: what.into(),
    }
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    b.get(at..at.checked_add(2)?)
        .map(|s| u16::from_le_bytes([s[0], s[1]]))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    b.get(at..at.checked_add(4)?)
        .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

fn read_file(path: &Path, limits: &Limits) -> Result<Vec<u8>> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let len = std::fs::metadata(path).map_err(io)?.len();
    limits.check(path, || "reading the file into memory".into(), len)?;
    std::fs::read(path).map_err(io)
}

/// Reads a `.npy` file.
pub fn read_npy(path: impl AsRef<Path>) -> Result<NpyArray> {
    read_npy_with(path, &Limits::default())
}

/// Reads a `.npy` file under `limits`.
pub fn read_npy_with(path: impl AsRef<Path>, limits: &Limits) -> Result<NpyArray> {
    let path = path.as_ref();
    parse_npy_with(&read_file(path, limits)?, path, limits)
}

/// Parses the bytes of a `.npy` file (`path` names it in errors).
pub fn parse_npy(b: &[u8], path: &Path) -> Result<NpyArray> {
    parse_npy_with(b, path, &Limits::default())
}

/// Parses the bytes of a `.npy` file under `limits`: an array larger than
/// [`Limits::max_alloc`] is an [`Error::Limit`] (checked before the data is copied).
pub fn parse_npy_with(b: &[u8], path: &Path, limits: &Limits) -> Result<NpyArray> {
    if b.len() < 10 || &b[..6] != b"\x93NUMPY" {
        return Err(bad(path, "not a .npy array (bad magic)"));
    }
    let (header_len, header_start) = match b[6] {
        1 => (u16_at(b, 8).map(usize::from), 10),
        2 | 3 => (u32_at(b, 8).map(|n| n as usize), 12),
        v => return Err(bad(path, format!("unsupported .npy version {v}"))),
    };
    let header_len = header_len.ok_or_else(|| bad(path, "truncated header"))?;
    let header_end = header_start + header_len; // at most 12 + u32::MAX: no overflow on 64-bit
    let header = b
        .get(header_start..header_end)
        .ok_or_else(|| bad(path, "truncated header"))?;
    let header = String::from_utf8_lossy(header);
    // The header is a Python dict literal: {'descr': '<f4', 'fortran_order': False, 'shape': (80, 201), }
    let field = |key: &str| -> Option<&str> {
        let i = header.find(&format!("'{key}'"))?;
        Some(header[i + key.len() + 2..].trim_start_matches([':', ' ']))
    };
    let descr = field("descr").ok_or_else(|| bad(path, "no 'descr' in the header"))?;
    let descr = descr
        .strip_prefix('\'')
        .and_then(|d| d.split('\'').next())
        .unwrap_or("");
    let dtype = NpyDtype::from_descr(descr).ok_or_else(|| {
        bad(
            path,
            format!(
                "unsupported dtype '{descr}' (little-endian bool, integers and floats are read)"
            ),
        )
    })?;
    if field("fortran_order").is_some_and(|f| f.starts_with("True")) {
        return Err(bad(path, "Fortran-order arrays are not supported"));
    }
    let shape_s = field("shape").ok_or_else(|| bad(path, "no 'shape' in the header"))?;
    let inner = shape_s
        .strip_prefix('(')
        .and_then(|s| s.split(')').next())
        .ok_or_else(|| bad(path, "bad 'shape'"))?;
    let shape = inner
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<usize>()
                .map_err(|_| bad(path, format!("bad shape ({inner})")))
        })
        .collect::<Result<Vec<_>>>()?;
    // The product of the non-zero dimensions must fit too: with a zero among them the array is
    // empty, but strides (candle's, taken from the last dimension up) would still overflow.
    let nbytes = shape
        .iter()
        .filter(|&&d| d != 0)
        .try_fold(dtype.size(), |a, &d| a.checked_mul(d))
        .map(|n| if shape.contains(&0) { 0 } else { n })
        .ok_or_else(|| bad(path, format!("shape ({inner}) is too large")))?;
    let body = b.get(header_end..).unwrap_or_default();
    if body.len() < nbytes {
        return Err(bad(
            path,
            format!(
                "{} data bytes for shape {shape:?} of {dtype:?} ({nbytes} needed)",
                body.len()
            ),
        ));
    }
    limits.check(path, || format!("array of shape {shape:?} ({dtype:?})"), nbytes as u64)?;
    Ok(NpyArray {
        shape,
        dtype,
        bytes: body[..nbytes].to_vec(),
    })
}

struct Entry {
    name: String,
    method: u16,
    compressed: usize,
    size: usize,
    local: usize,
}

/// An `.npz` archive: its entries are read on demand.
pub struct Npz {
    path: PathBuf,
    bytes: Vec<u8>,
    entries: Vec<Entry>,
    limits: Limits,
}

impl Npz {
    /// Reads an `.npz` file and its directory.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(path, &Limits::default())
    }

    /// Reads an `.npz` file and its directory under `limits` (an entry that would inflate
    /// past [`Limits::max_alloc`] is an [`Error::Limit`] when it is read).
    pub fn open_with(path: impl AsRef<Path>, limits: &Limits) -> Result<Self> {
        let path = path.as_ref();
        Self::from_bytes_with(path, read_file(path, limits)?, limits)
    }

    /// An archive held in memory (`path` names it in errors).
    pub fn from_bytes(path: impl Into<PathBuf>, bytes: Vec<u8>) -> Result<Self> {
        Self::from_bytes_with(path, bytes, &Limits::default())
    }

    /// An archive held in memory, read under `limits`.
    pub fn from_bytes_with(path: impl Into<PathBuf>, bytes: Vec<u8>, limits: &Limits) -> Result<Self> {
        let path = path.into();
        let zip = &bytes;
        let trunc = || bad(&path, "truncated zip structure");
        // End of central directory: the last occurrence of its signature.
        let eocd = (0..zip.len().saturating_sub(21))
            .rev()
            .find(|&i| zip[i..i + 4] == [0x50, 0x4b, 0x05, 0x06])
            .ok_or_else(|| {
                bad(
                    &path,
                    "not a zip archive (no end-of-central-directory record)",
                )
            })?;
        let count = u16_at(zip, eocd + 10).ok_or_else(trunc)? as usize;
        let dir = u32_at(zip, eocd + 16).ok_or_else(trunc)?;
        if dir == u32::MAX {
            return Err(bad(&path, "zip64 archives are not supported"));
        }
        let mut at = dir as usize;
        // A central directory record takes at least 46 bytes: the count cannot size the
        // allocation beyond what the file holds.
        let mut entries = Vec::with_capacity(count.min(zip.len() / 46));
        for _ in 0..count {
            if u32_at(zip, at) != Some(0x0201_4b50) {
                return Err(bad(&path, "corrupt zip central directory"));
            }
            let h = |off: usize| u16_at(zip, at.saturating_add(off)).map(usize::from).ok_or_else(trunc);
            let w = |off: usize| u32_at(zip, at.saturating_add(off)).map(|x| x as usize).ok_or_else(trunc);
            let (name_len, extra_len, comment_len) = (h(28)?, h(30)?, h(32)?);
            let name = zip.get(at.saturating_add(46)..at.saturating_add(46 + name_len)).ok_or_else(trunc)?;
            let name = String::from_utf8_lossy(name).into_owned();
            entries.push(Entry {
                method: h(10)? as u16,
                compressed: w(20)?,
                size: w(24)?,
                local: w(42)?,
                name,
            });
            at = at.saturating_add(46 + name_len + extra_len + comment_len);
        }
        Ok(Self {
            path,
            bytes,
            entries,
            limits: *limits,
        })
    }

    /// The arrays' names in archive order, without the `.npy` suffix (as `numpy.load` shows
    /// them).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries
            .iter()
            .map(|e| e.name.strip_suffix(".npy").unwrap_or(&e.name))
    }

    /// The array `name` (with or without `.npy`).
    pub fn get(&self, name: &str) -> Result<NpyArray> {
        let file = if name.ends_with(".npy") {
            name.to_string()
        } else {
            format!("{name}.npy")
        };
        let e = self
            .entries
            .iter()
            .find(|e| e.name == file || e.name == name)
            .ok_or_else(|| {
                bad(
                    &self.path,
                    format!(
                        "no array '{name}' (arrays: {})",
                        self.names().collect::<Vec<_>>().join(", ")
                    ),
                )
            })?;
        self.read(e)
    }

    /// Every array, in archive order, named as [`names`](Self::names) gives them.
    pub fn arrays(&self) -> Result<Vec<(String, NpyArray)>> {
        self.entries
            .iter()
            .zip(self.names())
            .map(|(e, n)| Ok((n.to_string(), self.read(e)?)))
            .collect()
    }

    fn read(&self, e: &Entry) -> Result<NpyArray> {
        let zip = &self.bytes;
        let path = &self.path;
        let trunc = || bad(path, format!("'{}': truncated entry", e.name));
        if u32_at(zip, e.local) != Some(0x0403_4b50) {
            return Err(bad(path, format!("'{}': corrupt zip local header", e.name)));
        }
        let name_len = u16_at(zip, e.local.saturating_add(26)).ok_or_else(trunc)? as usize;
        let extra_len = u16_at(zip, e.local.saturating_add(28)).ok_or_else(trunc)? as usize;
        let start = e.local.saturating_add(30 + name_len + extra_len);
        let raw = zip
            .get(start..start.checked_add(e.compressed).ok_or_else(trunc)?)
            .ok_or_else(trunc)?;
        let inflated;
        let data = match e.method {
            0 => raw,
            8 => {
                self.limits
                    .check(path, || format!("entry '{}' inflated", e.name), e.size as u64)?;
                inflated = miniz_oxide::inflate::decompress_to_vec_with_limit(raw, e.size.max(1))
                    .map_err(|err| bad(path, format!("'{}': inflating: {err:?}", e.name)))?;
                &inflated[..]
            }
            m => {
                return Err(bad(
                    path,
                    format!("'{}': zip compression method {m} is not supported", e.name),
                ))
            }
        };
        parse_npy_with(data, &path.join(&e.name), &self.limits)
    }
}

/// Every array of an `.npz` file, in archive order (names without `.npy`).
pub fn read_npz(path: impl AsRef<Path>) -> Result<Vec<(String, NpyArray)>> {
    Npz::open(path)?.arrays()
}

/// [`read_npz`] under `limits`.
pub fn read_npz_with(path: impl AsRef<Path>, limits: &Limits) -> Result<Vec<(String, NpyArray)>> {
    Npz::open_with(path, limits)?.arrays()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn npy(descr: &str, shape: &str, data: &[u8]) -> Vec<u8> {
        let mut header =
            format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
        while (10 + header.len() + 1) % 64 != 0 {
            header.push(' ');
        }
        header.push('\n');
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        b.extend((header.len() as u16).to_le_bytes());
        b.extend(header.as_bytes());
        b.extend(data);
        b
    }

    #[test]
    fn parses_types_and_shapes() {
        let p = Path::new("t.npy");
        let f: Vec<u8> = [1.5f32, -2.0, 3.25, 0.0, 7.0, 8.0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let a = parse_npy(&npy("<f4", "(2, 3)", &f), p).unwrap();
        assert_eq!(
            (a.shape.as_slice(), a.dtype),
            (&[2usize, 3][..], NpyDtype::F32)
        );
        assert_eq!(a.to_f32().unwrap(), [1.5, -2.0, 3.25, 0.0, 7.0, 8.0]);
        let a = parse_npy(&npy("|i1", "(3,)", &[255, 1, 128]), p).unwrap();
        assert_eq!(a.to_f64().unwrap(), [-1.0, 1.0, -128.0]);
        let a = parse_npy(
            &npy("<f2", "()", &half::f16::from_f32(0.5).to_le_bytes()),
            p,
        )
        .unwrap();
        assert_eq!((a.len(), a.to_f32().unwrap()), (1, vec![0.5]));
    }

    #[test]
    fn bad_input_is_an_error_naming_it() {
        let p = Path::new("t.npy");
        let err = |b: &[u8]| parse_npy(b, p).unwrap_err().to_string();
        assert!(err(b"nonsense!!!").contains("bad magic"));
        assert!(err(&npy(">f4", "(1,)", &[0; 4])).contains("unsupported dtype '>f4'"));
        assert!(err(&npy("<f4", "(2,)", &[0; 4])).contains("4 data bytes"));
        assert!(
            err(&npy("<f4", "(99999999999, 99999999999, 9999999999)", &[])).contains("too large")
        );
        let mut cut = npy("<f4", "(1,)", &[0; 4]);
        cut.truncate(20);
        assert!(err(&cut).contains("truncated header"));
        assert!(Npz::from_bytes("x.npz", b"not a zip".to_vec()).is_err());
    }
}
