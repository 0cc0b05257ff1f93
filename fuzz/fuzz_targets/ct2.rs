//! CTranslate2 `model.bin`: parse, read the Whisper dimensions, convert to transformers
//! tensors. Any panic is a bug (add the input to crates/sapient-whisper/tests/hostile_ct2.rs).
#![no_main]
use libfuzzer_sys::fuzz_target;
use sapient_whisper::ct2::Ct2Model;

fuzz_target!(|data: &[u8]| {
    let Ok(m) = Ct2Model::parse(data.to_vec(), "fuzz/model.bin".as_ref()) else { return };
    for v in &m.variables {
        let _ = m.data(v);
        let _ = m.scalar_int(&v.name);
    }
    if let Ok(cfg) = m.dims() {
        let _ = m.to_hf_tensors(&cfg);
    }
});
