//! Hostile PyTorch voice archives (`.pt`): a tensor whose pickled shape claims 2^32 values, a
//! storage offset past its data, a file over the `Limits` ceiling. Each is an error naming
//! the tensor and the sizes, within a second, with a heap peak no larger than the file.

#[path = "../../sapient-tensor/tests/support/hostile.rs"]
mod support;

use sapient_kokoro::Voices;
use sapient_tensor::Limits;
use std::io::{Read, Write};
use support::hostile;

#[global_allocator]
static METER: support::Meter = support::Meter;

/// `tests/data/pt_bare.pt` (a [5, 1, 4] f32 tensor) with `from` replaced by `to` in its pickle.
fn patched(dir: &std::path::Path, from: &[u8], to: &[u8]) -> (std::path::PathBuf, usize) {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/pt_bare.pt");
    let mut zin = zip::ZipArchive::new(std::fs::File::open(src).unwrap()).unwrap();
    let out = dir.join("pt_bare.pt");
    let mut zout = zip::ZipWriter::new(std::fs::File::create(&out).unwrap());
    let opts = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for i in 0..zin.len() {
        let mut e = zin.by_index(i).unwrap();
        let mut b = Vec::new();
        e.read_to_end(&mut b).unwrap();
        let name = e.name().unwrap().into_owned();
        if name.ends_with("data.pkl") {
            let at = b.windows(from.len()).position(|w| w == from).expect("pattern in the pickle");
            b.splice(at..at + from.len(), to.iter().copied());
        }
        zout.start_file(name, opts).unwrap();
        zout.write_all(&b).unwrap();
    }
    zout.finish().unwrap();
    let len = std::fs::metadata(&out).unwrap().len() as usize;
    (out, len)
}

const SHAPE: &[u8] = b"K\x05K\x01K\x04\x87"; // (5, 1, 4)
const OFFSET_AND_SHAPE: &[u8] = b"K\x00K\x05K\x01K\x04\x87"; // storage offset 0, then the shape

#[test]
fn hostile_pt_voices() {
    let dir = tempfile::tempdir().unwrap();
    let l = Limits::default();
    // Shape (2^30, 1, 4): 2^32 f32 values (16 GiB) in an 80-byte storage.
    let (p, len) = patched(dir.path(), SHAPE, b"J\x00\x00\x00\x40K\x01K\x04\x87");
    let m = hostile("pt 2^32 values", len, || Voices::load_with(&p, &l));
    assert!(m.contains("shape [1073741824, 1, 4] of F32 at element 0 needs 17179869184 bytes, but its entry 'pt_bare/data/0' holds 80"), "{m}");
    // A storage offset of 2^28 (as candle's reader scales it: element 2^30).
    let (p, len) = patched(dir.path(), OFFSET_AND_SHAPE, b"J\x00\x00\x00\x10K\x05K\x01K\x04\x87");
    let m = hostile("pt offset past the end", len, || Voices::load_with(&p, &l));
    assert!(m.contains("shape [5, 1, 4] of F32 at element 1073741824 needs 4294967376 bytes"), "{m}");
    // The unmodified file, under a ceiling smaller than its 80 bytes of values.
    let (p, len) = patched(dir.path(), SHAPE, SHAPE);
    let m = hostile("pt over the limit", len, || Voices::load_with(&p, &Limits::default().max_alloc_bytes(64)));
    assert!(m.contains("tensor 'pt_bare' needs 80 bytes, over the limit of 64 bytes"), "{m}");
    assert_eq!(Voices::load(&p).unwrap().names(), ["pt_bare"]);
}

/// Mutated `.pt` archives (written to a file each, as the loader reads paths).
#[test]
fn mutated_pt_voices_never_panic() {
    let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let seeds = [std::fs::read(data.join("pt_bare.pt")).unwrap(), std::fs::read(data.join("pt_dict.pt")).unwrap()];
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.pt");
    let limits = Limits::default().max_alloc_bytes(1 << 20);
    let (ran, ok) = support::mutation_run("pt voices", &seeds, 3_000, std::time::Duration::from_secs(3), |d| {
        if std::fs::write(&p, d).is_err() {
            return false;
        }
        let Ok(v) = Voices::load_with(&p, &limits) else { return false };
        for n in v.names() {
            if let Ok(pack) = v.get(n) {
                let _ = pack.style_for(1);
            }
        }
        true
    });
    assert!(ran >= 300 && ok > ran / 50, "{ok} of {ran} loaded");
}

/// Regression (found by the `pt_voices` fuzz target): a pickle LONG1 of more than 8 bytes
/// overflows a shift in candle's reader; loading it is an error, not a crash.
#[test]
fn a_corrupt_pickle_long_is_an_error() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/fuzz-pt-long1.pt");
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("long1.pt");
    std::fs::copy(&src, &p).unwrap();
    let e = Voices::load(&p).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("long1.pt: not a readable PyTorch archive"), "{e}");
}
