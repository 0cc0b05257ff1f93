//! Hostile CTranslate2 `model.bin` files: huge declared counts and dimensions, byte counts and
//! strings past the end, a file over the `Limits` ceiling. Each is an error naming the field,
//! within a second, with a heap peak no larger than the file.

#[path = "../../sapient-tensor/tests/support/hostile.rs"]
mod support;

use sapient_tensor::Limits;
use sapient_whisper::ct2::Ct2Model;
use support::hostile;

#[global_allocator]
static METER: support::Meter = support::Meter;

fn string(s: &str) -> Vec<u8> {
    let mut b = ((s.len() + 1) as u16).to_le_bytes().to_vec();
    b.extend(s.as_bytes());
    b.push(0);
    b
}

fn header(count: u32) -> Vec<u8> {
    let mut b = 6u32.to_le_bytes().to_vec();
    b.extend(string("WhisperSpec"));
    b.extend(1u32.to_le_bytes());
    b.extend(count.to_le_bytes());
    b
}

fn variable(name: &str, dims: &[u32], dtype: u8, nbytes: u32, data: usize) -> Vec<u8> {
    let mut b = string(name);
    b.push(dims.len() as u8);
    for d in dims {
        b.extend(d.to_le_bytes());
    }
    b.push(dtype);
    b.extend(nbytes.to_le_bytes());
    b.extend(vec![0u8; data]);
    b
}

fn parse(b: &[u8]) -> sapient_whisper::Result<Ct2Model> {
    Ct2Model::parse(b.to_vec(), "hostile/model.bin".as_ref())
}

#[test]
fn hostile_ct2_files() {
    // A million variables claimed by a 25-byte file.
    let b = header(1_000_000);
    let m = hostile("ct2 1e6 variables", b.len(), || parse(&b));
    assert!(m.contains("truncated") && m.contains("name of variable 0"), "{m}");
    // A dimension of 4 billion.
    let mut b = header(1);
    b.extend(variable("w", &[u32::MAX, 4], 0, 16, 16));
    let m = hostile("ct2 4e9 dim", b.len(), || parse(&b));
    assert!(m.contains("variable 'w': shape [4294967295, 4] of F32 does not take 16 bytes"), "{m}");
    // A byte count that matches the shape but runs past the end.
    let mut b = header(1);
    b.extend(variable("w", &[1 << 28], 4, 1 << 29, 8));
    let m = hostile("ct2 data past the end", b.len(), || parse(&b));
    assert!(m.contains("data of variable 'w' needs bytes"), "{m}");
    // A name longer than the file.
    let mut b = header(1);
    b.extend(u16::MAX.to_le_bytes());
    let m = hostile("ct2 name past the end", b.len(), || parse(&b));
    assert!(m.contains("name of variable 0 needs bytes"), "{m}");
    // 100000 aliases claimed by the last 4 bytes.
    let mut b = header(0);
    b.extend(100_000u32.to_le_bytes());
    let m = hostile("ct2 1e5 aliases", b.len(), || parse(&b));
    assert!(m.contains("alias 0 needs bytes"), "{m}");
    // Zero dimensions: an empty variable parses (0 bytes), and is then no valid Whisper model.
    let mut b = header(1);
    b.extend(variable("w", &[0, 384], 0, 0, 0));
    b.extend(0u32.to_le_bytes());
    let model = parse(&b).unwrap();
    assert_eq!(model.variables[0].shape, vec![0, 384]);
    let e = model.dims().unwrap_err().to_string();
    assert!(e.contains("missing variable 'encoder/conv1/weight'"), "{e}");
}

#[test]
fn ct2_file_over_the_ceiling_is_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("model.bin");
    let mut b = header(1);
    b.extend(variable("w", &[1024], 0, 4096, 4096));
    b.extend(0u32.to_le_bytes());
    std::fs::write(&p, &b).unwrap();
    let m = hostile("ct2 over the limit", 0, || Ct2Model::open_with(&p, &Limits::default().max_alloc_bytes(1000)));
    assert!(m.contains("reading the CTranslate2 model into memory needs"), "{m}");
    assert!(m.contains("over the limit of 1000 bytes"), "{m}");
    assert_eq!(Ct2Model::open(&p).unwrap().variables.len(), 1);
}

#[test]
fn mutated_ct2_files_never_panic() {
    let mut b = header(4);
    b.extend(variable("encoder/num_heads", &[], 3, 4, 0));
    b.extend(6i32.to_le_bytes());
    b.extend(variable("encoder/conv1/weight", &[4, 2, 3], 0, 96, 96));
    b.extend(variable("decoder/embeddings/weight", &[8, 4], 4, 64, 64));
    b.extend(variable("decoder/num_heads", &[], 1, 1, 1));
    b.extend(1u32.to_le_bytes());
    b.extend(string("decoder/projection/weight"));
    b.extend(string("decoder/embeddings/weight"));
    let seed = parse(&b).unwrap();
    assert_eq!(seed.scalar_int("encoder/num_heads").unwrap(), 6);
    assert!(seed.get("decoder/projection/weight").is_some());
    let (ran, ok) = support::mutation_run("ct2", &[b], 200_000, std::time::Duration::from_secs(3), |d| {
        let Ok(m) = parse(d) else { return false };
        for v in &m.variables {
            let _ = (m.data(v), m.scalar_int(&v.name));
        }
        if let Ok(cfg) = m.dims() {
            let _ = m.to_hf_tensors(&cfg);
        }
        true
    });
    assert!(ran >= 1000 && ok > ran / 50, "{ok} of {ran} parsed");
}
