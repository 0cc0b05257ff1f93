//! Element-wise activations on f32 buffers, written so that they vectorise (compiled with
//! AVX2 and FMA when the CPU has them).

crate::simd_dispatch! {
    /// `exp` of every value in place (Cephes' single-precision polynomial, a relative error of
    /// about 1e-7 like libm's `expf`): [`exp_f32`] of each value, 16 at a time with AVX-512.
    pub fn exp_in_place(x: &mut [f32]) = exp_portable for [has_avx512("avx512f,avx2,fma"), has_avx2("avx2,fma")];
}

#[inline(always)]
fn exp_portable(x: &mut [f32]) {
    for v in x.iter_mut() {
        *v = exp_f32(*v);
    }
}

/// `e^v` as [`exp_in_place`] computes it (0 below -87.3), for loops that fuse it with other
/// work; written so that it vectorises under the caller's target features.
#[inline(always)]
pub fn exp_f32(v: f32) -> f32 {
    let a = v.clamp(-87.3, 88.7);
    let n = (a * std::f32::consts::LOG2_E).round();
    let r = n.mul_add(-0.693_359_4, a);
    let r = n.mul_add(2.121_944_4e-4, r);
    let mut p = 1.987_569_1e-4f32;
    p = p.mul_add(r, 1.398_199_9e-3);
    p = p.mul_add(r, 8.333_452e-3);
    p = p.mul_add(r, 4.166_579_6e-2);
    p = p.mul_add(r, 0.166_666_66);
    p = p.mul_add(r, 0.5);
    p = p.mul_add(r * r, r) + 1.0;
    // 2^n from n's bits in n + 1.5 * 2^23 (|n| <= 128): what `n as i32` gives, without its
    // saturating conversion, which does not vectorise (one scalar conversion a value)
    let ni = (n + 12_582_912.0).to_bits().wrapping_sub(0x4B40_0000) as i32;
    let e = f32::from_bits((ni.wrapping_add(127) as u32) << 23);
    if v < -87.3 {
        0.0
    } else {
        p * e
    }
}

crate::simd_dispatch! {
    /// GELU (erf form) of every value in place: erf by Abramowitz & Stegun 7.1.26 (absolute
    /// error below 1.5e-7, f32 rounding of 1 + erf) with [`exp_in_place`]'s exp; the same
    /// operations 16 lanes wide with AVX-512 (the same bits: no reassociation).
    pub fn gelu_erf_in_place(x: &mut [f32]) = gelu_portable for [has_avx512("avx512f,fma"), has_avx2("avx2,fma")];
}

#[inline(always)]
fn gelu_portable(x: &mut [f32]) {
    const CHUNK: usize = 256;
    let mut e = [0f32; CHUNK];
    for c in x.chunks_mut(CHUNK) {
        let e = &mut e[..c.len()];
        for (ev, &v) in e.iter_mut().zip(c.iter()) {
            let z = v * std::f32::consts::FRAC_1_SQRT_2;
            *ev = -z * z;
        }
        exp_portable(e);
        for (v, &ex) in c.iter_mut().zip(e.iter()) {
            let z = (*v * std::f32::consts::FRAC_1_SQRT_2).abs();
            let t = 1.0 / 0.327_591_1f32.mul_add(z, 1.0);
            let mut p = 1.061_405_4f32;
            p = p.mul_add(t, -1.453_152_1);
            p = p.mul_add(t, 1.421_413_8);
            p = p.mul_add(t, -0.284_496_74);
            p = p.mul_add(t, 0.254_829_6);
            let erf = 1.0 - p * t * ex;
            let erf = if *v < 0.0 { -erf } else { erf };
            *v = 0.5 * *v * (1.0 + erf);
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn gelu_and_exp_match_f64() {
        let xs: Vec<f32> = (-800..=800).map(|i| i as f32 / 100.0).collect();
        let mut g = xs.clone();
        super::gelu_erf_in_place(&mut g);
        let mut e = xs.clone();
        super::exp_in_place(&mut e);
        for ((&x, &g), &e) in xs.iter().zip(&g).zip(&e) {
            let x64 = x as f64;
            let want = 0.5 * x64 * (1.0 + candle_core::cpu::erf::erf_f64(x64 / std::f64::consts::SQRT_2));
            assert!((g as f64 - want).abs() < 2e-6 * (1.0 + x64.abs()), "gelu({x}) = {g}, want {want}");
            assert!(((e as f64) - x64.exp()).abs() <= 3e-7 * x64.exp(), "exp({x}) = {e}");
        }
    }

    /// The vectorised exp (AVX-512, AVX2 or portable, whichever runs here) gives, to the bit,
    /// the polynomial with a scalar `n as i32` for 2^n, over the whole clamped range, its
    /// ends, and values beyond them.
    #[test]
    fn exp_in_place_is_the_scalar_formula_to_the_bit() {
        fn scalar(v: f32) -> f32 {
            let a = v.clamp(-87.3, 88.7);
            let n = (a * std::f32::consts::LOG2_E).round();
            let r = n.mul_add(-0.693_359_4, a);
            let r = n.mul_add(2.121_944_4e-4, r);
            let mut p = 1.987_569_1e-4f32;
            p = p.mul_add(r, 1.398_199_9e-3);
            p = p.mul_add(r, 8.333_452e-3);
            p = p.mul_add(r, 4.166_579_6e-2);
            p = p.mul_add(r, 0.166_666_66);
            p = p.mul_add(r, 0.5);
            p = p.mul_add(r * r, r) + 1.0;
            let e = f32::from_bits(((n as i32 + 127) as u32) << 23);
            if v < -87.3 { 0.0 } else { p * e }
        }
        let mut xs: Vec<f32> = (-100_000..=100_000).map(|i| i as f32 * 1e-3 + 0.000_37).collect();
        xs.extend([-87.3, -87.299_99, 88.7, 88.699_99, -1e30, 1e30, 0.0, -0.0, f32::MIN_POSITIVE]);
        let mut e = xs.clone();
        super::exp_in_place(&mut e);
        for (&x, &got) in xs.iter().zip(&e) {
            assert_eq!(got.to_bits(), scalar(x).to_bits(), "exp({x})");
            assert_eq!(super::exp_f32(x).to_bits(), got.to_bits(), "exp_f32({x})");
        }
    }
}
