//! A small persistent thread pool for the CPU kernels.
//!
//! Decode runs a few hundred tiny matrix-vector products per token; spawning work through a
//! general-purpose pool costs microseconds per call, which is a large share of a 5 ms token.
//! Here the workers spin briefly on an epoch counter after each job (so back-to-back kernels
//! start within nanoseconds) and then park on a condition variable, so an idle process uses
//! no CPU. One job runs at a time; a caller that finds the pool busy (another thread is
//! decoding) runs its job on its own thread instead of waiting.
//!
//! The number of threads is [`super::KernelOptions::threads`] if set (the binaries take it
//! from `SAPIENT_THREADS`), otherwise the number of available cores.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long a worker spins after a job before parking.
const SPIN: Duration = Duration::from_millis(2);

type Job = dyn Fn(usize) + Sync;

struct Shared {
    /// Bumped once per job.
    epoch: AtomicUsize,
    /// The epoch whose job has finished and may no longer be touched.
    closed: AtomicUsize,
    /// Workers currently inside a job.
    active: AtomicUsize,
    /// Next chunk to claim, and chunks finished, of the current job.
    next: AtomicUsize,
    finished: AtomicUsize,
    chunks: AtomicUsize,
    /// The current job; valid from the epoch bump until `closed` reaches that epoch.
    job: UnsafeCell<Option<*const Job>>,
    sleep: Mutex<()>,
    wake: Condvar,
    /// Workers parked (or about to park) on `wake`: a dispatch notifies only when one is, as
    /// `notify_all` is a system call even with nobody waiting.
    parked: AtomicUsize,
    nthreads: usize,
    panicked: AtomicUsize,
}

// SAFETY: `job` is written only by the dispatching thread while no worker can read it (before
// the epoch bump, or after `closed` is set and `active` is zero); workers read it only after
// registering in `active` and checking `closed` (SeqCst on both sides).
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

pub struct Pool {
    shared: Arc<Shared>,
    busy: Mutex<()>,
}

impl Pool {
    fn new(nthreads: usize) -> Self {
        let nthreads = nthreads.max(1);
        let pool = Self::with_threads(nthreads);
        for tid in 1..nthreads {
            let s = pool.shared.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("sapient-kernel-{tid}"))
                .spawn(move || worker(s));
            if spawned.is_err() {
                tracing::warn!("could not spawn kernel worker threads; running single-threaded");
                return Self::with_threads(1);
            }
        }
        pool
    }

    fn with_threads(nthreads: usize) -> Self {
        Self {
            shared: Arc::new(Shared {
                epoch: AtomicUsize::new(0),
                closed: AtomicUsize::new(0),
                active: AtomicUsize::new(0),
                next: AtomicUsize::new(0),
                finished: AtomicUsize::new(0),
                chunks: AtomicUsize::new(0),
                job: UnsafeCell::new(None),
                sleep: Mutex::new(()),
                wake: Condvar::new(),
                parked: AtomicUsize::new(0),
                nthreads,
                panicked: AtomicUsize::new(0),
            }),
            busy: Mutex::new(()),
        }
    }

    /// Threads a job is split across.
    pub fn threads(&self) -> usize {
        self.shared.nthreads
    }

    /// How a product of `work` multiply-adds over `panels` column panels is split:
    /// (chunks, panels per chunk). One chunk, run on the caller, for a small product or a
    /// pool of one; else several chunks per thread (a descheduled thread holds up one), at
    /// least one panel each.
    pub(crate) fn panel_chunks(&self, work: usize, panels: usize) -> (usize, usize) {
        let threads = self.threads();
        let chunks = if work < 1 << 18 || threads == 1 { 1 } else { (threads * 3).min(panels) };
        (chunks, panels.div_ceil(chunks))
    }

    /// Run `f(chunk)` for every chunk in `0..chunks`, spread over the pool's threads (the
    /// caller takes part) and return when all are done. Threads claim chunks one at a time,
    /// so a thread that the OS does not schedule (a busy machine) holds up at most the chunk
    /// it is on, and one that wakes late finds nothing left and does nothing.
    pub fn run_chunks(&self, chunks: usize, f: &(dyn Fn(usize) + Sync)) {
        if chunks == 0 {
            return;
        }
        let s = &*self.shared;
        let guard = if s.nthreads > 1 && chunks > 1 { self.busy.try_lock().ok() } else { None };
        let Some(_guard) = guard else {
            // Single thread, a single chunk, or someone else is using the pool.
            for c in 0..chunks {
                f(c);
            }
            return;
        };
        // SAFETY: no worker is inside a job (the previous run waited for `active` to reach 0
        // after closing its epoch), and the pointer is not used after this function returns.
        unsafe {
            let erased: *const Job = std::mem::transmute::<&(dyn Fn(usize) + Sync), &'static Job>(f);
            *s.job.get() = Some(erased);
        }
        s.chunks.store(chunks, Ordering::SeqCst);
        s.next.store(0, Ordering::SeqCst);
        s.finished.store(0, Ordering::SeqCst);
        let epoch = s.epoch.fetch_add(1, Ordering::SeqCst) + 1;
        // Wake parked workers. A worker counts itself in `parked` before it checks the epoch
        // and waits (all SeqCst): if we read 0 here, its check comes after our bump and sees
        // the new job. Taking the lock orders the notification with a check-then-wait.
        if s.parked.load(Ordering::SeqCst) != 0 {
            let _l = s.sleep.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        let mine = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| claim(s, f)));
        let mut spins = 0u32;
        while s.finished.load(Ordering::Acquire) < chunks {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1024) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        s.closed.store(epoch, Ordering::SeqCst);
        while s.active.load(Ordering::SeqCst) != 0 {
            std::hint::spin_loop();
        }
        // SAFETY: the job is closed and no worker is inside it.
        unsafe {
            *s.job.get() = None;
        }
        if let Err(p) = mine {
            std::panic::resume_unwind(p);
        }
        if s.panicked.swap(0, Ordering::Relaxed) != 0 {
            panic!("a sapient kernel worker panicked");
        }
    }
}

/// Claim and run chunks until none are left.
fn claim(s: &Shared, f: &(dyn Fn(usize) + Sync)) {
    let chunks = s.chunks.load(Ordering::SeqCst);
    loop {
        let c = s.next.fetch_add(1, Ordering::AcqRel);
        if c >= chunks {
            break;
        }
        f(c);
        s.finished.fetch_add(1, Ordering::Release);
    }
}

fn worker(s: Arc<Shared>) {
    let mut seen = 0usize;
    loop {
        // Spin for a while, then park.
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            if s.epoch.load(Ordering::Acquire) != seen {
                break;
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1024) && start.elapsed() > SPIN {
                let mut g = s.sleep.lock().unwrap_or_else(|e| e.into_inner());
                s.parked.fetch_add(1, Ordering::SeqCst);
                while s.epoch.load(Ordering::SeqCst) == seen {
                    g = s.wake.wait(g).unwrap_or_else(|e| e.into_inner());
                }
                s.parked.fetch_sub(1, Ordering::SeqCst);
                break;
            }
            std::hint::spin_loop();
        }
        s.active.fetch_add(1, Ordering::SeqCst);
        seen = s.epoch.load(Ordering::SeqCst);
        if s.closed.load(Ordering::SeqCst) < seen {
            // SAFETY: the job of epoch `seen` is not closed and we are registered as active,
            // so the dispatcher keeps it alive until we leave.
            if let Some(job) = unsafe { *s.job.get() } {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| claim(&s, unsafe { &*job })));
                if r.is_err() {
                    s.panicked.fetch_add(1, Ordering::Relaxed);
                    // Count the chunk that panicked as finished so the dispatcher returns.
                    s.finished.fetch_add(1, Ordering::Release);
                }
            }
        }
        s.active.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Pool {
    /// Splits `data` into chunks of `chunk_len` elements (the last may be shorter) and runs
    /// `f(chunk_index, chunk)` for each over the pool, as [`run_chunks`](Self::run_chunks)
    /// does: the safe way to fill one buffer from several threads.
    pub fn for_each_chunk_mut<T: Send>(&self, data: &mut [T], chunk_len: usize, f: impl Fn(usize, &mut [T]) + Sync) {
        let chunk_len = chunk_len.max(1);
        let len = data.len();
        let base = super::SendPtr(data.as_mut_ptr());
        self.run_chunks(len.div_ceil(chunk_len), &|c| {
            let start = c * chunk_len;
            let end = (start + chunk_len).min(len);
            // SAFETY: chunk `c` is claimed by exactly one thread, chunks are disjoint ranges
            // inside `data`, and `data` stays mutably borrowed until `run_chunks` returns.
            let chunk = unsafe { std::slice::from_raw_parts_mut(base.ptr().add(start), end - start) };
            f(c, chunk);
        });
    }
}

/// The process-wide kernel pool ([`super::KernelOptions::threads`] threads).
pub fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let n = super::options()
            .threads
            .filter(|&n| n > 0)
            .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
        Pool::new(n.min(256))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn every_chunk_runs_once() {
        let p = Pool::new(3);
        let total = AtomicU64::new(0);
        for round in 0..2000u64 {
            p.run_chunks(7, &|c| {
                total.fetch_add(round * 10 + c as u64, Ordering::Relaxed);
            });
        }
        let want: u64 = (0..2000u64).map(|r| 7 * r * 10 + 21).sum();
        assert_eq!(total.load(Ordering::Relaxed), want);
    }

    #[test]
    fn chunks_of_a_slice_cover_it_once() {
        let p = Pool::new(3);
        let mut v = vec![0usize; 1001];
        p.for_each_chunk_mut(&mut v, 64, |c, chunk| {
            assert!(chunk.len() == 64 || (c == 15 && chunk.len() == 41));
            for (i, x) in chunk.iter_mut().enumerate() {
                *x += c * 64 + i + 1;
            }
        });
        assert!(v.iter().enumerate().all(|(i, &x)| x == i + 1));
        p.for_each_chunk_mut(&mut [] as &mut [u8], 0, |_, _| panic!("no chunk of an empty slice"));
    }

    #[test]
    fn workers_wake_after_parking() {
        let p = Pool::new(2);
        let hits = AtomicU64::new(0);
        p.run_chunks(2, &|_| {
            hits.fetch_add(1, Ordering::Relaxed);
        });
        std::thread::sleep(SPIN * 3); // the worker parks
        p.run_chunks(2, &|_| {
            hits.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(hits.load(Ordering::Relaxed), 4);
        // A job submitted while another thread holds the pool still runs every chunk.
        let total = AtomicU64::new(0);
        std::thread::scope(|sc| {
            for _ in 0..3 {
                sc.spawn(|| {
                    for _ in 0..200 {
                        p.run_chunks(5, &|c| {
                            total.fetch_add(c as u64 + 1, Ordering::Relaxed);
                        });
                    }
                });
            }
        });
        assert_eq!(total.load(Ordering::Relaxed), 3 * 200 * 15);
    }
}
