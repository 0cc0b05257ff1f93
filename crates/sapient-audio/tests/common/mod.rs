//! Shared test helpers: real data through sapient-hub, reference arrays from
//! tests/data/audio (made by scripts/audio/make_reference.py), small signal tools.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

pub const CLIPS: [&str; 5] = ["0870", "0880", "0890", "0920", "0930"];

pub fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/audio")
}

/// Files of a built-in preset (fetched on first use, sha256-checked, cached).
pub fn preset(id: &str) -> sapient_hub::ResolvedModel {
    sapient_hub::Hub::new()
        .and_then(|h| h.fetch_preset(id, &mut |_| {}))
        .unwrap_or_else(|e| panic!("fetching preset {id}: {e}"))
}

/// Files of a preset from tests/data/audio/codec-samples.toml.
pub fn codec_sample(id: &str, role: &str) -> PathBuf {
    let reg = sapient_hub::Registry::from_path(&data_dir().join("codec-samples.toml")).expect("codec-samples.toml");
    let m = sapient_hub::Hub::new()
        .map(|h| h.with_registry(reg))
        .and_then(|h| h.fetch_preset(id, &mut |_| {}))
        .unwrap_or_else(|e| panic!("fetching {id}: {e}"));
    m.file(role).expect("role").to_path_buf()
}

pub fn clip(c: &str) -> PathBuf {
    let m = preset("speech-librivox");
    let name = format!("sense_and_sensibility_01_austen_64kb-{c}.wav");
    m.files("audio")
        .iter()
        .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy() == name))
        .unwrap_or_else(|| panic!("clip {name} not in speech-librivox"))
        .clone()
}

pub fn clip_samples(c: &str) -> Vec<f32> {
    let a = sapient_audio::decode_file(clip(c)).expect("decode clip");
    assert_eq!(a.sample_rate, 16_000);
    a.samples
}

pub fn silero(role: &str) -> PathBuf {
    preset("silero-vad").file(role).expect("silero file").to_path_buf()
}

pub fn mel_filters_npz() -> PathBuf {
    preset("whisper-assets").file("mel_filters").expect("mel_filters").to_path_buf()
}

pub fn json(name: &str) -> serde_json::Value {
    let p = data_dir().join(name);
    serde_json::from_str(&std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))).expect("json")
}

/// A reference array: its shape and values.
pub struct NpyArray {
    pub shape: Vec<usize>,
    pub data: Vec<f64>,
}

pub fn npy(name: &str) -> NpyArray {
    let a = sapient_tensor::npy::read_npy(data_dir().join(name)).expect("npy");
    NpyArray { data: a.to_f64().expect("npy values"), shape: a.shape }
}

pub fn f32s(v: &serde_json::Value) -> Vec<f32> {
    v.as_array().expect("array").iter().map(|x| x.as_f64().expect("number") as f32).collect()
}

/// The clips joined by silences, as `CONCAT` in make_reference.py.
pub fn concat_audio() -> Vec<f32> {
    let spec = json("vad_segments.json");
    let mut out = Vec::new();
    for part in spec["concat"].as_array().expect("concat") {
        out.extend(clip_samples(part[0].as_str().expect("clip")));
        out.extend(std::iter::repeat_n(0.0f32, part[1].as_u64().expect("gap") as usize));
    }
    out
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "lengths differ");
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// Deterministic uniform noise in [-amp, amp] (xorshift).
pub fn noise(n: usize, amp: f32, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * amp
        })
        .collect()
}

/// Deterministic chunk lengths in 1..=max.
pub fn chunk_lengths(total: usize, max: usize, seed: u64) -> Vec<usize> {
    let mut s = seed | 1;
    let mut out = Vec::new();
    let mut left = total;
    while left > 0 {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        let n = (1 + (s % max as u64) as usize).min(left);
        out.push(n);
        left -= n;
    }
    out
}

/// A WAV file: `fmt ` with the given tag/bits, then `data`.
pub fn wav(tag: u16, channels: u16, rate: u32, bits: u16, data: &[u8]) -> Vec<u8> {
    let block = channels * bits / 8;
    let mut v = Vec::new();
    v.extend_from_slice(b"RIFF");
    v.extend_from_slice(&(36 + data.len() as u32).to_le_bytes());
    v.extend_from_slice(b"WAVEfmt ");
    v.extend_from_slice(&16u32.to_le_bytes());
    v.extend_from_slice(&tag.to_le_bytes());
    v.extend_from_slice(&channels.to_le_bytes());
    v.extend_from_slice(&rate.to_le_bytes());
    v.extend_from_slice(&(rate * block as u32).to_le_bytes());
    v.extend_from_slice(&block.to_le_bytes());
    v.extend_from_slice(&bits.to_le_bytes());
    v.extend_from_slice(b"data");
    v.extend_from_slice(&(data.len() as u32).to_le_bytes());
    v.extend_from_slice(data);
    v
}

/// The 16-bit samples of a canonical PCM WAV file (header parsed by hand).
pub fn wav_s16(bytes: &[u8]) -> Vec<i16> {
    let mut at = 12;
    while at + 8 <= bytes.len() {
        let id = &bytes[at..at + 4];
        let len = u32::from_le_bytes([bytes[at + 4], bytes[at + 5], bytes[at + 6], bytes[at + 7]]) as usize;
        if id == b"data" {
            return bytes[at + 8..at + 8 + len].chunks_exact(2).map(|c| i16::from_le_bytes([c[0], c[1]])).collect();
        }
        at += 8 + len + (len & 1);
    }
    panic!("no data chunk")
}

/// A minimal FLAC encoder (verbatim subframes, 16-bit, one channel) so the FLAC decoder can
/// be checked bit-exactly on real speech without checking in an audio file.
pub fn flac_verbatim(samples: &[i16], rate: u32) -> Vec<u8> {
    struct Bits {
        out: Vec<u8>,
        acc: u64,
        n: u32,
    }
    impl Bits {
        fn put(&mut self, v: u64, bits: u32) {
            for i in (0..bits).rev() {
                self.acc = (self.acc << 1) | ((v >> i) & 1);
                self.n += 1;
                if self.n == 8 {
                    self.out.push(self.acc as u8);
                    self.acc = 0;
                    self.n = 0;
                }
            }
        }
    }
    fn crc8(d: &[u8]) -> u8 {
        let mut c = 0u8;
        for &b in d {
            c ^= b;
            for _ in 0..8 {
                c = if c & 0x80 != 0 { (c << 1) ^ 0x07 } else { c << 1 };
            }
        }
        c
    }
    fn crc16(d: &[u8]) -> u16 {
        let mut c = 0u16;
        for &b in d {
            c ^= (b as u16) << 8;
            for _ in 0..8 {
                c = if c & 0x8000 != 0 { (c << 1) ^ 0x8005 } else { c << 1 };
            }
        }
        c
    }
    const BLOCK: usize = 4096;
    let mut out = b"fLaC".to_vec();
    // STREAMINFO (last metadata block)
    let mut si = Bits { out: Vec::new(), acc: 0, n: 0 };
    si.put(BLOCK as u64, 16);
    si.put(BLOCK as u64, 16);
    si.put(0, 24);
    si.put(0, 24);
    si.put(rate as u64, 20);
    si.put(0, 3); // channels - 1
    si.put(15, 5); // bits - 1
    si.put(samples.len() as u64, 36);
    si.put(0, 64);
    si.put(0, 64); // MD5 unknown
    out.push(0x80);
    out.extend_from_slice(&(si.out.len() as u32).to_be_bytes()[1..]);
    out.extend_from_slice(&si.out);
    for (i, block) in samples.chunks(BLOCK).enumerate() {
        let mut f = Bits { out: Vec::new(), acc: 0, n: 0 };
        f.put(0b11_1111_1111_1110, 14); // sync code
        f.put(0, 1);
        f.put(0, 1); // fixed block size
        f.put(0b0111, 4); // block size: 16-bit (n-1) at the end of the header
        f.put(0b0000, 4); // sample rate from STREAMINFO
        f.put(0b0000, 4); // mono
        f.put(0b100, 3); // 16 bits per sample
        f.put(0, 1);
        // frame number, UTF-8 coded
        let n = i as u32;
        if n < 0x80 {
            f.put(n as u64, 8);
        } else {
            assert!(n < 0x800);
            f.put((0xC0 | (n >> 6)) as u64, 8);
            f.put((0x80 | (n & 0x3f)) as u64, 8);
        }
        f.put(block.len() as u64 - 1, 16);
        let c = crc8(&f.out);
        f.put(c as u64, 8);
        f.put(0, 1);
        f.put(0b000001, 6); // VERBATIM
        f.put(0, 1);
        for &s in block {
            f.put(s as u16 as u64, 16);
        }
        let c = crc16(&f.out);
        f.put(c as u64, 16);
        out.extend_from_slice(&f.out);
    }
    out
}
