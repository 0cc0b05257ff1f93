//! Matrices read in place from a file's pages ([`QMatrix::from_mapped`]): never packed, and
//! the bits their packed copies give.

use super::*;

/// A matrix in GGML's layout read in place gives, for every activation count, the bits a
/// copy of it packed for the lane kernels gives, wherever the in-place products have that
/// arithmetic: the formats packing leaves alone, Q4_0/Q4_1 (the lane kernels read GGML's
/// layout too) and, on machines with the AVX-512 lane kernels, Q4_K/Q6_K (the exact k-quant
/// kernels). Packing passes it by.
#[test]
fn mapped_matrices_give_their_packed_copies_bits() {
    let (rows, cols) = (37, 512);
    for t in ALL {
        let (w, _) = quantized(t, rows, cols, 77 + t as u64);
        let raw = w.with_bytes(|b| b.to_vec());
        let mut mapped = QMatrix::from_mapped(t, rows, cols, crate::MappedBytes::from_vec(raw.clone())).expect("whole rows");
        assert!(QMatrix::from_mapped(t, rows, cols, crate::MappedBytes::from_vec(raw[1..].to_vec())).is_err());
        let mut packed = QMatrix::from_bytes(t, rows, cols, raw.clone()).expect("whole rows");
        pack_for_lanes(&mut [&mut packed, &mut mapped]);
        assert!(mapped.is_mapped() && !mapped.is_packed(), "{t:?}: packing copied a mapped matrix");
        assert!(mapped.with_bytes(|b| b == &raw[..]));
        #[cfg(target_arch = "x86_64")]
        let same = !packed.is_packed() || matches!(t, QType::Q4_0 | QType::Q4_1) || (has_lanes() && matches!(t, QType::Q4K | QType::Q6K));
        #[cfg(not(target_arch = "x86_64"))]
        let same = !packed.is_packed();
        if !same {
            eprintln!("{t:?}: the packed kernels' arithmetic has no in-place twin on this CPU");
            continue;
        }
        for m in [1usize, 2, 5, 17] {
            let x = data(m * cols, 3 + m as u64);
            let (mut a, mut b) = (vec![0f32; m * rows], vec![0f32; m * rows]);
            mapped.matmul(&x, m, &mut a);
            packed.matmul(&x, m, &mut b);
            for (i, (a, b)) in a.iter().zip(&b).enumerate() {
                assert_eq!(a.to_bits(), b.to_bits(), "{t:?} x{m}: output {i}: in place {a} vs packed {b}");
            }
        }
    }
}
