//! How products and activation layouts are split over the kernel pool: chunks of weight rows,
//! ranges of activation rows, and the pointer the threads share ([`SendPtr`]).

use super::*;

/// Split `rows` weight rows into chunks and run `job` on each chunk's range: on the kernel
/// pool when the product (`work` multiply-adds) is large enough, several chunks per thread so
/// that a descheduled thread delays little (see `pool::Pool::run_chunks`).
pub(super) fn for_row_chunks(rows: usize, m: usize, work: usize, job: &(dyn Fn(std::ops::Range<usize>) + Sync)) {
    let chunk = chunk_len(rows, m);
    let chunks = rows.div_ceil(chunk);
    run_chunks(chunks, work, &|c: usize| job(c * chunk..((c + 1) * chunk).min(rows)));
}

/// Run `job` on chunks `0..chunks`: on the kernel pool when the product (`work`
/// multiply-adds) is large enough to pay for it, else inline.
pub(super) fn run_chunks(chunks: usize, work: usize, job: &(dyn Fn(usize) + Sync)) {
    if work < 64 * 1024 {
        (0..chunks).for_each(job);
    } else {
        pool::pool().run_chunks(chunks, job);
    }
}

/// Rows per chunk when `m` rows (`values` values in all) of cheap per-row work are split
/// over the kernel pool: one chunk per thread when there are several rows and enough values
/// to pay for a dispatch (a batch's step: otherwise the pool's other threads wait on it),
/// else all `m` rows in one chunk.
pub fn rows_per_thread(m: usize, values: usize) -> usize {
    let nth = pool::pool().threads();
    if m < 2 || nth == 1 || values < 2048 {
        return m.max(1);
    }
    m.div_ceil(nth)
}

/// Run `f` on the rows `0..m` of an activation layout (`values` values in all), in the
/// ranges [`rows_per_thread`] gives. Each row comes out the same either way.
pub(super) fn by_rows(m: usize, values: usize, f: &(dyn Fn(std::ops::Range<usize>) + Sync)) {
    let per = rows_per_thread(m, values);
    if per >= m {
        return f(0..m);
    }
    pool::pool().run_chunks(m.div_ceil(per), &|c| f(c * per..((c + 1) * per).min(m)));
}

/// Weight rows per chunk of a product over `rows` weight rows and `m` activation rows.
pub(super) fn chunk_len(rows: usize, m: usize) -> usize {
    let nth = pool::pool().threads();
    if nth == 1 {
        return rows.max(1);
    }
    if m <= 16 {
        // Decode (one sequence, or a batch of up to 16): memory-bound, so each thread reads
        // one contiguous stretch (the prefetching runs on without restarting at every chunk;
        // on a quiet 2-core machine this is ~1.3x the tokens/s of 8 chunks per thread for one
        // row, and 3-6% more for 4 to 16 rows of Qwen2.5-0.5B).
        // (At least 16: a matrix of no rows, a restricted output layer's empty head, is
        // then zero chunks rather than a division by zero.)
        return (rows.div_ceil(nth).div_ceil(16) * 16).max(16);
    }
    (rows / (nth * 8)).clamp(16, 512).div_ceil(16) * 16
}

/// A raw pointer into one output buffer, shared by the pool's threads while each writes its
/// own disjoint part of the buffer (the one such wrapper in the workspace; for plain chunks
/// of a slice, [`pool::Pool::for_each_chunk_mut`] needs no pointer at all).
///
/// Creating one is safe; dereferencing [`ptr`](Self::ptr) is `unsafe`, and the caller must
/// ensure that the buffer outlives every use and that no two threads touch the same element.
pub struct SendPtr<T = f32>(pub *mut T);
// SAFETY: the wrapper only moves the address between threads; every dereference is an
// `unsafe` block at the call site that writes a range no other thread touches.
unsafe impl<T: Send> Sync for SendPtr<T> {}
unsafe impl<T: Send> Send for SendPtr<T> {}

impl<T> SendPtr<T> {
    /// The pointer (a method, so that closures capture the `SendPtr`, not its field).
    pub fn ptr(&self) -> *mut T {
        self.0
    }
}
