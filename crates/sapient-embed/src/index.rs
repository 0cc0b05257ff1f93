//! A small in-memory vector index: exact cosine top-k over unit vectors (a SIMD dot
//! product per entry), saved to and loaded from one file.
//!
//! File layout (little-endian): magic `SAPVIDX\0`, u32 version (1), u32 dimensions,
//! u64 entries, u32 length + UTF-8 model id; then per entry the vector (f32 x dimensions);
//! then per entry u32 length + UTF-8 text; then a u64 FNV-1a hash of everything before it.

use crate::{Error, Result};
use sapient_tensor::kernels;
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"SAPVIDX\0";
const VERSION: u32 = 1;

/// One search result.
#[derive(Debug, Clone, PartialEq)]
pub struct Hit<'a> {
    /// Position in insertion order.
    pub index: usize,
    /// Cosine similarity to the query.
    pub score: f32,
    pub text: &'a str,
}

#[derive(Debug, Clone, PartialEq)]
pub struct VectorIndex {
    model: String,
    dim: usize,
    vectors: Vec<f32>,
    texts: Vec<String>,
}

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

impl VectorIndex {
    /// An empty index for vectors of `dim` values from `model` (kept to embed queries with
    /// the same model).
    pub fn new(model: &str, dim: usize) -> Self {
        Self { model: model.to_string(), dim, vectors: Vec::new(), texts: Vec::new() }
    }
    pub fn model(&self) -> &str {
        &self.model
    }
    pub fn dimensions(&self) -> usize {
        self.dim
    }
    pub fn len(&self) -> usize {
        self.texts.len()
    }
    pub fn is_empty(&self) -> bool {
        self.texts.is_empty()
    }
    pub fn text(&self, i: usize) -> Option<&str> {
        self.texts.get(i).map(String::as_str)
    }

    /// Add a text and its vector (normalised here).
    pub fn add(&mut self, text: &str, vector: &[f32]) -> Result<()> {
        if vector.len() != self.dim {
            return Err(Error::Options(format!("vector of {} values for an index of {} dimensions", vector.len(), self.dim)));
        }
        let mut v = vector.to_vec();
        crate::normalize(&mut v);
        self.vectors.extend_from_slice(&v);
        self.texts.push(text.to_string());
        Ok(())
    }

    /// The `k` entries most similar to `query` (cosine), best first.
    pub fn search(&self, query: &[f32], k: usize) -> Result<Vec<Hit<'_>>> {
        if query.len() != self.dim {
            return Err(Error::Options(format!("query of {} values for an index of {} dimensions", query.len(), self.dim)));
        }
        let mut q = query.to_vec();
        crate::normalize(&mut q);
        let mut scored: Vec<(f32, usize)> =
            self.vectors.chunks_exact(self.dim).enumerate().map(|(i, v)| (kernels::dot_f32(&q, v), i)).collect();
        let k = k.min(scored.len());
        let by = |a: &(f32, usize), b: &(f32, usize)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
        if k < scored.len() && k > 0 {
            scored.select_nth_unstable_by(k - 1, by);
        }
        scored.truncate(k);
        scored.sort_by(by);
        Ok(scored.into_iter().map(|(score, index)| Hit { index, score, text: &self.texts[index] }).collect())
    }

    /// Write the index to `path` (through a temp file renamed into place).
    pub fn save(&self, path: &Path) -> Result<()> {
        let mut b = Vec::with_capacity(32 + self.vectors.len() * 4);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&(self.dim as u32).to_le_bytes());
        b.extend_from_slice(&(self.texts.len() as u64).to_le_bytes());
        b.extend_from_slice(&(self.model.len() as u32).to_le_bytes());
        b.extend_from_slice(self.model.as_bytes());
        for v in &self.vectors {
            b.extend_from_slice(&v.to_le_bytes());
        }
        for t in &self.texts {
            b.extend_from_slice(&(t.len() as u32).to_le_bytes());
            b.extend_from_slice(t.as_bytes());
        }
        let h = fnv1a(&b);
        b.extend_from_slice(&h.to_le_bytes());
        let io = |source| Error::Io { path: path.to_path_buf(), source };
        let tmp = path.with_extension(format!("partial.{}", std::process::id()));
        std::fs::write(&tmp, &b).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }

    /// Read an index written by [`VectorIndex::save`]; a damaged or foreign file is an
    /// [`Error::Index`] saying what is wrong.
    pub fn load(path: &Path) -> Result<Self> {
        let b = std::fs::read(path).map_err(|source| Error::Io { path: path.to_path_buf(), source })?;
        Self::from_bytes(&b, path)
    }

    fn from_bytes(b: &[u8], path: &Path) -> Result<Self> {
        let bad = |what: String| Error::Index { path: PathBuf::from(path), what };
        if b.len() < 8 || &b[..8] != MAGIC {
            return Err(bad("not a sapient vector index (wrong magic bytes)".into()));
        }
        if b.len() < 8 + 4 + 4 + 8 + 4 + 8 {
            return Err(bad(format!("truncated: {} bytes is shorter than the header", b.len())));
        }
        let (body, tail) = b.split_at(b.len() - 8);
        let mut r = Reader { b: body, o: 8 };
        let version = r.u32();
        if version != VERSION {
            return Err(bad(format!("format version {version} (this build reads version {VERSION})")));
        }
        let stored = u64::from_le_bytes(tail.try_into().map_err(|_| bad("truncated checksum".into()))?);
        let dim = r.u32() as usize;
        let n = r.u64();
        let model = r.string().ok_or_else(|| bad("truncated or invalid model id".into()))?;
        if dim == 0 {
            return Err(bad("0 dimensions".into()));
        }
        let vec_bytes = (n as u128) * (dim as u128) * 4;
        if vec_bytes > (body.len() - r.o) as u128 {
            return Err(bad(format!("{n} vectors of {dim} dimensions need {vec_bytes} bytes, the file has {} after the header (truncated?)", body.len() - r.o)));
        }
        let vectors: Vec<f32> = body[r.o..r.o + vec_bytes as usize].chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        r.o += vec_bytes as usize;
        let mut texts = Vec::with_capacity(n as usize);
        for i in 0..n {
            texts.push(r.string().ok_or_else(|| bad(format!("text {i} of {n} is truncated or not UTF-8")))?);
        }
        if r.o != body.len() {
            return Err(bad(format!("{} unexpected bytes after the last text", body.len() - r.o)));
        }
        if fnv1a(body) != stored {
            return Err(bad("checksum mismatch: the file is corrupt".into()));
        }
        Ok(Self { model, dim, vectors, texts })
    }
}

struct Reader<'a> {
    b: &'a [u8],
    o: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let s = self.b.get(self.o..self.o.checked_add(n)?)?;
        self.o += n;
        Some(s)
    }
    fn u32(&mut self) -> u32 {
        self.take(4).map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]])).unwrap_or(0)
    }
    fn u64(&mut self) -> u64 {
        self.take(8).map(|s| u64::from_le_bytes(s.try_into().unwrap_or([0; 8]))).unwrap_or(0)
    }
    fn string(&mut self) -> Option<String> {
        let n = self.take(4).map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))? as usize;
        String::from_utf8(self.take(n)?.to_vec()).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> VectorIndex {
        let mut ix = VectorIndex::new("m", 3);
        ix.add("x axis", &[2.0, 0.0, 0.0]).unwrap();
        ix.add("y axis", &[0.0, 1.0, 0.0]).unwrap();
        ix.add("xy", &[1.0, 1.0, 0.0]).unwrap();
        ix.add("z", &[0.0, 0.0, -3.0]).unwrap();
        ix
    }

    #[test]
    fn exact_top_k_by_cosine() {
        let ix = sample();
        let hits = ix.search(&[1.0, 0.2, 0.0], 2).unwrap();
        assert_eq!(hits.iter().map(|h| h.text).collect::<Vec<_>>(), ["x axis", "xy"]);
        let want = 1.0 / (1.0f32 + 0.04).sqrt();
        assert!((hits[0].score - want).abs() < 1e-6, "{}", hits[0].score);
        assert_eq!(ix.search(&[0.0, 0.0, 1.0], 10).unwrap().len(), 4);
        assert_eq!(ix.search(&[0.0, 0.0, 1.0], 10).unwrap().last().unwrap().text, "z");
        assert!(ix.search(&[1.0, 0.0], 1).is_err());
    }

    #[test]
    fn save_load_and_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ix.bin");
        let ix = sample();
        ix.save(&p).unwrap();
        assert_eq!(VectorIndex::load(&p).unwrap(), ix);
        let good = std::fs::read(&p).unwrap();
        let err = |b: &[u8]| VectorIndex::from_bytes(b, &p).unwrap_err().to_string();
        assert!(err(b"hello").contains("wrong magic"), "{}", err(b"hello"));
        assert!(err(&good[..good.len() - 30]).contains("truncated") || err(&good[..good.len() - 30]).contains("checksum"));
        let mut flipped = good.clone();
        flipped[40] ^= 1;
        assert!(err(&flipped).contains("checksum"), "{}", err(&flipped));
        let mut v2 = good.clone();
        v2[8] = 2;
        assert!(err(&v2).contains("version 2"), "{}", err(&v2));
        let mut huge = good.clone();
        huge[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(err(&huge).contains("need"), "{}", err(&huge));
    }
}
