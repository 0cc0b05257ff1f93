//! How weights sit in memory and are read ahead: huge pages for a loaded model's matrices,
//! and the prefetch distances of the products.
//!
//! After a model loads, [`huge_pages_for`] asks Linux to back its weights with 2 MiB pages
//! (`MADV_COLLAPSE`; [`KernelOptions::huge_pages`](super::KernelOptions::huge_pages), off with
//! `SAPIENT_HUGE_PAGES=0` in the binaries). The one-row kernels prefetch the weights at two
//! distances set in bytes (`Ahead`: one into L1, one into L2; `SAPIENT_PREFETCH`), asking
//! for each line as they stream along their rows, one line per 64 bytes read.

use super::{options, QMatrix};

/// Back the weights of `mats` with 2 MiB pages where Linux allows it ([`huge_pages`]), the
/// stretches between matrices included: a model's matrices are allocated one after another at
/// load, most of them smaller than 2 MiB or straddling page boundaries, so page-by-page advice
/// per matrix would leave most of them in 4 KiB pages. Call once the model is loaded.
pub fn huge_pages_for(mats: &[&QMatrix]) {
    // Matrices read in place from a file's pages are left alone: collapsing them would
    // read the whole file into memory now.
    let mut spans: Vec<(usize, usize)> = mats
        .iter()
        .filter(|m| !m.is_mapped())
        .map(|m| m.span())
        .filter(|(a, b)| b > a)
        .collect();
    spans.sort_unstable();
    // Matrices less than a huge page apart (allocator headers, small tensors between them)
    // form one stretch.
    let mut merged: Vec<(usize, usize)> = Vec::new();
    for (a, b) in spans {
        match merged.last_mut() {
            Some(last) if a <= last.1 + HUGE_PAGE => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    for (a, b) in merged {
        huge_pages_range(a, b, true);
    }
}

const HUGE_PAGE: usize = 2 << 20;

/// Ask Linux to back the whole 2 MiB pages inside `b` with huge pages (`huge_pages_range`);
/// public for the bandwidth probe of `cargo xtask bench`, which reads memory backed as the
/// weights are.
pub fn huge_pages(b: &[u8]) {
    huge_pages_range(b.as_ptr() as usize, b.as_ptr() as usize + b.len(), true)
}

/// Ask Linux to back the whole 2 MiB pages of addresses `start..end` (weights in anonymous
/// memory: candle copies GGUF tensors out of the file) with huge pages, now (`MADV_COLLAPSE`,
/// Linux 6.1+) and for later faults (`MADV_HUGEPAGE`). Decode streams every weight once per
/// token; with 4 KiB pages every page is a TLB miss and the hardware prefetchers stop at each
/// page boundary. On the 2-core Intel VM a Q8_0 [48640, 896] product from memory went from
/// 1.9-2.2 ms to 1.66-1.70 ms. Contents are unchanged; where it fails (old kernels, THP
/// disabled, other systems) the pages stay as they were. [`KernelOptions::huge_pages`](super::KernelOptions::huge_pages).
/// Without `collapse`, only the advice for later faults: memory not yet written stays
/// uncommitted ([`ZeroedMap`]).
fn huge_pages_range(start: usize, end: usize, collapse: bool) {
    #[cfg(target_os = "linux")]
    {
        if !options().huge_pages {
            return;
        }
        let (a, b) = (start.next_multiple_of(HUGE_PAGE), end / HUGE_PAGE * HUGE_PAGE);
        if b <= a {
            return;
        }
        // SAFETY: madvise only changes how the pages are backed, never their contents (the
        // collapse copies them into a huge page), so it is sound on any mapped memory; on
        // unmapped addresses it fails and changes nothing.
        unsafe {
            let p = a as *mut libc::c_void;
            libc::madvise(p, b - a, libc::MADV_HUGEPAGE);
            if collapse {
                libc::madvise(p, b - a, libc::MADV_COLLAPSE);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (start, end, collapse);
}

/// A zeroed slice of `T` in an anonymous mapping of its own (on Linux): 2 MiB-aligned,
/// committed by the system only as it is written, and asking for 2 MiB pages for later
/// faults (`MADV_HUGEPAGE`) where [`KernelOptions::huge_pages`](super::KernelOptions::huge_pages)
/// allows. For a large buffer read as a stream that fills up over time, as a KV cache: with
/// huge pages it is committed in steps of 2 MiB instead of 4 KiB, and its rows start on
/// cache lines (an allocator's large blocks sit 16 bytes past a page boundary, which splits
/// one 32-byte load in two across cache lines). Elsewhere, and when the mapping fails, a
/// zeroed `Vec`.
pub struct ZeroedMap<T: bytemuck::Zeroable + Copy> {
    inner: Mapped<T>,
}

enum Mapped<T> {
    Vec(Vec<T>),
    #[cfg(target_os = "linux")]
    Map {
        /// The 2 MiB-aligned start of the slice inside the mapping.
        ptr: std::ptr::NonNull<T>,
        len: usize,
        /// The whole mapping, for `munmap`.
        base: *mut libc::c_void,
        bytes: usize,
    },
}

// SAFETY: the mapping is owned by the value alone, as a `Vec`'s buffer is.
unsafe impl<T: bytemuck::Zeroable + Copy + Send> Send for ZeroedMap<T> {}
// SAFETY: shared access only reads through `&[T]`, as for a `Vec`.
unsafe impl<T: bytemuck::Zeroable + Copy + Sync> Sync for ZeroedMap<T> {}

impl<T: bytemuck::Zeroable + Copy> ZeroedMap<T> {
    /// `len` zeroed values.
    pub fn new(len: usize) -> Self {
        #[cfg(target_os = "linux")]
        if let Some(bytes) = len.checked_mul(std::mem::size_of::<T>()).filter(|&b| b >= HUGE_PAGE && std::mem::align_of::<T>() <= HUGE_PAGE) {
            // Room to start on a 2 MiB boundary.
            let map = bytes.next_multiple_of(HUGE_PAGE) + HUGE_PAGE;
            // SAFETY: a fresh private anonymous mapping; nothing else refers to it.
            let base = unsafe { libc::mmap(std::ptr::null_mut(), map, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0) };
            if base != libc::MAP_FAILED {
                let start = (base as usize).next_multiple_of(HUGE_PAGE);
                // Advice on pages of this mapping only (it reaches `start + bytes` rounded up
                // to a huge page); nothing is committed until written.
                huge_pages_range(start, start + bytes.next_multiple_of(HUGE_PAGE), false);
                if let Some(ptr) = std::ptr::NonNull::new(start as *mut T) {
                    return Self { inner: Mapped::Map { ptr, len, base, bytes: map } };
                }
            }
        }
        Self { inner: Mapped::Vec(vec![T::zeroed(); len]) }
    }
}

impl<T: bytemuck::Zeroable + Copy> std::ops::Deref for ZeroedMap<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match &self.inner {
            Mapped::Vec(v) => v,
            // SAFETY: `len` values from `ptr` lie inside the mapping (`new`), which lives as
            // long as `self`; anonymous memory reads as zeros, a valid `T` (`Zeroable`).
            #[cfg(target_os = "linux")]
            Mapped::Map { ptr, len, .. } => unsafe { std::slice::from_raw_parts(ptr.as_ptr(), *len) },
        }
    }
}

impl<T: bytemuck::Zeroable + Copy> std::ops::DerefMut for ZeroedMap<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match &mut self.inner {
            Mapped::Vec(v) => v,
            // SAFETY: as in `deref`, and `&mut self` makes the access exclusive.
            #[cfg(target_os = "linux")]
            Mapped::Map { ptr, len, .. } => unsafe { std::slice::from_raw_parts_mut(ptr.as_ptr(), *len) },
        }
    }
}

impl<T: bytemuck::Zeroable + Copy> Drop for ZeroedMap<T> {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        if let Mapped::Map { base, bytes, .. } = self.inner {
            // SAFETY: the mapping made in `new`, unmapped once; no slice of it outlives `self`.
            unsafe { libc::munmap(base, bytes) };
        }
    }
}

/// How far ahead of the row being multiplied a product prefetches its weight rows, for each
/// of two prefetch hints: `t0` rows into L1 and `t1` rows into L2 (0 = no such prefetch).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Ahead {
    t0: usize,
    t1: usize,
    /// The same distances in bytes, for kernels that prefetch as they go along a row.
    b0: usize,
    b1: usize,
}

/// Prefetch distances in bytes ([`KernelOptions::prefetch_l1`](super::KernelOptions::prefetch_l1) and `prefetch_l2`). 2 KiB
/// into L1 and 8 KiB into L2, asked for line by line as a decode kernel moves along its rows:
/// on a 2-core Intel Xeon VM Qwen2.5-0.5B's decode step went 21-25 ms (16 rows ahead into
/// L1, a row at a time) -> 16-18 ms (two levels, a row at a time) -> 13.8-14.6 ms (two
/// levels, streamed), SmolLM2's 3.2-3.9 -> 3.3-3.4 ms. Alone, far L1 prefetches starve
/// DRAM-bound products (the fill buffers) and near ones starve the cache-resident SmolLM2;
/// 1/4, 1.5/6 and 2/16 KiB were within the noise of 2/8, 0.5/2 and 3/12 slower.
fn prefetch_bytes() -> (usize, usize) {
    let o = options();
    (o.prefetch_l1, o.prefetch_l2)
}

impl Ahead {
    /// The distances for rows of `rb` bytes.
    pub(crate) fn of(rb: usize) -> Self {
        let (b0, b1) = prefetch_bytes();
        let rows = |b: usize| if b == 0 { 0 } else { b.div_ceil(rb.max(1)) };
        Self { t0: rows(b0), t1: rows(b1), b0, b1 }
    }

    pub(crate) const NONE: Ahead = Ahead { t0: 0, t1: 0, b0: 0, b1: 0 };

    /// At `p`, `len` bytes into a stretch of rows being read: the lines `b0` (into L1) and
    /// `b1` (into L2) bytes ahead, one line per 64 bytes of `len`. The addresses may lie
    /// past the weights (prefetches never fault).
    #[inline(always)]
    pub(crate) fn stream(self, p: *const u8, len: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0, _MM_HINT_T1};
            let mut off = 0;
            while off < len {
                // SAFETY: prefetching never faults, whatever the address.
                unsafe {
                    if self.b0 > 0 {
                        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(self.b0 + off) as *const i8);
                    }
                    if self.b1 > 0 {
                        _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(self.b1 + off) as *const i8);
                    }
                }
                off += 64;
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (p, len);
    }

    /// Before reading bytes `start..` of `w` as a stream ([`stream`](Self::stream)): the
    /// first `b1` bytes, the first `b0` of them into L1.
    #[inline]
    pub(crate) fn begin_stream(self, w: &[u8], start: usize) {
        let ahead = w.get(start..(start + self.b0.max(self.b1)).min(w.len())).unwrap_or(&[]);
        let (l1, l2) = ahead.split_at(self.b0.min(ahead.len()));
        prefetch_hint::<0>(l1);
        prefetch_hint::<1>(l2);
    }

    /// Before row `start` of rows `..end` (`rb` bytes each, from `w`): the rows the loop's
    /// own prefetches will not ask for.
    #[inline]
    pub(crate) fn begin(self, w: &[u8], rb: usize, start: usize, end: usize) {
        let far = start + self.t0.max(self.t1);
        prefetch_hint::<0>(w.get(start * rb..far.min(end) * rb).unwrap_or(&[]));
    }

    /// At row `j` of rows `..end`: the rows `t0` and `t1` ahead.
    #[inline(always)]
    pub(crate) fn at(self, w: &[u8], rb: usize, j: usize, end: usize) {
        if self.t0 > 0 && j + self.t0 < end {
            prefetch_hint::<0>(&w[(j + self.t0) * rb..(j + self.t0 + 1) * rb]);
        }
        if self.t1 > 0 && j + self.t1 < end {
            prefetch_hint::<1>(&w[(j + self.t1) * rb..(j + self.t1 + 1) * rb]);
        }
    }
}

/// Prefetch `b` into L1, a line at a time.
#[inline]
pub(super) fn prefetch(b: &[u8]) {
    prefetch_hint::<0>(b)
}

/// Prefetch `b` a line at a time, into L1 (`H` = 0) or L2 (`H` = 1).
#[inline(always)]
fn prefetch_hint<const H: u8>(b: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0, _MM_HINT_T1};
        let mut off = 0;
        while off < b.len() {
            // SAFETY: prefetching never faults; the address is inside `b`.
            unsafe {
                let a = b.as_ptr().add(off) as *const i8;
                if H == 0 {
                    _mm_prefetch::<_MM_HINT_T0>(a)
                } else {
                    _mm_prefetch::<_MM_HINT_T1>(a)
                }
            };
            off += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = b;
}

/// Return the allocator's free memory to the system (glibc's `malloc_trim`, which releases
/// free pages in the middle of the heap too), after a loader dropped a large amount of it.
pub fn release_freed() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only inspects the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Small buffers (a `Vec`) and large ones (a mapping, 2 MiB-aligned on Linux) read as
    /// zeros, keep what is written, and have the length asked for.
    #[test]
    fn zeroed_map_is_zero_writable_and_aligned() {
        for len in [10usize, (3 << 20) / 2 + 7] {
            let mut m = ZeroedMap::<u16>::new(len);
            assert_eq!(m.len(), len);
            assert!(m.iter().all(|&x| x == 0), "len {len}");
            m[0] = 3;
            m[len - 1] = 7;
            assert_eq!((m[0], m[1], m[len - 1]), (3, 0, 7));
            if cfg!(target_os = "linux") && 2 * len >= HUGE_PAGE {
                assert_eq!(m.as_ptr() as usize % HUGE_PAGE, 0);
            }
        }
    }
}
