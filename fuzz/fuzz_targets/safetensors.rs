//! Safetensors through `SafetensorsFiles` (memory-mapped, so the input is written to a file
//! under /dev/shm or the temp dir): open, then load every tensor.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sapient_tensor::{SafetensorsFiles, WeightSource};

fuzz_target!(|data: &[u8]| {
    let dir = if std::path::Path::new("/dev/shm").is_dir() { "/dev/shm".into() } else { std::env::temp_dir() };
    let path = dir.join(format!("sapient-fuzz-{}.safetensors", std::process::id()));
    if std::fs::write(&path, data).is_err() {
        return;
    }
    let limits = sapient_tensor::Limits::default().max_alloc_bytes(64 << 20);
    if let Ok(f) = SafetensorsFiles::open_with(&[&path], &limits) {
        for n in f.names() {
            let _ = f.shape_of(&n);
            if let Ok(w) = f.load(&n, &candle_core::Device::Cpu) {
                let _ = w.dequantize(&candle_core::Device::Cpu, candle_core::DType::F32);
            }
        }
    }
});
