//! Just enough of NumPy's `.npy` and `.npz` (a zip of `.npy` files, stored or deflated) to
//! read Whisper's `mel_filters.npz` and float reference arrays.

use crate::error::{Error, Result};

/// A float array read from a `.npy` entry, as f64, with its shape.
#[derive(Debug, Clone)]
pub struct NpyArray {
    pub shape: Vec<usize>,
    pub data: Vec<f64>,
}

fn bad(msg: impl Into<String>) -> Error {
    Error::MelFilters(msg.into())
}

fn u16_at(b: &[u8], at: usize) -> Result<u16> {
    b.get(at..at + 2).map(|s| u16::from_le_bytes([s[0], s[1]])).ok_or_else(|| bad("npz: truncated zip structure"))
}

fn u32_at(b: &[u8], at: usize) -> Result<u32> {
    b.get(at..at + 4).map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]])).ok_or_else(|| bad("npz: truncated zip structure"))
}

/// Reads a `.npy` file.
pub fn read_npy(path: impl AsRef<std::path::Path>) -> Result<NpyArray> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|source| Error::Io { path: path.to_path_buf(), source })?;
    parse_npy(&bytes)
}

/// Reads the entry `name` (e.g. `mel_80.npy`) of an npz archive held in memory.
pub fn read_npz_entry(zip: &[u8], name: &str) -> Result<NpyArray> {
    // End of central directory: the last occurrence of its signature.
    let eocd = (0..zip.len().saturating_sub(21))
        .rev()
        .find(|&i| zip[i..i + 4] == [0x50, 0x4b, 0x05, 0x06])
        .ok_or_else(|| bad("npz: not a zip archive (no end-of-central-directory record)"))?;
    let count = u16_at(zip, eocd + 10)? as usize;
    let mut at = u32_at(zip, eocd + 16)? as usize;
    let mut names = Vec::new();
    for _ in 0..count {
        if u32_at(zip, at)? != 0x0201_4b50 {
            return Err(bad("npz: corrupt central directory"));
        }
        let method = u16_at(zip, at + 10)?;
        let comp = u32_at(zip, at + 20)? as usize;
        let size = u32_at(zip, at + 24)? as usize;
        let name_len = u16_at(zip, at + 28)? as usize;
        let extra_len = u16_at(zip, at + 30)? as usize;
        let comment_len = u16_at(zip, at + 32)? as usize;
        let local = u32_at(zip, at + 42)? as usize;
        let entry = zip.get(at + 46..at + 46 + name_len).ok_or_else(|| bad("npz: truncated entry name"))?;
        let entry = String::from_utf8_lossy(entry).into_owned();
        at += 46 + name_len + extra_len + comment_len;
        if entry != name {
            names.push(entry);
            continue;
        }
        if u32_at(zip, local)? != 0x0403_4b50 {
            return Err(bad("npz: corrupt local header"));
        }
        let start = local + 30 + u16_at(zip, local + 26)? as usize + u16_at(zip, local + 28)? as usize;
        let raw = zip.get(start..start + comp).ok_or_else(|| bad("npz: truncated entry data"))?;
        let bytes = match method {
            0 => raw.to_vec(),
            8 => miniz_oxide::inflate::decompress_to_vec_with_limit(raw, size.max(1) * 2)
                .map_err(|e| bad(format!("npz: inflating {name}: {e:?}")))?,
            m => return Err(bad(format!("npz: compression method {m} is not supported"))),
        };
        return parse_npy(&bytes);
    }
    Err(bad(format!("npz: no entry {name} (entries: {})", names.join(", "))))
}

/// Parses a `.npy` file of little-endian f4 or f8 in C order.
pub fn parse_npy(b: &[u8]) -> Result<NpyArray> {
    if b.len() < 10 || &b[..6] != b"\x93NUMPY" {
        return Err(bad("npy: bad magic"));
    }
    let (header_len, header_start) = match b[6] {
        1 => (u16_at(b, 8)? as usize, 10),
        2 | 3 => (u32_at(b, 8)? as usize, 12),
        v => return Err(bad(format!("npy: unsupported version {v}"))),
    };
    let header = b.get(header_start..header_start + header_len).ok_or_else(|| bad("npy: truncated header"))?;
    let header = String::from_utf8_lossy(header);
    let field = |key: &str| -> Option<String> {
        let i = header.find(&format!("'{key}'"))?;
        Some(header[i + key.len() + 2..].trim_start_matches([':', ' ']).to_string())
    };
    let descr = field("descr").ok_or_else(|| bad("npy: no descr"))?;
    let width = if descr.starts_with("'<f4'") {
        4
    } else if descr.starts_with("'<f8'") {
        8
    } else {
        return Err(bad(format!("npy: unsupported dtype {}", descr.split(',').next().unwrap_or(""))));
    };
    if field("fortran_order").is_some_and(|f| f.starts_with("True")) {
        return Err(bad("npy: Fortran order is not supported"));
    }
    let shape_s = field("shape").ok_or_else(|| bad("npy: no shape"))?;
    let inner = shape_s.trim_start_matches('(').split(')').next().unwrap_or("");
    let shape = inner
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<usize>().map_err(|_| bad(format!("npy: bad shape {inner}"))))
        .collect::<Result<Vec<_>>>()?;
    let n: usize = shape.iter().product();
    let body = &b[header_start + header_len..];
    if body.len() < n * width {
        return Err(bad(format!("npy: {} data bytes for shape {shape:?}", body.len())));
    }
    let data = if width == 4 {
        body.chunks_exact(4).take(n).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64).collect()
    } else {
        body.chunks_exact(8).take(n).map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])).collect()
    };
    Ok(NpyArray { shape, data })
}
