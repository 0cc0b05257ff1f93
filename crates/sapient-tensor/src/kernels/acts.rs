//! Activation rows quantized for a weight format ([`QuantizedActs`]), and the per-thread
//! scratch vectors their layouts reuse.

use super::*;

thread_local! {
    pub(super) static SCRATCH_Q8: RefCell<Vec<BlockQ8>> = const { RefCell::new(Vec::new()) };
    pub(super) static SCRATCH_Q8K: RefCell<Vec<BlockQ8K>> = const { RefCell::new(Vec::new()) };
}

#[cfg(target_arch = "x86_64")]
thread_local! {
    pub(super) static SCRATCH_PAIRS: RefCell<Vec<avx512::Pair>> = const { RefCell::new(Vec::new()) };
    pub(super) static SCRATCH_CORR: RefCell<Vec<i32>> = const { RefCell::new(Vec::new()) };
    pub(super) static SCRATCH_BLOCKK: RefCell<Vec<avx512::BlockK>> = const { RefCell::new(Vec::new()) };
    pub(super) static SCRATCH_AMX_TILES: RefCell<Vec<amx::Tile>> = const { RefCell::new(Vec::new()) };
    pub(super) static SCRATCH_AMX_SBS: RefCell<Vec<amx::SbActs>> = const { RefCell::new(Vec::new()) };
    pub(super) static SCRATCH_AMX_ACC: RefCell<Vec<[[f32; 16]; 16]>> = const { RefCell::new(Vec::new()) };
}

/// Take a per-thread scratch vector, cleared and resized to `n`.
pub(super) fn take_scratch<T: Clone + Default + 'static>(key: &'static std::thread::LocalKey<RefCell<Vec<T>>>, n: usize) -> Vec<T> {
    let mut v = key.with(|c| std::mem::take(&mut *c.borrow_mut()));
    v.clear();
    v.resize(n, T::default());
    v
}

/// A per-thread scratch vector of length `n` for a caller that overwrites every element: its
/// contents are left from the last use (a batch's activations are not zeroed just before
/// they are written), and an empty vector when `n` is 0 (the slot stays for another user).
pub(super) fn take_to_fill<T: Clone + Default + 'static>(key: &'static std::thread::LocalKey<RefCell<Vec<T>>>, n: usize) -> Vec<T> {
    if n == 0 {
        return Vec::new();
    }
    let mut v = key.with(|c| std::mem::take(&mut *c.borrow_mut()));
    if v.len() < n {
        v.resize(n, T::default());
    } else {
        v.truncate(n);
    }
    v
}

/// Give a scratch vector back to its per-thread slot (the larger one stays).
pub(super) fn return_scratch<T: 'static>(key: &'static std::thread::LocalKey<RefCell<Vec<T>>>, v: Vec<T>) {
    if v.capacity() > 0 {
        key.with(|c| {
            let mut c = c.borrow_mut();
            if c.capacity() < v.capacity() {
                *c = v;
            }
        });
    }
}

/// Activation rows quantized for one weight format.
pub struct QuantizedActs {
    pub(super) m: usize,
    pub(super) cols: usize,
    pub(super) k_quant: bool,
    pub(super) q8: Vec<BlockQ8>,
    pub(super) q8k: Vec<BlockQ8K>,
    /// Laid out for the AVX-512 kernels (`pairs` / `blockk` hold the rows).
    pub(super) wide: bool,
    /// Laid out for the sixteen-rows kernels (`lanes`): `q8` plus `corr`.
    pub(super) lanes: bool,
    /// Per block `-off * sum(qs)` for the lane kernels of the offset formats; for Q4_K and
    /// Q6_K, per superblock their `lanes_k::side` data.
    pub(super) corr: Vec<i32>,
    /// The weight offset the pair layout was made for (`avx512::offset`).
    pub(super) off: i32,
    #[cfg(target_arch = "x86_64")]
    pub(super) pairs: Vec<avx512::Pair>,
    #[cfg(target_arch = "x86_64")]
    pub(super) blockk: Vec<avx512::BlockK>,
    /// Laid out for the AMX kernels: sub-blocks per step of the format (`amx::groups`), 0 if
    /// not.
    pub(super) amx_g: usize,
    #[cfg(target_arch = "x86_64")]
    pub(super) amx_tiles: Vec<amx::Tile>,
    #[cfg(target_arch = "x86_64")]
    pub(super) amx_sbs: Vec<amx::SbActs>,
}

impl QuantizedActs {
    /// Quantize `m` rows of `w.cols()` values for the products of `w`. Reuses per-thread
    /// buffers (returned by `Drop`), so the decode loop does not allocate.
    pub fn for_matrix(w: &QMatrix, x: &[f32], m: usize) -> Self {
        Self::with_kernels_lanes(w.qtype, ActsIn::Ready(x), m, w.cols, has_avx512() && wide_format(w.qtype), w.takes_lanes())
    }

    /// [`for_matrix`](Self::for_matrix) of the rows `prep` writes into `x`, each range
    /// prepared by the thread that quantizes it (see [`matmul_group_prep`]).
    pub(super) fn for_matrix_prep(w: &QMatrix, x: &mut [f32], m: usize, prep: Prep<'_>) -> Self {
        Self::with_kernels_lanes(w.qtype, ActsIn::Prep(x, prep), m, w.cols, has_avx512() && wide_format(w.qtype), w.takes_lanes())
    }

    /// Laid out for the AVX-512 kernels when `wide` (which needs [`has_avx512`]) or for the
    /// AVX2/portable ones; the lane kernels for the formats that take them unpacked.
    #[cfg(test)]
    pub(super) fn with_kernels(t: QType, x: &[f32], m: usize, cols: usize, wide: bool) -> Self {
        #[cfg(target_arch = "x86_64")]
        let lanes = has_lanes() && lanes::handles(t) && lanes::unpacked(t);
        #[cfg(not(target_arch = "x86_64"))]
        let lanes = false;
        Self::with_kernels_lanes(t, ActsIn::Ready(x), m, cols, wide, lanes)
    }

    /// [`with_kernels`](Self::with_kernels); `lanes`: the sixteen-rows kernels where they
    /// apply (only when [`has_lanes`] holds).
    pub(super) fn with_kernels_lanes(t: QType, xin: ActsIn<'_, '_>, m: usize, cols: usize, wide: bool, lanes: bool) -> Self {
        // The input: ready to read, or written by `prep` range by range (through `xp`, so
        // that no reference covers rows another thread is writing).
        let (xr, xp, prep): (&[f32], SendPtr, Option<Prep<'_>>) = match xin {
            ActsIn::Ready(x) => {
                assert_eq!(x.len(), m * cols);
                (x, SendPtr(std::ptr::null_mut()), None)
            }
            ActsIn::Prep(x, prep) => {
                assert_eq!(x.len(), m * cols);
                (&[], SendPtr(x.as_mut_ptr()), Some(prep))
            }
        };
        let k_quant = t.k_quant();
        let mut s = Self {
            m,
            cols,
            k_quant,
            q8: Vec::new(),
            q8k: Vec::new(),
            wide: false,
            lanes: false,
            corr: Vec::new(),
            off: 0,
            #[cfg(target_arch = "x86_64")]
            pairs: Vec::new(),
            #[cfg(target_arch = "x86_64")]
            blockk: Vec::new(),
            amx_g: 0,
            #[cfg(target_arch = "x86_64")]
            amx_tiles: Vec::new(),
            #[cfg(target_arch = "x86_64")]
            amx_sbs: Vec::new(),
        };
        // The layout the products take, decided before any row is quantized so that each
        // row range below is quantized and laid out in one pass, on the kernel pool when
        // there are several rows (a batch's decode step: otherwise the pool's other threads
        // wait on this serial work before every product).
        #[cfg(target_arch = "x86_64")]
        let to_lanes = lanes && if wide { lanes::handles(t) } else { has_lanes_avx2() && lanes_avx2::handles(t) };
        #[cfg(target_arch = "x86_64")]
        let to_amx = !to_lanes && wide && amx::use_for(t, m) && has_amx();
        #[cfg(target_arch = "x86_64")]
        let to_wide = !to_lanes && !to_amx && wide && has_avx512() && wide_format(t);
        let (nq8, nq8k) = if k_quant { (0, cols / 256) } else { (cols / 32, 0) };
        s.q8 = take_to_fill(&SCRATCH_Q8, m * nq8);
        s.q8k = take_to_fill(&SCRATCH_Q8K, m * nq8k);
        #[cfg(target_arch = "x86_64")]
        let (npairs, nk) = (if to_wide && !k_quant { nq8.div_ceil(2) } else { 0 }, if to_wide && k_quant { nq8k } else { 0 });
        #[cfg(target_arch = "x86_64")]
        {
            s.off = if to_lanes {
                lanes::offset(t)
            } else if to_wide && !k_quant {
                avx512::offset(t)
            } else {
                0
            };
            if to_lanes && k_quant {
                s.corr = take_to_fill(&SCRATCH_CORR, m * nq8k * lanes_k::SIDE);
            } else if to_lanes && s.off != 0 {
                s.corr = take_to_fill(&SCRATCH_CORR, m * nq8);
            }
            s.pairs = take_to_fill(&SCRATCH_PAIRS, m * npairs);
            s.blockk = take_to_fill(&SCRATCH_BLOCKK, m * nk);
        }
        {
            let q8 = SendPtr(s.q8.as_mut_ptr());
            let q8k = SendPtr(s.q8k.as_mut_ptr());
            #[cfg(target_arch = "x86_64")]
            let (corr, pairs, blockk) = (SendPtr(s.corr.as_mut_ptr()), SendPtr(s.pairs.as_mut_ptr()), SendPtr(s.blockk.as_mut_ptr()));
            #[cfg(target_arch = "x86_64")]
            let (with_corr, off) = (!s.corr.is_empty(), s.off);
            let rows = |r: std::ops::Range<usize>| {
                // SAFETY: each call gets its own range of rows, and every buffer holds `m`
                // rows of its per-row length, so the slices below are disjoint parts of
                // buffers that outlive the call.
                let part = |p: *mut u8, per: usize, size: usize| unsafe { (p.add(r.start * per * size), r.len() * per) };
                let xs: &[f32] = match prep {
                    None => &xr[r.start * cols..r.end * cols],
                    Some(prep) => {
                        // SAFETY: the range's rows of the caller's `x` (exclusively borrowed
                        // for this call), written by this thread only.
                        let rows_x = unsafe { std::slice::from_raw_parts_mut(xp.ptr().add(r.start * cols), r.len() * cols) };
                        prep(r.clone(), rows_x);
                        rows_x
                    }
                };
                if k_quant {
                    let (p, n) = part(q8k.ptr() as *mut u8, nq8k, std::mem::size_of::<BlockQ8K>());
                    let out = unsafe { std::slice::from_raw_parts_mut(p as *mut BlockQ8K, n) };
                    for (xr, br) in xs.chunks_exact(cols).zip(out.chunks_exact_mut(nq8k)) {
                        quantize_q8k(xr, br);
                    }
                    #[cfg(target_arch = "x86_64")]
                    if with_corr {
                        let (p, n) = part(corr.ptr() as *mut u8, nq8k * lanes_k::SIDE, std::mem::size_of::<i32>());
                        lanes_k::side(t, out, unsafe { std::slice::from_raw_parts_mut(p as *mut i32, n) });
                    }
                    #[cfg(target_arch = "x86_64")]
                    if nk > 0 {
                        let (p, n) = part(blockk.ptr() as *mut u8, nk, std::mem::size_of::<avx512::BlockK>());
                        avx512::blockk_from(out, unsafe { std::slice::from_raw_parts_mut(p as *mut avx512::BlockK, n) });
                    }
                } else {
                    let (p, n) = part(q8.ptr() as *mut u8, nq8, std::mem::size_of::<BlockQ8>());
                    let out = unsafe { std::slice::from_raw_parts_mut(p as *mut BlockQ8, n) };
                    for (xr, br) in xs.chunks_exact(cols).zip(out.chunks_exact_mut(nq8)) {
                        quantize_q8(xr, br);
                    }
                    #[cfg(target_arch = "x86_64")]
                    if with_corr {
                        let (p, n) = part(corr.ptr() as *mut u8, nq8, std::mem::size_of::<i32>());
                        lanes::corrections(out, off, unsafe { std::slice::from_raw_parts_mut(p as *mut i32, n) });
                    }
                    #[cfg(target_arch = "x86_64")]
                    if npairs > 0 {
                        let (p, n) = part(pairs.ptr() as *mut u8, npairs, std::mem::size_of::<avx512::Pair>());
                        let prs = unsafe { std::slice::from_raw_parts_mut(p as *mut avx512::Pair, n) };
                        for (br, pr) in out.chunks_exact(nq8).zip(prs.chunks_exact_mut(npairs)) {
                            avx512::pairs_from(br, off, pr);
                        }
                    }
                }
            };
            by_rows(m, m * cols, &rows);
        }
        #[cfg(target_arch = "x86_64")]
        {
            s.lanes = to_lanes;
            s.wide = to_wide;
            if to_amx {
                let nsb = cols / 256;
                let chunks = amx::chunks(t, m);
                let mut tiles = take_scratch(&SCRATCH_AMX_TILES, chunks * nsb * 4);
                let mut sbs = take_scratch(&SCRATCH_AMX_SBS, chunks * nsb);
                amx::acts_from(t, &s.q8k, m, nsb, &mut tiles, &mut sbs);
                s.amx_g = amx::groups(t);
                s.amx_tiles = tiles;
                s.amx_sbs = sbs;
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = wide;
        s
    }
    /// Lay out (quantized 32-value) activations for the lane kernels of format `t`.
    #[cfg(all(test, target_arch = "x86_64"))]
    pub(super) fn lay_out_lanes(&mut self, t: QType) {
        self.lanes = true;
        self.off = lanes::offset(t);
        if self.k_quant {
            let mut c = take_scratch(&SCRATCH_CORR, self.q8k.len() * lanes_k::SIDE);
            lanes_k::side(t, &self.q8k, &mut c);
            self.corr = c;
        } else if self.off != 0 {
            let mut c = take_scratch(&SCRATCH_CORR, self.q8.len());
            lanes::corrections(&self.q8, self.off, &mut c);
            self.corr = c;
        }
    }

    /// Activations for the lane kernels of any format they can compute (tests; needs
    /// [`has_lanes`]).
    #[cfg(all(test, target_arch = "x86_64"))]
    pub(super) fn for_lane_kernels(t: QType, x: &[f32], m: usize, cols: usize) -> Self {
        let mut s = Self::with_kernels_lanes(t, ActsIn::Ready(x), m, cols, false, false);
        s.lay_out_lanes(t);
        s
    }

    /// Whether these activations can be used with the products of `w`: the AVX2/portable
    /// layouts serve every format of their kind (32-value or k-quant); the AVX-512 pair
    /// layout carries the weight offset of its format; the lane layout serves the matrices
    /// that take the lane kernels.
    pub fn fits(&self, w: &QMatrix) -> bool {
        let t = w.qtype;
        if t.k_quant() != self.k_quant {
            return false;
        }
        #[cfg(target_arch = "x86_64")]
        if self.amx_g != 0 {
            return amx::handles(t) && amx::groups(t) == self.amx_g;
        }
        #[cfg(target_arch = "x86_64")]
        if self.lanes {
            // (Tests run the kernels of every format they compute; in use, only the formats
            // that go to them take them, so a format never mixes arithmetics.)
            #[cfg(test)]
            if lanes::computes(t) && (!t.k_quant() || w.is_packed()) {
                return lanes::offset(t) == self.off;
            }
            return w.takes_lanes() && lanes::offset(t) == self.off;
        }
        if !self.wide {
            return true;
        }
        #[cfg(target_arch = "x86_64")]
        if w.takes_lanes() {
            return false;
        }
        #[cfg(target_arch = "x86_64")]
        return wide_format(t) && (self.k_quant || avx512::offset(t) == self.off);
        #[cfg(not(target_arch = "x86_64"))]
        false
    }

    #[cfg(target_arch = "x86_64")]
    pub(super) fn row_pairs(&self, i: usize) -> &[avx512::Pair] {
        let n = (self.cols / 32).div_ceil(2);
        &self.pairs[i * n..(i + 1) * n]
    }
    #[cfg(target_arch = "x86_64")]
    pub(super) fn row_k(&self, i: usize) -> &[avx512::BlockK] {
        let n = self.cols / 256;
        &self.blockk[i * n..(i + 1) * n]
    }
    pub(super) fn row_q8(&self, i: usize) -> &[BlockQ8] {
        let n = self.cols / 32;
        &self.q8[i * n..(i + 1) * n]
    }
    pub(super) fn row_q8k(&self, i: usize) -> &[BlockQ8K] {
        let n = self.cols / 256;
        &self.q8k[i * n..(i + 1) * n]
    }
}

impl Drop for QuantizedActs {
    fn drop(&mut self) {
        return_scratch(&SCRATCH_Q8, std::mem::take(&mut self.q8));
        return_scratch(&SCRATCH_Q8K, std::mem::take(&mut self.q8k));
        #[cfg(target_arch = "x86_64")]
        {
            return_scratch(&SCRATCH_PAIRS, std::mem::take(&mut self.pairs));
            return_scratch(&SCRATCH_CORR, std::mem::take(&mut self.corr));
            return_scratch(&SCRATCH_BLOCKK, std::mem::take(&mut self.blockk));
            return_scratch(&SCRATCH_AMX_TILES, std::mem::take(&mut self.amx_tiles));
            return_scratch(&SCRATCH_AMX_SBS, std::mem::take(&mut self.amx_sbs));
        }
    }
}
