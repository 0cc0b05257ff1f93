//! The quantized weight matrix ([`QMatrix`]): its storage (candle's tensor, bytes, or packed
//! for the lane kernels), its products and their dispatch over the instruction sets.

use super::*;

#[derive(Clone)]
pub(super) enum Storage {
    Candle(Arc<QTensor>),
    Bytes(Arc<Vec<u8>>),
    /// A view of a memory-mapped file's pages, read in place (never packed).
    Mapped(crate::MappedBytes),
    /// Laid out for the lane kernels (`lanes::Packed`), instead of GGML's blocks.
    #[cfg(target_arch = "x86_64")]
    Lanes(Arc<lanes::Packed>),
}

/// A quantized `[rows, cols]` weight matrix in GGML block layout, row-major.
#[derive(Clone)]
pub struct QMatrix {
    pub(super) qtype: QType,
    pub(super) rows: usize,
    pub(super) cols: usize,
    pub(super) storage: Storage,
}

impl std::fmt::Debug for QMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QMatrix")
            .field("qtype", &self.qtype)
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .finish()
    }
}

impl QMatrix {
    /// Wrap a CPU candle quantized tensor of shape `[rows, cols]` (no copy). `None` when its
    /// format has no kernel here, it is not 2-D, or it is not on the CPU.
    pub fn from_qtensor(q: &Arc<QTensor>) -> Option<Self> {
        let qtype = QType::from_candle(q.dtype())?;
        let (rows, cols) = match q.shape().dims() {
            [r, c] => (*r, *c),
            _ => return None,
        };
        if !matches!(q.device(), candle_core::Device::Cpu) || cols % qtype.block_len() != 0 {
            return None;
        }
        let m = Self {
            qtype,
            rows,
            cols,
            storage: Storage::Candle(q.clone()),
        };
        // Must be borrowable as bytes of the expected size.
        if m.bytes_len() != rows * m.row_bytes() {
            return None;
        }
        m.with_bytes(huge_pages);
        Some(m)
    }

    /// Packed for the lane kernels whatever the options say (tests compare both layouts).
    #[cfg(all(test, target_arch = "x86_64"))]
    pub(super) fn packed_lanes(&self) -> Option<QMatrix> {
        let p = self.with_bytes(|b| lanes::Packed::new_all(&[(self.qtype, b, self.rows, self.cols)]).pop().flatten())?;
        Some(QMatrix {
            qtype: self.qtype,
            rows: self.rows,
            cols: self.cols,
            storage: Storage::Lanes(Arc::new(p)),
        })
    }

    /// A matrix from raw GGML blocks (`rows * cols / block_len * block_bytes` bytes).
    pub fn from_bytes(qtype: QType, rows: usize, cols: usize, bytes: Vec<u8>) -> Result<Self> {
        if !cols.is_multiple_of(qtype.block_len()) {
            return Err(Error::Candle(candle_core::Error::Msg(format!(
                "{qtype:?} matrix: {cols} columns is not a multiple of the block length {}",
                qtype.block_len()
            ))));
        }
        let want = rows * cols / qtype.block_len() * qtype.block_bytes();
        if bytes.len() != want {
            return Err(Error::Candle(candle_core::Error::Msg(format!(
                "{qtype:?} [{rows}, {cols}] needs {want} bytes, got {}",
                bytes.len()
            ))));
        }
        huge_pages(&bytes);
        Ok(Self {
            qtype,
            rows,
            cols,
            storage: Storage::Bytes(Arc::new(bytes)),
        })
    }

    /// A matrix reading GGML blocks in place from `bytes` (a view of a memory-mapped file):
    /// never copied, never packed for the lane kernels (its products take the kernels that
    /// read GGML's layout, with the arithmetic the packed layout would have had where one
    /// exists), and no huge pages asked for (the pages belong to the file).
    pub fn from_mapped(qtype: QType, rows: usize, cols: usize, bytes: crate::MappedBytes) -> Result<Self> {
        let want = if cols.is_multiple_of(qtype.block_len()) { Some(rows * cols / qtype.block_len() * qtype.block_bytes()) } else { None };
        if want != Some(bytes.len()) {
            return Err(Error::Candle(candle_core::Error::Msg(format!(
                "{qtype:?} [{rows}, {cols}]: {} bytes are not whole rows of blocks",
                bytes.len()
            ))));
        }
        Ok(Self {
            qtype,
            rows,
            cols,
            storage: Storage::Mapped(bytes),
        })
    }

    /// Whether the matrix reads its blocks in place from a file's pages ([`Self::from_mapped`]).
    pub fn is_mapped(&self) -> bool {
        matches!(self.storage, Storage::Mapped(_))
    }

    /// [`from_bytes`](Self::from_bytes) kept in GGML's layout (tests compare the layouts).
    #[cfg(test)]
    pub(super) fn from_bytes_unpacked(qtype: QType, rows: usize, cols: usize, bytes: Vec<u8>) -> QMatrix {
        Self {
            qtype,
            rows,
            cols,
            storage: Storage::Bytes(Arc::new(bytes)),
        }
    }

    pub fn qtype(&self) -> QType {
        self.qtype
    }
    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn cols(&self) -> usize {
        self.cols
    }
    pub fn row_bytes(&self) -> usize {
        self.cols / self.qtype.block_len() * self.qtype.block_bytes()
    }

    pub(super) fn bytes_len(&self) -> usize {
        match &self.storage {
            Storage::Candle(q) => q.data().map(|d| d.len()).unwrap_or(0),
            Storage::Bytes(b) => b.len(),
            Storage::Mapped(b) => b.len(),
            #[cfg(target_arch = "x86_64")]
            Storage::Lanes(_) => self.rows * self.row_bytes(),
        }
    }

    /// The raw blocks (GGML layout). On the CPU candle hands out its buffer without copying;
    /// a matrix packed for the lane kernels is unpacked into a temporary copy.
    pub fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        f(&self.raw_bytes())
    }

    /// The addresses the weights occupy in memory (for huge pages).
    pub(crate) fn span(&self) -> (usize, usize) {
        let s = |b: &[u8]| (b.as_ptr() as usize, b.as_ptr() as usize + b.len());
        match &self.storage {
            #[cfg(target_arch = "x86_64")]
            Storage::Lanes(p) => s(p.bytes()),
            _ => self.with_bytes(s),
        }
    }

    /// Whether the weights are laid out for the lane kernels.
    pub fn is_packed(&self) -> bool {
        #[cfg(target_arch = "x86_64")]
        return matches!(self.storage, Storage::Lanes(_));
        #[cfg(not(target_arch = "x86_64"))]
        false
    }

    /// The first `n` rows (at most all of them) as a matrix of their own, sharing the storage.
    pub fn head(&self, n: usize) -> QMatrix {
        QMatrix {
            qtype: self.qtype,
            rows: n.min(self.rows),
            cols: self.cols,
            storage: self.storage.clone(),
        }
    }

    /// Rows `ids` (each `< rows()`) copied into a matrix of their own, in that order.
    pub fn gather_rows(&self, ids: &[usize]) -> Result<QMatrix> {
        let rb = self.row_bytes();
        #[cfg(target_arch = "x86_64")]
        if let Storage::Lanes(p) = &self.storage {
            let mut out = vec![0u8; ids.len() * rb];
            for (&r, row) in ids.iter().zip(out.chunks_exact_mut(rb)) {
                if r < self.rows {
                    p.unpack_row(r, row);
                }
            }
            // Packed too, so that the rows keep this matrix's arithmetic.
            let mut g = QMatrix::from_bytes(self.qtype, ids.len(), self.cols, out)?;
            pack_for_lanes(&mut [&mut g]);
            return Ok(g);
        }
        let mut out = Vec::with_capacity(ids.len() * rb);
        self.with_bytes(|b| {
            for &r in ids {
                if let Some(row) = b.get(r * rb..(r + 1) * rb) {
                    out.extend_from_slice(row);
                }
            }
        });
        QMatrix::from_bytes(self.qtype, ids.len(), self.cols, out)
    }

    /// Dequantize row `r` into `out` (`cols` long).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let rb = self.row_bytes();
        #[cfg(target_arch = "x86_64")]
        if let Storage::Lanes(p) = &self.storage {
            // Block by block (no allocation: the embedding lookup of every decode step).
            let mut blk = [0u8; 256];
            let (len, bytes) = (self.qtype.block_len(), self.qtype.block_bytes());
            for (b, o) in out.chunks_exact_mut(len).take(self.cols / len).enumerate() {
                p.unpack_block(r, b, &mut blk[..bytes]);
                quant::dequantize_row(self.qtype, &blk[..bytes], o);
            }
            return;
        }
        self.with_bytes(|b| quant::dequantize_row(self.qtype, &b[r * rb..(r + 1) * rb], out));
    }

    /// `out[i, j] = sum_k x[i, k] * w[j, k]` for `m` rows of `x` (`[m, cols]`, row-major);
    /// `out` is `[m, rows]`. Runs on the kernel thread pool.
    pub fn matmul(&self, x: &[f32], m: usize, out: &mut [f32]) {
        assert_eq!(x.len(), m * self.cols, "QMatrix::matmul: x has the wrong length");
        assert_eq!(out.len(), m * self.rows, "QMatrix::matmul: out has the wrong length");
        let acts = QuantizedActs::for_matrix(self, x, m);
        self.matmul_quantized(&acts, out);
    }

    /// Whether this matrix's products take the lane kernels (on a CPU with them, for the
    /// formats [`lanes::handles`]): Q4_0 and Q4_1 in GGML's layout too, the other 32-value
    /// formats and Q4_K/Q6_K once packed ([`pack_for_lanes`]); in GGML's layout those run on
    /// the row kernels. Fixed per matrix, so its rows never mix arithmetics.
    pub(super) fn takes_lanes(&self) -> bool {
        #[cfg(target_arch = "x86_64")]
        return (has_lanes() && lanes::handles(self.qtype) && (self.is_packed() || lanes::unpacked(self.qtype)))
            || (has_lanes_avx2() && lanes_avx2::handles(self.qtype) && self.is_packed());
        #[cfg(not(target_arch = "x86_64"))]
        false
    }

    /// Like [`matmul`](Self::matmul) with activations already quantized for this format
    /// (several matrices reading the same input share one quantization).
    pub fn matmul_quantized(&self, acts: &QuantizedActs, out: &mut [f32]) {
        let m = acts.m;
        assert!(acts.fits(self), "activation format does not match");
        assert_eq!(acts.cols, self.cols, "activation width does not match");
        assert_eq!(out.len(), m * self.rows, "QMatrix::matmul: out has the wrong length");
        let out_ptr = SendPtr(out.as_mut_ptr());
        let bytes = self.bytes_for(acts);
        for_row_chunks(self.rows, m, self.rows * m * self.cols, &|range: std::ops::Range<usize>| {
            self.product_rows(&bytes, acts, &out_ptr, range)
        });
    }

    /// The GGML blocks: borrowed (on the CPU candle hands out its buffer without copying),
    /// or unpacked into a copy for a packed matrix.
    pub(super) fn raw_bytes(&self) -> std::borrow::Cow<'_, [u8]> {
        match &self.storage {
            Storage::Candle(q) => q.data().unwrap_or(std::borrow::Cow::Borrowed(&[])),
            Storage::Bytes(b) => std::borrow::Cow::Borrowed(&b[..]),
            Storage::Mapped(b) => std::borrow::Cow::Borrowed(&b[..]),
            #[cfg(target_arch = "x86_64")]
            Storage::Lanes(p) => {
                let rb = self.row_bytes();
                let mut raw = vec![0u8; self.rows * rb];
                for (r, row) in raw.chunks_exact_mut(rb).enumerate() {
                    p.unpack_row(r, row);
                }
                std::borrow::Cow::Owned(raw)
            }
        }
    }

    /// The bytes the products with `acts` read: the GGML blocks ([`raw_bytes`](Self::raw_bytes)),
    /// or nothing for packed weights with activations for the lane kernels (their products
    /// read the packed layout, [`Self::product_rows`]).
    pub(super) fn bytes_for(&self, acts: &QuantizedActs) -> std::borrow::Cow<'_, [u8]> {
        if self.is_packed() && acts.lanes {
            return std::borrow::Cow::Borrowed(&[]);
        }
        self.raw_bytes()
    }

    /// Output columns `range` (weight rows) of the product, on the calling thread. `out`
    /// points at the `[m, rows]` output.
    pub(super) fn product_rows(&self, bytes: &[u8], acts: &QuantizedActs, out_ptr: &SendPtr, range: std::ops::Range<usize>) {
        #[cfg(target_arch = "x86_64")]
        if acts.amx_g != 0 {
            return self.product_rows_amx(bytes, acts, out_ptr, range);
        }
        #[cfg(target_arch = "x86_64")]
        if acts.lanes {
            // SAFETY: has_lanes() held when `acts` was laid out for these kernels, for this
            // format (`fits`); chunks start at multiples of 16 rows (`chunk_len`) and each
            // writes a disjoint range of output columns.
            if let Storage::Lanes(p) = &self.storage {
                if !has_lanes() {
                    // SAFETY: has_lanes_avx2() held instead (`takes_lanes`), with AVX-VNNI
                    // where has_vnni() says so.
                    if acts.k_quant {
                        unsafe { lanes_avx2_k::range_packed(has_vnni(), p, range.start, range.end, &acts.q8k, &acts.corr, acts.m, out_ptr.0, self.rows) };
                    } else {
                        unsafe { lanes_avx2::range_packed(has_vnni(), p, range.start, range.end, &acts.q8, &acts.corr, acts.m, out_ptr.0, self.rows) };
                    }
                } else if acts.k_quant {
                    unsafe { lanes::range_packed_k(p, range.start, range.end, &acts.q8k, &acts.corr, acts.m, out_ptr.0, self.rows) };
                } else {
                    unsafe { lanes::range_packed(p, range.start, range.end, &acts.q8, &acts.corr, acts.m, out_ptr.0, self.rows) };
                }
                return;
            }
            unsafe {
                lanes::range(self.qtype, bytes, self.row_bytes(), range.start, range.end, &acts.q8, &acts.corr, acts.m, out_ptr.0, self.rows);
            }
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if acts.wide {
            return self.product_rows_wide(bytes, acts, out_ptr, range);
        }
        #[cfg(target_arch = "aarch64")]
        if super::neon_mmla::product_rows(self.qtype, bytes, self.row_bytes(), acts, out_ptr, range.clone(), self.rows) {
            return;
        }
        let (m, rows, rb, t) = (acts.m, self.rows, self.row_bytes(), self.qtype);
        let mut tmp = [0f32; MAX_ROWS];
        let pf = Ahead::of(rb);
        let end = range.end;
        pf.begin(bytes, rb, range.start, end);
        for j in range.start..end {
            let wrow = &bytes[j * rb..(j + 1) * rb];
            // Ask for rows ahead: one core's hardware prefetching alone does not keep up
            // with the kernels when weights come from DRAM.
            pf.at(bytes, rb, j, end);
            let mut i0 = 0;
            while i0 < m {
                let g = (m - i0).min(MAX_ROWS);
                if acts.k_quant {
                    let mut rs: [&[BlockQ8K]; MAX_ROWS] = [&[]; MAX_ROWS];
                    for (k, r) in rs.iter_mut().take(g).enumerate() {
                        *r = acts.row_q8k(i0 + k);
                    }
                    rows_q8k(t, wrow, &rs[..g], &mut tmp);
                } else {
                    let mut rs: [&[BlockQ8]; MAX_ROWS] = [&[]; MAX_ROWS];
                    for (k, r) in rs.iter_mut().take(g).enumerate() {
                        *r = acts.row_q8(i0 + k);
                    }
                    rows_q8(t, wrow, &rs[..g], &mut tmp);
                }
                for (k, v) in tmp[..g].iter().enumerate() {
                    // SAFETY: each chunk writes a disjoint range of output columns.
                    unsafe { *out_ptr.0.add((i0 + k) * rows + j) = *v };
                }
                i0 += g;
            }
        }
    }

    /// [`product_rows`](Self::product_rows) with the AMX kernels (Q4_K, Q6_K; two or more
    /// activation rows).
    #[cfg(target_arch = "x86_64")]
    pub(super) fn product_rows_amx(&self, bytes: &[u8], acts: &QuantizedActs, out_ptr: &SendPtr, range: std::ops::Range<usize>) {
        let mut acc = take_scratch(&SCRATCH_AMX_ACC, amx::chunks(self.qtype, acts.m));
        // SAFETY: has_amx() held when `acts` was laid out for AMX, for this format (`fits`);
        // the weight rows are `cols` long; each chunk writes a disjoint range of columns.
        unsafe {
            amx::product(self.qtype, bytes, self.row_bytes(), range.start, range.end, &acts.amx_tiles, &acts.amx_sbs, acts.m, out_ptr.0, self.rows, &mut acc);
        }
        return_scratch(&SCRATCH_AMX_ACC, acc);
    }

    /// [`product_rows`](Self::product_rows) with the AVX-512 kernels: the chunk's weight rows
    /// go by groups of up to [`avx512::MAX_ROWS`] activation rows (a group stays in L1).
    #[cfg(target_arch = "x86_64")]
    pub(super) fn product_rows_wide(&self, bytes: &[u8], acts: &QuantizedActs, out_ptr: &SendPtr, range: std::ops::Range<usize>) {
        const G: usize = avx512::MAX_ROWS;
        let (m, rows, rb, t) = (acts.m, self.rows, self.row_bytes(), self.qtype);
        let mut tmp = [0f32; G];
        let pf = Ahead::of(rb);
        let end = range.end;
        // One activation row (decode): one kernel call per stretch of weight rows, each row
        // computed exactly as the loop below computes it. (A kernel taking four weight rows
        // per call, sharing the activation loads, was within the noise on a Zen 5 VM and
        // 1.3-2.4x slower than one row at a time on a Zen 4 one: examples/gemm_stream,
        // Q4_0/Q5_0/Q8_0 4864x896 from memory; Qwen2.5-0.5B decode step 21-25 -> 15-16 ms.)
        if m == 1 {
            pf.begin_stream(bytes, range.start * rb);
            let (r0, o) = (range.start, out_ptr.0);
            // SAFETY: as below; the range kernels write outputs r0..end of the one row, a
            // range no other chunk writes.
            unsafe {
                match t {
                    QType::Q4_0 => avx512::range_q4_0(bytes, rb, r0, end, acts.row_pairs(0), o, pf),
                    QType::Q4_1 => avx512::range_q4_1(bytes, rb, r0, end, acts.row_pairs(0), o, pf),
                    QType::Q5_0 => avx512::range_q5_0(bytes, rb, r0, end, acts.row_pairs(0), o, pf),
                    QType::Q5_1 => avx512::range_q5_1(bytes, rb, r0, end, acts.row_pairs(0), o, pf),
                    QType::Q8_0 => avx512::range_q8_0(bytes, rb, r0, end, acts.row_pairs(0), o, pf),
                    QType::Q4K | QType::Q6K if exact_k(t) => avx512::range_k_x(t == QType::Q6K, bytes, rb, r0, end, acts.row_k(0), o, pf),
                    QType::Q4K => avx512::range_q4k(bytes, rb, r0, end, acts.row_k(0), o, pf),
                    QType::Q6K => avx512::range_q6k(bytes, rb, r0, end, acts.row_k(0), o, pf),
                    QType::Q5K => unreachable!("Q5_K is not laid out wide"),
                }
            }
            return;
        }
        pf.begin(bytes, rb, range.start, end);
        // On machines with AMX, k-quant products of any number of rows use the exact
        // arithmetic of the AMX kernels (whichever kernel runs them).
        let exact = exact_k(t);
        let mut i0 = 0;
        while i0 < m {
            let g = (m - i0).min(G);
            let mut rp: [&[avx512::Pair]; G] = [&[]; G];
            let mut rk: [&[avx512::BlockK]; G] = [&[]; G];
            for k in 0..g {
                if acts.k_quant {
                    rk[k] = acts.row_k(i0 + k);
                } else {
                    rp[k] = acts.row_pairs(i0 + k);
                }
            }
            for j in range.start..end {
                let wrow = &bytes[j * rb..(j + 1) * rb];
                if i0 == 0 {
                    pf.at(bytes, rb, j, end);
                }
                // SAFETY: has_avx512() held when `acts` was laid out wide; the rows
                // are `cols` long in this matrix's format.
                unsafe {
                    match t {
                        QType::Q4_0 => avx512::rows_q4_0(wrow, &rp[..g], &mut tmp),
                        QType::Q4_1 => avx512::rows_q4_1(wrow, &rp[..g], &mut tmp),
                        QType::Q5_0 => avx512::rows_q5_0(wrow, &rp[..g], &mut tmp),
                        QType::Q5_1 => avx512::rows_q5_1(wrow, &rp[..g], &mut tmp),
                        QType::Q8_0 => avx512::rows_q8_0(wrow, &rp[..g], &mut tmp),
                        QType::Q4K if exact => avx512::rows_q4k_x(wrow, &rk[..g], &mut tmp),
                        QType::Q6K if exact => avx512::rows_q6k_x(wrow, &rk[..g], &mut tmp),
                        QType::Q4K => avx512::rows_q4k(wrow, &rk[..g], &mut tmp),
                        QType::Q6K => avx512::rows_q6k(wrow, &rk[..g], &mut tmp),
                        QType::Q5K => unreachable!("Q5_K is not laid out wide"),
                    }
                }
                for (k, v) in tmp[..g].iter().enumerate() {
                    // SAFETY: each chunk writes a disjoint range of output columns.
                    unsafe { *out_ptr.0.add((i0 + k) * rows + j) = *v };
                }
            }
            i0 += g;
        }
    }
}

/// Whether Q4_K/Q6_K products in GGML's layout take the exact k-quant arithmetic of the AVX-512
/// kernels: on machines with AMX (whose kernels compute it), and where the lane kernels would
/// have packed the format (they compute it too), so that a matrix read in place from a file
/// ([`QMatrix::from_mapped`]) gives the bits a packed copy of it gives.
#[cfg(target_arch = "x86_64")]
fn exact_k(t: QType) -> bool {
    has_amx() || (has_lanes() && lanes::handles(t))
}

/// Lay out the matrices whose products go to the lane kernels ([`lanes::handles`], on a
/// machine with them) in those kernels' packed layout, all in one allocation backed by huge
/// pages where Linux allows: the same results, one activation row (decode) as fast as the
/// row-at-a-time kernels and many rows faster. The other matrices are left as they are. A
/// loader calls this once with a model's matrices (each may be a clone of another's: equal
/// matrices are packed once); the GGML blocks they were made from can then be dropped.
pub fn pack_for_lanes(mats: &mut [&mut QMatrix]) {
    #[cfg(target_arch = "x86_64")]
    {
        let handles = |t: QType| if has_lanes() { lanes::handles(t) } else { has_lanes_avx2() && lanes_avx2::handles(t) };
        // Matrices read in place from a file's pages stay there (packing would copy them).
        let wanted: Vec<usize> = (0..mats.len()).filter(|&i| handles(mats[i].qtype) && !mats[i].is_packed() && !mats[i].is_mapped()).collect();
        if wanted.is_empty() {
            return;
        }
        // Matrices sharing storage (a tied embedding and output layer) pack once.
        let key = |m: &QMatrix| match &m.storage {
            Storage::Candle(q) => Arc::as_ptr(q) as *const u8 as usize,
            Storage::Bytes(b) => Arc::as_ptr(b) as *const u8 as usize,
            Storage::Mapped(b) => b.as_ptr() as usize,
            Storage::Lanes(p) => Arc::as_ptr(p) as *const u8 as usize,
        };
        let mut firsts: Vec<usize> = Vec::new();
        for &i in &wanted {
            if !firsts.iter().any(|&f| key(mats[f]) == key(mats[i]) && mats[f].rows == mats[i].rows) {
                firsts.push(i);
            }
        }
        let raws: Vec<std::borrow::Cow<'_, [u8]>> = firsts.iter().map(|&i| mats[i].raw_bytes()).collect();
        let specs: Vec<(QType, &[u8], usize, usize)> = firsts.iter().zip(&raws).map(|(&i, r)| (mats[i].qtype, &r[..], mats[i].rows, mats[i].cols)).collect();
        let packed = lanes::Packed::new_all(&specs);
        if let Some(p) = packed.iter().flatten().next() {
            huge_pages(p.arena_bytes());
        }
        let packed: Vec<(usize, Option<Arc<lanes::Packed>>)> = firsts.iter().map(|&i| key(mats[i])).zip(packed.into_iter().map(|p| p.map(Arc::new))).collect();
        drop(raws);
        for &i in &wanted {
            let k = key(mats[i]);
            if let Some((_, Some(p))) = packed.iter().find(|(pk, _)| *pk == k) {
                mats[i].storage = Storage::Lanes(p.clone());
            }
        }
        // The GGML blocks of matrices nothing else holds were freed just now: hand their
        // pages back to the system (the allocator keeps freed heap memory, in huge pages
        // here, which would leave the model's resident size at both copies).
        if packed.iter().filter_map(|(_, p)| p.as_ref()).map(|p| p.bytes().len()).sum::<usize>() >= 16 << 20 {
            memory::release_freed();
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = mats;
}
