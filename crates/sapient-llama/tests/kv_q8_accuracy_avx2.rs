//! The 8-bit KV cache against the f16 one on the real SmolLM2-135M with AVX-512 switched off,
//! so the whole model (matrix products, the q8 keys' and values' attention, activation
//! quantization) runs the AVX2 kernels: the kernel tests check those paths one by one, this
//! checks them together in a model. Same checks and tolerances as `kv_q8_accuracy.rs`
//! (`common/kv_q8.rs`). On a CPU without AVX2 it runs the portable kernels instead.

#[path = "common/kv_q8.rs"]
mod kv_q8;

use sapient_tensor::kernels::{self, KernelOptions};

#[test]
fn q8_0_cache_stays_close_to_f16_without_avx512() -> anyhow::Result<()> {
    // The kernels' options are process-wide: this file holds one test, so they are set
    // before anything runs a product.
    kernels::configure(KernelOptions { avx512: false, ..KernelOptions::default() })?;
    anyhow::ensure!(!kernels::has_avx512() && !kernels::has_lanes(), "AVX-512 kernels still in use");
    kv_q8::q8_0_cache_stays_close_to_f16()
}
