//! NumPy `.npy` and `.npz`: the input is parsed as both; every array is converted to f32/f64.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sapient_tensor::npy::{parse_npy_with, Npz};

fuzz_target!(|data: &[u8]| {
    let limits = sapient_tensor::Limits::default().max_alloc_bytes(64 << 20);
    if let Ok(a) = parse_npy_with(data, "fuzz.npy".as_ref(), &limits) {
        let _ = (a.to_f32(), a.to_f64(), a.to_candle_f32());
    }
    if let Ok(z) = Npz::from_bytes_with("fuzz.npz", data.to_vec(), &limits) {
        let _ = z.names().count();
        if let Ok(arrays) = z.arrays() {
            for (_, a) in arrays {
                let _ = a.to_f32();
            }
        }
    }
});
