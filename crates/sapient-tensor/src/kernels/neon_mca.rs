//! Entry points for reading the NEON kernels' machine code (`scripts/aarch64-mca.sh`): each
//! is one kernel instance (`sdot`, one or four activation rows), kept out of line under an
//! unmangled name so that its block loop can be cut out of the assembly and given to
//! `llvm-mca`. Compiled only with `--cfg sapient_mca`.

use super::*;

macro_rules! entry {
    ($name:ident, $kernel:ident::<$($g:tt),+>, $act:ty) => {
        #[no_mangle]
        #[inline(never)]
        #[target_feature(enable = "dotprod")]
        pub unsafe fn $name(w: &[u8], acts: &[&[$act]], out: &mut [f32]) {
            $kernel::<$($g),+>(w, acts, out)
        }
    };
}

entry!(mca_q4_0_r1, rows32::<Q40, Sdot, 1>, BlockQ8);
entry!(mca_q4_0_r4, rows32::<Q40, Sdot, 4>, BlockQ8);
entry!(mca_q4_1_r1, rows32::<Q41, Sdot, 1>, BlockQ8);
entry!(mca_q5_0_r1, rows32::<Q50, Sdot, 1>, BlockQ8);
entry!(mca_q8_0_r1, rows32::<Q80, Sdot, 1>, BlockQ8);
entry!(mca_q4k_r1, rows_q4k::<Sdot, 1>, BlockQ8K);
entry!(mca_q4k_r4, rows_q4k::<Sdot, 4>, BlockQ8K);
entry!(mca_q6k_r1, rows_q6k::<Sdot, 1>, BlockQ8K);
entry!(mca_q6k_r4, rows_q6k::<Sdot, 4>, BlockQ8K);
