//! The 8-bit KV cache against the f16 one on the real SmolLM2-135M, with the kernels this CPU
//! has (AVX-512 VNNI where present); what is checked and the tolerances are in
//! `common/kv_q8.rs`.

#[path = "common/kv_q8.rs"]
mod kv_q8;

#[test]
fn q8_0_cache_stays_close_to_f16() -> anyhow::Result<()> {
    kv_q8::q8_0_cache_stays_close_to_f16()
}
