//! The weights of synthetic checkpoints: a function of their tensor's and element's index
//! (splitmix64), so a test and a reference script build the same values. Shared by
//! `qwen35.rs` here and xtask's `convert/synthetic.rs` (`#[path]`).

pub fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// uniform(offset - scale, offset + scale) in f64, rounded once: element `i` of tensor
/// `index` from splitmix((index << 32) + i).
pub fn values(index: u64, n: usize, offset: f64, scale: f64) -> Vec<f32> {
    (0..n as u64)
        .map(|i| {
            let u = (splitmix((index << 32) + i) >> 11) as f64 / (1u64 << 53) as f64;
            (offset + (u - 0.5) * 2.0 * scale) as f32
        })
        .collect()
}
