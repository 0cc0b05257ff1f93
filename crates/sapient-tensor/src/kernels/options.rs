//! Kernel options: threads, instruction sets, prefetch distances, huge pages.
//!
//! The kernels' dispatch and their thread pool are process-wide, so these options are too:
//! a model loader passes its [`KernelOptions`] to [`configure`] before the first product, and
//! every later product follows them. Library code never reads the environment; the `sapient`
//! command line and `cargo xtask` build their options with [`KernelOptions::from_env`].

use std::sync::OnceLock;

/// Which AMX path Q6_K products take (the choice never changes a result, only the speed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AmxQ6k {
    /// AMX except for 5 to 8 activation rows (two tile passes), where AVX-512 was faster.
    #[default]
    Auto,
    All,
    Never,
}

/// Which 32-value formats go to the sixteen-rows ("lanes") kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LanesFormats {
    /// Q4_0 and Q4_1 only; Q5_0, Q5_1 and Q8_0 stay on the row-at-a-time kernels.
    Q4,
    /// Every 32-value format. With the weights packed for these kernels
    /// ([`pack_for_lanes`](super::pack_for_lanes), which model loaders call) one sequence's
    /// decode is level with the row-at-a-time kernels and prompts and batches of sequences
    /// run far faster (Qwen2.5-0.5B Q4_K_M, whose 896-wide matrices are Q5_0 and Q8_0, on a
    /// 2-core Xeon VM: prefill about 1.5x).
    #[default]
    All,
}

/// Options for the quantized kernels and the memory of model weights.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelOptions {
    /// Threads of the kernel pool; `None`: one per core.
    pub threads: Option<usize>,
    /// Allow the AVX2/FMA/F16C kernels (when the CPU has them).
    pub avx2: bool,
    /// Allow the AVX-VNNI variants.
    pub vnni: bool,
    /// Allow the AVX-512 VNNI kernels.
    pub avx512: bool,
    /// Allow the AMX kernels for Q4_K/Q6_K batches.
    pub amx: bool,
    /// Allow the aarch64 NEON kernels (off: the portable code, same results).
    pub neon: bool,
    /// Allow `sdot` (aarch64 dotprod) in the NEON kernels.
    pub dotprod: bool,
    /// Allow `smmla` (aarch64 i8mm) for products of two or more activation rows.
    pub i8mm: bool,
    /// Allow the AVX512-BF16 (`vdpbf16ps`) kernels of [`ConvBf16`](super::ConvBf16) and
    /// [`DenseMatrix`](super::DenseMatrix) where AMX-BF16 is absent.
    pub avx512_bf16: bool,
    pub amx_q6k: AmxQ6k,
    /// Allow the AVX-512 kernels that take sixteen weight rows at a time for the 32-value
    /// formats (they need AVX-512 BITALG too; batches of rows cost far less with them), and
    /// without AVX-512 their AVX2 / AVX-VNNI counterparts for packed weights (the same
    /// results).
    pub lanes: bool,
    /// Which 32-value formats take the sixteen-rows kernels for every number of activation
    /// rows (one row included, so a sequence decoded alone keeps the batch's arithmetic).
    pub lanes_formats: LanesFormats,
    /// Q4_K and Q6_K take sixteen-rows kernels too, once packed at load
    /// ([`pack_for_lanes`](super::pack_for_lanes)), on machines where AMX does not take them:
    /// the AVX-512 ones, or the AVX2 / AVX-VNNI ones without AVX-512 (`SAPIENT_NO_LANES_K`
    /// set = off). Their arithmetic is the AMX kernels' exact one at every level.
    pub lanes_kquants: bool,
    /// Prefetch distance into L1, in bytes ahead of the weights being read (0: none).
    pub prefetch_l1: usize,
    /// Prefetch distance into L2, in bytes (0: none).
    pub prefetch_l2: usize,
    /// Back model weights and the KV cache with 2 MiB pages where Linux allows.
    pub huge_pages: bool,
    /// From how many activation rows a product leaves the quantized kernels for a dense f32
    /// GEMM on the dequantized weight; `None`: never with AVX-512, 32 rows otherwise.
    pub dense_rows: Option<usize>,
    /// Products of packed 32-value weights ([`pack_for_lanes`](super::pack_for_lanes)) with at
    /// least this many activation rows take their integer sums from AMX tiles on machines
    /// with them (the same results; 0: never). `SAPIENT_LANES_AMX_ROWS`. From 12 rows the
    /// tiles were faster on a 2-core Xeon (4864x896, `lane_timing`, 16 rows: Q5_0 165 us
    /// against 234, Q8_0 138 against 234, Q4_1 135 against 184), below 8 slower (a chain of
    /// tile latencies per block).
    pub lanes_amx_rows: usize,
}

impl Default for KernelOptions {
    fn default() -> Self {
        Self {
            threads: None,
            avx2: true,
            vnni: true,
            avx512: true,
            amx: true,
            neon: true,
            dotprod: true,
            i8mm: true,
            avx512_bf16: true,
            amx_q6k: AmxQ6k::Auto,
            lanes: true,
            lanes_formats: LanesFormats::default(),
            lanes_kquants: true,
            prefetch_l1: 2048,
            prefetch_l2: 8192,
            huge_pages: true,
            dense_rows: None,
            lanes_amx_rows: 12,
        }
    }
}

impl KernelOptions {
    /// Options from the environment, for binaries (`sapient`, `cargo xtask`):
    /// `SAPIENT_THREADS=N`, `SAPIENT_NO_AVX2`, `SAPIENT_NO_VNNI`, `SAPIENT_NO_AVX512`,
    /// `SAPIENT_NO_AMX`, `SAPIENT_NO_NEON`, `SAPIENT_NO_DOTPROD`, `SAPIENT_NO_I8MM`, `SAPIENT_NO_AVX512_BF16`, `SAPIENT_NO_LANES_K` (set = off), `SAPIENT_AMX_Q6K=all|never`, `SAPIENT_LANES=q4|all`,
    /// `SAPIENT_PREFETCH="t0:BYTES,t1:BYTES"` (a hint left out is not used),
    /// `SAPIENT_HUGE_PAGES=0`, `SAPIENT_DENSE_ROWS=N`. Values that do not parse are named
    /// in the returned warnings and left at their defaults.
    pub fn from_env() -> (Self, Vec<String>) {
        let mut o = Self::default();
        let mut warnings = Vec::new();
        let var = |k: &str| std::env::var(k).ok();
        let set = |k: &str| std::env::var_os(k).is_some();
        if let Some(v) = var("SAPIENT_THREADS") {
            match v.trim().parse::<usize>() {
                Ok(n) if n > 0 => o.threads = Some(n),
                _ => warnings.push(format!("SAPIENT_THREADS: ignoring {v:?} (expected a number of threads)")),
            }
        }
        o.avx2 = !set("SAPIENT_NO_AVX2");
        o.vnni = !set("SAPIENT_NO_VNNI");
        o.avx512 = !set("SAPIENT_NO_AVX512");
        o.amx = !set("SAPIENT_NO_AMX");
        o.neon = !set("SAPIENT_NO_NEON");
        o.dotprod = !set("SAPIENT_NO_DOTPROD");
        o.i8mm = !set("SAPIENT_NO_I8MM");
        o.avx512_bf16 = !set("SAPIENT_NO_AVX512_BF16");
        o.lanes = !set("SAPIENT_NO_LANES");
        o.lanes_kquants = !set("SAPIENT_NO_LANES_K");
        match var("SAPIENT_LANES").as_deref() {
            None => {}
            Some("q4") => o.lanes_formats = LanesFormats::Q4,
            Some("all") => o.lanes_formats = LanesFormats::All,
            Some(v) => warnings.push(format!("SAPIENT_LANES: ignoring {v:?} (expected q4 or all)")),
        }
        match var("SAPIENT_AMX_Q6K").as_deref() {
            None => {}
            Some("all") => o.amx_q6k = AmxQ6k::All,
            Some("never") => o.amx_q6k = AmxQ6k::Never,
            Some(v) => warnings.push(format!("SAPIENT_AMX_Q6K: ignoring {v:?} (expected all or never)")),
        }
        if let Some(e) = var("SAPIENT_PREFETCH") {
            o.prefetch_l1 = 0;
            o.prefetch_l2 = 0;
            for part in e.split(',') {
                let slot = match part.split_once(':') {
                    Some(("t0", b)) => Some((&mut o.prefetch_l1, b)),
                    Some(("t1", b)) => Some((&mut o.prefetch_l2, b)),
                    _ => None,
                };
                match slot.map(|(at, b)| b.trim().parse().map(|n| *at = n)) {
                    Some(Ok(())) => {}
                    _ => warnings.push(format!("SAPIENT_PREFETCH: ignoring {part:?} (expected t0:BYTES or t1:BYTES)")),
                }
            }
        }
        if var("SAPIENT_HUGE_PAGES").is_some_and(|v| v == "0") {
            o.huge_pages = false;
        }
        if let Some(v) = var("SAPIENT_DENSE_ROWS") {
            match v.trim().parse::<usize>() {
                Ok(n) => o.dense_rows = Some(n),
                Err(_) => warnings.push(format!("SAPIENT_DENSE_ROWS: ignoring {v:?} (expected a number of rows)")),
            }
        }
        if let Some(v) = var("SAPIENT_LANES_AMX_ROWS") {
            match v.trim().parse::<usize>() {
                Ok(n) => o.lanes_amx_rows = n,
                Err(_) => warnings.push(format!("SAPIENT_LANES_AMX_ROWS: ignoring {v:?} (expected a number of rows, 0 for never)")),
            }
        }
        (o, warnings)
    }
}

static OPTIONS: OnceLock<KernelOptions> = OnceLock::new();

/// Set the kernel options for this process. The first call (or the first product, which
/// takes the defaults) fixes them: a later call with the same options is fine, one with
/// different options is an error naming both, and changes nothing.
pub fn configure(opts: KernelOptions) -> crate::Result<()> {
    let now = OPTIONS.get_or_init(|| opts.clone());
    if *now != opts {
        return Err(crate::Error::KernelOptions(format!(
            "the kernels already run with {now:?}; cannot switch to {opts:?} in the same process"
        )));
    }
    Ok(())
}

/// The options in force (the defaults unless [`configure`] came first).
pub fn options() -> &'static KernelOptions {
    OPTIONS.get_or_init(KernelOptions::default)
}
