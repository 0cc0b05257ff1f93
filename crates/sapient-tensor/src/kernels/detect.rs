//! What the CPU can do, probed once and cached, with the options that turn kernels off.

use super::options;
#[cfg(target_arch = "x86_64")]
use super::amx;
use std::sync::atomic::{AtomicU8, Ordering};

/// A CPU capability probed once: 0 = not yet, 1 = yes, 2 = no.
fn cached(state: &AtomicU8, probe: impl FnOnce() -> bool) -> bool {
    match state.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => {
            let yes = probe();
            state.store(if yes { 1 } else { 2 }, Ordering::Relaxed);
            yes
        }
    }
}

/// Whether the AVX2 kernels are in use (x86_64 with AVX2, FMA and F16C; the option
/// [`KernelOptions::avx2`](super::KernelOptions::avx2) turns them off).
pub fn has_avx2() -> bool {
    static STATE: AtomicU8 = AtomicU8::new(0);
    cached(&STATE, || {
        #[cfg(target_arch = "x86_64")]
        return std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
            && std::is_x86_feature_detected!("f16c")
            && options().avx2;
        #[cfg(not(target_arch = "x86_64"))]
        false
    })
}

/// Whether the AVX-VNNI variants are in use (on top of AVX2; [`KernelOptions::vnni`](super::KernelOptions::vnni)).
pub fn has_vnni() -> bool {
    static STATE: AtomicU8 = AtomicU8::new(0);
    cached(&STATE, || {
        #[cfg(target_arch = "x86_64")]
        return has_avx2() && std::is_x86_feature_detected!("avxvnni") && options().vnni;
        #[cfg(not(target_arch = "x86_64"))]
        false
    })
}

/// Whether the AVX-512 kernels are in use (AVX-512 F/BW/VL/VNNI with FMA and F16C;
/// [`KernelOptions::avx512`](super::KernelOptions::avx512)).
pub fn has_avx512() -> bool {
    static STATE: AtomicU8 = AtomicU8::new(0);
    cached(&STATE, || {
        #[cfg(target_arch = "x86_64")]
        return has_avx2()
            && std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512vl")
            && std::is_x86_feature_detected!("avx512vnni")
            && options().avx512;
        #[cfg(not(target_arch = "x86_64"))]
        false
    })
}

/// Whether the AMX kernels are in use for Q4_K and Q6_K products of two or more activation
/// rows (AVX-512 as above plus AMX-TILE/AMX-INT8 with the tile state granted by the OS;
/// [`KernelOptions::amx`](super::KernelOptions::amx)). One-row products of those formats then use kernels
/// with the same arithmetic, so batches stay bit-identical to single rows.
pub fn has_amx() -> bool {
    static STATE: AtomicU8 = AtomicU8::new(0);
    cached(&STATE, || {
        #[cfg(target_arch = "x86_64")]
        return has_avx512() && options().amx && amx::available();
        #[cfg(not(target_arch = "x86_64"))]
        false
    })
}

/// Whether products of the 32-value formats use the sixteen-rows-at-a-time kernels (AVX-512
/// as above plus BITALG; [`KernelOptions::lanes`](super::KernelOptions::lanes)), for every number of activation rows.
pub fn has_lanes() -> bool {
    static STATE: AtomicU8 = AtomicU8::new(0);
    cached(&STATE, || {
        #[cfg(target_arch = "x86_64")]
        return has_avx512() && std::is_x86_feature_detected!("avx512bitalg") && options().lanes;
        #[cfg(not(target_arch = "x86_64"))]
        false
    })
}

/// Whether products of packed weights take the AVX2 / AVX-VNNI sixteen-rows kernels
/// (`lanes_avx2` for the 32-value formats, `lanes_avx2_k` for Q4_K and Q6_K: the lane
/// kernels' arithmetic on 256-bit registers): AVX2 as above
/// on a machine whose AVX-512 kernels are absent or off
/// ([`KernelOptions::lanes`](super::KernelOptions::lanes) turns them off too).
pub fn has_lanes_avx2() -> bool {
    static STATE: AtomicU8 = AtomicU8::new(0);
    cached(&STATE, || has_avx2() && !has_avx512() && options().lanes)
}

/// Whether [`ConvBf16`](super::ConvBf16) and [`DenseMatrix`](super::DenseMatrix) run their
/// bf16 products on AVX512-BF16 (`vdpbf16ps`): AVX-512 as above plus AVX512_BF16, on machines
/// where AMX-BF16 does not take them ([`KernelOptions::avx512_bf16`](super::KernelOptions::avx512_bf16)).
pub fn has_avx512_bf16() -> bool {
    static STATE: AtomicU8 = AtomicU8::new(0);
    cached(&STATE, || {
        #[cfg(target_arch = "x86_64")]
        return has_avx512() && std::is_x86_feature_detected!("avx512bf16") && options().avx512_bf16 && !super::has_amx_bf16();
        #[cfg(not(target_arch = "x86_64"))]
        false
    })
}

/// Whether the aarch64 NEON kernels are in use (every aarch64 CPU has NEON;
/// [`KernelOptions::neon`](super::KernelOptions::neon)).
pub fn has_neon() -> bool {
    #[cfg(target_arch = "aarch64")]
    return options().neon;
    #[cfg(not(target_arch = "aarch64"))]
    false
}

/// Whether the aarch64 kernels use `sdot` (the dotprod extension, Armv8.2+;
/// [`KernelOptions::dotprod`](super::KernelOptions::dotprod)).
pub fn has_dotprod() -> bool {
    static STATE: AtomicU8 = AtomicU8::new(0);
    cached(&STATE, || {
        #[cfg(target_arch = "aarch64")]
        return has_neon() && std::arch::is_aarch64_feature_detected!("dotprod") && options().dotprod;
        #[cfg(not(target_arch = "aarch64"))]
        false
    })
}


/// Whether products of two or more activation rows use `smmla` (the i8mm extension, on top
/// of dotprod; [`KernelOptions::i8mm`](super::KernelOptions::i8mm)).
pub fn has_i8mm() -> bool {
    static STATE: AtomicU8 = AtomicU8::new(0);
    cached(&STATE, || {
        #[cfg(target_arch = "aarch64")]
        return has_dotprod() && std::arch::is_aarch64_feature_detected!("i8mm") && options().i8mm;
        #[cfg(not(target_arch = "aarch64"))]
        false
    })
}
