//! One member of a zip archive whose bytes are spread over several files (the pieces of a
//! split archive, joined in order), read without joining them on disk.

use crate::{Error, Result};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// Files read as one stream, in order.
pub(crate) struct Parts {
    files: Vec<(PathBuf, u64)>,
    total: u64,
    pos: u64,
    open: Option<(usize, std::fs::File)>,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io { path: path.to_path_buf(), source }
}

impl Parts {
    pub(crate) fn new(paths: &[PathBuf]) -> Result<Self> {
        let mut files = Vec::with_capacity(paths.len());
        let mut total = 0;
        for p in paths {
            let len = std::fs::metadata(p).map_err(io(p))?.len();
            files.push((p.clone(), len));
            total += len;
        }
        Ok(Self { files, total, pos: 0, open: None })
    }

    pub(crate) fn len(&self) -> u64 {
        self.total
    }

    /// Fill `buf` from byte `pos` of the joined stream; fewer bytes only at its end.
    fn read_at(&mut self, mut pos: u64, buf: &mut [u8]) -> Result<usize> {
        let mut done = 0;
        while done < buf.len() && pos < self.total {
            let (mut i, mut start) = (0, 0u64);
            while start + self.files[i].1 <= pos {
                start += self.files[i].1;
                i += 1;
            }
            if self.open.as_ref().map(|o| o.0) != Some(i) {
                let p = &self.files[i].0;
                self.open = Some((i, std::fs::File::open(p).map_err(io(p))?));
            }
            let path = self.files[i].0.clone();
            let Some((_, f)) = self.open.as_mut() else { unreachable!("opened above") };
            let within = pos - start;
            let want = ((self.files[i].1 - within) as usize).min(buf.len() - done);
            f.seek(SeekFrom::Start(within)).map_err(io(&path))?;
            f.read_exact(&mut buf[done..done + want]).map_err(io(&path))?;
            done += want;
            pos += want as u64;
        }
        Ok(done)
    }

    fn exact_at(&mut self, pos: u64, buf: &mut [u8], what: &str) -> Result<()> {
        if self.read_at(pos, buf)? != buf.len() {
            return Err(corrupt(format!("{what} at byte {pos} runs past the end of the archive")));
        }
        Ok(())
    }
}

impl Read for Parts {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.read_at(self.pos, buf).map_err(std::io::Error::other)?;
        self.pos += n as u64;
        Ok(n)
    }
}

fn corrupt(what: String) -> Error {
    Error::Archive(what)
}

fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}
fn u64_at(b: &[u8], o: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[o..o + 8]);
    u64::from_le_bytes(a)
}

/// Where a member's data is and how it is stored.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Member {
    /// Byte of the compressed data in the joined parts.
    pub data_start: u64,
    pub compressed: u64,
    pub uncompressed: u64,
    /// 0 stored, 8 deflate.
    pub method: u16,
    pub crc32: u32,
}

/// Find `name` in the archive's central directory. `archive_offset`: where the parts start
/// in the whole archive (the directory's offsets count from the archive's first byte).
pub(crate) fn find_member(parts: &mut Parts, name: &str, archive_offset: u64) -> Result<Member> {
    let len = parts.len();
    // End of central directory: 22 bytes plus a comment of up to 64 KiB, at the very end.
    let tail_len = len.min(22 + 65535);
    let mut tail = vec![0u8; tail_len as usize];
    parts.exact_at(len - tail_len, &mut tail, "end of central directory")?;
    let eocd = (0..tail.len().saturating_sub(21))
        .rev()
        .find(|&i| u32_at(&tail, i) == 0x0605_4b50)
        .ok_or_else(|| corrupt("no end-of-central-directory record: not a zip archive (or not its last piece)".into()))?;
    let mut entries = u16_at(&tail, eocd + 10) as u64;
    let mut cd_size = u32_at(&tail, eocd + 12) as u64;
    let mut cd_offset = u32_at(&tail, eocd + 16) as u64;
    if (entries == 0xFFFF || cd_size == 0xFFFF_FFFF || cd_offset == 0xFFFF_FFFF) && eocd >= 20 && u32_at(&tail, eocd - 20) == 0x0706_4b50 {
        // Zip64: the locator just before the record points at the Zip64 end record.
        let z64 = u64_at(&tail, eocd - 20 + 8);
        let z64 = z64.checked_sub(archive_offset).ok_or_else(|| corrupt("Zip64 end record lies before the parts".into()))?;
        let mut rec = [0u8; 56];
        parts.exact_at(z64, &mut rec, "Zip64 end of central directory")?;
        if u32_at(&rec, 0) != 0x0606_4b50 {
            return Err(corrupt(format!("no Zip64 end record at byte {z64}")));
        }
        entries = u64_at(&rec, 32);
        cd_size = u64_at(&rec, 40);
        cd_offset = u64_at(&rec, 48);
    }
    let cd_start = cd_offset
        .checked_sub(archive_offset)
        .ok_or_else(|| corrupt(format!("the central directory (archive byte {cd_offset}) lies before the parts (archive byte {archive_offset})")))?;
    if cd_start + cd_size > len {
        return Err(corrupt(format!("the central directory ({cd_size} bytes at {cd_start}) runs past the end of the parts ({len} bytes)")));
    }
    let mut cd = vec![0u8; cd_size as usize];
    parts.exact_at(cd_start, &mut cd, "central directory")?;
    let mut o = 0usize;
    for _ in 0..entries {
        if o + 46 > cd.len() || u32_at(&cd, o) != 0x0201_4b50 {
            return Err(corrupt(format!("central directory entry at byte {} is damaged", cd_start + o as u64)));
        }
        let method = u16_at(&cd, o + 10);
        let crc32 = u32_at(&cd, o + 16);
        let mut compressed = u32_at(&cd, o + 20) as u64;
        let mut uncompressed = u32_at(&cd, o + 24) as u64;
        let (nl, xl, cl) = (u16_at(&cd, o + 28) as usize, u16_at(&cd, o + 30) as usize, u16_at(&cd, o + 32) as usize);
        let mut local = u32_at(&cd, o + 42) as u64;
        let end = o + 46 + nl + xl + cl;
        if end > cd.len() {
            return Err(corrupt("central directory entry runs past the directory".into()));
        }
        let entry_name = &cd[o + 46..o + 46 + nl];
        if entry_name == name.as_bytes() {
            // Zip64 extra field: the 64-bit values, in order, for the fields set to all ones.
            let mut x = o + 46 + nl;
            while x + 4 <= o + 46 + nl + xl {
                let (id, size) = (u16_at(&cd, x), u16_at(&cd, x + 2) as usize);
                if id == 1 {
                    let mut p = x + 4;
                    for v in [&mut uncompressed, &mut compressed, &mut local] {
                        if *v == 0xFFFF_FFFF && p + 8 <= x + 4 + size {
                            *v = u64_at(&cd, p);
                            p += 8;
                        }
                    }
                }
                x += 4 + size;
            }
            let local = local
                .checked_sub(archive_offset)
                .ok_or_else(|| corrupt(format!("'{name}' starts at archive byte {local}, before the parts (archive byte {archive_offset})")))?;
            let mut lh = [0u8; 30];
            parts.exact_at(local, &mut lh, "local file header")?;
            if u32_at(&lh, 0) != 0x0403_4b50 {
                return Err(corrupt(format!("no local file header for '{name}' at byte {local} (wrong archive_offset?)")));
            }
            let data_start = local + 30 + u16_at(&lh, 26) as u64 + u16_at(&lh, 28) as u64;
            if data_start + compressed > len {
                return Err(corrupt(format!("'{name}' ({compressed} bytes at {data_start}) runs past the end of the parts")));
            }
            if method != 0 && method != 8 {
                return Err(corrupt(format!("'{name}' uses compression method {method} (only stored and deflate are read)")));
            }
            return Ok(Member { data_start, compressed, uncompressed, method, crc32 });
        }
        o = end;
    }
    Err(corrupt(format!("the archive has no member '{name}'")))
}

/// Stream the member's uncompressed bytes to `sink`, with the compressed bytes read so far.
pub(crate) fn extract(parts: &mut Parts, m: &Member, sink: &mut dyn FnMut(&[u8], u64) -> Result<()>) -> Result<u64> {
    use miniz_oxide::inflate::stream::{inflate, InflateState};
    use miniz_oxide::{DataFormat, MZError, MZFlush, MZStatus};
    let mut inbuf = vec![0u8; 1 << 20];
    let mut read = 0u64;
    let mut written = 0u64;
    if m.method == 0 {
        while read < m.compressed {
            let n = ((m.compressed - read) as usize).min(inbuf.len());
            parts.exact_at(m.data_start + read, &mut inbuf[..n], "member data")?;
            read += n as u64;
            sink(&inbuf[..n], read)?;
            written += n as u64;
        }
    } else {
        let mut state = InflateState::new_boxed(DataFormat::Raw);
        let mut outbuf = vec![0u8; 1 << 20];
        let (mut s, mut e) = (0usize, 0usize);
        loop {
            if s == e && read < m.compressed {
                let n = ((m.compressed - read) as usize).min(inbuf.len());
                parts.exact_at(m.data_start + read, &mut inbuf[..n], "member data")?;
                read += n as u64;
                (s, e) = (0, n);
            }
            let r = inflate(&mut state, &inbuf[s..e], &mut outbuf, MZFlush::None);
            s += r.bytes_consumed;
            if r.bytes_written > 0 {
                written += r.bytes_written as u64;
                sink(&outbuf[..r.bytes_written], read)?;
            }
            match r.status {
                Ok(MZStatus::StreamEnd) => break,
                Ok(_) | Err(MZError::Buf) => {
                    if r.bytes_consumed == 0 && r.bytes_written == 0 && s == e && read >= m.compressed {
                        return Err(corrupt("the deflate stream ends early (truncated member)".into()));
                    }
                }
                Err(e) => return Err(corrupt(format!("bad deflate data: {e:?}"))),
            }
        }
    }
    if written != m.uncompressed {
        return Err(corrupt(format!("member inflated to {written} bytes, the directory says {}", m.uncompressed)));
    }
    Ok(written)
}
